//! Fuzz harnesses for kvtarget's parsers (issue 16, part 3).
//!
//! Each `pub fn` takes one fuzz input and panics only on a real bug: a decoder
//! that panics, or a value that does not survive encode → decode. The AFL
//! binaries in `src/bin/` call them, and `tests/replay.rs` runs every file of
//! `corpus/<target>/` and `regressions/<target>/` through them under plain
//! `cargo test`, so a crash once found stays found.

pub mod image;

use kvt_config::{validate_nqn, Config};
use kvt_nvmf::{Controller, Target};
use kvt_pool::format::{
    self, BlockHeader, CheckpointData, Record, Superblock, Writer, CHECKPOINT_MAGIC, HEADER_LEN,
    JOURNAL_MAGIC,
};
use kvt_pool::image::Image;
use kvt_wire::nvme::{
    admin_opc, decode_list_response, encode_list_response, ConnectCommand, ConnectData, Cqe,
    DataDirection, DsmRange, GetLogPage, KvCommand, KvIdentifyNamespace, PropertyCommand, Sqe,
    CONNECT_DATA_LEN, CQE_LEN, DSM_RANGE_LEN, KV_KEY_MAX_LEN, SQE_LEN,
};
use kvt_wire::rdma::{self, CmRequest, DataDescriptor, KEYED_MAX_LEN};
use kvt_wire::tcp::{self, Digests, ParseLimits, Pdu};

/// A fuzz harness: one input in, a panic on a bug.
pub type Harness = fn(&[u8]);

/// Every harness, by the name of its corpus folder.
pub const TARGETS: &[(&str, Harness)] = &[
    ("pdu", pdu),
    ("nvme_command", nvme_command),
    ("rdma", rdma),
    ("pool_format", pool_format),
    ("pool_check", pool_check),
    ("config", config),
    ("auth", auth),
    ("etcd_answer", etcd_answer),
];

/// Most PDUs one input is parsed into: bounds the work per execution.
const MAX_PDUS_PER_INPUT: usize = 64;

/// The data limits the PDU harness picks from (first input byte): the target's
/// in-capsule sizes (8 KiB admin, larger I/O), and 0 as the initiator's admin use.
const PDU_MAX_DATA: [usize; 4] = [0, 8192, 64 << 10, 1 << 20];

/// NVMe/TCP PDU stream as the target receives it. Byte 0 picks the negotiated
/// digests (bits 0-1) and the data limit (bits 2-3); the rest is the byte stream.
pub fn pdu(data: &[u8]) {
    let Some((&mode, mut stream)) = data.split_first() else {
        return;
    };
    let digests = Digests {
        header: mode & 1 != 0,
        data: mode & 2 != 0,
    };
    let limits = ParseLimits {
        max_data: PDU_MAX_DATA[usize::from(mode >> 2) & 3],
    };
    for _ in 0..MAX_PDUS_PER_INPUT {
        let parsed = tcp::parse(stream, digests, limits);
        check_data_head_agrees(stream, digests, limits, &parsed);
        let Ok(Some((p, used))) = parsed else {
            return;
        };
        assert!(
            used > 0 && used <= stream.len(),
            "consumed {used} of {}",
            stream.len()
        );
        // A complete PDU's prefixes are all "need more bytes": the errors the
        // parser reports come from the header, which a prefix shares.
        for cut in [used - 1, used / 2, tcp::COMMON_HEADER_LEN.min(used - 1)] {
            assert_eq!(
                tcp::parse(&stream[..cut], digests, limits),
                Ok(None),
                "prefix of {cut} of a {used}-byte PDU"
            );
        }
        reencode_pdu(&p, digests, limits);
        if let Pdu::CapsuleCmd { sqe, data, .. } = &p {
            check_sqe(sqe, data);
        }
        stream = &stream[used..];
    }
}

