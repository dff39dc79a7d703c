//! Asymmetric Namespace Access over real NVMe/TCP sockets: one subsystem,
//! two listeners, the in-repo initiator connected through both; states set
//! in the configuration and over RPC, the ANA log page and Identify each
//! path reports, Path Related statuses, a removed listener's queues
//! disconnected, bad input refused naming the field, and the saved
//! configuration keeping groups and states.

use kvtarget::config::Config;
use kvtarget::initiator::{HostController, IoQueue};
use kvtarget::nvmf::ana::{self, AnaLog, AnaState};
use kvtarget::server::Server;
use kvtarget::wire::nvme::Status;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

mod support;

const NQN: &str = "nqn.2026-12.io.kvtarget:multipath";
const BS: u32 = 4096;

struct Setup {
    server: Server,
    a: SocketAddr,
    b: SocketAddr,
    _dir: tempfile::TempDir,
}

/// Namespace 1 in group 1, namespace 2 in group 7; listener B reports
/// group 7 non-optimized (from the configuration).
fn start() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let (pa, pb) = (support::free_port(), support::free_port());
    let text = format!(
        r#"
[rpc]
socket = "{d}/kv.sock"

[metrics]
address = "127.0.0.1:0"

[[listeners]]
address = "127.0.0.1"
port = {pa}

[[listeners]]
address = "127.0.0.1"
port = {pb}

[[subsystems]]
nqn = "{NQN}"
allow_any_host = true
ana_reporting = true

[[subsystems.ana_states]]
listen = "127.0.0.1:{pb}"
ana_group = 7
state = "non_optimized"

[[subsystems.namespaces]]
nsid = 1
backend = "ram"
size = "4MiB"

[[subsystems.namespaces]]
nsid = 2
backend = "ram"
size = "4MiB"
ana_group = 7
"#,
        d = dir.path().display()
    );
    Setup {
        server: support::server(&text),
        a: support::loopback(pa),
        b: support::loopback(pb),
        _dir: dir,
    }
}

fn la(a: SocketAddr) -> Value {
    json!({"trtype": "TCP", "adrfam": "IPv4", "traddr": a.ip().to_string(), "trsvcid": a.port().to_string()})
}

fn ana_log(h: &mut HostController) -> AnaLog {
    let b = h.get_log_page(ana::LID_ANA, 0xFFFF_FFFF, 4096, 0).unwrap();
    AnaLog::decode(&b).expect("a whole ANA log page")
}

fn states(h: &mut HostController) -> Vec<(u32, u8, Vec<u32>)> {
    ana_log(h)
        .groups
        .into_iter()
        .map(|g| (g.anagrpid, g.state, g.nsids))
        .collect()
}

/// The `kvtarget_ana_groups` sample for `listener` and `state`.
fn ana_metric(server: &Server, listener: SocketAddr, state: &str) -> u64 {
    let mut s = std::net::TcpStream::connect(server.metrics_addr().unwrap()).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let want = format!(
        "kvtarget_ana_groups{{subsystem=\"{NQN}\",listener=\"{listener}\",state=\"{state}\"}} "
    );
    out.lines()
        .find_map(|l| l.strip_prefix(&want))
        .map_or(0, |v| v.trim().parse().unwrap())
}

fn write(q: &mut IoQueue, nsid: u32, seed: u8) -> Result<(), Status> {
    q.write(nsid, 0, vec![seed; BS as usize], BS)
        .map_err(support::status_of)
}

