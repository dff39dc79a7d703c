#!/usr/bin/env bash
# Build SPDK (v25.09 from ../shared/vendor/spdk, with ISA-L and isa-l_crypto) once into
# an ignored cache folder keyed by the tarballs' checksums and this script, and print the
# environment a kvtarget build with `--features spdk` and SPDK's own tools need.
#
#   ci/spdk.sh                 build if needed; print `export ...` lines on stdout
#   ci/spdk.sh --dir           build if needed; print the SPDK tree on stdout
#   ci/spdk.sh --planned-env   print the `export ...` lines of the cached build this
#                              recipe makes, built or not (ci/jobs.sh gives every cargo
#                              command the same PKG_CONFIG_PATH: build scripts that
#                              use pkg-config, openssl-sys's among them, rebuild, and
#                              everything above them, whenever it changes)
#   SPDK_DIR=/my/spdk ci/spdk.sh   use a user's own built SPDK tree instead (no build)
#
# Env: SPDK_CACHE (default <repo>/.cache/spdk), SPDK_VENDOR (default
#      <repo>/../shared/vendor/spdk), SPDK_FORCE_REBUILD=1.
#
# Facts behind the steps are in ../shared/vendor/spdk/README.md: Debian 12's DPDK 22.11
# forces shared libraries, SPDK's DPDK-version guard must allow 22.11.11, and
# CONFIG_IPSEC_MB must be off because Debian's DPDK pkg-config mentions it.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
vendor=${SPDK_VENDOR:-$repo/../shared/vendor/spdk}
cache=${SPDK_CACHE:-$repo/.cache/spdk}
mode=env
case "${1:-}" in
    --dir) mode=dir ;;
    --planned-env) mode=planned ;;
    "") ;;
    *) echo "spdk-build: unknown option '$1' (--dir, --planned-env)" >&2; exit 2 ;;
esac

log() { echo "spdk-build: $*" >&2; }
source "$here/lib/debian.sh"
die() { echo "spdk-build: error: $*" >&2; exit 1; }

