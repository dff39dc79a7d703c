//! Thin KV-cache volumes served over NVMe/TCP: the real target in-process with
//! pools on real files and RAM, driven by the in-repo initiator over sockets.

use kvtarget::config::Config;
use kvtarget::initiator::{Error, HostController, IoQueue};
use kvtarget::server::Server;
use kvtarget::wire::nvme::Status;
use std::net::SocketAddr;

mod support;
use support::status_of;

const NQN: &str = "nqn.2026-11.io.kvtarget:vols";
const MIB: u64 = 1 << 20;

fn start(dir: &std::path::Path, pool_size: &str, extra: &str) -> (Server, SocketAddr) {
    let text = format!(
        r#"
[reactors]
count = 2

[[listeners]]
address = "127.0.0.1"
port = 0

[[pools]]
name = "p"
backend = "uring"
path = "{dir}/pool.img"
size = "{pool_size}"
extent_size = "1MiB"
{extra}

[[pools.volumes]]
name = "zeroes"
size = "64MiB"
block_size = 4096

[[pools.volumes]]
name = "misses"
size = "16MiB"
block_size = 512
unwritten = "error"

[[pools.volumes]]
name = "big"
size = "256MiB"

[[subsystems]]
nqn = "{NQN}"
allow_any_host = true

[[subsystems.namespaces]]
nsid = 1
volume = "p/zeroes"

[[subsystems.namespaces]]
nsid = 2
volume = "p/misses"

[[subsystems.namespaces]]
nsid = 3
volume = "p/big"
"#,
        dir = dir.display()
    );
    support::start_server(&text)
}

fn connect(addr: SocketAddr, queues: u16) -> (HostController, Vec<IoQueue>) {
    support::connect(addr, NQN, queues)
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u64).wrapping_mul(31) ^ seed.wrapping_mul(0x9E37)) as u8 | 1)
        .collect()
}

#[test]
fn thin_volumes_report_use_and_free_space_on_deallocate() {
    let dir = tempfile::tempdir().unwrap();
    let (server, addr) = start(dir.path(), "256MiB", "");
    let (mut c, mut qs) = connect(addr, 1);
    let q = &mut qs[0];

    assert_eq!(c.active_namespaces().unwrap(), vec![1, 2, 3]);
    let id = c.identify_namespace(1).unwrap();
    assert_eq!(id.nsze, 64 * MIB / 4096);
    assert_eq!(id.nuse, 0, "nothing written yet");
    assert_eq!(id.nsfeat & 1, 1, "thin provisioning reported");
    assert_eq!(id.dlfeat & 7, 1, "deallocated blocks read as zeros");
    let id2 = c.identify_namespace(2).unwrap();
    assert_eq!(id2.nsfeat & 0x04, 0x04, "DAE on the error volume");
    assert_eq!(id2.lbads, 9);

    // Unwritten blocks read as zeros without allocating.
    assert_eq!(q.read(1, 100, 4, 4096).unwrap(), vec![0u8; 16384]);
    let pool = server.pools()[0].clone();
    assert_eq!(pool.snapshot().mapped, 0);

    // Writes across an extent boundary allocate two extents.
    let data = pattern(1, 8 * 4096);
    q.write(1, 256 - 4, data.clone(), 4096).unwrap();
    assert_eq!(q.read(1, 256 - 4, 8, 4096).unwrap(), data);
    assert_eq!(pool.snapshot().mapped, 2);
    assert_eq!(c.identify_namespace(1).unwrap().nuse, 8);

    // Deallocate inside an extent: tracked, reads zeros, extent stays.
    q.deallocate(1, &[(256 - 4, 2)]).unwrap();
    let got = q.read(1, 256 - 4, 8, 4096).unwrap();
    assert_eq!(&got[..8192], &vec![0u8; 8192][..]);
    assert_eq!(&got[8192..], &data[8192..]);
    assert_eq!(c.identify_namespace(1).unwrap().nuse, 6);
    assert_eq!(pool.snapshot().mapped, 2);
    // The last valid blocks of the first extent go: it returns to the pool.
    q.write_zeroes(1, 256 - 2, 2, true).unwrap();
    assert_eq!(pool.snapshot().mapped, 1);
    assert_eq!(c.identify_namespace(1).unwrap().nuse, 4);

    // The unwritten-error volume: a miss is an NVMe status, a hit is data.
    let e = q.read(2, 0, 8, 512).unwrap_err();
    assert_eq!(status_of(e), Status::DEALLOCATED_OR_UNWRITTEN);
    let d = pattern(2, 4096);
    q.write(2, 0, d.clone(), 512).unwrap();
    assert_eq!(q.read(2, 0, 8, 512).unwrap(), d);
    let e = q.read(2, 4, 8, 512).unwrap_err();
    assert_eq!(
        status_of(e),
        Status::DEALLOCATED_OR_UNWRITTEN,
        "half written"
    );
    q.deallocate(2, &[(0, 4)]).unwrap();
    let e = q.read(2, 0, 4, 512).unwrap_err();
    assert_eq!(status_of(e), Status::DEALLOCATED_OR_UNWRITTEN);
    assert_eq!(q.read(2, 4, 4, 512).unwrap(), d[2048..].to_vec());
    q.flush(1).unwrap();
    drop(qs);
    drop(c);
    server.shutdown();
    let rep = kvtarget::pool::check(&kvtarget::config::setup::open_pool_device(
        &Config::parse(&format!(
            "[[listeners]]\naddress = \"127.0.0.1\"\n[[pools]]\nname = \"p\"\nbackend = \"uring\"\npath = \"{}/pool.img\"\n",
            dir.path().display()
        ))
        .unwrap()
        .pools[0],
        "pool",
    )
    .unwrap());
    assert!(rep.damage.is_empty(), "{:?}", rep.damage);
}

