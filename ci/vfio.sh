#!/usr/bin/env bash
# kvtarget's PCIe backends in the QEMU guest, one boot for all of them: an emulated PCIe
# NVMe controller (two namespaces on raw files in the cache dir) behind an emulated
# VT-d; kvtarget runs in the guest, the guest kernel's NVMe/TCP host attaches over
# loopback and runs fio verify; afterwards the kernel nvme driver rebinds and must
# read the same data (tests/vfio/backend.sh, once per backend, started by
# tests/vfio/guest.sh).
#
# Backends (VFIO_BACKENDS, default "nvme"): `nvme` is kvtarget's own user-space NVMe
# driver over VFIO (KVTARGET_BIN, the default build); `spdk` is SPDK's PCIe NVMe driver
# through kvtarget's `spdk` backend (KVTARGET_SPDK_BIN, built with --features spdk; the
# share then carries every shared library it loads: SPDK's, DPDK's, ISA-L; the guest
# reserves hugepages for SPDK). VFIO_BACKEND=spdk (one backend, as before) still works.
#
# Usage: ci/vfio.sh [--verbose]
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ "$(id -u)" = 0 ] || { echo "ci/vfio.sh: must run as root (QEMU, tap)" >&2; exit 1; }
backends=${VFIO_BACKENDS:-${VFIO_BACKEND:-nvme}}
guest=$("$repo/ci/guest/build.sh")
work=${VFIO_CACHE:-$repo/.cache/vfio}
rm -rf "$work/share"
mkdir -p "$work/share"
for backend in $backends; do
    case "$backend" in
        nvme) bin=${KVTARGET_BIN:-$repo/target/release/kvtarget} ;;
        spdk) bin=${KVTARGET_SPDK_BIN:-${KVTARGET_BIN:-$repo/target/release/kvtarget}} ;;
        *) echo "ci/vfio.sh: backends are nvme and spdk, not '$backend'" >&2; exit 2 ;;
    esac
    [ -x "$bin" ] || { echo "ci/vfio.sh: no kvtarget binary at $bin for the $backend backend" >&2; exit 1; }
    dir=$work/share/$backend
    mkdir -p "$dir/lib"
    cp "$bin" "$dir/kvtarget"
    if [ "$backend" = spdk ]; then
        # Everything the SPDK-linked binary loads: the guest image has only glibc's
        # basics (same glibc as the host, so host copies are safe).
        ldd "$bin" | awk '/=> \// {print $3}' | grep -vE '/(libc|libm|libpthread|libdl|librt)\.so' \
            | xargs -r -I{} cp -L {} "$dir/lib/"
        if ldd "$bin" | grep -q "not found"; then
            echo "ci/vfio.sh: $bin has unresolved libraries: $(ldd "$bin" | grep 'not found' | tr '\n' ' ')" >&2
            exit 1
        fi
    else
        # Shared libraries the guest image lacks (libgcc_s for Rust's unwinder).
        ldd "$bin" | awk '/=> \// {print $3}' | grep -E 'libgcc_s' | xargs -r -I{} cp {} "$dir/lib/"
    fi
done
# guest.sh unbinds a controller left on vfio-pci with the nvme backend's binary.
[ -x "$work/share/nvme/kvtarget" ] || { mkdir -p "$work/share/nvme"; cp "$bin" "$work/share/nvme/kvtarget"; }
echo "$backends" > "$work/share/backends"
cp "$repo/tests/vfio/guest.sh" "$repo/tests/vfio/backend.sh" "$work/share/"
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
        --timeout "${VFIO_TIMEOUT:-1200}" --iommu --nvme-disk "$work/ns1.raw" --nvme-disk "$work/ns2.raw" "$@" || rc=$?
    grep -E '^(ok|not ok|# vfio|# ====)' "$work/share/console.log" 2>/dev/null | tail -n 80 || true
    [ "$rc" = 126 ] && [ "$attempt" = 1 ] || exit "$rc"
    echo "ci/vfio.sh: QEMU crashed (not a test verdict); running the guest once more" >&2
done
