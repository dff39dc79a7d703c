//! The Key Value command set: Store, Retrieve, Delete, Exist and List
//! against a KV namespace's key index, with the values in its volume's
//! blocks (Flush is the NVM command set's). A command runs in steps: asks of
//! the index (`KvAsk`), answered in place or by the reactor that owns the
//! index (`answered`), and device operations (a volume write, read or flush)
//! that complete into the next step (`step_done`). Exist, List and a Delete
//! without a volatile write cache to honour need no device at all.

use super::{status_for_errno, IoEnv, IoPlan, KvStage, Outcome};
use crate::command;
use crate::command::Submitted;
use crate::ns_table::NsTable;
use crate::request::Request;
use crate::Namespace;
use kvt_bdev::IoOp;
use kvt_mem::IoBuf;
use kvt_pool::kv_index::{KeyIndex, KvAnswer, KvAsk, KvLoc, Reserve};
use kvt_reactor::IoCtx;
use kvt_wire::nvme::{
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

/// The key index of `nsid`'s namespace.
fn index(ns: &NsTable, nsid: u32) -> Result<Arc<dyn KeyIndex>, Status> {
    let ns = ns.get(nsid).ok_or(Status::INVALID_NAMESPACE)?;
    // One Arc clone per command: the index outlives a namespace removed
    // while the command runs.
    ns.kv.clone().ok_or(Status::INTERNAL_ERROR)
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

/// Starts (or, after a commit freed space, resumes) a KV command: its first
/// ask of the index.
pub fn execute<X>(
    r: &mut Request<X>,
    env: &mut IoEnv<'_>,
    ctx: &mut IoCtx,
) -> Result<Outcome, Status> {
    let (plan, nsid) = (r.plan.ok_or(Status::INTERNAL_ERROR)?, r.sqe.nsid());
    let kv = index(env.ns, nsid)?;
    if r.kv.is_none() {
        r.kv = Some(kv.clone());
    }
    let first = match plan {
        IoPlan::KvStore { key, len, opts, .. } => KvAsk::Reserve { key, len, opts },
        IoPlan::KvRetrieve { key, .. } => KvAsk::BeginRead { key },
        IoPlan::KvDelete { key, .. } => KvAsk::Delete { key },
        IoPlan::KvExist { key } => KvAsk::Exists { key },
        IoPlan::KvList { start, buf } => {
            // At most as many keys as the buffer could hold at their smallest.
            let most = (buf as usize).saturating_sub(4) / list_entry_len(1);
            KvAsk::List {
                start,
                max: u32::try_from(most).unwrap_or(u32::MAX),
            }
        }
        _ => return Err(Status::INTERNAL_ERROR),
    };
    ask(r, env, &*kv, first, ctx)
}

/// Asks the index for the command's next step. Answered here, the command
/// goes on at once; else the answer comes back like a device completion
/// (`answered`), and the command waits for it as for one.
fn ask<X>(
    r: &mut Request<X>,
    env: &mut IoEnv<'_>,
    kv: &dyn KeyIndex,
    a: KvAsk,
    ctx: &mut IoCtx,
) -> Result<Outcome, Status> {
    assert!(a.wants_answer(), "a release is not a step");
    match kv.ask(a, slot_of(env), ctx) {
        Some(answer) => on_answer(r, env, kv, answer, ctx),
        None => Ok(Outcome::Submitted(Submitted {
            ops: 1,
            failure: None,
        })),
    }
}

/// Gives back what the command held in the index (blocks, a pin): no answer.
fn release(kv: &dyn KeyIndex, a: KvAsk, slot: u16, ctx: &mut IoCtx) {
    assert!(!a.wants_answer(), "a step is not a release");
    let _ = kv.ask(a, slot, ctx);
}

/// The command's slot in its queue (the low bits of its tag).
fn slot_of(env: &IoEnv<'_>) -> u16 {
    env.tag as u16
}

/// The index's answer to a KV command's ask came back from its owner: the
/// command's next step, or `None` when the request has no plan.
pub fn answered<X>(
    r: &mut Request<X>,
    env: &mut IoEnv<'_>,
    answer: Option<KvAnswer>,
    ctx: &mut IoCtx,
) -> Option<Result<Outcome, Status>> {
    r.pending_ops = 0;
    r.plan?;
    let Some(kv) = r.kv.clone() else {
        return Some(Err(Status::INVALID_NAMESPACE));
    };
    let Some(answer) = answer else {
        return Some(Err(Status::INTERNAL_ERROR));
    };
    Some(on_answer(r, env, &*kv, answer, ctx))
}

/// The step after the index answered.
fn on_answer<X>(
    r: &mut Request<X>,
    env: &mut IoEnv<'_>,
    kv: &dyn KeyIndex,
    answer: KvAnswer,
    ctx: &mut IoCtx,
) -> Result<Outcome, Status> {
    let plan = r.plan.ok_or(Status::INTERNAL_ERROR)?;
    match (plan, answer) {
        (IoPlan::KvStore { .. }, KvAnswer::Reserve(room)) => reserved(r, env, plan, kv, room?, ctx),
        (IoPlan::KvStore { durable, .. }, KvAnswer::CommitStore(done)) => {
            done?;
            stored(r, env, plan, durable, ctx)
        }
        (IoPlan::KvRetrieve { .. }, KvAnswer::BeginRead(found)) => {
            let (pin, loc) = found?;
            read_value(r, env, plan, kv, pin, loc, ctx)
        }
        (IoPlan::KvDelete { durable, .. }, KvAnswer::Delete(done)) => {
            done?;
            stored(r, env, plan, durable, ctx)
        }
        (IoPlan::KvExist { .. }, KvAnswer::Exists(found)) => Ok(Outcome::Complete {
            status: if found {
                Status::SUCCESS
            } else {
                Status::KV_KEY_DOES_NOT_EXIST
            },
            result: 0,
        }),
        (IoPlan::KvList { buf, .. }, KvAnswer::List(keys)) => {
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

/// A Retrieve found its value (pinned under `pin`): read it from the device.
fn read_value<X>(
    r: &mut Request<X>,
    env: &mut IoEnv<'_>,
    plan: IoPlan,
    kv: &dyn KeyIndex,
    pin: u32,
    loc: KvLoc,
    ctx: &mut IoCtx,
) -> Result<Outcome, Status> {
    let IoPlan::KvRetrieve { buf, .. } = plan else {
        return Err(Status::INTERNAL_ERROR);
    };
    let (bs, slot) = (kv.block_size(), slot_of(env));
    let xfer = buf.min(loc.len);
    if xfer == 0 {
        // HBS 0 (or an empty value): only the size is asked for.
        release(kv, KvAsk::EndRead { pin }, slot, ctx);
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
        release(kv, KvAsk::EndRead { pin }, slot, ctx);
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
    let sent = submit_one(env, r.sqe.nsid(), op, ctx);
    if sent.is_err() {
        release(kv, KvAsk::EndRead { pin }, slot, ctx);
    }
    sent
}

/// A Store's room from the index: it writes its value, waits for a commit
/// that frees or releases blocks, or (an empty value) is stored at once.
fn reserved<X>(
    r: &mut Request<X>,
    env: &mut IoEnv<'_>,
    plan: IoPlan,
    kv: &dyn KeyIndex,
    room: Reserve,
    ctx: &mut IoCtx,
) -> Result<Outcome, Status> {
    let IoPlan::KvStore {
        key, opts, stage, ..
    } = plan
    else {
        return Err(Status::INTERNAL_ERROR);
    };
    let nsid = r.sqe.nsid();
    let tries = match stage {
        KvStage::Space { tries } => tries,
        _ => 0,
    };
    match room {
        Reserve::AfterCommit if tries >= SPACE_TRIES => Err(Status::CAPACITY_EXCEEDED),
        Reserve::AfterCommit => {
            // The commit a volume flush makes frees the blocks.
            let space = KvStage::Space { tries: tries + 1 };
            r.plan = Some(with_stage(plan, space));
            submit_one(env, nsid, IoOp::Flush, ctx)
        }
        Reserve::Ready(loc) if loc.nblocks == 0 => {
            ask(r, env, kv, KvAsk::CommitStore { key, loc, opts }, ctx)
        }
        Reserve::Claimed(loc) => {
            r.plan = Some(with_stage(plan, KvStage::Claimed(loc)));
            let sent = submit_one(env, nsid, IoOp::Flush, ctx);
            if sent.is_err() {
                release(kv, KvAsk::AbortClaim { loc }, slot_of(env), ctx);
            }
            sent
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
    let IoPlan::KvStore { len, .. } = plan else {
        return Err(Status::INTERNAL_ERROR);
    };
    let (bs, slot) = (kv.block_size(), slot_of(env));
    let buf = match value_buffer(r, len as usize, loc, bs, ctx) {
        Ok(b) => b,
        Err(e) => {
            release(kv, KvAsk::AbortStore { loc }, slot, ctx);
            return Err(e);
        }
    };
    r.plan = Some(with_stage(plan, KvStage::Write(loc)));
    let op = IoOp::Write {
        offset: loc.block * bs as u64,
        buf,
        fua: false,
    };
    let sent = submit_one(env, r.sqe.nsid(), op, ctx);
    if sent.is_err() {
        release(kv, KvAsk::AbortStore { loc }, slot, ctx);
    }
    sent
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

/// A Store or Delete is in the index: commit it first if there is no
/// volatile write cache, else answer.
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
    let slot = slot_of(env);
    match plan {
        IoPlan::KvStore {
            key, opts, stage, ..
        } => {
            put_back(buf, ctx);
            match (stage, failed) {
                (KvStage::Space { .. }, Some(s)) => Err(s),
                (KvStage::Space { .. }, None) => execute(r, env, ctx),
                (KvStage::Claimed(loc), Some(s)) => {
                    release(kv, KvAsk::AbortClaim { loc }, slot, ctx);
                    Err(s)
                }
                (KvStage::Claimed(loc), None) => write_value(r, env, plan, kv, loc, ctx),
                (KvStage::Write(loc), Some(s)) => {
                    release(kv, KvAsk::AbortStore { loc }, slot, ctx);
                    Err(s)
                }
                (KvStage::Write(loc), None) => {
                    ask(r, env, kv, KvAsk::CommitStore { key, loc, opts }, ctx)
                }
                (KvStage::Durable, _) => Ok(Outcome::Complete {
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
            release(kv, KvAsk::EndRead { pin }, slot, ctx);
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
