//! The per-queue verdict cache: a moved epoch refreshes, each host has its
//! own verdicts, every reservation change flips the next command's, a
//! namespace replaced at the same NSID never matches, and the steady state
//! answers while another thread holds the state's lock.

use super::*;
use crate::reservation::{AcquireAction, Cptpl, RegisterAction, ReleaseAction, ResvType};
use kvt_bdev::ram::RamDevice;
use std::sync::{mpsc, Arc};
use std::time::Duration;

const A: HostId = HostId {
    bytes: [0xA; 16],
    extended: true,
};
const B: HostId = HostId {
    bytes: [0xB; 16],
    extended: true,
};
const C: HostId = HostId {
    bytes: [0xC; 16],
    extended: true,
};
const READ: IoPlan = IoPlan::Read {
    offset: 0,
    len: 512,
};
const WRITE: IoPlan = IoPlan::Write {
    offset: 0,
    len: 512,
    fua: false,
};
const CONFLICT: Result<(), Status> = Err(Status::RESERVATION_CONFLICT);

fn ns(nsid: u32) -> Arc<Namespace> {
    let dev = RamDevice::new("r", 1 << 20).unwrap();
    Arc::new(Namespace::new("nqn.resv", nsid, dev, 512))
}

/// `host` registers with key `key` (as Reservation Register runs it).
fn register(n: &Namespace, host: HostId, key: u64) {
    let cmd = Register {
        action: RegisterAction::Register,
        iekey: false,
        cptpl: Cptpl::NoChange,
        crkey: 0,
        nrkey: key,
    };
    n.reservation
        .change(|s| s.register(host, 1, &cmd, false))
        .unwrap()
        .0
        .unwrap();
}

fn acquire(n: &Namespace, host: HostId, action: AcquireAction, keys: (u64, u64), t: ResvType) {
    let cmd = Acquire {
        action,
        iekey: false,
        rtype: t,
        crkey: keys.0,
        prkey: keys.1,
    };
    n.reservation
        .change(|s| s.acquire(host, &cmd))
        .unwrap()
        .0
        .unwrap();
}

fn release(n: &Namespace, host: HostId, action: ReleaseAction, key: u64, t: ResvType) {
    let cmd = Release {
        action,
        iekey: false,
        rtype: t.raw(),
        crkey: key,
    };
    n.reservation
        .change(|s| s.release(host, &cmd))
        .unwrap()
        .0
        .unwrap();
}

/// (read, write) as `cache` answers them for `host`, checked against the
/// lock-taking answer.
fn rw(cache: &mut ResvCache, n: &Namespace, host: HostId) -> (bool, bool) {
    let r = cache.check(Some(n), &READ, &host);
    let w = cache.check(Some(n), &WRITE, &host);
    assert_eq!(
        r,
        n.reservation.access(&host, Access::Read),
        "read {host:?}"
    );
    assert_eq!(
        w,
        n.reservation.access(&host, Access::Write),
        "write {host:?}"
    );
    (r.is_ok(), w.is_ok())
}

#[test]
fn a_moved_epoch_refreshes_the_cached_verdict() {
    let n = ns(1);
    let mut b = ResvCache::default();
    register(&n, A, 0xA);
    acquire(
        &n,
        A,
        AcquireAction::Acquire,
        (0xA, 0),
        ResvType::WriteExclusive,
    );
    assert_eq!(b.check(Some(&n), &WRITE, &B), CONFLICT);
    let cached = b.by_nsid[1].unwrap().1;
    assert_eq!(cached.epoch, n.reservation.epoch.load(Ordering::Acquire));
    // The same epoch: the same verdict, from the cache.
    assert_eq!(b.check(Some(&n), &WRITE, &B), CONFLICT);
    assert_eq!(b.by_nsid[1].unwrap().1, cached);
    release(&n, A, ReleaseAction::Release, 0xA, ResvType::WriteExclusive);
    assert_eq!(b.check(Some(&n), &WRITE, &B), Ok(()), "released: B writes");
    assert!(b.by_nsid[1].unwrap().1.epoch > cached.epoch);
}

#[test]
fn each_host_has_its_own_verdicts() {
    let n = ns(1);
    let (mut a, mut b, mut c) = Default::default();
    register(&n, A, 0xA);
    register(&n, B, 0xB);
    let t = ResvType::WriteExclusiveRegistrantsOnly;
    acquire(&n, A, AcquireAction::Acquire, (0xA, 0), t);
    assert_eq!(rw(&mut a, &n, A), (true, true), "holder");
    assert_eq!(rw(&mut b, &n, B), (true, true), "registrant");
    assert_eq!(rw(&mut c, &n, C), (true, false), "other host reads only");
    let t = ResvType::ExclusiveAccess;
    release(
        &n,
        A,
        ReleaseAction::Release,
        0xA,
        ResvType::WriteExclusiveRegistrantsOnly,
    );
    acquire(&n, A, AcquireAction::Acquire, (0xA, 0), t);
    assert_eq!(rw(&mut a, &n, A), (true, true), "holder");
    assert_eq!(rw(&mut b, &n, B), (false, false), "registrant");
    assert_eq!(rw(&mut c, &n, C), (false, false), "other host");
}

