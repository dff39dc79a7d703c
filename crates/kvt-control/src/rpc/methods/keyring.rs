//! `keyring_*` methods, SPDK's names: keys from files, referred to by name from
//! host entries (`nvmf_subsystem_add_host` `dhchap_key`). Listings show names
//! and paths only.

use super::{act, Params, Parsed};
use kvt_config::KeyConfig;
use serde_json::{json, Value};
use std::sync::Arc;

pub(super) fn file_add_key(p: &mut Params) -> Parsed {
    let op: KeyConfig = p.typed(&["name", "path"])?;
    act(move |ctl| {
        kvt_config::apply::add_key(&ctl.target, &op).map_err(super::nvmf_subsystem::apply_error)?;
        tracing::info!(name = %op.name, path = %op.path, "rpc: key added");
        Ok(Value::Bool(true))
    })
}

pub(super) fn file_remove_key(p: &mut Params) -> Parsed {
    let super::Name { name } = p.parse()?;
    act(move |ctl| {
        kvt_config::apply::remove_key(&ctl.target, &name)
            .map_err(super::nvmf_subsystem::apply_error)?;
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
