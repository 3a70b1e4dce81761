//! The C boundary: the panic guard every entry point runs under, errno, and the error mapping.
//!
//! Rules for every `extern "C"` function in this crate:
//! - its body runs inside [`guard`] (or [`guard_ptr`] / [`guard_int`]), so a panic never
//!   unwinds into C: it is logged once to stderr and turned into the verb's error return;
//! - `int` verbs return 0 or a positive errno value (rdma-core's convention), pointer verbs
//!   return NULL with `errno` set, `ibv_poll_cq` returns a count or a negative value;
//! - a NULL or foreign handle is never dereferenced without the check the verb's man page
//!   implies; records are recovered with the `from_*` helpers of their modules.

use std::panic::{catch_unwind, AssertUnwindSafe};

use roce_transport::{OpenError, PostError, VerbsError};

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(e: i32) {
    // SAFETY: `__errno_location` returns the calling thread's errno slot, valid for the
    // thread's life.
    unsafe { *libc::__errno_location() = e };
}

/// Runs `f`; a panic is reported on stderr and becomes `on_panic` (with `errno = EIO`).
pub(crate) fn guard<T>(verb: &str, on_panic: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            eprintln!("rocectl libibverbs: internal error in {verb} (a bug; please report it)");
            set_errno(libc::EIO);
            on_panic
        }
    }
}

/// [`guard`] for `int`-returning verbs: `Ok(())` is 0, `Err(e)` is the errno value `e`
/// (also stored in `errno`, as rdma-core does for most verbs).
pub(crate) fn guard_int(verb: &str, f: impl FnOnce() -> Result<(), i32>) -> i32 {
    guard(verb, libc::EIO, || match f() {
        Ok(()) => 0,
        Err(e) => {
            set_errno(e);
            e
        }
    })
}

/// [`guard`] for pointer-returning verbs: `Err(e)` is NULL with `errno = e`.
pub(crate) fn guard_ptr<T>(verb: &str, f: impl FnOnce() -> Result<*mut T, i32>) -> *mut T {
    guard(verb, std::ptr::null_mut(), || match f() {
        Ok(p) => p,
        Err(e) => {
            set_errno(e);
            std::ptr::null_mut()
        }
    })
}

/// The errno value for a verbs error of the Rust API.
pub(crate) fn errno_of_verbs(e: &VerbsError) -> i32 {
    match e {
        VerbsError::NoSuchGid { .. } | VerbsError::BadCqDepth(_) => libc::EINVAL,
        VerbsError::MtuTooLarge { .. } => libc::EINVAL,
        VerbsError::WrongDevice(_) => libc::EINVAL,
        VerbsError::Modify(_) => libc::EINVAL,
        VerbsError::Register(roce_transport::RegisterError::TableFull) => libc::ENOMEM,
        VerbsError::Register(_) => libc::EINVAL,
        VerbsError::DaemonRefused(c) => errno_of_refusal(c),
        VerbsError::Io(io) => io.raw_os_error().unwrap_or(libc::EIO),
        _ => libc::EINVAL,
    }
}

/// The errno value for a request the rocectl daemon refused: a limit or an exhausted QPN space
/// is `ENOMEM`, as a NIC out of resources answers `ibv_create_qp`; a policy refusal `EPERM`;
/// a protocol mismatch `EPROTO`; the rest `EIO`.
pub(crate) fn errno_of_refusal(e: &roce_transport::control::ControlError) -> i32 {
    use roce_transport::control::ControlError as C;
    match e {
        C::LimitExceeded { .. } | C::NoFreeRange { .. } => libc::ENOMEM,
        C::Forbidden { .. } => libc::EPERM,
        C::VersionMismatch { .. } => libc::EPROTO,
        C::NotImplemented { .. } => libc::EOPNOTSUPP,
        _ => libc::EIO,
    }
}

/// The errno value for a failed post (`ibv_post_send(3)`: EINVAL, ENOMEM, EFAULT).
pub(crate) fn errno_of_post(e: &PostError) -> i32 {
    match e {
        PostError::QueueFull => libc::ENOMEM,
        _ => libc::EINVAL,
    }
}

/// The errno value for a device that failed to open.
pub(crate) fn errno_of_open(e: &OpenError) -> i32 {
    match e {
        OpenError::AddrInUse { .. } => libc::EADDRINUSE,
        OpenError::AddrNotAvailable { .. } => libc::EADDRNOTAVAIL,
        OpenError::NoSuchInterface { .. } => libc::ENODEV,
        OpenError::NoRawPermission => libc::EPERM,
        OpenError::Unsupported(_) => libc::EOPNOTSUPP,
        // The daemon's socket exists but it does not answer, or refuses the device.
        OpenError::Daemon { .. } => libc::EIO,
        OpenError::Io(io) => io.raw_os_error().unwrap_or(libc::EIO),
        _ => libc::EINVAL,
    }
}

/// Logs one line to stderr when `ROCECTL_VERBS_TRACE` is set (checked once per process).
pub(crate) fn trace(args: std::fmt::Arguments<'_>) {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *ON.get_or_init(|| std::env::var_os("ROCECTL_VERBS_TRACE").is_some()) {
        eprintln!("rocectl libibverbs: {args}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use roce_transport::control::{ControlError, Resource, Scope};

    #[test]
    fn daemon_refusals_map_to_the_errno_a_nic_would_give() {
        let limit = ControlError::LimitExceeded {
            resource: Resource::Qps,
            scope: Scope::Client,
            limit: 2,
            in_use: 2,
            requested: 1,
        };
        assert_eq!(
            errno_of_verbs(&VerbsError::DaemonRefused(limit)),
            libc::ENOMEM
        );
        let forbidden = ControlError::Forbidden {
            reason: "another uid".into(),
        };
        assert_eq!(
            errno_of_verbs(&VerbsError::DaemonRefused(forbidden)),
            libc::EPERM
        );
        assert_eq!(
            errno_of_verbs(&VerbsError::Register(
                roce_transport::RegisterError::TableFull
            )),
            libc::ENOMEM
        );
    }
}
