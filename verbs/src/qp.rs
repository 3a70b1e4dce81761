//! Queue pairs (`ibv_create_qp`, `create_qp_ex`, `ibv_modify_qp`, `ibv_query_qp`,
//! `ibv_destroy_qp`, `post_send`, `post_recv`; the `ibv_qp_ex` `wr_*` table is in
//! [`crate::qp_ex`]). OWNER: helper "qp".
//!
//! Every QP is an `ibv_qp_ex` (352 bytes, the `ibv_qp` its first 160) followed by the rocectl
//! [`QueuePair`]. `ibv_qp_to_qp_ex` returns it only for QPs created through
//! `ibv_create_qp_ex` with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`, as rdma-core does.
//!
//! Types: RC, UC and UD. Capacities are the device's (`ibv_query_device`: `max_qp_wr`,
//! `max_sge`) plus `MAX_INLINE_DATA` inline bytes; the values written back are the ones the
//! QP enforces: the requested queue depths, and the device's SGE and inline limits (which may
//! exceed the request, as `ibv_create_qp(3)` allows). With an SRQ the receive capacities are 0.
//!
//! `ibv_modify_qp` maps `ibv_qp_attr` + `IBV_QP_*` onto [`QpAttr`] + [`AttrMask`] bit for bit
//! (the mask values are the same) and lets the state table of `roce_qp::state` judge the
//! transition; any refusal is `EINVAL`, with the reason traced under `ROCECTL_VERBS_TRACE`. A
//! path MTU above the port's active MTU is lowered to it (what goes on the wire; a larger
//! path MTU could not be sent), and `ibv_query_qp` then reports the effective value.
//!
//! Posting: a chain of `ibv_send_wr` becomes [`SendWr`]s posted under one engine lock and one
//! doorbell ([`QueuePair::post_send_batch`]); a single WR takes the direct path. The first WR
//! refused sets `*bad_wr` and its errno is returned (`EINVAL` for a bad WR or state, `ENOMEM`
//! for a full queue); the WRs before it are posted. `IBV_SEND_INLINE` copies the SGEs' bytes at
//! post time (ignored, as in rxe, for READ and atomics, which return data). `IBV_SEND_FENCE` is
//! accepted and has no effect: the requester does not hold a WR back behind earlier
//! READs/atomics.

use std::cell::UnsafeCell;
use std::ffi::c_int;
use std::ptr::{self, addr_of_mut};
use std::sync::{Mutex, PoisonError};

use roce_transport::{
    Access, AttrMask, Device, LKey, Mtu, QKey, QpAttr, QpConfig, QpInit, QpState, QpType, Qpn,
    QueuePair, RKey, RecvWr, SendData, SendOp, SendWr, Sge, UdDest,
};
use roce_wire::Psn;

use crate::ah::{address_handle, ah_attr_of, AhRec};
use crate::context::ContextRec;
use crate::cq::CqRec;
use crate::ffi::{errno_of_post, errno_of_verbs, guard, guard_int, guard_ptr, set_errno, trace};
use crate::pd::PdRec;
use crate::qp_ex::{self, Batch};
use crate::srq::SrqRec;
use crate::sys::{
    ibv_context, ibv_ece, ibv_gid, ibv_pd, ibv_qp, ibv_qp_attr, ibv_qp_cap, ibv_qp_ex,
    ibv_qp_init_attr, ibv_qp_init_attr_ex, ibv_qp_type, ibv_recv_wr, ibv_send_wr, ibv_sge,
    ibv_wr_opcode,
};

/// Most inline bytes a send may carry (`cap.max_inline_data`): perftest's defaults ask 188 to
/// 236 bytes; this leaves room for `-I` up to 1 KiB.
pub(crate) const MAX_INLINE_DATA: u32 = 1024;

// `enum ibv_qp_type`.
const QPT_RC: ibv_qp_type = crate::sys::ibv_qp_type_IBV_QPT_RC;
const QPT_UC: ibv_qp_type = crate::sys::ibv_qp_type_IBV_QPT_UC;
const QPT_UD: ibv_qp_type = crate::sys::ibv_qp_type_IBV_QPT_UD;
const QPT_RAW_PACKET: ibv_qp_type = crate::sys::ibv_qp_type_IBV_QPT_RAW_PACKET;
const QPT_XRC_SEND: ibv_qp_type = crate::sys::ibv_qp_type_IBV_QPT_XRC_SEND;
const QPT_XRC_RECV: ibv_qp_type = crate::sys::ibv_qp_type_IBV_QPT_XRC_RECV;
const QPT_DRIVER: ibv_qp_type = crate::sys::ibv_qp_type_IBV_QPT_DRIVER;

// `enum ibv_wr_opcode`.
pub(crate) const WR_RDMA_WRITE: ibv_wr_opcode = crate::sys::ibv_wr_opcode_IBV_WR_RDMA_WRITE;
pub(crate) const WR_RDMA_WRITE_WITH_IMM: ibv_wr_opcode =
    crate::sys::ibv_wr_opcode_IBV_WR_RDMA_WRITE_WITH_IMM;
pub(crate) const WR_SEND: ibv_wr_opcode = crate::sys::ibv_wr_opcode_IBV_WR_SEND;
pub(crate) const WR_SEND_WITH_IMM: ibv_wr_opcode = crate::sys::ibv_wr_opcode_IBV_WR_SEND_WITH_IMM;
pub(crate) const WR_RDMA_READ: ibv_wr_opcode = crate::sys::ibv_wr_opcode_IBV_WR_RDMA_READ;
pub(crate) const WR_ATOMIC_CMP_AND_SWP: ibv_wr_opcode =
    crate::sys::ibv_wr_opcode_IBV_WR_ATOMIC_CMP_AND_SWP;
pub(crate) const WR_ATOMIC_FETCH_AND_ADD: ibv_wr_opcode =
    crate::sys::ibv_wr_opcode_IBV_WR_ATOMIC_FETCH_AND_ADD;
pub(crate) const WR_ATOMIC_WRITE: ibv_wr_opcode = crate::sys::ibv_wr_opcode_IBV_WR_ATOMIC_WRITE;

// `enum ibv_send_flags`.
pub(crate) const SEND_SIGNALED: u32 = crate::sys::ibv_send_flags_IBV_SEND_SIGNALED;
pub(crate) const SEND_SOLICITED: u32 = crate::sys::ibv_send_flags_IBV_SEND_SOLICITED;
pub(crate) const SEND_INLINE: u32 = crate::sys::ibv_send_flags_IBV_SEND_INLINE;

// `enum ibv_qp_init_attr_mask`.
const INIT_ATTR_PD: u32 = crate::sys::ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_PD;
const INIT_ATTR_XRCD: u32 = crate::sys::ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_XRCD;
const INIT_ATTR_CREATE_FLAGS: u32 = crate::sys::ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_CREATE_FLAGS;
const INIT_ATTR_MAX_TSO_HEADER: u32 =
    crate::sys::ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_MAX_TSO_HEADER;
const INIT_ATTR_IND_TABLE: u32 = crate::sys::ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_IND_TABLE;
const INIT_ATTR_RX_HASH: u32 = crate::sys::ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_RX_HASH;
const INIT_ATTR_SEND_OPS_FLAGS: u32 =
    crate::sys::ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;

/// The `qp_access_flags` bits a QP keeps; the others (ZERO_BASED, ON_DEMAND, HUGETLB,
/// RELAXED_ORDERING) are MR-only and ignored on a QP, as the kernel does.
const QP_ACCESS_BITS: u32 = 0x01 | 0x02 | 0x04 | 0x08 | 0x10 | 0x100 | 0x200;

/// The `IBV_QP_*` mask bits `roce_qp::state::AttrMask` names (STATE .. DEST_QPN).
const KNOWN_ATTR_BITS: u32 = (1 << 21) - 1;

/// A queue pair; every QP is an `ibv_qp_ex` whose first 160 bytes are the `ibv_qp`.
#[repr(C)]
pub(crate) struct QpRec {
    /// Must stay the first field. In an `UnsafeCell`: applications write `wr_id`/`wr_flags`
    /// and libibverbs' async-event code the mutex and `events_completed` while we hold a
    /// reference to the record.
    pub(crate) ex: UnsafeCell<ibv_qp_ex>,
    /// The rocectl QP.
    pub(crate) qp: QueuePair,
    /// Its type.
    pub(crate) ty: QpType,
    /// The capacities it enforces (written back at creation, reported by `ibv_query_qp`).
    pub(crate) cap: ibv_qp_cap,
    /// `sq_sig_all` at creation.
    pub(crate) sq_sig_all: bool,
    /// Created with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`: `ibv_qp_to_qp_ex` returns it.
    pub(crate) has_ex: bool,
    /// The `wr_start` .. `wr_complete` batch of the `ibv_qp_ex` API.
    pub(crate) batch: Mutex<Batch>,
}

impl QpRec {
    /// The record behind an `ibv_qp` (or its `ibv_qp_ex`) of this library; `None` for NULL.
    ///
    /// # Safety
    /// `qp` is NULL or a live QP of this library.
    pub(crate) unsafe fn from_ibv<'a>(qp: *mut ibv_qp) -> Option<&'a Self> {
        // SAFETY: the `ibv_qp` is the start of `ex`, the first field of the record.
        unsafe { qp.cast::<Self>().as_ref() }
    }

    /// The public struct (C may write parts of it at any time; read fields through this).
    pub(crate) fn ibv(&self) -> *mut ibv_qp_ex {
        self.ex.get()
    }

    /// The context the QP was created on.
    fn context(&self) -> Option<&ContextRec> {
        // SAFETY: `context` is written once at creation and never by C; it is the live
        // context the QP was created on.
        unsafe { ContextRec::from_ibv((*self.ibv()).qp_base.context) }
    }
}

/// The device limits a QP is created against.
struct Limits {
    max_wr: u32,
    max_sge: u32,
}

impl Limits {
    fn of(dev: &Device) -> Self {
        let a = dev.query_device();
        Self {
            max_wr: a.max_qp_wr,
            max_sge: a.max_sge,
        }
    }
}

