//! What a commit must journal, and the blocks that wait for it: the keys
//! changed since the last commit (`drain_changes`, or a whole checkpoint,
//! `drain_snapshot`), and the blocks keys gave up, free only once the
//! commit that records the change is durable (the crash rule, in `kv`).
//! A Store that finds no other room claims a run among them
//! (`run_after_commit`, `claim`) and waits for that commit.

use super::table::key_at;
use super::{KvIndex, State};
use kvt_meta::journal::KvLoc;
use kvt_wire::nvme::KvKey;
use std::collections::HashSet;
use std::sync::atomic::Ordering;

/// Slots a checkpoint copies per call on the index's state (`drain_snapshot`):
/// tens of microseconds of copying, so a command waits about that long at most.
pub(super) const SNAPSHOT_CHUNK: usize = 4096;

impl KvIndex {
    /// The index state of every key changed since the last call, as
    /// (key, Some(location) or None for gone), and the blocks given up before
    /// this call: free once the commit carrying these records is durable
    /// (`committed`).
    pub fn drain_changes(&self, out: &mut Vec<(KvKey, Option<KvLoc>)>) {
        // `out` travels to the state's holder and back; it grows here, on
        // the caller's thread, never on an owning reactor.
        let mut buf = std::mem::take(out);
        loop {
            let (back, short) = self.with_state(move |_, st| {
                let mut buf = buf;
                let need = st.dirty.len();
                if buf.capacity() - buf.len() < need {
                    return (buf, Some(need));
                }
                Self::drain_changes_in(st, &mut buf);
                (buf, None)
            });
            buf = back;
            match short {
                Some(need) => buf.reserve(need + need / 4 + 64),
                None => break,
            }
        }
        *out = buf;
    }

    fn drain_changes_in(st: &mut State, out: &mut Vec<(KvKey, Option<KvLoc>)>) {
        for key in st.dirty.drain() {
            let loc = st
                .map
                .get(&key, |s| key_at(&st.entries, s))
                .and_then(|s| st.entries.get(s as usize))
                .and_then(|e| e.as_ref())
                .map(|e| e.loc);
            out.push((key, loc));
        }
        Self::begin_commit(st);
    }

    /// Every key and its location for a checkpoint, with the same bookkeeping
    /// as `drain_changes`: the changes since the last commit are taken (the
    /// checkpoint holds them). Not a way to look at the index: `locations`.
    ///
    /// The index is copied a chunk of slots per call on its state, so a
    /// command waits for one chunk at most, not for the whole index. The copy
    /// is made exact at its end: every key changed since the last commit,
    /// during the copy too, is in the change set; in the call that ends the
    /// copy those keys' copied records are replaced by their state then.
    /// A key not in the change set kept its slot and location the whole time,
    /// so it was copied exactly once.
    pub fn drain_snapshot(&self) -> Vec<(KvKey, KvLoc)> {
        self.drain_snapshot_with(|| {})
    }

    /// `drain_snapshot`, running `between` after each chunk with the state
    /// let go (tests change the index there).
    fn drain_snapshot_with(&self, mut between: impl FnMut()) -> Vec<(KvKey, KvLoc)> {
        let keys = self.with_state(|_, st| st.map.len());
        let mut out = Vec::with_capacity(keys + SNAPSHOT_CHUNK);
        let mut slot = 0;
        loop {
            let from = slot;
            let (mut chunk, end, more) = self.with_state(move |_, st| {
                let end = (from + SNAPSHOT_CHUNK).min(st.entries.len());
                let live = st.entries[from.min(end)..end].iter().flatten();
                let chunk: Vec<_> = live.filter(|e| e.live).map(|e| (e.key, e.loc)).collect();
                (chunk, end, end < st.entries.len())
            });
            slot = end;
            // Grown here, not on the state's holder: a reallocation copies
            // the whole copy.
            out.append(&mut chunk);
            if !more {
                break;
            }
            between();
        }
        let mut changed = Vec::new();
        self.drain_changes(&mut changed);
        if !changed.is_empty() {
            let keys: HashSet<KvKey> = changed.iter().map(|(k, _)| *k).collect();
            out.retain(|(k, _)| !keys.contains(k));
            out.extend(changed.into_iter().filter_map(|(k, l)| Some((k, l?))));
        }
        out
    }

    /// Keys changed, or blocks given up, since the last commit took them.
    /// Read without the state: the holder keeps it current (`publish`).
    pub fn has_changes(&self) -> bool {
        self.changes.load(Ordering::Acquire)
    }

    /// The commit that drained changes is durable (`ok`): blocks given up
    /// before it are free. If it failed, they wait for the next one.
    pub fn committed(&self, ok: bool) {
        self.with_state(move |ix, st| ix.committed_in(st, ok))
    }

