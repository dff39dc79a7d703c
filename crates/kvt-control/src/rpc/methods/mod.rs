//! RPC methods. Names and parameters follow SPDK (`nvmf_*`, `bdev_*`,
//! `bdev_lvol_*`, `framework_*`, `spdk_get_version`, `rpc_get_methods`);
//! kvtarget-only operations are `kvtarget_*`.
//!
//! Bdevs are pool volumes, named "pool/volume" (SPDK's lvol alias form, with the
//! pool as the lvol store). Parameters SPDK's client sends with default values
//! for features kvtarget lacks (passthrough, NSSR, ...) are accepted when off and
//! refused with a clear message when on; unknown parameters are refused.
//!
//! A bad call changes nothing: every handler is split in two by its type. The
//! handler proper reads its parameters with serde into one typed struct
//! (`Params::parse`; the configuration's operations, `kvt_config::ops`,
//! where one exists) and checks them without access to the target, and
//! returns the action; `call` refuses unknown parameters, and only
//! then runs the action, which cannot read parameters any more.
//!
//! One file per method family (`framework`, `nvmf`, `nvmf_subsystem`, `bdev`,
//! `kvtarget`) holds its handlers; this module holds the shared state, the
//! parameter reader and the one name -> handler table.

mod ana;
mod bdev;
mod framework;
mod keyring;
mod kvtarget;
mod listen_address;
mod nvmf;
mod nvmf_subsystem;
mod reservation;

use super::{code, RpcError, RpcResult};
use kvt_nvmf::{Namespace, Target};
use kvt_pool::Pool;
use kvt_reactor::ReactorShared;
use serde_json::{Map, Value};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

/// What RPC methods act on.
pub struct Control {
    pub target: Arc<Target>,
    pools: std::sync::RwLock<Vec<Arc<Pool>>>,
    /// Pools created over RPC: their configuration (for save) and lock.
    runtime_pools: Mutex<Vec<(kvt_config::PoolConfig, kvt_pool::PoolLock)>>,
    pub reactors: Vec<Arc<ReactorShared>>,
    pub listeners: Arc<kvt_transport::ListenerSet>,
    /// The NVMe/RDMA transport (started by configuration or nvmf_create_transport).
    pub rdma: Arc<kvt_transport::rdma::RdmaTransport>,
    /// The configuration the target started from (for `kvtarget_save_config`).
    pub config: kvt_config::Config,
    /// Serialises changes so two clients cannot interleave half-done edits.
    edit: Mutex<()>,
    /// When the control path started (bdev_get_iostat's tick count).
    pub started: std::time::Instant,
    /// This node's cluster membership, set once when `[cluster]` started.
    pub cluster: std::sync::OnceLock<kvt_cluster::ClusterView>,
}

/// What a method does once its parameters are read and checked. `'static`, so
/// it cannot hold the `Params` (nothing can be read, or refused, after it
/// starts); it gets the target only when it runs.
type Action = Box<dyn FnOnce(&Control) -> RpcResult>;

/// A handler's result: the action, or the first thing wrong with the
/// parameters.
type Parsed = Result<Action, RpcError>;

/// A method's handler: reads every parameter it knows through
/// `Params::parse` (a serde struct per method) and
/// checks what can be checked without the target (types, ranges, names). It
/// has no `Control`, so it cannot change anything; `call` refuses the keys it
/// did not read before running the action it returns.
type Handler = fn(&mut Params) -> Parsed;

/// Wraps a handler's action (for closure type inference).
fn act(f: impl FnOnce(&Control) -> RpcResult + 'static) -> Parsed {
    Ok(Box::new(f))
}

/// Every method and its handler, in the order `rpc_get_methods` lists them.
/// Dispatch and the list both read this one table, so a method cannot be
/// listed without a handler or handled without being listed.
const TABLE: &[(&str, Handler)] = &[
    ("spdk_get_version", framework::version),
    ("rpc_get_methods", framework::get_methods),
    ("framework_get_reactors", framework::reactors),
    ("nvmf_create_transport", nvmf::create_transport),
    ("nvmf_get_transports", nvmf::get_transports),
    ("nvmf_create_subsystem", nvmf::create_subsystem),
    ("nvmf_delete_subsystem", nvmf::delete_subsystem),
    ("nvmf_get_subsystems", nvmf::get_subsystems),
    ("nvmf_subsystem_add_listener", nvmf_subsystem::add_listener),
    (
        "nvmf_subsystem_remove_listener",
        nvmf_subsystem::remove_listener,
    ),
    ("nvmf_subsystem_add_ns", nvmf_subsystem::add_ns),
    ("nvmf_ns_get_reservation", reservation::get_reservation),
    ("nvmf_subsystem_remove_ns", nvmf_subsystem::remove_ns),
    ("nvmf_subsystem_add_host", nvmf_subsystem::add_host),
    ("nvmf_subsystem_remove_host", nvmf_subsystem::remove_host),
    ("nvmf_subsystem_set_keys", nvmf_subsystem::set_keys),
    (
        "nvmf_subsystem_allow_any_host",
        nvmf_subsystem::allow_any_host,
    ),
    (
        "nvmf_subsystem_get_controllers",
        nvmf_subsystem::get_controllers,
    ),
    ("nvmf_subsystem_get_qpairs", nvmf_subsystem::get_qpairs),
    ("nvmf_subsystem_get_listeners", ana::get_listeners),
    (
        "nvmf_subsystem_listener_set_ana_state",
        ana::listener_set_ana_state,
    ),
    ("nvmf_subsystem_set_ns_ana_group", ana::set_ns_ana_group),
    ("nvmf_get_stats", nvmf::get_stats),
    ("bdev_get_bdevs", bdev::get_bdevs),
    ("bdev_get_iostat", bdev::get_iostat),
    ("bdev_lvol_create_lvstore", bdev::create_lvstore),
    ("bdev_lvol_get_lvstores", bdev::get_lvstores),
    ("bdev_lvol_create", bdev::lvol_create),
    ("bdev_lvol_delete", bdev::lvol_delete),
    ("bdev_lvol_resize", bdev::lvol_resize),
    ("kvtarget_get_pools", kvtarget::get_pools),
    ("kvtarget_pool_set_gc", kvtarget::pool_set_gc),
    ("kvtarget_save_config", kvtarget::save_config),
    ("kvtarget_pool_check", kvtarget::pool_check),
    ("kvtarget_pool_checkpoint", kvtarget::pool_checkpoint),
    ("kvtarget_get_kv_namespaces", kvtarget::get_kv_namespaces),
    ("kvtarget_get_cluster", kvtarget::get_cluster),
    ("keyring_file_add_key", keyring::file_add_key),
    ("keyring_file_remove_key", keyring::file_remove_key),
    ("keyring_get_keys", keyring::get_keys),
];

