//! What the KV index evicts, not how fast (issue 37): the index alone, no
//! I/O, deterministic (seeded), so each figure is a property of the policy.
//!
//! 1. **Large values after churn** (the sequence): a 256 MiB
//!    namespace churned by Stores, overwrites and Deletes of mixed sizes
//!    (4 KiB to 1 MiB), then new 0.5-1 MiB values totalling twice the
//!    namespace. Reported: how much was free when Stores evicted (the
//!    target: no eviction with more than about 5 % free), how often a key
//!    stored in the newest eighth of capacity was missing after a Store
//!    (target: never), and how many of each tenth of the new values
//!    survive, oldest first.
//! 2. **Hit rate against exact LRU**: cache-aside reads (a miss Stores the
//!    value) of a Zipf 0.99 key mix whose values total twice the namespace,
//!    beside an exact byte-capacity LRU of the same size on the same
//!    sequence: fixed 64 KiB values and mixed 0.5-1 MiB values.
//!
//! Commits (the metadata thread's part: given-up blocks become free) happen
//! every `COMMIT_EVERY` Stores and whenever a Store waits for one.
//!
//! Run with `cargo bench --bench kv_eviction` (or `bench/run-kv-eviction.sh`).

use kvtarget::pool::kv::{KvIndex, KvLoc, Reserve};
use kvtarget::wire::nvme::{KvKey, Status, StoreOptions};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::Instant;

const BLOCK: u32 = 4096;
const NS_BYTES: u64 = 256 << 20;
const COMMIT_EVERY: u32 = 16;
const PLAIN: StoreOptions = StoreOptions {
    must_exist: false,
    must_not_exist: false,
    no_compress: false,
};

/// xorshift64*: the same sequence on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn key(space: u32, i: u32) -> KvKey {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&space.to_be_bytes());
    b[4..].copy_from_slice(&i.to_be_bytes());
    KvKey::new(&b).unwrap_or_default()
}

/// The index with the metadata thread's part played inline.
struct Cache {
    ix: KvIndex,
    since_commit: u32,
    changes: Vec<(KvKey, Option<KvLoc>)>,
    now: Instant,
}

impl Cache {
    fn new() -> Cache {
        Cache {
            ix: KvIndex::new(NS_BYTES, BLOCK),
            since_commit: 0,
            changes: Vec::new(),
            now: Instant::now(),
        }
    }

    fn commit(&mut self) {
        self.changes.clear();
        self.ix.drain_changes(&mut self.changes);
        self.ix.committed(true);
        self.since_commit = 0;
    }

    /// Stores `len` bytes under `k`; false if the index refused.
    fn store(&mut self, k: &KvKey, len: u32) -> bool {
        self.since_commit += 1;
        if self.since_commit >= COMMIT_EVERY {
            self.commit();
        }
        for _ in 0..8 {
            let loc = match self.ix.reserve(k, len, PLAIN, self.now) {
                Ok(Reserve::Ready(loc)) => loc,
                Ok(Reserve::Claimed(loc)) => {
                    self.commit();
                    loc
                }
                Ok(Reserve::AfterCommit) => {
                    self.commit();
                    continue;
                }
                Err(_) => return false,
            };
            return self.ix.commit_store(k, loc, PLAIN, self.now).is_ok();
        }
        false
    }

    fn read(&mut self, k: &KvKey) -> bool {
        match self.ix.begin_read(k, self.now) {
            Ok((pin, _)) => {
                self.ix.end_read(pin);
                true
            }
            Err(Status::KV_KEY_DOES_NOT_EXIST) => false,
            Err(e) => panic!("read of {k:?}: {e:?}"),
        }
    }

    fn free_fraction(&self) -> f64 {
        let s = self.ix.snapshot();
        (s.free_blocks + s.pending_free_blocks) as f64 / s.total_blocks as f64
    }

    fn present(&self) -> HashSet<KvKey> {
        self.ix.locations().into_iter().map(|(k, _)| k).collect()
    }
}

fn blocks(len: u32) -> u64 {
    len.div_ceil(BLOCK) as u64
}

/// A length from 4 KiB to 1 MiB, log-uniform, whole blocks.
fn mixed_len(rng: &mut Rng) -> u32 {
    let exp = 12.0 + 8.0 * rng.unit();
    (2f64.powf(exp) as u32).div_ceil(BLOCK) * BLOCK
}

