//! The NVMe-oF target model: subsystems, namespaces, controllers, discovery.
//!
//! These objects are shared by every reactor, so they are read-mostly: the data path
//! reads namespaces through each queue's `Arc` table (refreshed when the namespace
//! generation moves) and touches controllers only through atomics. Mutexes here guard
//! control-path state (admin commands, connect, configuration), never an I/O.

pub mod admin;
pub mod ana;
pub mod ana_state;
pub mod auth;
mod authenticate;
pub mod command;
pub mod connect;
pub mod controller;
pub mod errlog;
pub mod fabrics;
pub mod io;
pub mod log_page;
pub mod ns_table;
pub mod plan;
pub mod queue;
pub mod request;
pub mod reservation;
pub mod resv_notice;

pub use controller::Controller;
use kvt_bdev::SharedDevice;
use kvt_pool::channel::VolumeDevice;
use kvt_wire::nvme::{self, DiscoveryEntry};

/// Version string: crate version plus git commit when known (build.rs).
pub fn version() -> String {
    match option_env!("KVTARGET_GIT_REV") {
        Some(r) if !r.is_empty() => format!("{} ({r})", env!("CARGO_PKG_VERSION")),
        _ => env!("CARGO_PKG_VERSION").to_string(),
    }
}

/// Maximum namespaces per subsystem (NN, MNAN).
pub const MAX_NAMESPACES: u32 = 1024;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// IEEE OUI reported in Identify Controller. 0 would be "not reported"; we report
/// none rather than borrow someone else's.
pub const IEEE_OUI: [u8; 3] = [0, 0, 0];

/// Transport limits shared by every listener of one transport.
#[derive(Debug, Clone)]
pub struct TransportLimits {
    /// Maximum queue entries per I/O queue (MQES + 1, MAXCMD).
    pub max_queue_depth: u16,
    /// Maximum admin queue entries.
    pub max_admin_queue_depth: u16,
    /// Maximum number of I/O queues per controller.
    pub max_io_queues: u16,
    /// In-capsule data accepted on I/O queues (bytes).
    pub in_capsule_data: u32,
    /// Largest single transfer (bytes, a power of two ≥ 4 KiB): MDTS.
    pub max_io_size: u32,
    /// MAXH2CDATA advertised in ICResp.
    pub max_h2c_data: u32,
    /// Largest R2T we issue (bytes); a write larger than this needs several R2Ts.
    pub max_r2t_len: u32,
    /// Writes whose data a connection asks for at once (R2Ts outstanding).
    pub max_active_r2ts: u16,
    /// SO_RCVBUF / SO_SNDBUF for each connection (0: the kernel's auto-tuning).
    pub recv_buf_size: u32,
    pub send_buf_size: u32,
    /// Send C2HData with the SUCCESS flag and no CapsuleResp (as SPDK does).
    pub c2h_success: bool,
    /// Largest C2HData PDU (`tcp.max_c2h_data`): longer read data is split.
    pub max_c2h_data: u32,
}

impl Default for TransportLimits {
    fn default() -> Self {
        TransportLimits {
            max_queue_depth: 128,
            max_admin_queue_depth: 128,
            max_io_queues: 127,
            in_capsule_data: 8192,
            max_io_size: 1 << 20,
            max_h2c_data: 128 << 10,
            max_r2t_len: 1 << 20,
            max_active_r2ts: 8,
            recv_buf_size: 0,
            send_buf_size: 0,
            c2h_success: true,
            max_c2h_data: 128 << 10,
        }
    }
}

/// The admin queue always takes at least this much in-capsule data: the Linux host
/// assumes 8 KiB there, and Connect carries 1 KiB.
pub const ADMIN_IN_CAPSULE_DATA: u32 = 8192;

/// A transport listener, as the discovery log describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    pub addr: SocketAddr,
    /// Discovery-only listeners (port 8009) do not list themselves as NVM ports.
    pub discovery_only: bool,
    pub portid: u16,
    /// NVMe/RDMA rather than NVMe/TCP.
    pub rdma: bool,
    /// NVMe/TCP with TLS 1.3 required (`secure_channel`).
    pub secure: bool,
}

