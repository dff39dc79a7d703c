//! Volumes as block devices: `VolumeDevice` is what a namespace serves, and
//! `PoolChannel` is one reactor's path to every volume of a pool: one channel
//! (one device queue: one NVMe hardware queue on the `nvme` backend) per
//! (reactor, pool device), shared by all the pool's volumes, each reached
//! through a lane (`IoChannel::submit_lane`, the lane being the volume id). A
//! channel turns logical I/O into physical extent I/O on that device queue:
//! mapping on first write, zeros (or the unwritten-block error) for unmapped
//! ranges, valid-block bitmaps, dual-path scheduling of large transfers (at
//! the shared queue, so the bound on large pieces holds across volumes), and
//! Flush/FUA through the metadata thread's group commit.

use super::volume::{AllocError, BlockRun, Piece, Volume};
use super::{Notifier, Pool};
use kvt_bdev::{
    BlockDevice, IoChannel, IoCompletion, IoOp, ThinInfo, ERRNO_NO_SPACE, ERRNO_UNWRITTEN,
};
use kvt_mem::IoBuf;
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
        // Opened for one volume, used by all of the pool's (`shared_channel`).
        Ok(Box::new(PoolChannel::new(self.pool.clone())?))
    }
    fn shared_channel(&self) -> Option<(u64, u32)> {
        Some((self.pool.channel_key, self.vol.desc.id))
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
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
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
    /// The lane (index into `PoolChannel::lanes`) of the volume it is for.
    lane: u32,
    /// Bytes the command covers (for the I/O counters).
    bytes: u64,
    deallocate: bool,
    /// The caller's buffer; device operations use views into it.
    buf: Option<IoBuf>,
    pending: u32,
    err: Option<i32>,
    lists: ReqLists,
    start: Instant,
}

/// One extent's part of a command, as `map_range` gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct MappedPiece {
    /// Logical extent of the volume.
    lext: u32,
    /// Physical extent of the pool it maps to.
    phys: u32,
    /// Byte offset of the piece inside the extent.
    offset_bytes: u64,
    len_bytes: u64,
}

/// A range of a request's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct BufRange {
    at: usize,
    len: usize,
}

/// One device operation of a command, as planned before it is issued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DeviceOp {
    /// Byte offset on the pool device.
    phys_offset: u64,
    /// Where its data sits in the command's buffer (0 without a buffer).
    buf_offset: usize,
    len: u64,
}

/// A write waiting for clean extents: it holds no request yet.
struct StalledWrite {
    lane: u32,
    tag: u64,
    op: IoOp,
}

/// A piece of a large transfer of request `req`, waiting for its turn on
/// the device (dual path).
struct LargePiece {
    req: u32,
    op: IoOp,
}

/// A request's lists, recycled through `Engine::spare` with their capacity,
/// so a command on mapped extents allocates nothing once the channel is warm.
#[derive(Default)]
struct ReqLists {
    /// Logical extents pinned by the command.
    pinned: Vec<u32>,
    /// Extents whose last valid block went: unmapped once unpinned.
    emptied: Vec<u32>,
    /// Buffer ranges of blocks not valid in a mapped extent:
    /// zeroed once the device read is done, because the bitmap, not the
    /// device, says what a block holds (after a crash, data of an unflushed
    /// write may sit in blocks the bitmap does not count).
    zero_after: Vec<BufRange>,
    /// Pieces the command makes valid once its data is on the device:
    /// marked at completion, never before, so no metadata commit can journal
    /// a block as written while its data is in flight (after a crash it
    /// would read back whatever the block held before).
    valid_after: Vec<MappedPiece>,
}

impl ReqLists {
    fn with_capacity(pieces: usize) -> ReqLists {
        ReqLists {
            pinned: Vec::with_capacity(pieces),
            emptied: Vec::with_capacity(pieces),
            zero_after: Vec::with_capacity(pieces),
            valid_after: Vec::with_capacity(pieces),
        }
    }
    fn clear(&mut self) {
        self.pinned.clear();
        self.emptied.clear();
        self.zero_after.clear();
        self.valid_after.clear();
    }
}

