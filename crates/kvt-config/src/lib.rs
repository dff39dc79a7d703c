//! Configuration: one TOML file. Every error is one line that names the field.
//!
//! Each section's type lives in the submodule of its domain, with its defaults,
//! its limits (named constants) and its own `validate`; this module holds the
//! whole file's schema, parsing, and the checks that span sections (a namespace
//! naming a pool's volume, a host naming a key).

use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;

pub use kvt_wire::nqn::{validate_nqn, NqnError};

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
        $crate::ConfigError::Invalid {
            field: format!($field),
            reason: format!($($reason)+),
        }
    };
}

pub mod apply;
mod auth;
mod cluster;
mod device;
mod keypath;
pub mod ops;
mod pool;
mod runtime;
pub mod setup;
mod size;
mod subsystem;
mod transport;

pub use auth::{AuthConfig, KeyConfig};
pub use cluster::{ClusterConfig, OnUnreachable};
pub use device::{Backend, DeviceSpec};
pub use ops::{Op, OpError};
pub use pool::d_commit_interval_ms;
pub use pool::{DualPathConfig, GcConfig, PoolConfig, Unwritten, VolumeConfig, VolumeKind};
pub use runtime::{MetricsConfig, ReactorConfig, RpcConfig, SpdkConfig, DEFAULT_SOCKET};
pub use size::{parse_size, SizeError};
pub use subsystem::{
    AnaStateConfig, HostConfig, HostEntryConfig, KvOptions, NamespaceConfig, SubsystemConfig,
};
pub use transport::{DiscoveryConfig, ListenerConfig, RdmaConfig, TcpConfig, TransportKind};

/// A full-KV-namespace policy: the domain type, named in configuration files
/// as "evict" or "fail".
pub use kvt_pool::kv::OnFull;

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
    /// Membership in a cluster coordinated by etcd; absent: the node runs alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterConfig>,
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
                        message: match keypath::key_path_at(text, at) {
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
        self.reactors.cores()
    }

    /// NVMe/TCP listener addresses.
    pub fn listen_addrs(&self) -> Result<Vec<SocketAddr>, ConfigError> {
        transport::listen_addrs_of(&self.listeners, TransportKind::Tcp)
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
        transport::listen_addrs_of(&self.listeners, TransportKind::Rdma)
    }

    /// SPDK environment settings for this configuration's `spdk` devices.
    pub fn spdk_env(&self) -> kvt_bdev::spdk::EnvSettings {
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
                t.parse::<kvt_bdev::spdk::TransportId>()
                    .is_ok_and(|t| !t.is_fabrics())
            });
        self.spdk.env(pci)
    }

    /// Each section checks itself; what spans sections is checked here.
    fn validate(&self) -> Result<(), ConfigError> {
        self.reactors.validate("reactors")?;
        self.tcp.validate("tcp")?;
        if self.listeners.is_empty() {
            return Err(invalid!(
                "listeners",
                "at least one [[listeners]] entry is needed"
            ));
        }
        self.rdma.validate("rdma", &self.tcp)?;
        transport::validate_listeners(&self.listeners, &self.discovery)?;
        if let Some(m) = &self.metrics {
            m.validate("metrics")?;
        }
        self.spdk.validate("spdk")?;
        pool::validate_pools(&self.pools)?;
        auth::validate_keys(&self.keys)?;
        self.auth.validate("auth")?;
        if let Some(c) = &self.cluster {
            c.validate("cluster")?;
        }
        self.validate_subsystems()?;
        pool::validate_shared(&self.pools, &self.subsystems, self.cluster.is_some())
    }

    fn validate_subsystems(&self) -> Result<(), ConfigError> {
        let refs = subsystem::Refs {
            keys: &self.keys,
            pools: &self.pools,
            cluster: self.cluster.is_some(),
        };
        // Volumes already served by a namespace: each is served once.
        let mut served = Vec::new();
        for (i, s) in self.subsystems.iter().enumerate() {
            let f = format!("subsystems[{i}]");
            s.validate(&f, &self.subsystems[..i], &refs, &mut served)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
