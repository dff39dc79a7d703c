//! Volumes as block devices: `VolumeDevice` is what a namespace serves, and
//! `VolumeChannel` is one reactor's path to it. A channel turns logical I/O into
//! physical extent I/O on the reactor's own channel to the pool device:
//! mapping on first write, zeros (or the unwritten-block error) for unmapped
//! ranges, valid-block bitmaps, dual-path scheduling of large transfers, and
//! Flush/FUA through the metadata thread's group commit.

use super::volume::{AllocError, Volume};
use super::{Notifier, Pool};
use crate::bdev::{
    BlockDevice, IoChannel, IoCompletion, IoOp, ThinInfo, ERRNO_NO_SPACE, ERRNO_UNWRITTEN,
};
use crate::mem::IoBuf;
use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A volume served as a namespace.
pub struct VolumeDevice {
    pub pool: Arc<Pool>,
    pub vol: Arc<Volume>,
}

impl VolumeDevice {
    pub fn new(pool: Arc<Pool>, vol: Arc<Volume>) -> Arc<VolumeDevice> {
        Arc::new(VolumeDevice { pool, vol })
    }
}

impl BlockDevice for VolumeDevice {
    fn describe(&self) -> String {
        format!("volume {}/{}", self.pool.name, self.vol.desc.name)
    }
    fn size_bytes(&self) -> u64 {
        self.vol.desc.size_bytes
    }
    fn open_channel(&self) -> std::io::Result<Box<dyn IoChannel>> {
        Ok(Box::new(VolumeChannel::new(
            self.pool.clone(),
            self.vol.clone(),
        )?))
    }
    fn sync(&self) -> std::io::Result<()> {
        self.pool.sync().map_err(std::io::Error::other)
    }
    fn volatile(&self) -> bool {
        self.pool.device().volatile()
    }
    fn thin_info(&self) -> Option<ThinInfo> {
        Some(ThinInfo {
            used_bytes: self.vol.used_bytes(),
            unwritten_error: self.vol.unwritten_error(),
            uuid: self.vol.desc.uuid,
        })
    }
    fn block_size(&self) -> Option<u32> {
        Some(self.vol.desc.block_size)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read,
    Write { fua: bool },
    Zeroes,
    Flush,
}

struct Req {
    tag: u64,
    kind: Kind,
    /// Bytes the command covers (for the I/O counters).
    bytes: u64,
    deallocate: bool,
    /// The caller's buffer; device operations use views into it.
    buf: Option<IoBuf>,
    pending: u32,
    err: Option<i32>,
    pinned: Vec<u32>,
    /// Extents whose last valid block went: unmapped once unpinned.
    emptied: Vec<u32>,
    /// Buffer ranges (offset, length) of blocks not valid in a mapped extent:
    /// zeroed once the device read is done, because the bitmap, not the
    /// device, says what a block holds (after a crash, data of an unflushed
    /// write may sit in blocks the bitmap does not count).
    zero_after: Vec<(usize, usize)>,
    start: Instant,
}

/// How long a write waiting for clean extents waits before retrying anyway.
const STALL_RETRY: Duration = Duration::from_millis(20);

pub struct VolumeChannel {
    pool: Arc<Pool>,
    vol: Arc<Volume>,
    base: Box<dyn IoChannel>,
    notify: Arc<Notifier>,
    reqs: Vec<Option<Req>>,
    free: Vec<u32>,
    active: usize,
    done: Vec<IoCompletion>,
    stalled: VecDeque<(u64, IoOp)>,
    stalled_at: Option<Instant>,
    large: VecDeque<(u32, IoOp)>,
    large_inflight: usize,
    scratch: Vec<IoCompletion>,
    reactor: usize,
    stats: Arc<crate::pool::volume::ChannelStats>,
}

impl VolumeChannel {
    pub fn new(pool: Arc<Pool>, vol: Arc<Volume>) -> std::io::Result<VolumeChannel> {
        let base = pool.device().open_channel()?;
        let notify = Arc::new(Notifier::new());
        pool.register_waiter(&notify);
        Ok(VolumeChannel {
            stats: vol.new_channel_stats(),
            reactor: crate::reactor::current_reactor(),
            pool,
            vol,
            base,
            notify,
            reqs: Vec::new(),
            free: Vec::new(),
            active: 0,
            done: Vec::new(),
            stalled: VecDeque::new(),
            stalled_at: None,
            large: VecDeque::new(),
            large_inflight: 0,
            scratch: Vec::new(),
        })
    }

