//! io_uring backend over a regular file or a block device.
//!
//! Opened with O_DIRECT where the file system allows it (tmpfs does not; then the
//! page cache is used and Flush really matters). Each reactor gets its own ring.
//! Deallocate punches a hole, Write Zeroes zeroes the range in place; where the file
//! system lacks those fallocate modes the range is overwritten with zeros instead.

use super::{BlockDevice, IoChannel, IoCompletion, IoOp};
use io_uring::{opcode, types, IoUring};
use kvt_mem::IoBuf;
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// Ring size per reactor: room for a full queue pair's worth of commands plus the
/// extra writes a zero-fill fallback can need.
const RING_ENTRIES: u32 = 1024;
/// Size of the shared zero buffer used by the zero-fill fallback.
const ZERO_CHUNK: usize = 1 << 20;

pub struct UringDevice {
    path: PathBuf,
    file: Arc<File>,
    size: u64,
    direct: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: existing size {existing} bytes is larger than the configured {wanted} bytes (refusing to hide data; raise `size` or use another file)")]
    Shrink {
        path: String,
        existing: u64,
        wanted: u64,
    },
    #[error("{path}: size is not set and the file does not exist")]
    NoSize { path: String },
}

impl UringDevice {
    /// Opens (creating a sparse file if needed) `path`. `size` is required for a new
    /// file; an existing file is grown to `size` but never shrunk.
    pub fn open(path: &Path, size: Option<u64>, block_size: u32) -> Result<Arc<Self>, OpenError> {
        let p = path.display().to_string();
        let io = |source| OpenError::Io {
            path: p.clone(),
            source,
        };
        let exists = path.exists();
        if !exists {
            if size.is_none() {
                return Err(OpenError::NoSize { path: p });
            }
            if let Some(dir) = path.parent() {
                if !dir.as_os_str().is_empty() {
                    std::fs::create_dir_all(dir).map_err(io)?;
                }
            }
        }
        let (mut file, direct) = Self::open_file(path, !exists, block_size).map_err(io)?;
        let is_blk = file.metadata().map_err(io)?.file_type().is_block_device();
        let existing = file.seek(SeekFrom::End(0)).map_err(io)?;
        let size = match size {
            None => existing,
            Some(want) if is_blk => want.min(existing),
            Some(want) if want < existing => {
                return Err(OpenError::Shrink {
                    path: p,
                    existing,
                    wanted: want,
                })
            }
            Some(want) => {
                if want > existing {
                    file.set_len(want).map_err(io)?;
                }
                want
            }
        };
        Ok(Arc::new(UringDevice {
            path: path.to_path_buf(),
            file: Arc::new(file),
            size,
            direct,
        }))
    }

    fn open_file(path: &Path, create: bool, block_size: u32) -> std::io::Result<(File, bool)> {
        let mut o = OpenOptions::new();
        o.read(true).write(true).create(create);
        if let Ok(f) = o.clone().custom_flags(libc::O_DIRECT).open(path) {
            // Probe: some file systems accept O_DIRECT at open but need a larger
            // alignment than our block size.
            if Self::direct_read_works(&f, block_size) {
                return Ok((f, true));
            }
        }
        tracing::info!(path = %path.display(), "O_DIRECT unavailable; using the page cache");
        Ok((o.open(path)?, false))
    }

    fn direct_read_works(f: &File, block_size: u32) -> bool {
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        if len < block_size as u64 {
            // Nothing to read yet: trust the open, block size is at least 512.
            return true;
        }
        let mut buf = IoBuf::new(block_size as usize);
        buf.set_len(block_size as usize);
        // SAFETY: buf is valid for block_size bytes and outlives the call.
        let n = unsafe {
            libc::pread(
                f.as_raw_fd(),
                buf.as_mut_ptr() as *mut libc::c_void,
                block_size as usize,
                0,
            )
        };
        n == block_size as isize
    }

    pub fn is_direct(&self) -> bool {
        self.direct
    }
}

impl BlockDevice for UringDevice {
    fn describe(&self) -> String {
        format!(
            "uring:{}{}",
            self.path.display(),
            if self.direct { " (O_DIRECT)" } else { "" }
        )
    }
    fn size_bytes(&self) -> u64 {
        self.size
    }
    fn open_channel(&self) -> std::io::Result<Box<dyn IoChannel>> {
        Ok(Box::new(UringChannel::new(self.file.clone(), self.size)?))
    }
    fn sync(&self) -> std::io::Result<()> {
        self.file.sync_data()
    }
    fn volatile(&self) -> bool {
        false
    }
}

