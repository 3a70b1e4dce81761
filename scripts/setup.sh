#!/usr/bin/env bash
# Installs what the tests and tools need on a fresh Debian machine. Idempotent; needs root for
# apt (CI runs as root).
#   tshark    Wireshark's dissector: checks that our captures decode as RoCE
#   iproute2  `ip netns`/veth for the two-namespace integration tests
#   nftables  kernel packet loss (numgen random) for the lossy-network tests
#   python3   the fake pingpong peers of bin/tests/pingpong_errors.rs (a test fails in CI
#             without it, by the test kit's skip policy)
#   libibverbs-dev  rdma-core's <infiniband/verbs.h> and libibverbs.so.1, the reference the
#             verbs crate's ABI tests (verbs/tests/symbols.rs, layout.rs) compare with
set -euo pipefail
need=()
command -v tshark >/dev/null 2>&1 || need+=(tshark)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v nft >/dev/null 2>&1 || need+=(nftables)
command -v python3 >/dev/null 2>&1 || need+=(python3)
[ -e /usr/include/infiniband/verbs.h ] || need+=(libibverbs-dev)
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "setup: missing ${need[*]}; run as root or: sudo apt-get install ${need[*]}" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
fi
command -v cargo >/dev/null || { echo "setup: cargo not found (install Rust with rustup)" >&2; exit 1; }
