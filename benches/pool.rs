//! Volume-layer benchmarks (issue 4), every figure a ratio against a baseline
//! measured in the same run:
//!
//! 1. allocator cost: QD1 4 KiB first writes (each maps a new extent) against
//!    overwrites of the same blocks;
//! 2. GC admission: 4 KiB random-read P99 with GC idle, then while GC scrubs a
//!    large backlog with admission control, then without it;
//! 3. dual-path scheduling: 4 KiB random-read P99 alone and beside a 1 MiB
//!    sequential write stream, with dual-path on and off;
//! 4. steady state: 4 KiB random read/write IOPS on a volume at 50 % and 90 %
//!    pool fill, against a plain file namespace of the same size.
//!
//! Run with `cargo bench --bench pool` (or `bench/run-pool-bench.sh`, which
//! appends the table to bench/RESULTS.md). `KVT_BENCH_SECS` sets the seconds per
//! measurement (default 5), `KVT_BENCH_DIR` where the pool files go (default
//! /var/tmp; use a real disk, not tmpfs).

use kvtarget::config::Config;
use kvtarget::initiator::{HostController, HostOptions, IoQueue};
use kvtarget::perf::{PerfOptions, PerfReport, Workload};
use kvtarget::server::Server;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const NQN: &str = "nqn.2026-11.io.kvtarget:poolbench";
const MIB: u64 = 1 << 20;

struct Bench {
    secs: u64,
    dir: std::path::PathBuf,
    rows: Vec<String>,
}

fn config(dir: &std::path::Path, dual: bool, admission: bool) -> String {
    format!(
        r#"
[reactors]
count = 1
idle = "adaptive"

[[listeners]]
address = "127.0.0.1"
port = 0

[[pools]]
name = "main"
backend = "uring"
path = "{d}/main-pool.img"
size = "6GiB"
extent_size = "1MiB"

[pools.gc]
admission = {admission}

[pools.dual_path]
enabled = {dual}

[[pools.volumes]]
name = "fg"
size = "1GiB"

[[pools.volumes]]
name = "bulk"
size = "4GiB"

[[pools]]
name = "fill"
backend = "uring"
path = "{d}/fill-pool.img"
size = "2GiB"
extent_size = "1MiB"

[[pools.volumes]]
name = "half"
size = "1000MiB"

[[pools.volumes]]
name = "more"
size = "780MiB"

[[subsystems]]
nqn = "{NQN}"
allow_any_host = true

[[subsystems.namespaces]]
nsid = 1
volume = "main/fg"

[[subsystems.namespaces]]
nsid = 2
volume = "main/bulk"

[[subsystems.namespaces]]
nsid = 3
volume = "fill/half"

[[subsystems.namespaces]]
nsid = 4
volume = "fill/more"

[[subsystems.namespaces]]
nsid = 9
backend = "uring"
path = "{d}/raw.img"
size = "1000MiB"
"#,
        d = dir.display()
    )
}

fn start(b: &Bench, dual: bool, admission: bool) -> (Server, SocketAddr) {
    let cfg = Config::parse(&config(&b.dir, dual, admission)).expect("bench config");
    let s = Server::start(&cfg).expect("start");
    let a = s.listen_addrs()[0].0;
    (s, a)
}

fn queue(addr: SocketAddr) -> (HostController, IoQueue) {
    let mut c = HostController::connect(&HostOptions::new(addr, NQN)).expect("connect");
    c.set_queue_count(1).expect("queues");
    let q = c.io_queue(1).expect("io queue");
    (c, q)
}

/// Writes `bytes` from offset 0 in 1 MiB commands, 8 in flight.
fn fill(addr: SocketAddr, nsid: u32, bytes: u64) {
    let (_c, mut q) = queue(addr);
    let chunk = vec![0x5Au8; MIB as usize];
    let mut inflight = Vec::new();
    for i in 0..bytes / MIB {
        if inflight.len() == 8 {
            let cid = inflight.remove(0);
            q.q.wait_for(cid).expect("fill").ok().expect("fill status");
        }
        inflight.push(
            q.submit_write(nsid, i * 256, chunk.clone(), 4096, false)
                .expect("submit"),
        );
    }
    for cid in inflight {
        q.q.wait_for(cid).expect("fill").ok().expect("fill status");
    }
    q.flush(nsid).expect("flush");
}

