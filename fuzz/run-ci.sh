#!/usr/bin/env bash
# Fuzzing step of CI: bounded time, non-zero exit on any crash.
#
#   fuzz/run-ci.sh                      # both harnesses, 30 s per target each
#   FUZZ_SECONDS=5 fuzz/run-ci.sh       # shorter
#   FUZZ_MODE=stable fuzz/run-ci.sh     # stable runner only (no nightly needed)
#
# Environment:
#   FUZZ_SECONDS      seconds per target and harness (default 30)
#   FUZZ_MODE         both (default): stable runner, then cargo-fuzz when nightly is there;
#                     stable: stable runner only; libfuzzer: cargo-fuzz only (fails without it)
#   FUZZ_SEED         seed of the stable runner (default: the date, printed for replay)
#   FUZZ_INSTALL      1 (default): `cargo install cargo-fuzz --locked` when nightly exists
#                     but cargo-fuzz does not; 0: never install
#   ROCE_SHARED_DIR   the shared/ directory holding captures/ (default: <repo>/../shared)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
export ROCE_SHARED_DIR="${ROCE_SHARED_DIR:-$repo/../shared}"
secs="${FUZZ_SECONDS:-30}"
mode="${FUZZ_MODE:-both}"
seed="${FUZZ_SEED:-$(date +%Y%m%d)}"
install="${FUZZ_INSTALL:-1}"
failed=()

if [ ! -d "$ROCE_SHARED_DIR/captures" ]; then
    echo "warning: no captures in $ROCE_SHARED_DIR/captures; seeding from wire samples only" >&2
fi

run_stable() {
    echo "=== stable runner: ${secs}s per target, seed $seed"
    local manifest="$here/stable-runner/Cargo.toml"
    cargo build --release --locked --manifest-path "$manifest"
    for target in wire_parse wire_roundtrip qp_responder qp_requester; do
        if ! cargo run -q --release --locked --manifest-path "$manifest" -- \
            --target "$target" --seconds "$secs" --seed "$seed"; then
            failed+=("stable:$target")
        fi
    done
}

have_cargo_fuzz() {
    cargo +nightly fuzz --version >/dev/null 2>&1
}

run_libfuzzer() {
    if ! cargo +nightly --version >/dev/null 2>&1; then
        echo "=== cargo-fuzz: no nightly toolchain, skipped"
        [ "$mode" = libfuzzer ] && failed+=("libfuzzer:no-nightly")
        return 0
    fi
    if ! have_cargo_fuzz && [ "$install" = 1 ]; then
        echo "=== installing cargo-fuzz"
        cargo install cargo-fuzz --locked || true
    fi
    if ! have_cargo_fuzz; then
        echo "=== cargo-fuzz: not installed, skipped"
        [ "$mode" = libfuzzer ] && failed+=("libfuzzer:no-cargo-fuzz")
        return 0
    fi
    echo "=== cargo-fuzz $(cargo +nightly fuzz --version): ${secs}s per target"
    cd "$here"
    # Seed the corpora from the captures and samples (libFuzzer keeps what it adds).
    cargo run -q --release --locked --manifest-path stable-runner/Cargo.toml -- \
        --write-corpus corpus
    cargo +nightly fuzz build
    local targets
    targets="$(cargo +nightly fuzz list)"
    for target in $targets; do
        mkdir -p "corpus/$target" artifacts
        if ! cargo +nightly fuzz run "$target" "corpus/$target" -- \
            -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
            2>"artifacts/$target.log"; then
            failed+=("libfuzzer:$target")
            tail -n 60 "artifacts/$target.log" >&2
        else
            grep -E '^(Done|stat::number_of_executed_units|stat::average_exec_per_sec)' \
                "artifacts/$target.log" || true
        fi
    done
    cd - >/dev/null
}

case "$mode" in
    both) run_stable; run_libfuzzer ;;
    stable) run_stable ;;
    libfuzzer) run_libfuzzer ;;
    *) echo "FUZZ_MODE must be both, stable or libfuzzer" >&2; exit 2 ;;
esac

if [ "${#failed[@]}" -ne 0 ]; then
    echo "FUZZ FAILURES: ${failed[*]} (inputs: fuzz/artifacts/, replay commands above)" >&2
    exit 1
fi
echo "fuzz: no crashes"
