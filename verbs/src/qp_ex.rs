//! The `ibv_qp_ex` work-request API (`ibv_wr_start` … `ibv_wr_complete`): the per-QP function
//! table `create_qp_ex` installs when `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` is given. OWNER:
//! helper "qp".
//!
//! The application calls `wr_start`, then for each WR writes `qpx->wr_id` and
//! `qpx->wr_flags` directly and calls one operation (`wr_send`, `wr_rdma_write`, …) followed
//! by its data (`wr_set_sge`, `wr_set_sge_list`, `wr_set_inline_data(_list)`) and, on UD,
//! `wr_set_ud_addr`; `wr_complete` posts the batch with one doorbell and returns 0 or an
//! errno, `wr_abort` drops it. The builders return nothing, so the first mistake of a batch
//! (a data call before any operation, too many SGEs or inline bytes, an unsupported
//! operation) is remembered and `wr_complete` returns it without posting anything, as rdma-core
//! providers do.
//!
//! Every slot is filled: the inline `ibv_wr_*` helpers call through the table without a NULL
//! check, so the operations rocectl lacks (`wr_bind_mw`, `wr_local_inv`, `wr_send_inv`,
//! `wr_send_tso`, `wr_set_xrc_srqn`) make the batch fail with `EOPNOTSUPP` rather than crash.

use std::ffi::{c_int, c_void};
use std::ptr::addr_of;

use roce_transport::{QKey, Qpn, RKey, SendData, SendOp, SendWr, UdDest};

use crate::ah::AhRec;
use crate::ffi::{errno_of_post, guard, trace};
use crate::qp::{inline_bytes, sge, QpRec, SEND_SIGNALED, SEND_SOLICITED};
use crate::sys::{ibv_ah, ibv_data_buf, ibv_mw, ibv_mw_bind_info, ibv_qp, ibv_qp_ex, ibv_sge};

/// The WRs built since `wr_start`.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    /// In posting order.
    wrs: Vec<SendWr>,
    /// The first error of the batch (0: none).
    err: i32,
}

impl Batch {
    fn fail(&mut self, e: i32) {
        if self.err == 0 {
            self.err = e;
        }
    }
}

/// Fills the `wr_*` slots of a new QP's `ibv_qp_ex`.
pub(crate) fn install(ex: &mut ibv_qp_ex) {
    ex.wr_start = Some(wr_start);
    ex.wr_complete = Some(wr_complete);
    ex.wr_abort = Some(wr_abort);
    ex.wr_send = Some(wr_send);
    ex.wr_send_imm = Some(wr_send_imm);
    ex.wr_rdma_write = Some(wr_rdma_write);
    ex.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    ex.wr_rdma_read = Some(wr_rdma_read);
    ex.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    ex.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    ex.wr_atomic_write = Some(wr_atomic_write);
    ex.wr_set_sge = Some(wr_set_sge);
    ex.wr_set_sge_list = Some(wr_set_sge_list);
    ex.wr_set_inline_data = Some(wr_set_inline_data);
    ex.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    ex.wr_set_ud_addr = Some(wr_set_ud_addr);
    ex.wr_bind_mw = Some(wr_bind_mw);
    ex.wr_local_inv = Some(wr_local_inv);
    ex.wr_send_inv = Some(wr_send_inv);
    ex.wr_send_tso = Some(wr_send_tso);
    ex.wr_set_xrc_srqn = Some(wr_set_xrc_srqn);
}

/// Runs `f` on the QP's record and its batch (locked); `on_none` for a NULL QP.
///
/// # Safety
/// `qp` is NULL or the `ibv_qp_ex` of a live QP of this library.
unsafe fn with<R>(qp: *mut ibv_qp_ex, on_none: R, f: impl FnOnce(&QpRec, &mut Batch) -> R) -> R {
    // SAFETY: per the contract; the `ibv_qp_ex` is the start of the record.
    let Some(rec) = (unsafe { QpRec::from_ibv(qp.cast::<ibv_qp>()) }) else {
        return on_none;
    };
    let mut batch = rec
        .batch
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    f(rec, &mut batch)
}

