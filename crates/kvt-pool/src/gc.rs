//! Admission control for background GC.
//!
//! GC scrubs freed (dirty) extents. It gets a token bucket whose rate follows
//! AIMD: it grows by a fixed step while foreground I/O looks unhurt, and halves
//! when foreground latency rises above its GC-idle baseline or foreground queue
//! depth passes a limit. Below the low watermark of clean extents GC turns
//! urgent and ignores the bucket, because writes would otherwise wait for space.

use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct GcSettings {
    /// Percent of the pool's extents: below this many clean extents GC is urgent.
    pub low_watermark_pct: u64,
    /// Percent: above this many clean extents GC runs only when foreground idles.
    pub high_watermark_pct: u64,
    /// Scrub rate bounds, extents per second.
    pub min_rate: f64,
    pub max_rate: f64,
    /// Additive increase per tick.
    pub step: f64,
    /// Foreground operations in flight above which GC backs off.
    pub max_foreground_qd: u64,
    /// Latency rise over the baseline (as a ratio) that counts as congestion.
    pub latency_slack: f64,
    /// Extents scrubbed per batch at most.
    pub batch: usize,
    /// Metadata thread wake-up interval.
    pub tick: Duration,
    /// Scrub exactly this many extents per step whatever the load (the
    /// deterministic simulation, and measuring GC's raw cost).
    pub fixed_batch: Option<usize>,
}

impl Default for GcSettings {
    fn default() -> Self {
        GcSettings {
            low_watermark_pct: 5,
            high_watermark_pct: 20,
            min_rate: 2.0,
            max_rate: 20_000.0,
            step: 5.0,
            max_foreground_qd: 8,
            latency_slack: 1.1,
            batch: 32,
            tick: Duration::from_millis(10),
            fixed_batch: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum GcMode {
    /// Nothing to scrub.
    Idle = 0,
    /// Scrubbing at the admitted rate.
    Running = 1,
    /// Foreground is busy: rate cut back.
    Throttled = 2,
    /// Clean extents below the low watermark: scrubbing at full speed.
    Urgent = 3,
}

impl GcMode {
    pub fn name(self) -> &'static str {
        match self {
            GcMode::Idle => "idle",
            GcMode::Running => "running",
            GcMode::Throttled => "throttled",
            GcMode::Urgent => "urgent",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Admission {
    pub s: GcSettings,
    pub rate: f64,
    tokens: f64,
    last: Option<Instant>,
    /// Foreground latency while GC idles (EWMA, ns).
    pub baseline_ns: f64,
    pub mode: GcMode,
}

impl Admission {
    pub fn new(s: GcSettings) -> Admission {
        Admission {
            rate: s.min_rate.max(s.step),
            s,
            tokens: 0.0,
            last: None,
            baseline_ns: 0.0,
            mode: GcMode::Idle,
        }
    }

    /// (low, high) watermarks in extents.
    pub fn watermarks(&self, extents: u64) -> (u64, u64) {
        (
            (extents * self.s.low_watermark_pct / 100).max(1),
            (extents * self.s.high_watermark_pct / 100).max(2),
        )
    }

    /// How many extents GC may scrub now.
    pub fn grant(
        &mut self,
        now: Instant,
        backlog: u64,
        clean: u64,
        extents: u64,
        fg_inflight: u64,
        fg_latency_ns: u64,
    ) -> usize {
        let dt = self
            .last
            .map(|l| now.saturating_duration_since(l).as_secs_f64())
            .unwrap_or(0.0);
        self.last = Some(now);
        if backlog == 0 {
            self.mode = GcMode::Idle;
            if fg_latency_ns > 0 {
                self.baseline_ns = if self.baseline_ns == 0.0 {
                    fg_latency_ns as f64
                } else {
                    self.baseline_ns * 0.9 + fg_latency_ns as f64 * 0.1
                };
            }
            self.tokens = 0.0;
            return 0;
        }
        if let Some(n) = self.s.fixed_batch {
            self.mode = GcMode::Running;
            return n.min(backlog as usize);
        }
        let (low, high) = self.watermarks(extents);
        if clean < low {
            self.mode = GcMode::Urgent;
            return self.s.batch.min(backlog as usize);
        }
        let congested = fg_inflight > self.s.max_foreground_qd
            || (self.baseline_ns > 0.0
                && fg_latency_ns as f64 > self.baseline_ns * self.s.latency_slack);
        if congested {
            self.rate = (self.rate / 2.0).max(self.s.min_rate);
            self.mode = GcMode::Throttled;
        } else {
            self.rate = (self.rate + self.s.step).min(self.s.max_rate);
            self.mode = GcMode::Running;
        }
        // Plenty of clean space and a busy foreground: wait for a quiet moment.
        if clean > high && fg_inflight > 0 && congested {
            return 0;
        }
        // Small steps spread the work: at most 4 extents per grant unless urgent.
        self.tokens = (self.tokens + self.rate * dt).min(4.0);
        let n = (self.tokens as usize).min(backlog as usize);
        self.tokens -= n as f64;
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backs_off_under_load_and_goes_urgent_when_short() {
        let mut a = Admission::new(GcSettings::default());
        let t0 = Instant::now();
        // Idle: learns the baseline latency.
        for i in 0..10 {
            a.grant(t0 + Duration::from_millis(i), 0, 1000, 10_000, 1, 100_000);
        }
        assert_eq!(a.mode, GcMode::Idle);
        let mut t = t0 + Duration::from_millis(10);
        let mut granted = 0;
        for _ in 0..100 {
            t += Duration::from_millis(10);
            granted += a.grant(t, 500, 5000, 10_000, 1, 100_000);
        }
        assert_eq!(a.mode, GcMode::Running);
        assert!(granted > 0);
        let fast = a.rate;
        for _ in 0..5 {
            t += Duration::from_millis(10);
            a.grant(t, 500, 5000, 10_000, 32, 400_000);
        }
        assert_eq!(a.mode, GcMode::Throttled);
        assert!(a.rate < fast / 8.0, "rate {} vs {fast}", a.rate);
        t += Duration::from_millis(10);
        assert_eq!(a.grant(t, 500, 10, 10_000, 32, 400_000), 32);
        assert_eq!(a.mode, GcMode::Urgent);
    }
}
