//! The NVMe/RDMA queue pair: its QP and registered memory (`RdmaLink`), the
//! transport's part of each request (`RdmaReq`), posting work requests and
//! handling their completions, under the transport-neutral queue core.

use super::error::RdmaError;
use super::mr::{BufferBudget, MemoryKeys};
use super::poller::PollGroup;
use super::verbs::{self, ibv_mr, ibv_qp, rdma_cm_id, rdma_event_channel, Verbs};
use super::EXTRA_RESPONSES;
use kvt_mem::IoBuf;
use kvt_nvmf::queue::{
    C2h, Capsule, DataDesc, Link, Queue, QueueConfig, Received, Release, Request, Response,
    TransportKind,
};
use kvt_nvmf::{Target, ADMIN_IN_CAPSULE_DATA};
use kvt_reactor::{IoCtx, QueuePair};
use kvt_wire::nvme::{Cqe, DataDirection, Sqe, Status, CQE_LEN, SQE_LEN};
use kvt_wire::rdma::{self as rwire, cm_status, DataDescriptor};
use std::any::Any;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A connection not established within this long is dropped.
const ESTABLISH_TIMEOUT: Duration = Duration::from_secs(10);
/// A closed QP waits this long for its flushed completions before it is
/// destroyed anyway (a device that never flushes must not pin it forever; a
/// late completion is then dropped by the qp_num route and generation checks).
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    /// Accepted, waiting for ESTABLISHED.
    Connecting,
    Live,
    /// Disconnected or failed: no more sends; waiting for device I/O.
    Closed,
}

/// What happens to a responding slot when `ibv_post_send` refused part of its
/// chain (a data WRITE, when `chained`, then the response SEND).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotAfterFailedPost {
    /// Nothing of it reached the QP: free it now.
    Free,
    /// The WRITE is on the QP and reads the slot's memory until it completes.
    AwaitWrite,
}

fn slot_after_failed_post(chained: bool, posted: u32) -> SlotAfterFailedPost {
    if chained && posted > 0 {
        SlotAfterFailedPost::AwaitWrite
    } else {
        SlotAfterFailedPost::Free
    }
}

/// NVMe/RDMA's part of a request: where its data is and the registered
/// memory it moves through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum XState {
    /// Nothing of the transport's in progress.
    #[default]
    Idle,
    /// Waiting for buffer budget.
    AwaitBuffer,
    /// Waiting for an RDMA READ slot (outstanding reads are bounded).
    AwaitRead,
    /// RDMA READ of host data in flight.
    Reading,
    /// Data WRITE and response SEND posted; released on the SEND completion.
    Responding,
    /// The data WRITE was posted but its SEND was refused (the QP is closing):
    /// the WRITE may still be reading the slot's buffer, so the slot is
    /// released on the WRITE's own completion (success or flush), not before.
    WriteOrphaned,
}

#[derive(Debug, Default)]
pub struct RdmaReq {
    state: XState,
    desc: DataDescriptor,
    /// Bytes charged to the reactor's `BufferBudget` for this request.
    held: usize,
    /// The lkey of the data buffer (`buf`), found when it was given.
    lkey: u32,
    /// The data `Received::NeedData` asked for.
    need: Option<(usize, DataDirection)>,
}

/// Work request ids: kind in the top byte, the QP's generation in bits
/// 16..48, the slot or buffer index in the low 16 bits. The generation tells a
/// QP's own completions from those of an earlier QP whose qp_num the device
/// recycled (the shared CQ outlives QPs).
mod wr {
    pub const RECV: u64 = 1 << 56;
    pub const READ: u64 = 2 << 56;
    pub const WRITE: u64 = 3 << 56;
    pub const SEND: u64 = 4 << 56;
    pub const SEND_EXTRA: u64 = 5 << 56;
    pub const KIND: u64 = 0xFF << 56;

    pub fn id(kind: u64, gen: u32, index: u16) -> u64 {
        kind | (gen as u64) << 16 | index as u64
    }
    pub fn gen(wr_id: u64) -> u32 {
        (wr_id >> 16) as u32
    }
    pub fn index(wr_id: u64) -> u16 {
        wr_id as u16
    }
}

/// QP generations, one per QP this process creates (0 is never used).
static NEXT_QP_GEN: AtomicU32 = AtomicU32::new(1);

