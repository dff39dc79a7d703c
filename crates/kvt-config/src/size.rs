//! Sizes in configuration files: a byte count or a string with a binary unit.

use serde::{Deserialize, Deserializer};

/// Why a size string does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("`{0}` is not a size (e.g. 4096, 64KiB, 1GiB)")]
    NotASize(String),
    #[error("`{0}` has an unknown unit (use KiB, MiB, GiB, TiB)")]
    UnknownUnit(String),
    #[error("`{0}` is too large")]
    TooLarge(String),
}

/// Parses "4096", "64KiB", "256MiB", "1GiB", "2TiB" (also K/M/G/T, KB/MB/... as
/// binary units, which is what storage people mean here).
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| SizeError::NotASize(s.into()))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(SizeError::UnknownUnit(s.into())),
    };
    n.checked_mul(mult)
        .filter(|&b| b <= MAX_SIZE)
        .ok_or_else(|| SizeError::TooLarge(s.into()))
}

/// The largest size a configuration holds: a saved configuration writes sizes
/// as TOML integers, which are signed 64-bit, so anything larger would load
/// and then fail to save (found by the `config` fuzz target).
pub const MAX_SIZE: u64 = i64::MAX as u64;

#[derive(Deserialize)]
#[serde(untagged)]
enum SizeRepr {
    Int(u64),
    Str(String),
}

/// `deserialize_with` for a size field.
pub(super) fn size<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    match SizeRepr::deserialize(d)? {
        SizeRepr::Int(n) if n <= MAX_SIZE => Ok(n),
        SizeRepr::Int(n) => Err(serde::de::Error::custom(SizeError::TooLarge(n.to_string()))),
        SizeRepr::Str(s) => parse_size(&s).map_err(serde::de::Error::custom),
    }
}

/// `deserialize_with` for an optional size field.
pub(super) fn opt_size<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    size(d).map(Some)
}
