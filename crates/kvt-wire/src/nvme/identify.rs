//! Identify data structures: controller, namespace, namespace identification
//! descriptors and the active namespace list.

use super::{IDENTIFY_LEN, NQN_FIELD_LEN};
use crate::le::*;

/// Identify CNS values.
pub mod cns {
    pub const NAMESPACE: u8 = 0x00;
    pub const CONTROLLER: u8 = 0x01;
    pub const ACTIVE_NS_LIST: u8 = 0x02;
    pub const NS_DESCRIPTOR_LIST: u8 = 0x03;
    pub const CSI_NAMESPACE: u8 = 0x05;
    pub const CSI_CONTROLLER: u8 = 0x06;
    pub const CSI_ACTIVE_NS_LIST: u8 = 0x07;
    /// I/O Command Set Independent Identify Namespace data structure.
    pub const CS_INDEPENDENT_NAMESPACE: u8 = 0x08;
    /// I/O Command Set data structure (the supported combination vectors).
    pub const IO_COMMAND_SET: u8 = 0x1C;
}

/// Command Set Identifiers (CSI) as Identify CDW11 bits 31:24, the CSI
/// namespace identification descriptor, and Get Log Page CDW14 bits 31:24
/// carry them.
pub mod csi {
    pub const NVM: u8 = 0x00;
    pub const KEY_VALUE: u8 = 0x01;
    pub const ZONED: u8 = 0x02;
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
    /// ANA Transition Time, seconds (byte 342).
    pub anatt: u8,
    /// ANA Capabilities (byte 343).
    pub anacap: u8,
    /// ANA Group Identifier Maximum (bytes 347:344).
    pub anagrpmax: u32,
    /// Number of ANA Group Identifiers (bytes 351:348).
    pub nanagrpid: u32,
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
        b[342] = self.anatt;
        b[343] = self.anacap;
        put_u32(&mut b, 344, self.anagrpmax);
        put_u32(&mut b, 348, self.nanagrpid);
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
            anatt: byte(342),
            anacap: byte(343),
            anagrpmax: u32_at(b, 344),
            nanagrpid: u32_at(b, 348),
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
    /// Byte 31: reservation capabilities (RESCAP).
    pub rescap: u8,
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
        b[31] = self.rescap;
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
            rescap: byte(31),
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

/// Encodes a namespace identification descriptor list. The CSI descriptor
/// is always present: with CC.CSS = 110b Linux (`nvme_identify_ns_descs`)
/// drops a namespace whose list lacks one ("Command set not reported").
pub fn encode_ns_descriptors(
    eui64: &[u8; 8],
    nguid: &[u8; 16],
    uuid: &[u8; 16],
    csi: u8,
) -> Vec<u8> {
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
    push(nidt::CSI, &[csi]);
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

/// I/O Command Set data structure (Identify CNS 1Ch): 512 command set
/// combination vectors of 8 bytes each; bit N of a vector is the command set
/// with CSI N. Vectors after the last non-zero one are zero.
pub const IO_COMMAND_SET_VECTORS: usize = IDENTIFY_LEN / 8;

/// Bit of a command set combination vector for a CSI.
pub const fn csi_bit(csi: u8) -> u64 {
    1u64 << csi
}

pub fn encode_io_command_set_vectors(vectors: &[u64]) -> Vec<u8> {
    assert!(vectors.len() <= IO_COMMAND_SET_VECTORS);
    let mut b = vec![0u8; IDENTIFY_LEN];
    for (i, v) in vectors.iter().enumerate() {
        put_u64(&mut b, i * 8, *v);
    }
    b
}

/// The vectors up to (not including) the first zero one.
pub fn decode_io_command_set_vectors(b: &[u8]) -> Vec<u64> {
    b.chunks_exact(8)
        .take(IO_COMMAND_SET_VECTORS)
        .map(|c| u64_at(c, 0))
        .take_while(|&v| v != 0)
        .collect()
}

/// I/O Command Set Independent Identify Namespace (CNS 08h): what a host
/// needs of a namespace whatever its command set. Linux 6.1 uses it
/// (`nvme_ns_info_from_id_cs_indep`) for every CSI other than NVM and ZNS and
/// ignores the namespace unless NSTAT says it is ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CsIndependentNamespace {
    /// Byte 0: namespace features (bit 4 rotational media, bit 5 no volatile
    /// write cache: Linux's NVME_NS_ROTATIONAL and NVME_NS_VWC_NOT_PRESENT).
    pub nsfeat: u8,
    /// Byte 1: multi-path I/O and sharing (bit 0: may be shared).
    pub nmic: u8,
    /// Byte 2: reservation capabilities.
    pub rescap: u8,
    /// Byte 3: format progress indicator.
    pub fpi: u8,
    /// Bytes 7:4: ANA group identifier.
    pub anagrpid: u32,
    /// Byte 8: namespace attributes (bit 0: write protected).
    pub nsattr: u8,
    /// Bytes 11:10: NVM set identifier.
    pub nvmsetid: u16,
    /// Bytes 13:12: endurance group identifier.
    pub endgid: u16,
    /// Byte 14: namespace status (bit 0: ready).
    pub nstat: u8,
}

/// NSTAT bit 0: the namespace is ready for I/O (NRDY).
pub const NSTAT_READY: u8 = 1 << 0;

impl CsIndependentNamespace {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; IDENTIFY_LEN];
        b[0] = self.nsfeat;
        b[1] = self.nmic;
        b[2] = self.rescap;
        b[3] = self.fpi;
        put_u32(&mut b, 4, self.anagrpid);
        b[8] = self.nsattr;
        put_u16(&mut b, 10, self.nvmsetid);
        put_u16(&mut b, 12, self.endgid);
        b[14] = self.nstat;
        b
    }
    pub fn decode(b: &[u8]) -> CsIndependentNamespace {
        let byte = |o: usize| b.get(o).copied().unwrap_or(0);
        CsIndependentNamespace {
            nsfeat: byte(0),
            nmic: byte(1),
            rescap: byte(2),
            fpi: byte(3),
            anagrpid: u32_at(b, 4),
            nsattr: byte(8),
            nvmsetid: u16_at(b, 10),
            endgid: u16_at(b, 12),
            nstat: byte(14),
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
    fn cs_independent_namespace_offsets_match_linux() {
        // struct nvme_id_ns_cs_indep: nsfeat 0, nmic 1, rescap 2, fpi 3,
        // anagrpid 4, nsattr 8, nvmsetid 10, endgid 12, nstat 14.
        let b = CsIndependentNamespace {
            nsfeat: 0x11,
            nmic: 0x01,
            rescap: 0x22,
            fpi: 0x33,
            anagrpid: 0x4455_6677,
            nsattr: 0x01,
            nvmsetid: 0x8899,
            endgid: 0xAABB,
            nstat: NSTAT_READY,
        }
        .encode();
        assert_eq!(
            &b[..16],
            &[
                0x11, 0x01, 0x22, 0x33, 0x77, 0x66, 0x55, 0x44, 0x01, 0, 0x99, 0x88, 0xBB, 0xAA, 1,
                0
            ]
        );
        assert!(b[16..].iter().all(|&x| x == 0));
    }

    #[test]
    fn ns_descriptors_carry_the_csi_last() {
        let b = encode_ns_descriptors(&[1; 8], &[2; 16], &[3; 16], csi::KEY_VALUE);
        let d = decode_ns_descriptors(&b);
        assert_eq!(d.len(), 4);
        assert_eq!(d[3], (nidt::CSI, vec![csi::KEY_VALUE]));
        // 4 + 8, 4 + 16, 4 + 16 bytes before it: the CSI header sits at 52.
        assert_eq!(&b[52..56], &[nidt::CSI, 1, 0, 0]);
        assert_eq!(b[56], csi::KEY_VALUE);
    }

    #[test]
    fn io_command_set_vector_zero_is_at_offset_zero() {
        let b = encode_io_command_set_vectors(&[csi_bit(csi::NVM) | csi_bit(csi::KEY_VALUE)]);
        assert_eq!(u64_at(&b, 0), 0b11);
        assert!(b[8..].iter().all(|&x| x == 0));
    }

    proptest! {
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..5000)) {
            let _ = IdentifyController::decode(&bytes);
            let _ = IdentifyNamespace::decode(&bytes);
            let _ = decode_ns_descriptors(&bytes);
            let _ = decode_ns_list(&bytes);
            let _ = decode_io_command_set_vectors(&bytes);
            let _ = CsIndependentNamespace::decode(&bytes);
        }

        #[test]
        fn cs_independent_namespace_round_trips(
            nsfeat in any::<u8>(), nmic in any::<u8>(), rescap in any::<u8>(), fpi in any::<u8>(),
            anagrpid in any::<u32>(), nsattr in any::<u8>(), nvmsetid in any::<u16>(),
            endgid in any::<u16>(), nstat in any::<u8>(),
        ) {
            let id = CsIndependentNamespace {
                nsfeat, nmic, rescap, fpi, anagrpid, nsattr, nvmsetid, endgid, nstat,
            };
            prop_assert_eq!(CsIndependentNamespace::decode(&id.encode()), id);
        }

        #[test]
        fn io_command_set_vectors_round_trip(v in proptest::collection::vec(1u64.., 0..IO_COMMAND_SET_VECTORS)) {
            prop_assert_eq!(decode_io_command_set_vectors(&encode_io_command_set_vectors(&v)), v);
        }
    }
}
