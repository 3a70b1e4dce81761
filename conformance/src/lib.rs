//! # roce-conformance: our stack against real RoCEv2 peers
//!
//! [`replay`] feeds the requests of a real capture (Linux rdma_rxe, `shared/captures/`) into our
//! RC responder and compares what we answer with what rxe answered in the same capture:
//! opcodes, PSNs, AETH syndromes, MSNs and payload lengths, packet for packet.
//!
//! [`lab`] drives the live peer of `shared/lab/rxe/` (Linux rdma_rxe in qemu) against our
//! tools, both directions, with captures checked by `shared/tools/check_pcap.sh`.

pub mod lab;
pub mod replay;
