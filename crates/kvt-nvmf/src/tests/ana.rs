//! Asymmetric Namespace Access through the queues: two paths (listeners) to
//! one subsystem, Identify, the ANA log page, the ANA change event, Path
//! Related statuses on I/O, and a removed listener's controllers.

use super::*;
use crate::ana::{self, AnaLog, AnaState};
use std::net::SocketAddr;

const PATH_A: &str = "127.0.0.1:4420";
const PATH_B: &str = "127.0.0.1:4421";

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn cfg_on(local: &str) -> QueueConfig {
    QueueConfig {
        local: Some(addr(local)),
        ..tcp_cfg()
    }
}

/// One path: an enabled controller's admin queue and I/O queue 1, through
/// `local`.
struct Path {
    admin: Conn,
    io: Conn,
    cntlid: u16,
}

fn path(e: &Env, local: &str) -> Path {
    let (admin, cntlid) = e.admin_with(cfg_on(local));
    let io = e.io_with(cfg_on(local), cntlid, 1);
    Path { admin, io, cntlid }
}

/// A subsystem that reports ANA, reached through two listeners.
fn two_paths() -> (Env, Path, Path) {
    let e = env();
    e.subsys
        .ana
        .reporting
        .store(true, std::sync::atomic::Ordering::Release);
    let a = path(&e, PATH_A);
    let b = path(&e, PATH_B);
    (e, a, b)
}

fn ana_log(c: &mut Conn, cid: u16, rgo: bool) -> AnaLog {
    let mut s = get_log(cid, ana::LID_ANA, 4096, 0);
    if rgo {
        s.set_cdw(10, s.cdw(10) | (ana::LSP_RGO as u32) << 8);
    }
    AnaLog::decode(&ok_data(c.exec(s))).expect("a whole log page")
}

/// A one-block write with in-capsule data: refused before any data would
/// move, or done.
fn write_status(p: &mut Path, cid: u16) -> Status {
    let data = pattern(BS as usize, cid as u8);
    p.io.exec_icd(icd_write(cid, 1, 0, data.len()), &data)
        .status()
}

#[test]
fn identify_reports_ana_and_the_same_namespace_identity_on_every_path() {
    let (_e, mut a, mut b) = two_paths();
    let id = IdentifyController::decode(&ok_data(a.admin.exec(identify(1, cns::CONTROLLER, 0))));
    assert_eq!(id.cmic, 0x0B, "multi-port, multi-controller, ANA");
    assert_eq!(id.oaes & ana::AEC_ANA_CHANGE, ana::AEC_ANA_CHANGE);
    assert_eq!((id.anatt, id.anacap), (ana::ANATT_SECS, ana::ANACAP));
    assert_eq!((id.anagrpmax, id.nanagrpid), (1024, 1024));
    assert!(id.nanagrpid <= id.anagrpmax && id.mnan <= id.nn);
    let ns_a = ok_data(a.admin.exec(identify(2, cns::NAMESPACE, 1)));
    let ns_b = ok_data(b.admin.exec(identify(2, cns::NAMESPACE, 1)));
    let ns = IdentifyNamespace::decode(&ns_a);
    assert_eq!((ns.anagrpid, ns.nmic), (1, 1), "default group: the NSID");
    assert_eq!(ns_a, ns_b, "the same namespace on both controllers");
    let d_a = ok_data(a.admin.exec(identify(3, cns::NS_DESCRIPTOR_LIST, 1)));
    let d_b = ok_data(b.admin.exec(identify(3, cns::NS_DESCRIPTOR_LIST, 1)));
    assert_eq!(d_a, d_b, "NGUID, UUID and EUI-64 match");
    assert_ne!(a.cntlid, b.cntlid);
}

#[test]
fn without_ana_reporting_nothing_changes() {
    let e = env();
    let mut a = path(&e, PATH_A);
    let id = IdentifyController::decode(&ok_data(a.admin.exec(identify(1, cns::CONTROLLER, 0))));
    assert_eq!((id.cmic, id.anagrpmax, id.anacap), (0x02, 0, 0));
    let ns = IdentifyNamespace::decode(&ok_data(a.admin.exec(identify(2, cns::NAMESPACE, 1))));
    assert_eq!(ns.anagrpid, 0);
    assert_status(
        &a.admin.exec(get_log(3, ana::LID_ANA, 4096, 0)),
        Status::INVALID_LOG_PAGE,
    );
    assert_eq!(
        e.subsys
            .set_ana_state(addr(PATH_A), None, AnaState::Inaccessible),
        Err(ana::AnaError::NotReporting)
    );
    assert_status(&a.io.write(4, 1, 0, &pattern(512, 1)), Status::SUCCESS);
}