/// The method names, in `TABLE` order (what `rpc_get_methods` returns).
pub const METHODS: &[&str] = &{
    let mut names = [""; TABLE.len()];
    let mut i = 0;
    while i < TABLE.len() {
        names[i] = TABLE[i].0;
        i += 1;
    }
    names
};

/// A params object read with serde into typed structs; remembers which keys
/// were read so unknown ones can be refused. Errors name keys by their full path (`namespace.nsid`).
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
    fn required(&self, k: &str) -> RpcError {
        RpcError::params(format!("{}: required", k))
    }
    /// The keys `fields` deserialised with serde into `T`, one of the
    /// parameter structs the configuration's operations use
    /// (`kvt_config::ops`). The keys count as read; a missing one is
    /// "required", a value of the wrong type names its key.
    fn typed<T: serde::de::DeserializeOwned>(&mut self, fields: &[&str]) -> Result<T, RpcError> {
        let mut obj = Map::new();
        for f in fields {
            if let Some(v) = self.get(f) {
                obj.insert(f.to_string(), v.clone());
            }
        }
        serde_path_to_error::deserialize(Value::Object(obj)).map_err(|e| self.serde_error(&e))
    }

    /// Every parameter `T` declares (its serde field names), read with
    /// [`Params::typed`]: a method's parameters as one struct.
    fn parse<T: serde::de::DeserializeOwned>(&mut self) -> Result<T, RpcError> {
        self.typed(fields_of::<T>())
    }

    /// A serde error as this reader words it, naming the key by its path.
    fn serde_error(&self, e: &serde_path_to_error::Error<serde_json::Error>) -> RpcError {
        let message = e.inner().to_string();
        // serde names the root "."; a field missing in a nested object is
        // reported at that object's path.
        let at = e.path().to_string();
        let at = if at == "." { String::new() } else { at + "." };
        if let Some(k) = message
            .strip_prefix("missing field `")
            .and_then(|r| r.strip_suffix('`'))
        {
            return self.required(&format!("{at}{k}"));
        }
        if let Some(k) = message
            .strip_prefix("unknown field `")
            .and_then(|r| r.split('`').next())
        {
            // serde_path_to_error's path ends with the unknown key already.
            let path = e.path().to_string();
            let key = if path.ends_with(k) {
                path
            } else {
                format!("{at}{k}")
            };
            return RpcError::params(format!("unknown parameter `{}`", key));
        }
        let reason = if message.ends_with("expected a string") {
            "must be a string"
        } else if message.ends_with("expected a boolean") {
            "must be true or false"
        } else if message.ends_with("expected u64") {
            "must be a non-negative integer"
        } else if message.ends_with("expected f64") {
            "must be a number"
        } else if message.contains("expected struct ") {
            "must be an object"
        } else {
            message.as_str()
        };
        RpcError::params(format!("{}: {reason}", e.path()))
    }
    /// SPDK tuning options that have no effect here; accepted and ignored.
    fn ignore(&mut self, keys: &[&str]) {
        for k in keys {
            self.seen.insert(k.to_string());
        }
    }
    /// Refuses the keys no one read: all of them, by full name.
    fn finish(self) -> Result<(), RpcError> {
        let unknown: Vec<String> = self
            .map
            .keys()
            .filter(|k| !self.seen.contains(*k))
            .map(|k| format!("`{}`", k))
            .collect();
        match unknown.len() {
            0 => Ok(()),
            1 => Err(RpcError::params(format!(
                "unknown parameter {}",
                unknown[0]
            ))),
            _ => Err(RpcError::params(format!(
                "unknown parameters {}",
                unknown.join(", ")
            ))),
        }
    }
}

/// The field names of struct `T` as serde sees them (what
/// `deserialize_struct` is given): a deserializer that records them and
/// deserialises nothing.
fn fields_of<T: serde::de::DeserializeOwned>() -> &'static [&'static str] {
    struct Fields(&'static [&'static str]);
    #[derive(Debug)]
    struct Stop;
    impl std::fmt::Display for Stop {
        fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("field names recorded")
        }
    }
    impl std::error::Error for Stop {}
    impl serde::de::Error for Stop {
        fn custom<M: std::fmt::Display>(_: M) -> Stop {
            Stop
        }
    }
    impl<'de> serde::Deserializer<'de> for &mut Fields {
        type Error = Stop;
        fn deserialize_any<V: serde::de::Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
            Err(Stop)
        }
        fn deserialize_struct<V: serde::de::Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Stop> {
            self.0 = fields;
            Err(Stop)
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
            bytes byte_buf option unit unit_struct newtype_struct seq tuple
            tuple_struct map enum identifier ignored_any
        }
    }
    let mut f = Fields(&[]);
    let _ = T::deserialize(&mut f);
    assert!(!f.0.is_empty(), "parameters must be a struct with fields");
    f.0
}

/// Parameters naming one subsystem (`nvmf_delete_subsystem`,
/// `nvmf_subsystem_get_controllers`, ...).
#[derive(serde::Deserialize)]
struct Nqn {
    nqn: String,
    #[allow(dead_code)]
    tgt_name: Option<String>,
}

/// Parameters naming one object (a pool, a volume, a key).
#[derive(serde::Deserialize)]
struct Name {
    name: String,
}

