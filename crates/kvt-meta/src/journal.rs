//! Journal records: the metadata changes a commit appends to the journal ring
//! (volume create/resize/delete, an extent's mapping and valid blocks, extents
//! reserved or scrubbed, KV keys put and deleted), and the volume description
//! the volume table and checkpoints carry. Recovery applies them in order on
//! top of the newest checkpoint (`image::Image::apply`).

use super::block::{FormatError, Reader, Writer, HEADER_LEN};
use super::superblock::{
    bitmap_bytes_max, FORMAT_2_MAX_VOLUMES, MAX_EXTENTS, MAX_EXTENT_SIZE, MAX_NAME_LEN,
    VOLUME_CKPT_BYTES,
};
use kvt_wire::nvme::{KvKey, KV_KEY_MAX_LEN};

/// Volume option: reads of unwritten or deallocated blocks fail with the NVMe
/// "deallocated or unwritten logical block" status instead of returning zeros.
pub const VOL_UNWRITTEN_ERROR: u32 = 1;
/// Volume option: the volume holds a KV namespace's values; its key index is
/// journaled (`Record::KvPut`/`KvDelete`) and checkpointed with the pool.
pub const VOL_KV: u32 = 2;

/// Where a value lives: `nblocks` blocks of the volume from `block`, the
/// first `len` bytes of which are the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KvLoc {
    pub block: u64,
    pub nblocks: u32,
    pub len: u32,
}

/// A volume's persistent description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeDesc {
    pub id: u32,
    pub name: String,
    pub uuid: [u8; 16],
    pub size_bytes: u64,
    pub block_size: u32,
    pub flags: u32,
}

impl VolumeDesc {
    pub(super) fn encode(&self, w: &mut Writer) {
        w.u32(self.id);
        let name = self.name.as_bytes();
        let n = name.len().min(MAX_NAME_LEN);
        w.u16(n as u16);
        w.bytes(&name[..n]);
        w.bytes(&self.uuid);
        w.u64(self.size_bytes);
        w.u32(self.block_size);
        w.u32(self.flags);
    }
    pub(super) fn decode(r: &mut Reader) -> Result<VolumeDesc, FormatError> {
        let id = r.u32()?;
        let n = r.u16()? as usize;
        if n > MAX_NAME_LEN {
            return Err(r.invalid(format!("volume name of {n} bytes")));
        }
        let name = String::from_utf8(r.bytes(n)?.to_vec())
            .map_err(|_| r.invalid("volume name is not UTF-8"))?;
        let d = VolumeDesc {
            id,
            name,
            uuid: r.array16()?,
            size_bytes: r.u64()?,
            block_size: r.u32()?,
            flags: r.u32()?,
        };
        if !matches!(d.block_size, 512 | 4096) || d.size_bytes % d.block_size as u64 != 0 {
            return Err(r.invalid(format!(
                "volume {} has block size {} and size {}",
                d.id, d.block_size, d.size_bytes
            )));
        }
        Ok(d)
    }
}

/// The most bytes a volume description takes encoded (ID, name length and
/// the longest name, UUID, size, block size, flags).
pub const VOLUME_DESC_MAX_BYTES: usize = 4 + 2 + MAX_NAME_LEN + 16 + 8 + 4 + 4;

/// The most registrants a volume's reservation record holds: as many as one
/// Reservation Report can list (its 64 KiB extended data structure, a 64-byte
/// header and 64-byte entries: (65536 - 64) / 64 = 1023), so a restart never
/// loads registrants no host could see.
pub const MAX_RESV_REGISTRANTS: usize = 1023;

/// Bytes one persisted registrant takes: a 128-bit Host Identifier and a
/// 64-bit reservation key.
pub const RESV_REGISTRANT_BYTES: usize = 16 + 8;

/// Checkpoint room every volume's reservation record shares, in bytes: the
/// room a pool's layout gives each volume of the table (`VOLUME_CKPT_BYTES`)
/// beyond the largest description, for the 1,024 volumes of a format 2
/// pool, less the section's 8-byte tag: 1024 * (320 - 293) - 8 = 27640
/// bytes. Every pool has it, whatever its format, so no layout changes.
pub const RESV_CKPT_ROOM: usize =
    FORMAT_2_MAX_VOLUMES * (VOLUME_CKPT_BYTES as usize - VOLUME_DESC_MAX_BYTES) - 8;

