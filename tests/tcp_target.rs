//! Integration tests: the real target in-process on loopback, driven by the in-repo
//! NVMe/TCP initiator over real sockets and real files.

use kvtarget::config::Config;
use kvtarget::initiator::{Error, HostController, HostOptions, QueueConn};
use kvtarget::server::Server;
use kvtarget::wire::nvme::{self, io_opc, Sqe, Status};
use kvtarget::wire::tcp::{self as pdu, fes, Digests};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const NQN: &str = "nqn.2026-11.io.kvtarget:test";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:6b767461-7267-6574-0000-000000000001";

struct Harness {
    server: Option<Server>,
    addr: SocketAddr,
    disc_addr: Option<SocketAddr>,
    _dir: tempfile::TempDir,
    cfg_text: String,
}

fn config(dir: &std::path::Path, extra_tcp: &str, backend: &str) -> String {
    let ns = if backend == "ram" {
        "backend = \"ram\"\nsize = \"64MiB\"".to_string()
    } else {
        format!(
            "backend = \"uring\"\npath = \"{}/ns1.img\"\nsize = \"64MiB\"",
            dir.display()
        )
    };
    format!(
        r#"
[reactors]
count = 2
idle = "adaptive"

[tcp]
{extra_tcp}

[discovery]
port = 0

[[listeners]]
address = "127.0.0.1"
port = 0

[[subsystems]]
nqn = "{NQN}"
serial = "KVTTEST1"
allow_any_host = false
hosts = ["{HOST}"]

[[subsystems.namespaces]]
nsid = 1
{ns}
block_size = 512

[[subsystems.namespaces]]
nsid = 2
backend = "ram"
size = "16MiB"
block_size = 4096
"#
    )
}

