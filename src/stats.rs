//! Latency histograms shared by the NVMe-oF core (per queue pair) and the pool
//! (per volume channel). A leaf module: both depend on it, it depends on neither.

/// Histogram bucket upper bounds: 16 µs doubling to about 1 s, then +Inf.
pub const LATENCY_BUCKETS: usize = 18;

pub fn latency_bucket_le_us(i: usize) -> Option<u64> {
    (i + 1 < LATENCY_BUCKETS).then(|| 16u64 << i)
}

/// The bucket a latency falls in.
pub fn latency_bucket(ns: u64) -> usize {
    let us = ns / 1000;
    let mut i = 0;
    while i + 1 < LATENCY_BUCKETS && us > (16u64 << i) {
        i += 1;
    }
    i
}
