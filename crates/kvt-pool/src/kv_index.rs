//! What the KV command set needs from a KV namespace's key index: space for
//! a Store, the value's blocks for a Retrieve, Delete, Exist and List. The
//! pool's index implements it (`kv`); `nvmf` knows only this. A step
//! is an ask with an answer, so the index may live on another reactor.

/// Where a value lives (blocks of the volume, and the value's length): the
/// journal's record of it, so one type runs from the command to the disk.
pub use kvt_meta::journal::KvLoc;
use kvt_reactor::IoCtx;
use kvt_wire::nvme::{KvKey, Status, StoreOptions};

/// The answer to a Store's request for space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reserve {
    /// Write the value here, then `commit_store`.
    Ready(KvLoc),
    /// These blocks are the Store's, but keys gave some of them up in changes
    /// not yet durable: flush the volume (its commit makes them durable), then
    /// write here and `commit_store`. If the flush fails, `abort_claim`.
    Claimed(KvLoc),
    /// No run fits even once given-up blocks are free, but some wait for a
    /// commit (or readers hold them): flush the volume and ask again.
    AfterCommit,
}

/// One step of a KV command, asked of the index. Every argument is a value:
/// an ask may travel to the reactor that owns the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvAsk {
    /// Space for a Store of `len` bytes under `key` (`Reserve`).
    Reserve {
        key: KvKey,
        len: u32,
        opts: StoreOptions,
    },
    /// The value of a reserved Store is written: it becomes `key`'s.
    CommitStore {
        key: KvKey,
        loc: KvLoc,
        opts: StoreOptions,
    },
    /// A reserved Store failed: its blocks are free again. No answer.
    AbortStore {
        loc: KvLoc,
    },
    /// A claimed Store's commit failed: its claim is let go. No answer.
    AbortClaim {
        loc: KvLoc,
    },
    /// Pins `key`'s value for a read: the pin and where the value is.
    BeginRead {
        key: KvKey,
    },
    /// The read under `pin` is done. No answer.
    EndRead {
        pin: u32,
    },
    Exists {
        key: KvKey,
    },
    Delete {
        key: KvKey,
    },
    /// Up to `max` keys from `start` on, in order.
    List {
        start: KvKey,
        max: u32,
    },
}

impl KvAsk {
    /// Whether the command waits for the answer; the others only release
    /// what the command held, and may be carried out later.
    pub fn wants_answer(&self) -> bool {
        !matches!(
            self,
            KvAsk::AbortStore { .. } | KvAsk::AbortClaim { .. } | KvAsk::EndRead { .. }
        )
    }
}

/// The index's answer to a `KvAsk`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvAnswer {
    Reserve(Result<Reserve, Status>),
    CommitStore(Result<(), Status>),
    BeginRead(Result<(u32, KvLoc), Status>),
    Exists(bool),
    Delete(Result<(), Status>),
    List(Vec<KvKey>),
    /// A release (`KvAsk::wants_answer` false) was carried out.
    Released,
}

/// An answer travelling back to the queue pair that asked, for the command
/// in `slot`: the event a reactor routes to it (`QueuePair::on_polled`). The
/// answer is taken out (`Cell::take`) by the queue pair.
pub struct KvAnswered {
    pub slot: u16,
    pub answer: std::cell::Cell<Option<KvAnswer>>,
}

/// A KV namespace's key index, as its command set uses it.
pub trait KeyIndex: Send + Sync {
    /// The volume's block size: values take whole blocks.
    fn block_size(&self) -> u32;
    /// The most keys the namespace holds (Identify MNK).
    fn max_keys(&self) -> u64;
    /// Blocks the values take (Identify NUSE): read without asking the owner.
    fn used_blocks(&self) -> u64;
    /// Asks the index for one step of the command in `slot` of the queue
    /// pair `ctx` runs. `Some`: answered here. `None`: the ask went to the
    /// reactor that owns the index, and its answer comes back to the queue
    /// pair as a `KvAnswered` event (only if `ask.wants_answer()`).
    fn ask(&self, ask: KvAsk, slot: u16, ctx: &mut IoCtx) -> Option<KvAnswer>;
    /// Deletes every key (a cluster node taking a namespace over cold); the
    /// keys deleted. Control path only: it waits for the index's owner.
    fn delete_all(&self, now: std::time::Instant) -> u64;
}
