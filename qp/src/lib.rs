//! # roce-qp: sans-IO queue pairs
//!
//! The RC, UC and UD transports as pure state machines in the style of quinn-proto: time and
//! packets go in, packets, timer deadlines and completions come out. No sockets, threads or
//! clocks inside, so every behaviour can be driven and replayed exactly (the `testing` feature
//! adds `testing`, the deterministic lossy network that drives them in tests).
//!
//! - [`verbs`]: the object model (work requests, completions, address handles, QP types and
//!   states), names and numbers from rdma-core's `verbs.h`;
//! - [`state`]: the QP state table and the attributes each transition needs;
//! - [`QueuePair`]: one QP; the RC requester, completer and responder live in `rc/` like rxe's
//!   `rxe_req.c`, `rxe_comp.c` and `rxe_resp.c`; UD in `ud.rs`;
//! - [`cq`]: completion queues and shared receive queues;
//! - [`Mem`]: the adapter onto `roce-mr`'s key table: every local and remote access goes
//!   through its single checked entry point;
//! - [`fault`]: the one fault model of simulated links (loss, burst loss, duplication,
//!   reordering, corruption, delay) and the seeded RNG, shared by `testing` and by the
//!   transport's fault injector.
//!
//! ## Example: two RC queue pairs, one RDMA WRITE
//!
//! ```
//! use roce_qp::testing::{Pair, PairConfig};
//! use roce_qp::verbs::{QpType, SendOp, SendWr, WcStatus};
//!
//! let mut pair = Pair::new(PairConfig::new(QpType::Rc, 1));
//! let src = pair.a.register(b"hello, rdma");
//! let dst = pair.b.register(&[0u8; 11]);
//! let wr = SendWr::new(7, SendOp::RdmaWrite { remote_addr: dst.addr, rkey: dst.rkey() },
//!                      vec![src.sge(0, 11)]);
//! pair.a.qp.post_send(pair.now, wr).unwrap();
//! pair.drive_bounded(10_000);
//! let done = pair.a.send_completions();
//! assert_eq!(done[0].wr_id, 7);
//! assert_eq!(done[0].status, WcStatus::Success);
//! assert_eq!(pair.b.read(&dst), b"hello, rdma");
//! ```

mod config;
mod ctx;
mod mem;
mod qp;
mod rc;
mod stats;
mod time;
mod timer;
mod ud;
mod wq;

pub mod cq;
pub mod fault;
pub mod state;
#[cfg(feature = "testing")]
pub mod testing;
pub mod verbs;

pub use config::DEFAULT_EARLY_RETRANSMIT_MIN_NS;
pub use mem::{AtomicOp, Mem};
pub use qp::{udp_sport_for, Event, PostError, QpConfig, QpStats, QueuePair, RecvMeta, Transmit};
pub use time::Instant;
pub use timer::{Timer, TimerTable};
pub use ud::GRH_LEN;