/// 0.5 to 1 MiB, whole blocks.
fn large_len(rng: &mut Rng) -> u32 {
    ((512 << 10) + rng.below(512 << 10) as u32).div_ceil(BLOCK) * BLOCK
}

fn large_after_churn(seed: u64) {
    let mut rng = Rng(seed);
    let mut c = Cache::new();
    let total = NS_BYTES / BLOCK as u64;
    // Churn: Stores (new or overwriting) and Deletes over 600 keys.
    for _ in 0..3000 {
        let k = key(1, rng.below(600) as u32);
        if rng.below(10) < 3 {
            let _ = c.ix.delete(&k, c.now);
        } else {
            let len = mixed_len(&mut rng);
            c.store(&k, len);
        }
    }
    let churn_evictions = c.ix.snapshot().evictions;
    // New large values, twice the namespace.
    let mut stored = 0u64;
    let mut order: Vec<KvKey> = Vec::new();
    let mut recent: VecDeque<(KvKey, u64)> = VecDeque::new();
    let mut recent_blocks = 0u64;
    let (mut evicting, mut over5, mut max_free, mut young_missing) = (0u32, 0u32, 0f64, 0u32);
    let mut failed = 0u32;
    let mut i = 0u32;
    while stored < 2 * total {
        let k = key(2, i);
        i += 1;
        let len = large_len(&mut rng);
        let free = c.free_fraction();
        let before = c.ix.snapshot().evictions;
        if !c.store(&k, len) {
            failed += 1;
            continue;
        }
        if c.ix.snapshot().evictions > before {
            evicting += 1;
            max_free = max_free.max(free);
            over5 += u32::from(free > 0.05);
        }
        stored += blocks(len);
        order.push(k);
        recent.push_back((k, blocks(len)));
        recent_blocks += blocks(len);
        // The newest eighth: what was stored after a key is under total/8.
        while recent_blocks - recent.front().map_or(0, |r| r.1) >= total / 8 {
            let Some((_, b)) = recent.pop_front() else {
                break;
            };
            recent_blocks -= b;
        }
        let present = c.present();
        young_missing += recent
            .iter()
            .take(recent.len().saturating_sub(1))
            .filter(|(k, _)| !present.contains(k))
            .count() as u32;
    }
    let present = c.present();
    let tenth = order.len().div_ceil(10);
    let by_tenth: Vec<String> = order
        .chunks(tenth)
        .map(|ch| {
            format!(
                "{}/{}",
                ch.iter().filter(|k| present.contains(k)).count(),
                ch.len()
            )
        })
        .collect();
    println!(
        "| {seed} | {churn_evictions} | {} | {evicting} | {over5} | {:.1} % | {young_missing} | {failed} | {} |",
        order.len(),
        max_free * 100.0,
        by_tenth.join(" ")
    );
}

/// Zipf(s) over `n` ranks: the cumulative weights.
fn zipf_cdf(n: usize, s: f64) -> Vec<f64> {
    let mut acc = 0.0;
    let mut cdf: Vec<f64> = (1..=n)
        .map(|r| {
            acc += 1.0 / (r as f64).powf(s);
            acc
        })
        .collect();
    for w in &mut cdf {
        *w /= acc;
    }
    cdf
}

/// An exact LRU of `cap` blocks (whole values, as the index places them).
struct Lru {
    cap: u64,
    used: u64,
    tick: u64,
    at: HashMap<u32, (u64, u64)>,
    by_tick: BTreeMap<u64, u32>,
}

impl Lru {
    fn get(&mut self, k: u32, size: u64) -> bool {
        self.tick += 1;
        if let Some((t, s)) = self.at.get(&k).copied() {
            self.by_tick.remove(&t);
            self.by_tick.insert(self.tick, k);
            self.at.insert(k, (self.tick, s));
            return true;
        }
        while self.used + size > self.cap {
            let Some((_, old)) = self.by_tick.pop_first() else {
                break;
            };
            if let Some((_, s)) = self.at.remove(&old) {
                self.used -= s;
            }
        }
        self.used += size;
        self.at.insert(k, (self.tick, size));
        self.by_tick.insert(self.tick, k);
        false
    }
}

