//! Protection domains (`ibv_alloc_pd`, `ibv_dealloc_pd`). OWNER: helper "memcq".
//!
//! A PD counts its users: every memory region registered in it, and every QP, SRQ and AH
//! created in it (`PdRec::hold` / `PdRec::release`). `ibv_dealloc_pd` refuses with
//! `EBUSY` while the count is not zero, as the kernel does.
//!
//! Every PD has a unique `handle`; `ibv_import_pd(3)` finds a PD of the same engine by it (in
//! a context from `ibv_import_device`, or any context of the device) and returns a new `ibv_pd`
//! sharing the rocectl PD (`ProtectionDomain` is a shared handle: the domain lives while any
//! record holds it). `ibv_unimport_pd` frees only that record; `ibv_dealloc_pd` of either
//! frees its record and makes the handle unimportable.

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::context::ContextRec;
use crate::ffi;
use crate::sys::{ibv_context, ibv_pd};

/// A protection domain.
#[repr(C)]
pub(crate) struct PdRec {
    /// Must stay the first field.
    pub(crate) ibv: ibv_pd,
    /// The rocectl PD.
    pub(crate) pd: roce_transport::ProtectionDomain,
    /// Objects using the PD (MRs, QPs, SRQs, AHs).
    users: AtomicU32,
}

/// PDs that can be imported, by handle: the engine of their context
/// ([`ContextRec::engine_id`]) and the rocectl PD.
static PDS: Mutex<Option<HashMap<u32, (usize, roce_transport::ProtectionDomain)>>> =
    Mutex::new(None);

impl PdRec {
    /// The record behind an `ibv_pd` of this library; `None` for NULL.
    ///
    /// # Safety
    /// `pd` is NULL or a live PD from `ibv_alloc_pd`.
    pub(crate) unsafe fn from_ibv<'a>(pd: *mut ibv_pd) -> Option<&'a Self> {
        // SAFETY: `ibv` is the first field of the `#[repr(C)]` record.
        unsafe { pd.cast::<Self>().as_ref() }
    }

    /// Records one more object created in this PD (an MR, QP, SRQ or AH): `ibv_dealloc_pd`
    /// fails with `EBUSY` until the matching [`Self::release`]. Call it once the object
    /// exists (after its creation succeeded), and `release` when it is destroyed (or in the
    /// error path that undoes it).
    pub(crate) fn hold(&self) {
        self.users.fetch_add(1, Ordering::AcqRel);
    }

    /// Undoes one [`Self::hold`]. An unbalanced release is a bug of this library; it is
    /// ignored rather than wrapping the count.
    pub(crate) fn release(&self) {
        let _ = self
            .users
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    /// Objects using the PD.
    pub(crate) fn users(&self) -> u32 {
        self.users.load(Ordering::Acquire)
    }
}

/// Locks a mutex of this library's records; a poisoned lock (a panic caught by the C-boundary
/// guard while it was held) still guards consistent data here: every critical section only
/// swaps or pushes whole values.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A fresh `handle` for a PD, MR or CQ: unique per process (rdma-core reports the kernel's
/// object handle; nothing in scope interprets it).
pub(crate) fn next_handle() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// `ibv_alloc_pd(3)`: allocates a protection domain; NULL with `errno` (EINVAL for a NULL
/// context).
#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    ffi::guard_ptr("ibv_alloc_pd", || {
        // SAFETY: `context` is NULL or an open context of this library (the verb's contract).
        let ctx = unsafe { ContextRec::from_ibv(context) }.ok_or(libc::EINVAL)?;
        let rec = Box::new(PdRec {
            ibv: ibv_pd {
                context,
                handle: next_handle(),
            },
            pd: ctx.dev.alloc_pd(),
            users: AtomicU32::new(0),
        });
        lock(&PDS)
            .get_or_insert_with(HashMap::new)
            .insert(rec.ibv.handle, (ctx.engine_id(), rec.pd.clone()));
        Ok(Box::into_raw(rec).cast::<ibv_pd>())
    })
}

/// `ibv_import_pd(3)` (IBVERBS_1.10): a new `ibv_pd` for the PD whose `handle` is `pd_handle`
/// on the engine of `context` (module doc). NULL with `errno`: `EINVAL` (NULL context),
/// `ENOENT` (no such PD on this device).
#[no_mangle]
pub unsafe extern "C" fn ibv_import_pd(context: *mut ibv_context, pd_handle: u32) -> *mut ibv_pd {
    ffi::guard_ptr("ibv_import_pd", || {
        // SAFETY: `context` is NULL or an open context of this library (the verb's contract).
        let ctx = unsafe { ContextRec::from_ibv(context) }.ok_or(libc::EINVAL)?;
        let pd = lock(&PDS)
            .as_ref()
            .and_then(|m| m.get(&pd_handle))
            .filter(|(engine, _)| *engine == ctx.engine_id())
            .map(|(_, pd)| pd.clone())
            .ok_or(libc::ENOENT)?;
        let rec = Box::new(PdRec {
            ibv: ibv_pd {
                context,
                handle: pd_handle,
            },
            pd,
            users: AtomicU32::new(0),
        });
        Ok(Box::into_raw(rec).cast::<ibv_pd>())
    })
}

