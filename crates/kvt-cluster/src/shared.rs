//! Shared pools at run time (issue 36 item 4, shared device): a pool with
//! `shared = true` is one file several nodes open. A node does not open it at
//! start: its namespaces are served **detached** (their configured size and
//! block size, the identity from NQN and NSID, no backing) while their ANA
//! group is inaccessible. When the node wins the group it opens the pool as
//! its owner (`Pool::open_owned` with the group's epoch: recovery from the
//! journal), makes the configured volumes exist, and attaches each namespace
//! to its volume, all on the control-plane thread and before the group is
//! reported optimized. When it stops owning the group (fenced, lost, or the
//! pool superseded by a newer owner's epoch) it detaches the namespaces and
//! releases the pool without writing (`Pool::release`).
//!
//! Attaching and detaching swap the subsystem's `Arc<Namespace>` for one with
//! the same NSID and identity (`Subsystem::replace_namespace`): the removal
//! and the addition in one step under the namespace list's lock, so no command
//! sees Invalid Namespace in between; reactors drop their channels to the old
//! one (`removed`, `evict_removed`) and open channels to the new one on its
//! first command, exactly as for an RPC remove and add. A backing swap inside
//! one namespace would need every reactor's channel cache to notice a new
//! device under a key it already holds; the swap needs nothing new.
//!
//! flock: a shared pool's file is locked **shared** (`LOCK_SH`) while this
//! node owns it. Shared locks never block each other, so a SIGSTOPped owner
//! that still holds its lock does not keep the next owner out (the epoch is
//! the guard between owners), while an exclusive user of the same file (a
//! node whose configuration does not say `shared`, a `kvtarget pool` tool
//! that writes) is refused.

use super::ownership::GroupId;
use kvt_bdev::{BlockDevice, IoChannel, IoCompletion, IoOp, SharedDevice};
use kvt_config::setup::SetupError;
use kvt_config::{NamespaceConfig, PoolConfig};
use kvt_nvmf::{Namespace, Target};
use kvt_pool::channel::VolumeDevice;
use kvt_pool::{Pool, PoolLock, PoolOptions};
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a detach waits for commands already running on the attached
/// namespace to finish before it releases the pool.
const DRAIN: Duration = Duration::from_secs(2);

/// Why a won group's shared pool could not be attached (one line).
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error(transparent)]
    Setup(#[from] SetupError),
    #[error("pool {pool}: no volume `{volume}` after opening it")]
    NoVolume { pool: String, volume: String },
    #[error("{nqn} has no namespace {nsid} to attach")]
    NoNamespace { nqn: String, nsid: u32 },
}

/// A namespace served from a shared pool's volume.
#[derive(Debug, Clone)]
pub struct SharedNamespace {
    pub nqn: String,
    /// Its configuration entry, for error messages.
    pub field: String,
    pub config: NamespaceConfig,
    /// The volume's name in its pool.
    pub volume: String,
    pub size: u64,
    pub block_size: u32,
    /// A KV volume (a KV namespace).
    pub kv: bool,
}

impl SharedNamespace {
    fn group(&self) -> GroupId {
        GroupId {
            subnqn: self.nqn.clone(),
            anagrpid: self.config.ana_group.unwrap_or(self.config.nsid),
        }
    }
}

/// A shared pool as configured, and while this node owns it, opened.
pub struct SharedPool {
    /// With its volumes; `field` names it in error messages.
    pub config: PoolConfig,
    pub field: String,
    pub options: PoolOptions,
    pub namespaces: Vec<SharedNamespace>,
    open: Option<(Arc<Pool>, Option<PoolLock>)>,
}

impl SharedPool {
    pub fn new(config: PoolConfig, field: String, options: PoolOptions) -> SharedPool {
        SharedPool {
            config,
            field,
            options,
            namespaces: Vec::new(),
            open: None,
        }
    }

    /// The ANA group of its namespaces (one: config validation); None when
    /// no namespace is on it.
    fn group(&self) -> Option<GroupId> {
        self.namespaces.first().map(SharedNamespace::group)
    }
}

/// This node's shared pools; used by the election on the control-plane
/// threads (the cluster thread attaches, the fence thread may detach).
pub struct SharedPools {
    node: String,
    pools: Mutex<Vec<SharedPool>>,
}

