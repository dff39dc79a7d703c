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
//! per QP. Data for RDMA READ/WRITE comes from a registered arena per (device,
//! reactor), carved into `IoBuf` views that go to the device without a copy.
//! Arenas live as long as the process: a view can never outlive its memory.

pub mod verbs;

use crate::mem::IoBuf;
use crate::nvmf::queue::{
    C2h, DataDesc, Link, Queue, QueueConfig, Received, Release, Request, Response, TransportKind,
};
use crate::nvmf::{Target, ADMIN_IN_CAPSULE_DATA};
use crate::reactor::SharedPoller;
use crate::reactor::{IoCtx, Message, QueuePair, ReactorShared};
use crate::wire::nvme::{Cqe, DataDirection, Sqe, Status, CQE_LEN, SQE_LEN};
use crate::wire::rdma::{self as rwire, cm_status, CmRequest, DataDescriptor};
use std::any::Any;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use verbs::{ibv_comp_channel, ibv_cq, ibv_mr, ibv_qp, rdma_cm_id, rdma_event_channel, Verbs};

/// RDMA sizing, from the `[rdma]` configuration section.
#[derive(Debug, Clone)]
pub struct RdmaSettings {
    /// Registered data memory per reactor and device (bytes).
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

/// Page size of the data arena allocator.
const ARENA_PAGE: usize = 4096;
/// Responses a QP can send that belong to no request slot (CID conflicts, AERs):
/// MAX_AERS (4) plus room for conflicts.
const EXTRA_RESPONSES: usize = 16;
/// A connection not established within this long is dropped.
const ESTABLISH_TIMEOUT: Duration = Duration::from_secs(10);
/// Completions polled per `ibv_poll_cq` call.
const POLL_BATCH: usize = 32;
/// `ibv_poll_cq` calls per reactor pass at most (256 completions): the rest of
/// the loop (devices, sockets) runs between batches.
const POLL_BATCHES_PER_PASS: usize = 8;
/// How long a completion whose QP the reactor has not adopted yet is kept and
/// retried: the CM thread accepts (the host may send at once) just before its
/// Adopt message reaches the reactor, so a first receive can beat it by
/// microseconds. Anything older belongs to no QP and is dropped.
const PARK_TTL: Duration = Duration::from_secs(1);
/// A closed QP waits this long for its flushed completions before it is
/// destroyed anyway (a device that never flushes must not pin it forever; a
/// late completion is then dropped by the qp_num route and generation checks).
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// A registered block carved into page runs.
struct Arena {
    buf: IoBuf,
    /// Registered for the process lifetime (never deregistered).
    _mr: *mut ibv_mr,
    lkey: u32,
    used: Vec<bool>,
    hint: usize,
}

// SAFETY: the arena's memory and MR are only touched under its Mutex; the MR
// pointer is an rdma-core object usable from any thread.
unsafe impl Send for Arena {}

/// A run of arena pages owned by one request.
#[derive(Debug, Clone, Copy)]
struct Chunk {
    page: usize,
    pages: usize,
}

impl Arena {
    fn new(v: &Verbs, pd: *mut std::ffi::c_void, bytes: usize) -> Result<Arena, String> {
        let mut buf = IoBuf::new(bytes);
        // SAFETY: buf's memory is valid for its capacity and is never freed (the
        // arena lives for the process); pd is a live protection domain.
        let mr = unsafe {
            (v.ibv_reg_mr)(
                pd,
                buf.as_mut_ptr() as *mut std::ffi::c_void,
                buf.capacity(),
                verbs::IBV_ACCESS_LOCAL_WRITE,
            )
        };
        if mr.is_null() {
            return Err(format!(
                "cannot register {bytes} bytes of RDMA buffers: {}",
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: mr is a live MR returned just above.
        let lkey = unsafe { (*mr).lkey };
        let pages = buf.capacity() / ARENA_PAGE;
        Ok(Arena {
            buf,
            _mr: mr,
            lkey,
            used: vec![false; pages],
            hint: 0,
        })
    }

    /// A view of `len` bytes in free pages, first fit from a rotating hint.
    fn alloc(&mut self, len: usize) -> Option<(Chunk, IoBuf)> {
        let need = len.max(1).div_ceil(ARENA_PAGE);
        let n = self.used.len();
        if need > n {
            return None;
        }
        let mut start = if self.hint + need <= n { self.hint } else { 0 };
        let mut tried = 0;
        while tried < n {
            if start + need > n {
                tried += n - start;
                start = 0;
                continue;
            }
            match self.used[start..start + need].iter().position(|&u| u) {
                None => {
                    self.used[start..start + need].fill(true);
                    self.hint = start + need;
                    // SAFETY: the pages are now marked used, so no other view
                    // overlaps this one until `free`; the arena memory is never
                    // freed or moved (the arena is kept for the process lifetime).
                    let view = unsafe { IoBuf::view(&mut self.buf, start * ARENA_PAGE, len) }?;
                    return Some((
                        Chunk {
                            page: start,
                            pages: need,
                        },
                        view,
                    ));
                }
                Some(p) => {
                    tried += p + 1;
                    start += p + 1;
                }
            }
        }
        None
    }

    fn free(&mut self, c: Chunk) {
        if let Some(s) = self.used.get_mut(c.page..c.page + c.pages) {
            s.fill(false);
        }
    }
}

/// One RDMA device context as seen by kvtarget: its PD, and per reactor its
/// data arena and poll group.
struct Device {
    ctx: usize,
    name: String,
    pd: usize,
    limits: verbs::DeviceLimits,
    arenas: Vec<Option<Arc<Mutex<Arena>>>>,
    groups: Vec<Option<Arc<PollGroup>>>,
    /// The reactor each group's poller was handed to (a restarted target in
    /// the same process has new reactors: the poller is handed over again).
    pollers: Vec<Weak<ReactorShared>>,
}

static DEVICES: Mutex<Vec<Device>> = Mutex::new(Vec::new());

/// The completion queue one reactor shares among its QPs on one device, with
/// its counters. Like the arenas it lives as long as the process (a CQ is
/// small, and nothing can then complete into a destroyed one).
pub struct PollGroup {
    /// The shared poller's id in its reactor: the device's index.
    id: u64,
    reactor: usize,
    device: String,
    cq: *mut ibv_cq,
    comp: *mut ibv_comp_channel,
    /// Entries the CQ holds; the sum of the QPs' reservations never exceeds it.
    cq_entries: u32,
    /// Entries reserved by live QPs (each: its send queue + receive queue).
    cq_reserved: AtomicU32,
    qpairs: AtomicU32,
    polls: AtomicU64,
    idle_polls: AtomicU64,
    completions: AtomicU64,
    requests: AtomicU64,
    send_wrs: AtomicU64,
    recv_wrs: AtomicU64,
    dropped: AtomicU64,
}

// SAFETY: the CQ and channel are rdma-core objects usable from any thread:
// QPs are created on the CQ by the CM thread, and only the owning reactor's
// poller polls it; the rest is atomics.
unsafe impl Send for PollGroup {}
// SAFETY: as above.
unsafe impl Sync for PollGroup {}

impl PollGroup {
    /// Reserves CQ entries for one QP; refuses (the CQ would overflow, which
    /// is fatal on a real HCA) when the reactor's CQ has too few left.
    fn reserve(&self, entries: u32) -> Result<(), String> {
        let r = self
            .cq_reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(entries).filter(|&n| n <= self.cq_entries)
            });
        match r {
            Ok(_) => {
                self.qpairs.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(used) => Err(format!(
                "completion queue of reactor {} on {} is full: {used} of {} entries reserved, this queue pair needs {entries} (raise rdma.max_qpairs_per_reactor or reactors.count)",
                self.reactor, self.device, self.cq_entries
            )),
        }
    }

    fn release(&self, entries: u32) {
        let _ = self
            .cq_reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                Some(u.saturating_sub(entries))
            });
        let _ = self
            .qpairs
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                Some(q.saturating_sub(1))
            });
    }
}

