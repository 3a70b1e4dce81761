#!/usr/bin/env bash
# Installs what the tests and tools need on a fresh Debian machine. Idempotent; needs root for
# apt (CI runs as root).
#   tshark    Wireshark's dissector: checks that our captures decode as RoCE
#   iproute2  `ip netns`/veth for the two-namespace integration tests
#   tcpdump ethtool  what is on the wire of a veth, and its offloads switched off
#             (transport/tests/gso.rs and others; a fresh machine has neither)
#   nftables  kernel packet loss (numgen random) for the lossy-network tests
#   python3   the fake pingpong peers of bin/tests/pingpong_errors.rs (a test fails in CI
#             without it, by the test kit's skip policy)
#   ibverbs-utils perftest libibverbs-dev python3-pyverbs
#             issue 13: the stock binaries run on the drop-in libibverbs.so.1
#             (conformance/stock/ci.sh) and rdma-core 44's verbs.h for the verbs crate's tests
set -euo pipefail
need=()
command -v tshark >/dev/null 2>&1 || need+=(tshark)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v tcpdump >/dev/null 2>&1 || need+=(tcpdump)
command -v ethtool >/dev/null 2>&1 || [ -x /usr/sbin/ethtool ] || need+=(ethtool)
command -v nft >/dev/null 2>&1 || need+=(nftables)
command -v python3 >/dev/null 2>&1 || need+=(python3)
command -v ibv_rc_pingpong >/dev/null 2>&1 || need+=(ibverbs-utils)
command -v ib_send_bw >/dev/null 2>&1 || need+=(perftest)
[ -f /usr/include/infiniband/verbs.h ] || need+=(libibverbs-dev)
/usr/bin/python3 -c 'import pyverbs.device' >/dev/null 2>&1 || need+=(python3-pyverbs)
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
