//! A volume's in-memory state, shared by every reactor that serves it.
//!
//! Each logical extent has one atomic word: the physical extent it maps to, a
//! FREEING bit, and a pin count. I/O pins the extent for as long as the device
//! works on it, so an extent can only be unmapped (and later handed to another
//! volume) when nothing uses it: the freer sets FREEING with a compare-and-swap
//! that requires zero pins, checks the valid-block bitmap, and either unmaps or
//! backs off. First writes from several queues race on the same word, so exactly
//! one physical extent wins.

use super::format::{VolumeDesc, NO_EXTENT, VOL_UNWRITTEN_ERROR};
use crossbeam_queue::ArrayQueue;
use kvt_meta::checkpoint::ExtentMapping;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

const PHYS_BITS: u32 = 28;
const PHYS_MASK: u64 = (1 << PHYS_BITS) - 1;
const FREEING: u64 = 1 << PHYS_BITS;
const PIN: u64 = 1 << (PHYS_BITS + 1);

fn phys_of(word: u64) -> Option<u32> {
    match word & PHYS_MASK {
        0 => None,
        p => Some((p - 1) as u32),
    }
}

/// Why a write could not get an extent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocError {
    /// No clean extent now; GC or a reservation will produce one.
    Wait,
    /// The pool is full.
    NoSpace,
    /// The pool's metadata failed; nothing can be allocated.
    Failed,
}

/// One extent's part of a byte range of a volume (`Volume::pieces`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// Logical extent of the volume.
    pub lext: u32,
    /// Byte offset of the piece inside the extent.
    pub offset: u64,
    pub len: u64,
}

/// A run of blocks inside one extent (`Volume::invalid_runs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockRun {
    /// First block of the run, counted from the extent's start.
    pub first: u32,
    pub count: u32,
}

/// Iterator over the per-extent pieces of a byte range.
pub struct Pieces {
    shift: u32,
    at: u64,
    end: u64,
}

impl Iterator for Pieces {
    type Item = Piece;
    fn next(&mut self) -> Option<Piece> {
        if self.at >= self.end {
            return None;
        }
        let es = 1u64 << self.shift;
        let lext = (self.at >> self.shift) as u32;
        let off = self.at & (es - 1);
        let n = (es - off).min(self.end - self.at);
        self.at += n;
        Some(Piece {
            lext,
            offset: off,
            len: n,
        })
    }
}

/// I/O counters of one channel (one reactor's path to a volume). Only that
/// reactor writes them, so they never bounce between cores; readers sum.
#[derive(Debug, Default)]
pub struct ChannelStats {
    pub reads: AtomicU64,
    pub read_bytes: AtomicU64,
    pub read_ns: AtomicU64,
    pub writes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub write_ns: AtomicU64,
    pub unmaps: AtomicU64,
    pub unmap_bytes: AtomicU64,
    pub unmap_ns: AtomicU64,
    pub flushes: AtomicU64,
    pub errors: AtomicU64,
    /// Foreground commands in flight on this channel (GC admission watches
    /// it with the latency sums above).
    pub inflight: AtomicU64,
    /// Latency histograms (see `LATENCY_BUCKETS_US`), counts per bucket.
    pub read_hist: [AtomicU64; LATENCY_BUCKETS],
    pub write_hist: [AtomicU64; LATENCY_BUCKETS],
}

pub use kvt_mem::stats::{latency_bucket, latency_bucket_le_us, LATENCY_BUCKETS};

/// Summed counters of a volume.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct IoTotals {
    pub reads: u64,
    pub read_bytes: u64,
    pub read_ns: u64,
    pub writes: u64,
    pub write_bytes: u64,
    pub write_ns: u64,
    pub unmaps: u64,
    pub unmap_bytes: u64,
    pub unmap_ns: u64,
    pub flushes: u64,
    pub errors: u64,
    pub read_hist: [u64; LATENCY_BUCKETS],
    pub write_hist: [u64; LATENCY_BUCKETS],
}

