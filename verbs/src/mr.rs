//! Memory regions registered in place (`ibv_reg_mr`, `ibv_reg_mr_iova`, `ibv_reg_mr_iova2`,
//! `ibv_rereg_mr`, `ibv_dereg_mr`, `ibv_reg_dmabuf_mr`). OWNER: helper "memcq".
//!
//! The application's own memory is registered, as a NIC does: peers write into it and read
//! from it while the application holds it (rocectl's side of every access is a relaxed
//! atomic, the DMA contract of `roce_mr::MrTable::register_raw`). Local and remote work
//! requests address it by its IOVA: the address itself for `ibv_reg_mr`, the caller's `iova`
//! for `ibv_reg_mr_iova(2)`, 0 with `IBV_ACCESS_ZERO_BASED`. `mr->addr` is the application's
//! address, as rdma-core sets it. No pages are pinned, so fork needs no care here.
//!
//! Because nothing is pinned, memory the application unmaps while it is still registered is
//! gone for us, where a NIC would keep writing the pinned pages. UCX 1.13 does it to the
//! receive buffers of its UD QPs at teardown. An access to it fails instead of faulting
//! (`roce_mr`'s `guard` module, Linux x86_64): a receive completes with `IBV_WC_LOC_PROT_ERR`,
//! a remote access is NAKed, and `ROCECTL_VERBS_TRACE` reports the count at `ibv_destroy_qp`.
//!
//! Access flags (ibv_reg_mr(3)): LOCAL_WRITE, REMOTE_WRITE, REMOTE_READ, REMOTE_ATOMIC,
//! MW_BIND and ZERO_BASED are kept (plus the later FLUSH_GLOBAL/FLUSH_PERSISTENT bits, 1 << 8
//! and 1 << 9, which rocectl implements); RELAXED_ORDERING and the rest of the optional range
//! (1 << 20 ..= 1 << 29) and HUGETLB are accepted and ignored; ON_DEMAND is `EOPNOTSUPP` (the
//! device reports no ODP); REMOTE_WRITE or REMOTE_ATOMIC without LOCAL_WRITE, or any other
//! bit, is `EINVAL`.
//!
//! Import (`ibv_import_mr(3)`): every MR has a unique `handle`; importing it into a PD of the
//! same engine returns a new `ibv_mr` sharing the registration (same keys, `addr` NULL as the
//! man page says). The registration lives while the original or an import holds it;
//! `ibv_unimport_mr` frees only the import, `ibv_dereg_mr` of the original also makes the
//! handle unimportable.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex};

use roce_transport::{Access, MemoryRegion};

use crate::ffi;
use crate::pd::{lock, next_handle, PdRec};
use crate::sys::{
    ibv_access_flags_IBV_ACCESS_HUGETLB, ibv_access_flags_IBV_ACCESS_ON_DEMAND, ibv_mr, ibv_pd,
    ibv_rereg_mr_err_code_IBV_REREG_MR_ERR_INPUT, ibv_rereg_mr_flags_IBV_REREG_MR_CHANGE_ACCESS,
    ibv_rereg_mr_flags_IBV_REREG_MR_CHANGE_PD, ibv_rereg_mr_flags_IBV_REREG_MR_CHANGE_TRANSLATION,
    ibv_rereg_mr_flags_IBV_REREG_MR_FLAGS_SUPPORTED, IBV_ACCESS_OPTIONAL_FIRST,
};

/// `IBV_ACCESS_OPTIONAL_RANGE` (verbs_api.h: bits 20 to 29), hints a device may ignore.
const ACCESS_OPTIONAL_RANGE: u32 = (((1 << 29) << 1) - 1) & !(IBV_ACCESS_OPTIONAL_FIRST - 1);

/// A memory region.
#[repr(C)]
pub(crate) struct MrRec {
    /// Must stay the first field.
    pub(crate) ibv: ibv_mr,
    /// The registration; changed in place by `ibv_rereg_mr`; shared with its imports.
    mr: Arc<Mutex<MemoryRegion>>,
    /// Memory the region lives in that this library owns (a DM's), kept until the MR goes.
    _keep: Option<Arc<dyn Send + Sync>>,
}

/// Importable MRs by handle: the engine of their context and the shared registration.
type Shared = (usize, Arc<Mutex<MemoryRegion>>);
static MRS: Mutex<Option<HashMap<u32, Shared>>> = Mutex::new(None);