/// What an in-flight ring entry belongs to.
struct InFlight {
    tag: u64,
    buf: Option<IoBuf>,
    /// Ring entries still outstanding for this operation (zero-fill uses several).
    parts: u32,
    result: Result<(), i32>,
    /// Set for fallocate-based ops so an EOPNOTSUPP can fall back to zero-fill.
    fallback: Option<(u64, u64)>,
    expected: usize,
}

pub struct UringChannel {
    ring: IoUring,
    file: Arc<File>,
    size: u64,
    slots: Vec<Option<InFlight>>,
    free: Vec<usize>,
    zeros: Option<IoBuf>,
    unsubmitted: usize,
    ready: Vec<IoCompletion>,
    in_flight: usize,
}

const FALLOC_FL_KEEP_SIZE: i32 = 0x01;
const FALLOC_FL_PUNCH_HOLE: i32 = 0x02;
const FALLOC_FL_ZERO_RANGE: i32 = 0x10;

impl UringChannel {
    fn new(file: Arc<File>, size: u64) -> std::io::Result<UringChannel> {
        Ok(UringChannel {
            ring: IoUring::new(RING_ENTRIES)?,
            file,
            size,
            slots: Vec::new(),
            free: Vec::new(),
            zeros: None,
            unsubmitted: 0,
            ready: Vec::new(),
            in_flight: 0,
        })
    }

    fn alloc_slot(&mut self, f: InFlight) -> usize {
        match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(f);
                i
            }
            None => {
                self.slots.push(Some(f));
                self.slots.len() - 1
            }
        }
    }

    fn push(&mut self, entry: io_uring::squeue::Entry) -> Result<(), i32> {
        // SAFETY: every entry points at memory owned by an `InFlight` slot (buffers)
        // or by this channel (the zero buffer), which lives until its completion is
        // reaped in `poll`; the fd is kept open by `self.file`.
        if unsafe { self.ring.submission().push(&entry) }.is_err() {
            self.flush_submissions();
            // SAFETY: as above.
            unsafe { self.ring.submission().push(&entry) }.map_err(|_| libc::EAGAIN)?;
        }
        self.unsubmitted += 1;
        Ok(())
    }

    fn in_range(&self, offset: u64, len: u64) -> bool {
        offset.checked_add(len).is_some_and(|e| e <= self.size)
    }

    /// Queues writes of zeros over [offset, offset+len) as parts of slot `slot`.
    fn queue_zero_fill(&mut self, slot: usize, offset: u64, len: u64) -> Result<u32, i32> {
        let zeros_ptr = self
            .zeros
            .get_or_insert_with(|| IoBuf::new(ZERO_CHUNK))
            .as_ptr();
        let fd = types::Fd(self.file.as_raw_fd());
        let mut parts = 0;
        let mut off = offset;
        while off < offset + len {
            let n = (offset + len - off).min(ZERO_CHUNK as u64) as u32;
            let e = opcode::Write::new(fd, zeros_ptr, n)
                .offset(off)
                .build()
                .user_data(slot as u64);
            self.push(e)?;
            parts += 1;
            off += n as u64;
        }
        Ok(parts)
    }
}

impl IoChannel for UringChannel {
    fn submit(&mut self, tag: u64, mut op: IoOp, _now: Instant) -> Result<(), (IoOp, i32)> {
        let fd = types::Fd(self.file.as_raw_fd());
        let (offset, len) = match &op {
            IoOp::Read { offset, buf } | IoOp::Write { offset, buf, .. } => {
                (*offset, buf.len() as u64)
            }
            IoOp::WriteZeroes { offset, len } | IoOp::Deallocate { offset, len } => (*offset, *len),
            IoOp::Flush => (0, 0),
        };
        if !self.in_range(offset, len) {
            return Err((op, libc::EINVAL));
        }
        let entry = match &mut op {
            IoOp::Read { offset, buf } => opcode::Read::new(fd, buf.as_mut_ptr(), buf.len() as u32)
                .offset(*offset)
                .build(),
            IoOp::Write { offset, buf, fua } => {
                let mut w = opcode::Write::new(fd, buf.as_ptr(), buf.len() as u32).offset(*offset);
                if *fua {
                    w = w.rw_flags(libc::RWF_DSYNC);
                }
                w.build()
            }
            IoOp::Flush => opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
            IoOp::WriteZeroes { offset, len } => opcode::Fallocate::new(fd, *len)
                .offset(*offset)
                .mode(FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE)
                .build(),
            IoOp::Deallocate { offset, len } => opcode::Fallocate::new(fd, *len)
                .offset(*offset)
                .mode(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)
                .build(),
        };
        let fallback = match &op {
            IoOp::WriteZeroes { offset, len } | IoOp::Deallocate { offset, len } => {
                Some((*offset, *len))
            }
            _ => None,
        };
        let expected = match &op {
            IoOp::Read { buf, .. } | IoOp::Write { buf, .. } => buf.len(),
            _ => 0,
        };
        let slot = self.alloc_slot(InFlight {
            tag,
            buf: None,
            parts: 1,
            result: Ok(()),
            fallback,
            expected,
        });
        if let Err(e) = self.push(entry.user_data(slot as u64)) {
            self.slots[slot] = None;
            self.free.push(slot);
            return Err((op, e));
        }
        if let Some(s) = self.slots[slot].as_mut() {
            s.buf = op.into_buf();
        }
        self.in_flight += 1;
        Ok(())
    }

