//! `nvmf_subsystem_*` methods: a subsystem's listeners, namespaces, hosts,
//! controllers and queue pairs.

use super::listen_address::{listen_address, ListenAddressParams};
use super::{act, not_found, unsupported, Control, Params, Parsed, TgtName};
use crate::rpc::{code, RpcError};
use kvt_config::ops::AddHost;
use kvt_config::KvOptions;
use kvt_nvmf::{Namespace, SubsystemKind};
use kvt_pool::channel::VolumeDevice;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Control {
    /// Adds a listener the RPC just opened to the target's list (discovery log
    /// entries, port IDs).
    fn announce_listener(
        &self,
        addr: std::net::SocketAddr,
        discovery_only: bool,
        rdma: bool,
        secure: bool,
    ) {
        if let Ok(mut l) = self.target.listeners.write() {
            let portid = l.iter().map(|x| x.portid).max().unwrap_or(0) + 1;
            l.push(kvt_nvmf::Listener {
                addr,
                discovery_only,
                portid,
                rdma,
                secure,
            });
        }
        let transport = if rdma { "rdma" } else { "tcp" };
        tracing::info!(listener = %addr, transport, secure_channel = secure, "rpc: listening");
    }
}

/// `nvmf_subsystem_add_ns`'s parameters.
#[derive(Deserialize)]
struct AddNs {
    nqn: String,
    #[allow(dead_code)]
    tgt_name: Option<String>,
    namespace: NsParams,
}

/// SPDK's `namespace` object, with kvtarget's own `write_cache` and KV
/// options (`on_full`, `ttl_secs`, `trim`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NsParams {
    bdev_name: String,
    nsid: Option<u64>,
    nguid: Option<String>,
    eui64: Option<String>,
    uuid: Option<String>,
    write_cache: Option<bool>,
    on_full: Option<kvt_config::OnFull>,
    ttl_secs: Option<u64>,
    trim: Option<bool>,
    ptpl_file: Option<std::path::PathBuf>,
    anagrpid: Option<u64>,
    no_auto_visible: Option<Value>,
    hide_metadata: Option<Value>,
}

/// The NSID `nvmf_subsystem_add_ns` asks for (None: the lowest free one),
/// with the identifiers kvtarget does not take from the caller refused.
fn requested_nsid(ns: &NsParams) -> Result<Option<u32>, RpcError> {
    // None: the lowest free NSID (SPDK: absent or 0).
    let nsid = match ns.nsid {
        Some(0) | None => None,
        Some(n) if n > kvt_nvmf::admin::MAX_NAMESPACES as u64 => {
            return Err(RpcError::params(format!(
                "namespace.nsid: must be 1..={}",
                kvt_nvmf::admin::MAX_NAMESPACES
            )))
        }
        Some(n) => Some(n as u32),
    };
    for (k, v) in [
        ("nguid", &ns.nguid),
        ("eui64", &ns.eui64),
        ("uuid", &ns.uuid),
    ] {
        if v.is_some() {
            return Err(RpcError::params(format!(
                "namespace.{k}: kvtarget uses the volume's persistent identifier"
            )));
        }
    }
    Ok(nsid)
}

/// The NSID a new namespace of subsystem `nqn` gets: `nsid` if it is free,
/// or the lowest free one.
fn free_nsid(s: &kvt_nvmf::Subsystem, nqn: &str, nsid: Option<u32>) -> Result<u32, RpcError> {
    let existing: Vec<u32> = s.namespace_snapshot().iter().map(|n| n.nsid).collect();
    let nsid = match nsid {
        None => (1..=kvt_nvmf::admin::MAX_NAMESPACES)
            .find(|i| !existing.contains(i))
            .ok_or_else(|| RpcError::new(code::ENOSPC, format!("{nqn} has no free NSID")))?,
        Some(n) => n,
    };
    if existing.contains(&nsid) {
        return Err(RpcError::new(
            code::EEXIST,
            format!("NSID {nsid} is already in use in {nqn}"),
        ));
    }
    Ok(nsid)
}

