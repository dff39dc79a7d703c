//! One submission queue of a controller, as every transport runs it.
//!
//! A `Queue` owns what NVMe says a queue has: command identifiers, request slots
//! and their state, the SQ head, the binding to its controller, the namespaces it
//! sees, dispatch (Connect, Property Get/Set, Disconnect, admin and I/O commands)
//! and accounting. A transport keeps only what differs between transports: it
//! turns its capsule into an `Sqe` and a `DataDesc`, moves data in and out, and
//! sends responses. It calls the core once per command (`receive`) and, when the
//! data it was asked for is in place, once more (`data_ready`); the core answers
//! every command through one callback, `Link::respond`.
//!
//! `X` is the transport's own per-request state (R2T windows, RDMA keys and
//! registered chunks), kept in the slot next to the core's.

use super::admin::{self, AdminOutcome};
use super::auth::QueueAuth;
use super::command::{self, DeviceOps, Transfer};
use super::fabrics::{self, QueueBinding};
use super::io::{self, IoEnv, IoPlan, Outcome};
use super::ns_table::NsTable;
pub use super::request::{Handler, Phase, Request};
use super::reservation::HostId;
use super::{QpairStats, Target, ADMIN_IN_CAPSULE_DATA};
use kvt_mem::IoBuf;
use kvt_reactor::IoCtx;
use kvt_wire::nvme::{admin_opc, fctype, Cqe, DataDirection, Sqe, Status};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// Status for a command whose data arrived corrupt (a failed data digest): the
/// host retries it (Transient Transport Error).
pub const TRANSIENT_TRANSPORT_ERROR: Status = Status::generic(0x22);

/// The fabric a queue runs over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TransportKind {
    #[default]
    Tcp,
    Rdma,
}

impl TransportKind {
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Tcp => "tcp",
            TransportKind::Rdma => "rdma",
        }
    }
}

/// What a transport tells the core about the connection a queue runs on.
#[derive(Debug, Clone)]
pub struct QueueConfig {
    pub kind: TransportKind,
    pub peer: String,
    pub local: Option<SocketAddr>,
    /// A discovery-only listener (port 8009): Connect to an NVM subsystem is refused.
    pub discovery_only: bool,
    /// The QID the transport's own connection setup named (RDMA CM private
    /// data): Connect must name the same one.
    pub expected_qid: Option<u16>,
    /// Queue entries the transport has room for (RDMA receive and response
    /// buffers); a Connect asking for more is refused, and slot indices stay below.
    pub max_entries: Option<usize>,
    /// In-capsule data arrives exactly as long as its capsule (NVMe/TCP PDUs);
    /// otherwise the receive may be longer than the data (NVMe/RDMA buffers).
    pub exact_capsule: bool,
    /// Reads need a buffer the transport places (NVMe/RDMA: registered memory),
    /// so they too go through `Received::NeedData` before they run.
    pub places_read_buffers: bool,
}

/// A command's data descriptor in transport-neutral terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataDesc {
    None,
    /// Data in the capsule, at `offset` (which must be 0).
    InCapsule {
        offset: u64,
        len: u32,
    },
    /// Data that stays with the host until the transport moves it (NVMe/TCP
    /// R2T and C2HData, NVMe/RDMA READ and WRITE).
    Host {
        len: u32,
    },
}

impl DataDesc {
    pub fn len(&self) -> u32 {
        match *self {
            DataDesc::None => 0,
            DataDesc::InCapsule { len, .. } | DataDesc::Host { len } => len,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The data a response carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum C2h {
    None,
    /// The first `n` bytes of the request's `buf` (read data).
    Data(usize),
    /// The request's `reply` (admin data).
    Reply,
}

/// A command's answer, for the transport to send.
#[derive(Debug, Clone, Copy)]
pub struct Response {
    pub cqe: Cqe,
    pub status: Status,
    pub c2h: C2h,
    /// Fabrics Disconnect: the queue closes once this response is out.
    pub close_after: bool,
}

/// Whether a responded slot can be reused at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    Now,
    /// The transport still uses the slot's resources (an RDMA SEND in flight):
    /// it calls `Queue::release` when done.
    Later,
}

/// What the core needs from a transport.
pub trait Link<X> {
    /// Sends `rsp` for the command in `slot`, with its data when `rsp.c2h` says.
    fn respond(
        &mut self,
        slot: u16,
        req: &mut Request<X>,
        rsp: &Response,
        ctx: &mut IoCtx,
    ) -> Release;
    /// Sends a response for a command that has no slot (CID conflict, an AER).
    fn respond_unslotted(&mut self, cqe: &Cqe);
    /// A slot is being freed: release the transport's part of it. The core
    /// returns owned buffers to the pool itself.
    fn discard(&mut self, slot: u16, req: &mut Request<X>, ctx: &mut IoCtx);
}

/// A command capsule as a transport hands it to the core.
pub struct Capsule<'a, X> {
    pub sqe: &'a Sqe,
    /// Its data descriptor, or the status the transport's decoding of it
    /// failed with.
    pub desc: Result<DataDesc, Status>,
    /// In-capsule data (NVMe/RDMA: the rest of the receive buffer).
    pub icd: &'a [u8],
    /// The in-capsule data failed its digest.
    pub icd_corrupt: bool,
    /// The transport's state for the request, from the start (NVMe/RDMA: the
    /// keyed descriptor its answer is written to).
    pub x: X,
}

/// What the transport does next with a command it passed to `receive`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// Nothing: the core runs or has answered it.
    Done,
    /// Move `len` bytes: host data into the request's buffer (`HostToController`),
    /// or place a buffer the read data can leave from (`ControllerToHost`).
    /// Then `data_ready`.
    NeedData {
        slot: u16,
        len: usize,
        dir: DataDirection,
    },
    /// More commands outstanding than the queue has entries: a protocol error
    /// the transport answers by ending the connection.
    Overrun,
}

