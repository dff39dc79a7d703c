//! NVMe/TCP PDUs (NVMe TCP Transport Specification 1.0).
//!
//! `parse` takes whatever bytes have arrived on a socket and returns either "need
//! more", one complete validated PDU borrowing from the buffer, or a `PduError` that
//! says which fatal error status (FES) and field to put in a C2HTermReq. It never
//! panics and never trusts a length it has not checked against the buffer and the
//! negotiated limits.

use super::le::*;
use super::nvme::{Cqe, Sqe, CQE_LEN, SQE_LEN};

pub const COMMON_HEADER_LEN: usize = 8;
pub const IC_PDU_LEN: usize = 128;
pub const CAPSULE_CMD_HLEN: usize = COMMON_HEADER_LEN + SQE_LEN;
pub const CAPSULE_RESP_HLEN: usize = COMMON_HEADER_LEN + CQE_LEN;
pub const DATA_HLEN: usize = 24;
pub const R2T_HLEN: usize = 24;
pub const TERM_REQ_HLEN: usize = 24;
/// A TermReq carries at most 128 bytes of the offending PDU header.
pub const TERM_REQ_MAX_DATA: usize = 128;
pub const DIGEST_LEN: usize = 4;

/// PDU types.
pub mod pdu_type {
    pub const IC_REQ: u8 = 0x00;
    pub const IC_RESP: u8 = 0x01;
    pub const H2C_TERM_REQ: u8 = 0x02;
    pub const C2H_TERM_REQ: u8 = 0x03;
    pub const CAPSULE_CMD: u8 = 0x04;
    pub const CAPSULE_RESP: u8 = 0x05;
    pub const H2C_DATA: u8 = 0x06;
    pub const C2H_DATA: u8 = 0x07;
    pub const R2T: u8 = 0x09;
}

/// Common header flags.
pub mod flags {
    pub const HDGSTF: u8 = 0x01;
    pub const DDGSTF: u8 = 0x02;
    pub const LAST_PDU: u8 = 0x04;
    /// C2HData only: the command completed successfully, no CapsuleResp follows.
    pub const SUCCESS: u8 = 0x08;
}

/// Fatal error status values carried by H2C/C2HTermReq.
pub mod fes {
    pub const INVALID_HEADER_FIELD: u16 = 0x01;
    pub const PDU_SEQUENCE_ERROR: u16 = 0x02;
    pub const HEADER_DIGEST_ERROR: u16 = 0x03;
    pub const DATA_OUT_OF_RANGE: u16 = 0x04;
    pub const DATA_LIMIT_EXCEEDED: u16 = 0x05;
    pub const UNSUPPORTED_PARAMETER: u16 = 0x06;
}

/// CRC32C as NVMe/TCP uses it (seed and final xor 0xFFFFFFFF, which the crate
/// applies), stored little-endian. Uses SSE4.2 where the CPU has it.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// Which digests a connection negotiated in ICReq/ICResp.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Digests {
    pub header: bool,
    pub data: bool,
}

impl Digests {
    fn hdgst_len(self) -> usize {
        if self.header {
            DIGEST_LEN
        } else {
            0
        }
    }
    fn ddgst_len(self) -> usize {
        if self.data {
            DIGEST_LEN
        } else {
            0
        }
    }
}

/// A protocol error found while parsing: what to send in the TermReq.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{reason} (fes {fes:#x}, field offset {fei})")]
pub struct PduError {
    pub fes: u16,
    /// Field error information: byte offset of the bad field in the header.
    pub fei: u32,
    pub reason: &'static str,
}

