//! `nvme` backend: kvtarget's own user-space NVMe PCIe driver over VFIO.
//!
//! Each reactor's channel owns one I/O submission/completion queue pair on the
//! controller, created when the channel opens and deleted when it drops. Commands
//! carry PRPs (or one SGL data block, for multi-page transfers on a controller with
//! SGLs) built straight over the `IoBuf`s the transport filled (every `IoBuf`
//! lives in the DMA arena the IOMMU maps), the submission doorbell is rung once per
//! `flush_submissions` batch, and `poll` finds completions by the phase bit: no
//! interrupt, no lock on the data path. A command that outlives `IO_TIMEOUT` is
//! aborted; if it stays stuck (or the controller reports a fatal status) the
//! controller is reset and every channel fails what it had in flight with EIO and
//! recreates its queues. A controller that left the bus fails everything with EIO.
//!
//! Submodules: `spec` (formats, no I/O), `vfio` and `queue` (the only `unsafe`:
//! ioctls, BAR MMIO, DMA ring reads), `controller` (bring-up, admin, reset,
//! shutdown), `pci` (sysfs driver hand-over).

pub mod controller;
mod error;
pub mod pci;
mod queue;
pub mod spec;
mod vfio;

use super::{BlockDevice, IoChannel, IoCompletion, IoOp};
use controller::Controller;
use kvt_mem::{dma, IoBuf};
use queue::HwQueue;
use spec::{io, NamespaceInfo, Sqe, PAGE_BYTES, PRP_PER_PAGE};
use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use controller::shutdown_all;
pub use error::NvmeError;

/// A command outstanding longer than this is aborted, and after as long again the
/// controller is reset. Below the Linux host's 30 s I/O timeout, so a host sees an
/// NVMe error from us rather than timing out itself.
const IO_TIMEOUT: Duration = Duration::from_secs(8);
/// Polls between timeout checks (a check reads the clock).
const TIMEOUT_CHECK_EVERY: u32 = 4096;
/// Blocks one Write Zeroes or range of a Dataset Management command covers.
const MAX_BLOCKS_PER_COMMAND: u64 = 1 << 16;
const MAX_BLOCKS_PER_DSM_RANGE: u64 = u32::MAX as u64;

/// A namespace of a controller driven through VFIO.
pub struct NvmeDevice {
    ctrl: Arc<Controller>,
    nsid: u32,
    ns: NamespaceInfo,
}

impl NvmeDevice {
    pub fn open(bdf: &str, nsid: u32) -> Result<Arc<NvmeDevice>, NvmeError> {
        let bdf = pci::parse_bdf(bdf)?;
        let ctrl = Controller::get(&bdf)?;
        let ns = ctrl.identify_namespace(nsid)?;
        tracing::info!(
            pci = %bdf,
            nsid,
            blocks = ns.nsze,
            block_size = ns.block_bytes(),
            dlfeat = ns.dlfeat,
            "NVMe namespace"
        );
        Ok(Arc::new(NvmeDevice { ctrl, nsid, ns }))
    }
}

