//! The key table: protection domains, regions, windows and the access check.
//!
//! Read first: `../shared/spec/rocev2.md` section 10 (keys, access flags, check order) and
//! section 7.9 (which NAK each failure produces); rxe `rxe_mr.c`, `rxe_mw.c`, `rxe_resp.c`
//! `check_rkey`.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::mem::{self, HostPtr, Memory};
use crate::{
    Access, AccessError, BindError, DeregisterError, InvalidateError, Key, MwType, Origin, Pd,
    PdError, RegisterError,
};

/// Largest table index (24 bits); index 0 is never used, so no valid key is 0x0000_00xx.
pub const MAX_CAPACITY: u32 = 0x00FF_FFFF;

/// Device-owned table of memory regions and memory windows, indexed by key.
///
/// Everything hangs off this object: no global state, so a process can run many devices. Share
/// it between queue pairs with an `Arc<MrTable>`; every method takes `&self`.
///
/// # Concurrency
///
/// The table is a fixed array of slots. Each slot has its own `RwLock`; the data path
/// ([`check`](Self::check)) takes only the read lock of the one slot the key indexes, so queue
/// pairs never serialise on a table-wide lock, and lookups are O(1). The returned [`Checked`]
/// holds that read lock until it is dropped. Deregistration, invalidation, fast registration
/// and window (re)binding take the slot's write lock, so they wait until every in-flight access
/// to the object has finished, and no access can start on the old mapping after they return.
/// A control-path `Mutex` guards only the free list and the PD table; it is never held together
/// with a slot lock.
///
/// Do not call a control-path method for an object while the same thread holds a [`Checked`] on
/// it, and do not hold two [`Checked`] of one slot on one thread while another thread may
/// deregister it: the writer waits for the reader and both deadlock, as with any `RwLock`.
/// Check, copy and drop per SGE.
pub struct MrTable {
    slots: Box<[Slot]>,
    ctrl: Mutex<Ctrl>,
}

struct Slot {
    entry: RwLock<Entry>,
    /// Number of memory windows bound to the region in this slot. Incremented under this slot's
    /// read lock, checked under its write lock, decremented without it.
    mw_refs: AtomicU32,
}

struct Entry {
    /// Current 8-bit key; kept while free so that the next registration gets another one.
    key: u8,
    obj: Object,
}

enum Object {
    Free,
    Mr(Mr),
    Mw(Mw),
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum MrKind {
    /// Registered directly (`ibv_reg_mr`): never invalidated or fast-registered.
    User,
    /// Allocated for fast registration (`ib_alloc_mr`): REG_MR and LOCAL_INV apply.
    FastReg,
}

struct Mr {
    pd: Pd,
    kind: MrKind,
    mem: Memory,
    valid: bool,
    /// Offset of the region's first byte in `mem`.
    offset: usize,
    iova: u64,
    len: u64,
    access: Access,
}

struct Mw {
    pd: Pd,
    ty: MwType,
    binding: Option<Binding>,
}

struct Binding {
    mr_index: u32,
    /// Host address of the window's first byte.
    host: HostPtr,
    /// Address a peer uses for the window's first byte: 0 when zero based, else the MR IOVA.
    base: u64,
    len: u64,
    access: Access,
    /// Type 2: the only queue pair that may use the window.
    qpn: Option<u32>,
}

struct Ctrl {
    free: VecDeque<u32>,
    /// PD number -> number of regions and windows in it.
    pds: HashMap<u32, u32>,
    next_pd: u32,
}

/// Parameters of a fast registration (IB_WR_REG_MR) for [`MrTable::fast_reg`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct FastReg {
    /// Byte offset of the region's first byte in the memory allocated by
    /// [`MrTable::alloc_mr`].
    pub offset: usize,
    /// IOVA of the region's first byte (must be 0 with [`Access::ZERO_BASED`]).
    pub iova: u64,
    /// Length of the region; `offset + len` must fit the allocated memory.
    pub len: u64,
    /// Access rights of the region.
    pub access: Access,
}

/// Parameters of a memory-window bind (`ibv_bind_mw` / BIND_MW work request).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct BindMw {
    /// lkey of the region to bind to (ignored when `len` is 0).
    pub mr: Key,
    /// IOVA of the window's first byte, inside the region.
    pub addr: u64,
    /// Length of the window; 0 unbinds a type 1 window.
    pub len: u64,
    /// Remote rights of the window: REMOTE_READ, REMOTE_WRITE, REMOTE_ATOMIC, ZERO_BASED.
    pub access: Access,
    /// The 8-bit key of the window's new rkey (`ibv_inc_rkey` of the old one by convention).
    pub key8: u8,
}