/// Creates a QP from an `ibv_qp_init_attr_ex` (`comp_mask` already checked) and writes the
/// capacities back into `attr.cap`.
///
/// # Safety
/// The pointers in `attr` are NULL or live objects of this library.
unsafe fn create(
    attr: &mut ibv_qp_init_attr_ex,
    send_ops: Option<u64>,
) -> Result<*mut ibv_qp, i32> {
    // SAFETY: per the contract.
    let pd = unsafe { PdRec::from_ibv(attr.pd) }.ok_or(libc::EINVAL)?;
    let ctx_ptr = pd.ibv.context;
    // SAFETY: a PD's context is the live context it was allocated on.
    let ctx = unsafe { ContextRec::from_ibv(ctx_ptr) }.ok_or(libc::EINVAL)?;
    let ty = match attr.qp_type {
        QPT_RC => QpType::Rc,
        QPT_UC => QpType::Uc,
        QPT_UD => QpType::Ud,
        QPT_RAW_PACKET | QPT_XRC_SEND | QPT_XRC_RECV | QPT_DRIVER => {
            trace(format_args!(
                "ibv_create_qp: QP type {} is not supported (RC, UC and UD are)",
                attr.qp_type
            ));
            return Err(libc::EOPNOTSUPP);
        }
        _ => return Err(libc::EINVAL),
    };
    // SAFETY: per the contract.
    let (send_cq, recv_cq) =
        unsafe { (CqRec::from_ibv(attr.send_cq), CqRec::from_ibv(attr.recv_cq)) };
    let (Some(send_cq), Some(recv_cq)) = (send_cq, recv_cq) else {
        trace(format_args!(
            "ibv_create_qp: send_cq and recv_cq are required"
        ));
        return Err(libc::EINVAL);
    };
    // SAFETY: per the contract.
    let srq = unsafe { SrqRec::from_ibv(attr.srq) };
    let lim = Limits::of(&ctx.dev);
    let c = attr.cap;
    let (max_recv_wr, max_recv_sge) = if srq.is_some() {
        (0, 0)
    } else {
        (c.max_recv_wr, c.max_recv_sge)
    };
    if c.max_send_wr > lim.max_wr
        || max_recv_wr > lim.max_wr
        || c.max_send_sge > lim.max_sge
        || max_recv_sge > lim.max_sge
        || c.max_inline_data > MAX_INLINE_DATA
    {
        trace(format_args!(
            "ibv_create_qp: capacities {}/{} WRs, {}/{} SGEs, {} inline bytes exceed the \
             device's {} WRs, {} SGEs, {MAX_INLINE_DATA} inline bytes",
            c.max_send_wr,
            c.max_recv_wr,
            c.max_send_sge,
            c.max_recv_sge,
            c.max_inline_data,
            lim.max_wr,
            lim.max_sge
        ));
        return Err(libc::EINVAL);
    }
    let config = QpConfig {
        max_send_wr: c.max_send_wr as usize,
        max_recv_wr: max_recv_wr as usize,
        max_sge: lim.max_sge as usize,
        max_inline_data: MAX_INLINE_DATA as usize,
        sq_sig_all: attr.sq_sig_all != 0,
        ..QpConfig::new(ty)
    };
    let init = QpInit {
        config,
        send_cq: send_cq.cq.clone(),
        recv_cq: recv_cq.cq.clone(),
        srq: srq.map(|s| s.srq.clone()),
    };
    let qp = pd.pd.create_qp(&init).map_err(|e| {
        trace(format_args!("ibv_create_qp: {e}"));
        errno_of_verbs(&e)
    })?;
    let cap = ibv_qp_cap {
        max_send_wr: c.max_send_wr,
        max_recv_wr,
        max_send_sge: lim.max_sge,
        max_recv_sge: if srq.is_some() { 0 } else { lim.max_sge },
        max_inline_data: MAX_INLINE_DATA,
    };
    let qpn = qp.qpn().value();
    let rec = Box::new(QpRec {
        ex: UnsafeCell::new(ibv_qp_ex::default()),
        qp,
        ty,
        cap,
        sq_sig_all: attr.sq_sig_all != 0,
        has_ex: send_ops.is_some(),
        batch: Mutex::new(Batch::default()),
    });
    let ex = rec.ibv();
    // SAFETY: `ex` points into the new record, which nothing else sees yet; the mutex and
    // condition variable are initialised in place (they must not move afterwards: the record
    // is boxed and never moves).
    unsafe {
        let b = &mut (*ex).qp_base;
        b.context = ctx_ptr;
        b.qp_context = attr.qp_context;
        b.pd = attr.pd;
        b.send_cq = attr.send_cq;
        b.recv_cq = attr.recv_cq;
        b.srq = attr.srq;
        b.handle = qpn;
        b.qp_num = qpn;
        b.state = QpState::Reset as u32;
        b.qp_type = attr.qp_type;
        b.events_completed = 0;
        libc::pthread_mutex_init(addr_of_mut!(b.mutex).cast(), ptr::null());
        libc::pthread_cond_init(addr_of_mut!(b.cond).cast(), ptr::null());
        if send_ops.is_some() {
            qp_ex::install(&mut *ex);
        }
    }
    // The PD, the CQs and the SRQ cannot be destroyed while the QP uses them (EBUSY).
    pd.hold();
    send_cq.hold();
    recv_cq.hold();
    if let Some(s) = srq {
        s.hold();
    }
    let ptr = Box::into_raw(rec).cast::<ibv_qp>();
    ctx.qps
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(qpn, ptr as usize);
    attr.cap = cap;
    Ok(ptr)
}

/// `ibv_create_qp(3)`: an RC, UC or UD queue pair in RESET. `init->cap` gets the capacities
/// the QP enforces.
///
/// # Safety
/// `pd` is NULL or a live PD of this library; `init` is NULL or a valid `ibv_qp_init_attr`
/// whose CQ and SRQ pointers are NULL or live objects of this library.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    init: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    guard_ptr("ibv_create_qp", || {
        // SAFETY: per the contract.
        let init = unsafe { init.as_mut() }.ok_or(libc::EINVAL)?;
        let mut ex = ibv_qp_init_attr_ex {
            qp_context: init.qp_context,
            send_cq: init.send_cq,
            recv_cq: init.recv_cq,
            srq: init.srq,
            cap: init.cap,
            qp_type: init.qp_type,
            sq_sig_all: init.sq_sig_all,
            comp_mask: INIT_ATTR_PD,
            pd,
            ..ibv_qp_init_attr_ex::default()
        };
        // SAFETY: per the contract.
        let qp = unsafe { create(&mut ex, None) }?;
        init.cap = ex.cap;
        Ok(qp)
    })
}

/// The send operations a QP of `ty` supports through the `ibv_qp_ex` API
/// (`IBV_QP_EX_WITH_*`).
fn supported_send_ops(ty: QpType) -> u64 {
    use crate::sys::{
        ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP as CAS,
        ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD as FAA,
        ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_ATOMIC_WRITE as AW,
        ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_RDMA_READ as READ,
        ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_RDMA_WRITE as WRITE,
        ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM as WRITE_IMM,
        ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_SEND as SEND,
        ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_SEND_WITH_IMM as SEND_IMM,
    };
    let bits = match ty {
        QpType::Rc => SEND | SEND_IMM | WRITE | WRITE_IMM | READ | CAS | FAA | AW,
        QpType::Uc => SEND | SEND_IMM | WRITE | WRITE_IMM,
        QpType::Ud => SEND | SEND_IMM,
    };
    u64::from(bits)
}

/// `verbs_context.create_qp_ex` (what `ibv_create_qp_ex` calls unless `comp_mask` is exactly
/// `IBV_QP_INIT_ATTR_PD`). `IBV_QP_INIT_ATTR_PD` is required; `SEND_OPS_FLAGS` fills the
/// `wr_*` table; XRC, RSS, TSO and creation flags are `EOPNOTSUPP`.
pub(crate) unsafe extern "C" fn create_qp_ex(
    ctx: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    guard_ptr("ibv_create_qp_ex", || {
        // SAFETY: the header passes the application's attribute struct.
        let attr = unsafe { attr.as_mut() }.ok_or(libc::EINVAL)?;
        let m = attr.comp_mask;
        if m & INIT_ATTR_PD == 0 || attr.pd.is_null() {
            trace(format_args!(
                "ibv_create_qp_ex: IBV_QP_INIT_ATTR_PD and a PD are required"
            ));
            return Err(libc::EINVAL);
        }
        // SAFETY: per the header's contract the PD is NULL or live.
        let pd = unsafe { PdRec::from_ibv(attr.pd) }.ok_or(libc::EINVAL)?;
        if pd.ibv.context != ctx {
            return Err(libc::EINVAL);
        }
        let known = INIT_ATTR_PD
            | INIT_ATTR_XRCD
            | INIT_ATTR_CREATE_FLAGS
            | INIT_ATTR_MAX_TSO_HEADER
            | INIT_ATTR_IND_TABLE
            | INIT_ATTR_RX_HASH
            | INIT_ATTR_SEND_OPS_FLAGS;
        if m & !known != 0 {
            return Err(libc::EINVAL);
        }
        let unsupported = m & (INIT_ATTR_XRCD | INIT_ATTR_IND_TABLE | INIT_ATTR_RX_HASH) != 0
            || (m & INIT_ATTR_CREATE_FLAGS != 0 && attr.create_flags != 0)
            || (m & INIT_ATTR_MAX_TSO_HEADER != 0 && attr.max_tso_header != 0);
        if unsupported {
            trace(format_args!(
                "ibv_create_qp_ex: XRC, RSS, TSO and creation flags are not supported"
            ));
            return Err(libc::EOPNOTSUPP);
        }
        let send_ops = if m & INIT_ATTR_SEND_OPS_FLAGS != 0 {
            let ty = match attr.qp_type {
                QPT_RC => QpType::Rc,
                QPT_UC => QpType::Uc,
                QPT_UD => QpType::Ud,
                // `create` answers for the type.
                _ => QpType::Rc,
            };
            let extra = attr.send_ops_flags & !supported_send_ops(ty);
            if extra != 0 {
                trace(format_args!(
                    "ibv_create_qp_ex: send_ops_flags {extra:#x} are not supported on {ty:?}"
                ));
                return Err(libc::EOPNOTSUPP);
            }
            Some(attr.send_ops_flags)
        } else {
            None
        };
        // SAFETY: per the header's contract.
        unsafe { create(attr, send_ops) }
    })
}

