//! The superblock: a pool's geometry, written once by `format` at offset 0 and
//! read first by recovery and `check`. It fixes where the checkpoint slots,
//! the journal ring and the data extents lie:
//!
//! Layout of a pool device:
//!
//! ```text
//! 0            superblock (4 KiB)
//! ckpt_offset  checkpoint slot 0, checkpoint slot 1 (ckpt_slot_len each)
//! journal      journal ring (journal_len), entries 4 KiB aligned
//! data_offset  extent 0, extent 1, ... (extent_size each)
//! ```
//!
//! Format 2 (pools formatted since issue 36) keeps the same fields and moves
//! the checksum to 2044, so the block's second half can hold the owner's epoch
//! records of a shared pool (`super::epoch`) without rewriting the geometry.
//! Format 1 pools (checksum at 4092) still open; they have no epoch record.
//! Format 3 (pools formatted since issue 39) adds the volume limit the
//! checkpoint slots were sized for (`max_volumes`, 4,096); formats 1 and 2
//! were sized for 1,024 and keep that limit.

use super::block::{
    crc, round_up, FormatError, Reader, Writer, FORMAT_VERSION, META_BLOCK, SUPERBLOCK_MAGIC,
};

/// The smallest block size a volume may use; bitmaps are sized for it.
pub const MIN_BLOCK_SIZE: u32 = 512;
pub const MIN_EXTENT_SIZE: u64 = 64 << 10;
pub const MAX_EXTENT_SIZE: u64 = 64 << 20;
/// Extent numbers are 28 bits in the data path's per-extent atomic word.
pub const MAX_EXTENTS: u64 = (1 << 28) - 2;
/// "Not mapped" in an extent record.
pub const NO_EXTENT: u32 = u32::MAX;
/// The most volumes any pool holds: what format 3 sizes its checkpoint for.
pub const MAX_VOLUMES: usize = 4096;
/// The most volumes a pool of format 1 or 2 holds: its checkpoint slots were
/// sized for this many.
pub const FORMAT_2_MAX_VOLUMES: usize = 1024;
pub const MAX_NAME_LEN: usize = 255;
/// Checkpoint bytes a pool's layout gives each volume of the table: its
/// description (at most `VOLUME_DESC_MAX_BYTES`, 293) and a share of the
/// reservation records' room (`RESV_CKPT_ROOM`).
pub const VOLUME_CKPT_BYTES: u64 = 320;
/// Checkpoint room a pool's layout reserves per this many bytes of device,
/// one key each: a KV namespace holds at most its size over this many keys
/// (its Identify MNK).
pub const KV_BYTES_PER_KEY: u64 = 16 << 10;
/// The most bytes one key takes in a checkpoint (volume, key, location).
pub const KV_CKPT_ENTRY_BYTES: u64 = 4 + 1 + 16 + 8 + 4 + 4;
/// The superblock format `Superblock::layout` writes: 2, with the epoch
/// records in the block's second half. `FORMAT_VERSION` (1) also decodes.
pub const SUPERBLOCK_VERSION_EPOCH: u32 = 2;
/// The superblock format that records its volume limit (`max_volumes`).
pub const SUPERBLOCK_VERSION_VOLUMES: u32 = 3;
/// Every superblock format this build decodes.
const KNOWN_VERSIONS: [u32; 3] = [
    FORMAT_VERSION,
    SUPERBLOCK_VERSION_EPOCH,
    SUPERBLOCK_VERSION_VOLUMES,
];
/// Bytes of the superblock's block its checksum covers, by format.
fn checksummed_len(version: u32) -> usize {
    if version >= SUPERBLOCK_VERSION_EPOCH {
        super::epoch::EPOCH_SLOTS[0] - 4
    } else {
        META_BLOCK as usize - 4
    }
}

/// Pool geometry, written once at format time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    /// `FORMAT_VERSION` (1), `SUPERBLOCK_VERSION_EPOCH` (2) or
    /// `SUPERBLOCK_VERSION_VOLUMES` (3).
    pub version: u32,
    pub uuid: [u8; 16],
    pub extent_size: u64,
    pub device_size: u64,
    pub extent_count: u32,
    pub ckpt_offset: u64,
    pub ckpt_slot_len: u64,
    pub journal_offset: u64,
    pub journal_len: u64,
    pub data_offset: u64,
    /// Volumes the checkpoint slots have room for: stored from format 3,
    /// `FORMAT_2_MAX_VOLUMES` before.
    pub max_volumes: u32,
}