fn perf(b: &Bench, addr: SocketAddr, nsid: u32, w: Workload, bs: usize, qd: usize) -> PerfReport {
    kvtarget::perf::run(&PerfOptions {
        nsid,
        workload: w,
        block_size: bs,
        qd,
        runtime: Duration::from_secs(b.secs),
        // The target shares this machine's two cores with the load generator.
        busy_poll: false,
        ..PerfOptions::new(addr, NQN)
    })
    .expect("perf")
}

/// Runs a measurement three times and keeps the run with the median P99: this
/// machine's virtual disk has multi-second hiccups that one run cannot tell
/// from an effect.
fn perf3(b: &Bench, addr: SocketAddr, nsid: u32, w: Workload, bs: usize, qd: usize) -> PerfReport {
    let mut runs: Vec<PerfReport> = (0..3).map(|_| perf(b, addr, nsid, w, bs, qd)).collect();
    runs.sort_by(|a, b| a.p99_us.total_cmp(&b.p99_us));
    runs.swap_remove(1)
}

/// Ns per extent mapping on the lock-free path (pin_or_map with a clean extent
/// from the per-reactor cache, the metadata thread reserving in batches) against
/// pinning an already mapped extent, on a RAM pool, in-process.
fn allocator_micro() -> (f64, f64, u64) {
    use kvtarget::bdev::ram::RamDevice;
    use kvtarget::pool::{format, FormatOptions, Pool, PoolOptions};
    let dev: kvtarget::bdev::SharedDevice = RamDevice::new("micro", 40 << 30).expect("ram");
    format(
        &dev,
        &FormatOptions {
            extent_size: 1 << 20,
            ..FormatOptions::default()
        },
    )
    .expect("format");
    let pool = Pool::open("micro", dev, PoolOptions::default()).expect("open");
    let vol = pool.create_volume("v", 32 << 30, 4096, 0).expect("volume");
    let n = 20_000u32;
    let mut waits = 0u64;
    let t = Instant::now();
    for l in 0..n {
        loop {
            match vol.pin_or_map(l, || pool.take_extent(0), |c| pool.return_extent(0, c)) {
                Ok(_) => break,
                Err(_) => {
                    waits += 1;
                    std::thread::yield_now();
                }
            }
        }
        vol.unpin(l);
    }
    let map_ns = t.elapsed().as_nanos() as f64 / n as f64;
    let t = Instant::now();
    for l in 0..n {
        vol.pin(l);
        vol.unpin(l);
    }
    let pin_ns = t.elapsed().as_nanos() as f64 / n as f64;
    drop(vol);
    let _ = pool.close();
    (map_ns, pin_ns, waits)
}

impl Bench {
    fn row(&mut self, r: String) {
        println!("{r}");
        self.rows.push(r);
    }

    fn allocator(&mut self, addr: SocketAddr) {
        let (_c, mut q) = queue(addr);
        let n = 400u64;
        let block = vec![1u8; 4096];
        let mut first = Vec::new();
        let mut again = Vec::new();
        // nsid 2 ("bulk") is untouched here: every write maps a new extent.
        for pass in 0..2 {
            for e in 0..n {
                let t = Instant::now();
                q.write(2, (2048 + e) * 256, block.clone(), 4096)
                    .expect("write");
                let us = t.elapsed().as_secs_f64() * 1e6;
                if pass == 0 {
                    first.push(us)
                } else {
                    again.push(us)
                }
            }
        }
        let med = |v: &mut Vec<f64>| {
            v.sort_by(|a, b| a.total_cmp(b));
            v[v.len() / 2]
        };
        let mean = |v: &Vec<f64>| v.iter().sum::<f64>() / v.len() as f64;
        let (mf, ma) = (mean(&first), mean(&again));
        let (pf, pa) = (med(&mut first), med(&mut again));
        self.row(format!(
            "| allocator: QD1 4 KiB first write (maps an extent) vs overwrite | first {mf:.1} us mean / {pf:.1} p50 | overwrite {ma:.1} us mean / {pa:.1} p50 | cost {:.1} us per first write, ratio {:.2} |",
            mf - ma,
            mf / ma
        ));
        q.deallocate(2, &[((2048) * 256, (n * 256) as u32)])
            .expect("free");
        let (map_ns, pin_ns, waits) = allocator_micro();
        self.row(format!(
            "| allocator in-process: map a new extent (cache + batch reservations) vs pin a mapped one, RAM pool | map {map_ns:.0} ns/extent ({waits} waits for a batch) | pin {pin_ns:.0} ns | ratio {:.1} |",
            map_ns / pin_ns
        ));
    }

