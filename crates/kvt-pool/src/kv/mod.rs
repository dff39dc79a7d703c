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
//! run on the owner and wait for it. The map and bitmap are sized at
//! creation so the command path does not allocate. The keys are also kept in
//! byte order (a treap threaded through the entries: O(log n) per Store and
//! Delete, no allocation), so List walks from its start key instead of
//! sorting a copy of every key.
//!
//! Space back to the pool: an extent of the volume whose blocks have all been
//! free for `trim_after` (and durably so) is handed to the metadata thread
//! (`trim_step`), which unmaps it; GC scrubs it under admission control like
//! any deallocated extent. Its blocks stay marked used meanwhile, so no Store
//! writes into an extent being unmapped. Waiting keeps a churning cache, which
//! reuses freed blocks as soon as next fit comes round, from paying a scrub
//! and a fresh mapping for space it takes back at once.

mod key_slots;

use key_slots::KeySlots;
pub use crate::kv_index::Reserve;
use crate::kv_index::{KvAnswer, KvAsk};
pub use kvt_meta::journal::KvLoc;
use kvt_meta::superblock::NO_EXTENT;
pub use kvt_meta::superblock::{KV_BYTES_PER_KEY, KV_CKPT_ENTRY_BYTES};
use kvt_wire::nvme::{KvKey, Status, StoreOptions};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

/// The block number of an empty value's reservation when the Store counted
/// as a new key's (`KvIndex::count_new`); recorded values have block 0.
const EMPTY_COUNTED: u64 = 1;

/// How long an extent's blocks stay all free before it goes back to the pool.
pub const TRIM_AFTER: Duration = Duration::from_secs(5);
/// Runs long enough for a value that `Blocks::find_run` compares.
const FIT_CANDIDATES: u32 = 16;
/// Blocks past the first fitting run that `Blocks::find_run` looks at for a
/// better one (1,024 words of the bitmap).
const FIT_LOOK_BLOCKS: u64 = 65536;

/// Windows `evict_window` weighs: those at the oldest keys' blocks.
const WINDOW_CANDIDATES: usize = 8;

/// Extents one `trim_step` hands over at most (the rest wait a tick), so the
/// owner never spends one call scanning a whole large volume.
const TRIM_BATCH: usize = 256;

/// What a full KV namespace does with a Store of a new value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnFull {
    /// Evict the oldest keys not read since (second chance) to make room.
    #[default]
    Evict,
    /// Fail the Store with Capacity Exceeded.
    Fail,
}

impl OnFull {
    pub fn name(self) -> &'static str {
        match self {
            OnFull::Evict => "evict",
            OnFull::Fail => "fail",
        }
    }
}

/// A KV namespace's cache policy (set where it is served; not persisted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KvSettings {
    pub on_full: OnFull,
    /// Keys older than this read as missing and are evicted when met.
    pub ttl: Option<Duration>,
    /// Free extents stay mapped (no trim): the namespace keeps its
    /// high-water footprint, and a cache that refills at once never pays for
    /// fresh mappings.
    pub keep_footprint: bool,
}

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

/// Slots a checkpoint copies per call on the index's state (`drain_snapshot`):
/// tens of microseconds of copying, so a command waits about that long at most.
const SNAPSHOT_CHUNK: usize = 4096;

/// No slot: an empty subtree of the key order.
const NIL: u32 = u32::MAX;

/// Used-block bitmap with next-fit search for contiguous runs: fixed size, so
/// allocation never allocates memory.
struct Blocks {
    words: Vec<u64>,
    total: u64,
    free: u64,
    hint: u64,
}

