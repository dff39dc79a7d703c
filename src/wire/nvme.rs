//! NVMe command and data-structure layouts (NVMe Base 2.0, NVM Command Set 1.0,
//! NVMe over Fabrics). Offsets follow the specification tables; the Linux host's
//! `include/linux/nvme.h` and SPDK's `nvme_spec.h` static-assert the same ones.

use super::le::*;

/// Size of a submission queue entry.
pub const SQE_LEN: usize = 64;
/// Size of a completion queue entry.
pub const CQE_LEN: usize = 16;
/// Identify data structures are always 4 KiB.
pub const IDENTIFY_LEN: usize = 4096;
/// The well-known discovery subsystem NQN.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
/// NQN fields in Connect data and the discovery log are 256 bytes.
pub const NQN_FIELD_LEN: usize = 256;
/// The longest NQN the specification allows (excluding the NUL).
pub const NQN_MAX_LEN: usize = 223;

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

/// Controller property (register) offsets reachable through Property Get/Set.
pub mod prop {
    pub const CAP: u32 = 0x00;
    pub const VS: u32 = 0x08;
    pub const CC: u32 = 0x14;
    pub const CSTS: u32 = 0x1C;
    pub const NSSR: u32 = 0x20;
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
}

/// Log page identifiers.
pub mod lid {
    pub const ERROR_INFO: u8 = 0x01;
    pub const SMART_HEALTH: u8 = 0x02;
    pub const FIRMWARE_SLOT: u8 = 0x03;
    pub const CHANGED_NS_LIST: u8 = 0x04;
    pub const COMMANDS_SUPPORTED: u8 = 0x05;
    pub const DISCOVERY: u8 = 0x70;
}

/// Identify CNS values.
pub mod cns {
    pub const NAMESPACE: u8 = 0x00;
    pub const CONTROLLER: u8 = 0x01;
    pub const ACTIVE_NS_LIST: u8 = 0x02;
    pub const NS_DESCRIPTOR_LIST: u8 = 0x03;
    pub const CSI_NAMESPACE: u8 = 0x05;
    pub const CSI_CONTROLLER: u8 = 0x06;
    pub const CSI_ACTIVE_NS_LIST: u8 = 0x07;
}

/// A completion status: status code type and status code, plus the DNR bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Status {
    pub sct: u8,
    pub sc: u8,
    pub dnr: bool,
}

impl Status {
    pub const SUCCESS: Status = Status::generic(0x00);
    pub const INVALID_OPCODE: Status = Status::generic(0x01).no_retry();
    pub const INVALID_FIELD: Status = Status::generic(0x02).no_retry();
    pub const CID_CONFLICT: Status = Status::generic(0x03).no_retry();
    pub const DATA_TRANSFER_ERROR: Status = Status::generic(0x04);
    pub const INTERNAL_ERROR: Status = Status::generic(0x06);
    pub const ABORT_REQUESTED: Status = Status::generic(0x07);
    pub const ABORTED_SQ_DELETION: Status = Status::generic(0x08);
    pub const INVALID_NAMESPACE: Status = Status::generic(0x0B).no_retry();
    pub const COMMAND_SEQUENCE_ERROR: Status = Status::generic(0x0C).no_retry();
    pub const INVALID_SGL_DESCRIPTOR: Status = Status::generic(0x0D).no_retry();
    pub const DATA_SGL_LENGTH_INVALID: Status = Status::generic(0x0F).no_retry();
    pub const SGL_DESCRIPTOR_TYPE_INVALID: Status = Status::generic(0x11).no_retry();
    pub const SGL_OFFSET_INVALID: Status = Status::generic(0x16).no_retry();
    pub const KEEP_ALIVE_INVALID: Status = Status::generic(0x1A).no_retry();
    pub const LBA_OUT_OF_RANGE: Status = Status::generic(0x80).no_retry();
    pub const CAPACITY_EXCEEDED: Status = Status::generic(0x81).no_retry();
    pub const NAMESPACE_NOT_READY: Status = Status::generic(0x82);

    // Command specific (SCT 1).
    pub const INVALID_QUEUE_ID: Status = Status::specific(0x01).no_retry();
    pub const ASYNC_EVENT_LIMIT: Status = Status::specific(0x05).no_retry();
    pub const INVALID_LOG_PAGE: Status = Status::specific(0x09).no_retry();
    pub const FEATURE_NOT_SAVEABLE: Status = Status::specific(0x0D).no_retry();
    pub const FEATURE_NOT_CHANGEABLE: Status = Status::specific(0x0E).no_retry();
    pub const CONNECT_INCOMPATIBLE_FORMAT: Status = Status::specific(0x80).no_retry();
    pub const CONNECT_CONTROLLER_BUSY: Status = Status::specific(0x81);
    pub const CONNECT_INVALID_PARAMETERS: Status = Status::specific(0x82).no_retry();
    pub const CONNECT_INVALID_HOST: Status = Status::specific(0x84).no_retry();

