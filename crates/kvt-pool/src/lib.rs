//! Pools and thin-provisioned KV-cache volumes.
//!
//! A pool is one backing device cut into fixed-size extents. Volumes map logical
//! extents to physical ones on first write. The data path (reactors, through
//! `VolumeChannel`) touches only atomics and lock-free queues: per-reactor caches
//! of clean, already-reserved extents, refilled in batches from a shared ready
//! queue. Everything that writes metadata runs on the pool's metadata thread
//! (`md_step`): journal commits for Flush/FUA, reservations of clean extents,
//! background GC scrubbing freed extents under admission control, checkpoints.
//! The simulation calls `md_step` itself, single-threaded, so a seed reproduces.
//!
//! Crash safety rests on four orderings:
//! - clean extents are journaled as reserved (durably) before any reactor may
//!   write to them, so after a crash an unreferenced written extent is dirty;
//! - an extent's unmap is journaled no later than the commit that records it
//!   scrubbed, and the scrub is flushed before that commit;
//! - a Flush journals every extent changed before it, then flushes the device,
//!   which also makes every completed data write durable;
//! - journal space is reused only after a newer checkpoint is durable.
//!
//! The on-disk side (superblock, journal records, checkpoints, recovery, the
//! offline check) is `kvt_meta`, below this layer. Here: the `Pool` and its
//! open/close (this file), the extent allocator (`alloc`), the volume registry
//! (`registry`), the metadata thread's step (`md`) and its commits and
//! checkpoints (`commit`), volumes and their channels (`volume`, `channel`),
//! GC admission (`gc`), KV indexes (`kv`), and live checks (`verify`).

mod alloc;
pub mod channel;
mod commit;
mod epoch;
pub mod format;
pub mod gc;
pub mod kv;
pub mod kv_index;
pub mod kv_owner;
mod lock;
mod md;
mod notifier;
mod options;
mod registry;
mod resv;
mod verify;
pub mod volume;

#[cfg(test)]
mod journal_end;
#[cfg(test)]
mod sim;

use crossbeam_queue::{ArrayQueue, SegQueue};
use format::*;
use gc::{Admission, GcMode, GcSettings};
use kvt_bdev::{IoOp, SharedDevice};
pub use kvt_meta::format::format;
pub use kvt_meta::image;
use kvt_meta::image::Image;
use kvt_meta::pool_tag;
pub use kvt_meta::{check, load_image, CheckReport, FormatOptions, RecoveryReport};
use kvt_wire::ident::stable_uuid;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock, Weak};
use std::time::{Duration, Instant};
use volume::Volume;

pub use kvt_bdev::sync_io::{SyncIo, SyncIoError};
pub use kvt_meta::error::{self, PoolError};
pub use lock::{lock_pool, PoolLock};
use md::md_round;
pub use md::{plan_md_step, MdInputs, MdPlan};
use notifier::CommitReq;
pub use notifier::Notifier;
pub use options::{DualPath, PoolOptions, DEFAULT_COMMIT_INTERVAL};
pub use resv::ResvDone;
use resv::ResvReq;

fn io_err(errno: i32) -> String {
    kvt_bdev::sync_io::errno_text(errno)
}

/// Metadata-thread state: owned by whoever holds the lock (the md thread, a
/// control-path call, or the simulation).
struct Meta {
    io: SyncIo,
    clean: VecDeque<u32>,
    dirty: Vec<u32>,
    seq: u64,
    head: u64,
    used: u64,
    ckpt_gen: u64,
    next_volume_id: u32,
    pending: Vec<Record>,
    /// When the last journal commit happened (None: since the last step).
    last_commit: Option<Instant>,
    failed: Option<String>,
    admission: Admission,
    /// Scrubbed extents waiting for the flush and Clean record that make them
    /// clean (still dirty after a crash).
    scrubbed: Vec<u32>,
    scrubbed_since: Option<Instant>,
    /// Foreground operations and latency sum (ns) at the last step.
    fg_seen: (u64, u64),
}

