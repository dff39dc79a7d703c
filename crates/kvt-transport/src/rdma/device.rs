//! Per-device state: the process-wide table of opened RDMA devices, each with
//! its protection domain and the lkeys of the I/O buffer memory registered
//! with it, and per reactor its buffer budget and poll group.

use super::error::RdmaError;
use super::mr::{self, BufferBudget, MemoryKeys, BUDGET_KEY};
use super::poller::{create_poll_group, PollGroup, PollGroupStats, RdmaPoller};
use super::verbs::{self, Verbs};
use super::RdmaSettings;
use kvt_reactor::{Message, ReactorShared};
use std::sync::{Arc, Mutex, Weak};

/// One RDMA device context as seen by kvtarget: its PD, the keys of the
/// registered buffer memory, and per reactor its poll group.
pub(super) struct Device {
    ctx: usize,
    name: String,
    pd: usize,
    limits: verbs::DeviceLimits,
    keys: Arc<MemoryKeys>,
    groups: Vec<Option<Arc<PollGroup>>>,
    /// The reactor each group's poller was handed to (a restarted target in
    /// the same process has new reactors: the poller is handed over again).
    pollers: Vec<Weak<ReactorShared>>,
}

static DEVICES: Mutex<Vec<Device>> = Mutex::new(Vec::new());

/// Every poll group (one completion queue each) of this process.
pub fn poll_group_stats() -> Vec<PollGroupStats> {
    let Ok(devs) = DEVICES.lock() else {
        return Vec::new();
    };
    let mut out: Vec<PollGroupStats> = devs
        .iter()
        .flat_map(|d| d.groups.iter().flatten())
        .map(|g| g.stats())
        .collect();
    out.sort_by(|a, b| (a.reactor, &a.device).cmp(&(b.reactor, &b.device)));
    out
}

/// What `device_for` gives a new QP.
pub(super) struct DeviceShare {
    pub(super) pd: usize,
    pub(super) limits: verbs::DeviceLimits,
    /// The reactor's buffer budget for this device: its key in the
    /// reactor's locals.
    pub(super) budget_key: u64,
    pub(super) keys: Arc<MemoryKeys>,
    pub(super) group: Arc<PollGroup>,
}

/// Opens device context `ctx`: its PD, with every I/O buffer registered.
fn open_device(v: &'static Verbs, ctx: *mut verbs::ibv_context) -> Result<Device, RdmaError> {
    // SAFETY: ctx is the live context of a connection request's cm_id.
    let limits =
        unsafe { verbs::query_device(v, ctx) }.map_err(|errno| RdmaError::QueryDevice { errno })?;
    // SAFETY: as above.
    let name = unsafe { verbs::device_name(v, ctx) };
    // SAFETY: as above.
    let pd = unsafe { (v.ibv_alloc_pd)(ctx) };
    if pd.is_null() {
        return Err(RdmaError::AllocPd { device: name });
    }
    // Every I/O buffer is registered from here on (the arena maps
    // new memory into this PD before handing it out).
    let keys = mr::register_arena(v, pd, &name)?;
    tracing::info!(device = %name, ?limits, "RDMA device opened");
    Ok(Device {
        ctx: ctx as usize,
        name,
        pd: pd as usize,
        limits,
        keys,
        groups: Vec::new(),
        pollers: Vec::new(),
    })
}

/// PD, limits, memory keys, and the budget and poll group of `reactor` for device context
/// `ctx`; the group's poller is handed to the reactor the first time.
pub(super) fn device_for(
    v: &'static Verbs,
    ctx: *mut verbs::ibv_context,
    reactor: &Arc<ReactorShared>,
    settings: &RdmaSettings,
    cqes_per_qpair: u32,
) -> Result<DeviceShare, RdmaError> {
    let ri = reactor.id;
    let mut devs = DEVICES
        .lock()
        .map_err(|_| RdmaError::Poisoned("RDMA device table"))?;
    let i = match devs.iter().position(|d| d.ctx == ctx as usize) {
        Some(i) => i,
        None => {
            devs.push(open_device(v, ctx)?);
            devs.len() - 1
        }
    };
    let d = &mut devs[i];
    if d.groups.len() <= ri {
        d.groups.resize_with(ri + 1, || None);
        d.pollers.resize_with(ri + 1, Weak::new);
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
    let group = d.groups[ri]
        .clone()
        .ok_or(RdmaError::PollGroupMissing { reactor: ri })?;
    let handed = d.pollers[ri]
        .upgrade()
        .is_some_and(|r| Arc::ptr_eq(&r, reactor));
    let budget_key = BUDGET_KEY | i as u64;
    if !handed {
        // Sent before the QP's Adopt message, so the reactor polls the CQ
        // and has the budget before it owns any QP using them (one inbox, in
        // order). A new reactor (a restarted target) gets its own.
        let budget = BufferBudget::new(settings.buffer_pool_bytes);
        let p = RdmaPoller::new(v, group.clone());
        let install = move |r: &mut kvt_reactor::Reactor| {
            r.insert_local(budget_key, Box::new(budget));
            r.add_poller(Box::new(p));
        };
        if reactor.send(Message::Call(Box::new(install))).is_err() {
            return Err(RdmaError::InboxFull { reactor: ri });
        }
        d.pollers[ri] = Arc::downgrade(reactor);
    }
    Ok(DeviceShare {
        pd: d.pd,
        limits: d.limits,
        budget_key,
        keys: d.keys.clone(),
        group,
    })
}