    // Media and data integrity errors (SCT 2).
    pub const WRITE_FAULT: Status = Status::media(0x80);
    pub const UNRECOVERED_READ_ERROR: Status = Status::media(0x81);
    pub const DEALLOCATED_OR_UNWRITTEN: Status = Status::media(0x87).no_retry();

    pub const fn generic(sc: u8) -> Status {
        Status {
            sct: 0,
            sc,
            dnr: false,
        }
    }
    pub const fn specific(sc: u8) -> Status {
        Status {
            sct: 1,
            sc,
            dnr: false,
        }
    }
    pub const fn media(sc: u8) -> Status {
        Status {
            sct: 2,
            sc,
            dnr: false,
        }
    }
    pub const fn no_retry(self) -> Status {
        Status { dnr: true, ..self }
    }
    pub fn is_success(self) -> bool {
        self.sct == 0 && self.sc == 0
    }
    /// The 15-bit status field as it sits in CQE bits 31:17 (phase bit excluded).
    pub fn to_field(self) -> u16 {
        ((self.sc as u16) << 1) | (((self.sct & 0x7) as u16) << 9) | ((self.dnr as u16) << 15)
    }
    pub fn from_field(f: u16) -> Status {
        Status {
            sc: ((f >> 1) & 0xFF) as u8,
            sct: ((f >> 9) & 0x7) as u8,
            dnr: f & 0x8000 != 0,
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match (self.sct, self.sc) {
            (0, 0x00) => "success",
            (0, 0x01) => "invalid command opcode",
            (0, 0x02) => "invalid field in command",
            (0, 0x03) => "command id conflict",
            (0, 0x04) => "data transfer error",
            (0, 0x06) => "internal error",
            (0, 0x07) => "command abort requested",
            (0, 0x08) => "aborted: SQ deletion",
            (0, 0x0B) => "invalid namespace or format",
            (0, 0x0C) => "command sequence error",
            (0, 0x0D) => "invalid SGL segment descriptor",
            (0, 0x0F) => "data SGL length invalid",
            (0, 0x11) => "SGL descriptor type invalid",
            (0, 0x16) => "SGL offset invalid",
            (0, 0x1A) => "keep alive timeout invalid",
            (0, 0x80) => "LBA out of range",
            (0, 0x81) => "capacity exceeded",
            (0, 0x82) => "namespace not ready",
            (1, 0x01) => "invalid queue identifier",
            (1, 0x05) => "async event request limit exceeded",
            (1, 0x09) => "invalid log page",
            (1, 0x0D) => "feature not saveable",
            (1, 0x0E) => "feature not changeable",
            (1, 0x80) => "connect: incompatible format",
            (1, 0x81) => "connect: controller busy",
            (1, 0x82) => "connect: invalid parameters",
            (1, 0x84) => "connect: invalid host",
            (2, 0x80) => "write fault",
            (2, 0x81) => "unrecovered read error",
            (2, 0x87) => "deallocated or unwritten logical block",
            _ => "status",
        };
        write!(f, "{name} (sct {:#x} sc {:#04x}", self.sct, self.sc)?;
        if self.dnr {
            write!(f, ", dnr")?;
        }
        write!(f, ")")
    }
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

impl Sqe {
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
    pub fn opcode(&self) -> u8 {
        self.0[0]
    }
    pub fn flags(&self) -> u8 {
        self.0[1]
    }
    /// Fused operation bits (FUSE); non-zero values are unsupported here.
    pub fn fuse(&self) -> u8 {
        self.0[1] & 0x3
    }
    pub fn cid(&self) -> u16 {
        u16_at(&self.0, 2)
    }
    pub fn set_cid(&mut self, cid: u16) {
        put_u16(&mut self.0, 2, cid);
    }
    pub fn nsid(&self) -> u32 {
        u32_at(&self.0, 4)
    }
    /// Fabrics command type (meaningful when opcode is 0x7F).
    pub fn fctype(&self) -> u8 {
        self.0[4]
    }
    /// Command dword N (0..=15).
    pub fn cdw(&self, n: usize) -> u32 {
        u32_at(&self.0, n * 4)
    }
    pub fn set_cdw(&mut self, n: usize, v: u32) {
        put_u32(&mut self.0, n * 4, v);
    }
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
    pub fn set_sgl(&mut self, sgl: SglDescriptor) {
        put_u64(&mut self.0, 24, sgl.address);
        put_u32(&mut self.0, 32, sgl.length);
        self.0[36..39].fill(0);
        self.0[39] = sgl.type_byte;
    }
    /// Starting LBA of a read/write/write-zeroes command (CDW10-11).
    pub fn slba(&self) -> u64 {
        u64_at(&self.0, 40)
    }
    /// Number of logical blocks, 1-based (CDW12 bits 15:0 are 0-based).
    pub fn nlb(&self) -> u32 {
        (self.cdw(12) & 0xFFFF) + 1
    }
    /// Force Unit Access (CDW12 bit 30).
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

/// Fabrics Connect command fields (SQE) and data (1024 bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectCommand {
    pub recfmt: u16,
    pub qid: u16,
    /// 0-based submission queue size.
    pub sqsize: u16,
    pub cattr: u8,
    /// Keep-alive timeout in milliseconds (admin queue only; 0 disables).
    pub kato: u32,
}

/// Connect command attribute: the host disables SQ flow control.
pub const CATTR_DISABLE_SQ_FLOW: u8 = 1 << 2;

impl ConnectCommand {
    pub fn parse(sqe: &Sqe) -> ConnectCommand {
        ConnectCommand {
            recfmt: u16_at(&sqe.0, 40),
            qid: u16_at(&sqe.0, 42),
            sqsize: u16_at(&sqe.0, 44),
            cattr: sqe.0[46],
            kato: u32_at(&sqe.0, 48),
        }
    }
    pub fn encode(&self, cid: u16) -> Sqe {
        let mut s = Sqe::new(admin_opc::FABRICS, cid, 0);
        s.0[4] = fctype::CONNECT;
        put_u16(&mut s.0, 40, self.recfmt);
        put_u16(&mut s.0, 42, self.qid);
        put_u16(&mut s.0, 44, self.sqsize);
        s.0[46] = self.cattr;
        put_u32(&mut s.0, 48, self.kato);
        s
    }
}

pub const CONNECT_DATA_LEN: usize = 1024;
/// Byte offsets inside the Connect data, used to point the host at a bad field.
pub const CONNECT_DATA_CNTLID_OFF: u16 = 16;
pub const CONNECT_DATA_SUBNQN_OFF: u16 = 256;
pub const CONNECT_DATA_HOSTNQN_OFF: u16 = 512;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectData {
    pub hostid: [u8; 16],
    pub cntlid: u16,
    pub subnqn: String,
    pub hostnqn: String,
}

impl ConnectData {
    pub fn parse(b: &[u8]) -> Option<ConnectData> {
        if b.len() < CONNECT_DATA_LEN {
            return None;
        }
        let mut hostid = [0u8; 16];
        hostid.copy_from_slice(&b[0..16]);
        Some(ConnectData {
            hostid,
            cntlid: u16_at(b, 16),
            subnqn: str_at(b, 256, NQN_FIELD_LEN),
            hostnqn: str_at(b, 512, NQN_FIELD_LEN),
        })
    }
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; CONNECT_DATA_LEN];
        b[0..16].copy_from_slice(&self.hostid);
        put_u16(&mut b, 16, self.cntlid);
        put_str_nul(&mut b, 256, NQN_FIELD_LEN, &self.subnqn);
        put_str_nul(&mut b, 512, NQN_FIELD_LEN, &self.hostnqn);
        b
    }
}

