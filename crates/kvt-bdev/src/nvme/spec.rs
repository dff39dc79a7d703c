//! NVMe over PCIe formats the driver needs: submission/completion entries, the
//! controller registers, Identify data, PRP lists and ring arithmetic. No I/O and no
//! `unsafe`: everything here is tested without a controller.

/// Submission queue entry size (CC.IOSQES = 6).
pub const SQE_BYTES: usize = 64;
/// Completion queue entry size (CC.IOCQES = 4).
pub const CQE_BYTES: usize = 16;
/// Memory page size the driver programs (CC.MPS = 0): 4 KiB.
pub const PAGE_BYTES: usize = 4096;
/// PRP entries in one list page.
pub const PRP_PER_PAGE: usize = PAGE_BYTES / 8;

/// Controller register offsets (NVMe base spec, "Controller Registers").
pub mod reg {
    pub const CAP: usize = 0x00;
    pub const VS: usize = 0x08;
    pub const INTMS: usize = 0x0c;
    pub const CC: usize = 0x14;
    pub const CSTS: usize = 0x1c;
    pub const AQA: usize = 0x24;
    pub const ASQ: usize = 0x28;
    pub const ACQ: usize = 0x30;
    /// First doorbell.
    pub const DOORBELLS: usize = 0x1000;

    pub const CC_EN: u32 = 1;
    /// I/O SQ entry size 2^6, I/O CQ entry size 2^4.
    pub const CC_IOSQES_IOCQES: u32 = (6 << 16) | (4 << 20);
    pub const CC_SHN_MASK: u32 = 3 << 14;
    pub const CC_SHN_NORMAL: u32 = 1 << 14;
    pub const CSTS_RDY: u32 = 1;
    pub const CSTS_CFS: u32 = 1 << 1;
    pub const CSTS_SHST_MASK: u32 = 3 << 2;
    pub const CSTS_SHST_COMPLETE: u32 = 2 << 2;
    /// What a read returns once the device is gone from the bus.
    pub const GONE: u32 = u32::MAX;
}

/// Admin opcodes.
pub mod admin {
    pub const DELETE_IO_SQ: u8 = 0x00;
    pub const CREATE_IO_SQ: u8 = 0x01;
    pub const DELETE_IO_CQ: u8 = 0x04;
    pub const CREATE_IO_CQ: u8 = 0x05;
    pub const IDENTIFY: u8 = 0x06;
    pub const ABORT: u8 = 0x08;
    pub const SET_FEATURES: u8 = 0x09;
    pub const FEAT_NUMBER_OF_QUEUES: u32 = 0x07;
    pub const CNS_NAMESPACE: u32 = 0x00;
    pub const CNS_CONTROLLER: u32 = 0x01;
}

/// NVM command set opcodes.
pub mod io {
    pub const FLUSH: u8 = 0x00;
    pub const WRITE: u8 = 0x01;
    pub const READ: u8 = 0x02;
    pub const WRITE_ZEROES: u8 = 0x08;
    pub const DSM: u8 = 0x09;
    /// CDW12 bit 30: force unit access.
    pub const FUA: u32 = 1 << 30;
    /// CDW11 bit 2 of Dataset Management: deallocate.
    pub const DSM_AD: u32 = 1 << 2;
    /// Ranges one Dataset Management command carries at most.
    pub const DSM_MAX_RANGES: usize = 256;
}

/// The controller capabilities register, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cap {
    /// Maximum queue entries (1-based).
    pub mqes: u32,
    /// Doorbell stride: doorbells are 4 << dstrd bytes apart.
    pub dstrd: u32,
    /// Worst-case time for CSTS.RDY to change, in milliseconds.
    pub timeout_ms: u64,
    /// Smallest memory page size the controller supports, in bytes.
    pub mps_min_bytes: u64,
    pub nvm_command_set: bool,
}

