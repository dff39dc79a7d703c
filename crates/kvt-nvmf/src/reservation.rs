//! NVMe reservations of one namespace (NVMe Base 2.0, 8.19): the
//! registrants, the reservation and its holder, the generation, and the
//! access table of the six reservation types, as a pure state machine. The
//! four commands (Reservation Register, Report, Acquire, Release) decode
//! their fields into the requests here; the I/O queue asks [`ResvState::access`]
//! before a command of the NVM or KV command set touches the namespace.
//!
//! A host is named by its Host Identifier (128 bits over NVMe-oF, from
//! Connect); every controller of that host shares its registration.

use super::controller::Controller;
use kvt_meta::journal::MAX_RESV_REGISTRANTS;
use kvt_wire::nvme::Status;

/// I/O opcodes of the reservation commands (shared by the NVM and KV
/// command sets).
pub mod resv_opc {
    pub const REGISTER: u8 = 0x0D;
    pub const REPORT: u8 = 0x0E;
    pub const ACQUIRE: u8 = 0x11;
    pub const RELEASE: u8 = 0x15;
}

/// Feature identifiers of the reservation features.
pub mod resv_fid {
    pub const HOST_IDENTIFIER: u8 = 0x81;
    pub const NOTIFICATION_MASK: u8 = 0x82;
    pub const PERSISTENCE: u8 = 0x83;
}

/// The most Reservation Status data a Report returns: the 64-byte header
/// and 64-byte entries of the extended structure for 1023 registrants (far
/// more hosts than a subsystem admits).
pub const RESV_DATA_MAX: usize = 64 * 1024;

/// Log page identifier of the Reservation Notification log page.
pub const LID_RESERVATION_NOTIFICATION: u8 = kvt_wire::nvme::lid::RESERVATION_NOTIFICATION;

/// Host Identifier Inconsistent Format (command specific 18h): a Report
/// without the extended data structure while a registrant has a 128-bit
/// Host Identifier.
pub const HOST_ID_INCONSISTENT_FORMAT: Status = Status::specific(0x18).no_retry();

/// A reservation type (RTYPE).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ResvType {
    WriteExclusive = 1,
    ExclusiveAccess = 2,
    WriteExclusiveRegistrantsOnly = 3,
    ExclusiveAccessRegistrantsOnly = 4,
    WriteExclusiveAllRegistrants = 5,
    ExclusiveAccessAllRegistrants = 6,
}

impl ResvType {
    pub const ALL: [ResvType; 6] = [
        ResvType::WriteExclusive,
        ResvType::ExclusiveAccess,
        ResvType::WriteExclusiveRegistrantsOnly,
        ResvType::ExclusiveAccessRegistrantsOnly,
        ResvType::WriteExclusiveAllRegistrants,
        ResvType::ExclusiveAccessAllRegistrants,
    ];

    /// Decodes RTYPE; 0 and 7-255 are reserved.
    pub fn from_raw(v: u8) -> Result<ResvType, Status> {
        match v {
            1..=6 => Ok(ResvType::ALL[usize::from(v - 1)]),
            _ => Err(Status::INVALID_FIELD),
        }
    }

    pub fn raw(self) -> u8 {
        self as u8
    }

    /// Every registrant is a reservation holder (types 5 and 6).
    pub fn all_registrants(self) -> bool {
        matches!(
            self,
            ResvType::WriteExclusiveAllRegistrants | ResvType::ExclusiveAccessAllRegistrants
        )
    }

    /// Registrants that do not hold the reservation may read and write
    /// (types 3 to 6).
    fn registrants_access(self) -> bool {
        !matches!(self, ResvType::WriteExclusive | ResvType::ExclusiveAccess)
    }

    /// Hosts without access may still read (the Write Exclusive types).
    fn others_read(self) -> bool {
        matches!(
            self,
            ResvType::WriteExclusive
                | ResvType::WriteExclusiveRegistrantsOnly
                | ResvType::WriteExclusiveAllRegistrants
        )
    }
}

/// A Host Identifier: 64 bits (`extended` clear, the high 8 bytes zero) or
/// 128 bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct HostId {
    pub bytes: [u8; 16],
    pub extended: bool,
}

