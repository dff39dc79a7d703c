//! `kvtarget perf`: a load generator in the spirit of `spdk_nvme_perf`. The in-repo
//! initiator connects the controller and its queues; then one worker thread per
//! CPU (pinned with `cpus`) drives its share of the queues without blocking, each
//! keeping `qd` commands in flight. Latency is measured from submit to completion
//! into log-linear (HDR-style) histograms with better than 2 % resolution.

pub mod echo;
mod error;
mod queue;

pub use error::PerfError;

pub use queue::{check_pattern, fill_pattern};

use crate::initiator::{HostController, HostOptions};
use kvt_wire::nvme::{list_entry_len, KV_KEY_MAX_LEN, KV_LIST_MIN_BUFFER};
use kvt_wire::tcp::Digests;
use queue::{Layout, LiveCounters, PerfQueue, Popularity, QueuePlan};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Latency histogram: log2 major buckets with 64 linear sub-buckets each (better
/// than 2 % resolution), over nanoseconds. Fixed size, no allocation per sample.
#[derive(Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    sum_ns: u128,
    max_ns: u64,
}

const SUB: usize = 64;
const MAJORS: usize = 40;

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; SUB * MAJORS],
            total: 0,
            sum_ns: 0,
            max_ns: 0,
        }
    }
}

impl Histogram {
    fn index(ns: u64) -> usize {
        if ns < SUB as u64 {
            return ns as usize;
        }
        let major = 63 - ns.leading_zeros() as usize; // >= 6
        let shift = major - 6;
        let sub = ((ns >> shift) as usize) - SUB;
        ((major - 5) * SUB + sub).min(SUB * MAJORS - 1)
    }

    /// The upper bound (ns) of bucket `i`.
    fn bound(i: usize) -> u64 {
        if i < SUB {
            return i as u64;
        }
        let major = i / SUB + 5;
        let sub = (i % SUB) as u64;
        let shift = major - 6;
        ((SUB as u64 + sub + 1) << shift) - 1
    }

    pub fn record(&mut self, ns: u64) {
        self.counts[Self::index(ns)] += 1;
        self.total += 1;
        self.sum_ns += ns as u128;
        self.max_ns = self.max_ns.max(ns);
    }

    pub fn merge(&mut self, o: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            *a += b;
        }
        self.total += o.total;
        self.sum_ns += o.sum_ns;
        self.max_ns = self.max_ns.max(o.max_ns);
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    pub fn mean_ns(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.sum_ns as f64 / self.total as f64
        }
    }

    /// The value at quantile `q` (0..=1), as the upper bound of its bucket.
    pub fn quantile_ns(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::bound(i).min(self.max_ns);
            }
        }
        self.max_ns
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    RandRead,
    RandWrite,
    RandRw,
    Read,
    Write,
    /// LMCache's raw-block store phase: each I/O stores one chunk of `--bs`
    /// bytes in the next slot (a 4 KiB header block, then the payload), slots
    /// reused in order once all are written (LMCache overwrites evicted slots).
    LmcacheStore,
    /// LMCache's retrieve phase: each I/O reads one chunk's payload from a
    /// random slot.
    LmcacheRetrieve,
    /// KV List of every key (`kv` only): one queue pages through the
    /// namespace from the empty start key, `block_size`-byte host buffers,
    /// until a List returns no key it has not seen or `runtime` runs out.
    List,
    /// KV Exist of random keys (`kv` only), stored first: the "which of these
    /// keys do you have?" a KV-cache manager asks before a prefill. A key
    /// that is not there counts as a miss.
    Exist,
}

/// LMCache's raw-block storage plugin: its metadata region before the first
/// slot, and the header block at the start of each slot.
pub const LMCACHE_METADATA_BYTES: u64 = 128 << 20;
pub const LMCACHE_HEADER_BYTES: usize = 4096;

impl Workload {
    /// The plain workload an LMCache phase issues, and where its I/Os lie.
    fn layout(self, metadata: u64) -> (Workload, Layout) {
        let slots = Layout::LmcacheSlots {
            metadata,
            header: LMCACHE_HEADER_BYTES,
        };
        match self {
            Workload::LmcacheStore => (Workload::Write, slots),
            Workload::LmcacheRetrieve => (Workload::RandRead, slots),
            w => (w, Layout::Blocks),
        }
    }
}

impl std::str::FromStr for Workload {
    type Err = PerfError;
    fn from_str(s: &str) -> Result<Self, PerfError> {
        Ok(match s {
            "randread" => Workload::RandRead,
            "randwrite" => Workload::RandWrite,
            "randrw" => Workload::RandRw,
            "read" => Workload::Read,
            "write" => Workload::Write,
            "lmcache-store" => Workload::LmcacheStore,
            "lmcache-retrieve" => Workload::LmcacheRetrieve,
            "list" => Workload::List,
            "exist" => Workload::Exist,
            _ => return Err(PerfError::Workload(s.into())),
        })
    }
}

