//! Two samples into one screen of text, at most `WIDTH` columns: reactors,
//! namespaces, pools, KV namespaces and cluster roles, rates over the
//! interval between the samples (the target's own clock). Pure: the tests
//! check it without a target or a terminal.

use super::sample::{Sample, VolumeSample};
use std::fmt::Write as _;

/// The view fits an 80-column terminal.
pub const WIDTH: usize = 80;

/// A latency quantile read from histogram buckets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Quantile {
    Us(f64),
    /// In the unbounded last bucket: above this many µs.
    Above(u64),
}

/// The `q`-quantile of the commands counted between `before` and `after`
/// (per-bucket counts, `bounds` the buckets' upper bounds in µs), linearly
/// interpolated inside its bucket as Prometheus' `histogram_quantile` does;
/// None when no command completed.
pub fn quantile(q: f64, before: &[u64], after: &[u64], bounds: &[Option<u64>]) -> Option<Quantile> {
    let counts: Vec<u64> = after
        .iter()
        .enumerate()
        .map(|(i, a)| a.saturating_sub(before.get(i).copied().unwrap_or(0)))
        .collect();
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = q * total as f64;
    let mut below = 0u64;
    let mut lower_us = 0u64;
    for (i, &c) in counts.iter().enumerate() {
        let bound = bounds.get(i).copied().flatten();
        if c > 0 && (below + c) as f64 >= rank {
            return Some(match bound {
                Some(upper) => {
                    let within = (rank - below as f64) / c as f64;
                    Quantile::Us(lower_us as f64 + within * (upper - lower_us) as f64)
                }
                None => Quantile::Above(lower_us),
            });
        }
        below += c;
        if let Some(b) = bound {
            lower_us = b;
        }
    }
    Some(Quantile::Above(lower_us))
}

fn fmt_quantile(q: Option<Quantile>) -> String {
    match q {
        None => "-".into(),
        Some(Quantile::Us(us)) => fmt_us(us),
        Some(Quantile::Above(us)) => format!(">{}", fmt_us(us as f64)),
    }
}

/// 850us, 12.5ms, 1.20s
fn fmt_us(us: f64) -> String {
    if us < 1000.0 {
        format!("{us:.0}us")
    } else if us < 1_000_000.0 {
        format!("{:.1}ms", us / 1000.0)
    } else {
        format!("{:.2}s", us / 1e6)
    }
}

/// 950, 12.3k, 4.10M
fn fmt_count(v: f64) -> String {
    if v < 1000.0 {
        format!("{v:.0}")
    } else if v < 1e6 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{:.2}M", v / 1e6)
    }
}

/// 512.0MiB, 4.0GiB
fn fmt_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b}B")
    } else {
        format!("{v:.1}{}", UNITS[u])
    }
}

/// At most `n` characters: a longer text keeps its end (an NQN's end names
/// it), marked with `..`.
fn fit(s: &str, n: usize) -> String {
    let len = s.chars().count();
    if len <= n {
        return s.to_string();
    }
    let keep: String = s.chars().skip(len - (n - 2)).collect();
    format!("..{keep}")
}

/// A namespace's short name: the NQN after its last `:`, then `/nsid`.
fn namespace_name(nqn: &str, nsid: u32) -> String {
    let short = nqn.rsplit(':').next().unwrap_or(nqn);
    format!("{short}/{nsid}")
}

/// Rates between two samples over `secs` seconds.
struct Interval<'a> {
    prev: Option<&'a Sample>,
    secs: f64,
}

impl Interval<'_> {
    /// Per second of `after - before`; None on the first look.
    fn rate(&self, before: Option<u64>, after: u64) -> Option<f64> {
        let b = before?;
        (self.secs > 0.0).then(|| after.saturating_sub(b) as f64 / self.secs)
    }

    fn prev_volume(&self, alias: &str) -> Option<&VolumeSample> {
        self.prev?.volumes.get(alias)
    }
}

fn rate_text(r: Option<f64>, f: fn(f64) -> String) -> String {
    r.map(f).unwrap_or_else(|| "-".into())
}

fn mib(v: f64) -> String {
    format!("{:.1}", v / (1024.0 * 1024.0))
}

fn one_decimal(v: f64) -> String {
    format!("{v:.1}")
}

