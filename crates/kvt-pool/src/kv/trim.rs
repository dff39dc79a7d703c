//! Space back to the pool: an extent of the volume whose blocks have all
//! been free for `trim_after` (and durably so) is handed to the metadata
//! thread (`trim_step`), which unmaps it; GC scrubs it under admission
//! control like any deallocated extent. Its blocks stay marked used
//! meanwhile, so no Store writes into an extent being unmapped. Waiting
//! keeps a churning cache, which reuses freed blocks as soon as next fit
//! comes round, from paying a scrub and a fresh mapping for space it takes
//! back at once.

use super::{KvIndex, State};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How long an extent's blocks stay all free before it goes back to the pool.
pub const TRIM_AFTER: Duration = Duration::from_secs(5);

/// Extents one `trim_step` hands over at most (the rest wait a tick), so the
/// owner never spends one call scanning a whole large volume.
const TRIM_BATCH: usize = 256;

impl KvIndex {
    /// The index of a volume of `blocks_per_extent` blocks per extent: its
    /// free extents go back to the pool. Every extent starts as a candidate,
    /// so after recovery the ones no key uses are trimmed too.
    pub fn with_extents(mut self, blocks_per_extent: u32) -> KvIndex {
        self.extent_blocks = blocks_per_extent as u64;
        if blocks_per_extent > 0 {
            let home = self.home.get_mut().unwrap_or_else(|p| p.into_inner());
            let Some(st) = home.as_mut() else {
                unreachable!("a new index's state is home");
            };
            let extents = st.blocks.total.div_ceil(blocks_per_extent as u64);
            let n = extents.min(u32::MAX as u64) as u32;
            st.freed_extents = (0..n).collect();
            st.trim_since.reserve(n as usize);
            st.trim_queue.reserve(n as usize);
            self.trim_fresh.store(n > 0, Ordering::Release);
        }
        self
    }

    /// How long an extent's blocks must stay free before it is trimmed.
    pub fn set_trim_after(&self, d: Duration) {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        self.trim_after_ms.store(ms, Ordering::Relaxed);
    }

    /// Freed extents wait to be trimmed (now or at a time already set).
    pub fn trim_pending(&self) -> bool {
        self.trim_fresh.load(Ordering::Acquire)
            || self.trim_due_ms.load(Ordering::Acquire) != u64::MAX
    }

    /// Blocks no key holds any more, durably: free for Stores, and their
    /// extents are candidates to go back to the pool.
    pub(super) fn release_blocks(&self, st: &mut State, block: u64, n: u32) {
        st.blocks.set(block, n, false);
        let eb = self.extent_blocks;
        if eb == 0 || n == 0 {
            return;
        }
        for e in block / eb..=(block + n as u64 - 1) / eb {
            let e = e as u32;
            if st.freed_extents.last() != Some(&e) {
                st.freed_extents.push(e);
            }
        }
        self.trim_fresh.store(true, Ordering::Release);
    }

    /// Extents whose blocks have all been free for `trim_after` and which
    /// `mapped` says hold storage, at most `TRIM_BATCH` of them, appended to
    /// `out`. Their blocks are taken until `trimmed` gives them back, so the
    /// caller may unmap them. Cheap when nothing is due (the state is not
    /// touched).
    pub fn trim_step(&self, now: Instant, mapped: impl Fn(u32) -> bool, out: &mut Vec<u32>) {
        let Some(due) = self.with_state_if_trim_due(now) else {
            return;
        };
        // `mapped` reads the volume here, on the caller's thread; extents it
        // says hold nothing are given back at once.
        let (keep, unmapped): (Vec<u32>, Vec<u32>) = due.into_iter().partition(|&e| mapped(e));
        out.extend(keep);
        if !unmapped.is_empty() {
            self.with_state(move |ix, st| ix.untake_in(st, &unmapped));
        }
    }

