//! kvtarget: a user-space NVMe-over-Fabrics target for KV-cache volumes and
//! NVMe-KV namespaces, over NVMe/TCP and NVMe/RDMA.
//!
//! Modules in dependency order, each using only those before it:
//! - leaves: `wire` (NVMe, NVMe/TCP and NVMe/RDMA formats, NQN rules), `mem` (I/O
//!   buffers in the DMA arena), `stats` (latency histograms), `ident` (name-based
//!   UUIDs), `auth` (DH-HMAC-CHAP and TLS PSK keys);
//! - `bdev` (block device backends: ram, uring, nvme over VFIO, spdk, fault);
//! - `reactor` (polling threads, per-reactor device channels, worker loops);
//! - `meta` (a pool's on-disk metadata: superblock, journal, checkpoint,
//!   recovery, offline check);
//! - `pool` (pools, thin volumes, the extent allocator, channels, GC, KV
//!   indexes, the simulation);
//! - `nvmf` (the NVMe-oF core: queues, dispatch by command set, controllers,
//!   subsystems, namespaces, discovery);
//! - `transport` (NVMe/TCP, TLS and NVMe/RDMA queue pairs, the acceptor);
//! - `initiator` (our own NVMe/TCP host) and `perf` (the load generator on it);
//! - the control plane: `config` (the TOML file and its typed operations), `rpc`
//!   (JSON-RPC server, client and methods, one `apply` with the loader),
//!   `metrics` (Prometheus endpoint) and `server` (assembly).
//!
//! One reference points upwards on purpose: the KV command set's view of a key
//! index is a trait owned by its user, `nvmf::kv_index::KeyIndex`, which
//! `pool::kv` implements, so `nvmf` needs nothing from `pool`.

pub use kvt_auth as auth;
pub use kvt_bdev as bdev;
pub use kvt_cluster as cluster;
pub use kvt_config as config;
pub use kvt_wire::ident;
pub mod initiator;
pub use kvt_mem as mem;
pub use kvt_meta as meta;
pub mod metrics;
pub use kvt_nvmf as nvmf;
pub mod perf;
pub use kvt_pool as pool;
pub use kvt_reactor as reactor;
pub mod rpc;
pub mod server;
pub use kvt_mem::stats;
pub use kvt_transport as transport;
pub use kvt_wire as wire;

pub use kvt_nvmf::version;
