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

pub mod channel;
pub mod format;
pub mod gc;
pub mod image;
pub mod kv;
pub mod volume;

#[cfg(test)]
mod sim;

use crate::bdev::{IoOp, SharedDevice};
use crate::ident::stable_uuid;
use crate::reactor::sys::EventFd;
use crossbeam_queue::{ArrayQueue, SegQueue};
use format::*;
use gc::{Admission, GcMode, GcSettings};
use image::Image;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, Weak};
use std::time::{Duration, Instant};
use volume::{AllocError, Volume};

pub mod error;
pub use crate::bdev::sync_io::{SyncIo, SyncIoError};
pub use error::PoolError;

fn io_err(errno: i32) -> String {
    crate::bdev::sync_io::errno_text(errno)
}

/// How a channel hears back from the metadata thread.
pub struct Notifier {
    /// Tags whose commit (Flush, FUA) finished, with the result.
    pub committed: SegQueue<(u64, Result<(), i32>)>,
    /// Set when new clean extents became available.
    pub space: AtomicBool,
    pub efd: Option<EventFd>,
    /// Set with every signal, so polling reads the eventfd only when needed.
    signaled: AtomicBool,
}

impl Notifier {
    pub fn new() -> Notifier {
        Notifier {
            committed: SegQueue::new(),
            space: AtomicBool::new(false),
            efd: EventFd::new().ok(),
            signaled: AtomicBool::new(false),
        }
    }
    fn signal(&self) {
        self.signaled.store(true, Ordering::Release);
        if let Some(e) = &self.efd {
            e.signal();
        }
    }
    /// Clears a pending wake-up (one syscall only when there was one).
    pub fn clear(&self) {
        if self.signaled.swap(false, Ordering::AcqRel) {
            if let Some(e) = &self.efd {
                e.drain();
            }
        }
    }
}

impl Default for Notifier {
    fn default() -> Self {
        Notifier::new()
    }
}

struct CommitReq {
    tag: u64,
    to: Arc<Notifier>,
}

/// Options for opening a pool.
#[derive(Debug, Clone)]
pub struct PoolOptions {
    /// Run the metadata thread (false in the simulation, which drives `md_step`).
    pub md_thread: bool,
    /// Number of per-reactor extent caches.
    pub reactors: usize,
    pub gc: GcSettings,
    pub dual_path: DualPath,
    /// Extent changes are committed at least this often without a Flush, which
    /// bounds what a crash can lose and how much memory pending changes take.
    /// `None`: only on Flush/FUA and the metadata thread's own work.
    pub commit_interval: Option<Duration>,
}

/// `PoolOptions::commit_interval` unless configured (`[[pools]] commit_interval_ms`).
pub const DEFAULT_COMMIT_INTERVAL: Duration = Duration::from_secs(1);

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            md_thread: true,
            reactors: 1,
            gc: GcSettings::default(),
            dual_path: DualPath::default(),
            commit_interval: Some(DEFAULT_COMMIT_INTERVAL),
        }
    }
}

/// Dual-path scheduling: I/O at least `large_threshold` bytes is split into
/// `piece` sized device operations with at most `max_inflight` of them in flight
/// per channel; smaller I/O goes straight to the device.
#[derive(Debug, Clone, Copy)]
pub struct DualPath {
    pub enabled: bool,
    pub large_threshold: u64,
    pub piece: u64,
    pub max_inflight: usize,
}

impl Default for DualPath {
    fn default() -> Self {
        DualPath {
            enabled: true,
            large_threshold: 128 << 10,
            piece: 128 << 10,
            max_inflight: 4,
        }
    }
}

/// Options for formatting a pool.
#[derive(Debug, Clone)]
pub struct FormatOptions {
    pub extent_size: u64,
    /// Overwrite a device that already holds a pool.
    pub force: bool,
    /// Journal size override (tests use small journals to exercise wrapping).
    pub journal_len: Option<u64>,
}

impl Default for FormatOptions {
    fn default() -> Self {
        FormatOptions {
            extent_size: 1 << 20,
            force: false,
            journal_len: None,
        }
    }
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
/// Extents kept reserved and ready for first writes.
const READY_TARGET: usize = 64;
/// Largest journal entry.
const MAX_ENTRY: usize = 256 << 10;

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
    commits: SegQueue<CommitReq>,
    waiters: Mutex<Vec<Weak<Notifier>>>,
    md_wake: (Mutex<bool>, Condvar),
    stop: AtomicBool,
    md_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    exhausted: AtomicBool,
    /// Metadata can no longer be written: allocations fail.
    failed: AtomicBool,
    /// Operator pause of background GC (urgent scrubbing still happens).
    gc_paused: AtomicBool,
    pub stats: PoolStats,
    pub opts: PoolOptions,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// Shared-channel keys: their own space (bit 48 set), apart from the
/// namespace keys a reactor's channel cache also holds.
fn next_channel_key() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) | 1 << 48
}

fn pool_tag(uuid: &[u8; 16]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&uuid[..8]);
    u64::from_le_bytes(b)
}

/// What recovery found, for logs and `check`.
#[derive(Debug, Clone, Default)]
pub struct RecoveryReport {
    pub checkpoint_gen: u64,
    pub checkpoint_slot: usize,
    pub other_slot: Option<String>,
    pub journal_entries: u64,
    pub journal_records: u64,
    pub journal_end: String,
    pub end_seq: u64,
    pub end_pos: u64,
    pub replayed_bytes: u64,
}

/// Reads a pool's metadata without changing anything: superblock, the newest
/// valid checkpoint, and the journal replayed to its last valid entry.
/// Runs a metadata read-and-verify once more when it fails: a device can
/// return one read corrupted or from the wrong place, and taking that for
/// the journal's end (or a bad checkpoint) would silently recover an older
/// state. A failure that repeats is the metadata's own (a torn tail).
fn verified<T>(what: &str, mut read: impl FnMut() -> Result<T, PoolError>) -> Result<T, PoolError> {
    match read() {
        Ok(v) => Ok(v),
        Err(first) => match read() {
            Ok(v) => {
                tracing::warn!(
                    "{what}: a read failed verification ({first}); read again, it is good"
                );
                Ok(v)
            }
            Err(e) => Err(e),
        },
    }
}

