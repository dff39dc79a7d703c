//! Fabrics Connect on a queue: the checks against what the transport set
//! up, binding the queue to its controller (`fabrics::accept_connect`), and a
//! Connect whose I/O queue ID is still held by a closing queue, which waits
//! for it (`QID_RELEASE_WAIT`) and is tried again by housekeeping.

use super::auth::QueueAuth;
use super::fabrics;
use super::queue::{Link, Queue, TransportKind};
use kvt_reactor::IoCtx;
use kvt_wire::nvme::{
    ConnectCommand, ConnectData, Sqe, Status, CATTR_DISABLE_SQ_FLOW, CONNECT_DATA_LEN,
    CONNECT_DATA_SUBNQN_OFF, DISCOVERY_NQN,
};
use std::sync::atomic::Ordering;

/// SQE byte offsets of Connect fields, for refusals' DW0 (IATTR 0).
const CONNECT_SQE_QID_OFF: u64 = 42;
const CONNECT_SQE_SQSIZE_OFF: u64 = 44;

/// How long a Connect for an I/O queue ID still held by another queue of the
/// controller waits for it to be let go (re-checked each housekeeping pass).
/// A host that closes a queue's connection and connects the same ID again at
/// once (SPDK's initiator reconnecting a queue pair) can reach us before the
/// reactor owning the old connection has seen it close. Well inside the
/// 500 ms SPDK's host allows a Connect.
pub const QID_RELEASE_WAIT: std::time::Duration = std::time::Duration::from_millis(250);

impl<X> Queue<X> {
    /// Fabrics Connect: checks it against what the transport set up, then
    /// binds the queue (`try_connect`).
    pub(crate) fn connect<L: Link<X>>(
        &mut self,
        slot: u16,
        sqe: &Sqe,
        link: &mut L,
        ctx: &mut IoCtx,
    ) -> Result<(), Status> {
        if self.binding.is_some() || self.held_connect.is_some() {
            return Err(Status::COMMAND_SEQUENCE_ERROR);
        }
        let cmd = ConnectCommand::parse(sqe);
        let data = self.connect_data(slot)?;
        // DW0 of a refusal points at the field: the byte offset in bits
        // 15:0, in the Connect data when bit 16 (IATTR) is set, else in
        // the SQE.
        let refuse = if self.cfg.expected_qid.is_some_and(|q| q != cmd.qid) {
            tracing::warn!(peer = %self.cfg.peer, expected = ?self.cfg.expected_qid, qid = cmd.qid, "Connect QID differs from the transport's connection request");
            Some(CONNECT_SQE_QID_OFF)
        } else if self
            .cfg
            .max_entries
            .is_some_and(|m| cmd.sqsize as usize >= m)
        {
            tracing::warn!(peer = %self.cfg.peer, sqsize = cmd.sqsize, "Connect SQ size above what the transport has room for");
            Some(CONNECT_SQE_SQSIZE_OFF)
        } else if self.cfg.discovery_only && data.subnqn != DISCOVERY_NQN {
            tracing::warn!(peer = %self.cfg.peer, subnqn = %data.subnqn, "connect to an NVM subsystem on the discovery port refused");
            Some(CONNECT_DATA_SUBNQN_OFF as u64 | 1 << 16)
        } else {
            None
        };
        if let Some(dw0) = refuse {
            self.target.refused_other.fetch_add(1, Ordering::Relaxed);
            self.finish(slot, Status::CONNECT_INVALID_PARAMETERS, dw0, link, ctx);
            return Ok(());
        }
        self.try_connect(slot, &cmd, &data, link, ctx);
        Ok(())
    }

    /// The Connect data in `slot`'s buffer.
    fn connect_data(&self, slot: u16) -> Result<ConnectData, Status> {
        self.request(slot)
            .and_then(|r| r.buf.as_ref())
            .and_then(|b| ConnectData::parse(&b[..b.len().min(CONNECT_DATA_LEN)]))
            .ok_or(Status::DATA_SGL_LENGTH_INVALID)
    }

