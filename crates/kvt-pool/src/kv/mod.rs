//! The key index of a KV namespace: which blocks of its volume hold each key's
//! value, the free blocks among them, eviction by age with a second chance
//! (CLOCK over store order) and an optional TTL, and the keys changed since
//! the pool's last commit. Values live in the volume's
//! blocks, so in the pool's extents; the index is journaled (`Record::KvPut`,
//! `Record::KvDelete`) and checkpointed with the rest of the pool's metadata.
//!
//! Crash rule: blocks a key gave up (Delete, eviction, overwrite, TTL) are
//! reused only after a commit has made that change durable. Reused earlier, a
//! crash could recover the old key pointing at another key's data. So a Store
//! that finds no free run while given-up blocks wait for a commit claims a
//! run among them (`Reserve::Claimed`), asks for that commit (a Flush of the
//! volume) and writes there once it is durable. The claim takes the blocks out
//! of what the commit frees: Stores arriving meanwhile cannot take them, so a
//! waiting Store is never starved by newer ones.
//!
//! One reactor owns the index's state (`kv_owner`): the first to run a KV
//! command of the namespace takes it, answers its own queues' asks in place
//! and the other reactors' by message, so a KV command takes no lock. Until a
//! reactor takes it (and in tools and tests without reactors) the state waits
//! in a mutex, which only those cold paths touch; the metadata thread's calls
//! run on the owner and wait for it (`home`). The key table, the bitmaps and
//! the lists are sized at creation so the command path does not allocate.
//!
//! The index by concern, each file with its tests:
//! - `table`: each live key to its entry (`key_slots`, the hash table of slots);
//! - `order`: the keys in byte order, for List;
//! - `blocks`: the allocator of the volume's blocks;
//! - `evict`: the eviction order of a full namespace;
//! - `ttl`: key ages and expiry; `settings`: the cache policy;
//! - `changes`: what a commit journals, and the blocks that wait for it;
//! - `trim`: extents whose blocks are all free, back to the pool;
//! - `store`: the steps of the KV commands; `restore`: recovery;
//! - `home`: where the state is, and how a call reaches it.

mod blocks;
mod changes;
mod evict;
mod home;
mod key_slots;
mod order;
mod restore;
mod settings;
mod store;
mod table;
#[cfg(test)]
mod testing;
mod trim;
mod ttl;

pub use crate::kv_index::Reserve;
use crate::kv_index::{KvAnswer, KvAsk};
use blocks::Blocks;
pub(crate) use home::{StateHolder, StateJob};
use key_slots::KeySlots;
pub use kvt_meta::journal::KvLoc;
use kvt_meta::superblock::NO_EXTENT;
pub use kvt_meta::superblock::{KV_BYTES_PER_KEY, KV_CKPT_ENTRY_BYTES};
use kvt_wire::nvme::KvKey;
use settings::PackedSettings;
pub use settings::{KvSettings, OnFull};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Instant;
pub use trim::TRIM_AFTER;

/// Counters of one KV namespace (monotonic, except the gauges).
#[derive(Debug, Default)]
pub struct KvCounters {
    pub stores: AtomicU64,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub deletes: AtomicU64,
    pub evictions: AtomicU64,
    pub expirations: AtomicU64,
    /// Sum of the evicted keys' ages (since stored), milliseconds.
    pub eviction_age_ms: AtomicU64,
    /// Stores that waited for a commit to reuse given-up blocks.
    pub commit_waits: AtomicU64,
    pub store_failures_full: AtomicU64,
    /// Extents whose blocks were all free long enough to go back to the pool.
    pub trimmed_extents: AtomicU64,
}

/// A point-in-time view for RPC and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KvSnapshot {
    pub keys: u64,
    pub max_keys: u64,
    pub value_bytes: u64,
    pub used_blocks: u64,
    pub free_blocks: u64,
    pub pending_free_blocks: u64,
    pub total_blocks: u64,
    pub stores: u64,
    pub hits: u64,
    pub misses: u64,
    pub deletes: u64,
    pub evictions: u64,
    pub expirations: u64,
    pub eviction_age_ms: u64,
    pub commit_waits: u64,
    pub store_failures_full: u64,
    pub trimmed_extents: u64,
}

