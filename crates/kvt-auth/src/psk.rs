//! NVMe/TCP TLS pre-shared keys (NVMe/TCP 1.0 section 3.6.1, TP 8011): the PSK
//! interchange format `NVMeTLSkey-1:<hh>:<base64>:` that `nvme gen-tls-key` prints,
//! the retained PSK derived from it with the host NQN, the PSK identity a host
//! offers (`NVMe0R0<hh> <hostnqn> <subnqn>`) and the TLS PSK derived from the
//! retained PSK with that identity, which is what TLS 1.3 uses as its external PSK.
//!
//! `<hh>` is 00 (the configured PSK is the retained PSK) or the hash (01 SHA-256, 02
//! SHA-384) of the retained-PSK derivation; the configured PSK's length picks the
//! cipher suite (32 bytes: TLS_AES_128_GCM_SHA256, 48: TLS_AES_256_GCM_SHA384), as in
//! SPDK's nvmf_tgt and initiator. Both derivations are HKDF (RFC 5869, extract and
//! expand, empty salt) from RustCrypto, with the info laid out as SPDK lays it out:
//! the input key's length (16 bits, big-endian), then the label and the context, each
//! behind a one-byte length.

use base64::Engine as _;
use hkdf::Hkdf;
use sha2::{Sha256, Sha384};
use zeroize::Zeroizing;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PskError {
    #[error("not a TLS PSK (expected NVMeTLSkey-1:<00|01|02>:<base64>:)")]
    Format,
    #[error("unknown PSK hash `{0}` (00, 01 or 02)")]
    Hash(String),
    #[error("the PSK is not valid base64")]
    Base64,
    #[error("the PSK is {0} bytes (32 or 48 expected)")]
    Length(usize),
    #[error("the PSK's CRC-32 does not match (a damaged or mistyped key)")]
    Crc,
}

/// The TLS 1.3 cipher suites NVMe/TCP uses, and the hash each brings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CipherSuite {
    Aes128GcmSha256,
    Aes256GcmSha384,
}

impl CipherSuite {
    /// The IANA name, as OpenSSL spells it.
    pub fn name(self) -> &'static str {
        match self {
            CipherSuite::Aes128GcmSha256 => "TLS_AES_128_GCM_SHA256",
            CipherSuite::Aes256GcmSha384 => "TLS_AES_256_GCM_SHA384",
        }
    }
    /// The two-byte TLS cipher suite identifier.
    pub fn id(self) -> [u8; 2] {
        match self {
            CipherSuite::Aes128GcmSha256 => [0x13, 0x01],
            CipherSuite::Aes256GcmSha384 => [0x13, 0x02],
        }
    }
    /// The identity's hash field for this suite.
    fn identity_hash(self) -> &'static str {
        match self {
            CipherSuite::Aes128GcmSha256 => "01",
            CipherSuite::Aes256GcmSha384 => "02",
        }
    }
}

/// The hash of the retained-PSK derivation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PskHash {
    /// 00: the configured PSK is used as the retained PSK.
    None,
    Sha256,
    Sha384,
}

/// A configured PSK. Its bytes are wiped when it is dropped, and `Debug` never
/// shows them.
#[derive(Clone, PartialEq, Eq)]
pub struct TlsPsk {
    key: Zeroizing<Vec<u8>>,
    hash: PskHash,
}

impl std::fmt::Debug for TlsPsk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TlsPsk({} bytes, hash {:?})", self.key.len(), self.hash)
    }
}

const PREFIX: &str = "NVMeTLSkey-1:";

/// HKDF-SHA-256 (or SHA-384) with an empty salt and SPDK's info layout; one hash
/// length of output.
fn derive(sha384: bool, key: &[u8], label: &str, context: &[u8]) -> Zeroizing<Vec<u8>> {
    // Lengths are bounded by the callers: keys are 32 or 48 bytes, labels fixed,
    // contexts at most 255 bytes (checked where they are built).
    let mut info = Vec::with_capacity(4 + label.len() + context.len());
    info.extend_from_slice(&(key.len() as u16).to_be_bytes());
    info.push(label.len() as u8);
    info.extend_from_slice(label.as_bytes());
    info.push(context.len() as u8);
    info.extend_from_slice(context);
    let mut out = Zeroizing::new(vec![0u8; if sha384 { 48 } else { 32 }]);
    // An output of one hash length is always within HKDF's 255 x HashLen bound.
    let ok = if sha384 {
        Hkdf::<Sha384>::new(None, key).expand(&info, &mut out)
    } else {
        Hkdf::<Sha256>::new(None, key).expand(&info, &mut out)
    };
    debug_assert!(ok.is_ok());
    out
}

/// Why an identity could not be built: an NQN too long for TLS's 255-byte context.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the PSK identity would be {0} bytes (TLS allows 255 in the derivation)")]
pub struct IdentityTooLong(pub usize);