impl HostId {
    pub fn extended(bytes: [u8; 16]) -> HostId {
        HostId {
            bytes,
            extended: true,
        }
    }

    pub fn short(bytes: [u8; 8]) -> HostId {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&bytes);
        HostId {
            bytes: b,
            extended: false,
        }
    }
}

/// What a command does to the namespace's data, for the access table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// One registered host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registrant {
    pub host: HostId,
    pub key: u64,
    /// The controller that registered (reported in Report).
    pub cntlid: u16,
}

/// The reservation on the namespace, when there is one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub rtype: ResvType,
    /// The holder; for the all-registrants types every registrant holds it,
    /// and this is the host that acquired it.
    pub holder: HostId,
}

pub use super::resv_notice::*;

/// Reservation Register Action (RREGA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegisterAction {
    Register,
    Unregister,
    Replace,
}

/// Change Persist Through Power Loss State (CPTPL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cptpl {
    NoChange,
    Clear,
    Set,
}

/// A decoded Reservation Register command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Register {
    pub action: RegisterAction,
    pub iekey: bool,
    pub cptpl: Cptpl,
    pub crkey: u64,
    pub nrkey: u64,
}

impl Register {
    /// Decodes CDW10 and the 16-byte data (CRKEY, NRKEY).
    pub fn decode(cdw10: u32, data: &[u8]) -> Result<Register, Status> {
        let action = match cdw10 & 7 {
            0 => RegisterAction::Register,
            1 => RegisterAction::Unregister,
            2 => RegisterAction::Replace,
            _ => return Err(Status::INVALID_FIELD),
        };
        let cptpl = match cdw10 >> 30 {
            0 => Cptpl::NoChange,
            2 => Cptpl::Clear,
            3 => Cptpl::Set,
            _ => return Err(Status::INVALID_FIELD),
        };
        let (crkey, nrkey) = two_keys(data)?;
        Ok(Register {
            action,
            iekey: cdw10 & (1 << 3) != 0,
            cptpl,
            crkey,
            nrkey,
        })
    }
}

/// Reservation Acquire Action (RACQA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireAction {
    Acquire,
    Preempt,
    PreemptAndAbort,
}

/// A decoded Reservation Acquire command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acquire {
    pub action: AcquireAction,
    pub iekey: bool,
    pub rtype: ResvType,
    pub crkey: u64,
    pub prkey: u64,
}

impl Acquire {
    /// Decodes CDW10 and the 16-byte data (CRKEY, PRKEY).
    pub fn decode(cdw10: u32, data: &[u8]) -> Result<Acquire, Status> {
        let action = match cdw10 & 7 {
            0 => AcquireAction::Acquire,
            1 => AcquireAction::Preempt,
            2 => AcquireAction::PreemptAndAbort,
            _ => return Err(Status::INVALID_FIELD),
        };
        let rtype = ResvType::from_raw((cdw10 >> 8) as u8)?;
        let (crkey, prkey) = two_keys(data)?;
        Ok(Acquire {
            action,
            iekey: cdw10 & (1 << 3) != 0,
            rtype,
            crkey,
            prkey,
        })
    }
}

/// Reservation Release Action (RRELA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseAction {
    Release,
    Clear,
}

/// A decoded Reservation Release command. RTYPE is checked against the
/// reservation only by Release (0 is a valid value for Clear).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Release {
    pub action: ReleaseAction,
    pub iekey: bool,
    pub rtype: u8,
    pub crkey: u64,
}

impl Release {
    /// Decodes CDW10 and the 8-byte data (CRKEY).
    pub fn decode(cdw10: u32, data: &[u8]) -> Result<Release, Status> {
        let action = match cdw10 & 7 {
            0 => ReleaseAction::Release,
            1 => ReleaseAction::Clear,
            _ => return Err(Status::INVALID_FIELD),
        };
        let crkey = key_at(data, 0)?;
        Ok(Release {
            action,
            iekey: cdw10 & (1 << 3) != 0,
            rtype: (cdw10 >> 8) as u8,
            crkey,
        })
    }
}

