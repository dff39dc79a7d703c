//! NVMe/TCP queue pairs: one TCP connection is one NVMe queue (admin or I/O).
//!
//! The NVMe command logic is the core's (`nvmf::queue`); this file is what is
//! NVMe/TCP's own: the ICReq/ICResp exchange, PDU framing and digests, host
//! data by in-capsule data or R2T/H2CData (large H2CData received straight into
//! the command's buffer), read data out by C2HData from its device buffer (no
//! copy), and responses as CapsuleResp PDUs. The reactor drives it: bytes in →
//! PDUs → `Queue::receive` → device operations → `Link::respond` → PDUs out.
//! A request's slot index is its R2T transfer tag and device operation tag, so
//! nothing on this path allocates once buffers are warm.

use crate::out::OutQueue;
use crate::tls::{SecurePeer, TlsWire};
use kvt_mem::{BufPool, IoBuf};
use kvt_nvmf::queue::{
    C2h, Capsule, DataDesc, Link, Queue, QueueConfig, Received, Release, Request, Response,
    TransportKind,
};
use kvt_nvmf::{Target, ADMIN_IN_CAPSULE_DATA};
use kvt_reactor::{IoCtx, QueuePair};
use kvt_wire::nvme::{Cqe, DataDirection, SglDescriptor, Sqe, Status};
use kvt_wire::tcp::{self as pdu, fes, DataHeader, Digests, ICResp, ParseLimits, Pdu, PduError};
use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Stop reading new PDUs while this much output is queued (back-pressure).
/// Held read data not yet framed does not count: it is bounded by
/// `READ_STAGING` (or one read of at most MDTS), and a small command must be
/// read while it waits.
const MAX_PENDING_OUTPUT: usize = 8 << 20;
/// Longest wait for the ICReq, and for a terminated connection to drain.
const IC_TIMEOUT: Duration = Duration::from_secs(10);
const TERMINATE_LINGER: Duration = Duration::from_secs(2);
/// H2CData at least this large is received straight into the command's buffer.
const DIRECT_RECEIVE_MIN: usize = 16 * 1024;
/// Read data a queue stages ahead of its socket: reads running plus read data
/// queued and not yet sent. Beyond it, further reads wait for the socket, so
/// the buffers they fill come back warm from the pool instead of cycling
/// megabytes through the cache (32 reads of 1 MiB, all filled before the
/// first is sent, moved a third fewer bytes per second: bench/RESULTS.md).
const READ_STAGING: usize = 2 << 20;
/// A read of at most this many bytes never waits for staging room: it cannot
/// cycle the cache, and waiting behind megabytes of other reads' data is the
/// wait a small read must not have.
const UNSTAGED_READ_MAX: usize = 16 * 1024;
/// Bytes one `flush` writes at most, in largest C2HData PDUs
/// (`tcp.max_c2h_data`), before it lets the reactor's other queue pairs send
/// theirs (it reports more to send, and the next pass goes on).
const FLUSH_BUDGET_PDUS: usize = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ConnState {
    /// Waiting for ICReq.
    AwaitIcReq,
    Ready,
    /// A TermReq was queued (or the peer went away): flush, then close.
    Terminating,
    Closed,
}

/// Where a request's host data is, as far as R2T goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum H2cState {
    /// No R2T pending (in-capsule data, no data, or all received).
    #[default]
    Idle,
    /// Waiting for an R2T slot (bounded outstanding R2Ts per connection).
    AwaitingR2tSlot,
    /// An R2T is out; H2CData is expected.
    AwaitingData,
}

/// NVMe/TCP's part of a request: its host data transfer.
#[derive(Debug, Default)]
pub struct TcpReq {
    h2c: H2cState,
    /// Bytes of host data expected in total, and received so far.
    h2c_len: usize,
    h2c_received: usize,
    /// The current R2T window [r2t_off, r2t_off + r2t_len).
    r2t_off: usize,
    r2t_len: usize,
    /// Some of the data failed its digest; the command fails once it is all here.
    data_error: bool,
    /// Read bytes this command counts in its link's `read_staged`.
    staged: usize,
}

/// An H2CData PDU whose data is being received straight into a command buffer.
#[derive(Debug, Clone, Copy)]
struct DirectReceive {
    slot: u16,
    /// Where this PDU's data goes in the buffer, its length, and how much has
    /// arrived.
    start: usize,
    len: usize,
    got: usize,
    /// Data digest bytes that follow the data (they land in the receive buffer).
    ddgst: usize,
}

/// A read whose data goes out in several C2HData PDUs (`max_c2h_data`).
#[derive(Debug)]
struct HeldC2h {
    cid: u16,
    len: usize,
    /// The last PDU carries SUCCESS (no CapsuleResp); else this CQE follows it.
    success: bool,
    cqe: Cqe,
}

/// What a connection's bytes travel over: the TCP socket itself, or a TLS
/// channel on it (`secure_channel` listeners). The connection is generic over
/// it, so a plaintext connection's path has no TLS branch in it.
pub trait Wire: Read + Write + Send + 'static {
    fn socket(&self) -> &TcpStream;
    /// Input already taken off the socket and held back (decrypted TLS records):
    /// read again without waiting for the socket to become readable.
    fn buffered(&self) -> bool {
        false
    }
    /// The host and subsystem a secure channel was keyed for.
    fn secure_peer(&self) -> Option<&SecurePeer> {
        None
    }
}