#[derive(Debug, Clone)]
pub struct PerfOptions {
    pub addr: SocketAddr,
    pub nqn: String,
    pub hostnqn: Option<String>,
    pub nsid: u32,
    pub workload: Workload,
    /// Percentage of reads for randrw.
    pub read_pct: u32,
    /// Percentage of writes issued as deallocates of the same range instead.
    pub deallocate_pct: u32,
    pub block_size: usize,
    /// Commands outstanding per queue.
    pub qd: usize,
    /// I/O queues (one TCP connection each) per controller, spread over the
    /// worker threads.
    pub queues: u16,
    /// Controllers (hosts) connected, each with `queues` I/O queues.
    pub controllers: u16,
    pub runtime: Duration,
    pub warmup: Duration,
    pub digests: Digests,
    /// CPUs to run on: one worker thread pinned to each. Empty: one unpinned
    /// worker thread.
    pub cpus: Vec<usize>,
    /// Check every read against what this run wrote (read-only workloads write
    /// their range first).
    pub verify: bool,
    /// The LMCache phases' metadata region before the first slot (LMCache's
    /// storage plugin uses 128 MiB, its multi-process L2 adapter 256 MiB).
    pub lmcache_metadata: u64,
    /// Spin on the sockets (like spdk_nvme_perf) instead of sleeping in poll(2)
    /// when nothing has arrived.
    pub busy_poll: bool,
    /// A progress line on stderr every second.
    pub progress: bool,
    /// KV commands on a KV namespace instead of block I/O: a write is a Store
    /// of one `block_size` value, a read a Retrieve, a deallocate a Delete.
    pub kv: bool,
    /// The keys a KV run addresses (none: as many values as the namespace's
    /// capacity holds). More than that is eviction pressure: Stores evict and
    /// Retrieves of evicted keys miss.
    pub kv_keys: Option<u64>,
    /// Random I/Os pick slots (keys) by Zipf popularity with this exponent;
    /// 0 is uniform.
    pub zipf: f64,
    /// Connect every queue, then issue nothing until `runtime` ends (what
    /// idle connections cost; `connect_s` still says how long connecting took).
    pub idle: bool,
}

impl PerfOptions {
    /// The defaults `kvtarget perf` uses: 4 KiB randread, QD32, one queue, 10 s
    /// after 1 s of warm-up, busy-polling, no verification.
    pub fn new(addr: SocketAddr, nqn: &str) -> PerfOptions {
        PerfOptions {
            addr,
            nqn: nqn.to_string(),
            hostnqn: None,
            nsid: 1,
            workload: Workload::RandRead,
            read_pct: 70,
            deallocate_pct: 0,
            block_size: 4096,
            qd: 32,
            queues: 1,
            controllers: 1,
            runtime: Duration::from_secs(10),
            warmup: Duration::from_secs(1),
            digests: Digests::default(),
            cpus: Vec::new(),
            verify: false,
            lmcache_metadata: LMCACHE_METADATA_BYTES,
            busy_poll: true,
            progress: false,
            kv: false,
            kv_keys: None,
            zipf: 0.0,
            idle: false,
        }
    }
}

#[derive(Debug, Clone)]
pub struct PerfReport {
    pub ios: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub iops: f64,
    pub mib_s: f64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub p9999_us: f64,
    pub max_us: f64,
    pub errors: u64,
    /// CPU time this process used per I/O, in microseconds.
    pub cpu_us_per_io: f64,
    /// Reads whose data was checked (with `verify`), and how many did not match.
    pub verified: u64,
    pub mismatches: u64,
    /// The first mismatches, described.
    pub mismatch_details: Vec<String>,
    /// The first failed commands with the status each got.
    pub error_details: Vec<String>,
    /// KV runs: the keys addressed, and the measured Retrieves (and Deletes)
    /// that found no key (not in `ios` or the latencies).
    pub kv_keys: Option<u64>,
    pub misses: u64,
    /// Seconds from the first connect until every controller and queue was
    /// connected (before any prefill).
    pub connect_s: f64,
    /// `Workload::List`: the keys listed, and whether the last List found
    /// no new key (false: `runtime` ran out first).
    pub listed: Option<(u64, bool)>,
}

