//! The daemon under a service manager (`Type=notify`), with the manager's
//! notification socket played by a datagram socket the test binds: READY=1
//! only once a host's first connect succeeds, WATCHDOG=1 while the reactors
//! pass through their loops and not once one is stuck, STOPPING=1 on a stop,
//! and a healthy start that logs nothing reading as damage.

use kvtarget::initiator::{HostController, HostOptions};
use kvtarget::reactor::Message;
use kvtarget::systemd::notify::Notifier;
use kvtarget::systemd::watchdog::{Watchdog, WatchdogSettings};
use std::io::Read;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod support;
use support::{free_port, loopback, write_config, BIN, DAEMON_START};

const NQN: &str = "nqn.2026-12.io.kvtarget:systemd";

/// A file-backed pool created on first start, one volume served on `port`.
fn pool_config(dir: &Path, port: u16) -> std::path::PathBuf {
    write_config(
        dir,
        "kvtarget.toml",
        &format!(
            r#"
[reactors]
count = 2
idle = "adaptive"
# A loaded CI machine may stall a reactor past the default 10 ms: that warning
# is not what these tests read the log for.
stall_warn_us = 10000000

[[listeners]]
address = "127.0.0.1"
port = {port}

[[pools]]
name = "kv"
backend = "uring"
path = "{dir}/pool.img"
size = "256MiB"

[[pools.volumes]]
name = "v0"
size = "64MiB"

[[pools.volumes]]
name = "cache"
size = "64MiB"
kind = "kv"

[[subsystems]]
nqn = "{NQN}"
allow_any_host = true

[[subsystems.namespaces]]
nsid = 1
volume = "kv/v0"

[[subsystems.namespaces]]
nsid = 2
volume = "kv/cache"
"#,
            dir = dir.display()
        ),
    )
}

/// The manager's end: a datagram socket in `dir`.
fn manager(dir: &Path) -> (UnixDatagram, std::path::PathBuf) {
    let path = dir.join("notify.sock");
    let sock = UnixDatagram::bind(&path).unwrap();
    (sock, path)
}

/// The next notification, or None after `timeout`.
fn next(sock: &UnixDatagram, timeout: Duration) -> Option<String> {
    sock.set_read_timeout(Some(timeout)).unwrap();
    let mut buf = [0u8; 4096];
    match sock.recv(&mut buf) {
        Ok(n) => Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            None
        }
        Err(e) => panic!("notification socket: {e}"),
    }
}

fn spawn(cfg: &Path, dir: &Path, notify: &Path, watchdog_usec: Option<u64>) -> Child {
    let mut cmd = Command::new(BIN);
    cmd.arg("--config")
        .arg(cfg)
        .arg("-r")
        .arg(dir.join("rpc.sock"))
        .env("NOTIFY_SOCKET", notify)
        .env_remove("WATCHDOG_PID")
        .env_remove("RUST_LOG")
        .stderr(Stdio::piped());
    match watchdog_usec {
        Some(us) => cmd.env("WATCHDOG_USEC", us.to_string()),
        None => cmd.env_remove("WATCHDOG_USEC"),
    };
    cmd.spawn().unwrap()
}

/// Waits for READY=1; every notification before it must not be one.
fn wait_ready(sock: &UnixDatagram, child: &mut Child) -> String {
    let t0 = Instant::now();
    loop {
        assert!(t0.elapsed() < DAEMON_START, "no READY=1");
        if let Ok(Some(st)) = child.try_wait() {
            panic!("daemon exited before READY=1: {st}");
        }
        let Some(msg) = next(sock, Duration::from_millis(200)) else {
            continue;
        };
        if msg.lines().any(|l| l == "READY=1") {
            return msg;
        }
        assert!(msg.starts_with("STATUS="), "before READY=1: {msg}");
    }
}

