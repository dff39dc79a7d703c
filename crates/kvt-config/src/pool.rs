//! `[[pools]]`: a backing device cut into extents, holding thin volumes.

use super::device::{Backend, DeviceSpec, Holder};
use super::size::{opt_size, size};
use super::ConfigError;
use kvt_pool::format::{
    min_device_size, Superblock, MAX_EXTENT_SIZE, MAX_NAME_LEN, MAX_VOLUMES, MIN_EXTENT_SIZE,
};
use serde::{Deserialize, Serialize};
use std::ops::RangeInclusive;
use std::path::PathBuf;

/// Longest pool name, in bytes. Pool names are only in the configuration and
/// in `pool/volume` references (hence no `/`); 64 keeps those readable.
pub const POOL_NAME_MAX_LEN: usize = 64;
/// Extent size of a new pool when none is given: 1 MiB.
pub const DEFAULT_EXTENT_SIZE: u64 = 1 << 20;
/// How often extent mappings are committed without a Flush, in milliseconds:
/// at least every millisecond would be a journal write per write; more than
/// a minute of first writes is too much for a crash to lose.
pub const COMMIT_INTERVAL_MS: RangeInclusive<u64> = 1..=60_000;
/// Highest low GC watermark, in percent of extents: above it GC would be
/// urgent while half the pool is still clean.
pub const GC_LOW_WATERMARK_MAX_PCT: u64 = 50;
/// Highest high GC watermark, in percent of extents: GC needs some room to
/// start before the pool is full.
pub const GC_HIGH_WATERMARK_MAX_PCT: u64 = 90;
/// Slowest GC scrub rate, in extents per second: below one GC never catches up.
pub const GC_MIN_RATE: f64 = 1.0;
/// Dual-path piece and threshold granularity, in bytes: a device operation is
/// whole 4 KiB blocks.
pub const DUAL_PATH_ALIGN: u64 = 4096;
/// Logical extents one volume may map (the pool's limit, `Pool::create_volume`).
pub const VOLUME_MAX_EXTENTS: u64 = u32::MAX as u64 / 2;

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
    /// often without a Flush ([`COMMIT_INTERVAL_MS`]): the most first writes a
    /// target crash can lose on a volume with a volatile write cache.
    #[serde(default = "d_commit_interval_ms")]
    pub commit_interval_ms: u64,
    #[serde(default)]
    pub gc: GcConfig,
    #[serde(default)]
    pub dual_path: DualPathConfig,
    #[serde(default)]
    pub volumes: Vec<VolumeConfig>,
    /// Several cluster nodes open this pool's device (one file, or a
    /// dual-ported device): a node opens it only when it wins the ANA group
    /// of the pool's namespaces, as that group's owner (docs/cluster.md).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shared: bool,
}

