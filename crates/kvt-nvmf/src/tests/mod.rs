//! Unit tests of the command core, driven through a fake transport: no socket,
//! no reactor. Device I/O runs on RAM namespaces (or a failing fake device)
//! whose channels these fixtures poll themselves, routing completions to
//! `Queue::io_complete` as the reactor does. One file per concern; the
//! fixtures (a fake link, test devices, a target with a subsystem, a queue
//! driven command by command) are here.

mod admin;
mod ana;
mod command_sets;
mod connect;
mod io_kv;
mod io_nvm;
mod reservation;
mod sgl;
mod slots;
mod target;
mod target_sim;

use super::fabrics::QueueBinding;
use super::queue::*;
use super::{QpairStats, Target};
use crate::connect::QID_RELEASE_WAIT;
use crate::controller::{
    cap_register, AEC_DISCOVERY_LOG, AEC_NS_ATTR, AEN_DISCOVERY_LOG_CHANGED, AEN_NS_ATTR_CHANGED,
    MAX_AERS,
};
use crate::{Controller, Listener, Namespace, Subsystem, SubsystemKind, TransportLimits};
use kvt_bdev::ram::RamDevice;
use kvt_bdev::{BlockDevice, IoChannel, IoCompletion, IoOp};
use kvt_mem::BufPool;
use kvt_mem::IoBuf;
use kvt_reactor::IoCtx;
use kvt_reactor::{ChannelCache, Locals};
use kvt_wire::nvme::CATTR_DISABLE_SQ_FLOW;
use kvt_wire::nvme::{
    self, cns, csts, fid, io_opc, lid, nidt, prop, ConnectCommand, ConnectData, DsmRange,
    ErrorLogEntry, GetLogPage, IdentifyController, IdentifyNamespace, PropertyCommand,
    SglDescriptor, SmartLog, CONNECT_DATA_LEN, DSM_ATTR_DEALLOCATE,
};
use kvt_wire::nvme::{admin_opc, fctype, Cqe, DataDirection, Sqe, Status};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use std::os::fd::RawFd;

const SUBNQN: &str = "nqn.2024-01.io.kvtarget:queue-tests";

const HOSTNQN: &str = "nqn.2024-01.io.kvtarget:host-a";

const HOSTID: [u8; 16] = [0xA5; 16];

const BS: u32 = 512;

/// 2048 blocks of 512 bytes.
const NS_BYTES: u64 = 1 << 20;

const NS_BLOCKS: u64 = NS_BYTES / BS as u64;

/// CC with EN and the standard 64/16-byte entry sizes, as Linux writes it.
const CC_ENABLE: u64 = 0x46_0001;

// ---------------------------------------------------------------------------
// The fake transport.

/// One response as the fake transport would have put it on the wire.
#[derive(Debug, Clone, PartialEq)]
struct Sent {
    /// `None` for `respond_unslotted`.
    slot: Option<u16>,
    cqe: Cqe,
    /// The controller-to-host data that goes with it.
    data: Vec<u8>,
    /// Where read data left from (to tell a placed buffer from a copy).
    data_ptr: Option<usize>,
    close_after: bool,
}

impl Sent {
    fn status(&self) -> Status {
        self.cqe.status()
    }
}

#[derive(Default)]
struct FakeLink {
    sent: Vec<Sent>,
    /// Answer `Release::Later`, as NVMe/RDMA does while its SEND is in flight.
    hold: bool,
    discarded: Vec<u16>,
}

/// The fake transport's per-request state: the CID it saw in the capsule, to
/// check the core hands the transport's own state back with every answer.
type FakeReq = Option<u16>;

