//! A member record: what a node serves, as it puts it under
//! `/kvtarget/<cluster>/members/<node>` (JSON, bound to its lease), so a host
//! library or a KV-cache manager can find every node and what it serves.

use kvt_nvmf::{CommandSet, SubsystemKind, Target};
use kvt_wire::ident::{hex, uuid_text};
use serde::{Deserialize, Serialize};
use std::sync::atomic::Ordering;

/// Version of the record's format (`format`); a reader skips records of a
/// newer major format rather than misread them.
pub const RECORD_FORMAT: u32 = 1;

/// One NVMe-oF port of a node, in the discovery log's terms.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberListener {
    /// TRTYPE: "tcp" or "rdma".
    pub trtype: String,
    /// ADRFAM: "ipv4" or "ipv6".
    pub adrfam: String,
    /// TRADDR.
    pub traddr: String,
    /// TRSVCID (the port, as text).
    pub trsvcid: String,
    /// A discovery-only port: what other nodes' discovery logs refer hosts
    /// to (`cluster::referral`).
    #[serde(default)]
    pub discovery: bool,
    /// PORTID in this node's discovery log (absent in records before it).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub portid: u16,
    /// NVMe/TCP with TLS required (absent: not required).
    #[serde(default, skip_serializing_if = "is_false")]
    pub secure: bool,
}

fn is_zero(v: &u16) -> bool {
    *v == 0
}

fn is_false(v: &bool) -> bool {
    !*v
}

/// A namespace's identity: what must match across nodes that serve it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberNamespace {
    pub nsid: u32,
    /// Command set: "nvm" or "kv".
    pub csi: String,
    /// NGUID and UUID as hex / canonical text.
    pub nguid: String,
    pub uuid: String,
    /// Size in blocks (NSZE), block size in bytes and ANA group (absent in
    /// records before them: not compared).
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub nsze: u64,
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub block_size: u32,
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub anagrpid: u32,
}

fn is_zero_u64(v: &u64) -> bool {
    *v == 0
}

fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberSubsystem {
    pub nqn: String,
    pub namespaces: Vec<MemberNamespace>,
    /// Served by several nodes under one identity (`cluster_wide = true`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub cluster_wide: bool,
}

/// The record itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberRecord {
    pub format: u32,
    pub name: String,
    /// Drawn at each start: a record with this node's name and another
    /// instance belongs to another process.
    pub instance: String,
    pub listeners: Vec<MemberListener>,
    pub subsystems: Vec<MemberSubsystem>,
    /// `http://addr/metrics`, when the node has a metrics endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_url: Option<String>,
    pub version: String,
    /// Seconds since the Unix epoch when the process started.
    pub started_at: u64,
}

/// What of a record changes with the served configuration.
pub struct Served {
    pub listeners: Vec<MemberListener>,
    pub subsystems: Vec<MemberSubsystem>,
}

/// The target's listeners and NVM subsystems as they are now;
/// `cluster_wide` names the subsystems served by several nodes.
pub fn served(target: &Target, cluster_wide: &[String]) -> Served {
    let listeners = target
        .listeners
        .read()
        .map(|l| l.clone())
        .unwrap_or_default()
        .iter()
        .map(|l| MemberListener {
            trtype: if l.rdma { "rdma" } else { "tcp" }.into(),
            adrfam: if l.addr.is_ipv4() { "ipv4" } else { "ipv6" }.into(),
            traddr: l.addr.ip().to_string(),
            trsvcid: l.addr.port().to_string(),
            discovery: l.discovery_only,
            portid: l.portid,
            secure: l.secure,
        })
        .collect();
    let subs = target
        .subsystems
        .read()
        .map(|s| s.clone())
        .unwrap_or_default();
    let subsystems = subs
        .iter()
        .filter(|s| s.kind != SubsystemKind::Discovery)
        .map(|s| MemberSubsystem {
            nqn: s.nqn.clone(),
            cluster_wide: cluster_wide.contains(&s.nqn),
            namespaces: s
                .namespaces
                .read()
                .map(|n| n.clone())
                .unwrap_or_default()
                .iter()
                .map(|n| MemberNamespace {
                    nsid: n.nsid,
                    csi: match n.command_set {
                        CommandSet::Nvm => "nvm",
                        CommandSet::KeyValue => "kv",
                    }
                    .into(),
                    nguid: hex(&n.nguid),
                    uuid: uuid_text(&n.uuid),
                    nsze: n.num_blocks,
                    block_size: n.block_size,
                    anagrpid: n.ana_group.load(Ordering::Relaxed),
                })
                .collect(),
        })
        .collect();
    Served {
        listeners,
        subsystems,
    }
}

