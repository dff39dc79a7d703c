//! A volume I/O allocates nothing: Read, Write (plain, FUA, large), Write
//! Zeroes, Deallocate and Flush through a `PoolChannel` on already-mapped
//! extents, counted by a global allocator that counts per thread while armed.
//! Nor does a KV command's work in the key index (`KvIndex`): Store,
//! Retrieve, Exist and Delete; nor, through a whole target over NVMe/TCP, do
//! KV commands on its reactors, including the steps one reactor sends to
//! the reactor owning the index.
//!
//! Only the reactor's side is counted (submit and poll). The metadata
//! thread's work (`Pool::md_step`: the journal commit a Flush or FUA waits
//! for) runs outside the window, as it runs on its own thread in a target.
//! First touch is excluded too: mapping an extent is warm-up here (the
//! allocator's caches and the journal record are the metadata thread's), and
//! so are the channel's first commands, which may grow its vectors past the
//! sizes it is created with (`REQS_AT_START`, `PIECES_PER_REQ`).

use kvtarget::bdev::ram::RamDevice;
use kvtarget::bdev::{IoChannel, IoCompletion, IoOp, SharedDevice};
use kvtarget::mem::IoBuf;
use kvtarget::pool::channel::PoolChannel;
use kvtarget::pool::kv::{KvIndex, Reserve};
use kvtarget::pool::{self, FormatOptions, Pool, PoolOptions};
use kvtarget::wire::nvme::{KvKey, StoreOptions};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;
use std::time::Instant;

struct CountingAlloc;

