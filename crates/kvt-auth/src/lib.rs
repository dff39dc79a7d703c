//! NVMe in-band authentication, DH-HMAC-CHAP (NVMe Base 2.0 section 8.13, TP 8006):
//! the hash functions and DH groups a host and a controller negotiate, secrets in the
//! NVMe representation (`secret`), the FFDHE exchange (`dh`), named keys loaded from
//! files (`keyring`) and the challenge-response computation both sides make.
//!
//! Every primitive comes from RustCrypto (`hmac`, `sha2`) and `num-bigint`; this module
//! only strings them together as the specification (and SPDK's and Linux's
//! implementations, which a host may be) do.

pub mod dh;
mod ffdhe;
pub mod keyring;
pub mod psk;
pub mod secret;

use hmac::{Hmac, Mac};
use sha2::{Digest as _, Sha256, Sha384, Sha512};
use zeroize::Zeroizing;

pub use dh::{DhError, DhKeyPair};
pub use keyring::{Key, KeyError, Keyring};
pub use psk::{CipherSuite, PskError, TlsPsk};
pub use secret::{DhchapSecret, SecretError};

/// A DH-HMAC-CHAP hash function, by its identifier in the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Digest {
    Sha256 = 1,
    Sha384 = 2,
    Sha512 = 3,
}

impl Digest {
    /// Strongest first: a controller picks the first one both sides allow, as
    /// SPDK's nvmf_tgt and Linux nvmet do.
    pub const ALL: [Digest; 3] = [Digest::Sha512, Digest::Sha384, Digest::Sha256];

    pub fn from_id(id: u8) -> Option<Digest> {
        Digest::ALL.into_iter().find(|d| d.id() == id)
    }
    pub fn id(self) -> u8 {
        self as u8
    }
    /// The hash length (HL) in bytes.
    pub fn hash_len(self) -> usize {
        match self {
            Digest::Sha256 => 32,
            Digest::Sha384 => 48,
            Digest::Sha512 => 64,
        }
    }
    /// The name SPDK's RPCs and `nvme-cli` use.
    pub fn name(self) -> &'static str {
        match self {
            Digest::Sha256 => "sha256",
            Digest::Sha384 => "sha384",
            Digest::Sha512 => "sha512",
        }
    }
    pub fn from_name(name: &str) -> Option<Digest> {
        Digest::ALL.into_iter().find(|d| d.name() == name)
    }

    /// H(data).
    pub fn hash(self, data: &[u8]) -> Zeroizing<Vec<u8>> {
        Zeroizing::new(match self {
            Digest::Sha256 => Sha256::digest(data).to_vec(),
            Digest::Sha384 => Sha384::digest(data).to_vec(),
            Digest::Sha512 => Sha512::digest(data).to_vec(),
        })
    }

    /// HMAC(key, parts[0] || parts[1] || ...).
    pub fn hmac(self, key: &[u8], parts: &[&[u8]]) -> Zeroizing<Vec<u8>> {
        fn run<M: Mac + hmac::digest::KeyInit>(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
            // HMAC takes keys of any length (longer ones are hashed first), so
            // `new_from_slice` cannot fail; the fallback keeps that a non-panic.
            let mut m = match <M as hmac::digest::KeyInit>::new_from_slice(key) {
                Ok(m) => m,
                Err(_) => return Vec::new(),
            };
            for p in parts {
                m.update(p);
            }
            m.finalize().into_bytes().to_vec()
        }
        Zeroizing::new(match self {
            Digest::Sha256 => run::<Hmac<Sha256>>(key, parts),
            Digest::Sha384 => run::<Hmac<Sha384>>(key, parts),
            Digest::Sha512 => run::<Hmac<Sha512>>(key, parts),
        })
    }
}

/// A DH-HMAC-CHAP Diffie-Hellman group, by its identifier in the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DhGroup {
    /// No DH exchange: the plain CHAP challenge.
    Null = 0,
    Ffdhe2048 = 1,
    Ffdhe3072 = 2,
    Ffdhe4096 = 3,
    Ffdhe6144 = 4,
    Ffdhe8192 = 5,
}

impl DhGroup {
    /// Strongest first, as `Digest::ALL`.
    pub const ALL: [DhGroup; 6] = [
        DhGroup::Ffdhe8192,
        DhGroup::Ffdhe6144,
        DhGroup::Ffdhe4096,
        DhGroup::Ffdhe3072,
        DhGroup::Ffdhe2048,
        DhGroup::Null,
    ];

    pub fn from_id(id: u8) -> Option<DhGroup> {
        DhGroup::ALL.into_iter().find(|g| g.id() == id)
    }
    pub fn id(self) -> u8 {
        self as u8
    }
    pub fn name(self) -> &'static str {
        match self {
            DhGroup::Null => "null",
            DhGroup::Ffdhe2048 => "ffdhe2048",
            DhGroup::Ffdhe3072 => "ffdhe3072",
            DhGroup::Ffdhe4096 => "ffdhe4096",
            DhGroup::Ffdhe6144 => "ffdhe6144",
            DhGroup::Ffdhe8192 => "ffdhe8192",
        }
    }
    pub fn from_name(name: &str) -> Option<DhGroup> {
        DhGroup::ALL.into_iter().find(|g| g.name() == name)
    }
    /// Bytes of a public value (DHVLEN): the prime's size; 0 for the null group.
    pub fn value_len(self) -> usize {
        match self {
            DhGroup::Null => 0,
            DhGroup::Ffdhe2048 => 256,
            DhGroup::Ffdhe3072 => 384,
            DhGroup::Ffdhe4096 => 512,
            DhGroup::Ffdhe6144 => 768,
            DhGroup::Ffdhe8192 => 1024,
        }
    }
}