impl Link<FakeReq> for FakeLink {
    fn respond(
        &mut self,
        slot: u16,
        req: &mut Request<FakeReq>,
        rsp: &Response,
        _ctx: &mut IoCtx,
    ) -> Release {
        assert_eq!(req.phase, Phase::Responding, "answered before Responding");
        assert_eq!(rsp.cqe.status(), rsp.status, "CQE and status disagree");
        assert_eq!(rsp.cqe.cid, req.sqe.cid(), "response for another CID");
        // What the transport put in the capsule is there at answer time, also
        // for commands answered at once (NVMe/RDMA needs its keyed descriptor
        // to write an Identify's data).
        assert_eq!(
            req.x,
            Some(req.sqe.cid()),
            "the transport's request state was lost"
        );
        let (data, data_ptr) = match rsp.c2h {
            C2h::None => (Vec::new(), None),
            C2h::Data(n) => {
                let b = req.buf.as_ref().expect("C2h::Data without a buffer");
                (b[..n].to_vec(), Some(b.as_ptr() as usize))
            }
            C2h::Reply => (req.reply.clone().expect("C2h::Reply without a reply"), None),
        };
        self.sent.push(Sent {
            slot: Some(slot),
            cqe: rsp.cqe,
            data,
            data_ptr,
            close_after: rsp.close_after,
        });
        if self.hold {
            Release::Later
        } else {
            Release::Now
        }
    }

    fn respond_unslotted(&mut self, cqe: &Cqe) {
        self.sent.push(Sent {
            slot: None,
            cqe: *cqe,
            data: Vec::new(),
            data_ptr: None,
            close_after: false,
        });
    }

    fn discard(&mut self, slot: u16, _req: &mut Request<FakeReq>, _ctx: &mut IoCtx) {
        self.discarded.push(slot);
    }
}

// ---------------------------------------------------------------------------
// A device whose every operation fails (completes with EIO when polled).

struct FailingDevice;

#[derive(Default)]
struct FailingChannel(Vec<IoCompletion>);