impl Blocks {
    fn new(total: u64) -> Blocks {
        let n = total.div_ceil(64) as usize;
        let mut words = vec![0u64; n];
        // Bits past the end count as used, so a search never returns them.
        if total % 64 != 0 {
            if let Some(w) = words.last_mut() {
                *w = !0u64 << (total % 64);
            }
        }
        Blocks {
            words,
            total,
            free: total,
            hint: 0,
        }
    }
    fn all_free(&self, first: u64, n: u64) -> bool {
        self.next_free(first) == Some(first) && self.next_used(first) >= first + n
    }
    fn is_used(&self, b: u64) -> bool {
        self.words
            .get((b / 64) as usize)
            .is_some_and(|w| w & (1 << (b % 64)) != 0)
    }
    fn set(&mut self, block: u64, n: u32, used: bool) {
        for b in block..block + n as u64 {
            if b >= self.total {
                break;
            }
            let (i, bit) = ((b / 64) as usize, 1u64 << (b % 64));
            let w = &mut self.words[i];
            if (*w & bit != 0) != used {
                *w ^= bit;
                if used {
                    self.free -= 1;
                } else {
                    self.free += 1;
                }
            }
        }
    }
    /// The first free block at or after `from`, if any.
    fn next_free(&self, from: u64) -> Option<u64> {
        self.next_free_below(from, self.total)
    }
    /// The first free block in `from..end`, if any; looks at no word past `end`.
    fn next_free_below(&self, from: u64, end: u64) -> Option<u64> {
        let end = end.min(self.total);
        if from >= end {
            return None;
        }
        let last = ((end - 1) / 64) as usize;
        let mut i = (from / 64) as usize;
        let mut w = self.words.get(i)? | ((1u64 << (from % 64)) - 1);
        loop {
            if w != !0 {
                let b = i as u64 * 64 + w.trailing_ones() as u64;
                return (b < end).then_some(b);
            }
            if i >= last {
                return None;
            }
            i += 1;
            w = *self.words.get(i)?;
        }
    }
    /// The first used block at or after `from` (or `total`).
    fn next_used(&self, from: u64) -> u64 {
        self.next_used_below(from, self.total)
    }
    /// The first used block in `from..end`, or `end`; looks at no word past `end`.
    fn next_used_below(&self, from: u64, end: u64) -> u64 {
        let end = end.min(self.total);
        if from >= end {
            return end;
        }
        let last = ((end - 1) / 64) as usize;
        let mut i = (from / 64) as usize;
        let Some(&first) = self.words.get(i) else {
            return end;
        };
        let mut w = first & !((1u64 << (from % 64)) - 1);
        loop {
            if w != 0 {
                return (i as u64 * 64 + w.trailing_zeros() as u64).min(end);
            }
            if i >= last {
                return end;
            }
            i += 1;
            match self.words.get(i) {
                Some(&x) => w = x,
                None => return end,
            }
        }
    }
    /// Takes `n` contiguous free blocks (next fit from the last allocation).
    fn alloc(&mut self, n: u32) -> Option<u64> {
        let b = self.find_run(n, self.hint)?;
        self.set(b, n, true);
        self.hint = b + n as u64;
        Some(b)
    }
    /// A run of `n` free blocks from `hint` on, wrapping to 0: of the runs
    /// long enough within `FIT_LOOK_BLOCKS` of the first (at most
    /// `FIT_CANDIDATES` of them), the shortest (an exact fit at once), so a
    /// value takes a hole its size rather than cutting into a long run a
    /// larger value will need. Every scan is bounded: past the first fit, a
    /// Store looks at no more than `FIT_LOOK_BLOCKS` of the bitmap.
    fn find_run(&self, n: u32, hint: u64) -> Option<u64> {
        if n == 0 || (n as u64) > self.free {
            return None;
        }
        let n = n as u64;
        // Runs are measured up to this length: longer ones are all "long".
        let cap = n.max(FIT_LOOK_BLOCKS);
        let mut best: Option<(u64, u64)> = None;
        let mut seen = 0;
        // Blocks left to look at: unbounded until a run fits.
        let mut left = u64::MAX;
        for (start, end) in [(hint, self.total), (0, hint)] {
            let mut at = start;
            while at < end && left > 0 {
                let stop = end.min(at.saturating_add(left));
                // None: nothing free before `stop`; the wrapped range may have some.
                let Some(b) = self.next_free_below(at, stop) else {
                    left -= stop - at;
                    break;
                };
                let run_end = self.next_used_below(b, stop.min(b + cap));
                let len = run_end - b;
                left -= run_end - at;
                at = run_end;
                if len < n {
                    continue;
                }
                if best.is_none() {
                    left = FIT_LOOK_BLOCKS;
                }
                if best.map_or(true, |(_, l)| len < l) {
                    best = Some((b, len));
                }
                seen += 1;
                if len == n || seen == FIT_CANDIDATES {
                    return best.map(|(b, _)| b);
                }
            }
        }
        best.map(|(b, _)| b)
    }
}

pub(super) struct State {
    /// Each live key to its entry's slot.
    map: KeySlots,
    entries: Vec<Option<Entry>>,
    free_slots: Vec<u32>,
    blocks: Blocks,
    /// Scratch of `blocks`' size: the blocks as they will be once what waits
    /// for a commit is free (sized at creation: the full path allocates nothing).
    after_commit: Blocks,
    /// Given up, not yet durably so: (block, nblocks).
    pending_free: Vec<(u64, u32)>,
    pending_blocks: u64,
    /// Drained into a commit that has not finished yet.
    committing: Vec<(u64, u32)>,
    /// Blocks in `committing`.
    committing_blocks: u64,
    /// Keys whose index state changed since the last commit drained them.
    dirty: HashSet<KvKey>,
    /// Stores of new keys between `reserve` and `commit_store` (or an
    /// abort), each marked (`count_new`): what a Store counted is what it
    /// gives back, whatever happened to its key meanwhile (two Stores of one
    /// new key both count; a Delete may come between).
    inflight_new: u64,
    /// The marks: the first block of a counted Store's reservation.
    new_stores: Blocks,
    /// The live keys from the oldest Store to the newest (a list threaded
    /// through the entries): eviction takes from the old end, so a value is
    /// evicted by its age, not by where its slot or its blocks happen to be.
    oldest: u32,
    newest: u32,
    /// Blocks stored since the index was made (restored keys count): the
    /// clock `Entry::stored_pos` is read on.
    stored_blocks: u64,
    value_bytes: u64,
    /// Extents blocks were freed in since `trim_step` last looked.
    freed_extents: Vec<u32>,
    /// Extent -> when `trim_step` last saw blocks freed in it (ms).
    trim_since: HashMap<u32, u64>,
    /// (extent, ms) as `trim_since` had them when queued, oldest first; an
    /// entry older than `trim_since` is requeued at the newer time.
    trim_queue: VecDeque<(u32, u64)>,
    /// The live keys in byte order, for List: a treap threaded through the
    /// entries (`Entry::left`, `right`, `prio`), so keeping it allocates
    /// nothing and List walks from its start key without copying the index.
    root: u32,
    /// The treap's priorities (xorshift).
    rng: u64,
}

/// The key of the entry in `slot`, which the key table names.
fn key_at(entries: &[Option<Entry>], slot: u32) -> KvKey {
    match entries.get(slot as usize).and_then(|e| e.as_ref()) {
        Some(e) => e.key,
        None => panic!("key table names empty slot {slot}"),
    }
}

