//! What the integration tests share (dev-only): a target started in process
//! from a configuration text, the daemon binary started as a process on a
//! written configuration, free ports, an initiator connected with its I/O
//! queues, and the RPC client. Each test binary uses part of it; the daemon
//! binary's path is known only to the tests of the package that builds it
//! (`tests/support`).

use kvt_config::Config;
use kvt_control::rpc::RpcClient;
use kvt_control::server::Server;
use kvt_host::initiator::{Error, HostController, HostOptions, IoQueue};
use kvt_wire::nvme::Status;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a daemon may take to answer after it was started: a bound for a
/// daemon that never comes up. 20 s ran out once in 20 flake-hunt rounds for a
/// restart after a SIGKILL under load (its recovery's reads and fsyncs behind
/// a busy disk).
pub const DAEMON_START: Duration = Duration::from_secs(60);

/// How long the tests' host waits for one command: a bound that catches a
/// hang, not a speed test. The initiator's own 10 s ran out on a loaded CI
/// machine (a KV Store on a full namespace waits for a commit, whose fsync
/// queued behind a build's writes: tests/kv.rs, two Stores past 10 s).
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// The tests' host options for `nqn` at `addr` (`COMMAND_TIMEOUT`).
pub fn host_options(addr: SocketAddr, nqn: &str) -> HostOptions {
    let mut opts = HostOptions::new(addr, nqn);
    opts.timeout = COMMAND_TIMEOUT;
    opts
}

/// A TCP port free on the loopback address (free when asked: the daemon
/// binds it a moment later).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The loopback address at `port`.
pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A target started in process from a TOML configuration.
pub fn server(toml: &str) -> Server {
    Server::start(&Config::parse(toml).expect("config")).expect("start")
}

/// `server`, and the address of its first listener.
pub fn start_server(toml: &str) -> (Server, SocketAddr) {
    let server = server(toml);
    let addr = server.listen_addrs()[0].0;
    (server, addr)
}

/// A client of the in-process target's RPC socket.
pub fn rpc_client(s: &Server) -> RpcClient {
    RpcClient::connect(s.rpc_path().expect("rpc socket")).expect("connect")
}

/// Connects a host to `nqn` at `addr` with `queues` I/O queues (IDs 1 on).
pub fn connect(addr: SocketAddr, nqn: &str, queues: u16) -> (HostController, Vec<IoQueue>) {
    let mut c = HostController::connect(&host_options(addr, nqn)).expect("connect");
    c.set_queue_count(queues).expect("queues");
    let qs = (1..=queues)
        .map(|q| c.io_queue(q).expect("io queue"))
        .collect();
    (c, qs)
}

/// Connects a host to `nqn` at `addr`, trying again while a daemon starts.
pub fn connect_retry(addr: SocketAddr, nqn: &str) -> HostController {
    let opts = host_options(addr, nqn);
    let t0 = Instant::now();
    loop {
        match HostController::connect(&opts) {
            Ok(c) => return c,
            Err(_) if t0.elapsed() < DAEMON_START => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => panic!("daemon never answered: {e}"),
        }
    }
}

/// Writes a configuration file `name` into `dir`.
pub fn write_config(dir: &Path, name: &str, toml: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, toml).unwrap();
    path
}

/// The daemon binary `bin` as a process on the configuration `cfg`, its RPC
/// socket at `sock`, its log discarded.
pub fn spawn_daemon(bin: &str, cfg: &Path, sock: &Path) -> Child {
    Command::new(bin)
        .arg("--config")
        .arg(cfg)
        .arg("-r")
        .arg(sock)
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Waits until `path` exists (a daemon's RPC socket), at most `DAEMON_START`.
pub fn wait_for_path(path: &Path) {
    let t0 = Instant::now();
    while !path.exists() && t0.elapsed() < DAEMON_START {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The NVMe status a command failed with.
pub fn status_of(e: Error) -> Status {
    match e {
        Error::Status(s, _) => s,
        other => panic!("expected an NVMe status, got {other:?}"),
    }
}
