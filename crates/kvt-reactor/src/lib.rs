//! Reactors: one pinned thread per configured core that owns queue pairs and device
//! channels and polls them.
//!
//! Loop: drain the inbox (bounded lock-free ring), poll sockets (epoll, zero
//! timeout while busy), poll device completions, run ready async tasks, fire timers,
//! flush socket writes. In `busy` mode it never sleeps; in `adaptive` mode it sleeps
//! in epoll after a run of empty polls, woken by sockets, device completion fds,
//! shared pollers' fds, the inbox eventfd, or the next timer.
//!
//! Shared pollers: a transport may give a reactor one completion source that
//! many of its queue pairs share (an RDMA completion queue). The reactor polls
//! each once per pass and routes every event to the queue pair that named
//! (poller, key) in `QueuePair::route` when it was adopted; the event's type is
//! the transport's own, carried as `&dyn Any`.

pub mod signals;
pub mod stall;
pub mod sys;

use crossbeam_queue::{ArrayQueue, SegQueue};
use kvt_bdev::{IoChannel, IoCompletion, IoOp};
use kvt_mem::{BufPool, IoBuf};
use stall::{StallStats, StallWarner};
use std::any::Any;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::future::Future;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use sys::{Epoll, EventFd, EPOLLIN, EPOLLOUT, EPOLLRDHUP};

/// Reactor idle policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IdleMode {
    /// Spin forever: lowest latency, burns the core.
    Busy,
    /// Spin while there is work, then sleep in epoll.
    Adaptive,
}

/// Keeps the control plane (the calling thread and every thread it starts
/// from now on: RPC, metrics, the acceptor, the cluster, pool workers) off
/// the cores the reactors are pinned to, when the process may run on another
/// core: a busy-polling reactor that its own process's housekeeping preempts
/// stalls every queue it owns. Returns the cores the control plane keeps to;
/// `None` when nothing changed (no reactor pinned, or no core left over).
pub fn keep_control_plane_off(reactor_cores: &[Option<usize>]) -> Option<Vec<usize>> {
    let pinned: Vec<usize> = reactor_cores.iter().flatten().copied().collect();
    if pinned.is_empty() {
        return None;
    }
    let allowed = match sys::allowed_cores() {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!("cannot read the process's cores ({e}): control plane not moved");
            return None;
        }
    };
    let rest = control_plane_cores(&allowed, &pinned)?;
    if let Err(e) = sys::set_allowed_cores(&rest) {
        tracing::warn!("cannot move the control plane off the reactors' cores: {e}");
        return None;
    }
    Some(rest)
}

/// The allowed cores no reactor is pinned to, when that leaves some and
/// excludes some.
fn control_plane_cores(allowed: &[usize], pinned: &[usize]) -> Option<Vec<usize>> {
    let rest: Vec<usize> = allowed
        .iter()
        .copied()
        .filter(|c| !pinned.contains(c))
        .collect();
    (!rest.is_empty() && rest.len() < allowed.len()).then_some(rest)
}

/// Empty polls before an adaptive reactor goes to sleep.
const SPIN_BEFORE_SLEEP: u32 = 2000;
/// Longest sleep, so housekeeping still runs on an idle reactor.
const MAX_SLEEP_MS: i32 = 100;
/// How often queue pairs get housekeeping (keep-alive checks, teardown).
const HOUSEKEEPING_EVERY: Duration = Duration::from_millis(100);
/// Inbox capacity per reactor: a full inbox is back-pressure for the sender.
pub const INBOX_CAPACITY: usize = 4096;
/// I/O buffer memory committed and faulted in per reactor before it starts
/// (`mem::dma::commit_at_least`): a full queue of 128 commands of 128 KiB.
/// Beyond it the arena grows on first use, 2 MiB at a time.
pub const REACTOR_BUFFER_BYTES: usize = 16 << 20;

/// A pass of the loop longer than this is logged (`reactors.stall_warn_us`),
/// in nanoseconds; read by each reactor when it starts.
static STALL_WARN_NS: AtomicU64 = AtomicU64::new(stall::DEFAULT_STALL_WARN_US * 1000);

/// Sets the bound above which a reactor logs one pass of its loop (for the
/// reactors started from now on).
pub fn set_stall_warn(bound: Duration) {
    STALL_WARN_NS.store(bound.as_nanos() as u64, Ordering::Relaxed);
}

/// Epoll token space: connection ids are small; these mark the rest.
const TOKEN_WAKE: u64 = u64::MAX;
const TOKEN_CHANNEL: u64 = 1 << 63;
const TOKEN_POLLER: u64 = 1 << 62;

/// What a queue pair needs from its reactor while handling an event.
pub struct IoCtx<'a> {
    pub channels: &'a mut ChannelCache,
    pub bufs: &'a mut BufPool,
    /// State a transport keeps per reactor (NVMe/RDMA's registered buffers).
    pub locals: &'a mut Locals,
    pub conn_id: u32,
    pub now: Instant,
    /// `now` in nanoseconds on this reactor's clock (since it started):
    /// command latencies are differences of these, with no `Duration`
    /// arithmetic per command.
    pub now_ns: u64,
}

/// Objects a transport gives a reactor to own, found by key: only that
/// reactor's thread touches them, so its queue pairs use them without a lock.
#[derive(Default)]
pub struct Locals {
    items: Vec<(u64, Box<dyn Any + Send>)>,
}

impl Locals {
    /// Adds (or replaces) the object under `key`.
    pub fn insert(&mut self, key: u64, v: Box<dyn Any + Send>) {
        self.items.retain(|(k, _)| *k != key);
        self.items.push((key, v));
    }
    /// The object under `key`, if it has type `T` (a handful of entries: a
    /// scan is cheaper than a hash).
    pub fn get_mut<T: 'static>(&mut self, key: u64) -> Option<&mut T> {
        self.items
            .iter_mut()
            .find(|(k, _)| *k == key)
            .and_then(|(_, v)| v.downcast_mut::<T>())
    }
}

impl IoCtx<'_> {
    /// The device tag for operation `slot` of this connection.
    pub fn tag(&self, slot: u16) -> u64 {
        (self.conn_id as u64) << 32 | slot as u64
    }
}

