#!/usr/bin/env bash
# The deps stage of ci/test.sh: every Debian package any stage needs (the groups in
# ci/lib/debian.sh), in one step: one `apt-get update`, one `apt-get install` of what
# is missing. Another package manager holding dpkg's or apt's locks delays it (up to
# KVT_APT_LOCK_WAIT seconds, default 1200), it does not fail it; a transient error is
# tried once more. Needs root when anything is missing.
#
#   ci/deps.sh            install what is missing
#   ci/deps.sh --check    list what is missing; exit 1 if anything is
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
log() { echo "deps: $*" >&2; }
die() { echo "deps: error: $*" >&2; exit 1; }
source "$here/lib/debian.sh"

# Disk first: a full run writes about 12 GiB (target/, .cache/, the guests' pools and
# SPDK's AIO bdev); short of that, a guest stage fails 30 minutes in with ENOSPC from
# SPDK's bdev, far from the cause.
need_gib=${KVT_CI_DISK_GIB:-15}
free_gib=$(( $(df --output=avail -k "$here/.." | tail -n 1) / 1048576 ))
[ "$free_gib" -ge "$need_gib" ] \
    || die "$free_gib GiB free on the file system of $(cd "$here/.." && pwd); a run needs about $need_gib GiB (KVT_CI_DISK_GIB)"
log "$free_gib GiB free on the repository's file system (a run needs about $need_gib)"

mapfile -t all < <(debs_of "${DEB_GROUPS[@]}" | sort -u)
mapfile -t missing < <(missing_debs "${all[@]}")
if [ "${1:-}" = --check ]; then
    [ ${#missing[@]} = 0 ] || { echo "missing: ${missing[*]}"; exit 1; }
    echo "all ${#all[@]} packages installed"
    exit 0
fi
[ ${#missing[@]} = 0 ] || [ "$(id -u)" = 0 ] \
    || die "missing Debian packages (run as root to install): ${missing[*]}"
# No service starts at install time: etcd and prometheus run only where a test
# starts its own (a packaged etcd on 2379 would also take a port the tests use).
policy=/usr/sbin/policy-rc.d
own_policy=
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 755 "$policy" && own_policy=1
fi
trap '[ -z "$own_policy" ] || rm -f "$policy"' EXIT
t0=$SECONDS
# Always: the package lists must be current for the guest's kernel download too
# (ci/guest/build.sh fetches the kernel linux-image-amd64 points at).
if [ "$(id -u)" = 0 ]; then
    apt_get update || die "apt-get update failed"
fi
if [ ${#missing[@]} = 0 ]; then
    log "all ${#all[@]} packages installed already ($((SECONDS - t0)) s)"
    exit 0
fi
log "installing ${#missing[@]} of ${#all[@]} packages: ${missing[*]}"
apt_get install -y --no-install-recommends "${missing[@]}" || die "apt-get install failed"
mapfile -t still < <(missing_debs "${all[@]}")
[ ${#still[@]} = 0 ] || die "still missing after the install: ${still[*]}"
log "installed ${#missing[@]} packages in $((SECONDS - t0)) s"