/// `ibv_qp_to_qp_ex(3)`: the `ibv_qp_ex` of a QP created with
/// `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`, NULL for any other QP.
///
/// # Safety
/// `qp` is NULL or a live QP of this library.
#[no_mangle]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    guard("ibv_qp_to_qp_ex", ptr::null_mut(), || {
        // SAFETY: per the contract.
        match unsafe { QpRec::from_ibv(qp) } {
            Some(rec) if rec.has_ex => rec.ibv(),
            _ => ptr::null_mut(),
        }
    })
}

/// The QP state of an `enum ibv_qp_state` value.
fn state_of(s: u32) -> Result<QpState, i32> {
    QpState::ALL.get(s as usize).copied().ok_or(libc::EINVAL)
}

/// The path MTU of an `enum ibv_mtu` value.
fn mtu_of(m: u32) -> Result<Mtu, i32> {
    match m {
        1 => Ok(Mtu::Mtu256),
        2 => Ok(Mtu::Mtu512),
        3 => Ok(Mtu::Mtu1024),
        4 => Ok(Mtu::Mtu2048),
        5 => Ok(Mtu::Mtu4096),
        _ => Err(libc::EINVAL),
    }
}

/// `ibv_qp_attr` + `IBV_QP_*` as rocectl's [`QpAttr`] + [`AttrMask`] (the same bits).
fn qp_attr(dev: &Device, a: &ibv_qp_attr, mask: u32) -> Result<(QpAttr, AttrMask), i32> {
    if mask & !KNOWN_ATTR_BITS != 0 {
        trace(format_args!(
            "ibv_modify_qp: attribute mask bits {:#x} are not supported",
            mask & !KNOWN_ATTR_BITS
        ));
        return Err(libc::EINVAL);
    }
    let m = AttrMask::from_bits(mask);
    let has = |bit: AttrMask| m.contains(bit);
    let mut q = QpAttr::default();
    if has(AttrMask::STATE) {
        q.state = state_of(a.qp_state)?;
    }
    if has(AttrMask::CUR_STATE) {
        q.cur_state = state_of(a.cur_qp_state)?;
    }
    if has(AttrMask::ACCESS_FLAGS) {
        q.access_flags = Access::from_bits(a.qp_access_flags & QP_ACCESS_BITS).unwrap_or_default();
    }
    if has(AttrMask::PKEY_INDEX) {
        q.pkey_index = a.pkey_index;
    }
    if has(AttrMask::PORT) {
        q.port = a.port_num;
    }
    if has(AttrMask::QKEY) {
        q.qkey = QKey::new(a.qkey);
    }
    if has(AttrMask::AV) {
        q.ah = address_handle(dev, &a.ah_attr, "ibv_modify_qp")?;
    }
    if has(AttrMask::PATH_MTU) {
        let want = mtu_of(a.path_mtu)?;
        let active = dev.query_port().active_mtu;
        if want > active {
            trace(format_args!(
                "ibv_modify_qp: path MTU {} lowered to the port's active MTU {}",
                want.bytes(),
                active.bytes()
            ));
        }
        q.path_mtu = want.min(active);
    }
    if has(AttrMask::TIMEOUT) {
        q.timeout = a.timeout;
    }
    if has(AttrMask::RETRY_CNT) {
        q.retry_cnt = a.retry_cnt;
    }
    if has(AttrMask::RNR_RETRY) {
        q.rnr_retry = a.rnr_retry;
    }
    if has(AttrMask::RQ_PSN) {
        q.rq_psn = Psn::new(a.rq_psn);
    }
    if has(AttrMask::MAX_QP_RD_ATOMIC) {
        q.max_rd_atomic = a.max_rd_atomic;
    }
    if has(AttrMask::MIN_RNR_TIMER) {
        q.min_rnr_timer = a.min_rnr_timer;
    }
    if has(AttrMask::SQ_PSN) {
        q.sq_psn = Psn::new(a.sq_psn);
    }
    if has(AttrMask::MAX_DEST_RD_ATOMIC) {
        q.max_dest_rd_atomic = a.max_dest_rd_atomic;
    }
    if has(AttrMask::DEST_QPN) {
        q.dest_qpn = Qpn::new(a.dest_qp_num);
    }
    Ok((q, m))
}

/// `ibv_modify_qp(3)`: moves the QP through RESET/INIT/RTR/RTS/SQD/SQE/ERR and sets the
/// attributes of `mask`. Returns 0 or `EINVAL` (a refused transition or attribute; the reason
/// is traced under `ROCECTL_VERBS_TRACE`). On success `qp->state` follows.
///
/// # Safety
/// `qp` is NULL or a live QP of this library; `attr` is NULL or readable.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    guard_int("ibv_modify_qp", || {
        // SAFETY: per the contract.
        let rec = unsafe { QpRec::from_ibv(qp) }.ok_or(libc::EINVAL)?;
        // SAFETY: per the contract.
        let attr = unsafe { attr.as_ref() }.ok_or(libc::EINVAL)?;
        let ctx = rec.context().ok_or(libc::EINVAL)?;
        let (a, m) = qp_attr(&ctx.dev, attr, mask as u32)?;
        rec.qp.modify(&a, m).map_err(|e| {
            trace(format_args!(
                "ibv_modify_qp: QP {:#x}: {e}",
                rec.qp.qpn().value()
            ));
            errno_of_verbs(&e)
        })?;
        if m.contains(AttrMask::STATE) {
            // SAFETY: `state` is a plain field of the live record; libibverbs updates it the
            // same way after a successful modify.
            unsafe { (*rec.ibv()).qp_base.state = a.state as u32 };
        }
        Ok(())
    })
}

/// `ibv_query_qp(3)`: fills `attr` with every attribute (whatever `mask` asks) and `init`
/// with the creation attributes; `qp->state` is refreshed as libibverbs does.
///
/// # Safety
/// `qp` is NULL or a live QP of this library; `attr` and `init` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    guard_int("ibv_query_qp", || {
        // SAFETY: per the contract.
        let rec = unsafe { QpRec::from_ibv(qp) }.ok_or(libc::EINVAL)?;
        // SAFETY: per the contract.
        let (out, init) = unsafe { (attr.as_mut(), init.as_mut()) };
        let (Some(out), Some(init)) = (out, init) else {
            return Err(libc::EINVAL);
        };
        let state = rec.qp.state();
        let a = rec.qp.attr();
        *out = ibv_qp_attr {
            qp_state: state as u32,
            cur_qp_state: state as u32,
            path_mtu: a.path_mtu as u32,
            path_mig_state: crate::sys::ibv_mig_state_IBV_MIG_MIGRATED,
            qkey: a.qkey.value(),
            rq_psn: a.rq_psn.value(),
            sq_psn: a.sq_psn.value(),
            dest_qp_num: a.dest_qpn.value(),
            qp_access_flags: a.access_flags.bits(),
            cap: rec.cap,
            ah_attr: ah_attr_of(&a.ah),
            pkey_index: a.pkey_index,
            sq_draining: 0,
            max_rd_atomic: a.max_rd_atomic,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            min_rnr_timer: a.min_rnr_timer,
            port_num: a.port,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            ..ibv_qp_attr::default()
        };
        let ex = rec.ibv();
        // SAFETY: the creation-time fields of the live record are written once at creation;
        // `state` is a plain field libibverbs refreshes the same way.
        unsafe {
            let b = &mut (*ex).qp_base;
            *init = ibv_qp_init_attr {
                qp_context: b.qp_context,
                send_cq: b.send_cq,
                recv_cq: b.recv_cq,
                srq: b.srq,
                cap: rec.cap,
                qp_type: b.qp_type,
                sq_sig_all: c_int::from(rec.sq_sig_all),
            };
            b.state = state as u32;
        }
        Ok(())
    })
}

/// `ibv_destroy_qp(3)`: the QP leaves the device (its queued work is dropped) and its record
/// is freed.
///
/// # Safety
/// `qp` is NULL or a live QP of this library that no other thread is using.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    guard_int("ibv_destroy_qp", || {
        // SAFETY: per the contract.
        let rec = unsafe { QpRec::from_ibv(qp) }.ok_or(libc::EINVAL)?;
        let qpn = rec.qp.qpn().value();
        let unmapped = roce_transport::unmapped_accesses();
        trace(format_args!(
            "destroy_qp {qpn:#x}: {unmapped} accesses so far found registered memory unmapped \
             (failed, not fatal); the first SIGSEGV handler is {}",
            first_segv_handler()
        ));
        if let Some(ctx) = rec.context() {
            ctx.qps
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&qpn);
        }
        let ex = rec.ibv();
        // SAFETY: the record is live; its PD, CQs and SRQ outlive it (their destroy verbs
        // refuse while the QP holds them); the mutex/cond were initialised at creation and are
        // unused now.
        unsafe {
            let b = &(*ex).qp_base;
            if let Some(pd) = PdRec::from_ibv(b.pd) {
                pd.release();
            }
            if let Some(cq) = CqRec::from_ibv(b.send_cq) {
                cq.release();
            }
            if let Some(cq) = CqRec::from_ibv(b.recv_cq) {
                cq.release();
            }
            if let Some(srq) = SrqRec::from_ibv(b.srq) {
                srq.release();
            }
            libc::pthread_mutex_destroy(addr_of_mut!((*ex).qp_base.mutex).cast());
            libc::pthread_cond_destroy(addr_of_mut!((*ex).qp_base.cond).cast());
        }
        // SAFETY: `qp` came from `Box::into_raw` in `create`; the caller no longer uses it.
        drop(unsafe { Box::from_raw(qp.cast::<QpRec>()) });
        Ok(())
    })
}

