//! `kvtarget_*` methods: pool state and tuning, and saving the running
//! configuration.

use super::{act, not_found, Control, Params, Parsed};
use crate::rpc::{code, RpcError};
use kvt_config::ops::{AddHost, AddListener, AddNamespace, CreateSubsystem, ListenAddress};
use kvt_config::{Config, KeyConfig, ListenerConfig, NamespaceConfig, Op, OpError};
use kvt_config::{TransportKind, Unwritten, VolumeConfig, VolumeKind};
use kvt_nvmf::{Namespace, Subsystem};
use kvt_pool::format::VOL_UNWRITTEN_ERROR;
use kvt_pool::Pool;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Why the running state cannot be written out as a configuration.
#[derive(Debug, thiserror::Error)]
pub enum SaveConfigError {
    /// A namespace added at run time on a backend the configuration cannot
    /// describe (only volumes and configured namespaces can be saved).
    #[error("{nqn} namespace {nsid} has no configuration to save")]
    NamespaceUnsaved { nqn: String, nsid: u32 },
    /// The state read back names what it does not hold (a bug).
    #[error("the running state does not rebuild: {0}")]
    Op(#[from] OpError),
}

/// A volume as it is now, as a configuration entry.
fn volume_config(v: &kvt_pool::volume::Volume) -> VolumeConfig {
    VolumeConfig {
        name: v.desc.name.clone(),
        size: v.desc.size_bytes,
        block_size: v.desc.block_size,
        unwritten: match v.desc.flags & VOL_UNWRITTEN_ERROR {
            0 => Unwritten::Zeroes,
            _ => Unwritten::Error,
        },
        kind: match v.kv {
            Some(_) => VolumeKind::Kv,
            None => VolumeKind::Block,
        },
    }
}

impl Control {
    /// The running state as a configuration that reproduces it at the next
    /// start: listeners, pools with every volume, subsystems with hosts,
    /// listeners and namespaces. The state is read back as the operations
    /// that build it, applied to the configuration's other sections.
    pub fn current_config(&self) -> Result<Config, SaveConfigError> {
        let mut env = self.config.without_state();
        env.listeners = self.running_listeners();
        let mut ops = self.key_ops();
        ops.extend(self.pool_ops());
        let subs = self
            .target
            .subsystems
            .read()
            .map(|s| s.clone())
            .unwrap_or_default();
        for s in &subs {
            ops.extend(self.subsystem_ops(s)?);
        }
        Ok(env.with_ops(&ops)?)
    }

    /// Every listener but the discovery-only ones.
    fn running_listeners(&self) -> Vec<ListenerConfig> {
        let listeners = self
            .target
            .listeners
            .read()
            .map(|l| l.clone())
            .unwrap_or_default();
        listeners
            .iter()
            .filter(|l| !l.discovery_only)
            .map(|l| ListenerConfig {
                address: l.addr.ip().to_string(),
                port: l.addr.port(),
                transport: match l.rdma {
                    true => TransportKind::Rdma,
                    false => TransportKind::Tcp,
                },
                secure_channel: l.secure,
            })
            .collect()
    }

    /// The keyring as files, plus keys host entries still hold after they
    /// left the ring; a key's text never leaves the process.
    fn key_ops(&self) -> Vec<Op> {
        let mut keys = self.target.keyring.list();
        let subsystems = self
            .target
            .subsystems
            .read()
            .map(|s| s.clone())
            .unwrap_or_default();
        for s in subsystems {
            if let Ok(m) = s.host_keys.read() {
                for k in m.values() {
                    keys.push(k.dhchap_key.clone());
                    keys.extend(k.dhchap_ctrlr_key.clone());
                }
            }
            if let Ok(m) = s.host_psks.read() {
                keys.extend(m.values().cloned());
            }
        }
        let mut out: Vec<KeyConfig> = Vec::new();
        for k in keys {
            if !out.iter().any(|c| c.name == k.name) {
                out.push(KeyConfig {
                    name: k.name.clone(),
                    path: k.path.display().to_string(),
                });
            }
        }
        out.into_iter().map(Op::AddKey).collect()
    }

