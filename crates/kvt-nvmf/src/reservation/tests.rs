use super::*;
use proptest::prelude::*;

const A: HostId = HostId {
    bytes: [1; 16],
    extended: true,
};
const B: HostId = HostId {
    bytes: [2; 16],
    extended: true,
};
const C: HostId = HostId {
    bytes: [3; 16],
    extended: true,
};

fn reg(action: RegisterAction, crkey: u64, nrkey: u64) -> Register {
    Register {
        action,
        iekey: false,
        cptpl: Cptpl::NoChange,
        crkey,
        nrkey,
    }
}

fn acq(action: AcquireAction, rtype: ResvType, crkey: u64, prkey: u64) -> Acquire {
    Acquire {
        action,
        iekey: false,
        rtype,
        crkey,
        prkey,
    }
}

fn rel(action: ReleaseAction, rtype: ResvType, crkey: u64) -> Release {
    Release {
        action,
        iekey: false,
        rtype: rtype.raw(),
        crkey,
    }
}

/// A state with `hosts` registered, host i with key 0x10 + i.
fn registered(hosts: &[HostId]) -> ResvState {
    let mut s = ResvState::default();
    for (i, h) in hosts.iter().enumerate() {
        let k = 0x10 + i as u64;
        s.register(
            *h,
            i as u16 + 1,
            &reg(RegisterAction::Register, 0, k),
            false,
        )
        .unwrap();
    }
    s
}

#[test]
fn register_counts_generation_and_same_key_again_is_a_no_op() {
    let mut s = registered(&[A]);
    assert_eq!(s.generation, 1);
    let again = reg(RegisterAction::Register, 0, 0x10);
    assert_eq!(s.register(A, 1, &again, false), Ok(vec![]));
    assert_eq!(s.generation, 1, "no change, no new generation");
    let other = reg(RegisterAction::Register, 0, 0x99);
    assert_eq!(
        s.register(A, 1, &other, false),
        Err(Status::RESERVATION_CONFLICT)
    );
}

#[test]
fn unregister_and_replace_check_the_key_unless_iekey() {
    let mut s = registered(&[A]);
    let wrong = reg(RegisterAction::Unregister, 0x99, 0);
    assert_eq!(
        s.register(A, 1, &wrong, false),
        Err(Status::RESERVATION_CONFLICT)
    );
    let replace = reg(RegisterAction::Replace, 0x99, 0x20);
    assert_eq!(
        s.register(A, 1, &replace, false),
        Err(Status::RESERVATION_CONFLICT)
    );
    let ignore = Register {
        iekey: true,
        ..replace
    };
    s.register(A, 1, &ignore, false).unwrap();
    assert_eq!(s.registrants[0].key, 0x20);
    assert_eq!(s.generation, 1, "replace does not count");
    s.register(A, 1, &reg(RegisterAction::Unregister, 0x20, 0), false)
        .unwrap();
    assert!(s.registrants.is_empty());
    assert_eq!(s.generation, 2);
}

#[test]
fn an_unregistered_host_conflicts_on_everything_but_register() {
    let mut s = registered(&[A]);
    let unreg = reg(RegisterAction::Unregister, 0, 0);
    assert_eq!(
        s.register(B, 2, &unreg, false),
        Err(Status::RESERVATION_CONFLICT)
    );
    let replace = reg(RegisterAction::Replace, 0, 1);
    assert_eq!(
        s.register(B, 2, &replace, false),
        Err(Status::RESERVATION_CONFLICT)
    );
    let a = acq(AcquireAction::Acquire, ResvType::WriteExclusive, 0, 0);
    assert_eq!(s.acquire(B, &a), Err(Status::RESERVATION_CONFLICT));
    let r = rel(ReleaseAction::Clear, ResvType::WriteExclusive, 0);
    assert_eq!(s.release(B, &r), Err(Status::RESERVATION_CONFLICT));
}

/// A full registrant table refuses a new host and changes nothing (a pool
/// volume persists at most that many; the in-memory state never gets ahead).
#[test]
fn a_full_registrant_table_refuses_a_new_host_unchanged() {
    let mut s = ResvState::default();
    for i in 0..MAX_RESV_REGISTRANTS {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&(i as u64 + 1).to_le_bytes());
        let h = HostId {
            bytes,
            extended: true,
        };
        s.register(h, 1, &reg(RegisterAction::Register, 0, 7), false)
            .expect("room");
    }
    let before = s.clone();
    let extra = HostId {
        bytes: [0xEE; 16],
        extended: true,
    };
    assert_eq!(
        s.register(extra, 1, &reg(RegisterAction::Register, 0, 7), false),
        Err(Status::INTERNAL_ERROR)
    );
    assert_eq!(s, before);
}