/// A transport queue pair owned by one reactor (a TCP connection, later an RDMA QP).
pub trait QueuePair: Send {
    /// The fd the reactor watches for readability.
    fn fd(&self) -> RawFd;
    /// Called when the fd is readable (or on hangup/error).
    fn on_readable(&mut self, ctx: &mut IoCtx);
    /// A device operation this queue pair submitted has finished.
    fn on_io_complete(
        &mut self,
        slot: u16,
        result: Result<(), i32>,
        buf: Option<IoBuf>,
        ctx: &mut IoCtx,
    );
    /// Writes what is queued; returns true while output remains (wants EPOLLOUT).
    /// Sent data buffers go back to `bufs`.
    fn flush(&mut self, bufs: &mut BufPool) -> bool;
    /// Starts commands that waited for output to drain (after `flush`);
    /// returns true if it started any.
    fn after_flush(&mut self, _ctx: &mut IoCtx) -> bool {
        false
    }
    /// Whether it must be offered `flush` and `after_flush` on every pass
    /// (output queued, commands waiting for room). When false the reactor
    /// skips it until an event, a completion, a routed event or housekeeping
    /// reaches it: a pass costs what is busy, not every queue pair open.
    fn wants_poll(&self) -> bool {
        true
    }
    /// Periodic checks (keep-alive, controller teardown).
    fn housekeeping(&mut self, ctx: &mut IoCtx);
    /// Starts an orderly close (target shutdown).
    fn begin_shutdown(&mut self);
    /// Finished: gives back what it holds of the reactor's own state
    /// (`IoCtx::locals`), just before the reactor drops it.
    fn release(&mut self, _ctx: &mut IoCtx) {}
    /// Closed and no device operation outstanding: the reactor may drop it.
    fn finished(&self) -> bool;
    fn describe(&self) -> String;
    /// The shared poller (by `SharedPoller::id`) and key whose events belong
    /// to this queue pair; read once, at adoption.
    fn route(&self) -> Option<(u64, u64)> {
        None
    }
    /// An event a shared poller routed to this queue pair.
    fn on_polled(&mut self, _event: &dyn Any, _ctx: &mut IoCtx) {}
}

/// A completion source many queue pairs of one reactor share, polled once per
/// pass of the loop (SPDK's poll group poller).
pub trait SharedPoller: Send {
    /// Names this poller in `QueuePair::route`; unique within the reactor.
    fn id(&self) -> u64;
    /// Readable once the poller is armed and an event arrives: what wakes a
    /// sleeping reactor.
    fn fd(&self) -> Option<RawFd>;
    /// The fd was readable: consume its notification.
    fn on_wake(&mut self);
    /// Polls once. Each event goes to `deliver(key, event)`, which returns
    /// false when no queue pair has that key (not adopted yet, or gone); the
    /// poller decides whether to retry or drop it. Returns the events found.
    fn poll(&mut self, now: Instant, deliver: &mut dyn FnMut(u64, &dyn Any) -> bool) -> usize;
    /// Work of its own with the reactor's `Locals`, before `poll` each pass
    /// (the KV posts serve asks here); returns the work done.
    fn serve(&mut self, _locals: &mut Locals, _now: Instant) -> usize {
        0
    }
    /// Whether `poll`'s keys are the queue pairs' own ids (the reactor's
    /// connection numbers) rather than keys they name in `QueuePair::route`.
    fn delivers_to_conns(&self) -> bool {
        false
    }
    /// Before the reactor sleeps: asks for a notification on the next event.
    /// True when it armed just now, so the reactor polls once more before
    /// sleeping (an event that raced the arming would not notify).
    fn arm(&mut self) -> bool;
}

thread_local! {
    static CURRENT_REACTOR: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The id of the reactor running on this thread (0 on other threads): per-reactor
/// caches (the extent allocator's) are indexed by it.
pub fn current_reactor() -> usize {
    CURRENT_REACTOR.with(|c| c.get())
}

/// What a reactor opens a device channel to (a namespace): the reactor knows
/// it only through this, so it does not depend on the NVMe-oF core.
pub trait ChannelSource: Send + Sync {
    /// Process-unique key.
    fn key(&self) -> u64;
    /// The channel this source shares with others and its lane in it
    /// (`BlockDevice::shared_channel`); `None`: a channel of its own.
    fn shared(&self) -> Option<(u64, u32)> {
        None
    }
    /// Gone from its subsystem: the channel is dropped once idle.
    fn removed(&self) -> bool;
    fn open_channel(&self) -> std::io::Result<Box<dyn IoChannel>>;
    fn describe(&self) -> String;
}

/// This reactor's device channels: one per device queue, opened on first use by
/// the first source (namespace) that needs it and shared by every source of
/// that device queue (the volumes of one pool). Kept in a vector (every pass
/// polls them all) with an index by source key for the per-command lookup.
#[derive(Default)]
pub struct ChannelCache {
    entries: Vec<ChannelEntry>,
    /// Source key -> (entry, lane when the channel is shared).
    index: HashMap<u64, (usize, Option<u32>), std::hash::BuildHasherDefault<KeyHasher>>,
    new_fds: Vec<(u64, RawFd)>,
}

struct ChannelEntry {
    /// The channel's key: the source's own, or the shared channel's.
    key: u64,
    /// The sources using it; it closes when all are gone and it is idle.
    sources: Vec<Arc<dyn ChannelSource>>,
    ch: Box<dyn IoChannel>,
}

/// Namespace keys are small unique integers: a multiplicative hash spreads them
/// at a fraction of SipHash's cost (this runs once per command).
#[derive(Default)]
pub struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

impl ChannelCache {
    /// Submits `op` for `src` on this reactor's channel to it (opened on first
    /// use; shared with the other sources of one device queue).
    pub fn submit<S: ChannelSource + 'static>(
        &mut self,
        src: &Arc<S>,
        tag: u64,
        op: IoOp,
        now: Instant,
    ) -> Result<(), (IoOp, i32)> {
        let found = self.index.get(&src.key()).copied();
        let (i, lane) = match found {
            Some(x) => x,
            None => match self.entry_of(src) {
                Ok(x) => x,
                Err(e) => return Err((op, e)),
            },
        };
        let Some(e) = self.entries.get_mut(i) else {
            return Err((op, libc::EIO));
        };
        match lane {
            Some(lane) => e.ch.submit_lane(lane, tag, op, now),
            None => e.ch.submit(tag, op, now),
        }
    }

    /// Channels open on this reactor (each one device queue).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// `src`'s channel (opened on first use).
    pub fn get<S: ChannelSource + 'static>(
        &mut self,
        src: &Arc<S>,
    ) -> Result<&mut dyn IoChannel, i32> {
        let (i, _) = self.entry_of(src)?;
        match self.entries.get_mut(i) {
            Some(e) => Ok(e.ch.as_mut()),
            None => Err(libc::EIO),
        }
    }

    #[cold]
    #[inline(never)]
    fn entry_of<S: ChannelSource + 'static>(
        &mut self,
        src: &Arc<S>,
    ) -> Result<(usize, Option<u32>), i32> {
        if let Some(&x) = self.index.get(&src.key()) {
            return Ok(x);
        }
        // First use of this source on this reactor (cold): join the channel
        // of its device queue, or open it.
        let shared = src.shared();
        let key = shared.map_or_else(|| src.key(), |(k, _)| k);
        let found = shared.and_then(|_| self.entries.iter().position(|e| e.key == key));
        let i = match found {
            Some(i) => i,
            None => {
                let ch = src.open_channel().map_err(|e| {
                    tracing::error!(dev = %src.describe(), "cannot open device channel: {e}");
                    e.raw_os_error().unwrap_or(libc::EIO)
                })?;
                for fd in [ch.completion_fd(), ch.notify_fd()].into_iter().flatten() {
                    self.new_fds.push((key, fd));
                }
                self.entries.push(ChannelEntry {
                    key,
                    sources: Vec::new(),
                    ch,
                });
                self.entries.len() - 1
            }
        };
        let x = (i, shared.map(|(_, lane)| lane));
        if let Some(e) = self.entries.get_mut(i) {
            e.sources.push(src.clone());
        }
        self.index.insert(src.key(), x);
        Ok(x)
    }

    /// Lets go of removed sources (a shared channel's lane once it is idle)
    /// and closes channels no source uses once they are idle.
    pub fn evict_removed(&mut self) {
        let mut changed = false;
        for e in &mut self.entries {
            let ch = &mut e.ch;
            let before = e.sources.len();
            e.sources.retain(|src| {
                if !src.removed() {
                    return true;
                }
                match src.shared() {
                    Some((_, lane)) => !ch.release_lane(lane),
                    None => ch.in_flight() > 0,
                }
            });
            changed |= e.sources.len() != before;
        }
        let before = self.entries.len();
        self.entries
            .retain(|e| !e.sources.is_empty() || e.ch.in_flight() > 0);
        if changed || self.entries.len() != before {
            self.index.clear();
            for (i, e) in self.entries.iter().enumerate() {
                for src in &e.sources {
                    self.index
                        .insert(src.key(), (i, src.shared().map(|(_, lane)| lane)));
                }
            }
        }
    }

    /// True while a channel without a completion fd (a polled device) has
    /// operations in flight: only polling finds their completions.
    fn polled_in_flight(&self) -> bool {
        self.entries
            .iter()
            .any(|e| e.ch.completion_fd().is_none() && e.ch.in_flight() > 0)
    }

    fn flush_submissions(&mut self) {
        for e in self.entries.iter_mut() {
            e.ch.flush_submissions();
        }
    }

    fn poll(&mut self, out: &mut Vec<IoCompletion>, now: Instant) -> usize {
        self.entries.iter_mut().map(|e| e.ch.poll(out, now)).sum()
    }

    fn in_flight(&self) -> usize {
        self.entries.iter().map(|e| e.ch.in_flight()).sum()
    }
}

