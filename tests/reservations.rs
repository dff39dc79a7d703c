//! NVMe reservations against the daemon over NVMe/TCP with the in-repo
//! initiator: two hosts (two host NQNs and Host Identifiers), Write
//! Exclusive, preempt, release, clear, a wrong key, and registrations with
//! Persist Through Power Loss kept across a SIGKILL and restart: in a
//! `ptpl_file` for a plain namespace, in the pool's metadata for a pool
//! volume (and, with PTPL off, forgotten by the restart).

mod support;

use kvtarget::initiator::{HostController, HostOptions, IoQueue};
use kvtarget::nvmf::reservation::{decode_report, resv_opc, HostId};
use kvtarget::wire::nvme::{Sqe, Status};
use std::process::Child;
use std::time::{Duration, Instant};
use support::*;

const NQN: &str = "nqn.2026-11.io.kvtarget:resv";
const BS: u32 = 4096;
const HOST_A: (&str, [u8; 16]) = ("nqn.2026-11.io.kvtarget:host-a", [0xA1; 16]);
const HOST_B: (&str, [u8; 16]) = ("nqn.2026-11.io.kvtarget:host-b", [0xB2; 16]);
const CONFLICT: Status = Status::RESERVATION_CONFLICT;
/// RTYPE 1 (Write Exclusive) in CDW10.
const WE: u32 = 1 << 8;

fn host(port: u16, (nqn, id): (&str, [u8; 16])) -> (HostController, IoQueue) {
    let mut o = HostOptions::new(loopback(port), NQN);
    o.hostnqn = nqn.into();
    o.hostid = id;
    let t0 = Instant::now();
    let mut c = loop {
        match HostController::connect(&o) {
            Ok(c) => break c,
            Err(_) if t0.elapsed() < DAEMON_START => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => panic!("daemon never answered: {e}"),
        }
    };
    c.set_queue_count(1).unwrap();
    let q = c.io_queue(1).unwrap();
    (c, q)
}

/// A reservation command with its keys; the completion status.
fn resv(q: &mut IoQueue, opc: u8, cdw10: u32, k1: u64, k2: u64) -> Status {
    let mut d = k1.to_le_bytes().to_vec();
    if opc != resv_opc::RELEASE {
        d.extend_from_slice(&k2.to_le_bytes());
    }
    let mut s = Sqe::new(opc, 0, 1);
    s.set_cdw(10, cdw10);
    q.q.execute(s, Some(d), 0).unwrap().status()
}

fn report(q: &mut IoQueue) -> kvtarget::nvmf::reservation::ReportView {
    let mut s = Sqe::new(resv_opc::REPORT, 0, 1);
    s.set_cdw(10, 1024 / 4 - 1);
    s.set_cdw(11, 1);
    let c = q.q.execute(s, None, 1024).unwrap();
    assert_eq!(c.status(), Status::SUCCESS);
    decode_report(&c.data, true).unwrap()
}

fn write(q: &mut IoQueue) -> Status {
    match q.write(1, 3, vec![7; BS as usize], BS) {
        Ok(()) => Status::SUCCESS,
        Err(e) => status_of(e),
    }
}

fn read(q: &mut IoQueue) -> Status {
    match q.read(1, 3, 1, BS) {
        Ok(_) => Status::SUCCESS,
        Err(e) => status_of(e),
    }
}

struct Daemon {
    child: Child,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn two_hosts_write_exclusive_and_ptpl_across_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let ptpl = dir.path().join("ns1.ptpl.json");
    let cfg = write_config(
        dir.path(),
        "resv.toml",
        &format!(
            r#"
[[listeners]]
address = "127.0.0.1"
port = {port}

[[subsystems]]
nqn = "{NQN}"
allow_any_host = true

[[subsystems.namespaces]]
nsid = 1
backend = "uring"
path = "{}/ns.img"
size = "8MiB"
ptpl_file = "{}"
"#,
            dir.path().display(),
            ptpl.display()
        ),
    );
    let sock = dir.path().join("rpc.sock");
    let mut d = Daemon {
        child: spawn_daemon(&cfg, &sock),
    };
    let (_ca, mut a) = host(port, HOST_A);
    let (_cb, mut b) = host(port, HOST_B);
    // Register both; A sets PTPL (CPTPL = 11b).
    assert_eq!(
        resv(&mut a, resv_opc::REGISTER, 3 << 30, 0, 0xA),
        Status::SUCCESS
    );
    assert_eq!(resv(&mut b, resv_opc::REGISTER, 0, 0, 0xB), Status::SUCCESS);
    assert_eq!(
        resv(&mut a, resv_opc::ACQUIRE, WE, 0xBAD, 0),
        CONFLICT,
        "wrong key"
    );
    assert_eq!(resv(&mut a, resv_opc::ACQUIRE, WE, 0xA, 0), Status::SUCCESS);
    assert_eq!(write(&mut b), CONFLICT);
    assert_eq!(read(&mut b), Status::SUCCESS);
    assert_eq!(write(&mut a), Status::SUCCESS);
    let r = report(&mut b);
    assert!(r.ptpl);
    assert_eq!((r.rtype, r.registrants.len()), (1, 2));

