//! Controller IDs unique across the nodes that serve one cluster-wide
//! subsystem. The nodes are one NVM subsystem to a host, and a host refuses a
//! second controller of a subsystem with a CNTLID it already has (Linux:
//! "Duplicate cntlid ... rejecting"), so every node allocating from 1 let a
//! host connect to one node only. Each node claims a block of IDs in etcd
//! under its name, for good (no lease): a restarted node finds its block
//! again, and a node never takes a block another name holds.

use super::etcd::{
    prefix_end, Client, Compare, EtcdError, PutRequest, RangeRequest, RequestOp, TxnRequest,
};

/// IDs per node: 15 blocks of 1..=0xFFEF (0xFFF0 and above are reserved).
pub const BLOCK_LEN: u16 = 4096;
pub const BLOCKS: u16 = 0xFFEF / BLOCK_LEN;

/// The controller IDs of block `b`, inclusive.
pub fn block_range(b: u16) -> (u16, u16) {
    assert!(b < BLOCKS, "controller ID block {b} of {BLOCKS}");
    (1 + b * BLOCK_LEN, (b + 1) * BLOCK_LEN)
}

#[derive(Debug, thiserror::Error)]
pub enum CntlidError {
    #[error(transparent)]
    Etcd(#[from] EtcdError),
    #[error("cluster: every one of the {BLOCKS} controller ID blocks of cluster `{cluster}` is held by another node name (keys under {prefix}); delete those of nodes that are gone")]
    Exhausted { cluster: String, prefix: String },
}

fn prefix(cluster: &str) -> String {
    format!("/kvtarget/{cluster}/cntlid/")
}

/// The block `node` holds in `cluster`, claimed now if it holds none.
pub fn claim(client: &mut Client, cluster: &str, node: &str) -> Result<u16, CntlidError> {
    let pre = prefix(cluster);
    let held = client.range(&RangeRequest {
        key: pre.as_bytes().to_vec(),
        range_end: prefix_end(pre.as_bytes()),
    })?;
    let block_of = |key: &[u8]| -> Option<u16> {
        let n = std::str::from_utf8(key.strip_prefix(pre.as_bytes())?).ok()?;
        n.parse().ok().filter(|&b| b < BLOCKS)
    };
    if let Some(b) = held
        .kvs
        .iter()
        .filter(|kv| kv.value == node.as_bytes())
        .find_map(|kv| block_of(&kv.key))
    {
        return Ok(b);
    }
    for b in 0..BLOCKS {
        let key = format!("{pre}{b}").into_bytes();
        if held.kvs.iter().any(|kv| kv.key == key) {
            continue;
        }
        let txn = TxnRequest {
            compare: vec![Compare {
                result: "EQUAL".into(),
                target: "CREATE".into(),
                key: key.clone(),
                create_revision: 0,
            }],
            success: vec![RequestOp::RequestPut(PutRequest {
                key,
                value: node.as_bytes().to_vec(),
                lease: 0,
            })],
            failure: Vec::new(),
        };
        if client.txn(&txn)?.succeeded {
            return Ok(b);
        }
    }
    Err(CntlidError::Exhausted {
        cluster: cluster.into(),
        prefix: pre,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_disjoint_and_below_the_reserved_ids() {
        let mut last = 0;
        for b in 0..BLOCKS {
            let (lo, hi) = block_range(b);
            assert!(
                lo > last && lo <= hi && hi <= 0xFFEF,
                "block {b}: {lo}..={hi}"
            );
            last = hi;
        }
        assert_eq!(block_range(0), (1, 4096));
    }
}