/// Runs `round(now)` on a thread of its own until it returns false: the loop of
/// a background worker (a pool's metadata thread). Like a reactor's loop it is
/// where the time comes from for everything it drives: one clock read per round.
pub fn spawn_worker(
    name: String,
    mut round: impl FnMut(Instant) -> bool + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name(name)
        .spawn(move || while round(Instant::now()) {})
}

pub enum Message {
    /// Adopt a new queue pair.
    Adopt(Box<dyn QueuePair>),
    /// Run a closure on the reactor thread.
    Call(Box<dyn FnOnce(&mut Reactor) + Send>),
    /// Close every queue pair, drain device I/O, and exit.
    Shutdown,
}

/// The shared side of a reactor: how other threads reach it.
pub struct ReactorShared {
    pub id: usize,
    inbox: ArrayQueue<Message>,
    wake: EventFd,
    sleeping: AtomicBool,
    /// Nanoseconds spent in polls that found work / found none.
    pub busy_ns: AtomicU64,
    pub idle_ns: AtomicU64,
    pub queue_pairs: AtomicU64,
    /// KV asks this reactor's queue pairs posted to the reactor owning the
    /// index, and asks it served for other reactors (`pool::kv_owner`).
    pub kv_asks_posted: AtomicU64,
    pub kv_asks_served: AtomicU64,
    /// KV indexes whose state this reactor owns.
    pub kv_indexes_owned: AtomicU64,
    /// Poll gaps, page faults and context switches (see `stall`).
    pub stall: StallStats,
}

impl ReactorShared {
    /// Sends a message; a full inbox gives it back (back-pressure, never a drop).
    pub fn send(&self, msg: Message) -> Result<(), Message> {
        self.inbox.push(msg)?;
        self.notify();
        Ok(())
    }

    /// Wakes the reactor if it sleeps: after putting work where one of its
    /// shared pollers finds it (`SharedPoller::arm` keeps it awake while
    /// that work waits).
    pub fn notify(&self) {
        // The other half of the reactor's fence before it sleeps: either it
        // sees the work just put down, or this sees it sleeping.
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::SeqCst) {
            self.wake.signal();
        }
    }
}

type TimerFn = Box<dyn FnOnce(&mut Reactor) + Send>;
type Runnable = async_task::Runnable;

pub struct Reactor {
    pub shared: Arc<ReactorShared>,
    idle: IdleMode,
    epoll: Epoll,
    conns: Vec<Option<Box<dyn QueuePair>>>,
    pollers: Vec<Box<dyn SharedPoller>>,
    /// (poller id, key) -> conn id, for the adopted queue pairs with a route.
    routes: HashMap<(u64, u64), u32, std::hash::BuildHasherDefault<KeyHasher>>,
    /// The clock as of the start of this pass of the loop.
    now: Instant,
    /// `now` as nanoseconds since `epoch` (see `IoCtx::now_ns`).
    now_ns: u64,
    epoch: Instant,
    wants_out: Vec<bool>,
    /// The queue pairs this pass's `flush_and_reap` visits.
    ready: ReadySet,
    free_ids: Vec<u32>,
    channels: ChannelCache,
    bufs: BufPool,
    locals: Locals,
    tasks: Arc<SegQueue<Runnable>>,
    timers: BinaryHeap<Reverse<(Instant, u64)>>,
    timer_fns: HashMap<u64, TimerFn>,
    next_timer: u64,
    shutting_down: Option<Instant>,
    exit: bool,
    /// Passes longer than this are counted and logged (rate-limited).
    stall_warn_ns: u64,
    warner: StallWarner,
}

/// The queue pairs a pass must flush: those something reached this pass, and
/// those that asked to be polled again (`QueuePair::wants_poll`, output left).
/// Each is listed once; capacity follows the connection table, so marking on
/// the I/O path never allocates.
#[derive(Default)]
struct ReadySet {
    ids: Vec<u32>,
    /// The other buffer: `begin` hands out `ids` and keeps this one to mark into.
    spare: Vec<u32>,
    listed: Vec<bool>,
}

impl ReadySet {
    fn grow(&mut self, slots: usize) {
        self.listed.resize(slots, false);
        for v in [&mut self.ids, &mut self.spare] {
            v.reserve(slots.saturating_sub(v.len()));
        }
    }

    fn mark(&mut self, id: u32) {
        let listed = &mut self.listed[id as usize];
        if !*listed {
            *listed = true;
            self.ids.push(id);
        }
    }