impl PduError {
    fn new(fes: u16, fei: u32, reason: &'static str) -> PduError {
        PduError { fes, fei, reason }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ICReq {
    pub pfv: u16,
    pub hpda: u8,
    pub digests: Digests,
    /// 0-based maximum outstanding R2Ts per command.
    pub maxr2t: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ICResp {
    pub pfv: u16,
    pub cpda: u8,
    pub digests: Digests,
    pub maxh2cdata: u32,
}

/// Header of H2CData, C2HData and R2T (same layout: cccid, ttag, offset, length).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DataHeader {
    pub cccid: u16,
    pub ttag: u16,
    pub offset: u32,
    pub length: u32,
}

/// A parsed PDU. Data slices borrow from the receive buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Pdu<'a> {
    ICReq(ICReq),
    ICResp(ICResp),
    TermReq {
        from_host: bool,
        fes: u16,
        fei: u32,
        data: &'a [u8],
    },
    CapsuleCmd {
        sqe: Sqe,
        data: &'a [u8],
        /// Set when the data digest did not match; the header is still good.
        data_digest_error: bool,
    },
    CapsuleResp(Cqe),
    H2CData {
        hdr: DataHeader,
        last: bool,
        data: &'a [u8],
        data_digest_error: bool,
    },
    C2HData {
        hdr: DataHeader,
        last: bool,
        success: bool,
        data: &'a [u8],
        data_digest_error: bool,
    },
    R2T(DataHeader),
}

/// Limits the parser enforces on a connection.
#[derive(Debug, Clone, Copy)]
pub struct ParseLimits {
    /// Largest data payload accepted in any single PDU.
    pub max_data: usize,
}

/// The common header as read off the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommonHeader {
    pub pdu_type: u8,
    pub flags: u8,
    pub hlen: u8,
    pub pdo: u8,
    pub plen: u32,
}

impl CommonHeader {
    pub fn parse(b: &[u8]) -> Option<CommonHeader> {
        if b.len() < COMMON_HEADER_LEN {
            return None;
        }
        Some(CommonHeader {
            pdu_type: b[0],
            flags: b[1],
            hlen: b[2],
            pdo: b[3],
            plen: u32_at(b, 4),
        })
    }
}

fn expected_hlen(t: u8) -> Option<usize> {
    Some(match t {
        pdu_type::IC_REQ | pdu_type::IC_RESP => IC_PDU_LEN,
        pdu_type::H2C_TERM_REQ | pdu_type::C2H_TERM_REQ => TERM_REQ_HLEN,
        pdu_type::CAPSULE_CMD => CAPSULE_CMD_HLEN,
        pdu_type::CAPSULE_RESP => CAPSULE_RESP_HLEN,
        pdu_type::H2C_DATA | pdu_type::C2H_DATA => DATA_HLEN,
        pdu_type::R2T => R2T_HLEN,
        _ => return None,
    })
}

/// What the common header (and the rest of the header) says about a PDU's
/// framing, validated before its data has arrived.
struct Frame {
    ch: CommonHeader,
    plen: usize,
    /// Where the data is (offset, length) and the data digest length, for PDUs
    /// with a data part.
    data: Option<(usize, usize, usize)>,
}

/// Validates the header at the front of `buf`. `Ok(None)` until the whole header
/// (with its digest) is there.
fn frame(buf: &[u8], digests: Digests, limits: ParseLimits) -> Result<Option<Frame>, PduError> {
    let Some(ch) = CommonHeader::parse(buf) else {
        return Ok(None);
    };
    let Some(hlen) = expected_hlen(ch.pdu_type) else {
        return Err(PduError::new(
            fes::INVALID_HEADER_FIELD,
            0,
            "unknown PDU type",
        ));
    };
    if ch.hlen as usize != hlen {
        return Err(PduError::new(
            fes::INVALID_HEADER_FIELD,
            2,
            "header length does not match PDU type",
        ));
    }
    let plen = ch.plen as usize;
    let is_ic_or_term = matches!(
        ch.pdu_type,
        pdu_type::IC_REQ | pdu_type::IC_RESP | pdu_type::H2C_TERM_REQ | pdu_type::C2H_TERM_REQ
    );
    // IC and TermReq PDUs never carry digests; everything else carries the
    // negotiated header digest, and the data digest when it has data.
    let hdgst = if is_ic_or_term {
        0
    } else {
        digests.hdgst_len()
    };
    if !is_ic_or_term && ((ch.flags & flags::HDGSTF) != 0) != digests.header {
        return Err(PduError::new(
            fes::INVALID_HEADER_FIELD,
            1,
            "header digest flag differs from what was negotiated",
        ));
    }
    check_plen(&ch, hlen + hdgst, is_ic_or_term, limits)?;
    if buf.len() < hlen + hdgst {
        return Ok(None);
    }
    if hdgst != 0 {
        let want = u32_at(buf, hlen);
        if crc32c(&buf[..hlen]) != want {
            return Err(PduError::new(
                fes::HEADER_DIGEST_ERROR,
                0,
                "header digest mismatch",
            ));
        }
    }
    // Locate the data part for PDU types that may carry data.
    let has_data_part = matches!(
        ch.pdu_type,
        pdu_type::CAPSULE_CMD | pdu_type::H2C_DATA | pdu_type::C2H_DATA
    );
    let data = if has_data_part && plen > hlen + hdgst {
        Some(data_part(&ch, hlen + hdgst, digests, limits)?)
    } else if !has_data_part && !is_ic_or_term && plen != hlen + hdgst {
        return Err(PduError::new(
            fes::INVALID_HEADER_FIELD,
            4,
            "PDU length wrong for a PDU without data",
        ));
    } else {
        None
    };
    Ok(Some(Frame { ch, plen, data }))
}

