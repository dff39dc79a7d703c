//! A pool's metadata on its device, below the volume layer (`kvt_pool`),
//! which calls in here and is never called back:
//!
//! - `block`: the sealed 4 KiB block every metadata write is made of;
//! - `superblock`: the pool's geometry at offset 0;
//! - `epoch`: a shared pool's owner epoch, in the superblock block's second half;
//! - `journal`: the records a commit appends to the journal ring;
//! - `checkpoint`: the whole state in one of two alternating slots;
//! - `image`: that state as plain values, a checkpoint with records applied;
//! - `recovery`: superblock, checkpoint and journal read back into an image;
//! - `format`: a new pool written to a device;
//! - `check`: the offline check of `kvtarget check`.
//!
//! Everything is little-endian and CRC32C-protected; each format is
//! versioned (`FORMAT_VERSION`) and its encoders have round-trip property
//! tests beside them, its decoders the never-panic test below and the
//! `pool_format`/`pool_check` fuzz targets.

pub mod block;
pub mod check;
pub mod checkpoint;
pub mod epoch;
pub mod error;
pub mod format;
pub mod image;
pub mod journal;
pub mod recovery;
pub mod superblock;

pub use block::*;
pub use check::{check, CheckReport};
pub use checkpoint::{CheckpointData, ExtentMapping};
pub use error::PoolError;
pub use format::{format, FormatOptions};
pub use journal::*;
pub use recovery::{load_image, pool_tag, JournalEnd, RecoveryReport};
pub use superblock::*;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..5000)) {
            let _ = Superblock::decode(&bytes);
            let _ = Record::decode_all(&bytes, "fuzz");
            let _ = CheckpointData::decode(&bytes);
            if let Ok(h) = BlockHeader::decode(JOURNAL_MAGIC, &bytes, "fuzz") {
                let _ = unseal(&h, &bytes, "fuzz");
            }
        }
    }
}
