//! KV namespaces (NVMe Key Value command set) served over NVMe/TCP: the real
//! target with pools on real files, driven by the in-repo initiator over
//! sockets; and the daemon killed with SIGKILL under a KV load.

use kvtarget::config::Config;
use kvtarget::initiator::{Error, HostController, IoQueue};
use kvtarget::server::Server;
use kvtarget::wire::nvme::{KvCommand, KvKey, Status, StoreOptions};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const NQN: &str = "nqn.2026-12.io.kvtarget:kv";

mod support;
use support::{free_port, loopback, spawn_daemon, status_of, write_config, BIN};

fn config(dir: &std::path::Path, port: u16, kv_size: &str, ns_extra: &str) -> String {
    format!(
        r#"
[reactors]
count = 2

[[listeners]]
address = "127.0.0.1"
port = {port}

[[pools]]
name = "p"
backend = "uring"
path = "{dir}/pool.img"
size = "256MiB"
extent_size = "1MiB"

[[pools.volumes]]
name = "cache"
size = "{kv_size}"
kind = "kv"

[[pools.volumes]]
name = "blocks"
size = "16MiB"

[[subsystems]]
nqn = "{NQN}"
allow_any_host = true

[[subsystems.namespaces]]
nsid = 1
volume = "p/cache"
{ns_extra}

[[subsystems.namespaces]]
nsid = 2
volume = "p/blocks"
"#,
        dir = dir.display()
    )
}

fn start(dir: &std::path::Path, kv_size: &str, ns_extra: &str) -> (Server, SocketAddr) {
    support::start_server(&config(dir, 0, kv_size, ns_extra))
}

fn connect(addr: SocketAddr, queues: u16) -> (HostController, Vec<IoQueue>) {
    support::connect(addr, NQN, queues)
}

fn key(s: &str) -> KvKey {
    KvKey::new(s.as_bytes()).expect("key of at most 16 bytes")
}

fn value(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u64).wrapping_mul(131) ^ seed.wrapping_mul(0x9E37_79B9)) as u8)
        .collect()
}

const PLAIN: StoreOptions = StoreOptions {
    must_exist: false,
    must_not_exist: false,
    no_compress: false,
};

