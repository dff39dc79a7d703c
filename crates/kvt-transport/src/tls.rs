//! NVMe/TCP secure channels: TLS 1.3 with external pre-shared keys (NVMe/TCP 1.0
//! section 3.6), through OpenSSL. A host offers the PSK identity
//! `NVMe0R0<1|2> <hostnqn> <subnqn>`; the target finds that host's PSK on that
//! subsystem, derives the TLS PSK from it (`auth::psk`) and hands TLS a session
//! carrying it, as SPDK's nvmf_tgt does. No certificates are involved.
//!
//! The `openssl` crate has no binding for the TLS 1.3 PSK session callbacks
//! (`SSL_CTX_set_psk_find_session_callback` and the client's `use_session`), so
//! those few calls are declared here: this is the only unsafe code TLS needs.
//! Everything else (contexts, streams, the handshake, reads and writes) is the
//! crate's safe API. Only connections that arrive on a `secure_channel` listener
//! get a `TlsWire`; plaintext listeners keep `TcpStream` and never touch this file.

use kvt_auth::psk::{parse_identity, CipherSuite, TlsPsk};
pub use kvt_nvmf::fabrics::SecurePeer;
use kvt_nvmf::{SubsystemKind, Target};
use openssl::ssl::{
    HandshakeError, MidHandshakeSslStream, Ssl, SslContext, SslContextBuilder, SslMethod, SslMode,
    SslStream, SslVersion,
};
use std::ffi::{c_int, c_uchar};
use std::io::{self, ErrorKind, IoSlice, Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use zeroize::Zeroizing;

/// A TLS record holds at most this much plaintext: writes gather up to one
/// record's worth of queued PDUs so that a record is not spent on each piece.
const RECORD_MAX: usize = 16 * 1024;
/// The first byte of a TLS handshake record (content type 22).
const TLS_HANDSHAKE: u8 = 0x16;
const TLS1_3_VERSION: c_int = 0x0304;

type FindSessionCb = unsafe extern "C" fn(
    *mut openssl_sys::SSL,
    *const c_uchar,
    usize,
    *mut *mut openssl_sys::SSL_SESSION,
) -> c_int;
type UseSessionCb = unsafe extern "C" fn(
    *mut openssl_sys::SSL,
    *const openssl_sys::EVP_MD,
    *mut *const c_uchar,
    *mut usize,
    *mut *mut openssl_sys::SSL_SESSION,
) -> c_int;

extern "C" {
    fn SSL_CTX_set_psk_find_session_callback(ctx: *mut openssl_sys::SSL_CTX, cb: FindSessionCb);
    fn SSL_CTX_set_psk_use_session_callback(ctx: *mut openssl_sys::SSL_CTX, cb: UseSessionCb);
    fn SSL_SESSION_new() -> *mut openssl_sys::SSL_SESSION;
    fn SSL_CIPHER_find(
        ssl: *mut openssl_sys::SSL,
        id: *const c_uchar,
    ) -> *const openssl_sys::SSL_CIPHER;
    fn SSL_SESSION_set_cipher(
        s: *mut openssl_sys::SSL_SESSION,
        c: *const openssl_sys::SSL_CIPHER,
    ) -> c_int;
    fn SSL_SESSION_set_protocol_version(s: *mut openssl_sys::SSL_SESSION, v: c_int) -> c_int;
    fn SSL_SESSION_set1_master_key(
        s: *mut openssl_sys::SSL_SESSION,
        key: *const c_uchar,
        len: usize,
    ) -> c_int;
}

/// What a server connection's PSK lookup found: the peer, or why the identity
/// was refused (for the log line; identities hold NQNs, not secrets).
struct PskLookup {
    target: Arc<Target>,
    found: Mutex<Option<Result<SecurePeer, String>>>,
}

/// What a client connection offers (the in-repo initiator).
struct ClientPsk {
    identity: Vec<u8>,
    key: Zeroizing<Vec<u8>>,
    suite: CipherSuite,
}

/// A TLS session carrying `key` as its external PSK for `suite`.
///
/// # Safety
/// `ssl` must be a live SSL object for the duration of the call.
unsafe fn psk_session(
    ssl: *mut openssl_sys::SSL,
    suite: CipherSuite,
    key: &[u8],
) -> *mut openssl_sys::SSL_SESSION {
    let id = suite.id();
    // SAFETY: `ssl` is live (caller); `id` is the two-byte cipher identifier
    // SSL_CIPHER_find reads.
    let cipher = unsafe { SSL_CIPHER_find(ssl, id.as_ptr()) };
    if cipher.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: a fresh session is ours until returned; each setter copies what it
    // is given (the key too) and reports failure by its return value.
    unsafe {
        let s = SSL_SESSION_new();
        if s.is_null() {
            return s;
        }
        if SSL_SESSION_set_cipher(s, cipher) != 1
            || SSL_SESSION_set_protocol_version(s, TLS1_3_VERSION) != 1
            || SSL_SESSION_set1_master_key(s, key.as_ptr(), key.len()) != 1
        {
            openssl_sys::SSL_SESSION_free(s);
            return std::ptr::null_mut();
        }
        s
    }
}

/// The PSK a host offers `identity` for, looked up on the target.
fn lookup(target: &Target, identity: &[u8]) -> Result<(SecurePeer, Zeroizing<Vec<u8>>), String> {
    let shown = String::from_utf8_lossy(&identity[..identity.len().min(512)]).into_owned();
    let Some((suite, hostnqn, subnqn)) = parse_identity(identity) else {
        return Err(format!(
            "PSK identity `{shown}` is not NVMe0R01/NVMe0R02 <hostnqn> <subnqn>"
        ));
    };
    let Some(subsys) = target.find_subsystem(subnqn) else {
        return Err(format!("PSK identity `{shown}`: no subsystem {subnqn}"));
    };
    let key = if subsys.kind == SubsystemKind::Discovery {
        // Discovery has no host list: the host's PSK on the subsystems that
        // list it serves, when they agree on one for this cipher suite.
        let subs = target
            .subsystems
            .read()
            .map(|s| s.clone())
            .unwrap_or_default();
        let mut keys = subs.iter().filter_map(|s| s.host_psk(hostnqn));
        keys.find(|k| k.tls_psk().is_ok_and(|p| p.cipher_suite() == suite))
    } else {
        subsys.host_psk(hostnqn)
    };
    let Some(key) = key else {
        return Err(format!(
            "PSK identity `{shown}`: host {hostnqn} has no TLS PSK on {subnqn}"
        ));
    };
    let psk: TlsPsk = key
        .tls_psk()
        .map_err(|e| format!("key `{}`: {e}", key.name))?;
    let expected = psk
        .identity(hostnqn, subnqn)
        .map_err(|e| format!("PSK identity `{shown}`: {e}"))?;
    if expected.as_bytes() != identity {
        return Err(format!(
            "PSK identity `{shown}` names {}, but key `{}` is for {}",
            suite.name(),
            key.name,
            psk.cipher_suite().name()
        ));
    }
    Ok((
        SecurePeer {
            hostnqn: hostnqn.to_string(),
            subnqn: subnqn.to_string(),
            cipher: suite.name(),
        },
        psk.tls_psk(hostnqn, &expected),
    ))
}

/// OpenSSL's server callback: find the session for the identity a host offers.
unsafe extern "C" fn find_session(
    ssl: *mut openssl_sys::SSL,
    identity: *const c_uchar,
    identity_len: usize,
    sess: *mut *mut openssl_sys::SSL_SESSION,
) -> c_int {
    let run = || {
        // SAFETY: OpenSSL passes the identity it received, `identity_len` bytes.
        let id = unsafe { std::slice::from_raw_parts(identity, identity_len) };
        // SAFETY: the index was registered for `PskLookup` and set on every server
        // SSL before its handshake (`TlsWire::accept`); the box lives as long as
        // the SSL.
        let Some(index) = server_index() else {
            return 0;
        };
        let state = unsafe { openssl_sys::SSL_get_ex_data(ssl, index.as_raw()) };
        let state = state as *const PskLookup;
        if state.is_null() {
            return 0;
        }
        // SAFETY: non-null and set as a `PskLookup` (above).
        let state = unsafe { &*state };
        let found = lookup(&state.target, id);
        let mut session = std::ptr::null_mut();
        let result = match found {
            Ok((peer, key)) => {
                let suite = if peer.cipher == CipherSuite::Aes256GcmSha384.name() {
                    CipherSuite::Aes256GcmSha384
                } else {
                    CipherSuite::Aes128GcmSha256
                };
                // SAFETY: `ssl` is live for the callback.
                session = unsafe { psk_session(ssl, suite, &key) };
                if session.is_null() {
                    Err("cannot build the TLS session for the PSK".to_string())
                } else {
                    Ok(peer)
                }
            }
            Err(e) => Err(e),
        };
        if let Ok(mut f) = state.found.lock() {
            *f = Some(result);
        }
        // SAFETY: `sess` is OpenSSL's out-pointer; null means no PSK (the
        // handshake then fails: there is no certificate to fall back on).
        unsafe { *sess = session };
        1
    };
    // A panic must not unwind into OpenSSL.
    std::panic::catch_unwind(run).unwrap_or(0)
}

/// OpenSSL's client callback: offer the identity and session set up for this SSL.
unsafe extern "C" fn use_session(
    ssl: *mut openssl_sys::SSL,
    _md: *const openssl_sys::EVP_MD,
    id: *mut *const c_uchar,
    idlen: *mut usize,
    sess: *mut *mut openssl_sys::SSL_SESSION,
) -> c_int {
    let run = || {
        // SAFETY: as in `find_session`, for the client index and `ClientPsk`.
        let Some(index) = client_index() else {
            return 0;
        };
        let state = unsafe { openssl_sys::SSL_get_ex_data(ssl, index.as_raw()) };
        let state = state as *const ClientPsk;
        if state.is_null() {
            return 0;
        }
        // SAFETY: non-null and set as a `ClientPsk` in `connect`.
        let state = unsafe { &*state };
        // SAFETY: `ssl` is live for the callback.
        let s = unsafe { psk_session(ssl, state.suite, &state.key) };
        if s.is_null() {
            return 0;
        }
        // SAFETY: OpenSSL's out-pointers; the identity lives in the ex_data box,
        // which outlives the handshake.
        unsafe {
            *id = state.identity.as_ptr();
            *idlen = state.identity.len();
            *sess = s;
        }
        1
    };
    std::panic::catch_unwind(run).unwrap_or(0)
}

/// The ex_data slots the callbacks find their connection's state in.
static INDEX_SERVER: std::sync::OnceLock<Option<openssl::ex_data::Index<Ssl, PskLookup>>> =
    std::sync::OnceLock::new();
static INDEX_CLIENT: std::sync::OnceLock<Option<openssl::ex_data::Index<Ssl, ClientPsk>>> =
    std::sync::OnceLock::new();

fn server_index() -> Option<openssl::ex_data::Index<Ssl, PskLookup>> {
    *INDEX_SERVER.get_or_init(|| Ssl::new_ex_index().ok())
}

fn client_index() -> Option<openssl::ex_data::Index<Ssl, ClientPsk>> {
    *INDEX_CLIENT.get_or_init(|| Ssl::new_ex_index().ok())
}

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("TLS context: {0}")]
    Context(#[from] openssl::error::ErrorStack),
    #[error("TLS: no ex_data index")]
    Index,
    #[error("TLS handshake: {0}")]
    Handshake(String),
    #[error("{0}")]
    Psk(String),
}

