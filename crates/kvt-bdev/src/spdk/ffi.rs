//! Safe owning wrappers over the SPDK calls the `spdk` backend makes: the
//! environment, a controller, a namespace's facts and an I/O queue pair. This and
//! `spdk-sys` are the only places that touch SPDK memory; every `unsafe` block says
//! why it holds.
//!
//! Who owns what:
//! - SPDK's environment (DPDK EAL, hugepage memory) is process-wide: initialised
//!   once by `init_env`, finalised by `shutdown` after every controller detached.
//! - A `Controller` owns its `spdk_nvme_ctrlr` and the thread that polls its admin
//!   queue (keep-alive, asynchronous events); it detaches when the last `Arc` goes,
//!   which is after every queue pair of it (each holds an `Arc`).
//! - An `IoQpair` owns its `spdk_nvme_qpair`, one reactor uses it (SPDK's queue
//!   pairs are not thread safe; the type is `Send`, not `Sync`), and it owns every
//!   buffer of a command until the command's callback has run: a buffer moves in
//!   with `submit` and comes back out of `process`. Callback cells live in a boxed
//!   array freed only after the queue pair is.

use super::{SpdkError, TransportId};
use kvt_mem::IoBuf;
use spdk_sys::ffi;
use std::ffi::{c_void, CString};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

/// How SPDK's environment is set up (from the `[spdk]` config section).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvOptions {
    /// Run without hugepages (DPDK `--no-huge`): ordinary memory of `mem_size_mib`.
    pub no_huge: bool,
    /// Memory SPDK may take, MiB; `None` lets DPDK grow it on demand (hugepages).
    pub mem_size_mib: Option<u32>,
    /// The hugetlbfs mount to use; DPDK finds one itself when `None`.
    pub hugedir: Option<String>,
    /// Skip the PCI bus scan (no PCIe controller is configured).
    pub no_pci: bool,
}

static ENV: OnceLock<Result<(), SpdkError>> = OnceLock::new();
static CONTROLLERS: Mutex<Vec<Weak<Controller>>> = Mutex::new(Vec::new());
static DMA_MAPPER: OnceLock<Result<(), kvt_mem::dma::DmaError>> = OnceLock::new();

fn cstr(what: &str, s: &str) -> Result<CString, SpdkError> {
    CString::new(s).map_err(|_| SpdkError::Invalid(format!("{what} contains a NUL byte")))
}

/// Initialises SPDK's environment once per process; later calls return the first
/// call's outcome (DPDK's EAL cannot be initialised twice).
pub fn init_env(opts: &EnvOptions) -> Result<(), SpdkError> {
    ENV.get_or_init(|| init_env_once(opts)).clone()
}

fn init_env_once(o: &EnvOptions) -> Result<(), SpdkError> {
    // Strings handed to SPDK must outlive spdk_env_init; DPDK copies what it keeps.
    let name = cstr("the process name", "kvtarget")?;
    // One core mask bit: DPDK's main lcore. kvtarget's reactors are its own
    // threads (SPDK's reactors are never started), so the mask only says where
    // DPDK's control thread would run.
    let mask = cstr("the core mask", "0x1")?;
    let hugedir = match &o.hugedir {
        Some(d) => Some(cstr("spdk.hugedir", d)?),
        None => None,
    };
    // Extra EAL arguments: no telemetry socket (two SPDK processes on one machine
    // would fight over it), DPDK's own log kept to warnings.
    let mut context = *b"--no-telemetry --log-level=lib.eal:warning\0";
    // SAFETY: spdk_env_opts is a plain C struct; spdk_env_opts_init fills every
    // field (including opts_size) before we change any.
    let mut opts: ffi::spdk_env_opts = unsafe { std::mem::zeroed() };
    opts.opts_size = std::mem::size_of::<ffi::spdk_env_opts>();
    // SAFETY: `opts` is a valid, writable spdk_env_opts.
    unsafe { ffi::spdk_env_opts_init(&mut opts) };
    opts.name = name.as_ptr();
    opts.core_mask = mask.as_ptr();
    // A negative shm id gives a per-process DPDK file prefix, so kvtarget and an
    // SPDK nvmf_tgt can run side by side.
    opts.shm_id = -1;
    opts.no_pci = o.no_pci;
    opts.no_huge = o.no_huge;
    // Hugepage files are unlinked once mapped: a killed target leaves none behind.
    // (DPDK refuses hugepage options together with --no-huge.)
    opts.unlink_hugepage = !o.no_huge;
    if let Some(mb) = o.mem_size_mib {
        opts.mem_size = mb as i32;
    } else if o.no_huge {
        opts.mem_size = 1024;
    }
    if let (Some(d), false) = (&hugedir, o.no_huge) {
        opts.hugedir = d.as_ptr();
    }
    opts.env_context = context.as_mut_ptr().cast();
    // DPDK pins the thread that initialises it to its main lcore; kvtarget's own
    // threads spawned later must not inherit that, so the mask is put back.
    let affinity = save_affinity();
    // SAFETY: `opts` is initialised and every pointer in it (name, mask, hugedir,
    // context) points at memory alive for this call.
    let rc = unsafe { ffi::spdk_env_init(&opts) };
    restore_affinity(affinity);
    if rc != 0 {
        let hint = if o.no_huge {
            "check spdk.mem_size"
        } else {
            "often: no usable hugepages; mount hugetlbfs and reserve pages (ci/hugepages.sh does both) or set spdk.no_huge = true"
        };
        return Err(SpdkError::EnvInit { errno: -rc, hint });
    }
    tracing::info!(
        version = spdk_sys::VERSION,
        no_huge = o.no_huge,
        no_pci = o.no_pci,
        "SPDK environment initialised"
    );
    Ok(())
}