#[test]
fn kv_commands_round_trip_with_the_specs_statuses() {
    let dir = tempfile::tempdir().unwrap();
    let (server, addr) = start(dir.path(), "64MiB", "");
    let (mut c, mut qs) = connect(addr, 2);
    let q = &mut qs[0];

    // Values of one byte to the largest a command carries (1 MiB MDTS).
    let sizes = [1usize, 4096, 5000, 65536, 300_001, 1 << 20];
    for (i, &n) in sizes.iter().enumerate() {
        let k = key(&format!("value-{i}"));
        q.kv_store(1, k, value(i as u64, n), PLAIN).unwrap();
    }
    for (i, &n) in sizes.iter().enumerate() {
        let k = key(&format!("value-{i}"));
        let (got, size) = q.kv_retrieve(1, k, n as u32).unwrap();
        assert_eq!(size as usize, n);
        assert!(got == value(i as u64, n), "value {i} ({n} bytes) differs");
    }
    // A buffer smaller than the value gets its first bytes and the whole size.
    let (got, size) = q.kv_retrieve(1, key("value-3"), 1000).unwrap();
    assert_eq!(size, 65536);
    assert_eq!(got, value(3, 65536)[..1000].to_vec());
    // HBS 0: only the size.
    let (got, size) = q.kv_retrieve(1, key("value-4"), 0).unwrap();
    assert_eq!((got.len(), size), (0, 300_001));
    // An empty value.
    q.kv_store(1, key("empty"), Vec::new(), PLAIN).unwrap();
    assert_eq!(q.kv_retrieve(1, key("empty"), 16).unwrap().1, 0);

    // Overwrite, store options, Exist, Delete.
    q.kv_store(1, key("value-0"), value(99, 7000), PLAIN)
        .unwrap();
    assert_eq!(
        q.kv_retrieve(1, key("value-0"), 8192).unwrap().0,
        value(99, 7000)
    );
    let mne = StoreOptions {
        must_not_exist: true,
        ..PLAIN
    };
    let me = StoreOptions {
        must_exist: true,
        ..PLAIN
    };
    let e = q.kv_store(1, key("value-0"), vec![1; 10], mne).unwrap_err();
    assert_eq!(status_of(e), Status::KV_KEY_EXISTS);
    let e = q.kv_store(1, key("nope"), vec![1; 10], me).unwrap_err();
    assert_eq!(status_of(e), Status::KV_KEY_DOES_NOT_EXIST);
    q.kv_store(1, key("fresh"), vec![2; 10], mne).unwrap();
    q.kv_store(1, key("fresh"), vec![3; 10], me).unwrap();
    assert_eq!(q.kv_retrieve(1, key("fresh"), 10).unwrap().0, vec![3; 10]);
    assert!(q.kv_exist(1, key("fresh")).unwrap());
    q.kv_delete(1, key("fresh")).unwrap();
    assert!(!q.kv_exist(1, key("fresh")).unwrap());
    let e = q.kv_delete(1, key("fresh")).unwrap_err();
    assert_eq!(status_of(e), Status::KV_KEY_DOES_NOT_EXIST);
    let e = q.kv_retrieve(1, key("fresh"), 4096).unwrap_err();
    assert_eq!(status_of(e), Status::KV_KEY_DOES_NOT_EXIST);

    // List in key order, from a start key, limited by the buffer.
    let all = q.kv_list(1, KvKey::default(), 4096).unwrap();
    let names: Vec<String> = all
        .iter()
        .map(|k| String::from_utf8_lossy(k.as_bytes()).into_owned())
        .collect();
    assert_eq!(
        names,
        ["empty", "value-0", "value-1", "value-2", "value-3", "value-4", "value-5"]
    );
    let from = q.kv_list(1, key("value-3"), 4096).unwrap();
    assert_eq!(from.first(), Some(&key("value-3")));
    assert_eq!(from.len(), 3);
    // 4 + 2 entries of 12 bytes ("value-N" padded): room for two keys.
    assert_eq!(q.kv_list(1, KvKey::default(), 4 + 24).unwrap().len(), 2);

    // Malformed commands get the spec's status and touch nothing else.
    let bad = |q: &mut IoQueue, cmd: KvCommand, data: Option<Vec<u8>>, inlen: usize| {
        let cid = q.submit_kv(1, &cmd, data, inlen).unwrap();
        q.q.wait_for(cid).unwrap().status()
    };
    let empty_key = KvKey::default();
    assert_eq!(
        bad(
            q,
            KvCommand::Store {
                key: empty_key,
                value_size: 4,
                options: PLAIN
            },
            Some(vec![0; 4]),
            0
        ),
        Status::KV_INVALID_KEY_SIZE
    );
    assert_eq!(
        bad(
            q,
            KvCommand::Retrieve {
                key: empty_key,
                host_buffer_size: 4096,
                raw: false
            },
            None,
            4096
        ),
        Status::KV_INVALID_KEY_SIZE
    );
    let mut over = KvCommand::Store {
        key: key("big"),
        value_size: (1 << 20) + 1,
        options: PLAIN,
    }
    .encode(0, 1);
    over.set_cdw(10, (1 << 20) + 1);
    let cid = q.q.submit(over, Some(vec![0; 4096]), 0).unwrap();
    assert_eq!(
        q.q.wait_for(cid).unwrap().status(),
        Status::KV_INVALID_VALUE_SIZE
    );
    assert_eq!(
        bad(
            q,
            KvCommand::List {
                start_key: empty_key,
                host_buffer_size: 2
            },
            None,
            2
        ),
        Status::INVALID_FIELD
    );
    // NVM commands on a KV namespace are not of its command set (Write
    // Zeroes, 08h; Read and Write share their opcodes with Retrieve and Store).
    let e = q.write_zeroes(1, 0, 1, false).unwrap_err();
    assert_eq!(status_of(e), Status::INVALID_OPCODE);
    // The block namespace beside it works as before.
    q.write(2, 8, value(5, 4096), 4096).unwrap();
    assert_eq!(q.read(2, 8, 1, 4096).unwrap(), value(5, 4096));

    // Identify: the KV format and the key bound.
    let kv_id = c.identify_kv_namespace(1).unwrap();
    assert_eq!(kv_id.kvf[0].kml, 16);
    assert_eq!(kv_id.kvf[0].vml, 1 << 20);
    assert_eq!(kv_id.kvf[0].mnk, (64 << 20) / (16 << 10));
    assert_eq!(kv_id.nsze, 64 << 20);
    assert!(kv_id.nuse > 0);

    // Two queues storing and reading concurrently, values verified.
    let mut handles = Vec::new();
    for (w, mut q) in qs.into_iter().enumerate() {
        handles.push(std::thread::spawn(move || {
            for i in 0..40u64 {
                let k = key(&format!("w{w}-{i}"));
                let v = value(w as u64 * 1000 + i, 4096 + (i as usize * 3331) % 200_000);
                q.kv_store(1, k, v.clone(), PLAIN).unwrap();
                let (got, n) = q.kv_retrieve(1, k, v.len() as u32).unwrap();
                assert_eq!(n as usize, v.len());
                assert!(got == v, "w{w}-{i} differs");
            }
        }));
    }
    for h in handles {
        h.join().unwrap();
    }
    drop(c);
    server.shutdown();

    // Clean restart: every key is back.
    let (server, addr) = start(dir.path(), "64MiB", "");
    let (_c, mut qs) = connect(addr, 1);
    let q = &mut qs[0];
    assert_eq!(
        q.kv_retrieve(1, key("value-0"), 8192).unwrap().0,
        value(99, 7000)
    );
    assert_eq!(
        q.kv_retrieve(1, key("value-5"), 1 << 20).unwrap().0,
        value(5, 1 << 20)
    );
    assert!(q.kv_exist(1, key("w1-39")).unwrap());
    assert!(!q.kv_exist(1, key("fresh")).unwrap());
    server.shutdown();
}

