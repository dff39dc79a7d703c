use super::*;

fn g(n: u32) -> GroupId {
    GroupId {
        subnqn: "nqn.2016-06.io.kvtarget:s".into(),
        anagrpid: n,
    }
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

fn machine() -> Ownership {
    Ownership::new("a", ms(2000), [g(1), g(2)])
}

#[test]
fn starts_fenced_and_follows_with_a_lease() {
    let mut o = machine();
    assert!(o.roles().iter().all(|(_, r)| *r == Role::Fenced));
    assert!(o.campaigns(ms(0)).is_empty());
    o.apply(
        Input::LeaseGranted {
            lease: 7,
            sent: ms(0),
        },
        ms(5),
    );
    assert_eq!(o.role(&g(1)), Role::Follower);
    assert_eq!(o.campaigns(ms(10)), vec![g(1), g(2)]);
}

#[test]
fn wins_then_fences_at_half_the_ttl_after_the_last_send() {
    let mut o = machine();
    o.apply(
        Input::LeaseGranted {
            lease: 7,
            sent: ms(0),
        },
        ms(5),
    );
    let won = Input::Won {
        group: g(1),
        lease: 7,
        revision: 42,
    };
    assert!(o.apply(won, ms(10)));
    assert_eq!(o.role(&g(1)), Role::Owner { epoch: 42 });
    // A keep-alive sent at 400 and answered late still counts from 400.
    o.apply(
        Input::KeepAliveAnswered {
            lease: 7,
            sent: ms(400),
        },
        ms(900),
    );
    assert!(!o.tick(ms(1399)));
    assert!(o.role(&g(1)).optimized());
    assert!(o.tick(ms(1400)));
    assert_eq!(o.role(&g(1)), Role::Fenced);
    assert!(o.is_spent(7));
    // The fenced lease is never trusted again, even if etcd still knows it.
    o.apply(
        Input::KeepAliveAnswered {
            lease: 7,
            sent: ms(1500),
        },
        ms(1510),
    );
    o.apply(
        Input::LeaseGranted {
            lease: 7,
            sent: ms(1500),
        },
        ms(1510),
    );
    assert!(o.needs_lease(ms(1520)));
    // A fresh one makes it a follower; its old key blocks it until gone.
    o.apply(
        Input::LeaseGranted {
            lease: 8,
            sent: ms(1600),
        },
        ms(1610),
    );
    let old = Holder {
        node: "a".into(),
        lease: 7,
        epoch: 42,
    };
    o.apply(
        Input::Seen {
            group: g(1),
            holder: Some(old),
        },
        ms(1620),
    );
    assert_eq!(o.role(&g(1)), Role::Follower);
}

#[test]
fn a_late_grant_is_not_trusted() {
    let mut o = machine();
    o.apply(
        Input::LeaseGranted {
            lease: 7,
            sent: ms(0),
        },
        ms(1000),
    );
    assert!(o.needs_lease(ms(1000)));
    assert!(o.is_spent(7));
}

#[test]
fn a_win_with_a_lease_fenced_meanwhile_is_not_taken() {
    let mut o = machine();
    o.apply(
        Input::LeaseGranted {
            lease: 7,
            sent: ms(0),
        },
        ms(5),
    );
    let won = Input::Won {
        group: g(2),
        lease: 7,
        revision: 9,
    };
    o.apply(won, ms(1000));
    assert_eq!(o.role(&g(2)), Role::Fenced);
}

#[test]
fn another_holder_or_a_gone_lease_ends_ownership() {
    let mut o = machine();
    o.apply(
        Input::LeaseGranted {
            lease: 7,
            sent: ms(0),
        },
        ms(5),
    );
    o.apply(
        Input::Won {
            group: g(1),
            lease: 7,
            revision: 3,
        },
        ms(6),
    );
    let other = Holder {
        node: "b".into(),
        lease: 11,
        epoch: 5,
    };
    o.apply(
        Input::Seen {
            group: g(1),
            holder: Some(other.clone()),
        },
        ms(7),
    );
    assert_eq!(o.role(&g(1)), Role::Follower);
    assert_eq!(o.holder(&g(1)), Some(&other));
    // Our own key seen again (a win whose answer was lost) makes us owner.
    let mine = Holder {
        node: "a".into(),
        lease: 7,
        epoch: 8,
    };
    o.apply(
        Input::Seen {
            group: g(2),
            holder: Some(mine),
        },
        ms(8),
    );
    assert_eq!(o.role(&g(2)), Role::Owner { epoch: 8 });
    o.apply(Input::LeaseGone { lease: 7 }, ms(9));
    assert!(o.roles().iter().all(|(_, r)| *r == Role::Fenced));
}

#[test]
fn a_resigned_owner_follows_and_sits_the_group_out_until_told() {
    let mut o = machine();
    o.apply(
        Input::LeaseGranted {
            lease: 7,
            sent: ms(0),
        },
        ms(5),
    );
    o.apply(
        Input::Won {
            group: g(1),
            lease: 7,
            revision: 42,
        },
        ms(10),
    );
    let resigned = Input::Resigned {
        group: g(1),
        epoch: 42,
        until: ms(900),
    };
    assert!(o.apply(resigned, ms(20)));
    assert_eq!(o.role(&g(1)), Role::Follower);
    // The other group is campaigned for; this one only once `until` passed.
    assert_eq!(o.campaigns(ms(899)), vec![g(2)]);
    o.apply(
        Input::KeepAliveAnswered {
            lease: 7,
            sent: ms(890),
        },
        ms(895),
    );
    assert_eq!(o.campaigns(ms(900)), vec![g(1), g(2)]);
    // The delete was lost: its own key at the resigned epoch is read back.
    // Not ownership; the delete is due again.
    let mine = Holder {
        node: "a".into(),
        lease: 7,
        epoch: 42,
    };
    o.apply(
        Input::Seen {
            group: g(1),
            holder: Some(mine),
        },
        ms(901),
    );
    assert_eq!(o.role(&g(1)), Role::Follower);
    assert_eq!(o.resignations_due(), vec![(g(1), 42)]);
    // A late answer to the campaign that won epoch 42 is no win either.
    o.apply(
        Input::Won {
            group: g(1),
            lease: 7,
            revision: 42,
        },
        ms(902),
    );
    assert_eq!(o.role(&g(1)), Role::Follower);
    // Won again later, with a newer epoch.
    o.apply(
        Input::Won {
            group: g(1),
            lease: 7,
            revision: 50,
        },
        ms(905),
    );
    assert_eq!(o.role(&g(1)), Role::Owner { epoch: 50 });
    assert_eq!(o.resignations_due(), Vec::new());
}
