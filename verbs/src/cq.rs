//! Completion queues (`ibv_create_cq`, `create_cq_ex`, `ibv_destroy_cq`, `ibv_resize_cq`,
//! `poll_cq`, `req_notify_cq`, `ibv_ack_cq_events`, the `ibv_cq_ex` polling table). OWNER:
//! helper "memcq".
//!
//! Every CQ is an `ibv_cq_ex` (its first 128 bytes are the `ibv_cq`), so `ibv_poll_cq` and
//! `ibv_start_poll` work on any of them. Polling drives engine progress when the CQ is empty,
//! as `roce_transport::CompletionQueue::poll` does. A CQ created with a completion channel
//! hands its events to the channel (see `channel.rs`).
//!
//! Extended completion fields: `IBV_WC_EX_WITH_BYTE_LEN`, `IMM`, `QP_NUM`, `SRC_QP`, `SLID`,
//! `SL` and `DLID_PATH_BITS` (`IBV_WC_STANDARD_FLAGS`); `read_opcode`, `read_vendor_err` and
//! `read_wc_flags` always. Timestamps, CVLAN, flow tags and tag matching are `EOPNOTSUPP`:
//! rocectl's completions carry no timestamp.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use roce_transport::{Completion, WcOpcode};

use crate::channel::{ChannelRec, ChannelShared};
use crate::context::ContextRec;
use crate::ffi;
use crate::pd::{lock, next_handle};
use crate::sys::{
    __be32, ibv_comp_channel, ibv_context, ibv_cq, ibv_cq_ex, ibv_cq_init_attr_ex,
    ibv_cq_init_attr_mask_IBV_CQ_INIT_ATTR_MASK_FLAGS,
    ibv_cq_init_attr_mask_IBV_CQ_INIT_ATTR_MASK_PD,
    ibv_create_cq_attr_flags_IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN,
    ibv_create_cq_attr_flags_IBV_CREATE_CQ_ATTR_SINGLE_THREADED, ibv_poll_cq_attr, ibv_wc,
    ibv_wc_flags_IBV_WC_GRH, ibv_wc_flags_IBV_WC_WITH_IMM, ibv_wc_flags_IBV_WC_WITH_INV,
    ibv_wc_opcode, ibv_wc_opcode_IBV_WC_ATOMIC_WRITE, ibv_wc_opcode_IBV_WC_COMP_SWAP,
    ibv_wc_opcode_IBV_WC_FETCH_ADD, ibv_wc_opcode_IBV_WC_LOCAL_INV, ibv_wc_opcode_IBV_WC_RDMA_READ,
    ibv_wc_opcode_IBV_WC_RDMA_WRITE, ibv_wc_opcode_IBV_WC_RECV,
    ibv_wc_opcode_IBV_WC_RECV_RDMA_WITH_IMM, ibv_wc_opcode_IBV_WC_SEND, ibv_wc_status,
    IBV_WC_STANDARD_FLAGS,
};

/// `IBV_WC_FLUSH` (rdma-core 45's verbs.h; 44 lacks it): a FLUSH completed.
const IBV_WC_FLUSH: ibv_wc_opcode = 8;

/// Largest CQ (`DeviceAttr::max_cqe`).
const MAX_CQE: c_int = 1 << 20;

/// A completion queue; every CQ is an `ibv_cq_ex` whose first 128 bytes are the `ibv_cq`.
#[repr(C)]
pub(crate) struct CqRec {
    /// Must stay the first field.
    pub(crate) ex: ibv_cq_ex,
    /// The rocectl CQ.
    pub(crate) cq: roce_transport::CompletionQueue,
    /// The completion channel the CQ reports to, if any.
    channel: Option<Arc<ChannelShared>>,
    /// The completion `ibv_start_poll`/`ibv_next_poll` stopped at, for the `read_*` calls.
    cur: Mutex<Completion>,
    /// Events `ibv_get_cq_event` returned for this CQ; `ibv_destroy_cq` waits until
    /// `comp_events_completed` (acknowledged events) reaches it. Incremented under the
    /// channel's queue lock.
    pub(crate) events_reported: AtomicU32,
    /// QPs (and SRQs) using the CQ.
    users: AtomicU32,
    /// `wc.sl` of a UD receive (one with a GRH): the RoCE packet type, see [`roce_pkt_type`].
    grh_sl: u8,
}

/// The RoCE packet type a UD receive completion reports in `sl`, as mlx5 hardware does
/// (RoCE has no service level): bit 3 set for a UDP header (RoCEv2), bits 2..0 the L3
/// header, 2 for IPv4 (then the IPv4 header fills bytes 20..40 of the GRH area), 1 for
/// IPv6. UCX's ud_verbs reads it to find the destination GID in the GRH area and drops
/// every packet whose destination is not one of its GIDs (`UCX_UD_VERBS_ETH_DGID_CHECK`):
/// with 0 it would read an IPv4 packet's GRH area as an IPv6 header. A device's engine
/// receives one address family only, so the type is the device's.
pub(crate) fn roce_pkt_type(local: std::net::SocketAddr) -> u8 {
    if local.is_ipv4() {
        0b1010
    } else {
        0b1001
    }
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

    /// The record behind an `ibv_cq_ex` of this library; `None` for NULL.
    ///
    /// # Safety
    /// `cq` is NULL or a live CQ of this library.
    unsafe fn from_ex<'a>(cq: *mut ibv_cq_ex) -> Option<&'a Self> {
        // SAFETY: `ex` is the first field of the record.
        unsafe { cq.cast::<Self>().as_ref() }
    }

    /// Records one more QP (or SRQ) completing into this CQ: `ibv_destroy_cq` fails with
    /// `EBUSY` until the matching [`Self::release`]. Call it once the QP exists and
    /// `release` when it is destroyed.
    pub(crate) fn hold(&self) {
        self.users.fetch_add(1, Ordering::AcqRel);
    }

    /// Undoes one [`Self::hold`] (an unbalanced release is ignored).
    pub(crate) fn release(&self) {
        let _ = self
            .users
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }
}

/// The `ibv_wc_opcode` of a completion.
pub(crate) fn opcode_of(op: WcOpcode) -> ibv_wc_opcode {
    match op {
        WcOpcode::Send => ibv_wc_opcode_IBV_WC_SEND,
        WcOpcode::RdmaWrite => ibv_wc_opcode_IBV_WC_RDMA_WRITE,
        WcOpcode::RdmaRead => ibv_wc_opcode_IBV_WC_RDMA_READ,
        WcOpcode::CompSwap => ibv_wc_opcode_IBV_WC_COMP_SWAP,
        WcOpcode::FetchAdd => ibv_wc_opcode_IBV_WC_FETCH_ADD,
        WcOpcode::LocalInv => ibv_wc_opcode_IBV_WC_LOCAL_INV,
        WcOpcode::Flush => IBV_WC_FLUSH,
        WcOpcode::AtomicWrite => ibv_wc_opcode_IBV_WC_ATOMIC_WRITE,
        WcOpcode::Recv => ibv_wc_opcode_IBV_WC_RECV,
        WcOpcode::RecvRdmaWithImm => ibv_wc_opcode_IBV_WC_RECV_RDMA_WITH_IMM,
    }
}