/// Property Get/Set fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PropertyCommand {
    /// Size attribute: false = 4 bytes, true = 8 bytes.
    pub eight_bytes: bool,
    pub offset: u32,
    pub value: u64,
}

impl PropertyCommand {
    pub fn parse(sqe: &Sqe) -> PropertyCommand {
        PropertyCommand {
            eight_bytes: sqe.0[40] & 0x7 == 1,
            offset: u32_at(&sqe.0, 44),
            value: u64_at(&sqe.0, 48),
        }
    }
    pub fn encode(&self, fctype: u8, cid: u16) -> Sqe {
        let mut s = Sqe::new(admin_opc::FABRICS, cid, 0);
        s.0[4] = fctype;
        s.0[40] = self.eight_bytes as u8;
        put_u32(&mut s.0, 44, self.offset);
        put_u64(&mut s.0, 48, self.value);
        s
    }
}

/// Get Log Page fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GetLogPage {
    pub lid: u8,
    pub lsp: u8,
    /// Retain Asynchronous Event.
    pub rae: bool,
    /// Transfer length in bytes.
    pub len: usize,
    /// Byte offset into the log page.
    pub offset: u64,
}

impl GetLogPage {
    pub fn parse(sqe: &Sqe) -> GetLogPage {
        let cdw10 = sqe.cdw(10);
        let cdw11 = sqe.cdw(11);
        let numd = ((cdw11 & 0xFFFF) << 16 | (cdw10 >> 16)) as usize + 1;
        GetLogPage {
            lid: (cdw10 & 0xFF) as u8,
            lsp: ((cdw10 >> 8) & 0x7F) as u8,
            rae: cdw10 & (1 << 15) != 0,
            len: numd * 4,
            offset: (sqe.cdw(13) as u64) << 32 | sqe.cdw(12) as u64,
        }
    }
    pub fn encode(&self, cid: u16, nsid: u32) -> Sqe {
        let mut s = Sqe::new(admin_opc::GET_LOG_PAGE, cid, nsid);
        let numd = (self.len / 4).saturating_sub(1) as u32;
        s.set_cdw(
            10,
            self.lid as u32
                | (self.lsp as u32) << 8
                | (self.rae as u32) << 15
                | (numd & 0xFFFF) << 16,
        );
        s.set_cdw(11, numd >> 16);
        s.set_cdw(12, self.offset as u32);
        s.set_cdw(13, (self.offset >> 32) as u32);
        s
    }
}