/// How this node's cluster-wide subsystems differ from `peer`'s: one line
/// naming the subsystem, the namespace and the field, or None when every
/// one `peer` also serves is the same there (same NSIDs, command set, size,
/// block size, ANA group and identifiers). A subsystem `peer` does not serve
/// is no conflict: not every node need serve every subsystem.
pub fn mismatch(ours: &[MemberSubsystem], peer: &MemberRecord) -> Option<String> {
    for mine in ours.iter().filter(|s| s.cluster_wide) {
        let Some(theirs) = peer.subsystems.iter().find(|s| s.nqn == mine.nqn) else {
            continue;
        };
        let at = format!("subsystem `{}` on node `{}`", mine.nqn, peer.name);
        if !theirs.cluster_wide {
            return Some(format!("{at} is not cluster_wide there"));
        }
        for n in &mine.namespaces {
            let Some(t) = theirs.namespaces.iter().find(|t| t.nsid == n.nsid) else {
                return Some(format!("{at}: namespace {} is not served there", n.nsid));
            };
            if let Some(field) = namespace_difference(n, t) {
                return Some(format!("{at}: namespace {} {field}", n.nsid));
            }
        }
        if let Some(t) = theirs
            .namespaces
            .iter()
            .find(|t| !mine.namespaces.iter().any(|n| n.nsid == t.nsid))
        {
            return Some(format!(
                "{at}: namespace {} is served there, not here",
                t.nsid
            ));
        }
    }
    None
}

