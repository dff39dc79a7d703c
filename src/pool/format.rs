//! On-disk format of a pool: superblock, checkpoint slots, journal entries and the
//! metadata records they carry. Everything is little-endian and CRC32C-protected;
//! decoding never panics on damaged or hostile bytes (property tests below).
//!
//! Layout of a pool device:
//!
//! ```text
//! 0            superblock (4 KiB)
//! ckpt_offset  checkpoint slot 0, checkpoint slot 1 (ckpt_slot_len each)
//! journal      journal ring (journal_len), entries 4 KiB aligned
//! data_offset  extent 0, extent 1, ... (extent_size each)
//! ```

use super::kv::{KvLoc, KV_BYTES_PER_KEY, KV_CKPT_ENTRY_BYTES};
use crate::wire::nvme::{KvKey, KV_KEY_MAX_LEN};

/// Granularity of every metadata write.
pub const META_BLOCK: u64 = 4096;
pub const SUPERBLOCK_MAGIC: &[u8; 8] = b"KVTPOOL\0";
pub const CHECKPOINT_MAGIC: &[u8; 8] = b"KVTCKPT\0";
pub const JOURNAL_MAGIC: &[u8; 8] = b"KVTJRNL\0";
pub const FORMAT_VERSION: u32 = 1;
/// The smallest block size a volume may use; bitmaps are sized for it.
pub const MIN_BLOCK_SIZE: u32 = 512;
pub const MIN_EXTENT_SIZE: u64 = 64 << 10;
pub const MAX_EXTENT_SIZE: u64 = 64 << 20;
/// Extent numbers are 28 bits in the data path's per-extent atomic word.
pub const MAX_EXTENTS: u64 = (1 << 28) - 2;
/// "Not mapped" in an extent record.
pub const NO_EXTENT: u32 = u32::MAX;
pub const MAX_VOLUMES: usize = 1024;
pub const MAX_NAME_LEN: usize = 255;
/// Volume option: reads of unwritten or deallocated blocks fail with the NVMe
/// "deallocated or unwritten logical block" status instead of returning zeros.
pub const VOL_UNWRITTEN_ERROR: u32 = 1;
/// Volume option: the volume holds a KV namespace's values; its key index is
/// journaled (`Record::KvPut`/`KvDelete`) and checkpointed with the pool.
pub const VOL_KV: u32 = 2;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("{what}: bad magic")]
    BadMagic { what: &'static str },
    #[error("{what}: checksum mismatch")]
    BadChecksum { what: &'static str },
    #[error("{what}: unsupported format version {version}")]
    BadVersion { what: &'static str, version: u32 },
    #[error("{what}: truncated")]
    Truncated { what: &'static str },
    #[error("{what}: {detail}")]
    Invalid { what: &'static str, detail: String },
}

fn crc(b: &[u8]) -> u32 {
    crc32c::crc32c(b)
}

/// Sequential little-endian reader that fails instead of panicking.
pub struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub fn new(b: &'a [u8], what: &'static str) -> Reader<'a> {
        Reader { b, pos: 0, what }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], FormatError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or(FormatError::Truncated { what: self.what })?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    pub fn u8(&mut self) -> Result<u8, FormatError> {
        Ok(self.take(1)?[0])
    }
    pub fn u16(&mut self) -> Result<u16, FormatError> {
        let s = self.take(2)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }
    pub fn u32(&mut self) -> Result<u32, FormatError> {
        let s = self.take(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    pub fn u64(&mut self) -> Result<u64, FormatError> {
        let s = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], FormatError> {
        self.take(n)
    }
    pub fn array16(&mut self) -> Result<[u8; 16], FormatError> {
        let mut a = [0u8; 16];
        a.copy_from_slice(self.take(16)?);
        Ok(a)
    }
    pub fn done(&self) -> bool {
        self.pos >= self.b.len()
    }
    fn invalid(&self, detail: impl Into<String>) -> FormatError {
        FormatError::Invalid {
            what: self.what,
            detail: detail.into(),
        }
    }
}

/// Little-endian writer into a growable buffer.
#[derive(Default)]
pub struct Writer {
    pub b: Vec<u8>,
}

impl Writer {
    pub fn u8(&mut self, v: u8) {
        self.b.push(v);
    }
    pub fn u16(&mut self, v: u16) {
        self.b.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u32(&mut self, v: u32) {
        self.b.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.b.extend_from_slice(&v.to_le_bytes());
    }
    pub fn bytes(&mut self, v: &[u8]) {
        self.b.extend_from_slice(v);
    }
}

/// Pool geometry, written once at format time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    pub uuid: [u8; 16],
    pub extent_size: u64,
    pub device_size: u64,
    pub extent_count: u32,
    pub ckpt_offset: u64,
    pub ckpt_slot_len: u64,
    pub journal_offset: u64,
    pub journal_len: u64,
    pub data_offset: u64,
}

impl Superblock {
    /// Lays out a pool on a device of `device_size` bytes.
    pub fn layout(
        device_size: u64,
        extent_size: u64,
        uuid: [u8; 16],
        journal_len: Option<u64>,
    ) -> Result<Superblock, FormatError> {
        let bad = |d: String| FormatError::Invalid {
            what: "pool",
            detail: d,
        };
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
                + (MAX_VOLUMES as u64) * 320
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
            uuid,
            extent_size,
            device_size,
            extent_count: extent_count as u32,
            ckpt_offset,
            ckpt_slot_len,
            journal_offset,
            journal_len,
            data_offset,
        })
    }

    pub fn extent_offset(&self, phys: u32) -> u64 {
        self.data_offset + phys as u64 * self.extent_size
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.bytes(SUPERBLOCK_MAGIC);
        w.u32(FORMAT_VERSION);
        w.bytes(&self.uuid);
        w.u64(self.extent_size);
        w.u64(self.device_size);
        w.u32(self.extent_count);
        w.u64(self.ckpt_offset);
        w.u64(self.ckpt_slot_len);
        w.u64(self.journal_offset);
        w.u64(self.journal_len);
        w.u64(self.data_offset);
        let mut b = w.b;
        b.resize(META_BLOCK as usize, 0);
        let c = crc(&b[..META_BLOCK as usize - 4]);
        b[META_BLOCK as usize - 4..].copy_from_slice(&c.to_le_bytes());
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
        let n = META_BLOCK as usize;
        let stored = u32::from_le_bytes([b[n - 4], b[n - 3], b[n - 2], b[n - 1]]);
        if crc(&b[..n - 4]) != stored {
            return Err(FormatError::BadChecksum { what });
        }
        let mut r = Reader::new(&b[8..n - 4], what);
        let version = r.u32()?;
        if version != FORMAT_VERSION {
            return Err(FormatError::BadVersion { what, version });
        }
        let sb = Superblock {
            uuid: r.array16()?,
            extent_size: r.u64()?,
            device_size: r.u64()?,
            extent_count: r.u32()?,
            ckpt_offset: r.u64()?,
            ckpt_slot_len: r.u64()?,
            journal_offset: r.u64()?,
            journal_len: r.u64()?,
            data_offset: r.u64()?,
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
                    && sb.ckpt_slot_len % META_BLOCK == 0
                    && ckpt_end <= sb.journal_offset
                    && sb.journal_offset % META_BLOCK == 0
                    && sb.journal_len >= 2 * META_BLOCK
                    && sb.journal_len % META_BLOCK == 0
                    && j_end <= sb.data_offset
                    && d_end <= sb.device_size
                    && (sb.extent_count as u64) <= MAX_EXTENTS,
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

pub fn round_up(v: u64, to: u64) -> u64 {
    v.div_ceil(to) * to
}

/// Bytes of a valid-block bitmap for the smallest block size.
pub fn bitmap_bytes_max(extent_size: u64) -> usize {
    (extent_size / MIN_BLOCK_SIZE as u64 / 8) as usize
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
    fn encode(&self, w: &mut Writer) {
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
    fn decode(r: &mut Reader) -> Result<VolumeDesc, FormatError> {
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

fn encode_key(w: &mut Writer, k: &KvKey) {
    w.u8(k.len() as u8);
    w.bytes(k.as_bytes());
}

fn decode_key(r: &mut Reader) -> Result<KvKey, FormatError> {
    let n = r.u8()? as usize;
    if n == 0 {
        return Err(r.invalid("KV key of 0 bytes"));
    }
    let b = r.bytes(n.min(KV_KEY_MAX_LEN + 1))?;
    KvKey::new(b).ok_or_else(|| r.invalid(format!("KV key of {n} bytes")))
}

fn encode_loc(w: &mut Writer, l: &KvLoc) {
    w.u64(l.block);
    w.u32(l.nblocks);
    w.u32(l.len);
}

fn decode_loc(r: &mut Reader) -> Result<KvLoc, FormatError> {
    Ok(KvLoc {
        block: r.u64()?,
        nblocks: r.u32()?,
        len: r.u32()?,
    })
}

fn encode_list(w: &mut Writer, v: &[u32]) {
    w.u32(v.len() as u32);
    for &x in v {
        w.u32(x);
    }
}

fn decode_list(r: &mut Reader) -> Result<Vec<u32>, FormatError> {
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

/// Header of a checkpoint slot and of a journal entry: magic, sequence, where the
/// journal starts (checkpoints only), payload length and checksums. 64 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockHeader {
    pub seq: u64,
    /// Checkpoint: journal sequence and byte position replay starts from.
    pub journal_seq: u64,
    pub journal_pos: u64,
    pub payload_len: u64,
    pub payload_crc: u32,
    /// Ties the block to one formatting of the pool.
    pub pool_tag: u64,
}

pub const HEADER_LEN: usize = 64;

impl BlockHeader {
    pub fn encode(&self, magic: &[u8; 8], out: &mut [u8]) {
        let mut w = Writer::default();
        w.bytes(magic);
        w.u64(self.seq);
        w.u64(self.journal_seq);
        w.u64(self.journal_pos);
        w.u64(self.payload_len);
        w.u32(self.payload_crc);
        w.u64(self.pool_tag);
        w.b.resize(HEADER_LEN - 4, 0);
        let c = crc(&w.b);
        w.u32(c);
        out[..HEADER_LEN].copy_from_slice(&w.b);
    }

    pub fn decode(
        magic: &[u8; 8],
        b: &[u8],
        what: &'static str,
    ) -> Result<BlockHeader, FormatError> {
        let h = b.get(..HEADER_LEN).ok_or(FormatError::Truncated { what })?;
        if &h[..8] != magic {
            return Err(FormatError::BadMagic { what });
        }
        let stored = u32::from_le_bytes([h[60], h[61], h[62], h[63]]);
        if crc(&h[..60]) != stored {
            return Err(FormatError::BadChecksum { what });
        }
        let mut r = Reader::new(&h[8..60], what);
        Ok(BlockHeader {
            seq: r.u64()?,
            journal_seq: r.u64()?,
            journal_pos: r.u64()?,
            payload_len: r.u64()?,
            payload_crc: r.u32()?,
            pool_tag: r.u64()?,
        })
    }
}

/// Builds a header + payload block padded to `META_BLOCK`.
pub fn seal(magic: &[u8; 8], mut hdr: BlockHeader, payload: &[u8]) -> Vec<u8> {
    hdr.payload_len = payload.len() as u64;
    hdr.payload_crc = crc(payload);
    let total = round_up((HEADER_LEN + payload.len()) as u64, META_BLOCK) as usize;
    let mut b = vec![0u8; total];
    hdr.encode(magic, &mut b);
    b[HEADER_LEN..HEADER_LEN + payload.len()].copy_from_slice(payload);
    b
}

/// Checks a sealed block's payload; returns it.
pub fn unseal<'a>(
    hdr: &BlockHeader,
    b: &'a [u8],
    what: &'static str,
) -> Result<&'a [u8], FormatError> {
    let len = usize::try_from(hdr.payload_len).map_err(|_| FormatError::Truncated { what })?;
    let p = b
        .get(HEADER_LEN..HEADER_LEN.saturating_add(len))
        .ok_or(FormatError::Truncated { what })?;
    if crc(p) != hdr.payload_crc {
        return Err(FormatError::BadChecksum { what });
    }
    Ok(p)
}

/// A checkpoint's payload: the whole metadata state at one point.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CheckpointData {
    pub next_volume_id: u32,
    pub volumes: Vec<VolumeDesc>,
    /// (volume, logical extent, physical extent, bitmap)
    pub mappings: Vec<(u32, u32, u32, Vec<u8>)>,
    pub clean: Vec<u32>,
    /// Every key of every KV volume: (volume, key, location). Written after
    /// the clean list, so a checkpoint without KV volumes reads as before.
    pub kv: Vec<(u32, KvKey, KvLoc)>,
}

impl CheckpointData {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u32(self.next_volume_id);
        w.u32(self.volumes.len() as u32);
        for v in &self.volumes {
            v.encode(&mut w);
        }
        w.u32(self.mappings.len() as u32);
        for (vol, lext, phys, bm) in &self.mappings {
            w.u32(*vol);
            w.u32(*lext);
            w.u32(*phys);
            w.u32(bm.len() as u32);
            w.bytes(bm);
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
            mappings.push((vol, lext, phys, r.bytes(n)?.to_vec()));
        }
        let clean = decode_list(&mut r)?;
        let mut kv = Vec::new();
        if !r.done() {
            let n = r.u64()?;
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
        }
        if !r.done() {
            return Err(r.invalid("trailing bytes"));
        }
        Ok(CheckpointData {
            next_volume_id,
            volumes,
            mappings,
            clean,
            kv,
        })
    }
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

    #[test]
    fn sealed_blocks_detect_damage() {
        let hdr = BlockHeader {
            seq: 5,
            journal_seq: 0,
            journal_pos: 0,
            payload_len: 0,
            payload_crc: 0,
            pool_tag: 42,
        };
        let mut b = seal(JOURNAL_MAGIC, hdr, b"hello");
        assert_eq!(b.len(), 4096);
        let h = BlockHeader::decode(JOURNAL_MAGIC, &b, "j").unwrap();
        assert_eq!(unseal(&h, &b, "j"), Ok(&b"hello"[..]));
        b[HEADER_LEN] ^= 0x80;
        assert!(unseal(&h, &b, "j").is_err());
        assert!(BlockHeader::decode(CHECKPOINT_MAGIC, &b, "c").is_err());
    }

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

        #[test]
        fn mutated_superblock_never_passes_with_bad_geometry(pos in 0usize..4096, bit in 0u8..8) {
            let sb = Superblock::layout(8 << 30, 1 << 20, [3; 16], None).unwrap();
            let mut b = sb.encode();
            b[pos] ^= 1 << bit;
            // A single flipped bit is always caught (CRC32C detects all 1-bit errors).
            prop_assert!(Superblock::decode(&b).is_err());
        }

        #[test]
        fn checkpoint_round_trips(vols in 0usize..5, maps in proptest::collection::vec((0u32..5, 0u32..100, 0u32..1000, proptest::collection::vec(any::<u8>(), 0..64)), 0..50), clean in proptest::collection::vec(0u32..1000, 0..100), kv in proptest::collection::vec((0u32..5, proptest::collection::vec(any::<u8>(), 1..=16), any::<u64>(), any::<u32>(), any::<u32>()), 0..40)) {
            let c = CheckpointData {
                next_volume_id: vols as u32,
                volumes: (0..vols).map(|i| VolumeDesc { id: i as u32, name: format!("v{i}"), uuid: [i as u8; 16], size_bytes: 4096 * i as u64, block_size: 4096, flags: 0 }).collect(),
                mappings: maps,
                clean,
                kv: kv.into_iter().filter_map(|(v, k, block, nblocks, len)| Some((v, KvKey::new(&k)?, KvLoc { block, nblocks, len }))).collect(),
            };
            prop_assert_eq!(CheckpointData::decode(&c.encode()), Ok(c));
        }
    }
}