    /// This pass's list; marks made while it is visited go to the next pass.
    fn begin(&mut self) -> Vec<u32> {
        let batch = std::mem::replace(&mut self.ids, std::mem::take(&mut self.spare));
        for &id in &batch {
            self.listed[id as usize] = false;
        }
        batch
    }

    fn end(&mut self, mut batch: Vec<u32>) {
        batch.clear();
        self.spare = batch;
    }
}

/// Longest a shutdown waits for queue pairs to drain.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

impl Reactor {
    pub fn new(id: usize, idle: IdleMode) -> std::io::Result<Reactor> {
        let shared = Arc::new(ReactorShared {
            id,
            inbox: ArrayQueue::new(INBOX_CAPACITY),
            wake: EventFd::new()?,
            sleeping: AtomicBool::new(false),
            busy_ns: AtomicU64::new(0),
            idle_ns: AtomicU64::new(0),
            queue_pairs: AtomicU64::new(0),
            kv_asks_posted: AtomicU64::new(0),
            kv_asks_served: AtomicU64::new(0),
            kv_indexes_owned: AtomicU64::new(0),
            stall: StallStats::default(),
        });
        let epoll = Epoll::new()?;
        epoll.add(shared.wake.raw(), EPOLLIN, TOKEN_WAKE)?;
        Ok(Reactor {
            shared,
            idle,
            epoll,
            conns: Vec::new(),
            pollers: Vec::new(),
            routes: HashMap::default(),
            now: Instant::now(),
            now_ns: 0,
            epoch: Instant::now(),
            wants_out: Vec::new(),
            ready: ReadySet::default(),
            free_ids: Vec::new(),
            channels: ChannelCache::default(),
            bufs: BufPool::new(64),
            locals: Locals::default(),
            tasks: Arc::new(SegQueue::new()),
            timers: BinaryHeap::new(),
            timer_fns: HashMap::new(),
            next_timer: 0,
            shutting_down: None,
            exit: false,
            stall_warn_ns: STALL_WARN_NS.load(Ordering::Relaxed),
            warner: StallWarner::default(),
        })
    }