fn save_affinity() -> Option<libc::cpu_set_t> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity writes it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is writable and its size is passed.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    (rc == 0).then_some(set)
}

fn restore_affinity(set: Option<libc::cpu_set_t>) {
    if let Some(set) = set {
        // SAFETY: `set` is a valid cpu_set_t read by the kernel only.
        unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    }
}

fn errno_text(e: i32) -> String {
    std::io::Error::from_raw_os_error(e).to_string()
}

/// Registers kvtarget's DMA arena (every `IoBuf`) with SPDK's memory map, so SPDK's
/// PCIe and RDMA drivers can address the buffers the transports filled without a
/// copy. Done once, before the first controller that needs it.
fn register_dma_arena() -> Result<(), SpdkError> {
    DMA_MAPPER
        .get_or_init(|| {
            kvt_mem::dma::register_mapper(|r| {
                // SAFETY: the range is arena memory, committed, 2 MiB aligned in
                // address and length, and never unmapped for the process lifetime
                // (the arena never returns chunks), as spdk_mem_register requires.
                let rc = unsafe { ffi::spdk_mem_register(r.vaddr as *mut c_void, r.len) };
                if rc == 0 {
                    Ok(())
                } else {
                    Err(kvt_mem::dma::DmaError::Map {
                        call: "spdk_mem_register",
                        errno: -rc,
                    })
                }
            })
            .map(|_| ())
        })
        .clone()
        .map_err(SpdkError::Dma)
}

/// Facts of an attached controller, read once from its Identify data.
#[derive(Debug, Clone)]
pub struct ControllerInfo {
    pub model: String,
    pub serial: String,
    pub firmware: String,
    /// Volatile write cache present (Flush does something).
    pub vwc: bool,
    pub fabrics: bool,
}

/// An attached NVMe controller (PCIe, or an NVMe-oF target reached through SPDK's
/// host). Shared by the device and every channel; detached when the last goes.
pub struct Controller {
    raw: NonNull<ffi::spdk_nvme_ctrlr>,
    pub trid: String,
    pub info: ControllerInfo,
    /// Set when the admin queue fails (the controller is gone or its transport
    /// broke): channels fail new commands at once.
    failed: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    admin: Mutex<Option<JoinHandle<()>>>,
}

// SAFETY: the controller-level calls made through `raw` (namespace lookups, queue
// pair allocation and free, admin completions, failure checks) are documented
// thread safe in SPDK's nvme.h (they take the controller's lock); I/O queue pairs,
// which are not, are separate `IoQpair` values used by one thread at a time.
unsafe impl Send for Controller {}
// SAFETY: as above.
unsafe impl Sync for Controller {}

/// The controller pointer, moved into the admin poller thread.
struct CtrlrPtr(NonNull<ffi::spdk_nvme_ctrlr>);
// SAFETY: only spdk_nvme_ctrlr_process_admin_completions and
// spdk_nvme_ctrlr_is_failed are called through it, both thread safe; the
// controller outlives the thread (Drop joins it before detaching).
unsafe impl Send for CtrlrPtr {}

/// How often the admin queue is polled: keep-alives (SPDK sends them from this
/// poll; the default timeout is 10 s) and asynchronous events need no more.
const ADMIN_POLL: Duration = Duration::from_millis(20);

