//! Data descriptors: in-capsule data, SGL lengths, and data that arrives corrupt.

use super::*;

#[test]
fn in_capsule_data_must_match_its_length_only_with_exact_capsules() {
    let e = env();
    let (_a, mut tcp) = e.pair();
    let data = pattern(1024, 4);
    // NVMe/TCP: the PDU carries exactly the data.
    assert_status(
        &tcp.exec_icd(icd_write(1, 1, 0, 512), &data),
        Status::DATA_SGL_LENGTH_INVALID,
    );
    assert_status(
        &tcp.exec_icd(icd_write(2, 1, 0, 1024), &data[..512]),
        Status::DATA_SGL_LENGTH_INVALID,
    );
    assert!(zeros(&ok_data(tcp.read(3, 1, 0, 2))));

    // NVMe/RDMA: the receive buffer may be longer than the data.
    let (_ra, cntlid) = e.admin_with(rdma_cfg(0));
    let mut rdma = e.io_with(rdma_cfg(1), cntlid, 1);
    assert_status(
        &rdma.exec_icd(icd_write(1, 1, 0, 512), &data),
        Status::SUCCESS,
    );
    let back = ok_data(rdma.read_placed(2, 1, 0, 2));
    assert_eq!(back[..512], data[..512]);
    assert!(zeros(&back[512..]), "only the command's length is written");
    assert_status(
        &rdma.exec_icd(icd_write(3, 1, 0, 1024), &data[..512]),
        Status::DATA_SGL_LENGTH_INVALID,
    );
}

#[test]
fn in_capsule_data_above_the_queue_limit_is_refused() {
    let e = env();
    let (mut a, mut io) = e.pair();
    // I/O queues take `in_capsule_data` (8 KiB) in a capsule.
    assert_eq!(e.target.limits.in_capsule_data, 8192);
    let big = pattern(8192 + 512, 5);
    assert_status(
        &io.exec_icd(icd_write(1, 1, 0, 8192), &big[..8192]),
        Status::SUCCESS,
    );
    assert_status(
        &io.exec_icd(icd_write(2, 1, 64, big.len()), &big),
        Status::DATA_SGL_LENGTH_INVALID,
    );
    assert!(zeros(&ok_data(io.read(3, 1, 64, 17))));
    // The admin queue takes 8 KiB as well.
    let mut sf = set_features(1, fid::VOLATILE_WRITE_CACHE, 1);
    sf.set_sgl(icd_sgl(big.len() as u32));
    assert_status(&a.exec_icd(sf, &big), Status::DATA_SGL_LENGTH_INVALID);
}

#[test]
fn sgl_length_must_match_the_transfer() {
    let e = env();
    let (_a, mut io) = e.pair();
    let mut w = rw(io_opc::WRITE, 1, 1, 0, 8);
    w.set_sgl(host_sgl(2048));
    assert_status(&io.exec(w), Status::DATA_SGL_LENGTH_INVALID);
    // The transport's descriptor has less room than the read returns.
    let r = rw(io_opc::READ, 2, 1, 0, 8);
    assert_eq!(
        io.receive_raw(r, Ok(DataDesc::Host { len: 2048 }), &[], false),
        Received::Done
    );
    assert_status(&io.one(), Status::DATA_SGL_LENGTH_INVALID);
    // A descriptor longer than MDTS allows, whatever the command.
    let big = DataDesc::Host { len: 2 << 20 };
    assert_eq!(
        io.receive_raw(Sqe::new(io_opc::FLUSH, 3, 1), Ok(big), &[], false),
        Received::Done
    );
    assert_status(&io.one(), Status::DATA_SGL_LENGTH_INVALID);
}

