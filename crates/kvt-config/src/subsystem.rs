//! `[[subsystems]]`: NVMe subsystems, their allowed hosts and their namespaces.

use super::device::{Backend, DeviceSpec, Holder};
use super::size::opt_size;
use super::{ConfigError, KeyConfig, PoolConfig, VolumeKind};
use kvt_pool::kv::OnFull;
use kvt_wire::nqn::validate_nqn;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;

/// Longest serial number, in ASCII bytes: Identify Controller's SN field.
pub const SERIAL_MAX_LEN: usize = 20;
/// Longest model number, in ASCII bytes: Identify Controller's MN field.
pub const MODEL_MAX_LEN: usize = 40;
/// Block sizes a plain namespace may have, in bytes (powers of two).
pub const NAMESPACE_BLOCK_SIZES: std::ops::RangeInclusive<u32> = 512..=4096;
/// Block size of a plain namespace when none is given, in bytes.
pub const DEFAULT_BLOCK_SIZE: u32 = 4096;

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
    /// Compatibility for hosts that read Identify Namespace (CNS 00h) of every
    /// namespace before its command set (SPDK v26.05's NVMe driver): a KV
    /// namespace answers CNS 00h with an NVM-shaped structure (its capacity in
    /// blocks) instead of Invalid I/O Command Set. See docs/kv-namespaces.md.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub nvm_identify_for_kv: bool,
    /// Asymmetric Namespace Access reporting (SPDK's `ana_reporting`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub ana_reporting: bool,
    /// Served by several nodes of the `[cluster]` under this NQN: each ANA
    /// group's owner is elected through etcd and reports optimized, the
    /// others inaccessible (docs/cluster.md). Needs `ana_reporting`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub cluster_wide: bool,
    #[serde(default)]
    pub hosts: Vec<HostConfig>,
    /// "address:port" entries this subsystem is reachable on; absent: every
    /// listener. Addresses not among [[listeners]] are listened on as well.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<Vec<String>>,
    /// ANA states of listeners other than optimized (`ana_reporting` on).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ana_states: Vec<AnaStateConfig>,
    #[serde(default)]
    pub namespaces: Vec<NamespaceConfig>,
}

pub(super) fn is_false(b: &bool) -> bool {
    !*b
}

/// `[[subsystems.ana_states]]`: one listener's state for one ANA group (or
/// every group), as `nvmf_subsystem_listener_set_ana_state` sets it.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AnaStateConfig {
    /// "address:port": the listener.
    pub listen: String,
    /// The ANA group; absent: every group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ana_group: Option<u32>,
    /// optimized, non_optimized, inaccessible, persistent_loss or change.
    pub state: String,
}

impl AnaStateConfig {
    /// Entry `f` of a subsystem whose `listen` list is `listen`.
    fn validate(&self, f: &str, listen: Option<&[String]>) -> Result<(), ConfigError> {
        let a: SocketAddr = self
            .listen
            .parse()
            .map_err(|_| invalid!("{f}.listen", "`{}` is not ADDRESS:PORT", self.listen))?;
        let listed = |l: &[String]| l.iter().any(|x| x.parse::<SocketAddr>().ok() == Some(a));
        if listen.is_some_and(|l| !listed(l)) {
            return Err(invalid!(
                "{f}.listen",
                "`{a}` is not in the subsystem's listen list"
            ));
        }
        if let Some(g) = self.ana_group {
            kvt_nvmf::ana::check_group(g as u64).map_err(|e| invalid!("{f}.ana_group", "{e}"))?;
        }
        kvt_nvmf::ana::AnaState::parse(&self.state).map_err(|e| invalid!("{f}.state", "{e}"))?;
        Ok(())
    }
}

/// Serial number of a subsystem that names none.
pub const DEFAULT_SERIAL: &str = "KVT0000000000001";
/// Model number of a subsystem that names none.
pub const DEFAULT_MODEL: &str = "kvtarget";

