#!/usr/bin/env bash
# SPDK's own NVMe-oF host tools against kvtarget over NVMe/TCP on loopback, each with
# its default options (no `hostnqn:` in the transport ID, so spdk_nvme_perf connects
# with an EMPTY host NQN):
#
#   spdk_nvme_identify  the controller (serial, model, subsystem NQN) and the namespace
#                       (size, block size) as kvtarget reports them; every Get Features
#                       identify asks for is answered
#   spdk_nvme_perf      a write run and a read run finish without I/O errors, IOPS > 0;
#                       the empty host NQN reaches the allow-any-host subsystem and is
#                       refused (and logged) on a subsystem with a host list; the listed
#                       host NQN (`hostnqn:`) is let in there, so the refusal is the NQN's
#   bdevperf -w verify  SPDK's bdev_nvme initiator writes, reads back and compares every
#                       block (spdk_nvme_perf has no data check: it only verifies DIF/DIX
#                       protection information on namespaces with metadata, see
#                       nvme_verify_io in app/spdk_nvme_perf/perf.c); once with the
#                       default pattern at 4 KiB, once with -U (unique data per write,
#                       so stale or misplaced blocks mismatch too) at 1 MiB, beyond
#                       in-capsule data and split into H2C data PDUs
#   clean detach        every SPDK host shuts its controller down without a driver error
#
# SPDK v25.09 comes from ci/spdk.sh (built once into .cache/spdk; SPDK_CACHE or SPDK_DIR
# point it elsewhere), hugepages from ci/hugepages.sh. Needs root (hugepages).
#
# Usage: tests/spdk-tools/run.sh        (needs target/release/kvtarget)
# Env:   KVTARGET_BIN, SPDK_CACHE, SPDK_DIR, KEEP_WORK=1 (keep the logs in /tmp)
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
bin=${KVTARGET_BIN:-$repo/target/release/kvtarget}
work=$(mktemp -d /tmp/kvtarget-spdktools.XXXXXX)
pass=0 fail=0
ok() { echo "ok - $1"; pass=$((pass + 1)); }
bad() { echo "FAIL - $1: $2"; fail=$((fail + 1)); }
summary() { echo "$pass passed, $fail failed"; }
kv_pid='' tool_pid=''
cleanup() {
    [ -n "$tool_pid" ] && kill -TERM "$tool_pid" 2>/dev/null && wait "$tool_pid" 2>/dev/null
    [ -n "$kv_pid" ] && kill -TERM "$kv_pid" 2>/dev/null && wait "$kv_pid" 2>/dev/null
    if [ -n "${KEEP_WORK:-}" ] || [ "$fail" != 0 ]; then
        echo "spdk-tools: logs kept in $work" >&2
    else
        rm -rf "$work"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
die() { bad "$1" "$2"; summary; exit 1; }

[ -x "$bin" ] || die setup "$bin not built (cargo build --release)"
# python3 picks free ports; ci/spdk.sh checks (or installs) SPDK's own packages.
log() { echo "spdk-tools: $*" >&2; }
source "$repo/ci/lib/debian.sh"
install_debs tools
spdk_env=$("$repo/ci/spdk.sh") || die setup "ci/spdk.sh could not provide SPDK"
eval "$spdk_env"
identify=$SPDK_DIR/build/bin/spdk_nvme_identify
perf=$SPDK_DIR/build/bin/spdk_nvme_perf
bdevperf=$SPDK_DIR/build/examples/bdevperf
for t in "$identify" "$perf" "$bdevperf"; do
    [ -x "$t" ] || die setup "SPDK build in $SPDK_DIR has no $t"
done
"$repo/ci/hugepages.sh" || die setup "no hugepages for SPDK"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port)
nqn=nqn.2026-11.io.kvtarget:spdk-tools
nqn_hosts=nqn.2026-11.io.kvtarget:spdk-tools-hosts
host=nqn.2014-08.org.nvmexpress:uuid:6b767461-7267-6574-0000-0000000000f1
serial=KVTSPDKTOOLS0001
model="kvtarget spdk-tools"
ns_bytes=$((64 << 20))

cat > "$work/kv.toml" <<EOF
[[listeners]]
address = "127.0.0.1"
port = $port

[[subsystems]]
nqn = "$nqn"
serial = "$serial"
model = "$model"
allow_any_host = true

[[subsystems.namespaces]]
nsid = 1
backend = "ram"
size = "64MiB"
block_size = 4096

[[subsystems]]
nqn = "$nqn_hosts"
hosts = ["$host"]

[[subsystems.namespaces]]
nsid = 1
backend = "ram"
size = "16MiB"
block_size = 4096
EOF
"$bin" --config "$work/kv.toml" -r "$work/kv.sock" > "$work/kvtarget.log" 2>&1 &
kv_pid=$!
up=0
for _ in $(seq 100); do
    kill -0 "$kv_pid" 2>/dev/null || break
    if "$bin" rpc -r "$work/kv.sock" spdk_get_version >/dev/null 2>&1 \
        && grep -q "listening on 127.0.0.1:$port" "$work/kvtarget.log"; then
        up=1
        break
    fi
    sleep 0.1
