//! Asymmetric Namespace Access (NVMe Base 2.0, 8.20): ANA groups, the state
//! each listener (port) of a subsystem reports per group, the ANA log page
//! (LID 0Ch), the ANA change asynchronous event and the Path Related statuses
//! an I/O command gets through a path that cannot serve it.
//!
//! Place in the I/O path: one check before an I/O command is dispatched
//! (`Queue::parse_io` calls `io_status`). It reads two atomics: the
//! namespace's group and its controller's path state for that group; the
//! path is fixed when the admin queue connects (`bind_path`), so the command
//! path takes no lock. Everything else here is control path (RPC,
//! configuration, admin commands).

use super::controller::Controller;
use super::{Namespace, Subsystem, Target};
use kvt_wire::nvme::Status;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

pub use super::ana_state::*;

/// A subsystem's ANA: whether it reports it, its paths, its change count.
pub struct SubsystemAna {
    /// SPDK's `ana_reporting`: Identify and the log page report ANA, and
    /// path states apply to I/O.
    pub reporting: AtomicBool,
    paths: RwLock<Vec<Arc<PathAna>>>,
    change_count: AtomicU64,
    /// A cluster-wide subsystem's lease deadline (`mono_ns`; 0: none): past
    /// it this node cannot be sure of its lease, and I/O sees every group
    /// inaccessible even before the cluster's fence thread sets the states.
    lease_deadline: AtomicU64,
}

impl Default for SubsystemAna {
    fn default() -> Self {
        SubsystemAna {
            reporting: AtomicBool::new(false),
            paths: RwLock::new(Vec::new()),
            change_count: AtomicU64::new(0),
            lease_deadline: AtomicU64::new(0),
        }
    }
}

/// The process's monotonic origin of `mono_ns`.
pub fn mono_origin() -> std::time::Instant {
    static ORIGIN: OnceLock<std::time::Instant> = OnceLock::new();
    *ORIGIN.get_or_init(std::time::Instant::now)
}

/// Nanoseconds since `mono_origin` (the monotonic clock: it goes on while
/// the process is stopped).
pub fn mono_ns() -> u64 {
    mono_origin().elapsed().as_nanos() as u64
}

impl SubsystemAna {
    #[inline]
    pub fn is_reporting(&self) -> bool {
        self.reporting.load(Ordering::Acquire)
    }

    /// Sets the lease deadline, in `mono_ns` (0: none, the default).
    pub fn set_lease_deadline(&self, at_ns: u64) {
        self.lease_deadline.store(at_ns, Ordering::Release);
    }

    /// Whether a lease deadline is set and passed at `now` (the caller's
    /// clock: the I/O path reads none).
    #[inline]
    pub fn lease_lapsed(&self, now: std::time::Instant) -> bool {
        let d = self.lease_deadline.load(Ordering::Acquire);
        d != 0 && now.saturating_duration_since(mono_origin()).as_nanos() as u64 >= d
    }

    /// The path of `listener`, made (every group optimized) if it has none.
    pub fn path(&self, listener: SocketAddr) -> Arc<PathAna> {
        if let Some(p) = self.find(listener) {
            return p;
        }
        let Ok(mut v) = self.paths.write() else {
            return Arc::new(PathAna::new(listener));
        };
        if let Some(p) = v.iter().find(|p| p.listener == listener) {
            return p.clone();
        }
        let p = Arc::new(PathAna::new(listener));
        v.push(p.clone());
        p
    }

    pub fn find(&self, listener: SocketAddr) -> Option<Arc<PathAna>> {
        self.paths
            .read()
            .ok()?
            .iter()
            .find(|p| p.listener == listener)
            .cloned()
    }

    /// Forgets `listener`'s states (the listener was removed; added again,
    /// it starts optimized, as in SPDK).
    pub fn forget(&self, listener: SocketAddr) {
        if let Ok(mut v) = self.paths.write() {
            v.retain(|p| p.listener != listener);
        }
    }

    pub fn paths(&self) -> Vec<Arc<PathAna>> {
        self.paths.read().map(|v| v.clone()).unwrap_or_default()
    }