    /// GC's effect on foreground P99, measured ABAB: a large backlog is created
    /// once, then windows with GC paused and GC running alternate three times on
    /// the same disk state, and the medians are compared.
    fn gc(&mut self, addr: SocketAddr, server: &Server, label: &str) {
        let pool = server.pools()[0].clone();
        let wait_idle = || {
            let t = Instant::now();
            while pool.snapshot().dirty > 0 && t.elapsed() < Duration::from_secs(120) {
                std::thread::sleep(Duration::from_millis(100));
            }
        };
        wait_idle();
        // A large backlog: 2 GiB written then freed at once, GC held back.
        pool.set_gc_paused(true);
        fill(addr, 2, 2048 * MIB);
        let (_c, mut q) = queue(addr);
        q.deallocate(2, &[(0, (2048 * 256) as u32)]).expect("free");
        perf(self, addr, 1, Workload::RandRead, 4096, 16);
        let backlog = pool.snapshot().dirty;
        let (mut idle, mut busy, mut scrubbed, mut modes) = (Vec::new(), Vec::new(), 0, Vec::new());
        for _ in 0..3 {
            pool.set_gc_paused(true);
            idle.push(perf(self, addr, 1, Workload::RandRead, 4096, 16));
            pool.set_gc_paused(false);
            let before = pool.snapshot();
            busy.push(perf(self, addr, 1, Workload::RandRead, 4096, 16));
            let after = pool.snapshot();
            scrubbed += after.gc_scrubbed - before.gc_scrubbed;
            modes.push(after.gc_mode.name());
        }
        pool.set_gc_paused(false);
        let med = |v: &mut Vec<PerfReport>| {
            v.sort_by(|a, b| a.p99_us.total_cmp(&b.p99_us));
            v.swap_remove(1)
        };
        let worst = busy.iter().map(|r| r.p99_us).fold(0.0, f64::max);
        let (i, b) = (med(&mut idle), med(&mut busy));
        self.row(format!(
            "| GC {label}: 4 KiB randread QD16 P99, GC paused vs scrubbing a {backlog}-extent backlog (3 alternating windows each, medians) | paused {:.0} us ({:.0} IOPS) | scrubbing {:.0} us ({:.0} IOPS), worst window {worst:.0} us; {scrubbed} extents scrubbed in the windows, mode {} | P99 ratio {:.2} (worst window {:.2}) |",
            i.p99_us,
            i.iops,
            b.p99_us,
            b.iops,
            modes.join("/"),
            b.p99_us / i.p99_us,
            worst / i.p99_us
        ));
        wait_idle();
    }