impl Cap {
    pub fn parse(v: u64) -> Cap {
        Cap {
            mqes: (v & 0xffff) as u32 + 1,
            dstrd: ((v >> 32) & 0xf) as u32,
            timeout_ms: ((v >> 24) & 0xff).max(1) * 500,
            mps_min_bytes: 1 << (12 + ((v >> 48) & 0xf)),
            nvm_command_set: v & (1 << 37) != 0,
        }
    }
    /// Offset of the submission queue tail doorbell of queue `qid`.
    pub fn sq_doorbell(&self, qid: u16) -> usize {
        reg::DOORBELLS + (2 * qid as usize) * (4 << self.dstrd)
    }
    /// Offset of the completion queue head doorbell of queue `qid`.
    pub fn cq_doorbell(&self, qid: u16) -> usize {
        reg::DOORBELLS + (2 * qid as usize + 1) * (4 << self.dstrd)
    }
}

/// A submission queue entry as 16 little-endian dwords.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sqe(pub [u32; 16]);

impl Sqe {
    pub fn new(opcode: u8, nsid: u32) -> Sqe {
        let mut s = Sqe::default();
        s.0[0] = opcode as u32;
        s.0[1] = nsid;
        s
    }
    pub fn opcode(&self) -> u8 {
        self.0[0] as u8
    }
    pub fn set_cid(&mut self, cid: u16) {
        self.0[0] = (self.0[0] & 0xffff) | (cid as u32) << 16;
    }
    pub fn set_prp(&mut self, prp1: u64, prp2: u64) {
        self.0[6] = prp1 as u32;
        self.0[7] = (prp1 >> 32) as u32;
        self.0[8] = prp2 as u32;
        self.0[9] = (prp2 >> 32) as u32;
    }
    /// Describes the data with one SGL Data Block descriptor (PSDT = 01b:
    /// SGLs for data), for a transfer contiguous in IOVA space.
    pub fn set_sgl_data(&mut self, addr: u64, len: u32) {
        self.0[0] = (self.0[0] & !(3 << 14)) | 1 << 14;
        self.0[6] = addr as u32;
        self.0[7] = (addr >> 32) as u32;
        self.0[8] = len;
        // Bytes 12..15: reserved, then SGL identifier 0 (Data Block, Address).
        self.0[9] = 0;
    }
    /// Sets CDW10 + n.
    pub fn cdw(mut self, n: usize, v: u32) -> Sqe {
        self.0[10 + n] = v;
        self
    }
    /// A read or write of `nlb` blocks (1..=65536) from `slba`.
    pub fn rw(opcode: u8, nsid: u32, slba: u64, nlb: u32, flags: u32) -> Sqe {
        debug_assert!((1..=1 << 16).contains(&nlb));
        Sqe::new(opcode, nsid)
            .cdw(0, slba as u32)
            .cdw(1, (slba >> 32) as u32)
            .cdw(2, (nlb - 1) | flags)
    }
    pub fn to_bytes(self) -> [u8; SQE_BYTES] {
        let mut b = [0u8; SQE_BYTES];
        for (i, d) in self.0.iter().enumerate() {
            b[i * 4..i * 4 + 4].copy_from_slice(&d.to_le_bytes());
        }
        b
    }
}

/// A completion queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cqe {
    /// Command specific (DW0).
    pub result: u32,
    pub sq_head: u16,
    pub sqid: u16,
    pub cid: u16,
    pub phase: bool,
    /// Status code type and status code (SCT << 8 | SC), 0 on success.
    pub status: u16,
    /// Do not retry.
    pub dnr: bool,
}

impl Cqe {
    pub fn parse(dw: [u32; 4]) -> Cqe {
        let sf = (dw[3] >> 16) as u16;
        Cqe {
            result: dw[0],
            sq_head: dw[2] as u16,
            sqid: (dw[2] >> 16) as u16,
            cid: dw[3] as u16,
            phase: sf & 1 != 0,
            status: (sf >> 1) & 0x7ff,
            dnr: sf & 0x8000 != 0,
        }
    }
    pub fn ok(&self) -> bool {
        self.status == 0
    }
}

