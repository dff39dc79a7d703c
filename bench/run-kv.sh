#!/usr/bin/env bash
# KV namespaces against an LMCache-style block volume, same target, same initiator,
# same run (issue 17 item 5). SPDK's nvmf_tgt serves no KV namespace, so the
# comparison is the one a KV-cache manager chooses between: store and retrieve one
# value per command in a KV namespace, or keep its own slot layout (a 4 KiB header
# block + the payload per slot after a 128 MiB metadata region, LMCache's raw-block
# backend) on a block volume of the same pool.
#
#   bench/run-kv.sh [--secs S] [--rounds N] [--sizes LIST] [--no-restart] [--record] [--keep]
#
#   --secs S      measured seconds per run (default 5, after 1 s of warm-up)
#   --rounds N    rounds (default 2); tables give the median
#   --sizes LIST  value sizes (default 64KiB,1MiB,32MiB)
#   --no-restart  start the target once (default: a fresh target every round)
#   --record      append the tables to bench/RESULTS.md under a heading with date,
#                 commit, this command and the machine's load
#   --keep        keep the work directory (outputs, target log) in /tmp
#
# The target: kvtarget, one reactor busy-polling core 0, [tcp] max_io_size 32 MiB
# (MDTS; VML follows it), one RAM pool (1 MiB extents) with a 1 GiB block volume
# (NSID 1) and a 1 GiB KV volume (NSID 2, on_full = "evict"), both with the
# volatile write cache (the default). The initiator: `kvtarget perf`, one queue at
# QD 4, pinned to core 1.
#
# Per size and round, alternated (block first in odd rounds, KV first in even):
#   block store     --workload lmcache-store: header + payload into the next slot
#   KV store        --kv --workload write: one Store per value, keys in order, as
#                   many keys as the block volume has slots (no eviction)
#   block retrieve  --workload lmcache-retrieve: a random slot's payload
#   KV retrieve     --kv --workload randread over those keys (the namespace emptied
#                   again, perf stores every key first, outside the measured window)
# Every round starts a fresh target (as a user restarts one) and writes both volumes
# in full first (a first write maps the extent; freed KV blocks stay mapped), so no
# later run pays for mapping; those first writes after the start are measured too
# (their own table: P99, P99.9 and max), not discarded. GB/s are 10^9 bytes of payload (values) per second; the header
# block is not counted, as it is not KV-cache data.
#
# Eviction churn (1 MiB values): a 50/50 Store/Retrieve mix with Zipf 0.99 key
# popularity, once over keys filling half the KV namespace (nothing evicted) and once
# over twice as many keys as it holds (it stays at 100 % capacity: Stores of new keys
# evict, Retrieves of evicted keys miss), the foreground P99 beside each and the
# evictions the target counted (kvtarget_get_kv_namespaces) during the run (warm-up
# included). Each starts empty and stores its keys in order for 2 s first, so the full
# case is full before it is measured.
#
# Nothing else may run on the machine during a measurement (2 cores: the target owns
# core 0, perf core 1); the script warns when the 1-minute load average is above 0.5.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
SECS=5 ROUNDS=2 SIZES=64KiB,1MiB,32MiB RECORD=0 KEEP=0 RESTART=1
ARGS="$*" # for the record: the loop below shifts them away
while [ $# -gt 0 ]; do
    case $1 in
        --secs) SECS=$2; shift ;;
        --rounds) ROUNDS=$2; shift ;;
        --sizes) SIZES=$2; shift ;;
        --no-restart) RESTART=0 ;;
        --record) RECORD=1 ;;
        --keep) KEEP=1 ;;
        *) echo "run-kv: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
load=$(cut -d' ' -f1 /proc/loadavg)
if awk -v l="$load" 'BEGIN { exit !(l > 0.5) }'; then
    echo "run-kv: warning: 1-minute load average is $load; figures will be noisy" >&2
fi
if [ -z "${KVTARGET_BIN:-}" ]; then
    (cd "$repo" && cargo build --release --quiet)
    KVTARGET_BIN=$repo/target/release/kvtarget
