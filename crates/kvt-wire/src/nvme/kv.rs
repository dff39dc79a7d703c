//! NVMe Key Value Command Set 1.0 (CSI 01h): the I/O commands of a KV
//! namespace (Store, Retrieve, Delete, Exist, List; Flush is shared with the
//! NVM command set), their status codes, the KV-specific Identify Namespace
//! data structure and the List response.
//!
//! Hand-written rather than generated bindings: `KvCommand::decode` runs once
//! per command on the I/O path, right after the capsule arrives, and must not
//! allocate, copy more than the key, or panic on anything a host sends.
//!
//! Layouts were checked against the KV Command Set 1.0 as SPDK's
//! `spdk_nvme_kv_cmd` / `spdk_nvme_kv_ns_data` and xNVMe's `kvs` command and
//! identify structures carry it. Where they disagree with older notes:
//! - Store option bit 2 is "do not compress" (the controller compresses when
//!   it is clear and it can); kvtarget never compresses, so it is always met.
//! - Capacity Exceeded, Namespace Not Ready, Reservation Conflict and Format
//!   In Progress (81h-84h) are generic status (SCT 0); only 85h-89h are KV
//!   command-specific (SCT 1).

use super::{Sqe, Status};
use crate::le::*;

/// KV command set I/O opcodes.
pub mod kv_opc {
    /// Shared with the NVM command set: makes every acknowledged Store durable.
    pub const FLUSH: u8 = 0x00;
    pub const STORE: u8 = 0x01;
    pub const RETRIEVE: u8 = 0x02;
    pub const LIST: u8 = 0x06;
    pub const DELETE: u8 = 0x10;
    pub const EXIST: u8 = 0x14;
}

/// The longest key the command carries: CDW2-3 and CDW14-15, 4 bytes each.
pub const KV_KEY_MAX_LEN: usize = 16;
/// SQE byte offsets of the key: bytes 7:0 of the key in CDW2-3, bytes 15:8
/// in CDW14-15, each in memory order (a host memcpy's the key in).
const KEY_LO_OFF: usize = 8;
const KEY_HI_OFF: usize = 56;

/// Store options, CDW11 bits 15:8 (SO).
pub mod store_opt {
    /// Bit 0: do not store the value if the key does not exist (overwrite only).
    pub const MUST_EXIST: u8 = 1 << 0;
    /// Bit 1: do not store the value if the key exists (insert only; what
    /// Mooncake Store uses).
    pub const MUST_NOT_EXIST: u8 = 1 << 1;
    /// Bit 2: do not compress the value.
    pub const NO_COMPRESS: u8 = 1 << 2;
}

/// Retrieve options, CDW11 bits 15:8 (RO).
pub mod retrieve_opt {
    /// Bit 0: return the value as stored, without decompressing it.
    pub const RAW: u8 = 1 << 0;
}

/// A KV key: 1 to 16 bytes (List also takes an empty start key).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct KvKey {
    len: u8,
    /// Bytes past `len` are always zero, so equality is that of the key.
    bytes: [u8; KV_KEY_MAX_LEN],
}

/// Keys in List's order: by their bytes, a key before the longer keys it
/// begins. With the bytes past `len` zero that is the padded bytes as one
/// big-endian number, then the length: two integer compares, where a byte
/// slice compare calls `memcmp` (a sixth of a recovery's time went there).
impl Ord for KvKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        let rank = |k: &KvKey| (u128::from_be_bytes(k.bytes), k.len);
        rank(self).cmp(&rank(other))
    }
}

impl PartialOrd for KvKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl std::fmt::Debug for KvKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KvKey(")?;
        for b in self.as_bytes() {
            write!(f, "{b:02x}")?;
        }
        write!(f, ")")
    }
}