/// The I/O command set a namespace speaks, named by its Command Set
/// Identifier in Identify and in the namespace identification descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandSet {
    /// NVM Command Set (CSI 00h): block volumes.
    Nvm,
    /// Key Value Command Set (CSI 01h).
    KeyValue,
}

impl CommandSet {
    pub const fn csi(self) -> u8 {
        match self {
            CommandSet::Nvm => nvme::csi::NVM,
            CommandSet::KeyValue => nvme::csi::KEY_VALUE,
        }
    }
    pub fn from_csi(csi: u8) -> Option<CommandSet> {
        match csi {
            nvme::csi::NVM => Some(CommandSet::Nvm),
            nvme::csi::KEY_VALUE => Some(CommandSet::KeyValue),
            _ => None,
        }
    }
}

/// One namespace: a block device with a block size and identifiers.
pub struct Namespace {
    pub nsid: u32,
    /// Which command set its I/O commands belong to.
    pub command_set: CommandSet,
    pub dev: SharedDevice,
    pub block_size: u32,
    pub num_blocks: u64,
    pub uuid: [u8; 16],
    pub nguid: [u8; 16],
    pub eui64: [u8; 8],
    /// Process-unique key for per-reactor channel caches.
    pub key: u64,
    /// Removed from its subsystem: reactors drop their channels to it.
    pub removed: AtomicBool,
    /// No volatile write cache: every write is durable before its completion
    /// (run as FUA), and Identify says so when all of a subsystem's
    /// namespaces are like this.
    pub write_through: bool,
    /// The key index of a KV namespace (a KV volume's).
    pub kv: Option<Arc<dyn kvt_pool::kv_index::KeyIndex>>,
    /// Registrants and reservation (NVMe reservations).
    pub reservation: reservation::NsReservation,
    /// Its ANA group (ANAGRPID; its NSID unless configured), read per I/O
    /// command by `ana::io_status`.
    pub ana_group: std::sync::atomic::AtomicU32,
}

static NEXT_NS_KEY: AtomicU64 = AtomicU64::new(1);

impl Namespace {
    /// Builds a namespace; identifiers are derived from the subsystem NQN and NSID
    /// so they stay the same across restarts with the same configuration.
    pub fn new(subnqn: &str, nsid: u32, dev: SharedDevice, block_size: u32) -> Namespace {
        let block_size = dev.block_size().unwrap_or(block_size);
        let num_blocks = dev.size_bytes() / block_size as u64;
        // A volume carries its own persistent identity; other devices get one
        // derived from where they are served.
        let uuid = match dev.thin_info() {
            Some(t) => t.uuid,
            None => stable_uuid(&format!("{subnqn}/ns/{nsid}")),
        };
        let mut eui64 = [0u8; 8];
        eui64.copy_from_slice(&uuid[8..16]);
        // A pool volume keeps its reservation in the pool's metadata.
        let reservation = match dev.as_any().and_then(|d| d.downcast_ref::<VolumeDevice>()) {
            Some(v) => reservation::NsReservation::for_pool_volume(v.pool.clone(), &v.vol, uuid),
            None => reservation::NsReservation::default(),
        };
        Namespace {
            nsid,
            // Block volumes; KV namespaces get their own constructor with the
            // KV store behind them.
            command_set: CommandSet::Nvm,
            dev,
            block_size,
            num_blocks,
            uuid,
            nguid: uuid,
            eui64,
            key: NEXT_NS_KEY.fetch_add(1, Ordering::Relaxed),
            removed: AtomicBool::new(false),
            write_through: false,
            kv: None,
            reservation,
            ana_group: ana::initial_group(nsid),
        }
    }
    /// The namespace as a KV namespace (Key Value command set) over `index`,
    /// which lives with the volume `dev` is.
    pub fn with_kv(mut self, index: Arc<dyn kvt_pool::kv_index::KeyIndex>) -> Namespace {
        self.command_set = CommandSet::KeyValue;
        self.kv = Some(index);
        self
    }
    /// The namespace with its registrations persisting through power loss
    /// in `path` (SPDK's `ptpl_file`), loaded from it when it exists. On a
    /// pool volume the file overrides the pool's record (docs/reservations.md).
    pub fn with_ptpl_file(
        mut self,
        path: std::path::PathBuf,
    ) -> Result<Namespace, reservation::ptpl::PtplError> {
        self.reservation = reservation::NsReservation::with_ptpl_file(path, self.uuid)?;
        Ok(self)
    }
    /// The namespace with or without a volatile write cache.
    pub fn with_write_cache(mut self, on: bool) -> Namespace {
        self.write_through = !on;
        self
    }
    /// The largest value a KV namespace takes: one command's data (MDTS),
    /// and no more than the namespace holds.
    pub fn kv_value_max(&self, max_io_size: u32) -> u32 {
        let cap = self.num_blocks.saturating_mul(self.block_size as u64);
        (max_io_size as u64).min(cap) as u32
    }
    pub fn lbads(&self) -> u8 {
        self.block_size.trailing_zeros() as u8
    }
}

