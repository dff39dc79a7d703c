//! `spdk_get_version`, `rpc_get_methods` and `framework_*`: what the daemon is
//! and what it runs on.

use super::{act, Params, Parsed, METHODS};
use serde_json::{json, Value};
use std::sync::atomic::Ordering;

pub(super) fn version(_p: &mut Params) -> Parsed {
    act(|ctl| {
        let v = env!("CARGO_PKG_VERSION");
        let mut it = v.split('.').map(|x| x.parse::<u64>().unwrap_or(0));
        Ok(json!({
            "version": format!("kvtarget {v} (SPDK-compatible RPC)"),
            "fields": {
                "major": it.next().unwrap_or(0),
                "minor": it.next().unwrap_or(0),
                "patch": it.next().unwrap_or(0),
                "suffix": format!("-kvtarget {}", ctl.target.firmware),
            }
        }))
    })
}

/// `rpc_get_methods`'s parameters: every method is callable at any time
/// and has no alias, so both flags list the same.
#[derive(serde::Deserialize)]
#[allow(dead_code)]
struct GetMethods {
    current: Option<bool>,
    include_aliases: Option<bool>,
}

pub(super) fn get_methods(p: &mut Params) -> Parsed {
    let _: GetMethods = p.parse()?;
    act(|_| Ok(json!(METHODS)))
}

pub(super) fn reactors(_p: &mut Params) -> Parsed {
    act(|ctl| {
        let rs: Vec<Value> = ctl
            .reactors
            .iter()
            .map(|r| {
                let st = r.stall.snapshot();
                json!({
                    "lcore": r.id,
                    "busy": r.busy_ns.load(Ordering::Relaxed),
                    "idle": r.idle_ns.load(Ordering::Relaxed),
                    "in_interrupt": false,
                    "irq_count": 0,
                    "sys_count": 0,
                    "queue_pairs": r.queue_pairs.load(Ordering::Relaxed),
                    "lw_threads": [],
                    // kvtarget's own (ticks are ns): see docs/metrics.md.
                    "minor_faults": st.minor_faults,
                    "major_faults": st.major_faults,
                    "involuntary_context_switches": st.involuntary_switches,
                    "polls": st.gap_count(),
                    "stalls": st.stalls,
                    "max_poll_gap": st.max_gap_ns,
                    "kv_asks_posted": r.kv_asks_posted.load(Ordering::Relaxed),
                    "kv_asks_served": r.kv_asks_served.load(Ordering::Relaxed),
                    "kv_indexes_owned": r.kv_indexes_owned.load(Ordering::Relaxed),
                })
            })
            .collect();
        // busy/idle are in nanoseconds: one tick is one nanosecond.
        Ok(json!({"tick_rate": 1_000_000_000u64, "pid": std::process::id(), "reactors": rs}))
    })
}
