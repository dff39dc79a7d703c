//! `spdk` backend: a namespace reached through SPDK's NVMe driver, either a PCIe
//! controller (`trtype:PCIe traddr:0000:00:04.0`) or a remote NVMe-oF namespace
//! through SPDK's host (`trtype:TCP adrfam:IPv4 traddr:10.0.0.5 trsvcid:4420
//! subnqn:...`), usable as a plain namespace and under a pool.
//!
//! Each reactor's channel owns one SPDK I/O queue pair and polls its completions
//! in the reactor loop: kvtarget's reactors drive SPDK's queue pairs directly, and
//! SPDK's own reactor and thread framework are never started. Buffers are
//! kvtarget's `IoBuf`s, registered with SPDK's memory map (PCIe, RDMA), so data
//! goes between the wire and the device without a copy.
//!
//! `TransportId` parsing and validation are plain Rust and always built, so a
//! configuration is checked the same with or without SPDK; the rest needs the
//! `spdk` feature. `ffi` holds every `unsafe` block of this backend.

#[cfg(feature = "spdk")]
mod ffi;

use kvt_wire::nqn::{validate_nqn, NqnError};
use std::fmt;
use std::str::FromStr;

/// What can go wrong attaching or using an SPDK device.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpdkError {
    #[error("the spdk backend needs kvtarget built with `--features spdk` (this build has no SPDK; see docs/backends.md \"Building with SPDK\")")]
    NotBuilt,
    #[error("{0}")]
    Invalid(String),
    #[error("SPDK environment: {0}")]
    Env(String),
    #[error("SPDK environment: spdk_env_init failed ({}); SPDK's lines above say why ({hint})", std::io::Error::from_raw_os_error(*.errno))]
    EnvInit { errno: i32, hint: &'static str },
    #[error("SPDK environment: {0}")]
    Dma(#[from] kvt_mem::dma::DmaError),
    #[error(
        "SPDK cannot attach the controller at `{0}` (is it there? SPDK's log line above says why)"
    )]
    Connect(String),
    #[error("`{0}` has no active namespace {1}")]
    NoNamespace(String, u32),
    #[error("SPDK cannot allocate an I/O queue pair on `{0}`")]
    Qpair(String),
    #[error("{0}")]
    Unsupported(String),
}

/// Why a transport ID string (`trtype:PCIe traddr:0000:00:04.0`, ...) is
/// refused; each names the key or value at fault.
#[derive(Debug, thiserror::Error)]
pub enum TridError {
    #[error("`{0}` is not key:value")]
    NotKeyValue(String),
    #[error("`{0}` has no value")]
    NoValue(String),
    #[error("trtype `{0}` is not PCIe, TCP or RDMA")]
    TrType(String),
    #[error("adrfam `{0}` is not IPv4 or IPv6")]
    AdrFam(String),
    #[error("unknown key `{0}` (trtype, adrfam, traddr, trsvcid, subnqn, hostnqn, priority)")]
    UnknownKey(String),
    #[error("`{0}` is given twice")]
    Twice(String),
    #[error("trtype is missing (trtype:PCIe, trtype:TCP or trtype:RDMA)")]
    NoTrType,
    #[error("traddr is missing")]
    NoTrAddr,
    #[error("traddr `{traddr}`: {source}")]
    PciAddress {
        traddr: String,
        #[source]
        source: crate::nvme::NvmeError,
    },
    #[error("PCIe takes only traddr (a PCI address)")]
    PcieExtra,
    #[error("trsvcid (the port) is missing")]
    NoTrSvcId,
    #[error("trsvcid `{0}` is not a port")]
    TrSvcId(String),
    #[error("subnqn is missing")]
    NoSubNqn,
    #[error("subnqn: {0}")]
    SubNqn(#[source] NqnError),
    #[error("hostnqn: {0}")]
    HostNqn(#[source] NqnError),
}

/// SPDK transport types kvtarget accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrType {
    Pcie,
    Tcp,
    Rdma,
}

/// A parsed SPDK transport ID string (`key:value` pairs, SPDK's syntax), plus
/// `hostnqn:` which SPDK's tools also accept there and kvtarget sends in Connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportId {
    pub trtype: TrType,
    pub adrfam: Option<String>,
    pub traddr: String,
    pub trsvcid: Option<String>,
    pub subnqn: Option<String>,
    pub hostnqn: Option<String>,
    pub priority: Option<String>,
}