/// Starts a new WR with operation `op`, taking `wr_id` and `wr_flags` from the `ibv_qp_ex`.
///
/// # Safety
/// As [`with`].
unsafe fn push(verb: &str, qp: *mut ibv_qp_ex, op: SendOp) {
    // SAFETY: the application wrote these fields before the call, from this thread.
    let (wr_id, flags) = unsafe { (*addr_of!((*qp).wr_id), *addr_of!((*qp).wr_flags)) };
    guard(verb, (), || {
        // SAFETY: per the contract.
        unsafe {
            with(qp, (), |_, b| {
                b.wrs.push(SendWr {
                    wr_id,
                    op,
                    data: SendData::Sges(Vec::new()),
                    signaled: flags & SEND_SIGNALED != 0,
                    solicited: flags & SEND_SOLICITED != 0,
                    ud: None,
                });
            });
        }
    });
}

/// Applies `f` to the WR last started; a data call before any operation fails the batch.
///
/// # Safety
/// As [`with`].
unsafe fn last(
    verb: &str,
    qp: *mut ibv_qp_ex,
    f: impl FnOnce(&QpRec, &mut SendWr) -> Result<(), i32>,
) {
    guard(verb, (), || {
        // SAFETY: per the contract.
        unsafe {
            with(qp, (), |rec, b| {
                let r = match b.wrs.last_mut() {
                    Some(w) => f(rec, w),
                    None => {
                        trace(format_args!("{verb}: no work request started"));
                        Err(libc::EINVAL)
                    }
                };
                if let Err(e) = r {
                    b.fail(e);
                }
            });
        }
    });
}

/// Fails the batch with `EOPNOTSUPP` (an operation rocectl does not have).
///
/// # Safety
/// As [`with`].
unsafe fn unsupported(verb: &str, qp: *mut ibv_qp_ex) {
    trace(format_args!("{verb}: not supported"));
    guard(verb, (), || {
        // SAFETY: per the contract.
        unsafe { with(qp, (), |_, b| b.fail(libc::EOPNOTSUPP)) }
    });
}

unsafe extern "C" fn wr_start(qp: *mut ibv_qp_ex) {
    guard("ibv_wr_start", (), || {
        // SAFETY: the inline helper passes the application's `ibv_qp_ex`.
        unsafe {
            with(qp, (), |_, b| {
                b.wrs.clear();
                b.err = 0;
            });
        }
    });
}

unsafe extern "C" fn wr_complete(qp: *mut ibv_qp_ex) -> c_int {
    guard("ibv_wr_complete", libc::EIO, || {
        // SAFETY: the inline helper passes the application's `ibv_qp_ex`.
        unsafe {
            with(qp, libc::EINVAL, |rec, b| {
                if b.err != 0 {
                    let e = b.err;
                    b.wrs.clear();
                    b.err = 0;
                    return e;
                }
                match rec.qp.post_send_batch(b.wrs.drain(..)) {
                    Ok(_) => 0,
                    Err((n, e)) => {
                        trace(format_args!("ibv_wr_complete: WR {n} of the batch: {e}"));
                        errno_of_post(&e)
                    }
                }
            })
        }
    })
}

unsafe extern "C" fn wr_abort(qp: *mut ibv_qp_ex) {
    guard("ibv_wr_abort", (), || {
        // SAFETY: the inline helper passes the application's `ibv_qp_ex`.
        unsafe {
            with(qp, (), |_, b| {
                b.wrs.clear();
                b.err = 0;
            });
        }
    });
}

unsafe extern "C" fn wr_send(qp: *mut ibv_qp_ex) {
    // SAFETY: the inline helper passes the application's `ibv_qp_ex`.
    unsafe { push("ibv_wr_send", qp, SendOp::Send) }
}

unsafe extern "C" fn wr_send_imm(qp: *mut ibv_qp_ex, imm_data: u32) {
    let op = SendOp::SendWithImm {
        imm: u32::from_be(imm_data),
    };
    // SAFETY: the inline helper passes the application's `ibv_qp_ex`.
    unsafe { push("ibv_wr_send_imm", qp, op) }
}

unsafe extern "C" fn wr_rdma_write(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    let op = SendOp::RdmaWrite {
        remote_addr,
        rkey: RKey::new(rkey),
    };
    // SAFETY: the inline helper passes the application's `ibv_qp_ex`.
    unsafe { push("ibv_wr_rdma_write", qp, op) }
}

unsafe extern "C" fn wr_rdma_write_imm(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    imm_data: u32,
) {
    let op = SendOp::RdmaWriteWithImm {
        remote_addr,
        rkey: RKey::new(rkey),
        imm: u32::from_be(imm_data),
    };
    // SAFETY: the inline helper passes the application's `ibv_qp_ex`.
    unsafe { push("ibv_wr_rdma_write_imm", qp, op) }
}

