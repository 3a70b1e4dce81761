#!/usr/bin/env bash
# Installs what the tests and tools need on a fresh Debian machine: tshark (Wireshark's
# dissector, used to check that our captures decode as RoCE). Idempotent; needs root for apt.
set -euo pipefail
if ! command -v tshark >/dev/null 2>&1; then
    if [ "$(id -u)" != 0 ]; then
        echo "setup: tshark is missing; run as root or: sudo apt-get install tshark" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
    apt-get update -qq
    apt-get install -y -qq tshark >/dev/null
fi
command -v cargo >/dev/null || { echo "setup: cargo not found (install Rust with rustup)" >&2; exit 1; }
