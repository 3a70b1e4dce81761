#!/usr/bin/env bash
# The live interop suite against Linux rdma_rxe (shared/lab/rxe), as .ci/run calls it.
#
# Needs root and /dev/net/tun; installs what it needs with apt-get (shared/lab/rxe/host-deps.sh:
# qemu-system-x86 tcpdump tshark kmod cpio binutils python3 iproute2 nftables), downloads the
# guest's Debian packages once (~86 MB, cached in $ROCE_LAB_CACHE, default
# /var/tmp/roce-lab-cache), builds rocectl and the drop-in libibverbs.so.1 (verbs/build-so.sh),
# boots one qemu/TCG guest per pass and runs conformance/tests/lab_interop.rs: IPv4, IPv6 + MTU
# 9000, then the IPv4 rows again with every host-side process going through `rocectl daemon`
# (kernel demux, then forwarding; ROCE_LAB_DAEMON=0 leaves those two passes out).
# Exit status: 0 pass, 1 a case failed, 77 a prerequisite is missing.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "$(id -u)" != 0 ]; then
  echo "conformance/lab/ci.sh: must run as root (ip netns, tap devices, tcpdump)" >&2
  exit 77
fi
if [ ! -c /dev/net/tun ]; then
  echo "conformance/lab/ci.sh: /dev/net/tun is missing (qemu's tap networking needs it)" >&2
  exit 77
fi
start=$(date +%s)
cargo build --release --locked -p rocectl
# Pairing 2 of issue 13 (the dropin_ rows): the stock binaries on rocectl's drop-in
# libibverbs.so.1 against rdma_rxe. Without the library those rows are skipped (a failure in CI).
if [ -f verbs/build-so.sh ]; then
  bash verbs/build-so.sh
fi
ROCE_LAB=1 cargo test --release --locked -p roce-conformance --test lab_interop -- --nocapture
echo "conformance/lab/ci.sh: live interop suite done in $(( $(date +%s) - start ))s"
