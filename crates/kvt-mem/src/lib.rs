//! I/O buffers: page-aligned memory that O_DIRECT, io_uring and PCIe DMA can use,
//! recycled through a per-reactor pool so the data path does not allocate.
//!
//! Ownership of the memory: every `IoBuf` is carved from one process-wide DMA arena
//! (`dma`), a virtual range reserved once and filled in 2 MiB chunks (hugepages where
//! the system has them, ordinary anonymous memory otherwise). Chunks are never
//! returned to the OS, so a chunk an IOMMU maps stays valid for the process lifetime
//! and no freed-and-reused range can leave a stale mapping. An `IoBuf` owns its block
//! until dropped, when the block goes back to the arena's free lists.
//!
//! `stats` beside it: the latency histogram buckets of queue pairs and volume
//! channels. A leaf of the workspace, as kvt-wire is.

pub mod stats;

use std::ptr::NonNull;

/// Alignment of every I/O buffer: a page, which satisfies O_DIRECT on any device
/// with logical blocks up to 4 KiB and NVMe PRP rules.
pub const IO_BUF_ALIGN: usize = 4096;

/// `madvise` advice that faults a range in as if written (Linux 5.14; not in
/// the libc crate yet). Same value on every architecture.
const MADV_POPULATE_WRITE: libc::c_int = 23;

/// Copies `src` to `dst` with non-temporal (streaming) stores where it can,
/// then fences, so the copy is visible to other threads before the caller
/// publishes it. For data written now and read much later (a RAM namespace
/// receiving a long write): ordinary stores first read every destination line
/// into the cache (a copy into memory not in cache ran at 6.6 GB/s here
/// against 10.3 GB/s streamed, 32 KiB pieces into 1 GiB) and evict the
/// reactor's hot buffers to make room.
///
/// # Safety
/// `dst..dst+src.len()` is valid for writes and does not overlap `src` (the
/// same contract as `copy_nonoverlapping`).
pub unsafe fn copy_streaming(dst: *mut u8, src: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the caller's contract, passed on.
        unsafe { copy_streaming_x86(dst, src) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        // SAFETY: the caller's contract: valid, not overlapping.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) }
    }
}

/// SSE2 (every x86-64): ordinary stores up to the first 16-byte aligned
/// destination byte and for a tail under 64 bytes, streamed 64 at a time
/// in between.
#[cfg(target_arch = "x86_64")]
unsafe fn copy_streaming_x86(dst: *mut u8, src: &[u8]) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    let len = src.len();
    let head = dst.align_offset(16).min(len);
    let body = (len - head) & !63;
    let s = src.as_ptr();
    // SAFETY: head <= len: inside both ranges (the caller's contract).
    unsafe { std::ptr::copy_nonoverlapping(s, dst, head) };
    let mut i = head;
    while i < head + body {
        // SAFETY: i + 64 <= len; dst + i is 16-byte aligned (head aligned
        // it, i advances by 64); the loads are unaligned ones.
        unsafe {
            let v0 = _mm_loadu_si128(s.add(i) as *const __m128i);
            let v1 = _mm_loadu_si128(s.add(i + 16) as *const __m128i);
            let v2 = _mm_loadu_si128(s.add(i + 32) as *const __m128i);
            let v3 = _mm_loadu_si128(s.add(i + 48) as *const __m128i);
            _mm_stream_si128(dst.add(i) as *mut __m128i, v0);
            _mm_stream_si128(dst.add(i + 16) as *mut __m128i, v1);
            _mm_stream_si128(dst.add(i + 32) as *mut __m128i, v2);
            _mm_stream_si128(dst.add(i + 48) as *mut __m128i, v3);
        }
        i += 64;
    }
    // SAFETY: the tail lies inside both ranges; the fence orders the streamed
    // stores before whatever the caller stores next (the completion).
    unsafe {
        std::ptr::copy_nonoverlapping(s.add(i), dst.add(i), len - i);
        _mm_sfence();
    }
}

