//! Block device backends.
//!
//! A `BlockDevice` is shared by every reactor; each reactor opens its own
//! `IoChannel` on it (its own io_uring, or its own NVMe queue pair), submits
//! operations tagged with a caller-chosen `u64`, and polls completions in its loop.
//! Buffers move into the channel with the operation and come back with the
//! completion, so no buffer can be freed or reused while the device still uses it.

pub mod fault;
pub mod nvme;
pub mod ram;
pub mod spdk;
pub mod sync_io;
pub mod uring;

use kvt_mem::IoBuf;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Instant;

/// One device operation. Offsets and lengths are in bytes and block-aligned.
#[derive(Debug)]
pub enum IoOp {
    Read {
        offset: u64,
        buf: IoBuf,
    },
    Write {
        offset: u64,
        buf: IoBuf,
        /// Force unit access: durable before completion.
        fua: bool,
    },
    /// Make every completed write durable.
    Flush,
    /// The range reads back as zeros afterwards; space may stay allocated.
    WriteZeroes {
        offset: u64,
        len: u64,
    },
    /// The range is no longer needed; it reads back as zeros afterwards (DLFEAT
    /// reports that) and its space is released where the device can.
    Deallocate {
        offset: u64,
        len: u64,
    },
}

impl IoOp {
    pub fn kind(&self) -> &'static str {
        match self {
            IoOp::Read { .. } => "read",
            IoOp::Write { .. } => "write",
            IoOp::Flush => "flush",
            IoOp::WriteZeroes { .. } => "write-zeroes",
            IoOp::Deallocate { .. } => "deallocate",
        }
    }
    /// Gives the buffer back (for completions and failed submissions).
    pub fn into_buf(self) -> Option<IoBuf> {
        match self {
            IoOp::Read { buf, .. } | IoOp::Write { buf, .. } => Some(buf),
            _ => None,
        }
    }
}

/// A finished operation: the tag it was submitted with, its result (an errno on
/// failure) and the buffer it carried.
#[derive(Debug)]
pub struct IoCompletion {
    pub tag: u64,
    pub result: Result<(), i32>,
    pub buf: Option<IoBuf>,
}

/// A per-reactor submission/completion path to a device. Not shared across threads.
pub trait IoChannel: Send {
    /// Queues an operation. On error the operation (and its buffer) comes back.
    /// `now` is the caller's clock (the reactor's): channels that time their
    /// operations never read a clock themselves.
    fn submit(&mut self, tag: u64, op: IoOp, now: Instant) -> Result<(), (IoOp, i32)>;
    /// Queues an operation for one of the devices sharing this channel (see
    /// `BlockDevice::shared_channel`); channels of one device ignore the lane.
    fn submit_lane(
        &mut self,
        _lane: u32,
        tag: u64,
        op: IoOp,
        now: Instant,
    ) -> Result<(), (IoOp, i32)> {
        self.submit(tag, op, now)
    }
    /// The device of `lane` is no longer served here: the channel lets go of
    /// it unless it still has operations in flight (then false; asked again).
    fn release_lane(&mut self, _lane: u32) -> bool {
        true
    }
    /// Pushes queued operations to the device (one syscall per batch at most).
    fn flush_submissions(&mut self);
    /// Moves finished operations into `out`; returns how many. `now` as for
    /// `submit`.
    fn poll(&mut self, out: &mut Vec<IoCompletion>, now: Instant) -> usize;
    /// Operations submitted and not yet returned by `poll`.
    fn in_flight(&self) -> usize;
    /// A file descriptor that becomes readable when completions are ready, for
    /// reactors that sleep in epoll when idle. `None` for synchronous devices and
    /// for polled ones (nvme), which the reactor keeps polling while they have
    /// operations in flight.
    fn completion_fd(&self) -> Option<RawFd>;
    /// A second fd that wakes the reactor for this channel (a volume channel's
    /// notifications from the pool's metadata thread).
    fn notify_fd(&self) -> Option<RawFd> {
        None
    }
}

/// Errno a channel completes with when a read touches blocks never written or
/// deallocated, on a volume that reports that as an error.
pub const ERRNO_UNWRITTEN: i32 = libc::ENODATA;
/// Errno of a namespace with no backing here (a shared pool's namespace on a
/// node that does not own it): the ANA Inaccessible path status.
pub const ERRNO_DETACHED: i32 = libc::ENOLINK;
/// Errno for a write that needed space the pool does not have.
pub const ERRNO_NO_SPACE: i32 = libc::ENOSPC;

