//! This node's membership: its lease, its record and its view of the others,
//! kept by the "cluster" thread. Each pass of the thread's loop looks at the
//! clock once and acts on what is due: a keep-alive (every TTL/3; TTL/5 with
//! cluster-wide subsystems, followed by their election's campaign), a re-read
//! of the member list (with it), a record refresh (when the target's
//! discovery generation moved), a join attempt (while lost or alone).

use super::elect::{Election, GroupStatus};
use super::etcd::{
    self, Client, Compare, EtcdError, PutRequest, RangeRequest, RequestOp, ResponseOp, TxnRequest,
};
use super::member::{self, MemberRecord, RECORD_FORMAT};
use super::ownership::Input;
use super::referral;
use kvt_config::{ClusterConfig, OnUnreachable};
use kvt_nvmf::Target;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

/// How often the thread looks at its stop flag and the target's generation:
/// a stop waits at most this long, and so does a changed record.
const POLL_STEP: Duration = Duration::from_millis(50);
/// Shortest wait of one etcd request: a loaded etcd commits a put (one
/// fsync) in well under a second; TTL/3 when that is longer.
const MIN_REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
/// A record left by a crashed process with this node's name ends with its
/// lease: a start waits one TTL plus this before it calls the name taken.
const TAKEN_SLACK: Duration = Duration::from_secs(1);
/// Pause between two put-if-absent attempts while the name is held.
const CLAIM_RETRY: Duration = Duration::from_millis(250);

/// This node's standing in the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeState {
    /// Starting: its first join is in progress (the start waits for it).
    Joining,
    /// Holds a live lease and its record is in etcd.
    Joined,
    /// Had joined; its lease ended or went unconfirmed past the TTL. Retrying.
    Lost,
    /// etcd was unreachable at start (`on_unreachable = "alone"`). Retrying.
    Alone,
}

impl NodeState {
    pub fn name(self) -> &'static str {
        match self {
            NodeState::Joining => "joining",
            NodeState::Joined => "joined",
            NodeState::Lost => "lost",
            NodeState::Alone => "alone",
        }
    }
}

/// Every change of this node's lease, logged. Fencing does not wait for
/// these: the election (`elect`) trusts a lease only TTL/2 past its last
/// answered keep-alive, well before `Lost`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseEvent {
    Granted { lease: i64 },
    Lost { lease: i64 },
}

/// What `kvtarget_get_cluster` and the metrics show.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterStatus {
    pub cluster: String,
    pub node: String,
    pub state: NodeState,
    /// The lease as etcdctl prints it (hex); absent while none is held.
    pub lease_id: Option<String>,
    pub lease_ttl_secs: u64,
    /// The etcd endpoint last used.
    pub endpoint: String,
    /// Every member's record (this node's included), by name.
    pub members: Vec<MemberRecord>,
    /// The elected ANA groups of this node's cluster-wide subsystems.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<GroupStatus>,
}

/// Why the node cannot start as a member; one line.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cluster: no etcd endpoint answered ({source}); start etcd, or set cluster.on_unreachable = \"alone\"")]
    Unreachable { source: EtcdError },
    #[error("cluster: node `{node}` is already a member of cluster `{cluster}` (a live kvtarget holds {key}); set another cluster.node")]
    NameTaken {
        node: String,
        cluster: String,
        key: String,
    },
    #[error("cluster: {0}")]
    Etcd(#[from] EtcdError),
    #[error("cluster: cannot start its thread: {0}")]
    Thread(std::io::Error),
    #[error(transparent)]
    Cntlid(super::cntlid::CntlidError),
    #[error("cluster: {0}; every node must serve a cluster-wide subsystem's namespaces alike")]
    Mismatch(String),
}

/// Why a join attempt failed.
enum JoinError {
    Etcd(EtcdError),
    /// No controller ID block for the cluster-wide subsystems.
    Cntlid(super::cntlid::CntlidError),
    /// Another process holds the record of this node's name.
    Taken,
    /// A member serves one of this node's cluster-wide subsystems otherwise
    /// (`member::mismatch`'s line).
    Mismatch(String),
}

