//! The load generator's queue engine: one NVMe/TCP I/O queue driven without
//! blocking, in the style of `spdk_nvme_perf`'s poller.
//!
//! Everything per I/O is preallocated: a slot per I/O with its own data
//! buffer, one output buffer into which a whole batch of capsules is encoded and
//! sent with one `send`, and one receive buffer parsed in place (read data is
//! verified where it lies, never copied out). Completions that arrive in one
//! receive share one timestamp: that is when this side saw them.
//!
//! An I/O larger than the controller's maximum data transfer size (MDTS) goes
//! as several commands, one per piece, as a host driver splits it: slot `s`'s
//! piece `j` has command ID `s * pieces + j`. Pieces wait in order for a free
//! queue entry, so the queue never holds more commands than it has entries;
//! the I/O completes (and its latency is taken) when its last piece does.

use super::{Histogram, PerfError, Workload};
use crate::initiator::QueueParts;
use kvt_wire::nvme::{
    io_opc, DsmRange, KvCommand, KvKey, SglDescriptor, Sqe, Status, StoreOptions,
    DSM_ATTR_DEALLOCATE, DSM_RANGE_LEN,
};
use kvt_wire::tcp::{self as pdu, DataHeader, Digests, ParseLimits, Pdu};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Where an I/O lies on the namespace and what it moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// I/O `i` covers bytes `[i * io_size, (i + 1) * io_size)`.
    Blocks,
    /// LMCache's raw-block layout: a metadata region, then slots of
    /// round_up(header + io_size, 4 KiB). A write stores a chunk: the header
    /// block at the slot's start, then the payload after it (two commands, or
    /// more when MDTS splits the payload); a read retrieves the payload only.
    LmcacheSlots { metadata: u64, header: usize },
    /// A KV namespace: I/O `i` is the value of key `i` (`kv_key(i)`), one
    /// command each (a value is at most VML, which is at most MDTS). A write is
    /// a Store, a read a Retrieve into a buffer of the value's size, a
    /// deallocate a Delete.
    Kv,
}

/// The key of KV I/O `i`: 16 bytes, "kvperf::" and `i` big-endian (so List
/// order is index order).
pub fn kv_key(i: u64) -> KvKey {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(b"kvperf::");
    k[8..].copy_from_slice(&i.to_be_bytes());
    KvKey::new(&k).unwrap_or_default()
}

/// Key popularity: uniform, or Zipf with exponent `theta` over the keys (rank
/// `r` drawn with probability proportional to 1 / (r + 1)^theta), sampled from a
/// cumulative table built once per queue.
#[derive(Debug, Clone)]
pub struct Popularity {
    cdf: Vec<f64>,
}

impl Popularity {
    /// A table for `n` keys; `theta` 0 is uniform (no table).
    pub fn new(n: u64, theta: f64) -> Popularity {
        if theta <= 0.0 || n == 0 {
            return Popularity { cdf: Vec::new() };
        }
        let mut cdf = Vec::with_capacity(n as usize);
        let mut sum = 0.0;
        for r in 0..n {
            sum += 1.0 / ((r + 1) as f64).powf(theta);
            cdf.push(sum);
        }
        for c in cdf.iter_mut() {
            *c /= sum;
        }
        Popularity { cdf }
    }
    /// The index for random word `x` among `n` keys.
    fn pick(&self, x: u64, n: u64) -> u64 {
        if self.cdf.is_empty() {
            return x % n.max(1);
        }
        let u = (x >> 11) as f64 / (1u64 << 53) as f64;
        (self.cdf.partition_point(|&c| c < u) as u64).min(n.saturating_sub(1))
    }
}

impl Layout {
    /// Bytes from one I/O's start to the next one's.
    pub fn stride(self, io_size: usize) -> u64 {
        match self {
            Layout::Blocks => io_size as u64,
            Layout::LmcacheSlots { header, .. } => (header + io_size).div_ceil(4096) as u64 * 4096,
            Layout::Kv => 1,
        }
    }
    /// Where I/O 0 starts.
    pub fn base(self) -> u64 {
        match self {
            Layout::Blocks => 0,
            Layout::LmcacheSlots { metadata, .. } => metadata,
            Layout::Kv => 0,
        }
    }
}

/// What one queue does: its share of the namespace and the I/O it issues.
#[derive(Debug, Clone)]
pub struct QueuePlan {
    pub qid: u16,
    pub nsid: u32,
    pub workload: Workload,
    pub read_pct: u32,
    /// Percentage of the writes issued as deallocates of the same range instead
    /// (churn that keeps a thin volume's fill steady and its GC busy).
    pub deallocate_pct: u32,
    pub qd: usize,
    /// Bytes per I/O and per logical block.
    pub io_size: usize,
    pub lba_size: u32,
    /// Most bytes one command may move (the controller's MDTS; `io_size` or
    /// more when it has no limit): larger I/Os are split.
    pub max_transfer: usize,
    /// Commands the queue may have outstanding (its entries less one).
    pub max_commands: usize,
    pub layout: Layout,
    /// The I/O-sized slots this queue addresses: [first, first + count).
    pub first: u64,
    pub count: u64,
    /// Check every read against what this run wrote there.
    pub verify: bool,
    /// How random I/Os pick their slot (or key).
    pub popularity: Popularity,
}

