//! Shared receive queues (`ibv_create_srq`, `create_srq_ex`, `ibv_modify_srq`,
//! `ibv_query_srq`, `ibv_destroy_srq`, `post_srq_recv`). OWNER: helper "qp".
//!
//! Basic SRQs only (no XRC, no tag matching). `IBV_SRQ_LIMIT` arms the limit event
//! ([`SharedReceiveQueue::arm_limit`]); resizing (`IBV_SRQ_MAX_WR`) is `EOPNOTSUPP`: the
//! queue's depth is fixed at creation. `ibv_query_srq` reports the limit last armed (the
//! transport does not say whether it has fired since).

use std::cell::UnsafeCell;
use std::ffi::c_int;
use std::ptr::{self, addr_of_mut};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::PoisonError;

use roce_transport::SharedReceiveQueue;

use crate::context::ContextRec;
use crate::ffi::{errno_of_post, guard, guard_int, guard_ptr, trace};
use crate::pd::PdRec;
use crate::qp::post_recv_chain;
use crate::sys::{
    ibv_context, ibv_pd, ibv_recv_wr, ibv_srq, ibv_srq_attr, ibv_srq_init_attr,
    ibv_srq_init_attr_ex,
};

const SRQ_MAX_WR: c_int = crate::sys::ibv_srq_attr_mask_IBV_SRQ_MAX_WR as c_int;
const SRQ_LIMIT: c_int = crate::sys::ibv_srq_attr_mask_IBV_SRQ_LIMIT as c_int;
const INIT_ATTR_TYPE: u32 = crate::sys::ibv_srq_init_attr_mask_IBV_SRQ_INIT_ATTR_TYPE;
const INIT_ATTR_PD: u32 = crate::sys::ibv_srq_init_attr_mask_IBV_SRQ_INIT_ATTR_PD;
const INIT_ATTR_XRCD: u32 = crate::sys::ibv_srq_init_attr_mask_IBV_SRQ_INIT_ATTR_XRCD;
const INIT_ATTR_CQ: u32 = crate::sys::ibv_srq_init_attr_mask_IBV_SRQ_INIT_ATTR_CQ;
const INIT_ATTR_TM: u32 = crate::sys::ibv_srq_init_attr_mask_IBV_SRQ_INIT_ATTR_TM;

/// Handles of this process's SRQs (`ibv_srq.handle`), unique per process.
static NEXT_HANDLE: AtomicU32 = AtomicU32::new(1);

/// A shared receive queue.
#[repr(C)]
pub(crate) struct SrqRec {
    /// Must stay the first field. In an `UnsafeCell`: libibverbs' async-event code writes the
    /// mutex and `events_completed` while we may hold a reference to the record.
    pub(crate) ibv: UnsafeCell<ibv_srq>,
    /// The rocectl SRQ.
    pub(crate) srq: SharedReceiveQueue,
    /// Depth (`max_wr`), fixed.
    max_wr: u32,
    /// Most SGEs per receive WR.
    max_sge: u32,
    /// The limit last armed with `IBV_SRQ_LIMIT` (0: none).
    limit: AtomicU32,
    /// QPs attached to it: `ibv_destroy_srq` is `EBUSY` while any is.
    users: AtomicUsize,
}

impl SrqRec {
    /// The record behind an `ibv_srq` of this library; `None` for NULL.
    ///
    /// # Safety
    /// `srq` is NULL or a live SRQ of this library.
    pub(crate) unsafe fn from_ibv<'a>(srq: *mut ibv_srq) -> Option<&'a Self> {
        // SAFETY: the `ibv_srq` is the first field of the `#[repr(C)]` record.
        unsafe { srq.cast::<Self>().as_ref() }
    }

    /// A QP attached to this SRQ.
    pub(crate) fn hold(&self) {
        self.users.fetch_add(1, Ordering::AcqRel);
    }