#[test]
fn two_paths_report_and_follow_their_ana_states() {
    let s = start();
    let mut c = support::rpc_client(&s.server);
    let (mut ha, mut qa) = support::connect(s.a, NQN, 1);
    let (mut hb, mut qb) = support::connect(s.b, NQN, 1);

    let id = ha.identify_controller().unwrap();
    assert_eq!(id.cmic & 0x0B, 0x0B, "multi-port, multi-controller, ANA");
    assert_eq!((id.anagrpmax, id.anatt), (1024, ana::ANATT_SECS));
    assert_eq!(ha.identify_namespace(2).unwrap().anagrpid, 7);
    assert_eq!(
        ha.identify_namespace(2).unwrap(),
        hb.identify_namespace(2).unwrap()
    );
    let (opt, non) = (AnaState::Optimized as u8, AnaState::NonOptimized as u8);
    assert_eq!(states(&mut ha), vec![(1, opt, vec![1]), (7, opt, vec![2])]);
    assert_eq!(states(&mut hb), vec![(1, opt, vec![1]), (7, non, vec![2])]);

    // A inaccessible for group 1: I/O there gets the Path Related status,
    // B serves it, and admin commands keep working on A.
    let r = c.call(
        "nvmf_subsystem_listener_set_ana_state",
        json!({"nqn": NQN, "listen_address": la(s.a), "ana_state": "inaccessible", "anagrpid": 1}),
    );
    assert_eq!(r.unwrap(), json!(true));
    assert_eq!(
        write(&mut qa[0], 1, 1),
        Err(ana::ASYMMETRIC_ACCESS_INACCESSIBLE)
    );
    write(&mut qa[0], 2, 2).expect("group 7 is still optimized on A");
    write(&mut qb[0], 1, 3).expect("B serves group 1");
    assert_eq!(qb[0].read(1, 0, 1, BS).unwrap(), vec![3u8; BS as usize]);
    assert_eq!(states(&mut ha)[0].1, AnaState::Inaccessible as u8);
    ha.keep_alive().unwrap();
    assert_eq!(ana_metric(&s.server, s.a, "inaccessible"), 1);
    assert_eq!(ana_metric(&s.server, s.a, "optimized"), 1);
    assert_eq!(ana_metric(&s.server, s.b, "non_optimized"), 1);

    // Every group of A in change, then back to optimized.
    for (st, want) in [
        ("change", Err(ana::ASYMMETRIC_ACCESS_TRANSITION)),
        (
            "persistent_loss",
            Err(ana::ASYMMETRIC_ACCESS_PERSISTENT_LOSS),
        ),
        ("optimized", Ok(())),
    ] {
        c.call(
            "nvmf_subsystem_listener_set_ana_state",
            json!({"nqn": NQN, "listen_address": la(s.a), "ana_state": st}),
        )
        .unwrap();
        assert_eq!(write(&mut qa[0], 1, 4), want, "{st}");
        assert_eq!(write(&mut qa[0], 2, 4), want, "{st}");
    }

    // nvmf_subsystem_get_listeners, SPDK's shape.
    let l = c
        .call("nvmf_subsystem_get_listeners", json!({"nqn": NQN}))
        .unwrap();
    let b = l
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["address"]["trsvcid"] == json!(s.b.port().to_string()))
        .expect("listener B");
    assert_eq!(b["address"]["trtype"], "TCP");
    assert_eq!(
        b["ana_states"][6],
        json!({"ana_group": 7, "ana_state": "non_optimized"})
    );

    // Namespace 1 moved to group 7: non-optimized on B, still served.
    c.call(
        "nvmf_subsystem_set_ns_ana_group",
        json!({"nqn": NQN, "nsid": 1, "anagrpid": 7}),
    )
    .unwrap();
    assert_eq!(states(&mut hb), vec![(7, non, vec![1, 2])]);
    write(&mut qb[0], 1, 5).expect("non-optimized serves I/O");
}

#[test]
fn bad_ana_input_is_refused_naming_the_field() {
    let s = start();
    let mut c = support::rpc_client(&s.server);
    let (mut h, _q) = support::connect(s.a, NQN, 1);
    let cc = ana_log(&mut h).change_count;
    let set = |st: &str, grp: Value, at: SocketAddr| json!({"nqn": NQN, "listen_address": la(at), "ana_state": st, "anagrpid": grp});
    let other = support::loopback(support::free_port());
    let cases = [
        (
            "nvmf_subsystem_listener_set_ana_state",
            set("sideways", json!(1), s.a),
            "ana_state:",
        ),
        (
            "nvmf_subsystem_listener_set_ana_state",
            set("optimized", json!(0), s.a),
            "anagrpid:",
        ),
        (
            "nvmf_subsystem_listener_set_ana_state",
            set("optimized", json!(1025), s.a),
            "anagrpid:",
        ),
        (
            "nvmf_subsystem_listener_set_ana_state",
            set("optimized", json!(1), other),
            "listen_address:",
        ),
        (
            "nvmf_subsystem_set_ns_ana_group",
            json!({"nqn": NQN, "nsid": 1, "anagrpid": 4096}),
            "anagrpid:",
        ),
        (
            "nvmf_subsystem_set_ns_ana_group",
            json!({"nqn": NQN, "nsid": 9, "anagrpid": 2}),
            "nsid:",
        ),
    ];
    for (method, params, field) in cases {
        let e = c.call(method, params.clone()).unwrap_err();
        assert!(e.message.starts_with(field), "{method} {params}: {e:?}");
    }
    // A subsystem without ANA reporting refuses states.
    c.call(
        "nvmf_create_subsystem",
        json!({"nqn": "nqn.2026-12.io.kvtarget:plain", "allow_any_host": true}),
    )
    .unwrap();
    c.call(
        "nvmf_subsystem_add_listener",
        json!({"nqn": "nqn.2026-12.io.kvtarget:plain", "listen_address": la(s.a)}),
    )
    .unwrap();
    let e = c
        .call(
            "nvmf_subsystem_listener_set_ana_state",
            json!({"nqn": "nqn.2026-12.io.kvtarget:plain", "listen_address": la(s.a), "ana_state": "optimized"}),
        )
        .unwrap_err();
    assert!(e.message.starts_with("ana_reporting:"), "{e:?}");
    // Nothing changed on the ANA subsystem.
    assert_eq!(ana_log(&mut h).change_count, cc);
}

