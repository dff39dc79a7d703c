#!/usr/bin/env bash
# Build (or reuse from cache) the interop guest: Debian 12's stock kernel plus a busybox
# initramfs carrying nvme-cli, fio, jq, coreutils/util-linux bits and exactly the kernel
# modules the NVMe/TCP interop suite needs (host: nvme-tcp; control target: nvmet-tcp;
# 9p share; virtio-net). Everything comes from Debian packages; nothing built here is
# committed.
#
# Output: $GUEST_CACHE/<key>/{vmlinuz,initramfs.cpio,manifest.txt} and the symlink
# $GUEST_CACHE/current -> <key>. The key hashes the package versions and this
# directory's scripts, so a package upgrade or a script edit rebuilds, and nothing else
# does.
#
# Usage: ci/guest/build.sh            build if needed, print the guest dir on stdout
# Env:   GUEST_CACHE (default <repo>/.cache/guest), GUEST_FORCE_REBUILD=1
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${GUEST_CACHE:-$repo/.cache/guest}

log() { echo "guest-build: $*" >&2; }
die() { echo "guest-build: error: $*" >&2; exit 1; }
source "$here/../lib/debian.sh"

[ "$(id -u)" = 0 ] || die "must run as root (installs Debian packages)"

# --- host packages ----------------------------------------------------------------
# Tools copied into the guest come from the host's installed packages (same glibc),
# so they must be installed here; qemu and nftables (its tap networking) are needed
# by run.sh.
# libibverbs1, librdmacm1, ibverbs-providers: rdma-core for kvtarget's NVMe/RDMA
# listener inside the guest (soft-RoCE provider librxe), copied in below.
# (ci/lib/debian.sh's group guest.)
install_debs guest

# The kernel: the version linux-image-amd64 points at in the apt lists (downloaded,
# never installed on the host).
kpkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
if [ -z "$kpkg" ]; then
    apt_get update >&2
    kpkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
fi
[ -n "$kpkg" ] || die "cannot resolve linux-image-amd64 to a kernel package"
kver_pkg=$(apt-cache policy "$kpkg" | awk '/Candidate:/ {print $2}')
[ -n "$kver_pkg" ] && [ "$kver_pkg" != "(none)" ] || die "no candidate for $kpkg"

# LMCache's raw-block I/O helper (issue 19's client), pinned by version and digest: a
# PyO3 wheel for CPython 3.11 needing only glibc, run in the guest by Debian's python3.11.
LMCACHE_WHEEL=lmcache_rust_raw_block_io-0.5.7rc2-cp311-cp311-manylinux_2_28_x86_64.whl
LMCACHE_WHEEL_SHA256=8abadf1a331329ca3ef700c4b732aa6474ad37ac28926d1db758f0a96f9066fc

# --- cache key ----------------------------------------------------------------------
ver() { dpkg-query -W -f '${Version}' "$1" 2>/dev/null || echo none; }
key_src=$(
    echo "kernel $kpkg $kver_pkg"
    for p in busybox-static nvme-cli libnvme1 fio jq libjq1 util-linux coreutils libc6 \
             libibverbs1 librdmacm1 ibverbs-providers iproute2 python3.11-minimal \
             libpython3.11-stdlib; do
        echo "$p $(ver "$p")"
    done
    echo "wheel $LMCACHE_WHEEL $LMCACHE_WHEEL_SHA256"
    sha256sum "$here/build.sh" "$here/init" | awk '{print $1}'
)
key=$(printf '%s\n' "$key_src" | sha256sum | cut -c1-16)
out=$cache/$key

if [ -z "${GUEST_FORCE_REBUILD:-}" ] && [ -f "$out/.complete" ]; then
    ln -sfn "$key" "$cache/current"
    log "cached guest $out"
    echo "$out"
    exit 0
fi

log "building guest $key ($kpkg $kver_pkg)"
mkdir -p "$cache/debs"
work=$(mktemp -d "$cache/.build.XXXXXX")
trap 'rm -rf "$work"' EXIT

