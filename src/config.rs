//! Configuration: one TOML file. Every error is one line that names the field.

use crate::reactor::IdleMode;
pub use crate::wire::nqn::{validate_nqn, NqnError};
use serde::{Deserialize, Deserializer, Serialize};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

/// A configuration that cannot be used. Each displays as one line; a value
/// error starts with the field path (`pools[0].size: ...`).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// TOML syntax, an unknown key or a value of the wrong type.
    #[error("line {line}: {message}")]
    Syntax { line: usize, message: String },
    /// The same without a position in the text.
    #[error("{message}")]
    Schema { message: String },
    /// A value that parses but cannot work.
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// An error in a file, with its path in front.
    #[error("{}: {source}", path.display())]
    InFile {
        path: PathBuf,
        source: Box<ConfigError>,
    },
    #[error("cannot write the configuration: {0}")]
    Write(#[from] toml::ser::Error),
}

impl ConfigError {
    /// The field path of a value error (`pools[0].size`).
    pub fn field(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { field, .. } => Some(field),
            ConfigError::InFile { source, .. } => source.field(),
            _ => None,
        }
    }
}

/// `invalid!("{f}.size", "must be ... (got {})", x)`: a value error naming the field.
macro_rules! invalid {
    ($field:literal, $($reason:tt)+) => {
        ConfigError::Invalid {
            field: format!($field),
            reason: format!($($reason)+),
        }
    };
}

/// Why a size string does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("`{0}` is not a size (e.g. 4096, 64KiB, 1GiB)")]
    NotASize(String),
    #[error("`{0}` has an unknown unit (use KiB, MiB, GiB, TiB)")]
    UnknownUnit(String),
    #[error("`{0}` is too large")]
    TooLarge(String),
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub reactors: ReactorConfig,
    #[serde(default)]
    pub tcp: TcpConfig,
    /// NVMe/RDMA sizing; used when a listener has `transport = "rdma"`.
    #[serde(default)]
    pub rdma: RdmaConfig,
    #[serde(default)]
    pub discovery: DiscoveryConfig,
    #[serde(default)]
    pub listeners: Vec<ListenerConfig>,
    /// JSON-RPC control socket. Absent: the daemon uses the default path (or
    /// `-r`); an embedded target (tests) runs without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rpc: Option<RpcConfig>,
    /// Prometheus endpoint; absent: off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics: Option<MetricsConfig>,
    /// SPDK's environment, for `spdk` backends.
    #[serde(default, skip_serializing_if = "SpdkConfig::is_default")]
    pub spdk: SpdkConfig,
    #[serde(default)]
    pub pools: Vec<PoolConfig>,
    #[serde(default)]
    pub subsystems: Vec<SubsystemConfig>,
    /// Named keys (SPDK's `keyring_file_add_key`): host entries name them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<KeyConfig>,
    /// What DH-HMAC-CHAP negotiation may pick.
    #[serde(default, skip_serializing_if = "AuthConfig::is_default")]
    pub auth: AuthConfig,
}

/// A key file: `name` is what host entries refer to; `path` is absolute and
/// readable by its owner only (mode 0600), as SPDK's keyring_file requires.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KeyConfig {
    pub name: String,
    pub path: String,
}

/// The DH-HMAC-CHAP hashes and DH groups the target accepts (SPDK's
/// `nvmf_set_config` `dhchap_digests` / `dhchap_dhgroups`); default: all. The
/// strongest one both sides allow is chosen.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    #[serde(default = "d_dhchap_digests")]
    pub dhchap_digests: Vec<String>,
    #[serde(default = "d_dhchap_dhgroups")]
    pub dhchap_dhgroups: Vec<String>,
}

fn d_dhchap_digests() -> Vec<String> {
    let mut v: Vec<String> = crate::auth::Digest::ALL
        .iter()
        .map(|d| d.name().to_string())
        .collect();
    v.reverse();
    v
}
fn d_dhchap_dhgroups() -> Vec<String> {
    let mut v: Vec<String> = crate::auth::DhGroup::ALL
        .iter()
        .map(|g| g.name().to_string())
        .collect();
    v.reverse();
    v
}

impl Default for AuthConfig {
    fn default() -> AuthConfig {
        AuthConfig {
            dhchap_digests: d_dhchap_digests(),
            dhchap_dhgroups: d_dhchap_dhgroups(),
        }
    }
}

impl AuthConfig {
    fn is_default(&self) -> bool {
        *self == AuthConfig::default()
    }

    /// The lists as a policy (names checked by `Config::validate`).
    pub fn policy(&self) -> crate::auth::AuthPolicy {
        crate::auth::AuthPolicy {
            digests: self
                .dhchap_digests
                .iter()
                .filter_map(|n| crate::auth::Digest::from_name(n))
                .fold(0, |m, d| m | 1 << d.id()),
            dhgroups: self
                .dhchap_dhgroups
                .iter()
                .filter_map(|n| crate::auth::DhGroup::from_name(n))
                .fold(0, |m, g| m | 1 << g.id()),
        }
    }
}

/// A host allowed on a subsystem: its NQN, or a table with DH-HMAC-CHAP keys
/// (`{ nqn = "...", dhchap_key = "key0", dhchap_ctrlr_key = "ckey0" }`, key
/// names from `[[keys]]`). A host with `dhchap_key` must authenticate every queue;
/// with `dhchap_ctrlr_key` too, the controller can prove itself to it.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(untagged)]
pub enum HostConfig {
    Nqn(String),
    Entry(HostEntryConfig),
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HostEntryConfig {
    pub nqn: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhchap_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhchap_ctrlr_key: Option<String>,
    /// NVMe/TCP TLS PSK (a `[[keys]]` name): the host connects only through a
    /// `secure_channel` listener, with this key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub psk: Option<String>,
}

impl HostConfig {
    pub fn nqn(&self) -> &str {
        match self {
            HostConfig::Nqn(n) => n,
            HostConfig::Entry(e) => &e.nqn,
        }
    }
    pub fn dhchap_key(&self) -> Option<&str> {
        match self {
            HostConfig::Nqn(_) => None,
            HostConfig::Entry(e) => e.dhchap_key.as_deref(),
        }
    }
    pub fn dhchap_ctrlr_key(&self) -> Option<&str> {
        match self {
            HostConfig::Nqn(_) => None,
            HostConfig::Entry(e) => e.dhchap_ctrlr_key.as_deref(),
        }
    }
    pub fn psk(&self) -> Option<&str> {
        match self {
            HostConfig::Nqn(_) => None,
            HostConfig::Entry(e) => e.psk.as_deref(),
        }
    }
}

impl From<&str> for HostConfig {
    fn from(n: &str) -> HostConfig {
        HostConfig::Nqn(n.to_string())
    }
}

/// How SPDK's environment (DPDK's EAL) is set up when a `spdk` backend is used.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SpdkConfig {
    /// Run SPDK without hugepages (DPDK `--no-huge`) in `mem_size` of ordinary
    /// memory (default 1GiB then). NVMe/TCP controllers work so; PCIe needs an
    /// IOMMU for it.
    #[serde(default)]
    pub no_huge: bool,
    /// Memory SPDK may use; default: grown on demand from hugepages.
    #[serde(
        default,
        deserialize_with = "opt_size",
        skip_serializing_if = "Option::is_none"
    )]
    pub mem_size: Option<u64>,
    /// The hugetlbfs mount SPDK uses; default: the one DPDK finds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hugedir: Option<PathBuf>,
}

impl SpdkConfig {
    fn is_default(&self) -> bool {
        *self == SpdkConfig::default()
    }
}