struct Entry {
    key: KvKey,
    loc: KvLoc,
    /// Second chance: set by every hit; an eviction that finds it set
    /// clears it and moves the key to the newest end of the age list
    /// instead of evicting it.
    referenced: bool,
    /// Retrieves reading its blocks now: they are given up only after.
    readers: u32,
    /// Still the key's value (not deleted, evicted or overwritten).
    live: bool,
    stored_ms: u64,
    /// Its place in the key order (`State::root`), while live: the slots
    /// of the keys before and after it in the treap, and its heap priority.
    left: u32,
    right: u32,
    prio: u32,
    /// Its place in the age list (`State::oldest`), while live: the slots
    /// of the next older and next newer keys.
    older: u32,
    newer: u32,
    /// `State::stored_blocks` just after its Store: how much was stored
    /// after it is how young it is (`State::young`).
    stored_pos: u64,
}

impl Entry {
    fn new(key: KvKey, loc: KvLoc, stored_ms: u64, stored_pos: u64) -> Entry {
        Entry {
            key,
            loc,
            referenced: false,
            readers: 0,
            live: true,
            stored_ms,
            left: NIL,
            right: NIL,
            prio: 0,
            older: NIL,
            newer: NIL,
            stored_pos,
        }
    }
}

/// No slot: an empty subtree of the key order.
const NIL: u32 = u32::MAX;

/// An index's state: one holder has it at a time (`home`). Its fields by
/// the file that keeps them.
pub(super) struct State {
    // The key table (`table`).
    /// Each live key to its entry's slot.
    map: KeySlots,
    entries: Vec<Option<Entry>>,
    free_slots: Vec<u32>,
    /// The live keys' value lengths, summed.
    value_bytes: u64,

    // The key order (`order`).
    /// The live keys in byte order, for List: a treap threaded through the
    /// entries (`Entry::left`, `right`, `prio`), so keeping it allocates
    /// nothing and List walks from its start key without copying the index.
    root: u32,
    /// The treap's priorities (xorshift).
    rng: u64,

    // The allocator (`blocks`), and the Stores of new keys in flight (`store`).
    blocks: Blocks,
    /// Stores of new keys between `reserve` and `commit_store` (or an
    /// abort), each marked (`count_new`): what a Store counted is what it
    /// gives back, whatever happened to its key meanwhile (two Stores of one
    /// new key both count; a Delete may come between).
    inflight_new: u64,
    /// The marks: the first block of a counted Store's reservation.
    new_stores: Blocks,

    // The eviction order (`evict`).
    /// The live keys from the oldest Store to the newest (a list threaded
    /// through the entries): eviction takes from the old end, so a value is
    /// evicted by its age, not by where its slot or its blocks happen to be.
    oldest: u32,
    newest: u32,
    /// Blocks stored since the index was made (restored keys count): the
    /// clock `Entry::stored_pos` is read on.
    stored_blocks: u64,

    // What the next commit journals, and the blocks waiting for it (`changes`).
    /// Keys whose index state changed since the last commit drained them.
    dirty: HashSet<KvKey>,
    /// Given up, not yet durably so: (block, nblocks).
    pending_free: Vec<(u64, u32)>,
    pending_blocks: u64,
    /// Drained into a commit that has not finished yet.
    committing: Vec<(u64, u32)>,
    /// Blocks in `committing`.
    committing_blocks: u64,
    /// Scratch of `blocks`' size: the blocks as they will be once what waits
    /// for a commit is free (sized at creation: the full path allocates nothing).
    after_commit: Blocks,

    // Free extents on their way back to the pool (`trim`).
    /// Extents blocks were freed in since `trim_step` last looked.
    freed_extents: Vec<u32>,
    /// Extent -> when `trim_step` last saw blocks freed in it (ms).
    trim_since: HashMap<u32, u64>,
    /// (extent, ms) as `trim_since` had them when queued, oldest first; an
    /// entry older than `trim_since` is requeued at the newer time.
    trim_queue: VecDeque<(u32, u64)>,
}

