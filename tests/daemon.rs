//! The daemon as users run it: a subprocess with a config file, stopped by signal.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

mod support;
use support::{connect_retry, free_port, loopback, spawn_daemon, wait_for_path, write_config, BIN};

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
    let cfg = write_config(
        dir.path(),
        "kv.toml",
        &format!(
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
    );
    let run = |write: Option<&[u8]>| -> Vec<u8> {
        let mut child = Command::new(BIN)
            .arg("--config")
            .arg(&cfg)
            .arg("-r")
            .arg(dir.path().join("rpc.sock"))
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut c = connect_retry(loopback(port), "nqn.2026-11.io.kvtarget:daemon");
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

fn block(lba: u64, version: u64) -> Vec<u8> {
    let mut b = vec![(version as u8) | 1; 4096];
    b[..8].copy_from_slice(&lba.to_le_bytes());
    b[8..16].copy_from_slice(&version.to_le_bytes());
    b
}

/// The target killed with SIGKILL under load: the pool checks clean, and every
/// block holds what was there at the last completed Flush or something written
/// after it.
#[test]
fn sigkill_mid_load_keeps_everything_flushed() {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let pool = dir.path().join("pool.img");
    let nqn = "nqn.2026-11.io.kvtarget:crash";
    let cfg = write_config(
        dir.path(),
        "kv.toml",
        &format!(
            r#"
[reactors]
count = 2

[[listeners]]
address = "127.0.0.1"
port = {port}

[[pools]]
name = "p"
backend = "uring"
path = "{}"
size = "128MiB"
extent_size = "256KiB"

[[pools.volumes]]
name = "v"
size = "256MiB"

[[subsystems]]
nqn = "{nqn}"
allow_any_host = true

[[subsystems.namespaces]]
nsid = 1
volume = "p/v"
"#,
            pool.display()
        ),
    );
    let addr = loopback(port);
    let mut child = spawn_daemon(&cfg, &dir.path().join("rpc.sock"));
    let mut c = connect_retry(addr, nqn);
    c.set_queue_count(2).unwrap();
    // Per LBA: the values a read may return after the crash (the value at the
    // last completed Flush and everything written since; 0 means zeros).
    let allowed: Arc<Mutex<HashMap<u64, Vec<u64>>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..2u64 {
        let mut q = c.io_queue(w as u16 + 1).unwrap();
        let (allowed, stop) = (allowed.clone(), stop.clone());
        workers.push(std::thread::spawn(move || {
            let mut rng = 0x1234_5678u64 + w;
            let mut version = w << 40;
            let mut since_flush: Vec<u64> = Vec::new();
            let mut ops = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                // Worker w owns LBAs congruent to w mod 2, spread over 40 MiB.
                let lba = (rng % 5120) * 2 + w;
                version += 1;
                let op = rng % 10;
                let r = if op < 7 {
                    allowed
                        .lock()
                        .unwrap()
                        .entry(lba)
                        .or_insert_with(|| vec![0])
                        .push(version);
                    q.write(1, lba, block(lba, version), 4096)
                } else if op < 9 {
                    allowed
                        .lock()
                        .unwrap()
                        .entry(lba)
                        .or_insert_with(|| vec![0])
                        .push(0);
                    q.deallocate(1, &[(lba, 1)])
                } else {
                    let pending = since_flush.clone();
                    match q.flush(1) {
                        Ok(()) => {
                            // Everything this worker did before the flush is
                            // durable: only the latest value stays allowed.
                            let mut a = allowed.lock().unwrap();
                            for l in pending {
                                if let Some(v) = a.get_mut(&l) {
                                    let last = *v.last().unwrap();
                                    *v = vec![last];
                                }
                            }
                            since_flush.clear();
                            Ok(())
                        }
                        Err(e) => Err(e),
                    }
                };
                if r.is_err() {
                    return ops; // the target died
                }
                if op < 9 {
                    since_flush.push(lba);
                }
                ops += 1;
            }
            ops
        }));
    }
    std::thread::sleep(Duration::from_millis(2500));
    let st = Command::new("kill")
        .arg("-KILL")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(st.success());
    let _ = child.wait();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let ops: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    assert!(ops > 200, "only {ops} operations before the kill");
    drop(c);

    // Offline check of the crashed pool.
    let out = Command::new(BIN).arg("check").arg(&pool).output().unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "check failed:\n{report}");
    assert!(report.contains("pool is consistent"), "{report}");

    // Restart and read every block the load touched.
    let mut child = spawn_daemon(&cfg, &dir.path().join("rpc.sock"));
    let mut c = connect_retry(addr, nqn);
    c.set_queue_count(1).unwrap();
    let mut q = c.io_queue(1).unwrap();
    let allowed = allowed.lock().unwrap();
    let mut checked = 0;
    for (&lba, vals) in allowed.iter() {
        let got = q.read(1, lba, 1, 4096).unwrap();
        let value = if got.iter().all(|&b| b == 0) {
            0
        } else {
            let v = u64::from_le_bytes(got[8..16].try_into().unwrap());
            assert_eq!(got, block(lba, v), "LBA {lba}: torn or foreign data");
            v
        };
        assert!(
            vals.contains(&value),
            "LBA {lba}: read version {value}, allowed {vals:?}"
        );
        checked += 1;
    }
    assert!(checked > 100);
    // While the target runs, offline tools refuse the pool instead of racing it.
    let out = Command::new(BIN).arg("check").arg(&pool).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("in use"));
    let out = Command::new(BIN)
        .args(["volume", "delete"])
        .arg(&pool)
        .arg("v")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("in use"));
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    let status = child.wait().unwrap();
    assert!(status.success());
    let out = Command::new(BIN).arg("check").arg(&pool).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn check_reports_damage_and_exits_nonzero() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("pool.img");
    let run = |args: &[&str]| {
        let out = Command::new(BIN).args(args).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let p = pool.to_str().unwrap();
    let (code, out) = run(&[
        "pool",
        "create",
        p,
        "--size",
        "64MiB",
        "--extent-size",
        "1MiB",
    ]);
    assert_eq!(code, Some(0), "{out}");
    let (code, out) = run(&["pool", "create", p, "--size", "64MiB"]);
    assert_eq!(code, Some(1), "a second create must refuse: {out}");
    assert!(out.contains("already holds a pool"), "{out}");
    let (code, out) = run(&["volume", "create", p, "kv", "--size", "16MiB"]);
    assert_eq!(code, Some(0), "{out}");
    let (code, out) = run(&["check", p]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("volume 1 \"kv\""), "{out}");
    // Corrupt the superblock: check names it and fails.
    use std::io::{Seek, SeekFrom, Write};
    let mut f = std::fs::OpenOptions::new().write(true).open(&pool).unwrap();
    f.seek(SeekFrom::Start(100)).unwrap();
    f.write_all(&[0xFF; 8]).unwrap();
    drop(f);
    let (code, out) = run(&["check", p]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("superblock: checksum mismatch"), "{out}");
    let (code, out) = run(&["check", "/nonexistent/pool"]);
    assert_eq!(code, Some(2), "{out}");
}

