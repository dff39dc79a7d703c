//! The election on the cluster thread: the `ownership` machine fed with what
//! etcd answered, owner keys under `/kvtarget/<cluster>/owners/<subnqn>/<group>`
//! (put-if-absent with the node's lease; the create revision is the epoch),
//! and the machine's roles applied to this node's listeners through the ANA
//! RPC's own path (`ana::set_listener_state`), so hosts get the ANA change
//! event. A "cluster-fence" thread looks at the clock every `FENCE_STEP`: the
//! fencing deadline holds even while the cluster thread waits on etcd.

use super::etcd::{Compare, PutRequest, RangeRequest, RequestOp, ResponseOp, TxnRequest};
use super::ownership::{GroupId, Holder, Input, Ownership, Role};
use super::shared::{SharedPool, SharedPools};
use super::ClusterStatus;
use kvt_nvmf::ana::{self, AnaState};
use kvt_nvmf::{SubsystemKind, Target};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the fence thread looks at the clock: the most a fence can lag
/// the TTL/2 deadline (besides scheduling).
const FENCE_STEP: Duration = Duration::from_millis(20);

/// One ANA group as `kvtarget_get_cluster` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupStatus {
    pub subnqn: String,
    pub anagrpid: u32,
    /// This node's role: owner, follower or fenced.
    pub role: String,
    /// The owner as this node last saw it (itself included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The owner's epoch (its owner key's create revision).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<i64>,
}

/// The machine and what applying it needs, shared with the fence thread.
struct Shared {
    machine: Mutex<Ownership>,
    origin: Instant,
    target: Arc<Target>,
    status: Arc<Mutex<ClusterStatus>>,
    /// The groups last applied optimized: a group not among them that is
    /// now is taken over (`takeover`) before it is reported optimized.
    optimized: Mutex<Vec<GroupId>>,
    /// The shared pools, opened by the owner of their group.
    pools: SharedPools,
    /// Groups won but not served (a shared pool that could not be opened):
    /// the epoch won and since when (the machine's clock). After
    /// `resign_after` at one epoch the node resigns the group.
    unserved: Mutex<BTreeMap<GroupId, (i64, Duration)>>,
    /// The lease TTL: how long a winner tries to serve a group before it
    /// resigns, and how long it then sits the group out.
    resign_after: Duration,
}

/// This node's part in the elections of its cluster-wide subsystems.
pub struct Election {
    shared: Arc<Shared>,
    node: String,
    /// `/kvtarget/<cluster>/owners/`.
    prefix: String,
    stop: Arc<AtomicBool>,
    fence: Option<JoinHandle<()>>,
}

impl Election {
    /// Elects the ANA groups of `subnqns` (their namespaces' groups now);
    /// None when there is none. Every group starts fenced: inaccessible
    /// until this node wins it.
    pub fn start(
        cluster: &str,
        node: &str,
        ttl: Duration,
        subnqns: &[String],
        target: Arc<Target>,
        status: Arc<Mutex<ClusterStatus>>,
        pools: Vec<SharedPool>,
    ) -> Result<Option<Election>, std::io::Error> {
        let groups = groups_of(&target, subnqns);
        if groups.is_empty() {
            return Ok(None);
        }
        let shared = Arc::new(Shared {
            machine: Mutex::new(Ownership::new(node, ttl, groups)),
            // The I/O path's clock (`ana::mono_ns`): lease deadlines in it.
            origin: ana::mono_origin(),
            target,
            status,
            optimized: Mutex::new(Vec::new()),
            pools: SharedPools::new(node, pools),
            unserved: Mutex::new(BTreeMap::new()),
            resign_after: ttl,
        });
        shared.publish(&shared.lock(), true);
        let stop = Arc::new(AtomicBool::new(false));
        let (sh, st) = (shared.clone(), stop.clone());
        let fence = std::thread::Builder::new()
            .name("cluster-fence".into())
            .spawn(move || {
                while !st.load(Ordering::Acquire) {
                    sh.tick();
                    std::thread::sleep(FENCE_STEP);
                }
            })?;
        Ok(Some(Election {
            shared,
            node: node.into(),
            prefix: format!("/kvtarget/{cluster}/owners/"),
            stop,
            fence: Some(fence),
        }))
    }

    /// The machine's clock for `at`.
    pub fn clock(&self, at: Instant) -> Duration {
        at.saturating_duration_since(self.shared.origin)
    }

    /// Feeds one answer in; applies and publishes a change of roles.
    pub fn input(&self, input: Input) {
        let now = self.clock(Instant::now());
        let mut m = self.shared.lock();
        if m.apply(input, now) {
            self.shared.publish(&m, true);
        } else {
            self.shared.publish(&m, false);
        }
    }

