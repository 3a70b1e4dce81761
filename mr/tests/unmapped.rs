//! Memory the application unmaps while it is still registered: accesses fail with
//! `AccessError::Unmapped` instead of killing the process, and every other fault still reaches
//! the handler (or the default action) it would have reached without us.
#![cfg(all(target_arch = "x86_64", target_os = "linux", not(miri)))]
#![allow(unsafe_code)]

use std::os::unix::process::ExitStatusExt;
use std::process::Command;

use roce_mr::{Access, AccessError, Key, MrTable, Origin, Pd};
use roce_wire::Qpn;

const PAGE: usize = 4096;

fn map(len: usize) -> *mut u8 {
    // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "mmap");
    p.cast()
}

/// Takes `p .. p + len` away from the process as `munmap` would, but keeps the addresses
/// reserved (an inaccessible mapping in their place): a plain `munmap` let another thread's
/// mapping (the test harness, an engine) land there, and the access then succeeded.
fn unmap(p: *mut u8, len: usize) {
    // SAFETY: `p .. p + len` is (part of) a mapping made by `map` that only the table refers
    // to, through accesses that are guarded; MAP_FIXED replaces exactly that range.
    let q = unsafe {
        libc::mmap(
            p.cast(),
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    assert_eq!(q, p.cast(), "mmap PROT_NONE over the range");
}

const ALL: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_ATOMIC);

fn register(table: &MrTable, pd: Pd, p: *mut u8, len: usize) -> Key {
    // SAFETY: the memory stays registered until the test deregisters it; it is unmapped under
    // the registration on purpose, the one breach the table survives on this platform.
    unsafe { table.register_raw(pd, p, len, p as u64, ALL) }.expect("register")
}

#[test]
fn every_access_to_unmapped_memory_fails_with_unmapped() {
    let table = MrTable::new(64, 7);
    let pd = table.alloc_pd();
    let len = 2 * PAGE;
    let p = map(len);
    let key = register(&table, pd, p, len);
    assert!(roce_mr::unmapped_guard_on_top());
    let remote = Origin::Remote { qpn: Qpn::new(5) };
    let at = |off: usize| p as u64 + off as u64;

    // Mapped: everything works.
    let c = table
        .check(remote, key, pd, at(8), 8, Access::REMOTE_ATOMIC)
        .unwrap();
    assert_eq!(c.fetch_add(5).unwrap(), 0);
    assert_eq!(c.compare_swap(5, 9).unwrap(), 5);
    drop(c);

    // The second page goes away; the first stays.
    unmap(p.wrapping_add(PAGE), PAGE);
    let before = roce_mr::unmapped_accesses();

    // A write across the boundary copies the mapped part, then stops.
    let data: Vec<u8> = (0..512u32).map(|i| (i % 251) as u8).collect();
    let c = table
        .check(remote, key, pd, at(PAGE - 256), 512, Access::REMOTE_WRITE)
        .unwrap();
    assert_eq!(c.write(0, &data), Err(AccessError::Unmapped));
    drop(c);
    let mut head = vec![0u8; 256];
    table.read(key, PAGE - 256, &mut head).unwrap();
    assert_eq!(head, data[..256], "the mapped part was written");

    // Every kind of access inside the unmapped page fails the same way, at any length (the
    // byte, word and vector paths of the copy).
    for len in [1usize, 7, 8, 63, 64, 129, 200, 500] {
        let c = table
            .check(
                remote,
                key,
                pd,
                at(PAGE + 16),
                len as u64,
                Access::REMOTE_WRITE | Access::REMOTE_READ,
            )
            .unwrap();
        assert_eq!(
            c.write(0, &data[..len]),
            Err(AccessError::Unmapped),
            "{len}"
        );
        let mut out = vec![0u8; len];
        assert_eq!(c.read(0, &mut out), Err(AccessError::Unmapped), "{len}");
    }
    let c = table
        .check(remote, key, pd, at(PAGE + 64), 8, Access::REMOTE_ATOMIC)
        .unwrap();
    assert_eq!(c.fetch_add(1), Err(AccessError::Unmapped));
    assert_eq!(c.compare_swap(0, 1), Err(AccessError::Unmapped));
    drop(c);
    let mut out = [0u8; 4];
    assert_eq!(
        table.read(key, PAGE + 4, &mut out),
        Err(AccessError::Unmapped)
    );
    assert_eq!(table.write(key, PAGE + 4, &out), Err(AccessError::Unmapped));
    // 8 lengths x 2, two atomics, two direct accesses.
    assert!(roce_mr::unmapped_accesses() >= before + 20);

    // The mapped page still works, and the region deregisters normally.
    let c = table
        .check(remote, key, pd, at(8), 8, Access::REMOTE_ATOMIC)
        .unwrap();
    assert_eq!(c.fetch_add(1).unwrap(), 9);
    drop(c);
    table.deregister(key).unwrap();
    unmap(p, PAGE);
}

/// Sets the disposition of `sig` to `handler` (an SA_SIGINFO handler when `flags` says so,
/// or SIG_DFL / SIG_IGN) with an empty mask; returns the disposition it replaced.
fn set_disposition(sig: libc::c_int, handler: usize, flags: libc::c_int) -> libc::sigaction {
    // SAFETY: zeroed sigactions are valid; `handler` has the signature `flags` says (the
    // callers pass SIG_DFL, SIG_IGN or an SA_SIGINFO handler of this file).
    unsafe {
        let mut sa: libc::sigaction = core::mem::zeroed();
        sa.sa_sigaction = handler;
        sa.sa_flags = flags;
        libc::sigemptyset(&mut sa.sa_mask);
        let mut old: libc::sigaction = core::mem::zeroed();
        assert_eq!(libc::sigaction(sig, &sa, &mut old), 0);
        old
    }
}

/// What the child process does, chosen by the parent through this variable.
const CHILD: &str = "ROCE_MR_UNMAPPED_CHILD";

/// Runs this test binary again as a child doing `what`; returns its status.
fn child(test: &str, what: &str) -> std::process::ExitStatus {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD, what)
        .status()
        .expect("spawn the test binary")
}

