//! rdma-core (libibverbs, librdmacm) bound at run time with dlopen.
//!
//! Why run time: a machine without rdma-core must still build and run kvtarget
//! (and its tests); RDMA is needed only when an RDMA listener is configured. So no
//! link-time dependency: `load()` opens `libibverbs.so.1` and `librdmacm.so.1`
//! (the sonames Debian's libibverbs1/librdmacm1 ship) and resolves the exported
//! functions by name; a missing library or symbol is one error line.
//!
//! The trap: `ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq` and
//! `ibv_req_notify_cq` are `static inline` in <infiniband/verbs.h> and dispatch
//! through function pointers in `struct ibv_context`'s `ops`, so they have no
//! symbol to dlsym. We reproduce `struct ibv_context_ops` and the work-request,
//! work-completion and CM structures byte for byte from rdma-core 44's headers
//! (Debian 12); the offsets asserted below were taken from those headers with
//! `offsetof` (the ABI has been stable since rdma-core 13: the ops table only
//! grows `_compat_` slots at the end).
//!
//! Memory ownership: every object here is created and destroyed by rdma-core;
//! the owning wrappers in `super` destroy them exactly once. This module is the
//! only place in kvtarget that dereferences rdma-core pointers.

#![allow(non_camel_case_types)]

pub use super::error::LoadError;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `struct ibv_send_wr` (rdma-core 44, 128 bytes). Only the RDMA member of the
/// `wr` union is named; the rest is padding of the exact size.
#[repr(C)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: c_uint,
    pub send_flags: c_uint,
    /// Union of `imm_data` and `invalidate_rkey`.
    pub invalidate_rkey: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    pub _wr_rest: [u32; 5],
    pub _tail: [u64; 7],
}

impl Default for ibv_send_wr {
    fn default() -> Self {
        ibv_send_wr {
            wr_id: 0,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
            opcode: 0,
            send_flags: 0,
            invalidate_rkey: 0,
            remote_addr: 0,
            rkey: 0,
            _wr_rest: [0; 5],
            _tail: [0; 7],
        }
    }
}

/// `struct ibv_recv_wr`.
#[repr(C)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: c_uint,
    pub opcode: c_uint,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub imm_or_invalidated_rkey: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut c_void,
    pub cap: ibv_qp_cap,
    pub qp_type: c_uint,
    pub sq_sig_all: c_int,
}

/// `struct rdma_conn_param`.
#[repr(C)]
pub struct rdma_conn_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub qp_num: u32,
}

/// `struct rdma_cm_event` (the connection member of its `param` union).
#[repr(C)]
pub struct rdma_cm_event {
    pub id: *mut rdma_cm_id,
    pub listen_id: *mut rdma_cm_id,
    pub event: c_uint,
    pub status: c_int,
    pub conn: rdma_conn_param,
    _ud_rest: [u64; 4],
}

type PollCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;
type ReqNotifyFn = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;
type PostSendFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
type PostRecvFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;

/// `struct ibv_context_ops` up to `post_recv` (slot 26); the remaining slots
/// follow but are never read.
#[repr(C)]
pub struct ibv_context_ops {
    _slots_0_10: [usize; 11],
    poll_cq: Option<PollCqFn>,
    req_notify_cq: Option<ReqNotifyFn>,
    _slots_13_24: [usize; 12],
    post_send: Option<PostSendFn>,
    post_recv: Option<PostRecvFn>,
}

/// The head of `struct ibv_context`.
#[repr(C)]
pub struct ibv_context {
    pub device: *mut c_void,
    pub ops: ibv_context_ops,
}

/// The head of `struct ibv_cq`.
#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
}

/// The head of `struct ibv_qp` (through `qp_num`).
#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
}

/// The head of `struct ibv_cq` through `cqe` (the size the provider gave).
#[repr(C)]
pub struct ibv_cq_head {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
}

/// `struct ibv_comp_channel`.
#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

/// The head of `struct ibv_mr`.
#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut c_void,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// The head of `struct rdma_cm_id` through the route's two addresses.
#[repr(C)]
pub struct rdma_cm_id {
    pub verbs: *mut ibv_context,
    pub channel: *mut rdma_event_channel,
    pub context: *mut c_void,
    pub qp: *mut ibv_qp,
    /// `route.addr.src_storage`.
    pub src_addr: libc::sockaddr_storage,
    /// `route.addr.dst_storage`.
    pub dst_addr: libc::sockaddr_storage,
}

