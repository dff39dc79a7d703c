//! SPDK's `listen_address` parameter, as the listener methods of
//! `nvmf_subsystem` and `ana` take it: parsed and checked into an address.

use crate::rpc::RpcError;
use serde::Deserialize;
use serde_json::Value;

/// SPDK's `listen_address` object as its client sends it: the port as a
/// string or a number, `adrfam` optional.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListenAddressParams {
    trtype: String,
    traddr: String,
    trsvcid: Option<Value>,
    adrfam: Option<String>,
}

/// A listen address checked: the address and whether it is NVMe/RDMA.
pub(super) fn listen_address(
    la: ListenAddressParams,
) -> Result<(std::net::SocketAddr, bool), RpcError> {
    let ListenAddressParams {
        trtype,
        traddr,
        trsvcid,
        adrfam,
    } = la;
    let rdma = if trtype.eq_ignore_ascii_case("rdma") {
        true
    } else if trtype.eq_ignore_ascii_case("tcp") {
        false
    } else {
        return Err(RpcError::params(format!(
            "listen_address.trtype: {trtype} is not available (TCP and RDMA are)"
        )));
    };
    let ip: std::net::IpAddr = traddr.parse().map_err(|_| {
        RpcError::params(format!(
            "listen_address.traddr: `{traddr}` is not an IP address"
        ))
    })?;
    if let Some(f) = adrfam {
        let ok = match f.to_ascii_lowercase().as_str() {
            "ipv4" => ip.is_ipv4(),
            "ipv6" => ip.is_ipv6(),
            _ => false,
        };
        if !ok {
            return Err(RpcError::params(format!(
                "listen_address.adrfam: {f} does not match {traddr}"
            )));
        }
    }
    // SPDK sends the port as a string; accept a number too.
    let port = match trsvcid {
        None | Some(Value::Null) => Some(4420),
        Some(Value::String(p)) => p.parse().ok(),
        Some(Value::Number(n)) => n.as_u64().and_then(|n| u16::try_from(n).ok()),
        Some(_) => None,
    };
    let port =
        port.ok_or_else(|| RpcError::params("listen_address.trsvcid: must be a port number"))?;
    Ok((std::net::SocketAddr::new(ip, port), rdma))
}