pub(super) fn d_serial() -> String {
    DEFAULT_SERIAL.into()
}
pub(super) fn d_model() -> String {
    DEFAULT_MODEL.into()
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
    fn entry(&self) -> Option<&HostEntryConfig> {
        match self {
            HostConfig::Nqn(_) => None,
            HostConfig::Entry(e) => Some(e),
        }
    }
    pub fn dhchap_key(&self) -> Option<&str> {
        self.entry()?.dhchap_key.as_deref()
    }
    pub fn dhchap_ctrlr_key(&self) -> Option<&str> {
        self.entry()?.dhchap_ctrlr_key.as_deref()
    }
    pub fn psk(&self) -> Option<&str> {
        self.entry()?.psk.as_deref()
    }

    /// `f`: this host's path; `keys`: the configured `[[keys]]`.
    fn validate(&self, f: &str, keys: &[KeyConfig]) -> Result<(), ConfigError> {
        let e = match self {
            HostConfig::Nqn(n) => return validate_nqn(n).map_err(|e| invalid!("{f}", "{e}")),
            HostConfig::Entry(e) => e,
        };
        validate_nqn(&e.nqn).map_err(|err| invalid!("{f}.nqn", "{err}"))?;
        let known = |k: &str| keys.iter().any(|x| x.name == k);
        if let Some(k) = e.dhchap_key.as_deref().filter(|k| !known(k)) {
            return Err(invalid!("{f}.dhchap_key", "no key `{k}` in [[keys]]"));
        }
        if let Some(k) = e.psk.as_deref().filter(|k| !known(k)) {
            return Err(invalid!("{f}.psk", "no key `{k}` in [[keys]]"));
        }
        match e.dhchap_ctrlr_key.as_deref() {
            Some(_) if e.dhchap_key.is_none() => Err(invalid!(
                "{f}.dhchap_ctrlr_key",
                "needs dhchap_key (the host authenticates first)"
            )),
            Some(k) if !known(k) => {
                Err(invalid!("{f}.dhchap_ctrlr_key", "no key `{k}` in [[keys]]"))
            }
            _ => Ok(()),
        }
    }
}

impl From<&str> for HostConfig {
    fn from(n: &str) -> HostConfig {
        HostConfig::Nqn(n.to_string())
    }
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
    pub on_full: Option<OnFull>,
    /// KV namespaces: keys older than this many seconds read as missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_secs: Option<u64>,
    /// KV namespaces: false keeps extents whose blocks are all free mapped
    /// instead of giving them back to the pool after 5 s (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trim: Option<bool>,
    /// Where registrations and the reservation persist through power loss
    /// (SPDK's `ptpl_file`); without one a namespace cannot persist them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ptpl_file: Option<PathBuf>,
    /// The ANA group (ANAGRPID; default the NSID).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ana_group: Option<u32>,
}

/// A KV namespace's cache policy as `nvmf_subsystem_add_ns` and the
/// configuration give it (`on_full`, `ttl_secs`, `trim`).
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct KvOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_full: Option<OnFull>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_secs: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trim: Option<bool>,
}

/// The longest KV time-to-live: ten years, longer than any KV-cache entry is
/// kept, and far inside what a saved configuration (TOML's signed 64-bit
/// integers) and `Duration` hold.
pub const MAX_TTL_SECS: u64 = 10 * 365 * 24 * 3600;

impl KvOptions {
    /// The options' own limits; the reason names the field under `f`.
    pub fn validate(&self, f: &str) -> Result<(), ConfigError> {
        match self.ttl_secs {
            Some(t) if t > MAX_TTL_SECS => Err(invalid!(
                "{f}.ttl_secs",
                "must be at most {MAX_TTL_SECS} (ten years; got {t})"
            )),
            _ => Ok(()),
        }
    }
    /// The policy: evict when full, no TTL and trimming unless told otherwise.
    pub fn settings(&self) -> kvt_pool::kv::KvSettings {
        kvt_pool::kv::KvSettings {
            on_full: self.on_full.unwrap_or_default(),
            ttl: self
                .ttl_secs
                .filter(|&t| t > 0)
                .map(std::time::Duration::from_secs),
            keep_footprint: self.trim == Some(false),
        }
    }
    /// Whether any option is set (refused on a block namespace).
    pub fn is_set(&self) -> bool {
        *self != KvOptions::default()
    }
}