/// SIGTERM, then the notifications until exit; returns them and the log.
fn stop(sock: &UnixDatagram, mut child: Child) -> (Vec<String>, String) {
    let st = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(st.success());
    let status = child.wait().unwrap();
    let mut log = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    assert!(status.success(), "{status}: {log}");
    let mut msgs = Vec::new();
    while let Some(m) = next(sock, Duration::from_millis(100)) {
        msgs.push(m);
    }
    (msgs, log)
}

/// Lines of a log that an operator would read as trouble.
fn alarming(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| {
            let lower = l.to_lowercase();
            l.contains("WARN")
                || l.contains("ERROR")
                || ["bad ", "magic", "damage", "corrupt", "mismatch", "fail"]
                    .iter()
                    .any(|w| lower.contains(w))
        })
        .collect()
}

/// READY=1 comes once a host can connect and the RPC socket answers, the
/// first start of a fresh pool and a restart on it log nothing alarming, and
/// a stop says STOPPING=1 first.
#[test]
fn ready_follows_serving_and_a_healthy_start_logs_no_damage() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = pool_config(dir.path(), port);
    let (sock, notify) = manager(dir.path());
    for start in ["first start (fresh pool)", "restart"] {
        let mut child = spawn(&cfg, dir.path(), &notify, None);
        let ready = wait_ready(&sock, &mut child);
        // At once, no retry: the first connect must succeed.
        let mut host = HostController::connect(&HostOptions::new(loopback(port), NQN))
            .unwrap_or_else(|e| panic!("{start}: READY=1 before a connect succeeds: {e}"));
        host.set_queue_count(1).unwrap();
        let mut q = host.io_queue(1).unwrap();
        q.write(1, 0, vec![0x5a; 4096], 4096).unwrap();
        assert_eq!(q.read(1, 0, 1, 4096).unwrap(), vec![0x5a; 4096]);
        let mut rpc = kvtarget::rpc::RpcClient::connect(&dir.path().join("rpc.sock"))
            .unwrap_or_else(|e| panic!("{start}: READY=1 before the RPC socket: {e}"));
        let pools = rpc
            .call("kvtarget_get_pools", serde_json::json!({}))
            .unwrap();
        assert_eq!(pools[0]["volumes"], 2, "{pools}");
        assert!(
            ready.contains(&format!("STATUS=serving 1 subsystem on 127.0.0.1:{port}")),
            "{ready}"
        );
        drop((q, host, rpc));
        let (msgs, log) = stop(&sock, child);
        assert!(
            msgs.first()
                .is_some_and(|m| m.lines().next() == Some("STOPPING=1")),
            "{start}: {msgs:?}"
        );
        assert!(
            !msgs.iter().any(|m| m.contains("WATCHDOG=1")),
            "no watchdog was asked for: {msgs:?}"
        );
        assert!(log.contains("pool recovered"), "{log}");
        let bad = alarming(&log);
        assert!(
            bad.is_empty(),
            "{start} logged as if damaged:\n{}",
            bad.join("\n")
        );
    }
}

/// With WATCHDOG_USEC set the daemon pings at a quarter of it; pings for
/// another process (WATCHDOG_PID) are not this one's to send.
#[test]
fn the_daemon_pings_the_watchdog_it_was_given() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = pool_config(dir.path(), port);
    let (sock, notify) = manager(dir.path());
    let mut child = spawn(&cfg, dir.path(), &notify, Some(400_000));
    wait_ready(&sock, &mut child);
    let t0 = Instant::now();
    let mut pings = 0;
    while t0.elapsed() < Duration::from_millis(1000) {
        if next(&sock, Duration::from_millis(300)).is_some_and(|m| m == "WATCHDOG=1") {
            pings += 1;
        }
    }
    // Every 100 ms for a second: about ten; a loaded CI machine may lose a few.
    assert!(pings >= 5, "{pings} pings in a second");
    let (msgs, _) = stop(&sock, child);
    let stopping = msgs.iter().position(|m| m.starts_with("STOPPING=1"));
    let stopping = stopping.unwrap_or_else(|| panic!("{msgs:?}"));
    assert!(
        !msgs[stopping..].iter().any(|m| m == "WATCHDOG=1"),
        "a ping after STOPPING=1: {msgs:?}"
    );

    let mut child = Command::new(BIN)
        .arg("--config")
        .arg(&cfg)
        .arg("-r")
        .arg(dir.path().join("rpc.sock"))
        .env("NOTIFY_SOCKET", &notify)
        .env("WATCHDOG_USEC", "400000")
        .env("WATCHDOG_PID", "1")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_ready(&sock, &mut child);
    assert_eq!(
        next(&sock, Duration::from_millis(600)),
        None,
        "pinged another process's watchdog"
    );
    stop(&sock, child);
}