impl KvKey {
    /// A key of these bytes; `None` if longer than 16.
    pub fn new(key: &[u8]) -> Option<KvKey> {
        if key.len() > KV_KEY_MAX_LEN {
            return None;
        }
        let mut bytes = [0u8; KV_KEY_MAX_LEN];
        bytes[..key.len()].copy_from_slice(key);
        Some(KvKey {
            len: key.len() as u8,
            bytes,
        })
    }
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
    pub fn len(&self) -> usize {
        self.len as usize
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The key of an SQE whose key length field says `kl` (at most 16: the
    /// caller checked). Bytes past `kl` are ignored, as the host may leave
    /// anything there.
    fn from_sqe(sqe: &Sqe, kl: usize) -> KvKey {
        assert!(kl <= KV_KEY_MAX_LEN);
        let mut bytes = [0u8; KV_KEY_MAX_LEN];
        bytes[..8].copy_from_slice(&sqe.0[KEY_LO_OFF..KEY_LO_OFF + 8]);
        bytes[8..].copy_from_slice(&sqe.0[KEY_HI_OFF..KEY_HI_OFF + 8]);
        bytes[kl..].fill(0);
        KvKey {
            len: kl as u8,
            bytes,
        }
    }
    fn write_to(&self, sqe: &mut Sqe) {
        sqe.0[KEY_LO_OFF..KEY_LO_OFF + 8].copy_from_slice(&self.bytes[..8]);
        sqe.0[KEY_HI_OFF..KEY_HI_OFF + 8].copy_from_slice(&self.bytes[8..]);
    }
}

/// Store options the controller acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoreOptions {
    pub must_exist: bool,
    pub must_not_exist: bool,
    pub no_compress: bool,
}

impl StoreOptions {
    fn from_bits(so: u8) -> StoreOptions {
        StoreOptions {
            must_exist: so & store_opt::MUST_EXIST != 0,
            must_not_exist: so & store_opt::MUST_NOT_EXIST != 0,
            no_compress: so & store_opt::NO_COMPRESS != 0,
        }
    }
    fn bits(&self) -> u8 {
        let bit = |on: bool, b: u8| if on { b } else { 0 };
        bit(self.must_exist, store_opt::MUST_EXIST)
            | bit(self.must_not_exist, store_opt::MUST_NOT_EXIST)
            | bit(self.no_compress, store_opt::NO_COMPRESS)
    }
}

/// A decoded KV I/O command. Sizes are in bytes; how the data moves (SGL,
/// in-capsule, R2T) is the queue's business, as for NVM commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvCommand {
    Flush,
    /// Store `value_size` bytes (CDW10, VS) under `key`. Zero stores an
    /// empty value.
    Store {
        key: KvKey,
        value_size: u32,
        options: StoreOptions,
    },
    /// Retrieve into a host buffer of `host_buffer_size` bytes (CDW10, HBS).
    /// The completion's DW0 is the size of the whole value; a buffer smaller
    /// than the value gets its first HBS bytes. HBS 0 transfers nothing and
    /// only reports the size (the use SPDK's KV host driver documents).
    Retrieve {
        key: KvKey,
        host_buffer_size: u32,
        raw: bool,
    },
    Delete {
        key: KvKey,
    },
    Exist {
        key: KvKey,
    },
    /// List keys from `start_key` on (an empty start key lists from the
    /// first) into a buffer of `host_buffer_size` bytes in the List response
    /// format below.
    List {
        start_key: KvKey,
        host_buffer_size: u32,
    },
}

/// The smallest List host buffer: the 4-byte count of returned keys.
pub const KV_LIST_MIN_BUFFER: u32 = 4;