#[test]
fn ptpl_change_needs_a_capable_namespace() {
    let mut s = ResvState::default();
    let set = Register {
        cptpl: Cptpl::Set,
        ..reg(RegisterAction::Register, 0, 1)
    };
    assert_eq!(s.register(A, 1, &set, false), Err(Status::INVALID_FIELD));
    assert!(
        s.registrants.is_empty(),
        "a refused command changes nothing"
    );
    s.register(A, 1, &set, true).unwrap();
    assert!(s.ptpl);
    let clear = Register {
        cptpl: Cptpl::Clear,
        ..reg(RegisterAction::Replace, 1, 2)
    };
    s.register(A, 1, &clear, true).unwrap();
    assert!(!s.ptpl);
}

#[test]
fn decode_refuses_reserved_actions_types_and_short_data() {
    let keys = [0u8; 16];
    for a in 3..8 {
        assert_eq!(Register::decode(a, &keys), Err(Status::INVALID_FIELD));
        assert_eq!(
            Acquire::decode(a | (1 << 8), &keys),
            Err(Status::INVALID_FIELD)
        );
    }
    assert_eq!(Register::decode(1 << 30, &keys), Err(Status::INVALID_FIELD));
    for t in [0u32, 7, 0xFF] {
        assert_eq!(Acquire::decode(t << 8, &keys), Err(Status::INVALID_FIELD));
    }
    for a in 2..8 {
        assert_eq!(Release::decode(a, &keys), Err(Status::INVALID_FIELD));
    }
    assert_eq!(Register::decode(0, &keys[..15]), Err(Status::INVALID_FIELD));
    assert_eq!(Release::decode(0, &keys[..7]), Err(Status::INVALID_FIELD));
    let mut data = [0u8; 16];
    data[..8].copy_from_slice(&5u64.to_le_bytes());
    data[8..].copy_from_slice(&6u64.to_le_bytes());
    let r = Register::decode(2 | 8 | (3 << 30), &data).unwrap();
    assert_eq!(
        r,
        Register {
            action: RegisterAction::Replace,
            iekey: true,
            cptpl: Cptpl::Set,
            crkey: 5,
            nrkey: 6
        }
    );
    let a = Acquire::decode(1 | (4 << 8), &data).unwrap();
    assert_eq!(a.rtype, ResvType::ExclusiveAccessRegistrantsOnly);
    assert_eq!((a.action, a.crkey, a.prkey), (AcquireAction::Preempt, 5, 6));
}

#[test]
fn acquire_needs_the_right_key_and_conflicts_with_another_holder() {
    let mut s = registered(&[A, B]);
    let wrong = acq(AcquireAction::Acquire, ResvType::WriteExclusive, 0x99, 0);
    assert_eq!(s.acquire(A, &wrong), Err(Status::RESERVATION_CONFLICT));
    let a = acq(AcquireAction::Acquire, ResvType::WriteExclusive, 0x10, 0);
    s.acquire(A, &a).unwrap();
    assert!(s.is_holder(&A) && !s.is_holder(&B));
    assert_eq!(s.acquire(A, &a), Ok(vec![]), "again, same type");
    let other_type = acq(AcquireAction::Acquire, ResvType::ExclusiveAccess, 0x10, 0);
    assert_eq!(s.acquire(A, &other_type), Err(Status::RESERVATION_CONFLICT));
    let b = acq(AcquireAction::Acquire, ResvType::WriteExclusive, 0x11, 0);
    assert_eq!(s.acquire(B, &b), Err(Status::RESERVATION_CONFLICT));
    assert_eq!(s.generation, 2, "acquire does not count");
}

