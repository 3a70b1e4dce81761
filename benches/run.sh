#!/usr/bin/env bash
# Issue 7's one command: installs the peers (Debian packages libfabric-bin, ucx-utils), builds
# the runner and runs every benchmark: ours (benches/ours.cmds), the raw UDP limit and the peers,
# over loopback and a veth pair between two namespaces it creates (root needed; without root it
# runs over loopback only). About 5 minutes, bounded by --budget (default 540 s). Prints one
# table; writes benches/results/latest.{json,md}. Extra arguments go to bench-all (--help).
# Then bench-dropin: perftest on the drop-in libibverbs.so.1 vs rocectl's own tools
# (benches/results/dropin.{json,md}).
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v fi_pingpong  >/dev/null 2>&1 || need+=(libfabric-bin)
command -v ucx_perftest >/dev/null 2>&1 || need+=(ucx-utils)
command -v ip           >/dev/null 2>&1 || need+=(iproute2)
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq "${need[@]}" >/dev/null
    else
        echo "run.sh: missing ${need[*]}; run as root or: sudo apt-get install ${need[*]}" >&2
        echo "run.sh: continuing; the missing peers will show as failed" >&2
    fi
fi
args=()
[ "$(id -u)" = 0 ] || args+=(--no-veth)

# bench-all removes its namespaces itself (also on Ctrl-C); this catches a hard kill.
trap 'for ns in $(ip netns list 2>/dev/null | grep -o "^roce-bench-[0-9]*-[0-9]*-[ab]"); do
          pid=${ns#roce-bench-}; pid=${pid%%-*}; [ -d "/proc/$pid" ] || ip netns delete "$ns"; done' EXIT
# ours.cmds runs rocectl's perftest tools from $ROCECTL.
cargo build -q -p rocectl --release
export ROCECTL="$PWD/target/release/rocectl"
cargo run -q -p roce-benches --release --bin bench-all -- "${args[@]}" "$@"

# Issue 13: the unmodified perftest binaries on the drop-in libibverbs.so.1 vs rocectl's own
# write-bw/send-lat, same options, same veth pair (root; needs perftest and verbs/build-so.sh).
# Writes benches/results/dropin.{json,md}; a failure here does not undo the table above.
if [ "$(id -u)" = 0 ] && [ -f verbs/build-so.sh ]; then
    command -v ib_write_bw >/dev/null 2>&1 || {
        export DEBIAN_FRONTEND=noninteractive; apt-get install -y -qq perftest ibverbs-utils >/dev/null; }
    bash verbs/build-so.sh >/dev/null
    cargo run -q -p roce-benches --release --bin bench-dropin || echo "run.sh: bench-dropin failed" >&2
else
    echo "run.sh: skipping bench-dropin (needs root and verbs/build-so.sh)" >&2
fi
