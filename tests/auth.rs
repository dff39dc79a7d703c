//! DH-HMAC-CHAP end to end: the real target in-process on loopback, keys in 0600
//! files named by `[[keys]]`, host entries with `dhchap_key` / `dhchap_ctrlr_key`,
//! and the in-repo initiator as the host over real sockets. SPDK's own initiator is
//! the independent check (tests/spdk-tools/auth.sh).

use kvtarget::auth::{DhGroup, DhchapSecret, Digest};
use kvtarget::config::Config;
use kvtarget::initiator::{Error, HostController, HostDhchap, HostOptions, QueueConn};
use kvtarget::server::Server;
use kvtarget::wire::nvme::{self, fctype, ConnectCommand, ConnectData, PropertyCommand, Status};
use kvtarget::wire::tcp::Digests;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

const NQN: &str = "nqn.2026-12.io.kvtarget:auth";
const UNI: &str = "nqn.2014-08.org.nvmexpress:uuid:6b767461-7267-6574-0000-0000000000a1";
const BIDI: &str = "nqn.2014-08.org.nvmexpress:uuid:6b767461-7267-6574-0000-0000000000a2";
const PLAIN: &str = "nqn.2014-08.org.nvmexpress:uuid:6b767461-7267-6574-0000-0000000000a3";

fn secret(byte: u8, t: Option<Digest>) -> DhchapSecret {
    DhchapSecret::new(&[byte; 32], t).unwrap()
}
fn host_secret() -> DhchapSecret {
    secret(0x11, Some(Digest::Sha256))
}
fn bidi_secret() -> DhchapSecret {
    secret(0x22, None)
}
fn ctrlr_secret() -> DhchapSecret {
    secret(0x33, Some(Digest::Sha512))
}