impl NamespaceConfig {
    pub fn kv_options(&self) -> KvOptions {
        KvOptions {
            on_full: self.on_full,
            ttl_secs: self.ttl_secs,
            trim: self.trim,
        }
    }
    /// The KV cache policy this namespace asks for.
    pub fn kv_settings(&self) -> kvt_pool::kv::KvSettings {
        self.kv_options().settings()
    }
    /// Whether a KV-only option is set (refused on a block namespace).
    pub fn has_kv_options(&self) -> bool {
        self.kv_options().is_set()
    }
    pub fn block_size(&self) -> u32 {
        self.block_size.unwrap_or(DEFAULT_BLOCK_SIZE)
    }

    /// The whole device this namespace is, when it is not a pool volume.
    pub fn device(&self) -> Option<DeviceSpec<'_>> {
        Some(DeviceSpec {
            backend: self.backend?,
            path: self.path.as_deref(),
            pci: self.pci.as_deref(),
            nvme_nsid: self.nvme_nsid,
            trid: self.trid.as_deref(),
            size: self.size,
        })
    }

    /// A volume namespace takes its device and geometry from the volume.
    fn validate_volume(&self, f: &str) -> Result<(), ConfigError> {
        if self.backend.is_some()
            || self.pci.is_some()
            || self.trid.is_some()
            || self.nvme_nsid.is_some()
            || self.path.is_some()
            || self.size.is_some()
            || self.block_size.is_some()
        {
            return Err(invalid!(
                "{f}.volume", "a volume namespace takes no backend, path, size or block_size (the volume has them)"
            ));
        }
        Ok(())
    }

    /// A plain namespace: a backend and a geometry that fits it.
    fn validate_device(&self, f: &str) -> Result<(), ConfigError> {
        let Some(dev) = self.device() else {
            return Err(invalid!(
                "{f}",
                "needs `volume = \"pool/volume\"` or a `backend`"
            ));
        };
        let bs = self.block_size();
        if !bs.is_power_of_two() || !NAMESPACE_BLOCK_SIZES.contains(&bs) {
            return Err(invalid!(
                "{f}.block_size",
                "must be 512, 1024, 2048 or 4096 (got {bs})"
            ));
        }
        if let Some(sz) = self.size {
            if sz == 0 || sz % bs as u64 != 0 {
                return Err(invalid!(
                    "{f}.size",
                    "must be a non-zero multiple of block_size {bs} (got {sz})"
                ));
            }
        }
        let holder = Holder::Namespace {
            block_size: self.block_size.is_some(),
        };
        dev.validate(f, holder)
    }
}

/// What a subsystem's entries may refer to.
pub(super) struct Refs<'a> {
    pub keys: &'a [KeyConfig],
    pub pools: &'a [PoolConfig],
    /// Whether the configuration has a `[cluster]`.
    pub cluster: bool,
}

