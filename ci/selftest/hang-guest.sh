#!/usr/bin/env bash
# Acceptance check of the stage caps: a guest stage whose guest hangs (QEMU's vCPUs held
# stopped with -S) must fail at the stage's cap, name the stage, and print the table.
# Runs `ci/test.sh --stage STAGE` (default guest-vfio, with the build stage it needs;
# warm caches make that quick) with every cap scaled by SCALE (default 0.25: the
# guest-vfio cap of 420 s becomes 105 s). Exit 0 when the run failed as it should.
#
#   ci/selftest/hang-guest.sh [STAGE] [SCALE]
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
stage=${1:-guest-vfio} scale=${2:-0.25}
log=target/ci/selftest-hang-guest.log
mkdir -p target/ci
echo "hang-guest: ci/test.sh --stage $stage with GUEST_QEMU_ARGS=-S, caps x$scale (log $log)"
start=$SECONDS
GUEST_QEMU_ARGS=-S KVT_CI_CAP_SCALE=$scale ci/test.sh --stage "$stage" > "$log" 2>&1
rc=$?
took=$((SECONDS - start))
bad() { echo "hang-guest: FAILED: $*"; tail -n 30 "$log"; exit 1; }
[ $rc != 0 ] || bad "the run passed with a hung guest"
grep -q "TIMEOUT: stage $stage ran past its cap" "$log" || bad "no TIMEOUT line for stage $stage"
grep -qE "^$stage +[0-9]+s +[0-9]+s +FAILED" "$log" || bad "the table does not show $stage FAILED"
grep -q "^total " "$log" || bad "no table printed"
echo "hang-guest: ok: exit $rc after ${took}s; the run's last lines:"
tail -n 12 "$log"
