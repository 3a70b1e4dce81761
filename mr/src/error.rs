//! Error types, one per operation.
//!
//! A failed remote check says which NAK the responder sends, in `roce-wire`'s vocabulary
//! ([`NakCode`], `../shared/spec/rocev2.md` section 7.9). Which work-completion status a
//! failure produces is the queue pairs' business (`roce_qp::verbs::WcStatus`, next to the
//! completions).

use roce_wire::aeth::NakCode;

use crate::{Access, Key};

/// Why [`MrTable::check`](crate::MrTable::check) (or an operation on its result) refused an
/// access.
///
/// Use [`responder_nak`](Self::responder_nak) for a remote request; for a local SGE the queue
/// pair completes the work request with a local status (`roce_qp`'s mapping).
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AccessError {
    /// No region or window lives at the key's index (never registered, deregistered, or the
    /// index is outside the table).
    #[error("unknown key {key}")]
    UnknownKey {
        /// The key presented.
        key: Key,
    },
    /// An object lives at the index under another 8-bit key: the key is from an earlier
    /// registration, bind or fast-reg of the index, or forged.
    #[error("stale key {key}")]
    StaleKey {
        /// The key presented.
        key: Key,
    },
    /// The key's object belongs to another protection domain than the queue pair.
    #[error("key {key} belongs to another protection domain")]
    PdMismatch {
        /// The key presented.
        key: Key,
    },
    /// The key was invalidated (LOCAL_INV, SEND_WITH_INVALIDATE), the region was never
    /// fast-registered, or the window is not bound.
    #[error("key {key} is invalidated or not bound")]
    Invalidated {
        /// The key presented.
        key: Key,
    },
    /// A type 2 memory window used by another queue pair than the one it is bound to.
    #[error("memory window {key} is bound to another queue pair")]
    QpMismatch {
        /// The key presented.
        key: Key,
    },
    /// A memory window's rkey presented as an lkey (windows are for remote access only).
    #[error("memory window {key} used as a local key")]
    WindowAsLocalKey {
        /// The key presented.
        key: Key,
    },
    /// The region or window does not grant a needed right (or the checked reference was
    /// obtained for another kind of operation).
    #[error("access {needed} not granted (granted {granted})")]
    AccessDenied {
        /// The rights the operation needs.
        needed: Access,
        /// The rights the region, window or checked reference grants.
        granted: Access,
    },
    /// `[iova, iova + len)` is not inside the region or window, or `iova + len` overflows u64.
    #[error("access [{iova:#x}, +{len:#x}) out of bounds")]
    OutOfBounds {
        /// First address of the access.
        iova: u64,
        /// Length of the access.
        len: u64,
    },
    /// An atomic whose address (IOVA or translated host address) is not 8-byte aligned.
    #[error("atomic at {iova:#x} is not 8-byte aligned")]
    Misaligned {
        /// Address of the atomic.
        iova: u64,
    },
    /// An atomic whose length is not 8 bytes.
    #[error("atomic length {len} is not 8")]
    AtomicLength {
        /// Length presented.
        len: u64,
    },
    /// The region's memory faulted: the application unmapped it while it was still
    /// registered (a NIC would have reached the pinned pages; we reach memory through its
    /// address). The access stopped at the fault; bytes before it may have been copied.
    #[error("region memory is no longer mapped")]
    Unmapped,
}

impl AccessError {
    /// The NAK a responder sends for this error on a remote request (rxe `check_rkey`, spec
    /// section 7.9): key, PD, rights and range problems are remote access errors (0x62);
    /// misaligned atomics and length errors are invalid requests (0x61).
    pub const fn responder_nak(&self) -> NakCode {
        match self {
            Self::Misaligned { .. } | Self::AtomicLength { .. } => NakCode::InvalidRequest,
            Self::UnknownKey { .. }
            | Self::StaleKey { .. }
            | Self::PdMismatch { .. }
            | Self::Invalidated { .. }
            | Self::QpMismatch { .. }
            | Self::WindowAsLocalKey { .. }
            | Self::AccessDenied { .. }
            | Self::OutOfBounds { .. }
            | Self::Unmapped => NakCode::RemoteAccessError,
        }
    }
}