/// `struct rdma_event_channel`.
#[repr(C)]
pub struct rdma_event_channel {
    pub fd: c_int,
}

// Layouts checked against rdma-core 44's headers (offsetof/sizeof).
const _: () = assert!(std::mem::size_of::<ibv_send_wr>() == 128);
const _: () = assert!(std::mem::offset_of!(ibv_send_wr, opcode) == 28);
const _: () = assert!(std::mem::offset_of!(ibv_send_wr, invalidate_rkey) == 36);
const _: () = assert!(std::mem::offset_of!(ibv_send_wr, remote_addr) == 40);
const _: () = assert!(std::mem::offset_of!(ibv_send_wr, rkey) == 48);
const _: () = assert!(std::mem::size_of::<ibv_recv_wr>() == 32);
const _: () = assert!(std::mem::size_of::<ibv_wc>() == 48);
const _: () = assert!(std::mem::offset_of!(ibv_wc, byte_len) == 20);
const _: () = assert!(std::mem::offset_of!(ibv_wc, wc_flags) == 36);
const _: () = assert!(std::mem::size_of::<ibv_qp_init_attr>() == 64);
const _: () = assert!(std::mem::offset_of!(ibv_qp_init_attr, qp_type) == 52);
const _: () = assert!(std::mem::size_of::<rdma_conn_param>() == 24);
const _: () = assert!(std::mem::size_of::<rdma_cm_event>() == 80);
const _: () = assert!(std::mem::offset_of!(rdma_cm_event, conn) == 24);
const _: () = assert!(std::mem::offset_of!(ibv_context, ops) == 8);
const _: () = assert!(
    std::mem::offset_of!(ibv_context, ops) + std::mem::offset_of!(ibv_context_ops, poll_cq) == 96
);
const _: () = assert!(
    std::mem::offset_of!(ibv_context, ops) + std::mem::offset_of!(ibv_context_ops, req_notify_cq)
        == 104
);
const _: () = assert!(
    std::mem::offset_of!(ibv_context, ops) + std::mem::offset_of!(ibv_context_ops, post_send)
        == 208
);
const _: () = assert!(
    std::mem::offset_of!(ibv_context, ops) + std::mem::offset_of!(ibv_context_ops, post_recv)
        == 216
);
const _: () = assert!(std::mem::offset_of!(ibv_qp, qp_num) == 52);
const _: () = assert!(std::mem::offset_of!(ibv_comp_channel, fd) == 8);
const _: () = assert!(std::mem::offset_of!(ibv_cq_head, cqe) == 28);
const _: () = assert!(std::mem::offset_of!(ibv_mr, lkey) == 36);
const _: () = assert!(std::mem::offset_of!(ibv_mr, rkey) == 40);
const _: () = assert!(std::mem::offset_of!(rdma_cm_id, qp) == 24);
const _: () = assert!(std::mem::offset_of!(rdma_cm_id, src_addr) == 32);
const _: () = assert!(std::mem::offset_of!(rdma_cm_id, dst_addr) == 160);

/// `enum ibv_qp_type`: reliable connected.
pub const IBV_QPT_RC: c_uint = 2;
/// `enum rdma_port_space`: RDMA_PS_TCP.
pub const RDMA_PS_TCP: c_int = 0x0106;
/// `enum ibv_access_flags`.
pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
/// `enum ibv_wr_opcode`.
pub const IBV_WR_RDMA_WRITE: c_uint = 0;
pub const IBV_WR_SEND: c_uint = 2;
pub const IBV_WR_RDMA_READ: c_uint = 4;
pub const IBV_WR_SEND_WITH_INV: c_uint = 9;
/// `enum ibv_send_flags`.
pub const IBV_SEND_SIGNALED: c_uint = 2;
/// `enum ibv_wc_status`.
pub const IBV_WC_SUCCESS: c_uint = 0;
pub const IBV_WC_WR_FLUSH_ERR: c_uint = 5;
/// `enum ibv_qp_state`: error (outstanding work requests complete as flushed).
pub const IBV_QPS_ERR: c_uint = 6;
/// `enum ibv_qp_attr_mask`: the state field.
pub const IBV_QP_STATE: c_int = 1;
/// `struct ibv_qp_attr` is 144 bytes in rdma-core 44; `modify_qp_to_error`
/// passes a zeroed buffer of this size with only `qp_state` (offset 0) set.
const QP_ATTR_LEN: usize = 144;
/// `enum rdma_cm_event_type`.
pub mod cm_event {
    pub const CONNECT_REQUEST: u32 = 4;
    pub const CONNECT_ERROR: u32 = 6;
    pub const UNREACHABLE: u32 = 7;
    pub const REJECTED: u32 = 8;
    pub const ESTABLISHED: u32 = 9;
    pub const DISCONNECTED: u32 = 10;
    pub const DEVICE_REMOVAL: u32 = 11;
    pub const ADDR_CHANGE: u32 = 14;
    pub const TIMEWAIT_EXIT: u32 = 15;
}
/// Offsets into `struct ibv_device_attr` (232 bytes in rdma-core 44).
const DEVICE_ATTR_LEN: usize = 232;
const DEVICE_ATTR_MAX_QP_WR: usize = 112;
const DEVICE_ATTR_MAX_CQE: usize = 132;
const DEVICE_ATTR_MAX_QP_RD_ATOM: usize = 144;
const DEVICE_ATTR_MAX_QP_INIT_RD_ATOM: usize = 156;

