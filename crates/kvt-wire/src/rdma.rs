//! NVMe/RDMA wire formats: the RDMA CM private data exchanged when a queue pair
//! connects, and the SGL data descriptors a command capsule carries over RDMA.
//!
//! Private data layouts are those of the NVMe over Fabrics RDMA transport
//! specification (the same ones Linux's `struct nvme_rdma_cm_req/rep/rej` use);
//! every field is little-endian. Nothing here does I/O.

use super::le::{u16_at, u32_at, u64_at};
use super::nvme::{Sqe, Status};

/// RDMA_CM_REQUEST private data length (bytes 00-31).
pub const CM_REQ_LEN: usize = 32;
/// RDMA_CM_ACCEPT private data length (bytes 00-31; 04-31 reserved).
pub const CM_ACCEPT_LEN: usize = 32;
/// RDMA_CM_REJECT private data length (RECFMT and STS).
pub const CM_REJECT_LEN: usize = 4;
/// Record format 0 is the only one defined.
pub const CM_RECFMT_1_0: u16 = 0;

/// RDMA_CM_REJECT status values (NVMe/RDMA transport specification).
pub mod cm_status {
    pub const INVALID_LEN: u16 = 0x01;
    pub const INVALID_RECFMT: u16 = 0x02;
    pub const INVALID_QID: u16 = 0x03;
    pub const INVALID_HSQSIZE: u16 = 0x04;
    pub const INVALID_HRQSIZE: u16 = 0x05;
    pub const NO_RESOURCES: u16 = 0x06;
    pub const INVALID_IRD: u16 = 0x07;
    pub const INVALID_ORD: u16 = 0x08;
}

/// The host's RDMA_CM_REQUEST private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmRequest {
    /// RECFMT: record format.
    pub recfmt: u16,
    /// QID: 0 for the admin queue.
    pub qid: u16,
    /// HRQSIZE: host receive queue size (entries).
    pub hrqsize: u16,
    /// HSQSIZE: host send queue size, 0-based (the SQSIZE Connect will carry).
    pub hsqsize: u16,
    /// CNTLID (bytes 08-09), sent by recent hosts; informational.
    pub cntlid: u16,
}

impl CmRequest {
    /// Parses the private data; the error is the reject status to answer with.
    pub fn parse(b: &[u8]) -> Result<CmRequest, u16> {
        if b.len() < 8 {
            return Err(cm_status::INVALID_LEN);
        }
        let r = CmRequest {
            recfmt: u16_at(b, 0),
            qid: u16_at(b, 2),
            hrqsize: u16_at(b, 4),
            hsqsize: u16_at(b, 6),
            cntlid: u16_at(b, 8),
        };
        if r.recfmt != CM_RECFMT_1_0 {
            return Err(cm_status::INVALID_RECFMT);
        }
        Ok(r)
    }

    pub fn encode(&self) -> [u8; CM_REQ_LEN] {
        let mut b = [0u8; CM_REQ_LEN];
        b[0..2].copy_from_slice(&self.recfmt.to_le_bytes());
        b[2..4].copy_from_slice(&self.qid.to_le_bytes());
        b[4..6].copy_from_slice(&self.hrqsize.to_le_bytes());
        b[6..8].copy_from_slice(&self.hsqsize.to_le_bytes());
        b[8..10].copy_from_slice(&self.cntlid.to_le_bytes());
        b
    }
}

/// RDMA_CM_ACCEPT private data: our receive queue size for this queue pair.
pub fn encode_accept(crqsize: u16) -> [u8; CM_ACCEPT_LEN] {
    let mut b = [0u8; CM_ACCEPT_LEN];
    b[0..2].copy_from_slice(&CM_RECFMT_1_0.to_le_bytes());
    b[2..4].copy_from_slice(&crqsize.to_le_bytes());
    b
}

/// Reads CRQSIZE back from RDMA_CM_ACCEPT private data.
pub fn parse_accept(b: &[u8]) -> Option<u16> {
    (b.len() >= 4 && u16_at(b, 0) == CM_RECFMT_1_0).then(|| u16_at(b, 2))
}