/// `device_size` is what the device really holds: a superblock claiming
/// more is refused before anything it describes is read.
pub fn load_image(
    io: &mut SyncIo,
    device_size: u64,
) -> Result<(Superblock, Image, RecoveryReport), PoolError> {
    let sb = verified("superblock", || {
        let sbb = io.read(0, META_BLOCK as usize)?;
        Ok(Superblock::decode(&sbb)?)
    })?;
    if sb.device_size > device_size {
        return Err(PoolError::DeviceTooSmall {
            claimed: sb.device_size,
            actual: device_size,
        });
    }
    let tag = pool_tag(&sb.uuid);
    let mut best: Option<(BlockHeader, CheckpointData, usize)> = None;
    let mut errors = Vec::new();
    for slot in 0..2 {
        let off = sb.ckpt_offset + slot as u64 * sb.ckpt_slot_len;
        let r = verified(
            "checkpoint",
            || -> Result<(BlockHeader, CheckpointData), PoolError> {
                let head = io.read(off, META_BLOCK as usize)?;
                let h = BlockHeader::decode(CHECKPOINT_MAGIC, &head, "checkpoint header")?;
                if h.pool_tag != tag {
                    return Err(PoolError::ForeignCheckpoint);
                }
                // Generation g lives in slot g % 2 (format's first one, 1, in
                // slot 0): another slot's valid checkpoint here is a misdirected
                // read, and taking it would recover an older state.
                if h.seq % 2 != slot as u64 && h.seq != 1 {
                    return Err(PoolError::CheckpointMisplaced { gen: h.seq, slot });
                }
                // The head may sit exactly at the ring's end (the next entry wraps).
                if h.journal_pos > sb.journal_len || h.journal_pos % META_BLOCK != 0 {
                    return Err(PoolError::CheckpointJournalPosition {
                        pos: h.journal_pos,
                        len: sb.journal_len,
                    });
                }
                let total = round_up(HEADER_LEN as u64 + h.payload_len, META_BLOCK);
                if total > sb.ckpt_slot_len {
                    return Err(PoolError::CheckpointOverflow { bytes: total });
                }
                let b = io.read(off, total as usize)?;
                let p = unseal(&h, &b, "checkpoint")?;
                Ok((h, CheckpointData::decode(p)?))
            },
        );
        match r {
            Ok((h, c)) => {
                if best.as_ref().map_or(true, |(bh, _, _)| h.seq > bh.seq) {
                    if let Some((bh, _, s)) = &best {
                        errors.push(format!("slot {s}: older checkpoint {}", bh.seq));
                    }
                    best = Some((h, c, slot));
                } else {
                    errors.push(format!("slot {slot}: older checkpoint {}", h.seq));
                }
            }
            Err(e) => errors.push(format!("slot {slot}: {e}")),
        }
    }
    let Some((ch, cdata, slot)) = best else {
        return Err(PoolError::NoCheckpoint {
            detail: errors.join("; "),
        });
    };
    let mut img = Image::from_checkpoint(cdata, sb.extent_size, sb.extent_count);
    let mut rep = RecoveryReport {
        checkpoint_gen: ch.seq,
        checkpoint_slot: slot,
        other_slot: errors.pop(),
        ..Default::default()
    };
    let (mut seq, mut pos) = (ch.journal_seq, ch.journal_pos);
    // Position and byte count before trying the ring's start, to undo the try.
    let mut before_wrap: Option<(u64, u64)> = None;
    rep.journal_end = loop {
        if rep.replayed_bytes >= sb.journal_len {
            break "journal fully replayed".into();
        }
        let entry = verified(
            "journal entry",
            || -> Result<(Vec<Record>, u64), PoolError> {
                if pos + META_BLOCK > sb.journal_len {
                    return Err(PoolError::EndOfRing);
                }
                let head = io.read(sb.journal_offset + pos, META_BLOCK as usize)?;
                let h = BlockHeader::decode(JOURNAL_MAGIC, &head, "journal entry")?;
                if h.pool_tag != tag || h.seq != seq {
                    return Err(PoolError::JournalSequence { pos, seq });
                }
                let total = round_up(HEADER_LEN as u64 + h.payload_len, META_BLOCK);
                if pos + total > sb.journal_len {
                    return Err(PoolError::JournalEntryOverrun { pos });
                }
                let b = io.read(sb.journal_offset + pos, total as usize)?;
                let p = unseal(&h, &b, "journal entry")?;
                Ok((Record::decode_all(p, "journal entry")?, total))
            },
        );
        match entry {
            Ok((records, total)) => {
                rep.journal_entries += 1;
                rep.journal_records += records.len() as u64;
                for r in records {
                    img.apply(r);
                }
                rep.replayed_bytes += total;
                pos += total;
                seq += 1;
                before_wrap = None;
            }
            Err(e) => {
                // An entry that did not fit at the end of the ring was written at 0.
                if pos != 0 && before_wrap.is_none() {
                    before_wrap = Some((pos, rep.replayed_bytes));
                    rep.replayed_bytes += sb.journal_len - pos;
                    pos = 0;
                    continue;
                }
                if let Some((p, b)) = before_wrap.take() {
                    pos = p;
                    rep.replayed_bytes = b;
                }
                break format!("replayed up to sequence {seq} (next slot: {e})");
            }
        }
    };
    rep.end_seq = seq;
    rep.end_pos = pos;
    Ok((sb, img, rep))
}