impl BlockDevice for FailingDevice {
    fn describe(&self) -> String {
        "failing".into()
    }
    fn size_bytes(&self) -> u64 {
        NS_BYTES
    }
    fn open_channel(&self) -> std::io::Result<Box<dyn IoChannel>> {
        Ok(Box::new(FailingChannel::default()))
    }
    fn sync(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn volatile(&self) -> bool {
        true
    }
}

impl IoChannel for FailingChannel {
    fn submit(&mut self, tag: u64, op: IoOp, _now: Instant) -> Result<(), (IoOp, i32)> {
        self.0.push(IoCompletion {
            tag,
            result: Err(libc::EIO),
            buf: op.into_buf(),
        });
        Ok(())
    }
    fn flush_submissions(&mut self) {}
    fn poll(&mut self, out: &mut Vec<IoCompletion>, _now: Instant) -> usize {
        let n = self.0.len();
        out.append(&mut self.0);
        n
    }
    fn in_flight(&self) -> usize {
        self.0.len()
    }
    fn completion_fd(&self) -> Option<RawFd> {
        None
    }
}

// ---------------------------------------------------------------------------
// Target, queues and commands.

struct Env {
    target: Arc<Target>,
    subsys: Arc<Subsystem>,
}

/// A target with one NVM subsystem that admits `HOSTNQN` only and has a RAM
/// namespace 1, and one NVM listener (for the discovery log).
fn env() -> Env {
    let target = Arc::new(Target::new(TransportLimits::default()));
    if let Ok(mut l) = target.listeners.write() {
        l.push(Listener {
            addr: "127.0.0.1:4420".parse().unwrap(),
            discovery_only: false,
            portid: 1,
            rdma: false,
            secure: false,
        });
    }
    let subsys = Arc::new(Subsystem::new(
        SUBNQN,
        SubsystemKind::Nvm,
        "SERIAL1",
        "MODEL1",
        false,
        vec![HOSTNQN.into()],
    ));
    target.add_subsystem(subsys.clone());
    let e = Env { target, subsys };
    e.add_ram_ns(1);
    e
}

fn tcp_cfg() -> QueueConfig {
    QueueConfig {
        kind: TransportKind::Tcp,
        peer: "tcp-peer".into(),
        local: None,
        discovery_only: false,
        expected_qid: None,
        max_entries: None,
        exact_capsule: true,
        places_read_buffers: false,
    }
}

fn rdma_cfg(qid: u16) -> QueueConfig {
    QueueConfig {
        kind: TransportKind::Rdma,
        peer: "rdma-peer".into(),
        local: None,
        discovery_only: false,
        expected_qid: Some(qid),
        max_entries: Some(32),
        exact_capsule: false,
        places_read_buffers: true,
    }
}

impl Env {
    fn add_ns(&self, nsid: u32, dev: kvt_bdev::SharedDevice) -> Arc<Namespace> {
        let ns = Arc::new(Namespace::new(SUBNQN, nsid, dev, BS));
        self.subsys.add_namespace(ns.clone()).unwrap();
        ns
    }
    fn add_ram_ns(&self, nsid: u32) -> Arc<Namespace> {
        self.add_ns(nsid, RamDevice::new("qt", NS_BYTES).unwrap())
    }
    fn conn(&self, cfg: QueueConfig) -> Conn {
        Conn {
            q: Queue::new(self.target.clone(), cfg),
            link: FakeLink::default(),
            channels: ChannelCache::default(),
            bufs: BufPool::new(8),
            locals: Locals::default(),
            conn_id: 7,
            seen: Vec::new(),
            now: Instant::now(),
            start: Instant::now(),
        }
    }
    fn ctrl(&self, cntlid: u16) -> Arc<Controller> {
        self.subsys.controllers.lock().unwrap()[&cntlid].clone()
    }
    /// A connected admin queue of an enabled controller, and its CNTLID.
    fn admin_with(&self, cfg: QueueConfig) -> (Conn, u16) {
        let mut a = self.conn(cfg);
        let r = a.connect(0, 31, 0, 0xFFFF, SUBNQN);
        assert_eq!(r.status(), Status::SUCCESS);
        let cntlid = r.cqe.result as u16;
        assert_eq!(
            a.exec(prop_set(1, prop::CC, CC_ENABLE)).status(),
            Status::SUCCESS
        );
        (a, cntlid)
    }
    fn admin(&self) -> (Conn, u16) {
        self.admin_with(tcp_cfg())
    }
    /// I/O queue `qid` (32 entries) of controller `cntlid`.
    fn io_with(&self, cfg: QueueConfig, cntlid: u16, qid: u16) -> Conn {
        let mut c = self.conn(cfg);
        let r = c.connect(qid, 31, 0, cntlid, SUBNQN);
        assert_eq!(r.status(), Status::SUCCESS, "I/O queue connect");
        c
    }
    /// An enabled controller's admin queue and its I/O queue 1, over TCP.
    fn pair(&self) -> (Conn, Conn) {
        let (a, cntlid) = self.admin();
        let io = self.io_with(tcp_cfg(), cntlid, 1);
        (a, io)
    }
}

/// One queue and what its transport and reactor would own.
struct Conn {
    q: Queue<FakeReq>,
    link: FakeLink,
    channels: ChannelCache,
    bufs: BufPool,
    locals: Locals,
    conn_id: u32,
    /// Every namespace the queue has had in its table: the channels to poll.
    seen: Vec<Arc<Namespace>>,
    /// The reactor's clock as this queue sees it: tests move it with `advance`.
    now: Instant,
    /// Where `now_ns` counts from.
    start: Instant,
}

/// The data descriptor NVMe/TCP derives from an SQE's SGL.
fn tcp_desc(sqe: &Sqe) -> Result<DataDesc, Status> {
    let sgl = sqe.sgl();
    match (sgl.length, sgl.type_byte) {
        (0, _) => Ok(DataDesc::None),
        (len, SglDescriptor::IN_CAPSULE) => Ok(DataDesc::InCapsule {
            offset: sgl.address,
            len,
        }),
        (len, _) => Ok(DataDesc::Host { len }),
    }
}

impl Conn {
    fn with<R>(
        &mut self,
        f: impl FnOnce(&mut Queue<FakeReq>, &mut FakeLink, &mut IoCtx) -> R,
    ) -> R {
        let Conn {
            q,
            link,
            channels,
            bufs,
            locals,
            conn_id,
            now,
            start,
            ..
        } = self;
        let mut ctx = IoCtx {
            channels,
            bufs,
            locals,
            conn_id: *conn_id,
            now: *now,
            now_ns: now.saturating_duration_since(*start).as_nanos() as u64,
        };
        let r = f(q, link, &mut ctx);
        for ns in self.q.ns.all() {
            if !self.seen.iter().any(|s| s.key == ns.key) {
                self.seen.push(ns.clone());
            }
        }
        r
    }