/// Checks the PDU length against its header (`head` bytes with the header
/// digest) and the limit for its type.
fn check_plen(
    ch: &CommonHeader,
    head: usize,
    is_ic_or_term: bool,
    limits: ParseLimits,
) -> Result<(), PduError> {
    let plen = ch.plen as usize;
    let max_plen = match ch.pdu_type {
        pdu_type::IC_REQ | pdu_type::IC_RESP => IC_PDU_LEN,
        pdu_type::H2C_TERM_REQ | pdu_type::C2H_TERM_REQ => TERM_REQ_HLEN + TERM_REQ_MAX_DATA,
        _ => head + 255 + limits.max_data + DIGEST_LEN,
    };
    if plen < head {
        return Err(PduError::new(
            fes::INVALID_HEADER_FIELD,
            4,
            "PDU length shorter than its header",
        ));
    }
    if plen > max_plen {
        let f = if is_ic_or_term {
            fes::INVALID_HEADER_FIELD
        } else {
            fes::DATA_LIMIT_EXCEEDED
        };
        return Err(PduError::new(
            f,
            4,
            "PDU length exceeds the negotiated limit",
        ));
    }
    Ok(())
}

/// Where a PDU's data part is (offset, length, data digest length), checked
/// against its header (`head` bytes with the header digest), the negotiated
/// digests and the data limit.
fn data_part(
    ch: &CommonHeader,
    head: usize,
    digests: Digests,
    limits: ParseLimits,
) -> Result<(usize, usize, usize), PduError> {
    let plen = ch.plen as usize;
    let ddgst = digests.ddgst_len();
    if ((ch.flags & flags::DDGSTF) != 0) != digests.data {
        return Err(PduError::new(
            fes::INVALID_HEADER_FIELD,
            1,
            "data digest flag differs from what was negotiated",
        ));
    }
    let pdo = ch.pdo as usize;
    if pdo < head || pdo + ddgst > plen {
        return Err(PduError::new(
            fes::INVALID_HEADER_FIELD,
            3,
            "PDU data offset outside the PDU",
        ));
    }
    let len = plen - ddgst - pdo;
    if len > limits.max_data {
        return Err(PduError::new(
            fes::DATA_LIMIT_EXCEEDED,
            4,
            "PDU data exceeds the negotiated limit",
        ));
    }
    Ok((pdo, len, ddgst))
}

/// The header of a data PDU (H2CData or C2HData), known before its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataPduHead {
    pub h2c: bool,
    pub hdr: DataHeader,
    pub last: bool,
    pub success: bool,
    /// Where the data starts, how long it is, and the data digest after it.
    pub pdo: usize,
    pub data_len: usize,
    pub ddgst: usize,
    pub plen: usize,
}

