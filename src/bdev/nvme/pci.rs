//! Hands named PCIe NVMe controllers between the kernel `nvme` driver and vfio-pci
//! through sysfs `driver_override` (like SPDK's setup.sh, but only for the devices
//! named on the command line).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const SYS_PCI: &str = "/sys/bus/pci";
/// PCI class code of an NVMe controller (mass storage, NVM, NVMe).
const CLASS_NVME: &str = "0x010802";
/// How long a driver gets to bind after a probe.
const BIND_WAIT: Duration = Duration::from_secs(10);

/// Checks a PCI address has the sysfs form `dddd:bb:dd.f`.
pub fn parse_bdf(s: &str) -> Result<String, String> {
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
        Err(format!("`{s}` is not a PCI address like 0000:00:04.0"))
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

fn write(path: &Path, v: &str) -> Result<(), String> {
    std::fs::write(path, v).map_err(|e| format!("write `{}` to {}: {e}", v.trim(), path.display()))
}

fn rebind(bdf: &str, target: &str, override_to: &str) -> Result<(), String> {
    let dir = dev_dir(bdf);
    if !dir.exists() {
        return Err(format!("{bdf}: no such PCI device"));
    }
    let class = std::fs::read_to_string(dir.join("class")).unwrap_or_default();
    if class.trim() != CLASS_NVME {
        return Err(format!(
            "{bdf}: not an NVMe controller (class {})",
            class.trim()
        ));
    }
    if driver_of(bdf).as_deref() == Some(target) {
        return Ok(());
    }
    if !Path::new(SYS_PCI).join("drivers").join(target).exists() {
        return Err(format!(
            "{bdf}: driver {target} is not loaded (modprobe {target})"
        ));
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
    Err(format!(
        "{bdf}: still bound to {} after probing for {target}",
        driver_of(bdf).as_deref().unwrap_or("no driver")
    ))
}

/// Moves a controller to vfio-pci.
pub fn bind_vfio(bdf: &str) -> Result<(), String> {
    rebind(bdf, "vfio-pci", "vfio-pci")
}

/// Hands a controller back to the kernel `nvme` driver.
pub fn unbind_vfio(bdf: &str) -> Result<(), String> {
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

/// `kvtarget nvme list|bind|unbind [PCI...]`.
pub fn command(args: &[String]) -> Result<(), String> {
    let usage = "usage: kvtarget nvme list | bind PCI... | unbind PCI...";
    let (verb, rest) = args.split_first().ok_or(usage)?;
    let bdfs = rest
        .iter()
        .map(|a| parse_bdf(a))
        .collect::<Result<Vec<_>, _>>()?;
    match verb.as_str() {
        "list" => {
            for (bdf, drv) in list() {
                println!("{bdf} {}", drv.as_deref().unwrap_or("-"));
            }
            Ok(())
        }
        "bind" | "unbind" if bdfs.is_empty() => {
            Err(format!("{verb}: name at least one PCI address"))
        }
        "bind" => bdfs.iter().try_for_each(|b| {
            bind_vfio(b)?;
            println!("{b} vfio-pci");
            Ok(())
        }),
        "unbind" => bdfs.iter().try_for_each(|b| {
            unbind_vfio(b)?;
            println!("{b} nvme");
            Ok(())
        }),
        _ => Err(usage.into()),
    }
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
