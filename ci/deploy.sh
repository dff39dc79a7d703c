#!/usr/bin/env bash
# The Debian package as an operator installs it (issue 58):
#   1. builds it from Cargo.toml's [package.metadata.deb] with dpkg-deb
#      (deploy/debian/build-deb.py) around the release binary, and checks
#      its files and conffile;
#   2. installs it with `dpkg -i` into a clean Debian 12 root (debootstrap
#      minbase with systemd, man-db and the package's dependencies, cached under
#      .cache/debian12-root/ keyed by what it is made of), checks the packaged
#      configuration and man page, and runs `systemd-analyze verify` on the unit
#      there (it must say nothing); then purges it again;
#   3. runs the daemon under strace through a start, NVMe/TCP I/O, RPC calls,
#      `kvtarget top --once` and a stop, and fails if it made a system call
#      outside the unit's SystemCallFilter=@system-service.
# READY=1, WATCHDOG=1 and STOPPING=1 are cargo tests (tests/systemd.rs).
#
#   ci/deploy.sh                        uses target/release/kvtarget
#   KVTARGET_BIN=path ci/deploy.sh      another build
#
# Runs as root (debootstrap, chroot, mount). Needs debootstrap, dpkg-dev,
# binutils, systemd and strace (ci/lib/debian.sh's group deploy: run by hand it
# installs what is missing, inside ci/test.sh it only checks), python3, and
# cargo for `cargo metadata` (the root package kvtarget's [package.metadata.deb]).
# The first run downloads Debian 12's minbase from the Debian mirror apt uses
# (about a minute); later runs copy the cached root.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "deploy.sh: $*" >&2; }
die() { echo "deploy.sh: $*" >&2; exit 1; }
bin=${KVTARGET_BIN:-$PWD/target/release/kvtarget}
[[ -x $bin ]] || die "no kvtarget binary at $bin (cargo build --release)"
[[ $(id -u) -eq 0 ]] || die "run as root (debootstrap, chroot and mount)"
source ci/lib/debian.sh
install_debs deploy   # debootstrap dpkg-dev binutils systemd strace
for tool in debootstrap dpkg-deb dpkg-shlibdeps strip systemd-analyze strace python3 cargo chroot; do
    command -v "$tool" >/dev/null || die "$tool missing (see this script's header for the packages)"
done

dir=$(mktemp -d)
root=$dir/root
pid=
cleanup() {
    if [[ -n $pid ]]; then
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    if mountpoint -q "$root/proc" 2>/dev/null; then umount "$root/proc" || true; fi
    rm -rf "$dir"
}
trap cleanup EXIT
t0=$SECONDS

# 1. The package.
deb=$(KVTARGET_BIN=$bin python3 deploy/debian/build-deb.py) || die "building the package failed"
dpkg-deb -c "$deb" | awk '{print $6}' >"$dir/contents"
for f in ./usr/bin/kvtarget ./etc/kvtarget/kvtarget.toml ./lib/systemd/system/kvtarget.service \
    ./usr/share/man/man1/kvtarget.1.gz ./usr/share/man/man1/kvtarget-top.1.gz \
    ./usr/share/kvtarget/prometheus/alerts.yml ./usr/share/kvtarget/grafana/kvtarget.json \
    ./usr/share/doc/kvtarget/copyright ./usr/share/doc/kvtarget/operations.md; do
    grep -qxF "$f" "$dir/contents" || die "$deb lacks $f"
done
dpkg-deb -I "$deb" conffiles | grep -qxF /etc/kvtarget/kvtarget.toml ||
    die "/etc/kvtarget/kvtarget.toml is not a conffile"
echo "deploy.sh: built $deb ($(du -k "$deb" | cut -f1) KiB; depends: $(dpkg-deb -f "$deb" Depends))"