/// The key index of one KV volume.
pub struct KvIndex {
    block_size: u32,
    max_keys: u64,
    /// The clock key ages are counted from (ages restart at recovery): the
    /// first `now` a caller passes, not a clock read here, so a caller whose
    /// clock runs behind the wall clock (the simulation's) never sees every
    /// age stuck at zero.
    base: std::sync::OnceLock<Instant>,
    /// `KvSettings`, packed (`PackedSettings`): read once per command, no lock.
    settings: AtomicU64,
    /// The state while no reactor owns it: before the first KV command, in
    /// tools and tests, and after the owner ended. Only cold paths lock it.
    home: Mutex<Option<Box<State>>>,
    /// The reactor that took the state (set once; `kv_owner`).
    pub(super) owner: OnceLock<Arc<dyn StateHolder>>,
    /// The owner ended and handed the state back home.
    pub(super) owner_gone: AtomicBool,
    /// Process-unique: how an owner finds this index's state among its own.
    pub(super) id: u64,
    /// This index, for an owner to keep (`into_shared`).
    pub(super) me: Weak<KvIndex>,
    /// Blocks the values take, as the holder of the state last saw them.
    used_blocks: AtomicU64,
    /// Times `home` was locked (see `home_locks`).
    home_locks: AtomicU64,
    /// Keys changed or blocks given up since the last drain, as the holder
    /// of the state last saw them: the metadata thread's every step asks.
    changes: AtomicBool,
    pub counters: KvCounters,
    /// Blocks per extent of the volume; 0: nothing is trimmed.
    extent_blocks: u64,
    /// `trim_after`, milliseconds.
    trim_after_ms: AtomicU64,
    /// Set when `freed_extents` has entries.
    trim_fresh: AtomicBool,
    /// When the oldest queued extent is due (ms), `u64::MAX` with none.
    trim_due_ms: AtomicU64,
}

impl KvIndex {
    /// An empty index for a volume of `size_bytes` in `block_size` blocks.
    pub fn new(size_bytes: u64, block_size: u32) -> KvIndex {
        let total = size_bytes / block_size.max(1) as u64;
        let max_keys = max_keys_of(size_bytes);
        // Sized for every key up front: the Store path never grows them.
        let cap = max_keys.min(1 << 24) as usize;
        KvIndex {
            block_size,
            max_keys,
            base: std::sync::OnceLock::new(),
            settings: AtomicU64::new(PackedSettings::pack(KvSettings::default())),
            home: Mutex::new(Some(Box::new(State {
                map: KeySlots::with_capacity(cap),
                entries: Vec::with_capacity(cap),
                free_slots: Vec::with_capacity(cap),
                blocks: Blocks::new(total),
                after_commit: Blocks::new(total),
                pending_free: Vec::with_capacity(1024),
                pending_blocks: 0,
                committing: Vec::new(),
                committing_blocks: 0,
                dirty: HashSet::with_capacity(cap),
                inflight_new: 0,
                new_stores: Blocks::new(total),
                oldest: NIL,
                newest: NIL,
                stored_blocks: 0,
                value_bytes: 0,
                freed_extents: Vec::new(),
                trim_since: HashMap::new(),
                trim_queue: VecDeque::new(),
                root: NIL,
                rng: 0x9E37_79B9_7F4A_7C15,
            }))),
            owner: OnceLock::new(),
            owner_gone: AtomicBool::new(false),
            id: NEXT_INDEX_ID.fetch_add(1, Ordering::Relaxed),
            me: Weak::new(),
            used_blocks: AtomicU64::new(0),
            home_locks: AtomicU64::new(0),
            changes: AtomicBool::new(false),
            counters: KvCounters::default(),
            extent_blocks: 0,
            trim_after_ms: AtomicU64::new(TRIM_AFTER.as_millis() as u64),
            trim_fresh: AtomicBool::new(false),
            trim_due_ms: AtomicU64::new(u64::MAX),
        }
    }

    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    pub fn max_keys(&self) -> u64 {
        self.max_keys
    }