/// The key order (a treap: a search tree by key, a heap by random priority,
/// so its depth stays logarithmic in expectation).
impl State {
    /// The slot of live `key`'s entry.
    fn slot_of(&self, key: &KvKey) -> Option<u32> {
        self.map.get(key, |s| key_at(&self.entries, s))
    }
    /// Indexes `key` at `slot`, whose entry holds it; the slot it had.
    fn index_key(&mut self, key: &KvKey, slot: u32) -> Option<u32> {
        let entries = &self.entries;
        self.map.insert(key, slot, |s| key_at(entries, s))
    }
    /// Takes `key` out of the key table (before its entry goes).
    fn unindex_key(&mut self, key: &KvKey) -> Option<u32> {
        let entries = &self.entries;
        self.map.remove(key, |s| key_at(entries, s))
    }
    fn node(&self, slot: u32) -> &Entry {
        match self.entries.get(slot as usize).and_then(|e| e.as_ref()) {
            Some(e) => e,
            None => panic!("key order names empty slot {slot}"),
        }
    }
    fn node_mut(&mut self, slot: u32) -> &mut Entry {
        match self.entries.get_mut(slot as usize).and_then(|e| e.as_mut()) {
            Some(e) => e,
            None => panic!("key order names empty slot {slot}"),
        }
    }

    /// Puts live `slot` at the newest end of the age list.
    fn age_push(&mut self, slot: u32) {
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
    fn age_unlink(&mut self, slot: u32) {
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

    /// Splits subtree `t` into the keys before `key` and the rest.
    fn order_split(&mut self, t: u32, key: &KvKey) -> (u32, u32) {
        if t == NIL {
            return (NIL, NIL);
        }
        let n = self.node(t);
        if order(&n.key, key) == std::cmp::Ordering::Less {
            let (l, r) = self.order_split(n.right, key);
            self.node_mut(t).right = l;
            (t, r)
        } else {
            let (l, r) = self.order_split(n.left, key);
            self.node_mut(t).left = r;
            (l, t)
        }
    }

    /// Joins subtrees `a` and `b`, every key of `a` before every key of `b`.
    fn order_merge(&mut self, a: u32, b: u32) -> u32 {
        if a == NIL {
            return b;
        }
        if b == NIL {
            return a;
        }
        if self.node(a).prio > self.node(b).prio {
            let r = self.order_merge(self.node(a).right, b);
            self.node_mut(a).right = r;
            a
        } else {
            let l = self.order_merge(a, self.node(b).left);
            self.node_mut(b).left = l;
            b
        }
    }

    fn next_prio(&mut self) -> u32 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        (self.rng >> 32) as u32
    }

    /// The slots from the root down its right children: where a key after
    /// every other joins (`order_append`).
    fn right_spine(&self) -> Vec<u32> {
        let mut spine = Vec::new();
        let mut t = self.root;
        while t != NIL {
            spine.push(t);
            t = self.node(t).right;
        }
        spine
    }

    /// Adds `slot`'s key, which comes after every key in the order, given
    /// the order's right spine (kept up to date): the nodes of lower
    /// priority at the spine's end become its left subtree. Amortized
    /// constant time: each node leaves the spine once.
    fn order_append(&mut self, slot: u32, spine: &mut Vec<u32>) {
        let prio = self.next_prio();
        let mut left = NIL;
        while let Some(&top) = spine.last() {
            if self.node(top).prio > prio {
                break;
            }
            left = top;
            spine.pop();
        }
        let n = self.node_mut(slot);
        (n.left, n.right, n.prio) = (left, NIL, prio);
        match spine.last() {
            Some(&top) => self.node_mut(top).right = slot,
            None => self.root = slot,
        }
        spine.push(slot);
    }

    /// Adds `slot`'s key (not in the order yet).
    fn order_insert(&mut self, slot: u32) {
        let prio = self.next_prio();
        let n = self.node_mut(slot);
        (n.left, n.right, n.prio) = (NIL, NIL, prio);
        let key = n.key;
        let (l, r) = self.order_split(self.root, &key);
        let l = self.order_merge(l, slot);
        self.root = self.order_merge(l, r);
    }

    /// Whether the order holds exactly the map's keys, ascending.
    fn order_check(&self) -> Option<String> {
        let (mut path, mut t) = (Vec::new(), self.root);
        let (mut count, mut last): (usize, Option<KvKey>) = (0, None);
        loop {
            while t != NIL && count <= self.map.len() {
                path.push(t);
                t = self.node(t).left;
            }
            let Some(x) = path.pop() else { break };
            let n = self.node(x);
            if last.is_some_and(|l| order(&l, &n.key) != std::cmp::Ordering::Less)
                || self.slot_of(&n.key) != Some(x)
            {
                return Some(format!("key order out of place at {:?}", n.key));
            }
            // The heap by priority keeps the depth logarithmic.
            let above = |c: u32| c != NIL && self.node(c).prio > n.prio;
            if above(n.left) || above(n.right) {
                return Some(format!("key order's heap broken below {:?}", n.key));
            }
            (count, last, t) = (count + 1, Some(n.key), n.right);
        }
        (count != self.map.len()).then(|| {
            format!(
                "the key order holds {count} keys, the map {}",
                self.map.len()
            )
        })
    }

    /// Subtree `t` without `key`'s slot.
    fn order_remove(&mut self, t: u32, key: &KvKey) -> u32 {
        assert!(t != NIL, "key {key:?} is not in the key order");
        let n = self.node(t);
        let (left, right) = (n.left, n.right);
        match order(key, &n.key) {
            std::cmp::Ordering::Less => {
                let l = self.order_remove(left, key);
                self.node_mut(t).left = l;
                t
            }
            std::cmp::Ordering::Greater => {
                let r = self.order_remove(right, key);
                self.node_mut(t).right = r;
                t
            }
            std::cmp::Ordering::Equal => self.order_merge(left, right),
        }
    }
}

/// A job on a KV index's state, run where the state is: with it, or with
/// `None` when its holder no longer has it.
pub(super) type StateJob = Box<dyn FnOnce(Option<(&KvIndex, &mut State)>) + Send>;

/// What holds a KV index's state once it left home (a reactor:
/// `kv_owner::KvPost`): runs jobs on it for other threads.
pub(super) trait StateHolder: Send + Sync {
    /// Runs `job` on the state of index `index` on the holder's thread,
    /// later; gives the job back if it cannot take it now.
    fn post_job(&self, index: u64, job: StateJob) -> Result<(), StateJob>;
    /// The holder as what it is (the command path reaches the reactor's post).
    fn into_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync>;
}

/// How long a caller waits for the state's holder before it looks whether
/// the holder has ended.
const HOLDER_PATIENCE: Duration = Duration::from_millis(50);

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