/// The SGEs of a WR as a slice; `EINVAL` for a negative count, more than `max`, or a NULL list.
///
/// # Safety
/// `list` is NULL or points to `n` readable `ibv_sge`s.
pub(crate) unsafe fn sge_slice<'a>(
    list: *const ibv_sge,
    n: c_int,
    max: u32,
) -> Result<&'a [ibv_sge], i32> {
    if n <= 0 {
        return if n == 0 { Ok(&[]) } else { Err(libc::EINVAL) };
    }
    if n as u32 > max || list.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: per the contract.
    Ok(unsafe { std::slice::from_raw_parts(list, n as usize) })
}

/// An `ibv_sge` as a rocectl SGE.
pub(crate) fn sge(s: &ibv_sge) -> Sge {
    Sge {
        addr: s.addr,
        length: s.length,
        lkey: LKey::new(s.lkey),
    }
}

/// Copies the bytes of `sges` (application virtual addresses; keys ignored) for an inline send.
///
/// # Safety
/// Each SGE names `length` readable bytes at `addr`.
pub(crate) unsafe fn inline_bytes(sges: &[ibv_sge], max: u32) -> Result<Vec<u8>, i32> {
    let total: u64 = sges.iter().map(|s| u64::from(s.length)).sum();
    if total > u64::from(max) {
        trace(format_args!(
            "ibv_post_send: {total} inline bytes exceed max_inline_data {max}"
        ));
        return Err(libc::EINVAL);
    }
    let mut out = Vec::with_capacity(total as usize);
    for s in sges {
        if s.length == 0 {
            continue;
        }
        if s.addr == 0 {
            return Err(libc::EINVAL);
        }
        // SAFETY: per the contract.
        out.extend_from_slice(unsafe {
            std::slice::from_raw_parts(s.addr as usize as *const u8, s.length as usize)
        });
    }
    Ok(out)
}

/// One `ibv_send_wr` as a rocectl send WR.
///
/// # Safety
/// `w` is a valid WR of the application (its SGE list and, for UD, its AH live).
unsafe fn send_wr(rec: &QpRec, w: &ibv_send_wr) -> Result<SendWr, i32> {
    let flags = w.send_flags;
    // SAFETY: both members of the union are a plain `u32`.
    let imm = u32::from_be(unsafe { w.__bindgen_anon_1.imm_data });
    // SAFETY: the members of the `wr` union are plain data; the opcode says which one holds.
    let (rdma, atomic) = unsafe { (w.wr.rdma, w.wr.atomic) };
    let op = match w.opcode {
        WR_SEND => SendOp::Send,
        WR_SEND_WITH_IMM => SendOp::SendWithImm { imm },
        WR_RDMA_WRITE => SendOp::RdmaWrite {
            remote_addr: rdma.remote_addr,
            rkey: RKey::new(rdma.rkey),
        },
        WR_RDMA_WRITE_WITH_IMM => SendOp::RdmaWriteWithImm {
            remote_addr: rdma.remote_addr,
            rkey: RKey::new(rdma.rkey),
            imm,
        },
        WR_RDMA_READ => SendOp::RdmaRead {
            remote_addr: rdma.remote_addr,
            rkey: RKey::new(rdma.rkey),
        },
        WR_ATOMIC_CMP_AND_SWP => SendOp::AtomicCmpAndSwp {
            remote_addr: atomic.remote_addr,
            rkey: RKey::new(atomic.rkey),
            compare: atomic.compare_add,
            swap: atomic.swap,
        },
        WR_ATOMIC_FETCH_AND_ADD => SendOp::AtomicFetchAndAdd {
            remote_addr: atomic.remote_addr,
            rkey: RKey::new(atomic.rkey),
            add: atomic.compare_add,
        },
        WR_ATOMIC_WRITE => SendOp::AtomicWrite {
            remote_addr: rdma.remote_addr,
            rkey: RKey::new(rdma.rkey),
        },
        other => {
            trace(format_args!(
                "ibv_post_send: opcode {other} is not supported (SEND_WITH_INV, LOCAL_INV, \
                 BIND_MW and TSO are not)"
            ));
            return Err(libc::EINVAL);
        }
    };
    // SAFETY: per the contract.
    let list = unsafe { sge_slice(w.sg_list, w.num_sge, rec.cap.max_send_sge) }?;
    let data = if flags & SEND_INLINE != 0 && !op.returns_data() {
        // SAFETY: per the contract, the SGEs name the application's readable bytes.
        SendData::Inline(unsafe { inline_bytes(list, rec.cap.max_inline_data) }?)
    } else {
        SendData::Sges(list.iter().map(sge).collect())
    };
    let ud = if rec.ty == QpType::Ud {
        // SAFETY: a UD WR's union holds the `ud` member.
        let ud = unsafe { w.wr.ud };
        // SAFETY: per the contract, the AH is live.
        let ah = unsafe { AhRec::from_ibv(ud.ah) }.ok_or(libc::EINVAL)?;
        Some(UdDest {
            ah: ah.ah,
            remote_qpn: Qpn::new(ud.remote_qpn),
            remote_qkey: QKey::new(ud.remote_qkey),
        })
    } else {
        None
    };
    Ok(SendWr {
        wr_id: w.wr_id,
        op,
        data,
        signaled: flags & SEND_SIGNALED != 0,
        solicited: flags & SEND_SOLICITED != 0,
        ud,
    })
}

/// The `n`th WR of a chain (0 is `head`).
///
/// # Safety
/// The chain has more than `n` valid WRs.
unsafe fn nth_send(head: *mut ibv_send_wr, n: usize) -> *mut ibv_send_wr {
    let mut w = head;
    for _ in 0..n {
        // SAFETY: per the contract.
        w = unsafe { (*w).next };
    }
    w
}

/// Posts a chain; returns 0 or the errno of the first refused WR, stored in `failed`.
///
/// # Safety
/// `wr` is NULL or a valid chain.
unsafe fn post_chain(rec: &QpRec, wr: *mut ibv_send_wr, failed: &mut *mut ibv_send_wr) -> c_int {
    if wr.is_null() {
        return 0;
    }
    // SAFETY: per the contract.
    let first = unsafe { &*wr };
    if first.next.is_null() {
        // SAFETY: per the contract.
        let r = unsafe { send_wr(rec, first) }.and_then(|w| {
            rec.qp.post_send_coalesced(w).map_err(|e| {
                trace(format_args!("ibv_post_send: {e}"));
                errno_of_post(&e)
            })
        });
        return match r {
            Ok(()) => 0,
            Err(e) => {
                *failed = wr;
                e
            }
        };
    }
    let mut cur = wr;
    let mut bad_conversion = None;
    let wrs = std::iter::from_fn(|| {
        if cur.is_null() {
            return None;
        }
        // SAFETY: per the contract, every WR of the chain is valid.
        match unsafe { send_wr(rec, &*cur) } {
            Ok(w) => {
                // SAFETY: as above.
                cur = unsafe { (*cur).next };
                Some(w)
            }
            Err(e) => {
                bad_conversion = Some(e);
                None
            }
        }
    });
    match rec.qp.post_send_batch(wrs) {
        Ok(_) => match bad_conversion {
            Some(e) => {
                *failed = cur;
                e
            }
            None => 0,
        },
        Err((n, e)) => {
            trace(format_args!("ibv_post_send: {e}"));
            // SAFETY: the batch consumed `n + 1` WRs of the chain.
            *failed = unsafe { nth_send(wr, n) };
            errno_of_post(&e)
        }
    }
}

/// `ibv_context_ops.post_send`.
pub(crate) unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    guard("ibv_post_send", libc::EIO, || {
        // SAFETY: the inline `ibv_post_send` passes a QP of this library.
        let Some(rec) = (unsafe { QpRec::from_ibv(qp) }) else {
            return libc::EINVAL;
        };
        let mut failed = ptr::null_mut();
        // SAFETY: the application's chain.
        let r = unsafe { post_chain(rec, wr, &mut failed) };
        if r != 0 {
            if !bad.is_null() {
                // SAFETY: `bad` is the application's out-pointer.
                unsafe { *bad = failed };
            }
            set_errno(r);
        }
        r
    })
}

/// One `ibv_recv_wr` as a rocectl receive WR.
///
/// # Safety
/// `w` is a valid WR whose SGE list has `num_sge` entries.
pub(crate) unsafe fn recv_wr(w: &ibv_recv_wr, max_sge: u32) -> Result<RecvWr, i32> {
    // SAFETY: per the contract.
    let list = unsafe { sge_slice(w.sg_list, w.num_sge, max_sge) }?;
    Ok(RecvWr {
        wr_id: w.wr_id,
        sges: list.iter().map(sge).collect(),
    })
}

/// `ibv_context_ops.post_recv`.
pub(crate) unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    guard("ibv_post_recv", libc::EIO, || {
        // SAFETY: the inline `ibv_post_recv` passes a QP of this library.
        let Some(rec) = (unsafe { QpRec::from_ibv(qp) }) else {
            return libc::EINVAL;
        };
        // SAFETY: the application's chain and out-pointer.
        unsafe {
            post_recv_chain(wr, bad, rec.cap.max_recv_sge.max(1), |r| {
                rec.qp.post_recv(r).map_err(|e| {
                    trace(format_args!("ibv_post_recv: {e}"));
                    errno_of_post(&e)
                })
            })
        }
    })
}