    pub fn total_blocks(&self) -> u64 {
        self.with_state(|_, st| st.blocks.total)
    }

    /// Shared, and able to hand itself to a reactor that takes its state.
    pub fn into_shared(self) -> Arc<KvIndex> {
        Arc::new_cyclic(|me| KvIndex {
            me: me.clone(),
            ..self
        })
    }

    /// Blocks the values take (and blocks held for trimming).
    pub fn used_blocks(&self) -> u64 {
        self.used_blocks.load(Ordering::Relaxed)
    }

    /// Carries out `ask` on `st` (which the caller holds).
    pub(super) fn run(&self, st: &mut State, ask: KvAsk, now: Instant) -> KvAnswer {
        let a = match ask {
            KvAsk::Reserve { key, len, opts } => {
                KvAnswer::Reserve(self.reserve_in(st, &key, len, opts, now))
            }
            KvAsk::CommitStore { key, loc, opts } => {
                KvAnswer::CommitStore(self.commit_store_in(st, &key, loc, opts, now))
            }
            KvAsk::AbortStore { loc } => {
                self.abort_store_in(st, loc);
                KvAnswer::Released
            }
            KvAsk::AbortClaim { loc } => {
                Self::abort_claim_in(st, loc);
                KvAnswer::Released
            }
            KvAsk::BeginRead { key } => KvAnswer::BeginRead(self.begin_read_in(st, &key, now)),
            KvAsk::EndRead { pin } => {
                Self::end_read_in(st, pin);
                KvAnswer::Released
            }
            KvAsk::Exists { key } => KvAnswer::Exists(self.exists_in(st, &key, now)),
            KvAsk::Delete { key } => KvAnswer::Delete(self.delete_in(st, &key, now)),
            KvAsk::List { start, max } => {
                KvAnswer::List(self.list_in(st, &start, max as usize, now))
            }
        };
        self.publish(st);
        a
    }

    pub fn snapshot(&self) -> KvSnapshot {
        self.with_state(|ix, st| ix.snapshot_in(st))
    }

    fn snapshot_in(&self, st: &State) -> KvSnapshot {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let committing = st.committing_blocks;
        KvSnapshot {
            keys: st.map.len() as u64,
            max_keys: self.max_keys,
            value_bytes: st.value_bytes,
            used_blocks: st.blocks.total - st.blocks.free,
            free_blocks: st.blocks.free,
            pending_free_blocks: st.pending_blocks + committing,
            total_blocks: st.blocks.total,
            stores: get(&c.stores),
            hits: get(&c.hits),
            misses: get(&c.misses),
            deletes: get(&c.deletes),
            evictions: get(&c.evictions),
            expirations: get(&c.expirations),
            eviction_age_ms: get(&c.eviction_age_ms),
            commit_waits: get(&c.commit_waits),
            store_failures_full: get(&c.store_failures_full),
            trimmed_extents: get(&c.trimmed_extents),
        }
    }

    /// Checks the index against itself: every live key's blocks are used,
    /// no two keys share a block. Returns the problems found.
    pub fn verify(&self) -> Vec<String> {
        self.with_state(|_, st| Self::verify_in(st))
    }

    fn verify_in(st: &State) -> Vec<String> {
        let mut problems = Vec::new();
        problems.extend(st.order_check());
        let mut seen = Blocks::new(st.blocks.total);
        for slot in st.map.slots() {
            let Some(e) = st.entries.get(slot as usize).and_then(|e| e.as_ref()) else {
                problems.push(format!("the key table names empty slot {slot}"));
                continue;
            };
            let (k, l) = (e.key, e.loc);
            if (l.block..l.block + l.nblocks as u64)
                .any(|b| seen.is_used(b) || !st.blocks.is_used(b))
            {
                problems.push(format!(
                    "key {k:?}: blocks at {} are shared or free",
                    l.block
                ));
            }
            seen.set(l.block, l.nblocks, true);
        }
        problems
    }
}

