#!/usr/bin/env bash
# Acceptance check of the stage caps: a guest stage whose guest hangs (QEMU's vCPUs held
# stopped with -S) must fail at the stage's cap, name the stage, and print the table.
# Runs `ci/test.sh --stage STAGE` (default guest-vfio, with the build stage it needs;
# warm caches make that quick) with that stage's cap set to CAP seconds (default 90,
# KVT_CI_CAPS) and the other caps as they are. Exit 0 when the run failed as it should.
#
#   ci/selftest/hang-guest.sh [STAGE] [CAP]
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
stage=${1:-guest-vfio} cap=${2:-90}
log=target/ci/selftest-hang-guest.log
mkdir -p target/ci
echo "hang-guest: ci/test.sh --stage $stage with GUEST_QEMU_ARGS=-S, its cap ${cap}s (log $log)"
start=$SECONDS
GUEST_QEMU_ARGS=-S KVT_CI_CAPS="$stage=$cap" ci/test.sh --stage "$stage" > "$log" 2>&1
rc=$?
took=$((SECONDS - start))
bad() { echo "hang-guest: FAILED: $*"; tail -n 30 "$log"; exit 1; }
[ $rc != 0 ] || bad "the run passed with a hung guest"
grep -q "TIMEOUT: stage $stage ran past its cap of ${cap}s" "$log" || bad "no TIMEOUT line for stage $stage"
grep -qE "^$stage +${cap}s +[0-9]+s +FAILED" "$log" || bad "the table does not show $stage FAILED"
grep -q "^total " "$log" || bad "no table printed"
echo "hang-guest: ok: exit $rc after ${took}s; the run's last lines:"
tail -n 12 "$log"
