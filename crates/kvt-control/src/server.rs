//! Assembles a running target from a configuration: devices, namespaces,
//! subsystems, reactors, listeners; and takes it down cleanly.

use kvt_bdev::SharedDevice;
use kvt_config::apply::ApplyError;
use kvt_config::ops::{AddHost, AddNamespace};
use kvt_config::setup::{
    build_namespace, ensure_volume, open_device, open_pool, pool_options, set_spdk_env, SetupError,
};
use kvt_config::{Config, NamespaceConfig, Op, OpError};
use kvt_config::{TcpConfig, VolumeKind};
use kvt_nvmf::{Listener, Subsystem, Target, TransportLimits};
use kvt_pool::channel::VolumeDevice;
use kvt_pool::Pool;
use kvt_reactor::{Message, Reactor, ReactorShared};
use kvt_transport as transport;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

pub struct Server {
    pub target: Arc<Target>,
    reactors: ReactorThreads,
    acceptor: Option<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    devices: Vec<SharedDevice>,
    pools: Vec<Arc<Pool>>,
    /// Held for as long as the pools are open.
    _pool_locks: Vec<kvt_pool::PoolLock>,
    rpc: Option<crate::rpc::RpcServer>,
    metrics: Option<crate::metrics::MetricsServer>,
    listener_set: Arc<transport::ListenerSet>,
    /// NVMe/RDMA listeners and the RDMA CM thread serving them.
    rdma: Arc<transport::rdma::RdmaTransport>,
    ctl: Arc<crate::rpc::methods::Control>,
    listen: Vec<(SocketAddr, bool)>,
    /// Membership in the `[cluster]`, when configured.
    cluster: Option<kvt_cluster::Cluster>,
}

/// Why the target did not start; one line, naming the configured object
/// (`pools[0]: ...`) where there is one.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] kvt_config::ConfigError),
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
    Cluster(#[from] kvt_cluster::ClusterError),
}

/// The reactors' shared halves and their threads.
type ReactorThreads = Vec<(Arc<ReactorShared>, JoinHandle<()>)>;

/// Spawns the reactors on their cores, each given its post for the KV
/// indexes it will own.
fn spawn_reactors(cfg: &Config) -> Result<ReactorThreads, SetupError> {
    let mut reactors = Vec::new();
    kvt_reactor::set_stall_warn(std::time::Duration::from_micros(cfg.reactors.stall_warn_us));
    for (i, core) in cfg.reactor_cores().into_iter().enumerate() {
        let r = Reactor::spawn(i, cfg.reactors.idle, core)
            .map_err(|source| SetupError::Reactor { reactor: i, source })?;
        reactors.push(r);
    }
    for (r, _) in &reactors {
        // Each reactor's post for the KV indexes it will own (the first
        // to run a KV command of a namespace takes its index). The inbox
        // is empty yet: this cannot be refused.
        let install = kvt_reactor::Message::Call(Box::new(kvt_pool::kv_owner::install));
        if r.send(install).is_err() {
            tracing::error!(reactor = r.id, "cannot give a reactor its KV post");
        }
    }
    Ok(reactors)
}

/// The RDMA transport over `reactors`, holding the RDMA `listeners` bound at
/// start-up (its CM thread is not started yet).
fn rdma_transport(
    cfg: &Config,
    reactors: Vec<Arc<ReactorShared>>,
    target: &Arc<Target>,
    stop: &Arc<AtomicBool>,
    listeners: Vec<transport::rdma::RdmaListener>,
) -> Arc<transport::rdma::RdmaTransport> {
    let rdma = Arc::new(transport::rdma::RdmaTransport::new(
        reactors,
        target.clone(),
        transport::rdma::RdmaSettings {
            buffer_pool_bytes: cfg.rdma.buffer_pool_size as usize,
            max_outstanding_reads: cfg.rdma.max_outstanding_reads,
            max_qpairs_per_reactor: cfg.rdma.max_qpairs_per_reactor,
        },
        stop.clone(),
    ));
    for l in listeners {
        rdma.listeners.add(l);
    }
    rdma
}

/// Stops what `Server::run` started before a later step failed: the
/// acceptor, the RDMA transport and the reactors.
fn stop_started(
    stop: &AtomicBool,
    listener_set: &transport::ListenerSet,
    acceptor: JoinHandle<()>,
    rdma: &transport::rdma::RdmaTransport,
    reactors: ReactorThreads,
) {
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
    pool_locks: Vec<kvt_pool::PoolLock>,
    /// The whole devices plain namespaces are.
    devices: Vec<SharedDevice>,
    /// The NQNs of the cluster-wide subsystems.
    cluster_wide: Vec<String>,
    /// Pools opened only by the owner of their ANA group.
    shared: Vec<kvt_cluster::SharedPool>,
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
            Op::AddKey(k) => kvt_config::apply::add_key(&self.target, k).map_err(|e| match e {
                ApplyError::LoadKey(source) | ApplyError::AddKey(source) => SetupError::Key {
                    field: field.into(),
                    source,
                },
                source => apply_err(source),
            }),
            Op::CreatePool(p) if p.shared => {
                let options = pool_options(p, self.reactors);
                let sp = kvt_cluster::SharedPool::new(p.clone(), field.into(), options);
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
                kvt_config::apply::create_subsystem(&self.target, s).map_err(apply_err)
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
                kvt_nvmf::ana::set_listener_state(&subsys, l, &a.ana_state, grp).map_err(|source| {
                    SetupError::Ana {
                        field: field.into(),
                        source,
                    }
                })
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
        kvt_config::apply::add_host(&self.target, &subsys, h).map_err(|e| match e {
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
    ) -> Result<(SharedDevice, Option<Arc<kvt_pool::kv::KvIndex>>), SetupError> {
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
                let ns = kvt_cluster::detached_namespace(&sn)?;
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
    ) -> Option<kvt_cluster::SharedNamespace> {
        let (pname, vname) = n.volume.as_deref()?.split_once('/')?;
        let p = self.shared.iter().find(|p| p.config.name == pname)?;
        let v = p.config.volumes.iter().find(|v| v.name == vname)?;
        Some(kvt_cluster::SharedNamespace {
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
    shared: Vec<kvt_cluster::SharedPool>,
) -> Result<Option<kvt_cluster::Cluster>, StartError> {
    let Some(c) = &cfg.cluster else {
        return Ok(None);
    };
    let url = metrics.map(|m| format!("http://{}/metrics", m.addr));
    let cluster = kvt_cluster::Cluster::start(
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
        if let Some(cores) = kvt_reactor::keep_control_plane_off(&cfg.reactor_cores()) {
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
                kvt_cluster::inaccessible_until_elected(&built.target, &cluster_wide(cfg));
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
        let reactors = spawn_reactors(cfg)?;
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
        let rdma = rdma_transport(cfg, shared_reactors.clone(), &target, &stop, bound.rdma);
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
                stop_started(&stop, &listener_set, acceptor, &rdma, reactors);
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
