//! Sealed metadata blocks: the little-endian reader and writer every on-disk
//! structure is coded with, and the 64-byte header (magic, sequence, payload
//! length, CRC32C) that checkpoint slots and journal entries open with. Every
//! metadata write is a whole number of `META_BLOCK`s; decoding never panics on
//! damaged or hostile bytes.

/// Granularity of every metadata write.
pub const META_BLOCK: u64 = 4096;
pub const SUPERBLOCK_MAGIC: &[u8; 8] = b"KVTPOOL\0";
pub const CHECKPOINT_MAGIC: &[u8; 8] = b"KVTCKPT\0";
pub const JOURNAL_MAGIC: &[u8; 8] = b"KVTJRNL\0";
pub const FORMAT_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("{what}: bad magic")]
    BadMagic { what: &'static str },
    #[error("{what}: checksum mismatch")]
    BadChecksum { what: &'static str },
    #[error("{what}: unsupported format version {version}")]
    BadVersion { what: &'static str, version: u32 },
    #[error("{what}: format version {version} is unknown and no known layout's checksum matches (damaged, or written by a newer kvtarget)")]
    UnknownVersionOrDamaged { what: &'static str, version: u32 },
    #[error("{what}: truncated")]
    Truncated { what: &'static str },
    #[error("{what}: {detail}")]
    Invalid { what: &'static str, detail: String },
}

pub(super) fn crc(b: &[u8]) -> u32 {
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
    pub fn invalid(&self, detail: impl Into<String>) -> FormatError {
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

/// `v` rounded up to a multiple of `to`.
pub fn round_up(v: u64, to: u64) -> u64 {
    v.div_ceil(to) * to
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
