#!/usr/bin/env bash
# Failover time of a three-node cluster sharing one pool, seen by the Linux kernel's
# native NVMe multipath in the QEMU guest (issue 36 item 7).
#
#   bench/run-failover.sh [--kills N] [--ttl S] [--settle S] [--record] [--keep]
#
#   --kills N     SIGKILLs of the owner (default 20)
#   --ttl S       the nodes' lease_ttl_secs (default 2, as tests/interop's cluster-failover)
#   --settle S    seconds of steady I/O on the new owner before the next kill (default 6)
#   --record      append the tables to bench/RESULTS.md (heading with date, commit,
#                 this command, the machine's load)
#   --keep        keep the work directory (share, node and etcd logs, the I/O log) in /tmp
#
# Host: one etcd member (Debian's etcd-server) and three kvtarget nodes on loopback
# ports, all on core 0, each with the same config but its name and port: one shared
# uring pool file (320 MiB, a 128 MiB write-through block volume) served as NSID 1 of
# one cluster-wide subsystem with ANA reporting. The guest (ci/guest/run.sh, Debian 12's
# Linux 6.1, 2 vCPUs, QEMU/TCG pinned to core 1, slirp networking unless GUEST_NET=tap)
# connects one path to each node with
# nvme-cli's default options and runs fio on the multipath head: 4 KiB random writes at
# iodepth 1 (libaio, O_DIRECT), every completion logged with its Unix time in ms
# (write_lat_log, log_unix_epoch). Per kill the guest asks this script over the 9p
# share to SIGKILL the node whose path is optimized; this script kills it, polls the
# survivors' kvtarget_get_cluster every 10 ms until one reports `owner`, then starts
# the dead node again (it rejoins as a follower; its path reconnects), and answers.
#
# Per kill, from the guest's clock:
#   stall      the longest gap between two I/O completions in the minute after the
#              kill request (the I/Os completed while the request travels come before
#              the kill; the completion ending the gap is the first on the new path)
#   failover   the kill request to that first completion on the new path; includes the
#              request's delivery over 9p (the "ping" row: round trips of an empty
#              request, measured the same way, before the kills)
#   spanning   the completion latency of the I/O in flight across the kill
# and from the host's clock:
#   owner      SIGKILL to a survivor's kvtarget_get_cluster reporting `owner` (the lease
#              running out, the election, the pool's recovery, the namespace attached)
# fio must finish with 0 errors: an I/O error the host saw ends the run as a failure.
#
# Nothing else may run on the machine. Needs root (QEMU) and etcd (apt-get install
# etcd-server). Env: KVTARGET_BIN (default: cargo build --release, then
# target/release/kvtarget).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
repo=$PWD
cmdline="bench/run-failover.sh$(printf ' %q' "$@")"

kills=20 ttl=2 settle=6 record=0 keep=0
while [ $# -gt 0 ]; do
    case $1 in
        --kills) kills=${2:-}; shift 2 || exit 2 ;;
        --ttl) ttl=${2:-}; shift 2 || exit 2 ;;
        --settle) settle=${2:-}; shift 2 || exit 2 ;;
        --record) record=1; shift ;;
        --keep) keep=1; shift ;;
        -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "run-failover: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
for n in "$kills" "$ttl" "$settle"; do
    case $n in '' | *[!0-9]* | 0) echo "run-failover: --kills, --ttl and --settle take a positive integer" >&2; exit 2 ;; esac
done
log() { echo "run-failover: $*" >&2; }
die() { failed=1; log "error: $*"; exit 1; }
[ "$(id -u)" = 0 ] || { log "must run as root (QEMU)"; exit 1; }
command -v etcd > /dev/null || { log "no etcd: apt-get install etcd-server"; exit 1; }
command -v taskset > /dev/null || { log "taskset (util-linux) missing"; exit 1; }

# This script and everything it starts stay on core 0; the guest gets core 1.
taskset -cp 0 $$ > /dev/null || { log "taskset -cp 0 failed"; exit 1; }

