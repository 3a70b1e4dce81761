//! Region memory and the only code that touches it.
//!
//! Several queue pairs (threads) and the application may access one region at the same time,
//! exactly like DMA from a NIC. To keep that free of data races in Rust's memory model, every
//! access to region memory is atomic: aligned 8-byte words go through `AtomicU64`, the unaligned
//! head and tail of a copy through `AtomicU8`, all `Relaxed` (ordering comes from the completion
//! hand-off, not from the memory). RDMA atomics use `AtomicU64` read-modify-write operations on
//! the aligned word. A copy and an atomic that overlap the same word at the same time use
//! different access sizes; the hardware keeps each access whole, and which value wins is
//! unspecified, as it is between RDMA writes and atomics on a real NIC.
//!
//! # Copies on Linux x86_64
//!
//! There every access (copies and RDMA atomics alike) goes through the assembly of
//! `crate::guard`, which survives memory the application unmapped while it was registered (a
//! NIC writes pinned pages and never notices; see that module). Copies use 32-byte AVX moves
//! where the CPU has them, 16-byte SSE2 moves, then 8-byte words and bytes (measured in
//! `benches/lookup.rs`, `checked_read`/`checked_write`; the data path copies every payload byte
//! once on each side). The assembly is opaque to the compiler, so it cannot be turned into a
//! non-atomic `memcpy` the optimiser may reason about, and on x86 every byte a move reads or
//! writes is a single-copy-atomic access (no byte is ever torn; only a wider access as a whole
//! may be, as with our mixed-size accesses above): the accepted way to write a racy-but-defined
//! "atomic memcpy" in Rust today (the approach of the `atomic-maybe-uninit` crate and of the
//! `AtomicPerByte` proposal, RFC 3301). `rep movsb` is not used: on AMD Zen it is slow when the
//! two addresses are close modulo 4 KiB (a 4 KiB copy measured 1.4 µs instead of 0.1 µs), and
//! it starts slower on packet-sized copies. Other platforms and Miri use the portable loop of
//! atomics, and there memory unmapped under a registration is still fatal.

use core::ptr::NonNull;
#[cfg(not(all(target_arch = "x86_64", target_os = "linux", not(miri))))]
use core::sync::atomic::{AtomicU64, AtomicU8, Ordering};

#[cfg(all(target_arch = "x86_64", target_os = "linux", not(miri)))]
use crate::guard;
#[cfg(all(target_arch = "x86_64", target_os = "linux", not(miri)))]
pub(crate) use crate::guard::Fault;

/// A host address inside region memory.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HostPtr(NonNull<u8>);

// SAFETY: a `HostPtr` is an address into region memory that is only dereferenced through the
// atomic functions below, while the owning table slot's lock keeps the memory alive; sending or
// sharing the address itself between threads is harmless.
#[allow(unsafe_code)]
unsafe impl Send for HostPtr {}
// SAFETY: as for `Send`: all dereferences are atomic and guarded by the slot lock.
#[allow(unsafe_code)]
unsafe impl Sync for HostPtr {}

impl HostPtr {
    pub(crate) fn as_ptr(self) -> *mut u8 {
        self.0.as_ptr()
    }

    pub(crate) fn addr(self) -> usize {
        self.0.as_ptr().addr()
    }

    /// `self + offset`; the caller keeps the result inside the same allocation.
    pub(crate) fn offset(self, offset: usize) -> Self {
        match NonNull::new(self.0.as_ptr().wrapping_add(offset)) {
            Some(p) => Self(p),
            None => self,
        }
    }
}

/// Who frees the memory of a region.
#[derive(Debug)]
enum Owner {
    /// `Box<[u64]>` of this many words (zeroed, 8-byte aligned allocation).
    Words(usize),
    /// `Box<[u8]>` given by the application.
    Bytes,
    /// Caller memory from `register_raw`: never freed here.
    Raw,
}

/// The memory a region was registered over.
#[derive(Debug)]
pub(crate) struct Memory {
    ptr: HostPtr,
    len: usize,
    owner: Owner,
}

impl Memory {
    /// `len` zeroed bytes, 8-byte aligned.
    pub(crate) fn zeroed(len: usize) -> Self {
        let words = vec![0u64; len.div_ceil(8)].into_boxed_slice();
        let nwords = words.len();
        let ptr = NonNull::from(Box::leak(words)).cast::<u8>();
        Self {
            ptr: HostPtr(ptr),
            len,
            owner: Owner::Words(nwords),
        }
    }

    /// Takes ownership of an application buffer.
    pub(crate) fn from_box(bytes: Box<[u8]>) -> Self {
        let len = bytes.len();
        let ptr = NonNull::from(Box::leak(bytes)).cast::<u8>();
        Self {
            ptr: HostPtr(ptr),
            len,
            owner: Owner::Bytes,
        }
    }

