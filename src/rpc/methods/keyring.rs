//! `keyring_*` methods, SPDK's names: keys from files, referred to by name from
//! host entries (`nvmf_subsystem_add_host` `dhchap_key`). Listings show names
//! and paths only.

use super::{act, not_found, Params, Parsed};
use crate::auth::{Key, KeyError};
use crate::config::KeyConfig;
use crate::rpc::{code, RpcError};
use serde_json::{json, Value};
use std::sync::Arc;

pub(super) fn file_add_key(p: &mut Params) -> Parsed {
    let KeyConfig { name, path } = p.typed(&["name", "path"])?;
    act(move |ctl| {
        let key = Key::load(&name, std::path::Path::new(&path)).map_err(|e| match e {
            KeyError::Name => RpcError::params(format!("name: {e}")),
            e => RpcError::params(format!("path: {e}")),
        })?;
        ctl.target.keyring.add(key).map_err(|e| match e {
            KeyError::Exists(_) => RpcError::new(code::EEXIST, e.to_string()),
            e => RpcError::new(code::INTERNAL_ERROR, e.to_string()),
        })?;
        tracing::info!(name = %name, path = %path, "rpc: key added");
        Ok(Value::Bool(true))
    })
}

pub(super) fn file_remove_key(p: &mut Params) -> Parsed {
    let name = p.str("name")?;
    act(move |ctl| {
        ctl.target
            .keyring
            .remove(&name)
            .map_err(|e| not_found(e.to_string()))?;
        tracing::info!(name = %name, "rpc: key removed (hosts using it keep it until removed)");
        Ok(Value::Bool(true))
    })
}

pub(super) fn get_keys(_p: &mut Params) -> Parsed {
    act(move |ctl| {
        let keys: Vec<Value> = ctl
            .target
            .keyring
            .list()
            .iter()
            .map(|k| {
                json!({
                    "name": k.name,
                    "path": k.path.display().to_string(),
                    "module": "keyring_file",
                    // Host entries using it (not the ring's own reference, nor this listing's).
                    "refcnt": Arc::strong_count(k).saturating_sub(2),
                    "removed": false,
                    "probed": false,
                })
            })
            .collect();
        Ok(Value::Array(keys))
    })
}