/// RDMA_CM_REJECT private data.
pub fn encode_reject(status: u16) -> [u8; CM_REJECT_LEN] {
    let mut b = [0u8; CM_REJECT_LEN];
    b[0..2].copy_from_slice(&CM_RECFMT_1_0.to_le_bytes());
    b[2..4].copy_from_slice(&status.to_le_bytes());
    b
}

/// SGL descriptor type bytes (byte 15: type in bits 7:4, subtype in 3:0).
pub mod sgl_type {
    /// Data Block, Offset subtype: data in the capsule at an offset.
    pub const IN_CAPSULE: u8 = 0x01;
    /// Keyed SGL Data Block, Address subtype.
    pub const KEYED: u8 = 0x40;
    /// Keyed SGL Data Block, Invalidate Key subtype: the host asks the target to
    /// invalidate the key (Send with Invalidate) when the command completes.
    pub const KEYED_INVALIDATE: u8 = 0x4F;
}

/// Where a command's data is, from its SGL descriptor (SQE bytes 24-39).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DataDescriptor {
    /// No data (length 0).
    #[default]
    None,
    /// In-capsule data at `offset` bytes past the SQE.
    InCapsule { offset: u64, len: u32 },
    /// Host memory reached by RDMA READ/WRITE.
    Keyed {
        addr: u64,
        /// 24 bits on the wire.
        len: u32,
        key: u32,
        invalidate: bool,
    },
}

/// Largest keyed length: the field is 24 bits.
pub const KEYED_MAX_LEN: u32 = (1 << 24) - 1;

impl DataDescriptor {
    /// Decodes the descriptor of `sqe`; unknown types give the NVMe status the
    /// command fails with.
    pub fn of(sqe: &Sqe) -> Result<DataDescriptor, Status> {
        Self::decode(&sqe.0[24..40])
    }

    pub fn decode(d: &[u8]) -> Result<DataDescriptor, Status> {
        if d.len() < 16 {
            return Err(Status::INVALID_SGL_DESCRIPTOR);
        }
        match d[15] {
            sgl_type::IN_CAPSULE => {
                let len = u32_at(d, 8);
                if len == 0 {
                    return Ok(DataDescriptor::None);
                }
                Ok(DataDescriptor::InCapsule {
                    offset: u64_at(d, 0),
                    len,
                })
            }
            t @ (sgl_type::KEYED | sgl_type::KEYED_INVALIDATE) => {
                let len = u32::from(d[8]) | u32::from(d[9]) << 8 | u32::from(d[10]) << 16;
                if len == 0 {
                    return Ok(DataDescriptor::None);
                }
                Ok(DataDescriptor::Keyed {
                    addr: u64_at(d, 0),
                    len,
                    key: u32_at(d, 11),
                    invalidate: t == sgl_type::KEYED_INVALIDATE,
                })
            }
            _ => Err(Status::SGL_DESCRIPTOR_TYPE_INVALID),
        }
    }

    /// Encodes into 16 descriptor bytes (used by tests and any RDMA host).
    pub fn encode(&self) -> [u8; 16] {
        let mut d = [0u8; 16];
        match *self {
            DataDescriptor::None => d[15] = sgl_type::KEYED,
            DataDescriptor::InCapsule { offset, len } => {
                d[0..8].copy_from_slice(&offset.to_le_bytes());
                d[8..12].copy_from_slice(&len.to_le_bytes());
                d[15] = sgl_type::IN_CAPSULE;
            }
            DataDescriptor::Keyed {
                addr,
                len,
                key,
                invalidate,
            } => {
                d[0..8].copy_from_slice(&addr.to_le_bytes());
                let l = len.min(KEYED_MAX_LEN).to_le_bytes();
                d[8..11].copy_from_slice(&l[..3]);
                d[11..15].copy_from_slice(&key.to_le_bytes());
                d[15] = if invalidate {
                    sgl_type::KEYED_INVALIDATE
                } else {
                    sgl_type::KEYED
                };
            }
        }
        d
    }

