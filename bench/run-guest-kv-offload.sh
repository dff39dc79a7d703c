#!/usr/bin/env bash
# LMCache's raw-block phases through the Linux kernel NVMe/TCP host in the QEMU guest,
# against SPDK v25.09's nvmf_tgt and kvtarget on the host, same guest, same run: the
# guest half of the KV-offload profile set (the host half is
# `bench/run-vs-spdk.sh --set kv-offload`).
#
#   bench/run-guest-kv-offload.sh [--secs S] [--rounds N] [--only REGEX] [--record] [--keep]
#
#   --secs S      seconds per run (default 10)
#   --rounds N    runs per target and profile (default 2); tables give the median
#   --only REGEX  profiles whose name matches (grep -E)
#   --record      append the tables to bench/RESULTS.md (heading with date, commit,
#                 this command, the machine's load)
#   --keep        keep the work directory (share, logs, every fio output) in /tmp
#
# Targets: as in bench/run-vs-spdk.sh (bench/lib/targets.sh): one busy-polling reactor
# on core 0 each, two RAM namespaces (1 GiB and 256 MiB, 4096-byte blocks), NVMe/TCP
# on 127.0.0.1, the one not measured stopped (SIGSTOP). The guest (ci/guest/run.sh,
# Debian 12's Linux 6.1, 2 vCPUs, QEMU/TCG pinned to core 1) reaches them at 10.0.2.2
# through QEMU's user-mode network (slirp; GUEST_NET=tap for ci/guest/run.sh's
# faster tap link): the slow link between an inference host and its KV store. It connects with nvme-cli's default options before each run and
# disconnects after it (a stopped target would otherwise fail the kernel's
# keep-alive), asking this script over the 9p share to switch targets.
#
# Profiles (fio 3.33, io_uring, O_DIRECT, replaying an iolog of LMCache's layout:
# 128 MiB metadata region, slots of 32 MiB + 4 KiB; bench/guest/kv-offload.sh):
#   store QD 2/4/8     each slot in order: its 4 KiB header, then its 32 MiB payload,
#                      QD I/Os in flight (LMCache's posix engine with QD workers)
#   retrieve QD 1/2/4  32 MiB payload reads of the slots in random order
#   store QD4 + bg     the store beside fio's 4 KiB random reads at iodepth 8 on
#                      namespace 2 (another vCPU, so another I/O queue)
# Per run: chunks/s and MiB/s, the 32 MiB payload I/Os' completion latency (mean,
# P50, P99 from fio's per-I/O log), the background reads' IOPS and P99, and the
# target reactor's busy time per chunk (framework_get_reactors around the fio run).
# Each round also measures the link itself: raw TCP from the guest to a sink on the
# host and back (python sockets, both targets stopped), so that store and retrieve
# MiB/s can be read as a share of what the link carries.
#
# Nothing else may run on the machine (2 cores: targets on core 0, QEMU on core 1);
# the script warns when the load average is above 0.5. Needs root (hugepages, QEMU).
# Env: KVTARGET_BIN (default: cargo build --release, then target/release/kvtarget),
#      KVTARGET_CONFIG (default config/bench-ram.toml), SPDK_CACHE / SPDK_DIR (ci/spdk.sh).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
repo=$PWD
cmdline="bench/run-guest-kv-offload.sh$(printf ' %q' "$@")"

secs=10 rounds=2 only=. record=0 keep=0
while [ $# -gt 0 ]; do
    case $1 in
        --secs) secs=${2:-}; shift 2 || exit 2 ;;
        --rounds) rounds=${2:-}; shift 2 || exit 2 ;;
        --only) only=${2:-}; shift 2 || exit 2 ;;
        --record) record=1; shift ;;
        --keep) keep=1; shift ;;
        -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "run-guest-kv-offload: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
for n in "$secs" "$rounds"; do
    case $n in '' | *[!0-9]* | 0) echo "run-guest-kv-offload: --secs and --rounds take a positive integer" >&2; exit 2 ;; esac