#[test]
fn the_access_table_of_every_type() {
    use Access::{Read, Write};
    // (type, registrant read, registrant write, other read, other write)
    let table = [
        (ResvType::WriteExclusive, true, false, true, false),
        (ResvType::ExclusiveAccess, false, false, false, false),
        (
            ResvType::WriteExclusiveRegistrantsOnly,
            true,
            true,
            true,
            false,
        ),
        (
            ResvType::ExclusiveAccessRegistrantsOnly,
            true,
            true,
            false,
            false,
        ),
        (
            ResvType::WriteExclusiveAllRegistrants,
            true,
            true,
            true,
            false,
        ),
        (
            ResvType::ExclusiveAccessAllRegistrants,
            true,
            true,
            false,
            false,
        ),
    ];
    for (t, rr, rw, or, ow) in table {
        let mut s = registered(&[A, B]);
        s.acquire(A, &acq(AcquireAction::Acquire, t, 0x10, 0))
            .unwrap();
        let ok = |b: bool| {
            if b {
                Ok(())
            } else {
                Err(Status::RESERVATION_CONFLICT)
            }
        };
        assert_eq!(s.access(&A, Read), Ok(()), "{t:?} holder reads");
        assert_eq!(s.access(&A, Write), Ok(()), "{t:?} holder writes");
        assert_eq!(s.access(&B, Read), ok(rr), "{t:?} registrant reads");
        assert_eq!(s.access(&B, Write), ok(rw), "{t:?} registrant writes");
        assert_eq!(s.access(&C, Read), ok(or), "{t:?} other reads");
        assert_eq!(s.access(&C, Write), ok(ow), "{t:?} other writes");
    }
    let s = registered(&[A]);
    assert_eq!(s.access(&C, Write), Ok(()), "no reservation, no conflict");
}

#[test]
fn all_registrants_hold_and_the_last_one_out_releases() {
    let mut s = registered(&[A, B]);
    let t = ResvType::WriteExclusiveAllRegistrants;
    s.acquire(A, &acq(AcquireAction::Acquire, t, 0x10, 0))
        .unwrap();
    assert!(s.is_holder(&B));
    assert_eq!(
        s.acquire(B, &acq(AcquireAction::Acquire, t, 0x11, 0)),
        Ok(vec![])
    );
    s.register(A, 1, &reg(RegisterAction::Unregister, 0x10, 0), false)
        .unwrap();
    assert!(s.held.is_some(), "B still holds it");
    s.register(B, 2, &reg(RegisterAction::Unregister, 0x11, 0), false)
        .unwrap();
    assert_eq!(s.held, None);
}

#[test]
fn unregistering_the_holder_releases_and_tells_registrants_of_registrants_only_types() {
    for (t, told) in [
        (ResvType::WriteExclusive, false),
        (ResvType::WriteExclusiveRegistrantsOnly, true),
    ] {
        let mut s = registered(&[A, B]);
        s.acquire(A, &acq(AcquireAction::Acquire, t, 0x10, 0))
            .unwrap();
        let n = s
            .register(A, 1, &reg(RegisterAction::Unregister, 0x10, 0), false)
            .unwrap();
        assert_eq!(s.held, None);
        let want = if told {
            vec![(B, Notice::ReservationReleased)]
        } else {
            vec![]
        };
        assert_eq!(n, want, "{t:?}");
    }
}

#[test]
fn release_by_holder_by_non_holder_and_with_the_wrong_type() {
    let mut s = registered(&[A, B]);
    let t = ResvType::ExclusiveAccessRegistrantsOnly;
    s.acquire(A, &acq(AcquireAction::Acquire, t, 0x10, 0))
        .unwrap();
    assert_eq!(
        s.release(B, &rel(ReleaseAction::Release, t, 0x11)),
        Ok(vec![]),
        "a non-holder's release succeeds and does nothing"
    );
    assert!(s.held.is_some());
    assert_eq!(
        s.release(A, &rel(ReleaseAction::Release, t, 0x99)),
        Err(Status::RESERVATION_CONFLICT)
    );
    assert_eq!(
        s.release(
            A,
            &rel(ReleaseAction::Release, ResvType::WriteExclusive, 0x10)
        ),
        Err(Status::INVALID_FIELD)
    );
    let n = s.release(A, &rel(ReleaseAction::Release, t, 0x10)).unwrap();
    assert_eq!(n, vec![(B, Notice::ReservationReleased)]);
    assert_eq!(s.held, None);
    assert_eq!(s.registrants.len(), 2, "release keeps registrations");
    assert_eq!(
        s.release(A, &rel(ReleaseAction::Release, t, 0x10)),
        Ok(vec![]),
        "nothing held: success"
    );
}

#[test]
fn clear_removes_everything_and_counts() {
    let mut s = registered(&[A, B, C]);
    s.acquire(
        A,
        &acq(AcquireAction::Acquire, ResvType::WriteExclusive, 0x10, 0),
    )
    .unwrap();
    let g = s.generation;
    let n = s
        .release(
            B,
            &rel(ReleaseAction::Clear, ResvType::WriteExclusive, 0x11),
        )
        .unwrap();
    assert_eq!(
        n,
        vec![
            (A, Notice::ReservationPreempted),
            (C, Notice::ReservationPreempted)
        ]
    );
    assert!(s.registrants.is_empty());
    assert_eq!(s.held, None);
    assert_eq!(s.generation, g + 1);
}