/// Walks an `ibv_recv_wr` chain, posting each WR with `post`; on the first refusal sets
/// `*bad` (when not NULL) and errno and returns the errno value (the WRs before it stay
/// posted), else 0. Shared by `post_recv` and `post_srq_recv`.
///
/// # Safety
/// `wr` is NULL or a valid chain whose SGE lists have `num_sge` entries; `bad` is NULL or
/// writable.
pub(crate) unsafe fn post_recv_chain(
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
    max_sge: u32,
    mut post: impl FnMut(RecvWr) -> Result<(), i32>,
) -> c_int {
    let mut cur = wr;
    while !cur.is_null() {
        // SAFETY: the application's chain, per the contract.
        let w = unsafe { &*cur };
        // SAFETY: as above.
        if let Err(e) = unsafe { recv_wr(w, max_sge) }.and_then(&mut post) {
            if !bad.is_null() {
                // SAFETY: `bad` is the application's out-pointer.
                unsafe { *bad = cur };
            }
            set_errno(e);
            return e;
        }
        cur = w.next;
    }
    0
}

/// `ibv_query_qp_data_in_order(3)`: 0, "not guaranteed". The responder writes a message's
/// packets in PSN order, but with relaxed stores that another CPU may observe in any order.
///
/// # Safety
/// Any arguments (none is dereferenced).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp_data_in_order(
    _qp: *mut ibv_qp,
    _op: ibv_wr_opcode,
    _flags: u32,
) -> c_int {
    0
}

/// `ibv_query_ece(3)`: `EOPNOTSUPP` (no enhanced connection establishment).
///
/// # Safety
/// Any arguments (none is dereferenced).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_ece(_qp: *mut ibv_qp, _ece: *mut ibv_ece) -> c_int {
    guard_int("ibv_query_ece", || Err(libc::EOPNOTSUPP))
}

/// `ibv_set_ece(3)`: `EOPNOTSUPP` (no enhanced connection establishment).
///
/// # Safety
/// Any arguments (none is dereferenced).
#[no_mangle]
pub unsafe extern "C" fn ibv_set_ece(_qp: *mut ibv_qp, _ece: *mut ibv_ece) -> c_int {
    guard_int("ibv_set_ece", || Err(libc::EOPNOTSUPP))
}

/// `ibv_attach_mcast(3)`: `EOPNOTSUPP` (no multicast).
///
/// # Safety
/// Any arguments (none is dereferenced).
#[no_mangle]
pub unsafe extern "C" fn ibv_attach_mcast(
    _qp: *mut ibv_qp,
    _gid: *const ibv_gid,
    _lid: u16,
) -> c_int {
    guard_int("ibv_attach_mcast", || Err(libc::EOPNOTSUPP))
}

/// `ibv_detach_mcast(3)`: `EOPNOTSUPP` (no multicast).
///
/// # Safety
/// Any arguments (none is dereferenced).
#[no_mangle]
pub unsafe extern "C" fn ibv_detach_mcast(
    _qp: *mut ibv_qp,
    _gid: *const ibv_gid,
    _lid: u16,
) -> c_int {
    guard_int("ibv_detach_mcast", || Err(libc::EOPNOTSUPP))
}

/// Two contexts on a simulated network, for the tests of this crate's QP, SRQ and AH verbs.
/// For `ROCECTL_VERBS_TRACE`: whose handler SIGSEGV reaches first ("ours" when it is the
/// fault guard of region memory, which must be first to survive memory unmapped while
/// registered), by the shared object that holds it.
fn first_segv_handler() -> String {
    if roce_transport::unmapped_guard_on_top() {
        return "ours (the fault guard)".to_owned();
    }
    // SAFETY: querying a disposition into a zeroed, writable sigaction; dladdr only reads the
    // address and fills `info`, whose name is a NUL-terminated string of the loader or null.
    #[allow(unsafe_code)]
    unsafe {
        let mut cur: libc::sigaction = core::mem::zeroed();
        if libc::sigaction(libc::SIGSEGV, ptr::null(), &mut cur) != 0 {
            return "unknown".to_owned();
        }
        match cur.sa_sigaction {
            libc::SIG_DFL => return "none (default)".to_owned(),
            libc::SIG_IGN => return "none (ignored)".to_owned(),
            _ => {}
        }
        let mut info: libc::Dl_info = core::mem::zeroed();
        if libc::dladdr(cur.sa_sigaction as *const std::ffi::c_void, &mut info) == 0
            || info.dli_fname.is_null()
        {
            return format!("at {:#x}", cur.sa_sigaction);
        }
        format!(
            "in {}",
            std::ffi::CStr::from_ptr(info.dli_fname).to_string_lossy()
        )
    }
}

#[cfg(test)]
pub(crate) mod harness {
    use std::time::Duration;

    use roce_transport::{Access, Device, DeviceConfig, MemoryRegion, SimNetwork};

    use super::*;
    use crate::sys::ibv_cq;
    pub(crate) use crate::sys::{
        ibv_wc, ibv_wc_flags_IBV_WC_GRH as WC_GRH, ibv_wc_flags_IBV_WC_WITH_IMM as WC_WITH_IMM,
        ibv_wc_opcode_IBV_WC_COMP_SWAP as WC_COMP_SWAP,
        ibv_wc_opcode_IBV_WC_RDMA_READ as WC_RDMA_READ,
        ibv_wc_opcode_IBV_WC_RDMA_WRITE as WC_RDMA_WRITE, ibv_wc_opcode_IBV_WC_RECV as WC_RECV,
        ibv_wc_opcode_IBV_WC_SEND as WC_SEND, ibv_wc_status_IBV_WC_SUCCESS as WC_SUCCESS,
    };

    /// The immediate data of a work completion, host order (`wc.imm_data` is network order).
    pub(crate) fn imm(wc: &ibv_wc) -> u32 {
        // SAFETY: both members of the union are a plain `u32`.
        u32::from_be(unsafe { wc.__bindgen_anon_1.imm_data })
    }

    /// One side: a context, a PD and a CQ of this library, built as the device and memcq
    /// modules build them.
    pub(crate) struct Side {
        pub(crate) ctx: *mut ibv_context,
        pub(crate) pd: *mut ibv_pd,
        pub(crate) cq: *mut ibv_cq,
        pub(crate) dev: Device,
    }

    impl Side {
        pub(crate) fn open(net: &SimNetwork, ip: &str) -> Self {
            // The path MTU of a 1500-byte Ethernet port, as on a default veth.
            let config = DeviceConfig::sim(net, ip.parse().unwrap())
                .name(format!("sim_{ip}"))
                .mtu(Mtu::Mtu1024);
            let dev = Device::open(config).unwrap();
            let ctx = crate::context::open_test_context(dev.clone());
            // SAFETY: a live context of this library.
            let pd = unsafe { crate::pd::ibv_alloc_pd(ctx) };
            assert!(!pd.is_null());
            // SAFETY: as above.
            let cq =
                unsafe { crate::cq::ibv_create_cq(ctx, 256, ptr::null_mut(), ptr::null_mut(), 0) };
            assert!(!cq.is_null());
            Self { ctx, pd, cq, dev }
        }

        /// A registered buffer of `len` bytes holding `fill`.
        pub(crate) fn mr(&self, len: usize, fill: u8) -> MemoryRegion {
            // SAFETY: the harness's own PD.
            let pd = unsafe { PdRec::from_ibv(self.pd) }.unwrap();
            let access = Access::LOCAL_WRITE
                | Access::REMOTE_WRITE
                | Access::REMOTE_READ
                | Access::REMOTE_ATOMIC;
            pd.pd.register(vec![fill; len], access).unwrap()
        }

        /// Waits up to 5 s for `n` work completions of the side's CQ, polled with
        /// `ibv_poll_cq` (the context's `poll_cq` slot).
        pub(crate) fn poll(&self, n: usize) -> Vec<ibv_wc> {
            self.poll_within(n, Duration::from_secs(5))
        }

        /// Waits up to `timeout` for `n` work completions (`ibv_poll_cq`).
        pub(crate) fn poll_within(&self, n: usize, timeout: Duration) -> Vec<ibv_wc> {
            let mut out = vec![ibv_wc::default(); n];
            let mut got = 0;
            let deadline = std::time::Instant::now() + timeout;
            while got < n && std::time::Instant::now() < deadline {
                // SAFETY: the harness's CQ; `out[got..]` has room for `n - got` entries.
                let r = unsafe {
                    let poll = (*(*self.cq).context).ops.poll_cq.unwrap();
                    poll(self.cq, (n - got) as c_int, out[got..].as_mut_ptr())
                };
                assert!(r >= 0, "ibv_poll_cq: {r}");
                if r == 0 {
                    std::thread::sleep(Duration::from_micros(200));
                }
                got += r as usize;
            }
            out.truncate(got);
            out
        }

        /// An `ibv_qp_init_attr` of `ty` with both completions to the side's CQ.
        pub(crate) fn init_attr(&self, ty: ibv_qp_type) -> ibv_qp_init_attr {
            ibv_qp_init_attr {
                send_cq: self.cq,
                recv_cq: self.cq,
                cap: ibv_qp_cap {
                    max_send_wr: 64,
                    max_recv_wr: 64,
                    max_send_sge: 2,
                    max_recv_sge: 2,
                    max_inline_data: 64,
                },
                qp_type: ty,
                ..ibv_qp_init_attr::default()
            }
        }

        /// A new QP of `ty`.
        pub(crate) fn qp(&self, ty: ibv_qp_type) -> *mut ibv_qp {
            let mut init = self.init_attr(ty);
            // SAFETY: the harness's own PD and CQ.
            let qp = unsafe { ibv_create_qp(self.pd, &mut init) };
            assert!(
                !qp.is_null(),
                "ibv_create_qp: {}",
                std::io::Error::last_os_error()
            );
            qp
        }

        /// The `ibv_ah_attr` that reaches `peer` from this side (what `-g <index>` gives).
        pub(crate) fn ah_attr_to(&self, peer: &Self) -> crate::sys::ibv_ah_attr {
            let mut a = crate::sys::ibv_ah_attr {
                is_global: 1,
                port_num: 1,
                ..Default::default()
            };
            a.grh.dgid.raw = peer.dev.local_gid().0;
            a.grh.sgid_index = self.dev.local_gid_index().unwrap();
            a.grh.hop_limit = 1;
            a
        }
    }