/// Which command IDs are outstanding, to refuse duplicates.
struct CidSet(Vec<u64>);

impl CidSet {
    fn new() -> CidSet {
        CidSet(vec![0; 1024])
    }
    fn insert(&mut self, cid: u16) -> bool {
        let (w, b) = (cid as usize / 64, cid % 64);
        let fresh = self.0[w] & (1 << b) == 0;
        self.0[w] |= 1 << b;
        fresh
    }
    fn remove(&mut self, cid: u16) {
        self.0[cid as usize / 64] &= !(1 << (cid % 64));
    }
    fn contains(&self, cid: u16) -> bool {
        self.0[cid as usize / 64] & (1 << (cid % 64)) != 0
    }
}

/// The SQ size a queue assumes before Connect sets it.
pub(crate) const DEFAULT_SQSIZE: u16 = 31;

pub struct Queue<X> {
    pub(crate) target: Arc<Target>,
    pub(crate) cfg: QueueConfig,
    pub(crate) binding: Option<QueueBinding>,
    pub(crate) ns: NsTable,
    pub(crate) stats: Option<Arc<QpairStats>>,
    pub(crate) sq_head: u16,
    pub(crate) sqsize: u16,
    pub(crate) sqflow_disabled: bool,
    pub(crate) slots: Vec<Option<Request<X>>>,
    pub(crate) free_slots: Vec<u16>,
    cids: CidSet,
    /// Held Asynchronous Event Requests, by CID, oldest first.
    pub(crate) aers: Vec<u16>,
    pub(crate) dev_ops: usize,
    /// Failed device operations (for rate-limited logging).
    pub(crate) device_errors: command::DeviceErrors,
    /// Reused for every command's device operations (no allocation per I/O).
    pub(crate) ops_scratch: DeviceOps,
    /// The DH-HMAC-CHAP transaction of this queue, while one runs (and after it
    /// succeeded, until the host starts another).
    pub(crate) auth: Option<QueueAuth>,
    /// False from a Connect that asked for authentication until it succeeded:
    /// only Authentication Send/Receive are let through.
    pub(crate) authenticated: bool,
    /// The secure channel this queue runs over, if any (NVMe/TCP TLS).
    pub(crate) secure: Option<crate::fabrics::SecurePeer>,
    /// Whether the controller enabled the KV command set (CC.CSS), read at the
    /// first I/O command: CC.CSS changes only while the controller is
    /// disabled, and disabling it ends its I/O queues.
    pub(crate) kv_enabled: Option<bool>,
    /// A Connect waiting for its queue ID to be let go (slot, give-up time).
    pub(crate) held_connect: Option<(u16, Instant)>,
    /// Reservation commands answered once their PTPL write is durable
    /// (slot, CID, what to wait for).
    pub(crate) ptpl_waits: Vec<(u16, u16, super::reservation::ptpl::PtplWait)>,
    /// This queue's host's reservation verdicts per namespace (the access
    /// check without a lock).
    pub(crate) resv_cache: io::reservation::ResvCache,
}

impl<X> Queue<X> {
    pub fn new(target: Arc<Target>, cfg: QueueConfig) -> Queue<X> {
        Queue {
            target,
            cfg,
            binding: None,
            ns: NsTable::default(),
            stats: None,
            sq_head: 0,
            sqsize: DEFAULT_SQSIZE,
            sqflow_disabled: false,
            slots: Vec::new(),
            free_slots: Vec::new(),
            cids: CidSet::new(),
            aers: Vec::new(),
            dev_ops: 0,
            device_errors: command::DeviceErrors::default(),
            ops_scratch: Vec::with_capacity(4),
            auth: None,
            authenticated: true,
            secure: None,
            kv_enabled: None,
            held_connect: None,
            ptpl_waits: Vec::new(),
            resv_cache: io::reservation::ResvCache::default(),
        }
    }

    /// The transport opened a secure channel for this queue (or none): Connect
    /// checks the host and subsystem against it.
    pub fn set_secure_peer(&mut self, peer: Option<crate::fabrics::SecurePeer>) {
        self.secure = peer;
    }

    pub fn qid(&self) -> u16 {
        match &self.binding {
            Some(b) => b.qid(),
            None => self.cfg.expected_qid.unwrap_or(0),
        }
    }

    /// Admin queue, or not yet connected (only Connect is accepted then).
    pub fn is_admin(&self) -> bool {
        matches!(self.binding, Some(QueueBinding::Admin(_)) | None)
    }

    pub fn binding(&self) -> Option<&QueueBinding> {
        self.binding.as_ref()
    }

    pub fn peer(&self) -> &str {
        &self.cfg.peer
    }

