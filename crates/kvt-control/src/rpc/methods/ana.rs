//! Asymmetric Namespace Access methods, SPDK's names and shapes:
//! `nvmf_subsystem_listener_set_ana_state`, `nvmf_subsystem_get_listeners`
//! (with `ana_states`), `nvmf_subsystem_set_ns_ana_group`. The model is
//! `kvt_nvmf::ana`.

use super::listen_address::{listen_address, ListenAddressParams};
use super::{act, not_found, Control, Params, Parsed};
use crate::rpc::RpcError;
use kvt_nvmf::ana::{self, AnaError};
use kvt_nvmf::{Subsystem, SubsystemKind};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;

/// An ANA refusal as a JSON-RPC error naming its parameter.
pub(super) fn ana_error(e: AnaError) -> RpcError {
    RpcError::params(format!("{}: {e}", e.field()))
}

/// `nvmf_subsystem_listener_set_ana_state`'s parameters.
#[derive(Deserialize)]
struct SetAnaState {
    nqn: String,
    listen_address: ListenAddressParams,
    ana_state: String,
    anagrpid: Option<u64>,
    #[allow(dead_code)]
    tgt_name: Option<String>,
}

pub(super) fn listener_set_ana_state(p: &mut Params) -> Parsed {
    let SetAnaState {
        nqn,
        listen_address: la,
        ana_state,
        anagrpid,
        ..
    } = p.parse()?;
    let (addr, _rdma) = listen_address(la)?;
    ana::AnaState::parse(&ana_state).map_err(ana_error)?;
    if let Some(g) = anagrpid {
        ana::check_group(g).map_err(ana_error)?;
    }
    act(move |ctl| {
        let s = ctl.nvm_subsystem(&nqn)?;
        if !ctl.listens_on(&s, addr) {
            return Err(ana_error(AnaError::NoListener(addr)));
        }
        ana::set_listener_state(&s, addr, &ana_state, anagrpid).map_err(ana_error)?;
        tracing::info!(nqn = %nqn, listener = %addr, ana_state = %ana_state, anagrpid = ?anagrpid, "rpc: ANA state set");
        Ok(Value::Bool(true))
    })
}

/// `nvmf_subsystem_get_listeners`'s and the like's parameters.
#[derive(Deserialize)]
struct Nqn {
    nqn: String,
    #[allow(dead_code)]
    tgt_name: Option<String>,
}

pub(super) fn get_listeners(p: &mut Params) -> Parsed {
    let Nqn { nqn, .. } = p.parse()?;
    act(move |ctl| {
        let s = ctl.subsystem(&nqn)?;
        let listeners = ctl
            .target
            .listeners
            .read()
            .map(|l| l.clone())
            .unwrap_or_default();
        let discovery = s.kind == SubsystemKind::Discovery;
        let out: Vec<Value> = listeners
            .iter()
            .filter(|l| l.discovery_only == discovery && s.listener_allowed(l.addr))
            .map(|l| {
                let mut v = json!({"address": {
                    "trtype": if l.rdma { "RDMA" } else { "TCP" },
                    "adrfam": if l.addr.is_ipv4() { "IPv4" } else { "IPv6" },
                    "traddr": l.addr.ip().to_string(),
                    "trsvcid": l.addr.port().to_string(),
                }});
                if s.ana.is_reporting() {
                    v["ana_states"] = ana_states(&s, l.addr);
                }
                v
            })
            .collect();
        Ok(Value::Array(out))
    })
}

/// One listener's states, SPDK's shape (`[{"ana_group", "ana_state"}]`),
/// for groups 1 up to the highest one in use (a namespace's, or one set).
fn ana_states(s: &Subsystem, listener: std::net::SocketAddr) -> Value {
    let path = s.ana.find(listener);
    let in_use = s
        .namespace_snapshot()
        .iter()
        .map(|n| n.ana_group.load(Ordering::Acquire).max(n.nsid))
        .max()
        .unwrap_or(1);
    let set = path
        .as_ref()
        .and_then(|p| p.changed_groups().last().map(|(g, _)| *g))
        .unwrap_or(1);
    let top = in_use.max(set);
    let states: Vec<Value> = (1..=top)
        .map(|g| {
            let st = path
                .as_ref()
                .map_or(ana::AnaState::Optimized, |p| p.state(g));
            json!({"ana_group": g, "ana_state": st.name()})
        })
        .collect();
    Value::Array(states)
}

/// `nvmf_subsystem_set_ns_ana_group`'s parameters.
#[derive(Deserialize)]
struct SetNsAnaGroup {
    nqn: String,
    nsid: u64,
    anagrpid: u64,
    #[allow(dead_code)]
    tgt_name: Option<String>,
}

pub(super) fn set_ns_ana_group(p: &mut Params) -> Parsed {
    let SetNsAnaGroup {
        nqn,
        nsid,
        anagrpid,
        ..
    } = p.parse()?;
    let nsid = u32::try_from(nsid)
        .map_err(|_| RpcError::params(format!("nsid: {nsid} is not a namespace ID")))?;
    ana::check_group(anagrpid).map_err(ana_error)?;
    act(move |ctl| {
        let s = ctl.nvm_subsystem(&nqn)?;
        if !s.ana.is_reporting() {
            return Err(ana_error(AnaError::NotReporting));
        }
        if !s.set_ns_ana_group(nsid, anagrpid).map_err(ana_error)? {
            return Err(not_found(format!("nsid: {nqn} has no namespace {nsid}")));
        }
        tracing::info!(nqn = %nqn, nsid, anagrpid, "rpc: namespace moved to ANA group");
        Ok(Value::Bool(true))
    })
}

impl Control {
    /// Whether `s` is reachable on `addr`, a listener of the target.
    fn listens_on(&self, s: &Subsystem, addr: std::net::SocketAddr) -> bool {
        let listed = s
            .listen
            .read()
            .map(|l| l.as_ref().map(|l| l.contains(&addr)))
            .unwrap_or(Some(false));
        match listed {
            Some(v) => v,
            None => self
                .target
                .listeners
                .read()
                .map(|l| l.iter().any(|x| x.addr == addr && !x.discovery_only))
                .unwrap_or(false),
        }
    }
}

/// Checked `namespace.anagrpid` of `nvmf_subsystem_add_ns` (None: the NSID).
pub(super) fn add_ns_group(anagrpid: Option<u64>) -> Result<Option<u32>, RpcError> {
    match anagrpid {
        None | Some(0) => Ok(None),
        Some(g) => ana::check_group(g)
            .map(Some)
            .map_err(|e| RpcError::params(format!("namespace.anagrpid: {e}"))),
    }
}

/// `nvmf_subsystem_add_listener`'s `ana_state` (checked by its handler):
/// the new listener's state for every group. Off when the subsystem does
/// not report ANA, as SPDK ignores it then.
pub(super) fn listener_added(
    s: &Subsystem,
    addr: std::net::SocketAddr,
    ana_state: Option<&str>,
) -> Result<(), RpcError> {
    match ana_state {
        Some(st) if s.ana.is_reporting() => {
            ana::set_listener_state(s, addr, st, None).map_err(ana_error)
        }
        _ => Ok(()),
    }
}

/// `nvmf_subsystem_remove_listener`: the queue pairs that came in through
/// `addr` are disconnected, as SPDK's nvmf_tgt does.
pub(super) fn listener_removed(s: &Subsystem, addr: std::net::SocketAddr) {
    let n = s.disconnect_listener(addr);
    if n > 0 {
        tracing::info!(nqn = %s.nqn, listener = %addr, controllers = n, "rpc: listener removed; its controllers disconnected");
    }
}
