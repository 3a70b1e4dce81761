//! Fault-tolerant access to region memory (Linux on x86_64).
//!
//! A NIC reaches registered memory through pages pinned at `ibv_reg_mr`. An application that
//! unmaps a range while it is still registered, and still posted as a receive buffer, never
//! notices: the NIC keeps writing into the orphaned pages until `ibv_dereg_mr`. Real programs
//! do it. UCX 1.13's UD interface frees its receive pool (through its registration cache, so
//! the region stays registered) before it destroys the QP, and a datagram that arrives in
//! between is placed into memory that is no longer mapped. We reach region memory through its
//! virtual address, so the same datagram would kill the process with SIGSEGV.
//!
//! So every access to region memory on this platform goes through three leaf functions
//! written in assembly (a copy, a compare-and-swap and a fetch-and-add), and a SIGSEGV/SIGBUS
//! handler recovers a fault raised inside them: it moves the instruction pointer to the
//! function's fixup, which returns 1 instead of 0. That is the technique of the Linux kernel's
//! exception tables for `copy_from_user`. The caller turns the 1 into
//! [`AccessError::Unmapped`](crate::AccessError::Unmapped): the work request completes in error
//! or the request is NAKed, and the process lives.
//!
//! The handler is installed by [`ensure_installed`] on every registration of caller memory
//! (the only memory that can vanish under us), on top of whatever handler was there, and
//! chains every other fault to it: a previous handler is called as it asked to be (with or
//! without `SA_SIGINFO`); a default or ignored disposition is restored to the default and the
//! faulting instruction re-runs, so the process dies exactly as it would have without us
//! (a signal sent with `kill` is raised again). A handler installed after the last
//! registration hides ours until the next one re-installs it.
//!
//! What stays different from a NIC: pages unmapped and mapped again at the same address
//! receive the data where the NIC's would go to the old pages. No emulation through virtual
//! addresses can tell the two apart.

use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

// Register use follows the System V ABI: arguments in rdi, rsi, rdx, rcx; only caller-saved
// registers (rax, rcx, rdx, rsi, rdi, xmm0-3/ymm0-3) are touched; no stack. Every access to
// region memory is one of the listed instructions, so a fault inside a function leaves nothing
// to undo: its fixup only sets the result (and clears the upper halves after AVX).
/// The assembly (a module of its own, because the lint allowance cannot sit on a macro call).
mod asm {
    #![allow(unsafe_code)]
    core::arch::global_asm!(
        ".pushsection .text.roce_mr_guard,\"ax\",@progbits",
        // Copy with 32-byte AVX moves, 128 bytes a round, then the rest through the SSE2 copy.
        // rdi = dst, rsi = src, rdx = n; eax = 0, or 1 after a fault.
        ".p2align 4",
        ".hidden roce_mr_guard_copy_avx",
        ".globl roce_mr_guard_copy_avx",
        "roce_mr_guard_copy_avx:",
        "cmp rdx, 128",
        "jb roce_mr_guard_copy",
        "2:",
        "vmovdqu ymm0, [rsi]",
        "vmovdqu ymm1, [rsi + 32]",
        "vmovdqu ymm2, [rsi + 64]",
        "vmovdqu ymm3, [rsi + 96]",
        "vmovdqu [rdi], ymm0",
        "vmovdqu [rdi + 32], ymm1",
        "vmovdqu [rdi + 64], ymm2",
        "vmovdqu [rdi + 96], ymm3",
        "add rsi, 128",
        "add rdi, 128",
        "sub rdx, 128",
        "cmp rdx, 128",
        "jae 2b",
        "vzeroupper",
        "jmp roce_mr_guard_copy",
        ".hidden roce_mr_guard_copy_avx_fixup",
        ".globl roce_mr_guard_copy_avx_fixup",
        "roce_mr_guard_copy_avx_fixup:",
        "vzeroupper",
        "mov eax, 1",
        "ret",
        // Copy with 16-byte SSE2 moves (part of x86_64), 64 bytes a round, then 8-byte words, then
        // bytes. Same arguments and result.
        ".p2align 4",
        ".hidden roce_mr_guard_copy",
        ".globl roce_mr_guard_copy",
        "roce_mr_guard_copy:",
        "cmp rdx, 64",
        "jb 3f",
        "2:",
        "movdqu xmm0, [rsi]",
        "movdqu xmm1, [rsi + 16]",
        "movdqu xmm2, [rsi + 32]",
        "movdqu xmm3, [rsi + 48]",
        "movdqu [rdi], xmm0",
        "movdqu [rdi + 16], xmm1",
        "movdqu [rdi + 32], xmm2",
        "movdqu [rdi + 48], xmm3",
        "add rsi, 64",
        "add rdi, 64",
        "sub rdx, 64",
        "cmp rdx, 64",
        "jae 2b",
        "3:",
        "cmp rdx, 8",
        "jb 4f",
        "mov rax, [rsi]",
        "mov [rdi], rax",
        "add rsi, 8",
        "add rdi, 8",
        "sub rdx, 8",
        "jmp 3b",
        "4:",
        "test rdx, rdx",
        "jz 5f",
        "mov al, [rsi]",
        "mov [rdi], al",
        "inc rsi",
        "inc rdi",
        "dec rdx",
        "jmp 4b",
        "5:",
        "xor eax, eax",
        "ret",
        ".hidden roce_mr_guard_copy_fixup",
        ".globl roce_mr_guard_copy_fixup",
        "roce_mr_guard_copy_fixup:",
        "mov eax, 1",
        "ret",
        // Compare-and-swap: rdi = word, rsi = compare, rdx = swap; returns the old value in
        // rax and 0 in rdx (`Word`), or 1 in rdx after a fault.
        ".p2align 4",
        ".hidden roce_mr_guard_cas",
        ".globl roce_mr_guard_cas",
        "roce_mr_guard_cas:",
        "mov rax, rsi",
        "lock cmpxchg qword ptr [rdi], rdx",
        "xor edx, edx",
        "ret",
        // Fetch-and-add: rdi = word, rsi = addend; returns as the compare-and-swap.
        ".hidden roce_mr_guard_fadd",
        ".globl roce_mr_guard_fadd",
        "roce_mr_guard_fadd:",
        "lock xadd qword ptr [rdi], rsi",
        "mov rax, rsi",
        "xor edx, edx",
        "ret",
        ".hidden roce_mr_guard_atomic_fixup",
        ".globl roce_mr_guard_atomic_fixup",
        "roce_mr_guard_atomic_fixup:",
        "mov edx, 1",
        "ret",
        ".popsection",
    );
}

