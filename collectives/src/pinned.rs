//! Memory the transport reaches in place while this crate accesses it too, registered with
//! [`ProtectionDomain::register_raw`] as a NIC registers `ibv_reg_mr` memory: the receive
//! slots ([`SlotMem`]: the transport writes them, the collectives read them without copying
//! them out first) and an operation's buffer that a phase both writes and sends from
//! ([`LentMut`]: the transport reads the chunks being sent while the executor writes others).
//! The crate's `unsafe` is here, and in the executor's one call of
//! [`LentMut::range_mut`] (`net.rs`), which checks its contract first. (Buffers a phase only reads are lent with the
//! safe, scoped [`ProtectionDomain::with_borrowed_ref`] instead: see `net.rs`.)
//!
//! The transport's side of every access is a relaxed atomic; ordering with ours comes from
//! completions, as with a NIC's DMA (`register_raw`'s contract): a slot is read only after
//! the receive completion that says it is full and before it is granted back; a lent
//! buffer's bytes are written only when no WRITE that reads them is in flight (posted and
//! not completed). Those are claims about the protocol and the executor's bookkeeping, which
//! no safe interface can check, so those accesses stay `unsafe`; the safe alternatives copy
//! every chunk (out of a slot, or into a send staging): the staging copy alone cost about a
//! tenth of a 16-64 MiB allreduce's bandwidth on this machine (veth, np=2).

use std::marker::PhantomData;
use std::sync::atomic::AtomicU64;

use roce_transport::{Access, MemoryRegion, ProtectionDomain, VerbsError};

/// Registered memory this crate owns: the receive slots of one peer.
pub(crate) struct SlotMem {
    /// Dropped first (the field order): deregistering waits for any access in progress, so
    /// the engine never touches `mem` once it is freed.
    mr: MemoryRegion,
    /// 8-byte words with interior mutability: the engine writes them through the region
    /// while this struct is shared.
    mem: Box<[AtomicU64]>,
}

impl std::fmt::Debug for SlotMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotMem")
            .field("len", &self.mr.len())
            .finish_non_exhaustive()
    }
}

impl SlotMem {
    /// `len` zeroed bytes (8-byte aligned), registered with `access`.
    pub(crate) fn new(
        pd: &ProtectionDomain,
        len: usize,
        access: Access,
    ) -> Result<Self, VerbsError> {
        let mem: Box<[AtomicU64]> = (0..len.div_ceil(8)).map(|_| AtomicU64::new(0)).collect();
        let ptr = mem.as_ptr().cast::<u8>().cast_mut();
        // SAFETY: `mem` is a live heap allocation of at least `len` bytes that this struct
        // owns and frees only after `mr` (declared first) is dropped, which deregisters the
        // region and waits for any access in progress; moving the box does not move the
        // heap memory. The words are atomics (interior mutability), so the engine may write
        // them through this pointer while `&self` is shared.
        #[allow(unsafe_code)]
        let mr = unsafe { pd.register_raw(ptr, len, ptr as u64, access) }?;
        Ok(Self { mr, mem })
    }

    /// The region (its address and rkey go to the peer).
    pub(crate) fn mr(&self) -> &MemoryRegion {
        &self.mr
    }

    /// `len` bytes at `at`, read in place. Call only for bytes a completion said were
    /// written (a slot whose receive completion was taken) and that no peer may write until
    /// this rank says so (the slot is not granted back while the slice is alive: granting
    /// needs `&mut` of the owner).
    ///
    /// # Panics
    /// Never: out-of-range requests are clamped to the region (a protocol error upstream
    /// is caught by the length checks before).
    pub(crate) fn bytes(&self, at: usize, len: usize) -> &[u8] {
        let total = self.mr.len();
        let at = at.min(total);
        let len = len.min(total - at);
        let base = self.mem.as_ptr().cast::<u8>();
        // SAFETY: `at + len <= total <= 8 * mem.len()`: in bounds of the live allocation.
        // The bytes were last written by the engine before the completion the caller took
        // (the CQ's lock orders those writes before this read), and no writer touches them
        // until the slot is granted again (see above): no concurrent write while the slice
        // lives, as `register_raw`'s DMA-like contract asks of the owner's plain accesses.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts(base.add(at), len)
        }
    }
}

/// One of an operation's buffers that a phase writes and also sends large chunks from in
/// place: registered (local read only: the transport never writes it, no peer reaches it) for
/// the life of this value, which the phase keeps no longer than its borrow of the buffer.
/// While it lives the buffer is accessed only through it: shared reads of any bytes, and
/// writes of ranges no in-place WRITE is reading ([`Self::range_mut`]).
pub(crate) struct LentMut<'a> {
    /// Dropped first (the field order): deregistering waits for any access in progress, and
    /// afterwards the transport never touches the buffer, before the borrow ends.
    mr: MemoryRegion,
    ptr: *mut u8,
    len: usize,
    _buf: PhantomData<&'a mut [u8]>,
}

impl std::fmt::Debug for LentMut<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LentMut")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl<'a> LentMut<'a> {
    /// Registers `buf` in place for local reads (the source of WRITEs).
    pub(crate) fn new(pd: &ProtectionDomain, buf: &'a mut [u8]) -> Result<Self, VerbsError> {
        let (ptr, len) = (buf.as_mut_ptr(), buf.len());
        // SAFETY: `buf` is borrowed for `'a`, which this value cannot outlive, and it is not
        // used again meanwhile: every access goes through `ptr`, derived from it once. The
        // region is dropped with this value (before the borrow ends, also when unwinding:
        // it is owned here, never lent out by value), which deregisters it and waits for any
        // access in progress; deregistration can fail only for a region with memory windows
        // bound, which needs MW_BIND, not granted here. Without LOCAL_WRITE or any remote
        // right, the transport only reads it, for the WRITEs this crate posts with its lkey,
        // and this crate writes only bytes none of those is reading (`range_mut`'s
        // contract): no data race.
        #[allow(unsafe_code)]
        let mr = unsafe { pd.register_raw(ptr, len, ptr as u64, Access::empty()) }?;
        Ok(Self {
            mr,
            ptr,
            len,
            _buf: PhantomData,
        })
    }

    /// The region (the lkey of in-place WRITEs).
    pub(crate) fn mr(&self) -> &MemoryRegion {
        &self.mr
    }

    /// The whole buffer, read only (the transport only reads it too).
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr .. ptr + len` is the live, borrowed buffer; while the slice lives
        // `&self` is held, so `range_mut` (which takes `&mut self`) cannot write it, and the
        // transport never writes it (no LOCAL_WRITE).
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts(self.ptr, self.len)
        }
    }

    /// Bytes `a .. b` for writing, or `None` if out of range.
    ///
    /// # Safety
    /// No WRITE posted from this region that reads any of these bytes may be in flight
    /// (posted and not yet completed) while the slice lives, and none may be posted then.
    #[allow(unsafe_code)]
    pub(crate) unsafe fn range_mut(&mut self, a: usize, b: usize) -> Option<&mut [u8]> {
        if a > b || b > self.len {
            return None;
        }
        // SAFETY: in bounds (checked); `&mut self` excludes every other slice this value
        // hands out; the transport reads these bytes only for a WRITE in flight, which the
        // caller rules out, and never writes them.
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr.add(a), b - a) })
    }
}
