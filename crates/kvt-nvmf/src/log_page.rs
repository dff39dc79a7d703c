//! Get Log Page: one table of the log pages the target serves (`LOG_PAGES`).
//! An entry names the page's LID, the controllers that serve it, the
//! Identify Controller LPA bits that advertise it, what Retain Asynchronous
//! Event means for it, and the function that builds it. `read` does the
//! rest for every page: the lookup, RAE, the offset and length rules; and
//! Identify Controller takes its LPA from the table (`lpa`).
//!
//! Adding a log page: its LID in `kvt_wire::nvme::lid`, its builder, one
//! entry here.

use super::controller::{
    Controller, AEN_DISCOVERY_LOG_CHANGED, AEN_NS_ATTR_CHANGED, ERROR_LOG_ENTRIES,
};
use super::resv_notice::AEN_RESERVATION_LOG;
use super::{ana, reservation, CommandSet, Target};
use kvt_wire::nvme::{
    self, admin_opc, io_opc, kv_opc, lid, GetLogPage, SmartLog, Status, ERROR_LOG_ENTRY_LEN,
};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Which controllers serve a log page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// Discovery controllers only.
    Discovery,
    /// I/O controllers only.
    Io,
    /// Discovery and I/O controllers.
    Both,
}

impl Served {
    fn by(self, discovery: bool) -> bool {
        match self {
            Served::Discovery => discovery,
            Served::Io => !discovery,
            Served::Both => true,
        }
    }
}

/// What Retain Asynchronous Event (CDW10 bit 15) does for a log page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rae {
    /// The page reports no asynchronous event: RAE changes nothing.
    NoEvent,
    /// The page is the log of the asynchronous event with this AER
    /// completion dword 0 (whose bits 23:16 are the page's LID). A read
    /// without RAE acknowledges it: the page's event may be reported again
    /// (and a page that is a queue of entries may drop what was read).
    /// With RAE the event stays out.
    Acknowledges(u32),
}

/// One log page the target serves.
pub struct LogPage {
    pub lid: u8,
    /// What the spec calls it, for logs and tests.
    pub name: &'static str,
    pub served: Served,
    /// The LPA bits (Identify Controller byte 261) saying the page is
    /// supported; 0 for a page the spec gives no bit (its support is
    /// implied by the version or reported elsewhere: ANA by CMIC, the
    /// reservation page by ONCS).
    pub lpa: u8,
    pub rae: Rae,
    /// Builds the whole page (`read` cuts out what the command asks for).
    pub build: fn(&LogRead<'_>) -> Result<Vec<u8>, Status>,
}

/// What a page's builder is given.
pub struct LogRead<'a> {
    pub target: &'a Target,
    pub ctrl: &'a Controller,
    pub cmd: &'a GetLogPage,
    pub now: Instant,
    /// RAE as it applies to this page: the host set it, or the page has no
    /// event (`Rae::NoEvent`). False: this read acknowledges the page's event.
    pub retain: bool,
}

/// LPA bit 1: the Commands Supported and Effects log page.
pub const LPA_COMMANDS_SUPPORTED: u8 = 1 << 1;
/// LPA bit 2: extended data for Get Log Page (a 32-bit NUMD and the
/// offset, LPOL/LPOU), for every page.
pub const LPA_EXTENDED_DATA: u8 = 1 << 2;

/// Every log page the target serves, by LID.
pub const LOG_PAGES: &[LogPage] = &[
    LogPage {
        lid: lid::ERROR_INFO,
        name: "Error Information",
        served: Served::Both,
        lpa: 0,
        // No Error status events are raised: the page is read, not announced.
        rae: Rae::NoEvent,
        build: error_info,
    },
    LogPage {
        lid: lid::SMART_HEALTH,
        name: "SMART / Health Information",
        served: Served::Io,
        lpa: 0,
        rae: Rae::NoEvent,
        build: smart_health,
    },
    LogPage {
        lid: lid::FIRMWARE_SLOT,
        name: "Firmware Slot Information",
        served: Served::Io,
        lpa: 0,
        rae: Rae::NoEvent,
        build: firmware_slot,
    },
    LogPage {
        lid: lid::CHANGED_NS_LIST,
        name: "Changed Namespace List",
        served: Served::Io,
        lpa: 0,
        rae: Rae::Acknowledges(AEN_NS_ATTR_CHANGED),
        build: changed_ns_list,
    },
    LogPage {
        lid: lid::COMMANDS_SUPPORTED,
        name: "Commands Supported and Effects",
        served: Served::Io,
        lpa: LPA_COMMANDS_SUPPORTED,
        rae: Rae::NoEvent,
        build: commands_supported,
    },
    LogPage {
        lid: lid::ANA,
        name: "Asymmetric Namespace Access",
        served: Served::Io,
        lpa: 0,
        rae: Rae::Acknowledges(ana::AEN_ANA_CHANGE),
        build: ana_page,
    },
    LogPage {
        lid: lid::DISCOVERY,
        name: "Discovery",
        served: Served::Discovery,
        lpa: 0,
        rae: Rae::Acknowledges(AEN_DISCOVERY_LOG_CHANGED),
        build: discovery,
    },
    LogPage {
        lid: lid::RESERVATION_NOTIFICATION,
        name: "Reservation Notification",
        served: Served::Io,
        lpa: 0,
        rae: Rae::Acknowledges(AEN_RESERVATION_LOG),
        build: reservation_notification,
    },
];