fn key_at(data: &[u8], off: usize) -> Result<u64, Status> {
    let b = data.get(off..off + 8).ok_or(Status::INVALID_FIELD)?;
    let mut k = [0u8; 8];
    k.copy_from_slice(b);
    Ok(u64::from_le_bytes(k))
}

fn two_keys(data: &[u8]) -> Result<(u64, u64), Status> {
    Ok((key_at(data, 0)?, key_at(data, 8)?))
}

/// Notifications a command caused: each host named gets the notice on every
/// controller it has (its mask permitting).
pub type Notices = Vec<(HostId, Notice)>;

/// The reservation state of one namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResvState {
    pub registrants: Vec<Registrant>,
    pub held: Option<Held>,
    /// Reservation generation (PRGEN): counts Register, Unregister,
    /// Preempt and Clear.
    pub generation: u32,
    /// Persist Through Power Loss state (PTPLS).
    pub ptpl: bool,
}

impl ResvState {
    fn find(&self, host: &HostId) -> Option<usize> {
        self.registrants.iter().position(|r| r.host == *host)
    }

    pub fn is_registered(&self, host: &HostId) -> bool {
        self.find(host).is_some()
    }

    /// Whether `host` holds the reservation (for the all-registrants
    /// types: is a registrant).
    pub fn is_holder(&self, host: &HostId) -> bool {
        match self.held {
            Some(h) if h.rtype.all_registrants() => self.is_registered(host),
            Some(h) => h.holder == *host,
            None => false,
        }
    }

    /// The access table (NVMe Base 2.0, Reservation Type behaviour):
    /// whether `host` may issue a command of kind `access`.
    pub fn access(&self, host: &HostId, access: Access) -> Result<(), Status> {
        let Some(h) = self.held else { return Ok(()) };
        let allowed = self.is_holder(host)
            || (h.rtype.registrants_access() && self.is_registered(host))
            || (access == Access::Read && h.rtype.others_read());
        if allowed {
            Ok(())
        } else {
            Err(Status::RESERVATION_CONFLICT)
        }
    }

    /// Checks `host`'s registration and key (unless `iekey`); returns its
    /// index.
    fn check_key(&self, host: &HostId, crkey: u64, iekey: bool) -> Result<usize, Status> {
        let i = self.find(host).ok_or(Status::RESERVATION_CONFLICT)?;
        if !iekey && self.registrants[i].key != crkey {
            return Err(Status::RESERVATION_CONFLICT);
        }
        Ok(i)
    }

    /// Reservation Register. `ptpl_capable`: the namespace can persist
    /// (a PTPL change on one that cannot is an Invalid Field).
    pub fn register(
        &mut self,
        host: HostId,
        cntlid: u16,
        cmd: &Register,
        ptpl_capable: bool,
    ) -> Result<Notices, Status> {
        if cmd.cptpl != Cptpl::NoChange && !ptpl_capable {
            return Err(Status::INVALID_FIELD);
        }
        let notices = match cmd.action {
            RegisterAction::Register => self.add(host, cntlid, cmd.nrkey)?,
            RegisterAction::Unregister => {
                let i = self.check_key(&host, cmd.crkey, cmd.iekey)?;
                self.remove_at(i)
            }
            RegisterAction::Replace => {
                let i = self.check_key(&host, cmd.crkey, cmd.iekey)?;
                self.registrants[i].key = cmd.nrkey;
                Vec::new()
            }
        };
        match cmd.cptpl {
            Cptpl::NoChange => {}
            Cptpl::Clear => self.ptpl = false,
            Cptpl::Set => self.ptpl = true,
        }
        Ok(notices)
    }

    fn add(&mut self, host: HostId, cntlid: u16, key: u64) -> Result<Notices, Status> {
        match self.find(&host) {
            // Registering again with the same key is a success that changes
            // nothing; with another key it conflicts.
            Some(i) if self.registrants[i].key == key => Ok(Vec::new()),
            Some(_) => Err(Status::RESERVATION_CONFLICT),
            // No room: refused before anything changes (a pool volume could
            // not persist more, and no Report could list them). Internal
            // Error, as Linux nvmet answers a registrant it cannot allocate.
            None if self.registrants.len() >= MAX_RESV_REGISTRANTS => Err(Status::INTERNAL_ERROR),
            None => {
                self.registrants.push(Registrant { host, key, cntlid });
                self.generation = self.generation.wrapping_add(1);
                Ok(Vec::new())
            }
        }
    }

