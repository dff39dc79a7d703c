//! The owner's epoch of a shared pool (issue 36): the fencing epoch of the
//! node that last took the pool over, kept in the second half of the
//! superblock's block (superblock format 2, whose checksum covers only the
//! first half). A writer re-reads it before each metadata commit and refuses
//! to write when it shows a newer epoch than its own, so even a wrong
//! coordinator cannot make two writers of the metadata.
//!
//! Two slots of 1 KiB each (at 2048 and 3072 of block 0); a takeover writes
//! the slot that does not hold the newest record, so a torn write loses at
//! most the record being written, never the newer of the two. A slot of zeros
//! is "no record" (a pool never taken over: epoch 0).
//!
//! Slot layout (little endian): magic `KVTEPOCH`, version u32 (1), pool uuid
//! (16 bytes), epoch u64, node name length u8 and bytes (at most 255), zeros,
//! CRC32C of the slot's first 1020 bytes at 1020.

use super::block::{crc, FormatError, Reader, Writer, META_BLOCK};

pub const EPOCH_MAGIC: &[u8; 8] = b"KVTEPOCH";
pub const EPOCH_RECORD_VERSION: u32 = 1;
/// Offsets of the two epoch slots within the superblock's block.
pub const EPOCH_SLOTS: [usize; 2] = [2048, 3072];
pub const EPOCH_SLOT_LEN: usize = 1024;

/// One epoch slot's record: which node took the pool over, with which epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpochRecord {
    pub pool_uuid: [u8; 16],
    pub epoch: u64,
    pub node: String,
}

impl EpochRecord {
    /// The slot's bytes (`EPOCH_SLOT_LEN`); a node name is cut at 255 bytes
    /// (on a character boundary).
    pub fn encode(&self) -> Vec<u8> {
        let mut end = self.node.len().min(255);
        while !self.node.is_char_boundary(end) {
            end -= 1;
        }
        let name = &self.node.as_bytes()[..end];
        let mut w = Writer::default();
        w.bytes(EPOCH_MAGIC);
        w.u32(EPOCH_RECORD_VERSION);
        w.bytes(&self.pool_uuid);
        w.u64(self.epoch);
        w.u8(name.len() as u8);
        w.bytes(name);
        let mut b = w.b;
        assert!(
            b.len() <= EPOCH_SLOT_LEN - 4,
            "epoch record overflows its slot"
        );
        b.resize(EPOCH_SLOT_LEN, 0);
        let c = crc(&b[..EPOCH_SLOT_LEN - 4]);
        b[EPOCH_SLOT_LEN - 4..].copy_from_slice(&c.to_le_bytes());
        b
    }

    /// A slot's record: `None` for an empty (all-zero) slot.
    pub fn decode(b: &[u8]) -> Result<Option<EpochRecord>, FormatError> {
        let what = "epoch record";
        if b.len() < EPOCH_SLOT_LEN {
            return Err(FormatError::Truncated { what });
        }
        let b = &b[..EPOCH_SLOT_LEN];
        if b.iter().all(|&x| x == 0) {
            return Ok(None);
        }
        if &b[..8] != EPOCH_MAGIC {
            return Err(FormatError::BadMagic { what });
        }
        let n = EPOCH_SLOT_LEN;
        let stored = u32::from_le_bytes([b[n - 4], b[n - 3], b[n - 2], b[n - 1]]);
        if crc(&b[..n - 4]) != stored {
            return Err(FormatError::BadChecksum { what });
        }
        let mut r = Reader::new(&b[8..n - 4], what);
        let version = r.u32()?;
        if version != EPOCH_RECORD_VERSION {
            return Err(FormatError::BadVersion { what, version });
        }
        let pool_uuid = r.array16()?;
        let epoch = r.u64()?;
        let len = r.u8()? as usize;
        let node = std::str::from_utf8(r.bytes(len)?)
            .map_err(|_| FormatError::Invalid {
                what,
                detail: "node name is not UTF-8".into(),
            })?
            .to_string();
        // Magic, version, uuid, epoch, name length: 37 bytes before the name.
        if !b[37 + len..n - 4].iter().all(|&x| x == 0) {
            // One encoding per record: what follows the name is zeros.
            return Err(FormatError::Invalid {
                what,
                detail: "bytes after the node name".into(),
            });
        }
        Ok(Some(EpochRecord {
            pool_uuid,
            epoch,
            node,
        }))
    }
}

