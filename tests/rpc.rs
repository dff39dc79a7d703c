//! The JSON-RPC control plane over its Unix socket: every method, bad input, and
//! live changes seen by a connected host (namespace events, host removal).

use kvtarget::config::Config;
use kvtarget::initiator::{Error, HostController, HostOptions};
use kvtarget::rpc::{code, RpcClient};
use kvtarget::server::Server;
use kvtarget::wire::nvme::{admin_opc, fid, lid, Sqe, Status};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

mod support;

const NQN: &str = "nqn.2026-11.io.kvtarget:rpc";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:6b767461-7267-6574-0000-000000000001";
const OTHER: &str = "nqn.2014-08.org.nvmexpress:uuid:6b767461-7267-6574-0000-0000000000cc";

fn start(dir: &std::path::Path) -> Server {
    let text = format!(
        r#"
[reactors]
count = 2

[rpc]
socket = "{d}/kv.sock"

[[listeners]]
address = "127.0.0.1"
port = 0

[[pools]]
name = "kv"
backend = "ram"
size = "256MiB"
extent_size = "1MiB"

[[pools.volumes]]
name = "base"
size = "16MiB"
"#,
        d = dir.display()
    );
    support::server(&text)
}

fn client(s: &Server) -> RpcClient {
    support::rpc_client(s)
}

fn err_code(r: Result<Value, kvtarget::rpc::RpcError>) -> i64 {
    match r {
        Err(e) => e.code,
        Ok(v) => panic!("expected an error, got {v}"),
    }
}