/// The most keys a KV volume of `size_bytes` holds (its Identify MNK).
pub fn max_keys_of(size_bytes: u64) -> u64 {
    (size_bytes / KV_BYTES_PER_KEY).max(1)
}

// Keys are recorded with their blocks; NO_EXTENT is never a block count.
const _: () = assert!(NO_EXTENT == u32::MAX);

/// The next `KvIndex::id`.
static NEXT_INDEX_ID: AtomicU64 = AtomicU64::new(1);

#[cfg(test)]
mod tests {
    use super::order::order;
    use super::testing::*;
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[derive(Debug, Clone)]
    enum Op {
        Store(u8, u32),
        Delete(u8),
        Read(u8),
        Commit,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (any::<u8>(), 0u32..40_000).prop_map(|(k, l)| Op::Store(k, l)),
            any::<u8>().prop_map(Op::Delete),
            any::<u8>().prop_map(Op::Read),
            Just(Op::Commit),
        ]
    }

    proptest! {
        /// Against a model: every key the index holds has the length last
        /// stored, no two keys share blocks, and what the commits drained
        /// replays (as recovery would) to exactly the index's keys.
        #[test]
        fn index_matches_a_model(
            ops in proptest::collection::vec(op(), 1..300),
            list_from: u8,
            list_max in 0usize..300,
        ) {
            let now = Instant::now();
            let ix = KvIndex::new(48 * 4096 * 4, 4096);
            let mut model: BTreeMap<KvKey, u32> = BTreeMap::new();
            let mut durable: BTreeMap<KvKey, KvLoc> = BTreeMap::new();
            for o in ops {
                match o {
                    Op::Store(k, len) => {
                        let k = key(k as u32);
                        if let Ok(loc) = store_with(&ix, &k, len, now, &mut durable) {
                            // The crash rule: a new value never lands on blocks
                            // a durable record still points at (an empty value
                            // takes none, whatever block its reservation names).
                            for d in durable.values() {
                                let apart = loc.nblocks == 0
                                    || loc.block + loc.nblocks as u64 <= d.block
                                    || d.block + d.nblocks as u64 <= loc.block;
                                prop_assert!(apart, "{:?} over durable {:?}", loc, d);
                            }
                            model.insert(k, len);
                        }
                        // Evictions drop keys the model still has.
                        model.retain(|k, _| ix.list(k, 1, now).first() == Some(k));
                    }
                    Op::Delete(k) => {
                        let k = key(k as u32);
                        prop_assert_eq!(ix.delete(&k, now).is_ok(), model.remove(&k).is_some());
                    }
                    Op::Read(k) => {
                        let k = key(k as u32);
                        match ix.begin_read(&k, now) {
                            Ok((pin, loc)) => {
                                prop_assert_eq!(Some(&loc.len), model.get(&k));
                                ix.end_read(pin);
                            }
                            Err(_) => prop_assert!(!model.contains_key(&k)),
                        }
                    }
                    Op::Commit => {
                        commit(&ix, &mut durable);
                        let r = KvIndex::new(48 * 4096 * 4, 4096);
                        for (k, l) in &durable {
                            prop_assert_eq!(r.restore(*k, *l), Ok(()));
                        }
                        prop_assert_eq!(durable.len(), model.len());
                    }
                }
                prop_assert!(ix.verify().is_empty());
                prop_assert_eq!(ix.snapshot().keys as usize, model.len());
                // List walks the key order: every key from a start, ascending.
                let start = key(list_from as u32);
                let mut want: Vec<KvKey> = model
                    .keys()
                    .filter(|k| order(k, &start) != std::cmp::Ordering::Less)
                    .copied()
                    .collect();
                want.sort_by(order);
                want.truncate(list_max);
                prop_assert_eq!(ix.list(&start, list_max, now), want);
            }
        }
    }
}