    pub fn limits(&self) -> &super::TransportLimits {
        &self.target.limits
    }

    /// Device operations outstanding.
    pub fn dev_ops(&self) -> usize {
        self.dev_ops
    }

    /// Whether `cid` belongs to a command the queue still holds.
    pub fn cid_outstanding(&self, cid: u16) -> bool {
        self.cids.contains(cid)
    }

    pub fn request(&self, slot: u16) -> Option<&Request<X>> {
        self.slots.get(slot as usize).and_then(|s| s.as_ref())
    }

    pub fn request_mut(&mut self, slot: u16) -> Option<&mut Request<X>> {
        self.slots.get_mut(slot as usize).and_then(|s| s.as_mut())
    }

    /// Every request in a slot (for a transport tearing down).
    pub fn requests_mut(&mut self) -> impl Iterator<Item = &mut Request<X>> {
        self.slots.iter_mut().flatten()
    }

    pub fn cqe(&self, cid: u16, status: Status, result: u64) -> Cqe {
        Cqe {
            result,
            sq_head: if self.sqflow_disabled {
                0xFFFF
            } else {
                self.sq_head
            },
            sq_id: self.qid(),
            cid,
            status: status.to_field(),
        }
    }

    /// Slots a queue may use: its entries, or all the transport has room for
    /// (NVMe/RDMA holds a slot until its SEND completes, which the host may
    /// not wait for before it sends the next command).
    pub fn slot_limit(&self) -> usize {
        self.cfg.max_entries.unwrap_or(self.sqsize as usize + 1)
    }

    /// A free slot (empty), if the queue has one.
    /// Every slot the queue's depth allows, made and written now (Connect,
    /// the cold path): a burst deeper than any before then takes a free slot
    /// instead of growing the table on the reactor (an allocation and a page
    /// fault).
    pub(crate) fn make_slots(&mut self) {
        let limit = self.slot_limit().min(u16::MAX as usize + 1);
        let made = self.slots.len();
        if limit > made {
            self.slots.resize_with(limit, || None);
            self.free_slots.reserve(limit);
            // Highest first: `vacant_slot` pops the lowest.
            self.free_slots
                .extend((made..limit).rev().map(|i| i as u16));
        }
    }

    fn vacant_slot(&mut self) -> Option<u16> {
        match self.free_slots.pop() {
            Some(i) => Some(i),
            None if self.slots.len() < self.slot_limit() => {
                self.slots.push(None);
                Some((self.slots.len() - 1) as u16)
            }
            None => None,
        }
    }

    fn advance_sq_head(&mut self) {
        self.sq_head = if self.sq_head >= self.sqsize {
            0
        } else {
            self.sq_head + 1
        };
    }

    /// Picks up namespaces added or removed at run time (one atomic load when
    /// nothing changed).
    fn refresh_namespaces(&mut self) {
        if let Some(b) = self.binding.as_ref() {
            let subsys = &b.ctrl().subsys;
            let gen = subsys.ns_gen.load(Ordering::Acquire);
            if gen != self.ns.gen {
                self.ns.load(gen, subsys.namespace_snapshot());
                self.reserve_resv_cache();
            }
        }
    }

    /// Room in the reservation cache for every namespace of the table.
    pub(crate) fn reserve_resv_cache(&mut self) {
        let top = self.ns.all().iter().map(|n| n.nsid).max().unwrap_or(0);
        self.resv_cache.reserve(top);
    }

    /// A command capsule arrived.
    pub fn receive<L: Link<X>>(
        &mut self,
        capsule: Capsule<'_, X>,
        link: &mut L,
        ctx: &mut IoCtx,
    ) -> Received {
        let now_ns = ctx.now_ns;
        self.receive_at(capsule, now_ns, link, ctx)
    }

    /// `receive` for a command the transport held since `arrived_ns` (its
    /// latency counts from then). `#[inline]`, as `io_complete`: each
    /// transport's crate instantiates them, and inlined into its receive and
    /// completion steps they cost a 4 KiB read 40 instructions less each
    /// (callgrind), as when the core and the transports were one crate.
    #[inline]
    pub fn receive_at<L: Link<X>>(
        &mut self,
        capsule: Capsule<'_, X>,
        arrived_ns: u64,
        link: &mut L,
        ctx: &mut IoCtx,
    ) -> Received {
        let Capsule {
            sqe,
            desc,
            icd,
            icd_corrupt,
            x,
        } = capsule;
        let cid = sqe.cid();
        self.advance_sq_head();
        if !self.cids.insert(cid) && !admin::abandon_held_aer(&mut self.aers, cid) {
            // The host reused an outstanding CID: answer without disturbing the
            // command that owns it.
            tracing::warn!(peer = %self.cfg.peer, cid, "command id conflict");
            link.respond_unslotted(&self.cqe(cid, Status::CID_CONFLICT, 0));
            return Received::Done;
        }
        let Some(slot) = self.vacant_slot() else {
            self.cids.remove(cid);
            tracing::warn!(peer = %self.cfg.peer, qid = self.qid(), "more commands outstanding than the queue size");
            return Received::Overrun;
        };
        // Built in its slot: a request is a few hundred bytes.
        self.slots[slot as usize] = Some(Request {
            sqe: *sqe,
            phase: Phase::Executing,
            buf: None,
            reply: None,
            plan: None,
            handler: None,
            pending_ops: 0,
            status: Status::SUCCESS,
            data_error: icd_corrupt,
            arrived_ns,
            kv: None,
            x,
        });
        match self.admit(slot, sqe, desc, icd, ctx) {
            Ok(None) => {
                self.execute(slot, false, link, ctx);
                Received::Done
            }
            Ok(Some((len, dir))) => {
                if let Some(r) = self.request_mut(slot) {
                    r.phase = Phase::Moving;
                }
                Received::NeedData { slot, len, dir }
            }
            Err(status) => {
                self.finish(slot, status, 0, link, ctx);
                Received::Done
            }
        }
    }