    fn new_req(&mut self, tag: u64, kind: Kind, buf: Option<IoBuf>) -> u32 {
        let r = Req {
            tag,
            kind,
            bytes: buf.as_ref().map_or(0, |b| b.len() as u64),
            deallocate: false,
            buf,
            pending: 0,
            err: None,
            pinned: Vec::new(),
            emptied: Vec::new(),
            zero_after: Vec::new(),
            start: Instant::now(),
        };
        self.active += 1;
        if kind != Kind::Flush {
            self.stats.inflight.fetch_add(1, Ordering::Relaxed);
        }
        match self.free.pop() {
            Some(i) => {
                self.reqs[i as usize] = Some(r);
                i
            }
            None => {
                self.reqs.push(Some(r));
                (self.reqs.len() - 1) as u32
            }
        }
    }

    fn complete_now(&mut self, tag: u64, result: Result<(), i32>, buf: Option<IoBuf>) {
        self.done.push(IoCompletion { tag, result, buf });
    }

    /// Every device operation of request `ri` is done.
    fn finish(&mut self, ri: u32) {
        let Some(r) = self.reqs.get_mut(ri as usize).and_then(|r| r.as_mut()) else {
            return;
        };
        for &lext in &r.pinned {
            self.vol.unpin(lext);
        }
        r.pinned.clear();
        for &lext in &r.emptied {
            match self.vol.try_unmap_empty(lext) {
                Ok(Some(p)) => self.pool.extent_freed(p),
                Ok(None) => {}
                Err(()) => self.pool.retry_unmap(self.vol.desc.id, lext),
            }
        }
        r.emptied.clear();
        if let Some(buf) = r.buf.as_mut() {
            for &(at, n) in &r.zero_after {
                if let Some(s) = buf.get_mut(at..at + n) {
                    s.fill(0);
                }
            }
        }
        if r.kind == (Kind::Write { fua: true }) && r.err.is_none() {
            // Durable data and metadata before the acknowledgement.
            r.kind = Kind::Flush;
            self.stats.inflight.fetch_sub(1, Ordering::Relaxed);
            self.pool.request_commit(ri as u64, self.notify.clone());
            return;
        }
        self.release(ri);
    }

    fn release(&mut self, ri: u32) {
        let Some(r) = self.reqs.get_mut(ri as usize).and_then(|r| r.take()) else {
            return;
        };
        self.free.push(ri);
        self.active -= 1;
        let ns = r.start.elapsed().as_nanos() as u64;
        if r.kind != Kind::Flush {
            self.stats.inflight.fetch_sub(1, Ordering::Relaxed);
        }
        let st = &self.stats;
        if r.err.is_some() {
            st.errors.fetch_add(1, Ordering::Relaxed);
        } else if r.kind == Kind::Flush {
            st.flushes.fetch_add(1, Ordering::Relaxed);
        } else {
            let b = crate::pool::volume::latency_bucket(ns);
            let (ops, bytes, time) = match r.kind {
                Kind::Read => {
                    st.read_hist[b].fetch_add(1, Ordering::Relaxed);
                    (&st.reads, &st.read_bytes, &st.read_ns)
                }
                Kind::Zeroes if r.deallocate => (&st.unmaps, &st.unmap_bytes, &st.unmap_ns),
                _ => {
                    st.write_hist[b].fetch_add(1, Ordering::Relaxed);
                    (&st.writes, &st.write_bytes, &st.write_ns)
                }
            };
            ops.fetch_add(1, Ordering::Relaxed);
            bytes.fetch_add(r.bytes, Ordering::Relaxed);
            time.fetch_add(ns, Ordering::Relaxed);
        }
        let result = match r.err {
            Some(e) => Err(e),
            None => Ok(()),
        };
        self.done.push(IoCompletion {
            tag: r.tag,
            result,
            buf: r.buf,
        });
    }

    fn fail(&mut self, ri: u32, errno: i32) {
        if let Some(r) = self.reqs.get_mut(ri as usize).and_then(|r| r.as_mut()) {
            r.err.get_or_insert(errno);
        }
    }

