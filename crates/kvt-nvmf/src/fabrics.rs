//! Fabrics Connect: creates a controller (admin queue) or joins an existing one (I/O
//! queue), with the access checks and the error details the host prints.

use super::controller::{AttachError, QidHold};
use super::{Controller, Namespace, QpairStats, Subsystem, SubsystemKind, Target};
use kvt_wire::nvme::{
    fctype, ConnectCommand, ConnectData, PropertyCommand, Sqe, Status, CONNECT_DATA_CNTLID_OFF,
    CONNECT_DATA_HOSTNQN_OFF, CONNECT_DATA_SUBNQN_OFF, NQN_MAX_LEN,
};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// Which queue of which controller a connection now is.
#[derive(Clone)]
pub enum QueueBinding {
    Admin(Arc<Controller>),
    Io {
        ctrl: Arc<Controller>,
        qid: u16,
        hold: QidHold,
    },
}

impl QueueBinding {
    pub fn ctrl(&self) -> &Arc<Controller> {
        match self {
            QueueBinding::Admin(c) | QueueBinding::Io { ctrl: c, .. } => c,
        }
    }
    pub fn qid(&self) -> u16 {
        match self {
            QueueBinding::Admin(_) => 0,
            QueueBinding::Io { qid, .. } => *qid,
        }
    }
}

/// A refused Connect: the status and the DW0 that points at the offending field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectRefusal {
    pub status: Status,
    pub result: u32,
    pub reason: String,
    /// The queue ID is held by another queue of the controller, which may
    /// be closing: a Connect refused only for this is worth another try.
    pub qid_held: bool,
}

/// The host and subsystem a transport's secure channel was keyed for (NVMe/TCP
/// TLS: the PSK identity). A Connect over it must name the same two.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecurePeer {
    pub hostnqn: String,
    pub subnqn: String,
    pub cipher: &'static str,
}

/// Whether a Connect may use this channel: over a secure channel it must name
/// the host and subsystem the channel's PSK is for; a host that has a TLS PSK
/// on the subsystem must come through a secure channel.
fn check_secure_channel(
    target: &Target,
    data: &ConnectData,
    secure: Option<&SecurePeer>,
) -> Result<(), ConnectRefusal> {
    let refuse = |reason: String| ConnectRefusal {
        qid_held: false,
        status: Status::CONNECT_INVALID_HOST,
        result: 0,
        reason,
    };
    match secure {
        Some(p) if p.hostnqn != data.hostnqn || p.subnqn != data.subnqn => Err(refuse(format!(
            "the secure channel's PSK is for host {} on {}, the Connect names host {} on {}",
            p.hostnqn, p.subnqn, data.hostnqn, data.subnqn
        ))),
        Some(_) => Ok(()),
        None => match target.find_subsystem(&data.subnqn) {
            Some(s) if s.host_psk(&data.hostnqn).is_some() => Err(refuse(format!(
                "host {} has a TLS PSK on {}: it must connect through a secure channel (a secure_channel listener)",
                data.hostnqn, data.subnqn
            ))),
            _ => Ok(()),
        },
    }
}

/// A queue a Connect has bound, with what its transport keeps for it.
pub struct Connected {
    pub binding: QueueBinding,
    /// This queue pair's counters, registered with the target for metrics.
    pub stats: Arc<QpairStats>,
    /// The subsystem's namespace generation and namespaces at connect time.
    pub ns_gen: u64,
    pub namespaces: Vec<Arc<Namespace>>,
}

/// A Connect as every transport answers it: `connect`, then the queue pair's
/// statistics registered, the namespaces snapshotted, and the outcome logged
/// and (for refusals) counted. `transport` names the transport in the log.
#[allow(clippy::too_many_arguments)] // each is a distinct fact about the queue
pub fn accept_connect(
    target: &Target,
    cmd: &ConnectCommand,
    data: &ConnectData,
    peer: &str,
    local: Option<std::net::SocketAddr>,
    transport: &str,
    secure: Option<&SecurePeer>,
    now: Instant,
) -> Result<Connected, ConnectRefusal> {
    let binding = match check_secure_channel(target, data, secure)
        .and_then(|()| connect(target, cmd, data, peer, local, now))
    {
        Ok(b) => b,
        Err(refusal) => {
            // One whose queue ID is held may yet succeed: the caller counts
            // it if it gives up.
            if !refusal.qid_held {
                note_refusal(target, &refusal, peer, data, cmd.qid, transport);
            }
            return Err(refusal);
        }
    };
    let ctrl = binding.ctrl();
    let stats = Arc::new(QpairStats {
        subnqn: ctrl.subsys.nqn.clone(),
        cntlid: ctrl.cntlid,
        qid: binding.qid(),
        peer: peer.to_string(),
        ..Default::default()
    });
    target.register_qpair(&stats);
    ctrl.attach_queue(&stats);
    if binding.qid() == 0 {
        tracing::info!(cntlid = ctrl.cntlid, host = %data.hostnqn, subnqn = %data.subnqn, peer, kato_ms = cmd.kato, transport, "controller created");
    } else {
        tracing::debug!(
            cntlid = ctrl.cntlid,
            qid = binding.qid(),
            sqsize = cmd.sqsize,
            transport,
            "I/O queue connected"
        );
    }
    Ok(Connected {
        ns_gen: ctrl.subsys.ns_gen.load(Ordering::Acquire),
        namespaces: ctrl.subsys.namespace_snapshot(),
        stats,
        binding,
    })
}

