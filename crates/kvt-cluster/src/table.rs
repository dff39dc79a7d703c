//! `kvtarget cluster status`'s table.

use super::ClusterStatus;
use std::fmt::Write as _;

/// A header line (cluster, node, state, lease) and one row per member: its
/// name, listeners (`trtype:traddr:trsvcid`, discovery ports marked), the
/// number of subsystems it serves and its version.
pub fn status_table(s: &ClusterStatus) -> String {
    let mut out = format!(
        "cluster {}  node {}  state {}  lease {}  ttl {}s  etcd {}\n",
        s.cluster,
        s.node,
        s.state.name(),
        s.lease_id.as_deref().unwrap_or("-"),
        s.lease_ttl_secs,
        s.endpoint
    );
    let rows: Vec<[String; 4]> = s
        .members
        .iter()
        .map(|m| {
            let listeners: Vec<String> = m
                .listeners
                .iter()
                .map(|l| {
                    let d = if l.discovery { "(discovery)" } else { "" };
                    format!("{}:{}:{}{d}", l.trtype, l.traddr, l.trsvcid)
                })
                .collect();
            let me = if m.name == s.node { " *" } else { "" };
            [
                format!("{}{me}", m.name),
                listeners.join(","),
                m.subsystems.len().to_string(),
                m.version.clone(),
            ]
        })
        .collect();
    let head = ["MEMBER", "LISTENERS", "SUBSYSTEMS", "VERSION"];
    let mut width = head.map(str::len);
    for r in &rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let mut line = |cells: [&str; 4]| {
        let text: Vec<String> = cells
            .iter()
            .zip(width)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", text.join("  ").trim_end());
    };
    line(head);
    for r in &rows {
        line([&r[0], &r[1], &r[2], &r[3]]);
    }
    groups_table(&mut out, s);
    out.trim_end().to_string()
}

/// One row per elected ANA group: subsystem, group, owner, epoch, this
/// node's role (nothing without cluster-wide subsystems).
fn groups_table(out: &mut String, s: &ClusterStatus) {
    if s.groups.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\n{:<40}  {:>5}  {:<16}  {:>8}  ROLE",
        "SUBSYSTEM", "GROUP", "OWNER", "EPOCH"
    );
    for g in &s.groups {
        let epoch = g.epoch.map_or("-".to_string(), |e| e.to_string());
        let _ = writeln!(
            out,
            "{:<40}  {:>5}  {:<16}  {:>8}  {}",
            g.subnqn,
            g.anagrpid,
            g.owner.as_deref().unwrap_or("-"),
            epoch,
            g.role
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{GroupStatus, NodeState};

    #[test]
    fn elected_groups_get_a_table_of_their_own() {
        let mut s = ClusterStatus {
            cluster: "kv-tier".into(),
            node: "node-a".into(),
            state: NodeState::Joined,
            lease_id: Some("1f".into()),
            lease_ttl_secs: 5,
            endpoint: "127.0.0.1:2379".into(),
            members: Vec::new(),
            groups: Vec::new(),
        };
        assert!(!status_table(&s).contains("GROUP"));
        s.groups.push(GroupStatus {
            subnqn: "nqn.2026-12.io.kvtarget:kv-tier".into(),
            anagrpid: 1,
            role: "follower".into(),
            owner: Some("node-b".into()),
            epoch: Some(57),
        });
        let t = status_table(&s);
        let rows: Vec<&str> = t
            .lines()
            .skip_while(|l| !l.starts_with("SUBSYSTEM"))
            .collect();
        assert_eq!(rows.len(), 2, "{t}");
        assert_eq!(
            rows[1].split_whitespace().collect::<Vec<_>>(),
            [
                "nqn.2026-12.io.kvtarget:kv-tier",
                "1",
                "node-b",
                "57",
                "follower"
            ]
        );
    }
}
