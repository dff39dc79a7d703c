//! Assembles a running target from a configuration: devices, namespaces,
//! subsystems, reactors, listeners; and takes it down cleanly.

use crate::bdev::nvme::NvmeDevice;
use crate::bdev::ram::RamDevice;
use crate::bdev::uring::UringDevice;
use crate::bdev::SharedDevice;
use crate::config::ops::{AddHost, AddNamespace};
use crate::config::{Backend, Config, DeviceSpec, NamespaceConfig, Op, OpError, PoolConfig};
use crate::config::{TcpConfig, VolumeConfig, VolumeKind};
use crate::nvmf::{Listener, Namespace, Subsystem, Target, TransportLimits};
use crate::pool::channel::VolumeDevice;
use crate::pool::format::{VOL_KV, VOL_UNWRITTEN_ERROR};
use crate::pool::gc::GcSettings;
use crate::pool::{DualPath, FormatOptions, Pool, PoolOptions};
use crate::reactor::{Message, Reactor, ReactorShared};
use crate::rpc::apply::ApplyError;
use crate::transport;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

pub struct Server {
    pub target: Arc<Target>,
    reactors: Vec<(Arc<ReactorShared>, JoinHandle<()>)>,
    acceptor: Option<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    devices: Vec<SharedDevice>,
    pools: Vec<Arc<Pool>>,
    /// Held for as long as the pools are open.
    _pool_locks: Vec<crate::pool::PoolLock>,
    rpc: Option<crate::rpc::RpcServer>,
    metrics: Option<crate::metrics::MetricsServer>,
    listener_set: Arc<transport::ListenerSet>,
    /// NVMe/RDMA listeners and the RDMA CM thread serving them.
    rdma: Arc<transport::rdma::RdmaTransport>,
    ctl: Arc<crate::rpc::methods::Control>,
    listen: Vec<(SocketAddr, bool)>,
    /// Membership in the `[cluster]`, when configured.
    cluster: Option<crate::cluster::Cluster>,
}

