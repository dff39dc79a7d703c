//! The configuration as a list of typed operations, SPDK's model of a
//! configuration (`lib/init/json_config.c`: a list of RPC calls): each
//! [`Op`] is one state-changing call with its parameters, named as the RPC
//! method and parameters are (`nvmf_create_subsystem` takes `nqn`,
//! `serial_number`, ...; kvtarget-only calls are `kvtarget_*`).
//!
//! [`Config::ops`] turns a loaded configuration into the list, and
//! [`Config::apply`] makes each change on a configuration, so a configuration
//! and its operations convert into each other both ways (a property test
//! checks it). The sections that set the process up (reactors, transports,
//! listeners, RPC, metrics, SPDK, auth) are not operations: they are what the
//! operations run on.

use super::{AnaStateConfig, SubsystemConfig, VolumeConfig};
use super::{Config, HostConfig, HostEntryConfig, KeyConfig, NamespaceConfig, PoolConfig};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

/// One state-changing operation. As JSON: `{"method": ..., "params": {...}}`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(tag = "method", content = "params", deny_unknown_fields)]
pub enum Op {
    /// A named key file.
    #[serde(rename = "keyring_file_add_key")]
    AddKey(KeyConfig),
    /// A pool, without its volumes (`volumes` is empty: each volume is a
    /// `CreateVolume` of its own).
    #[serde(rename = "kvtarget_create_pool")]
    CreatePool(PoolConfig),
    #[serde(rename = "kvtarget_create_volume")]
    CreateVolume(CreateVolume),
    #[serde(rename = "nvmf_create_subsystem")]
    CreateSubsystem(CreateSubsystem),
    #[serde(rename = "nvmf_subsystem_add_host")]
    AddHost(AddHost),
    #[serde(rename = "nvmf_subsystem_add_listener")]
    AddListener(AddListener),
    #[serde(rename = "nvmf_subsystem_add_ns")]
    AddNamespace(AddNamespace),
    #[serde(rename = "nvmf_subsystem_listener_set_ana_state")]
    SetAnaState(SetAnaState),
}

/// `nvmf_subsystem_listener_set_ana_state`'s parameters.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SetAnaState {
    pub nqn: String,
    pub listen_address: ListenAddress,
    pub ana_state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anagrpid: Option<u32>,
}

/// A volume in pool `lvs_name` (SPDK's name for the lvol store a volume is in).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CreateVolume {
    pub lvs_name: String,
    pub volume: VolumeConfig,
}

/// `nvmf_create_subsystem`'s parameters, and `any_listener` (not an RPC
/// parameter: a configured subsystem without a `listen` list is reachable on
/// every listener; one created over RPC, as in SPDK, only on those added).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CreateSubsystem {
    pub nqn: String,
    #[serde(default = "super::subsystem::d_serial")]
    pub serial_number: String,
    #[serde(default = "super::subsystem::d_model")]
    pub model_number: String,
    #[serde(default)]
    pub allow_any_host: bool,
    #[serde(default)]
    pub any_listener: bool,
    /// kvtarget's own: see `SubsystemConfig::nvm_identify_for_kv`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub nvm_identify_for_kv: bool,
    #[serde(default, skip_serializing_if = "super::subsystem::is_false")]
    pub ana_reporting: bool,
    /// kvtarget's own, from config only: see `SubsystemConfig::cluster_wide`
    /// (its ANA groups are elected at start, so RPC cannot set it).
    #[serde(default, skip_serializing_if = "super::subsystem::is_false")]
    pub cluster_wide: bool,
}

/// `nvmf_subsystem_add_host`'s parameters.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AddHost {
    pub nqn: String,
    pub host: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhchap_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhchap_ctrlr_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub psk: Option<String>,
}

/// `nvmf_subsystem_add_listener`'s parameters.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AddListener {
    pub nqn: String,
    pub listen_address: ListenAddress,
}

/// SPDK's listen address object (TCP: kvtarget's subsystem `listen` entries).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ListenAddress {
    pub trtype: String,
    pub adrfam: String,
    pub traddr: String,
    pub trsvcid: String,
}