/// The page `lid` a discovery (or an I/O) controller serves, if any.
pub fn find(lid: u8, discovery: bool) -> Option<&'static LogPage> {
    LOG_PAGES
        .iter()
        .find(|p| p.lid == lid && p.served.by(discovery))
}

/// Identify Controller LPA of a discovery (or an I/O) controller: extended
/// data, and the bit of each page it serves.
pub fn lpa(discovery: bool) -> u8 {
    LOG_PAGES
        .iter()
        .filter(|p| p.served.by(discovery))
        .fold(LPA_EXTENDED_DATA, |bits, p| bits | p.lpa)
}

/// Get Log Page: the data the command asks for, `cmd.len` bytes from
/// `cmd.offset` (zeros past the page's end), at most `max_len` (MDTS).
pub fn read(
    target: &Target,
    ctrl: &Controller,
    cmd: &GetLogPage,
    now: Instant,
    max_len: usize,
) -> Result<Vec<u8>, Status> {
    let Some(page) = find(cmd.lid, ctrl.is_discovery()) else {
        return Err(Status::INVALID_LOG_PAGE);
    };
    let r = LogRead {
        target,
        ctrl,
        cmd,
        now,
        retain: cmd.rae || page.rae == Rae::NoEvent,
    };
    let bytes = (page.build)(&r)?;
    if cmd.offset % 4 != 0 || cmd.offset > bytes.len() as u64 {
        return Err(Status::INVALID_FIELD);
    }
    let start = cmd.offset as usize;
    // NUMD asks for up to 16 GiB; no command's data is longer than MDTS
    // (the queue refuses a longer SGL), so nothing past it is allocated.
    let mut out = vec![0u8; cmd.len.min(max_len)];
    let n = (bytes.len() - start).min(cmd.len);
    out[..n].copy_from_slice(&bytes[start..start + n]);
    Ok(out)
}

/// 01h: the controller's Error Information ring, newest first.
fn error_info(r: &LogRead<'_>) -> Result<Vec<u8>, Status> {
    let mut b = vec![0u8; ERROR_LOG_ENTRIES * ERROR_LOG_ENTRY_LEN];
    for (i, e) in r.ctrl.error_entries().iter().enumerate() {
        e.encode(&mut b[i * ERROR_LOG_ENTRY_LEN..(i + 1) * ERROR_LOG_ENTRY_LEN]);
    }
    Ok(b)
}

/// 02h: SMART / health of this controller's traffic.
fn smart_health(r: &LogRead<'_>) -> Result<Vec<u8>, Status> {
    Ok(smart_log(r.ctrl, r.now).encode())
}

/// SMART / health for this controller's traffic. A virtual device has no media wear
/// and no temperature sensor of its own; we report the host's first thermal zone
/// where one exists, so the value is real, and 0 (not reported) otherwise.
fn smart_log(ctrl: &Controller, now: Instant) -> SmartLog {
    let c = ctrl.io_totals();
    // Data units are thousands of 512-byte units, rounded up.
    let units = |bytes: u64| (bytes / 512).div_ceil(1000) as u128;
    SmartLog {
        critical_warning: 0,
        temperature: host_temperature_kelvin().unwrap_or(0),
        available_spare: 100,
        spare_threshold: 10,
        percent_used: 0,
        data_units_read: units(c.read_bytes),
        data_units_written: units(c.write_bytes),
        host_reads: c.read_cmds as u128,
        host_writes: c.write_cmds as u128,
        power_cycles: 1,
        power_on_hours: ctrl.uptime_hours(now) as u128,
        unsafe_shutdowns: 0,
        media_errors: c.media_errors as u128,
        error_log_entries: ctrl.error_count() as u128,
    }
}

fn host_temperature_kelvin() -> Option<u16> {
    let s = std::fs::read_to_string("/sys/class/thermal/thermal_zone0/temp").ok()?;
    let milli_c: i64 = s.trim().parse().ok()?;
    u16::try_from(milli_c / 1000 + 273).ok()
}

/// 03h: one read-only slot, active, holding the target's version.
fn firmware_slot(r: &LogRead<'_>) -> Result<Vec<u8>, Status> {
    let mut b = vec![0u8; 512];
    b[0] = 1; // active slot 1
    let fw = r.target.firmware.as_bytes();
    let n = fw.len().min(8);
    b[8..16].fill(b' ');
    b[8..8 + n].copy_from_slice(&fw[..n]);
    Ok(b)
}