    /// A QP attached to this SRQ was destroyed.
    pub(crate) fn release(&self) {
        self.users.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Creates a basic SRQ on `pd` and writes the real `max_wr`/`max_sge` back into `attr`.
///
/// # Safety
/// `pd` is NULL or a live PD of this library.
unsafe fn create(
    pd: *mut ibv_pd,
    srq_context: *mut libc::c_void,
    attr: &mut ibv_srq_attr,
) -> Result<*mut ibv_srq, i32> {
    // SAFETY: per the contract.
    let pd_rec = unsafe { PdRec::from_ibv(pd) }.ok_or(libc::EINVAL)?;
    let ctx_ptr = pd_rec.ibv.context;
    // SAFETY: a PD's context is the live context it was allocated on.
    let ctx = unsafe { ContextRec::from_ibv(ctx_ptr) }.ok_or(libc::EINVAL)?;
    let dev_attr = ctx.dev.query_device();
    if attr.max_wr == 0 || attr.max_wr > dev_attr.max_qp_wr || attr.max_sge > dev_attr.max_sge {
        trace(format_args!(
            "ibv_create_srq: max_wr {} / max_sge {} outside 1..={} / ..={}",
            attr.max_wr, attr.max_sge, dev_attr.max_qp_wr, dev_attr.max_sge
        ));
        return Err(libc::EINVAL);
    }
    let max_sge = attr.max_sge.max(1);
    let rec = Box::new(SrqRec {
        ibv: UnsafeCell::new(ibv_srq::default()),
        srq: ctx.dev.create_srq(attr.max_wr as usize),
        max_wr: attr.max_wr,
        max_sge,
        limit: AtomicU32::new(0),
        users: AtomicUsize::new(0),
    });
    let ibv = rec.ibv.get();
    let ptr = Box::into_raw(rec);
    // SAFETY: `ibv` points into the new record, which nothing else sees yet; the mutex and
    // condition variable are initialised in place (the record never moves).
    unsafe {
        (*ibv).context = ctx_ptr;
        (*ibv).srq_context = srq_context;
        (*ibv).pd = pd;
        (*ibv).handle = NEXT_HANDLE.fetch_add(1, Ordering::Relaxed);
        (*ibv).events_completed = 0;
        libc::pthread_mutex_init(addr_of_mut!((*ibv).mutex).cast(), ptr::null());
        libc::pthread_cond_init(addr_of_mut!((*ibv).cond).cast(), ptr::null());
    }
    ctx.srqs
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(ptr as usize);
    // The PD cannot be deallocated while the SRQ uses it (EBUSY).
    pd_rec.hold();
    attr.max_sge = max_sge;
    Ok(ptr.cast::<ibv_srq>())
}

/// `ibv_create_srq(3)`: a shared receive queue of `attr.max_wr` WRs (`attr.srq_limit` is
/// ignored at creation, as the man page says).
///
/// # Safety
/// `pd` is NULL or a live PD of this library; `init` is NULL or a valid attribute struct.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    init: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    guard_ptr("ibv_create_srq", || {
        // SAFETY: per the contract.
        let init = unsafe { init.as_mut() }.ok_or(libc::EINVAL)?;
        // SAFETY: per the contract.
        unsafe { create(pd, init.srq_context, &mut init.attr) }
    })
}

