//! Blocking I/O on a device channel, for metadata work and tools off the data
//! path (the pool's metadata thread, `kvtarget check`, formatting, shutdown
//! flushes).
//!
//! `SyncIo` runs its own small loop until its operations complete, so it is
//! the one that reads the clock for the channel it drives: the channels under
//! it are raw devices (file, ram, nvme, spdk), never a pool's volume channel,
//! and none of them depends on the time they are given.

use super::{IoChannel, IoCompletion, IoOp, SharedDevice};
use kvt_mem::IoBuf;
use std::os::fd::RawFd;
use std::time::Instant;

/// A failed synchronous operation: what it was, where, and the device's errno.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SyncIoError {
    #[error("cannot open {dev}: {reason}")]
    Open { dev: String, reason: String },
    #[error("read at {offset}: {}", errno_text(*.errno))]
    Read { offset: u64, errno: i32 },
    #[error("read at {offset}: no data")]
    NoData { offset: u64 },
    #[error("write at {offset}: {}", errno_text(*.errno))]
    Write { offset: u64, errno: i32 },
    #[error("flush: {}", errno_text(*.errno))]
    Flush { errno: i32 },
}

/// The text of an errno, as the OS says it.
pub fn errno_text(errno: i32) -> String {
    std::io::Error::from_raw_os_error(errno).to_string()
}

pub struct SyncIo {
    ch: Box<dyn IoChannel>,
    next_tag: u64,
}

impl SyncIo {
    pub fn new(dev: &SharedDevice) -> Result<SyncIo, SyncIoError> {
        Ok(SyncIo {
            ch: dev.open_channel().map_err(|e| SyncIoError::Open {
                dev: dev.describe(),
                reason: e.to_string(),
            })?,
            next_tag: 1,
        })
    }

    /// Runs operations concurrently and waits for all; the first error wins.
    pub fn run_all(&mut self, ops: Vec<IoOp>) -> Result<Vec<IoCompletion>, i32> {
        let n = ops.len();
        let mut first_err = None;
        let mut submitted = 0;
        for op in ops {
            self.next_tag += 1;
            match self.ch.submit(self.next_tag, op, Instant::now()) {
                Ok(()) => submitted += 1,
                Err((_, e)) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        self.ch.flush_submissions();
        let mut out = Vec::with_capacity(n);
        while out.len() < submitted {
            if self.ch.poll(&mut out, Instant::now()) == 0 {
                wait_readable(self.ch.completion_fd());
            }
        }
        if let Some(e) = out.iter().find_map(|c| c.result.err()).or(first_err) {
            return Err(e);
        }
        Ok(out)
    }

    pub fn read(&mut self, offset: u64, len: usize) -> Result<IoBuf, SyncIoError> {
        let buf = IoBuf::new(len);
        let mut c = self
            .run_all(vec![IoOp::Read { offset, buf }])
            .map_err(|errno| SyncIoError::Read { offset, errno })?;
        c.pop()
            .and_then(|c| c.buf)
            .ok_or(SyncIoError::NoData { offset })
    }

    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), SyncIoError> {
        let mut buf = IoBuf::new(data.len());
        buf.set_len(data.len());
        buf.copy_from_slice(data);
        self.run_all(vec![IoOp::Write {
            offset,
            buf,
            fua: false,
        }])
        .map(|_| ())
        .map_err(|errno| SyncIoError::Write { offset, errno })
    }

    pub fn flush(&mut self) -> Result<(), SyncIoError> {
        self.run_all(vec![IoOp::Flush])
            .map(|_| ())
            .map_err(|errno| SyncIoError::Flush { errno })
    }
}

fn wait_readable(fd: Option<RawFd>) {
    match fd {
        Some(fd) => {
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd for the duration of the call.
            unsafe { libc::poll(&mut p, 1, 5) };
        }
        None => std::thread::yield_now(),
    }
}