    fn receive_raw(
        &mut self,
        sqe: Sqe,
        desc: Result<DataDesc, Status>,
        icd: &[u8],
        corrupt: bool,
    ) -> Received {
        self.with(|q, l, ctx| {
            let capsule = Capsule {
                sqe: &sqe,
                desc,
                icd,
                icd_corrupt: corrupt,
                x: Some(sqe.cid()),
            };
            q.receive(capsule, l, ctx)
        })
    }

    /// Receives `sqe` with the descriptor its SGL names and no capsule data.
    fn receive(&mut self, sqe: Sqe) -> Received {
        self.receive_raw(sqe, tcp_desc(&sqe), &[], false)
    }

    fn data_ready(&mut self, slot: u16, corrupt: bool) {
        self.with(|q, l, ctx| q.data_ready(slot, corrupt, l, ctx))
    }

    /// Polls every device channel the queue used once, routing completions to
    /// the queue by tag. Returns how many there were.
    fn poll(&mut self) -> usize {
        let mut done = Vec::new();
        for ns in self.seen.clone() {
            if let Ok(ch) = self.channels.get(&ns) {
                ch.poll(&mut done, self.now);
            }
        }
        let n = done.len();
        for c in done {
            assert_eq!(
                c.tag >> 32,
                self.conn_id as u64,
                "tag names another connection"
            );
            let slot = c.tag as u16;
            self.with(|q, l, ctx| q.io_complete(slot, c.result, c.buf, l, ctx));
        }
        n
    }

    fn drain(&mut self) {
        while self.poll() > 0 {}
    }

    fn housekeeping(&mut self) -> Option<&'static str> {
        self.with(|q, l, ctx| q.housekeeping(l, ctx))
    }

    /// Moves this queue's clock on.
    fn advance(&mut self, by: std::time::Duration) {
        self.now += by;
    }

    fn release(&mut self, slot: u16) {
        self.with(|q, l, ctx| q.release(slot, l, ctx))
    }

    fn abandon(&mut self, slot: u16) {
        self.with(|q, l, ctx| q.abandon(slot, l, ctx))
    }

    /// Responses sent since the last call.
    fn take(&mut self) -> Vec<Sent> {
        std::mem::take(&mut self.link.sent)
    }

    /// The one response sent since the last call.
    fn one(&mut self) -> Sent {
        let mut v = self.take();
        assert_eq!(v.len(), 1, "expected exactly one response: {v:?}");
        v.remove(0)
    }

    /// Runs a command that needs no data transfer to its response.
    fn exec(&mut self, sqe: Sqe) -> Sent {
        self.exec_icd(sqe, &[])
    }

    /// Runs a command with in-capsule data (`sqe`'s SGL must say so).
    fn exec_icd(&mut self, sqe: Sqe, icd: &[u8]) -> Sent {
        assert_eq!(
            self.receive_raw(sqe, tcp_desc(&sqe), icd, false),
            Received::Done
        );
        self.drain();
        self.one()
    }

    /// Gives a command the host data it asked for, as NVMe/TCP does after R2T.
    fn fill(&mut self, slot: u16, data: &[u8]) {
        let mut b = self.bufs.get(data.len());
        b.copy_from_slice(data);
        self.q.request_mut(slot).expect("request").buf = Some(b);
    }

    /// Runs a command whose host data is moved after `receive` (R2T).
    fn exec_h2c(&mut self, sqe: Sqe, data: &[u8]) -> Sent {
        let slot = match self.receive(sqe) {
            Received::NeedData {
                slot,
                len,
                dir: DataDirection::HostToController,
            } => {
                assert_eq!(len, data.len());
                slot
            }
            other => panic!(
                "expected a host data request, got {other:?}: {:?}",
                self.take()
            ),
        };
        self.fill(slot, data);
        self.data_ready(slot, false);
        self.drain();
        self.one()
    }

    /// Fabrics Connect with in-capsule data; returns its response.
    fn connect(&mut self, qid: u16, sqsize: u16, cattr: u8, cntlid: u16, subnqn: &str) -> Sent {
        let (sqe, data) = connect_cmd(9, qid, sqsize, cattr, cntlid, subnqn, HOSTNQN);
        self.exec_icd(sqe, &data)
    }

