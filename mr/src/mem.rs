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
//! # Bulk copies on x86_64
//!
//! On x86_64 the 64-byte blocks of a copy go through a loop of 16-byte SSE2 moves in inline
//! assembly (`bulk_copy`) and only the rest through the word loop (measured in
//! `benches/lookup.rs`, `checked_read`/`checked_write`; the data path copies every payload byte
//! once on each side). The assembly is opaque to the compiler, so it cannot be turned into a
//! non-atomic `memcpy` the optimiser may reason about, and on x86 every byte an unaligned
//! vector move reads or writes is a single-copy-atomic access (no byte is ever torn; only the
//! 16 bytes as a whole are not atomic, as with our mixed-size accesses above): the accepted way
//! to write a racy-but-defined "atomic memcpy" in Rust today (the approach of the
//! `atomic-maybe-uninit` crate and of the `AtomicPerByte` proposal, RFC 3301). Other
//! architectures and Miri keep the portable loop alone.

use core::ptr::NonNull;
use core::sync::atomic::{AtomicU64, AtomicU8, Ordering};

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

/// Copies shorter than this use the word loop only.
#[cfg(all(target_arch = "x86_64", not(miri)))]
const BULK_MIN: usize = 64;

/// Copies the first `n / 64 * 64` bytes from `src` to `dst` with 32-byte AVX moves where the
/// CPU has them (128 bytes a round) and 16-byte SSE2 moves (part of x86_64) for the rest, in
/// inline assembly, and returns how many bytes it copied (a multiple of 64): per-byte
/// single-copy-atomic on x86 and opaque to the compiler (see the module docs). `rep movsb` is
/// not used: on AMD Zen it is slow when the two addresses are close modulo 4 KiB (a 4 KiB copy
/// measured 1.4 µs instead of 0.1 µs), and it starts slower on packet-sized copies.
///
/// # Safety
///
/// `src .. src + n` valid for reads and `dst .. dst + n` valid for writes for the duration of
/// the call, the two ranges not overlapping; concurrent accesses to either are atomic.
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[allow(unsafe_code)]
#[inline]
unsafe fn bulk_copy(dst: *mut u8, src: *const u8, n: usize) -> usize {
    let mut done = 0;
    if std::is_x86_feature_detected!("avx") {
        // SAFETY: the CPU has AVX; the rest is the caller's contract.
        done = unsafe { bulk_copy_avx(dst, src, n) };
    }
    // SAFETY: `done <= n`: the rest of both ranges.
    let (dst, src, n) = unsafe { (dst.add(done), src.add(done), n - done) };
    let blocks = n / 64;
    if blocks == 0 {
        return done;
    }
    // SAFETY: the ranges are valid and disjoint (caller contract); the loop reads and writes
    // exactly `blocks * 64 <= n` bytes forward from `s` and `t`, touches no stack, and
    // clobbers only the registers declared.
    unsafe {
        core::arch::asm!(
            "2:",
            "movdqu {a}, [{s}]",
            "movdqu {b}, [{s} + 16]",
            "movdqu {c}, [{s} + 32]",
            "movdqu {d}, [{s} + 48]",
            "movdqu [{t}], {a}",
            "movdqu [{t} + 16], {b}",
            "movdqu [{t} + 32], {c}",
            "movdqu [{t} + 48], {d}",
            "add {s}, 64",
            "add {t}, 64",
            "dec {n}",
            "jnz 2b",
            s = inout(reg) src => _,
            t = inout(reg) dst => _,
            n = inout(reg) blocks => _,
            a = out(xmm_reg) _,
            b = out(xmm_reg) _,
            c = out(xmm_reg) _,
            d = out(xmm_reg) _,
            options(nostack),
        );
    }
    done + blocks * 64
}

/// [`bulk_copy`] with 32-byte AVX moves: the first `n / 128 * 128` bytes; returns that count.
///
/// # Safety
///
/// As [`bulk_copy`], and the CPU must support AVX.
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[allow(unsafe_code)]
#[target_feature(enable = "avx")]
unsafe fn bulk_copy_avx(dst: *mut u8, src: *const u8, n: usize) -> usize {
    let blocks = n / 128;
    if blocks == 0 {
        return 0;
    }
    // SAFETY: as in `bulk_copy`, 128 bytes per round; `vzeroupper` leaves the upper halves
    // clean so later SSE code pays no transition penalty.
    unsafe {
        core::arch::asm!(
            "2:",
            "vmovdqu {a}, [{s}]",
            "vmovdqu {b}, [{s} + 32]",
            "vmovdqu {c}, [{s} + 64]",
            "vmovdqu {d}, [{s} + 96]",
            "vmovdqu [{t}], {a}",
            "vmovdqu [{t} + 32], {b}",
            "vmovdqu [{t} + 64], {c}",
            "vmovdqu [{t} + 96], {d}",
            "add {s}, 128",
            "add {t}, 128",
            "dec {n}",
            "jnz 2b",
            "vzeroupper",
            s = inout(reg) src => _,
            t = inout(reg) dst => _,
            n = inout(reg) blocks => _,
            a = out(ymm_reg) _,
            b = out(ymm_reg) _,
            c = out(ymm_reg) _,
            d = out(ymm_reg) _,
            options(nostack),
        );
    }
    blocks * 128
}

