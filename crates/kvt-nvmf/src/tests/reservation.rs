//! Reservations through the queues: two hosts (two host NQNs and Host
//! Identifiers) on one namespace, each with an admin and an I/O queue.

use super::*;
use crate::reservation::{decode_report, resv_opc, HostId, LID_RESERVATION_NOTIFICATION};
use kvt_wire::nvme::{io_opc, ConnectData, IdentifyController, CONNECT_DATA_LEN};

const HOST_B: &str = "nqn.2024-01.io.kvtarget:host-b";
const HOSTID_B: [u8; 16] = [0xB6; 16];

/// Connects `c` (queue `qid`, controller `cntlid`) as host B.
fn connect_b(c: &mut Conn, qid: u16, cntlid: u16) -> Sent {
    let (sqe, _) = connect_cmd(9, qid, 31, 0, cntlid, SUBNQN, HOST_B);
    let data = ConnectData {
        hostid: HOSTID_B,
        cntlid,
        subnqn: SUBNQN.into(),
        hostnqn: HOST_B.into(),
    }
    .encode();
    assert_eq!(data.len(), CONNECT_DATA_LEN);
    c.exec_icd(sqe, &data)
}

/// Host B's admin queue (controller enabled) and I/O queue 1.
fn pair_b(e: &Env) -> (Conn, Conn) {
    e.subsys.allow_any_host.store(true, Ordering::Release);
    let mut a = e.conn(tcp_cfg());
    let r = connect_b(&mut a, 0, 0xFFFF);
    assert_eq!(r.status(), Status::SUCCESS);
    let cntlid = r.cqe.result as u16;
    assert_eq!(
        a.exec(prop_set(1, prop::CC, CC_ENABLE)).status(),
        Status::SUCCESS
    );
    let mut io = e.conn(tcp_cfg());
    assert_eq!(connect_b(&mut io, 1, cntlid).status(), Status::SUCCESS);
    (a, io)
}

/// A reservation command with two keys (or one) in the capsule.
fn resv(c: &mut Conn, opc: u8, cdw10: u32, k1: u64, k2: u64) -> Status {
    let len = if opc == resv_opc::RELEASE { 8 } else { 16 };
    let mut d = k1.to_le_bytes().to_vec();
    d.extend_from_slice(&k2.to_le_bytes());
    d.truncate(len);
    let mut s = Sqe::new(opc, 3, 1);
    s.set_cdw(10, cdw10);
    s.set_sgl(icd_sgl(len as u32));
    c.exec_icd(s, &d).status()
}

fn report(c: &mut Conn, eds: bool) -> Sent {
    let mut s = Sqe::new(resv_opc::REPORT, 4, 1);
    s.set_cdw(10, 4096 / 4 - 1);
    s.set_cdw(11, u32::from(eds));
    s.set_sgl(host_sgl(4096));
    c.exec(s)
}

/// A one-block write; a conflicting one is refused before its data moves.
fn write1(c: &mut Conn) -> Status {
    let data = pattern(BS as usize, 1);
    match c.receive(rw(io_opc::WRITE, 5, 1, 0, 1)) {
        Received::NeedData { slot, .. } => {
            c.fill(slot, &data);
            c.data_ready(slot, false);
        }
        Received::Done => {}
        other => panic!("{other:?}"),
    }
    c.drain();
    c.one().status()
}

fn read1(c: &mut Conn) -> Status {
    c.read(6, 1, 0, 1).status()
}

const WE: u32 = 1 << 8;
const CONFLICT: Status = Status::RESERVATION_CONFLICT;

