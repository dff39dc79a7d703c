//! `nvmf_*` methods on transports, whole subsystems and statistics; the
//! per-subsystem ones (listeners, namespaces, hosts) are in `nvmf_subsystem`.

use super::{act, not_found, unsupported, Control, Nqn, Params, Parsed, TgtName};
use crate::rpc::{code, RpcError};
use kvt_config::ops::CreateSubsystem;
use kvt_nvmf::{Subsystem, SubsystemKind};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Control {
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

    pub(super) fn subsystem(&self, nqn: &str) -> Result<Arc<Subsystem>, RpcError> {
        self.target
            .find_subsystem(nqn)
            .ok_or_else(|| not_found(format!("subsystem {nqn} does not exist")))
    }

    pub(super) fn nvm_subsystem(&self, nqn: &str) -> Result<Arc<Subsystem>, RpcError> {
        let s = self.subsystem(nqn)?;
        if s.kind == SubsystemKind::Discovery {
            return Err(RpcError::params(
                "the discovery subsystem has no namespaces or hosts",
            ));
        }
        Ok(s)
    }

    /// The listeners subsystem `s` is reachable on, as SPDK lists them.
    fn listeners_json(&self, s: &Subsystem) -> Vec<Value> {
        let listeners = self
            .target
            .listeners
            .read()
            .map(|l| l.clone())
            .unwrap_or_default();
        listeners
            .iter()
            .filter(|l| {
                if s.kind == SubsystemKind::Discovery {
                    l.discovery_only || s.listener_allowed(l.addr)
                } else {
                    !l.discovery_only && s.listener_allowed(l.addr)
                }
            })
            .map(|l| {
                let mut v = json!({
                    "trtype": if l.rdma { "RDMA" } else { "TCP" },
                    "adrfam": if l.addr.is_ipv4() { "IPv4" } else { "IPv6" },
                    "traddr": l.addr.ip().to_string(),
                    "trsvcid": l.addr.port().to_string(),
                });
                if l.secure {
                    v["secure_channel"] = json!(true);
                }
                v
            })
            .collect()
    }

    fn subsystem_json(&self, s: &Subsystem) -> Value {
        let listen = self.listeners_json(s);
        let hosts = hosts_json(s);
        let mut v = json!({
            "nqn": s.nqn,
            "subtype": if s.kind == SubsystemKind::Discovery { "Discovery" } else { "NVMe" },
            "listen_addresses": listen,
            "allow_any_host": s.allow_any_host.load(Ordering::Acquire),
            "nvm_identify_for_kv": s.nvm_identify_for_kv.load(Ordering::Acquire),
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
                        "nguid": kvt_wire::ident::hex(&n.nguid).to_uppercase(),
                        "eui64": kvt_wire::ident::hex(&n.eui64).to_uppercase(),
                        "uuid": kvt_wire::ident::uuid_text(&n.uuid),
                    })
                })
                .collect();
            v["serial_number"] = json!(s.serial);
            v["model_number"] = json!(s.model);
            v["max_namespaces"] = json!(kvt_nvmf::admin::MAX_NAMESPACES);
            let (min_cntlid, max_cntlid) = s.cntlid_range();
            v["min_cntlid"] = json!(min_cntlid);
            v["max_cntlid"] = json!(max_cntlid);
            v["namespaces"] = json!(ns);
        }
        v
    }
}