/// The screen for `cur`, with rates since `prev` (None: the first look),
/// refreshing every `every_secs`.
pub fn render(prev: Option<&Sample>, cur: &Sample, every_secs: f64) -> Vec<String> {
    let secs = prev
        .map(|p| cur.at_ns.saturating_sub(p.at_ns) as f64 / 1e9)
        .unwrap_or(0.0);
    let iv = Interval { prev, secs };
    let mut out = Vec::new();
    let up = cur.at_ns / 1_000_000_000;
    out.push(format!(
        "kvtarget top - pid {} - up {}h{:02}m{:02}s - every {every_secs:.1}s - q quits",
        cur.pid,
        up / 3600,
        up / 60 % 60,
        up % 60
    ));
    out.push(String::new());
    reactors(&mut out, &iv, cur);
    out.push(String::new());
    namespaces(&mut out, &iv, cur);
    out.push(String::new());
    pools(&mut out, &iv, cur);
    if !cur.kv.is_empty() {
        out.push(String::new());
        kv(&mut out, &iv, cur);
    }
    if cur.cluster.is_some() {
        out.push(String::new());
        cluster(&mut out, cur);
    }
    for l in &mut out {
        if l.chars().count() > WIDTH {
            *l = l.chars().take(WIDTH).collect();
        }
    }
    out
}

fn reactors(out: &mut Vec<String>, iv: &Interval, cur: &Sample) {
    out.push(format!(
        "{:<8} {:>6} {:>9} {:>9} {:>7}",
        "REACTOR", "BUSY%", "STALLS/S", "MAX GAP", "QPAIRS"
    ));
    for r in &cur.reactors {
        let before = iv
            .prev
            .and_then(|p| p.reactors.iter().find(|x| x.lcore == r.lcore));
        // Busy share of the time accounted between the two looks.
        let busy = before.and_then(|b| {
            let busy = r.busy.saturating_sub(b.busy) as f64;
            let all = busy + r.idle.saturating_sub(b.idle) as f64;
            (all > 0.0).then(|| 100.0 * busy / all)
        });
        let stalls = iv.rate(before.map(|b| b.stalls), r.stalls);
        out.push(format!(
            "{:<8} {:>6} {:>9} {:>9} {:>7}",
            r.lcore,
            rate_text(busy, one_decimal),
            rate_text(stalls, one_decimal),
            fmt_us(r.max_poll_gap as f64 / 1000.0),
            r.queue_pairs
        ));
    }
}

fn namespaces(out: &mut Vec<String>, iv: &Interval, cur: &Sample) {
    out.push(format!(
        "{:<18} {:<12} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7}",
        "NAMESPACE", "VOLUME", "R IOPS", "W IOPS", "R MiB/s", "W MiB/s", "R P99", "W P99"
    ));
    if cur.namespaces.is_empty() {
        out.push("(no namespaces)".into());
    }
    for n in &cur.namespaces {
        let name = fit(&namespace_name(&n.subsystem, n.nsid), 18);
        let Some(v) = cur.volumes.get(&n.bdev) else {
            // A whole device, not a pool volume: no per-volume counters.
            out.push(format!(
                "{name:<18} {:<12} (a device: no volume counters)",
                fit(&n.bdev, 12)
            ));
            continue;
        };
        let b = iv.prev_volume(&n.bdev);
        let p99 = |hist_before: Option<&Vec<u64>>, hist: &Vec<u64>| match hist_before {
            Some(h) => fmt_quantile(quantile(0.99, h, hist, &cur.bucket_bounds_us)),
            None => "-".into(),
        };
        out.push(format!(
            "{name:<18} {:<12} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7}",
            fit(&n.bdev, 12),
            rate_text(iv.rate(b.map(|b| b.reads), v.reads), fmt_count),
            rate_text(iv.rate(b.map(|b| b.writes), v.writes), fmt_count),
            rate_text(iv.rate(b.map(|b| b.read_bytes), v.read_bytes), mib),
            rate_text(iv.rate(b.map(|b| b.write_bytes), v.write_bytes), mib),
            p99(b.map(|b| &b.read_hist), &v.read_hist),
            p99(b.map(|b| &b.write_hist), &v.write_hist),
        ));
    }
}