impl KvCommand {
    /// Decodes and validates a KV I/O command. `max_value_size` is the
    /// namespace's KV format maximum (VML), against which Store checks its
    /// value size.
    ///
    /// Statuses: unknown opcode, Invalid Opcode; fused commands, Invalid
    /// Field; key length 0 (except List) or over 16, Invalid Key Size; Store
    /// over the format maximum, Invalid Value Size; Store with both "must
    /// exist" and "must not exist", Invalid Field (the two can never both
    /// hold, the specification defines no outcome for them, and a host that
    /// sets both has a bug); List into a buffer that cannot hold the key
    /// count, Invalid Field. Reserved option bits are ignored, as the base
    /// specification asks of reserved fields.
    pub fn decode(sqe: &Sqe, max_value_size: u32) -> Result<KvCommand, Status> {
        if sqe.fuse() != 0 {
            return Err(Status::INVALID_FIELD);
        }
        let cdw10 = sqe.cdw(10);
        let cdw11 = sqe.cdw(11);
        let kl = (cdw11 & 0xFF) as usize;
        let options = ((cdw11 >> 8) & 0xFF) as u8;
        let key = |allow_empty: bool| {
            if kl > KV_KEY_MAX_LEN || (kl == 0 && !allow_empty) {
                Err(Status::KV_INVALID_KEY_SIZE)
            } else {
                Ok(KvKey::from_sqe(sqe, kl))
            }
        };
        Ok(match sqe.opcode() {
            kv_opc::FLUSH => KvCommand::Flush,
            kv_opc::STORE => {
                let key = key(false)?;
                if cdw10 > max_value_size {
                    return Err(Status::KV_INVALID_VALUE_SIZE);
                }
                let options = StoreOptions::from_bits(options);
                if options.must_exist && options.must_not_exist {
                    return Err(Status::INVALID_FIELD);
                }
                KvCommand::Store {
                    key,
                    value_size: cdw10,
                    options,
                }
            }
            kv_opc::RETRIEVE => KvCommand::Retrieve {
                key: key(false)?,
                host_buffer_size: cdw10,
                raw: options & retrieve_opt::RAW != 0,
            },
            kv_opc::DELETE => KvCommand::Delete { key: key(false)? },
            kv_opc::EXIST => KvCommand::Exist { key: key(false)? },
            kv_opc::LIST => {
                let start_key = key(true)?;
                if cdw10 < KV_LIST_MIN_BUFFER {
                    return Err(Status::INVALID_FIELD);
                }
                KvCommand::List {
                    start_key,
                    host_buffer_size: cdw10,
                }
            }
            _ => return Err(Status::INVALID_OPCODE),
        })
    }

    /// The SQE for this command (data pointer left for the transport).
    pub fn encode(&self, cid: u16, nsid: u32) -> Sqe {
        let (opc, cdw10, key, options) = match *self {
            KvCommand::Flush => (kv_opc::FLUSH, 0, None, 0),
            KvCommand::Store {
                key,
                value_size,
                options,
            } => (kv_opc::STORE, value_size, Some(key), options.bits()),
            KvCommand::Retrieve {
                key,
                host_buffer_size,
                raw,
            } => (
                kv_opc::RETRIEVE,
                host_buffer_size,
                Some(key),
                if raw { retrieve_opt::RAW } else { 0 },
            ),
            KvCommand::Delete { key } => (kv_opc::DELETE, 0, Some(key), 0),
            KvCommand::Exist { key } => (kv_opc::EXIST, 0, Some(key), 0),
            KvCommand::List {
                start_key,
                host_buffer_size,
            } => (kv_opc::LIST, host_buffer_size, Some(start_key), 0),
        };
        let mut s = Sqe::new(opc, cid, nsid);
        if let Some(key) = key {
            key.write_to(&mut s);
            s.set_cdw(10, cdw10);
            s.set_cdw(11, key.len() as u32 | (options as u32) << 8);
        }
        s
    }

    /// The key the command names, for logs and routing.
    pub fn key(&self) -> Option<&KvKey> {
        match self {
            KvCommand::Flush => None,
            KvCommand::Store { key, .. }
            | KvCommand::Retrieve { key, .. }
            | KvCommand::Delete { key }
            | KvCommand::Exist { key } => Some(key),
            KvCommand::List { start_key, .. } => Some(start_key),
        }
    }
}

/// One KV format (16 bytes), an entry of KVF in the KV Identify Namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KvFormat {
    /// Bytes 1:0: KV key maximum length (KML), in bytes.
    pub kml: u16,
    /// Byte 3: format options; bits 1:0 relative performance (0 = best).
    pub fopt: u8,
    /// Bytes 7:4: KV value maximum length (VML), in bytes.
    pub vml: u32,
    /// Bytes 11:8: maximum number of keys (MNK); 0 = no limit reported.
    pub mnk: u32,
}

pub const KV_FORMAT_LEN: usize = 16;
/// KVF holds at most 16 formats.
pub const KV_FORMATS_MAX: usize = 16;

impl KvFormat {
    fn encode(&self, b: &mut [u8]) {
        put_u16(b, 0, self.kml);
        b[3] = self.fopt;
        put_u32(b, 4, self.vml);
        put_u32(b, 8, self.mnk);
    }
    fn decode(b: &[u8]) -> KvFormat {
        KvFormat {
            kml: u16_at(b, 0),
            fopt: b.get(3).copied().unwrap_or(0),
            vml: u32_at(b, 4),
            mnk: u32_at(b, 8),
        }
    }
}