/// Counters the metrics work reads.
#[derive(Debug, Default)]
pub struct PoolStats {
    pub clean: AtomicU64,
    pub dirty: AtomicU64,
    pub commits: AtomicU64,
    pub checkpoints: AtomicU64,
    /// The last commit's and checkpoint's wall time (ns) and the last
    /// checkpoint's bytes (bench/run-scale.sh reads them).
    pub last_commit_ns: AtomicU64,
    pub last_checkpoint_ns: AtomicU64,
    pub last_checkpoint_bytes: AtomicU64,
    pub journal_used: AtomicU64,
    pub gc_scrubbed: AtomicU64,
    pub gc_rate_milli: AtomicU64,
    pub gc_mode: AtomicU64,
    pub alloc_waits: AtomicU64,
    pub no_space: AtomicU64,
}

/// A point-in-time view of a pool for `kvtarget` tools and metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolSnapshot {
    pub extent_size: u64,
    pub extents: u32,
    pub mapped: u64,
    pub clean: u64,
    pub dirty: u64,
    pub reserved: u64,
    pub gc_mode: GcMode,
    pub gc_rate: f64,
    pub gc_scrubbed: u64,
    pub low_watermark: u64,
    pub high_watermark: u64,
    pub journal_used: u64,
    pub journal_len: u64,
    pub commits: u64,
    pub checkpoints: u64,
}

/// How many extents a reactor takes from the ready queue at once.
const CACHE_BATCH: usize = 8;
const CACHE_CAP: usize = 32;
/// Flush/FUA commit requests queued for the metadata thread without
/// allocating: one per Flush or FUA write in flight, so 4096 covers four
/// reactors' queues of depth 1024 with every command a Flush (a group commit
/// answers them all at once).
const COMMITS_QUEUED: usize = 4096;
/// Extents kept reserved and ready for first writes.
const READY_TARGET: usize = 64;

pub struct Pool {
    pub name: String,
    pub sb: Superblock,
    /// Names this pool's shared per-reactor channel (`BlockDevice::shared_channel`).
    pub channel_key: u64,
    dev: SharedDevice,
    pool_tag: u64,
    volumes: RwLock<BTreeMap<u32, Arc<Volume>>>,
    meta: Mutex<Meta>,
    ready: ArrayQueue<u32>,
    caches: Vec<ArrayQueue<u32>>,
    freed: SegQueue<u32>,
    retry_free: SegQueue<(u32, u32)>,
    /// Flush/FUA commit requests for the metadata thread; past its
    /// `COMMITS_QUEUED` slots they go to `commits_overflow` (which allocates).
    commits: ArrayQueue<CommitReq>,
    commits_overflow: SegQueue<CommitReq>,
    /// Reservation records for the metadata thread (`persist_reservation`).
    resv_reqs: SegQueue<ResvReq>,
    waiters: Mutex<Vec<Weak<Notifier>>>,
    /// A wake for the metadata thread is pending: set by `wake_md` (from
    /// reactors, on Flush/FUA) before it unparks the thread, taken by the
    /// thread before it parks, so no wake is lost and none takes a lock.
    md_wake: AtomicBool,
    /// The metadata thread, as it registered itself on its first round.
    md_parker: OnceLock<std::thread::Thread>,
    stop: AtomicBool,
    md_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    exhausted: AtomicBool,
    /// Metadata can no longer be written: allocations fail.
    failed: AtomicBool,
    /// Operator pause of background GC (urgent scrubbing still happens).
    gc_paused: AtomicBool,
    /// A shared pool's owner epoch (`epoch`): 0 for a pool of one node.
    owner_epoch: u64,
    /// A newer owner's epoch refused a commit.
    superseded: AtomicBool,
    pub stats: PoolStats,
    pub opts: PoolOptions,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// The live volumes of a recovered image, refused when the image is damaged
/// (an extent mapped twice or both mapped and free, a KV key out of place).
fn restore_volumes(
    img: &Image,
    extent_size: u64,
    dev: &SharedDevice,
) -> Result<BTreeMap<u32, Arc<Volume>>, PoolError> {
    let (_, mut problems) = img.ownership();
    problems.extend(img.kv_problems());
    problems.extend(img.resv_problems());
    if let Some(p) = img.problems.iter().chain(problems.iter()).next() {
        return Err(PoolError::Damaged {
            dev: dev.describe(),
            problem: p.clone(),
        });
    }
    let mut volumes = BTreeMap::new();
    for (id, v) in &img.volumes {
        let vol = Volume::new(v.desc.clone(), extent_size);
        vol.set_reservation(v.resv.clone());
        for (&lext, (phys, bm)) in &v.map {
            vol.restore(lext, Some(*phys), bm);
        }
        if let Some(kv) = &vol.kv {
            kv.restore_all(&v.kv)
                .map_err(|problem| PoolError::Damaged {
                    dev: dev.describe(),
                    problem,
                })?;
        }
        volumes.insert(*id, Arc::new(vol));
    }
    Ok(volumes)
}

/// Shared-channel keys: their own space (bit 48 set), apart from the
/// namespace keys a reactor's channel cache also holds.
fn next_channel_key() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) | 1 << 48
}