/// Requests a channel holds room for from its creation (slots, recycled
/// lists, completions): a reactor's queues rarely keep more in flight on one
/// pool. More is served too, growing the channel's vectors once (the
/// capacity is kept).
const REQS_AT_START: usize = 128;
/// Extents one command's lists hold room for from creation: 8 covers a 512
/// KiB command on the smallest (64 KiB) extents, or two pieces of a command
/// that crosses one extent boundary with room to spare. Longer commands grow
/// a list once.
const PIECES_PER_REQ: usize = 8;
/// Device operations a command's pieces may make at once without growing
/// the plan: one per extent piece (`PIECES_PER_REQ`), for several commands'
/// worth of large pieces waiting in `Engine::large`.
const PLAN_PIECES: usize = 64;

/// How long a write waiting for clean extents waits before retrying anyway.
const STALL_RETRY: Duration = Duration::from_millis(20);

/// One volume as this channel sees it.
struct Lane {
    vol: Arc<Volume>,
    stats: Arc<crate::volume::ChannelStats>,
    /// Requests of this lane not yet completed (a lane is released only idle).
    active: std::cell::Cell<u32>,
}

fn lane_at(lanes: &[Option<Lane>], i: u32) -> Option<&Lane> {
    lanes.get(i as usize).and_then(|l| l.as_ref())
}

/// One reactor's channel to a pool: every volume's I/O goes through the one
/// device queue `base`.
pub struct PoolChannel {
    /// Volumes served here, by index: requests name theirs by it. Indices are
    /// not reused: a volume deleted and replaced under the same id gets a new
    /// lane while the old one's requests finish, and a released lane (its
    /// namespace removed) leaves `None`, so this channel holds no volume
    /// nothing serves (a volume in use cannot be deleted).
    lanes: Vec<Option<Lane>>,
    /// Volume id -> lane.
    by_id: Vec<Option<u32>>,
    /// The lane plain `submit` uses (`for_volume`).
    default_lane: Option<u32>,
    io: Engine,
}

/// A one-volume channel (the pool simulation's, and tools'): a pool channel
/// whose plain `submit` goes to that volume.
pub type VolumeChannel = PoolChannel;

/// Everything of a pool channel but its lanes, so its methods can borrow a
/// lane's volume while changing the rest.
struct Engine {
    pool: Arc<Pool>,
    base: Box<dyn IoChannel>,
    notify: Arc<Notifier>,
    reqs: Vec<Option<Req>>,
    free: Vec<u32>,
    active: usize,
    done: Vec<IoCompletion>,
    stalled: VecDeque<StalledWrite>,
    stalled_at: Option<Instant>,
    large: VecDeque<LargePiece>,
    large_inflight: usize,
    scratch: Vec<IoCompletion>,
    reactor: usize,
    /// Request lists of released requests, cleared, for the next ones.
    spare: Vec<ReqLists>,
    /// One command's device operations, built before they are issued;
    /// emptied after each command.
    plan: Vec<DeviceOp>,
    /// Invalid block runs of one extent, for a read.
    runs: Vec<BlockRun>,
}

impl PoolChannel {
    pub fn new(pool: Arc<Pool>) -> std::io::Result<PoolChannel> {
        let base = pool.device().open_channel()?;
        let notify = Arc::new(Notifier::new());
        pool.register_waiter(&notify);
        Ok(PoolChannel {
            lanes: Vec::new(),
            by_id: Vec::new(),
            default_lane: None,
            io: Engine {
                reactor: kvt_reactor::current_reactor(),
                pool,
                base,
                notify,
                reqs: Vec::with_capacity(REQS_AT_START),
                free: Vec::with_capacity(REQS_AT_START),
                active: 0,
                done: Vec::with_capacity(REQS_AT_START),
                stalled: VecDeque::new(),
                stalled_at: None,
                large: VecDeque::with_capacity(PLAN_PIECES),
                large_inflight: 0,
                scratch: Vec::with_capacity(REQS_AT_START),
                spare: (0..REQS_AT_START)
                    .map(|_| ReqLists::with_capacity(PIECES_PER_REQ))
                    .collect(),
                plan: Vec::with_capacity(PLAN_PIECES),
                runs: Vec::with_capacity(PLAN_PIECES),
            },
        })
    }

    /// A channel as reactor `reactor` opens it (the simulation runs several
    /// reactors' channels on one thread).
    pub fn on_reactor(pool: Arc<Pool>, reactor: usize) -> std::io::Result<PoolChannel> {
        let mut ch = PoolChannel::new(pool)?;
        ch.io.reactor = reactor;
        Ok(ch)
    }

