//! The transport-independent middle of an I/O command: its checked plan turned
//! into device operations, their submission to this reactor's channels, and the
//! controller and queue-pair accounting when it completes. NVMe/TCP and NVMe/RDMA
//! differ only in how the data moves, so both call these.

use super::fabrics::QueueBinding;
use super::ns_table::NsTable;
use super::{error_kind, QpairStats};
use kvt_bdev::IoOp;
use kvt_mem::BufPool;
use kvt_reactor::ChannelCache;
use kvt_wire::nvme::{Sqe, Status};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// The device operations of one command, by NSID (resolved through the
/// queue's namespace table at submission: no `Arc` clone per command). A
/// queue keeps one and reuses it, so the data path does not allocate.
pub type DeviceOps = Vec<(u32, IoOp)>;

/// A queue pair logs failed device operations at warn at most once in this
/// long (a failed or vanished device fails every command, and a line per
/// command, or per thousand, floods the log at I/O rates); the rest go to debug.
pub const DEVICE_ERROR_WARN_INTERVAL: Duration = Duration::from_secs(1);

/// A queue pair's failed device operations, for rate-limited logging.
#[derive(Debug, Default)]
pub struct DeviceErrors {
    /// Failures so far.
    pub count: u64,
    /// When the last one was logged at warn.
    last_warn: Option<Instant>,
}

impl DeviceErrors {
    /// Counts one more failure at `now`; true when it is one to log at warn
    /// (the first, then at most one per `DEVICE_ERROR_WARN_INTERVAL`).
    fn note(&mut self, now: Instant) -> bool {
        self.count += 1;
        let due = match self.last_warn {
            None => true,
            Some(t) => now.saturating_duration_since(t) >= DEVICE_ERROR_WARN_INTERVAL,
        };
        if due {
            self.last_warn = Some(now);
        }
        due
    }
}

/// Logs a failed device operation on a queue pair. A read of unwritten blocks
/// is a KV-cache miss, not a fault, and is not counted.
pub fn log_device_error(errors: &mut DeviceErrors, now: Instant, cid: u16, opcode: u8, errno: i32) {
    if errno == kvt_bdev::ERRNO_UNWRITTEN {
        tracing::debug!(cid, "read of unwritten blocks");
        return;
    }
    if errors.note(now) {
        tracing::warn!(
            cid,
            op = opcode,
            failures = errors.count,
            "device error: {} (errno {errno}){}",
            std::io::Error::from_raw_os_error(errno),
            if errors.count > 1 {
                "; further ones on this queue within a second are logged at debug level"
            } else {
                ""
            }
        );
    } else {
        tracing::debug!(cid, op = opcode, "device error: errno {errno}");
    }
}

/// How a command's device operations went to the devices.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Submitted {
    /// Operations the devices accepted: completions to wait for.
    pub ops: u32,
    /// Why the rest were not submitted (the command fails with it once the
    /// accepted ones complete).
    pub failure: Option<Status>,
}

/// Submits `ops` (emptying it) under `tag`. At the first operation a device
/// refuses, the rest are not submitted and their buffers go back to `bufs`.
pub fn submit(
    ops: &mut DeviceOps,
    tag: u64,
    table: &NsTable,
    channels: &mut ChannelCache,
    bufs: &mut BufPool,
    device_errors: &mut DeviceErrors,
    now: Instant,
) -> Submitted {
    let mut s = Submitted::default();
    for (nsid, op) in ops.drain(..) {
        if s.failure.is_some() {
            if let Some(b) = op.into_buf().filter(|b| b.is_owned()) {
                bufs.put(b);
            }
            continue;
        }
        let Some(ns) = table.get(nsid) else {
            // Removed since the command was checked.
            if let Some(b) = op.into_buf().filter(|b| b.is_owned()) {
                bufs.put(b);
            }
            s.failure = Some(Status::INVALID_NAMESPACE);
            continue;
        };
        let refused = match channels.submit(ns, tag, op, now) {
            Ok(()) => None,
            Err((op, errno)) => {
                if device_errors.note(now) {
                    tracing::warn!(
                        nsid = ns.nsid,
                        failures = device_errors.count,
                        "device refused a submission: {} (errno {errno}); further ones on this queue within a second are logged at debug level",
                        std::io::Error::from_raw_os_error(errno)
                    );
                } else {
                    tracing::debug!(nsid = ns.nsid, "device refused a submission: errno {errno}");
                }
                Some(op)
            }
        };
        match refused {
            None => s.ops += 1,
            Some(op) => {
                if let Some(b) = op.into_buf().filter(|b| b.is_owned()) {
                    bufs.put(b);
                }
                s.failure = Some(Status::INTERNAL_ERROR);
            }
        }
    }
    s
}

