#!/usr/bin/env bash
# `promtool check metrics` on a live target's /metrics (issue 33): starts the
# release binary with metrics on a free loopback port, a RAM pool with a block
# and a KV volume and a plain RAM namespace (so reactor, queue pair, volume,
# KV, pool and GC series all appear), runs a second of I/O with the in-repo
# initiator, scrapes, and fails on any promtool finding.
#
#   ci/promtool.sh                      uses target/release/kvtarget
#   KVTARGET_BIN=path ci/promtool.sh    another build
#   METRICS_OUT=file ci/promtool.sh     also keep the scrape in file
#
# Needs Debian's `prometheus` package (promtool; ci/lib/debian.sh's group tools).
set -euo pipefail
cd "$(dirname "$0")/.."

bin=${KVTARGET_BIN:-$PWD/target/release/kvtarget}
[[ -x $bin ]] || { echo "promtool.sh: no kvtarget binary at $bin" >&2; exit 1; }

log() { echo "promtool.sh: $*" >&2; }
die() { echo "promtool.sh: error: $*" >&2; exit 1; }
source ci/lib/debian.sh
install_debs tools   # promtool: Debian's prometheus package

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

dir=$(mktemp -d)
pid=
cleanup() {
    if [[ -n $pid ]]; then
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    rm -rf "$dir"
}
trap cleanup EXIT

mport=$(free_port)
port=$(free_port)
nqn=nqn.2026-12.io.kvtarget:promtool
cat >"$dir/kvtarget.toml" <<EOF
[reactors]
count = 1
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
backend = "ram"
size = "256MiB"
extent_size = "1MiB"

[[pools.volumes]]
name = "blocks"
size = "64MiB"
block_size = 4096

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
size = "64MiB"
block_size = 4096
EOF

"$bin" --config "$dir/kvtarget.toml" >"$dir/kvtarget.log" 2>&1 &
pid=$!

scrape() { curl -fsS "http://127.0.0.1:$mport/metrics"; }
for _ in $(seq 100); do
    scrape >/dev/null 2>&1 && break
    kill -0 "$pid" 2>/dev/null || { cat "$dir/kvtarget.log" >&2; exit 1; }
    sleep 0.1
done

# A little I/O so the per-queue-pair and per-volume series carry values.
for ns in 1 3; do
    "$bin" perf --addr "127.0.0.1:$port" --nqn "$nqn" --nsid "$ns" --workload randrw \
        --bs 4KiB --qd 4 --time 0.5 --quiet >/dev/null
done
"$bin" perf --addr "127.0.0.1:$port" --nqn "$nqn" --nsid 2 --kv --workload randrw \
    --bs 4KiB --qd 4 --time 0.5 --quiet >/dev/null

scrape >"$dir/metrics.txt"
[[ -n ${METRICS_OUT:-} ]] && cp "$dir/metrics.txt" "$METRICS_OUT"
echo "promtool.sh: $(grep -c '^# TYPE' "$dir/metrics.txt") metric families, $(grep -vc '^#' "$dir/metrics.txt") samples"
promtool check metrics <"$dir/metrics.txt"
echo "promtool.sh: promtool check metrics: no findings"
