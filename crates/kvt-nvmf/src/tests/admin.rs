//! Property Get/Set, admin commands (Identify, Get Log Page, features, AERs) and keep-alive.

use super::*;

fn changed_ns(a: &mut Conn, cid: u16) -> Vec<u32> {
    nvme::decode_ns_list(&ok_data(a.exec(get_log(
        cid,
        lid::CHANGED_NS_LIST,
        4096,
        0,
    ))))
}
// ---------------------------------------------------------------------------
// Asynchronous events, command identifiers, queue overrun.

#[test]
fn property_get_reads_cap_vs_cc_and_csts() {
    let e = env();
    let mut a = e.conn(tcp_cfg());
    assert_status(&a.connect(0, 31, 0, 0xFFFF, SUBNQN), Status::SUCCESS);
    // MQES 127, CQR, TO 15 s, CSS NVM and I/O command sets (bits 37 and
    // 43): all 64 bits in the CQE result.
    let cap = ok(a.exec(prop_get(1, prop::CAP)));
    assert_eq!(cap, 0x820_1E01_007F);
    assert_eq!(cap, cap_register(128));
    assert_eq!(ok(a.exec(prop_get(2, prop::VS))), 0x0001_0400);
    assert_eq!(ok(a.exec(prop_get(3, prop::CC))), 0);
    assert_eq!(ok(a.exec(prop_get(4, prop::CSTS))), 0);
    assert_status(&a.exec(prop_get(5, 0x30)), Status::INVALID_FIELD);
}

#[test]
fn property_set_of_cc_enables_and_shuts_down_the_controller() {
    let e = env();
    let mut a = e.conn(tcp_cfg());
    let cntlid = a.connect(0, 31, 0, 0xFFFF, SUBNQN).cqe.result as u16;
    let ctrl = e.ctrl(cntlid);
    assert!(!ctrl.is_ready());
    assert_eq!(ok(a.exec(prop_set(1, prop::CC, CC_ENABLE))), 0);
    assert!(ctrl.is_ready());
    assert_eq!(ok(a.exec(prop_get(2, prop::CC))), CC_ENABLE);
    assert_eq!(ok(a.exec(prop_get(3, prop::CSTS))), csts::RDY as u64);
    // Normal shutdown notification: done at once.
    ok(a.exec(prop_set(4, prop::CC, CC_ENABLE | 1 << 14)));
    assert_eq!(
        ok(a.exec(prop_get(5, prop::CSTS))),
        (csts::RDY | csts::SHST_COMPLETE) as u64
    );
    // Only CC is writable.
    assert_status(&a.exec(prop_set(6, prop::CSTS, 1)), Status::INVALID_FIELD);
    // Clearing EN resets: admin commands wait for CC.EN again.
    ok(a.exec(prop_set(7, prop::CC, 0)));
    assert_eq!(ok(a.exec(prop_get(8, prop::CSTS))), 0);
    assert_status(
        &a.exec(identify(9, cns::CONTROLLER, 0)),
        Status::COMMAND_SEQUENCE_ERROR,
    );
}

#[test]
fn admin_commands_before_cc_en_are_sequence_errors_except_keep_alive() {
    let e = env();
    let mut a = e.conn(tcp_cfg());
    assert_status(&a.connect(0, 31, 0, 0xFFFF, SUBNQN), Status::SUCCESS);
    for sqe in [
        identify(1, cns::CONTROLLER, 0),
        get_features(2, fid::KEEP_ALIVE_TIMER, 0),
        get_log(3, lid::SMART_HEALTH, 512, 0),
        // Answered, not held.
        Sqe::new(admin_opc::ASYNC_EVENT_REQUEST, 4, 0),
    ] {
        assert_status(&a.exec(sqe), Status::COMMAND_SEQUENCE_ERROR);
    }
    assert!(a.q.aers.is_empty());
    assert_status(
        &a.exec(Sqe::new(admin_opc::KEEP_ALIVE, 5, 0)),
        Status::SUCCESS,
    );
    ok(a.exec(prop_set(6, prop::CC, CC_ENABLE)));
    assert_eq!(ok_data(a.exec(identify(7, cns::CONTROLLER, 0))).len(), 4096);
}

