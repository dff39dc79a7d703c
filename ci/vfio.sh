#!/usr/bin/env bash
# The `nvme` backend (kvtarget's user-space NVMe driver over VFIO) in the QEMU guest:
# an emulated PCIe NVMe controller (two namespaces on raw files in the cache dir)
# behind an emulated VT-d; kvtarget runs in the guest, the guest kernel's NVMe/TCP
# host attaches over loopback and runs fio verify; afterwards the kernel nvme driver
# rebinds and must read the same data (tests/vfio/guest.sh).
#
# VFIO_BACKEND=spdk runs the same test on SPDK's PCIe NVMe driver instead (kvtarget's
# `spdk` backend, KVTARGET_BIN built with --features spdk): the share then carries
# every shared library the binary loads (SPDK's, DPDK's, ISA-L), and the guest
# reserves hugepages for SPDK.
#
# Usage: ci/vfio.sh [--verbose]    (expects target/release/kvtarget, or KVTARGET_BIN)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ "$(id -u)" = 0 ] || { echo "ci/vfio.sh: must run as root (apt-get, QEMU)" >&2; exit 1; }
bin=${KVTARGET_BIN:-$repo/target/release/kvtarget}
[ -x "$bin" ] || { echo "ci/vfio.sh: no kvtarget binary at $bin (cargo build --release)" >&2; exit 1; }
guest=$("$repo/ci/guest/build.sh")
work=${VFIO_CACHE:-$repo/.cache/vfio}
rm -rf "$work/share"
mkdir -p "$work/share/lib"
cp "$bin" "$work/share/kvtarget"
backend=${VFIO_BACKEND:-nvme}
case "$backend" in nvme|spdk) ;; *) echo "ci/vfio.sh: VFIO_BACKEND must be nvme or spdk" >&2; exit 2 ;; esac
echo "$backend" > "$work/share/backend"
if [ "$backend" = spdk ]; then
    # Everything the SPDK-linked binary loads: the guest image has only glibc's
    # basics (same glibc as the host, so host copies are safe).
    ldd "$bin" | awk '/=> \// {print $3}' | grep -vE '/(libc|libm|libpthread|libdl|librt)\.so' \
        | xargs -r -I{} cp -L {} "$work/share/lib/"
    if ldd "$bin" | grep -q "not found"; then
        echo "ci/vfio.sh: $bin has unresolved libraries: $(ldd "$bin" | grep 'not found' | tr '\n' ' ')" >&2
        exit 1
    fi
else
    # Shared libraries the guest image lacks (libgcc_s for Rust's unwinder).
    ldd "$bin" | awk '/=> \// {print $3}' | grep -E 'libgcc_s' | xargs -r -I{} cp {} "$work/share/lib/"
fi
cp "$repo/tests/vfio/guest.sh" "$work/share/guest.sh"
# QEMU 7.2's TCG has crashed (SIGSEGV) once in CI as kvtarget took the controller over
# VFIO; such a crash says nothing of the test, so the whole guest run starts again, from
# fresh namespaces, once. Every other failure is the test's verdict.
for attempt in 1 2; do
    # Fresh namespaces each run: the test writes a pool and patterns.
    rm -f "$work/ns1.raw" "$work/ns2.raw" "$work/share/exit-status"
    truncate -s 64M "$work/ns1.raw"
    truncate -s 256M "$work/ns2.raw"
    rc=0
    GUEST_DIR=$guest "$repo/ci/guest/run.sh" --share "$work/share" --script guest.sh \
        --timeout 1200 --iommu --nvme-disk "$work/ns1.raw" --nvme-disk "$work/ns2.raw" "$@" || rc=$?
    [ "$rc" = 126 ] && [ "$attempt" = 1 ] || exit "$rc"
    echo "ci/vfio.sh: QEMU crashed (not a test verdict); running the guest once more" >&2
done
