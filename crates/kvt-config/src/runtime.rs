//! `[reactors]`, `[rpc]`, `[metrics]` and `[spdk]`: the process around the target.

use super::size::opt_size;
use super::ConfigError;
use kvt_reactor::IdleMode;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::path::PathBuf;

/// Default JSON-RPC socket path (like SPDK's /var/tmp/spdk.sock).
pub const DEFAULT_SOCKET: &str = "/var/tmp/kvtarget.sock";
/// Reactor threads without `cores`: one per core of the largest machines
/// kvtarget runs on, and a bound on a mistyped count.
pub const REACTOR_COUNT: RangeInclusive<usize> = 1..=256;
/// SPDK's memory, in bytes and whole MiB (DPDK takes `-m` in MiB): below
/// 64 MiB SPDK's own pools do not fit.
pub const SPDK_MEM_SIZE: RangeInclusive<u64> = (64 << 20)..=(1 << 40);
/// A reactor pass longer than `stall_warn_us` is a stall. Below 100 µs a
/// 4 KiB command's own service time would count; above 60 s a stall that
/// already broke every host's keep-alive would go unlogged.
pub const STALL_WARN_US: RangeInclusive<u64> = 100..=60_000_000;

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ReactorConfig {
    /// Number of reactor threads (ignored when `cores` is given).
    pub count: usize,
    /// Cores to pin reactors to, one reactor per entry.
    pub cores: Vec<usize>,
    pub idle: IdleMode,
    /// A pass of a reactor's loop longer than this (µs) is counted as a stall
    /// and logged, at most once a second per reactor.
    pub stall_warn_us: u64,
}

impl Default for ReactorConfig {
    fn default() -> Self {
        ReactorConfig {
            count: 1,
            cores: Vec::new(),
            idle: IdleMode::Adaptive,
            stall_warn_us: kvt_reactor::stall::DEFAULT_STALL_WARN_US,
        }
    }
}

fn available_cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

impl ReactorConfig {
    /// The core each reactor is pinned to.
    pub fn cores(&self) -> Vec<Option<usize>> {
        if !self.cores.is_empty() {
            return self.cores.iter().map(|&c| Some(c)).collect();
        }
        let ncpu = available_cores();
        (0..self.count).map(|i| Some(i % ncpu)).collect()
    }

    pub(super) fn validate(&self, f: &str) -> Result<(), ConfigError> {
        if self.cores.is_empty() && !REACTOR_COUNT.contains(&self.count) {
            return Err(invalid!(
                "{f}.count",
                "must be 1..=256 (got {})",
                self.count
            ));
        }
        if !STALL_WARN_US.contains(&self.stall_warn_us) {
            return Err(invalid!(
                "{f}.stall_warn_us",
                "must be {}..={} (got {})",
                STALL_WARN_US.start(),
                STALL_WARN_US.end(),
                self.stall_warn_us
            ));
        }
        let ncpu = available_cores();
        for (i, &c) in self.cores.iter().enumerate() {
            if c >= ncpu {
                return Err(invalid!(
                    "{f}.cores[{i}]",
                    "core {c} does not exist (this machine has {ncpu})"
                ));
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// Address of the HTTP endpoint serving /metrics, e.g. "127.0.0.1:9464".
    pub address: String,
}

impl MetricsConfig {
    pub(super) fn validate(&self, f: &str) -> Result<(), ConfigError> {
        self.address.parse::<SocketAddr>().map_err(|_| {
            invalid!(
                "{f}.address",
                "`{}` is not ADDRESS:PORT (e.g. 127.0.0.1:9464)",
                self.address
            )
        })?;
        Ok(())
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RpcConfig {
    /// Unix socket path (SPDK uses /var/tmp/spdk.sock; we use /var/tmp/kvtarget.sock).
    pub socket: PathBuf,
    pub enabled: bool,
}

impl Default for RpcConfig {
    fn default() -> Self {
        RpcConfig {
            socket: PathBuf::from(DEFAULT_SOCKET),
            enabled: true,
        }
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
    pub(super) fn is_default(&self) -> bool {
        *self == SpdkConfig::default()
    }

    /// SPDK's environment settings; `pci`: whether a PCIe controller is used.
    pub(super) fn env(&self, pci: bool) -> kvt_bdev::spdk::EnvSettings {
        kvt_bdev::spdk::EnvSettings {
            no_huge: self.no_huge,
            mem_size_mib: self.mem_size.map(|b| (b >> 20) as u32),
            hugedir: self.hugedir.as_ref().map(|p| p.display().to_string()),
            pci,
        }
    }

    pub(super) fn validate(&self, f: &str) -> Result<(), ConfigError> {
        if self.no_huge && self.hugedir.is_some() {
            return Err(invalid!(
                "{f}.hugedir",
                "a hugetlbfs mount makes no sense with no_huge = true"
            ));
        }
        if let Some(m) = self.mem_size {
            if !SPDK_MEM_SIZE.contains(&m) || m % (1 << 20) != 0 {
                return Err(invalid!(
                    "{f}.mem_size",
                    "a whole number of MiB from 64MiB to 1TiB (got {m})"
                ));
            }
        }
        Ok(())
    }
}
