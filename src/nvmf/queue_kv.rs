//! KV command set I/O on a queue: Store, Retrieve, Delete, Exist and List
//! against a KV namespace's key index (`pool::kv`), with the values in its
//! volume's blocks. A command runs in steps; each step's device operation
//! (a volume write, read or flush) completes into the next
//! (`Queue::kv_step_done`). The index answers at once, so Exist, List and a
//! Delete without a volatile write cache to honour need no device at all.

use super::{Link, Queue};
use crate::bdev::IoOp;
use crate::mem::IoBuf;
use crate::nvmf::command;
use crate::nvmf::io::{self as tio, IoPlan, KvStage};
use crate::pool::kv::{KvIndex, KvLoc, Reserve};
use crate::reactor::IoCtx;
use crate::wire::nvme::{encode_list_response, list_entry_len, Status};
use std::sync::Arc;

/// Commits a Store waits for before it fails with Capacity Exceeded (each
/// frees what other keys gave up since the last).
const SPACE_TRIES: u8 = 4;

impl<X> Queue<X> {
    fn kv_index(&self, nsid: u32) -> Result<(Arc<KvIndex>, u32), Status> {
        let ns = self.ns.get(nsid).ok_or(Status::INVALID_NAMESPACE)?;
        // One Arc clone per step: the index outlives a namespace removed
        // while the command runs.
        let kv = ns.kv.clone().ok_or(Status::INTERNAL_ERROR)?;
        Ok((kv, ns.block_size))
    }

    fn set_plan(&mut self, slot: u16, plan: IoPlan) {
        if let Some(r) = self.request_mut(slot) {
            r.plan = Some(plan);
        }
    }

    /// Submits one device operation for `slot`'s KV command.
    fn kv_submit(&mut self, slot: u16, nsid: u32, op: IoOp, ctx: &mut IoCtx) -> Result<(), Status> {
        let tag = ctx.tag(slot);
        let mut ops = std::mem::take(&mut self.ops_scratch);
        ops.push((nsid, op));
        let sent = command::submit(
            &mut ops,
            tag,
            &self.ns,
            ctx.channels,
            ctx.bufs,
            &mut self.device_errors,
            ctx.now,
        );
        self.ops_scratch = ops;
        if sent.ops == 0 {
            return Err(sent.failure.unwrap_or(Status::INTERNAL_ERROR));
        }
        self.dev_ops += 1;
        if let Some(r) = self.request_mut(slot) {
            r.pending_ops = 1;
        }
        Ok(())
    }

