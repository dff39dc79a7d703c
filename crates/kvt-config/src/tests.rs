use super::*;

const GOOD: &str = r#"
[reactors]
count = 1
idle = "adaptive"

[discovery]
port = 8009

[[listeners]]
address = "127.0.0.1"
port = 4420

[[subsystems]]
nqn = "nqn.2026-11.io.kvtarget:kv0"
allow_any_host = true

[[subsystems.namespaces]]
nsid = 1
backend = "uring"
path = "/tmp/x.img"
size = "1GiB"
block_size = 4096
"#;

#[test]
fn default_config_file_parses() {
    let text = include_str!("../../../config/default.toml");
    let c = Config::parse(text).unwrap();
    assert_eq!(c.listeners[0].port, 4420);
    assert_eq!(c.discovery.port, Some(8009));
}

#[test]
fn every_example_config_parses() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../config");
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "toml") {
            match Config::load(&p) {
                Ok(_) => {}
                // The spdk examples need an SPDK build; without one they say so.
                Err(e) if !kvt_bdev::spdk::AVAILABLE && e.to_string().contains(".backend: the spdk backend needs kvtarget built with `--features spdk`") => {}
                Err(e) => panic!("{e}"),
            }
        }
    }
}

#[test]
fn good_config() {
    let c = Config::parse(GOOD).unwrap();
    assert_eq!(c.subsystems[0].namespaces[0].size, Some(1 << 30));
    assert_eq!(c.tcp.max_io_size, 1 << 20);
}

#[test]
fn tls_example_and_secure_channel_rules() {
    let c = Config::parse(include_str!("../../../config/tls.toml")).unwrap();
    assert!(c.listeners[0].secure_channel && !c.listeners[1].secure_channel);
    assert_eq!(c.secure_listen_addrs().unwrap().len(), 1);
    assert_eq!(c.subsystems[0].hosts[0].psk(), Some("host-a-psk"));
    let t = include_str!("../../../config/tls.toml");
    let e = err(&t.replace("psk = \"host-a-psk\"", "psk = \"nope\""));
    assert!(
        e.contains("subsystems[0].hosts[0].psk: no key `nope`"),
        "{e}"
    );
    let e = err(&format!(
        "{t}\n[[listeners]]\naddress = \"127.0.0.1\"\ntransport = \"rdma\"\nsecure_channel = true\n"
    ));
    assert!(e.contains("listeners[2].secure_channel"), "{e}");
}

fn err(text: &str) -> String {
    let e = Config::parse(text).unwrap_err().to_string();
    assert!(!e.contains('\n'), "one line: {e}");
    e
}

#[test]
fn errors_name_the_field() {
    assert!(err(&GOOD.replace("4096\n", "1000\n")).contains("namespaces[0].block_size"));
    assert!(err(&GOOD.replace("\"1GiB\"", "\"1 parsec\"")).contains("unknown unit"));
    assert!(err(&GOOD.replace("nqn.2026-11.io.kvtarget:kv0", "kv0")).contains("subsystems[0].nqn"));
    assert!(err(&GOOD.replace("127.0.0.1", "localhost-ish")).contains("listeners[0].address"));
    // An RDMA listener beside the TCP one, on the same address and port.
    let both = format!("{GOOD}\n[[listeners]]\naddress = \"127.0.0.1\"\ntransport = \"rdma\"\n");
    let c = Config::parse(&both).unwrap();
    assert_eq!(c.rdma_listen_addrs().unwrap().len(), 1);
    assert_eq!(c.listen_addrs().unwrap().len(), 1);
    assert!(err(&format!("{GOOD}\n[rdma]\nbuffer_pool_size = 4096\n"))
        .contains("rdma.buffer_pool_size"));
    assert!(err(&format!("{GOOD}\n[rdma]\nmax_outstanding_reads = 0\n"))
        .contains("rdma.max_outstanding_reads"));
    assert!(
        err(&format!("{GOOD}\n[rdma]\nmax_qpairs_per_reactor = 0\n"))
            .contains("rdma.max_qpairs_per_reactor")
    );
    let e = err(&format!(
        "{GOOD}\n[[listeners]]\naddress = \"127.0.0.1\"\ntransport = \"iwarp\"\n"
    ));
    assert!(e.contains("iwarp"), "{e}");
    assert!(err(&GOOD.replace("\"uring\"", "\"floppy\"")).contains("floppy"));
    assert!(err(&GOOD.replace("idle", "idel")).contains("idel"));
    assert!(err(&GOOD.replace("path = \"/tmp/x.img\"\n", "")).contains("namespaces[0].path"));
    assert!(err(&GOOD.replace("port = 8009", "port = 4420")).contains("discovery.port"));
    assert!(err(&GOOD.replace("nsid = 1", "nsid = 0")).contains("nsid"));
    let e = err(&GOOD.replace("count = 1", "count = \"one\""));
    assert!(e.starts_with("line 3"), "{e}");
    let e = err(&GOOD.replace("count = 1", "count = 1\nstall_warn_us = 0"));
    assert!(e.contains("reactors.stall_warn_us"), "{e}");
    assert!(Config::parse(&GOOD.replace("count = 1", "count = 1\nstall_warn_us = 2000")).is_ok());
    let e = err(&GOOD.replace("nsid = 1", "nsid = 1\nttl_secs = 999999999999"));
    assert!(e.contains("namespaces[0].ttl_secs"), "{e}");
    let e = err(&GOOD.replace("\"1GiB\"", "\"12222222222222228KiB\""));
    assert!(e.contains("too large"), "{e}");
}