    /// Unregisters registrant `i`; the reservation goes with its holder
    /// (for the all-registrants types, with the last registrant).
    fn remove_at(&mut self, i: usize) -> Notices {
        let gone = self.registrants.remove(i);
        self.generation = self.generation.wrapping_add(1);
        let Some(h) = self.held else {
            return Vec::new();
        };
        let releases = if h.rtype.all_registrants() {
            self.registrants.is_empty()
        } else {
            h.holder == gone.host
        };
        if !releases {
            return Vec::new();
        }
        self.held = None;
        self.released_notices(h.rtype, &gone.host)
    }

    /// Registrants other than `by` learn of a release of a registrants-only
    /// or all-registrants reservation.
    fn released_notices(&self, rtype: ResvType, by: &HostId) -> Notices {
        if !rtype.registrants_access() {
            return Vec::new();
        }
        self.registrants
            .iter()
            .filter(|r| r.host != *by)
            .map(|r| (r.host, Notice::ReservationReleased))
            .collect()
    }

    /// Reservation Acquire (acquire, preempt, preempt and abort; the abort
    /// of the preempted hosts' commands is the caller's).
    pub fn acquire(&mut self, host: HostId, cmd: &Acquire) -> Result<Notices, Status> {
        self.check_key(&host, cmd.crkey, cmd.iekey)?;
        match cmd.action {
            AcquireAction::Acquire => self.take(host, cmd.rtype).map(|()| Vec::new()),
            AcquireAction::Preempt | AcquireAction::PreemptAndAbort => {
                self.preempt(host, cmd.rtype, cmd.prkey)
            }
        }
    }

    fn take(&mut self, host: HostId, rtype: ResvType) -> Result<(), Status> {
        match self.held {
            None => {
                self.held = Some(Held {
                    rtype,
                    holder: host,
                });
                Ok(())
            }
            Some(h) if h.rtype == rtype && self.is_holder(&host) => Ok(()),
            Some(_) => Err(Status::RESERVATION_CONFLICT),
        }
    }

    fn preempt(&mut self, host: HostId, rtype: ResvType, prkey: u64) -> Result<Notices, Status> {
        let held = self.held;
        let mut notices = match held {
            Some(h) if h.rtype.all_registrants() && prkey == 0 => {
                // Every other registrant goes; the reservation is created
                // anew for this host.
                let n = self.unregister_where(|r| r.host != host);
                self.held = Some(Held {
                    rtype,
                    holder: host,
                });
                n
            }
            Some(h) if !h.rtype.all_registrants() && self.holder_key() == Some(prkey) => {
                let n = self.unregister_where(|r| r.key == prkey && r.host != host);
                self.held = Some(Held {
                    rtype,
                    holder: host,
                });
                n
            }
            // No reservation, or PRKEY is not the holder's: only the
            // registrations with that key go.
            _ => {
                if prkey == 0 && held.is_some() {
                    return Err(Status::INVALID_FIELD);
                }
                let n = self.unregister_where(|r| r.key == prkey && r.host != host);
                if n.is_empty() {
                    return Err(Status::RESERVATION_CONFLICT);
                }
                n
            }
        };
        self.generation = self.generation.wrapping_add(1);
        if let (Some(before), Some(now)) = (held, self.held) {
            if before != now {
                // The remaining registrants other than the new holder see
                // the reservation preempted.
                notices.extend(
                    self.registrants
                        .iter()
                        .filter(|r| r.host != host)
                        .map(|r| (r.host, Notice::ReservationPreempted)),
                );
            }
        }
        Ok(notices)
    }

    fn holder_key(&self) -> Option<u64> {
        let h = self.held?;
        let i = self.find(&h.holder)?;
        Some(self.registrants[i].key)
    }