#[test]
fn write_exclusive_preempt_release_clear_between_two_hosts() {
    let e = env();
    let (mut admin_a, mut a) = e.pair();
    let (admin_b, mut b) = pair_b(&e);
    assert_eq!(resv(&mut a, resv_opc::REGISTER, 0, 0, 0xA), Status::SUCCESS);
    assert_eq!(resv(&mut b, resv_opc::REGISTER, 0, 0, 0xB), Status::SUCCESS);
    // A wrong key is refused; the right one acquires.
    assert_eq!(resv(&mut a, resv_opc::ACQUIRE, WE, 0xB, 0), CONFLICT);
    assert_eq!(resv(&mut a, resv_opc::ACQUIRE, WE, 0xA, 0), Status::SUCCESS);
    // Write Exclusive held by A: B reads, B's writes conflict, A writes.
    assert_eq!(write1(&mut b), CONFLICT);
    assert_eq!(read1(&mut b), Status::SUCCESS);
    assert_eq!(write1(&mut a), Status::SUCCESS);
    let r = report(&mut b, true);
    assert_eq!(r.status(), Status::SUCCESS);
    let v = decode_report(&r.data, true).unwrap();
    assert_eq!((v.generation, v.rtype, v.registrants.len()), (2, 1, 2));
    assert_eq!(v.registrants[0].2, HostId::extended(HOSTID));
    assert!(v.registrants[0].1 && !v.registrants[1].1);
    assert_eq!(
        report(&mut b, false).status(),
        crate::reservation::HOST_ID_INCONSISTENT_FORMAT,
        "128-bit host identifiers need the extended structure"
    );
    // B preempts A: A is unregistered and told so; now A's writes conflict.
    assert_eq!(
        resv(&mut b, resv_opc::ACQUIRE, 1 | WE, 0xB, 0xA),
        Status::SUCCESS
    );
    assert_eq!(write1(&mut a), CONFLICT);
    assert_eq!(write1(&mut b), Status::SUCCESS);
    let log = admin_a.exec(get_log(7, LID_RESERVATION_NOTIFICATION, 64, 0));
    assert_eq!(log.status(), Status::SUCCESS);
    assert_eq!(log.data[8], 1, "Registration Preempted");
    assert_eq!(&log.data[0..8], &1u64.to_le_bytes(), "log page count");
    assert_eq!(&log.data[12..16], &1u32.to_le_bytes(), "NSID");
    // Release: wrong key refused, then A may write again.
    assert_eq!(resv(&mut b, resv_opc::RELEASE, WE, 0xA, 0), CONFLICT);
    assert_eq!(resv(&mut b, resv_opc::RELEASE, WE, 0xB, 0), Status::SUCCESS);
    assert_eq!(write1(&mut a), Status::SUCCESS);
    // Clear: every registration goes.
    assert_eq!(resv(&mut a, resv_opc::REGISTER, 0, 0, 0xA), Status::SUCCESS);
    assert_eq!(
        resv(&mut a, resv_opc::ACQUIRE, 2 << 8, 0xA, 0),
        Status::SUCCESS
    );
    assert_eq!(read1(&mut b), CONFLICT, "Exclusive Access: B may not read");
    assert_eq!(resv(&mut b, resv_opc::RELEASE, 1, 0xB, 0), Status::SUCCESS);
    assert_eq!(read1(&mut b), Status::SUCCESS);
    let v = decode_report(&report(&mut a, true).data, true).unwrap();
    assert_eq!((v.rtype, v.registrants.len()), (0, 0));
    let log = admin_a.exec(get_log(8, LID_RESERVATION_NOTIFICATION, 64, 0));
    assert_eq!(log.data[8], 3, "Reservation Preempted by the clear");
    drop(admin_b);
}

#[test]
fn reserved_types_and_actions_are_invalid_field_and_change_nothing() {
    let e = env();
    let (_admin, mut a) = e.pair();
    assert_eq!(
        resv(&mut a, resv_opc::REGISTER, 3, 0, 1),
        Status::INVALID_FIELD
    );
    assert_eq!(resv(&mut a, resv_opc::REGISTER, 0, 0, 1), Status::SUCCESS);
    assert_eq!(
        resv(&mut a, resv_opc::ACQUIRE, 7 << 8, 1, 0),
        Status::INVALID_FIELD
    );
    assert_eq!(
        resv(&mut a, resv_opc::ACQUIRE, 0, 1, 0),
        Status::INVALID_FIELD
    );
    assert_eq!(
        resv(&mut a, resv_opc::RELEASE, 2, 1, 0),
        Status::INVALID_FIELD
    );
    // PTPL on a namespace without a PTPL file.
    assert_eq!(
        resv(&mut a, resv_opc::REGISTER, 2 | 3 << 30, 1, 2),
        Status::INVALID_FIELD
    );
    // Too little data for the keys.
    let mut s = Sqe::new(resv_opc::REGISTER, 3, 1);
    s.set_sgl(icd_sgl(8));
    assert_eq!(
        a.exec_icd(s, &[0; 8]).status(),
        Status::DATA_SGL_LENGTH_INVALID
    );
    let v = decode_report(&report(&mut a, true).data, true).unwrap();
    assert_eq!((v.generation, v.rtype, v.registrants[0].3), (1, 0, 1));
    // No namespace.
    let mut s = Sqe::new(resv_opc::REPORT, 4, 9);
    s.set_sgl(host_sgl(64));
    assert_eq!(a.exec(s).status(), Status::INVALID_NAMESPACE);
}

