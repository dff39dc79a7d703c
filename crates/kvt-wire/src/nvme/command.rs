//! Submission and completion queue entries: the SQE with its SGL descriptor,
//! the opcodes (and Get/Set Features identifiers) that select a command, the
//! CQE that answers it, and the Dataset Management range list.

use super::{Status, CQE_LEN, SQE_LEN};
use crate::le::*;

/// Admin command opcodes.
pub mod admin_opc {
    pub const GET_LOG_PAGE: u8 = 0x02;
    pub const IDENTIFY: u8 = 0x06;
    pub const ABORT: u8 = 0x08;
    pub const SET_FEATURES: u8 = 0x09;
    pub const GET_FEATURES: u8 = 0x0A;
    pub const ASYNC_EVENT_REQUEST: u8 = 0x0C;
    pub const KEEP_ALIVE: u8 = 0x18;
    pub const FABRICS: u8 = 0x7F;
}

/// NVM command set I/O opcodes.
pub mod io_opc {
    pub const FLUSH: u8 = 0x00;
    pub const WRITE: u8 = 0x01;
    pub const READ: u8 = 0x02;
    pub const WRITE_ZEROES: u8 = 0x08;
    pub const DATASET_MANAGEMENT: u8 = 0x09;
    pub const FABRICS: u8 = 0x7F;
}

/// Fabrics command types (SQE byte 4 when opcode is 0x7F).
pub mod fctype {
    pub const PROPERTY_SET: u8 = 0x00;
    pub const CONNECT: u8 = 0x01;
    pub const PROPERTY_GET: u8 = 0x04;
    pub const AUTH_SEND: u8 = 0x05;
    pub const AUTH_RECV: u8 = 0x06;
    pub const DISCONNECT: u8 = 0x08;
}

/// Feature identifiers for Get/Set Features.
pub mod fid {
    pub const ARBITRATION: u8 = 0x01;
    pub const POWER_MANAGEMENT: u8 = 0x02;
    pub const TEMPERATURE_THRESHOLD: u8 = 0x04;
    pub const ERROR_RECOVERY: u8 = 0x05;
    pub const VOLATILE_WRITE_CACHE: u8 = 0x06;
    pub const NUMBER_OF_QUEUES: u8 = 0x07;
    pub const INTERRUPT_COALESCING: u8 = 0x08;
    pub const WRITE_ATOMICITY: u8 = 0x0A;
    pub const ASYNC_EVENT_CONFIG: u8 = 0x0B;
    pub const KEEP_ALIVE_TIMER: u8 = 0x0F;
    /// I/O Command Set Profile: CDW11 bits 8:0 are the index of the command
    /// set combination vector (Identify CNS 1Ch) in use.
    pub const IO_COMMAND_SET_PROFILE: u8 = 0x19;
}

/// SGL descriptor in SQE bytes 24..40.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SglDescriptor {
    pub address: u64,
    pub length: u32,
    /// Byte 15: descriptor type in bits 7:4, subtype in bits 3:0.
    pub type_byte: u8,
}

impl SglDescriptor {
    /// Data Block descriptor, Offset subtype: data rides in the capsule.
    pub const IN_CAPSULE: u8 = 0x01;
    /// Transport Data Block descriptor, transport-specific subtype A (NVMe/TCP).
    pub const TRANSPORT: u8 = 0x5A;
    /// Keyed Data Block descriptor used by NVMe/RDMA (type 4, subtype 0/4).
    pub const KEYED: u8 = 0x40;
}

/// A submission queue entry, kept as its 64 raw bytes with typed accessors.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Sqe(pub [u8; SQE_LEN]);

impl std::fmt::Debug for Sqe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sqe")
            .field("opc", &format_args!("{:#04x}", self.opcode()))
            .field("cid", &self.cid())
            .field("nsid", &self.nsid())
            .field("cdw10", &format_args!("{:#x}", self.cdw(10)))
            .finish()
    }
}

impl Default for Sqe {
    fn default() -> Self {
        Sqe([0; SQE_LEN])
    }
}