impl ListenAddress {
    pub fn tcp(a: SocketAddr) -> ListenAddress {
        ListenAddress {
            trtype: "TCP".into(),
            adrfam: if a.is_ipv4() { "IPv4" } else { "IPv6" }.into(),
            traddr: a.ip().to_string(),
            trsvcid: a.port().to_string(),
        }
    }

    pub fn socket_addr(&self) -> Option<SocketAddr> {
        let ip = self.traddr.parse().ok()?;
        Some(SocketAddr::new(ip, self.trsvcid.parse().ok()?))
    }
}

/// `nvmf_subsystem_add_ns`'s parameters: the subsystem and the namespace.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AddNamespace {
    pub nqn: String,
    pub namespace: NamespaceConfig,
}

/// Why an operation cannot be made: what it names does not exist.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpError {
    #[error("no pool `{0}`")]
    NoPool(String),
    #[error("no subsystem `{0}`")]
    NoSubsystem(String),
    #[error("`{0}` is not a TCP address")]
    Address(String),
}

impl Config {
    /// The operations that build this configuration's state, in an order that
    /// creates everything before it is named: keys, pools and their volumes,
    /// then each subsystem with its hosts, listeners and namespaces.
    pub fn ops(&self) -> Vec<Op> {
        self.ops_with_fields()
            .into_iter()
            .map(|(_, op)| op)
            .collect()
    }

    /// [`Config::ops`], each with the path of the entry it comes from
    /// (`pools[0].volumes[1]`), for errors that name it.
    pub fn ops_with_fields(&self) -> Vec<(String, Op)> {
        let mut ops: Vec<(String, Op)> = (self.keys.iter().enumerate())
            .map(|(i, k)| (format!("keys[{i}]"), Op::AddKey(k.clone())))
            .collect();
        for (i, p) in self.pools.iter().enumerate() {
            let f = format!("pools[{i}]");
            let pool = PoolConfig {
                volumes: Vec::new(),
                ..p.clone()
            };
            ops.push((f.clone(), Op::CreatePool(pool)));
            ops.extend(p.volumes.iter().enumerate().map(|(j, v)| {
                let op = Op::CreateVolume(CreateVolume {
                    lvs_name: p.name.clone(),
                    volume: v.clone(),
                });
                (format!("{f}.volumes[{j}]"), op)
            }));
        }
        for (i, s) in self.subsystems.iter().enumerate() {
            ops.extend(subsystem_ops(&format!("subsystems[{i}]"), s));
        }
        ops
    }

    /// This configuration without state: what operations run on.
    pub fn without_state(&self) -> Config {
        Config {
            pools: Vec::new(),
            subsystems: Vec::new(),
            keys: Vec::new(),
            ..self.clone()
        }
    }

    /// Makes one change. Nothing changes when the operation is refused.
    pub fn apply(&mut self, op: &Op) -> Result<(), OpError> {
        match op {
            Op::AddKey(k) => self.keys.push(k.clone()),
            Op::CreatePool(p) => self.pools.push(p.clone()),
            Op::CreateVolume(v) => self.pool_mut(&v.lvs_name)?.volumes.push(v.volume.clone()),
            Op::CreateSubsystem(s) => self.subsystems.push(SubsystemConfig {
                nqn: s.nqn.clone(),
                serial: s.serial_number.clone(),
                model: s.model_number.clone(),
                allow_any_host: s.allow_any_host,
                nvm_identify_for_kv: s.nvm_identify_for_kv,
                ana_reporting: s.ana_reporting,
                cluster_wide: s.cluster_wide,
                hosts: Vec::new(),
                listen: (!s.any_listener).then(Vec::new),
                ana_states: Vec::new(),
                namespaces: Vec::new(),
            }),
            Op::AddHost(h) => self.subsystem_mut(&h.nqn)?.hosts.push(host_config(h)),
            Op::AddListener(l) => {
                let a = l
                    .listen_address
                    .socket_addr()
                    .ok_or_else(|| OpError::Address(format!("{:?}", l.listen_address)))?;
                let s = self.subsystem_mut(&l.nqn)?;
                s.listen.get_or_insert_with(Vec::new).push(a.to_string());
            }
            Op::AddNamespace(n) => {
                let s = self.subsystem_mut(&n.nqn)?;
                s.namespaces.push(n.namespace.clone());
            }
            Op::SetAnaState(a) => {
                let addr = a
                    .listen_address
                    .socket_addr()
                    .ok_or_else(|| OpError::Address(format!("{:?}", a.listen_address)))?;
                let s = self.subsystem_mut(&a.nqn)?;
                s.ana_states.push(AnaStateConfig {
                    listen: addr.to_string(),
                    ana_group: a.anagrpid,
                    state: a.ana_state.clone(),
                });
            }
        }
        Ok(())
    }