    /// Starts the reactor on its own thread, pinned to `core` if given.
    pub fn spawn(
        id: usize,
        idle: IdleMode,
        core: Option<usize>,
    ) -> std::io::Result<(Arc<ReactorShared>, std::thread::JoinHandle<()>)> {
        // Its first I/O buffers are resident before it serves, faulted in on
        // this (the starting) thread.
        kvt_mem::dma::commit_at_least((id + 1) * REACTOR_BUFFER_BYTES);
        // The reactor is built on its own thread: device channels it will own
        // (io_uring instances) never cross threads.
        let (tx, rx) = std::sync::mpsc::channel();
        let h = std::thread::Builder::new()
            .name(format!("reactor{id}"))
            .spawn(move || {
                CURRENT_REACTOR.with(|c| c.set(id));
                if let Some(c) = core {
                    if !core_affinity::set_for_current(core_affinity::CoreId { id: c }) {
                        tracing::warn!(reactor = id, core = c, "could not pin reactor to core");
                    }
                }
                match Reactor::new(id, idle) {
                    Ok(mut r) => {
                        if tx.send(Ok(r.shared.clone())).is_ok() {
                            r.run();
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                    }
                }
            })?;
        let shared = rx
            .recv()
            .map_err(|_| std::io::Error::other("reactor thread died during start"))??;
        Ok((shared, h))
    }

    /// Spawns a future onto this reactor's run queue.
    pub fn spawn_local<F>(&mut self, fut: F)
    where
        F: Future<Output = ()> + 'static,
    {
        let q = self.tasks.clone();
        let shared = self.shared.clone();
        let schedule = move |r: Runnable| {
            q.push(r);
            shared.notify();
        };
        let (runnable, task) = async_task::spawn_local(fut, schedule);
        task.detach();
        runnable.schedule();
    }

    /// Runs `f` on this reactor after `after`.
    pub fn add_timer(&mut self, after: Duration, f: impl FnOnce(&mut Reactor) + Send + 'static) {
        let id = self.next_timer;
        self.next_timer += 1;
        self.timers.push(Reverse((Instant::now() + after, id)));
        self.timer_fns.insert(id, Box::new(f));
    }

    /// The objects this reactor owns for others (`IoCtx::locals`).
    pub fn locals_mut(&mut self) -> &mut Locals {
        &mut self.locals
    }

    /// Gives this reactor an object to own for a transport (`IoCtx::locals`).
    pub fn insert_local(&mut self, key: u64, v: Box<dyn Any + Send>) {
        self.locals.insert(key, v);
    }

    /// Adds a shared poller (see `SharedPoller`); its fd joins the epoll set.
    pub fn add_poller(&mut self, p: Box<dyn SharedPoller>) {
        if self.pollers.iter().any(|q| q.id() == p.id()) {
            tracing::warn!(
                reactor = self.shared.id,
                poller = p.id(),
                "shared poller added twice; ignored"
            );
            return;
        }
        if let Some(fd) = p.fd() {
            let token = TOKEN_POLLER | self.pollers.len() as u64;
            if let Err(e) = self.epoll.add(fd, EPOLLIN, token) {
                tracing::warn!(
                    reactor = self.shared.id,
                    "cannot watch a shared poller: {e}"
                );
            }
        }
        self.pollers.push(p);
    }

    pub fn queue_pair_count(&self) -> usize {
        self.conns.iter().filter(|c| c.is_some()).count()
    }

    fn adopt(&mut self, qp: Box<dyn QueuePair>) {
        let id = match self.free_ids.pop() {
            Some(id) => id,
            None => {
                self.conns.push(None);
                self.wants_out.push(false);
                // Sized here, on the cold path: marking never allocates.
                self.ready.grow(self.conns.len());
                (self.conns.len() - 1) as u32
            }
        };
        if let Err(e) = self.epoll.add(qp.fd(), EPOLLIN | EPOLLRDHUP, id as u64) {
            tracing::error!("cannot watch {}: {e}", qp.describe());
            self.free_ids.push(id);
            return;
        }
        tracing::debug!(
            reactor = self.shared.id,
            conn = id,
            "adopted {}",
            qp.describe()
        );
        if let Some(r) = qp.route() {
            self.routes.insert(r, id);
        }
        self.conns[id as usize] = Some(qp);
        self.wants_out[id as usize] = false;
        self.ready.mark(id);
        self.shared.queue_pairs.fetch_add(1, Ordering::Relaxed);
        if let Some(t) = self.shutting_down {
            let _ = t;
            if let Some(Some(c)) = self.conns.get_mut(id as usize) {
                c.begin_shutdown();
            }
        }
    }

    fn drain_inbox(&mut self) -> bool {
        let mut any = false;
        while let Some(m) = self.shared.inbox.pop() {
            any = true;
            match m {
                Message::Adopt(qp) => self.adopt(qp),
                Message::Call(f) => f(self),
                Message::Shutdown => {
                    if self.shutting_down.is_none() {
                        self.shutting_down = Some(Instant::now());
                        for (id, c) in self.conns.iter_mut().enumerate() {
                            if let Some(c) = c {
                                c.begin_shutdown();
                                self.ready.mark(id as u32);
                            }
                        }
                    }
                }
            }
        }
        any
    }

    fn with_conn(&mut self, id: u32, f: impl FnOnce(&mut dyn QueuePair, &mut IoCtx)) {
        let Some(Some(c)) = self.conns.get_mut(id as usize) else {
            return;
        };
        self.ready.mark(id);
        let mut ctx = IoCtx {
            channels: &mut self.channels,
            bufs: &mut self.bufs,
            locals: &mut self.locals,
            conn_id: id,
            now: self.now,
            now_ns: self.now_ns,
        };
        f(c.as_mut(), &mut ctx);
    }

    fn register_channel_fds(&mut self) {
        for (key, fd) in std::mem::take(&mut self.channels.new_fds) {
            if let Err(e) = self.epoll.add(fd, EPOLLIN, TOKEN_CHANNEL | key) {
                tracing::warn!("cannot watch device completions: {e}");
            }
        }
    }

    /// Reads this reactor's own page faults and context switches (cold: a
    /// timer, once per `RUSAGE_EVERY`).
    fn sample_rusage(&mut self) {
        if let Err(e) = self.shared.stall.sample_rusage() {
            tracing::warn!(reactor = self.shared.id, "getrusage: {e}");
        }
    }

    /// Accounts one pass of `gap_ns` (sleep left out) ending at `now_ns`.
    fn note_pass(&mut self, gap_ns: u64, now_ns: u64) {
        let over = gap_ns > self.stall_warn_ns;
        self.shared.stall.record_gap(gap_ns, over);
        if over {
            self.warn_stall(gap_ns, now_ns);
        }
    }

    #[cold]
    #[inline(never)]
    fn warn_stall(&mut self, gap_ns: u64, now_ns: u64) {
        if let Some(left_out) = self.warner.due(now_ns) {
            tracing::warn!(
                reactor = self.shared.id,
                pass_us = gap_ns / 1000,
                bound_us = self.stall_warn_ns / 1000,
                left_out,
                "reactor stalled: one pass of its loop took longer than the bound"
            );
        }
    }

    fn housekeeping(&mut self) {
        for id in 0..self.conns.len() as u32 {
            self.with_conn(id, |c, ctx| c.housekeeping(ctx));
        }
        self.channels.evict_removed();
        self.add_timer(HOUSEKEEPING_EVERY, |r| r.housekeeping());
    }

    fn fire_timers(&mut self) -> bool {
        let now = self.now;
        let mut any = false;
        while let Some(Reverse((when, id))) = self.timers.peek().copied() {
            if when > now {
                break;
            }
            self.timers.pop();
            if let Some(f) = self.timer_fns.remove(&id) {
                f(self);
                any = true;
            }
        }
        any
    }

    fn next_timer_ms(&self) -> i32 {
        match self.timers.peek() {
            Some(Reverse((when, _))) => {
                let d = when.saturating_duration_since(Instant::now());
                (d.as_millis() as i32).clamp(0, MAX_SLEEP_MS)
            }
            None => MAX_SLEEP_MS,
        }
    }

    /// Flushes the queue pairs marked ready this pass, starts what waited for
    /// their output, and drops the finished ones; true if a queue pair started
    /// commands that waited for its output to drain.
    fn flush_and_reap(&mut self) -> bool {
        let mut started = false;
        let batch = self.ready.begin();
        for &id in &batch {
            let id = id as usize;
            let Some(Some(c)) = self.conns.get_mut(id) else {
                continue;
            };
            let want = c.flush(&mut self.bufs);
            let mut ctx = IoCtx {
                channels: &mut self.channels,
                bufs: &mut self.bufs,
                locals: &mut self.locals,
                conn_id: id as u32,
                now: self.now,
                now_ns: self.now_ns,
            };
            started |= c.after_flush(&mut ctx);
            if c.finished() {
                c.release(&mut ctx);
                let fd = c.fd();
                let _ = self.epoll.delete(fd);
                tracing::debug!(
                    reactor = self.shared.id,
                    conn = id,
                    "released {}",
                    c.describe()
                );
                if let Some(r) = c.route() {
                    if self.routes.get(&r) == Some(&(id as u32)) {
                        self.routes.remove(&r);
                    }
                }
                self.conns[id] = None;
                self.free_ids.push(id as u32);
                self.shared.queue_pairs.fetch_sub(1, Ordering::Relaxed);
                continue;
            }
            if want != self.wants_out[id] {
                let ev = EPOLLIN | EPOLLRDHUP | if want { EPOLLOUT } else { 0 };
                if self.epoll.modify(c.fd(), ev, id as u64).is_ok() {
                    self.wants_out[id] = want;
                }
            }
            if want || c.wants_poll() {
                self.ready.mark(id as u32);
            }
        }
        self.ready.end(batch);
        if started {
            // Their device operations go out now, not a pass later.
            self.channels.flush_submissions();
        }
        started
    }

    /// Polls every shared poller once, routing each event by (poller, key) to
    /// its queue pair. A key no adopted queue pair has is refused, never
    /// delivered elsewhere: routes are removed when a queue pair is released.
    fn poll_shared(&mut self) -> usize {
        let Reactor {
            pollers,
            routes,
            conns,
            channels,
            bufs,
            locals,
            now,
            now_ns,
            ready,
            ..
        } = self;
        let (now, now_ns) = (*now, *now_ns);
        let mut n = 0;
        for p in pollers.iter_mut() {
            n += p.serve(locals, now);
            let pid = p.id();
            let by_conn = p.delivers_to_conns();
            n += p.poll(now, &mut |key, ev| {
                let conn_id = if by_conn {
                    key as u32
                } else {
                    let Some(&conn_id) = routes.get(&(pid, key)) else {
                        return false;
                    };
                    conn_id
                };
                let Some(Some(c)) = conns.get_mut(conn_id as usize) else {
                    return false;
                };
                ready.mark(conn_id);
                let mut ctx = IoCtx {
                    channels,
                    bufs,
                    locals,
                    conn_id,
                    now,
                    now_ns,
                };
                c.on_polled(ev, &mut ctx);
                true
            });
        }
        n
    }

    fn rusage_timer(&mut self) {
        self.sample_rusage();
        self.add_timer(stall::RUSAGE_EVERY, Self::rusage_timer);
    }

    /// The clock now, on this reactor's scale (`now_ns`), without moving `now`.
    fn clock_ns(&self) -> u64 {
        Instant::now()
            .saturating_duration_since(self.epoch)
            .as_nanos() as u64
    }

    fn read_clock(&mut self) {
        self.now = Instant::now();
        self.now_ns = self.now.saturating_duration_since(self.epoch).as_nanos() as u64;
    }

    /// The poll loop. Returns after a Shutdown message once every queue pair has
    /// drained (or the grace period ran out).
    pub fn run(&mut self) {
        self.add_timer(HOUSEKEEPING_EVERY, |r| r.housekeeping());
        self.sample_rusage();
        self.add_timer(stall::RUSAGE_EVERY, Self::rusage_timer);
        let mut events = Vec::with_capacity(128);
        let mut completions: Vec<IoCompletion> = Vec::with_capacity(256);
        let mut empty_polls = 0u32;
        self.read_clock();
        let mut clock = PassClock {
            last_ns: self.now_ns,
            prev_busy: false,
            pass_start_ns: self.now_ns,
        };
        while !self.exit {
            let inbox_busy = self.drain_inbox();
            let mut busy = inbox_busy;
            let timeout = if self.idle == IdleMode::Adaptive && empty_polls >= SPIN_BEFORE_SLEEP {
                self.sleep_timeout()
            } else {
                0
            };
            // A pass that sleeps ends where the sleep starts: sleeping is
            // idleness, not a stall (one more clock read, only before a sleep).
            let sleep_from_ns = (timeout != 0).then(|| self.clock_ns());
            if let Err(e) = self.epoll.wait(&mut events, timeout) {
                tracing::error!("epoll_wait: {e}");
            }
            // One clock read per pass (and one more per batch of device
            // completions below): every command in the pass shares it.
            self.read_clock();
            self.account_pass(&mut clock, sleep_from_ns, inbox_busy);
            self.shared.sleeping.store(false, Ordering::Release);
            busy |= self.handle_events(&events);
            if self.poll_shared() > 0 {
                busy = true;
            }
            self.channels.flush_submissions();
            completions.clear();
            // The completions' own time (channels time their commands from the
            // pass's `now` to this one): one more clock read per pass with
            // device I/O outstanding.
            if self.channels.in_flight() > 0 {
                self.read_clock();
            }
            if self.channels.poll(&mut completions, self.now) > 0 {
                busy = true;
                self.deliver_completions(&mut completions);
            }
            self.channels.flush_submissions();
            self.register_channel_fds();
            while let Some(r) = self.tasks.pop() {
                r.run();
                busy = true;
            }
            busy |= self.fire_timers();
            busy |= self.flush_and_reap();
            clock.prev_busy = busy;
            if busy {
                empty_polls = 0;
            } else {
                empty_polls = empty_polls.saturating_add(1);
            }
            self.check_shutdown();
        }
    }

    /// Announces sleep and returns how long the next wait may sleep (ms; 0:
    /// not at all, work or an armed poller turned up).
    fn sleep_timeout(&mut self) -> i32 {
        let mut timeout = 0;
        self.shared.sleeping.store(true, Ordering::SeqCst);
        // Announced before looking for work: a store then a load may
        // pass each other (the CPU's store buffer), so a sender that
        // put work down after the look could miss the announcement
        // and not wake us (`notify` fences too).
        std::sync::atomic::fence(Ordering::SeqCst);
        // Re-check after announcing sleep so a racing sender's wake-up is
        // not lost.
        if self.shared.inbox.is_empty() && self.tasks.is_empty() && self.channels.in_flight() == 0 {
            timeout = self.next_timer_ms();
        } else if self.shared.inbox.is_empty()
            && self.tasks.is_empty()
            && !self.channels.polled_in_flight()
        {
            // Device I/O outstanding: its completion fd wakes us (RAM
            // completes inline, so never sleeps here long). A polled
            // device (nvme) has no fd: keep spinning while it has I/O.
            timeout = 1;
        }
        // Every shared poller must notify before the reactor sleeps.
        let mut armed_now = false;
        for p in self.pollers.iter_mut() {
            armed_now |= p.arm();
        }
        if armed_now {
            timeout = 0;
        }
        timeout
    }

    /// Charges the time since the last pass to busy or idle and notes the
    /// pass's length (the stall detector's input). `sleep_from_ns`: when the
    /// pass's sleep began, if it slept.
    fn account_pass(
        &mut self,
        clock: &mut PassClock,
        sleep_from_ns: Option<u64>,
        inbox_busy: bool,
    ) {
        let pass_end_ns = sleep_from_ns.unwrap_or(self.now_ns);
        self.note_pass(pass_end_ns.saturating_sub(clock.pass_start_ns), self.now_ns);
        clock.pass_start_ns = self.now_ns;
        // Busy/idle accounting between the passes' clock reads: the time
        // since the last one is the last pass's work after its wait, then
        // this pass's inbox and wait; busy when either found work. (Charging
        // it to this pass's own work put every busy pass's time under
        // idle when the pass after it found nothing.)
        let spent = self.now_ns.saturating_sub(clock.last_ns);
        clock.last_ns = self.now_ns;
        let counter = if clock.prev_busy || inbox_busy {
            &self.shared.busy_ns
        } else {
            &self.shared.idle_ns
        };
        counter.fetch_add(spent, Ordering::Relaxed);
    }

    /// Handles the events of the last wait; true if a connection had work.
    fn handle_events(&mut self, events: &[(u64, u32)]) -> bool {
        let mut busy = false;
        for &(token, _ev) in events {
            if token == TOKEN_WAKE {
                self.shared.wake.drain();
            } else if token & TOKEN_CHANNEL != 0 {
                // Completions are reaped below for every channel.
            } else if token & TOKEN_POLLER != 0 {
                // Polled below with the others; only the notification is
                // consumed here.
                if let Some(p) = self.pollers.get_mut((token & !TOKEN_POLLER) as usize) {
                    p.on_wake();
                }
            } else {
                busy = true;
                self.with_conn(token as u32, |c, ctx| c.on_readable(ctx));
            }
        }
        busy
    }

    /// Hands device completions to their queue pairs (a completion whose queue
    /// pair is gone returns its buffer to the pool).
    fn deliver_completions(&mut self, completions: &mut Vec<IoCompletion>) {
        for c in completions.drain(..) {
            let conn = (c.tag >> 32) as u32;
            let slot = c.tag as u16;
            let (result, buf) = (c.result, c.buf);
            let mut buf = buf;
            let mut handled = false;
            self.with_conn(conn, |qp, ctx| {
                handled = true;
                qp.on_io_complete(slot, result, buf.take(), ctx)
            });
            if let Some(b) = buf {
                self.bufs.put(b);
            }
            if !handled {
                tracing::warn!(conn, slot, "completion for a queue pair that is gone");
            }
        }
    }

    /// During shutdown: exits once every queue pair and device I/O drained,
    /// or the grace period ran out.
    fn check_shutdown(&mut self) {
        if let Some(since) = self.shutting_down {
            let drained = self.queue_pair_count() == 0 && self.channels.in_flight() == 0;
            if drained || since.elapsed() > SHUTDOWN_GRACE {
                if !drained {
                    tracing::warn!(
                        reactor = self.shared.id,
                        "shutdown grace period over with {} queue pairs open",
                        self.queue_pair_count()
                    );
                }
                self.exit = true;
            }
        }
    }
}

/// The clock readings the poll loop carries from one pass to the next.
struct PassClock {
    /// The last pass's clock read (busy/idle accounting).
    last_ns: u64,
    /// Whether the last pass found work after its wait.
    prev_busy: bool,
    /// Start of the current pass (after its epoll wait), for its gap.
    pass_start_ns: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn the_control_plane_gets_the_cores_no_reactor_is_pinned_to() {
        assert_eq!(control_plane_cores(&[0, 1], &[0]), Some(vec![1]));
        assert_eq!(
            control_plane_cores(&[0, 1, 2, 3], &[1, 3]),
            Some(vec![0, 2])
        );
        // Every allowed core has a reactor: the control plane shares them.
        assert_eq!(control_plane_cores(&[0, 1], &[0, 1]), None);
        // Reactors pinned outside the allowed cores take none of them.
        assert_eq!(control_plane_cores(&[2, 3], &[0]), None);
        assert_eq!(keep_control_plane_off(&[None, None]), None);
    }

