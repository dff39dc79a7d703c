//! What a queue keeps: command IDs, slots, the SQ head, and its statistics.

use super::*;

fn ok_slot(r: Sent) -> u16 {
    assert_status(&r, Status::SUCCESS);
    r.slot.expect("slotted response")
}

#[test]
fn cid_conflict_is_answered_unslotted_without_disturbing_the_owner() {
    let e = env();
    let (_a, mut io) = e.pair();
    let data = pattern(4096, 3);
    let Received::NeedData { slot, .. } = io.receive(rw(io_opc::WRITE, 9, 1, 0, 8)) else {
        panic!("write did not ask for its data");
    };
    assert_eq!(io.receive(rw(io_opc::READ, 9, 1, 0, 8)), Received::Done);
    let r = io.one();
    assert_eq!(r.slot, None);
    assert_status(&r, Status::CID_CONFLICT);
    assert_eq!((r.cqe.cid, r.cqe.sq_id), (9, 1));
    let owner = io.q.request(slot).expect("the owner keeps its slot");
    assert_eq!(
        (owner.phase, owner.sqe.opcode()),
        (Phase::Moving, io_opc::WRITE)
    );
    assert_eq!(io.stats().errors.load(Ordering::Relaxed), 0);

    io.fill(slot, &data);
    io.data_ready(slot, false);
    io.drain();
    let r = io.one();
    assert_eq!((r.slot, r.cqe.cid), (Some(slot), 9));
    assert_status(&r, Status::SUCCESS);
    // Answered: the CID is free again.
    assert_eq!(ok_data(io.read(9, 1, 0, 8)), data);
}

#[test]
fn a_held_aers_cid_may_be_reused() {
    let e = env();
    let (mut a, _) = e.admin();
    assert_eq!(a.receive(aer(3)), Received::Done);
    // SPDK's host completes its AERs itself at shutdown and reuses the CID.
    let r = a.exec(prop_get(3, prop::CSTS));
    assert_status(&r, Status::SUCCESS);
    assert_eq!((r.cqe.cid, r.cqe.result), (3, csts::RDY as u64));
}

#[test]
fn reusing_a_held_aers_cid_abandons_that_aer() {
    let e = env();
    let (mut a, _) = e.admin();
    ok(a.exec(set_features(1, fid::ASYNC_EVENT_CONFIG, AEC_NS_ATTR)));
    assert_eq!(a.receive(aer(3)), Received::Done);
    assert_status(
        &a.exec(Sqe::new(admin_opc::KEEP_ALIVE, 3, 0)),
        Status::SUCCESS,
    );
    e.add_ram_ns(2);
    a.housekeeping();
    // The host already considers CID 3 done twice over: no third completion.
    assert_eq!(a.take(), vec![], "the abandoned AER completed");
}

#[test]
fn an_aer_reusing_a_held_aers_cid_replaces_it() {
    let e = env();
    let (mut a, _) = e.admin();
    assert_eq!(a.receive(aer(3)), Received::Done);
    assert_eq!(a.receive(aer(3)), Received::Done);
    assert!(a.take().is_empty());
    assert_eq!(a.q.aers, vec![3], "one AER per CID");
}

#[test]
fn more_commands_outstanding_than_queue_entries_is_an_overrun() {
    let e = env();
    let (_a, cntlid) = e.admin();
    let mut io = e.conn(tcp_cfg());
    // SQSIZE 3: four entries.
    assert_status(&io.connect(1, 3, 0, cntlid, SUBNQN), Status::SUCCESS);
    let mut slots = Vec::new();
    for cid in 1..=4 {
        match io.receive(rw(io_opc::WRITE, cid, 1, 0, 8)) {
            Received::NeedData { slot, .. } => slots.push(slot),
            other => panic!("cid {cid}: {other:?}"),
        }
    }
    slots.sort_unstable();
    assert_eq!(slots, vec![0, 1, 2, 3]);
    assert_eq!(io.receive(rw(io_opc::WRITE, 5, 1, 0, 8)), Received::Overrun);
    assert!(io.take().is_empty(), "an overrun is not answered");
    // The refused command did not keep its CID.
    io.fill(slots[0], &pattern(4096, 0));
    io.data_ready(slots[0], false);
    io.drain();
    ok(io.one());
    assert!(matches!(
        io.receive(rw(io_opc::WRITE, 5, 1, 0, 8)),
        Received::NeedData { .. }
    ));
    assert!(io.take().is_empty(), "no CID conflict");
}
// ---------------------------------------------------------------------------
// Slots held by the transport, abandoned commands.