/// What the driver needs from Identify Controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerInfo {
    pub serial: String,
    pub model: String,
    /// Maximum data transfer size as a power of two of the minimum page size; 0 =
    /// no limit.
    pub mdts: u8,
    /// Number of namespaces (highest valid NSID).
    pub nn: u32,
    /// Optional NVM command support: bit 2 Dataset Management, bit 3 Write Zeroes.
    pub oncs: u16,
    /// Volatile write cache present.
    pub vwc: bool,
    /// SGL support for NVM commands.
    pub sgls: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentifyError {
    #[error("identify data is {0} bytes, expected 4096")]
    Length(usize),
    #[error("namespace is not active (NSZE = 0)")]
    Inactive,
    #[error("FLBAS selects LBA format {index} but the namespace has {count}")]
    Format { index: u8, count: u8 },
    #[error("LBA format has {0} bytes of metadata per block (unsupported)")]
    Metadata(u16),
    #[error("LBA data size 2^{0} is outside 512..=4096")]
    BlockSize(u8),
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn le64(b: &[u8], at: usize) -> u64 {
    (le32(b, at) as u64) | (le32(b, at + 4) as u64) << 32
}
fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b)
        .trim_end_matches([' ', '\0'])
        .to_string()
}

impl ControllerInfo {
    pub fn parse(b: &[u8]) -> Result<ControllerInfo, IdentifyError> {
        if b.len() != 4096 {
            return Err(IdentifyError::Length(b.len()));
        }
        Ok(ControllerInfo {
            serial: text(&b[4..24]),
            model: text(&b[24..64]),
            mdts: b[77],
            nn: le32(b, 516),
            oncs: le16(b, 520),
            vwc: b[525] & 1 != 0,
            sgls: le32(b, 536),
        })
    }
    pub fn supports_dsm(&self) -> bool {
        self.oncs & (1 << 2) != 0
    }
    pub fn supports_write_zeroes(&self) -> bool {
        self.oncs & (1 << 3) != 0
    }
    /// Largest transfer one command may carry, in bytes, given the minimum page
    /// size, never above `cap`.
    /// SGLs for NVM commands (SGLS bits 1:0 = 01b or 10b; our buffers meet the
    /// dword alignment 10b asks for).
    pub fn supports_sgl(&self) -> bool {
        matches!(self.sgls & 3, 1 | 2)
    }
    pub fn max_transfer_bytes(&self, mps_min_bytes: u64, cap: u64) -> u64 {
        if self.mdts == 0 || self.mdts >= 40 {
            cap
        } else {
            (mps_min_bytes << self.mdts).min(cap)
        }
    }
}

/// What the driver needs from Identify Namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamespaceInfo {
    /// Size in logical blocks.
    pub nsze: u64,
    /// log2 of the logical block size.
    pub lba_shift: u32,
    /// Deallocate logical block features: bits 2:0 = 001b means deallocated blocks
    /// read as zeros.
    pub dlfeat: u8,
}