/// The RDMA side of a queue: the QP, its registered memory, posting.
pub(super) struct RdmaLink {
    v: &'static Verbs,
    pub(super) id: *mut rdma_cm_id,
    qp: *mut ibv_qp,
    /// `qp->qp_num`: the route of this QP's completions on the shared CQ.
    qp_num: u32,
    /// This QP's generation, carried in every wr_id it posts.
    gen: u32,
    /// The reactor's poll group this QP's sends and receives complete on.
    group: Arc<PollGroup>,
    /// CQ entries reserved in `group` (released on Drop).
    cq_reserved: u32,
    /// Work requests posted and not yet completed: a closed QP is destroyed
    /// only when this is 0 (all flushed back), or after FLUSH_TIMEOUT.
    wrs_outstanding: u32,
    closed_at: Option<Instant>,
    flush_given_up: bool,
    /// The slot answering a Fabrics Disconnect: its SEND's completion closes.
    disconnect_after: Option<u16>,
    chan: *mut rdma_event_channel,
    /// Receive buffers then response capsules, registered as `mem_mr`.
    mem: IoBuf,
    mem_mr: *mut ibv_mr,
    mem_lkey: u32,
    recv_size: usize,
    depth: usize,
    /// The reactor's buffer budget for this QP's device: its key in
    /// `IoCtx::locals`.
    budget_key: u64,
    /// The lkeys of I/O buffer memory on this QP's device.
    keys: Arc<MemoryKeys>,
    extra_free: Vec<u16>,
    pub(super) peer: String,
    pub(super) state: State,
    since: Instant,
    max_reads: u32,
    reads_active: u32,
    read_waiting: VecDeque<u16>,
    buf_waiting: VecDeque<u16>,
    shutting_down: bool,
    /// Still being built: Drop rejects the connection request first.
    building: bool,
}

pub struct RdmaQueuePair {
    pub(super) q: Queue<RdmaReq>,
    pub(super) l: RdmaLink,
}

// SAFETY: the rdma-core objects are owned by this queue pair alone and used by
// whichever single thread owns it (the CM thread while building it, then its
// reactor); rdma-core objects may be used from any thread.
unsafe impl Send for RdmaQueuePair {}

/// The transport-neutral form of an NVMe/RDMA data descriptor.
fn neutral(desc: DataDescriptor) -> DataDesc {
    match desc {
        DataDescriptor::None => DataDesc::None,
        DataDescriptor::InCapsule { offset, len } => DataDesc::InCapsule { offset, len },
        DataDescriptor::Keyed { len, .. } => DataDesc::Host { len },
    }
}

/// The queue's configuration for an RDMA connection request.
fn queue_config(
    peer: String,
    local: SocketAddr,
    discovery_only: bool,
    cm_qid: u16,
    depth: usize,
) -> QueueConfig {
    QueueConfig {
        kind: TransportKind::Rdma,
        peer,
        local: Some(local),
        discovery_only,
        expected_qid: Some(cm_qid),
        // Slot indices name response buffers: at most `depth` of them.
        max_entries: Some(depth),
        exact_capsule: false,
        places_read_buffers: true,
    }
}

/// A new queue pair's generation: never 0, so a work request's ID never
/// matches a queue pair that is not there.
fn next_gen() -> u32 {
    NEXT_QP_GEN
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |g| {
            Some(g.wrapping_add(1).max(1))
        })
        .unwrap_or(1)
}

impl RdmaLink {
    /// Makes the link's verbs resources on `pd`: its event channel (the cm_id
    /// migrated to it), its QP on the poll group's `cq` with `send_wr` send
    /// entries, its registered receive and response memory, and a posted
    /// receive per slot.
    fn build(
        &mut self,
        pd: *mut std::ffi::c_void,
        cq: *mut verbs::ibv_cq,
        send_wr: usize,
    ) -> Result<(), RdmaError> {
        let l = self;
        // SAFETY: every pointer below is checked before use and stored in `l`,
        // whose owner's Drop destroys each exactly once in reverse order. The
        // CQ is the poll group's, which lives for the process.
        unsafe {
            l.chan = (l.v.rdma_create_event_channel)();
            if l.chan.is_null() {
                return Err(RdmaError::QpEventChannel(std::io::Error::last_os_error()));
            }
            if (l.v.rdma_migrate_id)(l.id, l.chan) != 0 {
                return Err(RdmaError::MigrateId(std::io::Error::last_os_error()));
            }
            let mut attr = verbs::ibv_qp_init_attr {
                qp_context: std::ptr::null_mut(),
                send_cq: cq,
                recv_cq: cq,
                srq: std::ptr::null_mut(),
                cap: verbs::ibv_qp_cap {
                    max_send_wr: send_wr as u32,
                    max_recv_wr: l.depth as u32,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                qp_type: verbs::IBV_QPT_RC,
                sq_sig_all: 0,
            };
            if (l.v.rdma_create_qp)(l.id, pd, &mut attr) != 0 {
                return Err(RdmaError::CreateQp(std::io::Error::last_os_error()));
            }
            l.qp = (*l.id).qp;
            l.qp_num = (*l.qp).qp_num;
            l.mem_mr = (l.v.ibv_reg_mr)(
                pd,
                l.mem.as_mut_ptr() as *mut _,
                l.mem.capacity(),
                verbs::IBV_ACCESS_LOCAL_WRITE,
            );
            if l.mem_mr.is_null() {
                return Err(RdmaError::RegRecvBuffers {
                    bytes: l.mem.capacity(),
                    source: std::io::Error::last_os_error(),
                });
            }
            l.mem_lkey = (*l.mem_mr).lkey;
        }
        for i in 0..l.depth {
            l.post_recv(i)
                .map_err(|errno| RdmaError::PostRecv { errno })?;
        }
        // SAFETY: chan is live (created above).
        verbs::set_nonblocking(unsafe { (*l.chan).fd }).map_err(RdmaError::QpNonblocking)?;
        Ok(())
    }
}

impl RdmaQueuePair {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn create(
        v: &'static Verbs,
        id: *mut rdma_cm_id,
        pd: *mut std::ffi::c_void,
        group: Arc<PollGroup>,
        cq_reserved: u32,
        depth: usize,
        send_wr: usize,
        target: Arc<Target>,
        (budget_key, keys): (u64, Arc<MemoryKeys>),
        peer: String,
        local: SocketAddr,
        discovery_only: bool,
        cm_qid: u16,
        max_reads: u32,
    ) -> Result<RdmaQueuePair, RdmaError> {
        let lim = &target.limits;
        let icd = (lim.in_capsule_data as usize).max(ADMIN_IN_CAPSULE_DATA as usize);
        let recv_size = (SQE_LEN + icd).div_ceil(64) * 64;
        let rsp_count = depth + EXTRA_RESPONSES;
        let mem = IoBuf::new(depth * recv_size + rsp_count * CQE_LEN);
        let cq = group.cq;
        let cfg = queue_config(peer.clone(), local, discovery_only, cm_qid, depth);
        // From here on `q` owns the id and the CQ reservation: its Drop
        // releases whatever was made.
        let mut q = RdmaQueuePair {
            q: Queue::new(target, cfg),
            l: RdmaLink {
                v,
                id,
                qp: std::ptr::null_mut(),
                qp_num: 0,
                gen: next_gen(),
                group,
                cq_reserved,
                wrs_outstanding: 0,
                closed_at: None,
                flush_given_up: false,
                disconnect_after: None,
                chan: std::ptr::null_mut(),
                mem,
                mem_mr: std::ptr::null_mut(),
                mem_lkey: 0,
                recv_size,
                depth,
                budget_key,
                keys,
                extra_free: (depth..rsp_count).map(|i| i as u16).rev().collect(),
                peer,
                state: State::Connecting,
                since: Instant::now(),
                max_reads,
                reads_active: 0,
                read_waiting: VecDeque::new(),
                buf_waiting: VecDeque::new(),
                shutting_down: false,
                building: true,
            },
        };
        q.l.build(pd, cq, send_wr)?;
        q.l.building = false;
        Ok(q)
    }