/// Copies `src` to `dst` with atomic stores.
///
/// # Safety
///
/// `dst .. dst + src.len()` must be valid for writes for the duration of the call, and every
/// concurrent access to those bytes must be atomic (all accesses made by this crate are).
#[allow(unsafe_code)]
pub(crate) unsafe fn store(dst: *mut u8, src: &[u8]) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    let (dst, src) = if src.len() >= BULK_MIN {
        // SAFETY: `src` is a live slice, `dst .. dst + len` is valid for writes (caller
        // contract), and a `&[u8]` cannot overlap region memory that is only ever accessed
        // through raw pointers; concurrent accesses are atomic.
        let done = unsafe { bulk_copy(dst, src.as_ptr(), src.len()) };
        // SAFETY: `done <= src.len()`: still inside (or one past) the destination range.
        (unsafe { dst.add(done) }, &src[done..])
    } else {
        (dst, src)
    };
    let head = dst.align_offset(8).min(src.len());
    let (head_src, rest) = src.split_at(head);
    for (i, b) in head_src.iter().enumerate() {
        // SAFETY: `dst + i` is inside the destination range (caller contract); `AtomicU8` has
        // alignment 1; concurrent accesses are atomic (caller contract).
        unsafe { AtomicU8::from_ptr(dst.add(i)) }.store(*b, Ordering::Relaxed);
    }
    let words = rest.chunks_exact(8);
    let tail = words.remainder();
    let mut at = head;
    for w in words {
        let mut word = [0u8; 8];
        word.copy_from_slice(w);
        // SAFETY: `dst + at` is inside the destination range and 8-byte aligned (`at` starts at
        // the alignment offset and grows by 8); concurrent accesses are atomic.
        unsafe { AtomicU64::from_ptr(dst.add(at).cast::<u64>()) }
            .store(u64::from_ne_bytes(word), Ordering::Relaxed);
        at += 8;
    }
    for (i, b) in tail.iter().enumerate() {
        // SAFETY: inside the destination range; alignment 1; concurrent accesses are atomic.
        unsafe { AtomicU8::from_ptr(dst.add(at + i)) }.store(*b, Ordering::Relaxed);
    }
}

/// Copies from `src` into `dst` with atomic loads.
///
/// # Safety
///
/// `src .. src + dst.len()` must be valid for reads for the duration of the call, and every
/// concurrent access to those bytes must be atomic.
#[allow(unsafe_code)]
pub(crate) unsafe fn load(src: *const u8, dst: &mut [u8]) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    let (src, dst) = if dst.len() >= BULK_MIN {
        // SAFETY: `src .. src + len` is valid for reads (caller contract), `dst` is a live
        // exclusive slice and so cannot overlap region memory; concurrent accesses are atomic.
        let done = unsafe { bulk_copy(dst.as_mut_ptr(), src, dst.len()) };
        // SAFETY: `done <= dst.len()`: still inside (or one past) the source range.
        (unsafe { src.add(done) }, &mut dst[done..])
    } else {
        (src, dst)
    };
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
        // SAFETY: inside the source range and 8-byte aligned; concurrent accesses are atomic.
        let word = unsafe { AtomicU64::from_ptr(src.add(at).cast_mut().cast::<u64>()) }
            .load(Ordering::Relaxed);
        w.copy_from_slice(&word.to_ne_bytes());
        at += 8;
    }
    for (i, b) in words.into_remainder().iter_mut().enumerate() {
        // SAFETY: inside the source range; alignment 1; concurrent accesses are atomic.
        *b = unsafe { AtomicU8::from_ptr(src.add(at + i).cast_mut()) }.load(Ordering::Relaxed);
    }
}

/// The 8-byte word at `ptr` as an atomic.
///
/// # Safety
///
/// `ptr` must be 8-byte aligned, valid for reads and writes of 8 bytes for `'a`, and every
/// concurrent access to it must be atomic.
#[allow(unsafe_code)]
pub(crate) unsafe fn word<'a>(ptr: *mut u8) -> &'a AtomicU64 {
    // SAFETY: forwarded to the caller's contract.
    unsafe { AtomicU64::from_ptr(ptr.cast::<u64>()) }
}

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
                    store(mem.base().as_ptr(), &[0xEE; LEN]);
                    store(mem.base().as_ptr().add(start), &src);
                    load(mem.base().as_ptr().add(start), &mut back);
                    load(mem.base().as_ptr(), &mut whole);
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