pub(super) fn add_ns(p: &mut Params) -> Parsed {
    let AddNs {
        nqn, namespace: ns, ..
    } = p.parse()?;
    let nsid = requested_nsid(&ns)?;
    let bdev = ns.bdev_name;
    let ptpl_file = ns.ptpl_file;
    // kvtarget's own: false serves the volume without a volatile write cache.
    let write_cache = ns.write_cache.unwrap_or(true);
    // kvtarget's own, for KV volumes: the cache policy when full, and a TTL.
    let kv_options = KvOptions {
        on_full: ns.on_full,
        ttl_secs: ns.ttl_secs,
        trim: ns.trim,
    };
    kv_options
        .validate("namespace")
        .map_err(|e| RpcError::params(e.to_string()))?;
    let ana_group = super::ana::add_ns_group(ns.anagrpid)?;
    unsupported("namespace.no_auto_visible", &ns.no_auto_visible)?;
    unsupported("namespace.hide_metadata", &ns.hide_metadata)?;
    act(move |ctl| {
        let s = ctl.nvm_subsystem(&nqn)?;
        let (pool, vol) = ctl.volume(&bdev)?;
        if let Some((other, id)) = ctl.served_by(&vol.desc.uuid) {
            return Err(RpcError::new(
                code::EBUSY,
                format!("bdev {bdev} is already namespace {id} of {other}"),
            ));
        }
        let nsid = free_nsid(&s, &nqn, nsid)?;
        let dev = VolumeDevice::new(pool, vol.clone());
        let mut namespace =
            Namespace::new(&nqn, nsid, dev, vol.desc.block_size).with_write_cache(write_cache);
        if let Some(path) = ptpl_file {
            namespace = namespace
                .with_ptpl_file(path)
                .map_err(|e| RpcError::params(format!("namespace.ptpl_file: {e}")))?;
        }
        if let Some(g) = ana_group {
            namespace = namespace.with_ana_group(g);
        }
        match &vol.kv {
            Some(kv) => {
                kv.set_settings(kv_options.settings());
                namespace = namespace.with_kv(kv.clone());
            }
            None if kv_options.is_set() => {
                return Err(RpcError::params(format!(
                    "namespace.on_full, namespace.ttl_secs, namespace.trim: bdev {bdev} is not a KV volume"
                )));
            }
            None => {}
        }
        s.add_namespace(Arc::new(namespace))
            .map_err(|e| RpcError::new(code::EEXIST, e.to_string()))?;
        tracing::info!(nqn = %nqn, nsid, bdev = %bdev, "rpc: namespace added");
        Ok(json!(nsid))
    })
}

/// `nvmf_subsystem_remove_ns`'s parameters.
#[derive(Deserialize)]
struct RemoveNs {
    nqn: String,
    nsid: u64,
    #[allow(dead_code)]
    tgt_name: Option<String>,
}

pub(super) fn remove_ns(p: &mut Params) -> Parsed {
    let RemoveNs { nqn, nsid, .. } = p.parse()?;
    // Checked, not truncated: 2^32 + 1 must not name namespace 1.
    let nsid = u32::try_from(nsid)
        .map_err(|_| RpcError::params(format!("nsid: {nsid} is not a namespace ID")))?;
    act(move |ctl| {
        let s = ctl.nvm_subsystem(&nqn)?;
        kvt_config::apply::remove_namespace(&s, nsid).map_err(apply_error)?;
        tracing::info!(nqn = %nqn, nsid, "rpc: namespace removed");
        Ok(Value::Bool(true))
    })
}

/// `nvmf_subsystem_add_listener`'s and `_remove_listener`'s parameters.
#[derive(Deserialize)]
struct ListenerParams {
    nqn: String,
    listen_address: ListenAddressParams,
    #[allow(dead_code)]
    tgt_name: Option<String>,
    ana_state: Option<String>,
    #[allow(dead_code)]
    sock_impl: Option<String>,
    #[allow(dead_code)]
    numa_id: Option<Value>,
    secure_channel: Option<bool>,
}

