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
//! The handler is put first by [`ensure_installed`] on every registration of caller memory
//! (the only memory that can vanish under us), over whatever handler is there: in an MPI
//! process Open MPI and UCX install theirs after the first registration, and a fault must
//! reach us before a handler that prints a backtrace and kills the process. Every signal we
//! do not recover is passed on as if we had never been installed: we put back the disposition
//! we replaced and let the fault re-run (or raise a sent signal again). Handlers installed
//! after ours often chain back to ours, or put ours back and raise; such a signal reaching us
//! again before the next installation goes to the disposition our first installation
//! replaced, which predates us, so no two handlers call each other for ever. A signal this
//! process sent itself while inside a guarded function (a handler above ours that restored
//! its predecessor and raised, as UCX's does) is recovered like the fault. Engine threads
//! must not block SIGSEGV/SIGBUS (the kernel kills a process whose blocked fault it cannot
//! deliver); the transport's threads unblock them.
//!
//! What stays different from a NIC: pages unmapped and mapped again at the same address
//! receive the data where the NIC's would go to the old pages. No emulation through virtual
//! addresses can tell the two apart.

use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
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
        ".type roce_mr_guard_copy_avx, @function",
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
        ".size roce_mr_guard_copy_avx, . - roce_mr_guard_copy_avx",
        // Copy with 16-byte SSE2 moves (part of x86_64), 64 bytes a round, then 8-byte words, then
        // bytes. Same arguments and result.
        ".p2align 4",
        ".hidden roce_mr_guard_copy",
        ".globl roce_mr_guard_copy",
        ".type roce_mr_guard_copy, @function",
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
        ".size roce_mr_guard_copy, . - roce_mr_guard_copy",
        // Compare-and-swap: rdi = word, rsi = compare, rdx = swap; returns the old value in
        // rax and 0 in rdx (`Word`), or 1 in rdx after a fault.
        ".p2align 4",
        ".hidden roce_mr_guard_cas",
        ".globl roce_mr_guard_cas",
        ".type roce_mr_guard_cas, @function",
        "roce_mr_guard_cas:",
        "mov rax, rsi",
        "lock cmpxchg qword ptr [rdi], rdx",
        "xor edx, edx",
        "ret",
        ".size roce_mr_guard_cas, . - roce_mr_guard_cas",
        // Fetch-and-add: rdi = word, rsi = addend; returns as the compare-and-swap.
        ".hidden roce_mr_guard_fadd",
        ".globl roce_mr_guard_fadd",
        ".type roce_mr_guard_fadd, @function",
        "roce_mr_guard_fadd:",
        "lock xadd qword ptr [rdi], rsi",
        "mov rax, rsi",
        "xor edx, edx",
        "ret",
        ".size roce_mr_guard_fadd, . - roce_mr_guard_fadd",
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

impl Word {
    fn result(self) -> Result<u64, Fault> {
        if self.fault == 0 {
            Ok(self.old)
        } else {
            Err(Fault)
        }
    }
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
    unsafe { roce_mr_guard_cas(word.cast(), compare, swap) }.result()
}

/// Fetch-and-add (wrapping) of the 8-byte word at `word`; returns the old value.
///
/// # Safety
///
/// As [`compare_swap`].
#[allow(unsafe_code)]
pub(crate) unsafe fn fetch_add(word: *mut u8, add: u64) -> Result<u64, Fault> {
    // SAFETY: the caller's contract.
    unsafe { roce_mr_guard_fadd(word.cast(), add) }.result()
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

/// What one signal's handling remembers. Dispositions are leaked, never-changed copies, so
/// the handler reads the handler address, flags and mask of one `sigaction` together.
struct Slot {
    /// The disposition our latest installation replaced.
    prev: AtomicPtr<libc::sigaction>,
    /// The disposition our first installation replaced (it predates us, so it cannot call
    /// back into us).
    orig: AtomicPtr<libc::sigaction>,
    /// Set when a signal we do not recover was handed to `prev`; cleared by installation.
    passed: AtomicBool,
}

static SEGV: Slot = Slot {
    prev: AtomicPtr::new(core::ptr::null_mut()),
    orig: AtomicPtr::new(core::ptr::null_mut()),
    passed: AtomicBool::new(false),
};
static BUS: Slot = Slot {
    prev: AtomicPtr::new(core::ptr::null_mut()),
    orig: AtomicPtr::new(core::ptr::null_mut()),
    passed: AtomicBool::new(false),
};

fn slot(sig: c_int) -> &'static Slot {
    if sig == libc::SIGBUS {
        &BUS
    } else {
        &SEGV
    }
}

/// Whether `code` says the CPU raised `sig` at the faulting instruction (so it runs again
/// when the handler returns): SEGV_MAPERR/ACCERR/BNDERR/PKUERR, SI_KERNEL (a general
/// protection fault), BUS_ADRALN/ADRERR/OBJERR/MCEERR_AR. A signal sent with `kill`,
/// `raise` or `sigqueue` (code <= 0) and BUS_MCEERR_AO (reported later, not at the
/// instruction) are not.
fn synchronous(sig: c_int, code: c_int) -> bool {
    const SI_KERNEL: c_int = 0x80;
    (sig == libc::SIGSEGV || sig == libc::SIGBUS) && matches!(code, 1..=4 | SI_KERNEL)
}

