#!/usr/bin/env bash
# Target CPU instructions per I/O for the nvme, uring and ram backends (callgrind in
# the QEMU guest, same workload, same kvtarget run): tests/vfio/bench-guest.sh.
# Not part of ci/test.sh (it measures, it does not check).
#
# Usage: ci/vfio-bench.sh     (expects target/release/kvtarget, or KVTARGET_BIN;
#                              KVTARGET_SPDK_BIN adds the spdk backend;
#                              valgrind is installed on the host if missing)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ "$(id -u)" = 0 ] || { echo "ci/vfio-bench.sh: must run as root" >&2; exit 1; }
bin=${KVTARGET_BIN:-$repo/target/release/kvtarget}
[ -x "$bin" ] || { echo "ci/vfio-bench.sh: no kvtarget binary at $bin" >&2; exit 1; }
command -v valgrind > /dev/null || { apt-get update -q; apt-get install -y -q valgrind; }
guest=$("$repo/ci/guest/build.sh")
work=${VFIO_CACHE:-$repo/.cache/vfio}/bench
rm -rf "$work/share"
mkdir -p "$work/share/lib" "$work/share/valgrind/lib"
cp "$bin" "$work/share/kvtarget"
ldd "$bin" | awk '/=> \// {print $3}' | grep -E 'libgcc_s' | xargs -r -I{} cp {} "$work/share/lib/"
# /usr/bin/valgrind is a wrapper script; the launcher itself is valgrind.bin.
cp "$(command -v valgrind).bin" "$work/share/valgrind/valgrind"
cp "$(command -v vgdb)" "$work/share/valgrind/"
for f in callgrind-amd64-linux vgpreload_core-amd64-linux.so default.supp; do
    cp "/usr/libexec/valgrind/$f" "$work/share/valgrind/lib/"
done
# KVTARGET_SPDK_BIN (built with --features spdk): also measure the spdk backend,
# with every library it loads in lib-spdk/.
if [ -n "${KVTARGET_SPDK_BIN:-}" ]; then
    mkdir -p "$work/share/lib-spdk"
    cp "$KVTARGET_SPDK_BIN" "$work/share/kvtarget-spdk"
    ldd "$KVTARGET_SPDK_BIN" | awk '/=> \// {print $3}' | grep -vE '/(libc|libm|libpthread|libdl|librt)\.so' \
        | xargs -r -I{} cp -L {} "$work/share/lib-spdk/"
fi
cp "$repo/tests/vfio/bench-guest.sh" "$work/share/bench.sh"
rm -f "$work/ns1.raw"
truncate -s 64M "$work/ns1.raw"
GUEST_DIR=$guest "$repo/ci/guest/run.sh" --share "$work/share" --script bench.sh \
    --timeout 1800 --iommu --nvme-disk "$work/ns1.raw" "$@"
grep -E '^(#|  [a-z])' "$work/share/console.log" | grep -vE '^# (kvtarget|vfio)' || true
