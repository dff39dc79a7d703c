//! `[cluster]` against a real etcd (Debian's etcd-server): kvtarget processes
//! join one private etcd, see each other, leave on death, refuse a taken
//! name, start alone or refuse to start without etcd, and rejoin after etcd
//! restarts. A test that needs etcd prints why it skips when the binary is
//! absent (CI installs it, so CI runs them all).

use serde_json::{json, Value};
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod support;
use kvtarget::wire::nvme;
use support::{connect_retry, free_port, loopback, wait_for_path, write_config, BIN};

/// The lease TTL the tests run with (the smallest the configuration allows):
/// a dead node leaves within about 2 s.
const TTL_SECS: u64 = 2;
/// How long etcd may take to answer after it was started (a loaded CI machine).
const ETCD_START: Duration = Duration::from_secs(20);
/// Slack over the TTL for a change to show: one keep-alive period (TTL/3),
/// one member read, scheduling on a loaded 2-core machine.
const SLACK: Duration = Duration::from_secs(4);

/// One cluster test at a time: each starts etcd and up to three nodes whose
/// leases must be renewed every TTL/3; two such tests at once on a 2-core CI
/// machine starved each other's keep-alives into fences the tests did not expect.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The etcd binary (and the guard that keeps other cluster tests waiting while
/// this one runs), or `None` with the reason printed.
fn etcd_binary() -> Option<(PathBuf, std::sync::MutexGuard<'static, ()>)> {
    // A test that failed while holding it poisons nothing the next one uses.
    let serial = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    etcd_path().map(|p| (p, serial))
}

fn etcd_path() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("etcd"))
            .find(|f| f.is_file())
    });
    if found.is_none() {
        eprintln!("skipping: no `etcd` binary on PATH (Debian: apt-get install etcd-server)");
    }
    found
}

/// A private single-member etcd: random free ports, data in a directory of
/// the test's, killed on drop.
struct Etcd {
    bin: PathBuf,
    dir: PathBuf,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

impl Etcd {
    /// Ports chosen, not started (a test that starts etcd later).
    fn at(bin: PathBuf, dir: &Path) -> Etcd {
        Etcd {
            bin,
            dir: dir.to_path_buf(),
            client_port: free_port(),
            peer_port: free_port(),
            child: None,
        }
    }