    /// Checks a command and its data descriptor before any data moves (so a
    /// bad write never costs a data transfer), and takes in-capsule data.
    /// Returns the data the transport must move first, if any.
    fn admit(
        &mut self,
        slot: u16,
        sqe: &Sqe,
        desc: Result<DataDesc, Status>,
        icd: &[u8],
        ctx: &mut IoCtx,
    ) -> Result<Option<(usize, DataDirection)>, Status> {
        let (handler, plan) = self.parse(sqe, ctx.now)?;
        if let Some(r) = self.request_mut(slot) {
            r.handler = Some(handler);
            r.plan = plan;
        }
        self.admit_data(slot, sqe, desc?, plan, icd, ctx)
    }

    /// The parse step of this queue's kind (Linux nvmet's
    /// `nvmet_req_init`): which handler runs `sqe`, and for an I/O command
    /// its checked plan. Before Connect only Connect is let in, and before
    /// DH-HMAC-CHAP succeeded only Authentication Send/Receive.
    fn parse(&mut self, sqe: &Sqe, now: Instant) -> Result<(Handler, Option<IoPlan>), Status> {
        let is_fabrics = sqe.opcode() == admin_opc::FABRICS;
        if self.binding.is_none() && !(is_fabrics && sqe.fctype() == fctype::CONNECT) {
            return Err(Status::COMMAND_SEQUENCE_ERROR);
        }
        self.check_authenticated(sqe)?;
        if sqe.fuse() != 0 {
            return Err(Status::INVALID_FIELD);
        }
        if is_fabrics {
            return Ok((Handler::Fabrics, None));
        }
        if self.is_admin() {
            return Ok((Handler::Admin, None));
        }
        let (handler, plan) = self.parse_io(sqe, now)?;
        Ok((handler, Some(plan)))
    }

    /// The parse step of an I/O queue: the namespace's command set picks the
    /// handler (`io::parse`).
    fn parse_io(&mut self, sqe: &Sqe, now: Instant) -> Result<(Handler, IoPlan), Status> {
        self.refresh_namespaces();
        let kv_enabled = *self.kv_enabled.get_or_insert_with(|| {
            self.binding.as_ref().is_some_and(|b| {
                b.ctrl().enabled_command_sets()
                    & kvt_wire::nvme::csi_bit(kvt_wire::nvme::csi::KEY_VALUE)
                    != 0
            })
        });
        let write_cache = !self
            .binding
            .as_ref()
            .is_some_and(|b| !b.ctrl().write_cache.load(Ordering::Relaxed));
        let ns = self.ns.get(sqe.nsid()).map(|n| &**n);
        // ANA: a path that cannot serve the namespace's group answers with
        // a Path Related status before anything runs.
        if let (Some(b), Some(n)) = (self.binding.as_ref(), ns) {
            if let Some(st) = super::ana::io_status(b.ctrl(), n, now) {
                return Err(st);
            }
        }
        let (handler, plan) = io::parse(
            ns,
            sqe,
            self.target.limits.max_io_size,
            kv_enabled,
            write_cache,
        )?;
        if let Some(b) = self.binding.as_ref() {
            let host = HostId::extended(b.ctrl().hostid);
            self.resv_cache.check(ns, &plan, &host)?;
        }
        Ok((handler, plan))
    }

    /// Checks a command's data descriptor against its direction and plan,
    /// and takes in-capsule data.
    fn admit_data(
        &mut self,
        slot: u16,
        sqe: &Sqe,
        desc: DataDesc,
        plan: Option<IoPlan>,
        icd: &[u8],
        ctx: &mut IoCtx,
    ) -> Result<Option<(usize, DataDirection)>, Status> {
        if desc.len() > self.target.limits.max_io_size.max(ADMIN_IN_CAPSULE_DATA) {
            return Err(Status::DATA_SGL_LENGTH_INVALID);
        }
        match DataDirection::of(sqe) {
            DataDirection::None => Ok(None),
            DataDirection::Bidirectional => Err(Status::INVALID_FIELD),
            DataDirection::ControllerToHost => self.admit_c2h(desc, plan, icd),
            DataDirection::HostToController => self.admit_h2c(slot, desc, plan, icd, ctx),
        }
    }

