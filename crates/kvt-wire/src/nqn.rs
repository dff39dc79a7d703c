//! NVMe Qualified Names (NVMe Base 2.0 §4.5): the syntax check every layer
//! that takes an NQN from a user or a peer (configuration, RPC, transport IDs)
//! shares.

use super::nvme::NQN_MAX_LEN;

/// Why a string is not an NVMe Qualified Name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NqnError {
    #[error("`{0}` is longer than 223 bytes")]
    TooLong(String),
    #[error("`{0}` is not an NQN (expected nqn.yyyy-mm.domain:name)")]
    Malformed(String),
}

/// "nqn." followed by a domain date and name, or the UUID form; at most
/// [`NQN_MAX_LEN`] (223) bytes of UTF-8, no whitespace.
pub fn validate_nqn(nqn: &str) -> Result<(), NqnError> {
    if nqn.len() > NQN_MAX_LEN {
        return Err(NqnError::TooLong(nqn.into()));
    }
    let ok = nqn.starts_with("nqn.") && nqn.len() > 4 && !nqn.contains(char::is_whitespace);
    if !ok {
        return Err(NqnError::Malformed(nqn.into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nqn_rules() {
        assert!(validate_nqn("nqn.2024-01.io.kvtarget:a").is_ok());
        assert!(matches!(validate_nqn("nqn."), Err(NqnError::Malformed(_))));
        assert!(matches!(
            validate_nqn("nqn.a b"),
            Err(NqnError::Malformed(_))
        ));
        assert!(matches!(validate_nqn("iqn.x"), Err(NqnError::Malformed(_))));
        let long = format!("nqn.{}", "a".repeat(NQN_MAX_LEN));
        assert!(matches!(validate_nqn(&long), Err(NqnError::TooLong(_))));
    }
}
