#!/usr/bin/env bash
# KV Stores and Retrieves with one and two reactors, two builds in the same run
# (issue 34 item 3): what taking the KV index off its shared mutex buys when a KV
# namespace's queues are spread over reactors.
#
#   bench/run-kv-reactors.sh --base BIN [--secs S] [--rounds N] [--sizes LIST] [--record] [--keep]
#
#   --base BIN    the "before" kvtarget binary (e.g. built from the commit before the
#                 change into another target dir); KVTARGET_BIN (default: this tree's
#                 release build) is "after"
#   --secs S      measured seconds per run (default 5, after 1 s of warm-up)
#   --rounds N    rounds (default 3); tables give the median
#   --sizes LIST  value sizes (default 4KiB,64KiB)
#   --record      append the table to bench/RESULTS.md (date, commits, command, load)
#   --keep        keep the work directory (outputs, target logs)
#
# The target: one RAM pool with a 1 GiB KV volume (NSID 1, on_full = "evict"),
# reactors on core 0, or cores 0 and 1, adaptive idle (a reactor sleeps when it has
# nothing to do, so the initiator gets its core back). The initiator: `kvtarget perf
# --kv`, four queues (connections, spread over the reactors) at QD 16 each, one thread
# on core 1. Store: `--workload write` over --kv-keys keys in order (the index stays
# below capacity); Retrieve: `--workload randread` over the same keys (perf stores
# them first, outside the measured window). Every run starts a fresh target; each
# round alternates which build goes first. With two reactors on two cores the
# initiator shares core 1 with reactor 1: the figures are for comparing the builds
# with each other, not for the absolute rate of a two-reactor target.
#
# Nothing else may run on the machine during a measurement (2 cores); the script
# warns when the 1-minute load average is above 0.5.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
SECS=5 ROUNDS=3 SIZES=4KiB,64KiB RECORD=0 KEEP=0 BASE=
ARGS="$*"
while [ $# -gt 0 ]; do
    case $1 in
        --base) BASE=$2; shift ;;
        --secs) SECS=$2; shift ;;
        --rounds) ROUNDS=$2; shift ;;
        --sizes) SIZES=$2; shift ;;
        --record) RECORD=1 ;;
        --keep) KEEP=1 ;;
        *) echo "run-kv-reactors: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
[ -x "$BASE" ] || { echo "run-kv-reactors: --base BIN (the build to compare against) is required" >&2; exit 2; }
load=$(cut -d' ' -f1 /proc/loadavg)
if awk -v l="$load" 'BEGIN { exit !(l > 0.5) }'; then
    echo "run-kv-reactors: warning: 1-minute load average is $load; figures will be noisy" >&2
fi
if [ -z "${KVTARGET_BIN:-}" ]; then
    (cd "$repo" && cargo build --release --quiet)
    KVTARGET_BIN=$repo/target/release/kvtarget
fi
NEW=$KVTARGET_BIN
work=$(mktemp -d /tmp/kvt-bench-kvr.XXXXXX)
tgt_pid=
cleanup() {
    [ -n "$tgt_pid" ] && kill "$tgt_pid" 2>/dev/null && wait "$tgt_pid" 2>/dev/null || true
    if [ "$KEEP" = 1 ]; then echo "run-kv-reactors: kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port)
NQN=nqn.2026-12.io.kvtarget:bench-kvr
config() { # CORES
    cat <<EOF
# Written by bench/run-kv-reactors.sh
[reactors]
cores = [$1]
idle = "adaptive"

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
}
config 0 > "$work/r1.toml"
config "0, 1" > "$work/r2.toml"
"$NEW" check-config "$work/r2.toml" > /dev/null
start_target() { # BIN CONFIG LOG
    if [ -n "$tgt_pid" ]; then kill "$tgt_pid" 2>/dev/null; wait "$tgt_pid" 2>/dev/null || true; fi
    "$1" --config "$2" >> "$3" 2>&1 &
    tgt_pid=$!
    # Up to 60 s: the RAM pool is made resident before the target listens.
    for _ in $(seq 600); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
        sleep 0.1
    done
    echo "run-kv-reactors: the target did not start: $(tail -n 5 "$3")" >&2
    exit 1
}
keys_for() { # SIZE -> keys addressed: at most half the namespace, at most 65536
    python3 -c "
s = '$1'.lower(); u = {'kib': 1 << 10, 'mib': 1 << 20}
n = next((int(s[:-len(k)]) * v for k, v in u.items() if s.endswith(k)), None) or int(s)
print(min(65536, (512 << 20) // n))"
}
run_one() { # BUILD(base|new) REACTORS SIZE OP(store|retrieve) ROUND
    local bin=$BASE wl=write
    [ "$1" = new ] && bin=$NEW
    [ "$4" = retrieve ] && wl=randread
    start_target "$bin" "$work/r$2.toml" "$work/target-$1.log"
    echo "run-kv-reactors: round $5, $1, $2 reactor(s), $3 $4" >&2
    taskset -c 1 "$bin" perf --addr "127.0.0.1:$port" --nqn "$NQN" --nsid 1 --kv \
        --kv-keys "$(keys_for "$3")" --workload "$wl" --bs "$3" --qd 16 --queues 4 \
        --time "$SECS" --warmup 1 --cpus 1 --quiet --json > "$work/$5-$1-$2-$3-$4.json" \
        || { echo "run-kv-reactors: perf failed: $(cat "$work/$5-$1-$2-$3-$4.json")" >&2; exit 1; }
}

IFS=, read -r -a sizes <<< "$SIZES"
for r in $(seq "$ROUNDS"); do
    order="base new"
    [ $((r % 2)) = 0 ] && order="new base"
    for n in 1 2; do
        for s in "${sizes[@]}"; do
            for op in store retrieve; do
                for b in $order; do run_one "$b" "$n" "$s" "$op" "$r"; done
            done
        done
    done
done

table=$(python3 - "$work" "$ROUNDS" "$SIZES" <<'PY'
import json, statistics, sys
work, rounds, sizes = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
print("| reactors | value | op | before ops/s | after ops/s | after/before | P99 us before / after | P99.9 us before / after | max us before / after | errors |")
print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
for n in (1, 2):
    for s in sizes:
        for op in ("store", "retrieve"):
            runs = {b: [json.load(open(f"{work}/{r}-{b}-{n}-{s}-{op}.json")) for r in range(1, rounds + 1)]
                    for b in ("base", "new")}
            med = lambda b, f: statistics.median(f(x) for x in runs[b])
            ops = {b: med(b, lambda x: x["iops"]) for b in runs}
            lat = lambda k: " / ".join(f"{med(b, lambda x: x['lat_us'][k]):.0f}" for b in ("base", "new"))
            errs = sum(x["errors"] for b in runs for x in runs[b])
            print(f"| {n} | {s} | {op} | {ops['base']:,.0f} | {ops['new']:,.0f} | "
                  f"{ops['new'] / ops['base']:.2f}x | {lat('p99')} | {lat('p99_9')} | {lat('max')} | {errs} |")
PY
)
echo "$table"
if [ "$RECORD" = 1 ]; then
    {
        echo
        echo "### KV Stores and Retrieves with one and two reactors, before and after ($(date -u +%Y-%m-%d), $(git -C "$repo" rev-parse --short HEAD))"
        echo
        echo "\`bench/run-kv-reactors.sh $ARGS\`; before: \`$("$BASE" --version 2>/dev/null || echo "$BASE")\`; load average at the start $load; median of $ROUNDS rounds, a fresh target every run, builds alternated."
        echo
        echo "$table"
    } >> "$repo/bench/RESULTS.md"
fi