/// `parse_data_pdu_head` (the receive path's early look at a data PDU) must agree
/// with `parse` on everything both can see.
fn check_data_head_agrees(
    buf: &[u8],
    digests: Digests,
    limits: ParseLimits,
    parsed: &Result<Option<(Pdu<'_>, usize)>, tcp::PduError>,
) {
    let head = tcp::parse_data_pdu_head(buf, digests, limits);
    let is_data_type = matches!(
        buf.first(),
        Some(&tcp::pdu_type::H2C_DATA | &tcp::pdu_type::C2H_DATA)
    );
    match (parsed, &head) {
        (Err(e), h) if is_data_type => assert_eq!(h, &Err(*e), "parse failed, head did not"),
        (Ok(Some((p, used))), h) if is_data_type => {
            let Ok(Some(h)) = h else {
                panic!("parse gave a data PDU, parse_data_pdu_head gave {h:?}");
            };
            let (hdr, last, pdata) = match p {
                Pdu::H2CData {
                    hdr, last, data, ..
                } => (hdr, last, data),
                Pdu::C2HData {
                    hdr, last, data, ..
                } => (hdr, last, data),
                other => panic!("data PDU type parsed as {other:?}"),
            };
            assert_eq!((&h.hdr, &h.last, h.plen), (hdr, last, *used));
            assert_eq!(buf.get(h.pdo..h.pdo + h.data_len), Some(*pdata));
            assert!(h.pdo + h.data_len + h.ddgst <= h.plen);
        }
        // The head must not fail where the whole PDU parses or is merely short.
        (Ok(_), Err(e)) if !is_data_type => panic!("head failed on a non-data PDU: {e}"),
        (Ok(Some(_)), Ok(Some(_))) if !is_data_type => panic!("head accepted a non-data PDU"),
        _ => {}
    }
}

/// Encodes the parsed PDU again with the crate's own encoder and parses that:
/// the value must come back (round trip), with a correct data digest.
fn reencode_pdu(p: &Pdu<'_>, digests: Digests, limits: ParseLimits) {
    let mut out = Vec::new();
    let want: Pdu<'_> = match *p {
        Pdu::ICReq(r) => {
            tcp::encode_icreq(&mut out, &r);
            Pdu::ICReq(r)
        }
        Pdu::ICResp(r) => {
            tcp::encode_icresp(&mut out, &r);
            Pdu::ICResp(r)
        }
        Pdu::TermReq {
            from_host,
            fes,
            fei,
            data,
        } => {
            tcp::encode_term_req(&mut out, from_host, fes, fei, data);
            Pdu::TermReq {
                from_host,
                fes,
                fei,
                data,
            }
        }
        Pdu::CapsuleCmd { sqe, data, .. } => {
            tcp::encode_capsule_cmd(&mut out, &sqe, data, digests);
            Pdu::CapsuleCmd {
                sqe,
                data,
                data_digest_error: false,
            }
        }
        Pdu::CapsuleResp(cqe) => {
            tcp::encode_capsule_resp(&mut out, &cqe, digests);
            Pdu::CapsuleResp(cqe)
        }
        Pdu::H2CData {
            hdr, last, data, ..
        } => {
            let fl = if last { tcp::flags::LAST_PDU } else { 0 };
            tcp::encode_data_pdu(&mut out, true, &hdr, data, fl, digests, 0);
            Pdu::H2CData {
                hdr,
                last,
                data,
                data_digest_error: false,
            }
        }
        Pdu::C2HData {
            hdr,
            last,
            success,
            data,
            ..
        } => {
            let fl = (if last { tcp::flags::LAST_PDU } else { 0 })
                | (if success { tcp::flags::SUCCESS } else { 0 });
            tcp::encode_data_pdu(&mut out, false, &hdr, data, fl, digests, 0);
            Pdu::C2HData {
                hdr,
                last,
                success,
                data,
                data_digest_error: false,
            }
        }
        Pdu::R2T(hdr) => {
            tcp::encode_r2t(&mut out, &hdr, digests);
            Pdu::R2T(hdr)
        }
    };
    match tcp::parse(&out, digests, limits) {
        Ok(Some((got, used))) => {
            assert_eq!(used, out.len(), "re-encoded PDU not consumed whole");
            assert_eq!(got, want, "PDU does not survive encode → parse");
        }
        other => panic!("re-encoded {want:?} does not parse: {other:?}"),
    }
}

