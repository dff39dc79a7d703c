//! The command line a user meets: every subcommand answers --help, usage errors
//! keep their exit codes, and `check-config` catches every configuration error
//! with one line naming the field (exit 2) before anything opens a device.

use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_kvtarget");

fn run(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("run kvtarget")
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr)
}

#[test]
fn every_subcommand_answers_help() {
    for args in [
        &[][..],
        &["check-config"],
        &["check"],
        &["rpc"],
        &["perf"],
        &["nvme"],
        &["nvme", "list"],
        &["nvme", "bind"],
        &["nvme", "unbind"],
        &["pool"],
        &["pool", "create"],
        &["pool", "info"],
        &["volume"],
        &["volume", "list"],
        &["volume", "create"],
        &["volume", "resize"],
        &["volume", "delete"],
        &["cluster"],
        &["cluster", "status"],
    ] {
        for help in ["--help", "-h"] {
            let a: Vec<&str> = args.iter().copied().chain([help]).collect();
            let o = run(&a);
            assert_eq!(o.status.code(), Some(0), "{a:?}: {}", text(&o));
            let out = String::from_utf8_lossy(&o.stdout);
            assert!(out.contains("Usage: kvtarget"), "{a:?}: {out}");
        }
    }
    let o = run(&["--version"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("kvtarget "));
}

#[test]
fn usage_errors_keep_their_exit_codes() {
    for (args, code) in [
        (&[][..], 2), // --config is required
        (&["frobnicate"], 2),
        (&["--frobnicate"], 2),
        (&["--config"], 2),
        (&["check"], 2),
        (&["check", "a", "b"], 2),
        (&["check-config"], 2),
        (&["rpc"], 2),
        (&["perf"], 2), // --addr and --nqn are required
        (
            &[
                "perf",
                "--addr",
                "127.0.0.1:1",
                "--nqn",
                "nqn.x:y",
                "--qd",
                "0",
            ],
            2,
        ),
        (&["perf", "--echo-baseline", "--bogus"], 2),
        (&["perf", "--echo-baseline", "--workload", "sideways"], 2),
        // pool, volume and nvme have always failed with 1, usage errors included.
        (&["pool"], 1),
        (&["pool", "create"], 1),
        (&["pool", "frob", "x"], 1),
        (&["volume", "frob"], 1),
        (&["volume", "create", "/nonexistent", "v"], 1), // --size is required
        (
            &["volume", "create", "/x", "v", "--size", "1MiB", "--bogus"],
            1,
        ),
        (&["nvme"], 1),
        (&["nvme", "bind"], 1),
        (&["nvme", "bind", "not-a-pci-address"], 1),
    ] {
        let o = run(args);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {}", text(&o));
        assert!(!o.stderr.is_empty(), "{args:?}: says nothing");
    }
    // `check` on something that is not there is unusable, not damaged.
    assert_eq!(run(&["check", "/nonexistent/pool"]).status.code(), Some(2));
}

#[test]
fn good_configs_pass_check_config() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/config");
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if !p.extension().is_some_and(|x| x == "toml") {
            continue;
        }
        let o = run(&["check-config", p.to_str().unwrap()]);
        let t = text(&o);
        // The spdk examples need a build with SPDK; without one they say so.
        if t.contains("needs kvtarget built with `--features spdk`") {
            assert_eq!(o.status.code(), Some(2), "{t}");
            continue;
        }
        assert_eq!(o.status.code(), Some(0), "{}: {t}", p.display());
        assert!(t.ends_with(": ok\n"), "{t}");
        n += 1;
    }
    assert!(n >= 4, "only {n} example configs checked");
}

const BASE: &str = r#"
[[listeners]]
address = "127.0.0.1"
port = 4420

[[pools]]
name = "kv"
backend = "ram"
size = "1GiB"

[[pools.volumes]]
name = "v"
size = "1GiB"

[[subsystems]]
nqn = "nqn.2026-11.io.kvtarget:t"
allow_any_host = true

[[subsystems.namespaces]]
nsid = 1
volume = "kv/v"
"#;

/// `check-config` on `BASE` with one change: exit 2, one line, the field named.
fn rejects(config: &str, field: &str) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.toml");
    std::fs::write(&p, config).unwrap();
    let o = run(&["check-config", p.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{field}: {}", text(&o));
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "{field}: one line: {err}"
    );
    assert!(err.contains(&format!("{field}:")), "wanted {field}: {err}");
    assert!(o.stdout.is_empty(), "{field}: {}", text(&o));
}

