//! A member record: what a node serves, as it puts it under
//! `/kvtarget/<cluster>/members/<node>` (JSON, bound to its lease), so a host
//! library or a KV-cache manager can find every node and what it serves.

use crate::ident::{hex, uuid_text};
use crate::nvmf::{CommandSet, SubsystemKind, Target};
use serde::{Deserialize, Serialize};

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
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberSubsystem {
    pub nqn: String,
    pub namespaces: Vec<MemberNamespace>,
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

/// The target's listeners and NVM subsystems as they are now.
pub fn served(target: &Target) -> Served {
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
                })
                .collect(),
        })
        .collect();
    Served {
        listeners,
        subsystems,
    }
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
                }],
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
}
