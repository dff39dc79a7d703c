//! The authentication step of a queue: DH-HMAC-CHAP transactions run by
//! Authentication Send / Receive (the protocol is `auth`), and the gate that
//! lets nothing else through until the queue authenticated.

use super::auth::{QueueAuth, DEFAULT_TIMEOUT as AUTH_TIMEOUT};
use super::queue::{Link, Queue};
use kvt_reactor::IoCtx;
use kvt_wire::nvme::{admin_opc, fctype, AuthCommand, Sqe, Status};
use std::sync::atomic::Ordering;

impl<X> Queue<X> {
    /// While the queue must still authenticate, only Authentication Send /
    /// Receive are let through.
    pub(crate) fn check_authenticated(&self, sqe: &Sqe) -> Result<(), Status> {
        if self.authenticated {
            return Ok(());
        }
        let auth_cmd = sqe.opcode() == admin_opc::FABRICS
            && matches!(sqe.fctype(), fctype::AUTH_SEND | fctype::AUTH_RECV);
        if !auth_cmd {
            tracing::warn!(peer = %self.cfg.peer, qid = self.qid(), opcode = sqe.opcode(), "command before DH-HMAC-CHAP authentication: refused");
            return Err(Status::AUTH_REQUIRED);
        }
        Ok(())
    }

    /// A transaction times out after the controller's keep-alive timeout, or
    /// SPDK's two minutes without one.
    pub(crate) fn auth_timeout(&self, ctrl: &super::Controller) -> std::time::Duration {
        match ctrl.kato_ms.load(Ordering::Relaxed) {
            0 => AUTH_TIMEOUT,
            ms => std::time::Duration::from_millis(ms as u64),
        }
    }

    /// Authentication Send / Receive: one step of this queue's DH-HMAC-CHAP
    /// transaction. A host may also start one on an authenticated queue (to
    /// re-authenticate); I/O carries on meanwhile.
    pub(crate) fn authenticate<L: Link<X>>(
        &mut self,
        slot: u16,
        sqe: &Sqe,
        link: &mut L,
        ctx: &mut IoCtx,
    ) {
        let Some(ctrl) = self.binding.as_ref().map(|b| b.ctrl().clone()) else {
            self.finish(slot, Status::COMMAND_SEQUENCE_ERROR, 0, link, ctx);
            return;
        };
        // A new transaction unless one runs or one failed (the queue closes).
        if !self
            .auth
            .as_ref()
            .is_some_and(|a| a.in_progress() || a.failed())
        {
            self.auth = Some(QueueAuth::new(
                ctrl.subsys.host_keys(&ctrl.hostnqn),
                &ctrl.hostnqn,
                &ctrl.subsys.nqn,
                self.qid(),
                self.target.auth_policy(),
                self.auth_timeout(&ctrl),
                ctx.now,
            ));
        }
        let cmd = AuthCommand::parse(sqe);
        let Some(auth) = self.auth.as_mut() else {
            return;
        };
        let step = if sqe.fctype() == fctype::AUTH_SEND {
            let data = self
                .slots
                .get(slot as usize)
                .and_then(|s| s.as_ref())
                .and_then(|r| r.buf.as_ref())
                .map_or(&[][..], |b| &b[..]);
            auth.send(&cmd, data, ctx.now)
        } else {
            auth.receive(&cmd, ctx.now)
        };
        if auth.succeeded() {
            self.authenticated = true;
        }
        if let Some(st) = self.stats.as_ref() {
            if let Ok(mut a) = st.auth.lock() {
                *a = Some(auth.status());
            }
        }
        if step.close_after && step.status != Status::COMMAND_SEQUENCE_ERROR {
            self.target.auth_failures.fetch_add(1, Ordering::Relaxed);
        }
        if let (Some(mut d), Some(r)) = (step.data, self.request_mut(slot)) {
            d.truncate(sqe.sgl().length as usize);
            r.reply = Some(d);
        }
        self.respond(slot, step.status, 0, step.close_after, link, ctx);
    }
}
