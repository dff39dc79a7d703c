//! The Key Value command set: Store, Retrieve, Delete, Exist and List
//! against a KV namespace's key index, with the values in its volume's
//! blocks (Flush is the NVM command set's). A command runs in steps; each
//! step's device operation (a volume write, read or flush) completes into the
//! next (`step_done`). The index answers at once, so Exist, List and a Delete
//! without a volatile write cache to honour need no device at all.

use super::{status_for_errno, IoEnv, IoPlan, KvStage, Outcome};
use crate::bdev::IoOp;
use crate::mem::IoBuf;
use crate::nvmf::command;
use crate::nvmf::kv_index::{KeyIndex, KvLoc, Reserve};
use crate::nvmf::ns_table::NsTable;
use crate::nvmf::request::Request;
use crate::nvmf::Namespace;
use crate::reactor::IoCtx;
use crate::wire::nvme::{
    encode_list_response, list_entry_len, KvCommand, Sqe, Status, KV_LIST_MIN_BUFFER,
};
use std::sync::Arc;

/// Commits a Store waits for before it fails with Capacity Exceeded (each
/// frees what other keys gave up since the last).
const SPACE_TRIES: u8 = 4;

/// Decodes and checks a KV command set I/O command against its namespace.
pub(super) fn plan(ns: &Namespace, sqe: &Sqe, max_io_size: u32) -> Result<IoPlan, Status> {
    let sgl_len = sqe.sgl().length;
    Ok(
        match KvCommand::decode(sqe, ns.kv_value_max(max_io_size))? {
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

/// The key index of `nsid`'s namespace and its block size.
fn index(ns: &NsTable, nsid: u32) -> Result<(Arc<dyn KeyIndex>, u32), Status> {
    let ns = ns.get(nsid).ok_or(Status::INVALID_NAMESPACE)?;
    // One Arc clone per step: the index outlives a namespace removed while
    // the command runs.
    let kv = ns.kv.clone().ok_or(Status::INTERNAL_ERROR)?;
    Ok((kv, ns.block_size))
}

/// Submits one device operation for a KV command.
fn submit_one(
    env: &mut IoEnv<'_>,
    nsid: u32,
    op: IoOp,
    ctx: &mut IoCtx,
) -> Result<Outcome, Status> {
    env.ops.push((nsid, op));
    let sent = command::submit(
        env.ops,
        env.tag,
        env.ns,
        ctx.channels,
        ctx.bufs,
        env.errors,
        ctx.now,
    );
    if sent.ops == 0 {
        return Err(sent.failure.unwrap_or(Status::INTERNAL_ERROR));
    }
    Ok(Outcome::Submitted(sent))
}

/// Starts (or, after a commit freed space, resumes) a KV command.
pub fn execute<X>(
    r: &mut Request<X>,
    env: &mut IoEnv<'_>,
    ctx: &mut IoCtx,
) -> Result<Outcome, Status> {
    let (plan, nsid) = (r.plan.ok_or(Status::INTERNAL_ERROR)?, r.sqe.nsid());
    let (kv, bs) = index(env.ns, nsid)?;
    if r.kv.is_none() {
        r.kv = Some(kv.clone());
    }
    match plan {
        IoPlan::KvStore { .. } => store(r, env, plan, &*kv, ctx),
        IoPlan::KvRetrieve { key, buf, .. } => {
            let (pin, loc) = kv.begin_read(&key, ctx.now)?;
            let xfer = buf.min(loc.len);
            if xfer == 0 {
                // HBS 0 (or an empty value): only the size is asked for.
                kv.end_read(pin);
                r.plan = Some(with_stage(plan, KvStage::Sent { xfer: 0 }));
                return Ok(Outcome::Complete {
                    status: Status::SUCCESS,
                    result: loc.len as u64,
                });
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
            r.plan = Some(with_stage(plan, reading));
            let op = IoOp::Read {
                offset: loc.block * bs as u64,
                buf: rbuf,
            };
            submit_one(env, nsid, op, ctx).inspect_err(|_| kv.end_read(pin))
        }
        IoPlan::KvDelete { key, durable, .. } => {
            kv.delete(&key, ctx.now)?;
            if durable {
                r.plan = Some(with_stage(plan, KvStage::Durable));
                return submit_one(env, nsid, IoOp::Flush, ctx);
            }
            Ok(Outcome::SUCCESS)
        }
        IoPlan::KvExist { key } => Ok(Outcome::Complete {
            status: if kv.exists(&key, ctx.now) {
                Status::SUCCESS
            } else {
                Status::KV_KEY_DOES_NOT_EXIST
            },
            result: 0,
        }),
        IoPlan::KvList { start, buf } => {
            // At most as many keys as the buffer could hold at their smallest.
            let most = (buf as usize).saturating_sub(4) / list_entry_len(1);
            let keys = kv.list(&start, most, ctx.now);
            let (data, n) = encode_list_response(keys.iter(), buf as usize);
            r.reply = Some(data);
            Ok(Outcome::Complete {
                status: Status::SUCCESS,
                result: n as u64,
            })
        }
        _ => Err(Status::INTERNAL_ERROR),
    }
}

/// A Store asks the index for room: it writes its value, waits for a commit
/// that frees or releases blocks, or (an empty value) is stored at once.
fn store<X>(
    r: &mut Request<X>,
    env: &mut IoEnv<'_>,
    plan: IoPlan,
    kv: &dyn KeyIndex,
    ctx: &mut IoCtx,
) -> Result<Outcome, Status> {
    let IoPlan::KvStore {
        key,
        len,
        opts,
        durable,
        stage,
    } = plan
    else {
        return Err(Status::INTERNAL_ERROR);
    };
    let nsid = r.sqe.nsid();
    let tries = match stage {
        KvStage::Space { tries } => tries,
        _ => 0,
    };
    match kv.reserve(&key, len, opts, ctx.now)? {
        Reserve::AfterCommit if tries >= SPACE_TRIES => Err(Status::CAPACITY_EXCEEDED),
        Reserve::AfterCommit => {
            // The commit a volume flush makes frees the blocks.
            let space = KvStage::Space { tries: tries + 1 };
            r.plan = Some(with_stage(plan, space));
            submit_one(env, nsid, IoOp::Flush, ctx)
        }
        Reserve::Ready(loc) if loc.nblocks == 0 => {
            kv.commit_store(&key, loc, opts, ctx.now)?;
            stored(r, env, plan, durable, ctx)
        }
        Reserve::Claimed(loc) => {
            r.plan = Some(with_stage(plan, KvStage::Claimed(loc)));
            submit_one(env, nsid, IoOp::Flush, ctx).inspect_err(|_| kv.abort_claim(&key, loc))
        }
        Reserve::Ready(loc) => write_value(r, env, plan, kv, loc, ctx),
    }
}

/// Writes a Store's value into the blocks `loc` reserved for it (given back
/// if the write cannot be submitted).
fn write_value<X>(
    r: &mut Request<X>,
    env: &mut IoEnv<'_>,
    plan: IoPlan,
    kv: &dyn KeyIndex,
    loc: KvLoc,
    ctx: &mut IoCtx,
) -> Result<Outcome, Status> {
    let IoPlan::KvStore { key, len, .. } = plan else {
        return Err(Status::INTERNAL_ERROR);
    };
    let bs = kv.block_size();
    let buf = match value_buffer(r, len as usize, loc, bs, ctx) {
        Ok(b) => b,
        Err(e) => {
            kv.abort_store(&key, loc);
            return Err(e);
        }
    };
    r.plan = Some(with_stage(plan, KvStage::Write(loc)));
    let op = IoOp::Write {
        offset: loc.block * bs as u64,
        buf,
        fua: false,
    };
    submit_one(env, r.sqe.nsid(), op, ctx).inspect_err(|_| kv.abort_store(&key, loc))
}

/// The host's value as a whole number of blocks: its buffer when that has
/// room for the padding, else a copy. The padding reads back as zeros.
fn value_buffer<X>(
    r: &mut Request<X>,
    len: usize,
    loc: KvLoc,
    bs: u32,
    ctx: &mut IoCtx,
) -> Result<IoBuf, Status> {
    let whole = loc.nblocks as usize * bs as usize;
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
fn stored<X>(
    r: &mut Request<X>,
    env: &mut IoEnv<'_>,
    plan: IoPlan,
    durable: bool,
    ctx: &mut IoCtx,
) -> Result<Outcome, Status> {
    if durable {
        r.plan = Some(with_stage(plan, KvStage::Durable));
        return submit_one(env, r.sqe.nsid(), IoOp::Flush, ctx);
    }
    Ok(Outcome::SUCCESS)
}

fn put_back(b: Option<IoBuf>, ctx: &mut IoCtx) {
    if let Some(b) = b.filter(|b| b.is_owned()) {
        ctx.bufs.put(b);
    }
}

/// A KV command's device operation finished: its next step, or `None` when
/// the request has no plan.
pub fn step_done<X>(
    r: &mut Request<X>,
    env: &mut IoEnv<'_>,
    result: Result<(), i32>,
    buf: Option<IoBuf>,
    ctx: &mut IoCtx,
) -> Option<Result<Outcome, Status>> {
    r.pending_ops = 0;
    let plan = r.plan?;
    // The index the command started in, not the namespace table: blocks or
    // a pin taken there are released even if the namespace went.
    let held = r.kv.clone();
    if let Err(errno) = result {
        command::log_device_error(env.errors, ctx.now, r.sqe.cid(), r.sqe.opcode(), errno);
    }
    let failed = result.err().map(|e| status_for_errno(e, Some(plan)));
    Some(match held {
        Some(kv) => next_step(r, env, plan, &*kv, failed, buf, ctx),
        None => {
            put_back(buf, ctx);
            Err(Status::INVALID_NAMESPACE)
        }
    })
}

/// The step after a device operation (`failed`: how it failed).
fn next_step<X>(
    r: &mut Request<X>,
    env: &mut IoEnv<'_>,
    plan: IoPlan,
    kv: &dyn KeyIndex,
    failed: Option<Status>,
    buf: Option<IoBuf>,
    ctx: &mut IoCtx,
) -> Result<Outcome, Status> {
    match plan {
        IoPlan::KvStore {
            key,
            opts,
            durable,
            stage,
            ..
        } => {
            put_back(buf, ctx);
            match stage {
                KvStage::Space { .. } => {
                    if let Some(s) = failed {
                        return Err(s);
                    }
                    execute(r, env, ctx)
                }
                KvStage::Claimed(loc) => {
                    if let Some(s) = failed {
                        kv.abort_claim(&key, loc);
                        return Err(s);
                    }
                    write_value(r, env, plan, kv, loc, ctx)
                }
                KvStage::Write(loc) => {
                    if let Some(s) = failed {
                        kv.abort_store(&key, loc);
                        return Err(s);
                    }
                    kv.commit_store(&key, loc, opts, ctx.now)?;
                    stored(r, env, plan, durable, ctx)
                }
                KvStage::Durable => Ok(Outcome::Complete {
                    status: failed.unwrap_or(Status::SUCCESS),
                    result: 0,
                }),
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
            Ok(Outcome::Complete {
                status: Status::SUCCESS,
                result: len as u64,
            })
        }
        IoPlan::KvDelete { .. } => {
            put_back(buf, ctx);
            Ok(Outcome::Complete {
                status: failed.unwrap_or(Status::SUCCESS),
                result: 0,
            })
        }
        _ => {
            put_back(buf, ctx);
            Err(Status::INTERNAL_ERROR)
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