/// Values reported in Identify Controller. Only the fields a fabrics target sets;
/// everything else is zero.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IdentifyController {
    pub vid: u16,
    pub ssvid: u16,
    pub serial: String,
    pub model: String,
    pub firmware: String,
    pub ieee_oui: [u8; 3],
    pub cmic: u8,
    pub mdts: u8,
    pub cntlid: u16,
    pub version: u32,
    pub oaes: u32,
    pub ctratt: u32,
    pub cntrltype: u8,
    pub oacs: u16,
    pub acl: u8,
    pub aerl: u8,
    pub frmw: u8,
    pub lpa: u8,
    pub elpe: u8,
    pub kas: u16,
    pub sqes: u8,
    pub cqes: u8,
    pub maxcmd: u16,
    pub nn: u32,
    pub oncs: u16,
    pub fuses: u16,
    pub vwc: u8,
    pub awun: u16,
    pub awupf: u16,
    pub sgls: u32,
    pub mnan: u32,
    pub subnqn: String,
    pub ioccsz: u32,
    pub iorcsz: u32,
    pub icdoff: u16,
    pub fcatt: u8,
    pub msdbd: u8,
    pub ofcs: u16,
}

impl IdentifyController {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; IDENTIFY_LEN];
        put_u16(&mut b, 0, self.vid);
        put_u16(&mut b, 2, self.ssvid);
        put_ascii_padded(&mut b, 4, 20, &self.serial);
        put_ascii_padded(&mut b, 24, 40, &self.model);
        put_ascii_padded(&mut b, 64, 8, &self.firmware);
        b[73..76].copy_from_slice(&self.ieee_oui);
        b[76] = self.cmic;
        b[77] = self.mdts;
        put_u16(&mut b, 78, self.cntlid);
        put_u32(&mut b, 80, self.version);
        put_u32(&mut b, 92, self.oaes);
        put_u32(&mut b, 96, self.ctratt);
        b[111] = self.cntrltype;
        put_u16(&mut b, 256, self.oacs);
        b[258] = self.acl;
        b[259] = self.aerl;
        b[260] = self.frmw;
        b[261] = self.lpa;
        b[262] = self.elpe;
        put_u16(&mut b, 320, self.kas);
        b[512] = self.sqes;
        b[513] = self.cqes;
        put_u16(&mut b, 514, self.maxcmd);
        put_u32(&mut b, 516, self.nn);
        put_u16(&mut b, 520, self.oncs);
        put_u16(&mut b, 522, self.fuses);
        b[525] = self.vwc;
        put_u16(&mut b, 526, self.awun);
        put_u16(&mut b, 528, self.awupf);
        put_u32(&mut b, 536, self.sgls);
        put_u32(&mut b, 540, self.mnan);
        put_str_nul(&mut b, 768, NQN_FIELD_LEN, &self.subnqn);
        put_u32(&mut b, 1792, self.ioccsz);
        put_u32(&mut b, 1796, self.iorcsz);
        put_u16(&mut b, 1800, self.icdoff);
        b[1802] = self.fcatt;
        b[1803] = self.msdbd;
        put_u16(&mut b, 1804, self.ofcs);
        // Power state 0: 0 W max is "not reported", entry/exit latencies unknown.
        b
    }
    pub fn decode(b: &[u8]) -> IdentifyController {
        let mut oui = [0u8; 3];
        if let Some(s) = b.get(73..76) {
            oui.copy_from_slice(s);
        }
        let byte = |o: usize| b.get(o).copied().unwrap_or(0);
        IdentifyController {
            vid: u16_at(b, 0),
            ssvid: u16_at(b, 2),
            serial: str_at(b, 4, 20),
            model: str_at(b, 24, 40),
            firmware: str_at(b, 64, 8),
            ieee_oui: oui,
            cmic: byte(76),
            mdts: byte(77),
            cntlid: u16_at(b, 78),
            version: u32_at(b, 80),
            oaes: u32_at(b, 92),
            ctratt: u32_at(b, 96),
            cntrltype: byte(111),
            oacs: u16_at(b, 256),
            acl: byte(258),
            aerl: byte(259),
            frmw: byte(260),
            lpa: byte(261),
            elpe: byte(262),
            kas: u16_at(b, 320),
            sqes: byte(512),
            cqes: byte(513),
            maxcmd: u16_at(b, 514),
            nn: u32_at(b, 516),
            oncs: u16_at(b, 520),
            fuses: u16_at(b, 522),
            vwc: byte(525),
            awun: u16_at(b, 526),
            awupf: u16_at(b, 528),
            sgls: u32_at(b, 536),
            mnan: u32_at(b, 540),
            subnqn: str_at(b, 768, NQN_FIELD_LEN),
            ioccsz: u32_at(b, 1792),
            iorcsz: u32_at(b, 1796),
            icdoff: u16_at(b, 1800),
            fcatt: byte(1802),
            msdbd: byte(1803),
            ofcs: u16_at(b, 1804),
        }
    }
}