#[test]
fn acquire_preempt_release_and_clear_each_flip_the_next_command() {
    let n = ns(1);
    let (mut a, mut b) = (ResvCache::default(), ResvCache::default());
    let we = ResvType::WriteExclusive;
    register(&n, A, 0xA);
    register(&n, B, 0xB);
    assert_eq!(rw(&mut b, &n, B), (true, true), "registered, nothing held");
    acquire(&n, A, AcquireAction::Acquire, (0xA, 0), we);
    assert_eq!(rw(&mut b, &n, B), (true, false), "A acquired");
    assert_eq!(rw(&mut a, &n, A), (true, true));
    acquire(&n, B, AcquireAction::Preempt, (0xB, 0xA), we);
    assert_eq!(rw(&mut a, &n, A), (true, false), "B preempted A");
    assert_eq!(rw(&mut b, &n, B), (true, true));
    release(&n, B, ReleaseAction::Release, 0xB, we);
    assert_eq!(rw(&mut a, &n, A), (true, true), "B released");
    register(&n, A, 0xA);
    let ea = ResvType::ExclusiveAccess;
    acquire(&n, B, AcquireAction::Acquire, (0xB, 0), ea);
    assert_eq!(
        rw(&mut a, &n, A),
        (false, false),
        "B holds Exclusive Access"
    );
    acquire(&n, A, AcquireAction::PreemptAndAbort, (0xA, 0xB), ea);
    assert_eq!(
        rw(&mut b, &n, B),
        (false, false),
        "A preempted (and aborted) B"
    );
    assert_eq!(rw(&mut a, &n, A), (true, true));
    release(&n, A, ReleaseAction::Clear, 0xA, ResvType::ExclusiveAccess);
    assert_eq!(rw(&mut b, &n, B), (true, true), "A cleared");
    assert!(n.reservation.idle.load(Ordering::Acquire));
}

#[test]
fn a_namespace_replaced_at_the_same_nsid_never_matches() {
    let (old, new) = (ns(1), ns(1));
    let mut b = ResvCache::default();
    // The same history on both: the same epoch, different holders.
    for (n, holder, key) in [(&old, A, 0xA), (&new, B, 0xB)] {
        register(n, holder, key);
        acquire(
            n,
            holder,
            AcquireAction::Acquire,
            (key, 0),
            ResvType::ExclusiveAccess,
        );
    }
    assert_eq!(
        old.reservation.epoch.load(Ordering::Acquire),
        new.reservation.epoch.load(Ordering::Acquire)
    );
    assert_eq!(b.check(Some(&old), &READ, &B), CONFLICT);
    assert_eq!(
        b.check(Some(&new), &READ, &B),
        Ok(()),
        "B holds the new one"
    );
}

#[test]
fn commands_without_a_namespace_or_reservation_access_pass() {
    let n = ns(1);
    let mut b = ResvCache::default();
    register(&n, A, 0xA);
    acquire(
        &n,
        A,
        AcquireAction::Acquire,
        (0xA, 0),
        ResvType::ExclusiveAccess,
    );
    assert_eq!(b.check(None, &WRITE, &B), Ok(()));
    let flush_all = IoPlan::Flush { all: true };
    assert_eq!(b.check(Some(&n), &flush_all, &B), Ok(()));
    assert_eq!(
        b.check(Some(&n), &IoPlan::Reservation { len: 16 }, &B),
        Ok(())
    );
}

/// The steady state takes no lock: with the state's mutex held by this
/// thread, another thread's cached checks still answer. Then the control:
/// once the epoch moves, the check needs the lock and waits for it.
#[test]
fn the_steady_state_check_answers_while_the_lock_is_held() {
    let n = ns(1);
    let mut b = ResvCache::default();
    register(&n, A, 0xA);
    acquire(
        &n,
        A,
        AcquireAction::Acquire,
        (0xA, 0),
        ResvType::WriteExclusive,
    );
    assert_eq!(b.check(Some(&n), &WRITE, &B), CONFLICT, "warm the cache");
    let guard = n.reservation.state.lock().unwrap();
    let (tx, rx) = mpsc::channel();
    let n2 = n.clone();
    let checker = std::thread::spawn(move || {
        for _ in 0..1000 {
            assert_eq!(b.check(Some(&n2), &WRITE, &B), CONFLICT);
            assert_eq!(b.check(Some(&n2), &READ, &B), Ok(()));
        }
        tx.send(()).unwrap();
        // The epoch moves (as a change would, under the lock): now the
        // check must read the state and so waits for the lock.
        n2.reservation.epoch.fetch_add(1, Ordering::Release);
        let r = b.check(Some(&n2), &WRITE, &B);
        tx.send(()).unwrap();
        r
    });
    let answered = rx.recv_timeout(Duration::from_secs(20));
    let blocked = rx.recv_timeout(Duration::from_millis(200)).is_err();
    drop(guard);
    let last = checker.join().unwrap();
    assert!(answered.is_ok(), "cached checks took the held lock");
    assert!(blocked, "a moved epoch must read the state under the lock");
    assert_eq!(last, CONFLICT);
}

/// Every state change moves the epoch, including one that leaves the
/// namespace idle; a refused command moves it too (harmless: one refresh).
#[test]
fn every_change_moves_the_epoch() {
    let n = ns(1);
    let epoch = || n.reservation.epoch.load(Ordering::Acquire);
    let e0 = epoch();
    register(&n, A, 0xA);
    let e1 = epoch();
    acquire(
        &n,
        A,
        AcquireAction::Acquire,
        (0xA, 0),
        ResvType::WriteExclusive,
    );
    let e2 = epoch();
    release(&n, A, ReleaseAction::Clear, 0xA, ResvType::WriteExclusive);
    let e3 = epoch();
    assert!(e0 < e1 && e1 < e2 && e2 < e3, "{e0} {e1} {e2} {e3}");
}