impl From<EtcdError> for JoinError {
    fn from(e: EtcdError) -> Self {
        JoinError::Etcd(e)
    }
}

/// A running membership: the thread and the status it publishes.
pub struct Cluster {
    status: Arc<Mutex<ClusterStatus>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Cluster {
    /// Joins (or, when etcd is unreachable and the configuration says so,
    /// starts alone), then keeps the membership on its own thread, and
    /// elects the owners of the ANA groups of `cluster_wide` (subsystem NQNs).
    /// `on_view` gets the status reader before the join, so that RPC and
    /// metrics show the node `joining` meanwhile.
    pub fn start(
        cfg: &ClusterConfig,
        target: Arc<Target>,
        metrics_url: Option<String>,
        cluster_wide: &[String],
        shared: Vec<super::SharedPool>,
        on_view: impl FnOnce(ClusterView),
    ) -> Result<Cluster, ClusterError> {
        let mut node = Node::new(cfg, target, metrics_url);
        on_view(ClusterView(node.status.clone()));
        node.cluster_wide = cluster_wide.to_vec();
        node.election = Election::start(
            &cfg.name,
            &node.name,
            node.ttl,
            cluster_wide,
            node.target.clone(),
            node.status.clone(),
            shared,
        )
        .map_err(ClusterError::Thread)?;
        if node.election.is_some() {
            // A keep-alive must be answered within TTL/2 of the last one
            // sent, or the node fences: send them more often.
            node.keepalive_every = node.ttl / 5;
        }
        match node.join(Instant::now() + node.ttl + TAKEN_SLACK) {
            Ok(()) => {}
            Err(JoinError::Etcd(e)) if e.is_unreachable() => match cfg.on_unreachable {
                OnUnreachable::Fail => return Err(ClusterError::Unreachable { source: e }),
                OnUnreachable::Alone => {
                    node.set_state(NodeState::Alone);
                    tracing::warn!(
                        "cluster: {e}; serving alone and retrying every {:?}",
                        node.keepalive_every
                    );
                }
            },
            Err(JoinError::Etcd(e)) => return Err(e.into()),
            Err(JoinError::Cntlid(e)) => return Err(ClusterError::Cntlid(e)),
            Err(JoinError::Mismatch(m)) => return Err(ClusterError::Mismatch(m)),
            Err(JoinError::Taken) => {
                return Err(ClusterError::NameTaken {
                    node: node.name.clone(),
                    cluster: cfg.name.clone(),
                    key: String::from_utf8_lossy(&node.key).into_owned(),
                })
            }
        }
        let status = node.status.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let thread = std::thread::Builder::new()
            .name("cluster".into())
            .spawn(move || node.run(&st))
            .map_err(ClusterError::Thread)?;
        Ok(Cluster {
            status,
            stop,
            thread: Some(thread),
        })
    }

    /// A reader of the status, for RPC and metrics.
    pub fn view(&self) -> ClusterView {
        ClusterView(self.status.clone())
    }

    /// Stops the thread; a joined node revokes its lease, so its record goes
    /// at once rather than at the TTL.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A shared reader of a node's cluster status.
#[derive(Clone)]
pub struct ClusterView(Arc<Mutex<ClusterStatus>>);

impl ClusterView {
    pub fn snapshot(&self) -> ClusterStatus {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The thread's state.
struct Node {
    client: Client,
    cluster: String,
    name: String,
    /// `/kvtarget/<cluster>/members/<name>` and the members prefix.
    key: Vec<u8>,
    prefix: Vec<u8>,
    instance: String,
    target: Arc<Target>,
    metrics_url: Option<String>,
    started_at: u64,
    ttl: Duration,
    keepalive_every: Duration,
    state: NodeState,
    lease: Option<i64>,
    /// When etcd last confirmed the lease.
    confirmed: Instant,
    /// When the next keep-alive or join attempt is due.
    due: Instant,
    /// The target's discovery generation the record was built at.
    genctr: u64,
    /// The record as last put.
    record: Vec<u8>,
    /// A changed record could not be put: retried at the next keep-alive.
    record_stale: bool,
    /// Another process's record of this name was reported (once per loss).
    taken_reported: bool,
    /// The namespace conflict with a member last logged.
    mismatch_reported: Option<String>,
    status: Arc<Mutex<ClusterStatus>>,
    /// The elections of cluster-wide subsystems' ANA groups, if any.
    election: Option<Election>,
    /// The cluster-wide subsystems' NQNs, and the controller ID block they
    /// allocate from once claimed (`cntlid`).
    cluster_wide: Vec<String>,
    cntlid_block: Option<u16>,
}

fn random_instance() -> String {
    let mut b = [0u8; 8];
    // Without randomness, the clock's nanoseconds still tell two starts apart.
    if getrandom::fill(&mut b).is_err() {
        let ns = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        b = (ns.as_nanos() as u64 ^ u64::from(std::process::id())).to_le_bytes();
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl Node {
    fn new(cfg: &ClusterConfig, target: Arc<Target>, metrics_url: Option<String>) -> Node {
        let name = cfg.node_name();
        let prefix = format!("/kvtarget/{}/members/", cfg.name).into_bytes();
        let key = [prefix.as_slice(), name.as_bytes()].concat();
        let ttl = Duration::from_secs(cfg.lease_ttl_secs);
        let keepalive_every = ttl / 3;
        let now = Instant::now();
        let client = Client::new(
            cfg.endpoint_addrs(),
            keepalive_every.max(MIN_REQUEST_TIMEOUT),
        );
        let status = ClusterStatus {
            cluster: cfg.name.clone(),
            node: name.clone(),
            state: NodeState::Joining,
            lease_id: None,
            lease_ttl_secs: cfg.lease_ttl_secs,
            endpoint: client.endpoint().into(),
            members: Vec::new(),
            groups: Vec::new(),
        };
        Node {
            client,
            cluster: cfg.name.clone(),
            name,
            key,
            prefix,
            instance: random_instance(),
            target,
            metrics_url,
            started_at: SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            ttl,
            keepalive_every,
            state: NodeState::Joining,
            lease: None,
            confirmed: now,
            due: now,
            genctr: 0,
            record: Vec::new(),
            record_stale: false,
            taken_reported: false,
            mismatch_reported: None,
            status: Arc::new(Mutex::new(status)),
            election: None,
            cluster_wide: Vec::new(),
            cntlid_block: None,
        }
    }

    /// This node's record as it would be put now.
    fn record_now(&mut self) -> Vec<u8> {
        self.genctr = self.target.genctr.load(Ordering::Relaxed);
        let served = member::served(&self.target, &self.cluster_wide);
        let r = MemberRecord {
            format: RECORD_FORMAT,
            name: self.name.clone(),
            instance: self.instance.clone(),
            listeners: served.listeners,
            subsystems: served.subsystems,
            metrics_url: self.metrics_url.clone(),
            version: kvt_nvmf::version().to_string(),
            started_at: self.started_at,
        };
        serde_json::to_vec(&r).expect("a member record serialises")
    }

    /// Takes a new lease and puts the record with it, if no other process
    /// holds this node's name; while one does, retries until `deadline`.
    fn join(&mut self, deadline: Instant) -> Result<(), JoinError> {
        self.check_peers()?;
        self.claim_cntlid_block()?;
        let sent = Instant::now();
        let grant = self.client.lease_grant(self.ttl.as_secs() as i64)?;
        let lease = grant.id;
        loop {
            match self.claim(lease) {
                Ok(true) => break,
                Ok(false) if Instant::now() < deadline => std::thread::sleep(CLAIM_RETRY),
                Ok(false) => {
                    let _ = self.client.lease_revoke(lease);
                    return Err(JoinError::Taken);
                }
                Err(e) => {
                    let _ = self.client.lease_revoke(lease);
                    return Err(e.into());
                }
            }
        }
        self.confirmed = Instant::now();
        self.lease = Some(lease);
        self.taken_reported = false;
        self.set_state(NodeState::Joined);
        self.on_lease_event(LeaseEvent::Granted { lease });
        if let Some(e) = &self.election {
            e.input(Input::LeaseGranted {
                lease,
                sent: e.clock(sent),
            });
            e.campaign(&mut self.client);
        }
        self.refresh_members();
        Ok(())
    }

    /// Before a join: no member serves one of this node's cluster-wide
    /// subsystems with other namespaces (a host would see two different
    /// namespaces under one identity, one per path).
    fn check_peers(&mut self) -> Result<(), JoinError> {
        if self.cluster_wide.is_empty() {
            return Ok(());
        }
        let ours = member::served(&self.target, &self.cluster_wide).subsystems;
        let conflict = self
            .read_members()?
            .iter()
            .filter(|m| m.name != self.name)
            .find_map(|m| member::mismatch(&ours, m));
        match conflict {
            Some(m) => Err(JoinError::Mismatch(m)),
            None => Ok(()),
        }
    }

    /// Before the first join: the controller ID block of this node's
    /// cluster-wide subsystems (none: nothing to claim).
    fn claim_cntlid_block(&mut self) -> Result<(), JoinError> {
        if self.cntlid_block.is_some() || self.cluster_wide.is_empty() {
            return Ok(());
        }
        let b = match super::cntlid::claim(&mut self.client, &self.cluster, &self.name) {
            Ok(b) => b,
            Err(super::cntlid::CntlidError::Etcd(e)) => return Err(JoinError::Etcd(e)),
            Err(e) => return Err(JoinError::Cntlid(e)),
        };
        let (lo, hi) = super::cntlid::block_range(b);
        for nqn in &self.cluster_wide {
            if let Some(s) = self.target.find_subsystem(nqn) {
                s.set_cntlid_range(lo, hi);
            }
        }
        tracing::info!(
            node = %self.name,
            "cluster: controller IDs {lo}..={hi} (block {b}) for the cluster-wide subsystems"
        );
        self.cntlid_block = Some(b);
        Ok(())
    }

    /// Puts the record under `lease` if the key is absent (a transaction on
    /// its create revision) or holds this process's own earlier record
    /// (a rejoin while etcd still has it). False: another process holds it.
    fn claim(&mut self, lease: i64) -> Result<bool, EtcdError> {
        let value = self.record_now();
        let put = PutRequest {
            key: self.key.clone(),
            value: value.clone(),
            lease,
        };
        let txn = TxnRequest {
            compare: vec![Compare {
                result: "EQUAL".into(),
                target: "CREATE".into(),
                key: self.key.clone(),
                create_revision: 0,
            }],
            success: vec![RequestOp::RequestPut(put.clone())],
            failure: vec![RequestOp::RequestRange(RangeRequest {
                key: self.key.clone(),
                range_end: Vec::new(),
            })],
        };
        let answer = self.client.txn(&txn)?;
        let mine = answer.succeeded || self.holds_own_record(&answer.responses);
        if mine {
            if !answer.succeeded {
                self.client.put(&put)?;
            }
            self.record = value;
        }
        Ok(mine)
    }

    /// Whether a failed put-if-absent found this process's own record.
    fn holds_own_record(&self, responses: &[ResponseOp]) -> bool {
        responses.iter().any(|r| match r {
            ResponseOp::ResponseRange(r) => r.kvs.iter().any(|kv| {
                serde_json::from_slice::<MemberRecord>(&kv.value)
                    .is_ok_and(|m| m.instance == self.instance)
            }),
            ResponseOp::ResponsePut(_) | ResponseOp::ResponseDeleteRange(_) => false,
        })
    }

    fn run(mut self, stop: &AtomicBool) {
        self.due = Instant::now() + self.keepalive_every;
        while !stop.load(Ordering::Acquire) {
            let now = Instant::now();
            if now >= self.due {
                self.due = now + self.keepalive_every;
                match self.state {
                    NodeState::Joined => self.keep_alive(now),
                    NodeState::Joining | NodeState::Lost | NodeState::Alone => self.rejoin(),
                }
            }
            if let (NodeState::Joined, Some(lease)) = (self.state, self.lease) {
                if self.election.as_ref().is_some_and(|e| e.is_spent(lease)) {
                    self.lose(lease, "fenced: no keep-alive answer for half the TTL");
                    continue;
                }
            }
            if self.state == NodeState::Joined
                && self.target.genctr.load(Ordering::Relaxed) != self.genctr
            {
                self.refresh_record();
            }
            std::thread::sleep(POLL_STEP);
        }
        if let Some(mut e) = self.election.take() {
            // Inaccessible before the keys go: a peer may win at once.
            e.stop(self.lease);
        }
        if let Some(lease) = self.lease.take() {
            if let Err(e) = self.client.lease_revoke(lease) {
                tracing::warn!("cluster: revoking lease {lease:x} at stop: {e}");
            }
        }
    }

    fn keep_alive(&mut self, now: Instant) {
        let lease = self.lease.expect("a joined node holds a lease");
        match self.client.lease_keepalive(lease) {
            Ok(a) if a.ttl > 0 => {
                self.confirmed = now;
                if let Some(e) = &self.election {
                    e.input(Input::KeepAliveAnswered {
                        lease,
                        sent: e.clock(now),
                    });
                    e.campaign(&mut self.client);
                }
                if self.record_stale {
                    self.refresh_record();
                }
                self.refresh_members();
            }
            Ok(_) => {
                if let Some(e) = &self.election {
                    e.input(Input::LeaseGone { lease });
                }
                self.lose(lease, "etcd no longer knows the lease")
            }
            Err(e) if now.duration_since(self.confirmed) > self.ttl => self.lose(
                lease,
                &format!("no keep-alive answer for {:?}: {e}", self.ttl),
            ),
            Err(e) => tracing::debug!("cluster: keep-alive of lease {lease:x}: {e}"),
        }
    }

    /// The lease cannot be trusted any more: logged once, a new one is sought.
    fn lose(&mut self, lease: i64, why: &str) {
        tracing::warn!(
            "cluster: node `{}` lost lease {lease:x}: {why}; rejoining",
            self.name
        );
        self.set_state(NodeState::Lost);
        self.on_lease_event(LeaseEvent::Lost { lease });
        self.due = Instant::now();
    }

    /// A lost node first asks whether its lease lives on (etcd restarted
    /// with its data keeps leases); otherwise it joins with a new one.
    fn rejoin(&mut self) {
        if self.election.is_some() {
            self.rejoin_fresh();
            return;
        }
        if let Some(lease) = self.lease {
            match self.client.lease_keepalive(lease) {
                Ok(a) if a.ttl > 0 => {
                    self.confirmed = Instant::now();
                    self.set_state(NodeState::Joined);
                    self.on_lease_event(LeaseEvent::Granted { lease });
                    self.refresh_record();
                    self.refresh_members();
                    return;
                }
                Ok(_) => self.lease = None,
                Err(e) => {
                    tracing::debug!("cluster: rejoin: {e}");
                    return;
                }
            }
        }
        match self.join(Instant::now()) {
            Ok(()) => {}
            Err(JoinError::Etcd(e)) => tracing::debug!("cluster: rejoin: {e}"),
            Err(JoinError::Cntlid(e)) => tracing::warn!("{e}"),
            Err(JoinError::Mismatch(m)) => self.report_mismatch(m),
            Err(JoinError::Taken) if !self.taken_reported => {
                self.taken_reported = true;
                tracing::warn!(
                    "cluster: node `{}`: another live kvtarget holds {}; still retrying",
                    self.name,
                    String::from_utf8_lossy(&self.key)
                )
            }
            Err(JoinError::Taken) => {}
        }
    }

    /// A node that elects owners never reuses a lease it stopped trusting:
    /// it revokes it (its owner keys go at once, peers need not wait for
    /// the TTL) and joins with a fresh one.
    fn rejoin_fresh(&mut self) {
        if let Some(lease) = self.lease {
            match self.client.lease_revoke(lease) {
                Ok(_) => self.lease = None,
                Err(e) if e.is_unreachable() => {
                    tracing::debug!("cluster: rejoin: {e}");
                    return;
                }
                // Unknown to etcd already (expired): nothing to revoke.
                Err(_) => self.lease = None,
            }
        }
        match self.join(Instant::now()) {
            Ok(()) => {}
            Err(JoinError::Etcd(e)) => tracing::debug!("cluster: rejoin: {e}"),
            Err(JoinError::Cntlid(e)) => tracing::warn!("{e}"),
            Err(JoinError::Mismatch(m)) => self.report_mismatch(m),
            Err(JoinError::Taken) => tracing::debug!(
                "cluster: node `{}`: {} still held; retrying",
                self.name,
                String::from_utf8_lossy(&self.key)
            ),
        }
    }

    /// Puts the record again when what the target serves changed.
    fn refresh_record(&mut self) {
        let value = self.record_now();
        if value == self.record {
            return;
        }
        let Some(lease) = self.lease else { return };
        let put = PutRequest {
            key: self.key.clone(),
            value: value.clone(),
            lease,
        };
        match self.client.put(&put) {
            Ok(_) => {
                self.record = value;
                self.record_stale = false;
                self.refresh_members();
            }
            Err(e) => {
                self.record_stale = true;
                tracing::debug!("cluster: record refresh (retried at the next keep-alive): {e}");
            }
        }
    }

    /// Every member's record in etcd (this node's included), by name;
    /// records this version cannot read are skipped.
    fn read_members(&mut self) -> Result<Vec<MemberRecord>, EtcdError> {
        let req = RangeRequest {
            key: self.prefix.clone(),
            range_end: etcd::prefix_end(&self.prefix),
        };
        let mut members: Vec<MemberRecord> = self
            .client
            .range(&req)?
            .kvs
            .iter()
            .filter_map(
                |kv| match serde_json::from_slice::<MemberRecord>(&kv.value) {
                    Ok(m) => Some(m),
                    Err(e) => {
                        tracing::debug!(
                            "cluster: skipping {}: {e}",
                            String::from_utf8_lossy(&kv.key)
                        );
                        None
                    }
                },
            )
            .collect();
        members.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(members)
    }

    /// Re-reads every member's record; a member serving one of this node's
    /// cluster-wide subsystems otherwise (its namespaces changed at run
    /// time) is reported.
    fn refresh_members(&mut self) {
        match self.read_members() {
            Ok(members) => {
                let ours = member::served(&self.target, &self.cluster_wide).subsystems;
                match members
                    .iter()
                    .filter(|m| m.name != self.name)
                    .find_map(|m| member::mismatch(&ours, m))
                {
                    Some(m) => self.report_mismatch(m),
                    None => self.mismatch_reported = None,
                }
                self.refer_to_peers(&members);
                self.publish(|s| s.members = members);
            }
            Err(e) => tracing::debug!("cluster: member list: {e}"),
        }
    }

    /// A namespace conflict with a member, logged when it first shows.
    fn report_mismatch(&mut self, m: String) {
        if self.mismatch_reported.as_deref() != Some(m.as_str()) {
            tracing::error!(
                "cluster: {m}; every node must serve a cluster-wide subsystem's namespaces alike"
            );
            self.mismatch_reported = Some(m);
        }
    }

    /// The discovery log refers hosts to every live peer (the members now in
    /// etcd but this node). A change bumps the discovery generation, which
    /// raises the Discovery Log Page Change event on the reactors; the record
    /// refresh it also prompts finds the record unchanged.
    fn refer_to_peers(&self, members: &[MemberRecord]) {
        let peers = referral::referrals(members, &self.name);
        let count = peers.len();
        if self.target.set_referrals(peers) {
            tracing::info!("cluster: discovery log refers to {count} peer(s)");
        }
    }

    fn set_state(&mut self, state: NodeState) {
        if self.state != state && state == NodeState::Joined {
            tracing::info!(
                "cluster: node `{}` joined cluster `{}` (lease {:x})",
                self.name,
                self.cluster,
                self.lease.unwrap_or(0)
            );
        }
        self.state = state;
        let lease = match state {
            NodeState::Joined => self.lease.map(|l| format!("{l:x}")),
            _ => None,
        };
        let endpoint = self.client.endpoint().to_string();
        self.publish(|s| {
            s.state = state;
            s.lease_id = lease;
            s.endpoint = endpoint;
        });
    }

    fn publish(&self, f: impl FnOnce(&mut ClusterStatus)) {
        f(&mut self.status.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// The fencing hook: nothing acts on a lease change yet but the log.
    fn on_lease_event(&self, ev: LeaseEvent) {
        tracing::debug!("cluster: {ev:?}");
    }
}