    /// Unregisters every registrant `pick` selects; each learns its
    /// registration was preempted.
    fn unregister_where(&mut self, pick: impl Fn(&Registrant) -> bool) -> Notices {
        let (gone, kept): (Vec<Registrant>, Vec<Registrant>) =
            self.registrants.iter().partition(|r| pick(r));
        self.registrants = kept;
        gone.into_iter()
            .map(|r| (r.host, Notice::RegistrationPreempted))
            .collect()
    }

    /// Reservation Release (release, clear).
    pub fn release(&mut self, host: HostId, cmd: &Release) -> Result<Notices, Status> {
        self.check_key(&host, cmd.crkey, cmd.iekey)?;
        match cmd.action {
            ReleaseAction::Release => {
                let Some(h) = self.held else {
                    return Ok(Vec::new());
                };
                if !self.is_holder(&host) {
                    return Ok(Vec::new());
                }
                if cmd.rtype != h.rtype.raw() {
                    return Err(Status::INVALID_FIELD);
                }
                self.held = None;
                Ok(self.released_notices(h.rtype, &host))
            }
            ReleaseAction::Clear => {
                let notices = self
                    .registrants
                    .iter()
                    .filter(|r| r.host != host)
                    .map(|r| (r.host, Notice::ReservationPreempted))
                    .collect();
                self.registrants.clear();
                self.held = None;
                self.generation = self.generation.wrapping_add(1);
                Ok(notices)
            }
        }
    }

    /// The Reservation Status data structure: extended (64-byte header and
    /// 64-byte registrant entries, 128-bit Host Identifiers) or not (24-byte
    /// header and entries, 64-bit Host Identifiers; Host Identifier
    /// Inconsistent Format when a registrant has a 128-bit one). The caller
    /// truncates to NUMD.
    pub fn report(&self, eds: bool) -> Result<Vec<u8>, Status> {
        if !eds && self.registrants.iter().any(|r| r.host.extended) {
            return Err(HOST_ID_INCONSISTENT_FORMAT);
        }
        let (head, entry) = if eds { (64, 64) } else { (24, 24) };
        let mut out = vec![0u8; head + entry * self.registrants.len()];
        out[0..4].copy_from_slice(&self.generation.to_le_bytes());
        out[4] = self.held.map_or(0, |h| h.rtype.raw());
        let regctl = u16::try_from(self.registrants.len()).unwrap_or(u16::MAX);
        out[5..7].copy_from_slice(&regctl.to_le_bytes());
        out[9] = u8::from(self.ptpl);
        for (i, r) in self.registrants.iter().enumerate() {
            let e = &mut out[head + i * entry..head + (i + 1) * entry];
            e[0..2].copy_from_slice(&r.cntlid.to_le_bytes());
            e[2] = u8::from(self.is_holder(&r.host));
            if eds {
                e[8..16].copy_from_slice(&r.key.to_le_bytes());
                e[16..32].copy_from_slice(&r.host.bytes);
            } else {
                e[8..16].copy_from_slice(&r.host.bytes[..8]);
                e[16..24].copy_from_slice(&r.key.to_le_bytes());
            }
        }
        Ok(out)
    }
}

/// A decoded Reservation Status data structure (the host's view; tests and
/// the in-repo initiator).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportView {
    pub generation: u32,
    pub rtype: u8,
    pub ptpl: bool,
    /// (cntlid, holds the reservation, host identifier, key).
    pub registrants: Vec<(u16, bool, HostId, u64)>,
}