/// The `kvtarget rpc` CLI against a running daemon: table output, --json,
/// key=value parameters, errors with a non-zero exit.
#[test]
fn rpc_cli_talks_to_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let sock = dir.path().join("rpc.sock");
    let cfg = write_config(
        dir.path(),
        "kv.toml",
        &format!(
            "[[listeners]]\naddress = \"127.0.0.1\"\nport = {port}\n\n[[pools]]\nname = \"kv\"\nbackend = \"ram\"\nsize = \"64MiB\"\n"
        ),
    );
    let mut child = spawn_daemon(&cfg, &sock);
    wait_for_path(&sock);
    let rpc = |args: &[&str]| {
        let out = Command::new(BIN)
            .arg("rpc")
            .arg("-r")
            .arg(&sock)
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, out, err) = rpc(&[
        "bdev_lvol_create",
        "lvol_name=c1",
        "size_in_mib=16",
        "thin_provision=true",
    ]);
    assert_eq!(code, Some(0), "{out}{err}");
    let (code, out, _) = rpc(&[
        "nvmf_create_subsystem",
        r#"{"nqn": "nqn.2026-11.io.kvtarget:cli", "allow_any_host": true}"#,
    ]);
    assert_eq!(code, Some(0));
    assert_eq!(out.trim(), "ok");
    let (code, _, _) = rpc(&[
        "nvmf_subsystem_add_ns",
        "nqn=nqn.2026-11.io.kvtarget:cli",
        "namespace.bdev_name=kv/c1",
    ]);
    assert_eq!(code, Some(0));
    let (code, _, err) = rpc(&[
        "nvmf_subsystem_add_listener",
        "nqn=nqn.2026-11.io.kvtarget:cli",
        "listen_address.trtype=TCP",
        "listen_address.traddr=127.0.0.1",
        &format!("listen_address.trsvcid={}", free_port()),
    ]);
    assert_eq!(code, Some(0), "{err}");
    let (code, out, _) = rpc(&["nvmf_get_subsystems"]);
    assert_eq!(code, Some(0));
    let header = out.lines().next().unwrap();
    assert!(
        header.contains("nqn") && header.contains("namespaces"),
        "{out}"
    );
    assert!(out.contains("nqn.2026-11.io.kvtarget:cli"), "{out}");
    let (code, out, _) = rpc(&["--json", "bdev_get_bdevs", "name=kv/c1"]);
    assert_eq!(code, Some(0));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["aliases"][0], "kv/c1");
    let (code, _, err) = rpc(&["nvmf_delete_subsystem", "nqn=nqn.2026-11.io.kvtarget:none"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("error -2"), "{err}");
    let (code, _, err) = rpc(&["bogus_method"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("-32601"), "{err}");
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    assert!(child.wait().unwrap().success());
    let (code, _, err) = rpc(&["spdk_get_version"]);
    assert_eq!(code, Some(2), "no daemon: {err}");
}
