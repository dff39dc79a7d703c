//! A controller: one host's association with one subsystem, created by an admin
//! queue Connect and joined by that host's I/O queues.

use super::{QpairStats, Subsystem};
use kvt_wire::nvme::{self, cc, csi, csi_bit, csts, ErrorLogEntry, Status};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Error log entries kept per controller (ELPE + 1).
pub const ERROR_LOG_ENTRIES: usize = 64;
/// Outstanding Async Event Requests allowed (AERL + 1).
pub const MAX_AERS: usize = 4;

/// Register and feature state changed only by admin commands.
#[derive(Debug, Clone)]
pub struct ControllerRegs {
    pub cc: u32,
    pub csts: u32,
    /// I/O queues granted by Set Features Number of Queues (1-based count).
    pub io_queues_granted: u16,
    pub async_event_config: u32,
    /// Namespaces changed since the host last read the Changed Namespace List.
    pub changed_ns: Vec<u32>,
    /// A Namespace Attribute Changed event was reported and the host has not
    /// read the log page yet: further ones are masked until it does.
    pub ns_event_masked: bool,
    /// Async events waiting for an outstanding Async Event Request (AER
    /// completion dword 0).
    pub pending_events: VecDeque<u32>,
    /// Discovery controllers: the discovery log generation the host has
    /// seen (its last read of the log, or the first look after Connect).
    pub disc_genctr: Option<u64>,
    /// A Discovery Log Page Change event was reported and the host has not
    /// read the log since: further ones are masked until it does.
    pub disc_event_masked: bool,
    /// I/O Command Set Profile feature: which entry of
    /// `IO_COMMAND_SET_COMBINATIONS` is in use when CC.CSS = 110b.
    pub io_command_set_profile: u16,
}

/// The I/O command set combinations this controller supports (Identify CNS
/// 1Ch), each a bit vector over CSIs. One combination: NVM and Key Value
/// together, so a host that enables all I/O command sets sees both kinds of
/// namespace at once.
pub const IO_COMMAND_SET_COMBINATIONS: [u64; 1] = [csi_bit(csi::NVM) | csi_bit(csi::KEY_VALUE)];

/// AER completion dword 0 for Namespace Attribute Changed: notice (type 2), info
/// 00h, log page 04h.
pub const AEN_NS_ATTR_CHANGED: u32 = 0x0004_0002;
/// Async Event Configuration bit enabling namespace attribute notices.
pub const AEC_NS_ATTR: u32 = 1 << 8;

/// AER completion dword 0 for a Discovery Log Page Change: notice (type 2),
/// info F0h, log page 70h.
pub const AEN_DISCOVERY_LOG_CHANGED: u32 = 0x0070_F002;
/// Async Event Configuration bit enabling Discovery Log Page Change notices
/// (discovery controllers; OAES reports it).
pub const AEC_DISCOVERY_LOG: u32 = 1 << 31;

/// SMART counters summed over a controller's queues.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct IoTotals {
    pub read_cmds: u64,
    pub write_cmds: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub media_errors: u64,
}

impl IoTotals {
    fn add(&mut self, st: &QpairStats) {
        self.read_cmds += st.reads.load(Ordering::Relaxed);
        self.write_cmds += st.writes.load(Ordering::Relaxed);
        self.read_bytes += st.read_bytes.load(Ordering::Relaxed);
        self.write_bytes += st.write_bytes.load(Ordering::Relaxed);
        self.media_errors += st.media_errors.load(Ordering::Relaxed);
    }
}

/// What the controller keeps of queues that have gone (cold: a queue
/// disconnecting).
#[derive(Default)]
struct Retired {
    totals: IoTotals,
    errors: Vec<ErrorLogEntry>,
}

