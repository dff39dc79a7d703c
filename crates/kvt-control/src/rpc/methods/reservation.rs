//! `nvmf_ns_get_reservation`: a namespace's registrants and reservation
//! (the Reservation Report a host would read, for operators).

use super::{act, not_found, Control, Params, Parsed};
use kvt_nvmf::reservation::ResvState;
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GetReservation {
    nqn: String,
    nsid: u32,
    #[allow(dead_code)]
    tgt_name: Option<String>,
}

/// The JSON of a namespace's reservation state.
pub fn reservation_json(s: &ResvState) -> Value {
    let holder = s.held.map(|h| h.holder);
    json!({
        "generation": s.generation,
        "rtype": s.held.map_or(0, |h| h.rtype.raw()),
        "ptpl": s.ptpl,
        "holder_hostid": holder.map(|h| kvt_wire::ident::hex(&h.bytes)),
        "registrants": s.registrants.iter().map(|r| json!({
            "hostid": kvt_wire::ident::hex(&r.host.bytes),
            "rkey": r.key,
            "cntlid": r.cntlid,
            "holder": s.is_holder(&r.host),
        })).collect::<Vec<_>>(),
    })
}

pub(super) fn get_reservation(p: &mut Params) -> Parsed {
    let GetReservation { nqn, nsid, .. } = p.parse()?;
    act(move |ctl: &Control| {
        let s = ctl.nvm_subsystem(&nqn)?;
        let ns = s
            .namespace(nsid)
            .ok_or_else(|| not_found(format!("namespace {nsid} of {nqn} does not exist")))?;
        let state = ns.reservation.with(|st| st.clone()).map_err(|_| {
            crate::rpc::RpcError::new(
                crate::rpc::code::INTERNAL_ERROR,
                "reservation state poisoned",
            )
        })?;
        let mut v = reservation_json(&state);
        v["nqn"] = json!(nqn);
        v["nsid"] = json!(nsid);
        v["ptpl_file"] = json!(ns.reservation.ptpl_file().map(|p| p.display().to_string()));
        Ok(v)
    })
}
