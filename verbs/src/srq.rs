//! Shared receive queues (`ibv_create_srq`, `create_srq_ex`, `ibv_modify_srq`,
//! `ibv_query_srq`, `ibv_destroy_srq`, `post_srq_recv`). OWNER: helper "qp".

use std::ffi::c_int;

use crate::sys::{ibv_context, ibv_recv_wr, ibv_srq, ibv_srq_init_attr_ex};

/// A shared receive queue.
#[repr(C)]
pub(crate) struct SrqRec {
    /// Must stay the first field.
    pub(crate) ibv: ibv_srq,
    /// The rocectl SRQ.
    pub(crate) srq: roce_transport::SharedReceiveQueue,
}

/// `ibv_context_ops.post_srq_recv`.
pub(crate) unsafe extern "C" fn post_srq_recv(
    _srq: *mut ibv_srq,
    _wr: *mut ibv_recv_wr,
    _bad: *mut *mut ibv_recv_wr,
) -> c_int {
    libc::EOPNOTSUPP
}

/// `verbs_context.create_srq_ex`.
pub(crate) unsafe extern "C" fn create_srq_ex(
    _ctx: *mut ibv_context,
    _attr: *mut ibv_srq_init_attr_ex,
) -> *mut ibv_srq {
    crate::ffi::set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}