    #[test]
    fn a_control_plane_thread_and_the_threads_it_starts_keep_off_a_reactor_core() {
        // On a thread of its own: the mask it sets is the test's, not the harness's.
        std::thread::spawn(|| {
            let allowed = sys::allowed_cores().unwrap();
            let Some(&first) = allowed.first() else {
                panic!("no core allowed");
            };
            if allowed.len() < 2 {
                // One core: nothing can be kept off it.
                assert_eq!(keep_control_plane_off(&[Some(first)]), None);
                return;
            }
            let rest = keep_control_plane_off(&[Some(first)]).unwrap();
            assert_eq!(rest, allowed[1..].to_vec());
            assert_eq!(sys::allowed_cores().unwrap(), rest);
            let child = std::thread::spawn(|| sys::allowed_cores().unwrap());
            assert_eq!(child.join().unwrap(), rest);
            // A reactor may still pin itself to the core the control plane left.
            let (shared, h) = Reactor::spawn(0, IdleMode::Adaptive, Some(first)).unwrap();
            let (tx, rx) = mpsc::channel();
            assert!(shared
                .send(Message::Call(Box::new(move |_: &mut Reactor| {
                    tx.send(sys::allowed_cores().unwrap()).unwrap();
                })))
                .is_ok());
            let on = rx.recv_timeout(Duration::from_secs(10)).unwrap();
            assert_eq!(on, vec![first]);
            assert!(shared.send(Message::Shutdown).is_ok());
            h.join().unwrap();
        })
        .join()
        .unwrap();
    }

