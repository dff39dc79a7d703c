//! Prometheus metrics over HTTP (`GET /metrics`, text exposition format 0.0.4).
//!
//! Cheap enough to leave on: the data path only bumps counters that belong to
//! one reactor (per-channel volume counters, reactor busy/idle time); a scrape
//! sums them here.

use crate::rpc::methods::Control;
use kvt_cluster::{ClusterStatus, NodeState};
use kvt_mem::stats::latency_bucket_le_us;
use kvt_nvmf::{QpairStats, Subsystem};
use kvt_pool::kv::KvSnapshot;
use kvt_pool::volume::{IoTotals, Volume};
use kvt_pool::{Pool, PoolSnapshot};
use kvt_reactor::stall::{poll_gap_bucket_le_us, StallSnapshot};
use kvt_transport::rdma::PollGroupStats;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kvt_reactor::sys::{wait_readable, EventFd, CONTROL_ERROR_PAUSE};
use std::os::fd::AsRawFd;

fn esc(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A metric family's Prometheus type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// A sample's value: integers print as integers, so counts stay exact.
enum Value {
    Int(u64),
    Float(f64),
    /// Cumulative (le, count) buckets, the last "+Inf"; sum; count.
    Hist {
        buckets: Vec<(String, u64)>,
        sum: f64,
    },
}

impl From<u64> for Value {
    fn from(v: u64) -> Value {
        Value::Int(v)
    }
}
impl From<usize> for Value {
    fn from(v: usize) -> Value {
        Value::Int(v as u64)
    }
}
impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::Int(v as u64)
    }
}
impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::Float(v)
    }
}

type Labels = Vec<(&'static str, String)>;

/// One labelled sample of a family.
struct Sample {
    labels: Labels,
    value: Value,
}

/// Where a reader puts its samples.
#[derive(Default)]
struct Samples(Vec<Sample>);

impl Samples {
    fn push(&mut self, labels: Labels, value: impl Into<Value>) {
        self.0.push(Sample {
            labels,
            value: value.into(),
        });
    }
    /// A histogram from per-bucket counts, bounds `le_us(i)` in microseconds
    /// (`None`: +Inf), and the sum in nanoseconds; exposed in seconds.
    fn histogram(
        &mut self,
        labels: Labels,
        counts: impl IntoIterator<Item = u64>,
        le_us: fn(usize) -> Option<u64>,
        sum_ns: u64,
    ) {
        let mut cum = 0u64;
        let buckets = counts
            .into_iter()
            .enumerate()
            .map(|(i, c)| {
                cum += c;
                let le = match le_us(i) {
                    Some(us) => format!("{}", us as f64 / 1e6),
                    None => "+Inf".into(),
                };
                (le, cum)
            })
            .collect();
        self.0.push(Sample {
            labels,
            value: Value::Hist {
                buckets,
                sum: sum_ns as f64 / 1e9,
            },
        });
    }
}

/// Everything one scrape reads, gathered once before the table is rendered.
struct Scrape<'a> {
    ctl: &'a Control,
    /// Per reactor: its stall counters, and the longest poll gap since the
    /// last scrape (taken: this scrape resets it).
    stalls: Vec<(StallSnapshot, u64)>,
    rdma: Vec<PollGroupStats>,
    subs: Vec<Arc<Subsystem>>,
    qps: Vec<Arc<QpairStats>>,
    /// (pool name, volume, its I/O totals).
    vols: Vec<(String, Arc<Volume>, IoTotals)>,
    /// (pool name, volume name, KV counters) of KV volumes.
    kvs: Vec<(String, String, KvSnapshot)>,
    pools: Vec<(Arc<Pool>, PoolSnapshot)>,
    cluster: Option<ClusterStatus>,
}