pub(super) fn add_listener(p: &mut Params) -> Parsed {
    let l: ListenerParams = p.parse()?;
    let nqn = l.nqn;
    let (addr, rdma) = listen_address(l.listen_address)?;
    let secure = l.secure_channel.unwrap_or(false);
    let ana_state = l.ana_state;
    if let Some(st) = &ana_state {
        kvt_nvmf::ana::AnaState::parse(st).map_err(super::ana::ana_error)?;
    }
    if secure && rdma {
        return Err(RpcError::params(
            "secure_channel: TLS is NVMe/TCP's; an RDMA listener cannot require it",
        ));
    }
    act(move |ctl| {
        let s = ctl.subsystem(&nqn)?;
        let discovery = s.kind == SubsystemKind::Discovery;
        // A duplicate is refused before anything is bound or announced. The
        // list holds addresses only: the same address over the other transport
        // counts as a duplicate too.
        let listed = |l: &Option<Vec<std::net::SocketAddr>>| {
            l.as_ref().is_some_and(|list| list.contains(&addr))
        };
        if !discovery && s.listen.read().map(|l| listed(&l)).unwrap_or(false) {
            return Err(RpcError::new(
                code::EEXIST,
                format!("{nqn} already listens on {addr}"),
            ));
        }
        if rdma {
            if !ctl.rdma.is_started() {
                return Err(RpcError::params(
                    "transport RDMA does not exist: call nvmf_create_transport with trtype RDMA first",
                ));
            }
            if !ctl.rdma.listeners.contains(addr) {
                let l = kvt_transport::rdma::listen(addr, false)
                    .map_err(|e| RpcError::new(code::INTERNAL_ERROR, e.to_string()))?;
                let bound = l.addr;
                ctl.rdma.listeners.add(l);
                ctl.announce_listener(bound, false, true, false);
            }
        } else if let Some(l) = ctl.listeners.snapshot().iter().find(|l| l.addr == addr) {
            // One socket, one kind: TLS or plaintext for every subsystem on it.
            if l.secure != secure {
                return Err(RpcError::params(format!(
                    "secure_channel: {addr} already listens {}",
                    if l.secure { "with TLS" } else { "without TLS" }
                )));
            }
        } else {
            let spec = kvt_transport::bind(addr, discovery, secure)
                .map_err(|e| RpcError::new(code::INTERNAL_ERROR, e.to_string()))?;
            let bound = spec.addr;
            ctl.listeners.add(spec);
            ctl.announce_listener(bound, discovery, false, secure);
        }
        if !discovery {
            let mut l = s
                .listen
                .write()
                .map_err(|_| RpcError::new(code::INTERNAL_ERROR, "listener list poisoned"))?;
            // Not listed (checked above; the edit lock keeps it so).
            if let Some(list) = l.as_mut() {
                list.push(addr);
            }
            drop(l);
            super::ana::listener_added(&s, addr, ana_state.as_deref())?;
        }
        ctl.target.genctr.fetch_add(1, Ordering::Relaxed);
        Ok(Value::Bool(true))
    })
}

/// `nvmf_subsystem_remove_listener`'s parameters.
#[derive(Deserialize)]
struct RemoveListener {
    nqn: String,
    listen_address: ListenAddressParams,
    #[allow(dead_code)]
    tgt_name: Option<String>,
}

pub(super) fn remove_listener(p: &mut Params) -> Parsed {
    let l: RemoveListener = p.parse()?;
    let nqn = l.nqn;
    let (addr, rdma) = listen_address(l.listen_address)?;
    act(move |ctl| {
        let s = ctl.subsystem(&nqn)?;
        if s.kind == SubsystemKind::Nvm {
            let all = ctl.target.nvm_listener_addrs();
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
            drop(l);
            super::ana::listener_removed(&s, addr);
        }
        // Stop listening when nothing is reachable there any more. Connections
        // already made stay up.
        let subs = ctl
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
            let present = ctl
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
                    ctl.rdma.listeners.remove(addr);
                } else {
                    ctl.listeners.remove(addr);
                }
                if let Ok(mut l) = ctl.target.listeners.write() {
                    l.retain(|x| x.addr != addr || x.rdma != rdma);
                }
                tracing::info!(listener = %addr, "rpc: stopped listening");
            }
        }
        ctl.target.genctr.fetch_add(1, Ordering::Relaxed);
        Ok(Value::Bool(true))
    })
}