#[test]
fn properties_are_invalid_opcodes_on_io_queues() {
    let e = env();
    let (_a, mut io) = e.pair();
    assert_status(&io.exec(prop_get(1, prop::CSTS)), Status::INVALID_OPCODE);
    assert_status(
        &io.exec(prop_set(2, prop::CC, CC_ENABLE)),
        Status::INVALID_OPCODE,
    );
}
// ---------------------------------------------------------------------------
// Admin commands.

#[test]
fn identify_controller_describes_the_controller() {
    let e = env();
    let (mut a, cntlid) = e.admin();
    let id = IdentifyController::decode(&ok_data(a.exec(identify(1, cns::CONTROLLER, 0))));
    assert_eq!(id.cntlid, cntlid);
    assert_eq!(
        (id.subnqn.as_str(), id.serial.as_str(), id.model.as_str()),
        (SUBNQN, "SERIAL1", "MODEL1")
    );
    assert_eq!((id.cntrltype, id.mdts, id.maxcmd, id.nn), (1, 8, 128, 1024));
    assert_eq!(id.ioccsz, (64 + 8192) / 16);
    assert_eq!(id.sgls & 1 << 2, 0, "no keyed SGLs over TCP");
    assert_eq!(id.oaes, AEC_NS_ATTR);
}

#[test]
fn identify_namespace_active_inactive_and_invalid() {
    let e = env();
    let (mut a, _) = e.admin();
    let ns = IdentifyNamespace::decode(&ok_data(a.exec(identify(1, cns::NAMESPACE, 1))));
    assert_eq!((ns.nsze, ns.ncap, ns.lbads), (NS_BLOCKS, NS_BLOCKS, 9));
    assert_eq!(ns.nguid, e.subsys.namespace(1).unwrap().nguid);
    // An inactive NSID in range: a zeroed structure.
    let inactive = ok_data(a.exec(identify(2, cns::NAMESPACE, 5)));
    assert_eq!(inactive.len(), 4096);
    assert!(inactive.iter().all(|&b| b == 0));
    for (cid, nsid) in [(3, 0), (4, 0xFFFF_FFFF), (5, 1025)] {
        assert_status(
            &a.exec(identify(cid, cns::NAMESPACE, nsid)),
            Status::INVALID_NAMESPACE,
        );
    }
}

#[test]
fn identify_lists_descriptors_and_csi_structures() {
    let e = env();
    let ns3 = e.add_ram_ns(3);
    let (mut a, _) = e.admin();
    let list = |a: &mut Conn, cid, cns_v, nsid, csi: u32| {
        let mut s = identify(cid, cns_v, nsid);
        s.set_cdw(11, csi << 24);
        a.exec(s)
    };
    let ids = |r: Sent| nvme::decode_ns_list(&ok_data(r));
    assert_eq!(ids(list(&mut a, 1, cns::ACTIVE_NS_LIST, 0, 0)), vec![1, 3]);
    assert_eq!(ids(list(&mut a, 2, cns::ACTIVE_NS_LIST, 1, 0)), vec![3]);
    assert_eq!(
        ids(list(&mut a, 3, cns::CSI_ACTIVE_NS_LIST, 0, 0)),
        vec![1, 3]
    );
    assert_status(
        &list(&mut a, 4, cns::CSI_ACTIVE_NS_LIST, 0, 2),
        Status::INVALID_FIELD,
    );
    assert_status(
        &list(&mut a, 5, cns::ACTIVE_NS_LIST, 0xFFFF_FFFE, 0),
        Status::INVALID_NAMESPACE,
    );

    let d = nvme::decode_ns_descriptors(&ok_data(a.exec(identify(6, cns::NS_DESCRIPTOR_LIST, 3))));
    assert_eq!(
        d,
        vec![
            (nidt::EUI64, ns3.eui64.to_vec()),
            (nidt::NGUID, ns3.nguid.to_vec()),
            (nidt::UUID, ns3.uuid.to_vec()),
            (nidt::CSI, vec![0]),
        ]
    );
    assert_status(
        &a.exec(identify(7, cns::NS_DESCRIPTOR_LIST, 9)),
        Status::INVALID_NAMESPACE,
    );

    let zeros = |r: Sent| {
        let d = ok_data(r);
        d.len() == 4096 && d.iter().all(|&b| b == 0)
    };
    assert!(zeros(list(&mut a, 8, cns::CSI_NAMESPACE, 1, 0)));
    assert!(zeros(list(&mut a, 9, cns::CSI_CONTROLLER, 0, 0)));
    assert_status(
        &list(&mut a, 10, cns::CSI_NAMESPACE, 9, 0),
        Status::INVALID_NAMESPACE,
    );
    assert_status(&list(&mut a, 11, 0x42, 0, 0), Status::INVALID_FIELD);
}

