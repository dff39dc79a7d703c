//! RAM backend: a zero-initialised region of memory, shared by all reactors.
//!
//! The memory is made resident when the device is created, on the thread that
//! creates it (the server's start, an RPC), before any reactor serves it: a
//! page (a 2 MiB transparent huge page) faulted in by a reactor's first write
//! stalls every queue of that reactor for up to a millisecond, hundreds of
//! times over. `RamDevice::lazy` keeps the older behaviour (resident only
//! where written) for hosts short of memory and for tests of huge namespaces.
//!
//! Operations complete inside `submit`, except writes longer than
//! `WRITE_PIECE`: those are copied one piece per `poll`, so a 1 MiB write does
//! not hold its reactor for the whole copy. `poll` hands completions back, so the
//! caller sees the same asynchronous contract as every other backend.

use super::{BlockDevice, IoChannel, IoCompletion, IoOp};
use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Instant;

/// The memory itself, shared by the device and every channel opened on it.
struct RamRegion {
    base: NonNull<u8>,
    size: u64,
    /// Every page was faulted in at creation and must stay resident: zeroing
    /// writes zeros instead of giving pages back to the kernel.
    resident: bool,
}

/// The page size the fallback touches at (the smallest Linux page).
const PAGE_BYTES: usize = 4096;

/// Writes longer than this are copied a piece per `poll`. A copy into memory
/// not in cache ran near 2.5 GB/s here, so a 1 MiB write held its reactor for
/// about 0.4 ms and a 4 KiB read on another queue waited for it: beside 32 MiB
/// stores such reads had P99 364-373 us whole, 278-288 us in 128 KiB pieces,
/// 190-202 us in 64 KiB and 165-187 us in 32 KiB, the stores no slower
/// (bench/RESULTS.md, 2026-12-06 11:00). Reads stay whole: their buffer goes
/// to the socket next, and pieces cost 32 MiB retrieves 11-21 % of their
/// throughput for reads beside them that already wait on the socket instead.
const WRITE_PIECE: usize = 32 * 1024;

/// Long writes a channel holds room for at open (more grow the queue once:
/// it is never refused).
const COPYING_DEPTH: usize = 1024;

// SAFETY: the region is only reached through raw-pointer copies in `RamChannel`,
// never through references, like a DMA target shared by several queues. Hosts that
// issue overlapping concurrent writes get an unspecified mix of their data, which is
// what NVMe specifies for such commands.
unsafe impl Send for RamRegion {}
// SAFETY: see above; nothing hands out references into the region.
unsafe impl Sync for RamRegion {}

impl RamRegion {
    /// Maps `size` bytes of anonymous memory. Pages are zero and only become
    /// resident when written, so a large namespace starts instantly and costs
    /// memory only for what hosts write.
    fn map(size: u64, resident: bool) -> std::io::Result<RamRegion> {
        let len = usize::try_from(size.max(4096))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "size too large"))?;
        // SAFETY: anonymous private mapping with no address hint; the result is
        // checked for MAP_FAILED before use and unmapped in Drop with the same len.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let base = NonNull::new(p as *mut u8)
            .ok_or_else(|| std::io::Error::other("mmap returned null"))?;
        // Transparent huge pages where the kernel allows them ("madvise" mode):
        // random I/O over a large namespace otherwise misses the TLB on almost
        // every 4 KiB page. Memory still becomes resident only where written,
        // in 2 MiB steps. Advisory: ignored where THP is off.
        // SAFETY: the range is exactly the mapping made above.
        unsafe { libc::madvise(p, len, libc::MADV_HUGEPAGE) };
        let region = RamRegion {
            base,
            size,
            resident,
        };
        if resident {
            region.populate(len);
        }
        Ok(region)
    }

    /// Faults in all `len` bytes of the mapping, writable, on this thread.
    fn populate(&self, len: usize) {
        // SAFETY: the range is exactly the mapping, not shared with anyone yet.
        unsafe { kvt_mem::fault_in(self.base.as_ptr(), len) };
    }
    fn check(&self, offset: u64, len: u64) -> Result<*mut u8, i32> {
        match offset.checked_add(len) {
            // SAFETY: offset + len <= size, so the pointer stays inside the region.
            Some(end) if end <= self.size => Ok(unsafe { self.base.as_ptr().add(offset as usize) }),
            _ => Err(libc::EINVAL),
        }
    }
}

