//! Admin command set: Identify, Get/Set Features, Get Log Page, Keep Alive,
//! Asynchronous Event Request, Abort. All of it is synchronous control-path work
//! against shared target state; the transport moves the data.

use super::controller::{
    Controller, ERROR_LOG_ENTRIES, IO_COMMAND_SET_COMBINATIONS, MAX_AERS, VERSION,
};
use super::{CommandSet, Namespace, Target, IEEE_OUI};
use kvt_wire::nvme::{
    self, admin_opc, cns, csi_bit, fid, CsIndependentNamespace, GetLogPage, IdentifyController,
    IdentifyNamespace, KvFormat, KvIdentifyNamespace, Sqe, Status,
};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// What an admin command produced.
#[derive(Debug, PartialEq, Eq)]
pub enum AdminOutcome {
    /// Complete now with this status, DW0 result and optional controller-to-host
    /// data.
    Done {
        status: Status,
        result: u32,
        data: Option<Vec<u8>>,
    },
    /// An Asynchronous Event Request: held until an event occurs.
    AsyncEventHeld,
}

impl AdminOutcome {
    fn status(s: Status) -> AdminOutcome {
        AdminOutcome::Done {
            status: s,
            result: 0,
            data: None,
        }
    }
    fn ok(result: u32) -> AdminOutcome {
        AdminOutcome::Done {
            status: Status::SUCCESS,
            result,
            data: None,
        }
    }
    fn data(d: Vec<u8>) -> AdminOutcome {
        AdminOutcome::Done {
            status: Status::SUCCESS,
            result: 0,
            data: Some(d),
        }
    }
}

pub use super::MAX_NAMESPACES;
/// Keep-alive granularity reported in KAS, in 100 ms units.
const KAS_100MS: u16 = 10;

/// Executes one admin command. `outstanding_aers` is how many AERs the admin queue
/// already holds.
pub fn execute(
    target: &Target,
    ctrl: &Controller,
    sqe: &Sqe,
    outstanding_aers: usize,
    now: Instant,
) -> AdminOutcome {
    // Any admin command is proof of life for keep-alive purposes (traffic-based
    // keep-alive is what the Linux target does too).
    ctrl.keep_alive(now);
    let discovery = ctrl.is_discovery();
    match sqe.opcode() {
        admin_opc::IDENTIFY => identify(target, ctrl, sqe),
        admin_opc::GET_LOG_PAGE => get_log_page(target, ctrl, sqe, now),
        admin_opc::SET_FEATURES => set_features(target, ctrl, sqe, now),
        admin_opc::GET_FEATURES => get_features(ctrl, sqe),
        admin_opc::KEEP_ALIVE => AdminOutcome::ok(0),
        admin_opc::ASYNC_EVENT_REQUEST => {
            if outstanding_aers >= MAX_AERS {
                AdminOutcome::status(Status::ASYNC_EVENT_LIMIT)
            } else {
                AdminOutcome::AsyncEventHeld
            }
        }
        // Nothing we run can be aborted mid-flight: report "not aborted" (DW0 bit 0).
        admin_opc::ABORT if !discovery => AdminOutcome::ok(1),
        _ => AdminOutcome::status(Status::INVALID_OPCODE),
    }
}