impl Controller {
    /// Attaches the controller `trid` names (probe + init, synchronously).
    pub fn connect(trid: &TransportId) -> Result<Arc<Controller>, SpdkError> {
        if trid.needs_dma_registration() {
            register_dma_arena()?;
        }
        let text = cstr("trid", &trid.spdk_string())?;
        // SAFETY: a zeroed transport id is what spdk_nvme_transport_id_parse
        // expects to fill; `text` is a NUL-terminated string.
        let mut id: ffi::spdk_nvme_transport_id = unsafe { std::mem::zeroed() };
        // SAFETY: both pointers are valid for the call.
        let rc = unsafe { ffi::spdk_nvme_transport_id_parse(&mut id, text.as_ptr()) };
        if rc != 0 {
            return Err(SpdkError::Invalid(format!(
                "SPDK cannot parse transport ID `{}`: {}",
                trid.spdk_string(),
                errno_text(-rc)
            )));
        }
        // SAFETY: zeroed, then fully initialised by SPDK for the size passed.
        let mut opts: ffi::spdk_nvme_ctrlr_opts = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<ffi::spdk_nvme_ctrlr_opts>();
        // SAFETY: `opts` is writable for `size` bytes.
        unsafe { ffi::spdk_nvme_ctrlr_get_default_ctrlr_opts(&mut opts, size) };
        if let Some(h) = &trid.hostnqn {
            let n = h.len().min(opts.hostnqn.len() - 1);
            for (d, s) in opts.hostnqn.iter_mut().zip(h.as_bytes()[..n].iter()) {
                *d = *s as std::ffi::c_char;
            }
            opts.hostnqn[n] = 0;
        }
        // Queue pairs carry kvtarget's own deep queues; the requests pool also
        // covers SPDK's MDTS splitting of large commands (see IoQpair::open).
        opts.io_queue_size = opts.io_queue_size.max(256);
        // SAFETY: `id` and `opts` are initialised; SPDK copies what it keeps.
        let raw = unsafe { ffi::spdk_nvme_connect(&id, &opts, size) };
        let Some(raw) = NonNull::new(raw) else {
            return Err(SpdkError::Connect(trid.to_string()));
        };
        // SAFETY: the controller is attached; the data lives as long as it.
        let cdata = unsafe { ffi::spdk_nvme_ctrlr_get_data(raw.as_ptr()) };
        let info = controller_info(cdata, trid);
        let failed = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let admin = {
            let (p, failed, stop, name) = (
                CtrlrPtr(raw),
                failed.clone(),
                stop.clone(),
                trid.to_string(),
            );
            std::thread::Builder::new()
                .name("spdk-admin".into())
                .spawn(move || admin_poller(p, failed, stop, name))
                .map_err(|e| SpdkError::Env(format!("admin poller thread: {e}")))?
        };
        let c = Arc::new(Controller {
            raw,
            trid: trid.to_string(),
            info,
            failed,
            stop,
            admin: Mutex::new(Some(admin)),
        });
        if let Ok(mut reg) = CONTROLLERS.lock() {
            reg.retain(|w| w.strong_count() > 0);
            reg.push(Arc::downgrade(&c));
        }
        tracing::info!(trid = %c.trid, model = %c.info.model, serial = %c.info.serial,
            firmware = %c.info.firmware, fabrics = c.info.fabrics, vwc = c.info.vwc, "SPDK controller attached");
        Ok(c)
    }

    pub fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// The facts of active namespace `nsid`.
    pub fn namespace(&self, nsid: u32) -> Result<NamespaceInfo, SpdkError> {
        // SAFETY: the controller is attached (self alive).
        let ns = unsafe { ffi::spdk_nvme_ctrlr_get_ns(self.raw.as_ptr(), nsid) };
        let Some(ns) = NonNull::new(ns) else {
            return Err(SpdkError::NoNamespace(self.trid.clone(), nsid));
        };
        // SAFETY: `ns` belongs to the attached controller; these getters read it.
        let info = unsafe {
            if !ffi::spdk_nvme_ns_is_active(ns.as_ptr()) {
                return Err(SpdkError::NoNamespace(self.trid.clone(), nsid));
            }
            NamespaceInfo {
                nsid,
                block_bytes: ffi::spdk_nvme_ns_get_sector_size(ns.as_ptr()),
                extended_block_bytes: ffi::spdk_nvme_ns_get_extended_sector_size(ns.as_ptr()),
                blocks: ffi::spdk_nvme_ns_get_num_sectors(ns.as_ptr()),
                max_transfer_bytes: ffi::spdk_nvme_ns_get_max_io_xfer_size(ns.as_ptr()),
                flags: ffi::spdk_nvme_ns_get_flags(ns.as_ptr()),
                deallocated_reads_zero: ffi::spdk_nvme_ns_get_dealloc_logical_block_read_value(
                    ns.as_ptr(),
                ) == ffi::SPDK_NVME_DEALLOC_READ_00,
            }
        };
        Ok(info)
    }
}

