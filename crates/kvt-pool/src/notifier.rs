//! How a channel hears back from the metadata thread: commits finished for
//! its Flush/FUA tags, clean extents available again, over an eventfd the
//! reactor polls.

use crossbeam_queue::SegQueue;
use kvt_reactor::sys::EventFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// How a channel hears back from the metadata thread.
pub struct Notifier {
    /// Tags whose commit (Flush, FUA) finished, with the result.
    pub committed: SegQueue<(u64, Result<(), i32>)>,
    /// Set when new clean extents became available.
    pub space: AtomicBool,
    pub efd: Option<EventFd>,
    /// Set with every signal, so polling reads the eventfd only when needed.
    signaled: AtomicBool,
}

impl Notifier {
    pub fn new() -> Notifier {
        Notifier {
            committed: SegQueue::new(),
            space: AtomicBool::new(false),
            efd: EventFd::new().ok(),
            signaled: AtomicBool::new(false),
        }
    }
    pub(super) fn signal(&self) {
        self.signaled.store(true, Ordering::Release);
        if let Some(e) = &self.efd {
            e.signal();
        }
    }
    /// Clears a pending wake-up (one syscall only when there was one).
    pub fn clear(&self) {
        if self.signaled.swap(false, Ordering::AcqRel) {
            if let Some(e) = &self.efd {
                e.drain();
            }
        }
    }
}

impl Default for Notifier {
    fn default() -> Self {
        Notifier::new()
    }
}

pub(super) struct CommitReq {
    pub(super) tag: u64,
    pub(super) to: Arc<Notifier>,
}