impl MrTable {
    /// A table with room for `capacity` regions and windows together, whose initial 8-bit keys
    /// are drawn from `seed`.
    ///
    /// # Panics
    ///
    /// If `capacity` exceeds [`MAX_CAPACITY`] (keys have 24 index bits).
    pub fn new(capacity: u32, seed: u64) -> Self {
        assert!(
            capacity <= MAX_CAPACITY,
            "capacity {capacity} > {MAX_CAPACITY}"
        );
        let mut rng = SplitMix64(seed);
        let slots = (0..=capacity)
            .map(|_| Slot {
                entry: RwLock::new(Entry {
                    key: rng.next() as u8,
                    obj: Object::Free,
                }),
                mw_refs: AtomicU32::new(0),
            })
            .collect();
        let ctrl = Ctrl {
            free: (1..=capacity).collect(),
            pds: HashMap::new(),
            next_pd: 1,
        };
        Self {
            slots,
            ctrl: Mutex::new(ctrl),
        }
    }

    /// How many regions and windows the table can hold.
    pub fn capacity(&self) -> u32 {
        // INVARIANT: slots.len() = capacity + 1 <= MAX_CAPACITY + 1.
        (self.slots.len() - 1) as u32
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> Pd {
        let mut ctrl = self.ctrl();
        let pd = Pd(ctrl.next_pd);
        ctrl.next_pd = ctrl.next_pd.wrapping_add(1).max(1);
        ctrl.pds.insert(pd.0, 0);
        pd
    }

    /// Deallocates a protection domain that no region or window uses any more.
    ///
    /// # Errors
    ///
    /// [`PdError::UnknownPd`] or [`PdError::Busy`].
    pub fn dealloc_pd(&self, pd: Pd) -> Result<(), PdError> {
        let mut ctrl = self.ctrl();
        match ctrl.pds.get(&pd.0) {
            None => Err(PdError::UnknownPd),
            Some(&0) => {
                ctrl.pds.remove(&pd.0);
                Ok(())
            }
            Some(&users) => Err(PdError::Busy { users }),
        }
    }

    /// Registers `len` zeroed bytes that the table allocates (8-byte aligned) and owns, at
    /// `iova`; returns the lkey (= rkey).
    ///
    /// # Errors
    ///
    /// See [`register`](Self::register).
    pub fn register_zeroed(
        &self,
        pd: Pd,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<Key, RegisterError> {
        validate(iova, len as u64, access)?;
        self.register_memory(pd, Memory::zeroed(len), iova, access)
    }

    /// Registers an application buffer that the table takes and owns, at `iova`; returns the
    /// lkey (= rkey). Atomics need the buffer's host addresses 8-byte aligned; use
    /// [`register_zeroed`](Self::register_zeroed) to get that guarantee.
    ///
    /// The application reads and writes owned memory with [`read`](Self::read) and
    /// [`write`](Self::write). The buffer is dropped on error or at deregistration.
    ///
    /// # Errors
    ///
    /// [`RegisterError::UnknownPd`], [`RegisterError::TableFull`],
    /// [`RegisterError::InvalidAccess`] (unknown bits, or remote write/atomic without local
    /// write), [`RegisterError::ZeroBasedIova`], [`RegisterError::BadRange`] (`iova + len`
    /// overflows).
    pub fn register(
        &self,
        pd: Pd,
        mem: Box<[u8]>,
        iova: u64,
        access: Access,
    ) -> Result<Key, RegisterError> {
        validate(iova, mem.len() as u64, access)?;
        self.register_memory(pd, Memory::from_box(mem), iova, access)
    }

    /// Registers caller memory `ptr .. ptr + len` at `iova`, like `ibv_reg_mr`; returns the
    /// lkey (= rkey). The table never frees it.
    ///
    /// # Safety
    ///
    /// Until [`deregister`](Self::deregister) of the returned key has returned (or the table is
    /// dropped), the memory must stay valid for reads and writes, and the caller must not
    /// access it other than through this table or through atomic operations (peers read and
    /// write it concurrently). After `deregister` returns, the table never touches it again.
    ///
    /// # Errors
    ///
    /// As [`register`](Self::register), plus [`RegisterError::NullPointer`].
    #[allow(unsafe_code)]
    pub unsafe fn register_raw(
        &self,
        pd: Pd,
        ptr: *mut u8,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<Key, RegisterError> {
        validate(iova, len as u64, access)?;
        // SAFETY: forwarded to our caller's contract, which is `Memory::raw`'s.
        let mem = unsafe { Memory::raw(ptr, len) }.ok_or(RegisterError::NullPointer)?;
        self.register_memory(pd, mem, iova, access)
    }

    /// Allocates `capacity` zeroed bytes for a fast-registration region (`ib_alloc_mr`). It
    /// starts invalid; [`fast_reg`](Self::fast_reg) makes it valid, [`invalidate_local`] and
    /// [`invalidate_remote`] invalid again. Returns its key (the index matters, the 8-bit key
    /// is chosen by each fast registration).
    ///
    /// [`invalidate_local`]: Self::invalidate_local
    /// [`invalidate_remote`]: Self::invalidate_remote
    ///
    /// # Errors
    ///
    /// [`RegisterError::UnknownPd`], [`RegisterError::TableFull`].
    pub fn alloc_mr(&self, pd: Pd, capacity: usize) -> Result<Key, RegisterError> {
        let mr = Mr {
            pd,
            kind: MrKind::FastReg,
            mem: Memory::zeroed(capacity),
            valid: false,
            offset: 0,
            iova: 0,
            len: 0,
            access: Access::empty(),
        };
        self.insert(pd, Object::Mr(mr))
    }

    /// Fast registration (IB_WR_REG_MR, rxe `rxe_reg_fast_mr`): makes the invalid region at
    /// `key`'s index valid under the full `key` (new 8-bit key), with a new IOVA, length and
    /// access inside its allocated memory. Executed by queue pair in `pd`.
    ///
    /// # Errors
    ///
    /// [`RegisterError::UnknownKey`], [`RegisterError::PdMismatch`],
    /// [`RegisterError::NotFastReg`], [`RegisterError::StillValid`] (invalidate first), and the
    /// range/access errors of [`register`](Self::register).
    pub fn fast_reg(&self, key: Key, pd: Pd, reg: FastReg) -> Result<(), RegisterError> {
        validate(reg.iova, reg.len, reg.access)?;
        let slot = self.slot(key).ok_or(RegisterError::UnknownKey { key })?;
        let mut entry = write(slot);
        let Object::Mr(mr) = &mut entry.obj else {
            return Err(RegisterError::UnknownKey { key });
        };
        if mr.pd != pd {
            return Err(RegisterError::PdMismatch { key });
        }
        if mr.kind != MrKind::FastReg {
            return Err(RegisterError::NotFastReg { key });
        }
        if mr.valid {
            return Err(RegisterError::StillValid { key });
        }
        let fits = reg
            .offset
            .checked_add(usize::try_from(reg.len).unwrap_or(usize::MAX))
            .is_some_and(|end| end <= mr.mem.len());
        if !fits {
            return Err(RegisterError::BadRange {
                iova: reg.iova,
                len: reg.len,
            });
        }
        mr.offset = reg.offset;
        mr.iova = reg.iova;
        mr.len = reg.len;
        mr.access = reg.access;
        mr.valid = true;
        entry.key = key.key8();
        Ok(())
    }

    /// Deregisters a region (`ibv_dereg_mr`). Waits until every in-flight access to it has
    /// finished; after it returns no access can reach the region's memory, and owned memory is
    /// freed.
    ///
    /// # Errors
    ///
    /// [`DeregisterError::UnknownKey`], [`DeregisterError::StaleKey`],
    /// [`DeregisterError::WrongKind`] (a window), [`DeregisterError::WindowsBound`].
    pub fn deregister(&self, key: Key) -> Result<(), DeregisterError> {
        let slot = self.slot(key).ok_or(DeregisterError::UnknownKey { key })?;
        let mut entry = write(slot);
        match &entry.obj {
            Object::Free => return Err(DeregisterError::UnknownKey { key }),
            Object::Mw(_) => return Err(DeregisterError::WrongKind { key }),
            Object::Mr(_) if entry.key != key.key8() => {
                return Err(DeregisterError::StaleKey { key })
            }
            Object::Mr(_) => {}
        }
        if slot.mw_refs.load(Ordering::Acquire) != 0 {
            return Err(DeregisterError::WindowsBound { key });
        }
        let obj = core::mem::replace(&mut entry.obj, Object::Free);
        drop(entry);
        let Object::Mr(mr) = obj else {
            unreachable!("INVARIANT: matched as Mr above under the same write lock");
        };
        let pd = mr.pd;
        drop(mr);
        self.release(key.index(), pd);
        Ok(())
    }

    /// Allocates an unbound memory window of type `ty` in `pd`; returns its rkey.
    ///
    /// # Errors
    ///
    /// [`RegisterError::UnknownPd`], [`RegisterError::TableFull`].
    pub fn alloc_mw(&self, pd: Pd, ty: MwType) -> Result<Key, RegisterError> {
        self.insert(
            pd,
            Object::Mw(Mw {
                pd,
                ty,
                binding: None,
            }),
        )
    }

    /// Deallocates a memory window, unbinding it first. Waits for in-flight accesses through it.
    ///
    /// # Errors
    ///
    /// [`DeregisterError::UnknownKey`], [`DeregisterError::StaleKey`],
    /// [`DeregisterError::WrongKind`] (a region).
    pub fn dealloc_mw(&self, key: Key) -> Result<(), DeregisterError> {
        let slot = self.slot(key).ok_or(DeregisterError::UnknownKey { key })?;
        let mut entry = write(slot);
        match &entry.obj {
            Object::Free => return Err(DeregisterError::UnknownKey { key }),
            Object::Mr(_) => return Err(DeregisterError::WrongKind { key }),
            Object::Mw(_) if entry.key != key.key8() => {
                return Err(DeregisterError::StaleKey { key })
            }
            Object::Mw(_) => {}
        }
        let obj = core::mem::replace(&mut entry.obj, Object::Free);
        drop(entry);
        let Object::Mw(mw) = obj else {
            unreachable!("INVARIANT: matched as Mw above under the same write lock");
        };
        if let Some(binding) = mw.binding {
            self.unref_mr(binding.mr_index);
        }
        self.release(key.index(), mw.pd);
        Ok(())
    }

    /// Binds (or, type 1 with `len` 0, unbinds) the window `mw` for queue pair `qpn` in `pd`
    /// (rxe `rxe_bind_mw`); returns the window's new rkey. Waits for in-flight accesses through
    /// the old binding.
    ///
    /// # Errors
    ///
    /// Every [`BindError`]; the work request completes with MW_BIND_ERR.
    pub fn bind_mw(&self, mw: Key, pd: Pd, qpn: u32, bind: BindMw) -> Result<Key, BindError> {
        let slot = self.slot(mw).ok_or(BindError::InvalidWindow { key: mw })?;
        if bind.len != 0 && bind.mr.index() == mw.index() {
            return Err(BindError::InvalidRegion { key: bind.mr });
        }
        let mut entry = write(slot);
        let key8 = entry.key;
        let Object::Mw(window) = &mut entry.obj else {
            return Err(BindError::InvalidWindow { key: mw });
        };
        if key8 != mw.key8() {
            return Err(BindError::InvalidWindow { key: mw });
        }
        if window.pd != pd {
            return Err(BindError::PdMismatch);
        }
        if !Access::REMOTE
            .union(Access::ZERO_BASED)
            .contains(bind.access)
        {
            return Err(BindError::InvalidAccess {
                access: bind.access,
            });
        }
        match window.ty {
            MwType::Type1 if bind.access.contains(Access::ZERO_BASED) => {
                return Err(BindError::ZeroBasedType1)
            }
            MwType::Type1 => {}
            MwType::Type2 if window.binding.is_some() => return Err(BindError::AlreadyBound),
            MwType::Type2 if bind.len == 0 => return Err(BindError::ZeroLength),
            MwType::Type2 => {}
        }
        let new = if bind.len == 0 {
            None
        } else {
            let qpn = (window.ty == MwType::Type2).then_some(qpn);
            Some(self.bind_target(window.pd, bind, qpn)?)
        };
        let old = core::mem::replace(&mut window.binding, new);
        entry.key = bind.key8;
        drop(entry);
        if let Some(old) = old {
            self.unref_mr(old.mr_index);
        }
        Ok(mw.with_key8(bind.key8))
    }

    /// LOCAL_INV executed by queue pair `qpn` in `pd`: makes `key` unusable until it is
    /// fast-registered (region) or bound (type 2 window) again. Waits for in-flight accesses.
    ///
    /// # Errors
    ///
    /// Every [`InvalidateError`]; the work request completes with
    /// [`InvalidateError::local_status`].
    pub fn invalidate_local(&self, key: Key, pd: Pd, qpn: u32) -> Result<(), InvalidateError> {
        self.invalidate(key, pd, qpn)
    }

    /// SEND_WITH_INVALIDATE received by queue pair `qpn` in `pd`: invalidates the rkey named
    /// in the IETH, with the rxe rules: a fast-registration region of the same PD with no bound
    /// windows, or a bound type 2 window of the same PD bound to this queue pair. Waits for
    /// in-flight accesses.
    ///
    /// # Errors
    ///
    /// Every [`InvalidateError`]; the responder NAKs with [`InvalidateError::responder_nak`].
    pub fn invalidate_remote(&self, rkey: Key, pd: Pd, qpn: u32) -> Result<(), InvalidateError> {
        self.invalidate(rkey, pd, qpn)
    }

    /// The one access check, for local SGEs (`Origin::Local`, lkey) and remote requests
    /// (`Origin::Remote`, rkey): may the queue pair in `pd` access `[iova, iova + len)` through
    /// `key` with the rights in `needed`? On success the returned [`Checked`] holds the
    /// translated host address and keeps the mapping alive until it is dropped.
    ///
    /// `needed` is what the operation needs: empty for a local gather (send source), LOCAL_WRITE
    /// for a local scatter (receive, READ destination, atomic result), REMOTE_WRITE,
    /// REMOTE_READ or REMOTE_ATOMIC for remote requests.
    ///
    /// Check order (rxe `check_rkey`, spec section 10): atomic length, key index, key, PD,
    /// window QP binding, valid, rights, range, atomic alignment.
    ///
    /// # Zero-length accesses
    ///
    /// A zero-length access that is not an atomic skips the key check entirely and succeeds
    /// with an empty [`Checked`] (rxe: zero-length READ/WRITE in `check_rkey`, zero-length SGEs
    /// in `copy_data`). So a zero-length RDMA WRITE or READ with any rkey succeeds, and nothing
    /// can be copied through its result.
    ///
    /// # Errors
    ///
    /// Every [`AccessError`] variant, each mapped to a NAK and a completion status.
    pub fn check(
        &self,
        origin: Origin,
        key: Key,
        pd: Pd,
        iova: u64,
        len: u64,
        needed: Access,
    ) -> Result<Checked<'_>, AccessError> {
        let atomic = needed.contains(Access::REMOTE_ATOMIC);
        if len == 0 && !atomic {
            return Ok(Checked {
                _guard: None,
                host: None,
                len: 0,
                origin,
                needed,
            });
        }
        if atomic && len != 8 {
            return Err(AccessError::AtomicLength { len });
        }
        let slot = self.slot(key).ok_or(AccessError::UnknownKey { key })?;
        let guard = slot.entry.read().unwrap_or_else(PoisonError::into_inner);
        let host = match &guard.obj {
            Object::Free => return Err(AccessError::UnknownKey { key }),
            _ if guard.key != key.key8() => return Err(AccessError::StaleKey { key }),
            Object::Mr(mr) => mr.translate(key, pd, iova, len, needed)?,
            Object::Mw(mw) => mw.translate(origin, key, pd, iova, len, needed)?,
        };
        if atomic && (iova % 8 != 0 || host.addr() % 8 != 0) {
            return Err(AccessError::Misaligned { iova });
        }
        Ok(Checked {
            _guard: Some(guard),
            host: Some(host),
            len,
            origin,
            needed,
        })
    }

    /// The application reads its own region's memory: `dst.len()` bytes at byte `offset` of the
    /// memory the region was registered over (for a fast-registration region, of its allocated
    /// memory), whatever the region's access rights or validity.
    ///
    /// # Errors
    ///
    /// [`AccessError::UnknownKey`], [`AccessError::StaleKey`] (also for a window key),
    /// [`AccessError::OutOfBounds`].
    pub fn read(&self, key: Key, offset: usize, dst: &mut [u8]) -> Result<(), AccessError> {
        let (_guard, host) = self.own_memory(key, offset, dst.len())?;
        // SAFETY: `own_memory` checked `offset + dst.len()` against the memory length, and
        // `_guard` (the slot read lock) keeps the memory alive; all accesses are atomic.
        #[allow(unsafe_code)]
        unsafe {
            mem::load(host.as_ptr(), dst);
        }
        Ok(())
    }

    /// The application writes its own region's memory; see [`read`](Self::read).
    ///
    /// # Errors
    ///
    /// As [`read`](Self::read).
    pub fn write(&self, key: Key, offset: usize, src: &[u8]) -> Result<(), AccessError> {
        let (_guard, host) = self.own_memory(key, offset, src.len())?;
        // SAFETY: as in `read`.
        #[allow(unsafe_code)]
        unsafe {
            mem::store(host.as_ptr(), src);
        }
        Ok(())
    }

    fn own_memory(
        &self,
        key: Key,
        offset: usize,
        len: usize,
    ) -> Result<(RwLockReadGuard<'_, Entry>, HostPtr), AccessError> {
        let slot = self.slot(key).ok_or(AccessError::UnknownKey { key })?;
        let guard = slot.entry.read().unwrap_or_else(PoisonError::into_inner);
        let host = match &guard.obj {
            Object::Free => return Err(AccessError::UnknownKey { key }),
            Object::Mw(_) => return Err(AccessError::StaleKey { key }),
            Object::Mr(_) if guard.key != key.key8() => return Err(AccessError::StaleKey { key }),
            Object::Mr(mr) => {
                if offset.checked_add(len).is_none_or(|end| end > mr.mem.len()) {
                    return Err(AccessError::OutOfBounds {
                        iova: offset as u64,
                        len: len as u64,
                    });
                }
                mr.mem.base().offset(offset)
            }
        };
        Ok((guard, host))
    }

    fn invalidate(&self, key: Key, pd: Pd, qpn: u32) -> Result<(), InvalidateError> {
        let slot = self.slot(key).ok_or(InvalidateError::UnknownKey { key })?;
        let mut entry = write(slot);
        let key8 = entry.key;
        let unbound = match &mut entry.obj {
            Object::Free => return Err(InvalidateError::UnknownKey { key }),
            _ if key8 != key.key8() => return Err(InvalidateError::StaleKey { key }),
            Object::Mr(mr) => {
                if mr.pd != pd {
                    return Err(InvalidateError::PdMismatch { key });
                }
                if mr.kind != MrKind::FastReg {
                    return Err(InvalidateError::NotFastReg { key });
                }
                if !mr.valid {
                    return Err(InvalidateError::AlreadyInvalid { key });
                }
                if slot.mw_refs.load(Ordering::Acquire) != 0 {
                    return Err(InvalidateError::WindowsBound { key });
                }
                mr.valid = false;
                None
            }
            Object::Mw(mw) => {
                if mw.pd != pd {
                    return Err(InvalidateError::PdMismatch { key });
                }
                if mw.ty == MwType::Type1 {
                    return Err(InvalidateError::Type1Window { key });
                }
                let Some(binding) = &mw.binding else {
                    return Err(InvalidateError::AlreadyInvalid { key });
                };
                if binding.qpn != Some(qpn) {
                    return Err(InvalidateError::QpMismatch { key });
                }
                mw.binding.take()
            }
        };
        drop(entry);
        if let Some(binding) = unbound {
            self.unref_mr(binding.mr_index);
        }
        Ok(())
    }

    /// Validates `bind` against its region and counts the new window on it.
    fn bind_target(&self, pd: Pd, bind: BindMw, qpn: Option<u32>) -> Result<Binding, BindError> {
        let invalid = BindError::InvalidRegion { key: bind.mr };
        let slot = self.slot(bind.mr).ok_or(invalid)?;
        let entry = slot.entry.read().unwrap_or_else(PoisonError::into_inner);
        let Object::Mr(mr) = &entry.obj else {
            return Err(invalid);
        };
        if entry.key != bind.mr.key8() {
            return Err(invalid);
        }
        if mr.pd != pd {
            return Err(BindError::PdMismatch);
        }
        if !mr.valid {
            return Err(BindError::RegionInvalidated { key: bind.mr });
        }
        if mr.access.contains(Access::ZERO_BASED) {
            return Err(BindError::RegionZeroBased);
        }
        if !mr.access.contains(Access::MW_BIND) {
            return Err(BindError::NoBindAccess);
        }
        if bind
            .access
            .intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC)
            && !mr.access.contains(Access::LOCAL_WRITE)
        {
            return Err(BindError::NeedsLocalWrite);
        }
        // Stricter than rxe for zero-based windows: the window must lie inside the region at
        // `addr` in both cases, rxe only compares lengths.
        let inside = bind.addr >= mr.iova
            && bind
                .addr
                .checked_add(bind.len)
                .is_some_and(|end| end <= mr.iova + mr.len);
        if !inside {
            return Err(BindError::OutOfBounds {
                addr: bind.addr,
                len: bind.len,
            });
        }
        // INVARIANT: inside the region, so the offset fits in usize (region length is a usize).
        let host = mr.host(bind.addr);
        // Under this slot's read lock: `deregister`/`invalidate` check the count under the
        // write lock, so they either see this window or ran before the validity check above.
        slot.mw_refs.fetch_add(1, Ordering::AcqRel);
        let base = if bind.access.contains(Access::ZERO_BASED) {
            0
        } else {
            bind.addr
        };
        Ok(Binding {
            mr_index: bind.mr.index(),
            host,
            base,
            len: bind.len,
            access: bind.access,
            qpn,
        })
    }

    fn unref_mr(&self, index: u32) {
        if let Some(slot) = self.slots.get(index as usize) {
            let before = slot.mw_refs.fetch_sub(1, Ordering::AcqRel);
            debug_assert!(before > 0, "window count underflow at index {index}");
        }
    }

    fn register_memory(
        &self,
        pd: Pd,
        mem: Memory,
        iova: u64,
        access: Access,
    ) -> Result<Key, RegisterError> {
        let len = mem.len() as u64;
        let mr = Mr {
            pd,
            kind: MrKind::User,
            mem,
            valid: true,
            offset: 0,
            iova,
            len,
            access,
        };
        self.insert(pd, Object::Mr(mr))
    }

    /// Puts `obj` in a free slot under a fresh 8-bit key.
    fn insert(&self, pd: Pd, obj: Object) -> Result<Key, RegisterError> {
        let index = {
            let mut guard = self.ctrl();
            let ctrl = &mut *guard;
            let users = ctrl.pds.get_mut(&pd.0).ok_or(RegisterError::UnknownPd)?;
            let index = ctrl.free.pop_front().ok_or(RegisterError::TableFull)?;
            *users += 1;
            index
        };
        let mut entry = write(&self.slots[index as usize]);
        debug_assert!(
            matches!(entry.obj, Object::Free),
            "free list names a used slot"
        );
        // The key changes on every reuse of the index; with the FIFO free list an index comes
        // back only after every other free index, and its key repeats only after 256 reuses.
        entry.key = entry.key.wrapping_add(1);
        entry.obj = obj;
        Ok(Key::new(index, entry.key))
    }

    /// Returns a freed index to the free list and drops its PD reference.
    fn release(&self, index: u32, pd: Pd) {
        let mut ctrl = self.ctrl();
        ctrl.free.push_back(index);
        if let Some(users) = ctrl.pds.get_mut(&pd.0) {
            *users -= 1;
        }
    }

    fn slot(&self, key: Key) -> Option<&Slot> {
        match key.index() {
            0 => None,
            i => self.slots.get(i as usize),
        }
    }

    fn ctrl(&self) -> MutexGuard<'_, Ctrl> {
        self.ctrl.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl fmt::Debug for MrTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ctrl = self.ctrl();
        f.debug_struct("MrTable")
            .field("capacity", &self.capacity())
            .field("free", &ctrl.free.len())
            .field("pds", &ctrl.pds.len())
            .finish()
    }
}

