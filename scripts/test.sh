#!/usr/bin/env bash
# The project's test command: installs the test prerequisites, then runs every test of the
# workspace (unit, property, capture replay, CLI and tshark checks, doctests).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo test --workspace --release "$@"
