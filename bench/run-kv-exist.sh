#!/usr/bin/env bash
# Exist round trips (issue 37 item 5): a KV-cache manager asks "which of these keys do
# you have?" before every prefill, as a batch of Exist commands in flight at once. This
# measures, per queue depth, Exists per second and their latency (P50, P99, P99.9, max)
# as `kvtarget perf` sees them, and the target reactor's busy time per Exist: the
# reactor's cost of one key of such a batch.
#
#   bench/run-kv-exist.sh [--secs S] [--rounds N] [--qds LIST] [--keys K] [--record] [--keep]
#
#   --secs S     measured seconds per run (default 5, after 1 s of warm-up)
#   --rounds N   rounds (default 3); a fresh target each round; tables give the median
#   --qds LIST   queue depths (default 1,2,4,8,16,32,64)
#   --keys K     keys stored before each run, 4 KiB values (default 32768)
#   --record     append the table to bench/RESULTS.md (date, commit, command, load)
#   --keep       keep the work directory (outputs, target log, metric samples)
#
# The target: kvtarget, one reactor busy-polling core 0, a RAM pool with one 1 GiB KV
# volume (NSID 1). The initiator: `kvtarget perf --kv --workload exist`, one queue,
# pinned to core 1; it stores its keys first (outside the measured window), then
# sends Exists of random keys, QD of them in flight.
#
# Reactor busy time per Exist: the target's metrics are sampled every 0.5 s during
# the run (kvtarget_reactor_busy_seconds_total, kvtarget_kv_hits_total,
# kvtarget_kv_stores_total); over the samples in which no Store completed (the
# prefill is over) and Exists did, busy seconds / Exists that found their key. A
# busy-polling reactor counts a poll as busy when it found work, so this is the time
# spent in polls that handled Exists: receiving, parsing, the index lookup, the
# response.
#
# Nothing else may run on the machine during a measurement (2 cores); the script
# warns when the 1-minute load average is above 0.5.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
SECS=5 ROUNDS=3 QDS=1,2,4,8,16,32,64 KEYS=32768 RECORD=0 KEEP=0
ARGS="$*"
while [ $# -gt 0 ]; do
    case $1 in
        --secs) SECS=$2; shift ;;
        --rounds) ROUNDS=$2; shift ;;
        --qds) QDS=$2; shift ;;
        --keys) KEYS=$2; shift ;;
        --record) RECORD=1 ;;
        --keep) KEEP=1 ;;
        *) echo "run-kv-exist: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
load=$(cut -d' ' -f1 /proc/loadavg)
if awk -v l="$load" 'BEGIN { exit !(l > 0.5) }'; then
    echo "run-kv-exist: warning: 1-minute load average is $load; figures will be noisy" >&2
fi
if [ -z "${KVTARGET_BIN:-}" ]; then
    (cd "$repo" && cargo build --release --quiet)
    KVTARGET_BIN=$repo/target/release/kvtarget