#[allow(unsafe_code)]
extern "C" {
    fn roce_mr_guard_copy_avx(dst: *mut u8, src: *const u8, n: usize) -> u32;
    fn roce_mr_guard_copy_avx_fixup();
    fn roce_mr_guard_copy(dst: *mut u8, src: *const u8, n: usize) -> u32;
    fn roce_mr_guard_copy_fixup();
    fn roce_mr_guard_cas(word: *mut u64, compare: u64, swap: u64) -> Word;
    fn roce_mr_guard_fadd(word: *mut u64, add: u64) -> Word;
    fn roce_mr_guard_atomic_fixup();
}

/// What the atomics return, in rax and rdx (System V returns a two-word struct there).
#[repr(C)]
struct Word {
    /// The word's value before the operation.
    old: u64,
    /// 0, or 1 after a fault.
    fault: u64,
}

/// A fault inside a guarded access: the memory is not mapped (or not mapped for that access).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fault;

/// Faults recovered in this process.
static FAULTS: AtomicU64 = AtomicU64::new(0);

/// How many accesses to region memory faulted and were recovered in this process.
pub(crate) fn faults() -> u64 {
    FAULTS.load(Ordering::Relaxed)
}

fn result(r: u32) -> Result<(), Fault> {
    if r == 0 {
        Ok(())
    } else {
        Err(Fault)
    }
}

/// Copies `n` bytes from `src` to `dst`, recovering a fault on either side.
///
/// # Safety
///
/// `src .. src + n` and `dst .. dst + n` must not overlap, and every part of them that is
/// mapped must be valid for the access (a part that is not mapped at all is the one misuse the
/// copy survives). Concurrent accesses to either range must be atomic: on x86 every byte the
/// moves below read or write is a single-copy-atomic access, and the assembly is opaque to the
/// compiler.
#[allow(unsafe_code)]
pub(crate) unsafe fn copy(dst: *mut u8, src: *const u8, n: usize) -> Result<(), Fault> {
    let r = if n >= 128 && std::is_x86_feature_detected!("avx") {
        // SAFETY: the CPU has AVX; the rest is the caller's contract.
        unsafe { roce_mr_guard_copy_avx(dst, src, n) }
    } else {
        // SAFETY: the caller's contract.
        unsafe { roce_mr_guard_copy(dst, src, n) }
    };
    result(r)
}

/// Compare-and-swap of the 8-byte word at `word` (sequentially consistent, like any `lock`ed
/// instruction); returns the old value.
///
/// # Safety
///
/// `word` must be 8-byte aligned and, if mapped, valid for reads and writes; concurrent
/// accesses atomic.
#[allow(unsafe_code)]
pub(crate) unsafe fn compare_swap(word: *mut u8, compare: u64, swap: u64) -> Result<u64, Fault> {
    // SAFETY: the caller's contract.
    let r = unsafe { roce_mr_guard_cas(word.cast(), compare, swap) };
    if r.fault == 0 {
        Ok(r.old)
    } else {
        Err(Fault)
    }
}

/// Fetch-and-add (wrapping) of the 8-byte word at `word`; returns the old value.
///
/// # Safety
///
/// As [`compare_swap`].
#[allow(unsafe_code)]
pub(crate) unsafe fn fetch_add(word: *mut u8, add: u64) -> Result<u64, Fault> {
    // SAFETY: the caller's contract.
    let r = unsafe { roce_mr_guard_fadd(word.cast(), add) };
    if r.fault == 0 {
        Ok(r.old)
    } else {
        Err(Fault)
    }
}