/// Which side a response proves: the host's ("HostHost", checked by the
/// controller) or the controller's ("Controller", bidirectional authentication).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Host,
    Controller,
}

/// The inputs of one DH-HMAC-CHAP response.
pub struct ResponseInput<'a> {
    pub digest: Digest,
    /// The transformed secret of the side that answers (`DhchapSecret::transformed`).
    pub key: &'a [u8],
    /// The challenge (HL bytes) the other side sent.
    pub challenge: &'a [u8],
    /// The DH shared secret (g^xy mod p, padded), None for the null group.
    pub dh_secret: Option<&'a [u8]>,
    pub seqnum: u32,
    pub tid: u16,
    /// Secure channel concatenation (SC_C), 0 without TLS.
    pub scc: u8,
    pub hostnqn: &'a str,
    pub subnqn: &'a str,
}

/// The response value: HMAC(Kx, Ca || SEQ || T_ID || SC_C || role || NQN1 || 00h ||
/// NQN2), where Ca is the challenge augmented with the hashed DH secret
/// (HMAC(H(g^xy mod p), C)) when a DH group is in use, and NQN1 is the answering
/// side's NQN. Integers are little-endian.
pub fn response(role: Role, i: &ResponseInput<'_>) -> Zeroizing<Vec<u8>> {
    let augmented;
    let challenge: &[u8] = match i.dh_secret {
        Some(s) => {
            augmented = i.digest.hmac(&i.digest.hash(s), &[i.challenge]);
            &augmented
        }
        None => i.challenge,
    };
    let (label, nqn1, nqn2): (&[u8], &str, &str) = match role {
        Role::Host => (b"HostHost", i.hostnqn, i.subnqn),
        Role::Controller => (b"Controller", i.subnqn, i.hostnqn),
    };
    i.digest.hmac(
        i.key,
        &[
            challenge,
            &i.seqnum.to_le_bytes(),
            &i.tid.to_le_bytes(),
            &[i.scc],
            label,
            nqn1.as_bytes(),
            &[0],
            nqn2.as_bytes(),
        ],
    )
}

/// Fills `buf` from the operating system's random source.
pub fn random_bytes(buf: &mut [u8]) -> Result<(), DhError> {
    getrandom::fill(buf).map_err(|e| DhError::Random(e.to_string()))
}

/// A set of digests or DH groups a target allows, as a bitmap of identifiers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthPolicy {
    pub digests: u8,
    pub dhgroups: u8,
}

impl Default for AuthPolicy {
    /// Everything, as SPDK's nvmf_tgt allows by default.
    fn default() -> AuthPolicy {
        AuthPolicy {
            digests: Digest::ALL.iter().fold(0, |m, d| m | 1 << d.id()),
            dhgroups: DhGroup::ALL.iter().fold(0, |m, g| m | 1 << g.id()),
        }
    }
}

impl AuthPolicy {
    pub fn allows_digest(&self, d: Digest) -> bool {
        self.digests & 1 << d.id() != 0
    }
    pub fn allows_dhgroup(&self, g: DhGroup) -> bool {
        self.dhgroups & 1 << g.id() != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc4231_case_2() {
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
        let mac = Digest::Sha256.hmac(b"Jefe", &[b"what do ya ", b"want for nothing?"]);
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(Digest::Sha384.hmac(b"k", &[b"x"]).len(), 48);
        assert_eq!(Digest::Sha512.hash(b"").len(), 64);
    }

    #[test]
    fn identifiers_and_names_round_trip() {
        for d in Digest::ALL {
            assert_eq!(Digest::from_id(d.id()), Some(d));
            assert_eq!(Digest::from_name(d.name()), Some(d));
            assert_eq!(d.hash(b"x").len(), d.hash_len());
        }
        for g in DhGroup::ALL {
            assert_eq!(DhGroup::from_id(g.id()), Some(g));
            assert_eq!(DhGroup::from_name(g.name()), Some(g));
        }
        assert_eq!(Digest::from_id(0), None);
        assert_eq!(DhGroup::from_id(6), None);
        let p = AuthPolicy::default();
        assert!(Digest::ALL.iter().all(|d| p.allows_digest(*d)));
        assert!(DhGroup::ALL.iter().all(|g| p.allows_dhgroup(*g)));
    }

    #[test]
    fn responses_bind_role_nqns_and_dh_secret() {
        let base = ResponseInput {
            digest: Digest::Sha256,
            key: &[7; 32],
            challenge: &[9; 32],
            dh_secret: None,
            seqnum: 1,
            tid: 2,
            scc: 0,
            hostnqn: "nqn.h",
            subnqn: "nqn.s",
        };
        let host = response(Role::Host, &base);
        assert_eq!(host.len(), 32);
        assert_ne!(*host, *response(Role::Controller, &base));
        let other = ResponseInput {
            hostnqn: "nqn.x",
            ..base
        };
        assert_ne!(*host, *response(Role::Host, &other));
        let dh = ResponseInput {
            dh_secret: Some(&[1; 256]),
            ..base
        };
        assert_ne!(*host, *response(Role::Host, &dh));
        // Written out: HMAC(K, C || SEQ || T_ID || SC_C || "HostHost" || h || 0 || s).
        let mut msg = vec![9u8; 32];
        msg.extend_from_slice(&1u32.to_le_bytes());
        msg.extend_from_slice(&2u16.to_le_bytes());
        msg.push(0);
        msg.extend_from_slice(b"HostHostnqn.h\0nqn.s");
        assert_eq!(*host, *Digest::Sha256.hmac(&[7; 32], &[&msg]));
    }
}
