#!/usr/bin/env bash
# Where the target's time goes: samples the reactor with `perf record` while
# `kvtarget perf` drives one profile, and writes a flame graph (SVG), the folded
# stacks, and a text summary (user/kernel split, hottest symbols) into
# .cache/flame/ (ignored by git).
#
#   bench/run-flamegraph.sh [--secs N] [--name NAME] [-- PERF-WORKLOAD-ARGS...]
#
# The default profile is 4 KiB random reads at QD32. Workload arguments after
# `--` go to `kvtarget perf` as they are, e.g.
#   bench/run-flamegraph.sh --name randwrite-qd32 -- --workload randwrite --bs 4KiB --qd 32
#
# The target runs from config/bench-ram.toml (core 0, busy-poll, 1 GiB RAM
# namespace, 127.0.0.1:4420) and the load on core 1, as in bench/run-profiles.sh.
# Needs `perf` (Debian linux-perf, installed if missing) and inferno's collapse
# and flamegraph tools (`cargo install inferno` into .cache/tools if missing).
set -euo pipefail
cd "$(dirname "$0")/.."

secs=4 name=randread-4k-qd32
workload=(--workload randread --bs 4KiB --qd 32)
while [ $# -gt 0 ]; do
    case "$1" in
        --secs) secs=$2; shift 2 ;;
        --name) name=$2; shift 2 ;;
        --) shift; workload=("$@"); break ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "run-flamegraph: unknown argument $1 (workload arguments go after --)" >&2; exit 2 ;;
    esac
done

if ! command -v perf >/dev/null; then
    apt-get update -q && apt-get install -y -q linux-perf
fi
tools=$PWD/.cache/tools/bin
if [ ! -x "$tools/inferno-flamegraph" ]; then
    cargo install --locked inferno --root "$PWD/.cache/tools" -q
fi
# A release build with frame pointers (its own target dir): cheap call-graph
# sampling that disturbs the reactor far less than DWARF unwinding would.
RUSTFLAGS="-C force-frame-pointers=yes" cargo build --release -q --target-dir target/fp
bin=$PWD/target/fp/release/kvtarget
out=$PWD/.cache/flame
mkdir -p "$out"
work=$(mktemp -d /tmp/kvt-flame.XXXXXX)
nqn=nqn.2026-11.io.kvtarget:bench-ram
addr=127.0.0.1:4420

"$bin" --config config/bench-ram.toml -r "$work/rpc.sock" 2>"$work/target.log" &
tpid=$!
load=
cleanup() {
    [ -n "$load" ] && kill "$load" 2>/dev/null
    kill "$tpid" 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
for _ in $(seq 300); do
    grep -q "listening on" "$work/target.log" && break
    kill -0 "$tpid" 2>/dev/null || { cat "$work/target.log" >&2; exit 1; }
    sleep 0.1
done
# Write the namespace first so reads touch real pages, not the shared zero page.
taskset -c 1 "$bin" perf --addr $addr --nqn $nqn --cpus 1 --workload write --bs 1MiB --qd 8 \
    --time 3 --warmup 0 --quiet >/dev/null

taskset -c 1 "$bin" perf --addr $addr --nqn $nqn --cpus 1 --time $((secs + 2)) --warmup 1 \
    --quiet "${workload[@]}" >"$work/load.txt" 2>&1 &
load=$!
sleep 1
perf record -q -F 999 -g -p "$tpid" -o "$work/perf.data" -- sleep "$secs" 2>/dev/null
wait "$load" || true
load=

stamp=$(date -u +%Y%m%d-%H%M%S)
base=$out/$name-$stamp
perf script -i "$work/perf.data" 2>/dev/null | "$tools/inferno-collapse-perf" > "$base.folded"
"$tools/inferno-flamegraph" --title "kvtarget reactor: $name ($(git rev-parse --short HEAD))" \
    < "$base.folded" > "$base.svg"
{
    echo "profile: $name (${workload[*]}), commit $(git rev-parse --short HEAD), $(date -u '+%F %T') UTC"
    grep IOPS "$work/load.txt" || cat "$work/load.txt"
    echo
    perf report -i "$work/perf.data" --no-children --sort dso --stdio -g none 2>/dev/null \
        | grep '%' | sed -n '1,6s/^ */  /p'
    echo
    echo "hottest symbols (self time):"
    perf report -i "$work/perf.data" --no-children --sort symbol --stdio -g none 2>/dev/null \
        | grep '%' | sed -n '1,25s/^ */  /p'
} > "$base.txt"
cat "$base.txt"
echo
echo "flame graph: $base.svg"
