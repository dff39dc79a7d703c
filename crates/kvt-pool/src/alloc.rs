//! The extent allocator of the data path: per-reactor caches of clean extents
//! already journaled as reserved, refilled in batches from the shared ready
//! queue the metadata thread keeps at `READY_TARGET`; freed extents go back
//! through a lock-free queue for GC. Nothing here blocks or writes metadata.

use super::volume::AllocError;
use super::*;

impl Pool {
    /// A clean, reserved extent for a first write. Never blocks.
    pub fn take_extent(&self, reactor: usize) -> Result<u32, AllocError> {
        let r = reactor % self.caches.len();
        if let Some(p) = self.caches[r].pop() {
            debug_assert!(p < self.sb.extent_count, "reserved extent {p} out of range");
            return Ok(p);
        }
        if let Some(p) = self.ready.pop() {
            for _ in 1..CACHE_BATCH {
                match self.ready.pop() {
                    Some(x) => {
                        if let Err(x) = self.caches[r].push(x) {
                            let _ = self.ready.push(x);
                            break;
                        }
                    }
                    None => break,
                }
            }
            if self.ready.len() < READY_TARGET / 2 {
                self.wake_md();
            }
            return Ok(p);
        }
        for c in &self.caches {
            if let Some(p) = c.pop() {
                return Ok(p);
            }
        }
        self.wake_md();
        if self.failed.load(Ordering::Acquire) {
            return Err(AllocError::Failed);
        }
        if self.exhausted.load(Ordering::Acquire) {
            self.stats.no_space.fetch_add(1, Ordering::Relaxed);
            Err(AllocError::NoSpace)
        } else {
            self.stats.alloc_waits.fetch_add(1, Ordering::Relaxed);
            Err(AllocError::Wait)
        }
    }

    /// Gives back an extent taken but not used (it is still clean).
    pub fn return_extent(&self, reactor: usize, p: u32) {
        let r = reactor % self.caches.len();
        if let Err(p) = self.caches[r].push(p) {
            if self.ready.push(p).is_err() {
                // Both full: treat as dirty, GC will scrub it again.
                self.freed.push(p);
            }
        }
    }

    /// An extent unmapped on the data path: dirty until GC scrubs it.
    pub fn extent_freed(&self, p: u32) {
        self.freed.push(p);
    }

    /// An extent that emptied while pinned: the metadata thread retries later.
    pub fn retry_unmap(&self, vol: u32, lext: u32) {
        self.retry_free.push((vol, lext));
    }
}