#[test]
fn admin_data_is_cut_to_the_sgl_length() {
    let e = env();
    let (mut a, _) = e.admin();
    let full = ok_data(a.exec(identify(1, cns::CONTROLLER, 0)));
    assert_eq!(full.len(), 4096);
    let short = ok_data(a.exec(admin_c2h(
        admin_opc::IDENTIFY,
        2,
        0,
        cns::CONTROLLER as u32,
        100,
    )));
    assert_eq!(short, full[..100]);
    // NUMD asks for 512 bytes, the SGL has room for 64.
    let mut smart = get_log(3, lid::SMART_HEALTH, 512, 0);
    smart.set_sgl(host_sgl(64));
    assert_eq!(ok_data(a.exec(smart)).len(), 64);
    // No data descriptor at all: answered, nothing sent with it.
    let mut bare = identify(4, cns::CONTROLLER, 0);
    bare.set_sgl(SglDescriptor::default());
    assert_eq!(ok_data(a.exec(bare)).len(), 0);
}

#[test]
fn get_log_page_serves_smart_firmware_and_commands_supported() {
    let e = env();
    let (mut a, mut io) = e.pair();
    ok(io.write(1, 1, 0, &pattern(4096, 1)));
    ok(io.read(2, 1, 0, 8));
    ok(io.read(3, 1, 8, 8));

    let smart = SmartLog::decode(&ok_data(a.exec(get_log(1, lid::SMART_HEALTH, 512, 0))));
    assert_eq!((smart.host_reads, smart.host_writes), (2, 1));
    // Thousands of 512-byte units, rounded up: 16 and 8 units.
    assert_eq!((smart.data_units_read, smart.data_units_written), (1, 1));
    assert_eq!(
        (
            smart.available_spare,
            smart.power_cycles,
            smart.error_log_entries
        ),
        (100, 1, 0)
    );

    let fw = ok_data(a.exec(get_log(2, lid::FIRMWARE_SLOT, 512, 0)));
    assert_eq!((fw.len(), fw[0]), (512, 1));
    let name = e.target.firmware.as_bytes();
    let n = name.len().min(8);
    assert_eq!(&fw[8..8 + n], &name[..n]);
    assert!(fw[8 + n..16].iter().all(|&b| b == b' '));

    let cs = ok_data(a.exec(get_log(3, lid::COMMANDS_SUPPORTED, 4096, 0)));
    assert_eq!(u32_at(&cs, admin_opc::IDENTIFY as usize * 4), 1);
    assert_eq!(u32_at(&cs, 0x7E * 4), 0);
    assert_eq!(u32_at(&cs, 1024 + io_opc::READ as usize * 4), 1);
    // Write changes logical block content (LBCC).
    assert_eq!(u32_at(&cs, 1024 + io_opc::WRITE as usize * 4), 0b11);

    // An offset into the page, in dwords.
    let tail = ok_data(a.exec(get_log(4, lid::COMMANDS_SUPPORTED, 8, 1024 + 4)));
    assert_eq!(tail, cs[1028..1036]);
    assert_status(
        &a.exec(get_log(5, lid::SMART_HEALTH, 8, 2)),
        Status::INVALID_FIELD,
    );
    assert_status(&a.exec(get_log(6, 0x7F, 512, 0)), Status::INVALID_LOG_PAGE);
    // The discovery log is a discovery controller's.
    assert_status(
        &a.exec(get_log(7, lid::DISCOVERY, 4096, 0)),
        Status::INVALID_LOG_PAGE,
    );
}