fn identify(target: &Target, ctrl: &Controller, sqe: &Sqe) -> AdminOutcome {
    let cns_v = (sqe.cdw(10) & 0xFF) as u8;
    let csi_v = (sqe.cdw(11) >> 24) as u8;
    let nsid = sqe.nsid();
    if ctrl.is_discovery() && cns_v != cns::CONTROLLER {
        return AdminOutcome::status(Status::INVALID_FIELD);
    }
    let enabled = ctrl.enabled_command_sets();
    let active = || active_namespace(ctrl, nsid, enabled);
    let zeroed = || AdminOutcome::data(vec![0; nvme::IDENTIFY_LEN]);
    let result = match cns_v {
        cns::CONTROLLER => Ok(AdminOutcome::data(
            identify_controller(target, ctrl).encode(),
        )),
        cns::NAMESPACE => active().and_then(|ns| nvm_identify_namespace(ctrl, ns)),
        cns::ACTIVE_NS_LIST => active_ns_list(ctrl, nsid, |ns| {
            enabled & csi_bit(ns.command_set.csi()) != 0
        }),
        cns::CSI_ACTIVE_NS_LIST => match CommandSet::from_csi(csi_v) {
            Some(set) => active_ns_list(ctrl, nsid, |ns| {
                ns.command_set == set && enabled & csi_bit(set.csi()) != 0
            }),
            None => Err(Status::INVALID_FIELD),
        },
        // The descriptor list always ends with the namespace's CSI: Linux
        // with CC.CSS = 110b drops a namespace whose list lacks one.
        cns::NS_DESCRIPTOR_LIST => active().and_then(|ns| match ns {
            Some(ns) => Ok(AdminOutcome::data(nvme::encode_ns_descriptors(
                &ns.eui64,
                &ns.nguid,
                &ns.uuid,
                ns.command_set.csi(),
            ))),
            None => Err(Status::INVALID_NAMESPACE),
        }),
        // I/O command set specific Identify Namespace: for a CSI we do not
        // support, Invalid Field in Command.
        cns::CSI_NAMESPACE => match CommandSet::from_csi(csi_v) {
            None => Err(Status::INVALID_FIELD),
            Some(set) => active().and_then(|ns| csi_identify_namespace(target, ctrl, set, ns)),
        },
        // I/O command set specific Identify Controller. NVM: no fields we set
        // (no DMRL/WZSL limits beyond MDTS). KV 1.0 defines no field a host we
        // know reads (Linux never asks; SPDK's KV host reads only a version
        // it does not act on), so all-zero claims nothing.
        cns::CSI_CONTROLLER => match CommandSet::from_csi(csi_v) {
            Some(_) => Ok(zeroed()),
            None => Err(Status::INVALID_FIELD),
        },
        // Linux 6.1 reads this for namespaces of command sets other than NVM
        // and ZNS (`nvme_ns_info_from_id_cs_indep`).
        cns::CS_INDEPENDENT_NAMESPACE => active().and_then(|ns| match ns {
            Some(ns) => {
                let mut id = cs_independent_namespace();
                id.anagrpid = super::ana::anagrpid(&ctrl.subsys, &ns);
                Ok(AdminOutcome::data(id.encode()))
            }
            None => Err(Status::INVALID_NAMESPACE),
        }),
        // CDW10 bits 31:16 name the controller; this one (or 0, which a host
        // that leaves the field clear sends) is the only one we describe.
        cns::IO_COMMAND_SET => io_command_set(ctrl, sqe),
        _ => Err(Status::INVALID_FIELD),
    };
    result.unwrap_or_else(AdminOutcome::status)
}

/// The namespace an NSID-taking CNS names: Err for an NSID that can name no
/// namespace, Ok(None) for one that is inactive (none there, or of a command
/// set this controller has not enabled).
fn active_namespace(
    ctrl: &Controller,
    nsid: u32,
    enabled: u64,
) -> Result<Option<Arc<Namespace>>, Status> {
    if nsid == 0 || nsid == 0xFFFF_FFFF || nsid > MAX_NAMESPACES {
        return Err(Status::INVALID_NAMESPACE);
    }
    Ok(ctrl
        .subsys
        .namespace(nsid)
        .filter(|ns| enabled & csi_bit(ns.command_set.csi()) != 0))
}

/// NVM Identify Namespace (CNS 00h); an inactive NSID in range returns a
/// zeroed structure. A namespace of another command set has no such
/// structure: Invalid I/O Command Set, unless the subsystem answers hosts
/// that ask every namespace for it (`nvm_identify_for_kv`).
fn nvm_identify_namespace(
    ctrl: &Controller,
    ns: Option<Arc<Namespace>>,
) -> Result<AdminOutcome, Status> {
    match ns {
        Some(ns) if ns.command_set == CommandSet::Nvm => {
            let mut id = identify_namespace(&ns);
            id.anagrpid = super::ana::anagrpid(&ctrl.subsys, &ns);
            Ok(AdminOutcome::data(id.encode()))
        }
        Some(ns) if ctrl.subsys.nvm_identify_for_kv.load(Ordering::Acquire) => {
            Ok(AdminOutcome::data(identify_namespace(&ns).encode()))
        }
        Some(_) => Err(Status::INVALID_IOCS),
        None => Ok(AdminOutcome::data(vec![0; nvme::IDENTIFY_LEN])),
    }
}