impl TlsPsk {
    /// Parses the interchange format; surrounding whitespace (a key file's newline)
    /// is ignored.
    pub fn parse(text: &str) -> Result<TlsPsk, PskError> {
        let rest = text.trim().strip_prefix(PREFIX).ok_or(PskError::Format)?;
        let (h, rest) = rest.split_once(':').ok_or(PskError::Format)?;
        let hash = match h {
            "00" => PskHash::None,
            "01" => PskHash::Sha256,
            "02" => PskHash::Sha384,
            _ => return Err(PskError::Hash(h.chars().take(8).collect())),
        };
        let b64 = rest.strip_suffix(':').ok_or(PskError::Format)?;
        if b64.contains(':') {
            return Err(PskError::Format);
        }
        let raw = Zeroizing::new(
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|_| PskError::Base64)?,
        );
        let len = raw.len().saturating_sub(4);
        if raw.len() < 4 || ![32, 48].contains(&len) {
            return Err(PskError::Length(len));
        }
        let (key, crc) = raw.split_at(len);
        if crc32fast::hash(key).to_le_bytes() != crc {
            return Err(PskError::Crc);
        }
        Ok(TlsPsk {
            key: Zeroizing::new(key.to_vec()),
            hash,
        })
    }

    /// A PSK from raw bytes (32 or 48 of them).
    pub fn new(key: &[u8], hash: PskHash) -> Result<TlsPsk, PskError> {
        if ![32, 48].contains(&key.len()) {
            return Err(PskError::Length(key.len()));
        }
        Ok(TlsPsk {
            key: Zeroizing::new(key.to_vec()),
            hash,
        })
    }

    /// The interchange format, as `nvme gen-tls-key` prints it.
    pub fn encode(&self) -> Zeroizing<String> {
        let mut raw = Zeroizing::new(self.key.to_vec());
        raw.extend_from_slice(&crc32fast::hash(&self.key).to_le_bytes());
        let h = match self.hash {
            PskHash::None => 0,
            PskHash::Sha256 => 1,
            PskHash::Sha384 => 2,
        };
        Zeroizing::new(format!(
            "{PREFIX}{h:02x}:{}:",
            base64::engine::general_purpose::STANDARD.encode(&*raw)
        ))
    }

    /// The cipher suite this PSK is used with (by its length).
    pub fn cipher_suite(&self) -> CipherSuite {
        if self.key.len() == 48 {
            CipherSuite::Aes256GcmSha384
        } else {
            CipherSuite::Aes128GcmSha256
        }
    }

    /// The identity a host offers for this PSK.
    pub fn identity(&self, hostnqn: &str, subnqn: &str) -> Result<String, IdentityTooLong> {
        let id = format!(
            "NVMe0R{} {hostnqn} {subnqn}",
            self.cipher_suite().identity_hash()
        );
        if id.len() > 255 {
            return Err(IdentityTooLong(id.len()));
        }
        Ok(id)
    }

    /// The retained PSK for `hostnqn`.
    pub fn retained(&self, hostnqn: &str) -> Zeroizing<Vec<u8>> {
        let nqn = &hostnqn.as_bytes()[..hostnqn.len().min(255)];
        match self.hash {
            PskHash::None => self.key.clone(),
            PskHash::Sha256 => derive(false, &self.key, "tls13 HostNQN", nqn),
            PskHash::Sha384 => derive(true, &self.key, "tls13 HostNQN", nqn),
        }
    }

    /// The TLS PSK (the external PSK TLS 1.3 is given) for `identity`, which
    /// `identity()` built and so is at most 255 bytes.
    pub fn tls_psk(&self, hostnqn: &str, identity: &str) -> Zeroizing<Vec<u8>> {
        let retained = self.retained(hostnqn);
        let id = &identity.as_bytes()[..identity.len().min(255)];
        let sha384 = self.cipher_suite() == CipherSuite::Aes256GcmSha384;
        derive(sha384, &retained, "tls13 nvme-tls-psk", id)
    }
}