/// The hosts subsystem `s` allows, with the names of their keys (never the
/// keys).
fn hosts_json(s: &Subsystem) -> Vec<Value> {
    let keys = s.host_keys.read().map(|k| k.clone()).unwrap_or_default();
    let psks = s.host_psks.read().map(|k| k.clone()).unwrap_or_default();
    s.hosts
        .read()
        .map(|h| {
            h.iter()
                .map(|n| {
                    let mut v = json!({"nqn": n});
                    // Key names as SPDK lists them; never the keys.
                    if let Some(k) = keys.get(n) {
                        v["dhchap_key"] = json!(k.dhchap_key.name);
                        if let Some(c) = &k.dhchap_ctrlr_key {
                            v["dhchap_ctrlr_key"] = json!(c.name);
                        }
                    }
                    if let Some(k) = psks.get(n) {
                        v["psk"] = json!(k.name);
                    }
                    v
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `nvmf_create_transport`'s parameters kvtarget reads; its tuning options
/// are [`TRANSPORT_TUNING`].
#[derive(Deserialize)]
struct CreateTransport {
    trtype: String,
    #[allow(dead_code)]
    tgt_name: Option<String>,
}

/// SPDK's transport tuning options: accepted and ignored (the TCP
/// transport's limits are set in the configuration, `[tcp]`).
const TRANSPORT_TUNING: &[&str] = &[
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
];

/// The transports `nvmf_create_transport` knows.
enum Trtype {
    Tcp,
    Rdma,
}

pub(super) fn create_transport(p: &mut Params) -> Parsed {
    let CreateTransport { trtype, .. } = p.parse()?;
    // The TCP transport exists from the configuration ([tcp]); scripts
    // written for SPDK create it first, so that succeeds.
    p.ignore(TRANSPORT_TUNING);
    let t = match trtype.to_ascii_uppercase().as_str() {
        "TCP" => Trtype::Tcp,
        "RDMA" => Trtype::Rdma,
        other => {
            return Err(RpcError::params(format!(
                "trtype {other}: unknown transport"
            )))
        }
    };
    act(move |ctl| match t {
        Trtype::Tcp => Ok(Value::Bool(true)),
        // Loads rdma-core and starts the RDMA CM thread; sizing comes from
        // the configuration's [rdma] and [tcp] sections.
        Trtype::Rdma => ctl
            .rdma
            .start()
            .map(|()| Value::Bool(true))
            .map_err(|e| RpcError::new(code::INTERNAL_ERROR, e.to_string())),
    })
}

/// `nvmf_get_transports`'s parameters.
#[derive(Deserialize)]
struct GetTransports {
    trtype: Option<String>,
    #[allow(dead_code)]
    tgt_name: Option<String>,
}

pub(super) fn get_transports(p: &mut Params) -> Parsed {
    let GetTransports { trtype, .. } = p.parse()?;
    act(move |ctl| {
        let mut all = vec![ctl.transport_json()];
        if ctl.rdma.is_started() {
            let mut r = ctl.transport_json();
            r["trtype"] = json!("RDMA");
            r["io_unit_size"] = json!(ctl.target.limits.max_io_size);
            r["num_shared_buffers"] = json!(ctl.rdma.settings.buffer_pool_bytes / 4096);
            r["max_outstanding_reads"] = json!(ctl.rdma.settings.max_outstanding_reads);
            if let Some(o) = r.as_object_mut() {
                o.remove("c2h_success");
                o.remove("sock_priority");
            }
            all.push(r);
        }
        match trtype {
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
    })
}

/// `nvmf_create_subsystem`'s SPDK parameters besides the operation's
/// ([`CreateSubsystem`]): checked or refused when on, else ignored.
#[derive(Deserialize)]
#[allow(dead_code)]
struct SubsystemOptions {
    tgt_name: Option<String>,
    max_namespaces: Option<u64>,
    min_cntlid: Option<u64>,
    max_cntlid: Option<u64>,
    dmrsl: Option<u64>,
    wzsl: Option<u64>,
    ana_reporting: Option<bool>,
    passthrough: Option<Value>,
    enable_nssr: Option<Value>,
    admin_label: Option<Value>,
}

pub(super) fn create_subsystem(p: &mut Params) -> Parsed {
    let fields = [
        "nqn",
        "serial_number",
        "model_number",
        "allow_any_host",
        "nvm_identify_for_kv",
    ];
    let CreateSubsystem {
        nqn,
        serial_number: serial,
        model_number: model,
        allow_any_host: any,
        nvm_identify_for_kv,
        ..
    } = p.typed(&fields)?;
    let spdk: SubsystemOptions = p.parse()?;
    if let Some(m) = spdk.max_namespaces {
        if m > kvt_nvmf::admin::MAX_NAMESPACES as u64 {
            return Err(RpcError::params(format!(
                "max_namespaces: at most {}",
                kvt_nvmf::admin::MAX_NAMESPACES
            )));
        }
    }
    unsupported("passthrough", &spdk.passthrough)?;
    unsupported("enable_nssr", &spdk.enable_nssr)?;
    unsupported("admin_label", &spdk.admin_label)?;
    kvt_wire::nqn::validate_nqn(&nqn).map_err(|e| RpcError::params(format!("nqn: {e}")))?;
    if nqn == kvt_wire::nvme::DISCOVERY_NQN {
        return Err(RpcError::params("nqn: the discovery NQN is reserved"));
    }
    if serial.is_empty() || serial.len() > 20 || !serial.is_ascii() {
        return Err(RpcError::params("serial_number: 1 to 20 ASCII characters"));
    }
    if model.is_empty() || model.len() > 40 || !model.is_ascii() {
        return Err(RpcError::params("model_number: 1 to 40 ASCII characters"));
    }
    // As in SPDK, a new subsystem is reachable only on listeners added to it.
    let op = CreateSubsystem {
        nqn,
        serial_number: serial,
        model_number: model,
        allow_any_host: any,
        any_listener: false,
        nvm_identify_for_kv,
        ana_reporting: spdk.ana_reporting.unwrap_or(false),
        cluster_wide: false,
    };
    act(move |ctl| {
        kvt_config::apply::create_subsystem(&ctl.target, &op)
            .map_err(super::nvmf_subsystem::apply_error)?;
        tracing::info!(nqn = %op.nqn, "rpc: subsystem created");
        Ok(Value::Bool(true))
    })
}

pub(super) fn delete_subsystem(p: &mut Params) -> Parsed {
    let Nqn { nqn, .. } = p.parse()?;
    act(move |ctl| {
        let s = ctl.nvm_subsystem(&nqn)?;
        kvt_config::apply::delete_subsystem(&ctl.target, &s);
        tracing::info!(nqn = %nqn, "rpc: subsystem deleted");
        Ok(Value::Bool(true))
    })
}

/// `nvmf_get_subsystems`'s parameters.
#[derive(Deserialize)]
struct GetSubsystems {
    nqn: Option<String>,
    #[allow(dead_code)]
    tgt_name: Option<String>,
}

pub(super) fn get_subsystems(p: &mut Params) -> Parsed {
    let GetSubsystems { nqn: want, .. } = p.parse()?;
    act(move |ctl| {
        let mut all = vec![ctl.target.discovery.clone()];
        all.extend(
            ctl.target
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
            all.iter().map(|s| ctl.subsystem_json(s)).collect(),
        ))
    })
}

/// SPDK's nvmf_get_stats: one poll group per reactor; under RDMA one
/// device entry per completion queue (SPDK's field names, plus kvtarget's
/// `qpairs`, `cq_entries`, `cq_entries_reserved`, `dropped_completions`).
pub(super) fn get_stats(p: &mut Params) -> Parsed {
    let _: TgtName = p.parse()?;
    act(|ctl| {
        let groups = kvt_transport::rdma::poll_group_stats();
        let rdma_started = ctl.rdma.is_started();
        let pgs: Vec<Value> = ctl
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
    })
}