/// `ibv_unimport_pd(3)` (IBVERBS_1.10): frees a PD record from [`ibv_import_pd`] (or any PD
/// record) without destroying the PD. A PD still used by objects of this library is kept
/// (they refer to it); NULL is ignored.
#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_pd(pd: *mut ibv_pd) {
    ffi::guard("ibv_unimport_pd", (), || {
        // SAFETY: `pd` is NULL or a live PD of this library (the verb's contract).
        let Some(rec) = (unsafe { PdRec::from_ibv(pd) }) else {
            return;
        };
        if rec.users() != 0 {
            ffi::trace(format_args!(
                "ibv_unimport_pd: PD {} still has {} users: kept",
                rec.ibv.handle,
                rec.users()
            ));
            return;
        }
        // SAFETY: allocated with `Box::into_raw`; given up by this call, unused (count 0).
        drop(unsafe { Box::from_raw(pd.cast::<PdRec>()) });
    })
}

/// `ibv_dealloc_pd(3)`: frees a protection domain; `EBUSY` while MRs, QPs, SRQs or AHs still
/// use it, `EINVAL` for NULL.
#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    ffi::guard_int("ibv_dealloc_pd", || {
        // SAFETY: `pd` is NULL or a live PD of this library (the verb's contract).
        let rec = unsafe { PdRec::from_ibv(pd) }.ok_or(libc::EINVAL)?;
        if rec.users() != 0 {
            return Err(libc::EBUSY);
        }
        if let Some(m) = lock(&PDS).as_mut() {
            m.remove(&rec.ibv.handle);
        }
        // SAFETY: allocated by `ibv_alloc_pd` with `Box::into_raw`; the application gives it
        // up with this call, and no object of this library refers to it any more (count 0).
        drop(unsafe { Box::from_raw(pd.cast::<PdRec>()) });
        Ok(())
    })
}

/// Real contexts for this crate's tests: `ibv_open_device` on `lo` of a temporary network
/// namespace (127.0.0.1 and 127.0.0.2), UDP engines with their progress threads.
#[cfg(test)]
pub(crate) mod testing {
    use roce_testkit::netns::{netns_or_skip, TempNetns};
    use roce_transport::netdev;

    use crate::context::{ibv_close_device, ibv_open_device};
    use crate::device::{record, DeviceSpec};
    use crate::sys::ibv_context;

    /// A namespace to open contexts in.
    pub(crate) struct Lab {
        ns: TempNetns,
        tag: String,
    }

    impl Lab {
        /// A fresh namespace, or `None` (with the skip policy's line) without netns rights.
        pub(crate) fn new(tag: &str) -> Option<Self> {
            if !netns_or_skip(tag) {
                return None;
            }
            Some(Self {
                ns: TempNetns::create(tag).unwrap(),
                tag: tag.to_string(),
            })
        }

        /// A context on a device bound to 127.0.0.`host` (1 or 2); close it with [`close`].
        pub(crate) fn open(&self, host: u8) -> *mut ibv_context {
            let name = format!("{}_{host}", self.tag);
            let ctx = self
                .ns
                .netns()
                .enter_scoped(|| {
                    let ifaces = netdev::interfaces().unwrap();
                    let spec = DeviceSpec {
                        name,
                        ifname: "lo".into(),
                        addr: Some(format!("127.0.0.{host}").parse().unwrap()),
                    };
                    let rec = record(spec, &ifaces).unwrap();
                    // SAFETY: a device record of this library.
                    unsafe { ibv_open_device(rec.ibv()) as usize }
                })
                .unwrap() as *mut ibv_context;
            assert!(!ctx.is_null());
            ctx
        }
    }

