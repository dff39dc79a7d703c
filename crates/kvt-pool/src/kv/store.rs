//! The steps of the KV commands on the index: space for a Store
//! (`reserve`, evicting or claiming blocks that wait for a commit when the
//! namespace is full), the Store landing (`commit_store`) or failing, a
//! Retrieve pinning the blocks it reads, Exist and Delete. A Store of a new
//! key takes a key's room from `reserve` until it ends.

use super::settings::OnFull;
use super::{Entry, KvIndex, State};
use crate::kv_index::Reserve;
use kvt_meta::journal::KvLoc;
use kvt_wire::nvme::{KvKey, Status, StoreOptions};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// The block number of an empty value's reservation when the Store counted
/// as a new key's (`KvIndex::count_new`); recorded values have block 0.
const EMPTY_COUNTED: u64 = 1;

impl KvIndex {
    fn blocks_for(&self, len: u32) -> u32 {
        len.div_ceil(self.block_size.max(1))
    }

    /// Space for a Store of `len` bytes under `key` with `opts`.
    pub fn reserve(
        &self,
        key: &KvKey,
        len: u32,
        opts: StoreOptions,
        now: Instant,
    ) -> Result<Reserve, Status> {
        let key = *key;
        self.with_state(move |ix, st| ix.reserve_in(st, &key, len, opts, now))
    }

    pub(super) fn reserve_in(
        &self,
        st: &mut State,
        key: &KvKey,
        len: u32,
        opts: StoreOptions,
        now: Instant,
    ) -> Result<Reserve, Status> {
        let settings = self.settings();
        let now_ms = self.ms(now);
        self.expire_if_old(st, key, now_ms, settings.ttl);
        let exists = st.slot_of(key).is_some();
        if opts.must_exist && !exists {
            return Err(Status::KV_KEY_DOES_NOT_EXIST);
        }
        if opts.must_not_exist && exists {
            return Err(Status::KV_KEY_EXISTS);
        }
        let nblocks = self.blocks_for(len);
        if nblocks as u64 > st.blocks.total {
            return Err(Status::KV_INVALID_VALUE_SIZE);
        }
        let evict = settings.on_full == OnFull::Evict;
        if !exists && st.map.len() as u64 + st.inflight_new >= self.max_keys {
            // Out of keys (the checkpoint's room), not of blocks.
            if !evict || !self.evict_one(st, now_ms, settings.ttl, Some(key)) {
                self.counters
                    .store_failures_full
                    .fetch_add(1, Ordering::Relaxed);
                return Err(Status::CAPACITY_EXCEEDED);
            }
        }
        let block = if nblocks == 0 {
            Some(0)
        } else {
            st.blocks.alloc(nblocks)
        };
        if let Some(block) = block {
            let mut loc = KvLoc {
                block,
                nblocks,
                len,
            };
            if !exists {
                Self::count_new(st, &mut loc);
            }
            return Ok(Reserve::Ready(loc));
        }
        // Room once given-up blocks are durable: evict until what waits for
        // the commit covers this value with some slack, so one commit serves
        // the next few Stores too (a full cache otherwise waits on every one).
        // A run found while evicting, claimed below without a second look.
        let mut run = None;
        if evict {
            let want = (nblocks as u64 * 2)
                .max(st.blocks.total / 64)
                .min(st.blocks.total);
            // Blocks a commit in flight carries count: they are free when it
            // lands, and evicting for them would cost live keys for nothing.
            while st.pending_blocks + st.committing_blocks + st.blocks.free < want {
                if !self.evict_one(st, now_ms, settings.ttl, Some(key)) {
                    break;
                }
            }
            // Enough blocks, yet values of mixed sizes can leave no run of
            // `nblocks` among them (64 KiB holes for a 1 MiB value): clear the
            // keys in a window among the oldest keys, a few windows at most
            // (one may hold a Store in flight or a key being read).
            for _ in 0..8 {
                run = Self::run_after_commit(st, nblocks);
                if run.is_some() {
                    break;
                }
                if !self.evict_window(st, now_ms, settings.ttl, key, nblocks) {
                    break;
                }
            }
        }
        if st.pending_blocks + st.committing_blocks > 0 {
            self.counters.commit_waits.fetch_add(1, Ordering::Relaxed);
            let run = run.or_else(|| Self::run_after_commit(st, nblocks));
            if let Some(block) = run {
                Self::claim(st, block, nblocks);
                let mut loc = KvLoc {
                    block,
                    nblocks,
                    len,
                };
                if !exists {
                    Self::count_new(st, &mut loc);
                }
                return Ok(Reserve::Claimed(loc));
            }
            return Ok(Reserve::AfterCommit);
        }
        self.counters
            .store_failures_full
            .fetch_add(1, Ordering::Relaxed);
        Err(Status::CAPACITY_EXCEEDED)
    }