/// The engine id of `pd`'s context (0 when it has none).
fn engine_of(pd: &PdRec) -> usize {
    // SAFETY: a live PD's context is open (contexts outlive their objects).
    unsafe { crate::context::ContextRec::from_ibv(pd.ibv.context) }
        .map_or(0, crate::context::ContextRec::engine_id)
}

impl MrRec {
    /// The record behind an `ibv_mr` of this library; `None` for NULL.
    ///
    /// # Safety
    /// `mr` is NULL or a live MR from this library's `ibv_reg_mr*`.
    pub(crate) unsafe fn from_ibv<'a>(mr: *mut ibv_mr) -> Option<&'a Self> {
        // SAFETY: `ibv` is the first field of the `#[repr(C)]` record.
        unsafe { mr.cast::<Self>().as_ref() }
    }
}

/// The rocectl rights for verbs access flags (the rules in the module doc).
pub(crate) fn access_of(flags: c_int) -> Result<Access, i32> {
    let bits = flags as u32;
    if bits & ibv_access_flags_IBV_ACCESS_ON_DEMAND != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    let kept = bits & !(ACCESS_OPTIONAL_RANGE | ibv_access_flags_IBV_ACCESS_HUGETLB);
    match Access::from_bits(kept) {
        Some(a) if a.is_consistent() => Ok(a),
        _ => Err(libc::EINVAL),
    }
}

/// Registers `addr .. addr + length` of `pd` in place at `iova` (0 with ZERO_BASED).
///
/// # Safety
/// `pd` is NULL or a live PD of this library; the memory stays valid until the MR is
/// deregistered (the verb's contract).
unsafe fn register(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> Result<*mut ibv_mr, i32> {
    // SAFETY: forwarded.
    unsafe { register_kept(pd, addr, length, iova, access, None) }
}

/// [`register`], the MR holding `keep` (the owner of the memory) until it is deregistered.
///
/// # Safety
/// As [`register`].
pub(crate) unsafe fn register_kept(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
    keep: Option<Arc<dyn Send + Sync>>,
) -> Result<*mut ibv_mr, i32> {
    // SAFETY: per this function's contract.
    let rec = unsafe { PdRec::from_ibv(pd) }.ok_or(libc::EINVAL)?;
    let rights = access_of(access)?;
    let iova = if rights.contains(Access::ZERO_BASED) {
        0
    } else {
        iova
    };
    // SAFETY: the application keeps the memory valid until `ibv_dereg_mr`, which drops the
    // region (ibv_reg_mr(3)'s contract, forwarded).
    let mr = unsafe { rec.pd.register_raw(addr.cast::<u8>(), length, iova, rights) }
        .map_err(|e| ffi::errno_of_verbs(&e))?;
    let key = mr.lkey().value();
    let out = Box::new(MrRec {
        ibv: ibv_mr {
            context: rec.ibv.context,
            pd,
            addr,
            length,
            handle: next_handle(),
            lkey: key,
            rkey: mr.rkey().value(),
        },
        mr: Arc::new(Mutex::new(mr)),
        _keep: keep,
    });
    lock(&MRS)
        .get_or_insert_with(HashMap::new)
        .insert(out.ibv.handle, (engine_of(rec), out.mr.clone()));
    rec.hold();
    ffi::trace(format_args!(
        "reg_mr addr={addr:p} len={length} iova={iova:#x} access={rights} lkey={key:#x}"
    ));
    Ok(Box::into_raw(out).cast::<ibv_mr>())
}

/// `ibv_reg_mr(3)` (IBVERBS_1.1): registers `addr .. addr + length` in place, addressed by
/// work requests at `addr` (the IOVA is the address). NULL with `errno`: EINVAL (NULL PD, bad
/// access flags, NULL `addr` with a non-zero length), EOPNOTSUPP (`IBV_ACCESS_ON_DEMAND`).
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    ffi::guard_ptr("ibv_reg_mr", || {
        // SAFETY: forwarded from the verb's contract.
        unsafe { register(pd, addr, length, addr as u64, access) }
    })
}

/// `ibv_reg_mr_iova(3)` (IBVERBS_1.7): as [`ibv_reg_mr`], addressed at `iova` instead of
/// `addr` (offset `o` of the region is `iova + o`).
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    ffi::guard_ptr("ibv_reg_mr_iova", || {
        // SAFETY: forwarded from the verb's contract.
        unsafe { register(pd, addr, length, iova, access) }
    })
}