impl Mr {
    fn translate(
        &self,
        key: Key,
        pd: Pd,
        iova: u64,
        len: u64,
        needed: Access,
    ) -> Result<HostPtr, AccessError> {
        if self.pd != pd {
            return Err(AccessError::PdMismatch { key });
        }
        if !self.valid {
            return Err(AccessError::Invalidated { key });
        }
        if !self.access.contains(needed) {
            return Err(AccessError::AccessDenied {
                needed,
                granted: self.access,
            });
        }
        let inside = iova >= self.iova
            && iova
                .checked_add(len)
                .is_some_and(|end| end <= self.iova + self.len);
        if !inside {
            return Err(AccessError::OutOfBounds { iova, len });
        }
        Ok(self.host(iova))
    }

    /// Host address of `iova`, which the caller checked is inside the region.
    fn host(&self, iova: u64) -> HostPtr {
        // INVARIANT: iova - self.iova < self.len <= mem.len() - offset, a usize.
        self.mem
            .base()
            .offset(self.offset + (iova - self.iova) as usize)
    }
}

impl Mw {
    fn translate(
        &self,
        origin: Origin,
        key: Key,
        pd: Pd,
        iova: u64,
        len: u64,
        needed: Access,
    ) -> Result<HostPtr, AccessError> {
        let Origin::Remote { qpn } = origin else {
            return Err(AccessError::WindowAsLocalKey { key });
        };
        if self.pd != pd {
            return Err(AccessError::PdMismatch { key });
        }
        let Some(b) = &self.binding else {
            return Err(AccessError::Invalidated { key });
        };
        if b.qpn.is_some_and(|bound| bound != qpn) {
            return Err(AccessError::QpMismatch { key });
        }
        if !b.access.contains(needed) {
            return Err(AccessError::AccessDenied {
                needed,
                granted: b.access,
            });
        }
        let inside = iova >= b.base
            && iova
                .checked_add(len)
                .is_some_and(|end| end <= b.base + b.len);
        if !inside {
            return Err(AccessError::OutOfBounds { iova, len });
        }
        // INVARIANT: iova - base < len, and the window lies inside its region's memory.
        Ok(b.host.offset((iova - b.base) as usize))
    }
}

