//! What can go wrong with a pool, as values: the control path (RPC, config,
//! tools) turns them into one-line messages or JSON-RPC errors. It lives here,
//! below the volume layer, because recovery, format and check return it too;
//! `kvt_pool::PoolError` names the same type.

use super::block::FormatError;
use super::superblock::MAX_NAME_LEN;
use kvt_bdev::sync_io::{errno_text, SyncIoError};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    #[error(transparent)]
    Io(#[from] SyncIoError),
    #[error(transparent)]
    Format(#[from] FormatError),
    /// An error about a pool's device, named by the device.
    #[error("{dev}: {source}")]
    OnDevice {
        dev: String,
        #[source]
        source: Box<PoolError>,
    },
    #[error("checkpoint header: belongs to another pool")]
    ForeignCheckpoint,
    #[error("superblock: the pool claims {claimed} bytes, the device has {actual}")]
    DeviceTooSmall { claimed: u64, actual: u64 },
    #[error("checkpoint: journal position {pos} is not a block inside the {len}-byte journal")]
    CheckpointJournalPosition { pos: u64, len: u64 },
    #[error("checkpoint: generation {gen} read from slot {slot} belongs in the other slot")]
    CheckpointMisplaced { gen: u64, slot: usize },
    #[error("checkpoint: {bytes} bytes overflow the slot")]
    CheckpointOverflow { bytes: u64 },
    #[error("no valid checkpoint ({detail})")]
    NoCheckpoint { detail: String },
    #[error("end of ring")]
    EndOfRing,
    #[error("entry at {pos} is not sequence {seq}")]
    JournalSequence { pos: u64, seq: u64 },
    #[error("entry at {pos} overruns the ring")]
    JournalEntryOverrun { pos: u64 },
    #[error("{dev} already holds a pool{detail}; refusing to overwrite it without force")]
    Occupied { dev: String, detail: String },
    #[error("scrubbing the data region: {}", errno_text(*.errno))]
    Scrub { errno: i32 },
    #[error("{dev}: metadata is damaged ({problem}); run `kvtarget check`")]
    Damaged { dev: String, problem: String },
    #[error("metadata thread: {reason}")]
    Thread { reason: String },
    #[error("volume name must be 1 to {MAX_NAME_LEN} bytes")]
    VolumeName,
    #[error("volume {name}: block_size must be 512 or 4096")]
    VolumeBlockSize { name: String },
    #[error(
        "volume {name}: size {size} must be a non-zero multiple of the block size {block_size}"
    )]
    VolumeSize {
        name: String,
        size: u64,
        block_size: u64,
    },
    #[error("volume {name}: size {size} is too large")]
    VolumeTooLarge { name: String, size: u64 },
    #[error("volume {name} already exists")]
    VolumeExists { name: String },
    #[error("pool {pool} holds at most {max} volumes, as many as its metadata was formatted for (pool create --max-volumes)")]
    TooManyVolumes { pool: String, max: usize },
    #[error("no volume named {name}")]
    NoVolume { name: String },
    #[error("volume {name} is in use; remove its namespace first")]
    VolumeInUse { name: String },
    #[error("pool {pool} metadata is read-only after an error: {cause}")]
    ReadOnly { pool: String, cause: String },
    #[error("journal overflow")]
    JournalOverflow,
    #[error("checkpoint of {bytes} bytes does not fit its {slot}-byte slot")]
    CheckpointTooLarge { bytes: u64, slot: u64 },
    #[error("max_rate: must be at least 1 extent per second")]
    GcMaxRate,
    #[error("watermarks must satisfy low <= high, low <= 50, high <= 90 (got {low} and {high})")]
    GcWatermarks { low: u64, high: u64 },
    #[error("{path}: {reason}")]
    Lock { path: String, reason: String },
    #[error(
        "volume {name}: a KV volume cannot be resized (its key index is laid out for its size)"
    )]
    KvResize { name: String },
    #[error("volume {name}: a KV volume of this size holds up to {keys} keys; the pool's checkpoint has room for {room} more (KV volumes may total the pool's device size)")]
    KvKeyRoom { name: String, keys: u64, room: u64 },
    #[error("{path}: the pool is in use by another kvtarget process")]
    Locked { path: String },
    #[error("pool {pool}: superseded: its owner epoch is {newer} (node {node}), this node's {epoch}; it writes no more")]
    Superseded {
        pool: String,
        epoch: u64,
        newer: u64,
        node: String,
    },
    #[error("pool {pool}: superblock format {version} has no room for an owner epoch; a shared pool needs a pool formatted by this version")]
    NoEpochRecord { pool: String, version: u32 },
}

impl PoolError {
    /// This error, said of device `dev`.
    pub fn on(self, dev: impl Into<String>) -> PoolError {
        PoolError::OnDevice {
            dev: dev.into(),
            source: Box::new(self),
        }
    }
}