    /// Ends the connection: the QP errors out, the controller binding ends.
    fn close(&mut self, why: &str) {
        self.l.close(why);
        self.q.unbind();
    }

    /// The link closed on its own (a post failed, the host went): the queue
    /// lets go of its controller too.
    fn sync_closed(&mut self) {
        if self.l.state == State::Closed {
            self.q.unbind();
        }
    }

    fn on_completion(&mut self, wc: &verbs::ibv_wc, ctx: &mut IoCtx) {
        let kind = wc.wr_id & wr::KIND;
        let idx = wr::index(wc.wr_id);
        if wc.status != verbs::IBV_WC_SUCCESS {
            if wc.status != verbs::IBV_WC_WR_FLUSH_ERR {
                tracing::warn!(peer = %self.l.peer, qid = self.q.qid(), status = wc.status, kind = kind >> 56, "RDMA work request failed");
            }
            self.close("work request failed");
            // Release what the failed request held.
            match kind {
                wr::READ => {
                    self.l.reads_active = self.l.reads_active.saturating_sub(1);
                    self.q.abandon(idx, &mut self.l, ctx);
                }
                wr::SEND => self.q.release(idx, &mut self.l, ctx),
                wr::SEND_EXTRA => self.l.extra_free.push(idx),
                wr::WRITE => self.release_orphaned_write(idx, ctx),
                _ => {}
            }
            return;
        }
        match kind {
            wr::RECV => {
                let len = wc.byte_len as usize;
                self.on_capsule(idx as usize, len, ctx);
                if self.l.state != State::Closed {
                    if let Err(e) = self.l.post_recv(idx as usize) {
                        tracing::warn!(peer = %self.l.peer, "ibv_post_recv: errno {e}");
                        self.close("cannot repost a receive");
                    }
                }
            }
            wr::READ => {
                self.l.reads_active = self.l.reads_active.saturating_sub(1);
                if let Some(r) = self.q.request_mut(idx) {
                    r.x.state = XState::Idle;
                }
                self.issue_reads();
                self.q.data_ready(idx, false, &mut self.l, ctx);
            }
            wr::WRITE => self.release_orphaned_write(idx, ctx),
            wr::SEND => {
                self.q.release(idx, &mut self.l, ctx);
                if self.l.disconnect_after == Some(idx) {
                    // The Disconnect's response reached the host: now the QP
                    // goes (NVMe-oF: the queue is deleted after the response).
                    self.l.disconnect_after = None;
                    return self.close("host sent a Fabrics Disconnect");
                }
                self.retry_buffers(ctx);
            }
            wr::SEND_EXTRA => self.l.extra_free.push(idx),
            _ => tracing::warn!(wr_id = wc.wr_id, "completion of an unknown work request"),
        }
    }

    /// A WRITE whose SEND never went out has finished with the slot's memory.
    fn release_orphaned_write(&mut self, slot: u16, ctx: &mut IoCtx) {
        let orphaned = self
            .q
            .request(slot)
            .is_some_and(|r| r.x.state == XState::WriteOrphaned);
        if orphaned {
            self.q.release(slot, &mut self.l, ctx);
        }
    }

