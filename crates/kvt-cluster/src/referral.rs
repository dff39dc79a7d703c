//! Discovery across nodes: each live peer in the member view becomes one
//! referral (discovery log entry subtype 01h) to its discovery service, so
//! `nvme discover` at any node shows the way to every node.
//!
//! A peer's record is peer-controlled text: a listener whose fields do not
//! parse (transport, address family, IP address, port) is refused here, so
//! what reaches the discovery log encoder is always a well-formed
//! `nvmf::Listener` (an IP address and a port number, whose texts fit their
//! 256- and 32-byte fields).

use super::member::{MemberListener, MemberRecord};
use kvt_nvmf::Listener;
use std::net::{IpAddr, SocketAddr};

/// Longest piece of a peer's text quoted in an error (a record may hold
/// anything).
const QUOTE_MAX: usize = 64;

/// Why a peer's listener cannot be referred to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReferralError {
    #[error("trtype `{0}` is neither tcp nor rdma")]
    Trtype(String),
    #[error("traddr `{0}` is no IP address")]
    Traddr(String),
    #[error("trsvcid `{0}` is no port number")]
    Trsvcid(String),
    #[error("adrfam `{adrfam}` does not match traddr `{traddr}`")]
    Adrfam { adrfam: String, traddr: String },
}

fn quote(s: &str) -> String {
    s.chars().take(QUOTE_MAX).collect()
}

/// A peer's listener as a referral target (`discovery_only`, since a
/// referral names a discovery service).
pub fn referral_listener(l: &MemberListener) -> Result<Listener, ReferralError> {
    let rdma = match l.trtype.as_str() {
        "tcp" => false,
        "rdma" => true,
        other => return Err(ReferralError::Trtype(quote(other))),
    };
    let ip: IpAddr = l
        .traddr
        .parse()
        .map_err(|_| ReferralError::Traddr(quote(&l.traddr)))?;
    let port: u16 = match l.trsvcid.parse() {
        Ok(p) if p != 0 => p,
        _ => return Err(ReferralError::Trsvcid(quote(&l.trsvcid))),
    };
    let family_ok = match l.adrfam.as_str() {
        "ipv4" => ip.is_ipv4(),
        "ipv6" => ip.is_ipv6(),
        _ => false,
    };
    if !family_ok {
        return Err(ReferralError::Adrfam {
            adrfam: quote(&l.adrfam),
            traddr: quote(&l.traddr),
        });
    }
    Ok(Listener {
        addr: SocketAddr::new(ip, port),
        discovery_only: true,
        portid: l.portid,
        rdma,
        secure: l.secure,
    })
}

/// A member's discovery service: its first usable discovery-only listener,
/// else its first usable listener (every NVMe-oF port of kvtarget answers
/// for the discovery NQN). `None` when it has no usable listener.
pub fn discovery_port(m: &MemberRecord) -> Option<Listener> {
    let discovery_first = m
        .listeners
        .iter()
        .filter(|l| l.discovery)
        .chain(m.listeners.iter().filter(|l| !l.discovery));
    let mut refused = None;
    for l in discovery_first {
        match referral_listener(l) {
            Ok(r) => return Some(r),
            Err(e) => refused = refused.or(Some(e)),
        }
    }
    if let Some(e) = refused {
        tracing::debug!("cluster: no referral to member `{}`: {e}", quote(&m.name));
    }
    None
}