impl Wire for TcpStream {
    fn socket(&self) -> &TcpStream {
        self
    }
}

impl Wire for TlsWire {
    fn socket(&self) -> &TcpStream {
        TlsWire::socket(self)
    }
    fn buffered(&self) -> bool {
        TlsWire::buffered(self)
    }
    fn secure_peer(&self) -> Option<&SecurePeer> {
        TlsWire::secure_peer(self)
    }
}

/// The connection's side of the queue: socket, framing, output, R2T budget.
struct TcpLink<W> {
    sock: W,
    peer: String,
    state: ConnState,
    state_since: Instant,
    digests: Digests,
    /// Host PDU data alignment in bytes (from HPDA), 0 for none.
    hpda_align: usize,
    /// Send C2HData with the SUCCESS flag and no CapsuleResp.
    c2h_success: bool,
    maxh2cdata: u32,
    max_r2t_len: usize,
    /// R2Ts outstanding at once (`tcp.max_active_r2ts`).
    max_r2t_active: usize,
    rbuf: Vec<u8>,
    rstart: usize,
    rend: usize,
    /// Output: encoded PDUs interleaved with read data still in its buffers.
    out: OutQueue,
    r2t_active: usize,
    r2t_waiting: VecDeque<u16>,
    /// Bytes of reads admitted and not yet answered (see `READ_STAGING`).
    read_staged: usize,
    /// Reads waiting for staging room, in arrival order, with their arrival.
    read_waiting: VecDeque<(Sqe, u64)>,
    /// Largest C2HData PDU (`tcp.max_c2h_data`): a longer read's data is held
    /// and fed into the output one PDU at a time, so a response queued behind
    /// it waits for about two of them, not for the whole transfer.
    max_c2h_data: usize,
    /// Reads longer than `max_c2h_data` whose data is held in `out`, oldest
    /// first, the front one being fed.
    c2h_held: VecDeque<HeldC2h>,
    direct: Option<DirectReceive>,
    limits: ParseLimits,
    shutting_down: bool,
}

pub struct TcpConnection<W = TcpStream> {
    q: Queue<TcpReq>,
    l: TcpLink<W>,
}

/// The transport-neutral form of an NVMe/TCP SQE's data descriptor.
fn data_desc(sqe: &Sqe) -> Result<DataDesc, Status> {
    let sgl = sqe.sgl();
    if sgl.length == 0 {
        return Ok(DataDesc::None);
    }
    match sgl.type_byte {
        SglDescriptor::IN_CAPSULE => Ok(DataDesc::InCapsule {
            offset: sgl.address,
            len: sgl.length,
        }),
        SglDescriptor::TRANSPORT => Ok(DataDesc::Host { len: sgl.length }),
        _ => Err(Status::SGL_DESCRIPTOR_TYPE_INVALID),
    }
}

impl<W: Wire> TcpLink<W> {
    fn set_state(&mut self, s: ConnState) {
        if self.state != s {
            self.state = s;
            self.state_since = Instant::now();
        }
    }

    /// Queues a C2HTermReq and stops processing input.
    fn terminate(&mut self, err: PduError, offending: &[u8]) {
        tracing::warn!(peer = %self.peer, "terminating connection: {err}");
        let hdr = &offending[..offending.len().min(pdu::TERM_REQ_MAX_DATA)];
        // Nothing but what is already framed goes before the TermReq.
        self.out.drop_unfed();
        self.c2h_held.clear();
        pdu::encode_term_req(&mut self.out.bytes, false, err.fes, err.fei, hdr);
        self.set_state(ConnState::Terminating);
    }

    /// Shuts the socket; the queue's binding ends in `TcpConnection::close`.
    fn close_socket(&mut self) {
        if self.state == ConnState::Closed {
            return;
        }
        let _ = self.sock.socket().shutdown(std::net::Shutdown::Both);
        self.set_state(ConnState::Closed);
    }

    /// Room to stage `len` more read bytes: always when nothing is staged, so
    /// a read larger than the limit still runs.
    fn read_room(&self, len: usize) -> bool {
        let staged = self.read_staged + self.out.buffered_data();
        staged == 0 || staged + len <= READ_STAGING
    }

    /// Frames held read data into the output while less than one PDU's worth
    /// is waiting to be sent: one C2HData PDU per piece, in offset order, the
    /// last with LAST_PDU (and SUCCESS, or the CapsuleResp after it).
    fn feed_c2h(&mut self) {
        while self.out.sendable() < self.max_c2h_data {
            let Some(h) = self.c2h_held.front() else {
                return;
            };
            let Some((off, piece)) = self.out.unfed_piece(self.max_c2h_data) else {
                return;
            };
            let n = piece.len();
            let digest = self.digests.data.then(|| pdu::crc32c(piece));
            let last = off + n == h.len;
            let mut flags = 0;
            if last {
                flags = pdu::flags::LAST_PDU;
                if h.success {
                    flags |= pdu::flags::SUCCESS;
                }
            }
            let hdr = DataHeader {
                cccid: h.cid,
                ttag: 0,
                offset: off as u32,
                length: n as u32,
            };
            let (success, cqe) = (h.success, h.cqe);
            pdu::encode_data_pdu_header(
                &mut self.out.bytes,
                false,
                &hdr,
                n,
                flags,
                self.digests,
                self.hpda_align,
            );
            self.out.feed(n);
            if let Some(d) = digest {
                self.out.bytes.extend_from_slice(&d.to_le_bytes());
            }
            if last {
                if !success {
                    pdu::encode_capsule_resp(&mut self.out.bytes, &cqe, self.digests);
                }
                self.c2h_held.pop_front();
            }
        }
    }