impl PerfReport {
    pub fn to_json(&self) -> String {
        format!(
            "{{\"ios\":{},\"bytes\":{},\"seconds\":{:.3},\"iops\":{:.1},\"mib_s\":{:.2},\"lat_us\":{{\"mean\":{:.2},\"p50\":{:.2},\"p90\":{:.2},\"p99\":{:.2},\"p99_9\":{:.2},\"p99_99\":{:.2},\"max\":{:.2}}},\"errors\":{},\"cpu_us_per_io\":{:.3},\"verified\":{},\"mismatches\":{}",
            self.ios, self.bytes, self.seconds, self.iops, self.mib_s, self.mean_us, self.p50_us,
            self.p90_us, self.p99_us, self.p999_us, self.p9999_us, self.max_us, self.errors,
            self.cpu_us_per_io, self.verified, self.mismatches
        ) + &format!(",\"connect_s\":{:.6}", self.connect_s)
            + &match self.listed {
                Some((n, done)) => format!(",\"list\":{{\"keys\":{n},\"complete\":{done}}}"),
                None => String::new(),
            }
            + &match self.kv_keys {
            // Appended inside the object: `…,"kv":{…}}`.
            Some(k) => format!(",\"kv\":{{\"keys\":{k},\"misses\":{}}}}}", self.misses),
            None => "}".into(),
        }
    }

    pub fn to_text(&self) -> String {
        let mut t = format!(
            "IOPS {:.0}  {:.1} MiB/s  lat us: avg {:.1} p50 {:.1} p90 {:.1} p99 {:.1} p99.9 {:.1} p99.99 {:.1} max {:.1}  errors {}  cpu {:.2} us/IO",
            self.iops, self.mib_s, self.mean_us, self.p50_us, self.p90_us, self.p99_us, self.p999_us, self.p9999_us, self.max_us, self.errors, self.cpu_us_per_io
        );
        if self.verified > 0 || self.mismatches > 0 {
            t += &format!(
                "  verified {} reads, {} mismatches",
                self.verified, self.mismatches
            );
        }
        if let Some(k) = self.kv_keys {
            t += &format!("  keys {k}, misses {}", self.misses);
        }
        if let Some((n, done)) = self.listed {
            let how = if done { "all" } else { "time ran out" };
            t += &format!("  listed {n} keys ({how})");
        }
        if self.connect_s > 0.0 {
            t += &format!("  connected in {:.3} s", self.connect_s);
        }
        for d in &self.mismatch_details {
            t += &format!("\n  mismatch: {d}");
        }
        for d in &self.error_details {
            t += &format!("\n  error: {d}");
        }
        t
    }
}

