#!/usr/bin/env bash
# CI entry point of the NVMe/RDMA interop tests: the Linux kernel nvme-rdma host against
# kvtarget, both inside the QEMU/TCG guest over soft-RoCE (rxe on the guest's eth0).
# Installs what it needs (ci/guest/build.sh: rdma-core for the guest), builds or reuses
# the guest, runs tests/interop/rdma-run.sh. Expects the release binary to exist
# (cargo build --release), or KVTARGET_BIN to point at one.
#
# Usage: ci/rdma.sh [--only REGEX] [--verbose]
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ "$(id -u)" = 0 ] || { echo "ci/rdma.sh: must run as root (apt-get, QEMU)" >&2; exit 1; }
"$repo/ci/guest/build.sh" > /dev/null
exec "$repo/tests/interop/rdma-run.sh" "$@"
