//! sd_notify(3)'s protocol without libsystemd: one datagram of `KEY=VALUE`
//! lines to the socket the service manager names in `$NOTIFY_SOCKET`, a path
//! or, with a leading `@`, a name in the abstract namespace. Nothing here
//! blocks on the manager: a datagram socket's send either queues or fails.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::Path;
use std::time::Duration;

/// The environment variable naming the manager's socket.
pub const NOTIFY_SOCKET_ENV: &str = "NOTIFY_SOCKET";
/// The watchdog timeout the manager enforces, in microseconds (`WatchdogSec=`).
pub const WATCHDOG_USEC_ENV: &str = "WATCHDOG_USEC";
/// The process the watchdog timeout is meant for (a child does not inherit it).
pub const WATCHDOG_PID_ENV: &str = "WATCHDOG_PID";

/// Why a notification could not be sent (the daemon logs it and runs on: a
/// manager that cannot be told is no reason to stop serving).
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error("{NOTIFY_SOCKET_ENV}=`{}`: {reason}", .value.to_string_lossy())]
    Address { value: OsString, reason: String },
    #[error("notification socket: {0}")]
    Socket(#[source] std::io::Error),
    #[error("sending `{state}` to the service manager: {source}")]
    Send {
        state: String,
        #[source]
        source: std::io::Error,
    },
}

/// A connection to the service manager's notification socket.
#[derive(Debug)]
pub struct Notifier {
    sock: UnixDatagram,
    addr: SocketAddr,
}

impl Notifier {
    /// The manager's socket from `$NOTIFY_SOCKET`; `None` when the daemon was
    /// not started by a manager that listens (a terminal, `Type=simple`).
    pub fn from_env() -> Result<Option<Notifier>, NotifyError> {
        match std::env::var_os(NOTIFY_SOCKET_ENV) {
            Some(v) if !v.is_empty() => Notifier::connect(&v).map(Some),
            _ => Ok(None),
        }
    }

    /// A notifier for `value`, written as `$NOTIFY_SOCKET` would be: an
    /// absolute path, or `@name` for the abstract namespace.
    pub fn connect(value: &OsStr) -> Result<Notifier, NotifyError> {
        let bad = |reason: String| NotifyError::Address {
            value: value.to_os_string(),
            reason,
        };
        let bytes = value.as_bytes();
        let addr = match bytes.split_first() {
            Some((b'@', name)) => {
                use std::os::linux::net::SocketAddrExt;
                SocketAddr::from_abstract_name(name).map_err(|e| bad(e.to_string()))?
            }
            Some((b'/', _)) => {
                SocketAddr::from_pathname(Path::new(value)).map_err(|e| bad(e.to_string()))?
            }
            _ => return Err(bad("neither an absolute path nor @name".into())),
        };
        let sock = UnixDatagram::unbound().map_err(NotifyError::Socket)?;
        Ok(Notifier { sock, addr })
    }

    /// Sends one state change: newline-separated `KEY=VALUE` assignments.
    pub fn send(&self, state: &str) -> Result<(), NotifyError> {
        self.sock
            .send_to_addr(state.as_bytes(), &self.addr)
            .map(drop)
            .map_err(|source| NotifyError::Send {
                state: state.lines().next().unwrap_or_default().to_string(),
                source,
            })
    }
}

/// The state a `STATUS=` line may carry: one line (the protocol separates
/// assignments by newlines).
pub fn status_line(text: &str) -> String {
    text.replace('\n', " ")
}

/// The watchdog timeout the manager set for this process: `$WATCHDOG_USEC`,
/// unless `$WATCHDOG_PID` names another process (as sd_watchdog_enabled(3)
/// reads them). `None` when there is no watchdog or the values do not parse.
pub fn watchdog_timeout_from_env() -> Option<Duration> {
    watchdog_timeout(
        std::env::var(WATCHDOG_USEC_ENV).ok().as_deref(),
        std::env::var(WATCHDOG_PID_ENV).ok().as_deref(),
        std::process::id(),
    )
}

/// `watchdog_timeout_from_env` on given values (testable without the
/// process environment).
pub fn watchdog_timeout(usec: Option<&str>, pid: Option<&str>, own_pid: u32) -> Option<Duration> {
    if let Some(p) = pid {
        if p.trim().parse::<u32>().ok()? != own_pid {
            return None;
        }
    }
    let us: u64 = usec?.trim().parse().ok()?;
    (us > 0).then(|| Duration::from_micros(us))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_socket_receives_the_state() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let manager = UnixDatagram::bind(&path).unwrap();
        let n = Notifier::connect(path.as_os_str()).unwrap();
        n.send("READY=1\nSTATUS=serving").unwrap();
        let mut buf = [0u8; 64];
        let len = manager.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1\nSTATUS=serving");
    }

    #[test]
    fn an_abstract_socket_receives_the_state() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("kvtarget-notify-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let manager = UnixDatagram::bind_addr(&addr).unwrap();
        let n = Notifier::connect(OsStr::new(&format!("@{name}"))).unwrap();
        n.send("WATCHDOG=1").unwrap();
        let mut buf = [0u8; 64];
        let len = manager.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"WATCHDOG=1");
    }

    #[test]
    fn a_relative_or_empty_address_is_refused() {
        for v in ["notify", ""] {
            let e = Notifier::connect(OsStr::new(v)).unwrap_err();
            assert!(matches!(e, NotifyError::Address { .. }), "{v}: {e}");
        }
    }

    #[test]
    fn the_watchdog_is_for_this_process_only() {
        let us = Some("20000000");
        assert_eq!(watchdog_timeout(us, None, 7), Some(Duration::from_secs(20)));
        assert_eq!(
            watchdog_timeout(us, Some("7"), 7),
            Some(Duration::from_secs(20))
        );
        assert_eq!(watchdog_timeout(us, Some("8"), 7), None);
        assert_eq!(watchdog_timeout(us, Some("x"), 7), None);
        assert_eq!(watchdog_timeout(Some("0"), None, 7), None);
        assert_eq!(watchdog_timeout(Some("soon"), None, 7), None);
        assert_eq!(watchdog_timeout(None, Some("7"), 7), None);
    }
}
