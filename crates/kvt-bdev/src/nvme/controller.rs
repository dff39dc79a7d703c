//! One NVMe controller driven from user space: bring-up (disable, admin queue,
//! enable), Identify, queue count, I/O queue creation/deletion for the channels,
//! abort, reset after a failure, and normal shutdown so the kernel driver can take
//! the controller back.

use super::error::NvmeError;
use super::queue::HwQueue;
use super::spec::{admin, reg, Cap, ControllerInfo, Cqe, NamespaceInfo, Sqe};
use super::vfio::{Bar, Vfio};
use kvt_mem::{dma, IoBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

/// Admin queue entries.
const ADMIN_QUEUE_ENTRIES: u16 = 32;
/// Longest an admin command may take before the controller is reset.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);
/// I/O queue pairs asked for (one per reactor plus the pools' own channels).
const IO_QUEUES_WANTED: u16 = 64;
/// Entries per I/O queue (capped by CAP.MQES).
pub const IO_QUEUE_ENTRIES: u16 = 256;
/// Largest transfer per command we build (one PRP list page covers it).
pub const MAX_TRANSFER_BYTES: u64 = 1 << 20;

struct AdminState {
    q: HwQueue,
    /// 4 KiB of DMA memory for Identify data.
    scratch: IoBuf,
    next_cid: u16,
}

pub struct Controller {
    pub bdf: String,
    vfio: Vfio,
    bar: Bar,
    pub cap: Cap,
    pub info: ControllerInfo,
    admin: Mutex<AdminState>,
    /// I/O queue ids in use (index = qid).
    qids: Mutex<Vec<bool>>,
    /// Bumped by every reset: channels recreate their queues when it moves.
    generation: AtomicU64,
    gone: AtomicBool,
    shut_down: AtomicBool,
    pub io_queue_entries: u16,
    pub max_transfer_bytes: u64,
}

static CONTROLLERS: Mutex<Vec<Weak<Controller>>> = Mutex::new(Vec::new());

fn registry() -> MutexGuard<'static, Vec<Weak<Controller>>> {
    CONTROLLERS.lock().unwrap_or_else(|p| p.into_inner())
}

impl Controller {
    /// The controller at `bdf`, opened on first use and shared by every device
    /// (namespace) on it.
    pub fn get(bdf: &str) -> Result<Arc<Controller>, NvmeError> {
        let mut reg = registry();
        reg.retain(|w| w.strong_count() > 0);
        if let Some(c) = reg.iter().filter_map(Weak::upgrade).find(|c| c.bdf == bdf) {
            return Ok(c);
        }
        let c = Arc::new(Controller::open(bdf)?);
        reg.push(Arc::downgrade(&c));
        Ok(c)
    }

    fn open(bdf: &str) -> Result<Controller, NvmeError> {
        let vfio = Vfio::open(bdf)?;
        let bar = vfio.bar();
        let cap = Cap::parse(bar.read64(reg::CAP));
        if !cap.nvm_command_set {
            return Err(NvmeError::NoNvmCommandSet(bdf.to_string()));
        }
        if cap.mps_min_bytes > 4096 {
            return Err(NvmeError::PageSize {
                bdf: bdf.to_string(),
                bytes: cap.mps_min_bytes,
            });
        }
        let q = HwQueue::new(bar, &cap, 0, ADMIN_QUEUE_ENTRIES)?;
        let st = AdminState {
            q,
            scratch: IoBuf::new(4096),
            next_cid: 0,
        };
        let vs = bar.read32(reg::VS);
        let mut c = Controller {
            bdf: bdf.to_string(),
            vfio,
            bar,
            cap,
            info: ControllerInfo::parse(&[0u8; 4096]).map_err(|source| NvmeError::Identify {
                bdf: bdf.to_string(),
                source,
            })?,
            admin: Mutex::new(st),
            qids: Mutex::new(Vec::new()),
            generation: AtomicU64::new(0),
            gone: AtomicBool::new(false),
            shut_down: AtomicBool::new(false),
            io_queue_entries: IO_QUEUE_ENTRIES.min(cap.mqes.min(u16::MAX as u32) as u16),
            max_transfer_bytes: MAX_TRANSFER_BYTES,
        };
        let (data, nq) = {
            let mut st = c.lock_admin();
            c.enable(&mut st)?;
            let data = c.identify(&mut st, admin::CNS_CONTROLLER, 0)?;
            let nq = c.set_queue_count(&mut st)?;
            (data, nq)
        };
        c.info = ControllerInfo::parse(&data).map_err(|source| NvmeError::Identify {
            bdf: bdf.to_string(),
            source,
        })?;
        c.qids = Mutex::new(vec![false; nq as usize + 1]);
        c.max_transfer_bytes = c
            .info
            .max_transfer_bytes(cap.mps_min_bytes, MAX_TRANSFER_BYTES);
        tracing::info!(
            pci = bdf,
            model = %c.info.model,
            serial = %c.info.serial,
            version = format!("{}.{}", vs >> 16, (vs >> 8) & 0xff),
            io_queues = nq,
            queue_entries = c.io_queue_entries,
            max_transfer = c.max_transfer_bytes,
            oncs = c.info.oncs,
            vwc = c.info.vwc,
            sgl = c.info.supports_sgl(),
            hugepages = dma::uses_hugepages(),
            "NVMe controller ready"
        );
        Ok(c)
    }