impl kvt_reactor::ChannelSource for Namespace {
    fn key(&self) -> u64 {
        self.key
    }
    fn shared(&self) -> Option<(u64, u32)> {
        self.dev.shared_channel()
    }
    fn removed(&self) -> bool {
        self.removed.load(Ordering::Acquire)
    }
    fn open_channel(&self) -> std::io::Result<Box<dyn kvt_bdev::IoChannel>> {
        self.dev.open_channel()
    }
    fn describe(&self) -> String {
        format!("nsid {} ({})", self.nsid, self.dev.describe())
    }
}

pub use kvt_wire::ident::stable_uuid;

/// What kind of subsystem an NQN names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubsystemKind {
    Nvm,
    Discovery,
}

/// Why a namespace could not be added to a subsystem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NamespaceError {
    #[error("NSID {nsid} is already in use in {nqn}")]
    InUse { nsid: u32, nqn: String },
    #[error("namespace table poisoned")]
    Poisoned,
}

pub struct Subsystem {
    pub nqn: String,
    pub kind: SubsystemKind,
    pub serial: String,
    pub model: String,
    pub allow_any_host: AtomicBool,
    /// Identify Namespace (CNS 00h) of a KV namespace answers an NVM-shaped
    /// structure (config `nvm_identify_for_kv`; hosts that need it: SPDK v26.05).
    pub nvm_identify_for_kv: AtomicBool,
    pub hosts: RwLock<Vec<String>>,
    /// DH-HMAC-CHAP keys of listed hosts, by host NQN: a host with keys must
    /// authenticate every queue. Entries leave with their host.
    pub host_keys: RwLock<HashMap<String, auth::HostKeys>>,
    /// NVMe/TCP TLS PSKs of listed hosts, by host NQN (SPDK's `psk`): such a host
    /// is admitted only through a secure channel keyed by this PSK.
    pub host_psks: RwLock<HashMap<String, Arc<kvt_auth::Key>>>,
    pub namespaces: RwLock<Vec<Arc<Namespace>>>,
    /// Bumped whenever the namespace list changes; queues refresh their snapshot.
    pub ns_gen: AtomicU64,
    /// Addresses hosts may reach this subsystem on; `None`: every NVM listener
    /// of the target (subsystems from the configuration). Subsystems created
    /// over RPC start with none, as in SPDK.
    pub listen: RwLock<Option<Vec<SocketAddr>>>,
    pub controllers: Mutex<HashMap<u16, Arc<Controller>>>,
    next_cntlid: AtomicU16,
    /// The controller IDs this subsystem allocates from, inclusive: all of
    /// 1..=0xFFEF alone; a cluster-wide subsystem's node its own block
    /// (`cluster::cntlid`), as hosts refuse a CNTLID they already have.
    cntlid_min: AtomicU16,
    cntlid_max: AtomicU16,
    /// Asymmetric Namespace Access: reporting on or off, per-listener states.
    pub ana: ana::SubsystemAna,
}

impl Subsystem {
    pub fn new(
        nqn: &str,
        kind: SubsystemKind,
        serial: &str,
        model: &str,
        allow_any_host: bool,
        hosts: Vec<String>,
    ) -> Subsystem {
        Subsystem {
            nqn: nqn.to_string(),
            kind,
            serial: serial.to_string(),
            model: model.to_string(),
            allow_any_host: AtomicBool::new(allow_any_host),
            nvm_identify_for_kv: AtomicBool::new(false),
            hosts: RwLock::new(hosts),
            host_keys: RwLock::new(HashMap::new()),
            host_psks: RwLock::new(HashMap::new()),
            namespaces: RwLock::new(Vec::new()),
            ns_gen: AtomicU64::new(0),
            listen: RwLock::new(None),
            controllers: Mutex::new(HashMap::new()),
            next_cntlid: AtomicU16::new(1),
            cntlid_min: AtomicU16::new(1),
            cntlid_max: AtomicU16::new(MAX_CNTLID),
            ana: ana::SubsystemAna::default(),
        }
    }