/// NVMe submission queue entry (64 bytes) followed by its data (Connect data,
/// Dataset Management ranges, or anything).
pub fn nvme_command(data: &[u8]) {
    let Some(sqe) = Sqe::from_slice(data) else {
        return;
    };
    check_sqe(&sqe, &data[SQE_LEN..]);
}

/// Decoders the target runs on a command capsule, each checked to round-trip.
fn check_sqe(sqe: &Sqe, data: &[u8]) {
    let _ = (sqe.opcode(), sqe.fuse(), sqe.nsid(), sqe.slba(), sqe.fua());
    let _ = DataDirection::of(sqe);
    assert!((1..=65536).contains(&sqe.nlb()));

    // Re-writing the SGL descriptor it decoded must decode the same.
    let sgl = sqe.sgl();
    let mut s2 = *sqe;
    s2.set_sgl(sgl);
    assert_eq!(s2.sgl(), sgl, "SGL descriptor does not survive set_sgl");
    check_sgl_views_agree(sqe);

    let cc = ConnectCommand::parse(sqe);
    assert_eq!(ConnectCommand::parse(&cc.encode(sqe.cid())), cc);
    let pc = PropertyCommand::parse(sqe);
    assert_eq!(PropertyCommand::parse(&pc.encode(sqe.fctype(), 0)), pc);
    let glp = GetLogPage::parse(sqe);
    assert_eq!(GetLogPage::parse(&glp.encode(sqe.cid(), sqe.nsid())), glp);
    check_ana_log(sqe, &glp, data);
    check_kv(sqe, data);
    check_reservation(sqe, data);

    if let Some(cd) = ConnectData::parse(data) {
        // Decoded strings are NUL-free and trimmed; any that fit the field
        // (255 bytes and the NUL) must come back unchanged.
        if cd.subnqn.len() < 256 && cd.hostnqn.len() < 256 {
            let enc = cd.encode();
            assert_eq!(enc.len(), CONNECT_DATA_LEN);
            assert_eq!(ConnectData::parse(&enc), Some(cd.clone()));
        }
        let _ = (validate_nqn(&cd.subnqn), validate_nqn(&cd.hostnqn));
    }
    // Dataset Management ranges: 16-byte records, byte-exact both ways.
    for chunk in data.chunks_exact(DSM_RANGE_LEN).take(256) {
        let r = DsmRange::decode(chunk);
        let mut b = [0u8; DSM_RANGE_LEN];
        r.encode(&mut b);
        assert_eq!(&b[..], chunk, "DSM range not byte-exact");
    }
    if let Some(cqe) = Cqe::decode(data) {
        let mut b = [0u8; CQE_LEN];
        cqe.encode(&mut b);
        assert_eq!(&b[..], &data[..CQE_LEN], "CQE not byte-exact");
        let _ = cqe.status().is_success();
    }
}

/// The KV command set decoder, as a KV namespace's queue runs it: under any
/// value size limit it must not panic, and whatever it accepts must encode to
/// a command it decodes the same. The capsule data, read as a List response
/// and as a KV Identify Namespace (what the initiator parses), must survive a
/// re-encode too.
fn check_kv(sqe: &Sqe, data: &[u8]) {
    let limit = data.first().map_or(u32::MAX, |&b| 1u32 << (b % 32));
    for max_value_size in [0, 4096, limit, u32::MAX] {
        if let Ok(cmd) = KvCommand::decode(sqe, max_value_size) {
            let again = KvCommand::decode(&cmd.encode(sqe.cid(), sqe.nsid()), max_value_size);
            assert_eq!(again, Ok(cmd), "KV command does not survive encode");
            if let Some(key) = cmd.key() {
                assert!(key.len() <= KV_KEY_MAX_LEN);
            }
        }
    }
    if let Ok(keys) = decode_list_response(data) {
        let (b, n) = encode_list_response(keys.iter(), data.len());
        assert_eq!(n as usize, keys.len(), "decoded keys do not fit again");
        assert_eq!(decode_list_response(&b), Ok(keys));
    }
    let id = KvIdentifyNamespace::decode(data);
    assert_eq!(KvIdentifyNamespace::decode(&id.encode()), id);
}

