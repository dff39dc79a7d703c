#!/usr/bin/env bash
# Same initiator, same run: SPDK v25.09's nvmf_tgt against kvtarget. Each target
# serves a 1 GiB RAM namespace with 4096-byte blocks from one reactor busy-polling
# core 0, over NVMe/TCP on 127.0.0.1 (a free port each, any host allowed), and each
# is driven by SPDK's spdk_nvme_perf pinned to core 1 (-c 0x2). Runs alternate
# SPDK, kvtarget, SPDK, kvtarget, ... profile by profile, round by round.
#
#   bench/run-vs-spdk.sh [--secs S] [--rounds N] [--set NAME] [--only REGEX] [--no-restart]
#                        [--record] [--keep]
#
#   --secs S      seconds per run (default 10)
#   --rounds N    runs per target and profile (default 2); tables give the median
#   --set NAME    block (default): the spdk_nvme_perf profiles below; kv-offload:
#                 LMCache's raw-block phases driven by `kvtarget perf` (see below);
#                 all: both
#   --only REGEX  profiles whose name matches (grep -E), e.g. 'randread|4MiB'
#   --no-restart  start each target once for the whole run (before: every round
#                 starts with fresh targets, see below)
#   --record      also append the tables to bench/RESULTS.md under a heading with
#                 date, commit, this command and the machine's load (uptime)
#   --keep        keep the work directory (perf outputs, target logs) in /tmp
#
# SPDK: nvmf_tgt -m 0x1 (its own RPC socket, its own DPDK file prefix / shm id, no
# PCI), configured through scripts/rpc.py: TCP transport with SPDK's defaults, a
# Malloc bdev (1024 MiB, 4096-byte blocks), an allow-any-host subsystem.
# kvtarget: config/bench-ram.toml (reactor on core 0, idle = "busy", [tcp]
# max_queue_depth 256) with its port replaced by a free one and block_size 4096,
# its own RPC socket. Only one target runs at a time: both busy-poll core 0, so the
# one not being measured is stopped (SIGSTOP) and continued before its next run
# (its counters are read only after that, so the stopped time is in no delta).
# Every round starts both targets afresh (stopped, started, configured), as a user
# restarts a target, so what a first run after a start costs is measured, not
# discarded: right after the start each target's namespace is written once in full
# (1024 sequential writes of 1 MiB, QD8), and that prefill is a measured row of its
# own ("prefill ... first I/O after start"), with its P99.9 and max. The later
# profiles then find every block written, so reads find memory already backed.
# --no-restart starts the targets once and prefills before the first round only.
#
# Per run: IOPS, MiB/s, average and max latency (spdk_nvme_perf's Total row), P99 and
# P99.9 (its -L summary), and the target reactor's busy time per I/O: the difference of the
# "busy" counters of framework_get_reactors (both targets answer it; SPDK counts
# TSC ticks, kvtarget nanoseconds, each says its tick_rate) read with SPDK's
# rpc.py just before and just after the run, divided by the run's I/O count
# (IOPS x seconds). I/Os are spdk_nvme_perf's: where a target's MDTS is smaller
# than the I/O (SPDK's 128 KiB), the initiator splits it and the target sees
# several commands for one I/O.
#
# The kv-offload set replays LMCache's raw-block backend (`kvtarget perf --workload
# lmcache-store|lmcache-retrieve`, the same initiator for both targets, on core 1):
# 32 MiB chunks in slots of 32 MiB + 4 KiB after a 128 MiB metadata region, stores
# (a 4 KiB header write, then the payload) at QD 2/4/8 and payload retrieves at QD
# 1/2/4, and stores at QD4 and retrieves at QD4 each with spdk_nvme_perf's 4 KiB random
# reads at QD8 on the other namespace beside them (their IOPS, P99 and P99.9 in their own
# columns), and those reads alone (row "4KiB randread QD8 ns2 alone", their baseline:
# issue 38 asks for the mixed P99 within 1.5x of it). Both targets serve a second RAM
# namespace (256 MiB) for that. In the mixed rows the LMCache load sleeps in poll(2)
# (`--poll sleep`): both initiators share core 1, and two busy-polling processes on one
# core take turns by scheduler slices, which put milliseconds into the measured reads'
# tail on either target (session 22's 4.3-5.1 ms P99.9) whatever the target did.
# The row "4KiB randread QD8 ns2 + a busy loop on core 1 (host control)" measures that
# share alone: the reads by themselves, with a shell busy loop on core 1 that does no
# I/O. For every 4 KiB row (the block set's and these reads') kvtarget's own view is
# tabled too, from its /metrics (a free port each start): the I/Os' latency from
# capsule in to response out (P99, P99.9, worst), the reactor's pass lengths and
# longest pass, its preemptions; host minus target is the initiators' side, so a
# host max far above the target's own worst was spent outside kvtarget. In the
# rows with reads beside the LMCache load, the reader's own share of core 1 is
# tabled from its threads' /proc/PID/task/*/schedstat (time run, time waited
# runnable, times switched in), so a P99 set by the reader waiting for the core
# shows as such on either target.
#
# Nothing else may run on the machine during a real measurement (2 cores: the
# targets own core 0, perf core 1); the script warns when the 1-minute load
# average is above 0.5 at its start. Needs root (hugepages).
# Env: KVTARGET_BIN (default: cargo build --release, then target/release/kvtarget),
#      KVTARGET_BASE_BIN: a second kvtarget build (e.g. the commit before a change),
#        run as a third target "base" in the same rounds (SPDK, base, kvtarget), with
#        a table of kvtarget/base ratios: a before/after comparison on one machine
#        state, not across days,
#      KVTARGET_CONFIG: kvtarget's configuration instead of config/bench-ram.toml (for
#        trying a setting; it must serve the same namespaces),
#      KVTARGET_BASE_CONFIG: the base target's configuration (default: kvtarget's), so
#        that two settings of one build are compared in the same rounds
#        (KVTARGET_BASE_BIN may then be the same binary),
#      SPDK_CACHE / SPDK_DIR (see ci/spdk.sh).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
repo=$PWD
cmdline="bench/run-vs-spdk.sh$(printf ' %q' "$@")"