/// Parses the header of a data PDU at the front of `buf` once the bytes up to
/// its data are there, so the data can be received straight into its
/// destination. `Ok(None)` for other PDU types, or while bytes are missing.
/// Validation is the same as `parse`'s.
pub fn parse_data_pdu_head(
    buf: &[u8],
    digests: Digests,
    limits: ParseLimits,
) -> Result<Option<DataPduHead>, PduError> {
    let Some(f) = frame(buf, digests, limits)? else {
        return Ok(None);
    };
    let h2c = match f.ch.pdu_type {
        pdu_type::H2C_DATA => true,
        pdu_type::C2H_DATA => false,
        _ => return Ok(None),
    };
    let (pdo, data_len, ddgst) = f.data.unwrap_or((f.plen, 0, 0));
    if buf.len() < pdo.max(DATA_HLEN) {
        return Ok(None);
    }
    let hdr = DataHeader {
        cccid: u16_at(buf, 8),
        ttag: u16_at(buf, 10),
        offset: u32_at(buf, 12),
        length: u32_at(buf, 16),
    };
    if hdr.length as usize != data_len {
        return Err(PduError::new(
            fes::INVALID_HEADER_FIELD,
            16,
            "data length field differs from the PDU's data",
        ));
    }
    Ok(Some(DataPduHead {
        h2c,
        hdr,
        last: f.ch.flags & flags::LAST_PDU != 0,
        success: f.ch.flags & flags::SUCCESS != 0,
        pdo,
        data_len,
        ddgst,
        plen: f.plen,
    }))
}

/// Parses one PDU from the front of `buf`.
///
/// Returns `Ok(None)` when more bytes are needed, `Ok(Some((pdu, consumed)))` for a
/// complete PDU. Digests are those negotiated (both off before the IC exchange).
pub fn parse<'a>(
    buf: &'a [u8],
    digests: Digests,
    limits: ParseLimits,
) -> Result<Option<(Pdu<'a>, usize)>, PduError> {
    let Some(f) = frame(buf, digests, limits)? else {
        return Ok(None);
    };
    let (ch, plen) = (f.ch, f.plen);
    if buf.len() < plen {
        return Ok(None);
    }
    let pdu = &buf[..plen];
    let mut data: &[u8] = &[];
    let mut data_digest_error = false;
    if let Some((pdo, len, ddgst)) = f.data {
        data = &pdu[pdo..pdo + len];
        if ddgst != 0 {
            let want = u32_at(pdu, plen - ddgst);
            data_digest_error = crc32c(data) != want;
        }
    }

    let parsed = match ch.pdu_type {
        pdu_type::IC_REQ | pdu_type::IC_RESP => parse_ic(ch.pdu_type, pdu)?,
        pdu_type::H2C_TERM_REQ | pdu_type::C2H_TERM_REQ => Pdu::TermReq {
            from_host: ch.pdu_type == pdu_type::H2C_TERM_REQ,
            fes: u16_at(pdu, 8),
            fei: u32_at(pdu, 10),
            data: &pdu[TERM_REQ_HLEN..],
        },
        pdu_type::CAPSULE_CMD => {
            let Some(sqe) = Sqe::from_slice(&pdu[COMMON_HEADER_LEN..]) else {
                return Err(PduError::new(fes::INVALID_HEADER_FIELD, 2, "short capsule"));
            };
            Pdu::CapsuleCmd {
                sqe,
                data,
                data_digest_error,
            }
        }
        pdu_type::CAPSULE_RESP => {
            let Some(cqe) = Cqe::decode(&pdu[COMMON_HEADER_LEN..]) else {
                return Err(PduError::new(
                    fes::INVALID_HEADER_FIELD,
                    2,
                    "short response",
                ));
            };
            Pdu::CapsuleResp(cqe)
        }
        pdu_type::H2C_DATA | pdu_type::C2H_DATA | pdu_type::R2T => {
            parse_data(&ch, pdu, data, data_digest_error)?
        }
        _ => {
            return Err(PduError::new(
                fes::INVALID_HEADER_FIELD,
                0,
                "unknown PDU type",
            ))
        }
    };
    Ok(Some((parsed, plen)))
}

/// An ICReq or ICResp (`pdu_type`) from its whole PDU.
fn parse_ic(pdu_type: u8, pdu: &[u8]) -> Result<Pdu<'_>, PduError> {
    if pdu.len() != IC_PDU_LEN {
        return Err(PduError::new(
            fes::INVALID_HEADER_FIELD,
            4,
            "ICReq/ICResp length",
        ));
    }
    // Same layout both ways: pfv, pda (HPDA/CPDA), digest bits, a u32
    // (MAXR2T in ICReq, MAXH2CDATA in ICResp).
    let (pfv, pda, value) = (u16_at(pdu, 8), pdu[10], u32_at(pdu, 12));
    let digests = Digests {
        header: pdu[11] & 1 != 0,
        data: pdu[11] & 2 != 0,
    };
    Ok(if pdu_type == pdu_type::IC_REQ {
        Pdu::ICReq(ICReq {
            pfv,
            hpda: pda,
            digests,
            maxr2t: value,
        })
    } else {
        Pdu::ICResp(ICResp {
            pfv,
            cpda: pda,
            digests,
            maxh2cdata: value,
        })
    })
}

