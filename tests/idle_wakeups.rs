//! An idle target's control threads sleep until something happens: the
//! acceptor, the RPC and metrics servers, an RPC client's thread and a pool's
//! metadata thread must not wake on a timer (they did 5-100 times a second,
//! each wake taking a core from a reactor or an initiator beside them). They
//! still answer at once when a connection, a request or a scrape comes, and
//! the target still stops promptly with an RPC client connected.
//!
//! Its own test binary: the threads are found by name in `/proc/self/task`,
//! so no other target may run in the process.

use kvtarget::config::Config;
use kvtarget::initiator::{HostController, HostOptions};
use kvtarget::rpc::RpcClient;
use kvtarget::server::Server;
use serde_json::json;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

const NQN: &str = "nqn.2026-11.io.kvtarget:idle";
const BS: u32 = 4096;
/// How long the idle target is watched.
const WATCH: Duration = Duration::from_secs(2);

fn start(dir: &std::path::Path) -> Server {
    let text = format!(
        r#"
[reactors]
count = 1
idle = "adaptive"

[rpc]
socket = "{d}/kv.sock"

[metrics]
address = "127.0.0.1:0"

[[listeners]]
address = "127.0.0.1"
port = 0

[[pools]]
name = "p"
backend = "ram"
size = "64MiB"
extent_size = "1MiB"

[[pools.volumes]]
name = "v"
size = "32MiB"
block_size = {BS}

[[subsystems]]
nqn = "{NQN}"
allow_any_host = true

[[subsystems.namespaces]]
nsid = 1
volume = "p/v"
"#,
        d = dir.display()
    );
    Server::start(&Config::parse(&text).expect("config")).expect("start")
}

/// Times each of this process's threads has been switched in, by thread id,
/// with its name (`/proc/self/task/*/schedstat`, third field).
/// Each thread's name and how many times it went to sleep (its voluntary
/// context switches: one per wait that ended in a sleep). Not schedstat's
/// count of time slices, which a busy machine raises by preempting a thread
/// that woke once (md-p "woke" 15 times in 2 s under a CPU hog).
fn switches() -> BTreeMap<u32, (String, u64)> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir("/proc/self/task").expect("/proc/self/task") {
        let e = e.expect("task");
        let Ok(tid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let (Ok(comm), Ok(status)) = (
            std::fs::read_to_string(e.path().join("comm")),
            std::fs::read_to_string(e.path().join("status")),
        ) else {
            continue; // the thread ended meanwhile
        };
        let sleeps = status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("voluntary_ctxt_switches in the thread's status");
        out.insert(tid, (comm.trim().to_string(), sleeps));
    }
    out
}

fn scrape(server: &Server) -> String {
    let mut s = std::net::TcpStream::connect(server.metrics_addr().expect("metrics")).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn idle_control_threads_sleep_until_needed() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let addr = server
        .listen_addrs()
        .iter()
        .find(|(_, disc)| !disc)
        .expect("listener")
        .0;
    // Work first, so every thread has run: a write that maps a new extent
    // (the metadata thread commits it), a scrape, an RPC client that stays
    // connected and idle through the watch.
    let mut c = HostController::connect(&HostOptions::new(addr, NQN)).expect("connect");
    c.set_queue_count(1).expect("queues");
    let mut q = c.io_queue(1).expect("io queue");
    q.submit_write(1, 0, vec![7u8; BS as usize], BS, false)
        .expect("write");
    q.q.wait_any().expect("completion").ok().expect("status");
    assert!(scrape(&server).contains("kvtarget_build_info"));
    let mut rpc = RpcClient::connect(server.rpc_path().expect("rpc socket")).expect("rpc");
    rpc.call("spdk_get_version", json!({})).expect("rpc");
    // Past the pool's periodic commit (1 s) and one quiet sleep after it.
    std::thread::sleep(Duration::from_millis(1600));

    let before = switches();
    std::thread::sleep(WATCH);
    let after = switches();
    let watched = ["acceptor", "rpc", "rpc-client", "metrics", "md-p"];
    let mut seen = Vec::new();
    for (tid, (name, runs)) in &after {
        if !watched.contains(&name.as_str()) {
            continue;
        }
        let woke = runs - before.get(tid).map_or(0, |b| b.1);
        seen.push(format!("{name} {woke}"));
        // The metadata thread looks every 250 ms when nothing is pending (a
        // change that reaches it without a wake waits that long at most).
        let allowed = if name == "md-p" { 12 } else { 1 };
        assert!(
            woke <= allowed,
            "{name} (thread {tid}) woke {woke} times in {WATCH:?} of an idle target (at most {allowed})"
        );
    }
    seen.sort();
    eprintln!("wake-ups in {WATCH:?}: {seen:?}");
    assert_eq!(seen.len(), watched.len(), "threads found: {seen:?}");

    // Asleep is not deaf: each answers at once.
    let t = Instant::now();
    rpc.call("nvmf_get_subsystems", json!({})).expect("rpc");
    assert!(scrape(&server).contains("kvtarget_build_info"));
    let c2 = HostController::connect(&HostOptions::new(addr, NQN)).expect("connect");
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "answers took {:?}",
        t.elapsed()
    );
    let _ = c2.shutdown();
    drop(q);
    let _ = c.shutdown();

    // The RPC client is still connected: the stop wakes its thread too.
    let t = Instant::now();
    server.shutdown();
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "shutdown took {:?}",
        t.elapsed()
    );
    drop(rpc);
}