    /// Whether `lease` was fenced or dropped: it must be revoked, not reused.
    pub fn is_spent(&self, lease: i64) -> bool {
        self.shared.lock().is_spent(lease)
    }

    /// Puts-if-absent every group's owner key with the trusted lease (a
    /// held key is read back instead): a win, or the holder, per group.
    pub fn campaign(&self, client: &mut super::etcd::Client) {
        let now = self.clock(Instant::now());
        let (lease, groups) = {
            let mut m = self.shared.lock();
            match m.lease(now) {
                Some(l) => (l, m.campaigns(now)),
                None => return,
            }
        };
        for group in groups {
            let key = self.key(&group);
            let txn = TxnRequest {
                compare: vec![Compare {
                    result: "EQUAL".into(),
                    target: "CREATE".into(),
                    key: key.clone(),
                    create_revision: 0,
                }],
                success: vec![RequestOp::RequestPut(PutRequest {
                    key: key.clone(),
                    value: self.node.as_bytes().to_vec(),
                    lease,
                })],
                failure: vec![RequestOp::RequestRange(RangeRequest {
                    key,
                    range_end: Vec::new(),
                })],
            };
            match client.txn(&txn) {
                Ok(a) if a.succeeded => self.input(Input::Won {
                    group,
                    lease,
                    revision: a.header.revision,
                }),
                Ok(a) => self.input(Input::Seen {
                    group,
                    holder: holder_of(&a.responses),
                }),
                Err(super::etcd::EtcdError::Status { message, .. })
                    if message.contains("lease not found") =>
                {
                    self.input(Input::LeaseGone { lease });
                    return;
                }
                Err(e) => tracing::debug!("cluster: campaign for {group:?}: {e}"),
            }
        }
        self.shared.retry_takeovers();
        self.resign_unserved(client);
    }

    /// Resigns the groups this node won but could not serve for
    /// `resign_after` (its shared pool missing, locked, damaged here): not
    /// the owner first, then the owner key deleted at its epoch, so that a
    /// node that can serve the group wins; this one sits it out as long. A
    /// resigned key still seen (the delete lost) is deleted again.
    fn resign_unserved(&self, client: &mut super::etcd::Client) {
        let now = self.clock(Instant::now());
        let after = self.shared.resign_after;
        let (due, again) = {
            let m = self.shared.lock();
            let unserved = self
                .shared
                .unserved
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let due: Vec<(GroupId, i64)> = unserved
                .iter()
                .filter(|(g, &(epoch, since))| {
                    m.role(g) == Role::Owner { epoch } && now >= since + after
                })
                .map(|(g, &(epoch, _))| (g.clone(), epoch))
                .collect();
            (due, m.resignations_due())
        };
        for (group, epoch) in &due {
            self.shared.served(group);
            self.input(Input::Resigned {
                group: group.clone(),
                epoch: *epoch,
                until: now + after,
            });
            tracing::warn!(subnqn = %group.subnqn, anagrpid = group.anagrpid, epoch, "cluster: resigning a group this node could not serve for {after:?}; another node may win it");
        }
        for (group, epoch) in due.into_iter().chain(again) {
            self.delete_owner_key(client, &group, epoch);
        }
    }

    /// Deletes `group`'s owner key if it is still the one of `epoch`.
    fn delete_owner_key(&self, client: &mut super::etcd::Client, group: &GroupId, epoch: i64) {
        let key = self.key(group);
        let txn = TxnRequest {
            compare: vec![Compare {
                result: "EQUAL".into(),
                target: "CREATE".into(),
                key: key.clone(),
                create_revision: epoch,
            }],
            success: vec![RequestOp::RequestDeleteRange(RangeRequest {
                key,
                range_end: Vec::new(),
            })],
            failure: Vec::new(),
        };
        // Not this epoch's key any more: somebody else's business. An error:
        // the key stays with this node's lease, and the next poll that reads
        // it back sends the delete again.
        if let Err(e) = client.txn(&txn) {
            tracing::debug!("cluster: deleting the owner key of {group:?}: {e}");
        }
    }

    fn key(&self, g: &GroupId) -> Vec<u8> {
        format!("{}{}/{}", self.prefix, g.subnqn, g.anagrpid).into_bytes()
    }

    /// Stops the fence thread; every group is left fenced (inaccessible).
    pub fn stop(&mut self, lease: Option<i64>) {
        if let Some(l) = lease {
            self.input(Input::LeaseGone { lease: l });
        }
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.fence.take() {
            let _ = t.join();
        }
        self.shared.give_up_all();
    }
}