secs=10 rounds=2 only=. record=0 keep=0 set=block restart=1
while [ $# -gt 0 ]; do
    case $1 in
        --secs) secs=${2:-}; shift 2 || exit 2 ;;
        --rounds) rounds=${2:-}; shift 2 || exit 2 ;;
        --only) only=${2:-}; shift 2 || exit 2 ;;
        --set) set=${2:-}; shift 2 || exit 2 ;;
        --no-restart) restart=0; shift ;;
        --record) record=1; shift ;;
        --keep) keep=1; shift ;;
        -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "run-vs-spdk: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
for n in "$secs" "$rounds"; do
    case $n in '' | *[!0-9]* | 0) echo "run-vs-spdk: --secs and --rounds take a positive integer" >&2; exit 2 ;; esac
done

case $set in block | kv-offload | all) ;; *) echo "run-vs-spdk: --set block|kv-offload|all" >&2; exit 2 ;; esac
log() { echo "run-vs-spdk: $*" >&2; }
die() { failed=1; log "error: $*"; exit 1; }

. "$repo/bench/lib/machine.sh"
warn_if_busy

# Packages: python3 (parsing, rpc.py, /metrics), procps (uptime), util-linux (taskset,
# for the host control row's busy loop; perf pins itself with -c). ci/spdk.sh installs
# SPDK's own.
missing=()
command -v python3 >/dev/null || missing+=(python3)
command -v uptime >/dev/null || missing+=(procps)
command -v taskset >/dev/null || missing+=(util-linux)
if [ ${#missing[@]} -gt 0 ]; then
    if ! { apt-get update -q && apt-get install -y -q --no-install-recommends "${missing[@]}"; } >&2; then
        die "cannot install ${missing[*]}"
    fi
fi

kvbin=$(kvtarget_bin) || die "no kvtarget to measure"
spdk_env=$("$repo/ci/spdk.sh") || die "ci/spdk.sh could not provide SPDK"
eval "$spdk_env"
nvmf_tgt=$SPDK_DIR/build/bin/nvmf_tgt
perf=$SPDK_DIR/build/bin/spdk_nvme_perf
rpc_py=$SPDK_DIR/scripts/rpc.py
for t in "$nvmf_tgt" "$perf" "$rpc_py"; do [ -e "$t" ] || die "SPDK build in $SPDK_DIR has no $t"; done
# nvmf_tgt with the 1 GiB and 256 MiB Malloc bdevs and its buffer pools takes about
# 830 pages of 2 MiB, spdk_nvme_perf a few more.
"$repo/ci/hugepages.sh" --free 940 || die "not enough hugepages"

work=$(mktemp -d /tmp/kvtarget-vs-spdk.XXXXXX)
# shellcheck source=bench/lib/targets.sh
. "$repo/bench/lib/targets.sh"
spdk_pid='' kv_pid='' base_pid='' perf_pid='' shm_id='' failed=0
cleanup() {
    [ -n "$perf_pid" ] && stop_proc "$perf_pid" && rm -rf "/var/run/dpdk/spdk_pid$perf_pid"
    [ -n "$kv_pid" ] && stop_proc "$kv_pid"
    [ -n "$base_pid" ] && stop_proc "$base_pid"
    [ -n "$spdk_pid" ] && stop_proc "$spdk_pid"
    [ -n "$shm_id" ] && rm -rf "/var/run/dpdk/spdk$shm_id" /dev/hugepages/spdk"${shm_id}"map_*
    if [ "$keep" = 1 ] || [ "$failed" != 0 ]; then log "work directory kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

spdk_port=$(free_port)
kv_port=$(free_port)
while [ "$kv_port" = "$spdk_port" ]; do kv_port=$(free_port); done
base_port=$(free_port)
while [ "$base_port" = "$spdk_port" ] || [ "$base_port" = "$kv_port" ]; do base_port=$(free_port); done
spdk_nqn=nqn.2016-06.io.spdk:kvtarget-vs-spdk
kv_config=${KVTARGET_CONFIG:-config/bench-ram.toml}
[ -r "$kv_config" ] || die "cannot read $kv_config"
kv_nqn=$(kv_nqn_of "$kv_config") || die "cannot read the subsystem NQN from $kv_config"

# --- the targets: SPDK nvmf_tgt, kvtarget (and its baseline build) ---
targets=(spdk kvtarget)
[ -z "${KVTARGET_BASE_BIN:-}" ] || targets=(spdk base kvtarget)
declare -A pid_of sock_of trid_of addr_of nqn_of metrics_of
declare -A port_of=([spdk]=$spdk_port [kvtarget]=$kv_port [base]=$base_port)
base_version=
if [ -n "${KVTARGET_BASE_BIN:-}" ]; then
    [ -x "$KVTARGET_BASE_BIN" ] || die "KVTARGET_BASE_BIN $KVTARGET_BASE_BIN is not an executable"
    base_config=${KVTARGET_BASE_CONFIG:-$kv_config}
    [ -r "$base_config" ] || die "cannot read $base_config"
fi
start_target() { # TARGET: (re)start it, configured and stopped (SIGSTOP), as at the first start
    local t=$1 port=${port_of[$1]}
    case $t in
        spdk)
            if [ -n "$spdk_pid" ]; then
                stop_proc "$spdk_pid"
                rm -rf "/var/run/dpdk/spdk$shm_id" /dev/hugepages/spdk"${shm_id}"map_*
            fi
            start_spdk "$port" "$spdk_nqn"
            pid_of[spdk]=$spdk_pid sock_of[spdk]=$spdk_sock nqn_of[spdk]=$spdk_nqn ;;
        kvtarget)
            [ -z "$kv_pid" ] || stop_proc "$kv_pid"
            start_kv kvtarget "$kvbin" "$port" "$kv_config"
            kv_pid=$started_pid kv_version=$started_version
            pid_of[kvtarget]=$kv_pid sock_of[kvtarget]=$started_sock nqn_of[kvtarget]=$kv_nqn
            metrics_of[kvtarget]=$started_metrics ;;
        base)
            [ -z "$base_pid" ] || stop_proc "$base_pid"
            start_kv base "$KVTARGET_BASE_BIN" "$port" "$base_config"
            base_pid=$started_pid base_version=$started_version
            pid_of[base]=$base_pid sock_of[base]=$started_sock nqn_of[base]=$kv_nqn
            metrics_of[base]=$started_metrics ;;
    esac
    trid_of[$t]="trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$port subnqn:${nqn_of[$t]}"
    addr_of[$t]=127.0.0.1:$port
    [ "$active" != "$t" ] || active= # started stopped: activate must continue it
}
run_perf() { # OUTFILE TARGET PERF-ARGS...: perf on core 1 against TARGET's namespace ${perf_nsid:-1}
    local out=$1 t=$2; shift 2
    "$perf" "$@" -c 0x2 -r "${trid_of[$t]} ns:${perf_nsid:-1}" > "$out" 2>&1 &
    perf_pid=$!
    wait "$perf_pid"
    local rc=$?
    rm -rf "/var/run/dpdk/spdk_pid$perf_pid"
    perf_pid=
    return $rc
}
run_kvperf() { # OUTFILE TARGET KVPERF-ARGS...: kvtarget perf on core 1 against TARGET's namespace 1
    local out=$1 t=$2; shift 2
    "$perf_bin" perf --addr "${addr_of[$t]}" --nqn "${nqn_of[$t]}" --cpus 1 --json --quiet "$@" > "$out" 2>&1
}
perf_bin=$repo/target/release/kvtarget
[ -x "$perf_bin" ] || perf_bin=$kvbin

