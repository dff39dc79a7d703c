//! From a configuration entry to a live object: opening devices and pools
//! (formatting an empty device when `create` allows it), making configured
//! volumes exist, building namespaces. Used by the target's start-up and by
//! the cluster, which opens a shared pool when it wins the pool's ANA group.

use crate::apply::ApplyError;
use crate::{Backend, Config, DeviceSpec, NamespaceConfig, OpError, PoolConfig, VolumeConfig};
use kvt_bdev::nvme::NvmeDevice;
use kvt_bdev::ram::RamDevice;
use kvt_bdev::uring::UringDevice;
use kvt_bdev::SharedDevice;
use kvt_nvmf::Namespace;
use kvt_pool::format::{VOL_KV, VOL_UNWRITTEN_ERROR};
use kvt_pool::gc::GcSettings;
use kvt_pool::{DualPath, FormatOptions, Pool, PoolOptions};
use std::sync::Arc;

/// Why a configured device, pool, volume, namespace or thread could not be set
/// up; each names the configuration field (`pools[0].path`, ...) it comes from.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("{field}: required")]
    Required { field: String },
    #[error("{field}: {}: {source}", source.field())]
    Ana {
        field: String,
        #[source]
        source: kvt_nvmf::ana::AnaError,
    },
    #[error("{field}: {source}")]
    Ram {
        field: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{field}: {source}")]
    Uring {
        field: String,
        #[source]
        source: kvt_bdev::uring::OpenError,
    },
    #[error("{field}: {source}")]
    Nvme {
        field: String,
        #[source]
        source: kvt_bdev::nvme::NvmeError,
    },
    #[error("{field}.trid: {source}")]
    Trid {
        field: String,
        #[source]
        source: kvt_bdev::spdk::TridError,
    },
    #[error("{field}: {source}")]
    Spdk {
        field: String,
        #[source]
        source: kvt_bdev::spdk::SpdkError,
    },
    #[error("{field}: {source}")]
    Pool {
        field: String,
        #[source]
        source: kvt_pool::PoolError,
    },
    #[error("{field}: {source}")]
    SyncIo {
        field: String,
        #[source]
        source: kvt_bdev::sync_io::SyncIoError,
    },
    #[error("{field}: {device} holds no pool and create = false")]
    NoPool { field: String, device: String },
    #[error("{field}.block_size: the volume has {have} (block size cannot change)")]
    BlockSizeChanged { field: String, have: u32 },
    #[error("{field}.unwritten: the volume was created with unwritten = \"{created}\"")]
    UnwrittenChanged {
        field: String,
        created: &'static str,
    },
    #[error("{field}.size: the volume holds {have} bytes; shrinking loses data, use `kvtarget volume resize`")]
    Shrink { field: String, have: u64 },
    #[error("{field}.volume: `{volume}` does not exist")]
    NoVolume { field: String, volume: String },
    #[error("{field}.kind: the volume was created with kind = \"{created}\"")]
    KindChanged {
        field: String,
        created: &'static str,
    },
    #[error("{field}.kind: `{want}`, but volume {volume} is a {have} volume")]
    KindMismatch {
        field: String,
        want: &'static str,
        volume: String,
        have: &'static str,
    },
    #[error("{field}.kind: KV namespaces live on pool volumes of kind = \"kv\" (set volume)")]
    KvNeedsVolume { field: String },
    #[error("{field}: on_full, ttl_secs and trim apply only to KV namespaces")]
    KvOptionsOnBlock { field: String },
    #[error("{field}: needs a volume or a backend")]
    NoBackend { field: String },
    #[error("{field}: device is smaller than one block")]
    TooSmall { field: String },
    #[error("{field}.ptpl_file: {source}")]
    Ptpl {
        field: String,
        source: kvt_nvmf::reservation::ptpl::PtplError,
    },
    #[error("metrics.address: `{0}` is not ADDRESS:PORT")]
    MetricsAddress(String),
    #[error("reactor {reactor}: {source}")]
    Reactor {
        reactor: usize,
        #[source]
        source: std::io::Error,
    },
    #[error("acceptor thread: {0}")]
    Acceptor(#[source] std::io::Error),
    #[error("{field}: {source}")]
    Key {
        field: String,
        #[source]
        source: kvt_auth::KeyError,
    },
    #[error("{field}: {source}")]
    Op {
        field: String,
        #[source]
        source: OpError,
    },
    #[error("{field}: {source}")]
    Apply {
        field: String,
        #[source]
        source: ApplyError,
    },
    #[error("{field}.{source}")]
    HostKey {
        field: String,
        #[source]
        source: kvt_nvmf::auth::HostKeyError,
    },
}

fn required(field: &str, key: &str) -> SetupError {
    SetupError::Required {
        field: format!("{field}.{key}"),
    }
}

/// Opens the device a pool or a plain namespace describes; `name` names a RAM
/// device, `block_size` a file's blocks.
pub fn open_device(
    dev: &DeviceSpec<'_>,
    name: &str,
    block_size: u32,
    field: &str,
) -> Result<SharedDevice, SetupError> {
    Ok(match dev.backend {
        Backend::Ram => {
            RamDevice::new(name, dev.size.unwrap_or(0)).map_err(|source| SetupError::Ram {
                field: field.into(),
                source,
            })?
        }
        Backend::Uring => {
            let path = dev.path.ok_or_else(|| required(field, "path"))?;
            UringDevice::open(path, dev.size, block_size).map_err(|source| SetupError::Uring {
                field: field.into(),
                source,
            })?
        }
        Backend::Nvme => {
            let pci = dev.pci.ok_or_else(|| required(field, "pci"))?;
            NvmeDevice::open(pci, dev.nsid()).map_err(|source| SetupError::Nvme {
                field: field.into(),
                source,
            })?
        }
        Backend::Spdk => open_spdk(dev.trid, dev.nvme_nsid, field)?,
    })
}

/// Opens (formatting if allowed and needed) the device of a configured pool.
pub fn open_pool_device(p: &PoolConfig, field: &str) -> Result<SharedDevice, SetupError> {
    open_device(&p.device(), &format!("pool/{}", p.name), 512, field)
}

/// SPDK environment settings, set once from the configuration before the first
/// `spdk` device opens (DPDK's EAL starts once per process).
static SPDK_ENV: std::sync::OnceLock<kvt_bdev::spdk::EnvSettings> = std::sync::OnceLock::new();

/// Records the `[spdk]` settings `spdk` devices will start SPDK with.
pub fn set_spdk_env(cfg: &Config) {
    let _ = SPDK_ENV.set(cfg.spdk_env());
}

fn open_spdk(
    trid: Option<&str>,
    nsid: Option<u32>,
    field: &str,
) -> Result<SharedDevice, SetupError> {
    let trid = trid
        .ok_or_else(|| required(field, "trid"))?
        .parse::<kvt_bdev::spdk::TransportId>()
        .map_err(|source| SetupError::Trid {
            field: field.into(),
            source,
        })?;
    let env = SPDK_ENV
        .get()
        .cloned()
        .unwrap_or_else(|| kvt_bdev::spdk::EnvSettings {
            pci: !trid.is_fabrics(),
            ..Default::default()
        });
    kvt_bdev::spdk::open(&trid, nsid.unwrap_or(1), &env).map_err(|source| SetupError::Spdk {
        field: field.into(),
        source,
    })
}

/// Opens a configured pool, formatting its device when it holds none and
/// `create` allows it.
pub fn open_pool(
    p: &PoolConfig,
    field: &str,
    reactors: usize,
    locks: &mut Vec<kvt_pool::PoolLock>,
) -> Result<Arc<Pool>, SetupError> {
    let pool_err = |source| SetupError::Pool {
        field: field.into(),
        source,
    };
    let dev = open_pool_device(p, field)?;
    if let Some(path) = &p.path {
        locks.push(kvt_pool::lock_pool(path, true).map_err(pool_err)?);
    }
    format_if_empty(p, &dev, field)?;
    let pool = Pool::open(&p.name, dev, pool_options(p, reactors)).map_err(pool_err)?;
    if pool.sb.extent_size != p.extent_size {
        tracing::warn!(pool = %p.name, "the pool was formatted with {}-byte extents; extent_size = {} applies only to new pools", pool.sb.extent_size, p.extent_size);
    }
    Ok(pool)
}

/// Formats a configured pool's device `dev` when it holds no pool and
/// `create` allows it.
pub fn format_if_empty(p: &PoolConfig, dev: &SharedDevice, field: &str) -> Result<(), SetupError> {
    let pool_err = |source| SetupError::Pool {
        field: field.into(),
        source,
    };
    let io_err = |source| SetupError::SyncIo {
        field: field.into(),
        source,
    };
    let mut io = kvt_pool::SyncIo::new(dev).map_err(io_err)?;
    let has_pool = io
        .read(0, 4096)
        .map(|b| &b[..8] == kvt_pool::format::SUPERBLOCK_MAGIC)
        .map_err(io_err)?;
    drop(io);
    if !has_pool {
        if !p.create {
            return Err(SetupError::NoPool {
                field: field.into(),
                device: dev.describe(),
            });
        }
        let sb = kvt_pool::format(
            dev,
            &FormatOptions {
                extent_size: p.extent_size,
                ..FormatOptions::default()
            },
        )
        .map_err(pool_err)?;
        tracing::info!(pool = %p.name, dev = %dev.describe(), extents = sb.extent_count, extent_size = sb.extent_size, "pool created");
    }
    Ok(())
}

/// What a configured pool is opened with on a target of `reactors` reactors.
pub fn pool_options(p: &PoolConfig, reactors: usize) -> PoolOptions {
    PoolOptions {
        md_thread: true,
        reactors,
        gc: GcSettings {
            low_watermark_pct: p.gc.low_watermark_pct,
            high_watermark_pct: p.gc.high_watermark_pct,
            max_rate: p.gc.max_rate,
            max_foreground_qd: p.gc.max_foreground_qd,
            fixed_batch: (!p.gc.admission).then_some(GcSettings::default().batch),
            ..GcSettings::default()
        },
        dual_path: DualPath::from(&p.dual_path),
        commit_interval: Some(std::time::Duration::from_millis(p.commit_interval_ms)),
    }
}

/// Makes sure a configured volume exists: created, or grown; a volume whose
/// block size, kind or unwritten policy differs, or that would shrink, is an
/// error naming `f`.
pub fn ensure_volume(pool: &Pool, v: &VolumeConfig, f: &str) -> Result<(), SetupError> {
    let pool_err = |source| SetupError::Pool {
        field: f.into(),
        source,
    };
    let kv_flag = crate::apply::volume_flags(v) & VOL_KV;
    let flags = crate::apply::volume_flags(v) & VOL_UNWRITTEN_ERROR;
    let Some(existing) = pool.volume(&v.name) else {
        crate::apply::create_volume(pool, v).map_err(pool_err)?;
        tracing::info!(pool = %pool.name, volume = %v.name, size = v.size, "volume created");
        return Ok(());
    };
    let d = &existing.desc;
    let field = f.to_string();
    if d.block_size != v.block_size {
        let have = d.block_size;
        return Err(SetupError::BlockSizeChanged { field, have });
    }
    if d.flags & VOL_KV != kv_flag {
        let created = if d.flags & VOL_KV != 0 { "kv" } else { "block" };
        return Err(SetupError::KindChanged { field, created });
    }
    if d.flags & VOL_UNWRITTEN_ERROR != flags {
        let created = match d.flags & VOL_UNWRITTEN_ERROR {
            0 => "zeroes",
            _ => "error",
        };
        return Err(SetupError::UnwrittenChanged { field, created });
    }
    let have = d.size_bytes;
    if v.size < have {
        return Err(SetupError::Shrink { field, have });
    }
    if v.size > have {
        drop(existing);
        pool.resize_volume(&v.name, v.size).map_err(pool_err)?;
        tracing::info!(pool = %pool.name, volume = %v.name, size = v.size, "volume grown");
    }
    Ok(())
}

/// Builds namespace `n` of `nqn` (configuration entry `field`) on `dev`,
/// with `kv` as its key index when it is a KV namespace; `cluster_wide`: its
/// identity derives from NQN and NSID on every node.
pub fn build_namespace(
    field: &str,
    nqn: &str,
    n: &NamespaceConfig,
    dev: SharedDevice,
    kv: Option<Arc<kvt_pool::kv::KvIndex>>,
    cluster_wide: bool,
) -> Result<Namespace, SetupError> {
    let block_size = dev.block_size().unwrap_or(n.block_size());
    if dev.size_bytes() < block_size as u64 {
        return Err(SetupError::TooSmall {
            field: field.into(),
        });
    }
    tracing::info!(subnqn = %nqn, nsid = n.nsid, dev = %dev.describe(), bytes = dev.size_bytes(), block_size, "namespace");
    let mut ns = Namespace::new(nqn, n.nsid, dev, block_size)
        .with_write_cache(n.write_cache.unwrap_or(true));
    if cluster_wide {
        // Every node serves the same identity, derived from NQN and NSID,
        // not a node-local volume's own (each node's differs), or a host
        // would not see one namespace behind the nodes' paths.
        let id = kvt_wire::ident::stable_uuid(&format!("{nqn}/ns/{}", n.nsid));
        (ns.uuid, ns.nguid) = (id, id);
        ns.eui64.copy_from_slice(&id[8..16]);
    }
    if let Some(p) = &n.ptpl_file {
        ns = ns
            .with_ptpl_file(p.clone())
            .map_err(|source| SetupError::Ptpl {
                field: field.into(),
                source,
            })?;
    }
    if let Some(g) = n.ana_group {
        ns = ns.with_ana_group(g);
    }
    match kv {
        Some(kv) => {
            kv.set_settings(n.kv_settings());
            tracing::info!(subnqn = %nqn, nsid = n.nsid, keys = kv.snapshot().keys, max_keys = kv.max_keys(), on_full = kv.settings().on_full.name(), "KV namespace");
            ns = ns.with_kv(kv);
        }
        None if n.has_kv_options() => {
            return Err(SetupError::KvOptionsOnBlock {
                field: field.into(),
            })
        }
        None => {}
    }
    Ok(ns)
}