done
[ "$up" = 1 ] || die kvtarget-start "not up on 127.0.0.1:$port: $(tail -n 5 "$work/kvtarget.log" | tr '\n' ' ')"
ok "kvtarget-start (127.0.0.1:$port)"

trid="trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$port subnqn:$nqn"
trid_hosts="trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$port subnqn:$nqn_hosts"

# run NAME CMD...: the tool's stdout+stderr go to $work/NAME.out, its exit status to RC.
# The timeout only guards against a hung tool (nothing here takes more than seconds).
run() {
    local name=$1; shift
    timeout -k 5 120 "$@" > "$work/$name.out" 2>&1 &
    tool_pid=$!
    wait "$tool_pid"
    RC=$?
    tool_pid=
    OUT=$work/$name.out
}
excerpt() { grep -v '^\s*$' "$1" | tail -n "${2:-6}" | tr '\n' ' ' | cut -c1-600; }
# Column N of the "Total" row of a spdk_nvme_perf or bdevperf report (empty when there
# is none): 3 is IOPS in both, 5 is bdevperf's Fail/s. bdevperf ends its live progress
# line with a carriage return, right before that row.
total_col() { tr '\r' '\n' < "$1" | awk -v c="$2" '$1 == "Total" && $2 == ":" { print $c; exit }'; }
total_iops() { total_col "$1" 3; }
positive() { awk -v x="${1:-0}" 'BEGIN { exit !(x + 0 > 0) }'; }

# --- spdk_nvme_identify ---
run identify "$identify" -r "$trid"
field() { sed -n "s/^$1:[[:space:]]*//p" "$OUT" | head -n 1 | sed 's/[[:space:]]*$//'; }
if [ "$RC" != 0 ]; then
    bad identify-controller "exit $RC: $(excerpt "$OUT")"
elif ! grep -q "^NVMeoF Controller at TCP (addr:127.0.0.1 subnqn:$nqn)" "$OUT"; then
    bad identify-controller "no 'NVMeoF Controller at TCP' for $nqn: $(excerpt "$OUT")"
elif [ "$(field 'Serial Number')" != "$serial" ] || [ "$(field 'Model Number')" != "$model" ] \
    || [ "$(field 'Subsystem NQN')" != "$nqn" ]; then
    bad identify-controller "serial '$(field 'Serial Number')' model '$(field 'Model Number')' subnqn '$(field 'Subsystem NQN')'"
else
    ok "identify-controller (serial $serial, model '$model')"
fi
lbas=$(sed -n 's/^Size (in LBAs):[[:space:]]*\([0-9]*\).*/\1/p' "$OUT" | head -n 1)
cur=$(sed -n 's/^Current LBA Format:[[:space:]]*LBA Format #\([0-9]*\).*/\1/p' "$OUT" | head -n 1)
bs=
[ -n "$cur" ] && bs=$(sed -n "s/^LBA Format #$cur: Data Size:[[:space:]]*\([0-9]*\).*/\1/p" "$OUT" | head -n 1)
if grep -q '^Namespace ID:1$' "$OUT" && [ "$bs" = 4096 ] && [ "$lbas" = $((ns_bytes / 4096)) ]; then
    ok "identify-namespace (nsid 1, $lbas LBAs of $bs bytes)"
else
    bad identify-namespace "nsid 1 with $((ns_bytes / 4096)) LBAs of 4096 bytes expected, got LBAs '$lbas' block size '$bs'"
fi
# identify asks Get Features for arbitration, power management, temperature threshold,
# number of queues (and ones kvtarget may refuse as unsupported without a message).
if grep -q '^get_feature(0x[0-9A-F]*) failed' "$OUT"; then
    bad identify-get-features "$(grep '^get_feature' "$OUT" | tr '\n' ' ')(SPDK's nvmf_tgt answers these)"
else
    ok identify-get-features
fi

# --- spdk_nvme_perf, default options, empty host NQN ---
for w in randwrite randread; do
    run "perf-$w" "$perf" -q 32 -o 4096 -w "$w" -t 1 -r "$trid"
    iops=$(total_iops "$OUT")
    if [ "$RC" != 0 ]; then
        bad "perf-$w" "exit $RC: $(excerpt "$OUT")"
    elif grep -q 'completed with error' "$OUT"; then
        bad "perf-$w" "I/O errors: $(grep -m 3 'completed with error' "$OUT" | tr '\n' ' ')"
    elif ! positive "$iops"; then
        bad "perf-$w" "no IOPS reported: $(excerpt "$OUT")"
    else
        ok "perf-$w (4 KiB QD32, $iops IOPS)"
    fi
done
# kvtarget logs the host NQN each controller was created for: perf's was empty.
if grep -q "controller created .* host= subnqn=$nqn " "$work/kvtarget.log"; then
    ok perf-empty-hostnqn-accepted
else
    bad perf-empty-hostnqn-accepted "no controller for an empty host NQN on $nqn in the log: $(grep 'controller created' "$work/kvtarget.log" | tail -n 2 | tr '\n' ' ')"
