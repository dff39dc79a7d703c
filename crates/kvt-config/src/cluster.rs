//! `[cluster]`: this node's membership in a kvtarget cluster coordinated by
//! etcd (see `kvt_cluster` and docs/cluster.md). Absent: the node runs alone
//! and never talks to etcd.

use super::ConfigError;
use serde::{Deserialize, Serialize};
use std::ops::RangeInclusive;

/// Lease TTL bounds, in seconds. Below 2 s etcd raises the TTL to its own
/// minimum (1.5 election timeouts, 1.5 s by default) and a keep-alive every
/// TTL/3 would race etcd's heartbeat; above 60 s a dead node stays listed as a
/// member (and, with referrals, advertised to hosts) for over a minute.
pub const LEASE_TTL_SECS: RangeInclusive<u64> = 2..=60;
/// Default lease TTL: a dead node leaves the member list within 5 s, and a
/// keep-alive every 1.7 s costs etcd nothing.
pub const DEFAULT_LEASE_TTL_SECS: u64 = 5;
/// Node and cluster names: a DNS label's length (they often are host names)
/// and its characters, so a name is safe in an etcd key and a log line.
pub const NAME_LEN: RangeInclusive<usize> = 1..=63;

/// What a node does when no etcd endpoint answers at start.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum OnUnreachable {
    /// Refuse to start: one line naming the endpoints, exit 2.
    #[default]
    Fail,
    /// Serve alone and keep trying to join.
    Alone,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// etcd client URLs, `http://host:port`; tried in order.
    pub endpoints: Vec<String>,
    /// The cluster's name: members live under `/kvtarget/<name>/members/`.
    #[serde(default = "default_cluster_name")]
    pub name: String,
    /// This node's name; default: the host name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The membership lease's TTL, seconds; kept alive every TTL/3.
    #[serde(default = "default_lease_ttl_secs")]
    pub lease_ttl_secs: u64,
    /// etcd unreachable at start: "fail" (exit 2) or "alone".
    #[serde(default)]
    pub on_unreachable: OnUnreachable,
}

fn default_cluster_name() -> String {
    "default".into()
}

fn default_lease_ttl_secs() -> u64 {
    DEFAULT_LEASE_TTL_SECS
}

/// The host name, as the kernel has it (`/proc/sys/kernel/hostname`).
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Why a node or cluster name is refused, or `None`.
fn name_fault(name: &str) -> Option<&'static str> {
    if !NAME_LEN.contains(&name.len()) {
        return Some("must be 1 to 63 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
    {
        return Some("may hold only letters, digits, '-', '_' and '.'");
    }
    if name.starts_with(['-', '.']) {
        return Some("must start with a letter, digit or '_'");
    }
    None
}

/// Why an endpoint is refused, or `None`: `http://host:port`, nothing else.
fn endpoint_fault(url: &str) -> Option<&'static str> {
    if url.starts_with("https://") {
        return Some("https is not supported yet: use http:// on a trusted network");
    }
    let Some(rest) = url.strip_prefix("http://") else {
        return Some("must be http://host:port");
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    match rest.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && !host.contains('/') => {
            match port.parse::<u16>() {
                Ok(p) if p != 0 => None,
                _ => Some("port must be 1 to 65535"),
            }
        }
        _ => Some("must be http://host:port"),
    }
}

impl ClusterConfig {
    /// This node's name: `node`, or the host name.
    pub fn node_name(&self) -> String {
        self.node.clone().unwrap_or_else(host_name)
    }

    /// `host:port` of each endpoint (validated).
    pub fn endpoint_addrs(&self) -> Vec<String> {
        self.endpoints
            .iter()
            .map(|u| {
                let r = u.strip_prefix("http://").unwrap_or(u);
                r.strip_suffix('/').unwrap_or(r).to_string()
            })
            .collect()
    }