/// Faults in `len` bytes at `p` for writing, on the calling thread, so that no
/// reactor takes those page faults later on its I/O path.
///
/// # Safety
/// `p..p+len` is a private anonymous mapping (or hugetlb) the caller owns and
/// that nothing reads or writes yet: the fallback stores a zero into one byte
/// of every page.
pub unsafe fn fault_in(p: *mut u8, len: usize) {
    // SAFETY: the caller owns the range; the advice only faults pages in.
    let r = unsafe { libc::madvise(p as *mut libc::c_void, len, MADV_POPULATE_WRITE) };
    if r == 0 {
        return;
    }
    // Older kernels: touch one byte of every page. A write, so each page gets
    // its own frame now (a read maps the shared zero page and leaves the
    // copy-on-write fault for the first writer).
    for off in (0..len).step_by(IO_BUF_ALIGN) {
        // SAFETY: off < len, inside the caller's fresh mapping.
        unsafe { std::ptr::write_volatile(p.add(off), 0) };
    }
}

/// A zeroed `Vec<u8>` of `len` bytes with every page already written: a
/// queue's receive or send buffer made at queue creation, so the reactor that
/// serves the queue takes no page fault the first time a burst reaches deep
/// into it (`vec![0; n]` of a large `n` is fresh zero pages from the kernel).
pub fn prefaulted_vec(len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    for off in (0..len).step_by(IO_BUF_ALIGN) {
        // SAFETY: off < len; a volatile store the compiler cannot drop as a
        // redundant write of zero into zeroed memory.
        unsafe { std::ptr::write_volatile(v.as_mut_ptr().add(off), 0) };
    }
    v
}

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
        let ptr = dma::alloc_zeroed(cap);
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
    // The accessors are #[inline]: every command calls them from other crates
    // (the core, the transports, the devices), which cannot inline a function
    // of this one otherwise.

    /// True for a buffer that owns its memory (not a view).
    #[inline]
    pub fn is_owned(&self) -> bool {
        self.owned
    }
    #[inline]
    pub fn capacity(&self) -> usize {
        self.cap
    }
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Sets the length; it never exceeds the capacity.
    #[inline]
    pub fn set_len(&mut self, len: usize) {
        self.len = len.min(self.cap);
    }
    #[inline]
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    #[inline]
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }
}

impl std::ops::Deref for IoBuf {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for cap >= len initialised bytes, owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for IoBuf {
    #[inline]
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
        dma::free(self.ptr, self.cap);
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

/// The process-wide DMA arena behind every `IoBuf`, and the hook an IOMMU user (the
/// `nvme` backend's VFIO container) registers to map each chunk exactly once.
///
/// IOVAs are linear in the arena: `iova = DMA_IOVA_BASE + (vaddr - arena base)`, so
/// translating a buffer on the data path is arithmetic, any buffer (and any view of
/// one) is contiguous in IOVA space as it is in virtual memory, and IOVAs stay below
/// 2^39 (the default address width of QEMU's emulated VT-d).
pub mod dma {
    use std::ptr::NonNull;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use std::sync::Mutex;

    /// Arena growth unit and largest pooled block: one x86-64 hugepage.
    pub const CHUNK_BYTES: usize = 2 << 20;
    /// Virtual space reserved for the arena (reserved, not committed).
    const RESERVE_BYTES: usize = 64 << 30;
    /// Smaller reservation for processes with a limited address space (ulimit -v).
    const RESERVE_FALLBACK_BYTES: usize = 4 << 30;
    /// First IOVA: above the 32-bit MMIO/MSI holes, far below 2^39.
    pub const DMA_IOVA_BASE: u64 = 1 << 32;
    /// Chunks the arena can ever hold: a table indexed by chunk has this many entries.
    pub const MAX_CHUNKS: usize = RESERVE_BYTES / CHUNK_BYTES;
    /// Size classes 4 KiB << c for c in 0..CLASSES (4 KiB .. 2 MiB).
    const CLASSES: usize = 10;
    const PAGE: usize = super::IO_BUF_ALIGN;

