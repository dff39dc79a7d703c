//! Options for opening a pool: reactors, GC, dual-path scheduling and the
//! periodic commit.

use super::gc::GcSettings;
use std::time::Duration;

/// Options for opening a pool.
#[derive(Debug, Clone)]
pub struct PoolOptions {
    /// Run the metadata thread (false in the simulation, which drives `md_step`).
    pub md_thread: bool,
    /// Number of per-reactor extent caches.
    pub reactors: usize,
    pub gc: GcSettings,
    pub dual_path: DualPath,
    /// Extent changes are committed at least this often without a Flush, which
    /// bounds what a crash can lose and how much memory pending changes take.
    /// `None`: only on Flush/FUA and the metadata thread's own work.
    pub commit_interval: Option<Duration>,
}

/// `PoolOptions::commit_interval` unless configured (`[[pools]] commit_interval_ms`).
pub const DEFAULT_COMMIT_INTERVAL: Duration = Duration::from_secs(1);

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            md_thread: true,
            reactors: 1,
            gc: GcSettings::default(),
            dual_path: DualPath::default(),
            commit_interval: Some(DEFAULT_COMMIT_INTERVAL),
        }
    }
}

#[cfg(any(test, feature = "test-support"))]
impl PoolOptions {
    /// The defaults without a metadata thread: the test runs each step
    /// (`Pool::md_step`), so nothing moves behind its back. For tests here
    /// and, with the `test-support` feature, in the crates above.
    pub fn stepped() -> PoolOptions {
        PoolOptions {
            md_thread: false,
            ..PoolOptions::default()
        }
    }
}

/// Dual-path scheduling: I/O at least `large_threshold` bytes is split into
/// `piece` sized device operations with at most `max_inflight` of them in flight
/// per channel; smaller I/O goes straight to the device.
#[derive(Debug, Clone, Copy)]
pub struct DualPath {
    pub enabled: bool,
    pub large_threshold: u64,
    pub piece: u64,
    pub max_inflight: usize,
}

impl Default for DualPath {
    fn default() -> Self {
        DualPath {
            enabled: true,
            large_threshold: 128 << 10,
            piece: 128 << 10,
            max_inflight: 4,
        }
    }
}