/// Registration-time validation shared by all registrations.
fn validate(iova: u64, len: u64, access: Access) -> Result<(), RegisterError> {
    if Access::from_bits(access.bits()).is_none() || !access.is_consistent() {
        return Err(RegisterError::InvalidAccess { access });
    }
    if access.contains(Access::ZERO_BASED) && iova != 0 {
        return Err(RegisterError::ZeroBasedIova { iova });
    }
    if iova.checked_add(len).is_none() {
        return Err(RegisterError::BadRange { iova, len });
    }
    Ok(())
}

fn write(slot: &Slot) -> RwLockWriteGuard<'_, Entry> {
    slot.entry.write().unwrap_or_else(PoisonError::into_inner)
}

/// A checked, translated access: the result of [`MrTable::check`].
///
/// It holds the slot's read lock, so the mapping cannot be deregistered, invalidated, re-bound
/// or fast-registered while it lives; drop it as soon as the copy or atomic is done. All
/// operations are relative to the checked range `[iova, iova + len)` and allocate nothing.
///
/// The operations allowed follow the rights checked: [`write`](Self::write) needs LOCAL_WRITE
/// or REMOTE_WRITE, [`read`](Self::read) needs a local origin or REMOTE_READ, the atomics need
/// REMOTE_ATOMIC. Anything else is [`AccessError::AccessDenied`], so a READ check can never be
/// turned into a write.
pub struct Checked<'a> {
    _guard: Option<RwLockReadGuard<'a, Entry>>,
    host: Option<HostPtr>,
    len: u64,
    origin: Origin,
    needed: Access,
}

