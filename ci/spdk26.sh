#!/usr/bin/env bash
# Build SPDK v26.05 (the first SPDK whose NVMe host speaks the Key Value command set,
# include/spdk/nvme_kv.h) against DPDK v25.11.2, both from ../shared/vendor/spdk-26.05,
# once into an ignored cache folder keyed by the tarballs' checksums and this recipe,
# and print the environment a client built on it needs.
#
#   ci/spdk26.sh               build if needed; print `export ...` lines on stdout
#   ci/spdk26.sh --dir         build if needed; print the SPDK tree on stdout
#   ci/spdk26.sh --deps        install the Debian packages the build needs, and stop
#                              (ci/test.sh, before it builds in the background: two
#                              apt-get runs at once fail on dpkg's lock)
#
# Env: SPDK26_CACHE (default <repo>/.cache/spdk26), SPDK26_VENDOR (default
#      <repo>/../shared/vendor/spdk-26.05), SPDK26_FORCE_REBUILD=1.
#
# Debian 12's DPDK (22.11) is too old for SPDK 26.05, so DPDK is built too, with only
# what SPDK's env layer links. Facts behind the steps: ../shared/vendor/spdk-26.05/README.md.
# About 8-9 minutes on 2 idle cores from nothing.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
vendor=${SPDK26_VENDOR:-$repo/../shared/vendor/spdk-26.05}
cache=${SPDK26_CACHE:-$repo/.cache/spdk26}
mode=env
case "${1:-}" in
    --dir) mode=dir ;;
    --deps) mode=deps ;;
    "") ;;
    *) echo "spdk26-build: unknown option '$1' (--dir, --deps)" >&2; exit 2 ;;
esac

log() { echo "spdk26-build: $*" >&2; }
source "$here/lib/debian.sh"
die() { echo "spdk26-build: error: $*" >&2; exit 1; }

emit() {
    local out=$1
    if [ "$mode" = dir ]; then
        echo "$out/spdk"
        return
    fi
    echo "export SPDK26_DIR=$out/spdk"
    echo "export SPDK26_DPDK=$out/dpdk-install"
    echo "export SPDK26_LD_LIBRARY_PATH=$out/spdk/build/lib:$out/dpdk-install/lib"
}

# SPDK v25.09's packages (ci/spdk.sh) plus DPDK's meson build and SPDK 26.05's
# generated RPC header (jinja2, tabulate for Debian's python3).
# (ci/lib/debian.sh's groups spdk and spdk26).
install_pkgs() { install_debs spdk spdk26; }
if [ "$mode" = deps ]; then
    install_pkgs
    exit 0
fi

[ -f "$vendor/spdk-v26.05.tar.xz" ] || die "no SPDK 26.05 sources at $vendor"
(cd "$vendor" && sha256sum --quiet -c SHA256SUMS >&2) || die "checksums in $vendor/SHA256SUMS do not match"

RECIPE=2
key=$( (cat "$vendor/SHA256SUMS"; echo "recipe $RECIPE") | sha256sum | cut -c1-16)
out=$cache/$key
install_pkgs
if [ -z "${SPDK26_FORCE_REBUILD:-}" ] && [ -f "$out/.complete" ]; then
    ln -sfn "$key" "$cache/current"
    log "cached SPDK 26.05 $out/spdk"
    emit "$out"
    exit 0
fi

log "building DPDK v25.11.2 and SPDK v26.05 into $out (about 5 minutes on 2 idle cores)"
rm -rf "$out"
mkdir -p "$out"
# Debian's python3 first: meson, pyelftools, jinja2 and tabulate are installed for it.
export PATH=/usr/bin:$PATH
jobs=$(nproc)