#[test]
fn each_state_lets_io_through_or_answers_its_path_status() {
    let (e, mut a, mut b) = two_paths();
    let cases = [
        (AnaState::Optimized, Status::SUCCESS),
        (AnaState::NonOptimized, Status::SUCCESS),
        (AnaState::Inaccessible, ana::ASYMMETRIC_ACCESS_INACCESSIBLE),
        (
            AnaState::PersistentLoss,
            ana::ASYMMETRIC_ACCESS_PERSISTENT_LOSS,
        ),
        (AnaState::Change, ana::ASYMMETRIC_ACCESS_TRANSITION),
        (AnaState::Optimized, Status::SUCCESS),
    ];
    for (i, (st, want)) in cases.into_iter().enumerate() {
        let cid = 10 + i as u16;
        e.subsys.set_ana_state(addr(PATH_A), Some(1), st).unwrap();
        let got = write_status(&mut a, cid);
        assert_eq!(got, want, "{st:?} through A");
        if !want.is_success() {
            assert_eq!(got.sct, 3, "Path Related");
            assert!(!got.dnr, "the host may retry on another path");
        }
        let r = a.io.read(cid + 100, 1, 0, 1);
        assert_eq!(r.status(), want, "reads too");
        // The other path is untouched, and admin commands keep working.
        assert_eq!(write_status(&mut b, cid), Status::SUCCESS);
        let log = ana_log(&mut a.admin, cid, false);
        assert_eq!(log.groups[0].state, st as u8);
        assert_eq!(
            ana_log(&mut b.admin, cid, false).groups[0].state,
            AnaState::Optimized as u8
        );
    }
}

#[test]
fn the_log_page_lists_groups_with_and_without_nsids_and_counts_changes() {
    let (e, mut a, _b) = two_paths();
    e.add_ram_ns(2);
    e.add_ram_ns(3);
    assert_eq!(e.subsys.set_ns_ana_group(3, 2), Ok(true));
    let full = ana_log(&mut a.admin, 1, false);
    let groups: Vec<(u32, Vec<u32>)> = full
        .groups
        .iter()
        .map(|g| (g.anagrpid, g.nsids.clone()))
        .collect();
    assert_eq!(groups, vec![(1, vec![1]), (2, vec![2, 3])]);
    let cc = full.change_count;
    assert_eq!(cc, 1, "one move so far");
    let rgo = ana_log(&mut a.admin, 2, true);
    assert!(rgo.groups.iter().all(|g| g.nsids.is_empty()));
    assert_eq!(rgo.groups.len(), 2);
    assert_eq!(rgo.encode().len(), 16 + 2 * 32);
    // A partial read at an offset is the same bytes as the whole page.
    let whole = full.encode();
    let part = ok_data(a.admin.exec(get_log(3, ana::LID_ANA, 32, 16)));
    assert_eq!(part[..], whole[16..48]);
    assert_status(
        &a.admin.exec(get_log(4, ana::LID_ANA, 16, 2)),
        Status::INVALID_FIELD,
    );
    e.subsys
        .set_ana_state(addr(PATH_A), Some(2), AnaState::NonOptimized)
        .unwrap();
    let after = ana_log(&mut a.admin, 5, false);
    assert_eq!(after.change_count, cc + 1);
    assert_eq!(after.groups[1].state, AnaState::NonOptimized as u8);
    // Setting the same state again changes nothing.
    e.subsys
        .set_ana_state(addr(PATH_A), Some(2), AnaState::NonOptimized)
        .unwrap();
    assert_eq!(ana_log(&mut a.admin, 6, false).change_count, cc + 1);
}

#[test]
fn a_namespace_moved_to_an_inaccessible_group_is_refused_there() {
    let (e, mut a, mut b) = two_paths();
    e.subsys
        .set_ana_state(addr(PATH_A), Some(7), AnaState::Inaccessible)
        .unwrap();
    assert_eq!(write_status(&mut a, 1), Status::SUCCESS, "group 1 still");
    e.subsys.set_ns_ana_group(1, 7).unwrap();
    let ns = IdentifyNamespace::decode(&ok_data(a.admin.exec(identify(2, cns::NAMESPACE, 1))));
    assert_eq!(ns.anagrpid, 7);
    assert_eq!(write_status(&mut a, 3), ana::ASYMMETRIC_ACCESS_INACCESSIBLE);
    assert_eq!(write_status(&mut b, 3), Status::SUCCESS);
    // Groups that do not exist are refused, naming the field.
    for bad in [0u64, 1025, u32::MAX as u64 + 2] {
        let err = e.subsys.set_ns_ana_group(1, bad).unwrap_err();
        assert_eq!(err.field(), "anagrpid", "{err}");
        let err = e
            .subsys
            .set_ana_state(addr(PATH_A), Some(bad), AnaState::Optimized)
            .unwrap_err();
        assert_eq!(err, ana::AnaError::UnknownGroup(bad));
    }
    assert_eq!(e.subsys.set_ns_ana_group(9, 2), Ok(false), "no namespace 9");
}

