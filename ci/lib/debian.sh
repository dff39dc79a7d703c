# Sourced by the ci/ and tests/ scripts that need Debian packages (a fresh machine
# lacks many). The packages are listed here once, by what needs them; ci/deps.sh
# installs every group in one step at the start of ci/test.sh, and the scripts call
# `install_debs GROUP...` for their own groups:
#   - inside ci/test.sh (KVT_CI=1) it only checks: a job never installs packages, it
#     fails naming what ci/deps.sh should have installed;
#   - run by hand, it installs what is missing (as root), as ci/deps.sh does.
# The caller's `log` and `die` report (defaults below).

# SPDK v25.09 from source (ci/spdk.sh), bindgen over its headers (libclang) for the
# `spdk` feature, its NVMe/RDMA host (rdma-core).
DEBS_spdk=(build-essential pkgconf python3 libdpdk-dev libnuma-dev libaio-dev uuid-dev
    libssl-dev libkeyutils-dev libbsd-dev libarchive-dev nasm autoconf automake libtool
    help2man libclang-dev clang xz-utils libibverbs-dev librdmacm-dev)
# SPDK v26.05 with DPDK v25.11 (ci/spdk26.sh): DPDK's meson build and SPDK 26.05's
# generated RPC header (jinja2, tabulate for Debian's python3).
DEBS_spdk26=(meson ninja-build python3-pyelftools python3-jinja2 python3-tabulate)
# The QEMU guest (ci/guest/build.sh copies these host binaries into its initramfs;
# run.sh needs qemu and, for its tap network, iproute2 and nftables); pip fetches
# LMCache's wheel.
DEBS_guest=(qemu-system-x86 busybox-static nvme-cli fio jq kmod cpio util-linux coreutils
    iproute2 dpkg libibverbs1 librdmacm1 ibverbs-providers python3.11-minimal
    libpython3.11-stdlib nftables python3-pip)
# Host-side tools of the suites: etcd for the cluster tests and scenarios, promtool,
# SPDK's Python RPC client in a virtualenv, curl and jq for etcd's HTTP gateway.
DEBS_tools=(etcd-server prometheus python3-venv curl jq nvme-cli procps)
# The fuzzers' AFL++ build.
DEBS_fuzz=(build-essential)
# The operator's kit: the Debian package built with dpkg-deb and installed into a
# debootstrapped Debian 12 root, its unit checked by systemd-analyze, the daemon's
# system calls by strace (ci/deploy.sh); `kvtarget top` driven in tmux (ci/top.sh).
DEBS_deploy=(debootstrap dpkg-dev binutils systemd strace tmux)

debs_of() { # GROUP...: the packages of those groups
    local g
    for g in "$@"; do
        declare -p "DEBS_$g" > /dev/null 2>&1 || { echo "debian.sh: no package group '$g'" >&2; return 2; }
        local -n group="DEBS_$g"
        printf '%s\n' "${group[@]}"
    done
}
DEB_GROUPS=(spdk spdk26 guest tools fuzz deploy)

declare -F log >/dev/null || log() { echo "debian: $*" >&2; }
declare -F die >/dev/null || die() { echo "debian: error: $*" >&2; exit 1; }

missing_debs() { # PKG...: those not installed
    local p
    for p in "$@"; do
        dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
    done
}

# apt_get ARGS...: apt-get that waits for another package manager instead of failing:
# dpkg's lock through apt's own DPkg::Lock::Timeout, and any lock apt-get reports
# (the package lists', the archive cache's) by trying again every 5 s, both up to
# KVT_APT_LOCK_WAIT seconds (default 1200). Any other failure (a mirror's transient
# error) is tried once more, 15 s later.
apt_get() {
    local wait=${KVT_APT_LOCK_WAIT:-1200} out rc retried= said=
    local deadline=$((SECONDS + wait))
    out=$(mktemp)
    while :; do
        DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout="$wait" "$@" > "$out" 2>&1
        rc=$?
        if [ "$rc" != 0 ] && [ "$SECONDS" -lt "$deadline" ] \
                && grep -qiE 'could not (get|open) lock|unable to (acquire|lock)|is another process using it' "$out"; then
            [ -n "$said" ] || { cat "$out" >&2; log "apt-get $1: another package manager holds a lock; waiting (up to ${wait}s)"; }
            said=1
            sleep 5
            continue
        fi
        cat "$out" >&2
        [ "$rc" != 0 ] || break
        [ -z "$retried" ] || break
        retried=1
        log "apt-get $1 failed (status $rc); trying once more in 15 s"
        sleep 15
    done
    rm -f "$out"
    return "$rc"
}

# install_debs GROUP...: see the header.
install_debs() {
    local pkgs missing
    pkgs=$(debs_of "$@") || die "install_debs: unknown package group in: $*"
    # shellcheck disable=SC2086
    missing=$(missing_debs $pkgs | tr '\n' ' ')
    missing=${missing% }
    [ -n "$missing" ] || return 0
    if [ -n "${KVT_CI:-}" ]; then
        die "Debian packages missing: $missing (ci/deps.sh installs them in the deps stage; a job never installs packages)"
    fi
    [ "$(id -u)" = 0 ] || die "missing Debian packages (run as root to install): $missing"
    log "installing missing packages: $missing"
    apt_get update >&2 || die "apt-get update failed"
    # shellcheck disable=SC2086
    apt_get install -y --no-install-recommends $missing >&2 || die "apt-get install $missing failed"
}