    /// Controller-to-host data: never in the capsule; a read's descriptor
    /// covers its blocks, and a transport that places read buffers is asked
    /// for one first.
    fn admit_c2h(
        &self,
        desc: DataDesc,
        plan: Option<IoPlan>,
        icd: &[u8],
    ) -> Result<Option<(usize, DataDirection)>, Status> {
        if matches!(desc, DataDesc::InCapsule { .. }) {
            return Err(Status::SGL_DESCRIPTOR_TYPE_INVALID);
        }
        if self.cfg.exact_capsule && !icd.is_empty() {
            return Err(Status::INVALID_FIELD);
        }
        let places = self.cfg.places_read_buffers;
        match plan {
            Some(IoPlan::Read { len, .. }) => {
                if (desc.len() as usize) < len {
                    return Err(Status::DATA_SGL_LENGTH_INVALID);
                }
                if places {
                    return Ok(Some((len, DataDirection::ControllerToHost)));
                }
            }
            Some(IoPlan::KvRetrieve { buf, .. }) if places && buf > 0 => {
                return Ok(Some((buf as usize, DataDirection::ControllerToHost)));
            }
            _ => {}
        }
        Ok(None)
    }

    /// Host-to-controller data: a write's is exactly its blocks; in-capsule
    /// data is copied out at once, other data is moved first.
    fn admit_h2c(
        &mut self,
        slot: u16,
        desc: DataDesc,
        plan: Option<IoPlan>,
        icd: &[u8],
        ctx: &mut IoCtx,
    ) -> Result<Option<(usize, DataDirection)>, Status> {
        if matches!(plan, Some(IoPlan::Write { len, .. }) if desc.len() as usize != len) {
            // The data must be the blocks written, no more, no less.
            return Err(Status::DATA_SGL_LENGTH_INVALID);
        }
        match desc {
            DataDesc::None => Ok(None),
            DataDesc::InCapsule { offset, len } => {
                self.take_in_capsule(slot, offset, len as usize, icd, ctx)?;
                Ok(None)
            }
            DataDesc::Host { len } => {
                if self.cfg.exact_capsule && !icd.is_empty() {
                    return Err(Status::INVALID_FIELD);
                }
                Ok(Some((len as usize, DataDirection::HostToController)))
            }
        }
    }

    /// Copies in-capsule data out of the transport's receive buffer (reused
    /// at once) into the request's.
    fn take_in_capsule(
        &mut self,
        slot: u16,
        offset: u64,
        len: usize,
        icd: &[u8],
        ctx: &mut IoCtx,
    ) -> Result<(), Status> {
        let limit = if self.is_admin() {
            ADMIN_IN_CAPSULE_DATA
        } else {
            self.target.limits.in_capsule_data
        };
        if offset != 0 {
            return Err(Status::SGL_OFFSET_INVALID);
        }
        let fits = if self.cfg.exact_capsule {
            icd.len() == len
        } else {
            icd.len() >= len
        };
        if len > limit as usize || !fits {
            return Err(Status::DATA_SGL_LENGTH_INVALID);
        }
        let mut b = ctx.bufs.get(len);
        b.copy_from_slice(&icd[..len]);
        if let Some(r) = self.request_mut(slot) {
            r.buf = Some(b);
        }
        Ok(())
    }

    /// The data `receive` asked for is in place (`corrupt`: it failed its
    /// digest): the command runs.
    pub fn data_ready<L: Link<X>>(
        &mut self,
        slot: u16,
        corrupt: bool,
        link: &mut L,
        ctx: &mut IoCtx,
    ) {
        match self.request_mut(slot) {
            Some(r) if r.phase == Phase::Moving => r.data_error |= corrupt,
            _ => return,
        }
        self.execute(slot, true, link, ctx);
    }

    /// Fails a command the transport cannot carry on with (before it runs).
    pub fn fail<L: Link<X>>(&mut self, slot: u16, status: Status, link: &mut L, ctx: &mut IoCtx) {
        self.finish(slot, status, 0, link, ctx);
    }

    /// Runs a checked command; `moved`: its data moved first (time passed
    /// since it was checked).
    fn execute<L: Link<X>>(&mut self, slot: u16, moved: bool, link: &mut L, ctx: &mut IoCtx) {
        if let Err(status) = self.try_execute(slot, moved, link, ctx) {
            self.finish(slot, status, 0, link, ctx);
        }
    }

    fn try_execute<L: Link<X>>(
        &mut self,
        slot: u16,
        moved: bool,
        link: &mut L,
        ctx: &mut IoCtx,
    ) -> Result<(), Status> {
        let r = self
            .slots
            .get_mut(slot as usize)
            .and_then(|s| s.as_mut())
            .ok_or(Status::INTERNAL_ERROR)?;
        if r.data_error {
            return Err(TRANSIENT_TRANSPORT_ERROR);
        }
        r.phase = Phase::Executing;
        let (sqe, handler) = (r.sqe, r.handler.ok_or(Status::INTERNAL_ERROR)?);
        if handler == Handler::Fabrics {
            return self.execute_fabrics(slot, &sqe, link, ctx);
        }
        let ctrl = match self.binding.as_ref() {
            Some(b) => b.ctrl().clone(),
            None => return Err(Status::COMMAND_SEQUENCE_ERROR),
        };
        match handler {
            Handler::Nvm | Handler::Kv | Handler::Reservation => {
                self.execute_io(slot, handler, moved, link, ctx);
                Ok(())
            }
            _ => self.execute_admin(slot, &sqe, &ctrl, link, ctx),
        }
    }