/// Formats a pool on a device.
pub fn format(dev: &SharedDevice, opts: &FormatOptions) -> Result<Superblock, PoolError> {
    let mut io = SyncIo::new(dev)?;
    let size = dev.size_bytes();
    if size >= META_BLOCK {
        let b = io.read(0, META_BLOCK as usize)?;
        if &b[..8] == SUPERBLOCK_MAGIC && !opts.force {
            return Err(PoolError::Occupied {
                dev: dev.describe(),
                detail: match Superblock::decode(&b) {
                    Ok(sb) => format!(" ({} extents of {} bytes)", sb.extent_count, sb.extent_size),
                    Err(e) => format!(" (damaged: {e})"),
                },
            });
        }
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let uuid = stable_uuid(&format!("pool/{}/{nanos}", dev.describe()));
    let sb = Superblock::layout(size, opts.extent_size, uuid, opts.journal_len)
        .map_err(|e| PoolError::from(e).on(dev.describe()))?;
    // Whatever the device held before must not leak into volumes: start with
    // every extent scrubbed (one deallocate over the data region).
    let data_len = sb.extent_count as u64 * sb.extent_size;
    io.run_all(vec![IoOp::Deallocate {
        offset: sb.data_offset,
        len: data_len,
    }])
    .map_err(|errno| PoolError::Scrub { errno })?;
    // Invalidate both checkpoint slots and the journal's first block of any
    // earlier pool, then write the first checkpoint.
    let zero = vec![0u8; META_BLOCK as usize];
    io.write(sb.ckpt_offset + sb.ckpt_slot_len, &zero)?;
    io.write(sb.journal_offset, &zero)?;
    let ckpt = CheckpointData {
        next_volume_id: 1,
        volumes: vec![],
        mappings: vec![],
        clean: (0..sb.extent_count).collect(),
        kv: vec![],
    };
    let block = seal(
        CHECKPOINT_MAGIC,
        BlockHeader {
            seq: 1,
            journal_seq: 1,
            journal_pos: 0,
            payload_len: 0,
            payload_crc: 0,
            pool_tag: pool_tag(&sb.uuid),
        },
        &ckpt.encode(),
    );
    io.write(sb.ckpt_offset, &block)?;
    io.flush()?;
    // The superblock goes last: a pool exists only once its metadata does.
    io.write(0, &sb.encode())?;
    io.flush()?;
    Ok(sb)
}

impl Pool {
    /// Opens a pool: loads the newest checkpoint, replays the journal, writes a
    /// fresh checkpoint, and starts the metadata thread.
    pub fn open(name: &str, dev: SharedDevice, opts: PoolOptions) -> Result<Arc<Pool>, PoolError> {
        let mut io = SyncIo::new(&dev)?;
        let (sb, img, rep) =
            load_image(&mut io, dev.size_bytes()).map_err(|e| e.on(dev.describe()))?;
        let (_, mut problems) = img.ownership();
        problems.extend(img.kv_problems());
        if let Some(p) = img.problems.iter().chain(problems.iter()).next() {
            return Err(PoolError::Damaged {
                dev: dev.describe(),
                problem: p.clone(),
            });
        }
        tracing::info!(pool = name, dev = %dev.describe(), checkpoint = rep.checkpoint_gen, entries = rep.journal_entries, records = rep.journal_records, end = %rep.journal_end, "pool recovered");
        let dirty = img.dirty();
        let mut volumes = BTreeMap::new();
        for (id, v) in &img.volumes {
            let vol = Volume::new(v.desc.clone(), sb.extent_size);
            for (&lext, (phys, bm)) in &v.map {
                vol.restore(lext, Some(*phys), bm);
            }
            if let Some(kv) = &vol.kv {
                let now = Instant::now();
                for (key, loc) in &v.kv {
                    kv.restore(*key, *loc, now)
                        .map_err(|problem| PoolError::Damaged {
                            dev: dev.describe(),
                            problem,
                        })?;
                }
            }
            volumes.insert(*id, Arc::new(vol));
        }
        let reactors = opts.reactors.max(1);
        let gc = opts.gc.clone();
        let pool = Arc::new(Pool {
            channel_key: next_channel_key(),
            name: name.to_string(),
            pool_tag: pool_tag(&sb.uuid),
            volumes: RwLock::new(volumes),
            meta: Mutex::new(Meta {
                io,
                clean: img.clean.iter().copied().collect(),
                dirty,
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
            }),
            ready: ArrayQueue::new(READY_TARGET * 2),
            caches: (0..reactors).map(|_| ArrayQueue::new(CACHE_CAP)).collect(),
            freed: SegQueue::new(),
            retry_free: SegQueue::new(),
            commits: SegQueue::new(),
            waiters: Mutex::new(Vec::new()),
            md_wake: (Mutex::new(false), Condvar::new()),
            stop: AtomicBool::new(false),
            md_thread: Mutex::new(None),
            exhausted: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            gc_paused: AtomicBool::new(false),
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
            let weak = Arc::downgrade(&pool);
            let h =
                crate::reactor::spawn_worker(format!("md-{name}"), move |now| md_round(&weak, now))
                    .map_err(|e| PoolError::Thread {
                        reason: e.to_string(),
                    })?;
            *lock(&pool.md_thread) = Some(h);
        }
        Ok(pool)
    }

    pub fn device(&self) -> &SharedDevice {
        &self.dev
    }

    // ----- data path -------------------------------------------------------

    /// A clean, reserved extent for a first write. Never blocks.
    pub fn take_extent(&self, reactor: usize) -> Result<u32, AllocError> {
        let r = reactor % self.caches.len();
        if let Some(p) = self.caches[r].pop() {
            debug_assert!(p < self.sb.extent_count, "reserved extent {p} out of range");
            return Ok(p);
        }
        if let Some(p) = self.ready.pop() {
            for _ in 1..CACHE_BATCH {
                match self.ready.pop() {
                    Some(x) => {
                        if let Err(x) = self.caches[r].push(x) {
                            let _ = self.ready.push(x);
                            break;
                        }
                    }
                    None => break,
                }
            }
            if self.ready.len() < READY_TARGET / 2 {
                self.wake_md();
            }
            return Ok(p);
        }
        for c in &self.caches {
            if let Some(p) = c.pop() {
                return Ok(p);
            }
        }
        self.wake_md();
        if self.failed.load(Ordering::Acquire) {
            return Err(AllocError::Failed);
        }
        if self.exhausted.load(Ordering::Acquire) {
            self.stats.no_space.fetch_add(1, Ordering::Relaxed);
            Err(AllocError::NoSpace)
        } else {
            self.stats.alloc_waits.fetch_add(1, Ordering::Relaxed);
            Err(AllocError::Wait)
        }
    }

    /// Gives back an extent taken but not used (it is still clean).
    pub fn return_extent(&self, reactor: usize, p: u32) {
        let r = reactor % self.caches.len();
        if let Err(p) = self.caches[r].push(p) {
            if self.ready.push(p).is_err() {
                // Both full: treat as dirty, GC will scrub it again.
                self.freed.push(p);
            }
        }
    }

    /// An extent unmapped on the data path: dirty until GC scrubs it.
    pub fn extent_freed(&self, p: u32) {
        self.freed.push(p);
    }

    /// An extent that emptied while pinned: the metadata thread retries later.
    pub fn retry_unmap(&self, vol: u32, lext: u32) {
        self.retry_free.push((vol, lext));
    }

    pub fn request_commit(&self, tag: u64, to: Arc<Notifier>) {
        self.commits.push(CommitReq { tag, to });
        self.wake_md();
    }

    pub fn register_waiter(&self, n: &Arc<Notifier>) {
        let mut w = lock(&self.waiters);
        w.retain(|x| x.strong_count() > 0);
        w.push(Arc::downgrade(n));
    }

    pub fn wake_md(&self) {
        let (m, c) = &self.md_wake;
        *lock(m) = true;
        c.notify_one();
    }

    // ----- control path ----------------------------------------------------

    pub fn volume(&self, name: &str) -> Option<Arc<Volume>> {
        self.volumes
            .read()
            .ok()?
            .values()
            .find(|v| v.desc.name == name)
            .cloned()
    }

    pub fn volume_by_id(&self, id: u32) -> Option<Arc<Volume>> {
        self.volumes.read().ok()?.get(&id).cloned()
    }

    pub fn volumes(&self) -> Vec<Arc<Volume>> {
        self.volumes
            .read()
            .map(|v| v.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Creates a volume; durable when this returns.
    pub fn create_volume(
        &self,
        name: &str,
        size_bytes: u64,
        block_size: u32,
        flags: u32,
    ) -> Result<Arc<Volume>, PoolError> {
        if name.is_empty() || name.len() > MAX_NAME_LEN {
            return Err(PoolError::VolumeName);
        }
        if !matches!(block_size, 512 | 4096) {
            return Err(PoolError::VolumeBlockSize { name: name.into() });
        }
        if size_bytes == 0 || size_bytes % block_size as u64 != 0 {
            return Err(PoolError::VolumeSize {
                name: name.into(),
                size: size_bytes,
                block_size: block_size as u64,
            });
        }
        if size_bytes.div_ceil(self.sb.extent_size) > u32::MAX as u64 / 2 {
            return Err(PoolError::VolumeTooLarge {
                name: name.into(),
                size: size_bytes,
            });
        }
        let mut m = lock(&self.meta);
        if self.volume(name).is_some() {
            return Err(PoolError::VolumeExists { name: name.into() });
        }
        if self.volumes.read().map(|v| v.len()).unwrap_or(0) >= MAX_VOLUMES {
            return Err(PoolError::TooManyVolumes {
                pool: self.name.clone(),
                max: MAX_VOLUMES,
            });
        }
        if flags & VOL_KV != 0 {
            let taken: u64 = self
                .volumes()
                .iter()
                .filter(|v| v.kv.is_some())
                .map(|v| kv::max_keys_of(v.desc.size_bytes))
                .sum();
            let room = kv_key_room(self.sb.device_size).saturating_sub(taken);
            let keys = kv::max_keys_of(size_bytes);
            if keys > room {
                return Err(PoolError::KvKeyRoom {
                    name: name.into(),
                    keys,
                    room,
                });
            }
        }
        let id = m.next_volume_id;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let desc = VolumeDesc {
            id,
            name: name.to_string(),
            uuid: stable_uuid(&format!("{:?}/{id}/{name}/{nanos}", self.sb.uuid)),
            size_bytes,
            block_size,
            flags,
        };
        let vol = Arc::new(Volume::new(desc.clone(), self.sb.extent_size));
        m.next_volume_id += 1;
        m.pending.push(Record::VolumeCreate(desc));
        if let Ok(mut v) = self.volumes.write() {
            v.insert(id, vol.clone());
        }
        self.commit(&mut m, Vec::new())?;
        Ok(vol)
    }

    fn exclusive(&self, name: &str) -> Result<Arc<Volume>, PoolError> {
        let v = self
            .volume(name)
            .ok_or_else(|| PoolError::NoVolume { name: name.into() })?;
        // The pool's table and `v` are the only holders when nothing serves it.
        if Arc::strong_count(&v) > 2 {
            return Err(PoolError::VolumeInUse { name: name.into() });
        }
        Ok(v)
    }

    /// Deletes a volume: its extents are freed at once (metadata only) and
    /// scrubbed by GC before any other volume sees them.
    pub fn delete_volume(&self, name: &str) -> Result<(), PoolError> {
        let mut m = lock(&self.meta);
        let v = self.exclusive(name)?;
        // Pending extent changes go first so replay never sees them after the delete.
        self.commit(&mut m, Vec::new())?;
        v.deleted.store(true, Ordering::Release);
        let freed = v.unmap_from(0);
        v.clear_dirty();
        if let Ok(mut t) = self.volumes.write() {
            t.remove(&v.desc.id);
        }
        m.pending.push(Record::VolumeDelete { id: v.desc.id });
        m.dirty.extend(freed);
        self.commit(&mut m, Vec::new())?;
        self.wake_md();
        Ok(())
    }

    /// Resizes a volume that is not being served. Shrinking frees the extents
    /// past the new end at once.
    pub fn resize_volume(&self, name: &str, size_bytes: u64) -> Result<(), PoolError> {
        let mut m = lock(&self.meta);
        let v = self.exclusive(name)?;
        if v.kv.is_some() {
            return Err(PoolError::KvResize { name: name.into() });
        }
        let bs = v.desc.block_size as u64;
        if size_bytes == 0 || size_bytes % bs != 0 {
            return Err(PoolError::VolumeSize {
                name: name.into(),
                size: size_bytes,
                block_size: bs,
            });
        }
        self.commit(&mut m, Vec::new())?;
        // Blocks past the new end inside the last kept extent lose their valid
        // bits (in memory here, on replay from the record); reads follow the
        // bitmap, so growing again shows zeros there without touching the device.
        let new = v.resized(size_bytes);
        let keep = new.extent_count();
        let freed: Vec<u32> = v
            .mapped()
            .into_iter()
            .filter(|&(l, _)| l >= keep)
            .map(|(_, p)| p)
            .collect();
        new.clear_dirty();
        if let Ok(mut t) = self.volumes.write() {
            t.insert(v.desc.id, Arc::new(new));
        }
        m.pending.push(Record::VolumeResize {
            id: v.desc.id,
            size_bytes,
        });
        m.dirty.extend(freed);
        self.commit(&mut m, Vec::new())?;
        Ok(())
    }

    /// Makes every acknowledged change durable now (control path, tests).
    pub fn sync(&self) -> Result<(), PoolError> {
        let mut m = lock(&self.meta);
        self.commit(&mut m, Vec::new())
    }

    /// Checks the live pool's state: no physical extent mapped twice, none
    /// both mapped and on a free list, and the extent accounting. Holding the
    /// metadata lock keeps GC and reservations still, so mapped extents cannot
    /// reach a free list during the check (no false alarms under load).
    pub fn verify_live(&self) -> (Vec<String>, String) {
        let m = lock(&self.meta);
        let mut problems = Vec::new();
        let mut owner: std::collections::HashMap<u32, (u32, u32)> = Default::default();
        for v in self.volumes() {
            for (l, p) in v.mapped() {
                if p >= self.sb.extent_count {
                    problems.push(format!(
                        "volume {} extent {l} maps to {p}, beyond the pool",
                        v.desc.name
                    ));
                }
                if let Some((ov, ol)) = owner.insert(p, (v.desc.id, l)) {
                    problems.push(format!(
                        "extent {p} is mapped twice: volume {ov} extent {ol} and volume {} extent {l}",
                        v.desc.id
                    ));
                }
            }
        }
        let lists: [(&str, Vec<u32>); 3] = [
            ("clean", m.clean.iter().copied().collect()),
            ("dirty", m.dirty.clone()),
            ("scrubbing", m.scrubbed.clone()),
        ];
        let mut free = std::collections::HashSet::new();
        for (name, list) in &lists {
            for p in list {
                if let Some((v, l)) = owner.get(p) {
                    problems.push(format!(
                        "extent {p} is both {name} and mapped by volume {v} extent {l}"
                    ));
                }
                if !free.insert(*p) {
                    problems.push(format!("extent {p} is on a free list twice"));
                }
            }
        }
        let reserved = self.ready.len() + self.caches.iter().map(|c| c.len()).sum::<usize>();
        let summary = format!(
            "{} mapped, {} clean, {} dirty, {} scrubbing, {} reserved, {} freed in flight, {} total",
            owner.len(),
            m.clean.len(),
            m.dirty.len(),
            m.scrubbed.len(),
            reserved,
            self.freed.len(),
            self.sb.extent_count
        );
        (problems, summary)
    }

    /// Debug builds (the simulation's profile): extents about to become clean
    /// or reserved are mapped by no volume, or a first write would share them.
    fn assert_unmapped(&self, extents: &[u32], what: &str) {
        let listed: std::collections::HashSet<u32> = extents.iter().copied().collect();
        for v in self.volumes() {
            for (l, p) in v.mapped() {
                assert!(
                    !listed.contains(&p),
                    "pool {}: {what} extent {p} is mapped by volume {} extent {l}",
                    self.name,
                    v.desc.name
                );
            }
        }
    }

    /// `verify_live` plus the allocator's accounting, for a pool with nothing
    /// in flight (the simulation between steps): every extent is in exactly
    /// one place, mapped, on a free list, reserved, or freed and not yet
    /// listed, so those counts add up to the pool's extents exactly. With
    /// `counters` (right after a metadata step) the published counters must
    /// match the lists too.
    pub fn verify_quiescent(&self, counters: bool) -> Vec<String> {
        let (mut problems, summary) = self.verify_live();
        let m = lock(&self.meta);
        let mapped: usize = self.volumes().iter().map(|v| v.mapped().len()).sum();
        let reserved = self.ready.len() + self.caches.iter().map(|c| c.len()).sum::<usize>();
        let listed =
            mapped + m.clean.len() + m.dirty.len() + m.scrubbed.len() + reserved + self.freed.len();
        if listed != self.sb.extent_count as usize {
            problems.push(format!(
                "extent accounting: {listed} accounted for, pool has {} ({summary})",
                self.sb.extent_count
            ));
        }
        // What the metrics report must be what the lists hold.
        let (clean, dirty) = (
            self.stats.clean.load(Ordering::Relaxed) as usize,
            self.stats.dirty.load(Ordering::Relaxed) as usize,
        );
        if counters && (clean != m.clean.len() || dirty != m.dirty.len() + m.scrubbed.len()) {
            problems.push(format!(
                "counters: clean {clean} dirty {dirty}, lists: clean {} dirty {} scrubbing {}",
                m.clean.len(),
                m.dirty.len(),
                m.scrubbed.len()
            ));
        }
        problems
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

    // ----- metadata thread -------------------------------------------------

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

    /// One round of metadata work at time `now` (the caller's clock: the
    /// metadata thread's loop, or the simulation's). Returns true when it did
    /// something. It gathers the state, asks `plan` what to do, and applies it.
    pub fn md_step(&self, now: Instant) -> bool {
        let mut m = lock(&self.meta);
        while let Some(p) = self.freed.pop() {
            m.dirty.push(p);
        }
        for _ in 0..self.retry_free.len() {
            let Some((vid, lext)) = self.retry_free.pop() else {
                break;
            };
            if let Some(v) = self.volume_by_id(vid) {
                match v.try_unmap_empty(lext) {
                    Ok(Some(p)) => m.dirty.push(p),
                    Ok(None) => {}
                    Err(()) => self.retry_free.push((vid, lext)),
                }
            }
        }
        self.kv_trim(&mut m, now);
        if m.failed.is_some() {
            // Metadata can no longer be written: fail every waiter.
            while let Some(r) = self.commits.pop() {
                r.to.committed.push((r.tag, Err(libc::EIO)));
                r.to.signal();
            }
            self.update_stats(&m);
            for w in lock(&self.waiters).iter().filter_map(|w| w.upgrade()) {
                if !w.space.swap(true, Ordering::AcqRel) {
                    w.signal();
                }
            }
            return false;
        }
        let mut reqs = Vec::new();
        while let Some(r) = self.commits.pop() {
            reqs.push(r);
        }
        let inputs = self.md_inputs(&mut m, now, reqs.len());
        let plan = plan_md_step(&inputs, &mut m.admission);
        let worked = self.apply_md_plan(&mut m, &plan, now, reqs);
        self.update_stats(&m);
        // Writes waiting for space retry: there is some now, or there never
        // will be (they fail with capacity exceeded).
        if !self.ready.is_empty() || self.exhausted.load(Ordering::Acquire) {
            for w in lock(&self.waiters).iter().filter_map(|w| w.upgrade()) {
                if !w.space.swap(true, Ordering::AcqRel) {
                    w.signal();
                }
            }
        }
        worked
    }

    /// What `plan_md_step` decides from: the metadata state, the channels'
    /// foreground counters, and `now`.
    fn md_inputs(&self, m: &mut Meta, now: Instant, commit_requests: usize) -> MdInputs {
        // Foreground load from the channels' own counters (the data path never
        // writes a pool-wide cache line for it): commands in flight now, and
        // the mean latency of the commands completed since the last step.
        let (mut fg_inflight, mut ops, mut ns) = (0, 0u64, 0u64);
        let mut volumes_dirty = false;
        for v in self.volumes() {
            fg_inflight += v.inflight();
            let t = v.io_totals();
            ops += t.reads + t.writes + t.unmaps;
            ns += t.read_ns + t.write_ns + t.unmap_ns;
            // A KV Delete, or a Store over blocks already written, changes only
            // the key index: the periodic commit takes that too.
            volumes_dirty |= v.has_dirty() || v.kv.as_ref().is_some_and(|kv| kv.has_changes());
        }
        let (prev_ops, prev_ns) = m.fg_seen;
        m.fg_seen = (ops, ns);
        let fg_latency_ns = match ops.checked_sub(prev_ops) {
            Some(d) if d > 0 => ns.saturating_sub(prev_ns) / d,
            _ => 0,
        };
        MdInputs {
            now,
            extents: self.sb.extent_count as u64,
            clean: m.clean.len(),
            ready: self.ready.len(),
            dirty: m.dirty.len(),
            scrubbed: m.scrubbed.len(),
            scrubbed_since: m.scrubbed_since,
            gc_paused: self.gc_paused.load(Ordering::Relaxed),
            fg_inflight,
            fg_latency_ns,
            commit_requests,
            pending_records: m.pending.len(),
            volumes_dirty,
            // The periodic commit counts from the first step after a commit.
            last_commit: *m.last_commit.get_or_insert(now),
            commit_interval: self.opts.commit_interval,
        }
    }

    /// Carries out `plan`: the scrub, the flush that makes scrubbed extents
    /// clean, the reservation, and the journal commit that answers `reqs`.
    fn apply_md_plan(
        &self,
        m: &mut Meta,
        plan: &MdPlan,
        now: Instant,
        reqs: Vec<CommitReq>,
    ) -> bool {
        let mut worked = false;
        if plan.scrub > 0 {
            let take = plan.scrub.min(m.dirty.len());
            let batch: Vec<u32> = m.dirty.drain(..take).collect();
            let ops = batch
                .iter()
                .map(|&p| IoOp::Deallocate {
                    offset: self.sb.extent_offset(p),
                    len: self.sb.extent_size,
                })
                .collect();
            match m.io.run_all(ops) {
                Ok(_) => {
                    self.stats
                        .gc_scrubbed
                        .fetch_add(batch.len() as u64, Ordering::Relaxed);
                    if m.scrubbed.is_empty() {
                        m.scrubbed_since = Some(now);
                    }
                    m.scrubbed.extend(batch);
                }
                Err(e) => {
                    tracing::error!(pool = %self.name, "GC scrub failed: {}", io_err(e));
                    m.dirty.extend(batch);
                    m.failed = Some(format!("GC scrub failed: {}", io_err(e)));
                }
            }
            worked = true;
        }
        let mut cleaned = Vec::new();
        if cfg!(debug_assertions) {
            self.assert_unmapped(&m.scrubbed, "scrubbed");
        }
        if plan.flush_scrubbed && !m.scrubbed.is_empty() && m.failed.is_none() {
            match m.io.run_all(vec![IoOp::Flush]) {
                Ok(_) => cleaned = std::mem::take(&mut m.scrubbed),
                Err(e) => {
                    let back = std::mem::take(&mut m.scrubbed);
                    m.dirty.extend(back);
                    m.failed = Some(format!("GC flush failed: {}", io_err(e)));
                }
            }
        }
        let mut reserve = Vec::with_capacity(plan.reserve);
        while reserve.len() < plan.reserve {
            match m.clean.pop_front() {
                Some(p) => reserve.push(p),
                None => break,
            }
        }
        if cfg!(debug_assertions) {
            self.assert_unmapped(&reserve, "reserved");
        }
        if !(plan.commit || !cleaned.is_empty() || !reqs.is_empty() || !reserve.is_empty()) {
            return worked;
        }
        let mut extra = Vec::new();
        if !cleaned.is_empty() {
            extra.push(Record::Clean(cleaned.clone()));
        }
        if !reserve.is_empty() {
            extra.push(Record::Reserve(reserve.clone()));
        }
        let res = self.commit(m, extra);
        match &res {
            Ok(()) => {
                m.clean.extend(cleaned);
                for p in reserve {
                    if let Err(p) = self.ready.push(p) {
                        m.clean.push_front(p);
                    }
                }
            }
            Err(e) => {
                tracing::error!(pool = %self.name, "metadata commit failed: {e}");
                m.dirty.extend(cleaned);
                for p in reserve {
                    m.clean.push_front(p);
                }
            }
        }
        for r in reqs {
            r.to.committed
                .push((r.tag, res.as_ref().map(|_| ()).map_err(|_| libc::EIO)));
            r.to.signal();
        }
        true
    }

    /// Writes the journal entries for `extra` plus every change made so far,
    /// then flushes the device.
    fn commit(&self, m: &mut Meta, extra: Vec<Record>) -> Result<(), PoolError> {
        if let Some(f) = &m.failed {
            return Err(PoolError::ReadOnly {
                pool: self.name.clone(),
                cause: f.clone(),
            });
        }
        let r = self.commit_inner(m, extra);
        if let Err(e) = &r {
            m.failed = Some(e.to_string());
        }
        self.kv_committed(r.is_ok());
        // The next step restarts the periodic commit's interval from its now.
        m.last_commit = None;
        r
    }

    fn commit_inner(&self, m: &mut Meta, extra: Vec<Record>) -> Result<(), PoolError> {
        // Checkpoint before draining changes, never in the middle: a record
        // drained before a checkpoint and written after it would replay an
        // older state over the checkpoint's.
        if m.used > self.sb.journal_len / 4 {
            self.checkpoint(m)?;
        }
        let mut records = std::mem::take(&mut m.pending);
        let mut changed = Vec::new();
        let mut kv_changed = Vec::new();
        for v in self.volumes() {
            v.drain_dirty(&mut changed);
            for (lext, phys, bitmap) in changed.drain(..) {
                records.push(Record::Extent {
                    vol: v.desc.id,
                    lext,
                    phys,
                    bitmap,
                });
            }
            if let Some(kv) = &v.kv {
                kv_changed.clear();
                kv.drain_changes(&mut kv_changed);
                records.extend(kv_changed.drain(..).map(|(key, loc)| match loc {
                    Some(loc) => Record::KvPut {
                        vol: v.desc.id,
                        key,
                        loc,
                    },
                    None => Record::KvDelete {
                        vol: v.desc.id,
                        key,
                    },
                }));
            }
        }
        records.extend(extra);
        if records.is_empty() {
            // Nothing to journal: a Flush only needs the device flushed.
            m.io.flush()?;
            self.stats.commits.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        // Data before metadata: an entry that marks blocks valid must not
        // reach the device before their data does, or a crash could keep the
        // entry and lose the data (the blocks would read their old contents).
        // The same for a key's record and its value.
        if records
            .iter()
            .any(|r| matches!(r, Record::Extent { .. } | Record::KvPut { .. }))
        {
            m.io.flush()?;
        }
        let limit = MAX_ENTRY.min(self.sb.journal_len as usize / 8);
        let mut w = Writer::default();
        let mut entries = Vec::new();
        for r in &records {
            let before = w.b.len();
            r.encode(&mut w);
            if w.b.len() + HEADER_LEN > limit && before > 0 {
                let tail = w.b.split_off(before);
                entries.push(std::mem::replace(&mut w.b, tail));
            }
        }
        if !w.b.is_empty() || entries.is_empty() {
            entries.push(w.b);
        }
        let total: u64 = entries
            .iter()
            .map(|e| round_up((HEADER_LEN + e.len()) as u64, META_BLOCK) * 2)
            .sum();
        if m.used + total > self.sb.journal_len / 2 {
            // Too much for the journal: a checkpoint captures all of it (the
            // drained extents at their current state; a Clean list left out
            // only means those extents are scrubbed again after a crash).
            return self.checkpoint(m);
        }
        for payload in entries {
            let block = seal(
                JOURNAL_MAGIC,
                BlockHeader {
                    seq: m.seq,
                    journal_seq: 0,
                    journal_pos: 0,
                    payload_len: 0,
                    payload_crc: 0,
                    pool_tag: self.pool_tag,
                },
                &payload,
            );
            let len = block.len() as u64;
            // An entry that does not fit before the end of the ring (even
            // when the head sits exactly at the end) starts at 0.
            let wrap = m.head + len > self.sb.journal_len;
            let gap = if wrap {
                self.sb.journal_len.saturating_sub(m.head)
            } else {
                0
            };
            if m.used + gap + len > self.sb.journal_len {
                return Err(PoolError::JournalOverflow);
            }
            if wrap {
                m.head = 0;
            }
            m.io.write(self.sb.journal_offset + m.head, &block)?;
            m.head += len;
            m.used += gap + len;
            debug_assert!(
                m.head <= self.sb.journal_len && m.used <= self.sb.journal_len,
                "journal head {} / used {} past the {}-byte ring",
                m.head,
                m.used,
                self.sb.journal_len
            );
            m.seq += 1;
        }
        m.io.flush()?;
        self.stats.commits.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Writes the whole metadata state to the older checkpoint slot; the journal
    /// restarts after it.
    fn checkpoint(&self, m: &mut Meta) -> Result<(), PoolError> {
        // Changes queued so far are captured by the snapshot below. If this
        // write tears, the older checkpoint and its journal are still intact.
        for v in self.volumes() {
            v.clear_dirty();
        }
        let vols = self.volumes();
        let data = CheckpointData {
            next_volume_id: m.next_volume_id,
            volumes: vols.iter().map(|v| v.desc.clone()).collect(),
            mappings: vols
                .iter()
                .flat_map(|v| {
                    v.mapped()
                        .into_iter()
                        .map(|(l, p)| (v.desc.id, l, p, v.bitmap(l)))
                        .collect::<Vec<_>>()
                })
                .collect(),
            clean: m.clean.iter().copied().collect(),
            kv: vols
                .iter()
                .flat_map(|v| {
                    let id = v.desc.id;
                    v.kv.iter().flat_map(move |kv| {
                        kv.drain_snapshot()
                            .into_iter()
                            .map(move |(k, l)| (id, k, l))
                    })
                })
                .collect(),
        };
        if cfg!(debug_assertions) {
            self.assert_unmapped(&data.clean, "clean");
        }
        let gen = m.ckpt_gen + 1;
        let block = seal(
            CHECKPOINT_MAGIC,
            BlockHeader {
                seq: gen,
                journal_seq: m.seq,
                journal_pos: m.head,
                payload_len: 0,
                payload_crc: 0,
                pool_tag: self.pool_tag,
            },
            &data.encode(),
        );
        if block.len() as u64 > self.sb.ckpt_slot_len {
            return Err(PoolError::CheckpointTooLarge {
                bytes: block.len() as u64,
                slot: self.sb.ckpt_slot_len,
            });
        }
        let slot = gen % 2;
        m.io.write(self.sb.ckpt_offset + slot * self.sb.ckpt_slot_len, &block)?;
        m.io.flush()?;
        m.ckpt_gen = gen;
        m.used = 0;
        // Pending control records are captured by the volume table above.
        m.pending.clear();
        self.stats.checkpoints.fetch_add(1, Ordering::Relaxed);
        self.kv_committed(true);
        Ok(())
    }

    /// KV extents whose blocks have all been free long enough go back to the
    /// pool: unmapped here (no key and no Store can reach them: the index
    /// holds their blocks), then dirty for GC to scrub under admission
    /// control, like an extent a Deallocate emptied. The unmap is journaled
    /// with the volume's next commit.
    fn kv_trim(&self, m: &mut Meta, now: Instant) {
        let mut out = Vec::new();
        for v in self.volumes() {
            let Some(kv) = &v.kv else { continue };
            out.clear();
            kv.trim_step(now, |l| v.mapping(l).is_some(), &mut out);
            for &lext in &out {
                v.clear_valid(lext, 0, v.blocks_per_extent);
                match v.try_unmap_empty(lext) {
                    Ok(Some(p)) => m.dirty.push(p),
                    Ok(None) => {}
                    Err(()) => self.retry_free.push((v.desc.id, lext)),
                }
            }
            kv.trimmed(&out);
        }
    }

    /// Tells KV indexes whether the commit that took their changes is
    /// durable: blocks their keys gave up before it are free for reuse.
    fn kv_committed(&self, ok: bool) {
        for v in self.volumes() {
            if let Some(kv) = &v.kv {
                kv.committed(ok);
            }
        }
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

/// The state one metadata step decides from (gathered by `Pool::md_inputs`).
#[derive(Debug, Clone)]
pub struct MdInputs {
    pub now: Instant,
    pub extents: u64,
    /// Clean extents on the list, and reserved ones ready for first writes.
    pub clean: usize,
    pub ready: usize,
    /// Freed extents waiting for a scrub, and scrubbed ones waiting for the
    /// flush that makes them clean (since `scrubbed_since`).
    pub dirty: usize,
    pub scrubbed: usize,
    pub scrubbed_since: Option<Instant>,
    pub gc_paused: bool,
    /// Foreground commands in flight, and their mean latency since the last step.
    pub fg_inflight: u64,
    pub fg_latency_ns: u64,
    /// Flush/FUA commits waiting, control records queued, extent maps changed.
    pub commit_requests: usize,
    pub pending_records: usize,
    pub volumes_dirty: bool,
    pub last_commit: Instant,
    pub commit_interval: Option<Duration>,
}

/// What one metadata step does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MdPlan {
    /// Dirty extents to scrub (from the front of the dirty list).
    pub scrub: usize,
    /// Flush the device so the scrubbed extents can be recorded clean.
    pub flush_scrubbed: bool,
    /// Clean extents to reserve for first writes.
    pub reserve: usize,
    /// Write a journal commit (requests, queued records, reservations, or the
    /// periodic commit of changed extent maps); extents made clean add one too.
    pub commit: bool,
}

/// Scrubbed extents wait for a flush in groups this large at most.
const CLEAN_GROUP: usize = 64;
/// ... and this long at most.
const CLEAN_WAIT: Duration = Duration::from_secs(1);

/// Decides one metadata step from its inputs alone (and the GC admission
/// controller's own state): no I/O, no clock, so it is unit-tested directly.
pub fn plan_md_step(i: &MdInputs, admission: &mut Admission) -> MdPlan {
    let available = (i.clean + i.ready) as u64;
    let (low, _) = admission.watermarks(i.extents);
    // A paused GC still scrubs when clean extents run short: writes would
    // otherwise wait for space that never comes.
    let paused = i.gc_paused && available >= low;
    let backlog = if paused { 0 } else { i.dirty as u64 };
    let grant = admission.grant(
        i.now,
        backlog,
        available,
        i.extents,
        i.fg_inflight,
        i.fg_latency_ns,
    );
    let scrub = grant.min(i.dirty);
    let dirty_after = i.dirty - scrub;
    let scrubbed_after = i.scrubbed + scrub;
    let since = match i.scrubbed_since {
        Some(t) if i.scrubbed > 0 => t,
        _ => i.now,
    };
    // Scrubbed extents become clean once the scrub is durable and recorded.
    // Flushing per batch would cost foreground latency, so it waits for a
    // bigger group unless space is short or GC has nothing left to do.
    let flush_scrubbed = scrubbed_after > 0
        && (scrubbed_after >= CLEAN_GROUP
            || dirty_after == 0
            || available < low
            || admission.s.fixed_batch.is_some()
            || i.now.saturating_duration_since(since) >= CLEAN_WAIT);
    // Keep reserved extents ready for first writes.
    let reserve = if i.ready < READY_TARGET / 2 {
        (READY_TARGET - i.ready).min(i.clean)
    } else {
        0
    };
    let periodic = i.volumes_dirty
        && i.commit_interval
            .is_some_and(|every| i.now.saturating_duration_since(i.last_commit) >= every);
    MdPlan {
        scrub,
        flush_scrubbed,
        reserve,
        commit: i.commit_requests > 0 || i.pending_records > 0 || reserve > 0 || periodic,
    }
}

/// One round of the metadata thread at `now`; false when the pool is gone or
/// closing. Idle rounds sleep until woken or the GC tick passes.
fn md_round(pool: &Weak<Pool>, now: Instant) -> bool {
    let Some(p) = pool.upgrade() else {
        return false;
    };
    if p.stop.load(Ordering::Acquire) {
        return false;
    }
    if !p.md_step(now) {
        let (m, c) = &p.md_wake;
        let mut woken = lock(m);
        if !*woken {
            let tick = p.opts.gc.tick;
            woken = match c.wait_timeout(woken, tick) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
        *woken = false;
    }
    true
}

/// An advisory lock on a pool's file or block device, held while a target or a
/// tool uses the pool so two processes never write the same metadata.
pub struct PoolLock {
    _file: std::fs::File,
}

/// Takes the pool lock: exclusive for a user that writes, shared for `check`.
pub fn lock_pool(path: &std::path::Path, exclusive: bool) -> Result<PoolLock, PoolError> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).map_err(|e| PoolError::Lock {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    let op = if exclusive {
        libc::LOCK_EX
    } else {
        libc::LOCK_SH
    } | libc::LOCK_NB;
    // SAFETY: flock on a descriptor this function owns; no memory is involved.
    if unsafe { libc::flock(file.as_raw_fd(), op) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            PoolError::Locked {
                path: path.display().to_string(),
            }
        } else {
            PoolError::Lock {
                path: path.display().to_string(),
                reason: format!("cannot lock: {e}"),
            }
        });
    }
    Ok(PoolLock { _file: file })
}

/// What `kvtarget check` found.
#[derive(Debug, Default)]
pub struct CheckReport {
    pub lines: Vec<String>,
    pub damage: Vec<String>,
}

/// Verifies a pool offline: superblock and checkpoint checksums, journal replay,
/// no extent mapped twice, none both free and mapped, everything in range.
pub fn check(dev: &SharedDevice) -> CheckReport {
    let mut rep = CheckReport::default();
    let mut io = match SyncIo::new(dev) {
        Ok(io) => io,
        Err(e) => {
            rep.damage.push(e.to_string());
            return rep;
        }
    };
    let (sb, img, rec) = match load_image(&mut io, dev.size_bytes()) {
        Ok(x) => x,
        Err(e) => {
            rep.damage.push(e.to_string());
            return rep;
        }
    };
    rep.lines.push(format!(
        "superblock: ok, {} extents of {} bytes, data at {}",
        sb.extent_count, sb.extent_size, sb.data_offset
    ));
    rep.lines.push(format!(
        "checkpoint: generation {} in slot {} ok{}",
        rec.checkpoint_gen,
        rec.checkpoint_slot,
        rec.other_slot
            .as_ref()
            .map(|s| format!(" (other {s})"))
            .unwrap_or_default()
    ));
    rep.lines.push(format!(
        "journal: {} entries, {} records replayed; {}",
        rec.journal_entries, rec.journal_records, rec.journal_end
    ));
    rep.damage.extend(img.problems.iter().cloned());
    let (owner, problems) = img.ownership();
    rep.damage.extend(problems);
    rep.damage.extend(img.kv_problems());
    for (id, v) in &img.volumes {
        let used: u64 = v
            .map
            .values()
            .map(|(_, bm)| bm.iter().map(|b| b.count_ones() as u64).sum::<u64>())
            .sum();
        rep.lines.push(format!(
            "volume {id} {:?}: {} bytes, block {}, {} extents mapped, {} blocks in use",
            v.desc.name,
            v.desc.size_bytes,
            v.desc.block_size,
            v.map.len(),
            used
        ));
        if v.desc.flags & VOL_KV != 0 {
            let bytes: u64 = v.kv.values().map(|l| l.len as u64).sum();
            rep.lines.push(format!(
                "volume {id} {:?}: KV namespace, {} keys, {} value bytes",
                v.desc.name,
                v.kv.len(),
                bytes
            ));
            // A key's blocks must be valid in the volume (written before the
            // record that names them).
            for (k, l) in &v.kv {
                let bpe = sb.extent_size / v.desc.block_size as u64;
                // A range past the volume's end is kv_problems' report already
                // (and walking it could take billions of steps).
                let end = l.block.saturating_add(l.nblocks as u64);
                if end > v.desc.size_bytes / v.desc.block_size.max(1) as u64 {
                    continue;
                }
                let missing = (l.block..end).find(|&b| {
                    let (lext, i) = ((b / bpe) as u32, (b % bpe) as usize);
                    !v.map.get(&lext).is_some_and(|(_, bm)| {
                        bm.get(i / 8).is_some_and(|x| x & (1 << (i % 8)) != 0)
                    })
                });
                if let Some(b) = missing {
                    rep.damage.push(format!(
                        "volume {id}: KV key {k:?} names block {b}, which holds no data"
                    ));
                }
            }
        }
    }
    let dirty = (0..sb.extent_count)
        .filter(|p| !owner.contains_key(p) && !img.clean.contains(p))
        .count();
    rep.lines.push(format!(
        "extents: {} mapped, {} clean, {} dirty, {} total",
        owner.len(),
        img.clean.len(),
        dirty,
        sb.extent_count
    ));
    if owner.len() + img.clean.len() + dirty != sb.extent_count as usize {
        rep.damage.push("extent accounting does not add up".into());
    }
    rep
}

#[cfg(test)]
mod plan_tests {
    use super::*;

    fn inputs(now: Instant) -> MdInputs {
        MdInputs {
            now,
            extents: 1000,
            clean: 500,
            ready: READY_TARGET,
            dirty: 0,
            scrubbed: 0,
            scrubbed_since: None,
            gc_paused: false,
            fg_inflight: 0,
            fg_latency_ns: 0,
            commit_requests: 0,
            pending_records: 0,
            volumes_dirty: false,
            last_commit: now,
            commit_interval: Some(Duration::from_secs(1)),
        }
    }

    fn admission() -> Admission {
        Admission::new(GcSettings::default())
    }

    #[test]
    fn an_idle_pool_plans_nothing() {
        let t = Instant::now();
        assert_eq!(
            plan_md_step(&inputs(t), &mut admission()),
            MdPlan::default()
        );
    }

    #[test]
    fn reserves_refill_below_half_and_never_beyond_the_clean_list() {
        let t = Instant::now();
        let mut i = inputs(t);
        i.ready = READY_TARGET / 2;
        assert_eq!(plan_md_step(&i, &mut admission()).reserve, 0);
        i.ready = READY_TARGET / 2 - 1;
        let p = plan_md_step(&i, &mut admission());
        assert_eq!(p.reserve, READY_TARGET / 2 + 1);
        assert!(p.commit, "a reservation is journaled");
        i.clean = 3;
        assert_eq!(plan_md_step(&i, &mut admission()).reserve, 3);
    }

    #[test]
    fn commits_for_flushes_queued_records_and_the_periodic_timer() {
        let t = Instant::now();
        let mut i = inputs(t);
        i.commit_requests = 1;
        assert!(plan_md_step(&i, &mut admission()).commit);
        let mut i = inputs(t);
        i.pending_records = 2;
        assert!(plan_md_step(&i, &mut admission()).commit);
        // Changed extent maps wait for the interval.
        let mut i = inputs(t + Duration::from_millis(999));
        i.last_commit = t;
        i.volumes_dirty = true;
        assert!(!plan_md_step(&i, &mut admission()).commit);
        i.now = t + Duration::from_secs(1);
        assert!(plan_md_step(&i, &mut admission()).commit);
        // Nothing changed: the timer alone does not commit.
        i.volumes_dirty = false;
        assert!(!plan_md_step(&i, &mut admission()).commit);
        // No interval configured: never periodic.
        i.volumes_dirty = true;
        i.commit_interval = None;
        assert!(!plan_md_step(&i, &mut admission()).commit);
    }

    #[test]
    fn scrubbed_extents_wait_for_a_group_a_second_or_a_shortage() {
        let t = Instant::now();
        let mut i = inputs(t + Duration::from_millis(500));
        i.dirty = 100;
        i.scrubbed = 10;
        i.scrubbed_since = Some(t);
        let mut a = admission();
        assert!(!plan_md_step(&i, &mut a).flush_scrubbed);
        i.now = t + Duration::from_secs(1);
        assert!(plan_md_step(&i, &mut a).flush_scrubbed, "a second passed");
        i.now = t + Duration::from_millis(500);
        i.scrubbed = CLEAN_GROUP;
        assert!(plan_md_step(&i, &mut a).flush_scrubbed, "a full group");
        i.scrubbed = 10;
        i.dirty = 0;
        assert!(
            plan_md_step(&i, &mut a).flush_scrubbed,
            "nothing left to scrub"
        );
        i.dirty = 100;
        i.clean = 0;
        i.ready = 0;
        assert!(plan_md_step(&i, &mut a).flush_scrubbed, "space is short");
    }

    #[test]
    fn gc_scrubs_through_admission_and_a_pause_holds_only_while_space_lasts() {
        let t = Instant::now();
        let mut a = admission();
        let mut i = inputs(t);
        i.dirty = 100;
        // The first grant has no elapsed time to earn tokens from.
        assert_eq!(plan_md_step(&i, &mut a).scrub, 0);
        i.now = t + Duration::from_secs(1);
        let p = plan_md_step(&i, &mut a);
        assert!(p.scrub > 0 && p.scrub <= 4, "{p:?}");
        // Paused with plenty of clean space: nothing.
        i.gc_paused = true;
        i.now += Duration::from_secs(1);
        assert_eq!(plan_md_step(&i, &mut a).scrub, 0);
        // Paused but short of space: urgent scrubbing regardless.
        i.clean = 1;
        i.ready = 0;
        i.now += Duration::from_millis(10);
        let p = plan_md_step(&i, &mut a);
        assert_eq!(p.scrub, GcSettings::default().batch);
        assert_eq!(a.mode, GcMode::Urgent);
        // The plan never scrubs more than is dirty.
        i.dirty = 2;
        i.now += Duration::from_millis(10);
        assert_eq!(plan_md_step(&i, &mut a).scrub, 2);
    }

    #[test]
    fn a_fixed_batch_scrubs_exactly_and_flushes_every_step() {
        let t = Instant::now();
        let mut a = Admission::new(GcSettings {
            fixed_batch: Some(3),
            ..GcSettings::default()
        });
        let mut i = inputs(t);
        i.dirty = 10;
        let p = plan_md_step(&i, &mut a);
        assert_eq!((p.scrub, p.flush_scrubbed), (3, true));
    }
}