/// The first field in which two records of one NSID differ, as "FIELD is
/// HERE here, THERE there"; a zero (a record before the field) is not compared.
fn namespace_difference(a: &MemberNamespace, b: &MemberNamespace) -> Option<String> {
    let differs = |x: u64, y: u64| x != 0 && y != 0 && x != y;
    let text = [
        ("command set", a.csi != b.csi, a.csi.clone(), b.csi.clone()),
        (
            "size (blocks)",
            differs(a.nsze, b.nsze),
            a.nsze.to_string(),
            b.nsze.to_string(),
        ),
        (
            "block size",
            differs(a.block_size.into(), b.block_size.into()),
            a.block_size.to_string(),
            b.block_size.to_string(),
        ),
        (
            "ana_group",
            differs(a.anagrpid.into(), b.anagrpid.into()),
            a.anagrpid.to_string(),
            b.anagrpid.to_string(),
        ),
        (
            "NGUID",
            a.nguid != b.nguid,
            a.nguid.clone(),
            b.nguid.clone(),
        ),
        ("UUID", a.uuid != b.uuid, a.uuid.clone(), b.uuid.clone()),
    ];
    text.into_iter()
        .find(|(_, d, _, _)| *d)
        .map(|(field, _, here, there)| format!("{field} is {here} here, {there} there"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_json_is_stable() {
        let r = MemberRecord {
            format: RECORD_FORMAT,
            name: "n1".into(),
            instance: "00ff".into(),
            listeners: vec![MemberListener {
                trtype: "tcp".into(),
                adrfam: "ipv4".into(),
                traddr: "127.0.0.1".into(),
                trsvcid: "4420".into(),
                discovery: false,
                portid: 0,
                secure: false,
            }],
            subsystems: vec![MemberSubsystem {
                nqn: "nqn.2024-01.io.kvtarget:a".into(),
                namespaces: vec![MemberNamespace {
                    nsid: 1,
                    csi: "kv".into(),
                    nguid: "00".repeat(16),
                    uuid: uuid_text(&[0; 16]),
                    nsze: 0,
                    block_size: 0,
                    anagrpid: 0,
                }],
                cluster_wide: false,
            }],
            metrics_url: None,
            version: "0.1.0".into(),
            started_at: 1,
        };
        let text = r#"{"format":1,"name":"n1","instance":"00ff","listeners":[{"trtype":"tcp","adrfam":"ipv4","traddr":"127.0.0.1","trsvcid":"4420","discovery":false}],"subsystems":[{"nqn":"nqn.2024-01.io.kvtarget:a","namespaces":[{"nsid":1,"csi":"kv","nguid":"00000000000000000000000000000000","uuid":"00000000-0000-0000-0000-000000000000"}]}],"version":"0.1.0","started_at":1}"#;
        assert_eq!(serde_json::to_string(&r).unwrap(), text);
        assert_eq!(serde_json::from_str::<MemberRecord>(text).unwrap(), r);
    }

    #[test]
    fn a_listener_carries_its_portid_and_tls_and_old_ones_decode() {
        let l = MemberListener {
            trtype: "tcp".into(),
            adrfam: "ipv4".into(),
            traddr: "10.0.0.1".into(),
            trsvcid: "8009".into(),
            discovery: true,
            portid: 3,
            secure: true,
        };
        let text = r#"{"trtype":"tcp","adrfam":"ipv4","traddr":"10.0.0.1","trsvcid":"8009","discovery":true,"portid":3,"secure":true}"#;
        assert_eq!(serde_json::to_string(&l).unwrap(), text);
        // A record of the first slice: no `portid`, `secure` (nor `discovery`).
        let old = r#"{"trtype":"tcp","adrfam":"ipv4","traddr":"10.0.0.1","trsvcid":"8009"}"#;
        let l = serde_json::from_str::<MemberListener>(old).unwrap();
        assert_eq!((l.discovery, l.portid, l.secure), (false, 0, false));
    }

    fn ns(nsid: u32, nsze: u64) -> MemberNamespace {
        MemberNamespace {
            nsid,
            csi: "nvm".into(),
            nguid: format!("{nsid:032x}"),
            uuid: uuid_text(&[nsid as u8; 16]),
            nsze,
            block_size: 4096,
            anagrpid: 1,
        }
    }

    fn sub(cluster_wide: bool, namespaces: Vec<MemberNamespace>) -> MemberSubsystem {
        MemberSubsystem {
            nqn: "nqn.2026-12.io.kvtarget:wide".into(),
            namespaces,
            cluster_wide,
        }
    }

    fn peer(subsystems: Vec<MemberSubsystem>) -> MemberRecord {
        MemberRecord {
            format: RECORD_FORMAT,
            name: "b".into(),
            instance: "01".into(),
            listeners: Vec::new(),
            subsystems,
            metrics_url: None,
            version: "0.1.0".into(),
            started_at: 1,
        }
    }

    #[test]
    fn a_peer_serving_a_cluster_wide_subsystem_otherwise_is_named_with_the_field() {
        let ours = [sub(true, vec![ns(1, 100), ns(2, 50)])];
        let at = "subsystem `nqn.2026-12.io.kvtarget:wide` on node `b`";
        assert_eq!(mismatch(&ours, &peer(vec![ours[0].clone()])), None);
        // A peer not serving the subsystem at all is no conflict.
        assert_eq!(mismatch(&ours, &peer(Vec::new())), None);
        let cases: Vec<(Vec<MemberNamespace>, bool, String)> = vec![
            (
                vec![ns(1, 100), ns(2, 51)],
                true,
                format!("{at}: namespace 2 size (blocks) is 50 here, 51 there"),
            ),
            (
                vec![ns(1, 100)],
                true,
                format!("{at}: namespace 2 is not served there"),
            ),
            (
                vec![ns(1, 100), ns(2, 50), ns(3, 1)],
                true,
                format!("{at}: namespace 3 is served there, not here"),
            ),
            (
                vec![ns(1, 100), ns(2, 50)],
                false,
                format!("{at} is not cluster_wide there"),
            ),
            (
                vec![
                    ns(1, 100),
                    MemberNamespace {
                        csi: "kv".into(),
                        ..ns(2, 50)
                    },
                ],
                true,
                format!("{at}: namespace 2 command set is nvm here, kv there"),
            ),
            (
                vec![
                    MemberNamespace {
                        anagrpid: 2,
                        ..ns(1, 100)
                    },
                    ns(2, 50),
                ],
                true,
                format!("{at}: namespace 1 ana_group is 1 here, 2 there"),
            ),
        ];
        for (theirs, wide, want) in cases {
            assert_eq!(
                mismatch(&ours, &peer(vec![sub(wide, theirs)])).as_deref(),
                Some(want.as_str())
            );
        }
    }

    #[test]
    fn fields_a_peer_of_an_older_version_does_not_record_are_not_compared() {
        let ours = [sub(true, vec![ns(1, 100)])];
        let old = MemberNamespace {
            nsze: 0,
            block_size: 0,
            anagrpid: 0,
            ..ns(1, 100)
        };
        assert_eq!(mismatch(&ours, &peer(vec![sub(true, vec![old])])), None);
        // Subsystems not cluster-wide here are nobody else's business.
        let local = [sub(false, vec![ns(1, 100)])];
        assert_eq!(
            mismatch(&local, &peer(vec![sub(true, vec![ns(1, 7)])])),
            None
        );
    }
}