/// An H2CData, C2HData or R2T from its whole PDU and its located `data`.
#[inline]
fn parse_data<'a>(
    ch: &CommonHeader,
    pdu: &'a [u8],
    data: &'a [u8],
    data_digest_error: bool,
) -> Result<Pdu<'a>, PduError> {
    let hdr = DataHeader {
        cccid: u16_at(pdu, 8),
        ttag: u16_at(pdu, 10),
        offset: u32_at(pdu, 12),
        length: u32_at(pdu, 16),
    };
    if ch.pdu_type != pdu_type::R2T && hdr.length as usize != data.len() {
        return Err(PduError::new(
            fes::INVALID_HEADER_FIELD,
            16,
            "data length field differs from the PDU's data",
        ));
    }
    let last = ch.flags & flags::LAST_PDU != 0;
    Ok(match ch.pdu_type {
        pdu_type::H2C_DATA => Pdu::H2CData {
            hdr,
            last,
            data,
            data_digest_error,
        },
        pdu_type::C2H_DATA => Pdu::C2HData {
            hdr,
            last,
            success: ch.flags & flags::SUCCESS != 0,
            data,
            data_digest_error,
        },
        _ => Pdu::R2T(hdr),
    })
}

fn put_common(out: &mut Vec<u8>, t: u8, fl: u8, hlen: usize, pdo: usize, plen: usize) -> usize {
    let start = out.len();
    out.extend_from_slice(&[t, fl, hlen as u8, pdo as u8]);
    out.extend_from_slice(&(plen as u32).to_le_bytes());
    start
}

fn finish_header(out: &mut Vec<u8>, start: usize, hdgst: bool) {
    if hdgst {
        let d = crc32c(&out[start..]);
        out.extend_from_slice(&d.to_le_bytes());
    }
}

fn encode_ic(out: &mut Vec<u8>, t: u8, pfv: u16, pda: u8, digests: Digests, value: u32) {
    let start = put_common(out, t, 0, IC_PDU_LEN, 0, IC_PDU_LEN);
    out.resize(start + IC_PDU_LEN, 0);
    put_u16(out, start + 8, pfv);
    out[start + 10] = pda;
    out[start + 11] = digests.header as u8 | (digests.data as u8) << 1;
    put_u32(out, start + 12, value);
}

/// Appends an ICReq (host side).
pub fn encode_icreq(out: &mut Vec<u8>, r: &ICReq) {
    encode_ic(out, pdu_type::IC_REQ, r.pfv, r.hpda, r.digests, r.maxr2t);
}

/// Appends an ICResp (target side).
pub fn encode_icresp(out: &mut Vec<u8>, r: &ICResp) {
    encode_ic(
        out,
        pdu_type::IC_RESP,
        r.pfv,
        r.cpda,
        r.digests,
        r.maxh2cdata,
    );
}

/// Appends a CapsuleResp.
pub fn encode_capsule_resp(out: &mut Vec<u8>, cqe: &Cqe, digests: Digests) {
    let hd = digests.hdgst_len();
    let fl = if digests.header { flags::HDGSTF } else { 0 };
    let plen = CAPSULE_RESP_HLEN + hd;
    let start = put_common(out, pdu_type::CAPSULE_RESP, fl, CAPSULE_RESP_HLEN, 0, plen);
    let at = out.len();
    out.resize(at + CQE_LEN, 0);
    cqe.encode(&mut out[at..]);
    finish_header(out, start, digests.header);
}

