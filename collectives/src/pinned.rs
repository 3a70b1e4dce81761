//! Memory the transport reads and writes in place (registered with
//! [`ProtectionDomain::register_raw`], as a NIC registers `ibv_reg_mr` memory): the receive
//! slots, which the collectives then read without copying them out first, and an operation's
//! own buffers, which the RDMA WRITEs of large chunks send from without copying them into the
//! work request. The only `unsafe` of the crate is here.
//!
//! The transport's side of every access is a relaxed atomic; ordering with ours comes from
//! completions, as with a NIC's DMA (`register_raw`'s contract): a slot is read only after
//! the receive completion that says it is full and before it is granted back, and a buffer a
//! WRITE sends from is not overwritten before that WRITE has completed.

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

/// An operation buffer registered in place for the length of one transfer phase, so that
/// WRITEs send from it directly (local read only: no peer can reach it).
pub(crate) struct Pinned {
    mr: MemoryRegion,
}

impl Pinned {
    /// Registers `buf` in place.
    ///
    /// The caller keeps `buf` alive and in place until the returned value is dropped (the
    /// drop deregisters it and waits for any read in progress), and does not write bytes a
    /// posted WRITE still reads from before that WRITE has completed.
    pub(crate) fn new(pd: &ProtectionDomain, buf: &mut [u8]) -> Result<Self, VerbsError> {
        let ptr = buf.as_mut_ptr();
        // SAFETY: `buf` is valid for reads and writes of `buf.len()` bytes; the executor
        // holds the borrow it came from for longer than the returned region lives (it drops
        // its `Pinned`s before returning), and the engine only reads it (local access,
        // no remote rights), for WRITEs whose completion the executor waits for before it
        // writes the bytes they send or returns.
        #[allow(unsafe_code)]
        let mr = unsafe { pd.register_raw(ptr, buf.len(), ptr as u64, Access::empty()) }?;
        Ok(Self { mr })
    }

    /// Registers `buf`, which nothing may write, in place: as [`Self::new`] for an
    /// out-of-place operation's source. The region grants no write access at all (no
    /// local write, no remote rights), so the transport only ever reads it.
    pub(crate) fn new_read_only(pd: &ProtectionDomain, buf: &[u8]) -> Result<Self, VerbsError> {
        let ptr = buf.as_ptr().cast_mut();
        // SAFETY: `buf` is valid for reads of `buf.len()` bytes for longer than the region
        // lives (as in `new`). `register_raw` asks for memory valid for writes too, for the
        // accesses its rights allow; these rights allow none (no LOCAL_WRITE, no remote
        // access), so the table never writes through this pointer: only the WRITEs this
        // executor posts read it.
        #[allow(unsafe_code)]
        let mr = unsafe { pd.register_raw(ptr, buf.len(), ptr as u64, Access::empty()) }?;
        Ok(Self { mr })
    }

    /// The region.
    pub(crate) fn mr(&self) -> &MemoryRegion {
        &self.mr
    }
}