profiles=(
    "4KiB randread QD1|-w randread -o 4096 -q 1"
    "4KiB randread QD32|-w randread -o 4096 -q 32"
    "4KiB randread QD128|-w randread -o 4096 -q 128"
    "4KiB randwrite QD32|-w randwrite -o 4096 -q 32"
    "4KiB randrw 70/30 QD32|-w randrw -M 70 -o 4096 -q 32"
    "128KiB seq read QD16|-w read -o 131072 -q 16"
    "1MiB seq write QD4|-w write -o 1048576 -q 4"
    "4MiB seq write QD2|-w write -o 4194304 -q 2"
    "32MiB seq write QD2|-w write -o 33554432 -q 2"
)
kv_profiles=(
    "LMCache store 32MiB QD2|kvperf:--workload lmcache-store --bs 32MiB --qd 2"
    "LMCache store 32MiB QD4|kvperf:--workload lmcache-store --bs 32MiB --qd 4"
    "LMCache store 32MiB QD8|kvperf:--workload lmcache-store --bs 32MiB --qd 8"
    "LMCache retrieve 32MiB QD1|kvperf:--workload lmcache-retrieve --bs 32MiB --qd 1"
    "LMCache retrieve 32MiB QD2|kvperf:--workload lmcache-retrieve --bs 32MiB --qd 2"
    "LMCache retrieve 32MiB QD4|kvperf:--workload lmcache-retrieve --bs 32MiB --qd 4"
    "4KiB randread QD8 ns2 alone|ns2:-w randread -o 4096 -q 8"
    "4KiB randread QD8 ns2 + a busy loop on core 1 (host control)|hog:-w randread -o 4096 -q 8"
    "LMCache store 32MiB QD4 + 4KiB randread QD8 ns2|kvperf:--workload lmcache-store --bs 32MiB --qd 4 --poll sleep|bg:-w randread -o 4096 -q 8"
    "LMCache retrieve 32MiB QD4 + 4KiB randread QD8 ns2|kvperf:--workload lmcache-retrieve --bs 32MiB --qd 4 --poll sleep|bg:-w randread -o 4096 -q 8"
)
case $set in
    kv-offload) profiles=("${kv_profiles[@]}") ;;
    all) profiles+=("${kv_profiles[@]}") ;;
