//! Device memory (`ibv_alloc_dm`, `ibv_free_dm`, `ibv_memcpy_to_dm` / `ibv_memcpy_from_dm`,
//! `ibv_reg_dm_mr`, `ibv_import_dm`, `ibv_unimport_dm`).
//!
//! A software NIC has no on-chip memory: a DM is an ordinary zeroed allocation of this process
//! (aligned to `1 << log_align_req`, at most `MAX_DM_SIZE` (256 KiB), the `max_dm_size`
//! `ibv_query_device_ex` reports), reached only through the `ibv_dm` copy ops and through
//! memory regions registered on it. The copy ops follow mlx5's rules (ibv_alloc_dm(3): "the
//! device memory may have alignment requirements"): offset and length must be multiples of 4
//! and inside the DM, else `EINVAL`. `ibv_reg_dm_mr` needs `IBV_ACCESS_ZERO_BASED` (the man
//! page: DM MRs are zero based) and registers `dm_offset .. dm_offset + length` at IOVA 0;
//! the MR keeps the memory alive after `ibv_free_dm`.
//!
//! Like PDs and MRs, a DM has a unique `handle` and can be imported on the same engine
//! (`ibv_import_dm`, sharing the memory).

use std::alloc::Layout;
use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use crate::context::ContextRec;
use crate::ffi;
use crate::pd::{lock, next_handle};
use crate::sys::{
    ibv_access_flags_IBV_ACCESS_ZERO_BASED, ibv_alloc_dm_attr, ibv_context, ibv_dm, ibv_mr, ibv_pd,
};

/// `max_dm_size`: the largest DM (bytes).
pub(crate) const MAX_DM_SIZE: u64 = 256 * 1024;
/// The largest alignment a DM can ask for (`log_align_req`).
const MAX_LOG_ALIGN: u32 = 12;
/// DM copies need 4-byte aligned offsets and lengths.
const DM_ALIGN: u64 = 4;

/// The memory of a DM, shared by the DM, its imports and the MRs registered on it.
pub(crate) struct DmMem {
    ptr: NonNull<u8>,
    layout: Layout,
    /// The DM's length as allocated by the application.
    len: usize,
}

// SAFETY: the allocation is owned by this value and only reached through raw copies whose
// synchronisation is the application's (as device memory is).
unsafe impl Send for DmMem {}
// SAFETY: as above.
unsafe impl Sync for DmMem {}

impl DmMem {
    fn new(len: usize, log_align: u32) -> Result<Self, i32> {
        let align = 1usize << log_align.max(3);
        let layout = Layout::from_size_align(len.max(1), align).map_err(|_| libc::EINVAL)?;
        // SAFETY: `layout` has a non-zero size.
        let ptr = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) }).ok_or(libc::ENOMEM)?;
        Ok(Self { ptr, layout, len })
    }

    /// `offset .. offset + length` if a copy of it is allowed (module doc), else `EINVAL`.
    fn range(&self, offset: u64, length: usize) -> Result<*mut u8, i32> {
        let len = length as u64;
        let end = offset.checked_add(len).ok_or(libc::EINVAL)?;
        if offset % DM_ALIGN != 0 || len % DM_ALIGN != 0 || end > self.len as u64 {
            return Err(libc::EINVAL);
        }
        // SAFETY: `offset <= len` of the allocation (checked above).
        Ok(unsafe { self.ptr.as_ptr().add(offset as usize) })
    }
}