unsafe extern "C" fn wr_rdma_read(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    let op = SendOp::RdmaRead {
        remote_addr,
        rkey: RKey::new(rkey),
    };
    // SAFETY: the inline helper passes the application's `ibv_qp_ex`.
    unsafe { push("ibv_wr_rdma_read", qp, op) }
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    let op = SendOp::AtomicCmpAndSwp {
        remote_addr,
        rkey: RKey::new(rkey),
        compare,
        swap,
    };
    // SAFETY: the inline helper passes the application's `ibv_qp_ex`.
    unsafe { push("ibv_wr_atomic_cmp_swp", qp, op) }
}

unsafe extern "C" fn wr_atomic_fetch_add(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    add: u64,
) {
    let op = SendOp::AtomicFetchAndAdd {
        remote_addr,
        rkey: RKey::new(rkey),
        add,
    };
    // SAFETY: the inline helper passes the application's `ibv_qp_ex`.
    unsafe { push("ibv_wr_atomic_fetch_add", qp, op) }
}

unsafe extern "C" fn wr_atomic_write(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    atomic_wr: *const c_void,
) {
    let op = SendOp::AtomicWrite {
        remote_addr,
        rkey: RKey::new(rkey),
    };
    // SAFETY: the inline helper passes the application's `ibv_qp_ex`.
    unsafe { push("ibv_wr_atomic_write", qp, op) };
    // The 8 bytes to write travel with the WR (copied now, as the verb's man page allows).
    // SAFETY: as above; `atomic_wr` points to 8 readable bytes per `ibv_wr_atomic_write(3)`.
    unsafe {
        last("ibv_wr_atomic_write", qp, |_, w| {
            if atomic_wr.is_null() {
                return Err(libc::EINVAL);
            }
            let bytes = std::ptr::read_unaligned(atomic_wr.cast::<[u8; 8]>());
            w.data = SendData::Inline(bytes.to_vec());
            Ok(())
        });
    }
}

unsafe extern "C" fn wr_set_sge(qp: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    let s = sge(&ibv_sge { addr, length, lkey });
    // SAFETY: the inline helper passes the application's `ibv_qp_ex`.
    unsafe {
        last("ibv_wr_set_sge", qp, |_, w| {
            w.data = SendData::Sges(vec![s]);
            Ok(())
        });
    }
}

unsafe extern "C" fn wr_set_sge_list(qp: *mut ibv_qp_ex, num_sge: usize, sg_list: *const ibv_sge) {
    // SAFETY: the inline helper passes the application's `ibv_qp_ex` and list.
    unsafe {
        last("ibv_wr_set_sge_list", qp, |rec, w| {
            if num_sge > rec.cap.max_send_sge as usize || (num_sge > 0 && sg_list.is_null()) {
                return Err(libc::EINVAL);
            }
            let list = if num_sge == 0 {
                &[][..]
            } else {
                std::slice::from_raw_parts(sg_list, num_sge)
            };
            w.data = SendData::Sges(list.iter().map(sge).collect());
            Ok(())
        });
    }
}

unsafe extern "C" fn wr_set_inline_data(qp: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    // SAFETY: the inline helper passes the application's `ibv_qp_ex` and buffer.
    unsafe {
        last("ibv_wr_set_inline_data", qp, |rec, w| {
            let Ok(length) = u32::try_from(length) else {
                return Err(libc::EINVAL);
            };
            let one = [ibv_sge {
                addr: addr as usize as u64,
                length,
                lkey: 0,
            }];
            w.data = SendData::Inline(inline_bytes(&one, rec.cap.max_inline_data)?);
            Ok(())
        });
    }
}

unsafe extern "C" fn wr_set_inline_data_list(
    qp: *mut ibv_qp_ex,
    num_buf: usize,
    buf_list: *const ibv_data_buf,
) {
    // SAFETY: the inline helper passes the application's `ibv_qp_ex` and buffers.
    unsafe {
        last("ibv_wr_set_inline_data_list", qp, |rec, w| {
            if num_buf > 0 && buf_list.is_null() {
                return Err(libc::EINVAL);
            }
            let bufs = if num_buf == 0 {
                &[][..]
            } else {
                std::slice::from_raw_parts(buf_list, num_buf)
            };
            let mut sges = Vec::with_capacity(bufs.len());
            for b in bufs {
                let length = u32::try_from(b.length).map_err(|_| libc::EINVAL)?;
                sges.push(ibv_sge {
                    addr: b.addr as usize as u64,
                    length,
                    lkey: 0,
                });
            }
            w.data = SendData::Inline(inline_bytes(&sges, rec.cap.max_inline_data)?);
            Ok(())
        });
    }
}