impl Drop for Election {
    fn drop(&mut self) {
        self.stop(None);
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Ownership> {
        self.machine.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn tick(&self) {
        let now = Instant::now().saturating_duration_since(self.origin);
        let mut m = self.lock();
        if m.tick(now) {
            tracing::warn!("cluster: no keep-alive answer for half the lease TTL: fenced, every elected ANA group inaccessible");
            self.publish(&m, true);
        }
        for g in self.pools.superseded() {
            tracing::error!(subnqn = %g.subnqn, anagrpid = g.anagrpid, "cluster: a newer owner's epoch superseded this node's shared pool: the group is inaccessible here");
            self.give_up(&g);
        }
    }

    /// Stops serving `g` here: inaccessible first, then its shared pools
    /// detached and released. It stays so until the machine reports it
    /// optimized again (a new win, with a new epoch).
    fn give_up(&self, g: &GroupId) {
        apply_role(&self.target, g, Role::Fenced);
        self.pools.detach(&self.target, g);
        let mut was = self.optimized.lock().unwrap_or_else(|e| e.into_inner());
        was.retain(|x| x != g);
    }

    /// Retries, at each poll, the takeover of groups this node owns but does
    /// not serve yet (a shared pool that could not be opened: a device not
    /// there yet, an exclusive lock), and reports those it now serves
    /// optimized.
    fn retry_takeovers(&self) {
        let m = self.lock();
        let was = self.optimized.lock().map(|w| w.clone()).unwrap_or_default();
        let pending = (m.roles().into_iter()).filter(|(g, r)| r.optimized() && !was.contains(g));
        for (g, role) in pending {
            if self.take_over(&g, role) {
                apply_role(&self.target, &g, role);
                let mut now = self.optimized.lock().unwrap_or_else(|e| e.into_inner());
                now.push(g);
            }
        }
    }

    /// Notes that `g`, won at `epoch`, cannot be served: the first failure at
    /// an epoch is logged and starts the wait for the resignation.
    fn unserved_since(&self, g: &GroupId, epoch: u64, e: &super::shared::AttachError) {
        let Ok(epoch) = i64::try_from(epoch) else {
            return;
        };
        let now = Instant::now().saturating_duration_since(self.origin);
        let mut unserved = self.unserved.lock().unwrap_or_else(|e| e.into_inner());
        if unserved.get(g).is_some_and(|&(at, _)| at == epoch) {
            return;
        }
        unserved.insert(g.clone(), (epoch, now));
        tracing::error!(subnqn = %g.subnqn, anagrpid = g.anagrpid, epoch, "cluster: won the group but cannot serve its shared pool (retried at each poll, resigned after {:?}): {e}", self.resign_after);
    }

    /// `g` is served, or no longer this node's to serve: no resignation due.
    fn served(&self, g: &GroupId) {
        let mut unserved = self.unserved.lock().unwrap_or_else(|e| e.into_inner());
        unserved.remove(g);
    }

    /// Gives up every group served here (the election stops).
    fn give_up_all(&self) {
        let _m = self.lock();
        let was = self.optimized.lock().map(|w| w.clone()).unwrap_or_default();
        for g in &was {
            self.give_up(g);
        }
    }

    /// Makes group `g`, just won with `role`, ready to be reported optimized:
    /// its shared pools opened with the role's epoch and attached, its
    /// node-local KV namespaces emptied. False: it is not ready (stays
    /// inaccessible).
    fn take_over(&self, g: &GroupId, role: Role) -> bool {
        let Role::Owner { epoch } = role else {
            return false;
        };
        let Some(epoch) = u64::try_from(epoch).ok().filter(|&e| e > 0) else {
            return false;
        };
        if let Err(e) = self.pools.attach(&self.target, g, epoch) {
            self.unserved_since(g, epoch, &e);
            return false;
        }
        self.served(g);
        super::takeover::take_over_cold(&self.target, g, &self.pools.nsids(g));
        true
    }

    /// Shows the roles; `apply`: sets them on the listeners too (under the
    /// machine's lock, so states land in the order the roles changed).
    fn publish(&self, m: &Ownership, apply: bool) {
        let roles = m.roles();
        // 1 (long past): no lease is trusted.
        let deadline = m
            .trusted_until()
            .map_or(1, |d| (d.as_nanos() as u64).max(1));
        let mut nqns: Vec<&str> = roles.iter().map(|(g, _)| g.subnqn.as_str()).collect();
        nqns.dedup();
        for nqn in nqns {
            set_lease_deadline(&self.target, nqn, deadline);
        }
        if apply {
            let was = self.optimized.lock().map(|w| w.clone()).unwrap_or_default();
            let mut now = Vec::new();
            for (g, role) in &roles {
                let ready = match (role.optimized(), was.contains(g)) {
                    (true, true) => true,
                    (true, false) => self.take_over(g, *role),
                    (false, true) => {
                        self.give_up(g);
                        false
                    }
                    (false, false) => false,
                };
                apply_role(&self.target, g, if ready { *role } else { Role::Fenced });
                if ready {
                    now.push(g.clone());
                }
            }
            *self.optimized.lock().unwrap_or_else(|e| e.into_inner()) = now;
        }
        let groups: Vec<GroupStatus> = roles
            .iter()
            .map(|(g, role)| {
                let h = m.holder(g);
                GroupStatus {
                    subnqn: g.subnqn.clone(),
                    anagrpid: g.anagrpid,
                    role: role.name().into(),
                    owner: h.map(|h| h.node.clone()),
                    epoch: h.map(|h| h.epoch),
                }
            })
            .collect();
        self.status.lock().unwrap_or_else(|e| e.into_inner()).groups = groups;
    }
}

/// Reports every ANA group of `subnqns` inaccessible on every listener: what
/// a node serving cluster-wide subsystems shows before its first election,
/// set before the listeners accept (a host never sees an unelected node
/// optimized).
pub fn inaccessible_until_elected(target: &Target, subnqns: &[String]) {
    for g in groups_of(target, subnqns) {
        apply_role(target, &g, Role::Fenced);
    }
}

/// Sets `subnqn`'s lease deadline: the I/O path's own fence.
fn set_lease_deadline(target: &Target, subnqn: &str, at_ns: u64) {
    if let Ok(subs) = target.subsystems.read() {
        if let Some(s) = subs.iter().find(|s| s.nqn == subnqn) {
            s.ana.set_lease_deadline(at_ns);
        }
    }
}

/// The holder a failed put-if-absent read back (None: the key went away).
fn holder_of(responses: &[ResponseOp]) -> Option<Holder> {
    responses.iter().find_map(|r| match r {
        ResponseOp::ResponseRange(r) => r.kvs.first().map(|kv| Holder {
            node: String::from_utf8_lossy(&kv.value).into_owned(),
            lease: kv.lease,
            epoch: kv.create_revision,
        }),
        ResponseOp::ResponsePut(_) | ResponseOp::ResponseDeleteRange(_) => None,
    })
}

/// The ANA groups of the namespaces of `subnqns`, as the target has them.
fn groups_of(target: &Target, subnqns: &[String]) -> Vec<GroupId> {
    let subs = target
        .subsystems
        .read()
        .map(|s| s.clone())
        .unwrap_or_default();
    let mut out: Vec<GroupId> = subs
        .iter()
        .filter(|s| s.kind != SubsystemKind::Discovery && subnqns.contains(&s.nqn))
        .flat_map(|s| {
            s.namespace_snapshot()
                .iter()
                .map(|n| GroupId {
                    subnqn: s.nqn.clone(),
                    anagrpid: n.ana_group.load(Ordering::Acquire),
                })
                .collect::<Vec<_>>()
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Sets `role`'s ANA state on every listener of `g`'s subsystem here.
fn apply_role(target: &Target, g: &GroupId, role: Role) {
    let state = if role.optimized() {
        AnaState::Optimized
    } else {
        AnaState::Inaccessible
    };
    let subs = target
        .subsystems
        .read()
        .map(|s| s.clone())
        .unwrap_or_default();
    let Some(s) = subs.iter().find(|s| s.nqn == g.subnqn) else {
        return;
    };
    for l in listeners_of(target, s) {
        if let Err(e) = ana::set_listener_state(s, l, state.name(), Some(u64::from(g.anagrpid))) {
            tracing::warn!(
                "cluster: ANA state of {} group {} on {l}: {e}",
                g.subnqn,
                g.anagrpid
            );
        }
    }
}

/// The listeners `s` is reachable on: its `listen` list, else every NVM one.
fn listeners_of(target: &Target, s: &kvt_nvmf::Subsystem) -> Vec<SocketAddr> {
    if let Some(Some(l)) = s.listen.read().ok().as_deref() {
        return l.clone();
    }
    target.nvm_listener_addrs()
}

#[cfg(test)]
mod tests {
    use kvt_nvmf::ana::{mono_ns, SubsystemAna};

    #[test]
    fn a_lease_deadline_lapses_io_only_when_set_and_passed() {
        let a = SubsystemAna::default();
        // After the origin of `mono_ns`, as every reactor's clock is.
        let now = kvt_nvmf::ana::mono_origin() + std::time::Duration::from_millis(1);
        assert!(!a.lease_lapsed(now), "no deadline: never lapsed");
        a.set_lease_deadline(mono_ns() + 60_000_000_000);
        assert!(!a.lease_lapsed(now));
        // Judged by the caller's `now`, not by a clock read inside.
        assert!(a.lease_lapsed(now + std::time::Duration::from_secs(61)));
        a.set_lease_deadline(1);
        assert!(a.lease_lapsed(now));
        a.set_lease_deadline(0);
        assert!(!a.lease_lapsed(now));
    }
}