esac
selected=()
for p in "${profiles[@]}"; do
    if echo "${p%%|*}" | grep -Eq -- "$only"; then selected+=("$p"); fi
done
[ ${#selected[@]} -gt 0 ] || die "--only '$only' matches no profile"

runs=$work/runs.jsonl
: > "$runs"
n=0
# The prefill: namespace 1 written once in full, 1024 sequential writes of 1 MiB at QD8
# (-d: a number of I/Os; -t only bounds it), measured like any run.
prefill_name="prefill 1MiB seq write QD8, first I/O after start"
prefill_args="prefill:-w write -o 1048576 -q 8 -d 1024 -t 120"
scrape() { # TARGET FILE: kvtarget's /metrics into FILE (nothing for SPDK)
    [ -n "${metrics_of[$1]:-}" ] || return 0
    python3 -c 'import sys, urllib.request
open(sys.argv[2], "wb").write(urllib.request.urlopen("http://" + sys.argv[1] + "/metrics", timeout=5).read())' \
        "${metrics_of[$1]}" "$2" 2>/dev/null || rm -f "$2"
}
measure() { # ROUND PROFILE-NAME TARGET RUN-SPEC [BG-ARGS]: one run, one line in $runs
    local r=$1 name=$2 t=$3 rest=$4 bg=${5:-} out bgout before after bg_pid= rc run_secs=$secs
    local hog_pid= mid_pid= sched_pid= m0 m1 m2
    n=$((n + 1))
    out=$work/run-$n.out
    bgout=$work/run-$n.bg.out
    m0=$work/run-$n.m0 m1=$work/run-$n.m1 m2=$work/run-$n.m2
    activate "$t"
    before=$(reactors "$t") || before=
    # The 4 KiB rows (spdk_nvme_perf's, in front or beside): kvtarget's own view of
    # them, scraped before, while the run's connections are still open (their
    # series go with them), and after.
    # SPDK's nvmf_tgt has no /metrics: it answers an RPC (framework_get_reactors) at
    # the same moment instead, so both targets' runs carry a probe of the same kind
    # (a Python process started, a request answered) at the same time.
    case "$bg$rest" in
        *-o\ 4096*)
            scrape "$t" "$m0"
            if [ -n "${metrics_of[$t]:-}" ]; then
                { sleep "$((secs - 1)).5"; scrape "$t" "$m1"; } &
            else
                { sleep "$((secs - 1)).5"; reactors "$t" > /dev/null 2>&1; } &
            fi
            mid_pid=$! ;;
    esac
    if [ -n "$bg" ]; then
        read -ra bargs <<< "$bg"
        # Namespace 2, for the run's length and a little more.
        "$perf" "${bargs[@]}" -c 0x2 -t $((secs + 1)) -L -r "${trid_of[$t]} ns:2" > "$bgout" 2>&1 &
        bg_pid=$!
        # How the reader fared on core 1, which the row's LMCache initiator shares: its
        # threads' schedstat (ns run, ns waited runnable, times switched in) from 1 s in
        # to half a second before the end.
        { sleep 1; cat /proc/"$bg_pid"/task/*/schedstat > "$work/run-$n.s0" 2>/dev/null
          sleep "$((secs - 2)).5"; cat /proc/"$bg_pid"/task/*/schedstat > "$work/run-$n.s1" 2>/dev/null
        } &
        sched_pid=$!
    fi
    case $rest in
        kvperf:*)
            read -ra args <<< "${rest#kvperf:}"
            run_kvperf "$out" "$t" "${args[@]}" --time "$secs" --warmup 1
            rc=$? ;;
        ns2:*)
            # The reads the mixed rows run beside the LMCache load, alone: their baseline.
            read -ra args <<< "${rest#ns2:}"
            perf_nsid=2 run_perf "$out" "$t" "${args[@]}" -t "$secs" -L
            rc=$? ;;
        hog:*)
            # The same reads alone, with a busy loop sharing the initiator's core (a
            # neighbour that does no I/O): what the host's scheduler alone adds.
            read -ra args <<< "${rest#hog:}"
            taskset -c 1 sh -c 'while :; do :; done' &
            hog_pid=$!
            perf_nsid=2 run_perf "$out" "$t" "${args[@]}" -t "$secs" -L
            rc=$?
            kill "$hog_pid"; wait "$hog_pid" 2>/dev/null ;;
        prefill:*)
            read -ra args <<< "${rest#prefill:}"
            run_secs=0 # its length is its I/O count: no busy-per-I/O from a nominal time
            run_perf "$out" "$t" "${args[@]}" -L
            rc=$? ;;
        *)
            read -ra args <<< "$rest"
            run_perf "$out" "$t" "${args[@]}" -t "$secs" -L
            rc=$? ;;
    esac
    if [ -n "$bg_pid" ]; then
        wait "$sched_pid"
        wait "$bg_pid"; rm -rf "/var/run/dpdk/spdk_pid$bg_pid"
    fi
    after=$(reactors "$t") || after=
    if [ -n "$mid_pid" ]; then wait "$mid_pid"; scrape "$t" "$m2"; fi
    log "round $r/$rounds $t: $name"
    python3 "$work/record.py" "$out" "$t" "$name" "$r" "$run_secs" "$rc" "$before" "$after" "$bgout" "${rest%%:*}" \
        "$m0" "$m1" "$m2" "$work/run-$n.s0" "$work/run-$n.s1" "$((secs - 2)).5" >> "$runs"
    tail -n 1 "$runs" | grep -q '"error": null' || failed=1
}
cat > "$work/record.py" <<'PY'
import json, os, re, sys
out, target, name, rnd, secs, rc, before, after, bgout, initiator, m0, m1, m2, s0, s1, s_secs = sys.argv[1:17]
text = open(out, errors="replace").read().replace("\r", "\n")
run = {"target": target, "profile": name, "round": int(rnd), "error": None}