fi
bin=$KVTARGET_BIN
work=$(mktemp -d /tmp/kvt-bench-kv.XXXXXX)
tgt_pid=
cleanup() {
    [ -n "$tgt_pid" ] && kill "$tgt_pid" 2>/dev/null && wait "$tgt_pid" 2>/dev/null || true
    if [ "$KEEP" = 1 ]; then echo "run-kv: kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
NQN=nqn.2026-12.io.kvtarget:bench-kv
cat > "$work/kv.toml" <<EOF
# Written by bench/run-kv.sh
[reactors]
cores = [0]
idle = "busy"

[tcp]
max_io_size = "32MiB"

[rpc]
socket = "$work/rpc.sock"

[[listeners]]
address = "127.0.0.1"
port = $port

[[pools]]
name = "bench"
backend = "ram"
size = "2304MiB"
extent_size = "1MiB"

[[pools.volumes]]
name = "blocks"
size = "1GiB"

[[pools.volumes]]
name = "cache"
size = "1GiB"
kind = "kv"

[[subsystems]]
nqn = "$NQN"
allow_any_host = true

[[subsystems.namespaces]]
nsid = 1
volume = "bench/blocks"

[[subsystems.namespaces]]
nsid = 2
volume = "bench/cache"
on_full = "evict"
EOF
"$bin" check-config "$work/kv.toml" > /dev/null
start_target() { # a fresh target (the RAM pool starts empty)
    if [ -n "$tgt_pid" ]; then kill "$tgt_pid" 2>/dev/null; wait "$tgt_pid" 2>/dev/null || true; fi
    "$bin" --config "$work/kv.toml" >> "$work/target.log" 2>&1 &
    tgt_pid=$!
    # Up to 60 s: a RAM pool is made resident before the target listens.
    for _ in $(seq 600); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
        sleep 0.1
    done
    echo "run-kv: the target did not start: $(tail -n 5 "$work/target.log")" >&2
    exit 1
}

perf() { # out-file, perf args...
    local out=$1; shift
    taskset -c 1 "$bin" perf --addr "127.0.0.1:$port" --nqn "$NQN" --qd 4 --queues 1 \
        --time "$SECS" --warmup 1 --cpus 1 --quiet --json "$@" > "$out" \
        || { echo "run-kv: perf $* failed: $(cat "$out")" >&2; exit 1; }
}
bytes_of() { python3 -c "import sys; u=sys.argv[1]; n=int(''.join(c for c in u if c.isdigit())); print(n << {'KiB':10,'MiB':20,'GiB':30}[u.lstrip('0123456789')])" "$1"; }
evictions() { "$bin" rpc -r "$work/rpc.sock" --json kvtarget_get_kv_namespaces | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["evictions"])'; }
kv_reset() { # deletes every key a run left: each measurement starts from an empty namespace
    "$bin" perf --addr "127.0.0.1:$port" --nqn "$NQN" --nsid 2 --kv --kv-keys "$1" --bs 4KiB \
        --workload write --deallocate-pct 100 --qd 16 --time "$2" --warmup 0 --quiet > /dev/null
}

# The first write to an extent maps it (and the RAM pool's pages are touched): both
# volumes are written in full right after each start, so no later run pays for that
# and the other not. These first I/Os after a start are measured (first-*.json).
first_writes() { # round
    echo "run-kv: round $1: writing both volumes once after the start" >&2
    taskset -c 1 "$bin" perf --addr "127.0.0.1:$port" --nqn "$NQN" --nsid 1 --workload write --bs 1MiB --qd 8 \
        --time 3 --warmup 0 --cpus 1 --quiet --json > "$work/r$1-first-block.json"
    taskset -c 1 "$bin" perf --addr "127.0.0.1:$port" --nqn "$NQN" --nsid 2 --kv --kv-keys 1024 --workload write \
        --bs 1MiB --qd 8 --time 3 --warmup 0 --cpus 1 --quiet --json > "$work/r$1-first-kv.json"
}

IFS=, read -r -a sizes <<< "$SIZES"
meta=$((128 << 20)) vol=$((1 << 30))
for r in $(seq "$ROUNDS"); do
    if [ "$RESTART" = 1 ] || [ "$r" = 1 ]; then
        start_target
        first_writes "$r"
    else
        cp "$work/r1-first-block.json" "$work/r$r-first-block.json"
        cp "$work/r1-first-kv.json" "$work/r$r-first-kv.json"
    fi
    for s in "${sizes[@]}"; do
        b=$(bytes_of "$s")
        slots=$(( (vol - meta) / ((b + 4096 + 4095) / 4096 * 4096) ))
        block() {
            perf "$work/r$r-$s-block-store.json" --nsid 1 --workload lmcache-store --bs "$s"
            perf "$work/r$r-$s-block-retrieve.json" --nsid 1 --workload lmcache-retrieve --bs "$s"
        }
        kv() {
            kv_reset 16384 3
            perf "$work/r$r-$s-kv-store.json" --nsid 2 --kv --kv-keys "$slots" --workload write --bs "$s"
            # Empty again: the retrieve run's own Stores would otherwise overwrite a
            # nearly full namespace, and overwrites there evict (a cache's rule).
            kv_reset 16384 3
            perf "$work/r$r-$s-kv-retrieve.json" --nsid 2 --kv --kv-keys "$slots" --workload randread --bs "$s"
        }
        echo "run-kv: round $r, $s ($slots slots/keys)" >&2
        if [ $((r % 2)) = 1 ]; then block; kv; else kv; block; fi
    done
    # Eviction churn at 1 MiB: half full, then twice the keys the namespace holds.
    fit=$(( vol / (1 << 20) ))
    for c in half:$((fit / 2)) full:$((fit * 2)); do
        name=${c%%:*} keys=${c#*:}
        kv_reset 16384 3
        # Store every key in order first: half full, or (twice the keys) full
        # with the oldest evicted, before the measured mix starts.
        "$bin" perf --addr "127.0.0.1:$port" --nqn "$NQN" --nsid 2 --kv --kv-keys "$keys" \
            --workload write --bs 1MiB --qd 8 --time 2 --warmup 0 --quiet > /dev/null
        e0=$(evictions)
        perf "$work/r$r-churn-$name.json" --nsid 2 --kv --kv-keys "$keys" --workload randrw \
            --rwmix-read 50 --zipf 0.99 --bs 1MiB
        echo $(( $(evictions) - e0 )) > "$work/r$r-churn-$name.evictions"
    done
done

tables=$(python3 - "$work" "$ROUNDS" "$SIZES" "$SECS" <<'PYEOF'
import json, os, statistics, sys
work, rounds, sizes, secs = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(","), float(sys.argv[4])
def load(name):
    return [json.load(open(os.path.join(work, f"r{r}-{name}.json"))) for r in range(1, rounds + 1)]
def med(xs): return statistics.median(xs)
def gbs(rs): return med([r["bytes"] / r["seconds"] / 1e9 for r in rs])
def p99(rs): return med([r["lat_us"]["p99"] for r in rs])
def p999(rs): return med([r["lat_us"]["p99_9"] for r in rs])
def worst(rs): return max(r["lat_us"]["max"] for r in rs)
def errs(rs): return sum(r["errors"] for r in rs)
out = ["First I/O after a start: 1 MiB writes at QD 8 for 3 s (medians; max: the worst round)", "",
       "| volume | GB/s | P99 us | P99.9 us | max us | errors |", "|---|---|---|---|---|---|"]
for name, what in (("block", "block (1 MiB writes)"), ("kv", "KV (1 MiB Stores)")):
    rs = load(f"first-{name}")
    out.append(f"| {what} | {gbs(rs):.2f} | {p99(rs):.0f} | {p999(rs):.0f} | {worst(rs):.0f} | {errs(rs)} |")
out += ["", "| value | phase | block (LMCache slots) GB/s | KV GB/s | KV / block | block P99 us | KV P99 us "
        "| block P99.9 us | KV P99.9 us | block max us | KV max us | KV misses | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
for s in sizes:
    for ph in ("store", "retrieve"):
        b, k = load(f"{s}-block-{ph}"), load(f"{s}-kv-{ph}")
        misses = sum(r.get("kv", {}).get("misses", 0) for r in k)
        out.append(f"| {s} | {ph} | {gbs(b):.2f} | {gbs(k):.2f} | {gbs(k) / max(gbs(b), 1e-9):.2f} | "
                   f"{p99(b):.0f} | {p99(k):.0f} | {p999(b):.0f} | {p999(k):.0f} | "
                   f"{worst(b):.0f} | {worst(k):.0f} | {misses} | {errs(b) + errs(k)} |")
out += ["", "| 1 MiB, 50/50 Store/Retrieve, Zipf 0.99 | keys | GB/s | ops/s | misses/s | P99 us | P99.9 us | max us | evictions/s | errors |",
        "|---|---|---|---|---|---|---|---|---|---|"]
for name, what in (("half", "half full (no eviction)"), ("full", "100 % full, 2x the keys (eviction churn)")):
    rs = load(f"churn-{name}")
    ev = [int(open(os.path.join(work, f"r{r}-churn-{name}.evictions")).read()) for r in range(1, rounds + 1)]
    out.append(f"| {what} | {rs[0]['kv']['keys']} | {gbs(rs):.2f} | {med([r['iops'] for r in rs]):.0f} | "
               f"{med([r['kv']['misses'] / r['seconds'] for r in rs]):.0f} | {p99(rs):.0f} | "
               f"{p999(rs):.0f} | {worst(rs):.0f} | {med(ev) / (secs + 1):.0f} | {errs(rs)} |")
print("\n".join(out))
PYEOF
)
echo "$tables"
if [ "$RECORD" = 1 ]; then
    # Before the append: the heading names the build measured, not the file being written.
    rev="$(git -C "$repo" rev-parse --short HEAD)$(git -C "$repo" diff --quiet || echo +dirty)"
    {
        echo
        echo "### $(date -u '+%Y-%m-%d %H:%M UTC'), commit $rev: KV namespace vs LMCache block slots, ${SECS}s per run, $ROUNDS round(s), medians"
        echo
        echo "\`bench/run-kv.sh $ARGS\`; load at start: $load; $(nproc) cores; target core 0 busy-poll, perf core 1, QD 4, one queue."
        echo
        echo "$tables"
    } >> "$repo/bench/RESULTS.md"
fi
