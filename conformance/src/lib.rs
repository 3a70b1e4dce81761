//! # roce-conformance: our stack against real RoCEv2 peers
//!
//! [`replay`] feeds the requests of a real capture (Linux rdma_rxe, `shared/captures/`) into our
//! RC responder and compares what we answer with what rxe answered in the same capture:
//! opcodes, PSNs, AETH syndromes, MSNs and payload lengths, packet for packet.
//!
//! [`stock`] and [`pyverbs`] run unmodified rdma-core, perftest and pyverbs programs on rocectl's
//! drop-in `libibverbs.so.1` (issue 13).

pub mod hostile;
pub mod lab;
pub mod pyverbs;
pub mod replay;
pub mod stock;