/// I/O command set specific Identify Namespace (CNS 05h) for command set
/// `set`: Invalid Field in Command for a namespace of another set.
fn csi_identify_namespace(
    target: &Target,
    ctrl: &Controller,
    set: CommandSet,
    ns: Option<Arc<Namespace>>,
) -> Result<AdminOutcome, Status> {
    match ns {
        // The NVM command set specific structure: all fields zero is
        // correct for a namespace without protection information or
        // extended LBA formats.
        Some(ns) if ns.command_set == set && set == CommandSet::Nvm => {
            Ok(AdminOutcome::data(vec![0; nvme::IDENTIFY_LEN]))
        }
        Some(ns) if ns.command_set == set => {
            let mut id = kv_identify_namespace(target, &ns);
            id.anagrpid = super::ana::anagrpid(&ctrl.subsys, &ns);
            Ok(AdminOutcome::data(id.encode()))
        }
        Some(_) => Err(Status::INVALID_FIELD),
        // Unlike CNS 00h, no zeroed structure for an inactive NSID:
        // Linux nvmet answers Invalid Namespace here, and hosts only
        // ask for namespaces they found active.
        None => Err(Status::INVALID_NAMESPACE),
    }
}

/// The I/O Command Set data structure (CNS 1Ch) of the controller CDW10
/// names.
fn io_command_set(ctrl: &Controller, sqe: &Sqe) -> Result<AdminOutcome, Status> {
    let cntid = (sqe.cdw(10) >> 16) as u16;
    if cntid == 0 || cntid == ctrl.cntlid {
        Ok(AdminOutcome::data(nvme::encode_io_command_set_vectors(
            &IO_COMMAND_SET_COMBINATIONS,
        )))
    } else {
        Err(Status::INVALID_FIELD)
    }
}

/// An active namespace ID list: NSIDs above `nsid` whose namespace passes
/// `include`.
fn active_ns_list(
    ctrl: &Controller,
    nsid: u32,
    include: impl Fn(&Namespace) -> bool,
) -> Result<AdminOutcome, Status> {
    if nsid >= 0xFFFF_FFFE {
        return Err(Status::INVALID_NAMESPACE);
    }
    let mut ids: Vec<u32> = ctrl
        .subsys
        .namespace_snapshot()
        .iter()
        .filter(|n| include(n))
        .map(|n| n.nsid)
        .collect();
    ids.sort_unstable();
    Ok(AdminOutcome::data(nvme::encode_ns_list(
        ids.into_iter(),
        nsid,
    )))
}

/// The I/O Command Set Independent Identify Namespace of an active namespace.
pub fn cs_independent_namespace() -> CsIndependentNamespace {
    CsIndependentNamespace {
        // May be attached to more than one controller, as in CNS 00h.
        nmic: 1,
        // Ready for I/O as soon as it is in the subsystem: Linux ignores a
        // namespace whose NSTAT says otherwise.
        nstat: nvme::NSTAT_READY,
        ..Default::default()
    }
}

/// The longest KV key this target keeps: the most the command carries.
pub const KV_KEY_MAX_BYTES: u16 = nvme::KV_KEY_MAX_LEN as u16;

/// KV command set specific Identify Namespace of a KV namespace: sizes in
/// bytes; one KV format with 16-byte keys and values up to the largest
/// transfer a command may carry (MDTS), so that a value always fits one
/// Store or Retrieve.
pub fn kv_identify_namespace(target: &Target, ns: &Namespace) -> KvIdentifyNamespace {
    let size = ns.dev.size_bytes();
    let (mut nuse, nsfeat) = match ns.dev.thin_info() {
        Some(t) => (t.used_bytes.min(size), nvme::NSFEAT_THIN),
        None => (size, 0),
    };
    // A KV namespace's use is its values' blocks, and its key count is
    // bounded by the pool's checkpoint room.
    let mut mnk = 0;
    if let Some(kv) = &ns.kv {
        nuse = (kv.used_blocks() * kv.block_size() as u64).min(size);
        mnk = kv.max_keys().min(u32::MAX as u64) as u32;
    }
    KvIdentifyNamespace {
        nsze: size,
        nuse,
        nsfeat,
        nmic: 1,
        novg: ns.block_size,
        nguid: ns.nguid,
        eui64: ns.eui64,
        kvf: vec![KvFormat {
            kml: KV_KEY_MAX_BYTES,
            fopt: 0,
            vml: ns.kv_value_max(target.limits.max_io_size),
            mnk,
        }],
        ..Default::default()
    }
}