fn admin_poller(p: CtrlrPtr, failed: Arc<AtomicBool>, stop: Arc<AtomicBool>, name: String) {
    while !stop.load(Ordering::Acquire) {
        // SAFETY: thread safe per nvme.h; the controller is attached until Drop
        // has joined this thread.
        let rc = unsafe { ffi::spdk_nvme_ctrlr_process_admin_completions(p.0.as_ptr()) };
        // SAFETY: as above.
        let gone = rc < 0 || unsafe { ffi::spdk_nvme_ctrlr_is_failed(p.0.as_ptr()) };
        if gone && !failed.swap(true, Ordering::AcqRel) {
            tracing::error!(trid = %name, "SPDK controller failed ({}): its I/O now fails", errno_text(-rc.min(-libc::EIO)));
        }
        std::thread::sleep(ADMIN_POLL);
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.admin.lock().ok().and_then(|mut a| a.take()) {
            let _ = h.join();
        }
        // SAFETY: no queue pair of this controller is left (each holds an Arc of
        // it) and the admin poller has stopped, so nothing uses the pointer again.
        let rc = unsafe { ffi::spdk_nvme_detach(self.raw.as_ptr()) };
        if rc != 0 {
            tracing::warn!(trid = %self.trid, "spdk_nvme_detach: {}", errno_text(-rc));
        } else {
            tracing::info!(trid = %self.trid, "SPDK controller detached");
        }
    }
}

/// Identify Controller fields at their NVMe Base 2.0 byte offsets (SPDK's struct
/// is packed, so it stays opaque and is read as bytes).
fn controller_info(cdata: *const ffi::spdk_nvme_ctrlr_data, trid: &TransportId) -> ControllerInfo {
    const SN: std::ops::Range<usize> = 4..24;
    const MN: std::ops::Range<usize> = 24..64;
    const FR: std::ops::Range<usize> = 64..72;
    const VWC: usize = 525;
    let text = |b: &[u8]| {
        String::from_utf8_lossy(b)
            .trim_end_matches([' ', '\0'])
            .to_string()
    };
    if cdata.is_null() {
        return ControllerInfo {
            model: String::new(),
            serial: String::new(),
            firmware: String::new(),
            vwc: false,
            fabrics: trid.is_fabrics(),
        };
    }
    const _: () = assert!(std::mem::size_of::<ffi::spdk_nvme_ctrlr_data>() == 4096);
    // SAFETY: SPDK returns a pointer to the controller's 4096-byte Identify
    // Controller data (size checked above), alive while the controller is.
    let b = unsafe { std::slice::from_raw_parts(cdata.cast::<u8>(), 4096) };
    ControllerInfo {
        model: text(&b[MN]),
        serial: text(&b[SN]),
        firmware: text(&b[FR]),
        vwc: b[VWC] & 1 != 0,
        fabrics: trid.is_fabrics(),
    }
}

/// A namespace's facts, from SPDK's namespace getters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamespaceInfo {
    pub nsid: u32,
    pub block_bytes: u32,
    /// Block size including metadata; differs from `block_bytes` on formats
    /// with interleaved metadata, which kvtarget does not serve.
    pub extended_block_bytes: u32,
    pub blocks: u64,
    pub max_transfer_bytes: u32,
    flags: u32,
    pub deallocated_reads_zero: bool,
}

impl NamespaceInfo {
    pub fn size_bytes(&self) -> u64 {
        self.blocks * self.block_bytes as u64
    }
    pub fn supports_deallocate(&self) -> bool {
        self.flags & ffi::SPDK_NVME_NS_DEALLOCATE_SUPPORTED != 0
    }
    pub fn supports_write_zeroes(&self) -> bool {
        self.flags & ffi::SPDK_NVME_NS_WRITE_ZEROES_SUPPORTED != 0
    }
    /// Flush is supported exactly when the controller has a volatile write cache.
    pub fn supports_flush(&self) -> bool {
        self.flags & ffi::SPDK_NVME_NS_FLUSH_SUPPORTED != 0
    }
    pub fn has_protection_info(&self) -> bool {
        self.flags & ffi::SPDK_NVME_NS_DPS_PI_SUPPORTED != 0
    }
}

/// One command for an `IoQpair`. Block counts are the NVMe 0-based-free counts.
#[derive(Debug)]
pub enum Command {
    Read {
        lba: u64,
        blocks: u32,
        buf: IoBuf,
    },
    Write {
        lba: u64,
        blocks: u32,
        buf: IoBuf,
        fua: bool,
    },
    Flush,
    WriteZeroes {
        lba: u64,
        blocks: u32,
    },
    /// Zeroes written from the queue pair's own zeroed buffer, for devices without
    /// Write Zeroes: at most `ZERO_BUFFER_BYTES`.
    WriteFromZeroBuffer {
        lba: u64,
        blocks: u32,
    },
    /// Dataset Management, deallocate: `blocks` from `lba`, at most
    /// `MAX_DSM_BLOCKS` (ranges of at most u32::MAX blocks each).
    Deallocate {
        lba: u64,
        blocks: u64,
    },
}