impl Harness {
    fn start_with(extra_tcp: &str, backend: &str) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let text = config(dir.path(), extra_tcp, backend);
        let mut h = Harness {
            server: None,
            addr: "127.0.0.1:1".parse().unwrap(),
            disc_addr: None,
            _dir: dir,
            cfg_text: text,
        };
        h.boot();
        h
    }

    fn start() -> Harness {
        Harness::start_with("", "uring")
    }

    fn boot(&mut self) {
        let cfg = Config::parse(&self.cfg_text).unwrap();
        let s = Server::start(&cfg).unwrap();
        for &(a, d) in s.listen_addrs() {
            if d {
                self.disc_addr = Some(a);
            } else {
                self.addr = a;
            }
        }
        self.server = Some(s);
    }

    fn restart(&mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown();
        }
        self.boot_again_same_port();
    }

    fn opts(&self) -> HostOptions {
        let mut o = HostOptions::new(self.addr, NQN);
        o.hostnqn = HOST.into();
        o
    }

    fn host(&self) -> HostController {
        HostController::connect(&self.opts()).unwrap()
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn discovery_lists_allowed_subsystems_on_both_ports() {
    let h = Harness::start();
    for addr in [h.addr, h.disc_addr.unwrap()] {
        let mut o = HostOptions::new(addr, nvme::DISCOVERY_NQN);
        o.hostnqn = HOST.into();
        let mut d = HostController::connect(&o).unwrap();
        assert_eq!(d.id.cntrltype, 2);
        let log = d.discovery_log().unwrap();
        let nvm: Vec<_> = log
            .iter()
            .filter(|e| e.subtype == nvme::subtype::NVME)
            .collect();
        assert_eq!(nvm.len(), 1, "{log:?}");
        assert_eq!(nvm[0].subnqn, NQN);
        assert_eq!(nvm[0].trsvcid, h.addr.port().to_string());
        assert_eq!(nvm[0].traddr, "127.0.0.1");
        assert_eq!(nvm[0].trtype, nvme::trtype::TCP);
        assert!(log
            .iter()
            .any(|e| e.subtype == nvme::subtype::CURRENT_DISCOVERY));
        d.keep_alive().unwrap();
    }
    // A host that may not connect does not see the subsystem.
    let mut o = HostOptions::new(h.addr, nvme::DISCOVERY_NQN);
    o.hostnqn = "nqn.2026-11.io.kvtarget:stranger".into();
    let mut d = HostController::connect(&o).unwrap();
    assert!(d.discovery_log().unwrap().iter().all(|e| e.subnqn != NQN));
    // The discovery port serves discovery only.
    let mut o = h.opts();
    o.addr = h.disc_addr.unwrap();
    match HostController::connect(&o) {
        Err(Error::Status(s, _)) => assert_eq!(s, Status::CONNECT_INVALID_PARAMETERS),
        other => panic!("expected refusal, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn identify_and_logs() {
    let h = Harness::start();
    let mut c = h.host();
    assert_eq!(c.id.subnqn, NQN);
    assert_eq!(c.id.serial, "KVTTEST1");
    assert_eq!(c.id.cntrltype, 1);
    assert!(c.id.kas > 0);
    assert_eq!(c.id.icdoff, 0);
    assert_eq!(c.active_namespaces().unwrap(), vec![1, 2]);
    let ns1 = c.identify_namespace(1).unwrap();
    assert_eq!(ns1.nsze, (64 << 20) / 512);
    assert_eq!(ns1.lbads, 9);
    assert_eq!(ns1.dlfeat & 0x7, 1);
    let ns2 = c.identify_namespace(2).unwrap();
    assert_eq!(ns2.lbads, 12);
    assert_ne!(ns1.nguid, ns2.nguid);
    let smart = c
        .get_log_page(nvme::lid::SMART_HEALTH, 0xFFFF_FFFF, 512, 0)
        .unwrap();
    assert_eq!(nvme::SmartLog::decode(&smart).available_spare, 100);
    let err = c.get_log_page(nvme::lid::ERROR_INFO, 0, 4096, 0).unwrap();
    assert_eq!(err.len(), 4096);
    assert_eq!(c.set_queue_count(4).unwrap(), 4);
    // Unknown admin opcode.
    let r = c.admin.execute(Sqe::new(0xC1, 0, 0), None, 0).unwrap();
    assert_eq!(r.status(), Status::INVALID_OPCODE);
    c.shutdown().unwrap();
}

#[test]
fn read_write_verify_many_outstanding_on_four_queues() {
    let h = Harness::start();
    let mut c = h.host();
    assert_eq!(c.set_queue_count(4).unwrap(), 4);
    let queues: Vec<_> = (1..=4).map(|q| c.io_queue(q).unwrap()).collect();
    let threads: Vec<_> = queues
        .into_iter()
        .enumerate()
        .map(|(qi, mut q)| {
            std::thread::spawn(move || {
                // 64 outstanding 4 KiB writes, then 64 outstanding reads, verified.
                let base = qi as u64 * 8192;
                let mut cids = Vec::new();
                for i in 0..64u64 {
                    let data = pattern(base + i, 4096);
                    cids.push(q.submit_write(1, base + i * 8, data, 512, false).unwrap());
                }
                assert!(q.q.in_flight() > 0);
                for _ in 0..64 {
                    q.q.wait_any().unwrap().ok().unwrap();
                }
                let mut reads = std::collections::HashMap::new();
                for i in 0..64u64 {
                    reads.insert(q.submit_read(1, base + i * 8, 8, 512).unwrap(), i);
                }
                for _ in 0..64 {
                    let c = q.q.wait_any().unwrap().ok().unwrap();
                    let i = reads[&c.cqe.cid];
                    assert_eq!(c.data, pattern(base + i, 4096), "queue {qi} block {i}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    c.keep_alive().unwrap();
}

#[test]
fn io_errors_have_precise_statuses() {
    let h = Harness::start();
    let mut c = h.host();
    c.set_queue_count(1).unwrap();
    let mut q = c.io_queue(1).unwrap();
    let r = q.q.execute(Sqe::new(0x55, 0, 1), None, 0).unwrap();
    assert_eq!(r.status(), Status::INVALID_OPCODE);
    let r = q.q.execute(Sqe::new(io_opc::FLUSH, 0, 9), None, 0).unwrap();
    assert_eq!(r.status(), Status::INVALID_NAMESPACE);
    match q.read(1, (64 << 20) / 512 - 1, 2, 512) {
        Err(Error::Status(s, _)) => assert_eq!(s, Status::LBA_OUT_OF_RANGE),
        other => panic!("{other:?}"),
    }
    // A write beyond the end is refused before any data moves (no R2T).
    match q.write(1, (64 << 20) / 512, vec![0; 1 << 20], 512) {
        Err(Error::Status(s, _)) => assert_eq!(s, Status::LBA_OUT_OF_RANGE),
        other => panic!("{other:?}"),
    }
    // Errors land in the error log, newest first.
    let log = c.get_log_page(nvme::lid::ERROR_INFO, 0, 64, 0).unwrap();
    let e = nvme::ErrorLogEntry::decode(&log);
    assert!(e.error_count >= 4);
    assert_eq!(Status::from_field(e.status), Status::LBA_OUT_OF_RANGE);
    // The queue still works.
    q.write(1, 0, pattern(1, 512), 512).unwrap();
    assert_eq!(q.read(1, 0, 1, 512).unwrap(), pattern(1, 512));
}

fn large_transfers(digests: Digests) {
    // Small R2T and H2C limits force several R2Ts and several H2CData per R2T.
    let h = Harness::start_with(
        "max_r2t_length = \"256KiB\"\nmax_h2c_data = \"64KiB\"",
        "uring",
    );
    let mut o = h.opts();
    o.digests = digests;
    let mut c = HostController::connect(&o).unwrap();
    c.set_queue_count(2).unwrap();
    let mut q = c.io_queue(1).unwrap();
    assert_eq!(q.q.maxh2cdata, 64 << 10);
    let mut cids = Vec::new();
    for i in 0..4u64 {
        cids.push(
            q.submit_write(1, i * 2048, pattern(i + 100, 1 << 20), 512, i == 3)
                .unwrap(),
        );
    }
    for cid in cids {
        q.q.wait_for(cid).unwrap().ok().unwrap();
    }
    for i in 0..4u64 {
        assert_eq!(
            q.read(1, i * 2048, 2048, 512).unwrap(),
            pattern(i + 100, 1 << 20)
        );
    }
    // In-capsule writes (8 KiB fits) on the 4 KiB namespace.
    q.write(2, 3, pattern(7, 8192), 4096).unwrap();
    assert_eq!(q.read(2, 3, 2, 4096).unwrap(), pattern(7, 8192));
    // H2CData trickling in MTU-sized pieces: the target sees each PDU's header
    // before its data and receives the data straight into the command buffer.
    q.q.h2c_trickle = 1500;
    q.write(1, 8192, pattern(200, 256 << 10), 512).unwrap();
    assert_eq!(q.read(1, 8192, 512, 512).unwrap(), pattern(200, 256 << 10));
    if digests.data {
        // A data digest error on that path fails the command with Transient
        // Transport Error, and the queue goes on.
        q.q.corrupt_next_data_digest = true;
        let e = q.write(1, 16384, pattern(201, 64 << 10), 512).unwrap_err();
        match e {
            kvtarget::initiator::Error::Status(st, _) => {
                assert_eq!((st.sct, st.sc), (0, 0x22), "{st:?}")
            }
            other => panic!("{other}"),
        }
        q.write(1, 16384, pattern(202, 64 << 10), 512).unwrap();
        assert_eq!(q.read(1, 16384, 128, 512).unwrap(), pattern(202, 64 << 10));
    }
}

/// `tcp.max_active_r2ts` bounds the writes a connection asks data for at once;
/// the others get their R2T as earlier ones finish, in arrival order.
fn active_r2ts(limit: Option<u16>, writes: u64) -> Vec<usize> {
    let extra = limit.map_or(String::new(), |n| format!("max_active_r2ts = {n}"));
    let h = Harness::start_with(&extra, "uring");
    let mut c = HostController::connect(&h.opts()).unwrap();
    c.set_queue_count(2).unwrap();
    let mut q = c.io_queue(1).unwrap();
    q.q.hold_r2ts = true;
    // 64 KiB each: more than the 8 KiB of in-capsule data, so each needs an R2T.
    let cids: Vec<u16> = (0..writes)
        .map(|i| {
            q.submit_write(1, i * 128, pattern(i + 300, 64 << 10), 512, false)
                .unwrap()
        })
        .collect();
    let mut asked = Vec::new();
    let mut answered = 0;
    while answered < cids.len() {
        q.q.pump_for(Duration::from_millis(300)).unwrap();
        let held = q.q.held_r2ts();
        assert!(
            !held.is_empty(),
            "no R2T after {answered} answered: {asked:?}"
        );
        let want: Vec<u16> = cids[answered..answered + held.len()].to_vec();
        assert_eq!(held, want, "R2Ts in submission order");
        asked.push(held.len());
        answered += held.len();
        q.q.release_r2ts().unwrap();
    }
    q.q.hold_r2ts = false;
    for cid in &cids {
        q.q.wait_for(*cid).unwrap().ok().unwrap();
    }
    for i in 0..writes {
        assert_eq!(
            q.read(1, i * 128, 128, 512).unwrap(),
            pattern(i + 300, 64 << 10)
        );
    }
    asked
}

#[test]
fn writes_get_r2ts_up_to_the_active_limit() {
    assert_eq!(active_r2ts(Some(2), 5), vec![2, 2, 1]);
    assert_eq!(active_r2ts(Some(1), 3), vec![1, 1, 1]);
    // The default (32) asks for all of a few at once.
    assert_eq!(active_r2ts(None, 5), vec![5]);
}

#[test]
fn fixed_socket_buffers_carry_large_transfers() {
    let h = Harness::start_with(
        "recv_buf_size = \"256KiB\"\nsend_buf_size = \"256KiB\"",
        "uring",
    );
    let mut c = HostController::connect(&h.opts()).unwrap();
    c.set_queue_count(2).unwrap();
    let mut q = c.io_queue(1).unwrap();
    let cids: Vec<u16> = (0..4u64)
        .map(|i| {
            q.submit_write(1, i * 2048, pattern(i + 400, 1 << 20), 512, false)
                .unwrap()
        })
        .collect();
    for cid in cids {
        q.q.wait_for(cid).unwrap().ok().unwrap();
    }
    for i in 0..4u64 {
        assert_eq!(
            q.read(1, i * 2048, 2048, 512).unwrap(),
            pattern(i + 400, 1 << 20)
        );
    }
}

#[test]
fn large_transfers_without_digests() {
    large_transfers(Digests::default());
}

#[test]
fn large_transfers_with_header_and_data_digests() {
    large_transfers(Digests {
        header: true,
        data: true,
    });
}

#[test]
fn flush_write_zeroes_and_deallocate() {
    let h = Harness::start();
    let mut c = h.host();
    c.set_queue_count(1).unwrap();
    let mut q = c.io_queue(1).unwrap();
    q.write(1, 0, pattern(3, 64 * 1024), 512).unwrap();
    q.flush(1).unwrap();
    q.q.execute(Sqe::new(io_opc::FLUSH, 0, 0xFFFF_FFFF), None, 0)
        .unwrap()
        .ok()
        .unwrap();
    q.write_zeroes(1, 8, 8, false).unwrap();
    q.write_zeroes(1, 16, 8, true).unwrap();
    q.deallocate(1, &[(32, 16), (64, 8)]).unwrap();
    let got = q.read(1, 0, 128, 512).unwrap();
    let want = pattern(3, 64 * 1024);
    for (blk, chunk) in got.chunks(512).enumerate() {
        let zero = (8..24).contains(&blk) || (32..48).contains(&blk) || (64..72).contains(&blk);
        if zero {
            assert!(
                chunk.iter().all(|&b| b == 0),
                "block {blk} should read zeros"
            );
        } else {
            assert_eq!(chunk, &want[blk * 512..(blk + 1) * 512], "block {blk} kept");
        }
    }
    // Out-of-range deallocate fails, and nothing is changed.
    assert!(q.deallocate(1, &[(0, 8), ((64 << 20) / 512, 8)]).is_err());
    assert_eq!(q.read(1, 0, 8, 512).unwrap(), want[..4096].to_vec());
}

#[test]
fn keep_alive_expiry_tears_the_controller_down() {
    let h = Harness::start();
    let mut o = h.opts();
    o.kato_ms = 1000;
    let mut c = HostController::connect(&o).unwrap();
    c.set_queue_count(1).unwrap();
    let mut q = c.io_queue(1).unwrap();
    // Keep-alives keep it up well past KATO.
    for _ in 0..6 {
        std::thread::sleep(Duration::from_millis(400));
        c.keep_alive().unwrap();
    }
    q.write(1, 0, pattern(9, 512), 512).unwrap();
    // Silence: the target drops the admin and the I/O queue.
    std::thread::sleep(Duration::from_millis(3500));
    assert!(c.keep_alive().is_err(), "admin queue should be closed");
    assert!(q.read(1, 0, 1, 512).is_err(), "I/O queue should be closed");
    // A new association works.
    let mut c2 = h.host();
    c2.keep_alive().unwrap();
}

#[test]
fn malformed_pdu_terminates_only_that_connection() {
    let h = Harness::start();
    let mut c = h.host();
    c.set_queue_count(2).unwrap();
    let mut good = c.io_queue(1).unwrap();
    let mut bad = c.io_queue(2).unwrap();
    // A CapsuleCmd whose header length is wrong.
    let mut raw = Vec::new();
    pdu::encode_capsule_cmd(
        &mut raw,
        &Sqe::new(io_opc::READ, 5, 1),
        &[],
        Digests::default(),
    );
    raw[2] = 70;
    bad.q.send_raw(&raw).unwrap();
    match bad.q.wait_any() {
        Err(Error::Terminated { fes: f, fei }) => {
            assert_eq!(f, fes::INVALID_HEADER_FIELD);
            assert_eq!(fei, 2);
        }
        other => panic!("expected C2HTermReq, got {other:?}"),
    }
    // Garbage on a fresh connection before ICReq.
    let mut s = std::net::TcpStream::connect(h.addr).unwrap();
    use std::io::{Read, Write};
    s.write_all(&[0xFF; 64]).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = [0u8; 256];
    let n = s.read(&mut b).unwrap();
    assert!(
        n >= 24 && b[0] == pdu::pdu_type::C2H_TERM_REQ,
        "got {:?}",
        &b[..n]
    );
    // The other queue and the admin queue carry on.
    good.write(1, 0, pattern(5, 4096), 512).unwrap();
    assert_eq!(good.read(1, 0, 8, 512).unwrap(), pattern(5, 4096));
    c.keep_alive().unwrap();
}

#[test]
fn wrong_nqn_and_unknown_host_are_refused() {
    let h = Harness::start();
    let mut o = h.opts();
    o.subnqn = "nqn.2026-11.io.kvtarget:nope".into();
    match HostController::connect(&o) {
        Err(Error::Status(s, cqe)) => {
            assert_eq!(s, Status::CONNECT_INVALID_PARAMETERS);
            assert_eq!(cqe.result as u32, 256 | 1 << 16, "IATTR=1, IPO=subnqn");
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
    let mut o = h.opts();
    o.hostnqn = "nqn.2026-11.io.kvtarget:intruder".into();
    match HostController::connect(&o) {
        Err(Error::Status(s, _)) => assert_eq!(s, Status::CONNECT_INVALID_HOST),
        other => panic!("{:?}", other.map(|_| ())),
    }
    // Commands before Connect are refused, not executed.
    let mut q = QueueConn::open(h.addr, Digests::default(), Duration::from_secs(5)).unwrap();
    let r = q
        .execute(Sqe::new(nvme::admin_opc::IDENTIFY, 0, 0), None, 4096)
        .unwrap();
    assert_eq!(r.status(), Status::COMMAND_SEQUENCE_ERROR);
}

#[test]
fn data_survives_a_target_restart() {
    let mut h = Harness::start();
    let data = pattern(42, 256 * 1024);
    {
        let mut c = h.host();
        c.set_queue_count(1).unwrap();
        let mut q = c.io_queue(1).unwrap();
        q.write(1, 1000, data.clone(), 512).unwrap();
        q.flush(1).unwrap();
    }
    let port = h.addr.port();
    h.restart();
    assert_eq!(h.addr.port(), port);
    let mut c = h.host();
    c.set_queue_count(1).unwrap();
    let mut q = c.io_queue(1).unwrap();
    assert_eq!(q.read(1, 1000, 512, 512).unwrap(), data);
}

#[test]
fn shutdown_completes_in_flight_io() {
    let mut h = Harness::start();
    let mut c = h.host();
    c.set_queue_count(1).unwrap();
    let mut q = c.io_queue(1).unwrap();
    let mut cids = Vec::new();
    for i in 0..32u64 {
        cids.push(
            q.submit_write(1, i * 256, pattern(i, 128 * 1024), 512, false)
                .unwrap(),
        );
    }
    // Stop while writes are in flight: every one is answered before the close.
    let t0 = Instant::now();
    let server = h.server.take().unwrap();
    let stopper = std::thread::spawn(move || server.shutdown());
    let mut answered = 0;
    for cid in cids {
        match q.q.wait_for(cid) {
            Ok(c) => {
                assert!(c.status().is_success());
                answered += 1;
            }
            Err(_) => break,
        }
    }
    stopper.join().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(30));
    // Whatever was acknowledged is on disk after restart.
    h.boot_again_same_port();
    let mut c = h.host();
    c.set_queue_count(1).unwrap();
    let mut q = c.io_queue(1).unwrap();
    for i in 0..answered as u64 {
        assert_eq!(
            q.read(1, i * 256, 256, 512).unwrap(),
            pattern(i, 128 * 1024),
            "write {i}"
        );
    }
}

impl Harness {
    /// Boots again on the port already bound, so hosts' addresses stay valid.
    fn boot_again_same_port(&mut self) {
        self.cfg_text = self.cfg_text.replacen(
            "port = 0\n\n[[subsystems]]",
            &format!("port = {}\n\n[[subsystems]]", self.addr.port()),
            1,
        );
        self.boot();
    }
}

#[test]
fn ram_backend_serves_io() {
    let h = Harness::start_with("", "ram");
    let mut c = h.host();
    c.set_queue_count(1).unwrap();
    let mut q = c.io_queue(1).unwrap();
    q.write(1, 7, pattern(11, 4096), 512).unwrap();
    assert_eq!(q.read(1, 7, 8, 512).unwrap(), pattern(11, 4096));
    q.disconnect().unwrap();
    // The freed queue ID can be connected again.
    let mut q = c.io_queue(1).unwrap();
    assert_eq!(q.read(1, 7, 8, 512).unwrap(), pattern(11, 4096));
}

/// A host that closes a queue's connection without a Disconnect and connects
/// the same QID straight away (SPDK's initiator reconnecting a queue pair)
/// gets it: the Connect waits for the old queue's close to be seen.
#[test]
fn a_queue_id_can_be_connected_again_right_after_its_connection_closes() {
    let h = Harness::start_with("", "ram");
    let mut c = h.host();
    c.set_queue_count(2).unwrap();
    let mut other = c.io_queue(2).unwrap();
    for round in 0..20u8 {
        let mut q = c.io_queue(1).unwrap();
        q.write(1, round as u64, pattern(round as u64, 512), 512)
            .unwrap();
        drop(q);
    }
    let mut q = c.io_queue(1).unwrap();
    for round in 0..20u8 {
        assert_eq!(
            q.read(1, round as u64, 1, 512).unwrap(),
            pattern(round as u64, 512)
        );
    }
    // The other queue of the controller never noticed.
    assert_eq!(other.read(1, 19, 1, 512).unwrap(), pattern(19, 512));
}

/// Random and mutated PDUs from many connections: each one is answered with a
/// TermReq or an NVMe status or closed, the target never panics or hangs, and a
/// well-behaved queue keeps working throughout.
#[test]
fn hostile_bytes_never_hurt_other_connections() {
    use std::io::{Read, Write};
    let h = Harness::start_with("", "ram");
    let mut c = h.host();
    c.set_queue_count(1).unwrap();
    let mut good = c.io_queue(1).unwrap();
    let mut seed = 0x1234_5678_9abc_def0u64;
    let mut rand = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..120u64 {
        let mut s = std::net::TcpStream::connect(h.addr).unwrap();
        // A mutated length can leave a PDU legitimately incomplete; the target
        // then waits for the rest, as any stream receiver must.
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let mut bytes = Vec::new();
        // Half the rounds start with a valid ICReq so the mutation hits later PDUs.
        if round % 2 == 0 {
            pdu::encode_icreq(&mut bytes, &pdu::ICReq::default());
        }
        let mut p = Vec::new();
        let sqe = Sqe::new((rand() % 256) as u8, rand() as u16, (rand() % 4) as u32);
        let data: Vec<u8> = (0..(rand() % 300) as usize).map(|_| rand() as u8).collect();
        pdu::encode_capsule_cmd(&mut p, &sqe, &data, Digests::default());
        for _ in 0..(rand() % 4) {
            let i = (rand() as usize) % p.len();
            p[i] = rand() as u8;
        }
        bytes.extend_from_slice(&p);
        let _ = s.write_all(&bytes);
        let mut buf = [0u8; 8192];
        let t0 = Instant::now();
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) if t0.elapsed() > Duration::from_millis(200) => break,
                Ok(_) => {}
            }
        }
        if round % 20 == 0 {
            good.write(1, round, pattern(round, 512), 512).unwrap();
            assert_eq!(good.read(1, round, 1, 512).unwrap(), pattern(round, 512));
        }
    }
    c.keep_alive().unwrap();
}

#[test]
fn perf_runs_a_mixed_workload_without_errors() {
    use kvtarget::perf::{run, PerfOptions, Workload};
    let h = Harness::start_with("", "ram");
    for (workload, bs, queues) in [(Workload::RandRw, 4096, 2), (Workload::Write, 1 << 20, 1)] {
        let r = run(&PerfOptions {
            hostnqn: Some(HOST.into()),
            workload,
            block_size: bs,
            qd: 8,
            queues,
            runtime: Duration::from_millis(500),
            warmup: Duration::from_millis(100),
            // Sleeping in poll(2): the test machine has other work on its cores.
            busy_poll: false,
            ..PerfOptions::new(h.addr, NQN)
        })
        .unwrap();
        assert!(r.ios > 0, "{workload:?}: {}", r.to_text());
        assert_eq!(r.errors, 0);
        assert!(r.p50_us <= r.p99_us && r.p99_us <= r.max_us);
        assert!(r.to_json().starts_with("{\"ios\":"));
    }
    // Bad options get a clear error, not a panic.
    let e = run(&PerfOptions {
        hostnqn: Some(HOST.into()),
        workload: Workload::Read,
        block_size: 100,
        qd: 1,
        runtime: Duration::from_millis(100),
        warmup: Duration::ZERO,
        ..PerfOptions::new(h.addr, NQN)
    })
    .unwrap_err();
    assert!(matches!(e, kvtarget::perf::PerfError::BlockSize(_)), "{e}");
    assert!(e.to_string().contains("--bs"), "{e}");
}

/// The thread that calls `perf::run` only coordinates: without a progress line
/// it must sleep, not spin beside the workers (it once slept zero seconds in a
/// loop, taking a core from the load it measured).
#[test]
fn perf_coordinator_sleeps_while_workers_run() {
    use kvtarget::perf::{run, PerfOptions};
    fn thread_cpu() -> Duration {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: valid timespec pointer for the call.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    }
    let h = Harness::start_with("", "ram");
    let runtime = Duration::from_secs(3);
    let used = std::thread::spawn(move || {
        let c0 = thread_cpu();
        let r = run(&PerfOptions {
            hostnqn: Some(HOST.into()),
            qd: 4,
            runtime,
            warmup: Duration::from_millis(200),
            busy_poll: false,
            progress: false,
            ..PerfOptions::new(h.addr, NQN)
        })
        .unwrap();
        assert!(r.ios > 0);
        thread_cpu() - c0
    })
    .join()
    .unwrap();
    // Connecting takes a few milliseconds of CPU; spinning took about half a
    // second even on a loaded machine.
    assert!(
        used < Duration::from_millis(150),
        "coordinator used {used:?} of CPU"
    );
}

#[test]
fn perf_verify_checks_reads_and_catches_foreign_writes() {
    use kvtarget::perf::{run, PerfOptions, Workload};
    use std::sync::atomic::{AtomicBool, Ordering};
    let h = Harness::start_with("", "ram");
    let base = PerfOptions {
        hostnqn: Some(HOST.into()),
        nsid: 2,
        qd: 8,
        queues: 2,
        runtime: Duration::from_millis(600),
        warmup: Duration::from_millis(100),
        verify: true,
        busy_poll: false,
        ..PerfOptions::new(h.addr, NQN)
    };
    // Alone, every read matches what this run wrote.
    for workload in [Workload::RandRw, Workload::RandRead] {
        let r = run(&PerfOptions {
            workload,
            ..base.clone()
        })
        .unwrap();
        assert!(r.verified > 0, "{workload:?}: {}", r.to_text());
        assert_eq!((r.mismatches, r.errors), (0, 0), "{}", r.to_text());
    }
    // Another host overwriting the namespace meanwhile is caught.
    let stop = AtomicBool::new(false);
    let r = std::thread::scope(|s| {
        s.spawn(|| {
            let mut c = HostController::connect(&h.opts()).unwrap();
            c.set_queue_count(1).unwrap();
            let mut q = c.io_queue(1).unwrap();
            while !stop.load(Ordering::Relaxed) {
                for slba in 0..4096u64 {
                    q.write(2, slba, vec![0xEE; 4096], 4096).unwrap();
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                }
            }
        });
        let r = run(&PerfOptions {
            workload: Workload::RandRead,
            runtime: Duration::from_millis(1500),
            ..base.clone()
        });
        stop.store(true, Ordering::Relaxed);
        r
    })
    .unwrap();
    assert!(r.mismatches > 0, "{}", r.to_text());
    assert!(r.errors >= r.mismatches.min(1), "{}", r.to_text());
    assert!(r.to_text().contains("mismatch: slba"), "{}", r.to_text());
}

/// A target whose MDTS is smaller than the I/O: the in-repo initiator and the
/// load generator split each transfer into MDTS-sized commands, as a host
/// driver does (`kvtarget perf --bs 1MiB` against SPDK's nvmf_tgt, MDTS 128 KiB,
/// once died of a fatal transport error).
#[test]
fn transfers_larger_than_mdts_are_split_by_the_host() {
    use kvtarget::perf::{run, PerfOptions, Workload};
    let h = Harness::start_with("max_io_size = \"64KiB\"", "ram");
    let mut c = h.host();
    assert_eq!(c.max_transfer(), Some(64 << 10), "MDTS {}", c.id.mdts);
    assert_eq!(c.set_queue_count(2).unwrap(), 2);
    let mut q = c.io_queue(1).unwrap();
    // One command over the limit is the target's to refuse...
    let big = pattern(7, 1 << 20);
    let cid = q.submit_write(2, 0, big.clone(), 4096, false).unwrap();
    assert!(!q.q.wait_for(cid).unwrap().status().is_success());
    // ...so `write` and `read` go as 16 commands each, and round-trip.
    q.write(2, 16, big.clone(), 4096).unwrap();
    assert_eq!(q.read(2, 16, 256, 4096).unwrap(), big);
    // An unaligned tail piece (a transfer not a multiple of MDTS).
    let odd = pattern(9, 72 << 10);
    q.write(2, 600, odd.clone(), 4096).unwrap();
    assert_eq!(q.read(2, 600, 18, 4096).unwrap(), odd);
    drop(q);
    for (workload, qd) in [
        (Workload::RandRw, 4),
        (Workload::Write, 2),
        (Workload::Read, 1),
    ] {
        let r = run(&PerfOptions {
            hostnqn: Some(HOST.into()),
            nsid: 2,
            workload,
            block_size: 1 << 20,
            qd,
            verify: true,
            runtime: Duration::from_millis(400),
            warmup: Duration::from_millis(50),
            busy_poll: false,
            ..PerfOptions::new(h.addr, NQN)
        })
        .unwrap();
        assert!(r.ios > 0, "{workload:?}: {}", r.to_text());
        assert_eq!(
            (r.errors, r.mismatches),
            (0, 0),
            "{workload:?}: {}",
            r.to_text()
        );
        if workload != Workload::Write {
            assert!(r.verified > 0, "{workload:?}: {}", r.to_text());
        }
    }
}

/// LMCache's raw-block phases as load: stores write a 4 KiB header block and
/// the payload after it in each slot (here 1 MiB chunks, MDTS 64 KiB: 17
/// commands per store), retrieves read payloads back, verified.
#[test]
fn perf_runs_lmcache_store_and_retrieve_phases() {
    use kvtarget::perf::{run, PerfOptions, Workload};
    let h = Harness::start_with("max_io_size = \"64KiB\"", "ram");
    for (workload, qd) in [(Workload::LmcacheStore, 4), (Workload::LmcacheRetrieve, 2)] {
        let r = run(&PerfOptions {
            hostnqn: Some(HOST.into()),
            workload,
            block_size: 1 << 20,
            lmcache_metadata: 1 << 20,
            qd,
            verify: true,
            runtime: Duration::from_millis(400),
            warmup: Duration::from_millis(50),
            busy_poll: false,
            ..PerfOptions::new(h.addr, NQN)
        })
        .unwrap();
        assert!(r.ios > 0, "{workload:?}: {}", r.to_text());
        assert_eq!(
            (r.errors, r.mismatches),
            (0, 0),
            "{workload:?}: {}",
            r.to_text()
        );
        if workload == Workload::LmcacheRetrieve {
            assert!(r.verified > 0, "{}", r.to_text());
        }
    }
    // The header lands at the slot's start and the payload after it: slot 0
    // of the last store run starts at 1 MiB, its payload at 1 MiB + 4 KiB.
    let mut c = h.host();
    assert_eq!(c.set_queue_count(1).unwrap(), 1);
    let mut q = c.io_queue(1).unwrap();
    let slot0 = q.read(1, 2048, 8, 512).unwrap();
    assert!(slot0.iter().any(|&b| b != 0), "no header at the first slot");
    let before = q.read(1, 2040, 8, 512).unwrap();
    assert!(
        before.iter().all(|&b| b == 0),
        "the metadata region was written"
    );
}

/// A queue stages at most a few MiB of read data ahead of its socket; reads
/// beyond that wait for it to drain, in order, and every one still returns its
/// own data: 16 MiB as 1 MiB reads in flight at once, a 4 KiB read issued
/// behind them, and a single read larger than the whole staging allowance. On
/// both backends (RAM completes reads inline, io_uring later).
#[test]
fn reads_beyond_the_staging_allowance_wait_and_return_their_data() {
    for backend in ["ram", "uring"] {
        let h = Harness::start_with("max_io_size = \"4MiB\"", backend);
        let mut c = h.host();
        assert_eq!(c.set_queue_count(1).unwrap(), 1);
        let mut q = c.io_queue(1).unwrap();
        let data = pattern(31, 32 << 20);
        q.write(1, 0, data.clone(), 512).unwrap();
        // 32 reads of 1 MiB submitted before any is collected.
        let cids: Vec<u16> = (0..32u64)
            .map(|i| q.submit_read(1, i * 2048, 2048, 512).unwrap())
            .collect();
        let small = q.submit_read(1, 7, 8, 512).unwrap();
        for (i, cid) in cids.into_iter().enumerate() {
            let got = q.q.wait_for(cid).unwrap().ok().unwrap().data;
            assert!(
                got == data[i << 20..(i + 1) << 20],
                "{backend}: read {i} returned other data"
            );
        }
        let got = q.q.wait_for(small).unwrap().ok().unwrap().data;
        assert_eq!(got, data[7 * 512..15 * 512], "{backend}: the 4 KiB read");
        // One 4 MiB read: more than the allowance on its own, still served.
        assert_eq!(q.read(1, 8192, 8192, 512).unwrap(), data[4 << 20..8 << 20]);
    }
}

/// NVMe/TCP's C2HData in pieces (`transport::tcp`): a large read goes out a
/// PDU of at most `tcp.max_c2h_data` at a time, and a small read on the same
/// queue pair is answered between them.
mod c2h_pieces {
    use kvtarget::initiator::{HostController, HostOptions};
    use kvtarget::wire::nvme::{io_opc, SglDescriptor, Sqe};
    use kvtarget::wire::tcp::{self as pdu, Digests};
    use std::io::{Read, Write};
    use std::time::Duration;

    const NQN: &str = "nqn.2026-11.io.kvtarget:isolation";
    const BIG: usize = 32 << 20;
    const SMALL: usize = 4096;

    /// One reactor, one RAM namespace of 4 KiB blocks, 32 MiB transfers, and
    /// small socket buffers so that what the kernel holds is little beside
    /// what the target queues.
    fn server(max_c2h_data: usize, c2h_success: bool) -> kvtarget::server::Server {
        let text = format!(
            r#"
[reactors]
count = 1

[tcp]
max_io_size = "32MiB"
send_buf_size = "64KiB"
max_c2h_data = {max_c2h_data}
c2h_success = {c2h_success}

[[listeners]]
address = "127.0.0.1"
port = 0

[[subsystems]]
nqn = "{NQN}"
allow_any_host = true

[[subsystems.namespaces]]
nsid = 1
backend = "ram"
size = "64MiB"
block_size = 4096
"#
        );
        let cfg = kvtarget::config::Config::parse(&text).unwrap();
        kvtarget::server::Server::start(&cfg).unwrap()
    }

    fn read_capsule(cid: u16, slba: u64, len: usize, digests: Digests) -> Vec<u8> {
        let mut sqe = Sqe::new(io_opc::READ, cid, 1);
        sqe.set_cdw(10, slba as u32);
        sqe.set_cdw(11, (slba >> 32) as u32);
        sqe.set_cdw(12, (len / 4096 - 1) as u32);
        sqe.set_sgl(SglDescriptor {
            address: 0,
            length: len as u32,
            type_byte: SglDescriptor::TRANSPORT,
        });
        let mut out = Vec::new();
        pdu::encode_capsule_cmd(&mut out, &sqe, &[], digests);
        out
    }

    /// The host's view of one PDU: its type, flags, the command it is for,
    /// and for C2HData its offset and data.
    struct Seen {
        ty: u8,
        flags: u8,
        cid: u16,
        offset: usize,
        data: Vec<u8>,
    }

    /// Reads one whole PDU off `s` (blocking), checking its data digest.
    fn next_pdu(s: &mut impl Read, digests: Digests, pos: &mut usize) -> Seen {
        let mut ch = [0u8; 8];
        s.read_exact(&mut ch).unwrap();
        let plen = u32::from_le_bytes([ch[4], ch[5], ch[6], ch[7]]) as usize;
        let mut rest = vec![0u8; plen - 8];
        s.read_exact(&mut rest).unwrap();
        *pos += plen;
        let mut p = ch.to_vec();
        p.extend_from_slice(&rest);
        let (ty, flags, pdo) = (p[0], p[1], p[3] as usize);
        let u16_at = |i: usize| u16::from_le_bytes([p[i], p[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes([p[i], p[i + 1], p[i + 2], p[i + 3]]);
        match ty {
            pdu::pdu_type::C2H_DATA => {
                let (offset, len) = (u32_at(12) as usize, u32_at(16) as usize);
                let data = p[pdo..pdo + len].to_vec();
                if digests.data {
                    assert_eq!(pdu::crc32c(&data), u32_at(pdo + len), "data digest");
                }
                Seen {
                    ty,
                    flags,
                    cid: u16_at(8),
                    offset,
                    data,
                }
            }
            // CapsuleResp: the CQE's CID is its bytes 12-13.
            _ => Seen {
                ty,
                flags,
                cid: u16_at(8 + 12),
                offset: 0,
                data: Vec::new(),
            },
        }
    }

    /// A 4 KiB read sent while a 32 MiB read's data is going out on the same
    /// queue pair is answered after at most about two C2HData PDUs more of
    /// the large one (plus what the kernel's socket buffers already hold),
    /// not after the rest of the 32 MiB; the large read's data still arrives
    /// whole, in offset order, in PDUs of at most `tcp.max_c2h_data`, its last
    /// one LAST_PDU. Measured: 0.19-0.33 MB ahead of it; before the large
    /// read was split, 33.5 MB (all of the rest of it). With the knob at
    /// 16 MiB the read goes in two PDUs.
    #[test]
    fn a_small_read_is_answered_between_the_pieces_of_a_large_one() {
        let both = Digests {
            header: true,
            data: true,
        };
        for (digests, pdu_max, success) in [
            (Digests::default(), 128 << 10, true),
            (both, 128 << 10, true),
            // A CapsuleResp after the last PDU instead of SUCCESS.
            (Digests::default(), 128 << 10, false),
            // The knob: PDUs of 16 MiB, two for the whole read.
            (Digests::default(), 16 << 20, true),
        ] {
            let srv = server(pdu_max, success);
            let mut resps = 0;
            let mut pdus = 0;
            let addr = srv.listen_addrs()[0].0;
            let mut o = HostOptions::new(addr, NQN);
            o.digests = digests;
            let mut c = HostController::connect(&o).unwrap();
            assert_eq!(c.set_queue_count(1).unwrap(), 1);
            let mut q = c.io_queue(1).unwrap();
            let want: Vec<u8> = (0..BIG + SMALL).map(|i| (i * 7 + i / 4096) as u8).collect();
            q.write(1, 0, want.clone(), 4096).unwrap();
            let parts = q.q.into_parts().unwrap();
            assert!(parts.unparsed.is_empty());
            let mut s = parts.sock;
            s.set_nonblocking(false).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            s.write_all(&read_capsule(1, 0, BIG, digests)).unwrap();
            // The large read's data is going out: now the small read.
            let mut head = vec![0u8; 64 << 10];
            s.read_exact(&mut head).unwrap();
            s.write_all(&read_capsule(2, (BIG / 4096) as u64, SMALL, digests))
                .unwrap();
            let sent_at = head.len();
            let mut r = std::io::Cursor::new(head).chain(&mut s);
            let mut pos = 0;
            let mut big = vec![0u8; BIG];
            let mut got = 0;
            let mut done = false;
            let mut ahead = None;
            while !(done && ahead.is_some()) {
                let start = pos;
                let p = next_pdu(&mut r, digests, &mut pos);
                if p.cid == 2 {
                    ahead = Some(start.saturating_sub(sent_at));
                    if p.ty == pdu::pdu_type::C2H_DATA {
                        assert_eq!(p.data, want[BIG..]);
                    }
                    continue;
                }
                assert_eq!(p.cid, 1);
                if p.ty == pdu::pdu_type::C2H_DATA {
                    assert_eq!(p.offset, got, "C2HData out of offset order");
                    assert!(p.data.len() <= pdu_max);
                    pdus += 1;
                    big[got..got + p.data.len()].copy_from_slice(&p.data);
                    got += p.data.len();
                    let last = p.flags & pdu::flags::LAST_PDU != 0;
                    assert_eq!(last, got == BIG, "LAST_PDU on the last PDU only");
                    done |= last && p.flags & pdu::flags::SUCCESS != 0;
                } else {
                    assert_eq!(got, BIG, "the response before the data");
                    resps += 1;
                    done = true;
                }
            }
            assert!(big == want[..BIG], "the large read's data");
            assert_eq!(pdus, BIG.div_ceil(pdu_max));
            assert_eq!(
                resps,
                usize::from(!success),
                "a CapsuleResp without SUCCESS"
            );
            let ahead = ahead.unwrap_or(0);
            assert!(
                ahead <= (1 << 20) + 2 * pdu_max,
                "{ahead} bytes of the 32 MiB read went ahead of the 4 KiB read's answer"
            );
            srv.shutdown();
        }
    }
}