. "$repo/bench/lib/machine.sh"
warn_if_busy

kvbin=$(kvtarget_bin) || die "no kvtarget to measure"
guest_dir=$("$repo/ci/guest/build.sh") || die "ci/guest/build.sh could not provide the guest"

work=$(mktemp -d /tmp/kvtarget-failover.XXXXXX)
share=$work/share
mkdir -p "$share"
. "$repo/bench/lib/targets.sh"   # free_port, stop_proc
etcd_pid='' guest_pid='' failed=0
declare -A node_pid=()
cleanup() {
    [ -n "$guest_pid" ] && kill -TERM "$guest_pid" 2>/dev/null && wait "$guest_pid" 2>/dev/null
    local p
    for p in "${!node_pid[@]}"; do stop_proc "${node_pid[$p]}"; done
    [ -n "$etcd_pid" ] && stop_proc "$etcd_pid"
    if [ "$keep" = 1 ] || [ "$failed" != 0 ]; then log "work directory kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

etcd_port=$(free_port) etcd_peer=$(free_port)
taskset -c 0 etcd --name=bench --data-dir="$work/etcd" \
    --listen-client-urls="http://127.0.0.1:$etcd_port" --advertise-client-urls="http://127.0.0.1:$etcd_port" \
    --listen-peer-urls="http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls="http://127.0.0.1:$etcd_peer" \
    --initial-cluster="bench=http://127.0.0.1:$etcd_peer" > "$work/etcd.log" 2>&1 &
etcd_pid=$!
for _ in $(seq 100); do
    curl -sf -X POST "http://127.0.0.1:$etcd_port/v3/kv/put" -d '{"key":"YmVuY2g=","value":"MQ=="}' > /dev/null 2>&1 && break
    sleep 0.1
done
curl -sf -X POST "http://127.0.0.1:$etcd_port/v3/kv/range" -d '{"key":"YmVuY2g="}' > /dev/null || die "etcd did not start (see $work/etcd.log)"

nqn=nqn.2026-12.io.kvtarget:bench-failover
ports=()
for _ in 1 2 3; do
    p=$(free_port)
    while printf '%s\n' "${ports[@]}" "$etcd_port" "$etcd_peer" | grep -qx "$p"; do p=$(free_port); done
    ports+=("$p")
done
node_config() { # PORT
    cat <<EOF
# Written by bench/run-failover.sh: one of three nodes sharing one pool.
[[listeners]]
address = "127.0.0.1"
port = $1

[[pools]]
name = "shared"
backend = "uring"
path = "$work/failover.pool"
size = "320MiB"
shared = true

[[pools.volumes]]
name = "blocks"
size = "128MiB"

[[subsystems]]
nqn = "$nqn"
allow_any_host = true
ana_reporting = true
cluster_wide = true

[[subsystems.namespaces]]
nsid = 1
volume = "shared/blocks"
write_cache = false

[cluster]
endpoints = ["http://127.0.0.1:$etcd_port"]
name = "bench"
node = "fo-$1"
lease_ttl_secs = $ttl
EOF
}
start_node() { # PORT
    node_config "$1" > "$work/fo-$1.toml"
    echo "---- started $(date -u +%T.%N) ----" >> "$work/fo-$1.log"
    NO_COLOR=1 taskset -c 0 "$kvbin" --config "$work/fo-$1.toml" -r "$work/fo-$1.sock" >> "$work/fo-$1.log" 2>&1 &
    node_pid[$1]=$!
}
# role PORT -> this node's role in the subsystem's group (owner, follower, fenced), or
# nothing while it does not answer.
role() {
    "$kvbin" rpc -r "$work/fo-$1.sock" kvtarget_get_cluster 2> /dev/null \
        | jq -r --arg n "$nqn" '[.groups[]? | select(.subnqn == $n) | .role][0] // empty' 2> /dev/null
}
owners() { local p; for p in "${ports[@]}"; do [ "$(role "$p")" = owner ] && echo "$p"; done; }
for p in "${ports[@]}"; do start_node "$p"; done
for _ in $(seq 150); do [ "$(owners | wc -l)" = 1 ] && break; sleep 0.2; done
[ "$(owners | wc -l)" = 1 ] || die "no single owner 30 s after start (see $work/fo-*.log)"
log "three nodes on ports ${ports[*]}, owner $(owners), etcd on $etcd_port, lease TTL $ttl s"

# kill_owner PORT: SIGKILL, the survivors polled until one is the owner, the dead node
# started again; reply="killed PORT OWNER_MS NEW_OWNER" or "failed: why". Not run in
# a subshell: it starts a node, whose PID this shell keeps.
kill_owner() {
    local dead=$1 t0 t1 new= p i
    [ -n "${node_pid[$dead]:-}" ] && kill -0 "${node_pid[$dead]}" 2> /dev/null || { reply="failed: no node on port $dead"; return; }
    [ "$(role "$dead")" = owner ] || { reply="failed: $dead is not the owner ($(role "$dead"))"; return; }
    t0=$(date +%s%N)
    kill -KILL "${node_pid[$dead]}"
    { wait "${node_pid[$dead]}"; } 2> /dev/null   # bash's "Killed" notice too
    for i in $(seq 6000); do
        for p in "${ports[@]}"; do
            [ "$p" = "$dead" ] && continue
            [ "$(role "$p")" = owner ] && { new=$p; break 2; }
        done
        sleep 0.01
    done
    t1=$(date +%s%N)
    start_node "$dead"
    [ -n "$new" ] || { reply="failed: no survivor became the owner within 60 s"; return; }
    reply="killed $dead $(( (t1 - t0) / 1000000 )) $new"
}

cp "$repo/bench/guest/failover.sh" "$repo/bench/guest/host-request.sh" "$share/"
cat > "$share/plan.env" <<EOF
KILLS=$kills
SETTLE=$settle
ADDR=10.0.2.2
PORTS="${ports[*]}"
NQN=$nqn
HOSTNQN=nqn.2026-12.io.kvtarget:bench-failover-host
HOSTID=6b7a7f1e-0c1d-4d2e-9a41-6b767400001a
EOF

budget=$(( kills * (settle + 4 * ttl + 40) + 600 ))
GUEST_DIR=$guest_dir taskset -c 1 "$repo/ci/guest/run.sh" --share "$share" --script failover.sh \
    --net "${GUEST_NET:-user}" --smp 2 --mem 2G --timeout "$budget" --log "$work/console.log" > "$work/guest-run.log" 2>&1 &
guest_pid=$!
log "guest booting (console: $work/console.log); $kills kills"

: > "$work/kills.log"
while kill -0 "$guest_pid" 2> /dev/null; do
    if [ -f "$share/request" ]; then
        read -r seq cmd arg < "$share/request"
        rm -f "$share/request"
        case $cmd in
            ping) reply=pong ;;
            kill) kill_owner "$arg"; log "guest: kill $arg: $reply"; echo "$reply" >> "$work/kills.log" ;;
            *) reply="failed: unknown command $cmd" ;;
        esac
        echo "$seq $reply" > "$share/reply.tmp" && mv "$share/reply.tmp" "$share/reply"
    fi
    sleep 0.005
