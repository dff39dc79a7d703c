//! kvtarget's own NVMe/TCP host: blocking, pipelined, small. Used by integration
//! tests and by `kvtarget perf`; interoperability is proven against the Linux host,
//! not this.

use kvt_wire::nvme::{
    self, admin_opc, cns, fctype, io_opc, ConnectCommand, ConnectData, Cqe, DataDirection,
    GetLogPage, IdentifyController, IdentifyNamespace, KvCommand, KvKey, PropertyCommand,
    SglDescriptor, Sqe, Status, StoreOptions,
};
use kvt_wire::tcp::{self as pdu, DataHeader, Digests, ICReq, ParseLimits, Pdu};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

mod dhchap;
pub use dhchap::HostDhchap;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("I/O: {0}")]
    Io(#[from] io::Error),
    #[error("NVMe status: {0}")]
    Status(Status, Cqe),
    #[error("protocol: {0}")]
    Protocol(String),
    #[error("target terminated the connection: fes {fes:#x} fei {fei}")]
    Terminated { fes: u16, fei: u32 },
    #[error("timed out waiting for the target")]
    Timeout,
    #[error("KV List response: {0:?}")]
    KvList(nvme::ListResponseError),
    #[error("DH-HMAC-CHAP: {0}")]
    Auth(String),
    #[error("TLS: {0}")]
    Tls(String),
}

pub type Result<T> = std::result::Result<T, Error>;

/// A finished command.
#[derive(Debug, Clone)]
pub struct Completion {
    pub cqe: Cqe,
    pub data: Vec<u8>,
}

impl Completion {
    pub fn status(&self) -> Status {
        self.cqe.status()
    }
    pub fn ok(self) -> Result<Completion> {
        if self.status().is_success() {
            Ok(self)
        } else {
            Err(Error::Status(self.status(), self.cqe))
        }
    }
}

struct Pending {
    write: Option<Vec<u8>>,
    read: Vec<u8>,
    read_got: usize,
}

/// A connected queue taken apart (see `QueueConn::into_parts`).
pub struct QueueParts {
    pub sock: TcpStream,
    pub digests: Digests,
    pub maxh2cdata: u32,
    pub icd_limit: usize,
    pub unparsed: Vec<u8>,
}

/// A queue's connection: the TCP socket, or a TLS channel on it.
enum HostSock {
    Plain(TcpStream),
    Tls(Box<openssl::ssl::SslStream<TcpStream>>),
}

impl Read for HostSock {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            HostSock::Plain(s) => s.read(b),
            HostSock::Tls(s) => s.read(b),
        }
    }
}

impl Write for HostSock {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            HostSock::Plain(s) => s.write(b),
            HostSock::Tls(s) => s.write(b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            HostSock::Plain(s) => s.flush(),
            HostSock::Tls(s) => s.flush(),
        }
    }
}

/// A secure channel to open before ICReq: the PSK and the identity's NQNs.
#[derive(Debug, Clone)]
pub struct HostTls {
    pub psk: kvt_auth::TlsPsk,
    pub hostnqn: String,
    pub subnqn: String,
}

/// One NVMe/TCP queue (one TCP connection).
pub struct QueueConn {
    sock: HostSock,
    digests: Digests,
    rbuf: Vec<u8>,
    rlen: usize,
    out: Vec<u8>,
    pending: HashMap<u16, Pending>,
    done: Vec<Completion>,
    next_cid: u16,
    pub maxh2cdata: u32,
    /// In-capsule data this queue may use (bytes).
    pub icd_limit: usize,
    pub timeout: Duration,
    /// Test knobs: send H2CData in pieces of this many bytes with a pause
    /// between them (0: all at once), and corrupt the next H2CData's data digest.
    pub h2c_trickle: usize,
    pub corrupt_next_data_digest: bool,
    /// Test knob: keep R2Ts instead of answering them (see `release_r2ts`), to
    /// see how many the target asks for at once.
    pub hold_r2ts: bool,
    held_r2ts: Vec<(DataHeader, u16)>,
}

impl QueueConn {
    /// Connects the socket and exchanges ICReq/ICResp.
    pub fn open(addr: SocketAddr, digests: Digests, timeout: Duration) -> Result<QueueConn> {
        QueueConn::open_secure(addr, digests, timeout, None)
    }