/// What `device_for` gives a new QP.
struct DeviceShare {
    pd: usize,
    limits: verbs::DeviceLimits,
    arena: Arc<Mutex<Arena>>,
    group: Arc<PollGroup>,
}

/// PD, limits, and the arena and poll group of `reactor` for device context
/// `ctx`; the group's poller is handed to the reactor the first time.
fn device_for(
    v: &'static Verbs,
    ctx: *mut verbs::ibv_context,
    reactor: &Arc<ReactorShared>,
    settings: &RdmaSettings,
    cqes_per_qpair: u32,
) -> Result<DeviceShare, String> {
    let ri = reactor.id;
    let mut devs = DEVICES.lock().map_err(|_| "RDMA device table poisoned")?;
    let i = match devs.iter().position(|d| d.ctx == ctx as usize) {
        Some(i) => i,
        None => {
            // SAFETY: ctx is the live context of a connection request's cm_id.
            let limits = unsafe { verbs::query_device(v, ctx) }
                .map_err(|e| format!("ibv_query_device failed: {e}"))?;
            // SAFETY: as above.
            let name = unsafe { verbs::device_name(v, ctx) };
            // SAFETY: as above.
            let pd = unsafe { (v.ibv_alloc_pd)(ctx) };
            if pd.is_null() {
                return Err("ibv_alloc_pd failed".into());
            }
            tracing::info!(device = %name, ?limits, "RDMA device opened");
            devs.push(Device {
                ctx: ctx as usize,
                name,
                pd: pd as usize,
                limits,
                arenas: Vec::new(),
                groups: Vec::new(),
                pollers: Vec::new(),
            });
            devs.len() - 1
        }
    };
    let d = &mut devs[i];
    if d.arenas.len() <= ri {
        d.arenas.resize_with(ri + 1, || None);
        d.groups.resize_with(ri + 1, || None);
        d.pollers.resize_with(ri + 1, Weak::new);
    }
    if d.arenas[ri].is_none() {
        let a = Arena::new(v, d.pd as *mut _, settings.buffer_pool_bytes)?;
        d.arenas[ri] = Some(Arc::new(Mutex::new(a)));
    }
    if d.groups[ri].is_none() {
        // Every QP of this reactor may need its send plus receive queue depth
        // of entries at once; the device caps the whole CQ.
        let want = settings
            .max_qpairs_per_reactor
            .saturating_mul(cqes_per_qpair)
            .min(d.limits.max_cqe)
            .max(1);
        d.groups[ri] = Some(Arc::new(create_poll_group(
            v, ctx, i as u64, ri, &d.name, want,
        )?));
    }
    let group = d.groups[ri].clone().ok_or("poll group missing")?;
    let handed = d.pollers[ri]
        .upgrade()
        .is_some_and(|r| Arc::ptr_eq(&r, reactor));
    if !handed {
        // Sent before the QP's Adopt message, so the reactor polls the CQ
        // before it owns any QP on it (one inbox, in order).
        let p = RdmaPoller::new(v, group.clone());
        if reactor
            .send(Message::Call(Box::new(move |r| r.add_poller(Box::new(p)))))
            .is_err()
        {
            return Err(format!("reactor {ri} inbox full"));
        }
        d.pollers[ri] = Arc::downgrade(reactor);
    }
    let arena = d.arenas[ri].clone().ok_or("arena missing")?;
    Ok(DeviceShare {
        pd: d.pd,
        limits: d.limits,
        arena,
        group,
    })
}

fn create_poll_group(
    v: &Verbs,
    ctx: *mut verbs::ibv_context,
    id: u64,
    reactor: usize,
    device: &str,
    entries: u32,
) -> Result<PollGroup, String> {
    // SAFETY: ctx is a live device context; results are checked for NULL and
    // the channel is destroyed if the CQ cannot be made.
    unsafe {
        let comp = (v.ibv_create_comp_channel)(ctx);
        if comp.is_null() {
            return Err("ibv_create_comp_channel failed".into());
        }
        let cq = (v.ibv_create_cq)(
            ctx,
            entries.min(i32::MAX as u32) as i32,
            std::ptr::null_mut(),
            comp,
            0,
        );
        if cq.is_null() {
            let e = std::io::Error::last_os_error();
            (v.ibv_destroy_comp_channel)(comp);
            return Err(format!(
                "ibv_create_cq ({entries} entries) on {device}: {e}"
            ));
        }
        if let Err(e) = verbs::set_nonblocking((*comp).fd) {
            (v.ibv_destroy_cq)(cq);
            (v.ibv_destroy_comp_channel)(comp);
            return Err(format!("completion channel: {e}"));
        }
        // The provider may round the size up; never count on more than asked.
        let got = (*(cq as *mut verbs::ibv_cq_head)).cqe.max(0) as u32;
        let cq_entries = entries.min(got);
        tracing::info!(device, reactor, cq_entries, "RDMA completion queue created");
        Ok(PollGroup {
            id,
            reactor,
            device: device.to_string(),
            cq,
            comp,
            cq_entries,
            cq_reserved: AtomicU32::new(0),
            qpairs: AtomicU32::new(0),
            polls: AtomicU64::new(0),
            idle_polls: AtomicU64::new(0),
            completions: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            send_wrs: AtomicU64::new(0),
            recv_wrs: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        })
    }
}