# SPDK's .pc files hold absolute paths; when the tree was moved (a renamed cache
# folder, a moved checkout), point them at where it is now.
fix_pc() {
    local dir=$1 pcdir=$1/build/lib/pkgconfig was
    was=$(sed -n 's#^Cflags: -I\(.*\)/build/include.*#\1#p' "$pcdir/spdk_nvme.pc" | head -n 1)
    if [ -n "$was" ] && [ "$was" != "$dir" ]; then
        log "repointing pkg-config files from $was to $dir"
        sed -i "s#$was/#$dir/#g" "$pcdir"/*.pc
    fi
}

emit() {
    local dir=$1
    [ "$mode" = planned ] || fix_pc "$dir"
    if [ "$mode" = dir ]; then
        echo "$dir"
        return
    fi
    # The same lines whether the tree is built yet or not (--planned-env).
    local pc="$dir/build/lib/pkgconfig"
    local ld="$dir/build/lib:$dir/isa-l/.libs"
    echo "export SPDK_DIR=$dir"
    echo "export PKG_CONFIG_PATH=$pc\${PKG_CONFIG_PATH:+:\$PKG_CONFIG_PATH}"
    echo "export LD_LIBRARY_PATH=$ld\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
}

# Debian packages for building SPDK and for bindgen (libclang) over its headers.
# (ci/lib/debian.sh's group spdk).
install_pkgs() { install_debs spdk; }

if [ -n "${SPDK_DIR:-}" ]; then
    [ -f "$SPDK_DIR/build/lib/pkgconfig/spdk_nvme.pc" ] \
        || die "SPDK_DIR=$SPDK_DIR has no build/lib/pkgconfig/spdk_nvme.pc (build SPDK there first)"
    install_pkgs
    emit "$SPDK_DIR"
    exit 0
fi

[ -f "$vendor/spdk-v25.09.tar.xz" ] || die "no SPDK sources at $vendor (expected spdk-v25.09.tar.xz)"
(cd "$vendor" && sha256sum --quiet -c SHA256SUMS >&2) || die "checksums in $vendor/SHA256SUMS do not match"

# The key: the tarballs plus the build recipe's version. Bump RECIPE when the
# configure flags or the edits below change (other edits to this script reuse the build).
RECIPE=4
key=$( (cat "$vendor/SHA256SUMS"; echo "recipe $RECIPE") | sha256sum | cut -c1-16)
out=$cache/$key
if [ "$mode" = planned ]; then
    emit "$out/spdk"
    exit 0
fi
if [ -z "${SPDK_FORCE_REBUILD:-}" ] && [ -f "$out/.complete" ]; then
    install_pkgs
    ln -sfn "$key" "$cache/current"
    log "cached SPDK $out/spdk"
    emit "$out/spdk"
    exit 0
fi

install_pkgs
log "building SPDK v25.09 into $out (about 3 minutes on 2 idle cores)"
rm -rf "$out"
mkdir -p "$out"
tar -C "$out" -xJf "$vendor/spdk-v25.09.tar.xz"
rm -rf "$out/spdk/isa-l" "$out/spdk/isa-l-crypto"
tar -C "$out/spdk" -xJf "$vendor/isa-l-v2.31.0.tar.xz"
tar -C "$out/spdk" -xJf "$vendor/isa-l_crypto-v2.25.0.tar.xz"
cd "$out/spdk"

# Edit 1: the run-time DPDK-version guard refuses 22.11.x for x > 4; Debian ships
# 22.11.11, whose bus/dev headers equal SPDK's bundled 22.11 copies.
grep -q 'minor > 4' lib/env_dpdk/pci_dpdk.c || die "pci_dpdk.c: DPDK version guard not found"
sed -i 's/minor > 4/minor > 11/' lib/env_dpdk/pci_dpdk.c

# --with-rdma: SPDK's NVMe/RDMA host (and target), the independent initiator for
# kvtarget's RDMA listener (rdma-core from Debian: libibverbs, librdmacm).
# Without vhost, virtio and fsdev: nothing here uses them, and leaving them out
# shortens CI's cold build.
./configure --with-dpdk --with-shared --without-crypto --without-nvme-cuse --with-rdma \
    --without-vhost --without-virtio --without-fsdev \
    --disable-tests --disable-unit-tests >"$out/configure.log" 2>&1 \
    || { tail -n 30 "$out/configure.log" >&2; die "configure failed (log: $out/configure.log)"; }

# Edit 2: Debian's DPDK pkg-config lists -lIPSec_MB, so configure enables
# CONFIG_IPSEC_MB and make would build the absent intel-ipsec-mb submodule.
if grep -q '^CONFIG_IPSEC_MB?=y' mk/config.mk; then
    sed -i 's/^CONFIG_IPSEC_MB?=y/CONFIG_IPSEC_MB?=n/' mk/config.mk
fi
# Edit 3: no isa-l_crypto. configure builds it whenever it builds ISA-L, and it was
# half of this build's time (211 of 410 s here); only the accel framework's software
# AES-XTS (lib/accel/accel_sw.c, for encryption, which nothing here uses) calls it.
sed -i 's/^CONFIG_ISAL_CRYPTO?=y/CONFIG_ISAL_CRYPTO?=n/' mk/config.mk
grep -q '^CONFIG_ISAL_CRYPTO?=n' mk/config.mk || die "could not turn isa-l_crypto off in mk/config.mk"

jobs=$(nproc)
# SPDK_GIT_COMMIT empty: SPDK's make would otherwise stamp its version string with
# the commit of whatever git checkout it is built inside (kvtarget's).
make -j"$jobs" SPDK_GIT_COMMIT= >"$out/make.log" 2>&1 \
    || { tail -n 40 "$out/make.log" >&2; die "make failed (log: $out/make.log)"; }
for f in build/lib/pkgconfig/spdk_nvme.pc build/bin/nvmf_tgt build/bin/spdk_nvme_perf \
         build/bin/spdk_nvme_identify scripts/rpc.py; do
    [ -e "$f" ] || die "build finished without $f"
done
touch "$out/.complete"
ln -sfn "$key" "$cache/current"
log "built SPDK $out/spdk"
emit "$out/spdk"