tar -C "$out" -xJf "$vendor/dpdk-v25.11.2.tar.xz"
(
    cd "$out/dpdk"
    meson setup build --prefix="$out/dpdk-install" --libdir=lib -Dbuildtype=release \
        -Ddefault_library=shared -Dtests=false -Dexamples= -Ddisable_apps='*' \
        -Denable_docs=false \
        -Denable_drivers=bus/pci,bus/vdev,mempool/ring \
        -Denable_libs=eal,hash,log,mbuf,mempool,pci,ring,argparse,cmdline,ethdev,kvargs,meter,net,rcu,stack,telemetry,timer \
        >"$out/dpdk-meson.log" 2>&1 \
        || { tail -n 30 "$out/dpdk-meson.log" >&2; exit 1; }
    ninja -C build -j"$jobs" install >"$out/dpdk-ninja.log" 2>&1 \
        || { tail -n 40 "$out/dpdk-ninja.log" >&2; exit 1; }
) || die "DPDK build failed (logs in $out)"
# DPDK's EAL loads every driver in its plugin directory and refuses a path with a
# world-writable directory on it (a cache under /tmp): SPDK links the drivers it uses
# directly, so the drivers move next to the other libraries and the directory goes.
for d in "$out"/dpdk-install/lib/dpdk/pmds-*; do
    [ -d "$d" ] || continue
    find "$d" -maxdepth 1 -name '*.so*' -exec mv -f {} "$out/dpdk-install/lib/" \;
done
rm -rf "$out/dpdk-install/lib/dpdk"

tar -C "$out" -xJf "$vendor/spdk-v26.05.tar.xz"
rm -rf "$out/spdk/isa-l" "$out/spdk/isa-l-crypto"
tar -C "$out/spdk" -xJf "$vendor/isa-l-c196241a.tar.xz"
tar -C "$out/spdk" -xJf "$vendor/isa-l_crypto-v2.26.tar.xz"
cd "$out/spdk"

# The one edit: SPDK 26.05 accepts DPDK 25.11.0 only at start-up; 25.11.2's bus, dev and
# PCI-bus driver headers declare the same as SPDK's bundled copies (vendor README).
guard='(month != 11 || minor != 0) \&\&'
sed -n '/year == 25/,/goto not_supported/p' lib/env_dpdk/pci_dpdk.c | grep -q 'month != 11 || minor != 0' \
    || die "pci_dpdk.c: DPDK 25.x version guard not found"
sed -i "/year == 25/,/goto not_supported/ s/$guard/(month != 11 || minor > 2) \\&\\&/" lib/env_dpdk/pci_dpdk.c

export PKG_CONFIG_PATH=$out/dpdk-install/lib/pkgconfig
# Libraries only (--disable-apps --disable-examples): the one user is a C client
# built against them (tests/spdk-kv).
./configure --with-dpdk="$out/dpdk-install" --with-shared --without-crypto \
    --without-nvme-cuse --without-vhost --without-virtio --without-fsdev \
    --disable-tests --disable-unit-tests --disable-examples --disable-apps >"$out/configure.log" 2>&1 \
    || { tail -n 30 "$out/configure.log" >&2; die "configure failed (log: $out/configure.log)"; }
# No isa-l_crypto (as in ci/spdk.sh): configure builds it with ISA-L, it was the
# largest part of this build, and only the accel framework's software AES-XTS
# (lib/accel/accel_sw.c) calls it.
sed -i 's/^CONFIG_ISAL_CRYPTO?=y/CONFIG_ISAL_CRYPTO?=n/' mk/config.mk
grep -q '^CONFIG_ISAL_CRYPTO?=n' mk/config.mk || die "could not turn isa-l_crypto off in mk/config.mk"
make -j"$jobs" SPDK_GIT_COMMIT= >"$out/make.log" 2>&1 \
    || { tail -n 40 "$out/make.log" >&2; die "make failed (log: $out/make.log)"; }
for f in build/lib/libspdk_nvme.so include/spdk/nvme_kv.h build/lib/pkgconfig/spdk_nvme.pc; do
    [ -e "$f" ] || die "build finished without $f"
done
touch "$out/.complete"
ln -sfn "$key" "$cache/current"
log "built SPDK 26.05 $out/spdk"
emit "$out"
