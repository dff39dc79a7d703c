//! What a node does with a group's namespaces when it becomes the group's
//! owner (issue 36 item 4), before it reports the group optimized.
//!
//! Node-local KV namespaces are taken over **cold**: every key this node's
//! index holds is deleted first, so the new owner answers every key with Key
//! Does Not Exist until a host stores it again, never with the bytes of an
//! older ownership (a node that owned the group before, lost it, and wins it
//! back would otherwise serve values the host has since replaced at another
//! node). Stores succeed at once. The deletes reach the journal at the next
//! commit like a host's; after a crash before it the node is a follower
//! again and empties the index at its next win.
//!
//! KV namespaces on a shared pool are not emptied: their index was
//! recovered with the pool (`shared`), and is as current as the pool.
//!
//! Block namespaces are left alone: a block volume on a node-local pool is
//! refused in a cluster-wide subsystem by config validation, and a RAM or
//! file namespace is each node's own (docs/cluster.md).

use super::ownership::GroupId;
use kvt_nvmf::Target;
use kvt_pool::kv_index::KeyIndex;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Empties the KV namespaces of group `g` here (node-local: taken over cold)
/// but those of `shared` (NSIDs on a shared pool: recovered with their pool,
/// they keep their index); the keys deleted.
pub(super) fn take_over_cold(target: &Target, g: &GroupId, shared: &[u32]) -> u64 {
    let subs = target
        .subsystems
        .read()
        .map(|s| s.clone())
        .unwrap_or_default();
    let Some(s) = subs.iter().find(|s| s.nqn == g.subnqn) else {
        return 0;
    };
    let mut deleted = 0;
    for ns in s.namespace_snapshot().iter() {
        if ns.ana_group.load(Ordering::Acquire) != g.anagrpid || shared.contains(&ns.nsid) {
            continue;
        }
        if let Some(kv) = &ns.kv {
            deleted += empty_index(kv.as_ref());
        }
    }
    if deleted > 0 {
        tracing::info!(subnqn = %g.subnqn, anagrpid = g.anagrpid, keys = deleted, "cluster: KV namespaces taken over cold");
    }
    deleted
}

/// Deletes every key of `kv`; the keys deleted.
fn empty_index(kv: &dyn KeyIndex) -> u64 {
    kv.delete_all(Instant::now())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvt_pool::kv::KvIndex;
    use kvt_wire::nvme::KvKey;

    #[test]
    fn empty_index_deletes_every_key_across_batches() {
        let kv = KvIndex::new(64 << 20, 4096);
        let n = 1024u64 * 2 + 5;
        let mut stored = 0;
        for i in 0..n {
            let key = KvKey::new(&i.to_be_bytes()).unwrap();
            let loc = kvt_pool::format::KvLoc {
                block: i,
                nblocks: 1,
                len: 100,
            };
            if kv.restore(key, loc).is_ok() {
                stored += 1;
            }
        }
        assert!(stored > 1024, "{stored}");
        assert_eq!(empty_index(&kv), stored);
        assert!(kv.list(&KvKey::default(), 10, Instant::now()).is_empty());
    }
}
