//! `[[keys]]` and `[auth]`: named key files and what DH-HMAC-CHAP may negotiate.

use super::ConfigError;
use kvt_auth::{AuthPolicy, DhGroup, Digest};
use serde::{Deserialize, Serialize};

/// Longest key name, in characters (SPDK's keyring names are short labels).
pub const KEY_NAME_MAX_LEN: usize = 128;

/// A key file: `name` is what host entries refer to; `path` is absolute and
/// readable by its owner only (mode 0600), as SPDK's keyring_file requires.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KeyConfig {
    pub name: String,
    pub path: String,
}

/// Names unique and sane, paths absolute; `keys[i]` paths.
pub(super) fn validate_keys(keys: &[KeyConfig]) -> Result<(), ConfigError> {
    for (i, k) in keys.iter().enumerate() {
        if k.name.is_empty()
            || k.name.len() > KEY_NAME_MAX_LEN
            || k.name.chars().any(char::is_whitespace)
        {
            return Err(invalid!(
                "keys[{i}].name",
                "1 to {KEY_NAME_MAX_LEN} characters without whitespace (got `{}`)",
                k.name
            ));
        }
        if keys[..i].iter().any(|o| o.name == k.name) {
            return Err(invalid!("keys[{i}].name", "`{}` is defined twice", k.name));
        }
        if !std::path::Path::new(&k.path).is_absolute() {
            return Err(invalid!(
                "keys[{i}].path",
                "must be an absolute path (got `{}`)",
                k.path
            ));
        }
    }
    Ok(())
}

/// The DH-HMAC-CHAP hashes and DH groups the target accepts (SPDK's
/// `nvmf_set_config` `dhchap_digests` / `dhchap_dhgroups`); default: all. The
/// strongest one both sides allow is chosen.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    pub dhchap_digests: Vec<String>,
    pub dhchap_dhgroups: Vec<String>,
}

/// Every name, strongest first.
fn all_digests() -> Vec<String> {
    Digest::ALL
        .iter()
        .rev()
        .map(|d| d.name().to_string())
        .collect()
}
fn all_dhgroups() -> Vec<String> {
    DhGroup::ALL
        .iter()
        .rev()
        .map(|g| g.name().to_string())
        .collect()
}

impl Default for AuthConfig {
    fn default() -> AuthConfig {
        AuthConfig {
            dhchap_digests: all_digests(),
            dhchap_dhgroups: all_dhgroups(),
        }
    }
}

impl AuthConfig {
    pub(super) fn is_default(&self) -> bool {
        *self == AuthConfig::default()
    }

    /// The lists as a policy (names checked by `validate`).
    pub fn policy(&self) -> AuthPolicy {
        AuthPolicy {
            digests: self
                .dhchap_digests
                .iter()
                .filter_map(|n| Digest::from_name(n))
                .fold(0, |m, d| m | 1 << d.id()),
            dhgroups: self
                .dhchap_dhgroups
                .iter()
                .filter_map(|n| DhGroup::from_name(n))
                .fold(0, |m, g| m | 1 << g.id()),
        }
    }

    /// Each list names at least one known entry and nothing else.
    pub(super) fn validate(&self, f: &str) -> Result<(), ConfigError> {
        for (name, names, valid) in [
            ("dhchap_digests", &self.dhchap_digests, all_digests()),
            ("dhchap_dhgroups", &self.dhchap_dhgroups, all_dhgroups()),
        ] {
            if names.is_empty() {
                return Err(invalid!(
                    "{f}.{name}",
                    "must name at least one of {}",
                    valid.join(", ")
                ));
            }
            if let Some(n) = names.iter().find(|n| !valid.contains(n)) {
                return Err(invalid!(
                    "{f}.{name}",
                    "unknown `{n}` (one of {})",
                    valid.join(", ")
                ));
            }
        }
        Ok(())
    }
}
