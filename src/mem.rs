//! I/O buffers: page-aligned heap memory that O_DIRECT, io_uring and (later) DMA can
//! use, recycled through a per-reactor pool so the data path does not allocate.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

/// Alignment of every I/O buffer: a page, which satisfies O_DIRECT on any device
/// with logical blocks up to 4 KiB and NVMe PRP rules.
pub const IO_BUF_ALIGN: usize = 4096;

/// An owned, page-aligned, zero-initialised byte buffer with a fixed capacity and a
/// current length.
pub struct IoBuf {
    ptr: NonNull<u8>,
    cap: usize,
    len: usize,
    /// False for a view into another buffer's memory: not freed, not pooled.
    owned: bool,
}

// SAFETY: IoBuf uniquely owns its allocation (like Vec<u8>); moving it between
// threads moves that ownership.
unsafe impl Send for IoBuf {}

impl IoBuf {
    /// Allocates `cap` bytes (rounded up to the alignment), length `len`.
    pub fn new(cap: usize) -> IoBuf {
        let cap = cap.max(IO_BUF_ALIGN).div_ceil(IO_BUF_ALIGN) * IO_BUF_ALIGN;
        let layout = match Layout::from_size_align(cap, IO_BUF_ALIGN) {
            Ok(l) => l,
            Err(_) => std::alloc::handle_alloc_error(Layout::new::<u8>()),
        };
        // SAFETY: layout has non-zero size (cap >= IO_BUF_ALIGN).
        let raw = unsafe { alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
        };
        IoBuf {
            ptr,
            cap,
            len: cap,
            owned: true,
        }
    }

    /// A non-owning view of `len` bytes of `parent` starting at `at`, so one
    /// transfer can go to the device as several operations without a copy.
    ///
    /// # Safety
    /// The caller keeps `parent` alive, unmoved in memory and otherwise unused for
    /// as long as the view (or anything it is moved into) exists, and never hands
    /// out two live views over overlapping bytes.
    pub unsafe fn view(parent: &mut IoBuf, at: usize, len: usize) -> Option<IoBuf> {
        if at.checked_add(len)? > parent.len {
            return None;
        }
        // SAFETY: at + len <= parent.len, so the pointer stays inside the allocation.
        let p = unsafe { parent.ptr.as_ptr().add(at) };
        Some(IoBuf {
            ptr: NonNull::new(p)?,
            cap: len,
            len,
            owned: false,
        })
    }
    /// True for a buffer that owns its memory (not a view).
    pub fn is_owned(&self) -> bool {
        self.owned
    }
    pub fn capacity(&self) -> usize {
        self.cap
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Sets the length; it never exceeds the capacity.
    pub fn set_len(&mut self, len: usize) {
        self.len = len.min(self.cap);
    }
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }
}

impl std::ops::Deref for IoBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for cap >= len initialised bytes, owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for IoBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for IoBuf {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        // SAFETY: allocated in `new` with exactly this size and alignment.
        unsafe {
            dealloc(
                self.ptr.as_ptr(),
                Layout::from_size_align_unchecked(self.cap, IO_BUF_ALIGN),
            )
        }
    }
}

impl std::fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IoBuf(len {}, cap {})", self.len, self.cap)
    }
}

/// A per-reactor free list of buffers in power-of-two size classes from 4 KiB.
/// Bounded: each class keeps at most `max_per_class` idle buffers or as many as
/// fit in `CLASS_BYTES`, whichever is more, so a deep queue of small I/O keeps
/// all its buffers warm without large classes hoarding memory.
pub struct BufPool {
    classes: Vec<Vec<IoBuf>>,
    max_per_class: usize,
}

/// Idle bytes a size class may keep beyond `max_per_class` buffers.
const CLASS_BYTES: usize = 16 << 20;

impl BufPool {
    pub fn new(max_per_class: usize) -> BufPool {
        BufPool {
            classes: (0..16).map(|_| Vec::new()).collect(),
            max_per_class,
        }
    }
    fn class_of(cap: usize) -> usize {
        let pages = cap.max(IO_BUF_ALIGN).div_ceil(IO_BUF_ALIGN);
        pages.next_power_of_two().trailing_zeros() as usize
    }
    /// A buffer of at least `len` bytes with length set to `len`. Contents are
    /// whatever the previous user left: callers overwrite before exposing them.
    pub fn get(&mut self, len: usize) -> IoBuf {
        let class = Self::class_of(len);
        let mut buf = match self.classes.get_mut(class).and_then(|c| c.pop()) {
            Some(b) => b,
            None => IoBuf::new(IO_BUF_ALIGN << class),
        };
        buf.set_len(len);
        buf
    }
    pub fn put(&mut self, buf: IoBuf) {
        let class = Self::class_of(buf.capacity());
        if !buf.owned || buf.capacity() != IO_BUF_ALIGN << class {
            return;
        }
        let limit = self
            .max_per_class
            .max(CLASS_BYTES / (IO_BUF_ALIGN << class));
        if let Some(c) = self.classes.get_mut(class) {
            if c.len() < limit {
                c.push(buf);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_and_recycled() {
        let mut pool = BufPool::new(4);
        let mut b = pool.get(5000);
        assert_eq!(b.len(), 5000);
        assert_eq!(b.capacity(), 8192);
        assert_eq!(b.as_ptr() as usize % IO_BUF_ALIGN, 0);
        b[4999] = 7;
        let p = b.as_ptr();
        pool.put(b);
        let b2 = pool.get(8000);
        assert_eq!(b2.as_ptr(), p);
        assert_eq!(b2.len(), 8000);
    }

    #[test]
    fn small_classes_keep_a_deep_queue_warm_and_large_ones_stay_bounded() {
        let mut pool = BufPool::new(4);
        let small: Vec<IoBuf> = (0..512).map(|_| pool.get(4096)).collect();
        let ptrs: std::collections::HashSet<usize> =
            small.iter().map(|b| b.as_ptr() as usize).collect();
        small.into_iter().for_each(|b| pool.put(b));
        // All 512 come back from the pool (16 MiB budget), none newly allocated.
        let again: Vec<IoBuf> = (0..512).map(|_| pool.get(4096)).collect();
        assert!(again.iter().all(|b| ptrs.contains(&(b.as_ptr() as usize))));
        // 4 MiB buffers: only max(4, 16 MiB / 4 MiB) = 4 are kept.
        let big: Vec<IoBuf> = (0..8).map(|_| pool.get(4 << 20)).collect();
        big.into_iter().for_each(|b| pool.put(b));
        assert_eq!(pool.classes[BufPool::class_of(4 << 20)].len(), 4);
    }

    #[test]
    fn views_alias_the_parent_and_are_never_pooled() {
        let mut parent = IoBuf::new(8192);
        // SAFETY: parent outlives the views below and they do not overlap.
        let (mut a, mut b) = unsafe {
            (
                IoBuf::view(&mut parent, 0, 4096).unwrap(),
                IoBuf::view(&mut parent, 4096, 4096).unwrap(),
            )
        };
        a[0] = 1;
        b[4095] = 2;
        assert!(!a.is_owned());
        let mut pool = BufPool::new(4);
        pool.put(a);
        pool.put(b);
        assert_eq!(parent[0], 1);
        assert_eq!(parent[8191], 2);
        // SAFETY: out of range, returns None without touching memory.
        assert!(unsafe { IoBuf::view(&mut parent, 4096, 8192) }.is_none());
        let fresh = pool.get(4096);
        assert_ne!(fresh.as_ptr(), parent.as_ptr());
    }
}
