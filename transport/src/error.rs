//! Errors of the public API.

use std::io;
use std::net::SocketAddr;

/// Why a device could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// Another program (a RoCE stack, another rocectl) already uses the address and port.
    #[error("{addr} is already in use (another RoCE stack or rocectl instance?): {detail}")]
    AddrInUse {
        /// The address.
        addr: SocketAddr,
        /// What the system said.
        detail: String,
    },
    /// The local address is not configured on any interface.
    #[error(
        "{ip} is not an address of this host: configure it on an interface (`ip addr add`) or \
         use one it has (`ip -br addr`)",
        ip = addr.ip()
    )]
    AddrNotAvailable {
        /// The address.
        addr: SocketAddr,
    },
    /// No interface of that name.
    #[error("no network interface named {name:?} (interfaces: {available})")]
    NoSuchInterface {
        /// The name asked for.
        name: String,
        /// The names that exist.
        available: String,
    },
    /// A GID index past the interface's GID table ([`crate::DeviceConfig::interface`]).
    #[error(
        "GID index {index} does not exist on {ifname}: its GID table has {len} entries: {table}"
    )]
    NoSuchGid {
        /// The interface.
        ifname: String,
        /// The index asked for.
        index: u8,
        /// The table's length.
        len: usize,
        /// The table, `index gid` per entry.
        table: String,
    },
    /// A GID the device cannot send from ([`crate::DeviceConfig::interface`]): its address
    /// is not configured, or it is link-local.
    #[error("GID index {index} of {ifname} ({gid}) cannot be used: {reason}")]
    UnusableGid {
        /// The interface.
        ifname: String,
        /// The index.
        index: u8,
        /// Its GID.
        gid: roce_wire::Gid,
        /// Why.
        reason: &'static str,
    },
    /// The `raw` backend needs `CAP_NET_RAW`.
    #[error(
        "the raw backend needs CAP_NET_RAW: run as root or `setcap cap_net_raw+ep` the binary"
    )]
    NoRawPermission,
    /// The path MTU asked for does not fit in the interface MTU.
    #[error("path MTU {requested} does not fit the interface MTU {ip_mtu} (largest: {max})")]
    MtuTooLarge {
        /// Requested path MTU in bytes.
        requested: usize,
        /// The interface's IP MTU.
        ip_mtu: usize,
        /// The largest path MTU that fits.
        max: usize,
    },
    /// The interface MTU is too small for RoCE (path MTU 256 needs 336 bytes).
    #[error("interface MTU {ip_mtu} is too small for RoCE (needs at least 336)")]
    InterfaceMtuTooSmall {
        /// The interface's IP MTU.
        ip_mtu: usize,
    },
    /// The capture file could not be created.
    #[error("cannot create capture file {path}: {source}")]
    Capture {
        /// The path.
        path: String,
        /// The error.
        source: io::Error,
    },
    /// The backend is not available in this build.
    #[error("{0}")]
    Unsupported(&'static str),
    /// Another backend error.
    #[error("{backend} backend: {message}")]
    Backend {
        /// Which backend.
        backend: &'static str,
        /// The message.
        message: String,
    },
    /// The rocectl daemon's socket exists but the daemon did not give this device a QPN
    /// range (not running, another protocol version, a limit).
    #[error("{detail}")]
    Daemon {
        /// The socket path.
        path: std::path::PathBuf,
        /// What went wrong, with the path.
        detail: String,
    },
    /// An OS error while setting up.
    #[error("device setup: {0}")]
    Io(#[source] io::Error),
}

/// Why a verbs call failed (nothing changed).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerbsError {
    /// A GID index past the table.
    #[error(
        "GID index {index} does not exist (the table has {len} entries; see `rocectl devinfo`)"
    )]
    NoSuchGid {
        /// The index.
        index: u8,
        /// Table length.
        len: usize,
    },
    /// A CQ depth of 0 or too large.
    #[error("CQ depth {0} is out of range (1..=1048576)")]
    BadCqDepth(usize),
    /// A CQ resized below the number of completions it holds.
    #[error("cannot resize the CQ to {depth} entries: {waiting} completions are waiting")]
    CqTooSmall {
        /// Requested depth.
        depth: usize,
        /// Completions waiting.
        waiting: usize,
    },
    /// A path MTU above the device's active MTU.
    #[error("path MTU {requested} exceeds the device's active MTU {active}")]
    MtuTooLarge {
        /// Requested.
        requested: usize,
        /// Device's.
        active: usize,
    },
    /// Objects from different devices or protection domains mixed.
    #[error("{0}")]
    WrongDevice(&'static str),
    /// The QP state machine refused the modification.
    #[error("modify QP: {0}")]
    Modify(#[from] roce_qp::state::ModifyError),
    /// The memory-region table refused a registration.
    #[error("register memory: {0}")]
    Register(#[from] roce_mr::RegisterError),
    /// The rocectl daemon refused to account the object (a per-uid or per-client limit).
    #[error("{0}")]
    DaemonRefused(crate::control::ControlError),
    /// An OS error.
    #[error("{0}")]
    Io(#[from] io::Error),
}
