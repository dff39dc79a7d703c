use super::*;
use proptest::prelude::*;

#[test]
fn states_have_spdk_names_log_values_and_statuses() {
    let want = [
        ("optimized", 0x01, None),
        ("non_optimized", 0x02, None),
        ("inaccessible", 0x03, Some((3, 0x02))),
        ("persistent_loss", 0x04, Some((3, 0x01))),
        ("change", 0x0F, Some((3, 0x03))),
    ];
    for (st, (name, v, status)) in ANA_STATES.into_iter().zip(want) {
        assert_eq!(st.name(), name);
        assert_eq!(AnaState::parse(name), Ok(st));
        assert_eq!(st as u8, v);
        assert_eq!(AnaState::from_u8(v), Some(st));
        assert_eq!(st.io_status().map(|s| (s.sct, s.sc)), status);
        assert!(st.io_status().map_or(true, |s| !s.dnr));
    }
    assert_eq!(AnaState::parse("Non_Optimized"), Ok(AnaState::NonOptimized));
    for bad in ["", "ana_change", "5", "optimised"] {
        let err = AnaState::parse(bad).unwrap_err();
        assert_eq!(err.field(), "ana_state", "{err}");
    }
    assert_eq!(AnaState::from_u8(0), None);
    assert_eq!(AnaState::from_u8(5), None);
}

#[test]
fn groups_are_checked() {
    assert_eq!(check_group(1), Ok(1));
    assert_eq!(check_group(MAX_ANA_GROUPS as u64), Ok(MAX_ANA_GROUPS));
    for bad in [0, MAX_ANA_GROUPS as u64 + 1, 1 << 32] {
        assert_eq!(check_group(bad), Err(AnaError::UnknownGroup(bad)));
    }
}

#[test]
fn a_path_starts_optimized_and_keeps_each_group_apart() {
    let p = PathAna::new("127.0.0.1:4420".parse().unwrap());
    assert!((1..=MAX_ANA_GROUPS).all(|g| p.state(g) == AnaState::Optimized));
    assert!(p.set(2, AnaState::Change));
    assert!(!p.set(2, AnaState::Change), "no change the second time");
    assert_eq!(p.state(1), AnaState::Optimized);
    assert_eq!(p.state(2), AnaState::Change);
    assert_eq!(p.changed_groups(), vec![(2, AnaState::Change)]);
    // Outside the groups: never served.
    assert_eq!(p.state(0), AnaState::Inaccessible);
    assert_eq!(p.state(MAX_ANA_GROUPS + 1), AnaState::Inaccessible);
}

#[test]
fn every_transition_between_states_is_allowed() {
    let p = PathAna::new("127.0.0.1:4420".parse().unwrap());
    for from in ANA_STATES {
        for to in ANA_STATES {
            p.set(1, from);
            assert_eq!(p.set(1, to), from != to);
            assert_eq!(p.state(1), to);
        }
    }
}

#[test]
fn subsystem_paths_are_made_once_and_forgotten() {
    let a: SocketAddr = "127.0.0.1:4420".parse().unwrap();
    let t = SubsystemAna::default();
    let p = t.path(a);
    assert!(Arc::ptr_eq(&p, &t.path(a)));
    assert_eq!(t.paths().len(), 1);
    t.forget(a);
    assert!(t.find(a).is_none());
}

#[test]
fn the_log_page_layout_is_the_specifications() {
    let log = AnaLog {
        change_count: 0x0102_0304_0506_0708,
        groups: vec![
            AnaGroupDescriptor {
                anagrpid: 5,
                change_count: 9,
                state: AnaState::Inaccessible as u8,
                nsids: vec![5, 6],
            },
            AnaGroupDescriptor {
                anagrpid: 7,
                change_count: 9,
                state: AnaState::Change as u8,
                nsids: vec![],
            },
        ],
    };
    let b = log.encode();
    assert_eq!(b.len(), 16 + 32 + 8 + 32);
    assert_eq!(b[0..8], 0x0102_0304_0506_0708u64.to_le_bytes());
    assert_eq!(b[8..10], [2, 0]);
    assert_eq!(b[16..20], 5u32.to_le_bytes());
    assert_eq!(b[20..24], 2u32.to_le_bytes());
    assert_eq!(b[24..32], 9u64.to_le_bytes());
    assert_eq!(b[32], 0x03);
    assert!(b[33..48].iter().all(|&x| x == 0), "reserved");
    assert_eq!(b[48..56], [5, 0, 0, 0, 6, 0, 0, 0]);
    assert_eq!(b[56..60], 7u32.to_le_bytes());
    assert_eq!(b[72], 0x0F);
}

fn arb_log() -> impl Strategy<Value = (AnaLog, bool)> {
    let group = (
        1..=MAX_ANA_GROUPS,
        any::<u64>(),
        prop::sample::select(ANA_STATES.to_vec()),
        prop::collection::vec(1u32..=1024, 0..8),
    );
    (
        any::<u64>(),
        prop::collection::vec(group, 0..12),
        any::<bool>(),
    )
        .prop_map(|(cc, groups, rgo)| {
            let groups = groups
                .into_iter()
                .map(|(anagrpid, change_count, st, nsids)| AnaGroupDescriptor {
                    anagrpid,
                    change_count,
                    state: st as u8,
                    nsids: if rgo { Vec::new() } else { nsids },
                })
                .collect();
            (
                AnaLog {
                    change_count: cc,
                    groups,
                },
                rgo,
            )
        })
}

proptest! {
    /// Decode what is encoded; the size is the header, 32 bytes per group
    /// and 4 per NSID (none with RGO); a cut page never decodes.
    #[test]
    fn the_log_page_decodes_what_it_encodes((log, rgo) in arb_log()) {
        let b = log.encode();
        let nsids: usize = log.groups.iter().map(|g| g.nsids.len()).sum();
        prop_assert_eq!(b.len(), log.len());
        prop_assert_eq!(b.len(), ANA_LOG_HEADER_LEN + ANA_DESCRIPTOR_LEN * log.groups.len() + 4 * nsids);
        if rgo {
            prop_assert_eq!(nsids, 0);
        }
        prop_assert_eq!(AnaLog::decode(&b), Some(log.clone()));
        if !log.groups.is_empty() {
            prop_assert_eq!(AnaLog::decode(&b[..b.len() - 1]), None);
        }
    }

    /// Any bytes: a page or None, never a panic.
    #[test]
    fn decoding_never_panics(b in prop::collection::vec(any::<u8>(), 0..256)) {
        if let Some(l) = AnaLog::decode(&b) {
            prop_assert!(l.len() <= b.len());
        }
    }
}