/// The exported functions we call, resolved once.
pub struct Verbs {
    pub ibv_alloc_pd: unsafe extern "C" fn(*mut ibv_context) -> *mut c_void,
    pub ibv_reg_mr: unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int) -> *mut ibv_mr,
    pub ibv_dereg_mr: unsafe extern "C" fn(*mut ibv_mr) -> c_int,
    pub ibv_create_comp_channel: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_comp_channel,
    pub ibv_destroy_comp_channel: unsafe extern "C" fn(*mut ibv_comp_channel) -> c_int,
    pub ibv_create_cq: unsafe extern "C" fn(
        *mut ibv_context,
        c_int,
        *mut c_void,
        *mut ibv_comp_channel,
        c_int,
    ) -> *mut ibv_cq,
    pub ibv_destroy_cq: unsafe extern "C" fn(*mut ibv_cq) -> c_int,
    pub ibv_get_cq_event:
        unsafe extern "C" fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int,
    pub ibv_ack_cq_events: unsafe extern "C" fn(*mut ibv_cq, c_uint),
    pub ibv_query_device: unsafe extern "C" fn(*mut ibv_context, *mut c_void) -> c_int,
    pub ibv_modify_qp: unsafe extern "C" fn(*mut ibv_qp, *mut c_void, c_int) -> c_int,
    pub ibv_get_device_name: unsafe extern "C" fn(*mut c_void) -> *const c_char,
    pub rdma_create_event_channel: unsafe extern "C" fn() -> *mut rdma_event_channel,
    pub rdma_destroy_event_channel: unsafe extern "C" fn(*mut rdma_event_channel),
    pub rdma_create_id: unsafe extern "C" fn(
        *mut rdma_event_channel,
        *mut *mut rdma_cm_id,
        *mut c_void,
        c_int,
    ) -> c_int,
    pub rdma_destroy_id: unsafe extern "C" fn(*mut rdma_cm_id) -> c_int,
    pub rdma_bind_addr: unsafe extern "C" fn(*mut rdma_cm_id, *mut libc::sockaddr) -> c_int,
    pub rdma_listen: unsafe extern "C" fn(*mut rdma_cm_id, c_int) -> c_int,
    pub rdma_get_cm_event:
        unsafe extern "C" fn(*mut rdma_event_channel, *mut *mut rdma_cm_event) -> c_int,
    pub rdma_ack_cm_event: unsafe extern "C" fn(*mut rdma_cm_event) -> c_int,
    pub rdma_accept: unsafe extern "C" fn(*mut rdma_cm_id, *mut rdma_conn_param) -> c_int,
    pub rdma_reject: unsafe extern "C" fn(*mut rdma_cm_id, *const c_void, u8) -> c_int,
    pub rdma_disconnect: unsafe extern "C" fn(*mut rdma_cm_id) -> c_int,
    pub rdma_create_qp:
        unsafe extern "C" fn(*mut rdma_cm_id, *mut c_void, *mut ibv_qp_init_attr) -> c_int,
    pub rdma_destroy_qp: unsafe extern "C" fn(*mut rdma_cm_id),
    pub rdma_migrate_id: unsafe extern "C" fn(*mut rdma_cm_id, *mut rdma_event_channel) -> c_int,
}