    /// The extents due for trimming, their blocks taken (see `trim_step`);
    /// `None` when nothing is due.
    fn with_state_if_trim_due(&self, now: Instant) -> Option<Vec<u32>> {
        let now_ms = self.ms(now);
        if self.extent_blocks == 0
            || (!self.trim_fresh.load(Ordering::Acquire)
                && now_ms < self.trim_due_ms.load(Ordering::Acquire))
        {
            return None;
        }
        // Made here, on the caller's thread, with room for a whole batch: the
        // owning reactor fills it without allocating (a `Vec::new` there grew
        // five times for a 64-extent volume's first batch, and
        // `pool_no_alloc` failed whenever its run crossed `trim_after`).
        let out = Vec::with_capacity(TRIM_BATCH);
        Some(self.with_state(move |ix, st| {
            let mut out = out;
            ix.trim_due_in(st, now, &mut out);
            assert!(out.len() <= TRIM_BATCH, "a trim batch past TRIM_BATCH");
            out
        }))
    }

    /// Gives back the blocks of extents `trim_step` took but will not trim.
    fn untake_in(&self, st: &mut State, extents: &[u32]) {
        let eb = self.extent_blocks;
        for &e in extents {
            let first = e as u64 * eb;
            assert!(first < st.blocks.total, "extent {e} past the volume's end");
            let n = eb.min(st.blocks.total - first);
            st.blocks.set(first, n as u32, false);
        }
    }

    fn trim_due_in(&self, st: &mut State, now: Instant, out: &mut Vec<u32>) {
        let now_ms = self.ms(now);
        if self.extent_blocks == 0
            || (!self.trim_fresh.load(Ordering::Acquire)
                && now_ms < self.trim_due_ms.load(Ordering::Acquire))
        {
            return;
        }
        let after = self.trim_after_ms.load(Ordering::Relaxed);
        let keep_footprint = self.settings().keep_footprint;
        let eb = self.extent_blocks;
        self.trim_fresh.store(false, Ordering::Release);
        for &e in &st.freed_extents {
            if st.trim_since.insert(e, now_ms).is_none() {
                st.trim_queue.push_back((e, now_ms));
            }
        }
        st.freed_extents.clear();
        if keep_footprint {
            // Remembered, not trimmed: `set_settings` looks again.
            self.trim_due_ms.store(u64::MAX, Ordering::Release);
            return;
        }
        let first_out = out.len();
        while let Some(&(e, since)) = st.trim_queue.front() {
            // Saturating: `set_trim_after` takes any duration (an operator's).
            if since.saturating_add(after) > now_ms || out.len() - first_out >= TRIM_BATCH {
                break;
            }
            st.trim_queue.pop_front();
            match st.trim_since.get(&e) {
                // Freed again since: wait from then (behind newer entries at
                // most `after` late, which only delays a trim).
                Some(&latest) if latest > since => {
                    st.trim_queue.push_back((e, latest));
                    continue;
                }
                _ => {
                    st.trim_since.remove(&e);
                }
            }
            let first = e as u64 * eb;
            // Queued from `release_blocks` and `with_extents`: inside the volume.
            assert!(first < st.blocks.total, "extent {e} past the volume's end");
            let n = eb.min(st.blocks.total - first);
            if !st.blocks.all_free(first, n) {
                continue;
            }
            st.blocks.set(first, n as u32, true);
            out.push(e);
        }
        let due = match st.trim_queue.front() {
            Some(_) if out.len() - first_out >= TRIM_BATCH => now_ms,
            Some(&(_, since)) => since.saturating_add(after),
            None => u64::MAX,
        };
        self.trim_due_ms.store(due, Ordering::Release);
    }