    fn committed_in(&self, st: &mut State, ok: bool) {
        let mut done = std::mem::take(&mut st.committing);
        st.committing_blocks = 0;
        if ok {
            for &(b, n) in &done {
                self.release_blocks(st, b, n);
            }
        } else {
            for &r in &done {
                Self::pend(
                    st,
                    KvLoc {
                        block: r.0,
                        nblocks: r.1,
                        len: 0,
                    },
                );
            }
        }
        // Its room back: the next commit's list does not allocate it again.
        done.clear();
        st.committing = done;
    }

    /// The given-up blocks join the commit being made.
    fn begin_commit(st: &mut State) {
        // Moved, not taken: the given-up list keeps its room, so the next
        // Store or Delete that gives blocks up does not allocate it again.
        st.committing.append(&mut st.pending_free);
        st.committing_blocks += st.pending_blocks;
        st.pending_blocks = 0;
    }

    pub(super) fn pend(st: &mut State, loc: KvLoc) {
        if loc.nblocks > 0 {
            st.pending_free.push((loc.block, loc.nblocks));
            st.pending_blocks += loc.nblocks as u64;
        }
    }

    /// A run of `n` contiguous blocks that will be free once the given-up
    /// blocks waiting for a commit (or in one) are, if there is one.
    pub(super) fn run_after_commit(st: &mut State, n: u32) -> Option<u64> {
        let State {
            blocks,
            after_commit,
            pending_free,
            committing,
            ..
        } = st;
        after_commit.words.copy_from_slice(&blocks.words);
        after_commit.free = blocks.free;
        for &(b, k) in pending_free.iter().chain(committing.iter()) {
            after_commit.set(b, k, false);
        }
        after_commit.find_run(n, blocks.hint)
    }

    /// Takes the run of `n` blocks from `block` that `run_after_commit`
    /// found out of the lists waiting for a commit: the commit frees them to
    /// the claimant only.
    pub(super) fn claim(st: &mut State, block: u64, n: u32) {
        let end = block + n as u64;
        st.blocks.set(block, n, true);
        st.blocks.hint = end;
        st.pending_blocks -= carve(&mut st.pending_free, block, end);
        st.committing_blocks -= carve(&mut st.committing, block, end);
    }
}

