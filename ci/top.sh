#!/usr/bin/env bash
# `kvtarget top` as an operator sees it (issue 58): starts a target with a
# block volume, a KV namespace and a plain RAM namespace, puts it under load
# with `kvtarget perf`, runs `kvtarget top` in a 100x40 tmux pane, and reads
# the screen twice: the reactors and namespaces are there with live figures
# (IOPS and P99 of the loaded volume, a pool, the KV namespace's hits), the
# figures change between the two reads (it refreshes in place), no line is
# wider than 80 columns, and q ends it. Then `top --once` prints the same
# view plainly.
#
#   ci/top.sh                          uses target/release/kvtarget
#   KVTARGET_BIN=path ci/top.sh        another build
#   TOP_SCREEN_OUT=file ci/top.sh      also keep the second screen
#
# Needs tmux (ci/lib/debian.sh's group deploy: run by hand as root it installs
# it when missing, inside ci/test.sh it only checks) and python3. About 10 s.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "top.sh: $*" >&2; }
die() { echo "top.sh: $*" >&2; exit 1; }
bin=${KVTARGET_BIN:-$PWD/target/release/kvtarget}
[[ -x $bin ]] || die "no kvtarget binary at $bin (cargo build --release)"
source ci/lib/debian.sh
install_debs deploy   # tmux
command -v python3 >/dev/null || die "python3 missing"

dir=$(mktemp -d)
session=kvtarget-top-$$
pids=()
cleanup() {
    tmux kill-session -t "$session" 2>/dev/null || true
    for p in "${pids[@]}"; do
        kill "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    rm -rf "$dir"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port)
nqn=nqn.2026-12.io.kvtarget:top
cat >"$dir/kvtarget.toml" <<EOF
[reactors]
count = 2
idle = "adaptive"
[rpc]
socket = "$dir/kvtarget.sock"
[[listeners]]
address = "127.0.0.1"
port = $port
[[pools]]
name = "kv"
backend = "ram"
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
[[subsystems.namespaces]]
nsid = 3
backend = "ram"
size = "16MiB"
block_size = 4096
EOF
"$bin" --config "$dir/kvtarget.toml" >"$dir/kvtarget.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
    [[ -S $dir/kvtarget.sock ]] && break
    kill -0 "${pids[0]}" 2>/dev/null || { cat "$dir/kvtarget.log" >&2; die "the target did not start"; }
    sleep 0.1
done
[[ -S $dir/kvtarget.sock ]] || die "the target's RPC socket never appeared"

# Load for longer than the screens are read: block reads and writes on two
# queues, KV stores and retrieves.
"$bin" perf --addr "127.0.0.1:$port" --nqn "$nqn" --nsid 1 --workload randrw --bs 4KiB --qd 8 \
    --queues 2 --time 8 --quiet >"$dir/perf1.log" 2>&1 &
pids+=($!)
"$bin" perf --addr "127.0.0.1:$port" --nqn "$nqn" --nsid 2 --kv --workload randrw --bs 4KiB --qd 4 \
    --time 8 --quiet >"$dir/perf2.log" 2>&1 &
pids+=($!)

tmux new-session -d -s "$session" -x 100 -y 40 "$bin top -r $dir/kvtarget.sock --delay 0.5"
sleep 2.5
tmux capture-pane -p -t "$session" >"$dir/screen1"
sleep 1.2
tmux capture-pane -p -t "$session" >"$dir/screen2"
[[ -n ${TOP_SCREEN_OUT:-} ]] && cp "$dir/screen2" "$TOP_SCREEN_OUT"

show() { echo "--- screen:" >&2; cat "$1" >&2; }
for s in "$dir/screen1" "$dir/screen2"; do
    grep -q '^kvtarget top - pid ' "$s" || { show "$s"; die "no title line"; }
    grep -q '^REACTOR ' "$s" || { show "$s"; die "no reactor table"; }
    grep -Eq '^0 +[0-9.]+ ' "$s" && grep -Eq '^1 +[0-9.]+ ' "$s" ||
        { show "$s"; die "reactors 0 and 1 have no busy figure"; }
    # The loaded volume: read and write IOPS and P99s are figures, not '-'.
    grep -Eq '^top/1 +kv/blocks +[0-9.]+[kM]? +[0-9.]+[kM]? +[0-9.]+ +[0-9.]+ +>?[0-9.]+(us|ms|s) +>?[0-9.]+(us|ms|s)' "$s" ||
        { show "$s"; die "namespace 1 (kv/blocks) has no live IOPS, bandwidth and P99"; }
    grep -q '^top/3 .*(a device: no volume counters)' "$s" || { show "$s"; die "namespace 3 missing"; }
    grep -Eq '^kv +[0-9.]+ ' "$s" || { show "$s"; die "no pool row"; }
    grep -Eq '^kv/cache +[0-9.]+[kM]? +[0-9.]+ ' "$s" || { show "$s"; die "no live KV namespace row"; }
    long=$(awk 'length($0) > 80' "$s")
    [[ -z $long ]] || die "lines wider than 80 columns: $long"
done
cmp -s "$dir/screen1" "$dir/screen2" && { show "$dir/screen2"; die "the screen did not change in 1.2 s"; }
[[ $(grep -c . "$dir/screen2") -ge 12 ]] || { show "$dir/screen2"; die "screen too short"; }

tmux send-keys -t "$session" q
for _ in $(seq 30); do
    tmux has-session -t "$session" 2>/dev/null || break
    sleep 0.1
done
tmux has-session -t "$session" 2>/dev/null && die "q did not end kvtarget top"

"$bin" top -r "$dir/kvtarget.sock" --once --delay 0.3 >"$dir/once"
grep -Eq '^top/1 +kv/blocks +[0-9.]+[kM]? ' "$dir/once" || { show "$dir/once"; die "top --once shows no live figures"; }
grep -q $'\x1b' "$dir/once" && die "top --once printed escape sequences"
echo "top.sh: kvtarget top showed live reactors, namespaces, pools and KV figures in tmux; q quit; --once is plain"