fn cpu_time() -> Duration {
    // SAFETY: getrusage writes into a zeroed rusage we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to ru for the duration of the call.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// What one worker thread hands back.
struct WorkerResult {
    /// When its last queue was connected.
    connected_at: Instant,
    hist: Histogram,
    errors: u64,
    misses: u64,
    verified: u64,
    mismatches: u64,
    details: Vec<String>,
    failures: Vec<String>,
}

/// Largest range (in I/Os) one queue verifies: the stamp table stays small and a
/// read-only verified run writes the range first.
const VERIFY_MAX_IOS_PER_QUEUE: u64 = 1 << 16;

/// Runs the workload and returns the report. Errors name what failed.
pub fn run(o: &PerfOptions) -> Result<PerfReport, PerfError> {
    check_options(o)?;
    let connect_start = Instant::now();
    let mut ctrls = Vec::with_capacity(o.controllers as usize);
    let mut sizing = (0, 0);
    for _ in 0..o.controllers {
        let (c, entries, max_transfer) = connect_controller(o)?;
        ctrls.push(c);
        sizing = (entries, max_transfer);
    }
    if o.workload == Workload::List {
        return list_all(o, &ctrls[0], connect_start);
    }
    if !(0.0..=10.0).contains(&o.zipf) {
        return Err(PerfError::Zipf(o.zipf));
    }
    let all_queues = o.queues as u64 * o.controllers as u64;
    let ctrl = &mut ctrls[0];
    let (workload, layout, lba, total) = if o.kv {
        kv_layout(o, ctrl, all_queues)?
    } else {
        block_layout(o, ctrl, all_queues)?
    };
    let shape = RunShape {
        workload,
        layout,
        lba,
        total,
        all_queues,
        entries: sizing.0,
        max_transfer: sizing.1,
    };
    let plans = queue_plans(o, &shape)?;
    // A read-only run reads what was written first: verified runs check it, and a
    // KV Retrieve of a key never stored is a miss.
    let needs_prefill = (o.verify || o.kv)
        && matches!(
            workload,
            Workload::RandRead | Workload::Read | Workload::Exist
        );
    let (results, cpu_used) = run_workers(o, &ctrls, &plans, needs_prefill);
    report(o, results, cpu_used, connect_start, total)
}

/// The options' own limits, checked before anything connects.
fn check_options(o: &PerfOptions) -> Result<(), PerfError> {
    if o.qd == 0 || o.qd > u16::MAX as usize {
        return Err(PerfError::QueueDepth);
    }
    if o.queues == 0 {
        return Err(PerfError::Queues);
    }
    if o.controllers == 0 {
        return Err(PerfError::Controllers);
    }
    match o.workload {
        Workload::List if !o.kv => Err(PerfError::NeedsKv("list")),
        Workload::Exist if !o.kv => Err(PerfError::NeedsKv("exist")),
        _ => Ok(()),
    }
}

/// What a run's queues are planned from: the workload as laid out on the
/// namespace, its size in I/Os, and the controllers' limits.
struct RunShape {
    workload: Workload,
    layout: Layout,
    lba: u32,
    /// I/Os (or keys) the namespace holds.
    total: u64,
    /// Queues of the run, over all controllers.
    all_queues: u64,
    /// I/O queue entries each controller gave.
    entries: usize,
    /// Largest transfer of a controller, in bytes.
    max_transfer: usize,
}

/// The block namespace's layout for `o`: (workload, layout, LBA size, I/Os it holds).
fn block_layout(
    o: &PerfOptions,
    ctrl: &mut HostController,
    all_queues: u64,
) -> Result<(Workload, Layout, u32, u64), PerfError> {
    let ns = ctrl
        .identify_namespace(o.nsid)
        .map_err(|source| PerfError::Identify {
            nsid: o.nsid,
            source,
        })?;
    if ns.nsze == 0 {
        return Err(PerfError::InactiveNamespace(o.nsid));
    }
    let lba = 1u32 << ns.lbads;
    if o.block_size == 0 || o.block_size % lba as usize != 0 {
        return Err(PerfError::BlockSize(lba));
    }
    let (workload, layout) = o.workload.layout(o.lmcache_metadata);
    if o.lmcache_metadata % lba as u64 != 0 {
        return Err(PerfError::LmcacheMetadata(lba));
    }
    let bytes = ns.nsze.saturating_mul(lba as u64);
    let total = bytes.saturating_sub(layout.base()) / layout.stride(o.block_size);
    if total < all_queues {
        return Err(PerfError::NamespaceTooSmall);
    }
    Ok((workload, layout, lba, total))
}

/// One plan per queue of the run, each with the controller it belongs to:
/// queue `i` of controller `c` is queue `c * queues + i` of the run.
fn queue_plans(o: &PerfOptions, s: &RunShape) -> Result<Vec<(usize, QueuePlan)>, PerfError> {
    // Verified runs give each queue its own range (two queues writing one block
    // at once have no defined result); others share the whole namespace, with
    // sequential streams starting apart.
    let per_queue = s.total / s.all_queues;
    let counts = |i: u64| {
        if o.verify {
            (per_queue * i, per_queue.min(VERIFY_MAX_IOS_PER_QUEUE))
        } else {
            (0, s.total)
        }
    };
    // Every queue draws from the same range (verified runs: same-sized ones),
    // so one popularity table serves them all.
    let (_, count0) = counts(0);
    if o.zipf > 0.0 && count0 > 1 << 24 {
        return Err(PerfError::ZipfTooLarge(count0));
    }
    let popularity = Popularity::new(count0, o.zipf);
    Ok((0..o.controllers as usize)
        .flat_map(|c| (0..o.queues).map(move |i| (c, i)))
        .map(|(c, i)| {
            let (first, count) = counts(c as u64 * o.queues as u64 + i as u64);
            let plan = QueuePlan {
                qid: i + 1,
                nsid: o.nsid,
                workload: s.workload,
                read_pct: o.read_pct,
                // LMCache never discards: its phases issue no deallocates
                // (KV runs send Deletes).
                deallocate_pct: if matches!(s.layout, Layout::Blocks | Layout::Kv) {
                    o.deallocate_pct
                } else {
                    0
                },
                qd: o.qd,
                io_size: o.block_size,
                lba_size: s.lba,
                max_transfer: s.max_transfer,
                max_commands: s.entries - 1,
                layout: s.layout,
                first,
                count,
                verify: o.verify,
                popularity: popularity.clone(),
            };
            (c, plan)
        })
        .collect())
}

/// What the coordinator and the workers share.
struct RunSignals {
    /// Everyone connects and prefills first; the clock starts when all are ready.
    ready: std::sync::Barrier,
    /// When the clock started (set once all are ready).
    start_at: std::sync::Mutex<Option<Instant>>,
    /// The run is over: drain and stop.
    stop: AtomicBool,
    /// A worker failed: the coordinator stops the run early.
    failed: AtomicBool,
}

/// Runs the workers, one thread each, with the coordinator on this thread.
/// Returns each worker's result and the CPU time the measured part used.
fn run_workers(
    o: &PerfOptions,
    ctrls: &[HostController],
    plans: &[(usize, QueuePlan)],
    needs_prefill: bool,
) -> (Vec<Result<WorkerResult, PerfError>>, Duration) {
    let workers = o.cpus.len().max(1);
    let live: Vec<Arc<LiveCounters>> = (0..workers).map(|_| Arc::default()).collect();
    let sig = RunSignals {
        ready: std::sync::Barrier::new(workers + 1),
        start_at: std::sync::Mutex::new(None),
        stop: AtomicBool::new(false),
        failed: AtomicBool::new(false),
    };
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let my_plans: Vec<(usize, QueuePlan)> = plans
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| i % workers == w)
                    .map(|(_, p)| p.clone())
                    .collect();
                let cpu = o.cpus.get(w).copied();
                let live = live[w].clone();
                let sig = &sig;
                s.spawn(move || {
                    let r = worker(o, ctrls, my_plans, cpu, live, needs_prefill, sig);
                    if r.is_err() {
                        sig.failed.store(true, Ordering::Relaxed);
                    }
                    r
                })
            })
            .collect();
        let cpu_used = coordinate(o, &live, &sig);
        sig.stop.store(true, Ordering::Relaxed);
        let r: Vec<_> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or(Err(PerfError::WorkerPanicked)))
            .collect();
        (r, cpu_used)
    })
}