pub struct Volume {
    pub desc: VolumeDesc,
    pub blocks_per_extent: u32,
    words_per_extent: usize,
    extent_shift: u32,
    slots: Box<[AtomicU64]>,
    bitmaps: Box<[AtomicU64]>,
    dirty: Box<[AtomicBool]>,
    /// Logical extents whose `dirty` flag is set, each at most once (a flag
    /// is cleared only after its entry is popped), so `dirty.len()` slots
    /// always suffice and marking an extent dirty never allocates.
    dirty_queue: ArrayQueue<u32>,
    used_blocks: AtomicU64,
    /// Set when the volume is deleted: open channels fail new I/O.
    pub deleted: AtomicBool,
    /// Every channel's counters (kept after the channel closes).
    stats: std::sync::Mutex<Vec<std::sync::Arc<ChannelStats>>>,
    /// The key index of a KV volume (`VOL_KV`).
    pub kv: Option<std::sync::Arc<super::kv::KvIndex>>,
    /// The reservation its namespace persists (Persist Through Power Loss),
    /// as last handed to the metadata thread: what checkpoints carry. Only
    /// the control path and the metadata thread touch it.
    resv: std::sync::Mutex<Option<super::format::VolumeResv>>,
}

impl Volume {
    pub fn new(desc: VolumeDesc, extent_size: u64) -> Volume {
        let blocks_per_extent = (extent_size / desc.block_size as u64) as u32;
        let words_per_extent = (blocks_per_extent as usize).div_ceil(64);
        let n = desc.size_bytes.div_ceil(extent_size) as usize;
        let kv = (desc.flags & super::format::VOL_KV != 0).then(|| {
            super::kv::KvIndex::new(desc.size_bytes, desc.block_size)
                .with_extents(blocks_per_extent)
                .into_shared()
        });
        Volume {
            kv,
            desc,
            blocks_per_extent,
            words_per_extent,
            extent_shift: extent_size.trailing_zeros(),
            slots: (0..n).map(|_| AtomicU64::new(0)).collect(),
            bitmaps: (0..n * words_per_extent)
                .map(|_| AtomicU64::new(0))
                .collect(),
            dirty: (0..n).map(|_| AtomicBool::new(false)).collect(),
            dirty_queue: ArrayQueue::new(n.max(1)),
            used_blocks: AtomicU64::new(0),
            deleted: AtomicBool::new(false),
            stats: std::sync::Mutex::new(Vec::new()),
            resv: std::sync::Mutex::new(None),
        }
    }