    fn on_capsule(&mut self, idx: usize, len: usize, ctx: &mut IoCtx) {
        let l = &mut self.l;
        if len < SQE_LEN || len > l.recv_size {
            tracing::warn!(peer = %l.peer, len, "command capsule of a bad size");
            return self.close("bad capsule size");
        }
        if l.state == State::Connecting {
            // Receives can complete before ESTABLISHED is read: it is implied.
            l.state = State::Live;
        }
        let base = idx * l.recv_size;
        let Some(sqe) = Sqe::from_slice(&l.mem[base..base + SQE_LEN]) else {
            return self.close("bad capsule");
        };
        l.group.requests.fetch_add(1, Ordering::Relaxed);
        let desc = DataDescriptor::of(&sqe);
        // The receive buffer is reposted only after this returns: the core
        // copies in-capsule data out of it before then.
        let icd = l.mem.as_ptr() as usize + base + SQE_LEN;
        // SAFETY: `icd..icd + len - SQE_LEN` lies inside `mem` (len <=
        // recv_size, checked above); nothing writes that receive buffer until
        // it is reposted after this call, and the link writes `mem` during
        // `receive` only through `write_response`, a slice over the response
        // area, disjoint from every receive buffer.
        let icd = unsafe { std::slice::from_raw_parts(icd as *const u8, len - SQE_LEN) };
        let capsule = Capsule {
            sqe: &sqe,
            desc: desc.map(neutral),
            icd,
            icd_corrupt: false,
            // Answers are written to the host memory the descriptor names.
            x: RdmaReq {
                desc: desc.unwrap_or_default(),
                ..RdmaReq::default()
            },
        };
        match self.q.receive(capsule, &mut self.l, ctx) {
            Received::Done => {}
            Received::Overrun => self.close("queue overrun"),
            Received::NeedData { slot, len, dir } => {
                if let Some(r) = self.q.request_mut(slot) {
                    r.x.need = Some((len, dir));
                }
                self.with_buffer(slot, ctx);
            }
        }
        self.sync_closed();
    }

    /// Gives the request the buffer it needs from the reactor's pool, then
    /// continues it (RDMA READ for host data, execution for reads); waits if
    /// the reactor's budget for this device is spent.
    fn with_buffer(&mut self, slot: u16, ctx: &mut IoCtx) {
        let Some((len, dir)) = self.q.request(slot).and_then(|r| r.x.need) else {
            return;
        };
        let Some(budget) = ctx.locals.get_mut::<BufferBudget>(self.l.budget_key) else {
            // Installed before any QP of the reactor is adopted: never missing.
            tracing::error!(peer = %self.l.peer, "RDMA buffer budget missing on this reactor");
            return self.q.fail(slot, Status::INTERNAL_ERROR, &mut self.l, ctx);
        };
        if !budget.fits(len) {
            if let Some(r) = self.q.request_mut(slot) {
                r.x.state = XState::AwaitBuffer;
            }
            self.l.buf_waiting.push_back(slot);
            return;
        }
        let buf = ctx.bufs.get(len);
        let Some(lkey) = self.l.keys.lkey(buf.as_ptr(), buf.len()) else {
            // Registration of this memory failed (logged when it did).
            ctx.bufs.put(buf);
            return self.q.fail(slot, Status::INTERNAL_ERROR, &mut self.l, ctx);
        };
        let Some(r) = self.q.request_mut(slot) else {
            ctx.bufs.put(buf);
            return;
        };
        budget.take(len);
        r.x.held = len;
        r.x.lkey = lkey;
        r.buf = Some(buf);
        if dir == DataDirection::HostToController {
            r.x.state = XState::AwaitRead;
            self.l.read_waiting.push_back(slot);
            self.issue_reads();
        } else {
            r.x.state = XState::Idle;
            self.q.data_ready(slot, false, &mut self.l, ctx);
        }
    }

    /// Requests waiting for buffer budget retry (some was given back).
    fn retry_buffers(&mut self, ctx: &mut IoCtx) {
        while let Some(&slot) = self.l.buf_waiting.front() {
            let Some((len, _)) = self.q.request(slot).and_then(|r| r.x.need) else {
                self.l.buf_waiting.pop_front();
                continue;
            };
            let fits = ctx
                .locals
                .get_mut::<BufferBudget>(self.l.budget_key)
                .is_some_and(|b| b.fits(len));
            if !fits {
                return;
            }
            self.l.buf_waiting.pop_front();
            self.with_buffer(slot, ctx);
        }
    }