pub struct Controller {
    pub cntlid: u16,
    pub subsys: Arc<Subsystem>,
    pub hostnqn: String,
    pub hostid: [u8; 16],
    /// Peer address of the admin queue, for logs.
    pub peer: String,
    /// Keep-alive timeout in ms; 0 = disabled.
    pub kato_ms: AtomicU32,
    /// When the last Keep Alive (or other admin command) arrived, as ms since
    /// `created`.
    last_keep_alive_ms: AtomicU64,
    created: Instant,
    /// The admin queue is NVMe/RDMA: Identify reports keyed SGL support and
    /// error log entries name RDMA as the transport.
    pub keyed_sgl: AtomicBool,
    /// Set when the controller is torn down (keep-alive expiry, admin queue gone,
    /// fatal error): every queue of it closes.
    failed: AtomicBool,
    /// The Volatile Write Cache feature (on by default): a host that turns it
    /// off gets every write durable before its completion. Read per write by
    /// the queues, so an atomic rather than in `regs`.
    pub write_cache: AtomicBool,
    pub regs: Mutex<ControllerRegs>,
    /// Which I/O queue IDs are connected (index = qid).
    io_queues: Mutex<IoQueueIds>,
    /// The counters and error entries of its connected queues, each written
    /// only by the reactor that owns the queue and summed when read.
    queues: Mutex<Vec<Arc<QpairStats>>>,
    retired: Mutex<Retired>,
    /// Error Information entries made so far (the next entry's error count).
    error_seq: AtomicU64,
    /// Reservation Notification log and mask (`nvmf::reservation`).
    pub reservation_log: Mutex<super::resv_notice::NoticeLog>,
    /// The path (listener) it came in through and its ANA event mask.
    pub ana: super::ana_state::ControllerAna,
}

/// One attachment of an I/O queue ID: only the queue that attached it can
/// free it, so a late release never frees the ID for its next holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QidHold(u64);

#[derive(Default)]
struct IoQueueIds {
    /// Index = qid.
    held: Vec<Option<QidHold>>,
    last: u64,
}

/// Why an I/O queue ID cannot be attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AttachError {
    #[error("queue ID outside 1..={limit}")]
    OutOfRange { limit: u16 },
    #[error("queue ID already connected")]
    Held,
    #[error("controller state poisoned")]
    Poisoned,
}

impl Controller {
    pub fn new(
        cntlid: u16,
        subsys: Arc<Subsystem>,
        hostnqn: &str,
        hostid: [u8; 16],
        kato_ms: u32,
        peer: String,
        now: Instant,
    ) -> Controller {
        Controller {
            cntlid,
            subsys,
            hostnqn: hostnqn.to_string(),
            hostid,
            peer,
            kato_ms: AtomicU32::new(kato_ms),
            last_keep_alive_ms: AtomicU64::new(0),
            created: now,
            keyed_sgl: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            write_cache: AtomicBool::new(true),
            regs: Mutex::new(ControllerRegs {
                cc: 0,
                csts: 0,
                io_queues_granted: 0,
                async_event_config: 0,
                changed_ns: Vec::new(),
                ns_event_masked: false,
                disc_genctr: None,
                disc_event_masked: false,
                pending_events: VecDeque::new(),
                io_command_set_profile: 0,
            }),
            io_queues: Mutex::new(IoQueueIds::default()),
            queues: Mutex::new(Vec::new()),
            retired: Mutex::new(Retired::default()),
            error_seq: AtomicU64::new(0),
            reservation_log: Mutex::new(Default::default()),
            ana: super::ana_state::ControllerAna::default(),
        }
    }

    pub fn is_discovery(&self) -> bool {
        self.subsys.kind == super::SubsystemKind::Discovery
    }

