#!/bin/sh
# Regenerates src/sys.rs from Debian 12's <infiniband/verbs.h> (libibverbs-dev 44.0-2) with
# bindgen-cli 0.73 (`cargo install bindgen-cli`, needs libclang). The generated file carries
# compile-time size/offset checks computed from the header; tests/layout.rs checks them again
# against the C compiler.
set -eu
cd "$(dirname "$0")"
printf '#include <infiniband/verbs.h>\n' > /tmp/rocectl-verbs-wrap.h
bindgen /tmp/rocectl-verbs-wrap.h \
  --allowlist-type 'ibv_.*|verbs_.*|ib_uverbs_.*' \
  --allowlist-var 'IBV_.*|VERBS_.*|IB_UVERBS_.*' \
  --use-core --default-enum-style consts --with-derive-default --no-doc-comments \
  --raw-line '#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case, missing_docs, dead_code, unreachable_pub, unsafe_op_in_unsafe_fn, clippy::all, clippy::use_self)]' \
  -o src/sys.rs -- -I/usr/include
# The workspace formats every file, this one included.
rustfmt --edition 2021 src/sys.rs