/// Identify Controller as the host sees it.
pub fn identify_controller(target: &Target, ctrl: &Controller) -> IdentifyController {
    let lim = &target.limits;
    let discovery = ctrl.is_discovery();
    let mdts = (lim.max_io_size / 4096).max(1).trailing_zeros() as u8;
    let mut id = IdentifyController {
        vid: 0,
        ssvid: 0,
        serial: ctrl.subsys.serial.clone(),
        model: ctrl.subsys.model.clone(),
        firmware: target.firmware.clone(),
        ieee_oui: IEEE_OUI,
        mdts,
        cntlid: ctrl.cntlid,
        version: VERSION,
        cntrltype: if discovery { 2 } else { 1 },
        acl: 3,
        aerl: (MAX_AERS - 1) as u8,
        // Namespace Attribute Notices: namespaces come and go at run time (RPC).
        // Discovery Log Page Change notices (discovery controllers):
        // listeners, subsystems, hosts and cluster peers change at run time.
        oaes: if discovery {
            super::controller::AEC_DISCOVERY_LOG
        } else {
            super::controller::AEC_NS_ATTR
        },
        // Extended data for Get Log Page (offsets, 32-bit NUMD), and a bit
        // per page served that has one.
        lpa: super::log_page::lpa(discovery),
        elpe: (ERROR_LOG_ENTRIES - 1) as u8,
        kas: KAS_100MS,
        sqes: 0x66,
        cqes: 0x44,
        maxcmd: lim.max_queue_depth,
        // SGLs supported, byte aligned; SGL offsets supported (in-capsule data);
        // over RDMA also Keyed SGL Data Block descriptors (bit 2), which the
        // Linux RDMA host requires.
        sgls: 0x1
            | 1 << 20
            | if ctrl.keyed_sgl.load(std::sync::atomic::Ordering::Acquire) {
                1 << 2
            } else {
                0
            },
        subnqn: ctrl.subsys.nqn.clone(),
        ioccsz: (nvme::SQE_LEN as u32 + lim.in_capsule_data) / 16,
        iorcsz: (nvme::CQE_LEN / 16) as u32,
        icdoff: 0,
        fcatt: 0,
        msdbd: 1,
        ..Default::default()
    };
    if discovery {
        id.serial = target.discovery_serial.clone();
        id.maxcmd = lim.max_admin_queue_depth;
    } else {
        io_controller_fields(ctrl, &mut id);
    }
    id
}

/// The Identify Controller fields of an I/O (not discovery) controller.
fn io_controller_fields(ctrl: &Controller, id: &mut IdentifyController) {
    // May contain more than one controller: lets the host share namespaces
    // across paths (native multipath).
    id.cmic = 0x02;
    // Firmware slot 1, read-only.
    id.frmw = 0x03;
    id.nn = MAX_NAMESPACES;
    id.mnan = MAX_NAMESPACES;
    // Dataset Management, Write Zeroes, Reservations.
    id.oncs = 0x04 | 0x08 | super::reservation::ONCS_RESERVATIONS;
    // Volatile write cache present; Flush with NSID FFFFFFFFh supported.
    // A subsystem whose namespaces all write through has none (hosts then
    // send no flushes; the field is all zeros without a cache).
    let namespaces = ctrl.subsys.namespace_snapshot();
    let cached = namespaces.is_empty() || namespaces.iter().any(|n| !n.write_through);
    id.vwc = if cached { 0x01 | 0x06 } else { 0 };
    if ctrl.subsys.ana.is_reporting() {
        id.cmic = super::ana::CMIC_ANA;
        id.oaes |= super::ana::AEC_ANA_CHANGE;
        id.anatt = super::ana::ANATT_SECS;
        id.anacap = super::ana::ANACAP;
        id.anagrpmax = super::ana::MAX_ANA_GROUPS;
        id.nanagrpid = super::ana::MAX_ANA_GROUPS;
    }
}