/// 04h: the namespaces changed since the host last acknowledged the
/// Namespace Attribute Changed event; acknowledging clears the list.
fn changed_ns_list(r: &LogRead<'_>) -> Result<Vec<u8>, Status> {
    let mut b = vec![0u8; 4096];
    if let Ok(mut regs) = r.ctrl.regs.lock() {
        if regs.changed_ns.len() > 1024 {
            // More than 1024 changed: the first entry is FFFFFFFFh.
            b[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        } else {
            for (i, n) in regs.changed_ns.iter().enumerate() {
                b[i * 4..i * 4 + 4].copy_from_slice(&n.to_le_bytes());
            }
        }
        if !r.retain {
            regs.changed_ns.clear();
            regs.ns_event_masked = false;
        }
    }
    Ok(b)
}

/// 05h, per command set: Linux 6.1 reads it with the namespace's CSI when it
/// sets up a namespace of a CSI other than NVM (`nvme_alloc_ns_head`) and
/// drops the namespace if that fails.
fn commands_supported(r: &LogRead<'_>) -> Result<Vec<u8>, Status> {
    match CommandSet::from_csi(r.cmd.csi) {
        Some(set) => Ok(commands_supported_log(set)),
        None => Err(Status::INVALID_FIELD),
    }
}

/// Commands Supported and Effects for one command set: the admin commands,
/// then that set's I/O commands (CSUPP, and LBCC for those that change what
/// the namespace holds).
fn commands_supported_log(set: CommandSet) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    let csupp = 1u32;
    let lbcc = 1u32 << 1; // logical block (for KV: namespace) content change
    for opc in [
        admin_opc::GET_LOG_PAGE,
        admin_opc::IDENTIFY,
        admin_opc::ABORT,
        admin_opc::SET_FEATURES,
        admin_opc::GET_FEATURES,
        admin_opc::ASYNC_EVENT_REQUEST,
        admin_opc::KEEP_ALIVE,
    ] {
        b[opc as usize * 4..opc as usize * 4 + 4].copy_from_slice(&csupp.to_le_bytes());
    }
    let io: &[(u8, u32)] = match set {
        CommandSet::Nvm => &[
            (io_opc::FLUSH, csupp),
            (io_opc::WRITE, csupp | lbcc),
            (io_opc::READ, csupp),
            (io_opc::WRITE_ZEROES, csupp | lbcc),
            (io_opc::DATASET_MANAGEMENT, csupp | lbcc),
        ],
        CommandSet::KeyValue => &[
            (kv_opc::FLUSH, csupp),
            (kv_opc::STORE, csupp | lbcc),
            (kv_opc::RETRIEVE, csupp),
            (kv_opc::LIST, csupp),
            (kv_opc::DELETE, csupp | lbcc),
            (kv_opc::EXIST, csupp),
        ],
    };
    let resv = super::io::reservation::OPCODES.map(|o| (o, csupp));
    for &(opc, eff) in io.iter().chain(&resv) {
        let off = 1024 + opc as usize * 4;
        b[off..off + 4].copy_from_slice(&eff.to_le_bytes());
    }
    b
}

/// 0Ch: the groups' states on this controller's path; Invalid Log Page
/// when the subsystem does not report ANA.
fn ana_page(r: &LogRead<'_>) -> Result<Vec<u8>, Status> {
    ana::read_log_page(r.ctrl, r.cmd.lsp, r.retain).ok_or(Status::INVALID_LOG_PAGE)
}

/// 70h: the subsystems and listeners this host may use (and referrals).
fn discovery(r: &LogRead<'_>) -> Result<Vec<u8>, Status> {
    let genctr = r.target.genctr.load(Ordering::Relaxed);
    let entries = r.target.discovery_entries(&r.ctrl.hostnqn);
    r.ctrl.discovery_log_read(genctr, r.retain);
    Ok(nvme::encode_discovery_log(genctr, &entries))
}

/// 80h: the oldest reservation notice, consumed.
fn reservation_notification(r: &LogRead<'_>) -> Result<Vec<u8>, Status> {
    Ok(reservation::notice_log_page(r.ctrl, r.retain))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One entry per (LID, kind of controller), and each event a page
    /// acknowledges is one whose AER completion names that page.
    #[test]
    fn the_table_names_each_page_once_and_its_own_event() {
        for (i, p) in LOG_PAGES.iter().enumerate() {
            for q in &LOG_PAGES[i + 1..] {
                let both = [true, false]
                    .iter()
                    .any(|&d| p.served.by(d) && q.served.by(d));
                assert!(!(p.lid == q.lid && both), "{} and {}", p.name, q.name);
            }
            if let Rae::Acknowledges(aen) = p.rae {
                assert_eq!((aen >> 16) as u8, p.lid, "{}: AEN {aen:#x}", p.name);
            }
        }
    }

    /// LPA as Identify Controller reported it before the table: extended
    /// data everywhere, the Commands Supported and Effects page on I/O
    /// controllers only.
    #[test]
    fn lpa_comes_from_the_pages_served() {
        assert_eq!(lpa(true), 0x04);
        assert_eq!(lpa(false), 0x06);
        assert!(find(lid::DISCOVERY, true).is_some());
        assert!(find(lid::DISCOVERY, false).is_none());
        assert!(find(lid::SMART_HEALTH, true).is_none());
        assert!(find(lid::ERROR_INFO, true).is_some());
    }
}
