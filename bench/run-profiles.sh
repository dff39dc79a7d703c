#!/usr/bin/env bash
# The KV-cache profile set (issue 6), measured with `kvtarget perf` and appended to
# bench/RESULTS.md with date, commit and conditions.
#
#   bench/run-profiles.sh [--secs N] [--only REGEX] [--no-results]
#       starts the target from config/bench-ram.toml (one reactor busy-polling
#       core 0, a 1 GiB RAM namespace) and, for the steady-state rows,
#       bench/profiles-pool.toml (a thin volume filling a 1 GiB RAM pool).
#   bench/run-profiles.sh --addr A:P --nqn NQN [--nsid N] [--target-pid PID] [--rpc SOCK] ...
#       measures a target that is already running (the steady-state rows need
#       the pool target and are skipped, and said so).
#
# Every profile also runs a same-run baseline: `kvtarget perf --echo-baseline`, a
# plain loopback TCP exchange of the same byte volume between the same two cores
# with no NVMe processing (a target this script started is SIGSTOPped meanwhile,
# so the baseline has core 0 to itself; a running target given with --addr is
# not, and its baseline shares core 0 with it). The "of TCP" column is kvtarget's IOPS over it. The
# target's CPU time per I/O comes from /proc/<pid>/stat (utime + stime) around
# each run. The load generator runs on core 1 (--cpus 1), the target on core 0.
# "reactor busy" is the share of the target's reactor passes that found work
# (framework_get_reactors, over warm-up and run; needs the RPC socket, --rpc for a
# running target): well under 100 % means the target waited on the load
# generator or the network, not the other way round.
set -euo pipefail
cd "$(dirname "$0")/.."

secs=5 only=. results=bench/RESULTS.md addr= nqn= nsid=1 tpid= rpcsock=
while [ $# -gt 0 ]; do
    case "$1" in
        --secs) secs=$2; shift 2 ;;
        --only) only=$2; shift 2 ;;
        --no-results) results=/dev/null; shift ;;
        --addr) addr=$2; shift 2 ;;
        --nqn) nqn=$2; shift 2 ;;
        --nsid) nsid=$2; shift 2 ;;
        --target-pid) tpid=$2; shift 2 ;;
        --rpc) rpcsock=$2; shift 2 ;;
        -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
        *) echo "run-profiles: unknown argument $1" >&2; exit 2 ;;
    esac
done