#[test]
fn identify_features_and_the_notification_mask() {
    let e = env();
    let (mut admin_a, mut a) = e.pair();
    let (_admin_b, mut b) = pair_b(&e);
    let id = admin_a.exec(identify(1, 1, 0));
    let oncs = IdentifyController::decode(&id.data).oncs;
    assert_ne!(oncs & (1 << 5), 0, "ONCS: reservations");
    let ns = admin_a.exec(identify(2, 0, 1));
    assert_eq!(ns.data[31], 0xFE, "RESCAP: all types, IEKEY, no PTPL");
    // Host Identifier: 128 bits from Connect; it cannot be set.
    let mut g = get_features(3, 0x81, 0);
    g.set_cdw(11, 1);
    g.set_sgl(host_sgl(16));
    let r = admin_a.exec(g);
    assert_eq!((r.status(), &r.data[..]), (Status::SUCCESS, &HOSTID[..]));
    let mut g = get_features(3, 0x81, 0);
    g.set_sgl(host_sgl(16));
    assert_eq!(
        admin_a.exec(g).status(),
        Status::INVALID_FIELD,
        "EXHID clear"
    );
    assert_eq!(
        admin_a.exec(set_features(4, 0x81, 1)).status(),
        Status::COMMAND_SEQUENCE_ERROR
    );
    // Mask Registration Preempted: A is preempted without a log entry.
    assert_eq!(
        admin_a.exec(set_features(5, 0x82, 0b10)).status(),
        Status::SUCCESS
    );
    assert_eq!(admin_a.exec(get_features(6, 0x82, 0)).cqe.result, 0b10);
    assert_eq!(resv(&mut a, resv_opc::REGISTER, 0, 0, 0xA), Status::SUCCESS);
    assert_eq!(resv(&mut b, resv_opc::REGISTER, 0, 0, 0xB), Status::SUCCESS);
    assert_eq!(
        resv(&mut b, resv_opc::ACQUIRE, 1 | WE, 0xB, 0xA),
        Status::SUCCESS
    );
    let log = admin_a.exec(get_log(7, LID_RESERVATION_NOTIFICATION, 64, 0));
    assert_eq!(log.data, vec![0u8; 64], "masked: nothing logged");
    // Reservation Persistence: PTPL off, and it cannot be turned on here.
    let mut g = get_features(8, 0x83, 0);
    g.0[4..8].copy_from_slice(&1u32.to_le_bytes());
    assert_eq!(admin_a.exec(g).cqe.result, 0);
    let mut s = set_features(9, 0x83, 1);
    s.0[4..8].copy_from_slice(&1u32.to_le_bytes());
    assert_eq!(admin_a.exec(s).status(), Status::INVALID_FIELD);
}

#[test]
fn a_change_with_ptpl_is_answered_once_the_file_is_durable() {
    let e = env();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ns2.json");
    let ns = Namespace::new(SUBNQN, 2, RamDevice::new("p", NS_BYTES).unwrap(), BS)
        .with_ptpl_file(file.clone())
        .unwrap();
    e.subsys.add_namespace(Arc::new(ns)).unwrap();
    let (_admin, mut a) = e.pair();
    let mut d = 0u64.to_le_bytes().to_vec();
    d.extend_from_slice(&0xAu64.to_le_bytes());
    let mut s = Sqe::new(resv_opc::REGISTER, 3, 2);
    s.set_cdw(10, 3 << 30);
    s.set_sgl(icd_sgl(16));
    assert_eq!(a.receive_raw(s, tcp_desc(&s), &d, false), Received::Done);
    a.drain();
    // Housekeeping answers it once the writer thread made the file durable.
    let mut sent = a.take();
    for _ in 0..500 {
        if !sent.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        a.housekeeping();
        sent = a.take();
    }
    assert_eq!(sent.len(), 1, "answered once");
    assert_eq!(sent[0].status(), Status::SUCCESS);
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("\"rkey\": 10"), "{text}");
    // Without PTPL on, a change that was never persisted is answered at once.
    let mut s = Sqe::new(resv_opc::REGISTER, 4, 1);
    s.set_sgl(icd_sgl(16));
    assert_eq!(a.exec_icd(s, &d).status(), Status::SUCCESS);
}

