//! NVM command set I/O commands, decoded and checked into device operations.
//! Pure functions: the transport owns buffers and submits what this returns.

use super::{CommandSet, Namespace};
use crate::pool::kv::KvLoc;
use crate::wire::nvme::{
    io_opc, DsmRange, KvCommand, KvKey, Sqe, Status, StoreOptions, DSM_ATTR_DEALLOCATE,
    DSM_RANGE_LEN, KV_LIST_MIN_BUFFER,
};

/// Where a KV command is in its steps (each step's device operation
/// completes into the next).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvStage {
    /// Not started.
    Start,
    /// A Store waits for the commit (a volume flush) that frees blocks other
    /// keys gave up; `tries` so far.
    Space { tries: u8 },
    /// A Store's blocks are claimed; the commit (a volume flush) that makes
    /// their release by other keys durable runs before the value is written.
    Claimed(KvLoc),
    /// A Store's value is being written there.
    Write(KvLoc),
    /// The index change is being committed (no volatile write cache).
    Durable,
    /// A Retrieve reads the value: `pin` holds its blocks; `xfer` bytes go to
    /// the host; the value is `len` bytes.
    Read { pin: u32, xfer: u32, len: u32 },
    /// A Retrieve's data is ready: `xfer` bytes.
    Sent { xfer: u32 },
}

/// What a checked I/O command asks the device to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoPlan {
    Read {
        offset: u64,
        len: usize,
    },
    Write {
        offset: u64,
        len: usize,
        fua: bool,
    },
    /// Flush this namespace, or every namespace (NSID FFFFFFFFh).
    Flush {
        all: bool,
    },
    WriteZeroes {
        offset: u64,
        len: u64,
        deallocate: bool,
    },
    /// Dataset Management with the deallocate attribute: `ranges` descriptors in the
    /// command's data.
    Deallocate {
        ranges: usize,
    },
    /// A command that succeeds without device work (DSM hints without deallocate).
    Nothing,
    /// KV Store of `len` bytes (the first `len` of the host's data).
    /// `durable`: no volatile write cache, so the key is committed before the
    /// completion.
    KvStore {
        key: KvKey,
        len: u32,
        opts: StoreOptions,
        durable: bool,
        stage: KvStage,
    },
    /// KV Retrieve into a host buffer of `buf` bytes (the smaller of HBS and
    /// the data descriptor).
    KvRetrieve {
        key: KvKey,
        buf: u32,
        stage: KvStage,
    },
    KvDelete {
        key: KvKey,
        durable: bool,
        stage: KvStage,
    },
    KvExist {
        key: KvKey,
    },
    /// KV List from `start` into a buffer of `buf` bytes.
    KvList {
        start: KvKey,
        buf: u32,
    },
}

impl IoPlan {
    /// A command of the KV command set (other than Flush, which is shared).
    pub fn is_kv(&self) -> bool {
        matches!(
            self,
            IoPlan::KvStore { .. }
                | IoPlan::KvRetrieve { .. }
                | IoPlan::KvDelete { .. }
                | IoPlan::KvExist { .. }
                | IoPlan::KvList { .. }
        )
    }
}

/// The largest value a KV namespace takes: one command's data (MDTS), and no
/// more than the namespace holds.
pub fn kv_value_max(ns: &Namespace, max_io_size: u32) -> u32 {
    let cap = ns.num_blocks.saturating_mul(ns.block_size as u64);
    (max_io_size as u64).min(cap) as u32
}