/// The address of our handler.
fn ours() -> usize {
    on_fault as *const () as usize
}

/// Sets the disposition of `sig` (async-signal-safe).
#[allow(unsafe_code)]
fn set_disposition(sig: c_int, to: Option<&libc::sigaction>) {
    // SAFETY: sigaction is async-signal-safe; a zeroed sigaction with SIG_DFL and an empty
    // mask, or a copy of a disposition the kernel gave us, is a valid argument.
    unsafe {
        let mut dfl: libc::sigaction = core::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigemptyset(&mut dfl.sa_mask);
        libc::sigaction(sig, to.unwrap_or(&dfl), core::ptr::null_mut());
    }
}

/// The SIGSEGV/SIGBUS handler: recovers faults inside the guarded functions and passes every
/// other signal on (module docs).
#[allow(unsafe_code)]
extern "C" fn on_fault(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // SAFETY: the kernel passes a valid (or null) siginfo to an SA_SIGINFO handler.
    let info_ref = unsafe { info.as_ref() };
    let code = info_ref.map_or(0, |i| i.si_code);
    let fault = synchronous(sig, code);
    // A signal this process sent itself (`raise` from a handler above ours that restored its
    // predecessor: UCX's does, after printing a backtrace); it arrives where the fault was.
    // SAFETY: si_pid is meaningful for code <= 0 (SI_USER, SI_TKILL, SI_QUEUE).
    let own =
        code <= 0 && info_ref.is_some_and(|i| unsafe { i.si_pid() } == unsafe { libc::getpid() });
    if (fault || own) && !ctx.is_null() {
        // SAFETY: the kernel passes a valid ucontext to an SA_SIGINFO handler; only the saved
        // instruction pointer is changed, to the fixup of the same function.
        unsafe {
            let uc = ctx.cast::<libc::ucontext_t>();
            let rip = &mut (*uc).uc_mcontext.gregs[libc::REG_RIP as usize];
            if let Some(fixup) = fixup_for(*rip as usize) {
                *rip = fixup as i64;
                FAULTS.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    }
    let s = slot(sig);
    if !s.passed.swap(true, Ordering::AcqRel) {
        // First time: step aside for the disposition we replaced and let the kernel deliver
        // to it, as if we had never been installed: a fault re-runs, anything else is raised
        // again (it stays pending until we return).
        // SAFETY: null or a leaked, immutable copy made by `ensure_installed`.
        let prev = unsafe { s.prev.load(Ordering::Acquire).as_ref() };
        set_disposition(sig, prev);
        if !fault {
            // SAFETY: plain libc call.
            unsafe { libc::raise(sig) };
        }
        return;
    }
    // Again, before any new installation: the disposition we stepped aside for called us
    // (it chains to its predecessor, ours) or put us back and raised. Go to the one that
    // predates us, so nothing can come back here.
    // SAFETY: as above.
    let orig = unsafe { s.orig.load(Ordering::Acquire).as_ref() };
    let handler = orig.map_or(libc::SIG_DFL, |o| o.sa_sigaction);
    if handler == libc::SIG_IGN && !fault {
        return;
    }
    let Some(orig) = orig.filter(|_| handler != libc::SIG_DFL && handler != libc::SIG_IGN) else {
        set_disposition(sig, None);
        if !fault {
            // SAFETY: plain libc call.
            unsafe { libc::raise(sig) };
        }
        return;
    };
    // Call it as the kernel would have: its mask added, its disposition reset first if it
    // asked for SA_RESETHAND.
    // SAFETY: pthread_sigmask is async-signal-safe; `orig.sa_mask` is a valid set; `old` is
    // a writable local.
    let mut old: libc::sigset_t = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &orig.sa_mask, &mut old) };
    if orig.sa_flags & libc::SA_RESETHAND != 0 {
        set_disposition(sig, None);
    }
    if orig.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the handler was installed with SA_SIGINFO, so it has this type.
        let f: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) =
            unsafe { core::mem::transmute(handler) };
        f(sig, info, ctx);
    } else {
        // SAFETY: the handler was installed without SA_SIGINFO: `void (*)(int)`.
        let f: extern "C" fn(c_int) = unsafe { core::mem::transmute(handler) };
        f(sig);
    }
    // SAFETY: restoring the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, core::ptr::null_mut()) };
}

/// Whether our handler is the one SIGSEGV reaches first right now.
#[allow(unsafe_code)]
pub(crate) fn on_top() -> bool {
    // SAFETY: querying a disposition into a zeroed, writable sigaction.
    let mut cur: libc::sigaction = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    let r = unsafe { libc::sigaction(libc::SIGSEGV, core::ptr::null(), &mut cur) };
    r == 0 && cur.sa_sigaction == ours()
}

/// Serialises installations.
static INSTALL: Mutex<()> = Mutex::new(());

