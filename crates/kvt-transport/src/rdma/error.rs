//! What can go wrong setting up NVMe/RDMA, as values: loading rdma-core,
//! listening through the RDMA CM, opening a device (PD, completion queue,
//! registered memory) and building a queue pair. Each names the verbs or CM
//! call that failed and carries the errno, device, address or sizes; the
//! server and the RPC methods print them as one line.

use std::io;
use std::net::SocketAddr;

/// Why rdma-core could not be loaded. Cloned: the outcome is cached once per
/// process and handed to every caller.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LoadError {
    #[error("rdma-core is not installed or not loadable ({lib}: {reason}); install libibverbs1, librdmacm1 and ibverbs-providers")]
    Library { lib: String, reason: String },
    #[error("rdma-core lacks {symbol} ({reason})")]
    Symbol { symbol: String, reason: String },
}

#[derive(Debug, thiserror::Error)]
pub enum RdmaError {
    // Listening (cm.rs).
    #[error("RDMA listener {addr}: {source}")]
    ListenerLoad {
        addr: SocketAddr,
        #[source]
        source: LoadError,
    },
    #[error("RDMA listener {addr}: cannot open the RDMA CM ({source}); is rdma_ucm loaded?")]
    ListenerEventChannel {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("RDMA listener {addr}: rdma_create_id: {source}")]
    CreateId {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("RDMA listener {addr}: cannot bind ({source}); is there an RDMA device (e.g. rxe) on that address?")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("RDMA listener {addr}: rdma_listen: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("RDMA listener {addr}: no RDMA device on that address")]
    NoDevice { addr: SocketAddr },
    #[error("RDMA listener {addr}: {source}")]
    ListenerNonblocking {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },

    // Starting the transport (cm.rs).
    #[error("NVMe/RDMA: {0}")]
    TransportLoad(#[source] LoadError),
    #[error("{0} poisoned")]
    Poisoned(&'static str),
    #[error("RDMA CM thread: {0}")]
    CmThread(#[source] io::Error),
    #[error("rdma_accept: {0}")]
    Accept(#[source] io::Error),

    // Refusing a connection request (cm.rs); logged, and the host gets the
    // matching CM status.
    #[error("bad private data ({len} bytes)")]
    BadPrivateData { len: usize },
    #[error("qid {qid} hsqsize {hsqsize} (limit {limit})")]
    Hsqsize { qid: u16, hsqsize: u16, limit: u16 },
    #[error("qid {qid} hrqsize {hrqsize}")]
    Hrqsize { qid: u16, hrqsize: u16 },
    #[error("qid {qid}")]
    Qid { qid: u16 },
    #[error("request has no device")]
    RequestWithoutDevice,
    #[error("queue depth {depth} exceeds the device's limits")]
    DepthExceedsDevice { depth: usize },
    #[error("qid {qid}: {source}")]
    Reserve {
        qid: u16,
        #[source]
        source: Box<RdmaError>,
    },

    // The device table (device.rs).
    #[error("ibv_query_device failed: {errno}")]
    QueryDevice { errno: i32 },
    #[error("ibv_alloc_pd failed on {device}")]
    AllocPd { device: String },
    #[error("reactor {reactor} inbox full")]
    InboxFull { reactor: usize },
    #[error("poll group of reactor {reactor} missing")]
    PollGroupMissing { reactor: usize },

    // Poll groups (poller.rs).
    #[error("completion queue of reactor {reactor} on {device} is full: {used} of {entries} entries reserved, this queue pair needs {needed} (raise rdma.max_qpairs_per_reactor or reactors.count)")]
    CqFull {
        reactor: usize,
        device: String,
        used: u32,
        entries: u32,
        needed: u32,
    },
    #[error("ibv_create_comp_channel failed on {device}: {source}")]
    CreateCompChannel {
        device: String,
        #[source]
        source: io::Error,
    },
    #[error("ibv_create_cq ({entries} entries) on {device}: {source}")]
    CreateCq {
        entries: u32,
        device: String,
        #[source]
        source: io::Error,
    },
    #[error("completion channel on {device}: {source}")]
    CompChannelNonblocking {
        device: String,
        #[source]
        source: io::Error,
    },

    // Registered data memory (mr.rs).
    #[error("cannot register the I/O buffer memory with {device}: {source}")]
    RegisterArena {
        device: String,
        #[source]
        source: kvt_mem::dma::DmaError,
    },

    // Building a queue pair (qpair.rs).
    #[error("rdma_create_event_channel failed: {0}")]
    QpEventChannel(#[source] io::Error),
    #[error("rdma_migrate_id: {0}")]
    MigrateId(#[source] io::Error),
    #[error("rdma_create_qp: {0}")]
    CreateQp(#[source] io::Error),
    #[error("ibv_reg_mr for {bytes} bytes of receive buffers failed: {source}")]
    RegRecvBuffers {
        bytes: usize,
        #[source]
        source: io::Error,
    },
    #[error("ibv_post_recv: errno {errno}")]
    PostRecv { errno: i32 },
    #[error("event channel: {0}")]
    QpNonblocking(#[source] io::Error),
}
