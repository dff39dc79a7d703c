//! The device a pool or a plain namespace sits on: one description
//! (`backend`, `path`, `pci`, `nvme_nsid`, `trid`, `size`) and one set of rules
//! for both.
//!
//! The fields are declared in `PoolConfig` and `NamespaceConfig` themselves:
//! serde's `flatten` cannot be combined with `deny_unknown_fields`, and an
//! unknown key must stay an error with its line. `DeviceSpec` is the shared
//! view both hand out, and everything that checks or opens a device takes it.

use super::ConfigError;
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Ram,
    Uring,
    /// A namespace of a PCIe NVMe controller driven by kvtarget's own driver (VFIO).
    Nvme,
    /// A namespace behind SPDK's NVMe driver: PCIe, or NVMe-oF through SPDK's host
    /// (needs a build with `--features spdk`).
    Spdk,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Ram => "ram",
            Backend::Uring => "uring",
            Backend::Nvme => "nvme",
            Backend::Spdk => "spdk",
        }
    }
}

/// The namespace of a controller used when `nvme_nsid` is not given.
pub const DEFAULT_NVME_NSID: u32 = 1;

/// A device description, borrowed from a pool or a namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceSpec<'a> {
    pub backend: Backend,
    /// A file or block device (`uring`).
    pub path: Option<&'a Path>,
    /// The PCI address of an `nvme` controller ("0000:00:04.0").
    pub pci: Option<&'a str>,
    /// The controller's namespace (`nvme`, `spdk`); default [`DEFAULT_NVME_NSID`].
    pub nvme_nsid: Option<u32>,
    /// An SPDK transport ID (`spdk`).
    pub trid: Option<&'a str>,
    /// Bytes of a RAM device, or of a file created for it.
    pub size: Option<u64>,
}

/// What holds the device, for the rules that differ between the two.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Holder {
    Pool,
    /// A plain namespace; `block_size` tells whether one was given.
    Namespace {
        block_size: bool,
    },
}

impl DeviceSpec<'_> {
    pub fn nsid(&self) -> u32 {
        self.nvme_nsid.unwrap_or(DEFAULT_NVME_NSID)
    }

    /// The backend's required and refused fields; `f` is the holder's path.
    pub(super) fn validate(&self, f: &str, holder: Holder) -> Result<(), ConfigError> {
        match self.backend {
            Backend::Ram => {
                if self.size.is_none() {
                    return Err(invalid!("{f}.size", "required for the ram backend"));
                }
                if self.path.is_some() {
                    return Err(invalid!("{f}.path", "the ram backend takes no path"));
                }
            }
            Backend::Uring => {
                if self.path.is_none() {
                    return Err(invalid!("{f}.path", "required for the uring backend"));
                }
            }
            Backend::Nvme | Backend::Spdk => self.validate_no_geometry(f, holder)?,
        }
        self.validate_nvme(f)?;
        self.validate_spdk(f)
    }

    /// A controller's namespace brings its own size and block size.
    fn validate_no_geometry(&self, f: &str, holder: Holder) -> Result<(), ConfigError> {
        let name = self.backend.name();
        match holder {
            Holder::Pool if self.path.is_some() || self.size.is_some() => Err(invalid!(
                "{f}",
                "the {name} backend takes no path or size (the namespace has them)"
            )),
            Holder::Namespace { block_size }
                if self.path.is_some() || self.size.is_some() || block_size =>
            {
                Err(invalid!("{f}", "the {name} backend takes no path, size or block_size (the controller's namespace has them)"))
            }
            _ => Ok(()),
        }
    }

    /// `pci` and `nvme_nsid` belong to the nvme backend, which needs a valid `pci`.
    fn validate_nvme(&self, f: &str) -> Result<(), ConfigError> {
        let nsid = self.nvme_nsid;
        if nsid == Some(0) || nsid == Some(u32::MAX) {
            return Err(invalid!("{f}.nvme_nsid", "must be a namespace id from 1"));
        }
        if self.backend != Backend::Nvme {
            if self.pci.is_some() {
                return Err(invalid!(
                    "{f}.pci",
                    "`pci` only applies to the nvme backend"
                ));
            }
            if nsid.is_some() && self.backend != Backend::Spdk {
                return Err(invalid!(
                    "{f}.nvme_nsid",
                    "only applies to the nvme and spdk backends"
                ));
            }
            return Ok(());
        }
        let Some(pci) = self.pci else {
            return Err(invalid!("{f}.pci", "required for the nvme backend"));
        };
        kvt_bdev::nvme::pci::parse_bdf(pci).map_err(|e| invalid!("{f}.pci", "{e}"))?;
        Ok(())
    }

    /// `trid` belongs to the spdk backend, which needs a valid one and a build
    /// with SPDK.
    fn validate_spdk(&self, f: &str) -> Result<(), ConfigError> {
        if self.backend != Backend::Spdk {
            if self.trid.is_some() {
                return Err(invalid!("{f}.trid", "only applies to the spdk backend"));
            }
            return Ok(());
        }
        let Some(trid) = self.trid else {
            return Err(invalid!(
                "{f}.trid",
                "required for the spdk backend (e.g. \"trtype:PCIe traddr:0000:00:04.0\")"
            ));
        };
        trid.parse::<kvt_bdev::spdk::TransportId>()
            .map_err(|e| invalid!("{f}.trid", "{e}"))?;
        if !kvt_bdev::spdk::AVAILABLE {
            return Err(invalid!(
                "{f}.backend",
                "{}",
                kvt_bdev::spdk::SpdkError::NotBuilt
            ));
        }
        Ok(())
    }

    /// The controller namespace an `spdk` device names, comparable across
    /// spellings of the same transport ID.
    pub(super) fn spdk_key(&self) -> Option<(String, u32)> {
        let t = self.trid?.parse::<kvt_bdev::spdk::TransportId>().ok()?;
        Some((t.spdk_string(), self.nsid()))
    }
}