impl NamespaceInfo {
    pub fn parse(b: &[u8]) -> Result<NamespaceInfo, IdentifyError> {
        if b.len() != 4096 {
            return Err(IdentifyError::Length(b.len()));
        }
        let nsze = le64(b, 0);
        if nsze == 0 {
            return Err(IdentifyError::Inactive);
        }
        let count = b[25].wrapping_add(1);
        // FLBAS bits 3:0 (and 6:5 for more than 16 formats).
        let index = (b[26] & 0xf) | ((b[26] >> 5) & 3) << 4;
        if index >= count || index >= 64 {
            return Err(IdentifyError::Format { index, count });
        }
        let f = 128 + 4 * index as usize;
        let ms = le16(b, f);
        if ms != 0 {
            return Err(IdentifyError::Metadata(ms));
        }
        let lbads = b[f + 2];
        if !(9..=12).contains(&lbads) {
            return Err(IdentifyError::BlockSize(lbads));
        }
        Ok(NamespaceInfo {
            nsze,
            lba_shift: lbads as u32,
            dlfeat: b[33],
        })
    }
    pub fn block_bytes(&self) -> u64 {
        1 << self.lba_shift
    }
    pub fn size_bytes(&self) -> u64 {
        self.nsze.saturating_mul(self.block_bytes())
    }
    pub fn deallocated_reads_zero(&self) -> bool {
        self.dlfeat & 7 == 1
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PrpError {
    #[error("data pointer {0:#x} is not dword aligned")]
    Unaligned(u64),
    #[error("transfer of {0} bytes needs more than one PRP list page")]
    TooLong(usize),
    #[error("empty transfer")]
    Empty,
}

/// Builds PRP1/PRP2 for `len` bytes contiguous in IOVA space from `iova`. When more
/// than two pages are touched, the entries after the first go into `list` (one PRP
/// list page whose own IOVA is `list_iova`) and PRP2 points at it.
pub fn build_prps(
    iova: u64,
    len: usize,
    list: &mut [u64; PRP_PER_PAGE],
    list_iova: u64,
) -> Result<(u64, u64), PrpError> {
    if len == 0 {
        return Err(PrpError::Empty);
    }
    if iova % 4 != 0 {
        return Err(PrpError::Unaligned(iova));
    }
    let page = PAGE_BYTES as u64;
    let first_page = iova & !(page - 1);
    let end = iova + len as u64;
    let pages = (end - first_page).div_ceil(page) as usize;
    match pages {
        1 => Ok((iova, 0)),
        2 => Ok((iova, first_page + page)),
        n if n - 1 <= PRP_PER_PAGE => {
            for (i, e) in list.iter_mut().take(n - 1).enumerate() {
                *e = first_page + page * (i as u64 + 1);
            }
            Ok((iova, list_iova))
        }
        _ => Err(PrpError::TooLong(len)),
    }
}

/// A ring's position with its phase tag: the completion queue head (whose entries
/// are new while their phase bit equals `phase`) or a submission queue tail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ring {
    pub size: u16,
    pub pos: u16,
    pub phase: bool,
}

impl Ring {
    pub fn new(size: u16) -> Ring {
        assert!(size >= 2, "NVMe queues have at least two entries");
        Ring {
            size,
            pos: 0,
            phase: true,
        }
    }
    /// Moves one entry on; the phase flips each time the ring wraps.
    pub fn advance(&mut self) {
        self.pos += 1;
        if self.pos == self.size {
            self.pos = 0;
            self.phase = !self.phase;
        }
    }
}

/// One Dataset Management range (16 bytes): context attributes, length in blocks,
/// starting LBA.
pub fn dsm_range(slba: u64, nlb: u32) -> [u8; 16] {
    let mut r = [0u8; 16];
    r[4..8].copy_from_slice(&nlb.to_le_bytes());
    r[8..16].copy_from_slice(&slba.to_le_bytes());
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn cap_and_doorbells() {
        // QEMU's nvme: MQES 2047, TO 15 (7.5 s), DSTRD 0, CSS NVM, MPSMIN 0.
        let cap = Cap::parse(0x0000_0020_0f01_07ff);
        assert_eq!(cap.mqes, 2048);
        assert_eq!(cap.timeout_ms, 7500);
        assert_eq!(cap.mps_min_bytes, 4096);
        assert!(cap.nvm_command_set);
        assert_eq!(cap.sq_doorbell(0), 0x1000);
        assert_eq!(cap.cq_doorbell(0), 0x1004);
        assert_eq!(cap.sq_doorbell(3), 0x1018);
        let wide = Cap::parse(2u64 << 32);
        assert_eq!(wide.cq_doorbell(1), 0x1000 + 3 * 16);
    }

    #[test]
    fn sqe_layout() {
        let mut s = Sqe::rw(io::WRITE, 7, 0x1_0000_0002, 8, io::FUA);
        s.set_cid(0xbeef);
        s.set_prp(0x1234_5000, 0x9_0000_1000);
        let b = s.to_bytes();
        assert_eq!(&b[0..4], &[0x01, 0, 0xef, 0xbe]);
        assert_eq!(&b[4..8], &7u32.to_le_bytes());
        assert_eq!(&b[24..32], &0x1234_5000u64.to_le_bytes());
        assert_eq!(&b[32..40], &0x9_0000_1000u64.to_le_bytes());
        assert_eq!(&b[40..48], &0x1_0000_0002u64.to_le_bytes());
        assert_eq!(&b[48..52], &(7 | 1u32 << 30).to_le_bytes());
    }

    #[test]
    fn sgl_data_block() {
        let mut s = Sqe::rw(io::READ, 1, 0, 256, 0);
        s.set_cid(7);
        s.set_sgl_data(0x1_0000_0200, 128 << 10);
        let b = s.to_bytes();
        assert_eq!(b[1] >> 6, 0b01, "PSDT = SGL for data");
        assert_eq!(b[0], io::READ);
        assert_eq!(&b[2..4], &7u16.to_le_bytes());
        assert_eq!(&b[24..32], &0x1_0000_0200u64.to_le_bytes());
        assert_eq!(&b[32..36], &(128u32 << 10).to_le_bytes());
        assert_eq!(&b[36..40], &[0, 0, 0, 0], "Data Block descriptor");
        let mut c = ControllerInfo::parse(&[0u8; 4096]).unwrap();
        assert!(!c.supports_sgl());
        c.sgls = 0x0010_0001;
        assert!(c.supports_sgl());
        c.sgls = 3;
        assert!(!c.supports_sgl());
    }

    #[test]
    fn cqe_fields() {
        let c = Cqe::parse([5, 0, 0x0003_0011, 0x8005_0042]);
        assert_eq!(c.result, 5);
        assert_eq!(c.sq_head, 0x11);
        assert_eq!(c.sqid, 3);
        assert_eq!(c.cid, 0x42);
        assert!(c.phase);
        assert_eq!(c.status, 2);
        assert!(c.dnr);
        assert!(Cqe::parse([0, 0, 0, 0x0001_0000]).ok());
    }

    #[test]
    fn prps_for_one_two_and_many_pages() {
        let mut l = [0u64; PRP_PER_PAGE];
        assert_eq!(
            build_prps(0x10_0000, 4096, &mut l, 0x99000),
            Ok((0x10_0000, 0))
        );
        // 512 bytes at the end of a page stay in one page; one more byte does not.
        assert_eq!(
            build_prps(0x10_0e00, 512, &mut l, 0x99000),
            Ok((0x10_0e00, 0))
        );
        assert_eq!(
            build_prps(0x10_0e00, 513, &mut l, 0x99000),
            Ok((0x10_0e00, 0x10_1000))
        );
        assert_eq!(
            build_prps(0x10_0200, 3 * 4096, &mut l, 0x99000),
            Ok((0x10_0200, 0x99000))
        );
        assert_eq!(&l[..3], &[0x10_1000, 0x10_2000, 0x10_3000]);
        assert_eq!(
            build_prps(0x10_0000, (PRP_PER_PAGE + 1) * 4096, &mut l, 0),
            Ok((0x10_0000, 0))
        );
        assert_eq!(
            build_prps(0x10_0200, (PRP_PER_PAGE + 1) * 4096, &mut l, 0),
            Err(PrpError::TooLong((PRP_PER_PAGE + 1) * 4096))
        );
        assert_eq!(
            build_prps(0x10_0002, 8, &mut l, 0),
            Err(PrpError::Unaligned(0x10_0002))
        );
        assert_eq!(build_prps(0x10_0000, 0, &mut l, 0), Err(PrpError::Empty));
    }

    #[test]
    fn ring_phase_flips_on_wrap() {
        let mut r = Ring::new(3);
        assert!(r.phase);
        r.advance();
        r.advance();
        assert_eq!((r.pos, r.phase), (2, true));
        r.advance();
        assert_eq!((r.pos, r.phase), (0, false));
        for _ in 0..3 {
            r.advance();
        }
        assert_eq!((r.pos, r.phase), (0, true));
    }

    fn identify_ns(nsze: u64, nlbaf: u8, flbas: u8, lbaf: &[(u16, u8)]) -> Vec<u8> {
        let mut b = vec![0u8; 4096];
        b[0..8].copy_from_slice(&nsze.to_le_bytes());
        b[25] = nlbaf;
        b[26] = flbas;
        b[33] = 1;
        for (i, &(ms, ds)) in lbaf.iter().enumerate() {
            b[128 + 4 * i..130 + 4 * i].copy_from_slice(&ms.to_le_bytes());
            b[130 + 4 * i] = ds;
        }
        b
    }

    #[test]
    fn identify_namespace_parses_and_rejects() {
        let b = identify_ns(1 << 21, 1, 1, &[(0, 9), (0, 12)]);
        let ns = NamespaceInfo::parse(&b).unwrap();
        assert_eq!(ns.block_bytes(), 4096);
        assert_eq!(ns.size_bytes(), 8 << 30);
        assert!(ns.deallocated_reads_zero());
        assert_eq!(
            NamespaceInfo::parse(&identify_ns(0, 0, 0, &[(0, 9)])),
            Err(IdentifyError::Inactive)
        );
        assert_eq!(
            NamespaceInfo::parse(&identify_ns(8, 0, 2, &[(0, 9)])),
            Err(IdentifyError::Format { index: 2, count: 1 })
        );
        assert_eq!(
            NamespaceInfo::parse(&identify_ns(8, 0, 0, &[(8, 9)])),
            Err(IdentifyError::Metadata(8))
        );
        assert_eq!(
            NamespaceInfo::parse(&identify_ns(8, 0, 0, &[(0, 16)])),
            Err(IdentifyError::BlockSize(16))
        );
        assert_eq!(
            NamespaceInfo::parse(&[0u8; 10]),
            Err(IdentifyError::Length(10))
        );
    }

    #[test]
    fn identify_controller_fields() {
        let mut b = vec![0u8; 4096];
        b[4..12].copy_from_slice(b"deadbeef");
        b[24..28].copy_from_slice(b"QEMU");
        b[77] = 7;
        b[516] = 256u32.to_le_bytes()[0];
        b[517] = 1;
        b[520] = 0x0c;
        b[525] = 1;
        let c = ControllerInfo::parse(&b).unwrap();
        assert_eq!(c.serial, "deadbeef");
        assert_eq!(c.model, "QEMU");
        assert_eq!(c.nn, 256);
        assert!(c.supports_dsm() && c.supports_write_zeroes() && c.vwc);
        assert_eq!(c.max_transfer_bytes(4096, 1 << 20), 512 << 10);
        assert_eq!(
            ControllerInfo { mdts: 0, ..c }.max_transfer_bytes(4096, 1 << 20),
            1 << 20
        );
    }

    proptest! {
        /// Controller-returned Identify data never panics the parsers, and what
        /// they accept is self-consistent.
        #[test]
        fn identify_parsers_take_any_bytes(b in proptest::collection::vec(any::<u8>(), 4096)) {
            let _ = ControllerInfo::parse(&b);
            if let Ok(ns) = NamespaceInfo::parse(&b) {
                prop_assert!((512..=4096).contains(&ns.block_bytes()));
                prop_assert!(ns.nsze > 0);
            }
        }

        /// PRP entries cover exactly the pages of the transfer, in order.
        #[test]
        fn prps_cover_the_transfer(start_dw in 0u64..(1 << 20), len in 1usize..(2 << 20)) {
            let iova = (1u64 << 32) + start_dw * 4;
            let mut l = [0u64; PRP_PER_PAGE];
            let page = PAGE_BYTES as u64;
            let pages = ((iova + len as u64).div_ceil(page) - iova / page) as usize;
            match build_prps(iova, len, &mut l, 0xabc000) {
                Ok((p1, p2)) => {
                    prop_assert_eq!(p1, iova);
                    let rest: Vec<u64> = match pages {
                        1 => { prop_assert_eq!(p2, 0); vec![] }
                        2 => vec![p2],
                        n => { prop_assert_eq!(p2, 0xabc000); l[..n - 1].to_vec() }
                    };
                    for (i, e) in rest.iter().enumerate() {
                        prop_assert_eq!(*e, (iova / page + 1 + i as u64) * page);
                    }
                }
                Err(PrpError::TooLong(_)) => prop_assert!(pages - 1 > PRP_PER_PAGE),
                Err(e) => prop_assert!(false, "{e}"),
            }
        }

        #[test]
        fn cqe_parse_roundtrips_fields(dw in any::<[u32; 4]>()) {
            let c = Cqe::parse(dw);
            prop_assert_eq!(c.cid, dw[3] as u16);
            prop_assert_eq!(c.phase, dw[3] & (1 << 16) != 0);
            prop_assert_eq!(c.ok(), (dw[3] >> 17) & 0x7ff == 0);
        }
    }
}