    /// One mapped range of the arena, as handed to a mapper.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct DmaRange {
        pub vaddr: usize,
        pub iova: u64,
        pub len: usize,
    }

    /// What can go wrong mapping the arena for a device.
    #[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
    pub enum DmaError {
        #[error("cannot reserve address space for the DMA arena")]
        NoAddressSpace,
        /// A mapper's call (an IOMMU ioctl, `spdk_mem_register`) failed with `errno`.
        #[error("{call}: {}", std::io::Error::from_raw_os_error(*.errno))]
        Map { call: &'static str, errno: i32 },
    }

    type Mapper = Box<dyn FnMut(&DmaRange) -> Result<(), DmaError> + Send>;

    struct Arena {
        base: usize,
        reserved: usize,
        chunks: usize,
        hugepages: bool,
        /// Free blocks per class: (offset from base, known to be all zeros).
        free: Vec<Vec<(usize, bool)>>,
        /// Free multi-chunk blocks: (offset, chunks).
        large_free: Vec<(usize, usize)>,
        mappers: Vec<(u64, Mapper)>,
        next_mapper: u64,
    }

    static ARENA: Mutex<Option<Arena>> = Mutex::new(None);
    /// Arena base and length, readable without the lock for translation.
    static BASE: AtomicUsize = AtomicUsize::new(0);
    static MAPPED_LEN: AtomicUsize = AtomicUsize::new(0);
    /// One bit per chunk whose mapping failed in some mapper: never handed to DMA.
    static UNMAPPED: [AtomicU64; MAX_CHUNKS / 64] = [const { AtomicU64::new(0) }; MAX_CHUNKS / 64];

    fn lock() -> std::sync::MutexGuard<'static, Option<Arena>> {
        // A panic while holding the lock left the free lists consistent (every
        // mutation is a push/pop), so a poisoned lock is still usable.
        ARENA.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn reserve() -> Option<(usize, usize)> {
        for want in [RESERVE_BYTES, RESERVE_FALLBACK_BYTES] {
            // SAFETY: a fresh PROT_NONE anonymous reservation; nothing aliases it.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    want + CHUNK_BYTES,
                    libc::PROT_NONE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                // Chunk-aligned base, so hugepages can back every chunk.
                let base = (p as usize).div_ceil(CHUNK_BYTES) * CHUNK_BYTES;
                return Some((base, want));
            }
        }
        None
    }

    impl Arena {
        fn new() -> Option<Arena> {
            let (base, reserved) = reserve()?;
            BASE.store(base, Ordering::Release);
            Some(Arena {
                base,
                reserved,
                chunks: 0,
                hugepages: std::env::var_os("KVTARGET_NO_HUGEPAGES").is_none(),
                free: (0..CLASSES).map(|_| Vec::new()).collect(),
                large_free: Vec::new(),
                mappers: Vec::new(),
                next_mapper: 1,
            })
        }

        /// Commits `n` more chunks; returns the offset of the first.
        fn grow(&mut self, n: usize) -> Option<usize> {
            let off = self.chunks * CHUNK_BYTES;
            let len = n * CHUNK_BYTES;
            if off + len > self.reserved {
                return None;
            }
            let addr = (self.base + off) as *mut libc::c_void;
            if !self.map_chunks(addr, len)? {
                // Someone else's memory may sit in the range now: skip it for
                // good (never handed out, never translated) and grow past it.
                self.chunks += n;
                MAPPED_LEN.store(self.chunks * CHUNK_BYTES, Ordering::Release);
                mark_unmapped(off, len);
                return self.grow(n);
            }
            // Resident now, on the thread that grows the arena (at start, see
            // `commit_at_least`), not at some reactor's first write into it.
            // SAFETY: the range was just mapped and is not handed out yet.
            unsafe { super::fault_in(addr as *mut u8, len) };
            self.chunks += n;
            MAPPED_LEN.store(self.chunks * CHUNK_BYTES, Ordering::Release);
            let range = DmaRange {
                vaddr: self.base + off,
                iova: DMA_IOVA_BASE + off as u64,
                len,
            };
            let mut failed = false;
            for (id, m) in &mut self.mappers {
                if let Err(e) = m(&range) {
                    tracing::error!(mapper = *id, "cannot map DMA memory {range:?}: {e}");
                    failed = true;
                }
            }
            if failed {
                mark_unmapped(off, len);
            }
            Some(off)
        }

