//! Prometheus metrics over HTTP (`GET /metrics`, text exposition format 0.0.4).
//!
//! Cheap enough to leave on: the data path only bumps counters that belong to
//! one reactor (per-channel volume counters, reactor busy/idle time); a scrape
//! sums them here.

use crate::rpc::methods::Control;
use crate::stats::{latency_bucket_le_us, LATENCY_BUCKETS};
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn esc(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

struct Out {
    s: String,
}

impl Out {
    fn head(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.s, "# HELP {name} {help}");
        let _ = writeln!(self.s, "# TYPE {name} {kind}");
    }
    fn line(&mut self, name: &str, labels: &[(&str, String)], v: impl std::fmt::Display) {
        let l: Vec<String> = labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", esc(v)))
            .collect();
        if l.is_empty() {
            let _ = writeln!(self.s, "{name} {v}");
        } else {
            let _ = writeln!(self.s, "{name}{{{}}} {v}", l.join(","));
        }
    }
}

/// Renders every metric.
pub fn render(ctl: &Control) -> String {
    let mut o = Out { s: String::new() };
    o.head(
        "kvtarget_build_info",
        "gauge",
        "Version of the running target.",
    );
    o.line(
        "kvtarget_build_info",
        &[
            ("version", env!("CARGO_PKG_VERSION").to_string()),
            ("revision", ctl.target.firmware.clone()),
        ],
        1,
    );

    o.head(
        "kvtarget_reactor_busy_seconds_total",
        "counter",
        "Time reactors spent in polls that found work.",
    );
    for r in &ctl.reactors {
        o.line(
            "kvtarget_reactor_busy_seconds_total",
            &[("reactor", r.id.to_string())],
            r.busy_ns.load(Ordering::Relaxed) as f64 / 1e9,
        );
    }
    o.head(
        "kvtarget_reactor_idle_seconds_total",
        "counter",
        "Time reactors spent in polls that found nothing.",
    );
    for r in &ctl.reactors {
        o.line(
            "kvtarget_reactor_idle_seconds_total",
            &[("reactor", r.id.to_string())],
            r.idle_ns.load(Ordering::Relaxed) as f64 / 1e9,
        );
    }
    o.head(
        "kvtarget_reactor_queue_pairs",
        "gauge",
        "Queue pairs (connections) owned by each reactor.",
    );
    for r in &ctl.reactors {
        o.line(
            "kvtarget_reactor_queue_pairs",
            &[("reactor", r.id.to_string())],
            r.queue_pairs.load(Ordering::Relaxed),
        );
    }

    rdma_poll_groups(&mut o, &crate::transport::rdma::poll_group_stats());

    o.head(
        "kvtarget_connect_refused_total",
        "counter",
        "Refused Fabrics Connect commands.",
    );
    o.line(
        "kvtarget_connect_refused_total",
        &[("reason", "host_not_allowed".into())],
        ctl.target.refused_host.load(Ordering::Relaxed),
    );
    o.line(
        "kvtarget_connect_refused_total",
        &[("reason", "other".into())],
        ctl.target.refused_other.load(Ordering::Relaxed),
    );
    o.head(
        "kvtarget_auth_failures_total",
        "counter",
        "Queues that failed DH-HMAC-CHAP authentication (wrong or missing key, timeout, bad message).",
    );
    o.line(
        "kvtarget_auth_failures_total",
        &[],
        ctl.target.auth_failures.load(Ordering::Relaxed),
    );
    o.head(
        "kvtarget_tls_failures_total",
        "counter",
        "Connections a secure_channel listener refused (plaintext ICReq, unknown PSK identity, failed TLS handshake).",
    );
    o.line(
        "kvtarget_tls_failures_total",
        &[],
        ctl.target.tls_failures.load(Ordering::Relaxed),
    );

    let subs = ctl
        .target
        .subsystems
        .read()
        .map(|s| s.clone())
        .unwrap_or_default();
    o.head(
        "kvtarget_subsystem_controllers",
        "gauge",
        "Controllers (host associations) per subsystem.",
    );
    for s in &subs {
        let n = s.controllers.lock().map(|c| c.len()).unwrap_or(0);
        o.line(
            "kvtarget_subsystem_controllers",
            &[("subsystem", s.nqn.clone())],
            n,
        );
    }
    o.head(
        "kvtarget_namespace_info",
        "gauge",
        "Which volume each namespace serves.",
    );
    for s in &subs {
        for n in s.namespace_snapshot() {
            let vol = ctl.bdev_name_of(&n);
            o.line(
                "kvtarget_namespace_info",
                &[
                    ("subsystem", s.nqn.clone()),
                    ("nsid", n.nsid.to_string()),
                    ("volume", vol),
                ],
                1,
            );
        }
    }

    // Queue pairs (connections): commands, bytes, errors, latency from capsule
    // in to response out.
    let qps = ctl.target.live_qpairs();
    let ql = |q: &crate::nvmf::QpairStats| {
        vec![
            ("subsystem", q.subnqn.clone()),
            ("cntlid", q.cntlid.to_string()),
            ("qid", q.qid.to_string()),
        ]
    };
    let ld = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    o.head(
        "kvtarget_qpair_commands_total",
        "counter",
        "Completed commands per queue pair.",
    );
    for q in &qps {
        for (op, n) in [
            ("read", ld(&q.reads)),
            ("write", ld(&q.writes)),
            ("other", ld(&q.other)),
        ] {
            let mut l = ql(q);
            l.push(("op", op.into()));
            o.line("kvtarget_qpair_commands_total", &l, n);
        }
    }
    o.head(
        "kvtarget_qpair_bytes_total",
        "counter",
        "Data bytes per queue pair.",
    );
    for q in &qps {
        for (op, n) in [("read", ld(&q.read_bytes)), ("write", ld(&q.write_bytes))] {
            let mut l = ql(q);
            l.push(("op", op.into()));
            o.line("kvtarget_qpair_bytes_total", &l, n);
        }
    }
    o.head(
        "kvtarget_qpair_errors_total",
        "counter",
        "Commands completed with an error status, by kind.",
    );
    for q in &qps {
        for (i, kind) in crate::nvmf::ERROR_KINDS.iter().enumerate() {
            let mut l = ql(q);
            l.push(("status", kind.to_string()));
            o.line("kvtarget_qpair_errors_total", &l, ld(&q.errors_by[i]));
        }
    }
    o.head(
        "kvtarget_qpair_latency_seconds",
        "histogram",
        "Command latency seen by the host side of each queue pair.",
    );
    for q in &qps {
        for (op, hist, sum) in [
            ("read", &q.read_hist, ld(&q.read_ns)),
            ("write", &q.write_hist, ld(&q.write_ns)),
        ] {
            let mut cum = 0u64;
            for (i, c) in hist.iter().enumerate() {
                cum += ld(c);
                let le = match latency_bucket_le_us(i) {
                    Some(us) => format!("{}", us as f64 / 1e6),
                    None => "+Inf".into(),
                };
                let mut l = ql(q);
                l.push(("op", op.into()));
                l.push(("le", le));
                o.line("kvtarget_qpair_latency_seconds_bucket", &l, cum);
            }
            let mut l = ql(q);
            l.push(("op", op.into()));
            o.line("kvtarget_qpair_latency_seconds_sum", &l, sum as f64 / 1e9);
            o.line("kvtarget_qpair_latency_seconds_count", &l, cum);
        }
    }

    // Volumes: I/O counters, latency histograms, capacity and use.
    let vols: Vec<_> = ctl
        .pools()
        .iter()
        .flat_map(|p| p.volumes().into_iter().map(move |v| (p.name.clone(), v)))
        .collect();
    let lbl = |p: &str, v: &str| vec![("pool", p.to_string()), ("volume", v.to_string())];
    o.head(
        "kvtarget_volume_ops_total",
        "counter",
        "Completed commands per volume and operation.",
    );
    let totals: Vec<_> = vols.iter().map(|(p, v)| (p, v, v.io_totals())).collect();
    for (p, v, t) in &totals {
        for (op, n) in [
            ("read", t.reads),
            ("write", t.writes),
            ("unmap", t.unmaps),
            ("flush", t.flushes),
        ] {
            let mut l = lbl(p, &v.desc.name);
            l.push(("op", op.into()));
            o.line("kvtarget_volume_ops_total", &l, n);
        }
    }
    o.head(
        "kvtarget_volume_bytes_total",
        "counter",
        "Bytes moved per volume and operation.",
    );
    for (p, v, t) in &totals {
        for (op, n) in [
            ("read", t.read_bytes),
            ("write", t.write_bytes),
            ("unmap", t.unmap_bytes),
        ] {
            let mut l = lbl(p, &v.desc.name);
            l.push(("op", op.into()));
            o.line("kvtarget_volume_bytes_total", &l, n);
        }
    }
    o.head(
        "kvtarget_volume_errors_total",
        "counter",
        "Commands that completed with an error.",
    );
    for (p, v, t) in &totals {
        o.line(
            "kvtarget_volume_errors_total",
            &lbl(p, &v.desc.name),
            t.errors,
        );
    }
    o.head(
        "kvtarget_volume_latency_seconds",
        "histogram",
        "Device-side command latency per volume.",
    );
    for (p, v, t) in &totals {
        for (op, hist, sum_ns) in [
            ("read", &t.read_hist, t.read_ns),
            ("write", &t.write_hist, t.write_ns),
        ] {
            let mut cum = 0u64;
            for (i, c) in hist.iter().enumerate().take(LATENCY_BUCKETS) {
                cum += c;
                let le = match latency_bucket_le_us(i) {
                    Some(us) => format!("{}", us as f64 / 1e6),
                    None => "+Inf".into(),
                };
                let mut l = lbl(p, &v.desc.name);
                l.push(("op", op.into()));
                l.push(("le", le));
                o.line("kvtarget_volume_latency_seconds_bucket", &l, cum);
            }
            let mut l = lbl(p, &v.desc.name);
            l.push(("op", op.into()));
            o.line(
                "kvtarget_volume_latency_seconds_sum",
                &l,
                sum_ns as f64 / 1e9,
            );
            o.line("kvtarget_volume_latency_seconds_count", &l, cum);
        }
    }
    o.head("kvtarget_volume_size_bytes", "gauge", "Volume capacity.");
    for (p, v) in &vols {
        o.line(
            "kvtarget_volume_size_bytes",
            &lbl(p, &v.desc.name),
            v.desc.size_bytes,
        );
    }
    o.head(
        "kvtarget_volume_used_bytes",
        "gauge",
        "Bytes of written blocks (NUSE).",
    );
    for (p, v) in &vols {
        o.line(
            "kvtarget_volume_used_bytes",
            &lbl(p, &v.desc.name),
            v.used_bytes(),
        );
    }

    // KV namespaces: the cache's own counters.
    let kvs: Vec<_> = vols
        .iter()
        .filter_map(|(p, v)| v.kv.as_ref().map(|k| (p, &v.desc.name, k.snapshot())))
        .collect();
    type KvField = fn(&crate::pool::kv::KvSnapshot) -> u64;
    let kv_series: [(&str, &str, &str, KvField); 9] = [
        ("kvtarget_kv_keys", "gauge", "Keys holding a value.", |s| s.keys),
        ("kvtarget_kv_value_bytes", "gauge", "Bytes of stored values.", |s| s.value_bytes),
        ("kvtarget_kv_stores_total", "counter", "Completed Stores.", |s| s.stores),
        ("kvtarget_kv_hits_total", "counter", "Retrieves and Exists that found their key.", |s| s.hits),
        ("kvtarget_kv_misses_total", "counter", "Retrieves and Exists of a key with no value (evicted, expired, deleted or never stored).", |s| s.misses),
        ("kvtarget_kv_evictions_total", "counter", "Keys evicted to make room.", |s| s.evictions),
        ("kvtarget_kv_eviction_age_seconds_total", "counter", "Sum of evicted keys' ages since they were stored; over evictions, the mean age.", |s| s.eviction_age_ms / 1000),
        ("kvtarget_kv_expirations_total", "counter", "Keys dropped by the namespace's TTL.", |s| s.expirations),
        ("kvtarget_kv_trimmed_extents_total", "counter", "Extents whose blocks stayed free long enough to go back to the pool.", |s| s.trimmed_extents),
    ];
    for (name, kind, help, get) in kv_series {
        o.head(name, kind, help);
        for (p, v, s) in &kvs {
            o.line(name, &lbl(p, v), get(s));
        }
    }

    // Pools and GC.
    let snaps: Vec<_> = ctl
        .pools()
        .iter()
        .map(|p| (p.clone(), p.snapshot()))
        .collect();
    o.head("kvtarget_pool_extents", "gauge", "Pool extents by state.");
    for (p, s) in &snaps {
        for (state, n) in [
            ("mapped", s.mapped),
            ("clean", s.clean),
            ("dirty", s.dirty),
            ("reserved", s.reserved),
        ] {
            o.line(
                "kvtarget_pool_extents",
                &[("pool", p.name.clone()), ("state", state.into())],
                n,
            );
        }
    }
    o.head(
        "kvtarget_pool_capacity_bytes",
        "gauge",
        "Pool capacity (extents times extent size).",
    );
    for (p, s) in &snaps {
        o.line(
            "kvtarget_pool_capacity_bytes",
            &[("pool", p.name.clone())],
            s.extents as u64 * s.extent_size,
        );
    }
    o.head(
        "kvtarget_pool_used_bytes",
        "gauge",
        "Bytes in mapped extents.",
    );
    for (p, s) in &snaps {
        o.line(
            "kvtarget_pool_used_bytes",
            &[("pool", p.name.clone())],
            s.mapped * s.extent_size,
        );
    }
    o.head(
        "kvtarget_gc_backlog_extents",
        "gauge",
        "Freed extents waiting to be scrubbed.",
    );
    for (p, s) in &snaps {
        o.line(
            "kvtarget_gc_backlog_extents",
            &[("pool", p.name.clone())],
            s.dirty,
        );
    }
    o.head(
        "kvtarget_gc_rate_extents_per_second",
        "gauge",
        "Rate GC's admission controller currently allows.",
    );
    for (p, s) in &snaps {
        o.line(
            "kvtarget_gc_rate_extents_per_second",
            &[("pool", p.name.clone())],
            s.gc_rate,
        );
    }
    o.head(
        "kvtarget_gc_scrubbed_extents_total",
        "counter",
        "Extents scrubbed by GC.",
    );
    for (p, s) in &snaps {
        o.line(
            "kvtarget_gc_scrubbed_extents_total",
            &[("pool", p.name.clone())],
            s.gc_scrubbed,
        );
    }
    o.head(
        "kvtarget_gc_state",
        "gauge",
        "GC admission state (1 for the current one).",
    );
    for (p, s) in &snaps {
        for m in ["idle", "running", "throttled", "urgent"] {
            o.line(
                "kvtarget_gc_state",
                &[("pool", p.name.clone()), ("state", m.into())],
                (s.gc_mode.name() == m) as u8,
            );
        }
        o.line(
            "kvtarget_gc_state",
            &[("pool", p.name.clone()), ("state", "paused".into())],
            p.gc_paused() as u8,
        );
    }
    o.head(
        "kvtarget_gc_watermark_extents",
        "gauge",
        "Clean-extent watermarks of GC admission.",
    );
    for (p, s) in &snaps {
        o.line(
            "kvtarget_gc_watermark_extents",
            &[("pool", p.name.clone()), ("level", "low".into())],
            s.low_watermark,
        );
        o.line(
            "kvtarget_gc_watermark_extents",
            &[("pool", p.name.clone()), ("level", "high".into())],
            s.high_watermark,
        );
    }
    o.head(
        "kvtarget_pool_journal_used_bytes",
        "gauge",
        "Journal bytes since the last checkpoint.",
    );
    for (p, s) in &snaps {
        o.line(
            "kvtarget_pool_journal_used_bytes",
            &[("pool", p.name.clone())],
            s.journal_used,
        );
    }
    o.head(
        "kvtarget_pool_commits_total",
        "counter",
        "Metadata commits (Flush, FUA, GC, reservations).",
    );
    for (p, s) in &snaps {
        o.line(
            "kvtarget_pool_commits_total",
            &[("pool", p.name.clone())],
            s.commits,
        );
    }
    o.s
}