pub(super) fn add_host(p: &mut Params) -> Parsed {
    let AddHost {
        nqn,
        host,
        dhchap_key,
        dhchap_ctrlr_key,
        psk,
    } = p.parse()?;
    let _: TgtName = p.parse()?;
    if dhchap_ctrlr_key.is_some() && dhchap_key.is_none() {
        return Err(RpcError::params(
            "dhchap_ctrlr_key: needs dhchap_key (the host authenticates first)",
        ));
    }
    kvt_wire::nqn::validate_nqn(&host).map_err(|e| RpcError::params(format!("host: {e}")))?;
    let op = AddHost {
        nqn,
        host,
        dhchap_key,
        dhchap_ctrlr_key,
        psk,
    };
    act(move |ctl| {
        let s = ctl.nvm_subsystem(&op.nqn)?;
        kvt_config::apply::add_host(&ctl.target, &s, &op).map_err(apply_error)?;
        let key = |k: &Option<String>| k.clone().unwrap_or_default();
        tracing::info!(nqn = %op.nqn, host = %op.host, dhchap_key = key(&op.dhchap_key), psk = key(&op.psk), "rpc: host allowed");
        Ok(Value::Bool(true))
    })
}

/// A refused change as an RPC error: what does not exist is not found, what
/// exists already EEXIST, a key of the wrong kind a bad parameter.
pub(super) fn apply_error(e: kvt_config::apply::ApplyError) -> RpcError {
    use kvt_auth::KeyError;
    use kvt_config::apply::ApplyError;
    use kvt_nvmf::auth::HostKeyError;
    match e {
        ApplyError::SubsystemExists(_) | ApplyError::HostExists { .. } => {
            RpcError::new(code::EEXIST, e.to_string())
        }
        ApplyError::NoHost { .. } | ApplyError::NoNamespace { .. } | ApplyError::RemoveKey(_) => {
            not_found(e.to_string())
        }
        ApplyError::HostKey(k) | ApplyError::Psk(k) => match k {
            HostKeyError::Missing { .. } => not_found(k.to_string()),
            _ => RpcError::params(k.to_string()),
        },
        ApplyError::LoadKey(KeyError::Name) => RpcError::params(format!("name: {e}")),
        ApplyError::LoadKey(_) => RpcError::params(format!("path: {e}")),
        ApplyError::AddKey(KeyError::Exists(_)) => RpcError::new(code::EEXIST, e.to_string()),
        ApplyError::Poisoned | ApplyError::AddKey(_) => {
            RpcError::new(code::INTERNAL_ERROR, e.to_string())
        }
    }
}

/// `nvmf_subsystem_set_keys`'s parameters.
#[derive(Deserialize)]
struct SetKeys {
    nqn: String,
    host: String,
    dhchap_key: Option<String>,
    dhchap_ctrlr_key: Option<String>,
    #[allow(dead_code)]
    tgt_name: Option<String>,
}

/// `nvmf_subsystem_remove_host`'s parameters.
#[derive(Deserialize)]
struct RemoveHost {
    nqn: String,
    host: String,
    #[allow(dead_code)]
    tgt_name: Option<String>,
    #[allow(dead_code)]
    timeout_ms: Option<u64>,
}

/// `nvmf_subsystem_allow_any_host`'s parameters.
#[derive(Deserialize)]
struct AllowAnyHost {
    nqn: String,
    allow_any_host: bool,
    #[allow(dead_code)]
    tgt_name: Option<String>,
}