impl Config {
    /// SPDK environment settings for this configuration's `spdk` devices.
    pub fn spdk_env(&self) -> crate::bdev::spdk::EnvSettings {
        let pci = self
            .pools
            .iter()
            .map(|p| &p.trid)
            .chain(
                self.subsystems
                    .iter()
                    .flat_map(|s| s.namespaces.iter().map(|n| &n.trid)),
            )
            .flatten()
            .any(|t| {
                t.parse::<crate::bdev::spdk::TransportId>()
                    .is_ok_and(|t| !t.is_fabrics())
            });
        crate::bdev::spdk::EnvSettings {
            no_huge: self.spdk.no_huge,
            mem_size_mib: self.spdk.mem_size.map(|b| (b >> 20) as u32),
            hugedir: self.spdk.hugedir.as_ref().map(|p| p.display().to_string()),
            pci,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// Address of the HTTP endpoint serving /metrics, e.g. "127.0.0.1:9464".
    pub address: String,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RpcConfig {
    /// Unix socket path (SPDK uses /var/tmp/spdk.sock; we use /var/tmp/kvtarget.sock).
    #[serde(default = "d_rpc_socket")]
    pub socket: PathBuf,
    #[serde(default = "d_true")]
    pub enabled: bool,
}

/// Default JSON-RPC socket path (like SPDK's /var/tmp/spdk.sock).
pub const DEFAULT_SOCKET: &str = "/var/tmp/kvtarget.sock";

fn d_rpc_socket() -> PathBuf {
    PathBuf::from(DEFAULT_SOCKET)
}

impl Default for RpcConfig {
    fn default() -> Self {
        RpcConfig {
            socket: d_rpc_socket(),
            enabled: true,
        }
    }
}

/// A pool: one backing device cut into extents, holding thin volumes.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    pub name: String,
    pub backend: Backend,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// The controller of an `nvme` backend, by PCI address ("0000:00:04.0").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci: Option<String>,
    /// The controller's namespace an `nvme` or `spdk` backend uses (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvme_nsid: Option<u32>,
    /// The controller of an `spdk` backend, as an SPDK transport ID
    /// ("trtype:PCIe traddr:0000:00:04.0", or "trtype:TCP adrfam:IPv4
    /// traddr:10.0.0.5 trsvcid:4420 subnqn:..." for a remote NVMe-oF namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trid: Option<String>,
    /// Size of a file created for the pool, or of a RAM pool.
    #[serde(
        default,
        deserialize_with = "opt_size",
        skip_serializing_if = "Option::is_none"
    )]
    pub size: Option<u64>,
    /// Extent size for a new pool (an existing pool keeps its own).
    #[serde(default = "d_extent", deserialize_with = "size")]
    pub extent_size: u64,
    /// Format the device when it holds no pool. A device that holds one is never
    /// overwritten from the configuration (use `kvtarget pool create --force`).
    #[serde(default = "d_true")]
    pub create: bool,
    /// Extent mappings made by writes are committed to the journal at least this
    /// often without a Flush (milliseconds, 1 to 60000): the most first writes a
    /// target crash can lose on a volume with a volatile write cache.
    #[serde(default = "d_commit_interval_ms")]
    pub commit_interval_ms: u64,
    #[serde(default)]
    pub gc: GcConfig,
    #[serde(default)]
    pub dual_path: DualPathConfig,
    #[serde(default)]
    pub volumes: Vec<VolumeConfig>,
}

fn d_extent() -> u64 {
    1 << 20
}
pub(crate) fn d_commit_interval_ms() -> u64 {
    crate::pool::DEFAULT_COMMIT_INTERVAL.as_millis() as u64
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Unwritten {
    /// Reads of unwritten or deallocated blocks return zeros.
    #[default]
    Zeroes,
    /// They fail with "deallocated or unwritten logical block" (a cache miss).
    Error,
}

/// A volume the target makes sure exists (created, or grown, at start).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct VolumeConfig {
    pub name: String,
    #[serde(deserialize_with = "size")]
    pub size: u64,
    #[serde(default = "d_bs")]
    pub block_size: u32,
    #[serde(default)]
    pub unwritten: Unwritten,
    /// "kv": the volume holds a KV namespace (values by key, NVMe Key Value
    /// command set) instead of blocks. Fixed at creation.
    #[serde(default, skip_serializing_if = "VolumeKind::is_block")]
    pub kind: VolumeKind,
}

/// What a volume, or a namespace, holds.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum VolumeKind {
    /// Blocks: an NVM command set namespace.
    #[default]
    Block,
    /// Values by key: a Key Value command set namespace.
    Kv,
}

impl VolumeKind {
    pub fn is_block(&self) -> bool {
        *self == VolumeKind::Block
    }
    pub fn name(self) -> &'static str {
        match self {
            VolumeKind::Block => "block",
            VolumeKind::Kv => "kv",
        }
    }
}

/// What a full KV namespace does with a Store of a new value.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum OnFullConfig {
    /// Evict the least recently used keys (CLOCK).
    #[default]
    Evict,
    /// Fail the Store with Capacity Exceeded.
    Fail,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GcConfig {
    /// Percent of extents: below this many clean extents GC is urgent.
    #[serde(default = "d_low")]
    pub low_watermark_pct: u64,
    #[serde(default = "d_high")]
    pub high_watermark_pct: u64,
    /// Most extents scrubbed per second when foreground I/O is quiet.
    #[serde(default = "d_gc_rate")]
    pub max_rate: f64,
    /// Foreground commands in flight above which GC backs off.
    #[serde(default = "d_gc_qd")]
    pub max_foreground_qd: u64,
    /// false: GC scrubs as fast as it can whatever foreground does. Only for
    /// measuring what admission control buys.
    #[serde(default = "d_true")]
    pub admission: bool,
}

fn d_low() -> u64 {
    5
}
fn d_high() -> u64 {
    20
}
fn d_gc_rate() -> f64 {
    20_000.0
}
fn d_gc_qd() -> u64 {
    8
}