    /// The extents `trim_step` handed over are unmapped: their blocks are
    /// free again (a Store there maps a fresh extent).
    pub fn trimmed(&self, extents: &[u32]) {
        if extents.is_empty() {
            return;
        }
        let extents = extents.to_vec();
        let n = extents.len() as u64;
        self.with_state(move |ix, st| ix.untake_in(st, &extents));
        self.counters
            .trimmed_extents
            .fetch_add(n, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::*;
    use std::collections::BTreeMap;
    use std::time::{Duration, Instant};

    /// Extents whose blocks stay free for `trim_after` go to the caller to
    /// unmap: only mapped ones, never one a Store took meanwhile; a free
    /// again restarts the wait; the blocks are taken until `trimmed`.
    #[test]
    fn free_extents_go_back_to_the_pool_after_a_while() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // 4 extents of 16 blocks.
        let ix = KvIndex::new(64 * 4096, 4096).with_extents(16);
        ix.set_trim_after(Duration::from_secs(1));
        let mut durable = BTreeMap::new();
        let mut out = Vec::new();
        let all = |_| true;
        for i in 0..4 {
            let loc = store_with(&ix, &key(i), 16 * 4096, at(0), &mut durable);
            assert_eq!(loc.map(|l| l.block), Ok(i as u64 * 16));
        }
        ix.trim_step(at(0), all, &mut out);
        assert_eq!(ix.delete(&key(1), at(0)), Ok(()));
        assert_eq!(ix.delete(&key(2), at(0)), Ok(()));
        // Not durable yet: nothing to trim however long it waits.
        ix.trim_step(at(5000), all, &mut out);
        assert!(out.is_empty(), "{out:?}");
        commit(&ix, &mut durable);
        ix.trim_step(at(5000), all, &mut out);
        assert!(out.is_empty(), "due a second after the commit: {out:?}");
        // A Store that failed in extent 1 frees a block there again.
        let Ok(Reserve::Ready(loc)) = ix.reserve(&key(50), 1, NONE, at(5200)) else {
            panic!("no room for one block");
        };
        assert_eq!(loc.block, 16);
        ix.abort_store(&key(50), loc);
        ix.trim_step(at(5200), all, &mut out);
        ix.trim_step(at(6000), all, &mut out);
        assert_eq!(out, vec![2], "extent 1 waits from 5200");
        // Being trimmed: its blocks are nobody's to take.
        assert_eq!(ix.snapshot().free_blocks, 16);
        ix.trimmed(&out);
        assert_eq!(ix.snapshot().free_blocks, 32);
        assert_eq!(ix.snapshot().trimmed_extents, 1);
        out.clear();
        // A Store takes blocks of extents 1 and 2 before extent 1 is due.
        let loc = store_with(&ix, &key(9), 16 * 4096, at(6100), &mut durable);
        assert_eq!(loc.map(|l| l.block), Ok(17));
        ix.trim_step(at(6200), all, &mut out);
        assert!(out.is_empty(), "{out:?}");
        // Freed again: an unmapped extent needs nothing, a mapped one goes.
        assert_eq!(ix.delete(&key(9), at(6300)), Ok(()));
        commit(&ix, &mut durable);
        ix.trim_step(at(6300), all, &mut out);
        ix.trim_step(at(7200), all, &mut out);
        assert!(out.is_empty(), "{out:?}");
        ix.trim_step(at(7300), |e| e != 1, &mut out);
        assert_eq!(out, vec![2]);
        ix.trimmed(&out);
        assert_eq!(ix.snapshot().trimmed_extents, 2);
        assert!(ix.verify().is_empty());
        // A plain index (no extents) never hands one over.
        out.clear();
        let plain = KvIndex::new(64 * 4096, 4096);
        plain.trim_step(at(100_000), all, &mut out);
        assert!(out.is_empty());
    }

    /// `keep_footprint` keeps free extents mapped; turned off, the ones that
    /// have been free long enough go at once.
    #[test]
    fn a_namespace_that_keeps_its_footprint_trims_nothing_until_told() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let ix = KvIndex::new(64 * 4096, 4096).with_extents(16);
        ix.set_trim_after(Duration::from_secs(1));
        let keep = KvSettings {
            keep_footprint: true,
            ..KvSettings::default()
        };
        ix.set_settings(keep);
        let mut durable = BTreeMap::new();
        let mut out = Vec::new();
        for i in 0..4 {
            assert!(store_with(&ix, &key(i), 16 * 4096, at(0), &mut durable).is_ok());
        }
        ix.trim_step(at(0), |_| true, &mut out);
        for i in 0..2 {
            assert_eq!(ix.delete(&key(i), at(0)), Ok(()));
        }
        commit(&ix, &mut durable);
        ix.trim_step(at(100), |_| true, &mut out);
        ix.trim_step(at(60_000), |_| true, &mut out);
        assert!(out.is_empty(), "{out:?}");
        assert_eq!(ix.snapshot().free_blocks, 32);
        // Setting it again changes nothing.
        ix.set_settings(keep);
        ix.trim_step(at(61_000), |_| true, &mut out);
        assert!(out.is_empty(), "{out:?}");
        ix.set_settings(KvSettings::default());
        ix.trim_step(at(61_000), |_| true, &mut out);
        out.sort_unstable();
        assert_eq!(out, vec![0, 1]);
        ix.trimmed(&out);
        assert_eq!(ix.snapshot().trimmed_extents, 2);
        assert!(ix.verify().is_empty());
    }
}