fn d_extent() -> u64 {
    DEFAULT_EXTENT_SIZE
}
fn d_true() -> bool {
    true
}
pub fn d_commit_interval_ms() -> u64 {
    kvt_pool::DEFAULT_COMMIT_INTERVAL.as_millis() as u64
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

fn d_bs() -> u32 {
    4096
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

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct GcConfig {
    /// Percent of extents: below this many clean extents GC is urgent.
    pub low_watermark_pct: u64,
    pub high_watermark_pct: u64,
    /// Most extents scrubbed per second when foreground I/O is quiet.
    pub max_rate: f64,
    /// Foreground commands in flight above which GC backs off.
    pub max_foreground_qd: u64,
    /// false: GC scrubs as fast as it can whatever foreground does. Only for
    /// measuring what admission control buys.
    pub admission: bool,
}

impl Default for GcConfig {
    fn default() -> Self {
        GcConfig {
            low_watermark_pct: 5,
            high_watermark_pct: 20,
            max_rate: 20_000.0,
            max_foreground_qd: 8,
            admission: true,
        }
    }
}

impl GcConfig {
    fn validate(&self, f: &str) -> Result<(), ConfigError> {
        if self.low_watermark_pct > GC_LOW_WATERMARK_MAX_PCT
            || self.high_watermark_pct > GC_HIGH_WATERMARK_MAX_PCT
            || self.low_watermark_pct > self.high_watermark_pct
        {
            return Err(invalid!(
                "{f}",
                "watermarks must satisfy low <= high, low <= {GC_LOW_WATERMARK_MAX_PCT}, high <= {GC_HIGH_WATERMARK_MAX_PCT} (got {} and {})",
                self.low_watermark_pct,
                self.high_watermark_pct
            ));
        }
        if !(self.max_rate.is_finite() && self.max_rate >= GC_MIN_RATE) {
            return Err(invalid!(
                "{f}.max_rate",
                "must be at least 1 extent per second"
            ));
        }
        Ok(())
    }
}

/// The configuration form of [`kvt_pool::DualPath`] (sizes may carry
/// units); its defaults are the domain type's.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct DualPathConfig {
    pub enabled: bool,
    /// Transfers at least this large take the bandwidth path.
    #[serde(deserialize_with = "size")]
    pub large_threshold: u64,
    /// Device operation size on the bandwidth path.
    #[serde(deserialize_with = "size")]
    pub piece: u64,
    /// Bandwidth-path operations in flight per reactor and volume.
    pub max_inflight: usize,
}

impl Default for DualPathConfig {
    fn default() -> Self {
        let d = kvt_pool::DualPath::default();
        DualPathConfig {
            enabled: d.enabled,
            large_threshold: d.large_threshold,
            piece: d.piece,
            max_inflight: d.max_inflight,
        }
    }
}

impl From<&DualPathConfig> for kvt_pool::DualPath {
    fn from(d: &DualPathConfig) -> Self {
        kvt_pool::DualPath {
            enabled: d.enabled,
            large_threshold: d.large_threshold,
            piece: d.piece,
            max_inflight: d.max_inflight,
        }
    }
}

impl DualPathConfig {
    fn validate(&self, f: &str) -> Result<(), ConfigError> {
        if self.piece < DUAL_PATH_ALIGN
            || self.piece % DUAL_PATH_ALIGN != 0
            || self.large_threshold < DUAL_PATH_ALIGN
            || self.max_inflight == 0
        {
            return Err(invalid!(
                "{f}",
                "piece and large_threshold must be multiples of 4KiB, max_inflight at least 1"
            ));
        }
        Ok(())
    }
}

/// Each pool in order; `f` paths are `pools[i]`.
pub(super) fn validate_pools(pools: &[PoolConfig]) -> Result<(), ConfigError> {
    for (i, p) in pools.iter().enumerate() {
        p.validate(&format!("pools[{i}]"), &pools[..i])?;
    }
    Ok(())
}

/// Checks that `pool/volume` names a configured volume; the reason if not.
pub(super) fn find_volume(pools: &[PoolConfig], v: &str) -> Result<(), String> {
    let Some((pool, vol)) = v.split_once('/') else {
        return Err(format!("`{v}` is not \"pool/volume\""));
    };
    let Some(p) = pools.iter().find(|p| p.name == pool) else {
        return Err(format!("no pool named `{pool}` in [[pools]]"));
    };
    if !p.volumes.iter().any(|x| x.name == vol) {
        return Err(format!(
            "pool `{pool}` lists no volume `{vol}` in [[pools.volumes]]"
        ));
    }
    Ok(())
}

/// Checks that volume `v` (found by `find_volume`) may back a namespace of a
/// cluster-wide subsystem; the reason if not. Every pool is node-local (each
/// node its own device), so a block volume is refused: a failover would move
/// the host to another node's empty volume, and a filesystem cannot continue
/// on an empty disk. A KV volume is taken over cold (docs/cluster.md).
pub(super) fn cluster_wide_volume(pools: &[PoolConfig], v: &str) -> Result<(), String> {
    let (pool, vol) = v.split_once('/').unwrap_or((v, ""));
    let found = pools.iter().find(|p| p.name == pool);
    let kind = (found.filter(|p| !p.shared))
        .and_then(|p| p.volumes.iter().find(|x| x.name == vol))
        .map(|x| x.kind);
    if kind == Some(VolumeKind::Block) {
        return Err(format!(
            "`{v}` is a block volume on node-local pool `{pool}`: a cluster-wide subsystem cannot fail it over (another node's volume is empty, and a filesystem cannot continue on an empty disk); serve it from a subsystem without cluster_wide"
        ));
    }
    Ok(())
}

/// Checks the `shared` pools against the cluster and the subsystems that
/// serve their volumes: one pool has one writer, so every namespace on it is
/// in one cluster-wide subsystem and one ANA group.
pub(super) fn validate_shared(
    pools: &[PoolConfig],
    subsystems: &[super::SubsystemConfig],
    cluster: bool,
) -> Result<(), ConfigError> {
    for (i, p) in pools.iter().enumerate().filter(|(_, p)| p.shared) {
        if !cluster {
            return Err(invalid!("pools[{i}].shared", "needs a [cluster] section"));
        }
        let mut owner: Option<(&str, u32)> = None;
        for (k, s) in subsystems.iter().enumerate() {
            for (j, n) in s.namespaces.iter().enumerate() {
                let on_pool = (n.volume.as_deref()).and_then(|v| v.split_once('/'));
                if on_pool.map(|(pool, _)| pool) != Some(p.name.as_str()) {
                    continue;
                }
                let f = format!("subsystems[{k}].namespaces[{j}].volume");
                if !s.cluster_wide {
                    return Err(invalid!(
                        "{f}",
                        "`{}` is on shared pool `{}`: serve it from a cluster_wide subsystem",
                        n.volume.as_deref().unwrap_or_default(),
                        p.name
                    ));
                }
                let here = (s.nqn.as_str(), n.ana_group.unwrap_or(n.nsid));
                match owner {
                    None => owner = Some(here),
                    Some(o) if o == here => {}
                    Some((nqn, g)) => {
                        return Err(invalid!(
                            "{f}",
                            "shared pool `{}` is served by {} ANA group {} and {} ANA group {}: a shared pool has one writer, so its namespaces are in one subsystem and one ANA group",
                            p.name, nqn, g, here.0, here.1
                        ))
                    }
                }
            }
        }
    }
    Ok(())
}

impl PoolConfig {
    /// The device this pool sits on.
    pub fn device(&self) -> DeviceSpec<'_> {
        DeviceSpec {
            backend: self.backend,
            path: self.path.as_deref(),
            pci: self.pci.as_deref(),
            nvme_nsid: self.nvme_nsid,
            trid: self.trid.as_deref(),
            size: self.size,
        }
    }

    /// `earlier`: the pools before this one, which it must not repeat.
    fn validate(&self, f: &str, earlier: &[PoolConfig]) -> Result<(), ConfigError> {
        if self.name.is_empty() || self.name.contains('/') || self.name.len() > POOL_NAME_MAX_LEN {
            return Err(invalid!(
                "{f}.name",
                "1 to {POOL_NAME_MAX_LEN} characters without `/` (got `{}`)",
                self.name
            ));
        }
        if earlier.iter().any(|o| o.name == self.name) {
            return Err(invalid!("{f}.name", "`{}` is defined twice", self.name));
        }
        if !COMMIT_INTERVAL_MS.contains(&self.commit_interval_ms) {
            return Err(invalid!(
                "{f}.commit_interval_ms",
                "1 to 60000 milliseconds (got {})",
                self.commit_interval_ms
            ));
        }
        self.validate_layout(f)?;
        if self.volumes.len() > MAX_VOLUMES {
            return Err(invalid!(
                "{f}.volumes",
                "a pool holds at most {MAX_VOLUMES} volumes (got {})",
                self.volumes.len()
            ));
        }
        self.device().validate(f, Holder::Pool)?;
        if self.shared && self.backend != Backend::Uring {
            return Err(invalid!(
                "{f}.shared",
                "a shared pool is a file every node opens: backend = \"uring\" (got {})",
                self.backend.name()
            ));
        }
        self.validate_unique_device(f, earlier)?;
        self.gc.validate(&format!("{f}.gc"))?;
        self.dual_path.validate(&format!("{f}.dual_path"))?;
        for (j, v) in self.volumes.iter().enumerate() {
            let f = format!("{f}.volumes[{j}]");
            v.validate(&f, &self.volumes[..j], self.extent_size)?;
        }
        Ok(())
    }

    /// Extent size and device size against the pool's on-device layout.
    fn validate_layout(&self, f: &str) -> Result<(), ConfigError> {
        let extent = self.extent_size;
        if !extent.is_power_of_two() || !(MIN_EXTENT_SIZE..=MAX_EXTENT_SIZE).contains(&extent) {
            return Err(invalid!(
                "{f}.extent_size",
                "must be a power of two from 64KiB to 64MiB (got {extent})"
            ));
        }
        let Some(size) = self.size else {
            return Ok(());
        };
        // The pool's own layout decides what fits: the format code, not a
        // number here, knows how much metadata a pool of this size needs.
        let min = min_device_size(extent).map_err(|e| invalid!("{f}.extent_size", "{e}"))?;
        if size < min {
            // Blame the extent size when smaller extents would fit.
            let smallest =
                min_device_size(MIN_EXTENT_SIZE).map_err(|e| invalid!("{f}.extent_size", "{e}"))?;
            if size >= smallest {
                return Err(invalid!(
                    "{f}.extent_size",
                    "{extent} byte extents need a pool of at least {min} bytes (size is {size})"
                ));
            }
            return Err(invalid!(
                "{f}.size",
                "{size} bytes cannot hold a pool with {extent} byte extents: superblock, checkpoints, journal and one extent need at least {min} bytes ({} MiB)",
                min.div_ceil(1 << 20)
            ));
        }
        Superblock::layout(size, extent, [0; 16], None).map_err(|e| invalid!("{f}.size", "{e}"))?;
        Ok(())
    }

    /// Two pools never share a device.
    fn validate_unique_device(&self, f: &str, earlier: &[PoolConfig]) -> Result<(), ConfigError> {
        let dev = self.device();
        if self.backend == Backend::Spdk {
            if let Some(other) = earlier
                .iter()
                .find(|o| o.backend == Backend::Spdk && o.device().spdk_key() == dev.spdk_key())
            {
                return Err(invalid!(
                    "{f}.trid",
                    "also the namespace of pool `{}`",
                    other.name
                ));
            }
        }
        if self.backend == Backend::Nvme {
            if let Some(other) = earlier.iter().find(|o| {
                o.backend == Backend::Nvme && o.pci == self.pci && o.device().nsid() == dev.nsid()
            }) {
                return Err(invalid!(
                    "{f}.pci",
                    "also the namespace of pool `{}`",
                    other.name
                ));
            }
        }
        if let Some(other) = earlier
            .iter()
            .find(|o| o.path.is_some() && o.path == self.path)
        {
            return Err(invalid!(
                "{f}.path",
                "also the path of pool `{}`",
                other.name
            ));
        }
        Ok(())
    }
}

