//! Journal records: the metadata changes a commit appends to the journal ring
//! (volume create/resize/delete, an extent's mapping and valid blocks, extents
//! reserved or scrubbed, KV keys put and deleted), and the volume description
//! the volume table and checkpoints carry. Recovery applies them in order on
//! top of the newest checkpoint (`image::Image::apply`).

use super::block::{FormatError, Reader, Writer, HEADER_LEN};
use super::superblock::{bitmap_bytes_max, MAX_EXTENTS, MAX_EXTENT_SIZE, MAX_NAME_LEN};
use crate::wire::nvme::{KvKey, KV_KEY_MAX_LEN};

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
}

const REC_VOLUME_CREATE: u8 = 1;
const REC_VOLUME_RESIZE: u8 = 2;
const REC_VOLUME_DELETE: u8 = 3;
const REC_EXTENT: u8 = 4;
const REC_RESERVE: u8 = 5;
const REC_CLEAN: u8 = 6;
const REC_KV_PUT: u8 = 7;
const REC_KV_DELETE: u8 = 8;

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
            Record::VolumeDelete { id: 3 },
        ];
        let mut w = Writer::default();
        for r in &recs {
            r.encode(&mut w);
        }
        assert_eq!(Record::decode_all(&w.b, "t"), Ok(recs));
    }
}
