//! One look at a running target over its RPC socket, with the methods SPDK's
//! `spdk_top` uses where kvtarget has them: `framework_get_reactors`,
//! `nvmf_get_subsystems`, `bdev_get_iostat` (with kvtarget's latency
//! buckets), `kvtarget_get_pools`, `kvtarget_get_kv_namespaces` and, on a
//! cluster member, `kvtarget_get_cluster`. Counters are cumulative; the view
//! turns two samples into rates.

use super::TopError;
use kvtarget::rpc::{code, RpcClient};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// A reactor's counters (`framework_get_reactors`; times in ns).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct ReactorSample {
    pub lcore: u64,
    pub busy: u64,
    pub idle: u64,
    #[serde(default)]
    pub queue_pairs: u64,
    #[serde(default)]
    pub stalls: u64,
    /// The longest gap between two polls since the last metrics scrape (ns).
    #[serde(default)]
    pub max_poll_gap: u64,
}

#[derive(Debug, Deserialize)]
struct Reactors {
    pid: u32,
    reactors: Vec<ReactorSample>,
}

/// A namespace and the bdev (volume `pool/name`, or a device) behind it.
#[derive(Debug, Clone, PartialEq)]
pub struct NamespaceSample {
    pub subsystem: String,
    pub nsid: u32,
    pub bdev: String,
}

#[derive(Debug, Deserialize)]
struct Subsystem {
    nqn: String,
    #[serde(default)]
    namespaces: Vec<SubsystemNamespace>,
}

#[derive(Debug, Deserialize)]
struct SubsystemNamespace {
    nsid: u32,
    bdev_name: String,
}

/// A volume's I/O counters (`bdev_get_iostat`), keyed by its `pool/name`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct VolumeSample {
    pub aliases: Vec<String>,
    #[serde(rename = "num_read_ops")]
    pub reads: u64,
    #[serde(rename = "num_write_ops")]
    pub writes: u64,
    #[serde(rename = "bytes_read")]
    pub read_bytes: u64,
    #[serde(rename = "bytes_written")]
    pub write_bytes: u64,
    /// Commands per latency bucket (not cumulative).
    #[serde(rename = "read_latency_buckets", default)]
    pub read_hist: Vec<u64>,
    #[serde(rename = "write_latency_buckets", default)]
    pub write_hist: Vec<u64>,
}

#[derive(Debug, Deserialize)]
struct Iostat {
    /// The target's clock (ns since it started): rates use its intervals.
    ticks: u64,
    #[serde(default)]
    latency_bucket_bounds_us: Vec<Option<u64>>,
    bdevs: Vec<VolumeSample>,
}

/// A pool's fill and GC (`kvtarget_get_pools`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct PoolSample {
    pub name: String,
    pub extent_size: u64,
    pub extents: u64,
    pub mapped: u64,
    pub dirty: u64,
    pub gc: GcSample,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct GcSample {
    pub mode: String,
    #[serde(default)]
    pub paused: bool,
    pub rate_extents_per_s: f64,
    pub scrubbed: u64,
}

/// A KV namespace's cache counters (`kvtarget_get_kv_namespaces`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct KvSample {
    /// `pool/volume`.
    pub name: String,
    pub keys: u64,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
}

/// This node's roles (`kvtarget_get_cluster`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct ClusterSample {
    pub cluster: String,
    pub node: String,
    pub state: String,
    #[serde(default)]
    pub members: Vec<Value>,
    #[serde(default)]
    pub groups: Vec<GroupSample>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct GroupSample {
    pub subnqn: String,
    pub anagrpid: u32,
    pub role: String,
    #[serde(default)]
    pub owner: Option<String>,
}

/// Everything one refresh shows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sample {
    /// The target's clock at the look (ns since it started).
    pub at_ns: u64,
    pub pid: u32,
    pub reactors: Vec<ReactorSample>,
    pub namespaces: Vec<NamespaceSample>,
    /// By `pool/name` alias.
    pub volumes: BTreeMap<String, VolumeSample>,
    /// Upper bound of each latency bucket in µs; None: unbounded.
    pub bucket_bounds_us: Vec<Option<u64>>,
    pub pools: Vec<PoolSample>,
    /// By `pool/name`.
    pub kv: BTreeMap<String, KvSample>,
    pub cluster: Option<ClusterSample>,
}

fn call<T: DeserializeOwned>(client: &mut RpcClient, method: &'static str) -> Result<T, TopError> {
    let v = client
        .call(method, json!({}))
        .map_err(|error| TopError::Rpc { method, error })?;
    serde_json::from_value(v).map_err(|source| TopError::Answer { method, source })
}

impl Sample {
    pub fn fetch(client: &mut RpcClient) -> Result<Sample, TopError> {
        let reactors: Reactors = call(client, "framework_get_reactors")?;
        let subsystems: Vec<Subsystem> = call(client, "nvmf_get_subsystems")?;
        let iostat: Iostat = call(client, "bdev_get_iostat")?;
        let pools: Vec<PoolSample> = call(client, "kvtarget_get_pools")?;
        let kv: Vec<KvSample> = call(client, "kvtarget_get_kv_namespaces")?;
        let cluster = match client.call("kvtarget_get_cluster", json!({})) {
            Ok(v) => Some(
                serde_json::from_value(v).map_err(|source| TopError::Answer {
                    method: "kvtarget_get_cluster",
                    source,
                })?,
            ),
            // No [cluster]: nothing to show.
            Err(e) if e.code == code::ENOENT => None,
            Err(error) => {
                return Err(TopError::Rpc {
                    method: "kvtarget_get_cluster",
                    error,
                })
            }
        };
        let namespaces = subsystems
            .into_iter()
            .flat_map(|s| {
                let nqn = s.nqn;
                s.namespaces.into_iter().map(move |n| NamespaceSample {
                    subsystem: nqn.clone(),
                    nsid: n.nsid,
                    bdev: n.bdev_name,
                })
            })
            .collect();
        let volumes = iostat
            .bdevs
            .into_iter()
            .filter_map(|b| Some((b.aliases.first()?.clone(), b)))
            .collect();
        Ok(Sample {
            at_ns: iostat.ticks,
            pid: reactors.pid,
            reactors: reactors.reactors,
            namespaces,
            volumes,
            bucket_bounds_us: iostat.latency_bucket_bounds_us,
            pools,
            kv: kv.into_iter().map(|k| (k.name.clone(), k)).collect(),
            cluster,
        })
    }
}