impl SharedPools {
    pub fn new(node: &str, pools: Vec<SharedPool>) -> SharedPools {
        SharedPools {
            node: node.into(),
            pools: Mutex::new(pools),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<SharedPool>> {
        self.pools.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The NSIDs of group `g` served from shared pools (they keep their KV
    /// index at a takeover: no cold takeover for them).
    pub fn nsids(&self, g: &GroupId) -> Vec<u32> {
        let pools = self.lock();
        let nss = pools.iter().flat_map(|p| p.namespaces.iter());
        nss.filter(|n| n.group() == *g)
            .map(|n| n.config.nsid)
            .collect()
    }

    /// Opens every shared pool of `g` as its owner with `epoch` and attaches
    /// its namespaces; the pools attached. On an error what was opened for
    /// this call is released again.
    pub fn attach(&self, target: &Target, g: &GroupId, epoch: u64) -> Result<usize, AttachError> {
        let mut pools = self.lock();
        let mut n = 0;
        for p in pools.iter_mut().filter(|p| p.group().as_ref() == Some(g)) {
            if p.open.is_some() {
                continue;
            }
            let opened = open_owned(p, epoch, &self.node)?;
            if let Err(e) = attach_namespaces(target, p, &opened.0) {
                detach_namespaces(target, p);
                opened.0.release();
                return Err(e);
            }
            p.open = Some(opened);
            n += 1;
        }
        Ok(n)
    }

    /// Detaches the namespaces of every open shared pool of `g` and releases
    /// the pool without writing; the pools released.
    pub fn detach(&self, target: &Target, g: &GroupId) -> usize {
        let mut pools = self.lock();
        let mut n = 0;
        for p in pools.iter_mut().filter(|p| p.group().as_ref() == Some(g)) {
            let Some((pool, _lock)) = p.open.take() else {
                continue;
            };
            let old = detach_namespaces(target, p);
            drain(&old);
            pool.release();
            tracing::warn!(pool = %pool.name, epoch = pool.owner_epoch(), "cluster: shared pool released: no longer the owner of its ANA group");
            n += 1;
        }
        n
    }

    /// The groups whose open pool a newer owner's epoch superseded.
    pub fn superseded(&self) -> Vec<GroupId> {
        let pools = self.lock();
        (pools.iter())
            .filter(|p| p.open.as_ref().is_some_and(|(o, _)| o.superseded()))
            .filter_map(SharedPool::group)
            .collect()
    }
}

/// Opens `p`'s device (formatting it when it holds no pool: the first owner)
/// and the pool as owner with `epoch`, then makes its volumes exist.
fn open_owned(
    p: &SharedPool,
    epoch: u64,
    node: &str,
) -> Result<(Arc<Pool>, Option<PoolLock>), AttachError> {
    let f = &p.field;
    let pool_err = |source| SetupError::Pool {
        field: f.clone(),
        source,
    };
    // The device first: it creates a missing file.
    let dev = kvt_config::setup::open_pool_device(&p.config, f)?;
    let lock = match &p.config.path {
        Some(path) => Some(kvt_pool::lock_pool(path, false).map_err(pool_err)?),
        None => None,
    };
    kvt_config::setup::format_if_empty(&p.config, &dev, f)?;
    let pool =
        Pool::open_owned(&p.config.name, dev, p.options.clone(), epoch, node).map_err(pool_err)?;
    for (j, v) in p.config.volumes.iter().enumerate() {
        if let Err(e) = kvt_config::setup::ensure_volume(&pool, v, &format!("{f}.volumes[{j}]")) {
            pool.release();
            return Err(e.into());
        }
    }
    tracing::info!(pool = %pool.name, epoch, "cluster: shared pool opened as its ANA group's owner");
    Ok((pool, lock))
}

/// Swaps each detached namespace of `p` for one on its volume of `pool`.
fn attach_namespaces(target: &Target, p: &SharedPool, pool: &Arc<Pool>) -> Result<(), AttachError> {
    for n in &p.namespaces {
        let no_volume = || AttachError::NoVolume {
            pool: pool.name.clone(),
            volume: n.volume.clone(),
        };
        let vol = pool.volume(&n.volume).ok_or_else(no_volume)?;
        let kv = vol.kv.clone();
        let dev: SharedDevice = VolumeDevice::new(pool.clone(), vol);
        let ns = kvt_config::setup::build_namespace(&n.field, &n.nqn, &n.config, dev, kv, true)?;
        replace(target, n, ns)?;
    }
    Ok(())
}

/// Swaps each namespace of `p` back for a detached one; the namespaces
/// swapped out.
fn detach_namespaces(target: &Target, p: &SharedPool) -> Vec<Arc<Namespace>> {
    let mut old = Vec::new();
    for n in &p.namespaces {
        match detached_namespace(n) {
            Ok(ns) => match target.find_subsystem(&n.nqn) {
                Some(s) => old.extend(s.replace_namespace(Arc::new(ns))),
                None => continue,
            },
            Err(e) => tracing::error!(
                "cluster: detaching {} namespace {}: {e}",
                n.nqn,
                n.config.nsid
            ),
        }
    }
    old
}

fn replace(target: &Target, n: &SharedNamespace, ns: Namespace) -> Result<(), AttachError> {
    let missing = || AttachError::NoNamespace {
        nqn: n.nqn.clone(),
        nsid: n.config.nsid,
    };
    let s = target.find_subsystem(&n.nqn).ok_or_else(missing)?;
    s.replace_namespace(Arc::new(ns))
        .map(|_| ())
        .ok_or_else(missing)
}

/// Waits (up to `DRAIN`) until commands running on `old` have finished.
fn drain(old: &[Arc<Namespace>]) {
    let t0 = Instant::now();
    while old.iter().any(|ns| Arc::strong_count(ns) > 1) && t0.elapsed() < DRAIN {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The namespace `n` is while this node does not own its pool: its size,
/// block size and identity, no backing (I/O fails with a path status).
pub fn detached_namespace(n: &SharedNamespace) -> Result<Namespace, SetupError> {
    let dev: SharedDevice = Arc::new(DetachedDevice {
        name: format!("detached:{}", n.volume),
        size: n.size,
        block_size: n.block_size,
    });
    let kv = (n.kv).then(|| kvt_pool::kv::KvIndex::new(n.size, n.block_size).into_shared());
    kvt_config::setup::build_namespace(&n.field, &n.nqn, &n.config, dev, kv, true)
}

/// The device of a detached namespace: its size, and every operation fails
/// with `ERRNO_DETACHED` (an ANA Inaccessible path status). The group's ANA
/// state stops commands before they get here; this is what one that slips
/// past gets.
struct DetachedDevice {
    name: String,
    size: u64,
    block_size: u32,
}

impl BlockDevice for DetachedDevice {
    fn describe(&self) -> String {
        self.name.clone()
    }
    fn size_bytes(&self) -> u64 {
        self.size
    }
    fn open_channel(&self) -> std::io::Result<Box<dyn IoChannel>> {
        Ok(Box::new(DetachedChannel { done: Vec::new() }))
    }
    fn sync(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn volatile(&self) -> bool {
        false
    }
    fn block_size(&self) -> Option<u32> {
        Some(self.block_size)
    }
}

struct DetachedChannel {
    done: Vec<IoCompletion>,
}

impl IoChannel for DetachedChannel {
    fn submit(&mut self, tag: u64, op: IoOp, _now: Instant) -> Result<(), (IoOp, i32)> {
        self.done.push(IoCompletion {
            tag,
            result: Err(kvt_bdev::ERRNO_DETACHED),
            buf: op.into_buf(),
        });
        Ok(())
    }
    fn flush_submissions(&mut self) {}
    fn poll(&mut self, out: &mut Vec<IoCompletion>, _now: Instant) -> usize {
        let n = self.done.len();
        out.append(&mut self.done);
        n
    }
    fn in_flight(&self) -> usize {
        self.done.len()
    }
    fn completion_fd(&self) -> Option<RawFd> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvt_bdev::testing::run;

    #[test]
    fn a_detached_device_fails_every_operation_with_a_path_errno() {
        let d = DetachedDevice {
            name: "detached:v".into(),
            size: 1 << 20,
            block_size: 4096,
        };
        assert_eq!((d.size_bytes(), d.block_size()), (1 << 20, Some(4096)));
        let mut ch = d.open_channel().unwrap();
        let c = run(ch.as_mut(), IoOp::Flush);
        assert_eq!(c.result, Err(kvt_bdev::ERRNO_DETACHED));
        assert_eq!(ch.in_flight(), 0);
    }

    const NQN: &str = "nqn.2026-12.io.kvtarget:wide";

    /// A target serving one detached namespace of shared pool `p` (a file
    /// in `dir`), and the shared pools of node `a`.
    fn serving(dir: &std::path::Path) -> (Target, SharedPools, PoolConfig) {
        let text = format!(
            "name = \"p\"\nbackend = \"uring\"\npath = \"{}\"\nsize = \"64MiB\"\nshared = true\n\
             [[volumes]]\nname = \"v\"\nsize = \"4MiB\"\n",
            dir.join("p.pool").display()
        );
        let config: PoolConfig = toml::from_str(&text).unwrap();
        let ns: NamespaceConfig = toml::from_str("nsid = 1\nvolume = \"p/v\"\n").unwrap();
        let sn = SharedNamespace {
            nqn: NQN.into(),
            field: "subsystems[0].namespaces[0]".into(),
            config: ns,
            volume: "v".into(),
            size: 4 << 20,
            block_size: 4096,
            kv: false,
        };
        let target = Target::new(kvt_nvmf::TransportLimits::default());
        let s = kvt_nvmf::Subsystem::new(NQN, kvt_nvmf::SubsystemKind::Nvm, "s", "m", true, vec![]);
        s.namespaces
            .write()
            .unwrap()
            .push(Arc::new(detached_namespace(&sn).unwrap()));
        target.subsystems.write().unwrap().push(Arc::new(s));
        let mut sp = SharedPool::new(config.clone(), "pools[0]".into(), PoolOptions::default());
        sp.namespaces.push(sn);
        (target, SharedPools::new("a", vec![sp]), config)
    }

    #[test]
    fn attached_as_owner_then_superseded_by_a_newer_epoch_and_released() {
        let dir = tempfile::tempdir().unwrap();
        let (target, pools, config) = serving(dir.path());
        let g = GroupId {
            subnqn: NQN.into(),
            anagrpid: 1,
        };
        let ns = |t: &Target| t.find_subsystem(NQN).unwrap().namespace(1).unwrap();
        let detached = ns(&target);
        assert!(detached.dev.thin_info().is_none());
        assert_eq!((detached.num_blocks, detached.block_size), (1024, 4096));
        // The first owner formats the empty file and creates the volume.
        assert_eq!(pools.attach(&target, &g, 5).unwrap(), 1);
        assert_eq!(pools.attach(&target, &g, 5).unwrap(), 0, "already attached");
        assert!(detached.removed.load(std::sync::atomic::Ordering::Acquire));
        let attached = ns(&target);
        assert!(attached.dev.thin_info().is_some());
        assert_eq!(
            (attached.nguid, attached.num_blocks),
            (detached.nguid, 1024)
        );
        assert_eq!(pools.nsids(&g), vec![1]);
        drop(attached);
        assert!(pools.superseded().is_empty());
        // A newer owner (epoch 7) opens the same file: the first one's next
        // commit is refused and the group shows superseded.
        let dev = kvt_config::setup::open_pool_device(&config, "pools[0]").unwrap();
        let newer = Pool::open_owned("p", dev, PoolOptions::default(), 7, "b").unwrap();
        let first = pools.lock()[0].open.as_ref().unwrap().0.clone();
        assert!(first.sync().is_err());
        assert!(first.superseded());
        assert_eq!(pools.superseded(), vec![g.clone()]);
        assert_eq!(pools.detach(&target, &g), 1);
        assert!(ns(&target).dev.thin_info().is_none(), "detached again");
        assert!(pools.superseded().is_empty());
        // Attaching with the old epoch is refused: the pool shows 7.
        let e = pools.attach(&target, &g, 5).unwrap_err().to_string();
        assert!(e.contains("superseded"), "{e}");
        assert!(ns(&target).dev.thin_info().is_none());
        newer.close().unwrap();
    }
}