/// One poll group's counters, for metrics and `nvmf_get_stats`.
#[derive(Debug, Clone)]
pub struct PollGroupStats {
    pub reactor: usize,
    pub device: String,
    pub polls: u64,
    pub idle_polls: u64,
    pub completions: u64,
    pub requests: u64,
    pub send_wrs: u64,
    pub recv_wrs: u64,
    pub dropped_completions: u64,
    /// QPs whose sends and receives complete on this group's CQ.
    pub qpairs: u32,
    pub cq_entries: u32,
    pub cq_entries_reserved: u32,
}

/// Every poll group (one completion queue each) of this process.
pub fn poll_group_stats() -> Vec<PollGroupStats> {
    let Ok(devs) = DEVICES.lock() else {
        return Vec::new();
    };
    let mut out: Vec<PollGroupStats> = devs
        .iter()
        .flat_map(|d| d.groups.iter().flatten())
        .map(|g| PollGroupStats {
            reactor: g.reactor,
            device: g.device.clone(),
            polls: g.polls.load(Ordering::Relaxed),
            idle_polls: g.idle_polls.load(Ordering::Relaxed),
            completions: g.completions.load(Ordering::Relaxed),
            requests: g.requests.load(Ordering::Relaxed),
            send_wrs: g.send_wrs.load(Ordering::Relaxed),
            recv_wrs: g.recv_wrs.load(Ordering::Relaxed),
            dropped_completions: g.dropped.load(Ordering::Relaxed),
            qpairs: g.qpairs.load(Ordering::Relaxed),
            cq_entries: g.cq_entries,
            cq_entries_reserved: g.cq_reserved.load(Ordering::Relaxed),
        })
        .collect();
    out.sort_by(|a, b| (a.reactor, &a.device).cmp(&(b.reactor, &b.device)));
    out
}

/// The reactor side of a poll group: polls its CQ once per pass and routes
/// every work completion to its QP.
///
/// Routing is by `wc.qp_num` (the reactor maps (group, qp_num) to the QP's
/// conn id at adoption): the device stamps it on every completion, and the QP
/// knows it before its first receive is posted, while the conn id exists only
/// after adoption (too late to put in the receives' wr_ids, which must be
/// posted before rdma_accept). A qp_num is unique on its device while the QP
/// lives; a recycled one is caught by the QP generation in each wr_id.
struct RdmaPoller {
    v: &'static Verbs,
    group: Arc<PollGroup>,
    /// A notification was requested and has not fired yet.
    armed: bool,
    router: CompletionRouter,
    wcs: [verbs::ibv_wc; POLL_BATCH],
}

impl RdmaPoller {
    fn new(v: &'static Verbs, group: Arc<PollGroup>) -> RdmaPoller {
        let cap = group.cq_entries as usize;
        RdmaPoller {
            v,
            group,
            armed: false,
            router: CompletionRouter::new(cap),
            wcs: [verbs::ibv_wc::default(); POLL_BATCH],
        }
    }
}

impl SharedPoller for RdmaPoller {
    fn id(&self) -> u64 {
        self.group.id
    }

    fn fd(&self) -> Option<RawFd> {
        // SAFETY: the channel lives for the process.
        Some(unsafe { (*self.group.comp).fd })
    }

    fn on_wake(&mut self) {
        let mut events = 0u32;
        loop {
            let mut cq: *mut ibv_cq = std::ptr::null_mut();
            let mut cqctx: *mut std::ffi::c_void = std::ptr::null_mut();
            // SAFETY: the channel is live and non-blocking.
            if unsafe { (self.v.ibv_get_cq_event)(self.group.comp, &mut cq, &mut cqctx) } != 0 {
                break;
            }
            events += 1;
        }
        if events > 0 {
            // SAFETY: the CQ is live; acks exactly the events just taken.
            unsafe { (self.v.ibv_ack_cq_events)(self.group.cq, events) };
            self.armed = false;
        }
    }

    fn poll(&mut self, now: Instant, deliver: &mut dyn FnMut(u64, &dyn Any) -> bool) -> usize {
        self.group.polls.fetch_add(1, Ordering::Relaxed);
        let mut dropped = self.router.retry(now, deliver);
        let mut found = 0usize;
        for _ in 0..POLL_BATCHES_PER_PASS {
            // SAFETY: the CQ lives for the process; only this poller polls it.
            let n = unsafe { verbs::poll_cq(self.group.cq, &mut self.wcs) };
            if n <= 0 {
                if n < 0 {
                    tracing::warn!(device = %self.group.device, reactor = self.group.reactor, "ibv_poll_cq: {n}");
                }
                break;
            }
            let n = n as usize;
            found += n;
            dropped += self.router.route(now, &self.wcs[..n], deliver);
            if n < POLL_BATCH {
                break;
            }
        }
        if found == 0 {
            self.group.idle_polls.fetch_add(1, Ordering::Relaxed);
        } else {
            self.group
                .completions
                .fetch_add(found as u64, Ordering::Relaxed);
        }
        if dropped > 0 {
            self.group.dropped.fetch_add(dropped, Ordering::Relaxed);
        }
        found
    }

    fn arm(&mut self) -> bool {
        if self.armed {
            return false;
        }
        // SAFETY: the CQ is live.
        if unsafe { verbs::req_notify_cq(self.group.cq) } != 0 {
            // Not armed: report "armed now" so the reactor keeps polling
            // rather than sleep through completions.
            return true;
        }
        self.armed = true;
        true
    }
}

/// Routes work completions by qp_num, keeping those no adopted QP claims yet
/// (see PARK_TTL) and retrying them first on the next pass, so one QP's
/// completions are delivered in order. No device here: unit-tested.
struct CompletionRouter {
    parked: VecDeque<(Instant, verbs::ibv_wc)>,
    /// At most this many parked (the CQ's size: more cannot be in flight).
    cap: usize,
}

impl CompletionRouter {
    fn new(cap: usize) -> CompletionRouter {
        CompletionRouter {
            parked: VecDeque::new(),
            cap: cap.max(1),
        }
    }

    /// Retries every parked completion once; returns how many were dropped
    /// (older than PARK_TTL: their QP is gone, or never came).
    fn retry(&mut self, now: Instant, deliver: &mut dyn FnMut(u64, &dyn Any) -> bool) -> u64 {
        let mut dropped = 0;
        for _ in 0..self.parked.len() {
            let Some((at, wc)) = self.parked.pop_front() else {
                break;
            };
            if deliver(wc.qp_num as u64, &wc) {
                continue;
            }
            if now.saturating_duration_since(at) > PARK_TTL {
                tracing::debug!(
                    qp_num = wc.qp_num,
                    wr_id = wc.wr_id,
                    status = wc.status,
                    "completion for no queue pair dropped"
                );
                dropped += 1;
            } else {
                self.parked.push_back((at, wc));
            }
        }
        dropped
    }

