//! RAM backend: a zero-initialised region of memory, shared by all reactors.
//!
//! Operations complete synchronously inside `submit`; `poll` hands them back so the
//! caller sees the same asynchronous contract as every other backend.

use super::{BlockDevice, IoChannel, IoCompletion, IoOp};
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::sync::Arc;

/// The memory itself, shared by the device and every channel opened on it.
struct RamRegion {
    base: NonNull<u8>,
    size: u64,
}

// SAFETY: the region is only reached through raw-pointer copies in `RamChannel`,
// never through references, like a DMA target shared by several queues. Hosts that
// issue overlapping concurrent writes get an unspecified mix of their data, which is
// what NVMe specifies for such commands.
unsafe impl Send for RamRegion {}
// SAFETY: see above; nothing hands out references into the region.
unsafe impl Sync for RamRegion {}

impl RamRegion {
    fn layout(size: u64) -> Result<Layout, std::alloc::LayoutError> {
        Layout::from_size_align(size.max(4096) as usize, 4096)
    }
    fn check(&self, offset: u64, len: u64) -> Result<*mut u8, i32> {
        match offset.checked_add(len) {
            // SAFETY: offset + len <= size, so the pointer stays inside the region.
            Some(end) if end <= self.size => Ok(unsafe { self.base.as_ptr().add(offset as usize) }),
            _ => Err(libc::EINVAL),
        }
    }
}

impl Drop for RamRegion {
    fn drop(&mut self) {
        if let Ok(layout) = Self::layout(self.size) {
            // SAFETY: allocated in `RamDevice::new` with this layout; the last Arc
            // (device or channel) is going away, so nothing can use it any more.
            unsafe { dealloc(self.base.as_ptr(), layout) }
        }
    }
}

pub struct RamDevice {
    name: String,
    region: Arc<RamRegion>,
}

impl RamDevice {
    pub fn new(name: &str, size: u64) -> std::io::Result<Arc<RamDevice>> {
        let layout = RamRegion::layout(size)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        // SAFETY: non-zero size; zeroing of large regions is lazy (fresh pages).
        let raw = unsafe { alloc_zeroed(layout) };
        let base = NonNull::new(raw).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::OutOfMemory,
                format!("cannot allocate {size} bytes for RAM namespace {name}"),
            )
        })?;
        Ok(Arc::new(RamDevice {
            name: name.to_string(),
            region: Arc::new(RamRegion { base, size }),
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
            done: Vec::new(),
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
}

impl RamChannel {
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
                let dst = self.region.check(*offset, *len)?;
                // SAFETY: dst..dst+len is inside the region (checked).
                unsafe { std::ptr::write_bytes(dst, 0, *len as usize) }
            }
        }
        Ok(())
    }
}

impl IoChannel for RamChannel {
    fn submit(&mut self, tag: u64, mut op: IoOp) -> Result<(), (IoOp, i32)> {
        let result = self.execute(&mut op);
        self.done.push(IoCompletion {
            tag,
            result,
            buf: op.into_buf(),
        });
        Ok(())
    }
    fn flush_submissions(&mut self) {}
    fn poll(&mut self, out: &mut Vec<IoCompletion>) -> usize {
        let n = self.done.len();
        out.append(&mut self.done);
        n
    }
    fn in_flight(&self) -> usize {
        self.done.len()
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
        crate::bdev::tests::exercise(dev.as_ref());
    }

    #[test]
    fn out_of_range_fails_cleanly() {
        let dev = RamDevice::new("t", 8192).unwrap();
        let mut ch = dev.open_channel().unwrap();
        let c = crate::bdev::tests::run(
            ch.as_mut(),
            IoOp::Read {
                offset: 8192,
                buf: crate::mem::IoBuf::new(4096),
            },
        );
        assert_eq!(c.result, Err(libc::EINVAL));
    }
}
