//! Path ownership by election (issue 36 item 4) and the first half of
//! fencing (item 5), as a pure state machine: no etcd, no clock of its own.
//! The cluster thread feeds it what etcd answered and the time; it says, per
//! ANA group of each cluster-wide subsystem, whether this node is the
//! group's owner (reports optimized), a follower or fenced (both report
//! inaccessible).
//!
//! The fencing rule: a lease is trusted for half its TTL after the *send*
//! time of the last keep-alive etcd answered. etcd expires a lease TTL after
//! it received its last keep-alive, which is after that send time, so a node
//! stops reporting optimized at least TTL/2 before etcd can delete its owner
//! keys and let another node win. A fenced lease is never trusted again: the
//! node campaigns only with a freshly granted one.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// One elected unit: an ANA group of a cluster-wide subsystem.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct GroupId {
    pub subnqn: String,
    pub anagrpid: u32,
}

/// This node's role for one group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "role")]
pub enum Role {
    /// Won the election with its current lease; `epoch` is the owner key's
    /// create revision.
    Owner { epoch: i64 },
    /// Holds a trusted lease; another node owns the group, or nobody yet.
    Follower,
    /// Holds no trusted lease: it lapsed (no keep-alive answer for TTL/2),
    /// etcd dropped it, or none was granted yet.
    Fenced,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Owner { .. } => "owner",
            Role::Follower => "follower",
            Role::Fenced => "fenced",
        }
    }

    /// Whether this node's listeners report the group optimized.
    pub fn optimized(self) -> bool {
        matches!(self, Role::Owner { .. })
    }
}

/// The holder of a group's owner key as etcd showed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    pub node: String,
    pub lease: i64,
    /// The key's create revision: the holder's epoch.
    pub epoch: i64,
}

/// What the cluster thread learned; times are the node's monotonic clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// etcd granted `lease`; the grant request was sent at `sent`.
    LeaseGranted { lease: i64, sent: Duration },
    /// etcd answered a keep-alive of `lease` sent at `sent` with a live TTL.
    KeepAliveAnswered { lease: i64, sent: Duration },
    /// etcd said `lease` is gone (keep-alive TTL 0, or a put refused).
    LeaseGone { lease: i64 },
    /// The put-if-absent of `group`'s owner key with `lease` succeeded at
    /// revision `revision`.
    Won {
        group: GroupId,
        lease: i64,
        revision: i64,
    },
    /// `group`'s owner key was read: absent (`None`) or held as shown.
    Seen {
        group: GroupId,
        holder: Option<Holder>,
    },
    /// This node gives up `group`, won at `epoch`, because it cannot serve
    /// it, and deletes its owner key (applied before the delete is sent:
    /// another node may win the moment etcd deletes it). It does not
    /// campaign for the group before `until`, and never owns it at `epoch`
    /// again: a delete that was lost, or is still on its way, is sent again.
    Resigned {
        group: GroupId,
        epoch: i64,
        until: Duration,
    },
}

/// The lease this node trusts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Lease {
    id: i64,
    /// Send time of the newest request etcd answered for it.
    confirmed: Duration,
}

/// One group's state.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Group {
    role: Role,
    /// The holder last seen (this node's own key included).
    holder: Option<Holder>,
    /// Resigned: no campaign for the group before this time.
    sit_out_until: Option<Duration>,
    /// The epoch last resigned: this node's key at it is not ownership.
    resigned_epoch: Option<i64>,
}

/// The state machine of one node.
#[derive(Debug, Clone)]
pub struct Ownership {
    node: String,
    /// A lease is trusted this long after its last confirmation.
    trust: Duration,
    lease: Option<Lease>,
    /// Leases fenced or gone: never trusted again.
    spent: Vec<i64>,
    groups: BTreeMap<GroupId, Group>,
}

impl Ownership {
    /// `ttl`: the lease TTL; a lease is trusted for half of it.
    pub fn new(node: &str, ttl: Duration, groups: impl IntoIterator<Item = GroupId>) -> Ownership {
        Ownership::with_trust(node, ttl / 2, groups)
    }

    /// As `new` with another trust span (the simulation's deliberate bug).
    pub fn with_trust(
        node: &str,
        trust: Duration,
        groups: impl IntoIterator<Item = GroupId>,
    ) -> Ownership {
        let groups = groups
            .into_iter()
            .map(|g| {
                let s = Group {
                    role: Role::Fenced,
                    holder: None,
                    sit_out_until: None,
                    resigned_epoch: None,
                };
                (g, s)
            })
            .collect();
        Ownership {
            node: node.into(),
            trust,
            lease: None,
            spent: Vec::new(),
            groups,
        }
    }

    /// The lease to campaign with at `now`, if one is trusted.
    pub fn lease(&mut self, now: Duration) -> Option<i64> {
        self.tick(now);
        self.lease.map(|l| l.id)
    }

    /// Whether the node needs a fresh lease (none trusted at `now`).
    pub fn needs_lease(&mut self, now: Duration) -> bool {
        self.lease(now).is_none()
    }

    /// Until when the trusted lease is trusted (None: no lease is).
    pub fn trusted_until(&self) -> Option<Duration> {
        self.lease.map(|l| l.confirmed + self.trust)
    }

    /// Whether `lease` was fenced or gone (to be revoked, never reused).
    pub fn is_spent(&self, lease: i64) -> bool {
        self.spent.contains(&lease)
    }

    /// Fences when the trusted lease went unconfirmed for the trust span.
    /// True when anything changed.
    pub fn tick(&mut self, now: Duration) -> bool {
        match self.lease {
            Some(l) if now.saturating_sub(l.confirmed) >= self.trust => {
                self.spend(l.id);
                true
            }
            _ => false,
        }
    }