    pub fn change_count(&self) -> u64 {
        self.change_count.load(Ordering::Acquire)
    }

    fn bump(&self) {
        self.change_count.fetch_add(1, Ordering::AcqRel);
    }
}

/// The listener a connection to `subsys` on local address `local` came in
/// through: the subsystem's `listen` entry it matches, else the target's
/// NVM listener, else the address itself.
pub fn listener_of(target: &Target, subsys: &Subsystem, local: SocketAddr) -> SocketAddr {
    let matches = |a: &SocketAddr| {
        a.port() == local.port() && (a.ip() == local.ip() || a.ip().is_unspecified())
    };
    let listed = subsys
        .listen
        .read()
        .ok()
        .and_then(|l| l.as_ref().and_then(|l| l.iter().copied().find(matches)));
    listed
        .or_else(|| {
            target.listeners.read().ok().and_then(|l| {
                l.iter()
                    .filter(|x| !x.discovery_only)
                    .map(|x| x.addr)
                    .find(matches)
            })
        })
        .unwrap_or(local)
}

/// Fixes the path of a new controller (its admin queue connected through
/// `local`).
pub fn bind_path(target: &Target, ctrl: &Controller, local: Option<SocketAddr>) {
    if ctrl.is_discovery() {
        return;
    }
    let Some(local) = local else {
        return;
    };
    let l = listener_of(target, &ctrl.subsys, local);
    let _ = ctrl.ana.path.set(ctrl.subsys.ana.path(l));
}

/// The namespace's ANA group as Identify Namespace reports it (0: the
/// subsystem does not report ANA).
pub fn anagrpid(subsys: &Subsystem, ns: &Namespace) -> u32 {
    if subsys.ana.is_reporting() {
        ns.ana_group.load(Ordering::Acquire)
    } else {
        0
    }
}

/// The I/O path's check: the Path Related status for a command to `ns`
/// through `ctrl`'s path, if its group is not accessible there, at `now`
/// (the reactor's clock). Three atomic loads, no lock, no clock read.
#[inline]
pub fn io_status(ctrl: &Controller, ns: &Namespace, now: std::time::Instant) -> Option<Status> {
    if !ctrl.subsys.ana.is_reporting() {
        return None;
    }
    let path = ctrl.ana.path.get()?;
    let st = path.state(ns.ana_group.load(Ordering::Acquire));
    if st.io_status().is_none() && ctrl.subsys.ana.lease_lapsed(now) {
        return AnaState::Inaccessible.io_status();
    }
    st.io_status()
}

impl Controller {
    /// This controller's view of ANA changed: raise the ANA change event if
    /// the host enabled it and has read the log page since the last one.
    pub fn ana_changed(&self) {
        let Ok(mut regs) = self.regs.lock() else {
            return;
        };
        if regs.async_event_config & AEC_ANA_CHANGE != 0
            && !self.ana.event_masked.swap(true, Ordering::AcqRel)
        {
            regs.pending_events.push_back(AEN_ANA_CHANGE);
        }
    }

    /// The state this controller reports for group `grp`.
    pub fn ana_state(&self, grp: u32) -> AnaState {
        self.ana
            .path
            .get()
            .map_or(AnaState::Optimized, |p| p.state(grp))
    }
}

impl Subsystem {
    /// Sets `listener`'s state for group `grp` (every group when None);
    /// controllers on that path get the ANA change event.
    pub fn set_ana_state(
        &self,
        listener: SocketAddr,
        grp: Option<u64>,
        st: AnaState,
    ) -> Result<(), AnaError> {
        if !self.ana.is_reporting() {
            return Err(AnaError::NotReporting);
        }
        if let Some(g) = grp {
            check_group(g)?;
        }
        let path = self.ana.path(listener);
        let mut changed = false;
        match grp {
            Some(g) => changed |= path.set(check_group(g)?, st),
            None => {
                for g in 1..=MAX_ANA_GROUPS {
                    changed |= path.set(g, st);
                }
            }
        }
        if changed {
            self.ana.bump();
            self.notify_ana(|c| c.ana.path.get().is_some_and(|p| p.listener == listener));
        }
        Ok(())
    }