    fn execute_admin<L: Link<X>>(
        &mut self,
        slot: u16,
        sqe: &Sqe,
        ctrl: &Arc<super::Controller>,
        link: &mut L,
        ctx: &mut IoCtx,
    ) -> Result<(), Status> {
        if !ctrl.is_ready() && sqe.opcode() != admin_opc::KEEP_ALIVE {
            return Err(Status::COMMAND_SEQUENCE_ERROR);
        }
        match admin::execute(&self.target, ctrl, sqe, self.aers.len(), ctx.now) {
            AdminOutcome::AsyncEventHeld => {
                // Held without a slot: it completes only when an event fires.
                // Its CID stays outstanding, so a host reusing it is noticed
                // (`receive` abandons the held AER then).
                self.free_slot(slot, link, ctx);
                self.cids.insert(sqe.cid());
                self.aers.push(sqe.cid());
            }
            AdminOutcome::Done {
                status,
                result,
                data,
            } => {
                if let (Some(mut d), Some(r)) = (data, self.request_mut(slot)) {
                    d.truncate(sqe.sgl().length as usize);
                    r.reply = Some(d);
                }
                self.finish(slot, status, result as u64, link, ctx);
            }
        }
        Ok(())
    }

    fn execute_fabrics<L: Link<X>>(
        &mut self,
        slot: u16,
        sqe: &Sqe,
        link: &mut L,
        ctx: &mut IoCtx,
    ) -> Result<(), Status> {
        match sqe.fctype() {
            fctype::CONNECT => self.connect(slot, sqe, link, ctx),
            fctype::AUTH_SEND | fctype::AUTH_RECV => {
                self.authenticate(slot, sqe, link, ctx);
                Ok(())
            }
            fctype::PROPERTY_GET | fctype::PROPERTY_SET => {
                let v = fabrics::property(&self.target, self.binding.as_ref(), sqe, ctx.now)?;
                self.finish(slot, Status::SUCCESS, v, link, ctx);
                Ok(())
            }
            fctype::DISCONNECT => {
                // Only meaningful on I/O queues: answered, then the queue closes
                // once the answer is out.
                if self.qid() == 0 {
                    return Err(Status::INVALID_FIELD);
                }
                tracing::info!(peer = %self.cfg.peer, qid = self.qid(), "Fabrics Disconnect: the queue closes after the response");
                // The queue ID is free before the host reads the answer, so it
                // can connect the same ID again at once (closing the connection
                // later frees nothing: the hold is spent).
                if let Some(QueueBinding::Io { ctrl, qid, hold }) = self.binding.as_ref() {
                    ctrl.detach_io_queue(*qid, *hold);
                }
                self.respond(slot, Status::SUCCESS, 0, true, link, ctx);
                Ok(())
            }
            _ => Err(Status::INVALID_OPCODE),
        }
    }

    /// Runs an I/O command by its command set's handler.
    fn execute_io<L: Link<X>>(
        &mut self,
        slot: u16,
        handler: Handler,
        moved: bool,
        link: &mut L,
        ctx: &mut IoCtx,
    ) {
        if moved {
            // A namespace removed while this command's data moved is gone for
            // it too (`admit` refreshed the table when it was checked).
            self.refresh_namespaces();
        }
        let mut env = IoEnv {
            ns: &self.ns,
            ops: &mut self.ops_scratch,
            errors: &mut self.device_errors,
            tag: ctx.tag(slot),
            places_read_buffers: self.cfg.places_read_buffers,
        };
        let Some(r) = self.slots.get_mut(slot as usize).and_then(|s| s.as_mut()) else {
            return;
        };
        let mut ptpl_wait = None;
        let out = match handler {
            Handler::Nvm => io::nvm::execute(r, &mut env, ctx),
            Handler::Kv => io::kv::execute(r, &mut env, ctx),
            Handler::Reservation => match self.binding.as_ref() {
                Some(b) => io::reservation::run(r, &env, b.ctrl()).map(|(o, w)| {
                    ptpl_wait = w.map(|w| (slot, r.sqe.cid(), w));
                    o
                }),
                None => Err(Status::COMMAND_SEQUENCE_ERROR),
            },
            Handler::Fabrics | Handler::Admin => Err(Status::INTERNAL_ERROR),
        };
        if let (Some(w), Ok(_)) = (ptpl_wait, &out) {
            // Answered once the PTPL file holds the change (housekeeping).
            self.ptpl_waits.push(w);
            return;
        }
        self.settle(slot, out, link, ctx);
    }

    /// Answers the reservation commands whose PTPL write is done: success
    /// once durable, Internal Error if the write failed.
    fn answer_ptpl_waits<L: Link<X>>(&mut self, link: &mut L, ctx: &mut IoCtx) {
        let mut i = 0;
        while i < self.ptpl_waits.len() {
            let (slot, cid, w) = &self.ptpl_waits[i];
            let Some(durable) = w.durability.outcome(w.seq) else {
                i += 1;
                continue;
            };
            let (slot, cid) = (*slot, *cid);
            self.ptpl_waits.swap_remove(i);
            // The slot is still this command's (not abandoned and reused).
            let mine = self.request(slot).is_some_and(|r| {
                r.sqe.cid() == cid
                    && r.phase == Phase::Executing
                    && r.handler == Some(Handler::Reservation)
            });
            if mine {
                let status = if durable {
                    Status::SUCCESS
                } else {
                    Status::INTERNAL_ERROR
                };
                self.finish(slot, status, 0, link, ctx);
            }
        }
    }