    /// This configuration's environment with `ops` applied in order.
    pub fn with_ops(&self, ops: &[Op]) -> Result<Config, OpError> {
        let mut c = self.without_state();
        for op in ops {
            c.apply(op)?;
        }
        Ok(c)
    }

    fn pool_mut(&mut self, name: &str) -> Result<&mut PoolConfig, OpError> {
        self.pools
            .iter_mut()
            .find(|p| p.name == name)
            .ok_or_else(|| OpError::NoPool(name.into()))
    }

    fn subsystem_mut(&mut self, nqn: &str) -> Result<&mut SubsystemConfig, OpError> {
        self.subsystems
            .iter_mut()
            .find(|s| s.nqn == nqn)
            .ok_or_else(|| OpError::NoSubsystem(nqn.into()))
    }
}

/// A subsystem's creation, then its hosts, listeners and namespaces; `f` is
/// the subsystem's path.
fn subsystem_ops(f: &str, s: &SubsystemConfig) -> Vec<(String, Op)> {
    let nqn = || s.nqn.clone();
    let create = Op::CreateSubsystem(CreateSubsystem {
        nqn: nqn(),
        serial_number: s.serial.clone(),
        model_number: s.model.clone(),
        allow_any_host: s.allow_any_host,
        any_listener: s.listen.is_none(),
        nvm_identify_for_kv: s.nvm_identify_for_kv,
        ana_reporting: s.ana_reporting,
        cluster_wide: s.cluster_wide,
    });
    let mut ops = vec![(f.to_string(), create)];
    ops.extend(s.hosts.iter().enumerate().map(|(j, h)| {
        let op = Op::AddHost(AddHost {
            nqn: nqn(),
            host: h.nqn().into(),
            dhchap_key: h.dhchap_key().map(Into::into),
            dhchap_ctrlr_key: h.dhchap_ctrlr_key().map(Into::into),
            psk: h.psk().map(Into::into),
        });
        (format!("{f}.hosts[{j}]"), op)
    }));
    // Validated entries parse; an unparsable one (unvalidated) is left out.
    let addrs = s.listen.iter().flatten().enumerate();
    ops.extend(addrs.filter_map(|(j, a)| {
        let op = Op::AddListener(AddListener {
            nqn: nqn(),
            listen_address: ListenAddress::tcp(a.parse().ok()?),
        });
        Some((format!("{f}.listen[{j}]"), op))
    }));
    ops.extend(s.namespaces.iter().enumerate().map(|(j, n)| {
        let op = Op::AddNamespace(AddNamespace {
            nqn: nqn(),
            namespace: n.clone(),
        });
        (format!("{f}.namespaces[{j}]"), op)
    }));
    // After the namespaces: a state names a listener and a group.
    ops.extend(s.ana_states.iter().enumerate().filter_map(|(k, a)| {
        let op = Op::SetAnaState(SetAnaState {
            nqn: nqn(),
            listen_address: ListenAddress::tcp(a.listen.parse().ok()?),
            ana_state: a.state.clone(),
            anagrpid: a.ana_group,
        });
        Some((format!("{f}.ana_states[{k}]"), op))
    }));
    ops
}

/// The plain NQN form for a host without keys, the table form otherwise.
fn host_config(h: &AddHost) -> HostConfig {
    if h.dhchap_key.is_none() && h.dhchap_ctrlr_key.is_none() && h.psk.is_none() {
        return HostConfig::Nqn(h.host.clone());
    }
    HostConfig::Entry(HostEntryConfig {
        nqn: h.host.clone(),
        dhchap_key: h.dhchap_key.clone(),
        dhchap_ctrlr_key: h.dhchap_ctrlr_key.clone(),
        psk: h.psk.clone(),
    })
}
