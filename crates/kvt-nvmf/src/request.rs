//! One command in a queue's slot, and the handler its queue kind's parse
//! step picked for it (Linux nvmet's `req->execute`): a Fabrics command, an
//! admin command, or an I/O command of one command set. A new command set is a
//! new `Handler` and its own module under `nvmf::io`, not an edit of the
//! queue's admission.

use super::plan::IoPlan;
use kvt_mem::IoBuf;
use kvt_wire::nvme::{Sqe, Status};
use std::sync::Arc;

/// What runs a parsed command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handler {
    /// A Fabrics command (Connect, Property Get/Set, Authentication, Disconnect).
    Fabrics,
    /// An admin command.
    Admin,
    /// An I/O command of the NVM command set (`nvmf::io::nvm`).
    Nvm,
    /// An I/O command of the Key Value command set (`nvmf::io::kv`).
    Kv,
    /// A reservation command of either command set (`nvmf::io::reservation`).
    Reservation,
}

/// Where a request is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The transport is moving its data (or waiting for memory to move it into).
    Moving,
    /// Running: admin work, or device operations outstanding.
    Executing,
    /// Answered; the transport still holds its resources until `Queue::release`.
    Responding,
}

/// One command in a slot.
pub struct Request<X> {
    pub sqe: Sqe,
    pub phase: Phase,
    /// Host data for writes and DSM, device data for reads.
    pub buf: Option<IoBuf>,
    /// Controller-to-host data an admin command produced.
    pub reply: Option<Vec<u8>>,
    pub plan: Option<IoPlan>,
    /// The handler the parse step picked (`None` until it ran).
    pub(crate) handler: Option<Handler>,
    pub(crate) pending_ops: u32,
    /// A failure met on the way (device error, refused submission); the
    /// command completes with it.
    pub(crate) status: Status,
    /// The data arrived corrupt; the command fails once it is all here.
    pub(crate) data_error: bool,
    /// `IoCtx::now_ns` when the capsule arrived.
    pub(crate) arrived_ns: u64,
    /// The key index a KV command holds reserved blocks or a read pin in:
    /// its steps finish there even if the namespace is removed meanwhile.
    pub(crate) kv: Option<Arc<dyn kvt_pool::kv_index::KeyIndex>>,
    /// The transport's state for this request.
    pub x: X,
}