deb=$cache/debs/${kpkg}_${kver_pkg//:/%3a}_amd64.deb
if [ ! -s "$deb" ]; then
    log "downloading $kpkg=$kver_pkg"
    # As root: apt's _apt sandbox user may not write into the cache directory.
    if ! (cd "$work" && apt-get download -q -o APT::Sandbox::User=root "$kpkg=$kver_pkg" >&2); then
        # Stale package lists (the kernel got a security update): refresh them and start
        # over, since the kernel version and so the cache key may change.
        [ -z "${GUEST_BUILD_RETRIED:-}" ] || die "cannot download $kpkg=$kver_pkg"
        log "download failed; apt-get update and retry"
        apt_get update >&2
        rm -rf "$work"
        GUEST_BUILD_RETRIED=1 exec "$0" "$@"
    fi
    mv "$work"/"$kpkg"_*.deb "$deb"
fi
wheel=$cache/debs/$LMCACHE_WHEEL
if [ ! -s "$wheel" ] || ! echo "$LMCACHE_WHEEL_SHA256  $wheel" | sha256sum -c --quiet - 2>/dev/null; then
    log "downloading $LMCACHE_WHEEL from PyPI"
    rm -f "$wheel"
    pip=(python3 -m pip)
    "${pip[@]}" --version > /dev/null 2>&1 || pip=(/usr/bin/python3 -m pip)
    "${pip[@]}" download -q --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
        --python-version 3.11 --implementation cp --dest "$work/wheel" \
        lmcache-rust-raw-block-io==0.5.7rc2 >&2 || die "cannot download $LMCACHE_WHEEL"
    mv "$work/wheel/$LMCACHE_WHEEL" "$wheel" || die "pip did not fetch $LMCACHE_WHEEL"
    echo "$LMCACHE_WHEEL_SHA256  $wheel" | sha256sum -c --quiet - || die "$LMCACHE_WHEEL: digest mismatch"
fi
kroot=$work/kernel
dpkg-deb -x "$deb" "$kroot"
krel=$(ls "$kroot/lib/modules")
[ "$(echo "$krel" | wc -l)" = 1 ] || die "expected one kernel release in $deb, got: $krel"
# The .deb ships no modules.dep (its postinst runs depmod), so generate one.
depmod -b "$kroot" "$krel"

# --- modules ----------------------------------------------------------------------
# Top-level modules; dependencies (softdeps included) are resolved by modprobe below.
# crc32c-intel/crc32c_generic: NVMe/TCP header/data digests; preloaded so that digests
# never depend on the kernel's request_module (which busybox modprobe serves otherwise).
# configfs: nvmet's configuration interface (a module in Debian's kernel).
# crc32_generic/crc32-pclmul: the "crc32" hash soft-RoCE (rdma_rxe) computes ICRCs with.
# nvme + vfio*: the user-space `nvme` backend test (ci/vfio.sh) hands an emulated PCIe
# controller from the kernel driver to vfio-pci and back.
top_modules=(
    virtio_pci virtio_net virtio_rng
    netfs fscache 9pnet 9pnet_virtio 9p
    crc32c_intel crc32c_generic libcrc32c
    configfs loop
    nvme-core nvme-fabrics nvme-tcp
    nvmet nvmet-tcp
    crc32_generic crc32-pclmul
    ib_core ib_uverbs rdma_cm rdma_ucm rdma_rxe nvme-rdma
    nvme vfio vfio_iommu_type1 vfio-pci
)
ramfs=$work/root
mkdir -p "$ramfs"/{bin,sbin,usr/bin,usr/sbin,lib64,etc/nvme,proc,sys,dev,tmp,mnt/share,run,root}
mkdir -p "$ramfs/lib/modules/$krel"
: > "$work/modules.list"
for m in "${top_modules[@]}"; do
    modprobe -d "$kroot" -S "$krel" --show-depends "$m" > "$work/dep.txt" \
        || die "module $m not found in $kpkg"
    while read -r verb path _; do
        [ "$verb" = insmod ] || continue   # "builtin X" lines need nothing
        rel=${path#"$kroot/lib/modules/$krel/"}
        grep -qxF "$rel" "$work/modules.list" && continue
        echo "$rel" >> "$work/modules.list"
        mkdir -p "$ramfs/lib/modules/$krel/$(dirname "$rel")"
        case "$path" in
            *.ko) cp "$path" "$ramfs/lib/modules/$krel/$rel" ;;
            *) die "compressed module $path: teach build.sh to decompress it" ;;
        esac
    done < "$work/dep.txt"
done
cp "$work/modules.list" "$ramfs/etc/modules.list"
cp "$kroot/lib/modules/$krel/"modules.{order,builtin,builtin.modinfo} "$ramfs/lib/modules/$krel/"
depmod -b "$ramfs" "$krel"   # lets busybox modprobe serve the kernel's request_module

# --- binaries and their libraries -------------------------------------------------
cp /bin/busybox "$ramfs/bin/busybox"
bins=(/usr/bin/bash /usr/sbin/nvme /usr/bin/fio /usr/bin/jq /usr/sbin/blkdiscard /usr/bin/dd
      /usr/bin/sha256sum /usr/bin/cmp /usr/bin/stat /usr/bin/timeout /usr/bin/od
      /usr/bin/rdma)
# Shared libraries no binary above links but the NVMe/RDMA suite needs: kvtarget
# (passed in through the share) loads rdma-core at run time, and rdma-core loads
# the soft-RoCE provider named by /etc/libibverbs.d/rxe.driver.
for l in /lib/x86_64-linux-gnu/libgcc_s.so.1 /lib/x86_64-linux-gnu/libibverbs.so.1 \
         /lib/x86_64-linux-gnu/librdmacm.so.1 \
         /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so; do
    [ -e "$l" ] || die "missing library $l (ibverbs-providers/librdmacm1 installed?)"
    echo "$l" >> "$work/libs.txt"
    ldd "$l" | awk '/=> \// {print $3}' >> "$work/libs.txt"