/// The newest valid epoch record of the superblock's block `block0` for the
/// pool `uuid` (a slot that is damaged or names another pool counts as empty).
pub fn newest_epoch(block0: &[u8], uuid: &[u8; 16]) -> Option<EpochRecord> {
    newest_slot(block0, uuid).map(|(_, r)| r)
}

fn newest_slot(block0: &[u8], uuid: &[u8; 16]) -> Option<(usize, EpochRecord)> {
    EPOCH_SLOTS
        .iter()
        .enumerate()
        .filter_map(|(i, &off)| {
            let slot = block0.get(off..off + EPOCH_SLOT_LEN)?;
            let r = EpochRecord::decode(slot).ok()??;
            (r.pool_uuid == *uuid).then_some((i, r))
        })
        .max_by_key(|(_, r)| r.epoch)
}

/// Puts `rec` into the superblock's block `block0` (the slot that does not
/// hold the newest record), refused when the block already shows an epoch
/// newer than `rec.epoch`: `Err(newest)`.
pub fn put_epoch(block0: &mut [u8], rec: &EpochRecord) -> Result<(), EpochRecord> {
    assert!(block0.len() >= META_BLOCK as usize, "not a whole block");
    let newest = newest_slot(block0, &rec.pool_uuid);
    if let Some((_, n)) = newest.as_ref().filter(|(_, n)| n.epoch > rec.epoch) {
        return Err(n.clone());
    }
    let slot = match newest {
        Some((i, _)) => 1 - i,
        None => 0,
    };
    let off = EPOCH_SLOTS[slot];
    block0[off..off + EPOCH_SLOT_LEN].copy_from_slice(&rec.encode());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rec(epoch: u64) -> EpochRecord {
        EpochRecord {
            pool_uuid: [9; 16],
            epoch,
            node: "node-a".into(),
        }
    }

    #[test]
    fn record_round_trip_and_empty_slot() {
        let r = rec(57);
        assert_eq!(EpochRecord::decode(&r.encode()), Ok(Some(r)));
        assert_eq!(EpochRecord::decode(&[0; EPOCH_SLOT_LEN]), Ok(None));
        assert!(EpochRecord::decode(&[0; 10]).is_err());
        let long = EpochRecord {
            node: "é".repeat(200),
            ..rec(1)
        };
        let back = EpochRecord::decode(&long.encode()).unwrap().unwrap();
        assert_eq!(back.node.len(), 254, "cut on a character boundary");
    }

    #[test]
    fn put_alternates_slots_and_refuses_older() {
        let mut b = vec![0u8; META_BLOCK as usize];
        assert_eq!(newest_epoch(&b, &[9; 16]), None);
        put_epoch(&mut b, &rec(5)).unwrap();
        put_epoch(&mut b, &rec(7)).unwrap();
        assert_eq!(newest_epoch(&b, &[9; 16]).map(|r| r.epoch), Some(7));
        // Both slots hold a record: 5 at 2048, 7 at 3072.
        assert!(EpochRecord::decode(&b[2048..3072]).unwrap().is_some());
        assert_eq!(put_epoch(&mut b, &rec(6)).map_err(|n| n.epoch), Err(7));
        // A torn write of the next record leaves the newest intact.
        put_epoch(&mut b, &rec(9)).unwrap();
        b[2100] ^= 0xff; // 9 went to slot 0, over 5
        assert_eq!(newest_epoch(&b, &[9; 16]).map(|r| r.epoch), Some(7));
        // Another pool's record does not count.
        assert_eq!(newest_epoch(&b, &[1; 16]), None);
    }

    proptest! {
        #[test]
        fn any_slot_bytes_decode_without_panic(b in proptest::collection::vec(any::<u8>(), 0..1100)) {
            let _ = EpochRecord::decode(&b);
        }

        #[test]
        fn one_flipped_bit_is_caught(pos in 0usize..EPOCH_SLOT_LEN, bit in 0u8..8, epoch in any::<u64>()) {
            let mut b = rec(epoch).encode();
            b[pos] ^= 1 << bit;
            prop_assert!(!matches!(EpochRecord::decode(&b), Ok(Some(_))));
        }
    }
}
