//! The running target's side of the configuration's operations
//! (`crate::ops`): one function per change, used by `Server::start`
//! for each operation of the configuration and by the RPC method of the same
//! name. Callers word the errors (a field path at start, an RPC code here).

use crate::ops::{AddHost, CreateSubsystem};
use crate::{KeyConfig, Unwritten, VolumeConfig, VolumeKind};
use kvt_auth::{Key, KeyError};
use kvt_nvmf::auth::{resolve_psk, HostKeyError, HostKeys};
use kvt_nvmf::{Subsystem, SubsystemKind, Target};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Why an operation was refused; nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("subsystem {0} already exists")]
    SubsystemExists(String),
    #[error("{host} is already allowed on {nqn}")]
    HostExists { host: String, nqn: String },
    /// `dhchap_key` or `dhchap_ctrlr_key` does not resolve.
    #[error(transparent)]
    HostKey(HostKeyError),
    /// `psk` does not resolve.
    #[error(transparent)]
    Psk(HostKeyError),
    #[error("{host} is not on {nqn}'s host list")]
    NoHost { host: String, nqn: String },
    #[error("{nqn} has no namespace {nsid}")]
    NoNamespace { nqn: String, nsid: u32 },
    /// The keyring has no key of that name.
    #[error(transparent)]
    RemoveKey(KeyError),
    #[error("host list poisoned")]
    Poisoned,
    /// The key file cannot be used.
    #[error(transparent)]
    LoadKey(KeyError),
    /// The keyring refuses the key (a key of that name is there).
    #[error(transparent)]
    AddKey(KeyError),
}

/// `keyring_file_add_key`: the key file read into the target's keyring.
pub fn add_key(target: &Target, k: &KeyConfig) -> Result<(), ApplyError> {
    let key = Key::load(&k.name, std::path::Path::new(&k.path)).map_err(ApplyError::LoadKey)?;
    target.keyring.add(key).map_err(ApplyError::AddKey)?;
    Ok(())
}

/// `nvmf_create_subsystem`: a new NVM subsystem without hosts or namespaces,
/// reachable on every listener (`any_listener`) or, as in SPDK, only on those
/// added to it.
pub fn create_subsystem(target: &Target, s: &CreateSubsystem) -> Result<(), ApplyError> {
    if target.find_subsystem(&s.nqn).is_some() {
        return Err(ApplyError::SubsystemExists(s.nqn.clone()));
    }
    let sub = Subsystem::new(
        &s.nqn,
        SubsystemKind::Nvm,
        &s.serial_number,
        &s.model_number,
        s.allow_any_host,
        Vec::new(),
    );
    sub.nvm_identify_for_kv
        .store(s.nvm_identify_for_kv, Ordering::Release);
    sub.ana.reporting.store(s.ana_reporting, Ordering::Release);
    if !s.any_listener {
        if let Ok(mut l) = sub.listen.write() {
            *l = Some(Vec::new());
        }
    }
    target.add_subsystem(Arc::new(sub));
    Ok(())
}