// SAFETY: the table holds only function pointers into libraries that stay loaded
// for the life of the process (never dlclose'd).
unsafe impl Send for Verbs {}
// SAFETY: as above; calling the functions from several threads is allowed by
// rdma-core (verbs and CM calls are thread-safe).
unsafe impl Sync for Verbs {}

static VERBS: OnceLock<Result<Verbs, LoadError>> = OnceLock::new();

/// The loaded libraries, or the reason they are unavailable.
pub fn load() -> Result<&'static Verbs, LoadError> {
    VERBS.get_or_init(open).as_ref().map_err(|e| e.clone())
}

fn dlerror_string() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the
    // next dl* call on this thread; we copy it at once.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: non-NULL, NUL-terminated (see above).
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

fn open_lib(name: &CStr) -> Result<*mut c_void, LoadError> {
    // SAFETY: name is NUL-terminated; RTLD_NOW resolves everything up front.
    let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if h.is_null() {
        return Err(LoadError::Library {
            lib: name.to_string_lossy().into_owned(),
            reason: dlerror_string(),
        });
    }
    Ok(h)
}

fn sym(lib: *mut c_void, name: &CStr) -> Result<*mut c_void, LoadError> {
    // SAFETY: lib is a live handle from dlopen; name is NUL-terminated.
    let p = unsafe { libc::dlsym(lib, name.as_ptr() as *const c_char) };
    if p.is_null() {
        Err(LoadError::Symbol {
            symbol: name.to_string_lossy().into_owned(),
            reason: dlerror_string(),
        })
    } else {
        Ok(p)
    }
}

/// Reinterprets a symbol address as a function pointer type.
///
/// # Safety
/// `T` is a function pointer type matching the symbol's C prototype.
unsafe fn fn_ptr<T: Copy>(p: *mut c_void) -> T {
    assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: same size (asserted); the caller guarantees T matches the symbol.
    unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) }
}

fn open() -> Result<Verbs, LoadError> {
    let ib = open_lib(c"libibverbs.so.1")?;
    let cm = open_lib(c"librdmacm.so.1")?;
    macro_rules! f {
        ($lib:expr, $name:ident) => {{
            let p = sym(
                $lib,
                &std::ffi::CString::new(stringify!($name)).unwrap_or_default(),
            )?;
            // SAFETY: p is the address of the exported C function of that name;
            // its prototype (rdma-core 44 headers) is the field's type.
            unsafe { fn_ptr(p) }
        }};
    }
    Ok(Verbs {
        ibv_alloc_pd: f!(ib, ibv_alloc_pd),
        ibv_reg_mr: f!(ib, ibv_reg_mr),
        ibv_dereg_mr: f!(ib, ibv_dereg_mr),
        ibv_create_comp_channel: f!(ib, ibv_create_comp_channel),
        ibv_destroy_comp_channel: f!(ib, ibv_destroy_comp_channel),
        ibv_create_cq: f!(ib, ibv_create_cq),
        ibv_destroy_cq: f!(ib, ibv_destroy_cq),
        ibv_get_cq_event: f!(ib, ibv_get_cq_event),
        ibv_ack_cq_events: f!(ib, ibv_ack_cq_events),
        ibv_query_device: f!(ib, ibv_query_device),
        ibv_modify_qp: f!(ib, ibv_modify_qp),
        ibv_get_device_name: f!(ib, ibv_get_device_name),
        rdma_create_event_channel: f!(cm, rdma_create_event_channel),
        rdma_destroy_event_channel: f!(cm, rdma_destroy_event_channel),
        rdma_create_id: f!(cm, rdma_create_id),
        rdma_destroy_id: f!(cm, rdma_destroy_id),
        rdma_bind_addr: f!(cm, rdma_bind_addr),
        rdma_listen: f!(cm, rdma_listen),
        rdma_get_cm_event: f!(cm, rdma_get_cm_event),
        rdma_ack_cm_event: f!(cm, rdma_ack_cm_event),
        rdma_accept: f!(cm, rdma_accept),
        rdma_reject: f!(cm, rdma_reject),
        rdma_disconnect: f!(cm, rdma_disconnect),
        rdma_create_qp: f!(cm, rdma_create_qp),
        rdma_destroy_qp: f!(cm, rdma_destroy_qp),
        rdma_migrate_id: f!(cm, rdma_migrate_id),
    })
}