/// Puts our handler first for SIGSEGV and SIGBUS, remembering what it replaces (module
/// docs), unless it already is: two `sigaction` queries then. Handlers installed after ours
/// (Open MPI's and UCX's are, in an MPI process) are replaced too, so that a fault on unmapped
/// region memory reaches us first; they often chain back to ours, which is why a signal we
/// pass on never returns to them (`on_fault`).
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
        if cur.sa_sigaction == ours() {
            continue;
        }
        let s = slot(sig);
        // SAFETY: a zeroed sigaction with our SA_SIGINFO handler, an empty mask and valid
        // flags; `on_fault` has the SA_SIGINFO signature. The alternate stack is asked for
        // only if the handler we replace asked for it (Rust's stack-overflow handler does).
        let mut ours_sa: libc::sigaction = unsafe { core::mem::zeroed() };
        ours_sa.sa_sigaction = ours();
        ours_sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART | (cur.sa_flags & libc::SA_ONSTACK);
        // SAFETY: a valid set to fill.
        unsafe { libc::sigemptyset(&mut ours_sa.sa_mask) };
        // Publish what we replace before we replace it, then record what the kernel says we
        // actually replaced, should another thread have changed it in between.
        let copy = Box::into_raw(Box::new(cur));
        s.prev.store(copy, Ordering::Release);
        if s.orig.load(Ordering::Acquire).is_null() {
            s.orig.store(copy, Ordering::Release);
        }
        s.passed.store(false, Ordering::Release);
        // SAFETY: zeroed, writable local.
        let mut replaced: libc::sigaction = unsafe { core::mem::zeroed() };
        // SAFETY: valid arguments, as above.
        if unsafe { libc::sigaction(sig, &ours_sa, &mut replaced) } != 0 {
            continue;
        }
        if replaced.sa_sigaction != cur.sa_sigaction && replaced.sa_sigaction != ours() {
            s.prev
                .store(Box::into_raw(Box::new(replaced)), Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_guarded_range_is_its_own_and_ends_at_its_fixup() {
        let copy_avx = roce_mr_guard_copy_avx as *const () as usize;
        let copy = roce_mr_guard_copy as *const () as usize;
        let cas = roce_mr_guard_cas as *const () as usize;
        let fadd = roce_mr_guard_fadd as *const () as usize;
        let avx_fix = roce_mr_guard_copy_avx_fixup as *const () as usize;
        let copy_fix = roce_mr_guard_copy_fixup as *const () as usize;
        let atomic_fix = roce_mr_guard_atomic_fixup as *const () as usize;
        // One section, in this order: each function, then its fixup, before the next one.
        assert!(copy_avx < avx_fix && avx_fix < copy, "avx copy");
        assert!(copy < copy_fix && copy_fix < cas, "sse copy");
        assert!(cas < fadd && fadd < atomic_fix, "atomics");
        assert_eq!(fixup_for(copy_avx), Some(avx_fix));
        assert_eq!(fixup_for(avx_fix - 1), Some(avx_fix));
        assert_eq!(fixup_for(avx_fix), None, "the fixup itself is not guarded");
        assert_eq!(fixup_for(copy + 1), Some(copy_fix));
        assert_eq!(fixup_for(fadd + 1), Some(atomic_fix));
        assert_eq!(fixup_for(atomic_fix), None);
        assert_eq!(fixup_for(ours()), None);
    }

    #[test]
    #[allow(unsafe_code)]
    fn a_copy_to_or_from_an_address_never_mapped_fails() {
        // Page zero can never be mapped (vm.mmap_min_addr), so these faults are SEGV_MAPERR,
        // the code of memory unmapped under a registration.
        ensure_installed();
        let mut buf = [7u8; 200];
        for n in [1usize, 8, 64, 200] {
            // SAFETY: the destination is unmapped (the one misuse `copy` survives); `buf` is
            // a live local.
            assert_eq!(
                unsafe { copy(core::ptr::without_provenance_mut(16), buf.as_ptr(), n) },
                Err(Fault)
            );
            // SAFETY: as above, the other way round.
            assert_eq!(
                unsafe { copy(buf.as_mut_ptr(), core::ptr::without_provenance(16), n) },
                Err(Fault)
            );
        }
        // SAFETY: as above.
        assert_eq!(
            unsafe { fetch_add(core::ptr::without_provenance_mut(16), 1) },
            Err(Fault)
        );
    }

    #[test]
    fn only_faults_at_the_instruction_count_as_synchronous() {
        for code in [1, 2, 3, 4, 0x80] {
            assert!(synchronous(libc::SIGSEGV, code), "{code}");
            assert!(synchronous(libc::SIGBUS, code), "{code}");
        }
        // kill/raise/sigqueue (SI_USER 0, SI_TKILL -6, SI_QUEUE -1), BUS_MCEERR_AO 5.
        for code in [0, -6, -1, 5] {
            assert!(!synchronous(libc::SIGSEGV, code), "{code}");
            assert!(!synchronous(libc::SIGBUS, code), "{code}");
        }
        assert!(!synchronous(libc::SIGILL, 1));
    }
}