    pub fn host_allowed(&self, hostnqn: &str) -> bool {
        self.kind == SubsystemKind::Discovery
            || self.allow_any_host.load(Ordering::Acquire)
            || self
                .hosts
                .read()
                .map(|h| h.iter().any(|x| x == hostnqn))
                .unwrap_or(false)
    }

    /// The keys `hostnqn` must authenticate with here, if any.
    pub fn host_keys(&self, hostnqn: &str) -> Option<auth::HostKeys> {
        self.host_keys.read().ok()?.get(hostnqn).cloned()
    }

    /// The TLS PSK `hostnqn` must connect with here, if any.
    pub fn host_psk(&self, hostnqn: &str) -> Option<Arc<kvt_auth::Key>> {
        self.host_psks.read().ok()?.get(hostnqn).cloned()
    }

    /// Whether hosts may reach this subsystem through local address `local`.
    pub fn listener_allowed(&self, local: SocketAddr) -> bool {
        if self.kind == SubsystemKind::Discovery {
            return true;
        }
        match self.listen.read().ok().as_deref() {
            Some(Some(l)) => l.iter().any(|a| {
                a.port() == local.port() && (a.ip() == local.ip() || a.ip().is_unspecified())
            }),
            _ => true,
        }
    }

    pub fn namespace(&self, nsid: u32) -> Option<Arc<Namespace>> {
        self.namespaces
            .read()
            .ok()?
            .iter()
            .find(|n| n.nsid == nsid)
            .cloned()
    }

    /// Adds a namespace while hosts may be connected; they get the Namespace
    /// Attribute Changed event.
    pub fn add_namespace(&self, ns: Arc<Namespace>) -> Result<(), NamespaceError> {
        let nsid = ns.nsid;
        {
            let mut v = self
                .namespaces
                .write()
                .map_err(|_| NamespaceError::Poisoned)?;
            if v.iter().any(|n| n.nsid == nsid) {
                return Err(NamespaceError::InUse {
                    nsid,
                    nqn: self.nqn.clone(),
                });
            }
            v.push(ns);
            v.sort_by_key(|n| n.nsid);
        }
        self.ns_gen.fetch_add(1, Ordering::AcqRel);
        self.notify_namespace_changed(nsid);
        Ok(())
    }

    /// Removes a namespace; commands already running on it complete, new ones
    /// get Invalid Namespace.
    pub fn remove_namespace(&self, nsid: u32) -> Option<Arc<Namespace>> {
        let removed = {
            let mut v = self.namespaces.write().ok()?;
            let i = v.iter().position(|n| n.nsid == nsid)?;
            v.remove(i)
        };
        removed.removed.store(true, Ordering::Release);
        self.ns_gen.fetch_add(1, Ordering::AcqRel);
        self.notify_namespace_changed(nsid);
        Some(removed)
    }

    /// Swaps the namespace with `ns`'s NSID for `ns` (a shared pool's
    /// namespace attached or detached: same NSID and identity): a removal and
    /// an addition in one step, so no command sees Invalid Namespace in
    /// between; the old one is `removed` and comes back. None (and nothing
    /// changes) when there is no such namespace.
    pub fn replace_namespace(&self, ns: Arc<Namespace>) -> Option<Arc<Namespace>> {
        let nsid = ns.nsid;
        let old = {
            let mut v = self.namespaces.write().ok()?;
            let slot = v.iter_mut().find(|n| n.nsid == nsid)?;
            std::mem::replace(slot, ns)
        };
        old.removed.store(true, Ordering::Release);
        self.ns_gen.fetch_add(1, Ordering::AcqRel);
        self.notify_namespace_changed(nsid);
        Some(old)
    }

    fn notify_namespace_changed(&self, nsid: u32) {
        let ctrls: Vec<Arc<Controller>> = self
            .controllers
            .lock()
            .map(|c| c.values().cloned().collect())
            .unwrap_or_default();
        for c in ctrls {
            c.namespace_changed(nsid);
        }
    }