#[test]
fn the_ana_change_event_goes_to_the_controllers_whose_view_changed() {
    let (e, mut a, mut b) = two_paths();
    for p in [&mut a, &mut b] {
        ok(p.admin.exec(set_features(
            1,
            fid::ASYNC_EVENT_CONFIG,
            ana::AEC_ANA_CHANGE,
        )));
        assert_eq!(p.admin.receive(aer(0x40)), Received::Done);
        assert!(p.admin.take().is_empty());
    }
    e.subsys
        .set_ana_state(addr(PATH_A), Some(1), AnaState::Change)
        .unwrap();
    a.admin.housekeeping();
    b.admin.housekeeping();
    let r = a.admin.one();
    assert_eq!(
        (r.cqe.cid, r.cqe.result),
        (0x40, ana::AEN_ANA_CHANGE as u64)
    );
    assert!(b.admin.take().is_empty(), "B's path did not change");
    // Masked until the log page is read (RAE clear).
    assert_eq!(a.admin.receive(aer(0x40)), Received::Done);
    e.subsys
        .set_ana_state(addr(PATH_A), Some(1), AnaState::Optimized)
        .unwrap();
    a.admin.housekeeping();
    assert!(a.admin.take().is_empty(), "masked");
    ana_log(&mut a.admin, 2, false);
    // A namespace moving changes every controller's view.
    e.subsys.set_ns_ana_group(1, 3).unwrap();
    a.admin.housekeeping();
    b.admin.housekeeping();
    assert_eq!(a.admin.one().cqe.result, ana::AEN_ANA_CHANGE as u64);
    assert_eq!(b.admin.one().cqe.result, ana::AEN_ANA_CHANGE as u64);
}

#[test]
fn a_host_that_did_not_enable_the_event_gets_none() {
    let (e, mut a, _b) = two_paths();
    ok(a.admin
        .exec(set_features(1, fid::ASYNC_EVENT_CONFIG, AEC_NS_ATTR)));
    assert_eq!(a.admin.receive(aer(0x41)), Received::Done);
    e.subsys
        .set_ana_state(addr(PATH_A), None, AnaState::NonOptimized)
        .unwrap();
    a.admin.housekeeping();
    assert!(a.admin.take().is_empty());
}

#[test]
fn removing_a_listener_disconnects_the_controllers_that_came_through_it() {
    let (e, mut a, mut b) = two_paths();
    e.subsys
        .set_ana_state(addr(PATH_A), Some(1), AnaState::Inaccessible)
        .unwrap();
    assert_eq!(e.subsys.disconnect_listener(addr(PATH_A)), 1);
    assert_eq!(a.admin.housekeeping(), Some("controller failed"));
    assert_eq!(a.io.housekeeping(), Some("controller failed"));
    assert_eq!(b.admin.housekeeping(), None);
    assert_eq!(b.io.housekeeping(), None);
    assert!(!e.ctrl(b.cntlid).is_failed());
    // Added again, the listener starts optimized.
    let mut a2 = path(&e, PATH_A);
    assert_eq!(write_status(&mut a2, 5), Status::SUCCESS);
}

#[test]
fn a_connection_on_a_wildcard_listener_shares_its_path() {
    let e = env();
    e.subsys
        .ana
        .reporting
        .store(true, std::sync::atomic::Ordering::Release);
    if let Ok(mut l) = e.target.listeners.write() {
        l.push(Listener {
            addr: addr("0.0.0.0:4430"),
            discovery_only: false,
            portid: 2,
            rdma: false,
            secure: false,
        });
    }
    let mut p = path(&e, "10.1.2.3:4430");
    e.subsys
        .set_ana_state(addr("0.0.0.0:4430"), None, AnaState::PersistentLoss)
        .unwrap();
    assert_eq!(
        write_status(&mut p, 1),
        ana::ASYMMETRIC_ACCESS_PERSISTENT_LOSS
    );
    assert_eq!(
        e.ctrl(p.cntlid).ana.path.get().map(|p| p.listener),
        Some(addr("0.0.0.0:4430"))
    );
}
