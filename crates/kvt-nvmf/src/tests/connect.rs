//! Fabrics Connect, held Connects, Disconnect, and what a queue refuses before it is connected.

use super::*;

// ---------------------------------------------------------------------------
// Fabrics Connect.

#[test]
fn connect_admin_queue_creates_a_controller() {
    let e = env();
    let mut a = e.conn(tcp_cfg());
    assert!(a.q.binding().is_none());
    let r = a.connect(0, 31, 0, 0xFFFF, SUBNQN);
    assert_status(&r, Status::SUCCESS);
    let cntlid = r.cqe.result as u16;
    assert_eq!(r.cqe.result >> 16, 0, "DW0 is the CNTLID alone");
    assert_eq!((r.cqe.cid, r.cqe.sq_id, r.close_after), (9, 0, false));
    assert!(r.data.is_empty());
    let ctrl = e.ctrl(cntlid);
    assert!(matches!(a.q.binding(), Some(QueueBinding::Admin(c)) if Arc::ptr_eq(c, &ctrl)));
    assert!(a.q.is_admin());
    assert_eq!((ctrl.hostnqn.as_str(), ctrl.hostid), (HOSTNQN, HOSTID));
    assert_eq!(a.stats().qid, 0);
    // Over TCP the controller does not advertise keyed SGLs.
    assert!(!ctrl.keyed_sgl.load(Ordering::Acquire));
}

#[test]
fn connect_refuses_an_unknown_subsystem() {
    let e = env();
    let mut a = e.conn(tcp_cfg());
    let r = a.connect(0, 31, 0, 0xFFFF, "nqn.2024-01.io.kvtarget:nobody");
    assert_status(&r, Status::CONNECT_INVALID_PARAMETERS);
    // IATTR 1 (Connect data), IPO 256 (SUBNQN).
    assert_eq!(r.cqe.result, 1 << 16 | 256);
    assert!(a.q.binding().is_none());
    assert_eq!(e.target.refused_other.load(Ordering::Relaxed), 1);
    assert_status(
        &a.exec(Sqe::new(admin_opc::KEEP_ALIVE, 2, 0)),
        Status::COMMAND_SEQUENCE_ERROR,
    );
}

#[test]
fn connect_refuses_a_host_not_on_the_list() {
    let e = env();
    let mut a = e.conn(tcp_cfg());
    let (sqe, data) = connect_cmd(
        4,
        0,
        31,
        0,
        0xFFFF,
        SUBNQN,
        "nqn.2024-01.io.kvtarget:intruder",
    );
    let r = a.exec_icd(sqe, &data);
    assert_status(&r, Status::CONNECT_INVALID_HOST);
    assert_eq!((r.cqe.result, r.cqe.cid), (0, 4));
    assert!(a.q.binding().is_none());
    assert_eq!(e.target.refused_host.load(Ordering::Relaxed), 1);
    assert!(e.subsys.controllers.lock().unwrap().is_empty());
}

#[test]
fn connect_to_an_nvm_subsystem_on_a_discovery_listener_is_refused() {
    let e = env();
    let cfg = QueueConfig {
        discovery_only: true,
        ..tcp_cfg()
    };
    let mut a = e.conn(cfg.clone());
    let r = a.connect(0, 31, 0, 0xFFFF, SUBNQN);
    assert_status(&r, Status::CONNECT_INVALID_PARAMETERS);
    assert_eq!(r.cqe.result, 1 << 16 | 256, "points at SUBNQN in the data");
    assert!(a.q.binding().is_none());
    assert!(e.subsys.controllers.lock().unwrap().is_empty());
    // The discovery subsystem itself is what that listener is for.
    let mut d = e.conn(cfg);
    assert_status(
        &d.connect(0, 31, 0, 0xFFFF, nvme::DISCOVERY_NQN),
        Status::SUCCESS,
    );
}

#[test]
fn connect_naming_another_qid_than_the_transport_is_refused() {
    let e = env();
    let mut a = e.conn(rdma_cfg(0));
    // The RDMA CM request named QID 0; the capsule says 1.
    let r = a.connect(1, 31, 0, 0xFFFF, SUBNQN);
    assert_status(&r, Status::CONNECT_INVALID_PARAMETERS);
    assert_eq!(r.cqe.sq_id, 0, "answered as the queue the transport set up");
    assert!(a.q.binding().is_none());
    assert!(e.subsys.controllers.lock().unwrap().is_empty());
}