    /// Tears down every controller of `hostnqn` (host removed from the list).
    pub fn disconnect_host(&self, hostnqn: &str) -> usize {
        let ctrls: Vec<Arc<Controller>> = self
            .controllers
            .lock()
            .map(|c| {
                c.values()
                    .filter(|c| c.hostnqn == hostnqn)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        for c in &ctrls {
            c.fail();
        }
        ctrls.len()
    }

    pub fn namespace_snapshot(&self) -> Vec<Arc<Namespace>> {
        self.namespaces
            .read()
            .map(|n| n.clone())
            .unwrap_or_default()
    }

    /// The controller IDs this subsystem allocates from, inclusive.
    pub fn cntlid_range(&self) -> (u16, u16) {
        (
            self.cntlid_min.load(Ordering::Relaxed),
            self.cntlid_max.load(Ordering::Relaxed),
        )
    }

    /// Allocates controller IDs from `min..=max` from now on (1 <= min <=
    /// max <= 0xFFEF; 0xFFF0 and above are reserved).
    pub fn set_cntlid_range(&self, min: u16, max: u16) {
        assert!(
            (1..=max).contains(&min) && max <= MAX_CNTLID,
            "controller ID range {min}..={max}"
        );
        self.cntlid_min.store(min, Ordering::Relaxed);
        self.cntlid_max.store(max, Ordering::Relaxed);
        self.next_cntlid.store(min, Ordering::Relaxed);
    }

    /// Allocates a controller ID of the subsystem's range not in use.
    pub fn alloc_cntlid(&self, in_use: &HashMap<u16, Arc<Controller>>) -> Option<u16> {
        let (min, max) = self.cntlid_range();
        for _ in min..=max {
            let id = self.next_cntlid.fetch_add(1, Ordering::Relaxed);
            let id = if !(min..=max).contains(&id) {
                self.next_cntlid
                    .store(min.wrapping_add(1), Ordering::Relaxed);
                min
            } else {
                id
            };
            if !in_use.contains_key(&id) {
                return Some(id);
            }
        }
        None
    }
}

/// The largest controller ID (0xFFF0 and above are reserved).
pub const MAX_CNTLID: u16 = 0xFFEF;

/// How failed commands are counted in metrics.
pub const ERROR_KINDS: [&str; 8] = [
    "invalid_namespace",
    "invalid_command",
    "lba_out_of_range",
    "capacity_exceeded",
    "unwritten_block",
    "media",
    "aborted",
    "other",
];

/// The `ERROR_KINDS` index of a status.
pub fn error_kind(s: nvme::Status) -> usize {
    use nvme::Status as S;
    if s == S::INVALID_NAMESPACE {
        0
    } else if s == S::INVALID_OPCODE || s == S::INVALID_FIELD || s.sct == 1 {
        1
    } else if s == S::LBA_OUT_OF_RANGE {
        2
    } else if s == S::CAPACITY_EXCEEDED {
        3
    } else if s == S::DEALLOCATED_OR_UNWRITTEN {
        4
    } else if s.sct == 2 {
        5
    } else if s == S::ABORTED_SQ_DELETION || s == S::ABORT_REQUESTED {
        6
    } else {
        7
    }
}

/// I/O counters of one queue pair (one host connection), written only by the
/// reactor that owns it and summed by the metrics exporter.
#[derive(Debug, Default)]
pub struct QpairStats {
    pub subnqn: String,
    pub cntlid: u16,
    pub qid: u16,
    pub peer: String,
    pub reads: AtomicU64,
    pub read_bytes: AtomicU64,
    pub writes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub other: AtomicU64,
    pub errors: AtomicU64,
    /// Errors by kind (`ERROR_KINDS`).
    pub errors_by: [AtomicU64; ERROR_KINDS.len()],
    /// Command latency (capsule in to response out) histograms for reads and
    /// writes, buckets as `stats::latency_bucket`, plus sums in ns.
    pub read_hist: [AtomicU64; kvt_mem::stats::LATENCY_BUCKETS],
    pub write_hist: [AtomicU64; kvt_mem::stats::LATENCY_BUCKETS],
    pub read_ns: AtomicU64,
    pub write_ns: AtomicU64,
    /// Media and data integrity errors (SMART), not counting reads of
    /// unwritten blocks (KV-cache misses).
    pub media_errors: AtomicU64,
    /// This queue's Error Information entries (its controller's log reads them).
    pub error_log: errlog::ErrorRing,
    /// Its DH-HMAC-CHAP transaction as `nvmf_subsystem_get_qpairs` shows it (SPDK's
    /// names): state, hash, DH group. Written once per authentication step.
    pub auth: Mutex<Option<auth::AuthStatus>>,
}

/// The whole target: subsystems and listeners, shared by reactors and the control
/// thread.
pub struct Target {
    pub subsystems: RwLock<Vec<Arc<Subsystem>>>,
    pub discovery: Arc<Subsystem>,
    pub listeners: RwLock<Vec<Listener>>,
    /// Other discovery services the discovery log refers hosts to (subtype
    /// 01h): the live peers of a cluster (`cluster::referral`); none alone.
    pub referrals: RwLock<Vec<Listener>>,
    pub limits: TransportLimits,
    /// Discovery log generation counter; bumped on any change hosts would see.
    pub genctr: AtomicU64,
    /// The discovery controller's serial number: one per target instance, the
    /// same in every Identify (Linux nvmet draws one at random too).
    pub discovery_serial: String,
    pub firmware: String,
    /// Refused Connect commands, by reason (access control is counted).
    pub refused_host: AtomicU64,
    pub refused_other: AtomicU64,
    /// Live queue pairs' counters (weak: a closed connection drops out).
    pub qpairs: Mutex<Vec<std::sync::Weak<QpairStats>>>,
    /// Named keys host entries refer to (`[[keys]]`, `keyring_file_add_key`).
    pub keyring: kvt_auth::Keyring,
    /// The DH-HMAC-CHAP hashes and DH groups this target accepts, as bitmaps of
    /// their identifiers (`[auth]`).
    pub dhchap_digests: std::sync::atomic::AtomicU8,
    pub dhchap_dhgroups: std::sync::atomic::AtomicU8,
    /// DH-HMAC-CHAP transactions that ended in a failure.
    pub auth_failures: AtomicU64,
    /// Connections a secure listener refused (plaintext, unknown PSK identity,
    /// failed handshake).
    pub tls_failures: AtomicU64,
}

/// 16 hex digits from the OS's randomness (std's hasher keys come from it).
fn random_serial() -> String {
    use std::hash::{BuildHasher, Hasher};
    let h = std::collections::hash_map::RandomState::new().build_hasher();
    format!("{:016x}", h.finish())
}

impl Target {
    /// The addresses of every listener that serves I/O subsystems (not the
    /// discovery-only ones): where a subsystem without a `listen` list is
    /// reachable.
    pub fn nvm_listener_addrs(&self) -> Vec<std::net::SocketAddr> {
        self.listeners
            .read()
            .map(|l| {
                l.iter()
                    .filter(|x| !x.discovery_only)
                    .map(|x| x.addr)
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn new(limits: TransportLimits) -> Target {
        let rev = option_env!("KVTARGET_GIT_REV").unwrap_or("");
        let firmware = if rev.is_empty() {
            env!("CARGO_PKG_VERSION").to_string()
        } else {
            rev.to_string()
        };
        Target {
            subsystems: RwLock::new(Vec::new()),
            discovery: Arc::new(Subsystem::new(
                nvme::DISCOVERY_NQN,
                SubsystemKind::Discovery,
                "",
                "kvtarget discovery",
                true,
                Vec::new(),
            )),
            listeners: RwLock::new(Vec::new()),
            referrals: RwLock::new(Vec::new()),
            limits,
            genctr: AtomicU64::new(1),
            discovery_serial: random_serial(),
            firmware,
            refused_host: AtomicU64::new(0),
            refused_other: AtomicU64::new(0),
            qpairs: Mutex::new(Vec::new()),
            keyring: kvt_auth::Keyring::default(),
            dhchap_digests: std::sync::atomic::AtomicU8::new(
                kvt_auth::AuthPolicy::default().digests,
            ),
            dhchap_dhgroups: std::sync::atomic::AtomicU8::new(
                kvt_auth::AuthPolicy::default().dhgroups,
            ),
            auth_failures: AtomicU64::new(0),
            tls_failures: AtomicU64::new(0),
        }
    }

    /// The DH-HMAC-CHAP hashes and groups allowed now.
    pub fn auth_policy(&self) -> kvt_auth::AuthPolicy {
        kvt_auth::AuthPolicy {
            digests: self.dhchap_digests.load(Ordering::Relaxed),
            dhgroups: self.dhchap_dhgroups.load(Ordering::Relaxed),
        }
    }

    /// Registers a connected queue pair's counters.
    pub fn register_qpair(&self, st: &Arc<QpairStats>) {
        if let Ok(mut v) = self.qpairs.lock() {
            v.retain(|w| w.strong_count() > 0);
            v.push(Arc::downgrade(st));
        }
    }

    /// Counters of the queue pairs connected now.
    pub fn live_qpairs(&self) -> Vec<Arc<QpairStats>> {
        self.qpairs
            .lock()
            .map(|v| v.iter().filter_map(|w| w.upgrade()).collect())
            .unwrap_or_default()
    }

    pub fn add_subsystem(&self, s: Arc<Subsystem>) {
        if let Ok(mut subs) = self.subsystems.write() {
            subs.push(s);
        }
        self.genctr.fetch_add(1, Ordering::Relaxed);
    }

    pub fn find_subsystem(&self, nqn: &str) -> Option<Arc<Subsystem>> {
        if nqn == nvme::DISCOVERY_NQN {
            return Some(self.discovery.clone());
        }
        self.subsystems
            .read()
            .ok()?
            .iter()
            .find(|s| s.nqn == nqn)
            .cloned()
    }

    /// Replaces the referrals; a change bumps the discovery log generation
    /// (hosts get the Discovery Log Page Change event). True if it changed.
    pub fn set_referrals(&self, referrals: Vec<Listener>) -> bool {
        let Ok(mut r) = self.referrals.write() else {
            return false;
        };
        if *r == referrals {
            return false;
        }
        *r = referrals;
        self.genctr.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// The discovery log a given host sees: only subsystems it may connect to (the
    /// trap other targets fall into is listing everything), one entry per
    /// subsystem and NVM listener, plus one per listener for this discovery
    /// subsystem itself, then one referral per other discovery service.
    pub fn discovery_entries(&self, hostnqn: &str) -> Vec<DiscoveryEntry> {
        let listeners = self.listeners.read().map(|l| l.clone()).unwrap_or_default();
        let referrals = self.referrals.read().map(|l| l.clone()).unwrap_or_default();
        let subs = self
            .subsystems
            .read()
            .map(|s| s.clone())
            .unwrap_or_default();
        let mut out = Vec::new();
        let entry = |l: &Listener, nqn: &str, st: u8| DiscoveryEntry {
            trtype: if l.rdma {
                nvme::trtype::RDMA
            } else {
                nvme::trtype::TCP
            },
            adrfam: if l.addr.is_ipv4() {
                nvme::adrfam::IPV4
            } else {
                nvme::adrfam::IPV6
            },
            subtype: st,
            // Secure channel required (TLS listeners) or not required. (SQ flow
            // control can be disabled too, but nvme-cli 2.x prints combined TREQ
            // values as "unrecognized".)
            treq: if l.secure { 0x01 } else { 0x02 },
            portid: l.portid,
            cntlid: 0xFFFF,
            asqsz: 32,
            eflags: 0,
            trsvcid: l.addr.port().to_string(),
            subnqn: nqn.to_string(),
            traddr: l.addr.ip().to_string(),
            // TCP security type: TLS 1.3 on secure listeners, none otherwise.
            sectype: if l.secure { 2 } else { 0 },
        };
        for l in &listeners {
            out.push(entry(
                l,
                nvme::DISCOVERY_NQN,
                nvme::subtype::CURRENT_DISCOVERY,
            ));
        }
        for s in subs.iter().filter(|s| s.host_allowed(hostnqn)) {
            for l in listeners
                .iter()
                .filter(|l| !l.discovery_only && s.listener_allowed(l.addr))
            {
                out.push(entry(l, &s.nqn, nvme::subtype::NVME));
            }
        }
        for r in &referrals {
            out.push(entry(r, nvme::DISCOVERY_NQN, nvme::subtype::REFERRAL));
        }
        out
    }
}

#[cfg(test)]
mod tests;