/// Identify Namespace for an active namespace.
pub fn identify_namespace(ns: &super::Namespace) -> IdentifyNamespace {
    let thin = ns.dev.thin_info();
    let (nuse, nsfeat, dlfeat) = match thin {
        // A pool volume: NUSE is what is written; NSFEAT bit 0 says NUSE is
        // meaningful (thin provisioning). Volumes that fail reads of unwritten
        // blocks set DAE (bit 2) and report no fixed value for deallocated
        // blocks; the others read them as zeros. Bit 3: Write Zeroes may
        // deallocate.
        Some(t) if t.unwritten_error => (t.used_bytes / ns.block_size as u64, 0x01 | 0x04, 0x08),
        Some(t) => (t.used_bytes / ns.block_size as u64, 0x01, 0x01 | 0x08),
        None => (ns.num_blocks, 0, 0x01 | 0x08),
    };
    IdentifyNamespace {
        nsze: ns.num_blocks,
        ncap: ns.num_blocks,
        nuse: nuse.min(ns.num_blocks),
        nsfeat,
        lbads: ns.lbads(),
        // May be attached to more than one controller.
        nmic: 1,
        rescap: super::reservation::rescap(ns.reservation.ptpl_capable()),
        dlfeat,
        nvmcap: ns.num_blocks as u128 * ns.block_size as u128,
        nguid: ns.nguid,
        eui64: ns.eui64,
        ..Default::default()
    }
}

fn get_log_page(target: &Target, ctrl: &Controller, sqe: &Sqe, now: Instant) -> AdminOutcome {
    let cmd = GetLogPage::parse(sqe);
    let max_len = target.limits.max_io_size as usize;
    match super::log_page::read(target, ctrl, &cmd, now, max_len) {
        Ok(data) => AdminOutcome::data(data),
        Err(status) => AdminOutcome::status(status),
    }
}

fn set_features(target: &Target, ctrl: &Controller, sqe: &Sqe, now: Instant) -> AdminOutcome {
    let cdw10 = sqe.cdw(10);
    let cdw11 = sqe.cdw(11);
    let f = (cdw10 & 0xFF) as u8;
    if cdw10 & (1 << 31) != 0 {
        return AdminOutcome::status(Status::FEATURE_NOT_SAVEABLE);
    }
    if !ctrl.is_discovery() {
        if let Some(a) = super::reservation::set_feature(ctrl, sqe.nsid(), f, cdw11) {
            return feature_answer(a);
        }
    }
    let Ok(mut regs) = ctrl.regs.lock() else {
        return AdminOutcome::status(Status::INTERNAL_ERROR);
    };
    match f {
        fid::KEEP_ALIVE_TIMER => {
            ctrl.kato_ms.store(cdw11, Ordering::Relaxed);
            ctrl.keep_alive(now);
            AdminOutcome::ok(0)
        }
        fid::ASYNC_EVENT_CONFIG => {
            regs.async_event_config = cdw11;
            AdminOutcome::ok(0)
        }
        _ if ctrl.is_discovery() => AdminOutcome::status(Status::INVALID_FIELD),
        fid::NUMBER_OF_QUEUES => {
            let nsqr = cdw11 & 0xFFFF;
            let ncqr = cdw11 >> 16;
            if nsqr == 0xFFFF || ncqr == 0xFFFF {
                return AdminOutcome::status(Status::INVALID_FIELD);
            }
            if ctrl.connected_io_queues() > 0 {
                return AdminOutcome::status(Status::COMMAND_SEQUENCE_ERROR);
            }
            let want = nsqr.min(ncqr) + 1;
            let granted = want.min(target.limits.max_io_queues as u32) as u16;
            regs.io_queues_granted = granted;
            let g = (granted - 1) as u32;
            AdminOutcome::ok(g | g << 16)
        }
        fid::VOLATILE_WRITE_CACHE => {
            // Off: the queues run every later write as FUA.
            ctrl.write_cache.store(cdw11 & 1 != 0, Ordering::Release);
            AdminOutcome::ok(0)
        }
        // CDW11 bits 8:0: the index of a combination in Identify CNS 1Ch. An
        // index with no (or a zero) vector is rejected as the specification
        // says. Switching command sets under live I/O queues would change
        // which namespaces they may address mid-flight: like Number of Queues
        // it is refused once an I/O queue exists.
        fid::IO_COMMAND_SET_PROFILE => {
            let index = (cdw11 & 0x1FF) as u16;
            if IO_COMMAND_SET_COMBINATIONS
                .get(index as usize)
                .copied()
                .unwrap_or(0)
                == 0
            {
                return AdminOutcome::status(Status::IOCS_COMBINATION_REJECTED);
            }
            if ctrl.connected_io_queues() > 0 {
                return AdminOutcome::status(Status::COMMAND_SEQUENCE_ERROR);
            }
            regs.io_command_set_profile = index;
            AdminOutcome::ok(0)
        }
        fid::ARBITRATION
        | fid::POWER_MANAGEMENT
        | fid::TEMPERATURE_THRESHOLD
        | fid::ERROR_RECOVERY
        | fid::INTERRUPT_COALESCING
        | fid::WRITE_ATOMICITY => AdminOutcome::status(Status::FEATURE_NOT_CHANGEABLE),
        _ => AdminOutcome::status(Status::INVALID_FIELD),
    }
}