/// Removes blocks `start..end` from the (block, count) ranges in `list`,
/// splitting a range that straddles an end. Returns the blocks removed.
pub(super) fn carve(list: &mut Vec<(u64, u32)>, start: u64, end: u64) -> u64 {
    let mut removed = 0;
    let mut i = 0;
    while i < list.len() {
        let (b, k) = list[i];
        let e = b + k as u64;
        if e <= start || b >= end {
            i += 1;
            continue;
        }
        let (lo, hi) = (b.max(start), e.min(end));
        removed += hi - lo;
        // Both parts are shorter than the range they come from: no overflow.
        let before = (b < lo).then_some((b, (lo - b) as u32));
        let after = (hi < e).then_some((hi, (e - hi) as u32));
        match (before, after) {
            (Some(x), Some(y)) => {
                list[i] = x;
                list.insert(i + 1, y);
                i += 2;
            }
            (Some(x), None) | (None, Some(x)) => {
                list[i] = x;
                i += 1;
            }
            (None, None) => {
                list.swap_remove(i);
            }
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::*;
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;
    use std::time::Instant;

    #[test]
    fn given_up_blocks_wait_for_readers_and_the_commit() {
        let now = Instant::now();
        // 4 blocks of value space.
        let ix = KvIndex::new(4 * 4096 * 4, 4096);
        ix.set_settings(KvSettings {
            on_full: OnFull::Fail,
            ttl: None,
            keep_footprint: false,
        });
        let total = ix.total_blocks() as u32;
        let a = key(1);
        let loc = store(&ix, &a, total * 4096, now).unwrap_or_default();
        let (pin, _) = ix.begin_read(&a, now).unwrap_or((0, loc));
        assert_eq!(ix.delete(&a, now), Ok(()));
        // Deleted but read, and not committed: the space is not reusable.
        assert_eq!(
            ix.reserve(&key(2), 4096, NONE, now),
            Err(Status::CAPACITY_EXCEEDED)
        );
        ix.end_read(pin);
        // Given up, not durably: a Store claims a block to write after the
        // commit, and the rest still wait for it.
        let Ok(Reserve::Claimed(claim)) = ix.reserve(&key(2), 4096, NONE, now) else {
            panic!("no claim on blocks waiting for a commit");
        };
        assert_eq!(ix.snapshot().pending_free_blocks, total as u64 - 1);
        let mut out = Vec::new();
        ix.drain_changes(&mut out);
        assert_eq!(out, vec![(a, None)]);
        // A failed commit (the claimant's flush failed): nothing is free, the
        // claim's block waits for a commit again.
        ix.committed(false);
        ix.abort_claim(&key(2), claim);
        let s = ix.snapshot();
        assert_eq!((s.free_blocks, s.pending_free_blocks), (0, total as u64));
        let Ok(Reserve::Claimed(claim)) = ix.reserve(&key(2), 4096, NONE, now) else {
            panic!("no claim after a failed commit");
        };
        ix.drain_changes(&mut out);
        ix.committed(true);
        assert_eq!(ix.commit_store(&key(2), claim, NONE, now), Ok(()));
        let s = ix.snapshot();
        assert_eq!(
            (s.free_blocks, s.pending_free_blocks),
            (total as u64 - 1, 0)
        );
        assert!(matches!(
            ix.reserve(&key(3), 4096, NONE, now),
            Ok(Reserve::Ready(_))
        ));
        assert!(ix.verify().is_empty());
    }

    /// Stores that wait for one commit each own the blocks they will write:
    /// Stores arriving after the commit cannot take them (CI: under a Zipf
    /// churn, a Store lost the blocks four commits freed to newer Stores and
    /// failed with Capacity Exceeded on a namespace set to evict).
    #[test]
    fn stores_waiting_for_a_commit_keep_their_blocks() {
        let now = Instant::now();
        // 16 values of 4 blocks fill it.
        let ix = KvIndex::new(64 * 4096, 4096);
        let mut durable = BTreeMap::new();
        for i in 0..16 {
            assert!(store_with(&ix, &key(i), 16384, now, &mut durable).is_ok());
        }
        commit(&ix, &mut durable);
        // Four Stores find it full: each evicts and claims its own run.
        let mut claims = Vec::new();
        for i in 100..104 {
            match ix.reserve(&key(i), 16384, NONE, now) {
                Ok(Reserve::Claimed(loc)) => claims.push((key(i), loc)),
                other => panic!("key {i}: {other:?}"),
            }
        }
        let overlap = |a: &KvLoc, b: &KvLoc| {
            a.block < b.block + b.nblocks as u64 && b.block < a.block + a.nblocks as u64
        };
        for (i, (_, a)) in claims.iter().enumerate() {
            assert!(
                claims[i + 1..].iter().all(|(_, b)| !overlap(a, b)),
                "{claims:?}"
            );
        }
        // Their flushes' commit lands; newer Stores run before they write.
        commit(&ix, &mut durable);
        for i in 200..220 {
            let loc = store_with(&ix, &key(i), 16384, now, &mut durable);
            let loc = loc.unwrap_or_else(|s| panic!("newer key {i}: {s:?}"));
            assert!(
                claims.iter().all(|(_, c)| !overlap(c, &loc)),
                "{loc:?} in {claims:?}"
            );
        }
        for (k, loc) in &claims {
            assert_eq!(ix.commit_store(k, *loc, NONE, now), Ok(()));
        }
        commit(&ix, &mut durable);
        assert!(claims.iter().all(|(k, _)| durable.contains_key(k)));
        assert!(ix.verify().is_empty(), "{:?}", ix.verify());
    }

    /// Changes made between a checkpoint's chunks (`between`): Stores of new
    /// and existing keys, Deletes. Only Stores that find room at once: a
    /// commit never runs during a checkpoint (one metadata thread makes both).
    fn change_between(ix: &KvIndex, ops: &[(bool, u32, u32)], now: Instant) {
        for &(put, k, len) in ops {
            if put {
                if let Ok(Reserve::Ready(loc)) = ix.reserve(&key(k), len, NONE, now) {
                    let _ = ix.commit_store(&key(k), loc, NONE, now);
                }
            } else {
                let _ = ix.delete(&key(k), now);
            }
        }
    }

    /// A checkpoint copied in chunks while the index changes between them is
    /// the index as it is when the copy ends: every live key once, at its
    /// current location, nothing else; and the commit it ends frees only
    /// blocks no key holds. (The copy once took the lock for the whole index:
    /// `between` would deadlock there.)
    #[test]
    fn a_checkpoint_copied_in_chunks_is_the_index_at_its_end() {
        let now = Instant::now();
        let ix = KvIndex::new(256 << 20, 512);
        let n = 2 * SNAPSHOT_CHUNK as u32 + 1000;
        for k in 0..n {
            store(&ix, &key(k), 700, now).unwrap_or_else(|s| panic!("store {k}: {s:?}"));
        }
        let mut gaps = 0;
        let snap = ix.drain_snapshot_with(|| {
            gaps += 1;
            // Keys already copied deleted and stored again (new slots), keys
            // not yet copied overwritten, new keys, a key stored then deleted.
            let ops: Vec<(bool, u32, u32)> = (0..300)
                .map(|i| match i % 4 {
                    0 => (false, i * 7 % n, 0),
                    1 => (true, i * 7 % n, 1500),
                    2 => (true, n - 1 - i, 100),
                    _ => (true, n + i, 512),
                })
                .chain([(true, n + 999, 512), (false, n + 999, 0)])
                .collect();
            change_between(&ix, &ops, now);
        });
        assert_eq!(gaps, 2, "three chunks, two gaps");
        let got: BTreeMap<KvKey, KvLoc> = snap.iter().copied().collect();
        assert_eq!(got.len(), snap.len(), "a key copied twice");
        let want: BTreeMap<KvKey, KvLoc> = ix.locations().into_iter().collect();
        assert_eq!(got, want);
        assert!(!ix.has_changes(), "the copy's end drains the change set");
        ix.committed(true);
        assert!(ix.verify().is_empty(), "{:?}", ix.verify());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// The same with random Stores and Deletes between the chunks.
        #[test]
        fn a_checkpoint_copied_under_random_changes_is_exact(
            ops in proptest::collection::vec(
                proptest::collection::vec((any::<bool>(), 0u32..12_000, 1u32..3000), 0..200),
                3,
            ),
        ) {
            let now = Instant::now();
            let ix = KvIndex::new(256 << 20, 512);
            for k in 0..9000 {
                prop_assert!(store(&ix, &key(k), 512, now).is_ok());
            }
            let mut gap = ops.iter();
            let snap = ix.drain_snapshot_with(|| {
                change_between(&ix, gap.next().map_or(&[][..], |v| &v[..]), now)
            });
            let got: BTreeMap<KvKey, KvLoc> = snap.iter().copied().collect();
            prop_assert_eq!(got.len(), snap.len());
            let want: BTreeMap<KvKey, KvLoc> = ix.locations().into_iter().collect();
            prop_assert_eq!(got, want);
            ix.committed(true);
            prop_assert!(ix.verify().is_empty());
        }
    }

    proptest! {
        /// `carve` removes exactly the blocks of a range from a list of
        /// disjoint ranges, splitting the ones it cuts.
        #[test]
        fn carve_removes_exactly_the_range(
            lens in proptest::collection::vec((0u64..6, 1u32..6), 0..12),
            start in 0u64..80,
            n in 1u64..20,
        ) {
            let mut list = Vec::new();
            let mut at = 0;
            for (gap, k) in lens {
                list.push((at + gap, k));
                at += gap + k as u64;
            }
            let blocks = |l: &[(u64, u32)]| -> std::collections::BTreeSet<u64> {
                l.iter().flat_map(|&(b, k)| b..b + k as u64).collect()
            };
            let before = blocks(&list);
            let removed = carve(&mut list, start, start + n);
            let after = blocks(&list);
            let want: std::collections::BTreeSet<u64> =
                before.iter().copied().filter(|b| !(start..start + n).contains(b)).collect();
            prop_assert_eq!(&after, &want);
            prop_assert_eq!(removed, (before.len() - after.len()) as u64);
            prop_assert!(list.iter().all(|&(_, k)| k > 0));
        }
    }

    /// Blocks a commit in flight carries are room: a Store waits for that
    /// commit instead of evicting live keys (CI: a verified Retrieve run
    /// missed keys its own prefill had stored, evicted while a commit ran).
    #[test]
    fn a_commit_in_flight_is_room_not_a_reason_to_evict() {
        let now = Instant::now();
        // 16 values of 4 blocks fill it.
        let ix = KvIndex::new(64 * 4096, 4096);
        for i in 0..16 {
            assert!(store(&ix, &key(i), 16384, now).is_ok());
        }
        for i in 0..4 {
            assert_eq!(ix.delete(&key(i), now), Ok(()));
        }
        // The commit carrying the Deletes starts: their blocks are in it.
        let mut out = Vec::new();
        ix.drain_changes(&mut out);
        assert_eq!(ix.snapshot().pending_free_blocks, 16);
        // The Store claims blocks that commit frees and waits for it.
        let Ok(Reserve::Claimed(loc)) = ix.reserve(&key(100), 16384, NONE, now) else {
            panic!("no claim on the commit in flight");
        };
        assert_eq!(ix.snapshot().evictions, 0);
        assert_eq!(ix.snapshot().pending_free_blocks, 12);
        ix.committed(true);
        assert_eq!(ix.commit_store(&key(100), loc, NONE, now), Ok(()));
        let s = ix.snapshot();
        assert_eq!(
            (s.evictions, s.free_blocks, s.pending_free_blocks),
            (0, 12, 0)
        );
        assert!(ix.verify().is_empty());
    }
}
