//! VFIO access to one PCIe function: container + group + device (IOMMU type 1), BAR0
//! mapped for MMIO, bus mastering enabled, and the DMA arena mapped into the
//! container's IOMMU domain.
//!
//! Memory ownership: BAR0 is an `mmap` of the device fd owned by `Vfio` and unmapped
//! in its `Drop`; `Bar` copies are only used while the `Vfio` (held by the
//! `Controller`, which every channel keeps alive through an `Arc`) exists. DMA
//! memory belongs to `kvt_mem::dma`, which never unmaps it; the container maps it
//! through the mapper registered here, and closing the container fd drops those
//! mappings.

use super::error::NvmeError;
use kvt_mem::dma;
use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::fs::FileExt;

// ioctl numbers from <linux/vfio.h>: _IO(';', 100 + n).
const VFIO_GET_API_VERSION: u64 = 0x3b64;
const VFIO_CHECK_EXTENSION: u64 = 0x3b65;
const VFIO_SET_IOMMU: u64 = 0x3b66;
const VFIO_GROUP_GET_STATUS: u64 = 0x3b67;
const VFIO_GROUP_SET_CONTAINER: u64 = 0x3b68;
const VFIO_GROUP_GET_DEVICE_FD: u64 = 0x3b6a;
const VFIO_DEVICE_GET_REGION_INFO: u64 = 0x3b6c;
const VFIO_IOMMU_MAP_DMA: u64 = 0x3b71;
const VFIO_API_VERSION: i32 = 0;
const VFIO_TYPE1_IOMMU: u64 = 1;
const VFIO_TYPE1V2_IOMMU: u64 = 3;
const VFIO_GROUP_FLAGS_VIABLE: u32 = 1;
const VFIO_REGION_INFO_FLAG_MMAP: u32 = 1 << 2;
const VFIO_DMA_MAP_FLAG_READ: u32 = 1;
const VFIO_DMA_MAP_FLAG_WRITE: u32 = 2;
const VFIO_PCI_BAR0_REGION_INDEX: u32 = 0;
const VFIO_PCI_CONFIG_REGION_INDEX: u32 = 7;
/// PCI command register: memory space + bus master enable.
const PCI_COMMAND: u64 = 4;
const PCI_COMMAND_MEMORY: u16 = 1 << 1;
const PCI_COMMAND_MASTER: u16 = 1 << 2;

#[repr(C)]
#[derive(Default)]
struct GroupStatus {
    argsz: u32,
    flags: u32,
}

#[repr(C)]
#[derive(Default)]
struct RegionInfo {
    argsz: u32,
    flags: u32,
    index: u32,
    cap_offset: u32,
    size: u64,
    offset: u64,
}

#[repr(C)]
struct DmaMap {
    argsz: u32,
    flags: u32,
    vaddr: u64,
    iova: u64,
    size: u64,
}

const _: () = assert!(std::mem::size_of::<RegionInfo>() == 32);
const _: () = assert!(std::mem::size_of::<DmaMap>() == 32);