    fn flush_submissions(&mut self) {
        if self.unsubmitted > 0 {
            match self.ring.submit() {
                Ok(_) => self.unsubmitted = 0,
                Err(e) => tracing::warn!("io_uring submit: {e}"),
            }
        }
    }

    fn poll(&mut self, out: &mut Vec<IoCompletion>, _now: Instant) -> usize {
        let mut reaped: Vec<(usize, i32)> = Vec::new();
        for cqe in self.ring.completion() {
            reaped.push((cqe.user_data() as usize, cqe.result()));
        }
        for (slot, res) in reaped {
            let Some(Some(f)) = self.slots.get_mut(slot) else {
                continue;
            };
            f.parts = f.parts.saturating_sub(1);
            let short = f.expected != 0 && res >= 0 && (res as usize) != f.expected;
            if f.fallback.is_some() && (res == -libc::EOPNOTSUPP || res == -libc::EINVAL) {
                // The file system cannot zero or punch this range: write zeros.
                if let Some((off, len)) = f.fallback.take() {
                    match self.queue_zero_fill(slot, off, len) {
                        Ok(parts) => {
                            if let Some(Some(f)) = self.slots.get_mut(slot) {
                                f.parts += parts;
                            }
                            continue;
                        }
                        Err(e) => {
                            if let Some(Some(f)) = self.slots.get_mut(slot) {
                                f.result = Err(e);
                            }
                        }
                    }
                }
            } else if res < 0 {
                f.result = Err(-res);
            } else if short {
                f.result = Err(libc::EIO);
            }
            let Some(Some(f)) = self.slots.get(slot) else {
                continue;
            };
            if f.parts == 0 {
                if let Some(f) = self.slots[slot].take() {
                    self.free.push(slot);
                    self.in_flight -= 1;
                    self.ready.push(IoCompletion {
                        tag: f.tag,
                        result: f.result,
                        buf: f.buf,
                    });
                }
            }
        }
        self.flush_submissions();
        let n = self.ready.len();
        out.append(&mut self.ready);
        n
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }

    fn completion_fd(&self) -> Option<RawFd> {
        Some(self.ring.as_raw_fd())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uring_file_behaves() {
        let dir = tempfile::tempdir().unwrap();
        let dev = UringDevice::open(&dir.path().join("ns.img"), Some(1 << 20), 512).unwrap();
        assert_eq!(dev.size_bytes(), 1 << 20);
        crate::testing::exercise(dev.as_ref());
    }

    #[test]
    fn uring_on_tmpfs_falls_back() {
        // /dev/shm is tmpfs: no O_DIRECT, and no ZERO_RANGE on older kernels.
        let Ok(dir) = tempfile::tempdir_in("/dev/shm") else {
            return;
        };
        let dev = UringDevice::open(&dir.path().join("ns.img"), Some(1 << 20), 4096).unwrap();
        crate::testing::exercise(dev.as_ref());
    }

    #[test]
    fn refuses_to_shrink_and_needs_size() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ns.img");
        assert!(matches!(
            UringDevice::open(&p, None, 512),
            Err(OpenError::NoSize { .. })
        ));
        UringDevice::open(&p, Some(1 << 20), 512).unwrap();
        let e = UringDevice::open(&p, Some(1 << 19), 512).err().unwrap();
        assert!(e.to_string().contains("larger than the configured"), "{e}");
        // Growing is fine; no size means the file's own size.
        assert_eq!(
            UringDevice::open(&p, Some(2 << 20), 512)
                .unwrap()
                .size_bytes(),
            2 << 20
        );
        assert_eq!(
            UringDevice::open(&p, None, 512).unwrap().size_bytes(),
            2 << 20
        );
    }
}