/// The fixup for a fault at instruction address `ip`, if `ip` is inside a guarded function.
fn fixup_for(ip: usize) -> Option<usize> {
    let ranges: [(usize, usize); 3] = [
        (
            roce_mr_guard_copy_avx as *const () as usize,
            roce_mr_guard_copy_avx_fixup as *const () as usize,
        ),
        (
            roce_mr_guard_copy as *const () as usize,
            roce_mr_guard_copy_fixup as *const () as usize,
        ),
        (
            roce_mr_guard_cas as *const () as usize,
            roce_mr_guard_atomic_fixup as *const () as usize,
        ),
    ];
    ranges
        .iter()
        .find(|&&(start, fixup)| (start..fixup).contains(&ip))
        .map(|&(_, fixup)| fixup)
}

/// The disposition found before ours, per signal: handler address and `sa_flags`.
struct Previous {
    handler: AtomicUsize,
    flags: AtomicI32,
}

static PREV_SEGV: Previous = Previous {
    handler: AtomicUsize::new(libc::SIG_DFL),
    flags: AtomicI32::new(0),
};
static PREV_BUS: Previous = Previous {
    handler: AtomicUsize::new(libc::SIG_DFL),
    flags: AtomicI32::new(0),
};

fn previous(sig: c_int) -> &'static Previous {
    if sig == libc::SIGBUS {
        &PREV_BUS
    } else {
        &PREV_SEGV
    }
}

/// The SIGSEGV/SIGBUS handler: recovers faults inside the guarded functions, chains the rest.
#[allow(unsafe_code)]
extern "C" fn on_fault(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // A fault the CPU raised (si_code > 0; `kill` and `raise` give <= 0) inside a guarded
    // function: resume at its fixup.
    // SAFETY: the kernel passes a valid siginfo and ucontext to an SA_SIGINFO handler; only
    // the saved instruction pointer is changed, to an address inside the same function.
    unsafe {
        if !info.is_null() && (*info).si_code > 0 && !ctx.is_null() {
            let uc = ctx.cast::<libc::ucontext_t>();
            let rip = &mut (*uc).uc_mcontext.gregs[libc::REG_RIP as usize];
            if let Some(fixup) = fixup_for(*rip as usize) {
                *rip = fixup as i64;
                FAULTS.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    }
    let prev = previous(sig);
    let handler = prev.handler.load(Ordering::Acquire);
    let flags = prev.flags.load(Ordering::Acquire);
    if handler == libc::SIG_DFL
        || handler == libc::SIG_IGN
        || handler == on_fault as *const () as usize
    {
        // SAFETY: sigaction and raise are async-signal-safe; a zeroed sigaction with SIG_DFL
        // and an empty mask is a valid argument.
        unsafe {
            let mut dfl: libc::sigaction = core::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            libc::sigemptyset(&mut dfl.sa_mask);
            libc::sigaction(sig, &dfl, core::ptr::null_mut());
            // A fault re-runs the instruction and dies by default; a sent signal must be sent
            // again (it stays pending until this handler returns).
            if info.is_null() || (*info).si_code <= 0 {
                libc::raise(sig);
            }
        }
        return;
    }
    if flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous handler was installed with SA_SIGINFO, so it has this type.
        let f: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) =
            unsafe { core::mem::transmute(handler) };
        f(sig, info, ctx);
    } else {
        // SAFETY: the previous handler was installed without SA_SIGINFO: `void (*)(int)`.
        let f: extern "C" fn(c_int) = unsafe { core::mem::transmute(handler) };
        f(sig);
    }
}

/// Serialises installations.
static INSTALL: Mutex<()> = Mutex::new(());

/// Makes sure our handler is the one SIGSEGV and SIGBUS reach first, remembering what it
/// replaces (see the module docs). Costs two `sigaction` queries when it already is.
#[allow(unsafe_code)]
pub(crate) fn ensure_installed() {
    let _serial = INSTALL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for sig in [libc::SIGSEGV, libc::SIGBUS] {
        // SAFETY: querying a disposition into a zeroed, writable sigaction.
        let mut cur: libc::sigaction = unsafe { core::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::sigaction(sig, core::ptr::null(), &mut cur) } != 0 {
            continue;
        }
        if cur.sa_sigaction == on_fault as *const () as usize {
            continue;
        }
        let prev = previous(sig);
        prev.handler.store(cur.sa_sigaction, Ordering::Release);
        prev.flags.store(cur.sa_flags, Ordering::Release);
        // SAFETY: a zeroed sigaction with our SA_SIGINFO handler, an empty mask and valid
        // flags; `on_fault` has the SA_SIGINFO signature.
        unsafe {
            let mut ours: libc::sigaction = core::mem::zeroed();
            ours.sa_sigaction = on_fault as *const () as usize;
            ours.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
            libc::sigemptyset(&mut ours.sa_mask);
            libc::sigaction(sig, &ours, core::ptr::null_mut());
        }
    }
}