/// Appends a CapsuleCmd with optional in-capsule data (host side).
pub fn encode_capsule_cmd(out: &mut Vec<u8>, sqe: &Sqe, data: &[u8], digests: Digests) {
    let hd = digests.hdgst_len();
    let dd = if data.is_empty() {
        0
    } else {
        digests.ddgst_len()
    };
    let mut fl = if digests.header { flags::HDGSTF } else { 0 };
    if dd != 0 {
        fl |= flags::DDGSTF;
    }
    let pdo = if data.is_empty() {
        0
    } else {
        CAPSULE_CMD_HLEN + hd
    };
    let plen = CAPSULE_CMD_HLEN + hd + data.len() + dd;
    let start = put_common(out, pdu_type::CAPSULE_CMD, fl, CAPSULE_CMD_HLEN, pdo, plen);
    out.extend_from_slice(&sqe.0);
    finish_header(out, start, digests.header);
    append_data(out, data, dd != 0);
}

fn append_data(out: &mut Vec<u8>, data: &[u8], ddgst: bool) {
    out.extend_from_slice(data);
    if ddgst {
        out.extend_from_slice(&crc32c(data).to_le_bytes());
    }
}

/// Appends an R2T.
pub fn encode_r2t(out: &mut Vec<u8>, hdr: &DataHeader, digests: Digests) {
    let hd = digests.hdgst_len();
    let fl = if digests.header { flags::HDGSTF } else { 0 };
    let start = put_common(out, pdu_type::R2T, fl, R2T_HLEN, 0, R2T_HLEN + hd);
    put_data_header(out, hdr);
    finish_header(out, start, digests.header);
}