/// Parameters that may name one object (listings: all when absent).
#[derive(serde::Deserialize)]
struct OptName {
    name: Option<String>,
}

/// SPDK's `tgt_name` (one target here): accepted, for methods whose
/// parameters are otherwise one of the configuration's operations.
#[derive(serde::Deserialize)]
struct TgtName {
    #[allow(dead_code)]
    tgt_name: Option<String>,
}

/// An SPDK option kvtarget does not implement, given as `v`: fine when off,
/// empty or absent.
fn unsupported(key: &str, v: &Option<Value>) -> Result<(), RpcError> {
    match v {
        None | Some(Value::Null) | Some(Value::Bool(false)) => Ok(()),
        Some(Value::String(s)) if s.is_empty() => Ok(()),
        Some(_) => Err(RpcError::params(format!(
            "{key}: not supported by kvtarget"
        ))),
    }
}

fn not_found(what: impl Into<String>) -> RpcError {
    RpcError::new(code::ENOENT, what)
}

impl Control {
    pub fn new(
        target: Arc<Target>,
        pools: Vec<Arc<Pool>>,
        reactors: Vec<Arc<ReactorShared>>,
        listeners: Arc<kvt_transport::ListenerSet>,
        rdma: Arc<kvt_transport::rdma::RdmaTransport>,
        config: kvt_config::Config,
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
            started: std::time::Instant::now(),
            cluster: std::sync::OnceLock::new(),
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

    /// Runs one method. Its parameters are read and checked, unknown ones
    /// included, before its action runs (under the edit lock): a bad call
    /// changes nothing.
    pub fn call(&self, method: &str, params: Value) -> RpcResult {
        let mut p = Params::new(params)?;
        let Some(&(_, handler)) = TABLE.iter().find(|(name, _)| *name == method) else {
            return Err(RpcError::new(
                code::METHOD_NOT_FOUND,
                format!("Method not found: {method}"),
            ));
        };
        let action = handler(&mut p)?;
        p.finish()?;
        let _guard = self.edit.lock().unwrap_or_else(|e| e.into_inner());
        action(self)
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

    /// Finds a volume by "pool/volume" alias or by UUID.
    fn volume(&self, name: &str) -> Result<(Arc<Pool>, Arc<kvt_pool::volume::Volume>), RpcError> {
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
                .find(|v| kvt_wire::ident::uuid_text(&v.desc.uuid) == name)
            {
                return Ok((p.clone(), v));
            }
        }
        Err(not_found(format!("bdev {name} does not exist")))
    }

    pub(super) fn served_by(&self, uuid: &[u8; 16]) -> Option<(String, u32)> {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvt_transport::rdma::{RdmaSettings, RdmaTransport};
    use kvt_transport::ListenerSet;
    use serde_json::json;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A control with no pools, reactors or listeners: enough to reach every
    /// handler's parameter checks.
    fn control() -> Control {
        let target = Arc::new(Target::new(Default::default()));
        let rdma = Arc::new(RdmaTransport::new(
            Vec::new(),
            target.clone(),
            RdmaSettings::default(),
            Arc::new(AtomicBool::new(false)),
        ));
        let config = kvt_config::Config::parse(include_str!("../../../../../config/default.toml"))
            .expect("config/default.toml parses");
        Control::new(
            target,
            Vec::new(),
            Vec::new(),
            Arc::new(ListenerSet::new(Vec::new()).expect("an eventfd")),
            rdma,
            config,
        )
    }

    #[test]
    fn table_names_are_unique() {
        let names: BTreeSet<&str> = TABLE.iter().map(|(n, _)| *n).collect();
        assert_eq!(names.len(), TABLE.len(), "a method name appears twice");
        assert_eq!(METHODS.len(), TABLE.len());
    }

    #[test]
    fn every_listed_method_dispatches() {
        let ctl = control();
        for name in METHODS {
            // Every method refuses an unknown parameter (`call` checks once
            // the handler has read its own), or fails on a missing required
            // one first; either way before its action runs.
            match ctl.call(name, json!({"no_such_parameter": 1})) {
                Ok(v) => panic!("{name}: accepted an unknown parameter: {v}"),
                Err(e) => assert_ne!(e.code, code::METHOD_NOT_FOUND, "{name}: {}", e.message),
            }
        }
        match ctl.call("no_such_method", json!({})) {
            Err(e) => assert_eq!(e.code, code::METHOD_NOT_FOUND),
            Ok(v) => panic!("no_such_method answered {v}"),
        }
    }

    const NQN: &str = "nqn.2026-11.io.kvtarget:unit";
    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:6b767461-7267-6574-0000-000000000001";
    const OTHER: &str = "nqn.2014-08.org.nvmexpress:uuid:6b767461-7267-6574-0000-0000000000cc";
    /// The key every refusal test adds to otherwise valid parameters.
    const BOGUS: &str = "bogus_key";

    fn ok(ctl: &Control, method: &str, params: Value) -> Value {
        ctl.call(method, params)
            .unwrap_or_else(|e| panic!("{method}: {}", e.message))
    }

    /// A port nothing listens on (bound once by the OS, then let go).
    fn free_port() -> std::net::SocketAddr {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
    }

    fn listen_address(a: std::net::SocketAddr) -> Value {
        json!({"trtype": "TCP", "adrfam": "IPv4", "traddr": a.ip().to_string(), "trsvcid": a.port().to_string()})
    }

    /// `control()` plus a RAM pool `kv` (volumes `base`, `spare` and
    /// `served`) and a subsystem with one host, one listener (returned) and
    /// `kv/served` as namespace 1: something for every mutating method to
    /// change.
    fn populated() -> (Control, std::net::SocketAddr) {
        use kvt_pool::{FormatOptions, PoolOptions};
        let ctl = control();
        let dev: kvt_bdev::SharedDevice =
            kvt_bdev::ram::RamDevice::new("unit", 64 << 20).expect("ram device");
        kvt_pool::format(
            &dev,
            &FormatOptions {
                extent_size: 1 << 20,
                force: false,
                journal_len: None,
                max_volumes: None,
            },
        )
        .expect("format");
        // No metadata thread: commits are synchronous and nothing moves
        // behind the test's back.
        let opts = PoolOptions {
            md_thread: false,
            commit_interval: None,
            ..PoolOptions::default()
        };
        let pool = Pool::open("kv", dev, opts).expect("open pool");
        if let Ok(mut p) = ctl.pools.write() {
            p.push(pool);
        }
        for v in ["base", "spare", "served"] {
            ok(
                &ctl,
                "bdev_lvol_create",
                json!({"lvol_name": v, "size_in_mib": 8, "lvs_name": "kv"}),
            );
        }
        ok(&ctl, "nvmf_create_subsystem", json!({"nqn": NQN}));
        ok(
            &ctl,
            "nvmf_subsystem_add_host",
            json!({"nqn": NQN, "host": HOST}),
        );
        ok(
            &ctl,
            "nvmf_subsystem_add_ns",
            json!({"nqn": NQN, "namespace": {"bdev_name": "kv/served", "nsid": 1}}),
        );
        let addr = free_port();
        ok(
            &ctl,
            "nvmf_subsystem_add_listener",
            json!({"nqn": NQN, "listen_address": listen_address(addr)}),
        );
        (ctl, addr)
    }

    /// Everything an RPC can change, as the read-only methods and the
    /// target's own tables show it.
    fn state(ctl: &Control) -> Value {
        let pools: Vec<Value> = ctl
            .pools()
            .iter()
            .map(|p| json!([p.name, format!("{:?}", p.gc_settings()), p.gc_paused()]))
            .collect();
        let announced: Vec<Value> = ctl
            .target
            .listeners
            .read()
            .map(|l| {
                l.iter()
                    .map(|x| json!([x.addr.to_string(), x.discovery_only, x.rdma, x.portid]))
                    .collect()
            })
            .unwrap_or_default();
        let bound: Vec<String> = ctl
            .listeners
            .snapshot()
            .iter()
            .map(|s| s.addr.to_string())
            .collect();
        json!({
            "subsystems": ok(ctl, "nvmf_get_subsystems", json!({})),
            "bdevs": ok(ctl, "bdev_get_bdevs", json!({})),
            "lvstores": ok(ctl, "bdev_lvol_get_lvstores", json!({})),
            "kv_pools": ok(ctl, "kvtarget_get_pools", json!({})),
            "gc": pools,
            "transports": ok(ctl, "nvmf_get_transports", json!({})),
            "rdma_started": ctl.rdma.is_started(),
            "announced": announced,
            "bound": bound,
            "genctr": ctl.target.genctr.load(Ordering::Relaxed),
        })
    }

    /// Which parts of `state` differ (names, not the whole dump).
    fn changed(before: &Value, after: &Value) -> Vec<String> {
        before
            .as_object()
            .map(|o| {
                o.keys()
                    .filter(|k| before[*k] != after[*k])
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The call fails with a params error naming unknown `key`, and nothing
    /// changed; else what went wrong.
    fn check_refused(ctl: &Control, method: &str, params: Value, key: &str) -> Result<(), String> {
        check_params_error(ctl, method, params, &format!("`{key}`"))
    }

    /// The call fails with a params error whose message contains `needle`,
    /// and nothing changed; else what went wrong.
    fn check_params_error(
        ctl: &Control,
        method: &str,
        params: Value,
        needle: &str,
    ) -> Result<(), String> {
        let before = state(ctl);
        match ctl.call(method, params) {
            Ok(v) => return Err(format!("{method}: accepted bad parameters ({needle}): {v}")),
            Err(e) if e.code != code::INVALID_PARAMS => {
                return Err(format!("{method}: code {}: {}", e.code, e.message))
            }
            Err(e) if !e.message.contains(needle) => {
                return Err(format!("{method}: does not say {needle}: {}", e.message))
            }
            Err(_) => {}
        }
        let changed = changed(&before, &state(ctl));
        if changed.is_empty() {
            Ok(())
        } else {
            Err(format!("{method}: refused but changed {changed:?}"))
        }
    }

    fn refused(ctl: &Control, method: &str, params: Value, key: &str) {
        if let Err(e) = check_refused(ctl, method, params, key) {
            panic!("{e}");
        }
    }

    /// `params` plus the unknown key.
    fn with_bogus(mut params: Value) -> Value {
        params[BOGUS] = json!(1);
        params
    }

    /// Every method with otherwise valid parameters for `populated()` (whose
    /// listener is `bound`).
    fn refusal_cases(bound: std::net::SocketAddr) -> Vec<(&'static str, Value)> {
        let disc = kvt_wire::nvme::DISCOVERY_NQN;
        vec![
            ("spdk_get_version", json!({})),
            ("rpc_get_methods", json!({"current": true})),
            ("framework_get_reactors", json!({})),
            ("nvmf_create_transport", json!({"trtype": "RDMA"})),
            ("nvmf_create_transport", json!({"trtype": "TCP"})),
            ("nvmf_get_transports", json!({"trtype": "TCP"})),
            (
                "nvmf_create_subsystem",
                json!({"nqn": "nqn.2026-11.io.kvtarget:new"}),
            ),
            ("nvmf_delete_subsystem", json!({"nqn": NQN})),
            ("nvmf_get_subsystems", json!({"nqn": NQN})),
            (
                "nvmf_subsystem_add_listener",
                json!({"nqn": NQN, "listen_address": listen_address(free_port())}),
            ),
            (
                "nvmf_subsystem_add_listener",
                json!({"nqn": disc, "listen_address": listen_address(free_port())}),
            ),
            (
                "nvmf_subsystem_remove_listener",
                json!({"nqn": NQN, "listen_address": listen_address(bound)}),
            ),
            (
                "nvmf_subsystem_add_ns",
                json!({"nqn": NQN, "namespace": {"bdev_name": "kv/spare"}}),
            ),
            ("nvmf_subsystem_remove_ns", json!({"nqn": NQN, "nsid": 1})),
            (
                "nvmf_subsystem_add_host",
                json!({"nqn": NQN, "host": OTHER}),
            ),
            (
                "nvmf_subsystem_remove_host",
                json!({"nqn": NQN, "host": HOST}),
            ),
            (
                "nvmf_subsystem_allow_any_host",
                json!({"nqn": NQN, "allow_any_host": true}),
            ),
            ("nvmf_subsystem_get_controllers", json!({"nqn": NQN})),
            ("nvmf_subsystem_get_qpairs", json!({"nqn": NQN})),
            ("nvmf_subsystem_get_listeners", json!({"nqn": NQN})),
            (
                "nvmf_subsystem_listener_set_ana_state",
                json!({"nqn": NQN, "listen_address": listen_address(bound), "ana_state": "inaccessible"}),
            ),
            (
                "nvmf_subsystem_set_ns_ana_group",
                json!({"nqn": NQN, "nsid": 1, "anagrpid": 2}),
            ),
            ("nvmf_get_stats", json!({})),
            ("bdev_get_bdevs", json!({"name": "kv/base"})),
            ("bdev_get_iostat", json!({"name": "kv/base"})),
            // bdev_lvol_create_lvstore needs a file: see
            // refused_create_lvstore_leaves_the_file_alone.
            ("bdev_lvol_get_lvstores", json!({"lvs_name": "kv"})),
            (
                "bdev_lvol_create",
                json!({"lvol_name": "new", "size_in_mib": 4, "lvs_name": "kv"}),
            ),
            ("bdev_lvol_delete", json!({"name": "kv/base"})),
            (
                "bdev_lvol_resize",
                json!({"name": "kv/base", "size_in_mib": 16}),
            ),
            ("kvtarget_get_pools", json!({"name": "kv"})),
            (
                "kvtarget_pool_set_gc",
                json!({"name": "kv", "paused": true, "max_foreground_qd": 3, "max_rate": 10.0}),
            ),
            ("kvtarget_save_config", json!({})),
            ("kvtarget_pool_check", json!({"name": "kv"})),
            ("kvtarget_pool_checkpoint", json!({"name": "kv"})),
            ("kvtarget_get_kv_namespaces", json!({})),
            ("kvtarget_get_cluster", json!({})),
            (
                "keyring_file_add_key",
                json!({"name": "k0", "path": "/nonexistent/k0"}),
            ),
            ("keyring_file_remove_key", json!({"name": "k0"})),
            ("nvmf_subsystem_set_keys", json!({"nqn": NQN, "host": HOST})),
            ("keyring_get_keys", json!({})),
            ("nvmf_ns_get_reservation", json!({"nqn": NQN, "nsid": 1})),
        ]
    }

    /// Every method, with otherwise valid parameters plus an unknown key:
    /// refused, naming the key, with nothing changed. Methods whose effect is
    /// outside `state` (ports, files) have their own tests below.
    #[test]
    fn unknown_parameters_are_refused_before_anything_changes() {
        // Valid as given: the unknown key is the only thing wrong. Each case
        // gets a fresh target (one that wrongly acted cannot hide the next),
        // and every failure is listed, not just the first.
        let n = refusal_cases(free_port()).len();
        let failures: Vec<String> = (0..n)
            .filter_map(|i| {
                let (ctl, bound) = populated();
                let (method, params) = refusal_cases(bound).swap_remove(i);
                check_refused(&ctl, method, with_bogus(params), BOGUS).err()
            })
            .collect();
        assert!(failures.is_empty(), "{failures:#?}");
        // A method added to the table without a case here fails this test.
        let covered: BTreeSet<&str> = refusal_cases(free_port())
            .iter()
            .map(|(m, _)| *m)
            .chain(["bdev_lvol_create_lvstore"])
            .collect();
        let all: BTreeSet<&str> = METHODS.iter().copied().collect();
        assert_eq!(covered, all, "methods without a refusal case");
    }

    /// Without `[cluster]`, `kvtarget_get_cluster` says so (ENOENT).
    #[test]
    fn get_cluster_without_a_cluster_is_not_found() {
        let (ctl, _) = populated();
        let e = ctl.call("kvtarget_get_cluster", json!({})).unwrap_err();
        assert_eq!(e.code, code::ENOENT, "{}", e.message);
        assert!(e.message.contains("[cluster]"), "{}", e.message);
    }

    /// Unknown keys inside the nested objects are refused by their full name.
    #[test]
    fn unknown_nested_parameters_are_refused_by_path() {
        let (ctl, _) = populated();
        let mut la = listen_address(free_port());
        la[BOGUS] = json!(1);
        refused(
            &ctl,
            "nvmf_subsystem_add_listener",
            json!({"nqn": NQN, "listen_address": la}),
            &format!("listen_address.{BOGUS}"),
        );
        refused(
            &ctl,
            "nvmf_subsystem_add_ns",
            json!({"nqn": NQN, "namespace": {"bdev_name": "kv/spare", BOGUS: 1}}),
            &format!("namespace.{BOGUS}"),
        );
        // Every unknown key is named, not just the first.
        let e = ctl
            .call(
                "nvmf_subsystem_add_host",
                json!({"nqn": NQN, "host": OTHER, "hots": 1, "tgt_nam": 2}),
            )
            .expect_err("two unknown keys");
        assert_eq!(e.message, "unknown parameters `hots`, `tgt_nam`");
        // Type errors and missing keys inside an object name the full path too.
        for (ns, msg) in [
            (
                json!({"bdev_name": 5}),
                "namespace.bdev_name: must be a string",
            ),
            (json!({"nsid": 1}), "namespace.bdev_name: required"),
            (json!("kv/spare"), "namespace: must be an object"),
        ] {
            let e = ctl
                .call(
                    "nvmf_subsystem_add_ns",
                    json!({"nqn": NQN, "namespace": ns}),
                )
                .expect_err(msg);
            assert_eq!((e.code, e.message.as_str()), (code::INVALID_PARAMS, msg));
        }
    }

    /// Numbers too large for their field are refused, not truncated (an NSID
    /// of 2^32 + 1 used to remove namespace 1).
    #[test]
    fn out_of_range_numbers_are_refused_not_truncated() {
        let (ctl, _) = populated();
        let cases = [
            (
                "nvmf_subsystem_remove_ns",
                json!({"nqn": NQN, "nsid": (1u64 << 32) + 1}),
                "nsid: 4294967297",
            ),
            (
                "bdev_lvol_create",
                json!({"lvol_name": "t", "size_in_mib": 4, "lvs_name": "kv", "block_size": (1u64 << 32) + 4096}),
                "block_size: 4294971392",
            ),
            (
                "bdev_lvol_create",
                json!({"lvol_name": "t", "size_in_mib": 4, "lvs_name": "kv", "block_size": 1024}),
                "block_size: 1024",
            ),
        ];
        for (method, params, msg) in cases {
            if let Err(e) = check_params_error(&ctl, method, params, msg) {
                panic!("{e}");
            }
        }
    }

    /// The port of a refused add_listener is not bound, for an NVM and for
    /// the discovery subsystem.
    #[test]
    fn refused_add_listener_binds_nothing() {
        let (ctl, _) = populated();
        for nqn in [NQN, kvt_wire::nvme::DISCOVERY_NQN] {
            let addr = free_port();
            refused(
                &ctl,
                "nvmf_subsystem_add_listener",
                with_bogus(json!({"nqn": nqn, "listen_address": listen_address(addr)})),
                BOGUS,
            );
            assert!(!ctl.listeners.contains(addr), "{nqn}: {addr} in the set");
            assert!(
                std::net::TcpListener::bind(addr).is_ok(),
                "{nqn}: {addr} is bound"
            );
        }
    }

    /// secure_channel: a TLS listener opens, the discovery log says TLS is
    /// required there, and one socket cannot be both TLS and plaintext.
    #[test]
    fn secure_channel_listeners_over_rpc() {
        let (ctl, _) = populated();
        let addr = free_port();
        let add = |secure: bool| {
            ctl.call(
                "nvmf_subsystem_add_listener",
                json!({"nqn": NQN, "listen_address": listen_address(addr), "secure_channel": secure}),
            )
        };
        assert!(add(true).is_ok());
        let l = ctl.listeners.snapshot();
        assert!(l.iter().any(|x| x.addr == addr && x.secure));
        let entries = ctl.target.discovery_entries("");
        assert!(entries
            .iter()
            .any(|e| e.trsvcid == addr.port().to_string() && e.treq == 1 && e.sectype == 2));
        // The same address for another subsystem, without TLS: refused, naming the field.
        let e = ctl
            .call(
                "nvmf_subsystem_add_listener",
                json!({"nqn": kvt_wire::nvme::DISCOVERY_NQN, "listen_address": listen_address(addr), "secure_channel": false}),
            )
            .err()
            .map(|e| e.message)
            .unwrap_or_default();
        assert!(
            e.contains("secure_channel: ") && e.contains("with TLS"),
            "{e}"
        );
        let e = ctl
            .call(
                "nvmf_subsystem_add_listener",
                json!({"nqn": NQN, "listen_address": {"trtype": "RDMA", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": "4420"}, "secure_channel": true}),
            )
            .err()
            .map(|e| e.message)
            .unwrap_or_default();
        assert!(e.contains("secure_channel: TLS is NVMe/TCP's"), "{e}");
    }

    /// An address the subsystem already lists (here without a socket, as
    /// when it listens there over the other transport) is refused before
    /// anything is bound or announced.
    #[test]
    fn duplicate_listener_is_refused_before_binding() {
        let (ctl, _) = populated();
        let addr = free_port();
        let s = ctl.target.find_subsystem(NQN).expect("the subsystem");
        if let Ok(mut l) = s.listen.write() {
            l.get_or_insert_with(Vec::new).push(addr);
        }
        let before = state(&ctl);
        let e = ctl
            .call(
                "nvmf_subsystem_add_listener",
                json!({"nqn": NQN, "listen_address": listen_address(addr)}),
            )
            .expect_err("a listed address");
        assert_eq!(e.code, code::EEXIST, "{}", e.message);
        assert_eq!(changed(&before, &state(&ctl)), Vec::<String>::new());
        assert!(!ctl.listeners.contains(addr));
        assert!(std::net::TcpListener::bind(addr).is_ok(), "{addr} is bound");
    }

    /// A refused remove_listener leaves the socket open.
    #[test]
    fn refused_remove_listener_keeps_listening() {
        let (ctl, addr) = populated();
        refused(
            &ctl,
            "nvmf_subsystem_remove_listener",
            with_bogus(json!({"nqn": NQN, "listen_address": listen_address(addr)})),
            BOGUS,
        );
        assert!(ctl.listeners.contains(addr));
        assert!(std::net::TcpListener::bind(addr).is_err(), "{addr} closed");
    }

    /// A refused bdev_lvol_create_lvstore neither formats nor locks the file.
    #[test]
    fn refused_create_lvstore_leaves_the_file_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("lvs.img");
        let f = std::fs::File::create(&path).expect("create");
        f.set_len(64 << 20).expect("set_len");
        drop(f);
        let (ctl, _) = populated();
        let path_str = path.to_str().expect("utf-8 path");
        refused(
            &ctl,
            "bdev_lvol_create_lvstore",
            with_bogus(json!({"bdev_name": path_str, "lvs_name": "extra"})),
            BOGUS,
        );
        assert_eq!(ctl.pools().len(), 1);
        let head = std::fs::read(&path).expect("read");
        assert!(head.iter().all(|&b| b == 0), "the file was written");
        kvt_pool::lock_pool(&path, true).expect("the file is not locked");
    }

    /// A refused kvtarget_save_config writes no file.
    #[test]
    fn refused_save_config_writes_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("saved.toml");
        let (ctl, _) = populated();
        refused(
            &ctl,
            "kvtarget_save_config",
            with_bogus(json!({"path": path.to_str().expect("utf-8 path")})),
            BOGUS,
        );
        assert!(!path.exists(), "the configuration was written");
        assert!(!dir.path().join("saved.toml.tmp").exists());
    }

    /// The cases above are valid without the unknown key: each does change
    /// the target (so `refused` is not passing for another reason).
    #[test]
    fn the_refused_calls_work_without_the_unknown_key() {
        let (ctl, bound) = populated();
        let cases: Vec<(&str, Value)> = vec![
            (
                "nvmf_create_subsystem",
                json!({"nqn": "nqn.2026-11.io.kvtarget:new"}),
            ),
            (
                "nvmf_subsystem_add_listener",
                json!({"nqn": NQN, "listen_address": listen_address(free_port())}),
            ),
            (
                "nvmf_subsystem_add_ns",
                json!({"nqn": NQN, "namespace": {"bdev_name": "kv/spare"}}),
            ),
            (
                "nvmf_subsystem_add_host",
                json!({"nqn": NQN, "host": OTHER}),
            ),
            (
                "nvmf_subsystem_remove_host",
                json!({"nqn": NQN, "host": HOST}),
            ),
            (
                "nvmf_subsystem_allow_any_host",
                json!({"nqn": NQN, "allow_any_host": true}),
            ),
            (
                "bdev_lvol_create",
                json!({"lvol_name": "new", "size_in_mib": 4, "lvs_name": "kv"}),
            ),
            (
                "bdev_lvol_resize",
                json!({"name": "kv/base", "size_in_mib": 16}),
            ),
            ("bdev_lvol_delete", json!({"name": "kv/base"})),
            (
                "kvtarget_pool_set_gc",
                json!({"name": "kv", "paused": true, "max_foreground_qd": 3, "max_rate": 10.0}),
            ),
            (
                "nvmf_subsystem_remove_listener",
                json!({"nqn": NQN, "listen_address": listen_address(bound)}),
            ),
            ("nvmf_subsystem_remove_ns", json!({"nqn": NQN, "nsid": 1})),
            ("nvmf_delete_subsystem", json!({"nqn": NQN})),
        ];
        for (method, params) in cases {
            let before = state(&ctl);
            ok(&ctl, method, params);
            assert_ne!(state(&ctl), before, "{method} changed nothing");
        }
    }

    /// Keys by name over RPC: files checked, names (never key text) listed, host
    /// entries holding them, and removal with the host.
    #[test]
    fn dhchap_keys_and_hosts_over_rpc() {
        use std::os::unix::fs::PermissionsExt;
        let (ctl, _) = populated();
        let dir = tempfile::tempdir().expect("tempdir");
        let secret = kvt_auth::DhchapSecret::new(&[7; 32], None).expect("secret");
        let text = secret.encode();
        let path = dir.path().join("k0");
        std::fs::write(&path, text.as_str()).expect("write key");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let p = path.display().to_string();
        ok(
            &ctl,
            "keyring_file_add_key",
            json!({"name": "k0", "path": p}),
        );
        let e = ctl
            .call("keyring_file_add_key", json!({"name": "k0", "path": p}))
            .expect_err("duplicate");
        assert_eq!(e.code, code::EEXIST);
        let e = ctl
            .call(
                "keyring_file_add_key",
                json!({"name": "k1", "path": "relative"}),
            )
            .expect_err("relative path");
        assert!(e.message.starts_with("path: "), "{}", e.message);
        // A controller key needs a host key; unknown keys are named.
        let e = ctl
            .call(
                "nvmf_subsystem_add_host",
                json!({"nqn": NQN, "host": OTHER, "dhchap_ctrlr_key": "k0"}),
            )
            .expect_err("ctrlr key alone");
        assert!(e.message.starts_with("dhchap_ctrlr_key: "), "{}", e.message);
        let e = ctl
            .call(
                "nvmf_subsystem_add_host",
                json!({"nqn": NQN, "host": OTHER, "dhchap_key": "nope"}),
            )
            .expect_err("unknown key");
        assert!(e.message.contains("no key `nope`"), "{}", e.message);
        ok(
            &ctl,
            "nvmf_subsystem_add_host",
            json!({"nqn": NQN, "host": OTHER, "dhchap_key": "k0", "dhchap_ctrlr_key": "k0"}),
        );
        let subs = ok(&ctl, "nvmf_get_subsystems", json!({}));
        let listing = subs.to_string();
        assert!(
            !listing.contains(text.trim_end_matches(':')),
            "key text listed"
        );
        let host = subs
            .as_array()
            .and_then(|a| a.iter().find(|s| s["nqn"] == NQN))
            .and_then(|s| s["hosts"].as_array())
            .and_then(|h| h.iter().find(|h| h["nqn"] == OTHER))
            .cloned()
            .expect("host listed");
        assert_eq!(
            (
                host["dhchap_key"].as_str(),
                host["dhchap_ctrlr_key"].as_str()
            ),
            (Some("k0"), Some("k0"))
        );
        let keys = ok(&ctl, "keyring_get_keys", json!({}));
        assert_eq!(keys[0]["name"], "k0");
        assert_eq!(keys[0]["refcnt"], 2, "the host entry holds it twice");
        assert!(!keys.to_string().contains(text.trim_end_matches(':')));
        let s = ctl.target.find_subsystem(NQN).expect("subsystem");
        assert!(s.host_keys(OTHER).is_some());
        // The saved configuration names the key and its file, and loads.
        let saved = ok(&ctl, "kvtarget_save_config", json!({}));
        let toml = saved["toml"].as_str().expect("toml").to_string();
        assert!(toml.contains(r#"dhchap_key = "k0""#), "{toml}");
        assert!(toml.contains(&format!("path = \"{p}\"")), "{toml}");
        assert!(!toml.contains(text.trim_end_matches(':')));
        // Rotation: the controller key left out is cleared; no key at all, and
        // the host no longer authenticates.
        ok(
            &ctl,
            "nvmf_subsystem_set_keys",
            json!({"nqn": NQN, "host": OTHER, "dhchap_key": "k0"}),
        );
        assert!(s
            .host_keys(OTHER)
            .is_some_and(|k| k.dhchap_ctrlr_key.is_none()));
        let e = ctl
            .call(
                "nvmf_subsystem_set_keys",
                json!({"nqn": NQN, "host": "nqn.2014-08.org.nvmexpress:uuid:nobody", "dhchap_key": "k0"}),
            )
            .expect_err("unlisted host");
        assert_eq!(e.code, code::ENOENT);
        // The key may leave the ring; the host keeps it until it goes too.
        ok(&ctl, "keyring_file_remove_key", json!({"name": "k0"}));
        assert!(s.host_keys(OTHER).is_some());
        let saved = ok(&ctl, "kvtarget_save_config", json!({}));
        assert!(saved["toml"]
            .as_str()
            .is_some_and(|t| t.contains("[[keys]]")));
        ok(
            &ctl,
            "nvmf_subsystem_remove_host",
            json!({"nqn": NQN, "host": OTHER}),
        );
        assert!(s.host_keys(OTHER).is_none());
        let e = ctl
            .call("keyring_file_remove_key", json!({"name": "k0"}))
            .expect_err("gone");
        assert_eq!(e.code, code::ENOENT);
    }

    /// Parameters read with serde into the operations' structs keep this
    /// reader's errors: the key, "required", the type wanted.
    #[test]
    fn typed_parameters_name_the_key() {
        let (ctl, _) = populated();
        let new = "nqn.2026-11.io.kvtarget:typed";
        for (method, params, msg) in [
            (
                "nvmf_create_subsystem",
                json!({"nqn": new, "serial_number": 5}),
                "serial_number: must be a string",
            ),
            (
                "nvmf_create_subsystem",
                json!({"nqn": new, "allow_any_host": "yes"}),
                "allow_any_host: must be true or false",
            ),
            ("nvmf_create_subsystem", json!({}), "nqn: required"),
            (
                "nvmf_subsystem_add_host",
                json!({"nqn": NQN}),
                "host: required",
            ),
            (
                "keyring_file_add_key",
                json!({"name": "k", "path": ["x"]}),
                "path: must be a string",
            ),
            (
                "nvmf_subsystem_remove_ns",
                json!({"nqn": NQN, "nsid": -1}),
                "nsid: must be a non-negative integer",
            ),
            (
                "nvmf_subsystem_add_listener",
                json!({"nqn": NQN, "listen_address": {"trtype": 5, "traddr": "127.0.0.1"}}),
                "listen_address.trtype: must be a string",
            ),
            (
                "nvmf_subsystem_add_listener",
                json!({"nqn": NQN, "listen_address": {"trtype": "TCP"}}),
                "listen_address.traddr: required",
            ),
            (
                "nvmf_subsystem_allow_any_host",
                json!({"nqn": NQN}),
                "allow_any_host: required",
            ),
            (
                "kvtarget_pool_set_gc",
                json!({"name": "kv", "max_rate": "fast"}),
                "max_rate: must be a number",
            ),
            (
                "bdev_lvol_create",
                json!({"lvol_name": "t", "lvs_name": "kv"}),
                "size_in_mib: required",
            ),
        ] {
            let e = ctl.call(method, params).expect_err(msg);
            assert_eq!((e.code, e.message.as_str()), (code::INVALID_PARAMS, msg));
        }
    }

    /// `ptpl_file` of nvmf_subsystem_add_ns loads the file, shows in
    /// nvmf_ns_get_reservation and survives kvtarget_save_config.
    #[test]
    fn ptpl_file_and_get_reservation() {
        use kvt_nvmf::reservation::{ptpl, HostId, Registrant, ResvState};
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("ns2.json");
        let state = ResvState {
            registrants: vec![Registrant {
                host: HostId::extended([0xAB; 16]),
                key: 42,
                cntlid: 0xFFFF,
            }],
            ptpl: true,
            ..ResvState::default()
        };
        ptpl::save(&file, &ptpl::PtplFile::of(&state, &[0; 16])).expect("save");
        let (ctl, _) = populated();
        ok(
            &ctl,
            "nvmf_subsystem_add_ns",
            json!({"nqn": NQN, "namespace": {"bdev_name": "kv/spare", "nsid": 2, "ptpl_file": file}}),
        );
        let r = ok(
            &ctl,
            "nvmf_ns_get_reservation",
            json!({"nqn": NQN, "nsid": 2}),
        );
        assert_eq!(r["ptpl"], true);
        assert_eq!(r["registrants"][0]["rkey"], 42);
        assert_eq!(r["registrants"][0]["hostid"], "ab".repeat(16));
        assert_eq!(r["ptpl_file"], file.display().to_string());
        let saved = ok(&ctl, "kvtarget_save_config", json!({}));
        let text = saved["toml"].as_str().expect("toml");
        let cfg = kvt_config::Config::parse(text).expect("loads");
        let ns = cfg
            .subsystems
            .iter()
            .flat_map(|s| &s.namespaces)
            .find(|n| n.nsid == 2);
        assert_eq!(ns.and_then(|n| n.ptpl_file.clone()), Some(file.clone()));
        let e = ctl
            .call("nvmf_ns_get_reservation", json!({"nqn": NQN, "nsid": 9}))
            .expect_err("no namespace 9");
        assert_eq!(e.code, code::ENOENT);
        std::fs::write(dir.path().join("bad.json"), b"{").expect("write");
        let e = ctl
            .call(
                "nvmf_subsystem_add_ns",
                json!({"nqn": NQN, "namespace": {"bdev_name": "kv/base", "ptpl_file": dir.path().join("bad.json")}}),
            )
            .expect_err("a bad PTPL file");
        assert!(
            e.message.starts_with("namespace.ptpl_file: "),
            "{}",
            e.message
        );
    }
}
