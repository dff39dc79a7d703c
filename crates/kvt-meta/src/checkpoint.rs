//! Checkpoints: the whole metadata state (volume table, extent mappings with
//! their valid-block bitmaps, the clean list, every KV key) in one of two
//! slots, alternating by generation, so a torn checkpoint write leaves the
//! older one and its journal intact. The journal restarts after each one.

use super::block::{FormatError, Reader, Writer};
use super::journal::{
    decode_key, decode_list, decode_loc, encode_key, encode_list, encode_loc, KvLoc, VolumeDesc,
    VolumeResv,
};
use super::superblock::{bitmap_bytes_max, MAX_EXTENTS, MAX_EXTENT_SIZE, MAX_VOLUMES};
use kvt_wire::nvme::KvKey;

/// One mapped logical extent: the state an `Extent` journal record carries,
/// and what a checkpoint holds for each mapped extent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtentMapping {
    /// Volume ID.
    pub vol: u32,
    /// Logical extent of the volume.
    pub lext: u32,
    /// Physical extent of the pool (`NO_EXTENT`: unmapped, in a journal record).
    pub phys: u32,
    /// Valid-block bitmap, little-endian bytes.
    pub bitmap: Vec<u8>,
}

/// A checkpoint's payload: the whole metadata state at one point.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CheckpointData {
    pub next_volume_id: u32,
    pub volumes: Vec<VolumeDesc>,
    /// (volume, logical extent, physical extent, bitmap)
    pub mappings: Vec<ExtentMapping>,
    pub clean: Vec<u32>,
    /// Every key of every KV volume: (volume, key, location). Written after
    /// the clean list, so a checkpoint without KV volumes reads as before.
    pub kv: Vec<(u32, KvKey, KvLoc)>,
    /// The persisted reservation of each volume that has one (Persist
    /// Through Power Loss on). Written last, behind a tag no KV key count
    /// can equal, so a checkpoint without them reads as before.
    pub resv: Vec<(u32, VolumeResv)>,
}

/// High half of the reservation section's leading u64 ("RESV"); the low
/// half counts its records. A KV section's leading u64 is its key count,
/// at most the checkpoint's bytes over 18: never this large.
const RESV_SECTION_TAG: u64 = 0x5245_5356;

impl CheckpointData {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u32(self.next_volume_id);
        w.u32(self.volumes.len() as u32);
        for v in &self.volumes {
            v.encode(&mut w);
        }
        w.u32(self.mappings.len() as u32);
        for m in &self.mappings {
            w.u32(m.vol);
            w.u32(m.lext);
            w.u32(m.phys);
            w.u32(m.bitmap.len() as u32);
            w.bytes(&m.bitmap);
        }
        encode_list(&mut w, &self.clean);
        if !self.kv.is_empty() {
            w.u64(self.kv.len() as u64);
            for (vol, key, loc) in &self.kv {
                w.u32(*vol);
                encode_key(&mut w, key);
                encode_loc(&mut w, loc);
            }
        }
        if !self.resv.is_empty() {
            w.u64(RESV_SECTION_TAG << 32 | self.resv.len() as u64);
            for (vol, x) in &self.resv {
                w.u32(*vol);
                x.encode(&mut w);
            }
        }
        w.b
    }

    pub fn decode(b: &[u8]) -> Result<CheckpointData, FormatError> {
        let mut r = Reader::new(b, "checkpoint");
        let next_volume_id = r.u32()?;
        let nv = r.u32()? as usize;
        if nv > MAX_VOLUMES {
            return Err(r.invalid(format!("{nv} volumes")));
        }
        let mut volumes = Vec::with_capacity(nv);
        for _ in 0..nv {
            volumes.push(VolumeDesc::decode(&mut r)?);
        }
        let nm = r.u32()? as usize;
        if nm as u64 > MAX_EXTENTS {
            return Err(r.invalid(format!("{nm} mappings")));
        }
        let mut mappings = Vec::new();
        for _ in 0..nm {
            let vol = r.u32()?;
            let lext = r.u32()?;
            let phys = r.u32()?;
            let n = r.u32()? as usize;
            if n > bitmap_bytes_max(MAX_EXTENT_SIZE) {
                return Err(r.invalid(format!("bitmap of {n} bytes")));
            }
            mappings.push(ExtentMapping {
                vol,
                lext,
                phys,
                bitmap: r.bytes(n)?.to_vec(),
            });
        }
        let clean = decode_list(&mut r)?;
        let mut kv = Vec::new();
        let mut next = if r.done() { None } else { Some(r.u64()?) };
        if let Some(n) = next.filter(|t| t >> 32 != RESV_SECTION_TAG) {
            // Each entry takes at least 18 bytes: a count beyond what is left
            // is damage, not a reason to reserve memory. An empty section is
            // never written (one encoding per state).
            if n == 0 || n > (b.len() / 18) as u64 {
                return Err(r.invalid(format!("{n} KV keys")));
            }
            kv.reserve(n as usize);
            for _ in 0..n {
                kv.push((r.u32()?, decode_key(&mut r)?, decode_loc(&mut r)?));
            }
            next = if r.done() { None } else { Some(r.u64()?) };
        }
        let resv = match next {
            Some(t) => decode_resv_section(&mut r, t)?,
            None => Vec::new(),
        };
        if !r.done() {
            return Err(r.invalid("trailing bytes"));
        }
        Ok(CheckpointData {
            next_volume_id,
            volumes,
            mappings,
            clean,
            kv,
            resv,
        })
    }
}