#[test]
fn write_with_a_descriptor_shorter_than_its_blocks_is_refused() {
    let e = env();
    let (_a, mut io) = e.pair();
    // A pool buffer a previous command left its data in.
    let mut stale = io.bufs.get(4096);
    stale.fill(0xEE);
    io.bufs.put(stale);
    // The SGL says 4096 bytes (8 blocks), the transport's descriptor 512.
    let w = icd_write(1, 1, 0, 4096);
    let short = Ok(DataDesc::InCapsule {
        offset: 0,
        len: 512,
    });
    assert_eq!(
        io.receive_raw(w, short, &[0x11; 512], false),
        Received::Done
    );
    io.drain();
    let r = io.one();
    let back = ok_data(io.read(2, 1, 0, 8));
    assert!(
        zeros(&back),
        "stale bytes reached the device: {:#x}",
        back[600]
    );
    assert_status(&r, Status::DATA_SGL_LENGTH_INVALID);
}

#[test]
fn data_descriptor_errors_fail_the_command() {
    let e = env();
    let (_a, mut io) = e.pair();
    let read = rw(io_opc::READ, 1, 1, 0, 8);
    // The transport could not decode the descriptor.
    io.receive_raw(read, Err(Status::SGL_DESCRIPTOR_TYPE_INVALID), &[], false);
    assert_status(&io.one(), Status::SGL_DESCRIPTOR_TYPE_INVALID);
    // Read data cannot ride in the command capsule.
    let mut r = rw(io_opc::READ, 2, 1, 0, 8);
    r.set_sgl(icd_sgl(4096));
    assert_status(&io.exec_icd(r, &[]), Status::SGL_DESCRIPTOR_TYPE_INVALID);
    // In-capsule data starts right after the SQE.
    let mut w = icd_write(3, 1, 0, 512);
    w.set_sgl(SglDescriptor {
        address: 16,
        ..icd_sgl(512)
    });
    assert_status(
        &io.exec_icd(w, &pattern(512, 0)),
        Status::SGL_OFFSET_INVALID,
    );
    // NVMe/TCP: capsule data where the command has none to carry.
    assert_status(
        &io.exec_icd(rw(io_opc::READ, 4, 1, 0, 8), &[1; 16]),
        Status::INVALID_FIELD,
    );
    assert_status(
        &io.exec_icd(rw(io_opc::WRITE, 5, 1, 0, 8), &[1; 16]),
        Status::INVALID_FIELD,
    );
    assert!(zeros(&ok_data(io.read(6, 1, 0, 8))));
}

#[test]
fn corrupt_in_capsule_data_is_a_transient_transport_error() {
    let e = env();
    let (_a, mut io) = e.pair();
    let data = pattern(4096, 13);
    let w = icd_write(1, 1, 0, 4096);
    assert_eq!(io.receive_raw(w, tcp_desc(&w), &data, true), Received::Done);
    assert_eq!(io.q.dev_ops(), 0, "corrupt data never reaches the device");
    let r = io.one();
    assert_eq!(r.status(), TRANSIENT_TRANSPORT_ERROR);
    // SCT 0, SC 22h, retryable.
    assert_eq!(
        (r.status().sct, r.status().sc, r.status().dnr),
        (0, 0x22, false)
    );
    assert!(zeros(&ok_data(io.read(2, 1, 0, 8))));
}

#[test]
fn corrupt_r2t_data_is_a_transient_transport_error() {
    let e = env();
    let (_a, mut io) = e.pair();
    let data = pattern(4096, 14);
    let Received::NeedData { slot, .. } = io.receive(rw(io_opc::WRITE, 1, 1, 0, 8)) else {
        panic!("no data request");
    };
    io.fill(slot, &data);
    io.data_ready(slot, true);
    assert_eq!(io.q.dev_ops(), 0, "corrupt data never reaches the device");
    assert_eq!(io.one().status(), TRANSIENT_TRANSPORT_ERROR);
    assert!(zeros(&ok_data(io.read(2, 1, 0, 8))));
    // The retry succeeds.
    ok(io.write(3, 1, 0, &data));
    assert_eq!(ok_data(io.read(4, 1, 0, 8)), data);
}
