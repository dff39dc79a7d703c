#!/usr/bin/env bash
# The interop suite against the guest kernel's own nvmet (the control target: a
# scenario that passes there and fails on kvtarget is a kvtarget bug), with its
# verdict cached. Nothing of kvtarget runs in this boot, so its result depends only
# on the files below (the suite, the guest's scripts, kernel and packages, QEMU): a
# pass is kept in .cache/verdicts/ under a key of all of them and reused while none
# changes; a failure is never kept.
#
#   ci/nvmet-control.sh            boot unless a pass with this key is cached
#   NVMET_FORCE=1 ci/nvmet-control.sh   boot anyway
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
log() { echo "nvmet-control: $*" >&2; }

guest=$(ci/guest/build.sh)
key=$(
    {
        # The guest's own key names its kernel and every package copied into it.
        cat "$guest/manifest.txt"
        qemu-system-x86_64 --version | head -n 1
        echo "expected skips: ${INTEROP_EXPECTED_SKIPS_kernel-unset}"
        find tests/interop/run.sh tests/interop/tcp-suite.sh tests/interop/nvmet-control.sh \
            tests/interop/klog-filter.sh tests/interop/lmcache_scenario.py tests/interop/kv-uring \
            bench/fio ci/guest ci/interop.sh ci/nvmet-control.sh \
            -type f ! -path '*/target/*' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
    } | sha256sum | cut -c1-16
)
cache=$repo/.cache/verdicts/nvmet-control
verdict=$cache/$key.log
if [ -z "${NVMET_FORCE:-}" ] && [ -s "$verdict" ]; then
    log "cached pass (key $key, $(stat -c %y "$verdict" | cut -d. -f1)): the suite and the guest are unchanged since"
    grep -E '^(# kernel|# kernel nvmet|=== summary|[0-9]+ passed)' "$verdict" || tail -n 5 "$verdict"
    exit 0
fi
log "booting (key $key)"
mkdir -p "$cache"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
rc=0
GUEST_DIR=$guest INTEROP_OUT=$repo/.cache/interop/nvmet-$key ci/interop.sh --target kernel \
    2>&1 | tee "$out" || rc=$?
[ "$rc" = 0 ] || exit "$rc"
find "$cache" -name '*.log' ! -name "$key.log" -delete
cp "$out" "$verdict"
log "pass cached as $verdict"