#[test]
fn spdk_backend_fields() {
    let tcp =
        "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:4430 subnqn:nqn.2016-06.io.spdk:cnode1";
    let spdk = GOOD.replace(
        "backend = \"uring\"\npath = \"/tmp/x.img\"\nsize = \"1GiB\"\nblock_size = 4096\n",
        &format!("backend = \"spdk\"\ntrid = \"{tcp}\"\nnvme_nsid = 1\n"),
    );
    if kvt_bdev::spdk::AVAILABLE {
        Config::parse(&spdk).unwrap();
    } else {
        // Configured on a build without SPDK: one line naming the field.
        let e = err(&spdk);
        assert!(
            e.starts_with("subsystems[0].namespaces[0].backend: the spdk backend needs kvtarget built with `--features spdk`"),
            "{e}"
        );
    }
    let e = err(&spdk.replace(&format!("trid = \"{tcp}\"\n"), ""));
    assert!(
        e.contains("namespaces[0].trid: required for the spdk backend"),
        "{e}"
    );
    let e = err(&spdk.replace("trsvcid:4430 ", ""));
    assert!(
        e.contains("namespaces[0].trid: trsvcid (the port) is missing"),
        "{e}"
    );
    let e = err(&spdk.replace("trid = ", "path = \"/x\"\ntrid = "));
    assert!(
        e.contains("namespaces[0]: the spdk backend takes no path"),
        "{e}"
    );
    let e = err(&GOOD.replace(
        "block_size = 4096\n",
        &format!("block_size = 4096\ntrid = \"{tcp}\"\n"),
    ));
    assert!(
        e.contains("namespaces[0].trid: only applies to the spdk backend"),
        "{e}"
    );
    // Two pools on one SPDK namespace would overwrite each other.
    let pool = format!("[[pools]]\nname = \"a\"\nbackend = \"spdk\"\ntrid = \"{tcp}\"\n\n");
    let e = err(&format!("{pool}{}{GOOD}", pool.replace("\"a\"", "\"b\"")));
    if kvt_bdev::spdk::AVAILABLE {
        assert!(
            e.contains("pools[1].trid: also the namespace of pool `a`"),
            "{e}"
        );
    } else {
        assert!(
            e.contains("pools[0].backend: the spdk backend needs"),
            "{e}"
        );
    }
    let e = err(&format!(
        "[spdk]\nno_huge = true\nhugedir = \"/dev/hugepages\"\n{GOOD}"
    ));
    assert!(e.starts_with("spdk.hugedir:"), "{e}");
    let e = err(&format!("[spdk]\nmem_size = \"1MiB\"\n{GOOD}"));
    assert!(e.contains("spdk.mem_size"), "{e}");
    let cfg = Config::parse(&format!(
        "[spdk]\nno_huge = true\nmem_size = \"2GiB\"\n{GOOD}"
    ))
    .unwrap();
    assert_eq!(cfg.spdk_env().mem_size_mib, Some(2048));
    assert!(!cfg.spdk_env().pci);
}

