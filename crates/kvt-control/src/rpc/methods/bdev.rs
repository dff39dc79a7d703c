//! `bdev_*` and `bdev_lvol_*` methods: pool volumes as bdevs, pools as lvol
//! stores.

use super::{act, not_found, Control, Params, Parsed};
use crate::rpc::{code, RpcError};
use kvt_config::{PoolConfig, Unwritten, VolumeConfig, VolumeKind};
use kvt_pool::format::VOL_UNWRITTEN_ERROR;
use kvt_pool::Pool;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

impl Control {
    fn pool(&self, name: Option<String>, uuid: Option<String>) -> Result<Arc<Pool>, RpcError> {
        let pools = self.pools();
        let found = match (&name, &uuid) {
            (Some(n), _) => pools.iter().find(|p| &p.name == n),
            (None, Some(u)) => pools
                .iter()
                .find(|p| &kvt_wire::ident::uuid_text(&p.sb.uuid) == u),
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
}

pub(super) fn get_bdevs(p: &mut Params) -> Parsed {
    let GetBdevs { name, .. } = p.parse()?;
    act(move |ctl| {
        let mut out = Vec::new();
        for pool in &ctl.pools() {
            for v in pool.volumes() {
                let alias = format!("{}/{}", pool.name, v.desc.name);
                let uuid = kvt_wire::ident::uuid_text(&v.desc.uuid);
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
                    "claimed": ctl.served_by(&v.desc.uuid).is_some(),
                    "supported_io_types": {
                        "read": true, "write": true, "flush": true, "unmap": true,
                        "write_zeroes": true, "reset": false, "nvme_admin": false, "nvme_io": false,
                    },
                    "driver_specific": {
                        "lvol": {
                            "lvol_store_uuid": kvt_wire::ident::uuid_text(&pool.sb.uuid),
                            "base_bdev": pool.device().describe(),
                            "thin_provision": true,
                            "num_allocated_clusters": v.mapped().len(),
                            "used_bytes": v.used_bytes(),
                            "unwritten": if v.desc.flags & VOL_UNWRITTEN_ERROR != 0 { "error" } else { "zeroes" },
                            "kind": if v.kv.is_some() { "kv" } else { "block" },
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
    })
}

pub(super) fn get_iostat(p: &mut Params) -> Parsed {
    let GetIostat {
        name,
        names,
        per_channel,
        reset_mode,
    } = p.parse()?;
    let names: Vec<String> = name
        .into_iter()
        .chain(names.into_iter().flatten())
        .collect();
    if per_channel == Some(true) {
        return Err(RpcError::params("per_channel: not supported by kvtarget"));
    }
    match reset_mode.as_deref() {
        None | Some("none") => {}
        Some(m) => {
            return Err(RpcError::params(format!(
                "reset_mode: `{m}` is not supported (counters are cumulative)"
            )))
        }
    }
    act(move |ctl| {
        let mut out = Vec::new();
        for pool in &ctl.pools() {
            for v in pool.volumes() {
                let alias = format!("{}/{}", pool.name, v.desc.name);
                let uuid = kvt_wire::ident::uuid_text(&v.desc.uuid);
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
                    // kvtarget's own: latency per bucket (not cumulative),
                    // bounds in `latency_bucket_bounds_us` (for percentiles,
                    // e.g. `kvtarget top`'s P99).
                    "read_latency_buckets": t.read_hist,
                    "write_latency_buckets": t.write_hist,
                }));
            }
        }
        if !names.is_empty() && out.len() < names.len() {
            return Err(not_found(format!(
                "bdev {} does not exist",
                names.join(",")
            )));
        }
        // Upper bounds of the latency buckets; the last is unbounded (null).
        let bounds: Vec<Option<u64>> = (0..kvt_mem::stats::LATENCY_BUCKETS)
            .map(kvt_mem::stats::latency_bucket_le_us)
            .collect();
        Ok(json!({
            "tick_rate": 1_000_000_000u64,
            "ticks": ctl.started.elapsed().as_nanos() as u64,
            "latency_bucket_bounds_us": bounds,
            "bdevs": out,
        }))
    })
}

/// `bdev_get_bdevs`'s parameters (`timeout`: nothing to wait for here).
#[derive(Deserialize)]
struct GetBdevs {
    name: Option<String>,
    #[allow(dead_code)]
    timeout: Option<u64>,
}

/// `bdev_get_iostat`'s parameters.
#[derive(Deserialize)]
struct GetIostat {
    name: Option<String>,
    names: Option<Vec<String>>,
    per_channel: Option<bool>,
    reset_mode: Option<String>,
}

/// `bdev_lvol_get_lvstores`'s parameters.
#[derive(Deserialize)]
struct GetLvstores {
    lvs_name: Option<String>,
    uuid: Option<String>,
}

/// `bdev_lvol_create_lvstore`'s parameters.
#[derive(Deserialize)]
struct CreateLvstore {
    bdev_name: String,
    lvs_name: String,
    cluster_sz: Option<u64>,
    clear_method: Option<String>,
    #[allow(dead_code)]
    num_md_pages_per_cluster_ratio: Option<u64>,
    #[allow(dead_code)]
    md_page_size: Option<u64>,
}

/// `bdev_lvol_create`'s parameters (`kind` and `unwritten` are kvtarget's).
#[derive(Deserialize)]
struct LvolCreate {
    lvol_name: String,
    size_in_mib: u64,
    lvs_name: Option<String>,
    uuid: Option<String>,
    thin_provision: Option<bool>,
    clear_method: Option<String>,
    block_size: Option<u64>,
    unwritten: Option<String>,
    kind: Option<String>,
}

/// `bdev_lvol_resize`'s parameters.
#[derive(Deserialize)]
struct LvolResize {
    name: String,
    size_in_mib: u64,
}

/// `bdev_lvol_create_lvstore`'s parameters as a `CreatePool` operation's
/// pool (the configuration's `[[pools]]` entry): a file or block device
/// with `io_uring`, formatted here, run with the default settings.
fn pool_config(c: CreateLvstore) -> Result<PoolConfig, RpcError> {
    use kvt_config::{Backend, DualPathConfig, GcConfig};
    if let Some(m) = c.clear_method {
        if !matches!(m.as_str(), "none" | "unmap" | "write_zeroes") {
            return Err(RpcError::params(format!(
                "clear_method: `{m}` is not none, unmap or write_zeroes"
            )));
        }
    }
    let name = c.lvs_name;
    if name.is_empty() || name.contains('/') || name.len() > 64 {
        return Err(RpcError::params("lvs_name: 1 to 64 characters without `/`"));
    }
    Ok(PoolConfig {
        name,
        backend: Backend::Uring,
        path: Some(c.bdev_name.into()),
        pci: None,
        nvme_nsid: None,
        trid: None,
        size: None,
        extent_size: c.cluster_sz.unwrap_or(1 << 20),
        create: false,
        // What PoolOptions::default() runs with.
        commit_interval_ms: kvt_config::d_commit_interval_ms(),
        gc: GcConfig::default(),
        dual_path: DualPathConfig::default(),
        volumes: Vec::new(),
        shared: false,
    })
}

/// Formats a file or block device as a new pool (lvol store) and opens it.
/// `bdev_name` is the path of an existing file or block device: kvtarget
/// has no separate base-bdev layer.
pub(super) fn create_lvstore(p: &mut Params) -> Parsed {
    let pool = pool_config(p.parse()?)?;
    act(move |ctl| {
        let name = pool.name.clone();
        if ctl.pools().iter().any(|x| x.name == name) {
            return Err(RpcError::new(
                code::EEXIST,
                format!("lvol store {name} already exists"),
            ));
        }
        let pb = pool.path.clone().unwrap_or_default();
        let path = pb.display().to_string();
        if !pb.exists() {
            return Err(not_found(format!(
                "bdev_name: {path} does not exist (give the path of a file or block device; create a file with `truncate -s SIZE {path}`)"
            )));
        }
        let lock = kvt_pool::lock_pool(&pb, true)
            .map_err(|e| RpcError::new(code::EBUSY, e.to_string()))?;
        let opened = format_and_open(ctl, &pool, &pb)?;
        let uuid = kvt_wire::ident::uuid_text(&opened.sb.uuid);
        if let Ok(mut v) = ctl.pools.write() {
            v.push(opened);
        }
        if let Ok(mut r) = ctl.runtime_pools.lock() {
            r.push((pool, lock));
        }
        tracing::info!(pool = %name, path = %path, "rpc: pool created");
        Ok(json!(uuid))
    })
}

/// A new pool on the file or device at `path`, formatted and opened.
fn format_and_open(
    ctl: &Control,
    pool: &PoolConfig,
    path: &std::path::Path,
) -> Result<Arc<Pool>, RpcError> {
    let dev: kvt_bdev::SharedDevice = kvt_bdev::uring::UringDevice::open(path, None, 512)
        .map_err(|e| RpcError::params(format!("bdev_name: {}: {e}", path.display())))?;
    kvt_pool::format(
        &dev,
        &kvt_pool::FormatOptions {
            extent_size: pool.extent_size,
            force: false,
            journal_len: None,
            max_volumes: None,
        },
    )
    .map_err(|e| {
        if matches!(e, kvt_pool::PoolError::Occupied { .. }) {
            RpcError::new(code::EEXIST, e.to_string())
        } else {
            RpcError::params(e.to_string())
        }
    })?;
    let opts = kvt_pool::PoolOptions {
        reactors: ctl.reactors.len().max(1),
        ..Default::default()
    };
    Pool::open(&pool.name, dev, opts)
        .map_err(|e| RpcError::new(code::INTERNAL_ERROR, e.to_string()))
}

pub(super) fn get_lvstores(p: &mut Params) -> Parsed {
    let GetLvstores {
        lvs_name: name,
        uuid,
    } = p.parse()?;
    act(move |ctl| {
        let pools: Vec<Arc<Pool>> = if name.is_some() || uuid.is_some() {
            vec![ctl.pool(name, uuid)?]
        } else {
            ctl.pools()
        };
        Ok(Value::Array(
            pools
                .iter()
                .map(|pool| {
                    let s = pool.snapshot();
                    json!({
                        "uuid": kvt_wire::ident::uuid_text(&pool.sb.uuid),
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
    })
}

/// `bdev_lvol_create`'s parameters as the volume of a `CreateVolume`
/// operation (the configuration's `[[pools.volumes]]` entry).
fn volume_config(c: LvolCreate) -> Result<VolumeConfig, RpcError> {
    // Volumes are always thin; a thick request is refused rather than faked.
    if c.thin_provision == Some(false) {
        return Err(RpcError::params(
            "thin_provision: kvtarget volumes are always thin-provisioned; pass thin_provision: true",
        ));
    }
    if let Some(m) = &c.clear_method {
        if !matches!(m.as_str(), "default" | "unmap" | "none" | "write_zeroes") {
            return Err(RpcError::params(format!(
                "clear_method: `{m}` is not default, none, unmap or write_zeroes"
            )));
        }
    }
    // Checked here, not truncated to u32 on the way to the pool.
    let block_size = match c.block_size.unwrap_or(4096) {
        b @ (512 | 4096) => b as u32,
        b => {
            return Err(RpcError::params(format!(
                "block_size: {b} is not 512 or 4096"
            )))
        }
    };
    let unwritten = match c.unwritten.as_deref() {
        None | Some("zeroes") => Unwritten::Zeroes,
        Some("error") => Unwritten::Error,
        Some(o) => {
            return Err(RpcError::params(format!(
                "unwritten: `{o}` is not zeroes or error"
            )))
        }
    };
    // kvtarget's own: "kv" makes a KV volume (a KV namespace's store).
    let kind = match c.kind.as_deref() {
        None | Some("block") => VolumeKind::Block,
        Some("kv") => VolumeKind::Kv,
        Some(o) => return Err(RpcError::params(format!("kind: `{o}` is not block or kv"))),
    };
    let size = (c.size_in_mib)
        .checked_mul(1 << 20)
        .ok_or_else(|| RpcError::params("size_in_mib: too large"))?;
    Ok(VolumeConfig {
        name: c.lvol_name,
        size,
        block_size,
        unwritten,
        kind,
    })
}

pub(super) fn lvol_create(p: &mut Params) -> Parsed {
    let mut c: LvolCreate = p.parse()?;
    // The pool by name (`lvs_name`) or by UUID.
    let (lvs_name, lvs_uuid) = (c.lvs_name.take(), c.uuid.take());
    let volume = volume_config(c)?;
    act(move |ctl| {
        let pool = ctl.pool(lvs_name, lvs_uuid)?;
        let v = kvt_config::apply::create_volume(&pool, &volume).map_err(|e| {
            if matches!(e, kvt_pool::PoolError::VolumeExists { .. }) {
                RpcError::new(code::EEXIST, e.to_string())
            } else {
                RpcError::params(e.to_string())
            }
        })?;
        Ok(json!(kvt_wire::ident::uuid_text(&v.desc.uuid)))
    })
}

pub(super) fn lvol_delete(p: &mut Params) -> Parsed {
    let super::Name { name } = p.parse()?;
    act(move |ctl| {
        let (pool, vname) = ctl.idle_volume(&name, "delete it")?;
        pool.delete_volume(&vname)
            .map_err(|e| RpcError::new(code::EBUSY, e.to_string()))?;
        Ok(Value::Bool(true))
    })
}

pub(super) fn lvol_resize(p: &mut Params) -> Parsed {
    let LvolResize {
        name,
        size_in_mib: mib,
    } = p.parse()?;
    let size = mib
        .checked_mul(1 << 20)
        .ok_or_else(|| RpcError::params("size_in_mib: too large"))?;
    act(move |ctl| {
        let (pool, vname) = ctl.idle_volume(&name, "resize it")?;
        pool.resize_volume(&vname, size)
            .map_err(|e| RpcError::new(code::EBUSY, e.to_string()))?;
        Ok(Value::Bool(true))
    })
}