impl Drop for DmMem {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// A DM handed to C.
#[repr(C)]
struct DmRec {
    /// Must stay the first field.
    ibv: ibv_dm,
    mem: Arc<DmMem>,
}

impl DmRec {
    /// # Safety
    /// `dm` is NULL or a live DM of this library.
    unsafe fn from_ibv<'a>(dm: *mut ibv_dm) -> Option<&'a Self> {
        // SAFETY: `ibv` is the first field of the `#[repr(C)]` record.
        unsafe { dm.cast::<Self>().as_ref() }
    }
}

/// Importable DMs by handle: the engine of their context and the memory.
type Shared = (usize, Arc<DmMem>);
static DMS: Mutex<Option<HashMap<u32, Shared>>> = Mutex::new(None);

/// A new `ibv_dm` record on `mem`.
fn new_rec(context: *mut ibv_context, handle: u32, mem: Arc<DmMem>) -> *mut ibv_dm {
    let rec = Box::new(DmRec {
        ibv: ibv_dm {
            context,
            memcpy_to_dm: Some(memcpy_to_dm),
            memcpy_from_dm: Some(memcpy_from_dm),
            comp_mask: 0,
            handle,
        },
        mem,
    });
    Box::into_raw(rec).cast()
}

/// `verbs_context.alloc_dm` (`ibv_alloc_dm(3)`): NULL with `errno`: `EINVAL` (NULL, a
/// `comp_mask`, an alignment above 4 KiB), `ENOMEM` (longer than `max_dm_size`, or no memory).
pub(crate) unsafe extern "C" fn alloc_dm(
    context: *mut ibv_context,
    attr: *mut ibv_alloc_dm_attr,
) -> *mut ibv_dm {
    ffi::guard_ptr("ibv_alloc_dm", || {
        // SAFETY: NULL or an open context of this library (the verb's contract).
        let ctx = unsafe { ContextRec::from_ibv(context) }.ok_or(libc::EINVAL)?;
        // SAFETY: NULL or the caller's attributes.
        let a = unsafe { attr.as_ref() }.ok_or(libc::EINVAL)?;
        if a.comp_mask != 0 || a.log_align_req > MAX_LOG_ALIGN {
            return Err(libc::EINVAL);
        }
        if a.length == 0 || a.length as u64 > MAX_DM_SIZE {
            return Err(libc::ENOMEM);
        }
        let mem = Arc::new(DmMem::new(a.length, a.log_align_req)?);
        let handle = next_handle();
        lock(&DMS)
            .get_or_insert_with(HashMap::new)
            .insert(handle, (ctx.engine_id(), mem.clone()));
        Ok(new_rec(context, handle, mem))
    })
}

/// `verbs_context.free_dm` (`ibv_free_dm(3)`): frees the DM record (its memory lives on while
/// an MR or import holds it) and makes its handle unimportable. `EINVAL` for NULL.
pub(crate) unsafe extern "C" fn free_dm(dm: *mut ibv_dm) -> c_int {
    ffi::guard_int("ibv_free_dm", || {
        if dm.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: a live DM of this library, given up by this call.
        let rec = unsafe { Box::from_raw(dm.cast::<DmRec>()) };
        if let Some(m) = lock(&DMS).as_mut() {
            if m.get(&rec.ibv.handle)
                .is_some_and(|(_, s)| Arc::ptr_eq(s, &rec.mem))
            {
                m.remove(&rec.ibv.handle);
            }
        }
        Ok(())
    })
}

/// `ibv_dm.memcpy_to_dm`: copies `length` bytes from `host_addr` to the DM at `dm_offset`.
unsafe extern "C" fn memcpy_to_dm(
    dm: *mut ibv_dm,
    dm_offset: u64,
    host_addr: *const c_void,
    length: usize,
) -> c_int {
    ffi::guard_int("ibv_memcpy_to_dm", || {
        // SAFETY: NULL or a live DM of this library.
        let rec = unsafe { DmRec::from_ibv(dm) }.ok_or(libc::EINVAL)?;
        let dst = rec.mem.range(dm_offset, length)?;
        if length > 0 && host_addr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: `dst .. dst + length` is inside the DM (checked); the caller's buffer holds
        // `length` bytes (the verb's contract); the two cannot overlap (the DM is private).
        unsafe { std::ptr::copy_nonoverlapping(host_addr.cast::<u8>(), dst, length) };
        Ok(())
    })
}

/// `ibv_dm.memcpy_from_dm`: copies `length` bytes of the DM at `dm_offset` to `host_addr`.
unsafe extern "C" fn memcpy_from_dm(
    host_addr: *mut c_void,
    dm: *mut ibv_dm,
    dm_offset: u64,
    length: usize,
) -> c_int {
    ffi::guard_int("ibv_memcpy_from_dm", || {
        // SAFETY: NULL or a live DM of this library.
        let rec = unsafe { DmRec::from_ibv(dm) }.ok_or(libc::EINVAL)?;
        let src = rec.mem.range(dm_offset, length)?;
        if length > 0 && host_addr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: as in `memcpy_to_dm`, the other way round.
        unsafe { std::ptr::copy_nonoverlapping(src, host_addr.cast::<u8>(), length) };
        Ok(())
    })
}

/// `verbs_context.reg_dm_mr` (`ibv_reg_dm_mr(3)`): an MR on `dm_offset .. dm_offset + length`
/// of the DM, zero based. NULL with `errno = EINVAL` without `IBV_ACCESS_ZERO_BASED`, for a
/// range outside the DM, or for NULL arguments.
pub(crate) unsafe extern "C" fn reg_dm_mr(
    pd: *mut ibv_pd,
    dm: *mut ibv_dm,
    dm_offset: u64,
    length: usize,
    access: c_uint,
) -> *mut ibv_mr {
    ffi::guard_ptr("ibv_reg_dm_mr", || {
        // SAFETY: NULL or a live DM of this library.
        let rec = unsafe { DmRec::from_ibv(dm) }.ok_or(libc::EINVAL)?;
        if access & ibv_access_flags_IBV_ACCESS_ZERO_BASED == 0 {
            return Err(libc::EINVAL);
        }
        let end = dm_offset.checked_add(length as u64).ok_or(libc::EINVAL)?;
        if end > rec.mem.len as u64 {
            return Err(libc::EINVAL);
        }
        // SAFETY: inside the allocation (checked).
        let addr = unsafe { rec.mem.ptr.as_ptr().add(dm_offset as usize) };
        let keep: Arc<dyn Send + Sync> = rec.mem.clone();
        // SAFETY: `pd` is NULL or a live PD (the verb's contract); the memory lives as long as
        // the MR, which holds `keep`.
        let mr = unsafe {
            crate::mr::register_kept(pd, addr.cast(), length, 0, access as c_int, Some(keep))
        }?;
        // rdma-core reports the DM offset as a DM MR's address (ibv_cmd_reg_dm_mr).
        // SAFETY: the MR just made.
        unsafe { (*mr).addr = dm_offset as *mut c_void };
        Ok(mr)
    })
}

/// `ibv_import_dm` (IBVERBS_1.13): a new `ibv_dm` sharing the memory of the DM whose `handle`
/// is `dm_handle` on the engine of `context`. NULL with `errno`: `EINVAL` (NULL context),
/// `ENOENT` (no such DM on this device).
#[no_mangle]
pub unsafe extern "C" fn ibv_import_dm(context: *mut ibv_context, dm_handle: u32) -> *mut ibv_dm {
    ffi::guard_ptr("ibv_import_dm", || {
        // SAFETY: NULL or an open context of this library (the verb's contract).
        let ctx = unsafe { ContextRec::from_ibv(context) }.ok_or(libc::EINVAL)?;
        let mem = lock(&DMS)
            .as_ref()
            .and_then(|m| m.get(&dm_handle))
            .filter(|(e, _)| *e == ctx.engine_id())
            .map(|(_, m)| m.clone())
            .ok_or(libc::ENOENT)?;
        Ok(new_rec(context, dm_handle, mem))
    })
}

/// `ibv_unimport_dm` (IBVERBS_1.13): frees an `ibv_dm` from [`ibv_import_dm`] without freeing
/// the memory its original holds. NULL is ignored.
#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_dm(dm: *mut ibv_dm) {
    ffi::guard("ibv_unimport_dm", (), || {
        if !dm.is_null() {
            // SAFETY: a live DM of this library, given up by this call.
            drop(unsafe { Box::from_raw(dm.cast::<DmRec>()) });
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pd::{ibv_alloc_pd, ibv_dealloc_pd, testing};

    fn errno() -> i32 {
        std::io::Error::last_os_error().raw_os_error().unwrap()
    }

    /// Allocation limits, the copy rules, a zero-based MR on the DM that outlives
    /// `ibv_free_dm`, and an import that reads what the original wrote.
    #[test]
    fn device_memory_copies_registers_and_imports() {
        let Some(lab) = testing::Lab::new("vmdm") else {
            return;
        };
        let ctx = lab.open(1);
        let mut attr = ibv_alloc_dm_attr {
            length: MAX_DM_SIZE as usize + 1,
            log_align_req: 6,
            comp_mask: 0,
        };
        // SAFETY: a live context; every object is used only while it exists.
        unsafe {
            assert!(alloc_dm(ctx, &mut attr).is_null());
            assert_eq!(errno(), libc::ENOMEM);
            attr.length = 100;
            attr.comp_mask = 7;
            assert!(alloc_dm(ctx, &mut attr).is_null());
            assert_eq!(errno(), libc::EINVAL);
            attr.comp_mask = 0;
            let dm = alloc_dm(ctx, &mut attr);
            assert!(!dm.is_null());
            assert_eq!(
                DmRec::from_ibv(dm).unwrap().mem.ptr.as_ptr() as usize % 64,
                0
            );
            let to = (*dm).memcpy_to_dm.unwrap();
            let from = (*dm).memcpy_from_dm.unwrap();
            let data = [0xABu8; 96];
            assert_eq!(to(dm, 1, data.as_ptr().cast(), 4), libc::EINVAL);
            assert_eq!(to(dm, 4, data.as_ptr().cast(), 3), libc::EINVAL);
            assert_eq!(to(dm, 8, data.as_ptr().cast(), 96), libc::EINVAL);
            assert_eq!(to(dm, 4, data.as_ptr().cast(), 96), 0);
            let mut back = [0u8; 100];
            assert_eq!(from(back.as_mut_ptr().cast(), dm, 0, 100), 0);
            assert_eq!(back[..4], [0; 4]);
            assert!(back[4..].iter().all(|&b| b == 0xAB));

            let pd = ibv_alloc_pd(ctx);
            assert!(reg_dm_mr(pd, dm, 0, 100, 1).is_null());
            assert_eq!(errno(), libc::EINVAL);
            let zb = ibv_access_flags_IBV_ACCESS_ZERO_BASED | 1;
            assert!(reg_dm_mr(pd, dm, 4, 100, zb).is_null());
            let mr = reg_dm_mr(pd, dm, 4, 96, zb);
            assert!(!mr.is_null());
            assert_eq!(((*mr).addr as usize, (*mr).length), (4, 96));

            let ctx2 = crate::context::ibv_import_device(libc::dup((*ctx).cmd_fd));
            assert!(!ctx2.is_null());
            assert!(ibv_import_dm(ctx2, u32::MAX).is_null());
            let dm2 = ibv_import_dm(ctx2, (*dm).handle);
            assert!(!dm2.is_null());
            let mut via_import = [0u8; 8];
            assert_eq!(from(via_import.as_mut_ptr().cast(), dm2, 4, 8), 0);
            assert_eq!(via_import, [0xAB; 8]);
            ibv_unimport_dm(dm2);
            testing::close(ctx2);

            let handle = (*dm).handle;
            assert_eq!(free_dm(dm), 0);
            assert!(ibv_import_dm(ctx, handle).is_null());
            assert_eq!(crate::mr::ibv_dereg_mr(mr), 0);
            assert_eq!(ibv_dealloc_pd(pd), 0);
        }
        testing::close(ctx);
    }
}