/// Decodes a Reservation Status data structure `report` produced.
pub fn decode_report(b: &[u8], eds: bool) -> Option<ReportView> {
    let (head, entry) = if eds { (64, 64) } else { (24, 24) };
    let u16_at = |o: usize| b.get(o..o + 2).map(|s| u16::from_le_bytes([s[0], s[1]]));
    let u64_at = |o: usize| {
        let mut k = [0u8; 8];
        k.copy_from_slice(b.get(o..o + 8)?);
        Some(u64::from_le_bytes(k))
    };
    let mut g = [0u8; 4];
    g.copy_from_slice(b.get(0..4)?);
    let n = usize::from(u16_at(5)?);
    let mut registrants = Vec::with_capacity(n);
    for i in 0..n {
        let o = head + i * entry;
        let cntlid = u16_at(o)?;
        let holds = *b.get(o + 2)? & 1 != 0;
        let (host, key) = if eds {
            let mut h = [0u8; 16];
            h.copy_from_slice(b.get(o + 16..o + 32)?);
            (HostId::extended(h), u64_at(o + 8)?)
        } else {
            let mut h = [0u8; 8];
            h.copy_from_slice(b.get(o + 8..o + 16)?);
            (HostId::short(h), u64_at(o + 16)?)
        };
        registrants.push((cntlid, holds, host, key));
    }
    Some(ReportView {
        generation: u32::from_le_bytes(g),
        rtype: *b.get(4)?,
        ptpl: *b.get(9)? & 1 != 0,
        registrants,
    })
}

/// The reservation of a namespace as the target holds it: shared by every
/// controller's queues. A reservation command takes the state's lock; an
/// I/O command's access check does not (the `idle` flag, or the queue's
/// cached [`Verdict`] while `epoch` has not moved: `io::reservation::ResvCache`).
#[derive(Debug)]
pub struct NsReservation {
    pub state: std::sync::Mutex<ResvState>,
    /// Set when nobody is registered: an access check skips the lock.
    pub idle: std::sync::atomic::AtomicBool,
    /// Moves (inside the lock, Release) with every change of the
    /// registrants or the reservation ([`NsReservation::change`]): a
    /// [`Verdict`] read at epoch E holds while the epoch is still E.
    pub epoch: std::sync::atomic::AtomicU64,
    /// Where registrations persist through power loss (SPDK's `ptpl_file`,
    /// or the pool volume served); `None`: the namespace cannot persist them.
    pub sink: Option<ptpl::PtplSink>,
    /// The namespace's UUID (`bdev_uuid` in the PTPL file).
    pub ns_uuid: [u8; 16],
    /// How far the PTPL writer got with this namespace's file.
    pub durability: std::sync::Arc<ptpl::Durability>,
}

impl Default for NsReservation {
    fn default() -> NsReservation {
        NsReservation::new(None)
    }
}

impl NsReservation {
    pub fn new(ptpl_file: Option<std::path::PathBuf>) -> NsReservation {
        NsReservation::persisting(
            ResvState::default(),
            ptpl_file.map(ptpl::PtplSink::File),
            [0; 16],
        )
    }

    /// `state`, persisting in `sink`, for the namespace with UUID `ns_uuid`.
    fn persisting(
        state: ResvState,
        sink: Option<ptpl::PtplSink>,
        ns_uuid: [u8; 16],
    ) -> NsReservation {
        let idle = state.registrants.is_empty() && state.held.is_none();
        NsReservation {
            state: std::sync::Mutex::new(state),
            idle: std::sync::atomic::AtomicBool::new(idle),
            epoch: std::sync::atomic::AtomicU64::new(0),
            sink,
            ns_uuid,
            durability: Default::default(),
        }
    }

    /// Registrations that persist in `path` (loaded from it when it exists)
    /// for the namespace with UUID `ns_uuid`.
    pub fn with_ptpl_file(
        path: std::path::PathBuf,
        ns_uuid: [u8; 16],
    ) -> Result<NsReservation, ptpl::PtplError> {
        let state = ptpl::load(&path)?.unwrap_or_default();
        let sink = Some(ptpl::PtplSink::File(path));
        Ok(NsReservation::persisting(state, sink, ns_uuid))
    }

    /// Registrations that persist in the pool's metadata as a record of
    /// volume `vol` (loaded from it: the pool read it at open).
    pub fn for_pool_volume(
        pool: std::sync::Arc<kvt_pool::Pool>,
        vol: &kvt_pool::volume::Volume,
        ns_uuid: [u8; 16],
    ) -> NsReservation {
        let state = vol
            .reservation()
            .map(|r| ptpl::state_of_volume_resv(&r))
            .unwrap_or_default();
        let sink = ptpl::PtplSink::PoolVolume {
            pool,
            vol: vol.desc.id,
        };
        NsReservation::persisting(state, Some(sink), ns_uuid)
    }