/// One referral per live peer (every member but `me`), in the members'
/// order, without duplicates (two records naming one address).
pub fn referrals(members: &[MemberRecord], me: &str) -> Vec<Listener> {
    let mut out: Vec<Listener> = Vec::new();
    for r in members
        .iter()
        .filter(|m| m.name != me)
        .filter_map(discovery_port)
    {
        if !out.iter().any(|o| o.addr == r.addr && o.rdma == r.rdma) {
            out.push(r);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::member::RECORD_FORMAT;
    use kvt_nvmf::{Target, TransportLimits};
    use kvt_wire::nvme;
    use proptest::prelude::*;

    fn listener(trtype: &str, adrfam: &str, traddr: &str, trsvcid: &str) -> MemberListener {
        MemberListener {
            trtype: trtype.into(),
            adrfam: adrfam.into(),
            traddr: traddr.into(),
            trsvcid: trsvcid.into(),
            discovery: false,
            portid: 0,
            secure: false,
        }
    }

    fn member(name: &str, listeners: Vec<MemberListener>) -> MemberRecord {
        MemberRecord {
            format: RECORD_FORMAT,
            name: name.into(),
            instance: "00".into(),
            listeners,
            subsystems: Vec::new(),
            metrics_url: None,
            version: "0.1.0".into(),
            started_at: 0,
        }
    }

    #[test]
    fn a_peer_listener_becomes_a_discovery_listener() {
        let mut l = listener("rdma", "ipv6", "fd00::7", "4420");
        l.portid = 5;
        l.secure = true;
        assert_eq!(
            referral_listener(&l),
            Ok(Listener {
                addr: "[fd00::7]:4420".parse().unwrap(),
                discovery_only: true,
                portid: 5,
                rdma: true,
                secure: true,
            })
        );
    }

    #[test]
    fn malformed_peer_listeners_are_refused_by_field() {
        let cases = [
            (listener("fc", "ipv4", "10.0.0.1", "8009"), "trtype"),
            (listener("tcp", "ipv4", "node-b.local", "8009"), "traddr"),
            (listener("tcp", "ipv4", "10.0.0.1", "http"), "trsvcid"),
            (listener("tcp", "ipv4", "10.0.0.1", "70000"), "trsvcid"),
            (listener("tcp", "ipv4", "10.0.0.1", "0"), "trsvcid"),
            (listener("tcp", "ipv6", "10.0.0.1", "8009"), "adrfam"),
            (listener("tcp", "ib", "10.0.0.1", "8009"), "adrfam"),
        ];
        for (l, field) in cases {
            let e = referral_listener(&l).unwrap_err();
            assert!(e.to_string().starts_with(field), "{l:?}: {e}");
        }
        let long = "9".repeat(100_000);
        let e = referral_listener(&listener("tcp", "ipv4", "10.0.0.1", &long)).unwrap_err();
        assert!(e.to_string().len() < 100, "quotes are cut: {e}");
    }

    #[test]
    fn one_referral_per_live_peer_to_its_discovery_port_never_itself() {
        let mut disc = listener("tcp", "ipv4", "10.0.0.2", "8009");
        disc.discovery = true;
        let members = vec![
            member("a", vec![listener("tcp", "ipv4", "10.0.0.1", "4420")]),
            member("b", vec![listener("tcp", "ipv4", "10.0.0.2", "4420"), disc]),
            member("c", vec![listener("tcp", "ipv4", "10.0.0.3", "4420")]),
            member("d", vec![listener("tcp", "ipv4", "bad", "4420")]),
            member("e", Vec::new()),
            // A second record naming c's port: referred to once.
            member("f", vec![listener("tcp", "ipv4", "10.0.0.3", "4420")]),
        ];
        let addrs: Vec<String> = referrals(&members, "a")
            .iter()
            .map(|l| l.addr.to_string())
            .collect();
        assert_eq!(addrs, ["10.0.0.2:8009", "10.0.0.3:4420"]);
        assert!(referrals(&members[..1], "a").is_empty(), "alone: none");
    }

    proptest! {
        /// Whatever a peer's record says, building and encoding its referral
        /// never panics, and what is encoded reads back as the peer's port.
        #[test]
        fn any_peer_record_encodes_safely(
            trtype in prop::sample::select(vec!["tcp", "rdma", "", "fc"]),
            adrfam in prop::sample::select(vec!["ipv4", "ipv6", "x"]),
            traddr in prop_oneof![
                any::<std::net::Ipv4Addr>().prop_map(|a| a.to_string()),
                any::<std::net::Ipv6Addr>().prop_map(|a| a.to_string()),
                ".{0,300}",
            ],
            trsvcid in prop_oneof![any::<u16>().prop_map(|p| p.to_string()), ".{0,40}"],
        ) {
            let l = listener(trtype, adrfam, &traddr, &trsvcid);
            let Ok(r) = referral_listener(&l) else { return Ok(()) };
            let t = Target::new(TransportLimits::default());
            t.set_referrals(vec![r]);
            let page = nvme::encode_discovery_log(1, &t.discovery_entries("nqn.h"));
            let (_, entries) = nvme::decode_discovery_log(&page);
            prop_assert_eq!(entries.len(), 1);
            let e = &entries[0];
            prop_assert_eq!(e.subtype, nvme::subtype::REFERRAL);
            prop_assert_eq!(e.subnqn.as_str(), nvme::DISCOVERY_NQN);
            let ip: IpAddr = traddr.parse().unwrap();
            prop_assert_eq!(e.traddr.parse::<IpAddr>().ok(), Some(ip));
            prop_assert_eq!(e.trsvcid.parse::<u16>().ok(), trsvcid.parse::<u16>().ok());
        }
    }
}