#[test]
fn methods_build_a_subsystem_a_host_can_use() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let mut c = client(&server);

    let v = c.call("spdk_get_version", json!({})).unwrap();
    assert!(v["version"].as_str().unwrap().contains("kvtarget"));
    let m = c.call("rpc_get_methods", json!({})).unwrap();
    assert!(m
        .as_array()
        .unwrap()
        .iter()
        .any(|x| x == "nvmf_subsystem_add_ns"));
    let r = c.call("framework_get_reactors", json!({})).unwrap();
    assert_eq!(r["reactors"].as_array().unwrap().len(), 2);
    assert_eq!(
        c.call(
            "nvmf_create_transport",
            json!({"trtype": "TCP", "io_unit_size": 8192})
        )
        .unwrap(),
        json!(true)
    );
    // RDMA before its transport exists: refused, naming the missing step.
    let e = c
        .call("nvmf_subsystem_add_listener", json!({"nqn": "nqn.2014-08.org.nvmexpress.discovery", "listen_address": {"trtype": "RDMA", "traddr": "192.0.2.1", "trsvcid": "4420"}}))
        .unwrap_err();
    assert_eq!(e.code, code::INVALID_PARAMS);
    assert!(e.message.contains("nvmf_create_transport"), "{}", e.message);
    // Creating the RDMA transport loads rdma-core at run time: it works where
    // rdma-core is installed and is one clear error where it is not.
    let rdma_core = kvtarget::transport::rdma::verbs::load().is_ok();
    match c.call("nvmf_create_transport", json!({"trtype": "RDMA"})) {
        Ok(v) => {
            assert!(rdma_core, "RDMA transport created without rdma-core");
            assert_eq!(v, json!(true));
        }
        Err(e) => {
            assert!(
                !rdma_core,
                "rdma-core loads but the transport failed: {}",
                e.message
            );
            assert!(e.message.contains("rdma-core"), "{}", e.message);
        }
    }
    let t = c.call("nvmf_get_transports", json!({})).unwrap();
    assert_eq!(t[0]["trtype"], "TCP");
    assert_eq!(t.as_array().unwrap().len(), if rdma_core { 2 } else { 1 });
    if rdma_core {
        assert_eq!(t[1]["trtype"], "RDMA");
    }
    // nvmf_get_stats: one poll group per reactor (SPDK's shape); under RDMA
    // one device entry per completion queue, none before any QP.
    let st = c.call("nvmf_get_stats", json!({})).unwrap();
    let pgs = st["poll_groups"].as_array().unwrap();
    assert!(!pgs.is_empty());
    assert_eq!(pgs[0]["name"], "nvmf_tgt_poll_group_000");
    let rdma_entries: Vec<_> = pgs
        .iter()
        .flat_map(|g| g["transports"].as_array().unwrap().iter())
        .filter(|t| t["trtype"] == "RDMA")
        .collect();
    assert_eq!(rdma_entries.len(), if rdma_core { pgs.len() } else { 0 });
    for t in rdma_entries {
        assert!(t["devices"].as_array().unwrap().is_empty(), "{t}");
    }

    // Subsystem, host list, a thin volume as its namespace.
    assert_eq!(
        c.call("nvmf_create_subsystem", json!({"nqn": NQN, "serial_number": "KVTRPC01", "model_number": "kv-rpc", "allow_any_host": false, "ana_reporting": false})).unwrap(),
        json!(true)
    );
    assert_eq!(
        err_code(c.call("nvmf_create_subsystem", json!({"nqn": NQN}))),
        code::EEXIST
    );
    assert_eq!(
        err_code(c.call("nvmf_create_subsystem", json!({"nqn": "bad name"}))),
        code::INVALID_PARAMS
    );
    assert_eq!(
        err_code(c.call(
            "nvmf_create_subsystem",
            json!({"nqn": "nqn.2026-11.x:y", "passthrough": true})
        )),
        code::INVALID_PARAMS
    );
    c.call("nvmf_subsystem_add_host", json!({"nqn": NQN, "host": HOST}))
        .unwrap();
    assert_eq!(
        err_code(c.call("nvmf_subsystem_add_host", json!({"nqn": NQN, "host": HOST}))),
        code::EEXIST
    );
    let uuid = c
        .call(
            "bdev_lvol_create",
            json!({"lvol_name": "a", "size_in_mib": 64, "lvs_name": "kv", "thin_provision": true}),
        )
        .unwrap();
    assert_eq!(uuid.as_str().unwrap().len(), 36);
    assert_eq!(
        err_code(c.call(
            "bdev_lvol_create",
            json!({"lvol_name": "a", "size_in_mib": 64, "lvs_name": "kv"})
        )),
        code::EEXIST
    );
    let b = c.call("bdev_get_bdevs", json!({"name": "kv/a"})).unwrap();
    assert_eq!(b[0]["num_blocks"], 64 * 256);
    assert_eq!(b[0]["driver_specific"]["lvol"]["thin_provision"], true);
    let nsid = c
        .call(
            "nvmf_subsystem_add_ns",
            json!({"nqn": NQN, "namespace": {"bdev_name": "kv/a"}}),
        )
        .unwrap();
    assert_eq!(nsid, json!(1));
    assert_eq!(
        err_code(c.call(
            "nvmf_subsystem_add_ns",
            json!({"nqn": NQN, "namespace": {"bdev_name": "kv/a", "nsid": 2}})
        )),
        code::EBUSY,
        "one volume, one namespace"
    );
    assert_eq!(
        err_code(c.call("bdev_lvol_delete", json!({"name": "kv/a"}))),
        code::EBUSY
    );
    let subs = c.call("nvmf_get_subsystems", json!({"nqn": NQN})).unwrap();
    let s = &subs[0];
    assert_eq!(s["serial_number"], "KVTRPC01");
    assert_eq!(s["hosts"][0]["nqn"], HOST);
    assert_eq!(s["namespaces"][0]["bdev_name"], "kv/a");
    assert_eq!(s["namespaces"][0]["uuid"], uuid);

    // A new subsystem listens nowhere until a listener is added (as in SPDK).
    let addr = server.listen_addrs()[0].0;
    assert!(HostController::connect(&HostOptions::new(addr, NQN)).is_err());
    let la = |a: std::net::SocketAddr| json!({"trtype": "TCP", "adrfam": "IPv4", "traddr": a.ip().to_string(), "trsvcid": a.port().to_string()});
    c.call(
        "nvmf_subsystem_add_listener",
        json!({"nqn": NQN, "listen_address": la(addr)}),
    )
    .unwrap();
    assert_eq!(
        err_code(c.call(
            "nvmf_subsystem_add_listener",
            json!({"nqn": NQN, "listen_address": la(addr)})
        )),
        code::EEXIST
    );
    // No RDMA device has this documentation address (RFC 5737): the listener
    // cannot exist, and the error says why in one line.
    let e = c
        .call("nvmf_subsystem_add_listener", json!({"nqn": NQN, "listen_address": {"trtype": "RDMA", "traddr": "192.0.2.1", "trsvcid": "4420"}}))
        .unwrap_err();
    assert!(!e.message.contains('\n'), "{}", e.message);
    assert!(
        e.message.contains("192.0.2.1") || e.message.contains("nvmf_create_transport"),
        "{}",
        e.message
    );
    assert_eq!(
        err_code(c.call("nvmf_subsystem_add_listener", json!({"nqn": NQN, "listen_address": {"trtype": "FC", "traddr": "127.0.0.1", "trsvcid": "4420"}}))),
        code::INVALID_PARAMS
    );
    // A second port, bound at run time.
    let port2 = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    c.call(
        "nvmf_subsystem_add_listener",
        json!({"nqn": NQN, "listen_address": la(port2)}),
    )
    .unwrap();
    let on_port2 = HostController::connect(&HostOptions::new(port2, NQN)).unwrap();
    c.call(
        "nvmf_subsystem_remove_listener",
        json!({"nqn": NQN, "listen_address": la(port2)}),
    )
    .unwrap();
    assert!(
        HostController::connect(&HostOptions::new(port2, NQN)).is_err(),
        "no new connections"
    );
    let mut on_port2 = on_port2;
    assert!(
        on_port2.identify_controller().is_ok(),
        "existing connections stay"
    );
    let subs = c.call("nvmf_get_subsystems", json!({"nqn": NQN})).unwrap();
    assert_eq!(subs[0]["listen_addresses"].as_array().unwrap().len(), 1);

    // A host connects to what the RPCs built and writes.
    let mut host = HostController::connect(&HostOptions::new(addr, NQN)).unwrap();
    assert_eq!(host.active_namespaces().unwrap(), vec![1]);
    host.set_queue_count(1).unwrap();
    let mut q = host.io_queue(1).unwrap();
    q.write(1, 0, vec![7u8; 4096], 4096).unwrap();
    let ctrls = c
        .call("nvmf_subsystem_get_controllers", json!({"nqn": NQN}))
        .unwrap();
    // The port-2 controller (no I/O queues) may still be there.
    let mine: Vec<&Value> = ctrls
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["num_io_qpairs"] == 1)
        .collect();
    assert_eq!(mine.len(), 1, "{ctrls}");
    assert_eq!(mine[0]["hostnqn"], HOST);

    // Adding a namespace while connected raises Namespace Attribute Changed.
    host.set_features(fid::ASYNC_EVENT_CONFIG, 1 << 8).unwrap();
    let aer = host
        .admin
        .submit(Sqe::new(admin_opc::ASYNC_EVENT_REQUEST, 0, 0), None, 0)
        .unwrap();
    c.call(
        "bdev_lvol_create",
        json!({"lvol_name": "b", "size_in_mib": 8, "thin_provision": true, "lvs_name": "kv"}),
    )
    .unwrap();
    assert_eq!(
        c.call(
            "nvmf_subsystem_add_ns",
            json!({"nqn": NQN, "namespace": {"bdev_name": "kv/b", "nsid": 5}})
        )
        .unwrap(),
        json!(5)
    );
    let ev = host.admin.wait_for(aer).unwrap().ok().unwrap();
    assert_eq!(
        ev.cqe.result as u32, 0x0004_0002,
        "notice, NS attribute changed, log 04h"
    );
    let log = host
        .get_log_page(lid::CHANGED_NS_LIST, 0xFFFF_FFFF, 4096, 0)
        .unwrap();
    assert_eq!(u32::from_le_bytes(log[0..4].try_into().unwrap()), 5);
    assert_eq!(host.active_namespaces().unwrap(), vec![1, 5]);
    q.write(5, 0, vec![9u8; 4096], 4096).unwrap();

    // The next AER reuses the CID of the completed one, as the Linux host
    // does; it must be accepted and carry the removal event.
    host.admin.reuse_cid(aer);
    let aer2 = host
        .admin
        .submit(Sqe::new(admin_opc::ASYNC_EVENT_REQUEST, 0, 0), None, 0)
        .unwrap();
    assert_eq!(aer2, aer);

    // Removing it: commands to it now fail cleanly, the other goes on.
    c.call("nvmf_subsystem_remove_ns", json!({"nqn": NQN, "nsid": 5}))
        .unwrap();
    let ev = host.admin.wait_for(aer2).unwrap().ok().unwrap();
    assert_eq!(ev.cqe.result as u32, 0x0004_0002);
    assert_eq!(host.active_namespaces().unwrap(), vec![1]);
    match q.read(5, 0, 1, 4096) {
        Err(Error::Status(s, _)) => assert_eq!(s, Status::INVALID_NAMESPACE),
        other => panic!("{other:?}"),
    }
    assert_eq!(q.read(1, 0, 1, 4096).unwrap(), vec![7u8; 4096]);
    assert_eq!(
        err_code(c.call("nvmf_subsystem_remove_ns", json!({"nqn": NQN, "nsid": 5}))),
        code::ENOENT
    );
    c.call("bdev_lvol_delete", json!({"name": "kv/b"})).unwrap();

    // Per-volume I/O statistics count what the host did.
    let st = c.call("bdev_get_iostat", json!({"name": "kv/a"})).unwrap();
    let b = &st["bdevs"][0];
    assert_eq!(b["num_write_ops"], 1);
    assert_eq!(b["bytes_written"], 4096);
    assert!(b["num_read_ops"].as_u64().unwrap() >= 1);
    assert!(st["tick_rate"].as_u64().unwrap() > 0);

    // Resizing: a served volume is refused, an idle one grows.
    assert_eq!(
        err_code(c.call(
            "bdev_lvol_resize",
            json!({"name": "kv/a", "size_in_mib": 128})
        )),
        code::EBUSY
    );
    c.call(
        "bdev_lvol_resize",
        json!({"name": "kv/base", "size_in_mib": 32}),
    )
    .unwrap();
    let b = c
        .call("bdev_get_bdevs", json!({"name": "kv/base"}))
        .unwrap();
    assert_eq!(b[0]["num_blocks"], 32 * 256);

    // Pools and GC are visible and controllable.
    let pools = c.call("kvtarget_get_pools", json!({})).unwrap();
    assert_eq!(pools[0]["name"], "kv");
    assert!(pools[0]["gc"]["mode"].is_string());
    assert_eq!(
        err_code(c.call(
            "kvtarget_pool_set_gc",
            json!({"name": "kv", "low_watermark_pct": 60})
        )),
        code::INVALID_PARAMS
    );
    let g = c
        .call(
            "kvtarget_pool_set_gc",
            json!({"name": "kv", "max_rate": 500.0, "max_foreground_qd": 4}),
        )
        .unwrap();
    assert_eq!(g["max_foreground_qd"], 4);
    let qp = c
        .call("nvmf_subsystem_get_qpairs", json!({"nqn": NQN}))
        .unwrap();
    assert!(qp.as_array().unwrap().iter().any(|q| q["qid"] == 1), "{qp}");
    c.call(
        "kvtarget_pool_set_gc",
        json!({"name": "kv", "paused": true}),
    )
    .unwrap();
    assert_eq!(
        c.call("kvtarget_get_pools", json!({"name": "kv"})).unwrap()[0]["gc"]["paused"],
        true
    );
    let chk = c
        .call("kvtarget_pool_check", json!({"name": "kv"}))
        .unwrap();
    assert_eq!(chk["consistent"], true, "{chk}");
    // A checkpoint on demand: counted, and its size and time in get_pools.
    let n = pools[0]["journal"]["checkpoints"].as_u64().unwrap();
    let ck = c
        .call("kvtarget_pool_checkpoint", json!({"name": "kv"}))
        .unwrap();
    assert!(ck["bytes"].as_u64().unwrap() > 0, "{ck}");
    let j = &c.call("kvtarget_get_pools", json!({"name": "kv"})).unwrap()[0]["journal"];
    assert!(j["checkpoints"].as_u64().unwrap() > n, "{j}");
    assert_eq!(j["last_checkpoint_bytes"], ck["bytes"], "{j}");
    assert!(j["last_commit_us"].is_u64(), "{j}");
    assert_eq!(
        err_code(c.call("kvtarget_pool_checkpoint", json!({"name": "nope"}))),
        code::ENOENT
    );
    let lvs = c.call("bdev_lvol_get_lvstores", json!({})).unwrap();
    assert_eq!(lvs[0]["name"], "kv");

    // Removing the host from the list disconnects its controller.
    c.call(
        "nvmf_subsystem_remove_host",
        json!({"nqn": NQN, "host": HOST}),
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(400));
    assert!(
        q.read(1, 0, 1, 4096).is_err(),
        "the removed host's queues are closed"
    );
    assert!(HostController::connect(&HostOptions::new(addr, NQN)).is_err());
    let mut other = HostOptions::new(addr, NQN);
    other.hostnqn = OTHER.into();
    c.call(
        "nvmf_subsystem_allow_any_host",
        json!({"nqn": NQN, "allow_any_host": true}),
    )
    .unwrap();
    assert!(HostController::connect(&other).is_ok());

    c.call("nvmf_delete_subsystem", json!({"nqn": NQN}))
        .unwrap();
    assert_eq!(
        err_code(c.call("nvmf_get_subsystems", json!({"nqn": NQN}))),
        code::ENOENT
    );
    server.shutdown();
}

