//! Listening and connection management: RDMA CM listeners, the CM thread that
//! answers connection requests, and accepting (or rejecting) each request.

use super::device::{device_for, DeviceShare};
use super::error::RdmaError;
use super::qpair::{reject, RdmaQueuePair, State};
use super::verbs::{self, rdma_cm_id, rdma_event_channel, Verbs};
use super::{RdmaSettings, EXTRA_RESPONSES};
use kvt_nvmf::Target;
use kvt_reactor::sys::{wait_readable, EventFd, CONTROL_ERROR_PAUSE};
use kvt_reactor::{Message, ReactorShared};
use kvt_wire::rdma::{self as rwire, cm_status, CmRequest};
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

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
pub fn listen(addr: SocketAddr, discovery_only: bool) -> Result<RdmaListener, RdmaError> {
    let v = verbs::load().map_err(|source| RdmaError::ListenerLoad { addr, source })?;
    // SAFETY: plain constructor; the result is checked for NULL.
    let chan = unsafe { (v.rdma_create_event_channel)() };
    if chan.is_null() {
        return Err(RdmaError::ListenerEventChannel {
            addr,
            source: std::io::Error::last_os_error(),
        });
    }
    let mut id: *mut rdma_cm_id = std::ptr::null_mut();
    // SAFETY: chan is live; id receives the new cm_id.
    let r = unsafe { (v.rdma_create_id)(chan, &mut id, std::ptr::null_mut(), verbs::RDMA_PS_TCP) };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        // SAFETY: chan has no ids; destroyed once.
        unsafe { (v.rdma_destroy_event_channel)(chan) };
        return Err(RdmaError::CreateId { addr, source: e });
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
        return Err(RdmaError::Bind {
            addr,
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: id is bound.
    if unsafe { (v.rdma_listen)(id, 128) } != 0 {
        return Err(RdmaError::Listen {
            addr,
            source: std::io::Error::last_os_error(),
        });
    }
    // A wildcard address has no device yet; a specific one must have one.
    // SAFETY: id is live.
    if !addr.ip().is_unspecified() && unsafe { (*id).verbs }.is_null() {
        return Err(RdmaError::NoDevice { addr });
    }
    verbs::set_nonblocking(l.fd())
        .map_err(|source| RdmaError::ListenerNonblocking { addr, source })?;
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
    /// Wakes the CM thread (made when it starts), which otherwise sleeps
    /// until a CM event comes: signalled on every change and at stop.
    wake: OnceLock<Arc<EventFd>>,
}

impl RdmaListenerSet {
    pub fn add(&self, l: RdmaListener) {
        if let Ok(mut v) = self.list.lock() {
            v.push(Arc::new(l));
        }
        self.changed();
    }

    fn changed(&self) {
        self.gen.fetch_add(1, Ordering::AcqRel);
        self.wake();
    }

    /// Makes the CM thread look at the set and its stop flag again.
    fn wake(&self) {
        if let Some(w) = self.wake.get() {
            w.signal();
        }
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
        self.changed();
        removed
    }
    pub fn clear(&self) {
        if let Ok(mut v) = self.list.lock() {
            v.clear();
        }
        self.changed();
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
    pub fn start(&self) -> Result<(), RdmaError> {
        verbs::load().map_err(RdmaError::TransportLoad)?;
        let mut cm = self
            .cm
            .lock()
            .map_err(|_| RdmaError::Poisoned("RDMA transport state"))?;
        if cm.is_none() {
            let wake = match self.listeners.wake.get() {
                Some(w) => w.clone(),
                None => {
                    let w = Arc::new(EventFd::new().map_err(RdmaError::CmThread)?);
                    self.listeners.wake.get_or_init(|| w).clone()
                }
            };
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
                    .spawn(move || cm_loop(set, rs, tgt, settings, st, wake))
                    .map_err(RdmaError::CmThread)?,
            );
        }
        Ok(())
    }

    pub fn is_started(&self) -> bool {
        self.cm.lock().map(|c| c.is_some()).unwrap_or(false)
    }

    /// Waits for the CM thread (after `stop` is set) and closes the listeners.
    pub fn join(&self) {
        self.listeners.wake();
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
    wake: Arc<EventFd>,
) {
    let Ok(v) = verbs::load() else {
        return;
    };
    let mut next = 0usize;
    let mut gen = u64::MAX;
    let mut listeners: Vec<Arc<RdmaListener>> = Vec::new();
    let mut fds: Vec<RawFd> = Vec::new();
    let mut ready = Vec::new();
    while !stop.load(Ordering::Acquire) {
        let g = set.gen.load(Ordering::Acquire);
        if g != gen {
            gen = g;
            listeners = set.snapshot();
            fds = listeners.iter().map(|l| l.fd()).collect();
        }
        match wait_readable(&fds, &wake, &mut ready) {
            Ok(true) => {
                wake.drain();
                continue;
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!("RDMA CM: poll: {e}");
                std::thread::sleep(CONTROL_ERROR_PAUSE);
                continue;
            }
        }
        for (i, l) in listeners.iter().enumerate() {
            if !ready[i] {
                continue;
            }
            serve_listener(v, l, &reactors, &mut next, &target, &settings);
        }
    }
}

/// Answers the pending events of listener `l`: a connection request gets a
/// queue pair on the next reactor (round-robin by `next`), or is refused.
fn serve_listener(
    v: &'static Verbs,
    l: &RdmaListener,
    reactors: &[Arc<ReactorShared>],
    next: &mut usize,
    target: &Arc<Target>,
    settings: &RdmaSettings,
) {
    while let Some((kind, id, conn)) = next_event(v, l) {
        if kind != verbs::cm_event::CONNECT_REQUEST {
            tracing::debug!(listener = %l.addr, event = kind, "RDMA CM event on a listener");
            continue;
        }
        let r = &reactors[*next % reactors.len()];
        *next = next.wrapping_add(1);
        hand_over(v, id, conn, l, target, r, settings);
    }
}

/// A connection request's private data, host IRD and ORD.
type ConnRequest = (Vec<u8>, u8, u8);

/// The next event on listener `l`'s channel, acknowledged, if there is one.
fn next_event(v: &'static Verbs, l: &RdmaListener) -> Option<(u32, *mut rdma_cm_id, ConnRequest)> {
    let mut ev: *mut verbs::rdma_cm_event = std::ptr::null_mut();
    // SAFETY: the channel is live (l is held); non-blocking fd.
    if unsafe { (v.rdma_get_cm_event)(l.chan, &mut ev) } != 0 || ev.is_null() {
        return None;
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
    Some((kind, id, conn))
}

/// Accepts a connection request and hands its queue pair to reactor `r`, or
/// refuses it.
fn hand_over(
    v: &'static Verbs,
    id: *mut rdma_cm_id,
    conn: ConnRequest,
    l: &RdmaListener,
    target: &Arc<Target>,
    r: &Arc<ReactorShared>,
    settings: &RdmaSettings,
) {
    match accept(v, id, &conn.0, conn.1, l, target, r, settings) {
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

/// Why a connection request was not accepted: before the QP took the cm_id
/// (the caller rejects and destroys it) or after (the QP's Drop did).
enum Refused {
    Before(u16, RdmaError),
    After(RdmaError),
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
    let (req, depth) = check_request(private_data, &target.limits)?;
    let DeviceShare {
        pd,
        limits: dev,
        budget_key,
        keys,
        group,
    } = device_of(v, id, reactor, settings, &target.limits)?;
    let ord = u32::from(host_ird)
        .min(dev.max_qp_init_rd_atom)
        .min(settings.max_outstanding_reads)
        .max(1);
    let send_wr = 2 * depth + EXTRA_RESPONSES;
    let cqes = (send_wr + depth) as u32;
    if send_wr as u32 > dev.max_qp_wr || cqes > dev.max_cqe {
        return Err(Refused::Before(
            cm_status::INVALID_HSQSIZE,
            RdmaError::DepthExceedsDevice { depth },
        ));
    }
    group.reserve(cqes).map_err(|e| {
        Refused::Before(
            cm_status::NO_RESOURCES,
            RdmaError::Reserve {
                qid: req.qid,
                source: Box::new(e),
            },
        )
    })?;
    let (peer, local) = addresses(id, l);
    let mut qp = RdmaQueuePair::create(
        v,
        id,
        pd as *mut _,
        group,
        cqes,
        depth,
        send_wr,
        target.clone(),
        (budget_key, keys),
        peer,
        local,
        l.discovery_only,
        req.qid,
        ord,
    )
    .map_err(Refused::After)?;
    send_accept(v, &mut qp, depth, ord)?;
    Ok(qp)
}

/// This reactor's share of the RDMA device a new cm_id arrived on.
fn device_of(
    v: &'static Verbs,
    id: *mut rdma_cm_id,
    reactor: &Arc<ReactorShared>,
    settings: &RdmaSettings,
    lim: &kvt_nvmf::TransportLimits,
) -> Result<DeviceShare, Refused> {
    // SAFETY: id is the live new cm_id of the request.
    let ctx = unsafe { (*id).verbs };
    if ctx.is_null() {
        return Err(Refused::Before(
            cm_status::NO_RESOURCES,
            RdmaError::RequestWithoutDevice,
        ));
    }
    // A QP's sends (data WRITE + response SEND per slot, plus extra
    // responses) and receives (one per slot) may all be outstanding at once:
    // that many entries of the shared CQ are its own.
    let max_depth = lim.max_queue_depth.max(lim.max_admin_queue_depth) as u32;
    let cqes_per_qpair = 3 * max_depth + EXTRA_RESPONSES as u32;
    device_for(v, ctx, reactor, settings, cqes_per_qpair)
        .map_err(|e| Refused::Before(cm_status::NO_RESOURCES, e))
}

/// A connection request's private data and the queue depth it asks for, if
/// the target allows it (its size, receive queue size and queue ID checked
/// against `lim`).
fn check_request(
    private_data: &[u8],
    lim: &kvt_nvmf::TransportLimits,
) -> Result<(CmRequest, usize), Refused> {
    let req = CmRequest::parse(private_data).map_err(|s| {
        Refused::Before(
            s,
            RdmaError::BadPrivateData {
                len: private_data.len(),
            },
        )
    })?;
    let max_depth = if req.qid == 0 {
        lim.max_admin_queue_depth
    } else {
        lim.max_queue_depth
    };
    let depth = req.hsqsize as usize + 1;
    if req.hsqsize == 0 || depth > max_depth as usize {
        return Err(Refused::Before(
            cm_status::INVALID_HSQSIZE,
            RdmaError::Hsqsize {
                qid: req.qid,
                hsqsize: req.hsqsize,
                limit: max_depth.saturating_sub(1),
            },
        ));
    }
    if (req.hrqsize as usize) < depth.min(2) {
        return Err(Refused::Before(
            cm_status::INVALID_HRQSIZE,
            RdmaError::Hrqsize {
                qid: req.qid,
                hrqsize: req.hrqsize,
            },
        ));
    }
    if req.qid > lim.max_io_queues {
        return Err(Refused::Before(
            cm_status::INVALID_QID,
            RdmaError::Qid { qid: req.qid },
        ));
    }
    Ok((req, depth))
}

/// The peer (as text) and local addresses of a new cm_id.
fn addresses(id: *mut rdma_cm_id, l: &RdmaListener) -> (String, SocketAddr) {
    // SAFETY: id is the live new cm_id of a request.
    unsafe {
        (
            verbs::sockaddr(&(*id).dst_addr)
                .map(|a| a.to_string())
                .unwrap_or_else(|| "unknown".into()),
            verbs::sockaddr(&(*id).src_addr).unwrap_or(l.addr),
        )
    }
}

/// Accepts the connection of `qp`, whose queue holds `depth` entries, with
/// `ord` RDMA READs outstanding at once.
fn send_accept(
    v: &'static Verbs,
    qp: &mut RdmaQueuePair,
    depth: usize,
    ord: u32,
) -> Result<(), Refused> {
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
        return Err(Refused::After(RdmaError::Accept(e)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_without_an_rdma_device_is_one_clear_line() {
        // 192.0.2.1 (RFC 5737 documentation range) is on no RDMA device: the
        // error names the address whether or not rdma-core is installed.
        let e = match listen("192.0.2.1:4420".parse().unwrap(), false) {
            Ok(_) => panic!("an RDMA listener on 192.0.2.1 cannot exist"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains("192.0.2.1:4420"), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }
}