    /// A channel whose plain `submit` goes to `vol`.
    pub fn for_volume(pool: Arc<Pool>, vol: Arc<Volume>) -> std::io::Result<PoolChannel> {
        let mut ch = PoolChannel::new(pool)?;
        let id = vol.desc.id;
        ch.default_lane = Some(ch.add_lane(vol));
        if let Some(l) = ch.default_lane {
            ch.set_lane(id, l);
        }
        Ok(ch)
    }

    fn add_lane(&mut self, vol: Arc<Volume>) -> u32 {
        self.lanes.push(Some(Lane {
            stats: vol.new_channel_stats(),
            vol,
            active: std::cell::Cell::new(0),
        }));
        (self.lanes.len() - 1) as u32
    }

    fn set_lane(&mut self, id: u32, lane: u32) {
        let i = id as usize;
        if self.by_id.len() <= i {
            self.by_id.resize(i + 1, None);
        }
        self.by_id[i] = Some(lane);
    }

    /// The lane of volume `id`, looked up in the pool on first use (and again
    /// after the volume it had was deleted, in case the id now names another).
    fn lane_of(&mut self, id: u32) -> Option<u32> {
        let known = self.by_id.get(id as usize).copied().flatten();
        if let Some(l) = known {
            let live =
                lane_at(&self.lanes, l).is_some_and(|x| !x.vol.deleted.load(Ordering::Acquire));
            if live {
                return Some(l);
            }
        }
        let vol = self.io.pool.volume_by_id(id)?;
        if let Some(l) = known {
            if lane_at(&self.lanes, l).is_some_and(|x| Arc::ptr_eq(&x.vol, &vol)) {
                return Some(l);
            }
        }
        let l = self.add_lane(vol);
        self.set_lane(id, l);
        Some(l)
    }
}

