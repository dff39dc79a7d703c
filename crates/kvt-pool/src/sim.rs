//! Deterministic simulation of the volume layer.
//!
//! One thread drives the real pool, volume channels and metadata steps over a
//! fault-injecting device: seeded random create / delete / resize / write / read /
//! deallocate / write-zeroes / flush / crash, with fuses that fail the device in
//! the middle of an operation or a metadata commit. After every recovery the pool
//! must pass `check`, and every 512-byte sector must hold a value the reference
//! model allows: the value at the last acknowledged Flush or one written since.
//! A run ends by deleting everything: all extents must come back clean.
//!
//! Reservation records (one seed in eight, `seed % 8 == 7`, so the older
//! seeds replay as they were): volumes' namespace reservations handed to
//! `persist_reservation` between the other steps; after every recovery each
//! volume's record is the last one answered durable or one handed in since,
//! and a deleted volume has none.
//!
//! Time, concurrency and read faults:
//! - simulated time moves between steps and while commands are in flight; on
//!   two seeds in three the pool runs its real GC admission controller (fed by
//!   the latency the channels measure from that time) and the periodic group
//!   commit, with dual-path pieces small enough to queue;
//! - the volumes are served by `REACTORS` pool channels (one per simulated
//!   reactor, each with its own extent cache), and some steps put several
//!   commands in flight at once across them: racing first writes to one
//!   extent, reads against writes and deallocates, a Flush among writes;
//!   the device carries out what is in flight in a seeded order;
//! - after every step the allocator is checked: every extent in exactly one
//!   place, the published counters equal to the lists after a metadata step;
//! - at recovery a metadata read may come back corrupted or from the wrong
//!   place: recovery must detect it (fail, then succeed once the fault is
//!   gone) or recover exactly the flushed state, never something else.
//!
//! KV (one seed in eight, so the older seeds replay as they were): a KV volume
//! beside the block ones takes Stores (values of 1 byte to 5 blocks, more
//! keys and bytes than it holds, so Stores evict), Retrieves, Deletes and
//! Flushes through the real key index and pool channels, under the same fuses,
//! reordering and crashes. In the run every Retrieve returns the model's value
//! or a miss for a key the model has absent (evictions are read back from the
//! index after each Store); after every recovery each key holds its value at
//! the last acknowledged Flush or one stored, deleted or evicted since, read
//! back byte for byte, never another key's or a torn one.
//!
//! `KVT_SIM_SEEDS=N` sets how many seeds run (default 60; CI runs thousands in the `sim` profile);
//! `KVT_SIM_SEED=S` runs one seed. A failure names its seed.

use super::channel::PoolChannel;
use super::format::{VOL_KV, VOL_UNWRITTEN_ERROR};
use super::gc::GcSettings;
use super::kv::{KvIndex, Reserve};
use super::{check, format, FormatOptions, Pool, PoolOptions};
use kvt_bdev::fault::{FaultDevice, FaultHandle, SimRng};
use kvt_bdev::fault::{ReadFault, ReadFaultKind};
use kvt_bdev::{IoChannel, IoCompletion, IoOp, SharedDevice, ERRNO_NO_SPACE, ERRNO_UNWRITTEN};
use kvt_mem::IoBuf;
use kvt_wire::nvme::{KvKey, Status, StoreOptions};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

const SECTOR: u64 = 512;
const EXTENT: u64 = 64 << 10;

/// What one sector may hold: the value at the last flush, and values since.
#[derive(Clone, Debug)]
struct Sector {
    cur: u64,
    allowed: BTreeSet<u64>,
}

impl Sector {
    fn fresh() -> Sector {
        Sector {
            cur: 0,
            allowed: BTreeSet::from([0]),
        }
    }
    fn set(&mut self, v: u64) {
        self.cur = v;
        self.allowed.insert(v);
    }
    fn flushed(&mut self) {
        self.allowed = BTreeSet::from([self.cur]);
    }
}

/// What a KV key may hold after a crash: its value (a version, or absent) at
/// the last flush, and every value or absence since.
#[derive(Clone, Debug)]
struct KSlot {
    cur: Option<u64>,
    allowed: BTreeSet<Option<u64>>,
}

impl KSlot {
    fn set(&mut self, v: Option<u64>) {
        self.cur = v;
        self.allowed.insert(v);
    }
    fn flushed(&mut self) {
        self.allowed = BTreeSet::from([self.cur]);
    }
}

/// The KV volume's name, its keys and block size.
const KV_VOL: &str = "kv";
/// The KV index's trim wait in the simulation: a few steps of 200 us.
const KV_TRIM_AFTER: Duration = Duration::from_millis(2);
const KV_KEYS: u32 = 24;
const KV_BS: u64 = 4096;

fn kv_key_of(k: u32) -> KvKey {
    let mut b = *b"sim-key-\0\0\0\0";
    b[8..].copy_from_slice(&k.to_be_bytes());
    KvKey::new(&b).unwrap_or_default()
}

/// A value: key, version and length in the first 16 bytes, then bytes that
/// depend on all three and the position (a torn, stale or foreign value fails).
fn kv_value_byte(k: u32, version: u64, i: usize) -> u8 {
    let x = version.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ ((k as u64) << 40) ^ i as u64;
    (x ^ (x >> 29)) as u8
}

fn kv_value(k: u32, version: u64, len: usize, out: &mut [u8]) {
    let mut head = [0u8; 16];
    head[..4].copy_from_slice(&k.to_le_bytes());
    head[4..12].copy_from_slice(&version.to_le_bytes());
    head[12..].copy_from_slice(&(len as u32).to_le_bytes());
    for (i, b) in out.iter_mut().enumerate().take(len) {
        *b = if i < 16 {
            head[i]
        } else {
            kv_value_byte(k, version, i)
        };
    }
}

/// The version a value read back holds, if it is whole and `k`'s.
fn kv_version(k: u32, len: usize, data: &[u8]) -> Option<u64> {
    if len < 16 {
        // Too short for a header: the version is in the model's `len` table.
        return None;
    }
    let word = |a: usize, b: usize| data.get(a..b);
    let key = u32::from_le_bytes(word(0, 4)?.try_into().ok()?);
    let version = u64::from_le_bytes(word(4, 12)?.try_into().ok()?);
    let n = u32::from_le_bytes(word(12, 16)?.try_into().ok()?) as usize;
    let body_ok = (16..len).all(|i| data.get(i) == Some(&kv_value_byte(k, version, i)));
    (key == k && n == len && body_ok).then_some(version)
}

struct KvModel {
    keys: Vec<KSlot>,
    /// The length of each version stored (values under 16 bytes carry no
    /// header: they are told apart by length and bytes).
    lens: BTreeMap<u64, usize>,
}

struct MVol {
    block_size: u64,
    unwritten_error: bool,
    sectors: Vec<Sector>,
}

fn sized(len: usize) -> IoBuf {
    let mut b = IoBuf::new(len);
    b.set_len(len);
    b
}

fn sector_bytes(v: u64, idx: u64, out: &mut [u8]) {
    if v == 0 {
        out.fill(0);
        return;
    }
    out.fill((v as u8) ^ (idx as u8) ^ 0x5A);
    out[..8].copy_from_slice(&v.to_le_bytes());
    out[8..16].copy_from_slice(&idx.to_le_bytes());
}

/// Decodes a sector: Some(0) for zeros, Some(v) for an intact pattern.
fn sector_value(b: &[u8], idx: u64) -> Option<u64> {
    if b.iter().all(|&x| x == 0) {
        return Some(0);
    }
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    let v = u64::from_le_bytes(a);
    let mut want = vec![0u8; b.len()];
    sector_value_check(v, idx, &mut want);
    (want == b).then_some(v)
}

fn sector_value_check(v: u64, idx: u64, out: &mut [u8]) {
    sector_bytes(v, idx, out)
}

struct Sim {
    seed: u64,
    rng: SimRng,
    fault: Arc<FaultDevice>,
    dev: SharedDevice,
    pool: Option<Arc<Pool>>,
    model: BTreeMap<String, MVol>,
    /// One pool channel per simulated reactor (opened on first use).
    reactors: Vec<Option<PoolChannel>>,
    /// Time, GC admission and group commit on (see the module comment).
    timed: bool,
    /// Where the data region starts: everything before it is metadata.
    meta_end: u64,
    /// What the run exercised, to show the many-seed run covers it.
    cover: Cover,
    next_value: u64,
    crashes: u64,
    log: Vec<String>,
    /// Simulated time: starts at a real instant (the one clock read) and
    /// moves only when the simulation says so.
    now: Instant,
    /// A create or resize that failed mid-commit: settled after the crash.
    pending_create: Option<(String, MVol)>,
    pending_resize: Option<(String, u64)>,
    /// The KV volume's model, on the seeds that have one.
    kv: Option<KvModel>,
    /// Reservation records per volume ID (never reused, so a volume made
    /// again under a deleted one's name starts with none), on the seeds that
    /// hand them in.
    resv: Option<BTreeMap<u32, ResvHistory>>,
}