impl TransportId {
    /// The string SPDK's `spdk_nvme_transport_id_parse` gets (without hostnqn).
    pub fn spdk_string(&self) -> String {
        let mut s = format!(
            "trtype:{}",
            match self.trtype {
                TrType::Pcie => "PCIe",
                TrType::Tcp => "TCP",
                TrType::Rdma => "RDMA",
            }
        );
        for (k, v) in [
            ("adrfam", &self.adrfam),
            ("traddr", &Some(self.traddr.clone())),
            ("trsvcid", &self.trsvcid),
            ("subnqn", &self.subnqn),
            ("priority", &self.priority),
        ] {
            if let Some(v) = v {
                s.push_str(&format!(" {k}:{v}"));
            }
        }
        s
    }
    pub fn is_fabrics(&self) -> bool {
        self.trtype != TrType::Pcie
    }
    /// PCIe DMA and RDMA memory registration need kvtarget's buffers in SPDK's
    /// memory map; NVMe/TCP moves them through sockets.
    pub fn needs_dma_registration(&self) -> bool {
        self.trtype != TrType::Tcp
    }
}

impl fmt::Display for TransportId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.spdk_string())
    }
}

impl FromStr for TransportId {
    type Err = TridError;
    fn from_str(s: &str) -> Result<TransportId, TridError> {
        let mut trtype = None;
        let (mut adrfam, mut traddr, mut trsvcid, mut subnqn, mut hostnqn, mut priority) =
            (None, None, None, None, None, None);
        for pair in s.split_whitespace() {
            // SPDK accepts `key:value` and `key=value`; values (PCI addresses,
            // NQNs) contain ':', so only the first separator splits.
            let Some(at) = pair.find([':', '=']) else {
                return Err(TridError::NotKeyValue(pair.into()));
            };
            let (key, value) = (&pair[..at], &pair[at + 1..]);
            if value.is_empty() {
                return Err(TridError::NoValue(key.into()));
            }
            let slot = match key.to_ascii_lowercase().as_str() {
                "trtype" => {
                    let t = match value.to_ascii_lowercase().as_str() {
                        "pcie" => TrType::Pcie,
                        "tcp" => TrType::Tcp,
                        "rdma" => TrType::Rdma,
                        _ => return Err(TridError::TrType(value.into())),
                    };
                    if trtype.replace(t).is_some() {
                        return Err(TridError::Twice(key.into()));
                    }
                    continue;
                }
                "adrfam" => {
                    if !matches!(value.to_ascii_lowercase().as_str(), "ipv4" | "ipv6") {
                        return Err(TridError::AdrFam(value.into()));
                    }
                    &mut adrfam
                }
                "traddr" => &mut traddr,
                "trsvcid" => &mut trsvcid,
                "subnqn" => &mut subnqn,
                "hostnqn" => &mut hostnqn,
                "priority" => &mut priority,
                other => return Err(TridError::UnknownKey(other.into())),
            };
            if slot.replace(value.to_string()).is_some() {
                return Err(TridError::Twice(key.into()));
            }
        }
        let Some(trtype) = trtype else {
            return Err(TridError::NoTrType);
        };
        let Some(traddr) = traddr else {
            return Err(TridError::NoTrAddr);
        };
        let mut id = TransportId {
            trtype,
            adrfam,
            traddr,
            trsvcid,
            subnqn,
            hostnqn,
            priority,
        };
        id.check()?;
        Ok(id)
    }
}

impl TransportId {
    /// Checks the keys against the transport type: a PCIe address alone, a
    /// port and subsystem for the fabrics (whose address family is filled in
    /// from the address if not given).
    fn check(&mut self) -> Result<(), TridError> {
        match self.trtype {
            TrType::Pcie => {
                crate::nvme::pci::parse_bdf(&self.traddr).map_err(|source| {
                    TridError::PciAddress {
                        traddr: self.traddr.clone(),
                        source,
                    }
                })?;
                if self.trsvcid.is_some() || self.subnqn.is_some() || self.adrfam.is_some() {
                    return Err(TridError::PcieExtra);
                }
            }
            TrType::Tcp | TrType::Rdma => {
                if self.trsvcid.is_none() {
                    return Err(TridError::NoTrSvcId);
                }
                if let Some(p) = &self.trsvcid {
                    if p.parse::<u16>().map_or(true, |p| p == 0) {
                        return Err(TridError::TrSvcId(p.clone()));
                    }
                }
                let Some(n) = &self.subnqn else {
                    return Err(TridError::NoSubNqn);
                };
                validate_nqn(n).map_err(TridError::SubNqn)?;
                if self.adrfam.is_none() {
                    self.adrfam = Some(
                        if self.traddr.contains(':') {
                            "IPv6"
                        } else {
                            "IPv4"
                        }
                        .into(),
                    );
                }
            }
        }
        if let Some(h) = &self.hostnqn {
            validate_nqn(h).map_err(TridError::HostNqn)?;
        }
        Ok(())
    }
}

