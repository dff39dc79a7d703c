//! What the index's tests share: keys, Stores as a command makes them,
//! commits as the pool makes them.

pub(super) use super::{KvIndex, KvLoc, Reserve};
pub(super) use kvt_wire::nvme::{KvKey, Status, StoreOptions};
use std::collections::BTreeMap;
use std::time::Instant;

pub(super) fn key(n: u32) -> KvKey {
    KvKey::new(&n.to_be_bytes()).unwrap_or_default()
}
pub(super) const NONE: StoreOptions = StoreOptions {
    must_exist: false,
    must_not_exist: false,
    no_compress: false,
};

/// A commit as the pool makes it: the drained changes become what
/// recovery would find (`durable`).
pub(super) fn commit(ix: &KvIndex, durable: &mut BTreeMap<KvKey, KvLoc>) {
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

pub(super) fn store_with(
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

pub(super) fn store(ix: &KvIndex, k: &KvKey, len: u32, now: Instant) -> Result<KvLoc, Status> {
    store_with(ix, k, len, now, &mut BTreeMap::new())
}