/// Values reported in Identify Namespace (NVM command set).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IdentifyNamespace {
    pub nsze: u64,
    pub ncap: u64,
    pub nuse: u64,
    pub nsfeat: u8,
    /// log2 of the logical block size of LBA format 0 (the only one).
    pub lbads: u8,
    pub nmic: u8,
    pub dlfeat: u8,
    /// Preferred write granularity/alignment and deallocate granularity, 0-based.
    pub npwg: u16,
    pub npwa: u16,
    pub npdg: u16,
    pub npda: u16,
    pub nows: u16,
    pub noiob: u16,
    pub nvmcap: u128,
    pub anagrpid: u32,
    pub nguid: [u8; 16],
    pub eui64: [u8; 8],
}

/// NSFEAT bit: the NPWG/NPWA/NPDG/NPDA/NOWS fields are valid.
pub const NSFEAT_OPTPERF: u8 = 1 << 4;
/// NSFEAT bit: the controller supports deallocated-or-unwritten error (DULBE).
pub const NSFEAT_DULBE: u8 = 1 << 2;
/// NSFEAT bit: thin provisioning (NCAP may be less than NSZE).
pub const NSFEAT_THIN: u8 = 1 << 0;

impl IdentifyNamespace {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; IDENTIFY_LEN];
        put_u64(&mut b, 0, self.nsze);
        put_u64(&mut b, 8, self.ncap);
        put_u64(&mut b, 16, self.nuse);
        b[24] = self.nsfeat;
        b[25] = 0; // one LBA format
        b[26] = 0; // flbas: format 0, no metadata
        b[30] = self.nmic;
        b[33] = self.dlfeat;
        put_u16(&mut b, 46, self.noiob);
        b[48..64].copy_from_slice(&self.nvmcap.to_le_bytes());
        put_u16(&mut b, 64, self.npwg);
        put_u16(&mut b, 66, self.npwa);
        put_u16(&mut b, 68, self.npdg);
        put_u16(&mut b, 70, self.npda);
        put_u16(&mut b, 72, self.nows);
        put_u32(&mut b, 92, self.anagrpid);
        b[104..120].copy_from_slice(&self.nguid);
        b[120..128].copy_from_slice(&self.eui64);
        // LBA format 0: no metadata, lbads, relative performance 0 (best).
        put_u32(&mut b, 128, (self.lbads as u32) << 16);
        b
    }
    pub fn decode(b: &[u8]) -> IdentifyNamespace {
        let byte = |o: usize| b.get(o).copied().unwrap_or(0);
        let mut nguid = [0u8; 16];
        if let Some(s) = b.get(104..120) {
            nguid.copy_from_slice(s);
        }
        let mut eui64 = [0u8; 8];
        if let Some(s) = b.get(120..128) {
            eui64.copy_from_slice(s);
        }
        let flbas = (byte(26) & 0xF) as usize;
        IdentifyNamespace {
            nsze: u64_at(b, 0),
            ncap: u64_at(b, 8),
            nuse: u64_at(b, 16),
            nsfeat: byte(24),
            lbads: ((u32_at(b, 128 + 4 * flbas) >> 16) & 0xFF) as u8,
            nmic: byte(30),
            dlfeat: byte(33),
            npwg: u16_at(b, 64),
            npwa: u16_at(b, 66),
            npdg: u16_at(b, 68),
            npda: u16_at(b, 70),
            nows: u16_at(b, 72),
            noiob: u16_at(b, 46),
            nvmcap: (u64_at(b, 48) as u128) | (u64_at(b, 56) as u128) << 64,
            anagrpid: u32_at(b, 92),
            nguid,
            eui64,
        }
    }
}