#[test]
fn error_log_records_failed_io_newest_first() {
    let e = env();
    e.add_ns(2, Arc::new(FailingDevice));
    let (mut a, mut io) = e.pair();
    assert_status(
        &io.read(0x21, 1, NS_BLOCKS - 1, 2),
        Status::LBA_OUT_OF_RANGE,
    );
    assert_status(
        &io.write(0x22, 2, 16, &pattern(4096, 2)),
        Status::WRITE_FAULT,
    );
    let r = io.read(0x23, 2, 32, 8);
    assert_status(&r, Status::UNRECOVERED_READ_ERROR);
    assert!(r.data.is_empty(), "no data with a failed read");

    let log = ok_data(a.exec(get_log(1, lid::ERROR_INFO, 4 * 64, 0)));
    let entry = |i: usize| ErrorLogEntry::decode(&log[i * 64..(i + 1) * 64]);
    let (e0, e1, e2) = (entry(0), entry(1), entry(2));
    assert_eq!(
        (e0.error_count, e0.sqid, e0.cid, e0.nsid, e0.lba),
        (3, 1, 0x23, 2, 32)
    );
    assert_eq!(e0.status, Status::UNRECOVERED_READ_ERROR.to_field());
    assert_eq!(e0.trtype, nvme::trtype::TCP);
    assert_eq!((e1.error_count, e1.cid, e1.nsid, e1.lba), (2, 0x22, 2, 16));
    assert_eq!(e1.status, Status::WRITE_FAULT.to_field());
    assert_eq!((e2.error_count, e2.cid, e2.nsid), (1, 0x21, 1));
    assert_eq!(e2.status, Status::LBA_OUT_OF_RANGE.to_field());
    assert_eq!(entry(3), ErrorLogEntry::default(), "only three errors");

    let smart = SmartLog::decode(&ok_data(a.exec(get_log(2, lid::SMART_HEALTH, 512, 0))));
    assert_eq!((smart.error_log_entries, smart.media_errors), (3, 2));
}

#[test]
fn discovery_controller_serves_the_discovery_log() {
    let e = env();
    let mut d = e.conn(tcp_cfg());
    assert_status(
        &d.connect(0, 31, 0, 0xFFFF, nvme::DISCOVERY_NQN),
        Status::SUCCESS,
    );
    ok(d.exec(prop_set(1, prop::CC, CC_ENABLE)));
    let page = ok_data(d.exec(get_log(2, lid::DISCOVERY, 4096, 0)));
    let (genctr, entries) = nvme::decode_discovery_log(&page);
    // One bump at creation, one for the subsystem.
    assert_eq!(genctr, 2);
    let names: Vec<(&str, u8)> = entries
        .iter()
        .map(|x| (x.subnqn.as_str(), x.subtype))
        .collect();
    assert_eq!(
        names,
        vec![
            (nvme::DISCOVERY_NQN, nvme::subtype::CURRENT_DISCOVERY),
            (SUBNQN, nvme::subtype::NVME)
        ]
    );
    let id = IdentifyController::decode(&ok_data(d.exec(identify(3, cns::CONTROLLER, 0))));
    assert_eq!(id.cntrltype, 2);
    assert_status(
        &d.exec(identify(4, cns::NAMESPACE, 1)),
        Status::INVALID_FIELD,
    );
    assert_status(
        &d.exec(get_log(5, lid::SMART_HEALTH, 512, 0)),
        Status::INVALID_LOG_PAGE,
    );
    assert_status(
        &d.exec(Sqe::new(admin_opc::ABORT, 6, 0)),
        Status::INVALID_OPCODE,
    );
}