#[test]
fn nvme_backend_fields() {
    let nvme = GOOD.replace(
        "backend = \"uring\"\npath = \"/tmp/x.img\"\nsize = \"1GiB\"\nblock_size = 4096\n",
        "backend = \"nvme\"\npci = \"0000:00:10.0\"\n",
    );
    Config::parse(&nvme).unwrap();
    Config::parse(&nvme.replace("pci = ", "nvme_nsid = 2\npci = ")).unwrap();
    let e = err(&nvme.replace("pci = \"0000:00:10.0\"\n", ""));
    assert!(e.contains("namespaces[0].pci: required"), "{e}");
    let e = err(&nvme.replace("0000:00:10.0", "00:10.0"));
    assert!(
        e.contains("namespaces[0].pci") && e.contains("00:10.0"),
        "{e}"
    );
    let e = err(&nvme.replace("pci = ", "nvme_nsid = 0\npci = "));
    assert!(e.contains("namespaces[0].nvme_nsid"), "{e}");
    let e = err(&nvme.replace("pci = ", "path = \"/x\"\npci = "));
    assert!(
        e.contains("namespaces[0]: the nvme backend takes no path"),
        "{e}"
    );
    let e = err(&GOOD.replace(
        "block_size = 4096\n",
        "block_size = 4096\npci = \"0000:00:10.0\"\n",
    ));
    assert!(
        e.contains("namespaces[0].pci: `pci` only applies to the nvme backend"),
        "{e}"
    );
    let e = err(&GOOD.replace("block_size = 4096\n", "block_size = 4096\nnvme_nsid = 2\n"));
    assert!(
        e.contains("namespaces[0].nvme_nsid: only applies to the nvme and spdk"),
        "{e}"
    );
    let pools = "[[pools]]\nname = \"a\"\nbackend = \"nvme\"\npci = \"0000:00:10.0\"\n\n[[pools]]\nname = \"b\"\nbackend = \"nvme\"\npci = \"0000:00:10.0\"\nnvme_nsid = 1\n";
    let e = err(&format!("{pools}{GOOD}"));
    assert!(
        e.contains("pools[1].pci: also the namespace of pool `a`"),
        "{e}"
    );
    Config::parse(&format!(
        "{}{GOOD}",
        pools.replace("nvme_nsid = 1", "nvme_nsid = 2")
    ))
    .unwrap();
}

/// A RAM pool of `size` with `extent` extents, its volume served as nsid 1.
fn pool_config(size: &str, extent: &str) -> String {
    format!(
        "[[pools]]\nname = \"kv\"\nbackend = \"ram\"\nsize = {size}\nextent_size = {extent}\n\n[[pools.volumes]]\nname = \"v\"\nsize = \"1GiB\"\n{GOOD}"
    )
}

fn field_of(text: &str) -> String {
    let e = Config::parse(text).unwrap_err();
    assert!(!e.to_string().contains('\n'), "one line: {e}");
    e.field()
        .map(str::to_string)
        .unwrap_or_else(|| e.to_string())
}

#[test]
fn active_r2ts_are_bounded_and_named() {
    let with = |v: &str| format!("[tcp]\nmax_active_r2ts = {v}\n{GOOD}");
    assert_eq!(Config::parse(GOOD).unwrap().tcp.max_active_r2ts, 8);
    assert_eq!(Config::parse(&with("2")).unwrap().tcp.max_active_r2ts, 2);
    for bad in ["0", "257"] {
        assert_eq!(field_of(&with(bad)), "tcp.max_active_r2ts", "{bad}");
    }
}

#[test]
fn c2h_data_pdus_are_bounded_and_named() {
    let with = |v: &str| format!("[tcp]\nmax_c2h_data = {v}\n{GOOD}");
    assert_eq!(Config::parse(GOOD).unwrap().tcp.max_c2h_data, 512 << 10);
    let c = Config::parse(&with("\"1MiB\"")).unwrap();
    assert_eq!(c.tcp.max_c2h_data, 1 << 20);
    for bad in ["\"2KiB\"", "\"32MiB\"", "4098"] {
        assert_eq!(field_of(&with(bad)), "tcp.max_c2h_data", "{bad}");
    }
}

