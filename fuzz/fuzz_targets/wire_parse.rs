//! `wire_parse`: any bytes through every wire parser, then `Display`; must never panic.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| roce_fuzz::wire_parse(data));