/// A listed host's DH-HMAC-CHAP keys replaced (key rotation), as SPDK's
/// `nvmf_subsystem_set_keys`: the keys given become the host's, one left out is
/// cleared (neither: the host no longer authenticates). Queues already
/// authenticated carry on; the next Connect or re-authentication uses the new keys.
pub(super) fn set_keys(p: &mut Params) -> Parsed {
    let SetKeys {
        nqn,
        host,
        dhchap_key,
        dhchap_ctrlr_key,
        ..
    } = p.parse()?;
    if dhchap_ctrlr_key.is_some() && dhchap_key.is_none() {
        return Err(RpcError::params(
            "dhchap_ctrlr_key: needs dhchap_key (the host authenticates first)",
        ));
    }
    act(move |ctl| {
        let s = ctl.nvm_subsystem(&nqn)?;
        let (key, ctrlr_key) = (dhchap_key.as_deref(), dhchap_ctrlr_key.as_deref());
        kvt_config::apply::set_keys(&ctl.target, &s, &host, key, ctrlr_key).map_err(apply_error)?;
        tracing::info!(nqn = %nqn, host = %host, dhchap_key = dhchap_key.as_deref().unwrap_or(""), dhchap_ctrlr_key = dhchap_ctrlr_key.as_deref().unwrap_or(""), "rpc: host keys set");
        Ok(Value::Bool(true))
    })
}

pub(super) fn remove_host(p: &mut Params) -> Parsed {
    let RemoveHost { nqn, host, .. } = p.parse()?;
    act(move |ctl| {
        let s = ctl.nvm_subsystem(&nqn)?;
        let n = kvt_config::apply::remove_host(&ctl.target, &s, &host).map_err(apply_error)?;
        tracing::info!(nqn = %nqn, host = %host, disconnected = n, "rpc: host removed");
        Ok(Value::Bool(true))
    })
}

pub(super) fn allow_any_host(p: &mut Params) -> Parsed {
    let AllowAnyHost {
        nqn,
        allow_any_host: any,
        ..
    } = p.parse()?;
    act(move |ctl| {
        let s = ctl.nvm_subsystem(&nqn)?;
        kvt_config::apply::allow_any_host(&ctl.target, &s, any);
        Ok(Value::Bool(true))
    })
}

pub(super) fn get_controllers(p: &mut Params) -> Parsed {
    let super::Nqn { nqn, .. } = p.parse()?;
    act(move |ctl| {
        let s = ctl.subsystem(&nqn)?;
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
                            "hostid": kvt_wire::ident::uuid_text(&c.hostid),
                            "num_io_qpairs": c.connected_io_queues(),
                            "peer": c.peer,
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(Value::Array(ctrls))
    })
}

pub(super) fn get_qpairs(p: &mut Params) -> Parsed {
    let super::Nqn { nqn, .. } = p.parse()?;
    act(move |ctl| {
        let s = ctl.subsystem(&nqn)?;
        let mut ctrls: Vec<_> = s
            .controllers
            .lock()
            .map(|c| c.values().cloned().collect())
            .unwrap_or_default();
        ctrls.sort_by_key(|c: &Arc<kvt_nvmf::Controller>| c.cntlid);
        let mut out = Vec::new();
        for c in ctrls {
            let stats = c.queue_stats();
            for qid in c.queue_ids() {
                let mut q = json!({
                    "cntlid": c.cntlid,
                    "qid": qid,
                    "state": if c.is_failed() { "deleting" } else { "active" },
                    "hostnqn": c.hostnqn,
                    "trtype": "TCP",
                    "admin_peer_address": c.peer,
                });
                // SPDK's "auth" object, for queues that authenticated (or are).
                let auth = stats
                    .iter()
                    .find(|s| s.qid == qid)
                    .and_then(|s| s.auth.lock().ok().and_then(|a| a.clone()));
                if let Some(a) = auth {
                    q["auth"] = json!({
                        "state": a.state,
                        "digest": a.digest.unwrap_or("unknown"),
                        "dhgroup": a.dhgroup.unwrap_or("unknown"),
                    });
                }
                out.push(q);
            }
        }
        Ok(Value::Array(out))
    })
}