done
wait "$guest_pid"
guest_rc=$?
guest_pid=
[ "$guest_rc" = 0 ] || { failed=1; log "the guest's script failed (status $guest_rc):"; tail -n 30 "$work/guest-run.log" >&2; }
[ -s "$share/kills.jsonl" ] || die "the guest recorded no kills"

load_end=$(uptime)
rev=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo "+dirty")
python3 - "$share/kills.jsonl" "$share/pings.txt" "$share/fio.json" "$share/clat.log" > "$work/tables.md" <<'PY'
import bisect, json, statistics, sys
kills = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
pings = [float(x) for x in open(sys.argv[2]).read().split()]
fio = json.load(open(sys.argv[3]))["jobs"][0]
# fio's completion log: Unix ms, latency ns. Per kill, the longest gap between two
# completions from its request to the next kill's (a minute at most): the completion
# ending it is the first on the new path.
done = sorted((int(f[0]), int(f[1])) for f in (l.split(",") for l in open(sys.argv[4])) if len(f) > 1)
t = [d[0] for d in done]
for n, k in enumerate(kills):
    end = min(k["t_req"] + 60000, kills[n + 1]["t_req"] if n + 1 < len(kills) else 1 << 62)
    lo, hi = max(1, bisect.bisect_left(t, k["t_req"])), bisect.bisect_left(t, end)
    if lo < hi:
        i = max(range(lo, hi), key=lambda j: t[j] - t[j - 1])
        k["failover_ms"] = t[i] - k["t_req"]
        k["stall_ms"] = t[i] - t[i - 1]
        k["spanning_ms"] = done[i][1] / 1e6