    /// `ibv_modify_qp` with `mask`, returning its value.
    pub(crate) fn modify(qp: *mut ibv_qp, attr: &mut ibv_qp_attr, mask: u32) -> c_int {
        // SAFETY: a live QP of the test and a local attribute struct.
        unsafe { ibv_modify_qp(qp, attr, mask as c_int) }
    }

    use crate::sys::{
        ibv_qp_attr_mask_IBV_QP_ACCESS_FLAGS as ACCESS, ibv_qp_attr_mask_IBV_QP_AV as AV,
        ibv_qp_attr_mask_IBV_QP_DEST_QPN as DEST_QPN,
        ibv_qp_attr_mask_IBV_QP_MAX_DEST_RD_ATOMIC as MAX_DEST,
        ibv_qp_attr_mask_IBV_QP_MAX_QP_RD_ATOMIC as MAX_RD,
        ibv_qp_attr_mask_IBV_QP_MIN_RNR_TIMER as MIN_RNR, ibv_qp_attr_mask_IBV_QP_PATH_MTU as MTU,
        ibv_qp_attr_mask_IBV_QP_PKEY_INDEX as PKEY, ibv_qp_attr_mask_IBV_QP_PORT as PORT,
        ibv_qp_attr_mask_IBV_QP_QKEY as QKEY, ibv_qp_attr_mask_IBV_QP_RETRY_CNT as RETRY,
        ibv_qp_attr_mask_IBV_QP_RNR_RETRY as RNR_RETRY, ibv_qp_attr_mask_IBV_QP_RQ_PSN as RQ_PSN,
        ibv_qp_attr_mask_IBV_QP_SQ_PSN as SQ_PSN, ibv_qp_attr_mask_IBV_QP_STATE as STATE,
        ibv_qp_attr_mask_IBV_QP_TIMEOUT as TIMEOUT,
    };

    /// The masks rdma-core's `ibv_rc_pingpong` uses (INIT, RTR, RTS); UC and UD take theirs.
    pub(crate) fn bring_up(qp: *mut ibv_qp, ty: ibv_qp_type, side: &Side, peer: &Side, dqpn: u32) {
        let mut a = ibv_qp_attr {
            qp_state: crate::sys::ibv_qp_state_IBV_QPS_INIT,
            port_num: 1,
            qkey: 0x1111_1111,
            qp_access_flags: 0x0F,
            ..ibv_qp_attr::default()
        };
        let init = match ty {
            QPT_UD => STATE | PKEY | PORT | QKEY,
            _ => STATE | PKEY | PORT | ACCESS,
        };
        assert_eq!(modify(qp, &mut a, init), 0, "to INIT");
        a.qp_state = crate::sys::ibv_qp_state_IBV_QPS_RTR;
        a.path_mtu = crate::sys::ibv_mtu_IBV_MTU_1024;
        a.dest_qp_num = dqpn;
        a.rq_psn = 0;
        a.max_dest_rd_atomic = 16;
        a.min_rnr_timer = 12;
        a.ah_attr = side.ah_attr_to(peer);
        let rtr = match ty {
            QPT_RC => STATE | AV | MTU | DEST_QPN | RQ_PSN | MAX_DEST | MIN_RNR,
            QPT_UC => STATE | AV | MTU | DEST_QPN | RQ_PSN,
            _ => STATE,
        };
        assert_eq!(modify(qp, &mut a, rtr), 0, "to RTR");
        a.qp_state = crate::sys::ibv_qp_state_IBV_QPS_RTS;
        a.sq_psn = 0;
        a.timeout = 14;
        a.retry_cnt = 7;
        a.rnr_retry = 7;
        a.max_rd_atomic = 16;
        let rts = match ty {
            QPT_RC => STATE | SQ_PSN | TIMEOUT | RETRY | RNR_RETRY | MAX_RD,
            _ => STATE | SQ_PSN,
        };
        assert_eq!(modify(qp, &mut a, rts), 0, "to RTS");
    }

    /// Two sides on one simulated network and a connected pair of QPs of `ty` between them.
    pub(crate) fn connected(ty: ibv_qp_type) -> (Side, Side, *mut ibv_qp, *mut ibv_qp) {
        let net = SimNetwork::perfect();
        let (a, b) = (Side::open(&net, "10.0.0.1"), Side::open(&net, "10.0.0.2"));
        let (qa, qb) = (a.qp(ty), b.qp(ty));
        // SAFETY: live QPs of the test.
        let (na, nb) = unsafe { ((*qa).qp_num, (*qb).qp_num) };
        bring_up(qa, ty, &a, &b, nb);
        bring_up(qb, ty, &b, &a, na);
        (a, b, qa, qb)
    }

    /// A fresh private anonymous mapping of `len` bytes (memory a test can unmap under a
    /// registration).
    pub(crate) fn map_anonymous(len: usize) -> *mut std::ffi::c_void {
        // SAFETY: a new mapping; no existing memory is touched.
        let p = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "mmap");
        p
    }

    /// Takes `p .. p + len` away as `munmap` would, keeping the addresses reserved (an
    /// inaccessible mapping in their place) so that no other thread's mapping lands there
    /// while the test runs.
    pub(crate) fn revoke(p: *mut std::ffi::c_void, len: usize) {
        // SAFETY: the range is (part of) a test's own mapping that only the library refers
        // to; MAP_FIXED replaces exactly that range.
        let q = unsafe {
            libc::mmap(
                p,
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_eq!(q, p, "mmap PROT_NONE over the range");
    }

    /// Posts one send WR through `ibv_context_ops.post_send`.
    pub(crate) fn post(qp: *mut ibv_qp, wr: &mut ibv_send_wr) -> (c_int, *mut ibv_send_wr) {
        let mut bad = ptr::null_mut();
        // SAFETY: a live QP and the test's WR chain.
        let r = unsafe { ((*(*qp).context).ops.post_send.unwrap())(qp, wr, &mut bad) };
        (r, bad)
    }

    /// Posts one receive WR of one SGE.
    pub(crate) fn post_recv_one(qp: *mut ibv_qp, wr_id: u64, s: Sge) -> c_int {
        let mut sg = ibv_sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey.value(),
        };
        let mut wr = ibv_recv_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: &mut sg,
            num_sge: 1,
        };
        let mut bad = ptr::null_mut();
        // SAFETY: a live QP and the test's WR.
        unsafe { ((*(*qp).context).ops.post_recv.unwrap())(qp, &mut wr, &mut bad) }
    }

    /// An `ibv_sge` of a transport SGE.
    pub(crate) fn ibv_sge_of(s: Sge) -> ibv_sge {
        ibv_sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey.value(),
        }
    }
}

#[cfg(test)]
mod tests {

    use super::harness::*;
    use super::*;
    use crate::sys::{ibv_qp_attr_mask_IBV_QP_STATE, ibv_send_wr__bindgen_ty_2};

    fn wr(wr_id: u64, opcode: ibv_wr_opcode, sges: &mut [ibv_sge]) -> ibv_send_wr {
        ibv_send_wr {
            wr_id,
            sg_list: sges.as_mut_ptr(),
            num_sge: sges.len() as c_int,
            opcode,
            send_flags: SEND_SIGNALED,
            ..ibv_send_wr::default()
        }
    }

    fn rdma(remote_addr: u64, rkey: u32) -> ibv_send_wr__bindgen_ty_2 {
        let mut u = ibv_send_wr__bindgen_ty_2::default();
        u.rdma.remote_addr = remote_addr;
        u.rdma.rkey = rkey;
        u
    }

    /// An RDMA WRITE or atomic aimed at memory the peer unmapped while it was registered is
    /// NAKed (remote access error) and the peer process lives on.
    #[test]
    fn a_remote_access_to_memory_unmapped_while_registered_is_naked() {
        use crate::sys::ibv_wc_status_IBV_WC_REM_ACCESS_ERR as WC_REM_ACCESS_ERR;
        const LEN: usize = 4096;
        let access = (crate::sys::ibv_access_flags_IBV_ACCESS_LOCAL_WRITE
            | crate::sys::ibv_access_flags_IBV_ACCESS_REMOTE_WRITE
            | crate::sys::ibv_access_flags_IBV_ACCESS_REMOTE_ATOMIC) as c_int;
        for atomic in [false, true] {
            let (a, b, qa, _qb) = connected(QPT_RC);
            let p = map_anonymous(LEN);
            // SAFETY: the harness's PD over the test's mapping.
            let mr = unsafe { crate::mr::ibv_reg_mr(b.pd, p, LEN, access) };
            assert!(!mr.is_null());
            // SAFETY: a live MR; then the mapping, which only the library refers to.
            let rkey = unsafe { (*mr).rkey };
            revoke(p, LEN);
            let before = roce_transport::unmapped_accesses();

            let src = a.mr(64, 0x5A);
            let mut sg = [ibv_sge_of(src.sge(0, if atomic { 8 } else { 64 }))];
            let mut w = if atomic {
                let mut w = wr(1, WR_ATOMIC_FETCH_AND_ADD, &mut sg);
                w.wr.atomic.remote_addr = p as u64 + 64;
                w.wr.atomic.rkey = rkey;
                w.wr.atomic.compare_add = 1;
                w
            } else {
                let mut w = wr(1, WR_RDMA_WRITE, &mut sg);
                w.wr = rdma(p as u64 + 100, rkey);
                w
            };
            assert_eq!(post(qa, &mut w).0, 0);
            let c = a.poll(1);
            assert_eq!(
                (c[0].wr_id, c[0].status),
                (1, WC_REM_ACCESS_ERR),
                "atomic {atomic}"
            );
            assert!(roce_transport::unmapped_accesses() > before);
            // SAFETY: the test's MR.
            assert_eq!(unsafe { crate::mr::ibv_dereg_mr(mr) }, 0);
        }
    }

