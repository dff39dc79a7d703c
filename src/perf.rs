//! `kvtarget perf`: a load generator over the in-repo NVMe/TCP initiator, in the
//! spirit of `spdk_nvme_perf`. One thread per queue, each keeping `qd` commands in
//! flight; latency is measured from submit to completion.

use crate::initiator::{HostController, HostOptions};
use crate::wire::tcp::Digests;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Latency histogram: log2 major buckets with 64 linear sub-buckets each (better
/// than 2 % resolution), over nanoseconds. Fixed size, no allocation per sample.
#[derive(Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    sum_ns: u128,
    max_ns: u64,
}

const SUB: usize = 64;
const MAJORS: usize = 40;

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; SUB * MAJORS],
            total: 0,
            sum_ns: 0,
            max_ns: 0,
        }
    }
}

impl Histogram {
    fn index(ns: u64) -> usize {
        if ns < SUB as u64 {
            return ns as usize;
        }
        let major = 63 - ns.leading_zeros() as usize; // >= 6
        let shift = major - 6;
        let sub = ((ns >> shift) as usize) - SUB;
        ((major - 5) * SUB + sub).min(SUB * MAJORS - 1)
    }

    /// The upper bound (ns) of bucket `i`.
    fn bound(i: usize) -> u64 {
        if i < SUB {
            return i as u64;
        }
        let major = i / SUB + 5;
        let sub = (i % SUB) as u64;
        let shift = major - 6;
        ((SUB as u64 + sub + 1) << shift) - 1
    }

    pub fn record(&mut self, ns: u64) {
        self.counts[Self::index(ns)] += 1;
        self.total += 1;
        self.sum_ns += ns as u128;
        self.max_ns = self.max_ns.max(ns);
    }

    pub fn merge(&mut self, o: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            *a += b;
        }
        self.total += o.total;
        self.sum_ns += o.sum_ns;
        self.max_ns = self.max_ns.max(o.max_ns);
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    pub fn mean_ns(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.sum_ns as f64 / self.total as f64
        }
    }

    /// The value at quantile `q` (0..=1), as the upper bound of its bucket.
    pub fn quantile_ns(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::bound(i).min(self.max_ns);
            }
        }
        self.max_ns
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    RandRead,
    RandWrite,
    RandRw,
    Read,
    Write,
}

impl std::str::FromStr for Workload {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "randread" => Workload::RandRead,
            "randwrite" => Workload::RandWrite,
            "randrw" => Workload::RandRw,
            "read" => Workload::Read,
            "write" => Workload::Write,
            _ => {
                return Err(format!(
                    "--workload: `{s}` is not randread|randwrite|randrw|read|write"
                ))
            }
        })
    }
}

#[derive(Debug, Clone)]
pub struct PerfOptions {
    pub addr: SocketAddr,
    pub nqn: String,
    pub hostnqn: Option<String>,
    pub nsid: u32,
    pub workload: Workload,
    /// Percentage of reads for randrw.
    pub read_pct: u32,
    pub block_size: usize,
    pub qd: usize,
    pub queues: u16,
    pub runtime: Duration,
    pub warmup: Duration,
    pub digests: Digests,
}

#[derive(Debug, Clone)]
pub struct PerfReport {
    pub ios: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub iops: f64,
    pub mib_s: f64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub p9999_us: f64,
    pub max_us: f64,
    pub errors: u64,
    /// CPU time this process used per I/O, in microseconds.
    pub cpu_us_per_io: f64,
}

impl PerfReport {
    pub fn to_json(&self) -> String {
        format!(
            "{{\"ios\":{},\"bytes\":{},\"seconds\":{:.3},\"iops\":{:.1},\"mib_s\":{:.2},\"lat_us\":{{\"mean\":{:.2},\"p50\":{:.2},\"p90\":{:.2},\"p99\":{:.2},\"p99_9\":{:.2},\"p99_99\":{:.2},\"max\":{:.2}}},\"errors\":{},\"cpu_us_per_io\":{:.3}}}",
            self.ios, self.bytes, self.seconds, self.iops, self.mib_s, self.mean_us, self.p50_us,
            self.p90_us, self.p99_us, self.p999_us, self.p9999_us, self.max_us, self.errors, self.cpu_us_per_io
        )
    }

    pub fn to_text(&self) -> String {
        format!(
            "IOPS {:.0}  {:.1} MiB/s  lat us: avg {:.1} p50 {:.1} p90 {:.1} p99 {:.1} p99.9 {:.1} p99.99 {:.1} max {:.1}  errors {}  cpu {:.2} us/IO",
            self.iops, self.mib_s, self.mean_us, self.p50_us, self.p90_us, self.p99_us, self.p999_us, self.p9999_us, self.max_us, self.errors, self.cpu_us_per_io
        )
    }
}

