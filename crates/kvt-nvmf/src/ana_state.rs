//! The ANA states a path reports (NVMe Base 2.0, 8.20), what they mean for
//! an I/O command, and the per-path and per-controller state that holds
//! them: the values `ana` and the controller share, kept apart so neither
//! imports the other's module for them.

use kvt_wire::nvme::Status;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};

/// ANA groups a subsystem has (ANAGRPMAX and NANAGRPID): one per possible
/// NSID (`MAX_NAMESPACES`), so a namespace's default group, its
/// NSID, always exists. Each path keeps one byte per group (1 KiB).
pub const MAX_ANA_GROUPS: u32 = super::MAX_NAMESPACES;
/// ANA Transition Time (ANATT), seconds: how long a host waits out the
/// change state before it gives up on a path. SPDK reports 10 too.
pub const ANATT_SECS: u8 = 10;
/// ANACAP: every state reported (bits 0-4: optimized, non-optimized,
/// inaccessible, persistent loss, change). Bit 6 (ANAGRPID never changes
/// while attached) stays clear: `nvmf_subsystem_set_ns_ana_group` moves
/// namespaces.
pub const ANACAP: u8 = 0x1F;
/// CMIC bits with ANA reporting: multi-port (0), multi-controller (1), ANA
/// reporting (3).
pub const CMIC_ANA: u8 = 0x01 | 0x02 | 0x08;
/// Log page identifier of the ANA log page.
pub const LID_ANA: u8 = kvt_wire::nvme::lid::ANA;
/// Get Log Page LSP bit 0 for LID 0Ch: Return Groups Only (no NSID lists).
pub const LSP_RGO: u8 = 0x01;
/// Asynchronous Event Configuration bit enabling ANA change notices (also
/// its OAES bit).
pub const AEC_ANA_CHANGE: u32 = 1 << 11;
/// AER completion dword 0 for an ANA change: notice (type 2), information
/// 03h, log page 0Ch.
pub const AEN_ANA_CHANGE: u32 = 0x000C_0302;
/// ANA log page header: change count (8), descriptor count (2), reserved (6).
pub const ANA_LOG_HEADER_LEN: usize = 16;
/// One group descriptor before its NSID list: ANAGRPID (4), NNSID (4),
/// change count (8), state (1), reserved (15).
pub const ANA_DESCRIPTOR_LEN: usize = 32;

/// Path Related status (SCT 3h): Asymmetric Access Persistent Loss.
pub const ASYMMETRIC_ACCESS_PERSISTENT_LOSS: Status = Status {
    sct: 3,
    sc: 0x01,
    dnr: false,
};
/// Path Related status (SCT 3h): Asymmetric Access Inaccessible.
pub const ASYMMETRIC_ACCESS_INACCESSIBLE: Status = Status {
    sct: 3,
    sc: 0x02,
    dnr: false,
};
/// Path Related status (SCT 3h): Asymmetric Access Transition.
pub const ASYMMETRIC_ACCESS_TRANSITION: Status = Status {
    sct: 3,
    sc: 0x03,
    dnr: false,
};

/// An ANA state, with its value in the log page's descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AnaState {
    Optimized = 0x01,
    NonOptimized = 0x02,
    Inaccessible = 0x03,
    PersistentLoss = 0x04,
    Change = 0x0F,
}

/// Every state, in the order metrics and docs list them.
pub const ANA_STATES: [AnaState; 5] = [
    AnaState::Optimized,
    AnaState::NonOptimized,
    AnaState::Inaccessible,
    AnaState::PersistentLoss,
    AnaState::Change,
];

/// Why an ANA request is refused; `field` names the parameter (a JSON-RPC
/// error says `field: message`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnaError {
    #[error("`{0}` is not an ANA state (optimized, non_optimized, inaccessible, persistent_loss, change)")]
    UnknownState(String),
    #[error("{0} is not an ANA group (1..={MAX_ANA_GROUPS})")]
    UnknownGroup(u64),
    #[error("the subsystem does not report ANA (create it with ana_reporting)")]
    NotReporting,
    #[error("{0} is not a listener of the subsystem")]
    NoListener(SocketAddr),
}

