#!/usr/bin/env bash
# Scale on one node (issue 39 item 1): what keys, volumes, queues and pool size cost.
# Every measurement starts a fresh target on a fresh sparse pool file (or a RAM pool
# where said), all in one temporary directory removed at the end.
#
#   bench/run-scale.sh [--only LIST] [--keys LIST] [--volumes LIST] [--queues LIST]
#                      [--pool-sizes LIST] [--secs S] [--total-qd N] [--dir DIR]
#                      [--spdk] [--smoke] [--record] [--keep]
#
#   --only LIST        sections, comma-separated: keys,volumes,queues,pools (default all)
#   --keys LIST        KV key counts (default 100000,1000000,10000000)
#   --volumes LIST     thin volumes in one pool (default 1000,4000)
#   --queues LIST      NVMe/TCP I/O queues (default 16,256,1024)
#   --pool-sizes LIST  sparse pool sizes (default 1TiB,16TiB)
#   --secs S           measured seconds of each foreground mix and queue run (default 10)
#   --total-qd N       commands in flight over all queues in the queue runs (default 1024)
#   --dir DIR          where the sparse pool files go (default: a new directory in
#                      ${TMPDIR:-/tmp}); where a file cannot reach a size (ext4: 16 TiB), 1 MiB less
#                      is measured and the row says so
#   --spdk             queues: SPDK v25.09's nvmf_tgt (two reactors, -m 0x3, a 1 GiB
#                      Malloc bdev) measured the same way after each kvtarget run, as
#                      the control (ci/spdk.sh builds it when not cached)
#   --smoke            the smallest run that exercises every step (under a minute):
#                      --keys 20000 --volumes 50 --queues 16 --pool-sizes 16GiB --secs 1
#                      --total-qd 64; its figures mean nothing
#   --record           append the tables to bench/RESULTS.md under a heading with date,
#                      commit, this command and the machine's load (refused with --smoke)
#   --keep             keep the work directory (target logs, perf JSON; pool files too)
#
# keys: a uring pool on a sparse file with one KV volume of 512-byte blocks, sized for
#   the keys (one key per 16 KiB of volume, MNK) plus an eighth; one reactor on core 0,
#   `kvtarget perf` on core 1. Per key count: the keys are stored once (16-byte keys,
#   512-byte values, `perf --kv --workload read` stores every key before reading);
#   resident memory per key (VmRSS of the target after the load and a checkpoint, less
#   VmRSS before the load, /proc; the index reserves room for every key the volume
#   may hold at start, untouched until used, so the total VmRSS per key is beside it); a checkpoint on demand (kvtarget_pool_checkpoint):
#   its bytes per key and time; the last periodic commit's time (kvtarget_get_pools);
#   the foreground P99 of a 50/50 Store/Retrieve mix (QD 4, uniform over the keys)
#   without, then with back-to-back checkpoints through the whole measured window
#   (checkpoints the pool counted during each run beside it: the journal filling up
#   starts some on its own); List of every key (`perf --kv --workload list`, 1 MiB
#   buffers; capped at 600 s); recovery after SIGKILL: from the kill to the first KV
#   Store answered by a restarted target, the journal entries and records it replayed
#   (its log), the keys it recovered and its VmRSS.
# volumes: a sparse 64 GiB pool, thin volumes of 1 GiB created by bdev_lvol_create
#   over one JSON-RPC connection (time per create), VmRSS per volume, the checkpoint's
#   bytes (the metadata), recovery after SIGKILL (kill to bdev_get_bdevs answering with
#   every volume). A create the target refuses ends the series: the row says how many
#   were made and why the next was refused.
# queues: a 1 GiB RAM pool, two reactors (cores 0 and 1), perf on core 1 (the machine
#   has two cores: perf shares one with a reactor): 4 KiB random reads over 16-queue
#   controllers (256 queues: 16 controllers) with --total-qd commands in flight over
#   all queues (at least 1 per queue); VmRSS of the target mid-run less before, per
#   queue; IOPS, P99; before that, on a target of its own, VmRSS per idle queue (all
#   connected by `perf --idle`, nothing sent). Then a connect storm: 16 controllers of
#   16 idle queues connected by 16 threads at once, the time until all 256 are
#   connected (perf's connect_s). Beside each count above 16, the 16-queue load again
#   with the rest of the count connected and idle (what hundreds of hosts that attach
#   and wait cost the busy ones). Reactor time per I/O: the reactors' busy time
#   (framework_get_reactors, both targets) over a stretch of the measured window (from
#   the warm-up's end, every queue connected, for half the run) divided by the I/Os
#   perf counted at its rate in that stretch: the target's own cost, which IOPS alone
#   does not show when perf, on a core with a reactor, is what runs out.
# pools: per size, `kvtarget pool create` of a sparse file (format time), the
#   metadata footprint (blocks allocated, du), a target opening it (start to
#   listening), and recovery after SIGKILL (kill to listening again), VmRSS of each.
#   Free space is checked first: the footprint, not the size, must fit.
#
# Nothing else may run on the machine during a real measurement; the script warns when
# the 1-minute load average is above 0.5. Env: KVTARGET_BIN (default: cargo build
# --release, then target/release/kvtarget).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
repo=$PWD
cmdline="bench/run-scale.sh$(printf ' %q' "$@")"

