//! What the daemon tells its service manager (systemd, `Type=notify`):
//! `READY=1` once every listener is bound and every pool recovered (the
//! moment `Server::start` returns: a host's first connect would succeed),
//! `WATCHDOG=1` while every reactor keeps passing through its loop
//! (`watchdog`), `STOPPING=1` when a stop signal came, and a `STATUS=` line
//! for `systemctl status` at each step. Without `$NOTIFY_SOCKET` (a terminal,
//! a test, another manager) every call is a no-op.

pub mod notify;
pub mod watchdog;

use crate::server::Server;
use notify::Notifier;
use std::sync::Arc;
use watchdog::{Watchdog, WatchdogSettings};

/// The daemon's side of the service manager's protocol.
#[derive(Default)]
pub struct Service {
    notifier: Option<Arc<Notifier>>,
    watchdog: Option<Watchdog>,
}

impl Service {
    /// The manager named by `$NOTIFY_SOCKET`, if any. A value that cannot be
    /// used is logged and the daemon runs on without notifying: `Type=notify`
    /// will then time the start out, which says more than a refusal to run.
    pub fn from_env() -> Service {
        match Notifier::from_env() {
            Ok(n) => Service::with_notifier(n),
            Err(e) => {
                tracing::error!("{e}; the service manager will not hear from this daemon");
                Service::default()
            }
        }
    }

    pub fn with_notifier(notifier: Option<Notifier>) -> Service {
        Service {
            notifier: notifier.map(Arc::new),
            watchdog: None,
        }
    }

    fn send(&self, state: &str) {
        if let Some(n) = &self.notifier {
            if let Err(e) = n.send(state) {
                tracing::warn!("{e}");
            }
        }
    }

    /// A `STATUS=` line, e.g. what the start is doing.
    pub fn status(&self, text: &str) {
        self.send(&format!("STATUS={}", notify::status_line(text)));
    }

    /// The target serves: `READY=1` with a status naming its listeners, then
    /// the watchdog when the manager set one (`$WATCHDOG_USEC`).
    pub fn ready(&mut self, server: &Server) {
        let Some(n) = self.notifier.clone() else {
            return;
        };
        self.send(&format!(
            "READY=1\nSTATUS={}",
            notify::status_line(&serving_status(server))
        ));
        let Some(timeout) = notify::watchdog_timeout_from_env() else {
            return;
        };
        let settings = WatchdogSettings::for_timeout(timeout);
        let reactors = server.reactors().cloned().collect();
        match Watchdog::start(n, reactors, settings) {
            Ok(w) => {
                tracing::info!(
                    timeout_ms = timeout.as_millis() as u64,
                    stuck_after_ms = settings.stuck_after.as_millis() as u64,
                    "watchdog: pinging the service manager while every reactor passes through its loop"
                );
                self.watchdog = Some(w);
            }
            Err(e) => tracing::error!(
                "watchdog thread: {e}; the service manager will restart the target when its watchdog runs out"
            ),
        }
    }

    /// A stop began: no more watchdog pings (`TimeoutStopSec=` times the
    /// stop), and `STOPPING=1`.
    pub fn stopping(&mut self) {
        if let Some(mut w) = self.watchdog.take() {
            w.stop();
        }
        self.send("STOPPING=1\nSTATUS=stopping: completing in-flight I/O, syncing pools");
    }
}

/// `serving 2 subsystems on 127.0.0.1:4420 (discovery 127.0.0.1:8009); 2 reactors, 1 pool`
fn serving_status(server: &Server) -> String {
    let subsystems = server
        .target
        .subsystems
        .read()
        .map(|s| s.len())
        .unwrap_or(0);
    let io: Vec<String> = (server.listen_addrs().iter())
        .filter(|(_, discovery)| !discovery)
        .map(|(a, _)| a.to_string())
        .collect();
    let discovery: Vec<String> = (server.listen_addrs().iter())
        .filter(|(_, discovery)| *discovery)
        .map(|(a, _)| a.to_string())
        .collect();
    let mut s = format!(
        "serving {subsystems} subsystem{} on {}",
        if subsystems == 1 { "" } else { "s" },
        if io.is_empty() {
            "no TCP listener".to_string()
        } else {
            io.join(", ")
        }
    );
    if !discovery.is_empty() {
        s += &format!(" (discovery {})", discovery.join(", "));
    }
    let reactors = server.reactors().count();
    let pools = server.pools().len();
    s += &format!(
        "; {reactors} reactor{}, {pools} pool{}",
        if reactors == 1 { "" } else { "s" },
        if pools == 1 { "" } else { "s" }
    );
    s
}

/// Where the packaged service's control socket is (`[rpc] socket` in
/// /etc/kvtarget/kvtarget.toml, inside the unit's `RuntimeDirectory=`).
pub const SERVICE_RPC_SOCKET: &str = "/run/kvtarget/kvtarget.sock";

/// The socket an RPC client (`kvtarget rpc`, `top`, `cluster status`) uses
/// for `given`: the default one (`/var/tmp/kvtarget.sock`) when it exists,
/// else the packaged service's, so that `kvtarget rpc ...` reaches the
/// service without `-r`. A socket named explicitly is used as it is.
pub fn client_socket(given: &std::path::Path) -> std::path::PathBuf {
    let service = std::path::Path::new(SERVICE_RPC_SOCKET);
    if given == std::path::Path::new(crate::rpc::DEFAULT_SOCKET)
        && !given.exists()
        && service.exists()
    {
        return service.to_path_buf();
    }
    given.to_path_buf()
}