impl BlockDevice for NvmeDevice {
    fn describe(&self) -> String {
        format!("nvme:{}/ns{}", self.ctrl.bdf, self.nsid)
    }
    fn size_bytes(&self) -> u64 {
        self.ns.size_bytes()
    }
    fn open_channel(&self) -> std::io::Result<Box<dyn IoChannel>> {
        NvmeChannel::new(self.ctrl.clone(), self.nsid, self.ns)
            .map(|c| Box::new(c) as Box<dyn IoChannel>)
            .map_err(|e| {
                tracing::error!("{e}");
                std::io::Error::other(e)
            })
    }
    fn sync(&self) -> std::io::Result<()> {
        if !self.ctrl.info.vwc || self.ctrl.is_shut_down() {
            return Ok(());
        }
        let mut ch = self.open_channel()?;
        // Cold path (shutdown, tools): this loop is the channel's clock.
        ch.submit(0, IoOp::Flush, Instant::now())
            .map_err(|(_, e)| std::io::Error::from_raw_os_error(e))?;
        ch.flush_submissions();
        let mut out = Vec::new();
        while ch.poll(&mut out, Instant::now()) == 0 {
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
        Some(self.ns.block_bytes() as u32)
    }
}

/// One command's worth of an operation.
struct Part {
    op: usize,
    sqe: Sqe,
    /// Data in IOVA space: (iova, bytes).
    data: Option<(u64, usize)>,
}

struct Cmd {
    part: Part,
    started: Instant,
    aborted: bool,
}

struct Op {
    tag: u64,
    buf: Option<IoBuf>,
    /// Dataset Management range list, kept alive while the command runs.
    _ranges: Option<IoBuf>,
    parts: u32,
    result: Result<(), i32>,
}

pub struct NvmeChannel {
    ctrl: Arc<Controller>,
    nsid: u32,
    ns: NamespaceInfo,
    q: HwQueue,
    generation: u64,
    /// One PRP list page per command id.
    prp_lists: IoBuf,
    prp_iova: u64,
    prp_scratch: Box<[u64; PRP_PER_PAGE]>,
    cmds: Vec<Option<Cmd>>,
    free_cids: Vec<u16>,
    ops: Vec<Option<Op>>,
    free_ops: Vec<usize>,
    pending: VecDeque<Part>,
    ready: Vec<IoCompletion>,
    in_flight: usize,
    zeros: Option<(IoBuf, u64)>,
    polls: u32,
    dead: bool,
    max_transfer: u64,
    /// Multi-page transfers use an SGL descriptor (the controller has SGLs).
    sgl: bool,
}

impl NvmeChannel {
    fn new(ctrl: Arc<Controller>, nsid: u32, ns: NamespaceInfo) -> Result<NvmeChannel, NvmeError> {
        let qid = ctrl
            .alloc_qid()
            .ok_or_else(|| NvmeError::NoQueueId(ctrl.bdf.clone()))?;
        let size = ctrl.io_queue_entries;
        let mut q = match HwQueue::new(ctrl.bar(), &ctrl.cap, qid, size) {
            Ok(q) => q,
            Err(e) => {
                ctrl.free_qid(qid);
                return Err(e);
            }
        };
        let generation = match ctrl.create_io_queue(&mut q) {
            Ok(g) => g,
            Err(e) => {
                ctrl.free_qid(qid);
                return Err(e);
            }
        };
        let cids = size as usize - 1;
        let prp_lists = IoBuf::new(cids * PAGE_BYTES);
        let prp_iova = dma::iova(prp_lists.as_ptr(), prp_lists.len()).unwrap_or(0);
        // One per (reactor, device): the VFIO suite counts these lines.
        tracing::info!(pci = %ctrl.bdf, nsid, qid, entries = size, "I/O queue pair created");
        Ok(NvmeChannel {
            max_transfer: ctrl.max_transfer_bytes,
            sgl: ctrl.info.supports_sgl() && std::env::var_os("KVTARGET_NVME_NO_SGL").is_none(),
            ctrl,
            nsid,
            ns,
            q,
            generation,
            prp_lists,
            prp_iova,
            prp_scratch: Box::new([0; PRP_PER_PAGE]),
            cmds: (0..cids).map(|_| None).collect(),
            free_cids: (0..cids as u16).rev().collect(),
            ops: Vec::new(),
            free_ops: Vec::new(),
            pending: VecDeque::new(),
            ready: Vec::new(),
            in_flight: 0,
            zeros: None,
            polls: 0,
            dead: false,
        })
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<(), i32> {
        let mask = self.ns.block_bytes() - 1;
        if offset & mask != 0 || len & mask != 0 {
            return Err(libc::EINVAL);
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.ns.size_bytes() => Ok(()),
            _ => Err(libc::EINVAL),
        }
    }

    /// Queues reads or writes of `len` bytes at `iova` in commands of at most the
    /// controller's transfer size.
    fn queue_rw(&mut self, op: usize, opcode: u8, offset: u64, iova: u64, len: u64, flags: u32) {
        let shift = self.ns.lba_shift;
        let mut done = 0;
        while done < len {
            let n = (len - done).min(self.max_transfer);
            let sqe = Sqe::rw(
                opcode,
                self.nsid,
                (offset + done) >> shift,
                (n >> shift) as u32,
                flags,
            );
            self.pending.push_back(Part {
                op,
                sqe,
                data: Some((iova + done, n as usize)),
            });
            done += n;
        }
    }

    /// Zeroes a range: Write Zeroes where supported, else writes of a zero buffer.
    fn queue_zeroes(&mut self, op: usize, offset: u64, len: u64) -> Result<(), i32> {
        let shift = self.ns.lba_shift;
        if self.ctrl.info.supports_write_zeroes() {
            let mut done = 0;
            while done < len {
                let n = (len - done).min(MAX_BLOCKS_PER_COMMAND << shift);
                let sqe = Sqe::rw(
                    io::WRITE_ZEROES,
                    self.nsid,
                    (offset + done) >> shift,
                    (n >> shift) as u32,
                    0,
                );
                self.pending.push_back(Part {
                    op,
                    sqe,
                    data: None,
                });
                done += n;
            }
            return Ok(());
        }
        if self.zeros.is_none() {
            let z = IoBuf::new(self.max_transfer as usize);
            let iova = dma::iova(z.as_ptr(), z.len()).ok_or(libc::EIO)?;
            self.zeros = Some((z, iova));
        }
        let zi = self.zeros.as_ref().map(|z| z.1).ok_or(libc::EIO)?;
        let mut done = 0;
        while done < len {
            let n = (len - done).min(self.max_transfer);
            self.queue_rw(op, io::WRITE, offset + done, zi, n, 0);
            done += n;
        }
        Ok(())
    }

    /// Deallocate through Dataset Management when the controller has it and
    /// deallocated blocks read as zeros (what `IoOp::Deallocate` promises);
    /// otherwise the range is zeroed.
    fn queue_deallocate(&mut self, op: usize, offset: u64, len: u64) -> Result<(), i32> {
        let shift = self.ns.lba_shift;
        let blocks = len >> shift;
        let ranges = blocks.div_ceil(MAX_BLOCKS_PER_DSM_RANGE) as usize;
        if !self.ctrl.info.supports_dsm()
            || !self.ns.deallocated_reads_zero()
            || ranges > io::DSM_MAX_RANGES
        {
            return self.queue_zeroes(op, offset, len);
        }
        let mut list = IoBuf::new(4096);
        let mut slba = offset >> shift;
        let mut left = blocks;
        for i in 0..ranges {
            let n = left.min(MAX_BLOCKS_PER_DSM_RANGE);
            list[i * 16..i * 16 + 16].copy_from_slice(&spec::dsm_range(slba, n as u32));
            slba += n;
            left -= n;
        }
        let iova = dma::iova(list.as_ptr(), 4096).ok_or(libc::EIO)?;
        let sqe = Sqe::new(io::DSM, self.nsid)
            .cdw(0, ranges as u32 - 1)
            .cdw(1, io::DSM_AD);
        self.pending.push_back(Part {
            op,
            sqe,
            data: Some((iova, ranges * 16)),
        });
        if let Some(Some(o)) = self.ops.get_mut(op) {
            o._ranges = Some(list);
        }
        Ok(())
    }

    fn build(&mut self, slot: usize, op: &IoOp) -> Result<(), i32> {
        match op {
            IoOp::Read { offset, buf } | IoOp::Write { offset, buf, .. } => {
                let len = buf.len() as u64;
                if len == 0 {
                    return Err(libc::EINVAL);
                }
                self.check_range(*offset, len)?;
                let Some(iova) = dma::iova(buf.as_ptr(), buf.len()) else {
                    tracing::error!("I/O buffer outside DMA-mapped memory");
                    return Err(libc::EIO);
                };
                let (opcode, flags) = match op {
                    IoOp::Write { fua: true, .. } => (io::WRITE, io::FUA),
                    IoOp::Write { .. } => (io::WRITE, 0),
                    _ => (io::READ, 0),
                };
                self.queue_rw(slot, opcode, *offset, iova, len, flags);
                Ok(())
            }
            IoOp::Flush => {
                // Without a volatile write cache every completed write is durable.
                if self.ctrl.info.vwc {
                    self.pending.push_back(Part {
                        op: slot,
                        sqe: Sqe::new(io::FLUSH, self.nsid),
                        data: None,
                    });
                }
                Ok(())
            }
            IoOp::WriteZeroes { offset, len } => {
                self.check_range(*offset, *len)?;
                self.queue_zeroes(slot, *offset, *len)
            }
            IoOp::Deallocate { offset, len } => {
                self.check_range(*offset, *len)?;
                self.queue_deallocate(slot, *offset, *len)
            }
        }
    }

    fn finish_part(&mut self, op: usize, result: Result<(), i32>) {
        let Some(Some(o)) = self.ops.get_mut(op) else {
            return;
        };
        o.parts = o.parts.saturating_sub(1);
        if o.result.is_ok() {
            o.result = result;
        }
        if o.parts == 0 {
            if let Some(o) = self.ops[op].take() {
                self.free_ops.push(op);
                self.ready.push(IoCompletion {
                    tag: o.tag,
                    result: o.result,
                    buf: o.buf,
                });
            }
        }
    }

    /// Fails every command in flight and queued (the controller dropped them).
    fn fail_all(&mut self, errno: i32) {
        for cid in 0..self.cmds.len() {
            if let Some(c) = self.cmds[cid].take() {
                self.free_cids.push(cid as u16);
                self.finish_part(c.part.op, Err(errno));
            }
        }
        while let Some(p) = self.pending.pop_front() {
            self.finish_part(p.op, Err(errno));
        }
    }

    /// After a controller reset: what was in flight is lost; recreate the queue.
    fn recover(&mut self) {
        let n = self.cmds.iter().filter(|c| c.is_some()).count();
        if n > 0 {
            tracing::warn!(pci = %self.ctrl.bdf, qid = self.q.qid, commands = n, "controller was reset: failing in-flight commands");
        }
        for cid in 0..self.cmds.len() {
            if let Some(c) = self.cmds[cid].take() {
                self.free_cids.push(cid as u16);
                self.finish_part(c.part.op, Err(libc::EIO));
            }
        }
        match self.ctrl.create_io_queue(&mut self.q) {
            Ok(g) => self.generation = g,
            Err(e) => {
                tracing::error!(
                    qid = self.q.qid,
                    "cannot recreate I/O queue after reset: {e}"
                );
                self.dead = true;
                self.fail_all(libc::EIO);
            }
        }
    }

    fn check_timeouts(&mut self) {
        let now = Instant::now();
        let mut stuck: Option<(u16, bool)> = None;
        for (cid, c) in self.cmds.iter().enumerate() {
            if let Some(c) = c {
                if now.duration_since(c.started) > IO_TIMEOUT {
                    stuck = Some((cid as u16, c.aborted));
                    break;
                }
            }
        }
        let Some((cid, aborted)) = stuck else {
            return;
        };
        if self.ctrl.is_gone() {
            self.dead = true;
            self.fail_all(libc::EIO);
            return;
        }
        if !aborted && !self.ctrl.is_fatal() {
            tracing::warn!(pci = %self.ctrl.bdf, qid = self.q.qid, cid, "command timed out; aborting it");
            if let Some(Some(c)) = self.cmds.get_mut(cid as usize) {
                c.aborted = true;
                c.started = now;
            }
            if self.ctrl.abort(self.q.qid, cid).is_ok() {
                return;
            }
        }
        if let Err(e) = self.ctrl.reset(self.generation) {
            tracing::error!("{e}");
        }
    }

    fn push_pending(&mut self) {
        let mut now = None;
        while !self.pending.is_empty() {
            let Some(cid) = self.free_cids.pop() else {
                break;
            };
            let Some(mut part) = self.pending.pop_front() else {
                break;
            };
            part.sqe.set_cid(cid);
            let pages = part.data.map_or(0, |(iova, len)| {
                let first = iova & !(PAGE_BYTES as u64 - 1);
                (iova + len as u64 - first).div_ceil(PAGE_BYTES as u64)
            });
            if let (true, Some((iova, len))) = (self.sgl && pages > 2, part.data) {
                // One Data Block descriptor instead of a PRP list: the buffer is
                // contiguous in IOVA space.
                part.sqe.set_sgl_data(iova, len as u32);
            } else if let Some((iova, len)) = part.data {
                let list_iova = self.prp_iova + cid as u64 * PAGE_BYTES as u64;
                match spec::build_prps(iova, len, &mut self.prp_scratch, list_iova) {
                    Ok((p1, p2)) => {
                        if p2 == list_iova && p2 != 0 {
                            let n = pages as usize - 1;
                            let at = cid as usize * PAGE_BYTES;
                            for (i, e) in self.prp_scratch[..n].iter().enumerate() {
                                self.prp_lists[at + i * 8..at + i * 8 + 8]
                                    .copy_from_slice(&e.to_le_bytes());
                            }
                        }
                        part.sqe.set_prp(p1, p2);
                    }
                    Err(e) => {
                        tracing::warn!("cannot describe buffer: {e}");
                        self.free_cids.push(cid);
                        self.finish_part(part.op, Err(libc::EINVAL));
                        continue;
                    }
                }
            }
            self.q.push(part.sqe);
            let started = *now.get_or_insert_with(Instant::now);
            self.cmds[cid as usize] = Some(Cmd {
                part,
                started,
                aborted: false,
            });
        }
        self.q.ring_sq();
    }
}

impl IoChannel for NvmeChannel {
    fn submit(&mut self, tag: u64, op: IoOp, _now: Instant) -> Result<(), (IoOp, i32)> {
        if self.dead || self.ctrl.is_shut_down() {
            return Err((op, libc::EIO));
        }
        let slot = match self.free_ops.pop() {
            Some(i) => i,
            None => {
                self.ops.push(None);
                self.ops.len() - 1
            }
        };
        self.ops[slot] = Some(Op {
            tag,
            buf: None,
            _ranges: None,
            parts: 0,
            result: Ok(()),
        });
        let before = self.pending.len();
        if let Err(e) = self.build(slot, &op) {
            self.pending.truncate(before);
            self.ops[slot] = None;
            self.free_ops.push(slot);
            return Err((op, e));
        }
        let parts = (self.pending.len() - before) as u32;
        let buf = op.into_buf();
        self.in_flight += 1;
        if let Some(Some(o)) = self.ops.get_mut(slot) {
            o.buf = buf;
            o.parts = parts;
            if parts == 0 {
                // Nothing for the controller to do (Flush without a write cache).
                o.parts = 1;
                self.finish_part(slot, Ok(()));
            }
        }
        Ok(())
    }