def metrics(path):
    """Prometheus text: {name: [(labels, value)]}, or None when not scraped."""
    if not os.path.exists(path):
        return None
    d = {}
    for line in open(path):
        m = re.match(r"(\w+)\{(.*)\} (\S+)$", line.strip())
        if m:
            d.setdefault(m.group(1), []).append((dict(re.findall(r'(\w+)="([^"]*)"', m.group(2))), float(m.group(3))))
    return d

def buckets(d, name, keep):
    """Cumulative histogram buckets summed over the series keep() accepts: [(le, n)]."""
    acc = {}
    for l, v in d.get(name + "_bucket", []):
        if keep(l):
            le = float("inf") if l["le"] == "+Inf" else float(l["le"])
            acc[le] = acc.get(le, 0) + v
    return sorted(acc.items())

def upper_bound_us(b, q):
    """The bucket bound (us) under which a fraction q of the histogram's counts lie."""
    if not b or b[-1][1] <= 0:
        return None
    return next(le for le, c in b if c >= q * b[-1][1]) * 1e6

def target_side(d0, d1, d2):
    """kvtarget's view of the run's 4 KiB I/Os: their latency from capsule in to
    response out (reads and writes of queue pairs whose reads and writes were all
    4096 bytes, scraped while open, so the run's last half second is not in it),
    and the reactor's passes (poll gaps), longest pass and preemptions over the
    whole run (each scrape resets the longest-pass gauge: m0 starts it, m1 and m2
    cover the run)."""
    got = {}
    ops = ("read", "write")
    if d1 is not None:
        def per_qpair(name):
            acc = {}
            for l, v in d1.get(name, []):
                if l["op"] in ops:
                    k = (l["cntlid"], l["qid"])
                    acc[k] = acc.get(k, 0) + v
            return acc
        cmds, nbytes = per_qpair("kvtarget_qpair_commands_total"), per_qpair("kvtarget_qpair_bytes_total")
        small = {k for k, v in cmds.items() if v > 0 and nbytes.get(k) == 4096 * v}
        b = buckets(d1, "kvtarget_qpair_latency_seconds",
                    lambda l: l["op"] in ops and (l["cntlid"], l["qid"]) in small)
        got["tgt_p99_le_us"], got["tgt_p999_le_us"] = upper_bound_us(b, 0.99), upper_bound_us(b, 0.999)
        got["tgt_max_le_us"] = upper_bound_us(b, 1.0)
    if d0 is not None and d2 is not None:
        g0 = dict(buckets(d0, "kvtarget_reactor_poll_gap_seconds", lambda l: True))
        g = [(le, c - g0.get(le, 0)) for le, c in buckets(d2, "kvtarget_reactor_poll_gap_seconds", lambda l: True)]
        got["gap_p999_le_us"], got["gap_p9999_le_us"] = upper_bound_us(g, 0.999), upper_bound_us(g, 0.9999)
        longest = [v for d in (d1 or {}, d2) for _, v in d.get("kvtarget_reactor_max_poll_gap_seconds", [])]
        if longest:
            got["gap_max_us"] = max(longest) * 1e6
        sw = lambda d: sum(v for _, v in d.get("kvtarget_reactor_involuntary_context_switches_total", []))
        got["preempted"] = sw(d2) - sw(d0)
    return got

run.update(target_side(metrics(m0), metrics(m1), metrics(m2)))

def spdk_perf(text):
    """spdk_nvme_perf's Total row (IOPS, MiB/s, avg, min, max) and -L percentiles."""
    total = None
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 7 and f[0] == "Total" and f[1] == ":":
            total = [float(x) for x in f[2:7]]
    pct, in_summary = {}, False
    for line in text.splitlines():
        if line.startswith("Summary latency data"):
            in_summary = True
            continue
        m = re.match(r"\s*([0-9.]+)%\s*:\s*([0-9.]+)us\s*$", line)
        if in_summary and m:
            pct[round(float(m.group(1)), 4)] = float(m.group(2))
    return total, pct

