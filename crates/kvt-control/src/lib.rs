//! The control plane above the target's layers: the JSON-RPC server, client
//! and SPDK-compatible methods (`rpc`), the Prometheus endpoint (`metrics`),
//! `server`, which builds devices and reactors, applies the configuration's
//! operations, binds the listeners and starts the cluster, and `systemd`, what
//! the assembled target tells its service manager (ready, watchdog, stopping).

pub mod metrics;
pub mod rpc;
pub mod server;
pub mod systemd;