/// Counts a refused Connect and logs why.
pub fn note_refusal(
    target: &Target,
    refusal: &ConnectRefusal,
    peer: &str,
    data: &ConnectData,
    qid: u16,
    transport: &str,
) {
    let counter = if refusal.status == Status::CONNECT_INVALID_HOST {
        &target.refused_host
    } else {
        &target.refused_other
    };
    counter.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(peer, host = %data.hostnqn, subnqn = %data.subnqn, qid, transport, "connect refused: {}", refusal.reason);
}

/// Property Get / Property Set, on the admin queue only: the value read (0 for
/// a set), to put in the response's DW0.
pub fn property(
    target: &Target,
    binding: Option<&QueueBinding>,
    sqe: &Sqe,
    now: Instant,
) -> Result<u64, Status> {
    let Some(QueueBinding::Admin(ctrl)) = binding else {
        return Err(Status::INVALID_OPCODE);
    };
    let p = PropertyCommand::parse(sqe);
    ctrl.keep_alive(now);
    if sqe.fctype() == fctype::PROPERTY_GET {
        ctrl.get_property(p.offset, super::controller::cap(target, ctrl))
    } else {
        ctrl.set_property(p.offset, p.value)?;
        Ok(0)
    }
}

/// SQE byte offsets of Connect fields (IATTR 0).
const SQE_QID_OFF: u16 = 42;
const SQE_SQSIZE_OFF: u16 = 44;

fn invalid(in_data: bool, offset: u16, reason: String) -> ConnectRefusal {
    ConnectRefusal {
        qid_held: false,
        status: Status::CONNECT_INVALID_PARAMETERS,
        // DW0: IPO in bits 15:0, IATTR in bit 16 (1 = the field is in the data).
        result: offset as u32 | (in_data as u32) << 16,
        reason,
    }
}

/// Handles a Connect. On success returns the binding and the controller ID to put
/// in DW0.
pub fn connect(
    target: &Target,
    cmd: &ConnectCommand,
    data: &ConnectData,
    peer: &str,
    local: Option<std::net::SocketAddr>,
    now: Instant,
) -> Result<QueueBinding, ConnectRefusal> {
    let subsys = check_connect(target, cmd, data, local)?;
    if cmd.qid == 0 {
        connect_admin(&subsys, cmd, data, peer, now)
    } else {
        connect_io(target, &subsys, cmd, data)
    }
}

