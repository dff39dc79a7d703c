//! JSON-RPC 2.0 over a Unix socket, with SPDK's method and parameter names so
//! SPDK's own `rpc.py` / `spdk-rpc` client drives kvtarget unchanged.
//!
//! Framing follows SPDK's server: a connection carries a stream of JSON values
//! (objects, or arrays for batches) with no delimiters; each request gets one
//! response object, in order. A request larger than `MAX_REQUEST` or bytes that
//! cannot be JSON get a parse error and the connection is closed; nothing a
//! client sends can panic or block the daemon (each connection has its own
//! thread, reads time out, and at most `MAX_CLIENTS` are served at once).

pub mod methods;

use serde_json::{json, Value};
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kvt_reactor::sys::{wait_readable, EventFd, CONTROL_ERROR_PAUSE};
use std::os::fd::AsRawFd;

/// Default socket path (like SPDK's /var/tmp/spdk.sock); `[rpc] socket`'s default.
pub use kvt_config::DEFAULT_SOCKET;
/// Largest request accepted (SPDK's default limit is also in the MiB range).
pub const MAX_REQUEST: usize = 1 << 20;
const MAX_CLIENTS: usize = 64;

/// JSON-RPC error codes, as SPDK uses them.
pub mod code {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL_ERROR: i64 = -32603;
    /// errno-style codes SPDK returns for specific failures.
    pub const ENOENT: i64 = -2;
    pub const EEXIST: i64 = -17;
    pub const EBUSY: i64 = -16;
    pub const ENOSPC: i64 = -28;
}

/// A JSON-RPC error object.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
        }
    }
    pub fn params(message: impl Into<String>) -> RpcError {
        RpcError::new(code::INVALID_PARAMS, message)
    }
}

pub type RpcResult = Result<Value, RpcError>;

/// Answers one decoded JSON value (a request or a batch). `None`: nothing to
/// send (a notification, or a batch of notifications).
pub fn handle_value(ctl: &methods::Control, v: Value) -> Option<Value> {
    match v {
        Value::Array(reqs) => {
            if reqs.is_empty() {
                return Some(error_response(
                    Value::Null,
                    RpcError::new(code::INVALID_REQUEST, "empty batch"),
                ));
            }
            let out: Vec<Value> = reqs
                .into_iter()
                .filter_map(|r| handle_request(ctl, r))
                .collect();
            (!out.is_empty()).then_some(Value::Array(out))
        }
        other => handle_request(ctl, other),
    }
}

fn error_response(id: Value, e: RpcError) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": e.code, "message": e.message}})
}

fn handle_request(ctl: &methods::Control, req: Value) -> Option<Value> {
    let Value::Object(mut obj) = req else {
        return Some(error_response(
            Value::Null,
            RpcError::new(code::INVALID_REQUEST, "a request must be a JSON object"),
        ));
    };
    let id = obj.remove("id");
    let respond_id = id.clone().unwrap_or(Value::Null);
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Some(error_response(
            respond_id,
            RpcError::new(code::INVALID_REQUEST, "\"jsonrpc\" must be \"2.0\""),
        ));
    }
    if let Some(i) = &id {
        if !(i.is_number() || i.is_string() || i.is_null()) {
            return Some(error_response(
                Value::Null,
                RpcError::new(code::INVALID_REQUEST, "\"id\" must be a number or a string"),
            ));
        }
    }
    let Some(Value::String(method)) = obj.remove("method") else {
        return Some(error_response(
            respond_id,
            RpcError::new(code::INVALID_REQUEST, "\"method\" must be a string"),
        ));
    };
    let params = match obj.remove("params") {
        None | Some(Value::Null) => Value::Object(Default::default()),
        Some(p @ Value::Object(_)) => p,
        Some(_) => {
            return Some(error_response(
                respond_id,
                RpcError::params("\"params\" must be an object"),
            ))
        }
    };
    let result = ctl.call(&method, params);
    // A request without an id is a notification: no response.
    let id = id?;
    Some(match result {
        Ok(v) => json!({"jsonrpc": "2.0", "id": id, "result": v}),
        Err(e) => {
            tracing::info!(method = %method, code = e.code, "rpc error: {}", e.message);
            error_response(id, e)
        }
    })
}