done
# Python 3.11 for the LMCache scenario: Debian's interpreter and its standard library
# without what the guest never runs (tests, IDLE, Tk, build configs, curses, sqlite,
# ssl), then the pinned wheel's package into dist-packages.
py=/usr/lib/python3.11
[ -x /usr/bin/python3.11 ] && [ -d "$py" ] || die "missing Debian python3.11 (python3.11-minimal, libpython3.11-stdlib)"
mkdir -p "$ramfs$py" "$ramfs/usr/lib/python3/dist-packages"
(cd "$py" && find . \( -path ./test -o -path ./idlelib -o -path ./tkinter -o -path ./turtledemo \
        -o -path ./ensurepip -o -path ./lib2to3 -o -path ./pydoc_data -o -path ./distutils \
        -o -path './config-3.11-*' -o -path ./dist-packages -o -path ./site-packages \
        -o -name __pycache__ -o -path './lib-dynload/_test*' -o -path './lib-dynload/xx*' \
        -o -path './lib-dynload/_ssl*' -o -path './lib-dynload/_hashlib*' \
        -o -path './lib-dynload/_sqlite3*' -o -path './lib-dynload/_dbm*' -o -path './lib-dynload/nis*' \
        -o -path './lib-dynload/_curses*' -o -path './lib-dynload/readline*' \
        -o -path './lib-dynload/_tkinter*' -o -path './lib-dynload/ossaudiodev*' \) -prune \
        -o -print0 | cpio --null -pdm --quiet "$ramfs$py")
/usr/bin/python3.11 -m zipfile -e "$wheel" "$ramfs/usr/lib/python3/dist-packages" \
    || die "cannot unpack $LMCACHE_WHEEL"
for l in /usr/bin/python3.11 "$ramfs$py"/lib-dynload/*.so \
         "$ramfs"/usr/lib/python3/dist-packages/lmcache_rust_raw_block_io/*.so; do
    ldd "$l" | awk '/=> \// {print $3} /^\t\/lib64/ {print $1}' >> "$work/libs.txt"
done
cp /usr/bin/python3.11 "$ramfs/usr/bin/python3.11"
ln -s python3.11 "$ramfs/usr/bin/python3"
mkdir -p "$ramfs/etc/libibverbs.d"
cp /etc/libibverbs.d/rxe.driver "$ramfs/etc/libibverbs.d/"
for b in "${bins[@]}"; do
    [ -e "$b" ] || b=$(command -v "$(basename "$b")") || die "missing binary $b"
    b=$(readlink -f "$b")
    cp "$b" "$ramfs/usr/bin/$(basename "$b")"
    ldd "$b" | awk '/=> \// {print $3} /^\t\/lib64/ {print $1}' >> "$work/libs.txt"
done
sort -u "$work/libs.txt" | while read -r lib; do
    real=$(readlink -f "$lib")
    mkdir -p "$ramfs$(dirname "$lib")"
    cp "$real" "$ramfs$lib"
done
# usrmerge: /lib and /lib64 are symlinks on the host; the libraries were copied to the
# paths ldd printed (/lib/x86_64-linux-gnu/..., /lib64/ld-linux-x86-64.so.2) which is
# where the dynamic loader and the binaries' interpreter field look.

# --- config files and init ----------------------------------------------------------
cat > "$ramfs/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
EOF
echo "root:x:0:" > "$ramfs/etc/group"
echo "127.0.0.1 localhost" > "$ramfs/etc/hosts"
# Default identity for nvme-cli; the suite passes --hostnqn/--hostid explicitly anyway.
echo "nqn.2026-11.io.kvtarget:interop-host" > "$ramfs/etc/nvme/hostnqn"
echo "6b7a7f1e-0c1d-4d2e-9a41-6b7674000001" > "$ramfs/etc/nvme/hostid"
mknod -m 600 "$ramfs/dev/console" c 5 1   # init's stdio before devtmpfs is mounted
mknod -m 666 "$ramfs/dev/null" c 1 3
cp "$here/init" "$ramfs/init"
chmod 755 "$ramfs/init"

mkdir -p "$work/out"
cp "$kroot/boot/vmlinuz-$krel" "$work/out/vmlinuz"
# Uncompressed cpio: unpacking is a memcpy, whereas decompressing ~90 MB under TCG
# costs seconds on every boot.
(cd "$ramfs" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet) \
    > "$work/out/initramfs.cpio"
{
    echo "key $key"
    echo "kernel_release $krel"
    printf '%s\n' "$key_src"
    echo "modules:"; sed 's/^/  /' "$work/modules.list"
} > "$work/out/manifest.txt"
touch "$work/out/.complete"

rm -rf "$out"
mv "$work/out" "$out"
ln -sfn "$key" "$cache/current"
# Keep only the current build and its kernel .deb.
find "$cache/debs" -name '*.deb' ! -name "$(basename "$deb")" -delete
for d in "$cache"/*/; do
    d=${d%/}
    case "$(basename "$d")" in debs|current|"$key") ;; *) rm -rf "$d" ;; esac
done
log "built $out ($(du -sh "$out/initramfs.cpio" | cut -f1) initramfs)"
echo "$out"