fn get_features(ctrl: &Controller, sqe: &Sqe) -> AdminOutcome {
    let cdw10 = sqe.cdw(10);
    let f = (cdw10 & 0xFF) as u8;
    let sel = (cdw10 >> 8) & 0x7;
    if !ctrl.is_discovery() && sel == 0 {
        if let Some(a) = super::reservation::get_feature(ctrl, sqe.nsid(), f, sqe.cdw(11)) {
            return feature_answer(a);
        }
    }
    let Ok(regs) = ctrl.regs.lock() else {
        return AdminOutcome::status(Status::INTERNAL_ERROR);
    };
    let discovery = ctrl.is_discovery();
    // (current value, default value, changeable)
    let (current, default, changeable) = match f {
        fid::KEEP_ALIVE_TIMER => (ctrl.kato_ms.load(Ordering::Relaxed), 0, true),
        fid::ASYNC_EVENT_CONFIG => (regs.async_event_config, 0, true),
        _ if discovery => return AdminOutcome::status(Status::INVALID_FIELD),
        fid::NUMBER_OF_QUEUES => {
            let g = regs.io_queues_granted.max(1) as u32 - 1;
            (g | g << 16, g | g << 16, true)
        }
        fid::VOLATILE_WRITE_CACHE => (ctrl.write_cache.load(Ordering::Acquire) as u32, 1, true),
        fid::IO_COMMAND_SET_PROFILE => (regs.io_command_set_profile as u32, 0, true),
        fid::ARBITRATION => (0, 0, false),
        fid::POWER_MANAGEMENT => (0, 0, false),
        fid::TEMPERATURE_THRESHOLD => {
            // DW11: TMPSEL (19:16), THSEL (21:20). There is only the composite
            // temperature (TMPSEL 0); with no WCTEMP reported, its over-temperature
            // threshold is FFFFh (never crossed) and its under-temperature one 0.
            let cdw11 = sqe.cdw(11);
            let (tmpsel, thsel) = ((cdw11 >> 16) & 0xF, (cdw11 >> 20) & 0x3);
            let tmpth = match (tmpsel, thsel) {
                (0, 0) => 0xFFFF,
                (0, 1) => 0,
                _ => return AdminOutcome::status(Status::INVALID_FIELD),
            };
            let v = tmpth | thsel << 20;
            (v, v, false)
        }
        fid::ERROR_RECOVERY => (0, 0, false),
        fid::INTERRUPT_COALESCING => (0, 0, false),
        fid::WRITE_ATOMICITY => (0, 0, false),
        _ => return AdminOutcome::status(Status::INVALID_FIELD),
    };
    let value = match sel {
        0 => current,
        1 | 2 => default,
        // Supported capabilities: bit 2 = changeable (not saveable, not per-ns).
        3 => (changeable as u32) << 2,
        _ => return AdminOutcome::status(Status::INVALID_FIELD),
    };
    AdminOutcome::ok(value)
}

/// A reservation feature's answer as the admin queue sends it.
fn feature_answer(a: super::reservation::FeatureAnswer) -> AdminOutcome {
    match a {
        Ok((result, data)) => AdminOutcome::Done {
            status: Status::SUCCESS,
            result,
            data,
        },
        Err(s) => AdminOutcome::status(s),
    }
}

