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
//! `KVT_SIM_SEEDS=N` sets how many seeds run (default 60; CI runs thousands in the `sim` profile);
//! `KVT_SIM_SEED=S` runs one seed. A failure names its seed.

use super::channel::VolumeChannel;
use super::format::VOL_UNWRITTEN_ERROR;
use super::gc::GcSettings;
use super::{check, format, FormatOptions, Pool, PoolOptions};
use crate::bdev::fault::{FaultDevice, FaultHandle, SimRng};
use crate::bdev::{IoChannel, IoCompletion, IoOp, SharedDevice, ERRNO_NO_SPACE, ERRNO_UNWRITTEN};
use crate::mem::IoBuf;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

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
    channels: BTreeMap<String, VolumeChannel>,
    next_value: u64,
    crashes: u64,
    log: Vec<String>,
    /// Simulated time: starts at a real instant (the one clock read) and
    /// moves only when the simulation says so.
    now: Instant,
    /// A create or resize that failed mid-commit: settled after the crash.
    pending_create: Option<(String, MVol)>,
    pending_resize: Option<(String, u64)>,
}

fn pool_opts() -> PoolOptions {
    PoolOptions {
        md_thread: false,
        reactors: 1,
        gc: GcSettings {
            fixed_batch: Some(3),
            ..GcSettings::default()
        },
        commit_interval: None,
        ..PoolOptions::default()
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
            },
        )
        .unwrap_or_else(|e| panic!("seed {seed}: format: {e}"));
        let pool = Pool::open("sim", dev.clone(), pool_opts())
            .unwrap_or_else(|e| panic!("seed {seed}: open: {e}"));
        Sim {
            seed,
            rng: SimRng(seed),
            fault,
            dev,
            pool: Some(pool),
            model: BTreeMap::new(),
            channels: BTreeMap::new(),
            next_value: 1,
            crashes: 0,
            log: Vec::new(),
            now: Instant::now(),
            pending_create: None,
            pending_resize: None,
        }
    }

    fn fail(&self, msg: String) -> ! {
        let tail: Vec<_> = self.log.iter().rev().take(400).rev().cloned().collect();
        panic!(
            "seed {}: {msg}\nlast operations:\n  {}\nreproduce: KVT_SIM_SEED={} cargo test pool::sim",
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

    fn channel(&mut self, name: &str) -> &mut VolumeChannel {
        if !self.channels.contains_key(name) {
            let pool = self.pool();
            let Some(vol) = pool.volume(name) else {
                self.fail(format!("volume {name} missing"))
            };
            let ch = VolumeChannel::for_volume(pool, vol)
                .unwrap_or_else(|e| panic!("seed {}: channel: {e}", self.seed));
            self.channels.insert(name.to_string(), ch);
        }
        match self.channels.get_mut(name) {
            Some(c) => c,
            None => unreachable!(),
        }
    }

    /// Submits one operation and drives channel and metadata steps until it ends.
    fn run(&mut self, name: &str, op: IoOp) -> IoCompletion {
        let pool = self.pool();
        let now = self.now;
        let ch = self.channel(name);
        let _ = ch.submit(7, op, now);
        ch.flush_submissions();
        for _ in 0..10_000 {
            let mut out = Vec::new();
            ch.poll(&mut out, now);
            if let Some(c) = out.pop() {
                return c;
            }
            pool.md_step(now);
        }
        self.fail(format!("an operation on {name} never completed"))
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
        match roll {
            0..=5 => self.create(),
            6..=7 => self.delete(),
            8..=10 => self.resize(),
            11..=45 => self.write(),
            46..=65 => self.read(),
            66..=74 => self.deallocate(false),
            75..=78 => self.deallocate(true),
            79..=89 => self.flush(),
            90..=93 => self.gc_steps(),
            _ => self.crash(),
        }
        if self.fault.tripped() {
            self.crash();
        }
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
        self.channels.remove(&name);
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
        self.channels.remove(&name);
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

    fn gc_steps(&mut self) {
        self.log.push("metadata steps".into());
        let pool = self.pool();
        for _ in 0..1 + self.rng.below(4) {
            pool.md_step(self.now);
        }
    }

    fn crash(&mut self) {
        self.crashes += 1;
        self.log.push("crash".into());
        self.channels.clear();
        self.pool = None;
        self.fault.crash(&mut self.rng);
        self.recover();
    }

    fn recover(&mut self) {
        let rep = check(&self.dev);
        if !rep.damage.is_empty() {
            self.fail(format!(
                "check after crash: {:?}\n{}",
                rep.damage,
                rep.lines.join("\n")
            ));
        }
        let pool = match Pool::open("sim", self.dev.clone(), pool_opts()) {
            Ok(p) => p,
            Err(e) => self.fail(format!("recovery: {e}")),
        };
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
        for v in pool.volumes() {
            if !self.model.contains_key(&v.desc.name) {
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
        let names: Vec<String> = self.model.keys().cloned().collect();
        self.channels.clear();
        let pool = self.pool();
        for n in names {
            if let Err(e) = pool.delete_volume(&n) {
                self.fail(format!("final delete {n}: {e}"));
            }
            self.model.remove(&n);
        }
        for _ in 0..1000 {
            pool.md_step(self.now);
            let s = pool.snapshot();
            if s.dirty == 0 {
                break;
            }
        }
        let s = pool.snapshot();
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

fn run_seed(seed: u64, steps: usize) -> (u64, u64) {
    let mut sim = Sim::new(seed);
    for _ in 0..steps {
        sim.step();
    }
    // A last crash without a flush, then the final accounting.
    sim.crash();
    sim.drain();
    (sim.crashes, sim.next_value)
}

#[test]
fn simulation_over_many_seeds() {
    if let Ok(s) = std::env::var("KVT_SIM_SEED") {
        let seed: u64 = s
            .parse()
            .unwrap_or_else(|_| panic!("KVT_SIM_SEED={s} is not a number"));
        run_seed(seed, 400);
        return;
    }
    let seeds: u64 = std::env::var("KVT_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let (mut crashes, mut writes) = (0, 0);
    for seed in 0..seeds {
        let (c, w) = run_seed(seed, 150);
        crashes += c;
        writes += w;
    }
    // The run must actually exercise crashes and data.
    assert!(crashes >= seeds, "only {crashes} crashes in {seeds} seeds");
    assert!(writes > seeds * 100, "only {writes} sectors written");
    eprintln!("pool simulation: {seeds} seeds, {crashes} crashes, {writes} sector versions");
}