/// `nvmf_subsystem_add_host` on `subsys`: the host allowed, with the keys it
/// names from `target`'s keyring, all resolved before anything changes.
pub fn add_host(target: &Target, subsys: &Subsystem, h: &AddHost) -> Result<(), ApplyError> {
    let keys = match &h.dhchap_key {
        Some(k) => Some(
            HostKeys::resolve(&target.keyring, k, h.dhchap_ctrlr_key.as_deref())
                .map_err(ApplyError::HostKey)?,
        ),
        None => None,
    };
    let psk = match &h.psk {
        Some(k) => Some(resolve_psk(&target.keyring, k).map_err(ApplyError::Psk)?),
        None => None,
    };
    let mut hosts = subsys.hosts.write().map_err(|_| ApplyError::Poisoned)?;
    if hosts.contains(&h.host) {
        return Err(ApplyError::HostExists {
            host: h.host.clone(),
            nqn: h.nqn.clone(),
        });
    }
    hosts.push(h.host.clone());
    if let (Some(k), Ok(mut m)) = (keys, subsys.host_keys.write()) {
        m.insert(h.host.clone(), k);
    }
    if let (Some(k), Ok(mut m)) = (psk, subsys.host_psks.write()) {
        m.insert(h.host.clone(), k);
    }
    target.genctr.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// A volume's format flags (`VOL_KV`, `VOL_UNWRITTEN_ERROR`) as its
/// configuration gives them.
pub fn volume_flags(v: &VolumeConfig) -> u32 {
    use kvt_pool::format::{VOL_KV, VOL_UNWRITTEN_ERROR};
    let kind = match v.kind {
        VolumeKind::Block => 0,
        VolumeKind::Kv => VOL_KV,
    };
    let unwritten = match v.unwritten {
        Unwritten::Zeroes => 0,
        Unwritten::Error => VOL_UNWRITTEN_ERROR,
    };
    kind | unwritten
}

/// `kvtarget_create_volume` (`bdev_lvol_create`): a new volume in `pool`.
pub fn create_volume(
    pool: &kvt_pool::Pool,
    v: &VolumeConfig,
) -> Result<Arc<kvt_pool::volume::Volume>, kvt_pool::PoolError> {
    pool.create_volume(&v.name, v.size, v.block_size, volume_flags(v))
}

/// `nvmf_subsystem_set_keys` on `subsys`: listed `host`'s DH-HMAC-CHAP keys
/// replaced by those named (none: the host no longer authenticates).
pub fn set_keys(
    target: &Target,
    subsys: &Subsystem,
    host: &str,
    dhchap_key: Option<&str>,
    dhchap_ctrlr_key: Option<&str>,
) -> Result<(), ApplyError> {
    if !subsys
        .hosts
        .read()
        .is_ok_and(|h| h.iter().any(|x| x == host))
    {
        return Err(no_host(subsys, host));
    }
    let keys = match dhchap_key {
        Some(k) => Some(
            HostKeys::resolve(&target.keyring, k, dhchap_ctrlr_key).map_err(ApplyError::HostKey)?,
        ),
        None => None,
    };
    let mut m = subsys.host_keys.write().map_err(|_| ApplyError::Poisoned)?;
    match keys {
        Some(k) => m.insert(host.to_string(), k),
        None => m.remove(host),
    };
    Ok(())
}

/// `nvmf_subsystem_remove_host` on `subsys`: `host` and its keys gone; unless
/// any host may connect, its controllers too. Returns how many.
pub fn remove_host(target: &Target, subsys: &Subsystem, host: &str) -> Result<usize, ApplyError> {
    {
        let mut h = subsys.hosts.write().map_err(|_| ApplyError::Poisoned)?;
        let before = h.len();
        h.retain(|x| x != host);
        if h.len() == before {
            return Err(no_host(subsys, host));
        }
        if let Ok(mut m) = subsys.host_keys.write() {
            m.remove(host);
        }
        if let Ok(mut m) = subsys.host_psks.write() {
            m.remove(host);
        }
    }
    target.genctr.fetch_add(1, Ordering::Relaxed);
    if subsys.allow_any_host.load(Ordering::Acquire) {
        return Ok(0);
    }
    Ok(subsys.disconnect_host(host))
}

/// `nvmf_subsystem_allow_any_host` on `subsys`; when turned off, hosts not on
/// the list lose their controllers.
pub fn allow_any_host(target: &Target, subsys: &Subsystem, any: bool) {
    subsys.allow_any_host.store(any, Ordering::Release);
    target.genctr.fetch_add(1, Ordering::Relaxed);
    if any {
        return;
    }
    let hosts = subsys.hosts.read().map(|h| h.clone()).unwrap_or_default();
    if let Ok(c) = subsys.controllers.lock() {
        for ctrl in c.values().filter(|c| !hosts.contains(&c.hostnqn)) {
            ctrl.fail();
        }
    }
}

/// `nvmf_delete_subsystem`: `subsys` gone, its hosts' controllers failed
/// (their queues close).
pub fn delete_subsystem(target: &Target, subsys: &Arc<Subsystem>) {
    if let Ok(mut subs) = target.subsystems.write() {
        subs.retain(|x| !Arc::ptr_eq(x, subsys));
    }
    target.genctr.fetch_add(1, Ordering::Relaxed);
    if let Ok(c) = subsys.controllers.lock() {
        for ctrl in c.values() {
            ctrl.fail();
        }
    }
}

fn no_host(subsys: &Subsystem, host: &str) -> ApplyError {
    ApplyError::NoHost {
        host: host.into(),
        nqn: subsys.nqn.clone(),
    }
}

/// `keyring_file_remove_key`: the key out of the keyring (host entries using
/// it keep it until they are removed).
pub fn remove_key(target: &Target, name: &str) -> Result<(), ApplyError> {
    target.keyring.remove(name).map_err(ApplyError::RemoveKey)
}

/// `nvmf_subsystem_remove_ns` on `subsys`. Queues and reactors let go of the
/// namespace on their next housekeeping pass (its in-flight commands finish
/// first); this waits for that (up to 5 s) so the volume can be deleted or
/// resized right after, as with SPDK.
pub fn remove_namespace(subsys: &Subsystem, nsid: u32) -> Result<(), ApplyError> {
    let ns = subsys
        .remove_namespace(nsid)
        .ok_or_else(|| ApplyError::NoNamespace {
            nqn: subsys.nqn.clone(),
            nsid,
        })?;
    let t0 = std::time::Instant::now();
    while Arc::strong_count(&ns) > 1 && t0.elapsed() < std::time::Duration::from_secs(5) {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Ok(())
}