#[test]
fn preempt_the_holder_takes_the_reservation_and_unregisters_it() {
    let mut s = registered(&[A, B, C]);
    s.acquire(
        A,
        &acq(AcquireAction::Acquire, ResvType::WriteExclusive, 0x10, 0),
    )
    .unwrap();
    let g = s.generation;
    let p = acq(
        AcquireAction::Preempt,
        ResvType::ExclusiveAccess,
        0x11,
        0x10,
    );
    let n = s.acquire(B, &p).unwrap();
    assert_eq!(
        s.held,
        Some(Held {
            rtype: ResvType::ExclusiveAccess,
            holder: B
        })
    );
    assert!(!s.is_registered(&A));
    assert_eq!(s.generation, g + 1);
    assert_eq!(
        n,
        vec![
            (A, Notice::RegistrationPreempted),
            (C, Notice::ReservationPreempted)
        ]
    );
    // A is gone: its writes conflict, its register comes back.
    assert_eq!(
        s.access(&A, Access::Read),
        Err(Status::RESERVATION_CONFLICT)
    );
}

#[test]
fn preempt_a_non_holder_key_only_unregisters() {
    let mut s = registered(&[A, B, C]);
    s.acquire(
        A,
        &acq(AcquireAction::Acquire, ResvType::WriteExclusive, 0x10, 0),
    )
    .unwrap();
    let p = acq(AcquireAction::Preempt, ResvType::WriteExclusive, 0x11, 0x12);
    assert_eq!(
        s.acquire(B, &p),
        Ok(vec![(C, Notice::RegistrationPreempted)])
    );
    assert!(s.is_holder(&A));
    let none = acq(AcquireAction::Preempt, ResvType::WriteExclusive, 0x11, 0x77);
    assert_eq!(s.acquire(B, &none), Err(Status::RESERVATION_CONFLICT));
    let zero = acq(AcquireAction::Preempt, ResvType::WriteExclusive, 0x11, 0);
    assert_eq!(s.acquire(B, &zero), Err(Status::INVALID_FIELD));
}

#[test]
fn preempt_without_a_reservation_unregisters_the_key() {
    let mut s = registered(&[A, B]);
    let p = acq(
        AcquireAction::PreemptAndAbort,
        ResvType::WriteExclusive,
        0x10,
        0x11,
    );
    assert_eq!(
        s.acquire(A, &p),
        Ok(vec![(B, Notice::RegistrationPreempted)])
    );
    assert_eq!(s.held, None);
    assert_eq!(s.registrants.len(), 1);
}

#[test]
fn preempt_all_registrants_with_zero_key_takes_it_alone() {
    let mut s = registered(&[A, B, C]);
    let t = ResvType::ExclusiveAccessAllRegistrants;
    s.acquire(A, &acq(AcquireAction::Acquire, t, 0x10, 0))
        .unwrap();
    let p = acq(AcquireAction::Preempt, ResvType::WriteExclusive, 0x11, 0);
    s.acquire(B, &p).unwrap();
    assert_eq!(s.registrants.len(), 1);
    assert_eq!(
        s.held,
        Some(Held {
            rtype: ResvType::WriteExclusive,
            holder: B
        })
    );
}

#[test]
fn holder_preempting_itself_changes_the_type() {
    let mut s = registered(&[A, B]);
    s.acquire(
        A,
        &acq(AcquireAction::Acquire, ResvType::WriteExclusive, 0x10, 0),
    )
    .unwrap();
    let p = acq(
        AcquireAction::Preempt,
        ResvType::ExclusiveAccess,
        0x10,
        0x10,
    );
    s.acquire(A, &p).unwrap();
    assert!(s.is_registered(&A) && s.is_holder(&A));
    assert_eq!(s.held.map(|h| h.rtype), Some(ResvType::ExclusiveAccess));
}

#[test]
fn report_without_eds_refuses_128_bit_host_ids() {
    let s = registered(&[A]);
    assert_eq!(s.report(false), Err(HOST_ID_INCONSISTENT_FORMAT));
    let mut s = ResvState::default();
    let h = HostId::short([9; 8]);
    s.register(h, 4, &reg(RegisterAction::Register, 0, 7), false)
        .unwrap();
    let b = s.report(false).unwrap();
    assert_eq!(b.len(), 48);
    assert_eq!(&b[24 + 8..24 + 16], &[9; 8], "HOSTID at byte 8");
    assert_eq!(&b[24 + 16..24 + 24], &7u64.to_le_bytes(), "RKEY at byte 16");
}