impl Meta {
    /// The metadata state of a pool recovered as `img` and `rep` say, writing
    /// through `io`.
    fn recovered(io: SyncIo, img: &Image, rep: &RecoveryReport, gc: GcSettings) -> Meta {
        Meta {
            io,
            clean: img.clean.iter().copied().collect(),
            dirty: img.dirty(),
            seq: rep.end_seq,
            head: rep.end_pos,
            used: 0,
            ckpt_gen: rep.checkpoint_gen,
            next_volume_id: img.next_volume_id.max(1),
            pending: Vec::new(),
            last_commit: None,
            failed: None,
            admission: Admission::new(gc),
            scrubbed: Vec::new(),
            scrubbed_since: None,
            fg_seen: (0, 0),
        }
    }
}

/// Logs what recovering pool `name` found (a warning if the journal did not
/// end cleanly).
fn log_recovery(name: &str, dev: &SharedDevice, rep: &RecoveryReport) {
    if rep.journal_end.is_clean() {
        tracing::info!(pool = name, dev = %dev.describe(), checkpoint = rep.checkpoint_gen, entries = rep.journal_entries, records = rep.journal_records, end = %rep.journal_end, "pool recovered");
    } else {
        tracing::warn!(pool = name, dev = %dev.describe(), checkpoint = rep.checkpoint_gen, entries = rep.journal_entries, records = rep.journal_records, end = %rep.journal_end, "pool recovered");
    }
}

impl Pool {
    /// Opens a pool: loads the newest checkpoint, replays the journal, writes a
    /// fresh checkpoint, and starts the metadata thread.
    pub fn open(name: &str, dev: SharedDevice, opts: PoolOptions) -> Result<Arc<Pool>, PoolError> {
        Pool::open_inner(name, dev, opts, None)
    }