#[test]
fn bad_input_gets_json_rpc_errors_and_never_hurts_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let path = server.rpc_path().unwrap().to_path_buf();
    let mut c = client(&server);
    assert_eq!(
        err_code(c.call("no_such_method", json!({}))),
        code::METHOD_NOT_FOUND
    );
    assert_eq!(
        err_code(c.call("nvmf_create_subsystem", json!({}))),
        code::INVALID_PARAMS
    );
    assert_eq!(
        err_code(c.call("nvmf_create_subsystem", json!({"nqn": 5}))),
        code::INVALID_PARAMS
    );
    assert_eq!(
        err_code(c.call("nvmf_get_subsystems", json!({"bogus": 1}))),
        code::INVALID_PARAMS,
        "unknown parameters are refused"
    );
    assert_eq!(
        err_code(c.call(
            "nvmf_subsystem_add_ns",
            json!({"nqn": "nqn.x:none", "namespace": {"bdev_name": "kv/base"}})
        )),
        code::ENOENT
    );
    assert_eq!(
        err_code(c.call(
            "bdev_lvol_create",
            json!({"lvol_name": "t", "size_in_mib": 1, "thin_provision": false})
        )),
        code::INVALID_PARAMS
    );

    let raw = |bytes: &[u8]| -> Value {
        let mut s = UnixStream::connect(&path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        // The server may close before a huge request is fully sent.
        let _ = s.write_all(bytes);
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    out.extend_from_slice(&buf[..n]);
                    if let Ok(v) = serde_json::from_slice::<Value>(&out) {
                        return v;
                    }
                }
                Err(_) => break,
            }
        }
        serde_json::from_slice(&out).unwrap_or(Value::Null)
    };
    assert_eq!(raw(b"{not json")["error"]["code"], code::PARSE_ERROR);
    assert_eq!(raw(b"[1, 2]")[0]["error"]["code"], code::INVALID_REQUEST);
    assert_eq!(raw(b"[]")["error"]["code"], code::INVALID_REQUEST);
    assert_eq!(
        raw(br#"{"jsonrpc":"1.0","method":"x","id":1}"#)["error"]["code"],
        code::INVALID_REQUEST
    );
    assert_eq!(
        raw(br#"{"jsonrpc":"2.0","method":7,"id":1}"#)["error"]["code"],
        code::INVALID_REQUEST
    );
    assert_eq!(
        raw(br#"{"jsonrpc":"2.0","method":"spdk_get_version","id":1,"params":[1]}"#)["error"]
            ["code"],
        code::INVALID_PARAMS
    );
    // A batch answers each request; a notification (no id) gets no answer.
    let b = raw(br#"[{"jsonrpc":"2.0","method":"spdk_get_version","id":1},{"jsonrpc":"2.0","method":"spdk_get_version"},{"jsonrpc":"2.0","method":"nope","id":"x"}]"#);
    assert_eq!(b.as_array().unwrap().len(), 2);
    assert_eq!(b[1]["error"]["code"], code::METHOD_NOT_FOUND);
    assert_eq!(b[1]["id"], "x");
    // Two requests in one write, and a request split across writes.
    let mut s = UnixStream::connect(&path).unwrap();
    s.write_all(br#"{"jsonrpc":"2.0","method":"spdk_get_version","id":1} {"jsonrpc":"2.0","me"#)
        .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    s.write_all(br#"thod":"rpc_get_methods","id":2}"#).unwrap();
    let mut cl = RpcClient::connect(&path).unwrap();
    let _ = &mut cl;
    let mut got = String::new();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 65536];
    while got.matches("\"id\"").count() < 2 {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0);
        got.push_str(std::str::from_utf8(&buf[..n]).unwrap());
    }
    // A huge request is refused and the connection closed.
    let mut big = br#"{"jsonrpc":"2.0","method":"x","id":1,"params":{"a":""#.to_vec();
    big.extend(std::iter::repeat_n(b'a', 2 << 20));
    let v = raw(&big);
    assert_eq!(v["error"]["code"], code::PARSE_ERROR);
    // Clients that connect and vanish, or send nothing, are fine too.
    for _ in 0..20 {
        drop(UnixStream::connect(&path).unwrap());
    }
    // The daemon still answers.
    let mut c2 = client(&server);
    assert!(c2.call("spdk_get_version", json!({})).is_ok());
    // The socket belongs to this target: a second one on it is refused.
    let dir2 = tempfile::tempdir().unwrap();
    let text = format!(
        "[rpc]\nsocket = \"{}\"\n[[listeners]]\naddress = \"127.0.0.1\"\nport = 0\n",
        path.display()
    );
    let e = Server::start(&Config::parse(&text).unwrap())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("another process is listening"), "{e}");
    drop(dir2);
    server.shutdown();
    assert!(!path.exists(), "the socket is removed at shutdown");
}

fn scrape(addr: std::net::SocketAddr) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    out.split("\r\n\r\n").nth(1).unwrap().to_string()
}

/// (name{labels}, value) pairs of the exposition text.
fn samples(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k.to_string(), v.parse::<f64>().unwrap())
        })
        .collect()
}

