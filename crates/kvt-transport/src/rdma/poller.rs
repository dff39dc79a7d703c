//! Poll groups: the completion queue each (device, reactor) pair shares among
//! its QPs, its counters, and the reactor's shared poller that routes every
//! work completion to its QP.

use super::error::RdmaError;
use super::verbs::{self, ibv_comp_channel, ibv_cq, Verbs};
use kvt_reactor::SharedPoller;
use std::any::Any;
use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// The completion queue one reactor shares among its QPs on one device, with
/// its counters. Like the memory keys it lives as long as the process (a CQ is
/// small, and nothing can then complete into a destroyed one).
pub struct PollGroup {
    /// The shared poller's id in its reactor: the device's index.
    pub(super) id: u64,
    reactor: usize,
    device: String,
    pub(super) cq: *mut ibv_cq,
    comp: *mut ibv_comp_channel,
    /// Entries the CQ holds; the sum of the QPs' reservations never exceeds it.
    cq_entries: u32,
    /// Entries reserved by live QPs (each: its send queue + receive queue).
    cq_reserved: AtomicU32,
    qpairs: AtomicU32,
    polls: AtomicU64,
    idle_polls: AtomicU64,
    completions: AtomicU64,
    pub(super) requests: AtomicU64,
    pub(super) send_wrs: AtomicU64,
    pub(super) recv_wrs: AtomicU64,
    pub(super) dropped: AtomicU64,
}

// SAFETY: the CQ and channel are rdma-core objects usable from any thread:
// QPs are created on the CQ by the CM thread, and only the owning reactor's
// poller polls it; the rest is atomics.
unsafe impl Send for PollGroup {}
// SAFETY: as above.
unsafe impl Sync for PollGroup {}

impl PollGroup {
    /// This group's counters now.
    pub(super) fn stats(&self) -> PollGroupStats {
        PollGroupStats {
            reactor: self.reactor,
            device: self.device.clone(),
            polls: self.polls.load(Ordering::Relaxed),
            idle_polls: self.idle_polls.load(Ordering::Relaxed),
            completions: self.completions.load(Ordering::Relaxed),
            requests: self.requests.load(Ordering::Relaxed),
            send_wrs: self.send_wrs.load(Ordering::Relaxed),
            recv_wrs: self.recv_wrs.load(Ordering::Relaxed),
            dropped_completions: self.dropped.load(Ordering::Relaxed),
            qpairs: self.qpairs.load(Ordering::Relaxed),
            cq_entries: self.cq_entries,
            cq_entries_reserved: self.cq_reserved.load(Ordering::Relaxed),
        }
    }
    /// Reserves CQ entries for one QP; refuses (the CQ would overflow, which
    /// is fatal on a real HCA) when the reactor's CQ has too few left.
    pub(super) fn reserve(&self, entries: u32) -> Result<(), RdmaError> {
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
            Err(used) => Err(RdmaError::CqFull {
                reactor: self.reactor,
                device: self.device.clone(),
                used,
                entries: self.cq_entries,
                needed: entries,
            }),
        }
    }

    pub(super) fn release(&self, entries: u32) {
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

pub(super) fn create_poll_group(
    v: &Verbs,
    ctx: *mut verbs::ibv_context,
    id: u64,
    reactor: usize,
    device: &str,
    entries: u32,
) -> Result<PollGroup, RdmaError> {
    // SAFETY: ctx is a live device context; results are checked for NULL and
    // the channel is destroyed if the CQ cannot be made.
    unsafe {
        let comp = (v.ibv_create_comp_channel)(ctx);
        if comp.is_null() {
            return Err(RdmaError::CreateCompChannel {
                device: device.into(),
                source: std::io::Error::last_os_error(),
            });
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
            return Err(RdmaError::CreateCq {
                entries,
                device: device.into(),
                source: e,
            });
        }
        if let Err(e) = verbs::set_nonblocking((*comp).fd) {
            (v.ibv_destroy_cq)(cq);
            (v.ibv_destroy_comp_channel)(comp);
            return Err(RdmaError::CompChannelNonblocking {
                device: device.into(),
                source: e,
            });
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

/// The reactor side of a poll group: polls its CQ once per pass and routes
/// every work completion to its QP.
///
/// Routing is by `wc.qp_num` (the reactor maps (group, qp_num) to the QP's
/// conn id at adoption): the device stamps it on every completion, and the QP
/// knows it before its first receive is posted, while the conn id exists only
/// after adoption (too late to put in the receives' wr_ids, which must be
/// posted before rdma_accept). A qp_num is unique on its device while the QP
/// lives; a recycled one is caught by the QP generation in each wr_id.
pub(super) struct RdmaPoller {
    v: &'static Verbs,
    group: Arc<PollGroup>,
    /// A notification was requested and has not fired yet.
    armed: bool,
    router: CompletionRouter,
    wcs: [verbs::ibv_wc; POLL_BATCH],
}

impl RdmaPoller {
    pub(super) fn new(v: &'static Verbs, group: Arc<PollGroup>) -> RdmaPoller {
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

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(
            matches!(
                e,
                RdmaError::CqFull {
                    reactor: 1,
                    used: 800,
                    entries: 1000,
                    needed: 400,
                    ..
                }
            ),
            "{e}"
        );
        assert!(
            e.to_string()
                .contains("reactor 1 on rxe0 is full: 800 of 1000"),
            "{e}"
        );
        assert_eq!(g.qpairs.load(Ordering::Relaxed), 2);
        g.release(400);
        assert!(g.reserve(400).is_ok());
        assert_eq!(g.cq_reserved.load(Ordering::Relaxed), 800);
        assert!(g.reserve(u32::MAX).is_err());
    }
}