only=keys,volumes,queues,pools keys=100000,1000000,10000000 volumes=1000,4000
queues=16,256,1024 pool_sizes=1TiB,16TiB secs=10 total_qd=1024 dir='' smoke=0 record=0 keep=0 spdk=0
while [ $# -gt 0 ]; do
    case $1 in
        --only) only=${2:-}; shift 2 || exit 2 ;;
        --keys) keys=${2:-}; shift 2 || exit 2 ;;
        --volumes) volumes=${2:-}; shift 2 || exit 2 ;;
        --queues) queues=${2:-}; shift 2 || exit 2 ;;
        --pool-sizes) pool_sizes=${2:-}; shift 2 || exit 2 ;;
        --secs) secs=${2:-}; shift 2 || exit 2 ;;
        --total-qd) total_qd=${2:-}; shift 2 || exit 2 ;;
        --dir) dir=${2:-}; shift 2 || exit 2 ;;
        --smoke) smoke=1; shift ;;
        --spdk) spdk=1; shift ;;
        --record) record=1; shift ;;
        --keep) keep=1; shift ;;
        -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "run-scale: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
if [ "$smoke" = 1 ]; then
    keys=20000 volumes=50 queues=16 pool_sizes=16GiB secs=1 total_qd=64
    [ "$record" = 0 ] || { echo "run-scale: --smoke figures are not for RESULTS.md" >&2; exit 2; }
fi
log() { echo "run-scale: $*" >&2; }
failed=0
die() { failed=1; log "error: $*"; exit 1; }
positive() { case $2 in '' | *[!0-9]* | 0) echo "run-scale: $1 takes positive integers (got '$2')" >&2; exit 2 ;; esac; }
positive --secs "$secs"
positive --total-qd "$total_qd"
IFS=, read -r -a key_list <<< "$keys"
IFS=, read -r -a volume_list <<< "$volumes"
IFS=, read -r -a queue_list <<< "$queues"
IFS=, read -r -a size_list <<< "$pool_sizes"
IFS=, read -r -a sections <<< "$only"
for n in "${key_list[@]}"; do positive --keys "$n"; done
for n in "${volume_list[@]}"; do positive --volumes "$n"; done
for n in "${queue_list[@]}"; do positive --queues "$n"; done
for s in "${sections[@]}"; do
    case $s in keys | volumes | queues | pools) ;; *) echo "run-scale: --only takes keys,volumes,queues,pools (got '$s')" >&2; exit 2 ;; esac
done
wants() { [[ ",$only," == *",$1,"* ]]; }

. "$repo/bench/lib/machine.sh"
warn_if_busy
command -v python3 >/dev/null || die "python3 is needed (JSON, the RPC client)"
bin=$(kvtarget_bin) || die "no kvtarget to measure"
# 1,024 queues and 64 admin queues: a socket each on both sides.
ulimit -n 16384 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
[ "$(ulimit -n)" -ge 2200 ] || log "warning: only $(ulimit -n) file descriptors: 1,024 queues will not connect"

