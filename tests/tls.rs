//! NVMe/TCP TLS 1.3 with PSKs end to end: the real target in-process with a
//! `secure_channel` listener and a plaintext one, PSKs in 0600 files named by
//! `[[keys]]`, host entries with `psk`, and the in-repo initiator (OpenSSL's TLS
//! client) as the host over real sockets. SPDK's own initiator is the independent
//! check (tests/spdk-tools/tls.sh).

use kvtarget::auth::psk::PskHash;
use kvtarget::auth::TlsPsk;
use kvtarget::config::Config;
use kvtarget::initiator::{Error, HostController, HostOptions, HostTls, QueueConn};
use kvtarget::server::Server;
use kvtarget::wire::nvme::{self, ConnectCommand, ConnectData, Status};
use kvtarget::wire::tcp::Digests;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

const NQN: &str = "nqn.2026-12.io.kvtarget:tls";
const H256: &str = "nqn.2014-08.org.nvmexpress:uuid:6b767461-7267-6574-0000-0000000000b1";
const H384: &str = "nqn.2014-08.org.nvmexpress:uuid:6b767461-7267-6574-0000-0000000000b2";
const PLAIN: &str = "nqn.2014-08.org.nvmexpress:uuid:6b767461-7267-6574-0000-0000000000b3";

fn psk256() -> TlsPsk {
    TlsPsk::new(&[0x41; 32], PskHash::Sha256).unwrap()
}
fn psk384() -> TlsPsk {
    TlsPsk::new(&[0x42; 48], PskHash::Sha384).unwrap()
}

struct Target {
    server: Server,
    secure: SocketAddr,
    plain: SocketAddr,
    _dir: tempfile::TempDir,
}

/// A subsystem with two PSK hosts (one per cipher suite) and one without, on a
/// secure listener (127.0.0.1) and a plaintext one (127.0.0.2).
fn start() -> Target {
    let dir = tempfile::tempdir().unwrap();
    let mut keys = String::new();
    for (name, k) in [("k256", psk256()), ("k384", psk384())] {
        let p = dir.path().join(name);
        std::fs::write(&p, format!("{}\n", k.encode().as_str())).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        keys += &format!(
            "[[keys]]\nname = \"{name}\"\npath = \"{}\"\n\n",
            p.display()
        );
    }
    let text = format!(
        r#"
[reactors]
count = 2
idle = "adaptive"

[[listeners]]
address = "127.0.0.1"
port = 0
secure_channel = true

[[listeners]]
address = "127.0.0.2"
port = 0

{keys}
[[subsystems]]
nqn = "{NQN}"
hosts = [
  {{ nqn = "{H256}", psk = "k256" }},
  {{ nqn = "{H384}", psk = "k384" }},
  "{PLAIN}",
]

[[subsystems.namespaces]]
nsid = 1
backend = "ram"
size = "16MiB"
block_size = 4096
"#
    );
    let cfg = Config::parse(&text).unwrap();
    let server = Server::start(&cfg).unwrap();
    let nvm: Vec<SocketAddr> = server
        .listen_addrs()
        .iter()
        .filter(|(_, d)| !d)
        .map(|(a, _)| *a)
        .collect();
    Target {
        server,
        secure: nvm[0],
        plain: nvm[1],
        _dir: dir,
    }
}

fn opts(addr: SocketAddr, host: &str, psk: Option<TlsPsk>) -> HostOptions {
    let mut o = HostOptions::new(addr, NQN);
    o.hostnqn = host.into();
    o.tls = psk;
    o.timeout = Duration::from_secs(5);
    o
}

/// Writes and reads back through a new I/O queue (a TLS channel of its own),
/// large enough that data crosses in many TLS records both ways.
fn verified_io(c: &HostController, seed: u8) {
    let mut q = c.io_queue(1).unwrap();
    let data: Vec<u8> = (0..(256 * 1024u32)).map(|i| (i as u8) ^ seed).collect();
    q.write(1, 16, data.clone(), 4096).unwrap();
    assert_eq!(q.read(1, 16, 64, 4096).unwrap(), data);
}