/// The `ibv_wc_status` of a completion (rocectl's `WcStatus` has verbs' values).
fn status_of(c: &Completion) -> ibv_wc_status {
    c.status as u8 as ibv_wc_status
}

/// `wc_flags`: GRH for UD receives (the first 40 bytes of the buffer hold it), WITH_IMM,
/// WITH_INV.
fn wc_flags_of(c: &Completion) -> c_uint {
    let mut f = 0;
    if c.grh {
        f |= ibv_wc_flags_IBV_WC_GRH;
    }
    if c.imm_data.is_some() {
        f |= ibv_wc_flags_IBV_WC_WITH_IMM;
    }
    if c.invalidated_rkey.is_some() {
        f |= ibv_wc_flags_IBV_WC_WITH_INV;
    }
    f
}

/// The immediate data in network byte order (what `wc.imm_data` holds: the wire bytes), or
/// the invalidated rkey (host order), or 0.
fn imm_of(c: &Completion) -> u32 {
    match (c.imm_data, c.invalidated_rkey) {
        (Some(imm), _) => imm.to_be(),
        (None, Some(rkey)) => rkey.value(),
        (None, None) => 0,
    }
}

/// Fills a `struct ibv_wc` (ibv_poll_cq(3)). RoCE has no LIDs: `slid`, `sl`,
/// `dlid_path_bits` are 0; the P_Key index is always the default entry, 0.
pub(crate) fn fill_wc(c: &Completion, wc: &mut ibv_wc) {
    wc.wr_id = c.wr_id;
    wc.status = status_of(c);
    wc.opcode = opcode_of(c.opcode);
    wc.vendor_err = 0;
    wc.byte_len = c.byte_len;
    wc.__bindgen_anon_1.imm_data = imm_of(c);
    wc.qp_num = c.qp_num.value();
    wc.src_qp = c.src_qp.value();
    wc.wc_flags = wc_flags_of(c);
    wc.pkey_index = 0;
    wc.slid = 0;
    wc.sl = 0;
    wc.dlid_path_bits = 0;
}

/// Creates a CQ record; the common part of `ibv_create_cq` and `create_cq_ex`.
///
/// # Safety
/// `context` is NULL or an open context; `channel` NULL or a live channel of it.
unsafe fn create(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> Result<*mut CqRec, i32> {
    // SAFETY: per this function's contract.
    let ctx = unsafe { ContextRec::from_ibv(context) }.ok_or(libc::EINVAL)?;
    if !(1..=MAX_CQE).contains(&cqe) {
        return Err(libc::EINVAL);
    }
    if comp_vector < 0 || comp_vector >= ctx.vctx.context.num_comp_vectors.max(1) {
        return Err(libc::EINVAL);
    }
    let chan = if channel.is_null() {
        None
    } else {
        // SAFETY: per this function's contract.
        let ch = unsafe { ChannelRec::from_ibv(channel) }.ok_or(libc::EINVAL)?;
        if ch.ibv.context != context {
            return Err(libc::EINVAL);
        }
        Some(ch)
    };
    let cq = ctx
        .dev
        .create_cq(cqe as usize)
        .map_err(|e| ffi::errno_of_verbs(&e))?;
    let depth = cq.depth() as c_int;
    let mut ex = ibv_cq_ex {
        context,
        channel,
        cq_context,
        handle: next_handle(),
        cqe: depth,
        ..ibv_cq_ex::default()
    };
    ex.start_poll = Some(start_poll);
    ex.next_poll = Some(next_poll);
    ex.end_poll = Some(end_poll);
    ex.read_opcode = Some(read_opcode);
    ex.read_vendor_err = Some(read_vendor_err);
    ex.read_byte_len = Some(read_byte_len);
    ex.read_imm_data = Some(read_imm_data);
    ex.read_qp_num = Some(read_qp_num);
    ex.read_src_qp = Some(read_src_qp);
    ex.read_wc_flags = Some(read_wc_flags);
    ex.read_slid = Some(read_slid);
    ex.read_sl = Some(read_sl);
    ex.read_dlid_path_bits = Some(read_dlid_path_bits);
    let rec = Box::into_raw(Box::new(CqRec {
        ex,
        cq,
        channel: chan.map(|c| c.shared.clone()),
        cur: Mutex::new(Completion::EMPTY),
        events_reported: AtomicU32::new(0),
        users: AtomicU32::new(0),
        grh_sl: roce_pkt_type(ctx.dev.local_addr()),
    }));
    // SAFETY: `rec` is the fresh, exclusively owned record; the pthread objects are
    // initialised in place, at their final address.
    unsafe {
        libc::pthread_mutex_init((&raw mut (*rec).ex.mutex).cast(), std::ptr::null());
        libc::pthread_cond_init((&raw mut (*rec).ex.cond).cast(), std::ptr::null());
    }
    if let Some(ch) = chan {
        ch.shared.attach();
        // SAFETY: `channel` is the live channel `ch` came from.
        unsafe { ChannelRec::sync_refcnt(channel) };
        let shared = ch.shared.clone();
        let at = rec as usize;
        // SAFETY: the record lives until `ibv_destroy_cq` frees it, after detaching this
        // notifier (no call runs or starts after `set_notify(None)` returns).
        let cq = unsafe { &(*rec).cq };
        cq.set_notify(Some(Arc::new(move || shared.fire(at))));
    }
    Ok(rec)
}

/// `ibv_create_cq(3)`: a CQ of at least `cqe` entries (`cq->cqe` is the real depth) whose
/// events go to `channel` (may be NULL). NULL with `errno` EINVAL: NULL context, `cqe`
/// outside 1..=1048576, `comp_vector` outside the context's vectors, a channel of another
/// context.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    ffi::guard_ptr("ibv_create_cq", || {
        // SAFETY: forwarded from the verb's contract.
        let rec = unsafe { create(context, cqe, cq_context, channel, comp_vector) }?;
        Ok(rec.cast::<ibv_cq>())
    })
}