    /// Binds the queue to its controller and answers the Connect in `slot`, or
    /// refuses it; a Connect whose queue ID is still held waits (see
    /// `QID_RELEASE_WAIT`) and is tried again by `housekeeping`.
    fn try_connect<L: Link<X>>(
        &mut self,
        slot: u16,
        cmd: &ConnectCommand,
        data: &ConnectData,
        link: &mut L,
        ctx: &mut IoCtx,
    ) {
        let accepted = fabrics::accept_connect(
            &self.target,
            cmd,
            data,
            &self.cfg.peer,
            self.cfg.local,
            self.cfg.kind.name(),
            self.secure.as_ref(),
            ctx.now,
        );
        let c = match accepted {
            Ok(c) => c,
            Err(refusal) => {
                self.refuse_connect(slot, cmd, data, &refusal, link, ctx);
                return;
            }
        };
        self.held_connect = None;
        let ctrl = c.binding.ctrl().clone();
        if c.binding.qid() == 0 && self.cfg.kind == TransportKind::Rdma {
            // Hosts on this controller describe data with keyed
            // SGLs (Identify), and its error log names RDMA.
            ctrl.keyed_sgl.store(true, Ordering::Release);
        }
        if c.binding.qid() == 0 {
            super::ana::bind_path(&self.target, &ctrl, self.cfg.local);
        }
        self.sqsize = cmd.sqsize;
        self.make_slots();
        // The Connect itself took entry 0 of the new queue.
        self.sq_head = if cmd.sqsize == 0 { 0 } else { 1 };
        self.sqflow_disabled = cmd.cattr & CATTR_DISABLE_SQ_FLOW != 0;
        self.stats = Some(c.stats);
        self.ns.load(c.ns_gen, c.namespaces);
        self.reserve_resv_cache();
        let qid = c.binding.qid();
        self.binding = Some(c.binding);
        let mut dw0 = ctrl.cntlid as u64;
        if self.require_auth(&ctrl, data, qid, ctx.now) {
            // AUTHREQ.ATR (DW0 bit 17): the host must run
            // DH-HMAC-CHAP on this queue before anything else.
            dw0 |= 1 << 17;
        }
        self.finish(slot, Status::SUCCESS, dw0, link, ctx);
    }

    /// A refused Connect: one whose queue ID is still held waits (until
    /// `QID_RELEASE_WAIT` runs out), any other is answered with its status.
    fn refuse_connect<L: Link<X>>(
        &mut self,
        slot: u16,
        cmd: &ConnectCommand,
        data: &ConnectData,
        refusal: &fabrics::ConnectRefusal,
        link: &mut L,
        ctx: &mut IoCtx,
    ) {
        if refusal.qid_held {
            let give_up = self
                .held_connect
                .get_or_insert((slot, ctx.now + QID_RELEASE_WAIT))
                .1;
            if ctx.now < give_up {
                tracing::debug!(peer = %self.cfg.peer, qid = cmd.qid, "Connect waits for its queue ID to be let go");
                return;
            }
            fabrics::note_refusal(
                &self.target,
                refusal,
                &self.cfg.peer,
                data,
                cmd.qid,
                self.cfg.kind.name(),
            );
        }
        self.held_connect = None;
        self.finish(slot, refusal.status, refusal.result as u64, link, ctx);
    }

    /// Whether the host must authenticate on this queue (it has keys on the
    /// subsystem): if so, the queue's DH-HMAC-CHAP transaction is set up.
    fn require_auth(
        &mut self,
        ctrl: &std::sync::Arc<super::Controller>,
        data: &ConnectData,
        qid: u16,
        now: std::time::Instant,
    ) -> bool {
        let Some(keys) = ctrl.subsys.host_keys(&data.hostnqn) else {
            return false;
        };
        self.auth = Some(QueueAuth::new(
            Some(keys),
            &data.hostnqn,
            &ctrl.subsys.nqn,
            qid,
            self.target.auth_policy(),
            self.auth_timeout(ctrl),
            now,
        ));
        self.authenticated = false;
        if let (Some(st), Some(a)) = (self.stats.as_ref(), self.auth.as_ref()) {
            if let Ok(mut s) = st.auth.lock() {
                *s = Some(a.status());
            }
        }
        true
    }

    /// Tries a waiting Connect again.
    pub(crate) fn retry_held_connect<L: Link<X>>(&mut self, link: &mut L, ctx: &mut IoCtx) {
        let Some((slot, _)) = self.held_connect else {
            return;
        };
        let Some(sqe) = self.request(slot).map(|r| r.sqe) else {
            self.held_connect = None;
            return;
        };
        let cmd = ConnectCommand::parse(&sqe);
        match self.connect_data(slot) {
            Ok(data) => self.try_connect(slot, &cmd, &data, link, ctx),
            Err(status) => {
                self.held_connect = None;
                self.finish(slot, status, 0, link, ctx);
            }
        }
    }
}
