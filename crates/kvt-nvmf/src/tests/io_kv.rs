//! The KV command set through a queue, over a real pool volume.

use super::*;

impl Conn {
    /// Polls until a response is out: a KV Store's flush completes on the
    /// pool's metadata thread, not at once.
    fn wait_one(&mut self) -> Sent {
        for _ in 0..5000 {
            self.poll();
            if !self.link.sent.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        self.one()
    }
    fn kv(&mut self, cmd: nvme::KvCommand, cid: u16, nsid: u32, sgl_len: u32) -> Sqe {
        let mut s = cmd.encode(cid, nsid);
        s.set_sgl(host_sgl(sgl_len));
        s
    }
}
// ---------------------------------------------------------------------------
// KV commands against a KV namespace on a pool volume.

impl Env {
    /// A KV namespace at `nsid` on a fresh RAM pool's KV volume of `bytes`.
    fn add_pool_kv_ns(&self, nsid: u32, bytes: u64) -> Arc<kvt_pool::Pool> {
        let dev: kvt_bdev::SharedDevice = RamDevice::new("kvpool", 64 << 20).unwrap();
        kvt_pool::format(&dev, &kvt_pool::FormatOptions::default()).unwrap();
        let pool = kvt_pool::Pool::open("kvq", dev, kvt_pool::PoolOptions::default()).unwrap();
        let vol = pool
            .create_volume("c", bytes, BS, kvt_pool::format::VOL_KV)
            .unwrap();
        let dev = kvt_pool::channel::VolumeDevice::new(pool.clone(), vol.clone());
        let ns = Namespace::new(SUBNQN, nsid, dev, BS).with_kv(vol.kv.clone().unwrap());
        self.subsys.add_namespace(Arc::new(ns)).unwrap();
        pool
    }
}

#[test]
fn kv_store_and_retrieve_over_rdma_copy_into_the_placed_buffer() {
    let e = env();
    let _pool = e.add_pool_kv_ns(2, 4 << 20);
    let (_a, cntlid) = e.admin_cc(CC_ENABLE_ALL_IOCS);
    let mut io = e.io_with(rdma_cfg(1), cntlid, 1);
    let key = nvme::KvKey::new(b"rdma-key").unwrap();
    let value = pattern(5000, 3);
    let store = io.kv(
        nvme::KvCommand::Store {
            key,
            value_size: 5000,
            options: Default::default(),
        },
        1,
        2,
        5000,
    );
    let slot = match io.receive(store) {
        Received::NeedData {
            slot,
            len: 5000,
            dir: DataDirection::HostToController,
        } => slot,
        other => panic!("expected a host data request, got {other:?}"),
    };
    // NVMe/RDMA READs the value into a buffer of the exact length it placed.
    let mut placed = IoBuf::new(5000);
    placed.set_len(5000);
    placed.copy_from_slice(&value);
    io.q.request_mut(slot).unwrap().buf = Some(placed);
    io.data_ready(slot, false);
    assert_eq!(io.wait_one().status(), Status::SUCCESS);
    // Retrieve into an 8 KiB host buffer the transport places: the value is
    // copied there (the device read whole blocks into its own buffer).
    let get = io.kv(
        nvme::KvCommand::Retrieve {
            key,
            host_buffer_size: 8192,
            raw: false,
        },
        2,
        2,
        8192,
    );
    let slot = match io.receive(get) {
        Received::NeedData {
            slot,
            len: 8192,
            dir: DataDirection::ControllerToHost,
        } => slot,
        other => panic!("expected a read buffer request, got {other:?}"),
    };
    let placed = IoBuf::new(8192);
    let at = placed.as_ptr() as usize;
    io.q.request_mut(slot).unwrap().buf = Some(placed);
    io.data_ready(slot, false);
    let r = io.wait_one();
    assert_eq!(r.status(), Status::SUCCESS);
    assert_eq!(r.cqe.result, 5000, "DW0: the value's size");
    assert_eq!(r.data, value);
    assert_eq!(r.data_ptr, Some(at), "sent from the placed buffer");
    // A miss, and nothing left in flight.
    let miss = io.kv(
        nvme::KvCommand::Retrieve {
            key: nvme::KvKey::new(b"nope").unwrap(),
            host_buffer_size: 4096,
            raw: false,
        },
        3,
        2,
        4096,
    );
    if let Received::NeedData { slot, .. } = io.receive(miss) {
        io.q.request_mut(slot).unwrap().buf = Some(IoBuf::new(4096));
        io.data_ready(slot, false);
    }
    assert_eq!(io.wait_one().status(), Status::KV_KEY_DOES_NOT_EXIST);
    assert_eq!(io.q.dev_ops(), 0);
}

#[test]
fn kv_namespace_refuses_io_from_a_controller_that_enabled_only_nvm() {
    let e = env();
    let _pool = e.add_pool_kv_ns(2, 4 << 20);
    // CC.CSS = 000b: the KV namespace is not active for this controller.
    let (_a, io) = e.pair();
    let mut io = io;
    let s = io.kv(
        nvme::KvCommand::Exist {
            key: nvme::KvKey::new(b"k").unwrap(),
        },
        1,
        2,
        0,
    );
    assert_eq!(io.exec(s).status(), Status::IOCS_NOT_ENABLED);
    // The NVM namespace beside it works.
    assert_eq!(io.read(2, 1, 0, 1).status(), Status::SUCCESS);
}

/// A namespace removed while a Retrieve reads and a Store writes: both still
/// finish in the key index they started in, so the Store's reserved blocks
/// and the Retrieve's pin are not leaked into the volume's index (which
/// outlives the namespace and may be served again).
#[test]
fn kv_commands_release_the_index_when_their_namespace_goes() {
    let e = env();
    let pool = e.add_pool_kv_ns(2, 4 << 20);
    let ix = pool.volume("c").and_then(|v| v.kv.clone()).unwrap();
    let (_a, cntlid) = e.admin_cc(CC_ENABLE_ALL_IOCS);
    let mut io = e.io_with(rdma_cfg(1), cntlid, 1);
    let k1 = nvme::KvKey::new(b"read-me").unwrap();
    let k2 = nvme::KvKey::new(b"write-me").unwrap();
    let per = 5000u64.div_ceil(ix.block_size() as u64);
    let start_store = |io: &mut Conn, key, cid| {
        let store = io.kv(
            nvme::KvCommand::Store {
                key,
                value_size: 5000,
                options: Default::default(),
            },
            cid,
            2,
            5000,
        );
        let Received::NeedData { slot, .. } = io.receive(store) else {
            panic!("no data request for the Store");
        };
        let mut placed = IoBuf::new(5000);
        placed.set_len(5000);
        placed.copy_from_slice(&pattern(5000, cid as u8));
        io.q.request_mut(slot).unwrap().buf = Some(placed);
        io.data_ready(slot, false);
    };
    start_store(&mut io, k1, 1);
    assert_eq!(io.wait_one().status(), Status::SUCCESS);
    // A Retrieve of k1 and a Store of k2 reach the device; then the
    // namespace goes.
    let get = io.kv(
        nvme::KvCommand::Retrieve {
            key: k1,
            host_buffer_size: 8192,
            raw: false,
        },
        2,
        2,
        8192,
    );
    let Received::NeedData { slot, .. } = io.receive(get) else {
        panic!("no buffer request for the Retrieve");
    };
    io.q.request_mut(slot).unwrap().buf = Some(IoBuf::new(8192));
    io.data_ready(slot, false);
    start_store(&mut io, k2, 3);
    assert!(e.subsys.remove_namespace(2).is_some());
    // The queue's table lets go of it before the device answers.
    assert_eq!(io.housekeeping(), None);
    assert!(io.q.ns.get(2).is_none());
    let mut answered = 0;
    for _ in 0..5000 {
        io.poll();
        answered += std::mem::take(&mut io.link.sent).len();
        if answered == 2 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(answered, 2, "both commands answered");
    // The Store either made it into the index or gave its blocks back.
    let s = ix.snapshot();
    assert!(
        (s.keys, s.used_blocks) == (2, 2 * per) || (s.keys, s.used_blocks) == (1, per),
        "{s:?}"
    );
    // The Retrieve's pin is gone: k1's blocks, given up, wait for a commit
    // instead of for a reader that will never finish.
    let before = s.pending_free_blocks;
    assert_eq!(ix.delete(&k1, std::time::Instant::now()), Ok(()));
    assert_eq!(ix.snapshot().pending_free_blocks, before + per);
    assert!(ix.verify().is_empty());
}