/// In the child: registers memory (which installs the handler), then faults outside it.
fn register_then_fault() -> ! {
    let table = MrTable::new(8, 1);
    let pd = table.alloc_pd();
    let p = map(PAGE);
    let _key = register(&table, pd, p, PAGE);
    unmap(p, PAGE);
    // A recovered fault first, so the handler is certainly in place and working.
    let mut b = [0u8; 1];
    assert_eq!(table.read(_key, 0, &mut b), Err(AccessError::Unmapped));
    // SAFETY: none: this write to an unmapped page is the fault under test; the process is
    // expected to die of it (or to leave through the handler installed before ours).
    unsafe { core::ptr::write_volatile(p, 1) };
    std::process::exit(3)
}

#[test]
fn a_fault_outside_region_access_still_kills_the_process() {
    match std::env::var(CHILD).as_deref() {
        Ok("default") => register_then_fault(),
        Ok(_) => return,
        Err(_) => {}
    }
    let status = child(
        "a_fault_outside_region_access_still_kills_the_process",
        "default",
    );
    assert_eq!(status.signal(), Some(libc::SIGSEGV), "{status:?}");
}

extern "C" fn earlier_handler(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: _exit is async-signal-safe.
    unsafe { libc::_exit(42) }
}

#[test]
fn a_fault_outside_region_access_reaches_the_earlier_handler() {
    match std::env::var(CHILD).as_deref() {
        Ok("earlier") => {
            set_disposition(
                libc::SIGSEGV,
                earlier_handler as *const () as usize,
                libc::SA_SIGINFO,
            );
            register_then_fault()
        }
        Ok(_) => return,
        Err(_) => {}
    }
    let status = child(
        "a_fault_outside_region_access_reaches_the_earlier_handler",
        "earlier",
    );
    assert_eq!(status.code(), Some(42), "{status:?}");
}

#[test]
fn a_sent_sigsegv_is_not_swallowed() {
    match std::env::var(CHILD).as_deref() {
        Ok("raise") => {
            let table = MrTable::new(8, 1);
            let pd = table.alloc_pd();
            let p = map(PAGE);
            let _key = register(&table, pd, p, PAGE);
            // With the default disposition before ours, a SIGSEGV sent (not raised by a
            // fault) must still terminate the process.
            // The default first, so Rust's own stack-overflow handler is not what the test
            // exercises.
            set_disposition(libc::SIGSEGV, libc::SIG_DFL, 0);
            let _key2 = register(&table, pd, p, PAGE);
            // SAFETY: plain libc call.
            unsafe { libc::raise(libc::SIGSEGV) };
            std::process::exit(3)
        }
        Ok(_) => return,
        Err(_) => {}
    }
    let status = child("a_sent_sigsegv_is_not_swallowed", "raise");
    assert_eq!(status.signal(), Some(libc::SIGSEGV), "{status:?}");
}

/// How often the handlers below ran (a cycle of handlers would run them without end).
static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// The disposition the chaining handler found (ours) and passes faults on to.
static mut SAVED: core::mem::MaybeUninit<libc::sigaction> = core::mem::MaybeUninit::zeroed();