    fn unstage(&mut self, x: &mut TcpReq) {
        self.read_staged = self
            .read_staged
            .saturating_sub(std::mem::take(&mut x.staged));
    }

    /// Whether more of the host's write data is due: an R2T outstanding, a PDU
    /// being received straight into its command buffer, or part of a PDU read.
    fn awaiting_host_data(&self) -> bool {
        self.r2t_active > 0 || self.direct.is_some() || self.rend > self.rstart
    }

    /// A request leaves R2T: its R2T slot or its place in line goes.
    fn leave_r2t(&mut self, slot: u16, x: &mut TcpReq) {
        match x.h2c {
            H2cState::AwaitingData => self.r2t_active = self.r2t_active.saturating_sub(1),
            H2cState::AwaitingR2tSlot => self.r2t_waiting.retain(|&s| s != slot),
            H2cState::Idle => {}
        }
        x.h2c = H2cState::Idle;
        if self.direct.is_some_and(|d| d.slot == slot) {
            // Its data is still arriving into the buffer being released: the
            // stream cannot be followed any more.
            self.direct = None;
            self.close_socket();
        }
    }
}

impl<W: Wire> TcpLink<W> {
    /// Sends a command's controller-to-host data (`c2h_len` bytes, from the
    /// device buffer `read_buf` or the admin `reply`) in one C2HData PDU.
    /// Returns true if the PDU carried SUCCESS, standing for the response.
    #[inline]
    fn send_c2h(
        &mut self,
        cqe: &Cqe,
        read_buf: Option<(IoBuf, usize)>,
        reply: Option<Vec<u8>>,
        c2h_len: usize,
    ) -> bool {
        // SUCCESS skips the CapsuleResp and its SQ head update; hosts over
        // TCP do not use SQ head (SPDK sends SUCCESS the same way). The
        // host then assumes a zero DW0/DW1, so a result (a KV Retrieve's
        // value size) needs the CapsuleResp.
        let success = self.c2h_success && cqe.result == 0;
        let mut flags = pdu::flags::LAST_PDU;
        if success {
            flags |= pdu::flags::SUCCESS;
        }
        let hdr = DataHeader {
            cccid: cqe.cid,
            ttag: 0,
            offset: 0,
            length: c2h_len as u32,
        };
        pdu::encode_data_pdu_header(
            &mut self.out.bytes,
            false,
            &hdr,
            c2h_len,
            flags,
            self.digests,
            self.hpda_align,
        );
        let digest = match (read_buf, reply) {
            (Some((b, n)), _) => {
                let d = self.digests.data.then(|| pdu::crc32c(&b[..n]));
                self.out.push_buf(b, n);
                d
            }
            (None, Some(d)) => {
                self.out.bytes.extend_from_slice(&d);
                self.digests.data.then(|| pdu::crc32c(&d))
            }
            (None, None) => None,
        };
        if let Some(d) = digest {
            self.out.bytes.extend_from_slice(&d.to_le_bytes());
        }
        success
    }
}

impl<W: Wire> Link<TcpReq> for TcpLink<W> {
    // #[inline]: the core's `Queue::respond` calls it once per command, in this
    // crate's instance of it; kept apart it cost a 4 KiB read about 30
    // instructions (callgrind).
    #[inline]
    fn respond(
        &mut self,
        slot: u16,
        req: &mut Request<TcpReq>,
        rsp: &Response,
        _ctx: &mut IoCtx,
    ) -> Release {
        self.leave_r2t(slot, &mut req.x);
        self.unstage(&mut req.x);
        if self.state == ConnState::Closed {
            return Release::Now;
        }
        let cid = rsp.cqe.cid;
        // Read data goes out from its device buffer (no copy); admin replies
        // are small and encoded inline.
        let (read_buf, reply) = match rsp.c2h {
            C2h::Data(n) => (req.buf.take().map(|b| (b, n)), None),
            C2h::Reply => (None, req.reply.take()),
            C2h::None => (None, None),
        };
        let mut held = false;
        let read_buf = match read_buf {
            Some((b, n)) if n.min(b.len()) > self.max_c2h_data => {
                held = true;
                // Framed piece by piece as the socket takes it (`feed_c2h`).
                self.c2h_held.push_back(HeldC2h {
                    cid,
                    len: n.min(b.len()),
                    success: self.c2h_success && rsp.cqe.result == 0,
                    cqe: rsp.cqe,
                });
                self.out.hold(b, n);
                None
            }
            other => other,
        };
        let c2h_len = match (&read_buf, &reply) {
            (Some((_, n)), _) => *n,
            (None, Some(d)) => d.len(),
            (None, None) => 0,
        };
        let sent_success = c2h_len > 0 && self.send_c2h(&rsp.cqe, read_buf, reply, c2h_len);
        if !sent_success && !held {
            pdu::encode_capsule_resp(&mut self.out.bytes, &rsp.cqe, self.digests);
        }
        if rsp.close_after {
            self.set_state(ConnState::Terminating);
        }
        Release::Now
    }

