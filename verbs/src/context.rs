//! Contexts (`ibv_open_device`, `ibv_close_device`), device and port queries, GIDs, P_Keys,
//! async events. OWNER: helper "device" (see verbs/OWNERS while the crate is being built).

use std::ffi::c_int;

use crate::sys::{
    ibv_context, ibv_device_attr_ex, ibv_port_attr, ibv_query_device_ex_input, verbs_context,
};

/// An open device: `verbs_context` (the application sees `&vctx.context`, 320 bytes in) and
/// the rocectl device behind it.
#[repr(C)]
pub(crate) struct ContextRec {
    /// Must stay the first field: `ibv_context` pointers are `&vctx.context`.
    pub(crate) vctx: verbs_context,
    /// The engine this context drives.
    pub(crate) dev: roce_transport::Device,
    /// QPN -> the `ibv_qp` handed out (as `usize`), for async events (`element.qp`). The
    /// QP module inserts on create and removes on destroy.
    pub(crate) qps: std::sync::Mutex<std::collections::HashMap<u32, usize>>,
    /// `ibv_srq` pointers (as `usize`) of this context, for SRQ async events.
    pub(crate) srqs: std::sync::Mutex<Vec<usize>>,
}

impl ContextRec {
    /// The record behind an `ibv_context` this library handed out; `None` for NULL.
    ///
    /// # Safety
    /// `ctx` is NULL or a context from [`ibv_open_device`] that is still open.
    pub(crate) unsafe fn from_ibv<'a>(ctx: *mut ibv_context) -> Option<&'a Self> {
        if ctx.is_null() {
            return None;
        }
        let off = std::mem::offset_of!(Self, vctx) + std::mem::offset_of!(verbs_context, context);
        // SAFETY: per the contract, `ctx` points `off` bytes into a live `ContextRec`.
        Some(unsafe { &*ctx.cast::<u8>().sub(off).cast::<Self>() })
    }

    /// The `ibv_context` pointer applications hold.
    pub(crate) fn ibv(&self) -> *mut ibv_context {
        std::ptr::from_ref(&self.vctx.context).cast_mut()
    }
}

/// `verbs_context.query_port` (what the `ibv_query_port` macro calls).
pub(crate) unsafe extern "C" fn query_port_ex(
    _ctx: *mut ibv_context,
    _port: u8,
    _attr: *mut ibv_port_attr,
    _len: usize,
) -> c_int {
    libc::EOPNOTSUPP
}

/// `verbs_context.query_device_ex`.
pub(crate) unsafe extern "C" fn query_device_ex(
    _ctx: *mut ibv_context,
    _input: *const ibv_query_device_ex_input,
    _attr: *mut ibv_device_attr_ex,
    _size: usize,
) -> c_int {
    libc::EOPNOTSUPP
}