/// `ibv_reg_mr_iova2` (IBVERBS_1.8): [`ibv_reg_mr_iova`] with unsigned access flags; the
/// `ibv_reg_mr` header macro lands here when the flags are not a compile-time constant.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> *mut ibv_mr {
    ffi::guard_ptr("ibv_reg_mr_iova2", || {
        // SAFETY: forwarded from the verb's contract.
        unsafe { register(pd, addr, length, iova, access as c_int) }
    })
}

/// `ibv_reg_dmabuf_mr(3)` (IBVERBS_1.12): dma-buf memory is device memory a software NIC
/// cannot reach; always NULL with `errno = EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_dmabuf_mr(
    _pd: *mut ibv_pd,
    _offset: u64,
    _length: usize,
    _iova: u64,
    _fd: c_int,
    _access: c_int,
) -> *mut ibv_mr {
    ffi::guard_ptr("ibv_reg_dmabuf_mr", || Err(libc::EOPNOTSUPP))
}

/// `ibv_dereg_mr(3)`: deregisters the region (waiting for any access in progress; after it
/// returns no peer can reach the memory) and frees the `ibv_mr`. 0, or EINVAL for NULL.
#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    ffi::guard_int("ibv_dereg_mr", || {
        if mr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: a live MR of this library (the verb's contract), given up by this call.
        let rec = unsafe { Box::from_raw(mr.cast::<MrRec>()) };
        let pd = rec.ibv.pd;
        if let Some(m) = lock(&MRS).as_mut() {
            if m.get(&rec.ibv.handle)
                .is_some_and(|(_, s)| Arc::ptr_eq(s, &rec.mr))
            {
                m.remove(&rec.ibv.handle);
            }
        }
        // Deregisters the key (MemoryRegion's Drop) unless an import still holds it.
        drop(rec);
        // SAFETY: the MR's PD outlives it: `ibv_dealloc_pd` refuses while the MR holds it.
        if let Some(pd) = unsafe { PdRec::from_ibv(pd) } {
            pd.release();
        }
        Ok(())
    })
}

/// `ibv_import_mr(3)` (IBVERBS_1.10): a new `ibv_mr` in `pd` for the MR whose `handle` is
/// `mr_handle` on the engine of `pd`'s context, sharing its registration (module doc); its
/// `addr` is NULL. NULL with `errno`: `EINVAL` (NULL PD), `ENOENT` (no such MR on this device).
#[no_mangle]
pub unsafe extern "C" fn ibv_import_mr(pd: *mut ibv_pd, mr_handle: u32) -> *mut ibv_mr {
    ffi::guard_ptr("ibv_import_mr", || {
        // SAFETY: `pd` is NULL or a live PD of this library (the verb's contract).
        let rec = unsafe { PdRec::from_ibv(pd) }.ok_or(libc::EINVAL)?;
        let engine = engine_of(rec);
        let shared = lock(&MRS)
            .as_ref()
            .and_then(|m| m.get(&mr_handle))
            .filter(|(e, _)| *e == engine)
            .map(|(_, s)| s.clone())
            .ok_or(libc::ENOENT)?;
        let (length, lkey, rkey) = {
            let m = lock(&shared);
            (m.len(), m.lkey().value(), m.rkey().value())
        };
        let out = Box::new(MrRec {
            ibv: ibv_mr {
                context: rec.ibv.context,
                pd,
                addr: std::ptr::null_mut(),
                length,
                handle: mr_handle,
                lkey,
                rkey,
            },
            mr: shared,
            _keep: None,
        });
        rec.hold();
        Ok(Box::into_raw(out).cast::<ibv_mr>())
    })
}

/// `ibv_unimport_mr(3)` (IBVERBS_1.10): frees an `ibv_mr` from [`ibv_import_mr`] without
/// deregistering the region its original still holds. NULL is ignored.
#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_mr(mr: *mut ibv_mr) {
    ffi::guard("ibv_unimport_mr", (), || {
        if mr.is_null() {
            return;
        }
        // SAFETY: a live MR of this library (the verb's contract), given up by this call.
        let rec = unsafe { Box::from_raw(mr.cast::<MrRec>()) };
        let pd = rec.ibv.pd;
        drop(rec);
        // SAFETY: the MR's PD outlives it: unimport/dealloc keep a PD that has users.
        if let Some(pd) = unsafe { PdRec::from_ibv(pd) } {
            pd.release();
        }
    })
}