    fn start(bin: PathBuf, dir: &Path) -> Etcd {
        let mut e = Etcd::at(bin, dir);
        e.run();
        e
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// Starts (or restarts, on the same data) and waits until it answers.
    fn run(&mut self) {
        let client = self.url();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("etcd.log"))
            .unwrap();
        let child = Command::new(&self.bin)
            .arg("--name=kvt")
            .arg(format!("--data-dir={}", self.dir.join("etcd").display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=kvt={peer}"))
            // The tests are about kvtarget, not etcd's durability: a WAL fsync
            // behind a busy disk (CI builds beside them) delayed elections by
            // seconds. A killed etcd keeps what the page cache holds.
            .arg("--unsafe-no-fsync")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start etcd");
        self.child = Some(child);
        let mut c = kvtarget::cluster::etcd::Client::new(
            vec![format!("127.0.0.1:{}", self.client_port)],
            Duration::from_secs(1),
        );
        let t0 = Instant::now();
        let probe = kvtarget::cluster::etcd::RangeRequest {
            key: b"/".to_vec(),
            range_end: Vec::new(),
        };
        while c.range(&probe).is_err() {
            assert!(
                t0.elapsed() < ETCD_START,
                "etcd never answered: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default()
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A kvtarget process with a `[cluster]`; killed on drop.
struct Node {
    child: Child,
    sock: PathBuf,
    port: u16,
}

const NQN: &str = "nqn.2026-12.io.kvtarget:cluster";

fn config(dir: &Path, name: &str, etcd: &str, extra: &str, port: u16) -> PathBuf {
    write_config(
        dir,
        &format!("{name}.toml"),
        &format!(
            r#"
[[listeners]]
address = "127.0.0.1"
port = {port}

[[subsystems]]
nqn = "{NQN}"
allow_any_host = true

[[subsystems.namespaces]]
nsid = 1
backend = "ram"
size = "4MiB"

[cluster]
endpoints = ["{etcd}"]
node = "{name}"
lease_ttl_secs = {TTL_SECS}
{extra}
"#
        ),
    )
}

impl Node {
    /// Spawns node `name` (its files in `dir/name*`); does not wait.
    fn spawn(dir: &Path, name: &str, etcd: &str, extra: &str) -> Node {
        let port = free_port();
        let cfg = config(dir, name, etcd, extra, port);
        let sock = dir.join(format!("{name}.sock"));
        let child = Command::new(BIN)
            .arg("--config")
            .arg(&cfg)
            .arg("-r")
            .arg(&sock)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Node { child, sock, port }
    }

    /// Spawns node `name` and waits for its control socket.
    fn start(dir: &Path, name: &str, etcd: &str, extra: &str) -> Node {
        let n = Node::spawn(dir, name, etcd, extra);
        wait_for_path(&n.sock);
        n
    }

    fn cluster(&self) -> Value {
        let mut c = kvtarget::rpc::RpcClient::connect(&self.sock).expect("rpc socket");
        c.call("kvtarget_get_cluster", json!({}))
            .expect("kvtarget_get_cluster")
    }

    fn rpc(&self, method: &str, params: Value) -> Value {
        let mut c = kvtarget::rpc::RpcClient::connect(&self.sock).expect("rpc socket");
        c.call(method, params).expect(method)
    }

    fn state(&self) -> String {
        self.cluster()["state"].as_str().unwrap_or("").to_string()
    }

    fn member_names(&self) -> Vec<String> {
        self.cluster()["members"]
            .as_array()
            .map(|m| {
                m.iter()
                    .filter_map(|r| r["name"].as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// What the node logged, once killed.
    fn logs(mut self) -> String {
        let _ = self.child.kill();
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        err
    }

    /// Exit status and stderr of a node that exits by itself.
    fn exit(mut self, within: Duration) -> (Option<i32>, String) {
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                let mut err = String::new();
                self.child
                    .stderr
                    .take()
                    .unwrap()
                    .read_to_string(&mut err)
                    .unwrap();
                return (st.code(), err);
            }
            assert!(
                t0.elapsed() < within,
                "the node did not exit within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `f` until it holds, at most `within`; false if it never did.
fn eventually(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    loop {
        if f() {
            return true;
        }
        if t0.elapsed() > within {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn ttl() -> Duration {
    Duration::from_secs(TTL_SECS)
}

#[test]
fn two_nodes_see_each_other_and_a_killed_one_leaves() {
    let Some((bin, _serial)) = etcd_binary() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(bin, dir.path());
    let a = Node::start(dir.path(), "a", &etcd.url(), "");
    let mut b = Node::start(dir.path(), "b", &etcd.url(), "");
    let both = vec!["a".to_string(), "b".to_string()];
    assert!(
        eventually(ttl() + SLACK, || a.member_names() == both
            && b.member_names() == both),
        "a sees {:?}, b sees {:?}",
        a.member_names(),
        b.member_names()
    );
    let v = a.cluster();
    assert_eq!(v["state"], "joined", "{v}");
    assert_eq!(v["node"], "a");
    assert!(v["lease_id"].is_string(), "{v}");
    let rec_b = &v["members"][1];
    assert_eq!(rec_b["listeners"][0]["trtype"], "tcp", "{v}");
    assert_eq!(rec_b["listeners"][0]["trsvcid"], b.port.to_string(), "{v}");
    assert_eq!(rec_b["subsystems"][0]["nqn"], NQN, "{v}");
    assert_eq!(rec_b["subsystems"][0]["namespaces"][0]["nsid"], 1, "{v}");
    let table = Command::new(BIN)
        .args(["cluster", "status", "-r"])
        .arg(&a.sock)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(table.status.success(), "{text}");
    assert!(
        text.starts_with("cluster default  node a  state joined"),
        "{text}"
    );
    assert!(
        text.contains("\na *  ") && text.contains(&format!("tcp:127.0.0.1:{}", b.port)),
        "{text}"
    );
    // A change over RPC reaches b's record, and a's view of it.
    let added = "nqn.2026-12.io.kvtarget:added";
    let mut rpc = kvtarget::rpc::RpcClient::connect(&b.sock).unwrap();
    rpc.call(
        "nvmf_create_subsystem",
        json!({"nqn": added, "allow_any_host": true}),
    )
    .unwrap();
    assert!(
        eventually(SLACK, || a.cluster()["members"][1]["subsystems"]
            .as_array()
            .is_some_and(|s| s.iter().any(|x| x["nqn"] == added))),
        "{}",
        a.cluster()
    );
    // SIGKILL: no revoke, the lease runs out.
    b.child.kill().unwrap();
    b.child.wait().unwrap();
    assert!(
        eventually(ttl() + SLACK, || a.member_names() == ["a"]),
        "b still listed: {:?}",
        a.member_names()
    );
}

#[test]
fn a_taken_name_is_refused_naming_the_node() {
    let Some((bin, _serial)) = etcd_binary() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(bin, dir.path());
    let a = Node::start(dir.path(), "a", &etcd.url(), "");
    assert!(eventually(SLACK, || a.state() == "joined"));
    let twin_dir = dir.path().join("twin");
    std::fs::create_dir(&twin_dir).unwrap();
    let twin = Node::spawn(&twin_dir, "a", &etcd.url(), "");
    // The second `a` waits one TTL for a crashed predecessor's record to end.
    let (code, err) = twin.exit(ttl() + SLACK + Duration::from_secs(10));
    assert_eq!(code, Some(2), "{err}");
    let line = err.trim().lines().last().unwrap_or("");
    assert!(
        line.starts_with("kvtarget: cluster: node `a` is already a member"),
        "{err}"
    );
    assert_eq!(a.state(), "joined");
}

#[test]
fn a_cluster_wide_subsystem_with_other_namespaces_is_refused_naming_node_and_field() {
    let Some((bin, _serial)) = etcd_binary() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(bin, dir.path());
    let a = Node::start(dir.path(), "a", &etcd.url(), &wide_subsystem());
    assert!(eventually(SLACK, || a.state() == "joined"));
    // b serves the same NQN and NSID, twice the size: a host would see one
    // namespace of two sizes, one per path.
    let b = Node::spawn(
        dir.path(),
        "b",
        &etcd.url(),
        &wide_subsystem().replace("4MiB", "8MiB"),
    );
    let (code, err) = b.exit(ttl() + SLACK + Duration::from_secs(10));
    assert_eq!(code, Some(2), "{err}");
    let line = err.trim().lines().last().unwrap_or("");
    assert_eq!(
        line,
        format!(
            "kvtarget: cluster: subsystem `{WIDE_NQN}` on node `a`: namespace 1 size (blocks) \
             is 2048 here, 1024 there; every node must serve a cluster-wide subsystem's \
             namespaces alike"
        ),
        "{err}"
    );
    assert_eq!(a.member_names(), ["a"]);
    assert_eq!(group(&a).0, "owner");
}

#[test]
fn etcd_unreachable_with_fail_exits_2_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let nobody = format!("http://127.0.0.1:{}", free_port());
    let n = Node::spawn(dir.path(), "a", &nobody, "on_unreachable = \"fail\"");
    let (code, err) = n.exit(Duration::from_secs(20));
    assert_eq!(code, Some(2), "{err}");
    let line = err.trim().lines().last().unwrap_or("");
    assert!(
        line.starts_with("kvtarget: cluster: no etcd endpoint answered"),
        "{err}"
    );
    assert!(line.contains("on_unreachable"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn the_node_answers_joining_while_its_first_join_waits_for_etcd() {
    let dir = tempfile::tempdir().unwrap();
    // An "etcd" that accepts connections and never answers: the join waits
    // for its request timeout, and RPC must answer meanwhile (it answered
    // "no [cluster] configuration" before the node had joined).
    let mute = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", mute.local_addr().unwrap());
    let a = Node::start(dir.path(), "a", &url, "on_unreachable = \"alone\"");
    let v = a.cluster();
    assert_eq!(v["state"], "joining", "{v}");
    assert_eq!(v["node"], "a", "{v}");
    assert!(
        eventually(Duration::from_secs(30), || a.state() == "alone"),
        "{}",
        a.cluster()
    );
    drop(mute);
}

#[test]
fn alone_serves_io_and_joins_when_etcd_appears() {
    let Some((bin, _serial)) = etcd_binary() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut etcd = Etcd::at(bin, dir.path());
    let a = Node::start(dir.path(), "a", &etcd.url(), "on_unreachable = \"alone\"");
    assert!(
        eventually(SLACK, || a.state() == "alone"),
        "{}",
        a.cluster()
    );
    let mut c = connect_retry(loopback(a.port), NQN);
    c.set_queue_count(1).unwrap();
    let mut q = c.io_queue(1).unwrap();
    q.write(1, 3, vec![0x5a; 4096], 4096).unwrap();
    assert_eq!(q.read(1, 3, 1, 4096).unwrap(), vec![0x5a; 4096]);
    etcd.run();
    assert!(
        eventually(ttl() + SLACK, || a.state() == "joined"
            && a.member_names() == ["a"]),
        "{}",
        a.cluster()
    );
    assert_eq!(q.read(1, 3, 1, 4096).unwrap(), vec![0x5a; 4096]);
}

#[test]
fn etcd_restart_makes_the_node_lost_then_rejoined() {
    let Some((bin, _serial)) = etcd_binary() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut etcd = Etcd::start(bin, dir.path());
    let a = Node::start(dir.path(), "a", &etcd.url(), "");
    assert!(eventually(SLACK, || a.state() == "joined"));
    etcd.kill();
    assert!(
        eventually(ttl() + SLACK, || a.state() == "lost"),
        "{}",
        a.cluster()
    );
    let v = a.cluster();
    assert!(v["lease_id"].is_null(), "{v}");
    etcd.run();
    assert!(
        eventually(ttl() + SLACK, || a.state() == "joined"
            && a.member_names() == ["a"]),
        "{}\n{}",
        a.cluster(),
        etcd.log()
    );
}

/// `[discovery]` with a discovery-only port, for `Node::start`'s `extra`
/// (a table after `[cluster]`'s keys).
fn discovery_port(port: u16) -> String {
    format!("\n[discovery]\nport = {port}\n")
}

/// `nvme discover` at `port`: a fresh discovery controller reads the log's
/// generation and every entry.
fn discover(port: u16) -> (u64, Vec<nvme::DiscoveryEntry>) {
    let mut d = connect_retry(loopback(port), nvme::DISCOVERY_NQN);
    let header = d
        .get_log_page(nvme::lid::DISCOVERY, 0, nvme::DISCOVERY_LOG_HEADER_LEN, 0)
        .expect("discovery log header");
    let genctr = nvme::decode_discovery_log(&header).0;
    (genctr, d.discovery_log().expect("discovery log"))
}

/// The referrals' ports (TRSVCID) in a discovery log.
fn referral_ports(entries: &[nvme::DiscoveryEntry]) -> Vec<String> {
    entries
        .iter()
        .filter(|e| e.subtype == nvme::subtype::REFERRAL)
        .map(|e| e.trsvcid.clone())
        .collect()
}

#[test]
fn discovery_at_a_node_refers_to_every_live_peer() {
    let Some((bin, _serial)) = etcd_binary() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(bin, dir.path());
    let (disc_a, disc_b) = (free_port(), free_port());
    let a = Node::start(dir.path(), "a", &etcd.url(), &discovery_port(disc_a));
    let mut b = Node::start(dir.path(), "b", &etcd.url(), &discovery_port(disc_b));
    let b_port = disc_b.to_string();
    assert!(
        eventually(ttl() + SLACK, || referral_ports(&discover(disc_a).1)
            == [b_port.as_str()]),
        "{:?}",
        discover(disc_a)
    );
    let (genctr, log) = discover(disc_a);
    // a's own entries, as without a cluster: its two ports for discovery,
    // its NVM port for the subsystem; then the referral.
    let own: Vec<(u8, String, String)> = log
        .iter()
        .filter(|e| e.subtype != nvme::subtype::REFERRAL)
        .map(|e| (e.subtype, e.subnqn.clone(), e.trsvcid.clone()))
        .collect();
    let current = nvme::subtype::CURRENT_DISCOVERY;
    assert_eq!(
        own,
        [
            (current, nvme::DISCOVERY_NQN.into(), a.port.to_string()),
            (current, nvme::DISCOVERY_NQN.into(), disc_a.to_string()),
            (nvme::subtype::NVME, NQN.into(), a.port.to_string()),
        ],
        "{log:?}"
    );
    let r = log.last().unwrap();
    assert_eq!(
        (r.trtype, r.adrfam, r.subtype, r.treq, r.cntlid, r.asqsz),
        (nvme::trtype::TCP, nvme::adrfam::IPV4, 1, 2, 0xFFFF, 32),
        "{r:?}"
    );
    assert_eq!(
        (r.subnqn.as_str(), r.traddr.as_str()),
        (nvme::DISCOVERY_NQN, "127.0.0.1")
    );
    // And b refers to a.
    assert!(
        eventually(SLACK, || referral_ports(&discover(disc_b).1)
            == [disc_a.to_string()]),
        "{:?}",
        discover(disc_b)
    );

    // SIGKILL: once b's lease ends, a's log no longer refers to it.
    b.child.kill().unwrap();
    b.child.wait().unwrap();
    assert!(
        eventually(ttl() + SLACK, || referral_ports(&discover(disc_a).1)
            .is_empty()),
        "{:?}",
        discover(disc_a)
    );
    let (gone, log) = discover(disc_a);
    assert!(gone > genctr, "GENCTR {genctr} -> {gone}");
    assert_eq!(log.len(), own.len(), "{log:?}");

    // b again (a fresh process, new ports): referred to again.
    let again_dir = dir.path().join("again");
    std::fs::create_dir(&again_dir).unwrap();
    let disc_b2 = free_port();
    let _b2 = Node::start(&again_dir, "b", &etcd.url(), &discovery_port(disc_b2));
    assert!(
        eventually(ttl() + SLACK, || referral_ports(&discover(disc_a).1)
            == [disc_b2.to_string()]),
        "{:?}",
        discover(disc_a)
    );
    assert!(discover(disc_a).0 > gone);
}

// ---- Path ownership by election (issue 36 item 4) and fencing (item 5) ----

const WIDE_NQN: &str = "nqn.2026-12.io.kvtarget:wide";

/// A cluster-wide subsystem (one RAM namespace, ANA group 1) for
/// `Node::start`'s `extra`: every node serves it under the same NQN and the
/// same namespace identities (derived from NQN and NSID).
fn wide_subsystem() -> String {
    format!(
        r#"
[[subsystems]]
nqn = "{WIDE_NQN}"
allow_any_host = true
ana_reporting = true
cluster_wide = true

[[subsystems.namespaces]]
nsid = 1
backend = "ram"
size = "4MiB"
"#
    )
}

/// Group 1's state in the ANA log page node `n` reports, as a host reads it.
fn ana_state(n: &Node) -> u8 {
    let mut h = connect_retry(loopback(n.port), WIDE_NQN);
    let b = h
        .get_log_page(kvtarget::nvmf::ana::LID_ANA, 0xFFFF_FFFF, 4096, 0)
        .unwrap();
    let log = kvtarget::nvmf::ana::AnaLog::decode(&b).expect("a whole ANA log page");
    log.groups
        .iter()
        .find(|g| g.anagrpid == 1)
        .map_or(0, |g| g.state)
}

const OPTIMIZED: u8 = kvtarget::nvmf::ana::AnaState::Optimized as u8;
const INACCESSIBLE: u8 = kvtarget::nvmf::ana::AnaState::Inaccessible as u8;

/// Group 1 as `kvtarget_get_cluster` shows it on `n`: (role, owner, epoch).
fn group(n: &Node) -> (String, String, i64) {
    let v = n.cluster();
    let g = &v["groups"][0];
    (
        g["role"].as_str().unwrap_or("").into(),
        g["owner"].as_str().unwrap_or("").into(),
        g["epoch"].as_i64().unwrap_or(0),
    )
}

/// Two nodes serving the cluster-wide subsystem; returns (owner, other)
/// once exactly one reports group 1 optimized.
fn elected(dir: &Path, etcd: &Etcd) -> (Node, Node) {
    elected_serving(dir, etcd, &wide_subsystem())
}

/// `elected` with `sub` (the cluster-wide subsystem `WIDE_NQN`, group 1).
fn elected_serving(dir: &Path, etcd: &Etcd, sub: &str) -> (Node, Node) {
    let a = Node::start(dir, "a", &etcd.url(), sub);
    let b = Node::start(dir, "b", &etcd.url(), sub);
    let settled = || {
        let (ra, rb) = (group(&a).0, group(&b).0);
        matches!(
            (ra.as_str(), rb.as_str()),
            ("owner", "follower") | ("follower", "owner")
        )
    };
    assert!(
        eventually(ttl() + SLACK, settled),
        "{}\n{}",
        a.cluster(),
        b.cluster()
    );
    let (owner, other) = if group(&a).0 == "owner" {
        (a, b)
    } else {
        (b, a)
    };
    assert_eq!(ana_state(&owner), OPTIMIZED, "{}", owner.cluster());
    assert_eq!(ana_state(&other), INACCESSIBLE, "{}", other.cluster());
    // Both see the same owner and epoch.
    let (o, e) = (group(&owner), group(&other));
    assert_eq!((o.1.as_str(), o.2), (e.1.as_str(), e.2));
    assert!(o.2 > 0);
    // The same namespace identities on both.
    let ids = |n: &Node| {
        n.cluster()["members"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|m| m["subsystems"].as_array().cloned().unwrap_or_default())
            .filter(|s| s["nqn"] == WIDE_NQN)
            .map(|s| s["namespaces"].to_string())
            .collect::<Vec<_>>()
    };
    assert!(
        eventually(SLACK, || ids(&owner).len() == 2),
        "{:?}",
        ids(&owner)
    );
    let seen = ids(&owner);
    assert_eq!(seen[0], seen[1]);
    // One NVM subsystem to a host, which refuses a controller ID it already
    // has (Linux: "Duplicate cntlid"): each node allocates from its own block.
    let (ho, hf) = (
        connect_retry(loopback(owner.port), WIDE_NQN),
        connect_retry(loopback(other.port), WIDE_NQN),
    );
    assert_ne!(ho.cntlid, hf.cntlid);
    let range = |n: &Node| {
        let v = n.rpc("nvmf_get_subsystems", json!({ "nqn": WIDE_NQN }));
        (
            v[0]["min_cntlid"].as_u64().unwrap(),
            v[0]["max_cntlid"].as_u64().unwrap(),
        )
    };
    let (ro, rf) = (range(&owner), range(&other));
    assert!(ro.1 < rf.0 || rf.1 < ro.0, "{ro:?} {rf:?}");
    (owner, other)
}

fn signal(n: &Node, sig: &str) {
    let ok = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(n.child.id().to_string())
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{sig}");
}

#[test]
fn one_owner_per_group_and_a_killed_owner_is_replaced_with_a_larger_epoch() {
    let Some((bin, _serial)) = etcd_binary() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(bin, dir.path());
    let (mut owner, other) = elected(dir.path(), &etcd);
    let epoch = group(&owner).2;
    owner.child.kill().unwrap();
    let _ = owner.child.wait();
    let t0 = Instant::now();
    assert!(
        eventually(ttl() + SLACK, || group(&other).0 == "owner"),
        "{}",
        other.cluster()
    );
    let took = t0.elapsed();
    assert_eq!(ana_state(&other), OPTIMIZED);
    let (_, name, e) = group(&other);
    assert!(e > epoch, "epoch {e} after {epoch}");
    assert_eq!(name, other.cluster()["node"].as_str().unwrap());
    // Not before etcd could expire the dead owner's lease.
    assert!(took + Duration::from_millis(500) >= ttl() / 2, "{took:?}");
}

#[test]
fn a_stopped_owner_fences_and_rejoins_as_a_follower() {
    let Some((bin, _serial)) = etcd_binary() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(bin, dir.path());
    let (owner, other) = elected(dir.path(), &etcd);
    let epoch = group(&owner).2;
    // A host's queue to the owner: writes go through before the stop.
    let (_h, mut q) = support::connect(loopback(owner.port), WIDE_NQN, 1);
    let write = |q: &mut kvtarget::initiator::IoQueue| {
        q.write(1, 0, vec![0x11; 4096], 4096)
            .map_err(support::status_of)
    };
    write(&mut q[0]).expect("the owner serves I/O");
    signal(&owner, "STOP");
    let stopped = Instant::now();
    // Meanwhile the other node wins with a newer epoch.
    assert!(
        eventually(ttl() + SLACK, || group(&other).0 == "owner"),
        "{}",
        other.cluster()
    );
    assert!(group(&other).2 > epoch);
    std::thread::sleep((2 * ttl()).saturating_sub(stopped.elapsed()));
    signal(&owner, "CONT");
    // The first write after the resume already meets the lapsed lease (the
    // I/O path's own fence), not only once the fence thread has run.
    assert_eq!(
        write(&mut q[0]),
        Err(kvtarget::nvmf::ana::ASYMMETRIC_ACCESS_INACCESSIBLE)
    );
    // The fence thread looks every 20 ms: the resumed node must not claim
    // its dead lease's group.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(ana_state(&owner), INACCESSIBLE, "{}", owner.cluster());
    assert!(
        eventually(ttl() + SLACK, || group(&owner).0 == "follower"),
        "{}",
        owner.cluster()
    );
    assert_eq!(ana_state(&owner), INACCESSIBLE);
    assert_eq!(ana_state(&other), OPTIMIZED);
    let (_, o1, e1) = group(&owner);
    let (_, o2, e2) = group(&other);
    assert_eq!((o1, e1), (o2, e2));
}

#[test]
fn an_unelected_node_reports_inaccessible_until_it_wins() {
    let Some((bin, _serial)) = etcd_binary() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut etcd = Etcd::at(bin, dir.path());
    let extra = format!("on_unreachable = \"alone\"\n{}", wide_subsystem());
    let a = Node::start(dir.path(), "a", &etcd.url(), &extra);
    assert!(
        eventually(SLACK, || a.state() == "alone"),
        "{}",
        a.cluster()
    );
    // Alone, it cannot know whether another node owns the group.
    assert_eq!(group(&a).0, "fenced", "{}", a.cluster());
    assert_eq!(ana_state(&a), INACCESSIBLE);
    etcd.run();
    assert!(
        eventually(ttl() + SLACK, || group(&a).0 == "owner"),
        "{}",
        a.cluster()
    );
    assert_eq!(ana_state(&a), OPTIMIZED);
}

// ---- Node-local KV namespaces across a failover: taken over cold ----

/// The cluster-wide subsystem with one KV namespace (NSID 1, group 1) on a
/// node-local RAM pool: each node its own index.
fn wide_kv_subsystem() -> String {
    format!(
        r#"
[[pools]]
name = "local"
backend = "ram"
size = "64MiB"

[[pools.volumes]]
name = "cache"
size = "16MiB"
kind = "kv"

[[subsystems]]
nqn = "{WIDE_NQN}"
allow_any_host = true
ana_reporting = true
cluster_wide = true

[[subsystems.namespaces]]
nsid = 1
volume = "local/cache"
"#
    )
}

const PLAIN: nvme::StoreOptions = nvme::StoreOptions {
    must_exist: false,
    must_not_exist: false,
    no_compress: false,
};

fn kv_key(i: usize) -> nvme::KvKey {
    nvme::KvKey::new(format!("key-{i}").as_bytes()).unwrap()
}

/// `op` on node `n`'s path as a multipath host runs it: a path status (the
/// node lost its group, e.g. fenced by a keep-alive a loaded machine delayed)
/// waits for `n` to own the group again and retries; any other result is the
/// command's.
fn on_owner<T>(
    n: &Node,
    mut op: impl FnMut() -> Result<T, kvtarget::initiator::Error>,
) -> Result<T, kvtarget::initiator::Error> {
    for _ in 0..3 {
        match op() {
            Err(kvtarget::initiator::Error::Status(s, _)) if s.sct == 3 => {
                assert!(
                    eventually(ttl() + SLACK, || group(n).0 == "owner"),
                    "a path status ({s:?}) and the node did not own its group again: {}",
                    n.cluster()
                );
            }
            other => return other,
        }
    }
    op()
}

/// Key `i` as owner `n` serves it: its value, or None for Key Does Not Exist.
fn kv_read(n: &Node, q: &mut kvtarget::initiator::IoQueue, i: usize) -> Option<Vec<u8>> {
    match on_owner(n, || q.kv_retrieve(1, kv_key(i), 4096)) {
        Ok((v, _)) => Some(v),
        Err(e) => {
            let s = support::status_of(e);
            assert_eq!(s, nvme::Status::KV_KEY_DOES_NOT_EXIST, "key-{i}");
            None
        }
    }
}

/// A: owner, stores `old` values; stopped for twice the TTL, B wins and
/// the host stores `new` values of half the keys at B; A resumes as a
/// follower, B is killed, A wins again: every key reads as its latest value
/// or Key Does Not Exist (never A's stale `old` of a key B took), and Stores
/// succeed on A.
#[test]
fn node_local_kv_is_taken_over_cold() {
    let Some((bin, _serial)) = etcd_binary() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(bin, dir.path());
    let (first, mut second) = elected_serving(dir.path(), &etcd, &wide_kv_subsystem());
    const KEYS: usize = 10;
    let old = |i: usize| format!("old-{i}").into_bytes();
    let new = |i: usize| format!("new-{i}").into_bytes();
    {
        let (_h, mut q) = support::connect(loopback(first.port), WIDE_NQN, 1);
        for i in 0..KEYS {
            on_owner(&first, || q[0].kv_store(1, kv_key(i), old(i), PLAIN)).unwrap();
        }
    }
    signal(&first, "STOP");
    let stopped = Instant::now();
    assert!(
        eventually(ttl() + SLACK, || group(&second).0 == "owner"),
        "{}",
        second.cluster()
    );
    {
        let (_h, mut q) = support::connect(loopback(second.port), WIDE_NQN, 1);
        // Cold: nothing of the first owner's keys here.
        assert_eq!(kv_read(&second, &mut q[0], 0), None);
        for i in 0..KEYS / 2 {
            on_owner(&second, || q[0].kv_store(1, kv_key(i), new(i), PLAIN)).unwrap();
        }
    }
    std::thread::sleep((2 * ttl()).saturating_sub(stopped.elapsed()));
    signal(&first, "CONT");
    assert!(
        eventually(ttl() + SLACK, || group(&first).0 == "follower"),
        "{}",
        first.cluster()
    );
    second.child.kill().unwrap();
    let _ = second.child.wait();
    // Two leases more than a plain takeover: the node just back from SIGSTOP
    // may lose its fresh lease once more on a busy machine (found "fenced"
    // 6 s after the kill, 1 run in 20 under a CPU hog) and win after a rejoin.
    assert!(
        eventually(3 * ttl() + SLACK, || group(&first).0 == "owner"),
        "{}",
        first.cluster()
    );
    assert_eq!(ana_state(&first), OPTIMIZED);
    let (_h, mut q) = support::connect(loopback(first.port), WIDE_NQN, 1);
    for i in 0..KEYS {
        let latest = if i < KEYS / 2 { new(i) } else { old(i) };
        match kv_read(&first, &mut q[0], i) {
            None => {}
            Some(v) => assert_eq!(v, latest, "key-{i}: other bytes than its value"),
        }
    }
    // Taken over cold: A's index was emptied when it won again.
    assert_eq!(kv_read(&first, &mut q[0], 0), None);
    for i in 0..KEYS {
        on_owner(&first, || q[0].kv_store(1, kv_key(i), new(i), PLAIN)).unwrap();
        assert_eq!(kv_read(&first, &mut q[0], i), Some(new(i)));
    }
}

// ---- A shared pool: one file, opened by the owner of its group ----

/// The cluster-wide subsystem with one block namespace (NSID 1, group 1) on
/// a shared pool in `pool` (one file every node opens).
fn wide_shared_subsystem(pool: &Path) -> String {
    format!(
        r#"
[[pools]]
name = "shared"
backend = "uring"
path = "{}"
size = "64MiB"
shared = true

[[pools.volumes]]
name = "vol"
size = "16MiB"

[[pools.volumes]]
name = "kv"
size = "16MiB"
kind = "kv"

[[subsystems]]
nqn = "{WIDE_NQN}"
allow_any_host = true
ana_reporting = true
cluster_wide = true

[[subsystems.namespaces]]
nsid = 1
volume = "shared/vol"

[[subsystems.namespaces]]
nsid = 2
volume = "shared/kv"
ana_group = 1
"#,
        pool.display()
    )
}

/// Three nodes sharing one pool file (a block and a KV namespace, both in
/// ANA group 1); returns (owner, the two others) once
/// one owns group 1 and reports it optimized.
fn three_sharing(dir: &Path, etcd: &Etcd) -> (Node, Vec<Node>) {
    let sub = wide_shared_subsystem(&dir.join("shared.pool"));
    let mut nodes: Vec<Node> = ["a", "b", "c"]
        .iter()
        .map(|n| Node::start(dir, n, &etcd.url(), &sub))
        .collect();
    let owner_at = |nodes: &[Node]| nodes.iter().position(|n| group(n).0 == "owner");
    assert!(
        eventually(ttl() + SLACK, || owner_at(&nodes).is_some()),
        "{}",
        nodes[0].cluster()
    );
    let owner = nodes.remove(owner_at(&nodes).unwrap());
    if !eventually(SLACK, || ana_state(&owner) == OPTIMIZED) {
        panic!("the owner is not optimized: {}", owner.logs());
    }
    for n in &nodes {
        assert_eq!(ana_state(n), INACCESSIBLE, "{}", n.cluster());
    }
    (owner, nodes)
}

/// The block of pattern `p` for LBA `lba`.
fn block(lba: u64, p: u8) -> Vec<u8> {
    let mut b = vec![p; 4096];
    b[..8].copy_from_slice(&lba.to_le_bytes());
    b
}

/// Waits for one of `nodes` to own group 1 with an epoch above `epoch`.
fn new_owner(nodes: &[Node], epoch: i64) -> usize {
    let won = || {
        nodes
            .iter()
            .position(|n| group(n).0 == "owner" && group(n).2 > epoch)
    };
    assert!(
        eventually(ttl() + SLACK, || won().is_some()),
        "{}",
        nodes[0].cluster()
    );
    let i = won().unwrap();
    assert!(eventually(SLACK, || ana_state(&nodes[i]) == OPTIMIZED));
    i
}

#[test]
fn a_shared_pool_serves_every_flushed_block_after_its_owner_is_killed() {
    let Some((bin, _serial)) = etcd_binary() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(bin, dir.path());
    let (mut owner, others) = three_sharing(dir.path(), &etcd);
    let epoch = group(&owner).2;
    const BLOCKS: u64 = 32;
    {
        let (_h, mut q) = support::connect(loopback(owner.port), WIDE_NQN, 1);
        for lba in 0..BLOCKS {
            q[0].write(1, lba * 7, block(lba, 0xA5), 4096).unwrap();
        }
        q[0].flush(1).unwrap();
        for i in 0..10 {
            let v = format!("value-{i}").into_bytes();
            q[0].kv_store(2, kv_key(i), v, PLAIN).unwrap();
        }
        q[0].flush(2).unwrap();
    }
    owner.child.kill().unwrap();
    let _ = owner.child.wait();
    let i = new_owner(&others, epoch);
    let (_h, mut q) = support::connect(loopback(others[i].port), WIDE_NQN, 1);
    for lba in 0..BLOCKS {
        let got = q[0].read(1, lba * 7, 1, 4096).unwrap();
        assert!(
            got == block(lba, 0xA5),
            "LBA {} lost after the failover",
            lba * 7
        );
    }
    // KV namespaces on a shared pool keep their index (recovered with the
    // pool, not taken over cold).
    for i in 0..10 {
        let (v, _) = q[0].kv_retrieve(2, kv_key(i), 4096).unwrap();
        assert_eq!(v, format!("value-{i}").into_bytes(), "key-{i}");
    }
    q[0].write(1, 1, block(1, 0x5A), 4096).unwrap();
    q[0].flush(1).unwrap();
    assert_eq!(q[0].read(1, 1, 1, 4096).unwrap(), block(1, 0x5A));
    // The follower left serves nothing.
    assert_eq!(ana_state(&others[1 - i]), INACCESSIBLE);
}

#[test]
fn a_stopped_shared_pool_owner_writes_nothing_after_the_new_epoch() {
    let Some((bin, _serial)) = etcd_binary() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(bin, dir.path());
    let (owner, others) = three_sharing(dir.path(), &etcd);
    let epoch = group(&owner).2;
    let (_h, mut old) = support::connect(loopback(owner.port), WIDE_NQN, 1);
    old[0].write(1, 0, block(0, 0x11), 4096).unwrap();
    old[0].flush(1).unwrap();
    signal(&owner, "STOP");
    let stopped = Instant::now();
    let i = new_owner(&others, epoch);
    let (_h2, mut q) = support::connect(loopback(others[i].port), WIDE_NQN, 1);
    assert_eq!(q[0].read(1, 0, 1, 4096).unwrap(), block(0, 0x11));
    for lba in 0..8 {
        q[0].write(1, lba, block(lba, 0x22), 4096).unwrap();
    }
    q[0].flush(1).unwrap();
    std::thread::sleep((2 * ttl()).saturating_sub(stopped.elapsed()));
    signal(&owner, "CONT");
    // The resumed owner's I/O gets a path status, never reaches the pool.
    let inaccessible = Err(kvtarget::nvmf::ana::ASYMMETRIC_ACCESS_INACCESSIBLE);
    let w = old[0]
        .write(1, 0, block(0, 0x33), 4096)
        .map_err(support::status_of);
    assert_eq!(w, inaccessible);
    assert_eq!(old[0].flush(1).map_err(support::status_of), inaccessible);
    assert!(
        eventually(ttl() + SLACK, || group(&owner).0 == "follower"),
        "{}",
        owner.cluster()
    );
    assert_eq!(ana_state(&owner), INACCESSIBLE);
    // The new owner's data intact, and it goes on writing and committing.
    for lba in 0..8 {
        assert_eq!(
            q[0].read(1, lba, 1, 4096).unwrap(),
            block(lba, 0x22),
            "LBA {lba}"
        );
    }
    q[0].write(1, 100, block(100, 0x44), 4096).unwrap();
    q[0].flush(1).unwrap();
    assert_eq!(ana_state(&others[i]), OPTIMIZED);
    // The resumed node let go of the pool without writing.
    let logs = owner.logs();
    assert!(logs.contains("shared pool released"), "{logs}");
}

#[test]
fn a_won_group_stays_inaccessible_until_its_shared_pool_can_be_opened() {
    let Some((bin, _serial)) = etcd_binary() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(bin, dir.path());
    // An exclusive user holds the pool file (a writing tool, or a node whose
    // configuration does not say `shared`): the winner cannot open it.
    let path = dir.path().join("shared.pool");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let exclusive = kvtarget::pool::lock_pool(&path, true).unwrap();
    let a = Node::start(dir.path(), "a", &etcd.url(), &wide_shared_subsystem(&path));
    assert!(
        eventually(ttl() + SLACK, || group(&a).0 == "owner"),
        "{}",
        a.cluster()
    );
    std::thread::sleep(ttl() / 2);
    assert_eq!(ana_state(&a), INACCESSIBLE, "no pool, nothing to serve");
    drop(exclusive);
    // Retried at each poll (alone, it resigned after a TTL and won again
    // after sitting a TTL out): formatted, opened, attached, optimized.
    assert!(
        eventually(ttl() + SLACK, || ana_state(&a) == OPTIMIZED),
        "{}",
        a.cluster()
    );
    // While a node owns it, an exclusive user is refused.
    assert!(kvtarget::pool::lock_pool(&path, true).is_err());
    let (_h, mut q) = support::connect(loopback(a.port), WIDE_NQN, 1);
    q[0].write(1, 3, block(3, 0x77), 4096).unwrap();
    q[0].flush(1).unwrap();
    assert_eq!(q[0].read(1, 3, 1, 4096).unwrap(), block(3, 0x77));
}

#[test]
fn a_winner_that_cannot_open_its_shared_pool_resigns_for_a_node_that_can() {
    let Some((bin, _serial)) = etcd_binary() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(bin, dir.path());
    // Node a's view of the shared device is held exclusively by someone
    // else (on one machine: another file, locked); node b's is usable.
    let theirs = dir.path().join("a-view.pool");
    std::fs::File::create(&theirs)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let _exclusive = kvtarget::pool::lock_pool(&theirs, true).unwrap();
    let a = Node::start(
        dir.path(),
        "a",
        &etcd.url(),
        &wide_shared_subsystem(&theirs),
    );
    assert!(
        eventually(ttl() + SLACK, || group(&a).0 == "owner"),
        "{}",
        a.cluster()
    );
    let first = group(&a).2;
    let b_view = dir.path().join("b-view.pool");
    let b = Node::start(
        dir.path(),
        "b",
        &etcd.url(),
        &wide_shared_subsystem(&b_view),
    );
    // a resigns one TTL after its first failed open; b wins at its next poll.
    assert!(
        eventually(2 * ttl() + SLACK, || ana_state(&b) == OPTIMIZED),
        "a: {}\nb: {}",
        a.cluster(),
        b.cluster()
    );
    let (role, owner, epoch) = group(&b);
    assert_eq!((role.as_str(), owner.as_str()), ("owner", "b"));
    assert!(epoch > first, "epoch {epoch} after {first}");
    assert!(
        eventually(SLACK, || group(&a).0 == "follower"),
        "{}",
        a.cluster()
    );
    assert_eq!(ana_state(&a), INACCESSIBLE);
    let (_h, mut q) = support::connect(loopback(b.port), WIDE_NQN, 1);
    q[0].write(1, 5, block(5, 0x3c), 4096).unwrap();
    assert_eq!(q[0].read(1, 5, 1, 4096).unwrap(), block(5, 0x3c));
    let log = a.logs();
    assert!(
        log.contains("resigning a group this node could not serve"),
        "{log}"
    );
}
