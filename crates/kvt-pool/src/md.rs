//! The metadata thread's step: gather the state (`md_inputs`), decide from it
//! alone (`plan_md_step`, unit-tested without I/O or clock), apply the plan
//! (reservations, GC scrubs, KV trims, commits). The simulation calls
//! `md_step` itself so a seed reproduces.

use super::*;

impl Pool {
    /// One round of metadata work at time `now` (the caller's clock: the
    /// metadata thread's loop, or the simulation's). Returns true when it did
    /// something. It gathers the state, asks `plan` what to do, and applies it.
    pub fn md_step(&self, now: Instant) -> bool {
        let mut m = lock(&self.meta);
        while let Some(p) = self.freed.pop() {
            m.dirty.push(p);
        }
        for _ in 0..self.retry_free.len() {
            let Some((vid, lext)) = self.retry_free.pop() else {
                break;
            };
            if let Some(v) = self.volume_by_id(vid) {
                match v.try_unmap_empty(lext) {
                    Ok(Some(p)) => m.dirty.push(p),
                    Ok(None) => {}
                    Err(()) => self.retry_free.push((vid, lext)),
                }
            }
        }
        self.kv_trim(&mut m, now);
        if m.failed.is_some() {
            // Metadata can no longer be written: fail every waiter.
            while let Some(r) = self.resv_reqs.pop() {
                r.refuse();
            }
            while let Some(r) = self.pop_commit() {
                r.to.committed.push((r.tag, Err(libc::EIO)));
                r.to.signal();
            }
            self.update_stats(&m);
            for w in lock(&self.waiters).iter().filter_map(|w| w.upgrade()) {
                if !w.space.swap(true, Ordering::AcqRel) {
                    w.signal();
                }
            }
            return false;
        }
        let mut reqs = Vec::new();
        while let Some(r) = self.pop_commit() {
            reqs.push(r);
        }
        // Queued as pending records: the plan commits them.
        let resv_done = self.take_resv_reqs(&mut m);
        let inputs = self.md_inputs(&mut m, now, reqs.len());
        let plan = plan_md_step(&inputs, &mut m.admission);
        assert!(
            resv_done.is_empty() || plan.commit,
            "reservation records left uncommitted"
        );
        let worked = self.apply_md_plan(&mut m, &plan, now, reqs, resv_done);
        self.update_stats(&m);
        // Writes waiting for space retry: there is some now, or there never
        // will be (they fail with capacity exceeded).
        if !self.ready.is_empty() || self.exhausted.load(Ordering::Acquire) {
            for w in lock(&self.waiters).iter().filter_map(|w| w.upgrade()) {
                if !w.space.swap(true, Ordering::AcqRel) {
                    w.signal();
                }
            }
        }
        worked
    }

    /// What `plan_md_step` decides from: the metadata state, the channels'
    /// foreground counters, and `now`.
    pub(super) fn md_inputs(&self, m: &mut Meta, now: Instant, commit_requests: usize) -> MdInputs {
        // Foreground load from the channels' own counters (the data path never
        // writes a pool-wide cache line for it): commands in flight now, and
        // the mean latency of the commands completed since the last step.
        let (mut fg_inflight, mut ops, mut ns) = (0, 0u64, 0u64);
        let mut volumes_dirty = false;
        self.for_each_volume(|v| {
            let (inflight, o, n) = v.fg_load();
            fg_inflight += inflight;
            ops += o;
            ns += n;
            // A KV Delete, or a Store over blocks already written, changes only
            // the key index: the periodic commit takes that too.
            volumes_dirty |= v.has_dirty() || v.kv.as_ref().is_some_and(|kv| kv.has_changes());
        });
        let (prev_ops, prev_ns) = m.fg_seen;
        m.fg_seen = (ops, ns);
        let fg_latency_ns = match ops.checked_sub(prev_ops) {
            // Saturating: the sums are over live volumes, and a deleted
            // volume takes its latency with it.
            Some(d) if d > 0 => ns.saturating_sub(prev_ns) / d,
            _ => 0,
        };
        MdInputs {
            now,
            extents: self.sb.extent_count as u64,
            clean: m.clean.len(),
            ready: self.ready.len(),
            dirty: m.dirty.len(),
            scrubbed: m.scrubbed.len(),
            scrubbed_since: m.scrubbed_since,
            gc_paused: self.gc_paused.load(Ordering::Relaxed),
            fg_inflight,
            fg_latency_ns,
            commit_requests,
            pending_records: m.pending.len(),
            volumes_dirty,
            // The periodic commit counts from the first step after a commit.
            last_commit: *m.last_commit.get_or_insert(now),
            commit_interval: self.opts.commit_interval,
        }
    }

