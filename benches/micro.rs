//! Criterion micro-benchmarks for the hot paths under the data path (issue 6):
//! the NVMe/TCP PDU codec, CRC32C, the extent map lookup and the extent
//! allocator's per-reactor cache, and the DH-HMAC-CHAP steps a reactor runs
//! when a queue authenticates. Run with `cargo bench --bench micro`; the
//! full first-write mapping path (batch reservations, journaling) is measured
//! end to end in `benches/pool.rs`.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use kvtarget::bdev::ram::RamDevice;
use kvtarget::pool::{format, FormatOptions, Pool, PoolOptions};
use kvtarget::wire::nvme::{io_opc, Cqe, SglDescriptor, Sqe, Status};
use kvtarget::wire::tcp::{self as pdu, DataHeader, Digests, ParseLimits};

fn codec(c: &mut Criterion) {
    let lim = ParseLimits { max_data: 1 << 20 };
    let mut g = c.benchmark_group("pdu");
    // A 4 KiB read command, as the host sends it.
    let mut sqe = Sqe::new(io_opc::READ, 7, 1);
    sqe.set_cdw(10, 1234);
    sqe.set_cdw(12, 7);
    sqe.set_sgl(SglDescriptor {
        address: 0,
        length: 4096,
        type_byte: SglDescriptor::TRANSPORT,
    });
    let mut cmd = Vec::new();
    pdu::encode_capsule_cmd(&mut cmd, &sqe, &[], Digests::default());
    g.bench_function("parse CapsuleCmd (read)", |b| {
        b.iter(|| pdu::parse(black_box(&cmd), Digests::default(), lim))
    });
    let both = Digests {
        header: true,
        data: true,
    };
    let mut cmd_d = Vec::new();
    pdu::encode_capsule_cmd(&mut cmd_d, &sqe, &[], both);
    g.bench_function("parse CapsuleCmd (read, header digest)", |b| {
        b.iter(|| pdu::parse(black_box(&cmd_d), both, lim))
    });
    // A 4 KiB in-capsule write.
    let mut w = Sqe::new(io_opc::WRITE, 8, 1);
    w.set_sgl(SglDescriptor {
        address: 0,
        length: 4096,
        type_byte: SglDescriptor::IN_CAPSULE,
    });
    let mut wcmd = Vec::new();
    pdu::encode_capsule_cmd(&mut wcmd, &w, &[0x5A; 4096], Digests::default());
    g.bench_function("parse CapsuleCmd (4 KiB in-capsule write)", |b| {
        b.iter(|| pdu::parse(black_box(&wcmd), Digests::default(), lim))
    });
    let hdr = DataHeader {
        cccid: 7,
        ttag: 0,
        offset: 0,
        length: 4096,
    };
    let mut out = Vec::with_capacity(4096);
    g.bench_function("encode C2HData header (4 KiB, SUCCESS)", |b| {
        b.iter(|| {
            out.clear();
            pdu::encode_data_pdu_header(
                &mut out,
                false,
                black_box(&hdr),
                4096,
                pdu::flags::LAST_PDU | pdu::flags::SUCCESS,
                Digests::default(),
                0,
            );
        })
    });
    let cqe = Cqe::new(7, Status::SUCCESS);
    g.bench_function("encode CapsuleResp", |b| {
        b.iter(|| {
            out.clear();
            pdu::encode_capsule_resp(&mut out, black_box(&cqe), Digests::default());
        })
    });
    let mut h2c = Vec::new();
    pdu::encode_data_pdu(
        &mut h2c,
        true,
        &hdr,
        &[1u8; 128 << 10],
        pdu::flags::LAST_PDU,
        Digests::default(),
        0,
    );
    g.bench_function("parse H2CData header before its data (128 KiB)", |b| {
        b.iter(|| pdu::parse_data_pdu_head(black_box(&h2c[..24]), Digests::default(), lim))
    });
    g.finish();

    let mut g = c.benchmark_group("crc32c");
    let block = vec![0xA5u8; 4096];
    g.throughput(Throughput::Bytes(4096));
    g.bench_function("4 KiB (data digest)", |b| {
        b.iter(|| pdu::crc32c(black_box(&block)))
    });
    g.finish();
}

fn pool_paths(c: &mut Criterion) {
    let dev: kvtarget::bdev::SharedDevice = RamDevice::new("micro", 8 << 30).expect("ram device");
    format(
        &dev,
        &FormatOptions {
            extent_size: 1 << 20,
            ..FormatOptions::default()
        },
    )
    .expect("format");
    let pool = Pool::open("micro", dev, PoolOptions::default()).expect("open");
    let vol = pool.create_volume("v", 4 << 30, 4096, 0).expect("volume");
    let mapped = 2048u32;
    for l in 0..mapped {
        loop {
            match vol.pin_or_map(l, || pool.take_extent(0), |p| pool.return_extent(0, p)) {
                Ok(_) => break,
                Err(_) => std::thread::yield_now(),
            }
        }
        vol.unpin(l);
    }
    let mut g = c.benchmark_group("extent map");
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    g.bench_function("pin + unpin a mapped extent (random)", |b| {
        b.iter(|| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let l = (x % mapped as u64) as u32;
            let p = vol.pin(black_box(l));
            vol.unpin(l);
            p
        })
    });
    g.bench_function("look up an unmapped extent", |b| {
        b.iter(|| vol.pin(black_box(mapped + 17)))
    });
    g.finish();

    let mut g = c.benchmark_group("allocator");
    g.bench_function("take + return a clean extent (per-reactor cache)", |b| {
        b.iter(|| {
            if let Ok(p) = pool.take_extent(black_box(0)) {
                pool.return_extent(0, p);
            }
        })
    });
    g.finish();
    drop(vol);
    let _ = pool.close();
}

/// What one queue's DH-HMAC-CHAP costs its reactor: the key pair (challenge),
/// the shared secret (reply check), and the two HMACs; per DH group.
fn dhchap(c: &mut Criterion) {
    use kvtarget::auth::{response, DhGroup, DhKeyPair, Digest, ResponseInput, Role};
    let mut g = c.benchmark_group("dhchap");
    g.sample_size(10);
    for group in [
        DhGroup::Ffdhe2048,
        DhGroup::Ffdhe3072,
        DhGroup::Ffdhe4096,
        DhGroup::Ffdhe6144,
        DhGroup::Ffdhe8192,
    ] {
        let Ok(peer) = DhKeyPair::generate(group) else {
            return;
        };
        g.bench_function(format!("keypair_{}", group.name()), |b| {
            b.iter(|| DhKeyPair::generate(black_box(group)).map(|k| k.public().len()))
        });
        let Ok(mine) = DhKeyPair::generate(group) else {
            return;
        };
        g.bench_function(format!("shared_secret_{}", group.name()), |b| {
            b.iter(|| {
                mine.shared_secret(black_box(peer.public()))
                    .map(|s| s.len())
            })
        });
    }
    let input = ResponseInput {
        digest: Digest::Sha512,
        key: &[7; 64],
        challenge: &[9; 64],
        dh_secret: Some(&[3; 1024]),
        seqnum: 1,
        tid: 1,
        scc: 0,
        hostnqn: "nqn.2014-08.org.nvmexpress:uuid:6b767461-7267-6574-0000-000000000001",
        subnqn: "nqn.2026-12.io.kvtarget:secure",
    };
    g.bench_function("response_sha512_ffdhe8192", |b| {
        b.iter(|| response(Role::Host, black_box(&input)).len())
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(2));
    targets = codec, pool_paths, dhchap
}
criterion_main!(benches);