impl RamRegion {
    /// Zeroes a range. Whole pages are given back to the kernel (they read as
    /// zeros and stop costing memory); only partial pages at the ends are
    /// written, so deallocating or scrubbing a large range never makes it resident.
    fn zero(&self, offset: u64, len: u64) -> Result<(), i32> {
        let dst = self.check(offset, len)?;
        const PAGE: u64 = PAGE_BYTES as u64;
        let start = offset.div_ceil(PAGE) * PAGE;
        let end = (offset + len) / PAGE * PAGE;
        // A resident region stays resident: pages given back would be faulted
        // in again by the next write, on a reactor.
        if end <= start || self.resident {
            // SAFETY: dst..dst+len is inside the region (checked above).
            unsafe { std::ptr::write_bytes(dst, 0, len as usize) };
            return Ok(());
        }
        // SAFETY: the head and tail lie inside dst..dst+len (checked above).
        unsafe {
            std::ptr::write_bytes(dst, 0, (start - offset) as usize);
            std::ptr::write_bytes(
                dst.add((end - offset) as usize),
                0,
                (offset + len - end) as usize,
            );
        }
        // SAFETY: start..end is page-aligned and inside this private anonymous
        // mapping; MADV_DONTNEED makes those pages read as zeros afterwards.
        let r = unsafe {
            libc::madvise(
                self.base.as_ptr().add(start as usize) as *mut libc::c_void,
                (end - start) as usize,
                libc::MADV_DONTNEED,
            )
        };
        if r != 0 {
            // SAFETY: as above, the range is inside the region.
            unsafe {
                std::ptr::write_bytes(
                    self.base.as_ptr().add(start as usize),
                    0,
                    (end - start) as usize,
                )
            };
        }
        Ok(())
    }
}

impl Drop for RamRegion {
    fn drop(&mut self) {
        // SAFETY: mapped in `map` with this length; the last Arc (device or
        // channel) is going away, so nothing can use it any more.
        unsafe {
            libc::munmap(
                self.base.as_ptr() as *mut libc::c_void,
                self.size.max(4096) as usize,
            )
        };
    }
}

pub struct RamDevice {
    name: String,
    region: Arc<RamRegion>,
}

impl RamDevice {
    /// A RAM namespace of `size` bytes, all of it resident before this returns
    /// (call it off the reactors: the kernel zeroes every page now).
    pub fn new(name: &str, size: u64) -> std::io::Result<Arc<RamDevice>> {
        Self::map(name, size, true)
    }

    /// A RAM namespace whose memory becomes resident only where written, by
    /// the reactor that writes it (page faults on the I/O path).
    pub fn lazy(name: &str, size: u64) -> std::io::Result<Arc<RamDevice>> {
        Self::map(name, size, false)
    }

    fn map(name: &str, size: u64, resident: bool) -> std::io::Result<Arc<RamDevice>> {
        let region = RamRegion::map(size, resident).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("cannot map {size} bytes for RAM namespace {name}: {e}"),
            )
        })?;
        Ok(Arc::new(RamDevice {
            name: name.to_string(),
            region: Arc::new(region),
        }))
    }
}

impl BlockDevice for RamDevice {
    fn describe(&self) -> String {
        format!("ram:{}", self.name)
    }
    fn size_bytes(&self) -> u64 {
        self.region.size
    }
    fn open_channel(&self) -> std::io::Result<Box<dyn IoChannel>> {
        Ok(Box::new(RamChannel {
            region: self.region.clone(),
            done: Vec::with_capacity(COPYING_DEPTH),
            copying: VecDeque::with_capacity(COPYING_DEPTH),
        }))
    }
    fn sync(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn volatile(&self) -> bool {
        true
    }
}

pub struct RamChannel {
    region: Arc<RamRegion>,
    done: Vec<IoCompletion>,
    /// Long writes, oldest first: the front one gets a piece per poll.
    copying: VecDeque<Copying>,
}

/// A long write part-way through its copy.
struct Copying {
    tag: u64,
    op: IoOp,
    /// Bytes copied so far.
    copied: usize,
}

/// The offset and length of a write longer than a piece, or None.
fn long_write(op: &IoOp) -> Option<(u64, usize)> {
    match op {
        IoOp::Write { offset, buf, .. } if buf.len() > WRITE_PIECE => Some((*offset, buf.len())),
        _ => None,
    }
}

impl RamChannel {
    /// Copies `len` bytes of a write's buffer from `at` on into the region.
    fn copy_range(region: &RamRegion, op: &IoOp, at: usize, len: usize) -> Result<(), i32> {
        let IoOp::Write { offset, buf, .. } = op else {
            unreachable!("only writes are copied in pieces");
        };
        let dst = region.check(*offset + at as u64, len as u64)?;
        let src = &buf[at..at + len];
        // Streamed: a long write's data is read back much later, if at all,
        // and ordinary stores would read each line of it in first.
        // SAFETY: dst..dst+len is inside the region (checked); src is ours.
        unsafe { kvt_mem::copy_streaming(dst, src) };
        Ok(())
    }