    /// Moves namespace `nsid` to group `grp`; every controller's view changes.
    pub fn set_ns_ana_group(&self, nsid: u32, grp: u64) -> Result<bool, AnaError> {
        let grp = check_group(grp)?;
        let Some(ns) = self.namespace(nsid) else {
            return Ok(false);
        };
        if ns.ana_group.swap(grp, Ordering::AcqRel) != grp {
            self.ana.bump();
            self.notify_ana(|_| true);
        }
        Ok(true)
    }

    fn notify_ana(&self, which: impl Fn(&Controller) -> bool) {
        let ctrls: Vec<Arc<Controller>> = self
            .controllers
            .lock()
            .map(|c| c.values().filter(|c| which(c)).cloned().collect())
            .unwrap_or_default();
        for c in ctrls {
            c.ana_changed();
        }
    }

    /// Tears down the controllers that came in through `listener` (it was
    /// removed) and forgets its states. Returns how many.
    pub fn disconnect_listener(&self, listener: SocketAddr) -> usize {
        let ctrls: Vec<Arc<Controller>> = self
            .controllers
            .lock()
            .map(|c| {
                c.values()
                    .filter(|c| c.ana.path.get().is_some_and(|p| p.listener == listener))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        for c in &ctrls {
            c.fail();
        }
        self.ana.forget(listener);
        ctrls.len()
    }
}

/// `nvmf_subsystem_listener_set_ana_state` (RPC and configuration):
/// `listener` must be one `subsys` listens on (any, for a subsystem that
/// listens on every listener).
pub fn set_listener_state(
    subsys: &Subsystem,
    listener: SocketAddr,
    state: &str,
    grp: Option<u64>,
) -> Result<(), AnaError> {
    let st = AnaState::parse(state)?;
    let listed = match subsys.listen.read().ok().as_deref() {
        Some(Some(l)) => l.contains(&listener),
        _ => true,
    };
    if !listed {
        return Err(AnaError::NoListener(listener));
    }
    subsys.set_ana_state(listener, grp, st)
}

impl Namespace {
    /// The namespace in ANA group `grp` (checked by the caller).
    pub fn with_ana_group(self, grp: u32) -> Namespace {
        self.ana_group.store(grp, Ordering::Release);
        self
    }
}

/// A namespace's group as a saved configuration gives it (None: its NSID,
/// the default).
pub fn saved_group(ns: &Namespace) -> Option<u32> {
    let g = ns.ana_group.load(Ordering::Acquire);
    (g != ns.nsid).then_some(g)
}

/// One ANA group descriptor of the log page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnaGroupDescriptor {
    pub anagrpid: u32,
    pub change_count: u64,
    /// The state's value (bits 3:0).
    pub state: u8,
    /// Empty with Return Groups Only.
    pub nsids: Vec<u32>,
}

/// The ANA log page.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AnaLog {
    pub change_count: u64,
    pub groups: Vec<AnaGroupDescriptor>,
}

