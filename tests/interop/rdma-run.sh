#!/usr/bin/env bash
# Host side of the NVMe/RDMA interop suite. Soft-RoCE exists only inside the guest, so
# kvtarget runs there too: this script puts the release binary, tcp-suite.sh and
# rdma-guest.sh into a fresh 9p share, boots the guest (ci/guest/run.sh) running
# rdma-guest.sh, and prints the result lines (ok/FAIL/skip and a last
# "N passed, N failed, N skipped"). Exit status non-zero when anything failed.
#
# Usage: tests/interop/rdma-run.sh [--only REGEX] [--verbose]
# Env:   KVTARGET_BIN (default <repo>/target/release/kvtarget)
#        INTEROP_OUT (default <repo>/.cache/interop/rdma-<time>), INTEROP_TIMEOUT (1500)
#        INTEROP_EXPECTED_SKIPS_rdma (when set: the scenarios this run may skip; any
#          other skip is a failure)
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
only= verbose=
while [ $# -gt 0 ]; do
    case "$1" in
        --only) only=$2; shift 2 ;;
        --verbose) verbose=--verbose; shift ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        *) echo "rdma-interop: unknown argument $1" >&2; exit 2 ;;
    esac
done
bin=${KVTARGET_BIN:-$repo/target/release/kvtarget}
[ -x "$bin" ] || { echo "rdma-interop: no kvtarget binary at $bin (cargo build --release)" >&2; echo "0 passed, 1 failed, 0 skipped"; exit 1; }
out=${INTEROP_OUT:-$repo/.cache/interop/rdma-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
ls -1dt "$repo"/.cache/interop/rdma-* 2>/dev/null | tail -n +4 | xargs -r rm -rf
share=$out/share
rm -rf "$share"; mkdir -p "$share"
cp "$bin" "$share/kvtarget"
cp "$here/tcp-suite.sh" "$here/klog-filter.sh" "$here/rdma-guest.sh" "$here/lmcache_scenario.py" "$share/"
# SPDK's NVMe/RDMA host tools for the spdk-rdma-host scenario, with every library
# they load (the guest has only glibc's basics; same glibc as the host).
if [ -n "${SPDK_DIR:-}" ] && [ -x "$SPDK_DIR/build/bin/spdk_nvme_perf" ]; then
    mkdir -p "$share/spdk/lib"
    for t in build/bin/spdk_nvme_perf build/bin/spdk_nvme_identify build/examples/bdevperf; do
        cp "$SPDK_DIR/$t" "$share/spdk/"
        ldd "$SPDK_DIR/$t" | awk '/=> \// {print $3}' | grep -vE '/(libc|libm|libpthread|libdl|librt)\.so' \
            | xargs -r -I{} cp -L -n {} "$share/spdk/lib/"
    done
fi
# The io_uring passthrough KV client (kv-namespace), a static binary built here.
if CARGO_TARGET_DIR="$repo/.cache/kv-uring" cargo build --release --quiet \
    --manifest-path "$here/kv-uring/Cargo.toml" >&2; then
    cp "$repo/.cache/kv-uring/release/kv-uring" "$share/"
else
    echo "rdma-interop: kv-uring did not build: kv-namespace will fail for want of it" >&2
fi
# bench/fio's job files, run by the bench-fio-profiles scenario.
mkdir -p "$share/fio"
cp "$repo"/bench/fio/*.fio "$share/fio/"
echo "RDMA_ONLY='$only' exec bash /mnt/share/rdma-guest.sh" > "$share/run-rdma.sh"
guest=$("$repo/ci/guest/build.sh") || { echo "rdma-interop: guest build failed" >&2; echo "0 passed, 1 failed, 0 skipped"; exit 1; }
export GUEST_DIR=$guest
echo "rdma-interop: logs in $out" >&2
# A QEMU that dies of a signal (exit 126 from run.sh: the emulator, not a verdict) gets
# one more boot; the guest starts everything afresh, kvtarget included. The timeout
# (INTEROP_TIMEOUT, 1500 s as for the TCP boot) catches a hang: the boot took 640 s
# in one CI run and ran past 900 s in a slower hour with other work beside it.
for attempt in 1 2; do
    rm -f "$share/guest-output.log" "$share/kvtarget.log"
    "$repo/ci/guest/run.sh" --share "$share" --script run-rdma.sh --timeout "${INTEROP_TIMEOUT:-1500}" \
        --mem 3G --pidfile "$out/qemu.pid" $verbose 2> "$out/guest-run.log"
    rc=$?
    cat "$out/guest-run.log" >&2
    [ "$rc" = 126 ] && [ "$attempt" = 1 ] || break
    echo "rdma-interop: QEMU crashed (not a test verdict); booting the guest once more" >&2
done
echo "=== kvtarget NVMe/RDMA (in the guest, soft-RoCE 10.0.2.15:4420 and :4433) ==="
grep -E '^(ok - |FAIL - |skip - |# tcp-suite|# suite took|# soft-RoCE)' "$share/guest-output.log" 2>/dev/null || echo "(no suite output)"
last=$(grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$share/guest-output.log" 2>/dev/null | tail -n 1)
if [ -z "$last" ] || [ "$rc" != 0 ]; then
    echo "# guest exit status $rc; console tail ($share/console.log):"
    tail -n 40 "$share/console.log" 2>/dev/null | sed 's/^/# | /'
    echo "# kvtarget log tail ($share/kvtarget.log):"
    tail -n 30 "$share/kvtarget.log" 2>/dev/null | sed 's/\x1b\[[0-9;]*m//g; s/^/# | /'
fi
if [ -z "$last" ]; then
    echo "0 passed, 1 failed, 0 skipped"
    exit 1
fi
# No silent skip: where the caller lists the scenarios this run may skip
# (INTEROP_EXPECTED_SKIPS_rdma, ci/jobs.sh does), any other skip fails.
unexpected=0
if [ -n "${INTEROP_EXPECTED_SKIPS_rdma+set}" ]; then
    # shellcheck disable=SC2086 # one space between names, whatever the list had
    expected=" $(echo $INTEROP_EXPECTED_SKIPS_rdma) "
    while read -r name; do
        [ -n "$name" ] || continue
        case "$expected" in *" $name "*) continue ;; esac
        echo "FAIL - $name: skipped, and this run is expected to run it (INTEROP_EXPECTED_SKIPS_rdma)"
        unexpected=$((unexpected + 1))
    done < <(grep '^skip - ' "$share/guest-output.log" 2>/dev/null | sed 's/^skip - \([^:]*\):.*/\1/')
fi
if [ "$unexpected" != 0 ]; then
    read -r sp _ sf _ ss _ <<< "$last"
    last="$sp passed, $((sf + unexpected)) failed, $((ss - unexpected)) skipped"
fi
echo "$last"
[ "$rc" = 0 ] && [ "$unexpected" = 0 ]