    /// Queues one physical operation of request `ri` over `at..at+len` of its
    /// buffer (or with no buffer), splitting large transfers into pieces.
    fn issue(
        &mut self,
        ri: u32,
        phys_off: u64,
        at: usize,
        len: u64,
        make: fn(u64, Option<IoBuf>, u64) -> IoOp,
    ) {
        let dp = self.pool.opts.dual_path;
        let large = dp.enabled && len >= dp.large_threshold;
        let piece = if large {
            dp.piece.max(4096)
        } else {
            len.max(1)
        };
        let has_buf = matches!(
            self.reqs
                .get(ri as usize)
                .and_then(|r| r.as_ref())
                .map(|r| r.kind),
            Some(Kind::Read | Kind::Write { .. })
        );
        let mut done = 0u64;
        while done < len {
            let n = piece.min(len - done);
            let view = if has_buf {
                let Some(parent) = self
                    .reqs
                    .get_mut(ri as usize)
                    .and_then(|r| r.as_mut())
                    .and_then(|r| r.buf.as_mut())
                else {
                    self.fail(ri, libc::EIO);
                    return;
                };
                // SAFETY: the parent stays in its request, untouched, until every
                // operation of the request has completed (pending reaches 0), and
                // the ranges of one request never overlap.
                match unsafe { IoBuf::view(parent, at + done as usize, n as usize) } {
                    Some(v) => Some(v),
                    None => {
                        self.fail(ri, libc::EINVAL);
                        return;
                    }
                }
            } else {
                None
            };
            let op = make(phys_off + done, view, n);
            if let Some(r) = self.reqs.get_mut(ri as usize).and_then(|r| r.as_mut()) {
                r.pending += 1;
            }
            if large {
                self.large.push_back((ri, op));
            } else {
                self.submit_base(ri, op, false);
            }
            done += n;
        }
    }

    fn submit_base(&mut self, ri: u32, op: IoOp, large: bool) {
        let tag = (ri as u64) << 1 | large as u64;
        if let Err((_, errno)) = self.base.submit(tag, op) {
            if let Some(r) = self.reqs.get_mut(ri as usize).and_then(|r| r.as_mut()) {
                r.err.get_or_insert(errno);
                r.pending -= 1;
            }
        } else if large {
            self.large_inflight += 1;
        }
    }

    fn pump_large(&mut self) {
        let max = self.pool.opts.dual_path.max_inflight.max(1);
        while self.large_inflight < max {
            let Some((ri, op)) = self.large.pop_front() else {
                break;
            };
            self.submit_base(ri, op, true);
        }
    }

    fn settle(&mut self, ri: u32) {
        let pending = self
            .reqs
            .get(ri as usize)
            .and_then(|r| r.as_ref())
            .map(|r| r.pending);
        if pending == Some(0) {
            self.finish(ri);
        }
    }

    fn check_range(&self, offset: u64, len: u64) -> bool {
        let bs = self.vol.desc.block_size as u64;
        offset % bs == 0
            && len % bs == 0
            && offset
                .checked_add(len)
                .is_some_and(|e| e <= self.vol.desc.size_bytes)
    }

    fn start_read(&mut self, tag: u64, offset: u64, mut buf: IoBuf) {
        let len = buf.len() as u64;
        if !self.check_range(offset, len) {
            return self.complete_now(tag, Err(libc::EINVAL), Some(buf));
        }
        let bs = self.vol.desc.block_size as u64;
        let mut plan = Vec::new();
        let mut pinned = Vec::new();
        let mut zero_after = Vec::new();
        let mut runs = Vec::new();
        let mut err = None;
        for (lext, off, n) in self.vol.pieces(offset, len) {
            let at = ((lext as u64) * self.vol.extent_size() + off - offset) as usize;
            let Some(phys) = self.vol.pin(lext) else {
                if self.vol.unwritten_error() {
                    err = Some(ERRNO_UNWRITTEN);
                    break;
                }
                buf[at..at + n as usize].fill(0);
                continue;
            };
            let (first, nb) = ((off / bs) as u32, (n / bs) as u32);
            runs.clear();
            self.vol.invalid_runs(lext, first, nb, &mut runs);
            if !runs.is_empty() && self.vol.unwritten_error() {
                self.vol.unpin(lext);
                err = Some(ERRNO_UNWRITTEN);
                break;
            }
            if runs.len() == 1 && runs[0] == (first, nb) {
                // Nothing valid here: zeros without device I/O.
                self.vol.unpin(lext);
                buf[at..at + n as usize].fill(0);
                continue;
            }
            pinned.push(lext);
            for &(b, c) in &runs {
                zero_after.push((
                    at + ((b - first) as u64 * bs) as usize,
                    (c as u64 * bs) as usize,
                ));
            }
            plan.push((self.pool.sb.extent_offset(phys) + off, at, n));
        }
        let ri = self.new_req(tag, Kind::Read, Some(buf));
        if let Some(r) = self.reqs.get_mut(ri as usize).and_then(|r| r.as_mut()) {
            r.pinned = pinned;
            r.err = err;
            r.zero_after = zero_after;
        }
        if err.is_none() {
            for (phys_off, at, n) in plan {
                self.issue(ri, phys_off, at, n, |offset, buf, _| IoOp::Read {
                    offset,
                    buf: buf.unwrap_or_else(|| IoBuf::new(0)),
                });
            }
        }
        self.settle(ri);
    }