/// KV command set specific Identify Namespace (CNS 05h, CSI 01h), 4096 bytes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KvIdentifyNamespace {
    /// Bytes 7:0: namespace size, in bytes.
    pub nsze: u64,
    /// Bytes 23:16: namespace utilization, in bytes.
    pub nuse: u64,
    /// Byte 24: namespace features (bit 0 thin provisioning).
    pub nsfeat: u8,
    /// Byte 26: multi-path I/O and sharing (bit 0: may be shared).
    pub nmic: u8,
    /// Byte 27: reservation capabilities.
    pub rescap: u8,
    /// Byte 28: format progress indicator.
    pub fpi: u8,
    /// Bytes 35:32: namespace optimal value granularity, in bytes.
    pub novg: u32,
    /// Bytes 39:36: ANA group identifier.
    pub anagrpid: u32,
    /// Byte 43: namespace attributes (bit 0: write protected).
    pub nsattr: u8,
    /// Bytes 45:44: NVM set identifier.
    pub nvmsetid: u16,
    /// Bytes 47:46: endurance group identifier.
    pub endgid: u16,
    /// Bytes 63:48.
    pub nguid: [u8; 16],
    /// Bytes 71:64.
    pub eui64: [u8; 8],
    /// Bytes 327:72: the supported KV formats, at least one. Byte 25 (NKVF)
    /// is their number, 0's based like NLBAF (as the NIXL SPDK-KV plugin reads
    /// it against SPDK 26.05; xNVMe's printer reads it as a count, which only
    /// hides the last format). The format in use is the one KVFI selects; with
    /// one format KVFI is 0 wherever it sits, so it needs no field here.
    pub kvf: Vec<KvFormat>,
}

const KVF_OFF: usize = 72;
const _: () = assert!(KVF_OFF + KV_FORMATS_MAX * KV_FORMAT_LEN == 328);

impl KvIdentifyNamespace {
    pub fn encode(&self) -> Vec<u8> {
        assert!((1..=KV_FORMATS_MAX).contains(&self.kvf.len()));
        let mut b = vec![0u8; super::IDENTIFY_LEN];
        put_u64(&mut b, 0, self.nsze);
        put_u64(&mut b, 16, self.nuse);
        b[24] = self.nsfeat;
        b[25] = (self.kvf.len() - 1) as u8;
        b[26] = self.nmic;
        b[27] = self.rescap;
        b[28] = self.fpi;
        put_u32(&mut b, 32, self.novg);
        put_u32(&mut b, 36, self.anagrpid);
        b[43] = self.nsattr;
        put_u16(&mut b, 44, self.nvmsetid);
        put_u16(&mut b, 46, self.endgid);
        b[48..64].copy_from_slice(&self.nguid);
        b[64..72].copy_from_slice(&self.eui64);
        for (i, f) in self.kvf.iter().enumerate() {
            let off = KVF_OFF + i * KV_FORMAT_LEN;
            f.encode(&mut b[off..off + KV_FORMAT_LEN]);
        }
        b
    }
    pub fn decode(b: &[u8]) -> KvIdentifyNamespace {
        let byte = |o: usize| b.get(o).copied().unwrap_or(0);
        let mut nguid = [0u8; 16];
        if let Some(s) = b.get(48..64) {
            nguid.copy_from_slice(s);
        }
        let mut eui64 = [0u8; 8];
        if let Some(s) = b.get(64..72) {
            eui64.copy_from_slice(s);
        }
        let nkvf = (byte(25) as usize + 1).min(KV_FORMATS_MAX);
        let kvf = (0..nkvf)
            .map(|i| {
                let off = KVF_OFF + i * KV_FORMAT_LEN;
                KvFormat::decode(b.get(off..).unwrap_or(&[]))
            })
            .collect();
        KvIdentifyNamespace {
            nsze: u64_at(b, 0),
            nuse: u64_at(b, 16),
            nsfeat: byte(24),
            nmic: byte(26),
            rescap: byte(27),
            fpi: byte(28),
            novg: u32_at(b, 32),
            anagrpid: u32_at(b, 36),
            nsattr: byte(43),
            nvmsetid: u16_at(b, 44),
            endgid: u16_at(b, 46),
            nguid,
            eui64,
            kvf,
        }
    }
}