/// The reservation commands (Register, Acquire, Release) as the target
/// decodes them, run against a state with a registrant of each key in the
/// data: never a panic, a refused command changes nothing, and the
/// Reservation Status data (both formats) decodes to what was encoded.
fn check_reservation(sqe: &Sqe, data: &[u8]) {
    use kvt_nvmf::reservation::{
        decode_report, Acquire, HostId, Register, Registrant, Release, ResvState,
    };
    let host = HostId::extended([sqe.cid() as u8; 16]);
    let mut s = ResvState::default();
    for (i, k) in data.chunks_exact(8).take(8).enumerate() {
        let mut b = [0u8; 8];
        b.copy_from_slice(k);
        s.registrants.push(Registrant {
            host: HostId::extended([i as u8; 16]),
            key: u64::from_le_bytes(b),
            cntlid: i as u16,
        });
    }
    let before = s.clone();
    let cdw10 = sqe.cdw(10);
    let which = match sqe.opcode() {
        0x0D => 0,
        0x11 => 1,
        0x15 => 2,
        o => o % 3,
    };
    let r = match which {
        0 => Register::decode(cdw10, data).and_then(|c| s.register(host, 1, &c, true)),
        1 => Acquire::decode(cdw10, data).and_then(|c| s.acquire(host, &c)),
        _ => Release::decode(cdw10, data).and_then(|c| s.release(host, &c)),
    };
    if r.is_err() {
        assert_eq!(s, before, "a refused reservation command changed the state");
    }
    for eds in [false, true] {
        if let Ok(b) = s.report(eds) {
            let v = decode_report(&b, eds).expect("report decodes");
            assert_eq!(v.registrants.len(), s.registrants.len());
            assert_eq!(v.generation, s.generation);
        }
    }
    let _ = decode_report(data, sqe.cdw(11) & 1 != 0);
}

/// A controller of a subsystem that reports ANA: namespaces 1 and 2 in
/// group 1, 3 in group 5; its path has group 5 inaccessible. Built once.
fn ana_controller() -> &'static (Target, std::sync::Arc<Controller>) {
    use kvt_nvmf::ana::AnaState;
    use kvt_nvmf::{Namespace, Subsystem, SubsystemKind, TransportLimits};
    use std::sync::{Arc, OnceLock};
    static C: OnceLock<(Target, Arc<Controller>)> = OnceLock::new();
    C.get_or_init(|| {
        let t = Target::new(TransportLimits::default());
        let s = Arc::new(Subsystem::new(
            "nqn.f:ana",
            SubsystemKind::Nvm,
            "S",
            "M",
            true,
            vec![],
        ));
        s.ana
            .reporting
            .store(true, std::sync::atomic::Ordering::Release);
        for (nsid, grp) in [(1, 1), (2, 1), (3, 5)] {
            let dev = kvt_bdev::ram::RamDevice::new("f", 4096).expect("ram");
            let ns = Namespace::new("nqn.f:ana", nsid, dev, 512).with_ana_group(grp);
            s.add_namespace(Arc::new(ns)).expect("namespace");
        }
        t.add_subsystem(s.clone());
        let c = Arc::new(Controller::new(
            1,
            s.clone(),
            "nqn.h",
            [0; 16],
            0,
            "f".into(),
            std::time::Instant::now(),
        ));
        let l: std::net::SocketAddr = "127.0.0.1:4420".parse().expect("address");
        let _ = c.ana.path.set(s.ana.path(l));
        s.set_ana_state(l, Some(5), AnaState::Inaccessible)
            .expect("state");
        (t, c)
    })
}