/// A host's and a subsystem's NQN as a PSK identity names them; `None` for
/// anything but an `NVMe0R0<1|2>` identity of two NQNs.
pub fn parse_identity(identity: &[u8]) -> Option<(CipherSuite, &str, &str)> {
    let s = std::str::from_utf8(identity).ok()?;
    let rest = s.strip_prefix("NVMe0R")?;
    let (hash, rest) = rest.split_at_checked(2)?;
    let suite = match hash {
        "01" => CipherSuite::Aes128GcmSha256,
        "02" => CipherSuite::Aes256GcmSha384,
        _ => return None,
    };
    let rest = rest.strip_prefix(' ')?;
    let (host, sub) = rest.split_once(' ')?;
    if host.is_empty() || sub.is_empty() || sub.contains(' ') {
        return None;
    }
    Some((suite, host, sub))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// OpenSSL's HKDF, as SPDK calls it: an implementation we did not write.
    fn openssl_hkdf(sha384: bool, key: &[u8], info: &[u8]) -> Vec<u8> {
        use openssl::md::Md;
        use openssl::pkey::Id;
        use openssl::pkey_ctx::PkeyCtx;
        let mut ctx = PkeyCtx::new_id(Id::HKDF).unwrap();
        ctx.derive_init().unwrap();
        ctx.set_hkdf_md(if sha384 { Md::sha384() } else { Md::sha256() })
            .unwrap();
        ctx.set_hkdf_key(key).unwrap();
        ctx.set_hkdf_salt(&[]).unwrap();
        ctx.add_hkdf_info(info).unwrap();
        let mut out = vec![0u8; if sha384 { 48 } else { 32 }];
        ctx.derive(Some(&mut out)).unwrap();
        out
    }

    fn info(len: usize, label: &str, ctx: &str) -> Vec<u8> {
        let mut v = (len as u16).to_be_bytes().to_vec();
        v.push(label.len() as u8);
        v.extend_from_slice(label.as_bytes());
        v.push(ctx.len() as u8);
        v.extend_from_slice(ctx.as_bytes());
        v
    }

    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0f4a9d1c-7c1e-4b8a-9d61-3f0c8e2a5b77";
    const SUB: &str = "nqn.2026-11.io.kvtarget:tls";

    #[test]
    fn round_trips_and_refuses_damage() {
        let k = TlsPsk::new(&[7u8; 32], PskHash::Sha256).unwrap();
        let text = k.encode();
        assert!(text.starts_with("NVMeTLSkey-1:01:"));
        assert_eq!(TlsPsk::parse(&format!("{}\n", &*text)).unwrap(), k);
        let mut bad = text.to_string();
        bad.replace_range(20..21, if &bad[20..21] == "A" { "B" } else { "A" });
        assert!(matches!(
            TlsPsk::parse(&bad),
            Err(PskError::Crc | PskError::Base64)
        ));
        assert_eq!(
            TlsPsk::parse("NVMeTLSkey-1:03:AAAA:"),
            Err(PskError::Hash("03".into()))
        );
        assert_eq!(TlsPsk::parse("DHHC-1:00:AAAA:"), Err(PskError::Format));
        assert_eq!(TlsPsk::parse("NVMeTLSkey-1:01:AAAA"), Err(PskError::Format));
        assert_eq!(
            TlsPsk::parse("NVMeTLSkey-1:01:AAAAAAAA:"),
            Err(PskError::Length(2))
        );
        assert!(format!("{k:?}").starts_with("TlsPsk(32 bytes"));
    }

    #[test]
    fn derivations_match_openssl_hkdf_with_spdks_info() {
        for (len, hash, sha384) in [
            (32, PskHash::Sha256, false),
            (48, PskHash::Sha384, true),
            (32, PskHash::Sha384, true),
        ] {
            let raw: Vec<u8> = (0..len as u8).collect();
            let k = TlsPsk::new(&raw, hash).unwrap();
            let retained = k.retained(HOST);
            let want = openssl_hkdf(sha384, &raw, &info(len, "tls13 HostNQN", HOST));
            assert_eq!(&*retained, &want[..]);
            let id = k.identity(HOST, SUB).unwrap();
            let suite384 = len == 48;
            assert_eq!(
                id,
                format!("NVMe0R0{} {HOST} {SUB}", if suite384 { 2 } else { 1 })
            );
            let want_tls = openssl_hkdf(
                suite384,
                &retained,
                &info(retained.len(), "tls13 nvme-tls-psk", &id),
            );
            assert_eq!(&*k.tls_psk(HOST, &id), &want_tls[..]);
        }
        // 00: the configured PSK is the retained one.
        let k = TlsPsk::new(&[9u8; 48], PskHash::None).unwrap();
        assert_eq!(&*k.retained(HOST), &[9u8; 48][..]);
        assert_eq!(k.cipher_suite(), CipherSuite::Aes256GcmSha384);
    }

    #[test]
    fn identities_parse_back() {
        let k = TlsPsk::new(&[1u8; 32], PskHash::None).unwrap();
        let id = k.identity(HOST, SUB).unwrap();
        assert_eq!(
            parse_identity(id.as_bytes()),
            Some((CipherSuite::Aes128GcmSha256, HOST, SUB))
        );
        for bad in [
            "NVMe1R01 a b",
            "NVMe0R03 a b",
            "NVMe0R01 a",
            "NVMe0R01  b",
            "NVMe0R01 a b c",
            "NVMe0R01a b",
            "",
        ] {
            assert_eq!(parse_identity(bad.as_bytes()), None, "{bad}");
        }
        assert!(k.identity(&"h".repeat(240), SUB).is_err());
    }

    proptest! {
        #[test]
        fn parse_never_panics(s in ".{0,200}") {
            let _ = TlsPsk::parse(&s);
        }

        #[test]
        fn parse_identity_never_panics(b in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = parse_identity(&b);
        }

        #[test]
        fn encode_parse_round_trips(
            key in proptest::collection::vec(any::<u8>(), 32..=32),
            long in any::<bool>(),
            h in 0u8..3,
        ) {
            let mut key = key;
            if long { key.extend_from_slice(&[0x5a; 16]); }
            let hash = [PskHash::None, PskHash::Sha256, PskHash::Sha384][h as usize];
            let k = TlsPsk::new(&key, hash).unwrap();
            prop_assert_eq!(TlsPsk::parse(&k.encode()).unwrap(), k);
        }
    }
}