#[test]
fn metrics_move_with_io_and_histograms_are_consistent() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        r#"
[metrics]
address = "127.0.0.1:0"

[[listeners]]
address = "127.0.0.1"
port = 0

[[pools]]
name = "kv"
backend = "ram"
size = "256MiB"

[[pools.volumes]]
name = "m"
size = "64MiB"

[[subsystems]]
nqn = "{NQN}"
allow_any_host = false
hosts = ["{HOST}"]

[[subsystems.namespaces]]
nsid = 1
volume = "kv/m"
"#
    );
    let _ = &dir;
    let server = support::server(&text);
    let maddr = server.metrics_addr().unwrap();
    let before = samples(&scrape(maddr));
    let get = |s: &[(String, f64)], k: &str| {
        s.iter()
            .find(|(n, _)| n == k)
            .map(|x| x.1)
            .unwrap_or_else(|| panic!("no sample {k}"))
    };
    let reads = r#"kvtarget_volume_ops_total{pool="kv",volume="m",op="read"}"#;
    assert_eq!(get(&before, reads), 0.0);
    let addr = server.listen_addrs()[0].0;
    let mut h = HostController::connect(&HostOptions::new(addr, NQN)).unwrap();
    h.set_queue_count(1).unwrap();
    let mut q = h.io_queue(1).unwrap();
    for i in 0..50u64 {
        q.write(1, i * 8, vec![3u8; 4096], 4096).unwrap();
        q.read(1, i * 8, 1, 4096).unwrap();
    }
    let mut stranger = HostOptions::new(addr, NQN);
    stranger.hostnqn = OTHER.into();
    assert!(HostController::connect(&stranger).is_err());
    let after = samples(&scrape(maddr));
    assert_eq!(get(&after, reads), 50.0);
    assert_eq!(
        get(
            &after,
            r#"kvtarget_volume_bytes_total{pool="kv",volume="m",op="write"}"#
        ),
        50.0 * 4096.0
    );
    assert_eq!(
        get(
            &after,
            r#"kvtarget_volume_used_bytes{pool="kv",volume="m"}"#
        ),
        50.0 * 4096.0
    );
    assert_eq!(
        get(
            &after,
            r#"kvtarget_connect_refused_total{reason="host_not_allowed"}"#
        ),
        1.0
    );
    // 50 writes 32 KiB apart span two 1 MiB extents.
    assert_eq!(
        get(&after, r#"kvtarget_pool_extents{pool="kv",state="mapped"}"#),
        2.0
    );
    // Histogram: cumulative buckets never decrease, +Inf equals _count equals ops.
    for op in ["read", "write"] {
        let prefix = format!(
            r#"kvtarget_volume_latency_seconds_bucket{{pool="kv",volume="m",op="{op}",le="#
        );
        let buckets: Vec<f64> = after
            .iter()
            .filter(|(n, _)| n.starts_with(&prefix))
            .map(|x| x.1)
            .collect();
        assert!(buckets.len() > 10);
        assert!(buckets.windows(2).all(|w| w[0] <= w[1]), "{buckets:?}");
        let count = get(
            &after,
            &format!(r#"kvtarget_volume_latency_seconds_count{{pool="kv",volume="m",op="{op}"}}"#),
        );
        assert_eq!(*buckets.last().unwrap(), count);
        assert_eq!(count, 50.0);
        let sum = get(
            &after,
            &format!(r#"kvtarget_volume_latency_seconds_sum{{pool="kv",volume="m",op="{op}"}}"#),
        );
        assert!(sum > 0.0);
    }
    assert!(after
        .iter()
        .any(|(n, v)| n.starts_with("kvtarget_reactor_busy_seconds_total") && *v > 0.0));
    // Per queue pair: the I/O queue saw the 50 reads and 50 writes.
    let qp = |op: &str| {
        after
            .iter()
            .filter(|(n, _)| {
                n.starts_with("kvtarget_qpair_commands_total{")
                    && n.contains(r#"qid="1""#)
                    && n.contains(&format!(r#"op="{op}""#))
            })
            .map(|x| x.1)
            .sum::<f64>()
    };
    assert_eq!(qp("read"), 50.0);
    assert_eq!(qp("write"), 50.0);
    let qcount = after
        .iter()
        .find(|(n, _)| {
            n.starts_with("kvtarget_qpair_latency_seconds_count{")
                && n.contains(r#"qid="1""#)
                && n.contains(r#"op="read""#)
        })
        .map(|x| x.1);
    assert_eq!(qcount, Some(50.0));
    // Errors are counted by kind: a read past the end is an LBA error.
    assert!(q.read(1, 1 << 30, 1, 4096).is_err());
    let errs = samples(&scrape(maddr));
    let lba = errs
        .iter()
        .filter(|(n, _)| {
            n.starts_with("kvtarget_qpair_errors_total{")
                && n.contains(r#"qid="1""#)
                && n.contains(r#"status="lba_out_of_range""#)
        })
        .map(|x| x.1)
        .sum::<f64>();
    assert_eq!(lba, 1.0);
    // Anything but GET /metrics is refused politely.
    let mut s = std::net::TcpStream::connect(maddr).unwrap();
    s.write_all(b"GET /nope HTTP/1.1\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 404"));
    server.shutdown();
}

#[test]
fn saved_config_reproduces_the_running_state() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        r#"
[rpc]
socket = "{d}/kv.sock"

[[listeners]]
address = "127.0.0.1"
port = 0

[[pools]]
name = "kv"
backend = "uring"
path = "{d}/pool.img"
size = "256MiB"
"#,
        d = dir.path().display()
    );
    let server = support::server(&text);
    let mut c = client(&server);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    c.call("bdev_lvol_create", json!({"lvol_name": "s", "size_in_mib": 32, "lvs_name": "kv", "thin_provision": true, "unwritten": "error"}))
        .unwrap();
    c.call(
        "nvmf_create_subsystem",
        json!({"nqn": NQN, "serial_number": "KVTSAVED1"}),
    )
    .unwrap();
    c.call(
        "nvmf_subsystem_add_ns",
        json!({"nqn": NQN, "namespace": {"bdev_name": "kv/s", "nsid": 3}}),
    )
    .unwrap();
    c.call("nvmf_subsystem_add_host", json!({"nqn": NQN, "host": HOST}))
        .unwrap();
    c.call("nvmf_subsystem_add_listener", json!({"nqn": NQN, "listen_address": {"trtype": "TCP", "traddr": "127.0.0.1", "trsvcid": port.port().to_string()}}))
        .unwrap();
    let mut h = HostController::connect(&HostOptions::new(port, NQN)).unwrap();
    h.set_queue_count(1).unwrap();
    let mut q = h.io_queue(1).unwrap();
    q.write(3, 8, vec![5u8; 4096], 4096).unwrap();
    q.flush(3).unwrap();
    // A second pool, made over RPC on a file, with a volume in it.
    let extra = dir.path().join("extra.img");
    std::fs::File::create(&extra)
        .unwrap()
        .set_len(128 << 20)
        .unwrap();
    let lvs = c
        .call("bdev_lvol_create_lvstore", json!({"bdev_name": extra.to_str().unwrap(), "lvs_name": "extra", "cluster_sz": 262144}))
        .unwrap();
    assert_eq!(lvs.as_str().unwrap().len(), 36);
    assert_eq!(
        err_code(c.call(
            "bdev_lvol_create_lvstore",
            json!({"bdev_name": extra.to_str().unwrap(), "lvs_name": "again"})
        )),
        code::EBUSY,
        "the file is in use by the new pool"
    );
    assert_eq!(
        err_code(c.call(
            "bdev_lvol_create_lvstore",
            json!({"bdev_name": "/nonexistent/x", "lvs_name": "x"})
        )),
        code::ENOENT
    );
    c.call(
        "bdev_lvol_create",
        json!({"lvol_name": "e1", "size_in_mib": 8, "lvs_name": "extra", "thin_provision": true}),
    )
    .unwrap();
    let saved = dir.path().join("saved.toml");
    let r = c
        .call(
            "kvtarget_save_config",
            json!({"path": saved.to_str().unwrap()}),
        )
        .unwrap();
    assert!(r["toml"].as_str().unwrap().contains("kv/s"));
    let before = c.call("nvmf_get_subsystems", json!({"nqn": NQN})).unwrap();
    drop(q);
    drop(h);
    server.shutdown();

    let cfg = Config::load(&saved).unwrap();
    let server = Server::start(&cfg).unwrap();
    let mut c = client(&server);
    let after = c.call("nvmf_get_subsystems", json!({"nqn": NQN})).unwrap();
    assert_eq!(before, after, "subsystem, hosts, listeners, namespaces");
    let b = c
        .call("bdev_get_bdevs", json!({"name": "extra/e1"}))
        .unwrap();
    assert_eq!(
        b[0]["num_blocks"], 2048,
        "the RPC-made pool and its volume came back"
    );
    let mut h = HostController::connect(&HostOptions::new(port, NQN)).unwrap();
    h.set_queue_count(1).unwrap();
    let mut q = h.io_queue(1).unwrap();
    assert_eq!(q.read(3, 8, 1, 4096).unwrap(), vec![5u8; 4096]);
    match q.read(3, 0, 1, 4096) {
        Err(Error::Status(s, _)) => assert_eq!(s, Status::DEALLOCATED_OR_UNWRITTEN),
        other => panic!("the volume kept its unwritten = error option: {other:?}"),
    }
    server.shutdown();
}

/// What the RPCs show of the target, minus counters that move on their own.
fn rpc_state(c: &mut RpcClient) -> Value {
    let mut get = |m: &str| {
        c.call(m, json!({}))
            .unwrap_or_else(|e| panic!("{m}: {}", e.message))
    };
    let pools: Vec<Value> = get("kvtarget_get_pools")
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            json!([
                p["name"],
                p["volumes"],
                p["gc"]["paused"],
                p["gc"]["low_watermark"],
                p["gc"]["high_watermark"]
            ])
        })
        .collect();
    json!({
        "subsystems": get("nvmf_get_subsystems"),
        "bdevs": get("bdev_get_bdevs"),
        "lvstores": get("bdev_lvol_get_lvstores"),
        "transports": get("nvmf_get_transports"),
        "pools": pools,
    })
}

#[test]
fn unknown_keys_are_refused_over_the_socket_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let mut c = client(&server);
    let la = |a: std::net::SocketAddr| json!({"trtype": "TCP", "adrfam": "IPv4", "traddr": a.ip().to_string(), "trsvcid": a.port().to_string()});
    let free_port = || support::loopback(support::free_port());
    // Something for each method to change: a subsystem with a host, a
    // namespace and a listener of its own, and an idle volume.
    for v in ["served", "spare"] {
        c.call(
            "bdev_lvol_create",
            json!({"lvol_name": v, "size_in_mib": 8, "lvs_name": "kv"}),
        )
        .unwrap();
    }
    c.call("nvmf_create_subsystem", json!({"nqn": NQN}))
        .unwrap();
    c.call("nvmf_subsystem_add_host", json!({"nqn": NQN, "host": HOST}))
        .unwrap();
    c.call(
        "nvmf_subsystem_add_ns",
        json!({"nqn": NQN, "namespace": {"bdev_name": "kv/served", "nsid": 1}}),
    )
    .unwrap();
    let own = free_port();
    c.call(
        "nvmf_subsystem_add_listener",
        json!({"nqn": NQN, "listen_address": la(own)}),
    )
    .unwrap();
    let unbound = free_port();
    let lvs_file = dir.path().join("lvs.img");
    std::fs::File::create(&lvs_file)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let saved = dir.path().join("saved.toml");
    let cases = [
        ("nvmf_create_transport", json!({"trtype": "RDMA"})),
        (
            "nvmf_create_subsystem",
            json!({"nqn": "nqn.2026-11.io.kvtarget:new"}),
        ),
        ("nvmf_delete_subsystem", json!({"nqn": NQN})),
        (
            "nvmf_subsystem_add_listener",
            json!({"nqn": NQN, "listen_address": la(unbound)}),
        ),
        (
            "nvmf_subsystem_remove_listener",
            json!({"nqn": NQN, "listen_address": la(own)}),
        ),
        (
            "nvmf_subsystem_add_ns",
            json!({"nqn": NQN, "namespace": {"bdev_name": "kv/spare"}}),
        ),
        ("nvmf_subsystem_remove_ns", json!({"nqn": NQN, "nsid": 1})),
        (
            "nvmf_subsystem_add_host",
            json!({"nqn": NQN, "host": OTHER}),
        ),
        (
            "nvmf_subsystem_remove_host",
            json!({"nqn": NQN, "host": HOST}),
        ),
        (
            "nvmf_subsystem_allow_any_host",
            json!({"nqn": NQN, "allow_any_host": true}),
        ),
        (
            "bdev_lvol_create_lvstore",
            json!({"bdev_name": lvs_file.to_str().unwrap(), "lvs_name": "extra"}),
        ),
        (
            "bdev_lvol_create",
            json!({"lvol_name": "new", "size_in_mib": 4, "lvs_name": "kv"}),
        ),
        ("bdev_lvol_delete", json!({"name": "kv/spare"})),
        (
            "bdev_lvol_resize",
            json!({"name": "kv/spare", "size_in_mib": 16}),
        ),
        (
            "kvtarget_pool_set_gc",
            json!({"name": "kv", "paused": true}),
        ),
        (
            "kvtarget_save_config",
            json!({"path": saved.to_str().unwrap()}),
        ),
    ];
    // Each call must be refused with the key named and leave the target as
    // it was; every failure is listed, not just the first (each against the
    // state just before it, so one wrong change is reported once).
    let mut before = rpc_state(&mut c);
    let mut failures = Vec::new();
    for (method, mut params) in cases {
        params["bogus_key"] = json!(1);
        match c.call(method, params) {
            Ok(v) => failures.push(format!("{method}: accepted an unknown key: {v}")),
            Err(e)
                if e.code != code::INVALID_PARAMS
                    || e.message != "unknown parameter `bogus_key`" =>
            {
                failures.push(format!("{method}: {} {}", e.code, e.message))
            }
            Err(_) => {}
        }
        let after = rpc_state(&mut c);
        let changed: Vec<&String> = before
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| before[*k] != after[*k])
            .collect();
        if !changed.is_empty() {
            failures.push(format!("{method}: changed {changed:?}"));
        }
        before = after;
    }
    assert!(failures.is_empty(), "{failures:#?}");
    // What the state above does not show: sockets and files.
    assert!(
        std::net::TcpListener::bind(unbound).is_ok(),
        "add_listener bound {unbound}"
    );
    assert!(
        std::net::TcpStream::connect(own).is_ok(),
        "remove_listener closed {own}"
    );
    assert!(
        std::fs::read(&lvs_file).unwrap().iter().all(|&b| b == 0),
        "create_lvstore wrote its file"
    );
    assert!(!saved.exists(), "save_config wrote its file");
    server.shutdown();
}

/// `kvtarget rpc ... | head`: the reader goes away before the answer is
/// printed. The client ends without a panic (it did: "failed printing to
/// stdout: Broken pipe", exit 101), in table and in JSON form.
#[test]
fn rpc_client_survives_a_closed_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let _server = start(dir.path());
    let sock = dir.path().join("kv.sock");
    for json in [false, true] {
        let mut cmd = std::process::Command::new(support::BIN);
        cmd.arg("rpc").arg("-r").arg(&sock);
        if json {
            cmd.arg("--json");
        }
        let mut child = cmd
            .arg("rpc_get_methods")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "json={json}: {err}");
        assert!(out.status.success(), "json={json}: {:?} {err}", out.status);
    }
}