/// The buffer a command carries, handed back when it is refused.
fn buf_of(c: Command) -> Option<IoBuf> {
    match c {
        Command::Read { buf, .. } | Command::Write { buf, .. } => Some(buf),
        _ => None,
    }
}

/// Size of a queue pair's zeroed buffer (`Command::WriteFromZeroBuffer`).
pub const ZERO_BUFFER_BYTES: usize = 1 << 20;

/// Blocks one Dataset Management command can deallocate.
pub const MAX_DSM_BLOCKS: u64 = MAX_DSM_RANGES as u64 * u32::MAX as u64;

/// Ranges one Dataset Management command carries (NVMe Base: NR is 8 bits).
pub const MAX_DSM_RANGES: usize = ffi::SPDK_NVME_DATASET_MANAGEMENT_MAX_RANGES as usize;

/// A Dataset Management range as the NVMe spec lays it out.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct DsmRange {
    attributes: u32,
    length: u32,
    slba: u64,
}
const _: () = assert!(std::mem::size_of::<DsmRange>() == 16);
const _: () = assert!(std::mem::size_of::<ffi::spdk_nvme_dsm_range>() == 16);

/// Where one command's completion is recorded: the callback argument.
struct Cell {
    index: u32,
    done: *mut Vec<(u32, u16)>,
}

/// Why a submission did not go to SPDK.
#[derive(Debug)]
pub enum SubmitError {
    /// SPDK's request pool is full: try again after completions.
    Busy(Option<IoBuf>),
    /// The command cannot run (bad arguments, a failed queue pair): an errno.
    Failed(Option<IoBuf>, i32),
}

/// An I/O queue pair on one namespace, owned by one reactor.
pub struct IoQpair {
    ctrlr: Arc<Controller>,
    raw: NonNull<ffi::spdk_nvme_qpair>,
    ns: NonNull<ffi::spdk_nvme_ns>,
    cells: NonNull<[Cell]>,
    done: NonNull<Vec<(u32, u16)>>,
    bufs: Vec<Option<IoBuf>>,
    busy: Vec<bool>,
    outstanding: usize,
    failed: bool,
    block_bytes: u32,
    /// Zeroed, never written: the source of every `WriteFromZeroBuffer` (devices
    /// only read it, so commands in flight share it). Made on first use.
    zeros: Option<IoBuf>,
}

// SAFETY: an IoQpair is used by one thread at a time (it is not Sync), which is
// what SPDK requires of a queue pair; the callback cells and completion list it
// points at are owned by it and move with it.
unsafe impl Send for IoQpair {}

impl IoQpair {
    /// Allocates a queue pair of `depth` entries with `cells` command slots.
    pub fn open(
        ctrlr: &Arc<Controller>,
        nsid: u32,
        depth: u32,
        cells: u32,
    ) -> Result<IoQpair, SpdkError> {
        // SAFETY: controller attached; lookups are thread safe.
        let ns = unsafe { ffi::spdk_nvme_ctrlr_get_ns(ctrlr.raw.as_ptr(), nsid) };
        let Some(ns) = NonNull::new(ns) else {
            return Err(SpdkError::NoNamespace(ctrlr.trid.clone(), nsid));
        };
        // SAFETY: zeroed, then filled by SPDK for the size passed.
        let mut o: ffi::spdk_nvme_io_qpair_opts = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<ffi::spdk_nvme_io_qpair_opts>();
        // SAFETY: `o` is writable for `size` bytes; controller attached.
        unsafe { ffi::spdk_nvme_ctrlr_get_default_io_qpair_opts(ctrlr.raw.as_ptr(), &mut o, size) };
        // The default is the controller's size, already clamped by SPDK to
        // CAP.MQES + 1 (an NVMe-oF target's queue depth): never ask for more.
        o.io_queue_size = depth.min(o.io_queue_size);
        // Requests, not queue entries, bound what is in flight: a large command
        // split at the controller's MDTS takes one request per piece, so the pool
        // holds many times the depth (a request is a few hundred bytes).
        o.io_queue_requests = o.io_queue_requests.max(cells * 8).max(o.io_queue_size * 4);
        // SAFETY: as above; SPDK copies the options.
        let raw = unsafe { ffi::spdk_nvme_ctrlr_alloc_io_qpair(ctrlr.raw.as_ptr(), &o, size) };
        let Some(raw) = NonNull::new(raw) else {
            return Err(SpdkError::Qpair(ctrlr.trid.clone()));
        };
        let done = Box::new(Vec::with_capacity(cells as usize));
        let done = NonNull::from(Box::leak(done));
        let cell_box: Box<[Cell]> = (0..cells)
            .map(|index| Cell {
                index,
                done: done.as_ptr(),
            })
            .collect();
        let cells_ptr = NonNull::from(Box::leak(cell_box));
        tracing::debug!(trid = %ctrlr.trid, nsid, depth = o.io_queue_size, requests = o.io_queue_requests, "SPDK I/O queue pair allocated");
        Ok(IoQpair {
            ctrlr: ctrlr.clone(),
            raw,
            ns,
            cells: cells_ptr,
            done,
            bufs: (0..cells).map(|_| None).collect(),
            busy: vec![false; cells as usize],
            outstanding: 0,
            failed: false,
            // SAFETY: `ns` belongs to the attached controller.
            block_bytes: unsafe { ffi::spdk_nvme_ns_get_sector_size(ns.as_ptr()) },
            zeros: None,
        })
    }