fn context(server: bool) -> Result<SslContextBuilder, TlsError> {
    let mut b = SslContextBuilder::new(if server {
        SslMethod::tls_server()
    } else {
        SslMethod::tls_client()
    })?;
    b.set_min_proto_version(Some(SslVersion::TLS1_3))?;
    b.set_max_proto_version(Some(SslVersion::TLS1_3))?;
    b.set_ciphersuites("TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384")?;
    // A retried write may come from another buffer (the gathered record is
    // rebuilt), and each record written is reported as soon as it is.
    b.set_mode(SslMode::ACCEPT_MOVING_WRITE_BUFFER | SslMode::ENABLE_PARTIAL_WRITE);
    Ok(b)
}

/// The target's TLS server context, shared by every secure listener.
pub struct TlsServer {
    ctx: SslContext,
    index: openssl::ex_data::Index<Ssl, PskLookup>,
}

impl TlsServer {
    pub fn new() -> Result<TlsServer, TlsError> {
        let mut b = context(true)?;
        // PSK sessions are not resumed: no tickets to send.
        b.set_num_tickets(0)?;
        // SAFETY: `b` owns a live SSL_CTX; the callback is a plain function.
        unsafe { SSL_CTX_set_psk_find_session_callback(b.as_ptr(), find_session) };
        let index = server_index().ok_or(TlsError::Index)?;
        Ok(TlsServer {
            ctx: b.build(),
            index,
        })
    }
}

