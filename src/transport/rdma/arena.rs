//! The registered data-buffer arena: one block per (device, reactor),
//! registered once, carved into page runs that requests hold as `IoBuf` views
//! for RDMA READ/WRITE and device I/O. The reactor owns its arenas (its
//! `Locals`): its queue pairs use them without a lock.

use super::error::RdmaError;
use super::verbs::{self, ibv_mr, Verbs};
use crate::mem::IoBuf;

/// Page size of the data arena allocator.
const ARENA_PAGE: usize = 4096;

/// Where a reactor keeps device `i`'s arena: `ARENA_KEY | i` in its locals.
pub(super) const ARENA_KEY: u64 = 0x5244_4d41 << 32;

/// A registered block carved into page runs.
pub(super) struct Arena {
    buf: IoBuf,
    v: Option<&'static Verbs>,
    /// Deregistered when the reactor that owns the arena goes (after its
    /// queue pairs, so no work request can still reach the memory).
    mr: *mut ibv_mr,
    pub(super) lkey: u32,
    used: Vec<bool>,
    hint: usize,
}

// SAFETY: an arena is made on the connection manager's thread and then owned
// and used by one reactor alone (moved there whole, never shared); the MR
// pointer is an rdma-core object usable from any thread.
unsafe impl Send for Arena {}

impl Drop for Arena {
    fn drop(&mut self) {
        if let (Some(v), false) = (self.v, self.mr.is_null()) {
            // SAFETY: mr was registered in `new` and is deregistered once,
            // here; the reactor dropping it has no queue pair left, so no
            // work request uses the memory.
            unsafe {
                (v.ibv_dereg_mr)(self.mr);
            }
        }
    }
}

/// A run of arena pages owned by one request.
#[derive(Debug, Clone, Copy)]
pub(super) struct Chunk {
    page: usize,
    pages: usize,
}

impl Arena {
    pub(super) fn new(
        v: &'static Verbs,
        pd: *mut std::ffi::c_void,
        bytes: usize,
    ) -> Result<Arena, RdmaError> {
        let mut buf = IoBuf::new(bytes);
        // SAFETY: buf's memory is valid for its capacity and is never freed (the
        // arena lives for the process); pd is a live protection domain.
        let mr = unsafe {
            (v.ibv_reg_mr)(
                pd,
                buf.as_mut_ptr() as *mut std::ffi::c_void,
                buf.capacity(),
                verbs::IBV_ACCESS_LOCAL_WRITE,
            )
        };
        if mr.is_null() {
            return Err(RdmaError::RegisterArena {
                bytes,
                source: std::io::Error::last_os_error(),
            });
        }
        // SAFETY: mr is a live MR returned just above.
        let lkey = unsafe { (*mr).lkey };
        let pages = buf.capacity() / ARENA_PAGE;
        Ok(Arena {
            buf,
            v: Some(v),
            mr,
            lkey,
            used: vec![false; pages],
            hint: 0,
        })
    }

    /// A view of `len` bytes in free pages, first fit from a rotating hint.
    pub(super) fn alloc(&mut self, len: usize) -> Option<(Chunk, IoBuf)> {
        let need = len.max(1).div_ceil(ARENA_PAGE);
        let n = self.used.len();
        if need > n {
            return None;
        }
        let mut start = if self.hint + need <= n { self.hint } else { 0 };
        let mut tried = 0;
        while tried < n {
            if start + need > n {
                tried += n - start;
                start = 0;
                continue;
            }
            match self.used[start..start + need].iter().position(|&u| u) {
                None => {
                    self.used[start..start + need].fill(true);
                    self.hint = start + need;
                    // SAFETY: the pages are now marked used, so no other view
                    // overlaps this one until `free`; the arena memory does not
                    // move, and it is freed only with its reactor, after every
                    // queue pair (and so every request holding a view) is gone.
                    let view = unsafe { IoBuf::view(&mut self.buf, start * ARENA_PAGE, len) }?;
                    return Some((
                        Chunk {
                            page: start,
                            pages: need,
                        },
                        view,
                    ));
                }
                Some(p) => {
                    tried += p + 1;
                    start += p + 1;
                }
            }
        }
        None
    }

    pub(super) fn free(&mut self, c: Chunk) {
        if let Some(s) = self.used.get_mut(c.page..c.page + c.pages) {
            s.fill(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arena_allocates_disjoint_page_runs_and_reuses_freed_ones() {
        // The allocator alone (no registration): a fake arena over plain memory.
        let mut a = Arena {
            buf: IoBuf::new(16 * ARENA_PAGE),
            v: None,
            mr: std::ptr::null_mut(),
            lkey: 0,
            used: vec![false; 16],
            hint: 0,
        };
        let (c1, v1) = a.alloc(3 * ARENA_PAGE).unwrap();
        let (c2, v2) = a.alloc(1).unwrap();
        assert_eq!((c1.pages, c2.pages), (3, 1));
        assert_eq!(v1.len(), 3 * ARENA_PAGE);
        assert_eq!(v2.len(), 1);
        let (p1, p2) = (v1.as_ptr() as usize, v2.as_ptr() as usize);
        assert!(p2 >= p1 + 3 * ARENA_PAGE || p1 >= p2 + ARENA_PAGE);
        assert!(a.alloc(13 * ARENA_PAGE).is_none());
        let (c3, _) = a.alloc(12 * ARENA_PAGE).unwrap();
        assert!(a.alloc(1).is_none());
        a.free(c1);
        let (c4, _) = a.alloc(2 * ARENA_PAGE).unwrap();
        assert_eq!(c4.page, c1.page);
        a.free(c2);
        a.free(c3);
        a.free(c4);
        assert!(a.used.iter().all(|u| !u));
        assert!(a.alloc(16 * ARENA_PAGE).is_some());
    }
}