work=$(mktemp -d "${dir:-${TMPDIR:-/tmp}}/kvt-scale.XXXXXX") || die "cannot make a work directory in ${dir:-${TMPDIR:-/tmp}}"
# shellcheck source=bench/lib/targets.sh
. "$repo/bench/lib/targets.sh"
tgt_pid='' perf_pid='' idle_pid='' spdk_pid='' shm_id=''
cleanup() {
    [ -z "$perf_pid" ] || { kill "$perf_pid" 2>/dev/null; wait "$perf_pid" 2>/dev/null; }
    [ -z "$idle_pid" ] || { kill "$idle_pid" 2>/dev/null; wait "$idle_pid" 2>/dev/null; }
    [ -z "$tgt_pid" ] || stop_proc "$tgt_pid"
    stop_spdk
    if [ "$keep" = 1 ] || [ "$failed" != 0 ]; then
        rm -f "$work"/*.img # the pool files: sparse, but never left behind
        log "work directory kept: $work"
    else
        rm -rf "$work"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# The SPDK control (--spdk, queues only).
stop_spdk() {
    [ -z "$spdk_pid" ] || stop_proc "$spdk_pid"
    [ -z "$shm_id" ] || rm -rf "/var/run/dpdk/spdk$shm_id" /dev/hugepages/spdk"${shm_id}"map_* "/dev/shm/nvmf_trace.$shm_id"
    spdk_pid='' shm_id=''
}
if [ "$spdk" = 1 ] && wants queues; then
    spdk_env=$(ci/spdk.sh) || die "ci/spdk.sh could not provide SPDK"
    eval "$spdk_env"
    nvmf_tgt=$SPDK_DIR/build/bin/nvmf_tgt rpc_py=$SPDK_DIR/scripts/rpc.py spdk_cores=0x3
    for t in "$nvmf_tgt" "$rpc_py"; do [ -e "$t" ] || die "SPDK build in $SPDK_DIR has no $t"; done
    # The 1.25 GiB of Malloc bdevs, two reactors' buffer caches, and a PDU pool per
    # queue from hugepages (1,088 queues did not fit in 1,152 pages of 2 MiB).
    ci/hugepages.sh --free 2048 || die "not enough hugepages for nvmf_tgt"
fi
rows=$work/rows.jsonl
: > "$rows"
row() { python3 -c 'import json, sys; print(json.dumps(dict(a.split("=", 1) for a in sys.argv[1:])))' "$@" >> "$rows"; }

now() { date +%s.%N; }
since() { python3 -c 'import sys; print(f"{float(sys.argv[2]) - float(sys.argv[1]):.3f}")' "$1" "$(now)"; }
bytes_of() { # SIZE like 16GiB or 1TiB -> bytes
    python3 -c '
import re, sys
m = re.fullmatch(r"(\d+)(B|KiB|MiB|GiB|TiB)?", sys.argv[1])
if not m: sys.exit(f"run-scale: {sys.argv[1]} is not a size like 64GiB or 16TiB")
print(int(m[1]) << {None: 0, "B": 0, "KiB": 10, "MiB": 20, "GiB": 30, "TiB": 40}[m[2]])' "$1"
}
rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }
free_kib() { df -Pk "$work" | awk 'NR == 2 { print $4 }'; }
used_kib() { du -k "$1" | cut -f1; }
rpc() { "$bin" rpc -r "$work/rpc.sock" --json "$@"; }
jget() { python3 -c 'import json, sys
v = json.load(sys.stdin)
for k in sys.argv[1].split("."): v = v[int(k)] if k.isdigit() else v[k]
print(v)' "$1"; }

# write_config NAME POOL-TOML CORES: a target configuration, one subsystem serving
# whatever namespaces POOL-TOML's volumes list in $namespaces.
port=$(free_port)
spdk_port=$(free_port)
while [ "$spdk_port" = "$port" ]; do spdk_port=$(free_port); done
nqn=nqn.2026-12.io.kvtarget:scale
write_config() {
    cat > "$work/$1.toml" <<EOF
# Written by bench/run-scale.sh
[reactors]
cores = [$3]
idle = "busy"

[tcp]
max_io_queues = 1024

[rpc]
socket = "$work/rpc.sock"

[[listeners]]
address = "127.0.0.1"
port = $port

$2

[[subsystems]]
nqn = "$nqn"
allow_any_host = true
$namespaces
EOF
    "$bin" check-config "$work/$1.toml" > "$work/$1.check" 2>&1 || die "$1.toml does not load: $(cat "$work/$1.check")"
}

# start_target NAME: starts it on $work/NAME.toml and waits until it listens and its
# RPC socket answers (up to 30 min: recovering 10^7 keys may take long). Sets tgt_pid.
start_target() {
    rm -f "$work/rpc.sock"
    "$bin" --config "$work/$1.toml" >> "$work/$1.log" 2>&1 &
    tgt_pid=$!
    local _
    for _ in $(seq 180000); do
        kill -0 "$tgt_pid" 2>/dev/null || { tail -n 20 "$work/$1.log" >&2; tgt_pid=; die "the target ($1) exited while starting"; }
        if [ -S "$work/rpc.sock" ] && (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null \
            && rpc spdk_get_version > /dev/null 2>&1; then
            return 0
        fi
        sleep 0.01
    done
    die "the target ($1) did not start in 30 minutes"
}
stop_target() { [ -z "$tgt_pid" ] || stop_proc "$tgt_pid"; tgt_pid=; }
crash_target() { kill -KILL "$tgt_pid"; wait "$tgt_pid" 2>/dev/null; tgt_pid=; }

perf() { # OUT NSID PERF-ARGS...: kvtarget perf on core 1, JSON to OUT
    local out=$1 nsid=$2; shift 2
    taskset -c 1 "$bin" perf --addr "127.0.0.1:$port" --nqn "$nqn" --nsid "$nsid" --cpus 1 --quiet --json "$@" \
        > "$out" 2> "$out.err" || die "perf $* failed: $(cat "$out.err")"
}

# --- keys -------------------------------------------------------------------------
kv_pool() { # KEYS -> the pool and volume TOML for that many keys
    local vol=$(( ($1 * 16384 * 9 / 8 + (1 << 30) - 1) >> 30 ))
    cat <<EOF
[[pools]]
name = "scale"
backend = "uring"
path = "$work/keys.img"
size = "$((vol + 2))GiB"
extent_size = "1MiB"
create = true

[[pools.volumes]]
name = "kv"
size = "${vol}GiB"
block_size = 512
kind = "kv"
EOF
}
run_keys() { # KEYS
    local n=$1 t0 load_s rss0 rss1 rss2 ck ck_bytes ck_us commit_us c0 c1 c2 rec_s keys_after replayed
    # Values: one 512-byte block each, and the extents they map.
    local need=$(( n * 512 * 3 / 2 / 1024 + (2 << 20) ))
    [ "$(free_kib)" -gt "$need" ] || die "keys $n: needs about $((need >> 20)) GiB free in $work, $(( $(free_kib) >> 20 )) GiB there"
    rm -f "$work/keys.img"
    namespaces='
[[subsystems.namespaces]]
nsid = 1
volume = "scale/kv"'
    write_config keys "$(kv_pool "$n")" 0
    start_target keys
    rss0=$(rss_kib "$tgt_pid")
    log "keys $n: storing every key"
    t0=$(now)
    perf "$work/keys-$n-load.json" 1 --kv --kv-keys "$n" --workload read --bs 512 --qd 32 --time 0.1 --warmup 0
    load_s=$(since "$t0")
    ck=$(rpc kvtarget_pool_checkpoint name=scale) || die "keys $n: kvtarget_pool_checkpoint failed: $ck"
    ck_bytes=$(jget bytes <<< "$ck") ck_us=$(jget us <<< "$ck")
    commit_us=$(rpc kvtarget_get_pools name=scale | jget 0.journal.last_commit_us)
    rss1=$(rss_kib "$tgt_pid")
    checkpoints() { rpc kvtarget_get_pools name=scale | jget 0.journal.checkpoints; }
    log "keys $n: the Store/Retrieve mix without, then with checkpoints"
    c0=$(checkpoints)
    perf "$work/keys-$n-mix.json" 1 --kv --kv-keys "$n" --workload randrw --rwmix-read 50 --bs 512 --qd 4 --time "$secs" --warmup 1
    c1=$(checkpoints)
    taskset -c 1 "$bin" perf --addr "127.0.0.1:$port" --nqn "$nqn" --nsid 1 --cpus 1 --quiet --json --kv --kv-keys "$n" \
        --workload randrw --rwmix-read 50 --bs 512 --qd 4 --time "$secs" --warmup 1 > "$work/keys-$n-mix-ckpt.json" 2>&1 &
    perf_pid=$!
    sleep 1 # the warm-up: checkpoints run through the measured window
    while kill -0 "$perf_pid" 2>/dev/null; do
        rpc kvtarget_pool_checkpoint name=scale > /dev/null || die "keys $n: kvtarget_pool_checkpoint failed during the mix"
    done
    wait "$perf_pid" || die "keys $n: the mix under checkpoints failed: $(cat "$work/keys-$n-mix-ckpt.json")"
    perf_pid=
    c2=$(checkpoints)
    log "keys $n: List of every key"
    perf "$work/keys-$n-list.json" 1 --kv --workload list --bs 1MiB --time 600
    log "keys $n: SIGKILL and recovery"
    t0=$(now)
    crash_target
    start_target keys
    until taskset -c 1 "$bin" perf --addr "127.0.0.1:$port" --nqn "$nqn" --nsid 1 --kv --kv-keys 1 --workload randwrite \
        --bs 512 --qd 1 --time 0.01 --warmup 0 --quiet > /dev/null 2>&1; do sleep 0.01; done
    rec_s=$(since "$t0")
    rss2=$(rss_kib "$tgt_pid")
    keys_after=$(rpc kvtarget_get_kv_namespaces | jget 0.keys)
    # What the restart replayed: journal entries and records after the checkpoint.
    replayed=$(grep 'pool recovered' "$work/keys.log" | tail -n 1 | sed 's/\x1b\[[0-9;]*m//g' \
        | grep -o 'entries=[0-9]* records=[0-9]*' | tr -dc '0-9 ')
    stop_target
    row section=keys keys="$n" load_s="$load_s" rss0_kib="$rss0" rss1_kib="$rss1" rss_recovered_kib="$rss2" \
        ckpt_bytes="$ck_bytes" ckpt_us="$ck_us" commit_us="$commit_us" ckpts_mix=$((c1 - c0)) ckpts_mix_ckpt=$((c2 - c1)) \
        mix="$(cat "$work/keys-$n-mix.json")" mix_ckpt="$(cat "$work/keys-$n-mix-ckpt.json")" \
        list="$(cat "$work/keys-$n-list.json")" recovery_s="$rec_s" keys_recovered="$keys_after" replayed="${replayed:-? ?}" \
        pool_kib="$(used_kib "$work/keys.img")"
    rm -f "$work/keys.img"
}

# --- volumes ----------------------------------------------------------------------
create_volumes() { # N -> JSON {"created": k, "seconds": s, "error": "..."} on stdout
    python3 - "$work/rpc.sock" "$1" <<'PYEOF'
import json, socket, sys, time
path, n = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_UNIX); s.connect(path)
f = s.makefile("rwb")
def call(i, method, params):
    f.write(json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params}).encode() + b"\n"); f.flush()
    buf = b""
    while True:
        buf += s.recv(65536)
        try: return json.loads(buf)
        except ValueError: continue
t0, err, made = time.monotonic(), None, 0
for i in range(n):
    r = call(i, "bdev_lvol_create", {"lvol_name": f"v{i:05}", "size_in_mib": 1024, "lvs_name": "scale"})
    if "error" in r:
        err = r["error"].get("message", str(r["error"])); break
    made += 1
print(json.dumps({"created": made, "seconds": time.monotonic() - t0, "error": err}))
PYEOF
}
run_volumes() { # N
    local n=$1 rss0 rss1 rss2 cr made ck t0 rec_s listed
    rm -f "$work/volumes.img"
    namespaces=''
    write_config volumes "[[pools]]
name = \"scale\"
backend = \"uring\"
path = \"$work/volumes.img\"
size = \"64GiB\"
extent_size = \"1MiB\"
create = true" 0
    start_target volumes
    rss0=$(rss_kib "$tgt_pid")
    log "volumes $n: creating"
    cr=$(create_volumes "$n") || die "volumes $n: the RPC client failed"
    made=$(jget created <<< "$cr")
    [ "$made" -gt 0 ] || die "volumes $n: not one volume created: $cr"
    rss1=$(rss_kib "$tgt_pid")
    ck=$(rpc kvtarget_pool_checkpoint name=scale) || die "volumes $n: kvtarget_pool_checkpoint failed: $ck"
    log "volumes $n: SIGKILL and recovery"
    t0=$(now)
    crash_target
    start_target volumes
    listed=$(rpc bdev_get_bdevs | python3 -c 'import json, sys; print(sum(1 for b in json.load(sys.stdin) if b.get("name", "").startswith("scale/v") or any(a.startswith("scale/v") for a in b.get("aliases", []))))')
    rec_s=$(since "$t0")
    rss2=$(rss_kib "$tgt_pid")
    stop_target
    row section=volumes volumes="$n" created="$made" create_s="$(jget seconds <<< "$cr")" refused="$(jget error <<< "$cr")" \
        rss0_kib="$rss0" rss1_kib="$rss1" rss_recovered_kib="$rss2" ckpt_bytes="$(jget bytes <<< "$ck")" \
        ckpt_us="$(jget us <<< "$ck")" recovery_s="$rec_s" volumes_recovered="$listed" pool_kib="$(used_kib "$work/volumes.img")"
    rm -f "$work/volumes.img"
}

# --- queues -----------------------------------------------------------------------
ram_pool='[[pools]]
name = "scale"
backend = "ram"
size = "1088MiB"
extent_size = "1MiB"

[[pools.volumes]]
name = "blocks"
size = "1GiB"'
count_io_qpairs='import json, sys; print(sum(1 for q in json.load(sys.stdin) if q["qid"] > 0))'
io_qpairs() { rpc nvmf_subsystem_get_qpairs nqn="$nqn" | python3 -c "$count_io_qpairs"; }
spdk_nqn=nqn.2016-06.io.spdk:scale
spdk_io_qpairs() { srpc -t 10 nvmf_subsystem_get_qpairs "$spdk_nqn" | python3 -c "$count_io_qpairs"; }
# reactor_busy_s kvtarget|spdk -> seconds its reactors have counted busy, summed
reactor_busy_s() {
    local out
    if [ "$1" = spdk ]; then out=$(srpc -t 10 framework_get_reactors); else out=$(rpc framework_get_reactors); fi || return 1
    python3 -c 'import json, sys; d = json.load(sys.stdin); print(sum(r["busy"] for r in d["reactors"]) / d["tick_rate"])' <<< "$out"
}
# queue_load kvtarget|spdk PORT NQN CONNECTED NAME CONTROLLERS PER QD: the 4 KiB
# random reads, perf's JSON in $work/NAME-TARGET.json, measured once CONNECTED I/O
# queues (its own and any already there) are connected; sets mid_rss (kvtarget's
# VmRSS mid-run) and stretch ("busy0 busy1 t0 t1": the reactors' busy seconds and
# the clock at both ends of a stretch inside the measured window).
queue_load() {
    local t=$1 p=$2 n=$3 q=$4 name=$5 ctrls=$6 per=$7 qd=$8 b0 t0 _
    local count=io_qpairs; [ "$t" = spdk ] && count=spdk_io_qpairs
    taskset -c 1 "$bin" perf --addr "127.0.0.1:$p" --nqn "$n" --nsid 1 --cpus 1 --quiet --json --workload randread \
        --bs 4KiB --controllers "$ctrls" --queues "$per" --qd "$qd" --time "$secs" --warmup 1 > "$work/$name-$t.json" 2>&1 &
    perf_pid=$!
    for _ in $(seq 1200); do [ "$($count)" -ge "$q" ] && break; kill -0 "$perf_pid" 2>/dev/null || break; sleep 0.25; done
    sleep 1.25 # the warm-up
    mid_rss=0; [ "$t" = spdk ] || mid_rss=$(rss_kib "$tgt_pid")
    b0=$(reactor_busy_s "$t") t0=$(now)
    sleep "$(python3 -c "print($secs / 2)")"
    stretch="$b0 $(reactor_busy_s "$t") $t0 $(now)"
    wait "$perf_pid" || die "$name ($t): perf failed: $(cat "$work/$name-$t.json")"
    perf_pid=
}
# beside_idle kvtarget|spdk PORT NQN QUEUES: 16 queues at QD 64 (the 16-queue row's
# load) while QUEUES - 16 more queues are connected and idle; JSON in
# $work/beside-QUEUES-TARGET.json, stretch as queue_load's.
beside_idle() {
    local t=$1 p=$2 n=$3 q=$4 _
    local count=io_qpairs; [ "$t" = spdk ] && count=spdk_io_qpairs
    taskset -c 1 "$bin" perf --addr "127.0.0.1:$p" --nqn "$n" --nsid 1 --cpus 1 --quiet --json --bs 4KiB \
        --controllers $(( q / 16 - 1 )) --queues 16 --qd 1 --time 600 --warmup 0 --idle > "$work/idle-$q-$t.json" 2>&1 &
    idle_pid=$!
    for _ in $(seq 1200); do [ "$($count)" -ge $(( q - 16 )) ] && break; kill -0 "$idle_pid" 2>/dev/null || break; sleep 0.25; done
    [ "$($count)" -ge $(( q - 16 )) ] || die "beside $q ($t): the idle queues did not all connect: $(cat "$work/idle-$q-$t.json")"
    queue_load "$t" "$p" "$n" "$q" "beside-$q" 1 16 64
    kill "$idle_pid"; wait "$idle_pid" 2>/dev/null; idle_pid=
}
run_queues() { # QUEUES
    local q=$1 per ctrls qd rss0 rss1 idle0 idle1 _
    per=$(( q < 16 ? q : 16 )) ctrls=$(( (q + 15) / 16 ))
    [ $((per * ctrls)) = "$q" ] || die "--queues $q: a count up to 16, or a multiple of 16 (controllers of 16 queues)"
    qd=$(( total_qd / q )); [ "$qd" -ge 1 ] || qd=1
    namespaces='
[[subsystems.namespaces]]
nsid = 1
volume = "scale/blocks"'
    write_config queues "$ram_pool" "0, 1"
    # Idle first, on a target of its own: every queue connected, nothing sent.
    start_target queues
    idle0=$(rss_kib "$tgt_pid")
    "$bin" perf --addr "127.0.0.1:$port" --nqn "$nqn" --nsid 1 --cpus 1 --quiet --json --bs 4KiB \
        --controllers "$ctrls" --queues "$per" --qd "$qd" --time 600 --warmup 0 --idle > "$work/queues-$q-idle.json" 2>&1 &
    perf_pid=$!
    for _ in $(seq 6000); do [ "$(io_qpairs)" -ge "$q" ] && break; kill -0 "$perf_pid" 2>/dev/null || break; sleep 0.05; done
    [ "$(io_qpairs)" -ge "$q" ] || die "queues $q: the idle queues did not all connect: $(cat "$work/queues-$q-idle.json")"
    sleep 0.5
    idle1=$(rss_kib "$tgt_pid")
    kill "$perf_pid"; wait "$perf_pid" 2>/dev/null; perf_pid=
    stop_target
    start_target queues
    # Written once, so reads find mapped extents.
    perf "$work/queues-$q-fill.json" 1 --workload write --bs 1MiB --qd 8 --time 2 --warmup 0
    rss0=$(rss_kib "$tgt_pid")
    log "queues $q: $ctrls controller(s) of $per queue(s), QD $qd each"
    queue_load kvtarget "$port" "$nqn" "$q" "queues-$q" "$ctrls" "$per" "$qd"
    rss1=$mid_rss
    row section=queues queues="$q" controllers="$ctrls" qd="$qd" rss0_kib="$rss0" rss1_kib="$rss1" \
        idle0_kib="$idle0" idle1_kib="$idle1" stretch="$stretch" run="$(cat "$work/queues-$q-kvtarget.json")"
    if [ "$q" -gt 16 ]; then
        log "queues $q: 16 busy queues beside $(( q - 16 )) idle ones"
        beside_idle kvtarget "$port" "$nqn" "$q"
        row section=beside target=kvtarget queues="$q" stretch="$stretch" run="$(cat "$work/beside-$q-kvtarget.json")"
    fi
    stop_target
    [ "$spdk" = 1 ] || return 0
    log "queues $q: the same against SPDK nvmf_tgt -m 0x3"
    start_spdk "$spdk_port" "$spdk_nqn"
    kill -CONT "$spdk_pid"
    queue_load spdk "$spdk_port" "$spdk_nqn" "$q" "queues-$q" "$ctrls" "$per" "$qd"
    row section=queues_spdk queues="$q" stretch="$stretch" version="$spdk_version" run="$(cat "$work/queues-$q-spdk.json")"
    if [ "$q" -gt 16 ]; then
        beside_idle spdk "$spdk_port" "$spdk_nqn" "$q"
        row section=beside target=spdk queues="$q" stretch="$stretch" run="$(cat "$work/beside-$q-spdk.json")"
    fi
    stop_spdk
}
run_storm() {
    local rss0 rss1 cpus
    write_config queues "$ram_pool" "0, 1"
    start_target queues
    rss0=$(rss_kib "$tgt_pid")
    cpus=$(printf '1,%.0s' $(seq 16)); cpus=${cpus%,}
    log "connect storm: 16 controllers of 16 queues from 16 threads"
    "$bin" perf --addr "127.0.0.1:$port" --nqn "$nqn" --nsid 1 --cpus "$cpus" --quiet --json --workload randread \
        --bs 4KiB --controllers 16 --queues 16 --qd 1 --time 0.5 --warmup 0 --idle > "$work/storm.json" 2> "$work/storm.err" \
        || die "connect storm: perf failed: $(cat "$work/storm.err")"
    rss1=$(rss_kib "$tgt_pid")
    stop_target
    row section=storm queues=256 rss0_kib="$rss0" rss1_kib="$rss1" run="$(cat "$work/storm.json")"
}

# --- pools ------------------------------------------------------------------------
run_pool() { # SIZE
    local size=$1 b t0 fmt_s open_s rec_s rss1 rss2 fp0 fp1
    b=$(bytes_of "$size") || exit 2
    # The metadata footprint is what gets written: the journal (at most 256 MiB) and
    # two checkpoints of an empty pool (its clean list: 4 bytes per 1 MiB extent);
    # 64 bytes per extent per checkpoint bounds them with room to spare.
    local need=$(( (256 << 10) + 2 * (b >> 20) * 64 / 1024 + (64 << 10) ))
    [ "$(free_kib)" -gt "$need" ] \
        || die "pool $size: needs about $(( need >> 10 )) MiB free in $work for its metadata, $(( $(free_kib) >> 10 )) MiB there"
    rm -f "$work/pool.img"
    # ext4 files end 4 KiB short of 16 TiB: the size less 1 MiB then, said in the row.
    if ! truncate -s "$b" "$work/pool.img" 2> "$work/pool.err"; then
        rm -f "$work/pool.img"
        truncate -s $((b - (1 << 20))) "$work/pool.img" 2>> "$work/pool.err" \
            || die "pool $size: cannot make a sparse file that large in $work ($(cat "$work/pool.err")); try --dir on XFS"
        log "pool $size: the file system refuses $b bytes in one file; measuring $size less 1 MiB"
        b=$((b - (1 << 20))) size="$size-1MiB"
    fi
    rm -f "$work/pool.img"
    log "pool $size: format"
    t0=$(now)
    "$bin" pool create "$work/pool.img" --size "$b" > "$work/pool-$size.create" 2>&1 \
        || die "pool $size: kvtarget pool create failed: $(cat "$work/pool-$size.create")"
    fmt_s=$(since "$t0")
    fp0=$(used_kib "$work/pool.img")
    namespaces=''
    write_config pool "[[pools]]
name = \"scale\"
backend = \"uring\"
path = \"$work/pool.img\"" 0
    log "pool $size: open, SIGKILL, recovery"
    t0=$(now)
    start_target pool
    open_s=$(since "$t0")
    rss1=$(rss_kib "$tgt_pid")
    t0=$(now)
    crash_target
    start_target pool
    rec_s=$(since "$t0")
    rss2=$(rss_kib "$tgt_pid")
    stop_target
    fp1=$(used_kib "$work/pool.img")
    row section=pools size="$size" bytes="$b" format_s="$fmt_s" open_s="$open_s" recovery_s="$rec_s" \
        rss_open_kib="$rss1" rss_recovered_kib="$rss2" meta_formatted_kib="$fp0" meta_after_kib="$fp1"
    rm -f "$work/pool.img"
}

if wants keys; then for n in "${key_list[@]}"; do run_keys "$n"; done; fi
if wants volumes; then for n in "${volume_list[@]}"; do run_volumes "$n"; done; fi
if wants queues; then
    for n in "${queue_list[@]}"; do run_queues "$n"; done
    run_storm
fi
if wants pools; then for s in "${size_list[@]}"; do run_pool "$s"; done; fi

tables=$(python3 - "$rows" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def sec(name): return [r for r in rows if r["section"] == name]
def j(s): return json.loads(s)
def f(x, d=0): return f"{float(x):,.{d}f}"
def busy_per_io(r, p):
    b0, b1, t0, t1 = map(float, r["stretch"].split())
    return f((b1 - b0) * 1e6 / max(p["iops"] * (t1 - t0), 1e-9), 2)
out = []
if sec("keys"):
    out += ["KV keys (512-byte values, 16-byte keys, one uring pool on a sparse file)", "",
            "| keys | load s | RSS B/key | RSS total B/key | checkpoint B/key | checkpoint ms | last commit ms | mix P99 us | mix P99 us, checkpointing | ratio | checkpoints (mix / checkpointing) | mix ops/s (without / with) | List s | List keys | recovery s | journal entries / records replayed | keys recovered | RSS after recovery B/key | pool file MiB |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sec("keys"):
        n = int(r["keys"]); m, c, l = j(r["mix"]), j(r["mix_ckpt"]), j(r["list"])
        ratio = c["lat_us"]["p99"] / max(m["lat_us"]["p99"], 1e-9)
        per = lambda kib: f((int(kib) - int(r["rss0_kib"])) * 1024 / n)
        lk = f"{l['list']['keys']:,}" + ("" if l["list"]["complete"] else " (600 s ran out)")
        out.append(f"| {n:,} | {f(r['load_s'], 1)} | {per(r['rss1_kib'])} | {f(int(r['rss1_kib']) * 1024 / n)} | "
                   f"{f(int(r['ckpt_bytes']) / n, 1)} | "
                   f"{f(int(r['ckpt_us']) / 1000, 1)} | {f(int(r['commit_us']) / 1000, 1)} | {f(m['lat_us']['p99'])} | "
                   f"{f(c['lat_us']['p99'])} | {ratio:.2f} | {r['ckpts_mix']} / {r['ckpts_mix_ckpt']} | "
                   f"{f(m['iops'])} / {f(c['iops'])} | {f(l['seconds'], 2)} | {lk} | {f(r['recovery_s'], 2)} | "
                   f"{' / '.join(r['replayed'].split())} | "
                   f"{int(r['keys_recovered']):,} | {per(r['rss_recovered_kib'])} | {f(int(r['pool_kib']) / 1024)} |")
    out.append("")
if sec("volumes"):
    out += ["Thin volumes (1 GiB each) in one 64 GiB pool on a sparse file", "",
            "| volumes asked | created | create ms/volume | RSS KiB/volume | checkpoint bytes | recovery s | volumes recovered | refused with |",
            "|---|---|---|---|---|---|---|---|"]
    for r in sec("volumes"):
        k = int(r["created"])
        out.append(f"| {int(r['volumes']):,} | {k:,} | {f(float(r['create_s']) * 1000 / k, 2)} | "
                   f"{f((int(r['rss1_kib']) - int(r['rss0_kib'])) / k, 1)} | {int(r['ckpt_bytes']):,} | "
                   f"{f(r['recovery_s'], 2)} | {r['volumes_recovered']} | {r['refused'] if r['refused'] != 'None' else ''} |")
    out.append("")
if sec("queues") or sec("storm"):
    out += ["NVMe/TCP I/O queues: 4 KiB random reads, RAM pool, two reactors", "",
            "| queues | controllers x queues | QD per queue | IOPS | P99 us | P99.9 us | max us | reactor us/IO | RSS KiB/queue idle | RSS KiB/queue busy | connect s |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sec("queues"):
        p, q = j(r["run"]), int(r["queues"])
        out.append(f"| {q:,} | {r['controllers']} x {q // int(r['controllers'])} | {r['qd']} | {f(p['iops'])} | "
                   f"{f(p['lat_us']['p99'])} | {f(p['lat_us']['p99_9'])} | {f(p['lat_us']['max'])} | {busy_per_io(r, p)} | "
                   f"{f((int(r['idle1_kib']) - int(r['idle0_kib'])) / q, 1)} | "
                   f"{f((int(r['rss1_kib']) - int(r['rss0_kib'])) / q, 1)} | {p['connect_s']:.3f} |")
    for r in sec("storm"):
        p = j(r["run"])
        out.append(f"| connect storm: 256 | 16 x 16 from 16 threads | idle | | | | | | "
                   f"{f((int(r['rss1_kib']) - int(r['rss0_kib'])) / 256, 1)} (after they left) | | {p['connect_s']:.3f} |")
    out.append("")
if sec("queues_spdk"):
    kv = {r["queues"]: (j(r["run"]), r) for r in sec("queues")}
    out += [f"The same queues against SPDK nvmf_tgt ({sec('queues_spdk')[0]['version']}, -m 0x3, TCP defaults, Malloc 1 GiB), "
            "measured right after kvtarget's run of the row; ratio kvtarget / SPDK", "",
            "| queues | SPDK IOPS | P99 us | P99.9 us | max us | reactor us/IO | IOPS ratio | P99 ratio | P99.9 ratio | max ratio | reactor us/IO ratio |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sec("queues_spdk"):
        p, q = j(r["run"]), int(r["queues"])
        k, kr = kv[r["queues"]]
        lat = lambda x: f"{k['lat_us'][x] / max(p['lat_us'][x], 1e-9):.2f}"
        ratio_busy = float(busy_per_io(kr, k).replace(",", "")) / max(float(busy_per_io(r, p).replace(",", "")), 1e-9)
        out.append(f"| {q:,} | {f(p['iops'])} | {f(p['lat_us']['p99'])} | {f(p['lat_us']['p99_9'])} | {f(p['lat_us']['max'])} | "
                   f"{busy_per_io(r, p)} | {k['iops'] / max(p['iops'], 1e-9):.2f} | {lat('p99')} | {lat('p99_9')} | {lat('max')} | {ratio_busy:.2f} |")
    out.append("")
if sec("beside"):
    out += ["16 busy queues (1 controller, QD 64 each) beside idle ones: the 16-queue row's load with "
            "the rest of the row's queues connected and silent", "",
            "| queues in all | target | IOPS | P99 us | P99.9 us | max us | reactor us/IO |",
            "|---|---|---|---|---|---|---|"]
    for r in sec("beside"):
        p = j(r["run"])
        out.append(f"| {int(r['queues']):,} | {r['target']} | {f(p['iops'])} | {f(p['lat_us']['p99'])} | "
                   f"{f(p['lat_us']['p99_9'])} | {f(p['lat_us']['max'])} | {busy_per_io(r, p)} |")
    out.append("")
if sec("pools"):
    out += ["Pool size (sparse file, 1 MiB extents, no volumes)", "",
            "| size | format s | metadata after format MiB | open s | RSS open MiB | recovery s | RSS recovered MiB | metadata after recovery MiB |",
            "|---|---|---|---|---|---|---|---|"]
    for r in sec("pools"):
        mib = lambda k: f(int(k) / 1024, 1)
        out.append(f"| {r['size']} | {f(r['format_s'], 2)} | {mib(r['meta_formatted_kib'])} | {f(r['open_s'], 2)} | "
                   f"{mib(r['rss_open_kib'])} | {f(r['recovery_s'], 2)} | {mib(r['rss_recovered_kib'])} | {mib(r['meta_after_kib'])} |")
print("\n".join(out).rstrip())
PYEOF
) || die "the tables could not be made from $rows"
echo "$tables"
if [ "$record" = 1 ]; then
    rev="$(git -C "$repo" rev-parse --short HEAD)$(git -C "$repo" diff --quiet || echo +dirty)"
    {
        echo
        echo "### $(date -u '+%Y-%m-%d %H:%M UTC'), commit $rev: scale on one node"
        echo
        echo "\`$cmdline\`; load at start: $load1 ($load_start); $(nproc) cores, $(awk '/MemTotal/ { print int($2 / 1048576) }' /proc/meminfo) GiB RAM."
        echo
        echo "$tables"
    } >> "$repo/bench/RESULTS.md"
fi