done
log() { echo "run-guest-kv-offload: $*" >&2; }
die() { failed=1; log "error: $*"; exit 1; }
[ "$(id -u)" = 0 ] || { log "must run as root (hugepages, QEMU)"; exit 1; }

. "$repo/bench/lib/machine.sh"
warn_if_busy

kvbin=$(kvtarget_bin) || die "no kvtarget to measure"
spdk_env=$("$repo/ci/spdk.sh") || die "ci/spdk.sh could not provide SPDK"
eval "$spdk_env"
nvmf_tgt=$SPDK_DIR/build/bin/nvmf_tgt
rpc_py=$SPDK_DIR/scripts/rpc.py
for t in "$nvmf_tgt" "$rpc_py"; do [ -e "$t" ] || die "SPDK build in $SPDK_DIR has no $t"; done
guest_dir=$("$repo/ci/guest/build.sh") || die "ci/guest/build.sh could not provide the guest"
command -v taskset > /dev/null || die "taskset (util-linux) missing"
# nvmf_tgt with its 1 GiB and 256 MiB Malloc bdevs and buffer pools: about 830 pages.
"$repo/ci/hugepages.sh" --free 860 || die "not enough hugepages"

work=$(mktemp -d /tmp/kvtarget-guest-kv-offload.XXXXXX)
share=$work/share
mkdir -p "$share"
# shellcheck source=bench/lib/targets.sh
. "$repo/bench/lib/targets.sh"
spdk_pid='' kv_pid='' shm_id='' guest_pid='' link_pid='' failed=0
cleanup() {
    [ -n "$guest_pid" ] && kill -TERM "$guest_pid" 2>/dev/null && wait "$guest_pid" 2>/dev/null
    [ -n "$link_pid" ] && kill -TERM "$link_pid" 2>/dev/null
    [ -n "$kv_pid" ] && stop_proc "$kv_pid"
    [ -n "$spdk_pid" ] && stop_proc "$spdk_pid"
    [ -n "$shm_id" ] && rm -rf "/var/run/dpdk/spdk$shm_id"
    if [ "$keep" = 1 ] || [ "$failed" != 0 ]; then log "work directory kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

spdk_port=$(free_port)
kv_port=$(free_port)
while [ "$kv_port" = "$spdk_port" ]; do kv_port=$(free_port); done
link_port=$(free_port)
spdk_nqn=nqn.2016-06.io.spdk:kvtarget-vs-spdk
kv_config=${KVTARGET_CONFIG:-config/bench-ram.toml}
[ -r "$kv_config" ] || die "cannot read $kv_config"
kv_nqn=$(kv_nqn_of "$kv_config") || die "cannot read the subsystem NQN from $kv_config"

start_spdk "$spdk_port" "$spdk_nqn"
start_kv kvtarget "$kvbin" "$kv_port" "$kv_config"
kv_pid=$started_pid kv_version=$started_version
targets=(spdk kvtarget)
declare -A pid_of=([spdk]=$spdk_pid [kvtarget]=$kv_pid)
declare -A sock_of=([spdk]=$spdk_sock [kvtarget]=$started_sock)

# The link's far end: a sink for "U" connections (replies with the byte count once
# the guest has shut its side), a source of LINK_MIB for "D" connections.
link_mib=256
taskset -c 0 python3 - "$link_port" "$link_mib" > "$work/link-server.log" 2>&1 <<'PY' &
import socket, sys
port, mib = int(sys.argv[1]), int(sys.argv[2])
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", port))
srv.listen(4)
buf = b"\xa5" * (1 << 20)
while True:
    c, _ = srv.accept()
    way = c.recv(1)
    if way == b"U":
        n = 0
        while True:
            b = c.recv(1 << 20)
            if not b:
                break
            n += len(b)
        c.sendall(str(n).encode())
    elif way == b"D":
        for _ in range(mib):
            c.sendall(buf)
    c.close()
PY
link_pid=$!

all_profiles=(
    "LMCache_store_32MiB_QD2:store:2:0"
    "LMCache_store_32MiB_QD4:store:4:0"
    "LMCache_store_32MiB_QD8:store:8:0"
    "LMCache_retrieve_32MiB_QD1:retrieve:1:0"
    "LMCache_retrieve_32MiB_QD2:retrieve:2:0"
    "LMCache_retrieve_32MiB_QD4:retrieve:4:0"
    "LMCache_store_32MiB_QD4_+_4KiB_randread_QD8_ns2:store:4:1"
)
selected=()
for p in "${all_profiles[@]}"; do
    name=${p%%:*}
    if echo "${name//_/ }" | grep -Eq -- "$only"; then selected+=("$p"); fi
done
[ ${#selected[@]} -gt 0 ] || die "--only '$only' matches no profile"

cp "$repo/bench/guest/kv-offload.sh" "$repo/bench/guest/host-request.sh" "$share/"
cat > "$share/plan.env" <<EOF
TARGETS="${targets[*]}"
ROUNDS=$rounds
SECS=$secs
PROFILES="${selected[*]}"
LINK_PORT=$link_port
LINK_MIB=$link_mib
ADDR_link=10.0.2.2
HOSTNQN=nqn.2026-12.io.kvtarget:bench-guest
HOSTID=6b7a7f1e-0c1d-4d2e-9a41-6b7674000019
ADDR_spdk=10.0.2.2
PORT_spdk=$spdk_port
NQN_spdk=$spdk_nqn
ADDR_kvtarget=10.0.2.2
PORT_kvtarget=$kv_port
NQN_kvtarget=$kv_nqn
EOF

# The guest: 2 vCPUs (so the background reads get their own I/O queue), 3 GiB (fio's
# buffers: iodepth x 32 MiB), QEMU pinned to core 1, off the targets' core 0.
runs_budget=$(( (secs + 25) * rounds * ${#selected[@]} * 2 + 600 ))
GUEST_DIR=$guest_dir taskset -c 1 "$repo/ci/guest/run.sh" --share "$share" --script kv-offload.sh \
    --net "${GUEST_NET:-user}" --smp 2 --mem 3G --timeout "$runs_budget" --log "$work/console.log" > "$work/guest-run.log" 2>&1 &
guest_pid=$!
log "guest booting (console: $work/console.log); ${#selected[@]} profile(s) x ${#targets[@]} targets x $rounds round(s)"

# Serve the guest's requests until it powers off.
: > "$work/marks"
while kill -0 "$guest_pid" 2>/dev/null; do
    if [ -f "$share/request" ]; then
        read -r seq cmd arg < "$share/request"
        rm -f "$share/request"
        reply=ok
        case $cmd in
            activate)
                if [ -n "${pid_of[$arg]:-}" ]; then activate "$arg"; log "guest: $arg"; else reply="unknown target"; fi ;;
            idle)
                for o in "${targets[@]}"; do kill -STOP "${pid_of[$o]}"; done
                active= ;;
            mark-start | mark-end)
                echo "$arg $cmd $active $(reactors "$active")" >> "$work/marks" ;;
            *) reply="unknown command" ;;
        esac
        echo "$seq $reply" > "$share/reply.tmp" && mv "$share/reply.tmp" "$share/reply"
    fi
    sleep 0.05
done
wait "$guest_pid"
guest_rc=$?
guest_pid=
[ "$guest_rc" = 0 ] || { failed=1; log "the guest's script failed (status $guest_rc):"; tail -n 30 "$work/guest-run.log" >&2; }
[ -s "$share/runs.jsonl" ] || die "the guest recorded no runs"

load_end=$(uptime)
rev=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo "+dirty")
python3 - "$share/runs.jsonl" "$work/marks" "$share/link.jsonl" "$secs" "$rounds" > "$work/tables.md" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
marks = {}
for l in open(sys.argv[2]):
    f = l.split()
    if len(f) == 5:
        marks.setdefault(int(f[0]), {})[f[1]] = (int(f[3]), float(f[4]))
links = [json.loads(l) for l in open(sys.argv[3]) if l.strip()]
secs, rounds = sys.argv[4], sys.argv[5]
for r in runs:
    m = marks.get(r["run"], {})
    f = r.get("fio")
    if f and "mark-start" in m and "mark-end" in m and f["chunks"]:
        (b, rate), (a, _) = m["mark-start"], m["mark-end"]
        f["busy_ms_per_chunk"] = (a - b) / rate * 1e3 / f["chunks"]
profiles = list(dict.fromkeys(r["profile"] for r in runs))

def med(p, t, key):
    xs = [r["fio"][key] for r in runs if r["profile"] == p and r["target"] == t
          and r["error"] is None and r["fio"].get(key) is not None]
    return statistics.median(xs) if xs else None

def worst(p, t, key):
    xs = [r["fio"][key] for r in runs if r["profile"] == p and r["target"] == t
          and r["error"] is None and r["fio"].get(key) is not None]
    return max(xs) if xs else None

def fmt(x, nd=1):
    return "-" if x is None else f"{x:,.{nd}f}"

def ratio(a, b):
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}"