fi
bin=$KVTARGET_BIN
work=$(mktemp -d /tmp/kvt-bench-exist.XXXXXX)
tgt_pid= sampler=
cleanup() {
    [ -z "$sampler" ] || kill "$sampler" 2>/dev/null || true
    [ -n "$tgt_pid" ] && kill "$tgt_pid" 2>/dev/null && wait "$tgt_pid" 2>/dev/null || true
    if [ "$KEEP" = 1 ]; then echo "run-kv-exist: kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port) mport=$(free_port)
NQN=nqn.2026-12.io.kvtarget:bench-exist
cat > "$work/exist.toml" <<EOF
# Written by bench/run-kv-exist.sh
[reactors]
cores = [0]
idle = "busy"

[rpc]
socket = "$work/rpc.sock"

[metrics]
address = "127.0.0.1:$mport"

[[listeners]]
address = "127.0.0.1"
port = $port

[[pools]]
name = "bench"
backend = "ram"
size = "1088MiB"
extent_size = "1MiB"

[[pools.volumes]]
name = "cache"
size = "1GiB"
kind = "kv"

[[subsystems]]
nqn = "$NQN"
allow_any_host = true

[[subsystems.namespaces]]
nsid = 1
volume = "bench/cache"
on_full = "evict"
EOF
"$bin" check-config "$work/exist.toml" > /dev/null
start_target() {
    if [ -n "$tgt_pid" ]; then kill "$tgt_pid" 2>/dev/null; wait "$tgt_pid" 2>/dev/null || true; fi
    "$bin" --config "$work/exist.toml" >> "$work/target.log" 2>&1 &
    tgt_pid=$!
    # Up to 60 s: a RAM pool is made resident before the target listens.
    for _ in $(seq 600); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
        sleep 0.1
    done
    echo "run-kv-exist: the target did not start: $(tail -n 5 "$work/target.log")" >&2
    exit 1
}
# One line per sample: seconds busy, hits, stores (reactor 0, namespace 1).
sample_metrics() { # out-file
    while :; do
        curl -s "http://127.0.0.1:$mport/metrics" | awk '
            /^kvtarget_reactor_busy_seconds_total/ { b = $NF }
            /^kvtarget_kv_hits_total/ { h = $NF }
            /^kvtarget_kv_stores_total/ { s = $NF }
            END { print b, h, s }' >> "$1"
        sleep 0.5
    done
}

IFS=, read -r -a qds <<< "$QDS"
for r in $(seq "$ROUNDS"); do
    start_target
    for q in "${qds[@]}"; do
        echo "run-kv-exist: round $r, QD $q" >&2
        sample_metrics "$work/r$r-qd$q.metrics" &
        sampler=$!
        taskset -c 1 "$bin" perf --addr "127.0.0.1:$port" --nqn "$NQN" --nsid 1 --kv \
            --kv-keys "$KEYS" --workload exist --bs 4KiB --qd "$q" --queues 1 \
            --time "$SECS" --warmup 1 --cpus 1 --quiet --json > "$work/r$r-qd$q.json" \
            || { echo "run-kv-exist: perf failed: $(cat "$work/r$r-qd$q.json")" >&2; exit 1; }
        kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null || true
        sampler=
    done
done

table=$(python3 - "$work" "$ROUNDS" "$QDS" <<'PY'
import json, statistics, sys
work, rounds, qds = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
def busy_per_exist(path):
    rows = [tuple(float(x) for x in l.split()) for l in open(path) if len(l.split()) == 3]
    busy = hits = 0.0
    for (b0, h0, s0), (b1, h1, s1) in zip(rows, rows[1:]):
        if s1 == s0 and h1 > h0:  # prefill over, Exists completing
            busy += b1 - b0
            hits += h1 - h0
    return busy / hits * 1e6 if hits else float("nan")
print("| QD | Exists/s | P50 us | P99 us | P99.9 us | max us | misses | errors | reactor busy us/Exist |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for q in qds:
    runs = [json.load(open(f"{work}/r{r}-qd{q}.json")) for r in range(1, rounds + 1)]
    med = lambda f: statistics.median(f(x) for x in runs)
    lat = lambda k: med(lambda x: x["lat_us"][k])
    busy = statistics.median(busy_per_exist(f"{work}/r{r}-qd{q}.metrics") for r in range(1, rounds + 1))
    print(f"| {q} | {med(lambda x: x['iops']):,.0f} | {lat('p50'):.1f} | {lat('p99'):.1f} | "
          f"{lat('p99_9'):.1f} | {lat('max'):.1f} | {sum(x['kv']['misses'] for x in runs)} | "
          f"{sum(x['errors'] for x in runs)} | {busy:.2f} |")
PY
)
echo "$table"
if [ "$RECORD" = 1 ]; then
    {
        echo
        echo "### KV Exist round trips by queue depth ($(date -u +%Y-%m-%d), $(git -C "$repo" rev-parse --short HEAD))"
        echo
        echo "\`bench/run-kv-exist.sh $ARGS\`; load average at the start $load; median of $ROUNDS rounds, a fresh target each round."
        echo
        echo "$table"
    } >> "$repo/bench/RESULTS.md"
fi