/// A volume's reservation records since the last one known durable (the
/// first), each with its answer: 0 none yet, 1 durable, 2 refused.
type ResvHistory = Vec<(
    Option<super::format::VolumeResv>,
    Arc<std::sync::atomic::AtomicU8>,
)>;

fn resv_answer(v: u8) -> Arc<std::sync::atomic::AtomicU8> {
    Arc::new(std::sync::atomic::AtomicU8::new(v))
}

const REACTORS: usize = 3;

fn pool_opts(timed: bool) -> PoolOptions {
    if !timed {
        return PoolOptions {
            md_thread: false,
            reactors: REACTORS,
            gc: GcSettings {
                fixed_batch: Some(3),
                ..GcSettings::default()
            },
            commit_interval: None,
            ..PoolOptions::default()
        };
    }
    PoolOptions {
        md_thread: false,
        reactors: REACTORS,
        gc: GcSettings::default(),
        commit_interval: Some(Duration::from_secs(1)),
        dual_path: super::DualPath {
            enabled: true,
            large_threshold: 16 << 10,
            piece: 8 << 10,
            max_inflight: 2,
        },
    }
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let fault = FaultDevice::new(1_200_000 + 40 * EXTENT);
        let dev: SharedDevice = Arc::new(FaultHandle(fault.clone()));
        format(
            &dev,
            &FormatOptions {
                extent_size: EXTENT,
                force: false,
                journal_len: Some(96 << 10),
                // The 1,024 of format 2: this small device's room.
                max_volumes: Some(1024),
            },
        )
        .unwrap_or_else(|e| panic!("seed {seed}: format: {e}"));
        let timed = seed % 3 != 0;
        let pool = Pool::open("sim", dev.clone(), pool_opts(timed))
            .unwrap_or_else(|e| panic!("seed {seed}: open: {e}"));
        fault.set_reorder(Some(seed ^ 0x5eed));
        let meta_end = pool.sb.data_offset;
        let mut sim = Sim {
            seed,
            rng: SimRng(seed),
            fault,
            dev,
            pool: Some(pool),
            model: BTreeMap::new(),
            reactors: (0..REACTORS).map(|_| None).collect(),
            timed,
            meta_end,
            cover: Cover::default(),
            next_value: 1,
            crashes: 0,
            log: Vec::new(),
            now: Instant::now(),
            pending_create: None,
            pending_resize: None,
            kv: None,
            resv: (seed % 8 == 7).then(BTreeMap::new),
        };
        if seed % 8 == 3 {
            // 64 blocks of 4 KiB and (one per 16 KiB) 16 keys: fewer than the
            // 24 keys of up to 5 blocks the run stores, so Stores evict.
            if let Err(e) = sim
                .pool()
                .create_volume(KV_VOL, 4 * EXTENT, KV_BS as u32, VOL_KV)
            {
                sim.fail(format!("create the KV volume: {e}"));
            }
            sim.kv = Some(KvModel {
                keys: vec![
                    KSlot {
                        cur: None,
                        allowed: BTreeSet::from([None]),
                    };
                    KV_KEYS as usize
                ],
                lens: BTreeMap::new(),
            });
        }
        sim
    }

    fn fail(&self, msg: String) -> ! {
        let tail: Vec<_> = self.log.iter().rev().take(400).rev().cloned().collect();
        panic!(
            "seed {}: {msg}\nlast operations:\n  {}\nreproduce: KVT_SIM_SEED={} cargo test --profile sim -p kvt-pool --lib sim:: -- --nocapture",
            self.seed,
            tail.join("\n  "),
            self.seed
        );
    }

    fn pool(&self) -> Arc<Pool> {
        match &self.pool {
            Some(p) => p.clone(),
            None => self.fail("no pool".into()),
        }
    }

    fn reactor(&mut self, r: usize) -> &mut PoolChannel {
        if self.reactors[r].is_none() {
            let ch = PoolChannel::on_reactor(self.pool(), r)
                .unwrap_or_else(|e| panic!("seed {}: channel: {e}", self.seed));
            self.reactors[r] = Some(ch);
        }
        match self.reactors[r].as_mut() {
            Some(c) => c,
            None => unreachable!(),
        }
    }

    /// Lets every reactor's channel go of `name` (before a delete or resize,
    /// which need the volume unused, as the target's namespace removal does).
    fn release(&mut self, name: &str) {
        let Some(id) = self.pool().volume(name).map(|v| v.desc.id) else {
            return;
        };
        for ch in self.reactors.iter_mut().flatten() {
            if !ch.release_lane(id) {
                let seed = self.seed;
                panic!("seed {seed}: volume {name} still busy on an idle channel");
            }
        }
    }

    /// Simulated time passes.
    fn advance(&mut self, max: Duration) {
        let us = self.rng.below(max.as_micros() as u64 + 1);
        self.now += Duration::from_micros(us);
    }

    /// Submits one operation on a random reactor and runs it to its end.
    fn run(&mut self, name: &str, op: IoOp) -> IoCompletion {
        match self.run_batch(vec![(name.to_string(), op)]).pop() {
            Some(c) => c,
            None => self.fail(format!("an operation on {name} vanished")),
        }
    }

    /// Puts every operation in flight at once (each on a random reactor),
    /// then polls the reactors in a seeded order, with metadata steps and
    /// simulated device time between, until all have completed. Completions
    /// come back in the order of `ops`.
    fn run_batch(&mut self, ops: Vec<(String, IoOp)>) -> Vec<IoCompletion> {
        let pool = self.pool();
        let n = ops.len();
        for (i, (name, op)) in ops.into_iter().enumerate() {
            let Some(id) = pool.volume(&name).map(|v| v.desc.id) else {
                self.fail(format!("volume {name} missing"))
            };
            let r = self.rng.below(REACTORS as u64) as usize;
            let now = self.now;
            let ch = self.reactor(r);
            if let Err((_, e)) = ch.submit_lane(id, i as u64, op, now) {
                self.fail(format!("submit on {name} refused: errno {e}"));
            }
            ch.flush_submissions();
        }
        let mut done: Vec<Option<IoCompletion>> = (0..n).map(|_| None).collect();
        let mut left = n;
        for _ in 0..20_000 {
            if left == 0 {
                break;
            }
            self.advance(Duration::from_micros(200));
            let r = self.rng.below(REACTORS as u64) as usize;
            let now = self.now;
            let mut out = Vec::new();
            if let Some(ch) = self.reactors[r].as_mut() {
                ch.poll(&mut out, now);
            }
            for c in out {
                match done.get_mut(c.tag as usize) {
                    Some(slot @ None) => {
                        *slot = Some(c);
                        left -= 1;
                    }
                    _ => self.fail(format!("completion for unknown or finished tag {}", c.tag)),
                }
            }
            if self.rng.chance(30) {
                pool.md_step(self.now);
            }
        }
        if left > 0 {
            self.fail(format!("{left} of {n} operations never completed"));
        }
        done.into_iter().flatten().collect()
    }

    fn pick_volume(&mut self) -> Option<String> {
        if self.model.is_empty() {
            return None;
        }
        let i = self.rng.below(self.model.len() as u64) as usize;
        self.model.keys().nth(i).cloned()
    }

    fn flush_model(&mut self) {
        for v in self.model.values_mut() {
            for s in &mut v.sectors {
                s.flushed();
            }
        }
        // Every commit journals the key index's changes too.
        if let Some(kv) = self.kv.as_mut() {
            kv.keys.iter_mut().for_each(KSlot::flushed);
        }
    }

    fn step(&mut self) {
        let roll = self.rng.below(100);
        // A fuse makes the device fail a few writes from now: mid-operation or
        // mid-commit. The simulation then crashes.
        if self.rng.chance(4) {
            let n = self.rng.below(6);
            self.log.push(format!("fuse after {n} writes"));
            self.fault.arm_fuse(n);
        }
        if self.timed {
            self.advance(Duration::from_millis(400));
        }
        let mut stepped = false;
        if self.resv.is_some() && self.rng.chance(15) {
            self.resv_persist();
        } else if self.kv.is_some() && self.rng.chance(50) {
            match roll {
                0..=49 => self.kv_store(),
                50..=74 => self.kv_retrieve(),
                75..=89 => self.kv_delete(),
                _ => {
                    self.kv_flush();
                }
            }
        } else {
            match roll {
                0..=5 => self.create(),
                6..=7 => self.delete(),
                8..=10 => self.resize(),
                11..=35 => self.write(),
                36..=50 => self.read(),
                51..=59 => self.deallocate(false),
                60..=62 => self.deallocate(true),
                63..=72 => self.flush(),
                73..=87 => self.concurrent(),
                88..=93 => {
                    self.gc_steps();
                    stepped = true;
                }
                _ => self.crash(),
            }
        }
        if self.fault.tripped() {
            self.crash();
        } else if let Some(pool) = &self.pool {
            let problems = pool.verify_quiescent(stepped);
            if !problems.is_empty() {
                self.fail(format!("allocator: {problems:?}"));
            }
        }
    }

    /// Several commands in flight at once on random reactors: writes
    /// (racing on first writes when they share an extent), reads, deallocates
    /// and a Flush, completed in whatever order the pool and the device give.
    fn concurrent(&mut self) {
        let count = 2 + self.rng.below(3) as usize;
        let mut ops = Vec::new();
        // (volume, first sector, values written per sector; empty for a
        // read, zeros for a deallocate), and whether a Flush is among them.
        let mut writes: Vec<(String, usize, Vec<u64>)> = Vec::new();
        let mut reads: Vec<(usize, String, usize, usize)> = Vec::new();
        let mut flush = false;
        // Per command: Some(index into `writes`), or None (read or Flush).
        let mut kinds: Vec<Option<usize>> = Vec::new();
        for i in 0..count {
            let Some(name) = self.pick_volume() else {
                return;
            };
            let (off, len) = if self.rng.chance(50) {
                // Small pieces of the volume's first extent: first writes race.
                let bs = self.model[&name].block_size;
                let blocks =
                    (EXTENT / bs).min(self.model[&name].sectors.len() as u64 * SECTOR / bs);
                let n = 1 + self.rng.below(blocks.min(4));
                (self.rng.below(blocks - n + 1) * bs, n * bs)
            } else {
                self.range(&name)
            };
            let first = (off / SECTOR) as usize;
            let unwritten_error = self.model[&name].unwritten_error;
            match self.rng.below(10) {
                0..=4 => {
                    let mut buf = sized(len as usize);
                    let mut values = Vec::new();
                    for (k, sec) in buf.chunks_mut(SECTOR as usize).enumerate() {
                        let v = self.next_value;
                        self.next_value += 1;
                        sector_bytes(v, (first + k) as u64, sec);
                        values.push(v);
                    }
                    kinds.push(Some(writes.len()));
                    writes.push((name.clone(), first, values));
                    ops.push((
                        name,
                        IoOp::Write {
                            offset: off,
                            buf,
                            fua: false,
                        },
                    ));
                }
                5..=6 if !unwritten_error => {
                    kinds.push(Some(writes.len()));
                    writes.push((name.clone(), first, vec![0; (len / SECTOR) as usize]));
                    ops.push((name, IoOp::Deallocate { offset: off, len }));
                }
                7 if !flush => {
                    flush = true;
                    kinds.push(None);
                    ops.push((name, IoOp::Flush));
                }
                _ if !unwritten_error => {
                    kinds.push(None);
                    reads.push((i, name.clone(), first, (len / SECTOR) as usize));
                    ops.push((
                        name,
                        IoOp::Read {
                            offset: off,
                            buf: sized(len as usize),
                        },
                    ));
                }
                _ => {
                    kinds.push(None);
                    ops.push((name, IoOp::Flush));
                }
            }
        }
        self.log.push(format!(
            "concurrent: {}",
            ops.iter()
                .map(|(n, op)| format!("{n}:{}", op_name(op)))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        // What each sector held before the batch, for the ones it touches.
        let mut before: BTreeMap<(String, usize), u64> = BTreeMap::new();
        for (name, first, values) in &writes {
            for k in 0..values.len() {
                let cur = self.model[name].sectors[first + k].cur;
                before.insert((name.clone(), first + k), cur);
            }
        }
        for (_, name, first, n) in &reads {
            for k in 0..*n {
                let cur = self.model[name].sectors[first + k].cur;
                before.insert((name.clone(), first + k), cur);
            }
        }
        self.cover.batches += 1;
        let results = self.run_batch(ops);
        let tripped = self.fault.tripped();
        // Values a sector may hold after the batch: what it had, and what
        // any command of the batch put there (each write may land or not
        // only if it failed; a completed one did land, but in some order).
        let mut landed: BTreeMap<(String, usize), BTreeSet<u64>> = BTreeMap::new();
        let mut failed_values: Vec<(String, usize, u64)> = Vec::new();
        let mut flush_ok = false;
        for (i, c) in results.iter().enumerate() {
            let Some(w) = kinds.get(i).copied().flatten() else {
                if c.buf.is_none() && c.result.is_ok() && !reads.iter().any(|r| r.0 == i) {
                    flush_ok = true;
                }
                if c.result.is_err() && !tripped && !reads.iter().any(|r| r.0 == i) {
                    self.fail(format!("concurrent flush: {:?}", c.result));
                }
                continue;
            };
            let (name, first, values) = &writes[w];
            match c.result {
                Ok(()) => {
                    for (k, v) in values.iter().enumerate() {
                        landed
                            .entry((name.clone(), first + k))
                            .or_default()
                            .insert(*v);
                    }
                }
                Err(ERRNO_NO_SPACE) => {}
                Err(e) if tripped => {
                    self.log.push(format!("  failed: errno {e}"));
                    for (k, v) in values.iter().enumerate() {
                        failed_values.push((name.clone(), first + k, *v));
                    }
                }
                Err(e) => self.fail(format!("concurrent write on {name}: errno {e}")),
            }
        }
        // Reads saw, per sector, the old value or one the batch put there.
        for (i, name, first, n) in &reads {
            let c = &results[*i];
            match c.result {
                Ok(()) => {}
                Err(e) if tripped => {
                    self.log.push(format!("  read failed: errno {e}"));
                    continue;
                }
                Err(e) => self.fail(format!("concurrent read on {name}: errno {e}")),
            }
            let Some(data) = c.buf.as_ref() else {
                self.fail("read returned no buffer".into())
            };
            for k in 0..*n {
                let idx = (first + k) as u64;
                let got = sector_value(&data[k * 512..(k + 1) * 512], idx);
                let key = (name.clone(), first + k);
                let old = before
                    .get(&key)
                    .copied()
                    .map(|v| if v == u64::MAX { 0 } else { v });
                let batch = self.batch_values(&writes, &key);
                let ok = got.is_some_and(|g| Some(g) == old || batch.contains(&g));
                if !ok {
                    self.fail(format!(
                        "{name} sector {idx}: concurrent read got {got:?}, before {old:?}, batch {batch:?}"
                    ));
                }
            }
        }
        // Settle the model: one value landed where only one command wrote;
        // where several raced, read back which one won.
        for (key, vals) in &landed {
            if vals.len() == 1 {
                let v = *vals.iter().next().unwrap_or(&0);
                if let Some(m) = self.model.get_mut(&key.0) {
                    m.sectors[key.1].set(v);
                }
            }
        }
        for (name, idx, v) in failed_values {
            if let Some(m) = self.model.get_mut(&name) {
                m.sectors[idx].allowed.insert(v);
            }
        }
        let raced: Vec<((String, usize), BTreeSet<u64>)> =
            landed.into_iter().filter(|(_, v)| v.len() > 1).collect();
        self.cover.raced += raced.len() as u64;
        // Any of the racing values may be what a crash leaves.
        for ((name, idx), vals) in &raced {
            if let Some(m) = self.model.get_mut(name) {
                m.sectors[*idx].allowed.extend(vals.iter().copied());
            }
        }
        if !tripped {
            for ((name, idx), vals) in &raced {
                let bs = self.model[name].block_size as usize;
                let per = bs / SECTOR as usize;
                let block = idx / per;
                let c = self.run(
                    name,
                    IoOp::Read {
                        offset: (block * bs) as u64,
                        buf: sized(bs),
                    },
                );
                let k = idx - block * per;
                let got = match (&c.result, c.buf.as_ref()) {
                    (Ok(()), Some(d)) => sector_value(&d[k * 512..(k + 1) * 512], *idx as u64),
                    _ => None,
                };
                match got {
                    // The fuse tripped in a metadata step meanwhile: a crash follows.
                    None if self.fault.tripped() => break,
                    Some(g) if vals.contains(&g) => {
                        for v in vals {
                            if let Some(m) = self.model.get_mut(name) {
                                m.sectors[*idx].allowed.insert(*v);
                            }
                        }
                        if let Some(m) = self.model.get_mut(name) {
                            m.sectors[*idx].set(g);
                        }
                    }
                    _ => self.fail(format!(
                        "{name} sector {idx}: after racing writes read {got:?} (result {:?}, bytes {:?}), wanted one of {vals:?}",
                        c.result,
                        c.buf.as_ref().and_then(|d| d.get(k * 512..k * 512 + 16)),
                    )),
                }
            }
        }
        // A Flush completed: what completed before it was submitted is
        // durable, so a crash may leave only the old value or the batch's.
        if flush_ok && !tripped {
            let batch_keys: BTreeSet<(String, usize)> = before.keys().cloned().collect();
            for (name, v) in self.model.iter_mut() {
                for (i, sec) in v.sectors.iter_mut().enumerate() {
                    let key = (name.clone(), i);
                    if batch_keys.contains(&key) {
                        let mut keep = BTreeSet::from([sec.cur]);
                        if let Some(old) = before.get(&key) {
                            keep.insert(*old);
                        }
                        for (wn, first, values) in &writes {
                            if wn == name && i >= *first && i < first + values.len() {
                                keep.insert(values[i - first]);
                            }
                        }
                        sec.allowed = sec.allowed.intersection(&keep).copied().collect();
                        sec.allowed.insert(sec.cur);
                    } else {
                        sec.flushed();
                    }
                }
            }
        }
    }

    /// Values the batch's writes and deallocates put at `key`.
    fn batch_values(
        &self,
        writes: &[(String, usize, Vec<u64>)],
        key: &(String, usize),
    ) -> BTreeSet<u64> {
        writes
            .iter()
            .filter(|(n, first, v)| *n == key.0 && key.1 >= *first && key.1 < first + v.len())
            .map(|(_, first, v)| v[key.1 - first])
            .collect()
    }

    fn create(&mut self) {
        if self.model.len() >= 6 {
            return;
        }
        let name = format!("v{}", self.rng.below(10));
        if self.model.contains_key(&name) {
            return;
        }
        let block_size = if self.rng.chance(50) { 512 } else { 4096 };
        let extents = 1 + self.rng.below(16);
        let size = extents * EXTENT - if self.rng.chance(30) { block_size } else { 0 };
        let flags = if self.rng.chance(30) {
            VOL_UNWRITTEN_ERROR
        } else {
            0
        };
        self.log.push(format!(
            "create {name} size {size} bs {block_size} flags {flags}"
        ));
        match self
            .pool()
            .create_volume(&name, size, block_size as u32, flags)
        {
            Ok(_) => {
                self.flush_model();
                self.model.insert(
                    name,
                    MVol {
                        block_size,
                        unwritten_error: flags != 0,
                        sectors: vec![Sector::fresh(); (size / SECTOR) as usize],
                    },
                );
            }
            Err(e) if self.fault.tripped() => {
                self.log.push(format!("  failed: {e}"));
                // Durable or not: settled after the crash.
                self.pending_create = Some((
                    name,
                    MVol {
                        block_size,
                        unwritten_error: flags != 0,
                        sectors: vec![Sector::fresh(); (size / SECTOR) as usize],
                    },
                ));
            }
            Err(e) => self.fail(format!("create {name}: {e}")),
        }
    }

    fn delete(&mut self) {
        let Some(name) = self.pick_volume() else {
            return;
        };
        self.log.push(format!("delete {name}"));
        self.release(&name);
        match self.pool().delete_volume(&name) {
            Ok(()) => {
                self.model.remove(&name);
                self.flush_model();
            }
            Err(e) if self.fault.tripped() => self.log.push(format!("  failed: {e}")),
            Err(e) => self.fail(format!("delete {name}: {e}")),
        }
    }

    fn resize(&mut self) {
        let Some(name) = self.pick_volume() else {
            return;
        };
        let bs = self.model[&name].block_size;
        let extents = 1 + self.rng.below(16);
        let size = extents * EXTENT
            - if self.rng.chance(40) {
                bs * (1 + self.rng.below(4))
            } else {
                0
            };
        self.log.push(format!("resize {name} to {size}"));
        self.release(&name);
        match self.pool().resize_volume(&name, size) {
            Ok(()) => {
                self.flush_model();
                if let Some(v) = self.model.get_mut(&name) {
                    v.sectors.resize((size / SECTOR) as usize, Sector::fresh());
                }
            }
            Err(e) if self.fault.tripped() => {
                self.log.push(format!("  failed: {e}"));
                self.pending_resize = Some((name, size));
            }
            Err(e) => self.fail(format!("resize {name}: {e}")),
        }
    }

    fn range(&mut self, name: &str) -> (u64, u64) {
        let v = &self.model[name];
        let blocks = v.sectors.len() as u64 * SECTOR / v.block_size;
        let n = 1 + self.rng.below(blocks.min(40));
        let first = self.rng.below(blocks - n + 1);
        (first * v.block_size, n * v.block_size)
    }

    fn write(&mut self) {
        let Some(name) = self.pick_volume() else {
            return;
        };
        let (off, len) = self.range(&name);
        let fua = self.rng.chance(10);
        let mut buf = sized(len as usize);
        let mut values = Vec::new();
        for (i, s) in buf.chunks_mut(SECTOR as usize).enumerate() {
            let v = self.next_value;
            self.next_value += 1;
            let idx = off / SECTOR + i as u64;
            sector_bytes(v, idx, s);
            values.push(v);
        }
        self.log
            .push(format!("write {name} at {off} len {len} fua {fua}"));
        let c = self.run(
            &name,
            IoOp::Write {
                offset: off,
                buf,
                fua,
            },
        );
        let first = (off / SECTOR) as usize;
        match c.result {
            Ok(()) => {
                let v = self.model.get_mut(&name).map(|v| &mut v.sectors);
                if let Some(sectors) = v {
                    for (i, val) in values.iter().enumerate() {
                        sectors[first + i].set(*val);
                    }
                }
                if fua {
                    // A FUA write commits everything (group commit) before its ack.
                    self.flush_model();
                }
            }
            Err(ERRNO_NO_SPACE) => self.log.push("  capacity exceeded".into()),
            Err(e) if self.fault.tripped() => {
                self.log.push(format!("  failed: errno {e}"));
                // Possibly partly on the device: allowed, not current.
                if let Some(v) = self.model.get_mut(&name) {
                    for (i, val) in values.iter().enumerate() {
                        v.sectors[first + i].allowed.insert(*val);
                    }
                }
            }
            Err(e) => self.fail(format!("write failed with errno {e}")),
        }
    }

    fn read(&mut self) {
        let Some(name) = self.pick_volume() else {
            return;
        };
        let (off, len) = self.range(&name);
        self.log.push(format!("read {name} at {off} len {len}"));
        let c = self.run(
            &name,
            IoOp::Read {
                offset: off,
                buf: sized(len as usize),
            },
        );
        let v = &self.model[&name];
        let first = (off / SECTOR) as usize;
        let n = (len / SECTOR) as usize;
        let any_unwritten = v.sectors[first..first + n].iter().any(|s| s.cur == 0);
        match c.result {
            Err(ERRNO_UNWRITTEN) if v.unwritten_error && any_unwritten => {}
            Err(e) if self.fault.tripped() => self.log.push(format!("  failed: errno {e}")),
            Err(e) => self.fail(format!(
                "read {name} at {off} len {len}: errno {e} (unwritten in model: {any_unwritten})"
            )),
            Ok(()) => {
                if v.unwritten_error && any_unwritten {
                    self.fail(format!(
                        "read {name} at {off} len {len} succeeded over unwritten blocks"
                    ));
                }
                let Some(data) = c.buf else {
                    self.fail("read returned no buffer".into())
                };
                for i in 0..n {
                    let idx = (first + i) as u64;
                    let got = sector_value(&data[i * 512..(i + 1) * 512], idx);
                    // u64::MAX: zeros written as data (Write Zeroes).
                    let want = match v.sectors[first + i].cur {
                        u64::MAX => 0,
                        c => c,
                    };
                    if got != Some(want) {
                        self.fail(format!(
                            "{name} sector {idx}: read {got:?}, model has {}",
                            v.sectors[first + i].cur
                        ));
                    }
                }
            }
        }
    }

    fn deallocate(&mut self, as_write_zeroes: bool) {
        let Some(name) = self.pick_volume() else {
            return;
        };
        let (off, len) = self.range(&name);
        self.log.push(format!(
            "{} {name} at {off} len {len}",
            if as_write_zeroes {
                "write-zeroes"
            } else {
                "deallocate"
            }
        ));
        let op = if as_write_zeroes {
            IoOp::WriteZeroes { offset: off, len }
        } else {
            IoOp::Deallocate { offset: off, len }
        };
        let c = self.run(&name, op);
        let first = (off / SECTOR) as usize;
        let n = (len / SECTOR) as usize;
        match c.result {
            Ok(()) => {
                let v = self.model.get_mut(&name);
                if let Some(v) = v {
                    // Write Zeroes on an unwritten-error volume makes zeros data;
                    // the model cannot tell zeros from unwritten, so it reads
                    // such blocks back only as zeros.
                    let val = if as_write_zeroes && v.unwritten_error {
                        u64::MAX
                    } else {
                        0
                    };
                    for s in &mut v.sectors[first..first + n] {
                        s.set(val);
                    }
                }
            }
            Err(ERRNO_NO_SPACE) if as_write_zeroes => {}
            Err(e) if self.fault.tripped() => {
                self.log.push(format!("  failed: errno {e}"));
                if let Some(v) = self.model.get_mut(&name) {
                    for s in &mut v.sectors[first..first + n] {
                        s.allowed.insert(0);
                        s.allowed.insert(u64::MAX);
                    }
                }
            }
            Err(e) => self.fail(format!("deallocate failed with errno {e}")),
        }
    }

    fn kv_index(&self) -> Arc<KvIndex> {
        match self.pool().volume(KV_VOL).and_then(|v| v.kv.clone()) {
            Some(ix) => {
                // Extents free a few steps go back to the pool (unmapped, then
                // scrubbed) while the run goes on, crashes included.
                ix.set_trim_after(KV_TRIM_AFTER);
                ix
            }
            None => self.fail("the KV volume or its index is missing".into()),
        }
    }

    /// A Store as the target makes one: reserve, write the value's blocks,
    /// commit it to the index; a full index asks for a commit and retries.
    fn kv_store(&mut self) {
        let ix = self.kv_index();
        let k = self.rng.below(KV_KEYS as u64) as u32;
        let version = self.next_value;
        self.next_value += 1;
        let len = 1 + self.rng.below(8 * KV_BS) as usize;
        let key = kv_key_of(k);
        self.log
            .push(format!("kv store key {k} v{version} ({len} bytes)"));
        let opts = StoreOptions::default();
        let mut loc = None;
        for _ in 0..4 {
            match ix.reserve(&key, len as u32, opts, self.now) {
                Ok(Reserve::Ready(l)) => {
                    loc = Some(l);
                    break;
                }
                Ok(Reserve::Claimed(l)) => {
                    self.log.push(format!(
                        "  full: blocks {}+{} claimed; flush, then write",
                        l.block, l.nblocks
                    ));
                    self.kv_note_evictions(&ix);
                    if !self.kv_flush() {
                        // The release of some of these blocks may not be
                        // durable: they wait for a commit again.
                        ix.abort_claim(&key, l);
                        return;
                    }
                    self.cover.kv_claimed += 1;
                    loc = Some(l);
                    break;
                }
                Ok(Reserve::AfterCommit) => {
                    self.log.push("  full: flush and ask again".into());
                    // It evicted keys to make that commit free enough room.
                    self.kv_note_evictions(&ix);
                    if !self.kv_flush() {
                        return;
                    }
                }
                Err(s) => self.fail(format!("kv store key {k}: reserve refused {s:?}")),
            }
        }
        let Some(loc) = loc else {
            self.fail(format!("kv store key {k}: no room after four commits"));
        };
        let mut buf = sized(loc.nblocks as usize * KV_BS as usize);
        buf.fill(0);
        kv_value(k, version, len, &mut buf);
        let c = self.run(
            KV_VOL,
            IoOp::Write {
                offset: loc.block * KV_BS,
                buf,
                fua: false,
            },
        );
        if let Err(e) = c.result {
            ix.abort_store(&key, loc);
            self.kv_note_evictions(&ix);
            if self.fault.tripped() {
                self.log.push(format!("  failed: errno {e}"));
                return;
            }
            self.fail(format!("kv store key {k}: write errno {e}"));
        }
        if let Err(s) = ix.commit_store(&key, loc, opts, self.now) {
            self.fail(format!("kv store key {k}: commit refused {s:?}"));
        }
        if let Some(kv) = self.kv.as_mut() {
            kv.keys[k as usize].set(Some(version));
            kv.lens.insert(version, len);
        }
        self.cover.kv_stores += 1;
        self.kv_note_evictions(&ix);
    }

    /// Keys a Store's reservation evicted are gone now (and may be after a
    /// crash), whether or not that Store completes.
    fn kv_note_evictions(&mut self, ix: &KvIndex) {
        let present: BTreeSet<KvKey> = ix.locations().into_iter().map(|(k, _)| k).collect();
        if let Some(kv) = self.kv.as_mut() {
            for (i, slot) in kv.keys.iter_mut().enumerate() {
                if slot.cur.is_some() && !present.contains(&kv_key_of(i as u32)) {
                    self.log.push(format!("  evicted key {i}"));
                    slot.set(None);
                    self.cover.kv_evicted += 1;
                }
            }
        }
    }

    /// Reads `k`'s value at `loc` through a channel: its version, or a
    /// failure naming what came back.
    fn kv_read(&mut self, k: u32, loc: super::kv::KvLoc) -> Result<u64, String> {
        let c = self.run(
            KV_VOL,
            IoOp::Read {
                offset: loc.block * KV_BS,
                buf: sized(loc.nblocks as usize * KV_BS as usize),
            },
        );
        if let Err(e) = c.result {
            return Err(format!("read errno {e}"));
        }
        let Some(data) = c.buf else {
            return Err("read returned no buffer".into());
        };
        let len = loc.len as usize;
        if let Some(v) = kv_version(k, len, &data) {
            return Ok(v);
        }
        // A value under 16 bytes: whichever version of that length matches.
        let lens = self.kv.as_ref().map(|m| m.lens.clone()).unwrap_or_default();
        let mut want = vec![0u8; len];
        for (&v, &l) in lens.iter().filter(|(_, &l)| l == len && l < 16) {
            kv_value(k, v, l, &mut want);
            if data.get(..len) == Some(&want[..]) {
                return Ok(v);
            }
        }
        Err(format!(
            "{len} bytes that are no value of key {k}: {:02x?}",
            &data[..len.min(32)]
        ))
    }

    fn kv_retrieve(&mut self) {
        let ix = self.kv_index();
        let k = self.rng.below(KV_KEYS as u64) as u32;
        let cur = self.kv.as_ref().and_then(|m| m.keys[k as usize].cur);
        self.log
            .push(format!("kv retrieve key {k} (model {cur:?})"));
        match ix.begin_read(&kv_key_of(k), self.now) {
            Err(s) if s == Status::KV_KEY_DOES_NOT_EXIST => {
                if cur.is_some() {
                    self.fail(format!("kv key {k} missing, model has v{cur:?}"));
                }
            }
            Err(s) => self.fail(format!("kv retrieve key {k}: {s:?}")),
            Ok((pin, loc)) => {
                let got = self.kv_read(k, loc);
                ix.end_read(pin);
                match got {
                    Ok(v) if Some(v) == cur => {}
                    Err(_) if self.fault.tripped() => self.log.push("  read failed".into()),
                    other => self.fail(format!("kv key {k}: read {other:?}, model has {cur:?}")),
                }
            }
        }
    }

    fn kv_delete(&mut self) {
        let ix = self.kv_index();
        let k = self.rng.below(KV_KEYS as u64) as u32;
        self.log.push(format!("kv delete key {k}"));
        let cur = self.kv.as_ref().and_then(|m| m.keys[k as usize].cur);
        match ix.delete(&kv_key_of(k), self.now) {
            Ok(()) if cur.is_some() => {}
            Err(s) if s == Status::KV_KEY_DOES_NOT_EXIST && cur.is_none() => return,
            other => self.fail(format!("kv delete key {k}: {other:?}, model has {cur:?}")),
        }
        if let Some(kv) = self.kv.as_mut() {
            kv.keys[k as usize].set(None);
        }
    }

    /// A Flush through the KV volume; false when it failed (a fuse).
    fn kv_flush(&mut self) -> bool {
        self.log.push("kv flush".into());
        let c = self.run(KV_VOL, IoOp::Flush);
        match c.result {
            Ok(()) => {
                self.flush_model();
                true
            }
            Err(e) if self.fault.tripped() => {
                self.log.push(format!("  failed: errno {e}"));
                false
            }
            Err(e) => self.fail(format!("kv flush failed with errno {e}")),
        }
    }

    /// After a crash: every key holds what the model allows, read back byte
    /// for byte, and the index holds no key the run never stored.
    fn kv_settle(&mut self) {
        if self.kv.is_none() {
            return;
        }
        let ix = self.kv_index();
        let keys: BTreeMap<KvKey, super::kv::KvLoc> = ix.locations().into_iter().collect();
        let known: BTreeSet<KvKey> = (0..KV_KEYS).map(kv_key_of).collect();
        if let Some(stray) = keys.keys().find(|k| !known.contains(k)) {
            self.fail(format!(
                "after crash the KV index holds {stray:?}, never stored"
            ));
        }
        for k in 0..KV_KEYS {
            let got = match keys.get(&kv_key_of(k)) {
                None => None,
                Some(&loc) => match self.kv_read(k, loc) {
                    Ok(v) => {
                        self.cover.kv_checked += 1;
                        Some(v)
                    }
                    Err(e) => self.fail(format!("kv key {k} after crash: {e}")),
                },
            };
            let allowed = self.kv.as_ref().map(|m| m.keys[k as usize].allowed.clone());
            if !allowed.as_ref().is_some_and(|a| a.contains(&got)) {
                self.fail(format!(
                    "kv key {k} after crash holds {got:?}, allowed {allowed:?}"
                ));
            }
            if let Some(kv) = self.kv.as_mut() {
                kv.keys[k as usize].cur = got;
                kv.keys[k as usize].flushed();
            }
        }
    }

    fn flush(&mut self) {
        let Some(name) = self.pick_volume() else {
            return;
        };
        self.log.push(format!("flush via {name}"));
        let c = self.run(&name, IoOp::Flush);
        match c.result {
            Ok(()) => self.flush_model(),
            Err(e) if self.fault.tripped() => self.log.push(format!("  failed: errno {e}")),
            Err(e) => self.fail(format!("flush failed with errno {e}")),
        }
    }

    /// Hands a volume a new reservation record (PTPL off: none), and on
    /// some steps runs the metadata step that commits it.
    fn resv_persist(&mut self) {
        let Some(name) = self.pick_volume() else {
            return;
        };
        let Some(vol) = self.pool().volume(&name) else {
            return;
        };
        let value = self.rng.chance(75).then(|| {
            let registrants: Vec<([u8; 16], u64)> = (0..self.rng.below(4))
                .map(|i| ([i as u8 + 1; 16], self.rng.below(1 << 20)))
                .collect();
            super::format::VolumeResv {
                generation: self.next_value as u32,
                held: registrants
                    .first()
                    .filter(|_| self.rng.chance(50))
                    .map(|(h, _)| (1 + self.rng.below(6) as u8, *h)),
                registrants,
            }
        });
        self.next_value += 1;
        self.log.push(format!("reservation of {name}: {value:?}"));
        let answer = resv_answer(0);
        let to = answer.clone();
        self.pool().persist_reservation(
            vol.desc.id,
            value.clone(),
            Box::new(move |ok| to.store(if ok { 1 } else { 2 }, Ordering::Release)),
        );
        if let Some(h) = self
            .resv
            .as_mut()
            .map(|m| m.entry(vol.desc.id).or_default())
        {
            if h.is_empty() {
                // A volume's first record: before it, none.
                h.push((None, resv_answer(1)));
            }
            h.push((value, answer));
        }
        if self.rng.chance(50) {
            self.gc_steps();
        }
    }

    /// After a recovery: each volume's record is the last one answered
    /// durable or one handed in after it; that is the new durable one.
    fn resv_settle(&mut self, pool: &Arc<Pool>) {
        let Some(mut models) = self.resv.take() else {
            return;
        };
        for v in pool.volumes() {
            let h = models.entry(v.desc.id).or_default();
            let durable = h
                .iter()
                .rposition(|(_, a)| a.load(Ordering::Acquire) == 1)
                .unwrap_or(0);
            let got = v.reservation();
            let allowed =
                h.is_empty() && got.is_none() || h[durable..].iter().any(|(r, _)| *r == got);
            if !allowed {
                self.fail(format!(
                    "volume {} has reservation {got:?} after recovery; allowed {:?}",
                    v.desc.name,
                    &h[durable.min(h.len())..]
                ));
            }
            self.cover.resv_checked += u64::from(got.is_some());
            *h = vec![(got, resv_answer(1))];
        }
        self.resv = Some(models);
    }

    fn gc_steps(&mut self) {
        self.log.push("metadata steps".into());
        let pool = self.pool();
        for _ in 0..1 + self.rng.below(4) {
            pool.md_step(self.now);
        }
    }

    /// Deletes every key and flushes: once the trim wait has passed, the KV
    /// volume maps no extent (its space went back to the pool for GC).
    fn kv_empty_and_trim(&mut self) {
        if self.kv.is_none() {
            return;
        }
        let ix = self.kv_index();
        for (k, _) in ix.locations() {
            if let Err(s) = ix.delete(&k, self.now) {
                self.fail(format!("final kv delete {k:?}: {s:?}"));
            }
        }
        if !self.kv_flush() {
            self.fail("final kv flush failed".into());
        }
        let pool = self.pool();
        let Some(vol) = pool.volume(KV_VOL) else {
            self.fail("the KV volume is missing".into());
        };
        for _ in 0..100 {
            if vol.mapped().is_empty() {
                return;
            }
            self.now += Duration::from_millis(1);
            pool.md_step(self.now);
        }
        self.fail(format!(
            "an empty KV volume still maps {:?}; index {:?}",
            vol.mapped(),
            ix.snapshot()
        ));
    }

    /// Counts the KV extents the current index trimmed (before it goes).
    fn note_kv_trims(&mut self) {
        if self.kv.is_some() {
            if let Some(ix) = self
                .pool
                .as_ref()
                .and_then(|p| p.volume(KV_VOL))
                .and_then(|v| v.kv.clone())
            {
                self.cover.kv_trimmed += ix.snapshot().trimmed_extents;
            }
        }
    }

    fn crash(&mut self) {
        self.note_kv_trims();
        self.crashes += 1;
        self.log.push("crash".into());
        self.reactors.iter_mut().for_each(|r| *r = None);
        self.pool = None;
        self.fault.crash(&mut self.rng);
        self.recover();
    }

    /// Arms, on some recoveries, one faulty metadata read.
    fn maybe_read_fault(&mut self) {
        if !self.rng.chance(30) {
            self.fault.disarm_read_fault();
            return;
        }
        let kind = if self.rng.chance(50) {
            ReadFaultKind::Corrupt {
                at: self.rng.below(4096),
            }
        } else {
            // Another metadata block's data, or some other block's.
            ReadFaultKind::Misdirect {
                by: 4096 * (1 + self.rng.below(self.meta_end / 4096 + 4)),
            }
        };
        let after = self.rng.below(8);
        self.log
            .push(format!("read fault {kind:?} after {after} metadata reads"));
        self.fault.arm_read_fault(
            after,
            ReadFault {
                range: 0..self.meta_end,
                kind,
            },
        );
    }

    fn recover(&mut self) {
        // `check` reports damage only when a faulty read made it see some.
        self.maybe_read_fault();
        let served = self.fault.read_faults();
        let rep = check(&self.dev);
        if !rep.damage.is_empty() && self.fault.read_faults() == served {
            self.fail(format!(
                "check after crash: {:?}\n{}",
                rep.damage,
                rep.lines.join("\n")
            ));
        }
        // Recovery under a faulty read either fails (and then succeeds with
        // the fault gone) or recovers exactly: the model checks below and in
        // later steps find anything else.
        self.maybe_read_fault();
        let served = self.fault.read_faults();
        let pool = match Pool::open("sim", self.dev.clone(), pool_opts(self.timed)) {
            Ok(p) => p,
            Err(e) if self.fault.read_faults() > served => {
                self.cover.refused += 1;
                self.log.push(format!("  recovery refused: {e}"));
                self.fault.disarm_read_fault();
                match Pool::open("sim", self.dev.clone(), pool_opts(self.timed)) {
                    Ok(p) => p,
                    Err(e) => self.fail(format!("recovery after a read fault: {e}")),
                }
            }
            Err(e) => self.fail(format!("recovery: {e}")),
        };
        self.fault.disarm_read_fault();
        self.pool = Some(pool.clone());
        // Operations that failed mid-commit may or may not have happened.
        if let Some((name, mv)) = self.pending_create.take() {
            if pool.volume(&name).is_some() {
                self.model.insert(name, mv);
            }
        }
        if let Some((name, size)) = self.pending_resize.take() {
            if let Some(v) = pool.volume(&name) {
                if v.desc.size_bytes == size {
                    if let Some(m) = self.model.get_mut(&name) {
                        m.sectors.resize((size / SECTOR) as usize, Sector::fresh());
                    }
                }
            }
        }
        let names: Vec<String> = self.model.keys().cloned().collect();
        for name in names {
            if pool.volume(&name).is_none() {
                // A delete that failed mid-commit but reached the journal.
                self.model.remove(&name);
                continue;
            }
            self.settle_volume(&name);
        }
        self.resv_settle(&pool);
        if self.kv.is_some() {
            if pool.volume(KV_VOL).is_none() {
                self.fail("the KV volume is gone after recovery".into());
            }
            self.kv_settle();
        }
        for v in pool.volumes() {
            let kv_volume = self.kv.is_some() && v.desc.name == KV_VOL;
            if !self.model.contains_key(&v.desc.name) && !kv_volume {
                self.fail(format!(
                    "volume {} exists but the model has none",
                    v.desc.name
                ));
            }
        }
        let snap = pool.snapshot();
        if snap.mapped + snap.clean + snap.dirty + snap.reserved != snap.extents as u64 {
            self.fail(format!(
                "free space does not add up after recovery: {snap:?}"
            ));
        }
    }

    /// Reads every block after a crash, checks it against what the model
    /// allows, and adopts it as the new flushed state.
    fn settle_volume(&mut self, name: &str) {
        let (bs, nsec, err_mode) = {
            let v = &self.model[name];
            (v.block_size, v.sectors.len() as u64, v.unwritten_error)
        };
        let per_block = (bs / SECTOR) as usize;
        for b in 0..(nsec * SECTOR / bs) {
            let c = self.run(
                name,
                IoOp::Read {
                    offset: b * bs,
                    buf: sized(bs as usize),
                },
            );
            let first = b as usize * per_block;
            match c.result {
                Err(ERRNO_UNWRITTEN) if err_mode => {
                    let Some(v) = self.model.get_mut(name) else {
                        return;
                    };
                    for (i, s) in v.sectors[first..first + per_block].iter_mut().enumerate() {
                        if !s.allowed.contains(&0) {
                            let allowed = s.allowed.clone();
                            self.fail(format!(
                                "{name} sector {}: unwritten after crash, allowed {allowed:?}",
                                first + i
                            ));
                        }
                        s.cur = 0;
                        s.flushed();
                    }
                }
                Err(e) => {
                    let actual = self.pool().volume(name).map(|v| v.desc.clone());
                    self.fail(format!(
                        "{name} block {b}: errno {e} after crash (pool has {actual:?})"
                    ))
                }
                Ok(()) => {
                    let Some(data) = c.buf else { return };
                    for i in 0..per_block {
                        let idx = (first + i) as u64;
                        let got = sector_value(&data[i * 512..(i + 1) * 512], idx);
                        let s = &self.model[name].sectors[first + i];
                        // Zeros written by Write Zeroes read back as zeros.
                        let ok = match got {
                            Some(0) => s.allowed.contains(&0) || s.allowed.contains(&u64::MAX),
                            Some(v) => s.allowed.contains(&v),
                            None => false,
                        };
                        if !ok {
                            let allowed = s.allowed.clone();
                            self.fail(format!(
                                "{name} sector {idx}: after crash read {got:?}, allowed {allowed:?}"
                            ));
                        }
                        let val = match got {
                            Some(0) if err_mode => u64::MAX,
                            Some(v) => v,
                            None => 0,
                        };
                        if let Some(v) = self.model.get_mut(name) {
                            v.sectors[first + i].cur = val;
                            v.sectors[first + i].flushed();
                        }
                    }
                }
            }
        }
    }

    /// Deletes everything and lets GC finish: every extent must be clean again.
    fn drain(&mut self) {
        let mut names: Vec<String> = self.model.keys().cloned().collect();
        self.kv_empty_and_trim();
        self.note_kv_trims();
        if self.kv.take().is_some() {
            names.push(KV_VOL.into());
        }
        self.reactors.iter_mut().for_each(|r| *r = None);
        let pool = self.pool();
        for n in names {
            if let Err(e) = pool.delete_volume(&n) {
                self.fail(format!("final delete {n}: {e}"));
            }
            self.model.remove(&n);
        }
        for _ in 0..1000 {
            // Admission-controlled GC earns its scrubs with time.
            self.now += Duration::from_millis(50);
            pool.md_step(self.now);
            let s = pool.snapshot();
            if s.dirty == 0 {
                break;
            }
        }
        let s = pool.snapshot();
        self.cover.scrubbed += s.gc_scrubbed;
        self.cover.commits += s.commits;
        if s.mapped != 0 || s.dirty != 0 || s.clean + s.reserved != s.extents as u64 {
            self.fail(format!("after deleting everything: {s:?}"));
        }
        if let Err(e) = pool.close() {
            self.fail(format!("close: {e}"));
        }
        let rep = check(&self.dev);
        if !rep.damage.is_empty() {
            self.fail(format!("final check: {:?}", rep.damage));
        }
    }
}

fn op_name(op: &IoOp) -> String {
    match op {
        IoOp::Read { offset, buf } => format!("read@{offset}+{}", buf.len()),
        IoOp::Write { offset, buf, .. } => format!("write@{offset}+{}", buf.len()),
        IoOp::WriteZeroes { offset, len } => format!("zeroes@{offset}+{len}"),
        IoOp::Deallocate { offset, len } => format!("deallocate@{offset}+{len}"),
        IoOp::Flush => "flush".into(),
    }
}

/// What a run exercised (summed over seeds and printed by the many-seed run).
#[derive(Debug, Default, Clone, Copy)]
struct Cover {
    crashes: u64,
    sectors_written: u64,
    /// Steps with several commands in flight, and sectors two of them raced for.
    batches: u64,
    raced: u64,
    /// Faulty metadata reads served, and recoveries that refused because of
    /// one (none since recovery reads a failed block again: the faults are
    /// transient, one read each).
    read_faults: u64,
    refused: u64,
    /// Extents GC scrubbed and journal commits, in the final pool of each seed.
    scrubbed: u64,
    commits: u64,
    /// KV: Stores acknowledged, keys the index evicted, and keys found holding
    /// a value after a crash (each read back and checked).
    kv_stores: u64,
    kv_evicted: u64,
    /// Stores that claimed blocks waiting for a commit and wrote them after it.
    kv_claimed: u64,
    kv_checked: u64,
    /// KV extents whose blocks stayed free long enough to be unmapped.
    kv_trimmed: u64,
    /// Reservation records found after a crash (each checked).
    resv_checked: u64,
}

impl Cover {
    fn add(&mut self, o: Cover) {
        self.crashes += o.crashes;
        self.sectors_written += o.sectors_written;
        self.batches += o.batches;
        self.raced += o.raced;
        self.read_faults += o.read_faults;
        self.refused += o.refused;
        self.scrubbed += o.scrubbed;
        self.commits += o.commits;
        self.kv_stores += o.kv_stores;
        self.kv_evicted += o.kv_evicted;
        self.kv_claimed += o.kv_claimed;
        self.kv_trimmed += o.kv_trimmed;
        self.kv_checked += o.kv_checked;
        self.resv_checked += o.resv_checked;
    }
}

/// Steps per seed; `KVT_SIM_STEPS` changes it (for one seed or many alike,
/// so a seed replays the run it failed in).
fn steps() -> usize {
    std::env::var("KVT_SIM_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(150)
}

fn run_seed(seed: u64, steps: usize) -> Cover {
    let mut sim = Sim::new(seed);
    for _ in 0..steps {
        sim.step();
    }
    // A last crash without a flush, then the final accounting.
    sim.crash();
    sim.drain();
    let mut c = sim.cover;
    c.crashes = sim.crashes;
    c.sectors_written = sim.next_value;
    c.read_faults = sim.fault.read_faults();
    c
}

#[test]
fn simulation_over_many_seeds() {
    if let Ok(s) = std::env::var("KVT_SIM_SEED") {
        let seed: u64 = s
            .parse()
            .unwrap_or_else(|_| panic!("KVT_SIM_SEED={s} is not a number"));
        eprintln!("seed {seed}: {:?}", run_seed(seed, steps()));
        return;
    }
    let env = |k: &str, d: u64| -> u64 {
        std::env::var(k)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(d)
    };
    let seeds = env("KVT_SIM_SEEDS", 60);
    let first = env("KVT_SIM_FIRST_SEED", 0);
    let mut total = Cover::default();
    let steps = steps();
    for c in kvt_seeds::run_seeds(first, seeds, |seed| run_seed(seed, steps)) {
        total.add(c);
    }
    // The run must actually exercise what it is for.
    assert!(
        total.crashes >= seeds,
        "only {} crashes in {seeds} seeds",
        total.crashes
    );
    assert!(total.sectors_written > seeds * 100, "only {total:?}");
    if seeds >= 50 {
        assert!(
            total.batches > 0 && total.raced > 0 && total.read_faults > 0,
            "concurrency or read faults not exercised: {total:?}"
        );
        assert!(total.scrubbed > 0 && total.commits > 0, "{total:?}");
        assert!(
            total.kv_stores > 0
                && total.kv_evicted > 0
                && total.kv_claimed > 0
                && total.kv_checked > 0
                && total.kv_trimmed > 0,
            "KV not exercised: {total:?}"
        );
        assert!(
            total.resv_checked > 0,
            "reservation records not exercised: {total:?}"
        );
    }
    eprintln!(
        "pool simulation: seeds {first}..{}: {total:?}",
        first + seeds
    );
}

/// Seeds that once found a bug (in the pool or in the simulation's model),
/// run on their own so a change to the many-seed run cannot skip them.
#[test]
fn simulation_regression_seeds() {
    for seed in [4, 37, 149, 306, 1939, 2006] {
        run_seed(seed, steps());
    }
}

/// LMCache never flushes: a chunk it wrote before a target crash may come back
/// in part. On an `unwritten = "error"` volume every block of it must then read
/// as its data or as a miss ("deallocated or unwritten"), never as zeros a
/// client would take for a hit; on a zeroes volume the lost blocks read as
/// zeros (why LMCache's volumes want "error"). A FUA chunk (what a namespace
/// with `write_cache = false` sends) and a flushed one come back whole.
#[test]
fn an_unflushed_chunk_after_a_crash_reads_as_data_or_misses() {
    // Chunks of 3 extents and 3 blocks at A, B and C: flushed, FUA, unflushed.
    const CHUNK: u64 = 3 * EXTENT + 3 * 4096;
    const A: u64 = 0;
    const B: u64 = 4 * EXTENT;
    const C: u64 = 8 * EXTENT;
    let mut misses = 0u64;
    for seed in 0..24u64 {
        let fault = FaultDevice::new(1_200_000 + 40 * EXTENT);
        let dev: SharedDevice = Arc::new(FaultHandle(fault.clone()));
        let fo = FormatOptions {
            extent_size: EXTENT,
            force: false,
            journal_len: Some(96 << 10),
            // The 1,024 of format 2: this small device's room.
            max_volumes: Some(1024),
        };
        format(&dev, &fo).unwrap();
        let pool = Pool::open("lmc", dev.clone(), pool_opts(false)).unwrap();
        pool.create_volume("err", 12 * EXTENT, 4096, VOL_UNWRITTEN_ERROR)
            .unwrap();
        pool.create_volume("zero", 12 * EXTENT, 4096, 0).unwrap();
        let now = Instant::now();
        let run = |ch: &mut PoolChannel, vol: &str, op: IoOp| -> IoCompletion {
            let id = pool.volume(vol).unwrap().desc.id;
            ch.submit_lane(id, 1, op, now).map_err(|(_, e)| e).unwrap();
            ch.flush_submissions();
            // Metadata steps only when the channel waits for one (a reserved
            // extent): a step commits pending mappings, and the unflushed
            // chunk must stay uncommitted until the crash.
            let mut out = Vec::new();
            for i in 0..100_000 {
                if i % 64 == 63 {
                    pool.md_step(now);
                }
                ch.poll(&mut out, now);
                if let Some(c) = out.pop() {
                    return c;
                }
            }
            panic!("seed {seed}: {vol}: no completion");
        };
        let data = |tag: u64, len: u64| {
            let mut b = sized(len as usize);
            for (i, s) in b.chunks_mut(SECTOR as usize).enumerate() {
                sector_bytes(tag, i as u64, s);
            }
            b
        };
        let write = |ch: &mut PoolChannel, vol: &str, at: u64, tag: u64, fua: bool| {
            let c = run(
                ch,
                vol,
                IoOp::Write {
                    offset: at,
                    buf: data(tag, CHUNK),
                    fua,
                },
            );
            assert_eq!(c.result, Ok(()), "seed {seed}: write {vol}");
        };
        let mut ch = PoolChannel::on_reactor(pool.clone(), 0).unwrap();
        // A Flush or a FUA write commits the whole pool: the unflushed chunks
        // go last.
        for vol in ["err", "zero"] {
            write(&mut ch, vol, A, 1, false);
        }
        assert_eq!(run(&mut ch, "err", IoOp::Flush).result, Ok(()));
        for vol in ["err", "zero"] {
            write(&mut ch, vol, B, 3, true);
        }
        for vol in ["err", "zero"] {
            write(&mut ch, vol, C, 2, false);
        }
        drop(ch);
        drop(pool);
        fault.crash(&mut SimRng(seed));
        let pool = Pool::open("lmc", dev.clone(), pool_opts(false)).unwrap();
        let mut ch = PoolChannel::on_reactor(pool.clone(), 0).unwrap();
        for vol in ["err", "zero"] {
            for (at, tag, must_survive) in [(A, 1, true), (B, 3, true), (C, 2, false)] {
                let want = data(tag, CHUNK);
                for b in 0..CHUNK / 4096 {
                    let off = b * 4096;
                    let id = pool.volume(vol).unwrap().desc.id;
                    ch.submit_lane(
                        id,
                        1,
                        IoOp::Read {
                            offset: at + off,
                            buf: sized(4096),
                        },
                        now,
                    )
                    .map_err(|(_, e)| e)
                    .unwrap();
                    ch.flush_submissions();
                    let mut out = Vec::new();
                    while out.is_empty() {
                        ch.poll(&mut out, now);
                    }
                    let c = out.remove(0);
                    let expect = &want[off as usize..off as usize + 4096];
                    match (c.result, c.buf) {
                        (Ok(()), Some(got)) if &got[..] == expect => {}
                        (Err(ERRNO_UNWRITTEN), _) if vol == "err" && !must_survive => {
                            misses += 1;
                        }
                        (Ok(()), Some(got))
                            if vol == "zero" && !must_survive && got.iter().all(|&x| x == 0) => {}
                        (r, _) => panic!(
                            "seed {seed}: {vol} chunk {tag} block {b}: {r:?} (survives: {must_survive})"
                        ),
                    }
                }
            }
        }
    }
    // The crashes lost unflushed blocks (or the test showed nothing).
    assert!(misses > 0, "no crash lost a block of the unflushed chunk");
}

/// The periodic group commit takes KV-only changes too: a Delete (or a Store
/// over blocks already written) dirties no extent, only the key index, and
/// once stayed uncommitted until a Flush.
#[test]
fn the_periodic_commit_journals_kv_only_changes() {
    // Seed 11: a KV seed (11 % 8 == 3) with the periodic commit on (11 % 3 != 0).
    let mut sim = Sim::new(11);
    assert!(sim.timed && sim.kv.is_some());
    while sim.kv_index().locations().is_empty() {
        sim.kv_store();
    }
    assert!(sim.kv_flush());
    let (key, _) = sim.kv_index().locations()[0];
    let commits = sim.pool().snapshot().commits;
    assert!(sim.kv_index().delete(&key, sim.now).is_ok());
    let pool = sim.pool();
    // The interval counts from the first step after the last commit.
    pool.md_step(sim.now);
    sim.now += Duration::from_secs(3);
    pool.md_step(sim.now);
    assert!(pool.snapshot().commits > commits, "no periodic commit");
    drop(pool);
    sim.fault.crash(&mut sim.rng);
    sim.reactors.iter_mut().for_each(|r| *r = None);
    sim.pool = None;
    let pool = match Pool::open("sim", sim.dev.clone(), pool_opts(true)) {
        Ok(p) => p,
        Err(e) => panic!("recovery: {e}"),
    };
    let ix = pool
        .volume(KV_VOL)
        .and_then(|v| v.kv.clone())
        .expect("the KV volume");
    assert!(
        !ix.locations().iter().any(|(k, _)| *k == key),
        "the deleted {key:?} came back"
    );
}

/// A Store whose value write and key land while a commit drains (after its
/// KV keys, before its extents) is journaled with its blocks' valid bits or
/// not at all: `check` on what the commit wrote finds no key naming a block
/// without data. Draining the extents first put the key in this commit and
/// its bits in the next, and a SIGKILL between the two left that damage
/// (tests/kv.rs' SIGKILL test, 3 runs in 21 under load).
#[test]
fn a_store_completing_during_a_commit_is_journaled_with_its_blocks() {
    use super::lock;
    let fault = FaultDevice::new(1_200_000 + 40 * EXTENT);
    let dev: SharedDevice = Arc::new(FaultHandle(fault));
    let fo = FormatOptions {
        extent_size: EXTENT,
        force: false,
        journal_len: Some(96 << 10),
        max_volumes: Some(1024),
    };
    format(&dev, &fo).unwrap();
    let pool = Pool::open("kvc", dev.clone(), pool_opts(false)).unwrap();
    pool.create_volume(KV_VOL, 4 * EXTENT, KV_BS as u32, VOL_KV)
        .unwrap();
    let vol = pool.volume(KV_VOL).unwrap();
    let ix = vol.kv.clone().unwrap();
    let now = Instant::now();
    let opts = StoreOptions::default();
    let reserve = |k: &KvKey| match ix.reserve(k, KV_BS as u32, opts, now) {
        Ok(Reserve::Ready(loc)) => loc,
        other => panic!("reserve: {other:?}"),
    };
    // Key A through the channel: its write maps extent 0; committed.
    let a = KvKey::new(b"a").unwrap();
    let loc_a = reserve(&a);
    let mut ch = PoolChannel::on_reactor(pool.clone(), 0).unwrap();
    let op = IoOp::Write {
        offset: loc_a.block * KV_BS,
        buf: sized(KV_BS as usize),
        fua: false,
    };
    ch.submit_lane(vol.desc.id, 1, op, now)
        .map_err(|(_, e)| e)
        .unwrap();
    ch.flush_submissions();
    let mut out = Vec::new();
    for i in 0..100_000 {
        if i % 64 == 63 {
            pool.md_step(now);
        }
        ch.poll(&mut out, now);
        if !out.is_empty() {
            break;
        }
    }
    assert!(
        matches!(out.pop(), Some(c) if c.result.is_ok()),
        "A's write"
    );
    ix.commit_store(&a, loc_a, opts, now).unwrap();
    pool.commit(&mut lock(&pool.meta), Vec::new()).unwrap();
    // Key B in the same extent, its write done and its key stored while
    // the next commit drains.
    let b = KvKey::new(b"b").unwrap();
    let loc_b = reserve(&b);
    let bpe = (EXTENT / KV_BS) as u32;
    let lext = (loc_b.block / bpe as u64) as u32;
    assert_eq!(lext, 0, "B shares A's extent: {loc_b:?}");
    let (v, i) = (vol.clone(), ix.clone());
    super::commit::BETWEEN_DRAINS.with(|h| {
        *h.borrow_mut() = Some(Box::new(move || {
            v.set_valid(lext, (loc_b.block % bpe as u64) as u32, loc_b.nblocks);
            i.commit_store(&b, loc_b, opts, now).unwrap();
        }));
    });
    pool.commit(&mut lock(&pool.meta), Vec::new()).unwrap();
    assert!(
        super::commit::BETWEEN_DRAINS.with(|h| h.borrow().is_none()),
        "the commit ran the Store between its drains"
    );
    drop(ch);
    drop(pool);
    let rep = check(&dev);
    assert!(
        rep.damage.is_empty(),
        "{:?}\n{}",
        rep.damage,
        rep.lines.join("\n")
    );
}