/// The coordinator: starts the clock once all are ready, reports progress
/// once a second, and returns at the end of the run (or when a worker failed)
/// with the CPU time the measured part used.
fn coordinate(o: &PerfOptions, live: &[Arc<LiveCounters>], sig: &RunSignals) -> Duration {
    sig.ready.wait();
    let begin = Instant::now();
    if let Ok(mut g) = sig.start_at.lock() {
        *g = Some(begin);
    }
    let start = begin + o.warmup;
    let end = start + o.runtime;
    let mut cpu0 = None;
    let mut last = (begin, 0u64, 0u64);
    let tty = o.progress && std::io::IsTerminal::is_terminal(&std::io::stderr());
    loop {
        let now = Instant::now();
        if now >= end || sig.failed.load(Ordering::Relaxed) {
            break;
        }
        if cpu0.is_none() && now >= start {
            cpu0 = Some(cpu_time());
        }
        std::thread::sleep(coordinator_sleep(now, last.0, start, end, cpu0.is_some()));
        let now = Instant::now();
        // The tick advances whether or not it is printed (a stale tick
        // would make this loop spin on a zero sleep beside the workers).
        if tick_due(now, last.0) {
            let ios: u64 = live.iter().map(|l| l.ios.load(Ordering::Relaxed)).sum();
            let bytes: u64 = live.iter().map(|l| l.bytes.load(Ordering::Relaxed)).sum();
            let dt = now.duration_since(last.0).as_secs_f64();
            let phase = if now < start { "warm-up" } else { "run" };
            let line = format!(
                "[{:>5.1}s {phase}] {:>9.0} IOPS {:>9.1} MiB/s",
                now.saturating_duration_since(begin).as_secs_f64(),
                (ios - last.1) as f64 / dt,
                (bytes - last.2) as f64 / dt / (1 << 20) as f64
            );
            if tty {
                eprint!("\r{line}   ");
            } else if o.progress {
                eprintln!("{line}");
            }
            last = (now, ios, bytes);
        }
    }
    if tty {
        eprintln!();
    }
    cpu_time().saturating_sub(cpu0.unwrap_or_default())
}

/// The report of a run from its workers' results (the first failure if one failed).
fn report(
    o: &PerfOptions,
    results: Vec<Result<WorkerResult, PerfError>>,
    cpu_used: Duration,
    connect_start: Instant,
    total: u64,
) -> Result<PerfReport, PerfError> {
    let mut hist = Histogram::default();
    let mut misses = 0;
    let mut errors = 0;
    let (mut verified, mut mismatches, mut details) = (0, 0, Vec::new());
    let mut failures = Vec::new();
    let mut connected_at = connect_start;
    for r in results {
        let w = r?;
        connected_at = connected_at.max(w.connected_at);
        hist.merge(&w.hist);
        errors += w.errors;
        misses += w.misses;
        verified += w.verified;
        mismatches += w.mismatches;
        details.extend(w.details);
        failures.extend(w.failures);
    }
    let secs = o.runtime.as_secs_f64();
    let ios = hist.count();
    let us = |ns: u64| ns as f64 / 1000.0;
    Ok(PerfReport {
        ios,
        bytes: ios * o.block_size as u64,
        seconds: secs,
        iops: ios as f64 / secs,
        mib_s: (ios * o.block_size as u64) as f64 / secs / (1 << 20) as f64,
        mean_us: hist.mean_ns() / 1000.0,
        p50_us: us(hist.quantile_ns(0.50)),
        p90_us: us(hist.quantile_ns(0.90)),
        p99_us: us(hist.quantile_ns(0.99)),
        p999_us: us(hist.quantile_ns(0.999)),
        p9999_us: us(hist.quantile_ns(0.9999)),
        max_us: us(hist.max_ns),
        errors,
        cpu_us_per_io: if ios == 0 {
            0.0
        } else {
            cpu_used.as_secs_f64() * 1e6 / ios as f64
        },
        verified,
        mismatches,
        mismatch_details: details,
        error_details: failures,
        kv_keys: o.kv.then_some(total),
        misses,
        connect_s: connected_at.duration_since(connect_start).as_secs_f64(),
        listed: None,
    })
}