    fn write(&mut self, cid: u16, nsid: u32, slba: u64, data: &[u8]) -> Sent {
        let nlb = (data.len() / BS as usize) as u32;
        self.exec_h2c(rw(io_opc::WRITE, cid, nsid, slba, nlb), data)
    }

    fn read(&mut self, cid: u16, nsid: u32, slba: u64, nlb: u32) -> Sent {
        self.exec(rw(io_opc::READ, cid, nsid, slba, nlb))
    }

    /// Runs a read whose buffer the transport places first (NVMe/RDMA).
    fn read_placed(&mut self, cid: u16, nsid: u32, slba: u64, nlb: u32) -> Sent {
        let len = (nlb * BS) as usize;
        match self.receive(rw(io_opc::READ, cid, nsid, slba, nlb)) {
            Received::NeedData {
                slot,
                len: l,
                dir: DataDirection::ControllerToHost,
            } if l == len => {
                self.q.request_mut(slot).expect("request").buf = Some(IoBuf::new(len));
                self.data_ready(slot, false);
            }
            other => panic!("expected a read buffer request, got {other:?}"),
        }
        self.drain();
        self.one()
    }

    /// This queue's counters as the target's metrics see them.
    fn stats(&self) -> Arc<QpairStats> {
        let qid = self.q.qid();
        let cntlid = self.q.binding().expect("bound").ctrl().cntlid;
        let all = self.q.target.live_qpairs();
        let mine: Vec<_> = all
            .into_iter()
            .filter(|s| s.qid == qid && s.cntlid == cntlid)
            .collect();
        assert_eq!(mine.len(), 1);
        mine[0].clone()
    }
}

/// A Connect SQE (in-capsule data) and its data.
fn connect_cmd(
    cid: u16,
    qid: u16,
    sqsize: u16,
    cattr: u8,
    cntlid: u16,
    subnqn: &str,
    hostnqn: &str,
) -> (Sqe, Vec<u8>) {
    let mut sqe = ConnectCommand {
        recfmt: 0,
        qid,
        sqsize,
        cattr,
        kato: 0,
    }
    .encode(cid);
    sqe.set_sgl(icd_sgl(CONNECT_DATA_LEN as u32));
    let data = ConnectData {
        hostid: HOSTID,
        cntlid,
        subnqn: subnqn.into(),
        hostnqn: hostnqn.into(),
    }
    .encode();
    (sqe, data)
}

fn icd_sgl(len: u32) -> SglDescriptor {
    SglDescriptor {
        address: 0,
        length: len,
        type_byte: SglDescriptor::IN_CAPSULE,
    }
}

fn host_sgl(len: u32) -> SglDescriptor {
    SglDescriptor {
        address: 0,
        length: len,
        type_byte: SglDescriptor::TRANSPORT,
    }
}

fn prop_get(cid: u16, offset: u32) -> Sqe {
    PropertyCommand {
        eight_bytes: offset == prop::CAP,
        offset,
        value: 0,
    }
    .encode(fctype::PROPERTY_GET, cid)
}

fn prop_set(cid: u16, offset: u32, value: u64) -> Sqe {
    PropertyCommand {
        eight_bytes: false,
        offset,
        value,
    }
    .encode(fctype::PROPERTY_SET, cid)
}

fn fabrics(cid: u16, fct: u8) -> Sqe {
    let mut s = Sqe::new(admin_opc::FABRICS, cid, 0);
    s.0[4] = fct;
    s
}

/// A read or write of `nlb` blocks with the data after R2T (TCP SGL).
fn rw(opc: u8, cid: u16, nsid: u32, slba: u64, nlb: u32) -> Sqe {
    let mut s = Sqe::new(opc, cid, nsid);
    s.set_cdw(10, slba as u32);
    s.set_cdw(11, (slba >> 32) as u32);
    s.set_cdw(12, nlb - 1);
    s.set_sgl(host_sgl(nlb * BS));
    s
}

/// An admin command that returns `len` bytes of data.
fn admin_c2h(opc: u8, cid: u16, nsid: u32, cdw10: u32, len: u32) -> Sqe {
    let mut s = Sqe::new(opc, cid, nsid);
    s.set_cdw(10, cdw10);
    s.set_sgl(host_sgl(len));
    s
}

