//! Hands named PCIe NVMe controllers between the kernel `nvme` driver and vfio-pci
//! through sysfs `driver_override` (like SPDK's setup.sh, but only for the devices
//! named on the command line).

use super::error::NvmeError;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const SYS_PCI: &str = "/sys/bus/pci";
/// PCI class code of an NVMe controller (mass storage, NVM, NVMe).
const CLASS_NVME: &str = "0x010802";
/// How long a driver gets to bind after a probe.
const BIND_WAIT: Duration = Duration::from_secs(10);

/// Checks a PCI address has the sysfs form `dddd:bb:dd.f`.
pub fn parse_bdf(s: &str) -> Result<String, NvmeError> {
    let b = s.as_bytes();
    let hex = |r: std::ops::Range<usize>| b[r].iter().all(|c| c.is_ascii_hexdigit());
    if b.len() == 12
        && hex(0..4)
        && b[4] == b':'
        && hex(5..7)
        && b[7] == b':'
        && hex(8..10)
        && b[10] == b'.'
        && (b'0'..=b'7').contains(&b[11])
    {
        Ok(s.to_ascii_lowercase())
    } else {
        Err(NvmeError::NotPciAddress(s.to_string()))
    }
}

fn dev_dir(bdf: &str) -> PathBuf {
    Path::new(SYS_PCI).join("devices").join(bdf)
}

/// The driver a device is bound to, if any.
pub fn driver_of(bdf: &str) -> Option<String> {
    std::fs::read_link(dev_dir(bdf).join("driver"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
}

fn write(path: &Path, v: &str) -> Result<(), NvmeError> {
    std::fs::write(path, v).map_err(|source| NvmeError::SysfsWrite {
        value: v.trim().to_string(),
        path: path.display().to_string(),
        source,
    })
}

fn rebind(bdf: &str, target: &str, override_to: &str) -> Result<(), NvmeError> {
    let dir = dev_dir(bdf);
    if !dir.exists() {
        return Err(NvmeError::NoSuchDevice(bdf.to_string()));
    }
    let class = std::fs::read_to_string(dir.join("class")).unwrap_or_default();
    if class.trim() != CLASS_NVME {
        return Err(NvmeError::NotNvme {
            bdf: bdf.to_string(),
            class: class.trim().to_string(),
        });
    }
    if driver_of(bdf).as_deref() == Some(target) {
        return Ok(());
    }
    if !Path::new(SYS_PCI).join("drivers").join(target).exists() {
        return Err(NvmeError::DriverNotLoaded {
            bdf: bdf.to_string(),
            driver: target.to_string(),
        });
    }
    write(&dir.join("driver_override"), override_to)?;
    if driver_of(bdf).is_some() {
        write(&dir.join("driver/unbind"), bdf)?;
    }
    write(&Path::new(SYS_PCI).join("drivers_probe"), bdf)?;
    let start = Instant::now();
    while start.elapsed() < BIND_WAIT {
        if driver_of(bdf).as_deref() == Some(target) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(NvmeError::StillBound {
        bdf: bdf.to_string(),
        bound: driver_of(bdf).unwrap_or_else(|| "no driver".into()),
        target: target.to_string(),
    })
}

/// Moves a controller to vfio-pci.
pub fn bind_vfio(bdf: &str) -> Result<(), NvmeError> {
    rebind(bdf, "vfio-pci", "vfio-pci")
}

/// Hands a controller back to the kernel `nvme` driver.
pub fn unbind_vfio(bdf: &str) -> Result<(), NvmeError> {
    rebind(bdf, "nvme", "\n")
}

/// Every NVMe controller on the PCI bus: (address, driver).
pub fn list() -> Vec<(String, Option<String>)> {
    let mut v = Vec::new();
    if let Ok(rd) = std::fs::read_dir(Path::new(SYS_PCI).join("devices")) {
        for e in rd.flatten() {
            let bdf = e.file_name().to_string_lossy().into_owned();
            let class = std::fs::read_to_string(e.path().join("class")).unwrap_or_default();
            if class.trim() == CLASS_NVME {
                let drv = driver_of(&bdf);
                v.push((bdf, drv));
            }
        }
    }
    v.sort();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_addresses() {
        assert_eq!(parse_bdf("0000:00:04.0").unwrap(), "0000:00:04.0");
        assert_eq!(parse_bdf("0000:AF:00.1").unwrap(), "0000:af:00.1");
        for bad in [
            "00:04.0",
            "0000:00:04.8",
            "0000-00:04.0",
            "0000:00:04.0\n",
            "",
        ] {
            assert!(parse_bdf(bad).is_err(), "{bad:?}");
        }
    }
}
