//! Typed errors of the collectives library: every failure names the rank that saw it and the
//! phase it was in, and, where one is to blame, the peer.

use std::time::Duration;

use crate::dtype::{DataType, ReduceOp};

/// Why a collective, or setting up a communicator, failed.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CollError {
    /// An argument is invalid (lengths that do not match, a root out of range…).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The operator is not defined on the type (bitwise operators on floats).
    #[error("{op} is not defined on {dtype}")]
    Unsupported {
        /// The element type.
        dtype: DataType,
        /// The operator.
        op: ReduceOp,
    },
    /// Nothing completed within the timeout.
    #[error("rank {rank}: timed out after {after:?} in {phase}{}", peer_suffix(*.peer))]
    Timeout {
        /// The rank that timed out.
        rank: usize,
        /// The peer it was waiting for, when one.
        peer: Option<usize>,
        /// The phase (for example `"allreduce/ring reduce-scatter step 2"`).
        phase: String,
        /// The timeout that expired.
        after: Duration,
    },
    /// A peer failed (its connection broke, its process died, or it reported a failure).
    #[error("rank {rank}: peer rank {peer} failed in {phase}: {reason}")]
    PeerFailed {
        /// The rank that saw it.
        rank: usize,
        /// The failed peer.
        peer: usize,
        /// The phase.
        phase: String,
        /// What was seen.
        reason: String,
    },
    /// The communicator was aborted (on this rank, or by another rank).
    #[error("rank {rank}: communicator aborted (by rank {by_rank}) in {phase}")]
    Aborted {
        /// The rank that saw it.
        rank: usize,
        /// The rank that called `abort`.
        by_rank: usize,
        /// The phase.
        phase: String,
    },
    /// Finding the other ranks failed (store unreachable, inconsistent sizes, environment).
    #[error("bootstrap: {0}")]
    Bootstrap(String),
    /// The transport refused an operation (device, QP or memory registration).
    #[error("rank {rank}: transport: {what}")]
    Transport {
        /// The rank that saw it.
        rank: usize,
        /// What failed.
        what: String,
    },
}

fn peer_suffix(peer: Option<usize>) -> String {
    peer.map(|p| format!(" (waiting for rank {p})"))
        .unwrap_or_default()
}
