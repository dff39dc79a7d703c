//! I/O commands: the parse step of an I/O queue, which checks a command
//! against its namespace and picks the handler of the namespace's command set
//! (the NVM command set in `nvm`, Key Value in `kv`; Linux nvmet's
//! `nvmet_parse_io_cmd`), and what both share: the checked plan, the
//! statuses of failed device operations, and what a handler hands back.

pub mod kv;
pub mod nvm;
pub mod reservation;

use super::command::{DeviceErrors, DeviceOps, Submitted};
use super::ns_table::NsTable;
pub use super::plan::{IoPlan, KvStage};
use super::request::Handler;
use super::{CommandSet, Namespace};
use kvt_wire::nvme::{io_opc, Sqe, Status};
pub use nvm::{dsm_ranges, dsm_ranges_into};

/// The parse step of an I/O queue: checks `sqe` against its namespace (`None`
/// when the NSID names no active one) and picks the handler of the
/// namespace's command set. `kv_enabled`: the controller enabled the KV
/// command set (CC.CSS); `write_cache`: the controller's volatile write cache
/// is on.
pub fn parse(
    ns: Option<&Namespace>,
    sqe: &Sqe,
    max_io_size: u32,
    kv_enabled: bool,
    write_cache: bool,
) -> Result<(Handler, IoPlan), Status> {
    if !kv_enabled && ns.is_some_and(|n| n.command_set == CommandSet::KeyValue) {
        // A host that enabled only the NVM command set (CC.CSS = 000b) does
        // not see this namespace as active.
        return Err(Status::IOCS_NOT_ENABLED);
    }
    if reservation::is_reservation(sqe.opcode()) && sqe.fuse() == 0 {
        return Ok((Handler::Reservation, reservation::plan(ns, sqe)?));
    }
    let mut p = plan(ns, sqe, max_io_size)?;
    if let IoPlan::Write { fua: d, .. }
    | IoPlan::KvStore { durable: d, .. }
    | IoPlan::KvDelete { durable: d, .. } = &mut p
    {
        // Without a volatile write cache (the namespace has none, or the host
        // turned the controller's off) a write is durable before its
        // completion.
        *d |= ns.is_some_and(|n| n.write_through) || !write_cache;
    }
    // A plan of the KV command set runs in `kv`, the rest (Flush too, which
    // both command sets share) in `nvm`.
    let handler = if p.is_kv() { Handler::Kv } else { Handler::Nvm };
    Ok((handler, p))
}

/// Decodes and checks an I/O command against its namespace, by the
/// namespace's command set. `ns` is `None` when the NSID names no active
/// namespace.
pub fn plan(ns: Option<&Namespace>, sqe: &Sqe, max_io_size: u32) -> Result<IoPlan, Status> {
    if sqe.fuse() != 0 {
        return Err(Status::INVALID_FIELD);
    }
    if sqe.opcode() == io_opc::FLUSH && sqe.nsid() == 0xFFFF_FFFF {
        return Ok(IoPlan::Flush { all: true });
    }
    match ns {
        Some(n) if n.command_set == CommandSet::KeyValue => kv::plan(n, sqe, max_io_size),
        _ => nvm::plan(ns, sqe, max_io_size),
    }
}

/// What an I/O handler hands back to its queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Device operations went out: the command completes when they do (with
    /// `failure` if some were refused). None went out: it fails at once.
    Submitted(Submitted),
    /// The command is done: answer it now.
    Complete { status: Status, result: u64 },
}

impl Outcome {
    pub const SUCCESS: Outcome = Outcome::Complete {
        status: Status::SUCCESS,
        result: 0,
    };
}

/// The queue's resources an I/O handler works with.
pub struct IoEnv<'a> {
    /// The namespaces the queue sees.
    pub ns: &'a NsTable,
    /// Reused for every command's device operations (no allocation per I/O).
    pub ops: &'a mut DeviceOps,
    /// The queue's failed device operations (rate-limited logging).
    pub errors: &'a mut DeviceErrors,
    /// The command's tag for its device operations.
    pub tag: u64,
    /// Reads go to a buffer the transport placed (NVMe/RDMA).
    pub places_read_buffers: bool,
}

/// Data the host sends for a command with in-capsule or R2T data.
pub fn host_data_len(sqe: &Sqe) -> usize {
    sqe.sgl().length as usize
}

/// The NVMe status for a failed device operation.
pub fn status_for_errno(errno: i32, plan: Option<IoPlan>) -> Status {
    match errno {
        // A KV value's blocks read as never written: a miss, not a fault.
        kvt_bdev::ERRNO_UNWRITTEN if matches!(plan, Some(IoPlan::KvRetrieve { .. })) => {
            Status::KV_KEY_DOES_NOT_EXIST
        }
        kvt_bdev::ERRNO_UNWRITTEN => Status::DEALLOCATED_OR_UNWRITTEN,
        kvt_bdev::ERRNO_NO_SPACE => Status::CAPACITY_EXCEEDED,
        libc::ENXIO => Status::INVALID_NAMESPACE,
        kvt_bdev::ERRNO_DETACHED => crate::ana::ASYMMETRIC_ACCESS_INACCESSIBLE,
        _ => match plan {
            Some(IoPlan::Read { .. }) => Status::UNRECOVERED_READ_ERROR,
            Some(IoPlan::Write { .. }) => Status::WRITE_FAULT,
            Some(IoPlan::KvRetrieve { .. }) => Status::KV_UNRECOVERED_ERROR,
            Some(IoPlan::KvStore { .. }) => Status::WRITE_FAULT,
            _ => Status::INTERNAL_ERROR,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvt_bdev::ram::RamDevice;
    use kvt_wire::nvme::DsmRange;
    use kvt_wire::nvme::SglDescriptor;
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