#[test]
fn socket_buffers_are_auto_or_bounded() {
    let with = |k: &str, v: &str| format!("[tcp]\n{k} = {v}\n{GOOD}");
    let c = Config::parse(GOOD).unwrap();
    assert_eq!((c.tcp.recv_buf_size, c.tcp.send_buf_size), (0, 0));
    let c = Config::parse(&with("recv_buf_size", "\"2MiB\"")).unwrap();
    assert_eq!(c.tcp.recv_buf_size, 2 << 20);
    for k in ["recv_buf_size", "send_buf_size"] {
        for bad in ["1024", "\"512MiB\""] {
            assert_eq!(field_of(&with(k, bad)), format!("tcp.{k}"), "{k} = {bad}");
        }
    }
}

#[test]
fn commit_interval_is_bounded_and_named() {
    let with = |v: &str| {
        pool_config("\"64MiB\"", "\"1MiB\"").replacen(
            "extent_size",
            &format!("commit_interval_ms = {v}\nextent_size"),
            1,
        )
    };
    let c = Config::parse(&with("250")).unwrap();
    assert_eq!(c.pools[0].commit_interval_ms, 250);
    let c = Config::parse(&pool_config("\"64MiB\"", "\"1MiB\"")).unwrap();
    assert_eq!(c.pools[0].commit_interval_ms, 1000);
    for bad in ["0", "60001"] {
        assert_eq!(field_of(&with(bad)), "pools[0].commit_interval_ms", "{bad}");
    }
    // Not a number: serde's own message, still one line naming the key.
    let e = Config::parse(&with("\"1s\"")).unwrap_err().to_string();
    assert!(e.contains("commit_interval_ms"), "{e}");
}

#[test]
fn pool_sizes_follow_the_pool_layout() {
    use kvt_pool::format::{min_device_size, Superblock};
    for extent in [64u64 << 10, 1 << 20, 64 << 20] {
        let min = min_device_size(extent).unwrap();
        // The smallest size the format accepts, and nothing below it.
        assert!(Superblock::layout(min, extent, [0; 16], None).is_ok());
        assert!(Superblock::layout(min - 4096, extent, [0; 16], None).is_err());
        Config::parse(&pool_config(&min.to_string(), &extent.to_string())).unwrap();
        let below = pool_config(&(min - 4096).to_string(), &extent.to_string());
        let f = field_of(&below);
        assert!(f == "pools[0].size" || f == "pools[0].extent_size", "{f}");
    }
    assert_eq!(field_of(&pool_config("0", "\"1MiB\"")), "pools[0].size");
    assert_eq!(field_of(&pool_config("4096", "\"1MiB\"")), "pools[0].size");
    // 32 MiB holds a pool of 1 MiB extents, not of 64 MiB ones.
    assert_eq!(
        field_of(&pool_config("\"32MiB\"", "\"64MiB\"")),
        "pools[0].extent_size"
    );
    assert_eq!(
        field_of(&pool_config("\"1GiB\"", "\"3MiB\"")),
        "pools[0].extent_size"
    );
    assert_eq!(
        field_of(&pool_config("\"1GiB\"", "\"128MiB\"")),
        "pools[0].extent_size"
    );
    assert!(min_device_size(3 << 20).is_err());
}

#[test]
fn volume_and_reference_errors_name_the_field() {
    let base = pool_config("\"1GiB\"", "\"1MiB\"");
    Config::parse(&base).unwrap();
    let vol = |with: &str| base.replace("name = \"v\"\nsize = \"1GiB\"\n", with);
    assert_eq!(
        field_of(&vol("name = \"v\"\nsize = 0\n")),
        "pools[0].volumes[0].size"
    );
    assert_eq!(
        field_of(&vol("name = \"v\"\nsize = \"1GiB\"\nblock_size = 2048\n")),
        "pools[0].volumes[0].block_size"
    );
    // More logical extents than a volume's map holds.
    assert_eq!(
        field_of(&vol("name = \"v\"\nsize = \"2048TiB\"\n")),
        "pools[0].volumes[0].size"
    );
    let served = base.replace(
        "backend = \"uring\"\npath = \"/tmp/x.img\"\nsize = \"1GiB\"\nblock_size = 4096\n",
        "volume = \"kv/nope\"\n",
    );
    assert_eq!(field_of(&served), "subsystems[0].namespaces[0].volume");
    assert_eq!(
        field_of(&served.replace("kv/nope", "other/v")),
        "subsystems[0].namespaces[0].volume"
    );
    let two = format!("{base}\n[[pools]]\nname = \"kv\"\nbackend = \"ram\"\nsize = \"1GiB\"\n");
    assert_eq!(field_of(&two), "pools[1].name");
}