#[test]
fn a_full_kv_namespace_evicts_or_fails_as_configured() {
    let dir = tempfile::tempdir().unwrap();
    // 8 MiB: 512 keys at most, 64 values of 128 KiB fill it.
    let (server, addr) = start(dir.path(), "8MiB", "");
    let (_c, mut qs) = connect(addr, 1);
    let q = &mut qs[0];
    let n = 200u64;
    for i in 0..n {
        q.kv_store(1, key(&format!("k{i}")), value(i, 128 << 10), PLAIN)
            .unwrap_or_else(|e| panic!("store {i} on a full namespace: {e:?}"));
        // k0 stays hot.
        if i > 0 {
            assert!(q.kv_exist(1, key("k0")).unwrap(), "hot key evicted at {i}");
        }
    }
    let mut present = 0;
    for i in 0..n {
        match q.kv_retrieve(1, key(&format!("k{i}")), 128 << 10) {
            Ok((v, _)) => {
                assert!(v == value(i, 128 << 10), "k{i} differs");
                present += 1;
            }
            Err(e) => assert_eq!(status_of(e), Status::KV_KEY_DOES_NOT_EXIST),
        }
    }
    assert!((32..=64).contains(&present), "{present} keys left");
    // The newest key is always there.
    assert!(q.kv_exist(1, key(&format!("k{}", n - 1))).unwrap());
    drop(qs);
    server.shutdown();

    let dir = tempfile::tempdir().unwrap();
    let (server, addr) = start(dir.path(), "8MiB", "on_full = \"fail\"");
    let (_c, mut qs) = connect(addr, 1);
    let q = &mut qs[0];
    let mut failed_at = None;
    for i in 0..100u64 {
        if let Err(e) = q.kv_store(1, key(&format!("k{i}")), value(i, 128 << 10), PLAIN) {
            assert_eq!(status_of(e), Status::CAPACITY_EXCEEDED);
            failed_at = Some(i);
            break;
        }
    }
    assert_eq!(failed_at, Some(64));
    // Deleting makes room again (after the commit the Store itself asks for).
    q.kv_delete(1, key("k3")).unwrap();
    q.kv_store(1, key("again"), value(7, 128 << 10), PLAIN)
        .unwrap();
    assert_eq!(
        q.kv_retrieve(1, key("k0"), 128 << 10).unwrap().0,
        value(0, 128 << 10)
    );
    drop(qs);
    server.shutdown();
}

fn connect_retry(addr: SocketAddr) -> HostController {
    support::connect_retry(addr, NQN)
}

/// A value that names its key and version, so a recovered value can be
/// checked whole.
fn versioned(k: u64, version: u64) -> Vec<u8> {
    let len = 4096 + (k as usize % 7) * 10_000;
    let mut v = value(k ^ version, len);
    v[..8].copy_from_slice(&k.to_le_bytes());
    v[8..16].copy_from_slice(&version.to_le_bytes());
    v
}

/// The daemon killed with SIGKILL under a KV load: `kvtarget check` passes,
/// and after restart every key holds what it held at the last completed Flush
/// or something stored after it (never torn, never another key's value).
#[test]
fn sigkill_mid_kv_load_keeps_every_flushed_key() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let pool = dir.path().join("pool.img");
    // Large enough that nothing is evicted: every flushed key must be back.
    let cfg = write_config(
        dir.path(),
        "kv.toml",
        &config(dir.path(), port, "128MiB", ""),
    );
    let addr = loopback(port);
    let spawn = || spawn_daemon(&cfg, &dir.path().join("rpc.sock"));
    let mut child = spawn();
    let mut c = connect_retry(addr);
    c.set_queue_count(2).unwrap();
    // Per key: the versions a Retrieve may find after the crash (0: none).
    let allowed: Arc<Mutex<HashMap<u64, Vec<u64>>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    // Operations done by both workers: the kill comes once the load has run a
    // while (a fixed sleep saw 68 operations on a busy machine, not the 200 the
    // test needs to mean anything).
    let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut workers = Vec::new();
    for w in 0..2u64 {
        let mut q = c.io_queue(w as u16 + 1).unwrap();
        let (allowed, stop, done) = (allowed.clone(), stop.clone(), done.clone());
        workers.push(std::thread::spawn(move || {
            let mut rng = 0x2545_F491u64 + w;
            let mut version = w << 40;
            let mut since_flush: Vec<u64> = Vec::new();
            let mut ops = 0u64;
            while !stop.load(Ordering::Relaxed) {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                // Worker w owns keys congruent to w mod 2.
                let k = (rng % 400) * 2 + w;
                let kk = KvKey::new(&k.to_be_bytes()).unwrap();
                version += 1;
                let op = rng % 10;
                let r = if op < 7 {
                    allowed
                        .lock()
                        .unwrap()
                        .entry(k)
                        .or_insert_with(|| vec![0])
                        .push(version);
                    q.kv_store(1, kk, versioned(k, version), PLAIN)
                } else if op < 9 {
                    allowed
                        .lock()
                        .unwrap()
                        .entry(k)
                        .or_insert_with(|| vec![0])
                        .push(0);
                    match q.kv_delete(1, kk) {
                        Err(Error::Status(s, _)) if s == Status::KV_KEY_DOES_NOT_EXIST => Ok(()),
                        r => r,
                    }
                } else {
                    let cid = match q.submit_kv(1, &KvCommand::Flush, None, 0) {
                        Ok(c) => c,
                        Err(_) => return ops,
                    };
                    match q.q.wait_for(cid).map(|c| c.ok()) {
                        Ok(Ok(_)) => {
                            let mut a = allowed.lock().unwrap();
                            for key in since_flush.drain(..) {
                                if let Some(v) = a.get_mut(&key) {
                                    let last = *v.last().unwrap();
                                    *v = vec![last];
                                }
                            }
                            Ok(())
                        }
                        _ => return ops,
                    }
                };
                if r.is_err() {
                    return ops; // the target died
                }
                if op < 9 {
                    since_flush.push(k);
                }
                ops += 1;
                done.fetch_add(1, Ordering::Relaxed);
            }
            ops
        }));
    }
    // At least 3 s of load, and at least KILL_AFTER_OPS operations (at most
    // three minutes): what an idle machine does in 3 s, a loaded one may take
    // far longer to (a flush's fsync took 12 s on a CI machine's busy disk).
    const KILL_AFTER_OPS: u64 = 400;
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_millis(3000));
    while done.load(Ordering::Relaxed) < KILL_AFTER_OPS && t0.elapsed() < Duration::from_secs(180) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let st = Command::new("kill")
        .arg("-KILL")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(st.success());
    let _ = child.wait();
    stop.store(true, Ordering::Relaxed);
    let ops: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    assert!(ops > 200, "only {ops} operations before the kill");
    drop(c);

    let out = Command::new(BIN).arg("check").arg(&pool).output().unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "check failed:\n{report}");
    assert!(report.contains("KV namespace"), "{report}");

    let mut child = spawn();
    let mut c = connect_retry(addr);
    c.set_queue_count(1).unwrap();
    let mut q = c.io_queue(1).unwrap();
    let allowed = allowed.lock().unwrap();
    let (mut found, mut checked) = (0, 0);
    for (&k, vals) in allowed.iter() {
        let kk = KvKey::new(&k.to_be_bytes()).unwrap();
        let got = match q.kv_retrieve(1, kk, 1 << 20) {
            Ok((v, _)) => {
                let ver = u64::from_le_bytes(v[8..16].try_into().unwrap());
                assert_eq!(v, versioned(k, ver), "key {k}: torn or foreign value");
                found += 1;
                ver
            }
            Err(Error::Status(s, _)) if s == Status::KV_KEY_DOES_NOT_EXIST => 0,
            Err(e) => panic!("key {k}: {e:?}"),
        };
        // What was current at the key's last flush, or stored since (0: the
        // key was absent then, or deleted since).
        assert!(
            vals.contains(&got),
            "key {k}: version {got}, allowed {vals:?}"
        );
        checked += 1;
    }
    assert!(checked > 100 && found > 20, "{checked} keys, {found} found");
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    assert!(child.wait().unwrap().success());
    let out = Command::new(BIN).arg("check").arg(&pool).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// A KV namespace made over JSON-RPC: a KV volume (`bdev_lvol_create` with
