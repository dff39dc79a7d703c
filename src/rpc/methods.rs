//! RPC methods. Names and parameters follow SPDK (`nvmf_*`, `bdev_*`,
//! `bdev_lvol_*`, `framework_*`, `spdk_get_version`, `rpc_get_methods`);
//! kvtarget-only operations are `kvtarget_*`.
//!
//! Bdevs are pool volumes, named "pool/volume" (SPDK's lvol alias form, with the
//! pool as the lvol store). Parameters SPDK's client sends with default values
//! for features kvtarget lacks (ANA, passthrough, ...) are accepted when off and
//! refused with a clear message when on; unknown parameters are refused.

use super::{code, RpcError, RpcResult};
use crate::nvmf::{Namespace, Subsystem, SubsystemKind, Target};
use crate::pool::channel::VolumeDevice;
use crate::pool::format::VOL_UNWRITTEN_ERROR;
use crate::pool::Pool;
use crate::reactor::ReactorShared;
use serde_json::{json, Map, Value};
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// What RPC methods act on.
pub struct Control {
    pub target: Arc<Target>,
    pools: std::sync::RwLock<Vec<Arc<Pool>>>,
    /// Pools created over RPC: their configuration (for save) and lock.
    runtime_pools: Mutex<Vec<(crate::config::PoolConfig, crate::pool::PoolLock)>>,
    pub reactors: Vec<Arc<ReactorShared>>,
    pub listeners: Arc<crate::transport::ListenerSet>,
    /// The NVMe/RDMA transport (started by configuration or nvmf_create_transport).
    pub rdma: Arc<crate::transport::rdma::RdmaTransport>,
    /// The configuration the target started from (for `kvtarget_save_config`).
    pub config: crate::config::Config,
    /// Serialises changes so two clients cannot interleave half-done edits.
    edit: Mutex<()>,
}

pub const METHODS: &[&str] = &[
    "spdk_get_version",
    "rpc_get_methods",
    "framework_get_reactors",
    "nvmf_create_transport",
    "nvmf_get_transports",
    "nvmf_create_subsystem",
    "nvmf_delete_subsystem",
    "nvmf_get_subsystems",
    "nvmf_subsystem_add_listener",
    "nvmf_subsystem_remove_listener",
    "nvmf_subsystem_add_ns",
    "nvmf_subsystem_remove_ns",
    "nvmf_subsystem_add_host",
    "nvmf_subsystem_remove_host",
    "nvmf_subsystem_allow_any_host",
    "nvmf_subsystem_get_controllers",
    "nvmf_subsystem_get_qpairs",
    "nvmf_get_stats",
    "bdev_get_bdevs",
    "bdev_get_iostat",
    "bdev_lvol_create_lvstore",
    "bdev_lvol_get_lvstores",
    "bdev_lvol_create",
    "bdev_lvol_delete",
    "bdev_lvol_resize",
    "kvtarget_get_pools",
    "kvtarget_pool_set_gc",
    "kvtarget_save_config",
    "kvtarget_pool_check",
];

/// Typed access to a params object; remembers which keys were read so unknown
/// ones can be refused.
struct Params {
    map: Map<String, Value>,
    seen: BTreeSet<String>,
}

impl Params {
    fn new(v: Value) -> Result<Params, RpcError> {
        match v {
            Value::Object(map) => Ok(Params {
                map,
                seen: BTreeSet::new(),
            }),
            _ => Err(RpcError::params("params must be an object")),
        }
    }
    fn get(&mut self, k: &str) -> Option<&Value> {
        self.seen.insert(k.to_string());
        self.map.get(k).filter(|v| !v.is_null())
    }
    fn opt_str(&mut self, k: &str) -> Result<Option<String>, RpcError> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(RpcError::params(format!("{k}: must be a string"))),
        }
    }
    fn str(&mut self, k: &str) -> Result<String, RpcError> {
        self.opt_str(k)?
            .ok_or_else(|| RpcError::params(format!("{k}: required")))
    }
    fn opt_u64(&mut self, k: &str) -> Result<Option<u64>, RpcError> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| RpcError::params(format!("{k}: must be a non-negative integer"))),
        }
    }
    fn opt_bool(&mut self, k: &str) -> Result<Option<bool>, RpcError> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(RpcError::params(format!("{k}: must be true or false"))),
        }
    }
    fn object(&mut self, k: &str) -> Result<Params, RpcError> {
        match self.get(k) {
            Some(v @ Value::Object(_)) => Params::new(v.clone()),
            Some(_) => Err(RpcError::params(format!("{k}: must be an object"))),
            None => Err(RpcError::params(format!("{k}: required"))),
        }
    }
    /// SPDK options kvtarget does not implement: fine when off or absent.
    fn unsupported_flags(&mut self, keys: &[&str]) -> Result<(), RpcError> {
        for k in keys {
            match self.get(k) {
                None | Some(Value::Bool(false)) => {}
                Some(Value::String(s)) if s.is_empty() => {}
                Some(_) => return Err(RpcError::params(format!("{k}: not supported by kvtarget"))),
            }
        }
        Ok(())
    }
    /// SPDK tuning options that have no effect here; accepted and ignored.
    fn ignore(&mut self, keys: &[&str]) {
        for k in keys {
            self.seen.insert(k.to_string());
        }
    }
    fn finish(self) -> Result<(), RpcError> {
        match self.map.keys().find(|k| !self.seen.contains(*k)) {
            Some(k) => Err(RpcError::params(format!("unknown parameter `{k}`"))),
            None => Ok(()),
        }
    }
}