/// Namespace identification descriptor types (Identify CNS 03h).
pub mod nidt {
    pub const EUI64: u8 = 1;
    pub const NGUID: u8 = 2;
    pub const UUID: u8 = 3;
    pub const CSI: u8 = 4;
}

/// Encodes a namespace identification descriptor list.
pub fn encode_ns_descriptors(eui64: &[u8; 8], nguid: &[u8; 16], uuid: &[u8; 16]) -> Vec<u8> {
    let mut b = vec![0u8; IDENTIFY_LEN];
    let mut off = 0;
    let mut push = |t: u8, id: &[u8]| {
        b[off] = t;
        b[off + 1] = id.len() as u8;
        b[off + 4..off + 4 + id.len()].copy_from_slice(id);
        off += 4 + id.len();
    };
    push(nidt::EUI64, eui64);
    push(nidt::NGUID, nguid);
    push(nidt::UUID, uuid);
    push(nidt::CSI, &[0]); // NVM command set
    b
}

/// Decodes a namespace identification descriptor list into (type, id) pairs.
pub fn decode_ns_descriptors(b: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    let mut off = 0;
    while off + 4 <= b.len() {
        let t = b[off];
        let l = b[off + 1] as usize;
        if t == 0 || l == 0 || off + 4 + l > b.len() {
            break;
        }
        out.push((t, b[off + 4..off + 4 + l].to_vec()));
        off += 4 + l;
    }
    out
}

/// Encodes an active namespace ID list: up to 1024 NSIDs greater than `after`.
pub fn encode_ns_list(nsids: impl Iterator<Item = u32>, after: u32) -> Vec<u8> {
    let mut b = vec![0u8; IDENTIFY_LEN];
    for (i, nsid) in nsids.filter(|&n| n > after).take(1024).enumerate() {
        put_u32(&mut b, i * 4, nsid);
    }
    b
}

pub fn decode_ns_list(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .take_while(|&n| n != 0)
        .collect()
}

/// SMART / Health Information log (512 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SmartLog {
    pub critical_warning: u8,
    /// Composite temperature in Kelvin.
    pub temperature: u16,
    pub available_spare: u8,
    pub spare_threshold: u8,
    pub percent_used: u8,
    /// In thousands of 512-byte units, as the specification counts them.
    pub data_units_read: u128,
    pub data_units_written: u128,
    pub host_reads: u128,
    pub host_writes: u128,
    pub power_cycles: u128,
    pub power_on_hours: u128,
    pub unsafe_shutdowns: u128,
    pub media_errors: u128,
    pub error_log_entries: u128,
}

pub const SMART_LOG_LEN: usize = 512;

impl SmartLog {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; SMART_LOG_LEN];
        b[0] = self.critical_warning;
        put_u16(&mut b, 1, self.temperature);
        b[3] = self.available_spare;
        b[4] = self.spare_threshold;
        b[5] = self.percent_used;
        for (off, v) in [
            (32, self.data_units_read),
            (48, self.data_units_written),
            (64, self.host_reads),
            (80, self.host_writes),
            (112, self.power_cycles),
            (128, self.power_on_hours),
            (144, self.unsafe_shutdowns),
            (160, self.media_errors),
            (176, self.error_log_entries),
        ] {
            b[off..off + 16].copy_from_slice(&v.to_le_bytes());
        }
        b
    }
    pub fn decode(b: &[u8]) -> SmartLog {
        let u128_at = |o: usize| (u64_at(b, o) as u128) | (u64_at(b, o + 8) as u128) << 64;
        let byte = |o: usize| b.get(o).copied().unwrap_or(0);
        SmartLog {
            critical_warning: byte(0),
            temperature: u16_at(b, 1),
            available_spare: byte(3),
            spare_threshold: byte(4),
            percent_used: byte(5),
            data_units_read: u128_at(32),
            data_units_written: u128_at(48),
            host_reads: u128_at(64),
            host_writes: u128_at(80),
            power_cycles: u128_at(112),
            power_on_hours: u128_at(128),
            unsafe_shutdowns: u128_at(144),
            media_errors: u128_at(160),
            error_log_entries: u128_at(176),
        }
    }
}

/// One Error Information log entry (64 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ErrorLogEntry {
    pub error_count: u64,
    pub sqid: u16,
    pub cid: u16,
    /// Status field as in the CQE (bit 0 is the phase tag, kept 0).
    pub status: u16,
    pub param_location: u16,
    pub lba: u64,
    pub nsid: u32,
    pub trtype: u8,
}

pub const ERROR_LOG_ENTRY_LEN: usize = 64;