unsafe extern "C" fn wr_set_ud_addr(
    qp: *mut ibv_qp_ex,
    ah: *mut ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) {
    // SAFETY: the inline helper passes the application's `ibv_qp_ex`; the AH is live.
    unsafe {
        last("ibv_wr_set_ud_addr", qp, |_, w| {
            let ah = AhRec::from_ibv(ah).ok_or(libc::EINVAL)?;
            w.ud = Some(UdDest {
                ah: ah.ah,
                remote_qpn: Qpn::new(remote_qpn),
                remote_qkey: QKey::new(remote_qkey),
            });
            Ok(())
        });
    }
}

unsafe extern "C" fn wr_bind_mw(
    qp: *mut ibv_qp_ex,
    _mw: *mut ibv_mw,
    _rkey: u32,
    _bind_info: *const ibv_mw_bind_info,
) {
    // SAFETY: the inline helper passes the application's `ibv_qp_ex`.
    unsafe { unsupported("ibv_wr_bind_mw", qp) }
}

unsafe extern "C" fn wr_local_inv(qp: *mut ibv_qp_ex, _invalidate_rkey: u32) {
    // SAFETY: the inline helper passes the application's `ibv_qp_ex`.
    unsafe { unsupported("ibv_wr_local_inv", qp) }
}

unsafe extern "C" fn wr_send_inv(qp: *mut ibv_qp_ex, _invalidate_rkey: u32) {
    // SAFETY: the inline helper passes the application's `ibv_qp_ex`.
    unsafe { unsupported("ibv_wr_send_inv", qp) }
}

unsafe extern "C" fn wr_send_tso(qp: *mut ibv_qp_ex, _hdr: *mut c_void, _hdr_sz: u16, _mss: u16) {
    // SAFETY: the inline helper passes the application's `ibv_qp_ex`.
    unsafe { unsupported("ibv_wr_send_tso", qp) }
}