    fn flush_submissions(&mut self) {
        if !self.pending.is_empty() {
            self.push_pending();
        }
    }

    fn poll(&mut self, out: &mut Vec<IoCompletion>, _now: Instant) -> usize {
        if self.ctrl.generation() != self.generation && !self.dead {
            self.recover();
        }
        let mut reaped = false;
        while let Some(c) = self.q.next_cqe() {
            reaped = true;
            let Some(cmd) = self.cmds.get_mut(c.cid as usize).and_then(Option::take) else {
                tracing::warn!(qid = self.q.qid, cid = c.cid, "completion for no command");
                continue;
            };
            self.free_cids.push(c.cid);
            let result = if c.ok() {
                Ok(())
            } else {
                tracing::warn!(pci = %self.ctrl.bdf, opcode = cmd.part.sqe.opcode(), status = c.status, "command failed");
                Err(super::errno_for_nvme_status(c.status))
            };
            self.finish_part(cmd.part.op, result);
        }
        if reaped {
            self.q.ring_cq();
        }
        if self.free_cids.len() < self.cmds.len() {
            self.polls = self.polls.wrapping_add(1);
            if self.polls % TIMEOUT_CHECK_EVERY == 0 {
                self.check_timeouts();
            }
        }
        if reaped {
            self.flush_submissions();
        }
        let n = self.ready.len();
        self.in_flight -= n;
        out.append(&mut self.ready);
        n
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Polled: no interrupt, no fd. The reactor busy-polls while I/O is in flight.
    fn completion_fd(&self) -> Option<RawFd> {
        None
    }
}

impl Drop for NvmeChannel {
    fn drop(&mut self) {
        let qid = self.q.qid;
        if let Err(e) = self.ctrl.delete_io_queue(qid) {
            // The controller may still own the rings and buffers: stop it before
            // they are freed.
            tracing::error!("deleting I/O queue {qid}: {e}");
            let _ = self.ctrl.reset(self.ctrl.generation());
        }
        self.ctrl.free_qid(qid);
    }
}