struct Target {
    server: Server,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

/// A target with three hosts: one with a host key, one with host and controller
/// keys, one without keys; negotiation limited to `groups`.
fn start(groups: &[&str]) -> Target {
    let dir = tempfile::tempdir().unwrap();
    let mut keys = String::new();
    for (name, s) in [
        ("uni", host_secret()),
        ("bidi", bidi_secret()),
        ("ctrl", ctrlr_secret()),
    ] {
        let p = dir.path().join(name);
        std::fs::write(&p, format!("{}\n", s.encode().as_str())).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        keys += &format!(
            "[[keys]]\nname = \"{name}\"\npath = \"{}\"\n\n",
            p.display()
        );
    }
    let groups: Vec<String> = groups.iter().map(|g| format!("\"{g}\"")).collect();
    let text = format!(
        r#"
[reactors]
count = 2
idle = "adaptive"

[auth]
dhchap_dhgroups = [{groups}]

[[listeners]]
address = "127.0.0.1"
port = 0

{keys}
[[subsystems]]
nqn = "{NQN}"
hosts = [
  {{ nqn = "{UNI}", dhchap_key = "uni" }},
  {{ nqn = "{BIDI}", dhchap_key = "bidi", dhchap_ctrlr_key = "ctrl" }},
  "{PLAIN}",
]

[[subsystems.namespaces]]
nsid = 1
backend = "ram"
size = "16MiB"
block_size = 4096
"#,
        groups = groups.join(", ")
    );
    let cfg = Config::parse(&text).unwrap();
    let server = Server::start(&cfg).unwrap();
    let addr = server
        .listen_addrs()
        .iter()
        .find(|(_, d)| !d)
        .map(|(a, _)| *a)
        .unwrap();
    Target {
        server,
        addr,
        _dir: dir,
    }
}

fn opts(t: &Target, host: &str, dhchap: Option<HostDhchap>) -> HostOptions {
    let mut o = HostOptions::new(t.addr, NQN);
    o.hostnqn = host.into();
    o.dhchap = dhchap;
    o
}

/// Writes and reads back through a new I/O queue (which authenticates too).
fn verified_io(c: &HostController, seed: u8) {
    let mut q = c.io_queue(1).unwrap();
    let data: Vec<u8> = (0..8192u32).map(|i| (i as u8) ^ seed).collect();
    q.write(1, 8, data.clone(), 4096).unwrap();
    assert_eq!(q.read(1, 8, 2, 4096).unwrap(), data);
}

#[test]
fn hosts_authenticate_one_way_and_both_ways_with_each_group() {
    for group in ["null", "ffdhe2048"] {
        let t = start(&[group]);
        let uni =
            HostController::connect(&opts(&t, UNI, Some(HostDhchap::new(host_secret(), None))))
                .unwrap();
        verified_io(&uni, 1);
        let bidi = HostController::connect(&opts(
            &t,
            BIDI,
            Some(HostDhchap::new(bidi_secret(), Some(ctrlr_secret()))),
        ))
        .unwrap();
        verified_io(&bidi, 2);
        // A host without keys on its entry connects as before.
        let plain = HostController::connect(&opts(&t, PLAIN, None)).unwrap();
        verified_io(&plain, 3);
        assert_eq!(
            t.server
                .target
                .auth_failures
                .load(std::sync::atomic::Ordering::Relaxed),
            0
        );
    }
}

#[test]
fn a_host_offering_only_one_hash_gets_it() {
    let t = start(&["null"]);
    let mut d = HostDhchap::new(host_secret(), None);
    d.digests = vec![Digest::Sha384];
    d.dhgroups = vec![DhGroup::Null];
    let c = HostController::connect(&opts(&t, UNI, Some(d))).unwrap();
    verified_io(&c, 4);
    // Nothing both sides allow: the controller says so in Failure1.
    let mut d = HostDhchap::new(host_secret(), None);
    d.dhgroups = vec![DhGroup::Ffdhe8192];
    match HostController::connect(&opts(&t, UNI, Some(d))) {
        Err(Error::Auth(m)) => assert!(m.contains("no usable DH group"), "{m}"),
        other => panic!("{:?}", other.map(|_| ())),
    }
}

#[test]
fn wrong_and_missing_keys_are_refused_and_others_carry_on() {
    let t = start(&["ffdhe2048"]);
    let good = HostController::connect(&opts(&t, UNI, Some(HostDhchap::new(host_secret(), None))))
        .unwrap();
    let mut io = good.io_queue(1).unwrap();
    // A wrong host key.
    match HostController::connect(&opts(
        &t,
        UNI,
        Some(HostDhchap::new(secret(0x99, Some(Digest::Sha256)), None)),
    )) {
        Err(Error::Auth(m)) => assert!(m.contains("authentication failed"), "{m}"),
        other => panic!("{:?}", other.map(|_| ())),
    }
    // A wrong controller key: the host refuses the controller (Failure2).
    match HostController::connect(&opts(
        &t,
        BIDI,
        Some(HostDhchap::new(bidi_secret(), Some(secret(0x44, None)))),
    )) {
        Err(Error::Auth(m)) => assert!(m.contains("does not match"), "{m}"),
        other => panic!("{:?}", other.map(|_| ())),
    }
    // Asking a host without a controller key to authenticate the controller.
    match HostController::connect(&opts(
        &t,
        UNI,
        Some(HostDhchap::new(host_secret(), Some(ctrlr_secret()))),
    )) {
        Err(Error::Auth(m)) => assert!(m.contains("authentication failed"), "{m}"),
        other => panic!("{:?}", other.map(|_| ())),
    }
    // No key at all: Connect says authentication is required (AUTHREQ.ATR), and
    // everything but Authentication Send/Receive is refused.
    let mut q = QueueConn::open(t.addr, Digests::default(), Duration::from_secs(5)).unwrap();
    let dw0 = q
        .fabrics_connect_dw0(
            &ConnectCommand {
                recfmt: 0,
                qid: 0,
                sqsize: 31,
                cattr: 0,
                kato: 0,
            },
            &ConnectData {
                hostid: *b"kvtarget-host-01",
                cntlid: 0xFFFF,
                subnqn: NQN.into(),
                hostnqn: UNI.into(),
            },
        )
        .unwrap();
    assert_ne!(dw0 & 1 << 17, 0, "ATR set in {dw0:#x}");
    let get_cap = PropertyCommand {
        eight_bytes: true,
        offset: nvme::prop::CAP,
        value: 0,
    }
    .encode(fctype::PROPERTY_GET, 0);
    assert_eq!(
        q.execute(get_cap, None, 0).unwrap().status(),
        Status::AUTH_REQUIRED
    );
    assert_eq!(
        q.execute(nvme::Sqe::new(nvme::admin_opc::IDENTIFY, 0, 0), None, 4096)
            .unwrap()
            .status(),
        Status::AUTH_REQUIRED
    );
    // A truncated Negotiate: Send succeeds, Receive returns Failure1 (incorrect
    // payload) and the queue closes.
    let mut neg = nvme::HostMessage::Negotiate(nvme::Negotiate {
        t_id: 1,
        sc_c: 0,
        protocols: vec![nvme::Protocol {
            auth_id: nvme::AUTHID_DHCHAP,
            hashes: vec![1],
            dhgroups: vec![1],
        }],
    })
    .encode();
    neg.truncate(40);
    assert_eq!(q.auth_send(neg).unwrap().status(), Status::SUCCESS);
    let f = q.auth_recv(64).unwrap();
    assert_eq!(
        nvme::ControllerMessage::parse(&f.data),
        Ok(nvme::ControllerMessage::Failure1 {
            t_id: 1,
            reason: nvme::FailureReason::IncorrectPayload as u8
        })
    );
    assert!(q.auth_recv(64).is_err(), "the queue closed after Failure1");
    // The authenticated host's queue never noticed.
    let data = vec![0x5A; 4096];
    io.write(1, 0, data.clone(), 4096).unwrap();
    assert_eq!(io.read(1, 0, 1, 4096).unwrap(), data);
    assert!(
        t.server
            .target
            .auth_failures
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 3
    );
}

#[test]
fn bad_key_configuration_names_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let base = |keys: &str, host: &str| {
        format!(
            "{keys}\n[[listeners]]\naddress = \"127.0.0.1\"\nport = 0\n\n[[subsystems]]\nnqn = \"{NQN}\"\nhosts = [{host}]\n"
        )
    };
    let err = |text: String| match Config::parse(&text) {
        Err(e) => e.to_string(),
        Ok(cfg) => match Server::start(&cfg) {
            Err(e) => e.to_string(),
            Ok(_) => String::from("started"),
        },
    };
    let e = err(base(
        "",
        &format!("{{ nqn = \"{UNI}\", dhchap_key = \"k\" }}"),
    ));
    assert!(
        e.contains("subsystems[0].hosts[0].dhchap_key") && e.contains("no key `k`"),
        "{e}"
    );
    let e = err(base(
        "[[keys]]\nname = \"k\"\npath = \"k.txt\"",
        &format!("{{ nqn = \"{UNI}\", dhchap_key = \"k\" }}"),
    ));
    assert!(e.contains("keys[0].path") && e.contains("absolute"), "{e}");
    let e = err(base(
        "[[keys]]\nname = \"k\"\npath = \"/x\"",
        &format!("{{ nqn = \"{UNI}\", dhchap_ctrlr_key = \"k\" }}"),
    ));
    assert!(
        e.contains("hosts[0].dhchap_ctrlr_key") && e.contains("needs dhchap_key"),
        "{e}"
    );
    // A world-readable key file, and one that is not a DH-HMAC-CHAP secret.
    let p = dir.path().join("open");
    std::fs::write(&p, host_secret().encode().as_str()).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = err(base(
        &format!("[[keys]]\nname = \"k\"\npath = \"{}\"", p.display()),
        &format!("\"{UNI}\""),
    ));
    assert!(e.contains("keys[0]") && e.contains("chmod 600"), "{e}");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(&p, "NVMeTLSkey-1:01:abc:").unwrap();
    let e = err(base(
        &format!("[[keys]]\nname = \"k\"\npath = \"{}\"", p.display()),
        &format!("{{ nqn = \"{UNI}\", dhchap_key = \"k\" }}"),
    ));
    assert!(
        e.contains("subsystems[0].hosts[0].dhchap_key") && e.contains("not a DH-HMAC-CHAP secret"),
        "{e}"
    );
    let e = err(format!(
        "[auth]\ndhchap_digests = [\"md5\"]\n{}",
        base("", &format!("\"{UNI}\""))
    ));
    assert!(
        e.contains("auth.dhchap_digests") && e.contains("md5"),
        "{e}"
    );
}