/// Why the target did not start; one line, naming the configured object
/// (`pools[0]: ...`) where there is one.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Rpc(#[from] crate::rpc::SocketError),
    #[error(transparent)]
    Listen(#[from] transport::ListenError),
    #[error(transparent)]
    Metrics(#[from] crate::metrics::MetricsError),
    #[error(transparent)]
    Rdma(#[from] transport::rdma::RdmaError),
    #[error(transparent)]
    Setup(#[from] SetupError),
    #[error(transparent)]
    Cluster(#[from] crate::cluster::ClusterError),
}

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
        source: crate::nvmf::ana::AnaError,
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
        source: crate::bdev::uring::OpenError,
    },
    #[error("{field}: {source}")]
    Nvme {
        field: String,
        #[source]
        source: crate::bdev::nvme::NvmeError,
    },
    #[error("{field}.trid: {source}")]
    Trid {
        field: String,
        #[source]
        source: crate::bdev::spdk::TridError,
    },
    #[error("{field}: {source}")]
    Spdk {
        field: String,
        #[source]
        source: crate::bdev::spdk::SpdkError,
    },
    #[error("{field}: {source}")]
    Pool {
        field: String,
        #[source]
        source: crate::pool::PoolError,
    },
    #[error("{field}: {source}")]
    SyncIo {
        field: String,
        #[source]
        source: crate::bdev::sync_io::SyncIoError,
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
        source: crate::nvmf::reservation::ptpl::PtplError,
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
        source: crate::auth::KeyError,
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
        source: crate::nvmf::auth::HostKeyError,
    },
}

fn required(field: &str, key: &str) -> SetupError {
    SetupError::Required {
        field: format!("{field}.{key}"),
    }
}

/// Opens the device a pool or a plain namespace describes; `name` names a RAM
/// device, `block_size` a file's blocks.
fn open_device(
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
static SPDK_ENV: std::sync::OnceLock<crate::bdev::spdk::EnvSettings> = std::sync::OnceLock::new();

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
        .parse::<crate::bdev::spdk::TransportId>()
        .map_err(|source| SetupError::Trid {
            field: field.into(),
            source,
        })?;
    let env = SPDK_ENV
        .get()
        .cloned()
        .unwrap_or_else(|| crate::bdev::spdk::EnvSettings {
            pci: !trid.is_fabrics(),
            ..Default::default()
        });
    crate::bdev::spdk::open(&trid, nsid.unwrap_or(1), &env).map_err(|source| SetupError::Spdk {
        field: field.into(),
        source,
    })
}

/// Opens a configured pool, formatting its device when it holds none and
/// `create` allows it.
fn open_pool(
    p: &PoolConfig,
    field: &str,
    reactors: usize,
    locks: &mut Vec<crate::pool::PoolLock>,
) -> Result<Arc<Pool>, SetupError> {
    let pool_err = |source| SetupError::Pool {
        field: field.into(),
        source,
    };
    let dev = open_pool_device(p, field)?;
    if let Some(path) = &p.path {
        locks.push(crate::pool::lock_pool(path, true).map_err(pool_err)?);
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
pub(crate) fn format_if_empty(
    p: &PoolConfig,
    dev: &SharedDevice,
    field: &str,
) -> Result<(), SetupError> {
    let pool_err = |source| SetupError::Pool {
        field: field.into(),
        source,
    };
    let io_err = |source| SetupError::SyncIo {
        field: field.into(),
        source,
    };
    let mut io = crate::pool::SyncIo::new(dev).map_err(io_err)?;
    let has_pool = io
        .read(0, 4096)
        .map(|b| &b[..8] == crate::pool::format::SUPERBLOCK_MAGIC)
        .map_err(io_err)?;
    drop(io);
    if !has_pool {
        if !p.create {
            return Err(SetupError::NoPool {
                field: field.into(),
                device: dev.describe(),
            });
        }
        let sb = crate::pool::format(
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
fn pool_options(p: &PoolConfig, reactors: usize) -> PoolOptions {
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
pub(crate) fn ensure_volume(pool: &Pool, v: &VolumeConfig, f: &str) -> Result<(), SetupError> {
    let pool_err = |source| SetupError::Pool {
        field: f.into(),
        source,
    };
    let kv_flag = crate::rpc::apply::volume_flags(v) & VOL_KV;
    let flags = crate::rpc::apply::volume_flags(v) & VOL_UNWRITTEN_ERROR;
    let Some(existing) = pool.volume(&v.name) else {
        crate::rpc::apply::create_volume(pool, v).map_err(pool_err)?;
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

/// The controller limits `[tcp]` sets (for every transport).
fn transport_limits(t: &TcpConfig) -> TransportLimits {
    TransportLimits {
        max_queue_depth: t.max_queue_depth,
        max_admin_queue_depth: t.max_queue_depth.max(32),
        max_io_queues: t.max_io_queues,
        in_capsule_data: t.in_capsule_data as u32,
        max_io_size: t.max_io_size as u32,
        max_h2c_data: t.max_h2c_data as u32,
        max_r2t_len: t.max_r2t_length.min(u32::MAX as u64) as u32,
        max_active_r2ts: t.max_active_r2ts,
        recv_buf_size: t.recv_buf_size.min(u32::MAX as u64) as u32,
        send_buf_size: t.send_buf_size.min(u32::MAX as u64) as u32,
        c2h_success: t.c2h_success,
        max_c2h_data: t.max_c2h_data.min(u32::MAX as u64) as u32,
    }
}

fn close_pools(pools: &[Arc<Pool>]) {
    for p in pools {
        if let Err(e) = p.close() {
            tracing::error!(pool = %p.name, "close: {e}");
        }
    }
}

/// What the configuration's operations build on a target before any thread
/// runs: one `apply` per operation.
struct Assembly {
    target: Arc<Target>,
    reactors: usize,
    pools: Vec<Arc<Pool>>,
    /// Held for as long as the pools are open.
    pool_locks: Vec<crate::pool::PoolLock>,
    /// The whole devices plain namespaces are.
    devices: Vec<SharedDevice>,
    /// The NQNs of the cluster-wide subsystems.
    cluster_wide: Vec<String>,
    /// Pools opened only by the owner of their ANA group.
    shared: Vec<crate::cluster::SharedPool>,
}

impl Assembly {
    /// Makes one change; `field` is the configuration entry it comes from.
    fn apply(&mut self, field: &str, op: &Op) -> Result<(), SetupError> {
        let op_err = |source| SetupError::Op {
            field: field.into(),
            source,
        };
        let apply_err = |source| SetupError::Apply {
            field: field.into(),
            source,
        };
        match op {
            Op::AddKey(k) => crate::rpc::apply::add_key(&self.target, k).map_err(|e| match e {
                ApplyError::LoadKey(source) | ApplyError::AddKey(source) => SetupError::Key {
                    field: field.into(),
                    source,
                },
                source => apply_err(source),
            }),
            Op::CreatePool(p) if p.shared => {
                let options = pool_options(p, self.reactors);
                let sp = crate::cluster::SharedPool::new(p.clone(), field.into(), options);
                self.shared.push(sp);
                Ok(())
            }
            Op::CreatePool(p) => {
                let pool = open_pool(p, field, self.reactors, &mut self.pool_locks)?;
                self.pools.push(pool);
                Ok(())
            }
            Op::CreateVolume(v) if self.shared.iter().any(|p| p.config.name == v.lvs_name) => {
                // Made to exist when this node owns the pool.
                if let Some(p) = self.shared.iter_mut().find(|p| p.config.name == v.lvs_name) {
                    p.config.volumes.push(v.volume.clone());
                }
                Ok(())
            }
            Op::CreateVolume(v) => {
                let name = &v.lvs_name;
                let pool = self.pools.iter().find(|p| p.name == *name);
                let pool = pool.ok_or_else(|| op_err(OpError::NoPool(name.clone())))?;
                ensure_volume(pool, &v.volume, field)
            }
            Op::CreateSubsystem(s) => {
                crate::rpc::apply::create_subsystem(&self.target, s).map_err(apply_err)
            }
            Op::AddHost(h) => self.add_host(field, h),
            Op::AddListener(l) => {
                let subsys = self.subsystem(&l.nqn).map_err(op_err)?;
                let a = l.listen_address.socket_addr();
                let a =
                    a.ok_or_else(|| op_err(OpError::Address(l.listen_address.traddr.clone())))?;
                if let Ok(mut list) = subsys.listen.write() {
                    list.get_or_insert_with(Vec::new).push(a);
                }
                Ok(())
            }
            Op::AddNamespace(n) => self.add_namespace(field, n),
            Op::SetAnaState(a) => {
                let subsys = self.subsystem(&a.nqn).map_err(op_err)?;
                let l = a.listen_address.socket_addr();
                let l =
                    l.ok_or_else(|| op_err(OpError::Address(a.listen_address.traddr.clone())))?;
                let grp = a.anagrpid.map(u64::from);
                crate::nvmf::ana::set_listener_state(&subsys, l, &a.ana_state, grp).map_err(
                    |source| SetupError::Ana {
                        field: field.into(),
                        source,
                    },
                )
            }
        }
    }

    fn subsystem(&self, nqn: &str) -> Result<Arc<Subsystem>, OpError> {
        let s = self.target.find_subsystem(nqn);
        s.ok_or_else(|| OpError::NoSubsystem(nqn.into()))
    }

    /// An allowed host, with the keys it names.
    fn add_host(&mut self, field: &str, h: &AddHost) -> Result<(), SetupError> {
        let subsys = self.subsystem(&h.nqn).map_err(|source| SetupError::Op {
            field: field.into(),
            source,
        })?;
        crate::rpc::apply::add_host(&self.target, &subsys, h).map_err(|e| match e {
            ApplyError::HostKey(source) | ApplyError::Psk(source) => SetupError::HostKey {
                field: field.into(),
                source,
            },
            source => SetupError::Apply {
                field: field.into(),
                source,
            },
        })
    }

    /// The device a namespace is: a pool volume (with its KV index, if any),
    /// or a whole device.
    fn namespace_device(
        &mut self,
        field: &str,
        nqn: &str,
        n: &NamespaceConfig,
    ) -> Result<(SharedDevice, Option<Arc<crate::pool::kv::KvIndex>>), SetupError> {
        let Some(v) = &n.volume else {
            if n.kind == Some(VolumeKind::Kv) {
                return Err(SetupError::KvNeedsVolume {
                    field: field.into(),
                });
            }
            let Some(dev) = n.device() else {
                return Err(SetupError::NoBackend {
                    field: field.into(),
                });
            };
            let name = format!("{nqn}/{}", n.nsid);
            let dev = open_device(&dev, &name, n.block_size(), field)?;
            self.devices.push(dev.clone());
            return Ok((dev, None));
        };
        let (pname, vname) = v.split_once('/').unwrap_or((v, ""));
        let found = (self.pools.iter().find(|p| p.name == pname))
            .and_then(|p| p.volume(vname).map(|vol| (p.clone(), vol)));
        let Some((p, vol)) = found else {
            let (field, volume) = (field.into(), v.clone());
            return Err(SetupError::NoVolume { field, volume });
        };
        let have = match vol.kv {
            Some(_) => VolumeKind::Kv,
            None => VolumeKind::Block,
        };
        if let Some(want) = n.kind.filter(|&k| k != have) {
            return Err(SetupError::KindMismatch {
                field: field.into(),
                want: want.name(),
                volume: v.clone(),
                have: have.name(),
            });
        }
        let kv = vol.kv.clone();
        Ok((VolumeDevice::new(p, vol), kv))
    }

    fn add_namespace(&mut self, field: &str, a: &AddNamespace) -> Result<(), SetupError> {
        let (nqn, n) = (&a.nqn, &a.namespace);
        let subsys = self.subsystem(nqn).map_err(|source| SetupError::Op {
            field: field.into(),
            source,
        })?;
        let ns = match self.shared_namespace(field, nqn, n) {
            Some(sn) => {
                let ns = crate::cluster::detached_namespace(&sn)?;
                tracing::info!(subnqn = %nqn, nsid = n.nsid, volume = %sn.volume, "namespace on a shared pool: detached until this node owns its ANA group");
                if let Some(p) = self.shared.iter_mut().find(|p| {
                    Some(p.config.name.as_str())
                        == n.volume
                            .as_deref()
                            .and_then(|v| v.split_once('/'))
                            .map(|x| x.0)
                }) {
                    p.namespaces.push(sn);
                }
                ns
            }
            None => {
                let (dev, kv_index) = self.namespace_device(field, nqn, n)?;
                build_namespace(
                    field,
                    nqn,
                    n,
                    dev,
                    kv_index,
                    self.cluster_wide.contains(nqn),
                )?
            }
        };
        if let Ok(mut v) = subsys.namespaces.write() {
            v.push(Arc::new(ns));
        }
        Ok(())
    }

    /// The namespace `n` of `nqn` when its volume is on a shared pool.
    fn shared_namespace(
        &self,
        field: &str,
        nqn: &str,
        n: &NamespaceConfig,
    ) -> Option<crate::cluster::SharedNamespace> {
        let (pname, vname) = n.volume.as_deref()?.split_once('/')?;
        let p = self.shared.iter().find(|p| p.config.name == pname)?;
        let v = p.config.volumes.iter().find(|v| v.name == vname)?;
        Some(crate::cluster::SharedNamespace {
            nqn: nqn.into(),
            field: field.into(),
            config: n.clone(),
            volume: vname.into(),
            size: v.size,
            block_size: v.block_size,
            kv: v.kind == VolumeKind::Kv,
        })
    }
}

/// Builds namespace `n` of `nqn` (configuration entry `field`) on `dev`,
/// with `kv` as its key index when it is a KV namespace; `cluster_wide`: its
/// identity derives from NQN and NSID on every node.
pub(crate) fn build_namespace(
    field: &str,
    nqn: &str,
    n: &NamespaceConfig,
    dev: SharedDevice,
    kv: Option<Arc<crate::pool::kv::KvIndex>>,
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
        let id = crate::ident::stable_uuid(&format!("{nqn}/ns/{}", n.nsid));
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

/// Bound NVMe/TCP and NVMe/RDMA listeners, not yet served.
struct Bound {
    tcp: Vec<transport::TcpListenerSpec>,
    /// Each TCP listener's address, whether it is discovery-only, and whether
    /// it requires TLS.
    listen: Vec<(SocketAddr, bool, bool)>,
    rdma: Vec<transport::rdma::RdmaListener>,
    rdma_addrs: Vec<SocketAddr>,
}

/// Binds every listener and records them on the target (for the discovery
/// log), with port IDs from 1.
fn bind_listeners(cfg: &Config, target: &Target) -> Result<Bound, StartError> {
    let mut specs = Vec::new();
    let mut addrs = cfg.listen_addrs()?;
    let rdma_listen = cfg.rdma_listen_addrs()?;
    // Addresses a subsystem lists that are not global listeners are
    // listened on too (a saved configuration carries RPC-added ones).
    for s in &cfg.subsystems {
        let listed = s.listen.iter().flatten().filter_map(|a| a.parse().ok());
        for a in listed {
            // An RDMA listener's address stays RDMA-only.
            if !addrs.contains(&a) && !rdma_listen.contains(&a) {
                addrs.push(a);
            }
        }
    }
    let secure = cfg.secure_listen_addrs()?;
    let global = cfg.listen_addrs()?;
    let mut discovery_ips = Vec::new();
    for a in addrs {
        specs.push(transport::bind(a, false, secure.contains(&a))?);
        let Some(p) = cfg.discovery.port else {
            continue;
        };
        // One discovery port per address, however many listeners it has.
        if global.contains(&a) && !discovery_ips.contains(&a.ip()) {
            discovery_ips.push(a.ip());
            // The discovery port stays plaintext: its log names the
            // secure listeners (TREQ, SECTYPE) for hosts to pick.
            specs.push(transport::bind(SocketAddr::new(a.ip(), p), true, false)?);
        }
    }
    let listen: Vec<(SocketAddr, bool, bool)> = specs
        .iter()
        .map(|s| (s.addr, s.discovery_only, s.secure))
        .collect();
    // RDMA listeners: rdma-core is loaded only now, so a configuration
    // without them never needs it.
    let mut rdma = Vec::new();
    for a in rdma_listen {
        rdma.push(transport::rdma::listen(a, false)?);
    }
    let rdma_addrs: Vec<SocketAddr> = rdma.iter().map(|l| l.addr).collect();
    if let Ok(mut l) = target.listeners.write() {
        for (i, (addr, d, secure)) in listen.iter().enumerate() {
            l.push(Listener {
                addr: *addr,
                discovery_only: *d,
                portid: i as u16 + 1,
                rdma: false,
                secure: *secure,
            });
        }
        for (i, addr) in rdma_addrs.iter().enumerate() {
            l.push(Listener {
                addr: *addr,
                discovery_only: false,
                portid: (listen.len() + i) as u16 + 1,
                rdma: true,
                secure: false,
            });
        }
    }
    Ok(Bound {
        tcp: specs,
        listen,
        rdma,
        rdma_addrs,
    })
}

/// The RPC server and the metrics endpoint, where configured.
fn start_services(
    cfg: &Config,
    ctl: &Arc<crate::rpc::methods::Control>,
) -> Result<
    (
        Option<crate::rpc::RpcServer>,
        Option<crate::metrics::MetricsServer>,
    ),
    StartError,
> {
    let rpc = match cfg.rpc.as_ref().filter(|r| r.enabled) {
        Some(r) => Some(crate::rpc::RpcServer::start(&r.socket, ctl.clone())?),
        None => None,
    };
    let metrics = match &cfg.metrics {
        Some(m) => {
            let a = m
                .address
                .parse()
                .map_err(|_| SetupError::MetricsAddress(m.address.clone()))?;
            Some(crate::metrics::MetricsServer::start(a, ctl.clone())?)
        }
        None => None,
    };
    Ok((rpc, metrics))
}

/// Joins the `[cluster]`, when configured, once every listener is bound (the
/// member record lists them).
fn start_cluster(
    cfg: &Config,
    ctl: &Arc<crate::rpc::methods::Control>,
    metrics: Option<&crate::metrics::MetricsServer>,
    shared: Vec<crate::cluster::SharedPool>,
) -> Result<Option<crate::cluster::Cluster>, StartError> {
    let Some(c) = &cfg.cluster else {
        return Ok(None);
    };
    let url = metrics.map(|m| format!("http://{}/metrics", m.addr));
    let cluster = crate::cluster::Cluster::start(
        c,
        ctl.target.clone(),
        url,
        &cluster_wide(cfg),
        shared,
        |view| {
            let _ = ctl.cluster.set(view);
        },
    )?;
    Ok(Some(cluster))
}

/// The NQNs of the subsystems whose ANA groups the cluster elects owners of.
fn cluster_wide(cfg: &Config) -> Vec<String> {
    cfg.subsystems
        .iter()
        .filter(|s| s.cluster_wide)
        .map(|s| s.nqn.clone())
        .collect()
}

fn log_listeners(tcp: &[(SocketAddr, bool, bool)], rdma: &[SocketAddr]) {
    for (a, d, secure) in tcp {
        tracing::info!(
            "listening on {a} ({})",
            match (*d, *secure) {
                (true, _) => "discovery",
                (false, true) => "NVMe/TCP, TLS 1.3 secure channel required",
                (false, false) => "NVMe/TCP",
            }
        );
    }
    for a in rdma {
        tracing::info!("listening on {a} (NVMe/RDMA)");
    }
}

impl Server {
    /// Starts everything the configuration describes: the target and its
    /// state (one `apply` per configuration operation), the listeners, then the
    /// reactors and service threads. Errors are one line.
    pub fn start(cfg: &Config) -> Result<Server, StartError> {
        if let Some(cores) = crate::reactor::keep_control_plane_off(&cfg.reactor_cores()) {
            tracing::info!(?cores, "control-plane threads kept off the reactors' cores");
        }
        set_spdk_env(cfg);
        let target = Arc::new(Target::new(transport_limits(&cfg.tcp)));
        let policy = cfg.auth.policy();
        target
            .dhchap_digests
            .store(policy.digests, std::sync::atomic::Ordering::Relaxed);
        target
            .dhchap_dhgroups
            .store(policy.dhgroups, std::sync::atomic::Ordering::Relaxed);
        let mut built = Assembly {
            target,
            reactors: cfg.reactor_cores().len(),
            pools: Vec::new(),
            pool_locks: Vec::new(),
            devices: Vec::new(),
            cluster_wide: cluster_wide(cfg),
            shared: Vec::new(),
        };
        for (field, op) in cfg.ops_with_fields() {
            if let Err(e) = built.apply(&field, &op) {
                close_pools(&built.pools);
                return Err(e.into());
            }
        }
        match bind_listeners(cfg, &built.target) {
            Ok(bound) => {
                crate::cluster::inaccessible_until_elected(&built.target, &cluster_wide(cfg));
                Server::run(cfg, built, bound)
            }
            Err(e) => {
                close_pools(&built.pools);
                Err(e)
            }
        }
    }

    /// Starts the reactors, the acceptor, the RDMA transport, RPC and metrics
    /// on a built target; on an error stops what started and closes the pools.
    fn run(cfg: &Config, built: Assembly, bound: Bound) -> Result<Server, StartError> {
        let Assembly {
            target,
            pools,
            pool_locks,
            devices,
            shared: shared_pools,
            ..
        } = built;
        let mut reactors = Vec::new();
        crate::reactor::set_stall_warn(std::time::Duration::from_micros(
            cfg.reactors.stall_warn_us,
        ));
        for (i, core) in cfg.reactor_cores().into_iter().enumerate() {
            let r = Reactor::spawn(i, cfg.reactors.idle, core)
                .map_err(|source| SetupError::Reactor { reactor: i, source })?;
            reactors.push(r);
        }
        for (r, _) in &reactors {
            // Each reactor's post for the KV indexes it will own (the first
            // to run a KV command of a namespace takes its index). The inbox
            // is empty yet: this cannot be refused.
            let install = crate::reactor::Message::Call(Box::new(crate::pool::kv_owner::install));
            if r.send(install).is_err() {
                tracing::error!(reactor = r.id, "cannot give a reactor its KV post");
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        let shared: Vec<_> = reactors.iter().map(|(s, _)| s.clone()).collect();
        let shared_reactors = shared.clone();
        let (tgt, st) = (target.clone(), stop.clone());
        let listener_set =
            Arc::new(transport::ListenerSet::new(bound.tcp).map_err(SetupError::Acceptor)?);
        let set = listener_set.clone();
        let acceptor = std::thread::Builder::new()
            .name("acceptor".into())
            .spawn(move || transport::accept_loop(set, shared, tgt, st))
            .map_err(SetupError::Acceptor)?;
        let rdma = Arc::new(transport::rdma::RdmaTransport::new(
            shared_reactors.clone(),
            target.clone(),
            transport::rdma::RdmaSettings {
                buffer_pool_bytes: cfg.rdma.buffer_pool_size as usize,
                max_outstanding_reads: cfg.rdma.max_outstanding_reads,
                max_qpairs_per_reactor: cfg.rdma.max_qpairs_per_reactor,
            },
            stop.clone(),
        ));
        for l in bound.rdma {
            rdma.listeners.add(l);
        }
        let rdma_started = if bound.rdma_addrs.is_empty() {
            Ok(())
        } else {
            rdma.start()
        };
        let ctl = Arc::new(crate::rpc::methods::Control::new(
            target.clone(),
            pools.clone(),
            shared_reactors,
            listener_set.clone(),
            rdma.clone(),
            cfg.clone(),
        ));
        let started = rdma_started
            .map_err(StartError::from)
            .and_then(|()| start_services(cfg, &ctl))
            .and_then(|(rpc, metrics)| {
                let cluster = start_cluster(cfg, &ctl, metrics.as_ref(), shared_pools)?;
                Ok((rpc, metrics, cluster))
            });
        let (rpc, metrics, cluster) = match started {
            Ok(x) => x,
            Err(e) => {
                stop.store(true, Ordering::Release);
                listener_set.wake();
                let _ = acceptor.join();
                rdma.join();
                for (r, _) in &reactors {
                    while r.send(Message::Shutdown).is_err() {
                        std::thread::yield_now();
                    }
                }
                for (_, h) in reactors {
                    let _ = h.join();
                }
                close_pools(&pools);
                return Err(e);
            }
        };
        log_listeners(&bound.listen, &bound.rdma_addrs);
        let listen = bound.listen.into_iter().map(|(a, d, _)| (a, d)).collect();
        Ok(Server {
            target,
            reactors,
            acceptor: Some(acceptor),
            stop,
            devices,
            pools,
            _pool_locks: pool_locks,
            rpc,
            metrics,
            listener_set,
            rdma,
            ctl,
            listen,
            cluster,
        })
    }

    /// Bound addresses (useful with port 0) and whether each is discovery-only.
    pub fn listen_addrs(&self) -> &[(SocketAddr, bool)] {
        &self.listen
    }

    /// Stops accepting, lets every queue pair finish its in-flight I/O and close,
    /// then syncs every device.
    pub fn shutdown(mut self) {
        self.stop_all();
    }

    fn stop_all(&mut self) {
        // Leave the cluster first: peers stop listing this node at once.
        if let Some(mut c) = self.cluster.take() {
            c.stop();
        }
        // The control socket goes first: no change may race the shutdown.
        if let Some(mut r) = self.rpc.take() {
            r.stop();
        }
        if let Some(mut m) = self.metrics.take() {
            m.stop();
        }
        self.stop.store(true, Ordering::Release);
        self.listener_set.wake();
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        self.rdma.join();
        // RPC client threads may still hold the control context: close the
        // listening sockets now so the ports are free at once.
        self.listener_set.clear();
        for (r, _) in &self.reactors {
            while r.send(Message::Shutdown).is_err() {
                std::thread::yield_now();
            }
        }
        for (_, h) in self.reactors.drain(..) {
            let _ = h.join();
        }
        for d in &self.devices {
            if let Err(e) = d.sync() {
                tracing::error!(dev = %d.describe(), "sync at shutdown failed: {e}");
            }
        }
        self.devices.clear();
        // Pools last: no reactor uses a volume any more (pools created over
        // RPC included).
        self.pools.clear();
        for p in self.ctl.pools() {
            if let Err(e) = p.close() {
                tracing::error!(pool = %p.name, "close: {e}");
            }
        }
        self.ctl.release_runtime_pools();
    }

    /// The metrics endpoint, when one is running.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(|m| m.addr)
    }

    /// The control socket, when one is running.
    pub fn rpc_path(&self) -> Option<&std::path::Path> {
        self.rpc.as_ref().map(|r| r.path())
    }

    pub fn pools(&self) -> &[Arc<Pool>] {
        &self.pools
    }

    /// How to reach each reactor (`Message::Call` runs code on it).
    pub fn reactors(&self) -> impl Iterator<Item = &Arc<ReactorShared>> {
        self.reactors.iter().map(|(r, _)| r)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.acceptor.is_some() || !self.reactors.is_empty() {
            self.stop_all();
        }
    }
}