impl Superblock {
    /// Lays out a pool on a device of `device_size` bytes, with room for
    /// `MAX_VOLUMES` volumes.
    pub fn layout(
        device_size: u64,
        extent_size: u64,
        uuid: [u8; 16],
        journal_len: Option<u64>,
    ) -> Result<Superblock, FormatError> {
        Superblock::layout_with(
            device_size,
            extent_size,
            uuid,
            journal_len,
            MAX_VOLUMES as u32,
        )
    }

    /// `layout` with checkpoint room for `max_volumes` volumes.
    pub fn layout_with(
        device_size: u64,
        extent_size: u64,
        uuid: [u8; 16],
        journal_len: Option<u64>,
        max_volumes: u32,
    ) -> Result<Superblock, FormatError> {
        let bad = |d: String| FormatError::Invalid {
            what: "pool",
            detail: d,
        };
        if !(1..=MAX_VOLUMES as u32).contains(&max_volumes) {
            return Err(bad(format!(
                "max_volumes {max_volumes} must be from 1 to {MAX_VOLUMES}"
            )));
        }
        if !extent_size.is_power_of_two()
            || !(MIN_EXTENT_SIZE..=MAX_EXTENT_SIZE).contains(&extent_size)
        {
            return Err(bad(format!(
                "extent size {extent_size} must be a power of two from 64 KiB to 64 MiB"
            )));
        }
        let bitmap = bitmap_bytes_max(extent_size) as u64;
        let estimate = device_size / extent_size;
        // Checkpoint payload bound: every extent mapped with a full bitmap, every
        // extent on the clean list, the volume table, and the keys of KV
        // volumes (one per KV_BYTES_PER_KEY of device).
        let per_extent = 12 + 4 + bitmap + 4;
        let ckpt_slot_len = round_up(
            META_BLOCK * 2
                + estimate * per_extent
                + max_volumes as u64 * VOLUME_CKPT_BYTES
                + 8
                + kv_key_room(device_size) * KV_CKPT_ENTRY_BYTES,
            META_BLOCK,
        );
        let journal_len = round_up(
            journal_len
                .unwrap_or((device_size / 256).clamp(4 << 20, 256 << 20))
                .max(16 * META_BLOCK),
            META_BLOCK,
        );
        let ckpt_offset = META_BLOCK;
        let journal_offset = ckpt_offset + 2 * ckpt_slot_len;
        let align = extent_size.min(1 << 20);
        let data_offset = round_up(journal_offset + journal_len, align);
        // Saturating: a device too small for its metadata is the caller's
        // input, refused just below.
        let extent_count = device_size.saturating_sub(data_offset) / extent_size;
        if extent_count == 0 {
            return Err(bad(format!(
                "device of {device_size} bytes holds no extent of {extent_size} bytes after {data_offset} bytes of metadata"
            )));
        }
        if extent_count > MAX_EXTENTS {
            return Err(bad(format!(
                "{extent_count} extents is more than {MAX_EXTENTS}; use a larger extent size"
            )));
        }
        Ok(Superblock {
            version: SUPERBLOCK_VERSION_VOLUMES,
            uuid,
            extent_size,
            device_size,
            extent_count: extent_count as u32,
            ckpt_offset,
            ckpt_slot_len,
            journal_offset,
            journal_len,
            data_offset,
            max_volumes,
        })
    }