#[test]
fn connect_qid_refusal_points_at_the_sqe_qid_field() {
    let e = env();
    let mut a = e.conn(rdma_cfg(0));
    let r = a.connect(1, 31, 0, 0xFFFF, SUBNQN);
    assert_status(&r, Status::CONNECT_INVALID_PARAMETERS);
    // As fabrics::connect reports a bad QID: IATTR 0 (the SQE), IPO 42.
    assert_eq!(r.cqe.result, 42);
}

#[test]
fn connect_sq_size_above_the_transports_entries_is_refused() {
    let e = env();
    let cfg = QueueConfig {
        max_entries: Some(16),
        ..rdma_cfg(0)
    };
    // SQSIZE is 0-based: 16 asks for 17 entries.
    let mut a = e.conn(cfg.clone());
    let r = a.connect(0, 16, 0, 0xFFFF, SUBNQN);
    assert_status(&r, Status::CONNECT_INVALID_PARAMETERS);
    assert!(a.q.binding().is_none());
    let mut b = e.conn(cfg);
    assert_status(&b.connect(0, 15, 0, 0xFFFF, SUBNQN), Status::SUCCESS);
}

#[test]
fn connect_sq_size_refusal_points_at_the_sqe_sqsize_field() {
    let e = env();
    let cfg = QueueConfig {
        max_entries: Some(16),
        ..rdma_cfg(0)
    };
    let mut a = e.conn(cfg);
    let r = a.connect(0, 16, 0, 0xFFFF, SUBNQN);
    assert_status(&r, Status::CONNECT_INVALID_PARAMETERS);
    // As fabrics::connect reports a bad SQSIZE: IATTR 0 (the SQE), IPO 44.
    assert_eq!(r.cqe.result, 44);
}

#[test]
fn connect_io_queue_joins_the_controller_by_cntlid() {
    let e = env();
    let mut a = e.conn(tcp_cfg());
    let cntlid = a.connect(0, 31, 0, 0xFFFF, SUBNQN).cqe.result as u16;
    let ctrl = e.ctrl(cntlid);
    // Not enabled yet: no I/O queues.
    let mut early = e.conn(tcp_cfg());
    assert_status(
        &early.connect(1, 31, 0, cntlid, SUBNQN),
        Status::COMMAND_SEQUENCE_ERROR,
    );
    assert_status(&a.exec(prop_set(1, prop::CC, CC_ENABLE)), Status::SUCCESS);
    // A CNTLID no controller has: IATTR 1, IPO 16 (CNTLID in the data).
    let mut wrong = e.conn(tcp_cfg());
    let r = wrong.connect(1, 31, 0, cntlid.wrapping_add(100), SUBNQN);
    assert_status(&r, Status::CONNECT_INVALID_PARAMETERS);
    assert_eq!(r.cqe.result, 1 << 16 | 16);

    let mut io = e.conn(tcp_cfg());
    let r = io.connect(1, 31, 0, cntlid, SUBNQN);
    assert_status(&r, Status::SUCCESS);
    assert_eq!((r.cqe.result, r.cqe.sq_id), (cntlid as u64, 1));
    match io.q.binding() {
        Some(QueueBinding::Io {
            ctrl: c, qid: 1, ..
        }) => assert!(Arc::ptr_eq(c, &ctrl)),
        _ => panic!("not bound as I/O queue 1"),
    }
    assert!(!io.q.is_admin());
    assert_eq!(ctrl.queue_ids(), vec![0, 1]);
    // The same QID twice: it waits for the holder to let go, and when that
    // does not happen in time, IATTR 0, IPO 42 (QID in the SQE).
    let refused = e.target.refused_other.load(Ordering::Relaxed);
    let mut dup = e.conn(tcp_cfg());
    let (sqe, data) = connect_cmd(9, 1, 31, 0, cntlid, SUBNQN, HOSTNQN);
    assert_eq!(
        dup.receive_raw(sqe, tcp_desc(&sqe), &data, false),
        Received::Done
    );
    assert!(dup.take().is_empty(), "waits while the ID is held");
    dup.advance(QID_RELEASE_WAIT / 2);
    assert_eq!(dup.housekeeping(), None);
    assert!(dup.take().is_empty(), "still inside the wait");
    assert_eq!(e.target.refused_other.load(Ordering::Relaxed), refused);
    // A second Connect on the same connection meanwhile is out of sequence.
    let (again, data) = connect_cmd(10, 1, 31, 0, cntlid, SUBNQN, HOSTNQN);
    assert_status(&dup.exec_icd(again, &data), Status::COMMAND_SEQUENCE_ERROR);
    dup.advance(QID_RELEASE_WAIT);
    assert_eq!(dup.housekeeping(), None);
    let r = dup.one();
    assert_status(&r, Status::CONNECT_INVALID_PARAMETERS);
    assert_eq!((r.cqe.result, r.cqe.cid), (42, 9));
    assert_eq!(e.target.refused_other.load(Ordering::Relaxed), refused + 1);
    assert!(dup.q.binding().is_none());
    // Closing the I/O queue gives its QID back.
    io.q.unbind();
    assert_eq!(ctrl.queue_ids(), vec![0]);
}