# 2. A clean Debian 12 root with systemd and the package's dependencies, as
# debootstrap makes it from the mirror apt uses; cached by what it is made of.
mirror=$(sed -n 's/^URIs: *\(http[^ ]*\/debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
mirror=${mirror:-http://deb.debian.org/debian}
deps=$(dpkg-deb -f "$deb" Depends | tr ',' '\n' | sed 's/|.*//; s/(.*)//; s/ //g' | grep -v '^$' | sort -u | paste -sd, -)
# man-db: verify looks up the unit's Documentation=man:kvtarget(1) in the package.
include="systemd,man-db${deps:+,$deps}"
key=$( { dpkg-query -W -f='${Version}' debootstrap; echo " bookworm minbase $include $mirror"; } | sha256sum | cut -c1-16)
cache=.cache/debian12-root/$key
if [[ ! -f $cache.done ]]; then
    echo "deploy.sh: making a Debian 12 root ($include) in $cache"
    rm -rf .cache/debian12-root
    mkdir -p .cache/debian12-root
    debootstrap --variant=minbase --include="$include" bookworm "$cache" "$mirror" >"$dir/debootstrap.log" 2>&1 ||
        { tail -20 "$dir/debootstrap.log" >&2; die "debootstrap failed"; }
    rm -f "$cache"/var/cache/apt/archives/*.deb
    touch "$cache.done"
fi
cp -a "$cache" "$root"
mount -t proc proc "$root/proc"
cp "$deb" "$root/tmp/kvtarget.deb"
chroot "$root" dpkg -i /tmp/kvtarget.deb >"$dir/dpkg.log" 2>&1 ||
    { cat "$dir/dpkg.log" >&2; die "dpkg -i on a clean Debian 12 root failed"; }
chroot "$root" dpkg-query -W -f='${Status}' kvtarget | grep -qx 'install ok installed' ||
    die "kvtarget is not installed after dpkg -i"
chroot "$root" kvtarget check-config /etc/kvtarget/kvtarget.toml >/dev/null ||
    die "the packaged /etc/kvtarget/kvtarget.toml does not load"
zcat "$root/usr/share/man/man1/kvtarget.1.gz" | grep -q '^\.TH kvtarget 1' ||
    die "kvtarget.1 is not a man page"
verify=$(chroot "$root" systemd-analyze verify /lib/systemd/system/kvtarget.service 2>&1) ||
    die "systemd-analyze verify failed: $verify"
[[ -z $verify ]] || die "systemd-analyze verify: $verify"
exposure=$(chroot "$root" systemd-analyze security --offline=yes /lib/systemd/system/kvtarget.service 2>/dev/null |
    sed -n 's/.*Overall exposure level for kvtarget.service: *//p')
echo "deploy.sh: dpkg -i on Debian 12 ok; systemd-analyze verify: clean; exposure: ${exposure:-unknown}"
chroot "$root" dpkg --purge kvtarget >"$dir/purge.log" 2>&1 || { cat "$dir/purge.log" >&2; die "dpkg --purge failed"; }
[[ ! -e $root/etc/kvtarget && ! -e $root/usr/bin/kvtarget ]] || die "dpkg --purge left files behind"
umount "$root/proc"

# 3. Every system call the daemon makes is in the unit's filter.
systemd-analyze syscall-filter >"$dir/groups.txt" 2>/dev/null
python3 - "$dir/groups.txt" @system-service >"$dir/allowed.txt" <<'PY'
import sys
groups, cur = {}, None
for line in open(sys.argv[1]):
    s = line.strip()
    if not s or s.startswith("#"):
        continue
    if not line.startswith(" "):
        cur = groups.setdefault(s, [])
    elif cur is not None:
        cur.append(s)
def expand(name, seen=set()):
    if name in seen:
        return []
    seen.add(name)
    out = []
    for x in groups.get(name, []):
        out += expand(x) if x.startswith("@") else [x]
    return out
print("\n".join(sorted(set(expand(sys.argv[2])))))
PY
[[ -s $dir/allowed.txt ]] || die "systemd-analyze syscall-filter listed nothing for @system-service"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port) mport=$(free_port)
nqn=nqn.2026-12.io.kvtarget:deploy
cat >"$dir/kvtarget.toml" <<EOF
[reactors]
count = 2
idle = "adaptive"
[rpc]
socket = "$dir/kvtarget.sock"
[metrics]
address = "127.0.0.1:$mport"
[[listeners]]
address = "127.0.0.1"
port = $port
[[pools]]
name = "kv"
backend = "uring"
path = "$dir/pool.img"
size = "256MiB"
[[pools.volumes]]
name = "blocks"
size = "64MiB"
[[pools.volumes]]
name = "cache"
size = "64MiB"
kind = "kv"
[[subsystems]]
nqn = "$nqn"
allow_any_host = true
[[subsystems.namespaces]]
nsid = 1
volume = "kv/blocks"
[[subsystems.namespaces]]
nsid = 2
volume = "kv/cache"
EOF
strace -f -qq -c -o "$dir/syscalls.txt" "$bin" --config "$dir/kvtarget.toml" \
    >"$dir/kvtarget.log" 2>&1 &
pid=$!
for _ in $(seq 300); do
    [[ -S $dir/kvtarget.sock ]] && break
    kill -0 "$pid" 2>/dev/null || { cat "$dir/kvtarget.log" >&2; die "the daemon did not start under strace"; }
    sleep 0.1
done
[[ -S $dir/kvtarget.sock ]] || die "the daemon's RPC socket never appeared"
"$bin" perf --addr "127.0.0.1:$port" --nqn "$nqn" --nsid 1 --workload randrw --bs 4KiB --qd 4 \
    --time 0.5 --quiet >/dev/null || die "perf against the traced daemon failed"
"$bin" perf --addr "127.0.0.1:$port" --nqn "$nqn" --nsid 2 --kv --workload randrw --bs 4KiB --qd 4 \
    --time 0.5 --quiet >/dev/null || die "KV perf against the traced daemon failed"
"$bin" rpc -r "$dir/kvtarget.sock" kvtarget_pool_checkpoint name=kv >/dev/null || die "rpc failed"
"$bin" top -r "$dir/kvtarget.sock" --once --delay 0.3 >/dev/null || die "top --once failed"
python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$mport/metrics').read()" ||
    die "scrape failed"
# Stop the daemon itself (strace's pid is $pid): the stop path is traced too.
dpid=$("$bin" rpc -r "$dir/kvtarget.sock" --json framework_get_reactors |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["pid"])') || die "no daemon pid"
kill -TERM "$dpid"
wait "$pid" || die "the traced daemon did not stop cleanly: $(tail -3 "$dir/kvtarget.log")"
pid=
# strace -c's table: the name is the last column of each row.
awk 'NR > 2 && $NF ~ /^[a-z_0-9]+$/ && $NF != "total" {print $NF}' "$dir/syscalls.txt" | sort -u >"$dir/used.txt"
[[ $(wc -l <"$dir/used.txt") -gt 20 ]] || { cat "$dir/syscalls.txt" >&2; die "strace saw too few system calls"; }
outside=$(comm -23 "$dir/used.txt" "$dir/allowed.txt" | paste -sd' ' -)
[[ -z $outside ]] || die "system calls outside SystemCallFilter=@system-service: $outside"
echo "deploy.sh: $(wc -l <"$dir/used.txt") distinct system calls, all in @system-service"
echo "deploy.sh: ok in $((SECONDS - t0)) s"