    /// `open`, and for a shared pool's owner (`owner`: epoch and node) the
    /// epoch written after recovery, before the fresh checkpoint.
    fn open_inner(
        name: &str,
        dev: SharedDevice,
        opts: PoolOptions,
        owner: Option<(u64, &str)>,
    ) -> Result<Arc<Pool>, PoolError> {
        let mut io = SyncIo::new(&dev)?;
        if let Some((epoch, node)) = owner {
            // The epoch before recovery: every commit the old owner tries
            // after it is refused, so recovery sees all it committed.
            let sb = Superblock::decode(&io.read(0, META_BLOCK as usize)?)
                .map_err(|e| PoolError::from(e).on(dev.describe()))?;
            Pool::write_epoch(name, &mut io, &sb, epoch, node)?;
        }
        let (sb, img, rep) =
            load_image(&mut io, dev.size_bytes()).map_err(|e| e.on(dev.describe()))?;
        log_recovery(name, &dev, &rep);
        let volumes = restore_volumes(&img, sb.extent_size, &dev)?;
        let reactors = opts.reactors.max(1);
        let gc = opts.gc.clone();
        let pool = Arc::new(Pool {
            channel_key: next_channel_key(),
            name: name.to_string(),
            pool_tag: pool_tag(&sb.uuid),
            volumes: RwLock::new(volumes),
            meta: Mutex::new(Meta::recovered(io, &img, &rep, gc)),
            ready: ArrayQueue::new(READY_TARGET * 2),
            caches: (0..reactors).map(|_| ArrayQueue::new(CACHE_CAP)).collect(),
            freed: SegQueue::new(),
            retry_free: SegQueue::new(),
            commits: ArrayQueue::new(COMMITS_QUEUED),
            commits_overflow: SegQueue::new(),
            resv_reqs: SegQueue::new(),
            waiters: Mutex::new(Vec::new()),
            md_wake: AtomicBool::new(false),
            md_parker: OnceLock::new(),
            stop: AtomicBool::new(false),
            md_thread: Mutex::new(None),
            exhausted: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            gc_paused: AtomicBool::new(false),
            owner_epoch: owner.map_or(0, |(e, _)| e),
            superseded: AtomicBool::new(false),
            stats: PoolStats::default(),
            opts,
            sb,
            dev,
        });
        {
            // A fresh checkpoint makes recovery's conclusions (reserved extents
            // are dirty) durable and empties the journal.
            let mut m = lock(&pool.meta);
            pool.checkpoint(&mut m)?;
            pool.update_stats(&m);
        }
        if pool.opts.md_thread {
            pool.start_md_thread()?;
        }
        Ok(pool)
    }

    /// Starts the pool's metadata thread (commits, checkpoints, GC rounds).
    fn start_md_thread(self: &Arc<Pool>) -> Result<(), PoolError> {
        let weak = Arc::downgrade(self);
        let h =
            kvt_reactor::spawn_worker(format!("md-{}", self.name), move |now| md_round(&weak, now))
                .map_err(|e| PoolError::Thread {
                    reason: e.to_string(),
                })?;
        *lock(&self.md_thread) = Some(h);
        Ok(())
    }

    pub fn device(&self) -> &SharedDevice {
        &self.dev
    }

    pub fn request_commit(&self, tag: u64, to: Arc<Notifier>) {
        if let Err(r) = self.commits.push(CommitReq { tag, to }) {
            self.commits_overflow.push(r);
        }
        self.wake_md();
    }

    /// The next commit request the metadata thread answers.
    fn pop_commit(&self) -> Option<CommitReq> {
        self.commits.pop().or_else(|| self.commits_overflow.pop())
    }

    pub fn register_waiter(&self, n: &Arc<Notifier>) {
        let mut w = lock(&self.waiters);
        w.retain(|x| x.strong_count() > 0);
        w.push(Arc::downgrade(n));
    }

    /// Wakes the metadata thread (no lock: reactors call it on Flush/FUA).
    pub fn wake_md(&self) {
        // AcqRel: a thread that took the wake (`md_idle`) before this swap
        // registered itself before, so `md_parker` is set by then.
        if !self.md_wake.swap(true, Ordering::AcqRel) {
            if let Some(t) = self.md_parker.get() {
                t.unpark();
            }
        }
    }

    /// Makes every acknowledged change durable now (control path, tests).
    pub fn sync(&self) -> Result<(), PoolError> {
        let mut m = lock(&self.meta);
        self.commit(&mut m, Vec::new())
    }

    /// Pauses or resumes background GC (below the low watermark it runs anyway).
    pub fn set_gc_paused(&self, paused: bool) {
        self.gc_paused.store(paused, Ordering::Relaxed);
        self.wake_md();
    }