    /// The value of a reserved Store is written: it becomes `key`'s. Fails
    /// (and frees the blocks) if a Store that finished meanwhile broke the
    /// store options.
    pub fn commit_store(
        &self,
        key: &KvKey,
        loc: KvLoc,
        opts: StoreOptions,
        now: Instant,
    ) -> Result<(), Status> {
        let key = *key;
        self.with_state(move |ix, st| ix.commit_store_in(st, &key, loc, opts, now))
    }

    pub(super) fn commit_store_in(
        &self,
        st: &mut State,
        key: &KvKey,
        loc: KvLoc,
        opts: StoreOptions,
        now: Instant,
    ) -> Result<(), Status> {
        let now_ms = self.ms(now);
        Self::uncount_new(st, loc);
        let old = st.slot_of(key);
        let refuse = match old {
            Some(_) if opts.must_not_exist => Some(Status::KV_KEY_EXISTS),
            None if opts.must_exist => Some(Status::KV_KEY_DOES_NOT_EXIST),
            _ => None,
        };
        if let Some(status) = refuse {
            // Never referenced by the index, durably or not: free at once.
            self.release_blocks(st, loc.block, loc.nblocks);
            return Err(status);
        }
        if let Some(slot) = old {
            self.give_up(st, slot);
        }
        // An empty value's mark is not a location (`count_new`).
        let loc = if loc.nblocks == 0 {
            KvLoc { block: 0, ..loc }
        } else {
            loc
        };
        let slot = match st.free_slots.pop() {
            Some(s) => s,
            None => {
                st.entries.push(None);
                (st.entries.len() - 1) as u32
            }
        };
        st.stored_blocks += loc.nblocks as u64;
        let pos = st.stored_blocks;
        st.entries[slot as usize] = Some(Entry::new(*key, loc, now_ms, pos));
        let had = st.index_key(key, slot);
        assert!(
            had.is_none(),
            "a stored key's old slot stayed in the key table"
        );
        st.order_insert(slot);
        st.age_push(slot);
        st.value_bytes += loc.len as u64;
        st.dirty.insert(*key);
        self.counters.stores.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// A reserved Store failed: its blocks go back. (`loc` says whether it
    /// counted as a new key's: the key is not needed.)
    pub fn abort_store(&self, _key: &KvKey, loc: KvLoc) {
        self.with_state(move |ix, st| ix.abort_store_in(st, loc))
    }

    pub(super) fn abort_store_in(&self, st: &mut State, loc: KvLoc) {
        Self::uncount_new(st, loc);
        self.release_blocks(st, loc.block, loc.nblocks);
    }

    /// A claimed Store's flush failed: the blocks go back, and wait for a
    /// commit again (some were given up by changes that may not be durable).
    pub fn abort_claim(&self, _key: &KvKey, loc: KvLoc) {
        self.with_state(move |_, st| Self::abort_claim_in(st, loc))
    }

    pub(super) fn abort_claim_in(st: &mut State, loc: KvLoc) {
        Self::uncount_new(st, loc);
        Self::pend(st, loc);
    }

    /// Looks `key` up for a Retrieve and pins its blocks until `end_read`.
    /// Returns the pin and where the value is.
    pub fn begin_read(&self, key: &KvKey, now: Instant) -> Result<(u32, KvLoc), Status> {
        let key = *key;
        self.with_state(move |ix, st| ix.begin_read_in(st, &key, now))
    }

    pub(super) fn begin_read_in(
        &self,
        st: &mut State,
        key: &KvKey,
        now: Instant,
    ) -> Result<(u32, KvLoc), Status> {
        let ttl = self.settings().ttl;
        let now_ms = self.ms(now);
        self.expire_if_old(st, key, now_ms, ttl);
        let Some(slot) = st.slot_of(key) else {
            self.counters.misses.fetch_add(1, Ordering::Relaxed);
            return Err(Status::KV_KEY_DOES_NOT_EXIST);
        };
        let Some(e) = st.entries.get_mut(slot as usize).and_then(|e| e.as_mut()) else {
            return Err(Status::INTERNAL_ERROR);
        };
        e.readers += 1;
        e.referenced = true;
        self.counters.hits.fetch_add(1, Ordering::Relaxed);
        Ok((slot, e.loc))
    }

    /// A Retrieve pinned by `begin_read` is done with the blocks.
    pub fn end_read(&self, pin: u32) {
        self.with_state(move |_, st| Self::end_read_in(st, pin))
    }

    pub(super) fn end_read_in(st: &mut State, pin: u32) {
        let done = match st.entries.get_mut(pin as usize).and_then(|e| e.as_mut()) {
            Some(e) => {
                assert!(e.readers > 0, "end_read without begin_read");
                e.readers -= 1;
                (!e.live && e.readers == 0).then_some(e.loc)
            }
            None => None,
        };
        if let Some(loc) = done {
            Self::pend(st, loc);
            st.entries[pin as usize] = None;
            st.free_slots.push(pin);
        }
    }

    /// Whether `key` holds a value (a hit for eviction's second chance, as a Retrieve).
    pub fn exists(&self, key: &KvKey, now: Instant) -> bool {
        let key = *key;
        self.with_state(move |ix, st| ix.exists_in(st, &key, now))
    }

    pub(super) fn exists_in(&self, st: &mut State, key: &KvKey, now: Instant) -> bool {
        let ttl = self.settings().ttl;
        let now_ms = self.ms(now);
        self.expire_if_old(st, key, now_ms, ttl);
        let found = match st.slot_of(key) {
            Some(slot) => {
                if let Some(e) = st.entries.get_mut(slot as usize).and_then(|e| e.as_mut()) {
                    e.referenced = true;
                }
                true
            }
            None => false,
        };
        let c = if found {
            &self.counters.hits
        } else {
            &self.counters.misses
        };
        c.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// Deletes `key`; Key Does Not Exist if it holds no value.
    pub fn delete(&self, key: &KvKey, now: Instant) -> Result<(), Status> {
        let key = *key;
        self.with_state(move |ix, st| ix.delete_in(st, &key, now))
    }

    pub(super) fn delete_in(
        &self,
        st: &mut State,
        key: &KvKey,
        now: Instant,
    ) -> Result<(), Status> {
        let ttl = self.settings().ttl;
        let now_ms = self.ms(now);
        self.expire_if_old(st, key, now_ms, ttl);
        let Some(slot) = st.slot_of(key) else {
            return Err(Status::KV_KEY_DOES_NOT_EXIST);
        };
        self.give_up(st, slot);
        self.counters.deletes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Deletes every key, a batch per call on the state (the owner serves
    /// commands between batches); the keys deleted. Stops when a batch
    /// deletes nothing (a key that refuses deletion is not retried forever).
    pub fn delete_all(&self, now: Instant) -> u64 {
        const BATCH: usize = 1024;
        let mut deleted = 0;
        loop {
            let (listed, gone) = self.with_state(move |ix, st| {
                let keys = ix.list_in(st, &KvKey::default(), BATCH, now);
                let gone = keys.iter().filter(|k| ix.delete_in(st, k, now).is_ok());
                (keys.len(), gone.count() as u64)
            });
            deleted += gone;
            if listed < BATCH || gone == 0 {
                return deleted;
            }
        }
    }

    /// A Store of a key the index does not hold reserved `loc`: it takes a
    /// key's room until it ends (`uncount_new`).
    /// An empty value has no block to mark: its reservation carries the mark
    /// as its block number (`EMPTY_COUNTED`, meaningless without blocks),
    /// and `commit_store` records block 0 as before.
    fn count_new(st: &mut State, loc: &mut KvLoc) {
        if loc.nblocks == 0 {
            loc.block = EMPTY_COUNTED;
        } else {
            debug_assert!(!st.new_stores.is_used(loc.block), "block reserved twice");
            st.new_stores.set(loc.block, 1, true);
        }
        st.inflight_new += 1;
    }

    /// The Store of `key` that reserved `loc` ends: the room it took, if it
    /// took one, goes back.
    fn uncount_new(st: &mut State, loc: KvLoc) {
        let counted = if loc.nblocks == 0 {
            loc.block == EMPTY_COUNTED
        } else {
            let marked = st.new_stores.is_used(loc.block);
            st.new_stores.set(loc.block, 1, false);
            marked
        };
        if counted {
            // Marked by `count_new`, which counted it.
            assert!(st.inflight_new > 0, "a new key's Store given back twice");
            st.inflight_new -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::*;
    use std::time::Instant;

    /// Stores racing on one key give back exactly the room they took: two
    /// Stores of one new key (the second an overwrite when it lands), and a
    /// Store of an existing key whose key is deleted before it lands. The
    /// count once stayed up by one for the first race, for good: each such
    /// race cost the namespace a key of its room until a restart.
    #[test]
    fn racing_stores_of_one_key_give_back_the_room_they_took() {
        let now = Instant::now();
        let ix = KvIndex::new(4096 * 64, 4096);
        let k = key(1);
        let ready = |r| match r {
            Ok(Reserve::Ready(loc)) => loc,
            other => panic!("{other:?}"),
        };
        for len in [4096, 0] {
            let a = ready(ix.reserve(&k, len, NONE, now));
            let b = ready(ix.reserve(&k, len, NONE, now));
            ix.commit_store(&k, a, NONE, now).unwrap();
            ix.commit_store(&k, b, NONE, now).unwrap();
            let c = ready(ix.reserve(&k, len, NONE, now));
            ix.delete(&k, now).unwrap();
            ix.commit_store(&k, c, NONE, now).unwrap();
            let d = ready(ix.reserve(&k, len, NONE, now));
            ix.abort_store(&k, d);
            ix.delete(&k, now).unwrap();
            assert_eq!(ix.with_state(|_, st| st.inflight_new), 0, "len {len}");
            assert!(ix.locations().is_empty());
        }
    }

    #[test]
    fn store_options_and_misses() {
        let now = Instant::now();
        let ix = KvIndex::new(1 << 20, 4096);
        let k = key(1);
        let mne = StoreOptions {
            must_not_exist: true,
            ..NONE
        };
        let me = StoreOptions {
            must_exist: true,
            ..NONE
        };
        assert_eq!(
            ix.reserve(&k, 10, me, now),
            Err(Status::KV_KEY_DOES_NOT_EXIST)
        );
        let Ok(Reserve::Ready(loc)) = ix.reserve(&k, 5000, mne, now) else {
            panic!("no space in an empty index");
        };
        assert_eq!(loc.nblocks, 2);
        // A second must-not-exist Store racing the first loses at commit.
        let Ok(Reserve::Ready(loc2)) = ix.reserve(&k, 10, mne, now) else {
            panic!("second reserve");
        };
        assert_eq!(ix.commit_store(&k, loc, mne, now), Ok(()));
        assert_eq!(
            ix.commit_store(&k, loc2, mne, now),
            Err(Status::KV_KEY_EXISTS)
        );
        assert_eq!(ix.reserve(&k, 10, mne, now), Err(Status::KV_KEY_EXISTS));
        assert!(ix.exists(&k, now));
        assert_eq!(ix.begin_read(&k, now).map(|r| r.1), Ok(loc));
        assert_eq!(ix.delete(&k, now), Ok(()));
        assert_eq!(ix.delete(&k, now), Err(Status::KV_KEY_DOES_NOT_EXIST));
        assert_eq!(ix.begin_read(&k, now), Err(Status::KV_KEY_DOES_NOT_EXIST));
        assert!(ix.verify().is_empty());
    }
}