/// `verbs_context.create_srq_ex` (what `ibv_create_srq_ex` calls for anything but a plain
/// basic SRQ with a PD): basic SRQs only; XRC and tag-matching SRQs are `EOPNOTSUPP`.
pub(crate) unsafe extern "C" fn create_srq_ex(
    ctx: *mut ibv_context,
    attr: *mut ibv_srq_init_attr_ex,
) -> *mut ibv_srq {
    guard_ptr("ibv_create_srq_ex", || {
        // SAFETY: the header passes the application's attribute struct.
        let attr = unsafe { attr.as_mut() }.ok_or(libc::EINVAL)?;
        let m = attr.comp_mask;
        let known = INIT_ATTR_TYPE | INIT_ATTR_PD | INIT_ATTR_XRCD | INIT_ATTR_CQ | INIT_ATTR_TM;
        if m & !known != 0 {
            return Err(libc::EINVAL);
        }
        let basic = crate::sys::ibv_srq_type_IBV_SRQT_BASIC;
        if (m & INIT_ATTR_TYPE != 0 && attr.srq_type != basic) || m & INIT_ATTR_TM != 0 {
            trace(format_args!(
                "ibv_create_srq_ex: only basic SRQs are supported (XRC and TM are not)"
            ));
            return Err(libc::EOPNOTSUPP);
        }
        if m & INIT_ATTR_PD == 0 {
            return Err(libc::EINVAL);
        }
        // SAFETY: per the header's contract the PD is NULL or live.
        let pd = unsafe { PdRec::from_ibv(attr.pd) }.ok_or(libc::EINVAL)?;
        if pd.ibv.context != ctx {
            return Err(libc::EINVAL);
        }
        // SAFETY: as above.
        unsafe { create(attr.pd, attr.srq_context, &mut attr.attr) }
    })
}

/// `ibv_modify_srq(3)`: `IBV_SRQ_LIMIT` arms the limit event (`srq_limit` at most `max_wr`);
/// `IBV_SRQ_MAX_WR` (resizing) is `EOPNOTSUPP`.
///
/// # Safety
/// `srq` is NULL or a live SRQ of this library; `attr` is NULL or readable.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    guard_int("ibv_modify_srq", || {
        // SAFETY: per the contract.
        let rec = unsafe { SrqRec::from_ibv(srq) }.ok_or(libc::EINVAL)?;
        // SAFETY: per the contract.
        let attr = unsafe { attr.as_ref() }.ok_or(libc::EINVAL)?;
        if mask & !(SRQ_MAX_WR | SRQ_LIMIT) != 0 {
            return Err(libc::EINVAL);
        }
        if mask & SRQ_MAX_WR != 0 {
            trace(format_args!(
                "ibv_modify_srq: resizing an SRQ (IBV_SRQ_MAX_WR) is not supported"
            ));
            return Err(libc::EOPNOTSUPP);
        }
        if mask & SRQ_LIMIT != 0 {
            if attr.srq_limit > rec.max_wr {
                return Err(libc::EINVAL);
            }
            rec.srq.arm_limit(attr.srq_limit as usize);
            rec.limit.store(attr.srq_limit, Ordering::Release);
        }
        Ok(())
    })
}

/// `ibv_query_srq(3)`: `max_wr`, `max_sge` and the limit last armed.
///
/// # Safety
/// `srq` is NULL or a live SRQ of this library; `attr` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    guard_int("ibv_query_srq", || {
        // SAFETY: per the contract.
        let rec = unsafe { SrqRec::from_ibv(srq) }.ok_or(libc::EINVAL)?;
        // SAFETY: per the contract.
        let out = unsafe { attr.as_mut() }.ok_or(libc::EINVAL)?;
        *out = ibv_srq_attr {
            max_wr: rec.max_wr,
            max_sge: rec.max_sge,
            srq_limit: rec.limit.load(Ordering::Acquire),
        };
        Ok(())
    })
}

/// `ibv_destroy_srq(3)`: `EBUSY` while a QP is attached to it.
///
/// # Safety
/// `srq` is NULL or a live SRQ of this library that no other thread is using.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    guard_int("ibv_destroy_srq", || {
        // SAFETY: per the contract.
        let rec = unsafe { SrqRec::from_ibv(srq) }.ok_or(libc::EINVAL)?;
        if rec.users.load(Ordering::Acquire) != 0 {
            return Err(libc::EBUSY);
        }
        let ibv = rec.ibv.get();
        // SAFETY: the record is live; its context and PD outlive it (the PD is held).
        unsafe {
            if let Some(ctx) = ContextRec::from_ibv((*ibv).context) {
                ctx.srqs
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .retain(|&p| p != srq as usize);
            }
            if let Some(pd) = PdRec::from_ibv((*ibv).pd) {
                pd.release();
            }
            libc::pthread_mutex_destroy(addr_of_mut!((*ibv).mutex).cast());
            libc::pthread_cond_destroy(addr_of_mut!((*ibv).cond).cast());
        }
        // SAFETY: `srq` came from `Box::into_raw` in `create`; the caller no longer uses it.
        drop(unsafe { Box::from_raw(srq.cast::<SrqRec>()) });
        Ok(())
    })
}