    fn spend(&mut self, lease: i64) {
        if !self.spent.contains(&lease) {
            self.spent.push(lease);
        }
        if self.lease.is_some_and(|l| l.id == lease) {
            self.lease = None;
            for g in self.groups.values_mut() {
                g.role = Role::Fenced;
            }
        }
    }

    /// Takes in one answer at `now`; true when a role changed.
    pub fn apply(&mut self, input: Input, now: Duration) -> bool {
        let before = self.roles();
        self.tick(now);
        match input {
            Input::LeaseGranted { lease, sent } => self.granted(lease, sent, now),
            Input::KeepAliveAnswered { lease, sent } => {
                if let Some(l) = self.lease.as_mut().filter(|l| l.id == lease) {
                    l.confirmed = l.confirmed.max(sent);
                }
            }
            Input::LeaseGone { lease } => self.spend(lease),
            Input::Won {
                group,
                lease,
                revision,
            } => self.won(group, lease, revision),
            Input::Seen { group, holder } => self.seen(group, holder),
            Input::Resigned {
                group,
                epoch,
                until,
            } => self.resigned(&group, epoch, until),
        }
        self.tick(now);
        before != self.roles()
    }

    fn granted(&mut self, lease: i64, sent: Duration, now: Duration) {
        if self.is_spent(lease) {
            return;
        }
        if now.saturating_sub(sent) >= self.trust {
            // Answered too late to be trusted: never used, to be revoked.
            self.spend(lease);
            return;
        }
        if let Some(old) = self.lease.filter(|l| l.id != lease) {
            // One lease at a time: the older one is no longer used.
            self.spend(old.id);
        }
        self.lease = Some(Lease {
            id: lease,
            confirmed: sent,
        });
        for g in self.groups.values_mut() {
            if g.role == Role::Fenced {
                g.role = Role::Follower;
            }
        }
    }

    fn won(&mut self, group: GroupId, lease: i64, revision: i64) {
        let node = self.node.clone();
        let trusted = self.lease.is_some_and(|l| l.id == lease);
        let Some(g) = self.groups.get_mut(&group) else {
            return;
        };
        g.holder = Some(Holder {
            node,
            lease,
            epoch: revision,
        });
        // A late answer to a campaign whose win was since resigned: the
        // holder is right, the ownership is not (the key may be gone).
        let resigned = g.resigned_epoch.is_some_and(|e| revision <= e);
        if trusted && !resigned {
            g.role = Role::Owner { epoch: revision };
        }
    }

    fn seen(&mut self, group: GroupId, holder: Option<Holder>) {
        let lease = self.lease.map(|l| l.id);
        let Some(g) = self.groups.get_mut(&group) else {
            return;
        };
        // This node's key at an epoch it resigned is not ownership.
        let mine = holder.as_ref().is_some_and(|h| {
            Some(h.lease) == lease && h.node == self.node && g.resigned_epoch != Some(h.epoch)
        });
        g.role = match (g.role, mine) {
            (Role::Fenced, _) => Role::Fenced,
            // Still ours at the same epoch: nothing moves.
            (Role::Owner { epoch }, true) if holder.as_ref().is_some_and(|h| h.epoch == epoch) => {
                Role::Owner { epoch }
            }
            (_, true) => Role::Owner {
                epoch: holder.as_ref().map_or(0, |h| h.epoch),
            },
            (_, false) => Role::Follower,
        };
        g.holder = holder;
    }

    fn resigned(&mut self, group: &GroupId, epoch: i64, until: Duration) {
        let Some(g) = self.groups.get_mut(group) else {
            return;
        };
        if g.role == (Role::Owner { epoch }) {
            g.role = Role::Follower;
        }
        g.sit_out_until = Some(until);
        g.resigned_epoch = Some(epoch);
    }

    /// The groups whose owner key this node resigned but still sees as its
    /// own (the delete was lost or is late): (group, epoch) to delete again.
    pub fn resignations_due(&self) -> Vec<(GroupId, i64)> {
        let lease = self.lease.map(|l| l.id);
        self.groups
            .iter()
            .filter_map(|(id, g)| {
                let h = g.holder.as_ref()?;
                let mine = h.node == self.node && Some(h.lease) == lease;
                (mine && g.resigned_epoch == Some(h.epoch)).then(|| (id.clone(), h.epoch))
            })
            .collect()
    }

    /// Every group's role, in group order.
    pub fn roles(&self) -> Vec<(GroupId, Role)> {
        self.groups
            .iter()
            .map(|(id, g)| (id.clone(), g.role))
            .collect()
    }

    /// The role for `group` (Fenced for a group not elected here).
    pub fn role(&self, group: &GroupId) -> Role {
        self.groups.get(group).map_or(Role::Fenced, |g| g.role)
    }

    /// The holder last seen for `group`.
    pub fn holder(&self, group: &GroupId) -> Option<&Holder> {
        self.groups.get(group).and_then(|g| g.holder.as_ref())
    }

    /// The groups to campaign for (put-if-absent) at `now`: every group not
    /// sat out after a resignation, when a lease is trusted (the put of an
    /// owned or held key fails and reads the holder back, which is the poll).
    pub fn campaigns(&mut self, now: Duration) -> Vec<GroupId> {
        if self.lease(now).is_none() {
            return Vec::new();
        }
        self.groups
            .iter()
            .filter(|(_, g)| !matches!(g.sit_out_until, Some(t) if now < t))
            .map(|(id, _)| id.clone())
            .collect()
    }
}

#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;