/// A verification failure, described for the report.
#[derive(Debug, Clone)]
pub struct Mismatch {
    pub slba: u64,
    pub byte: usize,
    pub expected_stamp: u32,
}

/// Counters a queue publishes for the progress line.
#[derive(Default)]
pub struct LiveCounters {
    pub ios: AtomicU64,
    pub bytes: AtomicU64,
}

/// Encodes `sqe` as a capsule: its data in the capsule when given, else
/// `len` bytes the transport moves (R2T, C2HData).
fn encode_capsule(wbuf: &mut Vec<u8>, sqe: &mut Sqe, data: &[u8], len: usize, digests: Digests) {
    sqe.set_sgl(SglDescriptor {
        address: 0,
        length: len as u32,
        type_byte: if !data.is_empty() {
            SglDescriptor::IN_CAPSULE
        } else {
            SglDescriptor::TRANSPORT
        },
    });
    pdu::encode_capsule_cmd(wbuf, sqe, data, digests);
}

/// The data pattern of a verified block: every 8-byte word is a function of the
/// I/O slot, the write's stamp and the word's position, so stale, misplaced and
/// torn data all fail.
#[inline]
fn pattern_word(io_index: u64, stamp: u32, word: u64) -> u64 {
    let x = io_index.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ ((stamp as u64) << 32) ^ word;
    x ^ (x >> 29)
}

pub fn fill_pattern(buf: &mut [u8], io_index: u64, stamp: u32) {
    for (w, chunk) in buf.chunks_exact_mut(8).enumerate() {
        chunk.copy_from_slice(&pattern_word(io_index, stamp, w as u64).to_le_bytes());
    }
}

/// Checks `data`, found at byte `offset` of an I/O, against the pattern. Returns
/// the first mismatching byte offset within the I/O.
pub fn check_pattern(data: &[u8], offset: usize, io_index: u64, stamp: u32) -> Option<usize> {
    if offset % 8 == 0 {
        let base = offset / 8;
        let mut chunks = data.chunks_exact(8);
        for (w, chunk) in chunks.by_ref().enumerate() {
            let want = pattern_word(io_index, stamp, (base + w) as u64).to_le_bytes();
            if chunk != want {
                let i = chunk
                    .iter()
                    .zip(want)
                    .position(|(a, b)| *a != b)
                    .unwrap_or(0);
                return Some(offset + w * 8 + i);
            }
        }
        let done = data.len() - chunks.remainder().len();
        return check_bytes(&data[done..], offset + done, io_index, stamp);
    }
    check_bytes(data, offset, io_index, stamp)
}

fn check_bytes(data: &[u8], offset: usize, io_index: u64, stamp: u32) -> Option<usize> {
    for (i, &b) in data.iter().enumerate() {
        let p = offset + i;
        let want = pattern_word(io_index, stamp, (p / 8) as u64).to_le_bytes()[p % 8];
        if b != want {
            return Some(p);
        }
    }
    None
}

/// Failed commands described per queue (the count is in `errors`).
const MAX_FAILURES_KEPT: usize = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Read,
    Write,
    Deallocate,
    /// KV Exist: no data either way.
    Exist,
}

struct Slot {
    busy: bool,
    op: Op,
    io_index: u64,
    /// The write's stamp, or for a read the stamp expected (0: not checked).
    stamp: u32,
    submitted: Instant,
    /// Host-to-controller data (writes), sized to one I/O.
    data: Vec<u8>,
    bad: bool,
    /// The I/O's commands: (namespace byte offset, offset in `data`, length).
    /// Preallocated; refilled per I/O.
    pieces: Vec<(u64, usize, usize)>,
    /// Pieces sent (they go in order), pieces not yet completed, and
    /// whether every completed one succeeded.
    sent: u32,
    pending: u32,
    ok: bool,
}

/// Verification state: which stamp each I/O slot of this queue last got, and
/// which slots have a command outstanding (two commands on one block in flight
/// at once have no defined result, so the generator never issues them).
struct VerifyState {
    stamps: Vec<u32>,
    inflight: Vec<u64>,
    next_stamp: u32,
}

impl VerifyState {
    fn busy(&self, i: usize) -> bool {
        self.inflight[i / 64] & (1 << (i % 64)) != 0
    }
    fn set(&mut self, i: usize, on: bool) {
        if on {
            self.inflight[i / 64] |= 1 << (i % 64);
        } else {
            self.inflight[i / 64] &= !(1 << (i % 64));
        }
    }
}

