//! The control plane of the per-host daemon (`rocectl daemon`): the protocol shared by the
//! daemon and its clients, and the client side.
//!
//! Several processes share one RoCE address the way they share a NIC: each keeps its own
//! engine, QPs and memory, and the daemon hands out disjoint QPN ranges, enforces limits,
//! reaps the ranges of processes that die and shows every process's objects. It is never on
//! the per-work-request path.
//!
//! - [`proto`]: the messages (one enum of requests, one of replies, a versioned hello, typed
//!   refusals), serialised as JSON;
//! - [`sys`]: framing over a Unix stream socket with descriptor passing, the peer's identity
//!   from the kernel, systemd socket activation;
//! - the client: [`Connection`] (any client, the views too) and the device's attachment,
//!   which [`crate::Device::open`] makes on its own when the daemon runs.

mod client;
pub mod proto;
pub mod sys;

pub(crate) use client::{attach, DaemonClient, Leased, Reservation};
pub use client::{
    exclusive_forced, socket_path, ClientError, Connection, DEFAULT_SOCKET, EXCLUSIVE_ENV,
    SOCKET_ENV,
};
pub use proto::{
    ClientView, ControlError, DaemonStats, Hello, Lease, Mode, MrView, Objects, QpView, Reply,
    Report, Request, Resource, Role, Scope, Welcome, MAX_REPORTED_MRS, PROTOCOL_MAJOR,
    PROTOCOL_MINOR,
};