fn hex_id(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn uuid_str(u: &[u8; 16]) -> String {
    let h = hex_id(u);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn not_found(what: impl Into<String>) -> RpcError {
    RpcError::new(code::ENOENT, what)
}

impl Control {
    pub fn new(
        target: Arc<Target>,
        pools: Vec<Arc<Pool>>,
        reactors: Vec<Arc<ReactorShared>>,
        listeners: Arc<crate::transport::ListenerSet>,
        rdma: Arc<crate::transport::rdma::RdmaTransport>,
        config: crate::config::Config,
    ) -> Control {
        Control {
            target,
            pools: std::sync::RwLock::new(pools),
            runtime_pools: Mutex::new(Vec::new()),
            reactors,
            listeners,
            rdma,
            config,
            edit: Mutex::new(()),
        }
    }

    /// Drops the locks of pools created over RPC (target shutdown, after the
    /// pools are closed): RPC client threads may hold this context a moment
    /// longer, and the next start must be able to take the pools at once.
    pub fn release_runtime_pools(&self) {
        if let Ok(mut r) = self.runtime_pools.lock() {
            r.clear();
        }
    }

    /// Every open pool (from the configuration and created over RPC).
    pub fn pools(&self) -> Vec<Arc<Pool>> {
        self.pools.read().map(|p| p.clone()).unwrap_or_default()
    }

    pub fn call(&self, method: &str, params: Value) -> RpcResult {
        let mut p = Params::new(params)?;
        let _guard = self.edit.lock().unwrap_or_else(|e| e.into_inner());
        let r = match method {
            "spdk_get_version" => self.version(&mut p),
            "rpc_get_methods" => {
                p.opt_bool("current")?;
                p.opt_bool("include_aliases")?;
                Ok(json!(METHODS))
            }
            "framework_get_reactors" => self.reactors(&mut p),
            "nvmf_create_transport" => self.create_transport(&mut p),
            "nvmf_get_transports" => self.get_transports(&mut p),
            "nvmf_create_subsystem" => self.create_subsystem(&mut p),
            "nvmf_delete_subsystem" => self.delete_subsystem(&mut p),
            "nvmf_get_subsystems" => self.get_subsystems(&mut p),
            "nvmf_subsystem_add_listener" => self.add_listener(&mut p),
            "nvmf_subsystem_remove_listener" => self.remove_listener(&mut p),
            "nvmf_subsystem_add_ns" => self.add_ns(&mut p),
            "nvmf_subsystem_remove_ns" => self.remove_ns(&mut p),
            "nvmf_subsystem_add_host" => self.add_host(&mut p),
            "nvmf_subsystem_remove_host" => self.remove_host(&mut p),
            "nvmf_subsystem_allow_any_host" => self.allow_any_host(&mut p),
            "nvmf_subsystem_get_controllers" => self.get_controllers(&mut p),
            "nvmf_subsystem_get_qpairs" => self.get_qpairs(&mut p),
            "nvmf_get_stats" => self.get_stats(&mut p),
            "bdev_get_bdevs" => self.get_bdevs(&mut p),
            "bdev_get_iostat" => self.get_iostat(&mut p),
            "bdev_lvol_get_lvstores" => self.get_lvstores(&mut p),
            "bdev_lvol_create_lvstore" => self.create_lvstore(&mut p),
            "bdev_lvol_create" => self.lvol_create(&mut p),
            "bdev_lvol_delete" => self.lvol_delete(&mut p),
            "bdev_lvol_resize" => self.lvol_resize(&mut p),
            "kvtarget_get_pools" => self.get_pools(&mut p),
            "kvtarget_pool_set_gc" => self.pool_set_gc(&mut p),
            "kvtarget_save_config" => self.save_config(&mut p),
            "kvtarget_pool_check" => self.pool_check(&mut p),
            _ => {
                return Err(RpcError::new(
                    code::METHOD_NOT_FOUND,
                    format!("Method not found: {method}"),
                ))
            }
        }?;
        p.finish()?;
        Ok(r)
    }

    fn version(&self, p: &mut Params) -> RpcResult {
        p.ignore(&[]);
        let v = env!("CARGO_PKG_VERSION");
        let mut it = v.split('.').map(|x| x.parse::<u64>().unwrap_or(0));
        Ok(json!({
            "version": format!("kvtarget {v} (SPDK-compatible RPC)"),
            "fields": {
                "major": it.next().unwrap_or(0),
                "minor": it.next().unwrap_or(0),
                "patch": it.next().unwrap_or(0),
                "suffix": format!("-kvtarget {}", self.target.firmware),
            }
        }))
    }

    fn reactors(&self, _p: &mut Params) -> RpcResult {
        let rs: Vec<Value> = self
            .reactors
            .iter()
            .map(|r| {
                json!({
                    "lcore": r.id,
                    "busy": r.busy_ns.load(Ordering::Relaxed),
                    "idle": r.idle_ns.load(Ordering::Relaxed),
                    "in_interrupt": false,
                    "irq_count": 0,
                    "sys_count": 0,
                    "queue_pairs": r.queue_pairs.load(Ordering::Relaxed),
                    "lw_threads": [],
                })
            })
            .collect();
        // busy/idle are in nanoseconds: one tick is one nanosecond.
        Ok(json!({"tick_rate": 1_000_000_000u64, "pid": std::process::id(), "reactors": rs}))
    }

    /// Adds a listener the RPC just opened to the target's list (discovery log
    /// entries, port IDs).
    fn announce_listener(&self, addr: std::net::SocketAddr, discovery_only: bool, rdma: bool) {
        if let Ok(mut l) = self.target.listeners.write() {
            let portid = l.iter().map(|x| x.portid).max().unwrap_or(0) + 1;
            l.push(crate::nvmf::Listener {
                addr,
                discovery_only,
                portid,
                rdma,
            });
        }
        let transport = if rdma { "rdma" } else { "tcp" };
        tracing::info!(listener = %addr, transport, "rpc: listening");
    }

    fn transport_json(&self) -> Value {
        let l = &self.target.limits;
        json!({
            "trtype": "TCP",
            "max_queue_depth": l.max_queue_depth,
            "max_io_qpairs_per_ctrlr": l.max_io_queues,
            "in_capsule_data_size": l.in_capsule_data,
            "max_io_size": l.max_io_size,
            "io_unit_size": l.max_h2c_data,
            "max_aq_depth": l.max_admin_queue_depth,
            "c2h_success": l.c2h_success,
            "sock_priority": 0,
            "abort_timeout_sec": 1,
        })
    }

    fn create_transport(&self, p: &mut Params) -> RpcResult {
        let trtype = p.str("trtype")?;
        p.opt_str("tgt_name")?;
        // The TCP transport exists from the configuration ([tcp]); scripts
        // written for SPDK create it first, so that succeeds. Its limits are
        // set in the configuration, not here.
        p.ignore(&[
            "max_queue_depth",
            "max_qpairs_per_ctrlr",
            "max_io_qpairs_per_ctrlr",
            "in_capsule_data_size",
            "max_io_size",
            "io_unit_size",
            "max_aq_depth",
            "num_shared_buffers",
            "buf_cache_size",
            "iobuf_small_cache_size",
            "iobuf_large_cache_size",
            "num_cqe",
            "max_srq_depth",
            "no_srq",
            "c2h_success",
            "dif_insert_or_strip",
            "sock_priority",
            "acceptor_backlog",
            "abort_timeout_sec",
            "no_wr_batching",
            "control_msg_num",
            "disable_command_passthru",
            "kas",
            "min_kato",
            "zcopy",
            "ack_timeout",
            "data_wr_pool_size",
            "disable_adaptive_irq",
            "disable_mappable_bar0",
            "disable_shadow_doorbells",
            "transport_specific",
            "masked_oncs",
            "masked_fuses",
        ]);
        match trtype.to_ascii_uppercase().as_str() {
            "TCP" => Ok(Value::Bool(true)),
            // Loads rdma-core and starts the RDMA CM thread; sizing comes from
            // the configuration's [rdma] and [tcp] sections.
            "RDMA" => self
                .rdma
                .start()
                .map(|()| Value::Bool(true))
                .map_err(|e| RpcError::new(code::INTERNAL_ERROR, e)),
            other => Err(RpcError::params(format!(
                "trtype {other}: unknown transport"
            ))),
        }
    }

    fn get_transports(&self, p: &mut Params) -> RpcResult {
        p.opt_str("tgt_name")?;
        let mut all = vec![self.transport_json()];
        if self.rdma.is_started() {
            let mut r = self.transport_json();
            r["trtype"] = json!("RDMA");
            r["io_unit_size"] = json!(self.target.limits.max_io_size);
            r["num_shared_buffers"] = json!(self.rdma.settings.buffer_pool_bytes / 4096);
            r["max_outstanding_reads"] = json!(self.rdma.settings.max_outstanding_reads);
            if let Some(o) = r.as_object_mut() {
                o.remove("c2h_success");
                o.remove("sock_priority");
            }
            all.push(r);
        }
        match p.opt_str("trtype")? {
            Some(t) => {
                let t = t.to_ascii_uppercase();
                let v: Vec<Value> = all.into_iter().filter(|x| x["trtype"] == t).collect();
                if v.is_empty() {
                    Err(not_found(format!("transport {t} does not exist")))
                } else {
                    Ok(json!(v))
                }
            }
            None => Ok(json!(all)),
        }
    }

    fn subsystem(&self, nqn: &str) -> Result<Arc<Subsystem>, RpcError> {
        self.target
            .find_subsystem(nqn)
            .ok_or_else(|| not_found(format!("subsystem {nqn} does not exist")))
    }

    fn nvm_subsystem(&self, nqn: &str) -> Result<Arc<Subsystem>, RpcError> {
        let s = self.subsystem(nqn)?;
        if s.kind == SubsystemKind::Discovery {
            return Err(RpcError::params(
                "the discovery subsystem has no namespaces or hosts",
            ));
        }
        Ok(s)
    }

    fn subsystem_json(&self, s: &Subsystem) -> Value {
        let listeners = self
            .target
            .listeners
            .read()
            .map(|l| l.clone())
            .unwrap_or_default();
        let listen: Vec<Value> = listeners
            .iter()
            .filter(|l| {
                if s.kind == SubsystemKind::Discovery {
                    l.discovery_only || s.listener_allowed(l.addr)
                } else {
                    !l.discovery_only && s.listener_allowed(l.addr)
                }
            })
            .map(|l| {
                json!({
                    "trtype": if l.rdma { "RDMA" } else { "TCP" },
                    "adrfam": if l.addr.is_ipv4() { "IPv4" } else { "IPv6" },
                    "traddr": l.addr.ip().to_string(),
                    "trsvcid": l.addr.port().to_string(),
                })
            })
            .collect();
        let hosts: Vec<Value> = s
            .hosts
            .read()
            .map(|h| h.iter().map(|n| json!({"nqn": n})).collect())
            .unwrap_or_default();
        let mut v = json!({
            "nqn": s.nqn,
            "subtype": if s.kind == SubsystemKind::Discovery { "Discovery" } else { "NVMe" },
            "listen_addresses": listen,
            "allow_any_host": s.allow_any_host.load(Ordering::Acquire),
            "hosts": hosts,
        });
        if s.kind == SubsystemKind::Nvm {
            let ns: Vec<Value> = s
                .namespace_snapshot()
                .iter()
                .map(|n| {
                    json!({
                        "nsid": n.nsid,
                        "bdev_name": self.bdev_name_of(n),
                        "name": self.bdev_name_of(n),
                        "nguid": hex_id(&n.nguid).to_uppercase(),
                        "eui64": hex_id(&n.eui64).to_uppercase(),
                        "uuid": uuid_str(&n.uuid),
                    })
                })
                .collect();
            v["serial_number"] = json!(s.serial);
            v["model_number"] = json!(s.model);
            v["max_namespaces"] = json!(crate::nvmf::admin::MAX_NAMESPACES);
            v["min_cntlid"] = json!(1);
            v["max_cntlid"] = json!(0xFFEF);
            v["namespaces"] = json!(ns);
        }
        v
    }

    /// The "pool/volume" alias of the volume with this UUID, if one is open.
    pub fn volume_alias(&self, uuid: &[u8; 16]) -> Option<String> {
        self.pools().iter().find_map(|p| {
            p.volumes()
                .into_iter()
                .find(|v| &v.desc.uuid == uuid)
                .map(|v| format!("{}/{}", p.name, v.desc.name))
        })
    }

    /// A namespace's bdev name: its volume's alias, else its device.
    pub fn bdev_name_of(&self, n: &Namespace) -> String {
        self.volume_alias(&n.uuid)
            .unwrap_or_else(|| n.dev.describe())
    }

    fn create_subsystem(&self, p: &mut Params) -> RpcResult {
        let nqn = p.str("nqn")?;
        let serial = p
            .opt_str("serial_number")?
            .unwrap_or_else(|| "KVT0000000000001".into());
        let model = p
            .opt_str("model_number")?
            .unwrap_or_else(|| "kvtarget".into());
        let any = p.opt_bool("allow_any_host")?.unwrap_or(false);
        p.opt_str("tgt_name")?;
        if let Some(m) = p.opt_u64("max_namespaces")? {
            if m > crate::nvmf::admin::MAX_NAMESPACES as u64 {
                return Err(RpcError::params(format!(
                    "max_namespaces: at most {}",
                    crate::nvmf::admin::MAX_NAMESPACES
                )));
            }
        }
        p.opt_u64("min_cntlid")?;
        p.opt_u64("max_cntlid")?;
        p.opt_u64("dmrsl")?;
        p.opt_u64("wzsl")?;
        p.unsupported_flags(&["ana_reporting", "passthrough", "enable_nssr", "admin_label"])?;
        crate::config::validate_nqn(&nqn).map_err(|e| RpcError::params(format!("nqn: {e}")))?;
        if nqn == crate::wire::nvme::DISCOVERY_NQN {
            return Err(RpcError::params("nqn: the discovery NQN is reserved"));
        }
        if serial.is_empty() || serial.len() > 20 || !serial.is_ascii() {
            return Err(RpcError::params("serial_number: 1 to 20 ASCII characters"));
        }
        if model.is_empty() || model.len() > 40 || !model.is_ascii() {
            return Err(RpcError::params("model_number: 1 to 40 ASCII characters"));
        }
        if self.target.find_subsystem(&nqn).is_some() {
            return Err(RpcError::new(
                code::EEXIST,
                format!("subsystem {nqn} already exists"),
            ));
        }
        let sub = Subsystem::new(&nqn, SubsystemKind::Nvm, &serial, &model, any, Vec::new());
        // As in SPDK, a new subsystem is reachable only on listeners added to it.
        if let Ok(mut l) = sub.listen.write() {
            *l = Some(Vec::new());
        }
        self.target.add_subsystem(Arc::new(sub));
        tracing::info!(nqn = %nqn, "rpc: subsystem created");
        Ok(Value::Bool(true))
    }

    fn delete_subsystem(&self, p: &mut Params) -> RpcResult {
        let nqn = p.str("nqn")?;
        p.opt_str("tgt_name")?;
        let s = self.nvm_subsystem(&nqn)?;
        if let Ok(mut subs) = self.target.subsystems.write() {
            subs.retain(|x| !Arc::ptr_eq(x, &s));
        }
        self.target.genctr.fetch_add(1, Ordering::Relaxed);
        // Connected hosts lose their controllers (their queues close).
        if let Ok(c) = s.controllers.lock() {
            for ctrl in c.values() {
                ctrl.fail();
            }
        }
        tracing::info!(nqn = %nqn, "rpc: subsystem deleted");
        Ok(Value::Bool(true))
    }

    fn get_subsystems(&self, p: &mut Params) -> RpcResult {
        let want = p.opt_str("nqn")?;
        p.opt_str("tgt_name")?;
        let mut all = vec![self.target.discovery.clone()];
        all.extend(
            self.target
                .subsystems
                .read()
                .map(|s| s.clone())
                .unwrap_or_default(),
        );
        if let Some(n) = &want {
            all.retain(|s| &s.nqn == n);
            if all.is_empty() {
                return Err(not_found(format!("subsystem {n} does not exist")));
            }
        }
        Ok(Value::Array(
            all.iter().map(|s| self.subsystem_json(s)).collect(),
        ))
    }

    /// Finds a volume by "pool/volume" alias or by UUID.
    fn volume(
        &self,
        name: &str,
    ) -> Result<(Arc<Pool>, Arc<crate::pool::volume::Volume>), RpcError> {
        if let Some((pn, vn)) = name.split_once('/') {
            if let Some(p) = self.pools().iter().find(|p| p.name == pn) {
                if let Some(v) = p.volume(vn) {
                    return Ok((p.clone(), v));
                }
            }
        }
        for p in &self.pools() {
            if let Some(v) = p
                .volumes()
                .into_iter()
                .find(|v| uuid_str(&v.desc.uuid) == name)
            {
                return Ok((p.clone(), v));
            }
        }
        Err(not_found(format!("bdev {name} does not exist")))
    }

    fn served_by(&self, uuid: &[u8; 16]) -> Option<(String, u32)> {
        let subs = self.target.subsystems.read().ok()?.clone();
        for s in subs {
            for n in s.namespace_snapshot() {
                if &n.uuid == uuid {
                    return Some((s.nqn.clone(), n.nsid));
                }
            }
        }
        None
    }

    fn add_ns(&self, p: &mut Params) -> RpcResult {
        let nqn = p.str("nqn")?;
        p.opt_str("tgt_name")?;
        let mut ns = p.object("namespace")?;
        let bdev = ns.str("bdev_name")?;
        let nsid = ns.opt_u64("nsid")?;
        for k in ["nguid", "eui64", "uuid"] {
            if ns.opt_str(k)?.is_some() {
                return Err(RpcError::params(format!(
                    "namespace.{k}: kvtarget uses the volume's persistent identifier"
                )));
            }
        }
        ns.opt_str("ptpl_file")?;
        ns.opt_u64("anagrpid")?;
        ns.unsupported_flags(&["no_auto_visible", "hide_metadata"])?;
        ns.finish()?;
        let s = self.nvm_subsystem(&nqn)?;
        let (pool, vol) = self.volume(&bdev)?;
        if let Some((other, id)) = self.served_by(&vol.desc.uuid) {
            return Err(RpcError::new(
                code::EBUSY,
                format!("bdev {bdev} is already namespace {id} of {other}"),
            ));
        }
        let existing: Vec<u32> = s.namespace_snapshot().iter().map(|n| n.nsid).collect();
        let nsid = match nsid {
            Some(0) | None => (1..=crate::nvmf::admin::MAX_NAMESPACES)
                .find(|i| !existing.contains(i))
                .ok_or_else(|| RpcError::new(code::ENOSPC, format!("{nqn} has no free NSID")))?,
            Some(n) if n > crate::nvmf::admin::MAX_NAMESPACES as u64 => {
                return Err(RpcError::params(format!(
                    "namespace.nsid: must be 1..={}",
                    crate::nvmf::admin::MAX_NAMESPACES
                )))
            }
            Some(n) => n as u32,
        };
        if existing.contains(&nsid) {
            return Err(RpcError::new(
                code::EEXIST,
                format!("NSID {nsid} is already in use in {nqn}"),
            ));
        }
        let dev = VolumeDevice::new(pool, vol.clone());
        let namespace = Namespace::new(&nqn, nsid, dev, vol.desc.block_size);
        s.add_namespace(Arc::new(namespace))
            .map_err(|e| RpcError::new(code::EEXIST, e))?;
        tracing::info!(nqn = %nqn, nsid, bdev = %bdev, "rpc: namespace added");
        Ok(json!(nsid))
    }

    fn remove_ns(&self, p: &mut Params) -> RpcResult {
        let nqn = p.str("nqn")?;
        p.opt_str("tgt_name")?;
        let nsid = p
            .opt_u64("nsid")?
            .ok_or_else(|| RpcError::params("nsid: required"))?;
        let s = self.nvm_subsystem(&nqn)?;
        let ns = s
            .remove_namespace(nsid as u32)
            .ok_or_else(|| not_found(format!("{nqn} has no namespace {nsid}")))?;
        // Queues and reactors let go of it on their next housekeeping pass (its
        // in-flight commands finish first); wait for that so the volume can be
        // deleted or resized right after, as with SPDK.
        let t0 = std::time::Instant::now();
        while Arc::strong_count(&ns) > 1 && t0.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        tracing::info!(nqn = %nqn, nsid, "rpc: namespace removed");
        Ok(Value::Bool(true))
    }

    /// The listen_address object: the address and whether it is NVMe/RDMA.
    fn listen_address(p: &mut Params) -> Result<(std::net::SocketAddr, bool), RpcError> {
        let mut la = p.object("listen_address")?;
        let trtype = la.str("trtype")?;
        let traddr = la.str("traddr")?;
        // SPDK sends the port as a string; accept a number too.
        let trsvcid = match la.get("trsvcid") {
            None => None,
            Some(Value::String(p)) => Some(p.clone()),
            Some(Value::Number(n)) => Some(n.to_string()),
            Some(_) => {
                return Err(RpcError::params(
                    "listen_address.trsvcid: must be a port number",
                ))
            }
        };
        let adrfam = la.opt_str("adrfam")?;
        la.finish()?;
        let rdma = if trtype.eq_ignore_ascii_case("rdma") {
            true
        } else if trtype.eq_ignore_ascii_case("tcp") {
            false
        } else {
            return Err(RpcError::params(format!(
                "listen_address.trtype: {trtype} is not available (TCP and RDMA are)"
            )));
        };
        let ip: std::net::IpAddr = traddr.parse().map_err(|_| {
            RpcError::params(format!(
                "listen_address.traddr: `{traddr}` is not an IP address"
            ))
        })?;
        if let Some(f) = adrfam {
            let ok = match f.to_ascii_lowercase().as_str() {
                "ipv4" => ip.is_ipv4(),
                "ipv6" => ip.is_ipv6(),
                _ => false,
            };
            if !ok {
                return Err(RpcError::params(format!(
                    "listen_address.adrfam: {f} does not match {traddr}"
                )));
            }
        }
        let port: u16 = trsvcid
            .as_deref()
            .unwrap_or("4420")
            .parse()
            .map_err(|_| RpcError::params("listen_address.trsvcid: must be a port number"))?;
        Ok((std::net::SocketAddr::new(ip, port), rdma))
    }

    fn add_listener(&self, p: &mut Params) -> RpcResult {
        let nqn = p.str("nqn")?;
        let (addr, rdma) = Self::listen_address(p)?;
        p.opt_str("tgt_name")?;
        p.opt_str("ana_state")?;
        p.opt_str("sock_impl")?;
        p.get("numa_id");
        p.unsupported_flags(&["secure_channel"])?;
        let s = self.subsystem(&nqn)?;
        let discovery = s.kind == SubsystemKind::Discovery;
        if rdma {
            if !self.rdma.is_started() {
                return Err(RpcError::params(
                    "transport RDMA does not exist: call nvmf_create_transport with trtype RDMA first",
                ));
            }
            if !self.rdma.listeners.contains(addr) {
                let l = crate::transport::rdma::listen(addr, false)
                    .map_err(|e| RpcError::new(code::INTERNAL_ERROR, e))?;
                let bound = l.addr;
                self.rdma.listeners.add(l);
                self.announce_listener(bound, false, true);
            }
        } else if !self.listeners.contains(addr) {
            let spec = crate::transport::bind(addr, discovery)
                .map_err(|e| RpcError::new(code::INTERNAL_ERROR, e))?;
            let bound = spec.addr;
            self.listeners.add(spec);
            self.announce_listener(bound, discovery, false);
        }
        if !discovery {
            let mut l = s
                .listen
                .write()
                .map_err(|_| RpcError::new(code::INTERNAL_ERROR, "listener list poisoned"))?;
            if let Some(list) = l.as_mut() {
                if list.contains(&addr) {
                    return Err(RpcError::new(
                        code::EEXIST,
                        format!("{nqn} already listens on {addr}"),
                    ));
                }
                list.push(addr);
            }
        }
        self.target.genctr.fetch_add(1, Ordering::Relaxed);
        Ok(Value::Bool(true))
    }

    fn remove_listener(&self, p: &mut Params) -> RpcResult {
        let nqn = p.str("nqn")?;
        let (addr, rdma) = Self::listen_address(p)?;
        p.opt_str("tgt_name")?;
        let s = self.subsystem(&nqn)?;
        if s.kind == SubsystemKind::Nvm {
            let all: Vec<std::net::SocketAddr> = self
                .target
                .listeners
                .read()
                .map(|l| {
                    l.iter()
                        .filter(|x| !x.discovery_only)
                        .map(|x| x.addr)
                        .collect()
                })
                .unwrap_or_default();
            let mut l = s
                .listen
                .write()
                .map_err(|_| RpcError::new(code::INTERNAL_ERROR, "listener list poisoned"))?;
            let list = l.get_or_insert_with(|| all.clone());
            let n = list.len();
            list.retain(|a| a != &addr);
            if list.len() == n {
                return Err(not_found(format!("{nqn} does not listen on {addr}")));
            }
        }
        // Stop listening when nothing is reachable there any more. Connections
        // already made stay up.
        let subs = self
            .target
            .subsystems
            .read()
            .map(|s| s.clone())
            .unwrap_or_default();
        let used = subs.iter().any(|x| {
            x.listen
                .read()
                .map(|l| l.as_ref().map_or(true, |l| l.contains(&addr)))
                .unwrap_or(true)
        });
        if s.kind == SubsystemKind::Discovery || !used {
            let is_disc = s.kind == SubsystemKind::Discovery;
            let present = self
                .target
                .listeners
                .read()
                .map(|l| {
                    l.iter()
                        .any(|x| x.addr == addr && x.discovery_only == is_disc && x.rdma == rdma)
                })
                .unwrap_or(false);
            if is_disc && !present {
                return Err(not_found(format!("no discovery listener on {addr}")));
            }
            if present {
                if rdma {
                    self.rdma.listeners.remove(addr);
                } else {
                    self.listeners.remove(addr);
                }
                if let Ok(mut l) = self.target.listeners.write() {
                    l.retain(|x| x.addr != addr || x.rdma != rdma);
                }
                tracing::info!(listener = %addr, "rpc: stopped listening");
            }
        }
        self.target.genctr.fetch_add(1, Ordering::Relaxed);
        Ok(Value::Bool(true))
    }

    fn add_host(&self, p: &mut Params) -> RpcResult {
        let nqn = p.str("nqn")?;
        let host = p.str("host")?;
        p.opt_str("tgt_name")?;
        p.unsupported_flags(&["psk", "dhchap_key", "dhchap_ctrlr_key"])?;
        crate::config::validate_nqn(&host).map_err(|e| RpcError::params(format!("host: {e}")))?;
        let s = self.nvm_subsystem(&nqn)?;
        let mut h = s
            .hosts
            .write()
            .map_err(|_| RpcError::new(code::INTERNAL_ERROR, "host list poisoned"))?;
        if h.contains(&host) {
            return Err(RpcError::new(
                code::EEXIST,
                format!("{host} is already allowed on {nqn}"),
            ));
        }
        h.push(host.clone());
        self.target.genctr.fetch_add(1, Ordering::Relaxed);
        tracing::info!(nqn = %nqn, host = %host, "rpc: host allowed");
        Ok(Value::Bool(true))
    }

    fn remove_host(&self, p: &mut Params) -> RpcResult {
        let nqn = p.str("nqn")?;
        let host = p.str("host")?;
        p.opt_str("tgt_name")?;
        p.opt_u64("timeout_ms")?;
        let s = self.nvm_subsystem(&nqn)?;
        {
            let mut h = s
                .hosts
                .write()
                .map_err(|_| RpcError::new(code::INTERNAL_ERROR, "host list poisoned"))?;
            let before = h.len();
            h.retain(|x| x != &host);
            if h.len() == before {
                return Err(not_found(format!("{host} is not on {nqn}'s host list")));
            }
        }
        self.target.genctr.fetch_add(1, Ordering::Relaxed);
        // Unless any host may connect, its controllers go now.
        let n = if s.allow_any_host.load(Ordering::Acquire) {
            0
        } else {
            s.disconnect_host(&host)
        };
        tracing::info!(nqn = %nqn, host = %host, disconnected = n, "rpc: host removed");
        Ok(Value::Bool(true))
    }

    fn allow_any_host(&self, p: &mut Params) -> RpcResult {
        let nqn = p.str("nqn")?;
        let any = p
            .opt_bool("allow_any_host")?
            .ok_or_else(|| RpcError::params("allow_any_host: required"))?;
        p.opt_str("tgt_name")?;
        let s = self.nvm_subsystem(&nqn)?;
        s.allow_any_host.store(any, Ordering::Release);
        self.target.genctr.fetch_add(1, Ordering::Relaxed);
        if !any {
            // Hosts not on the list lose their controllers.
            let hosts = s.hosts.read().map(|h| h.clone()).unwrap_or_default();
            if let Ok(c) = s.controllers.lock() {
                for ctrl in c.values().filter(|c| !hosts.contains(&c.hostnqn)) {
                    ctrl.fail();
                }
            }
        }
        Ok(Value::Bool(true))
    }

    fn get_controllers(&self, p: &mut Params) -> RpcResult {
        let nqn = p.str("nqn")?;
        p.opt_str("tgt_name")?;
        let s = self.subsystem(&nqn)?;
        let ctrls: Vec<Value> = s
            .controllers
            .lock()
            .map(|c| {
                let mut v: Vec<_> = c.values().cloned().collect();
                v.sort_by_key(|c| c.cntlid);
                v.iter()
                    .map(|c| {
                        json!({
                            "cntlid": c.cntlid,
                            "hostnqn": c.hostnqn,
                            "hostid": uuid_str(&c.hostid),
                            "num_io_qpairs": c.connected_io_queues(),
                            "peer": c.peer,
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(Value::Array(ctrls))
    }

    /// SPDK's nvmf_get_stats: one poll group per reactor; under RDMA one
    /// device entry per completion queue (SPDK's field names, plus kvtarget's
    /// `qpairs`, `cq_entries`, `cq_entries_reserved`, `dropped_completions`).
    fn get_stats(&self, p: &mut Params) -> RpcResult {
        p.opt_str("tgt_name")?;
        let groups = crate::transport::rdma::poll_group_stats();
        let rdma_started = self.rdma.is_started();
        let pgs: Vec<Value> = self
            .reactors
            .iter()
            .map(|r| {
                let mut transports = vec![json!({"trtype": "TCP"})];
                if rdma_started {
                    let devices: Vec<Value> = groups
                        .iter()
                        .filter(|g| g.reactor == r.id)
                        .map(|g| {
                            json!({
                                "name": g.device,
                                "polls": g.polls,
                                "idle_polls": g.idle_polls,
                                "completions": g.completions,
                                "requests": g.requests,
                                "total_send_wrs": g.send_wrs,
                                "total_recv_wrs": g.recv_wrs,
                                "qpairs": g.qpairs,
                                "cq_entries": g.cq_entries,
                                "cq_entries_reserved": g.cq_entries_reserved,
                                "dropped_completions": g.dropped_completions,
                            })
                        })
                        .collect();
                    transports.push(json!({"trtype": "RDMA", "devices": devices}));
                }
                json!({
                    "name": format!("nvmf_tgt_poll_group_{:03}", r.id),
                    "current_qpairs": r.queue_pairs.load(Ordering::Relaxed),
                    "transports": transports,
                })
            })
            .collect();
        Ok(json!({"tick_rate": 1_000_000_000u64, "poll_groups": pgs}))
    }

    fn get_qpairs(&self, p: &mut Params) -> RpcResult {
        let nqn = p.str("nqn")?;
        p.opt_str("tgt_name")?;
        let s = self.subsystem(&nqn)?;
        let mut ctrls: Vec<_> = s
            .controllers
            .lock()
            .map(|c| c.values().cloned().collect())
            .unwrap_or_default();
        ctrls.sort_by_key(|c: &Arc<crate::nvmf::Controller>| c.cntlid);
        let mut out = Vec::new();
        for c in ctrls {
            for qid in c.queue_ids() {
                out.push(json!({
                    "cntlid": c.cntlid,
                    "qid": qid,
                    "state": if c.is_failed() { "deleting" } else { "active" },
                    "hostnqn": c.hostnqn,
                    "trtype": "TCP",
                    "admin_peer_address": c.peer,
                }));
            }
        }
        Ok(Value::Array(out))
    }

    fn get_bdevs(&self, p: &mut Params) -> RpcResult {
        let name = p.opt_str("name")?;
        p.opt_u64("timeout")?;
        let mut out = Vec::new();
        for pool in &self.pools() {
            for v in pool.volumes() {
                let alias = format!("{}/{}", pool.name, v.desc.name);
                let uuid = uuid_str(&v.desc.uuid);
                if let Some(n) = &name {
                    if n != &alias && n != &uuid {
                        continue;
                    }
                }
                let bs = v.desc.block_size as u64;
                out.push(json!({
                    "name": uuid,
                    "aliases": [alias],
                    "product_name": "Logical Volume",
                    "block_size": bs,
                    "num_blocks": v.desc.size_bytes / bs,
                    "uuid": uuid,
                    "claimed": self.served_by(&v.desc.uuid).is_some(),
                    "supported_io_types": {
                        "read": true, "write": true, "flush": true, "unmap": true,
                        "write_zeroes": true, "reset": false, "nvme_admin": false, "nvme_io": false,
                    },
                    "driver_specific": {
                        "lvol": {
                            "lvol_store_uuid": uuid_str(&pool.sb.uuid),
                            "base_bdev": pool.device().describe(),
                            "thin_provision": true,
                            "num_allocated_clusters": v.mapped().len(),
                            "used_bytes": v.used_bytes(),
                            "unwritten": if v.desc.flags & VOL_UNWRITTEN_ERROR != 0 { "error" } else { "zeroes" },
                        }
                    }
                }));
            }
        }
        if let Some(n) = name {
            if out.is_empty() {
                return Err(not_found(format!("bdev {n} does not exist")));
            }
        }
        Ok(Value::Array(out))
    }

    fn get_iostat(&self, p: &mut Params) -> RpcResult {
        let mut names: Vec<String> = p.opt_str("name")?.into_iter().collect();
        match p.get("names") {
            None => {}
            Some(Value::Array(a)) => {
                for n in a {
                    match n.as_str() {
                        Some(n) => names.push(n.to_string()),
                        None => return Err(RpcError::params("names: must be an array of strings")),
                    }
                }
            }
            Some(_) => return Err(RpcError::params("names: must be an array of strings")),
        }
        if p.opt_bool("per_channel")? == Some(true) {
            return Err(RpcError::params("per_channel: not supported by kvtarget"));
        }
        match p.opt_str("reset_mode")?.as_deref() {
            None | Some("none") => {}
            Some(m) => {
                return Err(RpcError::params(format!(
                    "reset_mode: `{m}` is not supported (counters are cumulative)"
                )))
            }
        }
        let mut out = Vec::new();
        for pool in &self.pools() {
            for v in pool.volumes() {
                let alias = format!("{}/{}", pool.name, v.desc.name);
                let uuid = uuid_str(&v.desc.uuid);
                if !names.is_empty() && !names.iter().any(|n| n == &alias || n == &uuid) {
                    continue;
                }
                let t = v.io_totals();
                // Ticks are nanoseconds (tick_rate below).
                out.push(json!({
                    "name": uuid,
                    "aliases": [alias],
                    "bytes_read": t.read_bytes,
                    "num_read_ops": t.reads,
                    "bytes_written": t.write_bytes,
                    "num_write_ops": t.writes,
                    "bytes_unmapped": t.unmap_bytes,
                    "num_unmap_ops": t.unmaps,
                    "read_latency_ticks": t.read_ns,
                    "write_latency_ticks": t.write_ns,
                    "unmap_latency_ticks": t.unmap_ns,
                    "num_flush_ops": t.flushes,
                    "io_error": {"total": t.errors},
                }));
            }
        }
        if !names.is_empty() && out.len() < names.len() {
            return Err(not_found(format!(
                "bdev {} does not exist",
                names.join(",")
            )));
        }
        Ok(json!({
            "tick_rate": 1_000_000_000u64,
            "ticks": self.target.started.elapsed().as_nanos() as u64,
            "bdevs": out,
        }))
    }

    fn pool(&self, name: Option<String>, uuid: Option<String>) -> Result<Arc<Pool>, RpcError> {
        let pools = self.pools();
        let found = match (&name, &uuid) {
            (Some(n), _) => pools.iter().find(|p| &p.name == n),
            (None, Some(u)) => pools.iter().find(|p| &uuid_str(&p.sb.uuid) == u),
            (None, None) if pools.len() == 1 => pools.first(),
            (None, None) => {
                return Err(RpcError::params(
                    "lvs_name or uuid: required (more than one pool)",
                ))
            }
        };
        found.cloned().ok_or_else(|| {
            not_found(format!(
                "lvol store {} does not exist",
                name.or(uuid).unwrap_or_default()
            ))
        })
    }

    /// Formats a file or block device as a new pool (lvol store) and opens it.
    /// `bdev_name` is the path of an existing file or block device: kvtarget
    /// has no separate base-bdev layer.
    fn create_lvstore(&self, p: &mut Params) -> RpcResult {
        use crate::config::{Backend, DualPathConfig, GcConfig, PoolConfig};
        let path = p.str("bdev_name")?;
        let name = p.str("lvs_name")?;
        let cluster = p.opt_u64("cluster_sz")?.unwrap_or(1 << 20);
        if let Some(c) = p.opt_str("clear_method")? {
            if !matches!(c.as_str(), "none" | "unmap" | "write_zeroes") {
                return Err(RpcError::params(format!(
                    "clear_method: `{c}` is not none, unmap or write_zeroes"
                )));
            }
        }
        p.opt_u64("num_md_pages_per_cluster_ratio")?;
        p.opt_u64("md_page_size")?;
        if name.is_empty() || name.contains('/') || name.len() > 64 {
            return Err(RpcError::params("lvs_name: 1 to 64 characters without `/`"));
        }
        if self.pools().iter().any(|x| x.name == name) {
            return Err(RpcError::new(
                code::EEXIST,
                format!("lvol store {name} already exists"),
            ));
        }
        let pb = std::path::PathBuf::from(&path);
        if !pb.exists() {
            return Err(not_found(format!(
                "bdev_name: {path} does not exist (give the path of a file or block device; create a file with `truncate -s SIZE {path}`)"
            )));
        }
        let lock = crate::pool::lock_pool(&pb, true).map_err(|e| RpcError::new(code::EBUSY, e))?;
        let dev: crate::bdev::SharedDevice = crate::bdev::uring::UringDevice::open(&pb, None, 512)
            .map_err(|e| RpcError::params(format!("bdev_name: {path}: {e}")))?;
        crate::pool::format(
            &dev,
            &crate::pool::FormatOptions {
                extent_size: cluster,
                force: false,
                journal_len: None,
            },
        )
        .map_err(|e| {
            if e.contains("already holds a pool") {
                RpcError::new(code::EEXIST, e)
            } else {
                RpcError::params(e)
            }
        })?;
        let opts = crate::pool::PoolOptions {
            reactors: self.reactors.len().max(1),
            ..Default::default()
        };
        let pool =
            Pool::open(&name, dev, opts).map_err(|e| RpcError::new(code::INTERNAL_ERROR, e))?;
        let uuid = uuid_str(&pool.sb.uuid);
        if let Ok(mut v) = self.pools.write() {
            v.push(pool);
        }
        if let Ok(mut r) = self.runtime_pools.lock() {
            r.push((
                PoolConfig {
                    name: name.clone(),
                    backend: Backend::Uring,
                    path: Some(pb),
                    pci: None,
                    nvme_nsid: None,
                    trid: None,
                    size: None,
                    extent_size: cluster,
                    create: false,
                    gc: GcConfig::default(),
                    dual_path: DualPathConfig::default(),
                    volumes: Vec::new(),
                },
                lock,
            ));
        }
        tracing::info!(pool = %name, path = %path, "rpc: pool created");
        Ok(json!(uuid))
    }

    fn get_lvstores(&self, p: &mut Params) -> RpcResult {
        let name = p.opt_str("lvs_name")?;
        let uuid = p.opt_str("uuid")?;
        let pools: Vec<Arc<Pool>> = if name.is_some() || uuid.is_some() {
            vec![self.pool(name, uuid)?]
        } else {
            self.pools()
        };
        Ok(Value::Array(
            pools
                .iter()
                .map(|pool| {
                    let s = pool.snapshot();
                    json!({
                        "uuid": uuid_str(&pool.sb.uuid),
                        "name": pool.name,
                        "base_bdev": pool.device().describe(),
                        "total_data_clusters": s.extents,
                        "free_clusters": s.clean + s.dirty + s.reserved,
                        "block_size": 512,
                        "cluster_size": s.extent_size,
                    })
                })
                .collect(),
        ))
    }

    fn lvol_create(&self, p: &mut Params) -> RpcResult {
        let name = p.str("lvol_name")?;
        let mib = p
            .opt_u64("size_in_mib")?
            .ok_or_else(|| RpcError::params("size_in_mib: required"))?;
        let pool = self.pool(p.opt_str("lvs_name")?, p.opt_str("uuid")?)?;
        // Volumes are always thin; a thick request is refused rather than faked.
        if p.opt_bool("thin_provision")? == Some(false) {
            return Err(RpcError::params(
                "thin_provision: kvtarget volumes are always thin-provisioned; pass thin_provision: true",
            ));
        }
        if let Some(c) = p.opt_str("clear_method")? {
            if !matches!(c.as_str(), "default" | "unmap" | "none" | "write_zeroes") {
                return Err(RpcError::params(format!(
                    "clear_method: `{c}` is not default, none, unmap or write_zeroes"
                )));
            }
        }
        let block_size = p.opt_u64("block_size")?.unwrap_or(4096);
        let flags = match p.opt_str("unwritten")?.as_deref() {
            None | Some("zeroes") => 0,
            Some("error") => VOL_UNWRITTEN_ERROR,
            Some(o) => {
                return Err(RpcError::params(format!(
                    "unwritten: `{o}` is not zeroes or error"
                )))
            }
        };
        let size = mib
            .checked_mul(1 << 20)
            .ok_or_else(|| RpcError::params("size_in_mib: too large"))?;
        let v = pool
            .create_volume(&name, size, block_size as u32, flags)
            .map_err(|e| {
                if e.contains("already exists") {
                    RpcError::new(code::EEXIST, e)
                } else {
                    RpcError::params(e)
                }
            })?;
        Ok(json!(uuid_str(&v.desc.uuid)))
    }

    /// A volume no namespace serves: its pool and name (the volume itself is
    /// not held, so the pool may change it).
    fn idle_volume(&self, name: &str, to: &str) -> Result<(Arc<Pool>, String), RpcError> {
        let (pool, vol) = self.volume(name)?;
        if let Some((nqn, nsid)) = self.served_by(&vol.desc.uuid) {
            return Err(RpcError::new(
                code::EBUSY,
                format!("{name} is namespace {nsid} of {nqn}; remove the namespace to {to}"),
            ));
        }
        Ok((pool, vol.desc.name.clone()))
    }

    fn lvol_delete(&self, p: &mut Params) -> RpcResult {
        let name = p.str("name")?;
        let (pool, vname) = self.idle_volume(&name, "delete it")?;
        pool.delete_volume(&vname)
            .map_err(|e| RpcError::new(code::EBUSY, e))?;
        Ok(Value::Bool(true))
    }

    fn lvol_resize(&self, p: &mut Params) -> RpcResult {
        let name = p.str("name")?;
        let mib = p
            .opt_u64("size_in_mib")?
            .ok_or_else(|| RpcError::params("size_in_mib: required"))?;
        let (pool, vname) = self.idle_volume(&name, "resize it")?;
        let size = mib
            .checked_mul(1 << 20)
            .ok_or_else(|| RpcError::params("size_in_mib: too large"))?;
        pool.resize_volume(&vname, size)
            .map_err(|e| RpcError::new(code::EBUSY, e))?;
        Ok(Value::Bool(true))
    }

    fn get_pools(&self, p: &mut Params) -> RpcResult {
        let name = p.opt_str("name")?;
        let mut out = Vec::new();
        for pool in &self.pools() {
            if name.as_ref().is_some_and(|n| n != &pool.name) {
                continue;
            }
            let s = pool.snapshot();
            out.push(json!({
                "name": pool.name,
                "uuid": uuid_str(&pool.sb.uuid),
                "device": pool.device().describe(),
                "extent_size": s.extent_size,
                "extents": s.extents,
                "mapped": s.mapped,
                "clean": s.clean,
                "dirty": s.dirty,
                "reserved": s.reserved,
                "volumes": pool.volumes().len(),
                "journal": {"used": s.journal_used, "size": s.journal_len, "commits": s.commits, "checkpoints": s.checkpoints},
                "gc": {
                    "mode": s.gc_mode.name(),
                    "paused": pool.gc_paused(),
                    "rate_extents_per_s": s.gc_rate,
                    "backlog": s.dirty,
                    "scrubbed": s.gc_scrubbed,
                    "low_watermark": s.low_watermark,
                    "high_watermark": s.high_watermark,
                },
            }));
        }
        if let Some(n) = name {
            if out.is_empty() {
                return Err(not_found(format!("pool {n} does not exist")));
            }
        }
        Ok(Value::Array(out))
    }

    /// The running state as a configuration that reproduces it at the next
    /// start: listeners, pools with every volume, subsystems with hosts,
    /// listeners and namespaces. Written to `path` when given.
    pub fn current_config(&self) -> Result<crate::config::Config, String> {
        use crate::config::{
            ListenerConfig, NamespaceConfig, SubsystemConfig, Unwritten, VolumeConfig,
        };
        let mut cfg = self.config.clone();
        if let Ok(r) = self.runtime_pools.lock() {
            cfg.pools.extend(r.iter().map(|(c, _)| c.clone()));
        }
        let listeners = self
            .target
            .listeners
            .read()
            .map(|l| l.clone())
            .unwrap_or_default();
        cfg.listeners = listeners
            .iter()
            .filter(|l| !l.discovery_only)
            .map(|l| ListenerConfig {
                address: l.addr.ip().to_string(),
                port: l.addr.port(),
                transport: if l.rdma {
                    crate::config::TransportKind::Rdma
                } else {
                    crate::config::TransportKind::Tcp
                },
            })
            .collect();
        for pc in &mut cfg.pools {
            if let Some(pool) = self.pools().iter().find(|p| p.name == pc.name) {
                pc.volumes = pool
                    .volumes()
                    .iter()
                    .map(|v| VolumeConfig {
                        name: v.desc.name.clone(),
                        size: v.desc.size_bytes,
                        block_size: v.desc.block_size,
                        unwritten: if v.desc.flags & VOL_UNWRITTEN_ERROR != 0 {
                            Unwritten::Error
                        } else {
                            Unwritten::Zeroes
                        },
                    })
                    .collect();
            }
        }
        let subs = self
            .target
            .subsystems
            .read()
            .map(|s| s.clone())
            .unwrap_or_default();
        let mut out = Vec::new();
        for s in subs {
            let orig = self.config.subsystems.iter().find(|o| o.nqn == s.nqn);
            let mut namespaces = Vec::new();
            for n in s.namespace_snapshot() {
                let vol = self.volume_alias(&n.uuid);
                match vol {
                    Some(v) => namespaces.push(NamespaceConfig {
                        nsid: n.nsid,
                        volume: Some(v),
                        backend: None,
                        path: None,
                        pci: None,
                        nvme_nsid: None,
                        trid: None,
                        size: None,
                        block_size: None,
                    }),
                    None => match orig.and_then(|o| o.namespaces.iter().find(|x| x.nsid == n.nsid))
                    {
                        Some(c) => namespaces.push(c.clone()),
                        None => {
                            return Err(format!(
                                "{} namespace {} has no configuration to save",
                                s.nqn, n.nsid
                            ))
                        }
                    },
                }
            }
            out.push(SubsystemConfig {
                nqn: s.nqn.clone(),
                serial: s.serial.clone(),
                model: s.model.clone(),
                allow_any_host: s.allow_any_host.load(Ordering::Acquire),
                hosts: s.hosts.read().map(|h| h.clone()).unwrap_or_default(),
                listen: s
                    .listen
                    .read()
                    .ok()
                    .and_then(|l| l.clone())
                    .map(|l| l.iter().map(|a| a.to_string()).collect()),
                namespaces,
            });
        }
        cfg.subsystems = out;
        Ok(cfg)
    }

    fn save_config(&self, p: &mut Params) -> RpcResult {
        let path = p.opt_str("path")?;
        let cfg = self
            .current_config()
            .map_err(|e| RpcError::new(code::INTERNAL_ERROR, e))?;
        let text = cfg
            .to_toml()
            .map_err(|e| RpcError::new(code::INTERNAL_ERROR, e))?;
        let text = format!("# Written by kvtarget_save_config from the running target.\n{text}");
        // What we write must load: check it before it replaces anything.
        crate::config::Config::parse(&text).map_err(|e| {
            RpcError::new(
                code::INTERNAL_ERROR,
                format!("saved configuration does not load: {e}"),
            )
        })?;
        if let Some(path) = path {
            let tmp = format!("{path}.tmp");
            std::fs::write(&tmp, &text)
                .and_then(|_| std::fs::rename(&tmp, &path))
                .map_err(|e| RpcError::params(format!("path: {path}: {e}")))?;
        }
        Ok(json!({"toml": text}))
    }

    /// Live consistency check of a pool (the offline one is `kvtarget check`).
    fn pool_check(&self, p: &mut Params) -> RpcResult {
        let name = p.str("name")?;
        let pool = self
            .pools()
            .into_iter()
            .find(|x| x.name == name)
            .ok_or_else(|| not_found(format!("pool {name} does not exist")))?;
        let (problems, summary) = pool.verify_live();
        Ok(json!({"consistent": problems.is_empty(), "problems": problems, "extents": summary}))
    }

    fn pool_set_gc(&self, p: &mut Params) -> RpcResult {
        let name = p.str("name")?;
        let paused = p.opt_bool("paused")?;
        let max_rate = match p.get("max_rate") {
            None => None,
            Some(v) => Some(
                v.as_f64()
                    .ok_or_else(|| RpcError::params("max_rate: must be a number"))?,
            ),
        };
        let qd = p.opt_u64("max_foreground_qd")?;
        let low = p.opt_u64("low_watermark_pct")?;
        let high = p.opt_u64("high_watermark_pct")?;
        let pool = self
            .pools()
            .into_iter()
            .find(|x| x.name == name)
            .ok_or_else(|| not_found(format!("pool {name} does not exist")))?;
        pool.set_gc_settings(max_rate, qd, low, high)
            .map_err(RpcError::params)?;
        if let Some(pz) = paused {
            pool.set_gc_paused(pz);
        }
        let g = pool.gc_settings();
        Ok(json!({
            "paused": pool.gc_paused(),
            "max_rate": g.max_rate,
            "max_foreground_qd": g.max_foreground_qd,
            "low_watermark_pct": g.low_watermark_pct,
            "high_watermark_pct": g.high_watermark_pct,
        }))
    }
}