    /// Configured pools, then pools created over RPC, each with the volumes
    /// it holds now (a pool that is not open keeps its configured ones).
    fn pool_ops(&self) -> Vec<Op> {
        let mut pools = self.config.pools.clone();
        if let Ok(r) = self.runtime_pools.lock() {
            pools.extend(r.iter().map(|(c, _)| c.clone()));
        }
        for pc in &mut pools {
            if let Some(pool) = self.pools().iter().find(|p| p.name == pc.name) {
                pc.volumes = pool.volumes().iter().map(|v| volume_config(v)).collect();
            }
        }
        let cfg = Config {
            pools,
            ..self.config.without_state()
        };
        cfg.ops()
    }

    /// A running subsystem's creation, hosts, listeners and namespaces.
    fn subsystem_ops(&self, s: &Subsystem) -> Result<Vec<Op>, SaveConfigError> {
        let nqn = || s.nqn.clone();
        let listen = s.listen.read().ok().and_then(|l| l.clone());
        let mut ops = vec![Op::CreateSubsystem(CreateSubsystem {
            nqn: nqn(),
            serial_number: s.serial.clone(),
            model_number: s.model.clone(),
            allow_any_host: s.allow_any_host.load(Ordering::Acquire),
            any_listener: listen.is_none(),
            nvm_identify_for_kv: s.nvm_identify_for_kv.load(Ordering::Acquire),
            ana_reporting: s.ana.is_reporting(),
            // Elected from the start-up config only: kept as configured.
            cluster_wide: self
                .config
                .subsystems
                .iter()
                .any(|o| o.nqn == s.nqn && o.cluster_wide),
        })];
        let keys = s.host_keys.read().map(|k| k.clone()).unwrap_or_default();
        let psks = s.host_psks.read().map(|k| k.clone()).unwrap_or_default();
        let hosts = s.hosts.read().map(|h| h.clone()).unwrap_or_default();
        ops.extend(hosts.into_iter().map(|host| {
            let k = keys.get(&host);
            // Key names, never key text.
            Op::AddHost(AddHost {
                nqn: nqn(),
                dhchap_key: k.map(|k| k.dhchap_key.name.clone()),
                dhchap_ctrlr_key: k
                    .and_then(|k| k.dhchap_ctrlr_key.as_ref())
                    .map(|c| c.name.clone()),
                psk: psks.get(&host).map(|p| p.name.clone()),
                host,
            })
        }));
        ops.extend(listen.into_iter().flatten().map(|a| {
            Op::AddListener(AddListener {
                nqn: nqn(),
                listen_address: ListenAddress::tcp(a),
            })
        }));
        for n in s.namespace_snapshot() {
            let mut namespace = self.namespace_config(s, &n)?;
            namespace.ana_group = kvt_nvmf::ana::saved_group(&n);
            ops.push(Op::AddNamespace(AddNamespace {
                nqn: nqn(),
                namespace,
            }));
        }
        ops.extend(saved_ana_states(s));
        Ok(ops)
    }

    /// A volume namespace as it runs; a whole-device one as configured.
    fn namespace_config(
        &self,
        s: &Subsystem,
        n: &Namespace,
    ) -> Result<NamespaceConfig, SaveConfigError> {
        let Some(volume) = self.volume_alias(&n.uuid) else {
            let orig = self.config.subsystems.iter().find(|o| o.nqn == s.nqn);
            let configured = orig.and_then(|o| o.namespaces.iter().find(|x| x.nsid == n.nsid));
            return configured
                .cloned()
                .ok_or_else(|| SaveConfigError::NamespaceUnsaved {
                    nqn: s.nqn.clone(),
                    nsid: n.nsid,
                });
        };
        // The KV settings are the pool index's (the namespace holds it only
        // as what its command set needs).
        let kv = self
            .pools()
            .iter()
            .find_map(|p| p.volumes().into_iter().find(|v| v.desc.uuid == n.uuid))
            .and_then(|v| v.kv.clone())
            .map(|k| k.settings());
        Ok(NamespaceConfig {
            nsid: n.nsid,
            volume: Some(volume),
            backend: None,
            path: None,
            pci: None,
            nvme_nsid: None,
            trid: None,
            size: None,
            block_size: None,
            write_cache: n.write_through.then_some(false),
            kind: None,
            on_full: kv.as_ref().map(|k| k.on_full),
            ttl_secs: kv.as_ref().and_then(|k| k.ttl).map(|t| t.as_secs()),
            trim: kv.as_ref().and_then(|k| k.keep_footprint.then_some(false)),
            ptpl_file: n.reservation.ptpl_file().map(Into::into),
            ana_group: None,
        })
    }

