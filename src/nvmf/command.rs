//! The transport-independent middle of an I/O command: its checked plan turned
//! into device operations, their submission to this reactor's channels, and the
//! controller and queue-pair accounting when it completes. NVMe/TCP and NVMe/RDMA
//! differ only in how the data moves, so both call these.

use super::fabrics::QueueBinding;
use super::io::{self as tio, IoPlan};
use super::queue::NsTable;
use super::{error_kind, QpairStats};
use crate::bdev::IoOp;
use crate::mem::{BufPool, IoBuf};
use crate::reactor::ChannelCache;
use crate::wire::nvme::{Sqe, Status};
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
    if errno == crate::bdev::ERRNO_UNWRITTEN {
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

/// Turns `plan` into device operations appended to `ops`.
///
/// `data` is the command's buffer: the host's data for writes and Dataset
/// Management, or for reads a buffer the transport has already placed (NVMe/RDMA
/// reads into registered memory); a read without one takes a buffer from `bufs`.
/// Writes take the buffer; a DSM buffer stays with the command. `table` is the
/// queue's namespaces (all of them for a flush of NSID FFFFFFFFh).
pub fn device_ops(
    plan: IoPlan,
    nsid: u32,
    table: &NsTable,
    data: &mut Option<IoBuf>,
    bufs: &mut BufPool,
    ops: &mut DeviceOps,
) -> Result<(), Status> {
    let the_ns = || table.get(nsid).ok_or(Status::INVALID_NAMESPACE);
    match plan {
        // KV commands run step by step in the queue (`Queue::execute_kv`).
        IoPlan::KvStore { .. }
        | IoPlan::KvRetrieve { .. }
        | IoPlan::KvDelete { .. }
        | IoPlan::KvExist { .. }
        | IoPlan::KvList { .. } => return Err(Status::INTERNAL_ERROR),
        IoPlan::Nothing => {}
        IoPlan::Read { offset, len } => {
            the_ns()?;
            let mut buf = data.take().unwrap_or_else(|| bufs.get(len));
            buf.set_len(len);
            if buf.len() < len {
                *data = Some(buf);
                return Err(Status::INTERNAL_ERROR);
            }
            ops.push((nsid, IoOp::Read { offset, buf }));
        }
        IoPlan::Write { offset, len, fua } => {
            the_ns()?;
            let mut buf = data.take().ok_or(Status::DATA_TRANSFER_ERROR)?;
            buf.set_len(len);
            if buf.len() < len {
                // The transport's buffer is shorter than the command: never
                // write a short run of the host's blocks.
                *data = Some(buf);
                return Err(Status::DATA_SGL_LENGTH_INVALID);
            }
            ops.push((nsid, IoOp::Write { offset, buf, fua }));
        }
        IoPlan::Flush { all: true } => {
            ops.extend(table.all().iter().map(|n| (n.nsid, IoOp::Flush)))
        }
        IoPlan::Flush { all: false } => {
            the_ns()?;
            ops.push((nsid, IoOp::Flush));
        }
        IoPlan::WriteZeroes {
            offset,
            len,
            deallocate,
        } => {
            the_ns()?;
            let op = if deallocate {
                IoOp::Deallocate { offset, len }
            } else {
                IoOp::WriteZeroes { offset, len }
            };
            ops.push((nsid, op));
        }
        IoPlan::Deallocate { ranges } => {
            let ns = the_ns()?;
            let d = data.as_deref().ok_or(Status::DATA_TRANSFER_ERROR)?;
            tio::dsm_ranges_into(ns, d, ranges, |offset, len| {
                ops.push((nsid, IoOp::Deallocate { offset, len }))
            })?;
        }
    }
    Ok(())
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

/// Records a finished command in the queue pair's statistics and error log
/// (its controller sums them when SMART or the error log is read).
/// `latency_ns` runs from the capsule's arrival to now.
pub fn account(
    binding: Option<&QueueBinding>,
    stats: Option<&QpairStats>,
    qid: u16,
    sqe: &Sqe,
    plan: Option<IoPlan>,
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

    let b = crate::stats::latency_bucket(latency_ns);
    if !status.is_success() {
        st.errors.fetch_add(1, Ordering::Relaxed);
        st.errors_by[error_kind(status)].fetch_add(1, Ordering::Relaxed);
        return;
    }
    match plan {
        Some(IoPlan::Read { len, .. }) => {
            st.reads.fetch_add(1, Ordering::Relaxed);
            st.read_bytes.fetch_add(len as u64, Ordering::Relaxed);
            st.read_hist[b].fetch_add(1, Ordering::Relaxed);
            st.read_ns.fetch_add(latency_ns, Ordering::Relaxed);
        }
        Some(IoPlan::KvRetrieve {
            stage: super::io::KvStage::Sent { xfer },
            ..
        }) => {
            st.reads.fetch_add(1, Ordering::Relaxed);
            st.read_bytes.fetch_add(xfer as u64, Ordering::Relaxed);
            st.read_hist[b].fetch_add(1, Ordering::Relaxed);
            st.read_ns.fetch_add(latency_ns, Ordering::Relaxed);
        }
        Some(IoPlan::KvStore { len, .. }) => {
            st.writes.fetch_add(1, Ordering::Relaxed);
            st.write_bytes.fetch_add(len as u64, Ordering::Relaxed);
            st.write_hist[b].fetch_add(1, Ordering::Relaxed);
            st.write_ns.fetch_add(latency_ns, Ordering::Relaxed);
        }
        Some(IoPlan::Write { len, .. }) => {
            st.writes.fetch_add(1, Ordering::Relaxed);
            st.write_bytes.fetch_add(len as u64, Ordering::Relaxed);
            st.write_hist[b].fetch_add(1, Ordering::Relaxed);
            st.write_ns.fetch_add(latency_ns, Ordering::Relaxed);
        }
        _ => {
            st.other.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bdev::ram::RamDevice;
    use crate::bdev::{BlockDevice, IoChannel, IoCompletion};
    use crate::nvmf::Namespace;
    use crate::wire::nvme::DSM_RANGE_LEN;
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

    fn table(nsids: &[u32]) -> NsTable {
        NsTable::new(1, nsids.iter().map(|&n| ns(n)).collect())
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
    fn a_write_takes_the_hosts_buffer_and_a_short_one_is_refused() {
        let (n, mut bufs, mut ops) = (table(&[1]), BufPool::new(4), DeviceOps::new());
        let plan = IoPlan::Write {
            offset: 4096,
            len: 8192,
            fua: true,
        };
        let mut data = Some(IoBuf::new(8192));
        device_ops(plan, 1, &n, &mut data, &mut bufs, &mut ops).unwrap();
        assert!(data.is_none());
        assert!(
            matches!(&ops[..], [(_, IoOp::Write { offset: 4096, buf, fua: true })] if buf.len() == 8192)
        );

        ops.clear();
        let mut short = Some(IoBuf::new(4096));
        assert_eq!(
            device_ops(plan, 1, &n, &mut short, &mut bufs, &mut ops),
            Err(Status::DATA_SGL_LENGTH_INVALID)
        );
        assert!(
            ops.is_empty() && short.is_some(),
            "the buffer stays with the command"
        );
        assert_eq!(
            device_ops(plan, 1, &n, &mut None, &mut bufs, &mut ops),
            Err(Status::DATA_TRANSFER_ERROR)
        );
        assert_eq!(
            device_ops(
                plan,
                2,
                &n,
                &mut Some(IoBuf::new(8192)),
                &mut bufs,
                &mut ops
            ),
            Err(Status::INVALID_NAMESPACE)
        );
    }

    #[test]
    fn a_read_uses_the_placed_buffer_or_one_from_the_pool() {
        let (n, mut bufs, mut ops) = (table(&[1]), BufPool::new(4), DeviceOps::new());
        let plan = IoPlan::Read {
            offset: 0,
            len: 512,
        };
        let mut placed = IoBuf::new(4096);
        let at = placed.as_mut_ptr();
        device_ops(plan, 1, &n, &mut Some(placed), &mut bufs, &mut ops).unwrap();
        device_ops(plan, 1, &n, &mut None, &mut bufs, &mut ops).unwrap();
        match &mut ops[..] {
            [(_, IoOp::Read { buf: a, .. }), (_, IoOp::Read { buf: b, .. })] => {
                assert_eq!((a.as_mut_ptr(), a.len(), b.len()), (at, 512, 512));
            }
            _ => panic!("expected two reads, got {} operations", ops.len()),
        }
    }

    #[test]
    fn flush_all_is_one_flush_per_namespace_and_hints_need_nothing() {
        let (mut bufs, mut ops) = (BufPool::new(4), DeviceOps::new());
        let all = table(&[1, 2, 3]);
        device_ops(
            IoPlan::Flush { all: true },
            0xFFFF_FFFF,
            &all,
            &mut None,
            &mut bufs,
            &mut ops,
        )
        .unwrap();
        let nsids: Vec<u32> = ops.iter().map(|(n, _)| *n).collect();
        assert_eq!(nsids, [1, 2, 3]);
        ops.clear();
        device_ops(IoPlan::Nothing, 7, &all, &mut None, &mut bufs, &mut ops).unwrap();
        assert!(ops.is_empty());
    }

    #[test]
    fn dsm_ranges_become_deallocates_and_the_range_list_stays() {
        let (n, mut bufs, mut ops) = (table(&[1]), BufPool::new(4), DeviceOps::new());
        let mut list = IoBuf::new(4096);
        list.set_len(2 * DSM_RANGE_LEN);
        list.fill(0);
        // Range 0: 8 blocks at LBA 16; range 1: 1 block at LBA 100.
        list[4..8].copy_from_slice(&8u32.to_le_bytes());
        list[8..16].copy_from_slice(&16u64.to_le_bytes());
        list[20..24].copy_from_slice(&1u32.to_le_bytes());
        list[24..32].copy_from_slice(&100u64.to_le_bytes());
        let mut data = Some(list);
        let plan = IoPlan::Deallocate { ranges: 2 };
        device_ops(plan, 1, &n, &mut data, &mut bufs, &mut ops).unwrap();
        assert!(data.is_some());
        let got: Vec<(u64, u64)> = ops
            .iter()
            .map(|(_, op)| match op {
                IoOp::Deallocate { offset, len } => (*offset, *len),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(got, [(16 * 512, 8 * 512), (100 * 512, 512)]);
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

    #[test]
    fn accounting_counts_reads_writes_and_errors() {
        let st = QpairStats::default();
        let sqe = Sqe::default();
        let read = Some(IoPlan::Read {
            offset: 0,
            len: 4096,
        });
        account(None, Some(&st), 1, &sqe, read, Status::SUCCESS, 1_000);
        account(None, Some(&st), 1, &sqe, read, Status::SUCCESS, 3_000);
        account(None, Some(&st), 1, &sqe, read, Status::LBA_OUT_OF_RANGE, 10);
        let write = Some(IoPlan::Write {
            offset: 0,
            len: 512,
            fua: false,
        });
        account(None, Some(&st), 1, &sqe, write, Status::SUCCESS, 500);
        account(None, Some(&st), 1, &sqe, None, Status::SUCCESS, 5);
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
        log_device_error(&mut e, t0, 1, 2, crate::bdev::ERRNO_UNWRITTEN);
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
        use crate::nvmf::{Controller, Subsystem, SubsystemKind};
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
            read,
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
            read,
            Status::UNRECOVERED_READ_ERROR,
            5,
        );
        account(Some(&binding), Some(&st), 1, &sqe, read, Status::SUCCESS, 5);
        let e = ctrl.error_entries();
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].status, Status::UNRECOVERED_READ_ERROR.to_field());
        assert_eq!(ctrl.io_totals().media_errors, 1);
        assert_eq!(ctrl.io_totals().read_cmds, 1);
    }
}