fn put_data_header(out: &mut Vec<u8>, hdr: &DataHeader) {
    out.extend_from_slice(&hdr.cccid.to_le_bytes());
    out.extend_from_slice(&hdr.ttag.to_le_bytes());
    out.extend_from_slice(&hdr.offset.to_le_bytes());
    out.extend_from_slice(&hdr.length.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
}

/// Appends a data PDU (C2HData from a target, H2CData from a host). `pdo_align` is
/// the peer's requested data alignment in bytes (4 × (PDA + 1)), 0 for none.
pub fn encode_data_pdu(
    out: &mut Vec<u8>,
    h2c: bool,
    hdr: &DataHeader,
    data: &[u8],
    pdu_flags: u8,
    digests: Digests,
    pdo_align: usize,
) {
    encode_data_pdu_header(out, h2c, hdr, data.len(), pdu_flags, digests, pdo_align);
    append_data(out, data, digests.data);
}

/// Appends a data PDU's header (and any padding up to its data offset) for
/// `data_len` bytes of data; the caller sends the data, then the data digest
/// (`crc32c` of the data, little-endian) when data digests are on.
pub fn encode_data_pdu_header(
    out: &mut Vec<u8>,
    h2c: bool,
    hdr: &DataHeader,
    data_len: usize,
    pdu_flags: u8,
    digests: Digests,
    pdo_align: usize,
) {
    let hd = digests.hdgst_len();
    let dd = digests.ddgst_len();
    let mut fl = pdu_flags & (flags::LAST_PDU | flags::SUCCESS);
    if digests.header {
        fl |= flags::HDGSTF;
    }
    if digests.data {
        fl |= flags::DDGSTF;
    }
    let mut pdo = DATA_HLEN + hd;
    if pdo_align > 1 {
        pdo = pdo.div_ceil(pdo_align) * pdo_align;
    }
    let plen = pdo + data_len + dd;
    let t = if h2c {
        pdu_type::H2C_DATA
    } else {
        pdu_type::C2H_DATA
    };
    // One PDU per read completion: the header is built on the stack and
    // appended once (field-by-field appends cost a capacity check each).
    let mut h = [0u8; DATA_HLEN];
    h[..4].copy_from_slice(&[t, fl, DATA_HLEN as u8, pdo as u8]);
    h[4..8].copy_from_slice(&(plen as u32).to_le_bytes());
    h[8..10].copy_from_slice(&hdr.cccid.to_le_bytes());
    h[10..12].copy_from_slice(&hdr.ttag.to_le_bytes());
    h[12..16].copy_from_slice(&hdr.offset.to_le_bytes());
    h[16..20].copy_from_slice(&(data_len as u32).to_le_bytes());
    let start = out.len();
    out.reserve(pdo);
    out.extend_from_slice(&h);
    finish_header(out, start, digests.header);
    out.resize(start + pdo, 0);
}

/// Appends a TermReq carrying up to 128 bytes of the offending header.
pub fn encode_term_req(out: &mut Vec<u8>, from_host: bool, fes: u16, fei: u32, offending: &[u8]) {
    let data = &offending[..offending.len().min(TERM_REQ_MAX_DATA)];
    let t = if from_host {
        pdu_type::H2C_TERM_REQ
    } else {
        pdu_type::C2H_TERM_REQ
    };
    let start = put_common(out, t, 0, TERM_REQ_HLEN, 0, TERM_REQ_HLEN + data.len());
    out.resize(start + TERM_REQ_HLEN, 0);
    put_u16(out, start + 8, fes);
    put_u32(out, start + 10, fei);
    out.extend_from_slice(data);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nvme::{io_opc, Status};
    use proptest::prelude::*;

    const LIM: ParseLimits = ParseLimits { max_data: 1 << 20 };

    #[test]
    fn crc32c_check_value() {
        // The CRC-32C check value from the iSCSI/NVMe specifications.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn partial_input_needs_more() {
        let mut out = Vec::new();
        encode_icreq(&mut out, &ICReq::default());
        for n in 0..out.len() {
            assert_eq!(parse(&out[..n], Digests::default(), LIM), Ok(None));
        }
        assert!(matches!(
            parse(&out, Digests::default(), LIM),
            Ok(Some((Pdu::ICReq(_), 128)))
        ));
    }

    #[test]
    fn capsule_with_data_and_digests_round_trips() {
        let d = Digests {
            header: true,
            data: true,
        };
        let sqe = Sqe::new(io_opc::WRITE, 9, 1);
        let mut out = Vec::new();
        encode_capsule_cmd(&mut out, &sqe, &[5u8; 4096], d);
        let (pdu, n) = parse(&out, d, LIM).unwrap().unwrap();
        assert_eq!(n, out.len());
        match pdu {
            Pdu::CapsuleCmd {
                sqe: s,
                data,
                data_digest_error,
            } => {
                assert_eq!(s, sqe);
                assert_eq!(data, &[5u8; 4096][..]);
                assert!(!data_digest_error);
            }
            other => panic!("{other:?}"),
        }
        // Corrupt one data byte: header still good, data digest flagged.
        let mut bad = out.clone();
        bad[100] ^= 1;
        assert!(matches!(
            parse(&bad, d, LIM),
            Ok(Some((
                Pdu::CapsuleCmd {
                    data_digest_error: true,
                    ..
                },
                _
            )))
        ));
        // Corrupt the header: header digest error.
        let mut bad = out;
        bad[10] ^= 1;
        assert_eq!(
            parse(&bad, d, LIM).unwrap_err().fes,
            fes::HEADER_DIGEST_ERROR
        );
    }

    #[test]
    fn resp_and_data_round_trip() {
        let d = Digests {
            header: true,
            data: false,
        };
        let mut out = Vec::new();
        encode_capsule_resp(&mut out, &Cqe::new(3, Status::INVALID_FIELD), d);
        let hdr = DataHeader {
            cccid: 3,
            ttag: 0,
            offset: 512,
            length: 0,
        };
        encode_data_pdu(&mut out, false, &hdr, &[1, 2, 3, 4], flags::LAST_PDU, d, 0);
        let (p1, n1) = parse(&out, d, LIM).unwrap().unwrap();
        assert!(
            matches!(p1, Pdu::CapsuleResp(c) if c.cid == 3 && c.status() == Status::INVALID_FIELD)
        );
        let (p2, n2) = parse(&out[n1..], d, LIM).unwrap().unwrap();
        assert_eq!(n1 + n2, out.len());
        assert!(
            matches!(p2, Pdu::C2HData { hdr, last: true, success: false, data, .. } if hdr.offset == 512 && data == [1, 2, 3, 4])
        );
    }

    #[test]
    fn oversized_pdu_is_rejected_before_buffering() {
        let mut out = Vec::new();
        let hdr = DataHeader::default();
        encode_data_pdu(&mut out, true, &hdr, &[0u8; 8192], 0, Digests::default(), 0);
        let err = parse(
            &out[..8],
            Digests::default(),
            ParseLimits { max_data: 4096 },
        )
        .unwrap_err();
        assert_eq!(err.fes, fes::DATA_LIMIT_EXCEEDED);
    }

    #[test]
    fn wrong_hlen_and_unknown_type_rejected() {
        let mut out = Vec::new();
        encode_icreq(&mut out, &ICReq::default());
        out[2] = 72;
        assert_eq!(parse(&out, Digests::default(), LIM).unwrap_err().fei, 2);
        out[0] = 0x42;
        assert_eq!(
            parse(&out, Digests::default(), LIM).unwrap_err().fes,
            fes::INVALID_HEADER_FIELD
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600), hd: bool, dd: bool) {
            let d = Digests { header: hd, data: dd };
            let _ = parse(&bytes, d, ParseLimits { max_data: 256 });
        }

        #[test]
        fn parse_never_panics_on_mutated_valid_pdus(idx in 0usize..200, val: u8, which in 0u8..4, hd: bool, dd: bool) {
            let d = Digests { header: hd, data: dd };
            let mut out = Vec::new();
            match which {
                0 => encode_capsule_cmd(&mut out, &Sqe::new(1, 1, 1), &[7u8; 64], d),
                1 => encode_capsule_resp(&mut out, &Cqe::new(1, Status::SUCCESS), d),
                2 => encode_data_pdu(&mut out, true, &DataHeader::default(), &[3u8; 40], flags::LAST_PDU, d, 0),
                _ => encode_r2t(&mut out, &DataHeader::default(), d),
            }
            let i = idx % out.len();
            out[i] = val;
            let _ = parse(&out, d, ParseLimits { max_data: 128 });
        }

        #[test]
        fn any_split_point_parses_the_same(split in 0usize..300, hd: bool, dd: bool, len in 0usize..200) {
            let d = Digests { header: hd, data: dd };
            let mut out = Vec::new();
            let data: Vec<u8> = (0..len).map(|i| i as u8).collect();
            encode_capsule_cmd(&mut out, &Sqe::new(1, 2, 3), &data, d);
            let s = split.min(out.len());
            if s < out.len() {
                prop_assert_eq!(parse(&out[..s], d, LIM), Ok(None));
            }
            let (p, n) = parse(&out, d, LIM).unwrap().unwrap();
            prop_assert_eq!(n, out.len());
            let ok = matches!(p, Pdu::CapsuleCmd { data: got, data_digest_error: false, .. } if got == &data[..]);
            prop_assert!(ok);
        }

        /// The early header parse agrees with the full parse on every prefix of a
        /// (possibly mutated) data PDU, and never panics.
        #[test]
        fn data_pdu_head_agrees_with_parse(
            split in 0usize..400, hd: bool, dd: bool, len in 0usize..300, align in 0usize..3,
            mutate in proptest::option::of((0usize..64, any::<u8>())), h2c: bool,
        ) {
            let d = Digests { header: hd, data: dd };
            let data: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            let hdr = DataHeader { cccid: 5, ttag: 9, offset: 4096, length: 0 };
            let mut out = Vec::new();
            encode_data_pdu(&mut out, h2c, &hdr, &data, flags::LAST_PDU, d, [0, 8, 32][align]);
            if let Some((i, v)) = mutate {
                let i = i % out.len();
                out[i] = v;
            }
            let lim = ParseLimits { max_data: 256 };
            let full = parse(&out, d, lim);
            let s = split.min(out.len());
            let head = parse_data_pdu_head(&out[..s], d, lim);
            match (&full, &head) {
                (Ok(Some((Pdu::H2CData { hdr: fh, last, .. } | Pdu::C2HData { hdr: fh, last, .. }, n))), Ok(Some(h))) => {
                    prop_assert_eq!(*fh, h.hdr);
                    prop_assert_eq!(*last, h.last);
                    prop_assert_eq!(*n, h.plen);
                    prop_assert_eq!(h.pdo + h.data_len + h.ddgst, h.plen);
                }
                // A header the full parse refuses is refused early (or not yet
                // complete); it is never accepted.
                (Err(_), Ok(Some(_))) => prop_assert!(false, "head accepted what parse refused"),
                _ => {}
            }
            if full.is_ok() && s == out.len() && matches!(full, Ok(Some((Pdu::H2CData { .. } | Pdu::C2HData { .. }, _)))) {
                prop_assert!(matches!(head, Ok(Some(_))));
            }
        }
    }
}
