//! The target model: subsystems, namespaces, listeners and discovery.

use crate::*;
use kvt_bdev::ram::RamDevice;

fn target() -> Target {
    let t = Target::new(TransportLimits::default());
    t.listeners.write().unwrap().push(Listener {
        addr: "127.0.0.1:4420".parse().unwrap(),
        discovery_only: false,
        portid: 1,
        rdma: false,
        secure: false,
    });
    t.listeners.write().unwrap().push(Listener {
        addr: "127.0.0.1:8009".parse().unwrap(),
        discovery_only: true,
        portid: 2,
        rdma: false,
        secure: false,
    });
    t.listeners.write().unwrap().push(Listener {
        addr: "10.0.0.1:4420".parse().unwrap(),
        discovery_only: false,
        portid: 3,
        rdma: true,
        secure: false,
    });
    t.add_subsystem(Arc::new(Subsystem::new(
        "nqn.a",
        SubsystemKind::Nvm,
        "S",
        "M",
        false,
        vec!["nqn.host1".into()],
    )));
    t.add_subsystem(Arc::new(Subsystem::new(
        "nqn.open",
        SubsystemKind::Nvm,
        "S",
        "M",
        true,
        vec![],
    )));
    t
}

#[test]
fn discovery_lists_only_allowed_subsystems() {
    let t = target();
    let host1: Vec<_> = t
        .discovery_entries("nqn.host1")
        .into_iter()
        .map(|e| (e.subnqn, e.trsvcid, e.subtype))
        .collect();
    assert!(host1.contains(&("nqn.a".into(), "4420".into(), 2)));
    assert!(host1.contains(&("nqn.open".into(), "4420".into(), 2)));
    // The discovery-only port is listed for discovery, not as an NVM port.
    assert!(!host1.iter().any(|(n, p, _)| n == "nqn.a" && p == "8009"));
    assert!(host1.contains(&(nvme::DISCOVERY_NQN.into(), "8009".into(), 3)));
    // The RDMA listener is listed with its transport type.
    let rdma: Vec<_> = t
        .discovery_entries("nqn.host1")
        .into_iter()
        .filter(|e| e.traddr == "10.0.0.1")
        .collect();
    assert!(rdma.iter().all(|e| e.trtype == nvme::trtype::RDMA));
    assert!(rdma.iter().any(|e| e.subnqn == "nqn.a"));
    let mut raw = [0u8; 1024];
    rdma[0].encode(&mut raw);
    assert_eq!(&raw[768..771], &[1, 1, 1]);
    let other = t.discovery_entries("nqn.stranger");
    assert!(!other.iter().any(|e| e.subnqn == "nqn.a"));
    assert!(other.iter().any(|e| e.subnqn == "nqn.open"));
}

#[test]
fn identifiers_are_stable_and_distinct() {
    let dev = RamDevice::new("x", 1 << 20).unwrap();
    let a = Namespace::new("nqn.a", 1, dev.clone(), 512);
    let b = Namespace::new("nqn.a", 1, dev.clone(), 512);
    let c = Namespace::new("nqn.a", 2, dev, 512);
    assert_eq!(a.uuid, b.uuid);
    assert_ne!(a.uuid, c.uuid);
    assert_ne!(a.key, b.key);
    assert_eq!(a.num_blocks, 2048);
    assert_eq!(a.lbads(), 9);
}

fn peer(addr: &str, rdma: bool, secure: bool) -> Listener {
    Listener {
        addr: addr.parse().unwrap(),
        discovery_only: true,
        portid: 7,
        rdma,
        secure,
    }
}

#[test]
fn referrals_follow_the_own_entries_field_by_field() {
    let t = target();
    let own = t.discovery_entries("nqn.host1");
    assert!(t.set_referrals(vec![
        peer("127.0.0.2:8009", false, false),
        peer("[fd00::2]:4420", false, true),
    ]));
    let all = t.discovery_entries("nqn.host1");
    assert_eq!(all[..own.len()], own[..], "own entries unchanged, first");
    assert_eq!(all.len(), own.len() + 2);
    let page = nvme::encode_discovery_log(9, &all[own.len()..]);
    let e = &page[nvme::DISCOVERY_LOG_HEADER_LEN..][..nvme::DISCOVERY_LOG_ENTRY_LEN];
    assert_eq!(e[0], 3, "TRTYPE TCP");
    assert_eq!(e[1], 1, "ADRFAM IPv4");
    assert_eq!(e[2], 1, "SUBTYPE referral to another discovery service");
    assert_eq!(e[3], 2, "TREQ secure channel not required");
    assert_eq!(u16::from_le_bytes([e[4], e[5]]), 7, "PORTID");
    assert_eq!(u16::from_le_bytes([e[6], e[7]]), 0xFFFF, "CNTLID dynamic");
    assert_eq!(u16::from_le_bytes([e[8], e[9]]), 32, "ASQSZ");
    assert_eq!(u16::from_le_bytes([e[10], e[11]]), 0, "EFLAGS");
    assert!(e[12..32].iter().all(|&b| b == 0), "reserved");
    assert_eq!(&e[32..36], b"8009");
    assert!(e[36..64].iter().all(|&b| b == b' '), "TRSVCID space padded");
    assert_eq!(&e[256..256 + 36], nvme::DISCOVERY_NQN.as_bytes());
    assert_eq!(e[256 + 36], 0, "SUBNQN NUL terminated");
    assert_eq!(&e[512..521], b"127.0.0.2");
    assert!(
        e[521..768].iter().all(|&b| b == b' '),
        "TRADDR space padded"
    );
    assert_eq!(e[768], 0, "TSAS: no security");
    let v6 = &all[own.len() + 1];
    assert_eq!(
        (
            v6.adrfam,
            v6.treq,
            v6.sectype,
            v6.traddr.as_str(),
            v6.trsvcid.as_str()
        ),
        (2, 1, 2, "fd00::2", "4420"),
        "IPv6, TLS required, TLS 1.3"
    );
}

#[test]
fn without_referrals_the_log_and_its_generation_are_as_before() {
    let t = target();
    let genctr = t.genctr.load(Ordering::Relaxed);
    let page = |t: &Target| {
        nvme::encode_discovery_log(
            t.genctr.load(Ordering::Relaxed),
            &t.discovery_entries("nqn.host1"),
        )
    };
    let before = page(&t);
    assert!(!t.set_referrals(Vec::new()), "none before, none now");
    assert_eq!(t.genctr.load(Ordering::Relaxed), genctr);
    assert_eq!(page(&t), before);
    assert!(t.set_referrals(vec![peer("127.0.0.2:8009", false, false)]));
    assert!(t.set_referrals(Vec::new()));
    assert_eq!(t.genctr.load(Ordering::Relaxed), genctr + 2);
    assert_eq!(page(&t)[8..], before[8..], "the same entries again");
}