        /// Backs `[addr, addr + len)` of the reservation with memory: hugepages
        /// while the system has them, ordinary pages otherwise. `Some(false)`:
        /// the range left the reservation and must never be used; `None`: out
        /// of memory.
        fn map_chunks(&mut self, addr: *mut libc::c_void, len: usize) -> Option<bool> {
            let mut reserved = true;
            if self.hugepages {
                match map_hugetlb(addr, len) {
                    Hugetlb::Mapped => return Some(true),
                    Hugetlb::Unavailable => {}
                    Hugetlb::Lost => reserved = false,
                }
                tracing::debug!("no 2 MiB hugepages for the DMA arena; using 4 KiB pages");
                self.hugepages = false;
            }
            if !map_plain(addr, len, reserved) {
                tracing::error!("cannot map {len} bytes of DMA memory at {addr:?}");
                return if reserved { None } else { Some(false) };
            }
            // SAFETY: advisory only, on memory we own.
            unsafe { libc::madvise(addr, len, libc::MADV_HUGEPAGE) };
            Some(true)
        }

        fn alloc(&mut self, cap: usize) -> Option<(usize, bool)> {
            if cap > CHUNK_BYTES {
                let n = cap.div_ceil(CHUNK_BYTES);
                if let Some(i) = self.large_free.iter().position(|&(_, c)| c == n) {
                    let (off, _) = self.large_free.swap_remove(i);
                    return Some((off, false));
                }
                return Some((self.grow(n)?, true));
            }
            let class = class_of(cap);
            self.alloc_class(class)
        }

        fn alloc_class(&mut self, class: usize) -> Option<(usize, bool)> {
            if let Some(b) = self.free[class].pop() {
                return Some(b);
            }
            // Split a block of the next class (or a fresh chunk) in two.
            let (off, clean) = if class + 1 < CLASSES {
                self.alloc_class(class + 1)?
            } else {
                (self.grow(1)?, true)
            };
            if class + 1 < CLASSES {
                self.free[class].push((off + (PAGE << class), clean));
            }
            Some((off, clean))
        }

        fn free(&mut self, off: usize, cap: usize) {
            if cap > CHUNK_BYTES {
                self.large_free.push((off, cap.div_ceil(CHUNK_BYTES)));
            } else {
                self.free[class_of(cap)].push((off, false));
            }
        }
    }

    /// What became of a range of the reservation offered to hugetlb memory.
    #[derive(Debug, PartialEq, Eq)]
    enum Hugetlb {
        /// Hugepages back the range now.
        Mapped,
        /// Too few free hugepages; the range is still reserved, untouched.
        Unavailable,
        /// The pool ran dry between the probe and the mapping: the range is
        /// unmapped now, and another thread's mapping may already sit in it.
        Lost,
    }