    #[test]
    fn rc_write_send_read_and_atomics_through_post_send() {
        let (a, b, qa, qb) = connected(QPT_RC);
        let src = a.mr(64, 0x5A);
        let dst = b.mr(64, 0);

        // WRITE 64 bytes.
        let mut sg = [ibv_sge_of(src.sge(0, 64))];
        let mut w = wr(1, WR_RDMA_WRITE, &mut sg);
        w.wr = rdma(dst.addr(), dst.rkey().value());
        assert_eq!(post(qa, &mut w).0, 0);
        let c = a.poll(1);
        assert_eq!(c.len(), 1);
        assert_eq!(
            (c[0].wr_id, c[0].status, c[0].opcode),
            (1, WC_SUCCESS, WC_RDMA_WRITE)
        );
        assert_eq!(dst.to_vec(), vec![0x5A; 64]);

        // SEND with immediate (network order in the WR) into a posted receive.
        let rbuf = b.mr(64, 0);
        assert_eq!(post_recv_one(qb, 7, rbuf.sge(0, 64)), 0);
        src.write(0, b"hello").unwrap();
        let mut sg = [ibv_sge_of(src.sge(0, 5))];
        let mut w = wr(2, WR_SEND_WITH_IMM, &mut sg);
        w.__bindgen_anon_1.imm_data = 0x1234_5678u32.to_be();
        assert_eq!(post(qa, &mut w).0, 0);
        let c = b.poll(1);
        assert_eq!((c[0].wr_id, c[0].status, c[0].byte_len), (7, WC_SUCCESS, 5));
        assert_eq!(c[0].opcode, WC_RECV);
        assert_ne!(c[0].wc_flags & WC_WITH_IMM, 0);
        assert_eq!(imm(&c[0]), 0x1234_5678);
        assert_eq!(&rbuf.to_vec()[..5], b"hello");
        assert_eq!(a.poll(1)[0].wr_id, 2);

        // READ the remote buffer back.
        let back = a.mr(64, 0);
        let mut sg = [ibv_sge_of(back.sge(0, 64))];
        let mut w = wr(3, WR_RDMA_READ, &mut sg);
        w.wr = rdma(dst.addr(), dst.rkey().value());
        assert_eq!(post(qa, &mut w).0, 0);
        let c = a.poll(1);
        assert_eq!((c[0].status, c[0].opcode), (WC_SUCCESS, WC_RDMA_READ));
        assert_eq!(back.to_vec(), vec![0x5A; 64]);

        // FETCH_AND_ADD then CMP_AND_SWP on 8 bytes of the remote buffer.
        let word = b.mr(8, 0);
        word.write(0, &5u64.to_ne_bytes()).unwrap();
        let old = a.mr(8, 0);
        let mut sg = [ibv_sge_of(old.sge(0, 8))];
        let mut w = wr(4, WR_ATOMIC_FETCH_AND_ADD, &mut sg);
        w.wr.atomic.remote_addr = word.addr();
        w.wr.atomic.rkey = word.rkey().value();
        w.wr.atomic.compare_add = 10;
        assert_eq!(post(qa, &mut w).0, 0);
        assert_eq!(a.poll(1)[0].status, WC_SUCCESS);
        assert_eq!(u64::from_ne_bytes(old.to_vec().try_into().unwrap()), 5);
        let mut w = wr(5, WR_ATOMIC_CMP_AND_SWP, &mut sg);
        w.wr.atomic.remote_addr = word.addr();
        w.wr.atomic.rkey = word.rkey().value();
        w.wr.atomic.compare_add = 15;
        w.wr.atomic.swap = 99;
        assert_eq!(post(qa, &mut w).0, 0);
        let c = a.poll(1);
        assert_eq!((c[0].wr_id, c[0].opcode), (5, WC_COMP_SWAP));
        assert_eq!(u64::from_ne_bytes(old.to_vec().try_into().unwrap()), 15);
        assert_eq!(u64::from_ne_bytes(word.to_vec().try_into().unwrap()), 99);

        // SAFETY: the test's QPs.
        unsafe {
            assert_eq!(ibv_destroy_qp(qa), 0);
            assert_eq!(ibv_destroy_qp(qb), 0);
        }
    }

    #[test]
    fn inline_send_copies_the_bytes_at_post_time() {
        let (a, b, qa, qb) = connected(QPT_RC);
        let rbuf = b.mr(64, 0);
        assert_eq!(post_recv_one(qb, 1, rbuf.sge(0, 64)), 0);
        // Application memory, not registered: inline sends ignore the lkey.
        let mut msg = *b"inline!";
        let mut sg = [ibv_sge {
            addr: msg.as_mut_ptr() as u64,
            length: msg.len() as u32,
            lkey: 0xDEAD,
        }];
        let mut w = wr(9, WR_SEND, &mut sg);
        w.send_flags = SEND_SIGNALED | SEND_INLINE;
        assert_eq!(post(qa, &mut w).0, 0);
        msg.fill(0); // the copy was taken at post time
        assert_eq!(b.poll(1)[0].byte_len, 7);
        assert_eq!(&rbuf.to_vec()[..7], b"inline!");

        // More than max_inline_data is EINVAL with bad_wr set.
        let big = vec![0u8; MAX_INLINE_DATA as usize + 1];
        let mut sg = [ibv_sge {
            addr: big.as_ptr() as u64,
            length: big.len() as u32,
            lkey: 0,
        }];
        let mut w = wr(10, WR_SEND, &mut sg);
        w.send_flags = SEND_INLINE;
        let (r, bad) = post(qa, &mut w);
        assert_eq!(r, libc::EINVAL);
        assert_eq!(bad, ptr::from_mut(&mut w));
        let _ = a;
    }

    #[test]
    fn a_bad_opcode_sets_bad_wr_and_posts_the_wrs_before_it() {
        let (a, b, qa, _qb) = connected(QPT_RC);
        let src = a.mr(8, 1);
        let dst = b.mr(8, 0);
        let mut sg = [ibv_sge_of(src.sge(0, 8))];
        let mut second = wr(2, crate::sys::ibv_wr_opcode_IBV_WR_LOCAL_INV, &mut sg);
        let mut first = wr(1, WR_RDMA_WRITE, &mut sg);
        first.wr = rdma(dst.addr(), dst.rkey().value());
        first.next = &mut second;
        let (r, bad) = post(qa, &mut first);
        assert_eq!(r, libc::EINVAL);
        assert_eq!(bad, ptr::from_mut(&mut second));
        let c = a.poll(1);
        assert_eq!((c[0].wr_id, c[0].status), (1, WC_SUCCESS));
        assert_eq!(dst.to_vec(), vec![1; 8]);

        // A chain refused by the QP (too many SGEs) names the refused WR too.
        let mut many = [ibv_sge_of(src.sge(0, 1)); 40];
        let mut third = wr(4, WR_SEND, &mut many);
        let mut ok = wr(3, WR_RDMA_WRITE, &mut sg);
        ok.wr = rdma(dst.addr(), dst.rkey().value());
        ok.next = &mut third;
        let (r, bad) = post(qa, &mut ok);
        assert_eq!(r, libc::EINVAL);
        assert_eq!(bad, ptr::from_mut(&mut third));
        assert_eq!(a.poll(1)[0].wr_id, 3);
    }

    /// Single posts while earlier requests are outstanding leave the sending to the engine
    /// thread (`post_send_coalesced`); every one still goes out and completes without the
    /// application polling in between.
    #[test]
    fn back_to_back_single_posts_all_complete() {
        let (a, b, qa, _qb) = connected(QPT_RC);
        let src = a.mr(64 * 64, 0);
        let dst = b.mr(64 * 64, 0);
        for i in 0..64u8 {
            src.write(usize::from(i) * 64, &[i; 64]).unwrap();
        }
        for i in 0..64u64 {
            let off = i as usize * 64;
            let mut sg = [ibv_sge_of(src.sge(off, 64))];
            let mut w = wr(i, WR_RDMA_WRITE, &mut sg);
            w.wr = rdma(dst.addr() + off as u64, dst.rkey().value());
            assert_eq!(post(qa, &mut w).0, 0);
        }
        // Nobody polls: the engine thread alone must send every WR.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while dst.to_vec() != src.to_vec() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(dst.to_vec(), src.to_vec());
        let c = a.poll(64);
        assert_eq!(c.len(), 64);
        assert!(c.iter().all(|c| c.status == WC_SUCCESS));
        assert_eq!(
            c.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
            (0..64).collect::<Vec<_>>()
        );
    }

    #[test]
    fn sq_sig_all_signals_every_wr() {
        let net = roce_transport::SimNetwork::perfect();
        let (a, b) = (Side::open(&net, "10.0.0.1"), Side::open(&net, "10.0.0.2"));
        let mut init = a.init_attr(QPT_RC);
        init.sq_sig_all = 1;
        // SAFETY: the harness's PD and CQ.
        let qa = unsafe { ibv_create_qp(a.pd, &mut init) };
        let qb = b.qp(QPT_RC);
        // SAFETY: live QPs.
        let (na, nb) = unsafe { ((*qa).qp_num, (*qb).qp_num) };
        bring_up(qa, QPT_RC, &a, &b, nb);
        bring_up(qb, QPT_RC, &b, &a, na);
        let src = a.mr(8, 3);
        let dst = b.mr(8, 0);
        let mut sg = [ibv_sge_of(src.sge(0, 8))];
        let mut w = wr(11, WR_RDMA_WRITE, &mut sg);
        w.send_flags = 0;
        w.wr = rdma(dst.addr(), dst.rkey().value());
        assert_eq!(post(qa, &mut w).0, 0);
        assert_eq!(a.poll(1)[0].wr_id, 11);
    }