/// The reservation section after its leading u64 `t`: one record per
/// volume, at least one (an empty section is never written).
fn decode_resv_section(r: &mut Reader, t: u64) -> Result<Vec<(u32, VolumeResv)>, FormatError> {
    let n = t & 0xFFFF_FFFF;
    if t >> 32 != RESV_SECTION_TAG || n == 0 || n > MAX_VOLUMES as u64 {
        return Err(r.invalid(format!("reservation section tag {t:#x}")));
    }
    let mut out: Vec<(u32, VolumeResv)> = Vec::new();
    for _ in 0..n {
        let vol = r.u32()?;
        if out.iter().any(|(v, _)| *v == vol) {
            return Err(r.invalid(format!("volume {vol} has two reservation records")));
        }
        out.push((vol, VolumeResv::decode(r)?));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A reservation record of `i` registrants, held when there are some.
    fn resv_of(i: usize) -> VolumeResv {
        let registrants: Vec<([u8; 16], u64)> =
            (0..i).map(|h| ([h as u8 + 1; 16], h as u64 * 7)).collect();
        VolumeResv {
            generation: i as u32,
            held: registrants.last().map(|(h, _)| (1 + i as u8 % 6, *h)),
            registrants,
        }
    }

    proptest! {
        #[test]
            fn checkpoint_round_trips(vols in 0usize..5, maps in proptest::collection::vec((0u32..5, 0u32..100, 0u32..1000, proptest::collection::vec(any::<u8>(), 0..64)), 0..50), clean in proptest::collection::vec(0u32..1000, 0..100), kv in proptest::collection::vec((0u32..5, proptest::collection::vec(any::<u8>(), 1..=16), any::<u64>(), any::<u32>(), any::<u32>()), 0..40), resv in 0usize..4) {
                let c = CheckpointData {
                    next_volume_id: vols as u32,
                    volumes: (0..vols).map(|i| VolumeDesc { id: i as u32, name: format!("v{i}"), uuid: [i as u8; 16], size_bytes: 4096 * i as u64, block_size: 4096, flags: 0 }).collect(),
                    mappings: maps.into_iter().map(|(vol, lext, phys, bitmap)| ExtentMapping { vol, lext, phys, bitmap }).collect(),
                    clean,
                    kv: kv.into_iter().filter_map(|(v, k, block, nblocks, len)| Some((v, KvKey::new(&k)?, KvLoc { block, nblocks, len }))).collect(),
                    resv: (0..resv).map(|i| (i as u32, resv_of(i))).collect(),
                };
                prop_assert_eq!(CheckpointData::decode(&c.encode()), Ok(c));
            }
    }
}