    /// Whether the namespace can persist through power loss (RESCAP PTPL).
    pub fn ptpl_capable(&self) -> bool {
        self.sink.is_some()
    }

    /// The PTPL file, when the namespace persists in one.
    pub fn ptpl_file(&self) -> Option<&std::path::Path> {
        self.sink.as_ref().and_then(|s| s.file())
    }

    /// Runs `f` on the state; keeps `idle` in step with it.
    pub fn with<T>(&self, f: impl FnOnce(&mut ResvState) -> T) -> Result<T, Status> {
        self.with_persisted(f).map(|(out, _)| out)
    }

    /// `with`, handing a changed state to the namespace's PTPL sink when it
    /// has one (and PTPL is or was on): what to wait for before the change
    /// may be answered.
    pub fn with_persisted<T>(
        &self,
        f: impl FnOnce(&mut ResvState) -> T,
    ) -> Result<(T, Option<ptpl::PtplWait>), Status> {
        let mut s = self.state.lock().map_err(|_| Status::INTERNAL_ERROR)?;
        let before = self.sink.as_ref().map(|_| s.clone());
        let out = f(&mut s);
        let idle = s.registrants.is_empty() && s.held.is_none();
        self.idle.store(idle, std::sync::atomic::Ordering::Release);
        let mut wait = None;
        if let (Some(sink), Some(b)) = (&self.sink, before) {
            if b != *s && (s.ptpl || b.ptpl) {
                wait = Some(sink.persist(&s, &self.ns_uuid, &self.durability));
            }
        }
        Ok((out, wait))
    }

    /// `with_persisted` for a command that may change the registrants or
    /// the reservation (Register, Acquire, Release): moves `epoch` inside
    /// the lock, after `f` and before the lock is let go, so before the
    /// command can be answered.
    ///
    /// Why a command parsed after that answer sees the change without the
    /// lock: the answer is posted after this returns; the host sends its
    /// next command only once it has the answer, and the command reaches a
    /// reactor through the transport (socket or RDMA completion queue,
    /// whose kernel and driver synchronisation order it after the answer).
    /// So the reactor's Acquire load of `epoch` happens after this Release
    /// increment and cannot read an older value (coherence): it sees a new
    /// epoch, misses its cache and reads the state under the lock. A
    /// command that races the change (parsed before the answer) may get
    /// either verdict, as commands in flight together are unordered.
    pub fn change<T>(
        &self,
        f: impl FnOnce(&mut ResvState) -> T,
    ) -> Result<(T, Option<ptpl::PtplWait>), Status> {
        self.with_persisted(|s| {
            let out = f(s);
            self.epoch
                .fetch_add(1, std::sync::atomic::Ordering::Release);
            out
        })
    }

    /// What `host` may do here now, read under the lock with the epoch it
    /// holds at (exact: the epoch moves only under the same lock).
    pub fn verdict(&self, host: &HostId) -> Result<Verdict, Status> {
        let s = self.state.lock().map_err(|_| Status::INTERNAL_ERROR)?;
        Ok(Verdict {
            epoch: self.epoch.load(std::sync::atomic::Ordering::Acquire),
            read: s.access(host, Access::Read).is_ok(),
            write: s.access(host, Access::Write).is_ok(),
        })
    }

    /// Whether `host` may issue a command of kind `access` here (without a
    /// cache: the lock whenever someone is registered).
    pub fn access(&self, host: &HostId, access: Access) -> Result<(), Status> {
        if self.idle.load(std::sync::atomic::Ordering::Acquire) {
            return Ok(());
        }
        self.verdict(host)?.allows(access)
    }
}

/// One host's access to a namespace at one reservation epoch: what an I/O
/// queue caches so that its access checks take no lock in steady state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// The [`NsReservation::epoch`] the verdict was read at.
    pub epoch: u64,
    read: bool,
    write: bool,
}

impl Verdict {
    /// Reservation Conflict unless the host may issue `access`.
    pub fn allows(&self, access: Access) -> Result<(), Status> {
        let ok = match access {
            Access::Read => self.read,
            Access::Write => self.write,
        };
        if ok {
            Ok(())
        } else {
            Err(Status::RESERVATION_CONFLICT)
        }
    }
}