enum State {
    /// Nothing read yet: a plaintext ICReq is refused here.
    Detect,
    Handshake(MidHandshakeSslStream<TcpStream>),
    Open(SslStream<TcpStream>),
    Failed,
}

/// A server connection on a secure listener: the handshake, then TLS records
/// both ways. `sock` shares the socket with the stream inside (a duplicate
/// descriptor) for the reactor's fd, addresses and shutdown.
pub struct TlsWire {
    sock: TcpStream,
    peer: String,
    state: State,
    server: Arc<TlsServer>,
    target: Arc<Target>,
    staging: Vec<u8>,
    secure: Option<SecurePeer>,
}

fn refused(msg: String) -> io::Error {
    io::Error::new(ErrorKind::ConnectionRefused, msg)
}

impl TlsWire {
    pub fn new(
        sock: TcpStream,
        server: Arc<TlsServer>,
        target: Arc<Target>,
    ) -> io::Result<TlsWire> {
        let peer = sock
            .peer_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| "unknown".into());
        Ok(TlsWire {
            sock,
            peer,
            state: State::Detect,
            server,
            target,
            staging: Vec::with_capacity(RECORD_MAX),
            secure: None,
        })
    }

    /// The socket the stream runs on.
    pub fn socket(&self) -> &TcpStream {
        &self.sock
    }

    /// The host and subsystem the channel was keyed for, once it is open.
    pub fn secure_peer(&self) -> Option<&SecurePeer> {
        self.secure.as_ref()
    }

    /// Decrypted bytes OpenSSL holds that the socket's readiness does not show.
    pub fn buffered(&self) -> bool {
        matches!(&self.state, State::Open(s) if s.ssl().pending() > 0)
    }

    fn fail(&mut self, why: String) -> io::Error {
        tracing::warn!(peer = %self.peer, "TLS refused: {why}");
        self.target
            .tls_failures
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.state = State::Failed;
        refused(why)
    }

    fn found(&self, ssl: &openssl::ssl::SslRef) -> Option<Result<SecurePeer, String>> {
        ssl.ex_data(self.server.index)
            .and_then(|l| l.found.lock().ok().and_then(|mut f| f.take()))
    }

    fn handshake_done(&mut self, s: SslStream<TcpStream>) -> io::Result<()> {
        match self.found(s.ssl()) {
            Some(Ok(p)) => {
                tracing::info!(peer = %self.peer, host = %p.hostnqn, subnqn = %p.subnqn, cipher = p.cipher, "TLS secure channel open");
                self.secure = Some(p);
                self.state = State::Open(s);
                Ok(())
            }
            Some(Err(e)) => Err(self.fail(e)),
            None => Err(self.fail("the host offered no PSK identity".into())),
        }
    }

    fn handshake_failed(&mut self, ssl: &openssl::ssl::SslRef, e: String) -> io::Error {
        // The lookup's reason says more than OpenSSL's alert when there is one.
        match self.found(ssl) {
            Some(Err(why)) => self.fail(why),
            _ => self.fail(format!("handshake failed: {e}")),
        }
    }

    /// Moves the handshake on; Ok once the channel is open, WouldBlock while it
    /// waits for the host.
    fn drive(&mut self) -> io::Result<()> {
        loop {
            match std::mem::replace(&mut self.state, State::Failed) {
                State::Open(s) => {
                    self.state = State::Open(s);
                    return Ok(());
                }
                State::Failed => return Err(refused("TLS channel failed".into())),
                State::Detect => {
                    let mut first = [0u8; 1];
                    match self.sock.peek(&mut first) {
                        Ok(0) => {
                            self.state = State::Detect;
                            return Err(io::Error::from(ErrorKind::UnexpectedEof));
                        }
                        Ok(_) if first[0] != TLS_HANDSHAKE => {
                            // Take what the host sent (its ICReq) so that the close
                            // is an orderly FIN, not a reset the host may not report.
                            // Bounded: a host that keeps sending is cut off anyway.
                            let mut sink = [0u8; 512];
                            for _ in 0..64 {
                                if !matches!((&self.sock).read(&mut sink), Ok(n) if n > 0) {
                                    break;
                                }
                            }
                            return Err(self.fail(format!(
                                "a plaintext connection (first byte {:#04x}, not a TLS handshake) on a secure_channel listener",
                                first[0]
                            )));
                        }
                        Ok(_) => {}
                        Err(e) => {
                            self.state = State::Detect;
                            return Err(e);
                        }
                    }
                    let stream = self.sock.try_clone()?;
                    let mut ssl = Ssl::new(&self.server.ctx).map_err(io::Error::other)?;
                    ssl.set_ex_data(
                        self.server.index,
                        PskLookup {
                            target: self.target.clone(),
                            found: Mutex::new(None),
                        },
                    );
                    match ssl.accept(stream) {
                        Ok(s) => self.handshake_done(s)?,
                        Err(HandshakeError::WouldBlock(m)) => self.state = State::Handshake(m),
                        Err(HandshakeError::Failure(m)) => {
                            return Err(self.handshake_failed(m.ssl(), m.error().to_string()))
                        }
                        Err(HandshakeError::SetupFailure(e)) => {
                            return Err(self.fail(format!("TLS setup: {e}")))
                        }
                    }
                }
                State::Handshake(m) => match m.handshake() {
                    Ok(s) => self.handshake_done(s)?,
                    Err(HandshakeError::WouldBlock(m)) => {
                        self.state = State::Handshake(m);
                        return Err(io::Error::from(ErrorKind::WouldBlock));
                    }
                    Err(HandshakeError::Failure(m)) => {
                        return Err(self.handshake_failed(m.ssl(), m.error().to_string()))
                    }
                    Err(HandshakeError::SetupFailure(e)) => {
                        return Err(self.fail(format!("TLS setup: {e}")))
                    }
                },
            }
        }
    }

    fn open(&mut self) -> io::Result<&mut SslStream<TcpStream>> {
        self.drive()?;
        match &mut self.state {
            State::Open(s) => Ok(s),
            _ => Err(io::Error::from(ErrorKind::WouldBlock)),
        }
    }
}