// The accessors are #[inline]: the core and the transports read every command
// through them from other crates, which cannot inline a function of this one
// otherwise (callgrind: about 80 instructions a 4 KiB read without it).
impl Sqe {
    #[inline]
    pub fn from_slice(b: &[u8]) -> Option<Sqe> {
        let a: [u8; SQE_LEN] = b.get(..SQE_LEN)?.try_into().ok()?;
        Some(Sqe(a))
    }
    pub fn new(opcode: u8, cid: u16, nsid: u32) -> Sqe {
        let mut s = Sqe::default();
        s.0[0] = opcode;
        // PSDT = 01b: SGLs for data, which is what every fabrics host uses.
        s.0[1] = 0x40;
        put_u16(&mut s.0, 2, cid);
        put_u32(&mut s.0, 4, nsid);
        s
    }
    #[inline]
    pub fn opcode(&self) -> u8 {
        self.0[0]
    }
    #[inline]
    pub fn flags(&self) -> u8 {
        self.0[1]
    }
    /// Fused operation bits (FUSE); non-zero values are unsupported here.
    #[inline]
    pub fn fuse(&self) -> u8 {
        self.0[1] & 0x3
    }
    #[inline]
    pub fn cid(&self) -> u16 {
        u16_at(&self.0, 2)
    }
    #[inline]
    pub fn set_cid(&mut self, cid: u16) {
        put_u16(&mut self.0, 2, cid);
    }
    #[inline]
    pub fn nsid(&self) -> u32 {
        u32_at(&self.0, 4)
    }
    /// Fabrics command type (meaningful when opcode is 0x7F).
    #[inline]
    pub fn fctype(&self) -> u8 {
        self.0[4]
    }
    /// Command dword N (0..=15).
    #[inline]
    pub fn cdw(&self, n: usize) -> u32 {
        u32_at(&self.0, n * 4)
    }
    #[inline]
    pub fn set_cdw(&mut self, n: usize, v: u32) {
        put_u32(&mut self.0, n * 4, v);
    }
    #[inline]
    pub fn sgl(&self) -> SglDescriptor {
        let type_byte = self.0[39];
        // A Keyed SGL Data Block (NVMe/RDMA) has a 24-bit length: byte 35
        // is the first byte of its key.
        let length = if type_byte >> 4 == SglDescriptor::KEYED >> 4 {
            u32_at(&self.0, 32) & 0x00FF_FFFF
        } else {
            u32_at(&self.0, 32)
        };
        SglDescriptor {
            address: u64_at(&self.0, 24),
            length,
            type_byte,
        }
    }
    #[inline]
    pub fn set_sgl(&mut self, sgl: SglDescriptor) {
        put_u64(&mut self.0, 24, sgl.address);
        put_u32(&mut self.0, 32, sgl.length);
        self.0[36..39].fill(0);
        self.0[39] = sgl.type_byte;
    }
    /// Starting LBA of a read/write/write-zeroes command (CDW10-11).
    #[inline]
    pub fn slba(&self) -> u64 {
        u64_at(&self.0, 40)
    }
    /// Number of logical blocks, 1-based (CDW12 bits 15:0 are 0-based).
    #[inline]
    pub fn nlb(&self) -> u32 {
        (self.cdw(12) & 0xFFFF) + 1
    }
    /// Force Unit Access (CDW12 bit 30).
    #[inline]
    pub fn fua(&self) -> bool {
        self.cdw(12) & (1 << 30) != 0
    }
}

/// The transfer direction an opcode implies (bits 1:0 of the opcode; for fabrics
/// commands, of the fctype).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataDirection {
    None,
    HostToController,
    ControllerToHost,
    Bidirectional,
}

impl DataDirection {
    pub fn of(sqe: &Sqe) -> DataDirection {
        let bits = if sqe.opcode() == admin_opc::FABRICS {
            sqe.fctype()
        } else {
            sqe.opcode()
        } & 0x3;
        match bits {
            0 => DataDirection::None,
            1 => DataDirection::HostToController,
            2 => DataDirection::ControllerToHost,
            _ => DataDirection::Bidirectional,
        }
    }
}

/// A completion queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cqe {
    /// Command-specific result, DW0 and DW1 (Property Get returns 64 bits).
    pub result: u64,
    pub sq_head: u16,
    pub sq_id: u16,
    pub cid: u16,
    pub status: u16,
}

impl Cqe {
    pub fn new(cid: u16, status: Status) -> Cqe {
        Cqe {
            cid,
            status: status.to_field(),
            ..Cqe::default()
        }
    }
    pub fn status(&self) -> Status {
        Status::from_field(self.status)
    }
    pub fn encode(&self, out: &mut [u8]) {
        put_u64(out, 0, self.result);
        put_u16(out, 8, self.sq_head);
        put_u16(out, 10, self.sq_id);
        put_u16(out, 12, self.cid);
        put_u16(out, 14, self.status);
    }
    pub fn decode(b: &[u8]) -> Option<Cqe> {
        if b.len() < CQE_LEN {
            return None;
        }
        Some(Cqe {
            result: u64_at(b, 0),
            sq_head: u16_at(b, 8),
            sq_id: u16_at(b, 10),
            cid: u16_at(b, 12),
            status: u16_at(b, 14),
        })
    }
}

/// Dataset Management range (16 bytes each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DsmRange {
    pub attributes: u32,
    pub nlb: u32,
    pub slba: u64,
}

pub const DSM_RANGE_LEN: usize = 16;
/// Dataset Management CDW11: Attribute - Deallocate.
pub const DSM_ATTR_DEALLOCATE: u32 = 1 << 2;

impl DsmRange {
    pub fn decode(b: &[u8]) -> DsmRange {
        DsmRange {
            attributes: u32_at(b, 0),
            nlb: u32_at(b, 4),
            slba: u64_at(b, 8),
        }
    }
    pub fn encode(&self, b: &mut [u8]) {
        put_u32(b, 0, self.attributes);
        put_u32(b, 4, self.nlb);
        put_u64(b, 8, self.slba);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..5000)) {
            let _ = Sqe::from_slice(&bytes);
            let _ = Cqe::decode(&bytes);
            if bytes.len() >= 16 { let _ = DsmRange::decode(&bytes); }
        }

        #[test]
        fn sqe_fields_round_trip(cid in any::<u16>(), nsid in any::<u32>(), slba in any::<u64>(), nlb in 1u32..=65536) {
            let mut s = Sqe::new(io_opc::READ, cid, nsid);
            s.set_cdw(10, slba as u32);
            s.set_cdw(11, (slba >> 32) as u32);
            s.set_cdw(12, nlb - 1);
            prop_assert_eq!(s.cid(), cid);
            prop_assert_eq!(s.nsid(), nsid);
            prop_assert_eq!(s.slba(), slba);
            prop_assert_eq!(s.nlb(), nlb);
        }
    }
}
