//! Get Log Page, the identifiers of the log pages kvtarget serves, and the layouts of
//! Error Information, SMART / Health Information and the discovery log (`nvmf::log_page`
//! is the table of pages served, and builds the others).

use super::{admin_opc, Sqe, NQN_FIELD_LEN};
use crate::le::*;

/// Log page identifiers.
pub mod lid {
    pub const ERROR_INFO: u8 = 0x01;
    pub const SMART_HEALTH: u8 = 0x02;
    pub const FIRMWARE_SLOT: u8 = 0x03;
    pub const CHANGED_NS_LIST: u8 = 0x04;
    pub const COMMANDS_SUPPORTED: u8 = 0x05;
    /// Asymmetric Namespace Access.
    pub const ANA: u8 = 0x0C;
    pub const DISCOVERY: u8 = 0x70;
    /// Reservation Notification.
    pub const RESERVATION_NOTIFICATION: u8 = 0x80;
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
    /// Command Set Identifier (CDW14 bits 31:24) for command-set-specific
    /// pages such as Commands Supported and Effects.
    pub csi: u8,
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
            csi: (sqe.cdw(14) >> 24) as u8,
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
        s.set_cdw(14, (self.csi as u32) << 24);
        s
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
            csi: 0x01,
        };
        assert_eq!(GetLogPage::parse(&g.encode(3, 0)), g);
        assert_eq!(g.encode(3, 0).cdw(14), 0x0100_0000);
    }

    proptest! {
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..5000)) {
            let _ = decode_discovery_log(&bytes);
            let _ = SmartLog::decode(&bytes);
            let _ = ErrorLogEntry::decode(&bytes);
        }
    }
}