    fn respond_unslotted(&mut self, cqe: &Cqe) {
        if self.state != ConnState::Closed {
            pdu::encode_capsule_resp(&mut self.out.bytes, cqe, self.digests);
        }
    }

    fn discard(&mut self, slot: u16, req: &mut Request<TcpReq>, _ctx: &mut IoCtx) {
        self.leave_r2t(slot, &mut req.x);
        self.unstage(&mut req.x);
    }
}

impl<W: Wire> TcpConnection<W> {
    /// A connection over `sock` (a `TcpStream`, or a `TlsWire` on one).
    pub fn new(sock: W, target: Arc<Target>, discovery_only: bool) -> std::io::Result<Self> {
        let tcp = sock.socket();
        tcp.set_nonblocking(true)?;
        tcp.set_nodelay(true)?;
        let lim = &target.limits;
        kvt_reactor::sys::set_socket_buffers(
            tcp.as_raw_fd(),
            (lim.recv_buf_size > 0).then_some(lim.recv_buf_size),
            (lim.send_buf_size > 0).then_some(lim.send_buf_size),
        )?;
        let peer = tcp
            .peer_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| "unknown".into());
        let max_data = (lim.max_h2c_data as usize)
            .max(lim.in_capsule_data as usize)
            .max(ADMIN_IN_CAPSULE_DATA as usize);
        let rcap = max_data + 64 * 1024;
        let l = TcpLink {
            peer: peer.clone(),
            state: ConnState::AwaitIcReq,
            state_since: Instant::now(),
            digests: Digests::default(),
            hpda_align: 0,
            c2h_success: lim.c2h_success,
            maxh2cdata: lim.max_h2c_data,
            max_r2t_len: lim.max_r2t_len as usize,
            max_r2t_active: usize::from(lim.max_active_r2ts.max(1)),
            rbuf: kvt_mem::prefaulted_vec(rcap),
            rstart: 0,
            rend: 0,
            out: OutQueue::with_capacity(256 * 1024),
            r2t_active: 0,
            r2t_waiting: VecDeque::new(),
            read_staged: 0,
            read_waiting: VecDeque::new(),
            max_c2h_data: (lim.max_c2h_data as usize).max(4096),
            c2h_held: VecDeque::new(),
            direct: None,
            limits: ParseLimits { max_data },
            shutting_down: false,
            sock,
        };
        let cfg = QueueConfig {
            kind: TransportKind::Tcp,
            local: l.sock.socket().local_addr().ok(),
            peer,
            discovery_only,
            expected_qid: None,
            max_entries: None,
            exact_capsule: true,
            places_read_buffers: false,
        };
        Ok(TcpConnection {
            q: Queue::new(target, cfg),
            l,
        })
    }

    /// Closes now: the association ends, in-flight device I/O is still reaped.
    fn close(&mut self) {
        self.q.unbind();
        self.l.close_socket();
    }

    /// The link closed the socket on its own (a read or write failed, the peer
    /// went): the queue lets go of its controller too.
    fn sync_closed(&mut self) {
        if self.l.state == ConnState::Closed {
            self.q.unbind();
        }
    }

    fn terminate(&mut self, err: PduError, offending: &[u8]) {
        tracing::debug!(peer = %self.l.peer, qid = self.q.qid(), "terminating");
        self.l.terminate(err, offending);
    }

    fn read_socket(&mut self) -> bool {
        // Compact when the unread tail is near the end.
        if self.l.rstart > 0
            && (self.l.rstart == self.l.rend || self.l.rbuf.len() - self.l.rend < 16 * 1024)
        {
            self.l.rbuf.copy_within(self.l.rstart..self.l.rend, 0);
            self.l.rend -= self.l.rstart;
            self.l.rstart = 0;
        }
        let mut got_any = false;
        while self.l.rend < self.l.rbuf.len() {
            let res = match self.l.direct {
                Some(d) if d.got < d.len => self.read_direct(d),
                _ => self
                    .l
                    .sock
                    .read(&mut self.l.rbuf[self.l.rend..])
                    .inspect(|&n| self.l.rend += n),
            };
            match res {
                Ok(0) => {
                    tracing::debug!(peer = %self.l.peer, "peer closed the connection");
                    self.close();
                    return got_any;
                }
                Ok(_) => got_any = true,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::debug!(peer = %self.l.peer, "read: {e}");
                    self.close();
                    return got_any;
                }
            }
        }
        got_any
    }

    /// Whether the wire holds input the socket's readiness does not show, and
    /// there is room and reason to take it now.
    fn more_buffered(&self) -> bool {
        self.l.sock.buffered()
            && matches!(self.l.state, ConnState::AwaitIcReq | ConnState::Ready)
            && self.l.rend < self.l.rbuf.len()
            && self.l.out.sendable() <= MAX_PENDING_OUTPUT
    }

    /// One read for a direct receive: the rest of the PDU's data into the command
    /// buffer, and whatever follows into the receive buffer. Returns the bytes
    /// read, as `read` does, having accounted for both parts.
    fn read_direct(&mut self, d: DirectReceive) -> std::io::Result<usize> {
        let Some(buf) = self.q.request_mut(d.slot).and_then(|r| r.buf.as_mut()) else {
            return Err(std::io::Error::other("direct receive into a freed slot"));
        };
        let dst = &mut buf[d.start + d.got..d.start + d.len];
        let want = dst.len();
        let mut iov = [
            std::io::IoSliceMut::new(dst),
            std::io::IoSliceMut::new(&mut self.l.rbuf[self.l.rend..]),
        ];
        let n = self.l.sock.read_vectored(&mut iov)?;
        let into_cmd = n.min(want);
        if let Some(dr) = self.l.direct.as_mut() {
            dr.got += into_cmd;
        }
        self.l.rend += n - into_cmd;
        Ok(n)
    }

    fn process_input(&mut self, ctx: &mut IoCtx) {
        loop {
            if !matches!(self.l.state, ConnState::AwaitIcReq | ConnState::Ready) {
                return;
            }
            if self.l.out.sendable() > MAX_PENDING_OUTPUT {
                return;
            }
            if !self.end_direct_receive(ctx) || self.start_direct_receive() {
                return;
            }
            let buf = std::mem::take(&mut self.l.rbuf);
            let res = pdu::parse(
                &buf[self.l.rstart..self.l.rend],
                self.l.digests,
                self.l.limits,
            );
            let consumed = match res {
                Ok(None) => {
                    self.l.rbuf = buf;
                    return;
                }
                Ok(Some((p, n))) => {
                    self.handle_pdu(p, &buf[self.l.rstart..self.l.rstart + n], ctx);
                    n
                }
                Err(e) => {
                    let end = (self.l.rstart + pdu::TERM_REQ_MAX_DATA).min(self.l.rend);
                    let offending = buf[self.l.rstart..end].to_vec();
                    self.l.rbuf = buf;
                    self.terminate(e, &offending);
                    return;
                }
            };
            self.l.rbuf = buf;
            self.l.rstart += consumed;
        }
    }

    /// The host's ICReq: answered with ICResp, and the connection is ready.
    fn on_icreq(&mut self, req: pdu::ICReq, raw: &[u8]) {
        if req.pfv != 0 {
            return self.terminate(
                PduError {
                    fes: fes::INVALID_HEADER_FIELD,
                    fei: 8,
                    reason: "unsupported PDU format version",
                },
                raw,
            );
        }
        if req.hpda > 31 {
            return self.terminate(
                PduError {
                    fes: fes::INVALID_HEADER_FIELD,
                    fei: 10,
                    reason: "HPDA out of range",
                },
                raw,
            );
        }
        self.l.hpda_align = if req.hpda == 0 {
            0
        } else {
            (req.hpda as usize + 1) * 4
        };
        // Tell the host our limit before switching digests on for us.
        pdu::encode_icresp(
            &mut self.l.out.bytes,
            &ICResp {
                pfv: 0,
                cpda: 0,
                digests: req.digests,
                maxh2cdata: self.l.maxh2cdata,
            },
        );
        self.l.digests = req.digests;
        self.l.set_state(ConnState::Ready);
        // Connect checks the host and subsystem against the PSK identity.
        self.q.set_secure_peer(self.l.sock.secure_peer().cloned());
    }

    fn handle_pdu(&mut self, p: Pdu, raw: &[u8], ctx: &mut IoCtx) {
        let seq_err = |reason| PduError {
            fes: fes::PDU_SEQUENCE_ERROR,
            fei: 0,
            reason,
        };
        match (self.l.state, p) {
            (ConnState::AwaitIcReq, Pdu::ICReq(req)) => self.on_icreq(req, raw),
            (ConnState::AwaitIcReq, _) => self.terminate(seq_err("expected ICReq first"), raw),
            (_, Pdu::ICReq(_)) => self.terminate(seq_err("second ICReq"), raw),
            (_, Pdu::TermReq { fes, fei, .. }) => {
                tracing::warn!(peer = %self.l.peer, fes, fei, "host terminated the connection");
                self.close();
            }
            (
                _,
                Pdu::CapsuleCmd {
                    sqe,
                    data,
                    data_digest_error,
                },
            ) => self.on_command(sqe, data, data_digest_error, raw, ctx),
            (
                _,
                Pdu::H2CData {
                    hdr,
                    data,
                    data_digest_error,
                    ..
                },
            ) => self.on_h2c_data(hdr, data, data_digest_error, raw, ctx),
            (_, Pdu::ICResp(_) | Pdu::CapsuleResp(_) | Pdu::C2HData { .. } | Pdu::R2T(_)) => self
                .terminate(
                    PduError {
                        fes: fes::INVALID_HEADER_FIELD,
                        fei: 0,
                        reason: "controller-to-host PDU sent by the host",
                    },
                    raw,
                ),
        }
    }

    fn on_command(&mut self, sqe: Sqe, data: &[u8], data_error: bool, raw: &[u8], ctx: &mut IoCtx) {
        let staged = self.staged_read_len(&sqe);
        if let Some(len) = staged {
            // Only a plain read waits: one with in-capsule data (refused) or
            // a bad digest is answered now.
            let plain = data.is_empty() && !data_error;
            let small = len <= UNSTAGED_READ_MAX;
            if plain && !small && (!self.l.read_waiting.is_empty() || !self.l.read_room(len)) {
                // Bounded by the queue's entries: a host sending more than
                // that is told so by `receive` (Overrun), not queued here.
                if self.l.read_waiting.len() < self.q.slot_limit() {
                    self.l.read_waiting.push_back((sqe, ctx.now_ns));
                    return;
                }
            }
        }
        let now_ns = ctx.now_ns;
        self.pass_to_queue(sqe, data, data_error, now_ns, staged, raw, ctx);
    }

    /// Hands a command to the queue (`staged`: the read bytes it counts in
    /// `read_staged`) and starts what the queue asks for next.
    #[allow(clippy::too_many_arguments)]
    fn pass_to_queue(
        &mut self,
        sqe: Sqe,
        data: &[u8],
        data_error: bool,
        arrived_ns: u64,
        staged: Option<usize>,
        raw: &[u8],
        ctx: &mut IoCtx,
    ) {
        let mut x = TcpReq::default();
        // A reused CID is answered without a request: nothing to count.
        if let Some(len) = staged.filter(|_| !self.q.cid_outstanding(sqe.cid())) {
            x.staged = len;
            self.l.read_staged += len;
        }
        let capsule = Capsule {
            desc: data_desc(&sqe),
            sqe: &sqe,
            icd: data,
            icd_corrupt: data_error,
            x,
        };
        match self.q.receive_at(capsule, arrived_ns, &mut self.l, ctx) {
            Received::Done => {}
            Received::Overrun => self.terminate(
                PduError {
                    fes: fes::PDU_SEQUENCE_ERROR,
                    fei: 0,
                    reason: "more commands outstanding than the queue size",
                },
                raw,
            ),
            Received::NeedData {
                slot,
                len,
                dir: DataDirection::HostToController,
            } => {
                let b = ctx.bufs.get(len);
                if let Some(r) = self.q.request_mut(slot) {
                    r.buf = Some(b);
                    r.x.h2c_len = len;
                    r.x.h2c = H2cState::AwaitingR2tSlot;
                }
                self.l.r2t_waiting.push_back(slot);
                self.issue_r2ts();
            }
            // Read buffers come from the pool (`places_read_buffers` is off).
            Received::NeedData { slot, .. } => self.q.data_ready(slot, false, &mut self.l, ctx),
        }
    }

    /// The bytes a read-type command on an I/O queue moves to the host (Read,
    /// KV Retrieve), which count against `READ_STAGING`.
    fn staged_read_len(&self, sqe: &Sqe) -> Option<usize> {
        let len = sqe.sgl().length as usize;
        (len > 0
            && !self.q.is_admin()
            && sqe.opcode() != kvt_wire::nvme::admin_opc::FABRICS
            && DataDirection::of(sqe) == DataDirection::ControllerToHost)
            .then_some(len)
    }

    /// Admits waiting reads while there is staging room.
    fn start_waiting_reads(&mut self, ctx: &mut IoCtx) -> bool {
        let mut started = false;
        while let Some(&(sqe, arrived_ns)) = self.l.read_waiting.front() {
            if self.l.state != ConnState::Ready {
                self.l.read_waiting.clear();
                break;
            }
            let len = self.staged_read_len(&sqe).unwrap_or(0);
            if !self.l.read_room(len) {
                break;
            }
            self.l.read_waiting.pop_front();
            self.pass_to_queue(sqe, &[], false, arrived_ns, Some(len), &[], ctx);
            started = true;
        }
        started
    }

    /// Starts R2T transfers for waiting writes while under the limit.
    fn issue_r2ts(&mut self) {
        while self.l.r2t_active < self.l.max_r2t_active {
            let Some(slot) = self.l.r2t_waiting.pop_front() else {
                return;
            };
            self.l.r2t_active += 1;
            self.send_next_r2t(slot);
        }
    }

    fn send_next_r2t(&mut self, slot: u16) {
        let max = self.l.max_r2t_len;
        let Some(r) = self.q.request_mut(slot) else {
            return;
        };
        let x = &mut r.x;
        x.h2c = H2cState::AwaitingData;
        x.r2t_off = x.h2c_received;
        x.r2t_len = (x.h2c_len - x.h2c_received).min(max);
        let hdr = DataHeader {
            cccid: r.sqe.cid(),
            ttag: slot,
            offset: x.r2t_off as u32,
            length: x.r2t_len as u32,
        };
        pdu::encode_r2t(&mut self.l.out.bytes, &hdr, self.l.digests);
    }

    /// Checks an H2CData header against the R2T it answers.
    fn check_h2c(&self, hdr: &DataHeader, data_len: usize) -> Result<(), PduError> {
        let r = match self.q.request(hdr.ttag) {
            Some(r) if r.x.h2c == H2cState::AwaitingData && r.sqe.cid() == hdr.cccid => r,
            _ => {
                return Err(PduError {
                    fes: fes::INVALID_HEADER_FIELD,
                    fei: 10,
                    reason: "H2CData for no outstanding R2T",
                })
            }
        };
        if data_len > self.l.maxh2cdata as usize {
            return Err(PduError {
                fes: fes::DATA_LIMIT_EXCEEDED,
                fei: 16,
                reason: "H2CData larger than MAXH2CDATA",
            });
        }
        let off = hdr.offset as usize;
        // Data must arrive in order within the current R2T window.
        if off != r.x.h2c_received || off + data_len > r.x.r2t_off + r.x.r2t_len {
            return Err(PduError {
                fes: fes::DATA_OUT_OF_RANGE,
                fei: 12,
                reason: "H2CData outside the R2T window",
            });
        }
        Ok(())
    }

    fn on_h2c_data(
        &mut self,
        hdr: DataHeader,
        data: &[u8],
        digest_error: bool,
        raw: &[u8],
        ctx: &mut IoCtx,
    ) {
        if let Err(e) = self.check_h2c(&hdr, data.len()) {
            return self.terminate(e, raw);
        }
        let slot = hdr.ttag;
        let off = hdr.offset as usize;
        if let Some(b) = self.q.request_mut(slot).and_then(|r| r.buf.as_mut()) {
            b[off..off + data.len()].copy_from_slice(data);
        }
        self.h2c_arrived(slot, data.len(), digest_error, ctx);
    }

    /// `len` more bytes of host data for `slot` are in its buffer: ask for the
    /// next window, or run the command once all is there.
    fn h2c_arrived(&mut self, slot: u16, len: usize, digest_error: bool, ctx: &mut IoCtx) {
        let Some(r) = self.q.request_mut(slot) else {
            return;
        };
        let x = &mut r.x;
        x.h2c_received += len;
        x.data_error |= digest_error;
        if x.h2c_received < x.r2t_off + x.r2t_len {
            return;
        }
        if x.h2c_received < x.h2c_len {
            return self.send_next_r2t(slot);
        }
        x.h2c = H2cState::Idle;
        let corrupt = x.data_error;
        self.l.r2t_active -= 1;
        self.issue_r2ts();
        self.q.data_ready(slot, corrupt, &mut self.l, ctx);
    }

    /// When a large H2CData PDU's header has arrived but its data has not, takes
    /// what data is here and has the rest received straight into the command's
    /// buffer (no copy through the receive buffer). Returns true when it did.
    fn start_direct_receive(&mut self) -> bool {
        let l = &self.l;
        let avail = &l.rbuf[l.rstart..l.rend];
        // Most PDUs are command capsules: look at the type byte before
        // framing (the ordinary path frames it once more).
        if avail.first() != Some(&pdu::pdu_type::H2C_DATA) {
            return false;
        }
        let Ok(Some(head)) = pdu::parse_data_pdu_head(avail, l.digests, l.limits) else {
            return false;
        };
        let have = avail.len() - head.pdo;
        if !head.h2c || head.data_len < DIRECT_RECEIVE_MIN || have >= head.data_len {
            return false;
        }
        // Anything wrong is refused by the ordinary path once the PDU is whole.
        if self.check_h2c(&head.hdr, head.data_len).is_err() {
            return false;
        }
        let slot = head.hdr.ttag;
        let off = head.hdr.offset as usize;
        let Some(buf) = self.q.request_mut(slot).and_then(|r| r.buf.as_mut()) else {
            return false;
        };
        let l = &mut self.l;
        let from = l.rstart + head.pdo;
        buf[off..off + have].copy_from_slice(&l.rbuf[from..from + have]);
        l.rstart = l.rend;
        l.direct = Some(DirectReceive {
            slot,
            start: off,
            len: head.data_len,
            got: have,
            ddgst: head.ddgst,
        });
        true
    }

    /// Finishes a direct receive whose data (and digest) are all here. Returns
    /// false while bytes are still missing.
    fn end_direct_receive(&mut self, ctx: &mut IoCtx) -> bool {
        let Some(d) = self.l.direct else {
            return true;
        };
        if d.got < d.len || self.l.rend - self.l.rstart < d.ddgst {
            return false;
        }
        self.l.direct = None;
        let mut digest_error = false;
        if d.ddgst != 0 {
            let at = self.l.rstart;
            let rb = &self.l.rbuf;
            let want = u32::from_le_bytes([rb[at], rb[at + 1], rb[at + 2], rb[at + 3]]);
            self.l.rstart += d.ddgst;
            if let Some(b) = self.q.request(d.slot).and_then(|r| r.buf.as_ref()) {
                digest_error = pdu::crc32c(&b[d.start..d.start + d.len]) != want;
            }
        }
        self.h2c_arrived(d.slot, d.len, digest_error, ctx);
        true
    }
}