fn connect_cmd() -> ConnectCommand {
    ConnectCommand {
        recfmt: 0,
        qid: 0,
        sqsize: 31,
        cattr: 0,
        kato: 0,
    }
}

/// The target's count of refused TLS connections once it reaches `want` (or
/// what it is after a generous wait). OpenSSL sends the alert that fails the
/// host's handshake before the target's reactor counts the failure, so the
/// host can see its error first.
fn failures_reach(t: &Target, want: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let n = t
            .server
            .target
            .tls_failures
            .load(std::sync::atomic::Ordering::Relaxed);
        if n >= want || Instant::now() > deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn connect_data(host: &str) -> ConnectData {
    ConnectData {
        hostid: *b"kvtarget-host-01",
        cntlid: 0xFFFF,
        subnqn: NQN.into(),
        hostnqn: host.into(),
    }
}

#[test]
fn hosts_connect_through_tls_with_either_cipher_suite() {
    let t = start();
    for (host, psk, seed) in [(H256, psk256(), 1u8), (H384, psk384(), 2)] {
        let c = HostController::connect(&opts(t.secure, host, Some(psk))).unwrap();
        verified_io(&c, seed);
    }
    // The plaintext host on the plaintext listener is unaffected.
    let c = HostController::connect(&opts(t.plain, PLAIN, None)).unwrap();
    verified_io(&c, 3);
    let qpairs = t
        .server
        .target
        .tls_failures
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(qpairs, 0);
}

#[test]
fn plaintext_on_a_secure_listener_is_refused() {
    let t = start();
    // An ICReq where a ClientHello belongs: the connection closes without an
    // ICResp.
    let err = QueueConn::open(t.secure, Digests::default(), Duration::from_secs(3))
        .err()
        .expect("plaintext ICReq refused");
    assert!(
        matches!(&err, Error::Io(e) if matches!(e.kind(), std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset)),
        "{err:?}"
    );
    assert_eq!(failures_reach(&t, 1), 1);
    // ... and a TLS ClientHello on a plaintext listener is not NVMe/TCP: the
    // handshake fails (the target terminates the connection).
    let r = HostController::connect(&opts(t.plain, H256, Some(psk256())));
    assert!(matches!(r, Err(Error::Tls(_))), "{:?}", r.err());
    // Secure hosts still get through.
    let c = HostController::connect(&opts(t.secure, H256, Some(psk256()))).unwrap();
    verified_io(&c, 4);
}

#[test]
fn wrong_unknown_and_missing_psks_are_refused() {
    let t = start();
    // The right identity, another key: the handshake fails (binder mismatch).
    let wrong = TlsPsk::new(&[0x99; 32], PskHash::Sha256).unwrap();
    let r = HostController::connect(&opts(t.secure, H256, Some(wrong)));
    assert!(matches!(r, Err(Error::Tls(_))), "{:?}", r.err());
    // A host with no PSK on the subsystem.
    let r = HostController::connect(&opts(t.secure, PLAIN, Some(psk256())));
    assert!(matches!(r, Err(Error::Tls(_))), "{:?}", r.err());
    // A 32-byte key for a host configured with a 48-byte one: its identity names
    // the other cipher suite.
    let r = HostController::connect(&opts(t.secure, H384, Some(psk256())));
    assert!(matches!(r, Err(Error::Tls(_))), "{:?}", r.err());
    assert_eq!(failures_reach(&t, 3), 3);
    // A PSK host on the plaintext listener: Connect says the host is not allowed
    // there.
    let r = HostController::connect(&opts(t.plain, H256, None));
    assert!(
        matches!(&r, Err(Error::Status(s, _)) if *s == Status::CONNECT_INVALID_HOST),
        "{:?}",
        r.err()
    );
    let c = HostController::connect(&opts(t.secure, H384, Some(psk384()))).unwrap();
    verified_io(&c, 5);
}

#[test]
fn connect_must_name_the_host_and_subsystem_of_the_psk_identity() {
    let t = start();
    let tls = HostTls {
        psk: psk256(),
        hostnqn: H256.into(),
        subnqn: NQN.into(),
    };
    for host in [PLAIN, H384] {
        let mut q = QueueConn::open_secure(
            t.secure,
            Digests::default(),
            Duration::from_secs(5),
            Some(&tls),
        )
        .unwrap();
        let r = q.fabrics_connect(&connect_cmd(), &connect_data(host));
        assert!(
            matches!(&r, Err(Error::Status(s, _)) if *s == Status::CONNECT_INVALID_HOST),
            "{host}: {r:?}"
        );
    }
    let mut q = QueueConn::open_secure(
        t.secure,
        Digests::default(),
        Duration::from_secs(5),
        Some(&tls),
    )
    .unwrap();
    assert!(q
        .fabrics_connect(&connect_cmd(), &connect_data(H256))
        .is_ok());
}

#[test]
fn discovery_names_the_secure_listener() {
    let t = start();
    let mut o = opts(t.plain, PLAIN, None);
    o.subnqn = nvme::DISCOVERY_NQN.into();
    let mut c = HostController::connect(&o).unwrap();
    let log = c.discovery_log().unwrap();
    let find = |a: SocketAddr| {
        log.iter()
            .find(|e| {
                e.subnqn == NQN
                    && e.trsvcid == a.port().to_string()
                    && e.traddr == a.ip().to_string()
            })
            .cloned()
            .unwrap_or_else(|| panic!("{a} not in {log:?}"))
    };
    let s = find(t.secure);
    assert_eq!((s.treq & 3, s.sectype), (0x01, 2), "required, TLS 1.3");
    let p = find(t.plain);
    assert_eq!((p.treq & 3, p.sectype), (0x02, 0), "not required, none");
}

#[test]
fn garbage_after_the_handshake_and_half_handshakes_do_not_disturb_others() {
    let t = start();
    let good = HostController::connect(&opts(t.secure, H256, Some(psk256()))).unwrap();
    // A ClientHello-looking first byte followed by junk, then a silent socket.
    let mut s = TcpStream::connect(t.secure).unwrap();
    s.write_all(&[0x16, 0x03, 0x01, 0x00, 0x05, 1, 2, 3, 4, 5])
        .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut b = [0u8; 64];
    // The target answers with an alert or closes; either way it does not hang.
    let _ = s.read(&mut b);
    let half = TcpStream::connect(t.secure).unwrap();
    verified_io(&good, 6);
    drop(half);
}

/// A secure and a plaintext listener on one address share one discovery port
/// (it was bound once per listener, and the second bind failed).
#[test]
fn two_listeners_on_one_address_share_the_discovery_port() {
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let (p1, p2) = (free(), free());
    let text = format!(
        r#"
[[listeners]]
address = "127.0.0.1"
port = {p1}
secure_channel = true

[[listeners]]
address = "127.0.0.1"
port = {p2}

[discovery]
port = 0

[[subsystems]]
nqn = "{NQN}"
allow_any_host = true

[[subsystems.namespaces]]
nsid = 1
backend = "ram"
size = "16MiB"
block_size = 4096
"#
    );
    let server = Server::start(&Config::parse(&text).unwrap()).unwrap();
    let disc: Vec<SocketAddr> = server
        .listen_addrs()
        .iter()
        .filter(|(_, d)| *d)
        .map(|(a, _)| *a)
        .collect();
    assert_eq!(disc.len(), 1, "{:?}", server.listen_addrs());
    let mut o = opts(disc[0], PLAIN, None);
    o.subnqn = nvme::DISCOVERY_NQN.into();
    let mut c = HostController::connect(&o).unwrap();
    let log = c.discovery_log().unwrap();
    let secure = log
        .iter()
        .find(|e| e.subnqn == NQN && e.trsvcid == p1.to_string());
    assert_eq!(
        secure.map(|e| (e.treq & 3, e.sectype)),
        Some((1, 2)),
        "{log:?}"
    );
}
