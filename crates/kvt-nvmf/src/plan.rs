//! The checked plan of an I/O command, which every command set's handler
//! and the queue's accounting share: what the command asks the device to
//! do, and where a KV command is in its steps.

use super::command::Transfer;
use kvt_pool::kv_index::KvLoc;
use kvt_wire::nvme::{KvKey, StoreOptions};

/// Where a KV command is in its steps (each step's device operation
/// completes into the next).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvStage {
    /// Not started.
    Start,
    /// A Store waits for the commit (a volume flush) that frees blocks other
    /// keys gave up; `tries` so far.
    Space { tries: u8 },
    /// A Store's blocks are claimed; the commit (a volume flush) that makes
    /// their release by other keys durable runs before the value is written.
    Claimed(KvLoc),
    /// A Store's value is being written there.
    Write(KvLoc),
    /// The index change is being committed (no volatile write cache).
    Durable,
    /// A Retrieve reads the value: `pin` holds its blocks; `xfer` bytes go to
    /// the host; the value is `len` bytes.
    Read { pin: u32, xfer: u32, len: u32 },
    /// A Retrieve's data is ready: `xfer` bytes.
    Sent { xfer: u32 },
}

/// What a checked I/O command asks the device to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoPlan {
    Read {
        offset: u64,
        len: usize,
    },
    Write {
        offset: u64,
        len: usize,
        fua: bool,
    },
    /// Flush this namespace, or every namespace (NSID FFFFFFFFh).
    Flush {
        all: bool,
    },
    WriteZeroes {
        offset: u64,
        len: u64,
        deallocate: bool,
    },
    /// Dataset Management with the deallocate attribute: `ranges` descriptors in the
    /// command's data.
    Deallocate {
        ranges: usize,
    },
    /// A command that succeeds without device work (DSM hints without deallocate).
    Nothing,
    /// KV Store of `len` bytes (the first `len` of the host's data).
    /// `durable`: no volatile write cache, so the key is committed before the
    /// completion.
    KvStore {
        key: KvKey,
        len: u32,
        opts: StoreOptions,
        durable: bool,
        stage: KvStage,
    },
    /// KV Retrieve into a host buffer of `buf` bytes (the smaller of HBS and
    /// the data descriptor).
    KvRetrieve {
        key: KvKey,
        buf: u32,
        stage: KvStage,
    },
    KvDelete {
        key: KvKey,
        durable: bool,
        stage: KvStage,
    },
    KvExist {
        key: KvKey,
    },
    /// KV List from `start` into a buffer of `buf` bytes.
    KvList {
        start: KvKey,
        buf: u32,
    },
    /// A reservation command (`io::reservation`): `len` bytes of host data
    /// it reads, or of Reservation Status data Report returns.
    Reservation {
        len: usize,
    },
}

impl IoPlan {
    /// What a successful command moved, for the queue pair's statistics.
    pub fn transfer(&self) -> Transfer {
        match *self {
            IoPlan::Read { len, .. } => Transfer::Read(len as u64),
            IoPlan::KvRetrieve {
                stage: KvStage::Sent { xfer },
                ..
            } => Transfer::Read(xfer as u64),
            IoPlan::Write { len, .. } => Transfer::Write(len as u64),
            IoPlan::KvStore { len, .. } => Transfer::Write(len as u64),
            _ => Transfer::Other,
        }
    }

    /// Bytes of read data the response carries (from the request's buffer).
    pub fn c2h_len(&self) -> Option<usize> {
        match *self {
            IoPlan::Read { len, .. } => Some(len),
            IoPlan::KvRetrieve {
                stage: KvStage::Sent { xfer },
                ..
            } => Some(xfer as usize),
            _ => None,
        }
    }

    /// A command of the KV command set (other than Flush, which is shared).
    pub fn is_kv(&self) -> bool {
        matches!(
            self,
            IoPlan::KvStore { .. }
                | IoPlan::KvRetrieve { .. }
                | IoPlan::KvDelete { .. }
                | IoPlan::KvExist { .. }
                | IoPlan::KvList { .. }
        )
    }
}
