//! No page fault on a reactor once warm: a target on a RAM namespace, warmed up
//! on a corner of it, then 4 KiB random writes and reads across the whole
//! namespace; the reactor's own fault counters (`getrusage(RUSAGE_THREAD)` read
//! by the reactor, reported by `framework_get_reactors`) must not move.

use kvtarget::config::Config;
use kvtarget::initiator::{HostController, HostOptions, IoQueue};
use kvtarget::rpc::RpcClient;
use kvtarget::server::Server;
use serde_json::json;
use std::time::{Duration, Instant};

const NQN: &str = "nqn.2026-11.io.kvtarget:faults";
const BS: u32 = 4096;
/// Large enough that random 4 KiB I/O over it touches memory the warm-up did
/// not: 128 transparent huge pages, 65536 blocks.
const NS_BYTES: u64 = 256 << 20;
const QD: usize = 16;
/// I/Os of the measured run (and of the warm-up).
const MEASURED_IOS: usize = 8192;

fn start(dir: &std::path::Path) -> Server {
    let text = format!(
        r#"
[reactors]
count = 1
idle = "adaptive"

[rpc]
socket = "{d}/kv.sock"

[[listeners]]
address = "127.0.0.1"
port = 0

[[subsystems]]
nqn = "{NQN}"
allow_any_host = true

[[subsystems.namespaces]]
nsid = 1
backend = "ram"
size = "256MiB"
block_size = {BS}
"#,
        d = dir.display()
    );
    Server::start(&Config::parse(&text).expect("config")).expect("start")
}

/// Minor + major faults of reactor 0.
fn reactor_faults(c: &mut RpcClient) -> u64 {
    let r = c.call("framework_get_reactors", json!({})).expect("rpc");
    let r0 = &r["reactors"][0];
    let n = |k: &str| r0[k].as_u64().unwrap_or_else(|| panic!("{k} in {r0}"));
    n("minor_faults") + n("major_faults")
}

/// The reactor's fault count once it has settled: the reactor reads its
/// resource usage once a second, so two equal readings a period apart (the
/// reactor idle in between) cover everything it did before.
fn settled_faults(c: &mut RpcClient) -> u64 {
    let period = kvtarget::reactor::stall::RUSAGE_EVERY + Duration::from_millis(300);
    let mut last = reactor_faults(c);
    for _ in 0..10 {
        std::thread::sleep(period);
        let now = reactor_faults(c);
        if now == last {
            return now;
        }
        last = now;
    }
    last
}

/// A small xorshift: block numbers spread over the whole namespace.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// `n` 4 KiB operations, writes and reads alternating, at queue depth `QD`, at
/// block numbers `lba(i)`.
fn run_io(q: &mut IoQueue, n: usize, mut lba: impl FnMut(usize) -> u64) {
    let mut inflight = 0;
    for i in 0..n {
        if inflight == QD {
            q.q.wait_any().expect("completion").ok().expect("status");
            inflight -= 1;
        }
        let at = lba(i);
        if i % 2 == 0 {
            q.submit_write(1, at, vec![i as u8; BS as usize], BS, false)
                .expect("write");
        } else {
            q.submit_read(1, at, 1, BS).expect("read");
        }
        inflight += 1;
    }
    for _ in 0..inflight {
        q.q.wait_any().expect("completion").ok().expect("status");
    }
}

#[test]
fn reactor_takes_no_page_fault_once_warm() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let mut rpc = RpcClient::connect(server.rpc_path().expect("rpc socket")).expect("rpc");
    let addr = server
        .listen_addrs()
        .iter()
        .find(|(_, disc)| !disc)
        .expect("listener")
        .0;
    let mut c = HostController::connect(&HostOptions::new(addr, NQN)).expect("connect");
    c.set_queue_count(1).expect("queues");
    let mut q = c.io_queue(1).expect("io queue");

    // Warm-up: the same mix, as many I/Os as the measured run, on the first 64
    // blocks only (queue, buffers, slots; the stack and heap depths a burst of
    // completions reaches). Shorter, a rare deeper burst in the measured run
    // touched a first stack or heap page: one fault in about a third of runs.
    let t = Instant::now();
    run_io(&mut q, MEASURED_IOS, |i| (i % 64) as u64);
    let before = settled_faults(&mut rpc);

    // The measured run: random blocks across the whole namespace.
    let blocks = NS_BYTES / BS as u64;
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    run_io(&mut q, MEASURED_IOS, |_| rng.next() % blocks);
    let after = settled_faults(&mut rpc);
    assert!(
        after == before,
        "the reactor took {} page faults serving warm I/O ({before} -> {after}) in {:?}",
        after - before,
        t.elapsed()
    );
    drop(q);
    let _ = c.shutdown();
    server.shutdown();
}
