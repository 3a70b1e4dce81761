//! `qp_requester`: arbitrary responses into an RC requester/completer with work posted; never
//! panics, invariants hold, send completions only for posted WRs and in posting order.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| roce_fuzz::qp_requester(data));