/// Connects one controller for `o` with queues sized for its I/Os and asks
/// for `o.queues` I/O queues. Returns it, its queue entries and its largest
/// transfer.
fn connect_controller(o: &PerfOptions) -> Result<(HostController, usize, usize), PerfError> {
    let mut ho = HostOptions::new(o.addr, &o.nqn);
    if let Some(h) = &o.hostnqn {
        ho.hostnqn = h.clone();
    }
    ho.digests = o.digests;
    let mut ctrl = HostController::connect(&ho).map_err(|source| PerfError::Connect {
        addr: o.addr,
        source,
    })?;
    let cap = ctrl
        .property_get(kvt_wire::nvme::prop::CAP, true)
        .map_err(PerfError::ReadCap)?;
    let mqes = (cap & 0xFFFF) as usize + 1;
    if o.qd + 1 > mqes {
        return Err(PerfError::QueueTooDeep {
            qd: o.qd,
            entries: o.qd + 1,
            mqes,
        });
    }
    // I/Os larger than MDTS go as several commands: room for all of them,
    // as far as the target allows (the rest wait their turn in the queue).
    let max_transfer = ctrl.max_transfer().unwrap_or(usize::MAX);
    let pieces = o.block_size.div_ceil(max_transfer.max(1)).max(1);
    let entries = (o.qd.saturating_mul(pieces) + 1)
        .min(mqes)
        .min(u16::MAX as usize);
    ctrl.opts.queue_size = entries as u16;
    let granted = ctrl
        .set_queue_count(o.queues)
        .map_err(PerfError::SetQueueCount)?;
    if granted < o.queues {
        return Err(PerfError::QueuesGranted {
            granted,
            asked: o.queues,
        });
    }
    Ok((ctrl, entries, max_transfer))
}

/// `Workload::List`: pages through every key of the KV namespace on one
/// queue. The start key of each List is the last key of the one before
/// (Lists return keys from the start key on, so it comes back first and is
/// not counted again).
fn list_all(
    o: &PerfOptions,
    ctrl: &HostController,
    connect_start: Instant,
) -> Result<PerfReport, PerfError> {
    let buf = u32::try_from(o.block_size)
        .ok()
        .filter(|&b| b as usize >= KV_LIST_MIN_BUFFER as usize + list_entry_len(KV_KEY_MAX_LEN))
        .ok_or(PerfError::ListBuffer)?;
    let mut q = ctrl
        .io_queue(1)
        .map_err(|source| PerfError::QueueConnect { qid: 1, source })?;
    let connect_s = connect_start.elapsed().as_secs_f64();
    let cpu0 = cpu_time();
    let begin = Instant::now();
    let end = begin + o.runtime;
    let mut hist = Histogram::default();
    let (mut listed, mut start) = (0u64, None);
    let complete = loop {
        if Instant::now() >= end {
            break false;
        }
        let t = Instant::now();
        let keys = q
            .kv_list(o.nsid, start.unwrap_or_default(), buf)
            .map_err(PerfError::List)?;
        hist.record(t.elapsed().as_nanos() as u64);
        let fresh = keys.iter().filter(|&&k| Some(k) != start).count();
        match keys.last() {
            Some(&last) if fresh > 0 => {
                listed += fresh as u64;
                start = Some(last);
            }
            _ => break true,
        }
    };
    let secs = begin.elapsed().as_secs_f64();
    let ios = hist.count();
    let us = |ns: u64| ns as f64 / 1000.0;
    Ok(PerfReport {
        ios,
        bytes: ios * buf as u64,
        seconds: secs,
        iops: ios as f64 / secs.max(1e-9),
        mib_s: (ios * buf as u64) as f64 / secs.max(1e-9) / (1 << 20) as f64,
        mean_us: hist.mean_ns() / 1000.0,
        p50_us: us(hist.quantile_ns(0.50)),
        p90_us: us(hist.quantile_ns(0.90)),
        p99_us: us(hist.quantile_ns(0.99)),
        p999_us: us(hist.quantile_ns(0.999)),
        p9999_us: us(hist.quantile_ns(0.9999)),
        max_us: us(hist.max_ns),
        errors: 0,
        cpu_us_per_io: cpu_time().saturating_sub(cpu0).as_secs_f64() * 1e6 / ios.max(1) as f64,
        verified: 0,
        mismatches: 0,
        mismatch_details: Vec::new(),
        error_details: Vec::new(),
        kv_keys: None,
        misses: 0,
        connect_s,
        listed: Some((listed, complete)),
    })
}

