//! What the integration tests share: the helpers of the dev-only crate
//! kvt-testkit (compiled once, not into each test binary), and what only this
//! package's tests can know, the path of the daemon binary cargo built.
#![allow(dead_code)]

pub use kvt_testkit::*;
use std::path::Path;
use std::process::Child;

/// The daemon binary.
pub const BIN: &str = env!("CARGO_BIN_EXE_kvtarget");

/// The daemon as a process on the configuration `cfg`, its RPC socket at
/// `sock`, its log discarded.
pub fn spawn_daemon(cfg: &Path, sock: &Path) -> Child {
    kvt_testkit::spawn_daemon(BIN, cfg, sock)
}