    /// Command slots (the `cell` numbers `submit` accepts).
    pub fn cells(&self) -> u32 {
        self.busy.len() as u32
    }

    /// True once the queue pair or its controller failed.
    pub fn is_failed(&self) -> bool {
        self.failed || self.ctrlr.is_failed()
    }

    /// Submits `cmd` under free slot `cell`. The command's buffer stays with the
    /// queue pair until `process` hands it back with the completion.
    pub fn submit(&mut self, cell: u32, cmd: Command) -> Result<(), SubmitError> {
        let i = cell as usize;
        if let Err(errno) = self.check(i, &cmd) {
            return Err(SubmitError::Failed(buf_of(cmd), errno));
        }
        // SAFETY: `cells` is the live boxed slice this queue pair owns; i < len
        // (checked above).
        let arg: *mut c_void = unsafe { std::ptr::addr_of_mut!((*self.cells.as_ptr())[i]) }.cast();
        let (rc, buf) = self.issue(arg, cmd)?;
        match rc {
            0 => {
                self.busy[i] = true;
                self.bufs[i] = buf;
                self.outstanding += 1;
                Ok(())
            }
            e if e == -libc::ENOMEM => Err(SubmitError::Busy(buf)),
            e => {
                if e == -libc::ENXIO {
                    self.failed = true;
                }
                Err(SubmitError::Failed(buf, -e))
            }
        }
    }

    /// Whether `cmd` may be submitted under slot `i`: the errno if not.
    fn check(&self, i: usize, cmd: &Command) -> Result<(), i32> {
        if i >= self.busy.len() || self.busy[i] {
            return Err(libc::EINVAL);
        }
        if self.is_failed() {
            return Err(libc::ENXIO);
        }
        // The buffer must cover the blocks SPDK will move (it trusts the count).
        if let Command::Read { blocks, buf, .. } | Command::Write { blocks, buf, .. } = cmd {
            if (buf.len() as u64) < *blocks as u64 * self.block_bytes as u64 || *blocks == 0 {
                return Err(libc::EINVAL);
            }
        }
        Ok(())
    }

    /// Hands `cmd` to SPDK with `arg` (its cell) for the callback. Returns
    /// SPDK's return code and the buffer the queue pair keeps until completion.
    fn issue(
        &mut self,
        arg: *mut c_void,
        cmd: Command,
    ) -> Result<(i32, Option<IoBuf>), SubmitError> {
        let (ns, qp) = (self.ns.as_ptr(), self.raw.as_ptr());
        let cb: ffi::spdk_nvme_cmd_cb = Some(on_complete);
        Ok(match cmd {
            Command::Read {
                lba,
                blocks,
                mut buf,
            } => {
                // SAFETY: `buf` (moved into `self.bufs` below, its memory never
                // moves) stays alive and unused until on_complete for this cell
                // ran; `arg` is this cell. ns/qp are live and used by this thread.
                let rc = unsafe {
                    ffi::spdk_nvme_ns_cmd_read(
                        ns,
                        qp,
                        buf.as_mut_ptr().cast(),
                        lba,
                        blocks,
                        cb,
                        arg,
                        0,
                    )
                };
                (rc, Some(buf))
            }
            Command::Write {
                lba,
                blocks,
                mut buf,
                fua,
            } => (self.write(arg, lba, blocks, &mut buf, fua), Some(buf)),
            Command::WriteFromZeroBuffer { lba, blocks } => {
                (self.write_zero_buffer(arg, lba, blocks)?, None)
            }
            Command::Flush => {
                // SAFETY: ns/qp live; `arg` is this cell.
                (
                    unsafe { ffi::spdk_nvme_ns_cmd_flush(ns, qp, cb, arg) },
                    None,
                )
            }
            Command::WriteZeroes { lba, blocks } => {
                // SAFETY: as for Flush.
                (
                    unsafe { ffi::spdk_nvme_ns_cmd_write_zeroes(ns, qp, lba, blocks, cb, arg, 0) },
                    None,
                )
            }
            Command::Deallocate { lba, blocks } => (self.deallocate(arg, lba, blocks)?, None),
        })
    }