/// A reactor held inside one pass of its loop stops the pings within the
/// bound, and they resume once it runs again.
#[test]
fn a_stuck_reactor_stops_the_watchdog_pings() {
    let dir = tempfile::tempdir().unwrap();
    let (sock, notify) = manager(dir.path());
    let server = support::server(
        r#"
[reactors]
count = 2
idle = "adaptive"

[[listeners]]
address = "127.0.0.1"
port = 0
"#,
    );
    let settings = WatchdogSettings {
        ping_every: Duration::from_millis(50),
        stuck_after: Duration::from_millis(500),
    };
    let notifier = Arc::new(Notifier::connect(notify.as_os_str()).unwrap());
    let reactors: Vec<_> = server.reactors().cloned().collect();
    let mut watchdog = Watchdog::start(notifier, reactors.clone(), settings).unwrap();

    // Healthy: a ping about every 50 ms.
    let count_pings = |window: Duration| {
        let t0 = Instant::now();
        let mut pings = 0;
        let mut other = Vec::new();
        while t0.elapsed() < window {
            match next(&sock, Duration::from_millis(50)) {
                Some(m) if m == "WATCHDOG=1" => pings += 1,
                Some(m) => other.push(m),
                None => {}
            }
        }
        (pings, other)
    };
    let (pings, _) = count_pings(Duration::from_millis(500));
    assert!(pings >= 4, "{pings} pings while healthy");

    // Hold reactor 1 inside one pass until released.
    let (release, held) = std::sync::mpsc::channel::<()>();
    let (entered_tx, entered) = std::sync::mpsc::channel::<()>();
    let hold = Message::Call(Box::new(move |_| {
        let _ = entered_tx.send(());
        let _ = held.recv_timeout(Duration::from_secs(30));
    }));
    assert!(reactors[1].send(hold).is_ok());
    entered.recv_timeout(Duration::from_secs(5)).unwrap();
    let stuck_at = Instant::now();
    // Pings go on until the bound, then stop with a status naming reactor 1.
    let mut last_ping = stuck_at;
    let mut status = None;
    while stuck_at.elapsed() < Duration::from_millis(1500) {
        match next(&sock, Duration::from_millis(50)) {
            Some(m) if m == "WATCHDOG=1" => last_ping = Instant::now(),
            Some(m) => status = Some(m),
            None => {}
        }
    }
    let quiet_after = last_ping.duration_since(stuck_at);
    assert!(
        // Found stuck within a check of the bound; the rest is slack for a
        // loaded machine delivering the last ping late.
        quiet_after < settings.stuck_after + Duration::from_millis(300),
        "pinged {quiet_after:?} into the stall"
    );
    assert!(
        status
            .as_deref()
            .is_some_and(|s| s.starts_with("STATUS=reactor 1 stuck")),
        "{status:?}"
    );
    let (pings, _) = count_pings(Duration::from_millis(300));
    assert_eq!(pings, 0, "pinged while reactor 1 is stuck");

    // Released: pings resume.
    release.send(()).unwrap();
    let (pings, _) = count_pings(Duration::from_millis(500));
    assert!(pings >= 3, "{pings} pings after the reactor ran again");
    watchdog.stop();
    server.shutdown();
}