/// A KV run's workload, layout, "block" (one byte: values need not be
/// whole blocks) and key count, from the KV Identify Namespace.
fn kv_layout(
    o: &PerfOptions,
    ctrl: &mut HostController,
    all_queues: u64,
) -> Result<(Workload, Layout, u32, u64), PerfError> {
    match o.workload {
        Workload::LmcacheStore => return Err(PerfError::KvWorkload("lmcache-store")),
        Workload::LmcacheRetrieve => return Err(PerfError::KvWorkload("lmcache-retrieve")),
        _ => {}
    }
    let ns = ctrl
        .identify_kv_namespace(o.nsid)
        .map_err(|source| PerfError::Identify {
            nsid: o.nsid,
            source,
        })?;
    let Some(f) = ns.kvf.first() else {
        return Err(PerfError::NotKvNamespace(o.nsid));
    };
    if ns.nsze == 0 {
        return Err(PerfError::InactiveNamespace(o.nsid));
    }
    if f.vml == 0 {
        return Err(PerfError::NotKvNamespace(o.nsid));
    }
    if o.block_size == 0 || o.block_size > f.vml as usize {
        return Err(PerfError::KvValueTooLarge {
            value: o.block_size,
            vml: f.vml,
        });
    }
    // A value takes whole 4 KiB blocks of the namespace's bytes.
    let fits = ns.nsze / (o.block_size.div_ceil(4096) as u64 * 4096);
    let keys = o.kv_keys.unwrap_or(fits);
    if keys < all_queues {
        return Err(PerfError::KvKeys);
    }
    Ok((o.workload, Layout::Kv, 1, keys))
}

/// How long the coordinator sleeps: until the next progress tick (a second after
/// the last one), the end of the warm-up (to read the CPU clock) or the end.
fn coordinator_sleep(
    now: Instant,
    tick: Instant,
    start: Instant,
    end: Instant,
    started: bool,
) -> Duration {
    let mut wake = (tick + Duration::from_secs(1)).min(end);
    if !started {
        wake = wake.min(start);
    }
    wake.saturating_duration_since(now)
}

/// A progress tick is due (with slack for sleeping a little short).
fn tick_due(now: Instant, tick: Instant) -> bool {
    now >= tick + Duration::from_millis(990)
}

/// One worker thread: connects its queues, optionally prefills them, waits for
/// the start, then drives them until told to stop and drains what is in flight.
fn worker(
    o: &PerfOptions,
    ctrls: &[HostController],
    plans: Vec<(usize, QueuePlan)>,
    cpu: Option<usize>,
    live: Arc<LiveCounters>,
    prefill: bool,
    sig: &RunSignals,
) -> Result<WorkerResult, PerfError> {
    if let Some(c) = cpu {
        if !core_affinity::set_for_current(core_affinity::CoreId { id: c }) {
            sig.ready.wait();
            return Err(PerfError::Cpu(c));
        }
    }
    let setup = worker_setup(ctrls, plans, live, prefill);
    sig.ready.wait();
    let (mut qs, connected_at) = setup?;
    let begin = loop {
        if let Some(b) = sig.start_at.lock().ok().and_then(|g| *g) {
            break b;
        }
        std::thread::yield_now();
    };
    let start = begin + o.warmup;
    let end = start + o.runtime;
    for q in qs.iter_mut() {
        q.set_window(start, end);
    }
    while o.idle && !sig.stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(5));
    }
    drive(o, &mut qs, &sig.stop, end + Duration::from_secs(30))?;
    Ok(worker_result(&qs, connected_at))
}

/// Connects a worker's queues and, if asked, prefills them. Returns them and
/// when the last was connected.
fn worker_setup(
    ctrls: &[HostController],
    plans: Vec<(usize, QueuePlan)>,
    live: Arc<LiveCounters>,
    prefill: bool,
) -> Result<(Vec<PerfQueue>, Instant), PerfError> {
    // The clock is not running yet: far-future bounds record nothing.
    let far = Instant::now() + Duration::from_secs(365 * 86400);
    let mut qs = Vec::new();
    for (c, p) in plans {
        let qid = p.qid;
        let parts = ctrls[c]
            .io_queue(qid)
            .and_then(|q| q.q.into_parts())
            .map_err(|source| PerfError::QueueConnect { qid, source })?;
        let q = PerfQueue::new(parts, p, live.clone(), far, far)?;
        qs.push(q);
    }
    let connected_at = Instant::now();
    if prefill {
        for q in qs.iter_mut() {
            prefill_queue(q)?;
        }
    }
    Ok((qs, connected_at))
}