def q(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p * (len(xs) - 1))))]

rows = [("failover (request to first I/O after)", "failover_ms"), ("stall (gap in completions)", "stall_ms"),
        ("latency of the I/O across the kill", "spanning_ms"), ("SIGKILL to a survivor reporting owner (host clock)", "owner_ms")]
print(f"{len(kills)} kills; ms over the kills.")
print()
print("| measure | min | median | P90 | max |")
print("|---|---|---|---|---|")
for name, key in rows:
    xs = [k[key] for k in kills if k.get(key) is not None]
    if xs:
        print(f"| {name} | {min(xs):,.0f} | {statistics.median(xs):,.0f} | {q(xs, 0.9):,.0f} | {max(xs):,.0f} |")
if pings:
    print(f"| request round trip over 9p (ping, {len(pings)}) | {min(pings):,.0f} | {statistics.median(pings):,.0f} "
          f"| {q(pings, 0.9):,.0f} | {max(pings):,.0f} |")
w = fio["write"]
pct = w["clat_ns"].get("percentile", {})
print()
print(f"fio over the whole run: {w['total_ios']:,} writes, {w['iops']:,.0f} IOPS, error {fio['error']}; "
      f"completion latency P50 {pct.get('50.000000', 0) / 1e6:.2f} ms, P99 {pct.get('99.000000', 0) / 1e6:.2f} ms, "
      f"P99.9 {pct.get('99.900000', 0) / 1e6:.2f} ms, max {w['clat_ns']['max'] / 1e6:,.0f} ms.")
print()
print("Every kill, in order:")
print()
print("| kill | killed port | new owner | failover ms | stall ms | spanning I/O ms | owner ms (host) |")
print("|---|---|---|---|---|---|---|")
for i, k in enumerate(kills, 1):
    f = lambda key: "-" if k.get(key) is None else f"{k[key]:,.0f}"
    print(f"| {i} | {k['killed']} | {k['new']} | {f('failover_ms')} | {f('stall_ms')} | {f('spanning_ms')} | {f('owner_ms')} |")
PY
[ -s "$work/tables.md" ] || die "no tables (see $share)"
{
    echo "### $(date -u '+%Y-%m-%d %H:%M') UTC, commit $rev: failover of a three-node cluster sharing one pool, SIGKILL of the owner, seen by the Linux host's multipath in the QEMU guest"
    echo
    echo "Command: \`$cmdline\` (\`bench/run-failover.sh --help\` says what it sets up and measures)."
    echo "kvtarget: $("$kvbin" --version 2> /dev/null), three nodes on core 0 sharing a uring pool file, lease TTL $ttl s; etcd $(etcd --version 2> /dev/null | head -n1 | awk '{print $3}'), one member."
    echo "Host: Linux $(grep -o 'interop-init: kernel [^ ,]*' "$work/console.log" | head -n1 | cut -d' ' -f3) NVMe/TCP with native multipath (nvme-cli defaults) in QEMU/TCG (2 vCPUs, core 1) over slirp; fio 4 KiB randwrite, iodepth 1, libaio O_DIRECT, on the multipath head. Machine: $(nproc --all) cores."
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
[ "$failed" = 0 ] || exit 1