    /// Closes a context from [`Lab::open`] (its objects destroyed first).
    pub(crate) fn close(ctx: *mut ibv_context) {
        // SAFETY: an open context, closed once.
        assert_eq!(unsafe { ibv_close_device(ctx) }, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pd_in_use_cannot_be_deallocated() {
        let Some(lab) = testing::Lab::new("vmpd") else {
            return;
        };
        let ctx = lab.open(1);
        // SAFETY: a live context; the PD is used only while allocated.
        unsafe {
            assert!(ibv_alloc_pd(std::ptr::null_mut()).is_null());
            assert_eq!(*libc::__errno_location(), libc::EINVAL);
            let pd = ibv_alloc_pd(ctx);
            assert!(!pd.is_null());
            assert_eq!((*pd).context, ctx);
            let rec = PdRec::from_ibv(pd).unwrap();
            rec.hold();
            rec.hold();
            assert_eq!(ibv_dealloc_pd(pd), libc::EBUSY);
            rec.release();
            assert_eq!(ibv_dealloc_pd(pd), libc::EBUSY);
            rec.release();
            assert_eq!(ibv_dealloc_pd(pd), 0);
            assert_eq!(ibv_dealloc_pd(std::ptr::null_mut()), libc::EINVAL);
        }
        testing::close(ctx);
    }

    /// ibv_import_device/pd/mr within one process: a dup of `cmd_fd` finds its context, the
    /// handles find the PD and MR of that engine (not of another device's), imports share
    /// the keys, unimport frees only the import, the imported context closes its descriptor.
    #[test]
    fn a_dup_of_cmd_fd_imports_the_context_and_its_pd_and_mr() {
        use crate::context::ibv_import_device;
        use crate::mr::{ibv_dereg_mr, ibv_import_mr, ibv_reg_mr, ibv_unimport_mr};
        let Some(lab) = testing::Lab::new("vmimp") else {
            return;
        };
        let ctx = lab.open(1);
        let other = lab.open(2);
        let errno = || std::io::Error::last_os_error().raw_os_error().unwrap();
        // SAFETY: live contexts; every object is used only while it exists; the buffer
        // outlives the MR.
        unsafe {
            let cmd = (*ctx).cmd_fd;
            assert!(cmd >= 0 && cmd != (*other).cmd_fd);
            let pd = ibv_alloc_pd(ctx);
            let mut buf = vec![0u8; 64];
            let mr = ibv_reg_mr(pd, buf.as_mut_ptr().cast(), 64, 1);
            assert!(!pd.is_null() && !mr.is_null());

            // Not a descriptor; a descriptor of no context.
            assert!(ibv_import_device(-1).is_null());
            assert_eq!(errno(), libc::EBADF);
            let stray = libc::memfd_create(c"stray".as_ptr(), libc::MFD_CLOEXEC);
            assert!(ibv_import_device(stray).is_null());
            assert_eq!(errno(), libc::ENODEV);
            libc::close(stray);

            let dup = libc::dup(cmd);
            let ctx2 = ibv_import_device(dup);
            assert!(!ctx2.is_null() && ctx2 != ctx);
            assert_eq!((*ctx2).cmd_fd, dup);
            assert_eq!((*ctx2).device, (*ctx).device);

            // The other device's engine does not know the handle; a wrong handle is ENOENT.
            assert!(ibv_import_pd(other, (*pd).handle).is_null());
            assert_eq!(errno(), libc::ENOENT);
            assert!(ibv_import_pd(ctx2, u32::MAX).is_null());
            let pd2 = ibv_import_pd(ctx2, (*pd).handle);
            assert!(!pd2.is_null() && pd2 != pd);
            assert_eq!(((*pd2).context, (*pd2).handle), (ctx2, (*pd).handle));

            let mr2 = ibv_import_mr(pd2, (*mr).handle);
            assert!(!mr2.is_null());
            assert!((*mr2).addr.is_null());
            assert_eq!(
                ((*mr2).lkey, (*mr2).rkey, (*mr2).length, (*mr2).pd),
                ((*mr).lkey, (*mr).rkey, 64, pd2)
            );
            assert!(ibv_import_mr(pd2, u32::MAX).is_null());
            // The import holds its PD.
            assert_eq!(ibv_dealloc_pd(pd2), libc::EBUSY);
            ibv_unimport_mr(mr2);
            ibv_unimport_pd(pd2);
            // The originals are untouched by the unimports.
            assert_eq!(PdRec::from_ibv(pd).unwrap().users(), 1);
            let (pd_handle, mr_handle) = ((*pd).handle, (*mr).handle);
            assert_eq!(ibv_dereg_mr(mr), 0);
            // Destroyed objects cannot be imported any more.
            assert!(ibv_import_mr(pd, mr_handle).is_null());
            assert_eq!(errno(), libc::ENOENT);
            assert_eq!(ibv_dealloc_pd(pd), 0);
            assert!(ibv_import_pd(ctx2, pd_handle).is_null());
            testing::close(ctx2);
            // The imported context owned (and closed) the descriptor it was given.
            assert_eq!(libc::fcntl(dup, libc::F_GETFD), -1);
        }
        testing::close(other);
        testing::close(ctx);
    }
}