pub struct PerfQueue {
    plan: QueuePlan,
    sock: TcpStream,
    digests: Digests,
    maxh2cdata: usize,
    icd_limit: usize,
    rbuf: Vec<u8>,
    rstart: usize,
    rend: usize,
    wbuf: Vec<u8>,
    wpos: usize,
    slots: Vec<Slot>,
    /// Free I/O slots.
    free: Vec<u16>,
    /// I/Os in flight (some of their pieces may still wait in `ready`).
    outstanding: usize,
    /// Most bytes per command, and most commands per I/O (command ID
    /// `slot * pieces + j` is piece `j` of slot `slot`).
    piece: usize,
    pieces: usize,
    /// Command IDs of pieces waiting for a queue entry, in order.
    ready: std::collections::VecDeque<u16>,
    /// Commands sent and not yet completed.
    commands: usize,
    rng: u64,
    seq: u64,
    verify: Option<VerifyState>,
    pub hist: Histogram,
    pub errors: u64,
    /// Failures outside the measured window (prefill, warm-up, drain).
    pub unmeasured_errors: u64,
    pub verified: u64,
    pub mismatches: Vec<Mismatch>,
    pub mismatch_count: u64,
    /// The first failed commands: what they were and the status returned.
    pub failures: Vec<String>,
    /// KV Retrieves (and Deletes) measured that found no key: an evicted,
    /// expired or never stored value. Not errors, and not in the histogram.
    pub misses: u64,
    live: Arc<LiveCounters>,
    /// Completions are recorded only inside [measure_from, measure_until).
    measure_from: Instant,
    measure_until: Instant,
}

impl PerfQueue {
    pub fn new(
        parts: QueueParts,
        plan: QueuePlan,
        live: Arc<LiveCounters>,
        measure_from: Instant,
        measure_until: Instant,
    ) -> Result<PerfQueue, PerfError> {
        let lba = plan.lba_size as usize;
        let (piece, pieces, header) = piece_sizes(&plan)?;
        let qid = plan.qid;
        parts
            .sock
            .set_nonblocking(true)
            .map_err(|source| PerfError::QueueSocket { qid, source })?;
        let rcap = (plan.io_size + 64 * 1024).max(1 << 20);
        let mut rbuf = vec![0; rcap];
        let n = parts.unparsed.len().min(rcap);
        rbuf[..n].copy_from_slice(&parts.unparsed[..n]);
        let slots = slots(&plan, header, pieces, measure_from);
        let verify = plan.verify.then(|| VerifyState {
            stamps: vec![0; plan.count as usize],
            inflight: vec![0; (plan.count as usize).div_ceil(64)],
            next_stamp: 1,
        });
        debug_assert!(plan.io_size % lba == 0);
        Ok(PerfQueue {
            rng: 0x9E37_79B9_7F4A_7C15 ^ (plan.qid as u64).wrapping_mul(0xD1B5_4A32_D192_ED03),
            seq: 0,
            free: (0..plan.qd as u16).rev().collect(),
            outstanding: 0,
            piece,
            pieces,
            ready: std::collections::VecDeque::with_capacity(plan.qd * pieces),
            commands: 0,
            sock: parts.sock,
            digests: parts.digests,
            maxh2cdata: parts.maxh2cdata.max(4096) as usize,
            icd_limit: parts.icd_limit,
            rbuf,
            rstart: 0,
            rend: n,
            wbuf: Vec::with_capacity(256 * 1024),
            wpos: 0,
            slots,
            verify,
            plan,
            hist: Histogram::default(),
            errors: 0,
            unmeasured_errors: 0,
            verified: 0,
            mismatches: Vec::new(),
            mismatch_count: 0,
            failures: Vec::new(),
            misses: 0,
            live,
            measure_from,
            measure_until,
        })
    }

    /// Sets the window in which completions are recorded.
    pub fn set_window(&mut self, from: Instant, until: Instant) {
        self.measure_from = from;
        self.measure_until = until;
    }

    pub fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
    /// The I/Os (slots, keys) this queue addresses.
    pub fn range_len(&self) -> u64 {
        self.plan.count
    }
    pub fn outstanding(&self) -> usize {
        self.outstanding
    }
    pub fn wants_write(&self) -> bool {
        self.wpos < self.wbuf.len()
    }

