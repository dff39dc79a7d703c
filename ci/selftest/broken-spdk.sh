#!/usr/bin/env bash
# Acceptance check of "fail where it fails": with SPDK's tarball damaged (one byte
# changed in a copy of ../shared/vendor/spdk, so its SHA256SUMS no longer match), the
# run must fail in the build stage at the spdk job, name it, and print the table.
#
#   ci/selftest/broken-spdk.sh
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
repo=$PWD
vendor=$repo/../shared/vendor/spdk
copy=$repo/target/ci/selftest-vendor
log=target/ci/selftest-broken-spdk.log
rm -rf "$copy"; mkdir -p "$copy"
cp "$vendor"/* "$copy"/
tarball=$(ls "$copy"/spdk-*.tar.xz)
# One byte of the tarball flipped, in its middle.
size=$(stat -c %s "$tarball")
printf '\x5a' | dd of="$tarball" bs=1 seek=$((size / 2)) conv=notrunc status=none
echo "broken-spdk: ci/test.sh --stage build with SPDK_VENDOR=$copy (log $log)"
SPDK_VENDOR=$copy ci/test.sh --stage build > "$log" 2>&1
rc=$?
rm -rf "$copy"
bad() { echo "broken-spdk: FAILED: $*"; tail -n 30 "$log"; exit 1; }
[ $rc != 0 ] || bad "the run passed with a damaged SPDK tarball"
grep -q "FAILED in stage build, job spdk" "$log" || bad "the run did not end naming the build stage's spdk job"
grep -q "checksums in .* do not match" "$log" || bad "the spdk job's failure does not say why"
grep -q "^total " "$log" || bad "no table printed"
echo "broken-spdk: ok: exit $rc; the run's last lines:"
tail -n 12 "$log"