    /// Carries out `plan`: the scrub, the flush that makes scrubbed extents
    /// clean, the reservation, and the journal commit that answers `reqs`.
    pub(super) fn apply_md_plan(
        &self,
        m: &mut Meta,
        plan: &MdPlan,
        now: Instant,
        reqs: Vec<CommitReq>,
        resv_done: Vec<ResvDone>,
    ) -> bool {
        let worked = plan.scrub > 0;
        if worked {
            self.scrub(m, plan.scrub, now);
        }
        if cfg!(debug_assertions) {
            self.assert_unmapped(&m.scrubbed, "scrubbed");
        }
        let cleaned = if plan.flush_scrubbed {
            self.flush_scrubbed(m)
        } else {
            Vec::new()
        };
        let mut reserve = Vec::with_capacity(plan.reserve);
        while reserve.len() < plan.reserve {
            match m.clean.pop_front() {
                Some(p) => reserve.push(p),
                None => break,
            }
        }
        if cfg!(debug_assertions) {
            self.assert_unmapped(&reserve, "reserved");
        }
        if !(plan.commit || !cleaned.is_empty() || !reqs.is_empty() || !reserve.is_empty()) {
            return worked;
        }
        let mut extra = Vec::new();
        if !cleaned.is_empty() {
            extra.push(Record::Clean(cleaned.clone()));
        }
        if !reserve.is_empty() {
            extra.push(Record::Reserve(reserve.clone()));
        }
        let res = self.commit(m, extra);
        match &res {
            Ok(()) => {
                m.clean.extend(cleaned);
                for p in reserve {
                    if let Err(p) = self.ready.push(p) {
                        m.clean.push_front(p);
                    }
                }
            }
            Err(e) => {
                tracing::error!(pool = %self.name, "metadata commit failed: {e}");
                m.dirty.extend(cleaned);
                for p in reserve {
                    m.clean.push_front(p);
                }
            }
        }
        for r in reqs {
            r.to.committed
                .push((r.tag, res.as_ref().map(|_| ()).map_err(|_| libc::EIO)));
            r.to.signal();
        }
        for done in resv_done {
            done(res.is_ok());
        }
        true
    }

    /// Scrubs up to `n` dirty extents (one deallocate each); they wait in
    /// `m.scrubbed` for the flush that makes them clean.
    fn scrub(&self, m: &mut Meta, n: usize, now: Instant) {
        let take = n.min(m.dirty.len());
        let batch: Vec<u32> = m.dirty.drain(..take).collect();
        let ops = batch
            .iter()
            .map(|&p| IoOp::Deallocate {
                offset: self.sb.extent_offset(p),
                len: self.sb.extent_size,
            })
            .collect();
        match m.io.run_all(ops) {
            Ok(_) => {
                self.stats
                    .gc_scrubbed
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                if m.scrubbed.is_empty() {
                    m.scrubbed_since = Some(now);
                }
                m.scrubbed.extend(batch);
            }
            Err(e) => {
                tracing::error!(pool = %self.name, "GC scrub failed: {}", io_err(e));
                m.dirty.extend(batch);
                m.failed = Some(format!("GC scrub failed: {}", io_err(e)));
            }
        }
    }

    /// Flushes the device so the scrubbed extents read as zeros durably;
    /// returns them, now clean (back to dirty when the flush fails).
    fn flush_scrubbed(&self, m: &mut Meta) -> Vec<u32> {
        if m.scrubbed.is_empty() || m.failed.is_some() {
            return Vec::new();
        }
        match m.io.run_all(vec![IoOp::Flush]) {
            Ok(_) => std::mem::take(&mut m.scrubbed),
            Err(e) => {
                let back = std::mem::take(&mut m.scrubbed);
                m.dirty.extend(back);
                m.failed = Some(format!("GC flush failed: {}", io_err(e)));
                Vec::new()
            }
        }
    }

    /// KV extents whose blocks have all been free long enough go back to the
    /// pool: unmapped here (no key and no Store can reach them: the index
    /// holds their blocks), then dirty for GC to scrub under admission
    /// control, like an extent a Deallocate emptied. The unmap is journaled
    /// with the volume's next commit.
    pub(super) fn kv_trim(&self, m: &mut Meta, now: Instant) {
        let mut out = Vec::new();
        self.for_each_volume(|v| {
            let Some(kv) = &v.kv else { return };
            out.clear();
            kv.trim_step(now, |l| v.mapping(l).is_some(), &mut out);
            for &lext in &out {
                v.clear_valid(lext, 0, v.blocks_per_extent);
                match v.try_unmap_empty(lext) {
                    Ok(Some(p)) => m.dirty.push(p),
                    Ok(None) => {}
                    Err(()) => self.retry_free.push((v.desc.id, lext)),
                }
            }
            kv.trimmed(&out);
        });
    }
}