impl<W: Wire> QueuePair for TcpConnection<W> {
    fn fd(&self) -> RawFd {
        self.l.sock.socket().as_raw_fd()
    }

    fn on_readable(&mut self, ctx: &mut IoCtx) {
        if !matches!(self.l.state, ConnState::AwaitIcReq | ConnState::Ready) {
            // Drain and discard: a terminated connection reads nothing more.
            let mut sink = [0u8; 4096];
            loop {
                match self.l.sock.read(&mut sink) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
            return;
        }
        loop {
            self.read_socket();
            self.process_input(ctx);
            if !self.more_buffered() {
                break;
            }
        }
        if self.l.awaiting_host_data() {
            // The host is streaming write data and may be blocked on a full send
            // buffer until this data is acknowledged (SPDK's ssl host keeps 8 KiB,
            // its posix one 2 MiB against 4 MiB writes). Linux would hold the ACK
            // for its 40 ms delayed-ACK timer: records and PDU tails are smaller
            // than loopback's MSS and the connection counts as interactive. A
            // command without such data gets its ACK on the response instead.
            let _ = kvt_reactor::sys::set_quickack(self.l.sock.socket().as_raw_fd());
        }
        self.sync_closed();
    }

    fn on_io_complete(
        &mut self,
        slot: u16,
        result: Result<(), i32>,
        buf: Option<IoBuf>,
        ctx: &mut IoCtx,
    ) {
        self.q.io_complete(slot, result, buf, &mut self.l, ctx);
        self.sync_closed();
    }

    fn on_polled(&mut self, event: &dyn std::any::Any, ctx: &mut IoCtx) {
        if let Some(a) = event.downcast_ref::<kvt_pool::kv_index::KvAnswered>() {
            self.q.kv_answer(a.slot, a.answer.take(), &mut self.l, ctx);
            self.sync_closed();
        }
    }

    fn flush(&mut self, bufs: &mut BufPool) -> bool {
        let l = &mut self.l;
        if l.state == ConnState::Closed {
            l.out.clear(bufs);
            l.c2h_held.clear();
            return false;
        }
        let mut written = 0;
        let budget = FLUSH_BUDGET_PDUS * l.max_c2h_data;
        while !l.out.is_empty() && written < budget {
            l.feed_c2h();
            match l.out.write_to(&mut l.sock, bufs) {
                Ok(0) => {
                    l.close_socket();
                    l.out.clear(bufs);
                    l.c2h_held.clear();
                    break;
                }
                Ok(n) => written += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::debug!(peer = %l.peer, "write: {e}");
                    l.close_socket();
                    l.out.clear(bufs);
                    l.c2h_held.clear();
                    break;
                }
            }
        }
        if l.out.is_empty() && l.state == ConnState::Terminating {
            l.close_socket();
        }
        let more = !self.l.out.is_empty();
        self.sync_closed();
        more
    }

