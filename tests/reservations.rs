//! NVMe reservations against the daemon over NVMe/TCP with the in-repo
//! initiator: two hosts (two host NQNs and Host Identifiers), Write
//! Exclusive, preempt, release, clear, a wrong key, and registrations with
//! Persist Through Power Loss kept across a SIGKILL and restart.

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