impl Default for GcConfig {
    fn default() -> Self {
        GcConfig {
            low_watermark_pct: d_low(),
            high_watermark_pct: d_high(),
            max_rate: d_gc_rate(),
            max_foreground_qd: d_gc_qd(),
            admission: true,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DualPathConfig {
    #[serde(default = "d_true")]
    pub enabled: bool,
    /// Transfers at least this large take the bandwidth path.
    #[serde(default = "d_piece", deserialize_with = "size")]
    pub large_threshold: u64,
    /// Device operation size on the bandwidth path.
    #[serde(default = "d_piece", deserialize_with = "size")]
    pub piece: u64,
    /// Bandwidth-path operations in flight per reactor and volume.
    #[serde(default = "d_large_inflight")]
    pub max_inflight: usize,
}

fn d_piece() -> u64 {
    128 << 10
}
fn d_large_inflight() -> usize {
    4
}

impl Default for DualPathConfig {
    fn default() -> Self {
        DualPathConfig {
            enabled: true,
            large_threshold: d_piece(),
            piece: d_piece(),
            max_inflight: d_large_inflight(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ReactorConfig {
    /// Number of reactor threads (ignored when `cores` is given).
    #[serde(default = "one")]
    pub count: usize,
    /// Cores to pin reactors to, one reactor per entry.
    #[serde(default)]
    pub cores: Vec<usize>,
    #[serde(default = "adaptive")]
    pub idle: IdleMode,
}

fn one() -> usize {
    1
}
fn adaptive() -> IdleMode {
    IdleMode::Adaptive
}

impl Default for ReactorConfig {
    fn default() -> Self {
        ReactorConfig {
            count: 1,
            cores: Vec::new(),
            idle: IdleMode::Adaptive,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TcpConfig {
    #[serde(default = "d_qd")]
    pub max_queue_depth: u16,
    #[serde(default = "d_ioq")]
    pub max_io_queues: u16,
    #[serde(default = "d_icd", deserialize_with = "size")]
    pub in_capsule_data: u64,
    #[serde(default = "d_mio", deserialize_with = "size")]
    pub max_io_size: u64,
    #[serde(default = "d_h2c", deserialize_with = "size")]
    pub max_h2c_data: u64,
    /// Bytes one R2T asks for (a larger write gets several, in turn).
    #[serde(default = "d_r2t", deserialize_with = "size")]
    pub max_r2t_length: u64,
    /// Writes a connection asks data for at once (1 to 256); the rest wait for
    /// an R2T in arrival order.
    #[serde(default = "d_active_r2ts")]
    pub max_active_r2ts: u16,
    /// Kernel socket buffers of each connection (SO_RCVBUF / SO_SNDBUF, SPDK's
    /// `sock_impl_set_options` names); 0 leaves them to the kernel's auto-tuning.
    #[serde(default = "d_sock_buf", deserialize_with = "size")]
    pub recv_buf_size: u64,
    #[serde(default = "d_sock_buf", deserialize_with = "size")]
    pub send_buf_size: u64,
    #[serde(default = "d_true")]
    pub c2h_success: bool,
}

fn d_qd() -> u16 {
    128
}
fn d_ioq() -> u16 {
    127
}
fn d_icd() -> u64 {
    8192
}
fn d_mio() -> u64 {
    1 << 20
}
fn d_h2c() -> u64 {
    128 << 10
}
/// Whole commands (1 MiB). 256 KiB windows bring a 4 MiB write's P99 from
/// 1.2x SPDK's nvmf_tgt to parity but cost 1 MiB writes at QD4 17-24 % of
/// their IOPS (bench/RESULTS.md, "The 4 MiB write tail"); a per-connection
/// adaptive window is the open fix.
fn d_r2t() -> u64 {
    1 << 20
}
fn d_sock_buf() -> u64 {
    0
}
/// Eight: with more, a host spreads its H2CData over every R2T it holds, each
/// command's buffer fills only at the end and leaves the cache before the backend
/// copies it (32 MiB writes: P99 0.96x SPDK's with 8, 1.07x with 32; RESULTS.md).
fn d_active_r2ts() -> u16 {
    8
}
fn d_true() -> bool {
    true
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            max_queue_depth: d_qd(),
            max_io_queues: d_ioq(),
            in_capsule_data: d_icd(),
            max_io_size: d_mio(),
            max_h2c_data: d_h2c(),
            max_r2t_length: d_r2t(),
            max_active_r2ts: d_active_r2ts(),
            recv_buf_size: d_sock_buf(),
            send_buf_size: d_sock_buf(),
            c2h_success: true,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DiscoveryConfig {
    /// Extra discovery-only port on every listener address (8009 by convention).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ListenerConfig {
    pub address: String,
    #[serde(default = "d_port")]
    pub port: u16,
    /// "tcp" (default) or "rdma".
    #[serde(default, skip_serializing_if = "TransportKind::is_tcp")]
    pub transport: TransportKind,
    /// NVMe/TCP over TLS 1.3 with PSKs only (SPDK's `secure_channel`): a
    /// plaintext connection is refused.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub secure_channel: bool,
}

/// Which NVMe-oF transport a listener speaks.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum TransportKind {
    #[default]
    Tcp,
    Rdma,
}

impl TransportKind {
    pub fn is_tcp(&self) -> bool {
        *self == TransportKind::Tcp
    }
}

/// NVMe/RDMA sizing. Queue depth, queue count, in-capsule data size and the
/// largest transfer are the `[tcp]` values: Identify Controller and CAP report
/// one set of limits per controller, whatever the transport. Each QP posts one
/// receive buffer of 64 bytes + in-capsule data per queue entry.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RdmaConfig {
    /// Registered memory for RDMA READ/WRITE data, per reactor and RDMA device.
    #[serde(default = "d_rdma_pool", deserialize_with = "size")]
    pub buffer_pool_size: u64,
    /// RDMA READs one queue pair keeps in flight (further capped by the device
    /// and the host's responder resources).
    #[serde(default = "d_rdma_reads")]
    pub max_outstanding_reads: u32,
    /// QPs one reactor serves on one RDMA device. Each reactor has one
    /// completion queue per device, sized for this many QPs of the largest
    /// queue depth (3 x depth + 16 entries each), capped by the device's
    /// max_cqe; a connection past what the CQ holds is refused.
    #[serde(default = "d_rdma_qpairs")]
    pub max_qpairs_per_reactor: u32,
}

fn d_rdma_pool() -> u64 {
    64 << 20
}
fn d_rdma_reads() -> u32 {
    16
}
fn d_rdma_qpairs() -> u32 {
    64
}

impl Default for RdmaConfig {
    fn default() -> Self {
        RdmaConfig {
            buffer_pool_size: d_rdma_pool(),
            max_outstanding_reads: d_rdma_reads(),
            max_qpairs_per_reactor: d_rdma_qpairs(),
        }
    }
}

fn d_port() -> u16 {
    4420
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SubsystemConfig {
    pub nqn: String,
    #[serde(default = "d_serial")]
    pub serial: String,
    #[serde(default = "d_model")]
    pub model: String,
    #[serde(default)]
    pub allow_any_host: bool,
    #[serde(default)]
    pub hosts: Vec<HostConfig>,
    /// "address:port" entries this subsystem is reachable on; absent: every
    /// listener. Addresses not among [[listeners]] are listened on as well.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<Vec<String>>,
    #[serde(default)]
    pub namespaces: Vec<NamespaceConfig>,
}

fn d_serial() -> String {
    "KVT0000000000001".into()
}
fn d_model() -> String {
    "kvtarget".into()
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Ram,
    Uring,
    /// A namespace of a PCIe NVMe controller driven by kvtarget's own driver (VFIO).
    Nvme,
    /// A namespace behind SPDK's NVMe driver: PCIe, or NVMe-oF through SPDK's host
    /// (needs a build with `--features spdk`).
    Spdk,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NamespaceConfig {
    pub nsid: u32,
    /// A pool volume, as "pool/volume".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume: Option<String>,
    /// Or a whole device (no thin provisioning).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<Backend>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// The controller of an `nvme` backend, by PCI address ("0000:00:04.0").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci: Option<String>,
    /// The controller's namespace an `nvme` or `spdk` backend uses (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvme_nsid: Option<u32>,
    /// The controller of an `spdk` backend, as an SPDK transport ID
    /// ("trtype:PCIe traddr:0000:00:04.0", or "trtype:TCP adrfam:IPv4
    /// traddr:10.0.0.5 trsvcid:4420 subnqn:..." for a remote NVMe-oF namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trid: Option<String>,
    #[serde(
        default,
        deserialize_with = "opt_size",
        skip_serializing_if = "Option::is_none"
    )]
    pub size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block_size: Option<u32>,
    /// false: no volatile write cache; every write is durable before its
    /// completion (as FUA), and Identify reports no cache when all of the
    /// subsystem's namespaces are so (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_cache: Option<bool>,
    /// "kv" for a KV namespace (its volume must be a KV volume), "block" for
    /// a block one; by default what the volume is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<VolumeKind>,
    /// KV namespaces: "evict" (default) or "fail" when full.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_full: Option<OnFullConfig>,
    /// KV namespaces: keys older than this many seconds read as missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_secs: Option<u64>,
    /// KV namespaces: false keeps extents whose blocks are all free mapped
    /// instead of giving them back to the pool after 5 s (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trim: Option<bool>,
}

impl NamespaceConfig {
    /// The KV cache policy this namespace asks for.
    pub fn kv_settings(&self) -> crate::pool::kv::KvSettings {
        crate::pool::kv::KvSettings {
            on_full: match self.on_full.unwrap_or_default() {
                OnFullConfig::Evict => crate::pool::kv::OnFull::Evict,
                OnFullConfig::Fail => crate::pool::kv::OnFull::Fail,
            },
            ttl: self
                .ttl_secs
                .filter(|&t| t > 0)
                .map(std::time::Duration::from_secs),
            keep_footprint: self.trim == Some(false),
        }
    }
    /// Whether a KV-only option is set (refused on a block namespace).
    pub fn has_kv_options(&self) -> bool {
        self.on_full.is_some() || self.ttl_secs.is_some() || self.trim.is_some()
    }
    pub fn block_size(&self) -> u32 {
        self.block_size.unwrap_or(4096)
    }
}

fn d_bs() -> u32 {
    4096
}

/// Parses "4096", "64KiB", "256MiB", "1GiB", "2TiB" (also K/M/G/T, KB/MB/... as
/// binary units, which is what storage people mean here).
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| SizeError::NotASize(s.into()))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(SizeError::UnknownUnit(s.into())),
    };
    n.checked_mul(mult)
        .ok_or_else(|| SizeError::TooLarge(s.into()))
}

#[derive(Deserialize)]
#[serde(untagged)]
enum SizeRepr {
    Int(u64),
    Str(String),
}

fn size<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    match SizeRepr::deserialize(d)? {
        SizeRepr::Int(n) => Ok(n),
        SizeRepr::Str(s) => parse_size(&s).map_err(serde::de::Error::custom),
    }
}

fn opt_size<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    size(d).map(Some)
}

impl Config {
    /// The configuration as TOML (what `kvtarget_save_config` writes).
    pub fn to_toml(&self) -> Result<String, ConfigError> {
        Ok(toml::to_string(self)?)
    }

    /// Parses and validates; the error is a single line naming the field.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|e| {
            let message = e.message().replace('\n', " ");
            match e.span() {
                Some(sp) => {
                    let at = sp.start.min(text.len());
                    ConfigError::Syntax {
                        line: text[..at].lines().count().max(1),
                        // serde names the type it wanted, not the key: name it here.
                        message: match key_path_at(text, at) {
                            Some(k) => format!("{k}: {message}"),
                            None => message,
                        },
                    }
                }
                None => ConfigError::Schema { message },
            }
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn load(path: &std::path::Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        Config::parse(&text).map_err(|e| ConfigError::InFile {
            path: path.into(),
            source: Box::new(e),
        })
    }

    pub fn reactor_cores(&self) -> Vec<Option<usize>> {
        if !self.reactors.cores.is_empty() {
            return self.reactors.cores.iter().map(|&c| Some(c)).collect();
        }
        let ncpu = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        (0..self.reactors.count).map(|i| Some(i % ncpu)).collect()
    }

    /// NVMe/TCP listener addresses.
    pub fn listen_addrs(&self) -> Result<Vec<SocketAddr>, ConfigError> {
        self.listen_addrs_of(TransportKind::Tcp)
    }

    /// NVMe/TCP listener addresses that require TLS.
    pub fn secure_listen_addrs(&self) -> Result<Vec<SocketAddr>, ConfigError> {
        let all = self.listen_addrs()?;
        let tcp = self
            .listeners
            .iter()
            .filter(|l| l.transport == TransportKind::Tcp);
        Ok(all
            .into_iter()
            .zip(tcp)
            .filter(|(_, l)| l.secure_channel)
            .map(|(a, _)| a)
            .collect())
    }

    /// NVMe/RDMA listener addresses.
    pub fn rdma_listen_addrs(&self) -> Result<Vec<SocketAddr>, ConfigError> {
        self.listen_addrs_of(TransportKind::Rdma)
    }

    fn listen_addrs_of(&self, kind: TransportKind) -> Result<Vec<SocketAddr>, ConfigError> {
        self.listeners
            .iter()
            .enumerate()
            .filter(|(_, l)| l.transport == kind)
            .map(|(i, l)| {
                let ip: IpAddr = l.address.parse().map_err(|_| {
                    invalid!(
                        "listeners[{i}].address",
                        "`{}` is not an IP address",
                        l.address
                    )
                })?;
                Ok(SocketAddr::new(ip, l.port))
            })
            .collect()
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let r = &self.reactors;
        if r.cores.is_empty() && !(1..=256).contains(&r.count) {
            return Err(invalid!(
                "reactors.count",
                "must be 1..=256 (got {})",
                r.count
            ));
        }
        let ncpu = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        for (i, &c) in r.cores.iter().enumerate() {
            if c >= ncpu {
                return Err(invalid!(
                    "reactors.cores[{i}]",
                    "core {c} does not exist (this machine has {ncpu})"
                ));
            }
        }
        let t = &self.tcp;
        if !(2..=1024).contains(&t.max_queue_depth) {
            return Err(invalid!(
                "tcp.max_queue_depth",
                "must be 2..=1024 (got {})",
                t.max_queue_depth
            ));
        }
        if !(1..=1024).contains(&t.max_io_queues) {
            return Err(invalid!(
                "tcp.max_io_queues",
                "must be 1..=1024 (got {})",
                t.max_io_queues
            ));
        }
        if t.in_capsule_data % 16 != 0 || t.in_capsule_data > 128 << 10 {
            return Err(invalid!(
                "tcp.in_capsule_data",
                "must be a multiple of 16 up to 128KiB (got {})",
                t.in_capsule_data
            ));
        }
        if !t.max_io_size.is_power_of_two() || !(4096..=(32 << 20)).contains(&t.max_io_size) {
            return Err(invalid!(
                "tcp.max_io_size",
                "must be a power of two from 4KiB to 32MiB (got {})",
                t.max_io_size
            ));
        }
        if t.max_h2c_data % 4 != 0 || !(4096..=(16 << 20)).contains(&t.max_h2c_data) {
            return Err(invalid!(
                "tcp.max_h2c_data",
                "must be a multiple of 4 from 4KiB to 16MiB (got {})",
                t.max_h2c_data
            ));
        }
        if t.max_r2t_length < 4096 || t.max_r2t_length > u32::MAX as u64 {
            return Err(invalid!(
                "tcp.max_r2t_length",
                "must be at least 4KiB (got {})",
                t.max_r2t_length
            ));
        }
        for (name, v) in [("recv", t.recv_buf_size), ("send", t.send_buf_size)] {
            if v != 0 && !(4096..=(256 << 20)).contains(&v) {
                return Err(invalid!(
                    "tcp.{name}_buf_size",
                    "0 (auto-tuned) or 4KiB to 256MiB (got {v})"
                ));
            }
        }
        if !(1..=256).contains(&t.max_active_r2ts) {
            return Err(invalid!(
                "tcp.max_active_r2ts",
                "1 to 256 (got {})",
                t.max_active_r2ts
            ));
        }
        if self.listeners.is_empty() {
            return Err(invalid!(
                "listeners",
                "at least one [[listeners]] entry is needed"
            ));
        }
        let rd = &self.rdma;
        if rd.buffer_pool_size % 4096 != 0
            || rd.buffer_pool_size < t.max_io_size
            || rd.buffer_pool_size > 16 << 30
        {
            return Err(invalid!(
                "rdma.buffer_pool_size",
                "must be a multiple of 4KiB from tcp.max_io_size ({}) to 16GiB (got {})",
                t.max_io_size,
                rd.buffer_pool_size
            ));
        }
        if !(1..=128).contains(&rd.max_outstanding_reads) {
            return Err(invalid!(
                "rdma.max_outstanding_reads",
                "must be 1..=128 (got {})",
                rd.max_outstanding_reads
            ));
        }
        if !(1..=4096).contains(&rd.max_qpairs_per_reactor) {
            return Err(invalid!(
                "rdma.max_qpairs_per_reactor",
                "must be 1..=4096 (got {})",
                rd.max_qpairs_per_reactor
            ));
        }
        self.rdma_listen_addrs()?;
        if let Some(i) = self
            .listeners
            .iter()
            .position(|l| l.secure_channel && l.transport == TransportKind::Rdma)
        {
            return Err(invalid!(
                "listeners[{i}].secure_channel",
                "TLS is NVMe/TCP's; an RDMA listener cannot require it"
            ));
        }
        for (i, a) in self.rdma_listen_addrs()?.iter().enumerate() {
            if self.rdma_listen_addrs()?[..i].contains(a) {
                return Err(invalid!("listeners", "RDMA listener {a} is listed twice"));
            }
        }
        let addrs = self.listen_addrs()?;
        for (i, a) in addrs.iter().enumerate() {
            if addrs[..i].contains(a) {
                return Err(invalid!("listeners[{i}]", "{a} is listed twice"));
            }
            if a.port() != 0 && Some(a.port()) == self.discovery.port {
                return Err(invalid!(
                    "discovery.port",
                    "{} is also listeners[{i}].port",
                    a.port()
                ));
            }
        }
        if let Some(m) = &self.metrics {
            m.address.parse::<SocketAddr>().map_err(|_| {
                invalid!(
                    "metrics.address",
                    "`{}` is not ADDRESS:PORT (e.g. 127.0.0.1:9464)",
                    m.address
                )
            })?;
        }
        if self.spdk.no_huge && self.spdk.hugedir.is_some() {
            return Err(invalid!(
                "spdk.hugedir",
                "a hugetlbfs mount makes no sense with no_huge = true"
            ));
        }
        if let Some(m) = self.spdk.mem_size {
            if !(64 << 20..=1 << 40).contains(&m) || m % (1 << 20) != 0 {
                return Err(invalid!(
                    "spdk.mem_size",
                    "a whole number of MiB from 64MiB to 1TiB (got {m})"
                ));
            }
        }
        self.validate_pools()?;
        let mut served: Vec<String> = Vec::new();
        for (i, k) in self.keys.iter().enumerate() {
            if k.name.is_empty() || k.name.len() > 128 || k.name.chars().any(char::is_whitespace) {
                return Err(invalid!(
                    "keys[{i}].name",
                    "1 to 128 characters without whitespace (got `{}`)",
                    k.name
                ));
            }
            if self.keys[..i].iter().any(|o| o.name == k.name) {
                return Err(invalid!("keys[{i}].name", "`{}` is defined twice", k.name));
            }
            if !std::path::Path::new(&k.path).is_absolute() {
                return Err(invalid!(
                    "keys[{i}].path",
                    "must be an absolute path (got `{}`)",
                    k.path
                ));
            }
        }
        for (field, names, valid) in [
            (
                "auth.dhchap_digests",
                &self.auth.dhchap_digests,
                &d_dhchap_digests(),
            ),
            (
                "auth.dhchap_dhgroups",
                &self.auth.dhchap_dhgroups,
                &d_dhchap_dhgroups(),
            ),
        ] {
            if names.is_empty() {
                return Err(ConfigError::Invalid {
                    field: field.into(),
                    reason: format!("must name at least one of {}", valid.join(", ")),
                });
            }
            if let Some(n) = names.iter().find(|n| !valid.contains(n)) {
                return Err(ConfigError::Invalid {
                    field: field.into(),
                    reason: format!("unknown `{n}` (one of {})", valid.join(", ")),
                });
            }
        }
        for (i, s) in self.subsystems.iter().enumerate() {
            let f = format!("subsystems[{i}]");
            validate_nqn(&s.nqn).map_err(|e| invalid!("{f}.nqn", "{e}"))?;
            if s.nqn == crate::wire::nvme::DISCOVERY_NQN {
                return Err(invalid!("{f}.nqn", "the discovery NQN is reserved"));
            }
            if self.subsystems[..i].iter().any(|o| o.nqn == s.nqn) {
                return Err(invalid!("{f}.nqn", "`{}` is defined twice", s.nqn));
            }
            if s.serial.is_empty() || s.serial.len() > 20 || !s.serial.is_ascii() {
                return Err(invalid!(
                    "{f}.serial",
                    "1 to 20 ASCII characters (got `{}`)",
                    s.serial
                ));
            }
            if s.model.is_empty() || s.model.len() > 40 || !s.model.is_ascii() {
                return Err(invalid!(
                    "{f}.model",
                    "1 to 40 ASCII characters (got `{}`)",
                    s.model
                ));
            }
            for (j, h) in s.hosts.iter().enumerate() {
                let known = |k: &str| self.keys.iter().any(|x| x.name == k);
                match h {
                    HostConfig::Nqn(n) => {
                        validate_nqn(n).map_err(|e| invalid!("{f}.hosts[{j}]", "{e}"))?
                    }
                    HostConfig::Entry(e) => {
                        validate_nqn(&e.nqn)
                            .map_err(|err| invalid!("{f}.hosts[{j}].nqn", "{err}"))?;
                        if let Some(k) = e.dhchap_key.as_deref().filter(|k| !known(k)) {
                            return Err(invalid!(
                                "{f}.hosts[{j}].dhchap_key",
                                "no key `{k}` in [[keys]]"
                            ));
                        }
                        if let Some(k) = e.psk.as_deref().filter(|k| !known(k)) {
                            return Err(invalid!("{f}.hosts[{j}].psk", "no key `{k}` in [[keys]]"));
                        }
                        match e.dhchap_ctrlr_key.as_deref() {
                            Some(_) if e.dhchap_key.is_none() => {
                                return Err(invalid!(
                                    "{f}.hosts[{j}].dhchap_ctrlr_key",
                                    "needs dhchap_key (the host authenticates first)"
                                ))
                            }
                            Some(k) if !known(k) => {
                                return Err(invalid!(
                                    "{f}.hosts[{j}].dhchap_ctrlr_key",
                                    "no key `{k}` in [[keys]]"
                                ))
                            }
                            _ => {}
                        }
                    }
                }
                if s.hosts[..j].iter().any(|o| o.nqn() == h.nqn()) {
                    return Err(invalid!("{f}.hosts[{j}]", "`{}` is listed twice", h.nqn()));
                }
            }
            for (j, a) in s.listen.iter().flatten().enumerate() {
                a.parse::<SocketAddr>()
                    .map_err(|_| invalid!("{f}.listen[{j}]", "`{a}` is not ADDRESS:PORT"))?;
            }
            for (j, n) in s.namespaces.iter().enumerate() {
                let f = format!("{f}.namespaces[{j}]");
                if n.nsid == 0 || n.nsid > crate::nvmf::admin::MAX_NAMESPACES {
                    return Err(invalid!(
                        "{f}.nsid",
                        "must be 1..={} (got {})",
                        crate::nvmf::admin::MAX_NAMESPACES,
                        n.nsid
                    ));
                }
                if s.namespaces[..j].iter().any(|o| o.nsid == n.nsid) {
                    return Err(invalid!(
                        "{f}.nsid",
                        "{} is used twice in {}",
                        n.nsid,
                        s.nqn
                    ));
                }
                if let Some(v) = &n.volume {
                    if n.backend.is_some()
                        || n.pci.is_some()
                        || n.trid.is_some()
                        || n.nvme_nsid.is_some()
                        || n.path.is_some()
                        || n.size.is_some()
                        || n.block_size.is_some()
                    {
                        return Err(invalid!(
                            "{f}.volume", "a volume namespace takes no backend, path, size or block_size (the volume has them)"
                        ));
                    }
                    let Some((pool, vol)) = v.split_once('/') else {
                        return Err(invalid!("{f}.volume", "`{v}` is not \"pool/volume\""));
                    };
                    let Some(p) = self.pools.iter().find(|p| p.name == pool) else {
                        return Err(invalid!(
                            "{f}.volume",
                            "no pool named `{pool}` in [[pools]]"
                        ));
                    };
                    if !p.volumes.iter().any(|x| x.name == vol) {
                        return Err(invalid!(
                            "{f}.volume",
                            "pool `{pool}` lists no volume `{vol}` in [[pools.volumes]]"
                        ));
                    }
                    if served.contains(v) {
                        return Err(invalid!(
                            "{f}.volume",
                            "`{v}` is served by another namespace"
                        ));
                    }
                    served.push(v.clone());
                    continue;
                }
                let Some(backend) = n.backend else {
                    return Err(invalid!(
                        "{f}",
                        "needs `volume = \"pool/volume\"` or a `backend`"
                    ));
                };
                let bs = n.block_size();
                if !bs.is_power_of_two() || !(512..=4096).contains(&bs) {
                    return Err(invalid!(
                        "{f}.block_size",
                        "must be 512, 1024, 2048 or 4096 (got {bs})"
                    ));
                }
                if let Some(sz) = n.size {
                    if sz == 0 || sz % bs as u64 != 0 {
                        return Err(invalid!(
                            "{f}.size",
                            "must be a non-zero multiple of block_size {bs} (got {sz})"
                        ));
                    }
                }
                match backend {
                    Backend::Ram => {
                        if n.size.is_none() {
                            return Err(invalid!("{f}.size", "required for the ram backend"));
                        }
                        if n.path.is_some() {
                            return Err(invalid!("{f}.path", "the ram backend takes no path"));
                        }
                    }
                    Backend::Uring => {
                        if n.path.is_none() {
                            return Err(invalid!("{f}.path", "required for the uring backend"));
                        }
                    }
                    Backend::Nvme | Backend::Spdk => {
                        if n.path.is_some() || n.size.is_some() || n.block_size.is_some() {
                            return Err(invalid!("{f}", "the {} backend takes no path, size or block_size (the controller's namespace has them)", backend.name()));
                        }
                    }
                }
                validate_nvme(&f, backend, &n.pci, n.nvme_nsid)?;
                validate_spdk(&f, backend, &n.trid)?;
            }
        }
        Ok(())
    }
}

impl Config {
    fn validate_pools(&self) -> Result<(), ConfigError> {
        use crate::pool::format::{
            min_device_size, Superblock, MAX_EXTENT_SIZE, MAX_NAME_LEN, MAX_VOLUMES,
            MIN_EXTENT_SIZE,
        };
        for (i, p) in self.pools.iter().enumerate() {
            let f = format!("pools[{i}]");
            if p.name.is_empty() || p.name.contains('/') || p.name.len() > 64 {
                return Err(invalid!(
                    "{f}.name",
                    "1 to 64 characters without `/` (got `{}`)",
                    p.name
                ));
            }
            if self.pools[..i].iter().any(|o| o.name == p.name) {
                return Err(invalid!("{f}.name", "`{}` is defined twice", p.name));
            }
            if !(1..=60_000).contains(&p.commit_interval_ms) {
                return Err(invalid!(
                    "{f}.commit_interval_ms",
                    "1 to 60000 milliseconds (got {})",
                    p.commit_interval_ms
                ));
            }
            if !p.extent_size.is_power_of_two()
                || !(MIN_EXTENT_SIZE..=MAX_EXTENT_SIZE).contains(&p.extent_size)
            {
                return Err(invalid!(
                    "{f}.extent_size",
                    "must be a power of two from 64KiB to 64MiB (got {})",
                    p.extent_size
                ));
            }
            if let Some(size) = p.size {
                // The pool's own layout decides what fits: the format code, not a
                // number here, knows how much metadata a pool of this size needs.
                let min = min_device_size(p.extent_size)
                    .map_err(|e| invalid!("{f}.extent_size", "{e}"))?;
                if size < min {
                    // Blame the extent size when smaller extents would fit.
                    let smallest = min_device_size(MIN_EXTENT_SIZE)
                        .map_err(|e| invalid!("{f}.extent_size", "{e}"))?;
                    if size >= smallest {
                        return Err(invalid!(
                            "{f}.extent_size",
                            "{} byte extents need a pool of at least {min} bytes (size is {size})",
                            p.extent_size
                        ));
                    }
                    return Err(invalid!(
                        "{f}.size",
                        "{size} bytes cannot hold a pool with {} byte extents: superblock, checkpoints, journal and one extent need at least {min} bytes ({} MiB)",
                        p.extent_size,
                        min.div_ceil(1 << 20)
                    ));
                }
                Superblock::layout(size, p.extent_size, [0; 16], None)
                    .map_err(|e| invalid!("{f}.size", "{e}"))?;
            }
            if p.volumes.len() > MAX_VOLUMES {
                return Err(invalid!(
                    "{f}.volumes",
                    "a pool holds at most {MAX_VOLUMES} volumes (got {})",
                    p.volumes.len()
                ));
            }
            match p.backend {
                Backend::Ram => {
                    if p.size.is_none() {
                        return Err(invalid!("{f}.size", "required for the ram backend"));
                    }
                    if p.path.is_some() {
                        return Err(invalid!("{f}.path", "the ram backend takes no path"));
                    }
                }
                Backend::Uring => {
                    if p.path.is_none() {
                        return Err(invalid!("{f}.path", "required for the uring backend"));
                    }
                }
                Backend::Nvme | Backend::Spdk => {
                    if p.path.is_some() || p.size.is_some() {
                        return Err(invalid!(
                            "{f}",
                            "the {} backend takes no path or size (the namespace has them)",
                            p.backend.name()
                        ));
                    }
                }
            }
            validate_nvme(&f, p.backend, &p.pci, p.nvme_nsid)?;
            validate_spdk(&f, p.backend, &p.trid)?;
            if p.backend == Backend::Spdk {
                let key = |o: &PoolConfig| {
                    o.trid
                        .as_deref()
                        .and_then(|t| t.parse::<crate::bdev::spdk::TransportId>().ok())
                        .map(|t| (t.spdk_string(), o.nvme_nsid.unwrap_or(1)))
                };
                if let Some(other) = self.pools[..i]
                    .iter()
                    .find(|o| o.backend == Backend::Spdk && key(o) == key(p))
                {
                    return Err(invalid!(
                        "{f}.trid",
                        "also the namespace of pool `{}`",
                        other.name
                    ));
                }
            }
            if p.backend == Backend::Nvme {
                if let Some(other) = self.pools[..i].iter().find(|o| {
                    o.backend == Backend::Nvme
                        && o.pci == p.pci
                        && o.nvme_nsid.unwrap_or(1) == p.nvme_nsid.unwrap_or(1)
                }) {
                    return Err(invalid!(
                        "{f}.pci",
                        "also the namespace of pool `{}`",
                        other.name
                    ));
                }
            }
            if let Some(other) = self.pools[..i]
                .iter()
                .find(|o| o.path.is_some() && o.path == p.path)
            {
                return Err(invalid!(
                    "{f}.path",
                    "also the path of pool `{}`",
                    other.name
                ));
            }
            let g = &p.gc;
            if g.low_watermark_pct > 50
                || g.high_watermark_pct > 90
                || g.low_watermark_pct > g.high_watermark_pct
            {
                return Err(invalid!(
                    "{f}.gc",
                    "watermarks must satisfy low <= high, low <= 50, high <= 90 (got {} and {})",
                    g.low_watermark_pct,
                    g.high_watermark_pct
                ));
            }
            if !(g.max_rate.is_finite() && g.max_rate >= 1.0) {
                return Err(invalid!(
                    "{f}.gc.max_rate",
                    "must be at least 1 extent per second"
                ));
            }
            let d = &p.dual_path;
            if d.piece < 4096
                || d.piece % 4096 != 0
                || d.large_threshold < 4096
                || d.max_inflight == 0
            {
                return Err(invalid!(
                    "{f}.dual_path",
                    "piece and large_threshold must be multiples of 4KiB, max_inflight at least 1"
                ));
            }
            for (j, v) in p.volumes.iter().enumerate() {
                let f = format!("{f}.volumes[{j}]");
                if v.name.is_empty() || v.name.len() > MAX_NAME_LEN || v.name.contains('/') {
                    return Err(invalid!(
                        "{f}.name",
                        "1 to {MAX_NAME_LEN} bytes without `/` (got `{}`)",
                        v.name
                    ));
                }
                if p.volumes[..j].iter().any(|o| o.name == v.name) {
                    return Err(invalid!("{f}.name", "`{}` is defined twice", v.name));
                }
                if !matches!(v.block_size, 512 | 4096) {
                    return Err(invalid!(
                        "{f}.block_size",
                        "must be 512 or 4096 (got {})",
                        v.block_size
                    ));
                }
                // The pool's limit on logical extents per volume (Pool::create_volume).
                if v.size.div_ceil(p.extent_size) > u32::MAX as u64 / 2 {
                    return Err(invalid!(
                        "{f}.size",
                        "{} is too large for {} byte extents",
                        v.size,
                        p.extent_size
                    ));
                }
                if v.size == 0 || v.size % v.block_size as u64 != 0 {
                    return Err(invalid!(
                        "{f}.size",
                        "must be a non-zero multiple of block_size {} (got {})",
                        v.block_size,
                        v.size
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The key path (`listeners[1].port`) of the `key = value` line holding byte
/// `at` of a TOML text, from the table headers above it. Only for naming a field
/// in an error: plain `key = value` lines under `[table]`/`[[array]]` headers,
/// which is how the example configurations are written.
fn key_path_at(text: &str, at: usize) -> Option<String> {
    let mut table = String::new();
    // Entries seen per array-of-tables path, e.g. "subsystems[0].namespaces" -> 2.
    let mut counts: Vec<(String, usize)> = Vec::new();
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let start = offset;
        offset += line.len();
        let l = line.trim();
        if let Some(name) = l.strip_prefix("[[").and_then(|r| r.split("]]").next()) {
            // `[[a.b]]` is an entry of `b` inside the latest `a`.
            let (parent, leaf) = match name.trim().rsplit_once('.') {
                Some((p, leaf)) => (resolve(&counts, p.trim()), leaf.trim()),
                None => (String::new(), name.trim()),
            };
            let path = if parent.is_empty() {
                leaf.to_string()
            } else {
                format!("{parent}.{leaf}")
            };
            let n = match counts.iter_mut().find(|(p, _)| *p == path) {
                Some((_, n)) => {
                    *n += 1;
                    *n
                }
                None => {
                    counts.push((path.clone(), 1));
                    1
                }
            };
            table = format!("{path}[{}]", n - 1);
        } else if let Some(name) = l.strip_prefix('[').and_then(|r| r.split(']').next()) {
            table = resolve(&counts, name.trim());
        } else if at < offset && at >= start {
            let key = l.split_once('=')?.0.trim();
            if key.is_empty() || key.starts_with('#') {
                return None;
            }
            return Some(if table.is_empty() {
                key.to_string()
            } else {
                format!("{table}.{key}")
            });
        }
        if at < offset {
            return None;
        }
    }
    None
}

/// `subsystems.namespaces` with the latest entry of each array it passes
/// through: `subsystems[1].namespaces[0]`.
fn resolve(counts: &[(String, usize)], dotted: &str) -> String {
    let mut path = String::new();
    for part in dotted.split('.') {
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(part.trim());
        if let Some((_, n)) = counts.iter().find(|(p, _)| *p == path) {
            path = format!("{path}[{}]", n - 1);
        }
    }
    path
}

/// `pci` and `nvme_nsid` belong to the nvme backend, which needs a valid `pci`.
fn validate_nvme(
    f: &str,
    backend: Backend,
    pci: &Option<String>,
    nsid: Option<u32>,
) -> Result<(), ConfigError> {
    if nsid == Some(0) || nsid == Some(u32::MAX) {
        return Err(invalid!("{f}.nvme_nsid", "must be a namespace id from 1"));
    }
    if backend != Backend::Nvme {
        if pci.is_some() {
            return Err(invalid!(
                "{f}.pci",
                "`pci` only applies to the nvme backend"
            ));
        }
        if nsid.is_some() && backend != Backend::Spdk {
            return Err(invalid!(
                "{f}.nvme_nsid",
                "only applies to the nvme and spdk backends"
            ));
        }
        return Ok(());
    }
    let Some(pci) = pci else {
        return Err(invalid!("{f}.pci", "required for the nvme backend"));
    };
    crate::bdev::nvme::pci::parse_bdf(pci).map_err(|e| invalid!("{f}.pci", "{e}"))?;
    Ok(())
}

/// `trid` belongs to the spdk backend, which needs a valid one and a build with
/// SPDK.
fn validate_spdk(f: &str, backend: Backend, trid: &Option<String>) -> Result<(), ConfigError> {
    if backend != Backend::Spdk {
        if trid.is_some() {
            return Err(invalid!("{f}.trid", "only applies to the spdk backend"));
        }
        return Ok(());
    }
    let Some(trid) = trid else {
        return Err(invalid!(
            "{f}.trid",
            "required for the spdk backend (e.g. \"trtype:PCIe traddr:0000:00:04.0\")"
        ));
    };
    trid.parse::<crate::bdev::spdk::TransportId>()
        .map_err(|e| invalid!("{f}.trid", "{e}"))?;
    if !crate::bdev::spdk::AVAILABLE {
        return Err(invalid!(
            "{f}.backend",
            "{}",
            crate::bdev::spdk::SpdkError::NotBuilt
        ));
    }
    Ok(())
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Ram => "ram",
            Backend::Uring => "uring",
            Backend::Nvme => "nvme",
            Backend::Spdk => "spdk",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[reactors]
count = 1
idle = "adaptive"

[discovery]
port = 8009

[[listeners]]
address = "127.0.0.1"
port = 4420

[[subsystems]]
nqn = "nqn.2026-11.io.kvtarget:kv0"
allow_any_host = true

[[subsystems.namespaces]]
nsid = 1
backend = "uring"
path = "/tmp/x.img"
size = "1GiB"
block_size = 4096
"#;

    #[test]
    fn default_config_file_parses() {
        let text = include_str!("../config/default.toml");
        let c = Config::parse(text).unwrap();
        assert_eq!(c.listeners[0].port, 4420);
        assert_eq!(c.discovery.port, Some(8009));
    }

    #[test]
    fn every_example_config_parses() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/config");
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "toml") {
                match Config::load(&p) {
                    Ok(_) => {}
                    // The spdk examples need an SPDK build; without one they say so.
                    Err(e) if !crate::bdev::spdk::AVAILABLE && e.to_string().contains(".backend: the spdk backend needs kvtarget built with `--features spdk`") => {}
                    Err(e) => panic!("{e}"),
                }
            }
        }
    }

    #[test]
    fn good_config() {
        let c = Config::parse(GOOD).unwrap();
        assert_eq!(c.subsystems[0].namespaces[0].size, Some(1 << 30));
        assert_eq!(c.tcp.max_io_size, 1 << 20);
    }

    #[test]
    fn tls_example_and_secure_channel_rules() {
        let c = Config::parse(include_str!("../config/tls.toml")).unwrap();
        assert!(c.listeners[0].secure_channel && !c.listeners[1].secure_channel);
        assert_eq!(c.secure_listen_addrs().unwrap().len(), 1);
        assert_eq!(c.subsystems[0].hosts[0].psk(), Some("host-a-psk"));
        let t = include_str!("../config/tls.toml");
        let e = err(&t.replace("psk = \"host-a-psk\"", "psk = \"nope\""));
        assert!(
            e.contains("subsystems[0].hosts[0].psk: no key `nope`"),
            "{e}"
        );
        let e = err(&format!(
            "{t}\n[[listeners]]\naddress = \"127.0.0.1\"\ntransport = \"rdma\"\nsecure_channel = true\n"
        ));
        assert!(e.contains("listeners[2].secure_channel"), "{e}");
    }

    fn err(text: &str) -> String {
        let e = Config::parse(text).unwrap_err().to_string();
        assert!(!e.contains('\n'), "one line: {e}");
        e
    }

    #[test]
    fn errors_name_the_field() {
        assert!(err(&GOOD.replace("4096\n", "1000\n")).contains("namespaces[0].block_size"));
        assert!(err(&GOOD.replace("\"1GiB\"", "\"1 parsec\"")).contains("unknown unit"));
        assert!(
            err(&GOOD.replace("nqn.2026-11.io.kvtarget:kv0", "kv0")).contains("subsystems[0].nqn")
        );
        assert!(err(&GOOD.replace("127.0.0.1", "localhost-ish")).contains("listeners[0].address"));
        // An RDMA listener beside the TCP one, on the same address and port.
        let both =
            format!("{GOOD}\n[[listeners]]\naddress = \"127.0.0.1\"\ntransport = \"rdma\"\n");
        let c = Config::parse(&both).unwrap();
        assert_eq!(c.rdma_listen_addrs().unwrap().len(), 1);
        assert_eq!(c.listen_addrs().unwrap().len(), 1);
        assert!(err(&format!("{GOOD}\n[rdma]\nbuffer_pool_size = 4096\n"))
            .contains("rdma.buffer_pool_size"));
        assert!(err(&format!("{GOOD}\n[rdma]\nmax_outstanding_reads = 0\n"))
            .contains("rdma.max_outstanding_reads"));
        assert!(
            err(&format!("{GOOD}\n[rdma]\nmax_qpairs_per_reactor = 0\n"))
                .contains("rdma.max_qpairs_per_reactor")
        );
        let e = err(&format!(
            "{GOOD}\n[[listeners]]\naddress = \"127.0.0.1\"\ntransport = \"iwarp\"\n"
        ));
        assert!(e.contains("iwarp"), "{e}");
        assert!(err(&GOOD.replace("\"uring\"", "\"floppy\"")).contains("floppy"));
        assert!(err(&GOOD.replace("idle", "idel")).contains("idel"));
        assert!(err(&GOOD.replace("path = \"/tmp/x.img\"\n", "")).contains("namespaces[0].path"));
        assert!(err(&GOOD.replace("port = 8009", "port = 4420")).contains("discovery.port"));
        assert!(err(&GOOD.replace("nsid = 1", "nsid = 0")).contains("nsid"));
        let e = err(&GOOD.replace("count = 1", "count = \"one\""));
        assert!(e.starts_with("line 3"), "{e}");
    }

    #[test]
    fn spdk_backend_fields() {
        let tcp = "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:4430 subnqn:nqn.2016-06.io.spdk:cnode1";
        let spdk = GOOD.replace(
            "backend = \"uring\"\npath = \"/tmp/x.img\"\nsize = \"1GiB\"\nblock_size = 4096\n",
            &format!("backend = \"spdk\"\ntrid = \"{tcp}\"\nnvme_nsid = 1\n"),
        );
        if crate::bdev::spdk::AVAILABLE {
            Config::parse(&spdk).unwrap();
        } else {
            // Configured on a build without SPDK: one line naming the field.
            let e = err(&spdk);
            assert!(
                e.starts_with("subsystems[0].namespaces[0].backend: the spdk backend needs kvtarget built with `--features spdk`"),
                "{e}"
            );
        }
        let e = err(&spdk.replace(&format!("trid = \"{tcp}\"\n"), ""));
        assert!(
            e.contains("namespaces[0].trid: required for the spdk backend"),
            "{e}"
        );
        let e = err(&spdk.replace("trsvcid:4430 ", ""));
        assert!(
            e.contains("namespaces[0].trid: trsvcid (the port) is missing"),
            "{e}"
        );
        let e = err(&spdk.replace("trid = ", "path = \"/x\"\ntrid = "));
        assert!(
            e.contains("namespaces[0]: the spdk backend takes no path"),
            "{e}"
        );
        let e = err(&GOOD.replace(
            "block_size = 4096\n",
            &format!("block_size = 4096\ntrid = \"{tcp}\"\n"),
        ));
        assert!(
            e.contains("namespaces[0].trid: only applies to the spdk backend"),
            "{e}"
        );
        // Two pools on one SPDK namespace would overwrite each other.
        let pool = format!("[[pools]]\nname = \"a\"\nbackend = \"spdk\"\ntrid = \"{tcp}\"\n\n");
        let e = err(&format!("{pool}{}{GOOD}", pool.replace("\"a\"", "\"b\"")));
        if crate::bdev::spdk::AVAILABLE {
            assert!(
                e.contains("pools[1].trid: also the namespace of pool `a`"),
                "{e}"
            );
        } else {
            assert!(
                e.contains("pools[0].backend: the spdk backend needs"),
                "{e}"
            );
        }
        let e = err(&format!(
            "[spdk]\nno_huge = true\nhugedir = \"/dev/hugepages\"\n{GOOD}"
        ));
        assert!(e.starts_with("spdk.hugedir:"), "{e}");
        let e = err(&format!("[spdk]\nmem_size = \"1MiB\"\n{GOOD}"));
        assert!(e.contains("spdk.mem_size"), "{e}");
        let cfg = Config::parse(&format!(
            "[spdk]\nno_huge = true\nmem_size = \"2GiB\"\n{GOOD}"
        ))
        .unwrap();
        assert_eq!(cfg.spdk_env().mem_size_mib, Some(2048));
        assert!(!cfg.spdk_env().pci);
    }

    #[test]
    fn nvme_backend_fields() {
        let nvme = GOOD.replace(
            "backend = \"uring\"\npath = \"/tmp/x.img\"\nsize = \"1GiB\"\nblock_size = 4096\n",
            "backend = \"nvme\"\npci = \"0000:00:10.0\"\n",
        );
        Config::parse(&nvme).unwrap();
        Config::parse(&nvme.replace("pci = ", "nvme_nsid = 2\npci = ")).unwrap();
        let e = err(&nvme.replace("pci = \"0000:00:10.0\"\n", ""));
        assert!(e.contains("namespaces[0].pci: required"), "{e}");
        let e = err(&nvme.replace("0000:00:10.0", "00:10.0"));
        assert!(
            e.contains("namespaces[0].pci") && e.contains("00:10.0"),
            "{e}"
        );
        let e = err(&nvme.replace("pci = ", "nvme_nsid = 0\npci = "));
        assert!(e.contains("namespaces[0].nvme_nsid"), "{e}");
        let e = err(&nvme.replace("pci = ", "path = \"/x\"\npci = "));
        assert!(
            e.contains("namespaces[0]: the nvme backend takes no path"),
            "{e}"
        );
        let e = err(&GOOD.replace(
            "block_size = 4096\n",
            "block_size = 4096\npci = \"0000:00:10.0\"\n",
        ));
        assert!(
            e.contains("namespaces[0].pci: `pci` only applies to the nvme backend"),
            "{e}"
        );
        let e = err(&GOOD.replace("block_size = 4096\n", "block_size = 4096\nnvme_nsid = 2\n"));
        assert!(
            e.contains("namespaces[0].nvme_nsid: only applies to the nvme and spdk"),
            "{e}"
        );
        let pools = "[[pools]]\nname = \"a\"\nbackend = \"nvme\"\npci = \"0000:00:10.0\"\n\n[[pools]]\nname = \"b\"\nbackend = \"nvme\"\npci = \"0000:00:10.0\"\nnvme_nsid = 1\n";
        let e = err(&format!("{pools}{GOOD}"));
        assert!(
            e.contains("pools[1].pci: also the namespace of pool `a`"),
            "{e}"
        );
        Config::parse(&format!(
            "{}{GOOD}",
            pools.replace("nvme_nsid = 1", "nvme_nsid = 2")
        ))
        .unwrap();
    }

    /// A RAM pool of `size` with `extent` extents, its volume served as nsid 1.
    fn pool_config(size: &str, extent: &str) -> String {
        format!(
            "[[pools]]\nname = \"kv\"\nbackend = \"ram\"\nsize = {size}\nextent_size = {extent}\n\n[[pools.volumes]]\nname = \"v\"\nsize = \"1GiB\"\n{GOOD}"
        )
    }

    fn field_of(text: &str) -> String {
        let e = Config::parse(text).unwrap_err();
        assert!(!e.to_string().contains('\n'), "one line: {e}");
        e.field()
            .map(str::to_string)
            .unwrap_or_else(|| e.to_string())
    }

    #[test]
    fn active_r2ts_are_bounded_and_named() {
        let with = |v: &str| format!("[tcp]\nmax_active_r2ts = {v}\n{GOOD}");
        assert_eq!(Config::parse(GOOD).unwrap().tcp.max_active_r2ts, 8);
        assert_eq!(Config::parse(&with("2")).unwrap().tcp.max_active_r2ts, 2);
        for bad in ["0", "257"] {
            assert_eq!(field_of(&with(bad)), "tcp.max_active_r2ts", "{bad}");
        }
    }

    #[test]
    fn socket_buffers_are_auto_or_bounded() {
        let with = |k: &str, v: &str| format!("[tcp]\n{k} = {v}\n{GOOD}");
        let c = Config::parse(GOOD).unwrap();
        assert_eq!((c.tcp.recv_buf_size, c.tcp.send_buf_size), (0, 0));
        let c = Config::parse(&with("recv_buf_size", "\"2MiB\"")).unwrap();
        assert_eq!(c.tcp.recv_buf_size, 2 << 20);
        for k in ["recv_buf_size", "send_buf_size"] {
            for bad in ["1024", "\"512MiB\""] {
                assert_eq!(field_of(&with(k, bad)), format!("tcp.{k}"), "{k} = {bad}");
            }
        }
    }

    #[test]
    fn commit_interval_is_bounded_and_named() {
        let with = |v: &str| {
            pool_config("\"64MiB\"", "\"1MiB\"").replacen(
                "extent_size",
                &format!("commit_interval_ms = {v}\nextent_size"),
                1,
            )
        };
        let c = Config::parse(&with("250")).unwrap();
        assert_eq!(c.pools[0].commit_interval_ms, 250);
        let c = Config::parse(&pool_config("\"64MiB\"", "\"1MiB\"")).unwrap();
        assert_eq!(c.pools[0].commit_interval_ms, 1000);
        for bad in ["0", "60001"] {
            assert_eq!(field_of(&with(bad)), "pools[0].commit_interval_ms", "{bad}");
        }
        // Not a number: serde's own message, still one line naming the key.
        let e = Config::parse(&with("\"1s\"")).unwrap_err().to_string();
        assert!(e.contains("commit_interval_ms"), "{e}");
    }

    #[test]
    fn pool_sizes_follow_the_pool_layout() {
        use crate::pool::format::{min_device_size, Superblock};
        for extent in [64u64 << 10, 1 << 20, 64 << 20] {
            let min = min_device_size(extent).unwrap();
            // The smallest size the format accepts, and nothing below it.
            assert!(Superblock::layout(min, extent, [0; 16], None).is_ok());
            assert!(Superblock::layout(min - 4096, extent, [0; 16], None).is_err());
            Config::parse(&pool_config(&min.to_string(), &extent.to_string())).unwrap();
            let below = pool_config(&(min - 4096).to_string(), &extent.to_string());
            let f = field_of(&below);
            assert!(f == "pools[0].size" || f == "pools[0].extent_size", "{f}");
        }
        assert_eq!(field_of(&pool_config("0", "\"1MiB\"")), "pools[0].size");
        assert_eq!(field_of(&pool_config("4096", "\"1MiB\"")), "pools[0].size");
        // 32 MiB holds a pool of 1 MiB extents, not of 64 MiB ones.
        assert_eq!(
            field_of(&pool_config("\"32MiB\"", "\"64MiB\"")),
            "pools[0].extent_size"
        );
        assert_eq!(
            field_of(&pool_config("\"1GiB\"", "\"3MiB\"")),
            "pools[0].extent_size"
        );
        assert_eq!(
            field_of(&pool_config("\"1GiB\"", "\"128MiB\"")),
            "pools[0].extent_size"
        );
        assert!(min_device_size(3 << 20).is_err());
    }

    #[test]
    fn volume_and_reference_errors_name_the_field() {
        let base = pool_config("\"1GiB\"", "\"1MiB\"");
        Config::parse(&base).unwrap();
        let vol = |with: &str| base.replace("name = \"v\"\nsize = \"1GiB\"\n", with);
        assert_eq!(
            field_of(&vol("name = \"v\"\nsize = 0\n")),
            "pools[0].volumes[0].size"
        );
        assert_eq!(
            field_of(&vol("name = \"v\"\nsize = \"1GiB\"\nblock_size = 2048\n")),
            "pools[0].volumes[0].block_size"
        );
        // More logical extents than a volume's map holds.
        assert_eq!(
            field_of(&vol("name = \"v\"\nsize = \"2048TiB\"\n")),
            "pools[0].volumes[0].size"
        );
        let served = base.replace(
            "backend = \"uring\"\npath = \"/tmp/x.img\"\nsize = \"1GiB\"\nblock_size = 4096\n",
            "volume = \"kv/nope\"\n",
        );
        assert_eq!(field_of(&served), "subsystems[0].namespaces[0].volume");
        assert_eq!(
            field_of(&served.replace("kv/nope", "other/v")),
            "subsystems[0].namespaces[0].volume"
        );
        let two = format!("{base}\n[[pools]]\nname = \"kv\"\nbackend = \"ram\"\nsize = \"1GiB\"\n");
        assert_eq!(field_of(&two), "pools[1].name");
    }

    #[test]
    fn type_errors_name_the_key() {
        let e = err(&GOOD.replace("port = 4420", "port = 70000"));
        assert!(e.contains("listeners[0].port: "), "{e}");
        let e = err(&GOOD.replace("nsid = 1", "nsid = -1"));
        assert!(e.contains("subsystems[0].namespaces[0].nsid: "), "{e}");
        let e = err(&GOOD.replace("port = 8009", "port = \"x\""));
        assert!(e.contains("discovery.port: "), "{e}");
        let e = err(&format!("{GOOD}\n[[subsystems]]\nnqn = \"nqn.2026-11.x:b\"\n[[subsystems.namespaces]]\nnsid = 1\n[[subsystems.namespaces]]\nnsid = true\n"));
        assert!(e.contains("subsystems[1].namespaces[1].nsid: "), "{e}");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("x"), Err(SizeError::NotASize("x".into())));
        assert_eq!(parse_size("64KiB"), Ok(65536));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999TiB").is_err());
    }
}
