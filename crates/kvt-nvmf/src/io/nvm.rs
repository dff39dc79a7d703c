//! The NVM command set: Read, Write (FUA), Flush, Write Zeroes and Dataset
//! Management, checked into a plan, turned into device operations and run
//! (Linux nvmet's `io-cmd-bdev.c`).

use super::{status_for_errno, IoEnv, IoPlan, Outcome};
use crate::command::{self, DeviceErrors, DeviceOps};
use crate::ns_table::NsTable;
use crate::request::Request;
use crate::Namespace;
use kvt_bdev::IoOp;
use kvt_mem::{BufPool, IoBuf};
use kvt_reactor::IoCtx;
use kvt_wire::nvme::{io_opc, DsmRange, Sqe, Status, DSM_ATTR_DEALLOCATE, DSM_RANGE_LEN};

/// Decodes and checks an NVM command set I/O command against its namespace
/// (`None` when the NSID names no active one). `#[inline]`: once per I/O
/// command, from `io::plan` only.
#[inline]
pub(super) fn plan(ns: Option<&Namespace>, sqe: &Sqe, max_io_size: u32) -> Result<IoPlan, Status> {
    let opc = sqe.opcode();
    if !matches!(
        opc,
        io_opc::FLUSH
            | io_opc::WRITE
            | io_opc::READ
            | io_opc::WRITE_ZEROES
            | io_opc::DATASET_MANAGEMENT
    ) {
        return Err(Status::INVALID_OPCODE);
    }
    let Some(ns) = ns else {
        return Err(Status::INVALID_NAMESPACE);
    };
    let sgl_len = sqe.sgl().length as usize;
    match opc {
        io_opc::FLUSH => Ok(IoPlan::Flush { all: false }),
        io_opc::READ | io_opc::WRITE => {
            let nlb = sqe.nlb() as u64;
            let (offset, len) = lba_range(ns, sqe.slba(), nlb)?;
            if len > max_io_size as u64 {
                return Err(Status::INVALID_FIELD);
            }
            if sgl_len != len as usize {
                return Err(Status::DATA_SGL_LENGTH_INVALID);
            }
            Ok(if opc == io_opc::READ {
                IoPlan::Read {
                    offset,
                    len: len as usize,
                }
            } else {
                IoPlan::Write {
                    offset,
                    len: len as usize,
                    fua: sqe.fua(),
                }
            })
        }
        io_opc::WRITE_ZEROES => {
            let (offset, len) = lba_range(ns, sqe.slba(), sqe.nlb() as u64)?;
            Ok(IoPlan::WriteZeroes {
                offset,
                len,
                deallocate: sqe.cdw(12) & (1 << 25) != 0,
            })
        }
        _ => {
            let ranges = (sqe.cdw(10) & 0xFF) as usize + 1;
            if sgl_len < ranges * DSM_RANGE_LEN {
                return Err(Status::DATA_SGL_LENGTH_INVALID);
            }
            if sqe.cdw(11) & DSM_ATTR_DEALLOCATE == 0 {
                return Ok(IoPlan::Nothing);
            }
            Ok(IoPlan::Deallocate { ranges })
        }
    }
}

fn lba_range(ns: &Namespace, slba: u64, nlb: u64) -> Result<(u64, u64), Status> {
    match slba.checked_add(nlb) {
        Some(end) if end <= ns.num_blocks => {
            Ok((slba * ns.block_size as u64, nlb * ns.block_size as u64))
        }
        _ => Err(Status::LBA_OUT_OF_RANGE),
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
        // KV commands run step by step in their own handler (`io::kv`).
        IoPlan::KvStore { .. }
        | IoPlan::KvRetrieve { .. }
        | IoPlan::KvDelete { .. }
        | IoPlan::KvExist { .. }
        | IoPlan::KvList { .. }
        | IoPlan::Reservation { .. } => return Err(Status::INTERNAL_ERROR),
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
            dsm_ranges_into(ns, d, ranges, |offset, len| {
                ops.push((nsid, IoOp::Deallocate { offset, len }))
            })?;
        }
    }
    Ok(())
}