    #[test]
    fn create_writes_back_capacities_and_refuses_what_it_cannot_do() {
        let net = roce_transport::SimNetwork::perfect();
        let a = Side::open(&net, "10.0.0.1");
        let mut init = a.init_attr(QPT_RC);
        // SAFETY: the harness's PD and CQ.
        let qp = unsafe { ibv_create_qp(a.pd, &mut init) };
        assert!(!qp.is_null());
        assert_eq!(init.cap.max_send_wr, 64);
        assert_eq!(init.cap.max_recv_wr, 64);
        assert!(init.cap.max_send_sge >= 2 && init.cap.max_recv_sge >= 2);
        assert!(
            init.cap.max_inline_data >= 236,
            "perftest's largest default inline size"
        );
        // SAFETY: a live QP.
        unsafe {
            assert_eq!((*qp).state, crate::sys::ibv_qp_state_IBV_QPS_RESET);
            assert_eq!((*qp).qp_type, QPT_RC);
            assert_eq!((*qp).context, a.ctx);
            assert_eq!((*qp).pd, a.pd);
            assert!(
                ibv_qp_to_qp_ex(qp).is_null(),
                "not created with SEND_OPS_FLAGS"
            );
            let ctx = ContextRec::from_ibv(a.ctx).unwrap();
            assert_eq!(
                ctx.qps.lock().unwrap().get(&(*qp).qp_num),
                Some(&(qp as usize))
            );
            let qpn = (*qp).qp_num;
            assert_eq!(ibv_destroy_qp(qp), 0);
            assert!(ctx.qps.lock().unwrap().get(&qpn).is_none());
        }

        // The QP holds its PD and CQ until it is destroyed.
        let qp = a.qp(QPT_RC);
        // SAFETY: the harness's PD and CQ, a live QP.
        unsafe {
            assert_eq!(crate::pd::ibv_dealloc_pd(a.pd), libc::EBUSY);
            assert_eq!(crate::cq::ibv_destroy_cq(a.cq), libc::EBUSY);
            assert_eq!(ibv_destroy_qp(qp), 0);
            let spare = crate::pd::ibv_alloc_pd(a.ctx);
            assert_eq!(crate::pd::ibv_dealloc_pd(spare), 0);
        }

        let mut big = a.init_attr(QPT_RC);
        big.cap.max_send_wr = 1 << 20;
        // SAFETY: as above.
        assert!(unsafe { ibv_create_qp(a.pd, &mut big) }.is_null());
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EINVAL)
        );

        let mut raw = a.init_attr(QPT_RAW_PACKET);
        // SAFETY: as above.
        assert!(unsafe { ibv_create_qp(a.pd, &mut raw) }.is_null());
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EOPNOTSUPP)
        );

        let mut no_cq = a.init_attr(QPT_UD);
        no_cq.recv_cq = ptr::null_mut();
        // SAFETY: as above.
        assert!(unsafe { ibv_create_qp(a.pd, &mut no_cq) }.is_null());
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EINVAL)
        );
    }

    #[test]
    fn modify_needs_a_grh_and_the_devices_own_gid() {
        let net = roce_transport::SimNetwork::perfect();
        let (a, b) = (Side::open(&net, "10.0.0.1"), Side::open(&net, "10.0.0.2"));
        let qp = a.qp(QPT_RC);
        let mut attr = ibv_qp_attr {
            qp_state: crate::sys::ibv_qp_state_IBV_QPS_INIT,
            port_num: 1,
            ..ibv_qp_attr::default()
        };
        use crate::sys::{
            ibv_qp_attr_mask_IBV_QP_ACCESS_FLAGS as ACCESS, ibv_qp_attr_mask_IBV_QP_AV as AV,
            ibv_qp_attr_mask_IBV_QP_DEST_QPN as DEST,
            ibv_qp_attr_mask_IBV_QP_MAX_DEST_RD_ATOMIC as MD,
            ibv_qp_attr_mask_IBV_QP_MIN_RNR_TIMER as MRT, ibv_qp_attr_mask_IBV_QP_PATH_MTU as MTU,
            ibv_qp_attr_mask_IBV_QP_PKEY_INDEX as PKEY, ibv_qp_attr_mask_IBV_QP_PORT as PORT,
            ibv_qp_attr_mask_IBV_QP_RQ_PSN as RQ,
        };
        let state = ibv_qp_attr_mask_IBV_QP_STATE;
        // RTR straight from RESET is refused by the state table.
        attr.qp_state = crate::sys::ibv_qp_state_IBV_QPS_RTR;
        assert_eq!(modify(qp, &mut attr, state), libc::EINVAL);
        attr.qp_state = crate::sys::ibv_qp_state_IBV_QPS_INIT;
        assert_eq!(modify(qp, &mut attr, state | PKEY | PORT | ACCESS), 0);
        // SAFETY: a live QP.
        assert_eq!(
            unsafe { (*qp).state },
            crate::sys::ibv_qp_state_IBV_QPS_INIT
        );

        let rtr = state | AV | MTU | DEST | RQ | MD | MRT;
        attr.qp_state = crate::sys::ibv_qp_state_IBV_QPS_RTR;
        attr.path_mtu = crate::sys::ibv_mtu_IBV_MTU_4096;
        attr.dest_qp_num = 0x12;
        attr.max_dest_rd_atomic = 1;
        attr.ah_attr = a.ah_attr_to(&b);
        attr.ah_attr.is_global = 0;
        assert_eq!(modify(qp, &mut attr, rtr), libc::EINVAL, "no GRH");
        attr.ah_attr = a.ah_attr_to(&b);
        attr.ah_attr.grh.sgid_index = a.dev.local_gid_index().unwrap() + 1;
        assert_eq!(
            modify(qp, &mut attr, rtr),
            libc::EINVAL,
            "another GID index"
        );
        attr.ah_attr = a.ah_attr_to(&b);
        attr.ah_attr.port_num = 2;
        assert_eq!(modify(qp, &mut attr, rtr), libc::EINVAL, "port 2");
        // SAFETY: a live QP.
        assert_eq!(
            unsafe { (*qp).state },
            crate::sys::ibv_qp_state_IBV_QPS_INIT
        );
        attr.ah_attr = a.ah_attr_to(&b);
        attr.ah_attr.grh.traffic_class = 0x28;
        assert_eq!(modify(qp, &mut attr, rtr), 0);
        // SAFETY: a live QP.
        assert_eq!(unsafe { (*qp).state }, crate::sys::ibv_qp_state_IBV_QPS_RTR);

        // Query: what was set, with the path MTU lowered to the port's active MTU.
        let mut q = ibv_qp_attr::default();
        let mut init = ibv_qp_init_attr::default();
        // SAFETY: a live QP and local out-structs.
        assert_eq!(unsafe { ibv_query_qp(qp, &mut q, 0, &mut init) }, 0);
        assert_eq!(q.qp_state, crate::sys::ibv_qp_state_IBV_QPS_RTR);
        assert_eq!(q.dest_qp_num, 0x12);
        assert_eq!(q.path_mtu, a.dev.query_port().active_mtu as u32);
        assert_eq!(
            q.path_mtu,
            crate::sys::ibv_mtu_IBV_MTU_1024,
            "4096 lowered to the port's"
        );
        assert_eq!(q.ah_attr.is_global, 1);
        // SAFETY: reading a plain union member.
        assert_eq!(unsafe { q.ah_attr.grh.dgid.raw }, b.dev.local_gid().0);
        assert_eq!(q.ah_attr.grh.traffic_class, 0x28);
        assert_eq!(q.qp_access_flags, 0);
        assert_eq!(init.qp_type, QPT_RC);
        assert_eq!(init.send_cq, a.cq);
        assert_eq!(init.cap.max_send_wr, 64);

        // Mask bits rocectl does not have (alternate path, rate limit) are EINVAL.
        let alt = crate::sys::ibv_qp_attr_mask_IBV_QP_ALT_PATH;
        assert_eq!(modify(qp, &mut attr, alt), libc::EINVAL);
        let rate = crate::sys::ibv_qp_attr_mask_IBV_QP_RATE_LIMIT;
        assert_eq!(modify(qp, &mut attr, rate), libc::EINVAL);
        // To ERR and back to RESET are always allowed.
        attr.qp_state = crate::sys::ibv_qp_state_IBV_QPS_ERR;
        assert_eq!(modify(qp, &mut attr, state), 0);
        // SAFETY: a live QP.
        assert_eq!(unsafe { (*qp).state }, crate::sys::ibv_qp_state_IBV_QPS_ERR);
        attr.qp_state = 9;
        assert_eq!(modify(qp, &mut attr, state), libc::EINVAL);
    }

    #[test]
    fn ece_mcast_and_data_in_order_answer_honestly() {
        let (_a, _b, qa, _qb) = connected(QPT_RC);
        // SAFETY: a live QP; the others are not dereferenced.
        unsafe {
            assert_eq!(ibv_query_ece(qa, ptr::null_mut()), libc::EOPNOTSUPP);
            assert_eq!(ibv_set_ece(qa, ptr::null_mut()), libc::EOPNOTSUPP);
            assert_eq!(ibv_attach_mcast(qa, ptr::null(), 0), libc::EOPNOTSUPP);
            assert_eq!(ibv_detach_mcast(qa, ptr::null(), 0), libc::EOPNOTSUPP);
            assert_eq!(ibv_query_qp_data_in_order(qa, WR_RDMA_WRITE, 0), 0);
        }
    }

    #[test]
    fn uc_write_goes_through() {
        let (a, b, qa, _qb) = connected(QPT_UC);
        let src = a.mr(16, 0x77);
        let dst = b.mr(16, 0);
        let mut sg = [ibv_sge_of(src.sge(0, 16))];
        let mut w = wr(1, WR_RDMA_WRITE, &mut sg);
        w.wr = rdma(dst.addr(), dst.rkey().value());
        assert_eq!(post(qa, &mut w).0, 0);
        assert_eq!(a.poll(1)[0].status, WC_SUCCESS);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while dst.to_vec() != vec![0x77; 16] && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(dst.to_vec(), vec![0x77; 16]);
        // READ is not a UC operation: the QP refuses it.
        let mut r = wr(2, WR_RDMA_READ, &mut sg);
        r.wr = rdma(dst.addr(), dst.rkey().value());
        assert_eq!(post(qa, &mut r).0, libc::EINVAL);
    }
}