    /// Changes GC admission settings at run time (RPC). Only the fields given
    /// change.
    pub fn set_gc_settings(
        &self,
        max_rate: Option<f64>,
        max_foreground_qd: Option<u64>,
        low_watermark_pct: Option<u64>,
        high_watermark_pct: Option<u64>,
    ) -> Result<(), PoolError> {
        let mut m = lock(&self.meta);
        let mut g = m.admission.s.clone();
        if let Some(r) = max_rate {
            if !(r.is_finite() && r >= 1.0) {
                return Err(PoolError::GcMaxRate);
            }
            g.max_rate = r;
        }
        if let Some(q) = max_foreground_qd {
            g.max_foreground_qd = q;
        }
        if let Some(l) = low_watermark_pct {
            g.low_watermark_pct = l;
        }
        if let Some(h) = high_watermark_pct {
            g.high_watermark_pct = h;
        }
        if g.low_watermark_pct > 50
            || g.high_watermark_pct > 90
            || g.low_watermark_pct > g.high_watermark_pct
        {
            return Err(PoolError::GcWatermarks {
                low: g.low_watermark_pct,
                high: g.high_watermark_pct,
            });
        }
        m.admission.rate = m.admission.rate.min(g.max_rate);
        m.admission.s = g;
        Ok(())
    }

    /// Current GC admission settings.
    pub fn gc_settings(&self) -> GcSettings {
        lock(&self.meta).admission.s.clone()
    }

    pub fn gc_paused(&self) -> bool {
        self.gc_paused.load(Ordering::Relaxed)
    }

    pub fn snapshot(&self) -> PoolSnapshot {
        let m = lock(&self.meta);
        let mapped: u64 = self.volumes().iter().map(|v| v.mapped().len() as u64).sum();
        let reserved =
            self.ready.len() as u64 + self.caches.iter().map(|c| c.len() as u64).sum::<u64>();
        let (low, high) = m.admission.watermarks(self.sb.extent_count as u64);
        PoolSnapshot {
            extent_size: self.sb.extent_size,
            extents: self.sb.extent_count,
            mapped,
            clean: m.clean.len() as u64,
            dirty: m.dirty.len() as u64 + m.scrubbed.len() as u64 + self.freed.len() as u64,
            reserved,
            gc_mode: m.admission.mode,
            gc_rate: m.admission.rate,
            gc_scrubbed: self.stats.gc_scrubbed.load(Ordering::Relaxed),
            low_watermark: low,
            high_watermark: high,
            journal_used: m.used,
            journal_len: self.sb.journal_len,
            commits: self.stats.commits.load(Ordering::Relaxed),
            checkpoints: self.stats.checkpoints.load(Ordering::Relaxed),
        }
    }

    fn update_stats(&self, m: &Meta) {
        let s = &self.stats;
        s.clean.store(m.clean.len() as u64, Ordering::Relaxed);
        s.dirty
            .store((m.dirty.len() + m.scrubbed.len()) as u64, Ordering::Relaxed);
        s.journal_used.store(m.used, Ordering::Relaxed);
        s.gc_rate_milli
            .store((m.admission.rate * 1000.0) as u64, Ordering::Relaxed);
        s.gc_mode.store(m.admission.mode as u64, Ordering::Relaxed);
        let exhausted = m.clean.is_empty()
            && m.dirty.is_empty()
            && m.scrubbed.is_empty()
            && self.freed.is_empty()
            && self.ready.is_empty();
        self.exhausted.store(exhausted, Ordering::Release);
        self.failed.store(m.failed.is_some(), Ordering::Release);
    }

    /// Stops the metadata thread and leaves the pool clean: unused reserved
    /// extents go back to the clean list and a final checkpoint is written.
    /// Call when no channel is open any more.
    pub fn close(&self) -> Result<(), PoolError> {
        self.stop.store(true, Ordering::Release);
        self.wake_md();
        if let Some(h) = lock(&self.md_thread).take() {
            let _ = h.join();
        }
        let mut m = lock(&self.meta);
        while let Some(p) = self.freed.pop() {
            m.dirty.push(p);
        }
        while let Some(p) = self.ready.pop() {
            m.clean.push_back(p);
        }
        for c in &self.caches {
            while let Some(p) = c.pop() {
                m.clean.push_back(p);
            }
        }
        if m.failed.is_some() {
            return Err(PoolError::ReadOnly {
                pool: self.name.clone(),
                cause: m.failed.clone().unwrap_or_default(),
            });
        }
        self.commit(&mut m, Vec::new())?;
        self.checkpoint(&mut m)?;
        Ok(())
    }
}
