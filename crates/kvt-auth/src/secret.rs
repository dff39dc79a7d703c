//! DH-HMAC-CHAP secrets in the NVMe representation `DHHC-1:<t>:<base64>:`, as
//! `nvme gen-dhchap-key` prints them: `<t>` is 00 (use as is) or the hash (01 SHA-256,
//! 02 SHA-384, 03 SHA-512) that transforms the secret with the NQN before use; the
//! base64 text holds a 32-, 48- or 64-byte secret followed by its CRC-32, little-endian.

use super::Digest;
use base64::Engine as _;
use zeroize::Zeroizing;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("not a DH-HMAC-CHAP secret (expected DHHC-1:<00..03>:<base64>:)")]
    Format,
    #[error("unknown secret transformation `{0}` (00, 01, 02 or 03)")]
    Transform(String),
    #[error("the secret is not valid base64")]
    Base64,
    #[error("the secret is {0} bytes (32, 48 or 64 expected)")]
    Length(usize),
    #[error("the secret's CRC-32 does not match (a damaged or mistyped key)")]
    Crc,
}

/// A host's or a controller's secret. Its bytes are wiped when it is dropped, and
/// `Debug` never shows them.
#[derive(Clone, PartialEq, Eq)]
pub struct DhchapSecret {
    key: Zeroizing<Vec<u8>>,
    /// None: 00, the secret is used untransformed.
    transform: Option<Digest>,
}

impl std::fmt::Debug for DhchapSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DhchapSecret({} bytes, transform {})",
            self.key.len(),
            self.transform.map_or("none", |d| d.name())
        )
    }
}

const PREFIX: &str = "DHHC-1:";