up = statistics.median([l["up_mib_s"] for l in links]) if links else None
down = statistics.median([l["down_mib_s"] for l in links]) if links else None
print(f"Median of {rounds} round(s), {secs} s per run; kvtarget/SPDK ratios of those medians "
      "(MiB/s: above 1 is kvtarget faster; P99 and busy: below 1 is kvtarget better). "
      "P99 is the 32 MiB payload I/Os' completion latency in the guest; busy is the target "
      "reactor's busy time per chunk.")
print()
print(f"The link (raw TCP through slirp, python sockets, both targets stopped, median of "
      f"{len(links)}): guest to host {fmt(up)} MiB/s, host to guest {fmt(down)} MiB/s. "
      "'of link' divides a run's MiB/s by the direction it mostly uses.")
print()
print("| profile | SPDK MiB/s | SPDK of link | SPDK P99 ms | SPDK P99.9 ms | SPDK max ms | SPDK busy ms/chunk "
      "| kvtarget MiB/s | kvtarget of link | kvtarget P99 ms | kvtarget P99.9 ms | kvtarget max ms "
      "| kvtarget busy ms/chunk | MiB/s kvt/SPDK | P99 kvt/SPDK | P99.9 kvt/SPDK | max kvt/SPDK | busy kvt/SPDK |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for p in profiles:
    s = {k: med(p, "spdk", k) for k in ("mib_s", "p99_us", "p999_us", "busy_ms_per_chunk")}
    k = {k: med(p, "kvtarget", k) for k in ("mib_s", "p99_us", "p999_us", "busy_ms_per_chunk")}
    s["max_us"], k["max_us"] = worst(p, "spdk", "max_us"), worst(p, "kvtarget", "max_us")
    ln = down if "retrieve" in p else up
    of = lambda x: "-" if x is None or not ln else f"{x / ln:.0%}"
    ms = lambda x: None if x is None else x / 1000
    print(f"| {p} | {fmt(s['mib_s'])} | {of(s['mib_s'])} | {fmt(ms(s['p99_us']))} | {fmt(ms(s['p999_us']))} "
          f"| {fmt(ms(s['max_us']))} | {fmt(s['busy_ms_per_chunk'], 2)} "
          f"| {fmt(k['mib_s'])} | {of(k['mib_s'])} | {fmt(ms(k['p99_us']))} | {fmt(ms(k['p999_us']))} "
          f"| {fmt(ms(k['max_us']))} | {fmt(k['busy_ms_per_chunk'], 2)} "
          f"| {ratio(k['mib_s'], s['mib_s'])} | {ratio(k['p99_us'], s['p99_us'])} "
          f"| {ratio(k['p999_us'], s['p999_us'])} | {ratio(k['max_us'], s['max_us'])} "
          f"| {ratio(k['busy_ms_per_chunk'], s['busy_ms_per_chunk'])} |")
if any("bg_iops" in (r.get("fio") or {}) for r in runs):
    print()
    print("Beside the store, fio's 4 KiB random reads at iodepth 8 on namespace 2 (medians):")
    print()
    print("| profile | SPDK bg IOPS | SPDK bg P99 us | SPDK bg P99.9 us | SPDK bg max us | kvtarget bg IOPS "
          "| kvtarget bg P99 us | kvtarget bg P99.9 us | kvtarget bg max us | bg IOPS kvt/SPDK | bg P99 kvt/SPDK "
          "| bg P99.9 kvt/SPDK |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for p in profiles:
        if not any(r["profile"] == p and "bg_iops" in (r.get("fio") or {}) for r in runs):
            continue
        s = {k: med(p, "spdk", k) for k in ("bg_iops", "bg_p99_us", "bg_p999_us")}
        k = {k: med(p, "kvtarget", k) for k in ("bg_iops", "bg_p99_us", "bg_p999_us")}
        s["bg_max_us"], k["bg_max_us"] = worst(p, "spdk", "bg_max_us"), worst(p, "kvtarget", "bg_max_us")
        print(f"| {p} | {fmt(s['bg_iops'], 0)} | {fmt(s['bg_p99_us'])} | {fmt(s['bg_p999_us'])} | {fmt(s['bg_max_us'])} "
              f"| {fmt(k['bg_iops'], 0)} | {fmt(k['bg_p99_us'])} | {fmt(k['bg_p999_us'])} | {fmt(k['bg_max_us'])} "
              f"| {ratio(k['bg_iops'], s['bg_iops'])} | {ratio(k['bg_p99_us'], s['bg_p99_us'])} "
              f"| {ratio(k['bg_p999_us'], s['bg_p999_us'])} |")
print()
print("Every run, in the order run:")
print()
print("| round | profile | target | chunks | MiB/s | mean ms | P50 ms | P99 ms | P99.9 ms | max ms | busy ms/chunk | error |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in runs:
    f = r.get("fio") or {}
    ms = lambda key: None if f.get(key) is None else f[key] / 1000
    print(f"| {r.get('round', '-')} | {r['profile']} | {r['target']} | {f.get('chunks', '-')} | {fmt(f.get('mib_s'))} "
          f"| {fmt(ms('mean_us'))} | {fmt(ms('p50_us'))} | {fmt(ms('p99_us'))} | {fmt(ms('p999_us'))} | {fmt(ms('max_us'))} "
          f"| {fmt(f.get('busy_ms_per_chunk'), 2)} | {r['error'] or (f.get('errors') or '')} |")
print()
print("Link measurements: " + "; ".join(
    f"round {l['round']}: up {l['up_mib_s']:.1f}, down {l['down_mib_s']:.1f} MiB/s" for l in links))
PY
{
    echo "### $(date -u '+%Y-%m-%d %H:%M') UTC, commit $rev: LMCache's raw-block phases through the Linux kernel host in the QEMU guest, SPDK nvmf_tgt vs kvtarget, ${secs}s per run, $rounds round(s)"
    echo
    echo "Command: \`$cmdline\` (\`bench/run-guest-kv-offload.sh --help\` says what it sets up)."
    echo "SPDK: $spdk_version, nvmf_tgt -m 0x1, TCP transport defaults, Malloc bdevs 1 GiB and 256 MiB / 4096 B."
    echo "kvtarget: $kv_version, $kv_config on a free port with 4096-byte blocks."
    echo "Initiator: Linux $(grep -o 'interop-init: kernel [^ ,]*' "$work/console.log" | head -n1 | cut -d' ' -f3) NVMe/TCP host (nvme-cli defaults) in QEMU/TCG (2 vCPUs, pinned to core 1) over slirp; fio 3.33 io_uring O_DIRECT replaying LMCache's layout. Machine: $(nproc) cores."
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
if grep -q '"error": "' "$share/runs.jsonl"; then failed=1; fi
[ "$failed" = 0 ] || { log "some runs failed (see the error column; logs in $work)"; exit 1; }