/// A discovery controller connected and enabled, with the Discovery Log
/// Page Change event enabled and one AER held.
fn discovery_admin(e: &Env) -> Conn {
    let mut d = e.conn(tcp_cfg());
    assert_status(
        &d.connect(0, 31, 0, 0xFFFF, nvme::DISCOVERY_NQN),
        Status::SUCCESS,
    );
    ok(d.exec(prop_set(1, prop::CC, CC_ENABLE)));
    let id = IdentifyController::decode(&ok_data(d.exec(identify(2, cns::CONTROLLER, 0))));
    assert_eq!(
        id.oaes, AEC_DISCOVERY_LOG,
        "discovery log change notices only"
    );
    ok(d.exec(set_features(3, fid::ASYNC_EVENT_CONFIG, AEC_DISCOVERY_LOG)));
    assert_eq!(d.housekeeping(), None);
    assert_eq!(d.receive(aer(0x50)), Received::Done);
    assert_eq!(d.housekeeping(), None);
    assert!(d.take().is_empty(), "no change yet");
    d
}

fn discovery_genctr(d: &mut Conn, cid: u16) -> u64 {
    nvme::decode_discovery_log(&ok_data(d.exec(get_log(cid, lid::DISCOVERY, 4096, 0)))).0
}

#[test]
fn a_discovery_log_change_completes_the_discovery_controllers_aer() {
    let e = env();
    let mut d = discovery_admin(&e);
    let before = discovery_genctr(&mut d, 4);
    let peer = Listener {
        addr: "127.0.0.2:8009".parse().unwrap(),
        discovery_only: true,
        portid: 0,
        rdma: false,
        secure: false,
    };
    assert!(e.target.set_referrals(vec![peer.clone()]));
    assert!(
        !e.target.set_referrals(vec![peer]),
        "the same peers: no change"
    );
    assert_eq!(d.housekeeping(), None);
    let r = d.one();
    // Notice, Discovery Log Page Change, log page 70h.
    assert_eq!((r.slot, r.cqe.cid, r.cqe.result), (None, 0x50, 0x0070_F002));
    assert_eq!(r.cqe.result, AEN_DISCOVERY_LOG_CHANGED as u64);
    // Masked until the host reads the log; then the next change is reported.
    assert_eq!(d.receive(aer(0x50)), Received::Done);
    e.target.set_referrals(Vec::new());
    d.housekeeping();
    assert!(d.take().is_empty(), "masked until the log is read");
    assert_eq!(discovery_genctr(&mut d, 5), before + 2);
    d.housekeeping();
    assert!(d.take().is_empty(), "the host has seen this generation");
    // A local change (a subsystem added) raises it the same way.
    e.target.add_subsystem(Arc::new(Subsystem::new(
        "nqn.other",
        SubsystemKind::Nvm,
        "S",
        "M",
        true,
        vec![],
    )));
    d.housekeeping();
    assert_eq!(d.one().cqe.result, AEN_DISCOVERY_LOG_CHANGED as u64);
}

#[test]
fn a_discovery_log_change_with_the_event_disabled_is_not_reported_later() {
    let e = env();
    let mut d = discovery_admin(&e);
    ok(d.exec(set_features(6, fid::ASYNC_EVENT_CONFIG, 0)));
    e.target.add_subsystem(Arc::new(Subsystem::new(
        "nqn.other",
        SubsystemKind::Nvm,
        "S",
        "M",
        true,
        vec![],
    )));
    d.housekeeping();
    ok(d.exec(set_features(7, fid::ASYNC_EVENT_CONFIG, AEC_DISCOVERY_LOG)));
    d.housekeeping();
    assert!(d.take().is_empty(), "the change counted as seen");
}