    /// Bytes of data the descriptor describes.
    pub fn len(&self) -> u32 {
        match *self {
            DataDescriptor::None => 0,
            DataDescriptor::InCapsule { len, .. } | DataDescriptor::Keyed { len, .. } => len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn linux_admin_request_parses() {
        // What Linux's nvme-rdma sends for the admin queue: hrqsize 32, hsqsize 31.
        let mut b = [0u8; 32];
        b[4] = 32;
        b[6] = 31;
        let r = CmRequest::parse(&b).unwrap();
        assert_eq!((r.qid, r.hrqsize, r.hsqsize), (0, 32, 31));
        assert_eq!(CmRequest::parse(&b[..6]), Err(cm_status::INVALID_LEN));
        b[0] = 1;
        assert_eq!(CmRequest::parse(&b), Err(cm_status::INVALID_RECFMT));
        assert_eq!(encode_reject(cm_status::INVALID_HSQSIZE), [0, 0, 4, 0]);
        assert_eq!(parse_accept(&encode_accept(128)), Some(128));
    }

    #[test]
    fn keyed_descriptor_fields() {
        // Address 0x1122334455667788, length 0x012345, key 0xdeadbeef, invalidate.
        let mut d = [0u8; 16];
        d[0..8].copy_from_slice(&0x1122_3344_5566_7788u64.to_le_bytes());
        d[8..11].copy_from_slice(&[0x45, 0x23, 0x01]);
        d[11..15].copy_from_slice(&0xdead_beefu32.to_le_bytes());
        d[15] = 0x4F;
        assert_eq!(
            DataDescriptor::decode(&d),
            Ok(DataDescriptor::Keyed {
                addr: 0x1122_3344_5566_7788,
                len: 0x012345,
                key: 0xdead_beef,
                invalidate: true
            })
        );
        d[15] = 0x5A;
        assert_eq!(
            DataDescriptor::decode(&d),
            Err(Status::SGL_DESCRIPTOR_TYPE_INVALID)
        );
    }

    #[test]
    fn keyed_length_seen_by_the_target_core_is_24_bits() {
        // The I/O planner reads Sqe::sgl().length: the key's first byte (SQE
        // byte 35) must not leak into it.
        let mut sqe = Sqe::new(0x02, 1, 1);
        sqe.0[24..40].copy_from_slice(
            &DataDescriptor::Keyed {
                addr: 0x1000,
                len: 4096,
                key: 0xAABB_CCDD,
                invalidate: true,
            }
            .encode(),
        );
        assert_eq!(sqe.sgl().length, 4096);
        assert_eq!(DataDescriptor::of(&sqe).map(|d| d.len()), Ok(4096));
    }

    proptest! {
        #[test]
        fn cm_request_never_panics_and_round_trips(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(r) = CmRequest::parse(&b) {
                prop_assert_eq!(CmRequest::parse(&r.encode()), Ok(r));
            }
            let _ = parse_accept(&b);
        }

        #[test]
        fn cm_request_encode_parse(qid in any::<u16>(), hrq in any::<u16>(), hsq in any::<u16>(), c in any::<u16>()) {
            let r = CmRequest { recfmt: 0, qid, hrqsize: hrq, hsqsize: hsq, cntlid: c };
            prop_assert_eq!(CmRequest::parse(&r.encode()), Ok(r));
        }

        #[test]
        fn descriptor_never_panics_and_round_trips(b in proptest::collection::vec(any::<u8>(), 0..24)) {
            if let Ok(d) = DataDescriptor::decode(&b) {
                if d != DataDescriptor::None {
                    prop_assert_eq!(DataDescriptor::decode(&d.encode()), Ok(d));
                }
            }
        }

        #[test]
        fn keyed_encode_decode(addr in any::<u64>(), len in 1u32..=KEYED_MAX_LEN, key in any::<u32>(), inv in any::<bool>()) {
            let d = DataDescriptor::Keyed { addr, len, key, invalidate: inv };
            prop_assert_eq!(DataDescriptor::decode(&d.encode()), Ok(d));
        }
    }
}
