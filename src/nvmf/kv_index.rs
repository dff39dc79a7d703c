//! What the KV command set needs from a KV namespace's key index: space for
//! a Store, the value's blocks for a Retrieve, Delete, Exist and List. The
//! pool's index implements it (`pool::kv`); `nvmf` knows only this.

/// Where a value lives (blocks of the volume, and the value's length): the
/// journal's record of it, so one type runs from the command to the disk.
pub use crate::meta::journal::KvLoc;
use crate::wire::nvme::{KvKey, Status, StoreOptions};
use std::time::Instant;

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

/// A KV namespace's key index, as its command set uses it. Each call is one
/// dynamic dispatch per command step, never per byte.
pub trait KeyIndex: Send + Sync {
    /// The volume's block size: values take whole blocks.
    fn block_size(&self) -> u32;
    /// The most keys the namespace holds (Identify MNK).
    fn max_keys(&self) -> u64;
    /// Blocks the values take (Identify NUSE).
    fn used_blocks(&self) -> u64;
    /// Space for a Store of `len` bytes under `key` with `opts`.
    fn reserve(
        &self,
        key: &KvKey,
        len: u32,
        opts: StoreOptions,
        now: Instant,
    ) -> Result<Reserve, Status>;
    /// The value of a reserved Store is written: it becomes `key`'s.
    fn commit_store(
        &self,
        key: &KvKey,
        loc: KvLoc,
        opts: StoreOptions,
        now: Instant,
    ) -> Result<(), Status>;
    /// A reserved Store failed: its blocks are free again.
    fn abort_store(&self, key: &KvKey, loc: KvLoc);
    /// A claimed Store's commit failed: its claim is let go.
    fn abort_claim(&self, key: &KvKey, loc: KvLoc);
    /// Pins `key`'s value for a read: the pin and where the value is.
    fn begin_read(&self, key: &KvKey, now: Instant) -> Result<(u32, KvLoc), Status>;
    /// The read under `pin` is done.
    fn end_read(&self, pin: u32);
    fn exists(&self, key: &KvKey, now: Instant) -> bool;
    fn delete(&self, key: &KvKey, now: Instant) -> Result<(), Status>;
    /// Up to `max` keys from `start` on, in order.
    fn list(&self, start: &KvKey, max: usize, now: Instant) -> Vec<KvKey>;
}