/// What every Connect must pass: its format, the host NQN, the subsystem
/// (allowing the host, listening where the Connect arrived) and the queue
/// size. Returns the subsystem.
fn check_connect(
    target: &Target,
    cmd: &ConnectCommand,
    data: &ConnectData,
    local: Option<std::net::SocketAddr>,
) -> Result<Arc<Subsystem>, ConnectRefusal> {
    if cmd.recfmt != 0 {
        return Err(ConnectRefusal {
            qid_held: false,
            status: Status::CONNECT_INCOMPATIBLE_FORMAT,
            result: 0,
            reason: format!("record format {} not supported", cmd.recfmt),
        });
    }
    // An empty host NQN is what SPDK's initiator sends unless told otherwise
    // (spdk_nvme_perf without `hostnqn:`); like SPDK's nvmf_tgt and Linux nvmet we
    // let it reach subsystems that allow any host. A host list never holds "" (host
    // NQNs are validated on the way in), so it opens nothing that was closed.
    if data.hostnqn.len() > NQN_MAX_LEN {
        return Err(invalid(
            true,
            CONNECT_DATA_HOSTNQN_OFF,
            format!(
                "host NQN is {} bytes (at most {NQN_MAX_LEN})",
                data.hostnqn.len()
            ),
        ));
    }
    let Some(subsys) = target.find_subsystem(&data.subnqn) else {
        return Err(invalid(
            true,
            CONNECT_DATA_SUBNQN_OFF,
            format!("no subsystem {}", data.subnqn),
        ));
    };
    if !subsys.host_allowed(&data.hostnqn) {
        return Err(ConnectRefusal {
            qid_held: false,
            status: Status::CONNECT_INVALID_HOST,
            result: 0,
            reason: if data.hostnqn.is_empty() {
                format!(
                    "an empty host NQN is not allowed on {} (it lists its hosts)",
                    subsys.nqn
                )
            } else {
                format!("host {} is not allowed on {}", data.hostnqn, subsys.nqn)
            },
        });
    }
    if let Some(l) = local {
        if !subsys.listener_allowed(l) {
            return Err(invalid(
                true,
                CONNECT_DATA_SUBNQN_OFF,
                format!("{} does not listen on {l}", subsys.nqn),
            ));
        }
    }
    let depth_limit = if cmd.qid == 0 {
        target.limits.max_admin_queue_depth
    } else {
        target.limits.max_queue_depth
    };
    if cmd.sqsize == 0 || cmd.sqsize as u32 + 1 > depth_limit as u32 {
        return Err(invalid(
            false,
            SQE_SQSIZE_OFF,
            format!(
                "queue size {} outside 2..={depth_limit}",
                cmd.sqsize as u32 + 1
            ),
        ));
    }
    Ok(subsys)
}

/// A Connect of an admin queue creates its controller (the dynamic
/// controller model: the host asks for "any" controller).
fn connect_admin(
    subsys: &Arc<Subsystem>,
    cmd: &ConnectCommand,
    data: &ConnectData,
    peer: &str,
    now: Instant,
) -> Result<QueueBinding, ConnectRefusal> {
    if data.cntlid != 0xFFFF {
        return Err(invalid(
            true,
            CONNECT_DATA_CNTLID_OFF,
            format!(
                "static controller ID {:#x} requested; only dynamic (0xffff) is supported",
                data.cntlid
            ),
        ));
    }
    let Ok(mut ctrls) = subsys.controllers.lock() else {
        return Err(ConnectRefusal {
            qid_held: false,
            status: Status::INTERNAL_ERROR,
            result: 0,
            reason: "controller table poisoned".into(),
        });
    };
    let Some(cntlid) = subsys.alloc_cntlid(&ctrls) else {
        return Err(ConnectRefusal {
            qid_held: false,
            status: Status::CONNECT_CONTROLLER_BUSY,
            result: 0,
            reason: "no controller IDs left".into(),
        });
    };
    let ctrl = Arc::new(Controller::new(
        cntlid,
        subsys.clone(),
        &data.hostnqn,
        data.hostid,
        cmd.kato,
        peer.to_string(),
        now,
    ));
    ctrl.keep_alive(now);
    ctrls.insert(cntlid, ctrl.clone());
    Ok(QueueBinding::Admin(ctrl))
}

/// A Connect of an I/O queue joins the controller it names, which must be
/// the same host's and enabled; the queue ID must be free.
fn connect_io(
    target: &Target,
    subsys: &Arc<Subsystem>,
    cmd: &ConnectCommand,
    data: &ConnectData,
) -> Result<QueueBinding, ConnectRefusal> {
    if subsys.kind == SubsystemKind::Discovery {
        return Err(invalid(
            false,
            SQE_QID_OFF,
            "discovery controllers have no I/O queues".into(),
        ));
    }
    let ctrl = subsys
        .controllers
        .lock()
        .ok()
        .and_then(|c| c.get(&data.cntlid).cloned());
    let Some(ctrl) = ctrl else {
        return Err(invalid(
            true,
            CONNECT_DATA_CNTLID_OFF,
            format!("no controller {} in {}", data.cntlid, subsys.nqn),
        ));
    };
    if ctrl.hostnqn != data.hostnqn {
        return Err(invalid(
            true,
            CONNECT_DATA_HOSTNQN_OFF,
            "host NQN differs from the controller's".into(),
        ));
    }
    if ctrl.hostid != data.hostid {
        return Err(invalid(
            true,
            0,
            "host ID differs from the controller's".into(),
        ));
    }
    if ctrl.is_failed() || !ctrl.is_ready() {
        return Err(ConnectRefusal {
            qid_held: false,
            status: Status::COMMAND_SEQUENCE_ERROR,
            result: 0,
            reason: format!("controller {} is not enabled", ctrl.cntlid),
        });
    }
    match ctrl.attach_io_queue(cmd.qid, target.limits.max_io_queues) {
        Ok(hold) => Ok(QueueBinding::Io {
            ctrl,
            qid: cmd.qid,
            hold,
        }),
        Err(AttachError::Poisoned) => Err(ConnectRefusal {
            status: Status::INTERNAL_ERROR,
            result: 0,
            reason: "controller state poisoned".into(),
            qid_held: false,
        }),
        Err(e) => {
            let mut r = invalid(false, SQE_QID_OFF, format!("queue {}: {e}", cmd.qid));
            r.qid_held = e == AttachError::Held;
            Err(r)
        }
    }
}