    /// Writes `blocks` from `buf` at `lba`, with Force Unit Access if `fua`.
    fn write(&self, arg: *mut c_void, lba: u64, blocks: u32, buf: &mut IoBuf, fua: bool) -> i32 {
        let (ns, qp) = (self.ns.as_ptr(), self.raw.as_ptr());
        let cb: ffi::spdk_nvme_cmd_cb = Some(on_complete);
        let flags = if fua {
            ffi::SPDK_NVME_IO_FLAGS_FORCE_UNIT_ACCESS
        } else {
            0
        };
        // SAFETY: `buf` (moved into `self.bufs` by `submit`, its memory never
        // moves) stays alive and unused until on_complete for this cell ran;
        // `arg` is this cell. ns/qp are live and used by this thread.
        unsafe {
            ffi::spdk_nvme_ns_cmd_write(
                ns,
                qp,
                buf.as_mut_ptr().cast(),
                lba,
                blocks,
                cb,
                arg,
                flags,
            )
        }
    }

    /// Writes `blocks` from the queue pair's zero buffer at `lba`.
    fn write_zero_buffer(
        &mut self,
        arg: *mut c_void,
        lba: u64,
        blocks: u32,
    ) -> Result<i32, SubmitError> {
        let (ns, qp) = (self.ns.as_ptr(), self.raw.as_ptr());
        let cb: ffi::spdk_nvme_cmd_cb = Some(on_complete);
        let bytes = blocks as usize * self.block_bytes as usize;
        if blocks == 0 || bytes > ZERO_BUFFER_BYTES {
            return Err(SubmitError::Failed(None, libc::EINVAL));
        }
        let zeros = self
            .zeros
            .get_or_insert_with(|| IoBuf::new(ZERO_BUFFER_BYTES));
        // SAFETY: the zero buffer is owned by this queue pair and dropped
        // only after the queue pair is freed; devices only read from it, so
        // several commands may use it at once. ns/qp/arg as for Read.
        let rc = unsafe {
            ffi::spdk_nvme_ns_cmd_write(ns, qp, zeros.as_mut_ptr().cast(), lba, blocks, cb, arg, 0)
        };
        Ok(rc)
    }

    /// Deallocates `blocks` from `lba` (one Dataset Management command).
    fn deallocate(&mut self, arg: *mut c_void, lba: u64, blocks: u64) -> Result<i32, SubmitError> {
        let (ns, qp) = (self.ns.as_ptr(), self.raw.as_ptr());
        let cb: ffi::spdk_nvme_cmd_cb = Some(on_complete);
        if blocks == 0 || blocks > MAX_DSM_BLOCKS {
            return Err(SubmitError::Failed(None, libc::EINVAL));
        }
        let mut list = [DsmRange::default(); MAX_DSM_RANGES];
        let (mut n, mut done) = (0, 0);
        while done < blocks {
            let length = (blocks - done).min(u32::MAX as u64);
            list[n] = DsmRange {
                attributes: 0,
                length: length as u32,
                slba: lba + done,
            };
            done += length;
            n += 1;
        }
        // SAFETY: SPDK copies the range list into its own request before
        // returning (nvme_allocate_request_user_copy), so a stack array is
        // fine; DsmRange has the spec layout (size asserted above).
        let rc = unsafe {
            ffi::spdk_nvme_ns_cmd_dataset_management(
                ns,
                qp,
                ffi::SPDK_NVME_DSM_ATTR_DEALLOCATE,
                list.as_ptr().cast(),
                n as u16,
                cb,
                arg,
            )
        };
        Ok(rc)
    }

