//! The target model: subsystems, namespaces, listeners and discovery.

use crate::bdev::ram::RamDevice;
use crate::nvmf::*;

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