    /// Posts RDMA READs for waiting requests while under the negotiated limit.
    fn issue_reads(&mut self) {
        let l = &mut self.l;
        while l.reads_active < l.max_reads && l.state != State::Closed {
            let Some(slot) = l.read_waiting.pop_front() else {
                return;
            };
            let Some(r) = self.q.request_mut(slot) else {
                continue;
            };
            let DataDescriptor::Keyed { addr, key, len, .. } = r.x.desc else {
                continue;
            };
            let Some(b) = r.buf.as_mut() else {
                continue;
            };
            let mut sge = verbs::ibv_sge {
                addr: b.as_mut_ptr() as u64,
                length: len,
                lkey: r.x.lkey,
            };
            let mut w = verbs::ibv_send_wr {
                wr_id: wr::id(wr::READ, l.gen, slot),
                sg_list: &mut sge,
                num_sge: 1,
                opcode: verbs::IBV_WR_RDMA_READ,
                send_flags: verbs::IBV_SEND_SIGNALED,
                remote_addr: addr,
                rkey: key,
                ..Default::default()
            };
            r.x.state = XState::Reading;
            // SAFETY: qp is live; the local buffer is registered memory (its
            // lkey was found for it) owned by this request until its completion.
            let (e, posted) = unsafe { verbs::post_send(l.qp, &mut w) };
            l.count_sends(posted);
            if e != 0 {
                tracing::warn!(peer = %l.peer, "RDMA READ post failed: errno {e}");
                l.close("cannot post an RDMA READ");
                return;
            }
            l.reads_active += 1;
        }
    }