/// Device limits the transport sizes itself by.
#[derive(Debug, Clone, Copy)]
pub struct DeviceLimits {
    pub max_qp_wr: u32,
    pub max_cqe: u32,
    /// Incoming RDMA READs a QP may have outstanding (responder side).
    pub max_qp_rd_atom: u32,
    /// RDMA READs a QP may issue concurrently (initiator side).
    pub max_qp_init_rd_atom: u32,
}

/// `ibv_query_device`, reading only the fields we use.
///
/// # Safety
/// `ctx` is a live device context.
pub unsafe fn query_device(v: &Verbs, ctx: *mut ibv_context) -> Result<DeviceLimits, i32> {
    let mut attr = [0u64; DEVICE_ATTR_LEN / 8];
    // SAFETY: attr is DEVICE_ATTR_LEN bytes, 8-aligned, the size of
    // struct ibv_device_attr; ctx is live (caller).
    let r = unsafe { (v.ibv_query_device)(ctx, attr.as_mut_ptr() as *mut c_void) };
    if r != 0 {
        return Err(r);
    }
    let bytes: Vec<u8> = attr.iter().flat_map(|w| w.to_ne_bytes()).collect();
    let at = |o: usize| {
        let mut a = [0u8; 4];
        a.copy_from_slice(&bytes[o..o + 4]);
        i32::from_ne_bytes(a).max(0) as u32
    };
    Ok(DeviceLimits {
        max_qp_wr: at(DEVICE_ATTR_MAX_QP_WR),
        max_cqe: at(DEVICE_ATTR_MAX_CQE),
        max_qp_rd_atom: at(DEVICE_ATTR_MAX_QP_RD_ATOM),
        max_qp_init_rd_atom: at(DEVICE_ATTR_MAX_QP_INIT_RD_ATOM),
    })
}

/// The inline `ibv_post_send`: 0 or an errno, and how many work requests of
/// the chain were posted (all on success; those before the bad one on error,
/// whose completions will still arrive).
///
/// # Safety
/// `qp` is a live QP; `wr` a valid chain whose buffers stay registered and alive
/// until their completions are polled.
pub unsafe fn post_send(qp: *mut ibv_qp, wr: *mut ibv_send_wr) -> (c_int, u32) {
    let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
    // SAFETY: qp and its context are live (caller); ops.post_send is filled in
    // by every provider.
    let rc = unsafe {
        match (*(*qp).context).ops.post_send {
            Some(f) => f(qp, wr, &mut bad),
            None => libc::ENOSYS,
        }
    };
    let mut posted = 0;
    let mut w = wr;
    while !w.is_null() && (rc == 0 || w != bad) {
        posted += 1;
        // SAFETY: the chain is valid (caller) and unchanged by the provider.
        w = unsafe { (*w).next };
    }
    if rc != 0 && bad.is_null() {
        // A provider that failed without naming the bad request posted none
        // we can count on; assume none (the QP is closed on any error).
        posted = 0;
    }
    (rc, posted)
}

/// Moves a QP to the error state: every outstanding work request completes
/// with IBV_WC_WR_FLUSH_ERR on its CQ, and no new one starts.
///
/// # Safety
/// `qp` is a live QP.
pub unsafe fn modify_qp_to_error(v: &Verbs, qp: *mut ibv_qp) -> c_int {
    #[repr(C, align(8))]
    struct QpAttr([u32; QP_ATTR_LEN / 4]);
    let mut attr = QpAttr([0; QP_ATTR_LEN / 4]);
    attr.0[0] = IBV_QPS_ERR; // qp_state, the first field
                             // SAFETY: attr is a zeroed, 8-aligned struct ibv_qp_attr of the right size
                             // whose qp_state is ERR; with IBV_QP_STATE only that field is read.
    unsafe { (v.ibv_modify_qp)(qp, &mut attr as *mut QpAttr as *mut c_void, IBV_QP_STATE) }
}

/// The device name (`rxe0`, `mlx5_0`) of a device context.
///
/// # Safety
/// `ctx` is a live device context.
pub unsafe fn device_name(v: &Verbs, ctx: *mut ibv_context) -> String {
    // SAFETY: ctx is live (caller); its device pointer is valid for its life;
    // the name is a NUL-terminated string inside the device.
    unsafe {
        let n = (v.ibv_get_device_name)((*ctx).device);
        if n.is_null() {
            "unknown".into()
        } else {
            CStr::from_ptr(n).to_string_lossy().into_owned()
        }
    }
}