    /// Maps hugepages over `[addr, addr + len)` of the reservation.
    ///
    /// A `MAP_FIXED` mmap that fails (no free hugepages) has already unmapped
    /// its target on Linux, leaving a hole in the reservation. Another thread's
    /// mmap (a RAM namespace, a large `Vec`, a thread stack) can land in that
    /// hole before the fallback maps over it; the fallback then silently takes
    /// that memory, and the other owner's later munmap unmaps arena memory under
    /// live buffers. So hugepages are first probed at an address of the
    /// kernel's choosing, which costs nothing when it fails.
    fn map_hugetlb(addr: *mut libc::c_void, len: usize) -> Hugetlb {
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB;
        // SAFETY: a fresh mapping at an address of the kernel's choosing.
        let probe = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, -1, 0) };
        if probe == libc::MAP_FAILED {
            return Hugetlb::Unavailable;
        }
        // SAFETY: the probe mapped just above, used by nobody.
        unsafe { libc::munmap(probe, len) };
        // SAFETY: [addr, addr+len) lies inside our own reservation, unused.
        let p = unsafe { libc::mmap(addr, len, prot, flags | libc::MAP_FIXED, -1, 0) };
        if p == libc::MAP_FAILED {
            Hugetlb::Lost
        } else {
            Hugetlb::Mapped
        }
    }

    /// Maps ordinary anonymous memory over `[addr, addr + len)`: over the
    /// reservation when the range is still `reserved`, else only into the hole
    /// a failed hugepage mapping left, never over a mapping someone else made
    /// there meanwhile (false then, and the range stays unused).
    fn map_plain(addr: *mut libc::c_void, len: usize, reserved: bool) -> bool {
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        let fixed = if reserved {
            libc::MAP_FIXED
        } else {
            libc::MAP_FIXED_NOREPLACE
        };
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | fixed;
        // SAFETY: inside our reservation; MAP_FIXED only while we still own all
        // of it, MAP_FIXED_NOREPLACE otherwise.
        let p = unsafe { libc::mmap(addr, len, prot, flags, -1, 0) };
        if p != libc::MAP_FAILED && p != addr {
            // A kernel older than 4.17 took MAP_FIXED_NOREPLACE as a hint.
            // SAFETY: the mapping just made elsewhere, used by nobody.
            unsafe { libc::munmap(p, len) };
        }
        p == addr
    }

    fn mark_unmapped(off: usize, len: usize) {
        for c in off / CHUNK_BYTES..(off + len).div_ceil(CHUNK_BYTES) {
            UNMAPPED[c / 64].fetch_or(1 << (c % 64), Ordering::Release);
        }
    }

    fn class_of(cap: usize) -> usize {
        cap.div_ceil(PAGE).next_power_of_two().trailing_zeros() as usize
    }

    /// Block size actually backing a buffer of `cap` bytes.
    pub fn block_bytes(cap: usize) -> usize {
        if cap > CHUNK_BYTES {
            cap.div_ceil(CHUNK_BYTES) * CHUNK_BYTES
        } else {
            PAGE << class_of(cap)
        }
    }

    /// Zeroed, page-aligned memory for `cap` bytes (a multiple of the page size).
    pub(super) fn alloc_zeroed(cap: usize) -> NonNull<u8> {
        let layout = std::alloc::Layout::from_size_align(cap, PAGE)
            .unwrap_or(std::alloc::Layout::new::<u8>());
        let mut g = lock();
        if g.is_none() {
            *g = Arena::new();
        }
        let Some(arena) = g.as_mut() else {
            std::alloc::handle_alloc_error(layout)
        };
        let Some((off, clean)) = arena.alloc(cap) else {
            std::alloc::handle_alloc_error(layout)
        };
        let base = arena.base;
        drop(g);
        let p = (base + off) as *mut u8;
        if !clean {
            // SAFETY: the block [p, p + block) is ours alone until freed.
            unsafe { std::ptr::write_bytes(p, 0, block_bytes(cap)) };
        }
        match NonNull::new(p) {
            Some(p) => p,
            None => std::alloc::handle_alloc_error(layout),
        }
    }

    /// Commits (and faults in) arena chunks until at least `bytes` are
    /// committed, as free 2 MiB blocks: called before reactors serve, so the
    /// buffers of their first commands come from resident memory and do not
    /// grow the arena (an mmap, page faults, an RDMA registration) on a reactor.
    pub fn commit_at_least(bytes: usize) {
        let mut g = lock();
        if g.is_none() {
            *g = Arena::new();
        }
        let Some(arena) = g.as_mut() else { return };
        while arena.chunks * CHUNK_BYTES < bytes {
            // One chunk per range: no block may span two mapper ranges.
            let Some(off) = arena.grow(1) else { return };
            arena.free[CLASSES - 1].push((off, true));
        }
    }

    /// Bytes of the arena committed so far.
    pub fn committed_bytes() -> usize {
        MAPPED_LEN.load(Ordering::Acquire)
    }

    /// Returns a block from `alloc_zeroed(cap)`.
    pub(super) fn free(p: NonNull<u8>, cap: usize) {
        let mut g = lock();
        if let Some(arena) = g.as_mut() {
            let off = p.as_ptr() as usize - arena.base;
            arena.free(off, cap);
        }
    }

    /// The IOVA of `len` bytes at `ptr`, if they lie in arena memory every
    /// registered mapper has mapped.
    pub fn iova(ptr: *const u8, len: usize) -> Option<u64> {
        let base = BASE.load(Ordering::Acquire);
        let off = (ptr as usize).checked_sub(base)?;
        let end = off.checked_add(len)?;
        if base == 0 || end > MAPPED_LEN.load(Ordering::Acquire) {
            return None;
        }
        let last = end.saturating_sub(1).max(off) / CHUNK_BYTES;
        for c in off / CHUNK_BYTES..=last {
            if UNMAPPED[c / 64].load(Ordering::Acquire) & (1 << (c % 64)) != 0 {
                return None;
            }
        }
        Some(DMA_IOVA_BASE + off as u64)
    }

    /// The chunk indices of the first and last byte of `len` bytes at `ptr`, if
    /// they lie in committed arena memory (for per-chunk tables such as RDMA
    /// memory keys).
    pub fn chunk_span(ptr: *const u8, len: usize) -> Option<(usize, usize)> {
        let base = BASE.load(Ordering::Acquire);
        let off = (ptr as usize).checked_sub(base)?;
        let end = off.checked_add(len.max(1))?;
        if base == 0 || end > MAPPED_LEN.load(Ordering::Acquire) {
            return None;
        }
        Some((off / CHUNK_BYTES, (end - 1) / CHUNK_BYTES))
    }

    /// The chunk indices a mapped range covers (first, one past the last).
    pub fn range_chunks(r: &DmaRange) -> (usize, usize) {
        let off = r.iova.saturating_sub(DMA_IOVA_BASE) as usize;
        (off / CHUNK_BYTES, (off + r.len).div_ceil(CHUNK_BYTES))
    }

    /// Identifies a registered mapper.
    #[derive(Debug, PartialEq, Eq)]
    pub struct MapperId(u64);

    /// Registers `map`, calls it for every chunk committed so far and, from now on,
    /// for every new chunk before any of its memory is handed out. Fails (and stays
    /// unregistered) if mapping the existing chunks fails.
    pub fn register_mapper(
        mut map: impl FnMut(&DmaRange) -> Result<(), DmaError> + Send + 'static,
    ) -> Result<MapperId, DmaError> {
        let mut g = lock();
        if g.is_none() {
            *g = Arena::new();
        }
        let arena = g.as_mut().ok_or(DmaError::NoAddressSpace)?;
        if arena.chunks > 0 {
            map(&DmaRange {
                vaddr: arena.base,
                iova: DMA_IOVA_BASE,
                len: arena.chunks * CHUNK_BYTES,
            })?;
        }
        let id = arena.next_mapper;
        arena.next_mapper += 1;
        arena.mappers.push((id, Box::new(map)));
        Ok(MapperId(id))
    }

    /// Stops calling a mapper (its container is going away with its mappings).
    pub fn unregister_mapper(id: MapperId) {
        if let Some(arena) = lock().as_mut() {
            arena.mappers.retain(|(i, _)| *i != id.0);
        }
    }

    /// Whether the arena got hugepages (for logs).
    pub fn uses_hugepages() -> bool {
        lock().as_ref().is_some_and(|a| a.hugepages && a.chunks > 0)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// A chunk-aligned PROT_NONE range of `len` bytes, like the arena's.
        fn reserve_aligned(len: usize) -> *mut libc::c_void {
            // SAFETY: a fresh reservation at an address of the kernel's choosing.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len + CHUNK_BYTES,
                    libc::PROT_NONE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            ((p as usize).div_ceil(CHUNK_BYTES) * CHUNK_BYTES) as *mut libc::c_void
        }

        /// Whether every page of the range is mapped (reserved counts).
        fn all_mapped(addr: *mut libc::c_void, len: usize) -> bool {
            let mut pages = vec![0u8; len / PAGE];
            // SAFETY: `pages` has one byte per page of the range.
            unsafe { libc::mincore(addr, len, pages.as_mut_ptr()) == 0 }
        }

        fn free_hugepages() -> usize {
            let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
            meminfo
                .lines()
                .find_map(|l| l.strip_prefix("HugePages_Free:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        }

        #[test]
        fn too_few_hugepages_leave_the_reservation_whole() {
            // One chunk more than the system has free, so the attempt fails.
            let len = (free_hugepages() + 1) * CHUNK_BYTES;
            let addr = reserve_aligned(len);
            assert!(all_mapped(addr, len));
            let outcome = map_hugetlb(addr, len);
            // A hole here is where another thread's mmap lands and is then
            // mapped over by the fallback (the arena use-after-munmap segfault).
            assert!(
                all_mapped(addr, len),
                "failed hugepage attempt unmapped the reservation"
            );
            assert_eq!(outcome, Hugetlb::Unavailable);
            assert!(map_plain(addr, len, true));
            // SAFETY: the test's own mapping.
            unsafe { libc::munmap(addr, len) };
        }

        #[test]
        fn the_fallback_never_maps_over_a_mapping_in_the_hole() {
            let len = 2 * CHUNK_BYTES;
            let addr = reserve_aligned(len);
            // SAFETY: the test's own reservation becomes a hole...
            unsafe { libc::munmap(addr, len) };
            let other = (addr as usize + CHUNK_BYTES) as *mut libc::c_void;
            // ...and another owner's page lands in it.
            // SAFETY: inside the hole just made; NOREPLACE maps over nothing.
            let p = unsafe {
                libc::mmap(
                    other,
                    PAGE,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                    -1,
                    0,
                )
            };
            assert_eq!(p, other);
            // SAFETY: the page just mapped.
            unsafe { *(other as *mut u8) = 0x5a };
            assert!(!map_plain(addr, len, false));
            // SAFETY: still the other owner's page, mapped and intact.
            assert_eq!(unsafe { *(other as *const u8) }, 0x5a);
            // SAFETY: the test's own page.
            unsafe { libc::munmap(other, PAGE) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The streamed copy writes exactly `src` at any alignment and length
        /// (head, streamed body and tail), and nothing around it.
        #[test]
        fn a_streaming_copy_is_a_copy(
            dst_at in 0usize..80,
            src_at in 0usize..80,
            len in 0usize..1200,
            seed in proptest::prelude::any::<u8>(),
        ) {
            let src: Vec<u8> = (0..src_at + len).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect();
            let mut dst = vec![0xA5u8; dst_at + len + 64];
            // SAFETY: dst has room for len bytes at dst_at; the vectors differ.
            unsafe { copy_streaming(dst.as_mut_ptr().add(dst_at), &src[src_at..]) };
            proptest::prop_assert!(dst[..dst_at].iter().all(|&b| b == 0xA5));
            proptest::prop_assert_eq!(&dst[dst_at..dst_at + len], &src[src_at..]);
            proptest::prop_assert!(dst[dst_at + len..].iter().all(|&b| b == 0xA5));
        }
    }

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

    #[test]
    fn arena_buffers_translate_linearly_and_come_back_zeroed() {
        let mut a = IoBuf::new(3 * 4096);
        assert_eq!(dma::block_bytes(a.capacity()), 4 * 4096);
        a.fill(0xa5);
        let ia = dma::iova(a.as_ptr(), a.len()).expect("arena memory has an IOVA");
        // SAFETY: `a` outlives the view.
        let v = unsafe { IoBuf::view(&mut a, 4096 + 512, 512) }.unwrap();
        assert_eq!(dma::iova(v.as_ptr(), v.len()), Some(ia + 4096 + 512));
        drop(v);
        let p = a.as_ptr();
        drop(a);
        // Freed blocks are reused (LIFO per class) and zeroed again.
        let b = IoBuf::new(4 * 4096);
        if b.as_ptr() == p {
            assert!(b.iter().all(|&x| x == 0));
        }
        let big = IoBuf::new(5 << 20);
        assert!(big.iter().all(|&x| x == 0));
        assert!(dma::iova(big.as_ptr(), big.len()).is_some());
        let on_heap = Box::new([0u8; 64]);
        assert_eq!(dma::iova(on_heap.as_ptr(), 64), None);
    }

    /// A mapper that only records the ranges it is given.
    fn recording_mapper() -> (
        dma::MapperId,
        std::sync::Arc<std::sync::Mutex<Vec<dma::DmaRange>>>,
    ) {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let s2 = seen.clone();
        let id = dma::register_mapper(move |r| {
            s2.lock().unwrap().push(*r);
            Ok(())
        })
        .unwrap();
        (id, seen)
    }

    #[test]
    fn mapper_sees_existing_and_new_chunks() {
        let _keep = IoBuf::new(4096);
        let (id, seen) = recording_mapper();
        let first = seen.lock().unwrap().clone();
        assert_eq!(first.len(), 1, "existing chunks come in one range");
        assert_eq!(first[0].iova, dma::DMA_IOVA_BASE);
        // A fresh multi-chunk block forces growth, which the mapper must see.
        let big = IoBuf::new(7 * dma::CHUNK_BYTES);
        let i = dma::iova(big.as_ptr(), big.len()).unwrap();
        let covered = seen
            .lock()
            .unwrap()
            .iter()
            .any(|r| r.iova <= i && i + big.len() as u64 <= r.iova + r.len as u64);
        dma::unregister_mapper(id);
        assert!(covered);
    }

    #[test]
    fn every_buffer_lies_inside_one_range_a_mapper_was_given() {
        // RDMA registers each range as one MR and an SGE must lie in one MR:
        // no buffer may straddle two ranges of one mapper.
        let early: Vec<IoBuf> = [4096, 1 << 20, 3 << 20].map(IoBuf::new).into();
        let (id, seen) = recording_mapper();
        let mut late: Vec<IoBuf> = Vec::new();
        for round in 0..3 {
            for len in [4096, 64 << 10, 2 << 20, 5 << 20, 9 << 20] {
                late.push(IoBuf::new(len + round * 4096));
            }
            // Freed multi-chunk blocks are reused by later rounds.
            late.truncate(late.len() - 2);
        }
        let ranges = seen.lock().unwrap().clone();
        dma::unregister_mapper(id);
        for b in early.iter().chain(late.iter()) {
            let (f, l) = dma::chunk_span(b.as_ptr(), b.len()).unwrap();
            let inside = ranges.iter().any(|r| {
                let (rf, re) = dma::range_chunks(r);
                rf <= f && l < re
            });
            assert!(inside, "{b:?} at chunks {f}..={l} straddles mapper ranges");
        }
    }
}
