//! `qp_responder`: a script of packets (and posts, timeouts, modifies) into an RC/UC QP in any
//! state; never panics, invariants hold, no completion for a WR never posted.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| roce_fuzz::qp_responder(data));