/// A well-behaved chaining handler installed after ours, as UCX or Python's faulthandler
/// would be: it passes every fault to the handler it found.
extern "C" fn chaining_handler(
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    ctx: *mut libc::c_void,
) {
    use std::sync::atomic::Ordering;
    // Every call counts (nested or one after the other): a few are expected, a cycle of
    // handlers is not.
    if CALLS.fetch_add(1, Ordering::SeqCst) > 20 {
        // SAFETY: _exit is async-signal-safe.
        unsafe { libc::_exit(77) }
    }
    // SAFETY: SAVED was written before this handler was installed and never changes after.
    let saved = unsafe { (*core::ptr::addr_of!(SAVED)).assume_init() };
    // SAFETY: the handler found was installed with SA_SIGINFO (it is ours).
    let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
        unsafe { core::mem::transmute(saved.sa_sigaction) };
    f(sig, info, ctx);
}

/// Installs `handler` (SA_SIGINFO) for SIGSEGV, saving the disposition it replaces in SAVED.
fn install_over(handler: usize) {
    let old = set_disposition(libc::SIGSEGV, handler, libc::SA_SIGINFO);
    // SAFETY: the child is single-threaded here; the handlers read SAVED only after a fault
    // that comes later.
    unsafe { (*core::ptr::addr_of_mut!(SAVED)).write(old) };
}

/// Like UCX's error handler: puts back the handler it replaced, then raises the signal again
/// (after printing a backtrace, in UCX's case).
extern "C" fn restore_and_raise_handler(
    sig: libc::c_int,
    _: *mut libc::siginfo_t,
    _: *mut libc::c_void,
) {
    use std::sync::atomic::Ordering;
    if CALLS.fetch_add(1, Ordering::SeqCst) > 20 {
        // SAFETY: _exit is async-signal-safe.
        unsafe { libc::_exit(77) }
    }
    // SAFETY: SAVED was written before this handler was installed; sigaction and raise are
    // async-signal-safe.
    unsafe {
        libc::sigaction(
            sig,
            (*core::ptr::addr_of!(SAVED)).as_ptr(),
            core::ptr::null_mut(),
        );
        libc::raise(sig);
    }
}

#[test]
fn handlers_installed_after_ours_neither_hide_our_faults_nor_loop() {
    let what = std::env::var(CHILD);
    match what.as_deref() {
        Ok(w @ ("chain" | "restore" | "restore-under")) => {
            let table = MrTable::new(8, 1);
            let pd = table.alloc_pd();
            let p = map(2 * PAGE);
            let key = register(&table, pd, p, 2 * PAGE);
            let handler = if w == "chain" {
                chaining_handler as *const () as usize
            } else {
                restore_and_raise_handler as *const () as usize
            };
            install_over(handler);
            assert!(!roce_mr::unmapped_guard_on_top());
            unmap(p, 2 * PAGE);
            // With the other handler on top, a guarded fault still ends in our fixup: through
            // the chain, or through the signal it raises where the fault was.
            let mut b = [0u8; 8];
            assert_eq!(table.read(key, 8, &mut b), Err(AccessError::Unmapped));
            if w != "restore-under" {
                // The next registration puts ours back on top (the restoring handler already
                // did), and faults are recovered directly.
                let q = map(PAGE);
                let _key2 = register(&table, pd, q, PAGE);
                assert!(roce_mr::unmapped_guard_on_top());
                assert_eq!(table.read(key, 8, &mut b), Err(AccessError::Unmapped));
            }
            if w == "restore-under" {
                // Ours on top of a handler that puts ours back and raises: an ordinary fault
                // must still end.
                install_over(restore_and_raise_handler as *const () as usize);
                let q = map(PAGE);
                let _key2 = register(&table, pd, q, PAGE);
                assert!(roce_mr::unmapped_guard_on_top());
            }
            // An ordinary fault ends the process by SIGSEGV, not in a cycle of handlers.
            // SAFETY: none: this write to an unmapped page is the fault under test.
            unsafe { core::ptr::write_volatile(p, 1) };
            std::process::exit(3)
        }
        Ok(_) => return,
        Err(_) => {}
    }
    for w in ["chain", "restore", "restore-under"] {
        let status = child(
            "handlers_installed_after_ours_neither_hide_our_faults_nor_loop",
            w,
        );
        assert_eq!(status.signal(), Some(libc::SIGSEGV), "{w}: {status:?}");
    }
}

#[test]
fn a_sent_signal_that_was_ignored_stays_ignored() {
    match std::env::var(CHILD).as_deref() {
        Ok("ignored") => {
            // Ignored before our handler goes on top of it.
            set_disposition(libc::SIGBUS, libc::SIG_IGN, 0);
            let table = MrTable::new(8, 1);
            let pd = table.alloc_pd();
            let p = map(PAGE);
            let _key = register(&table, pd, p, PAGE);
            // SAFETY: plain libc call.
            unsafe { libc::raise(libc::SIGBUS) };
            std::process::exit(5)
        }
        Ok(_) => return,
        Err(_) => {}
    }
    let status = child("a_sent_signal_that_was_ignored_stays_ignored", "ignored");
    assert_eq!(status.code(), Some(5), "{status:?}");
}