    /// Starts (or, after a commit freed space, resumes) a KV command.
    pub(super) fn execute_kv<L: Link<X>>(
        &mut self,
        slot: u16,
        link: &mut L,
        ctx: &mut IoCtx,
    ) -> Result<(), Status> {
        let (plan, nsid) = match self.request(slot) {
            Some(r) => (r.plan.ok_or(Status::INTERNAL_ERROR)?, r.sqe.nsid()),
            None => return Err(Status::INTERNAL_ERROR),
        };
        let (kv, bs) = self.kv_index(nsid)?;
        if let Some(r) = self.request_mut(slot) {
            if r.kv.is_none() {
                r.kv = Some(kv.clone());
            }
        }
        match plan {
            IoPlan::KvStore {
                key,
                len,
                opts,
                durable,
                stage,
            } => {
                let tries = match stage {
                    KvStage::Space { tries } => tries,
                    _ => 0,
                };
                match kv.reserve(&key, len, opts, ctx.now)? {
                    Reserve::AfterCommit if tries >= SPACE_TRIES => Err(Status::CAPACITY_EXCEEDED),
                    Reserve::AfterCommit => {
                        // The commit a volume flush makes frees the blocks.
                        let space = KvStage::Space { tries: tries + 1 };
                        self.set_plan(slot, with_stage(plan, space));
                        self.kv_submit(slot, nsid, IoOp::Flush, ctx)
                    }
                    Reserve::Ready(loc) if loc.nblocks == 0 => {
                        kv.commit_store(&key, loc, opts, ctx.now)?;
                        self.kv_stored(slot, nsid, plan, durable, link, ctx)
                    }
                    Reserve::Claimed(loc) => {
                        self.set_plan(slot, with_stage(plan, KvStage::Claimed(loc)));
                        self.kv_submit(slot, nsid, IoOp::Flush, ctx)
                            .inspect_err(|_| kv.abort_claim(&key, loc))
                    }
                    Reserve::Ready(loc) => self.kv_write_value(slot, nsid, plan, &kv, loc, ctx),
                }
            }
            IoPlan::KvRetrieve { key, buf, .. } => {
                let (pin, loc) = kv.begin_read(&key, ctx.now)?;
                let xfer = buf.min(loc.len);
                if xfer == 0 {
                    // HBS 0 (or an empty value): only the size is asked for.
                    kv.end_read(pin);
                    let sent = with_stage(plan, KvStage::Sent { xfer: 0 });
                    self.set_plan(slot, sent);
                    self.finish(slot, Status::SUCCESS, loc.len as u64, link, ctx);
                    return Ok(());
                }
                // Whole blocks from the device; the host gets `xfer` bytes.
                let read_len = (xfer as usize).div_ceil(bs as usize) * bs as usize;
                let mut rbuf = ctx.bufs.get(read_len);
                rbuf.set_len(read_len);
                if rbuf.len() < read_len {
                    ctx.bufs.put(rbuf);
                    kv.end_read(pin);
                    return Err(Status::INTERNAL_ERROR);
                }
                let reading = KvStage::Read {
                    pin,
                    xfer,
                    len: loc.len,
                };
                self.set_plan(slot, with_stage(plan, reading));
                let op = IoOp::Read {
                    offset: loc.block * bs as u64,
                    buf: rbuf,
                };
                self.kv_submit(slot, nsid, op, ctx)
                    .inspect_err(|_| kv.end_read(pin))
            }
            IoPlan::KvDelete { key, durable, .. } => {
                kv.delete(&key, ctx.now)?;
                if durable {
                    self.set_plan(slot, with_stage(plan, KvStage::Durable));
                    return self.kv_submit(slot, nsid, IoOp::Flush, ctx);
                }
                self.finish(slot, Status::SUCCESS, 0, link, ctx);
                Ok(())
            }
            IoPlan::KvExist { key } => {
                let st = if kv.exists(&key, ctx.now) {
                    Status::SUCCESS
                } else {
                    Status::KV_KEY_DOES_NOT_EXIST
                };
                self.finish(slot, st, 0, link, ctx);
                Ok(())
            }
            IoPlan::KvList { start, buf } => {
                // At most as many keys as the buffer could hold at their smallest.
                let most = (buf as usize).saturating_sub(4) / list_entry_len(1);
                let keys = kv.list(&start, most, ctx.now);
                let (data, n) = encode_list_response(keys.iter(), buf as usize);
                if let Some(r) = self.request_mut(slot) {
                    r.reply = Some(data);
                }
                self.finish(slot, Status::SUCCESS, n as u64, link, ctx);
                Ok(())
            }
            _ => Err(Status::INTERNAL_ERROR),
        }
    }

    /// Writes a Store's value into the blocks `loc` reserved for it (given
    /// back if the write cannot be submitted).
    fn kv_write_value(
        &mut self,
        slot: u16,
        nsid: u32,
        plan: IoPlan,
        kv: &KvIndex,
        loc: KvLoc,
        ctx: &mut IoCtx,
    ) -> Result<(), Status> {
        let IoPlan::KvStore { key, len, .. } = plan else {
            return Err(Status::INTERNAL_ERROR);
        };
        let bs = kv.block_size();
        let buf = match self.value_buffer(slot, len as usize, loc, bs, ctx) {
            Ok(b) => b,
            Err(e) => {
                kv.abort_store(&key, loc);
                return Err(e);
            }
        };
        self.set_plan(slot, with_stage(plan, KvStage::Write(loc)));
        let op = IoOp::Write {
            offset: loc.block * bs as u64,
            buf,
            fua: false,
        };
        self.kv_submit(slot, nsid, op, ctx)
            .inspect_err(|_| kv.abort_store(&key, loc))
    }