unsafe extern "C" fn wr_set_xrc_srqn(qp: *mut ibv_qp_ex, _remote_srqn: u32) {
    // SAFETY: the inline helper passes the application's `ibv_qp_ex`.
    unsafe { unsupported("ibv_wr_set_xrc_srqn", qp) }
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::context::ContextRec;
    use crate::qp::harness::{bring_up, post_recv_one, Side, WC_RDMA_WRITE, WC_SEND, WC_SUCCESS};
    use crate::sys::{
        ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_RDMA_READ as WITH_READ,
        ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_RDMA_WRITE as WITH_WRITE,
        ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_SEND as WITH_SEND, ibv_qp_init_attr_ex,
        ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_PD as ATTR_PD,
        ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_SEND_OPS_FLAGS as ATTR_OPS,
        ibv_qp_type_IBV_QPT_RC as RC, ibv_qp_type_IBV_QPT_UD as UD,
    };

    /// `ibv_create_qp_ex` through the context's slot, as the inline header function calls it.
    fn create_ex(side: &Side, ty: u32, mask: u32, ops: u32) -> *mut ibv_qp {
        let base = side.init_attr(ty);
        let mut attr = ibv_qp_init_attr_ex {
            send_cq: base.send_cq,
            recv_cq: base.recv_cq,
            cap: base.cap,
            qp_type: ty,
            comp_mask: mask,
            pd: side.pd,
            send_ops_flags: u64::from(ops),
            ..ibv_qp_init_attr_ex::default()
        };
        // SAFETY: the harness's context; its `create_qp_ex` slot is this crate's.
        unsafe {
            let ctx = ContextRec::from_ibv(side.ctx).unwrap();
            (ctx.vctx.create_qp_ex.unwrap())(side.ctx, &mut attr)
        }
    }

    #[test]
    fn wr_batch_posts_a_write_and_an_inline_send() {
        let net = roce_transport::SimNetwork::perfect();
        let (a, b) = (Side::open(&net, "10.0.0.1"), Side::open(&net, "10.0.0.2"));
        let qa = create_ex(
            &a,
            RC,
            ATTR_PD | ATTR_OPS,
            WITH_WRITE | WITH_SEND | WITH_READ,
        );
        assert!(!qa.is_null());
        let qb = b.qp(RC);
        // SAFETY: live QPs.
        let (na, nb) = unsafe { ((*qa).qp_num, (*qb).qp_num) };
        bring_up(qa, RC, &a, &b, nb);
        bring_up(qb, RC, &b, &a, na);
        // SAFETY: a QP of this crate.
        let qx = unsafe { crate::qp::ibv_qp_to_qp_ex(qa) };
        assert_eq!(qx.cast::<ibv_qp>(), qa);

        let src = a.mr(16, 0x3C);
        let dst = b.mr(16, 0);
        let rbuf = b.mr(16, 0);
        assert_eq!(post_recv_one(qb, 8, rbuf.sge(0, 16)), 0);
        let s = src.sge(0, 16);
        let mut text = *b"batched";
        // SAFETY: the QP's own table, used as the inline ibv_wr_* helpers use it.
        unsafe {
            let x = &mut *qx;
            (x.wr_start.unwrap())(qx);
            x.wr_id = 1;
            x.wr_flags = SEND_SIGNALED;
            (x.wr_rdma_write.unwrap())(qx, dst.rkey().value(), dst.addr());
            (x.wr_set_sge.unwrap())(qx, s.lkey.value(), s.addr, s.length);
            x.wr_id = 2;
            (x.wr_send.unwrap())(qx);
            (x.wr_set_inline_data.unwrap())(qx, text.as_mut_ptr().cast(), text.len());
            assert_eq!((x.wr_complete.unwrap())(qx), 0);
        }
        text.fill(0);
        let c = a.poll(2);
        assert_eq!(
            c.iter()
                .map(|c| (c.wr_id, c.status, c.opcode))
                .collect::<Vec<_>>(),
            [(1, WC_SUCCESS, WC_RDMA_WRITE), (2, WC_SUCCESS, WC_SEND)]
        );
        assert_eq!(dst.to_vec(), vec![0x3C; 16]);
        assert_eq!(b.poll(1)[0].byte_len, 7);
        assert_eq!(&rbuf.to_vec()[..7], b"batched");

        // A data call before any operation, or an operation rocectl lacks, fails the whole
        // batch at wr_complete and posts nothing.
        // SAFETY: as above.
        unsafe {
            let x = &mut *qx;
            (x.wr_start.unwrap())(qx);
            (x.wr_set_sge.unwrap())(qx, s.lkey.value(), s.addr, s.length);
            x.wr_id = 3;
            (x.wr_rdma_write.unwrap())(qx, dst.rkey().value(), dst.addr());
            (x.wr_set_sge.unwrap())(qx, s.lkey.value(), s.addr, s.length);
            assert_eq!((x.wr_complete.unwrap())(qx), libc::EINVAL);
            (x.wr_start.unwrap())(qx);
            (x.wr_local_inv.unwrap())(qx, 5);
            assert_eq!((x.wr_complete.unwrap())(qx), libc::EOPNOTSUPP);
            // wr_abort drops what was built.
            (x.wr_start.unwrap())(qx);
            x.wr_id = 4;
            (x.wr_rdma_write.unwrap())(qx, dst.rkey().value(), dst.addr());
            (x.wr_set_sge.unwrap())(qx, s.lkey.value(), s.addr, s.length);
            (x.wr_abort.unwrap())(qx);
            assert_eq!((x.wr_complete.unwrap())(qx), 0);
        }
        let none = a.poll_within(1, std::time::Duration::from_millis(200));
        assert!(none.is_empty(), "nothing was posted");
    }

    #[test]
    fn create_qp_ex_checks_its_mask_and_send_ops() {
        let net = roce_transport::SimNetwork::perfect();
        let a = Side::open(&net, "10.0.0.1");
        assert!(
            create_ex(&a, RC, ATTR_OPS, WITH_SEND).is_null(),
            "no PD bit"
        );
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EINVAL)
        );
        assert!(
            create_ex(&a, UD, ATTR_PD | ATTR_OPS, WITH_READ).is_null(),
            "READ on UD"
        );
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EOPNOTSUPP)
        );
        let qp = create_ex(&a, UD, ATTR_PD, 0);
        assert!(!qp.is_null());
        // SAFETY: a live QP of this crate.
        unsafe {
            assert!(
                crate::qp::ibv_qp_to_qp_ex(qp).is_null(),
                "no SEND_OPS_FLAGS"
            );
            assert_eq!(crate::qp::ibv_destroy_qp(qp), 0);
        }
    }
}