/// How SPDK's environment is set up, from the `[spdk]` config section.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvSettings {
    pub no_huge: bool,
    pub mem_size_mib: Option<u32>,
    pub hugedir: Option<String>,
    /// Any PCIe controller configured: DPDK must scan the PCI bus.
    pub pci: bool,
}

/// True when this build can drive SPDK devices.
pub const AVAILABLE: bool = cfg!(feature = "spdk");

#[cfg(feature = "spdk")]
pub use device::{SpdkChannel, SpdkDevice};

/// Finalises SPDK's environment at exit (nothing without the feature).
pub fn shutdown() {
    #[cfg(feature = "spdk")]
    ffi::shutdown();
}

/// Opens namespace `nsid` of the controller `trid` names.
#[cfg(not(feature = "spdk"))]
pub fn open(
    _trid: &TransportId,
    _nsid: u32,
    _env: &EnvSettings,
) -> Result<crate::SharedDevice, SpdkError> {
    Err(SpdkError::NotBuilt)
}

/// Opens namespace `nsid` of the controller `trid` names.
#[cfg(feature = "spdk")]
pub fn open(
    trid: &TransportId,
    nsid: u32,
    env: &EnvSettings,
) -> Result<crate::SharedDevice, SpdkError> {
    Ok(SpdkDevice::open(trid, nsid, env)? as crate::SharedDevice)
}

#[cfg(feature = "spdk")]
mod device {
    use super::ffi::{self, Command, Controller, IoQpair, NamespaceInfo, SubmitError};
    use super::{EnvSettings, SpdkError, TransportId};
    use crate::{errno_for_nvme_status, BlockDevice, IoChannel, IoCompletion, IoOp};
    use kvt_mem::IoBuf;
    use std::collections::VecDeque;
    use std::os::fd::RawFd;
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    /// Queue entries per channel's queue pair (SPDK clamps to the controller's
    /// MQES; an NVMe-oF target's queue depth, 128 for SPDK's, caps it too).
    const QUEUE_DEPTH: u32 = 256;
    /// Commands a channel keeps at SPDK at once; more wait in its own queue.
    const CELLS: u32 = 512;
    /// Blocks per Write Zeroes command (NLB is 16 bits, 0-based).
    const MAX_ZEROES_BLOCKS: u64 = 1 << 16;
    /// Bytes per write of the zero buffer where Write Zeroes is missing.
    const ZERO_PIECE: u64 = ffi::ZERO_BUFFER_BYTES as u64;

    /// Controllers by transport ID (without hostnqn), so several namespaces or
    /// pools on one controller share one attachment.
    static ATTACHED: Mutex<Vec<(String, std::sync::Weak<Controller>)>> = Mutex::new(Vec::new());

    fn controller(trid: &TransportId) -> Result<Arc<Controller>, SpdkError> {
        let key = trid.spdk_string();
        let mut reg = ATTACHED
            .lock()
            .map_err(|_| SpdkError::Env("controller table poisoned".into()))?;
        reg.retain(|(_, w)| w.strong_count() > 0);
        if let Some(c) = reg
            .iter()
            .find(|(k, _)| *k == key)
            .and_then(|(_, w)| w.upgrade())
        {
            return Ok(c);
        }
        let c = Controller::connect(trid)?;
        reg.push((key, Arc::downgrade(&c)));
        Ok(c)
    }

    /// A namespace behind SPDK's NVMe driver.
    pub struct SpdkDevice {
        ctrlr: Arc<Controller>,
        ns: NamespaceInfo,
    }