/// What a successful command moved, as the statistics count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transfer {
    /// Bytes read (Read, KV Retrieve).
    Read(u64),
    /// Bytes written (Write, KV Store).
    Write(u64),
    /// Anything else (admin, Flush, Write Zeroes, DSM, other KV commands).
    Other,
}

/// Records a finished command in the queue pair's statistics and error log
/// (its controller sums them when SMART or the error log is read).
/// `latency_ns` runs from the capsule's arrival to now.
pub fn account(
    binding: Option<&QueueBinding>,
    stats: Option<&QpairStats>,
    qid: u16,
    sqe: &Sqe,
    transfer: Transfer,
    status: Status,
    latency_ns: u64,
) {
    let Some(st) = stats else { return };
    // A read of unwritten blocks is a KV-cache miss, an answer rather than a
    // fault: counted by kind below, but not logged as an error or a media error.
    let miss =
        status == Status::DEALLOCATED_OR_UNWRITTEN || status == Status::KV_KEY_DOES_NOT_EXIST;
    if let (Some(b), false) = (binding, status.is_success() || miss) {
        // I/O commands name their LBA even when they failed before a plan.
        let lba = if qid != 0 { sqe.slba() } else { 0 };
        b.ctrl()
            .record_error(st, qid, sqe.cid(), status, sqe.nsid(), lba);
        if status.sct == 2 {
            st.media_errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    let b = kvt_mem::stats::latency_bucket(latency_ns);
    if !status.is_success() {
        st.errors.fetch_add(1, Ordering::Relaxed);
        st.errors_by[error_kind(status)].fetch_add(1, Ordering::Relaxed);
        return;
    }
    match transfer {
        Transfer::Read(bytes) => {
            st.reads.fetch_add(1, Ordering::Relaxed);
            st.read_bytes.fetch_add(bytes, Ordering::Relaxed);
            st.read_hist[b].fetch_add(1, Ordering::Relaxed);
            st.read_ns.fetch_add(latency_ns, Ordering::Relaxed);
        }
        Transfer::Write(bytes) => {
            st.writes.fetch_add(1, Ordering::Relaxed);
            st.write_bytes.fetch_add(bytes, Ordering::Relaxed);
            st.write_hist[b].fetch_add(1, Ordering::Relaxed);
            st.write_ns.fetch_add(latency_ns, Ordering::Relaxed);
        }
        Transfer::Other => {
            st.other.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::IoPlan;
    use crate::Namespace;
    use kvt_bdev::ram::RamDevice;
    use kvt_bdev::{BlockDevice, IoChannel, IoCompletion};
    use kvt_mem::IoBuf;
    use std::os::fd::RawFd;
    use std::sync::Arc;

    fn ns(nsid: u32) -> Arc<Namespace> {
        Arc::new(Namespace::new(
            "nqn.cmd",
            nsid,
            RamDevice::new("r", 1 << 20).unwrap(),
            512,
        ))
    }

    /// A device whose every submission is refused (a full or failed queue).
    struct Refusing;
    struct RefusingChannel;
    impl BlockDevice for Refusing {
        fn describe(&self) -> String {
            "refusing".into()
        }
        fn size_bytes(&self) -> u64 {
            1 << 20
        }
        fn open_channel(&self) -> std::io::Result<Box<dyn IoChannel>> {
            Ok(Box::new(RefusingChannel))
        }
        fn sync(&self) -> std::io::Result<()> {
            Ok(())
        }
        fn volatile(&self) -> bool {
            true
        }
    }
    impl IoChannel for RefusingChannel {
        fn submit(&mut self, _tag: u64, op: IoOp, _now: Instant) -> Result<(), (IoOp, i32)> {
            Err((op, libc::EAGAIN))
        }
        fn flush_submissions(&mut self) {}
        fn poll(&mut self, _out: &mut Vec<IoCompletion>, _now: Instant) -> usize {
            0
        }
        fn in_flight(&self) -> usize {
            0
        }
        fn completion_fd(&self) -> Option<RawFd> {
            None
        }
    }

    #[test]
    fn submission_stops_at_the_first_refusal() {
        let (mut bufs, mut channels) = (BufPool::new(4), ChannelCache::default());
        let refusing = Arc::new(Namespace::new("nqn.cmd", 2, Arc::new(Refusing), 512));
        let t = NsTable::new(1, vec![ns(1), refusing]);
        let write = |b: usize| IoOp::Write {
            offset: 0,
            buf: IoBuf::new(b),
            fua: false,
        };
        let mut ops: DeviceOps = vec![(1, write(4096)), (2, write(4096)), (1, write(4096))];
        let mut refusals = DeviceErrors::default();
        let now = Instant::now();
        let s = submit(
            &mut ops,
            7,
            &t,
            &mut channels,
            &mut bufs,
            &mut refusals,
            now,
        );
        assert_eq!(
            s,
            Submitted {
                ops: 1,
                failure: Some(Status::INTERNAL_ERROR)
            }
        );
        assert!(ops.is_empty());
        assert_eq!(
            refusals.count, 1,
            "the refusal is counted for rate-limited logging"
        );
        let mut ok: DeviceOps = vec![(1, IoOp::Flush), (1, IoOp::Flush)];
        assert_eq!(
            submit(&mut ok, 8, &t, &mut channels, &mut bufs, &mut refusals, now),
            Submitted {
                ops: 2,
                failure: None
            }
        );
    }

    /// What the queue passes for a command's plan.
    fn tr(plan: Option<IoPlan>) -> Transfer {
        plan.map_or(Transfer::Other, |p| p.transfer())
    }

    #[test]
    fn accounting_counts_reads_writes_and_errors() {
        let st = QpairStats::default();
        let sqe = Sqe::default();
        let read = Some(IoPlan::Read {
            offset: 0,
            len: 4096,
        });
        account(None, Some(&st), 1, &sqe, tr(read), Status::SUCCESS, 1_000);
        account(None, Some(&st), 1, &sqe, tr(read), Status::SUCCESS, 3_000);
        account(
            None,
            Some(&st),
            1,
            &sqe,
            tr(read),
            Status::LBA_OUT_OF_RANGE,
            10,
        );
        let write = Some(IoPlan::Write {
            offset: 0,
            len: 512,
            fua: false,
        });
        account(None, Some(&st), 1, &sqe, tr(write), Status::SUCCESS, 500);
        account(None, Some(&st), 1, &sqe, tr(None), Status::SUCCESS, 5);
        let v = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        assert_eq!(
            (v(&st.reads), v(&st.read_bytes), v(&st.read_ns)),
            (2, 8192, 4_000)
        );
        assert_eq!((v(&st.writes), v(&st.write_bytes)), (1, 512));
        assert_eq!((v(&st.errors), v(&st.other)), (1, 1));
        assert_eq!(st.read_hist.iter().map(v).sum::<u64>(), 2);
    }

    #[test]
    fn device_errors_are_counted_but_misses_are_not_and_warn_at_most_once_a_second() {
        let mut e = DeviceErrors::default();
        let t0 = Instant::now();
        log_device_error(&mut e, t0, 1, 2, kvt_bdev::ERRNO_UNWRITTEN);
        assert_eq!(e.count, 0);
        // A million failures within one second: one warning.
        let warned = (0..1_000_000).filter(|_| e.note(t0)).count();
        assert_eq!((warned, e.count), (1, 1_000_000));
        assert!(!e.note(t0 + Duration::from_millis(999)));
        assert!(e.note(t0 + DEVICE_ERROR_WARN_INTERVAL));
        assert!(!e.note(t0 + DEVICE_ERROR_WARN_INTERVAL + Duration::from_millis(10)));
        log_device_error(&mut e, t0, 1, 2, libc::EIO);
        assert_eq!(e.count, 1_000_004);
    }

    #[test]
    fn failures_go_to_the_queues_error_log_but_kv_misses_do_not() {
        use crate::{Controller, Subsystem, SubsystemKind};
        let subsys = Arc::new(Subsystem::new(
            "nqn.cmd",
            SubsystemKind::Nvm,
            "S",
            "M",
            true,
            vec![],
        ));
        let ctrl = Arc::new(Controller::new(
            1,
            subsys,
            "nqn.h",
            [0; 16],
            0,
            "p".into(),
            Instant::now(),
        ));
        let st = Arc::new(QpairStats::default());
        ctrl.attach_queue(&st);
        let binding = QueueBinding::Admin(ctrl.clone());
        let read = Some(IoPlan::Read {
            offset: 0,
            len: 4096,
        });
        let sqe = Sqe::default();
        account(
            Some(&binding),
            Some(&st),
            1,
            &sqe,
            tr(read),
            Status::DEALLOCATED_OR_UNWRITTEN,
            5,
        );
        assert_eq!(ctrl.error_count(), 0, "a miss is not an error log entry");
        assert_eq!(st.media_errors.load(Ordering::Relaxed), 0);
        assert_eq!(
            st.errors_by[error_kind(Status::DEALLOCATED_OR_UNWRITTEN)].load(Ordering::Relaxed),
            1
        );
        account(
            Some(&binding),
            Some(&st),
            1,
            &sqe,
            tr(read),
            Status::UNRECOVERED_READ_ERROR,
            5,
        );
        account(
            Some(&binding),
            Some(&st),
            1,
            &sqe,
            tr(read),
            Status::SUCCESS,
            5,
        );
        let e = ctrl.error_entries();
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].status, Status::UNRECOVERED_READ_ERROR.to_field());
        assert_eq!(ctrl.io_totals().media_errors, 1);
        assert_eq!(ctrl.io_totals().read_cmds, 1);
    }
}