/// Get Log Page for the ANA log page (LID 0Ch) with any LSP (RGO), RAE,
/// offset and length, as the admin queue runs it: a status or the page's
/// bytes at that offset, never a panic; the capsule data read as an ANA log
/// page (what a host parses) must survive a re-encode.
fn check_ana_log(sqe: &Sqe, glp: &GetLogPage, data: &[u8]) {
    use kvt_nvmf::admin::{execute, AdminOutcome};
    use kvt_nvmf::ana::{self, AnaLog};
    if let Some(log) = AnaLog::decode(data) {
        assert_eq!(AnaLog::decode(&log.encode()), Some(log));
    }
    if sqe.opcode() != admin_opc::GET_LOG_PAGE || glp.lid != ana::LID_ANA {
        return;
    }
    let (t, c) = ana_controller();
    let page = ana::log_page(c, glp.lsp & ana::LSP_RGO != 0).encode();
    match execute(t, c, sqe, 0, std::time::Instant::now()) {
        AdminOutcome::Done {
            status,
            data: Some(d),
            ..
        } => {
            assert!(status.is_success());
            let start = glp.offset as usize;
            assert!(
                start <= page.len() && start & 3 == 0,
                "offsets are dword-aligned"
            );
            let n = (page.len() - start).min(d.len());
            assert_eq!(d[..n], page[start..start + n]);
            assert!(d[n..].iter().all(|&b| b == 0));
        }
        AdminOutcome::Done { status, .. } => assert!(!status.is_success()),
        AdminOutcome::AsyncEventHeld => panic!("Get Log Page held"),
    }
}

/// `Sqe::sgl` (what the TCP path reads) and `rdma::DataDescriptor` (what the
/// RDMA path reads) decode the same 16 bytes: where both accept a descriptor
/// they must agree on where the data is and how long it is.
fn check_sgl_views_agree(sqe: &Sqe) {
    let sgl = sqe.sgl();
    match DataDescriptor::of(sqe) {
        Ok(DataDescriptor::None) => assert_eq!(sgl.length, 0),
        Ok(DataDescriptor::InCapsule { offset, len }) => {
            assert_eq!((sgl.address, sgl.length), (offset, len));
        }
        Ok(DataDescriptor::Keyed { addr, len, .. }) => {
            assert_eq!((sgl.address, sgl.length), (addr, len));
        }
        Err(_) => {}
    }
}

/// NVMe/RDMA: byte 0 picks the decoder (CM request, CM accept, keyed SGL in
/// an SQE); the rest is its input.
pub fn rdma(data: &[u8]) {
    let Some((&sel, b)) = data.split_first() else {
        return;
    };
    match sel % 3 {
        0 => {
            if let Ok(r) = CmRequest::parse(b) {
                let enc = r.encode();
                assert_eq!(CmRequest::parse(&enc), Ok(r));
                // Every field the parser read is written back in place (CNTLID
                // only when both of its bytes are there; else it reads as 0).
                let n = if b.len() >= 10 { 10 } else { 8 };
                assert_eq!(&enc[..n], &b[..n], "CM request fields not byte-exact");
            }
        }
        1 => {
            if let Some(crq) = rdma::parse_accept(b) {
                assert_eq!(rdma::parse_accept(&rdma::encode_accept(crq)), Some(crq));
            }
            let rej = rdma::encode_reject(u16::from_le_bytes([
                b.first().copied().unwrap_or(0),
                b.get(1).copied().unwrap_or(0),
            ]));
            assert_eq!(&rej[..2], &[0, 0], "reject carries RECFMT 0");
        }
        _ => {
            if let Ok(d) = DataDescriptor::decode(b) {
                let enc = d.encode();
                assert_eq!(DataDescriptor::decode(&enc), Ok(d));
                assert!(d.len() <= KEYED_MAX_LEN || matches!(d, DataDescriptor::InCapsule { .. }));
                if let DataDescriptor::Keyed { .. } = d {
                    assert_eq!(&enc[..], &b[..16], "keyed descriptor not byte-exact");
                }
            }
            if let Some(sqe) = Sqe::from_slice(b) {
                check_sgl_views_agree(&sqe);
            }
        }
    }
}