    #[test]
    fn messages_tasks_and_timers_run_on_the_reactor() {
        let (shared, h) = Reactor::spawn(0, IdleMode::Adaptive, None).unwrap();
        let (tx, rx) = mpsc::channel::<&'static str>();
        let tx2 = tx.clone();
        let tx3 = tx.clone();
        assert!(shared
            .send(Message::Call(Box::new(move |r: &mut Reactor| {
                tx.send("call").unwrap();
                r.spawn_local(async move {
                    tx2.send("task").unwrap();
                });
                r.add_timer(Duration::from_millis(20), move |_| {
                    tx3.send("timer").unwrap();
                });
            })))
            .is_ok());
        let got: Vec<_> = (0..3)
            .map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap())
            .collect();
        assert_eq!(got, vec!["call", "task", "timer"]);
        assert!(shared.send(Message::Shutdown).is_ok());
        h.join().unwrap();
    }

    /// Work a pass does after its wait (a timer here, like a queue pair's
    /// commands) counts as busy time, though the pass after it finds nothing:
    /// it used to be charged to that next, idle pass.
    #[test]
    fn work_after_the_wait_counts_as_busy() {
        let (shared, h) = Reactor::spawn(0, IdleMode::Busy, None).unwrap();
        let work = Duration::from_millis(200);
        assert!(shared
            .send(Message::Call(Box::new(move |r: &mut Reactor| {
                r.add_timer(Duration::from_millis(1), move |_| {
                    let t0 = Instant::now();
                    while t0.elapsed() < work {
                        std::hint::spin_loop();
                    }
                });
            })))
            .is_ok());
        let deadline = Instant::now() + Duration::from_secs(20);
        let busy = || Duration::from_nanos(shared.busy_ns.load(Ordering::Relaxed));
        while busy() < work && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(busy() >= work, "busy {:?} after {work:?} of work", busy());
        assert!(shared.send(Message::Shutdown).is_ok());
        h.join().unwrap();
    }

    /// Events of a fake shared poller: (key, payload) to deliver, and those
    /// no queue pair claimed.
    #[derive(Default)]
    struct FakeEvents {
        pending: std::collections::VecDeque<(u64, u32)>,
        refused: Vec<(u64, u32)>,
    }

    struct FakePoller(Arc<std::sync::Mutex<FakeEvents>>);

    impl SharedPoller for FakePoller {
        fn id(&self) -> u64 {
            7
        }
        fn fd(&self) -> Option<RawFd> {
            None
        }
        fn on_wake(&mut self) {}
        fn poll(&mut self, _now: Instant, deliver: &mut dyn FnMut(u64, &dyn Any) -> bool) -> usize {
            let mut ev = self.0.lock().unwrap();
            let mut n = 0;
            while let Some((key, payload)) = ev.pending.pop_front() {
                n += 1;
                if !deliver(key, &payload) {
                    ev.refused.push((key, payload));
                }
            }
            n
        }
        fn arm(&mut self) -> bool {
            false
        }
    }

    /// A queue pair whose fd is an eventfd: it records the events routed to
    /// it, counts the flushes and readable calls the reactor gives it, asks to be
    /// polled while `want`, and is finished once `done`.
    struct FakeQp {
        fd: Arc<EventFd>,
        key: u64,
        got: Arc<std::sync::Mutex<Vec<(u32, u32)>>>,
        done: Arc<AtomicBool>,
        flushes: Arc<AtomicU64>,
        readable: Arc<AtomicU64>,
        want: Arc<AtomicBool>,
    }

    impl FakeQp {
        fn new(key: u64) -> FakeQp {
            FakeQp {
                fd: Arc::new(EventFd::new().unwrap()),
                key,
                got: Arc::default(),
                done: Arc::default(),
                flushes: Arc::default(),
                readable: Arc::default(),
                want: Arc::default(),
            }
        }
    }