    fn after_flush(&mut self, ctx: &mut IoCtx) -> bool {
        if self.l.read_waiting.is_empty() {
            return false;
        }
        let started = self.start_waiting_reads(ctx);
        self.sync_closed();
        started
    }

    fn wants_poll(&self) -> bool {
        // Output is `flush`'s (it reports it too); reads waiting for room are
        // `after_flush`'s; a connection on its way out is polled until released.
        !self.l.out.is_empty()
            || !self.l.c2h_held.is_empty()
            || !self.l.read_waiting.is_empty()
            || !matches!(self.l.state, ConnState::AwaitIcReq | ConnState::Ready)
    }

    fn housekeeping(&mut self, ctx: &mut IoCtx) {
        match self.l.state {
            ConnState::AwaitIcReq if self.l.state_since.elapsed() > IC_TIMEOUT => {
                tracing::warn!(peer = %self.l.peer, "no ICReq within {IC_TIMEOUT:?}; closing");
                self.close();
            }
            ConnState::Terminating if self.l.state_since.elapsed() > TERMINATE_LINGER => {
                self.close()
            }
            _ => {}
        }
        if self.q.housekeeping(&mut self.l, ctx).is_some() {
            self.close();
        }
        if self.l.shutting_down
            && self.q.dev_ops() == 0
            && matches!(self.l.state, ConnState::AwaitIcReq | ConnState::Ready)
        {
            // Answers already queued go out first; `flush` closes after them.
            self.l.set_state(ConnState::Terminating);
        }
        // Input may be waiting behind back-pressure that has now cleared.
        if self.l.state == ConnState::Ready && self.l.rstart < self.l.rend {
            self.process_input(ctx);
        }
        while self.more_buffered() {
            self.read_socket();
            self.process_input(ctx);
        }
        self.sync_closed();
    }

    fn begin_shutdown(&mut self) {
        // In-flight device I/O completes and is answered; then the connection
        // closes (housekeeping), and the host reconnects after the restart.
        self.l.shutting_down = true;
        if self.q.dev_ops() == 0 {
            self.l.set_state(ConnState::Terminating);
        }
    }

    fn finished(&self) -> bool {
        self.l.state == ConnState::Closed && self.q.dev_ops() == 0
    }

    fn describe(&self) -> String {
        format!("nvme/tcp {} qid {}", self.l.peer, self.q.qid())
    }
}