/// Pool metadata decoders: byte 0 picks superblock, checkpoint or journal
/// block header, checkpoint payload, or journal record list; the rest is its
/// input. Every decoded value must encode back (byte-exact where the format
/// has one encoding) and build an `Image` without panicking.
pub fn pool_format(data: &[u8]) {
    let Some((&sel, b)) = data.split_first() else {
        return;
    };
    match sel % 4 {
        0 => {
            if let Ok(sb) = Superblock::decode(b) {
                let enc = sb.encode();
                assert_eq!(Superblock::decode(&enc), Ok(sb.clone()));
                // Magic, version, uuid, seven u64 fields and one u32.
                assert_eq!(&enc[..88], &b[..88], "superblock fields not byte-exact");
                let _ = sb.extent_offset(sb.extent_count.saturating_sub(1));
            }
            // The epoch records of the block's second half (format 2).
            for off in kvt_meta::epoch::EPOCH_SLOTS {
                if let Some(Ok(Some(r))) = b.get(off..).map(kvt_meta::epoch::EpochRecord::decode) {
                    let enc = r.encode();
                    assert_eq!(
                        &enc[..],
                        &b[off..off + enc.len()],
                        "epoch record not byte-exact"
                    );
                }
            }
        }
        1 => {
            let magic = if sel & 4 != 0 {
                JOURNAL_MAGIC
            } else {
                CHECKPOINT_MAGIC
            };
            if let Ok(h) = BlockHeader::decode(magic, b, "fuzz header") {
                let mut enc = [0u8; HEADER_LEN];
                h.encode(magic, &mut enc);
                assert_eq!(BlockHeader::decode(magic, &enc, "fuzz header"), Ok(h));
                assert_eq!(&enc[..52], &b[..52], "block header fields not byte-exact");
                if let Ok(p) = format::unseal(&h, b, "fuzz block") {
                    let sealed = format::seal(magic, h, p);
                    assert_eq!(&sealed[..52], &b[..52], "sealed header differs");
                    assert_eq!(&sealed[HEADER_LEN..HEADER_LEN + p.len()], p);
                }
            }
        }
        2 => {
            if let Ok(c) = CheckpointData::decode(b) {
                assert_eq!(c.encode(), b, "checkpoint payload not byte-exact");
                image_round_trip(c, sel);
            }
        }
        _ => {
            if let Ok(records) = Record::decode_all(b, "fuzz journal entry") {
                let mut w = Writer::default();
                for r in &records {
                    r.encode(&mut w);
                }
                assert_eq!(w.b, b, "journal records not byte-exact");
                let mut img = Image::from_checkpoint(CheckpointData::default(), 64 << 10, 64);
                for r in records {
                    img.apply(r);
                }
                image_invariants(&img);
            }
        }
    }
}

/// Builds an `Image` from a checkpoint, then checks what recovery relies on:
/// the image's own checkpoint decodes again to an image with the same state.
fn image_round_trip(c: CheckpointData, sel: u8) {
    // Geometry from the selector's high bits: 64 KiB to 1 MiB extents, a
    // small extent count so `dirty` stays cheap.
    let extent_size = (64u64 << 10) << ((sel >> 2) & 3);
    let extent_count = 1 + u32::from(sel >> 4) * 16;
    let img = Image::from_checkpoint(c, extent_size, extent_count);
    image_invariants(&img);
    let again = img.to_checkpoint();
    let enc = again.encode();
    assert_eq!(CheckpointData::decode(&enc), Ok(again.clone()));
    let img2 = Image::from_checkpoint(again, extent_size, extent_count);
    // What the first image kept is consistent by construction, so rebuilding
    // from it finds nothing new to complain about except what ownership says.
    assert_eq!(img2.to_checkpoint(), img.to_checkpoint());
    assert!(
        img2.problems.is_empty(),
        "a rebuilt image found problems: {:?}",
        img2.problems
    );
}

fn image_invariants(img: &Image) {
    let (owner, _) = img.ownership();
    for p in owner.keys().chain(img.clean.iter()) {
        assert!(*p < img.extent_count, "extent {p} past the pool's end");
    }
    let _ = img.dirty();
    // KV keys are kept only for KV volumes; judging them never panics.
    for v in img.volumes.values() {
        assert!(
            v.kv.is_empty() || v.desc.flags & kvt_pool::format::VOL_KV != 0,
            "KV keys on a block volume"
        );
    }
    let _ = img.kv_problems();
}