    /// Caller memory; `None` for a null pointer with non-zero length.
    ///
    /// # Safety
    ///
    /// As [`MrTable::register_raw`](crate::MrTable::register_raw).
    #[allow(unsafe_code)]
    pub(crate) unsafe fn raw(ptr: *mut u8, len: usize) -> Option<Self> {
        let ptr = match NonNull::new(ptr) {
            Some(p) => p,
            None if len == 0 => NonNull::dangling(),
            None => return None,
        };
        Some(Self {
            ptr: HostPtr(ptr),
            len,
            owner: Owner::Raw,
        })
    }

    pub(crate) fn base(&self) -> HostPtr {
        self.ptr
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Memory {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        match self.owner {
            Owner::Words(nwords) => {
                let words =
                    core::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr().cast::<u64>(), nwords);
                // SAFETY: `words` is exactly the `Box<[u64]>` leaked in `zeroed`; `Memory` is
                // dropped only when its slot's write lock excluded every accessor (or the table
                // is dropped), so no reference or pointer into it is used again.
                drop(unsafe { Box::from_raw(words) });
            }
            Owner::Bytes => {
                let bytes = core::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len);
                // SAFETY: `bytes` is exactly the `Box<[u8]>` leaked in `from_box`; no accessor
                // remains, as above.
                drop(unsafe { Box::from_raw(bytes) });
            }
            Owner::Raw => {}
        }
    }
}

