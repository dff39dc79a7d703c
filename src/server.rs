//! Assembles a running target from a configuration: devices, namespaces,
//! subsystems, reactors, listeners; and takes it down cleanly.

use crate::bdev::ram::RamDevice;
use crate::bdev::uring::UringDevice;
use crate::bdev::SharedDevice;
use crate::config::{Backend, Config};
use crate::reactor::{Message, Reactor, ReactorShared};
use crate::target::{Listener, Namespace, Subsystem, SubsystemKind, Target, TransportLimits};
use crate::transport;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

pub struct Server {
    pub target: Arc<Target>,
    reactors: Vec<(Arc<ReactorShared>, JoinHandle<()>)>,
    acceptor: Option<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    devices: Vec<SharedDevice>,
    listen: Vec<(SocketAddr, bool)>,
}

impl Server {
    /// Starts everything the configuration describes. Errors are one line.
    pub fn start(cfg: &Config) -> Result<Server, String> {
        let t = &cfg.tcp;
        let limits = TransportLimits {
            max_queue_depth: t.max_queue_depth,
            max_admin_queue_depth: t.max_queue_depth.max(32),
            max_io_queues: t.max_io_queues,
            in_capsule_data: t.in_capsule_data as u32,
            max_io_size: t.max_io_size as u32,
            max_h2c_data: t.max_h2c_data as u32,
            max_r2t_len: t.max_r2t_length.min(u32::MAX as u64) as u32,
            c2h_success: t.c2h_success,
        };
        let target = Arc::new(Target::new(limits));
        let mut devices: Vec<SharedDevice> = Vec::new();
        for (i, s) in cfg.subsystems.iter().enumerate() {
            let subsys = Arc::new(Subsystem::new(
                &s.nqn,
                SubsystemKind::Nvm,
                &s.serial,
                &s.model,
                s.allow_any_host,
                s.hosts.clone(),
            ));
            for (j, n) in s.namespaces.iter().enumerate() {
                let field = format!("subsystems[{i}].namespaces[{j}]");
                let dev: SharedDevice = match n.backend {
                    Backend::Ram => {
                        RamDevice::new(&format!("{}/{}", s.nqn, n.nsid), n.size.unwrap_or(0))
                            .map_err(|e| format!("{field}: {e}"))?
                    }
                    Backend::Uring => {
                        let path = n.path.as_deref().ok_or(format!("{field}.path: required"))?;
                        UringDevice::open(path, n.size, n.block_size)
                            .map_err(|e| format!("{field}: {e}"))?
                    }
                };
                if dev.size_bytes() < n.block_size as u64 {
                    return Err(format!("{field}: device is smaller than one block"));
                }
                tracing::info!(subnqn = %s.nqn, nsid = n.nsid, dev = %dev.describe(), bytes = dev.size_bytes(), block_size = n.block_size, "namespace");
                devices.push(dev.clone());
                let ns = Namespace::new(&s.nqn, n.nsid, dev, n.block_size);
                if let Ok(mut v) = subsys.namespaces.write() {
                    v.push(Arc::new(ns));
                }
            }
            target.add_subsystem(subsys);
        }

        let mut specs = Vec::new();
        for a in cfg.listen_addrs()? {
            specs.push(transport::bind(a, false)?);
            if let Some(p) = cfg.discovery.port {
                specs.push(transport::bind(SocketAddr::new(a.ip(), p), true)?);
            }
        }
        let listen: Vec<(SocketAddr, bool)> =
            specs.iter().map(|s| (s.addr, s.discovery_only)).collect();
        if let Ok(mut l) = target.listeners.write() {
            for (i, (addr, d)) in listen.iter().enumerate() {
                l.push(Listener {
                    addr: *addr,
                    discovery_only: *d,
                    portid: i as u16 + 1,
                });
            }
        }

        let mut reactors = Vec::new();
        for (i, core) in cfg.reactor_cores().into_iter().enumerate() {
            let r = Reactor::spawn(i, cfg.reactors.idle, core)
                .map_err(|e| format!("reactor {i}: {e}"))?;
            reactors.push(r);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let shared: Vec<_> = reactors.iter().map(|(s, _)| s.clone()).collect();
        let (tgt, st) = (target.clone(), stop.clone());
        let acceptor = std::thread::Builder::new()
            .name("acceptor".into())
            .spawn(move || transport::accept_loop(specs, shared, tgt, st))
            .map_err(|e| format!("acceptor thread: {e}"))?;
        for (a, d) in &listen {
            tracing::info!(
                "listening on {a} ({})",
                if *d { "discovery" } else { "NVMe/TCP" }
            );
        }
        Ok(Server {
            target,
            reactors,
            acceptor: Some(acceptor),
            stop,
            devices,
            listen,
        })
    }

    /// Bound addresses (useful with port 0) and whether each is discovery-only.
    pub fn listen_addrs(&self) -> &[(SocketAddr, bool)] {
        &self.listen
    }

    /// Stops accepting, lets every queue pair finish its in-flight I/O and close,
    /// then syncs every device.
    pub fn shutdown(mut self) {
        self.stop_all();
    }

    fn stop_all(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        for (r, _) in &self.reactors {
            while r.send(Message::Shutdown).is_err() {
                std::thread::yield_now();
            }
        }
        for (_, h) in self.reactors.drain(..) {
            let _ = h.join();
        }
        for d in &self.devices {
            if let Err(e) = d.sync() {
                tracing::error!(dev = %d.describe(), "sync at shutdown failed: {e}");
            }
        }
        self.devices.clear();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.acceptor.is_some() || !self.reactors.is_empty() {
            self.stop_all();
        }
    }
}