/// A host that closes a queue's connection and connects the same QID at once
/// (SPDK's initiator reconnecting a queue pair) can get there before the old
/// connection's close is seen: the Connect waits for it instead of failing.
#[test]
fn connect_waits_for_a_closing_queue_to_let_its_qid_go() {
    let e = env();
    let (_a, mut old) = e.pair();
    let cntlid = old.q.binding().unwrap().ctrl().cntlid;
    let mut new = e.conn(tcp_cfg());
    let (sqe, data) = connect_cmd(9, 1, 31, 0, cntlid, SUBNQN, HOSTNQN);
    assert_eq!(
        new.receive_raw(sqe, tcp_desc(&sqe), &data, false),
        Received::Done
    );
    assert!(new.take().is_empty());
    // The old connection's close reaches its reactor.
    old.q.unbind();
    new.advance(QID_RELEASE_WAIT / 4);
    assert_eq!(new.housekeeping(), None);
    let r = new.one();
    assert_status(&r, Status::SUCCESS);
    assert_eq!((r.cqe.result, r.cqe.sq_id), (cntlid as u64, 1));
    assert_eq!(new.q.binding().map(|b| b.qid()), Some(1));
    // The new queue serves I/O.
    assert!(zeros(&ok_data(new.read(1, 1, 0, 8))));
}

#[test]
fn connect_on_a_bound_queue_is_a_sequence_error() {
    let e = env();
    let (mut a, cntlid) = e.admin();
    let r = a.connect(0, 31, 0, 0xFFFF, SUBNQN);
    assert_status(&r, Status::COMMAND_SEQUENCE_ERROR);
    assert_eq!(e.subsys.controllers.lock().unwrap().len(), 1);
    assert_eq!(a.q.binding().unwrap().ctrl().cntlid, cntlid);
}

#[test]
fn connect_data_may_follow_r2t_but_must_come() {
    let e = env();
    // After R2T (the host did not put it in the capsule).
    let mut a = e.conn(tcp_cfg());
    let (mut sqe, data) = connect_cmd(3, 0, 31, 0, 0xFFFF, SUBNQN, HOSTNQN);
    sqe.set_sgl(host_sgl(CONNECT_DATA_LEN as u32));
    assert_status(&a.exec_h2c(sqe, &data), Status::SUCCESS);
    assert!(a.q.binding().is_some());
    // Without any data.
    let mut b = e.conn(tcp_cfg());
    let (mut sqe, _) = connect_cmd(3, 0, 31, 0, 0xFFFF, SUBNQN, HOSTNQN);
    sqe.set_sgl(SglDescriptor::default());
    assert_status(&b.exec(sqe), Status::DATA_SGL_LENGTH_INVALID);
    assert!(b.q.binding().is_none());
}