#[test]
fn get_and_set_features() {
    let e = env();
    let (mut a, cntlid) = e.admin();
    // 3 SQs and 5 CQs asked: min(3, 5) + 1 = 4 granted (0-based in DW0).
    assert_eq!(
        ok(a.exec(set_features(1, fid::NUMBER_OF_QUEUES, 2 | 4 << 16))),
        2 | 2 << 16
    );
    assert_eq!(
        ok(a.exec(get_features(2, fid::NUMBER_OF_QUEUES, 0))),
        2 | 2 << 16
    );
    assert_eq!(ok(a.exec(set_features(3, fid::KEEP_ALIVE_TIMER, 5000))), 0);
    assert_eq!(ok(a.exec(get_features(4, fid::KEEP_ALIVE_TIMER, 0))), 5000);
    assert_eq!(e.ctrl(cntlid).kato_ms.load(Ordering::Relaxed), 5000);
    ok(a.exec(set_features(5, fid::VOLATILE_WRITE_CACHE, 0)));
    assert_eq!(ok(a.exec(get_features(6, fid::VOLATILE_WRITE_CACHE, 0))), 0);
    // SEL 1: the default (enabled); SEL 3: capabilities, changeable.
    assert_eq!(ok(a.exec(get_features(7, fid::VOLATILE_WRITE_CACHE, 1))), 1);
    assert_eq!(
        ok(a.exec(get_features(8, fid::VOLATILE_WRITE_CACHE, 3))),
        1 << 2
    );
    ok(a.exec(set_features(9, fid::ASYNC_EVENT_CONFIG, AEC_NS_ATTR)));
    assert_eq!(
        ok(a.exec(get_features(10, fid::ASYNC_EVENT_CONFIG, 0))),
        AEC_NS_ATTR as u64
    );
    assert_eq!(
        ok(a.exec(get_features(11, fid::TEMPERATURE_THRESHOLD, 0))),
        0xFFFF
    );
    assert_status(
        &a.exec(set_features(12, fid::KEEP_ALIVE_TIMER | 0x80, 0)),
        Status::INVALID_FIELD,
    );
    let mut save = set_features(13, fid::KEEP_ALIVE_TIMER, 1000);
    save.set_cdw(10, save.cdw(10) | 1 << 31);
    assert_status(&a.exec(save), Status::FEATURE_NOT_SAVEABLE);
    assert_status(
        &a.exec(set_features(14, fid::ARBITRATION, 0)),
        Status::FEATURE_NOT_CHANGEABLE,
    );
    assert_status(&a.exec(get_features(15, 0x7E, 0)), Status::INVALID_FIELD);
    assert_status(
        &a.exec(get_features(16, fid::ARBITRATION, 4)),
        Status::INVALID_FIELD,
    );
    // The queue count is fixed once an I/O queue exists.
    let _io = e.io_with(tcp_cfg(), cntlid, 1);
    assert_status(
        &a.exec(set_features(17, fid::NUMBER_OF_QUEUES, 7 | 7 << 16)),
        Status::COMMAND_SEQUENCE_ERROR,
    );
}

#[test]
fn keep_alive_and_abort_are_answered_at_once() {
    let e = env();
    let (mut a, _) = e.admin();
    let r = a.exec(Sqe::new(admin_opc::KEEP_ALIVE, 1, 0));
    assert_eq!(
        (r.status(), r.cqe.result, r.data.len()),
        (Status::SUCCESS, 0, 0)
    );
    let mut abort = Sqe::new(admin_opc::ABORT, 2, 0);
    abort.set_cdw(10, 1 | 0x55 << 16);
    // DW0 bit 0: the command was not aborted.
    assert_eq!(ok(a.exec(abort)), 1);
}

#[test]
fn unknown_and_bidirectional_admin_opcodes_are_refused() {
    let e = env();
    let (mut a, _) = e.admin();
    assert_status(&a.exec(Sqe::new(0xC0, 1, 0)), Status::INVALID_OPCODE);
    assert_status(&a.exec(Sqe::new(0x10, 2, 0)), Status::INVALID_OPCODE);
    // Opcode bits 1:0 = 11b: data both ways, which no fabric carries.
    assert_status(&a.exec(Sqe::new(0xC3, 3, 0)), Status::INVALID_FIELD);
    // Fabrics command types this target does not have.
    assert_status(&a.exec(fabrics(4, 0x0C)), Status::INVALID_OPCODE);
    // Authentication Receive that is not DH-HMAC-CHAP (SECP 0).
    assert_status(
        &a.exec(fabrics(5, fctype::AUTH_RECV)),
        Status::INVALID_FIELD,
    );
}

