//! kvtarget: a user-space NVMe-over-Fabrics target for KV-cache volumes.
//!
//! Layers, bottom up: `wire` (NVMe and NVMe/TCP formats), `mem` (I/O buffers),
//! `bdev` (block device backends), `meta` (a pool's on-disk metadata), `pool`
//! (extents and volumes on it), `reactor` (polling threads), `target`
//! (subsystems, controllers, namespaces, discovery), `transport` (NVMe/TCP queue
//! pairs), `config` and `server` (assembly), and `initiator` (our own NVMe/TCP host,
//! for tests and `kvtarget perf`).

pub mod auth;
pub mod bdev;
pub mod config;
pub mod ident;
pub mod initiator;
pub mod mem;
pub mod meta;
pub mod metrics;
pub mod nvmf;
pub mod perf;
pub mod pool;
pub mod reactor;
pub mod rpc;
pub mod server;
pub mod stats;
pub mod transport;
pub mod wire;

/// Version string: crate version plus git commit when known.
pub fn version() -> String {
    match option_env!("KVTARGET_GIT_REV") {
        Some(r) if !r.is_empty() => format!("{} ({r})", env!("CARGO_PKG_VERSION")),
        _ => env!("CARGO_PKG_VERSION").to_string(),
    }
}