#[test]
fn a_held_slot_is_not_reused_until_released() {
    let e = env();
    let (_a, mut io) = e.pair();
    // Every freed slot is discarded; count from here.
    io.link.discarded.clear();
    io.link.hold = true;
    let flush = |cid| Sqe::new(io_opc::FLUSH, cid, 1);
    let s1 = ok_slot(io.exec(flush(1)));
    assert_eq!(io.q.request(s1).map(|r| r.phase), Some(Phase::Responding));
    let s2 = ok_slot(io.exec(flush(2)));
    // Answered, so the host may reuse CID 1 while its slot is still held.
    let s3 = ok_slot(io.exec(flush(1)));
    assert!(s1 != s2 && s3 != s1 && s3 != s2, "{s1} {s2} {s3}");
    assert!(io.link.discarded.is_empty(), "held slots are not freed");

    io.link.hold = false;
    io.release(s1);
    assert_eq!(io.link.discarded, vec![s1]);
    assert!(io.q.request(s1).is_none());
    // Released now, so `Release::Now` frees it at once.
    assert_eq!(
        ok_slot(io.exec(flush(4))),
        s1,
        "the released slot is reused"
    );
    assert_eq!(io.link.discarded, vec![s1, s1]);
    // Releasing a free slot changes nothing.
    io.release(s1);
    assert_eq!(io.link.discarded, vec![s1, s1]);
    assert_eq!(ok_slot(io.exec(flush(5))), s1);
    // The other two are still held.
    assert_eq!(io.q.request(s2).map(|r| r.phase), Some(Phase::Responding));
    assert_eq!(io.q.request(s3).map(|r| r.phase), Some(Phase::Responding));
}

#[test]
fn abandoning_a_moving_command_frees_its_slot_and_cid() {
    let e = env();
    let (_a, mut io) = e.pair();
    let Received::NeedData { slot, .. } = io.receive(rw(io_opc::WRITE, 5, 1, 0, 8)) else {
        panic!("no data request");
    };
    io.fill(slot, &pattern(4096, 2));
    io.link.discarded.clear();
    io.abandon(slot);
    assert_eq!(io.link.discarded, vec![slot]);
    assert!(io.q.request(slot).is_none());
    assert!(io.take().is_empty(), "an abandoned command is not answered");
    // Late data for it goes nowhere.
    io.data_ready(slot, false);
    assert_eq!(io.q.dev_ops(), 0);
    assert!(io.take().is_empty());
    // Its CID and slot are free.
    match io.receive(rw(io_opc::WRITE, 5, 1, 0, 8)) {
        Received::NeedData { slot: s, .. } => assert_eq!(s, slot),
        other => panic!("{other:?}: {:?}", io.take()),
    }
    assert!(io.take().is_empty(), "no CID conflict");
    assert!(zeros(&ok_data(io.read(6, 1, 0, 8))));
}
// ---------------------------------------------------------------------------
// SQ head.

#[test]
fn sq_head_advances_per_command_and_wraps_at_sqsize() {
    let e = env();
    let mut a = e.conn(tcp_cfg());
    // SQSIZE 3: heads run 0..=3.
    let h0 = a.connect(0, 3, 0, 0xFFFF, SUBNQN).cqe.sq_head;
    let heads: Vec<u16> = (1..=9)
        .map(|cid| a.exec(Sqe::new(admin_opc::KEEP_ALIVE, cid, 0)).cqe.sq_head)
        .collect();
    let want: Vec<u16> = (1..=9).map(|i| (h0 + i) % 4).collect();
    assert_eq!(heads, want);
    assert!(heads.iter().all(|&h| h <= 3));
    // A conflicting command took an entry too (CID 20 is a write's, waiting
    // for its data).
    ok(a.exec(prop_set(10, prop::CC, CC_ENABLE)));
    let mut w = set_features(20, fid::VOLATILE_WRITE_CACHE, 1);
    w.set_sgl(host_sgl(512));
    assert!(matches!(a.receive(w), Received::NeedData { .. }));
    a.receive(Sqe::new(admin_opc::KEEP_ALIVE, 20, 0));
    let r = a.one();
    assert_status(&r, Status::CID_CONFLICT);
    assert_eq!(r.cqe.sq_head, (h0 + 12) % 4);
}

