//! The reservation commands (Reservation Register, Report, Acquire,
//! Release; NVMe Base 2.0, 7.x) of both command sets, run at once against
//! the namespace's reservation state (`nvmf::reservation`), and the
//! Reservation Conflict check every other I/O command passes before it
//! reaches the device.

use super::{IoEnv, IoPlan, Outcome};
use crate::controller::Controller;
use crate::request::Request;
use crate::reservation::ptpl::PtplWait;
use crate::reservation::{
    resv_opc, Access, Acquire, HostId, Notices, Register, Release, Verdict, RESV_DATA_MAX,
};
use crate::{Namespace, Subsystem};
use kvt_wire::nvme::{Sqe, Status};
use std::sync::atomic::Ordering;

/// Bytes of host data each command carries: two keys (CRKEY and NRKEY or
/// PRKEY) for Register and Acquire, CRKEY for Release.
const TWO_KEYS: usize = 16;
const ONE_KEY: usize = 8;

/// The four reservation opcodes (both command sets).
pub const OPCODES: [u8; 4] = [
    resv_opc::REGISTER,
    resv_opc::REPORT,
    resv_opc::ACQUIRE,
    resv_opc::RELEASE,
];

/// One of the four reservation opcodes.
pub fn is_reservation(opcode: u8) -> bool {
    matches!(
        opcode,
        resv_opc::REGISTER | resv_opc::REPORT | resv_opc::ACQUIRE | resv_opc::RELEASE
    )
}

/// Checks a reservation command against its namespace and data descriptor.
pub fn plan(ns: Option<&Namespace>, sqe: &Sqe) -> Result<IoPlan, Status> {
    ns.ok_or(Status::INVALID_NAMESPACE)?;
    let sgl = sqe.sgl().length as usize;
    let need = match sqe.opcode() {
        resv_opc::REGISTER | resv_opc::ACQUIRE => TWO_KEYS,
        resv_opc::RELEASE => ONE_KEY,
        _ => {
            // Report: NUMD is 0's based, in dwords.
            let numd = (sqe.cdw(10) as usize + 1) * 4;
            return Ok(IoPlan::Reservation {
                len: numd.min(sgl).min(RESV_DATA_MAX),
            });
        }
    };
    if sgl < need {
        return Err(Status::DATA_SGL_LENGTH_INVALID);
    }
    Ok(IoPlan::Reservation { len: need })
}

/// What a checked command does to the namespace's data (the reservation
/// access table's two groups); `None`: not subject to reservations.
pub fn access_of(plan: &IoPlan) -> Option<Access> {
    match plan {
        IoPlan::Read { .. }
        | IoPlan::KvRetrieve { .. }
        | IoPlan::KvExist { .. }
        | IoPlan::KvList { .. } => Some(Access::Read),
        IoPlan::Write { .. }
        | IoPlan::WriteZeroes { .. }
        | IoPlan::Deallocate { .. }
        | IoPlan::Nothing
        | IoPlan::Flush { all: false }
        | IoPlan::KvStore { .. }
        | IoPlan::KvDelete { .. } => Some(Access::Write),
        IoPlan::Flush { all: true } | IoPlan::Reservation { .. } => None,
    }
}

/// One I/O queue's verdicts (its host's access to each namespace), so that
/// the check every I/O command passes takes no lock while a reservation
/// stays as it is: the namespace's epoch is compared (an Acquire load) and
/// the cached verdict answers; a moved epoch (a Register, Acquire or
/// Release ran) reads the state once under its lock and caches that.
///
/// An entry belongs to one namespace object (`Namespace::key`, unique in
/// the process): a namespace removed and another added at the same NSID
/// never matches the old entry. The table grows when the queue first meets
/// a higher NSID (once per NSID, not per command).
#[derive(Debug, Default)]
pub struct ResvCache {
    by_nsid: Vec<Option<(u64, Verdict)>>,
    /// The host the verdicts are for: a queue's host is fixed at Connect.
    host: Option<HostId>,
}

impl ResvCache {
    /// Room for NSIDs up to `max_nsid` (at connect, so the first commands
    /// allocate nothing either).
    pub fn reserve(&mut self, max_nsid: u32) {
        let len = max_nsid as usize + 1;
        if self.by_nsid.len() < len {
            self.by_nsid.resize(len, None);
        }
    }

