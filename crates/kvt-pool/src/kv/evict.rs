//! The eviction order of a full namespace: the live keys from the oldest
//! Store to the newest (a list threaded through the entries), taken from
//! the old end with a second chance for keys read since (CLOCK over store
//! order); the newest eighth of the capacity is kept while older keys
//! remain. A large value that finds no run among free blocks clears a
//! window at the oldest keys' blocks.

use super::ttl::expired;
use super::{Entry, KvIndex, State, NIL};
use kvt_wire::nvme::KvKey;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Windows `evict_window` weighs: those at the oldest keys' blocks.
const WINDOW_CANDIDATES: usize = 8;

impl State {
    /// Puts live `slot` at the newest end of the age list.
    pub(super) fn age_push(&mut self, slot: u32) {
        let prev = self.newest;
        {
            let e = self.node_mut(slot);
            e.older = prev;
            e.newer = NIL;
        }
        if prev == NIL {
            self.oldest = slot;
        } else {
            self.node_mut(prev).newer = slot;
        }
        self.newest = slot;
    }

    /// Takes `slot` out of the age list.
    pub(super) fn age_unlink(&mut self, slot: u32) {
        let (older, newer) = {
            let e = self.node(slot);
            (e.older, e.newer)
        };
        if older == NIL {
            assert_eq!(self.oldest, slot, "age list head is not the oldest key");
            self.oldest = newer;
        } else {
            self.node_mut(older).newer = newer;
        }
        if newer == NIL {
            assert_eq!(self.newest, slot, "age list tail is not the newest key");
            self.newest = older;
        } else {
            self.node_mut(newer).older = older;
        }
        let e = self.node_mut(slot);
        e.older = NIL;
        e.newer = NIL;
    }

    /// Whether a key stored at `stored_pos` is among the newest eighth of
    /// the namespace's capacity, which eviction keeps while older keys remain.
    fn young(&self, stored_pos: u64) -> bool {
        self.stored_blocks - stored_pos < self.blocks.total / 8
    }
}

impl KvIndex {
    /// Counts `e` leaving the index: an expiration, or an eviction and its age.
    fn count_gone(&self, e: &Entry, now_ms: u64, ttl: Option<Duration>) {
        if expired(e, now_ms, ttl) {
            self.counters.expirations.fetch_add(1, Ordering::Relaxed);
        } else {
            // Saturating: reactors pass their own clocks, so a key may be stored
            // at a `now` later than this caller's.
            let age = now_ms.saturating_sub(e.stored_ms);
            self.counters.evictions.fetch_add(1, Ordering::Relaxed);
            self.counters
                .eviction_age_ms
                .fetch_add(age, Ordering::Relaxed);
        }
    }

    /// Makes a run of `n` blocks where the keys in its way are coldest: of
    /// the windows at the blocks of the oldest keys not hit since they were
    /// last passed over, evicts the keys in the one holding the fewest hit
    /// keys, then the one whose newest key is oldest, never `keep`. When even that window holds
    /// a key of the newest eighth, evicts the oldest key alone instead (a
    /// young key goes only when nothing older is left). False when there is
    /// nothing to evict.
    pub(super) fn evict_window(
        &self,
        st: &mut State,
        now_ms: u64,
        ttl: Option<Duration>,
        keep: &KvKey,
        n: u32,
    ) -> bool {
        // `reserve` refused values larger than the volume before evicting.
        assert!(
            n as u64 <= st.blocks.total,
            "a window wider than the volume"
        );
        let last_start = st.blocks.total - n as u64;
        let mut starts = [0u64; WINDOW_CANDIDATES];
        let mut count = 0;
        let mut t = st.oldest;
        while t != NIL && count < WINDOW_CANDIDATES {
            let e = st.node(t);
            if e.key != *keep && e.loc.nblocks > 0 && !e.referenced {
                starts[count] = e.loc.block.min(last_start);
                count += 1;
            }
            t = e.newer;
        }
        if count == 0 {
            return self.evict_one(st, now_ms, ttl, Some(keep));
        }
        // Per window, its hit keys and its newest Store, in one scan of
        // every key: only when a value cannot be placed at all.
        let mut hot = [0u32; WINDOW_CANDIDATES];
        let mut newest = [0u64; WINDOW_CANDIDATES];
        for e in st.entries.iter().flatten() {
            if !e.live || e.key == *keep || e.loc.nblocks == 0 {
                continue;
            }
            for j in 0..count {
                let s = starts[j];
                if e.loc.block < s + n as u64 && e.loc.block + e.loc.nblocks as u64 > s {
                    hot[j] += u32::from(e.referenced);
                    newest[j] = newest[j].max(e.stored_pos);
                }
            }
        }
        let Some(best) = (0..count).min_by_key(|&j| (hot[j], newest[j])) else {
            return false;
        };
        let (start, pos) = (starts[best], newest[best]);
        if st.young(pos) {
            return self.evict_one(st, now_ms, ttl, Some(keep));
        }
        self.evict_range(st, now_ms, ttl, keep, start, start + n as u64);
        true
    }

