//! Completion queues (`ibv_create_cq`, `create_cq_ex`, `poll_cq`, `req_notify_cq`, the
//! `ibv_cq_ex` polling table). OWNER: helper "memcq".

use std::ffi::c_int;

use crate::sys::{ibv_context, ibv_cq, ibv_cq_ex, ibv_cq_init_attr_ex, ibv_wc};

/// A completion queue; every CQ is an `ibv_cq_ex` whose first 128 bytes are the `ibv_cq`.
#[repr(C)]
pub(crate) struct CqRec {
    /// Must stay the first field.
    pub(crate) ex: ibv_cq_ex,
    /// The rocectl CQ.
    pub(crate) cq: roce_transport::CompletionQueue,
}

impl CqRec {
    /// The record behind an `ibv_cq` of this library; `None` for NULL.
    ///
    /// # Safety
    /// `cq` is NULL or a live CQ of this library.
    pub(crate) unsafe fn from_ibv<'a>(cq: *mut ibv_cq) -> Option<&'a Self> {
        // SAFETY: the `ibv_cq` is the start of `ex`, the first field of the record.
        unsafe { cq.cast::<Self>().as_ref() }
    }
}

/// `ibv_context_ops.poll_cq`.
pub(crate) unsafe extern "C" fn poll_cq(_cq: *mut ibv_cq, _n: c_int, _wc: *mut ibv_wc) -> c_int {
    -1
}

/// `ibv_context_ops.req_notify_cq`.
pub(crate) unsafe extern "C" fn req_notify_cq(_cq: *mut ibv_cq, _solicited_only: c_int) -> c_int {
    libc::EOPNOTSUPP
}

/// `verbs_context.create_cq_ex`.
pub(crate) unsafe extern "C" fn create_cq_ex(
    _ctx: *mut ibv_context,
    _attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    crate::ffi::set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}