/// `kvtarget check` on an image built from the input (see `image`): the same
/// `pool::check` the CLI runs, over a RAM device. It must report, not panic.
pub fn pool_check(data: &[u8]) {
    image::check(data);
}

/// The TOML configuration: `Config::parse` (parse + validation, as
/// `--config` and `check-config` use it). A configuration that validates must
/// save (`to_toml`, as `kvtarget_save_config` does) to text that parses back
/// to the same configuration.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(cfg) = Config::parse(text) else {
        return;
    };
    let saved = match cfg.to_toml() {
        Ok(s) => s,
        Err(e) => panic!("a valid configuration cannot be saved: {e}"),
    };
    match Config::parse(&saved) {
        Ok(back) => assert_eq!(back, cfg, "saved configuration parses differently"),
        Err(e) => panic!("saved configuration does not load: {e}\n{saved}"),
    }
}

/// Longest message one step of the `auth` harness sends: a Reply with ffdhe8192.
const AUTH_MAX_MESSAGE: usize = 16 + 2 * 64 + 1024;

/// DH-HMAC-CHAP: byte 0 picks what the rest is.
/// - 0: one host message (Authentication Send data): `HostMessage::parse`, and a
///   parsed message must survive encode -> parse unchanged.
/// - 1: one controller message (what a host reads back), the same.
/// - 2: a secret's text (`DhchapSecret::parse`); a parsed one must re-encode to
///   text that parses to the same secret.
/// - 3 and up: a transaction on one queue, the controller's side: steps of
///   `[op][len lo][len hi][data]`; op bit 0 picks Send (data = the message) or
///   Receive (len = the allocation length), bit 1 the DH group allowed (null or
///   ffdhe2048, so an execution stays cheap). No step may panic, and a finished
///   transaction stays finished.
pub fn auth(data: &[u8]) {
    use kvt_auth::DhchapSecret;
    use kvt_wire::nvme::{ControllerMessage, HostMessage};
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode {
        0 => {
            if let Ok(m) = HostMessage::parse(rest) {
                let again = m.encode();
                assert_eq!(HostMessage::parse(&again), Ok(m), "host message round trip");
            }
        }
        1 => {
            if let Ok(m) = ControllerMessage::parse(rest) {
                let again = m.encode();
                assert_eq!(
                    ControllerMessage::parse(&again),
                    Ok(m),
                    "controller message round trip"
                );
            }
        }
        2 => {
            let text = String::from_utf8_lossy(rest);
            if let Ok(s) = DhchapSecret::parse(&text) {
                assert_eq!(DhchapSecret::parse(&s.encode()), Ok(s), "secret round trip");
            }
        }
        // NVMe/TCP TLS PSKs (key files) and PSK identities (from the ClientHello).
        0x80 | 0x81 => tls_psk(mode, rest),
        _ => auth_transaction(mode, rest),
    }
}

/// NVMe/TCP TLS PSKs (key files, mode 0x80) and PSK identities (from the
/// ClientHello, 0x81).
fn tls_psk(mode: u8, rest: &[u8]) {
    use kvt_auth::TlsPsk;
    if mode == 0x81 {
        if let Some((_, host, sub)) = kvt_auth::psk::parse_identity(rest) {
            assert!(!host.is_empty() && !sub.is_empty() && !sub.contains(' '));
        }
        return;
    }
    let text = String::from_utf8_lossy(rest);
    if let Ok(k) = TlsPsk::parse(&text) {
        assert_eq!(TlsPsk::parse(&k.encode()), Ok(k.clone()), "PSK round trip");
        if let Ok(id) = k.identity("nqn.h", "nqn.s") {
            assert_eq!(
                k.tls_psk("nqn.h", &id).len(),
                if k.cipher_suite().name().ends_with("384") {
                    48
                } else {
                    32
                }
            );
        }
    }
}