/// `ibv_context_ops.post_srq_recv`.
pub(crate) unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    guard("ibv_post_srq_recv", libc::EIO, || {
        // SAFETY: the inline `ibv_post_srq_recv` passes an SRQ of this library.
        let Some(rec) = (unsafe { SrqRec::from_ibv(srq) }) else {
            return libc::EINVAL;
        };
        // SAFETY: the application's chain and out-pointer.
        unsafe {
            post_recv_chain(wr, bad, rec.max_sge, |r| {
                rec.srq.post_recv(r).map_err(|e| errno_of_post(&e))
            })
        }
    })
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::qp::harness::{bring_up, ibv_sge_of, post, Side, WC_SUCCESS};
    use crate::qp::{ibv_create_qp, ibv_destroy_qp, SEND_SIGNALED, WR_SEND};
    use crate::sys::{ibv_qp_type_IBV_QPT_RC as RC, ibv_send_wr, ibv_sge};

    #[test]
    fn srq_receives_for_its_qp_and_stays_while_attached() {
        let net = roce_transport::SimNetwork::perfect();
        let (a, b) = (Side::open(&net, "10.0.0.1"), Side::open(&net, "10.0.0.2"));
        let mut init = ibv_srq_init_attr {
            srq_context: ptr::null_mut(),
            attr: ibv_srq_attr {
                max_wr: 16,
                max_sge: 0,
                srq_limit: 0,
            },
        };
        // SAFETY: the harness's PD and a local attribute struct.
        let srq = unsafe { ibv_create_srq(b.pd, &mut init) };
        assert!(!srq.is_null());
        assert_eq!((init.attr.max_wr, init.attr.max_sge), (16, 1));
        // SAFETY: the context of the harness.
        let ctx = unsafe { ContextRec::from_ibv(b.ctx) }.unwrap();
        assert_eq!(*ctx.srqs.lock().unwrap(), vec![srq as usize]);

        let qa = a.qp(RC);
        let mut qinit = b.init_attr(RC);
        qinit.srq = srq;
        // SAFETY: the harness's PD, CQ and the SRQ above.
        let qb = unsafe { ibv_create_qp(b.pd, &mut qinit) };
        assert!(!qb.is_null());
        assert_eq!((qinit.cap.max_recv_wr, qinit.cap.max_recv_sge), (0, 0));
        // SAFETY: live QPs.
        let (na, nb) = unsafe { ((*qa).qp_num, (*qb).qp_num) };
        bring_up(qa, RC, &a, &b, nb);
        bring_up(qb, RC, &b, &a, na);

        let rbuf = b.mr(32, 0);
        let mut sg = ibv_sge_of(rbuf.sge(0, 32));
        let mut rwr = ibv_recv_wr {
            wr_id: 42,
            next: ptr::null_mut(),
            sg_list: &mut sg,
            num_sge: 1,
        };
        let mut bad = ptr::null_mut();
        // SAFETY: the SRQ above and a local WR.
        assert_eq!(unsafe { post_srq_recv(srq, &mut rwr, &mut bad) }, 0);
        // Two SGEs exceed max_sge 1: EINVAL with bad_wr set.
        let mut two = [sg, sg];
        let mut rwr2 = ibv_recv_wr {
            wr_id: 43,
            next: ptr::null_mut(),
            sg_list: two.as_mut_ptr(),
            num_sge: 2,
        };
        // SAFETY: as above.
        assert_eq!(
            unsafe { post_srq_recv(srq, &mut rwr2, &mut bad) },
            libc::EINVAL
        );
        assert_eq!(bad, ptr::from_mut(&mut rwr2));

        let src = a.mr(6, 0);
        src.write(0, b"to srq").unwrap();
        let mut ssg: [ibv_sge; 1] = [ibv_sge_of(src.sge(0, 6))];
        let mut w = ibv_send_wr {
            wr_id: 1,
            sg_list: ssg.as_mut_ptr(),
            num_sge: 1,
            opcode: WR_SEND,
            send_flags: SEND_SIGNALED,
            ..ibv_send_wr::default()
        };
        assert_eq!(post(qa, &mut w).0, 0);
        let c = b.poll(1);
        assert_eq!(
            (c[0].wr_id, c[0].status, c[0].byte_len),
            (42, WC_SUCCESS, 6)
        );
        assert_eq!(&rbuf.to_vec()[..6], b"to srq");

        let mut attr = ibv_srq_attr {
            max_wr: 32,
            max_sge: 1,
            srq_limit: 17,
        };
        // SAFETY: the SRQ above and a local attribute struct.
        unsafe {
            assert_eq!(ibv_modify_srq(srq, &mut attr, SRQ_MAX_WR), libc::EOPNOTSUPP);
            assert_eq!(
                ibv_modify_srq(srq, &mut attr, SRQ_LIMIT),
                libc::EINVAL,
                "17 > max_wr"
            );
            attr.srq_limit = 4;
            assert_eq!(ibv_modify_srq(srq, &mut attr, SRQ_LIMIT), 0);
            let mut q = ibv_srq_attr::default();
            assert_eq!(ibv_query_srq(srq, &mut q), 0);
            assert_eq!((q.max_wr, q.max_sge, q.srq_limit), (16, 1, 4));

            assert_eq!(ibv_destroy_srq(srq), libc::EBUSY, "a QP is attached");
            assert_eq!(ibv_destroy_qp(qb), 0);
            assert_eq!(ibv_destroy_srq(srq), 0);
        }
        assert!(ctx.srqs.lock().unwrap().is_empty());
    }

    #[test]
    fn create_srq_ex_takes_basic_srqs_only() {
        let net = roce_transport::SimNetwork::perfect();
        let a = Side::open(&net, "10.0.0.1");
        let mut attr = ibv_srq_init_attr_ex {
            attr: ibv_srq_attr {
                max_wr: 8,
                max_sge: 2,
                srq_limit: 0,
            },
            comp_mask: INIT_ATTR_PD | INIT_ATTR_TYPE,
            srq_type: crate::sys::ibv_srq_type_IBV_SRQT_XRC,
            pd: a.pd,
            ..ibv_srq_init_attr_ex::default()
        };
        // SAFETY: the harness's context and PD, a local attribute struct.
        unsafe {
            assert!(create_srq_ex(a.ctx, &mut attr).is_null());
            assert_eq!(
                std::io::Error::last_os_error().raw_os_error(),
                Some(libc::EOPNOTSUPP)
            );
            attr.srq_type = crate::sys::ibv_srq_type_IBV_SRQT_BASIC;
            attr.comp_mask = INIT_ATTR_TYPE;
            assert!(create_srq_ex(a.ctx, &mut attr).is_null(), "no PD");
            attr.comp_mask = INIT_ATTR_PD | INIT_ATTR_TYPE;
            let srq = create_srq_ex(a.ctx, &mut attr);
            assert!(!srq.is_null());
            assert_eq!((*srq).pd, a.pd);
            assert_eq!(
                crate::pd::ibv_dealloc_pd(a.pd),
                libc::EBUSY,
                "the SRQ holds it"
            );
            assert_eq!(ibv_destroy_srq(srq), 0);
            assert_eq!(crate::pd::ibv_dealloc_pd(a.pd), 0);
        }
    }
}