/// A command arrived on the admin queue with the CID of an Asynchronous Event
/// Request the target still holds. SPDK's host completes its outstanding AERs
/// itself when it shuts a controller down or resets it, and then reuses their CIDs
/// (for the Property Get of CC in its shutdown sequence); SPDK's nvmf_tgt and Linux
/// nvmet accept that. The held AER is abandoned and the new command takes the CID;
/// returns false when `cid` is no held AER (a real CID conflict).
pub fn abandon_held_aer(aers: &mut Vec<u16>, cid: u16) -> bool {
    match aers.iter().position(|&a| a == cid) {
        Some(i) => {
            aers.remove(i);
            tracing::debug!(cid, "host reused a held AER's command id: AER abandoned");
            true
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Namespace, Subsystem, SubsystemKind, TransportLimits};
    use kvt_bdev::ram::RamDevice;
    use kvt_wire::nvme::lid;
    use std::sync::Arc;

    fn setup() -> (Target, Arc<Controller>) {
        let t = Target::new(TransportLimits::default());
        let s = Arc::new(Subsystem::new(
            "nqn.s",
            SubsystemKind::Nvm,
            "SER",
            "MOD",
            true,
            vec![],
        ));
        let dev = RamDevice::new("r", 1 << 20).unwrap();
        s.namespaces
            .write()
            .unwrap()
            .push(Arc::new(Namespace::new("nqn.s", 3, dev, 4096)));
        t.add_subsystem(s.clone());
        let c = Arc::new(Controller::new(
            7,
            s,
            "nqn.h",
            [0; 16],
            0,
            "t".into(),
            Instant::now(),
        ));
        (t, c)
    }

    fn data(o: AdminOutcome) -> Vec<u8> {
        match o {
            AdminOutcome::Done {
                status,
                data: Some(d),
                ..
            } if status.is_success() => d,
            other => panic!("{other:?}"),
        }
    }

    fn status(o: AdminOutcome) -> Status {
        match o {
            AdminOutcome::Done { status, .. } => status,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_discovery_controller_keeps_one_serial_number() {
        let (t, _) = setup();
        let d = Controller::new(
            1,
            t.discovery.clone(),
            "nqn.h",
            [0; 16],
            0,
            "t".into(),
            Instant::now(),
        );
        let first = identify_controller(&t, &d).serial;
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert_eq!(identify_controller(&t, &d).serial, first);
        assert_eq!(first.len(), 16);
        // Another target instance has its own.
        let (t2, _) = setup();
        assert_ne!(t2.discovery_serial, first);
    }

    #[test]
    fn identify_controller_has_what_linux_needs() {
        let (t, c) = setup();
        let mut s = Sqe::new(admin_opc::IDENTIFY, 1, 0);
        s.set_cdw(10, cns::CONTROLLER as u32);
        let id = IdentifyController::decode(&data(execute(&t, &c, &s, 0, Instant::now())));
        assert_eq!(id.icdoff, 0);
        assert!(id.sgls & 0x3 != 0);
        assert!(id.kas > 0);
        assert_eq!(id.cntrltype, 1);
        assert_eq!(id.cntlid, 7);
        assert_eq!(id.mdts, 8);
        assert_eq!(id.ioccsz, (64 + 8192) / 16);
        assert_eq!(id.subnqn, "nqn.s");
        assert_eq!(id.serial, "SER");
    }

    #[test]
    fn identify_namespaces() {
        let (t, c) = setup();
        let mut s = Sqe::new(admin_opc::IDENTIFY, 1, 3);
        let ns = IdentifyNamespace::decode(&data(execute(&t, &c, &s, 0, Instant::now())));
        assert_eq!(ns.nsze, 256);
        assert_eq!(ns.lbads, 12);
        s = Sqe::new(admin_opc::IDENTIFY, 1, 4);
        assert!(data(execute(&t, &c, &s, 0, Instant::now()))
            .iter()
            .all(|&b| b == 0));
        s = Sqe::new(admin_opc::IDENTIFY, 1, 0);
        assert_eq!(
            status(execute(&t, &c, &s, 0, Instant::now())),
            Status::INVALID_NAMESPACE
        );
        s.set_cdw(10, cns::ACTIVE_NS_LIST as u32);
        assert_eq!(
            nvme::decode_ns_list(&data(execute(&t, &c, &s, 0, Instant::now()))),
            vec![3]
        );
        let mut s = Sqe::new(admin_opc::IDENTIFY, 1, 3);
        s.set_cdw(10, cns::NS_DESCRIPTOR_LIST as u32);
        let d = nvme::decode_ns_descriptors(&data(execute(&t, &c, &s, 0, Instant::now())));
        assert_eq!(d.len(), 4);
        s.set_cdw(10, 0x42);
        assert_eq!(
            status(execute(&t, &c, &s, 0, Instant::now())),
            Status::INVALID_FIELD
        );
    }

    #[test]
    fn number_of_queues_is_clamped() {
        let (t, c) = setup();
        let mut s = Sqe::new(admin_opc::SET_FEATURES, 1, 0);
        s.set_cdw(10, fid::NUMBER_OF_QUEUES as u32);
        s.set_cdw(11, 1000 | 1000 << 16);
        match execute(&t, &c, &s, 0, Instant::now()) {
            AdminOutcome::Done { result, status, .. } => {
                assert!(status.is_success());
                assert_eq!(result & 0xFFFF, 126);
            }
            o => panic!("{o:?}"),
        }
        s.set_cdw(11, 0xFFFF);
        assert_eq!(
            status(execute(&t, &c, &s, 0, Instant::now())),
            Status::INVALID_FIELD
        );
    }

    #[test]
    fn log_pages_and_offsets() {
        let (t, c) = setup();
        let g = GetLogPage {
            lid: lid::SMART_HEALTH,
            lsp: 0,
            rae: false,
            len: 512,
            offset: 0,
            csi: 0,
        };
        assert_eq!(
            data(execute(
                &t,
                &c,
                &g.encode(1, 0xFFFF_FFFF),
                0,
                Instant::now()
            ))
            .len(),
            512
        );
        let g = GetLogPage {
            lid: lid::ERROR_INFO,
            len: 64,
            offset: 64,
            ..g
        };
        assert_eq!(
            data(execute(&t, &c, &g.encode(1, 0), 0, Instant::now())).len(),
            64
        );
        let g = GetLogPage {
            offset: 1 << 20,
            ..g
        };
        assert_eq!(
            status(execute(&t, &c, &g.encode(1, 0), 0, Instant::now())),
            Status::INVALID_FIELD
        );
        let g = GetLogPage { lid: 0x70, ..g };
        assert_eq!(
            status(execute(&t, &c, &g.encode(1, 0), 0, Instant::now())),
            Status::INVALID_LOG_PAGE
        );
    }

    #[test]
    fn aer_limit_and_unknown_opcode() {
        let (t, c) = setup();
        let s = Sqe::new(admin_opc::ASYNC_EVENT_REQUEST, 1, 0);
        assert_eq!(
            execute(&t, &c, &s, 0, Instant::now()),
            AdminOutcome::AsyncEventHeld
        );
        assert_eq!(
            status(execute(&t, &c, &s, MAX_AERS, Instant::now())),
            Status::ASYNC_EVENT_LIMIT
        );
        let s = Sqe::new(0xC5, 1, 0);
        assert_eq!(
            status(execute(&t, &c, &s, 0, Instant::now())),
            Status::INVALID_OPCODE
        );
    }

    #[test]
    fn temperature_threshold_can_be_read() {
        let (t, c) = setup();
        let result = |cdw11: u32| {
            let mut s = Sqe::new(admin_opc::GET_FEATURES, 1, 0);
            s.set_cdw(10, fid::TEMPERATURE_THRESHOLD as u32);
            s.set_cdw(11, cdw11);
            match execute(&t, &c, &s, 0, Instant::now()) {
                AdminOutcome::Done { result, status, .. } => (status, result),
                o => panic!("{o:?}"),
            }
        };
        assert_eq!(result(0), (Status::SUCCESS, 0xFFFF));
        assert_eq!(result(1 << 20), (Status::SUCCESS, 1 << 20));
        assert_eq!(result(1 << 16).0, Status::INVALID_FIELD, "no sensor 1");
        let mut s = Sqe::new(admin_opc::SET_FEATURES, 1, 0);
        s.set_cdw(10, fid::TEMPERATURE_THRESHOLD as u32);
        assert_eq!(
            status(execute(&t, &c, &s, 0, Instant::now())),
            Status::FEATURE_NOT_CHANGEABLE
        );
    }

    #[test]
    fn a_reused_aer_cid_abandons_only_that_aer() {
        let mut aers = vec![3, 4];
        assert!(abandon_held_aer(&mut aers, 3));
        assert_eq!(aers, vec![4]);
        assert!(
            !abandon_held_aer(&mut aers, 3),
            "no longer held: a real conflict"
        );
        assert!(!abandon_held_aer(&mut aers, 9));
        assert_eq!(aers, vec![4]);
    }
}