/// The state one metadata step decides from (gathered by `Pool::md_inputs`).
#[derive(Debug, Clone)]
pub struct MdInputs {
    pub now: Instant,
    pub extents: u64,
    /// Clean extents on the list, and reserved ones ready for first writes.
    pub clean: usize,
    pub ready: usize,
    /// Freed extents waiting for a scrub, and scrubbed ones waiting for the
    /// flush that makes them clean (since `scrubbed_since`).
    pub dirty: usize,
    pub scrubbed: usize,
    pub scrubbed_since: Option<Instant>,
    pub gc_paused: bool,
    /// Foreground commands in flight, and their mean latency since the last step.
    pub fg_inflight: u64,
    pub fg_latency_ns: u64,
    /// Flush/FUA commits waiting, control records queued, extent maps changed.
    pub commit_requests: usize,
    pub pending_records: usize,
    pub volumes_dirty: bool,
    pub last_commit: Instant,
    pub commit_interval: Option<Duration>,
}

/// What one metadata step does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MdPlan {
    /// Dirty extents to scrub (from the front of the dirty list).
    pub scrub: usize,
    /// Flush the device so the scrubbed extents can be recorded clean.
    pub flush_scrubbed: bool,
    /// Clean extents to reserve for first writes.
    pub reserve: usize,
    /// Write a journal commit (requests, queued records, reservations, or the
    /// periodic commit of changed extent maps); extents made clean add one too.
    pub commit: bool,
}

/// Scrubbed extents wait for a flush in groups this large at most.
const CLEAN_GROUP: usize = 64;

/// ... and this long at most.
const CLEAN_WAIT: Duration = Duration::from_secs(1);

/// Decides one metadata step from its inputs alone (and the GC admission
/// controller's own state): no I/O, no clock, so it is unit-tested directly.
pub fn plan_md_step(i: &MdInputs, admission: &mut Admission) -> MdPlan {
    let available = (i.clean + i.ready) as u64;
    let (low, _) = admission.watermarks(i.extents);
    // A paused GC still scrubs when clean extents run short: writes would
    // otherwise wait for space that never comes.
    let paused = i.gc_paused && available >= low;
    let backlog = if paused { 0 } else { i.dirty as u64 };
    let grant = admission.grant(
        i.now,
        backlog,
        available,
        i.extents,
        i.fg_inflight,
        i.fg_latency_ns,
    );
    let scrub = grant.min(i.dirty);
    let dirty_after = i.dirty - scrub;
    let scrubbed_after = i.scrubbed + scrub;
    let since = match i.scrubbed_since {
        Some(t) if i.scrubbed > 0 => t,
        _ => i.now,
    };
    // Scrubbed extents become clean once the scrub is durable and recorded.
    // Flushing per batch would cost foreground latency, so it waits for a
    // bigger group unless space is short or GC has nothing left to do.
    let flush_scrubbed = scrubbed_after > 0
        && (scrubbed_after >= CLEAN_GROUP
            || dirty_after == 0
            || available < low
            || admission.s.fixed_batch.is_some()
            || i.now.saturating_duration_since(since) >= CLEAN_WAIT);
    // Keep reserved extents ready for first writes.
    let reserve = if i.ready < READY_TARGET / 2 {
        (READY_TARGET - i.ready).min(i.clean)
    } else {
        0
    };
    let periodic = i.volumes_dirty
        && i.commit_interval
            .is_some_and(|every| i.now.saturating_duration_since(i.last_commit) >= every);
    MdPlan {
        scrub,
        flush_scrubbed,
        reserve,
        commit: i.commit_requests > 0 || i.pending_records > 0 || reserve > 0 || periodic,
    }
}

/// One round of the metadata thread at `now`; false when the pool is gone or
/// closing. Idle rounds sleep until woken or the GC tick passes.
pub(super) fn md_round(pool: &Weak<Pool>, now: Instant) -> bool {
    let Some(p) = pool.upgrade() else {
        return false;
    };
    if p.stop.load(Ordering::Acquire) {
        return false;
    }
    if !p.md_step(now) {
        p.md_idle();
    }
    true
}