impl Read for TlsWire {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.open()?.read(buf)
    }
}

impl Write for TlsWire {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.open()?.write(buf)
    }

    /// Gathers up to one record of the pieces and writes them as one. A write
    /// that would block is retried with the same bytes first (the queue behind
    /// has not moved), which is what OpenSSL asks of a retried write.
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let mut staging = std::mem::take(&mut self.staging);
        staging.clear();
        for b in bufs {
            let room = RECORD_MAX - staging.len();
            if room == 0 {
                break;
            }
            staging.extend_from_slice(&b[..b.len().min(room)]);
        }
        let r = match self.open() {
            Ok(s) => s.write(&staging),
            Err(e) => Err(e),
        };
        self.staging = staging;
        r
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Opens a client secure channel over a connected, blocking `sock` with `psk`
/// for `hostnqn` on `subnqn` (the in-repo initiator; tests).
pub fn connect(
    sock: TcpStream,
    psk: &TlsPsk,
    hostnqn: &str,
    subnqn: &str,
) -> Result<SslStream<TcpStream>, TlsError> {
    let identity = psk
        .identity(hostnqn, subnqn)
        .map_err(|e| TlsError::Psk(e.to_string()))?;
    let mut b = context(false)?;
    // Only the PSK's suite: OpenSSL servers pick the suite before they look at
    // the PSK, and a PSK whose hash is not the suite's is skipped.
    b.set_ciphersuites(psk.cipher_suite().name())?;
    // SAFETY: `b` owns a live SSL_CTX; the callback is a plain function.
    unsafe { SSL_CTX_set_psk_use_session_callback(b.as_ptr(), use_session) };
    let ctx = b.build();
    let mut ssl = Ssl::new(&ctx)?;
    let index = client_index().ok_or(TlsError::Index)?;
    ssl.set_ex_data(
        index,
        ClientPsk {
            key: psk.tls_psk(hostnqn, &identity),
            identity: identity.into_bytes(),
            suite: psk.cipher_suite(),
        },
    );
    ssl.connect(sock)
        .map_err(|e| TlsError::Handshake(e.to_string()))
}
