//! The receive slots: memory the transport writes in place (registered with
//! [`ProtectionDomain::register_raw`], as a NIC registers `ibv_reg_mr` memory) and the
//! collectives then read without copying it out first. The only `unsafe` of the crate is
//! here. (An operation's own buffers are lent to the transport with the safe, scoped
//! [`ProtectionDomain::with_borrowed_ref`] instead: see `net.rs`.)
//!
//! The transport's side of every access is a relaxed atomic; ordering with ours comes from
//! completions, as with a NIC's DMA (`register_raw`'s contract): a slot is read only after
//! the receive completion that says it is full and before it is granted back. That is a
//! claim about the protocol (a peer writes a slot only with a credit for it), which no safe
//! interface can check, so reading slots in place stays `unsafe`; a safe read would copy
//! each chunk out first.

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