/// The longest the metadata thread sleeps when the pool has nothing pending.
/// A change that calls no `wake_md` (a write's new extent mapping, a KV
/// Delete) is seen this late at most, so its periodic commit is too.
const QUIET_PARK: Duration = Duration::from_millis(250);

impl Pool {
    /// The metadata thread has nothing to do: it sleeps until `wake_md` or
    /// the GC tick, whichever comes first (unless a wake is already pending);
    /// with nothing pending at all, up to `quiet_park` instead, so an idle
    /// pool does not take a core 100 times a second from a reactor.
    /// Only the metadata thread calls it: the first call registers it.
    fn md_idle(&self) {
        self.md_parker.get_or_init(std::thread::current);
        let park = if self.md_quiescent() {
            self.quiet_park()
        } else {
            self.opts.gc.tick
        };
        // Taken before sleeping: a wake after this swap unparks the thread
        // (or leaves its token, so `park_timeout` returns at once).
        if !self.md_wake.swap(false, Ordering::AcqRel) {
            std::thread::park_timeout(park);
            // Woken, timed out or spurious: a round follows either way, and
            // taking the wake acquires what its waker published before it.
            self.md_wake.swap(false, Ordering::AcqRel);
        }
    }

    /// `QUIET_PARK`, shortened to a quarter of the commit interval (a change
    /// seen late still commits about on time) and never under the GC tick.
    pub(super) fn quiet_park(&self) -> Duration {
        let cap = self
            .opts
            .commit_interval
            .map_or(QUIET_PARK, |every| QUIET_PARK.min(every / 4));
        cap.max(self.opts.gc.tick)
    }

    /// Nothing for the metadata thread to do until asked: no extent to scrub,
    /// record clean, free or trim, no record or mapping to commit.
    pub(super) fn md_quiescent(&self) -> bool {
        if !self.freed.is_empty() || !self.retry_free.is_empty() {
            return false;
        }
        {
            let m = lock(&self.meta);
            if !m.dirty.is_empty() || !m.scrubbed.is_empty() || !m.pending.is_empty() {
                return false;
            }
        }
        let mut pending = false;
        self.for_each_volume(|v| {
            pending |= v.has_dirty()
                || v.kv
                    .as_ref()
                    .is_some_and(|kv| kv.has_changes() || kv.trim_pending());
        });
        !pending
    }
}

#[cfg(test)]
mod plan_tests {
    use super::*;

    fn inputs(now: Instant) -> MdInputs {
        MdInputs {
            now,
            extents: 1000,
            clean: 500,
            ready: READY_TARGET,
            dirty: 0,
            scrubbed: 0,
            scrubbed_since: None,
            gc_paused: false,
            fg_inflight: 0,
            fg_latency_ns: 0,
            commit_requests: 0,
            pending_records: 0,
            volumes_dirty: false,
            last_commit: now,
            commit_interval: Some(Duration::from_secs(1)),
        }
    }

    fn admission() -> Admission {
        Admission::new(GcSettings::default())
    }

    #[test]
    fn an_idle_pool_plans_nothing() {
        let t = Instant::now();
        assert_eq!(
            plan_md_step(&inputs(t), &mut admission()),
            MdPlan::default()
        );
    }

    #[test]
    fn reserves_refill_below_half_and_never_beyond_the_clean_list() {
        let t = Instant::now();
        let mut i = inputs(t);
        i.ready = READY_TARGET / 2;
        assert_eq!(plan_md_step(&i, &mut admission()).reserve, 0);
        i.ready = READY_TARGET / 2 - 1;
        let p = plan_md_step(&i, &mut admission());
        assert_eq!(p.reserve, READY_TARGET / 2 + 1);
        assert!(p.commit, "a reservation is journaled");
        i.clean = 3;
        assert_eq!(plan_md_step(&i, &mut admission()).reserve, 3);
    }

    #[test]
    fn commits_for_flushes_queued_records_and_the_periodic_timer() {
        let t = Instant::now();
        let mut i = inputs(t);
        i.commit_requests = 1;
        assert!(plan_md_step(&i, &mut admission()).commit);
        let mut i = inputs(t);
        i.pending_records = 2;
        assert!(plan_md_step(&i, &mut admission()).commit);
        // Changed extent maps wait for the interval.
        let mut i = inputs(t + Duration::from_millis(999));
        i.last_commit = t;
        i.volumes_dirty = true;
        assert!(!plan_md_step(&i, &mut admission()).commit);
        i.now = t + Duration::from_secs(1);
        assert!(plan_md_step(&i, &mut admission()).commit);
        // Nothing changed: the timer alone does not commit.
        i.volumes_dirty = false;
        assert!(!plan_md_step(&i, &mut admission()).commit);
        // No interval configured: never periodic.
        i.volumes_dirty = true;
        i.commit_interval = None;
        assert!(!plan_md_step(&i, &mut admission()).commit);
    }