impl AnaLog {
    pub fn len(&self) -> usize {
        ANA_LOG_HEADER_LEN
            + self
                .groups
                .iter()
                .map(|g| ANA_DESCRIPTOR_LEN + 4 * g.nsids.len())
                .sum::<usize>()
    }

    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(self.len());
        b.extend_from_slice(&self.change_count.to_le_bytes());
        b.extend_from_slice(&(self.groups.len() as u16).to_le_bytes());
        b.resize(ANA_LOG_HEADER_LEN, 0);
        for g in &self.groups {
            let start = b.len();
            b.extend_from_slice(&g.anagrpid.to_le_bytes());
            b.extend_from_slice(&(g.nsids.len() as u32).to_le_bytes());
            b.extend_from_slice(&g.change_count.to_le_bytes());
            b.push(g.state & 0x0F);
            b.resize(start + ANA_DESCRIPTOR_LEN, 0);
            for n in &g.nsids {
                b.extend_from_slice(&n.to_le_bytes());
            }
        }
        b
    }

    /// Reads a log page back (None: shorter than its descriptors say).
    pub fn decode(b: &[u8]) -> Option<AnaLog> {
        let u32_at = |o: usize| -> Option<u32> {
            Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?))
        };
        let u64_at = |o: usize| -> Option<u64> {
            Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?))
        };
        let change_count = u64_at(0)?;
        let n = u16::from_le_bytes(b.get(8..10)?.try_into().ok()?);
        let mut off = ANA_LOG_HEADER_LEN;
        let mut groups = Vec::new();
        for _ in 0..n {
            if b.len() < off + ANA_DESCRIPTOR_LEN {
                return None;
            }
            let anagrpid = u32_at(off)?;
            let nnsids = u32_at(off + 4)? as usize;
            let change_count = u64_at(off + 8)?;
            let state = *b.get(off + 16)? & 0x0F;
            off += ANA_DESCRIPTOR_LEN;
            let nsids = (0..nnsids)
                .map(|i| u32_at(off + 4 * i))
                .collect::<Option<Vec<u32>>>()?;
            off += 4 * nnsids;
            groups.push(AnaGroupDescriptor {
                anagrpid,
                change_count,
                state,
                nsids,
            });
        }
        Some(AnaLog {
            change_count,
            groups,
        })
    }
}

/// The ANA log page `ctrl` reports: one descriptor per group that holds a
/// namespace, in ANAGRPID order, with its state on this controller's path;
/// `rgo`: without NSID lists.
pub fn log_page(ctrl: &Controller, rgo: bool) -> AnaLog {
    let subsys = &ctrl.subsys;
    let cc = subsys.ana.change_count();
    let mut members: Vec<(u32, u32)> = subsys
        .namespace_snapshot()
        .iter()
        .map(|n| (n.ana_group.load(Ordering::Acquire), n.nsid))
        .collect();
    members.sort_unstable();
    let mut groups: Vec<AnaGroupDescriptor> = Vec::new();
    for (grp, nsid) in members {
        if groups.last().map_or(true, |g| g.anagrpid != grp) {
            groups.push(AnaGroupDescriptor {
                anagrpid: grp,
                change_count: cc,
                state: ctrl.ana_state(grp) as u8,
                nsids: Vec::new(),
            });
        }
        if !rgo {
            if let Some(g) = groups.last_mut() {
                g.nsids.push(nsid);
            }
        }
    }
    AnaLog {
        change_count: cc,
        groups,
    }
}

/// Get Log Page 0Ch: the page, and the event unmasked unless RAE is set.
/// None: the subsystem does not report ANA.
pub fn read_log_page(ctrl: &Controller, lsp: u8, rae: bool) -> Option<Vec<u8>> {
    if !ctrl.subsys.ana.is_reporting() {
        return None;
    }
    let page = log_page(ctrl, lsp & LSP_RGO != 0).encode();
    if !rae {
        ctrl.ana.event_masked.store(false, Ordering::Release);
    }
    Some(page)
}

/// A namespace's group when it is made: its NSID (the default) or `grp`.
pub fn initial_group(nsid: u32) -> AtomicU32 {
    AtomicU32::new(nsid.clamp(1, MAX_ANA_GROUPS))
}

/// For each listener of `subsys` with states: how many of its groups that
/// hold a namespace are in each state, in `ANA_STATES` order (metrics).
pub fn listener_state_counts(subsys: &Subsystem) -> Vec<(SocketAddr, [u64; ANA_STATES.len()])> {
    let mut groups: Vec<u32> = subsys
        .namespace_snapshot()
        .iter()
        .map(|n| n.ana_group.load(Ordering::Acquire))
        .collect();
    groups.sort_unstable();
    groups.dedup();
    subsys
        .ana
        .paths()
        .iter()
        .map(|p| {
            let mut out = [0u64; ANA_STATES.len()];
            for &g in &groups {
                let st = p.state(g);
                if let Some(i) = ANA_STATES.iter().position(|x| *x == st) {
                    out[i] += 1;
                }
            }
            (p.listener, out)
        })
        .collect()
}

#[cfg(test)]
mod tests;
