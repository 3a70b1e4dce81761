//! # roce-conformance: our stack against real RoCEv2 peers
//!
//! [`replay`] feeds the requests of a real capture (Linux rdma_rxe, `shared/captures/`) into our
//! RC responder and compares what we answer with what rxe answered in the same capture:
//! opcodes, PSNs, AETH syndromes, MSNs and payload lengths, packet for packet.

pub mod hostile;
pub mod lab;
pub mod replay;