    fn next_rand(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// Picks the next I/O: (slot index within this queue's range, operation).
    fn pick(&mut self) -> Option<(u64, Op)> {
        let read = match self.plan.workload {
            Workload::Exist => return self.pick_index().map(|i| (i, Op::Exist)),
            Workload::RandRead | Workload::Read | Workload::LmcacheRetrieve | Workload::List => {
                true
            }
            Workload::RandWrite | Workload::Write | Workload::LmcacheStore => false,
            Workload::RandRw => self.next_rand() % 100 < self.plan.read_pct as u64,
        };
        let op = if read {
            Op::Read
        } else if self.plan.deallocate_pct > 0
            && self.next_rand() % 100 < self.plan.deallocate_pct as u64
        {
            Op::Deallocate
        } else {
            Op::Write
        };
        self.pick_index().map(|i| (i, op))
    }

    /// The next slot or key: in order for sequential workloads, else by the
    /// popularity model; one a verified I/O is not in flight on.
    fn pick_index(&mut self) -> Option<u64> {
        let sequential = matches!(self.plan.workload, Workload::Read | Workload::Write);
        for _ in 0..8 {
            let i = if sequential {
                let i = self.seq;
                self.seq = (self.seq + 1) % self.plan.count;
                i
            } else {
                let x = self.next_rand();
                self.plan.popularity.pick(x, self.plan.count)
            };
            match &self.verify {
                Some(v) if v.busy(i as usize) => continue,
                _ => return Some(i),
            }
        }
        None
    }

    /// Issues commands until the queue depth is reached (unless `stop`), then
    /// pushes the batch to the socket.
    pub fn submit(&mut self, now: Instant, stop: bool) -> std::io::Result<usize> {
        let mut issued = 0;
        while let (false, Some(&cid)) = (stop, self.free.last()) {
            let Some((i, op)) = self.pick() else { break };
            self.free.pop();
            self.issue(cid, i, op, now);
            issued += 1;
        }
        self.send_ready();
        self.flush()?;
        Ok(issued)
    }

    /// Writes the queue's range once with verifiable data (before a verified
    /// read-only run), one I/O per slot, `qd` at a time.
    pub fn prefill_step(&mut self, cursor: &mut u64, now: Instant) -> std::io::Result<bool> {
        while *cursor < self.plan.count {
            let Some(cid) = self.free.pop() else { break };
            self.issue(cid, *cursor, Op::Write, now);
            *cursor += 1;
        }
        self.send_ready();
        self.flush()?;
        Ok(*cursor >= self.plan.count && self.outstanding == 0)
    }

    /// Starts I/O `i` in `slot`: its pieces join the ready list.
    fn issue(&mut self, slot: u16, i: u64, op: Op, now: Instant) {
        let mut stamp = 0;
        if let Some(v) = self.verify.as_mut() {
            v.set(i as usize, true);
            match op {
                Op::Read => stamp = v.stamps[i as usize],
                Op::Write => {
                    stamp = v.next_stamp;
                    v.next_stamp = v.next_stamp.wrapping_add(1).max(1);
                }
                Op::Deallocate | Op::Exist => {}
            }
        }
        let (io, piece) = (self.plan.io_size, self.piece);
        let at = self.plan.layout.base() + (self.plan.first + i) * self.plan.layout.stride(io);
        let s = &mut self.slots[slot as usize];
        s.pieces.clear();
        match (op, self.plan.layout) {
            // A deallocate names its whole range in one command: no data moves.
            (Op::Deallocate, _) => s.pieces.push((at, 0, io)),
            // An LMCache store writes the chunk's header block first.
            (Op::Write, Layout::LmcacheSlots { header, .. }) => {
                s.pieces.push((at, 0, header));
                let payload = (at + header as u64, header);
                s.pieces.extend((0..io.div_ceil(piece)).map(|j| {
                    let off = j * piece;
                    (payload.0 + off as u64, payload.1 + off, piece.min(io - off))
                }));
            }
            // A retrieve reads the payload only.
            (_, Layout::LmcacheSlots { header, .. }) => {
                s.pieces.extend((0..io.div_ceil(piece)).map(|j| {
                    let off = j * piece;
                    (
                        at + (header + off) as u64,
                        header + off,
                        piece.min(io - off),
                    )
                }));
            }
            // One command per key: Store, Retrieve, Delete or Exist.
            (_, Layout::Kv) => s.pieces.push((at, 0, io)),
            (_, Layout::Blocks) => s.pieces.extend((0..io.div_ceil(piece)).map(|j| {
                let off = j * piece;
                (at + off as u64, off, piece.min(io - off))
            })),
        }
        let pieces = s.pieces.len();
        s.busy = true;
        s.op = op;
        s.io_index = self.plan.first + i;
        s.stamp = stamp;
        s.submitted = now;
        s.bad = false;
        s.sent = 0;
        s.pending = pieces as u32;
        s.ok = true;
        if op == Op::Write && self.verify.is_some() {
            fill_pattern(&mut s.data, s.io_index, stamp);
        }
        let first = slot as usize * self.pieces;
        self.ready.extend((first..first + pieces).map(|c| c as u16));
        self.outstanding += 1;
    }

    /// Command `cid`'s slot, where its data is in the slot's buffer, its
    /// length, and its namespace byte offset.
    fn piece_of(&self, cid: u16) -> (usize, usize, usize, u64) {
        let (slot, j) = (cid as usize / self.pieces, cid as usize % self.pieces);
        match self.slots.get(slot).and_then(|s| s.pieces.get(j)) {
            Some(&(at, start, len)) => (slot, start, len, at),
            None => (slot, 0, 0, 0),
        }
    }

    /// Encodes ready pieces while the queue has entries for them.
    fn send_ready(&mut self) {
        while self.commands < self.plan.max_commands {
            let Some(cid) = self.ready.pop_front() else {
                return;
            };
            self.encode_piece(cid);
            self.commands += 1;
            if let Some(s) = self.slots.get_mut(cid as usize / self.pieces) {
                s.sent += 1;
            }
        }
    }

    fn encode_piece(&mut self, cid: u16) {
        let (slot, start, len, at) = self.piece_of(cid);
        if self.plan.layout == Layout::Kv {
            return self.encode_kv(cid, slot, at, len);
        }
        let lba = self.plan.lba_size as usize;
        let s = &self.slots[slot];
        let op = s.op;
        assert!(
            op != Op::Exist,
            "Exist is a KV command: run() refuses it on blocks"
        );
        let opcode = match op {
            Op::Read | Op::Exist => io_opc::READ,
            Op::Write => io_opc::WRITE,
            Op::Deallocate => io_opc::DATASET_MANAGEMENT,
        };
        let mut sqe = Sqe::new(opcode, cid, self.plan.nsid);
        let mut range = [0u8; DSM_RANGE_LEN];
        let (data, len): (&[u8], usize) = match op {
            Op::Deallocate => {
                // One range, attribute Deallocate; the range rides in the capsule.
                sqe.set_cdw(10, 0);
                sqe.set_cdw(11, DSM_ATTR_DEALLOCATE);
                DsmRange {
                    attributes: 0,
                    nlb: (len / lba) as u32,
                    slba: at / lba as u64,
                }
                .encode(&mut range);
                (&range, DSM_RANGE_LEN)
            }
            Op::Read | Op::Write | Op::Exist => {
                let slba = at / lba as u64;
                sqe.set_cdw(10, slba as u32);
                sqe.set_cdw(11, (slba >> 32) as u32);
                sqe.set_cdw(12, (len / lba) as u32 - 1);
                let in_capsule = op == Op::Write && len <= self.icd_limit;
                (
                    if in_capsule {
                        &s.data[start..start + len]
                    } else {
                        &[]
                    },
                    len,
                )
            }
        };
        encode_capsule(&mut self.wbuf, &mut sqe, data, len, self.digests);
    }

    /// A KV command for key `key`: Store of the slot's value (in the capsule when
    /// it fits, else by R2T), Retrieve into a buffer of the value's size, or
    /// Delete.
    fn encode_kv(&mut self, cid: u16, slot: usize, key: u64, len: usize) {
        let key = kv_key(key);
        let s = &self.slots[slot];
        let cmd = match s.op {
            Op::Write => KvCommand::Store {
                key,
                value_size: len as u32,
                options: StoreOptions::default(),
            },
            Op::Read => KvCommand::Retrieve {
                key,
                host_buffer_size: len as u32,
                raw: false,
            },
            Op::Deallocate => KvCommand::Delete { key },
            Op::Exist => KvCommand::Exist { key },
        };
        let mut sqe = cmd.encode(cid, self.plan.nsid);
        let (data, len): (&[u8], usize) = match s.op {
            Op::Write if len <= self.icd_limit => (&s.data[..len], len),
            Op::Write | Op::Read => (&[], len),
            Op::Deallocate | Op::Exist => (&[], 0),
        };
        encode_capsule(&mut self.wbuf, &mut sqe, data, len, self.digests);
    }

    /// Sends what is queued; partial writes leave the rest for the next call.
    pub fn flush(&mut self) -> std::io::Result<()> {
        while self.wpos < self.wbuf.len() {
            match self.sock.write(&self.wbuf[self.wpos..]) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => self.wpos += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        if self.wpos == self.wbuf.len() {
            self.wbuf.clear();
            self.wpos = 0;
        }
        Ok(())
    }

    /// Reads what the socket has and handles every complete PDU. Returns the
    /// number of commands completed.
    pub fn poll(&mut self) -> Result<usize, PerfError> {
        if self.rstart > 0 && (self.rstart == self.rend || self.rbuf.len() - self.rend < 64 * 1024)
        {
            self.rbuf.copy_within(self.rstart..self.rend, 0);
            self.rend -= self.rstart;
            self.rstart = 0;
        }
        let mut got = false;
        while self.rend < self.rbuf.len() {
            match self.sock.read(&mut self.rbuf[self.rend..]) {
                Ok(0) => return Err(PerfError::Closed),
                Ok(n) => {
                    self.rend += n;
                    got = true;
                    if self.rend < self.rbuf.len() {
                        break;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(PerfError::Receive(e)),
            }
        }
        if !got && self.rstart == self.rend {
            return Ok(0);
        }
        let now = Instant::now();
        let mut done = 0;
        let limits = ParseLimits {
            max_data: self.rbuf.len(),
        };
        let rbuf = std::mem::take(&mut self.rbuf);
        let result = loop {
            let parsed = pdu::parse(&rbuf[self.rstart..self.rend], self.digests, limits);
            match parsed {
                Ok(None) => break Ok(done),
                Err(e) => break Err(PerfError::BadPdu(e)),
                Ok(Some((p, n))) => {
                    match self.handle(p, now) {
                        Ok(c) => done += c,
                        Err(e) => break Err(e),
                    }
                    self.rstart += n;
                }
            }
        };
        self.rbuf = rbuf;
        if done > 0 {
            self.live.ios.fetch_add(done as u64, Ordering::Relaxed);
            self.live
                .bytes
                .fetch_add((done * self.plan.io_size) as u64, Ordering::Relaxed);
        }
        result
    }

    fn handle(&mut self, p: Pdu, now: Instant) -> Result<usize, PerfError> {
        match p {
            Pdu::CapsuleResp(cqe) => self.complete(cqe.cid, cqe.status(), now),
            Pdu::C2HData {
                hdr,
                success,
                last,
                data,
                data_digest_error,
            } => {
                if data_digest_error {
                    return Err(PerfError::DataDigest(hdr.cccid));
                }
                let (slot, start, len, _) = self.piece_of(hdr.cccid);
                let s = self
                    .slots
                    .get_mut(slot)
                    .filter(|s| s.busy && s.op == Op::Read)
                    .ok_or(PerfError::UnexpectedData(hdr.cccid))?;
                if hdr.offset as usize + data.len() > len {
                    return Err(PerfError::DataBeyond(hdr.cccid));
                }
                let off = start + hdr.offset as usize;
                if s.stamp != 0 && !s.bad {
                    if let Some(byte) = check_pattern(data, off, s.io_index, s.stamp) {
                        s.bad = true;
                        self.mismatch_count += 1;
                        if self.mismatches.len() < 8 {
                            let layout = self.plan.layout;
                            let at = layout.base() + s.io_index * layout.stride(self.plan.io_size);
                            self.mismatches.push(Mismatch {
                                slba: at / self.plan.lba_size as u64,
                                byte,
                                expected_stamp: s.stamp,
                            });
                        }
                    }
                }
                if success {
                    if !last {
                        return Err(PerfError::SuccessWithoutLast);
                    }
                    return self.complete(hdr.cccid, Status::SUCCESS, now);
                }
                Ok(0)
            }
            Pdu::R2T(r2t) => {
                self.send_h2c(r2t)?;
                Ok(0)
            }
            Pdu::TermReq { fes, fei, .. } => Err(PerfError::Terminated { fes, fei }),
            other => Err(PerfError::UnexpectedPdu(format!("{other:?}"))),
        }
    }

    fn send_h2c(&mut self, r2t: DataHeader) -> Result<(), PerfError> {
        let (slot, piece_start, piece_len, _) = self.piece_of(r2t.cccid);
        let s = self
            .slots
            .get(slot)
            .filter(|s| s.busy && s.op == Op::Write)
            .ok_or(PerfError::UnexpectedR2t(r2t.cccid))?;
        let (start, len) = (r2t.offset as usize, r2t.length as usize);
        if start + len > piece_len {
            return Err(PerfError::R2tOutside(r2t.cccid));
        }
        let window = s
            .data
            .get(piece_start + start..piece_start + start + len)
            .ok_or(PerfError::R2tOutside(r2t.cccid))?;
        let mut off = 0;
        while off < len {
            let n = (len - off).min(self.maxh2cdata);
            let flags = if off + n == len {
                pdu::flags::LAST_PDU
            } else {
                0
            };
            let hdr = DataHeader {
                cccid: r2t.cccid,
                ttag: r2t.ttag,
                offset: (start + off) as u32,
                length: n as u32,
            };
            pdu::encode_data_pdu(
                &mut self.wbuf,
                true,
                &hdr,
                &window[off..off + n],
                flags,
                self.digests,
                0,
            );
            off += n;
        }
        Ok(())
    }

    /// Command `cid` completed; returns 1 when that finished its I/O.
    fn complete(&mut self, cid: u16, status: Status, now: Instant) -> Result<usize, PerfError> {
        // A KV key that is not there (evicted, expired, deleted, never stored)
        // is a miss, which a cache has by design: counted, not an error.
        let nokey = Status::KV_KEY_DOES_NOT_EXIST;
        let miss =
            self.plan.layout == Layout::Kv && (status.sct, status.sc) == (nokey.sct, nokey.sc);
        let ok = status.is_success() || miss;
        let (slot, piece) = (cid as usize / self.pieces, cid as usize % self.pieces);
        // A completion for a piece not yet sent is the target's error.
        let s = self
            .slots
            .get_mut(slot)
            .filter(|s| s.busy && s.pending > 0 && piece < s.sent as usize)
            .ok_or(PerfError::UnexpectedCompletion(cid))?;
        self.commands = self.commands.saturating_sub(1);
        s.pending -= 1;
        s.ok &= ok;
        if !ok && self.failures.len() < MAX_FAILURES_KEPT {
            let what = command_name(s.op, self.plan.layout == Layout::Kv);
            self.failures.push(format!(
                "{what} failed: {status} (SCT {:#x} SC {:#04x})",
                status.sct, status.sc
            ));
        }
        if s.pending > 0 {
            self.send_ready();
            return Ok(0);
        }
        let ok = s.ok;
        s.busy = false;
        self.outstanding -= 1;
        self.free.push(slot as u16);
        let (op, io_index, stamp, bad, t0) = (s.op, s.io_index, s.stamp, s.bad, s.submitted);
        let miss = miss && ok;
        self.send_ready();
        let read = op == Op::Read;
        if let Some(v) = self.verify.as_mut() {
            let i = (io_index - self.plan.first) as usize;
            v.set(i, false);
            if matches!(op, Op::Write | Op::Deallocate) {
                // Deallocated blocks read as zeroes or fail (volume option), and a
                // failed write leaves the block undefined: stop checking either.
                v.stamps[i] = if ok { stamp } else { 0 };
            }
            if read && ok && !miss && stamp != 0 && !bad {
                self.verified += 1;
            }
        }
        if miss {
            if now >= self.measure_from && now < self.measure_until {
                self.misses += 1;
            }
        } else if now >= self.measure_from && now < self.measure_until {
            self.hist
                .record(now.saturating_duration_since(t0).as_nanos() as u64);
            if !ok || bad {
                self.errors += 1;
            }
        } else if !ok || bad {
            self.unmeasured_errors += 1;
        }
        Ok(1)
    }
}

/// A queue's pieces: (bytes a piece carries, pieces an I/O takes at most,
/// bytes of the LMCache header before the data).
fn piece_sizes(plan: &QueuePlan) -> Result<(usize, usize, usize), PerfError> {
    let lba = plan.lba_size as usize;
    // Pieces are whole blocks: MDTS is a multiple of the memory page size,
    // which no block size exceeds.
    let piece = (plan.max_transfer.max(lba) / lba * lba).min(plan.io_size.max(lba));
    let header = match plan.layout {
        Layout::Blocks | Layout::Kv => 0,
        Layout::LmcacheSlots { header, .. } => header,
    };
    if header % lba != 0 || header > piece {
        return Err(PerfError::BlockSize(plan.lba_size));
    }
    let pieces = if plan.layout == Layout::Kv {
        1
    } else {
        plan.io_size.div_ceil(piece).max(1) + usize::from(header > 0)
    };
    if plan.qd * pieces > u16::MAX as usize || plan.max_commands == 0 {
        return Err(PerfError::TooManyPieces {
            qd: plan.qd,
            pieces,
        });
    }
    Ok((piece, pieces, header))
}

/// The queue's request slots, each with a buffer if its I/Os carry data.
fn slots(plan: &QueuePlan, header: usize, pieces: usize, measure_from: Instant) -> Vec<Slot> {
    let writes = !matches!(
        plan.workload,
        Workload::RandRead
            | Workload::Read
            | Workload::LmcacheRetrieve
            | Workload::List
            | Workload::Exist
    );
    (0..plan.qd)
        .map(|_| Slot {
            busy: false,
            op: Op::Read,
            io_index: 0,
            stamp: 0,
            submitted: measure_from,
            // KV read-only runs store their keys first.
            data: if writes || plan.verify || plan.layout == Layout::Kv {
                vec![0x5A; header + plan.io_size]
            } else {
                Vec::new()
            },
            bad: false,
            pieces: Vec::with_capacity(pieces),
            sent: 0,
            pending: 0,
            ok: true,
        })
        .collect()
}

/// The NVMe name of an operation's command (KV or NVM command set).
fn command_name(op: Op, kv: bool) -> &'static str {
    match (op, kv) {
        (Op::Read, true) => "Retrieve",
        (Op::Write, true) => "Store",
        (Op::Deallocate, true) => "Delete",
        (Op::Read, false) => "Read",
        (Op::Write, false) => "Write",
        (Op::Deallocate, false) => "Deallocate",
        (Op::Exist, _) => "Exist",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn queue_over_loopback(verify: bool) -> (PerfQueue, TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let host = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (target, _) = l.accept().unwrap();
        let now = Instant::now();
        let q = PerfQueue::new(
            QueueParts {
                sock: host,
                digests: Digests::default(),
                maxh2cdata: 8192,
                icd_limit: 8192,
                unparsed: Vec::new(),
            },
            QueuePlan {
                qid: 1,
                nsid: 1,
                workload: Workload::RandRw,
                read_pct: 50,
                deallocate_pct: 10,
                qd: 8,
                io_size: 4096,
                lba_size: 512,
                max_transfer: 2048,
                max_commands: 12,
                layout: Layout::Blocks,
                first: 0,
                count: 64,
                verify,
                popularity: Popularity::new(64, 0.0),
            },
            Arc::default(),
            now,
            now + std::time::Duration::from_secs(60),
        )
        .unwrap();
        (q, target)
    }

    proptest! {
        /// Every draw is a key of the range, uniform or Zipf.
        #[test]
        fn popularity_picks_inside_the_range(n in 1u64..5000, theta in 0.0f64..3.0, xs in proptest::collection::vec(any::<u64>(), 1..64)) {
            let p = Popularity::new(n, theta);
            for x in xs {
                prop_assert!(p.pick(x, n) < n);
            }
        }
    }

    /// Zipf 0.99 over 1000 keys: the first key is drawn far more often than the
    /// last (about 13 % against 0.013 %), uniform draws are even.
    #[test]
    fn zipf_popularity_is_skewed_and_uniform_is_not() {
        let (n, draws) = (1000u64, 200_000u64);
        let mut rng = 0x1234_5678_9ABC_DEF0u64;
        let mut count = |p: &Popularity| {
            let mut c = vec![0u64; n as usize];
            for _ in 0..draws {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                c[p.pick(rng, n) as usize] += 1;
            }
            c
        };
        let z = count(&Popularity::new(n, 0.99));
        assert!(z[0] > draws / 10 && z[0] < draws / 5, "{}", z[0]);
        assert!(z[0] > 100 * z[999].max(1), "{} {}", z[0], z[999]);
        let u = count(&Popularity::new(n, 0.0));
        assert!(u.iter().all(|&c| c > 100 && c < 300), "{:?}", &u[..8]);
        // KV keys: 16 bytes, in index order.
        assert_eq!(kv_key(7).len(), 16);
        assert!(kv_key(255) < kv_key(256));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Whatever a target sends back (valid PDUs for commands that do not
        /// exist, bad offsets, garbage), the engine reports an error or goes on;
        /// it never panics.
        #[test]
        fn replies_from_a_hostile_target_never_panic(
            pdus in proptest::collection::vec((0u8..5, any::<u16>(), 0u32..9000, 0usize..5000), 0..12),
            junk in proptest::collection::vec(any::<u8>(), 0..200),
            verify: bool,
        ) {
            let (mut q, mut target) = queue_over_loopback(verify);
            q.submit(Instant::now(), false).unwrap();
            let mut bytes = Vec::new();
            for (kind, cid, off, len) in pdus {
                let cid = cid % 12;
                let hdr = DataHeader { cccid: cid, ttag: 1, offset: off, length: len as u32 };
                match kind {
                    0 => pdu::encode_capsule_resp(&mut bytes, &kvt_wire::nvme::Cqe::new(cid, kvt_wire::nvme::Status::SUCCESS), Digests::default()),
                    1 => pdu::encode_data_pdu(&mut bytes, false, &hdr, &vec![7u8; len], pdu::flags::LAST_PDU | pdu::flags::SUCCESS, Digests::default(), 0),
                    2 => pdu::encode_data_pdu(&mut bytes, false, &hdr, &vec![7u8; len], 0, Digests::default(), 0),
                    3 => pdu::encode_r2t(&mut bytes, &hdr, Digests::default()),
                    _ => pdu::encode_term_req(&mut bytes, false, 1, 0, &[]),
                }
            }
            bytes.extend_from_slice(&junk);
            target.write_all(&bytes).unwrap();
            // Until everything sent is consumed, an error, or (for a trailing
            // partial PDU) a short while.
            let deadline = Instant::now() + std::time::Duration::from_millis(300);
            while Instant::now() < deadline {
                match q.poll() {
                    Err(_) => break,
                    Ok(_) => {
                        if q.rstart == q.rend && q.rend > 0 {
                            break;
                        }
                    }
                }
                let _ = q.submit(Instant::now(), false);
                std::thread::yield_now();
            }
        }
    }

    #[test]
    fn pattern_checks_catch_stale_misplaced_and_torn_data() {
        let mut b = vec![0u8; 4096];
        fill_pattern(&mut b, 7, 3);
        assert_eq!(check_pattern(&b, 0, 7, 3), None);
        // Split at odd offsets, as data PDUs may be.
        assert_eq!(check_pattern(&b[..1001], 0, 7, 3), None);
        assert_eq!(check_pattern(&b[1001..], 1001, 7, 3), None);
        assert!(check_pattern(&b, 0, 7, 2).is_some(), "stale write");
        assert!(check_pattern(&b, 0, 8, 3).is_some(), "wrong block");
        let mut torn = b.clone();
        torn[2048..].fill(0);
        assert_eq!(check_pattern(&torn, 0, 7, 3), Some(2048));
        assert_eq!(check_pattern(&torn[2040..], 2040, 7, 3), Some(2048));
    }
}
