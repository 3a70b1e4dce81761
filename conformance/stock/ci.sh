#!/usr/bin/env bash
# Issue 13's proof, as .ci/run calls it: unmodified Debian binaries on rocectl's drop-in
# libibverbs.so.1. Builds rocectl and the drop-in (verbs/build-so.sh), then runs
#   conformance/tests/stock_tools.rs   ibv_*_pingpong and perftest over a veth pair: both ends on
#                                      the drop-in (pairing 1), and against rocectl's own tools
#                                      in both directions (pairing 3);
#   conformance/tests/pyverbs_suite.rs rdma-core v44's own tests with Debian's python3-pyverbs.
#   conformance/tests/ucx.rs           UCX ucx_perftest and Open MPI (pml ucx) across two namespaces.
# Each rewrites its section of conformance/README.md (the UCX one: conformance/UCX.md by hand);
# all run even when one fails.
# (Pairing 2, against Linux rdma_rxe, runs in conformance/lab/ci.sh.)
#
# Needs root (network namespaces). Installs ibverbs-utils, perftest and python3-pyverbs with
# apt-get when missing. Exit status: 0 pass, 1 a case failed, 77 a prerequisite is missing.
# ROCE_DROPIN_CASES / ROCE_PYVERBS_FILES filter (see the tests' docs).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "$(id -u)" != 0 ]; then
  echo "conformance/stock/ci.sh: must run as root (ip netns, veth)" >&2
  exit 77
fi
need=()
command -v ibv_rc_pingpong >/dev/null 2>&1 || need+=(ibverbs-utils)
command -v ib_send_bw >/dev/null 2>&1 || need+=(perftest)
/usr/bin/python3 -c 'import pyverbs.device' >/dev/null 2>&1 || need+=(python3-pyverbs)
command -v ucx_perftest >/dev/null 2>&1 || need+=(ucx-utils)
command -v mpicc >/dev/null 2>&1 || need+=(openmpi-bin libopenmpi-dev)
if [ ${#need[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi
if [ ! -f verbs/build-so.sh ]; then
  echo "conformance/stock/ci.sh: verbs/build-so.sh is missing: cannot build the drop-in" >&2
  exit 77
fi
start=$(date +%s)
cargo build --release --locked -p rocectl
bash verbs/build-so.sh
status=0
ROCE_DROPIN=1 cargo test --release --locked -p roce-conformance --test stock_tools \
  -- --nocapture || status=1
ROCE_DROPIN=1 cargo test --release --locked -p roce-conformance --test pyverbs_suite \
  -- --nocapture || status=1
# The next tier: UCX 1.13 (rc_verbs, ud_verbs) and Open MPI's pml ucx (conformance/UCX.md).
ROCE_DROPIN=1 cargo test --release --locked -p roce-conformance --test ucx \
  -- --nocapture || status=1
ROCE_DROPIN=1 cargo test --release --locked -p roce-conformance --test dropin_daemon \
  -- --nocapture || status=1
echo "conformance/stock/ci.sh: done in $(( $(date +%s) - start ))s (status $status)"
exit $status