/// The inline `ibv_post_recv`.
///
/// # Safety
/// As `post_send`.
pub unsafe fn post_recv(qp: *mut ibv_qp, wr: *mut ibv_recv_wr) -> c_int {
    let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
    // SAFETY: as post_send.
    unsafe {
        match (*(*qp).context).ops.post_recv {
            Some(f) => f(qp, wr, &mut bad),
            None => libc::ENOSYS,
        }
    }
}

/// The inline `ibv_poll_cq`: completions written to `wc`, or a negative error.
///
/// # Safety
/// `cq` is a live CQ.
pub unsafe fn poll_cq(cq: *mut ibv_cq, wc: &mut [ibv_wc]) -> c_int {
    // SAFETY: cq and its context are live (caller); wc has wc.len() entries.
    unsafe {
        match (*(*cq).context).ops.poll_cq {
            Some(f) => f(cq, wc.len() as c_int, wc.as_mut_ptr()),
            None => -libc::ENOSYS,
        }
    }
}

/// The inline `ibv_req_notify_cq` (all completions, not only solicited).
///
/// # Safety
/// `cq` is a live CQ.
pub unsafe fn req_notify_cq(cq: *mut ibv_cq) -> c_int {
    // SAFETY: as poll_cq.
    unsafe {
        match (*(*cq).context).ops.req_notify_cq {
            Some(f) => f(cq, 0),
            None => libc::ENOSYS,
        }
    }
}

/// Converts a `sockaddr_storage` filled by rdma-core to a Rust address.
pub fn sockaddr(s: &libc::sockaddr_storage) -> Option<std::net::SocketAddr> {
    match s.ss_family as c_int {
        libc::AF_INET => {
            // SAFETY: family AF_INET means the storage holds a sockaddr_in.
            let a = unsafe { &*(s as *const _ as *const libc::sockaddr_in) };
            let ip = std::net::Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            Some(std::net::SocketAddr::new(
                ip.into(),
                u16::from_be(a.sin_port),
            ))
        }
        libc::AF_INET6 => {
            // SAFETY: family AF_INET6 means the storage holds a sockaddr_in6.
            let a = unsafe { &*(s as *const _ as *const libc::sockaddr_in6) };
            let ip = std::net::Ipv6Addr::from(a.sin6_addr.s6_addr);
            Some(std::net::SocketAddr::new(
                ip.into(),
                u16::from_be(a.sin6_port),
            ))
        }
        _ => None,
    }
}

/// A Rust address as a `sockaddr_storage` for `rdma_bind_addr`.
pub fn to_sockaddr(a: std::net::SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut s: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match a {
        std::net::SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in.
            let p = unsafe { &mut *(&mut s as *mut _ as *mut libc::sockaddr_in) };
            p.sin_family = libc::AF_INET as libc::sa_family_t;
            p.sin_port = v4.port().to_be();
            p.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
        }
        std::net::SocketAddr::V6(v6) => {
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in6.
            let p = unsafe { &mut *(&mut s as *mut _ as *mut libc::sockaddr_in6) };
            p.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            p.sin6_port = v6.port().to_be();
            p.sin6_addr.s6_addr = v6.ip().octets();
            p.sin6_scope_id = v6.scope_id();
        }
    }
    s
}

/// Sets O_NONBLOCK on an fd rdma-core created (event and completion channels).
pub fn set_nonblocking(fd: c_int) -> std::io::Result<()> {
    // SAFETY: fcntl on an fd we were handed; no memory is involved.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if fl < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockaddr_round_trips() {
        for a in ["10.0.2.15:4420", "[fe80::1]:4420", "0.0.0.0:0"] {
            let a: std::net::SocketAddr = a.parse().unwrap();
            assert_eq!(sockaddr(&to_sockaddr(a)), Some(a));
        }
    }

    #[test]
    fn loading_gives_a_result_not_a_crash() {
        // Whether rdma-core is installed or not, load() answers (an error names
        // the library); it never panics.
        match load() {
            Ok(_) => {}
            Err(e) => assert!(e.to_string().contains("rdma-core"), "{e}"),
        }
    }
}