thread_local! {
    static ARMED: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

/// Where the first counted allocations came from (size and backtrace): a failure
/// that shows up only on a busy machine must say what allocated.
static FIRST_ALLOCATIONS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn note_allocation(size: usize) {
    // try_with: the allocator also runs while thread locals are torn down.
    let _ = ARMED.try_with(|armed| {
        if armed.get() {
            let n = ALLOCATIONS.with(|n| {
                n.set(n.get() + 1);
                n.get()
            });
            if n <= 2 {
                // Disarmed while the report itself allocates.
                armed.set(false);
                let bt = std::backtrace::Backtrace::force_capture();
                let thread = std::thread::current();
                let line = format!(
                    "{size} bytes on thread {:?}:\n{bt}",
                    thread.name().unwrap_or("?")
                );
                if let Ok(mut v) = FIRST_ALLOCATIONS.lock() {
                    v.push(line);
                }
                armed.set(true);
            }
        }
    });
}

/// The reports `note_allocation` kept.
fn first_allocations() -> String {
    FIRST_ALLOCATIONS
        .lock()
        .map(|v| v.join("\n"))
        .unwrap_or_default()
}

// SAFETY: every call forwards to the system allocator with the caller's own
// arguments; counting touches only const-initialised thread locals, which
// never allocate.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_allocation(layout.size());
        // SAFETY: forwarded unchanged; the caller upholds `alloc`'s contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_allocation(layout.size());
        // SAFETY: as in `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_allocation(new_size);
        // SAFETY: `ptr` came from this allocator, so from `System`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, so from `System`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// Runs `f` with this thread's allocations counted; returns them.
fn counted<R>(f: impl FnOnce() -> R) -> (R, u64) {
    ALLOCATIONS.with(|n| n.set(0));
    ARMED.with(|a| a.set(true));
    let r = f();
    ARMED.with(|a| a.set(false));
    (r, ALLOCATIONS.with(|n| n.get()))
}

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const EXTENTS: u64 = 8;

/// The channel, its pool, and the reactor-side allocations seen so far.
struct Harness {
    pool: Arc<Pool>,
    ch: PoolChannel,
    out: Vec<IoCompletion>,
    allocations: u64,
    tag: u64,
}

impl Harness {
    fn new() -> Harness {
        let dev: SharedDevice = RamDevice::new("pool", 64 * MIB).expect("ram device");
        let opts = FormatOptions {
            extent_size: MIB,
            ..FormatOptions::default()
        };
        pool::format(&dev, &opts).expect("format");
        let popts = PoolOptions {
            md_thread: false,
            commit_interval: None,
            ..PoolOptions::default()
        };
        let pool = Pool::open("p", dev, popts).expect("open");
        let vol = pool
            .create_volume("v", EXTENTS * MIB, 4096, 0)
            .expect("volume");
        let ch = PoolChannel::for_volume(pool.clone(), vol).expect("channel");
        Harness {
            pool,
            ch,
            out: Vec::with_capacity(64),
            allocations: 0,
            tag: 0,
        }
    }

    /// One command to completion: submit and poll counted, the metadata
    /// thread's steps in between not.
    fn run(&mut self, op: IoOp) -> Option<IoBuf> {
        self.tag += 1;
        let (tag, now) = (self.tag, Instant::now());
        let (r, n) = counted(|| self.ch.submit(tag, op, now));
        self.allocations += n;
        assert!(r.is_ok(), "submit refused");
        loop {
            let (_, n) = counted(|| self.ch.poll(&mut self.out, now));
            self.allocations += n;
            if let Some(c) = self.out.pop() {
                assert_eq!(c.tag, tag);
                assert_eq!(c.result, Ok(()), "command {tag}");
                return c.buf;
            }
            self.pool.md_step(now);
        }
    }

    /// Every command kind once, on extents the warm-up mapped; `i` moves the
    /// offsets around. Buffers go round: what a command returns is reused.
    fn mix(&mut self, i: u64, small: IoBuf, large: IoBuf) -> (IoBuf, IoBuf) {
        let ext = i % EXTENTS;
        let at = ext * MIB + (i % 16) * 4 * KIB;
        let small = self
            .run(IoOp::Write {
                offset: at,
                buf: small,
                fua: false,
            })
            .expect("buffer");
        let small = self
            .run(IoOp::Write {
                offset: at + 64 * KIB,
                buf: small,
                fua: true,
            })
            .expect("buffer");
        let small = self
            .run(IoOp::Read {
                offset: at,
                buf: small,
            })
            .expect("buffer");
        // 256 KiB crossing into the next extent: dual-path pieces, two extents.
        let big_at = (1 + i % (EXTENTS - 1)) * MIB - 128 * KIB;
        let large = self
            .run(IoOp::Write {
                offset: big_at,
                buf: large,
                fua: false,
            })
            .expect("buffer");
        let large = self
            .run(IoOp::Read {
                offset: big_at,
                buf: large,
            })
            .expect("buffer");
        self.run(IoOp::WriteZeroes {
            offset: at + 512 * KIB,
            len: 8 * KIB,
        });
        // The extent keeps other valid blocks, so it stays mapped.
        self.run(IoOp::Deallocate {
            offset: at + 768 * KIB,
            len: 4 * KIB,
        });
        self.run(IoOp::Flush);
        (small, large)
    }
}

#[test]
fn volume_io_on_mapped_extents_allocates_nothing() {
    let mut h = Harness::new();
    let (mut small, mut large) = (IoBuf::new(4096), IoBuf::new(256 * KIB as usize));
    large.fill(7);
    // Warm-up: map every extent (whole), then run the mix until the
    // channel's vectors have their working sizes.
    let mut whole = IoBuf::new(MIB as usize);
    whole.fill(1);
    for e in 0..EXTENTS {
        whole = h
            .run(IoOp::Write {
                offset: e * MIB,
                buf: whole,
                fua: false,
            })
            .expect("buffer");
    }
    for i in 0..2 * EXTENTS {
        (small, large) = h.mix(i, small, large);
    }
    h.allocations = 0;
    const ROUNDS: u64 = 500;
    for i in 0..ROUNDS {
        (small, large) = h.mix(i, small, large);
    }
    assert_eq!(
        h.allocations,
        0,
        "{} allocations on the reactor's side over {ROUNDS} rounds of 8 commands; the first:\n{}",
        h.allocations,
        first_allocations()
    );
    // The window saw the commands: a write's bytes read back.
    small.fill(9);
    small = h
        .run(IoOp::Write {
            offset: 4096,
            buf: small,
            fua: false,
        })
        .expect("buffer");
    small.fill(0);
    let back = h
        .run(IoOp::Read {
            offset: 4096,
            buf: small,
        })
        .expect("buffer");
    assert!(back.iter().all(|&b| b == 9));
}

/// A KV command's work in the key index allocates nothing: Stores of new
/// keys and over existing ones (reserve, then commit), Retrieves (pinned,
/// then released), Exists and Deletes, round after round on an index sized
/// when its volume was made. Between rounds the metadata thread's side
/// (draining the changes, the commit landing) runs uncounted, as on its own
/// thread in a target; the first round warms up.
#[test]
fn kv_index_commands_allocate_nothing() {
    let ix = KvIndex::new(64 * MIB, 512);
    let now = Instant::now();
    let keys: Vec<KvKey> = (0..256u32)
        .map(|i| KvKey::new(&i.to_be_bytes()).expect("a 4-byte key"))
        .collect();
    let opts = StoreOptions::default();
    let round = |r: usize| {
        for (i, k) in keys.iter().enumerate() {
            let len = 512 * (1 + (i + r) % 8) as u32;
            let loc = match ix.reserve(k, len, opts, now) {
                Ok(Reserve::Ready(l) | Reserve::Claimed(l)) => l,
                other => panic!("round {r}, key {i}: reserve gave {other:?}"),
            };
            assert_eq!(ix.commit_store(k, loc, opts, now), Ok(()));
            let (pin, at) = ix.begin_read(k, now).expect("a stored key reads");
            assert_eq!(at, loc);
            ix.end_read(pin);
            assert!(ix.exists(k, now));
            if (i + r) % 4 == 0 {
                assert_eq!(ix.delete(k, now), Ok(()));
            }
        }
    };
    let mut changes = Vec::with_capacity(2 * keys.len());
    let mut allocations = 0;
    const ROUNDS: usize = 50;
    for r in 0..=ROUNDS {
        let ((), n) = counted(|| round(r));
        if r > 0 {
            allocations += n;
        }
        changes.clear();
        ix.drain_changes(&mut changes);
        assert!(!changes.is_empty(), "round {r} changed keys");
        ix.committed(true);
    }
    assert_eq!(
        allocations,
        0,
        "{allocations} allocations in {ROUNDS} rounds of {} keys; the first:\n{}",
        keys.len(),
        first_allocations()
    );
    assert!(ix.verify().is_empty(), "{:?}", ix.verify());
}

mod support;

/// Runs `f` on every reactor of `server` and waits for each.
fn on_reactors<R: Send + 'static>(server: &kvtarget::server::Server, f: fn() -> R) -> Vec<R> {
    use kvtarget::reactor::Message;
    server
        .reactors()
        .map(|r| {
            // Bounded: its slot is made here, so sending from an armed
            // reactor allocates nothing.
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            let call = Message::Call(Box::new(move |_| {
                let _ = tx.send(f());
            }));
            assert!(r.send(call).is_ok(), "reactor inbox full");
            rx.recv().expect("the reactor ran the call")
        })
        .collect()
}

