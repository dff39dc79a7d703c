#!/usr/bin/env bash
# Target instructions per I/O, counted by callgrind: a figure this shared, noisy
# machine cannot disturb (the VM has no hardware counters for `perf stat`).
#
#   bench/run-callgrind.sh [--secs N] [--label TEXT] [TARGET_BIN ...]
#
# Each TARGET_BIN (default: this tree's release build) runs config/bench-ram.toml
# (with `idle = "adaptive"`, so an idle reactor sleeps instead of spinning
# through counted instructions) under valgrind's callgrind, counting only inside
# the reactor's loop, the data path. This tree's `kvtarget perf` (native, core 1)
# drives 4 KiB random reads at QD1 and QD32, 4 KiB random writes at QD32, a 4 KiB
# 70/30 random read/write mix at QD32 and 128 KiB sequential writes at QD4
# (target started afresh for each). Reported: user-space
# instructions the reactor executed per I/O; kernel work such as TCP is not
# counted. Several binaries in one run compare data paths on equal terms. Rows
# go to bench/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=8 label= bins=() results=bench/RESULTS.md
while [ $# -gt 0 ]; do
    case "$1" in
        --secs) secs=$2; shift 2 ;;
        --label) label=$2; shift 2 ;;
        --no-results) results=/dev/null; shift ;;
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        *) bins+=("$1"); shift ;;
    esac
done
command -v valgrind >/dev/null || {
    echo "run-callgrind: installing valgrind" >&2
    apt-get update -q >&2 && apt-get install -y -q valgrind >&2
}
cargo build --release -q
perf_bin=$PWD/target/release/kvtarget
[ ${#bins[@]} -gt 0 ] || bins=("$perf_bin")
work=$(mktemp -d /tmp/kvt-callgrind.XXXXXX)
nqn=nqn.2026-11.io.kvtarget:bench-ram
# Its own port, so a target already serving 4420 on this machine does not matter.
port=4520
sed -e 's/^idle = "busy"/idle = "adaptive"/' -e "s/^port = 4420/port = $port/" \
    config/bench-ram.toml >"$work/target.toml"

measure() { # bin workload bs qd -> "instructions ios"
    local bin=$1 w=$2 bs=$3 qd=$4 out=$work/cg.$RANDOM pid j ios ir
    valgrind --tool=callgrind --toggle-collect='*Reactor*run*' --callgrind-out-file="$out" \
        "$bin" --config "$work/target.toml" -r "$work/sock" 2>"$work/tgt.log" &
    pid=$!
    for _ in $(seq 600); do grep -q "listening on" "$work/tgt.log" && break; sleep 0.1; done
    grep -q "listening on" "$work/tgt.log" || { cat "$work/tgt.log" >&2; exit 1; }
    j=$(taskset -c 1 "$perf_bin" perf --addr 127.0.0.1:$port --nqn $nqn --cpus 1 --workload "$w" \
        --bs "$bs" --qd "$qd" --time "$secs" --warmup 0 --json --quiet --poll sleep)
    kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
    ios=$(sed -E 's/.*"ios":([0-9]+).*/\1/' <<<"$j")
    ir=$(sed -nE 's/^(summary|totals): *([0-9]+).*/\2/p' "$out"* | sort -n | tail -1)
    rm -f "$out"*
    echo "$ir $ios"
}

{
    echo
    echo "### $(date -u '+%Y-%m-%d %H:%M') UTC: target user-space instructions per I/O (callgrind) ${label:+- $label}"
    echo
    echo "config/bench-ram.toml (idle adaptive) under valgrind --tool=callgrind --toggle-collect='*Reactor*run*'; \`kvtarget perf\` ran ${secs}s per profile (native, core 1, --poll sleep). Kernel instructions are not counted."
    echo
    echo "| target binary | 4KiB randread QD1 | 4KiB randread QD32 | 4KiB randwrite QD32 | 4KiB randrw 70/30 QD32 | 128KiB write QD4 |"
    echo "|---|---|---|---|---|---|"
} >>"$results"
for b in "${bins[@]}"; do
    row="| \`$b\` |"
    for p in "randread 4KiB 1" "randread 4KiB 32" "randwrite 4KiB 32" "randrw 4KiB 32" "write 128KiB 4"; do
        set -- $p
        read -r ir ios < <(measure "$b" "$1" "$2" "$3")
        row="$row $(awk -v a="$ir" -v b="$ios" 'BEGIN{ if (b>0) printf "%.0f instr/IO (%d IOs)", a/b, b; else print "-" }') |"
    done
    echo "$row" | tee -a "$results"
done
rm -rf "$work"