impl SubsystemConfig {
    /// `earlier`: the subsystems before this one; `served`: the volumes their
    /// namespaces (and this one's so far) serve, each at most once.
    pub(super) fn validate<'a>(
        &'a self,
        f: &str,
        earlier: &[SubsystemConfig],
        refs: &Refs<'_>,
        served: &mut Vec<&'a str>,
    ) -> Result<(), ConfigError> {
        validate_nqn(&self.nqn).map_err(|e| invalid!("{f}.nqn", "{e}"))?;
        if self.nqn == kvt_wire::nvme::DISCOVERY_NQN {
            return Err(invalid!("{f}.nqn", "the discovery NQN is reserved"));
        }
        if earlier.iter().any(|o| o.nqn == self.nqn) {
            return Err(invalid!("{f}.nqn", "`{}` is defined twice", self.nqn));
        }
        self.validate_identity(f)?;
        for (j, h) in self.hosts.iter().enumerate() {
            h.validate(&format!("{f}.hosts[{j}]"), refs.keys)?;
            if self.hosts[..j].iter().any(|o| o.nqn() == h.nqn()) {
                return Err(invalid!("{f}.hosts[{j}]", "`{}` is listed twice", h.nqn()));
            }
        }
        for (j, a) in self.listen.iter().flatten().enumerate() {
            a.parse::<SocketAddr>()
                .map_err(|_| invalid!("{f}.listen[{j}]", "`{a}` is not ADDRESS:PORT"))?;
        }
        if self.cluster_wide && !refs.cluster {
            return Err(invalid!("{f}.cluster_wide", "needs a [cluster] section"));
        }
        if self.cluster_wide && !self.ana_reporting {
            return Err(invalid!("{f}.cluster_wide", "needs ana_reporting = true"));
        }
        for (k, a) in self.ana_states.iter().enumerate() {
            let f = format!("{f}.ana_states[{k}]");
            if !self.ana_reporting {
                return Err(invalid!("{f}", "needs ana_reporting = true"));
            }
            a.validate(&f, self.listen.as_deref())?;
        }
        for j in 0..self.namespaces.len() {
            let f = format!("{f}.namespaces[{j}]");
            self.validate_namespace(&f, j, refs, served)?;
        }
        Ok(())
    }

    /// Serial and model number fit Identify Controller.
    fn validate_identity(&self, f: &str) -> Result<(), ConfigError> {
        let s = &self.serial;
        if s.is_empty() || s.len() > SERIAL_MAX_LEN || !s.is_ascii() {
            return Err(invalid!(
                "{f}.serial",
                "1 to {SERIAL_MAX_LEN} ASCII characters (got `{s}`)"
            ));
        }
        let m = &self.model;
        if m.is_empty() || m.len() > MODEL_MAX_LEN || !m.is_ascii() {
            return Err(invalid!(
                "{f}.model",
                "1 to {MODEL_MAX_LEN} ASCII characters (got `{m}`)"
            ));
        }
        Ok(())
    }

    /// Namespace `j` of this subsystem, at path `f`.
    fn validate_namespace<'a>(
        &'a self,
        f: &str,
        j: usize,
        refs: &Refs<'_>,
        served: &mut Vec<&'a str>,
    ) -> Result<(), ConfigError> {
        let n = &self.namespaces[j];
        let max = kvt_nvmf::admin::MAX_NAMESPACES;
        if n.nsid == 0 || n.nsid > max {
            return Err(invalid!("{f}.nsid", "must be 1..={max} (got {})", n.nsid));
        }
        if self.namespaces[..j].iter().any(|o| o.nsid == n.nsid) {
            return Err(invalid!(
                "{f}.nsid",
                "{} is used twice in {}",
                n.nsid,
                self.nqn
            ));
        }
        if let Some(g) = n.ana_group {
            kvt_nvmf::ana::check_group(g as u64).map_err(|e| invalid!("{f}.ana_group", "{e}"))?;
        }
        n.kv_options().validate(f)?;
        let Some(v) = &n.volume else {
            return n.validate_device(f);
        };
        n.validate_volume(f)?;
        super::pool::find_volume(refs.pools, v).map_err(|reason| ConfigError::Invalid {
            field: format!("{f}.volume"),
            reason,
        })?;
        if self.cluster_wide {
            super::pool::cluster_wide_volume(refs.pools, v).map_err(|reason| {
                ConfigError::Invalid {
                    field: format!("{f}.volume"),
                    reason,
                }
            })?;
        }
        if served.contains(&v.as_str()) {
            return Err(invalid!(
                "{f}.volume",
                "`{v}` is served by another namespace"
            ));
        }
        served.push(v);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::Config;

    const BASE: &str = "[[listeners]]\naddress = \"127.0.0.1\"\nport = 4420\n";
    const CLUSTER: &str = "[cluster]\nendpoints = [\"http://127.0.0.1:2379\"]\nnode = \"a\"\n";

    fn parse(sub: &str, cluster: bool) -> Result<Config, String> {
        let c = if cluster { CLUSTER } else { "" };
        let text = format!("{BASE}{c}[[subsystems]]\nnqn = \"nqn.2016-06.io.kvtarget:s\"\n{sub}");
        Config::parse(&text).map_err(|e| e.to_string())
    }

    #[test]
    fn cluster_wide_refuses_block_volumes_on_node_local_pools() {
        let pools = "[[pools]]\nname = \"p\"\nbackend = \"ram\"\nsize = \"64MiB\"\n\
            [[pools.volumes]]\nname = \"b\"\nsize = \"4MiB\"\n\
            [[pools.volumes]]\nname = \"k\"\nsize = \"4MiB\"\nkind = \"kv\"\n";
        let sub = |vol: &str, wide: bool| {
            let text = format!(
                "{BASE}{CLUSTER}{pools}[[subsystems]]\nnqn = \"nqn.2016-06.io.kvtarget:s\"\n\
                 ana_reporting = true\ncluster_wide = {wide}\n\
                 [[subsystems.namespaces]]\nnsid = 1\nvolume = \"p/{vol}\"\n"
            );
            Config::parse(&text).map(|_| ()).map_err(|e| e.to_string())
        };
        assert_eq!(sub("k", true), Ok(()));
        assert_eq!(sub("b", false), Ok(()));
        let e = sub("b", true).unwrap_err();
        assert!(
            e.starts_with("subsystems[0].namespaces[0].volume: `p/b` is a block volume on node-local pool `p`"),
            "{e}"
        );
        assert!(!e.contains('\n'));
    }

    #[test]
    fn cluster_wide_needs_a_cluster_and_ana_reporting() {
        let ok = parse("ana_reporting = true\ncluster_wide = true\n", true).unwrap();
        assert!(ok.subsystems[0].cluster_wide);
        let again = Config::parse(&ok.to_toml().unwrap()).unwrap();
        assert!(again.subsystems[0].cluster_wide);
        assert!(!parse("", true).unwrap().subsystems[0].cluster_wide);
        let cases = [
            (
                "ana_reporting = true\ncluster_wide = true\n",
                false,
                "subsystems[0].cluster_wide: needs a [cluster] section",
            ),
            (
                "cluster_wide = true\n",
                true,
                "subsystems[0].cluster_wide: needs ana_reporting = true",
            ),
        ];
        for (text, cluster, want) in cases {
            let e = parse(text, cluster).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
            assert!(!e.contains('\n'), "one line: {e}");
        }
    }

    const SHARED: &str = "[[pools]]\nname = \"p\"\nbackend = \"uring\"\npath = \"/tmp/p.img\"\nsize = \"64MiB\"\nshared = true\n\
        [[pools.volumes]]\nname = \"b\"\nsize = \"4MiB\"\n\
        [[pools.volumes]]\nname = \"c\"\nsize = \"4MiB\"\n";

    #[test]
    fn shared_pools_serve_block_volumes_from_one_cluster_wide_group() {
        let ns = |nsid: u32, v: &str| {
            format!("[[subsystems.namespaces]]\nnsid = {nsid}\nvolume = \"{v}\"\nana_group = 1\n")
        };
        let sub = format!(
            "ana_reporting = true\ncluster_wide = true\n{}{}",
            ns(1, "p/b"),
            ns(2, "p/c")
        );
        let c = parse(&format!("{sub}\n{SHARED}"), true).unwrap();
        assert!(c.pools[0].shared);
        let again = Config::parse(&toml::to_string(&c).unwrap()).unwrap();
        assert!(again.pools[0].shared);
        let two_groups = sub.replacen("ana_group = 1", "ana_group = 2", 1);
        let local = SHARED.replace("shared = true\n", "");
        for (text, cluster, want) in [
            (sub.replace("cluster_wide = true\n", ""), false, "pools[0].shared: needs a [cluster] section"),
            (sub.replace("cluster_wide = true\n", ""), true, "subsystems[0].namespaces[0].volume: `p/b` is on shared pool `p`: serve it from a cluster_wide subsystem"),
            (two_groups, true, "subsystems[0].namespaces[1].volume: shared pool `p` is served by nqn.2016-06.io.kvtarget:s ANA group 2 and nqn.2016-06.io.kvtarget:s ANA group 1"),
        ] {
            let e = parse(&format!("{text}\n{SHARED}"), cluster).unwrap_err();
            assert!(e.contains(want), "{e}");
            assert!(!e.contains('\n'), "one line: {e}");
        }
        let e = parse(&format!("{sub}\n{local}"), true).unwrap_err();
        assert!(
            e.contains("is a block volume on node-local pool `p`"),
            "{e}"
        );
        let ram = SHARED.replace(
            "backend = \"uring\"\npath = \"/tmp/p.img\"",
            "backend = \"ram\"",
        );
        let e = parse(&format!("{sub}\n{ram}"), true).unwrap_err();
        assert!(
            e.starts_with("pools[0].shared: a shared pool is a file every node opens"),
            "{e}"
        );
    }
}