/// A device's NVMe status (SCT << 8 | SC) as the errno a channel completes with;
/// the target maps the errno back to the NVMe status the host sees.
pub fn errno_for_nvme_status(status: u16) -> i32 {
    match status {
        0 => 0,
        // Generic: Invalid Field, LBA Out of Range.
        0x002 | 0x080 => libc::EINVAL,
        // Generic: Invalid Namespace or Format.
        0x00b => libc::ENXIO,
        // Generic: Capacity Exceeded.
        0x081 => libc::ENOSPC,
        // Media errors: Deallocated or Unwritten Logical Block (a thin remote's miss).
        0x287 => ERRNO_UNWRITTEN,
        // Everything else, including aborts of a failed queue: an I/O error.
        _ => libc::EIO,
    }
}

/// What a thin-provisioned device (a pool volume) reports in Identify Namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThinInfo {
    /// Bytes backed by written data (NUSE, in blocks, is this over the block size).
    pub used_bytes: u64,
    /// Reads of unwritten or deallocated blocks fail instead of returning zeros.
    pub unwritten_error: bool,
    /// Identifier persisted with the volume.
    pub uuid: [u8; 16],
}

/// A device shared by all reactors.
pub trait BlockDevice: Send + Sync {
    /// Backend name for logs and Identify (e.g. "uring:/var/tmp/kv.img").
    fn describe(&self) -> String;
    fn size_bytes(&self) -> u64;
    /// Opens this reactor's own channel.
    fn open_channel(&self) -> std::io::Result<Box<dyn IoChannel>>;
    /// Makes everything written durable (used at shutdown).
    fn sync(&self) -> std::io::Result<()>;
    /// True when the device loses data on restart (RAM).
    fn volatile(&self) -> bool;
    /// Thin-provisioning facts, for devices that are pool volumes.
    fn thin_info(&self) -> Option<ThinInfo> {
        None
    }
    /// The device as `Any`, for a layer above that knows its type (a
    /// namespace finds the pool volume it serves, to persist reservations).
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        None
    }
    /// The device's block size when it has its own (a volume); namespaces use it.
    fn block_size(&self) -> Option<u32> {
        None
    }
    /// Devices that share one channel per reactor with others (the volumes of
    /// one pool share its device queue): that channel's key, unique in the
    /// process, and this device's lane in it (`IoChannel::submit_lane`).
    /// `None`: the device has channels of its own.
    fn shared_channel(&self) -> Option<(u64, u32)> {
        None
    }
}

pub type SharedDevice = Arc<dyn BlockDevice>;

/// What a test of any device needs, here or in a crate above (the `test-support`
/// feature, for dev-dependencies): one operation run to completion, and the
/// behaviour every backend must have.
#[cfg(any(test, feature = "test-support"))]
pub mod testing {
    use super::*;
    use kvt_mem::IoBuf;

    /// Runs one op to completion on a channel (test helper).
    pub fn run(ch: &mut dyn IoChannel, op: IoOp) -> IoCompletion {
        ch.submit(1, op, Instant::now())
            .map_err(|(_, e)| e)
            .expect("submit");
        ch.flush_submissions();
        let mut out = Vec::new();
        for _ in 0..1_000_000 {
            if ch.poll(&mut out, Instant::now()) > 0 {
                return out.pop().expect("completion");
            }
            std::thread::yield_now();
        }
        panic!("no completion");
    }

    /// The behaviour every backend must have.
    pub fn exercise(dev: &dyn BlockDevice) {
        let mut ch = dev.open_channel().expect("channel");
        let mut w = IoBuf::new(8192);
        for (i, b) in w.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        let c = run(
            ch.as_mut(),
            IoOp::Write {
                offset: 4096,
                buf: w,
                fua: true,
            },
        );
        assert_eq!(c.result, Ok(()));
        let r = run(
            ch.as_mut(),
            IoOp::Read {
                offset: 4096,
                buf: IoBuf::new(8192),
            },
        );
        assert_eq!(r.result, Ok(()));
        let data = r.buf.expect("buf");
        assert!(data.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));

        let c = run(
            ch.as_mut(),
            IoOp::Deallocate {
                offset: 4096,
                len: 4096,
            },
        );
        assert_eq!(c.result, Ok(()));
        let c = run(
            ch.as_mut(),
            IoOp::WriteZeroes {
                offset: 8192 + 512,
                len: 512,
            },
        );
        assert_eq!(c.result, Ok(()));
        assert_eq!(run(ch.as_mut(), IoOp::Flush).result, Ok(()));
        let r = run(
            ch.as_mut(),
            IoOp::Read {
                offset: 4096,
                buf: IoBuf::new(8192),
            },
        );
        let data = r.buf.expect("buf");
        assert!(
            data[..4096].iter().all(|&b| b == 0),
            "deallocated reads zero"
        );
        assert!(data[4096 + 512..4096 + 1024].iter().all(|&b| b == 0));
        assert_eq!(data[4096], (4096 % 251) as u8);
        assert_eq!(data[4096 + 1024], ((4096 + 1024) % 251) as u8);
        assert_eq!(ch.in_flight(), 0);
    }
}