#[test]
fn connect_over_rdma_makes_identify_report_keyed_sgls() {
    let e = env();
    let (mut a, cntlid) = e.admin_with(rdma_cfg(0));
    assert!(e.ctrl(cntlid).keyed_sgl.load(Ordering::Acquire));
    let r = a.exec(identify(2, cns::CONTROLLER, 0));
    assert_status(&r, Status::SUCCESS);
    let id = IdentifyController::decode(&r.data);
    assert_eq!(id.sgls & 1 << 2, 1 << 2);
}
// ---------------------------------------------------------------------------
// Command sequence, fused commands, properties.

#[test]
fn commands_before_connect_are_sequence_errors() {
    let e = env();
    let mut a = e.conn(tcp_cfg());
    for sqe in [
        identify(1, cns::CONTROLLER, 0),
        Sqe::new(admin_opc::KEEP_ALIVE, 2, 0),
        prop_get(3, prop::CSTS),
        fabrics(4, fctype::DISCONNECT),
        // Refused before its data moves: `exec` checks `Received::Done`.
        rw(io_opc::WRITE, 5, 1, 0, 8),
    ] {
        let r = a.exec(sqe);
        assert_status(&r, Status::COMMAND_SEQUENCE_ERROR);
        assert_eq!((r.cqe.cid, r.data.len()), (sqe.cid(), 0));
    }
    assert!(a.q.binding().is_none());
    assert_eq!(a.q.dev_ops(), 0);
}

#[test]
fn fused_commands_are_refused() {
    let e = env();
    // Even a Connect: the queue stays unbound.
    let mut c = e.conn(tcp_cfg());
    let (mut sqe, data) = connect_cmd(1, 0, 31, 0, 0xFFFF, SUBNQN, HOSTNQN);
    sqe.0[1] |= 0x1;
    assert_status(&c.exec_icd(sqe, &data), Status::INVALID_FIELD);
    assert!(c.q.binding().is_none());

    let (mut a, mut io) = e.pair();
    let mut ka = Sqe::new(admin_opc::KEEP_ALIVE, 2, 0);
    ka.0[1] |= 0x1;
    assert_status(&a.exec(ka), Status::INVALID_FIELD);
    // A fused write is refused before any data moves.
    let mut w = rw(io_opc::WRITE, 3, 1, 0, 8);
    w.0[1] |= 0x2;
    assert_status(&io.exec(w), Status::INVALID_FIELD);
}
// ---------------------------------------------------------------------------
// Disconnect, controller teardown.

#[test]
fn disconnect_on_an_io_queue_is_answered_then_closes() {
    let e = env();
    let (_a, mut io) = e.pair();
    let before = io.read(1, 1, 0, 8);
    assert!(!before.close_after);
    let r = io.exec(fabrics(2, fctype::DISCONNECT));
    assert_status(&r, Status::SUCCESS);
    assert_eq!((r.cqe.cid, r.cqe.sq_id, r.close_after), (2, 1, true));
}

/// The host may connect the same QID as soon as it reads the Disconnect's
/// answer, before the old connection has closed; the old queue's later close
/// leaves the new one's QID alone.
#[test]
fn disconnect_frees_the_qid_before_the_answer() {
    let e = env();
    let (_a, mut old) = e.pair();
    let ctrl = old.q.binding().unwrap().ctrl().clone();
    assert_eq!(ctrl.queue_ids(), vec![0, 1]);
    assert_status(&old.exec(fabrics(2, fctype::DISCONNECT)), Status::SUCCESS);
    assert_eq!(ctrl.queue_ids(), vec![0]);
    let mut new = e.conn(tcp_cfg());
    assert_status(&new.connect(1, 31, 0, ctrl.cntlid, SUBNQN), Status::SUCCESS);
    old.q.unbind();
    assert_eq!(ctrl.queue_ids(), vec![0, 1]);
    assert!(zeros(&ok_data(new.read(1, 1, 0, 8))));
    new.q.unbind();
    assert_eq!(ctrl.queue_ids(), vec![0]);
}

#[test]
fn disconnect_on_the_admin_queue_is_invalid_field() {
    let e = env();
    let (mut a, cntlid) = e.admin();
    let r = a.exec(fabrics(1, fctype::DISCONNECT));
    assert_status(&r, Status::INVALID_FIELD);
    assert!(!r.close_after);
    assert!(!e.ctrl(cntlid).is_failed());
}