/// The bytes one key takes in a List response: its 2-byte length, the key,
/// and padding to a 4-byte boundary (so a 16-byte key takes 20 bytes, the
/// size of SPDK's `spdk_nvme_kv_ns_list_key_data`).
pub fn list_entry_len(key_len: usize) -> usize {
    (2 + key_len).div_ceil(4) * 4
}

/// Encodes a List response into a host buffer of `buffer_len` bytes: the
/// number of returned keys (NRK, bytes 3:0), then each key as its length
/// (u16) and bytes, padded to 4 bytes. As many keys as fit are returned;
/// the count says how many. Returns the buffer and the number of keys in it.
pub fn encode_list_response<'a>(
    keys: impl Iterator<Item = &'a KvKey>,
    buffer_len: usize,
) -> (Vec<u8>, u32) {
    let mut b = vec![0u8; buffer_len];
    let mut off = 4;
    let mut n = 0u32;
    for key in keys {
        let len = list_entry_len(key.len());
        if off + len > buffer_len {
            break;
        }
        put_u16(&mut b, off, key.len() as u16);
        b[off + 2..off + 2 + key.len()].copy_from_slice(key.as_bytes());
        off += len;
        n += 1;
    }
    if buffer_len >= 4 {
        put_u32(&mut b, 0, n);
    }
    (b, n)
}

/// Why a List response does not parse (it came from the controller: the
/// initiator's view).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListResponseError {
    /// The buffer ended inside the entry of key `index`.
    Truncated { index: u32 },
    /// Key `index` claims a length over 16.
    KeyLength { index: u32, len: u16 },
}