#[test]
fn aer_is_held_until_a_namespace_change_completes_it() {
    let e = env();
    let (mut a, _) = e.admin();
    ok(a.exec(set_features(1, fid::ASYNC_EVENT_CONFIG, AEC_NS_ATTR)));
    assert_eq!(a.receive(aer(0x40)), Received::Done);
    assert!(a.take().is_empty(), "held, not answered");
    assert_eq!(a.q.requests_mut().count(), 0, "a held AER takes no slot");
    assert_eq!(a.housekeeping(), None);
    assert!(a.take().is_empty(), "no event yet");

    e.add_ram_ns(2);
    assert_eq!(a.housekeeping(), None);
    let r = a.one();
    assert_eq!(r.slot, None, "an AER completes unslotted");
    assert_status(&r, Status::SUCCESS);
    // Notice, Namespace Attribute Changed, log page 04h.
    assert_eq!(
        (r.cqe.cid, r.cqe.result, r.cqe.sq_id),
        (0x40, 0x0004_0002, 0)
    );
    assert_eq!(r.cqe.result, AEN_NS_ATTR_CHANGED as u64);
    assert_eq!(a.housekeeping(), None);
    assert!(a.take().is_empty(), "one event, one completion");

    // The host sends its next AER with the same CID; until it reads the log,
    // further changes are masked.
    assert_eq!(a.receive(aer(0x40)), Received::Done);
    assert!(a.take().is_empty(), "not a CID conflict");
    e.add_ram_ns(3);
    a.housekeeping();
    assert!(a.take().is_empty(), "masked until the log is read");
    assert_eq!(changed_ns(&mut a, 2), vec![2, 3]);
    assert_eq!(changed_ns(&mut a, 3), Vec::<u32>::new(), "read clears it");
    e.subsys.remove_namespace(2);
    a.housekeeping();
    let r = a.one();
    assert_eq!((r.slot, r.cqe.cid, r.cqe.result), (None, 0x40, 0x0004_0002));
    assert_eq!(changed_ns(&mut a, 4), vec![2]);
}

#[test]
fn aers_beyond_the_limit_are_refused() {
    let e = env();
    let (mut a, _) = e.admin();
    assert_eq!(MAX_AERS, 4);
    for cid in 1..=4 {
        assert_eq!(a.receive(aer(cid)), Received::Done);
    }
    assert!(a.take().is_empty());
    assert_status(&a.exec(aer(5)), Status::ASYNC_EVENT_LIMIT);
    assert_eq!(a.q.aers, vec![1, 2, 3, 4]);
}

#[test]
fn housekeeping_fails_the_controller_when_keep_alive_expires() {
    let e = env();
    let (mut a, mut io) = e.pair();
    let cntlid = a.q.binding().unwrap().ctrl().cntlid;
    assert_eq!(a.housekeeping(), None, "KATO 0: never expires");
    ok(a.exec(set_features(1, fid::KEEP_ALIVE_TIMER, 1000)));
    // KATO 1 s and its grace (1 s): alive at 2 s, failed just after.
    a.advance(std::time::Duration::from_millis(2000));
    assert_eq!(a.housekeeping(), None);
    assert!(!e.ctrl(cntlid).is_failed());
    a.advance(std::time::Duration::from_millis(2));
    assert_eq!(a.housekeeping(), Some("controller failed"));
    assert!(e.ctrl(cntlid).is_failed());
    // Every queue of the controller closes.
    assert_eq!(io.housekeeping(), Some("controller failed"));
}

#[test]
fn unbinding_the_admin_queue_deletes_the_controller() {
    let e = env();
    let (mut a, mut io) = e.pair();
    let ctrl = a.q.binding().unwrap().ctrl().clone();
    a.q.unbind();
    assert!(a.q.binding().is_none());
    assert!(ctrl.is_failed());
    assert!(e.subsys.controllers.lock().unwrap().is_empty());
    assert_eq!(io.housekeeping(), Some("controller failed"));
}