    #[test]
    fn scrubbed_extents_wait_for_a_group_a_second_or_a_shortage() {
        let t = Instant::now();
        let mut i = inputs(t + Duration::from_millis(500));
        i.dirty = 100;
        i.scrubbed = 10;
        i.scrubbed_since = Some(t);
        let mut a = admission();
        assert!(!plan_md_step(&i, &mut a).flush_scrubbed);
        i.now = t + Duration::from_secs(1);
        assert!(plan_md_step(&i, &mut a).flush_scrubbed, "a second passed");
        i.now = t + Duration::from_millis(500);
        i.scrubbed = CLEAN_GROUP;
        assert!(plan_md_step(&i, &mut a).flush_scrubbed, "a full group");
        i.scrubbed = 10;
        i.dirty = 0;
        assert!(
            plan_md_step(&i, &mut a).flush_scrubbed,
            "nothing left to scrub"
        );
        i.dirty = 100;
        i.clean = 0;
        i.ready = 0;
        assert!(plan_md_step(&i, &mut a).flush_scrubbed, "space is short");
    }

    #[test]
    fn gc_scrubs_through_admission_and_a_pause_holds_only_while_space_lasts() {
        let t = Instant::now();
        let mut a = admission();
        let mut i = inputs(t);
        i.dirty = 100;
        // The first grant has no elapsed time to earn tokens from.
        assert_eq!(plan_md_step(&i, &mut a).scrub, 0);
        i.now = t + Duration::from_secs(1);
        let p = plan_md_step(&i, &mut a);
        assert!(p.scrub > 0 && p.scrub <= 4, "{p:?}");
        // Paused with plenty of clean space: nothing.
        i.gc_paused = true;
        i.now += Duration::from_secs(1);
        assert_eq!(plan_md_step(&i, &mut a).scrub, 0);
        // Paused but short of space: urgent scrubbing regardless.
        i.clean = 1;
        i.ready = 0;
        i.now += Duration::from_millis(10);
        let p = plan_md_step(&i, &mut a);
        assert_eq!(p.scrub, GcSettings::default().batch);
        assert_eq!(a.mode, GcMode::Urgent);
        // The plan never scrubs more than is dirty.
        i.dirty = 2;
        i.now += Duration::from_millis(10);
        assert_eq!(plan_md_step(&i, &mut a).scrub, 2);
    }

    #[test]
    fn a_fixed_batch_scrubs_exactly_and_flushes_every_step() {
        let t = Instant::now();
        let mut a = Admission::new(GcSettings {
            fixed_batch: Some(3),
            ..GcSettings::default()
        });
        let mut i = inputs(t);
        i.dirty = 10;
        let p = plan_md_step(&i, &mut a);
        assert_eq!((p.scrub, p.flush_scrubbed), (3, true));
    }
}

#[cfg(test)]
mod wake_tests {
    use super::*;
    use kvt_bdev::ram::RamDevice;

    /// A Flush is answered at once although the metadata thread sleeps a
    /// GC tick of an hour between rounds: `wake_md` reaches it, lock-free,
    /// whether it is parked or about to park.
    #[test]
    fn a_commit_request_wakes_the_sleeping_metadata_thread() {
        let dev: SharedDevice = RamDevice::new("wake", 64 << 20).unwrap();
        crate::format(&dev, &crate::FormatOptions::default()).unwrap();
        let mut opts = PoolOptions::default();
        opts.gc.tick = Duration::from_secs(3600);
        opts.commit_interval = None;
        let pool = Pool::open("wake", dev, opts).unwrap();
        let n = Arc::new(Notifier::new());
        for i in 0..20u64 {
            // Odd rounds: the thread has had time to park; even: it may not.
            if i % 2 == 1 {
                std::thread::sleep(Duration::from_millis(20));
            }
            pool.request_commit(i, n.clone());
            let start = Instant::now();
            let answer = loop {
                if let Some(a) = n.committed.pop() {
                    break a;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "commit request {i} not answered: the wake was lost"
                );
                std::thread::sleep(Duration::from_millis(1));
            };
            assert_eq!(answer, (i, Ok(())));
        }
        pool.close().unwrap();
    }
}