/// Decodes and checks a KV command set I/O command against its namespace.
fn kv_plan(ns: &Namespace, sqe: &Sqe, max_io_size: u32) -> Result<IoPlan, Status> {
    let sgl_len = sqe.sgl().length;
    Ok(
        match KvCommand::decode(sqe, kv_value_max(ns, max_io_size))? {
            KvCommand::Flush => IoPlan::Flush { all: false },
            KvCommand::Store {
                key,
                value_size,
                options,
            } => {
                // The host's buffer may be longer than the value (a passthrough
                // rounds it up); never shorter.
                if sgl_len < value_size {
                    return Err(Status::DATA_SGL_LENGTH_INVALID);
                }
                IoPlan::KvStore {
                    key,
                    len: value_size,
                    opts: options,
                    durable: false,
                    stage: KvStage::Start,
                }
            }
            KvCommand::Retrieve {
                key,
                host_buffer_size,
                ..
            } => IoPlan::KvRetrieve {
                key,
                buf: host_buffer_size.min(sgl_len),
                stage: KvStage::Start,
            },
            KvCommand::Delete { key } => IoPlan::KvDelete {
                key,
                durable: false,
                stage: KvStage::Start,
            },
            KvCommand::Exist { key } => IoPlan::KvExist { key },
            KvCommand::List {
                start_key,
                host_buffer_size,
            } => {
                let buf = host_buffer_size.min(sgl_len);
                if buf < KV_LIST_MIN_BUFFER {
                    return Err(Status::DATA_SGL_LENGTH_INVALID);
                }
                IoPlan::KvList {
                    start: start_key,
                    buf,
                }
            }
        },
    )
}

/// Data the host sends for a command with in-capsule or R2T data.
pub fn host_data_len(sqe: &Sqe) -> usize {
    sqe.sgl().length as usize
}

fn lba_range(ns: &Namespace, slba: u64, nlb: u64) -> Result<(u64, u64), Status> {
    match slba.checked_add(nlb) {
        Some(end) if end <= ns.num_blocks => {
            Ok((slba * ns.block_size as u64, nlb * ns.block_size as u64))
        }
        _ => Err(Status::LBA_OUT_OF_RANGE),
    }
}

