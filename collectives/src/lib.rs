//! # roce-collectives: collective communication over rocectl
//!
//! allreduce, reduce_scatter, allgather, broadcast, reduce, barrier and send/recv between the
//! ranks of a communicator, over RC queue pairs of the public transport API
//! (`roce-transport`), as NCCL, Gloo and MPI do over RDMA. Issue 15; design study
//! `shared/design/collectives.md`.
//!
//! Module map (one owner each while the crate is being built):
//!
//! - [`dtype`]: the element types and reduction operators, with nccl-tests' names;
//! - [`reduce`]: the reduction kernels over byte slices (every type × operator);
//! - [`error`]: [`CollError`], typed errors that name the rank and the phase.
//!
//! The communicator, bootstrap (environment, TCP store, file store, callback), the data
//! protocol and the algorithms are added next to these.

pub mod dtype;
pub mod error;
pub mod reduce;

pub use dtype::{DataType, Element, ReduceOp};
pub use error::CollError;