/// `verbs_context.create_cq_ex` (`ibv_create_cq_ex(3)`): as [`ibv_create_cq`], with the
/// extended attributes. `EOPNOTSUPP` for `wc_flags` beyond `IBV_WC_STANDARD_FLAGS`
/// (timestamps, CVLAN, flow tag, tag matching) or unknown creation flags; `EINVAL` for unknown
/// `comp_mask` bits or a `parent_domain` that is not a parent domain of `ctx`. `SINGLE_THREADED` is a hint;
/// `IGNORE_OVERRUN` holds anyway (an overrun loses the completion, the CQ keeps working).
pub(crate) unsafe extern "C" fn create_cq_ex(
    ctx: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    ffi::guard_ptr("ibv_create_cq_ex", || {
        // SAFETY: the attributes the application passed (NULL checked).
        let a = unsafe { attr.as_ref() }.ok_or(libc::EINVAL)?;
        let known = ibv_cq_init_attr_mask_IBV_CQ_INIT_ATTR_MASK_FLAGS
            | ibv_cq_init_attr_mask_IBV_CQ_INIT_ATTR_MASK_PD;
        if a.comp_mask & !known != 0 {
            return Err(libc::EINVAL);
        }
        if a.comp_mask & ibv_cq_init_attr_mask_IBV_CQ_INIT_ATTR_MASK_PD != 0 {
            // A parent domain of this context (ibv_create_cq_ex(3)); it only carries
            // allocators rocectl does not call (pd.rs), so the CQ keeps no link to it.
            // SAFETY: NULL or a live PD of this library (the verb's contract).
            let pd = unsafe { crate::pd::PdRec::from_ibv(a.parent_domain) }.ok_or(libc::EINVAL)?;
            if !pd.is_parent_domain() || pd.ibv.context != ctx {
                return Err(libc::EINVAL);
            }
        }
        let flags = ibv_create_cq_attr_flags_IBV_CREATE_CQ_ATTR_SINGLE_THREADED
            | ibv_create_cq_attr_flags_IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN;
        if a.comp_mask & ibv_cq_init_attr_mask_IBV_CQ_INIT_ATTR_MASK_FLAGS != 0
            && a.flags & !flags != 0
        {
            return Err(libc::EOPNOTSUPP);
        }
        if a.wc_flags & !u64::from(IBV_WC_STANDARD_FLAGS) != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        let cqe = c_int::try_from(a.cqe).map_err(|_| libc::EINVAL)?;
        let vector = c_int::try_from(a.comp_vector).map_err(|_| libc::EINVAL)?;
        // SAFETY: forwarded from the verb's contract.
        let rec = unsafe { create(ctx, cqe, a.cq_context, a.channel, vector) }?;
        Ok(rec.cast::<ibv_cq_ex>())
    })
}

/// `ibv_destroy_cq(3)`: `EBUSY` while QPs use the CQ, `EINVAL` for NULL. Otherwise
/// detaches the CQ from its channel (events not yet returned by `ibv_get_cq_event` are
/// dropped), waits until every event returned for it has been acknowledged with
/// `ibv_ack_cq_events` (rdma-core's rule), and frees it.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    ffi::guard_int("ibv_destroy_cq", || {
        // SAFETY: NULL or a live CQ of this library (the verb's contract).
        let rec = unsafe { CqRec::from_ibv(cq) }.ok_or(libc::EINVAL)?;
        if rec.users.load(Ordering::Acquire) != 0 {
            return Err(libc::EBUSY);
        }
        rec.cq.set_notify(None);
        if let Some(ch) = &rec.channel {
            ch.forget(cq as usize);
            ch.detach();
            // SAFETY: the CQ's channel is live: it cannot be destroyed while the CQ is
            // attached.
            unsafe { ChannelRec::sync_refcnt((*cq).channel) };
        }
        // SAFETY: the CQ is live; its pthread objects were initialised by `create`.
        unsafe {
            let mutex = (&raw mut (*cq).mutex).cast::<libc::pthread_mutex_t>();
            let cond = (&raw mut (*cq).cond).cast::<libc::pthread_cond_t>();
            libc::pthread_mutex_lock(mutex);
            while (&raw const (*cq).comp_events_completed).read()
                != rec.events_reported.load(Ordering::Acquire)
            {
                libc::pthread_cond_wait(cond, mutex);
            }
            libc::pthread_mutex_unlock(mutex);
            libc::pthread_cond_destroy(cond);
            libc::pthread_mutex_destroy(mutex);
        }
        // SAFETY: allocated by `create` with `Box::into_raw`, given up by this call; no
        // channel or notifier refers to it any more.
        drop(unsafe { Box::from_raw(cq.cast::<CqRec>()) });
        Ok(())
    })
}

/// `ibv_resize_cq(3)`: gives the CQ `cqe` entries (`cq->cqe` updated), keeping the
/// completions waiting. `EINVAL`: NULL, `cqe` outside 1..=1048576 or below the number of
/// completions waiting.
#[no_mangle]
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    ffi::guard_int("ibv_resize_cq", || {
        // SAFETY: NULL or a live CQ of this library (the verb's contract).
        let rec = unsafe { CqRec::from_ibv(cq) }.ok_or(libc::EINVAL)?;
        let depth = usize::try_from(cqe).map_err(|_| libc::EINVAL)?;
        rec.cq.resize(depth).map_err(|e| ffi::errno_of_verbs(&e))?;
        // SAFETY: the live CQ; written through the raw pointer (the application does not
        // read `cqe` while it resizes).
        unsafe { (*cq).cqe = rec.cq.depth() as c_int };
        Ok(())
    })
}

/// `ibv_ack_cq_events(3)`: acknowledges `nevents` events of `cq` returned by
/// `ibv_get_cq_event` (adds to `cq->comp_events_completed` under `cq->mutex` and signals
/// `cq->cond`, on which `ibv_destroy_cq` waits).
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: c_uint) {
    ffi::guard("ibv_ack_cq_events", (), || {
        if cq.is_null() {
            return;
        }
        // SAFETY: a live CQ of this library (the verb's contract); its pthread objects were
        // initialised by `create`, and `comp_events_completed` is only written under them.
        unsafe {
            let mutex = (&raw mut (*cq).mutex).cast::<libc::pthread_mutex_t>();
            libc::pthread_mutex_lock(mutex);
            let done = &raw mut (*cq).comp_events_completed;
            done.write(done.read().wrapping_add(nevents));
            libc::pthread_cond_signal((&raw mut (*cq).cond).cast());
            libc::pthread_mutex_unlock(mutex);
        }
    });
}

/// `ibv_context_ops.poll_cq` (`ibv_poll_cq(3)`): up to `n` completions into `wc`; returns
/// how many, or -EINVAL for a NULL CQ or `wc`. Makes engine progress when the CQ is empty.
pub(crate) unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    ffi::guard("ibv_poll_cq", -libc::EIO, || {
        // SAFETY: NULL or a live CQ of this library (the verb's contract).
        let Some(rec) = (unsafe { CqRec::from_ibv(cq) }) else {
            return -libc::EINVAL;
        };
        let Ok(n) = usize::try_from(n) else {
            return 0;
        };
        if n == 0 {
            return 0;
        }
        if wc.is_null() {
            return -libc::EINVAL;
        }
        let mut buf = [Completion::EMPTY; 16];
        let mut done = 0;
        while done < n {
            let want = (n - done).min(buf.len());
            let got = rec.cq.poll(&mut buf[..want]);
            for (i, c) in buf[..got].iter().enumerate() {
                // SAFETY: `wc` has room for `n` entries (the verb's contract); done + i < n.
                let w = unsafe { &mut *wc.add(done + i) };
                fill_wc(c, w);
                if c.grh {
                    w.sl = rec.grh_sl;
                }
            }
            done += got;
            if got < want {
                break;
            }
        }
        done as c_int
    })
}