#[test]
fn check_config_catches_every_configuration_error() {
    let good = {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("good.toml");
        std::fs::write(&p, BASE).unwrap();
        run(&["check-config", p.to_str().unwrap()])
    };
    assert_eq!(good.status.code(), Some(0), "{}", text(&good));
    let pool_size = |s: &str| BASE.replacen("size = \"1GiB\"", &format!("size = {s}"), 1);
    rejects(&pool_size("0"), "pools[0].size");
    rejects(&pool_size("4096"), "pools[0].size");
    rejects(&pool_size("\"4MiB\""), "pools[0].size"); // the journal alone is 4 MiB
    rejects(
        &BASE
            .replace(
                "backend = \"ram\"",
                "backend = \"ram\"\nextent_size = \"64MiB\"",
            )
            .replacen("size = \"1GiB\"", "size = \"32MiB\"", 1),
        "pools[0].extent_size",
    );
    rejects(
        &BASE.replace(
            "backend = \"ram\"",
            "backend = \"ram\"\nextent_size = \"3MiB\"",
        ),
        "pools[0].extent_size",
    );
    rejects(
        &BASE.replace("backend = \"ram\"", "backend = \"ram\"\nextent_size = 1000"),
        "pools[0].extent_size",
    );
    rejects(
        &BASE.replace("name = \"v\"\nsize = \"1GiB\"", "name = \"v\"\nsize = 0"),
        "pools[0].volumes[0].size",
    );
    rejects(
        &BASE.replace(
            "name = \"v\"\nsize = \"1GiB\"",
            "name = \"v\"\nsize = \"1GiB\"\nblock_size = 1024",
        ),
        "pools[0].volumes[0].block_size",
    );
    rejects(
        &BASE.replace("volume = \"kv/v\"", "volume = \"nopool/v\""),
        "subsystems[0].namespaces[0].volume",
    );
    rejects(
        &BASE.replace("volume = \"kv/v\"", "volume = \"kv/novol\""),
        "subsystems[0].namespaces[0].volume",
    );
    rejects(
        &BASE.replace("nsid = 1", "nsid = 0"),
        "subsystems[0].namespaces[0].nsid",
    );
    rejects(
        &format!(
            "{BASE}\n[[subsystems.namespaces]]\nnsid = 1\nbackend = \"ram\"\nsize = \"1MiB\"\n"
        ),
        "subsystems[0].namespaces[1].nsid",
    );
    rejects(
        &format!("{BASE}\n[[subsystems]]\nnqn = \"nqn.2026-11.io.kvtarget:t\"\n"),
        "subsystems[1].nqn",
    );
    rejects(
        &format!("{BASE}\n[[pools]]\nname = \"kv\"\nbackend = \"ram\"\nsize = \"1GiB\"\n"),
        "pools[1].name",
    );
    rejects(
        &BASE.replace("[[pools.volumes]]\nname = \"v\"\nsize = \"1GiB\"\n", "[[pools.volumes]]\nname = \"v\"\nsize = \"1GiB\"\n\n[[pools.volumes]]\nname = \"v\"\nsize = \"1GiB\"\n"),
        "pools[0].volumes[1].name",
    );
    rejects(
        &BASE.replace("\"127.0.0.1\"", "\"127.0.0.300\""),
        "listeners[0].address",
    );
    rejects(
        &BASE.replace("port = 4420", "port = 70000"),
        "listeners[0].port",
    );
    rejects(
        &BASE.replace("port = 4420", "port = -1"),
        "listeners[0].port",
    );
    rejects(
        &BASE.replace("nsid = 1\n", "nsid = 1\nblock_size = 4096\n"),
        "subsystems[0].namespaces[0].volume",
    );
    rejects(
        &BASE.replace(
            "allow_any_host = true",
            "allow_any_host = true\nlisten = [\"127.0.0.1\"]",
        ),
        "subsystems[0].listen[0]",
    );
    rejects(
        &format!("[metrics]\naddress = \"nowhere\"\n{BASE}"),
        "metrics.address",
    );
    rejects(
        &BASE.replace("nsid = 1", "nsid = \"one\""),
        "subsystems[0].namespaces[0].nsid",
    );
}

/// At start, a configuration error stops the target before anything opens a
/// device: no pool file appears.
#[test]
fn start_refuses_a_bad_config_before_opening_anything() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("pool.img");
    let cfg = BASE
        .replace(
            "backend = \"ram\"",
            &format!("backend = \"uring\"\npath = \"{}\"", pool.display()),
        )
        .replacen("size = \"1GiB\"", "size = 0", 1);
    let p = dir.path().join("bad.toml");
    std::fs::write(&p, cfg).unwrap();
    let o = run(&["--config", p.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("pools[0].size:"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(!pool.exists(), "the pool file was created");
}

/// A pool formatted with `--max-volumes N` holds N volumes, says so in
/// `pool info`, and refuses one more with the limit named; a limit out of
/// range is a usage error naming the flag.
#[test]
fn pool_create_max_volumes_bounds_the_volumes() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("pool.img");
    let p = pool.to_str().unwrap();
    let o = run(&["pool", "create", p, "--size", "64MiB", "--max-volumes", "0"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("--max-volumes"), "{}", text(&o));
    let o = run(&["pool", "create", p, "--size", "64MiB", "--max-volumes", "2"]);
    assert!(o.status.success(), "{}", text(&o));
    for v in ["a", "b"] {
        let o = run(&["volume", "create", p, v, "--size", "1MiB"]);
        assert!(o.status.success(), "{v}: {}", text(&o));
    }
    let o = run(&["volume", "create", p, "c", "--size", "1MiB"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("at most 2 volumes"), "{}", text(&o));
    let o = run(&["pool", "info", p]);
    assert!(
        text(&o).contains("volumes: 2 of at most 2 (superblock format 3)"),
        "{}",
        text(&o)
    );
}