fn pools(out: &mut Vec<String>, iv: &Interval, cur: &Sample) {
    out.push(format!(
        "{:<12} {:>6} {:>19} {:<9} {:>8} {:>8} {:>8}",
        "POOL", "FILL%", "USED / CAPACITY", "GC", "BACKLOG", "SCRUB/S", "LIMIT/S"
    ));
    for p in &cur.pools {
        let fill = match p.extents {
            0 => 0.0,
            n => 100.0 * p.mapped as f64 / n as f64,
        };
        let before = iv
            .prev
            .and_then(|x| x.pools.iter().find(|q| q.name == p.name));
        let scrub = iv.rate(before.map(|b| b.gc.scrubbed), p.gc.scrubbed);
        let mode = if p.gc.paused { "paused" } else { &p.gc.mode };
        out.push(format!(
            "{:<12} {:>6.1} {:>19} {:<9} {:>8} {:>8} {:>8}",
            fit(&p.name, 12),
            fill,
            format!(
                "{} / {}",
                fmt_bytes(p.mapped * p.extent_size),
                fmt_bytes(p.extents * p.extent_size)
            ),
            mode,
            p.dirty,
            rate_text(scrub, one_decimal),
            format!("{:.0}", p.gc.rate_extents_per_s)
        ));
    }
    if cur.pools.is_empty() {
        out.push("(no pools)".into());
    }
}

fn kv(out: &mut Vec<String>, iv: &Interval, cur: &Sample) {
    out.push(format!(
        "{:<18} {:>9} {:>6} {:>9} {:>9} {:>9}",
        "KV NAMESPACE", "KEYS", "HIT%", "HITS/S", "MISSES/S", "EVICT/S"
    ));
    for (name, k) in &cur.kv {
        let b = iv.prev.and_then(|p| p.kv.get(name));
        let hits = iv.rate(b.map(|b| b.hits), k.hits);
        let misses = iv.rate(b.map(|b| b.misses), k.misses);
        let hit_pct = match (hits, misses) {
            (Some(h), Some(m)) if h + m > 0.0 => Some(100.0 * h / (h + m)),
            _ => None,
        };
        out.push(format!(
            "{:<18} {:>9} {:>6} {:>9} {:>9} {:>9}",
            fit(name, 18),
            fmt_count(k.keys as f64),
            rate_text(hit_pct, one_decimal),
            rate_text(hits, fmt_count),
            rate_text(misses, fmt_count),
            rate_text(iv.rate(b.map(|b| b.evictions), k.evictions), fmt_count),
        ));
    }
}