    /// Delivers fresh completions, parking the unclaimed ones; returns how
    /// many were dropped because the parking space was full.
    fn route(
        &mut self,
        now: Instant,
        wcs: &[verbs::ibv_wc],
        deliver: &mut dyn FnMut(u64, &dyn Any) -> bool,
    ) -> u64 {
        let mut dropped = 0;
        for wc in wcs {
            if deliver(wc.qp_num as u64, wc) {
                continue;
            }
            if self.parked.len() >= self.cap {
                tracing::warn!(
                    qp_num = wc.qp_num,
                    "too many completions for unknown queue pairs; dropped"
                );
                dropped += 1;
            } else {
                self.parked.push_back((now, *wc));
            }
        }
        dropped
    }
}

/// A listening RDMA CM id.
pub struct RdmaListener {
    pub addr: SocketAddr,
    pub discovery_only: bool,
    chan: *mut rdma_event_channel,
    id: *mut rdma_cm_id,
}

// SAFETY: the CM objects are used only by the CM thread after creation (and
// destroyed once, in Drop); rdma-core allows use from any thread.
unsafe impl Send for RdmaListener {}
// SAFETY: shared references only read `addr`/`discovery_only`.
unsafe impl Sync for RdmaListener {}

impl RdmaListener {
    fn fd(&self) -> RawFd {
        // SAFETY: chan is live until Drop.
        unsafe { (*self.chan).fd }
    }
}

impl Drop for RdmaListener {
    fn drop(&mut self) {
        if let Ok(v) = verbs::load() {
            // SAFETY: created in `listen`, destroyed exactly once here; no event
            // of this id is left unacknowledged (the CM thread acks each at once).
            unsafe {
                (v.rdma_destroy_id)(self.id);
                (v.rdma_destroy_event_channel)(self.chan);
            }
        }
    }
}

