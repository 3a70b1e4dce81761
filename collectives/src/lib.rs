//! # roce-collectives: collective communication over rocectl
//!
//! allreduce, reduce_scatter, allgather, broadcast, reduce, barrier and send/recv between the
//! ranks of a [`Communicator`], over RC queue pairs of the public transport API
//! (`roce-transport`), as NCCL, Gloo and MPI do over RDMA. Issue 15; design study
//! `shared/design/collectives.md`.
//!
//! ## Usage
//!
//! ```no_run
//! use roce_collectives::{Communicator, ReduceOp};
//!
//! // Rank, size and store from the launcher's environment (torchrun, mpirun, srun...).
//! let comm = Communicator::from_env()?;
//! let mut grad = vec![1.0f32; 1 << 20];
//! comm.allreduce_in_place(&mut grad, ReduceOp::Avg)?;
//!
//! // Non-blocking: the buffer moves in and comes back; handles finish in post order.
//! let h = comm.iallreduce(vec![comm.rank() as u64; 4], ReduceOp::Sum)?;
//! let sum: Vec<u64> = h.wait_typed()?;
//! # Ok::<(), roce_collectives::CollError>(())
//! ```
//!
//! See `examples/allreduce.rs` for a complete program (4 ranks, a gradient average).
//!
//! - **Bootstrap** ([`Bootstrap`]): `Env` reads torchrun's `MASTER_ADDR`/`MASTER_PORT`/
//!   `RANK`/`WORLD_SIZE`, Open MPI's `OMPI_COMM_WORLD_RANK`/`SIZE`, `PMI_RANK`/`PMI_SIZE` or
//!   Slurm's `SLURM_PROCID`/`SLURM_NTASKS`; under MPI, PMI or Slurm the store comes from
//!   `MASTER_ADDR`/`MASTER_PORT` or `ROCECTL_COLL_STORE=tcp:HOST:PORT|file:PATH`. `Tcp` (rank
//!   0 serves the store), `File` (a shared directory) and `Callback` (your own allgather of
//!   byte blobs) are also available. Ranks exchange their GID, service address and, per peer,
//!   QPNs, first PSNs and the address and rkey of the receive slots they hold for it.
//! - **Options** ([`CommOptions`], also from `ROCECTL_COLL_*` variables): the timeout
//!   (default 60 s), the algorithm ([`Algorithm`]: `Auto` picks recursive doubling up to 64
//!   KiB, the pipelined ring above; `HalvingDoubling` is Rabenseifner; `Direct` one round of
//!   whole vectors; [`Communicator::allreduce_algorithm`] tells which runs), the chunk (512 KiB),
//!   slots (8) and QPs per peer (1), the deterministic mode, busy polling, and which device
//!   ([`DeviceChoice`]: by default the local address that routes to the store; each rank its
//!   own `127.0.0.(rank+1)` when the store is on loopback, as a `udp` device holds its port
//!   4791 alone unless the rocectl daemon shares it).
//! - **Types and operators**: [`DataType`] × [`ReduceOp`] with nccl-tests' names; `avg` is
//!   a sum divided once by the rank count at the end (integer division on integers).
//! - **In place** variants take one buffer (`allreduce_in_place_raw`; for reduce_scatter and
//!   allgather the rank's block sits at `rank · len / size`, as NCCL's in-place layout).
//!
//! ## Data path
//!
//! One device per communicator, one protection domain and CQ, `qps_per_peer` RC QPs to every
//! peer and `slots × chunk` bytes of registered receive slots per peer. The protocol is
//! receiver-driven as NCCL's net_ib: a sender writes a chunk (one RDMA WRITE WITH IMMEDIATE
//! carrying its length) only into a slot the receiver has granted; the receiver grants the
//! slot again once it has copied or reduced the chunk out, on the next chunk it sends that
//! peer (the immediate carries the credits), or when none is about to leave, in a zero-length
//! SEND WITH IMMEDIATE (the clear-to-send) per half of the slots. Chunks of 16 KiB and more go straight from the operation's buffer
//! (registered in place for the phase, so no copy into the work request; a phase ends once
//! they have completed, so the buffer is never overwritten under a WRITE) and the receiver
//! reduces or copies straight out of the slot (its own memory, registered in place). Details
//! in the `net` module's source. Collectives are plans of
//! transfer phases with chunk-level dependencies, so a ring forwards each chunk as soon as
//! it is reduced (the pipeline overlaps sending, receiving and reducing).
//!
//! Waiting blocks on the completion queue by default (fair on shared, oversubscribed hosts),
//! after polling it for at most [`DEFAULT_SPIN`] (50 µs) where every rank on the host has a
//! CPU of its own ([`Spin`]: a wake-up costs more than a small operation on some hosts);
//! [`CommOptions::busy_poll`] spins instead.
//!
//! ## Results
//!
//! Every element's final value is computed once (by one rank, then copied to the others) or
//! in the same canonical order everywhere (recursive doubling combines the lower half's
//! partial result first), so **all ranks get bit-identical results**. Across algorithms,
//! sizes and chunkings the order of a floating-point reduction can differ; with
//! [`CommOptions::deterministic`] every element is reduced as `((x0 op x1) op x2) … op
//! x(n−1)` whatever the size, chunk and algorithm. Its cost: a direct reduce-scatter
//! (every rank sends each block straight to its owner: n−1 messages instead of a ring's
//! pipelined steps), a temporary of n × size/n bytes on each rank, and no overlap of the
//! reduction with the arrival of data (the owner folds once all contributions are in); then
//! a ring allgather. The bytes on the wire are those of the ring.
//!
//! ## Failure model
//!
//! - **Nothing blocks forever.** Every call fails with [`CollError::Timeout`] after the
//!   communicator's timeout, or the one given for a call by [`Communicator::with_timeout`]
//!   (`comm.with_timeout(d).allreduce(..)`); `init` fails the same way, naming the ranks that
//!   never arrived. Errors name this rank, the phase (`allreduce/ring`, `allreduce/rd step
//!   1`, `bootstrap exchange…`) and where one is to blame the peer.
//! - **Abort.** [`Communicator::abort`] (or an [`AbortHandle`] on any thread) fails this
//!   rank's pending and future operations at once and every other rank's within a second
//!   with [`CollError::Aborted`] naming the aborting rank.
//! - **Dead ranks.** Each rank runs a small TCP service; every member of a communicator keeps
//!   a connection to rank 0's. A process that dies has its sockets closed by the kernel, and
//!   rank 0's service tells everyone at once ([`CollError::PeerFailed`]); if rank 0 itself
//!   dies, every rank sees its connection break. Measured in the tests: under 30 ms. A QP
//!   whose peer stops answering errs after its retries (ACK timeout 4.096 µs · 2^14 ≈ 67 ms,
//!   7 retries: about half a second), which also marks the peer failed. A host that
//!   vanishes without closing its sockets (or whose packets are all dropped) is found that
//!   way, or by the heartbeats every member sends rank 0's service over UDP (100 ms apart; 3 s
//!   of silence is a failure, long enough that a rank starved of CPU is not taken for a dead
//!   one: see the `service` module), or by the operation timeout.
//!   After a failure every operation of the communicator fails: call
//!   [`Communicator::shrink`] with [`Communicator::failed_ranks`] to go on without them.
//! - A closed rank (its communicator dropped) says goodbye: not a failure. If rank 0 leaves
//!   while others go on, they lose the monitor (no more dead-rank notices) but keep working.
//! - **Closing** is a handshake: dropping a communicator (after its posted operations
//!   finish) sends every peer a FIN behind the last data on each QP and keeps the QPs until
//!   each is acknowledged, the peer has closed too, or the peer is known dead (its QP errs
//!   in about half a second), bounded by the communicator's timeout (after a failure or an
//!   abort there is no handshake: every rank's operations fail anyway). So a rank may drop its
//!   communicator right after its last operation, even on a lossy link, without cutting a
//!   peer off from its last packets; and a rank still waiting for data from a peer that has
//!   closed fails at once ([`CollError::PeerFailed`], "closed its communicator").
//! - No panics, no process aborts: bad arguments are [`CollError::InvalidArgument`] /
//!   [`CollError::Unsupported`]; mismatched arguments across ranks (different lengths) are
//!   detected as a protocol error on the chunk lengths where they show.
//!
//! Module map:
//!
//! - [`dtype`]: the element types and reduction operators, with nccl-tests' names;
//! - [`reduce`]: the reduction kernels over byte slices (every type × operator);
//! - [`error`]: [`CollError`], typed errors that name the rank and the phase;
//! - [`options`]: [`CommOptions`], [`Algorithm`], [`DeviceChoice`].

mod algo;
mod bootstrap;
mod codec;
mod comm;
pub mod dtype;
pub mod error;
mod net;
pub mod options;
mod pinned;
pub mod reduce;
mod service;
mod status;

pub use bootstrap::{Bootstrap, ExchangeFn};
pub use comm::{AbortHandle, CallScope, Communicator, Handle};
pub use dtype::{DataType, Element, ReduceOp};
pub use error::CollError;
pub use options::{Algorithm, CommOptions, DeviceChoice, DeviceConfigFn, Spin, DEFAULT_SPIN};