    fn now_ms(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.created).as_millis() as u64
    }

    /// Records host activity that resets the keep-alive timer.
    pub fn keep_alive(&self, now: Instant) {
        self.last_keep_alive_ms
            .store(self.now_ms(now), Ordering::Relaxed);
    }

    /// True when the keep-alive timer has run out. Like the Linux target we allow a
    /// grace period on top of KATO, since the host sends its keep-alive at KATO/2 at
    /// best and the network adds delay.
    pub fn keep_alive_expired(&self, now: Instant) -> bool {
        let kato = self.kato_ms.load(Ordering::Relaxed) as u64;
        if kato == 0 {
            return false;
        }
        let idle = self
            .now_ms(now)
            .saturating_sub(self.last_keep_alive_ms.load(Ordering::Relaxed));
        idle > kato + kato.min(5000)
    }

    /// A namespace of the subsystem was added, removed or changed: record it for
    /// the Changed Namespace List and raise the async event if the host asked for
    /// it and it is not masked.
    pub fn namespace_changed(&self, nsid: u32) {
        let Ok(mut regs) = self.regs.lock() else {
            return;
        };
        if !regs.changed_ns.contains(&nsid) {
            regs.changed_ns.push(nsid);
        }
        if regs.async_event_config & AEC_NS_ATTR != 0 && !regs.ns_event_masked {
            regs.ns_event_masked = true;
            regs.pending_events.push_back(AEN_NS_ATTR_CHANGED);
        }
    }

    /// A discovery controller's look at the discovery log generation `genctr`
    /// (cold: its admin queue's housekeeping): a generation the host has not
    /// seen raises the Discovery Log Page Change event when the host enabled
    /// it and no such event is out unread; with the event disabled the change
    /// counts as seen.
    pub fn discovery_log_check(&self, genctr: u64) {
        let Ok(mut regs) = self.regs.lock() else {
            return;
        };
        let seen = *regs.disc_genctr.get_or_insert(genctr);
        if seen == genctr || regs.disc_event_masked {
            return;
        }
        if regs.async_event_config & AEC_DISCOVERY_LOG == 0 {
            regs.disc_genctr = Some(genctr);
            return;
        }
        regs.disc_event_masked = true;
        regs.pending_events.push_back(AEN_DISCOVERY_LOG_CHANGED);
    }

    /// The host read the discovery log at generation `genctr`; unless it
    /// asked to retain the event (RAE), the next change is reported again.
    pub fn discovery_log_read(&self, genctr: u64, rae: bool) {
        if rae {
            return;
        }
        if let Ok(mut regs) = self.regs.lock() {
            regs.disc_genctr = Some(genctr);
            regs.disc_event_masked = false;
        }
    }

    /// A reservation notice for this controller's host: logged, and the
    /// Reservation Log Page Available event raised when it is not out yet.
    pub fn reservation_notice(&self, nsid: u32, notice: super::resv_notice::Notice) {
        let raise = self
            .reservation_log
            .lock()
            .is_ok_and(|mut l| l.post(nsid, notice));
        if let (true, Ok(mut regs)) = (raise, self.regs.lock()) {
            regs.pending_events
                .push_back(super::resv_notice::AEN_RESERVATION_LOG);
        }
    }

    /// The next async event to complete an outstanding AER with.
    pub fn take_event(&self) -> Option<u32> {
        self.regs.lock().ok()?.pending_events.pop_front()
    }

    pub fn fail(&self) {
        self.failed.store(true, Ordering::Release);
    }

    pub fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    pub fn is_ready(&self) -> bool {
        self.regs
            .lock()
            .map(|r| r.csts & csts::RDY != 0)
            .unwrap_or(false)
    }

    /// The command sets enabled now, as a CSI bit vector: CC.CSS = 000b
    /// enables NVM alone; 110b the combination the I/O Command Set Profile
    /// selects. Namespaces of other command sets are not active for this
    /// controller (they are left out of the active lists and Identify answers
    /// for them as for an inactive NSID).
    pub fn enabled_command_sets(&self) -> u64 {
        let Ok(regs) = self.regs.lock() else {
            return 0;
        };
        enabled_command_sets(regs.cc, regs.io_command_set_profile)
    }

    /// Registers I/O queue `qid` and returns the hold to release it with;
    /// fails if it is out of range or taken.
    pub fn attach_io_queue(&self, qid: u16, max_io_queues: u16) -> Result<QidHold, AttachError> {
        let granted = self.regs.lock().map(|r| r.io_queues_granted).unwrap_or(0);
        // A host that skipped Set Features Number of Queues gets the maximum.
        let limit = if granted == 0 { max_io_queues } else { granted };
        if qid == 0 || qid > limit {
            return Err(AttachError::OutOfRange { limit });
        }
        let Ok(mut q) = self.io_queues.lock() else {
            return Err(AttachError::Poisoned);
        };
        if q.held.len() <= qid as usize {
            q.held.resize(qid as usize + 1, None);
        }
        if q.held[qid as usize].is_some() {
            return Err(AttachError::Held);
        }
        q.last = q.last.wrapping_add(1);
        let hold = QidHold(q.last);
        q.held[qid as usize] = Some(hold);
        Ok(hold)
    }

    /// Frees queue ID `qid` if `hold` still holds it: releasing twice, or
    /// after another queue took the ID, changes nothing.
    pub fn detach_io_queue(&self, qid: u16, hold: QidHold) {
        if let Ok(mut q) = self.io_queues.lock() {
            if let Some(slot) = q.held.get_mut(qid as usize) {
                if *slot == Some(hold) {
                    *slot = None;
                }
            }
        }
    }

    /// Queue IDs connected now: 0 (admin) and every attached I/O queue.
    pub fn queue_ids(&self) -> Vec<u16> {
        let mut v = vec![0];
        if let Ok(q) = self.io_queues.lock() {
            v.extend(
                q.held
                    .iter()
                    .enumerate()
                    .filter(|(_, h)| h.is_some())
                    .map(|(i, _)| i as u16),
            );
        }
        v
    }

    pub fn connected_io_queues(&self) -> usize {
        self.io_queues
            .lock()
            .map(|q| q.held.iter().filter(|h| h.is_some()).count())
            .unwrap_or(0)
    }

    /// Property Get.
    pub fn get_property(&self, offset: u32, cap: u64) -> Result<u64, Status> {
        let regs = self.regs.lock().map_err(|_| Status::INTERNAL_ERROR)?;
        Ok(match offset {
            nvme::prop::CAP => cap,
            nvme::prop::VS => VERSION as u64,
            nvme::prop::CC => regs.cc as u64,
            nvme::prop::CSTS => regs.csts as u64,
            nvme::prop::NSSR => 0,
            _ => return Err(Status::INVALID_FIELD),
        })
    }

    /// Property Set: only CC is writable. Enabling sets RDY, a shutdown request
    /// completes at once (there is no volatile state a shutdown must wait for
    /// beyond what Flush already covers), clearing EN resets the controller.
    ///
    /// CC.CSS may be 000b (NVM) or 110b (all supported I/O command sets, what
    /// CAP.CSS bit 6 offers); enabling with any other value, like enabling with
    /// unsupported queue entry sizes, sets CSTS.CFS instead of RDY (what Linux
    /// nvmet does). CC.CSS may only change while the controller is disabled; a
    /// write that changes it while enabled keeps the old value.
    pub fn set_property(&self, offset: u32, value: u64) -> Result<(), Status> {
        if offset != nvme::prop::CC {
            return Err(Status::INVALID_FIELD);
        }
        let mut value = value as u32;
        let mut regs = self.regs.lock().map_err(|_| Status::INTERNAL_ERROR)?;
        let old = regs.cc;
        if value & cc::EN != 0 && old & cc::EN == 0 {
            // I/O queue entry sizes must be the standard 64/16 bytes if set.
            let iosqes = (value >> cc::IOSQES_SHIFT) & 0xF;
            let iocqes = (value >> cc::IOCQES_SHIFT) & 0xF;
            let css = (value & cc::CSS_MASK) >> cc::CSS_SHIFT;
            if (iosqes != 0 && iosqes != 6)
                || (iocqes != 0 && iocqes != 4)
                || !matches!(css, cc::CSS_NVM | cc::CSS_ALL_IOCS)
            {
                regs.csts |= csts::CFS;
                regs.cc = value;
                return Ok(());
            }
            regs.csts |= csts::RDY;
        } else if value & cc::EN == 0 && old & cc::EN != 0 {
            regs.csts &= !(csts::RDY | csts::SHST_MASK);
            // A controller reset returns features to their defaults.
            regs.io_command_set_profile = 0;
        } else if value & cc::EN != 0 {
            value = (value & !cc::CSS_MASK) | (old & cc::CSS_MASK);
        }
        if value & cc::SHN_MASK != 0 {
            regs.csts = (regs.csts & !csts::SHST_MASK) | csts::SHST_COMPLETE;
        } else if old & cc::SHN_MASK != 0 {
            regs.csts &= !csts::SHST_MASK;
        }
        regs.cc = value;
        Ok(())
    }

    /// A queue of this controller connected: its counters count for it.
    pub fn attach_queue(&self, st: &Arc<QpairStats>) {
        if let Ok(mut q) = self.queues.lock() {
            q.push(st.clone());
        }
    }

    /// The counters of the connected queues.
    pub fn queue_stats(&self) -> Vec<Arc<QpairStats>> {
        self.queues.lock().map(|q| q.clone()).unwrap_or_default()
    }

    /// A queue went: what it counted is kept.
    pub fn retire_queue(&self, st: &Arc<QpairStats>) {
        let gone = self.queues.lock().ok().and_then(|mut q| {
            let i = q.iter().position(|x| Arc::ptr_eq(x, st))?;
            Some(q.swap_remove(i))
        });
        let (Some(st), Ok(mut r)) = (gone, self.retired.lock()) else {
            return;
        };
        r.totals.add(&st);
        st.error_log.read_into(&mut r.errors);
        r.errors
            .sort_unstable_by_key(|e| std::cmp::Reverse(e.error_count));
        r.errors.truncate(ERROR_LOG_ENTRIES);
    }

    /// Adds an Error Information log entry for a failed command to the log of
    /// the queue it failed on (no lock: the queue's reactor owns that log).
    pub fn record_error(
        &self,
        queue: &QpairStats,
        sqid: u16,
        cid: u16,
        status: Status,
        nsid: u32,
        lba: u64,
    ) {
        let count = self.error_seq.fetch_add(1, Ordering::Relaxed) + 1;
        queue.error_log.push(&ErrorLogEntry {
            error_count: count,
            sqid,
            cid,
            status: status.to_field(),
            param_location: 0xFFFF,
            lba,
            nsid,
            trtype: if self.keyed_sgl.load(Ordering::Acquire) {
                nvme::trtype::RDMA
            } else {
                nvme::trtype::TCP
            },
        });
    }

    pub fn error_count(&self) -> u64 {
        self.error_seq.load(Ordering::Relaxed)
    }

    /// The newest Error Information entries over every queue, newest first.
    pub fn error_entries(&self) -> Vec<ErrorLogEntry> {
        let mut out = self
            .retired
            .lock()
            .map(|r| r.errors.clone())
            .unwrap_or_default();
        if let Ok(q) = self.queues.lock() {
            for st in q.iter() {
                st.error_log.read_into(&mut out);
            }
        }
        out.sort_unstable_by_key(|e| std::cmp::Reverse(e.error_count));
        out.truncate(ERROR_LOG_ENTRIES);
        out
    }

    /// SMART counters over every queue this controller has had.
    pub fn io_totals(&self) -> IoTotals {
        let mut t = self.retired.lock().map(|r| r.totals).unwrap_or_default();
        if let Ok(q) = self.queues.lock() {
            for st in q.iter() {
                t.add(st);
            }
        }
        t
    }

    pub fn uptime_hours(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.created).as_secs() / 3600
    }
}