    /// Maps and pins every extent of a write. On `Wait` the extents mapped so
    /// far stay mapped (the retry finds them, so progress is monotonic); on
    /// failure the range's extents with nothing valid in them are given back.
    fn map_range(
        &mut self,
        offset: u64,
        len: u64,
    ) -> Result<Vec<(u32, u32, u64, u64)>, AllocError> {
        let mut got: Vec<(u32, u32, u64, u64)> = Vec::new();
        for (lext, off, n) in self.vol.pieces(offset, len) {
            let (pool, reactor) = (&self.pool, self.reactor);
            match self.vol.pin_or_map(
                lext,
                || pool.take_extent(reactor),
                |c| pool.return_extent(reactor, c),
            ) {
                Ok((phys, _)) => got.push((lext, phys, off, n)),
                Err(e) => {
                    for (l, ..) in &got {
                        self.vol.unpin(*l);
                    }
                    if e != AllocError::Wait {
                        for (l, ..) in self.vol.pieces(offset, len) {
                            match self.vol.try_unmap_empty(l) {
                                Ok(Some(p)) => self.pool.extent_freed(p),
                                Ok(None) => {}
                                Err(()) => self.pool.retry_unmap(self.vol.desc.id, l),
                            }
                        }
                    }
                    return Err(e);
                }
            }
        }
        Ok(got)
    }

    fn stall(&mut self, tag: u64, op: IoOp) {
        if self.stalled.is_empty() {
            self.stalled_at = Some(Instant::now());
        }
        self.stalled.push_back((tag, op));
    }

    fn start_write(&mut self, tag: u64, offset: u64, buf: IoBuf, fua: bool) {
        let len = buf.len() as u64;
        if !self.check_range(offset, len) {
            return self.complete_now(tag, Err(libc::EINVAL), Some(buf));
        }
        let mapped = match self.map_range(offset, len) {
            Ok(m) => m,
            Err(AllocError::Wait) => return self.stall(tag, IoOp::Write { offset, buf, fua }),
            Err(AllocError::NoSpace) => {
                return self.complete_now(tag, Err(ERRNO_NO_SPACE), Some(buf))
            }
            Err(AllocError::Failed) => return self.complete_now(tag, Err(libc::EIO), Some(buf)),
        };
        let bs = self.vol.desc.block_size as u64;
        let ri = self.new_req(tag, Kind::Write { fua }, Some(buf));
        let mut plan = Vec::new();
        for &(lext, phys, off, n) in &mapped {
            self.vol.set_valid(lext, (off / bs) as u32, (n / bs) as u32);
            let at = ((lext as u64) * self.vol.extent_size() + off - offset) as usize;
            plan.push((self.pool.sb.extent_offset(phys) + off, at, n));
        }
        if let Some(r) = self.reqs.get_mut(ri as usize).and_then(|r| r.as_mut()) {
            r.pinned = mapped.iter().map(|m| m.0).collect();
        }
        for (phys_off, at, n) in plan {
            self.issue(ri, phys_off, at, n, |offset, buf, _| IoOp::Write {
                offset,
                buf: buf.unwrap_or_else(|| IoBuf::new(0)),
                fua: false,
            });
        }
        self.settle(ri);
    }

