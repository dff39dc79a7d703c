//! NVMe/TCP queue pairs: one TCP connection is one NVMe queue (admin or I/O).
//!
//! A connection is a state machine driven by its reactor: bytes in → PDUs →
//! requests → device operations → completions → PDUs out. Each request lives in a
//! slot (its index is the R2T transfer tag and the device operation tag), so
//! nothing on this path allocates once buffers are warm.

use crate::bdev::IoOp;
use crate::mem::{BufPool, IoBuf};
use crate::nvmf::admin::{self, AdminOutcome};
use crate::nvmf::command;
use crate::nvmf::fabrics::{self, QueueBinding};
use crate::nvmf::io::{self as tio, IoPlan};
use crate::nvmf::{Namespace, Target, ADMIN_IN_CAPSULE_DATA};
use crate::reactor::{IoCtx, QueuePair};
use crate::transport::out::OutQueue;
use crate::wire::nvme::{
    admin_opc, fctype, ConnectCommand, ConnectData, Cqe, DataDirection, SglDescriptor, Sqe, Status,
    CATTR_DISABLE_SQ_FLOW, CONNECT_DATA_LEN,
};
use crate::wire::tcp::{self as pdu, fes, DataHeader, Digests, ICResp, ParseLimits, Pdu, PduError};
use std::io::{ErrorKind, Read};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Status for a command whose data failed its digest: the host retries it.
const TRANSIENT_TRANSPORT_ERROR: Status = Status::generic(0x22);
/// Stop reading new PDUs while this much output is queued (back-pressure).
const MAX_PENDING_OUTPUT: usize = 8 << 20;
/// Longest wait for the ICReq, and for a terminated connection to drain.
const IC_TIMEOUT: Duration = Duration::from_secs(10);
const TERMINATE_LINGER: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ConnState {
    /// Waiting for ICReq.
    AwaitIcReq,
    Ready,
    /// A TermReq was queued (or the peer went away): flush, then close.
    Terminating,
    Closed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReqState {
    /// Waiting for host data through R2T/H2CData.
    AwaitingData,
    /// Waiting for an R2T slot (bounded outstanding R2Ts per connection).
    AwaitingR2tSlot,
    /// Device operations outstanding.
    Executing,
}

struct Request {
    sqe: Sqe,
    state: ReqState,
    /// Data buffer: host data for writes, device data for reads.
    buf: Option<IoBuf>,
    /// Controller-to-host data produced by an admin command.
    reply: Option<Vec<u8>>,
    /// Bytes of host data expected in total, and received so far.
    h2c_len: usize,
    h2c_received: usize,
    /// The current R2T window [r2t_off, r2t_off + r2t_len).
    r2t_off: usize,
    r2t_len: usize,
    plan: Option<IoPlan>,
    ns: Option<Arc<Namespace>>,
    /// Device operations still outstanding.
    pending_ops: u32,
    status: Status,
    /// The data failed its digest; finish receiving, then fail the command.
    data_error: bool,
    /// When the capsule arrived (queue-pair latency metrics).
    arrived: std::time::Instant,
}

pub struct TcpConnection {
    sock: TcpStream,
    peer: String,
    target: Arc<Target>,
    discovery_only: bool,
    state: ConnState,
    state_since: Instant,
    digests: Digests,
    /// Host PDU data alignment in bytes (from HPDA), 0 for none.
    hpda_align: usize,
    rbuf: Vec<u8>,
    rstart: usize,
    rend: usize,
    /// Output: encoded PDUs interleaved with read data still in its buffers.
    out: OutQueue,
    binding: Option<QueueBinding>,
    namespaces: Vec<Arc<Namespace>>,
    /// The subsystem's namespace generation the snapshot above was taken at.
    ns_gen: u64,
    /// This queue pair's counters, once connected.
    stats: Option<Arc<crate::nvmf::QpairStats>>,
    sq_head: u16,
    sqsize: u16,
    sqflow_disabled: bool,
    slots: Vec<Option<Request>>,
    free_slots: Vec<u16>,
    cids: CidSet,
    aers: Vec<u16>,
    r2t_active: usize,
    r2t_waiting: std::collections::VecDeque<u16>,
    max_r2t_active: usize,
    dev_ops: usize,
    /// Failed device operations so far (for rate-limited logging).
    device_errors: u64,
    ops_scratch: Vec<(Arc<Namespace>, IoOp)>,
    direct: Option<DirectReceive>,
    limits: ParseLimits,
    shutting_down: bool,
}

/// H2CData at least this large is received straight into the command's buffer.
const DIRECT_RECEIVE_MIN: usize = 16 * 1024;

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

/// Which command IDs are outstanding, to refuse duplicates.
struct CidSet(Vec<u64>);

impl CidSet {
    fn new() -> CidSet {
        CidSet(vec![0; 1024])
    }
    fn insert(&mut self, cid: u16) -> bool {
        let (w, b) = (cid as usize / 64, cid % 64);
        let fresh = self.0[w] & (1 << b) == 0;
        self.0[w] |= 1 << b;
        fresh
    }
    fn remove(&mut self, cid: u16) {
        self.0[cid as usize / 64] &= !(1 << (cid % 64));
    }
}

impl TcpConnection {
    pub fn new(
        sock: TcpStream,
        target: Arc<Target>,
        discovery_only: bool,
    ) -> std::io::Result<Self> {
        sock.set_nonblocking(true)?;
        sock.set_nodelay(true)?;
        let peer = sock
            .peer_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| "unknown".into());
        let lim = &target.limits;
        let max_data = (lim.max_h2c_data as usize)
            .max(lim.in_capsule_data as usize)
            .max(ADMIN_IN_CAPSULE_DATA as usize);
        let rcap = max_data + 64 * 1024;
        Ok(TcpConnection {
            sock,
            peer,
            discovery_only,
            state: ConnState::AwaitIcReq,
            state_since: Instant::now(),
            digests: Digests::default(),
            hpda_align: 0,
            rbuf: vec![0; rcap],
            rstart: 0,
            rend: 0,
            out: OutQueue::with_capacity(256 * 1024),
            binding: None,
            namespaces: Vec::new(),
            ns_gen: 0,
            stats: None,
            sq_head: 0,
            sqsize: 31,
            sqflow_disabled: false,
            slots: Vec::new(),
            free_slots: Vec::new(),
            cids: CidSet::new(),
            aers: Vec::new(),
            r2t_active: 0,
            r2t_waiting: Default::default(),
            max_r2t_active: 32,
            dev_ops: 0,
            device_errors: 0,
            ops_scratch: Vec::with_capacity(4),
            direct: None,
            limits: ParseLimits { max_data },
            shutting_down: false,
            target,
        })
    }

    fn qid(&self) -> u16 {
        self.binding.as_ref().map(|b| b.qid()).unwrap_or(0)
    }

    fn is_admin(&self) -> bool {
        matches!(self.binding, Some(QueueBinding::Admin(_)) | None)
    }

    fn set_state(&mut self, s: ConnState) {
        if self.state != s {
            self.state = s;
            self.state_since = Instant::now();
        }
    }

    /// Queues a C2HTermReq and stops processing input.
    fn terminate(&mut self, err: PduError, offending: &[u8]) {
        tracing::warn!(peer = %self.peer, qid = self.qid(), "terminating connection: {err}");
        let hdr = &offending[..offending.len().min(pdu::TERM_REQ_MAX_DATA)];
        pdu::encode_term_req(&mut self.out.bytes, false, err.fes, err.fei, hdr);
        self.set_state(ConnState::Terminating);
    }

    /// Closes now: the association ends, in-flight device I/O is still reaped.
    fn close(&mut self) {
        if self.state == ConnState::Closed {
            return;
        }
        if let Some(b) = self.binding.take() {
            let ctrl = b.ctrl();
            if b.qid() == 0 {
                tracing::info!(
                    cntlid = ctrl.cntlid,
                    host = %ctrl.hostnqn,
                    subnqn = %ctrl.subsys.nqn,
                    peer = %self.peer,
                    "controller released"
                );
            }
            fabrics::disconnect(&b);
        }
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
        self.set_state(ConnState::Closed);
    }

    fn read_socket(&mut self) -> bool {
        // Compact when the unread tail is near the end.
        if self.rstart > 0 && (self.rstart == self.rend || self.rbuf.len() - self.rend < 16 * 1024)
        {
            self.rbuf.copy_within(self.rstart..self.rend, 0);
            self.rend -= self.rstart;
            self.rstart = 0;
        }
        let mut got_any = false;
        while self.rend < self.rbuf.len() {
            let res = match self.direct {
                Some(d) if d.got < d.len => self.read_direct(d),
                _ => self
                    .sock
                    .read(&mut self.rbuf[self.rend..])
                    .inspect(|&n| self.rend += n),
            };
            match res {
                Ok(0) => {
                    tracing::debug!(peer = %self.peer, "peer closed the connection");
                    self.close();
                    return got_any;
                }
                Ok(_) => got_any = true,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::debug!(peer = %self.peer, "read: {e}");
                    self.close();
                    return got_any;
                }
            }
        }
        got_any
    }

    /// One read for a direct receive: the rest of the PDU's data into the command
    /// buffer, and whatever follows into the receive buffer. Returns the bytes
    /// read, as `read` does, having accounted for both parts.
    fn read_direct(&mut self, d: DirectReceive) -> std::io::Result<usize> {
        let Some(buf) = self.slots[d.slot as usize]
            .as_mut()
            .and_then(|r| r.buf.as_mut())
        else {
            return Err(std::io::Error::other("direct receive into a freed slot"));
        };
        let dst = &mut buf[d.start + d.got..d.start + d.len];
        let want = dst.len();
        let mut iov = [
            std::io::IoSliceMut::new(dst),
            std::io::IoSliceMut::new(&mut self.rbuf[self.rend..]),
        ];
        let n = self.sock.read_vectored(&mut iov)?;
        let into_cmd = n.min(want);
        if let Some(dr) = self.direct.as_mut() {
            dr.got += into_cmd;
        }
        self.rend += n - into_cmd;
        Ok(n)
    }

    fn process_input(&mut self, ctx: &mut IoCtx) {
        loop {
            if !matches!(self.state, ConnState::AwaitIcReq | ConnState::Ready) {
                return;
            }
            if self.out.pending() > MAX_PENDING_OUTPUT {
                return;
            }
            if !self.end_direct_receive(ctx) || self.start_direct_receive() {
                return;
            }
            let buf = std::mem::take(&mut self.rbuf);
            let res = pdu::parse(&buf[self.rstart..self.rend], self.digests, self.limits);
            let consumed = match res {
                Ok(None) => {
                    self.rbuf = buf;
                    return;
                }
                Ok(Some((p, n))) => {
                    self.handle_pdu(p, &buf[self.rstart..self.rstart + n], ctx);
                    n
                }
                Err(e) => {
                    let end = (self.rstart + pdu::TERM_REQ_MAX_DATA).min(self.rend);
                    let offending = buf[self.rstart..end].to_vec();
                    self.rbuf = buf;
                    self.terminate(e, &offending);
                    return;
                }
            };
            self.rbuf = buf;
            self.rstart += consumed;
        }
    }

    fn handle_pdu(&mut self, p: Pdu, raw: &[u8], ctx: &mut IoCtx) {
        let seq_err = |reason| PduError {
            fes: fes::PDU_SEQUENCE_ERROR,
            fei: 0,
            reason,
        };
        match (self.state, p) {
            (ConnState::AwaitIcReq, Pdu::ICReq(req)) => {
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
                self.hpda_align = if req.hpda == 0 {
                    0
                } else {
                    (req.hpda as usize + 1) * 4
                };
                // Tell the host our limit before switching digests on for us.
                pdu::encode_icresp(
                    &mut self.out.bytes,
                    &ICResp {
                        pfv: 0,
                        cpda: 0,
                        digests: req.digests,
                        maxh2cdata: self.target.limits.max_h2c_data,
                    },
                );
                self.digests = req.digests;
                self.set_state(ConnState::Ready);
            }
            (ConnState::AwaitIcReq, _) => self.terminate(seq_err("expected ICReq first"), raw),
            (_, Pdu::ICReq(_)) => self.terminate(seq_err("second ICReq"), raw),
            (_, Pdu::TermReq { fes, fei, .. }) => {
                tracing::warn!(peer = %self.peer, fes, fei, "host terminated the connection");
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

    fn alloc_slot(&mut self, req: Request) -> Option<u16> {
        let limit = self.sqsize as usize + 1;
        match self.free_slots.pop() {
            Some(i) => {
                self.slots[i as usize] = Some(req);
                Some(i)
            }
            None if self.slots.len() < limit => {
                self.slots.push(Some(req));
                Some((self.slots.len() - 1) as u16)
            }
            None => None,
        }
    }

    fn advance_sq_head(&mut self) {
        self.sq_head = if self.sq_head >= self.sqsize {
            0
        } else {
            self.sq_head + 1
        };
    }

    /// Sends a CapsuleResp for a command that never got a slot.
    fn respond_now(&mut self, cid: u16, status: Status, result: u64) {
        let cqe = self.cqe(cid, status, result);
        pdu::encode_capsule_resp(&mut self.out.bytes, &cqe, self.digests);
    }

    fn cqe(&self, cid: u16, status: Status, result: u64) -> Cqe {
        Cqe {
            result,
            sq_head: if self.sqflow_disabled {
                0xFFFF
            } else {
                self.sq_head
            },
            sq_id: self.qid(),
            cid,
            status: status.to_field(),
        }
    }

    fn on_command(&mut self, sqe: Sqe, data: &[u8], data_error: bool, raw: &[u8], ctx: &mut IoCtx) {
        let cid = sqe.cid();
        self.advance_sq_head();
        if !self.cids.insert(cid) && !admin::abandon_held_aer(&mut self.aers, cid) {
            // The host reused an outstanding CID: answer without disturbing the
            // command that owns it.
            tracing::warn!(peer = %self.peer, cid, "command id conflict");
            return self.respond_now(cid, Status::CID_CONFLICT, 0);
        }
        let req = Request {
            sqe,
            state: ReqState::Executing,
            buf: None,
            reply: None,
            h2c_len: 0,
            h2c_received: 0,
            r2t_off: 0,
            r2t_len: 0,
            plan: None,
            ns: None,
            pending_ops: 0,
            status: Status::SUCCESS,
            data_error,
            arrived: ctx.now,
        };
        let Some(slot) = self.alloc_slot(req) else {
            self.cids.remove(cid);
            return self.terminate(
                PduError {
                    fes: fes::PDU_SEQUENCE_ERROR,
                    fei: 0,
                    reason: "more commands outstanding than the queue size",
                },
                raw,
            );
        };
        if let Err(status) = self.start_command(slot, data, ctx) {
            self.finish(slot, status, 0, ctx);
        }
    }

    /// Validates the command and its data descriptor, takes in-capsule data or
    /// starts R2T, and executes once the data is complete.
    fn start_command(&mut self, slot: u16, data: &[u8], ctx: &mut IoCtx) -> Result<(), Status> {
        let Some(req) = self.slots[slot as usize].as_ref() else {
            return Err(Status::INTERNAL_ERROR);
        };
        let sqe = req.sqe;
        let is_fabrics = sqe.opcode() == admin_opc::FABRICS;
        if self.binding.is_none() && !(is_fabrics && sqe.fctype() == fctype::CONNECT) {
            return Err(Status::COMMAND_SEQUENCE_ERROR);
        }
        if sqe.fuse() != 0 {
            return Err(Status::INVALID_FIELD);
        }
        // I/O commands are checked before any data moves, so a bad write never
        // costs an R2T round trip.
        if !self.is_admin() && !is_fabrics {
            self.refresh_namespaces();
            let ns = self
                .namespaces
                .iter()
                .find(|n| n.nsid == sqe.nsid())
                .cloned();
            let plan = tio::plan(ns.as_deref(), &sqe, self.target.limits.max_io_size)?;
            if let Some(r) = self.slots[slot as usize].as_mut() {
                r.plan = Some(plan);
                r.ns = ns;
            }
        }
        let sgl = sqe.sgl();
        match DataDirection::of(&sqe) {
            DataDirection::None => {}
            DataDirection::Bidirectional => return Err(Status::INVALID_FIELD),
            DataDirection::ControllerToHost => {
                if sgl.length > 0 && sgl.type_byte != SglDescriptor::TRANSPORT {
                    return Err(Status::SGL_DESCRIPTOR_TYPE_INVALID);
                }
                if !data.is_empty() {
                    return Err(Status::INVALID_FIELD);
                }
                if sgl.length > self.target.limits.max_io_size.max(ADMIN_IN_CAPSULE_DATA) {
                    return Err(Status::DATA_SGL_LENGTH_INVALID);
                }
            }
            DataDirection::HostToController => {
                let len = sgl.length as usize;
                if len > 0 {
                    match sgl.type_byte {
                        SglDescriptor::IN_CAPSULE => {
                            let icd_limit = if self.is_admin() {
                                ADMIN_IN_CAPSULE_DATA
                            } else {
                                self.target.limits.in_capsule_data
                            };
                            if sgl.address != 0 {
                                return Err(Status::SGL_OFFSET_INVALID);
                            }
                            if len > icd_limit as usize || data.len() != len {
                                return Err(Status::DATA_SGL_LENGTH_INVALID);
                            }
                            let mut b = ctx.bufs.get(len);
                            b.copy_from_slice(data);
                            if let Some(r) = self.slots[slot as usize].as_mut() {
                                r.buf = Some(b);
                                r.h2c_len = len;
                                r.h2c_received = len;
                            }
                        }
                        SglDescriptor::TRANSPORT => {
                            if !data.is_empty() {
                                return Err(Status::INVALID_FIELD);
                            }
                            if len > self.target.limits.max_io_size as usize {
                                return Err(Status::DATA_SGL_LENGTH_INVALID);
                            }
                            let b = ctx.bufs.get(len);
                            if let Some(r) = self.slots[slot as usize].as_mut() {
                                r.buf = Some(b);
                                r.h2c_len = len;
                                r.state = ReqState::AwaitingR2tSlot;
                            }
                            self.r2t_waiting.push_back(slot);
                            self.issue_r2ts();
                            return Ok(());
                        }
                        _ => return Err(Status::SGL_DESCRIPTOR_TYPE_INVALID),
                    }
                }
            }
        }
        self.execute(slot, ctx)
    }

    /// Starts R2T transfers for waiting writes while under the limit.
    /// Picks up namespaces added or removed at run time (one atomic load per
    /// command when nothing changed).
    fn refresh_namespaces(&mut self) {
        if let Some(b) = self.binding.as_ref() {
            let subsys = &b.ctrl().subsys;
            let gen = subsys.ns_gen.load(Ordering::Acquire);
            if gen != self.ns_gen {
                self.ns_gen = gen;
                self.namespaces = subsys.namespace_snapshot();
            }
        }
    }

    fn issue_r2ts(&mut self) {
        while self.r2t_active < self.max_r2t_active {
            let Some(slot) = self.r2t_waiting.pop_front() else {
                return;
            };
            self.r2t_active += 1;
            self.send_next_r2t(slot);
        }
    }

    fn send_next_r2t(&mut self, slot: u16) {
        let max = self.target.limits.max_r2t_len as usize;
        let Some(r) = self.slots[slot as usize].as_mut() else {
            return;
        };
        r.state = ReqState::AwaitingData;
        r.r2t_off = r.h2c_received;
        r.r2t_len = (r.h2c_len - r.h2c_received).min(max);
        let hdr = DataHeader {
            cccid: r.sqe.cid(),
            ttag: slot,
            offset: r.r2t_off as u32,
            length: r.r2t_len as u32,
        };
        pdu::encode_r2t(&mut self.out.bytes, &hdr, self.digests);
    }

    /// Checks an H2CData header against the R2T it answers.
    fn check_h2c(&self, hdr: &DataHeader, data_len: usize) -> Result<(), PduError> {
        let slot = hdr.ttag;
        let r = match self.slots.get(slot as usize).and_then(|s| s.as_ref()) {
            Some(r) if r.state == ReqState::AwaitingData && r.sqe.cid() == hdr.cccid => r,
            _ => {
                return Err(PduError {
                    fes: fes::INVALID_HEADER_FIELD,
                    fei: 10,
                    reason: "H2CData for no outstanding R2T",
                })
            }
        };
        if data_len > self.target.limits.max_h2c_data as usize {
            return Err(PduError {
                fes: fes::DATA_LIMIT_EXCEEDED,
                fei: 16,
                reason: "H2CData larger than MAXH2CDATA",
            });
        }
        let off = hdr.offset as usize;
        // Data must arrive in order within the current R2T window.
        if off != r.h2c_received || off + data_len > r.r2t_off + r.r2t_len {
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
        if let Some(b) = self.slots[slot as usize]
            .as_mut()
            .and_then(|r| r.buf.as_mut())
        {
            b[off..off + data.len()].copy_from_slice(data);
        }
        self.h2c_arrived(slot, data.len(), digest_error, ctx);
    }

    /// `len` more bytes of host data for `slot` are in its buffer: ask for the
    /// next window, or run the command once all is there.
    fn h2c_arrived(&mut self, slot: u16, len: usize, digest_error: bool, ctx: &mut IoCtx) {
        let Some(r) = self.slots[slot as usize].as_mut() else {
            return;
        };
        r.h2c_received += len;
        r.data_error |= digest_error;
        if r.h2c_received < r.r2t_off + r.r2t_len {
            return;
        }
        if r.h2c_received < r.h2c_len {
            return self.send_next_r2t(slot);
        }
        r.state = ReqState::Executing;
        self.r2t_active -= 1;
        self.issue_r2ts();
        if let Err(status) = self.execute(slot, ctx) {
            self.finish(slot, status, 0, ctx);
        }
    }

    /// When a large H2CData PDU's header has arrived but its data has not, takes
    /// what data is here and has the rest received straight into the command's
    /// buffer (no copy through the receive buffer). Returns true when it did.
    fn start_direct_receive(&mut self) -> bool {
        let avail = &self.rbuf[self.rstart..self.rend];
        let Ok(Some(head)) = pdu::parse_data_pdu_head(avail, self.digests, self.limits) else {
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
        let Some(buf) = self.slots[slot as usize]
            .as_mut()
            .and_then(|r| r.buf.as_mut())
        else {
            return false;
        };
        let from = self.rstart + head.pdo;
        buf[off..off + have].copy_from_slice(&self.rbuf[from..from + have]);
        self.rstart = self.rend;
        self.direct = Some(DirectReceive {
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
        let Some(d) = self.direct else {
            return true;
        };
        if d.got < d.len || self.rend - self.rstart < d.ddgst {
            return false;
        }
        self.direct = None;
        let mut digest_error = false;
        if d.ddgst != 0 {
            let at = self.rstart;
            let want = u32::from_le_bytes([
                self.rbuf[at],
                self.rbuf[at + 1],
                self.rbuf[at + 2],
                self.rbuf[at + 3],
            ]);
            self.rstart += d.ddgst;
            if let Some(b) = self.slots[d.slot as usize]
                .as_ref()
                .and_then(|r| r.buf.as_ref())
            {
                digest_error = pdu::crc32c(&b[d.start..d.start + d.len]) != want;
            }
        }
        self.h2c_arrived(d.slot, d.len, digest_error, ctx);
        true
    }

    /// Runs a command whose data is complete.
    fn execute(&mut self, slot: u16, ctx: &mut IoCtx) -> Result<(), Status> {
        let Some(req) = self.slots[slot as usize].as_mut() else {
            return Err(Status::INTERNAL_ERROR);
        };
        if req.data_error {
            return Err(TRANSIENT_TRANSPORT_ERROR);
        }
        let sqe = req.sqe;
        if sqe.opcode() == admin_opc::FABRICS {
            return self.execute_fabrics(slot, &sqe, ctx);
        }
        let Some(binding) = self.binding.clone() else {
            return Err(Status::COMMAND_SEQUENCE_ERROR);
        };
        let ctrl = binding.ctrl().clone();
        if binding.qid() == 0 {
            if !ctrl.is_ready() && !matches!(sqe.opcode(), admin_opc::KEEP_ALIVE) {
                return Err(Status::COMMAND_SEQUENCE_ERROR);
            }
            match admin::execute(&self.target, &ctrl, &sqe, self.aers.len()) {
                AdminOutcome::AsyncEventHeld => {
                    // Held without a slot: it completes only when an event fires.
                    self.free_slot(slot, ctx);
                    self.aers.push(sqe.cid());
                    Ok(())
                }
                AdminOutcome::Done {
                    status,
                    result,
                    data,
                } => {
                    if let Some(d) = data {
                        let want = sqe.sgl().length as usize;
                        let mut d = d;
                        d.truncate(want);
                        if let Some(r) = self.slots[slot as usize].as_mut() {
                            r.reply = Some(d);
                        }
                    }
                    self.finish(slot, status, result as u64, ctx);
                    Ok(())
                }
            }
        } else {
            self.execute_io(slot, ctx)
        }
    }

    fn execute_fabrics(&mut self, slot: u16, sqe: &Sqe, ctx: &mut IoCtx) -> Result<(), Status> {
        match sqe.fctype() {
            fctype::CONNECT => {
                if self.binding.is_some() {
                    return Err(Status::COMMAND_SEQUENCE_ERROR);
                }
                let cmd = ConnectCommand::parse(sqe);
                let data = self.slots[slot as usize]
                    .as_ref()
                    .and_then(|r| r.buf.as_ref())
                    .and_then(|b| ConnectData::parse(&b[..b.len().min(CONNECT_DATA_LEN)]));
                let Some(data) = data else {
                    return Err(Status::DATA_SGL_LENGTH_INVALID);
                };
                if self.discovery_only && data.subnqn != crate::wire::nvme::DISCOVERY_NQN {
                    tracing::warn!(peer = %self.peer, subnqn = %data.subnqn, "connect to an NVM subsystem on the discovery port refused");
                    self.finish(
                        slot,
                        Status::CONNECT_INVALID_PARAMETERS,
                        (256 | 1 << 16) as u64,
                        ctx,
                    );
                    return Ok(());
                }
                match fabrics::accept_connect(
                    &self.target,
                    &cmd,
                    &data,
                    &self.peer,
                    self.sock.local_addr().ok(),
                    "tcp",
                ) {
                    Ok(c) => {
                        let cntlid = c.binding.ctrl().cntlid;
                        self.sqsize = cmd.sqsize;
                        self.sq_head = 0;
                        self.sqflow_disabled = cmd.cattr & CATTR_DISABLE_SQ_FLOW != 0;
                        self.stats = Some(c.stats);
                        self.ns_gen = c.ns_gen;
                        self.namespaces = c.namespaces;
                        self.binding = Some(c.binding);
                        self.finish(slot, Status::SUCCESS, cntlid as u64, ctx);
                    }
                    Err(refusal) => {
                        self.finish(slot, refusal.status, refusal.result as u64, ctx);
                    }
                }
                Ok(())
            }
            fctype::PROPERTY_GET | fctype::PROPERTY_SET => {
                let v = fabrics::property(&self.target, self.binding.as_ref(), sqe)?;
                self.finish(slot, Status::SUCCESS, v, ctx);
                Ok(())
            }
            fctype::DISCONNECT => {
                // Only meaningful on I/O queues: answer, then close once sent.
                if self.qid() == 0 {
                    return Err(Status::INVALID_FIELD);
                }
                self.finish(slot, Status::SUCCESS, 0, ctx);
                self.set_state(ConnState::Terminating);
                Ok(())
            }
            _ => Err(Status::INVALID_OPCODE),
        }
    }

    fn execute_io(&mut self, slot: u16, ctx: &mut IoCtx) -> Result<(), Status> {
        let tag = ctx.tag(slot);
        let Some(req) = self.slots[slot as usize].as_mut() else {
            return Err(Status::INTERNAL_ERROR);
        };
        let Some(plan) = req.plan else {
            return Err(Status::INTERNAL_ERROR);
        };
        let mut ops = std::mem::take(&mut self.ops_scratch);
        let planned = command::device_ops(
            plan,
            req.ns.as_ref(),
            &self.namespaces,
            &mut req.buf,
            ctx.bufs,
            &mut ops,
        );
        let sent = match planned {
            Ok(()) if ops.is_empty() => None,
            Ok(()) => Some(command::submit(
                &mut ops,
                tag,
                ctx.channels,
                ctx.bufs,
                &mut self.device_errors,
            )),
            Err(e) => {
                for (_, op) in ops.drain(..) {
                    if let Some(b) = op.into_buf() {
                        ctx.bufs.put(b);
                    }
                }
                self.ops_scratch = ops;
                return Err(e);
            }
        };
        self.ops_scratch = ops;
        let Some(sent) = sent else {
            // Nothing for a device to do (DSM hints, a flush of no namespace).
            self.finish(slot, Status::SUCCESS, 0, ctx);
            return Ok(());
        };
        self.dev_ops += sent.ops as usize;
        if let Some(r) = self.slots[slot as usize].as_mut() {
            r.pending_ops = sent.ops;
            r.state = ReqState::Executing;
            if let Some(f) = sent.failure {
                r.status = f;
            }
        }
        if sent.ops == 0 {
            return Err(sent.failure.unwrap_or(Status::INTERNAL_ERROR));
        }
        Ok(())
    }

    fn free_slot(&mut self, slot: u16, ctx: &mut IoCtx) {
        if let Some(r) = self.slots.get_mut(slot as usize).and_then(|s| s.take()) {
            if let Some(b) = r.buf {
                ctx.bufs.put(b);
            }
            self.free_slots.push(slot);
        }
    }

    /// Completes a command: data (if any, on success) and the response.
    fn finish(&mut self, slot: u16, status: Status, result: u64, ctx: &mut IoCtx) {
        let Some(mut r) = self.slots.get_mut(slot as usize).and_then(|s| s.take()) else {
            return;
        };
        self.free_slots.push(slot);
        if self.direct.is_some_and(|d| d.slot == slot) {
            // Its data is still arriving into the buffer being released: the
            // stream cannot be followed any more.
            self.direct = None;
            self.close();
        }
        let cid = r.sqe.cid();
        self.cids.remove(cid);
        if r.state == ReqState::AwaitingData || r.state == ReqState::AwaitingR2tSlot {
            // Failed before its data arrived (e.g. shutdown): release the R2T slot.
            if r.state == ReqState::AwaitingData {
                self.r2t_active = self.r2t_active.saturating_sub(1);
            }
            self.r2t_waiting.retain(|&s| s != slot);
        }
        let status = if r.status.is_success() {
            status
        } else {
            r.status
        };
        command::account(
            self.binding.as_ref(),
            self.stats.as_deref(),
            self.qid(),
            &r.sqe,
            r.plan,
            status,
            ctx.now.saturating_duration_since(r.arrived).as_nanos() as u64,
        );
        // Read data goes out from its device buffer (no copy); admin replies are
        // small and encoded inline.
        let read_buf = if status.is_success() && matches!(r.plan, Some(IoPlan::Read { .. })) {
            r.buf.take().filter(|b| !b.is_empty())
        } else {
            None
        };
        let reply = r
            .reply
            .take()
            .filter(|d| status.is_success() && !d.is_empty());
        let c2h_len = match (&read_buf, &reply) {
            (Some(b), _) => b.len(),
            (None, Some(d)) => d.len(),
            (None, None) => 0,
        };
        let mut sent_success = false;
        if c2h_len > 0 {
            // SUCCESS skips the CapsuleResp and its SQ head update; hosts over TCP
            // do not use SQ head (SPDK sends SUCCESS the same way).
            let success = self.target.limits.c2h_success;
            let mut flags = pdu::flags::LAST_PDU;
            if success {
                flags |= pdu::flags::SUCCESS;
            }
            let hdr = DataHeader {
                cccid: cid,
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
                (Some(b), _) => {
                    let d = self.digests.data.then(|| pdu::crc32c(&b));
                    self.out.push_buf(b, c2h_len);
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
            sent_success = success;
        }
        if !sent_success {
            let cqe = self.cqe(cid, status, result);
            pdu::encode_capsule_resp(&mut self.out.bytes, &cqe, self.digests);
        }
        if let Some(b) = r.buf.take() {
            ctx.bufs.put(b);
        }
    }
}

impl QueuePair for TcpConnection {
    fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    fn on_readable(&mut self, ctx: &mut IoCtx) {
        if !matches!(self.state, ConnState::AwaitIcReq | ConnState::Ready) {
            // Drain and discard: a terminated connection reads nothing more.
            let mut sink = [0u8; 4096];
            loop {
                match self.sock.read(&mut sink) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
            return;
        }
        self.read_socket();
        self.process_input(ctx);
    }

    fn on_io_complete(
        &mut self,
        slot: u16,
        result: Result<(), i32>,
        buf: Option<IoBuf>,
        ctx: &mut IoCtx,
    ) {
        self.dev_ops = self.dev_ops.saturating_sub(1);
        let Some(r) = self.slots.get_mut(slot as usize).and_then(|s| s.as_mut()) else {
            if let Some(b) = buf {
                ctx.bufs.put(b);
            }
            return;
        };
        if let Err(errno) = result {
            command::log_device_error(&mut self.device_errors, r.sqe.cid(), r.sqe.opcode(), errno);
            r.status = tio::status_for_errno(errno, r.plan);
        }
        // Reads keep their buffer to send; writes give it back.
        if matches!(r.plan, Some(IoPlan::Read { .. })) {
            r.buf = buf;
        } else if let Some(b) = buf {
            ctx.bufs.put(b);
        }
        r.pending_ops = r.pending_ops.saturating_sub(1);
        if r.pending_ops == 0 {
            if self.state == ConnState::Closed {
                self.free_slot(slot, ctx);
            } else {
                self.finish(slot, Status::SUCCESS, 0, ctx);
            }
        }
    }

    fn flush(&mut self, bufs: &mut BufPool) -> bool {
        if self.state == ConnState::Closed {
            self.out.clear(bufs);
            return false;
        }
        while !self.out.is_empty() {
            match self.out.write_to(&mut self.sock, bufs) {
                Ok(0) => {
                    self.close();
                    self.out.clear(bufs);
                    break;
                }
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::debug!(peer = %self.peer, "write: {e}");
                    self.close();
                    self.out.clear(bufs);
                    break;
                }
            }
        }
        if self.out.is_empty() && self.state == ConnState::Terminating {
            self.close();
        }
        !self.out.is_empty()
    }

    fn housekeeping(&mut self, ctx: &mut IoCtx) {
        match self.state {
            ConnState::AwaitIcReq if self.state_since.elapsed() > IC_TIMEOUT => {
                tracing::warn!(peer = %self.peer, "no ICReq within {IC_TIMEOUT:?}; closing");
                self.close();
            }
            ConnState::Terminating if self.state_since.elapsed() > TERMINATE_LINGER => self.close(),
            _ => {}
        }
        // Idle queues also let go of namespaces removed at run time.
        self.refresh_namespaces();
        if let Some(b) = self.binding.clone() {
            let ctrl = b.ctrl();
            if b.qid() == 0 && !ctrl.is_failed() && ctrl.keep_alive_expired() {
                tracing::warn!(
                    cntlid = ctrl.cntlid,
                    host = %ctrl.hostnqn,
                    peer = %self.peer,
                    kato_ms = ctrl.kato_ms.load(Ordering::Relaxed),
                    "keep-alive timeout: tearing the controller down"
                );
                ctrl.fail();
            }
            if ctrl.is_failed() {
                self.close();
            } else if b.qid() == 0 && !self.aers.is_empty() {
                // Async events (namespace changes) complete a held AER.
                if let Some(dw0) = ctrl.take_event() {
                    let cid = self.aers.remove(0);
                    // The command is done: its CID may be reused (the host sends
                    // its next AER with the same one).
                    self.cids.remove(cid);
                    let cqe = self.cqe(cid, Status::SUCCESS, dw0 as u64);
                    pdu::encode_capsule_resp(&mut self.out.bytes, &cqe, self.digests);
                }
            }
        }
        if self.shutting_down
            && self.dev_ops == 0
            && matches!(self.state, ConnState::AwaitIcReq | ConnState::Ready)
        {
            // Answers already queued go out first; `flush` closes after them.
            self.set_state(ConnState::Terminating);
        }
        // Input may be waiting behind back-pressure that has now cleared.
        if self.state == ConnState::Ready && self.rstart < self.rend {
            self.process_input(ctx);
        }
    }

    fn begin_shutdown(&mut self) {
        // In-flight device I/O completes and is answered; then the connection
        // closes (housekeeping), and the host reconnects after the restart.
        self.shutting_down = true;
        if self.dev_ops == 0 {
            self.set_state(ConnState::Terminating);
        }
    }

    fn finished(&self) -> bool {
        self.state == ConnState::Closed && self.dev_ops == 0
    }

    fn describe(&self) -> String {
        format!("nvme/tcp {} qid {}", self.peer, self.qid())
    }
}

impl Drop for TcpConnection {
    fn drop(&mut self) {
        if let Some(b) = self.binding.take() {
            fabrics::disconnect(&b);
        }
    }
}
