//! Registered data memory. Every I/O buffer comes from the process-wide DMA
//! arena (`mem::dma`), so each RDMA device registers that arena once, range by
//! range as it grows (a `dma` mapper, like the VFIO container's IOMMU map), and
//! a request's data buffer comes from the reactor's size-class pool
//! (`IoCtx::bufs`), the same one NVMe/TCP uses, with no scan and no lock. Its
//! lkey is found by 2 MiB chunk in a table the mapper fills before the memory is
//! handed out.
//!
//! What still bounds memory per (reactor, device) is `BufferBudget`: the bytes
//! its requests hold at once (`rdma.buffer_pool_size`); a command past it waits.

use super::error::RdmaError;
use super::verbs::{self, Verbs};
use kvt_mem::dma::{self, DmaError, DmaRange};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Where a reactor keeps device `i`'s budget: `BUDGET_KEY | i` in its locals.
pub(super) const BUDGET_KEY: u64 = 0x5244_4d41 << 32;

/// The lkey of every registered chunk of the DMA arena for one protection
/// domain. Entries are `(registration number << 32) | lkey`, 0 for a chunk not
/// registered; the number tells two adjacent registrations apart, so a buffer
/// is refused if it straddles them (an SGE must lie inside one MR).
pub(super) struct MemoryKeys {
    chunks: Box<[AtomicU64]>,
}

impl MemoryKeys {
    fn new() -> MemoryKeys {
        MemoryKeys {
            chunks: (0..dma::MAX_CHUNKS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Records that registration `seq` (from 1) with `lkey` covers `range`.
    fn record(&self, range: &DmaRange, seq: u32, lkey: u32) {
        let (first, end) = dma::range_chunks(range);
        let v = (u64::from(seq) << 32) | u64::from(lkey);
        for c in self.chunks.get(first..end).unwrap_or(&[]) {
            c.store(v, Ordering::Release);
        }
    }

    /// The lkey for `len` bytes at `ptr`, if one registration covers them.
    pub(super) fn lkey(&self, ptr: *const u8, len: usize) -> Option<u32> {
        let (first, last) = dma::chunk_span(ptr, len)?;
        let a = self.chunks.get(first)?.load(Ordering::Acquire);
        let b = self.chunks.get(last)?.load(Ordering::Acquire);
        // A block of the arena never spans two ranges of one mapper (see
        // `mem::dma`), so equal ends mean one MR.
        (a != 0 && a == b).then_some(a as u32)
    }
}

/// Registers the DMA arena with protection domain `pd` now and as it grows;
/// the keys are valid for the process (the MRs are never deregistered: the
/// arena is never unmapped either).
pub(super) fn register_arena(
    v: &'static Verbs,
    pd: *mut std::ffi::c_void,
    device: &str,
) -> Result<Arc<MemoryKeys>, RdmaError> {
    let keys = Arc::new(MemoryKeys::new());
    let table = keys.clone();
    let pd = pd as usize;
    let mut seq = 0u32;
    dma::register_mapper(move |r: &DmaRange| {
        // SAFETY: the range is committed arena memory that stays mapped for
        // the process; pd is a live protection domain (devices are never
        // closed).
        let mr = unsafe {
            (v.ibv_reg_mr)(
                pd as *mut _,
                r.vaddr as *mut std::ffi::c_void,
                r.len,
                verbs::IBV_ACCESS_LOCAL_WRITE,
            )
        };
        if mr.is_null() {
            return Err(DmaError::Map {
                call: "ibv_reg_mr",
                errno: std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
            });
        }
        seq = seq.wrapping_add(1).max(1);
        // SAFETY: mr is the live MR just returned.
        let lkey = unsafe { (*mr).lkey };
        table.record(r, seq, lkey);
        Ok(())
    })
    .map_err(|source| RdmaError::RegisterArena {
        device: device.to_string(),
        source,
    })?;
    Ok(keys)
}

/// Data bytes the requests of one (reactor, device) may hold at once.
pub(super) struct BufferBudget {
    held: usize,
    limit: usize,
}

impl BufferBudget {
    pub(super) fn new(limit: usize) -> BufferBudget {
        BufferBudget { held: 0, limit }
    }
    /// Whether `len` more bytes fit (one request may always have the whole
    /// budget, so a request larger than it does not wait forever).
    pub(super) fn fits(&self, len: usize) -> bool {
        self.held == 0 || self.held + len <= self.limit
    }
    pub(super) fn take(&mut self, len: usize) {
        self.held += len;
    }
    pub(super) fn give(&mut self, len: usize) {
        self.held = self.held.saturating_sub(len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvt_mem::IoBuf;

    #[test]
    fn keys_cover_buffers_and_refuse_a_straddle() {
        let keys = MemoryKeys::new();
        // Two arena buffers; record one registration per buffer's chunks.
        let a = IoBuf::new(4096);
        let b = IoBuf::new(3 << 20);
        let range_of = |buf: &IoBuf| {
            let (f, l) = dma::chunk_span(buf.as_ptr(), buf.len()).unwrap();
            DmaRange {
                vaddr: 0,
                iova: dma::DMA_IOVA_BASE + (f * dma::CHUNK_BYTES) as u64,
                len: (l + 1 - f) * dma::CHUNK_BYTES,
            }
        };
        assert_eq!(keys.lkey(a.as_ptr(), a.len()), None);
        keys.record(&range_of(&a), 1, 0x11);
        keys.record(&range_of(&b), 2, 0x22);
        assert_eq!(keys.lkey(a.as_ptr(), a.len()), Some(0x11));
        assert_eq!(keys.lkey(b.as_ptr(), b.len()), Some(0x22));
        // Memory outside the arena has no key.
        let heap = Box::new([0u8; 64]);
        assert_eq!(keys.lkey(heap.as_ptr(), heap.len()), None);
        // Two registrations with the same lkey value are still told apart.
        let (f, l) = dma::chunk_span(b.as_ptr(), b.len()).unwrap();
        assert!(l > f);
        let tail = DmaRange {
            vaddr: 0,
            iova: dma::DMA_IOVA_BASE + (l * dma::CHUNK_BYTES) as u64,
            len: dma::CHUNK_BYTES,
        };
        keys.record(&tail, 3, 0x22);
        assert_eq!(keys.lkey(b.as_ptr(), b.len()), None);
    }

    #[test]
    fn the_budget_bounds_held_bytes_but_never_starves_one_large_request() {
        let mut b = BufferBudget::new(8192);
        assert!(b.fits(1 << 20));
        b.take(4096);
        assert!(b.fits(4096));
        assert!(!b.fits(8192));
        b.take(4096);
        assert!(!b.fits(1));
        b.give(8192);
        assert!(b.fits(8192));
    }
}