    /// Connects the socket, opens a TLS channel on it when `tls` is given, and
    /// exchanges ICReq/ICResp inside.
    pub fn open_secure(
        addr: SocketAddr,
        digests: Digests,
        timeout: Duration,
        tls: Option<&HostTls>,
    ) -> Result<QueueConn> {
        let tcp = TcpStream::connect_timeout(&addr, timeout)?;
        tcp.set_nodelay(true)?;
        let sock = match tls {
            None => HostSock::Plain(tcp),
            Some(t) => {
                tcp.set_read_timeout(Some(timeout))?;
                let s = kvt_transport::tls::connect(tcp, &t.psk, &t.hostnqn, &t.subnqn)
                    .map_err(|e| Error::Tls(e.to_string()))?;
                HostSock::Tls(Box::new(s))
            }
        };
        match &sock {
            HostSock::Plain(s) => s.set_read_timeout(Some(Duration::from_millis(50)))?,
            HostSock::Tls(s) => s
                .get_ref()
                .set_read_timeout(Some(Duration::from_millis(50)))?,
        }
        let mut q = QueueConn {
            sock,
            digests: Digests::default(),
            // A 4 MiB C2HData PDU (MDTS 4 MiB) with its header and digests.
            rbuf: vec![0; (4 << 20) + (64 << 10)],
            rlen: 0,
            out: Vec::new(),
            pending: HashMap::new(),
            done: Vec::new(),
            next_cid: 1,
            maxh2cdata: 0,
            icd_limit: 8192,
            timeout,
            h2c_trickle: 0,
            corrupt_next_data_digest: false,
            hold_r2ts: false,
            held_r2ts: Vec::new(),
        };
        q.initialize(digests)?;
        Ok(q)
    }

    /// Exchanges ICReq/ICResp asking for `digests`; the queue uses them after.
    fn initialize(&mut self, digests: Digests) -> Result<()> {
        let mut b = Vec::new();
        pdu::encode_icreq(
            &mut b,
            &ICReq {
                pfv: 0,
                hpda: 0,
                digests,
                maxr2t: 0,
            },
        );
        self.sock.write_all(&b)?;
        let deadline = Instant::now() + self.timeout;
        loop {
            self.fill(deadline)?;
            match pdu::parse(
                &self.rbuf[..self.rlen],
                Digests::default(),
                ParseLimits { max_data: 0 },
            ) {
                Ok(Some((Pdu::ICResp(r), n))) => {
                    if r.pfv != 0
                        || r.cpda != 0
                        || r.digests != digests
                        || r.maxh2cdata < 4096
                        || r.maxh2cdata % 4 != 0
                    {
                        return Err(Error::Protocol(format!("bad ICResp {r:?}")));
                    }
                    self.maxh2cdata = r.maxh2cdata;
                    self.digests = digests;
                    self.consume(n);
                    return Ok(());
                }
                Ok(Some((Pdu::TermReq { fes, fei, .. }, _))) => {
                    return Err(Error::Terminated { fes, fei })
                }
                Ok(Some((p, _))) => {
                    return Err(Error::Protocol(format!("expected ICResp, got {p:?}")))
                }
                Ok(None) => continue,
                Err(e) => return Err(Error::Protocol(e.to_string())),
            }
        }
    }

    fn consume(&mut self, n: usize) {
        self.rbuf.copy_within(n..self.rlen, 0);
        self.rlen -= n;
    }

