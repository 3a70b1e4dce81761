//! `wire_roundtrip`: whatever parses re-emits into exactly `buffer_len` bytes and parses back
//! to the same representation.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| roce_fuzz::wire_roundtrip(data));
