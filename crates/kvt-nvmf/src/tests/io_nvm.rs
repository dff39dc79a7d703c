//! The NVM command set through a queue: reads, writes, Flush, DSM, Write Zeroes, FUA, and namespaces coming and going.

use super::*;

impl IoChannel for FuaChannel {
    fn submit(&mut self, tag: u64, op: IoOp, _now: Instant) -> Result<(), (IoOp, i32)> {
        if let IoOp::Write { fua, .. } = &op {
            self.0.lock().unwrap().push(*fua);
        }
        self.1.push(IoCompletion {
            tag,
            result: Ok(()),
            buf: op.into_buf(),
        });
        Ok(())
    }
    fn flush_submissions(&mut self) {}
    fn poll(&mut self, out: &mut Vec<IoCompletion>, _now: Instant) -> usize {
        let n = self.1.len();
        out.append(&mut self.1);
        n
    }
    fn in_flight(&self) -> usize {
        self.1.len()
    }
    fn completion_fd(&self) -> Option<RawFd> {
        None
    }
}

impl BlockDevice for FuaRecorder {
    fn describe(&self) -> String {
        "fua-recorder".into()
    }
    fn size_bytes(&self) -> u64 {
        NS_BYTES
    }
    fn open_channel(&self) -> std::io::Result<Box<dyn IoChannel>> {
        Ok(Box::new(FuaChannel(self.0.clone(), Vec::new())))
    }
    fn sync(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn volatile(&self) -> bool {
        true
    }
}

struct FuaChannel(Arc<std::sync::Mutex<Vec<bool>>>, Vec<IoCompletion>);
// ---------------------------------------------------------------------------
// A device that records whether each write it got was FUA, and completes it.

#[derive(Default)]
struct FuaRecorder(Arc<std::sync::Mutex<Vec<bool>>>);

fn dsm(cid: u16, ranges: &[(u64, u32)], deallocate: bool) -> (Sqe, Vec<u8>) {
    let mut list = vec![0u8; ranges.len() * 16];
    for (i, &(slba, nlb)) in ranges.iter().enumerate() {
        DsmRange {
            attributes: 0,
            nlb,
            slba,
        }
        .encode(&mut list[i * 16..(i + 1) * 16]);
    }
    let mut s = Sqe::new(io_opc::DATASET_MANAGEMENT, cid, 1);
    s.set_cdw(10, ranges.len() as u32 - 1);
    s.set_cdw(11, if deallocate { DSM_ATTR_DEALLOCATE } else { 0 });
    s.set_sgl(icd_sgl(list.len() as u32));
    (s, list)
}

#[test]
fn write_after_r2t_then_read_round_trips() {
    let e = env();
    let (_a, mut io) = e.pair();
    let data = pattern(4096, 7);
    let w = io.write(1, 1, 8, &data);
    assert_status(&w, Status::SUCCESS);
    assert_eq!((w.cqe.cid, w.cqe.sq_id, w.data.len()), (1, 1, 0));
    let r = io.read(2, 1, 8, 8);
    assert_eq!((r.cqe.cid, r.cqe.sq_id), (2, 1));
    assert_eq!(ok_data(r), data);
    // Only the blocks written changed.
    assert!(zeros(&ok_data(io.read(3, 1, 0, 8))));
    assert!(zeros(&ok_data(io.read(4, 1, 16, 8))));
    // Half of what was written, from its middle.
    assert_eq!(ok_data(io.read(5, 1, 10, 4)), data[1024..3072]);
}

#[test]
fn in_capsule_write_round_trips() {
    let e = env();
    let (_a, mut io) = e.pair();
    let data = pattern(4096, 9);
    assert_status(
        &io.exec_icd(icd_write(1, 1, 100, 4096), &data),
        Status::SUCCESS,
    );
    assert_eq!(ok_data(io.read(2, 1, 100, 8)), data);
}

#[test]
fn reads_over_rdma_go_to_the_buffer_the_transport_placed() {
    let e = env();
    let (_a, cntlid) = e.admin_with(rdma_cfg(0));
    let mut io = e.io_with(rdma_cfg(1), cntlid, 1);
    let data = pattern(4096, 11);
    ok(io.exec_icd(icd_write(1, 1, 40, 4096), &data));

    let Received::NeedData {
        slot,
        len: 4096,
        dir: DataDirection::ControllerToHost,
    } = io.receive(rw(io_opc::READ, 2, 1, 40, 8))
    else {
        panic!("a read over RDMA waits for its buffer");
    };
    assert_eq!(
        io.q.dev_ops(),
        0,
        "nothing runs before the buffer is placed"
    );
    let placed = IoBuf::new(8192);
    let at = placed.as_ptr() as usize;
    io.q.request_mut(slot).unwrap().buf = Some(placed);
    io.data_ready(slot, false);
    io.drain();
    let r = io.one();
    assert_eq!(r.data_ptr, Some(at), "sent from the placed buffer");
    assert_eq!(ok_data(r), data);

    // A transport that did not place one has failed, not the host.
    let Received::NeedData { slot, .. } = io.receive(rw(io_opc::READ, 3, 1, 40, 8)) else {
        panic!("no buffer request");
    };
    io.data_ready(slot, false);
    io.drain();
    assert_status(&io.one(), Status::INTERNAL_ERROR);
}

#[test]
fn reads_over_tcp_run_at_once() {
    let e = env();
    let (_a, mut io) = e.pair();
    let data = pattern(4096, 12);
    ok(io.write(1, 1, 0, &data));
    assert_eq!(io.receive(rw(io_opc::READ, 2, 1, 0, 8)), Received::Done);
    assert_eq!(io.q.dev_ops(), 1, "submitted without a data request");
    assert!(io.take().is_empty(), "answered when the device completes");
    io.drain();
    assert_eq!(io.q.dev_ops(), 0);
    assert_eq!(ok_data(io.one()), data);
}

#[test]
fn lba_out_of_range_fails_before_any_data_moves() {
    let e = env();
    let (_a, mut io) = e.pair();
    // `exec` asserts `Received::Done`: no data was asked for.
    assert_status(
        &io.exec(rw(io_opc::WRITE, 1, 1, NS_BLOCKS - 1, 2)),
        Status::LBA_OUT_OF_RANGE,
    );
    assert_status(&io.read(2, 1, NS_BLOCKS, 1), Status::LBA_OUT_OF_RANGE);
    assert_status(&io.read(3, 1, u64::MAX, 1), Status::LBA_OUT_OF_RANGE);
    let mut wz = Sqe::new(io_opc::WRITE_ZEROES, 4, 1);
    wz.set_cdw(10, (NS_BLOCKS - 4) as u32);
    wz.set_cdw(12, 7);
    assert_status(&io.exec(wz), Status::LBA_OUT_OF_RANGE);
    // The last block is in range.
    ok(io.write(5, 1, NS_BLOCKS - 1, &pattern(512, 1)));
    assert_eq!(io.q.dev_ops(), 0);
}

#[test]
fn invalid_namespace_fails_before_any_data_moves() {
    let e = env();
    let (_a, mut io) = e.pair();
    assert_status(
        &io.exec(rw(io_opc::WRITE, 1, 7, 0, 8)),
        Status::INVALID_NAMESPACE,
    );
    assert_status(&io.read(2, 0, 0, 8), Status::INVALID_NAMESPACE);
    assert_status(
        &io.exec(Sqe::new(io_opc::FLUSH, 3, 7)),
        Status::INVALID_NAMESPACE,
    );
}

#[test]
fn unknown_and_bidirectional_io_opcodes_are_invalid_opcodes() {
    let e = env();
    let (_a, mut io) = e.pair();
    // On I/O queues the NVM command check comes first: 03h (bits 1:0 = 11b,
    // bidirectional) is no NVM command. The admin queue's check of the
    // direction itself is in `unknown_and_bidirectional_admin_opcodes_are_refused`.
    for (cid, opc) in [(1, 0x03), (2, 0x83), (3, 0x04), (4, 0xC0)] {
        let mut s = Sqe::new(opc, cid, 1);
        s.set_sgl(host_sgl(512));
        assert_status(&io.exec(s), Status::INVALID_OPCODE);
    }
}

#[test]
fn flush_of_nsid_ffffffff_flushes_every_namespace() {
    let e = env();
    e.add_ram_ns(2);
    e.add_ram_ns(3);
    let (_a, mut io) = e.pair();
    assert_eq!(
        io.receive(Sqe::new(io_opc::FLUSH, 1, 0xFFFF_FFFF)),
        Received::Done
    );
    assert_eq!(io.q.dev_ops(), 3, "one flush per namespace");
    assert!(io.take().is_empty());
    io.drain();
    ok(io.one());
    assert_eq!(io.receive(Sqe::new(io_opc::FLUSH, 2, 2)), Received::Done);
    assert_eq!(io.q.dev_ops(), 1);
    io.drain();
    ok(io.one());
}

#[test]
fn dsm_deallocate_zeroes_its_ranges() {
    let e = env();
    let (_a, mut io) = e.pair();
    let a = pattern(8192, 15);
    let b = pattern(4096, 16);
    ok(io.write(1, 1, 0, &a));
    ok(io.write(2, 1, 64, &b));

    // A bad range (past the end) means no range is used.
    let (s, list) = dsm(3, &[(4, 4), (NS_BLOCKS, 1)], true);
    assert_status(&io.exec_icd(s, &list), Status::LBA_OUT_OF_RANGE);
    assert_eq!(ok_data(io.read(4, 1, 0, 16)), a);
    // Hints alone need no device.
    let (s, list) = dsm(5, &[(0, 16)], false);
    assert_eq!(
        io.receive_raw(s, tcp_desc(&s), &list, false),
        Received::Done
    );
    assert_eq!(io.q.dev_ops(), 0);
    ok(io.one());
    assert_eq!(ok_data(io.read(6, 1, 0, 16)), a);
    // A range list shorter than NR says.
    let (mut s, list) = dsm(7, &[(4, 4), (64, 8)], true);
    s.set_sgl(icd_sgl(16));
    assert_status(
        &io.exec_icd(s, &list[..16]),
        Status::DATA_SGL_LENGTH_INVALID,
    );

    let (s, list) = dsm(8, &[(4, 4), (64, 8)], true);
    ok(io.exec_icd(s, &list));
    let got = ok_data(io.read(9, 1, 0, 16));
    assert_eq!(got[..2048], a[..2048]);
    assert!(zeros(&got[2048..4096]));
    assert_eq!(got[4096..], a[4096..]);
    assert!(zeros(&ok_data(io.read(10, 1, 64, 8))));
}

#[test]
fn write_zeroes_zeroes_its_range() {
    let e = env();
    let (_a, mut io) = e.pair();
    let a = pattern(8192, 17);
    ok(io.write(1, 1, 0, &a));
    let wz = |cid, slba: u64, nlb: u32, deallocate: bool| {
        let mut s = Sqe::new(io_opc::WRITE_ZEROES, cid, 1);
        s.set_cdw(10, slba as u32);
        s.set_cdw(12, (nlb - 1) | (deallocate as u32) << 25);
        s
    };
    ok(io.exec(wz(2, 2, 2, false)));
    // With DEAC: may deallocate, still reads as zeros.
    ok(io.exec(wz(3, 12, 4, true)));
    let got = ok_data(io.read(4, 1, 0, 16));
    assert_eq!(got[..1024], a[..1024]);
    assert!(zeros(&got[1024..2048]));
    assert_eq!(got[2048..6144], a[2048..6144]);
    assert!(zeros(&got[6144..]));
}
// ---------------------------------------------------------------------------
// Namespaces added and removed at run time.

#[test]
fn namespace_removed_while_data_moves_fails_at_execution() {
    let e = env();
    let (_a, mut io) = e.pair();
    let Received::NeedData { slot, .. } = io.receive(rw(io_opc::WRITE, 1, 1, 0, 8)) else {
        panic!("no data request");
    };
    assert!(e.subsys.remove_namespace(1).is_some());
    // A reactor pass runs housekeeping while the data is on its way.
    assert_eq!(io.housekeeping(), None);
    io.fill(slot, &pattern(4096, 1));
    io.data_ready(slot, false);
    assert_eq!(
        io.q.dev_ops(),
        0,
        "nothing submitted to the removed namespace"
    );
    assert_status(&io.one(), Status::INVALID_NAMESPACE);
    assert_status(&io.read(2, 1, 0, 8), Status::INVALID_NAMESPACE);
}

#[test]
fn namespace_removed_while_data_moves_fails_without_housekeeping_too() {
    let e = env();
    let (_a, mut io) = e.pair();
    let Received::NeedData { slot, .. } = io.receive(rw(io_opc::WRITE, 1, 1, 0, 8)) else {
        panic!("no data request");
    };
    assert!(e.subsys.remove_namespace(1).is_some());
    io.fill(slot, &pattern(4096, 1));
    io.data_ready(slot, false);
    io.drain();
    assert_status(&io.one(), Status::INVALID_NAMESPACE);
}

#[test]
fn namespace_added_at_run_time_is_served() {
    let e = env();
    let (mut a, mut io) = e.pair();
    assert_status(&io.read(1, 2, 0, 8), Status::INVALID_NAMESPACE);
    e.add_ram_ns(2);
    let data = pattern(4096, 21);
    ok(io.write(2, 2, 0, &data));
    assert_eq!(ok_data(io.read(3, 2, 0, 8)), data);
    // A separate device: namespace 1 did not see the write.
    assert!(zeros(&ok_data(io.read(4, 1, 0, 8))));
    assert_eq!(
        nvme::decode_ns_list(&ok_data(a.exec(identify(1, cns::ACTIVE_NS_LIST, 0)))),
        vec![1, 2]
    );
    e.subsys.remove_namespace(2);
    assert_status(&io.read(5, 2, 0, 8), Status::INVALID_NAMESPACE);
    assert!(io.q.ns.get(2).is_none(), "the table let go of it");
}

/// Without a volatile write cache (the namespace's `write_cache = false`, or
/// the host turning the controller's off with Set Features) every write is
/// durable before its completion: it reaches the device as FUA. (The
/// controller once accepted Set Features VWC = 0 and changed nothing.)
#[test]
fn writes_are_fua_without_a_volatile_write_cache() {
    let e = env();
    let cached = FuaRecorder::default();
    let through = FuaRecorder::default();
    let (seen_cached, seen_through) = (cached.0.clone(), through.0.clone());
    e.add_ns(2, Arc::new(cached));
    let ns3 = Namespace::new(SUBNQN, 3, Arc::new(through), BS).with_write_cache(false);
    e.subsys.add_namespace(Arc::new(ns3)).unwrap();
    let (mut a, mut io) = e.pair();
    let data = pattern(BS as usize, 1);
    ok(io.write(1, 2, 0, &data));
    ok(io.write(2, 3, 0, &data));
    let mut fua = rw(io_opc::WRITE, 3, 2, 8, 1);
    fua.set_cdw(12, fua.cdw(12) | 1 << 30);
    ok(io.exec_h2c(fua, &data));
    assert_eq!(*seen_cached.lock().unwrap(), [false, true]);
    assert_eq!(*seen_through.lock().unwrap(), [true]);
    // One namespace with a cache: Identify says there is one.
    let id = IdentifyController::decode(&ok_data(a.exec(identify(4, cns::CONTROLLER, 0))));
    assert_eq!(id.vwc & 1, 1);

    // The host turns the cache off: writes to namespace 2 go FUA too.
    ok(a.exec(set_features(5, fid::VOLATILE_WRITE_CACHE, 0)));
    assert_eq!(
        a.exec(get_features(6, fid::VOLATILE_WRITE_CACHE, 0))
            .cqe
            .result,
        0
    );
    ok(io.write(7, 2, 16, &data));
    ok(a.exec(set_features(8, fid::VOLATILE_WRITE_CACHE, 1)));
    ok(io.write(9, 2, 24, &data));
    assert_eq!(*seen_cached.lock().unwrap(), [false, true, true, false]);

    // Only write-through namespaces left: no volatile write cache at all.
    e.subsys.remove_namespace(1);
    e.subsys.remove_namespace(2);
    let id = IdentifyController::decode(&ok_data(a.exec(identify(10, cns::CONTROLLER, 0))));
    assert_eq!(id.vwc, 0);
}