/// The NVMe reservation of a namespace on a volume, persisted because
/// Persist Through Power Loss is on (with it off nothing is kept): the
/// registrants (128-bit Host Identifier, key), the reservation (RTYPE and
/// holder) and the generation (PRGEN). The target's reservation layer
/// translates; this layer only keeps and checks it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VolumeResv {
    pub generation: u32,
    pub registrants: Vec<([u8; 16], u64)>,
    /// RTYPE (1 to 6) and the holder, a registrant.
    pub held: Option<(u8, [u8; 16])>,
}

impl VolumeResv {
    /// Bytes it takes encoded.
    pub fn encoded_len(&self) -> usize {
        4 + 1 + self.held.map_or(0, |_| 16) + 2 + self.registrants.len() * RESV_REGISTRANT_BYTES
    }

    pub(super) fn encode(&self, w: &mut Writer) {
        assert!(
            self.registrants.len() <= MAX_RESV_REGISTRANTS,
            "reservation record of {} registrants",
            self.registrants.len()
        );
        w.u32(self.generation);
        match self.held {
            Some((rtype, holder)) => {
                w.u8(rtype);
                w.bytes(&holder);
            }
            None => w.u8(0),
        }
        w.u16(self.registrants.len() as u16);
        for (host, key) in &self.registrants {
            w.bytes(host);
            w.u64(*key);
        }
    }

    pub(super) fn decode(r: &mut Reader) -> Result<VolumeResv, FormatError> {
        let generation = r.u32()?;
        let held = match r.u8()? {
            0 => None,
            t @ 1..=6 => Some((t, r.array16()?)),
            t => return Err(r.invalid(format!("reservation rtype {t}"))),
        };
        let n = r.u16()? as usize;
        if n > MAX_RESV_REGISTRANTS {
            return Err(r.invalid(format!("reservation of {n} registrants")));
        }
        let mut registrants: Vec<([u8; 16], u64)> = Vec::with_capacity(n);
        for _ in 0..n {
            let host = r.array16()?;
            let key = r.u64()?;
            if registrants.iter().any(|(h, _)| *h == host) {
                return Err(r.invalid("reservation registrant host_id twice"));
            }
            registrants.push((host, key));
        }
        if let Some((_, holder)) = held {
            if !registrants.iter().any(|(h, _)| *h == holder) {
                return Err(r.invalid("reservation holder is not a registrant"));
            }
        }
        Ok(VolumeResv {
            generation,
            registrants,
            held,
        })
    }
}

/// One metadata change, as the journal carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    VolumeCreate(VolumeDesc),
    VolumeResize {
        id: u32,
        size_bytes: u64,
    },
    VolumeDelete {
        id: u32,
    },
    /// The current state of one logical extent: its physical extent (or
    /// `NO_EXTENT`) and its valid-block bitmap.
    Extent {
        vol: u32,
        lext: u32,
        phys: u32,
        bitmap: Vec<u8>,
    },
    /// Clean extents taken for allocation: after a crash they count as dirty.
    Reserve(Vec<u32>),
    /// Dirty extents scrubbed to zeros.
    Clean(Vec<u32>),
    /// A KV volume's key now holds the value at `loc`.
    KvPut {
        vol: u32,
        key: KvKey,
        loc: KvLoc,
    },
    /// A KV volume's key holds no value any more.
    KvDelete {
        vol: u32,
        key: KvKey,
    },
    /// A volume's namespace reservation now persists as `resv` (`None`:
    /// Persist Through Power Loss is off, nothing is kept).
    VolumeResv {
        vol: u32,
        resv: Option<VolumeResv>,
    },
}

const REC_VOLUME_CREATE: u8 = 1;
const REC_VOLUME_RESIZE: u8 = 2;
const REC_VOLUME_DELETE: u8 = 3;
const REC_EXTENT: u8 = 4;
const REC_RESERVE: u8 = 5;
const REC_CLEAN: u8 = 6;
const REC_KV_PUT: u8 = 7;
const REC_KV_DELETE: u8 = 8;
const REC_VOLUME_RESV: u8 = 9;

pub(super) fn encode_key(w: &mut Writer, k: &KvKey) {
    w.u8(k.len() as u8);
    w.bytes(k.as_bytes());
}