    impl QueuePair for FakeQp {
        fn fd(&self) -> RawFd {
            self.fd.raw()
        }
        fn on_readable(&mut self, _ctx: &mut IoCtx) {
            self.fd.drain();
            self.readable.fetch_add(1, Ordering::Relaxed);
        }
        fn on_io_complete(&mut self, _: u16, _: Result<(), i32>, _: Option<IoBuf>, _: &mut IoCtx) {}
        fn flush(&mut self, _bufs: &mut BufPool) -> bool {
            self.flushes.fetch_add(1, Ordering::Relaxed);
            false
        }
        fn wants_poll(&self) -> bool {
            self.want.load(Ordering::Relaxed)
        }
        fn housekeeping(&mut self, _ctx: &mut IoCtx) {}
        fn begin_shutdown(&mut self) {
            self.done.store(true, Ordering::Release);
        }
        fn finished(&self) -> bool {
            self.done.load(Ordering::Acquire)
        }
        fn describe(&self) -> String {
            format!("fake qp {}", self.key)
        }
        fn route(&self) -> Option<(u64, u64)> {
            Some((7, self.key))
        }
        fn on_polled(&mut self, event: &dyn Any, ctx: &mut IoCtx) {
            if let Some(&p) = event.downcast_ref::<u32>() {
                self.got.lock().unwrap().push((ctx.conn_id, p));
            }
        }
    }

    fn wait_for(what: &str, f: impl Fn() -> bool) {
        let t = Instant::now();
        while !f() {
            assert!(t.elapsed() < Duration::from_secs(10), "timed out: {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn shared_poller_events_reach_only_the_queue_pair_with_that_route() {
        let (shared, h) = Reactor::spawn(2, IdleMode::Adaptive, None).unwrap();
        let events = Arc::new(std::sync::Mutex::new(FakeEvents::default()));
        let p = FakePoller(events.clone());
        assert!(shared
            .send(Message::Call(Box::new(move |r| r.add_poller(Box::new(p)))))
            .is_ok());
        let qp = |key| {
            let got = Arc::new(std::sync::Mutex::new(Vec::new()));
            let done = Arc::new(AtomicBool::new(false));
            let q = FakeQp {
                got: got.clone(),
                done: done.clone(),
                ..FakeQp::new(key)
            };
            (q, got, done)
        };
        let push = |key, payload| events.lock().unwrap().pending.push_back((key, payload));
        let refused = || events.lock().unwrap().refused.clone();

        // A (key 100) is adopted: its events reach it; key 200 has no owner.
        let (a, got_a, done_a) = qp(100);
        assert!(shared.send(Message::Adopt(Box::new(a))).is_ok());
        wait_for("A adopted", || {
            shared.queue_pairs.load(Ordering::Relaxed) == 1
        });
        push(100, 1);
        push(200, 2);
        wait_for("A got its event", || got_a.lock().unwrap().len() == 1);
        wait_for("key 200 refused", || refused() == vec![(200, 2)]);
        let a_conn = got_a.lock().unwrap()[0].0;

        // A is released; B takes its conn slot with another route. A late event
        // of A's route is refused, never handed to B.
        done_a.store(true, Ordering::Release);
        wait_for("A released", || {
            shared.queue_pairs.load(Ordering::Relaxed) == 0
        });
        let (b, got_b, _done_b) = qp(200);
        assert!(shared.send(Message::Adopt(Box::new(b))).is_ok());
        wait_for("B adopted", || {
            shared.queue_pairs.load(Ordering::Relaxed) == 1
        });
        push(100, 3);
        push(200, 4);
        wait_for("B got its event", || got_b.lock().unwrap().len() == 1);
        wait_for("A's late event refused", || refused().len() == 2);
        assert_eq!(
            got_b.lock().unwrap()[0],
            (a_conn, 4),
            "B reuses A's conn slot"
        );
        assert_eq!(refused(), vec![(200, 2), (100, 3)]);
        assert_eq!(got_a.lock().unwrap().len(), 1);

        assert!(shared.send(Message::Shutdown).is_ok());
        h.join().unwrap();
    }

    /// A busy-polling reactor flushes a queue pair on the passes something
    /// reached it (an event, housekeeping) and on every pass while it asks to
    /// be polled; an idle one costs no pass anything (every pass used to flush
    /// every queue pair open).
    #[test]
    fn only_queue_pairs_with_work_are_flushed_each_pass() {
        let (shared, h) = Reactor::spawn(3, IdleMode::Busy, None).unwrap();
        let qp = FakeQp::new(1);
        let (flushes, readable) = (qp.flushes.clone(), qp.readable.clone());
        let (want, wake) = (qp.want.clone(), qp.fd.clone());
        assert!(shared.send(Message::Adopt(Box::new(qp))).is_ok());
        wait_for("adopted", || {
            shared.queue_pairs.load(Ordering::Relaxed) == 1
        });
        let n = || flushes.load(Ordering::Relaxed);

        // Idle: housekeeping's visits (one per 100 ms) and nothing else.
        std::thread::sleep(Duration::from_millis(100));
        let before = n();
        std::thread::sleep(Duration::from_millis(500));
        assert!(
            n() - before <= 20,
            "{} flushes of an idle queue pair in 0.5 s",
            n() - before
        );

        // An event reaches it.
        wake.signal();
        wait_for("the event read", || readable.load(Ordering::Relaxed) == 1);

        // Asking to be polled: flushed pass after pass until it stops asking.
        let before = n();
        want.store(true, Ordering::Relaxed);
        wait_for("flushed every pass", || n() - before > 10_000);
        want.store(false, Ordering::Relaxed);

        assert!(shared.send(Message::Shutdown).is_ok());
        h.join().unwrap();
    }

    #[test]
    fn ready_set_lists_each_queue_pair_once_per_pass() {
        let mut r = ReadySet::default();
        r.grow(4);
        for id in [2, 0, 2, 3, 0] {
            r.mark(id);
        }
        let batch = r.begin();
        assert_eq!(batch, vec![2, 0, 3]);
        // Marks while a pass visits its list go to the next pass.
        r.mark(2);
        r.mark(2);
        r.end(batch);
        let batch = r.begin();
        assert_eq!(batch, vec![2]);
        r.end(batch);
        assert!(r.begin().is_empty());
    }

    #[test]
    fn sleeping_reactor_wakes_for_messages() {
        let (shared, h) = Reactor::spawn(1, IdleMode::Adaptive, None).unwrap();
        // Let it go idle and fall asleep.
        std::thread::sleep(Duration::from_millis(300));
        let (tx, rx) = mpsc::channel();
        assert!(shared
            .send(Message::Call(Box::new(move |_| tx.send(()).unwrap())))
            .is_ok());
        rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(shared.send(Message::Shutdown).is_ok());
        h.join().unwrap();
        assert!(shared.idle_ns.load(Ordering::Relaxed) > 0);
    }
}