/// Why a registration (register, alloc_mr, alloc_mw) or a fast registration (REG_MR) failed.
///
/// A failed fast registration completes the REG_MR work request with LOC_QP_OP_ERR (as rxe).
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegisterError {
    /// The protection domain is not allocated in this table.
    #[error("unknown protection domain")]
    UnknownPd,
    /// Every slot of the table is in use.
    #[error("memory region table is full")]
    TableFull,
    /// Access bits outside [`Access::ALL`], or REMOTE_WRITE/REMOTE_ATOMIC without LOCAL_WRITE.
    #[error("invalid access flags {access}")]
    InvalidAccess {
        /// The flags requested.
        access: Access,
    },
    /// ZERO_BASED was requested with a non-zero IOVA.
    #[error("zero-based region with non-zero iova {iova:#x}")]
    ZeroBasedIova {
        /// The IOVA requested.
        iova: u64,
    },
    /// `iova + len` overflows u64, or the range does not fit the region's allocated memory.
    #[error("range [{iova:#x}, +{len:#x}) does not fit")]
    BadRange {
        /// The IOVA requested.
        iova: u64,
        /// The length requested.
        len: u64,
    },
    /// A raw registration with a null pointer and a non-zero length.
    #[error("null pointer")]
    NullPointer,
    /// Fast registration: no region lives at the key's index.
    #[error("no memory region at key {key}")]
    UnknownKey {
        /// The key presented.
        key: Key,
    },
    /// Fast registration: the region is in another protection domain than the queue pair.
    #[error("key {key} belongs to another protection domain")]
    PdMismatch {
        /// The key presented.
        key: Key,
    },
    /// Fast registration of a region that was not allocated for it with
    /// [`MrTable::alloc_mr`](crate::MrTable::alloc_mr).
    #[error("memory region {key} is not fast-registrable")]
    NotFastReg {
        /// The key presented.
        key: Key,
    },
    /// Fast registration of a region that is still valid (invalidate it first).
    #[error("memory region {key} is still valid")]
    StillValid {
        /// The key presented.
        key: Key,
    },
    /// Re-registration of a region that memory windows are bound to.
    #[error("memory windows are bound to region {key}")]
    WindowsBound {
        /// The key presented.
        key: Key,
    },
}

/// Why deregistering a region or deallocating a window failed.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeregisterError {
    /// No object lives at the key's index.
    #[error("unknown key {key}")]
    UnknownKey {
        /// The key presented.
        key: Key,
    },
    /// The object at the index has another 8-bit key.
    #[error("stale key {key}")]
    StaleKey {
        /// The key presented.
        key: Key,
    },
    /// The key names a window where a region was expected, or the reverse.
    #[error("key {key} names the wrong kind of object")]
    WrongKind {
        /// The key presented.
        key: Key,
    },
    /// Memory windows are still bound to the region (rxe refuses too).
    #[error("memory windows are bound to region {key}")]
    WindowsBound {
        /// The key presented.
        key: Key,
    },
}

/// Why deallocating a protection domain failed.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PdError {
    /// The protection domain is not allocated in this table.
    #[error("unknown protection domain")]
    UnknownPd,
    /// Regions or windows still belong to the protection domain.
    #[error("protection domain still has {users} regions or windows")]
    Busy {
        /// How many objects still use it.
        users: u32,
    },
}