    pub(super) fn validate(&self, f: &str) -> Result<(), ConfigError> {
        if self.endpoints.is_empty() {
            return Err(invalid!(
                "{f}.endpoints",
                "at least one etcd endpoint (http://host:port) is needed"
            ));
        }
        for (i, e) in self.endpoints.iter().enumerate() {
            if let Some(why) = endpoint_fault(e) {
                return Err(invalid!("{f}.endpoints[{i}]", "{why} (got `{e}`)"));
            }
        }
        if let Some(why) = name_fault(&self.name) {
            return Err(invalid!("{f}.name", "{why} (got `{}`)", self.name));
        }
        let node = self.node_name();
        if let Some(why) = name_fault(&node) {
            let whose = match self.node {
                Some(_) => "",
                None => " (the host name; set it)",
            };
            return Err(invalid!("{f}.node", "{why}{whose} (got `{node}`)"));
        }
        if !LEASE_TTL_SECS.contains(&self.lease_ttl_secs) {
            return Err(invalid!(
                "{f}.lease_ttl_secs",
                "must be {}..={} seconds (got {})",
                LEASE_TTL_SECS.start(),
                LEASE_TTL_SECS.end(),
                self.lease_ttl_secs
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::Config;

    const BASE: &str = "[[listeners]]\naddress = \"127.0.0.1\"\nport = 4420\n";

    fn parse(cluster: &str) -> Result<Config, String> {
        Config::parse(&format!("{BASE}[cluster]\n{cluster}")).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_and_absence() {
        assert!(Config::parse(BASE).unwrap().cluster.is_none());
        let c = parse("endpoints = [\"http://127.0.0.1:2379\"]\nnode = \"a\"\n")
            .unwrap()
            .cluster
            .unwrap();
        assert_eq!(c.lease_ttl_secs, 5);
        assert_eq!(c.name, "default");
        assert_eq!(c.on_unreachable, super::OnUnreachable::Fail);
        assert_eq!(c.endpoint_addrs(), vec!["127.0.0.1:2379".to_string()]);
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            ("endpoints = []", "cluster.endpoints:"),
            (
                "endpoints = [\"127.0.0.1:2379\"]",
                "cluster.endpoints[0]: must be http://host:port",
            ),
            (
                "endpoints = [\"https://e:2379\"]",
                "cluster.endpoints[0]: https",
            ),
            ("endpoints = [\"http://e:0\"]", "cluster.endpoints[0]: port"),
            (
                "endpoints = [\"http://e:1\"]\nnode = \"a/b\"",
                "cluster.node: may hold only",
            ),
            (
                "endpoints = [\"http://e:1\"]\nnode = \"\"",
                "cluster.node: must be 1 to 63",
            ),
            (
                "endpoints = [\"http://e:1\"]\nnode = \"-a\"",
                "cluster.node: must start",
            ),
            (
                "endpoints = [\"http://e:1\"]\nname = \"x y\"",
                "cluster.name: may hold only",
            ),
            (
                "endpoints = [\"http://e:1\"]\nlease_ttl_secs = 1",
                "cluster.lease_ttl_secs: must be 2..=60",
            ),
            (
                "endpoints = [\"http://e:1\"]\nlease_ttl_secs = 61",
                "cluster.lease_ttl_secs: must be 2..=60",
            ),
            (
                "endpoints = [\"http://e:1\"]\non_unreachable = \"maybe\"",
                "on_unreachable",
            ),
            ("endpoints = [\"http://e:1\"]\nttl = 3", "unknown field"),
        ];
        for (text, want) in cases {
            let e = parse(text).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
            assert!(!e.contains('\n'), "{text}: one line: {e}");
        }
    }

    #[test]
    fn round_trips_through_toml() {
        let c = parse("endpoints = [\"http://127.0.0.1:2379\", \"http://h:2379\"]\nnode = \"n1\"\nname = \"tier0\"\nlease_ttl_secs = 9\non_unreachable = \"alone\"\n").unwrap();
        let again = Config::parse(&c.to_toml().unwrap()).unwrap();
        assert_eq!(c.cluster, again.cluster);
    }
}