impl Checked<'_> {
    /// Length of the checked range.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the checked range is empty (a zero-length access).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Scatter: copies `src` to `offset` bytes into the checked range (incoming WRITE or SEND
    /// payload, READ response data).
    ///
    /// # Errors
    ///
    /// [`AccessError::AccessDenied`] if not checked for writing, [`AccessError::OutOfBounds`]
    /// if `offset + src.len()` exceeds the checked length.
    pub fn write(&self, offset: u64, src: &[u8]) -> Result<(), AccessError> {
        let writable = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        if !self.needed.intersects(writable) {
            return Err(AccessError::AccessDenied {
                needed: writable,
                granted: self.needed,
            });
        }
        let Some(host) = self.at(offset, src.len())? else {
            return Ok(());
        };
        // SAFETY: `at` checked the range against the checked length, which `check` verified is
        // inside the region; the slot read lock held by `self` keeps the memory registered and
        // alive; every access to region memory is atomic.
        #[allow(unsafe_code)]
        unsafe {
            mem::store(host.as_ptr(), src);
        }
        Ok(())
    }

    /// Gather: copies `dst.len()` bytes from `offset` bytes into the checked range (outgoing
    /// SEND or WRITE payload, READ response).
    ///
    /// # Errors
    ///
    /// [`AccessError::AccessDenied`] if a remote check did not include REMOTE_READ,
    /// [`AccessError::OutOfBounds`] if `offset + dst.len()` exceeds the checked length.
    pub fn read(&self, offset: u64, dst: &mut [u8]) -> Result<(), AccessError> {
        if matches!(self.origin, Origin::Remote { .. })
            && !self.needed.contains(Access::REMOTE_READ)
        {
            return Err(AccessError::AccessDenied {
                needed: Access::REMOTE_READ,
                granted: self.needed,
            });
        }
        let Some(host) = self.at(offset, dst.len())? else {
            return Ok(());
        };
        // SAFETY: as in `write`.
        #[allow(unsafe_code)]
        unsafe {
            mem::load(host.as_ptr(), dst);
        }
        Ok(())
    }

    /// Atomic compare-and-swap on the checked 8-byte word (host byte order): stores `swap` if
    /// the word equals `compare`; returns the original value either way.
    ///
    /// # Errors
    ///
    /// [`AccessError::AccessDenied`] if not checked with REMOTE_ATOMIC.
    pub fn compare_swap(&self, compare: u64, swap: u64) -> Result<u64, AccessError> {
        let word = self.word()?;
        Ok(
            match word.compare_exchange(compare, swap, Ordering::AcqRel, Ordering::Acquire) {
                Ok(v) | Err(v) => v,
            },
        )
    }

    /// Atomic fetch-and-add (wrapping) on the checked 8-byte word (host byte order); returns
    /// the original value.
    ///
    /// # Errors
    ///
    /// [`AccessError::AccessDenied`] if not checked with REMOTE_ATOMIC.
    pub fn fetch_add(&self, add: u64) -> Result<u64, AccessError> {
        Ok(self.word()?.fetch_add(add, Ordering::AcqRel))
    }

    fn word(&self) -> Result<&core::sync::atomic::AtomicU64, AccessError> {
        let host = match self.host {
            Some(host) if self.needed.contains(Access::REMOTE_ATOMIC) => host,
            _ => {
                return Err(AccessError::AccessDenied {
                    needed: Access::REMOTE_ATOMIC,
                    granted: self.needed,
                })
            }
        };
        // SAFETY: `check` verified the 8 bytes are inside the region and the host address is
        // 8-byte aligned; the slot read lock held by `self` (which the returned borrow cannot
        // outlive) keeps the memory alive; every access to region memory is atomic.
        #[allow(unsafe_code)]
        let word = unsafe { mem::word(host.as_ptr()) };
        Ok(word)
    }

    /// Host pointer for `[offset, offset + n)` of the checked range; `None` when `n` is 0.
    fn at(&self, offset: u64, n: usize) -> Result<Option<HostPtr>, AccessError> {
        let fits = offset
            .checked_add(n as u64)
            .is_some_and(|end| end <= self.len);
        if !fits {
            return Err(AccessError::OutOfBounds {
                iova: offset,
                len: n as u64,
            });
        }
        match self.host {
            Some(host) if n > 0 => Ok(Some(host.offset(offset as usize))),
            _ => Ok(None),
        }
    }
}

impl fmt::Debug for Checked<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checked")
            .field("len", &self.len)
            .field("origin", &self.origin)
            .field("needed", &self.needed)
            .finish_non_exhaustive()
    }
}

/// splitmix64 (Steele, Lea, Flood 2014): seeds the initial 8-bit keys.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}