/// Why binding a memory window failed (completion status MW_BIND_ERR).
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BindError {
    /// The window key names no window (unknown, stale, or not a window).
    #[error("invalid memory window key {key}")]
    InvalidWindow {
        /// The window key presented.
        key: Key,
    },
    /// The window is in another protection domain than the queue pair, or the region is in
    /// another protection domain than the window (C10-72).
    #[error("protection domain mismatch")]
    PdMismatch,
    /// A type 2 window that is still bound (invalidate it first, o10-37.2.30).
    #[error("type 2 window is already bound")]
    AlreadyBound,
    /// A type 2 window bound with length 0 (o10-37.2.40).
    #[error("type 2 window bound with zero length")]
    ZeroLength,
    /// A type 1 window bound with ZERO_BASED (o10-36.2.2).
    #[error("type 1 window cannot be zero based")]
    ZeroBasedType1,
    /// Window access bits other than REMOTE_READ, REMOTE_WRITE, REMOTE_ATOMIC and ZERO_BASED.
    #[error("invalid window access {access}")]
    InvalidAccess {
        /// The flags requested.
        access: Access,
    },
    /// The region lkey names no valid region (unknown, stale, or not a region).
    #[error("invalid memory region key {key}")]
    InvalidRegion {
        /// The region key presented.
        key: Key,
    },
    /// The region is invalidated.
    #[error("memory region {key} is invalidated")]
    RegionInvalidated {
        /// The region key presented.
        key: Key,
    },
    /// The region is zero based (rxe refuses to bind windows to it).
    #[error("memory region is zero based")]
    RegionZeroBased,
    /// The region was not registered with MW_BIND (C10-73).
    #[error("memory region lacks MW_BIND access")]
    NoBindAccess,
    /// A writable or atomic window on a region without LOCAL_WRITE (C10-74).
    #[error("writable window on a region without LOCAL_WRITE")]
    NeedsLocalWrite,
    /// The window range is not inside the region, or overflows (C10-75).
    #[error("window [{addr:#x}, +{len:#x}) outside the region")]
    OutOfBounds {
        /// The window start requested.
        addr: u64,
        /// The window length requested.
        len: u64,
    },
}

/// Why LOCAL_INV or SEND_WITH_INVALIDATE failed.
///
/// A responder that fails SEND_WITH_INVALIDATE answers [`NakCode::InvalidRequest`] and completes
/// with REM_INV_REQ_ERR (spec section 10); a failed LOCAL_INV completes with LOC_QP_OP_ERR.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidateError {
    /// No object lives at the key's index.
    #[error("unknown key {key}")]
    UnknownKey {
        /// The key presented.
        key: Key,
    },
    /// The object at the index has another 8-bit key.
    #[error("stale key {key}")]
    StaleKey {
        /// The key presented.
        key: Key,
    },
    /// The object belongs to another protection domain than the queue pair.
    #[error("key {key} belongs to another protection domain")]
    PdMismatch {
        /// The key presented.
        key: Key,
    },
    /// A type 2 window bound to another queue pair.
    #[error("memory window {key} is bound to another queue pair")]
    QpMismatch {
        /// The key presented.
        key: Key,
    },
    /// Type 1 windows cannot be invalidated (o10-37.2.26).
    #[error("type 1 memory window {key} cannot be invalidated")]
    Type1Window {
        /// The key presented.
        key: Key,
    },
    /// Only regions allocated for fast registration can be invalidated (rxe:
    /// `IB_MR_TYPE_MEM_REG`); ordinary registrations are never invalidated by a peer.
    #[error("memory region {key} is not fast-registered")]
    NotFastReg {
        /// The key presented.
        key: Key,
    },
    /// Memory windows are bound to the region.
    #[error("memory windows are bound to region {key}")]
    WindowsBound {
        /// The key presented.
        key: Key,
    },
    /// The region is already invalid, or the window is not bound.
    #[error("key {key} is already invalid")]
    AlreadyInvalid {
        /// The key presented.
        key: Key,
    },
}

impl InvalidateError {
    /// The NAK a responder sends when SEND_WITH_INVALIDATE fails: invalid request (0x61).
    pub const fn responder_nak(&self) -> NakCode {
        NakCode::InvalidRequest
    }
}