/// A feature's answer: completion dword 0 and data for the host.
pub type FeatureAnswer = Result<(u32, Option<Vec<u8>>), Status>;

/// Set Features of a reservation feature (`None`: `fid` is not one).
/// Host Identifier: over NVMe-oF the host identifier is the one Connect
/// carried, so it cannot change (Command Sequence Error, as Linux nvmet
/// answers; a host registered anywhere must not change it either).
/// Notification Mask: one mask for every namespace of the controller.
/// Persistence: PTPL of the namespace, on one that has a PTPL sink.
pub fn set_feature(ctrl: &Controller, nsid: u32, fid: u8, cdw11: u32) -> Option<FeatureAnswer> {
    Some(match fid {
        resv_fid::HOST_IDENTIFIER => Err(Status::COMMAND_SEQUENCE_ERROR),
        resv_fid::NOTIFICATION_MASK => match ctrl.reservation_log.lock() {
            Ok(mut l) => {
                l.mask = cdw11 & NOTICE_MASK_BITS;
                Ok((0, None))
            }
            Err(_) => Err(Status::INTERNAL_ERROR),
        },
        resv_fid::PERSISTENCE => set_persistence(ctrl, nsid, cdw11 & 1 != 0),
        _ => return None,
    })
}

/// The mask bits of the Reservation Notification Mask feature: Registration
/// Preempted (1), Reservation Released (2), Reservation Preempted (3).
pub const NOTICE_MASK_BITS: u32 = 0b1110;

fn set_persistence(ctrl: &Controller, nsid: u32, ptpl: bool) -> FeatureAnswer {
    let ns = ctrl
        .subsys
        .namespace(nsid)
        .ok_or(Status::INVALID_NAMESPACE)?;
    if !ns.reservation.ptpl_capable() && ptpl {
        return Err(Status::INVALID_FIELD);
    }
    ns.reservation.with(|s| s.ptpl = ptpl)?;
    Ok((0, None))
}

/// Get Features of a reservation feature (`None`: `fid` is not one).
/// Host Identifier: the 128-bit identifier (EXHID set; the 64-bit form
/// does not exist over NVMe-oF: Invalid Field).
pub fn get_feature(ctrl: &Controller, nsid: u32, fid: u8, cdw11: u32) -> Option<FeatureAnswer> {
    Some(match fid {
        resv_fid::HOST_IDENTIFIER if cdw11 & 1 == 0 => Err(Status::INVALID_FIELD),
        resv_fid::HOST_IDENTIFIER => Ok((0, Some(ctrl.hostid.to_vec()))),
        resv_fid::NOTIFICATION_MASK => ctrl
            .reservation_log
            .lock()
            .map(|l| (l.mask, None))
            .map_err(|_| Status::INTERNAL_ERROR),
        resv_fid::PERSISTENCE => {
            let ns = ctrl.subsys.namespace(nsid);
            match ns {
                Some(n) => n.reservation.with(|s| (u32::from(s.ptpl), None)),
                None => Err(Status::INVALID_NAMESPACE),
            }
        }
        _ => return None,
    })
}

/// Get Log Page 80h for `ctrl`.
pub fn notice_log_page(ctrl: &Controller, rae: bool) -> Vec<u8> {
    match ctrl.reservation_log.lock() {
        Ok(mut l) => l.read(rae),
        Err(_) => vec![0u8; NOTICE_LOG_PAGE],
    }
}

/// Reservation Capabilities (Identify Namespace RESCAP): PTPL (bit 0) when
/// the namespace has a PTPL sink (a file, or the pool volume it serves), all six types (bits 1-6), Ignore Existing
/// Key as NVMe 1.3 and later define it (bit 7).
pub fn rescap(ptpl_capable: bool) -> u8 {
    0xFE | u8::from(ptpl_capable)
}

/// ONCS bit 5: Reservations.
pub const ONCS_RESERVATIONS: u16 = 1 << 5;

pub mod ptpl;
#[cfg(test)]
mod tests;
