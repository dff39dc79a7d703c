//! The KV index's own cost (issue 34): index operations per second for 4 KiB
//! and 64 KiB values, Store (`reserve` + `commit_store`), Retrieve
//! (`begin_read` + `end_read`) and Exist (`exists`, issue 37's per-key cost of
//! a batch lookup), on one thread and on two threads sharing one
//! index, as reactors serving one KV namespace share it. The two-thread
//! figures show what the index's shared state mutex costs when two reactors
//! meet on it: the "before" of a one-owner-per-shard index.
//!
//! No I/O: values are never written, only placed. Each thread works on its
//! own `KEYS` keys, overwriting them, so the index stays at the same fill;
//! every `COMMIT_EVERY` Stores the thread plays the metadata thread's part
//! (`drain_changes` + `committed`), so given-up blocks come back, and that
//! cost is in the Store figure, amortised, as it is in a target.
//!
//! Run with `cargo bench --bench kv_index` on an idle machine (or
//! `cargo bench --bench kv_index -- --test` to check it runs).

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvtarget::pool::kv::{KvIndex, KvLoc, Reserve, KV_BYTES_PER_KEY};
use kvtarget::wire::nvme::{KvKey, StoreOptions};
use std::time::{Duration, Instant};

/// Keys per thread.
const KEYS: u32 = 4096;
/// Stores between two commits of a thread.
const COMMIT_EVERY: u64 = 256;
const BLOCK: u32 = 4096;
const PLAIN: StoreOptions = StoreOptions {
    must_exist: false,
    must_not_exist: false,
    no_compress: false,
};

/// An index with room (keys and blocks) for every thread's keys twice over.
fn index(value: u32, threads: u32) -> KvIndex {
    let per_key = (value as u64).max(KV_BYTES_PER_KEY);
    KvIndex::new(2 * threads as u64 * KEYS as u64 * per_key, BLOCK)
}

fn key(thread: u32, i: u32) -> KvKey {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&thread.to_be_bytes());
    b[4..].copy_from_slice(&i.to_be_bytes());
    KvKey::new(&b).unwrap_or_default()
}

/// What a thread keeps between operations: its next key, its Stores since
/// its last commit, the commit's scratch.
struct Worker {
    thread: u32,
    next: u32,
    since_commit: u64,
    changes: Vec<(KvKey, Option<KvLoc>)>,
}

impl Worker {
    fn new(thread: u32) -> Worker {
        Worker {
            thread,
            next: 0,
            since_commit: 0,
            changes: Vec::with_capacity(4 * COMMIT_EVERY as usize),
        }
    }

    fn next_key(&mut self) -> KvKey {
        // A stride coprime with KEYS: every key in turn, not in order.
        self.next = (self.next + 1597) % KEYS;
        key(self.thread, self.next)
    }

    fn commit(&mut self, ix: &KvIndex) {
        self.changes.clear();
        ix.drain_changes(&mut self.changes);
        ix.committed(true);
        self.since_commit = 0;
    }

    fn store(&mut self, ix: &KvIndex, value: u32, now: Instant) {
        let k = self.next_key();
        for _ in 0..4 {
            match ix.reserve(&k, value, PLAIN, now) {
                Ok(Reserve::Ready(loc)) => {
                    let _ = ix.commit_store(&k, loc, PLAIN, now);
                    break;
                }
                Ok(Reserve::Claimed(loc)) => {
                    self.commit(ix);
                    let _ = ix.commit_store(&k, loc, PLAIN, now);
                    break;
                }
                Ok(Reserve::AfterCommit) => self.commit(ix),
                Err(_) => break,
            }
        }
        self.since_commit += 1;
        if self.since_commit >= COMMIT_EVERY {
            self.commit(ix);
        }
    }

    fn retrieve(&mut self, ix: &KvIndex, now: Instant) {
        let k = self.next_key();
        if let Ok((pin, loc)) = ix.begin_read(&k, now) {
            black_box(loc);
            ix.end_read(pin);
        }
    }

    /// Exist of a stored key: the lookup a KV-cache manager's batch of
    /// "which of these keys do you have?" costs per key.
    fn exist(&mut self, ix: &KvIndex, now: Instant) {
        let k = self.next_key();
        black_box(ix.exists(&k, now));
    }
}

/// Every thread's keys stored and committed.
fn filled(value: u32, threads: u32) -> KvIndex {
    let ix = index(value, threads);
    let now = Instant::now();
    for t in 0..threads {
        let mut w = Worker::new(t);
        for _ in 0..KEYS {
            w.store(&ix, value, now);
        }
        w.commit(&ix);
    }
    ix
}

#[derive(Clone, Copy)]
enum Op {
    Store,
    Retrieve,
    Exist,
}

/// `iters` operations on each of `threads` threads at once; the wall time.
fn run(ix: &KvIndex, op: Op, value: u32, threads: u32, iters: u64) -> Duration {
    let now = Instant::now();
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                let mut w = Worker::new(t);
                for _ in 0..iters {
                    match op {
                        Op::Store => w.store(ix, value, now),
                        Op::Retrieve => w.retrieve(ix, now),
                        Op::Exist => w.exist(ix, now),
                    }
                }
                w.commit(ix);
            });
        }
    });
    start.elapsed()
}

fn kv_index(c: &mut Criterion) {
    for (op, name) in [
        (Op::Store, "store"),
        (Op::Retrieve, "retrieve"),
        (Op::Exist, "exist"),
    ] {
        let mut g = c.benchmark_group(format!("kv index {name}"));
        for value in [4u32 << 10, 64 << 10] {
            for threads in [1u32, 2] {
                let ix = filled(value, threads);
                // Operations per second, all threads together.
                g.throughput(Throughput::Elements(threads as u64));
                let id = BenchmarkId::new(format!("{} KiB", value >> 10), threads);
                g.bench_function(id, |b| {
                    b.iter_custom(|iters| run(&ix, op, value, threads, iters))
                });
                assert!(ix.verify().is_empty(), "the index is inconsistent");
            }
        }
        g.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = kv_index
}
criterion_main!(benches);