#[test]
fn type_errors_name_the_key() {
    let e = err(&GOOD.replace("port = 4420", "port = 70000"));
    assert!(e.contains("listeners[0].port: "), "{e}");
    let e = err(&GOOD.replace("nsid = 1", "nsid = -1"));
    assert!(e.contains("subsystems[0].namespaces[0].nsid: "), "{e}");
    let e = err(&GOOD.replace("port = 8009", "port = \"x\""));
    assert!(e.contains("discovery.port: "), "{e}");
    let e = err(&format!("{GOOD}\n[[subsystems]]\nnqn = \"nqn.2026-11.x:b\"\n[[subsystems.namespaces]]\nnsid = 1\n[[subsystems.namespaces]]\nnsid = true\n"));
    assert!(e.contains("subsystems[1].namespaces[1].nsid: "), "{e}");
}

#[test]
fn sizes() {
    assert_eq!(parse_size("4096"), Ok(4096));
    assert_eq!(parse_size("x"), Err(SizeError::NotASize("x".into())));
    assert_eq!(parse_size("64KiB"), Ok(65536));
    assert_eq!(parse_size("2G"), Ok(2 << 30));
    assert!(parse_size("").is_err());
    assert!(parse_size("99999999999TiB").is_err());
    // Fits a u64 but not a TOML integer: it could never be saved again.
    assert_eq!(
        parse_size("12222222222222228KiB"),
        Err(SizeError::TooLarge("12222222222222228KiB".into()))
    );
    assert_eq!(parse_size("8388607TiB"), Ok(8388607 << 40));
}

mod ops {
    use super::*;
    use crate::ops::Op;
    use proptest::prelude::*;