    impl SpdkDevice {
        pub fn open(
            trid: &TransportId,
            nsid: u32,
            env: &EnvSettings,
        ) -> Result<Arc<SpdkDevice>, SpdkError> {
            ffi::init_env(&ffi::EnvOptions {
                no_huge: env.no_huge,
                mem_size_mib: env.mem_size_mib,
                hugedir: env.hugedir.clone(),
                no_pci: !env.pci,
            })?;
            let ctrlr = controller(trid)?;
            let ns = ctrlr.namespace(nsid)?;
            if ns.has_protection_info() || ns.extended_block_bytes != ns.block_bytes {
                return Err(SpdkError::Unsupported(format!(
                    "{trid} namespace {nsid}: formats with metadata or protection information are not served"
                )));
            }
            if !(512..=4096).contains(&ns.block_bytes) || !ns.block_bytes.is_power_of_two() {
                return Err(SpdkError::Unsupported(format!(
                    "{trid} namespace {nsid}: block size {} (512 to 4096 are served)",
                    ns.block_bytes
                )));
            }
            tracing::info!(trid = %trid, nsid, blocks = ns.blocks, block_size = ns.block_bytes,
                max_transfer = ns.max_transfer_bytes, deallocate = ns.supports_deallocate(),
                write_zeroes = ns.supports_write_zeroes(), flush = ns.supports_flush(), "SPDK namespace");
            Ok(Arc::new(SpdkDevice { ctrlr, ns }))
        }
    }