/// Ends a queue's association: an admin queue takes its controller (and with it
/// every I/O queue) down; an I/O queue frees its queue ID.
pub fn disconnect(binding: &QueueBinding) {
    match binding {
        QueueBinding::Admin(ctrl) => {
            ctrl.fail();
            if let Ok(mut c) = ctrl.subsys.controllers.lock() {
                c.remove(&ctrl.cntlid);
            }
        }
        QueueBinding::Io { ctrl, qid, hold } => ctrl.detach_io_queue(*qid, *hold),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Subsystem, TransportLimits};
    use kvt_wire::nvme::prop;

    fn setup() -> Target {
        let t = Target::new(TransportLimits::default());
        t.add_subsystem(Arc::new(Subsystem::new(
            "nqn.s",
            SubsystemKind::Nvm,
            "S",
            "M",
            false,
            vec!["nqn.h".into()],
        )));
        t
    }

    fn cmd(qid: u16) -> ConnectCommand {
        ConnectCommand {
            recfmt: 0,
            qid,
            sqsize: 31,
            cattr: 0,
            kato: 5000,
        }
    }

    fn data(sub: &str, host: &str, cntlid: u16) -> ConnectData {
        ConnectData {
            hostid: [1; 16],
            cntlid,
            subnqn: sub.into(),
            hostnqn: host.into(),
        }
    }

    #[test]
    fn accepting_registers_the_queue_and_counts_refusals() {
        let t = setup();
        let c = accept_connect(
            &t,
            &cmd(0),
            &data("nqn.s", "nqn.h", 0xFFFF),
            "p",
            None,
            "tcp",
            None,
            Instant::now(),
        )
        .unwrap();
        assert_eq!(
            (c.binding.qid(), c.stats.qid, c.stats.subnqn.as_str()),
            (0, 0, "nqn.s")
        );
        assert_eq!(c.stats.cntlid, c.binding.ctrl().cntlid);
        assert_eq!(t.live_qpairs().len(), 1);
        let refused = accept_connect(
            &t,
            &cmd(0),
            &data("nqn.s", "nqn.other", 0xFFFF),
            "p",
            None,
            "rdma",
            None,
            Instant::now(),
        );
        assert_eq!(
            refused.err().map(|r| r.status),
            Some(Status::CONNECT_INVALID_HOST)
        );
        let refused = accept_connect(
            &t,
            &cmd(0),
            &data("nqn.nope", "nqn.h", 0xFFFF),
            "p",
            None,
            "tcp",
            None,
            Instant::now(),
        );
        assert!(refused.is_err());
        assert_eq!(t.refused_host.load(Ordering::Relaxed), 1);
        assert_eq!(t.refused_other.load(Ordering::Relaxed), 1);
        assert_eq!(t.live_qpairs().len(), 1);
    }

    #[test]
    fn admin_then_io_queue() {
        let t = setup();
        let b = connect(
            &t,
            &cmd(0),
            &data("nqn.s", "nqn.h", 0xFFFF),
            "p",
            None,
            Instant::now(),
        )
        .unwrap();
        let ctrl = b.ctrl().clone();
        // Not enabled yet: I/O queues are refused.
        let e = connect(
            &t,
            &cmd(1),
            &data("nqn.s", "nqn.h", ctrl.cntlid),
            "p",
            None,
            Instant::now(),
        )
        .err()
        .unwrap();
        assert_eq!(e.status, Status::COMMAND_SEQUENCE_ERROR);
        ctrl.set_property(prop::CC, 0x460001).unwrap();
        let io = connect(
            &t,
            &cmd(1),
            &data("nqn.s", "nqn.h", ctrl.cntlid),
            "p",
            None,
            Instant::now(),
        )
        .unwrap();
        assert_eq!(io.qid(), 1);
        let dup = connect(
            &t,
            &cmd(1),
            &data("nqn.s", "nqn.h", ctrl.cntlid),
            "p",
            None,
            Instant::now(),
        )
        .err()
        .unwrap();
        assert_eq!(dup.status, Status::CONNECT_INVALID_PARAMETERS);
        assert_eq!(dup.result, 42);
        disconnect(&b);
        assert!(ctrl.is_failed());
        let gone = connect(
            &t,
            &cmd(2),
            &data("nqn.s", "nqn.h", ctrl.cntlid),
            "p",
            None,
            Instant::now(),
        )
        .err()
        .unwrap();
        assert_eq!(gone.result, 16 | 1 << 16);
    }

    #[test]
    fn refusals_point_at_the_field() {
        let t = setup();
        let e = connect(
            &t,
            &cmd(0),
            &data("nqn.nope", "nqn.h", 0xFFFF),
            "p",
            None,
            Instant::now(),
        )
        .err()
        .unwrap();
        assert_eq!(e.status, Status::CONNECT_INVALID_PARAMETERS);
        assert_eq!(e.result, 256 | 1 << 16);
        let e = connect(
            &t,
            &cmd(0),
            &data("nqn.s", "nqn.intruder", 0xFFFF),
            "p",
            None,
            Instant::now(),
        )
        .err()
        .unwrap();
        assert_eq!(e.status, Status::CONNECT_INVALID_HOST);
        let mut c = cmd(0);
        c.sqsize = 0;
        assert_eq!(
            connect(
                &t,
                &c,
                &data("nqn.s", "nqn.h", 0xFFFF),
                "p",
                None,
                Instant::now()
            )
            .err()
            .unwrap()
            .result,
            44
        );
        c.sqsize = 1000;
        assert!(connect(
            &t,
            &c,
            &data("nqn.s", "nqn.h", 0xFFFF),
            "p",
            None,
            Instant::now()
        )
        .is_err());
        c = cmd(0);
        c.recfmt = 1;
        assert_eq!(
            connect(
                &t,
                &c,
                &data("nqn.s", "nqn.h", 0xFFFF),
                "p",
                None,
                Instant::now()
            )
            .err()
            .unwrap()
            .status,
            Status::CONNECT_INCOMPATIBLE_FORMAT
        );
        // A host NQN too long for the field is refused, pointing at it.
        let long = format!("nqn.{}", "x".repeat(NQN_MAX_LEN));
        let e = connect(
            &t,
            &cmd(0),
            &data("nqn.s", &long, 0xFFFF),
            "p",
            None,
            Instant::now(),
        )
        .err()
        .unwrap();
        assert_eq!(e.result, 512 | 1 << 16);
        // Anyone may reach discovery.
        assert!(connect(
            &t,
            &cmd(0),
            &data(kvt_wire::nvme::DISCOVERY_NQN, "nqn.x", 0xFFFF),
            "p",
            None,
            Instant::now(),
        )
        .is_ok());
    }

    #[test]
    fn empty_host_nqn_reaches_only_open_subsystems() {
        let t = setup();
        // "nqn.s" lists one host: an empty NQN can never match it.
        let e = connect(
            &t,
            &cmd(0),
            &data("nqn.s", "", 0xFFFF),
            "p",
            None,
            Instant::now(),
        )
        .err()
        .unwrap();
        assert_eq!(e.status, Status::CONNECT_INVALID_HOST);
        t.add_subsystem(Arc::new(Subsystem::new(
            "nqn.open",
            SubsystemKind::Nvm,
            "S",
            "M",
            true,
            Vec::new(),
        )));
        let b = connect(
            &t,
            &cmd(0),
            &data("nqn.open", "", 0xFFFF),
            "p",
            None,
            Instant::now(),
        )
        .unwrap();
        let ctrl = b.ctrl().clone();
        ctrl.set_property(prop::CC, 0x460001).unwrap();
        let io = connect(
            &t,
            &cmd(1),
            &data("nqn.open", "", ctrl.cntlid),
            "p",
            None,
            Instant::now(),
        )
        .unwrap();
        assert_eq!(io.qid(), 1);
        // The I/O queue must still come from the same (empty) host NQN.
        let e = connect(
            &t,
            &cmd(2),
            &data("nqn.open", "nqn.h", ctrl.cntlid),
            "p",
            None,
            Instant::now(),
        )
        .err()
        .unwrap();
        assert_eq!(e.result, 512 | 1 << 16);
        assert!(connect(
            &t,
            &cmd(0),
            &data(kvt_wire::nvme::DISCOVERY_NQN, "", 0xFFFF),
            "p",
            None,
            Instant::now(),
        )
        .is_ok());
    }
}