/// `ibv_context_ops.req_notify_cq` (`ibv_req_notify_cq(3)`): arms the CQ; the next
/// completion (with `solicited_only`, the next solicited or failed one) sends one event to
/// its channel. Arming also fires at once when a completion that made no event is still
/// queued (it landed between the application's last poll and this call): UCX's sleep mode
/// arms without polling again and relies on it, as mlx5 devices behave. 0, or EINVAL for
/// NULL.
pub(crate) unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    ffi::guard_int("ibv_req_notify_cq", || {
        // SAFETY: NULL or a live CQ of this library (the verb's contract).
        let rec = unsafe { CqRec::from_ibv(cq) }.ok_or(libc::EINVAL)?;
        rec.cq.req_notify(solicited_only != 0);
        rec.cq.notify_if_pending();
        Ok(())
    })
}

/// Takes the next completion into the record for the `read_*` calls and the public
/// `status`/`wr_id`; ENOENT when the CQ is empty (after trying to make progress).
///
/// # Safety
/// `cq` is a live CQ of this library.
unsafe fn advance(cq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: per this function's contract.
    let Some(rec) = (unsafe { CqRec::from_ex(cq) }) else {
        return libc::EINVAL;
    };
    let Some(c) = rec.cq.poll_one() else {
        return libc::ENOENT;
    };
    *lock(&rec.cur) = c;
    // SAFETY: the live CQ; the application reads these two fields only after this returns
    // (ibv_create_cq_ex(3)); written through the raw pointer.
    unsafe {
        (*cq).status = status_of(&c);
        (*cq).wr_id = c.wr_id;
    }
    0
}

/// `ibv_cq_ex.start_poll` (`ibv_start_poll`): 0 with the first completion current, ENOENT
/// when empty (then `end_poll` must not be called), EINVAL for a non-zero `comp_mask`.
unsafe extern "C" fn start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    ffi::guard("ibv_start_poll", libc::EIO, || {
        // SAFETY: NULL or the application's attributes.
        if unsafe { attr.as_ref() }.is_some_and(|a| a.comp_mask != 0) {
            return libc::EINVAL;
        }
        // SAFETY: a live CQ of this library (the verb's contract).
        unsafe { advance(cq) }
    })
}