#[test]
fn the_connect_response_counts_the_connect_in_sq_head() {
    let e = env();
    let mut a = e.conn(tcp_cfg());
    assert_eq!(a.connect(0, 3, 0, 0xFFFF, SUBNQN).cqe.sq_head, 1);
    assert_eq!(a.exec(Sqe::new(admin_opc::KEEP_ALIVE, 1, 0)).cqe.sq_head, 2);
}

#[test]
fn sq_head_is_ffff_when_the_host_disables_sq_flow_control() {
    let e = env();
    let mut a = e.conn(tcp_cfg());
    let r = a.connect(0, 31, CATTR_DISABLE_SQ_FLOW, 0xFFFF, SUBNQN);
    assert_status(&r, Status::SUCCESS);
    assert_eq!(r.cqe.sq_head, 0xFFFF, "already in the Connect response");
    ok(a.exec(prop_set(1, prop::CC, CC_ENABLE)));
    for cid in 2..6 {
        assert_eq!(
            a.exec(Sqe::new(admin_opc::KEEP_ALIVE, cid, 0)).cqe.sq_head,
            0xFFFF
        );
    }
    // Unslotted responses too.
    ok(a.exec(set_features(6, fid::ASYNC_EVENT_CONFIG, AEC_NS_ATTR)));
    a.receive(aer(7));
    e.add_ram_ns(2);
    a.housekeeping();
    assert_eq!(a.one().cqe.sq_head, 0xFFFF);
    // Without the attribute, the head is reported.
    let mut b = e.conn(tcp_cfg());
    b.connect(0, 31, 0, 0xFFFF, SUBNQN);
    assert_ne!(b.exec(prop_get(1, prop::CSTS)).cqe.sq_head, 0xFFFF);
}
// ---------------------------------------------------------------------------
// Accounting.

#[test]
fn qpair_stats_count_reads_writes_and_errors() {
    let e = env();
    let (a, mut io) = e.pair();
    let st = io.stats();
    let v = |x: &std::sync::atomic::AtomicU64| x.load(Ordering::Relaxed);
    // The Connect itself is an "other" command of the queue.
    assert_eq!((v(&st.other), v(&st.reads), v(&st.writes)), (1, 0, 0));
    ok(io.write(1, 1, 0, &pattern(4096, 1)));
    ok(io.write(2, 1, 8, &pattern(4096, 2)));
    ok(io.read(3, 1, 0, 16));
    assert_status(&io.read(4, 1, NS_BLOCKS, 1), Status::LBA_OUT_OF_RANGE);
    assert_status(
        &io.exec(rw(io_opc::WRITE, 5, 9, 0, 8)),
        Status::INVALID_NAMESPACE,
    );
    ok(io.exec(Sqe::new(io_opc::FLUSH, 6, 1)));
    assert_eq!((v(&st.reads), v(&st.read_bytes)), (1, 8192));
    assert_eq!((v(&st.writes), v(&st.write_bytes)), (2, 8192));
    assert_eq!((v(&st.errors), v(&st.other)), (2, 2));
    // By kind: invalid_namespace, lba_out_of_range.
    assert_eq!((v(&st.errors_by[0]), v(&st.errors_by[2])), (1, 1));
    assert_eq!(st.errors_by.iter().map(v).sum::<u64>(), 2);
    assert_eq!(st.read_hist.iter().map(v).sum::<u64>(), 1);
    assert_eq!(st.write_hist.iter().map(v).sum::<u64>(), 2);

    // The controller's SMART counters see the same traffic.
    let ctrl = io.q.binding().unwrap().ctrl().clone();
    let c = ctrl.io_totals();
    assert_eq!(
        (c.read_cmds, c.write_cmds, c.read_bytes, c.write_bytes),
        (1, 2, 8192, 8192)
    );
    assert_eq!(ctrl.error_count(), 2);

    // A digest failure is an error of kind "other"; the admin queue's
    // counters are its own.
    let w = icd_write(7, 1, 0, 512);
    io.receive_raw(w, tcp_desc(&w), &pattern(512, 3), true);
    assert_eq!(io.one().status(), TRANSIENT_TRANSPORT_ERROR);
    assert_eq!((v(&st.errors), v(&st.errors_by[7])), (3, 1));
    let ast = a.stats();
    assert_eq!((v(&ast.reads), v(&ast.writes), v(&ast.errors)), (0, 0, 0));
    // Connect and Property Set.
    assert_eq!(v(&ast.other), 2);
}