/// kind "kv"), served with on_full "fail", its counters from
/// `kvtarget_get_kv_namespaces`; bad parameters are refused naming the field.
/// Deleted again, its index's state is let go by the reactor that owned it.
#[test]
fn kv_namespaces_over_rpc_with_their_counters() {
    use serde_json::json;
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        r#"
[reactors]
count = 1

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
size = "256MiB"
extent_size = "1MiB"
"#,
        d = dir.path().display()
    );
    let server = support::server(&text);
    let mut c = support::rpc_client(&server);
    let e = c
        .call(
            "bdev_lvol_create",
            json!({"lvol_name": "c", "size_in_mib": 16, "lvs_name": "p", "kind": "kvs"}),
        )
        .unwrap_err();
    assert!(e.message.contains("kind"), "{}", e.message);
    c.call(
        "bdev_lvol_create",
        json!({"lvol_name": "c", "size_in_mib": 16, "lvs_name": "p", "kind": "kv"}),
    )
    .unwrap();
    c.call(
        "bdev_lvol_create",
        json!({"lvol_name": "b", "size_in_mib": 16, "lvs_name": "p"}),
    )
    .unwrap();
    c.call(
        "nvmf_create_subsystem",
        json!({"nqn": NQN, "allow_any_host": true}),
    )
    .unwrap();
    let e = c
        .call(
            "nvmf_subsystem_add_ns",
            json!({"nqn": NQN, "namespace": {"bdev_name": "p/c", "on_full": "maybe"}}),
        )
        .unwrap_err();
    assert!(e.message.contains("namespace.on_full"), "{}", e.message);
    let e = c
        .call(
            "nvmf_subsystem_add_ns",
            json!({"nqn": NQN, "namespace": {"bdev_name": "p/b", "on_full": "fail"}}),
        )
        .unwrap_err();
    assert!(e.message.contains("not a KV volume"), "{}", e.message);
    let e = c
        .call(
            "nvmf_subsystem_add_ns",
            json!({"nqn": NQN, "namespace": {"bdev_name": "p/b", "trim": false}}),
        )
        .unwrap_err();
    assert!(e.message.contains("namespace.trim"), "{}", e.message);
    let e = c
        .call(
            "nvmf_subsystem_add_ns",
            json!({"nqn": NQN, "namespace": {"bdev_name": "p/c", "trim": "no"}}),
        )
        .unwrap_err();
    assert!(e.message.contains("trim"), "{}", e.message);
    // A TTL beyond ten years is refused by name: it could not be saved again.
    let e = c
        .call(
            "nvmf_subsystem_add_ns",
            json!({"nqn": NQN, "namespace": {"bdev_name": "p/c", "ttl_secs": u64::MAX}}),
        )
        .unwrap_err();
    assert!(e.message.contains("namespace.ttl_secs"), "{}", e.message);
    c.call(
        "nvmf_subsystem_add_ns",
        json!({"nqn": NQN, "namespace": {"bdev_name": "p/c", "on_full": "fail", "ttl_secs": 3600, "trim": false}}),
    )
    .unwrap();
    let addr = server.listen_addrs()[0].0;
    c.call(
        "nvmf_subsystem_add_listener",
        json!({"nqn": NQN, "listen_address": {"trtype": "TCP", "adrfam": "IPv4", "traddr": addr.ip().to_string(), "trsvcid": addr.port().to_string()}}),
    )
    .unwrap();
    let (_h, mut qs) = connect(addr, 1);
    let q = &mut qs[0];
    q.kv_store(1, key("a"), value(1, 10_000), PLAIN).unwrap();
    assert_eq!(q.kv_retrieve(1, key("a"), 10_000).unwrap().1, 10_000);
    assert!(!q.kv_exist(1, key("b")).unwrap());
    let list = c.call("kvtarget_get_kv_namespaces", json!({})).unwrap();
    let n = &list[0];
    assert_eq!(n["name"], "p/c");
    assert_eq!(n["subsystem"], NQN);
    assert_eq!(n["nsid"], 1);
    assert_eq!(n["on_full"], "fail");
    assert_eq!(n["ttl_secs"], 3600);
    assert_eq!(n["trim"], false);
    assert_eq!(n["keys"], 1);
    assert_eq!(n["value_bytes"], 10_000);
    assert_eq!(n["used_bytes"], 12288);
    assert_eq!(n["stores"], 1);
    assert_eq!(n["hits"], 1);
    assert_eq!(n["misses"], 1);
    assert_eq!(n["max_keys"], 1024);
    let e = c
        .call("kvtarget_get_kv_namespaces", json!({"name": "p/b"}))
        .unwrap_err();
    assert!(e.message.contains("no KV namespace"), "{}", e.message);
    // The same counters on the metrics endpoint.
    let metrics = {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(server.metrics_addr().unwrap()).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    for line in [
        r#"kvtarget_kv_keys{pool="p",volume="c"} 1"#,
        r#"kvtarget_kv_hits_total{pool="p",volume="c"} 1"#,
        r#"kvtarget_kv_misses_total{pool="p",volume="c"} 1"#,
        r#"kvtarget_kv_value_bytes{pool="p",volume="c"} 10000"#,
    ] {
        assert!(metrics.contains(line), "{line} missing:\n{metrics}");
    }
    // The saved configuration keeps the volume's kind and the policy.
    let saved = c.call("kvtarget_save_config", json!({})).unwrap();
    let toml = saved["toml"].as_str().unwrap().to_string();
    assert!(toml.contains("kind = \"kv\""), "{toml}");
    assert!(toml.contains("on_full = \"fail\""), "{toml}");
    assert!(toml.contains("trim = false"), "{toml}");
    // The reactor that ran the commands owns the index; once the volume is
    // deleted it lets go of the index's state.
    let owned = |c: &mut kvtarget::rpc::RpcClient| -> u64 {
        let r = c.call("framework_get_reactors", json!({})).unwrap();
        let rs = r["reactors"].as_array().unwrap();
        rs.iter()
            .map(|x| x["kv_indexes_owned"].as_u64().unwrap())
            .sum()
    };
    assert_eq!(owned(&mut c), 1);
    drop(qs);
    drop(_h);
    c.call("nvmf_subsystem_remove_ns", json!({"nqn": NQN, "nsid": 1}))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while c.call("bdev_lvol_delete", json!({"name": "p/c"})).is_err() {
        assert!(Instant::now() < deadline, "the KV volume stayed busy");
        std::thread::sleep(Duration::from_millis(50));
    }
    while owned(&mut c) != 0 {
        assert!(
            Instant::now() < deadline,
            "the deleted volume's index is still owned"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    server.shutdown();
}

/// Runs `run` until `done` holds of its report, at most `PERF_UNTIL` long, and
/// returns the last report: a short perf run's I/O count depends on how busy the
/// machine is, a test's expectation on enough I/O having been done.
fn perf_until(
    mut run: impl FnMut() -> kvtarget::perf::PerfReport,
    done: impl Fn(&kvtarget::perf::PerfReport) -> bool,
) -> kvtarget::perf::PerfReport {
    // Long: on a CI machine whose disk is busy a commit's fsync took 12 s,
    // and a Store waiting for one completes in none of the short runs.
    const PERF_UNTIL: Duration = Duration::from_secs(120);
    let t0 = Instant::now();
    loop {
        let r = run();
        if done(&r) || t0.elapsed() > PERF_UNTIL {
            return r;
        }
    }
}

/// `kvtarget perf --kv` against a real KV namespace: Stores, verified
/// Retrieves, a Zipf mix with Deletes under eviction pressure (misses counted,
/// not errors), the keys it left found by the initiator, and bad options
/// refused by name.
#[test]
fn perf_drives_a_kv_namespace() {
    use kvtarget::perf::{run, PerfError, PerfOptions, Workload};
    let dir = tempfile::tempdir().expect("tempdir");
    let (_server, addr) = start(dir.path(), "8MiB", "");
    let opts = |workload, bs: usize, keys: Option<u64>| PerfOptions {
        nsid: 1,
        kv: true,
        kv_keys: keys,
        workload,
        block_size: bs,
        qd: 4,
        queues: 2,
        runtime: Duration::from_millis(400),
        warmup: Duration::from_millis(100),
        busy_poll: false,
        ..PerfOptions::new(addr, NQN)
    };
    // Stores of 64 KiB values over 64 keys (half the namespace).
    let r = perf_until(
        || run(&opts(Workload::RandWrite, 65536, Some(64))).expect("store run"),
        |r| r.ios > 0,
    );
    assert!(r.ios > 0 && r.errors == 0, "{}", r.to_text());
    assert_eq!(r.kv_keys, Some(64));
    assert!(
        r.to_json().contains("\"kv\":{\"keys\":64,"),
        "{}",
        r.to_json()
    );
    // A verified Retrieve run stores its keys first: every read checks out.
    let r = perf_until(
        || {
            run(&PerfOptions {
                verify: true,
                ..opts(Workload::RandRead, 65536, Some(64))
            })
            .expect("retrieve run")
        },
        |r| r.ios > 0,
    );
    assert!(
        r.ios > 0 && r.errors == 0 && r.mismatches == 0,
        "{}",
        r.to_text()
    );
    assert_eq!(r.misses, 0, "{}", r.to_text());
    assert!(r.verified > 0);
    // Exist of keys it stored first: every one is there, none an error.
    let r = perf_until(
        || {
            run(&PerfOptions {
                qd: 32,
                ..opts(Workload::Exist, 4096, Some(64))
            })
            .expect("exist run")
        },
        |r| r.ios > 0,
    );
    assert!(r.ios > 0 && r.errors == 0, "{}", r.to_text());
    assert_eq!(r.misses, 0, "{}", r.to_text());
    let e = run(&PerfOptions {
        kv: false,
        ..opts(Workload::Exist, 4096, None)
    })
    .unwrap_err();
    assert!(matches!(e, PerfError::NeedsKv("exist")), "{e}");
    // Four times the keys the namespace holds, Zipf popularity, some Deletes:
    // Stores evict, Retrieves of evicted or deleted keys miss, nothing fails
    // (runs go on until one misses: a loaded machine may store too few in one).
    let churn = || {
        run(&PerfOptions {
            zipf: 0.99,
            deallocate_pct: 10,
            verify: true,
            ..opts(Workload::RandRw, 65536, Some(512))
        })
        .expect("churn run")
    };
    let r = perf_until(churn, |r| r.misses > 0 || r.errors > 0 || r.mismatches > 0);
    assert!(
        r.ios > 0 && r.errors == 0 && r.mismatches == 0,
        "{}",
        r.to_text()
    );
    assert!(r.misses > 0, "{}", r.to_text());
    // The keys are the initiator's too: kvperf:: and the index big-endian.
    let (_c, mut qs) = connect(addr, 1);
    let listed = qs[0].kv_list(1, KvKey::default(), 4096).expect("list");
    assert!(!listed.is_empty());
    assert!(listed.iter().all(|k| k.as_bytes().starts_with(b"kvperf::")));
    // Bad options name what is wrong.
    let e = run(&opts(Workload::RandWrite, 64 << 20, None)).unwrap_err();
    assert!(matches!(e, PerfError::KvValueTooLarge { .. }), "{e}");
    assert!(e.to_string().contains("VML"), "{e}");
    let e = run(&opts(Workload::LmcacheStore, 65536, None)).unwrap_err();
    assert!(matches!(e, PerfError::KvWorkload(_)), "{e}");
    let e = run(&PerfOptions {
        nsid: 2,
        ..opts(Workload::RandRead, 4096, None)
    })
    .unwrap_err();
    assert!(e.to_string().contains("namespace 2"), "{e}");
}

/// `--workload list` pages through every key (bench/run-scale.sh times List
/// with it), and `--controllers` connects several hosts' worth of queues.
#[test]
fn perf_lists_every_key_and_drives_several_controllers() {
    use kvtarget::perf::{run, PerfError, PerfOptions, Workload};
    let dir = tempfile::tempdir().expect("tempdir");
    let (_server, addr) = start(dir.path(), "8MiB", "");
    let (_c, mut qs) = connect(addr, 1);
    for i in 0..100u64 {
        let k = KvKey::new(format!("scale-{i:04}").as_bytes()).expect("key");
        qs[0].kv_store(1, k, value(i, 512), PLAIN).expect("store");
    }
    let list = |bs: usize| PerfOptions {
        nsid: 1,
        kv: true,
        workload: Workload::List,
        block_size: bs,
        runtime: Duration::from_secs(20),
        ..PerfOptions::new(addr, NQN)
    };
    // A few keys per List: many pages, each key once.
    for bs in [64, 4096] {
        let r = run(&list(bs)).expect("list run");
        assert_eq!(r.listed, Some((100, true)), "{}", r.to_text());
        // 10-byte keys take 12 bytes: five a page, each page after the
        // first repeating its start key.
        let pages = if bs == 64 { 25 } else { 1 };
        assert!(r.ios >= pages, "{}", r.to_text());
        assert!(
            r.to_json()
                .contains("\"list\":{\"keys\":100,\"complete\":true}"),
            "{}",
            r.to_json()
        );
    }
    let e = run(&list(8)).unwrap_err();
    assert!(matches!(e, PerfError::ListBuffer), "{e}");
    let e = run(&PerfOptions {
        kv: false,
        ..list(4096)
    })
    .unwrap_err();
    assert!(matches!(e, PerfError::NeedsKv("list")), "{e}");
    // Three controllers of two queues each: all six carry Stores.
    let three = || {
        run(&PerfOptions {
            nsid: 1,
            kv: true,
            kv_keys: Some(64),
            workload: Workload::RandWrite,
            block_size: 4096,
            qd: 2,
            queues: 2,
            controllers: 3,
            runtime: Duration::from_millis(300),
            warmup: Duration::from_millis(50),
            busy_poll: false,
            ..PerfOptions::new(addr, NQN)
        })
        .expect("three controllers")
    };
    let r = perf_until(three, |r| r.ios > 0);
    assert!(r.ios > 0 && r.errors == 0, "{}", r.to_text());
    assert!(r.connect_s > 0.0 && r.connect_s < 10.0, "{}", r.to_text());
    // Idle: every queue connected, nothing sent.
    let r = run(&PerfOptions {
        nsid: 1,
        kv: true,
        kv_keys: Some(64),
        workload: Workload::RandWrite,
        queues: 4,
        controllers: 2,
        runtime: Duration::from_millis(200),
        warmup: Duration::ZERO,
        idle: true,
        ..PerfOptions::new(addr, NQN)
    })
    .expect("idle queues");
    assert_eq!((r.ios, r.errors), (0, 0), "{}", r.to_text());
    assert!(r.connect_s > 0.0, "{}", r.to_text());
}

/// KV-only options on a block namespace are refused at start-up, naming the
/// namespace and the options.
#[test]
fn kv_options_on_a_block_namespace_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    for opt in ["trim = false", "on_full = \"fail\"", "ttl_secs = 60"] {
        let text = config(dir.path(), 0, "8MiB", "") + opt + "\n";
        let cfg = Config::parse(&text).expect("config");
        let e = match Server::start(&cfg) {
            Ok(_) => panic!("{opt} accepted on a block namespace"),
            Err(e) => e.to_string(),
        };
        assert!(
            e.contains("namespaces[1]") && e.contains("trim") && e.contains("only to KV"),
            "{opt}: {e}"
        );
    }
}

/// A perf run whose commands fail says which and with what status: Stores
/// past the capacity of a namespace set to fail, each error line naming the
/// Store and Capacity Exceeded (CI had only "errors 2" to go on).
#[test]
fn perf_names_the_commands_that_failed() {
    use kvtarget::perf::{run, PerfOptions, Workload};
    let dir = tempfile::tempdir().expect("tempdir");
    let (_server, addr) = start(dir.path(), "8MiB", "on_full = \"fail\"");
    // 512 keys of 64 KiB: four times what 8 MiB holds. Stores go on until some
    // fail: a loaded machine may store fewer than the namespace holds in one
    // short run, and what a run stored stays for the next.
    let store_run = || {
        run(&PerfOptions {
            nsid: 1,
            kv: true,
            kv_keys: Some(512),
            workload: Workload::RandWrite,
            block_size: 65536,
            qd: 4,
            queues: 1,
            runtime: Duration::from_millis(400),
            warmup: Duration::ZERO,
            busy_poll: false,
            ..PerfOptions::new(addr, NQN)
        })
        .expect("store run")
    };
    let r = perf_until(store_run, |r| r.errors > 0);
    assert!(r.errors > 0, "{}", r.to_text());
    assert!(!r.error_details.is_empty(), "{}", r.to_text());
    let cap = Status::CAPACITY_EXCEEDED;
    let want = format!("(SCT {:#x} SC {:#04x})", cap.sct, cap.sc);
    for d in &r.error_details {
        assert!(d.starts_with("Store failed: ") && d.ends_with(&want), "{d}");
    }
    let text = r.to_text();
    assert!(text.contains("\n  error: Store failed: "), "{text}");
}

/// Space the keys gave up goes back to the pool: after Deletes and a Flush,
/// the namespace's extents are unmapped once they stay free a few seconds
/// (`TRIM_AFTER`), GC scrubs them (holes punched in the pool file), and the
/// namespace stores and retrieves values in that space again.
#[test]
fn freed_kv_space_goes_back_to_the_pool() {
    use serde_json::{json, Value};
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let text = format!(
        "[rpc]\nsocket = \"{d}/kv.sock\"\n{rest}",
        d = dir.path().display(),
        rest = config(dir.path(), 0, "64MiB", "")
    );
    let (server, addr) = support::start_server(&text);
    let mut c = support::rpc_client(&server);
    let mut ns = || -> Value {
        let v = c
            .call("kvtarget_get_kv_namespaces", json!({"name": "p/cache"}))
            .expect("kv namespaces");
        v[0].clone()
    };
    let file_bytes = || {
        std::fs::metadata(dir.path().join("pool.img"))
            .map(|m| m.blocks() * 512)
            .unwrap_or(0)
    };
    let (_h, mut qs) = connect(addr, 1);
    let q = &mut qs[0];
    let n = 40u64;
    let len = 700 << 10;
    for i in 0..n {
        q.kv_store(1, key(&format!("v{i}")), value(i, len), PLAIN)
            .expect("store");
    }
    q.flush(1).expect("flush");
    let full = ns();
    let allocated = full["allocated_bytes"].as_u64().unwrap_or(0);
    assert!(allocated >= n * len as u64, "{full}");
    let file_full = file_bytes();
    for i in 0..n {
        q.kv_delete(1, key(&format!("v{i}"))).expect("delete");
    }
    q.flush(1).expect("flush");
    // Unmapped after TRIM_AFTER; the deadline only bounds a hang.
    let deadline = Instant::now() + Duration::from_secs(60);
    let trimmed = loop {
        let s = ns();
        if s["allocated_bytes"] == 0 {
            break s;
        }
        assert!(Instant::now() < deadline, "never trimmed: {s}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        trimmed["trimmed_extents"].as_u64() >= Some((n * len as u64) >> 20),
        "{trimmed}"
    );
    assert_eq!(trimmed["keys"], 0);
    assert_eq!(
        trimmed["free_bytes"], trimmed["capacity_bytes"],
        "{trimmed}"
    );
    // GC scrubs the extents: the pool file gives the space back.
    loop {
        let freed = file_full.saturating_sub(file_bytes());
        if freed >= allocated - (2 << 20) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "pool file kept its blocks: {file_full} then {}",
            file_bytes()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The space serves new values, read back byte for byte.
    for i in 0..n {
        q.kv_store(1, key(&format!("w{i}")), value(1000 + i, len), PLAIN)
            .expect("store again");
    }
    for i in 0..n {
        let (got, size) = q
            .kv_retrieve(1, key(&format!("w{i}")), len as u32)
            .expect("retrieve");
        assert_eq!(size as usize, len);
        assert!(got == value(1000 + i, len), "value w{i}");
    }
    drop(qs);
    server.shutdown();
}

/// One reactor owns a KV namespace's index; queues on the other reactor send
/// it each index step and wait for the answer. Four queues over two reactors
/// store, read back, overwrite and delete their own keys at once, then read
/// every other queue's: every value is the one stored, and the reactors'
/// counters show the steps crossed (posted by one reactor, served by the other).
#[test]
fn queues_on_two_reactors_share_one_index_owner() {
    use serde_json::json;
    let dir = tempfile::tempdir().unwrap();
    let rpc = format!("\n[rpc]\nsocket = \"{}/kv.sock\"\n", dir.path().display());
    let (server, addr) = support::start_server(&(config(dir.path(), 0, "64MiB", "") + &rpc));
    let (_c, mut qs) = connect(addr, 4);
    const KEYS: u64 = 150;
    std::thread::scope(|s| {
        for (qi, q) in qs.iter_mut().enumerate() {
            s.spawn(move || {
                let qi = qi as u64;
                for k in 0..KEYS {
                    let name = key(&format!("q{qi}-{k}"));
                    let len = 512 + ((k * 977) % 20_000) as usize;
                    q.kv_store(1, name, value(qi * 1000 + k, len), PLAIN)
                        .unwrap();
                    let (got, size) = q.kv_retrieve(1, name, 32_768).unwrap();
                    assert_eq!(size as usize, len);
                    assert!(got == value(qi * 1000 + k, len), "q{qi} key {k}");
                    if k % 3 == 0 {
                        q.kv_store(1, name, value(qi * 1000 + k + 7, len), PLAIN)
                            .unwrap();
                    }
                    if k % 5 == 0 {
                        q.kv_delete(1, name).unwrap();
                        assert!(!q.kv_exist(1, name).unwrap());
                    }
                }
            });
        }
    });
    // Each queue reads every other queue's keys.
    let n = qs.len() as u64;
    for (qi, q) in qs.iter_mut().enumerate() {
        let other = (qi as u64 + 1) % n;
        for k in 0..KEYS {
            let name = key(&format!("q{other}-{k}"));
            let len = 512 + ((k * 977) % 20_000) as usize;
            if k % 5 == 0 {
                let e = q.kv_retrieve(1, name, 32_768).unwrap_err();
                assert_eq!(status_of(e), Status::KV_KEY_DOES_NOT_EXIST);
                continue;
            }
            let seed = other * 1000 + k + if k % 3 == 0 { 7 } else { 0 };
            let (got, _) = q.kv_retrieve(1, name, 32_768).unwrap();
            assert!(got == value(seed, len), "q{other} key {k} read on q{qi}");
        }
    }
    let listed = qs[0].kv_list(1, KvKey::default(), 65_536).unwrap();
    assert_eq!(listed.len() as u64, n * (KEYS - KEYS.div_ceil(5)));

    let mut c = support::rpc_client(&server);
    let r = c.call("framework_get_reactors", json!({})).unwrap();
    let reactors = r["reactors"].as_array().unwrap();
    let count = |f: &str| -> Vec<u64> { reactors.iter().map(|x| x[f].as_u64().unwrap()).collect() };
    let (posted, served) = (count("kv_asks_posted"), count("kv_asks_served"));
    assert_eq!(posted.len(), 2);
    // One owner: it serves and never posts; the other posts and never serves.
    let owner = if served[0] > 0 { 0 } else { 1 };
    assert!(served[owner] > KEYS, "{posted:?} {served:?}");
    assert_eq!(
        (posted[owner], served[1 - owner]),
        (0, 0),
        "{posted:?} {served:?}"
    );
    assert_eq!(posted[1 - owner], served[owner], "every posted step served");
    drop(qs);
    server.shutdown();
}
