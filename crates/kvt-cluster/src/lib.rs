//! Cluster membership through etcd (issue 36, first slice): each node keeps a
//! lease-bound record of what it serves under `/kvtarget/<cluster>/members/`,
//! and a view of every member; each live peer in the view becomes a referral
//! in this node's discovery log (`referral`). The ANA groups of cluster-wide
//! subsystems get one owner each by an election held with the lease
//! (`ownership`, the pure state machine; `elect`, its etcd side), fenced at
//! half the TTL (docs/cluster.md).
//!
//! Everything here runs on one control-plane thread ("cluster"), never on a
//! reactor: a blocking HTTP call to etcd may take a whole timeout.
//!
//! Why etcd's JSON gRPC gateway and not gRPC: the official gRPC client
//! (`etcd-client`) brings tokio, tonic, prost and a protoc build step, minutes
//! of build in each of CI's five profiles, and an async runtime into a process
//! whose threads are reactors. The gateway speaks the same v3 API (same
//! messages, same semantics) as JSON over HTTP/1.1; the handful of calls a
//! membership needs are blocking POSTs (`http`). A small HTTP client crate was
//! weighed too: `ureq` 2 without default features still pulls `url`, `idna`
//! and ICU (some thirty crates) for what is here one request format.
//!
//! The member view is a range read of the members prefix at each keep-alive
//! (every TTL/3), not a watch: one thread, one blocking request at a time, no
//! stream to resume after etcd restarts, and the view is never staler than a
//! dead member's lease would be anyway.

mod cntlid;
mod elect;
pub mod etcd;
pub mod http;
pub mod member;
mod node;
pub mod ownership;
pub mod referral;
pub mod shared;
mod table;
mod takeover;

pub use elect::{inaccessible_until_elected, GroupStatus};
pub use member::{MemberListener, MemberRecord};
pub use node::{Cluster, ClusterError, ClusterStatus, ClusterView, LeaseEvent, NodeState};
pub use shared::{detached_namespace, SharedNamespace, SharedPool, SharedPools};
pub use table::status_table;