    /// The host's value as a whole number of blocks: its buffer when that has
    /// room for the padding, else a copy. The padding reads back as zeros.
    fn value_buffer(
        &mut self,
        slot: u16,
        len: usize,
        loc: KvLoc,
        bs: u32,
        ctx: &mut IoCtx,
    ) -> Result<IoBuf, Status> {
        let whole = loc.nblocks as usize * bs as usize;
        let r = self.request_mut(slot).ok_or(Status::INTERNAL_ERROR)?;
        let mut data = r.buf.take().ok_or(Status::DATA_TRANSFER_ERROR)?;
        if data.len() < len {
            r.buf = Some(data);
            return Err(Status::DATA_SGL_LENGTH_INVALID);
        }
        if data.is_owned() && data.capacity() >= whole {
            data.set_len(whole);
            data[len..whole].fill(0);
            return Ok(data);
        }
        let mut b = ctx.bufs.get(whole);
        b.set_len(whole);
        if b.len() < whole {
            ctx.bufs.put(b);
            r.buf = Some(data);
            return Err(Status::INTERNAL_ERROR);
        }
        b[..len].copy_from_slice(&data[..len]);
        b[len..whole].fill(0);
        if data.is_owned() {
            ctx.bufs.put(data);
        } else {
            // A view into the transport's memory stays with the request.
            r.buf = Some(data);
        }
        Ok(b)
    }

    /// A Store is in the index: commit it first if there is no volatile write
    /// cache, else answer.
    fn kv_stored<L: Link<X>>(
        &mut self,
        slot: u16,
        nsid: u32,
        plan: IoPlan,
        durable: bool,
        link: &mut L,
        ctx: &mut IoCtx,
    ) -> Result<(), Status> {
        if durable {
            self.set_plan(slot, with_stage(plan, KvStage::Durable));
            return self.kv_submit(slot, nsid, IoOp::Flush, ctx);
        }
        self.finish(slot, Status::SUCCESS, 0, link, ctx);
        Ok(())
    }

