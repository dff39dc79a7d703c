//! Replays every committed input through its harness under plain `cargo test`:
//! `corpus/<target>/` (the seeds and what fuzzing kept) and
//! `regressions/<target>/` (inputs that once crashed; each must pass now).
//!
//! An input whose bug is known and not yet fixed lives in
//! `regressions/<target>/open/`: `open_regressions_still_fail` expects it to
//! panic, so it shows as a failure here the day the bug is fixed (move it up
//! one folder then), and `cargo test -- --ignored` lists what is still open.

use std::path::{Path, PathBuf};

fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_file()
                && !p
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        })
        .collect();
    v.sort();
    v
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn replay(folder: &str) -> usize {
    let mut n = 0;
    for (name, harness) in kvtarget_fuzz::TARGETS {
        for p in inputs(&root().join(folder).join(name)) {
            let data = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            eprintln!("replay {}", p.display());
            harness(&data);
            n += 1;
        }
    }
    n
}

#[test]
fn corpus_replays_clean() {
    let n = replay("corpus");
    assert!(
        n > 0,
        "no corpus found under {}",
        root().join("corpus").display()
    );
}

#[test]
fn regressions_replay_clean() {
    replay("regressions");
}

/// Every open regression must still crash its harness; see the module doc.
#[test]
fn open_regressions_still_fail() {
    for (name, harness) in kvtarget_fuzz::TARGETS {
        for p in inputs(&root().join("regressions").join(name).join("open")) {
            let data = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            let r = std::panic::catch_unwind(|| harness(&data));
            assert!(
                r.is_err(),
                "{} no longer fails: move it to regressions/{name}/",
                p.display()
            );
        }
    }
}

/// The open bugs themselves, as failing tests: `cargo test -- --ignored`.
#[test]
#[ignore = "known open bugs (fuzz/regressions/*/open/); see fuzz/README or bench/RESULTS.md"]
fn open_regressions_pass() {
    for (name, harness) in kvtarget_fuzz::TARGETS {
        for p in inputs(&root().join("regressions").join(name).join("open")) {
            let data = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            eprintln!("replay {}", p.display());
            harness(&data);
        }
    }
}

/// The pool seeds are real pools: `check` finds every one consistent, so
/// fuzzing starts from the deep end of the checker, not at "bad magic".
#[test]
fn pool_check_seeds_are_consistent_pools() {
    let files = inputs(&root().join("corpus/pool_check"));
    let mut seeds = 0;
    for p in &files {
        let Ok(name) = p
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .ok_or(())
        else {
            continue;
        };
        // Seeds are named by hash; fuzzing's own finds (id:...) may be damaged.
        if name.starts_with("id") {
            continue;
        }
        let data = std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let dev = kvtarget_fuzz::image::build(&data).expect("seed builds a device");
        let rep = kvt_pool::check(&dev);
        assert!(rep.damage.is_empty(), "{}: {:?}", p.display(), rep.damage);
        eprintln!("{name}: {}", rep.lines.join(" | "));
        seeds += 1;
    }
    assert!(seeds > 0, "no pool seeds");
}

/// Once a hang: a superblock whose geometry is self-consistent but claims far
/// more than the device holds (a 1 TB journal and 16.8 M extents on an 8 MiB
/// device) made `check` walk the claimed size. It is refused now, by name.
#[test]
fn check_refuses_a_superblock_larger_than_the_device() {
    let p = root().join("regressions/pool_check/superblock-claims-huge-device");
    let data = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let dev = kvtarget_fuzz::image::build(&data).expect("the input builds a device");
    let rep = kvt_pool::check(&dev);
    assert!(
        rep.damage.iter().any(|d| d.contains("the device has")),
        "{:?}",
        rep.damage
    );
}

/// The reservation-record seeds decode (a journal entry and a checkpoint
/// payload with `VolumeResv` records), so fuzzing starts inside their
/// decoder rather than at a refused prefix.
#[test]
fn reservation_seeds_decode() {
    use kvt_pool::format::{CheckpointData, Record};
    let mut seen = 0;
    for p in inputs(&root().join("corpus/pool_format")) {
        if !p
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("resv-"))
        {
            continue;
        }
        let data = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let (sel, b) = data.split_first().expect("a selector byte");
        let resv = match sel % 4 {
            2 => CheckpointData::decode(b).map(|c| c.resv.len()),
            _ => Record::decode_all(b, "seed").map(|r| {
                r.iter()
                    .filter(|r| matches!(r, Record::VolumeResv { .. }))
                    .count()
            }),
        };
        assert!(
            resv.as_ref().is_ok_and(|n| *n > 0),
            "{}: {resv:?}",
            p.display()
        );
        seen += 1;
    }
    assert_eq!(seen, 2, "the two reservation seeds");
}

/// The etcd seeds are real answers of Debian's etcd 3.4 gateway: each splits
/// as HTTP, and the range seed's value is a member record, so the harness
/// reaches every decoder it feeds.
#[test]
fn etcd_seeds_are_real_gateway_answers() {
    use kvt_cluster::etcd::{decode, RangeResponse};
    use kvt_cluster::http::parse_answer;
    use kvt_cluster::member::MemberRecord;
    let dir = root().join("corpus/etcd_answer");
    let mut seeds = 0;
    for p in inputs(&dir) {
        if !p
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("seed-"))
        {
            continue;
        }
        let data = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let a = parse_answer(&data).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        if p.ends_with("seed-range-member") {
            let r: RangeResponse = decode("seed", "/v3/kv/range", a).expect("a range answer");
            let m: MemberRecord = serde_json::from_slice(&r.kvs[0].value).expect("a member record");
            assert_eq!(m.name, "n1");
        }
        seeds += 1;
    }
    assert_eq!(seeds, 6, "the six etcd seeds");
}