fi

# --- bdevperf: SPDK's bdev_nvme initiator, write + read back + compare ---
cat > "$work/bdevperf.json" <<EOF
{"subsystems": [{"subsystem": "bdev", "config": [
  {"method": "bdev_nvme_attach_controller",
   "params": {"name": "kvt", "trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1",
              "trsvcid": "$port", "subnqn": "$nqn"}}]}]}
EOF
# --no-pci: touch no PCI device; --disable-cpumask-locks: other SPDK apps on this
# machine may hold core 0's lock, and bdevperf only needs to share the core.
verify() { # NAME QD IO_BYTES [ARGS...]
    local name=$1 qd=$2 io=$3; shift 3
    run "$name" "$bdevperf" --json "$work/bdevperf.json" --no-pci --disable-cpumask-locks \
        -w verify -q "$qd" -o "$io" -t 1 "$@"
    local iops failed range
    # bdevperf states the range it verifies in I/Os: the whole namespace.
    range=$(printf 'start 0x0 length 0x%x' $((ns_bytes / io)))
    iops=$(total_iops "$OUT")
    failed=$(total_col "$OUT" 5)
    if grep -q 'Buffer mismatch' "$OUT"; then
        bad "$name" "data read back differs: $(grep -m 2 'Buffer mismatch' "$OUT" | tr '\n' ' ')"
    elif [ "$RC" != 0 ]; then
        bad "$name" "exit $RC: $(excerpt "$OUT")"
    elif ! positive "$iops"; then
        bad "$name" "no IOPS reported: $(excerpt "$OUT")"
    elif positive "$failed"; then
        bad "$name" "failed I/O ($failed/s)"
    elif ! grep -q "Verification LBA range: $range\$" "$OUT"; then
        bad "$name" "did not verify the whole 64 MiB namespace: $(grep -m 1 'Verification LBA range' "$OUT")"
    else
        ok "$name ($iops IOPS, every read compared)"
    fi
}
verify bdevperf-verify-4k 32 4096
verify bdevperf-verify-1m-unique 4 1048576 -U

# --- the empty host NQN on a subsystem with a host list ---
run perf-refused "$perf" -q 1 -o 4096 -w read -t 1 -r "$trid_hosts"
# spdk_nvme_perf exits 0 when no controller attaches; the Connect status says why:
# status code type 1 (command specific), 0x84 = 132 "Connect Invalid Host".
if grep -q '^Attached to' "$OUT" || positive "$(total_iops "$OUT")"; then
    bad refused-empty-hostnqn "an empty host NQN attached to $nqn_hosts"
elif grep -q 'Connect command completed with error: sct 1, sc 132' "$OUT"; then
    ok "refused-empty-hostnqn (Connect Invalid Host)"
else
    bad refused-empty-hostnqn "not refused with Connect Invalid Host: $(excerpt "$OUT")"
fi
if grep 'connect refused' "$work/kvtarget.log" | grep -q " host= subnqn=$nqn_hosts "; then
    ok refused-empty-hostnqn-logged
else
    bad refused-empty-hostnqn-logged "no 'connect refused' for an empty host on $nqn_hosts in the kvtarget log"
fi
# Control: the listed host gets in, so the refusal above is about the host NQN.
run perf-listed-host "$perf" -q 1 -o 4096 -w read -t 1 -r "$trid_hosts hostnqn:$host"
iops=$(total_iops "$OUT")
if [ "$RC" = 0 ] && positive "$iops" && ! grep -q 'completed with error' "$OUT"; then
    ok "listed-host-accepted ($iops IOPS)"
else
    bad listed-host-accepted "exit $RC: $(excerpt "$OUT")"
fi

# --- every SPDK host detached cleanly ---
# At detach SPDK's driver reads CC, then sets CC.SHN; an error there means kvtarget
# never got the shutdown notification.
dirty=$(grep -l -e 'Failed to read the CC register' -e 'Failed to write the CC register' \
    -e 'shutdown timeout' "$work"/*.out 2>/dev/null | xargs -r -n1 basename | tr '\n' ' ')
if [ -z "$dirty" ]; then
    ok spdk-hosts-detach-cleanly
else
    why=$(grep -h -e 'COMMAND ID CONFLICT' -e 'Failed to .* the CC register' "$work"/*.out \
        | sed 's/.*\*\(ERROR\|NOTICE\)\*: \[[^]]*\] //; s/ cdw0:.*//' | sort -u | tr '\n' ';')
    bad spdk-hosts-detach-cleanly "shutdown failed in: ${dirty}(SPDK: ${why} kvtarget logged $(grep -c 'command id conflict' "$work/kvtarget.log") 'command id conflict')"
fi

kill -TERM "$kv_pid" 2>/dev/null
if wait "$kv_pid"; then ok kvtarget-clean-exit; else bad kvtarget-clean-exit "$(tail -n 5 "$work/kvtarget.log" | tr '\n' ' ')"; fi
kv_pid=
summary
[ "$fail" = 0 ]
