//! The verbs objects, one module each: protection domains (`pd`), memory regions (`mr`),
//! completion queues (`cq`), shared receive queues (`srq`) and queue pairs (`qp`). All
//! are `Send + Sync` and cheap to share; each keeps its device open, and each is destroyed
//! when dropped (`ibv_dereg_mr`, `ibv_destroy_qp`...).
//!
//! Each module also adds the [`crate::Device`] or [`ProtectionDomain`] method that creates its
//! object (`Device::create_cq` lives in `cq.rs`), so the device module does not depend on the
//! objects built on it.

mod cq;
mod mr;
mod pd;
#[cfg(test)]
pub(crate) use pd::testing;
mod qp;
mod srq;

pub use cq::CompletionQueue;
pub use mr::MemoryRegion;
pub use pd::ProtectionDomain;
pub use qp::{ConnectOptions, QpInit, QueuePair, RemoteQp, RemoteQpParseError};
pub use srq::SharedReceiveQueue;