/// Decodes and checks an I/O command against its namespace. `ns` is `None` when
/// the NSID names no active namespace.
pub fn plan(ns: Option<&Namespace>, sqe: &Sqe, max_io_size: u32) -> Result<IoPlan, Status> {
    if sqe.fuse() != 0 {
        return Err(Status::INVALID_FIELD);
    }
    let opc = sqe.opcode();
    if opc == io_opc::FLUSH && sqe.nsid() == 0xFFFF_FFFF {
        return Ok(IoPlan::Flush { all: true });
    }
    if let Some(n) = ns.filter(|n| n.command_set == CommandSet::KeyValue) {
        return kv_plan(n, sqe, max_io_size);
    }
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

/// The NVMe status for a failed device operation.
pub fn status_for_errno(errno: i32, plan: Option<IoPlan>) -> Status {
    match errno {
        // A KV value's blocks read as never written: a miss, not a fault.
        crate::bdev::ERRNO_UNWRITTEN if matches!(plan, Some(IoPlan::KvRetrieve { .. })) => {
            Status::KV_KEY_DOES_NOT_EXIST
        }
        crate::bdev::ERRNO_UNWRITTEN => Status::DEALLOCATED_OR_UNWRITTEN,
        crate::bdev::ERRNO_NO_SPACE => Status::CAPACITY_EXCEEDED,
        libc::ENXIO => Status::INVALID_NAMESPACE,
        _ => match plan {
            Some(IoPlan::Read { .. }) => Status::UNRECOVERED_READ_ERROR,
            Some(IoPlan::Write { .. }) => Status::WRITE_FAULT,
            Some(IoPlan::KvRetrieve { .. }) => Status::KV_UNRECOVERED_ERROR,
            Some(IoPlan::KvStore { .. }) => Status::WRITE_FAULT,
            _ => Status::INTERNAL_ERROR,
        },
    }
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
    use crate::bdev::ram::RamDevice;
    use crate::wire::nvme::SglDescriptor;
    use proptest::prelude::*;

    fn ns() -> Namespace {
        Namespace::new("nqn.s", 1, RamDevice::new("r", 1 << 20).unwrap(), 512)
    }

    fn rw(opc: u8, slba: u64, nlb: u32, sgl: u32) -> Sqe {
        let mut s = Sqe::new(opc, 1, 1);
        s.set_cdw(10, slba as u32);
        s.set_cdw(11, (slba >> 32) as u32);
        s.set_cdw(12, nlb - 1);
        s.set_sgl(SglDescriptor {
            address: 0,
            length: sgl,
            type_byte: SglDescriptor::TRANSPORT,
        });
        s
    }

    #[test]
    fn read_write_checks() {
        let n = ns();
        assert_eq!(
            plan(Some(&n), &rw(io_opc::READ, 2, 8, 4096), 1 << 20),
            Ok(IoPlan::Read {
                offset: 1024,
                len: 4096
            })
        );
        assert_eq!(
            plan(Some(&n), &rw(io_opc::READ, 2047, 2, 1024), 1 << 20),
            Err(Status::LBA_OUT_OF_RANGE)
        );
        assert_eq!(
            plan(Some(&n), &rw(io_opc::WRITE, 0, 8, 512), 1 << 20),
            Err(Status::DATA_SGL_LENGTH_INVALID)
        );
        assert_eq!(
            plan(Some(&n), &rw(io_opc::WRITE, 0, 2048, 1 << 20), 4096),
            Err(Status::INVALID_FIELD)
        );
        assert_eq!(
            plan(None, &rw(io_opc::READ, 0, 1, 512), 1 << 20),
            Err(Status::INVALID_NAMESPACE)
        );
        assert_eq!(
            plan(Some(&n), &rw(0x99, 0, 1, 512), 1 << 20),
            Err(Status::INVALID_OPCODE)
        );
        assert_eq!(
            plan(Some(&n), &rw(io_opc::READ, u64::MAX, 2, 1024), 1 << 20),
            Err(Status::LBA_OUT_OF_RANGE)
        );
    }

    #[test]
    fn dsm_ranges_checked() {
        let n = ns();
        let mut d = vec![0u8; 32];
        DsmRange {
            attributes: 0,
            nlb: 8,
            slba: 16,
        }
        .encode(&mut d[0..16]);
        DsmRange {
            attributes: 0,
            nlb: 1,
            slba: 4096,
        }
        .encode(&mut d[16..32]);
        assert_eq!(dsm_ranges(&n, &d, 1), Ok(vec![(8192, 4096)]));
        assert_eq!(dsm_ranges(&n, &d, 2), Err(Status::LBA_OUT_OF_RANGE));
        assert_eq!(
            dsm_ranges(&n, &d[..16], 2),
            Err(Status::DATA_SGL_LENGTH_INVALID)
        );
    }

    proptest! {
        /// Any SQE against a KV namespace: a plan within the namespace's
        /// value limit, or a status; never a panic.
        #[test]
        fn kv_plan_never_panics(raw in proptest::array::uniform32(any::<u8>()), raw2 in proptest::array::uniform32(any::<u8>())) {
            let mut n = ns();
            n.command_set = CommandSet::KeyValue;
            let mut b = [0u8; 64];
            b[..32].copy_from_slice(&raw);
            b[32..].copy_from_slice(&raw2);
            let sqe = Sqe(b);
            match plan(Some(&n), &sqe, 1 << 20) {
                Ok(IoPlan::KvStore { len, key, .. }) => {
                    prop_assert!(len as u64 <= n.dev.size_bytes() && len <= 1 << 20);
                    prop_assert!(sqe.sgl().length >= len);
                    prop_assert!((1..=16).contains(&key.len()));
                }
                Ok(IoPlan::KvRetrieve { buf, .. }) => prop_assert!(buf <= sqe.sgl().length),
                Ok(IoPlan::KvList { buf, .. }) => prop_assert!(buf >= 4),
                Ok(p) => {
                    let flush = matches!(p, IoPlan::Flush { .. });
                    prop_assert!(p.is_kv() || flush, "{:?}", p);
                }
                Err(_) => {}
            }
        }

        #[test]
        fn plan_never_panics_and_stays_in_bounds(raw in proptest::array::uniform32(any::<u8>()), raw2 in proptest::array::uniform32(any::<u8>())) {
            let n = ns();
            let mut b = [0u8; 64];
            b[..32].copy_from_slice(&raw);
            b[32..].copy_from_slice(&raw2);
            let sqe = Sqe(b);
            if let Ok(p) = plan(Some(&n), &sqe, 1 << 20) {
                let size = n.dev.size_bytes();
                match p {
                    IoPlan::Read { offset, len } | IoPlan::Write { offset, len, .. } => prop_assert!(offset + len as u64 <= size),
                    IoPlan::WriteZeroes { offset, len, .. } => prop_assert!(offset + len <= size),
                    _ => {}
                }
            }
        }
    }
}