impl VolumeConfig {
    /// `earlier`: the pool's volumes before this one.
    fn validate(&self, f: &str, earlier: &[VolumeConfig], extent: u64) -> Result<(), ConfigError> {
        if self.name.is_empty() || self.name.len() > MAX_NAME_LEN || self.name.contains('/') {
            return Err(invalid!(
                "{f}.name",
                "1 to {MAX_NAME_LEN} bytes without `/` (got `{}`)",
                self.name
            ));
        }
        if earlier.iter().any(|o| o.name == self.name) {
            return Err(invalid!("{f}.name", "`{}` is defined twice", self.name));
        }
        if !matches!(self.block_size, 512 | 4096) {
            return Err(invalid!(
                "{f}.block_size",
                "must be 512 or 4096 (got {})",
                self.block_size
            ));
        }
        if self.size.div_ceil(extent) > VOLUME_MAX_EXTENTS {
            return Err(invalid!(
                "{f}.size",
                "{} is too large for {extent} byte extents",
                self.size
            ));
        }
        if self.size == 0 || self.size % self.block_size as u64 != 0 {
            return Err(invalid!(
                "{f}.size",
                "must be a non-zero multiple of block_size {} (got {})",
                self.block_size,
                self.size
            ));
        }
        Ok(())
    }
}