    /// Acts on what an I/O handler handed back: answer now, or wait for the
    /// device operations it submitted.
    fn settle<L: Link<X>>(
        &mut self,
        slot: u16,
        out: Result<Outcome, Status>,
        link: &mut L,
        ctx: &mut IoCtx,
    ) {
        match out {
            Ok(Outcome::Complete { status, result }) => {
                self.finish(slot, status, result, link, ctx)
            }
            Ok(Outcome::Submitted(sent)) => {
                self.dev_ops += sent.ops as usize;
                if let Some(r) = self.request_mut(slot) {
                    r.pending_ops = sent.ops;
                    if let Some(f) = sent.failure {
                        r.status = f;
                    }
                }
                if sent.ops == 0 {
                    let status = sent.failure.unwrap_or(Status::INTERNAL_ERROR);
                    self.finish(slot, status, 0, link, ctx);
                }
            }
            Err(status) => self.finish(slot, status, 0, link, ctx),
        }
    }

    /// A device operation of `slot` finished: its handler takes it.
    #[inline]
    pub fn io_complete<L: Link<X>>(
        &mut self,
        slot: u16,
        result: Result<(), i32>,
        buf: Option<IoBuf>,
        link: &mut L,
        ctx: &mut IoCtx,
    ) {
        self.dev_ops = self.dev_ops.saturating_sub(1);
        let mut env = IoEnv {
            ns: &self.ns,
            ops: &mut self.ops_scratch,
            errors: &mut self.device_errors,
            tag: ctx.tag(slot),
            places_read_buffers: self.cfg.places_read_buffers,
        };
        let Some(r) = self.slots.get_mut(slot as usize).and_then(|s| s.as_mut()) else {
            if let Some(b) = buf.filter(|b| b.is_owned()) {
                ctx.bufs.put(b);
            }
            return;
        };
        if r.handler == Some(Handler::Kv) {
            if let Some(out) = io::kv::step_done(r, &mut env, result, buf, ctx) {
                self.settle(slot, out, link, ctx);
            }
        } else if io::nvm::complete(r, env.errors, result, buf, ctx) {
            self.finish(slot, Status::SUCCESS, 0, link, ctx);
        }
    }

    /// The key index answered an ask of the KV command in `slot` (from the
    /// reactor that owns it): the command's next step. The ask counted as a
    /// device operation outstanding, so the queue waited for it.
    pub fn kv_answer<L: Link<X>>(
        &mut self,
        slot: u16,
        answer: Option<kvt_pool::kv_index::KvAnswer>,
        link: &mut L,
        ctx: &mut IoCtx,
    ) {
        assert!(self.dev_ops > 0, "a KV answer no command waits for");
        self.dev_ops -= 1;
        let mut env = IoEnv {
            ns: &self.ns,
            ops: &mut self.ops_scratch,
            errors: &mut self.device_errors,
            tag: ctx.tag(slot),
            places_read_buffers: self.cfg.places_read_buffers,
        };
        let Some(r) = self.slots.get_mut(slot as usize).and_then(|s| s.as_mut()) else {
            return;
        };
        if let Some(out) = io::kv::answered(r, &mut env, answer, ctx) {
            self.settle(slot, out, link, ctx);
        }
    }

    pub(crate) fn finish<L: Link<X>>(
        &mut self,
        slot: u16,
        status: Status,
        result: u64,
        link: &mut L,
        ctx: &mut IoCtx,
    ) {
        self.respond(slot, status, result, false, link, ctx);
    }

    /// Completes a command: accounting, then the transport sends its answer.
    pub(crate) fn respond<L: Link<X>>(
        &mut self,
        slot: u16,
        status: Status,
        result: u64,
        close_after: bool,
        link: &mut L,
        ctx: &mut IoCtx,
    ) {
        // In place, field by field: a request is a few hundred bytes, and
        // moving it out and back costs more than the rest of this.
        let qid = self.qid();
        let sq_head = if self.sqflow_disabled {
            0xFFFF
        } else {
            self.sq_head
        };
        let Some(r) = self.slots.get_mut(slot as usize).and_then(|s| s.as_mut()) else {
            return;
        };
        if r.phase == Phase::Responding {
            return;
        }
        let status = if r.status.is_success() {
            status
        } else {
            r.status
        };
        let cid = r.sqe.cid();
        self.cids.remove(cid);
        command::account(
            self.binding.as_ref(),
            self.stats.as_deref(),
            qid,
            &r.sqe,
            r.plan.map_or(Transfer::Other, |p| p.transfer()),
            status,
            ctx.now_ns.saturating_sub(r.arrived_ns),
        );
        let c2h = c2h_for(r, status);
        r.phase = Phase::Responding;
        let rsp = Response {
            cqe: Cqe {
                result,
                sq_head,
                sq_id: qid,
                cid,
                status: status.to_field(),
            },
            status,
            c2h,
            close_after,
        };
        if link.respond(slot, r, &rsp, ctx) == Release::Now {
            // `free_slot` in place (the CID is already released).
            link.discard(slot, r, ctx);
            if let Some(b) = r.buf.take().filter(|b| b.is_owned()) {
                ctx.bufs.put(b);
            }
            self.slots[slot as usize] = None;
            self.free_slots.push(slot);
        }
    }