/// Runs an NVM command: its device operations go out (none for DSM hints or
/// a flush of no namespace: it is done at once).
pub fn execute<X>(
    r: &mut Request<X>,
    env: &mut IoEnv<'_>,
    ctx: &mut IoCtx,
) -> Result<Outcome, Status> {
    let plan = r.plan.ok_or(Status::INTERNAL_ERROR)?;
    if env.places_read_buffers && matches!(plan, IoPlan::Read { .. }) && r.buf.is_none() {
        // Read data must be in the transport's memory; it placed it, so this
        // is never a host's doing.
        return Err(Status::INTERNAL_ERROR);
    }
    let ops = &mut *env.ops;
    if let Err(e) = device_ops(plan, r.sqe.nsid(), env.ns, &mut r.buf, ctx.bufs, ops) {
        for (_, op) in ops.drain(..) {
            if let Some(b) = op.into_buf().filter(|b| b.is_owned()) {
                ctx.bufs.put(b);
            }
        }
        return Err(e);
    }
    if ops.is_empty() {
        return Ok(Outcome::SUCCESS);
    }
    Ok(Outcome::Submitted(command::submit(
        ops,
        env.tag,
        env.ns,
        ctx.channels,
        ctx.bufs,
        env.errors,
        ctx.now,
    )))
}

/// A device operation of an NVM command finished. Reads keep the buffer to
/// send from; other buffers go back to the pool (views into transport memory
/// are dropped: their memory stays with the request). True when it was the
/// command's last.
pub fn complete<X>(
    r: &mut Request<X>,
    errors: &mut DeviceErrors,
    result: Result<(), i32>,
    buf: Option<IoBuf>,
    ctx: &mut IoCtx,
) -> bool {
    if let Err(errno) = result {
        command::log_device_error(errors, ctx.now, r.sqe.cid(), r.sqe.opcode(), errno);
        r.status = status_for_errno(errno, r.plan);
    }
    if let Some(b) = buf {
        if r.buf.is_none() && matches!(r.plan, Some(IoPlan::Read { .. })) {
            r.buf = Some(b);
        } else if b.is_owned() {
            ctx.bufs.put(b);
        }
    }
    r.pending_ops = r.pending_ops.saturating_sub(1);
    r.pending_ops == 0
}

/// Decodes Dataset Management ranges into byte ranges, checking each one.
pub fn dsm_ranges(ns: &Namespace, data: &[u8], ranges: usize) -> Result<Vec<(u64, u64)>, Status> {
    let mut out = Vec::with_capacity(ranges);
    dsm_ranges_into(ns, data, ranges, |o, l| out.push((o, l)))?;
    Ok(out)
}

/// `dsm_ranges` without the vector: every range is checked first, then each
/// non-empty one goes to `each(offset, len)` (so a bad range means none is used).
pub fn dsm_ranges_into(
    ns: &Namespace,
    data: &[u8],
    ranges: usize,
    mut each: impl FnMut(u64, u64),
) -> Result<(), Status> {
    let range = |i: usize| -> Result<Option<(u64, u64)>, Status> {
        let Some(b) = data.get(i * DSM_RANGE_LEN..(i + 1) * DSM_RANGE_LEN) else {
            return Err(Status::DATA_SGL_LENGTH_INVALID);
        };
        let r = DsmRange::decode(b);
        if r.nlb == 0 {
            return Ok(None);
        }
        lba_range(ns, r.slba, r.nlb as u64).map(Some)
    };
    for i in 0..ranges {
        range(i)?;
    }
    for i in 0..ranges {
        if let Some((o, l)) = range(i)? {
            each(o, l);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvt_bdev::ram::RamDevice;
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
}