/// Starts listening on `addr` through the RDMA CM. Errors are one line naming
/// the address (rdma-core missing, no RDMA device on that address, ...).
pub fn listen(addr: SocketAddr, discovery_only: bool) -> Result<RdmaListener, String> {
    let v = verbs::load().map_err(|e| format!("RDMA listener {addr}: {e}"))?;
    // SAFETY: plain constructor; the result is checked for NULL.
    let chan = unsafe { (v.rdma_create_event_channel)() };
    if chan.is_null() {
        return Err(format!(
            "RDMA listener {addr}: cannot open the RDMA CM ({}); is rdma_ucm loaded?",
            std::io::Error::last_os_error()
        ));
    }
    let mut id: *mut rdma_cm_id = std::ptr::null_mut();
    // SAFETY: chan is live; id receives the new cm_id.
    let r = unsafe { (v.rdma_create_id)(chan, &mut id, std::ptr::null_mut(), verbs::RDMA_PS_TCP) };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        // SAFETY: chan has no ids; destroyed once.
        unsafe { (v.rdma_destroy_event_channel)(chan) };
        return Err(format!("RDMA listener {addr}: rdma_create_id: {e}"));
    }
    let l = RdmaListener {
        addr,
        discovery_only,
        chan,
        id,
    };
    let mut sa = verbs::to_sockaddr(addr);
    // SAFETY: id is live; sa is a valid sockaddr of its family.
    if unsafe { (v.rdma_bind_addr)(id, &mut sa as *mut _ as *mut libc::sockaddr) } != 0 {
        return Err(format!(
            "RDMA listener {addr}: cannot bind ({}); is there an RDMA device (e.g. rxe) on that address?",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: id is bound.
    if unsafe { (v.rdma_listen)(id, 128) } != 0 {
        return Err(format!(
            "RDMA listener {addr}: rdma_listen: {}",
            std::io::Error::last_os_error()
        ));
    }
    // A wildcard address has no device yet; a specific one must have one.
    // SAFETY: id is live.
    if !addr.ip().is_unspecified() && unsafe { (*id).verbs }.is_null() {
        return Err(format!(
            "RDMA listener {addr}: no RDMA device on that address"
        ));
    }
    verbs::set_nonblocking(l.fd()).map_err(|e| format!("RDMA listener {addr}: {e}"))?;
    let mut l = l;
    // SAFETY: id is live; after bind its source address holds the bound port.
    if let Some(b) = verbs::sockaddr(unsafe { &(*id).src_addr }) {
        if l.addr.port() == 0 {
            l.addr.set_port(b.port());
        }
    }
    // `l` itself is returned: it owns the cm_id (a copy would destroy it twice).
    Ok(l)
}

/// RDMA listeners the CM thread serves; RPC adds and removes them at run time.
#[derive(Default)]
pub struct RdmaListenerSet {
    list: Mutex<Vec<Arc<RdmaListener>>>,
    gen: std::sync::atomic::AtomicU64,
}

impl RdmaListenerSet {
    pub fn add(&self, l: RdmaListener) {
        if let Ok(mut v) = self.list.lock() {
            v.push(Arc::new(l));
        }
        self.gen.fetch_add(1, Ordering::AcqRel);
    }
    pub fn contains(&self, addr: SocketAddr) -> bool {
        self.snapshot().iter().any(|l| l.addr == addr)
    }
    pub fn remove(&self, addr: SocketAddr) -> bool {
        let removed = self
            .list
            .lock()
            .map(|mut v| {
                let n = v.len();
                v.retain(|l| l.addr != addr);
                n != v.len()
            })
            .unwrap_or(false);
        self.gen.fetch_add(1, Ordering::AcqRel);
        removed
    }
    pub fn clear(&self) {
        if let Ok(mut v) = self.list.lock() {
            v.clear();
        }
        self.gen.fetch_add(1, Ordering::AcqRel);
    }
    fn snapshot(&self) -> Vec<Arc<RdmaListener>> {
        self.list.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

/// The NVMe/RDMA transport of a running target: its listeners and the CM
/// thread serving them. rdma-core is loaded and the thread started only when
/// an RDMA listener is configured or `nvmf_create_transport` asks for RDMA.
pub struct RdmaTransport {
    pub listeners: Arc<RdmaListenerSet>,
    reactors: Vec<Arc<ReactorShared>>,
    target: Arc<Target>,
    pub settings: RdmaSettings,
    stop: Arc<AtomicBool>,
    cm: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl RdmaTransport {
    pub fn new(
        reactors: Vec<Arc<ReactorShared>>,
        target: Arc<Target>,
        settings: RdmaSettings,
        stop: Arc<AtomicBool>,
    ) -> RdmaTransport {
        RdmaTransport {
            listeners: Arc::new(RdmaListenerSet::default()),
            reactors,
            target,
            settings,
            stop,
            cm: Mutex::new(None),
        }
    }

    /// Loads rdma-core and starts the CM thread; idempotent. The error is one
    /// line (rdma-core missing, ...).
    pub fn start(&self) -> Result<(), String> {
        verbs::load().map_err(|e| format!("NVMe/RDMA: {e}"))?;
        let mut cm = self
            .cm
            .lock()
            .map_err(|_| "RDMA transport state poisoned")?;
        if cm.is_none() {
            let (set, rs, tgt, st, settings) = (
                self.listeners.clone(),
                self.reactors.clone(),
                self.target.clone(),
                self.stop.clone(),
                self.settings.clone(),
            );
            *cm = Some(
                std::thread::Builder::new()
                    .name("rdma-cm".into())
                    .spawn(move || cm_loop(set, rs, tgt, settings, st))
                    .map_err(|e| format!("RDMA CM thread: {e}"))?,
            );
        }
        Ok(())
    }

    pub fn is_started(&self) -> bool {
        self.cm.lock().map(|c| c.is_some()).unwrap_or(false)
    }

    /// Waits for the CM thread (after `stop` is set) and closes the listeners.
    pub fn join(&self) {
        let h = self.cm.lock().ok().and_then(|mut c| c.take());
        if let Some(h) = h {
            let _ = h.join();
        }
        self.listeners.clear();
    }
}

/// The RDMA CM thread: answers connection requests on every RDMA listener and
/// hands accepted QPs to reactors round-robin. Runs until `stop` is set.
pub fn cm_loop(
    set: Arc<RdmaListenerSet>,
    reactors: Vec<Arc<ReactorShared>>,
    target: Arc<Target>,
    settings: RdmaSettings,
    stop: Arc<AtomicBool>,
) {
    let Ok(v) = verbs::load() else {
        return;
    };
    let mut next = 0usize;
    let mut gen = u64::MAX;
    let mut listeners: Vec<Arc<RdmaListener>> = Vec::new();
    let mut pfds: Vec<libc::pollfd> = Vec::new();
    while !stop.load(Ordering::Acquire) {
        let g = set.gen.load(Ordering::Acquire);
        if g != gen {
            gen = g;
            listeners = set.snapshot();
            pfds = listeners
                .iter()
                .map(|l| libc::pollfd {
                    fd: l.fd(),
                    events: libc::POLLIN,
                    revents: 0,
                })
                .collect();
        }
        // SAFETY: pfds is a valid pollfd array for the call.
        let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, 200) };
        if n <= 0 {
            continue;
        }
        for (i, l) in listeners.iter().enumerate() {
            if pfds[i].revents == 0 {
                continue;
            }
            loop {
                let mut ev: *mut verbs::rdma_cm_event = std::ptr::null_mut();
                // SAFETY: the channel is live (l is held); non-blocking fd.
                if unsafe { (v.rdma_get_cm_event)(l.chan, &mut ev) } != 0 || ev.is_null() {
                    break;
                }
                // SAFETY: ev is a live event until acked below.
                let (kind, id, conn) = unsafe {
                    let e = &*ev;
                    let pd = if e.conn.private_data.is_null() {
                        Vec::new()
                    } else {
                        std::slice::from_raw_parts(
                            e.conn.private_data as *const u8,
                            e.conn.private_data_len as usize,
                        )
                        .to_vec()
                    };
                    (
                        e.event,
                        e.id,
                        (pd, e.conn.initiator_depth, e.conn.responder_resources),
                    )
                };
                // Ack before anything else: migrating the new id to its own
                // channel waits for its events to be acknowledged.
                // SAFETY: ev came from rdma_get_cm_event and is acked once.
                unsafe { (v.rdma_ack_cm_event)(ev) };
                if kind != verbs::cm_event::CONNECT_REQUEST {
                    tracing::debug!(listener = %l.addr, event = kind, "RDMA CM event on a listener");
                    continue;
                }
                let r = &reactors[next % reactors.len()];
                next = next.wrapping_add(1);
                match accept(v, id, &conn.0, conn.1, l, &target, r, &settings) {
                    Ok(qp) => {
                        tracing::debug!(peer = %qp.l.peer, qid = qp.q.qid(), reactor = r.id, "RDMA queue pair accepted");
                        if let Err(Message::Adopt(qp)) = r.send(Message::Adopt(Box::new(qp))) {
                            tracing::warn!(
                                reactor = r.id,
                                "reactor inbox full; dropping RDMA connection"
                            );
                            drop(qp);
                        }
                    }
                    Err(Refused::Before(sts, why)) => {
                        tracing::warn!(listener = %l.addr, "RDMA connect refused: {why}");
                        reject(v, id, sts);
                        // SAFETY: the rejected id is ours alone; destroyed once.
                        unsafe { (v.rdma_destroy_id)(id) };
                    }
                    Err(Refused::After(why)) => {
                        // The half-built QP rejected and destroyed the id.
                        tracing::warn!(listener = %l.addr, "RDMA connect failed: {why}");
                    }
                }
            }
        }
    }
}

/// Why a connection request was not accepted: before the QP took the cm_id
/// (the caller rejects and destroys it) or after (the QP's Drop did).
enum Refused {
    Before(u16, String),
    After(String),
}

fn reject(v: &Verbs, id: *mut rdma_cm_id, sts: u16) {
    let rej = rwire::encode_reject(sts);
    // SAFETY: id is a live, not yet accepted cm_id; the private data outlives
    // the call.
    unsafe { (v.rdma_reject)(id, rej.as_ptr() as *const _, rej.len() as u8) };
}

/// Builds and accepts the QP for one connection request.
#[allow(clippy::too_many_arguments)]
fn accept(
    v: &'static Verbs,
    id: *mut rdma_cm_id,
    private_data: &[u8],
    host_ird: u8,
    l: &RdmaListener,
    target: &Arc<Target>,
    reactor: &Arc<ReactorShared>,
    settings: &RdmaSettings,
) -> Result<RdmaQueuePair, Refused> {
    let req = CmRequest::parse(private_data).map_err(|s| {
        Refused::Before(
            s,
            format!("bad private data ({} bytes)", private_data.len()),
        )
    })?;
    let lim = &target.limits;
    let max_depth = if req.qid == 0 {
        lim.max_admin_queue_depth
    } else {
        lim.max_queue_depth
    };
    let depth = req.hsqsize as usize + 1;
    if req.hsqsize == 0 || depth > max_depth as usize {
        return Err(Refused::Before(
            cm_status::INVALID_HSQSIZE,
            format!(
                "qid {} hsqsize {} (limit {})",
                req.qid,
                req.hsqsize,
                max_depth - 1
            ),
        ));
    }
    if (req.hrqsize as usize) < depth.min(2) {
        return Err(Refused::Before(
            cm_status::INVALID_HRQSIZE,
            format!("qid {} hrqsize {}", req.qid, req.hrqsize),
        ));
    }
    if req.qid > lim.max_io_queues {
        return Err(Refused::Before(
            cm_status::INVALID_QID,
            format!("qid {}", req.qid),
        ));
    }
    // SAFETY: id is the live new cm_id of the request.
    let ctx = unsafe { (*id).verbs };
    if ctx.is_null() {
        return Err(Refused::Before(
            cm_status::NO_RESOURCES,
            "request has no device".into(),
        ));
    }
    // A QP's sends (data WRITE + response SEND per slot, plus extra
    // responses) and receives (one per slot) may all be outstanding at once:
    // that many entries of the shared CQ are its own.
    let max_depth = lim.max_queue_depth.max(lim.max_admin_queue_depth) as u32;
    let cqes_per_qpair = 3 * max_depth + EXTRA_RESPONSES as u32;
    let DeviceShare {
        pd,
        limits: dev,
        arena,
        group,
    } = device_for(v, ctx, reactor, settings, cqes_per_qpair)
        .map_err(|e| Refused::Before(cm_status::NO_RESOURCES, e))?;
    let ord = u32::from(host_ird)
        .min(dev.max_qp_init_rd_atom)
        .min(settings.max_outstanding_reads)
        .max(1);
    let send_wr = 2 * depth + EXTRA_RESPONSES;
    let cqes = (send_wr + depth) as u32;
    if send_wr as u32 > dev.max_qp_wr || cqes > dev.max_cqe {
        return Err(Refused::Before(
            cm_status::INVALID_HSQSIZE,
            format!("queue depth {depth} exceeds the device's limits"),
        ));
    }
    group
        .reserve(cqes)
        .map_err(|e| Refused::Before(cm_status::NO_RESOURCES, format!("qid {}: {e}", req.qid)))?;
    // SAFETY: id is live (as above).
    let (peer, local) = unsafe {
        (
            verbs::sockaddr(&(*id).dst_addr)
                .map(|a| a.to_string())
                .unwrap_or_else(|| "unknown".into()),
            verbs::sockaddr(&(*id).src_addr).unwrap_or(l.addr),
        )
    };
    let mut qp = RdmaQueuePair::create(
        v,
        id,
        pd as *mut _,
        group,
        cqes,
        depth,
        send_wr,
        target.clone(),
        arena,
        peer,
        local,
        l.discovery_only,
        req.qid,
        ord,
    )
    .map_err(Refused::After)?;
    let accept = rwire::encode_accept(depth as u16);
    let mut param = verbs::rdma_conn_param {
        private_data: accept.as_ptr() as *const _,
        private_data_len: accept.len() as u8,
        // We never serve RDMA READs: the host's data is read by us, not from us.
        responder_resources: 0,
        initiator_depth: ord.min(255) as u8,
        flow_control: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        srq: 0,
        qp_num: 0,
    };
    // SAFETY: id has its QP and posted receives; param and its private data
    // are valid for the call.
    if unsafe { (v.rdma_accept)(qp.l.id, &mut param) } != 0 {
        let e = std::io::Error::last_os_error();
        // The QP owns the id now: its Drop destroys everything.
        qp.l.state = State::Closed;
        return Err(Refused::After(format!("rdma_accept: {e}")));
    }
    Ok(qp)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
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
    /// Waiting for arena memory.
    AwaitBuffer,
    /// Waiting for an RDMA READ slot (outstanding reads are bounded).
    AwaitRead,
    /// RDMA READ of host data in flight.
    Reading,
    /// Data WRITE and response SEND posted; released on the SEND completion.
    Responding,
    /// The data WRITE was posted but its SEND was refused (the QP is closing):
    /// the WRITE may still be reading the slot's arena memory, so the slot is
    /// released on the WRITE's own completion (success or flush), not before.
    WriteOrphaned,
}

#[derive(Debug, Default)]
pub struct RdmaReq {
    state: XState,
    desc: DataDescriptor,
    chunk: Option<Chunk>,
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
struct RdmaLink {
    v: &'static Verbs,
    id: *mut rdma_cm_id,
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
    arena: Arc<Mutex<Arena>>,
    arena_lkey: u32,
    extra_free: Vec<u16>,
    peer: String,
    state: State,
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
    q: Queue<RdmaReq>,
    l: RdmaLink,
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

impl RdmaQueuePair {
    #[allow(clippy::too_many_arguments)]
    fn create(
        v: &'static Verbs,
        id: *mut rdma_cm_id,
        pd: *mut std::ffi::c_void,
        group: Arc<PollGroup>,
        cq_reserved: u32,
        depth: usize,
        send_wr: usize,
        target: Arc<Target>,
        arena: Arc<Mutex<Arena>>,
        peer: String,
        local: SocketAddr,
        discovery_only: bool,
        cm_qid: u16,
        max_reads: u32,
    ) -> Result<RdmaQueuePair, String> {
        let lim = &target.limits;
        let icd = (lim.in_capsule_data as usize).max(ADMIN_IN_CAPSULE_DATA as usize);
        let recv_size = (SQE_LEN + icd).div_ceil(64) * 64;
        let rsp_count = depth + EXTRA_RESPONSES;
        let mem = IoBuf::new(depth * recv_size + rsp_count * CQE_LEN);
        let arena_lkey = arena.lock().map(|a| a.lkey).unwrap_or(0);
        let cq = group.cq;
        let cfg = QueueConfig {
            kind: TransportKind::Rdma,
            peer: peer.clone(),
            local: Some(local),
            discovery_only,
            expected_qid: Some(cm_qid),
            // Slot indices name response buffers: at most `depth` of them.
            max_entries: Some(depth),
            exact_capsule: false,
            places_read_buffers: true,
        };
        // From here on `q` owns the id and the CQ reservation: its Drop
        // releases whatever was made.
        let mut q = RdmaQueuePair {
            q: Queue::new(target, cfg),
            l: RdmaLink {
                v,
                id,
                qp: std::ptr::null_mut(),
                qp_num: 0,
                gen: NEXT_QP_GEN
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |g| {
                        Some(g.wrapping_add(1).max(1))
                    })
                    .unwrap_or(1),
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
                arena,
                arena_lkey,
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
        let l = &mut q.l;
        // SAFETY: every pointer below is checked before use and stored in `l`,
        // whose owner's Drop destroys each exactly once in reverse order. The
        // CQ is the poll group's, which lives for the process.
        unsafe {
            l.chan = (v.rdma_create_event_channel)();
            if l.chan.is_null() {
                return Err("rdma_create_event_channel failed".into());
            }
            if (v.rdma_migrate_id)(id, l.chan) != 0 {
                return Err(format!(
                    "rdma_migrate_id: {}",
                    std::io::Error::last_os_error()
                ));
            }
            let mut attr = verbs::ibv_qp_init_attr {
                qp_context: std::ptr::null_mut(),
                send_cq: cq,
                recv_cq: cq,
                srq: std::ptr::null_mut(),
                cap: verbs::ibv_qp_cap {
                    max_send_wr: send_wr as u32,
                    max_recv_wr: depth as u32,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                qp_type: verbs::IBV_QPT_RC,
                sq_sig_all: 0,
            };
            if (v.rdma_create_qp)(id, pd, &mut attr) != 0 {
                return Err(format!(
                    "rdma_create_qp: {}",
                    std::io::Error::last_os_error()
                ));
            }
            l.qp = (*id).qp;
            l.qp_num = (*l.qp).qp_num;
            l.mem_mr = (v.ibv_reg_mr)(
                pd,
                l.mem.as_mut_ptr() as *mut _,
                l.mem.capacity(),
                verbs::IBV_ACCESS_LOCAL_WRITE,
            );
            if l.mem_mr.is_null() {
                return Err("ibv_reg_mr for receive buffers failed".into());
            }
            l.mem_lkey = (*l.mem_mr).lkey;
        }
        for i in 0..depth {
            l.post_recv(i)
                .map_err(|e| format!("ibv_post_recv: errno {e}"))?;
        }
        // SAFETY: chan is live (created above).
        verbs::set_nonblocking(unsafe { (*l.chan).fd }).map_err(|e| format!("{e}"))?;
        l.building = false;
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
        let received = self
            .q
            .receive(sqe, desc.map(neutral), icd, false, &mut self.l, ctx);
        match received {
            Received::Done => {}
            Received::Overrun => self.close("queue overrun"),
            Received::NeedData { slot, len, dir } => {
                if let (Some(r), Ok(d)) = (self.q.request_mut(slot), desc) {
                    r.x.desc = d;
                    r.x.need = Some((len, dir));
                }
                self.with_buffer(slot, ctx);
            }
        }
        self.sync_closed();
    }

    /// Gives the request the registered memory it needs, then continues it
    /// (RDMA READ for host data, execution for reads); waits if none is free.
    fn with_buffer(&mut self, slot: u16, ctx: &mut IoCtx) {
        let Some((len, dir)) = self.q.request(slot).and_then(|r| r.x.need) else {
            return;
        };
        let got = self.l.arena.lock().ok().and_then(|mut a| a.alloc(len));
        let Some((chunk, view)) = got else {
            if let Some(r) = self.q.request_mut(slot) {
                r.x.state = XState::AwaitBuffer;
            }
            self.l.buf_waiting.push_back(slot);
            return;
        };
        let Some(r) = self.q.request_mut(slot) else {
            if let Ok(mut a) = self.l.arena.lock() {
                a.free(chunk);
            }
            return;
        };
        r.x.chunk = Some(chunk);
        r.buf = Some(view);
        if dir == DataDirection::HostToController {
            r.x.state = XState::AwaitRead;
            self.l.read_waiting.push_back(slot);
            self.issue_reads();
        } else {
            r.x.state = XState::Idle;
            self.q.data_ready(slot, false, &mut self.l, ctx);
        }
    }

    /// Requests waiting for arena memory retry (some was freed).
    fn retry_buffers(&mut self, ctx: &mut IoCtx) {
        while let Some(&slot) = self.l.buf_waiting.front() {
            let Some((len, _)) = self.q.request(slot).and_then(|r| r.x.need) else {
                self.l.buf_waiting.pop_front();
                continue;
            };
            let free = self
                .l
                .arena
                .lock()
                .ok()
                .and_then(|mut a| a.alloc(len).inspect(|(c, _)| a.free(*c)))
                .is_some();
            if !free {
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
                lkey: l.arena_lkey,
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
            // SAFETY: qp is live; the local buffer is in the registered arena
            // and owned by this request until its completion.
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

    fn free_chunk(&mut self, c: Chunk) {
        if let Ok(mut a) = self.arena.lock() {
            a.free(c);
        }
    }
}

impl Link<RdmaReq> for RdmaLink {
    /// RDMA WRITE of the data (reads and admin replies, on success), then the
    /// response capsule by SEND. The slot is released when the SEND completes.
    fn respond(
        &mut self,
        slot: u16,
        r: &mut Request<RdmaReq>,
        rsp: &Response,
        _ctx: &mut IoCtx,
    ) -> Release {
        match r.x.state {
            XState::AwaitRead => self.read_waiting.retain(|&s| s != slot),
            XState::AwaitBuffer => self.buf_waiting.retain(|&s| s != slot),
            _ => {}
        }
        if self.state == State::Closed {
            return Release::Now;
        }
        // Controller-to-host data: admin replies go to arena memory first.
        let mut cqe = rsp.cqe;
        let mut write: Option<(u64, u32)> = None;
        match rsp.c2h {
            C2h::Reply => {
                let reply = r.reply.take().unwrap_or_default();
                r.buf = None;
                if let Some(c) = r.x.chunk.take() {
                    self.free_chunk(c);
                }
                match self
                    .arena
                    .lock()
                    .ok()
                    .and_then(|mut a| a.alloc(reply.len()))
                {
                    Some((c, mut v)) => {
                        v.copy_from_slice(&reply);
                        write = Some((v.as_ptr() as u64, reply.len() as u32));
                        r.x.chunk = Some(c);
                        r.buf = Some(v);
                    }
                    None => cqe.status = Status::INTERNAL_ERROR.to_field(),
                }
            }
            C2h::Data(len) => {
                if let Some(b) = r.buf.as_ref() {
                    write = Some((b.as_ptr() as u64, len as u32));
                }
            }
            C2h::None => {}
        }
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
        let ok = cqe.status == Status::SUCCESS.to_field();
        let first: *mut verbs::ibv_send_wr = match (write, remote) {
            (Some((local, len)), Some((raddr, rkey, rlen))) if ok => {
                data_sge = verbs::ibv_sge {
                    addr: local,
                    length: len.min(rlen),
                    lkey: self.arena_lkey,
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
        // or the arena) held by this slot until the SEND completes; the WR
        // chain lives on this stack frame for the call.
        let (e, posted) = unsafe { verbs::post_send(self.qp, first) };
        self.count_sends(posted);
        if e == 0 {
            return Release::Later;
        }
        tracing::warn!(peer = %self.peer, "ibv_post_send: errno {e}");
        self.close("cannot post a send");
        let chained = !std::ptr::eq(first, &send);
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

    fn discard(&mut self, slot: u16, r: &mut Request<RdmaReq>, _ctx: &mut IoCtx) {
        // Arena views need no giving back; their chunk does.
        r.buf = None;
        if let Some(c) = r.x.chunk.take() {
            self.free_chunk(c);
        }
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

    fn flush(&mut self, _bufs: &mut crate::mem::BufPool) -> bool {
        // Work requests are posted as they are made: nothing is buffered.
        false
    }

    fn housekeeping(&mut self, ctx: &mut IoCtx) {
        if self.l.state == State::Connecting && self.l.since.elapsed() > ESTABLISH_TIMEOUT {
            self.close("not established in time");
        }
        if let Some(why) = self.q.housekeeping(&mut self.l) {
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
        // No DMA can reach the arena now: give back what requests held.
        if let Ok(mut a) = l.arena.lock() {
            for r in self.q.requests_mut() {
                r.buf = None;
                if let Some(c) = r.x.chunk.take() {
                    a.free(c);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_posted_write_keeps_its_slot_until_it_completes() {
        use SlotAfterFailedPost::*;
        // WRITE went, SEND refused: the WRITE still reads the arena memory.
        assert_eq!(slot_after_failed_post(true, 1), AwaitWrite);
        // Nothing posted, or a lone SEND refused: nothing reads the slot.
        assert_eq!(slot_after_failed_post(true, 0), Free);
        assert_eq!(slot_after_failed_post(false, 0), Free);
    }

    #[test]
    fn arena_allocates_disjoint_page_runs_and_reuses_freed_ones() {
        // The allocator alone (no registration): a fake arena over plain memory.
        let mut a = Arena {
            buf: IoBuf::new(16 * ARENA_PAGE),
            _mr: std::ptr::null_mut(),
            lkey: 0,
            used: vec![false; 16],
            hint: 0,
        };
        let (c1, v1) = a.alloc(3 * ARENA_PAGE).unwrap();
        let (c2, v2) = a.alloc(1).unwrap();
        assert_eq!((c1.pages, c2.pages), (3, 1));
        assert_eq!(v1.len(), 3 * ARENA_PAGE);
        assert_eq!(v2.len(), 1);
        let (p1, p2) = (v1.as_ptr() as usize, v2.as_ptr() as usize);
        assert!(p2 >= p1 + 3 * ARENA_PAGE || p1 >= p2 + ARENA_PAGE);
        assert!(a.alloc(13 * ARENA_PAGE).is_none());
        let (c3, _) = a.alloc(12 * ARENA_PAGE).unwrap();
        assert!(a.alloc(1).is_none());
        a.free(c1);
        let (c4, _) = a.alloc(2 * ARENA_PAGE).unwrap();
        assert_eq!(c4.page, c1.page);
        a.free(c2);
        a.free(c3);
        a.free(c4);
        assert!(a.used.iter().all(|u| !u));
        assert!(a.alloc(16 * ARENA_PAGE).is_some());
    }

    fn wc(qp_num: u32, wr_id: u64) -> verbs::ibv_wc {
        verbs::ibv_wc {
            qp_num,
            wr_id,
            ..Default::default()
        }
    }

    /// A stand-in for the reactor's routes: qp_num -> delivered wr_ids.
    struct Routes(std::collections::HashMap<u64, Vec<u64>>);

    impl Routes {
        fn deliver(&mut self) -> impl FnMut(u64, &dyn Any) -> bool + '_ {
            |key, ev| match (self.0.get_mut(&key), ev.downcast_ref::<verbs::ibv_wc>()) {
                (Some(v), Some(wc)) => {
                    v.push(wc.wr_id);
                    true
                }
                _ => false,
            }
        }
    }

    #[test]
    fn completions_before_adoption_wait_and_arrive_in_order() {
        let t0 = Instant::now();
        let mut r = CompletionRouter::new(16);
        let mut routes = Routes([(1u64, vec![])].into_iter().collect());
        // QP 2's first receives complete before its Adopt reached the reactor.
        let d = r.route(t0, &[wc(2, 10), wc(1, 5), wc(2, 11)], &mut routes.deliver());
        assert_eq!(d, 0);
        assert_eq!(routes.0[&1], vec![5]);
        assert_eq!(r.parked.len(), 2);
        // Adopted: the parked ones come first, then the fresh one, in order.
        routes.0.insert(2, vec![]);
        assert_eq!(r.retry(t0, &mut routes.deliver()), 0);
        r.route(t0, &[wc(2, 12)], &mut routes.deliver());
        assert_eq!(routes.0[&2], vec![10, 11, 12]);
        assert!(r.parked.is_empty());
    }

    #[test]
    fn completions_of_no_queue_pair_are_dropped_never_delivered() {
        let t0 = Instant::now();
        let mut r = CompletionRouter::new(2);
        let mut routes = Routes([(1u64, vec![])].into_iter().collect());
        // Three for a gone QP: two park, the third finds the space full.
        assert_eq!(
            r.route(t0, &[wc(9, 1), wc(9, 2), wc(9, 3)], &mut routes.deliver()),
            1
        );
        assert_eq!(r.retry(t0 + PARK_TTL / 2, &mut routes.deliver()), 0);
        assert_eq!(r.parked.len(), 2);
        // Past the TTL they are dropped, and never reach another QP.
        assert_eq!(r.retry(t0 + PARK_TTL * 2, &mut routes.deliver()), 2);
        assert!(r.parked.is_empty());
        assert!(routes.0[&1].is_empty());
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

    fn fake_group(cq_entries: u32) -> PollGroup {
        PollGroup {
            id: 0,
            reactor: 1,
            device: "rxe0".into(),
            cq: std::ptr::null_mut(),
            comp: std::ptr::null_mut(),
            cq_entries,
            cq_reserved: AtomicU32::new(0),
            qpairs: AtomicU32::new(0),
            polls: AtomicU64::new(0),
            idle_polls: AtomicU64::new(0),
            completions: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            send_wrs: AtomicU64::new(0),
            recv_wrs: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    #[test]
    fn a_queue_pair_that_would_overflow_the_cq_is_refused() {
        // Depth 128: 2 x 128 + 16 sends + 128 receives = 400 entries each.
        let g = fake_group(1000);
        assert!(g.reserve(400).is_ok());
        assert!(g.reserve(400).is_ok());
        let e = g.reserve(400).unwrap_err();
        assert!(e.contains("reactor 1 on rxe0 is full: 800 of 1000"), "{e}");
        assert_eq!(g.qpairs.load(Ordering::Relaxed), 2);
        g.release(400);
        assert!(g.reserve(400).is_ok());
        assert_eq!(g.cq_reserved.load(Ordering::Relaxed), 800);
        assert!(g.reserve(u32::MAX).is_err());
    }

    #[test]
    fn listening_without_an_rdma_device_is_one_clear_line() {
        // 192.0.2.1 (RFC 5737 documentation range) is on no RDMA device: the
        // error names the address whether or not rdma-core is installed.
        let e = match listen("192.0.2.1:4420".parse().unwrap(), false) {
            Ok(_) => panic!("an RDMA listener on 192.0.2.1 cannot exist"),
            Err(e) => e,
        };
        assert!(e.contains("192.0.2.1:4420"), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }
}