#[test]
fn report_extended_layout_fixture() {
    let mut s = registered(&[A, B]);
    s.acquire(
        B,
        &acq(AcquireAction::Acquire, ResvType::ExclusiveAccess, 0x11, 0),
    )
    .unwrap();
    let b = s.report(true).unwrap();
    assert_eq!(b.len(), 64 * 3);
    assert_eq!(&b[0..4], &2u32.to_le_bytes(), "GEN");
    assert_eq!(b[4], 2, "RTYPE");
    assert_eq!(&b[5..7], &2u16.to_le_bytes(), "REGCTL");
    let e = &b[128..192];
    assert_eq!(&e[0..2], &2u16.to_le_bytes(), "CNTLID");
    assert_eq!(e[2], 1, "RCSTS: holds");
    assert_eq!(&e[8..16], &0x11u64.to_le_bytes(), "RKEY");
    assert_eq!(&e[16..32], &[2; 16], "HOSTID");
    assert_eq!(b[64 + 2], 0, "A does not hold");
}

fn host() -> impl Strategy<Value = HostId> {
    (any::<[u8; 16]>(), any::<bool>()).prop_map(|(mut b, ext)| {
        if !ext {
            b[8..].fill(0);
        }
        HostId {
            bytes: b,
            extended: ext,
        }
    })
}

proptest! {
    #[test]
    fn report_decodes_to_what_was_encoded(
        hosts in proptest::collection::vec((host(), any::<u64>(), any::<u16>()), 0..20),
        held in proptest::option::of((0usize..20, 0usize..6)),
        generation in any::<u32>(),
        ptpl in any::<bool>(),
        eds in any::<bool>(),
    ) {
        let mut s = ResvState { generation, ptpl, ..ResvState::default() };
        for (h, key, cntlid) in hosts {
            if !s.is_registered(&h) {
                s.registrants.push(Registrant { host: h, key, cntlid });
            }
        }
        if let Some((i, t)) = held {
            if let Some(r) = s.registrants.get(i % s.registrants.len().max(1)) {
                s.held = Some(Held { rtype: ResvType::ALL[t], holder: r.host });
            }
        }
        match s.report(eds) {
            Err(st) => {
                prop_assert!(!eds);
                prop_assert_eq!(st, HOST_ID_INCONSISTENT_FORMAT);
            }
            Ok(b) => {
                let v = decode_report(&b, eds).unwrap();
                prop_assert_eq!(v.generation, s.generation);
                prop_assert_eq!(v.rtype, s.held.map_or(0, |h| h.rtype.raw()));
                prop_assert_eq!(v.ptpl, s.ptpl);
                prop_assert_eq!(v.registrants.len(), s.registrants.len());
                for (got, r) in v.registrants.iter().zip(&s.registrants) {
                    prop_assert_eq!(got.0, r.cntlid);
                    prop_assert_eq!(got.1, s.is_holder(&r.host));
                    prop_assert_eq!(got.2.bytes, r.host.bytes);
                    prop_assert_eq!(got.3, r.key);
                }
            }
        }
    }

    /// Whatever sequence of commands arrives, the state stays coherent: a
    /// single holder is a registrant, a refused command changes nothing.
    #[test]
    fn any_command_sequence_keeps_the_state_coherent(
        cmds in proptest::collection::vec((0usize..3, 0u8..3, any::<u32>(), 0u64..4, 0u64..4), 0..60)
    ) {
        let hosts = [A, B, C];
        let mut s = ResvState::default();
        for (h, which, cdw10, k1, k2) in cmds {
            let host = hosts[h];
            let mut data = [0u8; 16];
            data[..8].copy_from_slice(&k1.to_le_bytes());
            data[8..].copy_from_slice(&k2.to_le_bytes());
            let before = s.clone();
            let r = match which {
                0 => Register::decode(cdw10, &data).and_then(|c| s.register(host, h as u16, &c, true)),
                1 => Acquire::decode(cdw10, &data).and_then(|c| s.acquire(host, &c)),
                _ => Release::decode(cdw10, &data).and_then(|c| s.release(host, &c)),
            };
            if r.is_err() {
                prop_assert_eq!(&s, &before);
            }
            if let Some(hd) = s.held {
                prop_assert!(s.is_registered(&hd.holder) || hd.rtype.all_registrants());
                prop_assert!(!s.registrants.is_empty());
            }
            let mut ids: Vec<_> = s.registrants.iter().map(|r| r.host).collect();
            ids.dedup();
            prop_assert_eq!(ids.len(), s.registrants.len());
        }
    }
}