/// A DH-HMAC-CHAP transaction on one queue, the controller's side (mode 3
/// and up; see `auth`).
fn auth_transaction(mode: u8, rest: &[u8]) {
    use kvt_auth::{AuthPolicy, DhGroup, DhchapSecret, Digest, Key};
    use kvt_nvmf::auth::{HostKeys, QueueAuth, DEFAULT_TIMEOUT};
    use kvt_wire::nvme::{AuthCommand, ControllerMessage};
    use std::sync::Arc;
    let secret = |b: u8, t| {
        DhchapSecret::new(&[b; 32], t)
            .map(|s| Arc::new(Key::from_text("k", &s.encode())))
            .ok()
    };
    let (Some(host), ctrl) = (secret(1, Some(Digest::Sha256)), secret(2, None)) else {
        return;
    };
    let group = if mode & 2 != 0 {
        DhGroup::Ffdhe2048
    } else {
        DhGroup::Null
    };
    let policy = AuthPolicy {
        dhgroups: 1 << group.id(),
        ..AuthPolicy::default()
    };
    let now = std::time::Instant::now();
    let mut a = QueueAuth::new(
        Some(HostKeys {
            dhchap_key: host,
            dhchap_ctrlr_key: ctrl,
        }),
        "nqn.2014-08.org.nvmexpress:uuid:fuzz",
        "nqn.2026-12.io.kvtarget:fuzz",
        0,
        policy,
        DEFAULT_TIMEOUT,
        now,
    );
    let mut input = rest;
    let mut steps = 0;
    while input.len() >= 3 && steps < 16 {
        let (op, len) = (input[0], u16::from_le_bytes([input[1], input[2]]) as usize);
        input = &input[3..];
        let had_failed = a.failed();
        if op & 1 == 0 {
            let n = len.min(input.len()).min(AUTH_MAX_MESSAGE);
            let (msg, tail) = input.split_at(n);
            a.send(&AuthCommand::dhchap(msg.len() as u32), msg, now);
            input = tail;
        } else {
            let step = a.receive(&AuthCommand::dhchap(len as u32), now);
            if let Some(d) = &step.data {
                assert!(d.len() <= len, "a reply longer than the allocation length");
                assert!(
                    ControllerMessage::parse(d).is_ok(),
                    "the controller sent what it cannot read"
                );
            }
        }
        assert!(
            !(had_failed && a.succeeded()),
            "a failed transaction succeeded"
        );
        if had_failed {
            assert!(a.failed(), "a failed transaction came back to life");
        }
        steps += 1;
    }
}

/// What etcd's JSON gateway (or whatever answers in its place) sends the
/// cluster thread: the HTTP answer split and de-chunked, then its body read as
/// every response the node decodes, and as a member record (another node's
/// JSON, a value in etcd).
pub fn etcd_answer(data: &[u8]) {
    use kvt_cluster::etcd::{
        decode, HeaderOnly, LeaseGrantResponse, LeaseKeepAliveResponse, RangeResponse,
        StreamResult, TxnResponse,
    };
    use kvt_cluster::http::{parse_answer, Answer};
    use kvt_cluster::member::MemberRecord;
    let Ok(a) = parse_answer(data) else {
        return;
    };
    let again = || Answer {
        status: a.status,
        body: a.body.clone(),
    };
    let _ = decode::<LeaseGrantResponse>("fuzz", "/v3/lease/grant", again());
    let _ = decode::<StreamResult<LeaseKeepAliveResponse>>("fuzz", "/v3/lease/keepalive", again());
    let _ = decode::<HeaderOnly>("fuzz", "/v3/kv/put", again());
    let _ = decode::<TxnResponse>("fuzz", "/v3/kv/txn", again());
    if let Ok(r) = decode::<RangeResponse>("fuzz", "/v3/kv/range", again()) {
        for kv in &r.kvs {
            let _ = serde_json::from_slice::<MemberRecord>(&kv.value);
        }
    }
    let _ = serde_json::from_slice::<MemberRecord>(&a.body);
}