/// `ibv_rereg_mr(3)`: changes the translation (`addr`/`length`, addressed at `addr`), the PD
/// and/or the access flags of a region in place: the lkey and rkey stay the same (as rxe and
/// mlx5 keep them), so a peer's rkey reaches the new mapping. Returns 0, or
/// `IBV_REREG_MR_ERR_INPUT` with `errno` (EINVAL, EOPNOTSUPP) when the request is refused,
/// in which case the old registration is still valid and unchanged.
#[no_mangle]
pub unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    ffi::guard(
        "ibv_rereg_mr",
        ibv_rereg_mr_err_code_IBV_REREG_MR_ERR_INPUT,
        || {
            // SAFETY: forwarded from the verb's contract.
            match unsafe { rereg(mr, flags, pd, addr, length, access) } {
                Ok(()) => 0,
                Err(e) => {
                    ffi::set_errno(e);
                    ibv_rereg_mr_err_code_IBV_REREG_MR_ERR_INPUT
                }
            }
        },
    )
}

/// The body of [`ibv_rereg_mr`].
///
/// # Safety
/// `mr` is NULL or a live MR of this library, `pd` NULL or a live PD; new memory stays valid
/// until deregistration.
unsafe fn rereg(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> Result<(), i32> {
    let flags = flags as u32;
    // SAFETY: per this function's contract.
    let rec = unsafe { MrRec::from_ibv(mr) }.ok_or(libc::EINVAL)?;
    let translation = flags & ibv_rereg_mr_flags_IBV_REREG_MR_CHANGE_TRANSLATION != 0;
    let change_pd = flags & ibv_rereg_mr_flags_IBV_REREG_MR_CHANGE_PD != 0;
    let change_access = flags & ibv_rereg_mr_flags_IBV_REREG_MR_CHANGE_ACCESS != 0;
    // rdma-core's own input checks (libibverbs/verbs.c `ibv_rereg_mr`).
    if flags & !ibv_rereg_mr_flags_IBV_REREG_MR_FLAGS_SUPPORTED != 0
        || (translation && (length == 0 || addr.is_null()))
        || (access != 0 && !change_access)
    {
        return Err(libc::EINVAL);
    }
    let mut cur = lock(&rec.mr);
    let old_pd = rec.ibv.pd;
    let new_pd = if change_pd { pd } else { old_pd };
    // SAFETY: per this function's contract (the current PD is live: the MR holds it).
    let new_pd_rec = unsafe { PdRec::from_ibv(new_pd) }.ok_or(libc::EINVAL)?;
    let rights = if change_access {
        access_of(access)?
    } else {
        cur.access()
    };
    let (new_addr, new_len, iova) = if translation {
        (addr, length, addr as u64)
    } else {
        (rec.ibv.addr, rec.ibv.length, cur.addr())
    };
    let iova = if rights.contains(Access::ZERO_BASED) {
        0
    } else if cur.access().contains(Access::ZERO_BASED) && !translation {
        // Was zero based, is not any more: address it at the application's address.
        rec.ibv.addr as u64
    } else {
        iova
    };
    // SAFETY: the new memory stays valid until deregistration (the verb's contract); the
    // old memory is not touched again once this returns.
    unsafe { cur.reregister_raw(&new_pd_rec.pd, new_addr.cast::<u8>(), new_len, iova, rights) }
        .map_err(|e| ffi::errno_of_verbs(&e))?;
    if change_pd && new_pd != old_pd {
        new_pd_rec.hold();
        // SAFETY: the old PD is live until this release (the MR held it).
        if let Some(old) = unsafe { PdRec::from_ibv(old_pd) } {
            old.release();
        }
    }
    // SAFETY: `mr` is the live record (checked above); the application does not access it
    // concurrently with a verb that changes it (as with rdma-core). Writes go through the
    // raw pointer, not through `rec`. The keys do not change.
    unsafe {
        (*mr).pd = new_pd;
        (*mr).addr = new_addr;
        (*mr).length = new_len;
    }
    drop(cur);
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::ptr::null_mut;

    use super::*;
    use crate::pd::testing;
    use crate::pd::{ibv_alloc_pd, ibv_dealloc_pd};
    use crate::sys::{
        ibv_access_flags_IBV_ACCESS_LOCAL_WRITE, ibv_access_flags_IBV_ACCESS_RELAXED_ORDERING,
        ibv_access_flags_IBV_ACCESS_REMOTE_ATOMIC, ibv_access_flags_IBV_ACCESS_REMOTE_READ,
        ibv_access_flags_IBV_ACCESS_REMOTE_WRITE, ibv_access_flags_IBV_ACCESS_ZERO_BASED,
    };

    const LW: c_int = ibv_access_flags_IBV_ACCESS_LOCAL_WRITE as c_int;
    const RW: c_int = ibv_access_flags_IBV_ACCESS_REMOTE_WRITE as c_int;
    const RR: c_int = ibv_access_flags_IBV_ACCESS_REMOTE_READ as c_int;
    const RA: c_int = ibv_access_flags_IBV_ACCESS_REMOTE_ATOMIC as c_int;

    fn errno() -> i32 {
        // SAFETY: the calling thread's errno slot.
        unsafe { *libc::__errno_location() }
    }

    #[test]
    fn access_flags_follow_the_man_page() {
        assert_eq!(access_of(0), Ok(Access::empty()));
        assert_eq!(
            access_of(LW | RW | RR | RA),
            Ok(Access::LOCAL_WRITE
                | Access::REMOTE_WRITE
                | Access::REMOTE_READ
                | Access::REMOTE_ATOMIC)
        );
        assert_eq!(access_of(RW), Err(libc::EINVAL));
        assert_eq!(access_of(RA | RR), Err(libc::EINVAL));
        let relaxed = ibv_access_flags_IBV_ACCESS_RELAXED_ORDERING as c_int;
        assert_eq!(access_of(LW | relaxed | (1 << 29)), Ok(Access::LOCAL_WRITE));
        assert_eq!(
            access_of(ibv_access_flags_IBV_ACCESS_ON_DEMAND as c_int | LW),
            Err(libc::EOPNOTSUPP)
        );
        assert_eq!(access_of(1 << 12), Err(libc::EINVAL));
        assert_eq!(access_of(1 << 30), Err(libc::EINVAL));
        assert_eq!(ACCESS_OPTIONAL_RANGE, 0x3FF0_0000);
    }

    #[test]
    fn registration_fills_the_mr_and_holds_the_pd() {
        let Some(lab) = testing::Lab::new("vmmr1") else {
            return;
        };
        let ctx = lab.open(1);
        let mut buf = vec![0u8; 4096];
        let addr = buf.as_mut_ptr().cast::<c_void>();
        // SAFETY: `buf` outlives every registration; each MR is deregistered before the end.
        unsafe {
            let pd = ibv_alloc_pd(ctx);
            assert!(ibv_reg_mr(null_mut(), addr, 64, LW).is_null());
            assert_eq!(errno(), libc::EINVAL);
            assert!(ibv_reg_mr(pd, addr, 64, RW).is_null());
            assert_eq!(errno(), libc::EINVAL);
            let odp = ibv_access_flags_IBV_ACCESS_ON_DEMAND as c_int;
            assert!(ibv_reg_mr(pd, addr, 64, odp).is_null());
            assert_eq!(errno(), libc::EOPNOTSUPP);
            assert!(ibv_reg_dmabuf_mr(pd, 0, 64, 0, 3, LW).is_null());
            assert_eq!(errno(), libc::EOPNOTSUPP);

            let mr = ibv_reg_mr(pd, addr, 4096, LW | RW | RR);
            assert!(!mr.is_null());
            assert_eq!((*mr).context, ctx);
            assert_eq!((*mr).pd, pd);
            assert_eq!((*mr).addr, addr);
            assert_eq!((*mr).length, 4096);
            assert_eq!((*mr).lkey, (*mr).rkey);
            assert_ne!((*mr).lkey, 0);
            let rec = MrRec::from_ibv(mr).unwrap();
            assert_eq!(lock(&rec.mr).addr(), addr as u64);
            let mr2 = ibv_reg_mr_iova2(pd, addr, 8, 0x10_0000, LW as u32);
            assert_eq!(lock(&MrRec::from_ibv(mr2).unwrap().mr).addr(), 0x10_0000);
            assert_ne!((*mr2).lkey, (*mr).lkey);
            let zb = ibv_access_flags_IBV_ACCESS_ZERO_BASED as c_int;
            let mr3 = ibv_reg_mr_iova(pd, addr, 8, 0x77, LW | zb);
            assert_eq!(lock(&MrRec::from_ibv(mr3).unwrap().mr).addr(), 0);

            assert_eq!(ibv_dealloc_pd(pd), libc::EBUSY);
            assert_eq!(ibv_dereg_mr(mr), 0);
            assert_eq!(ibv_dereg_mr(mr2), 0);
            assert_eq!(ibv_dealloc_pd(pd), libc::EBUSY);
            assert_eq!(ibv_dereg_mr(mr3), 0);
            assert_eq!(ibv_dereg_mr(null_mut()), libc::EINVAL);
            assert_eq!(ibv_dealloc_pd(pd), 0);
        }
        testing::close(ctx);
    }

    #[test]
    fn rereg_changes_translation_pd_and_access() {
        let Some(lab) = testing::Lab::new("vmmr2") else {
            return;
        };
        let ctx = lab.open(1);
        let mut a = vec![0u8; 64];
        let mut b = vec![0u8; 128];
        let pa = a.as_mut_ptr().cast::<c_void>();
        let pb = b.as_mut_ptr().cast::<c_void>();
        // SAFETY: both buffers outlive the MR, deregistered before the end.
        unsafe {
            let pd1 = ibv_alloc_pd(ctx);
            let pd2 = ibv_alloc_pd(ctx);
            let mr = ibv_reg_mr(pd1, pa, 64, LW);
            let rec = MrRec::from_ibv(mr).unwrap();
            let key0 = (*mr).lkey;
            // Input errors leave the old registration as it was.
            let err = ibv_rereg_mr_err_code_IBV_REREG_MR_ERR_INPUT;
            assert_eq!(ibv_rereg_mr(mr, 1 << 3, null_mut(), null_mut(), 0, 0), err);
            let tr = ibv_rereg_mr_flags_IBV_REREG_MR_CHANGE_TRANSLATION as c_int;
            assert_eq!(ibv_rereg_mr(mr, tr, null_mut(), null_mut(), 8, 0), err);
            assert_eq!(ibv_rereg_mr(mr, tr, null_mut(), pb, 8, LW), err);
            let acc = ibv_rereg_mr_flags_IBV_REREG_MR_CHANGE_ACCESS as c_int;
            assert_eq!(ibv_rereg_mr(mr, acc, null_mut(), null_mut(), 0, RW), err);
            assert_eq!(errno(), libc::EINVAL);
            assert_eq!((*mr).lkey, key0);
            // Translation: the new buffer, addressed at its own address, same keys.
            assert_eq!(ibv_rereg_mr(mr, tr, null_mut(), pb, 128, 0), 0);
            assert_eq!(((*mr).addr, (*mr).length), (pb, 128));
            assert_eq!(((*mr).lkey, (*mr).rkey), (key0, key0));
            assert_eq!(lock(&rec.mr).addr(), pb as u64);
            assert_eq!(lock(&rec.mr).access(), Access::LOCAL_WRITE);
            // Access.
            assert_eq!(ibv_rereg_mr(mr, acc, null_mut(), null_mut(), 0, LW | RW), 0);
            assert_eq!(
                lock(&rec.mr).access(),
                Access::LOCAL_WRITE | Access::REMOTE_WRITE
            );
            assert_eq!(lock(&rec.mr).len(), 128);
            // PD: the hold moves with the MR.
            let chpd = ibv_rereg_mr_flags_IBV_REREG_MR_CHANGE_PD as c_int;
            assert_eq!(ibv_rereg_mr(mr, chpd, null_mut(), null_mut(), 0, 0), err);
            assert_eq!(ibv_rereg_mr(mr, chpd, pd2, null_mut(), 0, 0), 0);
            assert_eq!((*mr).pd, pd2);
            assert_eq!(ibv_dealloc_pd(pd1), 0);
            assert_eq!(ibv_dealloc_pd(pd2), libc::EBUSY);
            assert_eq!(ibv_dereg_mr(mr), 0);
            assert_eq!(ibv_dealloc_pd(pd2), 0);
        }
        testing::close(ctx);
    }
}