/// KV commands over NVMe/TCP on a target of two reactors allocate nothing on
/// either reactor: Store (4 KiB and 64 KiB values, new keys and overwrites),
/// Retrieve, Exist, Delete and Flush, from four queues spread over both
/// reactors, so half the index steps cross to the reactor that owns the
/// index and their answers come back. Nor do they lock the index's mutex. Counted on the reactor threads only;
/// the first round warms up (buffer pools, the index's first owner).
#[test]
fn kv_commands_over_tcp_allocate_nothing_on_the_reactors() {
    let cfg = r#"
[reactors]
count = 2

[[listeners]]
address = "127.0.0.1"
port = 0

[[pools]]
name = "p"
backend = "ram"
size = "256MiB"
extent_size = "1MiB"

[[pools.volumes]]
name = "cache"
size = "64MiB"
kind = "kv"

[[subsystems]]
nqn = "nqn.2026-12.io.kvtarget:noalloc"
allow_any_host = true

[[subsystems.namespaces]]
nsid = 1
volume = "p/cache"
"#;
    let (server, addr) = support::start_server(cfg);
    let (_c, mut qs) = support::connect(addr, "nqn.2026-12.io.kvtarget:noalloc", 4);
    let opts = StoreOptions::default();
    let round = |qs: &mut [kvtarget::initiator::IoQueue], r: u32| {
        for i in 0..64u32 {
            let q = &mut qs[(i as usize + r as usize) % 4];
            let key = KvKey::new(&i.to_be_bytes()).expect("a 4-byte key");
            let len = if i % 2 == 0 { 4096 } else { 65536 };
            q.kv_store(1, key, vec![(i + r) as u8; len], opts)
                .expect("store");
            let (got, _) = q.kv_retrieve(1, key, len as u32).expect("retrieve");
            assert!(got.iter().all(|&b| b == (i + r) as u8));
            assert!(q.kv_exist(1, key).expect("exist"));
            if (i + r) % 4 == 0 {
                q.kv_delete(1, key).expect("delete");
            }
        }
        qs[0].flush(1).expect("flush");
    };
    for r in 0..3 {
        round(&mut qs, r);
    }
    fn arm() {
        ALLOCATIONS.with(|n| n.set(0));
        ARMED.with(|a| a.set(true));
    }
    fn disarm() -> u64 {
        ARMED.with(|a| a.set(false));
        ALLOCATIONS.with(|n| n.get())
    }
    let index = server.pools()[0]
        .volume("cache")
        .and_then(|v| v.kv.clone())
        .expect("the KV volume's index");
    let locks = index.home_locks();
    on_reactors(&server, arm);
    for r in 3..23 {
        round(&mut qs, r);
    }
    let per_reactor = on_reactors(&server, disarm);
    assert_eq!(
        per_reactor,
        vec![0, 0],
        "allocations on each reactor; the first ones:\n{}",
        first_allocations()
    );
    // Nor a lock: with a reactor owning the index, its mutex is not taken
    // (by the commands, nor by the metadata thread's commits).
    assert_eq!(index.home_locks(), locks, "the index's mutex was taken");
    drop(qs);
    server.shutdown();
}