/// `ibv_cq_ex.next_poll` (`ibv_next_poll`): 0 with the next completion current, ENOENT when
/// none is left.
unsafe extern "C" fn next_poll(cq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: a live CQ of this library (the verb's contract).
    ffi::guard("ibv_next_poll", libc::EIO, || unsafe { advance(cq) })
}

/// `ibv_cq_ex.end_poll` (`ibv_end_poll`): ends the batch. Completions are consumed as they
/// are reached, so there is nothing to release.
unsafe extern "C" fn end_poll(_cq: *mut ibv_cq_ex) {}

/// The current completion of a CQ (EMPTY for NULL).
///
/// # Safety
/// `cq` is NULL or a live CQ of this library.
unsafe fn current(cq: *mut ibv_cq_ex) -> Completion {
    // SAFETY: per this function's contract.
    match unsafe { CqRec::from_ex(cq) } {
        Some(rec) => *lock(&rec.cur),
        None => Completion::EMPTY,
    }
}

/// `ibv_wc_read_opcode`.
unsafe extern "C" fn read_opcode(cq: *mut ibv_cq_ex) -> ibv_wc_opcode {
    // SAFETY: a live CQ of this library (the verb's contract).
    ffi::guard("ibv_wc_read_opcode", 0, || {
        opcode_of(unsafe { current(cq) }.opcode)
    })
}

/// `ibv_wc_read_vendor_err`: always 0.
unsafe extern "C" fn read_vendor_err(_cq: *mut ibv_cq_ex) -> u32 {
    0
}

/// `ibv_wc_read_byte_len`.
unsafe extern "C" fn read_byte_len(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: a live CQ of this library (the verb's contract).
    ffi::guard(
        "ibv_wc_read_byte_len",
        0,
        || unsafe { current(cq) }.byte_len,
    )
}

/// `ibv_wc_read_imm_data`: network byte order (or the invalidated rkey, as `ibv_wc`'s union).
unsafe extern "C" fn read_imm_data(cq: *mut ibv_cq_ex) -> __be32 {
    // SAFETY: a live CQ of this library (the verb's contract).
    ffi::guard("ibv_wc_read_imm_data", 0, || {
        imm_of(&unsafe { current(cq) })
    })
}

/// `ibv_wc_read_qp_num`.
unsafe extern "C" fn read_qp_num(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: a live CQ of this library (the verb's contract).
    ffi::guard("ibv_wc_read_qp_num", 0, || {
        unsafe { current(cq) }.qp_num.value()
    })
}

/// `ibv_wc_read_src_qp`.
unsafe extern "C" fn read_src_qp(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: a live CQ of this library (the verb's contract).
    ffi::guard("ibv_wc_read_src_qp", 0, || {
        unsafe { current(cq) }.src_qp.value()
    })
}

/// `ibv_wc_read_wc_flags`.
unsafe extern "C" fn read_wc_flags(cq: *mut ibv_cq_ex) -> c_uint {
    // SAFETY: a live CQ of this library (the verb's contract).
    ffi::guard("ibv_wc_read_wc_flags", 0, || {
        wc_flags_of(&unsafe { current(cq) })
    })
}

/// `ibv_wc_read_slid`: RoCE has no LIDs, 0.
unsafe extern "C" fn read_slid(_cq: *mut ibv_cq_ex) -> u32 {
    0
}

/// `ibv_wc_read_sl`: the RoCE packet type for a UD receive ([`roce_pkt_type`]), else 0.
unsafe extern "C" fn read_sl(cq: *mut ibv_cq_ex) -> u8 {
    ffi::guard("ibv_wc_read_sl", 0, || {
        // SAFETY: a live CQ of this library (the verb's contract).
        let Some(rec) = (unsafe { CqRec::from_ex(cq) }) else {
            return 0;
        };
        // SAFETY: as above.
        if unsafe { current(cq) }.grh {
            rec.grh_sl
        } else {
            0
        }
    })
}

/// `ibv_wc_read_dlid_path_bits`: 0.
unsafe extern "C" fn read_dlid_path_bits(_cq: *mut ibv_cq_ex) -> u8 {
    0
}

/// Two contexts on a simulated network with a PD, a CQ (made through this module's verbs)
/// and a connected RC QP each (made through the Rust API until the QP verbs exist).
#[cfg(test)]
pub(crate) mod testing {
    use std::ffi::{c_int, c_void};
    use std::ptr::null_mut;
    use std::time::{Duration, Instant};

    use roce_transport::{
        ConnectOptions, LKey, Psn, QpInit, QpType, QueuePair, RemoteQp, SendOp, SendWr, Sge,
    };

    use super::{ibv_create_cq, ibv_destroy_cq, poll_cq, CqRec};
    use crate::pd::testing::{self as ctx, Lab};
    use crate::pd::{ibv_alloc_pd, ibv_dealloc_pd, PdRec};
    use crate::sys::{ibv_context, ibv_cq, ibv_mr, ibv_pd, ibv_wc};

    /// One end.
    pub(crate) struct End {
        pub(crate) ctx: *mut ibv_context,
        pub(crate) pd: *mut ibv_pd,
        pub(crate) cq: *mut ibv_cq,
        pub(crate) qp: Option<QueuePair>,
    }

    impl End {
        /// The QP.
        pub(crate) fn qp(&self) -> &QueuePair {
            self.qp.as_ref().unwrap()
        }

        /// Polls through `ibv_context_ops.poll_cq` until `n` completions came (5 s at most).
        pub(crate) fn poll(&self, n: usize) -> Vec<ibv_wc> {
            let mut out = vec![ibv_wc::default(); n];
            let mut got = 0;
            let deadline = Instant::now() + Duration::from_secs(5);
            while got < n {
                assert!(Instant::now() < deadline, "{got} of {n} completions");
                // SAFETY: a live CQ; `out[got..]` has room for `n - got` entries.
                let r = unsafe { poll_cq(self.cq, (n - got) as c_int, out[got..].as_mut_ptr()) };
                assert!(r >= 0);
                got += r as usize;
            }
            out
        }

        /// Tears the end down through the verbs.
        pub(crate) fn close(mut self) {
            self.qp = None;
            // SAFETY: the objects of this end, each destroyed once, children first.
            unsafe {
                assert_eq!(ibv_destroy_cq(self.cq), 0);
                assert_eq!(ibv_dealloc_pd(self.pd), 0);
            }
            ctx::close(self.ctx);
        }
    }

    /// Two connected ends at 127.0.0.1 and .2 of `lab`, each with a CQ from `ibv_create_cq`
    /// (depth 32, `cq_context` 0x1001 / 0x1002, no channel).
    pub(crate) fn pair(lab: &Lab) -> (End, End) {
        pair_with(lab, |ctx, host| {
            // SAFETY: a live context.
            unsafe {
                ibv_create_cq(
                    ctx,
                    32,
                    (0x1000 + usize::from(host)) as *mut c_void,
                    null_mut(),
                    0,
                )
            }
        })
    }

    /// As [`pair`]; `make_cq(ctx, host)` creates each end's CQ (host 1 or 2).
    pub(crate) fn pair_with(
        lab: &Lab,
        mut make_cq: impl FnMut(*mut ibv_context, u8) -> *mut ibv_cq,
    ) -> (End, End) {
        let mut end = |host: u8| {
            let c = lab.open(host);
            // SAFETY: a live context.
            let pd = unsafe { ibv_alloc_pd(c) };
            let cq = make_cq(c, host);
            assert!(!cq.is_null());
            // SAFETY: live records of this library.
            let (pdr, cqr) =
                unsafe { (PdRec::from_ibv(pd).unwrap(), CqRec::from_ibv(cq).unwrap()) };
            let qp = pdr.pd.create_qp(&QpInit::new(QpType::Rc, &cqr.cq)).unwrap();
            End {
                ctx: c,
                pd,
                cq,
                qp: Some(qp),
            }
        };
        let (a, b) = (end(1), end(2));
        let remote = |e: &End| RemoteQp {
            qpn: e.qp().qpn(),
            psn: Psn::new(0),
            // SAFETY: a live context.
            gid: unsafe { crate::context::ContextRec::from_ibv(e.ctx) }
                .unwrap()
                .dev
                .local_gid(),
        };
        let o = ConnectOptions::default();
        a.qp().connect(&remote(&b), &o).unwrap();
        b.qp().connect(&remote(&a), &o).unwrap();
        (a, b)
    }

    /// A scatter/gather entry over `len` bytes at `offset` of a registered region.
    pub(crate) fn sge(mr: *mut ibv_mr, offset: usize, len: usize) -> Sge {
        // SAFETY: a live MR.
        let (addr, lkey) = unsafe { ((*mr).addr as u64, (*mr).lkey) };
        Sge {
            addr: addr + offset as u64,
            length: len as u32,
            lkey: LKey::new(lkey),
        }
    }

    /// Posts a signalled SEND of `src` from `a`.
    pub(crate) fn send(a: &End, wr_id: u64, src: Sge) {
        a.qp()
            .post_send(SendWr::new(wr_id, SendOp::Send, vec![src]))
            .unwrap();
    }
}

#[cfg(test)]
mod tests {
    use std::ptr::null_mut;

    use roce_transport::{Qpn, RKey, RecvWr, SendOp, SendWr, WcStatus};

    use super::testing::{pair, pair_with, send, sge};
    use super::*;
    use crate::mr::{ibv_dereg_mr, ibv_reg_mr};
    use crate::pd::testing::Lab;
    use crate::sys::{
        ibv_access_flags_IBV_ACCESS_LOCAL_WRITE, ibv_access_flags_IBV_ACCESS_REMOTE_ATOMIC,
        ibv_access_flags_IBV_ACCESS_REMOTE_READ, ibv_access_flags_IBV_ACCESS_REMOTE_WRITE,
        ibv_create_cq_wc_flags_IBV_WC_EX_WITH_BYTE_LEN,
        ibv_create_cq_wc_flags_IBV_WC_EX_WITH_COMPLETION_TIMESTAMP,
        ibv_create_cq_wc_flags_IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK,
        ibv_create_cq_wc_flags_IBV_WC_EX_WITH_IMM, ibv_create_cq_wc_flags_IBV_WC_EX_WITH_QP_NUM,
        ibv_wc_status_IBV_WC_REM_ACCESS_ERR, ibv_wc_status_IBV_WC_SUCCESS,
    };

    const ALL: c_int = (ibv_access_flags_IBV_ACCESS_LOCAL_WRITE
        | ibv_access_flags_IBV_ACCESS_REMOTE_WRITE
        | ibv_access_flags_IBV_ACCESS_REMOTE_READ
        | ibv_access_flags_IBV_ACCESS_REMOTE_ATOMIC) as c_int;

    fn errno() -> i32 {
        // SAFETY: the calling thread's errno slot.
        unsafe { *libc::__errno_location() }
    }

    fn wc_of(c: &Completion) -> ibv_wc {
        let mut wc = ibv_wc::default();
        fill_wc(c, &mut wc);
        wc
    }

    #[test]
    fn poll_cq_gives_a_ud_receive_the_ipv4_packet_type_ucx_reads_the_gid_by() {
        use crate::ah::{ibv_create_ah, ibv_destroy_ah};
        use crate::qp::harness::{connected, ibv_sge_of, post, post_recv_one};
        use crate::qp::{SEND_SIGNALED, WR_SEND};
        use crate::sys::{ibv_qp_type_IBV_QPT_UD, ibv_send_wr};

        let (a, b, qa, qb) = connected(ibv_qp_type_IBV_QPT_UD);
        // SAFETY: a live QP of the test.
        let nb = unsafe { (*qb).qp_num };
        let rbuf = b.mr(40 + 16, 0);
        assert_eq!(post_recv_one(qb, 9, rbuf.sge(0, 40 + 16)), 0);
        let mut attr = a.ah_attr_to(&b);
        // SAFETY: the harness's PD and a local attribute struct.
        let ah = unsafe { ibv_create_ah(a.pd, &mut attr) };
        assert!(!ah.is_null());
        let msg = a.mr(8, 0x5A);
        let mut sg = ibv_sge_of(msg.sge(0, 8));
        let mut w = ibv_send_wr {
            wr_id: 1,
            num_sge: 1,
            sg_list: &mut sg,
            opcode: WR_SEND,
            send_flags: SEND_SIGNALED,
            ..ibv_send_wr::default()
        };
        w.wr.ud.ah = ah;
        w.wr.ud.remote_qpn = nb;
        w.wr.ud.remote_qkey = 0x1111_1111;
        assert_eq!(post(qa, &mut w).0, 0);
        let mut wc = ibv_wc::default();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        // SAFETY: the harness's CQ and one `ibv_wc`.
        while unsafe { poll_cq(b.cq, 1, &mut wc) } == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "no receive completion"
            );
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        assert_eq!((wc.wr_id, wc.status), (9, ibv_wc_status_IBV_WC_SUCCESS));
        assert_ne!(wc.wc_flags & ibv_wc_flags_IBV_WC_GRH, 0);
        assert_eq!(wc.sl, 0b1010);
        // UCX's uct_ud_grh_get_dgid: with (sl & 7) == 2 the destination is the last 4 bytes
        // of the GRH area (the IPv4 header's daddr), and it must be one of b's GIDs.
        let area = rbuf.to_vec();
        assert_eq!(area[20] >> 4, 4);
        assert_eq!(area[36..40], b.dev.local_gid().0[12..16]);
        // A send completion has no GRH and sl 0.
        // SAFETY: as above, a's CQ.
        while unsafe { poll_cq(a.cq, 1, &mut wc) } == 0 {
            assert!(std::time::Instant::now() < deadline, "no send completion");
        }
        assert_eq!(
            (wc.wr_id, wc.sl, wc.wc_flags & ibv_wc_flags_IBV_WC_GRH),
            (1, 0, 0)
        );
        // SAFETY: the test's AH.
        assert_eq!(unsafe { ibv_destroy_ah(ah) }, 0);
    }

    #[test]
    fn a_ud_receive_reports_the_roce_packet_type_in_sl_as_mlx5_does() {
        let v4: std::net::SocketAddr = "10.0.0.1:4791".parse().unwrap();
        let v6: std::net::SocketAddr = "[fd00::1]:4791".parse().unwrap();
        // UCX: `(sl & 7) == 2` means IPv4, the destination address in the last 4 bytes of
        // the GRH area; bit 3 is "has a UDP header" (RoCEv2).
        assert_eq!(roce_pkt_type(v4), 0b1010);
        assert_eq!(roce_pkt_type(v4) & 7, 2);
        assert_eq!(roce_pkt_type(v6), 0b1001);
        assert_eq!(roce_pkt_type(v6) & 7, 1);
    }

    #[test]
    fn work_completions_carry_verbs_values() {
        let ops = [
            (WcOpcode::Send, 0),
            (WcOpcode::RdmaWrite, 1),
            (WcOpcode::RdmaRead, 2),
            (WcOpcode::CompSwap, 3),
            (WcOpcode::FetchAdd, 4),
            (WcOpcode::LocalInv, 6),
            (WcOpcode::Flush, 8),
            (WcOpcode::AtomicWrite, 9),
            (WcOpcode::Recv, 128),
            (WcOpcode::RecvRdmaWithImm, 129),
        ];
        for (op, v) in ops {
            let c = Completion {
                opcode: op,
                ..Completion::EMPTY
            };
            assert_eq!(wc_of(&c).opcode, v, "{op:?}");
        }
        let statuses = [
            (WcStatus::Success, 0),
            (WcStatus::LocLenErr, 1),
            (WcStatus::LocProtErr, 4),
            (WcStatus::WrFlushErr, 5),
            (WcStatus::RemInvReqErr, 9),
            (WcStatus::RemAccessErr, 10),
            (WcStatus::RemOpErr, 11),
            (WcStatus::RetryExcErr, 12),
            (WcStatus::RnrRetryExcErr, 13),
            (WcStatus::GeneralErr, 21),
        ];
        for (st, v) in statuses {
            let c = Completion {
                status: st,
                ..Completion::EMPTY
            };
            assert_eq!(wc_of(&c).status, v, "{st:?}");
        }
        // A UD receive with immediate data: GRH and WITH_IMM, the immediate in network
        // order (the wire's bytes in memory), every field copied.
        let c = Completion {
            wr_id: 0xDEAD_BEEF_0000_0001,
            opcode: WcOpcode::Recv,
            byte_len: 40 + 100,
            imm_data: Some(0x0102_0304),
            qp_num: Qpn::new(0x12_3456),
            src_qp: Qpn::new(0xAB_CDEF),
            grh: true,
            ..Completion::EMPTY
        };
        let wc = wc_of(&c);
        assert_eq!(wc.wr_id, 0xDEAD_BEEF_0000_0001);
        assert_eq!(wc.byte_len, 140);
        // SAFETY: reading a plain u32 of the union.
        let imm = unsafe { wc.__bindgen_anon_1.imm_data };
        assert_eq!(imm.to_ne_bytes(), [1, 2, 3, 4]);
        assert_eq!((wc.qp_num, wc.src_qp), (0x12_3456, 0xAB_CDEF));
        assert_eq!(
            wc.wc_flags,
            ibv_wc_flags_IBV_WC_GRH | ibv_wc_flags_IBV_WC_WITH_IMM
        );
        assert_eq!(
            (wc.pkey_index, wc.slid, wc.sl, wc.dlid_path_bits),
            (0, 0, 0, 0)
        );
        assert_eq!(wc.vendor_err, 0);
        // SEND with invalidate: the rkey, host order, WITH_INV.
        let c = Completion {
            invalidated_rkey: Some(RKey::new(0x00AB_CD01)),
            ..Completion::EMPTY
        };
        let wc = wc_of(&c);
        // SAFETY: as above.
        assert_eq!(unsafe { wc.__bindgen_anon_1.invalidated_rkey }, 0x00AB_CD01);
        assert_eq!(wc.wc_flags, ibv_wc_flags_IBV_WC_WITH_INV);
    }

    #[test]
    fn one_sided_and_two_sided_operations_land_in_registered_vectors() {
        let Some(lab) = Lab::new("vmcq1") else {
            return;
        };
        let (a, b) = pair(&lab);
        let mut src = vec![0u8; 64];
        src[..16].copy_from_slice(&[0x5A; 16]);
        src[16..24].copy_from_slice(&77u64.to_le_bytes());
        let mut dst = vec![0u64; 8];
        dst[1] = 40;
        // SAFETY: both vectors outlive their MRs (deregistered below before they drop).
        let (ma, mb) = unsafe {
            (
                ibv_reg_mr(a.pd, src.as_mut_ptr().cast(), 64, ALL),
                ibv_reg_mr(b.pd, dst.as_mut_ptr().cast(), 64, ALL),
            )
        };
        assert!(!ma.is_null() && !mb.is_null());
        // SAFETY: live MR.
        let (baddr, brkey) = unsafe { ((*mb).addr as u64, RKey::new((*mb).rkey)) };
        // WRITE with immediate: 16 bytes land at dst[2..4], consuming a receive.
        b.qp()
            .post_recv(RecvWr {
                wr_id: 50,
                sges: vec![],
            })
            .unwrap();
        let op = SendOp::RdmaWriteWithImm {
            remote_addr: baddr + 16,
            rkey: brkey,
            imm: 0x1122_3344,
        };
        a.qp()
            .post_send(SendWr::new(1, op, vec![sge(ma, 0, 16)]))
            .unwrap();
        let wa = a.poll(1);
        assert_eq!(
            (wa[0].wr_id, wa[0].status),
            (1, ibv_wc_status_IBV_WC_SUCCESS)
        );
        assert_eq!(wa[0].opcode, ibv_wc_opcode_IBV_WC_RDMA_WRITE);
        assert_eq!(wa[0].qp_num, a.qp().qpn().value());
        let wb = b.poll(1);
        assert_eq!(wb[0].wr_id, 50);
        assert_eq!(wb[0].opcode, ibv_wc_opcode_IBV_WC_RECV_RDMA_WITH_IMM);
        assert_eq!(wb[0].byte_len, 16);
        assert_eq!(wb[0].wc_flags, ibv_wc_flags_IBV_WC_WITH_IMM);
        // SAFETY: plain u32 of the union.
        assert_eq!(
            unsafe { wb[0].__bindgen_anon_1.imm_data },
            0x1122_3344u32.to_be()
        );
        assert_eq!(&dst[2..4], &[0x5A5A_5A5A_5A5A_5A5A; 2]);
        // READ back into src[32..48], FETCH_ADD and COMP_SWAP on dst[1], SEND into dst[4..].
        let read = SendOp::RdmaRead {
            remote_addr: baddr + 16,
            rkey: brkey,
        };
        a.qp()
            .post_send(SendWr::new(2, read, vec![sge(ma, 32, 16)]))
            .unwrap();
        let fa = SendOp::AtomicFetchAndAdd {
            remote_addr: baddr + 8,
            rkey: brkey,
            add: 2,
        };
        a.qp()
            .post_send(SendWr::new(3, fa, vec![sge(ma, 48, 8)]))
            .unwrap();
        let cs = SendOp::AtomicCmpAndSwp {
            remote_addr: baddr + 8,
            rkey: brkey,
            compare: 42,
            swap: 7,
        };
        a.qp()
            .post_send(SendWr::new(4, cs, vec![sge(ma, 56, 8)]))
            .unwrap();
        b.qp()
            .post_recv(RecvWr {
                wr_id: 51,
                sges: vec![sge(mb, 32, 32)],
            })
            .unwrap();
        send(&a, 5, sge(ma, 16, 8));
        let wa = a.poll(4);
        let got: Vec<_> = wa.iter().map(|w| (w.wr_id, w.opcode, w.status)).collect();
        assert_eq!(
            got,
            [
                (2, ibv_wc_opcode_IBV_WC_RDMA_READ, 0),
                (3, ibv_wc_opcode_IBV_WC_FETCH_ADD, 0),
                (4, ibv_wc_opcode_IBV_WC_COMP_SWAP, 0),
                (5, ibv_wc_opcode_IBV_WC_SEND, 0),
            ]
        );
        assert_eq!(wa[0].byte_len, 16);
        let wb = b.poll(1);
        assert_eq!((wb[0].wr_id, wb[0].opcode), (51, ibv_wc_opcode_IBV_WC_RECV));
        assert_eq!((wb[0].byte_len, wb[0].wc_flags), (8, 0));
        assert_eq!(wb[0].qp_num, b.qp().qpn().value());
        assert_eq!(&src[32..48], &[0x5A; 16]);
        assert_eq!(u64::from_le_bytes(src[48..56].try_into().unwrap()), 40);
        assert_eq!(u64::from_le_bytes(src[56..64].try_into().unwrap()), 42);
        assert_eq!(dst[1], 7);
        assert_eq!(dst[4], 77);
        // Deregistered: the rkey no longer reaches `dst`.
        // SAFETY: live MR, deregistered once.
        assert_eq!(unsafe { ibv_dereg_mr(mb) }, 0);
        let op = SendOp::RdmaWrite {
            remote_addr: baddr,
            rkey: brkey,
        };
        a.qp()
            .post_send(SendWr::new(6, op, vec![sge(ma, 0, 8)]))
            .unwrap();
        let wa = a.poll(1);
        assert_eq!(
            (wa[0].wr_id, wa[0].status),
            (6, ibv_wc_status_IBV_WC_REM_ACCESS_ERR)
        );
        assert_eq!(dst[0], 0);
        // SAFETY: live MR, deregistered once.
        assert_eq!(unsafe { ibv_dereg_mr(ma) }, 0);
        a.close();
        b.close();
    }

    #[test]
    fn extended_cq_polls_one_completion_at_a_time() {
        let Some(lab) = Lab::new("vmcq2") else {
            return;
        };
        let attr = ibv_cq_init_attr_ex {
            cqe: 16,
            cq_context: 0x99 as *mut c_void,
            wc_flags: u64::from(
                ibv_create_cq_wc_flags_IBV_WC_EX_WITH_BYTE_LEN
                    | ibv_create_cq_wc_flags_IBV_WC_EX_WITH_IMM
                    | ibv_create_cq_wc_flags_IBV_WC_EX_WITH_QP_NUM,
            ),
            ..ibv_cq_init_attr_ex::default()
        };
        let (a, b) = pair_with(&lab, |ctx, _| {
            let mut at = attr;
            // SAFETY: a live context and attributes.
            unsafe { create_cq_ex(ctx, &mut at) }.cast()
        });
        // SAFETY: live contexts, CQs and MRs of this test, each destroyed once.
        unsafe {
            for bad in [
                ibv_create_cq_wc_flags_IBV_WC_EX_WITH_COMPLETION_TIMESTAMP,
                ibv_create_cq_wc_flags_IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK,
            ] {
                let mut t = attr;
                t.wc_flags |= u64::from(bad);
                assert!(create_cq_ex(b.ctx, &mut t).is_null());
                assert_eq!(errno(), libc::EOPNOTSUPP);
            }
            let mut t = attr;
            t.comp_mask = 1 << 5;
            assert!(create_cq_ex(b.ctx, &mut t).is_null());
            assert_eq!(errno(), libc::EINVAL);
            let mut t = attr;
            t.cqe = 0;
            assert!(create_cq_ex(b.ctx, &mut t).is_null());
            assert_eq!(errno(), libc::EINVAL);
            assert!(create_cq_ex(b.ctx, null_mut()).is_null());

            let cq = b.cq.cast::<ibv_cq_ex>();
            assert_eq!(((*cq).cqe, (*cq).cq_context), (16, 0x99 as *mut c_void));
            let start = (*cq).start_poll.unwrap();
            let next = (*cq).next_poll.unwrap();
            let end = (*cq).end_poll.unwrap();
            let mut pattr = ibv_poll_cq_attr { comp_mask: 0 };
            assert_eq!(start(cq, &mut pattr), libc::ENOENT);
            let mut src = vec![9u8; 32];
            let mut dst = vec![0u8; 96];
            let ma = ibv_reg_mr(a.pd, src.as_mut_ptr().cast(), 32, ALL);
            let mb = ibv_reg_mr(b.pd, dst.as_mut_ptr().cast(), 96, ALL);
            for i in 0..3u64 {
                b.qp()
                    .post_recv(RecvWr {
                        wr_id: 100 + i,
                        sges: vec![sge(mb, 32 * i as usize, 32)],
                    })
                    .unwrap();
            }
            for i in 0..3u64 {
                let op = if i == 1 {
                    SendOp::SendWithImm { imm: 0xCAFE }
                } else {
                    SendOp::Send
                };
                a.qp()
                    .post_send(SendWr::new(i, op, vec![sge(ma, 0, 10 + i as usize)]))
                    .unwrap();
            }
            // Batches as an application polls them, until the three receives came.
            let mut seen = Vec::new();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while seen.len() < 3 {
                assert!(std::time::Instant::now() < deadline, "receives missing");
                let mut r = start(cq, &mut pattr);
                if r == libc::ENOENT {
                    continue;
                }
                while r == 0 {
                    seen.push((
                        (*cq).wr_id,
                        (*cq).status,
                        ((*cq).read_opcode.unwrap())(cq),
                        ((*cq).read_byte_len.unwrap())(cq),
                        ((*cq).read_imm_data.unwrap())(cq),
                        ((*cq).read_wc_flags.unwrap())(cq),
                        ((*cq).read_qp_num.unwrap())(cq),
                    ));
                    r = next(cq);
                }
                assert_eq!(r, libc::ENOENT);
                end(cq);
            }
            let q = b.qp().qpn().value();
            let recv = ibv_wc_opcode_IBV_WC_RECV;
            assert_eq!(
                seen,
                [
                    (100, 0, recv, 10, 0, 0, q),
                    (
                        101,
                        0,
                        recv,
                        11,
                        0xCAFEu32.to_be(),
                        ibv_wc_flags_IBV_WC_WITH_IMM,
                        q
                    ),
                    (102, 0, recv, 12, 0, 0, q),
                ]
            );
            assert_eq!(&dst[64..76], &[9; 12]);
            // (verbs defines src_qp for UD only; rocectl reports the sender for RC too)
            assert_eq!(((*cq).read_src_qp.unwrap())(cq), a.qp().qpn().value());
            assert_eq!(((*cq).read_vendor_err.unwrap())(cq), 0);
            assert_eq!(((*cq).read_sl.unwrap())(cq), 0);
            assert_eq!(((*cq).read_slid.unwrap())(cq), 0);
            assert_eq!(((*cq).read_dlid_path_bits.unwrap())(cq), 0);
            assert!((*cq).read_completion_ts.is_none());
            pattr.comp_mask = 1;
            assert_eq!(start(cq, &mut pattr), libc::EINVAL);
            // The send side: ibv_poll_cq works on an extended CQ too.
            let wa = a.poll(3);
            assert!(wa
                .iter()
                .all(|w| w.opcode == ibv_wc_opcode_IBV_WC_SEND && w.status == 0));
            assert_eq!(ibv_dereg_mr(ma), 0);
            assert_eq!(ibv_dereg_mr(mb), 0);
        }
        a.close();
        b.close();
    }

    #[test]
    fn create_resize_and_destroy_check_their_arguments() {
        let Some(lab) = Lab::new("vmcq3") else {
            return;
        };
        let (a, b) = pair(&lab);
        // SAFETY: live contexts; every CQ made is destroyed once.
        unsafe {
            assert!(ibv_create_cq(null_mut(), 4, null_mut(), null_mut(), 0).is_null());
            assert_eq!(errno(), libc::EINVAL);
            assert!(ibv_create_cq(a.ctx, 0, null_mut(), null_mut(), 0).is_null());
            assert!(ibv_create_cq(a.ctx, (1 << 20) + 1, null_mut(), null_mut(), 0).is_null());
            assert!(ibv_create_cq(a.ctx, 4, null_mut(), null_mut(), 1).is_null());
            assert!(ibv_create_cq(a.ctx, 4, null_mut(), null_mut(), -1).is_null());
            assert_eq!(errno(), libc::EINVAL);
            let cq = ibv_create_cq(a.ctx, 4, 0x77 as *mut c_void, null_mut(), 0);
            assert!(!cq.is_null());
            assert_eq!(((*cq).context, (*cq).cqe), (a.ctx, 4));
            assert_eq!((*cq).cq_context, 0x77 as *mut c_void);
            assert!((*cq).channel.is_null());
            assert_eq!(ibv_resize_cq(cq, 100), 0);
            assert_eq!((*cq).cqe, 100);
            assert_eq!(ibv_resize_cq(cq, 0), libc::EINVAL);
            assert_eq!(ibv_resize_cq(null_mut(), 8), libc::EINVAL);
            assert_eq!((*cq).cqe, 100);
            let rec = CqRec::from_ibv(cq).unwrap();
            rec.hold();
            assert_eq!(ibv_destroy_cq(cq), libc::EBUSY);
            rec.release();
            assert_eq!(ibv_destroy_cq(cq), 0);
            assert_eq!(ibv_destroy_cq(null_mut()), libc::EINVAL);
            assert_eq!(req_notify_cq(null_mut(), 0), libc::EINVAL);
            assert_eq!(poll_cq(null_mut(), 1, null_mut()), -libc::EINVAL);
            assert_eq!(poll_cq(b.cq, 0, null_mut()), 0);
            assert_eq!(poll_cq(b.cq, 1, null_mut()), -libc::EINVAL);
        }
        // Resizing below the completions waiting is refused and keeps them.
        let mut buf = vec![0u8; 8];
        // SAFETY: `buf` outlives the MR.
        let m = unsafe { ibv_reg_mr(a.pd, buf.as_mut_ptr().cast(), 8, ALL) };
        for i in 0..3 {
            send(&a, i, sge(m, 0, 0));
        }
        b.qp()
            .post_recv(RecvWr {
                wr_id: 0,
                sges: vec![],
            })
            .unwrap();
        b.qp()
            .post_recv(RecvWr {
                wr_id: 1,
                sges: vec![],
            })
            .unwrap();
        b.qp()
            .post_recv(RecvWr {
                wr_id: 2,
                sges: vec![],
            })
            .unwrap();
        a.poll(3);
        // SAFETY: live CQ.
        let rec = unsafe { CqRec::from_ibv(b.cq) }.unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while rec.cq.len() < 3 {
            assert!(std::time::Instant::now() < deadline, "receives missing");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // SAFETY: live CQ.
        assert_eq!(unsafe { ibv_resize_cq(b.cq, 2) }, libc::EINVAL);
        // SAFETY: live CQ.
        assert_eq!(unsafe { (*b.cq).cqe }, 32);
        // SAFETY: live CQ.
        unsafe {
            assert_eq!(ibv_resize_cq(b.cq, 3), 0);
            assert_eq!((*b.cq).cqe, 3);
        }
        assert_eq!(
            b.poll(3).iter().map(|w| w.wr_id).collect::<Vec<_>>(),
            [0, 1, 2]
        );
        // SAFETY: live MR.
        assert_eq!(unsafe { ibv_dereg_mr(m) }, 0);
        a.close();
        b.close();
    }
}
