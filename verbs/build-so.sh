#!/bin/sh
# Builds rocectl's drop-in libibverbs.so.1 (rdma-core 44's ABI) into
# $CARGO_TARGET_DIR/<profile>/rocectl-verbs/libibverbs.so.1:
#   1. cargo builds the roce-verbs crate as a static archive (libibverbs.a);
#   2. cc relinks the whole archive into a shared object with rdma-core's version script
#      (verbs/ibverbs.map), so every export carries its IBVERBS_1.x / IBVERBS_PRIVATE_34
#      version. (A cargo cdylib cannot do this: rustc's own version script wins and leaves
#      every symbol unversioned; design/verbs-abi.md, section 7.)
# No libibverbs.so symlink is made, on purpose: programs should not link against this
# library at build time, only load it in place of rdma-core's (`rocectl exec`, or
# LD_LIBRARY_PATH=<dir>).
#
#   verbs/build-so.sh [--debug]     (--debug: the dev profile, target/debug/rocectl-verbs)
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
profile=release
case "${1:-}" in
    --debug) profile=debug ;;
    "") ;;
    *) echo "usage: verbs/build-so.sh [--debug]" >&2; exit 2 ;;
esac
target=${CARGO_TARGET_DIR:-$root/target}
case "$target" in /*) ;; *) target=$root/$target ;; esac
cd "$root"
if [ "$profile" = release ]; then
    cargo build --release -p roce-verbs
else
    cargo build -p roce-verbs
fi
out=$target/$profile/rocectl-verbs
mkdir -p "$out"
# Link into a temporary name and rename: a process loading the old library never sees a
# half-written file. Debug info is kept (backtraces, gdb); -z now resolves every import at
# load time, as the programs' own BIND_NOW does.
cc -shared -o "$out/libibverbs.so.1.tmp" \
    -Wl,--whole-archive "$target/$profile/libibverbs.a" -Wl,--no-whole-archive \
    -Wl,--version-script="$root/verbs/ibverbs.map" -Wl,-soname,libibverbs.so.1 \
    -Wl,-z,now -Wl,--gc-sections -lgcc_s -lpthread -ldl -lm
mv -f "$out/libibverbs.so.1.tmp" "$out/libibverbs.so.1"
echo "built $out/libibverbs.so.1"