    /// The cache policy, the TTL to the millisecond (what keys age by).
    pub fn settings(&self) -> KvSettings {
        PackedSettings::unpack(self.settings.load(Ordering::Acquire))
    }
    pub fn set_settings(&self, s: KvSettings) {
        self.settings
            .store(PackedSettings::pack(s), Ordering::Release);
        // Trimming may be on now: the next `trim_step` looks at the queue.
        self.trim_due_ms.store(0, Ordering::Release);
    }

    /// The home of the state (see `home`).
    pub(super) fn home(&self) -> MutexGuard<'_, Option<Box<State>>> {
        self.home_locks.fetch_add(1, Ordering::Relaxed);
        // A panic while holding it cannot leave a half-made change worse than
        // refusing service: the state is plain values, each change one step.
        self.home.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the state where it is: here under the home lock, or on
    /// the owning reactor while the caller waits (so never call this from a
    /// reactor: the KV command path asks, `KeyIndex::ask`).
    pub(super) fn with_state<R: Send + 'static>(
        &self,
        f: impl FnOnce(&KvIndex, &mut State) -> R + Send + 'static,
    ) -> R {
        let mut f = f;
        loop {
            // The owner first: while one serves, the home mutex is never taken.
            let holder = self
                .owner
                .get()
                .filter(|_| !self.owner_gone.load(Ordering::Acquire));
            if let Some(h) = holder {
                match self.call_holder(&**h, f) {
                    Ok(r) => return r,
                    Err(back) => f = back,
                }
                continue;
            }
            match self.at_home(f) {
                Ok(r) => return r,
                // An owner is taking the state, or one ended and is handing
                // it back: in one place or the other in a moment.
                Err(back) => f = back,
            }
            std::thread::yield_now();
        }
    }

    /// Runs `f` on the state on its holder's thread and waits; gives `f`
    /// back if the holder no longer has the state.
    fn call_holder<R, F>(&self, holder: &dyn StateHolder, f: F) -> Result<R, F>
    where
        R: Send + 'static,
        F: FnOnce(&KvIndex, &mut State) -> R + Send + 'static,
    {
        let cell = Arc::new(Mutex::new(Some(f)));
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let on_holder = cell.clone();
        let job: StateJob = Box::new(move |found| {
            let Some((ix, st)) = found else {
                return;
            };
            let f = on_holder.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(f) = f {
                let r = f(ix, st);
                ix.publish(st);
                let _ = tx.send(r);
            }
        });
        let mut job = Some(job);
        loop {
            if let Some(j) = job.take() {
                job = holder.post_job(self.id, j).err();
            }
            match rx.recv_timeout(HOLDER_PATIENCE) {
                Ok(r) => return Ok(r),
                // The holder ended with the job unread: the state is home.
                Err(RecvTimeoutError::Timeout) if self.owner_gone.load(Ordering::Acquire) => break,
                Err(RecvTimeoutError::Timeout) => {}
                // The job ran without the state (or was dropped): `f` is back.
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        let f = cell.lock().unwrap_or_else(|p| p.into_inner()).take();
        match f {
            Some(f) => Err(f),
            // Taken at the last moment: its result is on the way (a job that
            // takes its closure sends what it returns).
            None => match rx.recv() {
                Ok(r) => Ok(r),
                Err(_) => panic!("a KV index call on its owner failed"),
            },
        }
    }

    /// Runs `f` on the state at home, where it is unless a reactor owns it.
    /// Returns `f` back if a reactor does.
    pub(super) fn at_home<R, F: FnOnce(&KvIndex, &mut State) -> R>(&self, f: F) -> Result<R, F> {
        let mut home = self.home();
        match home.as_deref_mut() {
            Some(st) => {
                let r = f(self, st);
                self.publish(st);
                Ok(r)
            }
            None => Err(f),
        }
    }

    /// Keeps what others read without the state current: `used_blocks`
    /// (Identify) and `has_changes` (the metadata thread). Stored only when
    /// they move, so readers' copies of the line stay valid.
    pub(super) fn publish(&self, st: &State) {
        let used = st.blocks.total - st.blocks.free;
        if self.used_blocks.load(Ordering::Relaxed) != used {
            self.used_blocks.store(used, Ordering::Relaxed);
        }
        let changes = !st.dirty.is_empty() || !st.pending_free.is_empty();
        if self.changes.load(Ordering::Relaxed) != changes {
            self.changes.store(changes, Ordering::Release);
        }
    }

    /// Times the home mutex was taken: it stays still while a reactor owns
    /// the index, whatever the commands and the metadata thread do.
    pub fn home_locks(&self) -> u64 {
        self.home_locks.load(Ordering::Relaxed)
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

    fn ms(&self, now: Instant) -> u64 {
        let base = *self.base.get_or_init(|| now);
        now.saturating_duration_since(base).as_millis() as u64
    }

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

    fn reserve_in(
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

    fn commit_store_in(
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

    fn abort_store_in(&self, st: &mut State, loc: KvLoc) {
        Self::uncount_new(st, loc);
        self.release_blocks(st, loc.block, loc.nblocks);
    }

    /// A claimed Store's flush failed: the blocks go back, and wait for a
    /// commit again (some were given up by changes that may not be durable).
    pub fn abort_claim(&self, _key: &KvKey, loc: KvLoc) {
        self.with_state(move |_, st| Self::abort_claim_in(st, loc))
    }

    fn abort_claim_in(st: &mut State, loc: KvLoc) {
        Self::uncount_new(st, loc);
        Self::pend(st, loc);
    }

    /// Looks `key` up for a Retrieve and pins its blocks until `end_read`.
    /// Returns the pin and where the value is.
    pub fn begin_read(&self, key: &KvKey, now: Instant) -> Result<(u32, KvLoc), Status> {
        let key = *key;
        self.with_state(move |ix, st| ix.begin_read_in(st, &key, now))
    }

    fn begin_read_in(
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

    fn end_read_in(st: &mut State, pin: u32) {
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

    fn exists_in(&self, st: &mut State, key: &KvKey, now: Instant) -> bool {
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

    fn delete_in(&self, st: &mut State, key: &KvKey, now: Instant) -> Result<(), Status> {
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

    /// Keys from `start` on (an empty start: from the first), in byte order,
    /// at most `max`. Expired keys are left out.
    pub fn list(&self, start: &KvKey, max: usize, now: Instant) -> Vec<KvKey> {
        let start = *start;
        self.with_state(move |ix, st| ix.list_in(st, &start, max, now))
    }

    fn list_in(&self, st: &State, start: &KvKey, max: usize, now: Instant) -> Vec<KvKey> {
        let ttl = self.settings().ttl;
        let now_ms = self.ms(now);
        let mut keys = Vec::with_capacity(max.min(st.map.len()));
        // In order from `start` (the empty key is before every other): the
        // path down to it, then each key's right subtree in turn.
        let mut path = Vec::with_capacity(64);
        let mut t = st.root;
        while t != NIL {
            let n = st.node(t);
            if order(&n.key, start) == std::cmp::Ordering::Less {
                t = n.right;
            } else {
                path.push(t);
                t = n.left;
            }
        }
        while keys.len() < max {
            let Some(t) = path.pop() else { break };
            let n = st.node(t);
            if !expired(n, now_ms, ttl) {
                keys.push(n.key);
            }
            let mut c = n.right;
            while c != NIL {
                path.push(c);
                c = st.node(c).left;
            }
        }
        keys
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

    /// Freed extents wait to be trimmed (now or at a time already set).
    pub fn trim_pending(&self) -> bool {
        self.trim_fresh.load(Ordering::Acquire)
            || self.trim_due_ms.load(Ordering::Acquire) != u64::MAX
    }

    /// Every key and its location, changing nothing.
    pub fn locations(&self) -> Vec<(KvKey, KvLoc)> {
        self.with_state(|_, st| Self::all_locations(st))
    }

    fn all_locations(st: &State) -> Vec<(KvKey, KvLoc)> {
        st.map
            .slots()
            .map(|s| {
                let e = st.node(s);
                (e.key, e.loc)
            })
            .collect()
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

    /// Recovery: `key`'s value is at `loc`. Locations overlapping another
    /// key's or past the end are refused (`check` reports them).
    /// Ages of restored keys count from the index's base (the first `now`
    /// after the restart): no clock is read here, so recovery never sets the
    /// base from a clock other than the callers'.
    pub fn restore(&self, key: KvKey, loc: KvLoc) -> Result<(), String> {
        self.with_state(move |ix, st| {
            let slot = ix.restore_entry(st, key, loc)?;
            st.order_insert(slot);
            Ok(())
        })
    }

    /// `restore` of every key of `keys`, in one hold of the home lock (recovery, before any owner). Keys in
    /// ascending order (a B-tree's, as recovery has them) join the key order
    /// at its end in constant time instead of a split and a merge from the
    /// root each: those were a quarter of a recovery of 10^6 keys.
    pub fn restore_all<'a>(
        &self,
        keys: impl IntoIterator<Item = (&'a KvKey, &'a KvLoc)>,
    ) -> Result<(), String> {
        let mut home = self.home();
        // Recovery fills the index before any reactor serves it.
        assert!(
            self.owner.get().is_none() || self.owner_gone.load(Ordering::Acquire),
            "restore into an index a reactor owns"
        );
        let Some(st) = home.as_deref_mut() else {
            return Err("the key index is held by a reactor".into());
        };
        let mut spine = st.right_spine();
        for (key, loc) in keys {
            let slot = self.restore_entry(st, *key, *loc)?;
            let after_all = match spine.last() {
                Some(&last) => order(&st.node(last).key, key).is_lt(),
                None => true,
            };
            if after_all {
                st.order_append(slot, &mut spine);
            } else {
                st.order_insert(slot);
                spine = st.right_spine();
            }
        }
        self.publish(st);
        Ok(())
    }

    /// A restored key's entry, checked and in the map and the age list; the
    /// caller puts it in the key order.
    fn restore_entry(&self, st: &mut State, key: KvKey, loc: KvLoc) -> Result<u32, String> {
        // Saturating and checked: `loc` comes from the disk (validation).
        if loc.block.saturating_add(loc.nblocks as u64) > st.blocks.total
            || loc.len > loc.nblocks.saturating_mul(self.block_size)
        {
            return Err(format!(
                "key {key:?} at block {} ({} blocks, {} bytes) is outside the namespace",
                loc.block, loc.nblocks, loc.len
            ));
        }
        if (loc.block..loc.block + loc.nblocks as u64).any(|b| st.blocks.is_used(b)) {
            return Err(format!(
                "key {key:?} at block {} overlaps another key's value",
                loc.block
            ));
        }
        let slot = st.entries.len() as u32;
        // Recovery does not know the Stores' order: the restore order stands in.
        let pos = st.stored_blocks + loc.nblocks as u64;
        st.entries.push(Some(Entry::new(key, loc, 0, pos)));
        // One hash of the key, not a lookup and then an insert: hashing was
        // a quarter of a recovery of 10^6 keys.
        let entries = &st.entries;
        if st
            .map
            .insert_new(&key, slot, |s| key_at(entries, s))
            .is_err()
        {
            st.entries.pop();
            return Err(format!("key {key:?} is recorded twice"));
        }
        st.stored_blocks = pos;
        st.blocks.set(loc.block, loc.nblocks, true);
        st.age_push(slot);
        st.value_bytes += loc.len as u64;
        Ok(slot)
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

    // --- internals, on the state its holder passes ---

    /// Blocks no key holds any more, durably: free for Stores, and their
    /// extents are candidates to go back to the pool.
    fn release_blocks(&self, st: &mut State, block: u64, n: u32) {
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
        Some(self.with_state(move |ix, st| {
            let mut out = Vec::new();
            ix.trim_due_in(st, now, &mut out);
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

    /// The given-up blocks join the commit being made.
    fn begin_commit(st: &mut State) {
        // Moved, not taken: the given-up list keeps its room, so the next
        // Store or Delete that gives blocks up does not allocate it again.
        st.committing.append(&mut st.pending_free);
        st.committing_blocks += st.pending_blocks;
        st.pending_blocks = 0;
    }

    fn pend(st: &mut State, loc: KvLoc) {
        if loc.nblocks > 0 {
            st.pending_free.push((loc.block, loc.nblocks));
            st.pending_blocks += loc.nblocks as u64;
        }
    }

    /// `slot` stops being its key's value; its blocks wait for the next
    /// commit (or for its readers, then the commit).
    fn give_up(&self, st: &mut State, slot: u32) {
        let Some(e) = st.entries.get_mut(slot as usize).and_then(|e| e.as_mut()) else {
            return;
        };
        e.live = false;
        let (key, loc, readers) = (e.key, e.loc, e.readers);
        st.unindex_key(&key);
        st.root = st.order_remove(st.root, &key);
        st.age_unlink(slot);
        // value_bytes sums the live keys' lengths, this one's included.
        assert!(
            st.value_bytes >= loc.len as u64,
            "value bytes below a live key's"
        );
        st.value_bytes -= loc.len as u64;
        st.dirty.insert(key);
        if readers == 0 {
            Self::pend(st, loc);
            st.entries[slot as usize] = None;
            st.free_slots.push(slot);
        }
    }

    fn expire_if_old(&self, st: &mut State, key: &KvKey, now_ms: u64, ttl: Option<Duration>) {
        let Some(slot) = st.slot_of(key) else {
            return;
        };
        let old = st
            .entries
            .get(slot as usize)
            .and_then(|e| e.as_ref())
            .is_some_and(|e| expired(e, now_ms, ttl));
        if old {
            self.counters.expirations.fetch_add(1, Ordering::Relaxed);
            self.give_up(st, slot);
        }
    }

    /// A run of `n` contiguous blocks that will be free once the given-up
    /// blocks waiting for a commit (or in one) are, if there is one.
    fn run_after_commit(st: &mut State, n: u32) -> Option<u64> {
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
    fn claim(st: &mut State, block: u64, n: u32) {
        let end = block + n as u64;
        st.blocks.set(block, n, true);
        st.blocks.hint = end;
        st.pending_blocks -= carve(&mut st.pending_free, block, end);
        st.committing_blocks -= carve(&mut st.committing, block, end);
    }

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
    fn evict_window(
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
    fn evict_one(
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

/// `KvSettings` in one word, so every reactor reads the policy with one
/// atomic load: bit 0 `OnFull::Fail`, bit 1 `keep_footprint`, bits 2.. the
/// TTL in milliseconds plus one (0: no TTL), saturating at `TTL_MS_MAX`
/// (far beyond `MAX_TTL_SECS`, ten years).
struct PackedSettings;

impl PackedSettings {
    const FAIL: u64 = 1;
    const KEEP_FOOTPRINT: u64 = 2;
    const TTL_SHIFT: u32 = 2;
    const TTL_MS_MAX: u64 = (u64::MAX >> PackedSettings::TTL_SHIFT) - 1;

    fn pack(s: KvSettings) -> u64 {
        let ttl = s.ttl.map_or(0, |t| {
            let ms = u64::try_from(t.as_millis()).unwrap_or(u64::MAX);
            ms.min(Self::TTL_MS_MAX) + 1
        });
        let fail = match s.on_full {
            OnFull::Evict => 0,
            OnFull::Fail => Self::FAIL,
        };
        let keep = if s.keep_footprint {
            Self::KEEP_FOOTPRINT
        } else {
            0
        };
        ttl << Self::TTL_SHIFT | keep | fail
    }

    fn unpack(w: u64) -> KvSettings {
        let ttl = w >> Self::TTL_SHIFT;
        KvSettings {
            on_full: if w & Self::FAIL != 0 {
                OnFull::Fail
            } else {
                OnFull::Evict
            },
            ttl: (ttl > 0).then(|| Duration::from_millis(ttl - 1)),
            keep_footprint: w & Self::KEEP_FOOTPRINT != 0,
        }
    }
}

fn expired(e: &Entry, now_ms: u64, ttl: Option<Duration>) -> bool {
    // Saturating: reactors pass their own clocks (see `count_gone`).
    ttl.is_some_and(|t| now_ms.saturating_sub(e.stored_ms) >= t.as_millis() as u64)
}

/// Removes blocks `start..end` from the (block, count) ranges in `list`,
/// splitting a range that straddles an end. Returns the blocks removed.
fn carve(list: &mut Vec<(u64, u32)>, start: u64, end: u64) -> u64 {
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

/// Keys in byte order, a shorter key before its extensions.
fn order(a: &KvKey, b: &KvKey) -> std::cmp::Ordering {
    a.cmp(b)
}

/// The most keys a KV volume of `size_bytes` holds (its Identify MNK).
pub fn max_keys_of(size_bytes: u64) -> u64 {
    (size_bytes / KV_BYTES_PER_KEY).max(1)
}

// Keys are recorded with their blocks; NO_EXTENT is never a block count.
const _: () = assert!(NO_EXTENT == u32::MAX);

/// The KV command set reaches the index through `kv_index::KeyIndex`.
static NEXT_INDEX_ID: AtomicU64 = AtomicU64::new(1);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, HashSet};

    fn key(n: u32) -> KvKey {
        KvKey::new(&n.to_be_bytes()).unwrap_or_default()
    }
    const NONE: StoreOptions = StoreOptions {
        must_exist: false,
        must_not_exist: false,
        no_compress: false,
    };

    /// A commit as the pool makes it: the drained changes become what
    /// recovery would find (`durable`).
    fn commit(ix: &KvIndex, durable: &mut BTreeMap<KvKey, KvLoc>) {
        let mut out = Vec::new();
        ix.drain_changes(&mut out);
        for (k, l) in out {
            match l {
                Some(l) => durable.insert(k, l),
                None => durable.remove(&k),
            };
        }
        ix.committed(true);
    }

    fn store_with(
        ix: &KvIndex,
        k: &KvKey,
        len: u32,
        now: Instant,
        durable: &mut BTreeMap<KvKey, KvLoc>,
    ) -> Result<KvLoc, Status> {
        for _ in 0..4 {
            match ix.reserve(k, len, NONE, now)? {
                Reserve::Ready(loc) => {
                    ix.commit_store(k, loc, NONE, now)?;
                    return Ok(loc);
                }
                Reserve::Claimed(loc) => {
                    commit(ix, durable);
                    ix.commit_store(k, loc, NONE, now)?;
                    return Ok(loc);
                }
                Reserve::AfterCommit => commit(ix, durable),
            }
        }
        Err(Status::CAPACITY_EXCEEDED)
    }

    fn store(ix: &KvIndex, k: &KvKey, len: u32, now: Instant) -> Result<KvLoc, Status> {
        store_with(ix, k, len, now, &mut BTreeMap::new())
    }

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
    fn blocks_find_runs_and_free_them() {
        let mut b = Blocks::new(130);
        assert_eq!(b.alloc(64), Some(0));
        assert_eq!(b.alloc(64), Some(64));
        assert_eq!(b.alloc(3), None);
        assert_eq!(b.alloc(2), Some(128));
        assert_eq!(b.free, 0);
        b.set(10, 20, false);
        assert_eq!(b.alloc(21), None);
        assert_eq!(b.alloc(20), Some(10));
        b.set(60, 10, false);
        assert_eq!(b.alloc(10), Some(60));
        assert_eq!(b.free, 0);
    }

    #[test]
    fn next_fit_wraps_to_free_runs_before_the_hint() {
        // The hint past every free block: the search must wrap, not give up.
        let mut b = Blocks::new(128);
        assert_eq!(b.alloc(128), Some(0));
        b.set(32, 32, false);
        assert_eq!(b.hint, 128);
        assert_eq!(b.alloc(32), Some(32));
        b.set(0, 32, false);
        b.set(96, 16, false);
        b.hint = 100;
        assert_eq!(b.alloc(32), Some(0));
    }

    #[test]
    fn restore_refuses_damaged_locations_without_overflow() {
        let ix = KvIndex::new(1 << 20, 4096);
        let k = key(1);
        let far = KvLoc {
            block: u64::MAX - 1,
            nblocks: 4,
            len: 1,
        };
        assert!(ix.restore(k, far).is_err());
        let long = KvLoc {
            block: 0,
            nblocks: 1,
            len: 8192,
        };
        assert!(ix.restore(k, long).is_err());
        assert!(ix.verify().is_empty());
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
        /// Recovery's bulk restore builds the same key order from keys in
        /// ascending order (appended along the right spine), in any order,
        /// or ascending after a first key restored alone: every key once,
        /// in order, heap intact; a key twice or on used blocks refused.
        #[test]
        fn restore_all_builds_the_key_order_from_any_order(
            mut keys in proptest::collection::btree_set(
                proptest::collection::vec(0u8..4, 1..=4), 1..300,
            ).prop_map(|s| s.into_iter().collect::<Vec<Vec<u8>>>()),
            shuffle in any::<u64>(),
            how in 0u8..3,
        ) {
            let now = Instant::now();
            let ix = KvIndex::new(512 << 20, 512);
            let loc_of = |i: usize| KvLoc { block: i as u64 * 2, nblocks: 2, len: 600 };
            let kv = |k: &[u8]| KvKey::new(k).unwrap_or_default();
            if how == 1 {
                let mut r = shuffle | 1;
                for i in (1..keys.len()).rev() {
                    r ^= r << 13; r ^= r >> 7; r ^= r << 17;
                    keys.swap(i, (r % (i as u64 + 1)) as usize);
                }
            }
            let list: Vec<(KvKey, KvLoc)> =
                keys.iter().enumerate().map(|(i, k)| (kv(k), loc_of(i))).collect();
            let mut rest = &list[..];
            if how == 2 {
                let (k, l) = list[list.len() - 1];
                prop_assert_eq!(ix.restore(k, l), Ok(()));
                rest = &list[..list.len() - 1];
            }
            prop_assert_eq!(ix.restore_all(rest.iter().map(|(k, l)| (k, l))), Ok(()));
            prop_assert!(ix.verify().is_empty(), "{:?}", ix.verify());
            let mut want: Vec<KvKey> = list.iter().map(|(k, _)| *k).collect();
            want.sort_by(order);
            prop_assert_eq!(ix.list(&KvKey::default(), usize::MAX, now), want);
            let (k, l) = list[0];
            let elsewhere = KvLoc { block: l.block + 10_000, ..l };
            let twice = ix.restore_all([(&k, &elsewhere)]);
            prop_assert!(twice.is_err());
            let other = KvKey::new(b"not restored").unwrap_or_default();
            prop_assert!(ix.restore_all([(&other, &l)]).is_err());
        }
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

    /// A value goes into the shortest free run it fits among the next few,
    /// not the first: an exact hole is used and the long run stays whole for
    /// a large value (first fit cut long runs into pieces no large value fit,
    /// and Stores of 0.5-1 MiB evicted with 20 % of the namespace free).
    #[test]
    fn a_value_takes_the_hole_it_fits_best() {
        let now = Instant::now();
        let ix = KvIndex::new(64 * 4096, 4096);
        let mut durable = BTreeMap::new();
        // Blocks 0-7 key 0, 8-9 key 1, 10-13 key 2, 14-63 free.
        for (i, n) in [(0, 8), (1, 2), (2, 4)] {
            assert!(store_with(&ix, &key(i), n * 4096, now, &mut durable).is_ok());
        }
        assert!(ix.delete(&key(1), now).is_ok());
        commit(&ix, &mut durable);
        // Next fit from block 14 would cut the long run; the 2-block hole fits.
        let loc = store_with(&ix, &key(3), 2 * 4096, now, &mut durable);
        assert_eq!(loc.map(|l| l.block), Ok(8));
        // And the long run is still whole for a value of all of it.
        let loc = store_with(&ix, &key(4), 50 * 4096, now, &mut durable);
        assert_eq!(loc.map(|l| l.block), Ok(14));
        assert_eq!(ix.snapshot().evictions, 0);
        assert!(ix.verify().is_empty());
    }

    #[test]
    fn ttl_expires_keys() {
        let now = Instant::now();
        let ix = KvIndex::new(1 << 20, 4096);
        ix.set_settings(KvSettings {
            on_full: OnFull::Evict,
            ttl: Some(Duration::from_secs(10)),
            keep_footprint: false,
        });
        assert!(store(&ix, &key(1), 100, now).is_ok());
        assert!(ix.exists(&key(1), now + Duration::from_secs(9)));
        assert!(!ix.exists(&key(1), now + Duration::from_secs(11)));
        assert_eq!(ix.snapshot().expirations, 1);
    }

    /// Ages count from the first `now` the index is given, not from a clock
    /// read when it was made: the simulation's clock started before the
    /// index and runs slower than the wall clock on a loaded machine, and
    /// every age then stayed zero (a KV volume never trimmed, seed 27).
    #[test]
    fn ages_count_from_the_callers_clock_not_the_wall_clock() {
        // A caller clock an hour behind the wall clock when the index is made.
        let now = Instant::now();
        let Some(behind) = now.checked_sub(Duration::from_secs(3600)) else {
            return; // booted less than an hour ago: no such clock to stand in
        };
        let ix = KvIndex::new(1 << 20, 4096);
        ix.set_settings(KvSettings {
            on_full: OnFull::Evict,
            ttl: Some(Duration::from_secs(10)),
            keep_footprint: false,
        });
        assert!(store(&ix, &key(1), 100, behind).is_ok());
        assert!(ix.exists(&key(1), behind + Duration::from_secs(9)));
        assert!(!ix.exists(&key(1), behind + Duration::from_secs(11)));
        // A recovered index: restored keys age from the first `now` after
        // the restart, not from a clock read during recovery.
        let ix = KvIndex::new(1 << 20, 4096);
        ix.set_settings(KvSettings {
            on_full: OnFull::Evict,
            ttl: Some(Duration::from_secs(10)),
            keep_footprint: false,
        });
        let loc = KvLoc {
            block: 0,
            nblocks: 1,
            len: 100,
        };
        assert_eq!(ix.restore(key(2), loc), Ok(()));
        assert!(ix.exists(&key(2), behind));
        assert!(ix.exists(&key(2), behind + Duration::from_secs(9)));
        assert!(!ix.exists(&key(2), behind + Duration::from_secs(11)));
    }

    #[test]
    fn a_ttl_beyond_the_packed_range_saturates() {
        let ix = KvIndex::new(4096 * 64, 4096);
        ix.set_settings(KvSettings {
            ttl: Some(Duration::MAX),
            ..KvSettings::default()
        });
        assert_eq!(
            ix.settings().ttl,
            Some(Duration::from_millis(PackedSettings::TTL_MS_MAX))
        );
        ix.set_settings(KvSettings {
            ttl: Some(Duration::from_micros(1500)),
            ..KvSettings::default()
        });
        assert_eq!(ix.settings().ttl, Some(Duration::from_millis(1)));
    }

    #[test]
    fn list_in_key_order_from_start() {
        let now = Instant::now();
        let ix = KvIndex::new(1 << 20, 4096);
        for k in [b"b".as_slice(), b"a", b"ab", b"c"] {
            let k = KvKey::new(k).unwrap_or_default();
            assert!(store(&ix, &k, 1, now).is_ok());
        }
        let got: Vec<Vec<u8>> = ix
            .list(&KvKey::new(b"ab").unwrap_or_default(), 10, now)
            .iter()
            .map(|k| k.as_bytes().to_vec())
            .collect();
        assert_eq!(got, vec![b"ab".to_vec(), b"b".to_vec(), b"c".to_vec()]);
        assert_eq!(ix.list(&KvKey::default(), 2, now).len(), 2);
    }

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
        /// Settings read back as set, the TTL to the millisecond (keys age
        /// by milliseconds, so nothing expires differently).
        #[test]
        fn settings_read_back_as_set(
            fail: bool,
            keep_footprint: bool,
            ttl_ms in proptest::option::of(prop_oneof![
                0u64..10_000,
                Just(10 * 365 * 24 * 3600 * 1000), // MAX_TTL_SECS,
                Just(PackedSettings::TTL_MS_MAX),
            ]),
        ) {
            let ix = KvIndex::new(4096 * 64, 4096);
            let s = KvSettings {
                on_full: if fail { OnFull::Fail } else { OnFull::Evict },
                ttl: ttl_ms.map(Duration::from_millis),
                keep_footprint,
            };
            ix.set_settings(s);
            prop_assert_eq!(ix.settings(), s);
        }

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