    impl BlockDevice for SpdkDevice {
        fn describe(&self) -> String {
            format!("spdk:{}/ns{}", self.ctrlr.trid, self.ns.nsid)
        }
        fn size_bytes(&self) -> u64 {
            self.ns.size_bytes()
        }
        fn open_channel(&self) -> std::io::Result<Box<dyn IoChannel>> {
            let qp = IoQpair::open(&self.ctrlr, self.ns.nsid, QUEUE_DEPTH, CELLS).map_err(|e| {
                tracing::error!("{e}");
                std::io::Error::other(e)
            })?;
            // One per (reactor, device): the VFIO suite counts these lines.
            tracing::info!(nsid = self.ns.nsid, "I/O queue pair created");
            Ok(Box::new(SpdkChannel::new(qp, self.ns)))
        }
        fn sync(&self) -> std::io::Result<()> {
            if !self.ns.supports_flush() || self.ctrlr.is_failed() {
                return Ok(());
            }
            let mut ch = self.open_channel()?;
            ch.submit(0, IoOp::Flush, std::time::Instant::now())
                .map_err(|(_, e)| std::io::Error::from_raw_os_error(e))?;
            ch.flush_submissions();
            let mut out = Vec::new();
            // Cold path (shutdown): bounded by wall time so a dead remote cannot
            // hang the exit.
            let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while ch.poll(&mut out, std::time::Instant::now()) == 0 {
                if std::time::Instant::now() > until {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "flush did not complete in 10 s",
                    ));
                }
                std::hint::spin_loop();
            }
            match out.pop().map(|c| c.result) {
                Some(Err(e)) => Err(std::io::Error::from_raw_os_error(e)),
                _ => Ok(()),
            }
        }
        fn volatile(&self) -> bool {
            false
        }
        fn block_size(&self) -> Option<u32> {
            Some(self.ns.block_bytes)
        }
    }

    /// What one SPDK command of an operation does (its buffer travels beside it).
    #[derive(Debug, Clone, Copy)]
    enum PartKind {
        Read {
            lba: u64,
            blocks: u32,
        },
        Write {
            lba: u64,
            blocks: u32,
            fua: bool,
        },
        Flush,
        WriteZeroes {
            lba: u64,
            blocks: u32,
        },
        /// At most `ffi::MAX_DSM_BLOCKS` blocks (one Dataset Management command).
        Deallocate {
            lba: u64,
            blocks: u64,
        },
        /// Zeroes written from the queue pair's zeroed buffer (devices without
        /// Write Zeroes).
        ZeroWrite {
            lba: u64,
            blocks: u32,
        },
    }

    /// One SPDK command's worth of an operation.
    #[derive(Debug)]
    struct Part {
        slot: usize,
        kind: PartKind,
        buf: Option<IoBuf>,
    }

    struct Op {
        tag: u64,
        parts: u32,
        result: Result<(), i32>,
        buf: Option<IoBuf>,
    }

    /// This reactor's queue pair on the namespace.
    pub struct SpdkChannel {
        qp: IoQpair,
        ns: NamespaceInfo,
        ops: Vec<Option<Op>>,
        free_ops: Vec<usize>,
        /// Parts not yet at SPDK (no free cell, or SPDK's request pool full).
        pending: VecDeque<Part>,
        /// Per cell: the operation slot.
        cell_op: Vec<usize>,
        free_cells: Vec<u32>,
        reaped: Vec<(u32, u16, Option<IoBuf>)>,
        ready: Vec<IoCompletion>,
        in_flight: usize,
        dead: bool,
    }

    impl SpdkChannel {
        fn new(qp: IoQpair, ns: NamespaceInfo) -> SpdkChannel {
            let cells = qp.cells();
            SpdkChannel {
                ns,
                ops: Vec::new(),
                free_ops: Vec::new(),
                pending: VecDeque::new(),
                cell_op: vec![0; cells as usize],
                free_cells: (0..cells).rev().collect(),
                reaped: Vec::with_capacity(cells as usize),
                ready: Vec::new(),
                in_flight: 0,
                dead: false,
                qp,
            }
        }

        fn shift(&self) -> u32 {
            self.ns.block_bytes.trailing_zeros()
        }

        fn check_range(&self, offset: u64, len: u64) -> Result<(), i32> {
            let mask = self.ns.block_bytes as u64 - 1;
            if offset & mask != 0 || len & mask != 0 || len == 0 {
                return Err(libc::EINVAL);
            }
            match offset.checked_add(len) {
                Some(end) if end <= self.ns.size_bytes() => Ok(()),
                _ => Err(libc::EINVAL),
            }
        }

        fn queue(&mut self, slot: usize, kind: PartKind, buf: Option<IoBuf>) {
            self.pending.push_back(Part { slot, kind, buf });
        }

        /// Splits `op` into parts queued for `slot`.
        fn build(&mut self, slot: usize, op: IoOp) -> Result<(), (IoOp, i32)> {
            let shift = self.shift();
            let (offset, len) = match &op {
                IoOp::Read { offset, buf } | IoOp::Write { offset, buf, .. } => {
                    (*offset, buf.len() as u64)
                }
                IoOp::WriteZeroes { offset, len } | IoOp::Deallocate { offset, len } => {
                    (*offset, *len)
                }
                IoOp::Flush => (0, self.ns.block_bytes as u64),
            };
            if let Err(e) = self.check_range(offset, len) {
                return Err((op, e));
            }
            if len >> shift > u32::MAX as u64
                && matches!(op, IoOp::Read { .. } | IoOp::Write { .. })
            {
                return Err((op, libc::EINVAL));
            }
            let (lba, blocks) = (offset >> shift, len >> shift);
            match op {
                // One SPDK command each: SPDK splits it at the controller's MDTS.
                IoOp::Read { buf, .. } => self.queue(
                    slot,
                    PartKind::Read {
                        lba,
                        blocks: blocks as u32,
                    },
                    Some(buf),
                ),
                IoOp::Write { buf, fua, .. } => self.queue(
                    slot,
                    PartKind::Write {
                        lba,
                        blocks: blocks as u32,
                        fua,
                    },
                    Some(buf),
                ),
                IoOp::Flush => {
                    // Without a volatile write cache every completed write is
                    // durable, and the controller has no Flush to send.
                    if self.ns.supports_flush() {
                        self.queue(slot, PartKind::Flush, None);
                    }
                }
                IoOp::WriteZeroes { .. } => self.queue_zeroes(slot, lba, blocks),
                IoOp::Deallocate { .. } => {
                    // Deallocate promises zeros on read; only a device whose
                    // deallocated blocks read as zeros may take it as DSM.
                    if self.ns.supports_deallocate() && self.ns.deallocated_reads_zero {
                        let mut done = 0;
                        while done < blocks {
                            let n = (blocks - done).min(ffi::MAX_DSM_BLOCKS);
                            self.queue(
                                slot,
                                PartKind::Deallocate {
                                    lba: lba + done,
                                    blocks: n,
                                },
                                None,
                            );
                            done += n;
                        }
                    } else {
                        self.queue_zeroes(slot, lba, blocks);
                    }
                }
            }
            Ok(())
        }

        fn queue_zeroes(&mut self, slot: usize, lba: u64, blocks: u64) {
            let shift = self.shift();
            let with_buffer = !self.ns.supports_write_zeroes();
            let step = if with_buffer {
                ZERO_PIECE >> shift
            } else {
                MAX_ZEROES_BLOCKS
            };
            let mut done = 0;
            while done < blocks {
                let n = (blocks - done).min(step);
                let (lba, nb) = (lba + done, n as u32);
                if with_buffer {
                    self.queue(slot, PartKind::ZeroWrite { lba, blocks: nb }, None);
                } else {
                    self.queue(slot, PartKind::WriteZeroes { lba, blocks: nb }, None);
                }
                done += n;
            }
        }

        /// Records one part's outcome; the last part completes the operation.
        fn finish_part(&mut self, slot: usize, result: Result<(), i32>, caller_buf: Option<IoBuf>) {
            let Some(Some(o)) = self.ops.get_mut(slot) else {
                debug_assert!(false, "completion for no operation");
                return;
            };
            assert!(o.parts > 0, "operation completed more parts than it had");
            o.parts -= 1;
            if o.result.is_ok() {
                o.result = result;
            }
            if caller_buf.is_some() {
                o.buf = caller_buf;
            }
            if o.parts == 0 {
                if let Some(o) = self.ops[slot].take() {
                    self.free_ops.push(slot);
                    self.ready.push(IoCompletion {
                        tag: o.tag,
                        result: o.result,
                        buf: o.buf,
                    });
                }
            }
        }

        /// Hands queued parts to SPDK until cells or SPDK's requests run out.
        fn push_pending(&mut self) {
            while let Some(part) = self.pending.pop_front() {
                let Part { slot, kind, buf } = part;
                if self.dead {
                    self.finish_part(slot, Err(libc::EIO), buf);
                    continue;
                }
                let Some(cell) = self.free_cells.pop() else {
                    self.pending.push_front(Part { slot, kind, buf });
                    return;
                };
                let cmd = match (kind, buf) {
                    (PartKind::Read { lba, blocks }, Some(buf)) => {
                        Command::Read { lba, blocks, buf }
                    }
                    (PartKind::Write { lba, blocks, fua }, Some(buf)) => Command::Write {
                        lba,
                        blocks,
                        buf,
                        fua,
                    },
                    (PartKind::ZeroWrite { lba, blocks }, _) => {
                        Command::WriteFromZeroBuffer { lba, blocks }
                    }
                    (PartKind::Flush, _) => Command::Flush,
                    (PartKind::WriteZeroes { lba, blocks }, _) => {
                        Command::WriteZeroes { lba, blocks }
                    }
                    (PartKind::Deallocate { lba, blocks }, _) => {
                        Command::Deallocate { lba, blocks }
                    }
                    (_, None) => unreachable!("data parts are built with their buffer"),
                };
                match self.qp.submit(cell, cmd) {
                    Ok(()) => self.cell_op[cell as usize] = slot,
                    Err(SubmitError::Busy(buf)) => {
                        // SPDK's request pool is full: the part waits, in order,
                        // for completions to free requests.
                        self.free_cells.push(cell);
                        self.pending.push_front(Part { slot, kind, buf });
                        return;
                    }
                    Err(SubmitError::Failed(buf, e)) => {
                        self.free_cells.push(cell);
                        if e == libc::ENXIO {
                            self.dead = true;
                        }
                        tracing::debug!(errno = e, "SPDK refused a command");
                        let e = if e == libc::ENXIO { libc::EIO } else { e };
                        self.finish_part(slot, Err(e), buf);
                    }
                }
            }
        }
    }

    impl IoChannel for SpdkChannel {
        fn submit(&mut self, tag: u64, op: IoOp, _now: Instant) -> Result<(), (IoOp, i32)> {
            if self.dead || self.qp.is_failed() {
                self.dead = true;
                return Err((op, libc::EIO));
            }
            let slot = match self.free_ops.pop() {
                Some(i) => i,
                None => {
                    self.ops.push(None);
                    self.ops.len() - 1
                }
            };
            let before = self.pending.len();
            if let Err(e) = self.build(slot, op) {
                self.free_ops.push(slot);
                return Err(e);
            }
            let parts = (self.pending.len() - before) as u32;
            self.ops[slot] = Some(Op {
                tag,
                parts: parts.max(1),
                result: Ok(()),
                buf: None,
            });
            self.in_flight += 1;
            if parts == 0 {
                // Nothing for the device to do (Flush without a write cache).
                self.finish_part(slot, Ok(()), None);
            }
            Ok(())
        }

        fn flush_submissions(&mut self) {
            if !self.pending.is_empty() {
                self.push_pending();
            }
        }

        fn poll(&mut self, out: &mut Vec<IoCompletion>, _now: Instant) -> usize {
            let mut reaped = std::mem::take(&mut self.reaped);
            let failed = self.qp.process(&mut reaped).is_err();
            for (cell, status, buf) in reaped.drain(..) {
                self.free_cells.push(cell);
                let slot = self.cell_op[cell as usize];
                let result = if status == 0 {
                    Ok(())
                } else {
                    tracing::debug!(
                        status = format_args!("{status:#05x}"),
                        "SPDK command failed"
                    );
                    Err(errno_for_nvme_status(status))
                };
                self.finish_part(slot, result, buf);
            }
            self.reaped = reaped;
            if failed && !self.dead {
                self.dead = true;
            }
            if !self.pending.is_empty() {
                self.push_pending();
            }
            let n = self.ready.len();
            self.in_flight -= n;
            out.append(&mut self.ready);
            n
        }

        fn in_flight(&self) -> usize {
            self.in_flight
        }

        /// Polled: the reactor keeps polling while I/O is in flight.
        fn completion_fd(&self) -> Option<RawFd> {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn transport_ids_parse_and_print_as_spdk_wants() {
        let t: TransportId = "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:4430 subnqn:nqn.2016-06.io.spdk:cnode1 hostnqn:nqn.2014-08.org.nvmexpress:uuid:1"
            .parse()
            .unwrap();
        assert_eq!(t.trtype, TrType::Tcp);
        assert_eq!(
            t.hostnqn.as_deref(),
            Some("nqn.2014-08.org.nvmexpress:uuid:1")
        );
        assert_eq!(
            t.spdk_string(),
            "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:4430 subnqn:nqn.2016-06.io.spdk:cnode1"
        );
        assert!(!t.needs_dma_registration());
        let p: TransportId = "trtype:pcie traddr:0000:00:04.0".parse().unwrap();
        assert_eq!(p.spdk_string(), "trtype:PCIe traddr:0000:00:04.0");
        assert!(p.needs_dma_registration() && !p.is_fabrics());
        // adrfam defaults from the address; key=value works as in SPDK.
        let r: TransportId = "trtype=RDMA traddr=fe80::1 trsvcid=4420 subnqn=nqn.a:b"
            .parse()
            .unwrap();
        assert_eq!(r.adrfam.as_deref(), Some("IPv6"));
    }

    #[test]
    fn bad_transport_ids_name_the_problem() {
        for (s, want) in [
            ("traddr:1.2.3.4", "trtype is missing"),
            ("trtype:FC traddr:x", "trtype `FC`"),
            ("trtype:TCP traddr:1.2.3.4 subnqn:nqn.a:b", "trsvcid"),
            (
                "trtype:TCP traddr:1.2.3.4 trsvcid:99999 subnqn:nqn.a:b",
                "not a port",
            ),
            (
                "trtype:TCP traddr:1.2.3.4 trsvcid:4420",
                "subnqn is missing",
            ),
            (
                "trtype:TCP traddr:1.2.3.4 trsvcid:4420 subnqn:bad",
                "subnqn:",
            ),
            ("trtype:PCIe traddr:zz", "traddr `zz`"),
            (
                "trtype:PCIe traddr:0000:00:04.0 trsvcid:1",
                "PCIe takes only",
            ),
            ("trtype:PCIe", "traddr is missing"),
            ("trtype:PCIe trtype:TCP traddr:0000:00:04.0", "twice"),
            (
                "trtype:PCIe traddr:0000:00:04.0 colour:red",
                "unknown key `colour`",
            ),
            ("trtype:PCIe traddr:", "no value"),
            ("trtype", "not key:value"),
        ] {
            let e = s
                .parse::<TransportId>()
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(e.contains(want), "{s}: {e}");
        }
    }

    proptest! {
        #[test]
        fn parsing_never_panics_and_round_trips(s in "[ -~]{0,120}") {
            if let Ok(t) = s.parse::<TransportId>() {
                let again: TransportId = t.spdk_string().parse().unwrap();
                prop_assert_eq!(TransportId { hostnqn: None, ..t }, again);
            }
        }
    }

    #[cfg(not(feature = "spdk"))]
    #[test]
    fn without_the_feature_opening_says_so() {
        let t: TransportId = "trtype:PCIe traddr:0000:00:04.0".parse().unwrap();
        let e = open(&t, 1, &EnvSettings::default()).err();
        assert_eq!(e, Some(SpdkError::NotBuilt));
    }
}