    /// Reaps completions into `out` as (cell, NVMe status as SCT << 8 | SC, the
    /// command's buffer). A failed queue pair returns its errno once its
    /// outstanding commands are all back (SPDK completes them as aborted).
    pub fn process(&mut self, out: &mut Vec<(u32, u16, Option<IoBuf>)>) -> Result<usize, i32> {
        if self.outstanding == 0 {
            return if self.is_failed() {
                Err(libc::ENXIO)
            } else {
                Ok(0)
            };
        }
        // SAFETY: the queue pair is live and used by this thread only; callbacks
        // run inside this call and write only to `done` through the cells.
        let rc = unsafe { ffi::spdk_nvme_qpair_process_completions(self.raw.as_ptr(), 0) };
        // SAFETY: `done` is owned by self; no callback runs outside
        // process_completions, so nothing else touches it now.
        let done = unsafe { &mut *self.done.as_ptr() };
        let n = done.len();
        for (cell, status) in done.drain(..) {
            let i = cell as usize;
            if i < self.busy.len() && self.busy[i] {
                self.busy[i] = false;
                self.outstanding -= 1;
                out.push((cell, status, self.bufs[i].take()));
            }
        }
        if rc < 0 {
            if !self.failed {
                tracing::warn!(trid = %self.ctrlr.trid, "SPDK I/O queue pair failed: {}", errno_text(-rc));
            }
            self.failed = true;
        }
        Ok(n)
    }
}

/// SPDK's completion callback: records (cell, status) for `IoQpair::process`.
unsafe extern "C" fn on_complete(arg: *mut c_void, cpl: *const ffi::spdk_nvme_cpl) {
    const _: () = assert!(std::mem::size_of::<ffi::spdk_nvme_cpl>() == 16);
    if arg.is_null() {
        return;
    }
    // SAFETY: `arg` is the Cell pointer passed at submission, into the cell array
    // of a live IoQpair (freed only after its queue pair); `cpl`, when not null,
    // points at a 16-byte completion queue entry for the duration of the call.
    unsafe {
        let cell = &*arg.cast::<Cell>();
        // Status field: DW3 bits 31:17 -> SC bits 24:17, SCT bits 27:25.
        let status = if cpl.is_null() {
            0x0006 // Internal Error
        } else {
            let raw = std::ptr::read_unaligned(cpl.cast::<u8>().add(14).cast::<u16>());
            let sc = (raw >> 1) & 0xff;
            let sct = (raw >> 9) & 0x7;
            (sct << 8) | sc
        };
        (*cell.done).push((cell.index, status));
    }
}

impl Drop for IoQpair {
    fn drop(&mut self) {
        // SAFETY: this thread owns the queue pair; freeing it completes nothing
        // more into our cells (SPDK aborts without calling back after free).
        let rc = unsafe { ffi::spdk_nvme_ctrlr_free_io_qpair(self.raw.as_ptr()) };
        if rc != 0 {
            tracing::warn!(trid = %self.ctrlr.trid, "spdk_nvme_ctrlr_free_io_qpair: {}", errno_text(-rc));
        }
        // SAFETY: both were leaked from Boxes in `open` and nothing refers to them
        // once the queue pair is freed.
        unsafe {
            drop(Box::from_raw(self.cells.as_ptr()));
            drop(Box::from_raw(self.done.as_ptr()));
        }
    }
}

/// Finalises SPDK's environment at exit, once every controller has detached.
pub fn shutdown() {
    if !matches!(ENV.get(), Some(Ok(()))) {
        return;
    }
    let live = CONTROLLERS
        .lock()
        .map(|r| r.iter().filter(|w| w.strong_count() > 0).count())
        .unwrap_or(0);
    if live > 0 {
        tracing::warn!(
            controllers = live,
            "SPDK controllers still attached at exit; leaving SPDK's environment up"
        );
        return;
    }
    // SAFETY: initialised once, no controller or queue pair is left.
    unsafe { ffi::spdk_env_fini() };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SPDK's environment comes up in the test process without hugepages, once
    /// (a second call returns the first outcome), and attaching a controller that
    /// is not there is a typed error naming it, not a crash or a hang.
    #[test]
    fn environment_once_and_a_missing_controller_is_an_error() {
        let opts = EnvOptions {
            no_huge: true,
            mem_size_mib: Some(256),
            hugedir: None,
            no_pci: true,
        };
        let before = save_affinity();
        init_env(&opts).expect("SPDK environment (no hugepages)");
        assert!(
            init_env(&opts).is_ok(),
            "second init returns the first outcome"
        );
        if let (Some(b), Some(a)) = (before, save_affinity()) {
            // SAFETY: comparing two initialised cpu_set_t values.
            assert!(
                unsafe { libc::CPU_EQUAL(&b, &a) },
                "DPDK's pinning was undone"
            );
        }
        // A port nothing listens on (bound, never listening).
        let sock = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = sock.local_addr().unwrap().port();
        drop(sock);
        let trid: TransportId = format!(
            "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{port} subnqn:nqn.2026-11.io.kvtarget:nobody"
        )
        .parse()
        .unwrap();
        match Controller::connect(&trid) {
            Err(SpdkError::Connect(t)) => assert!(t.contains(&port.to_string()), "{t}"),
            Err(e) => panic!("unexpected error {e}"),
            Ok(_) => panic!("attached a controller nobody serves"),
        }
    }
}