fn zipf_hit_rate(label: &str, seed: u64, rounds: usize, len_of: impl Fn(&mut Rng) -> u32) {
    let mut rng = Rng(seed);
    let total = NS_BYTES / BLOCK as u64;
    // Keys whose values total twice the namespace.
    let mut lens = Vec::new();
    let mut sum = 0u64;
    while sum < 2 * total {
        let l = len_of(&mut rng);
        sum += blocks(l);
        lens.push(l);
    }
    let cdf = zipf_cdf(lens.len(), 0.99);
    let mut c = Cache::new();
    let mut lru = Lru {
        cap: total,
        used: 0,
        tick: 0,
        at: HashMap::new(),
        by_tick: BTreeMap::new(),
    };
    let requests = rounds * lens.len();
    let warm = requests / 4;
    let (mut hits, mut lru_hits) = (0u64, 0u64);
    for r in 0..requests {
        let u = rng.unit();
        let i = cdf.partition_point(|&w| w < u).min(lens.len() - 1);
        let k = key(3, i as u32);
        let hit = c.read(&k);
        if !hit {
            c.store(&k, lens[i]);
        }
        let lru_hit = lru.get(i as u32, blocks(lens[i]));
        if r >= warm {
            hits += u64::from(hit);
            lru_hits += u64::from(lru_hit);
        }
    }
    let n = (requests - warm) as f64;
    let s = c.ix.snapshot();
    println!(
        "| {label} | {seed} | {} | {requests} | {:.2} % | {:.2} % | {:.3} | {} |",
        lens.len(),
        100.0 * hits as f64 / n,
        100.0 * lru_hits as f64 / n,
        hits as f64 / lru_hits.max(1) as f64,
        s.evictions
    );
}

/// `n` one-block Stores into an empty namespace sized for them: the
/// allocator's cost as the index fills (each Store's search for a run must
/// stay bounded, not grow with the blocks in use).
fn fill_time(n: u32) {
    let ix = KvIndex::new(n as u64 * 16384 * 9 / 8, 512);
    let now = Instant::now();
    let mut changes = Vec::new();
    let t = Instant::now();
    for i in 0..n {
        let k = KvKey::new(&(i as u64).to_be_bytes()).unwrap_or_default();
        let stored = match ix.reserve(&k, 512, PLAIN, now) {
            Ok(Reserve::Ready(loc)) => ix.commit_store(&k, loc, PLAIN, now).is_ok(),
            _ => false,
        };
        assert!(stored, "store {i} of {n}");
        if i % 4096 == 0 {
            changes.clear();
            ix.drain_changes(&mut changes);
            ix.committed(true);
        }
    }
    let dt = t.elapsed();
    println!(
        "| {n} | {:.2} s | {:.2} us |",
        dt.as_secs_f64(),
        dt.as_secs_f64() * 1e6 / n as f64
    );
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` runs this
    // without it, in the test profile: one seed and fewer requests there
    // check that the program runs.
    let full = std::env::args().any(|a| a == "--bench");
    let seeds: &[u64] = if full { &[1, 2, 3, 4, 5, 6] } else { &[1] };
    let rounds = if full { 40 } else { 2 };
    println!("Large values after churn (256 MiB namespace, 4 KiB blocks)");
    println!();
    println!("| seed | churn evictions | new values | Stores that evicted | of them with > 5 % free | most free at an eviction | newest-eighth keys found missing | refused | present by tenth, oldest first |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for &s in seeds {
        large_after_churn(s);
    }
    println!();
    println!(
        "Zipf 0.99 cache-aside hit rate (after a quarter of the requests), index vs exact LRU"
    );
    println!();
    println!(
        "| values | seed | keys | requests | index hit rate | LRU hit rate | ratio | evictions |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for &s in seeds.iter().take(3) {
        zipf_hit_rate("64 KiB", s, rounds, |_| 64 << 10);
        zipf_hit_rate("0.5-1 MiB", s, rounds, large_len);
    }
    println!();
    println!("One-block Stores into an empty namespace sized for them (512-byte blocks, one key per 16 KiB)");
    println!();
    println!("| Stores | time | per Store |");
    println!("|---|---|---|");
    fill_time(if full { 1_000_000 } else { 20_000 });
}