    // The state is on disk (written off the reactor: wait for it), then the
    // daemon dies without a word.
    let t0 = Instant::now();
    while !std::fs::read_to_string(&ptpl).is_ok_and(|t| t.contains("\"rtype\": 1")) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "PTPL file not written"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    d.child.kill().unwrap();
    d.child.wait().unwrap();
    let _ = std::fs::remove_file(&sock);
    drop((a, b));
    d.child = spawn_daemon(&cfg, &sock);
    let (_ca, mut a) = host(port, HOST_A);
    let (_cb, mut b) = host(port, HOST_B);
    let r = report(&mut a);
    assert!(r.ptpl, "PTPL kept");
    assert_eq!(r.rtype, 1, "Write Exclusive kept");
    let holder: Vec<_> = r.registrants.iter().filter(|x| x.1).map(|x| x.2).collect();
    assert_eq!(holder, vec![HostId::extended(HOST_A.1)]);
    assert_eq!(write(&mut b), CONFLICT, "still fenced after the restart");
    assert_eq!(write(&mut a), Status::SUCCESS);

    // B preempts A: A is unregistered and fenced; B releases; B clears.
    assert_eq!(
        resv(&mut b, resv_opc::ACQUIRE, 1 | WE, 0xB, 0xA),
        Status::SUCCESS
    );
    assert_eq!(write(&mut a), CONFLICT);
    assert_eq!(
        resv(&mut b, resv_opc::RELEASE, WE, 0xA, 0),
        CONFLICT,
        "wrong key"
    );
    assert_eq!(resv(&mut b, resv_opc::RELEASE, WE, 0xB, 0), Status::SUCCESS);
    assert_eq!(write(&mut a), Status::SUCCESS);
    assert_eq!(resv(&mut b, resv_opc::RELEASE, 1, 0xB, 0), Status::SUCCESS);
    assert_eq!(report(&mut a).registrants.len(), 0);
}

/// A pool with one volume served as namespace 1 (no `ptpl_file`).
fn pool_volume_config(dir: &std::path::Path, port: u16) -> std::path::PathBuf {
    write_config(
        dir,
        "resv-pool.toml",
        &format!(
            r#"
[[listeners]]
address = "127.0.0.1"
port = {port}

[[pools]]
name = "p"
backend = "uring"
path = "{}/pool.img"
size = "64MiB"
extent_size = "1MiB"

[[pools.volumes]]
name = "v"
size = "8MiB"
block_size = 4096

[[subsystems]]
nqn = "{NQN}"
allow_any_host = true

[[subsystems.namespaces]]
nsid = 1
volume = "p/v"
"#,
            dir.display()
        ),
    )
}

/// Registers A (with CPTPL `cptpl`) and B, and A takes Write Exclusive;
/// then SIGKILLs the daemon and starts it again. Returns the new daemon
/// and both hosts, connected again (controller and I/O queue).
type Host = (HostController, IoQueue);
fn register_acquire_kill_restart(cptpl: u32) -> (tempfile::TempDir, Daemon, Host, Host) {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = pool_volume_config(dir.path(), port);
    let sock = dir.path().join("rpc.sock");
    let mut d = Daemon {
        child: spawn_daemon(&cfg, &sock),
    };
    let (mut ca, mut a) = host(port, HOST_A);
    let (_cb, mut b) = host(port, HOST_B);
    // RESCAP bit 0: the pool volume can persist, with no ptpl_file.
    let id = ca.identify(0, 1).unwrap();
    assert_eq!(id[31] & 1, 1, "RESCAP PTPL on a pool volume");
    assert_eq!(
        resv(&mut a, resv_opc::REGISTER, cptpl << 30, 0, 0xA),
        Status::SUCCESS
    );
    assert_eq!(resv(&mut b, resv_opc::REGISTER, 0, 0, 0xB), Status::SUCCESS);
    assert_eq!(resv(&mut a, resv_opc::ACQUIRE, WE, 0xA, 0), Status::SUCCESS);
    assert_eq!(write(&mut b), CONFLICT);
    let r = report(&mut b);
    assert_eq!((r.ptpl, r.rtype, r.registrants.len()), (cptpl == 3, 1, 2));
    // Each command was answered once its record was journaled: no wait
    // here before the daemon dies without a word.
    d.child.kill().unwrap();
    d.child.wait().unwrap();
    let _ = std::fs::remove_file(&sock);
    drop((a, b));
    d.child = spawn_daemon(&cfg, &sock);
    (dir, d, host(port, HOST_A), host(port, HOST_B))
}

#[test]
fn ptpl_on_a_pool_volume_survives_sigkill_in_the_pool_metadata() {
    let (_dir, _d, (_ca, mut a), (_cb, mut b)) = register_acquire_kill_restart(3);
    let r = report(&mut a);
    assert!(r.ptpl, "PTPL kept");
    assert_eq!(r.rtype, 1, "Write Exclusive kept");
    let mut regs: Vec<_> = r.registrants.iter().map(|x| (x.2, x.3, x.1)).collect();
    regs.sort_by_key(|x| x.1);
    assert_eq!(
        regs,
        vec![
            (HostId::extended(HOST_A.1), 0xA, true),
            (HostId::extended(HOST_B.1), 0xB, false)
        ],
        "the same registrants and holder"
    );
    assert_eq!(write(&mut b), CONFLICT, "still fenced after the restart");
    assert_eq!(write(&mut a), Status::SUCCESS);
    // Clear: nobody is registered any more.
    assert_eq!(resv(&mut a, resv_opc::RELEASE, 1, 0xA, 0), Status::SUCCESS);
    assert_eq!(report(&mut b).registrants.len(), 0);
    assert_eq!(write(&mut b), Status::SUCCESS);
}

#[test]
fn without_ptpl_a_pool_volume_forgets_its_reservation_on_restart() {
    let (_dir, _d, (_ca, mut a), (_cb, mut b)) = register_acquire_kill_restart(0);
    let r = report(&mut a);
    assert!(!r.ptpl);
    assert_eq!((r.rtype, r.registrants.len()), (0, 0), "nothing kept");
    assert_eq!(write(&mut b), Status::SUCCESS);
}
