//! Stall visibility: what a reactor knows about its own hiccups.
//!
//! One stalled reactor stalls every queue it owns, so each reactor keeps, in
//! its `ReactorShared`:
//! - the gap between two polls (one pass of its loop, sleep in epoll left out)
//!   as a log2 histogram, plus the longest gap since the last scrape;
//! - its own thread's page faults and involuntary context switches, read with
//!   `getrusage(RUSAGE_THREAD)` on a timer (a cold path, once per second).
//!
//! The reactor is the only writer: it updates the counters with a relaxed
//! load and store (no locked read-modify-write per pass); readers (a scrape,
//! an RPC) load them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Poll-gap histogram buckets: upper bounds 1 µs doubling to 2^20 µs (about
/// 1 s), then +Inf. A busy pass takes well under a microsecond; a page fault on
/// a transparent huge page costs about 100 µs; the stalls worth a look (tens of
/// milliseconds) land in the upper buckets.
pub const POLL_GAP_BUCKETS: usize = 22;

/// How often a reactor reads its own resource usage.
pub const RUSAGE_EVERY: Duration = Duration::from_secs(1);

/// Default bound on one pass before a warning is logged (`reactors.stall_warn_us`).
pub const DEFAULT_STALL_WARN_US: u64 = 10_000;

/// Least time between two stall warnings of one reactor: a reactor stalling on
/// every pass logs once a second, with the number it left out.
pub const STALL_WARN_EVERY_NS: u64 = 1_000_000_000;

/// Upper bound of bucket `i` in microseconds; `None` for the last (+Inf).
pub fn poll_gap_bucket_le_us(i: usize) -> Option<u64> {
    (i + 1 < POLL_GAP_BUCKETS).then(|| 1u64 << i)
}

/// The bucket a gap of `ns` falls in: the smallest i with us <= 2^i, where
/// us = ns / 1000 rounded up (a 1.5 µs gap is over the 1 µs bound).
pub fn poll_gap_bucket(ns: u64) -> usize {
    let us = ns.div_ceil(1000);
    let i = (u64::BITS - us.saturating_sub(1).leading_zeros()) as usize;
    i.min(POLL_GAP_BUCKETS - 1)
}

/// A reactor's stall counters (see the module header).
#[derive(Default)]
pub struct StallStats {
    gap_buckets: [AtomicU64; POLL_GAP_BUCKETS],
    gap_sum_ns: AtomicU64,
    max_gap_ns: AtomicU64,
    /// Passes longer than the warning bound.
    stalls: AtomicU64,
    minor_faults: AtomicU64,
    major_faults: AtomicU64,
    involuntary_switches: AtomicU64,
    rusage_samples: AtomicU64,
}

/// A copy of a reactor's stall counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StallSnapshot {
    /// Count per bucket (not cumulative).
    pub gap_buckets: [u64; POLL_GAP_BUCKETS],
    pub gap_sum_ns: u64,
    /// The longest gap since the last `take_max_gap_ns` (not reset by a snapshot).
    pub max_gap_ns: u64,
    pub stalls: u64,
    pub minor_faults: u64,
    pub major_faults: u64,
    pub involuntary_switches: u64,
    /// How many times the reactor has read its resource usage (0: not yet).
    pub rusage_samples: u64,
}

impl StallSnapshot {
    pub fn gap_count(&self) -> u64 {
        self.gap_buckets.iter().sum()
    }
}

/// Adds one from the only writer (no locked instruction on the poll path).
fn bump(a: &AtomicU64, by: u64) {
    a.store(
        a.load(Ordering::Relaxed).wrapping_add(by),
        Ordering::Relaxed,
    );
}

impl StallStats {
    /// Records the gap of one pass. Reactor thread only (single writer).
    pub fn record_gap(&self, ns: u64, over_bound: bool) {
        bump(&self.gap_buckets[poll_gap_bucket(ns)], 1);
        bump(&self.gap_sum_ns, ns);
        if ns > self.max_gap_ns.load(Ordering::Relaxed) {
            // A scrape's reset racing this store loses at most this gap to
            // the next scrape, which then reports it.
            self.max_gap_ns.store(ns, Ordering::Relaxed);
        }
        if over_bound {
            bump(&self.stalls, 1);
        }
    }

    /// The longest gap since the last call, resetting it (a scrape's gauge).
    pub fn take_max_gap_ns(&self) -> u64 {
        self.max_gap_ns.swap(0, Ordering::Relaxed)
    }

    /// Reads the calling thread's resource usage into the counters. Reactor
    /// thread only: RUSAGE_THREAD is the caller's own.
    pub fn sample_rusage(&self) -> std::io::Result<()> {
        let u = thread_rusage()?;
        self.minor_faults.store(u.minor_faults, Ordering::Relaxed);
        self.major_faults.store(u.major_faults, Ordering::Relaxed);
        self.involuntary_switches
            .store(u.involuntary_switches, Ordering::Relaxed);
        bump(&self.rusage_samples, 1);
        Ok(())
    }

    pub fn snapshot(&self) -> StallSnapshot {
        let mut s = StallSnapshot {
            gap_sum_ns: self.gap_sum_ns.load(Ordering::Relaxed),
            max_gap_ns: self.max_gap_ns.load(Ordering::Relaxed),
            stalls: self.stalls.load(Ordering::Relaxed),
            minor_faults: self.minor_faults.load(Ordering::Relaxed),
            major_faults: self.major_faults.load(Ordering::Relaxed),
            involuntary_switches: self.involuntary_switches.load(Ordering::Relaxed),
            rusage_samples: self.rusage_samples.load(Ordering::Relaxed),
            ..StallSnapshot::default()
        };
        for (d, b) in s.gap_buckets.iter_mut().zip(&self.gap_buckets) {
            *d = b.load(Ordering::Relaxed);
        }
        s
    }
}

