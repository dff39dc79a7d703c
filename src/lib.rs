//! kvtarget: a user-space NVMe-over-Fabrics target for KV-cache volumes and
//! NVMe-KV namespaces, over NVMe/TCP and NVMe/RDMA.
//!
//! The code is a workspace whose crates are its layers, each depending only on
//! those below it, so an import that climbs back up does not compile
//! (docs/architecture.md, "Crates"). This crate is the top: the `kvtarget`
//! binary, and the layers under the module names the tests, benchmarks, fuzz
//! targets and documentation use, bottom first:
//! - `wire` (NVMe, NVMe/TCP and NVMe/RDMA formats, NQN rules) with `ident`
//!   (name-based UUIDs): kvt-wire; `mem` (I/O buffers in the DMA arena) with
//!   `stats` (latency histograms): kvt-mem; `auth` (DH-HMAC-CHAP and TLS PSK
//!   keys): kvt-auth;
//! - `bdev` (block device backends: ram, uring, nvme over VFIO, spdk, fault):
//!   kvt-bdev;
//! - `reactor` (polling threads, per-reactor device channels, worker loops):
//!   kvt-reactor;
//! - `meta` (a pool's on-disk metadata): kvt-meta; `pool` (pools, thin volumes,
//!   the extent allocator, channels, GC, KV indexes and the `KeyIndex` trait the
//!   KV command set reaches them through): kvt-pool;
//! - `nvmf` (the NVMe-oF core: queues, dispatch by command set, controllers,
//!   subsystems, namespaces, discovery): kvt-nvmf;
//! - `transport` (NVMe/TCP, TLS and NVMe/RDMA queue pairs, the acceptor):
//!   kvt-transport;
//! - `config` (the TOML file, its typed operations, their `apply`, and the
//!   setup of devices, pools and namespaces): kvt-config;
//! - `cluster` (membership and ANA group ownership through etcd): kvt-cluster;
//! - `rpc` (JSON-RPC server, client and methods), `metrics` (Prometheus
//!   endpoint), `server` (assembly) and `systemd` (readiness, watchdog and
//!   stop notifications to the service manager): kvt-control;
//! - `initiator` (our own NVMe/TCP host) and `perf` (the load generator on it):
//!   kvt-host.

pub use kvt_auth as auth;
pub use kvt_bdev as bdev;
pub use kvt_cluster as cluster;
pub use kvt_config as config;
pub use kvt_control::{metrics, rpc, server, systemd};
pub use kvt_host::{initiator, perf};
pub use kvt_mem as mem;
pub use kvt_mem::stats;
pub use kvt_meta as meta;
pub use kvt_nvmf as nvmf;
pub use kvt_nvmf::version;
pub use kvt_pool as pool;
pub use kvt_reactor as reactor;
pub use kvt_transport as transport;
pub use kvt_wire as wire;
pub use kvt_wire::ident;