    /// Loaded, turned into operations, rebuilt from them, saved and loaded
    /// again: the same operations. Also through the operations' JSON form.
    fn round_trip(c: &Config) {
        let ops = c.ops();
        let json = serde_json::to_string(&ops).unwrap();
        let back: Vec<Op> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, ops, "{json}");
        let rebuilt = c.with_ops(&ops).unwrap();
        let text = rebuilt.to_toml().unwrap();
        let again = Config::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(again.ops(), ops, "{text}");
    }

    /// `cluster_wide` lives only in config: what is saved must keep it, or a
    /// restart from a saved config would serve the subsystem alone.
    #[test]
    fn a_cluster_wide_subsystem_stays_cluster_wide_through_ops() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../config/cluster.toml");
        let c = Config::load(std::path::Path::new(dir)).unwrap();
        assert!(c.subsystems.iter().any(|s| s.cluster_wide));
        round_trip(&c);
        let rebuilt = c.with_ops(&c.ops()).unwrap();
        let wide =
            |c: &Config| -> Vec<bool> { c.subsystems.iter().map(|s| s.cluster_wide).collect() };
        assert_eq!(wide(&rebuilt), wide(&c));
    }

    #[test]
    fn example_configs_round_trip_through_ops() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../config");
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "toml") {
                // The spdk examples need an SPDK build (every_example_config_parses).
                if let Ok(c) = Config::load(&p) {
                    round_trip(&c);
                }
            }
        }
    }

    #[test]
    fn ops_refuse_what_they_do_not_name() {
        let c = Config::parse(GOOD).unwrap();
        let mut ops = c.ops();
        let Some(Op::AddNamespace(n)) = ops.last_mut() else {
            panic!("{ops:?}");
        };
        n.nqn = "nqn.2026-11.io.kvtarget:none".into();
        assert!(c.with_ops(&ops).is_err());
        let bad = r#"[{"method": "nvmf_create_subsystem", "params": {"nqn": "n", "serial_number": "s", "model_number": "m", "bogus": 1}}]"#;
        let e = serde_json::from_str::<Vec<Op>>(bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`bogus`"), "{e}");
    }

    /// A valid configuration of ram pools with volumes, keys, and subsystems
    /// whose hosts, listen lists and namespaces vary.
    fn config() -> impl Strategy<Value = Config> {
        let volumes = prop::collection::vec((1u64..16, any::<bool>(), any::<bool>()), 0..4);
        let pools = prop::collection::vec(volumes, 0..3);
        let hosts = prop::collection::vec((0usize..4, any::<bool>()), 0..3);
        let listen = prop::option::of(prop::collection::vec(1u16..1000, 0..3));
        let subsystem = (any::<bool>(), hosts, listen, 0usize..3, 0usize..3);
        let subsystems = prop::collection::vec(subsystem, 0..3);
        (pools, 0usize..3, subsystems)
            .prop_map(|(pools, nkeys, subsystems)| build(&pools, nkeys, &subsystems))
    }

    type SubsystemShape = (bool, Vec<(usize, bool)>, Option<Vec<u16>>, usize, usize);

    fn build(pools: &[Vec<(u64, bool, bool)>], nkeys: usize, subs: &[SubsystemShape]) -> Config {
        let mut text = String::from("[[listeners]]\naddress = \"127.0.0.1\"\nport = 4420\n");
        for k in 0..nkeys {
            text += &format!("[[keys]]\nname = \"k{k}\"\npath = \"/tmp/k{k}\"\n");
        }
        let mut free: Vec<String> = Vec::new();
        for (i, vols) in pools.iter().enumerate() {
            text += &format!("[[pools]]\nname = \"p{i}\"\nbackend = \"ram\"\nsize = \"64MiB\"\n");
            for (j, &(mib, kv, error)) in vols.iter().enumerate() {
                let kind = if kv { "kind = \"kv\"\n" } else { "" };
                let unwritten = if error { "error" } else { "zeroes" };
                text += &format!("[[pools.volumes]]\nname = \"v{j}\"\nsize = \"{mib}MiB\"\nunwritten = \"{unwritten}\"\n{kind}");
                free.push(format!("p{i}/v{j}"));
            }
        }
        for (i, (any_host, hosts, listen, nvols, nram)) in subs.iter().enumerate() {
            text += &format!(
                "[[subsystems]]\nnqn = \"nqn.2026-11.io.test:s{i}\"\nallow_any_host = {any_host}\n"
            );
            if let Some(ports) = listen {
                let list: Vec<String> = ports
                    .iter()
                    .map(|p| format!("\"127.0.0.1:{}\"", 5000 + i as u16 * 1000 + p))
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .collect();
                text += &format!("listen = [{}]\n", list.join(", "));
            }
            let mut seen = Vec::new();
            let entries: Vec<String> = hosts
                .iter()
                .filter(|(h, _)| {
                    let new = !seen.contains(h);
                    seen.push(*h);
                    new
                })
                .map(|&(h, keyed)| {
                    let nqn = format!("nqn.2026-11.io.test:h{h}");
                    if keyed && nkeys > 0 {
                        format!("{{ nqn = \"{nqn}\", dhchap_key = \"k{}\" }}", h % nkeys)
                    } else {
                        format!("\"{nqn}\"")
                    }
                })
                .collect();
            text += &format!("hosts = [{}]\n", entries.join(", "));
            let mut nsid = 0;
            for _ in 0..*nvols {
                let Some(v) = free.pop() else { break };
                nsid += 1;
                text += &format!("[[subsystems.namespaces]]\nnsid = {nsid}\nvolume = \"{v}\"\n");
            }
            for _ in 0..*nram {
                nsid += 1;
                text += &format!("[[subsystems.namespaces]]\nnsid = {nsid}\nbackend = \"ram\"\nsize = \"1MiB\"\nwrite_cache = false\n");
            }
        }
        Config::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
    }

    proptest! {
        #[test]
        fn a_config_saved_and_loaded_gives_the_same_ops(c in config()) {
            round_trip(&c);
        }
    }
}