    /// One piece of the oldest long write; completes it after its last.
    fn copy_piece(&mut self) {
        let Some(c) = self.copying.front_mut() else {
            return;
        };
        let Some((_, len)) = long_write(&c.op) else {
            unreachable!("a short operation was queued for copying");
        };
        let n = WRITE_PIECE.min(len - c.copied);
        let result = Self::copy_range(&self.region, &c.op, c.copied, n);
        c.copied += n;
        if result.is_err() || c.copied == len {
            if let Some(c) = self.copying.pop_front() {
                self.done.push(IoCompletion {
                    tag: c.tag,
                    result,
                    buf: c.op.into_buf(),
                });
            }
        }
    }

    fn execute(&mut self, op: &mut IoOp) -> Result<(), i32> {
        match op {
            IoOp::Read { offset, buf } => {
                let src = self.region.check(*offset, buf.len() as u64)?;
                // SAFETY: src..src+len is inside the region (checked); buf is ours.
                unsafe { std::ptr::copy_nonoverlapping(src, buf.as_mut_ptr(), buf.len()) }
            }
            IoOp::Write { offset, buf, .. } => {
                let dst = self.region.check(*offset, buf.len() as u64)?;
                // SAFETY: dst..dst+len is inside the region (checked).
                unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), dst, buf.len()) }
            }
            IoOp::Flush => {}
            IoOp::WriteZeroes { offset, len } | IoOp::Deallocate { offset, len } => {
                self.region.zero(*offset, *len)?;
            }
        }
        Ok(())
    }
}

impl IoChannel for RamChannel {
    fn submit(&mut self, tag: u64, mut op: IoOp, _now: Instant) -> Result<(), (IoOp, i32)> {
        if let Some((offset, len)) = long_write(&op) {
            // Out of range completes with its error at once, as a short one.
            if self.region.check(offset, len as u64).is_ok() {
                self.copying.push_back(Copying { tag, op, copied: 0 });
                return Ok(());
            }
        }
        let result = self.execute(&mut op);
        self.done.push(IoCompletion {
            tag,
            result,
            buf: op.into_buf(),
        });
        Ok(())
    }
    fn flush_submissions(&mut self) {}
    fn poll(&mut self, out: &mut Vec<IoCompletion>, _now: Instant) -> usize {
        self.copy_piece();
        let n = self.done.len();
        out.append(&mut self.done);
        n
    }
    fn in_flight(&self) -> usize {
        self.done.len() + self.copying.len()
    }
    fn completion_fd(&self) -> Option<RawFd> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ram_device_behaves() {
        let dev = RamDevice::new("t", 1 << 20).unwrap();
        crate::testing::exercise(dev.as_ref());
    }

    fn resident_bytes() -> u64 {
        let s = std::fs::read_to_string("/proc/self/statm").unwrap();
        let pages: u64 = s.split_whitespace().nth(1).unwrap().parse().unwrap();
        pages * 4096
    }