    /// Reservation Conflict when `host` (this queue's) may not issue `plan`
    /// on `ns`.
    pub fn check(
        &mut self,
        ns: Option<&Namespace>,
        plan: &IoPlan,
        host: &HostId,
    ) -> Result<(), Status> {
        let (Some(ns), Some(access)) = (ns, access_of(plan)) else {
            return Ok(());
        };
        if ns.reservation.idle.load(Ordering::Acquire) {
            return Ok(());
        }
        self.verdict(ns, host)?.allows(access)
    }

    /// The cached verdict on `ns` while its epoch has not moved; otherwise
    /// one read under the lock, cached.
    fn verdict(&mut self, ns: &Namespace, host: &HostId) -> Result<Verdict, Status> {
        let slot = ns.nsid as usize;
        let epoch = ns.reservation.epoch.load(Ordering::Acquire);
        if let Some(Some((key, v))) = self.by_nsid.get(slot) {
            if *key == ns.key && v.epoch == epoch {
                assert_eq!(self.host, Some(*host), "one queue, one host");
                return Ok(*v);
            }
        }
        assert!(
            self.host.map_or(true, |h| h == *host),
            "one queue, one host"
        );
        self.host = Some(*host);
        let v = ns.reservation.verdict(host)?;
        self.reserve(ns.nsid);
        self.by_nsid[slot] = Some((ns.key, v));
        Ok(v)
    }
}

/// Who issued the command: the host's identifier and its controller.
#[derive(Debug, Clone, Copy)]
pub struct Issuer {
    pub host: HostId,
    pub cntlid: u16,
}

/// What a reservation command left to do: the notifications it caused, and
/// the PTPL write to wait for before it is answered.
pub type Aftermath = (Notices, Option<PtplWait>);

/// Runs a reservation command; Report's data goes in `r.reply`.
pub fn execute<X>(
    r: &mut Request<X>,
    env: &IoEnv<'_>,
    who: Issuer,
) -> Result<(Outcome, Aftermath), Status> {
    let ns = env.ns.get(r.sqe.nsid()).ok_or(Status::INVALID_NAMESPACE)?;
    let resv = &ns.reservation;
    let data: &[u8] = r.buf.as_deref().unwrap_or(&[]);
    let cdw10 = r.sqe.cdw(10);
    let after = |(r, wait): (Result<Notices, Status>, _)| r.map(|n| (n, wait));
    let aftermath = match r.sqe.opcode() {
        resv_opc::REGISTER => {
            let cmd = Register::decode(cdw10, data)?;
            let capable = resv.ptpl_capable();
            after(resv.change(|s| s.register(who.host, who.cntlid, &cmd, capable))?)?
        }
        resv_opc::ACQUIRE => {
            let cmd = Acquire::decode(cdw10, data)?;
            after(resv.change(|s| s.acquire(who.host, &cmd))?)?
        }
        resv_opc::RELEASE => {
            let cmd = Release::decode(cdw10, data)?;
            after(resv.change(|s| s.release(who.host, &cmd))?)?
        }
        resv_opc::REPORT => {
            let eds = r.sqe.cdw(11) & 1 != 0;
            let mut d = resv.with(|s| s.report(eds))??;
            let len = match r.plan {
                Some(IoPlan::Reservation { len }) => len,
                _ => 0,
            };
            d.resize(len, 0);
            r.reply = Some(d);
            (Vec::new(), None)
        }
        _ => return Err(Status::INVALID_OPCODE),
    };
    Ok((Outcome::SUCCESS, aftermath))
}

/// Runs a reservation command for controller `ctrl` and posts the
/// notifications it caused to every controller of the hosts they name.
/// With a PTPL write to wait for, the caller answers once it is durable.
pub fn run<X>(
    r: &mut Request<X>,
    env: &IoEnv<'_>,
    ctrl: &Controller,
) -> Result<(Outcome, Option<PtplWait>), Status> {
    let who = Issuer {
        host: HostId::extended(ctrl.hostid),
        cntlid: ctrl.cntlid,
    };
    let (out, (notices, wait)) = execute(r, env, who)?;
    if !notices.is_empty() {
        post(&ctrl.subsys, r.sqe.nsid(), &notices);
    }
    Ok((out, wait))
}

/// Logs each notice on every controller of its host (its mask permitting)
/// and raises the reservation log page event there.
pub fn post(subsys: &Subsystem, nsid: u32, notices: &Notices) {
    let Ok(ctrls) = subsys.controllers.lock() else {
        return;
    };
    for c in ctrls.values() {
        let host = HostId::extended(c.hostid);
        for (_, n) in notices.iter().filter(|(h, _)| *h == host) {
            c.reservation_notice(nsid, *n);
        }
    }
}

#[cfg(test)]
mod tests;