/// Writes (stores) what a read-only run of `q` will read.
fn prefill_queue(q: &mut PerfQueue) -> Result<(), PerfError> {
    let mut cursor = 0;
    // Ten million keys take long to store: 1 ms more per I/O.
    let limit = Duration::from_secs(600) + Duration::from_millis(q.range_len());
    let deadline = Instant::now() + limit;
    while !q
        .prefill_step(&mut cursor, Instant::now())
        .map_err(PerfError::PrefillSend)?
    {
        q.poll().map_err(|e| PerfError::Prefill(Box::new(e)))?;
        if Instant::now() > deadline {
            return Err(PerfError::PrefillTimeout(limit.as_secs()));
        }
    }
    if q.unmeasured_errors > 0 {
        return Err(PerfError::PrefillFailed);
    }
    Ok(())
}

/// Drives the queues until told to stop, then drains what is in flight
/// (failing if it is not drained by `drain_deadline`).
fn drive(
    o: &PerfOptions,
    qs: &mut [PerfQueue],
    stop: &AtomicBool,
    drain_deadline: Instant,
) -> Result<(), PerfError> {
    loop {
        let stopping = stop.load(Ordering::Relaxed);
        let now = Instant::now();
        let mut progress = 0;
        let mut outstanding = 0;
        for q in qs.iter_mut() {
            progress += q.submit(now, stopping).map_err(PerfError::Send)?;
            progress += q.poll()?;
            outstanding += q.outstanding();
        }
        if stopping && outstanding == 0 {
            return Ok(());
        }
        if stopping && now > drain_deadline {
            return Err(PerfError::Outstanding(outstanding));
        }
        if progress == 0 && !o.busy_poll {
            wait_for_sockets(qs);
        }
    }
}

/// Sleeps up to 1 ms until a queue's socket can be read (or written, if it
/// has bytes to send).
fn wait_for_sockets(qs: &[PerfQueue]) {
    let mut fds: Vec<libc::pollfd> = qs
        .iter()
        .map(|q| libc::pollfd {
            fd: q.fd(),
            events: libc::POLLIN | if q.wants_write() { libc::POLLOUT } else { 0 },
            revents: 0,
        })
        .collect();
    // SAFETY: fds is a valid array of pollfd for the duration of the call.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 1) };
}

/// A worker's result: its queues' counts merged.
fn worker_result(qs: &[PerfQueue], connected_at: Instant) -> WorkerResult {
    let mut r = WorkerResult {
        connected_at,
        hist: Histogram::default(),
        errors: 0,
        misses: 0,
        verified: 0,
        mismatches: 0,
        details: Vec::new(),
        failures: Vec::new(),
    };
    for q in qs {
        r.hist.merge(&q.hist);
        r.errors += q.errors;
        r.misses += q.misses;
        r.verified += q.verified;
        r.mismatches += q.mismatch_count;
        r.failures.extend(q.failures.iter().cloned());
        for m in &q.mismatches {
            r.details.push(format!(
                "slba {} byte {} differs from the write stamped {}",
                m.slba, m.byte, m.expected_stamp
            ));
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles_are_close() {
        let mut h = Histogram::default();
        for v in 1..=100_000u64 {
            h.record(v * 10);
        }
        let p50 = h.quantile_ns(0.5) as f64;
        let p99 = h.quantile_ns(0.99) as f64;
        assert!((p50 / 500_000.0 - 1.0).abs() < 0.03, "{p50}");
        assert!((p99 / 990_000.0 - 1.0).abs() < 0.03, "{p99}");
        assert_eq!(h.quantile_ns(1.0), 1_000_000);
        assert!((h.mean_ns() - 500_005.0).abs() < 1.0);
    }

    /// The coordinator, run against a simulated clock, sleeps about once a second
    /// and never spins: the bug this catches was a tick that only advanced when
    /// progress was printed, so `--quiet` runs slept zero seconds in a loop.
    #[test]
    fn coordinator_sleeps_between_ticks_and_never_spins() {
        let begin = Instant::now();
        let start = begin + Duration::from_millis(500);
        let end = start + Duration::from_secs(5);
        let (mut now, mut tick, mut started, mut wakeups) = (begin, begin, false, 0);
        while now < end {
            started |= now >= start;
            let d = coordinator_sleep(now, tick, start, end, started);
            assert!(
                !d.is_zero() || now >= end,
                "zero sleep at {:?}",
                now - begin
            );
            now += d;
            wakeups += 1;
            if tick_due(now, tick) {
                tick = now;
            }
            assert!(wakeups < 20, "spinning");
        }
        assert!(wakeups >= 6, "{wakeups}");
    }

    #[test]
    fn histogram_buckets_are_monotonic() {
        let mut last = 0;
        for i in 0..SUB * MAJORS {
            let b = Histogram::bound(i);
            assert!(b >= last, "bucket {i}");
            last = b;
        }
        for ns in [0u64, 1, 63, 64, 65, 1000, 123_456_789, u64::MAX / 4] {
            let i = Histogram::index(ns);
            assert!(
                Histogram::bound(i) >= ns.min(Histogram::bound(SUB * MAJORS - 1)),
                "{ns}"
            );
        }
    }
}
