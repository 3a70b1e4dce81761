//! Small OS wrappers: an `eventfd` for wakeups and completion notifications, and the one
//! way this crate takes a mutex.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Mutex, MutexGuard};

/// Locks `m`, ignoring poisoning: every value behind this crate's mutexes stays consistent
/// between statements (counters, queues, an engine whose pass a panic interrupted), so a
/// panic on another thread is no reason to stop the device.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Registers `f` to run when the process calls `exit` (`atexit(3)`); false if it could not
/// be registered. `f` must not unwind.
pub(crate) fn at_exit(f: extern "C" fn()) -> bool {
    #[allow(unsafe_code)]
    // SAFETY: atexit takes a plain function pointer with no arguments and keeps it; `f` is a
    // `fn` item (lives for the whole program).
    let r = unsafe { libc::atexit(f) };
    r == 0
}

/// A close-on-exec duplicate of `raw` (`F_DUPFD_CLOEXEC`), owned by the caller.
///
/// # Errors
/// `raw` is not open, or no descriptor is free.
pub(crate) fn dup_fd(raw: RawFd) -> io::Result<OwnedFd> {
    #[allow(unsafe_code)]
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) takes no pointers and only reads `raw`; a closed `raw`
    // is an EBADF error, not undefined behaviour.
    let fd = unsafe { libc::fcntl(raw, libc::F_DUPFD_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    #[allow(unsafe_code)]
    // SAFETY: `fd` was just returned by fcntl and is not owned elsewhere.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A non-blocking Linux `eventfd`: readable while notified.
#[derive(Debug)]
pub(crate) struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    /// A new, un-notified eventfd (non-blocking, close-on-exec).
    pub(crate) fn new() -> io::Result<Self> {
        #[allow(unsafe_code)]
        // SAFETY: eventfd takes no pointers; a negative return is an error, otherwise the fd
        // is fresh and owned by nobody else.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        #[allow(unsafe_code)]
        // SAFETY: `fd` was just returned by eventfd and is not owned elsewhere.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self { fd })
    }

    /// Makes the descriptor readable (adds 1 to the counter).
    pub(crate) fn notify(&self) {
        let one: u64 = 1;
        #[allow(unsafe_code)]
        // SAFETY: writes 8 bytes from a live local u64 to an fd we own. A full counter
        // (EAGAIN) already means "notified", so the result is ignored.
        let _ = unsafe {
            libc::write(
                self.fd.as_raw_fd(),
                (&one as *const u64).cast::<libc::c_void>(),
                8,
            )
        };
    }

    /// Clears the notification; returns whether there was one.
    pub(crate) fn drain(&self) -> bool {
        let mut value: u64 = 0;
        #[allow(unsafe_code)]
        // SAFETY: reads 8 bytes into a live local u64 from an fd we own.
        let n = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                (&mut value as *mut u64).cast::<libc::c_void>(),
                8,
            )
        };
        n == 8 && value > 0
    }

    /// Waits until notified or `timeout` passes; returns whether it was notified (the
    /// notification is not consumed).
    pub(crate) fn wait(&self, timeout: std::time::Duration) -> bool {
        wait_readable(self.fd.as_raw_fd(), timeout)
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Waits until `fd` is readable or `timeout` passes (rounded up to whole milliseconds).
pub(crate) fn wait_readable(fd: RawFd, timeout: std::time::Duration) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32;
    #[allow(unsafe_code)]
    // SAFETY: one live, initialised pollfd; nfds = 1.
    let n = unsafe { libc::poll(&mut pfd, 1, ms) };
    n > 0 && pfd.revents & libc::POLLIN != 0
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn eventfd_notifies_and_drains() {
        let e = EventFd::new().unwrap();
        assert!(!e.wait(Duration::from_millis(1)));
        assert!(!e.drain());
        e.notify();
        e.notify();
        assert!(e.wait(Duration::from_millis(100)));
        assert!(e.drain());
        assert!(!e.drain());
    }
}
