//! The key table: protection domains, regions, windows and the access check.
//!
//! Read first: `../shared/spec/rocev2.md` section 10 (keys, access flags, check order) and
//! section 7.9 (which NAK each failure produces); rxe `rxe_mr.c`, `rxe_mw.c`, `rxe_resp.c`
//! `check_rkey`.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use rand::rngs::ChaCha8Rng;
use rand::{Rng as _, RngExt as _, SeedableRng as _};
use roce_wire::Qpn;

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
    /// Counts the slot write locks taken (every change to a region or window takes one): a
    /// [`MrTable::regions`] snapshot is reused while it is unchanged.
    generation: AtomicU64,
    /// The last [`MrTable::regions`] snapshot and the generation it was taken at.
    regions_cache: Mutex<Option<(u64, Vec<RegionInfo>)>>,
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
    qpn: Option<Qpn>,
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

/// A registered region as [`MrTable::regions`] lists it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct RegionInfo {
    /// Its key (lkey and rkey are the same number).
    pub key: Key,
    /// Its protection domain.
    pub pd: Pd,
    /// IOVA of its first byte.
    pub iova: u64,
    /// Its length.
    pub len: u64,
    /// Its access rights.
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
        // The initial 8-bit keys and free-list order, from the table's seed (the device seeds
        // it from the OS RNG unless a test asks for a seed); ChaCha8, the generator the
        // simulator uses too (`roce_qp::fault::SimRng`).
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let slots = (0..=capacity)
            .map(|_| Slot {
                entry: RwLock::new(Entry {
                    key: rng.next_u64() as u8,
                    obj: Object::Free,
                }),
                mw_refs: AtomicU32::new(0),
            })
            .collect();
        // The free list starts in a seeded random order, so a region's index (the upper 24
        // bits of its keys) is as hard to guess as its 8-bit key: with an OS-random seed an
        // off-path peer cannot predict rkeys (ReDMArk, USENIX Security 2021).
        let mut free: Vec<u32> = (1..=capacity).collect();
        for i in (1..free.len()).rev() {
            let j = rng.random_range(0..=i);
            free.swap(i, j);
        }
        let ctrl = Ctrl {
            free: free.into(),
            pds: HashMap::new(),
            next_pd: 1,
        };
        Self {
            slots,
            ctrl: Mutex::new(ctrl),
            generation: AtomicU64::new(0),
            regions_cache: Mutex::new(None),
        }
    }

    /// Every valid memory region, in key-index order: a snapshot for views and diagnostics
    /// (`rocectl res show mr`). Windows are not listed.
    ///
    /// Walking every slot costs ~1 ms at the default capacity, so the snapshot is kept and
    /// reused until a region or window changes (the daemon client reports twice a second).
    pub fn regions(&self) -> Vec<RegionInfo> {
        let mut cache = self
            .regions_cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Read before the walk: a change during the walk bumps it, and the next call walks.
        let generation = self.generation.load(Ordering::Acquire);
        if let Some((g, regions)) = cache.as_ref() {
            if *g == generation {
                return regions.clone();
            }
        }
        let regions = self.walk_regions();
        *cache = Some((generation, regions.clone()));
        regions
    }

    fn walk_regions(&self) -> Vec<RegionInfo> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(index, slot)| {
                let entry = slot.entry.read().unwrap_or_else(PoisonError::into_inner);
                match &entry.obj {
                    Object::Mr(m) if m.valid => Some(RegionInfo {
                        // INVARIANT: slots.len() <= MAX_CAPACITY + 1 < 2^24.
                        key: Key::new(u32::try_from(index).unwrap_or(u32::MAX), entry.key),
                        pd: m.pd,
                        iova: m.iova,
                        len: m.len,
                        access: m.access,
                    }),
                    _ => None,
                }
            })
            .collect()
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
    /// One breach is survived on Linux x86_64, because programs written for NICs commit it:
    /// memory unmapped while registered (a NIC writes the pinned pages). Accesses to it fail
    /// with [`AccessError::Unmapped`] instead of faulting; this call installs the signal
    /// handler that makes that so (`guard` module).
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
        #[cfg(all(target_arch = "x86_64", target_os = "linux", not(miri)))]
        crate::guard::ensure_installed();
        self.register_memory(pd, mem, iova, access)
    }

    /// Re-registers the region `key` (`ibv_rereg_mr`) over caller memory `ptr .. ptr + len`
    /// at `iova`, in `pd`, with `access`, keeping its lkey and rkey (as rxe and mlx5 do, so
    /// keys already given to peers stay valid). Like [`deregister`](Self::deregister), it
    /// waits until every in-flight access to the old mapping has finished; after it returns
    /// only the new mapping is reachable, and the old memory is released as at
    /// deregistration (freed if the table owned it). On error nothing changed.
    ///
    /// # Safety
    ///
    /// As [`register_raw`](Self::register_raw), for the new memory.
    ///
    /// # Errors
    ///
    /// The checks of [`register_raw`](Self::register_raw); [`RegisterError::UnknownKey`] (no
    /// region at the key, a stale key, a window, a fast-registration region);
    /// [`RegisterError::WindowsBound`].
    #[allow(unsafe_code)]
    pub unsafe fn reregister_raw(
        &self,
        key: Key,
        pd: Pd,
        ptr: *mut u8,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<(), RegisterError> {
        validate(iova, len as u64, access)?;
        // SAFETY: forwarded to our caller's contract, which is `Memory::raw`'s.
        let mem = unsafe { Memory::raw(ptr, len) }.ok_or(RegisterError::NullPointer)?;
        #[cfg(all(target_arch = "x86_64", target_os = "linux", not(miri)))]
        crate::guard::ensure_installed();
        // The new PD is counted before the swap and the old one released after it: the
        // control lock is never held with a slot lock.
        self.hold_pd(pd)?;
        match self.replace_user_mr(key, pd, mem, iova, access) {
            Ok(old) => {
                let old_pd = old.pd;
                drop(old);
                self.unhold_pd(old_pd);
                Ok(())
            }
            Err(e) => {
                self.unhold_pd(pd);
                Err(e)
            }
        }
    }

    /// Swaps the user region at `key` for a new mapping under the slot's write lock; returns
    /// the old region.
    fn replace_user_mr(
        &self,
        key: Key,
        pd: Pd,
        mem: Memory,
        iova: u64,
        access: Access,
    ) -> Result<Mr, RegisterError> {
        let slot = self.slot(key).ok_or(RegisterError::UnknownKey { key })?;
        let mut entry = self.lock_for_change(slot);
        let stale = entry.key != key.key8();
        let Object::Mr(mr) = &mut entry.obj else {
            return Err(RegisterError::UnknownKey { key });
        };
        if stale || mr.kind != MrKind::User {
            return Err(RegisterError::UnknownKey { key });
        }
        if slot.mw_refs.load(Ordering::Acquire) != 0 {
            return Err(RegisterError::WindowsBound { key });
        }
        let len = mem.len() as u64;
        let new = Mr {
            pd,
            kind: MrKind::User,
            mem,
            valid: true,
            offset: 0,
            iova,
            len,
            access,
        };
        Ok(core::mem::replace(mr, new))
    }

    /// Counts one more object in `pd`.
    fn hold_pd(&self, pd: Pd) -> Result<(), RegisterError> {
        let mut ctrl = self.ctrl();
        *ctrl.pds.get_mut(&pd.0).ok_or(RegisterError::UnknownPd)? += 1;
        Ok(())
    }

    /// Undoes [`Self::hold_pd`].
    fn unhold_pd(&self, pd: Pd) {
        if let Some(users) = self.ctrl().pds.get_mut(&pd.0) {
            *users -= 1;
        }
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
        let mut entry = self.lock_for_change(slot);
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
        let mut entry = self.lock_for_change(slot);
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
        let mut entry = self.lock_for_change(slot);
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
    pub fn bind_mw(&self, mw: Key, pd: Pd, qpn: Qpn, bind: BindMw) -> Result<Key, BindError> {
        let slot = self.slot(mw).ok_or(BindError::InvalidWindow { key: mw })?;
        if bind.len != 0 && bind.mr.index() == mw.index() {
            return Err(BindError::InvalidRegion { key: bind.mr });
        }
        let mut entry = self.lock_for_change(slot);
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
    /// LOC_QP_OP_ERR.
    pub fn invalidate_local(&self, key: Key, pd: Pd, qpn: Qpn) -> Result<(), InvalidateError> {
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
    pub fn invalidate_remote(&self, rkey: Key, pd: Pd, qpn: Qpn) -> Result<(), InvalidateError> {
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
        unsafe { mem::load(host.as_ptr(), dst) }.map_err(|_| AccessError::Unmapped)
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
        unsafe { mem::store(host.as_ptr(), src) }.map_err(|_| AccessError::Unmapped)
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

    fn invalidate(&self, key: Key, pd: Pd, qpn: Qpn) -> Result<(), InvalidateError> {
        let slot = self.slot(key).ok_or(InvalidateError::UnknownKey { key })?;
        let mut entry = self.lock_for_change(slot);
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
    fn bind_target(&self, pd: Pd, bind: BindMw, qpn: Option<Qpn>) -> Result<Binding, BindError> {
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
        let mut entry = self.lock_for_change(&self.slots[index as usize]);
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

impl MrTable {
    /// The write lock of `slot`, for a change: counts a generation ([`MrTable::regions`]).
    fn lock_for_change<'a>(&self, slot: &'a Slot) -> RwLockWriteGuard<'a, Entry> {
        let guard = slot.entry.write().unwrap_or_else(PoisonError::into_inner);
        // Under the lock, so a snapshot taken after it was released sees the new generation.
        self.generation.fetch_add(1, Ordering::AcqRel);
        guard
    }
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
    /// if `offset + src.len()` exceeds the checked length, [`AccessError::Unmapped`] if the
    /// memory is no longer mapped.
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
        // inside the region; the slot read lock held by `self` keeps the region registered, and
        // its memory valid unless the application broke `register_raw`'s contract by unmapping
        // it, which the store survives on Linux x86_64; every access to region memory is
        // atomic.
        #[allow(unsafe_code)]
        unsafe { mem::store(host.as_ptr(), src) }.map_err(|_| AccessError::Unmapped)
    }

    /// Gather: copies `dst.len()` bytes from `offset` bytes into the checked range (outgoing
    /// SEND or WRITE payload, READ response).
    ///
    /// # Errors
    ///
    /// [`AccessError::AccessDenied`] if a remote check did not include REMOTE_READ,
    /// [`AccessError::OutOfBounds`] if `offset + dst.len()` exceeds the checked length,
    /// [`AccessError::Unmapped`] if the memory is no longer mapped.
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
        unsafe { mem::load(host.as_ptr(), dst) }.map_err(|_| AccessError::Unmapped)
    }

    /// Atomic compare-and-swap on the checked 8-byte word (host byte order): stores `swap` if
    /// the word equals `compare`; returns the original value either way.
    ///
    /// # Errors
    ///
    /// [`AccessError::AccessDenied`] if not checked with REMOTE_ATOMIC,
    /// [`AccessError::Unmapped`] if the word is no longer mapped.
    pub fn compare_swap(&self, compare: u64, swap: u64) -> Result<u64, AccessError> {
        let host = self.word()?;
        // SAFETY: `word` checked that the 8 bytes are inside the region and 8-byte aligned;
        // the slot read lock held by `self` keeps the region registered; every access to
        // region memory is atomic (memory unmapped under the registration is a recovered fault
        // on Linux x86_64).
        #[allow(unsafe_code)]
        unsafe { mem::compare_swap(host.as_ptr(), compare, swap) }
            .map_err(|_| AccessError::Unmapped)
    }

    /// Atomic fetch-and-add (wrapping) on the checked 8-byte word (host byte order); returns
    /// the original value.
    ///
    /// # Errors
    ///
    /// [`AccessError::AccessDenied`] if not checked with REMOTE_ATOMIC,
    /// [`AccessError::Unmapped`] if the word is no longer mapped.
    pub fn fetch_add(&self, add: u64) -> Result<u64, AccessError> {
        let host = self.word()?;
        // SAFETY: as in `compare_swap`.
        #[allow(unsafe_code)]
        unsafe { mem::fetch_add(host.as_ptr(), add) }.map_err(|_| AccessError::Unmapped)
    }

    /// The checked word's host address, if checked for an atomic.
    fn word(&self) -> Result<HostPtr, AccessError> {
        match self.host {
            Some(host) if self.needed.contains(Access::REMOTE_ATOMIC) => Ok(host),
            _ => Err(AccessError::AccessDenied {
                needed: Access::REMOTE_ATOMIC,
                granted: self.needed,
            }),
        }
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

#[cfg(test)]
mod tests {
    use roce_wire::aeth::NakCode;

    use super::*;

    const RW: Access = Access::LOCAL_WRITE
        .union(Access::REMOTE_WRITE)
        .union(Access::REMOTE_READ);
    const ALL_REMOTE: Access = RW.union(Access::REMOTE_ATOMIC);
    const BIND: Access = ALL_REMOTE.union(Access::MW_BIND);
    const REMOTE: Origin = Origin::Remote { qpn: Qpn::new(7) };

    fn table() -> (MrTable, Pd) {
        let t = MrTable::new(16, 42);
        let pd = t.alloc_pd();
        (t, pd)
    }

    fn err(r: Result<Checked<'_>, AccessError>) -> AccessError {
        r.expect_err("access must fail")
    }

    #[test]
    fn regions_lists_the_valid_regions_with_their_keys() {
        let (t, pd) = table();
        let a = t.register_zeroed(pd, 100, 0x1000, RW).unwrap();
        let b = t
            .register_zeroed(pd, 8, 0x9000, Access::LOCAL_WRITE)
            .unwrap();
        let w = t.alloc_mw(pd, MwType::Type2).unwrap();
        let list = t.regions();
        assert_eq!(list.len(), 2, "{list:?}");
        assert!(list.windows(2).all(|p| p[0].key.index() < p[1].key.index()));
        let of = |k: Key| *list.iter().find(|r| r.key == k).expect("listed");
        assert_eq!(
            of(a),
            RegionInfo {
                key: a,
                pd,
                iova: 0x1000,
                len: 100,
                access: RW
            }
        );
        assert_eq!((of(b).iova, of(b).len), (0x9000, 8));
        assert!(list.iter().all(|r| r.key != w));
        t.deregister(a).unwrap();
        assert_eq!(t.regions().iter().map(|r| r.key).collect::<Vec<_>>(), [b]);
        // The snapshot is reused only while nothing changes: each change shows at once.
        assert_eq!(t.regions(), t.regions());
        let c = t.register_zeroed(pd, 16, 0x2000, RW).unwrap();
        let keys = |t: &MrTable| {
            let mut k: Vec<Key> = t.regions().iter().map(|r| r.key).collect();
            k.sort_by_key(|k| k.0);
            k
        };
        let mut want = vec![b, c];
        want.sort_by_key(|k| k.0);
        assert_eq!(keys(&t), want);
        t.deregister(b).unwrap();
        t.deregister(c).unwrap();
        assert!(t.regions().is_empty());
    }

    #[test]
    fn send_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<MrTable>();
        assert_send_sync::<std::sync::Arc<MrTable>>();
    }

    #[test]
    fn registration_access_rules() {
        let (t, pd) = table();
        for bad in [
            Access::REMOTE_WRITE,
            Access::REMOTE_ATOMIC,
            Access::REMOTE_WRITE | Access::REMOTE_READ,
        ] {
            assert_eq!(
                t.register_zeroed(pd, 8, 0, bad),
                Err(RegisterError::InvalidAccess { access: bad })
            );
        }
        let unknown = Access::from_bits(0x3F).unwrap() | Access::empty();
        assert!(t.register_zeroed(pd, 8, 0, unknown).is_ok());
        assert_eq!(
            t.register_zeroed(pd, 8, 4, Access::ZERO_BASED),
            Err(RegisterError::ZeroBasedIova { iova: 4 })
        );
        assert_eq!(
            t.register_zeroed(pd, 16, u64::MAX - 8, Access::empty()),
            Err(RegisterError::BadRange {
                iova: u64::MAX - 8,
                len: 16
            })
        );
        let other = Pd(999);
        assert_eq!(
            t.register_zeroed(other, 8, 0, Access::empty()),
            Err(RegisterError::UnknownPd)
        );
        // SAFETY: a null pointer is rejected before it is stored.
        #[allow(unsafe_code)]
        let raw = unsafe { t.register_raw(pd, core::ptr::null_mut(), 8, 0, Access::empty()) };
        assert_eq!(raw, Err(RegisterError::NullPointer));
    }

    #[test]
    fn table_full() {
        let t = MrTable::new(2, 0);
        let pd = t.alloc_pd();
        t.register_zeroed(pd, 8, 0, Access::empty()).unwrap();
        t.alloc_mw(pd, MwType::Type1).unwrap();
        assert_eq!(
            t.register_zeroed(pd, 8, 0, Access::empty()),
            Err(RegisterError::TableFull)
        );
    }

    #[test]
    fn unknown_and_stale_keys() {
        let (t, pd) = table();
        let k = t.register_zeroed(pd, 64, 0x1000, RW).unwrap();
        for bogus in [Key::new(0, k.key8()), Key::new(17, 0), Key::new(3000, 0)] {
            assert_eq!(
                err(t.check(REMOTE, bogus, pd, 0x1000, 8, Access::REMOTE_READ)),
                AccessError::UnknownKey { key: bogus }
            );
        }
        let stale = k.with_key8(k.key8().wrapping_add(1));
        assert_eq!(
            err(t.check(REMOTE, stale, pd, 0x1000, 8, Access::REMOTE_READ)),
            AccessError::StaleKey { key: stale }
        );
        t.deregister(k).unwrap();
        assert_eq!(
            err(t.check(REMOTE, k, pd, 0x1000, 8, Access::REMOTE_READ)),
            AccessError::UnknownKey { key: k }
        );
    }

    #[test]
    fn key_changes_on_every_reuse() {
        let t = MrTable::new(1, 9);
        let pd = t.alloc_pd();
        let mut old = Vec::new();
        for _ in 0..255 {
            let k = t.register_zeroed(pd, 8, 0, Access::REMOTE_READ).unwrap();
            assert_eq!(k.index(), 1);
            assert!(
                !old.contains(&k),
                "key {k:?} reused within 255 registrations"
            );
            for stale in &old {
                assert!(t
                    .check(REMOTE, *stale, pd, 0, 8, Access::REMOTE_READ)
                    .is_err());
            }
            assert!(t.check(REMOTE, k, pd, 0, 8, Access::REMOTE_READ).is_ok());
            t.deregister(k).unwrap();
            old.push(k);
        }
    }

    #[test]
    fn initial_keys_come_from_the_seed() {
        let keys = |seed| {
            let t = MrTable::new(8, seed);
            let pd = t.alloc_pd();
            (0..8)
                .map(|_| t.register_zeroed(pd, 8, 0, Access::empty()).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(keys(1), keys(1));
        assert_ne!(keys(1), keys(2));
    }

    #[test]
    fn pd_mismatch_and_rights() {
        let (t, pd) = table();
        let pd2 = t.alloc_pd();
        let k = t
            .register_zeroed(pd, 64, 0x1000, Access::REMOTE_READ)
            .unwrap();
        assert_eq!(
            err(t.check(REMOTE, k, pd2, 0x1000, 8, Access::REMOTE_READ)),
            AccessError::PdMismatch { key: k }
        );
        assert_eq!(
            err(t.check(REMOTE, k, pd, 0x1000, 8, Access::REMOTE_WRITE)),
            AccessError::AccessDenied {
                needed: Access::REMOTE_WRITE,
                granted: Access::REMOTE_READ
            }
        );
        assert_eq!(
            err(t.check(Origin::Local, k, pd, 0x1000, 8, Access::LOCAL_WRITE)),
            AccessError::AccessDenied {
                needed: Access::LOCAL_WRITE,
                granted: Access::REMOTE_READ
            }
        );
        // A send source buffer needs only a valid lkey in the PD.
        let c = t
            .check(Origin::Local, k, pd, 0x1000, 8, Access::empty())
            .unwrap();
        let mut buf = [1u8; 8];
        c.read(0, &mut buf).unwrap();
        assert_eq!(buf, [0; 8]);
    }

    #[test]
    fn bounds() {
        let (t, pd) = table();
        let k = t.register_zeroed(pd, 64, 0x1000, RW).unwrap();
        let ok = |iova, len| {
            t.check(REMOTE, k, pd, iova, len, Access::REMOTE_READ)
                .is_ok()
        };
        assert!(ok(0x1000, 64));
        assert!(ok(0x103F, 1));
        assert!(!ok(0x0FFF, 1));
        assert!(!ok(0x1000, 65));
        assert!(!ok(0x1040, 1));
        assert_eq!(
            err(t.check(REMOTE, k, pd, 0x1001, u64::MAX, Access::REMOTE_READ)),
            AccessError::OutOfBounds {
                iova: 0x1001,
                len: u64::MAX
            }
        );
        assert_eq!(
            err(t.check(REMOTE, k, pd, u64::MAX, 2, Access::REMOTE_READ)),
            AccessError::OutOfBounds {
                iova: u64::MAX,
                len: 2
            }
        );
        // At the very top of the address space.
        let top = t.register_zeroed(pd, 16, u64::MAX - 16, RW).unwrap();
        assert!(t
            .check(REMOTE, top, pd, u64::MAX - 8, 8, Access::REMOTE_READ)
            .is_ok());
        assert!(t
            .check(REMOTE, top, pd, u64::MAX - 8, 9, Access::REMOTE_READ)
            .is_err());
    }

    #[test]
    fn translation_and_zero_based() {
        let (t, pd) = table();
        let k = t.register_zeroed(pd, 64, 0xdead_0000, RW).unwrap();
        let c = t
            .check(REMOTE, k, pd, 0xdead_0010, 4, Access::REMOTE_WRITE)
            .unwrap();
        c.write(0, b"abcd").unwrap();
        drop(c);
        let mut buf = [0u8; 4];
        t.read(k, 0x10, &mut buf).unwrap();
        assert_eq!(&buf, b"abcd");

        let z = t
            .register(
                pd,
                vec![7u8; 32].into_boxed_slice(),
                0,
                RW | Access::ZERO_BASED,
            )
            .unwrap();
        let c = t.check(REMOTE, z, pd, 30, 2, Access::REMOTE_READ).unwrap();
        let mut two = [0u8; 2];
        c.read(0, &mut two).unwrap();
        assert_eq!(two, [7, 7]);
        drop(c);
        assert!(t.check(REMOTE, z, pd, 31, 2, Access::REMOTE_READ).is_err());
    }

    #[test]
    fn atomics() {
        let (t, pd) = table();
        let k = t.register_zeroed(pd, 64, 0x1000, ALL_REMOTE).unwrap();
        let a = |iova, len| t.check(REMOTE, k, pd, iova, len, Access::REMOTE_ATOMIC);
        assert_eq!(err(a(0x1004, 8)), AccessError::Misaligned { iova: 0x1004 });
        assert_eq!(err(a(0x1000, 4)), AccessError::AtomicLength { len: 4 });
        assert_eq!(err(a(0x1000, 0)), AccessError::AtomicLength { len: 0 });
        let c = a(0x1008, 8).unwrap();
        assert_eq!(c.fetch_add(3).unwrap(), 0);
        assert_eq!(c.fetch_add(u64::MAX).unwrap(), 3);
        assert_eq!(c.compare_swap(9, 100).unwrap(), 2);
        assert_eq!(c.compare_swap(2, 100).unwrap(), 2);
        assert_eq!(c.fetch_add(0).unwrap(), 100);
        drop(c);
        // Host order in memory.
        let mut word = [0u8; 8];
        t.read(k, 8, &mut word).unwrap();
        assert_eq!(u64::from_ne_bytes(word), 100);
        // Aligned IOVA over a misaligned host address.
        let m = t.register_zeroed(pd, 64, 4, ALL_REMOTE).unwrap();
        assert_eq!(
            err(t.check(REMOTE, m, pd, 8, 8, Access::REMOTE_ATOMIC)),
            AccessError::Misaligned { iova: 8 }
        );
        // No atomic right.
        let r = t.register_zeroed(pd, 64, 0, RW).unwrap();
        assert!(matches!(
            err(t.check(REMOTE, r, pd, 0, 8, Access::REMOTE_ATOMIC)),
            AccessError::AccessDenied { .. }
        ));
    }

    #[test]
    fn checked_operations_follow_checked_rights() {
        let (t, pd) = table();
        let k = t.register_zeroed(pd, 64, 0, ALL_REMOTE).unwrap();
        let read = t.check(REMOTE, k, pd, 0, 16, Access::REMOTE_READ).unwrap();
        assert!(matches!(
            read.write(0, b"x"),
            Err(AccessError::AccessDenied { .. })
        ));
        assert!(matches!(
            read.fetch_add(1),
            Err(AccessError::AccessDenied { .. })
        ));
        assert_eq!(
            read.read(10, &mut [0u8; 7]),
            Err(AccessError::OutOfBounds { iova: 10, len: 7 })
        );
        read.read(16, &mut []).unwrap();
        drop(read);
        let write = t.check(REMOTE, k, pd, 0, 16, Access::REMOTE_WRITE).unwrap();
        assert!(matches!(
            write.read(0, &mut [0u8; 1]),
            Err(AccessError::AccessDenied { .. })
        ));
        assert!(matches!(
            write.compare_swap(0, 1),
            Err(AccessError::AccessDenied { .. })
        ));
        assert_eq!(
            write.write(15, b"ab"),
            Err(AccessError::OutOfBounds { iova: 15, len: 2 })
        );
        assert_eq!(
            write.write(u64::MAX, b"a"),
            Err(AccessError::OutOfBounds {
                iova: u64::MAX,
                len: 1
            })
        );
        write.write(14, b"ab").unwrap();
        assert_eq!(write.len(), 16);
        assert!(!write.is_empty());
    }

    #[test]
    fn zero_length_skips_the_key_check() {
        let (t, pd) = table();
        let bogus = Key(0xFFFF_FFFF);
        let c = t
            .check(REMOTE, bogus, pd, u64::MAX, 0, Access::REMOTE_WRITE)
            .unwrap();
        assert!(c.is_empty());
        c.write(0, &[]).unwrap();
        assert_eq!(
            c.write(0, b"x"),
            Err(AccessError::OutOfBounds { iova: 0, len: 1 })
        );
        assert!(t
            .check(Origin::Local, bogus, Pd(77), 0, 0, Access::LOCAL_WRITE)
            .is_ok());
        let r = t
            .check(REMOTE, bogus, pd, 0, 0, Access::REMOTE_READ)
            .unwrap();
        r.read(0, &mut []).unwrap();
        // Atomics always carry 8 bytes, so a zero-length atomic is a length error.
        assert_eq!(
            err(t.check(REMOTE, bogus, pd, 0, 0, Access::REMOTE_ATOMIC)),
            AccessError::AtomicLength { len: 0 }
        );
    }

    #[test]
    fn own_memory_access() {
        let (t, pd) = table();
        let k = t
            .register(pd, vec![1, 2, 3].into_boxed_slice(), 0x10, Access::empty())
            .unwrap();
        let mut buf = [0u8; 3];
        t.read(k, 0, &mut buf).unwrap();
        assert_eq!(buf, [1, 2, 3]);
        t.write(k, 1, &[9, 9]).unwrap();
        t.read(k, 0, &mut buf).unwrap();
        assert_eq!(buf, [1, 9, 9]);
        assert_eq!(
            t.write(k, 2, &[0, 0]),
            Err(AccessError::OutOfBounds { iova: 2, len: 2 })
        );
        assert_eq!(
            t.read(k, usize::MAX, &mut buf),
            Err(AccessError::OutOfBounds {
                iova: u64::MAX,
                len: 3
            })
        );
        let stale = k.with_key8(k.key8() ^ 1);
        assert_eq!(
            t.read(stale, 0, &mut buf),
            Err(AccessError::StaleKey { key: stale })
        );
        let mw = t.alloc_mw(pd, MwType::Type1).unwrap();
        assert_eq!(
            t.read(mw, 0, &mut buf),
            Err(AccessError::StaleKey { key: mw })
        );
    }

    #[test]
    fn raw_memory_round_trip() {
        let (t, pd) = table();
        let mut backing = vec![0u64; 8];
        let ptr = backing.as_mut_ptr().cast::<u8>();
        // SAFETY: `backing` outlives the registration (deregistered below) and is not touched
        // until then.
        #[allow(unsafe_code)]
        let k = unsafe { t.register_raw(pd, ptr, 64, 0x5000, ALL_REMOTE) }.unwrap();
        let c = t
            .check(REMOTE, k, pd, 0x5008, 8, Access::REMOTE_ATOMIC)
            .unwrap();
        assert_eq!(c.fetch_add(41).unwrap(), 0);
        drop(c);
        t.deregister(k).unwrap();
        assert_eq!(backing[1], 41);
    }

    #[test]
    #[allow(unsafe_code)]
    fn reregistration_keeps_the_key_and_moves_the_mapping() {
        let (t, pd) = table();
        let pd2 = t.alloc_pd();
        let mut a = vec![0u64; 4];
        let mut b = vec![0u64; 8];
        let (pa, pb) = (a.as_mut_ptr().cast::<u8>(), b.as_mut_ptr().cast::<u8>());
        // SAFETY (every raw call below): `a` and `b` outlive the region, deregistered at the
        // end before they are read.
        let k = unsafe { t.register_raw(pd, pa, 32, 0x1000, ALL_REMOTE) }.unwrap();
        // Refused requests change nothing.
        let bad = unsafe { t.reregister_raw(k, pd2, pb, 64, 0x2000, Access::REMOTE_WRITE) };
        assert_eq!(
            bad,
            Err(RegisterError::InvalidAccess {
                access: Access::REMOTE_WRITE
            })
        );
        let unknown = Pd(pd2.0 + 100);
        let bad = unsafe { t.reregister_raw(k, unknown, pb, 64, 0x2000, RW) };
        assert_eq!(bad, Err(RegisterError::UnknownPd));
        let stale = k.with_key8(k.key8() ^ 1);
        let bad = unsafe { t.reregister_raw(stale, pd2, pb, 64, 0x2000, RW) };
        assert_eq!(bad, Err(RegisterError::UnknownKey { key: stale }));
        let fr = t.alloc_mr(pd, 64).unwrap();
        let bad = unsafe { t.reregister_raw(fr, pd2, pb, 64, 0x2000, RW) };
        assert_eq!(bad, Err(RegisterError::UnknownKey { key: fr }));
        t.deregister(fr).unwrap();
        assert!(t
            .check(REMOTE, k, pd, 0x1008, 8, Access::REMOTE_ATOMIC)
            .is_ok());
        assert_eq!(t.dealloc_pd(pd2), Ok(()));
        let pd2 = t.alloc_pd();
        // New memory, IOVA, PD and rights under the same key.
        unsafe { t.reregister_raw(k, pd2, pb, 64, 0x2000, RW) }.unwrap();
        assert_eq!(
            err(t.check(REMOTE, k, pd, 0x2000, 8, Access::REMOTE_WRITE)),
            AccessError::PdMismatch { key: k }
        );
        assert!(matches!(
            err(t.check(REMOTE, k, pd2, 0x1000, 8, Access::REMOTE_WRITE)),
            AccessError::OutOfBounds { .. }
        ));
        assert!(matches!(
            err(t.check(REMOTE, k, pd2, 0x2000, 8, Access::REMOTE_ATOMIC)),
            AccessError::AccessDenied { .. }
        ));
        t.check(REMOTE, k, pd2, 0x2038, 8, Access::REMOTE_WRITE)
            .unwrap()
            .write(0, &[7; 8])
            .unwrap();
        // The PD counts moved with the region.
        assert_eq!(t.dealloc_pd(pd), Ok(()));
        assert_eq!(t.dealloc_pd(pd2), Err(PdError::Busy { users: 1 }));
        // A bound window holds the mapping.
        let pd3 = t.alloc_pd();
        let k3 = t.register_zeroed(pd3, 64, 0, BIND).unwrap();
        let mw = t.alloc_mw(pd3, MwType::Type1).unwrap();
        t.bind_mw(mw, pd3, Qpn::new(1), bind(k3, 0, 8, Access::REMOTE_READ, 5))
            .unwrap();
        let bad = unsafe { t.reregister_raw(k3, pd3, pb, 64, 0x3000, BIND) };
        assert_eq!(bad, Err(RegisterError::WindowsBound { key: k3 }));
        t.deregister(k).unwrap();
        assert_eq!(t.dealloc_pd(pd2), Ok(()));
        assert_eq!(a, [0; 4]);
        assert_eq!(b[7], 0x0707_0707_0707_0707);
    }

    #[test]
    fn the_seed_decides_index_order_and_keys() {
        let keys = |seed| {
            let t = MrTable::new(1024, seed);
            let pd = t.alloc_pd();
            (0..8)
                .map(|_| t.register_zeroed(pd, 8, 0, RW).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(keys(1), keys(1));
        let (a, b) = (keys(1), keys(2));
        assert_ne!(a, b);
        // Indexes are not handed out in order 1, 2, 3, ...
        let sequential = |ks: &[Key]| ks.windows(2).all(|w| w[1].index() == w[0].index() + 1);
        assert!(!sequential(&a) || !sequential(&b));
        for ks in [&a, &b] {
            let mut idx: Vec<u32> = ks.iter().map(|k| k.index()).collect();
            idx.sort_unstable();
            idx.dedup();
            assert_eq!(idx.len(), ks.len(), "indexes are unique");
            assert!(idx.iter().all(|&i| (1..=1024).contains(&i)));
        }
    }

    #[test]
    fn deregister_errors() {
        let (t, pd) = table();
        let k = t.register_zeroed(pd, 64, 0, BIND).unwrap();
        let mw = t.alloc_mw(pd, MwType::Type1).unwrap();
        // An index nothing was registered at (the free list's order is seeded random).
        let unused = (1..)
            .find(|i| ![k.index(), mw.index()].contains(i))
            .unwrap();
        assert_eq!(
            t.deregister(Key::new(unused, 0)),
            Err(DeregisterError::UnknownKey {
                key: Key::new(unused, 0)
            })
        );
        assert_eq!(
            t.deregister(Key(0)),
            Err(DeregisterError::UnknownKey { key: Key(0) })
        );
        let stale = k.with_key8(k.key8() ^ 0x80);
        assert_eq!(
            t.deregister(stale),
            Err(DeregisterError::StaleKey { key: stale })
        );
        assert_eq!(
            t.deregister(mw),
            Err(DeregisterError::WrongKind { key: mw })
        );
        assert_eq!(t.dealloc_mw(k), Err(DeregisterError::WrongKind { key: k }));
        let bound = t
            .bind_mw(
                mw,
                pd,
                Qpn::new(1),
                BindMw {
                    mr: k,
                    addr: 0,
                    len: 8,
                    access: Access::REMOTE_READ,
                    key8: 5,
                },
            )
            .unwrap();
        assert_eq!(
            t.deregister(k),
            Err(DeregisterError::WindowsBound { key: k })
        );
        assert_eq!(t.dealloc_mw(mw), Err(DeregisterError::StaleKey { key: mw }));
        assert_eq!(t.dealloc_pd(pd), Err(PdError::Busy { users: 2 }));
        t.dealloc_mw(bound).unwrap();
        t.deregister(k).unwrap();
        t.dealloc_pd(pd).unwrap();
        assert_eq!(t.dealloc_pd(pd), Err(PdError::UnknownPd));
    }

    fn bind(mr: Key, addr: u64, len: u64, access: Access, key8: u8) -> BindMw {
        BindMw {
            mr,
            addr,
            len,
            access,
            key8,
        }
    }

    #[test]
    fn type1_window() {
        let (t, pd) = table();
        let mr = t.register_zeroed(pd, 256, 0x1000, BIND).unwrap();
        let mw = t.alloc_mw(pd, MwType::Type1).unwrap();
        // Allocated but unbound.
        assert_eq!(
            err(t.check(REMOTE, mw, pd, 0x1000, 8, Access::REMOTE_READ)),
            AccessError::Invalidated { key: mw }
        );
        let k1 = t
            .bind_mw(
                mw,
                pd,
                Qpn::new(3),
                bind(mr, 0x1010, 16, Access::REMOTE_READ, 0x11),
            )
            .unwrap();
        assert_eq!(k1, mw.with_key8(0x11));
        assert!(t
            .check(REMOTE, k1, pd, 0x1010, 16, Access::REMOTE_READ)
            .is_ok());
        // Any QP of the PD may use a type 1 window.
        assert!(t
            .check(
                Origin::Remote { qpn: Qpn::new(99) },
                k1,
                pd,
                0x1010,
                16,
                Access::REMOTE_READ
            )
            .is_ok());
        assert!(t
            .check(REMOTE, k1, pd, 0x1010, 17, Access::REMOTE_READ)
            .is_err());
        assert!(t
            .check(REMOTE, k1, pd, 0x100F, 1, Access::REMOTE_READ)
            .is_err());
        assert!(matches!(
            err(t.check(REMOTE, k1, pd, 0x1010, 8, Access::REMOTE_WRITE)),
            AccessError::AccessDenied { .. }
        ));
        assert_eq!(
            err(t.check(Origin::Local, k1, pd, 0x1010, 8, Access::empty())),
            AccessError::WindowAsLocalKey { key: k1 }
        );
        assert_eq!(
            err(t.check(REMOTE, mw, pd, 0x1010, 8, Access::REMOTE_READ)),
            AccessError::StaleKey { key: mw }
        );
        // Writes through the window land in the region at the right place.
        let k2 = t
            .bind_mw(
                k1,
                pd,
                Qpn::new(3),
                bind(
                    mr,
                    0x1020,
                    8,
                    Access::REMOTE_WRITE | Access::REMOTE_READ,
                    0x12,
                ),
            )
            .unwrap();
        assert_eq!(
            err(t.check(REMOTE, k1, pd, 0x1010, 8, Access::REMOTE_READ)),
            AccessError::StaleKey { key: k1 }
        );
        t.check(REMOTE, k2, pd, 0x1020, 8, Access::REMOTE_WRITE)
            .unwrap()
            .write(0, b"windowed")
            .unwrap();
        let mut buf = [0u8; 8];
        t.read(mr, 0x20, &mut buf).unwrap();
        assert_eq!(&buf, b"windowed");
        // Type 1 windows cannot be invalidated; a zero-length bind unbinds.
        assert_eq!(
            t.invalidate_remote(k2, pd, Qpn::new(3)),
            Err(InvalidateError::Type1Window { key: k2 })
        );
        let k3 = t
            .bind_mw(
                k2,
                pd,
                Qpn::new(3),
                bind(Key(0), 0, 0, Access::empty(), 0x13),
            )
            .unwrap();
        assert_eq!(
            err(t.check(REMOTE, k3, pd, 0x1020, 8, Access::REMOTE_READ)),
            AccessError::Invalidated { key: k3 }
        );
        t.deregister(mr).unwrap();
    }

    #[test]
    fn type2_window() {
        let (t, pd) = table();
        let pd2 = t.alloc_pd();
        let mr = t.register_zeroed(pd, 256, 0x1000, BIND).unwrap();
        let mw = t.alloc_mw(pd, MwType::Type2).unwrap();
        assert_eq!(
            t.bind_mw(
                mw,
                pd,
                Qpn::new(3),
                bind(mr, 0x1000, 0, Access::REMOTE_READ, 1)
            ),
            Err(BindError::ZeroLength)
        );
        let zb = Access::REMOTE_ATOMIC | Access::ZERO_BASED;
        let k = t
            .bind_mw(mw, pd, Qpn::new(3), bind(mr, 0x1008, 16, zb, 1))
            .unwrap();
        assert_eq!(
            t.bind_mw(k, pd, Qpn::new(3), bind(mr, 0x1008, 16, zb, 2)),
            Err(BindError::AlreadyBound)
        );
        // Zero based: address 8 is region IOVA 0x1010.
        assert_eq!(
            t.check(
                Origin::Remote { qpn: Qpn::new(3) },
                k,
                pd,
                8,
                8,
                Access::REMOTE_ATOMIC
            )
            .unwrap()
            .fetch_add(6),
            Ok(0)
        );
        let mut word = [0u8; 8];
        t.read(mr, 0x10, &mut word).unwrap();
        assert_eq!(u64::from_ne_bytes(word), 6);
        assert_eq!(
            err(t.check(
                Origin::Remote { qpn: Qpn::new(4) },
                k,
                pd,
                8,
                8,
                Access::REMOTE_ATOMIC
            )),
            AccessError::QpMismatch { key: k }
        );
        assert_eq!(
            t.invalidate_remote(k, pd2, Qpn::new(3)),
            Err(InvalidateError::PdMismatch { key: k })
        );
        assert_eq!(
            t.invalidate_remote(k, pd, Qpn::new(4)),
            Err(InvalidateError::QpMismatch { key: k })
        );
        let stale = k.with_key8(9);
        assert_eq!(
            t.invalidate_remote(stale, pd, Qpn::new(3)),
            Err(InvalidateError::StaleKey { key: stale })
        );
        assert_eq!(
            t.deregister(mr),
            Err(DeregisterError::WindowsBound { key: mr })
        );
        t.invalidate_remote(k, pd, Qpn::new(3)).unwrap();
        assert_eq!(
            err(t.check(
                Origin::Remote { qpn: Qpn::new(3) },
                k,
                pd,
                8,
                8,
                Access::REMOTE_ATOMIC
            )),
            AccessError::Invalidated { key: k }
        );
        assert_eq!(
            t.invalidate_local(k, pd, Qpn::new(3)),
            Err(InvalidateError::AlreadyInvalid { key: k })
        );
        // Free again: it can be bound to another QP, and the region deregistered after.
        let k2 = t
            .bind_mw(
                k,
                pd,
                Qpn::new(5),
                bind(mr, 0x1000, 8, Access::REMOTE_READ, 2),
            )
            .unwrap();
        t.invalidate_local(k2, pd, Qpn::new(5)).unwrap();
        t.deregister(mr).unwrap();
        assert_eq!(
            t.invalidate_local(Key::new(15, 0), pd, Qpn::new(5)),
            Err(InvalidateError::UnknownKey {
                key: Key::new(15, 0)
            })
        );
    }

    #[test]
    fn bind_errors() {
        let (t, pd) = table();
        let pd2 = t.alloc_pd();
        let mr = t.register_zeroed(pd, 64, 0x1000, BIND).unwrap();
        let mr_ro = t
            .register_zeroed(pd, 64, 0, Access::MW_BIND | Access::REMOTE_READ)
            .unwrap();
        let mr_nobind = t.register_zeroed(pd, 64, 0, RW).unwrap();
        let mr_zb = t
            .register_zeroed(pd, 64, 0, BIND | Access::ZERO_BASED)
            .unwrap();
        let mr_pd2 = t.register_zeroed(pd2, 64, 0, BIND).unwrap();
        let mw1 = t.alloc_mw(pd, MwType::Type1).unwrap();
        let r = Access::REMOTE_READ;
        let b = |mw, pd, bm| t.bind_mw(mw, pd, Qpn::new(1), bm);
        assert_eq!(
            b(mr, pd, bind(mr_ro, 0, 8, r, 1)),
            Err(BindError::InvalidWindow { key: mr })
        );
        let stale = mw1.with_key8(mw1.key8() ^ 1);
        assert_eq!(
            b(stale, pd, bind(mr, 0x1000, 8, r, 1)),
            Err(BindError::InvalidWindow { key: stale })
        );
        assert_eq!(
            b(mw1, pd2, bind(mr, 0x1000, 8, r, 1)),
            Err(BindError::PdMismatch)
        );
        assert_eq!(
            b(mw1, pd, bind(mr, 0x1000, 8, Access::LOCAL_WRITE, 1)),
            Err(BindError::InvalidAccess {
                access: Access::LOCAL_WRITE
            })
        );
        assert_eq!(
            b(mw1, pd, bind(mr, 0x1000, 8, r | Access::ZERO_BASED, 1)),
            Err(BindError::ZeroBasedType1)
        );
        assert_eq!(
            b(mw1, pd, bind(mw1, 0x1000, 8, r, 1)),
            Err(BindError::InvalidRegion { key: mw1 })
        );
        let gone = Key::new(14, 0);
        assert_eq!(
            b(mw1, pd, bind(gone, 0, 8, r, 1)),
            Err(BindError::InvalidRegion { key: gone })
        );
        assert_eq!(
            b(mw1, pd, bind(mr_pd2, 0, 8, r, 1)),
            Err(BindError::PdMismatch)
        );
        assert_eq!(
            b(mw1, pd, bind(mr_zb, 0, 8, r, 1)),
            Err(BindError::RegionZeroBased)
        );
        assert_eq!(
            b(mw1, pd, bind(mr_nobind, 0, 8, r, 1)),
            Err(BindError::NoBindAccess)
        );
        assert_eq!(
            b(mw1, pd, bind(mr_ro, 0, 8, Access::REMOTE_WRITE, 1)),
            Err(BindError::NeedsLocalWrite)
        );
        assert_eq!(
            b(mw1, pd, bind(mr, 0xFFF, 8, r, 1)),
            Err(BindError::OutOfBounds {
                addr: 0xFFF,
                len: 8
            })
        );
        assert_eq!(
            b(mw1, pd, bind(mr, 0x1039, 8, r, 1)),
            Err(BindError::OutOfBounds {
                addr: 0x1039,
                len: 8
            })
        );
        assert_eq!(
            b(mw1, pd, bind(mr, 0x1000, u64::MAX, r, 1)),
            Err(BindError::OutOfBounds {
                addr: 0x1000,
                len: u64::MAX
            })
        );
        let fr = t.alloc_mr(pd, 64).unwrap();
        assert_eq!(
            b(mw1, pd, bind(fr, 0, 8, r, 1)),
            Err(BindError::RegionInvalidated { key: fr })
        );
        // Nothing above left a window counted on a region.
        for k in [mr, mr_ro, mr_nobind, mr_zb, mr_pd2, fr] {
            t.deregister(k).unwrap();
        }
    }

    #[test]
    fn fast_registration() {
        let (t, pd) = table();
        let pd2 = t.alloc_pd();
        let fr = t.alloc_mr(pd, 128).unwrap();
        assert_eq!(
            err(t.check(REMOTE, fr, pd, 0, 8, Access::REMOTE_READ)),
            AccessError::Invalidated { key: fr }
        );
        let reg = FastReg {
            offset: 64,
            iova: 0x9000,
            len: 32,
            access: RW,
        };
        let k = fr.with_key8(fr.key8().wrapping_add(1));
        assert_eq!(
            t.fast_reg(k, pd2, reg),
            Err(RegisterError::PdMismatch { key: k })
        );
        assert_eq!(
            t.fast_reg(k, pd, FastReg { offset: 100, ..reg }),
            Err(RegisterError::BadRange {
                iova: 0x9000,
                len: 32
            })
        );
        assert_eq!(
            t.fast_reg(
                k,
                pd,
                FastReg {
                    access: Access::REMOTE_WRITE,
                    ..reg
                }
            ),
            Err(RegisterError::InvalidAccess {
                access: Access::REMOTE_WRITE
            })
        );
        t.fast_reg(k, pd, reg).unwrap();
        assert_eq!(
            t.fast_reg(k, pd, reg),
            Err(RegisterError::StillValid { key: k })
        );
        assert_eq!(
            err(t.check(REMOTE, fr, pd, 0x9000, 8, Access::REMOTE_READ)),
            AccessError::StaleKey { key: fr }
        );
        t.check(REMOTE, k, pd, 0x9000, 4, Access::REMOTE_WRITE)
            .unwrap()
            .write(0, b"fast")
            .unwrap();
        let mut buf = [0u8; 4];
        t.read(k, 64, &mut buf).unwrap();
        assert_eq!(&buf, b"fast");
        assert!(t
            .check(REMOTE, k, pd, 0x9000, 33, Access::REMOTE_READ)
            .is_err());

        assert_eq!(
            t.invalidate_remote(k, pd2, Qpn::new(1)),
            Err(InvalidateError::PdMismatch { key: k })
        );
        t.invalidate_remote(k, pd, Qpn::new(1)).unwrap();
        assert_eq!(
            err(t.check(REMOTE, k, pd, 0x9000, 8, Access::REMOTE_READ)),
            AccessError::Invalidated { key: k }
        );
        assert_eq!(
            t.invalidate_local(k, pd, Qpn::new(1)),
            Err(InvalidateError::AlreadyInvalid { key: k })
        );
        let k2 = k.with_key8(k.key8().wrapping_add(1));
        t.fast_reg(
            k2,
            pd,
            FastReg {
                offset: 0,
                iova: 0,
                len: 128,
                access: BIND,
            },
        )
        .unwrap();
        assert!(t
            .check(REMOTE, k, pd, 0x9000, 8, Access::REMOTE_READ)
            .is_err());
        assert!(t.check(REMOTE, k2, pd, 0, 128, Access::REMOTE_READ).is_ok());
        // Invalidation is refused while windows are bound.
        let mw = t.alloc_mw(pd, MwType::Type1).unwrap();
        let mwk = t
            .bind_mw(mw, pd, Qpn::new(1), bind(k2, 0, 8, Access::REMOTE_READ, 0))
            .unwrap();
        assert_eq!(
            t.invalidate_local(k2, pd, Qpn::new(1)),
            Err(InvalidateError::WindowsBound { key: k2 })
        );
        t.dealloc_mw(mwk).unwrap();
        t.invalidate_local(k2, pd, Qpn::new(1)).unwrap();

        // Ordinary registrations are neither invalidated nor fast-registered.
        let user = t.register_zeroed(pd, 8, 0, RW).unwrap();
        assert_eq!(
            t.invalidate_remote(user, pd, Qpn::new(1)),
            Err(InvalidateError::NotFastReg { key: user })
        );
        assert_eq!(
            t.fast_reg(user, pd, reg),
            Err(RegisterError::NotFastReg { key: user })
        );
        let mw2 = t.alloc_mw(pd, MwType::Type2).unwrap();
        assert_eq!(
            t.fast_reg(mw2, pd, reg),
            Err(RegisterError::UnknownKey { key: mw2 })
        );
    }

    #[test]
    fn classification() {
        let k = Key(0x100);
        let access = [
            AccessError::UnknownKey { key: k },
            AccessError::StaleKey { key: k },
            AccessError::PdMismatch { key: k },
            AccessError::Invalidated { key: k },
            AccessError::QpMismatch { key: k },
            AccessError::WindowAsLocalKey { key: k },
            AccessError::AccessDenied {
                needed: Access::REMOTE_READ,
                granted: Access::empty(),
            },
            AccessError::OutOfBounds { iova: 0, len: 1 },
        ];
        for e in access {
            assert_eq!(e.responder_nak(), NakCode::RemoteAccessError, "{e}");
        }
        for e in [
            AccessError::Misaligned { iova: 4 },
            AccessError::AtomicLength { len: 4 },
        ] {
            assert_eq!(e.responder_nak(), NakCode::InvalidRequest, "{e}");
        }
        let inv = InvalidateError::Type1Window { key: k };
        assert_eq!(inv.responder_nak(), NakCode::InvalidRequest);
    }
}