/// NVMe/RDMA poll groups: one completion queue per (reactor, device), shared
/// by that reactor's QPs on the device.
fn rdma_poll_groups(o: &mut Out, groups: &[crate::transport::rdma::PollGroupStats]) {
    let labels = |g: &crate::transport::rdma::PollGroupStats| {
        [
            ("reactor", g.reactor.to_string()),
            ("device", g.device.clone()),
        ]
    };
    type Field = fn(&crate::transport::rdma::PollGroupStats) -> u64;
    let rows: [(&str, &str, &str, Field); 10] = [
        (
            "kvtarget_rdma_poll_group_polls_total",
            "counter",
            "Polls of the reactor's RDMA completion queue.",
            |g| g.polls,
        ),
        (
            "kvtarget_rdma_poll_group_idle_polls_total",
            "counter",
            "Polls of the RDMA completion queue that found nothing.",
            |g| g.idle_polls,
        ),
        (
            "kvtarget_rdma_poll_group_completions_total",
            "counter",
            "Work completions polled from the RDMA completion queue.",
            |g| g.completions,
        ),
        (
            "kvtarget_rdma_poll_group_requests_total",
            "counter",
            "NVMe command capsules received by the poll group's QPs.",
            |g| g.requests,
        ),
        (
            "kvtarget_rdma_poll_group_send_wrs_total",
            "counter",
            "Send work requests posted (SEND, RDMA READ, RDMA WRITE).",
            |g| g.send_wrs,
        ),
        (
            "kvtarget_rdma_poll_group_recv_wrs_total",
            "counter",
            "Receive work requests posted.",
            |g| g.recv_wrs,
        ),
        (
            "kvtarget_rdma_poll_group_dropped_completions_total",
            "counter",
            "Completions that belonged to no live QP (dropped, never delivered).",
            |g| g.dropped_completions,
        ),
        (
            "kvtarget_rdma_poll_group_queue_pairs",
            "gauge",
            "QPs whose sends and receives complete on this completion queue.",
            |g| g.qpairs as u64,
        ),
        (
            "kvtarget_rdma_poll_group_cq_entries",
            "gauge",
            "Size of the completion queue.",
            |g| g.cq_entries as u64,
        ),
        (
            "kvtarget_rdma_poll_group_cq_entries_reserved",
            "gauge",
            "Completion queue entries reserved by live QPs.",
            |g| g.cq_entries_reserved as u64,
        ),
    ];
    for (name, kind, help, f) in rows {
        o.head(name, kind, help);
        for g in groups {
            o.line(name, &labels(g), f(g));
        }
    }
    o.head(
        "kvtarget_rdma_completion_queues",
        "gauge",
        "RDMA completion queues per reactor (one per device it serves).",
    );
    let mut per_reactor: std::collections::BTreeMap<usize, usize> = Default::default();
    for g in groups {
        *per_reactor.entry(g.reactor).or_default() += 1;
    }
    for (r, n) in per_reactor {
        o.line(
            "kvtarget_rdma_completion_queues",
            &[("reactor", r.to_string())],
            n,
        );
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
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MetricsServer {
    pub fn start(addr: SocketAddr, ctl: Arc<Control>) -> Result<MetricsServer, MetricsError> {
        let listen = |source| MetricsError::Listen { addr, source };
        let l = TcpListener::bind(addr).map_err(listen)?;
        l.set_nonblocking(true).map_err(listen)?;
        let addr = l.local_addr().map_err(listen)?;
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let thread = std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || {
                while !st.load(Ordering::Acquire) {
                    match l.accept() {
                        Ok((sock, _)) => serve(sock, &ctl),
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
            })
            .map_err(MetricsError::Thread)?;
        tracing::info!("metrics on http://{addr}/metrics");
        Ok(MetricsServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
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