fn sys_ioctl(fd: RawFd, req: u64, arg: *mut libc::c_void) -> std::io::Result<i32> {
    // SAFETY: every caller passes a request whose argument is either a plain value
    // or a pointer to a live, correctly sized #[repr(C)] struct it owns.
    let r = unsafe { libc::ioctl(fd, req as _, arg) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn ioctl(
    fd: RawFd,
    req: u64,
    arg: *mut libc::c_void,
    call: &'static str,
) -> Result<i32, NvmeError> {
    sys_ioctl(fd, req, arg).map_err(|source| NvmeError::Ioctl { call, source })
}

/// MMIO access to BAR0. 32-bit accesses only, as NVMe registers allow.
#[derive(Clone, Copy, Debug)]
pub struct Bar {
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is device memory shared with the controller anyway; each
// register has one writer (admin registers under the admin lock, each queue's
// doorbells by the channel that owns the queue).
unsafe impl Send for Bar {}
// SAFETY: as above.
unsafe impl Sync for Bar {}

impl Bar {
    pub fn read32(&self, off: usize) -> u32 {
        assert!(off + 4 <= self.len && off % 4 == 0, "BAR0 offset {off:#x}");
        // SAFETY: in bounds and aligned (checked); the mapping lives as long as the
        // owning `Vfio` (see module doc).
        unsafe { std::ptr::read_volatile(self.base.add(off) as *const u32) }
    }
    pub fn write32(&self, off: usize, v: u32) {
        assert!(off + 4 <= self.len && off % 4 == 0, "BAR0 offset {off:#x}");
        // SAFETY: as in read32.
        unsafe { std::ptr::write_volatile(self.base.add(off) as *mut u32, v) }
    }
    pub fn read64(&self, off: usize) -> u64 {
        self.read32(off) as u64 | (self.read32(off + 4) as u64) << 32
    }
    pub fn write64(&self, off: usize, v: u64) {
        self.write32(off, v as u32);
        self.write32(off + 4, (v >> 32) as u32);
    }
}

/// An open VFIO device with its own container.
pub struct Vfio {
    pub bdf: String,
    _container: File,
    _group: File,
    device: File,
    bar: Bar,
    mapper: Option<dma::MapperId>,
}

impl Vfio {
    pub fn open(bdf: &str) -> Result<Vfio, NvmeError> {
        let group_no = iommu_group(bdf)?;
        let (container, iommu) = open_container()?;
        let cfd = container.as_raw_fd();
        let group = open_group(&group_no, bdf)?;
        let gfd = group.as_raw_fd();
        let mut c = cfd;
        ioctl(
            gfd,
            VFIO_GROUP_SET_CONTAINER,
            &mut c as *mut _ as _,
            "VFIO_GROUP_SET_CONTAINER",
        )?;
        ioctl(cfd, VFIO_SET_IOMMU, iommu as _, "VFIO_SET_IOMMU")?;
        let name =
            std::ffi::CString::new(bdf).map_err(|_| NvmeError::BadAddress(bdf.to_string()))?;
        let dfd = ioctl(
            gfd,
            VFIO_GROUP_GET_DEVICE_FD,
            name.as_ptr() as _,
            "VFIO_GROUP_GET_DEVICE_FD",
        )?;
        // SAFETY: the ioctl returned a new fd that nothing else owns.
        let device = unsafe { File::from_raw_fd(dfd) };
        let bar = map_bar0(&device, bdf)?;
        let mut me = Vfio {
            bdf: bdf.to_string(),
            _container: container,
            _group: group,
            device,
            bar,
            mapper: None,
        };
        me.set_bus_master(true)?;
        let map_fd = me._container.try_clone().map_err(NvmeError::DupContainer)?;
        let id = dma::register_mapper(move |r| map_dma(&map_fd, r)).map_err(|source| {
            NvmeError::DmaMapping {
                bdf: bdf.to_string(),
                source,
            }
        })?;
        me.mapper = Some(id);
        Ok(me)
    }

    pub fn bar(&self) -> Bar {
        self.bar
    }

    /// Sets or clears bus mastering (and memory space decoding) in PCI config space.
    pub fn set_bus_master(&self, on: bool) -> Result<(), NvmeError> {
        let cfg = region_info(&self.device, VFIO_PCI_CONFIG_REGION_INDEX)?;
        let mut b = [0u8; 2];
        self.device
            .read_exact_at(&mut b, cfg.offset + PCI_COMMAND)
            .map_err(|source| NvmeError::PciCommand {
                bdf: self.bdf.clone(),
                access: "read",
                source,
            })?;
        let mut cmd = u16::from_le_bytes(b);
        if on {
            cmd |= PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER;
        } else {
            cmd &= !PCI_COMMAND_MASTER;
        }
        self.device
            .write_all_at(&cmd.to_le_bytes(), cfg.offset + PCI_COMMAND)
            .map_err(|source| NvmeError::PciCommand {
                bdf: self.bdf.clone(),
                access: "write",
                source,
            })
    }
}

fn region_info(device: &File, index: u32) -> Result<RegionInfo, NvmeError> {
    let mut ri = RegionInfo {
        argsz: std::mem::size_of::<RegionInfo>() as u32,
        index,
        ..Default::default()
    };
    ioctl(
        device.as_raw_fd(),
        VFIO_DEVICE_GET_REGION_INFO,
        &mut ri as *mut _ as _,
        "VFIO_DEVICE_GET_REGION_INFO",
    )?;
    Ok(ri)
}

fn map_dma(container: &File, r: &dma::DmaRange) -> Result<(), dma::DmaError> {
    let mut m = DmaMap {
        argsz: std::mem::size_of::<DmaMap>() as u32,
        flags: VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE,
        vaddr: r.vaddr as u64,
        iova: r.iova,
        size: r.len as u64,
    };
    sys_ioctl(
        container.as_raw_fd(),
        VFIO_IOMMU_MAP_DMA,
        &mut m as *mut _ as _,
    )
    .map(|_| ())
    .map_err(|e| dma::DmaError::Map {
        call: "VFIO_IOMMU_MAP_DMA",
        // last_os_error always carries an errno.
        errno: e.raw_os_error().unwrap_or(libc::EIO),
    })
}

/// Opens `p` for reading and writing.
fn open_rw(p: &str) -> Result<File, NvmeError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(p)
        .map_err(|source| NvmeError::Open {
            path: p.to_string(),
            source,
        })
}

/// The IOMMU group of device `bdf`, which must be bound to vfio-pci.
fn iommu_group(bdf: &str) -> Result<String, NvmeError> {
    let sys = format!("/sys/bus/pci/devices/{bdf}");
    let driver = std::fs::read_link(format!("{sys}/driver"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
    if driver.as_deref() != Some("vfio-pci") {
        return Err(NvmeError::NotVfio {
            bdf: bdf.to_string(),
            driver: driver.unwrap_or_else(|| "no driver".into()),
        });
    }
    let group = std::fs::read_link(format!("{sys}/iommu_group")).map_err(|source| {
        NvmeError::NoIommuGroup {
            bdf: bdf.to_string(),
            source,
        }
    })?;
    let group_no = group
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(group_no)
}

/// A new VFIO container and the type-1 IOMMU it offers (v2 if it can).
fn open_container() -> Result<(File, u64), NvmeError> {
    let container = open_rw("/dev/vfio/vfio")?;
    let cfd = container.as_raw_fd();
    let v = ioctl(
        cfd,
        VFIO_GET_API_VERSION,
        std::ptr::null_mut(),
        "VFIO_GET_API_VERSION",
    )?;
    if v != VFIO_API_VERSION {
        return Err(NvmeError::ApiVersion {
            got: v,
            expected: VFIO_API_VERSION,
        });
    }
    let iommu = if ioctl(cfd, VFIO_CHECK_EXTENSION, VFIO_TYPE1V2_IOMMU as _, "check")? > 0 {
        VFIO_TYPE1V2_IOMMU
    } else if ioctl(cfd, VFIO_CHECK_EXTENSION, VFIO_TYPE1_IOMMU as _, "check")? > 0 {
        VFIO_TYPE1_IOMMU
    } else {
        return Err(NvmeError::NoType1Iommu);
    };
    Ok((container, iommu))
}

/// Opens VFIO group `group_no` (of device `bdf`), which must be viable.
fn open_group(group_no: &str, bdf: &str) -> Result<File, NvmeError> {
    let gpath = format!("/dev/vfio/{group_no}");
    let group = open_rw(&gpath)?;
    let gfd = group.as_raw_fd();
    let mut st = GroupStatus {
        argsz: std::mem::size_of::<GroupStatus>() as u32,
        flags: 0,
    };
    ioctl(
        gfd,
        VFIO_GROUP_GET_STATUS,
        &mut st as *mut _ as _,
        "VFIO_GROUP_GET_STATUS",
    )?;
    if st.flags & VFIO_GROUP_FLAGS_VIABLE == 0 {
        return Err(NvmeError::GroupNotViable {
            group: group_no.to_string(),
            bdf: bdf.to_string(),
        });
    }
    Ok(group)
}

/// Maps the device's BAR0 (the controller's registers).
fn map_bar0(device: &File, bdf: &str) -> Result<Bar, NvmeError> {
    let bar0 = region_info(device, VFIO_PCI_BAR0_REGION_INDEX)?;
    if bar0.flags & VFIO_REGION_INFO_FLAG_MMAP == 0 || bar0.size < 0x2000 {
        return Err(NvmeError::Bar0 {
            bdf: bdf.to_string(),
            size: bar0.size,
        });
    }
    // SAFETY: maps the device's BAR0 region as VFIO describes it; the mapping
    // is owned by the returned `Vfio` and unmapped in Drop.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bar0.size as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            device.as_raw_fd(),
            bar0.offset as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(NvmeError::MapBar0 {
            bdf: bdf.to_string(),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(Bar {
        base: p as *mut u8,
        len: bar0.size as usize,
    })
}

impl Drop for Vfio {
    fn drop(&mut self) {
        if let Some(id) = self.mapper.take() {
            dma::unregister_mapper(id);
        }
        let _ = self.set_bus_master(false);
        // SAFETY: unmaps exactly the BAR0 mapping made in `open`; no `Bar` copy is
        // used after the owning controller is dropped.
        unsafe { libc::munmap(self.bar.base as *mut libc::c_void, self.bar.len) };
        // The container, group and device fds close with their `File`s, which
        // drops the IOMMU mappings and lets another driver take the device.
    }
}
