//! One device queue per (reactor, device): every volume of a pool served on a
//! reactor goes through one channel to the pool's device, so on the `nvme`
//! backend (one hardware queue per channel) many volumes take one hardware
//! queue per reactor instead of one each.

use kvtarget::bdev::ram::RamDevice;
use kvtarget::bdev::{BlockDevice, IoChannel, IoCompletion, IoOp, SharedDevice};
use kvtarget::mem::IoBuf;
use kvtarget::nvmf::Namespace;
use kvtarget::pool::channel::VolumeDevice;
use kvtarget::pool::{self, FormatOptions, Pool, PoolOptions};
use kvtarget::reactor::ChannelCache;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// A device that counts the channels opened on it (each would be one NVMe
/// hardware queue on the nvme backend).
struct Counting {
    inner: SharedDevice,
    opened: AtomicUsize,
}

impl BlockDevice for Counting {
    fn describe(&self) -> String {
        "counting".into()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn open_channel(&self) -> std::io::Result<Box<dyn IoChannel>> {
        self.opened.fetch_add(1, Ordering::SeqCst);
        self.inner.open_channel()
    }
    fn sync(&self) -> std::io::Result<()> {
        self.inner.sync()
    }
    fn volatile(&self) -> bool {
        true
    }
}

const VOLUMES: u32 = 16;
const MIB: u64 = 1 << 20;

fn wait(cache: &mut ChannelCache, ns: &Arc<Namespace>, tag: u64) -> IoCompletion {
    let mut out = Vec::new();
    for _ in 0..2_000_000 {
        let ch = cache.get(ns).expect("channel");
        ch.flush_submissions();
        ch.poll(&mut out, Instant::now());
        if let Some(i) = out.iter().position(|c| c.tag == tag) {
            return out.swap_remove(i);
        }
        std::thread::yield_now();
    }
    panic!("no completion for tag {tag}");
}

#[test]
fn many_volumes_of_one_device_share_one_device_queue_per_reactor() {
    let counting = Arc::new(Counting {
        inner: RamDevice::new("pool", 64 * MIB).expect("ram"),
        opened: AtomicUsize::new(0),
    });
    let dev: SharedDevice = counting.clone();
    pool::format(
        &dev,
        &FormatOptions {
            extent_size: MIB,
            ..FormatOptions::default()
        },
    )
    .expect("format");
    let pool = Pool::open("p", dev, PoolOptions::default()).expect("open");
    let namespaces: Vec<Arc<Namespace>> = (0..VOLUMES)
        .map(|i| {
            let vol = pool
                .create_volume(&format!("v{i}"), 4 * MIB, 4096, 0)
                .expect("create volume");
            Arc::new(Namespace::new(
                "nqn.test",
                i + 1,
                VolumeDevice::new(pool.clone(), vol),
                4096,
            ))
        })
        .collect();
    let before = counting.opened.load(Ordering::SeqCst);

    // One reactor's cache: a write to every volume, each its own bytes.
    let mut cache = ChannelCache::default();
    for (i, ns) in namespaces.iter().enumerate() {
        let mut buf = IoBuf::new(4096);
        buf.fill(i as u8 + 1);
        let op = IoOp::Write {
            offset: 8192,
            buf,
            fua: false,
        };
        cache
            .submit(ns, i as u64, op, Instant::now())
            .map_err(|(_, e)| e)
            .expect("submit");
        assert_eq!(wait(&mut cache, ns, i as u64).result, Ok(()));
    }
    assert_eq!(
        counting.opened.load(Ordering::SeqCst) - before,
        1,
        "{VOLUMES} volumes on one device must open one device queue on this reactor"
    );
    assert_eq!(cache.len(), 1);

    // Each volume reads back its own data: the shared queue routes by volume.
    for (i, ns) in namespaces.iter().enumerate() {
        let tag = 100 + i as u64;
        let op = IoOp::Read {
            offset: 8192,
            buf: IoBuf::new(4096),
        };
        cache
            .submit(ns, tag, op, Instant::now())
            .map_err(|(_, e)| e)
            .expect("submit");
        let c = wait(&mut cache, ns, tag);
        assert_eq!(c.result, Ok(()));
        let data = c.buf.expect("read buffer");
        assert!(
            data.iter().all(|&b| b == i as u8 + 1),
            "volume v{i} read another volume's data"
        );
    }

    // A removed namespace's volume is let go once idle, so it can be deleted
    // while the others keep the shared queue.
    let mut namespaces = namespaces;
    let ns3 = namespaces.remove(3);
    ns3.removed.store(true, Ordering::Release);
    drop(ns3);
    assert!(
        pool.delete_volume("v3").is_err(),
        "the reactor still holds v3 before housekeeping"
    );
    cache.evict_removed();
    pool.delete_volume("v3")
        .expect("delete v3 after its lane was released");
    assert_eq!(cache.len(), 1, "the other volumes keep the channel");
    let tag = 999;
    let op = IoOp::Read {
        offset: 8192,
        buf: IoBuf::new(4096),
    };
    // namespaces[4] is now v5.s.
    cache
        .submit(&namespaces[4], tag, op, Instant::now())
        .map_err(|(_, e)| e)
        .expect("submit");
    let c = wait(&mut cache, &namespaces[4], tag);
    assert_eq!(c.result, Ok(()));
    assert!(c.buf.expect("buf").iter().all(|&b| b == 6));
    assert_eq!(counting.opened.load(Ordering::SeqCst) - before, 1);
}