cargo build --release -q
bin=$PWD/target/release/kvtarget
log=$(mktemp -d /tmp/kvt-profiles.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

start_target() { # config name -> sets tpid
    local cfg=$1 name=$2
    "$bin" --config "$cfg" -r "$log/$name.sock" 2>"$log/$name.log" &
    pids+=($!)
    tpid=$!
    for _ in $(seq 300); do
        grep -q "listening on" "$log/$name.log" && return 0
        kill -0 "$tpid" 2>/dev/null || break
        sleep 0.1
    done
    echo "run-profiles: target from $cfg did not start:" >&2
    cat "$log/$name.log" >&2
    exit 1
}

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
field() { python3 -c 'import json,sys; d=json.loads(sys.argv[1]); v=d
for k in sys.argv[2].split("."): v=v[k]
print(v)' "$1" "$2"; }

own=0
if [ -z "$addr" ]; then
    own=1
    start_target config/bench-ram.toml ram
    rpcsock=$log/ram.sock
    addr=127.0.0.1:4420 nqn=nqn.2026-11.io.kvtarget:bench-ram
    # Write the whole namespace once, so reads find memory already backed (as
    # SPDK's Malloc bdev is) rather than first-touch page faults.
    taskset -c 1 "$bin" perf --addr $addr --nqn $nqn --cpus 1 --workload write --bs 1MiB --qd 8 \
        --time 4 --warmup 0 --quiet >/dev/null
fi
[ -n "$nqn" ] || { echo "run-profiles: --nqn is required with --addr" >&2; exit 2; }
if [ -z "$tpid" ]; then
    port=${addr##*:}
    tpid=$(ss -Hltnp "sport = :$port" 2>/dev/null | sed -nE 's/.*pid=([0-9]+).*/\1/p' | head -1)
fi
[ -n "$tpid" ] && [ -r "/proc/$tpid/stat" ] || { echo "run-profiles: cannot find the target's pid (use --target-pid)" >&2; exit 2; }

rev=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo "+dirty")
{
    echo
    echo "### $(date -u '+%Y-%m-%d %H:%M') UTC, commit $rev: KV-cache profiles, ${secs}s each"
    echo
    echo "Target: $( [ $own = 1 ] && echo 'config/bench-ram.toml (core 0, busy-poll, 1 GiB RAM namespace)' || echo "running target pid $tpid at $addr nsid $nsid")."
    echo "Load: \`kvtarget perf --cpus 1\` (busy-poll). Baseline: \`kvtarget perf --echo-baseline --server-cpu 0 --cpus 1\`, same workload shape."
    echo "Machine: $(nproc) cores, load average at start $(cut -d' ' -f1-3 /proc/loadavg)."
    echo
    echo "| profile | IOPS | MiB/s | avg us | p50 us | p99 us | p99.9 us | target CPU us/IO | reactor busy | perf CPU us/IO | TCP echo IOPS | of TCP | SPDK ref IOPS | of SPDK |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
} >>"$results"

# SPDK nvmf_tgt reference (issue 6; spdk_nvme_perf, Malloc bdev, same kind of machine).
declare -A spdk=(
    ["randread 4KiB 1"]=108000 ["randread 4KiB 32"]=600000 ["randread 4KiB 128"]=650000
    ["randwrite 4KiB 32"]=419000 ["randrw 4KiB 32"]=572000
    ["read 128KiB 16"]=26703 ["write 1MiB 4"]=3624
)

reactor_ns() { # -> "busy idle" nanoseconds summed over the target's reactors, or "-"
    [ -n "$rpcsock" ] || { echo -; return; }
    "$bin" rpc -r "$rpcsock" --json framework_get_reactors 2>/dev/null | python3 -c '
import json, sys
r = json.load(sys.stdin)["reactors"]
print(sum(x["busy"] for x in r), sum(x["idle"] for x in r))' 2>/dev/null || echo -
}

perf_json() { # extra perf args...
    taskset -c 1 "$bin" perf --addr "$addr" --nqn "$nqn" --nsid "$nsid" --cpus 1 \
        --time "$secs" --warmup 1 --json --quiet "$@"
}

row() { # label, perf-json, target-cpu-seconds, echo-json, spdk, reactor ns before, after
    local label=$1 j=$2 tcpu=$3 e=$4 ref=$5 r0=${6:--} r1=${7:--}
    python3 - "$label" "$j" "$tcpu" "$e" "$ref" "$r0" "$r1" <<'PY' | tee -a "$results"
import json, sys
label, j, tcpu, e, ref = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
r0, r1 = sys.argv[6].split(), sys.argv[7].split()
busy = '-'
if len(r0) == 2 and len(r1) == 2:
    db, di = int(r1[0]) - int(r0[0]), int(r1[1]) - int(r0[1])
    if db + di > 0:
        busy = f'{100 * db / (db + di):.0f} %'
l = j["lat_us"]
ios = max(j["ios"], 1)
cells = [label, f'{j["iops"]:.0f}', f'{j["mib_s"]:.1f}', f'{l["mean"]:.1f}', f'{l["p50"]:.1f}',
         f'{l["p99"]:.1f}', f'{l["p99_9"]:.1f}', f'{tcpu * 1e6 / ios:.2f}', busy, f'{j["cpu_us_per_io"]:.2f}']
if e:
    ej = json.loads(e)
    cells += [f'{ej["iops"]:.0f}', f'{j["iops"] / max(ej["iops"], 1):.2f}']
else:
    cells += ['-', '-']
if ref:
    cells += [ref, f'{j["iops"] / float(ref):.2f}']
else:
    cells += ['-', '-']
if j["errors"]:
    cells[0] += f' ({j["errors"]} errors)'
print('| ' + ' | '.join(cells) + ' |')
PY
}

measure() { # label, spdk ref key or "", perf args...
    local label=$1 key=$2
    shift 2
    echo "$label" | grep -Eq "$only" || return 0
    local e t0 t1 j
    # The baseline's server takes core 0, where the busy-polling target runs: a
    # target this script started is stopped meanwhile.
    [ $own = 0 ] || kill -STOP "$tpid"
    e=$(taskset -c 1 "$bin" perf --echo-baseline --server-cpu 0 --cpus 1 --time "$secs" \
        --warmup 1 --json --quiet "$@")
    [ $own = 0 ] || kill -CONT "$tpid"
    local r0 r1
    r0=$(reactor_ns)
    t0=$(cpu_ticks "$tpid")
    j=$(perf_json "$@")
    t1=$(cpu_ticks "$tpid")
    r1=$(reactor_ns)
    local ref=
    [ -z "$key" ] || ref=${spdk[$key]:-}
    row "$label" "$j" "$(awk -v a="$t0" -v b="$t1" -v h="$hz" 'BEGIN{print (b-a)/h}')" "$e" "$ref" "$r0" "$r1"
}

for qd in 1 32 128; do
    measure "4KiB randread QD$qd" "randread 4KiB $qd" --workload randread --bs 4KiB --qd $qd
    measure "4KiB randwrite QD$qd" "randwrite 4KiB $qd" --workload randwrite --bs 4KiB --qd $qd
    measure "4KiB randrw 70/30 QD$qd" "randrw 4KiB $qd" --workload randrw --rwmix-read 70 --bs 4KiB --qd $qd
done
measure "128KiB seq read QD16" "read 128KiB 16" --workload read --bs 128KiB --qd 16
measure "128KiB seq write QD16" "" --workload write --bs 128KiB --qd 16
measure "1MiB seq read QD4" "" --workload read --bs 1MiB --qd 4
measure "1MiB seq write QD4" "write 1MiB 4" --workload write --bs 1MiB --qd 4

# 4 KiB random reads beside a 1 MiB write stream (both from core 1; the stream
# sleeps in poll(2) so that two busy-polling processes do not take turns on core 1
# in scheduler slices, which the first recorded rows' 4 ms P99 was).
if echo "mixed" | grep -Eq "$only"; then
    taskset -c 1 "$bin" perf --addr "$addr" --nqn "$nqn" --nsid "$nsid" --cpus 1 --workload write \
        --bs 1MiB --qd 4 --time $((secs + 3)) --warmup 0 --json --quiet --poll sleep >"$log/stream.json" &
    stream=$!
    sleep 1
    r0=$(reactor_ns)
    t0=$(cpu_ticks "$tpid")
    j=$(perf_json --workload randread --bs 4KiB --qd 32)
    t1=$(cpu_ticks "$tpid")
    r1=$(reactor_ns)
    wait $stream
    s=$(cat "$log/stream.json")
    alone=$(perf_json --workload randread --bs 4KiB --qd 32)
    row "4KiB randread QD32 beside 1MiB writes QD4 (stream $(field "$s" mib_s) MiB/s; alone p99 $(field "$alone" lat_us.p99) us)" \
        "$j" "$(awk -v a="$t0" -v b="$t1" -v h="$hz" 'BEGIN{print (b-a)/h}')" "$alone" "" "$r0" "$r1"
fi

# Steady state on a thin volume at 50 % and 90 % pool fill with GC active: a churn
# stream of 1 MiB writes and deallocates (share p of them) keeps the fill at
# about 1 - p and GC scrubbing; 4 KiB random I/O is measured beside it.
if [ $own = 1 ] && echo "steady" | grep -Eq "$only"; then
    kill "$tpid"; wait "$tpid" 2>/dev/null || true
    start_target bench/profiles-pool.toml pool
    rpcsock=$log/pool.sock
    paddr=127.0.0.1:4421 pnqn=nqn.2026-11.io.kvtarget:bench-pool
    for fill in 50 90; do
        dpct=$((100 - fill))
        taskset -c 1 "$bin" perf --addr $paddr --nqn $pnqn --cpus 1 --workload randwrite --bs 1MiB \
            --qd 2 --deallocate-pct $dpct --time $((2 * secs + 12)) --warmup 0 --json --quiet --poll sleep \
            >"$log/churn.json" &
        churn=$!
        sleep 8   # let the fill converge
        # Reads only: 4 KiB random writes over the volume would map every extent
        # and fill the pool whatever the churn does (the first version of this
        # script measured that by mistake); the churn is the write load.
        for w in randread; do
            g0=$("$bin" rpc -r "$log/pool.sock" --json kvtarget_get_pools)
            r0=$(reactor_ns)
            t0=$(cpu_ticks "$tpid")
            j=$(taskset -c 1 "$bin" perf --addr $paddr --nqn $pnqn --cpus 1 --workload $w --bs 4KiB \
                --qd 32 --time "$secs" --warmup 1 --json --quiet)
            t1=$(cpu_ticks "$tpid")
            r1=$(reactor_ns)
            g1=$("$bin" rpc -r "$log/pool.sock" --json kvtarget_get_pools)
            gc=$(python3 -c 'import json,sys
a=json.loads(sys.argv[1]); b=json.loads(sys.argv[2])
p0=a[0]; p1=b[0]
fill = 100 * p1["mapped"] / max(p1["extents"], 1)
scrubbed = p1["gc"]["scrubbed"] - p0["gc"]["scrubbed"]
print("fill %.0f%%, %d extents scrubbed, GC %s" % (fill, scrubbed, p1["gc"]["mode"]))' "$g0" "$g1")
            row "steady ${fill}% fill: 4KiB $w QD32 beside 1MiB write+deallocate churn ($gc)" \
                "$j" "$(awk -v a="$t0" -v b="$t1" -v h="$hz" 'BEGIN{print (b-a)/h}')" "" "" "$r0" "$r1"
        done
        wait $churn || true
        echo "| steady ${fill}% fill: the churn itself (1MiB randwrite QD2, ${dpct}% of them deallocates) | $(field "$(cat "$log/churn.json")" iops) IOPS, $(field "$(cat "$log/churn.json")" mib_s) MiB/s over its whole run | | | | | | | | | | | | |" | tee -a "$results"
    done
elif echo "steady" | grep -Eq "$only"; then
    echo "| steady-state rows | skipped: they need the pool target this script starts itself (run without --addr) |" | tee -a "$results"
fi
echo "run-profiles: rows appended to $results"
