#!/usr/bin/env bash
# The main job: builds rocectl and runs it on the real Linux Soft-RoCE captures in
# ../shared/captures: every RoCEv2 frame is parsed, its ICRC verified and re-emitted
# byte for byte. No root, no second host.
set -euo pipefail
cd "$(dirname "$0")/.."
shared="${ROCE_SHARED_DIR:-../shared}"
cargo build --release -q -p rocectl
./target/release/rocectl pcap check "$shared"/captures/*.pcap
./target/release/rocectl pcap dump "$shared"/captures/ib_atomic_bw_fadd.pcap | grep -E "FETCH_ADD|ATOMIC" | head -4