    /// The transport is done with a responded slot's resources.
    pub fn release<L: Link<X>>(&mut self, slot: u16, link: &mut L, ctx: &mut IoCtx) {
        self.free_slot(slot, link, ctx);
    }

    /// Drops a command without answering it (its connection is gone).
    pub fn abandon<L: Link<X>>(&mut self, slot: u16, link: &mut L, ctx: &mut IoCtx) {
        self.free_slot(slot, link, ctx);
    }

    fn free_slot<L: Link<X>>(&mut self, slot: u16, link: &mut L, ctx: &mut IoCtx) {
        let Some(mut r) = self.slots.get_mut(slot as usize).and_then(|s| s.take()) else {
            return;
        };
        if r.phase != Phase::Responding {
            self.cids.remove(r.sqe.cid());
        }
        link.discard(slot, &mut r, ctx);
        if let Some(b) = r.buf.take().filter(|b| b.is_owned()) {
            ctx.bufs.put(b);
        }
        self.free_slots.push(slot);
    }

    /// Periodic checks: keep-alive, controller failure, namespace changes, and
    /// held AERs completed by events. Returns why the queue must close, if it must.
    pub fn housekeeping<L: Link<X>>(
        &mut self,
        link: &mut L,
        ctx: &mut IoCtx,
    ) -> Option<&'static str> {
        let now = ctx.now;
        self.retry_held_connect(link, ctx);
        self.answer_ptpl_waits(link, ctx);
        // Idle queues also let go of namespaces removed at run time.
        self.refresh_namespaces();
        let b = self.binding.as_ref()?;
        let ctrl = b.ctrl().clone();
        let admin = b.qid() == 0;
        if self.auth.as_ref().is_some_and(|a| a.expired(now)) {
            self.auth = None;
            tracing::warn!(peer = %self.cfg.peer, host = %ctrl.hostnqn, qid = b.qid(), "DH-HMAC-CHAP: the transaction timed out");
            if !self.authenticated {
                self.target.auth_failures.fetch_add(1, Ordering::Relaxed);
                return Some("authentication timed out");
            }
        }
        if admin && !ctrl.is_failed() && ctrl.keep_alive_expired(now) {
            tracing::warn!(
                cntlid = ctrl.cntlid,
                host = %ctrl.hostnqn,
                peer = %self.cfg.peer,
                kato_ms = ctrl.kato_ms.load(Ordering::Relaxed),
                "keep-alive timeout: tearing the controller down"
            );
            ctrl.fail();
        }
        if ctrl.is_failed() {
            return Some("controller failed");
        }
        if admin && ctrl.is_discovery() {
            ctrl.discovery_log_check(self.target.genctr.load(Ordering::Relaxed));
        }
        if admin && !self.aers.is_empty() {
            if let Some(dw0) = ctrl.take_event() {
                let cid = self.aers.remove(0);
                // The command is done: its CID may be reused (the host sends its
                // next AER with the same one).
                self.cids.remove(cid);
                link.respond_unslotted(&self.cqe(cid, Status::SUCCESS, dw0 as u64));
            }
        }
        None
    }

    /// Ends the queue's association with its controller (the connection is
    /// closing); deleting the admin queue deletes the controller.
    pub fn unbind(&mut self) {
        if let Some(b) = self.binding.take() {
            let ctrl = b.ctrl();
            if let Some(st) = self.stats.as_ref() {
                ctrl.retire_queue(st);
            }
            if !self.authenticated && self.auth.as_ref().is_some_and(|a| a.in_progress()) {
                // The host left mid-way or never began (a host without a key,
                // like a Linux host built without NVMe in-band authentication).
                self.target.auth_failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    cntlid = ctrl.cntlid,
                    host = %ctrl.hostnqn,
                    subnqn = %ctrl.subsys.nqn,
                    qid = b.qid(),
                    peer = %self.cfg.peer,
                    "queue closed before it authenticated (DH-HMAC-CHAP required for this host)"
                );
            }
            if b.qid() == 0 {
                tracing::info!(
                    cntlid = ctrl.cntlid,
                    host = %ctrl.hostnqn,
                    subnqn = %ctrl.subsys.nqn,
                    peer = %self.cfg.peer,
                    transport = self.cfg.kind.name(),
                    "controller released"
                );
            }
            fabrics::disconnect(&b);
        }
    }
}

impl<X> Drop for Queue<X> {
    fn drop(&mut self) {
        if let Some(b) = self.binding.take() {
            if let Some(st) = self.stats.as_ref() {
                b.ctrl().retire_queue(st);
            }
            fabrics::disconnect(&b);
        }
    }
}

/// What a command answered with `status` sends to the host: its data (a
/// read's buffer), its reply, or nothing (a failed command's reply is dropped).
#[inline]
fn c2h_for<X>(r: &mut Request<X>, status: Status) -> C2h {
    match (status.is_success(), r.plan.and_then(|p| p.c2h_len())) {
        (false, _) => {
            r.reply = None;
            C2h::None
        }
        (true, Some(n)) if r.buf.is_some() => C2h::Data(n),
        _ if r.reply.as_ref().is_some_and(|d| !d.is_empty()) => C2h::Reply,
        _ => C2h::None,
    }
}
