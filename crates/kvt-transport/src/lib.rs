//! Transports: how capsules reach the target. NVMe/TCP (`tcp`) and NVMe/RDMA
//! (`rdma`), each a `QueuePair` implementation handed to reactors.

pub mod out;
pub mod rdma;
pub mod tcp;
pub mod tls;

use kvt_nvmf::Target;
use kvt_reactor::sys::{wait_readable, EventFd, CONTROL_ERROR_PAUSE};
use kvt_reactor::{Message, ReactorShared};
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A bound TCP listener and what it serves.
pub struct TcpListenerSpec {
    pub listener: TcpListener,
    pub addr: SocketAddr,
    pub discovery_only: bool,
    /// TLS 1.3 required (`secure_channel`): a plaintext ICReq is refused.
    pub secure: bool,
}

/// Why a TCP listener could not be set up; names the address.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// Making the socket non-blocking or reading back its bound address.
    #[error("{addr}: {source}")]
    Socket {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Binds a listener; the error names the address.
pub fn bind(
    addr: SocketAddr,
    discovery_only: bool,
    secure: bool,
) -> Result<TcpListenerSpec, ListenError> {
    let listener = TcpListener::bind(addr).map_err(|source| ListenError::Bind { addr, source })?;
    let socket = |source| ListenError::Socket { addr, source };
    listener.set_nonblocking(true).map_err(socket)?;
    let addr = listener.local_addr().map_err(socket)?;
    Ok(TcpListenerSpec {
        listener,
        addr,
        discovery_only,
        secure,
    })
}

/// The listening sockets the acceptor polls; RPC adds and removes them at run
/// time (existing connections are not affected by a removal).
pub struct ListenerSet {
    specs: Mutex<Vec<Arc<TcpListenerSpec>>>,
    gen: AtomicU64,
    /// Wakes the acceptor, which otherwise sleeps until a connection comes:
    /// signalled on every change of the set and at shutdown.
    wake: EventFd,
}

impl ListenerSet {
    pub fn new(specs: Vec<TcpListenerSpec>) -> io::Result<ListenerSet> {
        Ok(ListenerSet {
            specs: Mutex::new(specs.into_iter().map(Arc::new).collect()),
            gen: AtomicU64::new(0),
            wake: EventFd::new()?,
        })
    }

    /// Makes the acceptor look at the set and at its stop flag again.
    pub fn wake(&self) {
        self.wake.signal();
    }

    fn changed(&self) {
        self.gen.fetch_add(1, Ordering::AcqRel);
        self.wake();
    }

    pub fn snapshot(&self) -> Vec<Arc<TcpListenerSpec>> {
        self.specs.lock().map(|s| s.clone()).unwrap_or_default()
    }
    pub fn contains(&self, addr: SocketAddr) -> bool {
        self.snapshot().iter().any(|s| s.addr == addr)
    }
    pub fn add(&self, spec: TcpListenerSpec) {
        if let Ok(mut s) = self.specs.lock() {
            s.push(Arc::new(spec));
        }
        self.changed();
    }
    /// Closes every listening socket (target shutdown).
    pub fn clear(&self) {
        if let Ok(mut s) = self.specs.lock() {
            s.clear();
        }
        self.changed();
    }

    /// Stops listening on `addr`; returns whether it was listening.
    pub fn remove(&self, addr: SocketAddr) -> bool {
        let removed = self
            .specs
            .lock()
            .map(|mut s| {
                let n = s.len();
                s.retain(|x| x.addr != addr);
                n != s.len()
            })
            .unwrap_or(false);
        self.changed();
        removed
    }
}

/// Accepts connections on every listener and hands them to reactors round-robin
/// (poll groups). Runs on the control thread until `stop` is set.
pub fn accept_loop(
    set: Arc<ListenerSet>,
    reactors: Vec<Arc<ReactorShared>>,
    target: Arc<Target>,
    stop: Arc<AtomicBool>,
) {
    let mut next = 0usize;
    let mut gen = u64::MAX;
    // Made on the first secure connection, shared by every secure listener.
    let mut tls: Option<Arc<tls::TlsServer>> = None;
    let mut listeners: Vec<Arc<TcpListenerSpec>> = Vec::new();
    let mut fds: Vec<std::os::fd::RawFd> = Vec::new();
    let mut ready = Vec::new();
    while !stop.load(Ordering::Acquire) {
        let g = set.gen.load(Ordering::Acquire);
        if g != gen {
            gen = g;
            listeners = set.snapshot();
            fds = listeners.iter().map(|l| l.listener.as_raw_fd()).collect();
        }
        match wait_readable(&fds, &set.wake, &mut ready) {
            Ok(true) => {
                set.wake.drain();
                continue;
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!("acceptor: poll: {e}");
                std::thread::sleep(CONTROL_ERROR_PAUSE);
                continue;
            }
        }
        for (i, l) in listeners.iter().enumerate() {
            if !ready[i] {
                continue;
            }
            loop {
                match l.listener.accept() {
                    Ok((sock, peer)) => {
                        let qp = if l.secure {
                            secure_connection(&mut tls, sock, &target, l.discovery_only)
                        } else {
                            tcp::TcpConnection::new(sock, target.clone(), l.discovery_only)
                                .map(|c| Box::new(c) as Box<dyn kvt_reactor::QueuePair>)
                                .map_err(|e| e.to_string())
                        };
                        let qp = match qp {
                            Ok(qp) => qp,
                            Err(e) => {
                                tracing::warn!(%peer, "cannot set up connection: {e}");
                                continue;
                            }
                        };
                        let r = &reactors[next % reactors.len()];
                        next = next.wrapping_add(1);
                        tracing::debug!(%peer, listener = %l.addr, reactor = r.id, "accepted");
                        if let Err(Message::Adopt(qp)) = r.send(Message::Adopt(qp)) {
                            // Inbox full: refuse the connection rather than queue
                            // unboundedly; the host retries.
                            tracing::warn!(%peer, reactor = r.id, "reactor inbox full; dropping connection");
                            drop(qp);
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        tracing::warn!(listener = %l.addr, "accept: {e}");
                        std::thread::sleep(CONTROL_ERROR_PAUSE);
                        break;
                    }
                }
            }
        }
    }
}

/// A connection on a secure listener: TLS first, NVMe/TCP inside it.
fn secure_connection(
    tls: &mut Option<Arc<tls::TlsServer>>,
    sock: std::net::TcpStream,
    target: &Arc<Target>,
    discovery_only: bool,
) -> Result<Box<dyn kvt_reactor::QueuePair>, String> {
    let server = match tls {
        Some(s) => s.clone(),
        None => {
            let s = Arc::new(tls::TlsServer::new().map_err(|e| e.to_string())?);
            *tls = Some(s.clone());
            s
        }
    };
    let wire = tls::TlsWire::new(sock, server, target.clone()).map_err(|e| e.to_string())?;
    let c =
        tcp::TcpConnection::new(wire, target.clone(), discovery_only).map_err(|e| e.to_string())?;
    Ok(Box::new(c))
}