fn cluster(out: &mut Vec<String>, cur: &Sample) {
    let Some(c) = &cur.cluster else {
        return;
    };
    let mut head = String::new();
    let _ = write!(
        head,
        "CLUSTER {} - node {} - {} - {} members",
        c.cluster,
        c.node,
        c.state,
        c.members.len()
    );
    out.push(head);
    out.push(format!(
        "{:<40} {:>6} {:<9} {:<20}",
        "SUBSYSTEM", "GROUP", "ROLE", "OWNER"
    ));
    for g in &c.groups {
        out.push(format!(
            "{:<40} {:>6} {:<9} {:<20}",
            fit(&g.subnqn, 40),
            g.anagrpid,
            g.role,
            fit(g.owner.as_deref().unwrap_or("-"), 20)
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::super::sample::*;
    use super::*;

    fn bounds() -> Vec<Option<u64>> {
        (0..kvtarget::stats::LATENCY_BUCKETS)
            .map(kvtarget::stats::latency_bucket_le_us)
            .collect()
    }

    #[test]
    fn quantiles_interpolate_inside_their_bucket() {
        let b = bounds();
        let zero = vec![0; b.len()];
        let mut h = zero.clone();
        // 100 commands: 50 at <= 16 us, 50 in (16, 32].
        h[0] = 50;
        h[1] = 50;
        assert_eq!(quantile(0.5, &zero, &h, &b), Some(Quantile::Us(16.0)));
        assert_eq!(
            quantile(0.99, &zero, &h, &b),
            Some(Quantile::Us(16.0 + 0.98 * 16.0))
        );
        // Only what happened between the looks counts.
        assert_eq!(quantile(0.99, &h, &h, &b), None);
        let mut slow = h.clone();
        *slow.last_mut().unwrap() += 10;
        let last_bound = b[b.len() - 2].unwrap();
        assert_eq!(
            quantile(0.99, &h, &slow, &b),
            Some(Quantile::Above(last_bound))
        );
    }

    fn sample(at_s: u64, scale: u64) -> Sample {
        let b = bounds();
        let mut hist = vec![0; b.len()];
        hist[3] = 100 * scale;
        let vol = VolumeSample {
            aliases: vec!["kv/kv0".into()],
            reads: 1000 * scale,
            writes: 500 * scale,
            read_bytes: 4096 * 1000 * scale,
            write_bytes: (1 << 20) * scale,
            read_hist: hist.clone(),
            write_hist: hist,
        };
        Sample {
            at_ns: at_s * 1_000_000_000,
            pid: 42,
            reactors: vec![ReactorSample {
                lcore: 0,
                busy: 250_000_000 * at_s,
                idle: 750_000_000 * at_s,
                queue_pairs: 3,
                stalls: 0,
                max_poll_gap: 1_500_000,
            }],
            namespaces: vec![
                NamespaceSample {
                    subsystem: "nqn.2026-11.io.kvtarget:a-rather-long-subsystem-name".into(),
                    nsid: 1,
                    bdev: "kv/kv0".into(),
                },
                NamespaceSample {
                    subsystem: "nqn.2026-11.io.kvtarget:ram".into(),
                    nsid: 2,
                    bdev: "ram:nqn.2026-11.io.kvtarget:ram/2".into(),
                },
            ],
            volumes: [("kv/kv0".to_string(), vol)].into_iter().collect(),
            bucket_bounds_us: b,
            pools: vec![PoolSample {
                name: "kv".into(),
                extent_size: 1 << 20,
                extents: 4096,
                mapped: 512,
                dirty: 7,
                gc: GcSample {
                    mode: "running".into(),
                    paused: false,
                    rate_extents_per_s: 2000.0,
                    scrubbed: 10 * scale,
                },
            }],
            kv: [(
                "kv/cache".to_string(),
                KvSample {
                    name: "kv/cache".into(),
                    keys: 12345,
                    hits: 900 * scale,
                    misses: 100 * scale,
                    evictions: 0,
                },
            )]
            .into_iter()
            .collect(),
            cluster: Some(ClusterSample {
                cluster: "tier".into(),
                node: "a".into(),
                state: "joined".into(),
                members: vec![serde_json::json!({}), serde_json::json!({})],
                groups: vec![GroupSample {
                    subnqn: "nqn.2026-11.io.kvtarget:tier".into(),
                    anagrpid: 1,
                    role: "owner".into(),
                    owner: Some("a".into()),
                }],
            }),
        }
    }

    #[test]
    fn the_screen_fits_80_columns_and_shows_rates() {
        let (a, b) = (sample(10, 1), sample(12, 3));
        let lines = render(Some(&a), &b, 1.0);
        let text = lines.join("\n");
        for l in &lines {
            assert!(l.chars().count() <= WIDTH, "{l}");
        }
        // Reactor 0: a quarter busy.
        assert!(
            text.contains("0          25.0       0.0     1.5ms       3"),
            "{text}"
        );
        // 2000 reads and 1000 writes in 2 s; the P99 of bucket (64, 128] us.
        let ns = lines.iter().find(|l| l.contains("kv/kv0")).unwrap();
        assert!(ns.starts_with("..subsystem-name/1 kv/kv0"), "{ns}");
        assert!(ns.contains("   1.0k     500"), "{ns}");
        assert!(ns.contains("127us"), "{ns}");
        assert!(text.contains("(a device: no volume counters)"), "{text}");
        assert!(text.contains("kv             12.5"), "{text}");
        assert!(text.contains("running"), "{text}");
        assert!(text.contains("90.0"), "KV hit rate: {text}");
        assert!(
            text.contains("CLUSTER tier - node a - joined - 2 members"),
            "{text}"
        );
        assert!(text.contains("owner"), "{text}");
    }

    #[test]
    fn the_first_look_has_no_rates_yet() {
        let lines = render(None, &sample(10, 1), 1.0);
        let ns = lines.iter().find(|l| l.contains("kv/kv0")).unwrap();
        assert!(ns.contains("      -       -"), "{ns}");
    }
}