    /// The reservation its namespace persists, if any.
    pub fn reservation(&self) -> Option<super::format::VolumeResv> {
        match self.resv.lock() {
            Ok(r) => r.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Sets the persisted reservation (recovery, the metadata thread).
    pub(super) fn set_reservation(&self, resv: Option<super::format::VolumeResv>) {
        match self.resv.lock() {
            Ok(mut r) => *r = resv,
            Err(p) => *p.into_inner() = resv,
        }
    }

    /// Counters for a new channel.
    pub fn new_channel_stats(&self) -> std::sync::Arc<ChannelStats> {
        let s = std::sync::Arc::new(ChannelStats::default());
        if let Ok(mut v) = self.stats.lock() {
            v.push(s.clone());
        }
        s
    }

    /// Foreground commands in flight on this volume, over its channels.
    pub fn inflight(&self) -> u64 {
        self.stats
            .lock()
            .map(|v| v.iter().map(|s| s.inflight.load(Ordering::Relaxed)).sum())
            .unwrap_or(0)
    }

    /// What GC admission watches, summed over the channels in one hold of
    /// their list: commands in flight, and commands completed and their
    /// summed latency (ns). `inflight` and `io_totals` in one, without the
    /// histograms the metadata thread does not read.
    pub fn fg_load(&self) -> (u64, u64, u64) {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let Ok(v) = self.stats.lock() else {
            return (0, 0, 0);
        };
        v.iter().fold((0, 0, 0), |(inflight, ops, ns), s| {
            (
                inflight + r(&s.inflight),
                ops + r(&s.reads) + r(&s.writes) + r(&s.unmaps),
                ns + r(&s.read_ns) + r(&s.write_ns) + r(&s.unmap_ns),
            )
        })
    }

    /// The volume's I/O counters, summed over its channels.
    pub fn io_totals(&self) -> IoTotals {
        let mut t = IoTotals::default();
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        if let Ok(v) = self.stats.lock() {
            for s in v.iter() {
                t.reads += r(&s.reads);
                t.read_bytes += r(&s.read_bytes);
                t.read_ns += r(&s.read_ns);
                t.writes += r(&s.writes);
                t.write_bytes += r(&s.write_bytes);
                t.write_ns += r(&s.write_ns);
                t.unmaps += r(&s.unmaps);
                t.unmap_bytes += r(&s.unmap_bytes);
                t.unmap_ns += r(&s.unmap_ns);
                t.flushes += r(&s.flushes);
                t.errors += r(&s.errors);
                for i in 0..LATENCY_BUCKETS {
                    t.read_hist[i] += r(&s.read_hist[i]);
                    t.write_hist[i] += r(&s.write_hist[i]);
                }
            }
        }
        t
    }

    pub fn extent_count(&self) -> u32 {
        self.slots.len() as u32
    }
    pub fn extent_size(&self) -> u64 {
        1 << self.extent_shift
    }
    pub fn unwritten_error(&self) -> bool {
        self.desc.flags & VOL_UNWRITTEN_ERROR != 0
    }
    pub fn used_bytes(&self) -> u64 {
        self.used_blocks.load(Ordering::Relaxed) * self.desc.block_size as u64
    }
    /// Splits a byte range into its pieces, one per extent it touches.
    pub fn pieces(&self, offset: u64, len: u64) -> Pieces {
        Pieces {
            shift: self.extent_shift,
            at: offset,
            end: offset.saturating_add(len),
        }
    }

    fn slot(&self, lext: u32) -> Option<&AtomicU64> {
        self.slots.get(lext as usize)
    }

    /// The physical extent, without pinning (for metadata snapshots).
    pub fn mapping(&self, lext: u32) -> Option<u32> {
        self.slot(lext)
            .and_then(|s| phys_of(s.load(Ordering::Acquire)))
    }

    /// Pins a mapped extent for I/O; `None` when unmapped.
    pub fn pin(&self, lext: u32) -> Option<u32> {
        let slot = self.slot(lext)?;
        loop {
            let s = slot.load(Ordering::Acquire);
            if s & FREEING != 0 {
                std::hint::spin_loop();
                continue;
            }
            let phys = phys_of(s)?;
            if slot
                .compare_exchange_weak(s, s + PIN, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Some(phys);
            }
        }
    }

    /// Pins the extent, mapping it on first write with an extent from `alloc`.
    /// Returns the physical extent and whether this call mapped it. An extent
    /// allocated but not used (another queue mapped first) goes to `unused`.
    pub fn pin_or_map(
        &self,
        lext: u32,
        mut alloc: impl FnMut() -> Result<u32, AllocError>,
        mut unused: impl FnMut(u32),
    ) -> Result<(u32, bool), AllocError> {
        let Some(slot) = self.slot(lext) else {
            return Err(AllocError::NoSpace);
        };
        let mut candidate: Option<u32> = None;
        loop {
            let s = slot.load(Ordering::Acquire);
            if s & FREEING != 0 {
                std::hint::spin_loop();
                continue;
            }
            let (new, mapped) = match phys_of(s) {
                Some(_) => (s + PIN, None),
                None => {
                    let c = match candidate {
                        Some(c) => c,
                        None => {
                            let c = alloc()?;
                            candidate = Some(c);
                            c
                        }
                    };
                    ((s & !PHYS_MASK) + (c as u64 + 1) + PIN, Some(c))
                }
            };
            if slot
                .compare_exchange_weak(s, new, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                if mapped.is_none() {
                    if let Some(c) = candidate {
                        unused(c);
                    }
                }
                if mapped.is_some() {
                    self.mark_dirty(lext);
                }
                return Ok((phys_of(new).unwrap_or(NO_EXTENT), mapped.is_some()));
            }
        }
    }

    pub fn unpin(&self, lext: u32) {
        if let Some(s) = self.slot(lext) {
            s.fetch_sub(PIN, Ordering::AcqRel);
        }
    }

    fn words(&self, lext: u32) -> &[AtomicU64] {
        let at = lext as usize * self.words_per_extent;
        self.bitmaps
            .get(at..at + self.words_per_extent)
            .unwrap_or(&[])
    }

    /// Applies `f(word_index, mask)` for the blocks [first, first + n) of an extent.
    fn for_masks(first: u32, n: u32, mut f: impl FnMut(usize, u64)) {
        let (mut b, end) = (first as u64, first as u64 + n as u64);
        while b < end {
            let w = (b / 64) as usize;
            let lo = b % 64;
            let hi = (end - (w as u64) * 64).min(64);
            let mask = if hi - lo == 64 {
                u64::MAX
            } else {
                ((1u64 << (hi - lo)) - 1) << lo
            };
            f(w, mask);
            b = (w as u64 + 1) * 64;
        }
    }

    /// Marks blocks written. Call with the extent pinned.
    pub fn set_valid(&self, lext: u32, first: u32, n: u32) {
        // Valid blocks in an unmapped extent would read another extent's data.
        debug_assert!(
            self.mapping(lext).is_some(),
            "volume {}: blocks made valid in unmapped extent {lext}",
            self.desc.name
        );
        let words = self.words(lext);
        let mut added = 0u64;
        Self::for_masks(first, n, |w, mask| {
            if let Some(word) = words.get(w) {
                let old = word.fetch_or(mask, Ordering::AcqRel);
                added += (mask & !old).count_ones() as u64;
            }
        });
        if added > 0 {
            self.used_blocks.fetch_add(added, Ordering::Relaxed);
            self.mark_dirty(lext);
        }
    }

    /// Marks blocks deallocated; returns true when the extent has no valid block
    /// left. Call with the extent pinned.
    pub fn clear_valid(&self, lext: u32, first: u32, n: u32) -> bool {
        let words = self.words(lext);
        let mut removed = 0u64;
        Self::for_masks(first, n, |w, mask| {
            if let Some(word) = words.get(w) {
                let old = word.fetch_and(!mask, Ordering::AcqRel);
                removed += (mask & old).count_ones() as u64;
            }
        });
        if removed > 0 {
            self.used_blocks.fetch_sub(removed, Ordering::Relaxed);
            self.mark_dirty(lext);
        }
        words.iter().all(|w| w.load(Ordering::Acquire) == 0)
    }

    /// True when every block in the range is valid.
    pub fn all_valid(&self, lext: u32, first: u32, n: u32) -> bool {
        let words = self.words(lext);
        let mut ok = true;
        Self::for_masks(first, n, |w, mask| {
            ok &= words
                .get(w)
                .is_some_and(|word| word.load(Ordering::Acquire) & mask == mask);
        });
        ok
    }

    /// Runs of blocks in [first, first + n) that are not valid, appended to
    /// `out`.
    pub fn invalid_runs(&self, lext: u32, first: u32, n: u32, out: &mut Vec<BlockRun>) {
        let words = self.words(lext);
        let mut run: Option<BlockRun> = None;
        let mut b = first;
        let end = first + n;
        while b < end {
            let w = words
                .get((b / 64) as usize)
                .map_or(0, |w| w.load(Ordering::Acquire));
            // Whole word valid: skip to its end.
            if b % 64 == 0 && w == u64::MAX && end - b >= 64 {
                if let Some(r) = run.take() {
                    out.push(r);
                }
                b += 64;
                continue;
            }
            if w & (1 << (b % 64)) == 0 {
                match &mut run {
                    Some(r) => r.count += 1,
                    None => run = Some(BlockRun { first: b, count: 1 }),
                }
            } else if let Some(r) = run.take() {
                out.push(r);
            }
            b += 1;
        }
        if let Some(r) = run {
            out.push(r);
        }
    }

    /// Tries to unmap an extent with no valid block. Returns the physical extent
    /// it freed, `Ok(None)` when there was nothing to free (unmapped or valid
    /// blocks again), and `Err(())` when it is pinned and must be retried later.
    #[allow(clippy::result_unit_err)]
    pub fn try_unmap_empty(&self, lext: u32) -> Result<Option<u32>, ()> {
        let Some(slot) = self.slot(lext) else {
            return Ok(None);
        };
        let s = slot.load(Ordering::Acquire);
        let Some(phys) = phys_of(s) else {
            return Ok(None);
        };
        if s & !PHYS_MASK != 0 {
            return Err(()); // pinned or already being freed
        }
        if slot
            .compare_exchange(s, s | FREEING, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(());
        }
        // No pins and FREEING set: nobody can change the bitmap now.
        if self
            .words(lext)
            .iter()
            .all(|w| w.load(Ordering::Acquire) == 0)
        {
            slot.store(0, Ordering::Release);
            self.mark_dirty(lext);
            Ok(Some(phys))
        } else {
            slot.store(s, Ordering::Release);
            Ok(None)
        }
    }

    /// Unmaps every extent at or beyond `from_lext` (volume delete or shrink),
    /// returning the physical extents. Only when no I/O can reach the volume.
    pub fn unmap_from(&self, from_lext: u32) -> Vec<u32> {
        let mut freed = Vec::new();
        for lext in from_lext..self.extent_count() {
            if let Some(slot) = self.slot(lext) {
                if let Some(p) = phys_of(slot.swap(0, Ordering::AcqRel)) {
                    freed.push(p);
                }
            }
            for w in self.words(lext) {
                let old = w.swap(0, Ordering::AcqRel);
                self.used_blocks
                    .fetch_sub(old.count_ones() as u64, Ordering::Relaxed);
            }
        }
        freed
    }

    /// Clears blocks past the end of a shrunken volume inside its last extent.
    pub fn clear_tail(&self, size_bytes: u64) {
        let bs = self.desc.block_size as u64;
        let lext = (size_bytes >> self.extent_shift) as u32;
        let first = ((size_bytes & (self.extent_size() - 1)) / bs) as u32;
        if first > 0 && lext < self.extent_count() {
            self.clear_valid(lext, first, self.blocks_per_extent - first);
        }
    }

    fn mark_dirty(&self, lext: u32) {
        if let Some(d) = self.dirty.get(lext as usize) {
            if !d.swap(true, Ordering::AcqRel) {
                let queued = self.dirty_queue.push(lext);
                assert!(queued.is_ok(), "extent {lext} dirty twice in the queue");
            }
        }
    }

    /// Takes the logical extents changed since the last call, clearing their
    /// flags before reading their state so a concurrent change re-queues them.
    pub fn drain_dirty(&self, out: &mut Vec<ExtentMapping>) {
        while let Some(lext) = self.dirty_queue.pop() {
            if let Some(d) = self.dirty.get(lext as usize) {
                d.store(false, Ordering::Release);
            }
            out.push(ExtentMapping {
                vol: self.desc.id,
                lext,
                phys: self.mapping(lext).unwrap_or(NO_EXTENT),
                bitmap: self.bitmap(lext),
            });
        }
    }

    /// Forgets pending changes (a checkpoint is about to capture everything).
    pub fn clear_dirty(&self) {
        while let Some(lext) = self.dirty_queue.pop() {
            if let Some(d) = self.dirty.get(lext as usize) {
                d.store(false, Ordering::Release);
            }
        }
    }

    pub fn has_dirty(&self) -> bool {
        !self.dirty_queue.is_empty()
    }

    /// The valid-block bitmap of one extent, little-endian bytes.
    pub fn bitmap(&self, lext: u32) -> Vec<u8> {
        let nbytes = (self.blocks_per_extent as usize).div_ceil(8);
        let mut out = Vec::with_capacity(self.words_per_extent * 8);
        for w in self.words(lext) {
            out.extend_from_slice(&w.load(Ordering::Acquire).to_le_bytes());
        }
        out.truncate(nbytes);
        out
    }

    /// Restores one extent's state (recovery): mapping and bitmap.
    pub fn restore(&self, lext: u32, phys: Option<u32>, bitmap: &[u8]) {
        let Some(slot) = self.slot(lext) else {
            return;
        };
        slot.store(phys.map_or(0, |p| p as u64 + 1), Ordering::Release);
        let words = self.words(lext);
        for (i, w) in words.iter().enumerate() {
            let mut b = [0u8; 8];
            for (j, x) in b.iter_mut().enumerate() {
                *x = bitmap.get(i * 8 + j).copied().unwrap_or(0);
            }
            let mut v = u64::from_le_bytes(b);
            // Only blocks that exist in the extent count.
            // i < words_per_extent = ceil(blocks_per_extent / 64).
            let valid_bits = self.blocks_per_extent as u64 - i as u64 * 64;
            if valid_bits < 64 {
                v &= (1u64 << valid_bits) - 1;
            }
            if phys.is_none() {
                v = 0;
            }
            let old = w.swap(v, Ordering::AcqRel);
            self.used_blocks
                .fetch_add(v.count_ones() as u64, Ordering::Relaxed);
            self.used_blocks
                .fetch_sub(old.count_ones() as u64, Ordering::Relaxed);
        }
    }

    /// Every mapped extent: (logical, physical).
    pub fn mapped(&self) -> Vec<(u32, u32)> {
        (0..self.extent_count())
            .filter_map(|l| self.mapping(l).map(|p| (l, p)))
            .collect()
    }

    /// A copy of this volume's state at a new size (resize while not served).
    pub fn resized(&self, size_bytes: u64) -> Volume {
        let mut desc = self.desc.clone();
        desc.size_bytes = size_bytes;
        let v = Volume::new(desc, self.extent_size());
        for lext in 0..v.extent_count().min(self.extent_count()) {
            if let Some(p) = self.mapping(lext) {
                v.restore(lext, Some(p), &self.bitmap(lext));
            }
        }
        v.clear_tail(size_bytes);
        v.set_reservation(self.reservation());
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn vol(size: u64) -> Volume {
        Volume::new(
            VolumeDesc {
                id: 1,
                name: "v".into(),
                uuid: [0; 16],
                size_bytes: size,
                block_size: 4096,
                flags: 0,
            },
            1 << 20,
        )
    }

    #[test]
    fn bitmaps_track_valid_blocks_and_empty_extents_unmap() {
        let v = vol(4 << 20);
        let (p, mapped) = v.pin_or_map(1, || Ok(7), |_| {}).unwrap();
        assert_eq!((p, mapped), (7, true));
        v.set_valid(1, 10, 100);
        assert_eq!(v.used_bytes(), 100 * 4096);
        assert!(v.all_valid(1, 10, 100));
        assert!(!v.all_valid(1, 9, 2));
        assert!(!v.clear_valid(1, 10, 50));
        assert_eq!(v.try_unmap_empty(1), Err(()), "pinned");
        assert!(v.clear_valid(1, 60, 50));
        v.unpin(1);
        assert_eq!(v.try_unmap_empty(1), Ok(Some(7)));
        assert_eq!(v.mapping(1), None);
        assert_eq!(v.used_bytes(), 0);
        let mut d = Vec::new();
        v.drain_dirty(&mut d);
        let unmapped = ExtentMapping {
            vol: v.desc.id,
            lext: 1,
            phys: NO_EXTENT,
            bitmap: vec![0u8; 32],
        };
        assert_eq!(d, vec![unmapped]);
    }

    #[test]
    fn invalid_runs_find_holes() {
        let v = vol(1 << 20);
        v.pin_or_map(0, || Ok(1), |_| {}).unwrap();
        v.set_valid(0, 0, 100);
        v.clear_valid(0, 10, 5);
        v.clear_valid(0, 70, 1);
        let mut out = Vec::new();
        v.invalid_runs(0, 0, 130, &mut out);
        let run = |first, count| BlockRun { first, count };
        assert_eq!(out, vec![run(10, 5), run(70, 1), run(100, 30)]);
        out.clear();
        v.invalid_runs(0, 64, 6, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn pieces_split_on_extent_boundaries() {
        let v = vol(4 << 20);
        let p: Vec<_> = v.pieces((1 << 20) - 4096, 8192).collect();
        let piece = |lext, offset, len| Piece { lext, offset, len };
        assert_eq!(p, vec![piece(0, (1 << 20) - 4096, 4096), piece(1, 0, 4096)]);
    }

    #[test]
    fn concurrent_first_writes_map_exactly_once() {
        for _ in 0..200 {
            let v = Arc::new(vol(1 << 20));
            let next = Arc::new(AtomicU64::new(100));
            let unused = Arc::new(crossbeam_queue::SegQueue::new());
            let hs: Vec<_> = (0..2)
                .map(|i| {
                    let (v, next, unused) = (v.clone(), next.clone(), unused.clone());
                    std::thread::spawn(move || {
                        let (p, _) = v
                            .pin_or_map(
                                0,
                                || Ok(next.fetch_add(1, Ordering::Relaxed) as u32),
                                |c| unused.push(c),
                            )
                            .unwrap();
                        v.set_valid(0, i * 8, 8);
                        v.unpin(0);
                        p
                    })
                })
                .collect();
            let ps: Vec<u32> = hs.into_iter().map(|h| h.join().unwrap()).collect();
            assert_eq!(ps[0], ps[1]);
            let allocated = next.load(Ordering::Relaxed) - 100;
            assert_eq!(allocated as usize - unused.len(), 1);
            assert_eq!(v.used_bytes(), 16 * 4096);
        }
    }

    #[test]
    fn restore_and_resize_keep_state() {
        let v = vol(3 << 20);
        v.restore(2, Some(9), &[0xff; 32]);
        assert_eq!(v.used_bytes(), 256 * 4096);
        let small = v.resized((2 << 20) + 8192);
        assert_eq!(small.mapping(2), Some(9));
        assert_eq!(small.used_bytes(), 2 * 4096);
        let freed = small.unmap_from(1);
        assert_eq!(freed, vec![9]);
        assert_eq!(small.used_bytes(), 0);
    }
}