pub(super) fn decode_key(r: &mut Reader) -> Result<KvKey, FormatError> {
    let n = r.u8()? as usize;
    if n == 0 {
        return Err(r.invalid("KV key of 0 bytes"));
    }
    let b = r.bytes(n.min(KV_KEY_MAX_LEN + 1))?;
    KvKey::new(b).ok_or_else(|| r.invalid(format!("KV key of {n} bytes")))
}

pub(super) fn encode_loc(w: &mut Writer, l: &KvLoc) {
    w.u64(l.block);
    w.u32(l.nblocks);
    w.u32(l.len);
}

pub(super) fn decode_loc(r: &mut Reader) -> Result<KvLoc, FormatError> {
    Ok(KvLoc {
        block: r.u64()?,
        nblocks: r.u32()?,
        len: r.u32()?,
    })
}

pub(super) fn encode_list(w: &mut Writer, v: &[u32]) {
    w.u32(v.len() as u32);
    for &x in v {
        w.u32(x);
    }
}

pub(super) fn decode_list(r: &mut Reader) -> Result<Vec<u32>, FormatError> {
    let n = r.u32()? as usize;
    if n as u64 > MAX_EXTENTS {
        return Err(r.invalid(format!("list of {n} extents")));
    }
    let raw = r.bytes(n.checked_mul(4).ok_or(r.invalid("list length"))?)?;
    Ok(raw
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

impl Record {
    pub fn encode(&self, w: &mut Writer) {
        match self {
            Record::VolumeCreate(d) => {
                w.u8(REC_VOLUME_CREATE);
                d.encode(w);
            }
            Record::VolumeResize { id, size_bytes } => {
                w.u8(REC_VOLUME_RESIZE);
                w.u32(*id);
                w.u64(*size_bytes);
            }
            Record::VolumeDelete { id } => {
                w.u8(REC_VOLUME_DELETE);
                w.u32(*id);
            }
            Record::Extent {
                vol,
                lext,
                phys,
                bitmap,
            } => {
                w.u8(REC_EXTENT);
                w.u32(*vol);
                w.u32(*lext);
                w.u32(*phys);
                w.u32(bitmap.len() as u32);
                w.bytes(bitmap);
            }
            Record::Reserve(v) => {
                w.u8(REC_RESERVE);
                encode_list(w, v);
            }
            Record::Clean(v) => {
                w.u8(REC_CLEAN);
                encode_list(w, v);
            }
            Record::KvPut { vol, key, loc } => {
                w.u8(REC_KV_PUT);
                w.u32(*vol);
                encode_key(w, key);
                encode_loc(w, loc);
            }
            Record::KvDelete { vol, key } => {
                w.u8(REC_KV_DELETE);
                w.u32(*vol);
                encode_key(w, key);
            }
            Record::VolumeResv { vol, resv } => {
                w.u8(REC_VOLUME_RESV);
                w.u32(*vol);
                match resv {
                    Some(x) => {
                        w.u8(1);
                        x.encode(w);
                    }
                    None => w.u8(0),
                }
            }
        }
    }

    pub fn decode(r: &mut Reader) -> Result<Record, FormatError> {
        Ok(match r.u8()? {
            REC_VOLUME_CREATE => Record::VolumeCreate(VolumeDesc::decode(r)?),
            REC_VOLUME_RESIZE => Record::VolumeResize {
                id: r.u32()?,
                size_bytes: r.u64()?,
            },
            REC_VOLUME_DELETE => Record::VolumeDelete { id: r.u32()? },
            REC_EXTENT => {
                let vol = r.u32()?;
                let lext = r.u32()?;
                let phys = r.u32()?;
                let n = r.u32()? as usize;
                if n > bitmap_bytes_max(MAX_EXTENT_SIZE) {
                    return Err(r.invalid(format!("bitmap of {n} bytes")));
                }
                Record::Extent {
                    vol,
                    lext,
                    phys,
                    bitmap: r.bytes(n)?.to_vec(),
                }
            }
            REC_RESERVE => Record::Reserve(decode_list(r)?),
            REC_CLEAN => Record::Clean(decode_list(r)?),
            REC_KV_PUT => Record::KvPut {
                vol: r.u32()?,
                key: decode_key(r)?,
                loc: decode_loc(r)?,
            },
            REC_KV_DELETE => Record::KvDelete {
                vol: r.u32()?,
                key: decode_key(r)?,
            },
            REC_VOLUME_RESV => Record::VolumeResv {
                vol: r.u32()?,
                resv: match r.u8()? {
                    0 => None,
                    1 => Some(VolumeResv::decode(r)?),
                    p => return Err(r.invalid(format!("reservation presence {p}"))),
                },
            },
            t => return Err(r.invalid(format!("unknown record type {t}"))),
        })
    }

    pub fn decode_all(payload: &[u8], what: &'static str) -> Result<Vec<Record>, FormatError> {
        let mut r = Reader::new(payload, what);
        let mut out = Vec::new();
        while !r.done() {
            out.push(Record::decode(&mut r)?);
        }
        Ok(out)
    }
}

/// Packs `records`, in order, into journal entry payloads of at most `limit`
/// bytes with their block header (one record larger than that gets an entry
/// of its own). Always at least one payload, possibly empty.
pub fn pack_entries(records: &[Record], limit: usize) -> Vec<Vec<u8>> {
    let mut w = Writer::default();
    let mut entries = Vec::new();
    for r in records {
        let before = w.b.len();
        r.encode(&mut w);
        if w.b.len() + HEADER_LEN > limit && before > 0 {
            let tail = w.b.split_off(before);
            entries.push(std::mem::replace(&mut w.b, tail));
        }
    }
    if !w.b.is_empty() || entries.is_empty() {
        entries.push(w.b);
    }
    entries
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// A reservation record reads back as written; any bytes behind its
        /// record type either decode to a record that re-encodes to them or
        /// are refused, never a panic.
        #[test]
        fn reservation_records_round_trip(vol: u32, generation: u32, hosts in proptest::collection::btree_set(any::<[u8; 16]>(), 0..40), keys in proptest::collection::vec(any::<u64>(), 40), holder in any::<Option<(u8, usize)>>(), off: bool) {
            let registrants: Vec<([u8; 16], u64)> = hosts.into_iter().zip(keys).collect();
            let held = holder
                .filter(|_| !registrants.is_empty())
                .map(|(t, i)| (1 + t % 6, registrants[i % registrants.len()].0));
            let resv = (!off).then_some(VolumeResv { generation, registrants, held });
            let rec = Record::VolumeResv { vol, resv };
            let mut w = Writer::default();
            rec.encode(&mut w);
            prop_assert_eq!(Record::decode_all(&w.b, "t"), Ok(vec![rec]));
        }

        #[test]
        fn reservation_record_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let mut b = vec![REC_VOLUME_RESV];
            b.extend_from_slice(&bytes);
            if let Ok(recs) = Record::decode_all(&b, "fuzz") {
                let mut w = Writer::default();
                for r in &recs {
                    r.encode(&mut w);
                }
                prop_assert_eq!(w.b, b);
            }
        }
    }

    #[test]
    fn records_round_trip() {
        let recs = vec![
            Record::VolumeCreate(VolumeDesc {
                id: 3,
                name: "kv0".into(),
                uuid: [1; 16],
                size_bytes: 1 << 30,
                block_size: 4096,
                flags: VOL_UNWRITTEN_ERROR,
            }),
            Record::VolumeResize {
                id: 3,
                size_bytes: 2 << 30,
            },
            Record::Extent {
                vol: 3,
                lext: 9,
                phys: 12,
                bitmap: vec![0xff; 32],
            },
            Record::Reserve(vec![1, 2, 3]),
            Record::Clean(vec![]),
            Record::KvPut {
                vol: 2,
                key: KvKey::new(b"0123456789abcdef").unwrap_or_default(),
                loc: KvLoc {
                    block: 7,
                    nblocks: 3,
                    len: 9000,
                },
            },
            Record::KvDelete {
                vol: 2,
                key: KvKey::new(b"k").unwrap_or_default(),
            },
            Record::VolumeResv {
                vol: 3,
                resv: Some(VolumeResv {
                    generation: 4,
                    registrants: vec![([0xA; 16], 1), ([0xB; 16], u64::MAX)],
                    held: Some((3, [0xB; 16])),
                }),
            },
            Record::VolumeResv { vol: 3, resv: None },
            Record::VolumeDelete { id: 3 },
        ];
        let mut w = Writer::default();
        for r in &recs {
            r.encode(&mut w);
        }
        assert_eq!(Record::decode_all(&w.b, "t"), Ok(recs));
    }
}