    /// A KV command's device operation finished.
    pub(super) fn kv_step_done<L: Link<X>>(
        &mut self,
        slot: u16,
        result: Result<(), i32>,
        buf: Option<IoBuf>,
        link: &mut L,
        ctx: &mut IoCtx,
    ) {
        let Some(r) = self.request_mut(slot) else {
            if let Some(b) = buf.filter(|b| b.is_owned()) {
                ctx.bufs.put(b);
            }
            return;
        };
        r.pending_ops = 0;
        let (plan, nsid, cid, opcode) = match r.plan {
            Some(p) => (p, r.sqe.nsid(), r.sqe.cid(), r.sqe.opcode()),
            None => return,
        };
        // The index the command started in, not the namespace table: blocks
        // or a pin taken there are released even if the namespace went.
        let held = r.kv.clone();
        if let Err(errno) = result {
            command::log_device_error(&mut self.device_errors, ctx.now, cid, opcode, errno);
        }
        let failed = result.err().map(|e| tio::status_for_errno(e, Some(plan)));
        let out = match held.ok_or(Status::INVALID_NAMESPACE) {
            Ok(kv) => self.kv_continue(slot, nsid, plan, &kv, failed, buf, link, ctx),
            Err(s) => {
                if let Some(b) = buf.filter(|b| b.is_owned()) {
                    ctx.bufs.put(b);
                }
                Err(s)
            }
        };
        if let Err(s) = out {
            self.finish(slot, s, 0, link, ctx);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn kv_continue<L: Link<X>>(
        &mut self,
        slot: u16,
        nsid: u32,
        plan: IoPlan,
        kv: &KvIndex,
        failed: Option<Status>,
        buf: Option<IoBuf>,
        link: &mut L,
        ctx: &mut IoCtx,
    ) -> Result<(), Status> {
        let mut buf = buf;
        let put_back = |b: Option<IoBuf>, ctx: &mut IoCtx| {
            if let Some(b) = b.filter(|b| b.is_owned()) {
                ctx.bufs.put(b);
            }
        };
        match plan {
            IoPlan::KvStore {
                key,
                opts,
                durable,
                stage,
                ..
            } => {
                put_back(buf.take(), ctx);
                match stage {
                    KvStage::Space { .. } => {
                        if let Some(s) = failed {
                            return Err(s);
                        }
                        self.execute_kv(slot, link, ctx)
                    }
                    KvStage::Claimed(loc) => {
                        if let Some(s) = failed {
                            kv.abort_claim(&key, loc);
                            return Err(s);
                        }
                        self.kv_write_value(slot, nsid, plan, kv, loc, ctx)
                    }
                    KvStage::Write(loc) => {
                        if let Some(s) = failed {
                            kv.abort_store(&key, loc);
                            return Err(s);
                        }
                        kv.commit_store(&key, loc, opts, ctx.now)?;
                        self.kv_stored(slot, nsid, plan, durable, link, ctx)
                    }
                    KvStage::Durable => {
                        self.finish(slot, failed.unwrap_or(Status::SUCCESS), 0, link, ctx);
                        Ok(())
                    }
                    _ => Err(Status::INTERNAL_ERROR),
                }
            }
            IoPlan::KvRetrieve {
                stage: KvStage::Read { pin, xfer, len },
                ..
            } => {
                kv.end_read(pin);
                if let Some(s) = failed {
                    put_back(buf, ctx);
                    return Err(s);
                }
                let rbuf = buf.ok_or(Status::INTERNAL_ERROR)?;
                let r = self.request_mut(slot).ok_or(Status::INTERNAL_ERROR)?;
                match r.buf.as_mut() {
                    // The transport placed the host's buffer (NVMe/RDMA).
                    Some(placed) => {
                        let n = xfer as usize;
                        if placed.len() < n || rbuf.len() < n {
                            put_back(Some(rbuf), ctx);
                            return Err(Status::INTERNAL_ERROR);
                        }
                        placed[..n].copy_from_slice(&rbuf[..n]);
                        put_back(Some(rbuf), ctx);
                    }
                    None => r.buf = Some(rbuf),
                }
                r.plan = Some(with_stage(plan, KvStage::Sent { xfer }));
                self.finish(slot, Status::SUCCESS, len as u64, link, ctx);
                Ok(())
            }
            IoPlan::KvDelete { .. } => {
                put_back(buf, ctx);
                self.finish(slot, failed.unwrap_or(Status::SUCCESS), 0, link, ctx);
                Ok(())
            }
            _ => {
                put_back(buf, ctx);
                Err(Status::INTERNAL_ERROR)
            }
        }
    }
}

/// `plan` at another stage.
fn with_stage(plan: IoPlan, to: KvStage) -> IoPlan {
    match plan {
        IoPlan::KvStore {
            key,
            len,
            opts,
            durable,
            ..
        } => IoPlan::KvStore {
            key,
            len,
            opts,
            durable,
            stage: to,
        },
        IoPlan::KvRetrieve { key, buf, .. } => IoPlan::KvRetrieve {
            key,
            buf,
            stage: to,
        },
        IoPlan::KvDelete { key, durable, .. } => IoPlan::KvDelete {
            key,
            durable,
            stage: to,
        },
        p => p,
    }
}
