//! Queue pairs (`ibv_create_qp`, `create_qp_ex`, `ibv_modify_qp`, `ibv_query_qp`,
//! `ibv_destroy_qp`, `post_send`, `post_recv`, the `ibv_qp_ex` `wr_*` table). OWNER: helper "qp".

use std::ffi::c_int;

use crate::sys::{ibv_context, ibv_qp, ibv_qp_ex, ibv_qp_init_attr_ex, ibv_recv_wr, ibv_send_wr};

/// A queue pair; every QP is an `ibv_qp_ex` whose first 160 bytes are the `ibv_qp`.
#[repr(C)]
pub(crate) struct QpRec {
    /// Must stay the first field.
    pub(crate) ex: ibv_qp_ex,
    /// The rocectl QP.
    pub(crate) qp: roce_transport::QueuePair,
}

/// `ibv_context_ops.post_send`.
pub(crate) unsafe extern "C" fn post_send(
    _qp: *mut ibv_qp,
    _wr: *mut ibv_send_wr,
    _bad: *mut *mut ibv_send_wr,
) -> c_int {
    libc::EOPNOTSUPP
}

/// `ibv_context_ops.post_recv`.
pub(crate) unsafe extern "C" fn post_recv(
    _qp: *mut ibv_qp,
    _wr: *mut ibv_recv_wr,
    _bad: *mut *mut ibv_recv_wr,
) -> c_int {
    libc::EOPNOTSUPP
}

/// `verbs_context.create_qp_ex`.
pub(crate) unsafe extern "C" fn create_qp_ex(
    _ctx: *mut ibv_context,
    _attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    crate::ffi::set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}