impl Engine {
    // One command's pieces, passed as scalars on the I/O path.
    #[allow(clippy::too_many_arguments)]
    fn new_req(
        &mut self,
        lanes: &[Option<Lane>],
        lane: u32,
        tag: u64,
        kind: Kind,
        buf: Option<IoBuf>,
        lists: ReqLists,
        now: Instant,
    ) -> u32 {
        let r = Req {
            tag,
            kind,
            lane,
            bytes: buf.as_ref().map_or(0, |b| b.len() as u64),
            deallocate: false,
            buf,
            pending: 0,
            err: None,
            lists,
            start: now,
        };
        self.active += 1;
        if let Some(l) = lane_at(lanes, lane) {
            l.active.set(l.active.get() + 1);
            if kind != Kind::Flush {
                l.stats.inflight.fetch_add(1, Ordering::Relaxed);
            }
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

    /// Cleared lists for a new request: recycled, or new when more requests
    /// are in flight than ever before on this channel.
    fn take_lists(&mut self) -> ReqLists {
        self.spare
            .pop()
            .unwrap_or_else(|| ReqLists::with_capacity(PIECES_PER_REQ))
    }

    fn complete_now(&mut self, tag: u64, result: Result<(), i32>, buf: Option<IoBuf>) {
        self.done.push(IoCompletion { tag, result, buf });
    }

    /// Every device operation of request `ri` is done.
    fn finish(&mut self, lanes: &[Option<Lane>], ri: u32, now: Instant) {
        let Some(r) = self.reqs.get_mut(ri as usize).and_then(|r| r.as_mut()) else {
            return;
        };
        let Some(lane) = lane_at(lanes, r.lane) else {
            // `release_lane` keeps a lane while it has requests.
            debug_assert!(false, "request {ri} of released lane {}", r.lane);
            return;
        };
        let vol = &lane.vol;
        // Valid before unpinning, so the extent cannot be unmapped as empty.
        if r.err.is_none() {
            let bs = vol.desc.block_size as u64;
            for m in &r.lists.valid_after {
                vol.set_valid(
                    m.lext,
                    (m.offset_bytes / bs) as u32,
                    (m.len_bytes / bs) as u32,
                );
            }
        }
        r.lists.valid_after.clear();
        for &lext in &r.lists.pinned {
            vol.unpin(lext);
        }
        r.lists.pinned.clear();
        for &lext in &r.lists.emptied {
            match vol.try_unmap_empty(lext) {
                Ok(Some(p)) => self.pool.extent_freed(p),
                Ok(None) => {}
                Err(()) => self.pool.retry_unmap(vol.desc.id, lext),
            }
        }
        r.lists.emptied.clear();
        if let Some(buf) = r.buf.as_mut() {
            for z in &r.lists.zero_after {
                if let Some(s) = buf.get_mut(z.at..z.at + z.len) {
                    s.fill(0);
                }
            }
        }
        if r.kind == (Kind::Write { fua: true }) && r.err.is_none() {
            // Durable data and metadata before the acknowledgement.
            r.kind = Kind::Flush;
            lane.stats.inflight.fetch_sub(1, Ordering::Relaxed);
            self.pool.request_commit(ri as u64, self.notify.clone());
            return;
        }
        self.release(lanes, ri, now);
    }

    fn release(&mut self, lanes: &[Option<Lane>], ri: u32, now: Instant) {
        let Some(r) = self.reqs.get_mut(ri as usize).and_then(|r| r.take()) else {
            debug_assert!(false, "request {ri} released twice");
            return;
        };
        if let Some(l) = lane_at(lanes, r.lane) {
            debug_assert!(l.active.get() > 0, "lane {} count", r.lane);
            l.active.set(l.active.get() - 1);
        }
        self.free.push(ri);
        self.active -= 1;
        let mut lists = r.lists;
        lists.clear();
        self.spare.push(lists);
        if let Some(st) = lane_at(lanes, r.lane).map(|l| &l.stats) {
            let ns = now.saturating_duration_since(r.start).as_nanos() as u64;
            if r.kind != Kind::Flush {
                st.inflight.fetch_sub(1, Ordering::Relaxed);
            }
            if r.err.is_some() {
                st.errors.fetch_add(1, Ordering::Relaxed);
            } else if r.kind == Kind::Flush {
                st.flushes.fetch_add(1, Ordering::Relaxed);
            } else {
                let b = kvt_mem::stats::latency_bucket(ns);
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

    /// Queues device operation `d` of request `ri` (its buffer range, or no
    /// buffer), splitting large transfers into pieces.
    fn issue(
        &mut self,
        ri: u32,
        d: DeviceOp,
        make: fn(u64, Option<IoBuf>, u64) -> IoOp,
        now: Instant,
    ) {
        let DeviceOp {
            phys_offset: phys_off,
            buf_offset: at,
            len,
        } = d;
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
                self.large.push_back(LargePiece { req: ri, op });
            } else {
                self.submit_base(ri, op, false, now);
            }
            done += n;
        }
    }

    fn submit_base(&mut self, ri: u32, op: IoOp, large: bool, now: Instant) {
        let tag = (ri as u64) << 1 | large as u64;
        if let Err((_, errno)) = self.base.submit(tag, op, now) {
            if let Some(r) = self.reqs.get_mut(ri as usize).and_then(|r| r.as_mut()) {
                r.err.get_or_insert(errno);
                // Counted by `issue` before it submitted.
                assert!(r.pending > 0, "request {ri}: operation refused twice");
                r.pending -= 1;
            }
        } else if large {
            self.large_inflight += 1;
        }
    }

    fn pump_large(&mut self, now: Instant) {
        let max = self.pool.opts.dual_path.max_inflight.max(1);
        while self.large_inflight < max {
            let Some(p) = self.large.pop_front() else {
                break;
            };
            self.submit_base(p.req, p.op, true, now);
        }
    }

    fn settle(&mut self, lanes: &[Option<Lane>], ri: u32, now: Instant) {
        let pending = self
            .reqs
            .get(ri as usize)
            .and_then(|r| r.as_ref())
            .map(|r| r.pending);
        if pending == Some(0) {
            self.finish(lanes, ri, now);
        }
    }

    fn check_range(vol: &Volume, offset: u64, len: u64) -> bool {
        let bs = vol.desc.block_size as u64;
        offset % bs == 0
            && len % bs == 0
            && offset
                .checked_add(len)
                .is_some_and(|e| e <= vol.desc.size_bytes)
    }

    fn start_read(
        &mut self,
        lanes: &[Option<Lane>],
        lane: u32,
        tag: u64,
        offset: u64,
        mut buf: IoBuf,
        now: Instant,
    ) {
        let Some(vol) = lane_at(lanes, lane).map(|l| &l.vol) else {
            return self.complete_now(tag, Err(libc::ENXIO), Some(buf));
        };
        let len = buf.len() as u64;
        if !Self::check_range(vol, offset, len) {
            return self.complete_now(tag, Err(libc::EINVAL), Some(buf));
        }
        let mut lists = self.take_lists();
        let mut plan = std::mem::take(&mut self.plan);
        let err = self.plan_read(vol, offset, &mut buf, &mut lists, &mut plan);
        let ri = self.new_req(lanes, lane, tag, Kind::Read, Some(buf), lists, now);
        if let Some(r) = self.reqs.get_mut(ri as usize).and_then(|r| r.as_mut()) {
            r.err = err;
        }
        if err.is_none() {
            for &d in &plan {
                self.issue(
                    ri,
                    d,
                    |offset, buf, _| IoOp::Read {
                        offset,
                        buf: buf.unwrap_or_else(|| IoBuf::new(0)),
                    },
                    now,
                );
            }
        }
        plan.clear();
        self.plan = plan;
        self.settle(lanes, ri, now);
    }

    /// Pins a read's mapped extents and plans their device reads; fills the
    /// unmapped and never-written parts of `buf` with zeros, or returns the
    /// unwritten-block error for a volume that reports them.
    fn plan_read(
        &mut self,
        vol: &Volume,
        offset: u64,
        buf: &mut IoBuf,
        lists: &mut ReqLists,
        plan: &mut Vec<DeviceOp>,
    ) -> Option<i32> {
        let bs = vol.desc.block_size as u64;
        let mut runs = std::mem::take(&mut self.runs);
        let mut err = None;
        for Piece {
            lext,
            offset: off,
            len: n,
        } in vol.pieces(offset, buf.len() as u64)
        {
            let at = ((lext as u64) * vol.extent_size() + off - offset) as usize;
            let Some(phys) = vol.pin(lext) else {
                if vol.unwritten_error() {
                    err = Some(ERRNO_UNWRITTEN);
                    break;
                }
                buf[at..at + n as usize].fill(0);
                continue;
            };
            let (first, nb) = ((off / bs) as u32, (n / bs) as u32);
            runs.clear();
            vol.invalid_runs(lext, first, nb, &mut runs);
            if !runs.is_empty() && vol.unwritten_error() {
                vol.unpin(lext);
                err = Some(ERRNO_UNWRITTEN);
                break;
            }
            if runs.len() == 1 && runs[0] == (BlockRun { first, count: nb }) {
                // Nothing valid here: zeros without device I/O.
                vol.unpin(lext);
                buf[at..at + n as usize].fill(0);
                continue;
            }
            lists.pinned.push(lext);
            for r in &runs {
                lists.zero_after.push(BufRange {
                    at: at + ((r.first - first) as u64 * bs) as usize,
                    len: (r.count as u64 * bs) as usize,
                });
            }
            plan.push(DeviceOp {
                phys_offset: self.pool.sb.extent_offset(phys) + off,
                buf_offset: at,
                len: n,
            });
        }
        runs.clear();
        self.runs = runs;
        err
    }

    /// Maps and pins every extent of a write into `got`. On `Wait` the
    /// extents mapped so far stay mapped (the retry finds them, so progress
    /// is monotonic); on failure the range's extents with nothing valid in
    /// them are given back.
    fn map_range(
        &mut self,
        vol: &Volume,
        offset: u64,
        len: u64,
        got: &mut Vec<MappedPiece>,
    ) -> Result<(), AllocError> {
        got.clear();
        for Piece {
            lext,
            offset: off,
            len: n,
        } in vol.pieces(offset, len)
        {
            let (pool, reactor) = (&self.pool, self.reactor);
            match vol.pin_or_map(
                lext,
                || pool.take_extent(reactor),
                |c| pool.return_extent(reactor, c),
            ) {
                Ok((phys, _)) => got.push(MappedPiece {
                    lext,
                    phys,
                    offset_bytes: off,
                    len_bytes: n,
                }),
                Err(e) => {
                    for m in got.drain(..) {
                        vol.unpin(m.lext);
                    }
                    if e != AllocError::Wait {
                        for p in vol.pieces(offset, len) {
                            match vol.try_unmap_empty(p.lext) {
                                Ok(Some(p)) => self.pool.extent_freed(p),
                                Ok(None) => {}
                                Err(()) => self.pool.retry_unmap(vol.desc.id, p.lext),
                            }
                        }
                    }
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    fn stall(&mut self, lane: u32, tag: u64, op: IoOp, now: Instant) {
        if self.stalled.is_empty() {
            self.stalled_at = Some(now);
        }
        self.stalled.push_back(StalledWrite { lane, tag, op });
    }

    /// Maps (or pins) a write's extents into `lists`; on failure the lists
    /// go back to the spares and the command's answer is returned.
    fn map_write(
        &mut self,
        vol: &Volume,
        offset: u64,
        len: u64,
        lists: &mut ReqLists,
    ) -> Result<(), AllocError> {
        let r = self.map_range(vol, offset, len, &mut lists.valid_after);
        if r.is_ok() {
            lists
                .pinned
                .extend(lists.valid_after.iter().map(|m| m.lext));
        }
        r
    }

    // One command's pieces, passed as scalars on the I/O path.
    #[allow(clippy::too_many_arguments)]
    fn start_write(
        &mut self,
        lanes: &[Option<Lane>],
        lane: u32,
        tag: u64,
        offset: u64,
        buf: IoBuf,
        fua: bool,
        now: Instant,
    ) {
        let Some(vol) = lane_at(lanes, lane).map(|l| &l.vol) else {
            return self.complete_now(tag, Err(libc::ENXIO), Some(buf));
        };
        let len = buf.len() as u64;
        if !Self::check_range(vol, offset, len) {
            return self.complete_now(tag, Err(libc::EINVAL), Some(buf));
        }
        let mut lists = self.take_lists();
        if let Err(e) = self.map_write(vol, offset, len, &mut lists) {
            lists.clear();
            self.spare.push(lists);
            return match e {
                AllocError::Wait => self.stall(lane, tag, IoOp::Write { offset, buf, fua }, now),
                AllocError::NoSpace => self.complete_now(tag, Err(ERRNO_NO_SPACE), Some(buf)),
                AllocError::Failed => self.complete_now(tag, Err(libc::EIO), Some(buf)),
            };
        }
        let mut plan = std::mem::take(&mut self.plan);
        for m in &lists.valid_after {
            let at = ((m.lext as u64) * vol.extent_size() + m.offset_bytes - offset) as usize;
            plan.push(DeviceOp {
                phys_offset: self.pool.sb.extent_offset(m.phys) + m.offset_bytes,
                buf_offset: at,
                len: m.len_bytes,
            });
        }
        let ri = self.new_req(lanes, lane, tag, Kind::Write { fua }, Some(buf), lists, now);
        for &d in &plan {
            self.issue(
                ri,
                d,
                |offset, buf, _| IoOp::Write {
                    offset,
                    buf: buf.unwrap_or_else(|| IoBuf::new(0)),
                    fua: false,
                },
                now,
            );
        }
        plan.clear();
        self.plan = plan;
        self.settle(lanes, ri, now);
    }

    /// Plans the device writes of a Write Zeroes whose blocks become valid
    /// (`lists.valid_after`, mapped by `map_write`).
    fn plan_written_zeroes(&self, lists: &ReqLists, plan: &mut Vec<DeviceOp>) {
        for m in &lists.valid_after {
            plan.push(DeviceOp {
                phys_offset: self.pool.sb.extent_offset(m.phys) + m.offset_bytes,
                buf_offset: 0,
                len: m.len_bytes,
            });
        }
    }

    /// Pins the mapped extents of a Deallocate, or of a Write Zeroes where
    /// unwritten blocks already read as zeros (only they need device work),
    /// and plans their device operations.
    fn plan_zeroes_mapped(
        &self,
        vol: &Volume,
        offset: u64,
        len: u64,
        deallocate: bool,
        lists: &mut ReqLists,
        plan: &mut Vec<DeviceOp>,
    ) {
        let bs = vol.desc.block_size as u64;
        for Piece {
            lext,
            offset: off,
            len: n,
        } in vol.pieces(offset, len)
        {
            let Some(phys) = vol.pin(lext) else {
                continue;
            };
            lists.pinned.push(lext);
            let (first, nb) = ((off / bs) as u32, (n / bs) as u32);
            if deallocate {
                if vol.clear_valid(lext, first, nb) {
                    lists.emptied.push(lext);
                }
            } else {
                lists.valid_after.push(MappedPiece {
                    lext,
                    phys,
                    offset_bytes: off,
                    len_bytes: n,
                });
            }
            plan.push(DeviceOp {
                phys_offset: self.pool.sb.extent_offset(phys) + off,
                buf_offset: 0,
                len: n,
            });
        }
    }

    // One command's pieces, passed as scalars on the I/O path.
    #[allow(clippy::too_many_arguments)]
    fn start_zeroes(
        &mut self,
        lanes: &[Option<Lane>],
        lane: u32,
        tag: u64,
        offset: u64,
        len: u64,
        deallocate: bool,
        now: Instant,
    ) {
        let Some(vol) = lane_at(lanes, lane).map(|l| &l.vol) else {
            return self.complete_now(tag, Err(libc::ENXIO), None);
        };
        if !Self::check_range(vol, offset, len) {
            return self.complete_now(tag, Err(libc::EINVAL), None);
        }
        let mut lists = self.take_lists();
        let mut plan = std::mem::take(&mut self.plan);
        if deallocate || !vol.unwritten_error() {
            self.plan_zeroes_mapped(vol, offset, len, deallocate, &mut lists, &mut plan);
        } else {
            // Write Zeroes on a volume that reports unwritten blocks: the zeros
            // are data, so the blocks become valid (mapping if needed).
            if let Err(e) = self.map_write(vol, offset, len, &mut lists) {
                lists.clear();
                self.spare.push(lists);
                self.plan = plan;
                return match e {
                    AllocError::Wait => {
                        self.stall(lane, tag, IoOp::WriteZeroes { offset, len }, now)
                    }
                    AllocError::NoSpace => self.complete_now(tag, Err(ERRNO_NO_SPACE), None),
                    AllocError::Failed => self.complete_now(tag, Err(libc::EIO), None),
                };
            }
            self.plan_written_zeroes(&lists, &mut plan);
        }
        let ri = self.new_req(lanes, lane, tag, Kind::Zeroes, None, lists, now);
        if let Some(r) = self.reqs.get_mut(ri as usize).and_then(|r| r.as_mut()) {
            r.bytes = len;
            r.deallocate = deallocate;
        }
        for &d in &plan {
            // Deallocated blocks must read back as zeros (DLFEAT) even while the
            // extent stays mapped, so both cases zero the physical range.
            if deallocate {
                self.issue(
                    ri,
                    d,
                    |offset, _, len| IoOp::Deallocate { offset, len },
                    now,
                );
            } else {
                self.issue(
                    ri,
                    d,
                    |offset, _, len| IoOp::WriteZeroes { offset, len },
                    now,
                );
            }
        }
        plan.clear();
        self.plan = plan;
        self.settle(lanes, ri, now);
    }

    fn retry_stalled(&mut self, lanes: &[Option<Lane>], now: Instant) {
        let space = self.notify.space.swap(false, Ordering::AcqRel);
        let due = self
            .stalled_at
            .is_some_and(|t| now.saturating_duration_since(t) >= STALL_RETRY);
        if self.stalled.is_empty() || !(space || due) {
            return;
        }
        self.stalled_at = None;
        let n = self.stalled.len();
        for _ in 0..n {
            let Some(w) = self.stalled.pop_front() else {
                break;
            };
            self.start(lanes, w.lane, w.tag, w.op, now);
        }
    }

    fn start(&mut self, lanes: &[Option<Lane>], lane: u32, tag: u64, op: IoOp, now: Instant) {
        let live = lane_at(lanes, lane).is_some_and(|l| !l.vol.deleted.load(Ordering::Acquire));
        if !live {
            return self.complete_now(tag, Err(libc::ENXIO), op.into_buf());
        }
        match op {
            IoOp::Read { offset, buf } => self.start_read(lanes, lane, tag, offset, buf, now),
            IoOp::Write { offset, buf, fua } => {
                self.start_write(lanes, lane, tag, offset, buf, fua, now)
            }
            IoOp::WriteZeroes { offset, len } => {
                self.start_zeroes(lanes, lane, tag, offset, len, false, now)
            }
            IoOp::Deallocate { offset, len } => {
                self.start_zeroes(lanes, lane, tag, offset, len, true, now)
            }
            IoOp::Flush => {
                let lists = self.take_lists();
                let ri = self.new_req(lanes, lane, tag, Kind::Flush, None, lists, now);
                self.pool.request_commit(ri as u64, self.notify.clone());
            }
        }
    }

    /// Completions from the device and the metadata thread, then whatever
    /// waited for them (large pieces, stalled writes).
    fn poll(&mut self, lanes: &[Option<Lane>], out: &mut Vec<IoCompletion>, now: Instant) -> usize {
        self.notify.clear();
        let mut scratch = std::mem::take(&mut self.scratch);
        self.base.poll(&mut scratch, now);
        for c in scratch.drain(..) {
            let ri = (c.tag >> 1) as u32;
            if c.tag & 1 != 0 {
                // Counted at submission; a refused submission completes nothing.
                assert!(self.large_inflight > 0, "a large piece completed twice");
                self.large_inflight -= 1;
            }
            drop(c.buf); // a view: the parent stays with the request
                         // A request stays in its slot until its last operation completes.
            let Some(r) = self.reqs.get_mut(ri as usize).and_then(|r| r.as_mut()) else {
                panic!("device completion for request {ri}, which is not in flight");
            };
            assert!(
                r.pending > 0,
                "request {ri}: more completions than operations"
            );
            r.pending -= 1;
            if let Err(e) = c.result {
                r.err.get_or_insert(e);
            }
            self.settle(lanes, ri, now);
        }
        self.scratch = scratch;
        while let Some((ri, res)) = self.notify.committed.pop() {
            let ri = ri as u32;
            if let Err(e) = res {
                self.fail(ri, e);
            }
            self.release(lanes, ri, now);
        }
        self.pump_large(now);
        self.retry_stalled(lanes, now);
        self.base.flush_submissions();
        let n = self.done.len();
        out.append(&mut self.done);
        n
    }
}

impl IoChannel for PoolChannel {
    /// Plain submissions go to the channel's own volume (`for_volume`).
    fn submit(&mut self, tag: u64, op: IoOp, now: Instant) -> Result<(), (IoOp, i32)> {
        match self.default_lane {
            Some(l) => {
                self.io.start(&self.lanes, l, tag, op, now);
                self.io.pump_large(now);
                Ok(())
            }
            None => Err((op, libc::EINVAL)),
        }
    }

    fn submit_lane(
        &mut self,
        lane: u32,
        tag: u64,
        op: IoOp,
        now: Instant,
    ) -> Result<(), (IoOp, i32)> {
        match self.lane_of(lane) {
            Some(l) => self.io.start(&self.lanes, l, tag, op, now),
            // The volume is gone: the command fails like one on a deleted volume.
            None => self.io.complete_now(tag, Err(libc::ENXIO), op.into_buf()),
        }
        self.io.pump_large(now);
        Ok(())
    }

    fn release_lane(&mut self, id: u32) -> bool {
        let Some(l) = self.by_id.get(id as usize).copied().flatten() else {
            return true;
        };
        // Stalled writes hold no request yet but are the lane's too.
        let stalled = self.io.stalled.iter().any(|w| w.lane == l);
        let busy = stalled || lane_at(&self.lanes, l).is_some_and(|x| x.active.get() > 0);
        if busy || self.default_lane == Some(l) {
            return false;
        }
        self.by_id[id as usize] = None;
        if let Some(x) = self.lanes.get_mut(l as usize) {
            *x = None;
        }
        true
    }

    fn flush_submissions(&mut self) {
        self.io.base.flush_submissions();
    }

    fn poll(&mut self, out: &mut Vec<IoCompletion>, now: Instant) -> usize {
        self.io.poll(&self.lanes, out, now)
    }

    fn in_flight(&self) -> usize {
        self.io.active + self.io.stalled.len() + self.io.done.len()
    }

    fn completion_fd(&self) -> Option<RawFd> {
        self.io.base.completion_fd()
    }

    fn notify_fd(&self) -> Option<RawFd> {
        self.io.notify.efd.as_ref().map(|e| e.raw())
    }
}
