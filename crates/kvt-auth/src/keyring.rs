//! Named keys read from files, as SPDK's `keyring_file` module keeps them: a key is
//! added by name and path (`[[keys]]` in the configuration, `keyring_file_add_key`
//! over RPC), and host entries refer to it by name. The file must be readable by its
//! owner only (SPDK refuses others too). Key text is held in memory that is wiped
//! when the last reference goes; only names and paths are ever printed.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use zeroize::Zeroizing;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("key name must be 1..=128 characters without whitespace")]
    Name,
    #[error("key `{0}` already exists")]
    Exists(String),
    #[error("no key `{0}`")]
    NotFound(String),
    #[error("key path `{0}` is not absolute")]
    Relative(String),
    #[error("key file `{path}`: {reason}")]
    File { path: String, reason: String },
    #[error("key file `{path}` is accessible by group or others (mode {mode:o}; chmod 600 it)")]
    Permissions { path: String, mode: u32 },
}

/// One named key: its file and its text.
pub struct Key {
    pub name: String,
    pub path: PathBuf,
    text: Zeroizing<String>,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key({} at {})", self.name, self.path.display())
    }
}

impl Key {
    /// Reads `path` (absolute, mode 0600 or stricter).
    pub fn load(name: &str, path: &Path) -> Result<Key, KeyError> {
        if name.is_empty() || name.len() > 128 || name.chars().any(char::is_whitespace) {
            return Err(KeyError::Name);
        }
        let shown = path.display().to_string();
        if !path.is_absolute() {
            return Err(KeyError::Relative(shown));
        }
        let file_err = |e: std::io::Error| KeyError::File {
            path: shown.clone(),
            reason: e.to_string(),
        };
        let meta = std::fs::metadata(path).map_err(file_err)?;
        if !meta.is_file() {
            return Err(KeyError::File {
                path: shown,
                reason: "not a regular file".into(),
            });
        }
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(KeyError::Permissions { path: shown, mode });
        }
        let text = Zeroizing::new(std::fs::read_to_string(path).map_err(file_err)?);
        Ok(Key {
            name: name.to_string(),
            path: path.to_path_buf(),
            text,
        })
    }

    /// A key held in memory only (tests, and keys built by the program).
    pub fn from_text(name: &str, text: &str) -> Key {
        Key {
            name: name.to_string(),
            path: PathBuf::new(),
            text: Zeroizing::new(text.to_string()),
        }
    }

    /// The key as a DH-HMAC-CHAP secret.
    pub fn dhchap(&self) -> Result<super::DhchapSecret, super::SecretError> {
        super::DhchapSecret::parse(&self.text)
    }

    /// The key as an NVMe/TCP TLS PSK (interchange format).
    pub fn tls_psk(&self) -> Result<super::TlsPsk, super::PskError> {
        super::TlsPsk::parse(&self.text)
    }
}

/// The target's keys by name.
#[derive(Default)]
pub struct Keyring {
    keys: Mutex<BTreeMap<String, Arc<Key>>>,
}

impl Keyring {
    pub fn add(&self, key: Key) -> Result<Arc<Key>, KeyError> {
        let mut k = self.keys.lock().map_err(|_| KeyError::Name)?;
        if k.contains_key(&key.name) {
            return Err(KeyError::Exists(key.name.clone()));
        }
        let key = Arc::new(key);
        k.insert(key.name.clone(), key.clone());
        Ok(key)
    }

    /// Removes a key from the ring; host entries using it keep their reference
    /// (as SPDK's keys stay alive while referenced).
    pub fn remove(&self, name: &str) -> Result<(), KeyError> {
        let mut k = self.keys.lock().map_err(|_| KeyError::Name)?;
        k.remove(name)
            .map(|_| ())
            .ok_or_else(|| KeyError::NotFound(name.to_string()))
    }

    pub fn get(&self, name: &str) -> Result<Arc<Key>, KeyError> {
        self.keys
            .lock()
            .ok()
            .and_then(|k| k.get(name).cloned())
            .ok_or_else(|| KeyError::NotFound(name.to_string()))
    }

    /// Every key, by name.
    pub fn list(&self) -> Vec<Arc<Key>> {
        self.keys
            .lock()
            .map(|k| k.values().cloned().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_must_be_absolute_private_and_readable() {
        let dir = std::env::temp_dir().join(format!("kvt-keyring-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("k0");
        std::fs::write(&path, "DHHC-1:00:x:\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            Key::load("k0", &path),
            Err(KeyError::Permissions { mode: 0o644, .. })
        ));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let k = Key::load("k0", &path).unwrap();
        assert_eq!(format!("{k:?}"), format!("Key(k0 at {})", path.display()));
        assert!(matches!(
            Key::load("k0", Path::new("rel/k0")),
            Err(KeyError::Relative(_))
        ));
        assert!(matches!(
            Key::load("k0", &dir.join("absent")),
            Err(KeyError::File { .. })
        ));
        assert_eq!(Key::load("a b", &path).err(), Some(KeyError::Name));
        let ring = Keyring::default();
        ring.add(k).unwrap();
        assert_eq!(
            ring.add(Key::load("k0", &path).unwrap()).err(),
            Some(KeyError::Exists("k0".into()))
        );
        assert_eq!(ring.list().len(), 1);
        assert!(ring.get("k0").is_ok());
        ring.remove("k0").unwrap();
        assert_eq!(ring.remove("k0"), Err(KeyError::NotFound("k0".into())));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