    fn dual(&mut self, addr: SocketAddr, label: &str) {
        let alone = perf3(self, addr, 1, Workload::RandRead, 4096, 8);
        let secs = self.secs;
        let stream = std::thread::spawn(move || {
            kvtarget::perf::run(&PerfOptions {
                hostnqn: Some(
                    "nqn.2014-08.org.nvmexpress:uuid:6b767461-7267-6574-0000-0000000000bb".into(),
                ),
                nsid: 2,
                workload: Workload::Write,
                block_size: 1 << 20,
                qd: 4,
                runtime: Duration::from_secs(3 * (secs + 1) + 2),
                warmup: Duration::from_secs(0),
                busy_poll: false,
                ..PerfOptions::new(addr, NQN)
            })
        });
        std::thread::sleep(Duration::from_millis(500));
        let mixed = perf3(self, addr, 1, Workload::RandRead, 4096, 8);
        let s = stream.join().expect("stream").expect("stream perf");
        self.row(format!(
            "| dual-path {label}: 4 KiB randread QD8 P99 alone vs beside 1 MiB seq writes QD4 | alone {:.0} us | beside {:.0} us (stream {:.0} MiB/s) | P99 ratio {:.2} |",
            alone.p99_us,
            mixed.p99_us,
            s.mib_s,
            mixed.p99_us / alone.p99_us
        ));
    }

    fn fill_levels(&mut self, addr: SocketAddr) {
        fill(addr, 9, 1000 * MIB);
        fill(addr, 3, 1000 * MIB);
        perf(self, addr, 9, Workload::RandRead, 4096, 32);
        for (label, extra) in [("50 %", false), ("90 %", true)] {
            if extra {
                fill(addr, 4, 780 * MIB);
                perf(self, addr, 4, Workload::RandRead, 4096, 32);
            }
            for (w, name) in [
                (Workload::RandRead, "randread"),
                (Workload::RandWrite, "randwrite"),
            ] {
                let raw = perf3(self, addr, 9, w, 4096, 32);
                let vol = perf3(self, addr, 3, w, 4096, 32);
                self.row(format!(
                    "| steady state at {label} pool fill: 4 KiB {name} QD32, volume vs plain file namespace | volume {:.0} IOPS, P99 {:.0} us | file {:.0} IOPS, P99 {:.0} us | IOPS ratio {:.2} |",
                    vol.iops, vol.p99_us, raw.iops, raw.p99_us, vol.iops / raw.iops
                ));
            }
        }
    }
}

fn main() {
    // `cargo bench` passes --bench. `cargo test --all-targets` runs this binary
    // without it: the benchmark needs minutes and gigabytes, so it only builds.
    if !std::env::args().any(|a| a == "--bench") {
        println!("pool benchmark: run it with `cargo bench --bench pool`");
        return;
    }
    let secs = std::env::var("KVT_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let base = std::env::var("KVT_BENCH_DIR").unwrap_or_else(|_| "/var/tmp".into());
    let dir = tempfile::Builder::new()
        .prefix("kvtarget-poolbench")
        .tempdir_in(&base)
        .expect("bench dir");
    let mut b = Bench {
        secs,
        dir: dir.path().to_path_buf(),
        rows: Vec::new(),
    };
    // The bench's own threads stay off the reactor's core.
    if let Some(c) = core_affinity::get_core_ids().and_then(|c| c.get(1).copied()) {
        core_affinity::set_for_current(c);
    }
    // KVT_BENCH_ONLY=gc,dual,alloc,fill runs a subset.
    let only = std::env::var("KVT_BENCH_ONLY").unwrap_or_default();
    let want = |p: &str| only.is_empty() || only.split(',').any(|x| x == p);
    let (server, addr) = start(&b, true, true);
    fill(addr, 1, 1024 * MIB);
    // Let the host's disk settle after the fill before anything is measured.
    perf(&b, addr, 1, Workload::RandRead, 4096, 16);
    if want("alloc") {
        b.allocator(addr);
    }
    if want("gc") {
        b.gc(addr, &server, "with admission control");
    }
    if want("dual") {
        b.dual(addr, "on");
    }
    if want("fill") {
        b.fill_levels(addr);
    }
    server.shutdown();
    if want("gc") || want("dual") {
        let (server, addr) = start(&b, false, false);
        if want("gc") {
            b.gc(addr, &server, "without admission control");
        }
        if want("dual") {
            b.dual(addr, "off");
        }
        server.shutdown();
    }
    println!("\nrows:");
    for r in &b.rows {
        println!("{r}");
    }
}