/// The calling thread's fault and context-switch counts.
#[derive(Debug, Clone, Copy)]
pub struct ThreadUsage {
    pub minor_faults: u64,
    pub major_faults: u64,
    pub involuntary_switches: u64,
}

/// `getrusage(RUSAGE_THREAD)` for the calling thread.
pub fn thread_rusage() -> std::io::Result<ThreadUsage> {
    let mut u = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: u is a valid, writable rusage; the kernel fills it on success.
    let r = unsafe { libc::getrusage(libc::RUSAGE_THREAD, u.as_mut_ptr()) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: zero-initialised and filled by a successful getrusage.
    let u = unsafe { u.assume_init() };
    Ok(ThreadUsage {
        minor_faults: u.ru_minflt as u64,
        major_faults: u.ru_majflt as u64,
        involuntary_switches: u.ru_nivcsw as u64,
    })
}

/// Rate-limits the stall warning of one reactor (reactor-local state).
#[derive(Debug, Default)]
pub struct StallWarner {
    last_warn_ns: Option<u64>,
    suppressed: u64,
}

impl StallWarner {
    /// Called for a pass over the bound at `now_ns`: true when a warning is
    /// due, with the number of earlier ones left out since the last.
    pub fn due(&mut self, now_ns: u64) -> Option<u64> {
        match self.last_warn_ns {
            Some(t) if now_ns.saturating_sub(t) < STALL_WARN_EVERY_NS => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last_warn_ns = Some(now_ns);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The DMA arena (`mem::dma`) hands out resident memory: a test of `mem`
    /// that lives here because it reads this module's fault counters.
    #[test]
    fn committed_chunks_are_resident_free_blocks() {
        use kvt_mem::{dma, IoBuf};
        dma::commit_at_least(4 * dma::CHUNK_BYTES);
        assert!(dma::committed_bytes() >= 4 * dma::CHUNK_BYTES);
        let before = dma::committed_bytes();
        let b = IoBuf::new(1 << 20);
        assert!(b.iter().all(|&x| x == 0));
        // Arena memory is resident when handed out: writing it faults nothing.
        let mut c = IoBuf::new(64 << 10);
        let t = thread_rusage().unwrap();
        c.fill(7);
        let u = thread_rusage().unwrap();
        assert_eq!(
            u.minor_faults + u.major_faults,
            t.minor_faults + t.major_faults
        );
        assert!(dma::committed_bytes() >= before);
    }

    fn by_definition(ns: u64) -> usize {
        let us = ns.div_ceil(1000);
        (0..POLL_GAP_BUCKETS)
            .find(|&i| poll_gap_bucket_le_us(i).map_or(true, |le| us <= le))
            .unwrap_or(POLL_GAP_BUCKETS - 1)
    }

    #[test]
    fn gaps_land_in_their_bucket() {
        let mut edges = vec![0, 1, 999, 1000, 1001, u64::MAX];
        for i in 0..POLL_GAP_BUCKETS as u32 + 2 {
            let us = 1u64 << i;
            edges.extend([us * 1000 - 1, us * 1000, us * 1000 + 1]);
        }
        for ns in edges {
            assert_eq!(poll_gap_bucket(ns), by_definition(ns), "{ns} ns");
        }
    }

    #[test]
    fn max_gap_is_reset_by_a_scrape_and_histogram_is_not() {
        let s = StallStats::default();
        s.record_gap(500, false);
        s.record_gap(30_000_000, true);
        s.record_gap(2_000, false);
        let snap = s.snapshot();
        assert_eq!(snap.gap_count(), 3);
        assert_eq!(snap.gap_sum_ns, 30_002_500);
        assert_eq!(snap.stalls, 1);
        assert_eq!(snap.gap_buckets[0], 1);
        assert_eq!(snap.gap_buckets[1], 1);
        assert_eq!(snap.gap_buckets[15], 1, "30 ms <= 2^15 us");
        assert_eq!(s.take_max_gap_ns(), 30_000_000);
        assert_eq!(s.take_max_gap_ns(), 0);
        assert_eq!(s.snapshot().gap_count(), 3);
    }

    #[test]
    fn rusage_is_read_for_this_thread() {
        let s = StallStats::default();
        s.sample_rusage().unwrap();
        let a = s.snapshot();
        assert_eq!(a.rusage_samples, 1);
        // Touch fresh pages on this thread: its minor-fault count moves.
        let mut v = vec![0u8; 64 << 20];
        for i in (0..v.len()).step_by(4096) {
            v[i] = 1;
        }
        std::hint::black_box(&v);
        s.sample_rusage().unwrap();
        assert!(s.snapshot().minor_faults > a.minor_faults);
    }

    #[test]
    fn stall_warnings_are_rate_limited() {
        let mut w = StallWarner::default();
        assert_eq!(w.due(5), Some(0));
        assert_eq!(w.due(10), None);
        assert_eq!(w.due(STALL_WARN_EVERY_NS), None);
        assert_eq!(w.due(STALL_WARN_EVERY_NS + 5), Some(2));
    }
}