    #[test]
    fn a_long_write_is_copied_a_piece_per_poll_and_short_io_passes_it() {
        let dev = RamDevice::new("pieces", 4 << 20).unwrap();
        let mut ch = dev.open_channel().unwrap();
        let now = Instant::now();
        let len = 3 * WRITE_PIECE + 512;
        let mut w = kvt_mem::IoBuf::new(len);
        for (i, b) in w.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        let write = IoOp::Write {
            offset: 4096,
            buf: w,
            fua: false,
        };
        assert!(ch.submit(1, write, now).is_ok());
        // A short read queued behind it completes at the first poll.
        let read = IoOp::Read {
            offset: 1 << 20,
            buf: kvt_mem::IoBuf::new(4096),
        };
        assert!(ch.submit(2, read, now).is_ok());
        let mut out = Vec::new();
        let mut polls = 0;
        let mut order = Vec::new();
        while order.len() < 2 {
            polls += 1;
            assert!(polls <= 4, "the long write never completed");
            ch.poll(&mut out, now);
            for c in out.drain(..) {
                assert_eq!(c.result, Ok(()));
                order.push((c.tag, polls));
            }
        }
        assert_eq!(
            order,
            [(2, 1), (1, 4)],
            "one piece per poll, the short read first"
        );
        assert_eq!(ch.in_flight(), 0);
        let back = crate::testing::run(
            ch.as_mut(),
            IoOp::Read {
                offset: 4096,
                buf: kvt_mem::IoBuf::new(len),
            },
        );
        let back = back.buf.unwrap();
        assert!(back.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
    }

    #[test]
    fn a_long_write_past_the_end_fails_at_its_first_poll() {
        let dev = RamDevice::new("short", 1 << 20).unwrap();
        let mut ch = dev.open_channel().unwrap();
        let c = crate::testing::run(
            ch.as_mut(),
            IoOp::Write {
                offset: (1 << 20) - 4096,
                buf: kvt_mem::IoBuf::new(2 * WRITE_PIECE),
                fua: false,
            },
        );
        assert_eq!(c.result, Err(libc::EINVAL));
    }

    #[test]
    fn large_namespace_costs_memory_only_when_written() {
        let before = resident_bytes();
        let dev = RamDevice::lazy("big", 4 << 30).unwrap();
        let after = resident_bytes();
        // Zeroing 4 GiB up front would make all of it resident.
        assert!(
            after.saturating_sub(before) < 1 << 30,
            "{before} -> {after}"
        );
        let mut ch = dev.open_channel().unwrap();
        let c = crate::testing::run(
            ch.as_mut(),
            IoOp::Read {
                offset: (4 << 30) - 4096,
                buf: kvt_mem::IoBuf::new(4096),
            },
        );
        assert!(c.buf.unwrap().iter().all(|&b| b == 0));
    }

    #[test]
    fn deallocating_a_large_range_releases_memory_instead_of_touching_it() {
        let dev = RamDevice::lazy("scrub", 4 << 30).unwrap();
        let mut ch = dev.open_channel().unwrap();
        let mut w = kvt_mem::IoBuf::new(1 << 20);
        w.fill(0xAB);
        let c = crate::testing::run(
            ch.as_mut(),
            IoOp::Write {
                offset: 1 << 30,
                buf: w,
                fua: false,
            },
        );
        assert_eq!(c.result, Ok(()));
        let before = resident_bytes();
        // The whole device, unaligned at both ends (a pool format does this).
        let c = crate::testing::run(
            ch.as_mut(),
            IoOp::Deallocate {
                offset: 512,
                len: (4 << 30) - 1024,
            },
        );
        assert_eq!(c.result, Ok(()));
        let after = resident_bytes();
        assert!(after < before + (1 << 30), "{before} -> {after}");
        let r = crate::testing::run(
            ch.as_mut(),
            IoOp::Read {
                offset: (1 << 30) - 4096,
                buf: kvt_mem::IoBuf::new(8192),
            },
        );
        assert!(r.buf.unwrap().iter().all(|&b| b == 0));
    }

    /// Pages of the device's memory that are resident (mincore).
    fn resident_pages(dev: &RamDevice) -> usize {
        let len = dev.region.size as usize;
        let mut v = vec![0u8; len.div_ceil(PAGE_BYTES)];
        // SAFETY: the range is the device's mapping; v has one byte per page.
        let r = unsafe {
            libc::mincore(
                dev.region.base.as_ptr() as *mut libc::c_void,
                len,
                v.as_mut_ptr(),
            )
        };
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
        v.iter().filter(|&&b| b & 1 != 0).count()
    }

    #[test]
    fn a_namespace_is_resident_at_creation_and_stays_resident() {
        let dev = RamDevice::new("warm", 64 << 20).unwrap();
        assert_eq!(resident_pages(&dev), (64 << 20) / PAGE_BYTES);
        assert_eq!(
            resident_pages(&RamDevice::lazy("cold", 64 << 20).unwrap()),
            0
        );
        let mut ch = dev.open_channel().unwrap();
        let mut w = kvt_mem::IoBuf::new(1 << 20);
        w.fill(0xCD);
        let c = crate::testing::run(
            ch.as_mut(),
            IoOp::Write {
                offset: 4 << 20,
                buf: w,
                fua: false,
            },
        );
        assert_eq!(c.result, Ok(()));
        // Deallocating zeroes in place: nothing given back, nothing to fault.
        let c = crate::testing::run(
            ch.as_mut(),
            IoOp::Deallocate {
                offset: 512,
                len: (64 << 20) - 1024,
            },
        );
        assert_eq!(c.result, Ok(()));
        assert_eq!(resident_pages(&dev), (64 << 20) / PAGE_BYTES);
        let r = crate::testing::run(
            ch.as_mut(),
            IoOp::Read {
                offset: 4 << 20,
                buf: kvt_mem::IoBuf::new(1 << 20),
            },
        );
        assert!(r.buf.unwrap().iter().all(|&b| b == 0));
    }

    #[test]
    fn out_of_range_fails_cleanly() {
        let dev = RamDevice::new("t", 8192).unwrap();
        let mut ch = dev.open_channel().unwrap();
        let c = crate::testing::run(
            ch.as_mut(),
            IoOp::Read {
                offset: 8192,
                buf: kvt_mem::IoBuf::new(4096),
            },
        );
        assert_eq!(c.result, Err(libc::EINVAL));
    }
}