fn cpu_time() -> Duration {
    // SAFETY: getrusage writes into a zeroed rusage we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to ru for the duration of the call.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Runs the workload and returns the report. Errors name what failed.
pub fn run(o: &PerfOptions) -> Result<PerfReport, String> {
    let mut ho = HostOptions::new(o.addr, &o.nqn);
    if let Some(h) = &o.hostnqn {
        ho.hostnqn = h.clone();
    }
    ho.digests = o.digests;
    ho.queue_size = (o.qd as u16 + 1).max(2);
    let mut ctrl = HostController::connect(&ho).map_err(|e| format!("connect {}: {e}", o.addr))?;
    let granted = ctrl
        .set_queue_count(o.queues)
        .map_err(|e| format!("set queue count: {e}"))?;
    if granted < o.queues {
        return Err(format!(
            "target granted {granted} I/O queues, {} asked",
            o.queues
        ));
    }
    let ns = ctrl
        .identify_namespace(o.nsid)
        .map_err(|e| format!("identify namespace {}: {e}", o.nsid))?;
    if ns.nsze == 0 {
        return Err(format!("namespace {} is not active", o.nsid));
    }
    let lba = 1u32 << ns.lbads;
    if o.block_size == 0 || o.block_size % lba as usize != 0 {
        return Err(format!(
            "--bs must be a multiple of the {lba}-byte block size"
        ));
    }
    let nlb = (o.block_size / lba as usize) as u32;
    let slots = ns.nsze / nlb as u64;
    if slots == 0 {
        return Err("namespace smaller than one I/O".into());
    }
    let start = Instant::now() + o.warmup;
    let end = start + o.runtime;
    let cpu0 = std::sync::Mutex::new(None::<Duration>);
    let results: Vec<Result<(Histogram, u64), String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (1..=o.queues)
            .map(|qid| {
                let ctrl = &ctrl;
                let cpu0 = &cpu0;
                s.spawn(move || -> Result<(Histogram, u64), String> {
                    let mut q = ctrl
                        .io_queue(qid)
                        .map_err(|e| format!("queue {qid}: {e}"))?;
                    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ qid as u64);
                    let mut hist = Histogram::default();
                    let mut errors = 0u64;
                    let mut seq = (slots / o.queues as u64) * (qid as u64 - 1);
                    let payload = vec![0x5Au8; o.block_size];
                    let mut issued: std::collections::HashMap<u16, Instant> = Default::default();
                    let mut measuring = false;
                    loop {
                        let now = Instant::now();
                        if !measuring && now >= start {
                            measuring = true;
                            hist = Histogram::default();
                            errors = 0;
                            if let Ok(mut c) = cpu0.lock() {
                                c.get_or_insert_with(cpu_time);
                            }
                        }
                        let stop = now >= end;
                        while !stop && issued.len() < o.qd {
                            let slot = match o.workload {
                                Workload::Read | Workload::Write => {
                                    seq = (seq + 1) % slots;
                                    seq
                                }
                                _ => rng.next() % slots,
                            };
                            let read = match o.workload {
                                Workload::RandRead | Workload::Read => true,
                                Workload::RandWrite | Workload::Write => false,
                                Workload::RandRw => (rng.next() % 100) < o.read_pct as u64,
                            };
                            let slba = slot * nlb as u64;
                            let cid = if read {
                                q.submit_read(o.nsid, slba, nlb, lba)
                            } else {
                                q.submit_write(o.nsid, slba, payload.clone(), lba, false)
                            }
                            .map_err(|e| format!("queue {qid}: submit: {e}"))?;
                            issued.insert(cid, Instant::now());
                        }
                        if issued.is_empty() {
                            break;
                        }
                        let c = q.q.wait_any().map_err(|e| format!("queue {qid}: {e}"))?;
                        if let Some(t) = issued.remove(&c.cqe.cid) {
                            if measuring {
                                hist.record(t.elapsed().as_nanos() as u64);
                                if !c.status().is_success() {
                                    errors += 1;
                                }
                            }
                        }
                    }
                    Ok((hist, errors))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("worker panicked".into())))
            .collect()
    });
    let cpu_used = cpu_time().saturating_sub(cpu0.lock().ok().and_then(|c| *c).unwrap_or_default());
    let mut hist = Histogram::default();
    let mut errors = 0;
    for r in results {
        let (h, e) = r?;
        hist.merge(&h);
        errors += e;
    }
    let secs = o.runtime.as_secs_f64();
    let ios = hist.count();
    let us = |ns: u64| ns as f64 / 1000.0;
    Ok(PerfReport {
        ios,
        bytes: ios * o.block_size as u64,
        seconds: secs,
        iops: ios as f64 / secs,
        mib_s: (ios * o.block_size as u64) as f64 / secs / (1 << 20) as f64,
        mean_us: hist.mean_ns() / 1000.0,
        p50_us: us(hist.quantile_ns(0.50)),
        p90_us: us(hist.quantile_ns(0.90)),
        p99_us: us(hist.quantile_ns(0.99)),
        p999_us: us(hist.quantile_ns(0.999)),
        p9999_us: us(hist.quantile_ns(0.9999)),
        max_us: us(hist.max_ns),
        errors,
        cpu_us_per_io: if ios == 0 {
            0.0
        } else {
            cpu_used.as_secs_f64() * 1e6 / ios as f64
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles_are_close() {
        let mut h = Histogram::default();
        for v in 1..=100_000u64 {
            h.record(v * 10);
        }
        let p50 = h.quantile_ns(0.5) as f64;
        let p99 = h.quantile_ns(0.99) as f64;
        assert!((p50 / 500_000.0 - 1.0).abs() < 0.03, "{p50}");
        assert!((p99 / 990_000.0 - 1.0).abs() < 0.03, "{p99}");
        assert_eq!(h.quantile_ns(1.0), 1_000_000);
        assert!((h.mean_ns() - 500_005.0).abs() < 1.0);
    }

    #[test]
    fn histogram_buckets_are_monotonic() {
        let mut last = 0;
        for i in 0..SUB * MAJORS {
            let b = Histogram::bound(i);
            assert!(b >= last, "bucket {i}");
            last = b;
        }
        for ns in [0u64, 1, 63, 64, 65, 1000, 123_456_789, u64::MAX / 4] {
            let i = Histogram::index(ns);
            assert!(
                Histogram::bound(i) >= ns.min(Histogram::bound(SUB * MAJORS - 1)),
                "{ns}"
            );
        }
    }
}