/// Decodes a List response.
pub fn decode_list_response(b: &[u8]) -> Result<Vec<KvKey>, ListResponseError> {
    if b.len() < 4 {
        return Err(ListResponseError::Truncated { index: 0 });
    }
    let nrk = u32_at(b, 0);
    let mut off = 4;
    // Each entry takes at least 4 bytes: the count cannot promise more keys
    // than the buffer holds, so this bounds the allocation too.
    let mut keys = Vec::with_capacity((nrk as usize).min(b.len() / 4));
    for index in 0..nrk {
        if off + 2 > b.len() {
            return Err(ListResponseError::Truncated { index });
        }
        let len = u16_at(b, off);
        if len as usize > KV_KEY_MAX_LEN {
            return Err(ListResponseError::KeyLength { index, len });
        }
        let end = off + list_entry_len(len as usize);
        let Some(key) = b.get(off + 2..off + 2 + len as usize) else {
            return Err(ListResponseError::Truncated { index });
        };
        if end > b.len() {
            return Err(ListResponseError::Truncated { index });
        }
        keys.extend(KvKey::new(key));
        off = end;
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MAX_VALUE: u32 = 32 << 20;

    fn key(b: &[u8]) -> KvKey {
        KvKey::new(b).unwrap()
    }

    #[test]
    fn key_sits_in_cdw2_3_and_cdw14_15() {
        let k: Vec<u8> = (1..=16).collect();
        let s = KvCommand::Exist { key: key(&k) }.encode(5, 1);
        assert_eq!(s.cdw(2), u32::from_le_bytes([1, 2, 3, 4]));
        assert_eq!(s.cdw(3), u32::from_le_bytes([5, 6, 7, 8]));
        assert_eq!(s.cdw(14), u32::from_le_bytes([9, 10, 11, 12]));
        assert_eq!(s.cdw(15), u32::from_le_bytes([13, 14, 15, 16]));
        assert_eq!(s.cdw(11), 16);
        assert_eq!(s.opcode(), 0x14);
    }

    #[test]
    fn store_options_sit_in_cdw11_byte_1() {
        let s = KvCommand::Store {
            key: key(b"abc"),
            value_size: 4096,
            options: StoreOptions {
                must_not_exist: true,
                no_compress: true,
                ..Default::default()
            },
        }
        .encode(1, 1);
        assert_eq!(s.cdw(10), 4096);
        assert_eq!(s.cdw(11), 3 | (0b110 << 8));
    }

    #[test]
    fn bytes_past_the_key_length_are_ignored() {
        let mut s = KvCommand::Delete { key: key(b"ab") }.encode(1, 1);
        s.0[10] = 0xEE;
        s.0[63] = 0xEE;
        assert_eq!(
            KvCommand::decode(&s, MAX_VALUE),
            Ok(KvCommand::Delete { key: key(b"ab") })
        );
    }

    #[test]
    fn malformed_commands_get_the_specification_status() {
        let with = |opc: u8, cdw10: u32, cdw11: u32| {
            let mut s = Sqe::new(opc, 1, 1);
            s.set_cdw(10, cdw10);
            s.set_cdw(11, cdw11);
            KvCommand::decode(&s, MAX_VALUE)
        };
        for opc in [
            kv_opc::STORE,
            kv_opc::RETRIEVE,
            kv_opc::DELETE,
            kv_opc::EXIST,
        ] {
            assert_eq!(with(opc, 1, 0), Err(Status::KV_INVALID_KEY_SIZE), "{opc}");
            assert_eq!(with(opc, 1, 17), Err(Status::KV_INVALID_KEY_SIZE), "{opc}");
            assert!(with(opc, 1, 16).is_ok(), "{opc}");
        }
        assert_eq!(with(kv_opc::LIST, 64, 17), Err(Status::KV_INVALID_KEY_SIZE));
        assert_eq!(
            with(kv_opc::LIST, 64, 0),
            Ok(KvCommand::List {
                start_key: KvKey::default(),
                host_buffer_size: 64
            })
        );
        assert_eq!(with(kv_opc::LIST, 3, 4), Err(Status::INVALID_FIELD));
        assert_eq!(
            with(kv_opc::STORE, MAX_VALUE + 1, 4),
            Err(Status::KV_INVALID_VALUE_SIZE)
        );
        assert!(with(kv_opc::STORE, MAX_VALUE, 4).is_ok());
        assert!(with(kv_opc::STORE, 0, 4).is_ok(), "an empty value");
        assert_eq!(
            with(kv_opc::STORE, 8, 4 | 0b11 << 8),
            Err(Status::INVALID_FIELD)
        );
        // Key size is checked before value size.
        assert_eq!(
            with(kv_opc::STORE, MAX_VALUE + 1, 0),
            Err(Status::KV_INVALID_KEY_SIZE)
        );
        // A zero-length Retrieve asks for the value size only.
        assert_eq!(
            with(kv_opc::RETRIEVE, 0, 4),
            Ok(KvCommand::Retrieve {
                key: key(&[0; 4]),
                host_buffer_size: 0,
                raw: false
            })
        );
        assert_eq!(with(0x03, 0, 4), Err(Status::INVALID_OPCODE));
        assert_eq!(with(0x7F, 0, 4), Err(Status::INVALID_OPCODE));
        let mut fused = Sqe::new(kv_opc::EXIST, 1, 1);
        fused.0[1] |= 1;
        fused.set_cdw(11, 4);
        assert_eq!(
            KvCommand::decode(&fused, MAX_VALUE),
            Err(Status::INVALID_FIELD)
        );
        // Reserved store option bits (a vendor's TTL flag, say) are ignored.
        assert_eq!(
            with(kv_opc::STORE, 8, 4 | 0xF8 << 8),
            Ok(KvCommand::Store {
                key: key(&[0; 4]),
                value_size: 8,
                options: StoreOptions::default()
            })
        );
    }

    #[test]
    fn kv_status_codes_match_the_specification() {
        let sc = |s: Status| (s.sct, s.sc);
        assert_eq!(sc(Status::CAPACITY_EXCEEDED), (0, 0x81));
        assert_eq!(sc(Status::NAMESPACE_NOT_READY), (0, 0x82));
        assert_eq!(sc(Status::RESERVATION_CONFLICT), (0, 0x83));
        assert_eq!(sc(Status::FORMAT_IN_PROGRESS), (0, 0x84));
        assert_eq!(sc(Status::KV_INVALID_VALUE_SIZE), (1, 0x85));
        assert_eq!(sc(Status::KV_INVALID_KEY_SIZE), (1, 0x86));
        assert_eq!(sc(Status::KV_KEY_DOES_NOT_EXIST), (1, 0x87));
        assert_eq!(sc(Status::KV_UNRECOVERED_ERROR), (1, 0x88));
        assert_eq!(sc(Status::KV_KEY_EXISTS), (1, 0x89));
        // As Linux's passthrough returns it: (sct << 8) | sc.
        assert_eq!(Status::KV_KEY_DOES_NOT_EXIST.to_field() >> 1 & 0x7FF, 0x187);
    }

    #[test]
    fn kv_identify_namespace_offsets_match_the_specification() {
        let id = KvIdentifyNamespace {
            nsze: 0x0102_0304_0506_0708,
            nuse: 0x1112_1314_1516_1718,
            nsfeat: 0x01,
            nmic: 0x01,
            rescap: 0x5A,
            fpi: 0x80,
            novg: 0x2122_2324,
            anagrpid: 0x3132_3334,
            nsattr: 0x01,
            nvmsetid: 0x4142,
            endgid: 0x5152,
            nguid: [0xA0; 16],
            eui64: [0xB0; 8],
            kvf: vec![
                KvFormat {
                    kml: 16,
                    fopt: 0,
                    vml: 32 << 20,
                    mnk: 1 << 20,
                },
                KvFormat {
                    kml: 8,
                    fopt: 2,
                    vml: 4096,
                    mnk: 0,
                },
            ],
        };
        let b = id.encode();
        assert_eq!(b.len(), 4096);
        assert_eq!(u64_at(&b, 0), id.nsze);
        assert!(b[8..16].iter().all(|&x| x == 0));
        assert_eq!(u64_at(&b, 16), id.nuse);
        assert_eq!(&b[24..29], &[0x01, 1, 0x01, 0x5A, 0x80], "NKVF 0's based");
        assert_eq!(u32_at(&b, 32), id.novg);
        assert_eq!(u32_at(&b, 36), id.anagrpid);
        assert_eq!(b[43], 0x01);
        assert_eq!(u16_at(&b, 44), 0x4142);
        assert_eq!(u16_at(&b, 46), 0x5152);
        assert_eq!(&b[48..64], &[0xA0; 16]);
        assert_eq!(&b[64..72], &[0xB0; 8]);
        assert_eq!(u16_at(&b, 72), 16);
        assert_eq!(u32_at(&b, 76), 32 << 20);
        assert_eq!(u32_at(&b, 80), 1 << 20);
        assert_eq!((u16_at(&b, 88), b[91], u32_at(&b, 92)), (8, 2, 4096));
        assert!(b[104..].iter().all(|&x| x == 0));
        assert_eq!(KvIdentifyNamespace::decode(&b), id);
    }

    #[test]
    fn list_response_packs_keys_to_four_bytes_and_stops_when_full() {
        let keys = [key(b"a"), key(b"bcdef"), key(&[7; 16])];
        let (b, n) = encode_list_response(keys.iter(), 4 + 4 + 8 + 20);
        assert_eq!(n, 3);
        assert_eq!(u32_at(&b, 0), 3);
        assert_eq!(&b[4..8], &[1, 0, b'a', 0]);
        assert_eq!(&b[8..16], &[5, 0, b'b', b'c', b'd', b'e', b'f', 0]);
        assert_eq!(u16_at(&b, 16), 16);
        assert_eq!(decode_list_response(&b), Ok(keys.to_vec()));
        // One byte short: the last key does not fit and is not counted.
        let (b, n) = encode_list_response(keys.iter(), 4 + 4 + 8 + 19);
        assert_eq!(n, 2);
        assert_eq!(decode_list_response(&b), Ok(keys[..2].to_vec()));
        assert_eq!(
            decode_list_response(&[5, 0, 0, 0, 1, 0]),
            Err(ListResponseError::Truncated { index: 0 })
        );
        assert_eq!(
            decode_list_response(&[1, 0, 0, 0, 17, 0, 0, 0]),
            Err(ListResponseError::KeyLength { index: 0, len: 17 })
        );
    }

    fn any_key(min: usize) -> impl Strategy<Value = KvKey> {
        proptest::collection::vec(any::<u8>(), min..=KV_KEY_MAX_LEN)
            .prop_map(|k| KvKey::new(&k).unwrap())
    }

    fn any_command() -> impl Strategy<Value = KvCommand> {
        prop_oneof![
            Just(KvCommand::Flush),
            (any_key(1), 0..=MAX_VALUE, 0u8..3, any::<bool>()).prop_map(
                |(key, value_size, e, c)| {
                    KvCommand::Store {
                        key,
                        value_size,
                        options: StoreOptions {
                            must_exist: e == 1,
                            must_not_exist: e == 2,
                            no_compress: c,
                        },
                    }
                }
            ),
            (any_key(1), any::<u32>(), any::<bool>()).prop_map(|(key, host_buffer_size, raw)| {
                KvCommand::Retrieve {
                    key,
                    host_buffer_size,
                    raw,
                }
            }),
            any_key(1).prop_map(|key| KvCommand::Delete { key }),
            any_key(1).prop_map(|key| KvCommand::Exist { key }),
            (any_key(0), KV_LIST_MIN_BUFFER..).prop_map(|(start_key, host_buffer_size)| {
                KvCommand::List {
                    start_key,
                    host_buffer_size,
                }
            }),
        ]
    }

    proptest! {
        #[test]
        fn commands_round_trip(cmd in any_command(), cid in any::<u16>(), nsid in any::<u32>()) {
            let s = cmd.encode(cid, nsid);
            prop_assert_eq!((s.cid(), s.nsid()), (cid, nsid));
            prop_assert_eq!(KvCommand::decode(&s, MAX_VALUE), Ok(cmd));
        }

        /// Anything decoded encodes to an SQE that decodes the same: the
        /// decoder loses nothing the controller acts on.
        #[test]
        fn decode_never_panics_and_is_stable(raw in proptest::array::uniform32(any::<u16>()), max in any::<u32>()) {
            let mut b = [0u8; 64];
            for (i, w) in raw.iter().enumerate() {
                b[i * 2..i * 2 + 2].copy_from_slice(&w.to_le_bytes());
            }
            let s = Sqe(b);
            if let Ok(cmd) = KvCommand::decode(&s, max) {
                prop_assert_eq!(KvCommand::decode(&cmd.encode(s.cid(), s.nsid()), max), Ok(cmd));
            }
        }

        /// Keys order as their bytes do, a key before the longer keys it
        /// begins (keys sharing bytes and zeros are the likely mistakes).
        #[test]
        fn keys_order_as_their_bytes(
            a in proptest::collection::vec(0u8..3, 0..=KV_KEY_MAX_LEN),
            b in proptest::collection::vec(0u8..3, 0..=KV_KEY_MAX_LEN),
        ) {
            let (ka, kb) = (KvKey::new(&a), KvKey::new(&b));
            if let (Some(ka), Some(kb)) = (ka, kb) {
                prop_assert_eq!(ka.cmp(&kb), a.cmp(&b));
                prop_assert_eq!(ka == kb, a == b);
            }
        }

        #[test]
        fn list_response_round_trips(keys in proptest::collection::vec(any_key(0), 0..64), extra in 0usize..64) {
            let len = 4 + keys.iter().map(|k| list_entry_len(k.len())).sum::<usize>() + extra;
            let (b, n) = encode_list_response(keys.iter(), len);
            prop_assert_eq!(n as usize, keys.len());
            prop_assert_eq!(decode_list_response(&b), Ok(keys));
        }

        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..5000)) {
            let _ = KvIdentifyNamespace::decode(&bytes);
            let _ = decode_list_response(&bytes);
        }

        #[test]
        fn kv_identify_namespace_round_trips(
            nsze in any::<u64>(), nuse in any::<u64>(), novg in any::<u32>(),
            kvf in proptest::collection::vec((any::<u16>(), 0u8..4, any::<u32>(), any::<u32>()), 1..=KV_FORMATS_MAX),
        ) {
            let id = KvIdentifyNamespace {
                nsze, nuse, novg,
                kvf: kvf.into_iter().map(|(kml, fopt, vml, mnk)| KvFormat { kml, fopt, vml, mnk }).collect(),
                ..Default::default()
            };
            prop_assert_eq!(KvIdentifyNamespace::decode(&id.encode()), id);
        }
    }
}
