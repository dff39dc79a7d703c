#!/usr/bin/env bash
# CI entry point of the NVMe/TCP interop tests: the real Linux kernel host (nvme-cli,
# fio) in a QEMU/TCG guest against kvtarget on the host, and against the guest kernel's
# nvmet as a control. Installs the Debian packages it needs if missing, builds (or
# reuses) the guest, runs both suites. Expects the release binary to exist already
# (cargo build --release), or KVTARGET_BIN to point at one. The kvtarget boot's
# reservation scenarios also run against SPDK's nvmf_tgt as a control, found through
# SPDK_DIR (ci/test.sh exports it: `eval "$(ci/spdk.sh)"`) or a finished build in
# SPDK_CACHE (default .cache/spdk); never built here: without one they are skipped.
#
# Usage: ci/interop.sh [--target kernel|kvtarget|both] [--only REGEX] [--verbose]
# Last line of output: "N passed, N failed, N skipped"; exit status non-zero on any failure.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ "$(id -u)" = 0 ] || { echo "ci/interop.sh: must run as root (apt-get, QEMU)" >&2; exit 1; }
"$repo/ci/guest/build.sh" > /dev/null
exec "$repo/tests/interop/run.sh" "$@"