impl<'a> Scrape<'a> {
    fn gather(ctl: &'a Control) -> Scrape<'a> {
        let vols: Vec<_> = ctl
            .pools()
            .iter()
            .flat_map(|p| p.volumes().into_iter().map(move |v| (p.name.clone(), v)))
            .map(|(p, v)| {
                let t = v.io_totals();
                (p, v, t)
            })
            .collect();
        let kvs = vols
            .iter()
            .filter_map(|(p, v, _)| {
                let k = v.kv.as_ref()?;
                Some((p.clone(), v.desc.name.clone(), k.snapshot()))
            })
            .collect();
        Scrape {
            ctl,
            stalls: ctl
                .reactors
                .iter()
                .map(|r| (r.stall.snapshot(), r.stall.take_max_gap_ns()))
                .collect(),
            rdma: kvt_transport::rdma::poll_group_stats(),
            subs: ctl
                .target
                .subsystems
                .read()
                .map(|s| s.clone())
                .unwrap_or_default(),
            qps: ctl.target.live_qpairs(),
            vols,
            kvs,
            pools: ctl
                .pools()
                .iter()
                .map(|p| (p.clone(), p.snapshot()))
                .collect(),
            cluster: ctl.cluster.get().map(|c| c.snapshot()),
        }
    }

    fn per_reactor<V: Into<Value>>(&self, o: &mut Samples, f: impl Fn(&ReactorRow) -> V) {
        for (r, (stall, max_gap_ns)) in self.ctl.reactors.iter().zip(&self.stalls) {
            let row = ReactorRow {
                shared: r,
                stall,
                max_gap_ns: *max_gap_ns,
            };
            o.push(vec![("reactor", r.id.to_string())], f(&row));
        }
    }

    fn per_poll_group<V: Into<Value>>(&self, o: &mut Samples, f: impl Fn(&PollGroupStats) -> V) {
        for g in &self.rdma {
            let l = vec![
                ("reactor", g.reactor.to_string()),
                ("device", g.device.clone()),
            ];
            o.push(l, f(g));
        }
    }

    /// One sample per queue pair and `(label value, reading)`.
    fn per_qpair(
        &self,
        o: &mut Samples,
        label: &'static str,
        f: impl Fn(&QpairStats) -> Vec<(String, u64)>,
    ) {
        for q in &self.qps {
            for (v, n) in f(q) {
                let mut l = qpair_labels(q);
                l.push((label, v));
                o.push(l, n);
            }
        }
    }

    /// One sample per volume and `(op, reading)`.
    fn per_volume_op(&self, o: &mut Samples, f: impl Fn(&IoTotals) -> Vec<(&'static str, u64)>) {
        for (p, v, t) in &self.vols {
            for (op, n) in f(t) {
                let mut l = volume_labels(p, &v.desc.name);
                l.push(("op", op.into()));
                o.push(l, n);
            }
        }
    }

    fn per_volume<V: Into<Value>>(&self, o: &mut Samples, f: impl Fn(&Volume, &IoTotals) -> V) {
        for (p, v, t) in &self.vols {
            o.push(volume_labels(p, &v.desc.name), f(v, t));
        }
    }

    fn per_kv(&self, o: &mut Samples, f: fn(&KvSnapshot) -> u64) {
        for (p, v, k) in &self.kvs {
            o.push(volume_labels(p, v), f(k));
        }
    }

    fn per_pool<V: Into<Value>>(&self, o: &mut Samples, f: impl Fn(&PoolSnapshot) -> V) {
        for (p, s) in &self.pools {
            o.push(vec![("pool", p.name.clone())], f(s));
        }
    }

    /// One sample per pool and `(label value, reading)`.
    fn per_pool_by<V: Into<Value>>(
        &self,
        o: &mut Samples,
        label: &'static str,
        f: impl Fn(&Pool, &PoolSnapshot) -> Vec<(&'static str, V)>,
    ) {
        for (p, s) in &self.pools {
            for (v, n) in f(p, s) {
                o.push(vec![("pool", p.name.clone()), (label, v.into())], n);
            }
        }
    }
}

/// What a reactor reader sees.
struct ReactorRow<'a> {
    shared: &'a kvt_reactor::ReactorShared,
    stall: &'a StallSnapshot,
    max_gap_ns: u64,
}

fn qpair_labels(q: &QpairStats) -> Labels {
    vec![
        ("subsystem", q.subnqn.clone()),
        ("cntlid", q.cntlid.to_string()),
        ("qid", q.qid.to_string()),
    ]
}

fn volume_labels(pool: &str, volume: &str) -> Labels {
    vec![("pool", pool.to_string()), ("volume", volume.to_string())]
}

fn ld(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

/// One row of the table: a metric family and how to read its samples.
struct Metric {
    name: &'static str,
    kind: Kind,
    help: &'static str,
    read: fn(&Scrape, &mut Samples),
}

const fn metric(
    name: &'static str,
    kind: Kind,
    help: &'static str,
    read: fn(&Scrape, &mut Samples),
) -> Metric {
    Metric {
        name,
        kind,
        help,
        read,
    }
}

use Kind::{Counter, Gauge, Histogram};

/// Every metric, in exposition order (docs/metrics.md describes each). One row
/// per family, kept on few lines so the table reads as one.
#[rustfmt::skip]
const METRICS: &[Metric] = &[
    metric("kvtarget_build_info", Gauge, "Version of the running target.", |s, o| {
        let l = vec![
            ("version", env!("CARGO_PKG_VERSION").to_string()),
            ("revision", s.ctl.target.firmware.clone()),
        ];
        o.push(l, 1u64)
    }),
    // Reactors.
    metric("kvtarget_reactor_busy_seconds_total", Counter, "Time reactors spent in polls that found work.", |s, o| {
        s.per_reactor(o, |r| ld(&r.shared.busy_ns) as f64 / 1e9)
    }),
    metric("kvtarget_reactor_idle_seconds_total", Counter, "Time reactors spent in polls that found nothing.", |s, o| {
        s.per_reactor(o, |r| ld(&r.shared.idle_ns) as f64 / 1e9)
    }),
    metric("kvtarget_reactor_queue_pairs", Gauge, "Queue pairs (connections) owned by each reactor.", |s, o| {
        s.per_reactor(o, |r| ld(&r.shared.queue_pairs))
    }),
    metric("kvtarget_reactor_kv_asks_posted_total", Counter, "KV index steps a reactor's queues sent to the reactor owning the index.", |s, o| {
        s.per_reactor(o, |r| ld(&r.shared.kv_asks_posted))
    }),
    metric("kvtarget_reactor_kv_asks_served_total", Counter, "KV index steps a reactor carried out for other reactors' queues.", |s, o| {
        s.per_reactor(o, |r| ld(&r.shared.kv_asks_served))
    }),
    metric("kvtarget_reactor_kv_indexes_owned", Gauge, "KV namespaces' key indexes a reactor owns.", |s, o| {
        s.per_reactor(o, |r| ld(&r.shared.kv_indexes_owned))
    }),
    // Reactor stalls (reactor::stall): gaps between two polls, passes over
    // `reactors.stall_warn_us`, the reactor thread's own faults and switches.
    metric("kvtarget_reactor_poll_gap_seconds", Histogram, "Time between two polls of a reactor (one pass of its loop; sleep in epoll left out).", |s, o| {
        for (r, (st, _)) in s.ctl.reactors.iter().zip(&s.stalls) {
            let l = vec![("reactor", r.id.to_string())];
            o.histogram(l, st.gap_buckets, poll_gap_bucket_le_us, st.gap_sum_ns);
        }
    }),
    metric("kvtarget_reactor_max_poll_gap_seconds", Gauge, "Longest time between two polls of a reactor since the last scrape (a scrape resets it).", |s, o| {
        s.per_reactor(o, |r| r.max_gap_ns as f64 / 1e9)
    }),
    metric("kvtarget_reactor_stalls_total", Counter, "Passes of a reactor's loop longer than reactors.stall_warn_us.", |s, o| {
        s.per_reactor(o, |r| r.stall.stalls)
    }),
    metric("kvtarget_reactor_minor_faults_total", Counter, "Minor page faults taken by the reactor thread (getrusage RUSAGE_THREAD, read once a second).", |s, o| {
        s.per_reactor(o, |r| r.stall.minor_faults)
    }),
    metric("kvtarget_reactor_major_faults_total", Counter, "Major page faults (waits for I/O) taken by the reactor thread (read once a second).", |s, o| {
        s.per_reactor(o, |r| r.stall.major_faults)
    }),
    metric("kvtarget_reactor_involuntary_context_switches_total", Counter, "Times the kernel preempted the reactor thread (read once a second).", |s, o| {
        s.per_reactor(o, |r| r.stall.involuntary_switches)
    }),
    // RDMA poll groups: one completion queue per (reactor, device), shared by
    // that reactor's QPs on the device.
    metric("kvtarget_rdma_poll_group_polls_total", Counter, "Polls of the reactor's RDMA completion queue.", |s, o| {
        s.per_poll_group(o, |g| g.polls)
    }),
    metric("kvtarget_rdma_poll_group_idle_polls_total", Counter, "Polls of the RDMA completion queue that found nothing.", |s, o| {
        s.per_poll_group(o, |g| g.idle_polls)
    }),
    metric("kvtarget_rdma_poll_group_completions_total", Counter, "Work completions polled from the RDMA completion queue.", |s, o| {
        s.per_poll_group(o, |g| g.completions)
    }),
    metric("kvtarget_rdma_poll_group_requests_total", Counter, "NVMe command capsules received by the poll group's QPs.", |s, o| {
        s.per_poll_group(o, |g| g.requests)
    }),
    metric("kvtarget_rdma_poll_group_send_wrs_total", Counter, "Send work requests posted (SEND, RDMA READ, RDMA WRITE).", |s, o| {
        s.per_poll_group(o, |g| g.send_wrs)
    }),
    metric("kvtarget_rdma_poll_group_recv_wrs_total", Counter, "Receive work requests posted.", |s, o| {
        s.per_poll_group(o, |g| g.recv_wrs)
    }),
    metric("kvtarget_rdma_poll_group_dropped_completions_total", Counter, "Completions that belonged to no live QP (dropped, never delivered).", |s, o| {
        s.per_poll_group(o, |g| g.dropped_completions)
    }),
    metric("kvtarget_rdma_poll_group_queue_pairs", Gauge, "QPs whose sends and receives complete on this completion queue.", |s, o| {
        s.per_poll_group(o, |g| g.qpairs as u64)
    }),
    metric("kvtarget_rdma_poll_group_cq_entries", Gauge, "Size of the completion queue.", |s, o| {
        s.per_poll_group(o, |g| g.cq_entries as u64)
    }),
    metric("kvtarget_rdma_poll_group_cq_entries_reserved", Gauge, "Completion queue entries reserved by live QPs.", |s, o| {
        s.per_poll_group(o, |g| g.cq_entries_reserved as u64)
    }),
    metric("kvtarget_rdma_completion_queues", Gauge, "RDMA completion queues per reactor (one per device it serves).", |s, o| {
        let mut per_reactor: std::collections::BTreeMap<usize, usize> = Default::default();
        for g in &s.rdma {
            *per_reactor.entry(g.reactor).or_default() += 1;
        }
        for (r, n) in per_reactor {
            o.push(vec![("reactor", r.to_string())], n);
        }
    }),
    // Target-wide refusals.
    metric("kvtarget_connect_refused_total", Counter, "Refused Fabrics Connect commands.", |s, o| {
        o.push(vec![("reason", "host_not_allowed".into())], ld(&s.ctl.target.refused_host));
        o.push(vec![("reason", "other".into())], ld(&s.ctl.target.refused_other));
    }),
    metric("kvtarget_auth_failures_total", Counter, "Queues that failed DH-HMAC-CHAP authentication (wrong or missing key, timeout, bad message).", |s, o| {
        o.push(vec![], ld(&s.ctl.target.auth_failures))
    }),
    metric("kvtarget_tls_failures_total", Counter, "Connections a secure_channel listener refused (plaintext ICReq, unknown PSK identity, failed TLS handshake).", |s, o| {
        o.push(vec![], ld(&s.ctl.target.tls_failures))
    }),
    // Subsystems and namespaces.
    metric("kvtarget_subsystem_controllers", Gauge, "Controllers (host associations) per subsystem.", |s, o| {
        for sub in &s.subs {
            let n = sub.controllers.lock().map(|c| c.len()).unwrap_or(0);
            o.push(vec![("subsystem", sub.nqn.clone())], n);
        }
    }),
    metric("kvtarget_ana_groups", Gauge, "ANA groups holding a namespace, per subsystem that reports ANA, listener and state.", |s, o| {
        for sub in s.subs.iter().filter(|x| x.ana.is_reporting()) {
            for (l, counts) in kvt_nvmf::ana::listener_state_counts(sub) {
                for (st, n) in kvt_nvmf::ana::ANA_STATES.iter().zip(counts) {
                    let labels = vec![("subsystem", sub.nqn.clone()), ("listener", l.to_string()), ("state", st.name().into())];
                    o.push(labels, n);
                }
            }
        }
    }),
    metric("kvtarget_namespace_info", Gauge, "Which volume each namespace serves.", |s, o| {
        for sub in &s.subs {
            for n in sub.namespace_snapshot() {
                let l = vec![
                    ("subsystem", sub.nqn.clone()),
                    ("nsid", n.nsid.to_string()),
                    ("volume", s.ctl.bdev_name_of(&n)),
                ];
                o.push(l, 1u64);
            }
        }
    }),
    // Queue pairs (connections): commands, bytes, errors, latency from
    // capsule in to response out.
    metric("kvtarget_qpair_commands_total", Counter, "Completed commands per queue pair.", |s, o| {
        s.per_qpair(o, "op", |q| {
            vec![("read".into(), ld(&q.reads)), ("write".into(), ld(&q.writes)), ("other".into(), ld(&q.other))]
        })
    }),
    metric("kvtarget_qpair_bytes_total", Counter, "Data bytes per queue pair.", |s, o| {
        s.per_qpair(o, "op", |q| vec![("read".into(), ld(&q.read_bytes)), ("write".into(), ld(&q.write_bytes))])
    }),
    metric("kvtarget_qpair_errors_total", Counter, "Commands completed with an error status, by kind.", |s, o| {
        s.per_qpair(o, "status", |q| {
            let kinds = kvt_nvmf::ERROR_KINDS.iter();
            kinds.zip(&q.errors_by).map(|(k, n)| (k.to_string(), ld(n))).collect()
        })
    }),
    metric("kvtarget_qpair_latency_seconds", Histogram, "Command latency seen by the host side of each queue pair.", |s, o| {
        for q in &s.qps {
            for (op, hist, sum) in [("read", &q.read_hist, &q.read_ns), ("write", &q.write_hist, &q.write_ns)] {
                let mut l = qpair_labels(q);
                l.push(("op", op.into()));
                o.histogram(l, hist.iter().map(ld), latency_bucket_le_us, ld(sum));
            }
        }
    }),
    // Volumes: I/O counters, latency histograms, capacity and use.
    metric("kvtarget_volume_ops_total", Counter, "Completed commands per volume and operation.", |s, o| {
        s.per_volume_op(o, |t| vec![("read", t.reads), ("write", t.writes), ("unmap", t.unmaps), ("flush", t.flushes)])
    }),
    metric("kvtarget_volume_bytes_total", Counter, "Bytes moved per volume and operation.", |s, o| {
        s.per_volume_op(o, |t| vec![("read", t.read_bytes), ("write", t.write_bytes), ("unmap", t.unmap_bytes)])
    }),
    metric("kvtarget_volume_errors_total", Counter, "Commands that completed with an error.", |s, o| {
        s.per_volume(o, |_, t| t.errors)
    }),
    metric("kvtarget_volume_latency_seconds", Histogram, "Device-side command latency per volume.", |s, o| {
        for (p, v, t) in &s.vols {
            for (op, hist, sum_ns) in [("read", &t.read_hist, t.read_ns), ("write", &t.write_hist, t.write_ns)] {
                let mut l = volume_labels(p, &v.desc.name);
                l.push(("op", op.into()));
                o.histogram(l, hist.iter().copied(), latency_bucket_le_us, sum_ns);
            }
        }
    }),
    metric("kvtarget_volume_size_bytes", Gauge, "Volume capacity.", |s, o| {
        s.per_volume(o, |v, _| v.desc.size_bytes)
    }),
    metric("kvtarget_volume_used_bytes", Gauge, "Bytes of written blocks (NUSE).", |s, o| {
        s.per_volume(o, |v, _| v.used_bytes())
    }),
    // KV namespaces: the cache's own counters.
    metric("kvtarget_kv_keys", Gauge, "Keys holding a value.", |s, o| s.per_kv(o, |k| k.keys)),
    metric("kvtarget_kv_value_bytes", Gauge, "Bytes of stored values.", |s, o| s.per_kv(o, |k| k.value_bytes)),
    metric("kvtarget_kv_stores_total", Counter, "Completed Stores.", |s, o| s.per_kv(o, |k| k.stores)),
    metric("kvtarget_kv_hits_total", Counter, "Retrieves and Exists that found their key.", |s, o| s.per_kv(o, |k| k.hits)),
    metric("kvtarget_kv_misses_total", Counter, "Retrieves and Exists of a key with no value (evicted, expired, deleted or never stored).", |s, o| {
        s.per_kv(o, |k| k.misses)
    }),
    metric("kvtarget_kv_evictions_total", Counter, "Keys evicted to make room.", |s, o| s.per_kv(o, |k| k.evictions)),
    metric("kvtarget_kv_eviction_age_seconds_total", Counter, "Sum of evicted keys' ages since they were stored; over evictions, the mean age.", |s, o| {
        s.per_kv(o, |k| k.eviction_age_ms / 1000)
    }),
    metric("kvtarget_kv_expirations_total", Counter, "Keys dropped by the namespace's TTL.", |s, o| s.per_kv(o, |k| k.expirations)),
    metric("kvtarget_kv_trimmed_extents_total", Counter, "Extents whose blocks stayed free long enough to go back to the pool.", |s, o| {
        s.per_kv(o, |k| k.trimmed_extents)
    }),
    // Pools and GC.
    metric("kvtarget_pool_extents", Gauge, "Pool extents by state.", |s, o| {
        s.per_pool_by(o, "state", |_, p| {
            vec![("mapped", p.mapped), ("clean", p.clean), ("dirty", p.dirty), ("reserved", p.reserved)]
        })
    }),
    metric("kvtarget_pool_capacity_bytes", Gauge, "Pool capacity (extents times extent size).", |s, o| {
        s.per_pool(o, |p| p.extents as u64 * p.extent_size)
    }),
    metric("kvtarget_pool_used_bytes", Gauge, "Bytes in mapped extents.", |s, o| {
        s.per_pool(o, |p| p.mapped * p.extent_size)
    }),
    metric("kvtarget_gc_backlog_extents", Gauge, "Freed extents waiting to be scrubbed.", |s, o| {
        s.per_pool(o, |p| p.dirty)
    }),
    metric("kvtarget_gc_rate_extents_per_second", Gauge, "Rate GC's admission controller currently allows.", |s, o| {
        s.per_pool(o, |p| p.gc_rate)
    }),
    metric("kvtarget_gc_scrubbed_extents_total", Counter, "Extents scrubbed by GC.", |s, o| {
        s.per_pool(o, |p| p.gc_scrubbed)
    }),
    metric("kvtarget_gc_state", Gauge, "GC admission state (1 for the current one).", |s, o| {
        s.per_pool_by(o, "state", |pool, p| {
            let mut v: Vec<_> = ["idle", "running", "throttled", "urgent"]
                .into_iter()
                .map(|m| (m, p.gc_mode.name() == m))
                .collect();
            v.push(("paused", pool.gc_paused()));
            v
        })
    }),
    metric("kvtarget_gc_watermark_extents", Gauge, "Clean-extent watermarks of GC admission.", |s, o| {
        s.per_pool_by(o, "level", |_, p| vec![("low", p.low_watermark), ("high", p.high_watermark)])
    }),
    metric("kvtarget_pool_journal_used_bytes", Gauge, "Journal bytes since the last checkpoint.", |s, o| {
        s.per_pool(o, |p| p.journal_used)
    }),
    metric("kvtarget_pool_commits_total", Counter, "Metadata commits (Flush, FUA, GC, reservations).", |s, o| {
        s.per_pool(o, |p| p.commits)
    }),
    // Cluster membership ([cluster]; no samples without it).
    metric("kvtarget_cluster_members", Gauge, "Members of this node's cluster as it last read them from etcd.", |s, o| {
        if let Some(c) = &s.cluster {
            o.push(vec![("cluster", c.cluster.clone())], c.members.len())
        }
    }),
    metric("kvtarget_cluster_node_state", Gauge, "This node's membership state (1 for the current one).", |s, o| {
        if let Some(c) = &s.cluster {
            for st in [NodeState::Joining, NodeState::Joined, NodeState::Lost, NodeState::Alone] {
                let l = vec![("cluster", c.cluster.clone()), ("node", c.node.clone()), ("state", st.name().to_string())];
                o.push(l, c.state == st)
            }
        }
    }),
    metric("kvtarget_cluster_ana_group_role", Gauge, "This node's role per elected ANA group of a cluster-wide subsystem (1 for the current one).", |s, o| {
        if let Some(c) = &s.cluster {
            for g in &c.groups {
                for role in ["owner", "follower", "fenced"] {
                    let l = vec![("cluster", c.cluster.clone()), ("node", c.node.clone()), ("nqn", g.subnqn.clone()), ("anagrpid", g.anagrpid.to_string()), ("role", role.to_string())];
                    o.push(l, g.role == role)
                }
            }
        }
    }),
    metric("kvtarget_cluster_ana_group_epoch", Gauge, "The epoch (owner key's create revision) of each elected ANA group's owner as this node last saw it.", |s, o| {
        if let Some(c) = &s.cluster {
            for g in &c.groups {
                if let Some(e) = g.epoch {
                    let l = vec![("cluster", c.cluster.clone()), ("nqn", g.subnqn.clone()), ("anagrpid", g.anagrpid.to_string())];
                    o.push(l, e.max(0) as u64)
                }
            }
        }
    }),
];

/// Every family the endpoint exports, as (name, Prometheus type), in order:
/// what the alert rules and the dashboard may name (tests/deploy.rs).
pub fn families() -> impl Iterator<Item = (&'static str, &'static str)> {
    METRICS.iter().map(|m| (m.name, m.kind.name()))
}

/// Renders every metric of the table, in its order.
pub fn render(ctl: &Control) -> String {
    let scrape = Scrape::gather(ctl);
    let mut out = String::new();
    let mut samples = Samples::default();
    for m in METRICS {
        samples.0.clear();
        (m.read)(&scrape, &mut samples);
        let _ = writeln!(out, "# HELP {} {}", m.name, m.help);
        let _ = writeln!(out, "# TYPE {} {}", m.name, m.kind.name());
        for s in &samples.0 {
            write_sample(&mut out, m.name, s);
        }
    }
    out
}

fn write_sample(out: &mut String, name: &str, s: &Sample) {
    match &s.value {
        Value::Int(v) => line(out, name, "", &s.labels, None, v),
        Value::Float(v) => line(out, name, "", &s.labels, None, v),
        Value::Hist { buckets, sum } => {
            for (le, cum) in buckets {
                line(out, name, "_bucket", &s.labels, Some(le), cum);
            }
            line(out, name, "_sum", &s.labels, None, sum);
            let count = buckets.last().map_or(0, |b| b.1);
            line(out, name, "_count", &s.labels, None, count);
        }
    }
}

/// One exposition line: `name{labels} value`, with `le` last when given.
fn line(
    out: &mut String,
    name: &str,
    suffix: &str,
    labels: &Labels,
    le: Option<&String>,
    v: impl std::fmt::Display,
) {
    let mut l: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", esc(v)))
        .collect();
    if let Some(le) = le {
        l.push(format!("le=\"{}\"", esc(le)));
    }
    if l.is_empty() {
        let _ = writeln!(out, "{name}{suffix} {v}");
    } else {
        let _ = writeln!(out, "{name}{suffix}{{{}}} {v}", l.join(","));
    }
}

/// Why the metrics endpoint did not start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// Binding, making non-blocking or reading back the listening socket.
    #[error("metrics on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("metrics thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// The metrics HTTP endpoint.
pub struct MetricsServer {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    /// Signalled at stop: the thread sleeps on it beside the listener.
    wake: Arc<EventFd>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MetricsServer {
    pub fn start(addr: SocketAddr, ctl: Arc<Control>) -> Result<MetricsServer, MetricsError> {
        let listen = |source| MetricsError::Listen { addr, source };
        let l = TcpListener::bind(addr).map_err(listen)?;
        l.set_nonblocking(true).map_err(listen)?;
        let addr = l.local_addr().map_err(listen)?;
        let stop = Arc::new(AtomicBool::new(false));
        let wake = Arc::new(EventFd::new().map_err(MetricsError::Thread)?);
        let (st, wk) = (stop.clone(), wake.clone());
        let thread = std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || accept_loop(&l, &ctl, &st, &wk))
            .map_err(MetricsError::Thread)?;
        tracing::info!("metrics on http://{addr}/metrics");
        Ok(MetricsServer {
            addr,
            stop,
            wake,
            thread: Some(thread),
        })
    }

    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.wake.signal();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Serves scrapes one at a time, sleeping until one comes or the server stops.
fn accept_loop(l: &TcpListener, ctl: &Control, stop: &AtomicBool, wake: &EventFd) {
    let mut ready = Vec::new();
    while !stop.load(Ordering::Acquire) {
        match wait_readable(&[l.as_raw_fd()], wake, &mut ready) {
            Ok(true) => continue,
            Ok(false) if ready[0] => {}
            Ok(false) => continue,
            Err(e) => {
                tracing::warn!("metrics: poll: {e}");
                std::thread::sleep(CONTROL_ERROR_PAUSE);
                continue;
            }
        }
        match l.accept() {
            Ok((sock, _)) => serve(sock, ctl),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => {
                tracing::warn!("metrics: accept: {e}");
                std::thread::sleep(CONTROL_ERROR_PAUSE);
            }
        }
    }
}

fn serve(mut sock: TcpStream, ctl: &Control) {
    let _ = sock.set_nonblocking(false);
    let _ = sock.set_read_timeout(Some(Duration::from_secs(2)));
    let mut req = Vec::new();
    let mut buf = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 8192 {
        match sock.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => req.extend_from_slice(&buf[..n]),
        }
    }
    let line = String::from_utf8_lossy(&req);
    let first = line.lines().next().unwrap_or("");
    let mut parts = first.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, ctype, body) = if method != "GET" {
        (
            "405 Method Not Allowed",
            "text/plain",
            "GET only\n".to_string(),
        )
    } else if path == "/metrics" || path.starts_with("/metrics?") {
        (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            render(ctl),
        )
    } else {
        ("404 Not Found", "text/plain", "see /metrics\n".to_string())
    };
    let resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = sock.write_all(resp.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_unique_and_follow_prometheus_conventions() {
        let mut seen = std::collections::HashSet::new();
        for m in METRICS {
            assert!(seen.insert(m.name), "{} twice", m.name);
            assert!(m.name.starts_with("kvtarget_"), "{}", m.name);
            assert!(
                m.name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "{}",
                m.name
            );
            assert_eq!(m.kind == Counter, m.name.ends_with("_total"), "{}", m.name);
            assert!(!m.help.is_empty() && !m.help.contains('\n'), "{}", m.name);
        }
    }

    #[test]
    fn a_histogram_renders_cumulative_buckets_then_sum_and_count() {
        let mut o = Samples::default();
        let counts = [3u64, 0, 2].into_iter().chain(std::iter::repeat_n(0, 19));
        o.histogram(
            vec![("reactor", "0".into())],
            counts,
            poll_gap_bucket_le_us,
            2_500_000_000,
        );
        o.push(vec![("a", "x\"y".into())], 1.5f64);
        let mut out = String::new();
        for s in &o.0 {
            write_sample(&mut out, "m", s);
        }
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "m_bucket{reactor=\"0\",le=\"0.000001\"} 3");
        assert_eq!(lines[2], "m_bucket{reactor=\"0\",le=\"0.000004\"} 5");
        assert_eq!(lines[21], "m_bucket{reactor=\"0\",le=\"+Inf\"} 5");
        assert_eq!(lines[22], "m_sum{reactor=\"0\"} 2.5");
        assert_eq!(lines[23], "m_count{reactor=\"0\"} 5");
        assert_eq!(lines[24], "m{a=\"x\\\"y\"} 1.5");
    }
}
