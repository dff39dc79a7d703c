//! What can stop a `perf` run or the echo baseline, as values: a refused
//! option, the target refusing the set-up, a queue's socket failing, or the
//! target breaking the NVMe/TCP protocol. `kvtarget perf` prints them as one
//! line naming the option, queue, namespace or command ID.

use crate::initiator;
use kvt_wire::tcp::PduError;
use std::io;
use std::net::SocketAddr;

#[derive(Debug, thiserror::Error)]
pub enum PerfError {
    // Options.
    #[error("--workload: `{0}` is not randread|randwrite|randrw|read|write|lmcache-store|lmcache-retrieve|list")]
    Workload(String),
    #[error("--qd must be 1..=65535")]
    QueueDepth,
    #[error("--queues must be at least 1")]
    Queues,
    #[error("--controllers must be at least 1")]
    Controllers,
    #[error("--workload {0} needs --kv (it is a KV command)")]
    NeedsKv(&'static str),
    #[error("--workload list: --bs is the List host buffer: room for one 16-byte key (24 bytes) up to 4 GiB")]
    ListBuffer,
    #[error("--cpus: cannot run on CPU {0}")]
    Cpu(usize),

    // Setting up the controller.
    #[error("connect {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: initiator::Error,
    },
    #[error("read CAP: {0}")]
    ReadCap(#[source] initiator::Error),
    #[error("--qd {qd} with {pieces} commands per I/O (the target's maximum transfer size splits each) needs more than 65535 command IDs: lower --qd or --bs")]
    TooManyPieces { qd: usize, pieces: usize },
    #[error("--qd {qd} needs a queue of {entries} entries; the target allows {mqes} (CAP.MQES)")]
    QueueTooDeep {
        qd: usize,
        entries: usize,
        mqes: usize,
    },
    #[error("set queue count: {0}")]
    SetQueueCount(#[source] initiator::Error),
    #[error("target granted {granted} I/O queues, {asked} asked")]
    QueuesGranted { granted: u16, asked: u16 },
    #[error("identify namespace {nsid}: {source}")]
    Identify {
        nsid: u32,
        #[source]
        source: initiator::Error,
    },
    #[error("namespace {0} is not active")]
    InactiveNamespace(u32),
    #[error("--bs must be a multiple of the {0}-byte block size")]
    BlockSize(u32),
    #[error("--lmcache-metadata must be a multiple of the {0}-byte block size")]
    LmcacheMetadata(u32),
    #[error("namespace smaller than one I/O per queue")]
    NamespaceTooSmall,
    #[error("--kv: {0} is an LMCache block layout; KV runs take randread|randwrite|randrw|read|write (Retrieve, Store, a mix)")]
    KvWorkload(&'static str),
    #[error(
        "--kv: --bs {value} is over the namespace's largest value ({vml} bytes, KV Identify VML)"
    )]
    KvValueTooLarge { value: usize, vml: u32 },
    #[error("--kv: namespace {0} is not a KV namespace (its KV Identify reports no format)")]
    NotKvNamespace(u32),
    #[error("--kv-keys must be at least one per queue")]
    KvKeys,
    #[error("--zipf must be from 0 (uniform) to 10, got {0}")]
    Zipf(f64),
    #[error("--kv-keys/--zipf: a popularity table for {0} keys is too large (at most 16777216)")]
    ZipfTooLarge(u64),

    // Workers and their queues.
    #[error("worker panicked")]
    WorkerPanicked,
    #[error("queue {qid}: {source}")]
    QueueConnect {
        qid: u16,
        #[source]
        source: initiator::Error,
    },
    #[error("queue {qid}: {source}")]
    QueueSocket {
        qid: u16,
        #[source]
        source: io::Error,
    },
    #[error("prefill: {0}")]
    PrefillSend(#[source] io::Error),
    #[error("prefill: {0}")]
    Prefill(#[source] Box<PerfError>),
    #[error("prefill did not finish within {0} s (600 s + 1 ms per I/O)")]
    PrefillTimeout(u64),
    #[error("prefill writes failed")]
    PrefillFailed,
    #[error("send: {0}")]
    Send(#[source] io::Error),
    #[error("receive: {0}")]
    Receive(#[source] io::Error),
    #[error("KV List: {0}")]
    List(#[source] initiator::Error),
    #[error("{0} commands still outstanding 30 s after the run")]
    Outstanding(usize),

    // What the target sent (queue.rs).
    #[error("target closed the connection")]
    Closed,
    #[error("bad PDU from the target: {0}")]
    BadPdu(#[source] PduError),
    #[error("C2HData digest error (cid {0})")]
    DataDigest(u16),
    #[error("C2HData for no outstanding read (cid {0})")]
    UnexpectedData(u16),
    #[error("C2HData beyond the transfer (cid {0})")]
    DataBeyond(u16),
    #[error("SUCCESS without LAST_PDU")]
    SuccessWithoutLast,
    #[error("target terminated the connection: fes {fes:#x} fei {fei}")]
    Terminated { fes: u16, fei: u32 },
    /// The PDU as `Debug` prints it (it borrows the receive buffer).
    #[error("unexpected PDU from the target: {0}")]
    UnexpectedPdu(String),
    #[error("R2T for no outstanding write (cid {0})")]
    UnexpectedR2t(u16),
    #[error("R2T outside the data (cid {0})")]
    R2tOutside(u16),
    #[error("completion for no outstanding command (cid {0})")]
    UnexpectedCompletion(u16),

    // The echo baseline (echo.rs).
    #[error("echo baseline: sizes and queue depth must be positive")]
    EchoOptions,
    #[error("cannot run on CPU {0}")]
    EchoCpu(usize),
    #[error("bind: {0}")]
    EchoBind(#[source] io::Error),
    #[error("accept: {0}")]
    EchoAccept(#[source] io::Error),
    #[error("connect: {0}")]
    EchoConnect(#[source] io::Error),
    #[error("{0}")]
    EchoSocket(#[source] io::Error),
    #[error("server panicked")]
    EchoServerPanicked,
    #[error("more responses than requests")]
    EchoExtraResponses,
    #[error("echo baseline: responses missing")]
    EchoMissingResponses,
}