/// The CSI bit vector CC and the I/O Command Set Profile index enable.
pub fn enabled_command_sets(cc_value: u32, profile: u16) -> u64 {
    match (cc_value & cc::CSS_MASK) >> cc::CSS_SHIFT {
        cc::CSS_ALL_IOCS => IO_COMMAND_SET_COMBINATIONS
            .get(profile as usize)
            .copied()
            .unwrap_or(0),
        cc::CSS_NVM => csi_bit(csi::NVM),
        _ => 0,
    }
}

/// NVMe version reported in VS: 1.4 (CNTRLTYPE and the fabrics fields we fill).
///
/// Not 2.0, although the Key Value command set and CC.CSS = 110b come from
/// the 2.0 family: hosts find I/O command set support through CAP.CSS bit 6,
/// not VS (Linux 6.1 `nvme_enable_ctrl` and `nvme_multi_css` look only at
/// CAP.CSS and CC.CSS; SPDK's host likewise gates on CAP.CSS), so 1.4 loses
/// nothing. Reporting 2.0 would oblige what 2.0 makes mandatory and we do
/// not implement: the Supported Log Pages and Feature Identifiers Supported
/// and Effects logs, CAP.CRMS and CC.CRIME (Linux 6.1 writes CC.CRIME when
/// CAP.CRMS says so and then treats NSTAT as authoritative), and per-CSI
/// Commands Supported and Effects for every CSI it advertises.
pub const VERSION: u32 = 0x0001_0400;

