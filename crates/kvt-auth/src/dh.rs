//! Finite-field Diffie-Hellman over the RFC 7919 groups, for the DH part of
//! DH-HMAC-CHAP: each side sends g^x mod p as a big-endian value as long as p, and
//! both derive g^xy mod p, padded the same way (what OpenSSL's DH with padding,
//! which SPDK uses, and the Linux kernel's `dh` produce).

use super::{ffdhe, random_bytes, DhGroup};
use num_bigint::BigUint;
use std::sync::OnceLock;
use zeroize::Zeroizing;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DhError {
    #[error("the null group has no DH exchange")]
    NullGroup,
    #[error("the peer's DH value is {got} bytes ({want} for {group})")]
    ValueLength {
        got: usize,
        want: usize,
        group: &'static str,
    },
    #[error("the peer's DH value is outside 2..p-2 (a degenerate key)")]
    ValueRange,
    #[error("no random bytes from the operating system: {0}")]
    Random(String),
}

/// Private exponent bytes: at least twice the group's strength, the length
/// RFC 7919 section 5.2 and OpenSSL (SPDK's DH) use: 225 bits for ffdhe2048, 275,
/// 325, 375 and 400 for ffdhe8192, rounded up to whole bytes. Each modular
/// exponentiation runs on the reactor: 0.5 ms for ffdhe2048, 12 ms for ffdhe8192
/// (about 20 ms with a 512-bit exponent).
fn exponent_len(group: DhGroup) -> usize {
    let bits: usize = match group {
        DhGroup::Null => 0,
        DhGroup::Ffdhe2048 => 225,
        DhGroup::Ffdhe3072 => 275,
        DhGroup::Ffdhe4096 => 325,
        DhGroup::Ffdhe6144 => 375,
        DhGroup::Ffdhe8192 => 400,
    };
    bits.div_ceil(8)
}

fn prime(group: DhGroup) -> Option<&'static BigUint> {
    static PRIMES: [OnceLock<BigUint>; 5] = [const { OnceLock::new() }; 5];
    let (i, hex) = match group {
        DhGroup::Null => return None,
        DhGroup::Ffdhe2048 => (0, ffdhe::FFDHE2048),
        DhGroup::Ffdhe3072 => (1, ffdhe::FFDHE3072),
        DhGroup::Ffdhe4096 => (2, ffdhe::FFDHE4096),
        DhGroup::Ffdhe6144 => (3, ffdhe::FFDHE6144),
        DhGroup::Ffdhe8192 => (4, ffdhe::FFDHE8192),
    };
    // The constants are hexadecimal digits (a unit test parses each one).
    Some(PRIMES[i].get_or_init(|| BigUint::parse_bytes(hex.as_bytes(), 16).unwrap_or_default()))
}

fn padded(v: &BigUint, len: usize) -> Vec<u8> {
    let b = v.to_bytes_be();
    let mut out = vec![0u8; len.saturating_sub(b.len())];
    out.extend_from_slice(&b);
    out
}

/// One side's ephemeral key pair.
pub struct DhKeyPair {
    group: DhGroup,
    exponent: BigUint,
    public: Vec<u8>,
}

impl DhKeyPair {
    /// A fresh private exponent and its public value g^x mod p.
    pub fn generate(group: DhGroup) -> Result<DhKeyPair, DhError> {
        let p = prime(group).ok_or(DhError::NullGroup)?;
        let mut x = Zeroizing::new(vec![0u8; exponent_len(group)]);
        random_bytes(&mut x[..])?;
        // Never 0 or 1: the top bit set keeps the exponent its full length.
        x[0] |= 0x80;
        let exponent = BigUint::from_bytes_be(&x[..]);
        let public = padded(&BigUint::from(2u32).modpow(&exponent, p), group.value_len());
        Ok(DhKeyPair {
            group,
            exponent,
            public,
        })
    }

    pub fn group(&self) -> DhGroup {
        self.group
    }

    /// g^x mod p, DHVLEN bytes.
    pub fn public(&self) -> &[u8] {
        &self.public
    }

    /// g^xy mod p from the peer's public value, padded to DHVLEN bytes. Values
    /// that would pin the secret to a known one (0, 1, p-1 and beyond) are refused.
    pub fn shared_secret(&self, peer: &[u8]) -> Result<Zeroizing<Vec<u8>>, DhError> {
        let p = prime(self.group).ok_or(DhError::NullGroup)?;
        let want = self.group.value_len();
        if peer.len() != want {
            return Err(DhError::ValueLength {
                got: peer.len(),
                want,
                group: self.group.name(),
            });
        }
        let y = BigUint::from_bytes_be(peer);
        let one = BigUint::from(1u32);
        if y <= one || y >= p - &one {
            return Err(DhError::ValueRange);
        }
        Ok(Zeroizing::new(padded(&y.modpow(&self.exponent, p), want)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primes_are_the_rfc7919_ones() {
        for g in DhGroup::ALL.into_iter().filter(|g| *g != DhGroup::Null) {
            let p = prime(g).unwrap();
            assert_eq!(p.bits() as usize, g.value_len() * 8, "{}", g.name());
            // RFC 7919: the top and bottom 64 bits are all ones, and p = 2q + 1
            // with q odd (p ≡ 3 mod 4).
            let b = p.to_bytes_be();
            assert!(b[..8].iter().chain(&b[b.len() - 8..]).all(|x| *x == 0xFF));
            assert_eq!(p % 4u32, BigUint::from(3u32));
        }
        assert!(prime(DhGroup::Null).is_none());
    }

    #[test]
    fn both_sides_derive_the_same_secret() {
        for g in [DhGroup::Ffdhe2048, DhGroup::Ffdhe3072] {
            let a = DhKeyPair::generate(g).unwrap();
            let b = DhKeyPair::generate(g).unwrap();
            assert_eq!(a.public().len(), g.value_len());
            assert_ne!(a.public(), b.public());
            let s1 = a.shared_secret(b.public()).unwrap();
            let s2 = b.shared_secret(a.public()).unwrap();
            assert_eq!(*s1, *s2);
            assert_eq!(s1.len(), g.value_len());
        }
    }

    #[test]
    fn degenerate_and_misfit_values_are_refused() {
        let a = DhKeyPair::generate(DhGroup::Ffdhe2048).unwrap();
        let mut one = vec![0u8; 256];
        one[255] = 1;
        assert_eq!(a.shared_secret(&one), Err(DhError::ValueRange));
        assert_eq!(a.shared_secret(&[0u8; 256]), Err(DhError::ValueRange));
        assert_eq!(a.shared_secret(&[0xFF; 256]), Err(DhError::ValueRange));
        let p_minus_1 = padded(&(prime(DhGroup::Ffdhe2048).unwrap() - 1u32), 256);
        assert_eq!(a.shared_secret(&p_minus_1), Err(DhError::ValueRange));
        assert!(matches!(
            a.shared_secret(&[2u8; 255]),
            Err(DhError::ValueLength { got: 255, .. })
        ));
        assert!(matches!(
            DhKeyPair::generate(DhGroup::Null),
            Err(DhError::NullGroup)
        ));
    }
}