#[test]
fn out_of_space_fails_only_the_write_that_needed_space() {
    let dir = tempfile::tempdir().unwrap();
    // A 24 MiB pool holds about 19 extents after metadata; "big" is 256 MiB.
    let (server, addr) = start(dir.path(), "24MiB", "");
    let (_c, mut qs) = connect(addr, 1);
    let q = &mut qs[0];
    let extents = server.pools()[0].sb.extent_count as u64;
    let mb = 256; // blocks of 4 KiB per extent
    q.write(3, 0, pattern(9, 4096), 4096).unwrap();
    let mut full_at = None;
    for e in 1..extents + 4 {
        match q.write(3, e * mb, pattern(e, 4096), 4096) {
            Ok(()) => {}
            Err(err) => {
                assert_eq!(status_of(err), Status::CAPACITY_EXCEEDED);
                full_at = Some(e);
                break;
            }
        }
    }
    let full_at = full_at.expect("the pool filled up");
    assert_eq!(full_at, extents, "every extent was usable");
    // Writes into extents already held, reads, and the other volumes' reads go on.
    q.write(3, 5, pattern(77, 4096), 4096).unwrap();
    assert_eq!(q.read(3, 5, 1, 4096).unwrap(), pattern(77, 4096));
    assert_eq!(q.read(3, 0, 1, 4096).unwrap(), pattern(9, 4096));
    assert_eq!(q.read(1, 0, 1, 4096).unwrap(), vec![0u8; 4096]);
    // Free one extent: after GC scrubs it, a new first write succeeds again.
    q.deallocate(3, &[(mb, mb as u32)]).unwrap();
    let t0 = std::time::Instant::now();
    loop {
        match q.write(3, full_at * mb, pattern(5, 4096), 4096) {
            Ok(()) => break,
            Err(Error::Status(s, _)) if s == Status::CAPACITY_EXCEEDED => {
                assert!(t0.elapsed().as_secs() < 30, "freed space never came back");
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => panic!("{e:?}"),
        }
    }
    // The freed extent was scrubbed: the reused space shows no old data.
    assert_eq!(
        q.read(3, full_at * mb + 1, 255, 4096).unwrap(),
        vec![0u8; 255 * 4096]
    );
    server.shutdown();
}

#[test]
fn concurrent_first_writes_from_two_queues_allocate_once() {
    let dir = tempfile::tempdir().unwrap();
    let (server, addr) = start(dir.path(), "256MiB", "");
    let (_c, qs) = connect(addr, 2);
    let pool = server.pools()[0].clone();
    let mut handles = Vec::new();
    for (i, mut q) in qs.into_iter().enumerate() {
        handles.push(std::thread::spawn(move || {
            // Both queues write interleaved blocks of the same 32 extents.
            for e in 0..32u64 {
                let lba = e * 256 + i as u64;
                q.write(3, lba, pattern(e * 2 + i as u64, 4096), 4096)
                    .unwrap();
            }
            q
        }));
    }
    let mut qs: Vec<IoQueue> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(pool.snapshot().mapped, 32, "one extent per logical extent");
    for e in 0..32u64 {
        for i in 0..2u64 {
            let got = qs[0].read(3, e * 256 + i, 1, 4096).unwrap();
            assert_eq!(got, pattern(e * 2 + i, 4096), "extent {e} queue {i}");
        }
    }
    server.shutdown();
}

#[test]
fn large_transfers_split_by_dual_path_and_without_it_agree() {
    for enabled in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let extra = format!(
            "[pools.dual_path]\nenabled = {enabled}\npiece = \"64KiB\"\nmax_inflight = 2\n"
        );
        let (server, addr) = start(dir.path(), "256MiB", &extra);
        let (_c, mut qs) = connect(addr, 1);
        let q = &mut qs[0];
        // 1 MiB writes straddling extents, then mixed small reads in flight.
        let big = pattern(42, 1 << 20);
        q.write(3, 128, big.clone(), 4096).unwrap();
        let mut cids = Vec::new();
        cids.push(q.submit_read(3, 128, 256, 4096).unwrap());
        for k in 0..8 {
            cids.push(q.submit_read(3, 130 + k * 7, 1, 4096).unwrap());
        }
        for (n, cid) in cids.into_iter().enumerate() {
            let c = q.q.wait_for(cid).unwrap().ok().unwrap();
            if n == 0 {
                assert_eq!(c.data, big);
            } else {
                let at = (2 + (n - 1) * 7) * 4096;
                assert_eq!(c.data, big[at..at + 4096].to_vec());
            }
        }
        server.shutdown();
    }
}

#[test]
fn volumes_keep_identity_and_data_across_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (server, addr) = start(dir.path(), "256MiB", "");
    let (mut c, mut qs) = connect(addr, 1);
    let before = c.identify_namespace(1).unwrap();
    let d = pattern(3, 64 * 1024);
    qs[0].write(1, 1000, d.clone(), 4096).unwrap();
    drop(qs);
    drop(c);
    server.shutdown();
    let (server, addr) = start(dir.path(), "256MiB", "");
    let (mut c, mut qs) = connect(addr, 1);
    let after = c.identify_namespace(1).unwrap();
    assert_eq!(before.nguid, after.nguid);
    assert_eq!(after.nuse, 16);
    assert_eq!(qs[0].read(1, 1000, 16, 4096).unwrap(), d);
    server.shutdown();
}