    fn start_zeroes(&mut self, tag: u64, offset: u64, len: u64, deallocate: bool) {
        if !self.check_range(offset, len) {
            return self.complete_now(tag, Err(libc::EINVAL), None);
        }
        let bs = self.vol.desc.block_size as u64;
        let mut plan = Vec::new();
        let mut pinned = Vec::new();
        let mut emptied = Vec::new();
        if deallocate || !self.vol.unwritten_error() {
            // Deallocate, or Write Zeroes where unwritten blocks already read as
            // zeros: only mapped extents need device work.
            for (lext, off, n) in self.vol.pieces(offset, len) {
                let Some(phys) = self.vol.pin(lext) else {
                    continue;
                };
                pinned.push(lext);
                let (first, nb) = ((off / bs) as u32, (n / bs) as u32);
                if deallocate {
                    if self.vol.clear_valid(lext, first, nb) {
                        emptied.push(lext);
                    }
                } else {
                    self.vol.set_valid(lext, first, nb);
                }
                plan.push((self.pool.sb.extent_offset(phys) + off, n));
            }
        } else {
            // Write Zeroes on a volume that reports unwritten blocks: the zeros
            // are data, so the blocks become valid (mapping if needed).
            match self.map_range(offset, len) {
                Ok(mapped) => {
                    for (lext, phys, off, n) in mapped {
                        pinned.push(lext);
                        self.vol.set_valid(lext, (off / bs) as u32, (n / bs) as u32);
                        plan.push((self.pool.sb.extent_offset(phys) + off, n));
                    }
                }
                Err(AllocError::Wait) => return self.stall(tag, IoOp::WriteZeroes { offset, len }),
                Err(AllocError::NoSpace) => {
                    return self.complete_now(tag, Err(ERRNO_NO_SPACE), None)
                }
                Err(AllocError::Failed) => return self.complete_now(tag, Err(libc::EIO), None),
            }
        }
        let ri = self.new_req(tag, Kind::Zeroes, None);
        if let Some(r) = self.reqs.get_mut(ri as usize).and_then(|r| r.as_mut()) {
            r.pinned = pinned;
            r.emptied = emptied;
            r.bytes = len;
            r.deallocate = deallocate;
        }
        for (phys_off, n) in plan {
            // Deallocated blocks must read back as zeros (DLFEAT) even while the
            // extent stays mapped, so both cases zero the physical range.
            if deallocate {
                self.issue(ri, phys_off, 0, n, |offset, _, len| IoOp::Deallocate {
                    offset,
                    len,
                });
            } else {
                self.issue(ri, phys_off, 0, n, |offset, _, len| IoOp::WriteZeroes {
                    offset,
                    len,
                });
            }
        }
        self.settle(ri);
    }

    fn retry_stalled(&mut self) {
        let space = self.notify.space.swap(false, Ordering::AcqRel);
        let due = self.stalled_at.is_some_and(|t| t.elapsed() >= STALL_RETRY);
        if self.stalled.is_empty() || !(space || due) {
            return;
        }
        self.stalled_at = None;
        let n = self.stalled.len();
        for _ in 0..n {
            let Some((tag, op)) = self.stalled.pop_front() else {
                break;
            };
            self.start(tag, op);
        }
    }

    fn start(&mut self, tag: u64, op: IoOp) {
        if self.vol.deleted.load(Ordering::Acquire) {
            return self.complete_now(tag, Err(libc::ENXIO), op.into_buf());
        }
        match op {
            IoOp::Read { offset, buf } => self.start_read(tag, offset, buf),
            IoOp::Write { offset, buf, fua } => self.start_write(tag, offset, buf, fua),
            IoOp::WriteZeroes { offset, len } => self.start_zeroes(tag, offset, len, false),
            IoOp::Deallocate { offset, len } => self.start_zeroes(tag, offset, len, true),
            IoOp::Flush => {
                let ri = self.new_req(tag, Kind::Flush, None);
                self.pool.request_commit(ri as u64, self.notify.clone());
            }
        }
    }
}

impl IoChannel for VolumeChannel {
    fn submit(&mut self, tag: u64, op: IoOp) -> Result<(), (IoOp, i32)> {
        self.start(tag, op);
        self.pump_large();
        Ok(())
    }

    fn flush_submissions(&mut self) {
        self.base.flush_submissions();
    }

    fn poll(&mut self, out: &mut Vec<IoCompletion>) -> usize {
        self.notify.clear();
        let mut scratch = std::mem::take(&mut self.scratch);
        self.base.poll(&mut scratch);
        for c in scratch.drain(..) {
            let ri = (c.tag >> 1) as u32;
            if c.tag & 1 != 0 {
                self.large_inflight = self.large_inflight.saturating_sub(1);
            }
            drop(c.buf); // a view: the parent stays with the request
            if let Some(r) = self.reqs.get_mut(ri as usize).and_then(|r| r.as_mut()) {
                r.pending = r.pending.saturating_sub(1);
                if let Err(e) = c.result {
                    r.err.get_or_insert(e);
                }
            }
            self.settle(ri);
        }
        self.scratch = scratch;
        while let Some((ri, res)) = self.notify.committed.pop() {
            let ri = ri as u32;
            if let Err(e) = res {
                self.fail(ri, e);
            }
            self.release(ri);
        }
        self.pump_large();
        self.retry_stalled();
        self.base.flush_submissions();
        let n = self.done.len();
        out.append(&mut self.done);
        n
    }

    fn in_flight(&self) -> usize {
        self.active + self.stalled.len() + self.done.len()
    }

    fn completion_fd(&self) -> Option<RawFd> {
        self.base.completion_fd()
    }

    fn notify_fd(&self) -> Option<RawFd> {
        self.notify.efd.as_ref().map(|e| e.raw())
    }
}
