//! Latency histograms shared by the NVMe-oF core (per queue pair) and the pool
//! (per volume channel). A leaf module: both depend on it, it depends on neither.

/// Histogram bucket upper bounds: 16 µs doubling to about 1 s, then +Inf.
pub const LATENCY_BUCKETS: usize = 18;

pub fn latency_bucket_le_us(i: usize) -> Option<u64> {
    (i + 1 < LATENCY_BUCKETS).then(|| 16u64 << i)
}

/// The bucket a latency falls in (`#[inline]`: every command's completion in
/// the core and every volume channel's count one, from other crates).
#[inline]
pub fn latency_bucket(ns: u64) -> usize {
    // The smallest i with us <= 16 << i, in closed form (every command
    // is counted, so no loop): the bit length of (us - 1) / 16.
    let us = ns / 1000;
    let i = (u64::BITS - (us.saturating_sub(1) >> 4).leading_zeros()) as usize;
    i.min(LATENCY_BUCKETS - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition: the first bucket whose bound holds the latency.
    fn by_definition(ns: u64) -> usize {
        let us = ns / 1000;
        (0..LATENCY_BUCKETS)
            .find(|&i| latency_bucket_le_us(i).map_or(true, |le| us <= le))
            .unwrap_or(LATENCY_BUCKETS - 1)
    }

    #[test]
    fn buckets_match_their_bounds() {
        let mut edges = vec![0, 1, 999, u64::MAX];
        for i in 0..LATENCY_BUCKETS as u32 + 2 {
            let us = 16u64 << i;
            edges.extend([us * 1000 - 1, us * 1000, us * 1000 + 999, us * 1000 + 1000]);
        }
        for ns in edges {
            assert_eq!(latency_bucket(ns), by_definition(ns), "{ns} ns");
        }
    }

    proptest::proptest! {
        #[test]
        fn any_latency_lands_in_its_bucket(ns in proptest::prelude::any::<u64>()) {
            proptest::prop_assert_eq!(latency_bucket(ns), by_definition(ns));
        }
    }
}
