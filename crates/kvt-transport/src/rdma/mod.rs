//! NVMe/RDMA: command capsules by SEND/RECV, data by RDMA READ (host-to-target)
//! and RDMA WRITE (target-to-host), responses by SEND (with Invalidate when the
//! host asked for it), over reliable-connected QPs set up by the RDMA CM.
//!
//! Place in the I/O path: the CM thread (`cm_loop`) answers connection requests
//! (checking the NVMe/RDMA private data), picks a reactor, builds the QP on that
//! reactor's completion queue for the device and hands the QP to the reactor
//! like a TCP connection. From then on the reactor owns it; the QP's fd is its
//! CM event channel (disconnects). Commands then go through the same target
//! core as NVMe/TCP (fabrics Connect, admin, I/O planning, devices).
//!
//! Poll groups: each (RDMA device, reactor) pair has ONE completion queue (and
//! one completion channel, which wakes a sleeping reactor), shared by every QP
//! of that reactor on that device for sends and receives. The reactor polls it
//! once per pass (`RdmaPoller`, a `SharedPoller`) and routes each work
//! completion by `wc.qp_num` to its QP. A QP that closes goes to the error
//! state and is destroyed only once every work request it posted has come back
//! (flushed): nothing of it is left in the shared CQ.
//!
//! Memory: receive buffers and response capsules live in one registered block
//! per QP. Data for RDMA READ/WRITE is in ordinary I/O buffers from the
//! reactor's size-class pool, as for NVMe/TCP: each device registers the
//! process-wide DMA arena they come from (`mr`), so a buffer goes between the
//! wire and the device without a copy, and its lkey is a table lookup.
//!
//! Layout: `cm` (listeners, the CM thread, accepting a connection), `device`
//! (the device table: PD, memory keys, and per reactor a buffer budget and a
//! poll group), `mr` (registered data memory), `error` (what setup can fail with), `poller` (poll groups and their shared CQ
//! poller), `qpair` (the queue pair), and `verbs` (the rdma-core FFI).

pub mod verbs;

mod cm;
mod device;
mod error;
mod mr;
mod poller;
mod qpair;

// Every item stays reachable as `transport::rdma::X`, as before the split.
pub use self::cm::{cm_loop, listen, RdmaListener, RdmaListenerSet, RdmaTransport};
pub use self::device::poll_group_stats;
pub use self::error::{LoadError, RdmaError};
pub use self::poller::{PollGroup, PollGroupStats};
pub use self::qpair::{RdmaQueuePair, RdmaReq};

/// RDMA sizing, from the `[rdma]` configuration section.
#[derive(Debug, Clone)]
pub struct RdmaSettings {
    /// Data memory the requests of one reactor on one device hold at once
    /// (bytes); a command past it waits.
    pub buffer_pool_bytes: usize,
    /// Cap on RDMA READs one QP keeps outstanding (the device and the host's
    /// responder resources may lower it further).
    pub max_outstanding_reads: u32,
    /// QPs one reactor serves per device: sizes the reactor's completion queue
    /// (the device's max_cqe may lower it); a QP past it is refused.
    pub max_qpairs_per_reactor: u32,
}

impl Default for RdmaSettings {
    fn default() -> Self {
        RdmaSettings {
            buffer_pool_bytes: 64 << 20,
            max_outstanding_reads: 16,
            max_qpairs_per_reactor: 64,
        }
    }
}

/// Responses a QP can send that belong to no request slot (CID conflicts, AERs):
/// MAX_AERS (4) plus room for conflicts.
const EXTRA_RESPONSES: usize = 16;