/// The CAP register value this target reports to `ctrl`.
pub fn cap(target: &super::Target, ctrl: &Controller) -> u64 {
    if ctrl.is_discovery() {
        cap_register(target.limits.max_admin_queue_depth)
    } else {
        cap_register(target.limits.max_queue_depth)
    }
}

/// The CAP register for a queue depth limit.
pub fn cap_register(max_queue_depth: u16) -> u64 {
    let mqes = (max_queue_depth.max(2) - 1) as u64;
    let cqr = 1u64 << 16; // contiguous queues required
    let to = 30u64 << 24; // ready timeout: 15 s in 500 ms units
                          // NVM command set, and I/O command sets through CC.CSS = 110b.
    mqes | cqr | to | nvme::cap::CSS_NVM | nvme::cap::CSS_IOCS
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SubsystemKind;
    use std::time::Duration;

    fn ctrl(kato: u32) -> Controller {
        let s = Arc::new(Subsystem::new(
            "nqn.s",
            SubsystemKind::Nvm,
            "S",
            "M",
            true,
            vec![],
        ));
        Controller::new(1, s, "nqn.h", [0; 16], kato, "test".into(), Instant::now())
    }

    #[test]
    fn enable_and_shutdown_sequence() {
        let c = ctrl(0);
        assert_eq!(c.get_property(nvme::prop::CSTS, 0).unwrap(), 0);
        c.set_property(nvme::prop::CC, (6 << 16 | 4 << 20 | 1) as u64)
            .unwrap();
        assert_eq!(
            c.get_property(nvme::prop::CSTS, 0).unwrap() as u32 & csts::RDY,
            1
        );
        assert!(c.is_ready());
        c.set_property(nvme::prop::CC, (6 << 16 | 4 << 20 | 1 | 1 << 14) as u64)
            .unwrap();
        let s = c.get_property(nvme::prop::CSTS, 0).unwrap() as u32;
        assert_eq!(s & csts::SHST_MASK, csts::SHST_COMPLETE);
        c.set_property(nvme::prop::CC, 0).unwrap();
        assert_eq!(c.get_property(nvme::prop::CSTS, 0).unwrap(), 0);
        assert_eq!(
            c.set_property(nvme::prop::CSTS, 1),
            Err(Status::INVALID_FIELD)
        );
        assert_eq!(c.get_property(0x1000, 0), Err(Status::INVALID_FIELD));
    }

    #[test]
    fn cap_advertises_nvm_and_io_command_sets() {
        let cap = cap_register(128);
        assert_eq!((cap >> 37) & 0xFF, 0b0100_0001, "CSS bits 0 and 6");
        assert_eq!(cap & 0xFFFF, 127);
    }

    #[test]
    fn cc_css_selects_the_enabled_command_sets() {
        let c = ctrl(0);
        let en = |css: u32| (6 << 16 | 4 << 20 | css << 4 | 1) as u64;
        c.set_property(nvme::prop::CC, en(0b000)).unwrap();
        assert!(c.is_ready());
        assert_eq!(c.enabled_command_sets(), 0b01);
        c.set_property(nvme::prop::CC, 0).unwrap();
        c.set_property(nvme::prop::CC, en(0b110)).unwrap();
        assert!(c.is_ready());
        assert_eq!(c.enabled_command_sets(), 0b11);
        // CSS cannot change while enabled: the write keeps 110b.
        c.set_property(nvme::prop::CC, en(0b000)).unwrap();
        assert_eq!(c.get_property(nvme::prop::CC, 0).unwrap() >> 4 & 7, 0b110);
        assert_eq!(c.enabled_command_sets(), 0b11);
        // A profile index past the supported combinations enables nothing.
        c.regs.lock().unwrap().io_command_set_profile = 1;
        assert_eq!(c.enabled_command_sets(), 0);
        // Reset: the profile returns to its default.
        c.set_property(nvme::prop::CC, 0).unwrap();
        assert_eq!(c.regs.lock().unwrap().io_command_set_profile, 0);
    }

    #[test]
    fn unsupported_cc_css_sets_fatal_status() {
        for css in [0b001u32, 0b010, 0b011, 0b100, 0b101, 0b111] {
            let c = ctrl(0);
            c.set_property(nvme::prop::CC, (6 << 16 | 4 << 20 | css << 4 | 1) as u64)
                .unwrap();
            let s = c.get_property(nvme::prop::CSTS, 0).unwrap() as u32;
            assert_eq!(
                (s & csts::CFS, s & csts::RDY),
                (csts::CFS, 0),
                "css {css:03b}"
            );
            assert_eq!(c.enabled_command_sets(), 0);
        }
    }

    #[test]
    fn bad_queue_entry_sizes_set_fatal_status() {
        let c = ctrl(0);
        c.set_property(nvme::prop::CC, (7 << 16 | 4 << 20 | 1) as u64)
            .unwrap();
        let s = c.get_property(nvme::prop::CSTS, 0).unwrap() as u32;
        assert_eq!(s & csts::CFS, csts::CFS);
        assert_eq!(s & csts::RDY, 0);
    }

    #[test]
    fn io_queue_ids_are_bounded_and_unique() {
        let c = ctrl(0);
        c.regs.lock().unwrap().io_queues_granted = 2;
        let first = c.attach_io_queue(1, 8).unwrap();
        assert_eq!(c.attach_io_queue(1, 8), Err(AttachError::Held));
        assert!(c.attach_io_queue(2, 8).is_ok());
        assert_eq!(
            c.attach_io_queue(3, 8),
            Err(AttachError::OutOfRange { limit: 2 })
        );
        assert!(c.attach_io_queue(0, 8).is_err());
        c.detach_io_queue(1, first);
        let second = c.attach_io_queue(1, 8).unwrap();
        assert_eq!(c.connected_io_queues(), 2);
        // The first holder letting go again (a Disconnect, then the socket
        // closing) leaves the new holder's ID alone.
        c.detach_io_queue(1, first);
        assert_eq!(c.attach_io_queue(1, 8), Err(AttachError::Held));
        c.detach_io_queue(1, second);
        assert_eq!(c.connected_io_queues(), 1);
    }

    #[test]
    fn keep_alive_disabled_never_expires() {
        let c = ctrl(0);
        let later = Instant::now() + Duration::from_secs(86_400);
        assert!(!c.keep_alive_expired(later));
    }

    #[test]
    fn keep_alive_expires_after_kato_and_its_grace_from_the_last_proof_of_life() {
        let c = ctrl(1000);
        let t0 = Instant::now();
        c.keep_alive(t0);
        let ms = |n| t0 + Duration::from_millis(n);
        // KATO 1 s plus a grace of min(KATO, 5 s).
        assert!(!c.keep_alive_expired(ms(2000)));
        assert!(c.keep_alive_expired(ms(2001)));
        // Traffic pushes it out again.
        c.keep_alive(ms(1500));
        assert!(!c.keep_alive_expired(ms(3500)));
        assert!(c.keep_alive_expired(ms(3501)));
        // A clock that seems to go back does not expire anything.
        assert!(!c.keep_alive_expired(t0));
    }

    #[test]
    fn error_log_is_bounded_newest_first_over_queues_and_keeps_departed_ones() {
        let c = ctrl(0);
        let queues: Vec<Arc<QpairStats>> = (0..8).map(|_| Arc::default()).collect();
        for q in &queues {
            c.attach_queue(q);
        }
        for i in 0..100u16 {
            let q = &queues[i as usize % queues.len()];
            c.record_error(q, 1, i, Status::LBA_OUT_OF_RANGE, 1, i as u64);
        }
        let e = c.error_entries();
        assert_eq!(e.len(), ERROR_LOG_ENTRIES);
        assert_eq!((e[0].cid, e[0].error_count), (99, 100));
        assert!(e.windows(2).all(|w| w[0].error_count > w[1].error_count));
        assert_eq!(c.error_count(), 100);
        // A queue that goes keeps its entries and counts in the controller's.
        queues[3].reads.store(5, Ordering::Relaxed);
        queues[4].reads.store(2, Ordering::Relaxed);
        c.retire_queue(&queues[3]);
        assert_eq!(c.error_entries(), e);
        assert_eq!(c.io_totals().read_cmds, 7);
    }

    #[test]
    fn error_log_entries_name_the_controllers_transport() {
        let c = ctrl(0);
        let q = Arc::new(QpairStats::default());
        c.attach_queue(&q);
        c.record_error(&q, 1, 1, Status::LBA_OUT_OF_RANGE, 1, 0);
        c.keyed_sgl.store(true, Ordering::Release);
        c.record_error(&q, 1, 2, Status::LBA_OUT_OF_RANGE, 1, 0);
        let e = c.error_entries();
        assert_eq!(
            (e[0].trtype, e[1].trtype),
            (nvme::trtype::RDMA, nvme::trtype::TCP)
        );
    }
}