    fn fill(&mut self, deadline: Instant) -> Result<()> {
        if Instant::now() > deadline {
            return Err(Error::Timeout);
        }
        if self.rlen == self.rbuf.len() {
            return Err(Error::Protocol("PDU larger than the receive buffer".into()));
        }
        match self.sock.read(&mut self.rbuf[self.rlen..]) {
            Ok(0) => Err(Error::Io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "target closed the connection",
            ))),
            Ok(n) => {
                self.rlen += n;
                Ok(())
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Hands the connected socket over to a caller that drives the queue itself
    /// (`kvtarget perf`): the socket, negotiated digests, MAXH2CDATA, the
    /// in-capsule data limit and any bytes already received but not parsed.
    pub fn into_parts(self) -> Result<QueueParts> {
        if !self.pending.is_empty() {
            return Err(Error::Protocol(
                "queue handed over with commands outstanding".into(),
            ));
        }
        let HostSock::Plain(sock) = self.sock else {
            return Err(Error::Protocol(
                "a TLS queue cannot be handed over (perf drives plaintext sockets)".into(),
            ));
        };
        Ok(QueueParts {
            sock,
            digests: self.digests,
            maxh2cdata: self.maxh2cdata,
            icd_limit: self.icd_limit,
            unparsed: self.rbuf[..self.rlen].to_vec(),
        })
    }

    /// Writes raw bytes (for tests that send malformed PDUs).
    pub fn send_raw(&mut self, b: &[u8]) -> Result<()> {
        self.sock.write_all(b)?;
        Ok(())
    }

    pub fn digests(&self) -> Digests {
        self.digests
    }

    fn alloc_cid(&mut self) -> u16 {
        loop {
            let c = self.next_cid;
            self.next_cid = self.next_cid.wrapping_add(1);
            if !self.pending.contains_key(&c) {
                return c;
            }
        }
    }

    /// Makes the next command use `cid` (the Linux host reuses one CID for its
    /// Async Event Requests; tests do the same).
    pub fn reuse_cid(&mut self, cid: u16) {
        self.next_cid = cid;
    }

    /// Sends a command. `data_out` is host-to-controller data (in-capsule when it
    /// fits, otherwise sent on R2T); `data_in_len` the controller-to-host length.
    /// The SQE's CID is replaced; the CID used is returned.
    pub fn submit(
        &mut self,
        mut sqe: Sqe,
        data_out: Option<Vec<u8>>,
        data_in_len: usize,
    ) -> Result<u16> {
        let cid = self.alloc_cid();
        sqe.set_cid(cid);
        let mut capsule_data: &[u8] = &[];
        let mut keep = None;
        match (&data_out, DataDirection::of(&sqe)) {
            (Some(d), _) if !d.is_empty() => {
                let in_capsule = d.len() <= self.icd_limit;
                sqe.set_sgl(SglDescriptor {
                    address: 0,
                    length: d.len() as u32,
                    type_byte: if in_capsule {
                        SglDescriptor::IN_CAPSULE
                    } else {
                        SglDescriptor::TRANSPORT
                    },
                });
                if in_capsule {
                    capsule_data = d;
                } else {
                    keep = data_out.clone();
                }
            }
            _ if data_in_len > 0 => sqe.set_sgl(SglDescriptor {
                address: 0,
                length: data_in_len as u32,
                type_byte: SglDescriptor::TRANSPORT,
            }),
            _ => {}
        }
        self.out.clear();
        pdu::encode_capsule_cmd(&mut self.out, &sqe, capsule_data, self.digests);
        self.sock.write_all(&self.out)?;
        self.pending.insert(
            cid,
            Pending {
                write: keep,
                read: vec![0; data_in_len],
                read_got: 0,
            },
        );
        Ok(cid)
    }

    /// Outstanding commands.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Waits for the next completion of any outstanding command.
    pub fn wait_any(&mut self) -> Result<Completion> {
        let deadline = Instant::now() + self.timeout;
        loop {
            if let Some(c) = self.done.pop() {
                return Ok(c);
            }
            self.pump(deadline)?;
        }
    }

    /// Waits for command `cid`.
    pub fn wait_for(&mut self, cid: u16) -> Result<Completion> {
        let deadline = Instant::now() + self.timeout;
        loop {
            if let Some(i) = self.done.iter().position(|c| c.cqe.cid == cid) {
                return Ok(self.done.swap_remove(i));
            }
            self.pump(deadline)?;
        }
    }

    /// Submits and waits; the completion may carry an error status.
    pub fn execute(
        &mut self,
        sqe: Sqe,
        data_out: Option<Vec<u8>>,
        data_in_len: usize,
    ) -> Result<Completion> {
        let cid = self.submit(sqe, data_out, data_in_len)?;
        self.wait_for(cid)
    }

    /// Handles whatever PDUs arrive for `d` (R2Ts held with `hold_r2ts`).
    pub fn pump_for(&mut self, d: Duration) -> Result<()> {
        let deadline = Instant::now() + d;
        loop {
            match self.pump(deadline) {
                Ok(()) => {}
                Err(Error::Timeout) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }

    /// R2Ts held so far and not yet answered (CIDs, in arrival order).
    pub fn held_r2ts(&self) -> Vec<u16> {
        self.held_r2ts.iter().map(|(_, cid)| *cid).collect()
    }

    /// Answers every held R2T with its data.
    pub fn release_r2ts(&mut self) -> Result<()> {
        for (hdr, cid) in std::mem::take(&mut self.held_r2ts) {
            self.send_h2c(hdr, cid)?;
        }
        Ok(())
    }

    /// Reads and handles PDUs until at least one arrives.
    fn pump(&mut self, deadline: Instant) -> Result<()> {
        loop {
            let buf = std::mem::take(&mut self.rbuf);
            let parsed = pdu::parse(
                &buf[..self.rlen],
                self.digests,
                ParseLimits { max_data: 4 << 20 },
            );
            let outcome = match parsed {
                Ok(None) => None,
                Err(e) => Some(Err(Error::Protocol(e.to_string()))),
                Ok(Some((p, n))) => Some(self.handle(p).map(|a| (a, n))),
            };
            self.rbuf = buf;
            match outcome {
                None => self.fill(deadline)?,
                Some(Err(e)) => return Err(e),
                Some(Ok((action, n))) => {
                    self.consume(n);
                    if let Some((hdr, cid)) = action {
                        if self.hold_r2ts {
                            self.held_r2ts.push((hdr, cid));
                        } else {
                            self.send_h2c(hdr, cid)?;
                        }
                    }
                    return Ok(());
                }
            }
        }
    }

    fn handle(&mut self, p: Pdu) -> Result<Option<(DataHeader, u16)>> {
        match p {
            Pdu::CapsuleResp(cqe) => {
                let Some(pd) = self.pending.remove(&cqe.cid) else {
                    return Err(Error::Protocol(format!(
                        "response for unknown cid {}",
                        cqe.cid
                    )));
                };
                let mut data = pd.read;
                data.truncate(pd.read_got.max(if cqe.status().is_success() {
                    data.len()
                } else {
                    0
                }));
                self.done.push(Completion { cqe, data });
                Ok(None)
            }
            Pdu::C2HData {
                hdr,
                success,
                data,
                data_digest_error,
                last,
            } => {
                if data_digest_error {
                    return Err(Error::Protocol("C2HData digest error".into()));
                }
                let Some(pd) = self.pending.get_mut(&hdr.cccid) else {
                    return Err(Error::Protocol(format!(
                        "data for unknown cid {}",
                        hdr.cccid
                    )));
                };
                let off = hdr.offset as usize;
                let Some(dst) = pd.read.get_mut(off..off + data.len()) else {
                    return Err(Error::Protocol("C2HData beyond the buffer".into()));
                };
                dst.copy_from_slice(data);
                pd.read_got = pd.read_got.max(off + data.len());
                if success {
                    if !last {
                        return Err(Error::Protocol("SUCCESS without LAST_PDU".into()));
                    }
                    let pd = self.pending.remove(&hdr.cccid).ok_or(Error::Timeout)?;
                    self.done.push(Completion {
                        cqe: Cqe::new(hdr.cccid, Status::SUCCESS),
                        data: pd.read,
                    });
                }
                Ok(None)
            }
            Pdu::R2T(hdr) => Ok(Some((hdr, hdr.cccid))),
            Pdu::TermReq { fes, fei, .. } => Err(Error::Terminated { fes, fei }),
            other => Err(Error::Protocol(format!("unexpected PDU {other:?}"))),
        }
    }

    fn send_h2c(&mut self, r2t: DataHeader, cid: u16) -> Result<()> {
        let Some(pd) = self.pending.get(&cid) else {
            return Err(Error::Protocol(format!("R2T for unknown cid {cid}")));
        };
        let Some(data) = pd.write.as_ref() else {
            return Err(Error::Protocol("R2T for a command without data".into()));
        };
        let (start, len) = (r2t.offset as usize, r2t.length as usize);
        let Some(window) = data.get(start..start + len) else {
            return Err(Error::Protocol("R2T outside the data".into()));
        };
        self.out.clear();
        let chunk = self.maxh2cdata as usize;
        let mut off = 0;
        while off < len {
            let n = (len - off).min(chunk);
            let flags = if off + n == len {
                pdu::flags::LAST_PDU
            } else {
                0
            };
            let hdr = DataHeader {
                cccid: cid,
                ttag: r2t.ttag,
                offset: (start + off) as u32,
                length: n as u32,
            };
            pdu::encode_data_pdu(
                &mut self.out,
                true,
                &hdr,
                &window[off..off + n],
                flags,
                self.digests,
                0,
            );
            off += n;
        }
        if self.corrupt_next_data_digest && self.digests.data {
            self.corrupt_next_data_digest = false;
            if let Some(b) = self.out.last_mut() {
                *b ^= 0xFF;
            }
        }
        if self.h2c_trickle == 0 {
            self.sock.write_all(&self.out)?;
        } else {
            for piece in self.out.chunks(self.h2c_trickle) {
                self.sock.write_all(piece)?;
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        Ok(())
    }

    /// Fabrics Connect on this queue; returns the controller ID.
    pub fn fabrics_connect(&mut self, cmd: &ConnectCommand, data: &ConnectData) -> Result<u16> {
        Ok(self.fabrics_connect_dw0(cmd, data)? as u16)
    }

    /// Fabrics Connect; returns the whole DW0 (controller ID and AUTHREQ).
    pub fn fabrics_connect_dw0(&mut self, cmd: &ConnectCommand, data: &ConnectData) -> Result<u32> {
        let sqe = cmd.encode(0);
        let c = self.execute(sqe, Some(data.encode()), 0)?.ok()?;
        Ok(c.cqe.result as u32)
    }

    /// Authentication Send of one DH-HMAC-CHAP message.
    pub fn auth_send(&mut self, msg: Vec<u8>) -> Result<Completion> {
        let sqe = nvme::AuthCommand::dhchap(msg.len() as u32).encode(fctype::AUTH_SEND, 0);
        self.execute(sqe, Some(msg), 0)
    }

    /// Authentication Receive with allocation length `al`.
    pub fn auth_recv(&mut self, al: u32) -> Result<Completion> {
        let sqe = nvme::AuthCommand::dhchap(al).encode(fctype::AUTH_RECV, 0);
        self.execute(sqe, None, al as usize)
    }

    /// Connects, then runs DH-HMAC-CHAP when the controller asks for it (and
    /// `dhchap` holds keys).
    fn connect_authenticated(
        &mut self,
        cmd: &ConnectCommand,
        data: &ConnectData,
        dhchap: Option<&HostDhchap>,
    ) -> Result<u16> {
        let dw0 = self.fabrics_connect_dw0(cmd, data)?;
        if dw0 & 1 << 17 != 0 {
            let Some(d) = dhchap else {
                return Err(Error::Auth(
                    "the controller requires authentication and no key is set".into(),
                ));
            };
            d.authenticate(self, &data.hostnqn, &data.subnqn, cmd.qid)?;
        }
        Ok(dw0 as u16)
    }
}

/// What to connect to and how.
#[derive(Debug, Clone)]
pub struct HostOptions {
    pub addr: SocketAddr,
    pub subnqn: String,
    pub hostnqn: String,
    pub hostid: [u8; 16],
    pub digests: Digests,
    pub kato_ms: u32,
    /// Queue size (entries, 1-based) for every queue.
    pub queue_size: u16,
    pub timeout: Duration,
    /// Keys for DH-HMAC-CHAP, used when the controller asks for authentication.
    pub dhchap: Option<HostDhchap>,
    /// A TLS PSK: every queue runs inside a TLS 1.3 channel keyed by it.
    pub tls: Option<kvt_auth::TlsPsk>,
}

impl HostOptions {
    pub fn new(addr: SocketAddr, subnqn: &str) -> HostOptions {
        HostOptions {
            addr,
            subnqn: subnqn.to_string(),
            hostnqn: "nqn.2014-08.org.nvmexpress:uuid:6b767461-7267-6574-0000-000000000001".into(),
            hostid: *b"kvtarget-host-01",
            digests: Digests::default(),
            kato_ms: 0,
            queue_size: 128,
            timeout: Duration::from_secs(10),
            dhchap: None,
            tls: None,
        }
    }

    fn host_tls(&self) -> Option<HostTls> {
        self.tls.as_ref().map(|psk| HostTls {
            psk: psk.clone(),
            hostnqn: self.hostnqn.clone(),
            subnqn: self.subnqn.clone(),
        })
    }
}

/// A host-side controller: the admin queue plus what Identify said.
pub struct HostController {
    pub admin: QueueConn,
    pub cntlid: u16,
    pub opts: HostOptions,
    pub id: IdentifyController,
    /// The CAP register, read at connect.
    pub cap: u64,
}

impl HostController {
    /// Connects the admin queue, enables the controller and reads Identify.
    pub fn connect(opts: &HostOptions) -> Result<HostController> {
        let tls = opts.host_tls();
        let mut admin =
            QueueConn::open_secure(opts.addr, opts.digests, opts.timeout, tls.as_ref())?;
        let cntlid = admin.connect_authenticated(
            &ConnectCommand {
                recfmt: 0,
                qid: 0,
                sqsize: 31,
                cattr: 0,
                kato: opts.kato_ms,
            },
            &ConnectData {
                hostid: opts.hostid,
                cntlid: 0xFFFF,
                subnqn: opts.subnqn.clone(),
                hostnqn: opts.hostnqn.clone(),
            },
            opts.dhchap.as_ref(),
        )?;
        let mut c = HostController {
            admin,
            cntlid,
            opts: opts.clone(),
            id: IdentifyController::default(),
            cap: 0,
        };
        c.cap = c.property_get(nvme::prop::CAP, true)?;
        c.property_set(nvme::prop::CC, cc_enable(c.cap))?;
        let deadline = Instant::now() + opts.timeout;
        while c.property_get(nvme::prop::CSTS, false)? & 1 == 0 {
            if Instant::now() > deadline {
                return Err(Error::Timeout);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        c.id = c.identify_controller()?;
        Ok(c)
    }

    pub fn property_get(&mut self, offset: u32, eight: bool) -> Result<u64> {
        let sqe = PropertyCommand {
            eight_bytes: eight,
            offset,
            value: 0,
        }
        .encode(fctype::PROPERTY_GET, 0);
        Ok(self.admin.execute(sqe, None, 0)?.ok()?.cqe.result)
    }

    pub fn property_set(&mut self, offset: u32, value: u64) -> Result<()> {
        let sqe = PropertyCommand {
            eight_bytes: false,
            offset,
            value,
        }
        .encode(fctype::PROPERTY_SET, 0);
        self.admin.execute(sqe, None, 0)?.ok()?;
        Ok(())
    }

    pub fn identify(&mut self, cns_v: u8, nsid: u32) -> Result<Vec<u8>> {
        let mut sqe = Sqe::new(admin_opc::IDENTIFY, 0, nsid);
        sqe.set_cdw(10, cns_v as u32);
        Ok(self
            .admin
            .execute(sqe, None, nvme::IDENTIFY_LEN)?
            .ok()?
            .data)
    }

    pub fn identify_controller(&mut self) -> Result<IdentifyController> {
        Ok(IdentifyController::decode(
            &self.identify(cns::CONTROLLER, 0)?,
        ))
    }

    pub fn identify_namespace(&mut self, nsid: u32) -> Result<IdentifyNamespace> {
        Ok(IdentifyNamespace::decode(
            &self.identify(cns::NAMESPACE, nsid)?,
        ))
    }

    /// The KV command set specific Identify Namespace (CNS 05h, CSI 01h).
    pub fn identify_kv_namespace(&mut self, nsid: u32) -> Result<nvme::KvIdentifyNamespace> {
        let mut sqe = Sqe::new(admin_opc::IDENTIFY, 0, nsid);
        sqe.set_cdw(10, cns::CSI_NAMESPACE as u32);
        sqe.set_cdw(11, (nvme::csi::KEY_VALUE as u32) << 24);
        let d = self
            .admin
            .execute(sqe, None, nvme::IDENTIFY_LEN)?
            .ok()?
            .data;
        Ok(nvme::KvIdentifyNamespace::decode(&d))
    }

    pub fn active_namespaces(&mut self) -> Result<Vec<u32>> {
        Ok(nvme::decode_ns_list(
            &self.identify(cns::ACTIVE_NS_LIST, 0)?,
        ))
    }

    pub fn get_log_page(&mut self, lid: u8, nsid: u32, len: usize, offset: u64) -> Result<Vec<u8>> {
        let sqe = GetLogPage {
            lid,
            lsp: 0,
            rae: false,
            len,
            offset,
            csi: 0,
        }
        .encode(0, nsid);
        Ok(self.admin.execute(sqe, None, len)?.ok()?.data)
    }

    /// Reads the whole discovery log the way nvme-cli does: header, then all.
    pub fn discovery_log(&mut self) -> Result<Vec<nvme::DiscoveryEntry>> {
        let hdr = self.get_log_page(nvme::lid::DISCOVERY, 0, nvme::DISCOVERY_LOG_HEADER_LEN, 0)?;
        let numrec = u64::from_le_bytes(
            hdr[8..16]
                .try_into()
                .map_err(|_| Error::Protocol("short log".into()))?,
        );
        let len = nvme::DISCOVERY_LOG_HEADER_LEN
            + numrec.min(256) as usize * nvme::DISCOVERY_LOG_ENTRY_LEN;
        let full = self.get_log_page(nvme::lid::DISCOVERY, 0, len, 0)?;
        Ok(nvme::decode_discovery_log(&full).1)
    }

    pub fn set_features(&mut self, fid: u8, cdw11: u32) -> Result<u32> {
        let mut sqe = Sqe::new(admin_opc::SET_FEATURES, 0, 0);
        sqe.set_cdw(10, fid as u32);
        sqe.set_cdw(11, cdw11);
        Ok(self.admin.execute(sqe, None, 0)?.ok()?.cqe.result as u32)
    }

    pub fn keep_alive(&mut self) -> Result<()> {
        self.admin
            .execute(Sqe::new(admin_opc::KEEP_ALIVE, 0, 0), None, 0)?
            .ok()?;
        Ok(())
    }

    /// Asks for `n` I/O queues; returns how many were granted.
    pub fn set_queue_count(&mut self, n: u16) -> Result<u16> {
        let r = self.set_features(
            nvme::fid::NUMBER_OF_QUEUES,
            ((n - 1) as u32) << 16 | (n - 1) as u32,
        )?;
        Ok((r & 0xFFFF) as u16 + 1)
    }

    /// Most bytes one command may move: MDTS, in units of the minimum
    /// memory page size (CAP.MPSMIN); `None` when MDTS is 0 (no limit).
    pub fn max_transfer(&self) -> Option<usize> {
        max_transfer(self.id.mdts, self.cap)
    }

    /// Connects I/O queue `qid` on its own connection.
    pub fn io_queue(&self, qid: u16) -> Result<IoQueue> {
        let tls = self.opts.host_tls();
        let mut q = QueueConn::open_secure(
            self.opts.addr,
            self.opts.digests,
            self.opts.timeout,
            tls.as_ref(),
        )?;
        q.icd_limit = (self.id.ioccsz as usize * 16).saturating_sub(64);
        q.connect_authenticated(
            &ConnectCommand {
                recfmt: 0,
                qid,
                sqsize: self.opts.queue_size - 1,
                cattr: 0,
                kato: 0,
            },
            &ConnectData {
                hostid: self.opts.hostid,
                cntlid: self.cntlid,
                subnqn: self.opts.subnqn.clone(),
                hostnqn: self.opts.hostnqn.clone(),
            },
            self.opts.dhchap.as_ref(),
        )?;
        Ok(IoQueue {
            q,
            max_transfer: self.max_transfer(),
            entries: self.opts.queue_size as usize,
        })
    }

    /// Orderly shutdown: CC.SHN normal, then close.
    pub fn shutdown(mut self) -> Result<()> {
        let cc = self.property_get(nvme::prop::CC, false)? as u32;
        self.property_set(nvme::prop::CC, cc as u64 | (1 << 14))?;
        Ok(())
    }
}

/// MDTS (Identify Controller byte 77) in bytes, for a controller whose CAP is `cap`.
pub fn max_transfer(mdts: u8, cap: u64) -> Option<usize> {
    if mdts == 0 {
        return None;
    }
    let page = 4096usize << ((cap >> 48) & 0xF);
    1usize.checked_shl(mdts as u32)?.checked_mul(page)
}

/// The CC value that enables a controller with this CAP: 64/16-byte queue
/// entries, and, as Linux does (`nvme_enable_ctrl`), CC.CSS = 110b (all I/O
/// command sets) when CAP.CSS offers it, so namespaces of the Key Value
/// command set are visible; the NVM command set alone otherwise.
pub fn cc_enable(cap: u64) -> u64 {
    let css = if cap & nvme::cap::CSS_IOCS != 0 {
        nvme::cc::CSS_ALL_IOCS
    } else {
        nvme::cc::CSS_NVM
    };
    (6 << 16) | (4 << 20) | (css << nvme::cc::CSS_SHIFT) as u64 | 1
}

/// An I/O queue with NVM command helpers. `read` and `write` split a transfer
/// larger than the controller's MDTS into several commands, as a host driver
/// does; `submit_read`/`submit_write` send exactly one command.
pub struct IoQueue {
    pub q: QueueConn,
    /// The controller's MDTS in bytes (`None`: no limit).
    pub max_transfer: Option<usize>,
    /// Entries of this queue: at most this many less one commands go at once.
    pub entries: usize,
}

impl IoQueue {
    fn rw_sqe(opc: u8, nsid: u32, slba: u64, nlb: u32) -> Sqe {
        let mut s = Sqe::new(opc, 0, nsid);
        s.set_cdw(10, slba as u32);
        s.set_cdw(11, (slba >> 32) as u32);
        s.set_cdw(12, nlb.saturating_sub(1));
        s
    }

    pub fn submit_read(&mut self, nsid: u32, slba: u64, nlb: u32, block_size: u32) -> Result<u16> {
        self.q.submit(
            Self::rw_sqe(io_opc::READ, nsid, slba, nlb),
            None,
            (nlb * block_size) as usize,
        )
    }

    pub fn submit_write(
        &mut self,
        nsid: u32,
        slba: u64,
        data: Vec<u8>,
        block_size: u32,
        fua: bool,
    ) -> Result<u16> {
        let nlb = (data.len() / block_size as usize) as u32;
        let mut s = Self::rw_sqe(io_opc::WRITE, nsid, slba, nlb);
        if fua {
            s.set_cdw(12, s.cdw(12) | 1 << 30);
        }
        self.q.submit(s, Some(data), 0)
    }

    /// Blocks per command for a transfer of `nlb` blocks.
    fn piece_blocks(&self, nlb: u32, block_size: u32) -> u32 {
        match self.max_transfer {
            Some(m) => ((m / block_size.max(1) as usize) as u32).clamp(1, nlb.max(1)),
            None => nlb.max(1),
        }
    }

    /// Runs one command per piece of `nlb` blocks from `slba`, at most the
    /// queue's entries less one at a time; every piece must succeed.
    fn split(
        &mut self,
        slba: u64,
        nlb: u32,
        block_size: u32,
        mut submit: impl FnMut(&mut Self, u64, u32) -> Result<u16>,
        mut done: impl FnMut(u64, Completion),
    ) -> Result<()> {
        let per = self.piece_blocks(nlb, block_size);
        let window = self.entries.saturating_sub(1).max(1);
        let mut inflight: std::collections::VecDeque<(u16, u64)> = Default::default();
        let mut next = 0u32;
        while next < nlb || !inflight.is_empty() {
            while next < nlb && inflight.len() < window {
                let n = per.min(nlb - next);
                let at = slba + next as u64;
                inflight.push_back((submit(self, at, n)?, at));
                next += n;
            }
            if let Some((cid, at)) = inflight.pop_front() {
                done(at, self.q.wait_for(cid)?.ok()?);
            }
        }
        Ok(())
    }

    pub fn read(&mut self, nsid: u32, slba: u64, nlb: u32, block_size: u32) -> Result<Vec<u8>> {
        let mut out = vec![0u8; nlb as usize * block_size as usize];
        self.split(
            slba,
            nlb,
            block_size,
            |q, at, n| q.submit_read(nsid, at, n, block_size),
            |at, c| {
                let off = (at - slba) as usize * block_size as usize;
                let end = (off + c.data.len()).min(out.len());
                out[off..end].copy_from_slice(&c.data[..end - off]);
            },
        )?;
        Ok(out)
    }

    pub fn write(&mut self, nsid: u32, slba: u64, data: Vec<u8>, block_size: u32) -> Result<()> {
        let nlb = (data.len() / block_size.max(1) as usize) as u32;
        if self.piece_blocks(nlb, block_size) >= nlb {
            let cid = self.submit_write(nsid, slba, data, block_size, false)?;
            self.q.wait_for(cid)?.ok()?;
            return Ok(());
        }
        let bs = block_size as usize;
        self.split(
            slba,
            nlb,
            block_size,
            |q, at, n| {
                let off = (at - slba) as usize * bs;
                let piece = data[off..off + n as usize * bs].to_vec();
                q.submit_write(nsid, at, piece, block_size, false)
            },
            |_, _| {},
        )
    }

    pub fn flush(&mut self, nsid: u32) -> Result<()> {
        self.q
            .execute(Sqe::new(io_opc::FLUSH, 0, nsid), None, 0)?
            .ok()?;
        Ok(())
    }

    pub fn write_zeroes(&mut self, nsid: u32, slba: u64, nlb: u32, deallocate: bool) -> Result<()> {
        let mut s = Self::rw_sqe(io_opc::WRITE_ZEROES, nsid, slba, nlb);
        if deallocate {
            s.set_cdw(12, s.cdw(12) | 1 << 25);
        }
        self.q.execute(s, None, 0)?.ok()?;
        Ok(())
    }

    /// Dataset Management, deallocate, one range per (slba, nlb).
    pub fn deallocate(&mut self, nsid: u32, ranges: &[(u64, u32)]) -> Result<()> {
        let mut data = vec![0u8; ranges.len() * nvme::DSM_RANGE_LEN];
        for (i, &(slba, nlb)) in ranges.iter().enumerate() {
            nvme::DsmRange {
                attributes: 0,
                nlb,
                slba,
            }
            .encode(&mut data[i * 16..(i + 1) * 16]);
        }
        let mut s = Sqe::new(io_opc::DATASET_MANAGEMENT, 0, nsid);
        s.set_cdw(10, ranges.len() as u32 - 1);
        s.set_cdw(11, nvme::DSM_ATTR_DEALLOCATE);
        self.q.execute(s, Some(data), 0)?.ok()?;
        Ok(())
    }

    /// Sends a KV command set command (`data_out` for Store, `data_in_len`
    /// for Retrieve and List).
    pub fn submit_kv(
        &mut self,
        nsid: u32,
        cmd: &KvCommand,
        data_out: Option<Vec<u8>>,
        data_in_len: usize,
    ) -> Result<u16> {
        self.q.submit(cmd.encode(0, nsid), data_out, data_in_len)
    }

    /// KV Store of `value` under `key`.
    pub fn kv_store(
        &mut self,
        nsid: u32,
        key: KvKey,
        value: Vec<u8>,
        options: StoreOptions,
    ) -> Result<()> {
        let cmd = KvCommand::Store {
            key,
            value_size: value.len() as u32,
            options,
        };
        let cid = self.submit_kv(nsid, &cmd, Some(value), 0)?;
        self.q.wait_for(cid)?.ok()?;
        Ok(())
    }

    /// KV Retrieve into a buffer of `host_buffer_size` bytes: the bytes
    /// returned (at most the buffer) and the size of the whole value
    /// (completion DW0).
    pub fn kv_retrieve(
        &mut self,
        nsid: u32,
        key: KvKey,
        host_buffer_size: u32,
    ) -> Result<(Vec<u8>, u32)> {
        let cmd = KvCommand::Retrieve {
            key,
            host_buffer_size,
            raw: false,
        };
        let cid = self.submit_kv(nsid, &cmd, None, host_buffer_size as usize)?;
        let c = self.q.wait_for(cid)?.ok()?;
        let value_size = c.cqe.result as u32;
        let mut data = c.data;
        data.truncate(value_size as usize);
        Ok((data, value_size))
    }

    pub fn kv_delete(&mut self, nsid: u32, key: KvKey) -> Result<()> {
        let cid = self.submit_kv(nsid, &KvCommand::Delete { key }, None, 0)?;
        self.q.wait_for(cid)?.ok()?;
        Ok(())
    }

    /// KV Exist: whether the key is there ("key does not exist" is an
    /// answer, not an error).
    pub fn kv_exist(&mut self, nsid: u32, key: KvKey) -> Result<bool> {
        let cid = self.submit_kv(nsid, &KvCommand::Exist { key }, None, 0)?;
        let c = self.q.wait_for(cid)?;
        match c.status() {
            s if s.is_success() => Ok(true),
            s if s == Status::KV_KEY_DOES_NOT_EXIST => Ok(false),
            s => Err(Error::Status(s, c.cqe)),
        }
    }

    /// KV List from `start_key` into a buffer of `host_buffer_size` bytes.
    pub fn kv_list(
        &mut self,
        nsid: u32,
        start_key: KvKey,
        host_buffer_size: u32,
    ) -> Result<Vec<KvKey>> {
        let cmd = KvCommand::List {
            start_key,
            host_buffer_size,
        };
        let cid = self.submit_kv(nsid, &cmd, None, host_buffer_size as usize)?;
        let c = self.q.wait_for(cid)?.ok()?;
        nvme::decode_list_response(&c.data).map_err(Error::KvList)
    }

    /// Fabrics Disconnect of this I/O queue.
    pub fn disconnect(mut self) -> Result<()> {
        let mut s = Sqe::new(admin_opc::FABRICS, 0, 0);
        s.0[4] = fctype::DISCONNECT;
        self.q.execute(s, None, 0)?.ok()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_enables_all_io_command_sets_when_cap_offers_them() {
        let nvm_only = nvme::cap::CSS_NVM;
        assert_eq!(cc_enable(nvm_only), 0x46_0001);
        let both = nvme::cap::CSS_NVM | nvme::cap::CSS_IOCS;
        assert_eq!(cc_enable(both), 0x46_0061);
        assert_eq!(
            cc_enable(kvt_nvmf::controller::cap_register(128)),
            0x46_0061
        );
    }
}