    fn fail_waiting(&mut self, ctx: &mut IoCtx) {
        // Requests parked for memory or READ slots on a closed QP release now.
        while let Some(s) = self
            .l
            .buf_waiting
            .pop_front()
            .or_else(|| self.l.read_waiting.pop_front())
        {
            self.q.abandon(s, &mut self.l, ctx);
        }
    }
}

impl RdmaLink {
    fn post_recv(&mut self, i: usize) -> Result<(), i32> {
        let mut sge = verbs::ibv_sge {
            addr: self.mem.as_ptr() as u64 + (i * self.recv_size) as u64,
            length: self.recv_size as u32,
            lkey: self.mem_lkey,
        };
        let mut wr = verbs::ibv_recv_wr {
            wr_id: wr::id(wr::RECV, self.gen, i as u16),
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        // SAFETY: qp is live; the buffer is inside the registered `mem`, which
        // lives as long as the QP.
        match unsafe { verbs::post_recv(self.qp, &mut wr) } {
            0 => {
                self.wrs_outstanding += 1;
                self.group.recv_wrs.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            e => Err(e),
        }
    }

    /// The QP goes to the error state (outstanding work is flushed back to
    /// the shared CQ, and counted down before the QP may be destroyed) and the
    /// host sees a disconnect.
    fn close(&mut self, why: &str) {
        if self.state == State::Closed {
            return;
        }
        tracing::debug!(peer = %self.peer, "RDMA queue pair closing: {why}");
        // SAFETY: qp and id are live until Drop. ERR first: rdma_disconnect
        // alone does not move a QP that never connected.
        unsafe {
            if !self.qp.is_null() {
                verbs::modify_qp_to_error(self.v, self.qp);
            }
            (self.v.rdma_disconnect)(self.id);
        }
        self.closed_at = Some(Instant::now());
        self.state = State::Closed;
    }

    fn drain_cm_events(&mut self) {
        loop {
            let mut ev: *mut verbs::rdma_cm_event = std::ptr::null_mut();
            // SAFETY: chan is live, non-blocking.
            if unsafe { (self.v.rdma_get_cm_event)(self.chan, &mut ev) } != 0 || ev.is_null() {
                return;
            }
            // SAFETY: ev is live until acked, acked once.
            let kind = unsafe {
                let k = (*ev).event;
                (self.v.rdma_ack_cm_event)(ev);
                k
            };
            match kind {
                verbs::cm_event::ESTABLISHED => {
                    if self.state == State::Connecting {
                        self.state = State::Live;
                        self.since = Instant::now();
                    }
                }
                verbs::cm_event::DISCONNECTED => self.close("host disconnected"),
                verbs::cm_event::DEVICE_REMOVAL => self.close("device removed"),
                verbs::cm_event::CONNECT_ERROR
                | verbs::cm_event::UNREACHABLE
                | verbs::cm_event::REJECTED => self.close("connection failed"),
                verbs::cm_event::TIMEWAIT_EXIT | verbs::cm_event::ADDR_CHANGE => {}
                k => tracing::debug!(peer = %self.peer, event = k, "RDMA CM event"),
            }
        }
    }

    /// Encodes `cqe` into response buffer `i` (past the receive buffers);
    /// returns its address for the SEND.
    fn write_response(&mut self, i: usize, cqe: &Cqe) -> u64 {
        let off = self.depth * self.recv_size + i * CQE_LEN;
        if off + CQE_LEN > self.mem.len() {
            return self.mem.as_ptr() as u64;
        }
        // SAFETY: off..off + CQE_LEN is inside `mem` (checked above) and in
        // its response area, which no receive buffer overlaps; a slice over
        // those bytes alone never aliases a receive buffer's in-capsule data,
        // which the core may be reading while it answers (`on_capsule`).
        let dst =
            unsafe { std::slice::from_raw_parts_mut(self.mem.as_mut_ptr().add(off), CQE_LEN) };
        cqe.encode(dst);
        self.mem.as_ptr() as u64 + off as u64
    }

    fn count_sends(&mut self, posted: u32) {
        self.wrs_outstanding += posted;
        self.group
            .send_wrs
            .fetch_add(posted as u64, Ordering::Relaxed);
    }

    /// Gives a request's budget back (its buffer goes back to the pool with
    /// the slot, in the core).
    fn give_budget(&self, r: &mut RdmaReq, ctx: &mut IoCtx) {
        let held = std::mem::take(&mut r.held);
        if held > 0 {
            if let Some(b) = ctx.locals.get_mut::<BufferBudget>(self.budget_key) {
                b.give(held);
            }
        }
    }
}

/// Data in registered memory here: (address, length, lkey).
type LocalData = (u64, u32, u32);
/// A host buffer: (address, rkey, length).
type RemoteData = (u64, u32, u32);

impl RdmaLink {
    /// Where the response's controller-to-host data comes from: (address,
    /// length, lkey) of registered memory, admin replies copied to a buffer
    /// first (they are small and not charged to the budget). None without
    /// data; an unregistered buffer sets Internal Error in `cqe`.
    #[inline]
    fn c2h_source(
        &mut self,
        r: &mut Request<RdmaReq>,
        rsp: &Response,
        ctx: &mut IoCtx,
        cqe: &mut Cqe,
    ) -> Option<LocalData> {
        // Controller-to-host data: admin replies go to a registered buffer
        // first (they are small and not charged to the budget).
        let mut write = None;
        match rsp.c2h {
            C2h::Reply => {
                let reply = r.reply.take().unwrap_or_default();
                let mut v = match r.buf.take() {
                    Some(b) if b.capacity() >= reply.len() => b,
                    old => {
                        if let Some(b) = old.filter(|b| b.is_owned()) {
                            ctx.bufs.put(b);
                        }
                        ctx.bufs.get(reply.len())
                    }
                };
                v.set_len(reply.len());
                v.copy_from_slice(&reply);
                match self.keys.lkey(v.as_ptr(), v.len()) {
                    Some(lkey) => write = Some((v.as_ptr() as u64, reply.len() as u32, lkey)),
                    None => cqe.status = Status::INTERNAL_ERROR.to_field(),
                }
                r.buf = Some(v);
            }
            C2h::Data(len) => {
                if let Some(b) = r.buf.as_ref() {
                    match self.keys.lkey(b.as_ptr(), len) {
                        Some(lkey) => write = Some((b.as_ptr() as u64, len as u32, lkey)),
                        None => cqe.status = Status::INTERNAL_ERROR.to_field(),
                    }
                }
            }
            C2h::None => {}
        }
        write
    }

    /// Posts the response capsule (`rsp_addr`) by SEND, invalidating
    /// `key_inv` if set, after an RDMA WRITE of `data` ((address, length,
    /// lkey) here, (address, rkey, length) at the host) if there is data.
    /// Returns ibv_post_send's errno and how many WRs it posted.
    #[inline]
    fn post_response(
        &mut self,
        slot: u16,
        rsp_addr: u64,
        key_inv: Option<u32>,
        data: Option<(LocalData, RemoteData)>,
    ) -> (i32, u32) {
        let mut rsp_sge = verbs::ibv_sge {
            addr: rsp_addr,
            length: CQE_LEN as u32,
            lkey: self.mem_lkey,
        };
        let mut send = verbs::ibv_send_wr {
            wr_id: wr::id(wr::SEND, self.gen, slot),
            sg_list: &mut rsp_sge,
            num_sge: 1,
            opcode: verbs::IBV_WR_SEND,
            send_flags: verbs::IBV_SEND_SIGNALED,
            ..Default::default()
        };
        if let Some(k) = key_inv {
            send.opcode = verbs::IBV_WR_SEND_WITH_INV;
            send.invalidate_rkey = k;
        }
        let mut data_sge = verbs::ibv_sge::default();
        let mut wwr = verbs::ibv_send_wr::default();
        let first: *mut verbs::ibv_send_wr = match data {
            Some(((local, len, lkey), (raddr, rkey, rlen))) => {
                data_sge = verbs::ibv_sge {
                    addr: local,
                    length: len.min(rlen),
                    lkey,
                };
                wwr = verbs::ibv_send_wr {
                    wr_id: wr::id(wr::WRITE, self.gen, slot),
                    sg_list: &mut data_sge,
                    num_sge: 1,
                    opcode: verbs::IBV_WR_RDMA_WRITE,
                    send_flags: verbs::IBV_SEND_SIGNALED,
                    remote_addr: raddr,
                    rkey,
                    next: &mut send,
                    ..Default::default()
                };
                &mut wwr
            }
            _ => &mut send,
        };
        let _ = (&data_sge, &wwr);
        // SAFETY: qp is live; every sge points into registered memory (`mem`
        // or the slot's buffer) held by this slot until the SEND completes; the WR
        // chain lives on this stack frame for the call.
        unsafe { verbs::post_send(self.qp, first) }
    }
}

impl Link<RdmaReq> for RdmaLink {
    /// RDMA WRITE of the data (reads and admin replies, on success), then the
    /// response capsule by SEND. The slot is released when the SEND completes.
    /// `#[inline]` for the reason TCP's is.
    #[inline]
    fn respond(
        &mut self,
        slot: u16,
        r: &mut Request<RdmaReq>,
        rsp: &Response,
        ctx: &mut IoCtx,
    ) -> Release {
        match r.x.state {
            XState::AwaitRead => self.read_waiting.retain(|&s| s != slot),
            XState::AwaitBuffer => self.buf_waiting.retain(|&s| s != slot),
            _ => {}
        }
        if self.state == State::Closed {
            return Release::Now;
        }
        let mut cqe = rsp.cqe;
        let write = self.c2h_source(r, rsp, ctx, &mut cqe);
        let (key_inv, remote) = match r.x.desc {
            DataDescriptor::Keyed {
                addr,
                key,
                invalidate,
                len,
            } => (invalidate.then_some(key), Some((addr, key, len))),
            _ => (None, None),
        };
        let rsp_addr = self.write_response(slot as usize, &cqe);
        r.x.state = XState::Responding;
        if rsp.close_after {
            self.disconnect_after = Some(slot);
        }
        let ok = cqe.status == Status::SUCCESS.to_field();
        let data = write.zip(remote).filter(|_| ok);
        let (e, posted) = self.post_response(slot, rsp_addr, key_inv, data);
        self.count_sends(posted);
        if e == 0 {
            return Release::Later;
        }
        tracing::warn!(peer = %self.peer, "ibv_post_send: errno {e}");
        self.close("cannot post a send");
        let chained = data.is_some();
        match slot_after_failed_post(chained, posted) {
            SlotAfterFailedPost::AwaitWrite => {
                r.x.state = XState::WriteOrphaned;
                Release::Later
            }
            SlotAfterFailedPost::Free => Release::Now,
        }
    }

    /// A response with no slot (CID conflict, an AER firing), from the extra
    /// response buffers.
    fn respond_unslotted(&mut self, cqe: &Cqe) {
        if self.state == State::Closed {
            return;
        }
        let Some(i) = self.extra_free.pop() else {
            tracing::warn!(peer = %self.peer, cid = cqe.cid, "no response buffer free; closing");
            return self.close("response buffers exhausted");
        };
        let addr = self.write_response(i as usize, cqe);
        let mut sge = verbs::ibv_sge {
            addr,
            length: CQE_LEN as u32,
            lkey: self.mem_lkey,
        };
        let mut s = verbs::ibv_send_wr {
            wr_id: wr::id(wr::SEND_EXTRA, self.gen, i),
            sg_list: &mut sge,
            num_sge: 1,
            opcode: verbs::IBV_WR_SEND,
            send_flags: verbs::IBV_SEND_SIGNALED,
            ..Default::default()
        };
        // SAFETY: qp is live; sge points into registered `mem`.
        let (e, posted) = unsafe { verbs::post_send(self.qp, &mut s) };
        self.count_sends(posted);
        if e != 0 {
            self.extra_free.push(i);
            tracing::warn!(peer = %self.peer, "ibv_post_send: errno {e}");
            self.close("cannot post a send");
        }
    }

    fn discard(&mut self, slot: u16, r: &mut Request<RdmaReq>, ctx: &mut IoCtx) {
        // The core puts the buffer back in the pool; the budget is ours.
        self.give_budget(&mut r.x, ctx);
        match r.x.state {
            XState::AwaitRead => self.read_waiting.retain(|&s| s != slot),
            XState::AwaitBuffer => self.buf_waiting.retain(|&s| s != slot),
            _ => {}
        }
    }
}

impl QueuePair for RdmaQueuePair {
    fn fd(&self) -> RawFd {
        // The CM event channel (established, disconnected); completions come
        // through the reactor's shared poller.
        // SAFETY: chan is live until Drop (a QP is handed over only built).
        unsafe { (*self.l.chan).fd }
    }

    fn on_readable(&mut self, ctx: &mut IoCtx) {
        self.l.drain_cm_events();
        self.sync_closed();
        if self.l.state == State::Closed {
            self.fail_waiting(ctx);
        }
    }

    fn route(&self) -> Option<(u64, u64)> {
        Some((self.l.group.id, self.l.qp_num as u64))
    }

    fn on_polled(&mut self, event: &dyn Any, ctx: &mut IoCtx) {
        if let Some(a) = event.downcast_ref::<kvt_pool::kv_index::KvAnswered>() {
            self.q.kv_answer(a.slot, a.answer.take(), &mut self.l, ctx);
            self.sync_closed();
            return;
        }
        let Some(wc) = event.downcast_ref::<verbs::ibv_wc>() else {
            return;
        };
        if wr::gen(wc.wr_id) != self.l.gen {
            // An earlier QP's completion under a recycled qp_num: not ours.
            tracing::debug!(peer = %self.l.peer, qp_num = wc.qp_num, wr_id = wc.wr_id, "completion of an earlier queue pair dropped");
            self.l.group.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.l.wrs_outstanding = self.l.wrs_outstanding.saturating_sub(1);
        self.on_completion(wc, ctx);
        self.sync_closed();
        if self.l.state == State::Closed {
            self.fail_waiting(ctx);
        }
    }

    fn on_io_complete(
        &mut self,
        slot: u16,
        result: Result<(), i32>,
        buf: Option<IoBuf>,
        ctx: &mut IoCtx,
    ) {
        self.q.io_complete(slot, result, buf, &mut self.l, ctx);
        self.sync_closed();
    }

    fn flush(&mut self, _bufs: &mut kvt_mem::BufPool) -> bool {
        // Work requests are posted as they are made: nothing is buffered.
        false
    }

    fn housekeeping(&mut self, ctx: &mut IoCtx) {
        if self.l.state == State::Connecting && self.l.since.elapsed() > ESTABLISH_TIMEOUT {
            self.close("not established in time");
        }
        if let Some(why) = self.q.housekeeping(&mut self.l, ctx) {
            self.close(why);
        }
        if self.l.state != State::Closed {
            self.retry_buffers(ctx);
        } else {
            self.fail_waiting(ctx);
            let l = &mut self.l;
            if let Some(t) = l.closed_at {
                if l.wrs_outstanding > 0
                    && !l.flush_given_up
                    && ctx.now.saturating_duration_since(t) > FLUSH_TIMEOUT
                {
                    tracing::warn!(peer = %l.peer, outstanding = l.wrs_outstanding, "RDMA work requests not flushed in time; destroying the queue pair anyway");
                    l.flush_given_up = true;
                }
            }
        }
        if self.l.shutting_down && self.q.dev_ops() == 0 {
            self.close("target shutting down");
        }
        self.sync_closed();
    }

    fn begin_shutdown(&mut self) {
        self.l.shutting_down = true;
        if self.q.dev_ops() == 0 {
            self.close("target shutting down");
        }
    }

    fn finished(&self) -> bool {
        self.l.state == State::Closed
            && self.q.dev_ops() == 0
            && (self.l.wrs_outstanding == 0 || self.l.flush_given_up)
    }

    fn describe(&self) -> String {
        format!("nvme/rdma {} qid {}", self.l.peer, self.q.qid())
    }

    fn release(&mut self, ctx: &mut IoCtx) {
        // Finished: every work request flushed back (or given up on, and the
        // QP is destroyed right after, before anything else runs here), so no
        // DMA reaches these buffers any more.
        let l = &self.l;
        for r in self.q.requests_mut() {
            l.give_budget(&mut r.x, ctx);
            if let Some(b) = r.buf.take().filter(|b| b.is_owned()) {
                ctx.bufs.put(b);
            }
        }
    }
}

/// Rejects the connection request on `id` with the NVMe/RDMA status `sts`
/// (in the REJ's private data): by the CM thread before a QP takes the cm_id,
/// by the QP's Drop after.
pub(super) fn reject(v: &Verbs, id: *mut rdma_cm_id, sts: u16) {
    let rej = rwire::encode_reject(sts);
    // SAFETY: id is a live, not yet accepted cm_id; the private data outlives
    // the call.
    unsafe { (v.rdma_reject)(id, rej.as_ptr() as *const _, rej.len() as u8) };
}

impl Drop for RdmaQueuePair {
    fn drop(&mut self) {
        self.q.unbind();
        let l = &mut self.l;
        let v = l.v;
        if l.building {
            reject(v, l.id, cm_status::NO_RESOURCES);
        }
        // SAFETY: each object was created in `create` (NULL when not reached)
        // and is destroyed once, QP first so no DMA touches memory freed after.
        // The shared CQ stays (the poll group's).
        unsafe {
            if !l.qp.is_null() {
                (v.rdma_destroy_qp)(l.id);
            }
            if !l.mem_mr.is_null() {
                (v.ibv_dereg_mr)(l.mem_mr);
            }
            (v.rdma_destroy_id)(l.id);
            if !l.chan.is_null() {
                (v.rdma_destroy_event_channel)(l.chan);
            }
        }
        // No completion of this QP can come any more (flushed, or dropped by
        // route when late): its CQ entries go back to the group.
        l.group.release(l.cq_reserved);
        // Buffers and budget went back in `release`; a QP dropped without it
        // (never adopted) holds none.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_posted_write_keeps_its_slot_until_it_completes() {
        use SlotAfterFailedPost::*;
        // WRITE went, SEND refused: the WRITE still reads the slot's buffer.
        assert_eq!(slot_after_failed_post(true, 1), AwaitWrite);
        // Nothing posted, or a lone SEND refused: nothing reads the slot.
        assert_eq!(slot_after_failed_post(true, 0), Free);
        assert_eq!(slot_after_failed_post(false, 0), Free);
    }

    #[test]
    fn wr_ids_carry_kind_generation_and_index() {
        let id = wr::id(wr::SEND, 0xDEAD_BEEF, 0xFFFF);
        assert_eq!(id & wr::KIND, wr::SEND);
        assert_eq!(wr::gen(id), 0xDEAD_BEEF);
        assert_eq!(wr::index(id), 0xFFFF);
        // A recycled qp_num with another generation is told apart.
        assert_ne!(
            wr::gen(wr::id(wr::RECV, 2, 3)),
            wr::gen(wr::id(wr::RECV, 1, 3))
        );
    }
}