    /// Evicts every live key with blocks in `start..end`, never `keep`.
    fn evict_range(
        &self,
        st: &mut State,
        now_ms: u64,
        ttl: Option<Duration>,
        keep: &KvKey,
        start: u64,
        end: u64,
    ) {
        for i in 0..st.entries.len() {
            let hit = st.entries[i].as_ref().is_some_and(|e| {
                e.live
                    && e.key != *keep
                    && e.loc.nblocks > 0
                    && e.loc.block < end
                    && e.loc.block + e.loc.nblocks as u64 > start
            });
            if hit {
                if let Some(e) = st.entries[i].as_ref() {
                    self.count_gone(e, now_ms, ttl);
                }
                self.give_up(st, i as u32);
            }
        }
    }

    /// Evicts the oldest key whose second chance is spent (expired keys
    /// first as they are met), never `keep` (the key being stored): from the
    /// old end of the age list, a referenced key has its bit cleared and
    /// goes to the new end, and so does a key of the newest eighth (a hit
    /// older key goes behind it, and is still older). Only when every key is
    /// spared twice over is the oldest taken regardless. False when there is
    /// none to evict.
    pub(super) fn evict_one(
        &self,
        st: &mut State,
        now_ms: u64,
        ttl: Option<Duration>,
        keep: Option<&KvKey>,
    ) -> bool {
        // One lap clears every bit, so a second finds a victim unless every
        // key left is young.
        let laps = 2 * st.map.len() + 1;
        for step in 0..2 * laps {
            let slot = st.oldest;
            if slot == NIL {
                return false;
            }
            let young = step < laps && st.young(st.node(slot).stored_pos);
            let e = st.node_mut(slot);
            assert!(e.live, "a given-up key in the age list");
            let spare =
                keep == Some(&e.key) || (!expired(e, now_ms, ttl) && (e.referenced || young));
            if spare {
                // A hit buys one pass; youth keeps its hit for after.
                e.referenced &= young;
                st.age_unlink(slot);
                st.age_push(slot);
                continue;
            }
            self.count_gone(st.node(slot), now_ms, ttl);
            self.give_up(st, slot);
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::*;
    use std::collections::{BTreeMap, HashSet};
    use std::time::Instant;

    #[test]
    fn full_namespace_evicts_by_clock() {
        let now = Instant::now();
        // 16 values of 4 blocks fill it (and its 16 keys).
        let ix = KvIndex::new(64 * 4096, 4096);
        let n = 16u32;
        assert_eq!(ix.max_keys(), n as u64);
        for i in 0..n {
            assert!(store(&ix, &key(i), 16384, now).is_ok());
        }
        assert_eq!(ix.snapshot().evictions, 0);
        // Key 0 is hot: it survives the evictions the next stores cause.
        for i in n..n + 8 {
            assert!(ix.exists(&key(0), now));
            assert!(store(&ix, &key(i), 16384, now).is_ok(), "store {i}");
        }
        assert!(ix.exists(&key(0), now));
        let s = ix.snapshot();
        assert!(s.evictions >= 8, "{s:?}");
        assert!(ix.verify().is_empty());
        ix.set_settings(KvSettings {
            on_full: OnFull::Fail,
            ttl: None,
            keep_footprint: false,
        });
        let mut failed = false;
        for i in 1000..1000 + n {
            failed |= store(&ix, &key(i), 16384, now) == Err(Status::CAPACITY_EXCEEDED);
        }
        assert!(failed);
    }

    /// A namespace of small values with holes between them still places a
    /// large value: eviction clears a window instead of finding enough free
    /// blocks, none of them contiguous, and refusing (the bug: 1 MiB Stores
    /// into a namespace fragmented by 64 KiB values all got Capacity Exceeded).
    #[test]
    fn fragmented_namespace_evicts_a_window_for_a_large_value() {
        let now = Instant::now();
        let ix = KvIndex::new(256 * 4096, 4096);
        let mut durable = BTreeMap::new();
        for i in 0..64 {
            assert!(store_with(&ix, &key(i), 16384, now, &mut durable).is_ok());
        }
        for i in (0..64).step_by(2) {
            assert!(ix.delete(&key(i), now).is_ok());
        }
        commit(&ix, &mut durable);
        // Half the blocks are free, in 4-block holes: no run of 16.
        let loc = store_with(&ix, &key(1000), 16 * 4096, now, &mut durable);
        let loc = loc.expect("the large value is placed");
        assert_eq!(loc.nblocks, 16);
        assert!(ix.exists(&key(1000), now));
        // Targeted: the keys in one 16-block window, not most of the cache.
        let evicted = ix.snapshot().evictions;
        assert!((1..=4).contains(&evicted), "{:?}", ix.snapshot());
        assert!(ix.verify().is_empty());
        // Nothing durable shares the new value's blocks (the crash rule).
        commit(&ix, &mut durable);
        for (k, l) in &durable {
            let overlap = l.block < loc.block + 16 && loc.block < l.block + l.nblocks as u64;
            assert!(*k == key(1000) || !overlap, "{k:?} {l:?} overlaps {loc:?}");
        }
    }

    /// Mixed-size churn, then large values: after every Store, each key
    /// stored in the newest eighth of the capacity is still there, while
    /// older keys are evicted oldest first (the bug: slot-order CLOCK with
    /// a new key unreferenced and windows cleared by position evicted 1 to
    /// 8 of the newest 32 values in 5 of 6 runs).
    #[test]
    fn the_newest_keys_are_never_evicted_while_older_ones_remain() {
        let now = Instant::now();
        let total = 1024u64;
        let ix = KvIndex::new(total * 4096, 4096);
        let mut durable = BTreeMap::new();
        let mut rng = 0x2545_F491_4F6C_DD1Du64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for _ in 0..600 {
            let k = key(next() as u32 % 100);
            if next() % 10 < 3 {
                let _ = ix.delete(&k, now);
            } else {
                let len = (1 + next() % 32) as u32 * 4096;
                assert!(store_with(&ix, &k, len, now, &mut durable).is_ok());
            }
        }
        // (key, blocks stored after it): the newest eighth is under total/8.
        let mut order: Vec<(KvKey, u64)> = Vec::new();
        for i in 0..300u32 {
            let k = key(10_000 + i);
            let nblocks = 8 + next() % 9;
            let len = nblocks as u32 * 4096;
            assert!(
                store_with(&ix, &k, len, now, &mut durable).is_ok(),
                "store {i}"
            );
            for o in &mut order {
                o.1 += nblocks;
            }
            let present: HashSet<KvKey> = ix.locations().into_iter().map(|(k, _)| k).collect();
            for (k, after) in &order {
                assert!(
                    *after >= total / 8 || present.contains(k),
                    "store {i}: {k:?}, with {after} blocks stored after it, was evicted"
                );
            }
            order.push((k, 0));
        }
        // Eviction went by age: of the large values, the oldest quarter is
        // gone (the bug kept many of the oldest) and the newest is whole.
        let present: HashSet<KvKey> = ix.locations().into_iter().map(|(k, _)| k).collect();
        let quarter = order.len() / 4;
        let kept = |q: &[(KvKey, u64)]| q.iter().filter(|(k, _)| present.contains(k)).count();
        let (oldest, newest) = (kept(&order[..quarter]), kept(&order[3 * quarter..]));
        assert!(
            oldest * 20 <= quarter,
            "{oldest} of the oldest {quarter} kept"
        );
        assert_eq!(newest, order.len() - 3 * quarter, "newest quarter");
        assert!(ix.verify().is_empty());
    }

    /// A value that fits in a free run is placed there: nothing is evicted,
    /// however full the rest is and wherever the allocator last stopped.
    #[test]
    fn no_eviction_while_a_value_fits() {
        let now = Instant::now();
        let ix = KvIndex::new(256 * 4096, 4096);
        let mut durable = BTreeMap::new();
        for i in 0..64 {
            assert!(store_with(&ix, &key(i), 4 * 4096, now, &mut durable).is_ok());
        }
        // One 8-block hole early on, behind the allocator's next-fit hint.
        assert!(ix.delete(&key(3), now).is_ok());
        assert!(ix.delete(&key(4), now).is_ok());
        commit(&ix, &mut durable);
        assert!(store_with(&ix, &key(100), 8 * 4096, now, &mut durable).is_ok());
        assert_eq!(ix.snapshot().evictions, 0, "{:?}", ix.snapshot());
        assert!(ix.verify().is_empty());
    }
}