    /// The open pool called `name`.
    fn named_pool(&self, name: &str) -> Result<Arc<Pool>, RpcError> {
        self.pools()
            .into_iter()
            .find(|x| x.name == name)
            .ok_or_else(|| not_found(format!("pool {name} does not exist")))
    }
}

pub(super) fn get_pools(p: &mut Params) -> Parsed {
    let super::OptName { name } = p.parse()?;
    act(move |ctl| {
        let mut out = Vec::new();
        for pool in &ctl.pools() {
            if name.as_ref().is_some_and(|n| n != &pool.name) {
                continue;
            }
            let s = pool.snapshot();
            out.push(json!({
                "name": pool.name,
                "uuid": kvt_wire::ident::uuid_text(&pool.sb.uuid),
                "device": pool.device().describe(),
                "extent_size": s.extent_size,
                "extents": s.extents,
                "mapped": s.mapped,
                "clean": s.clean,
                "dirty": s.dirty,
                "reserved": s.reserved,
                "volumes": pool.volumes().len(),
                "journal": {"used": s.journal_used, "size": s.journal_len, "commits": s.commits, "checkpoints": s.checkpoints,
                    "last_commit_us": pool.stats.last_commit_ns.load(Ordering::Relaxed) / 1000,
                    "last_checkpoint_us": pool.stats.last_checkpoint_ns.load(Ordering::Relaxed) / 1000,
                    "last_checkpoint_bytes": pool.stats.last_checkpoint_bytes.load(Ordering::Relaxed)},
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
    })
}

/// `kvtarget_save_config`'s parameters: where to write (else only returned).
#[derive(serde::Deserialize)]
struct SaveConfig {
    path: Option<String>,
}

pub(super) fn save_config(p: &mut Params) -> Parsed {
    let SaveConfig { path } = p.parse()?;
    act(move |ctl| {
        let cfg = ctl
            .current_config()
            .map_err(|e| RpcError::new(code::INTERNAL_ERROR, e.to_string()))?;
        let text = cfg
            .to_toml()
            .map_err(|e| RpcError::new(code::INTERNAL_ERROR, e.to_string()))?;
        let text = format!("# Written by kvtarget_save_config from the running target.\n{text}");
        // What we write must load: check it before it replaces anything.
        kvt_config::Config::parse(&text).map_err(|e| {
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
    })
}

/// Live consistency check of a pool (the offline one is `kvtarget check`).
/// KV namespaces (KV volumes) with their cache counters; `name`: one
/// "pool/volume".
pub(super) fn get_kv_namespaces(p: &mut Params) -> Parsed {
    let super::OptName { name } = p.parse()?;
    act(move |ctl| {
        let mut out = Vec::new();
        for pool in &ctl.pools() {
            for v in pool.volumes() {
                let Some(kv) = &v.kv else { continue };
                let alias = format!("{}/{}", pool.name, v.desc.name);
                if name.as_ref().is_some_and(|n| n != &alias) {
                    continue;
                }
                let s = kv.snapshot();
                let set = kv.settings();
                let bs = kv.block_size() as u64;
                let served = ctl.served_by(&v.desc.uuid);
                out.push(json!({
                    "name": alias,
                    "uuid": kvt_wire::ident::uuid_text(&v.desc.uuid),
                    "subsystem": served.as_ref().map(|(n, _)| n.clone()),
                    "nsid": served.as_ref().map(|(_, i)| *i),
                    "on_full": set.on_full.name(),
                    "ttl_secs": set.ttl.map(|t| t.as_secs()),
                    "trim": !set.keep_footprint,
                    "keys": s.keys,
                    "max_keys": s.max_keys,
                    "value_bytes": s.value_bytes,
                    "capacity_bytes": s.total_blocks * bs,
                    "used_bytes": s.used_blocks * bs,
                    "free_bytes": s.free_blocks * bs,
                    "awaiting_commit_bytes": s.pending_free_blocks * bs,
                    "stores": s.stores,
                    "hits": s.hits,
                    "misses": s.misses,
                    "deletes": s.deletes,
                    "evictions": s.evictions,
                    "expirations": s.expirations,
                    "mean_eviction_age_ms": s.eviction_age_ms.checked_div(s.evictions).unwrap_or(0),
                    "commit_waits": s.commit_waits,
                    "store_failures_full": s.store_failures_full,
                    // The namespace's footprint in the pool, and what went back.
                    "allocated_bytes": v.mapped().len() as u64 * v.extent_size(),
                    "trimmed_extents": s.trimmed_extents,
                }));
            }
        }
        if let Some(n) = &name {
            if out.is_empty() {
                return Err(not_found(format!("no KV namespace {n}")));
            }
        }
        Ok(json!(out))
    })
}

pub(super) fn pool_check(p: &mut Params) -> Parsed {
    let super::Name { name } = p.parse()?;
    act(move |ctl| {
        let pool = ctl.named_pool(&name)?;
        let (problems, summary) = pool.verify_live();
        Ok(json!({"consistent": problems.is_empty(), "problems": problems, "extents": summary}))
    })
}

/// Writes a checkpoint of the pool now; returns its bytes and wall time.
pub(super) fn pool_checkpoint(p: &mut Params) -> Parsed {
    let super::Name { name } = p.parse()?;
    act(move |ctl| {
        let pool = ctl.named_pool(&name)?;
        pool.checkpoint_now()
            .map_err(|e| RpcError::new(code::INTERNAL_ERROR, e.to_string()))?;
        let s = &pool.stats;
        Ok(json!({
            "bytes": s.last_checkpoint_bytes.load(Ordering::Relaxed),
            "us": s.last_checkpoint_ns.load(Ordering::Relaxed) / 1000,
        }))
    })
}

/// `kvtarget_pool_set_gc`'s parameters: the settings to change.
#[derive(serde::Deserialize)]
struct PoolSetGc {
    name: String,
    paused: Option<bool>,
    max_rate: Option<f64>,
    max_foreground_qd: Option<u64>,
    low_watermark_pct: Option<u64>,
    high_watermark_pct: Option<u64>,
}

pub(super) fn pool_set_gc(p: &mut Params) -> Parsed {
    let PoolSetGc {
        name,
        paused,
        max_rate,
        max_foreground_qd: qd,
        low_watermark_pct: low,
        high_watermark_pct: high,
    } = p.parse()?;
    act(move |ctl| {
        let pool = ctl.named_pool(&name)?;
        // Checks every setting before changing any; pausing comes after, so a
        // refused setting leaves the pause state alone too.
        pool.set_gc_settings(max_rate, qd, low, high)
            .map_err(|e| RpcError::params(e.to_string()))?;
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
    })
}

/// `kvtarget_get_cluster`: this node's membership (state, lease, every
/// member's record); an error when the node has no `[cluster]`.
pub(super) fn get_cluster(_p: &mut Params) -> Parsed {
    act(|ctl| {
        let view = ctl
            .cluster
            .get()
            .ok_or_else(|| not_found("this node has no [cluster] configuration"))?;
        serde_json::to_value(view.snapshot())
            .map_err(|e| RpcError::new(code::INTERNAL_ERROR, e.to_string()))
    })
}

/// The `nvmf_subsystem_listener_set_ana_state` operations that restore
/// `subsys`'s listener states (none for optimized groups): one for every
/// group when a listener has them all in one state, else one per group.
fn saved_ana_states(subsys: &Subsystem) -> Vec<Op> {
    use kvt_config::ops::SetAnaState;
    use kvt_nvmf::ana::{AnaState, MAX_ANA_GROUPS};
    let mut ops = Vec::new();
    for p in subsys.ana.paths() {
        let changed = p.changed_groups();
        let op = |ana_state: AnaState, anagrpid: Option<u32>| {
            Op::SetAnaState(SetAnaState {
                nqn: subsys.nqn.clone(),
                listen_address: ListenAddress::tcp(p.listener),
                ana_state: ana_state.name().into(),
                anagrpid,
            })
        };
        let uniform = changed.len() == MAX_ANA_GROUPS as usize
            && changed.iter().all(|(_, s)| *s == changed[0].1);
        if uniform {
            ops.push(op(changed[0].1, None));
        } else {
            ops.extend(changed.iter().map(|&(g, s)| op(s, Some(g))));
        }
    }
    ops
}
