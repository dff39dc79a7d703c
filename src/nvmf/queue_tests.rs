//! Unit tests of the command core, driven through a fake transport: no socket,
//! no reactor. Device I/O runs on RAM namespaces (or a failing fake device)
//! whose channels this file polls itself, routing completions to
//! `Queue::io_complete` as the reactor does.

use super::*;
use crate::bdev::ram::RamDevice;
use crate::bdev::{BlockDevice, IoChannel, IoCompletion, IoOp};
use crate::mem::BufPool;
use crate::nvmf::connect::QID_RELEASE_WAIT;
use crate::nvmf::controller::{cap_register, AEC_NS_ATTR, AEN_NS_ATTR_CHANGED, MAX_AERS};
use crate::nvmf::{Controller, Listener, Namespace, Subsystem, SubsystemKind, TransportLimits};
use crate::reactor::{ChannelCache, Locals};
use crate::wire::nvme::CATTR_DISABLE_SQ_FLOW;
use crate::wire::nvme::{
    self, cns, csts, fid, io_opc, lid, nidt, prop, ConnectCommand, ConnectData, DsmRange,
    ErrorLogEntry, GetLogPage, IdentifyController, IdentifyNamespace, PropertyCommand,
    SglDescriptor, SmartLog, CONNECT_DATA_LEN, DSM_ATTR_DEALLOCATE,
};
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
    fn add_ns(&self, nsid: u32, dev: crate::bdev::SharedDevice) -> Arc<Namespace> {
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
// Fabrics Connect.

#[test]
fn connect_admin_queue_creates_a_controller() {
    let e = env();
    let mut a = e.conn(tcp_cfg());
    assert!(a.q.binding().is_none());
    let r = a.connect(0, 31, 0, 0xFFFF, SUBNQN);
    assert_status(&r, Status::SUCCESS);
    let cntlid = r.cqe.result as u16;
    assert_eq!(r.cqe.result >> 16, 0, "DW0 is the CNTLID alone");
    assert_eq!((r.cqe.cid, r.cqe.sq_id, r.close_after), (9, 0, false));
    assert!(r.data.is_empty());
    let ctrl = e.ctrl(cntlid);
    assert!(matches!(a.q.binding(), Some(QueueBinding::Admin(c)) if Arc::ptr_eq(c, &ctrl)));
    assert!(a.q.is_admin());
    assert_eq!((ctrl.hostnqn.as_str(), ctrl.hostid), (HOSTNQN, HOSTID));
    assert_eq!(a.stats().qid, 0);
    // Over TCP the controller does not advertise keyed SGLs.
    assert!(!ctrl.keyed_sgl.load(Ordering::Acquire));
}

#[test]
fn connect_refuses_an_unknown_subsystem() {
    let e = env();
    let mut a = e.conn(tcp_cfg());
    let r = a.connect(0, 31, 0, 0xFFFF, "nqn.2024-01.io.kvtarget:nobody");
    assert_status(&r, Status::CONNECT_INVALID_PARAMETERS);
    // IATTR 1 (Connect data), IPO 256 (SUBNQN).
    assert_eq!(r.cqe.result, 1 << 16 | 256);
    assert!(a.q.binding().is_none());
    assert_eq!(e.target.refused_other.load(Ordering::Relaxed), 1);
    assert_status(
        &a.exec(Sqe::new(admin_opc::KEEP_ALIVE, 2, 0)),
        Status::COMMAND_SEQUENCE_ERROR,
    );
}

#[test]
fn connect_refuses_a_host_not_on_the_list() {
    let e = env();
    let mut a = e.conn(tcp_cfg());
    let (sqe, data) = connect_cmd(
        4,
        0,
        31,
        0,
        0xFFFF,
        SUBNQN,
        "nqn.2024-01.io.kvtarget:intruder",
    );
    let r = a.exec_icd(sqe, &data);
    assert_status(&r, Status::CONNECT_INVALID_HOST);
    assert_eq!((r.cqe.result, r.cqe.cid), (0, 4));
    assert!(a.q.binding().is_none());
    assert_eq!(e.target.refused_host.load(Ordering::Relaxed), 1);
    assert!(e.subsys.controllers.lock().unwrap().is_empty());
}

#[test]
fn connect_to_an_nvm_subsystem_on_a_discovery_listener_is_refused() {
    let e = env();
    let cfg = QueueConfig {
        discovery_only: true,
        ..tcp_cfg()
    };
    let mut a = e.conn(cfg.clone());
    let r = a.connect(0, 31, 0, 0xFFFF, SUBNQN);
    assert_status(&r, Status::CONNECT_INVALID_PARAMETERS);
    assert_eq!(r.cqe.result, 1 << 16 | 256, "points at SUBNQN in the data");
    assert!(a.q.binding().is_none());
    assert!(e.subsys.controllers.lock().unwrap().is_empty());
    // The discovery subsystem itself is what that listener is for.
    let mut d = e.conn(cfg);
    assert_status(
        &d.connect(0, 31, 0, 0xFFFF, nvme::DISCOVERY_NQN),
        Status::SUCCESS,
    );
}

#[test]
fn connect_naming_another_qid_than_the_transport_is_refused() {
    let e = env();
    let mut a = e.conn(rdma_cfg(0));
    // The RDMA CM request named QID 0; the capsule says 1.
    let r = a.connect(1, 31, 0, 0xFFFF, SUBNQN);
    assert_status(&r, Status::CONNECT_INVALID_PARAMETERS);
    assert_eq!(r.cqe.sq_id, 0, "answered as the queue the transport set up");
    assert!(a.q.binding().is_none());
    assert!(e.subsys.controllers.lock().unwrap().is_empty());
}

#[test]
fn connect_qid_refusal_points_at_the_sqe_qid_field() {
    let e = env();
    let mut a = e.conn(rdma_cfg(0));
    let r = a.connect(1, 31, 0, 0xFFFF, SUBNQN);
    assert_status(&r, Status::CONNECT_INVALID_PARAMETERS);
    // As fabrics::connect reports a bad QID: IATTR 0 (the SQE), IPO 42.
    assert_eq!(r.cqe.result, 42);
}

#[test]
fn connect_sq_size_above_the_transports_entries_is_refused() {
    let e = env();
    let cfg = QueueConfig {
        max_entries: Some(16),
        ..rdma_cfg(0)
    };
    // SQSIZE is 0-based: 16 asks for 17 entries.
    let mut a = e.conn(cfg.clone());
    let r = a.connect(0, 16, 0, 0xFFFF, SUBNQN);
    assert_status(&r, Status::CONNECT_INVALID_PARAMETERS);
    assert!(a.q.binding().is_none());
    let mut b = e.conn(cfg);
    assert_status(&b.connect(0, 15, 0, 0xFFFF, SUBNQN), Status::SUCCESS);
}

#[test]
fn connect_sq_size_refusal_points_at_the_sqe_sqsize_field() {
    let e = env();
    let cfg = QueueConfig {
        max_entries: Some(16),
        ..rdma_cfg(0)
    };
    let mut a = e.conn(cfg);
    let r = a.connect(0, 16, 0, 0xFFFF, SUBNQN);
    assert_status(&r, Status::CONNECT_INVALID_PARAMETERS);
    // As fabrics::connect reports a bad SQSIZE: IATTR 0 (the SQE), IPO 44.
    assert_eq!(r.cqe.result, 44);
}

#[test]
fn connect_io_queue_joins_the_controller_by_cntlid() {
    let e = env();
    let mut a = e.conn(tcp_cfg());
    let cntlid = a.connect(0, 31, 0, 0xFFFF, SUBNQN).cqe.result as u16;
    let ctrl = e.ctrl(cntlid);
    // Not enabled yet: no I/O queues.
    let mut early = e.conn(tcp_cfg());
    assert_status(
        &early.connect(1, 31, 0, cntlid, SUBNQN),
        Status::COMMAND_SEQUENCE_ERROR,
    );
    assert_status(&a.exec(prop_set(1, prop::CC, CC_ENABLE)), Status::SUCCESS);
    // A CNTLID no controller has: IATTR 1, IPO 16 (CNTLID in the data).
    let mut wrong = e.conn(tcp_cfg());
    let r = wrong.connect(1, 31, 0, cntlid.wrapping_add(100), SUBNQN);
    assert_status(&r, Status::CONNECT_INVALID_PARAMETERS);
    assert_eq!(r.cqe.result, 1 << 16 | 16);

    let mut io = e.conn(tcp_cfg());
    let r = io.connect(1, 31, 0, cntlid, SUBNQN);
    assert_status(&r, Status::SUCCESS);
    assert_eq!((r.cqe.result, r.cqe.sq_id), (cntlid as u64, 1));
    match io.q.binding() {
        Some(QueueBinding::Io {
            ctrl: c, qid: 1, ..
        }) => assert!(Arc::ptr_eq(c, &ctrl)),
        _ => panic!("not bound as I/O queue 1"),
    }
    assert!(!io.q.is_admin());
    assert_eq!(ctrl.queue_ids(), vec![0, 1]);
    // The same QID twice: it waits for the holder to let go, and when that
    // does not happen in time, IATTR 0, IPO 42 (QID in the SQE).
    let refused = e.target.refused_other.load(Ordering::Relaxed);
    let mut dup = e.conn(tcp_cfg());
    let (sqe, data) = connect_cmd(9, 1, 31, 0, cntlid, SUBNQN, HOSTNQN);
    assert_eq!(
        dup.receive_raw(sqe, tcp_desc(&sqe), &data, false),
        Received::Done
    );
    assert!(dup.take().is_empty(), "waits while the ID is held");
    dup.advance(QID_RELEASE_WAIT / 2);
    assert_eq!(dup.housekeeping(), None);
    assert!(dup.take().is_empty(), "still inside the wait");
    assert_eq!(e.target.refused_other.load(Ordering::Relaxed), refused);
    // A second Connect on the same connection meanwhile is out of sequence.
    let (again, data) = connect_cmd(10, 1, 31, 0, cntlid, SUBNQN, HOSTNQN);
    assert_status(&dup.exec_icd(again, &data), Status::COMMAND_SEQUENCE_ERROR);
    dup.advance(QID_RELEASE_WAIT);
    assert_eq!(dup.housekeeping(), None);
    let r = dup.one();
    assert_status(&r, Status::CONNECT_INVALID_PARAMETERS);
    assert_eq!((r.cqe.result, r.cqe.cid), (42, 9));
    assert_eq!(e.target.refused_other.load(Ordering::Relaxed), refused + 1);
    assert!(dup.q.binding().is_none());
    // Closing the I/O queue gives its QID back.
    io.q.unbind();
    assert_eq!(ctrl.queue_ids(), vec![0]);
}

/// A host that closes a queue's connection and connects the same QID at once
/// (SPDK's initiator reconnecting a queue pair) can get there before the old
/// connection's close is seen: the Connect waits for it instead of failing.
#[test]
fn connect_waits_for_a_closing_queue_to_let_its_qid_go() {
    let e = env();
    let (_a, mut old) = e.pair();
    let cntlid = old.q.binding().unwrap().ctrl().cntlid;
    let mut new = e.conn(tcp_cfg());
    let (sqe, data) = connect_cmd(9, 1, 31, 0, cntlid, SUBNQN, HOSTNQN);
    assert_eq!(
        new.receive_raw(sqe, tcp_desc(&sqe), &data, false),
        Received::Done
    );
    assert!(new.take().is_empty());
    // The old connection's close reaches its reactor.
    old.q.unbind();
    new.advance(QID_RELEASE_WAIT / 4);
    assert_eq!(new.housekeeping(), None);
    let r = new.one();
    assert_status(&r, Status::SUCCESS);
    assert_eq!((r.cqe.result, r.cqe.sq_id), (cntlid as u64, 1));
    assert_eq!(new.q.binding().map(|b| b.qid()), Some(1));
    // The new queue serves I/O.
    assert!(zeros(&ok_data(new.read(1, 1, 0, 8))));
}

#[test]
fn connect_on_a_bound_queue_is_a_sequence_error() {
    let e = env();
    let (mut a, cntlid) = e.admin();
    let r = a.connect(0, 31, 0, 0xFFFF, SUBNQN);
    assert_status(&r, Status::COMMAND_SEQUENCE_ERROR);
    assert_eq!(e.subsys.controllers.lock().unwrap().len(), 1);
    assert_eq!(a.q.binding().unwrap().ctrl().cntlid, cntlid);
}

#[test]
fn connect_data_may_follow_r2t_but_must_come() {
    let e = env();
    // After R2T (the host did not put it in the capsule).
    let mut a = e.conn(tcp_cfg());
    let (mut sqe, data) = connect_cmd(3, 0, 31, 0, 0xFFFF, SUBNQN, HOSTNQN);
    sqe.set_sgl(host_sgl(CONNECT_DATA_LEN as u32));
    assert_status(&a.exec_h2c(sqe, &data), Status::SUCCESS);
    assert!(a.q.binding().is_some());
    // Without any data.
    let mut b = e.conn(tcp_cfg());
    let (mut sqe, _) = connect_cmd(3, 0, 31, 0, 0xFFFF, SUBNQN, HOSTNQN);
    sqe.set_sgl(SglDescriptor::default());
    assert_status(&b.exec(sqe), Status::DATA_SGL_LENGTH_INVALID);
    assert!(b.q.binding().is_none());
}

#[test]
fn connect_over_rdma_makes_identify_report_keyed_sgls() {
    let e = env();
    let (mut a, cntlid) = e.admin_with(rdma_cfg(0));
    assert!(e.ctrl(cntlid).keyed_sgl.load(Ordering::Acquire));
    let r = a.exec(identify(2, cns::CONTROLLER, 0));
    assert_status(&r, Status::SUCCESS);
    let id = IdentifyController::decode(&r.data);
    assert_eq!(id.sgls & 1 << 2, 1 << 2);
}

// ---------------------------------------------------------------------------
// Command sequence, fused commands, properties.

#[test]
fn commands_before_connect_are_sequence_errors() {
    let e = env();
    let mut a = e.conn(tcp_cfg());
    for sqe in [
        identify(1, cns::CONTROLLER, 0),
        Sqe::new(admin_opc::KEEP_ALIVE, 2, 0),
        prop_get(3, prop::CSTS),
        fabrics(4, fctype::DISCONNECT),
        // Refused before its data moves: `exec` checks `Received::Done`.
        rw(io_opc::WRITE, 5, 1, 0, 8),
    ] {
        let r = a.exec(sqe);
        assert_status(&r, Status::COMMAND_SEQUENCE_ERROR);
        assert_eq!((r.cqe.cid, r.data.len()), (sqe.cid(), 0));
    }
    assert!(a.q.binding().is_none());
    assert_eq!(a.q.dev_ops(), 0);
}

#[test]
fn fused_commands_are_refused() {
    let e = env();
    // Even a Connect: the queue stays unbound.
    let mut c = e.conn(tcp_cfg());
    let (mut sqe, data) = connect_cmd(1, 0, 31, 0, 0xFFFF, SUBNQN, HOSTNQN);
    sqe.0[1] |= 0x1;
    assert_status(&c.exec_icd(sqe, &data), Status::INVALID_FIELD);
    assert!(c.q.binding().is_none());

    let (mut a, mut io) = e.pair();
    let mut ka = Sqe::new(admin_opc::KEEP_ALIVE, 2, 0);
    ka.0[1] |= 0x1;
    assert_status(&a.exec(ka), Status::INVALID_FIELD);
    // A fused write is refused before any data moves.
    let mut w = rw(io_opc::WRITE, 3, 1, 0, 8);
    w.0[1] |= 0x2;
    assert_status(&io.exec(w), Status::INVALID_FIELD);
}

#[test]
fn property_get_reads_cap_vs_cc_and_csts() {
    let e = env();
    let mut a = e.conn(tcp_cfg());
    assert_status(&a.connect(0, 31, 0, 0xFFFF, SUBNQN), Status::SUCCESS);
    // MQES 127, CQR, TO 15 s, CSS NVM and I/O command sets (bits 37 and
    // 43): all 64 bits in the CQE result.
    let cap = ok(a.exec(prop_get(1, prop::CAP)));
    assert_eq!(cap, 0x820_1E01_007F);
    assert_eq!(cap, cap_register(128));
    assert_eq!(ok(a.exec(prop_get(2, prop::VS))), 0x0001_0400);
    assert_eq!(ok(a.exec(prop_get(3, prop::CC))), 0);
    assert_eq!(ok(a.exec(prop_get(4, prop::CSTS))), 0);
    assert_status(&a.exec(prop_get(5, 0x30)), Status::INVALID_FIELD);
}

#[test]
fn property_set_of_cc_enables_and_shuts_down_the_controller() {
    let e = env();
    let mut a = e.conn(tcp_cfg());
    let cntlid = a.connect(0, 31, 0, 0xFFFF, SUBNQN).cqe.result as u16;
    let ctrl = e.ctrl(cntlid);
    assert!(!ctrl.is_ready());
    assert_eq!(ok(a.exec(prop_set(1, prop::CC, CC_ENABLE))), 0);
    assert!(ctrl.is_ready());
    assert_eq!(ok(a.exec(prop_get(2, prop::CC))), CC_ENABLE);
    assert_eq!(ok(a.exec(prop_get(3, prop::CSTS))), csts::RDY as u64);
    // Normal shutdown notification: done at once.
    ok(a.exec(prop_set(4, prop::CC, CC_ENABLE | 1 << 14)));
    assert_eq!(
        ok(a.exec(prop_get(5, prop::CSTS))),
        (csts::RDY | csts::SHST_COMPLETE) as u64
    );
    // Only CC is writable.
    assert_status(&a.exec(prop_set(6, prop::CSTS, 1)), Status::INVALID_FIELD);
    // Clearing EN resets: admin commands wait for CC.EN again.
    ok(a.exec(prop_set(7, prop::CC, 0)));
    assert_eq!(ok(a.exec(prop_get(8, prop::CSTS))), 0);
    assert_status(
        &a.exec(identify(9, cns::CONTROLLER, 0)),
        Status::COMMAND_SEQUENCE_ERROR,
    );
}

#[test]
fn admin_commands_before_cc_en_are_sequence_errors_except_keep_alive() {
    let e = env();
    let mut a = e.conn(tcp_cfg());
    assert_status(&a.connect(0, 31, 0, 0xFFFF, SUBNQN), Status::SUCCESS);
    for sqe in [
        identify(1, cns::CONTROLLER, 0),
        get_features(2, fid::KEEP_ALIVE_TIMER, 0),
        get_log(3, lid::SMART_HEALTH, 512, 0),
        // Answered, not held.
        Sqe::new(admin_opc::ASYNC_EVENT_REQUEST, 4, 0),
    ] {
        assert_status(&a.exec(sqe), Status::COMMAND_SEQUENCE_ERROR);
    }
    assert!(a.q.aers.is_empty());
    assert_status(
        &a.exec(Sqe::new(admin_opc::KEEP_ALIVE, 5, 0)),
        Status::SUCCESS,
    );
    ok(a.exec(prop_set(6, prop::CC, CC_ENABLE)));
    assert_eq!(ok_data(a.exec(identify(7, cns::CONTROLLER, 0))).len(), 4096);
}

#[test]
fn properties_are_invalid_opcodes_on_io_queues() {
    let e = env();
    let (_a, mut io) = e.pair();
    assert_status(&io.exec(prop_get(1, prop::CSTS)), Status::INVALID_OPCODE);
    assert_status(
        &io.exec(prop_set(2, prop::CC, CC_ENABLE)),
        Status::INVALID_OPCODE,
    );
}

// ---------------------------------------------------------------------------
// Admin commands.

#[test]
fn identify_controller_describes_the_controller() {
    let e = env();
    let (mut a, cntlid) = e.admin();
    let id = IdentifyController::decode(&ok_data(a.exec(identify(1, cns::CONTROLLER, 0))));
    assert_eq!(id.cntlid, cntlid);
    assert_eq!(
        (id.subnqn.as_str(), id.serial.as_str(), id.model.as_str()),
        (SUBNQN, "SERIAL1", "MODEL1")
    );
    assert_eq!((id.cntrltype, id.mdts, id.maxcmd, id.nn), (1, 8, 128, 1024));
    assert_eq!(id.ioccsz, (64 + 8192) / 16);
    assert_eq!(id.sgls & 1 << 2, 0, "no keyed SGLs over TCP");
    assert_eq!(id.oaes, AEC_NS_ATTR);
}

#[test]
fn identify_namespace_active_inactive_and_invalid() {
    let e = env();
    let (mut a, _) = e.admin();
    let ns = IdentifyNamespace::decode(&ok_data(a.exec(identify(1, cns::NAMESPACE, 1))));
    assert_eq!((ns.nsze, ns.ncap, ns.lbads), (NS_BLOCKS, NS_BLOCKS, 9));
    assert_eq!(ns.nguid, e.subsys.namespace(1).unwrap().nguid);
    // An inactive NSID in range: a zeroed structure.
    let inactive = ok_data(a.exec(identify(2, cns::NAMESPACE, 5)));
    assert_eq!(inactive.len(), 4096);
    assert!(inactive.iter().all(|&b| b == 0));
    for (cid, nsid) in [(3, 0), (4, 0xFFFF_FFFF), (5, 1025)] {
        assert_status(
            &a.exec(identify(cid, cns::NAMESPACE, nsid)),
            Status::INVALID_NAMESPACE,
        );
    }
}

#[test]
fn identify_lists_descriptors_and_csi_structures() {
    let e = env();
    let ns3 = e.add_ram_ns(3);
    let (mut a, _) = e.admin();
    let list = |a: &mut Conn, cid, cns_v, nsid, csi: u32| {
        let mut s = identify(cid, cns_v, nsid);
        s.set_cdw(11, csi << 24);
        a.exec(s)
    };
    let ids = |r: Sent| nvme::decode_ns_list(&ok_data(r));
    assert_eq!(ids(list(&mut a, 1, cns::ACTIVE_NS_LIST, 0, 0)), vec![1, 3]);
    assert_eq!(ids(list(&mut a, 2, cns::ACTIVE_NS_LIST, 1, 0)), vec![3]);
    assert_eq!(
        ids(list(&mut a, 3, cns::CSI_ACTIVE_NS_LIST, 0, 0)),
        vec![1, 3]
    );
    assert_status(
        &list(&mut a, 4, cns::CSI_ACTIVE_NS_LIST, 0, 2),
        Status::INVALID_FIELD,
    );
    assert_status(
        &list(&mut a, 5, cns::ACTIVE_NS_LIST, 0xFFFF_FFFE, 0),
        Status::INVALID_NAMESPACE,
    );

    let d = nvme::decode_ns_descriptors(&ok_data(a.exec(identify(6, cns::NS_DESCRIPTOR_LIST, 3))));
    assert_eq!(
        d,
        vec![
            (nidt::EUI64, ns3.eui64.to_vec()),
            (nidt::NGUID, ns3.nguid.to_vec()),
            (nidt::UUID, ns3.uuid.to_vec()),
            (nidt::CSI, vec![0]),
        ]
    );
    assert_status(
        &a.exec(identify(7, cns::NS_DESCRIPTOR_LIST, 9)),
        Status::INVALID_NAMESPACE,
    );

    let zeros = |r: Sent| {
        let d = ok_data(r);
        d.len() == 4096 && d.iter().all(|&b| b == 0)
    };
    assert!(zeros(list(&mut a, 8, cns::CSI_NAMESPACE, 1, 0)));
    assert!(zeros(list(&mut a, 9, cns::CSI_CONTROLLER, 0, 0)));
    assert_status(
        &list(&mut a, 10, cns::CSI_NAMESPACE, 9, 0),
        Status::INVALID_NAMESPACE,
    );
    assert_status(&list(&mut a, 11, 0x42, 0, 0), Status::INVALID_FIELD);
}

#[test]
fn admin_data_is_cut_to_the_sgl_length() {
    let e = env();
    let (mut a, _) = e.admin();
    let full = ok_data(a.exec(identify(1, cns::CONTROLLER, 0)));
    assert_eq!(full.len(), 4096);
    let short = ok_data(a.exec(admin_c2h(
        admin_opc::IDENTIFY,
        2,
        0,
        cns::CONTROLLER as u32,
        100,
    )));
    assert_eq!(short, full[..100]);
    // NUMD asks for 512 bytes, the SGL has room for 64.
    let mut smart = get_log(3, lid::SMART_HEALTH, 512, 0);
    smart.set_sgl(host_sgl(64));
    assert_eq!(ok_data(a.exec(smart)).len(), 64);
    // No data descriptor at all: answered, nothing sent with it.
    let mut bare = identify(4, cns::CONTROLLER, 0);
    bare.set_sgl(SglDescriptor::default());
    assert_eq!(ok_data(a.exec(bare)).len(), 0);
}

#[test]
fn get_log_page_serves_smart_firmware_and_commands_supported() {
    let e = env();
    let (mut a, mut io) = e.pair();
    ok(io.write(1, 1, 0, &pattern(4096, 1)));
    ok(io.read(2, 1, 0, 8));
    ok(io.read(3, 1, 8, 8));

    let smart = SmartLog::decode(&ok_data(a.exec(get_log(1, lid::SMART_HEALTH, 512, 0))));
    assert_eq!((smart.host_reads, smart.host_writes), (2, 1));
    // Thousands of 512-byte units, rounded up: 16 and 8 units.
    assert_eq!((smart.data_units_read, smart.data_units_written), (1, 1));
    assert_eq!(
        (
            smart.available_spare,
            smart.power_cycles,
            smart.error_log_entries
        ),
        (100, 1, 0)
    );

    let fw = ok_data(a.exec(get_log(2, lid::FIRMWARE_SLOT, 512, 0)));
    assert_eq!((fw.len(), fw[0]), (512, 1));
    let name = e.target.firmware.as_bytes();
    let n = name.len().min(8);
    assert_eq!(&fw[8..8 + n], &name[..n]);
    assert!(fw[8 + n..16].iter().all(|&b| b == b' '));

    let cs = ok_data(a.exec(get_log(3, lid::COMMANDS_SUPPORTED, 4096, 0)));
    assert_eq!(u32_at(&cs, admin_opc::IDENTIFY as usize * 4), 1);
    assert_eq!(u32_at(&cs, 0x7E * 4), 0);
    assert_eq!(u32_at(&cs, 1024 + io_opc::READ as usize * 4), 1);
    // Write changes logical block content (LBCC).
    assert_eq!(u32_at(&cs, 1024 + io_opc::WRITE as usize * 4), 0b11);

    // An offset into the page, in dwords.
    let tail = ok_data(a.exec(get_log(4, lid::COMMANDS_SUPPORTED, 8, 1024 + 4)));
    assert_eq!(tail, cs[1028..1036]);
    assert_status(
        &a.exec(get_log(5, lid::SMART_HEALTH, 8, 2)),
        Status::INVALID_FIELD,
    );
    assert_status(&a.exec(get_log(6, 0x7F, 512, 0)), Status::INVALID_LOG_PAGE);
    // The discovery log is a discovery controller's.
    assert_status(
        &a.exec(get_log(7, lid::DISCOVERY, 4096, 0)),
        Status::INVALID_LOG_PAGE,
    );
}

#[test]
fn error_log_records_failed_io_newest_first() {
    let e = env();
    e.add_ns(2, Arc::new(FailingDevice));
    let (mut a, mut io) = e.pair();
    assert_status(
        &io.read(0x21, 1, NS_BLOCKS - 1, 2),
        Status::LBA_OUT_OF_RANGE,
    );
    assert_status(
        &io.write(0x22, 2, 16, &pattern(4096, 2)),
        Status::WRITE_FAULT,
    );
    let r = io.read(0x23, 2, 32, 8);
    assert_status(&r, Status::UNRECOVERED_READ_ERROR);
    assert!(r.data.is_empty(), "no data with a failed read");

    let log = ok_data(a.exec(get_log(1, lid::ERROR_INFO, 4 * 64, 0)));
    let entry = |i: usize| ErrorLogEntry::decode(&log[i * 64..(i + 1) * 64]);
    let (e0, e1, e2) = (entry(0), entry(1), entry(2));
    assert_eq!(
        (e0.error_count, e0.sqid, e0.cid, e0.nsid, e0.lba),
        (3, 1, 0x23, 2, 32)
    );
    assert_eq!(e0.status, Status::UNRECOVERED_READ_ERROR.to_field());
    assert_eq!(e0.trtype, nvme::trtype::TCP);
    assert_eq!((e1.error_count, e1.cid, e1.nsid, e1.lba), (2, 0x22, 2, 16));
    assert_eq!(e1.status, Status::WRITE_FAULT.to_field());
    assert_eq!((e2.error_count, e2.cid, e2.nsid), (1, 0x21, 1));
    assert_eq!(e2.status, Status::LBA_OUT_OF_RANGE.to_field());
    assert_eq!(entry(3), ErrorLogEntry::default(), "only three errors");

    let smart = SmartLog::decode(&ok_data(a.exec(get_log(2, lid::SMART_HEALTH, 512, 0))));
    assert_eq!((smart.error_log_entries, smart.media_errors), (3, 2));
}

#[test]
fn discovery_controller_serves_the_discovery_log() {
    let e = env();
    let mut d = e.conn(tcp_cfg());
    assert_status(
        &d.connect(0, 31, 0, 0xFFFF, nvme::DISCOVERY_NQN),
        Status::SUCCESS,
    );
    ok(d.exec(prop_set(1, prop::CC, CC_ENABLE)));
    let page = ok_data(d.exec(get_log(2, lid::DISCOVERY, 4096, 0)));
    let (genctr, entries) = nvme::decode_discovery_log(&page);
    // One bump at creation, one for the subsystem.
    assert_eq!(genctr, 2);
    let names: Vec<(&str, u8)> = entries
        .iter()
        .map(|x| (x.subnqn.as_str(), x.subtype))
        .collect();
    assert_eq!(
        names,
        vec![
            (nvme::DISCOVERY_NQN, nvme::subtype::CURRENT_DISCOVERY),
            (SUBNQN, nvme::subtype::NVME)
        ]
    );
    let id = IdentifyController::decode(&ok_data(d.exec(identify(3, cns::CONTROLLER, 0))));
    assert_eq!(id.cntrltype, 2);
    assert_status(
        &d.exec(identify(4, cns::NAMESPACE, 1)),
        Status::INVALID_FIELD,
    );
    assert_status(
        &d.exec(get_log(5, lid::SMART_HEALTH, 512, 0)),
        Status::INVALID_LOG_PAGE,
    );
    assert_status(
        &d.exec(Sqe::new(admin_opc::ABORT, 6, 0)),
        Status::INVALID_OPCODE,
    );
}

#[test]
fn get_and_set_features() {
    let e = env();
    let (mut a, cntlid) = e.admin();
    // 3 SQs and 5 CQs asked: min(3, 5) + 1 = 4 granted (0-based in DW0).
    assert_eq!(
        ok(a.exec(set_features(1, fid::NUMBER_OF_QUEUES, 2 | 4 << 16))),
        2 | 2 << 16
    );
    assert_eq!(
        ok(a.exec(get_features(2, fid::NUMBER_OF_QUEUES, 0))),
        2 | 2 << 16
    );
    assert_eq!(ok(a.exec(set_features(3, fid::KEEP_ALIVE_TIMER, 5000))), 0);
    assert_eq!(ok(a.exec(get_features(4, fid::KEEP_ALIVE_TIMER, 0))), 5000);
    assert_eq!(e.ctrl(cntlid).kato_ms.load(Ordering::Relaxed), 5000);
    ok(a.exec(set_features(5, fid::VOLATILE_WRITE_CACHE, 0)));
    assert_eq!(ok(a.exec(get_features(6, fid::VOLATILE_WRITE_CACHE, 0))), 0);
    // SEL 1: the default (enabled); SEL 3: capabilities, changeable.
    assert_eq!(ok(a.exec(get_features(7, fid::VOLATILE_WRITE_CACHE, 1))), 1);
    assert_eq!(
        ok(a.exec(get_features(8, fid::VOLATILE_WRITE_CACHE, 3))),
        1 << 2
    );
    ok(a.exec(set_features(9, fid::ASYNC_EVENT_CONFIG, AEC_NS_ATTR)));
    assert_eq!(
        ok(a.exec(get_features(10, fid::ASYNC_EVENT_CONFIG, 0))),
        AEC_NS_ATTR as u64
    );
    assert_eq!(
        ok(a.exec(get_features(11, fid::TEMPERATURE_THRESHOLD, 0))),
        0xFFFF
    );
    assert_status(
        &a.exec(set_features(12, fid::KEEP_ALIVE_TIMER | 0x80, 0)),
        Status::INVALID_FIELD,
    );
    let mut save = set_features(13, fid::KEEP_ALIVE_TIMER, 1000);
    save.set_cdw(10, save.cdw(10) | 1 << 31);
    assert_status(&a.exec(save), Status::FEATURE_NOT_SAVEABLE);
    assert_status(
        &a.exec(set_features(14, fid::ARBITRATION, 0)),
        Status::FEATURE_NOT_CHANGEABLE,
    );
    assert_status(&a.exec(get_features(15, 0x7E, 0)), Status::INVALID_FIELD);
    assert_status(
        &a.exec(get_features(16, fid::ARBITRATION, 4)),
        Status::INVALID_FIELD,
    );
    // The queue count is fixed once an I/O queue exists.
    let _io = e.io_with(tcp_cfg(), cntlid, 1);
    assert_status(
        &a.exec(set_features(17, fid::NUMBER_OF_QUEUES, 7 | 7 << 16)),
        Status::COMMAND_SEQUENCE_ERROR,
    );
}

#[test]
fn keep_alive_and_abort_are_answered_at_once() {
    let e = env();
    let (mut a, _) = e.admin();
    let r = a.exec(Sqe::new(admin_opc::KEEP_ALIVE, 1, 0));
    assert_eq!(
        (r.status(), r.cqe.result, r.data.len()),
        (Status::SUCCESS, 0, 0)
    );
    let mut abort = Sqe::new(admin_opc::ABORT, 2, 0);
    abort.set_cdw(10, 1 | 0x55 << 16);
    // DW0 bit 0: the command was not aborted.
    assert_eq!(ok(a.exec(abort)), 1);
}

#[test]
fn unknown_and_bidirectional_admin_opcodes_are_refused() {
    let e = env();
    let (mut a, _) = e.admin();
    assert_status(&a.exec(Sqe::new(0xC0, 1, 0)), Status::INVALID_OPCODE);
    assert_status(&a.exec(Sqe::new(0x10, 2, 0)), Status::INVALID_OPCODE);
    // Opcode bits 1:0 = 11b: data both ways, which no fabric carries.
    assert_status(&a.exec(Sqe::new(0xC3, 3, 0)), Status::INVALID_FIELD);
    // Fabrics command types this target does not have.
    assert_status(&a.exec(fabrics(4, 0x0C)), Status::INVALID_OPCODE);
    // Authentication Receive that is not DH-HMAC-CHAP (SECP 0).
    assert_status(
        &a.exec(fabrics(5, fctype::AUTH_RECV)),
        Status::INVALID_FIELD,
    );
}

// ---------------------------------------------------------------------------
// Asynchronous events, command identifiers, queue overrun.

fn aer(cid: u16) -> Sqe {
    Sqe::new(admin_opc::ASYNC_EVENT_REQUEST, cid, 0)
}

fn changed_ns(a: &mut Conn, cid: u16) -> Vec<u32> {
    nvme::decode_ns_list(&ok_data(a.exec(get_log(
        cid,
        lid::CHANGED_NS_LIST,
        4096,
        0,
    ))))
}

#[test]
fn aer_is_held_until_a_namespace_change_completes_it() {
    let e = env();
    let (mut a, _) = e.admin();
    ok(a.exec(set_features(1, fid::ASYNC_EVENT_CONFIG, AEC_NS_ATTR)));
    assert_eq!(a.receive(aer(0x40)), Received::Done);
    assert!(a.take().is_empty(), "held, not answered");
    assert_eq!(a.q.requests_mut().count(), 0, "a held AER takes no slot");
    assert_eq!(a.housekeeping(), None);
    assert!(a.take().is_empty(), "no event yet");

    e.add_ram_ns(2);
    assert_eq!(a.housekeeping(), None);
    let r = a.one();
    assert_eq!(r.slot, None, "an AER completes unslotted");
    assert_status(&r, Status::SUCCESS);
    // Notice, Namespace Attribute Changed, log page 04h.
    assert_eq!(
        (r.cqe.cid, r.cqe.result, r.cqe.sq_id),
        (0x40, 0x0004_0002, 0)
    );
    assert_eq!(r.cqe.result, AEN_NS_ATTR_CHANGED as u64);
    assert_eq!(a.housekeeping(), None);
    assert!(a.take().is_empty(), "one event, one completion");

    // The host sends its next AER with the same CID; until it reads the log,
    // further changes are masked.
    assert_eq!(a.receive(aer(0x40)), Received::Done);
    assert!(a.take().is_empty(), "not a CID conflict");
    e.add_ram_ns(3);
    a.housekeeping();
    assert!(a.take().is_empty(), "masked until the log is read");
    assert_eq!(changed_ns(&mut a, 2), vec![2, 3]);
    assert_eq!(changed_ns(&mut a, 3), Vec::<u32>::new(), "read clears it");
    e.subsys.remove_namespace(2);
    a.housekeeping();
    let r = a.one();
    assert_eq!((r.slot, r.cqe.cid, r.cqe.result), (None, 0x40, 0x0004_0002));
    assert_eq!(changed_ns(&mut a, 4), vec![2]);
}

#[test]
fn aers_beyond_the_limit_are_refused() {
    let e = env();
    let (mut a, _) = e.admin();
    assert_eq!(MAX_AERS, 4);
    for cid in 1..=4 {
        assert_eq!(a.receive(aer(cid)), Received::Done);
    }
    assert!(a.take().is_empty());
    assert_status(&a.exec(aer(5)), Status::ASYNC_EVENT_LIMIT);
    assert_eq!(a.q.aers, vec![1, 2, 3, 4]);
}

#[test]
fn cid_conflict_is_answered_unslotted_without_disturbing_the_owner() {
    let e = env();
    let (_a, mut io) = e.pair();
    let data = pattern(4096, 3);
    let Received::NeedData { slot, .. } = io.receive(rw(io_opc::WRITE, 9, 1, 0, 8)) else {
        panic!("write did not ask for its data");
    };
    assert_eq!(io.receive(rw(io_opc::READ, 9, 1, 0, 8)), Received::Done);
    let r = io.one();
    assert_eq!(r.slot, None);
    assert_status(&r, Status::CID_CONFLICT);
    assert_eq!((r.cqe.cid, r.cqe.sq_id), (9, 1));
    let owner = io.q.request(slot).expect("the owner keeps its slot");
    assert_eq!(
        (owner.phase, owner.sqe.opcode()),
        (Phase::Moving, io_opc::WRITE)
    );
    assert_eq!(io.stats().errors.load(Ordering::Relaxed), 0);

    io.fill(slot, &data);
    io.data_ready(slot, false);
    io.drain();
    let r = io.one();
    assert_eq!((r.slot, r.cqe.cid), (Some(slot), 9));
    assert_status(&r, Status::SUCCESS);
    // Answered: the CID is free again.
    assert_eq!(ok_data(io.read(9, 1, 0, 8)), data);
}

#[test]
fn a_held_aers_cid_may_be_reused() {
    let e = env();
    let (mut a, _) = e.admin();
    assert_eq!(a.receive(aer(3)), Received::Done);
    // SPDK's host completes its AERs itself at shutdown and reuses the CID.
    let r = a.exec(prop_get(3, prop::CSTS));
    assert_status(&r, Status::SUCCESS);
    assert_eq!((r.cqe.cid, r.cqe.result), (3, csts::RDY as u64));
}

#[test]
fn reusing_a_held_aers_cid_abandons_that_aer() {
    let e = env();
    let (mut a, _) = e.admin();
    ok(a.exec(set_features(1, fid::ASYNC_EVENT_CONFIG, AEC_NS_ATTR)));
    assert_eq!(a.receive(aer(3)), Received::Done);
    assert_status(
        &a.exec(Sqe::new(admin_opc::KEEP_ALIVE, 3, 0)),
        Status::SUCCESS,
    );
    e.add_ram_ns(2);
    a.housekeeping();
    // The host already considers CID 3 done twice over: no third completion.
    assert_eq!(a.take(), vec![], "the abandoned AER completed");
}

#[test]
fn an_aer_reusing_a_held_aers_cid_replaces_it() {
    let e = env();
    let (mut a, _) = e.admin();
    assert_eq!(a.receive(aer(3)), Received::Done);
    assert_eq!(a.receive(aer(3)), Received::Done);
    assert!(a.take().is_empty());
    assert_eq!(a.q.aers, vec![3], "one AER per CID");
}

#[test]
fn more_commands_outstanding_than_queue_entries_is_an_overrun() {
    let e = env();
    let (_a, cntlid) = e.admin();
    let mut io = e.conn(tcp_cfg());
    // SQSIZE 3: four entries.
    assert_status(&io.connect(1, 3, 0, cntlid, SUBNQN), Status::SUCCESS);
    let mut slots = Vec::new();
    for cid in 1..=4 {
        match io.receive(rw(io_opc::WRITE, cid, 1, 0, 8)) {
            Received::NeedData { slot, .. } => slots.push(slot),
            other => panic!("cid {cid}: {other:?}"),
        }
    }
    slots.sort_unstable();
    assert_eq!(slots, vec![0, 1, 2, 3]);
    assert_eq!(io.receive(rw(io_opc::WRITE, 5, 1, 0, 8)), Received::Overrun);
    assert!(io.take().is_empty(), "an overrun is not answered");
    // The refused command did not keep its CID.
    io.fill(slots[0], &pattern(4096, 0));
    io.data_ready(slots[0], false);
    io.drain();
    ok(io.one());
    assert!(matches!(
        io.receive(rw(io_opc::WRITE, 5, 1, 0, 8)),
        Received::NeedData { .. }
    ));
    assert!(io.take().is_empty(), "no CID conflict");
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

#[test]
fn write_after_r2t_then_read_round_trips() {
    let e = env();
    let (_a, mut io) = e.pair();
    let data = pattern(4096, 7);
    let w = io.write(1, 1, 8, &data);
    assert_status(&w, Status::SUCCESS);
    assert_eq!((w.cqe.cid, w.cqe.sq_id, w.data.len()), (1, 1, 0));
    let r = io.read(2, 1, 8, 8);
    assert_eq!((r.cqe.cid, r.cqe.sq_id), (2, 1));
    assert_eq!(ok_data(r), data);
    // Only the blocks written changed.
    assert!(zeros(&ok_data(io.read(3, 1, 0, 8))));
    assert!(zeros(&ok_data(io.read(4, 1, 16, 8))));
    // Half of what was written, from its middle.
    assert_eq!(ok_data(io.read(5, 1, 10, 4)), data[1024..3072]);
}

#[test]
fn in_capsule_write_round_trips() {
    let e = env();
    let (_a, mut io) = e.pair();
    let data = pattern(4096, 9);
    assert_status(
        &io.exec_icd(icd_write(1, 1, 100, 4096), &data),
        Status::SUCCESS,
    );
    assert_eq!(ok_data(io.read(2, 1, 100, 8)), data);
}

#[test]
fn in_capsule_data_must_match_its_length_only_with_exact_capsules() {
    let e = env();
    let (_a, mut tcp) = e.pair();
    let data = pattern(1024, 4);
    // NVMe/TCP: the PDU carries exactly the data.
    assert_status(
        &tcp.exec_icd(icd_write(1, 1, 0, 512), &data),
        Status::DATA_SGL_LENGTH_INVALID,
    );
    assert_status(
        &tcp.exec_icd(icd_write(2, 1, 0, 1024), &data[..512]),
        Status::DATA_SGL_LENGTH_INVALID,
    );
    assert!(zeros(&ok_data(tcp.read(3, 1, 0, 2))));

    // NVMe/RDMA: the receive buffer may be longer than the data.
    let (_ra, cntlid) = e.admin_with(rdma_cfg(0));
    let mut rdma = e.io_with(rdma_cfg(1), cntlid, 1);
    assert_status(
        &rdma.exec_icd(icd_write(1, 1, 0, 512), &data),
        Status::SUCCESS,
    );
    let back = ok_data(rdma.read_placed(2, 1, 0, 2));
    assert_eq!(back[..512], data[..512]);
    assert!(zeros(&back[512..]), "only the command's length is written");
    assert_status(
        &rdma.exec_icd(icd_write(3, 1, 0, 1024), &data[..512]),
        Status::DATA_SGL_LENGTH_INVALID,
    );
}

#[test]
fn in_capsule_data_above_the_queue_limit_is_refused() {
    let e = env();
    let (mut a, mut io) = e.pair();
    // I/O queues take `in_capsule_data` (8 KiB) in a capsule.
    assert_eq!(e.target.limits.in_capsule_data, 8192);
    let big = pattern(8192 + 512, 5);
    assert_status(
        &io.exec_icd(icd_write(1, 1, 0, 8192), &big[..8192]),
        Status::SUCCESS,
    );
    assert_status(
        &io.exec_icd(icd_write(2, 1, 64, big.len()), &big),
        Status::DATA_SGL_LENGTH_INVALID,
    );
    assert!(zeros(&ok_data(io.read(3, 1, 64, 17))));
    // The admin queue takes 8 KiB as well.
    let mut sf = set_features(1, fid::VOLATILE_WRITE_CACHE, 1);
    sf.set_sgl(icd_sgl(big.len() as u32));
    assert_status(&a.exec_icd(sf, &big), Status::DATA_SGL_LENGTH_INVALID);
}

#[test]
fn reads_over_rdma_go_to_the_buffer_the_transport_placed() {
    let e = env();
    let (_a, cntlid) = e.admin_with(rdma_cfg(0));
    let mut io = e.io_with(rdma_cfg(1), cntlid, 1);
    let data = pattern(4096, 11);
    ok(io.exec_icd(icd_write(1, 1, 40, 4096), &data));

    let Received::NeedData {
        slot,
        len: 4096,
        dir: DataDirection::ControllerToHost,
    } = io.receive(rw(io_opc::READ, 2, 1, 40, 8))
    else {
        panic!("a read over RDMA waits for its buffer");
    };
    assert_eq!(
        io.q.dev_ops(),
        0,
        "nothing runs before the buffer is placed"
    );
    let placed = IoBuf::new(8192);
    let at = placed.as_ptr() as usize;
    io.q.request_mut(slot).unwrap().buf = Some(placed);
    io.data_ready(slot, false);
    io.drain();
    let r = io.one();
    assert_eq!(r.data_ptr, Some(at), "sent from the placed buffer");
    assert_eq!(ok_data(r), data);

    // A transport that did not place one has failed, not the host.
    let Received::NeedData { slot, .. } = io.receive(rw(io_opc::READ, 3, 1, 40, 8)) else {
        panic!("no buffer request");
    };
    io.data_ready(slot, false);
    io.drain();
    assert_status(&io.one(), Status::INTERNAL_ERROR);
}

#[test]
fn reads_over_tcp_run_at_once() {
    let e = env();
    let (_a, mut io) = e.pair();
    let data = pattern(4096, 12);
    ok(io.write(1, 1, 0, &data));
    assert_eq!(io.receive(rw(io_opc::READ, 2, 1, 0, 8)), Received::Done);
    assert_eq!(io.q.dev_ops(), 1, "submitted without a data request");
    assert!(io.take().is_empty(), "answered when the device completes");
    io.drain();
    assert_eq!(io.q.dev_ops(), 0);
    assert_eq!(ok_data(io.one()), data);
}

#[test]
fn lba_out_of_range_fails_before_any_data_moves() {
    let e = env();
    let (_a, mut io) = e.pair();
    // `exec` asserts `Received::Done`: no data was asked for.
    assert_status(
        &io.exec(rw(io_opc::WRITE, 1, 1, NS_BLOCKS - 1, 2)),
        Status::LBA_OUT_OF_RANGE,
    );
    assert_status(&io.read(2, 1, NS_BLOCKS, 1), Status::LBA_OUT_OF_RANGE);
    assert_status(&io.read(3, 1, u64::MAX, 1), Status::LBA_OUT_OF_RANGE);
    let mut wz = Sqe::new(io_opc::WRITE_ZEROES, 4, 1);
    wz.set_cdw(10, (NS_BLOCKS - 4) as u32);
    wz.set_cdw(12, 7);
    assert_status(&io.exec(wz), Status::LBA_OUT_OF_RANGE);
    // The last block is in range.
    ok(io.write(5, 1, NS_BLOCKS - 1, &pattern(512, 1)));
    assert_eq!(io.q.dev_ops(), 0);
}

#[test]
fn invalid_namespace_fails_before_any_data_moves() {
    let e = env();
    let (_a, mut io) = e.pair();
    assert_status(
        &io.exec(rw(io_opc::WRITE, 1, 7, 0, 8)),
        Status::INVALID_NAMESPACE,
    );
    assert_status(&io.read(2, 0, 0, 8), Status::INVALID_NAMESPACE);
    assert_status(
        &io.exec(Sqe::new(io_opc::FLUSH, 3, 7)),
        Status::INVALID_NAMESPACE,
    );
}

#[test]
fn sgl_length_must_match_the_transfer() {
    let e = env();
    let (_a, mut io) = e.pair();
    let mut w = rw(io_opc::WRITE, 1, 1, 0, 8);
    w.set_sgl(host_sgl(2048));
    assert_status(&io.exec(w), Status::DATA_SGL_LENGTH_INVALID);
    // The transport's descriptor has less room than the read returns.
    let r = rw(io_opc::READ, 2, 1, 0, 8);
    assert_eq!(
        io.receive_raw(r, Ok(DataDesc::Host { len: 2048 }), &[], false),
        Received::Done
    );
    assert_status(&io.one(), Status::DATA_SGL_LENGTH_INVALID);
    // A descriptor longer than MDTS allows, whatever the command.
    let big = DataDesc::Host { len: 2 << 20 };
    assert_eq!(
        io.receive_raw(Sqe::new(io_opc::FLUSH, 3, 1), Ok(big), &[], false),
        Received::Done
    );
    assert_status(&io.one(), Status::DATA_SGL_LENGTH_INVALID);
}

#[test]
fn write_with_a_descriptor_shorter_than_its_blocks_is_refused() {
    let e = env();
    let (_a, mut io) = e.pair();
    // A pool buffer a previous command left its data in.
    let mut stale = io.bufs.get(4096);
    stale.fill(0xEE);
    io.bufs.put(stale);
    // The SGL says 4096 bytes (8 blocks), the transport's descriptor 512.
    let w = icd_write(1, 1, 0, 4096);
    let short = Ok(DataDesc::InCapsule {
        offset: 0,
        len: 512,
    });
    assert_eq!(
        io.receive_raw(w, short, &[0x11; 512], false),
        Received::Done
    );
    io.drain();
    let r = io.one();
    let back = ok_data(io.read(2, 1, 0, 8));
    assert!(
        zeros(&back),
        "stale bytes reached the device: {:#x}",
        back[600]
    );
    assert_status(&r, Status::DATA_SGL_LENGTH_INVALID);
}

#[test]
fn data_descriptor_errors_fail_the_command() {
    let e = env();
    let (_a, mut io) = e.pair();
    let read = rw(io_opc::READ, 1, 1, 0, 8);
    // The transport could not decode the descriptor.
    io.receive_raw(read, Err(Status::SGL_DESCRIPTOR_TYPE_INVALID), &[], false);
    assert_status(&io.one(), Status::SGL_DESCRIPTOR_TYPE_INVALID);
    // Read data cannot ride in the command capsule.
    let mut r = rw(io_opc::READ, 2, 1, 0, 8);
    r.set_sgl(icd_sgl(4096));
    assert_status(&io.exec_icd(r, &[]), Status::SGL_DESCRIPTOR_TYPE_INVALID);
    // In-capsule data starts right after the SQE.
    let mut w = icd_write(3, 1, 0, 512);
    w.set_sgl(SglDescriptor {
        address: 16,
        ..icd_sgl(512)
    });
    assert_status(
        &io.exec_icd(w, &pattern(512, 0)),
        Status::SGL_OFFSET_INVALID,
    );
    // NVMe/TCP: capsule data where the command has none to carry.
    assert_status(
        &io.exec_icd(rw(io_opc::READ, 4, 1, 0, 8), &[1; 16]),
        Status::INVALID_FIELD,
    );
    assert_status(
        &io.exec_icd(rw(io_opc::WRITE, 5, 1, 0, 8), &[1; 16]),
        Status::INVALID_FIELD,
    );
    assert!(zeros(&ok_data(io.read(6, 1, 0, 8))));
}

#[test]
fn unknown_and_bidirectional_io_opcodes_are_invalid_opcodes() {
    let e = env();
    let (_a, mut io) = e.pair();
    // On I/O queues the NVM command check comes first: 03h (bits 1:0 = 11b,
    // bidirectional) is no NVM command. The admin queue's check of the
    // direction itself is in `unknown_and_bidirectional_admin_opcodes_are_refused`.
    for (cid, opc) in [(1, 0x03), (2, 0x83), (3, 0x04), (4, 0xC0)] {
        let mut s = Sqe::new(opc, cid, 1);
        s.set_sgl(host_sgl(512));
        assert_status(&io.exec(s), Status::INVALID_OPCODE);
    }
}

#[test]
fn corrupt_in_capsule_data_is_a_transient_transport_error() {
    let e = env();
    let (_a, mut io) = e.pair();
    let data = pattern(4096, 13);
    let w = icd_write(1, 1, 0, 4096);
    assert_eq!(io.receive_raw(w, tcp_desc(&w), &data, true), Received::Done);
    assert_eq!(io.q.dev_ops(), 0, "corrupt data never reaches the device");
    let r = io.one();
    assert_eq!(r.status(), TRANSIENT_TRANSPORT_ERROR);
    // SCT 0, SC 22h, retryable.
    assert_eq!(
        (r.status().sct, r.status().sc, r.status().dnr),
        (0, 0x22, false)
    );
    assert!(zeros(&ok_data(io.read(2, 1, 0, 8))));
}

#[test]
fn corrupt_r2t_data_is_a_transient_transport_error() {
    let e = env();
    let (_a, mut io) = e.pair();
    let data = pattern(4096, 14);
    let Received::NeedData { slot, .. } = io.receive(rw(io_opc::WRITE, 1, 1, 0, 8)) else {
        panic!("no data request");
    };
    io.fill(slot, &data);
    io.data_ready(slot, true);
    assert_eq!(io.q.dev_ops(), 0, "corrupt data never reaches the device");
    assert_eq!(io.one().status(), TRANSIENT_TRANSPORT_ERROR);
    assert!(zeros(&ok_data(io.read(2, 1, 0, 8))));
    // The retry succeeds.
    ok(io.write(3, 1, 0, &data));
    assert_eq!(ok_data(io.read(4, 1, 0, 8)), data);
}

#[test]
fn flush_of_nsid_ffffffff_flushes_every_namespace() {
    let e = env();
    e.add_ram_ns(2);
    e.add_ram_ns(3);
    let (_a, mut io) = e.pair();
    assert_eq!(
        io.receive(Sqe::new(io_opc::FLUSH, 1, 0xFFFF_FFFF)),
        Received::Done
    );
    assert_eq!(io.q.dev_ops(), 3, "one flush per namespace");
    assert!(io.take().is_empty());
    io.drain();
    ok(io.one());
    assert_eq!(io.receive(Sqe::new(io_opc::FLUSH, 2, 2)), Received::Done);
    assert_eq!(io.q.dev_ops(), 1);
    io.drain();
    ok(io.one());
}

fn dsm(cid: u16, ranges: &[(u64, u32)], deallocate: bool) -> (Sqe, Vec<u8>) {
    let mut list = vec![0u8; ranges.len() * 16];
    for (i, &(slba, nlb)) in ranges.iter().enumerate() {
        DsmRange {
            attributes: 0,
            nlb,
            slba,
        }
        .encode(&mut list[i * 16..(i + 1) * 16]);
    }
    let mut s = Sqe::new(io_opc::DATASET_MANAGEMENT, cid, 1);
    s.set_cdw(10, ranges.len() as u32 - 1);
    s.set_cdw(11, if deallocate { DSM_ATTR_DEALLOCATE } else { 0 });
    s.set_sgl(icd_sgl(list.len() as u32));
    (s, list)
}

#[test]
fn dsm_deallocate_zeroes_its_ranges() {
    let e = env();
    let (_a, mut io) = e.pair();
    let a = pattern(8192, 15);
    let b = pattern(4096, 16);
    ok(io.write(1, 1, 0, &a));
    ok(io.write(2, 1, 64, &b));

    // A bad range (past the end) means no range is used.
    let (s, list) = dsm(3, &[(4, 4), (NS_BLOCKS, 1)], true);
    assert_status(&io.exec_icd(s, &list), Status::LBA_OUT_OF_RANGE);
    assert_eq!(ok_data(io.read(4, 1, 0, 16)), a);
    // Hints alone need no device.
    let (s, list) = dsm(5, &[(0, 16)], false);
    assert_eq!(
        io.receive_raw(s, tcp_desc(&s), &list, false),
        Received::Done
    );
    assert_eq!(io.q.dev_ops(), 0);
    ok(io.one());
    assert_eq!(ok_data(io.read(6, 1, 0, 16)), a);
    // A range list shorter than NR says.
    let (mut s, list) = dsm(7, &[(4, 4), (64, 8)], true);
    s.set_sgl(icd_sgl(16));
    assert_status(
        &io.exec_icd(s, &list[..16]),
        Status::DATA_SGL_LENGTH_INVALID,
    );

    let (s, list) = dsm(8, &[(4, 4), (64, 8)], true);
    ok(io.exec_icd(s, &list));
    let got = ok_data(io.read(9, 1, 0, 16));
    assert_eq!(got[..2048], a[..2048]);
    assert!(zeros(&got[2048..4096]));
    assert_eq!(got[4096..], a[4096..]);
    assert!(zeros(&ok_data(io.read(10, 1, 64, 8))));
}

#[test]
fn write_zeroes_zeroes_its_range() {
    let e = env();
    let (_a, mut io) = e.pair();
    let a = pattern(8192, 17);
    ok(io.write(1, 1, 0, &a));
    let wz = |cid, slba: u64, nlb: u32, deallocate: bool| {
        let mut s = Sqe::new(io_opc::WRITE_ZEROES, cid, 1);
        s.set_cdw(10, slba as u32);
        s.set_cdw(12, (nlb - 1) | (deallocate as u32) << 25);
        s
    };
    ok(io.exec(wz(2, 2, 2, false)));
    // With DEAC: may deallocate, still reads as zeros.
    ok(io.exec(wz(3, 12, 4, true)));
    let got = ok_data(io.read(4, 1, 0, 16));
    assert_eq!(got[..1024], a[..1024]);
    assert!(zeros(&got[1024..2048]));
    assert_eq!(got[2048..6144], a[2048..6144]);
    assert!(zeros(&got[6144..]));
}

// ---------------------------------------------------------------------------
// Namespaces added and removed at run time.

#[test]
fn namespace_removed_while_data_moves_fails_at_execution() {
    let e = env();
    let (_a, mut io) = e.pair();
    let Received::NeedData { slot, .. } = io.receive(rw(io_opc::WRITE, 1, 1, 0, 8)) else {
        panic!("no data request");
    };
    assert!(e.subsys.remove_namespace(1).is_some());
    // A reactor pass runs housekeeping while the data is on its way.
    assert_eq!(io.housekeeping(), None);
    io.fill(slot, &pattern(4096, 1));
    io.data_ready(slot, false);
    assert_eq!(
        io.q.dev_ops(),
        0,
        "nothing submitted to the removed namespace"
    );
    assert_status(&io.one(), Status::INVALID_NAMESPACE);
    assert_status(&io.read(2, 1, 0, 8), Status::INVALID_NAMESPACE);
}

#[test]
fn namespace_removed_while_data_moves_fails_without_housekeeping_too() {
    let e = env();
    let (_a, mut io) = e.pair();
    let Received::NeedData { slot, .. } = io.receive(rw(io_opc::WRITE, 1, 1, 0, 8)) else {
        panic!("no data request");
    };
    assert!(e.subsys.remove_namespace(1).is_some());
    io.fill(slot, &pattern(4096, 1));
    io.data_ready(slot, false);
    io.drain();
    assert_status(&io.one(), Status::INVALID_NAMESPACE);
}

#[test]
fn namespace_added_at_run_time_is_served() {
    let e = env();
    let (mut a, mut io) = e.pair();
    assert_status(&io.read(1, 2, 0, 8), Status::INVALID_NAMESPACE);
    e.add_ram_ns(2);
    let data = pattern(4096, 21);
    ok(io.write(2, 2, 0, &data));
    assert_eq!(ok_data(io.read(3, 2, 0, 8)), data);
    // A separate device: namespace 1 did not see the write.
    assert!(zeros(&ok_data(io.read(4, 1, 0, 8))));
    assert_eq!(
        nvme::decode_ns_list(&ok_data(a.exec(identify(1, cns::ACTIVE_NS_LIST, 0)))),
        vec![1, 2]
    );
    e.subsys.remove_namespace(2);
    assert_status(&io.read(5, 2, 0, 8), Status::INVALID_NAMESPACE);
    assert!(io.q.ns.get(2).is_none(), "the table let go of it");
}

// ---------------------------------------------------------------------------
// Slots held by the transport, abandoned commands.

#[test]
fn a_held_slot_is_not_reused_until_released() {
    let e = env();
    let (_a, mut io) = e.pair();
    // Every freed slot is discarded; count from here.
    io.link.discarded.clear();
    io.link.hold = true;
    let flush = |cid| Sqe::new(io_opc::FLUSH, cid, 1);
    let s1 = ok_slot(io.exec(flush(1)));
    assert_eq!(io.q.request(s1).map(|r| r.phase), Some(Phase::Responding));
    let s2 = ok_slot(io.exec(flush(2)));
    // Answered, so the host may reuse CID 1 while its slot is still held.
    let s3 = ok_slot(io.exec(flush(1)));
    assert!(s1 != s2 && s3 != s1 && s3 != s2, "{s1} {s2} {s3}");
    assert!(io.link.discarded.is_empty(), "held slots are not freed");

    io.link.hold = false;
    io.release(s1);
    assert_eq!(io.link.discarded, vec![s1]);
    assert!(io.q.request(s1).is_none());
    // Released now, so `Release::Now` frees it at once.
    assert_eq!(
        ok_slot(io.exec(flush(4))),
        s1,
        "the released slot is reused"
    );
    assert_eq!(io.link.discarded, vec![s1, s1]);
    // Releasing a free slot changes nothing.
    io.release(s1);
    assert_eq!(io.link.discarded, vec![s1, s1]);
    assert_eq!(ok_slot(io.exec(flush(5))), s1);
    // The other two are still held.
    assert_eq!(io.q.request(s2).map(|r| r.phase), Some(Phase::Responding));
    assert_eq!(io.q.request(s3).map(|r| r.phase), Some(Phase::Responding));
}

fn ok_slot(r: Sent) -> u16 {
    assert_status(&r, Status::SUCCESS);
    r.slot.expect("slotted response")
}

#[test]
fn abandoning_a_moving_command_frees_its_slot_and_cid() {
    let e = env();
    let (_a, mut io) = e.pair();
    let Received::NeedData { slot, .. } = io.receive(rw(io_opc::WRITE, 5, 1, 0, 8)) else {
        panic!("no data request");
    };
    io.fill(slot, &pattern(4096, 2));
    io.link.discarded.clear();
    io.abandon(slot);
    assert_eq!(io.link.discarded, vec![slot]);
    assert!(io.q.request(slot).is_none());
    assert!(io.take().is_empty(), "an abandoned command is not answered");
    // Late data for it goes nowhere.
    io.data_ready(slot, false);
    assert_eq!(io.q.dev_ops(), 0);
    assert!(io.take().is_empty());
    // Its CID and slot are free.
    match io.receive(rw(io_opc::WRITE, 5, 1, 0, 8)) {
        Received::NeedData { slot: s, .. } => assert_eq!(s, slot),
        other => panic!("{other:?}: {:?}", io.take()),
    }
    assert!(io.take().is_empty(), "no CID conflict");
    assert!(zeros(&ok_data(io.read(6, 1, 0, 8))));
}

// ---------------------------------------------------------------------------
// Disconnect, controller teardown.

#[test]
fn disconnect_on_an_io_queue_is_answered_then_closes() {
    let e = env();
    let (_a, mut io) = e.pair();
    let before = io.read(1, 1, 0, 8);
    assert!(!before.close_after);
    let r = io.exec(fabrics(2, fctype::DISCONNECT));
    assert_status(&r, Status::SUCCESS);
    assert_eq!((r.cqe.cid, r.cqe.sq_id, r.close_after), (2, 1, true));
}

/// The host may connect the same QID as soon as it reads the Disconnect's
/// answer, before the old connection has closed; the old queue's later close
/// leaves the new one's QID alone.
#[test]
fn disconnect_frees_the_qid_before_the_answer() {
    let e = env();
    let (_a, mut old) = e.pair();
    let ctrl = old.q.binding().unwrap().ctrl().clone();
    assert_eq!(ctrl.queue_ids(), vec![0, 1]);
    assert_status(&old.exec(fabrics(2, fctype::DISCONNECT)), Status::SUCCESS);
    assert_eq!(ctrl.queue_ids(), vec![0]);
    let mut new = e.conn(tcp_cfg());
    assert_status(&new.connect(1, 31, 0, ctrl.cntlid, SUBNQN), Status::SUCCESS);
    old.q.unbind();
    assert_eq!(ctrl.queue_ids(), vec![0, 1]);
    assert!(zeros(&ok_data(new.read(1, 1, 0, 8))));
    new.q.unbind();
    assert_eq!(ctrl.queue_ids(), vec![0]);
}

#[test]
fn disconnect_on_the_admin_queue_is_invalid_field() {
    let e = env();
    let (mut a, cntlid) = e.admin();
    let r = a.exec(fabrics(1, fctype::DISCONNECT));
    assert_status(&r, Status::INVALID_FIELD);
    assert!(!r.close_after);
    assert!(!e.ctrl(cntlid).is_failed());
}

#[test]
fn housekeeping_fails_the_controller_when_keep_alive_expires() {
    let e = env();
    let (mut a, mut io) = e.pair();
    let cntlid = a.q.binding().unwrap().ctrl().cntlid;
    assert_eq!(a.housekeeping(), None, "KATO 0: never expires");
    ok(a.exec(set_features(1, fid::KEEP_ALIVE_TIMER, 1000)));
    // KATO 1 s and its grace (1 s): alive at 2 s, failed just after.
    a.advance(std::time::Duration::from_millis(2000));
    assert_eq!(a.housekeeping(), None);
    assert!(!e.ctrl(cntlid).is_failed());
    a.advance(std::time::Duration::from_millis(2));
    assert_eq!(a.housekeeping(), Some("controller failed"));
    assert!(e.ctrl(cntlid).is_failed());
    // Every queue of the controller closes.
    assert_eq!(io.housekeeping(), Some("controller failed"));
}

#[test]
fn unbinding_the_admin_queue_deletes_the_controller() {
    let e = env();
    let (mut a, mut io) = e.pair();
    let ctrl = a.q.binding().unwrap().ctrl().clone();
    a.q.unbind();
    assert!(a.q.binding().is_none());
    assert!(ctrl.is_failed());
    assert!(e.subsys.controllers.lock().unwrap().is_empty());
    assert_eq!(io.housekeeping(), Some("controller failed"));
}

// ---------------------------------------------------------------------------
// SQ head.

#[test]
fn sq_head_advances_per_command_and_wraps_at_sqsize() {
    let e = env();
    let mut a = e.conn(tcp_cfg());
    // SQSIZE 3: heads run 0..=3.
    let h0 = a.connect(0, 3, 0, 0xFFFF, SUBNQN).cqe.sq_head;
    let heads: Vec<u16> = (1..=9)
        .map(|cid| a.exec(Sqe::new(admin_opc::KEEP_ALIVE, cid, 0)).cqe.sq_head)
        .collect();
    let want: Vec<u16> = (1..=9).map(|i| (h0 + i) % 4).collect();
    assert_eq!(heads, want);
    assert!(heads.iter().all(|&h| h <= 3));
    // A conflicting command took an entry too (CID 20 is a write's, waiting
    // for its data).
    ok(a.exec(prop_set(10, prop::CC, CC_ENABLE)));
    let mut w = set_features(20, fid::VOLATILE_WRITE_CACHE, 1);
    w.set_sgl(host_sgl(512));
    assert!(matches!(a.receive(w), Received::NeedData { .. }));
    a.receive(Sqe::new(admin_opc::KEEP_ALIVE, 20, 0));
    let r = a.one();
    assert_status(&r, Status::CID_CONFLICT);
    assert_eq!(r.cqe.sq_head, (h0 + 12) % 4);
}

#[test]
fn the_connect_response_counts_the_connect_in_sq_head() {
    let e = env();
    let mut a = e.conn(tcp_cfg());
    assert_eq!(a.connect(0, 3, 0, 0xFFFF, SUBNQN).cqe.sq_head, 1);
    assert_eq!(a.exec(Sqe::new(admin_opc::KEEP_ALIVE, 1, 0)).cqe.sq_head, 2);
}

#[test]
fn sq_head_is_ffff_when_the_host_disables_sq_flow_control() {
    let e = env();
    let mut a = e.conn(tcp_cfg());
    let r = a.connect(0, 31, CATTR_DISABLE_SQ_FLOW, 0xFFFF, SUBNQN);
    assert_status(&r, Status::SUCCESS);
    assert_eq!(r.cqe.sq_head, 0xFFFF, "already in the Connect response");
    ok(a.exec(prop_set(1, prop::CC, CC_ENABLE)));
    for cid in 2..6 {
        assert_eq!(
            a.exec(Sqe::new(admin_opc::KEEP_ALIVE, cid, 0)).cqe.sq_head,
            0xFFFF
        );
    }
    // Unslotted responses too.
    ok(a.exec(set_features(6, fid::ASYNC_EVENT_CONFIG, AEC_NS_ATTR)));
    a.receive(aer(7));
    e.add_ram_ns(2);
    a.housekeeping();
    assert_eq!(a.one().cqe.sq_head, 0xFFFF);
    // Without the attribute, the head is reported.
    let mut b = e.conn(tcp_cfg());
    b.connect(0, 31, 0, 0xFFFF, SUBNQN);
    assert_ne!(b.exec(prop_get(1, prop::CSTS)).cqe.sq_head, 0xFFFF);
}

// ---------------------------------------------------------------------------
// Accounting.

#[test]
fn qpair_stats_count_reads_writes_and_errors() {
    let e = env();
    let (a, mut io) = e.pair();
    let st = io.stats();
    let v = |x: &std::sync::atomic::AtomicU64| x.load(Ordering::Relaxed);
    // The Connect itself is an "other" command of the queue.
    assert_eq!((v(&st.other), v(&st.reads), v(&st.writes)), (1, 0, 0));
    ok(io.write(1, 1, 0, &pattern(4096, 1)));
    ok(io.write(2, 1, 8, &pattern(4096, 2)));
    ok(io.read(3, 1, 0, 16));
    assert_status(&io.read(4, 1, NS_BLOCKS, 1), Status::LBA_OUT_OF_RANGE);
    assert_status(
        &io.exec(rw(io_opc::WRITE, 5, 9, 0, 8)),
        Status::INVALID_NAMESPACE,
    );
    ok(io.exec(Sqe::new(io_opc::FLUSH, 6, 1)));
    assert_eq!((v(&st.reads), v(&st.read_bytes)), (1, 8192));
    assert_eq!((v(&st.writes), v(&st.write_bytes)), (2, 8192));
    assert_eq!((v(&st.errors), v(&st.other)), (2, 2));
    // By kind: invalid_namespace, lba_out_of_range.
    assert_eq!((v(&st.errors_by[0]), v(&st.errors_by[2])), (1, 1));
    assert_eq!(st.errors_by.iter().map(v).sum::<u64>(), 2);
    assert_eq!(st.read_hist.iter().map(v).sum::<u64>(), 1);
    assert_eq!(st.write_hist.iter().map(v).sum::<u64>(), 2);

    // The controller's SMART counters see the same traffic.
    let ctrl = io.q.binding().unwrap().ctrl().clone();
    let c = ctrl.io_totals();
    assert_eq!(
        (c.read_cmds, c.write_cmds, c.read_bytes, c.write_bytes),
        (1, 2, 8192, 8192)
    );
    assert_eq!(ctrl.error_count(), 2);

    // A digest failure is an error of kind "other"; the admin queue's
    // counters are its own.
    let w = icd_write(7, 1, 0, 512);
    io.receive_raw(w, tcp_desc(&w), &pattern(512, 3), true);
    assert_eq!(io.one().status(), TRANSIENT_TRANSPORT_ERROR);
    assert_eq!((v(&st.errors), v(&st.errors_by[7])), (3, 1));
    let ast = a.stats();
    assert_eq!((v(&ast.reads), v(&ast.writes), v(&ast.errors)), (0, 0, 0));
    // Connect and Property Set.
    assert_eq!(v(&ast.other), 2);
}

// ---------------------------------------------------------------------------
// A device that records whether each write it got was FUA, and completes it.

#[derive(Default)]
struct FuaRecorder(Arc<std::sync::Mutex<Vec<bool>>>);

struct FuaChannel(Arc<std::sync::Mutex<Vec<bool>>>, Vec<IoCompletion>);

impl BlockDevice for FuaRecorder {
    fn describe(&self) -> String {
        "fua-recorder".into()
    }
    fn size_bytes(&self) -> u64 {
        NS_BYTES
    }
    fn open_channel(&self) -> std::io::Result<Box<dyn IoChannel>> {
        Ok(Box::new(FuaChannel(self.0.clone(), Vec::new())))
    }
    fn sync(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn volatile(&self) -> bool {
        true
    }
}

impl IoChannel for FuaChannel {
    fn submit(&mut self, tag: u64, op: IoOp, _now: Instant) -> Result<(), (IoOp, i32)> {
        if let IoOp::Write { fua, .. } = &op {
            self.0.lock().unwrap().push(*fua);
        }
        self.1.push(IoCompletion {
            tag,
            result: Ok(()),
            buf: op.into_buf(),
        });
        Ok(())
    }
    fn flush_submissions(&mut self) {}
    fn poll(&mut self, out: &mut Vec<IoCompletion>, _now: Instant) -> usize {
        let n = self.1.len();
        out.append(&mut self.1);
        n
    }
    fn in_flight(&self) -> usize {
        self.1.len()
    }
    fn completion_fd(&self) -> Option<RawFd> {
        None
    }
}

/// Without a volatile write cache (the namespace's `write_cache = false`, or
/// the host turning the controller's off with Set Features) every write is
/// durable before its completion: it reaches the device as FUA. (The
/// controller once accepted Set Features VWC = 0 and changed nothing.)
#[test]
fn writes_are_fua_without_a_volatile_write_cache() {
    let e = env();
    let cached = FuaRecorder::default();
    let through = FuaRecorder::default();
    let (seen_cached, seen_through) = (cached.0.clone(), through.0.clone());
    e.add_ns(2, Arc::new(cached));
    let ns3 = Namespace::new(SUBNQN, 3, Arc::new(through), BS).with_write_cache(false);
    e.subsys.add_namespace(Arc::new(ns3)).unwrap();
    let (mut a, mut io) = e.pair();
    let data = pattern(BS as usize, 1);
    ok(io.write(1, 2, 0, &data));
    ok(io.write(2, 3, 0, &data));
    let mut fua = rw(io_opc::WRITE, 3, 2, 8, 1);
    fua.set_cdw(12, fua.cdw(12) | 1 << 30);
    ok(io.exec_h2c(fua, &data));
    assert_eq!(*seen_cached.lock().unwrap(), [false, true]);
    assert_eq!(*seen_through.lock().unwrap(), [true]);
    // One namespace with a cache: Identify says there is one.
    let id = IdentifyController::decode(&ok_data(a.exec(identify(4, cns::CONTROLLER, 0))));
    assert_eq!(id.vwc & 1, 1);

    // The host turns the cache off: writes to namespace 2 go FUA too.
    ok(a.exec(set_features(5, fid::VOLATILE_WRITE_CACHE, 0)));
    assert_eq!(
        a.exec(get_features(6, fid::VOLATILE_WRITE_CACHE, 0))
            .cqe
            .result,
        0
    );
    ok(io.write(7, 2, 16, &data));
    ok(a.exec(set_features(8, fid::VOLATILE_WRITE_CACHE, 1)));
    ok(io.write(9, 2, 24, &data));
    assert_eq!(*seen_cached.lock().unwrap(), [false, true, true, false]);

    // Only write-through namespaces left: no volatile write cache at all.
    e.subsys.remove_namespace(1);
    e.subsys.remove_namespace(2);
    let id = IdentifyController::decode(&ok_data(a.exec(identify(10, cns::CONTROLLER, 0))));
    assert_eq!(id.vwc, 0);
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
        ns.command_set = crate::nvmf::CommandSet::KeyValue;
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

#[test]
fn cc_css_all_io_command_sets_enables_and_block_volumes_stay_visible() {
    let e = env();
    let (mut a, cntlid) = e.admin_cc(CC_ENABLE_ALL_IOCS);
    assert!(e.ctrl(cntlid).is_ready());
    assert_eq!(ok(a.exec(prop_get(2, prop::CC))) >> 4 & 0b111, 0b110);
    // What Linux 6.1 needs to set up a block volume with CC.CSS = 110b: the
    // active list, a descriptor list that names CSI 00h, CNS 00h.
    assert_eq!(
        nvme::decode_ns_list(&ok_data(a.exec(identify(3, cns::ACTIVE_NS_LIST, 0)))),
        vec![1]
    );
    let d = nvme::decode_ns_descriptors(&ok_data(a.exec(identify(4, cns::NS_DESCRIPTOR_LIST, 1))));
    assert_eq!(d.last(), Some(&(nidt::CSI, vec![nvme::csi::NVM])));
    let id = IdentifyNamespace::decode(&ok_data(a.exec(identify(5, cns::NAMESPACE, 1))));
    assert_eq!(id.nsze, NS_BLOCKS);
    // The command set independent structure too (Linux uses it when CAP.CRMS
    // is set, and for other command sets).
    let ci = nvme::CsIndependentNamespace::decode(&ok_data(a.exec(identify(
        6,
        cns::CS_INDEPENDENT_NAMESPACE,
        1,
    ))));
    assert_eq!((ci.nstat, ci.nmic), (nvme::NSTAT_READY, 1));
    assert_status(
        &a.exec(identify(7, cns::CS_INDEPENDENT_NAMESPACE, 9)),
        Status::INVALID_NAMESPACE,
    );
    assert_status(
        &a.exec(identify(8, cns::CS_INDEPENDENT_NAMESPACE, 0xFFFF_FFFF)),
        Status::INVALID_NAMESPACE,
    );
    // Block I/O works as with CC.CSS = 000b.
    let mut io = e.io_with(tcp_cfg(), cntlid, 1);
    let data = pattern(BS as usize, 3);
    assert_status(&io.write(1, 1, 0, &data), Status::SUCCESS);
    assert_eq!(ok_data(io.read(2, 1, 0, 1)), data);
}

#[test]
fn unsupported_cc_css_values_fail_the_enable() {
    for css in [0b001u64, 0b010, 0b011, 0b100, 0b101, 0b111] {
        let e = env();
        let (mut a, cntlid) = e.admin_cc(CC_ENABLE | css << 4);
        let csts_v = ok(a.exec(prop_get(2, prop::CSTS))) as u32;
        assert_eq!(csts_v & (csts::CFS | csts::RDY), csts::CFS, "css {css:03b}");
        assert!(!e.ctrl(cntlid).is_ready());
    }
}

#[test]
fn identify_io_command_set_lists_nvm_and_kv_in_vector_zero() {
    let e = env();
    let (mut a, cntlid) = e.admin_cc(CC_ENABLE_ALL_IOCS);
    let b = ok_data(a.exec(identify(2, cns::IO_COMMAND_SET, 0)));
    assert_eq!(b.len(), 4096);
    assert_eq!(nvme::decode_io_command_set_vectors(&b), vec![0b11]);
    assert!(b[8..].iter().all(|&x| x == 0));
    // Naming this controller in CNTID is the same; another one is not ours.
    let mut s = identify(3, cns::IO_COMMAND_SET, 0);
    s.set_cdw(10, cns::IO_COMMAND_SET as u32 | (cntlid as u32) << 16);
    assert_eq!(ok_data(a.exec(s)), b);
    let mut s = identify(4, cns::IO_COMMAND_SET, 0);
    s.set_cdw(10, cns::IO_COMMAND_SET as u32 | ((cntlid + 1) as u32) << 16);
    assert_status(&a.exec(s), Status::INVALID_FIELD);
}

#[test]
fn io_command_set_profile_feature_selects_a_supported_combination() {
    let e = env();
    let (mut a, cntlid) = e.admin_cc(CC_ENABLE_ALL_IOCS);
    let f = fid::IO_COMMAND_SET_PROFILE;
    assert_eq!(ok(a.exec(get_features(2, f, 0))), 0);
    assert_eq!(ok(a.exec(set_features(3, f, 0))), 0);
    // Index 1 has no combination vector; bits above 8 are not part of it.
    assert_status(
        &a.exec(set_features(4, f, 1)),
        Status::IOCS_COMBINATION_REJECTED,
    );
    assert_status(
        &a.exec(set_features(5, f, 0x1FF)),
        Status::IOCS_COMBINATION_REJECTED,
    );
    assert_eq!(ok(a.exec(set_features(6, f, 0x200))), 0);
    assert_eq!(ok(a.exec(get_features(7, f, 0))), 0);
    // Default 0; changeable, not saveable.
    assert_eq!(ok(a.exec(get_features(8, f, 1))), 0);
    assert_eq!(ok(a.exec(get_features(9, f, 3))), 1 << 2);
    let mut save = set_features(10, f, 0);
    save.set_cdw(10, f as u32 | 1 << 31);
    assert_status(&a.exec(save), Status::FEATURE_NOT_SAVEABLE);
    // Not with I/O queues connected.
    let _io = e.io_with(tcp_cfg(), cntlid, 1);
    assert_status(
        &a.exec(set_features(11, f, 0)),
        Status::COMMAND_SEQUENCE_ERROR,
    );
}

#[test]
fn kv_namespaces_are_active_only_with_the_kv_command_set_enabled() {
    let e = env();
    e.add_kv_ns(2);
    e.add_ram_ns(3);
    // CC.CSS = 000b: NVM only; NSID 2 is inactive for this controller.
    let (mut a, _) = e.admin_cc(CC_ENABLE);
    let list = |a: &mut Conn, cid, cns_v, csi_v| {
        nvme::decode_ns_list(&ok_data(a.exec(identify_csi(cid, cns_v, 0, csi_v))))
    };
    assert_eq!(list(&mut a, 2, cns::ACTIVE_NS_LIST, 0), vec![1, 3]);
    assert_eq!(
        list(&mut a, 3, cns::CSI_ACTIVE_NS_LIST, nvme::csi::KEY_VALUE),
        vec![] as Vec<u32>
    );
    assert_status(
        &a.exec(identify(4, cns::NS_DESCRIPTOR_LIST, 2)),
        Status::INVALID_NAMESPACE,
    );
    assert!(ok_data(a.exec(identify(5, cns::NAMESPACE, 2)))
        .iter()
        .all(|&b| b == 0));

    // CC.CSS = 110b: both command sets.
    let (mut a, _) = e.admin_cc(CC_ENABLE_ALL_IOCS);
    assert_eq!(list(&mut a, 2, cns::ACTIVE_NS_LIST, 0), vec![1, 2, 3]);
    assert_eq!(
        list(&mut a, 3, cns::CSI_ACTIVE_NS_LIST, nvme::csi::NVM),
        vec![1, 3]
    );
    assert_eq!(
        list(&mut a, 4, cns::CSI_ACTIVE_NS_LIST, nvme::csi::KEY_VALUE),
        vec![2]
    );
    assert_status(
        &a.exec(identify_csi(
            5,
            cns::CSI_ACTIVE_NS_LIST,
            0,
            nvme::csi::ZONED,
        )),
        Status::INVALID_FIELD,
    );
    // The NVM Identify Namespace does not describe a KV namespace.
    assert_status(
        &a.exec(identify(6, cns::NAMESPACE, 2)),
        Status::INVALID_IOCS,
    );
}

#[test]
fn identify_describes_a_kv_namespace_per_command_set() {
    let e = env();
    let kv = e.add_kv_ns(2);
    let (mut a, _) = e.admin_cc(CC_ENABLE_ALL_IOCS);
    let d = nvme::decode_ns_descriptors(&ok_data(a.exec(identify(2, cns::NS_DESCRIPTOR_LIST, 2))));
    assert_eq!(
        d,
        vec![
            (nidt::EUI64, kv.eui64.to_vec()),
            (nidt::NGUID, kv.nguid.to_vec()),
            (nidt::UUID, kv.uuid.to_vec()),
            (nidt::CSI, vec![nvme::csi::KEY_VALUE]),
        ]
    );
    let id = nvme::KvIdentifyNamespace::decode(&ok_data(a.exec(identify_csi(
        3,
        cns::CSI_NAMESPACE,
        2,
        nvme::csi::KEY_VALUE,
    ))));
    assert_eq!((id.nsze, id.nuse), (NS_BYTES, NS_BYTES));
    assert_eq!((id.nguid, id.eui64, id.nmic), (kv.nguid, kv.eui64, 1));
    assert_eq!(id.kvf.len(), 1);
    assert_eq!(id.kvf[0].kml, 16);
    assert_eq!(id.kvf[0].vml, TransportLimits::default().max_io_size);
    // A CSI the namespace is not of, or none we support: Invalid Field.
    for (cid, nsid, csi_v) in [
        (4, 2, nvme::csi::NVM),
        (5, 1, nvme::csi::KEY_VALUE),
        (6, 2, nvme::csi::ZONED),
    ] {
        assert_status(
            &a.exec(identify_csi(cid, cns::CSI_NAMESPACE, nsid, csi_v)),
            Status::INVALID_FIELD,
        );
    }
    assert_status(
        &a.exec(identify_csi(7, cns::CSI_NAMESPACE, 9, nvme::csi::KEY_VALUE)),
        Status::INVALID_NAMESPACE,
    );
    // The KV Identify Controller: nothing claimed, but answered.
    let c = ok_data(a.exec(identify_csi(
        8,
        cns::CSI_CONTROLLER,
        0,
        nvme::csi::KEY_VALUE,
    )));
    assert!(c.len() == 4096 && c.iter().all(|&b| b == 0));
    assert_status(
        &a.exec(identify_csi(9, cns::CSI_CONTROLLER, 0, nvme::csi::ZONED)),
        Status::INVALID_FIELD,
    );
}

/// What Linux 6.1's `nvme_scan_ns` issues for a namespace whose CSI it has
/// no driver for (see notes/kv-linux.md), in order, must all succeed: the
/// descriptor list with a CSI, the command set independent Identify with
/// NSTAT ready, and the Commands Supported and Effects log for that CSI.
#[test]
fn linux_scan_of_a_kv_namespace_gets_what_it_needs() {
    let e = env();
    e.add_kv_ns(2);
    let (mut a, _) = e.admin_cc(CC_ENABLE_ALL_IOCS);
    let d = nvme::decode_ns_descriptors(&ok_data(a.exec(identify(2, cns::NS_DESCRIPTOR_LIST, 2))));
    assert!(d.contains(&(nidt::CSI, vec![nvme::csi::KEY_VALUE])));
    let ci = nvme::CsIndependentNamespace::decode(&ok_data(a.exec(identify(
        3,
        cns::CS_INDEPENDENT_NAMESPACE,
        2,
    ))));
    assert_eq!(ci.nstat & nvme::NSTAT_READY, nvme::NSTAT_READY);
    let log = ok_data(a.exec(get_log_csi(
        4,
        lid::COMMANDS_SUPPORTED,
        4096,
        nvme::csi::KEY_VALUE,
    )));
    let iocs = |opc: u8| u32_at(&log, 1024 + opc as usize * 4);
    use nvme::kv_opc;
    assert_eq!(iocs(kv_opc::STORE), 0b11, "CSUPP | LBCC");
    assert_eq!(iocs(kv_opc::DELETE), 0b11);
    for opc in [kv_opc::FLUSH, kv_opc::RETRIEVE, kv_opc::LIST, kv_opc::EXIST] {
        assert_eq!(iocs(opc), 0b01, "opcode {opc:#x}");
    }
    assert_eq!(iocs(io_opc::DATASET_MANAGEMENT), 0, "an NVM-only opcode");
    assert_eq!(u32_at(&log, admin_opc::IDENTIFY as usize * 4), 1);
    // The NVM one keeps its opcodes and has no KV List.
    let log = ok_data(a.exec(get_log_csi(
        5,
        lid::COMMANDS_SUPPORTED,
        4096,
        nvme::csi::NVM,
    )));
    assert_eq!(
        u32_at(&log, 1024 + io_opc::DATASET_MANAGEMENT as usize * 4),
        0b11
    );
    assert_eq!(u32_at(&log, 1024 + kv_opc::LIST as usize * 4), 0);
    assert_status(
        &a.exec(get_log_csi(
            6,
            lid::COMMANDS_SUPPORTED,
            4096,
            nvme::csi::ZONED,
        )),
        Status::INVALID_FIELD,
    );
}

// ---------------------------------------------------------------------------
// KV commands against a KV namespace on a pool volume.

impl Env {
    /// A KV namespace at `nsid` on a fresh RAM pool's KV volume of `bytes`.
    fn add_pool_kv_ns(&self, nsid: u32, bytes: u64) -> Arc<crate::pool::Pool> {
        let dev: crate::bdev::SharedDevice = RamDevice::new("kvpool", 64 << 20).unwrap();
        crate::pool::format(&dev, &crate::pool::FormatOptions::default()).unwrap();
        let pool =
            crate::pool::Pool::open("kvq", dev, crate::pool::PoolOptions::default()).unwrap();
        let vol = pool
            .create_volume("c", bytes, BS, crate::pool::format::VOL_KV)
            .unwrap();
        let dev = crate::pool::channel::VolumeDevice::new(pool.clone(), vol.clone());
        let ns = Namespace::new(SUBNQN, nsid, dev, BS).with_kv(vol.kv.clone().unwrap());
        self.subsys.add_namespace(Arc::new(ns)).unwrap();
        pool
    }
}

impl Conn {
    /// Polls until a response is out: a KV Store's flush completes on the
    /// pool's metadata thread, not at once.
    fn wait_one(&mut self) -> Sent {
        for _ in 0..5000 {
            self.poll();
            if !self.link.sent.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        self.one()
    }
    fn kv(&mut self, cmd: nvme::KvCommand, cid: u16, nsid: u32, sgl_len: u32) -> Sqe {
        let mut s = cmd.encode(cid, nsid);
        s.set_sgl(host_sgl(sgl_len));
        s
    }
}

#[test]
fn kv_store_and_retrieve_over_rdma_copy_into_the_placed_buffer() {
    let e = env();
    let _pool = e.add_pool_kv_ns(2, 4 << 20);
    let (_a, cntlid) = e.admin_cc(CC_ENABLE_ALL_IOCS);
    let mut io = e.io_with(rdma_cfg(1), cntlid, 1);
    let key = nvme::KvKey::new(b"rdma-key").unwrap();
    let value = pattern(5000, 3);
    let store = io.kv(
        nvme::KvCommand::Store {
            key,
            value_size: 5000,
            options: Default::default(),
        },
        1,
        2,
        5000,
    );
    let slot = match io.receive(store) {
        Received::NeedData {
            slot,
            len: 5000,
            dir: DataDirection::HostToController,
        } => slot,
        other => panic!("expected a host data request, got {other:?}"),
    };
    // NVMe/RDMA READs the value into a buffer of the exact length it placed.
    let mut placed = IoBuf::new(5000);
    placed.set_len(5000);
    placed.copy_from_slice(&value);
    io.q.request_mut(slot).unwrap().buf = Some(placed);
    io.data_ready(slot, false);
    assert_eq!(io.wait_one().status(), Status::SUCCESS);
    // Retrieve into an 8 KiB host buffer the transport places: the value is
    // copied there (the device read whole blocks into its own buffer).
    let get = io.kv(
        nvme::KvCommand::Retrieve {
            key,
            host_buffer_size: 8192,
            raw: false,
        },
        2,
        2,
        8192,
    );
    let slot = match io.receive(get) {
        Received::NeedData {
            slot,
            len: 8192,
            dir: DataDirection::ControllerToHost,
        } => slot,
        other => panic!("expected a read buffer request, got {other:?}"),
    };
    let placed = IoBuf::new(8192);
    let at = placed.as_ptr() as usize;
    io.q.request_mut(slot).unwrap().buf = Some(placed);
    io.data_ready(slot, false);
    let r = io.wait_one();
    assert_eq!(r.status(), Status::SUCCESS);
    assert_eq!(r.cqe.result, 5000, "DW0: the value's size");
    assert_eq!(r.data, value);
    assert_eq!(r.data_ptr, Some(at), "sent from the placed buffer");
    // A miss, and nothing left in flight.
    let miss = io.kv(
        nvme::KvCommand::Retrieve {
            key: nvme::KvKey::new(b"nope").unwrap(),
            host_buffer_size: 4096,
            raw: false,
        },
        3,
        2,
        4096,
    );
    if let Received::NeedData { slot, .. } = io.receive(miss) {
        io.q.request_mut(slot).unwrap().buf = Some(IoBuf::new(4096));
        io.data_ready(slot, false);
    }
    assert_eq!(io.wait_one().status(), Status::KV_KEY_DOES_NOT_EXIST);
    assert_eq!(io.q.dev_ops(), 0);
}

#[test]
fn kv_namespace_refuses_io_from_a_controller_that_enabled_only_nvm() {
    let e = env();
    let _pool = e.add_pool_kv_ns(2, 4 << 20);
    // CC.CSS = 000b: the KV namespace is not active for this controller.
    let (_a, io) = e.pair();
    let mut io = io;
    let s = io.kv(
        nvme::KvCommand::Exist {
            key: nvme::KvKey::new(b"k").unwrap(),
        },
        1,
        2,
        0,
    );
    assert_eq!(io.exec(s).status(), Status::IOCS_NOT_ENABLED);
    // The NVM namespace beside it works.
    assert_eq!(io.read(2, 1, 0, 1).status(), Status::SUCCESS);
}

/// A namespace removed while a Retrieve reads and a Store writes: both still
/// finish in the key index they started in, so the Store's reserved blocks
/// and the Retrieve's pin are not leaked into the volume's index (which
/// outlives the namespace and may be served again).
#[test]
fn kv_commands_release_the_index_when_their_namespace_goes() {
    let e = env();
    let pool = e.add_pool_kv_ns(2, 4 << 20);
    let ix = pool.volume("c").and_then(|v| v.kv.clone()).unwrap();
    let (_a, cntlid) = e.admin_cc(CC_ENABLE_ALL_IOCS);
    let mut io = e.io_with(rdma_cfg(1), cntlid, 1);
    let k1 = nvme::KvKey::new(b"read-me").unwrap();
    let k2 = nvme::KvKey::new(b"write-me").unwrap();
    let per = 5000u64.div_ceil(ix.block_size() as u64);
    let start_store = |io: &mut Conn, key, cid| {
        let store = io.kv(
            nvme::KvCommand::Store {
                key,
                value_size: 5000,
                options: Default::default(),
            },
            cid,
            2,
            5000,
        );
        let Received::NeedData { slot, .. } = io.receive(store) else {
            panic!("no data request for the Store");
        };
        let mut placed = IoBuf::new(5000);
        placed.set_len(5000);
        placed.copy_from_slice(&pattern(5000, cid as u8));
        io.q.request_mut(slot).unwrap().buf = Some(placed);
        io.data_ready(slot, false);
    };
    start_store(&mut io, k1, 1);
    assert_eq!(io.wait_one().status(), Status::SUCCESS);
    // A Retrieve of k1 and a Store of k2 reach the device; then the
    // namespace goes.
    let get = io.kv(
        nvme::KvCommand::Retrieve {
            key: k1,
            host_buffer_size: 8192,
            raw: false,
        },
        2,
        2,
        8192,
    );
    let Received::NeedData { slot, .. } = io.receive(get) else {
        panic!("no buffer request for the Retrieve");
    };
    io.q.request_mut(slot).unwrap().buf = Some(IoBuf::new(8192));
    io.data_ready(slot, false);
    start_store(&mut io, k2, 3);
    assert!(e.subsys.remove_namespace(2).is_some());
    // The queue's table lets go of it before the device answers.
    assert_eq!(io.housekeeping(), None);
    assert!(io.q.ns.get(2).is_none());
    let mut answered = 0;
    for _ in 0..5000 {
        io.poll();
        answered += std::mem::take(&mut io.link.sent).len();
        if answered == 2 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(answered, 2, "both commands answered");
    // The Store either made it into the index or gave its blocks back.
    let s = ix.snapshot();
    assert!(
        (s.keys, s.used_blocks) == (2, 2 * per) || (s.keys, s.used_blocks) == (1, per),
        "{s:?}"
    );
    // The Retrieve's pin is gone: k1's blocks, given up, wait for a commit
    // instead of for a reader that will never finish.
    let before = s.pending_free_blocks;
    assert_eq!(ix.delete(&k1, std::time::Instant::now()), Ok(()));
    assert_eq!(ix.snapshot().pending_free_blocks, before + per);
    assert!(ix.verify().is_empty());
}