if os.path.exists(bgout):
    bt, bp = spdk_perf(open(bgout, errors="replace").read().replace("\r", "\n"))
    if bt is not None:
        run["bg_iops"], run["bg_max_us"] = bt[0], bt[4]
    run["bg_p99_us"], run["bg_p999_us"] = bp.get(99.0), bp.get(99.9)
def schedstat(path):
    """A process's threads' /proc schedstat summed: (ns run, ns waited runnable, slices)."""
    try:
        rows = [[int(x) for x in l.split()] for l in open(path) if l.strip()]
    except (OSError, ValueError):
        return None
    return tuple(sum(r[i] for r in rows) for i in range(3)) if rows else None

a0, a1 = schedstat(s0), schedstat(s1)
if a0 and a1 and float(s_secs) > 0:
    ran, waited, slices = (y - x for x, y in zip(a0, a1))
    run["bg_core_share"] = ran / (float(s_secs) * 1e9)
    run["bg_wait_ms_per_s"] = waited / 1e6 / float(s_secs)
    run["bg_slices_per_s"] = slices / float(s_secs)
    run["bg_wait_per_slice_us"] = waited / 1e3 / slices if slices else None
if initiator == "kvperf":
    # kvtarget perf --json: the same fields from its report.
    try:
        j = json.loads(text.strip().splitlines()[-1])
        if rc != "0" or j["errors"] or j["ios"] == 0:
            run["error"] = f"kvtarget perf exit {rc}, {j['errors']} errors, {j['ios']} I/Os"
        lat = j["lat_us"]
        run.update(iops=j["iops"], mib_s=j["mib_s"], avg_us=lat["mean"], p99_us=lat["p99"],
                   p999_us=lat["p99_9"], max_us=lat["max"])
    except (ValueError, KeyError, IndexError):
        run["error"] = "kvtarget perf: " + (text.strip().splitlines() or ["no output"])[-1][:120]
else:
    total, pct = spdk_perf(text)
    errors = [l for l in text.splitlines() if "completed with error" in l]
    if rc != "0":
        run["error"] = f"spdk_nvme_perf exit {rc}"
    elif errors:
        run["error"] = f"{len(errors)} I/O error lines: {errors[0].strip()[:120]}"
    elif total is None or total[0] <= 0:
        run["error"] = "no Total row (no controller attached?)"
    if total is not None:
        run.update(iops=total[0], mib_s=total[1], avg_us=total[2], max_us=total[4])
    run["p99_us"], run["p999_us"] = pct.get(99.0), pct.get(99.9)
b, a = before.split(), after.split()
if run.get("iops") and float(secs) > 0 and len(b) == 2 and len(a) == 2:
    ticks, rate = int(a[0]) - int(b[0]), float(a[1])
    run["busy_us_per_io"] = ticks / rate * 1e6 / (run["iops"] * float(secs))
print(json.dumps(run))
PY

for r in $(seq "$rounds"); do
    if [ "$restart" = 1 ] || [ "$r" = 1 ]; then
        for t in "${targets[@]}"; do
            log "round $r/$rounds: starting $t"
            start_target "$t"
        done
        for t in "${targets[@]}"; do
            measure "$r" "$prefill_name" "$t" "$prefill_args"
            grep -q '^Total' "$work/run-$n.out" || { cat "$work/run-$n.out" >&2; die "writing $t's namespace failed"; }
        done
    fi
    for p in "${selected[@]}"; do
        name=${p%%|*}
        rest=${p#*|}
        bg=
        case $rest in *"|bg:"*) bg=${rest#*|bg:}; rest=${rest%%|bg:*} ;; esac
        for t in "${targets[@]}"; do
            measure "$r" "$name" "$t" "$rest" "$bg"
        done
    done
done

load_end=$(uptime)
rev=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo "+dirty")
python3 - "$runs" "$secs" "$rounds" > "$work/tables.md" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
secs, rounds = sys.argv[2], sys.argv[3]
profiles = list(dict.fromkeys(r["profile"] for r in runs))

def med(p, t, key):
    xs = [r[key] for r in runs if r["profile"] == p and r["target"] == t
          and r["error"] is None and r.get(key) is not None]
    return statistics.median(xs) if xs else None

def worst(p, t, key):
    xs = [r[key] for r in runs if r["profile"] == p and r["target"] == t
          and r["error"] is None and r.get(key) is not None]
    return max(xs) if xs else None

def fmt(x, nd=1):
    return "-" if x is None else f"{x:,.{nd}f}"

def ratio(a, b):
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}"

print(f"Median of {rounds} round(s), {secs} s per run (prefill rows: 1 GiB each); "
      "kvtarget/SPDK ratios of those medians (IOPS: above 1 is kvtarget faster; latency and "
      "busy: below 1 is kvtarget better). max is the worst run's max, not a median.")
