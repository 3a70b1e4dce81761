#!/usr/bin/env bash
# The main job, no root and no second host: builds rocectl and runs `rocectl demo`: two RDMA
# devices in one process on loopback UDP (127.0.0.1:4791 and 127.0.0.2:4791) connect RC and UD
# queue pairs and run SEND, RDMA WRITE, WRITE_WITH_IMM, READ, both atomics and UD SEND with the
# data verified, capturing every frame; then checks every frame of that capture (ICRC,
# re-emission) with `rocectl pcap check`.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p rocectl
mkdir -p target
./target/release/rocectl demo --pcap target/demo.pcap "$@"
./target/release/rocectl pcap check target/demo.pcap | tail -1