impl AnaError {
    /// The RPC parameter the error is about.
    pub fn field(&self) -> &'static str {
        match self {
            AnaError::UnknownState(_) => "ana_state",
            AnaError::UnknownGroup(_) => "anagrpid",
            AnaError::NotReporting => "ana_reporting",
            AnaError::NoListener(_) => "listen_address",
        }
    }
}

impl AnaState {
    /// SPDK's name (`nvmf_subsystem_listener_set_ana_state`'s `ana_state`).
    pub const fn name(self) -> &'static str {
        match self {
            AnaState::Optimized => "optimized",
            AnaState::NonOptimized => "non_optimized",
            AnaState::Inaccessible => "inaccessible",
            AnaState::PersistentLoss => "persistent_loss",
            AnaState::Change => "change",
        }
    }

    pub fn parse(s: &str) -> Result<AnaState, AnaError> {
        ANA_STATES
            .into_iter()
            .find(|st| st.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| AnaError::UnknownState(s.to_string()))
    }

    pub fn from_u8(v: u8) -> Option<AnaState> {
        ANA_STATES.into_iter().find(|st| *st as u8 == v)
    }

    /// The status an I/O command gets through a path in this state (None:
    /// it runs).
    pub const fn io_status(self) -> Option<Status> {
        match self {
            AnaState::Optimized | AnaState::NonOptimized => None,
            AnaState::Inaccessible => Some(ASYMMETRIC_ACCESS_INACCESSIBLE),
            AnaState::PersistentLoss => Some(ASYMMETRIC_ACCESS_PERSISTENT_LOSS),
            AnaState::Change => Some(ASYMMETRIC_ACCESS_TRANSITION),
        }
    }
}

/// A checked ANA group ID (1..=MAX_ANA_GROUPS).
pub fn check_group(grp: u64) -> Result<u32, AnaError> {
    match u32::try_from(grp) {
        Ok(g) if (1..=MAX_ANA_GROUPS).contains(&g) => Ok(g),
        _ => Err(AnaError::UnknownGroup(grp)),
    }
}

/// One listener's states, one per ANA group (index = ANAGRPID - 1). Written
/// by the control path, read by I/O queues without a lock.
pub struct PathAna {
    /// The subsystem listener (its `listen` entry, or the target listener)
    /// this path is.
    pub listener: SocketAddr,
    states: Box<[AtomicU8]>,
}

impl PathAna {
    pub fn new(listener: SocketAddr) -> PathAna {
        PathAna {
            listener,
            states: (0..MAX_ANA_GROUPS)
                .map(|_| AtomicU8::new(AnaState::Optimized as u8))
                .collect(),
        }
    }

    /// The state of group `grp` on this path.
    pub fn state(&self, grp: u32) -> AnaState {
        let i = grp.wrapping_sub(1) as usize;
        self.states
            .get(i)
            .and_then(|s| AnaState::from_u8(s.load(Ordering::Acquire)))
            .unwrap_or(AnaState::Inaccessible)
    }

    /// Sets group `grp` (checked by the caller); true if it changed.
    pub(super) fn set(&self, grp: u32, st: AnaState) -> bool {
        let i = grp.wrapping_sub(1) as usize;
        assert!(i < self.states.len(), "ANA group {grp} unchecked");
        self.states[i].swap(st as u8, Ordering::AcqRel) != st as u8
    }

    /// Groups not optimized, as (group, state): what a saved configuration
    /// and `nvmf_subsystem_get_listeners` need beyond the default.
    pub fn changed_groups(&self) -> Vec<(u32, AnaState)> {
        (1..=MAX_ANA_GROUPS)
            .map(|g| (g, self.state(g)))
            .filter(|(_, s)| *s != AnaState::Optimized)
            .collect()
    }
}

/// A controller's ANA: the path it came in through and whether its ANA
/// change event waits for the host to read the log page.
#[derive(Default)]
pub struct ControllerAna {
    pub path: OnceLock<Arc<PathAna>>,
    pub(super) event_masked: AtomicBool,
}
