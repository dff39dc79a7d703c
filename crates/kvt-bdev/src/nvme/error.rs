//! What can go wrong driving a controller from user space, as values: sysfs driver
//! hand-over, VFIO set-up, bring-up and admin commands. The server and the `nvme`
//! tool print them as one line naming the PCI address.

use super::spec::IdentifyError;
use kvt_mem::dma::DmaError;
use std::io;

#[derive(Debug, thiserror::Error)]
pub enum NvmeError {
    // sysfs (pci.rs)
    #[error("`{0}` is not a PCI address like 0000:00:04.0")]
    NotPciAddress(String),
    #[error("write `{value}` to {path}: {source}")]
    SysfsWrite {
        value: String,
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("{0}: no such PCI device")]
    NoSuchDevice(String),
    #[error("{bdf}: not an NVMe controller (class {class})")]
    NotNvme { bdf: String, class: String },
    #[error("{bdf}: driver {driver} is not loaded (modprobe {driver})")]
    DriverNotLoaded { bdf: String, driver: String },
    #[error("{bdf}: still bound to {bound} after probing for {target}")]
    StillBound {
        bdf: String,
        bound: String,
        target: String,
    },

    // VFIO (vfio.rs)
    #[error("{bdf} is bound to {driver} not vfio-pci (run `kvtarget nvme bind {bdf}`)")]
    NotVfio { bdf: String, driver: String },
    #[error("{bdf}: no IOMMU group ({source}); is the IOMMU on?")]
    NoIommuGroup {
        bdf: String,
        #[source]
        source: io::Error,
    },
    #[error("{path}: {source}")]
    Open {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("{call}: {source}")]
    Ioctl {
        call: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("VFIO API version {got}, expected {expected}")]
    ApiVersion { got: i32, expected: i32 },
    #[error("VFIO has no type 1 IOMMU (load vfio_iommu_type1)")]
    NoType1Iommu,
    #[error("IOMMU group {group} of {bdf} is not viable (bind every device in it to vfio-pci)")]
    GroupNotViable { group: String, bdf: String },
    #[error("bad PCI address {0}")]
    BadAddress(String),
    #[error("{bdf}: BAR0 cannot be mapped (size {size:#x})")]
    Bar0 { bdf: String, size: u64 },
    #[error("{bdf}: mmap BAR0: {source}")]
    MapBar0 {
        bdf: String,
        #[source]
        source: io::Error,
    },
    /// Reading or writing the PCI command register in config space.
    #[error("{bdf}: {access} PCI command: {source}")]
    PciCommand {
        bdf: String,
        access: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("dup container fd: {0}")]
    DupContainer(#[source] io::Error),
    #[error("{bdf}: mapping DMA memory into the IOMMU: {source}")]
    DmaMapping {
        bdf: String,
        #[source]
        source: DmaError,
    },
    /// A buffer the controller must reach (a queue ring, the admin scratch page)
    /// is outside the DMA arena's mapped chunks.
    #[error("{0} is not DMA-mapped")]
    NotDmaMapped(&'static str),

    // bring-up and admin commands (controller.rs)
    #[error("{0}: controller lacks the NVM command set")]
    NoNvmCommandSet(String),
    #[error("{bdf}: minimum page size {bytes} > 4096")]
    PageSize { bdf: String, bytes: u64 },
    #[error("{bdf}: {source}")]
    Identify {
        bdf: String,
        #[source]
        source: IdentifyError,
    },
    #[error("{bdf} namespace {nsid}: {source}")]
    IdentifyNamespace {
        bdf: String,
        nsid: u32,
        #[source]
        source: IdentifyError,
    },
    #[error("{0}: controller is gone")]
    Gone(String),
    #[error("{0}: controller fatal status while enabling")]
    FatalWhileEnabling(String),
    #[error("{bdf}: CSTS.RDY did not become {want} within {timeout_ms} ms")]
    ReadyTimeout {
        bdf: String,
        want: u8,
        timeout_ms: u64,
    },
    #[error("{bdf}: admin opcode {opcode:#x} failed with status {status:#x}")]
    AdminFailed {
        bdf: String,
        opcode: u8,
        status: u16,
    },
    #[error("{bdf}: admin opcode {opcode:#x} timed out; resetting the controller")]
    AdminTimeout { bdf: String, opcode: u8 },
    #[error("{bdf}: namespace {nsid} does not exist (the controller has {count})")]
    NoNamespace { bdf: String, nsid: u32, count: u32 },
    #[error("{0}: no I/O queue left for another channel")]
    NoQueueId(String),
}