    pub fn extent_offset(&self, phys: u32) -> u64 {
        self.data_offset + phys as u64 * self.extent_size
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.bytes(SUPERBLOCK_MAGIC);
        w.u32(self.version);
        w.bytes(&self.uuid);
        w.u64(self.extent_size);
        w.u64(self.device_size);
        w.u32(self.extent_count);
        w.u64(self.ckpt_offset);
        w.u64(self.ckpt_slot_len);
        w.u64(self.journal_offset);
        w.u64(self.journal_len);
        w.u64(self.data_offset);
        if self.version >= SUPERBLOCK_VERSION_VOLUMES {
            w.u32(self.max_volumes);
        }
        let mut b = w.b;
        b.resize(META_BLOCK as usize, 0);
        let n = checksummed_len(self.version);
        let c = crc(&b[..n]);
        b[n..n + 4].copy_from_slice(&c.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Superblock, FormatError> {
        let what = "superblock";
        if b.len() < META_BLOCK as usize {
            return Err(FormatError::Truncated { what });
        }
        if &b[..8] != SUPERBLOCK_MAGIC {
            return Err(FormatError::BadMagic { what });
        }
        let version = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
        if !KNOWN_VERSIONS.contains(&version) {
            // A checksum valid where a known format keeps it: a block written
            // whole by another format. Else a flipped bit, or a newer layout.
            let known = KNOWN_VERSIONS.map(checksummed_len);
            let whole = known.iter().any(|&n| {
                let stored = u32::from_le_bytes([b[n], b[n + 1], b[n + 2], b[n + 3]]);
                crc(&b[..n]) == stored
            });
            return Err(if whole {
                FormatError::BadVersion { what, version }
            } else {
                FormatError::UnknownVersionOrDamaged { what, version }
            });
        }
        let n = checksummed_len(version);
        let stored = u32::from_le_bytes([b[n], b[n + 1], b[n + 2], b[n + 3]]);
        if crc(&b[..n]) != stored {
            return Err(FormatError::BadChecksum { what });
        }
        let mut r = Reader::new(&b[12..n], what);
        let sb = Superblock {
            version,
            uuid: r.array16()?,
            extent_size: r.u64()?,
            device_size: r.u64()?,
            extent_count: r.u32()?,
            ckpt_offset: r.u64()?,
            ckpt_slot_len: r.u64()?,
            journal_offset: r.u64()?,
            journal_len: r.u64()?,
            data_offset: r.u64()?,
            max_volumes: if version >= SUPERBLOCK_VERSION_VOLUMES {
                r.u32()?
            } else {
                FORMAT_2_MAX_VOLUMES as u32
            },
        };
        // Geometry must be self-consistent before anything trusts it.
        let fits = (|| {
            let ckpt_end = sb
                .ckpt_offset
                .checked_add(sb.ckpt_slot_len.checked_mul(2)?)?;
            let j_end = sb.journal_offset.checked_add(sb.journal_len)?;
            let d_end = sb
                .data_offset
                .checked_add(sb.extent_size.checked_mul(sb.extent_count as u64)?)?;
            Some(
                sb.extent_size.is_power_of_two()
                    && (MIN_EXTENT_SIZE..=MAX_EXTENT_SIZE).contains(&sb.extent_size)
                    && sb.ckpt_offset >= META_BLOCK
                    && sb.ckpt_slot_len >= 2 * META_BLOCK
                    && sb.ckpt_slot_len >= sb.max_volumes as u64 * VOLUME_CKPT_BYTES
                    && sb.ckpt_slot_len % META_BLOCK == 0
                    && ckpt_end <= sb.journal_offset
                    && sb.journal_offset % META_BLOCK == 0
                    && sb.journal_len >= 2 * META_BLOCK
                    && sb.journal_len % META_BLOCK == 0
                    && j_end <= sb.data_offset
                    && d_end <= sb.device_size
                    && (sb.extent_count as u64) <= MAX_EXTENTS
                    && (1..=MAX_VOLUMES as u32).contains(&sb.max_volumes),
            )
        })();
        if fits != Some(true) {
            return Err(FormatError::Invalid {
                what,
                detail: "geometry is inconsistent".into(),
            });
        }
        Ok(sb)
    }
}

/// The smallest device `Superblock::layout` fits a pool of `extent_size` extents
/// on: superblock, both checkpoint slots, the journal and one extent.
/// Keys of KV volumes a pool on a device of `device_size` bytes has
/// checkpoint room for.
pub fn kv_key_room(device_size: u64) -> u64 {
    device_size / KV_BYTES_PER_KEY
}

pub fn min_device_size(extent_size: u64) -> Result<u64, FormatError> {
    // The metadata grows with the device, so try sizes upwards. The smallest
    // fit is its metadata (aligned to `layout`'s min(extent, 1 MiB)) plus one
    // extent, a multiple of that alignment: stepping by it misses nothing, and
    // takes a few dozen steps at most (a 4 MiB journal over 64 KiB steps).
    if !extent_size.is_power_of_two() || !(MIN_EXTENT_SIZE..=MAX_EXTENT_SIZE).contains(&extent_size)
    {
        // layout's own error for the extent size.
        return Superblock::layout(extent_size, extent_size, [0; 16], None).map(|_| extent_size);
    }
    let step = extent_size.min(1 << 20);
    let mut size = extent_size;
    loop {
        match Superblock::layout(size, extent_size, [0; 16], None) {
            Ok(_) => return Ok(size),
            Err(e) if size > MAX_EXTENT_SIZE * 4 + (1 << 30) => return Err(e),
            Err(_) => size += step,
        }
    }
}

/// Bytes of a valid-block bitmap for the smallest block size.
pub fn bitmap_bytes_max(extent_size: u64) -> usize {
    (extent_size / MIN_BLOCK_SIZE as u64 / 8) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn superblock_round_trip_and_damage() {
        let sb = Superblock::layout(1 << 30, 1 << 20, [7; 16], None).unwrap();
        assert!(sb.extent_count > 900);
        assert_eq!(sb.data_offset % (1 << 20), 0);
        let mut b = sb.encode();
        assert_eq!(Superblock::decode(&b), Ok(sb.clone()));
        b[40] ^= 1;
        assert_eq!(
            Superblock::decode(&b),
            Err(FormatError::BadChecksum { what: "superblock" })
        );
        assert!(Superblock::layout(1 << 30, 3 << 20, [0; 16], None).is_err());
        assert!(Superblock::layout(1 << 20, 1 << 20, [0; 16], None).is_err());
    }

    /// A version this build does not know is named in the error: as
    /// unsupported when the block is whole under a known layout, else as
    /// unknown or damaged (never a bare checksum mismatch).
    #[test]
    fn an_unknown_version_is_named() {
        let sb = Superblock::layout(1 << 30, 1 << 20, [7; 16], None).unwrap();
        let mut b = sb.encode();
        b[8..12].copy_from_slice(&9u32.to_le_bytes());
        assert_eq!(
            Superblock::decode(&b),
            Err(FormatError::UnknownVersionOrDamaged {
                what: "superblock",
                version: 9
            })
        );
        let n = checksummed_len(SUPERBLOCK_VERSION_EPOCH);
        let sum = crc(&b[..n]);
        b[n..n + 4].copy_from_slice(&sum.to_le_bytes());
        assert_eq!(
            Superblock::decode(&b),
            Err(FormatError::BadVersion {
                what: "superblock",
                version: 9
            })
        );
        let e = Superblock::decode(&b[..]).unwrap_err().to_string();
        assert_eq!(e, "superblock: unsupported format version 9");
    }

    #[test]
    fn format_1_superblocks_still_decode() {
        let sb = Superblock {
            version: FORMAT_VERSION,
            max_volumes: FORMAT_2_MAX_VOLUMES as u32,
            ..Superblock::layout(1 << 30, 1 << 20, [7; 16], None).unwrap()
        };
        let b = sb.encode();
        // Format 1: the checksum at the block's end, nothing at 2044.
        assert_eq!(&b[2044..2048], &[0; 4]);
        assert_ne!(&b[4092..], &[0; 4]);
        assert_eq!(Superblock::decode(&b), Ok(sb));
    }

    /// Format 3 stores the volume limit its checkpoint slots were sized for;
    /// format 2 has none and means 1,024; a limit of none, past 4,096, or
    /// beyond what the slots hold is inconsistent geometry.
    #[test]
    fn the_volume_limit_comes_from_the_superblock() {
        let sb = Superblock::layout(1 << 30, 1 << 20, [7; 16], None).unwrap();
        assert_eq!((sb.version, sb.max_volumes), (3, 4096));
        let b = sb.encode();
        assert_eq!(&b[88..92], &4096u32.to_le_bytes(), "after data_offset");
        assert_eq!(Superblock::decode(&b), Ok(sb.clone()));
        let v2 = Superblock {
            version: SUPERBLOCK_VERSION_EPOCH,
            ..sb.clone()
        };
        let b = v2.encode();
        assert_eq!(&b[88..92], &[0; 4], "format 2 writes no limit");
        assert_eq!(Superblock::decode(&b).map(|s| s.max_volumes), Ok(1024));
        let small_slots = Superblock {
            ckpt_slot_len: 1024 * VOLUME_CKPT_BYTES,
            ..sb.clone()
        };
        for bad in [
            Superblock {
                max_volumes: 0,
                ..sb.clone()
            },
            Superblock {
                max_volumes: 4097,
                ..sb.clone()
            },
            small_slots,
        ] {
            assert_eq!(
                Superblock::decode(&bad.encode()),
                Err(FormatError::Invalid {
                    what: "superblock",
                    detail: "geometry is inconsistent".into()
                }),
                "{bad:?}"
            );
        }
    }

    proptest! {
        #[test]
            fn mutated_superblock_never_passes_with_bad_geometry(pos in 0usize..4096, bit in 0u8..8, v1 in any::<bool>()) {
                let mut sb = Superblock::layout(8 << 30, 1 << 20, [3; 16], None).unwrap();
                if v1 {
                    sb.version = FORMAT_VERSION;
                }
                let mut b = sb.encode();
                b[pos] ^= 1 << bit;
                if v1 || pos < crate::epoch::EPOCH_SLOTS[0] {
                    // A single flipped bit is always caught (CRC32C detects all 1-bit errors).
                    prop_assert!(Superblock::decode(&b).is_err());
                } else {
                    // Format 2's second half is the epoch records' (their own
                    // checksums): the geometry reads unchanged.
                    prop_assert_eq!(Superblock::decode(&b), Ok(sb));
                }
            }
    }
}
