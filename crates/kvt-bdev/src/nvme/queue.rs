//! One hardware submission/completion queue pair in DMA memory, with its doorbells.
//!
//! Memory ownership: the rings are `IoBuf`s from the DMA arena owned by `HwQueue`;
//! the controller reads the submission ring and writes the completion ring only
//! while the queue exists on the controller, and whoever deletes it (the channel's
//! Drop, a controller reset or shutdown) does so before the `HwQueue` is dropped or
//! the rings reused. The completion ring is read with volatile loads because the
//! device writes it concurrently.

use super::error::NvmeError;
use super::spec::{Cap, Cqe, Ring, Sqe, CQE_BYTES, SQE_BYTES};
use super::vfio::Bar;
use kvt_mem::{dma, IoBuf};
use std::sync::atomic::{fence, Ordering};

pub struct HwQueue {
    pub qid: u16,
    pub size: u16,
    sq: IoBuf,
    cq: IoBuf,
    pub sq_iova: u64,
    pub cq_iova: u64,
    tail: Ring,
    head: Ring,
    /// Tail value the doorbell last heard (to ring only when it moved).
    rung_tail: u16,
    bar: Bar,
    sq_db: usize,
    cq_db: usize,
}

impl HwQueue {
    pub fn new(bar: Bar, cap: &Cap, qid: u16, size: u16) -> Result<HwQueue, NvmeError> {
        let sq = IoBuf::new(size as usize * SQE_BYTES);
        let cq = IoBuf::new(size as usize * CQE_BYTES);
        let sq_iova =
            dma::iova(sq.as_ptr(), sq.len()).ok_or(NvmeError::NotDmaMapped("queue memory"))?;
        let cq_iova =
            dma::iova(cq.as_ptr(), cq.len()).ok_or(NvmeError::NotDmaMapped("queue memory"))?;
        Ok(HwQueue {
            qid,
            size,
            sq,
            cq,
            sq_iova,
            cq_iova,
            tail: Ring::new(size),
            head: Ring::new(size),
            rung_tail: 0,
            bar,
            sq_db: cap.sq_doorbell(qid),
            cq_db: cap.cq_doorbell(qid),
        })
    }

    /// Back to the state of a newly created queue (after the controller forgot it).
    pub fn reset(&mut self) {
        self.cq.fill(0);
        self.tail = Ring::new(self.size);
        self.head = Ring::new(self.size);
        self.rung_tail = 0;
    }

    /// Writes `sqe` at the tail. The caller keeps at most size - 1 commands
    /// outstanding, so the slot is free.
    pub fn push(&mut self, sqe: Sqe) {
        let at = self.tail.pos as usize * SQE_BYTES;
        self.sq[at..at + SQE_BYTES].copy_from_slice(&sqe.to_bytes());
        self.tail.advance();
    }

    /// Tells the controller about every entry pushed since the last call.
    pub fn ring_sq(&mut self) {
        if self.tail.pos != self.rung_tail {
            // The entries must be visible in memory before the doorbell write.
            fence(Ordering::SeqCst);
            self.bar.write32(self.sq_db, self.tail.pos as u32);
            self.rung_tail = self.tail.pos;
        }
    }

    /// The next new completion, if the controller has posted one.
    pub fn next_cqe(&mut self) -> Option<Cqe> {
        let at = self.head.pos as usize * CQE_BYTES;
        let p = self.cq.as_ptr().wrapping_add(at) as *const u32;
        // SAFETY: `at + 16 <= cq.len()` (pos < size) and the ring is 16-byte aligned
        // in page-aligned memory we own; volatile because the device writes it.
        let dw3 = unsafe { std::ptr::read_volatile(p.add(3)) };
        if (dw3 >> 16) & 1 != self.head.phase as u32 {
            return None;
        }
        // Read the rest of the entry only after seeing its phase bit.
        fence(Ordering::Acquire);
        // SAFETY: as above.
        let dw = unsafe {
            [
                std::ptr::read_volatile(p),
                std::ptr::read_volatile(p.add(1)),
                std::ptr::read_volatile(p.add(2)),
                dw3,
            ]
        };
        self.head.advance();
        Some(Cqe::parse(dw))
    }

    /// Releases consumed completion entries to the controller.
    pub fn ring_cq(&mut self) {
        self.bar.write32(self.cq_db, self.head.pos as u32);
    }
}