#[test]
fn removing_a_listener_disconnects_its_queues_and_the_other_path_carries_on() {
    let s = start();
    let mut c = support::rpc_client(&s.server);
    let (_ha, mut qa) = support::connect(s.a, NQN, 1);
    let (_hb, mut qb) = support::connect(s.b, NQN, 1);
    write(&mut qa[0], 1, 1).unwrap();
    c.call(
        "nvmf_subsystem_remove_listener",
        json!({"nqn": NQN, "listen_address": la(s.a)}),
    )
    .unwrap();
    let t0 = Instant::now();
    let gone = loop {
        match qa[0].read(1, 0, 1, BS) {
            Err(_) => break true,
            Ok(_) if t0.elapsed() > Duration::from_secs(10) => break false,
            Ok(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    assert!(gone, "the queue through the removed listener stayed up");
    write(&mut qb[0], 1, 2).expect("path B carries on");
    // Added again with an initial state: reachable, every group in it,
    // nothing left of the old states. (The old socket may
    // take a moment to close: the acceptor notices its removal when it
    // next wakes.)
    let t0 = Instant::now();
    while let Err(e) = c.call(
        "nvmf_subsystem_add_listener",
        json!({"nqn": NQN, "listen_address": la(s.a), "ana_state": "non_optimized"}),
    ) {
        assert!(t0.elapsed() < Duration::from_secs(10), "{e:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (mut ha, mut qa) = support::connect(s.a, NQN, 1);
    write(&mut qa[0], 1, 3).unwrap();
    assert!(ana_log(&mut ha)
        .groups
        .iter()
        .all(|g| g.state == AnaState::NonOptimized as u8));
}

#[test]
fn the_saved_configuration_keeps_groups_and_states() {
    let s = start();
    let mut c = support::rpc_client(&s.server);
    c.call(
        "nvmf_subsystem_listener_set_ana_state",
        json!({"nqn": NQN, "listen_address": la(s.a), "ana_state": "inaccessible", "anagrpid": 1}),
    )
    .unwrap();
    c.call(
        "nvmf_subsystem_set_ns_ana_group",
        json!({"nqn": NQN, "nsid": 1, "anagrpid": 3}),
    )
    .unwrap();
    let r = c.call("kvtarget_save_config", json!({})).unwrap();
    let text = r["toml"].as_str().unwrap();
    let cfg = Config::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let sub = &cfg.subsystems[0];
    assert!(sub.ana_reporting, "{text}");
    assert_eq!(sub.namespaces[0].ana_group, Some(3), "{text}");
    assert_eq!(sub.namespaces[1].ana_group, Some(7), "{text}");
    let mut st: Vec<(String, Option<u32>, String)> = sub
        .ana_states
        .iter()
        .map(|a| (a.listen.clone(), a.ana_group, a.state.clone()))
        .collect();
    st.sort();
    let mut want = vec![
        (s.a.to_string(), Some(1), "inaccessible".to_string()),
        (s.b.to_string(), Some(7), "non_optimized".to_string()),
    ];
    want.sort();
    assert_eq!(st, want, "{text}");
}

#[test]
fn configuration_errors_name_the_field() {
    let base = |extra_sub: &str, extra_ns: &str| {
        format!(
            r#"
[[listeners]]
address = "127.0.0.1"
port = 4420

[[subsystems]]
nqn = "{NQN}"
listen = ["127.0.0.1:4420"]
{extra_sub}

[[subsystems.namespaces]]
nsid = 1
backend = "ram"
size = "1MiB"
{extra_ns}
"#
        )
    };
    let state = |l: &str, g: &str, st: &str| {
        format!("ana_reporting = true\n[[subsystems.ana_states]]\nlisten = \"{l}\"\n{g}state = \"{st}\"")
    };
    let cases = [
        (
            base(
                "[[subsystems.ana_states]]\nlisten = \"127.0.0.1:4420\"\nstate = \"inaccessible\"",
                "",
            ),
            "subsystems[0].ana_states[0]: needs ana_reporting",
        ),
        (
            base(&state("127.0.0.1:4420", "", "sideways"), ""),
            "subsystems[0].ana_states[0].state:",
        ),
        (
            base(&state("127.0.0.1:4420", "ana_group = 0\n", "change"), ""),
            "subsystems[0].ana_states[0].ana_group:",
        ),
        (
            base(&state("127.0.0.1:4999", "", "change"), ""),
            "subsystems[0].ana_states[0].listen:",
        ),
        (
            base("ana_reporting = true", "ana_group = 2000"),
            "subsystems[0].namespaces[0].ana_group:",
        ),
    ];
    for (text, want) in cases {
        let e = Config::parse(&text).unwrap_err().to_string();
        assert!(e.contains(want), "{e}\n{text}");
        assert_eq!(e.lines().count(), 1, "{e}");
    }
    let ok = base(
        &state("127.0.0.1:4420", "ana_group = 1\n", "Change"),
        "ana_group = 1",
    );
    Config::parse(&ok).unwrap();
}