impl ErrorLogEntry {
    pub fn encode(&self, b: &mut [u8]) {
        put_u64(b, 0, self.error_count);
        put_u16(b, 8, self.sqid);
        put_u16(b, 10, self.cid);
        put_u16(b, 12, self.status);
        put_u16(b, 14, self.param_location);
        put_u64(b, 16, self.lba);
        put_u32(b, 24, self.nsid);
        b[29] = self.trtype;
    }
    pub fn decode(b: &[u8]) -> ErrorLogEntry {
        ErrorLogEntry {
            error_count: u64_at(b, 0),
            sqid: u16_at(b, 8),
            cid: u16_at(b, 10),
            status: u16_at(b, 12),
            param_location: u16_at(b, 14),
            lba: u64_at(b, 16),
            nsid: u32_at(b, 24),
            trtype: b.get(29).copied().unwrap_or(0),
        }
    }
}

/// Transport types in the discovery log.
pub mod trtype {
    pub const RDMA: u8 = 1;
    pub const TCP: u8 = 3;
}

/// Address families in the discovery log.
pub mod adrfam {
    pub const IPV4: u8 = 1;
    pub const IPV6: u8 = 2;
}

/// Subsystem types in the discovery log.
pub mod subtype {
    pub const REFERRAL: u8 = 1;
    pub const NVME: u8 = 2;
    pub const CURRENT_DISCOVERY: u8 = 3;
}

pub const DISCOVERY_LOG_HEADER_LEN: usize = 1024;
pub const DISCOVERY_LOG_ENTRY_LEN: usize = 1024;

/// One discovery log page entry.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DiscoveryEntry {
    pub trtype: u8,
    pub adrfam: u8,
    pub subtype: u8,
    pub treq: u8,
    pub portid: u16,
    pub cntlid: u16,
    pub asqsz: u16,
    pub eflags: u16,
    pub trsvcid: String,
    pub subnqn: String,
    pub traddr: String,
    /// TCP: security type (0 none, 1 TLS 1.2, 2 TLS 1.3).
    pub sectype: u8,
}

impl DiscoveryEntry {
    pub fn encode(&self, b: &mut [u8]) {
        b[0] = self.trtype;
        b[1] = self.adrfam;
        b[2] = self.subtype;
        b[3] = self.treq;
        put_u16(b, 4, self.portid);
        put_u16(b, 6, self.cntlid);
        put_u16(b, 8, self.asqsz);
        put_u16(b, 10, self.eflags);
        put_ascii_padded(b, 32, 32, &self.trsvcid);
        put_str_nul(b, 256, NQN_FIELD_LEN, &self.subnqn);
        put_ascii_padded(b, 512, 256, &self.traddr);
        if self.trtype == trtype::RDMA {
            // RDMA TSAS: QP service type 1 (reliable connected), provider type
            // 1 (not specified), connection management 1 (RDMA_CM), P_KEY 0.
            b[768] = 1;
            b[769] = 1;
            b[770] = 1;
        } else {
            b[768] = self.sectype;
        }
    }
    pub fn decode(b: &[u8]) -> DiscoveryEntry {
        let byte = |o: usize| b.get(o).copied().unwrap_or(0);
        DiscoveryEntry {
            trtype: byte(0),
            adrfam: byte(1),
            subtype: byte(2),
            treq: byte(3),
            portid: u16_at(b, 4),
            cntlid: u16_at(b, 6),
            asqsz: u16_at(b, 8),
            eflags: u16_at(b, 10),
            trsvcid: str_at(b, 32, 32),
            subnqn: str_at(b, 256, NQN_FIELD_LEN),
            traddr: str_at(b, 512, 256),
            sectype: byte(768),
        }
    }
}

/// Builds a whole discovery log page (header + entries).
pub fn encode_discovery_log(genctr: u64, entries: &[DiscoveryEntry]) -> Vec<u8> {
    let mut b = vec![0u8; DISCOVERY_LOG_HEADER_LEN + entries.len() * DISCOVERY_LOG_ENTRY_LEN];
    put_u64(&mut b, 0, genctr);
    put_u64(&mut b, 8, entries.len() as u64);
    put_u16(&mut b, 16, 0);
    for (i, e) in entries.iter().enumerate() {
        let off = DISCOVERY_LOG_HEADER_LEN + i * DISCOVERY_LOG_ENTRY_LEN;
        e.encode(&mut b[off..off + DISCOVERY_LOG_ENTRY_LEN]);
    }
    b
}