/// Copies `src` to `dst`. On Linux x86_64 the copy is [`guard::copy`]'s (vector moves, then
/// words, then bytes, in assembly) and survives memory unmapped under it; elsewhere it is a
/// loop of `Relaxed` atomic stores.
///
/// # Errors
///
/// [`Fault`] if part of the destination is not mapped (some bytes before it may be written).
///
/// # Safety
///
/// `dst .. dst + src.len()` must be valid for writes for the duration of the call (on Linux
/// x86_64: or not mapped at all), and every concurrent access to those bytes must be atomic
/// (all accesses made by this crate are).
#[allow(unsafe_code)]
pub(crate) unsafe fn store(dst: *mut u8, src: &[u8]) -> Result<(), Fault> {
    #[cfg(all(target_arch = "x86_64", target_os = "linux", not(miri)))]
    {
        // SAFETY: `src` is a live slice that cannot overlap region memory (only ever accessed
        // through raw pointers); the rest is the caller's contract.
        unsafe { guard::copy(dst, src.as_ptr(), src.len()) }
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux", not(miri))))]
    {
        let head = dst.align_offset(8).min(src.len());
        let (head_src, rest) = src.split_at(head);
        for (i, b) in head_src.iter().enumerate() {
            // SAFETY: `dst + i` is inside the destination range (caller contract); `AtomicU8`
            // has alignment 1; concurrent accesses are atomic (caller contract).
            unsafe { AtomicU8::from_ptr(dst.add(i)) }.store(*b, Ordering::Relaxed);
        }
        let words = rest.chunks_exact(8);
        let tail = words.remainder();
        let mut at = head;
        for w in words {
            let mut word = [0u8; 8];
            word.copy_from_slice(w);
            // SAFETY: `dst + at` is inside the destination range and 8-byte aligned (`at`
            // starts at the alignment offset and grows by 8); concurrent accesses are atomic.
            unsafe { AtomicU64::from_ptr(dst.add(at).cast::<u64>()) }
                .store(u64::from_ne_bytes(word), Ordering::Relaxed);
            at += 8;
        }
        for (i, b) in tail.iter().enumerate() {
            // SAFETY: inside the destination range; alignment 1; concurrent accesses atomic.
            unsafe { AtomicU8::from_ptr(dst.add(at + i)) }.store(*b, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// Copies from `src` into `dst`, as [`store`] the other way.
///
/// # Errors
///
/// [`Fault`] if part of the source is not mapped (`dst` is then partly written).
///
/// # Safety
///
/// `src .. src + dst.len()` must be valid for reads for the duration of the call (on Linux
/// x86_64: or not mapped at all), and every concurrent access to those bytes must be atomic.
#[allow(unsafe_code)]
pub(crate) unsafe fn load(src: *const u8, dst: &mut [u8]) -> Result<(), Fault> {
    #[cfg(all(target_arch = "x86_64", target_os = "linux", not(miri)))]
    {
        // SAFETY: `dst` is a live exclusive slice and so cannot overlap region memory; the
        // rest is the caller's contract.
        unsafe { guard::copy(dst.as_mut_ptr(), src, dst.len()) }
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux", not(miri))))]
    {
        let head = src.align_offset(8).min(dst.len());
        let (head_dst, rest) = dst.split_at_mut(head);
        for (i, b) in head_dst.iter_mut().enumerate() {
            // SAFETY: `src + i` is inside the source range (caller contract); alignment 1;
            // concurrent accesses are atomic. `from_ptr` wants `*mut` but we only load.
            *b = unsafe { AtomicU8::from_ptr(src.add(i).cast_mut()) }.load(Ordering::Relaxed);
        }
        let mut words = rest.chunks_exact_mut(8);
        let mut at = head;
        for w in &mut words {
            // SAFETY: inside the source range and 8-byte aligned; concurrent accesses atomic.
            let word = unsafe { AtomicU64::from_ptr(src.add(at).cast_mut().cast::<u64>()) }
                .load(Ordering::Relaxed);
            w.copy_from_slice(&word.to_ne_bytes());
            at += 8;
        }
        for (i, b) in words.into_remainder().iter_mut().enumerate() {
            // SAFETY: inside the source range; alignment 1; concurrent accesses are atomic.
            *b = unsafe { AtomicU8::from_ptr(src.add(at + i).cast_mut()) }.load(Ordering::Relaxed);
        }
        Ok(())
    }
}

/// Atomic compare-and-swap of the 8-byte word at `ptr`: stores `swap` if it equals `compare`;
/// returns the old value either way.
///
/// # Errors
///
/// [`Fault`] if the word is not mapped (Linux x86_64).
///
/// # Safety
///
/// `ptr` must be 8-byte aligned and valid for reads and writes of 8 bytes (on Linux x86_64:
/// or not mapped), and every concurrent access to it must be atomic.
#[allow(unsafe_code)]
pub(crate) unsafe fn compare_swap(ptr: *mut u8, compare: u64, swap: u64) -> Result<u64, Fault> {
    #[cfg(all(target_arch = "x86_64", target_os = "linux", not(miri)))]
    {
        // SAFETY: forwarded to the caller's contract.
        unsafe { guard::compare_swap(ptr, compare, swap) }
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux", not(miri))))]
    {
        // SAFETY: forwarded to the caller's contract.
        let word = unsafe { AtomicU64::from_ptr(ptr.cast::<u64>()) };
        Ok(
            match word.compare_exchange(compare, swap, Ordering::AcqRel, Ordering::Acquire) {
                Ok(v) | Err(v) => v,
            },
        )
    }
}

/// Atomic fetch-and-add (wrapping) of the 8-byte word at `ptr`; returns the old value.
///
/// # Errors
///
/// As [`compare_swap`].
///
/// # Safety
///
/// As [`compare_swap`].
#[allow(unsafe_code)]
pub(crate) unsafe fn fetch_add(ptr: *mut u8, add: u64) -> Result<u64, Fault> {
    #[cfg(all(target_arch = "x86_64", target_os = "linux", not(miri)))]
    {
        // SAFETY: forwarded to the caller's contract.
        unsafe { guard::fetch_add(ptr, add) }
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux", not(miri))))]
    {
        // SAFETY: forwarded to the caller's contract.
        let word = unsafe { AtomicU64::from_ptr(ptr.cast::<u64>()) };
        Ok(word.fetch_add(add, Ordering::AcqRel))
    }
}

/// A fault inside an access to region memory (the memory is not mapped).
#[cfg(not(all(target_arch = "x86_64", target_os = "linux", not(miri))))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fault;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(unsafe_code)]
    fn store_load_every_alignment() {
        // Lengths on both sides of the bulk-copy threshold, at every alignment; the bytes
        // around the copied range must stay as they were.
        const LEN: usize = 384;
        let mem = Memory::zeroed(LEN);
        for start in 0..12 {
            for len in (0..40).chain([63, 64, 65, 127, 128, 129, 200, 300, 333]) {
                let src: Vec<u8> = (0..len).map(|i| (i * 7 + start + 1) as u8).collect();
                let mut back = vec![0u8; len];
                let mut whole = vec![0u8; LEN];
                let mut expected = vec![0xEEu8; LEN];
                expected[start..start + len].copy_from_slice(&src);
                // SAFETY: start + len <= 345 < LEN, memory owned by `mem`, single thread.
                unsafe {
                    store(mem.base().as_ptr(), &[0xEE; LEN]).unwrap();
                    store(mem.base().as_ptr().add(start), &src).unwrap();
                    load(mem.base().as_ptr().add(start), &mut back).unwrap();
                    load(mem.base().as_ptr(), &mut whole).unwrap();
                }
                assert_eq!(src, back, "start {start} len {len}");
                assert_eq!(
                    whole, expected,
                    "start {start} len {len}: outside the range"
                );
            }
        }
    }

    #[test]
    fn zeroed_is_aligned() {
        assert_eq!(Memory::zeroed(3).base().addr() % 8, 0);
        assert_eq!(Memory::zeroed(0).len(), 0);
    }
}