/// Preempt and Abort (RACQA 2) answers as Preempt: the preempted host is
/// unregistered, and its next command on a queue that had cached its
/// verdict gets Reservation Conflict.
#[test]
fn preempt_and_abort_leaves_the_preempted_host_in_conflict() {
    let e = env();
    let (_admin_a, mut a) = e.pair();
    let (_admin_b, mut b) = pair_b(&e);
    assert_eq!(resv(&mut a, resv_opc::REGISTER, 0, 0, 0xA), Status::SUCCESS);
    assert_eq!(resv(&mut b, resv_opc::REGISTER, 0, 0, 0xB), Status::SUCCESS);
    let ea = 2 << 8;
    assert_eq!(resv(&mut a, resv_opc::ACQUIRE, ea, 0xA, 0), Status::SUCCESS);
    // A's queue caches "A may write".
    assert_eq!(write1(&mut a), Status::SUCCESS);
    assert_eq!(write1(&mut a), Status::SUCCESS);
    assert_eq!(read1(&mut b), CONFLICT);
    assert_eq!(
        resv(&mut b, resv_opc::ACQUIRE, 2 | ea, 0xB, 0xA),
        Status::SUCCESS
    );
    assert_eq!(write1(&mut a), CONFLICT, "A was preempted");
    assert_eq!(read1(&mut a), CONFLICT);
    assert_eq!(write1(&mut b), Status::SUCCESS);
    let v = decode_report(&report(&mut b, true).data, true).unwrap();
    assert_eq!((v.rtype, v.registrants.len()), (2, 1));
    assert_eq!(v.registrants[0].2, HostId::extended(HOSTID_B));
}

/// A namespace removed and another added at the same NSID starts with its
/// own (idle) reservation state: no queue answers from the old verdict.
#[test]
fn a_namespace_added_again_at_the_same_nsid_has_no_stale_verdict() {
    let e = env();
    let (_admin_a, mut a) = e.pair();
    let (_admin_b, mut b) = pair_b(&e);
    assert_eq!(resv(&mut a, resv_opc::REGISTER, 0, 0, 0xA), Status::SUCCESS);
    assert_eq!(
        resv(&mut a, resv_opc::ACQUIRE, 2 << 8, 0xA, 0),
        Status::SUCCESS
    );
    assert_eq!(read1(&mut b), CONFLICT, "B's queue caches the conflict");
    assert!(e.subsys.remove_namespace(1).is_some());
    let ns = Namespace::new(SUBNQN, 1, RamDevice::new("n", NS_BYTES).unwrap(), BS);
    e.subsys.add_namespace(Arc::new(ns)).unwrap();
    assert_eq!(read1(&mut b), Status::SUCCESS);
    assert_eq!(write1(&mut b), Status::SUCCESS);
    // The new namespace's reservation (same epoch as the old one had)
    // is held by B now: A's queue must not reuse its old verdict.
    assert_eq!(resv(&mut b, resv_opc::REGISTER, 0, 0, 0xB), Status::SUCCESS);
    assert_eq!(
        resv(&mut b, resv_opc::ACQUIRE, 2 << 8, 0xB, 0),
        Status::SUCCESS
    );
    assert_eq!(read1(&mut a), CONFLICT);
    assert_eq!(read1(&mut b), Status::SUCCESS);
}

/// The queue's access check takes no lock once its verdict is cached:
/// another thread holds the namespace's reservation lock while host B's
/// queue answers reads and conflicting writes (a check that took the lock
/// would wait until the holder gives up, which the holder reports).
#[test]
fn a_held_reservation_is_checked_without_its_lock() {
    let e = env();
    let (_admin_a, mut a) = e.pair();
    let (_admin_b, mut b) = pair_b(&e);
    assert_eq!(resv(&mut a, resv_opc::REGISTER, 0, 0, 0xA), Status::SUCCESS);
    assert_eq!(resv(&mut a, resv_opc::ACQUIRE, WE, 0xA, 0), Status::SUCCESS);
    assert_eq!(write1(&mut b), CONFLICT, "caches B's verdict");
    let ns = e.subsys.namespace(1).unwrap();
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let _guard = ns.reservation.state.lock().unwrap();
        held_tx.send(()).unwrap();
        // Timed out: the queue waited for the lock.
        done_rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .is_err()
    });
    held_rx.recv().unwrap();
    for _ in 0..100 {
        assert_eq!(read1(&mut b), Status::SUCCESS);
        assert_eq!(write1(&mut b), CONFLICT);
    }
    // The holder is gone already when it timed out.
    let _ = done_tx.send(());
    assert!(!holder.join().unwrap(), "the access check took the lock");
}
