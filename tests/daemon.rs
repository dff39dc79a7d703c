//! The daemon as users run it: a subprocess with a config file, stopped by signal.

use kvtarget::initiator::{HostController, HostOptions};
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_kvtarget");

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn bad_config_gives_one_line_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.toml");
    std::fs::write(
        &p,
        "[[listeners]]\naddress = \"127.0.0.1\"\n[[subsystems]]\nnqn = \"nqn.2026-11.x:y\"\n[[subsystems.namespaces]]\nnsid = 1\nbackend = \"uring\"\nblock_size = 4096\n",
    )
    .unwrap();
    let out = Command::new(BIN).arg("--config").arg(&p).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("subsystems[0].namespaces[0].path"), "{err}");
}

#[test]
fn sigterm_stops_cleanly_and_data_persists() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = dir.path().join("kv.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
[[listeners]]
address = "127.0.0.1"
port = {port}

[[subsystems]]
nqn = "nqn.2026-11.io.kvtarget:daemon"
allow_any_host = true

[[subsystems.namespaces]]
nsid = 1
backend = "uring"
path = "{}/ns.img"
size = "32MiB"
"#,
            dir.path().display()
        ),
    )
    .unwrap();
    let run = |write: Option<&[u8]>| -> Vec<u8> {
        let mut child = Command::new(BIN)
            .arg("--config")
            .arg(&cfg)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let addr = format!("127.0.0.1:{port}").parse().unwrap();
        let opts = HostOptions::new(addr, "nqn.2026-11.io.kvtarget:daemon");
        let t0 = Instant::now();
        let mut c = loop {
            match HostController::connect(&opts) {
                Ok(c) => break c,
                Err(e) if t0.elapsed() < Duration::from_secs(20) => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(50))
                }
                Err(e) => panic!("daemon never answered: {e}"),
            }
        };
        c.set_queue_count(1).unwrap();
        let mut q = c.io_queue(1).unwrap();
        if let Some(w) = write {
            q.write(1, 10, w.to_vec(), 4096).unwrap();
        }
        let got = q.read(1, 10, 1, 4096).unwrap();
        // Stop it the way an operator or systemd would.
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
        assert!(status.success(), "exit {status:?}\n{log}");
        assert!(log.contains("received SIGTERM"), "{log}");
        got
    };
    let data = vec![0xA5u8; 4096];
    assert_eq!(run(Some(&data)), data);
    // No Flush was sent: the clean shutdown synced the file.
    assert_eq!(run(None), data);
}
