//! Transports: how capsules reach the target. NVMe/TCP today; NVMe/RDMA plugs in
//! beside it as another `QueuePair` implementation.

pub mod tcp;

use crate::reactor::{Message, ReactorShared};
use crate::target::Target;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A bound TCP listener and what it serves.
pub struct TcpListenerSpec {
    pub listener: TcpListener,
    pub addr: SocketAddr,
    pub discovery_only: bool,
}

/// Binds a listener; the error names the address.
pub fn bind(addr: SocketAddr, discovery_only: bool) -> Result<TcpListenerSpec, String> {
    let listener = TcpListener::bind(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("{addr}: {e}"))?;
    let addr = listener.local_addr().map_err(|e| format!("{addr}: {e}"))?;
    Ok(TcpListenerSpec {
        listener,
        addr,
        discovery_only,
    })
}

/// Accepts connections on every listener and hands them to reactors round-robin
/// (poll groups). Runs on the control thread until `stop` is set.
pub fn accept_loop(
    listeners: Vec<TcpListenerSpec>,
    reactors: Vec<Arc<ReactorShared>>,
    target: Arc<Target>,
    stop: Arc<AtomicBool>,
) {
    let mut next = 0usize;
    let mut pfds: Vec<libc::pollfd> = listeners
        .iter()
        .map(|l| libc::pollfd {
            fd: l.listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    while !stop.load(Ordering::Acquire) {
        // SAFETY: pfds is a valid array of pollfd for the duration of the call.
        let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, 200) };
        if n <= 0 {
            continue;
        }
        for (i, l) in listeners.iter().enumerate() {
            if pfds[i].revents == 0 {
                continue;
            }
            loop {
                match l.listener.accept() {
                    Ok((sock, peer)) => {
                        let qp =
                            match tcp::TcpConnection::new(sock, target.clone(), l.discovery_only) {
                                Ok(qp) => qp,
                                Err(e) => {
                                    tracing::warn!(%peer, "cannot set up connection: {e}");
                                    continue;
                                }
                            };
                        let r = &reactors[next % reactors.len()];
                        next = next.wrapping_add(1);
                        tracing::debug!(%peer, listener = %l.addr, reactor = r.id, "accepted");
                        if let Err(Message::Adopt(qp)) = r.send(Message::Adopt(Box::new(qp))) {
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
                        break;
                    }
                }
            }
        }
    }
}