print()
print("| profile | SPDK IOPS | kvt IOPS | IOPS kvt/SPDK | SPDK P99 us | kvt P99 us | P99 kvt/SPDK "
      "| SPDK P99.9 us | kvt P99.9 us | P99.9 kvt/SPDK | SPDK max us | kvt max us | max kvt/SPDK "
      "| SPDK busy us/IO | kvt busy us/IO | busy kvt/SPDK |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for p in profiles:
    s = {k: med(p, "spdk", k) for k in ("iops", "p99_us", "p999_us", "busy_us_per_io")}
    k = {k: med(p, "kvtarget", k) for k in ("iops", "p99_us", "p999_us", "busy_us_per_io")}
    s["max_us"], k["max_us"] = worst(p, "spdk", "max_us"), worst(p, "kvtarget", "max_us")
    print(f"| {p} | {fmt(s['iops'], 0)} | {fmt(k['iops'], 0)} | {ratio(k['iops'], s['iops'])} "
          f"| {fmt(s['p99_us'])} | {fmt(k['p99_us'])} | {ratio(k['p99_us'], s['p99_us'])} "
          f"| {fmt(s['p999_us'])} | {fmt(k['p999_us'])} | {ratio(k['p999_us'], s['p999_us'])} "
          f"| {fmt(s['max_us'])} | {fmt(k['max_us'])} | {ratio(k['max_us'], s['max_us'])} "
          f"| {fmt(s['busy_us_per_io'], 2)} | {fmt(k['busy_us_per_io'], 2)} "
          f"| {ratio(k['busy_us_per_io'], s['busy_us_per_io'])} |")
if any("bg_iops" in r for r in runs):
    print()
    print("Beside the run, spdk_nvme_perf's 4 KiB random reads on namespace 2 (same rounds, medians):")
    print()
    print("| profile | SPDK bg IOPS | kvt bg IOPS | bg IOPS kvt/SPDK | SPDK bg P99 us | kvt bg P99 us "
          "| bg P99 kvt/SPDK | SPDK bg P99.9 us | kvt bg P99.9 us | bg P99.9 kvt/SPDK "
          "| SPDK bg max us | kvt bg max us |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for p in profiles:
        if not any(r["profile"] == p and "bg_iops" in r for r in runs):
            continue
        s = {k: med(p, "spdk", k) for k in ("bg_iops", "bg_p99_us", "bg_p999_us")}
        k = {k: med(p, "kvtarget", k) for k in ("bg_iops", "bg_p99_us", "bg_p999_us")}
        print(f"| {p} | {fmt(s['bg_iops'], 0)} | {fmt(k['bg_iops'], 0)} | {ratio(k['bg_iops'], s['bg_iops'])} "
              f"| {fmt(s['bg_p99_us'])} | {fmt(k['bg_p99_us'])} | {ratio(k['bg_p99_us'], s['bg_p99_us'])} "
              f"| {fmt(s['bg_p999_us'])} | {fmt(k['bg_p999_us'])} | {ratio(k['bg_p999_us'], s['bg_p999_us'])} "
              f"| {fmt(worst(p, 'spdk', 'bg_max_us'))} | {fmt(worst(p, 'kvtarget', 'bg_max_us'))} |")
if any("bg_core_share" in r for r in runs):
    print()
    print("The reader on core 1 beside the LMCache initiator (spdk_nvme_perf's threads' "
          "/proc schedstat from 1 s in to half a second before the end; medians): the share of "
          "the core it ran, the time it waited runnable per second, how often it was switched "
          "in, and the mean wait per switch. A read in flight while the reader waits completes "
          "only when it runs again, so long waits here reach the reads' P99 on either target.")
    print()
    print("| profile | SPDK core share | kvt core share | SPDK wait ms/s | kvt wait ms/s "
          "| SPDK switches/s | kvt switches/s | SPDK wait/switch us | kvt wait/switch us |")
    print("|---|---|---|---|---|---|---|---|---|")
    for p in profiles:
        if not any(r["profile"] == p and "bg_core_share" in r for r in runs):
            continue
        cols = [fmt(med(p, t, k), d) for k, d in (("bg_core_share", 2), ("bg_wait_ms_per_s", 0),
                ("bg_slices_per_s", 0), ("bg_wait_per_slice_us", 0)) for t in ("spdk", "kvtarget")]
        print(f"| {p} | " + " | ".join(cols) + " |")
if any(r["target"] == "base" for r in runs):
    print()
    print("The same rounds, kvtarget against its baseline build (`KVTARGET_BASE_BIN`): "
          "IOPS above 1 and P99/busy below 1 mean this build is better.")
    print()
    print("| profile | base IOPS | base P99 us | base P99.9 us | base max us | base busy us/IO "
          "| IOPS kvt/base | P99 kvt/base | P99.9 kvt/base | max kvt/base "
          "| busy kvt/base | IOPS base/SPDK | P99 base/SPDK |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for p in profiles:
        s = {k: med(p, "spdk", k) for k in ("iops", "p99_us")}
        b = {k: med(p, "base", k) for k in ("iops", "p99_us", "p999_us", "busy_us_per_io")}
        k = {k: med(p, "kvtarget", k) for k in ("iops", "p99_us", "p999_us", "busy_us_per_io")}
        b["max_us"], k["max_us"] = worst(p, "base", "max_us"), worst(p, "kvtarget", "max_us")
        print(f"| {p} | {fmt(b['iops'], 0)} | {fmt(b['p99_us'])} | {fmt(b['p999_us'])} | {fmt(b['max_us'])} "
              f"| {fmt(b['busy_us_per_io'], 2)} "
              f"| {ratio(k['iops'], b['iops'])} | {ratio(k['p99_us'], b['p99_us'])} "
              f"| {ratio(k['p999_us'], b['p999_us'])} | {ratio(k['max_us'], b['max_us'])} "
              f"| {ratio(k['busy_us_per_io'], b['busy_us_per_io'])} "
              f"| {ratio(b['iops'], s['iops'])} | {ratio(b['p99_us'], s['p99_us'])} |")
if any("tgt_p99_le_us" in r or "gap_p999_le_us" in r for r in runs):
    print()
    print("Where the 4 KiB I/Os wait (kvtarget; medians, max columns the worst run): the "
          "host's P99, P99.9 and max (of the reads on namespace 2 in the rows beside an LMCache "
          "load) beside kvtarget's own view, read from its /metrics. Target-side: latency from "
          "the capsule read off the socket to the response queued, as the bucket bound (16 us "
          "doubling) under which 99 % / 99.9 % / all of the 4 KiB I/Os lie (scraped half a "
          "second before the end). Passes: the bound for the reactor's loop passes (poll gaps, "
          "1 us doubling) over the run, which a capsule may wait for before it is read and a "
          "response before it is written, and the longest one. Preempted: the reactor's "
          "involuntary context switches in the run. A host max far above both target maxima "
          "was spent outside kvtarget's process.")
    print()
    print("| profile | host P99 us | host P99.9 us | host max us | target P99 <= us | target P99.9 <= us "
          "| target max <= us | pass P99.9 <= us | pass P99.99 <= us | longest pass us | preempted |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for p in profiles:
        if not any(r["profile"] == p and r["target"] == "kvtarget" and "tgt_p99_le_us" in r for r in runs):
            continue
        bg = any(r["profile"] == p and "bg_iops" in r for r in runs)
        h99, h999, hmax = (med(p, "kvtarget", "bg_p99_us"), med(p, "kvtarget", "bg_p999_us"),
                           worst(p, "kvtarget", "bg_max_us")) if bg else \
            (med(p, "kvtarget", "p99_us"), med(p, "kvtarget", "p999_us"), worst(p, "kvtarget", "max_us"))
        print(f"| {p} | {fmt(h99)} | {fmt(h999)} | {fmt(hmax)} | {fmt(med(p, 'kvtarget', 'tgt_p99_le_us'), 0)} "
              f"| {fmt(med(p, 'kvtarget', 'tgt_p999_le_us'), 0)} | {fmt(worst(p, 'kvtarget', 'tgt_max_le_us'), 0)} "
              f"| {fmt(med(p, 'kvtarget', 'gap_p999_le_us'), 0)} "
              f"| {fmt(med(p, 'kvtarget', 'gap_p9999_le_us'), 0)} | {fmt(worst(p, 'kvtarget', 'gap_max_us'), 0)} "
              f"| {fmt(med(p, 'kvtarget', 'preempted'), 0)} |")
print()
print("Every run, in the order run:")
print()
print("| round | profile | target | IOPS | MiB/s | avg us | P99 us | P99.9 us | max us | busy us/IO | error |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for r in runs:
    print(f"| {r['round']} | {r['profile']} | {r['target']} | {fmt(r.get('iops'), 0)} "
          f"| {fmt(r.get('mib_s'))} | {fmt(r.get('avg_us'))} | {fmt(r.get('p99_us'))} "
          f"| {fmt(r.get('p999_us'))} | {fmt(r.get('max_us'))} "
          f"| {fmt(r.get('busy_us_per_io'), 2)} | {r['error'] or ''} |")
PY
{
    echo "### $(date -u '+%Y-%m-%d %H:%M') UTC, commit $rev: SPDK nvmf_tgt vs kvtarget, same initiator (spdk_nvme_perf), ${secs}s per run, $rounds round(s)"
    echo
    echo "Command: \`$cmdline\` (\`bench/run-vs-spdk.sh --help\` says what it sets up)."
    echo "SPDK: $spdk_version, nvmf_tgt -m 0x1, TCP transport defaults, Malloc bdev 1 GiB / 4096 B."
    echo "kvtarget: $kv_version, $kv_config on a free port with 4096-byte blocks."
    if [ "$restart" = 1 ]; then echo "Targets restarted before every round; each round's prefill is its first I/O after the start."
    else echo "Targets started once (--no-restart), prefilled before round 1 only."; fi
    [ -z "$base_version" ] || echo "base: $base_version (\`KVTARGET_BASE_BIN=$KVTARGET_BASE_BIN\`), $base_config on its own port."
    echo "Initiator: spdk_nvme_perf -c 0x2 -L (LMCache rows: \`kvtarget perf --cpus 1\` of this tree). Machine: $(nproc) cores."
    echo "Load at start: \`$load_start\`; at end: \`$load_end\`."
    echo
    cat "$work/tables.md"
} > "$work/report.md"
echo
cat "$work/report.md"
if [ "$record" = 1 ]; then
    { echo; cat "$work/report.md"; } >> bench/RESULTS.md
    log "appended to bench/RESULTS.md"
fi
[ "$failed" = 0 ] || { log "some runs failed (see the error column; logs in $work)"; exit 1; }