    fn lock_admin(&self) -> MutexGuard<'_, AdminState> {
        self.admin.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn csts(&self) -> u32 {
        self.bar.read32(reg::CSTS)
    }

    /// True once the controller is known to have left the bus.
    pub fn is_gone(&self) -> bool {
        if self.gone.load(Ordering::Acquire) {
            return true;
        }
        if self.csts() == reg::GONE {
            tracing::error!(pci = %self.bdf, "controller no longer responds (surprise removal?)");
            self.gone.store(true, Ordering::Release);
            return true;
        }
        false
    }

    /// True when the controller reports a fatal status.
    pub fn is_fatal(&self) -> bool {
        let s = self.csts();
        s != reg::GONE && s & reg::CSTS_CFS != 0
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::Acquire)
    }

    fn wait_ready(&self, want: bool) -> Result<(), NvmeError> {
        let start = Instant::now();
        let limit = Duration::from_millis(self.cap.timeout_ms);
        loop {
            let s = self.csts();
            if s == reg::GONE {
                self.gone.store(true, Ordering::Release);
                return Err(NvmeError::Gone(self.bdf.clone()));
            }
            if want && s & reg::CSTS_CFS != 0 {
                return Err(NvmeError::FatalWhileEnabling(self.bdf.clone()));
            }
            if (s & reg::CSTS_RDY != 0) == want {
                return Ok(());
            }
            if start.elapsed() > limit {
                return Err(NvmeError::ReadyTimeout {
                    bdf: self.bdf.clone(),
                    want: want as u8,
                    timeout_ms: self.cap.timeout_ms,
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn disable(&self) -> Result<(), NvmeError> {
        let cc = self.bar.read32(reg::CC);
        if cc & reg::CC_EN != 0 {
            self.bar.write32(reg::CC, cc & !reg::CC_EN);
        }
        self.wait_ready(false)
    }

    /// Disables, programs the admin queue and enables the controller.
    fn enable(&self, st: &mut AdminState) -> Result<(), NvmeError> {
        self.disable()?;
        st.q.reset();
        let n = (ADMIN_QUEUE_ENTRIES - 1) as u32;
        self.bar.write32(reg::AQA, n << 16 | n);
        self.bar.write64(reg::ASQ, st.q.sq_iova);
        self.bar.write64(reg::ACQ, st.q.cq_iova);
        // No interrupts are used: mask them all (pin-based; MSI-X is never enabled).
        self.bar.write32(reg::INTMS, u32::MAX);
        self.bar
            .write32(reg::CC, reg::CC_EN | reg::CC_IOSQES_IOCQES);
        self.wait_ready(true)
    }

    /// Runs one admin command to completion (the admin lock serialises them).
    fn admin_locked(
        &self,
        st: &mut AdminState,
        mut sqe: Sqe,
        data: bool,
    ) -> Result<Cqe, NvmeError> {
        if self.gone.load(Ordering::Acquire) {
            return Err(NvmeError::Gone(self.bdf.clone()));
        }
        let cid = st.next_cid;
        st.next_cid = st.next_cid.wrapping_add(1);
        sqe.set_cid(cid);
        if data {
            let iova = dma::iova(st.scratch.as_ptr(), 4096)
                .ok_or(NvmeError::NotDmaMapped("admin scratch page"))?;
            sqe.set_prp(iova, 0);
        }
        st.q.push(sqe);
        st.q.ring_sq();
        let start = Instant::now();
        loop {
            if let Some(c) = st.q.next_cqe() {
                st.q.ring_cq();
                if c.cid != cid {
                    // A late completion of an earlier (timed-out) command.
                    continue;
                }
                if !c.ok() {
                    return Err(NvmeError::AdminFailed {
                        bdf: self.bdf.clone(),
                        opcode: sqe.opcode(),
                        status: c.status,
                    });
                }
                return Ok(c);
            }
            if start.elapsed() > ADMIN_TIMEOUT {
                let err = NvmeError::AdminTimeout {
                    bdf: self.bdf.clone(),
                    opcode: sqe.opcode(),
                };
                tracing::error!("{err}");
                if let Err(e) = self.reset_locked(st) {
                    tracing::error!("{e}");
                }
                return Err(err);
            }
            if self.is_gone() {
                return Err(NvmeError::Gone(self.bdf.clone()));
            }
            std::hint::spin_loop();
        }
    }

    fn identify(&self, st: &mut AdminState, cns: u32, nsid: u32) -> Result<Vec<u8>, NvmeError> {
        st.scratch.fill(0);
        self.admin_locked(st, Sqe::new(admin::IDENTIFY, nsid).cdw(0, cns), true)?;
        Ok(st.scratch[..4096].to_vec())
    }

    fn set_queue_count(&self, st: &mut AdminState) -> Result<u16, NvmeError> {
        let n = (IO_QUEUES_WANTED - 1) as u32;
        let c = self.admin_locked(
            st,
            Sqe::new(admin::SET_FEATURES, 0)
                .cdw(0, admin::FEAT_NUMBER_OF_QUEUES)
                .cdw(1, n << 16 | n),
            false,
        )?;
        let nsq = (c.result & 0xffff) as u16 + 1;
        let ncq = (c.result >> 16) as u16 + 1;
        Ok(nsq.min(ncq).min(IO_QUEUES_WANTED))
    }

    pub fn identify_namespace(&self, nsid: u32) -> Result<NamespaceInfo, NvmeError> {
        if nsid == 0 || nsid > self.info.nn {
            return Err(NvmeError::NoNamespace {
                bdf: self.bdf.clone(),
                nsid,
                count: self.info.nn,
            });
        }
        let mut st = self.lock_admin();
        let data = self.identify(&mut st, admin::CNS_NAMESPACE, nsid)?;
        NamespaceInfo::parse(&data).map_err(|source| NvmeError::IdentifyNamespace {
            bdf: self.bdf.clone(),
            nsid,
            source,
        })
    }

    /// Reserves an I/O queue id.
    pub fn alloc_qid(&self) -> Option<u16> {
        let mut q = self.qids.lock().unwrap_or_else(|p| p.into_inner());
        let i = q.iter().skip(1).position(|u| !u)? + 1;
        q[i] = true;
        Some(i as u16)
    }

    pub fn free_qid(&self, qid: u16) {
        let mut q = self.qids.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(u) = q.get_mut(qid as usize) {
            *u = false;
        }
    }

    /// Creates `q` on the controller (CQ, then SQ bound to it), polled: no
    /// interrupt vector. Returns the generation the queue belongs to.
    pub fn create_io_queue(&self, q: &mut HwQueue) -> Result<u64, NvmeError> {
        let mut st = self.lock_admin();
        q.reset();
        let qid = q.qid as u32;
        let size = (q.size as u32 - 1) << 16;
        let cq = Sqe::new(admin::CREATE_IO_CQ, 0)
            .cdw(0, size | qid)
            .cdw(1, 1); // PC = 1, IEN = 0
        let mut cq = cq;
        cq.set_prp(q.cq_iova, 0);
        self.admin_locked(&mut st, cq, false)?;
        let mut sq = Sqe::new(admin::CREATE_IO_SQ, 0)
            .cdw(0, size | qid)
            .cdw(1, qid << 16 | 1); // CQID, PC = 1
        sq.set_prp(q.sq_iova, 0);
        if let Err(e) = self.admin_locked(&mut st, sq, false) {
            let _ = self.admin_locked(&mut st, Sqe::new(admin::DELETE_IO_CQ, 0).cdw(0, qid), false);
            return Err(e);
        }
        Ok(self.generation())
    }

    /// Deletes queue `qid` (SQ first, as the spec requires).
    pub fn delete_io_queue(&self, qid: u16) -> Result<(), NvmeError> {
        if self.is_shut_down() || self.gone.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut st = self.lock_admin();
        let q = qid as u32;
        self.admin_locked(&mut st, Sqe::new(admin::DELETE_IO_SQ, 0).cdw(0, q), false)?;
        self.admin_locked(&mut st, Sqe::new(admin::DELETE_IO_CQ, 0).cdw(0, q), false)?;
        Ok(())
    }

    /// Asks the controller to abort command `cid` on queue `sqid`.
    pub fn abort(&self, sqid: u16, cid: u16) -> Result<(), NvmeError> {
        let mut st = self.lock_admin();
        self.admin_locked(
            &mut st,
            Sqe::new(admin::ABORT, 0).cdw(0, (cid as u32) << 16 | sqid as u32),
            false,
        )
        .map(|_| ())
    }

    /// Resets the controller unless another channel already did since it saw
    /// generation `seen`. Every I/O queue is gone afterwards; channels notice the
    /// new generation, fail what they had in flight and recreate their queues.
    pub fn reset(&self, seen: u64) -> Result<(), NvmeError> {
        let mut st = self.lock_admin();
        if self.generation() != seen {
            return Ok(());
        }
        self.reset_locked(&mut st)
    }

    fn reset_locked(&self, st: &mut AdminState) -> Result<(), NvmeError> {
        tracing::warn!(pci = %self.bdf, "resetting the controller");
        // Bump first: even if re-enabling fails, no channel keeps waiting on
        // commands the disabled controller will never complete.
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.enable(st)?;
        let n = self.set_queue_count(st)?;
        tracing::info!(pci = %self.bdf, io_queues = n, "controller reset done");
        Ok(())
    }

    /// Normal shutdown (CC.SHN), then disable: the state the kernel driver expects
    /// to find. Idempotent.
    pub fn shutdown(&self) {
        if self.shut_down.swap(true, Ordering::AcqRel) || self.is_gone() {
            return;
        }
        let _st = self.lock_admin();
        let cc = self.bar.read32(reg::CC);
        self.bar
            .write32(reg::CC, (cc & !reg::CC_SHN_MASK) | reg::CC_SHN_NORMAL);
        let start = Instant::now();
        let limit = Duration::from_millis(self.cap.timeout_ms.max(2000));
        loop {
            let s = self.csts();
            if s == reg::GONE || s & reg::CSTS_SHST_MASK == reg::CSTS_SHST_COMPLETE {
                break;
            }
            if start.elapsed() > limit {
                tracing::warn!(pci = %self.bdf, "shutdown did not complete; disabling anyway");
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        if let Err(e) = self.disable() {
            tracing::warn!("{e}");
        }
        tracing::info!(pci = %self.bdf, "controller shut down");
    }

    pub fn bar(&self) -> Bar {
        self.bar
    }

    pub fn vfio(&self) -> &Vfio {
        &self.vfio
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Shuts down every controller still open (at process exit, even if some device
/// reference outlives the server).
pub fn shutdown_all() {
    let reg = registry();
    for c in reg.iter().filter_map(Weak::upgrade) {
        c.shutdown();
    }
}