/// Parses a discovery log page; entries beyond the buffer are not invented.
pub fn decode_discovery_log(b: &[u8]) -> (u64, Vec<DiscoveryEntry>) {
    let genctr = u64_at(b, 0);
    let numrec = u64_at(b, 8);
    let mut entries = Vec::new();
    for i in 0..numrec.min(1024) as usize {
        let off = DISCOVERY_LOG_HEADER_LEN + i * DISCOVERY_LOG_ENTRY_LEN;
        match b.get(off..off + DISCOVERY_LOG_ENTRY_LEN) {
            Some(e) => entries.push(DiscoveryEntry::decode(e)),
            None => break,
        }
    }
    (genctr, entries)
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

/// Controller Configuration register fields.
pub mod cc {
    pub const EN: u32 = 1 << 0;
    pub const SHN_SHIFT: u32 = 14;
    pub const SHN_MASK: u32 = 0x3 << SHN_SHIFT;
    pub const IOSQES_SHIFT: u32 = 16;
    pub const IOCQES_SHIFT: u32 = 20;
}

/// Controller Status register fields.
pub mod csts {
    pub const RDY: u32 = 1 << 0;
    pub const CFS: u32 = 1 << 1;
    pub const SHST_COMPLETE: u32 = 0x2 << 2;
    pub const SHST_MASK: u32 = 0x3 << 2;
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn status_field_round_trips() {
        for s in [
            Status::SUCCESS,
            Status::INVALID_OPCODE,
            Status::CONNECT_INVALID_HOST,
            Status::DEALLOCATED_OR_UNWRITTEN,
        ] {
            assert_eq!(Status::from_field(s.to_field()), s);
        }
        // The Linux host's NVME_SC_CONNECT_INVALID_HOST is 0x184 (sct << 8 | sc) and
        // DNR is 0x4000 in its shifted-down view.
        assert_eq!(Status::CONNECT_INVALID_HOST.to_field() >> 1, 0x4184);
    }

    #[test]
    fn identify_controller_offsets_match_spec() {
        let id = IdentifyController {
            serial: "SN1".into(),
            model: "kvtarget".into(),
            cntlid: 0x1234,
            kas: 10,
            maxcmd: 128,
            sgls: 0x0010_0005,
            subnqn: "nqn.2026-11.io.kvtarget:x".into(),
            ioccsz: 260,
            iorcsz: 1,
            cntrltype: 1,
            ..Default::default()
        };
        let b = id.encode();
        assert_eq!(b.len(), 4096);
        assert_eq!(&b[4..7], b"SN1");
        assert_eq!(b[7], b' ');
        assert_eq!(u16_at(&b, 78), 0x1234);
        assert_eq!(u16_at(&b, 320), 10);
        assert_eq!(u16_at(&b, 514), 128);
        assert_eq!(u32_at(&b, 536), 0x0010_0005);
        assert_eq!(&b[768..768 + 25], b"nqn.2026-11.io.kvtarget:x");
        assert_eq!(u32_at(&b, 1792), 260);
        assert_eq!(b[111], 1);
        assert_eq!(IdentifyController::decode(&b), id);
    }

    #[test]
    fn discovery_log_round_trips() {
        let e = DiscoveryEntry {
            trtype: trtype::TCP,
            adrfam: adrfam::IPV4,
            subtype: subtype::NVME,
            treq: 2,
            portid: 1,
            cntlid: 0xFFFF,
            asqsz: 32,
            eflags: 0,
            trsvcid: "4420".into(),
            subnqn: "nqn.a".into(),
            traddr: "127.0.0.1".into(),
            sectype: 0,
        };
        let page = encode_discovery_log(7, &[e.clone(), e.clone()]);
        assert_eq!(page.len(), 3072);
        let (g, es) = decode_discovery_log(&page);
        assert_eq!(g, 7);
        assert_eq!(es, vec![e.clone(), e]);
    }

    #[test]
    fn get_log_page_length_round_trips() {
        let g = GetLogPage {
            lid: 0x70,
            lsp: 0,
            rae: true,
            len: 4 * 70000,
            offset: 1 << 33,
        };
        assert_eq!(GetLogPage::parse(&g.encode(3, 0)), g);
    }

    proptest! {
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..5000)) {
            let _ = Sqe::from_slice(&bytes);
            let _ = Cqe::decode(&bytes);
            let _ = ConnectData::parse(&bytes);
            let _ = IdentifyController::decode(&bytes);
            let _ = IdentifyNamespace::decode(&bytes);
            let _ = decode_discovery_log(&bytes);
            let _ = decode_ns_descriptors(&bytes);
            let _ = decode_ns_list(&bytes);
            let _ = SmartLog::decode(&bytes);
            let _ = ErrorLogEntry::decode(&bytes);
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

        #[test]
        fn connect_data_round_trips(cntlid in any::<u16>(), sub in "[a-z0-9.:-]{1,223}", host in "[a-z0-9.:-]{1,223}") {
            let d = ConnectData { hostid: [7; 16], cntlid, subnqn: sub, hostnqn: host };
            prop_assert_eq!(ConnectData::parse(&d.encode()), Some(d));
        }
    }
}
