#!/usr/bin/env bash
# The project's test command (README): lint, unit + integration tests, then the
# interop suite against the real Linux NVMe host in a QEMU guest.
#
#   ci/test.sh            everything
#   ci/test.sh --quick    lint and cargo tests only (no QEMU guest)
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
[[ "${1:-}" == "--quick" ]] && quick=1

step() { printf '\n==> %s\n' "$*"; }

step "toolchain: $(cargo --version)"
cargo fmt --version >/dev/null && cargo clippy --version >/dev/null

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings

step "cargo test (unit, property and loopback integration tests)"
cargo test --all-targets

step "pool simulation: ${KVT_SIM_SEEDS:=2000} seeds (sim profile: optimised, overflow checks on)"
KVT_SIM_SEEDS=$KVT_SIM_SEEDS cargo test --profile sim --lib pool::sim -- --nocapture

if [[ $quick == 1 ]]; then
    exit 0
fi

step "cargo build --release"
cargo build --release

step "SPDK's own JSON-RPC client (spdk-rpc from PyPI) drives kvtarget"
KVTARGET_BIN="$PWD/target/release/kvtarget" tests/spdk-rpc/run.sh

step "interop: Linux kernel NVMe/TCP host in a QEMU guest"
KVTARGET_BIN="$PWD/target/release/kvtarget" ci/interop.sh

step "interop: Linux kernel NVMe/RDMA host over soft-RoCE, kvtarget in the QEMU guest"
KVTARGET_BIN="$PWD/target/release/kvtarget" ci/rdma.sh

step "nvme backend: kvtarget's user-space NVMe driver over VFIO in a QEMU guest"
KVTARGET_BIN="$PWD/target/release/kvtarget" ci/vfio.sh