/// The RPC server: a listening socket and its accept thread.
pub struct RpcServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    /// Signalled once, at stop, and never drained: the accept thread and
    /// every client thread sleep on it beside their socket.
    wake: Arc<EventFd>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RpcServer {
    /// Binds the socket. A stale socket file (nobody listening) is replaced; a
    /// live one is an error, so two targets never share a control socket.
    pub fn start(path: &Path, ctl: Arc<methods::Control>) -> Result<RpcServer, SocketError> {
        let at = |source| SocketError::Bind {
            path: path.into(),
            source,
        };
        if path.exists() {
            if UnixStream::connect(path).is_ok() {
                return Err(SocketError::InUse(path.into()));
            }
            std::fs::remove_file(path).map_err(|source| SocketError::Stale {
                path: path.into(),
                source,
            })?;
        }
        let listener = UnixListener::bind(path).map_err(at)?;
        listener.set_nonblocking(true).map_err(at)?;
        let stop = Arc::new(AtomicBool::new(false));
        let wake = Arc::new(EventFd::new().map_err(SocketError::Thread)?);
        let (st, wk) = (stop.clone(), wake.clone());
        let thread = std::thread::Builder::new()
            .name("rpc".into())
            .spawn(move || accept_loop(listener, ctl, st, wk))
            .map_err(SocketError::Thread)?;
        tracing::info!("JSON-RPC listening on {}", path.display());
        Ok(RpcServer {
            path: path.to_path_buf(),
            stop,
            wake,
            thread: Some(thread),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.wake.signal();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for RpcServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(
    listener: UnixListener,
    ctl: Arc<methods::Control>,
    stop: Arc<AtomicBool>,
    wake: Arc<EventFd>,
) {
    let clients = Arc::new(AtomicUsize::new(0));
    let mut ready = Vec::new();
    while !stop.load(Ordering::Acquire) {
        match wait_readable(&[listener.as_raw_fd()], &wake, &mut ready) {
            // Only a stop signals it: the loop's condition ends the thread.
            Ok(true) => continue,
            Ok(false) if ready[0] => {}
            Ok(false) => continue,
            Err(e) => {
                tracing::warn!("rpc: poll: {e}");
                std::thread::sleep(CONTROL_ERROR_PAUSE);
                continue;
            }
        }
        match listener.accept() {
            Ok((sock, _)) => {
                if clients.load(Ordering::Acquire) >= MAX_CLIENTS {
                    tracing::warn!("rpc: too many clients; refusing one");
                    continue;
                }
                clients.fetch_add(1, Ordering::AcqRel);
                let (ctl, clients) = (ctl.clone(), clients.clone());
                let (stop, wake) = (stop.clone(), wake.clone());
                let spawned =
                    std::thread::Builder::new()
                        .name("rpc-client".into())
                        .spawn(move || {
                            serve_client(sock, &ctl, &stop, &wake);
                            clients.fetch_sub(1, Ordering::AcqRel);
                        });
                if spawned.is_err() {
                    tracing::warn!("rpc: cannot start a client thread");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => {
                tracing::warn!("rpc accept: {e}");
                std::thread::sleep(CONTROL_ERROR_PAUSE);
            }
        }
    }
}

/// Serves one client until it closes, sends garbage, or the server stops.
fn serve_client(mut sock: UnixStream, ctl: &methods::Control, stop: &AtomicBool, wake: &EventFd) {
    if sock.set_nonblocking(false).is_err() {
        return;
    }
    let mut ready = Vec::new();
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 16 << 10];
    loop {
        // Answer every complete value in the buffer.
        loop {
            let start = buf.iter().position(|b| !b.is_ascii_whitespace());
            let Some(start) = start else {
                buf.clear();
                break;
            };
            let mut it = serde_json::Deserializer::from_slice(&buf[start..]).into_iter::<Value>();
            match it.next() {
                Some(Ok(v)) => {
                    let used = start + it.byte_offset();
                    buf.drain(..used);
                    if let Some(resp) = handle_value(ctl, v) {
                        let mut out = resp.to_string().into_bytes();
                        out.push(b'\n');
                        if sock.write_all(&out).is_err() {
                            return;
                        }
                    }
                }
                Some(Err(e)) if e.is_eof() => break,
                Some(Err(e)) => {
                    let resp = error_response(
                        Value::Null,
                        RpcError::new(code::PARSE_ERROR, format!("parse error: {e}")),
                    );
                    let _ = sock.write_all(resp.to_string().as_bytes());
                    return;
                }
                None => break,
            }
        }
        if buf.len() > MAX_REQUEST {
            let resp = error_response(
                Value::Null,
                RpcError::new(
                    code::PARSE_ERROR,
                    format!("request larger than {MAX_REQUEST} bytes"),
                ),
            );
            let _ = sock.write_all(resp.to_string().as_bytes());
            return;
        }
        // Sleeps until the client sends or the server stops: an idle
        // connection costs no wake-ups.
        match wait_readable(&[sock.as_raw_fd()], wake, &mut ready) {
            Ok(false) if ready[0] => {}
            Ok(false) => continue,
            Ok(true) | Err(_) => return,
        }
        if stop.load(Ordering::Acquire) {
            return;
        }
        match sock.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// A blocking client for the CLI and tests.
/// Errors of the control socket, server and client side; each one line.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("rpc socket {}: another process is listening on it", .0.display())]
    InUse(PathBuf),
    #[error("rpc socket {}: cannot remove stale socket: {source}", path.display())]
    Stale {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("rpc socket {}: {source}", path.display())]
    Bind {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("rpc thread: {0}")]
    Thread(std::io::Error),
    #[error("cannot connect to {}: {source}", path.display())]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("bad response: {0}")]
    BadResponse(serde_json::Error),
    #[error("connection closed")]
    Closed,
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

pub struct RpcClient {
    sock: UnixStream,
    buf: Vec<u8>,
    next_id: u64,
}

impl RpcClient {
    pub fn connect(path: &Path) -> Result<RpcClient, SocketError> {
        let sock = UnixStream::connect(path).map_err(|source| SocketError::Connect {
            path: path.into(),
            source,
        })?;
        sock.set_read_timeout(Some(Duration::from_secs(60)))?;
        Ok(RpcClient {
            sock,
            buf: Vec::new(),
            next_id: 1,
        })
    }

    /// Sends raw bytes (tests of bad input).
    pub fn send_raw(&mut self, b: &[u8]) -> Result<(), SocketError> {
        Ok(self.sock.write_all(b)?)
    }

    /// Reads the next response value.
    pub fn recv(&mut self) -> Result<Value, SocketError> {
        let mut chunk = [0u8; 16 << 10];
        loop {
            if let Some(start) = self.buf.iter().position(|b| !b.is_ascii_whitespace()) {
                let mut it =
                    serde_json::Deserializer::from_slice(&self.buf[start..]).into_iter::<Value>();
                match it.next() {
                    Some(Ok(v)) => {
                        let used = start + it.byte_offset();
                        self.buf.drain(..used);
                        return Ok(v);
                    }
                    Some(Err(e)) if !e.is_eof() => return Err(SocketError::BadResponse(e)),
                    _ => {}
                }
            }
            match self.sock.read(&mut chunk) {
                Ok(0) => return Err(SocketError::Closed),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Calls a method; the JSON-RPC error object becomes `Err`.
    pub fn call(&mut self, method: &str, params: Value) -> Result<Value, RpcError> {
        let id = self.next_id;
        self.next_id += 1;
        let req = json!({"jsonrpc": "2.0", "method": method, "id": id, "params": params});
        self.send_raw(req.to_string().as_bytes())
            .map_err(|e| RpcError::new(code::INTERNAL_ERROR, e.to_string()))?;
        let resp = self
            .recv()
            .map_err(|e| RpcError::new(code::INTERNAL_ERROR, e.to_string()))?;
        if let Some(e) = resp.get("error") {
            return Err(RpcError::new(
                e.get("code").and_then(Value::as_i64).unwrap_or(0),
                e.get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
            ));
        }
        Ok(resp.get("result").cloned().unwrap_or(Value::Null))
    }
}