fn identify(cid: u16, cns_v: u8, nsid: u32) -> Sqe {
    admin_c2h(admin_opc::IDENTIFY, cid, nsid, cns_v as u32, 4096)
}

fn get_log(cid: u16, lid_v: u8, len: usize, offset: u64) -> Sqe {
    let mut s = GetLogPage {
        lid: lid_v,
        lsp: 0,
        rae: false,
        len,
        offset,
        csi: 0,
    }
    .encode(cid, 0xFFFF_FFFF);
    s.set_sgl(host_sgl(len as u32));
    s
}

fn set_features(cid: u16, f: u8, cdw11: u32) -> Sqe {
    let mut s = Sqe::new(admin_opc::SET_FEATURES, cid, 0);
    s.set_cdw(10, f as u32);
    s.set_cdw(11, cdw11);
    s
}

fn get_features(cid: u16, f: u8, sel: u32) -> Sqe {
    let mut s = Sqe::new(admin_opc::GET_FEATURES, cid, 0);
    s.set_cdw(10, f as u32 | sel << 8);
    s
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// The SUCCESS response's DW0.
fn ok(r: Sent) -> u64 {
    assert_status(&r, Status::SUCCESS);
    r.cqe.result
}

/// The SUCCESS response's data.
fn ok_data(r: Sent) -> Vec<u8> {
    assert_status(&r, Status::SUCCESS);
    r.data
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().unwrap())
}

/// The status a test expects, with its name in failure messages.
fn assert_status(s: &Sent, want: Status) {
    assert_eq!(s.status(), want, "{s:?}: got {} want {want}", s.status());
}

// ---------------------------------------------------------------------------
// I/O commands.

fn icd_write(cid: u16, nsid: u32, slba: u64, len: usize) -> Sqe {
    let mut w = rw(io_opc::WRITE, cid, nsid, slba, (len / BS as usize) as u32);
    w.set_sgl(icd_sgl(len as u32));
    w
}

fn zeros(d: &[u8]) -> bool {
    d.iter().all(|&b| b == 0)
}

// ---------------------------------------------------------------------------
// I/O command sets: CC.CSS = 110b, Identify CNS 1Ch/05h-08h, the I/O Command
// Set Profile feature, and namespaces of the Key Value command set.

/// CC with EN, the standard entry sizes and CC.CSS = 110b, as Linux writes
/// it when CAP.CSS bit 6 is set.
const CC_ENABLE_ALL_IOCS: u64 = CC_ENABLE | 0b110 << 4;

impl Env {
    /// A namespace that speaks the KV command set. The KV store behind it is
    /// the next layer; what is tested here is how the controller presents it.
    fn add_kv_ns(&self, nsid: u32) -> Arc<Namespace> {
        let mut ns = Namespace::new(SUBNQN, nsid, RamDevice::new("kv", NS_BYTES).unwrap(), BS);
        ns.command_set = crate::CommandSet::KeyValue;
        let ns = Arc::new(ns);
        self.subsys.add_namespace(ns.clone()).unwrap();
        ns
    }
    /// An admin queue of a controller enabled with this CC value.
    fn admin_cc(&self, cc: u64) -> (Conn, u16) {
        let mut a = self.conn(tcp_cfg());
        let r = a.connect(0, 31, 0, 0xFFFF, SUBNQN);
        assert_eq!(r.status(), Status::SUCCESS);
        let cntlid = r.cqe.result as u16;
        assert_eq!(ok(a.exec(prop_set(1, prop::CC, cc))), 0);
        (a, cntlid)
    }
}

fn identify_csi(cid: u16, cns_v: u8, nsid: u32, csi_v: u8) -> Sqe {
    let mut s = identify(cid, cns_v, nsid);
    s.set_cdw(11, (csi_v as u32) << 24);
    s
}

fn get_log_csi(cid: u16, lid_v: u8, len: usize, csi_v: u8) -> Sqe {
    let mut s = GetLogPage {
        lid: lid_v,
        lsp: 0,
        rae: false,
        len,
        offset: 0,
        csi: csi_v,
    }
    .encode(cid, 0);
    s.set_sgl(host_sgl(len as u32));
    s
}

fn aer(cid: u16) -> Sqe {
    Sqe::new(admin_opc::ASYNC_EVENT_REQUEST, cid, 0)
}