impl DhchapSecret {
    /// Parses the representation; surrounding whitespace (a key file's newline) is
    /// ignored.
    pub fn parse(text: &str) -> Result<DhchapSecret, SecretError> {
        let rest = text
            .trim()
            .strip_prefix(PREFIX)
            .ok_or(SecretError::Format)?;
        let (t, rest) = rest.split_once(':').ok_or(SecretError::Format)?;
        let transform = match t {
            "00" => None,
            "01" => Some(Digest::Sha256),
            "02" => Some(Digest::Sha384),
            "03" => Some(Digest::Sha512),
            _ => return Err(SecretError::Transform(t.chars().take(8).collect())),
        };
        let b64 = rest.strip_suffix(':').ok_or(SecretError::Format)?;
        if b64.contains(':') {
            return Err(SecretError::Format);
        }
        let raw = Zeroizing::new(
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|_| SecretError::Base64)?,
        );
        let len = raw.len().saturating_sub(4);
        if raw.len() < 4 || ![32, 48, 64].contains(&len) {
            return Err(SecretError::Length(len));
        }
        let (key, crc) = raw.split_at(len);
        if crc32fast::hash(key).to_le_bytes() != crc {
            return Err(SecretError::Crc);
        }
        Ok(DhchapSecret {
            key: Zeroizing::new(key.to_vec()),
            transform,
        })
    }

    /// A secret from raw bytes (32, 48 or 64 of them).
    pub fn new(key: &[u8], transform: Option<Digest>) -> Result<DhchapSecret, SecretError> {
        if ![32, 48, 64].contains(&key.len()) {
            return Err(SecretError::Length(key.len()));
        }
        Ok(DhchapSecret {
            key: Zeroizing::new(key.to_vec()),
            transform,
        })
    }

    /// The NVMe representation, as `nvme gen-dhchap-key` prints it.
    pub fn encode(&self) -> Zeroizing<String> {
        let mut raw = Zeroizing::new(self.key.to_vec());
        raw.extend_from_slice(&crc32fast::hash(&self.key).to_le_bytes());
        Zeroizing::new(format!(
            "{PREFIX}{:02x}:{}:",
            self.transform.map_or(0, |d| d.id()),
            base64::engine::general_purpose::STANDARD.encode(&*raw)
        ))
    }

    pub fn transform(&self) -> Option<Digest> {
        self.transform
    }

    /// The key the responses are computed with: the secret itself (00), else
    /// HMAC(secret, NQN || "NVMe-over-Fabrics") with the transformation's hash. The
    /// NQN is the host's for a host secret and the subsystem's for a controller
    /// secret.
    pub fn transformed(&self, nqn: &str) -> Zeroizing<Vec<u8>> {
        match self.transform {
            None => self.key.clone(),
            Some(d) => d.hmac(&self.key, &[nqn.as_bytes(), b"NVMe-over-Fabrics"]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_what_nvme_cli_prints() {
        // `nvme gen-dhchap-key` format: 32 zero bytes with their CRC-32 (zlib.crc32: 190a55ad).
        let mut raw = vec![0u8; 32];
        raw.extend_from_slice(&0x190a_55adu32.to_le_bytes());
        let text = format!(
            "DHHC-1:00:{}:\n",
            base64::engine::general_purpose::STANDARD.encode(&raw)
        );
        let s = DhchapSecret::parse(&text).unwrap();
        assert_eq!(s.transform(), None);
        assert_eq!(*s.transformed("nqn.h"), vec![0u8; 32]);
        assert_eq!(s.encode().as_str(), text.trim());
    }

    #[test]
    fn refuses_damage_with_the_reason() {
        let good = DhchapSecret::new(&[5; 48], Some(Digest::Sha384))
            .unwrap()
            .encode();
        assert!(DhchapSecret::parse(&good).is_ok());
        assert_eq!(
            DhchapSecret::parse(&good.replace("DHHC-1", "DHHC-2")),
            Err(SecretError::Format)
        );
        assert_eq!(
            DhchapSecret::parse(&good.replacen(":02:", ":07:", 1)),
            Err(SecretError::Transform("07".into()))
        );
        assert_eq!(
            DhchapSecret::parse(good.trim_end_matches(':')),
            Err(SecretError::Format)
        );
        // Flip one base64 character of the secret: the CRC catches it.
        let mut chars: Vec<char> = good.chars().collect();
        chars[12] = if chars[12] == 'A' { 'B' } else { 'A' };
        let flipped: String = chars.into_iter().collect();
        assert_eq!(DhchapSecret::parse(&flipped), Err(SecretError::Crc));
        assert_eq!(
            DhchapSecret::parse("DHHC-1:00:AAAA:"),
            Err(SecretError::Length(0))
        );
        assert_eq!(
            DhchapSecret::parse("DHHC-1:00:!!!!:"),
            Err(SecretError::Base64)
        );
        assert!(format!("{:?}", DhchapSecret::parse(&good).unwrap()).contains("48 bytes"));
    }

    #[test]
    fn transformation_is_hmac_of_nqn_and_label() {
        let s = DhchapSecret::new(&[1; 32], Some(Digest::Sha256)).unwrap();
        let t = s.transformed("nqn.h");
        assert_eq!(
            *t,
            *Digest::Sha256.hmac(&[1; 32], &[b"nqn.hNVMe-over-Fabrics"])
        );
        assert_ne!(*t, *s.transformed("nqn.other"));
        let s512 = DhchapSecret::new(&[1; 32], Some(Digest::Sha512)).unwrap();
        assert_eq!(s512.transformed("nqn.h").len(), 64);
    }

    proptest! {
        #[test]
        fn parse_never_panics(text in ".{0,200}") {
            let _ = DhchapSecret::parse(&text);
        }

        #[test]
        fn parse_never_panics_near_the_format(t in 0u8..6, body in "[A-Za-z0-9+/=:]{0,120}") {
            let _ = DhchapSecret::parse(&format!("DHHC-1:{t:02}:{body}"));
        }

        #[test]
        fn encode_round_trips(len in prop::sample::select(vec![32usize, 48, 64]),
                              byte in any::<u8>(), t in 0u8..4) {
            let key: Vec<u8> = (0..len).map(|i| byte.wrapping_add(i as u8)).collect();
            let s = DhchapSecret::new(&key, Digest::from_id(t)).unwrap();
            prop_assert_eq!(DhchapSecret::parse(&s.encode()), Ok(s));
        }
    }
}
