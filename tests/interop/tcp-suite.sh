#!/bin/bash
# NVMe/TCP interop suite: the Linux kernel NVMe host (nvme-cli 2.3, fio 3.33, Debian 12's
# 6.1 kernel) against one target. Runs inside the interop guest (ci/guest), as root.
#
# Each scenario is a function named t_<name with - replaced by _>; it returns 0 or sets
# REASON and returns 1. Output, one line per scenario:
#     ok - <name>
#     FAIL - <name>: <reason>
#     skip - <name>: <reason>     (not run: the target lacks what it tests)
# with '#'-prefixed diagnostics (the failing scenario's kernel log), and a last line
# "N passed, N failed, N skipped". Exit status 0 only if nothing failed; a skipped
# scenario is neither a pass nor a failure.
#
# Usage: tcp-suite.sh --addr A --port P --nqn NQN --hostnqn HOSTNQN [options]
#   --addr A            address the guest connects to (10.0.2.2 = the host's 127.0.0.1)
#   --port P            NVMe/TCP I/O port (4420)
#   --disc-port P       discovery port (8009)
#   --disc-port-svc P   trsvcid the subsystem's entry must carry in the log served on
#                       the discovery port (unchecked when omitted; the entry is always
#                       followed with a real connect)
#   --advertised-addr A traddr the target puts in its discovery log (default: --addr)
#   --nqn NQN           subsystem under test
#   --hostnqn NQN       allowed host NQN (--hostid sets its host ID)
#   --size BYTES        namespace 1 size (default 268435456); --block-size BYTES (4096)
#   --serial S --model M  expected id-ctrl sn/mn (unchecked when omitted)
#   --restart MODE      how to restart the target: "share" (ask the host orchestrator
#                       over the 9p share, see README) or "nvmet" (unlink and relink the
#                       subsystem from its configfs ports in this guest)
#   --share DIR         the 9p share (default /mnt/share)
#   --volumes SPEC      the target serves thin-provisioned pool volumes (kvtarget): SPEC
#                       is a space-separated list of NSID:SIZE_MIB:BLOCK_SIZE:UNWRITTEN
#                       (UNWRITTEN = zeroes|error), one per namespace, NSID 1 included.
#                       Without it the volume scenarios are reported as skipped.
#   --auth-hostnqn NQN  a host the subsystem lists with a DH-HMAC-CHAP key (kvtarget):
#                       the guest, without in-band authentication, must be refused as it
#   --tls-port P        the target also listens on P with TLS required (kvtarget's
#                       secure_channel): the guest, without NVMe/TCP TLS, must be
#                       refused there (tls-required-refused)
#   --kv-nqn NQN        a subsystem whose NSID 1 is a block volume and NSID 2 a KV
#                       namespace (kvtarget, NVMe Key Value command set): kv-namespace
#                       checks what the kernel host makes of it and round-trips KV
#                       commands through passthrough. Skipped without it.
#   --resv-nqn NQN      a subsystem with one namespace (NSID 1) that admits --hostnqn and
#                       --resv-hostnqn: the reservation scenarios drive it from two hosts
#                       with nvme-cli (resv-register/-acquire/-report/-release). Skipped
#                       without it.
#   --resv-hostnqn NQN  the second host (--resv-hostid its host ID; --resv-port2 the
#                       port it connects to, default --port: nvme-cli 2.3 refuses a
#                       second host on the same address as "already connected")
#   --resv-ptpl         NSID 1 of --resv-nqn has a PTPL file: reservation-ptpl-kill kills
#                       the target (SIGKILL through the share) and expects the
#                       registrations back
#   --resv-ctl-nqn NQN --resv-ctl-port P --resv-ctl-port2 P
#                       the control target of the reservation scenarios (SPDK's
#                       nvmf_tgt on the host, beside kvtarget): a one-namespace subsystem
#                       with a PTPL file admitting --hostnqn and --resv-hostnqn, the
#                       second host connecting through the second port.
#                       reservations-spdk-control and reservation-ptpl-kill-spdk-control
#                       run the same steps as reservations and reservation-ptpl-kill
#                       against it (its SIGKILL through the share: the restart request
#                       names this NQN). Skipped without it.
#   --resv-ctl-skip WHY the host has no control target: the *-spdk-control scenarios are
#                       reported skipped with this reason
#   --mp-nqn NQN --mp-port P  a subsystem with ANA reporting (kvtarget) reachable on
#                       --port and P, its NSID 1 a volume: ana-multipath connects both
#                       paths and flips their ANA states under fio. Skipped without.
#   --cluster-disc 'B C'  discovery ports of two kvtarget nodes in one etcd cluster
#                       (kvtarget boot: run.sh starts them and etcd on the host): the
#                       cluster-referrals scenario discovers through each; its "KILL
#                       node-c" request over the share makes the host SIGKILL node C.
#                       --cluster-skip WHY: reported skipped with this reason
#   --cluster-fo 'A B C' --cluster-fo-nqn NQN --cluster-fo-ttl S  ports of three kvtarget
#                       nodes (same etcd cluster, lease S s) sharing one pool, serving
#                       NQN cluster-wide: cluster-failover connects all three paths and
#                       runs fio verify while the host kills the owner, stops the next
#                       one for twice the lease and kills etcd's leader (cluster-request)
#   --only REGEX        run only scenarios whose name matches (development aid)
#   --transport T       tcp (default) or rdma: the same scenarios over NVMe/RDMA
#                       (rdma-guest.sh); NVMe/TCP-only ones (digests, the 8009
#                       discovery port) are reported as skipped there
set -u
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
export LC_ALL=C

TRANSPORT=tcp
ADDR= PORT=4420 DISC_PORT=8009 DISC_PORT_SVC= ADV_ADDR= NQN= HOSTNQN= HOSTID=
SIZE=268435456 BS=4096 SERIAL= MODEL= RESTART=share SHARE=/mnt/share ONLY= VOLUMES=
AUTH_HOSTNQN=
TLS_PORT=
KV_NQN=
RESV_NQN= RESV_HOSTNQN= RESV_PTPL=
RESV_HOSTID=6b7a7f1e-0c1d-4d2e-9a41-6b7674000b02 RESV_PORT2=
RESV_CTL_NQN= RESV_CTL_PORT= RESV_CTL_PORT2= RESV_CTL_SKIP=
MP_NQN= MP_PORT=
CLUSTER_DISC= CLUSTER_SKIP=
CLUSTER_FO= CLUSTER_FO_NQN= CLUSTER_FO_TTL=2
INTRUDER_NQN=nqn.2026-11.io.kvtarget:intruder
INTRUDER_ID=6b7a7f1e-0c1d-4d2e-9a41-6b76740000ff
while [ $# -gt 0 ]; do
    case "$1" in
        --addr) ADDR=$2 ;;
        --port) PORT=$2 ;;
        --disc-port) DISC_PORT=$2 ;;
        --disc-port-svc) DISC_PORT_SVC=$2 ;;
        --advertised-addr) ADV_ADDR=$2 ;;
        --nqn) NQN=$2 ;;
        --hostnqn) HOSTNQN=$2 ;;
        --hostid) HOSTID=$2 ;;
        --size) SIZE=$2 ;;
        --block-size) BS=$2 ;;
        --serial) SERIAL=$2 ;;
        --model) MODEL=$2 ;;
        --restart) RESTART=$2 ;;
        --share) SHARE=$2 ;;
        --volumes) VOLUMES=$2 ;;
        --auth-hostnqn) AUTH_HOSTNQN=$2 ;;
        --tls-port) TLS_PORT=$2 ;;
        --kv-nqn) KV_NQN=$2 ;;
        --resv-nqn) RESV_NQN=$2 ;;
        --resv-hostnqn) RESV_HOSTNQN=$2 ;;
        --resv-hostid) RESV_HOSTID=$2 ;;
        --resv-port2) RESV_PORT2=$2 ;;
        --resv-ptpl) RESV_PTPL=1; shift; continue ;;
        --resv-ctl-nqn) RESV_CTL_NQN=$2 ;;
        --resv-ctl-port) RESV_CTL_PORT=$2 ;;
        --resv-ctl-port2) RESV_CTL_PORT2=$2 ;;
        --resv-ctl-skip) RESV_CTL_SKIP=$2 ;;
        --mp-nqn) MP_NQN=$2 ;;
        --mp-port) MP_PORT=$2 ;;
        --cluster-disc) CLUSTER_DISC=$2 ;;
        --cluster-skip) CLUSTER_SKIP=$2 ;;
        --cluster-fo) CLUSTER_FO=$2 ;;
        --cluster-fo-nqn) CLUSTER_FO_NQN=$2 ;;
        --cluster-fo-ttl) CLUSTER_FO_TTL=$2 ;;
        --only) ONLY=$2 ;;
        --transport) TRANSPORT=$2 ;;
        *) echo "tcp-suite: unknown argument $1" >&2; exit 2 ;;
    esac
    shift 2
done
[ -n "$ADDR" ] && [ -n "$NQN" ] && [ -n "$HOSTNQN" ] || {
    echo "tcp-suite: --addr, --nqn and --hostnqn are required" >&2; exit 2; }
ADV_ADDR=${ADV_ADDR:-$ADDR}
HOSTID=${HOSTID:-$(cat /etc/nvme/hostid 2>/dev/null)}
MiB=1048576
[ "$SIZE" -ge $((256 * MiB)) ] || { echo "tcp-suite: namespace must be >= 256 MiB" >&2; exit 2; }

# Layout of namespace 1 (MiB offsets), one region per scenario so none depends on
# another's data: fio jobs 0-16 and 32-48 (offset_increment 32M), dd 64-80,
# reconnect 96-104, restart 112-120 + 128-132, discard 160-168, write-zeroes 176-184,
# flush 192-196, digests 200-232, queues 240-244, keep-alive 248-252.
#
# With --volumes, the other namespaces are used only by the volume scenarios: the first
# "zeroes" volume other than NSID 1 (nsid 2, 4 KiB blocks) by nuse-tracks-writes-and-
# discard at 0-8 MiB (it must find the volume never written) and by
# volume-data-survives-restart at 16-24 MiB; the first "error" volume (nsid 3, 512-byte
# blocks) by unwritten-error-volume at 32-33 MiB (the rest stays unwritten).

# --volumes: VOL_BS[nsid], VOL_MIB[nsid], VOL_UNW[nsid]; VOL_ZNS and VOL_ENS are the
# zeroes and error volumes the volume scenarios use.
# An entry's optional fifth field "wt" marks a namespace without a volatile write cache
# (`write_cache = false`): lmcache-raw-block uses the first such error volume of at
# least 384 MiB, lmcache-volatile-kill the first such error volume with the cache.
declare -A VOL_BS VOL_MIB VOL_UNW
VOL_NSIDS= VOL_ZNS= VOL_ENS= VOL_LMC= VOL_LMCV=
for v in $VOLUMES; do
    IFS=: read -r n m b u w <<< "$v"
    case "$n:$m:$b:$u:$w" in
        [0-9]*:[0-9]*:[0-9]*:zeroes:|[0-9]*:[0-9]*:[0-9]*:error:|[0-9]*:[0-9]*:[0-9]*:error:wt) ;;
        *) echo "tcp-suite: --volumes entry '$v' is not NSID:SIZE_MIB:BLOCK_SIZE:zeroes|error[:wt]" >&2; exit 2 ;;
    esac
    VOL_NSIDS="$VOL_NSIDS $n" VOL_MIB[$n]=$m VOL_BS[$n]=$b VOL_UNW[$n]=$u
    [ "$n" != 1 ] && [ "$u" = zeroes ] && [ -z "$VOL_ZNS" ] && VOL_ZNS=$n
    [ "$u" = error ] && [ -z "$w" ] && [ -z "$VOL_ENS" ] && VOL_ENS=$n
    [ "$w" = wt ] && [ -z "$VOL_LMC" ] && [ "$m" -ge 384 ] && VOL_LMC=$n
    [ "$u" = error ] && [ -z "$w" ] && [ -z "$VOL_LMCV" ] && [ "$m" -ge 384 ] && VOL_LMCV=$n
done
if [ -n "$VOLUMES" ]; then
    [ "${VOL_MIB[1]:-}" = $((SIZE / MiB)) ] && [ "${VOL_BS[1]}" = "$BS" ] \
        || { echo "tcp-suite: --volumes must describe NSID 1 as ${SIZE} bytes / $BS-byte blocks" >&2; exit 2; }
    [ -n "$VOL_ZNS" ] && [ -n "$VOL_ENS" ] && [ "${VOL_MIB[$VOL_ZNS]}" -ge 32 ] && [ "${VOL_MIB[$VOL_ENS]}" -ge 64 ] \
        || { echo "tcp-suite: --volumes needs a zeroes volume other than NSID 1 (>= 32 MiB) and an error volume (>= 64 MiB)" >&2; exit 2; }
fi

PASSED=0 FAILED=0 SKIPPED=0 FAILED_NAMES= REASON=
WORK=/tmp/tcp-suite
rm -rf "$WORK"; mkdir -p "$WORK"
# 16 MiB of random data, the source of every pattern written.
dd if=/dev/urandom of="$WORK/random" bs=1M count=16 status=none

# ---- helpers ----------------------------------------------------------------------

# shellcheck source=klog-filter.sh
. "$(dirname "$0")/klog-filter.sh"

now() { cut -d' ' -f1 /proc/uptime; }
kmarker() { echo "interop-suite: ==== $1" > /dev/kmsg; }
# Kernel log lines since the last marker for scenario $1.
klog_since() {
    dmesg | awk -v m="interop-suite: ==== $1" '
        { s = $0; sub(/^\[[^]]*\] /, "", s) }
        s == m { buf = ""; next }
        { buf = buf $0 "\n" }
        END { printf "%s", buf }'
}
fail() { REASON=$*; return 1; }

common_opts() { echo "-t $TRANSPORT --hostnqn $HOSTNQN --hostid $HOSTID"; }

# Controllers (nvmeX) of subsystem $1, any state.
ctrls_of() {
    local c
    for c in /sys/class/nvme/nvme*; do
        [ -e "$c/subsysnqn" ] || continue
        [ "$(cat "$c/subsysnqn")" = "$1" ] && basename "$c"
    done
}
ctrl_state() { cat "/sys/class/nvme/$1/state" 2>/dev/null || echo gone; }

# connect [extra nvme-connect args...] -> sets CTRL (nvmeX) and DEV (/dev/nvmeXnY of
# NSID 1). Waits for the namespace's block device.
CTRL= DEV=
connect() {
    CTRL= DEV=
    local out rc
    out=$(timeout 60 nvme connect $(common_opts) -a "$ADDR" -s "$PORT" -n "$NQN" \
        --ctrl-loss-tmo=20 --reconnect-delay=2 -o json "$@" 2>&1)
    rc=$?
    [ $rc = 0 ] || { fail "nvme connect $* failed (rc $rc): $(echo $out)"; return 1; }
    CTRL=$(echo "$out" | jq -r '.device // empty' 2>/dev/null)
    [ -n "$CTRL" ] && [ -e "/sys/class/nvme/$CTRL" ] || { fail "nvme connect printed no device: $(echo $out)"; return 1; }
    wait_ns "$CTRL"
}

# wait_ns nvmeX -> DEV: the multipath head node of NSID 1 in nvmeX's subsystem.
wait_ns() {
    DEV=
    ns_dev "$1" 1 || return 1
    DEV=$NSDEV
}

# ns_dev nvmeX NSID -> NSDEV: the multipath head node of NSID in nvmeX's subsystem
# (head nodes are numbered by the kernel, not by NSID). Waits up to 10 s.
NSDEV=
ns_dev() {
    local ctrl=$1 nsid=$2 i s d
    NSDEV=
    for i in $(seq 1 100); do
        for s in /sys/class/nvme-subsystem/nvme-subsys*; do
            [ -e "$s/$ctrl" ] || continue
            for d in "$s"/nvme*n*; do
                d=$(basename "$d")
                case "$d" in nvme*c*|ng*) continue ;; esac
                if [ "$(cat "/sys/block/$d/nsid" 2>/dev/null)" = "$nsid" ] && [ -b "/dev/$d" ] \
                   && [ "$(cat "/sys/block/$d/size")" != 0 ]; then
                    NSDEV=/dev/$d
                    return 0
                fi
            done
        done
        sleep 0.1
    done
    fail "namespace $nsid block device of $ctrl did not appear within 10s (state $(ctrl_state "$ctrl"))"
}

disconnect_ctrl() {
    local c=$1
    [ -e "/sys/class/nvme/$c" ] || return 0
    timeout 60 nvme disconnect -d "$c" > /dev/null 2>&1
    local i
    for i in $(seq 1 50); do [ -e "/sys/class/nvme/$c" ] || return 0; sleep 0.1; done
    return 1
}
disconnect_all() {
    local c n
    for c in $(ctrls_of "$NQN"); do disconnect_ctrl "$c"; done
    # A reservation scenario that failed half way leaves its two hosts' controllers.
    for n in $RESV_NQN $RESV_CTL_NQN; do
        for c in $(ctrls_of "$n"); do disconnect_ctrl "$c"; done
    done
}

# write_pattern DEV OFFSET_MIB LEN_MIB SRC_OFFSET_MIB: random data, O_DIRECT.
write_pattern() {
    dd if="$WORK/random" of="$1" bs=1M skip="$4" seek="$2" count="$3" \
        oflag=direct conv=notrunc status=none
}
# sha_pattern LEN_MIB SRC_OFFSET_MIB / sha_dev DEV OFFSET_MIB LEN_MIB
sha_pattern() { dd if="$WORK/random" bs=1M skip="$2" count="$1" status=none | sha256sum | cut -d' ' -f1; }
sha_dev() { timeout 120 dd if="$1" bs=1M skip="$2" count="$3" iflag=direct status=none | sha256sum | cut -d' ' -f1; }
sha_zero() { dd if=/dev/zero bs=1M count="$1" status=none | sha256sum | cut -d' ' -f1; }

# check_pattern DEV OFF LEN SRC what
check_pattern() {
    local want got
    want=$(sha_pattern "$3" "$4")
    got=$(sha_dev "$1" "$2" "$3")
    [ "$want" = "$got" ] || { fail "$5: ${3} MiB at ${2} MiB read back with sha256 $got, wrote $want"; return 1; }
}

# run_fio DEV BS OFFSET_MIB SIZE_MIB_PER_JOB: 2 jobs (second at +32 MiB), iodepth 32,
# random writes then read-verify of every block with crc32c.
run_fio() {
    local dev=$1 bs=$2 off=$3 size=$4 out=$WORK/fio-$2.json rc
    timeout 300 fio --name="verify-$bs" --filename="$dev" --direct=1 --ioengine=libaio \
        --rw=randwrite --bs="$bs" --iodepth=32 --numjobs=2 --size="${size}M" \
        --offset="${off}M" --offset_increment=32M --verify=crc32c --do_verify=1 \
        --verify_fatal=1 --group_reporting --output-format=json --output="$out.raw" \
        > "$WORK/fio-$bs.stderr" 2>&1
    rc=$?
    sed -n '/^{/,$p' "$out.raw" > "$out"
    local err wbytes rbytes want=$((2 * size * MiB))
    err=$(jq -r '.jobs[0].error' "$out" 2>/dev/null)
    wbytes=$(jq -r '.jobs[0].write.io_bytes' "$out" 2>/dev/null)
    rbytes=$(jq -r '.jobs[0].read.io_bytes' "$out" 2>/dev/null)
    if [ $rc != 0 ] || [ "$err" != 0 ]; then
        fail "fio bs=$bs exited $rc, job error '$err': $(grep -h -m3 -iE 'verify|error|fio:' "$WORK/fio-$bs.stderr" "$out.raw" | tr '\n' ' ')"
        return 1
    fi
    [ "$wbytes" = "$want" ] || { fail "fio bs=$bs wrote $wbytes bytes, expected $want"; return 1; }
    [ "$rbytes" = "$want" ] || { fail "fio bs=$bs verified $rbytes bytes, expected $want"; return 1; }
    echo "#   fio bs=$bs: wrote+verified $((want / MiB)) MiB, write $(jq -r '.jobs[0].write.bw' "$out") KiB/s, read $(jq -r '.jobs[0].read.bw' "$out") KiB/s"
}

# Kernel log lines that mean the transport or the controller went wrong.
klog_errors() {
    klog_since "$1" | grep -iE 'digest|error recovery|Reconnecting|keep.?alive|failed|timeout|I/O error|Call Trace|BUG' \
        | expected_unwritten_errors_out || true
}

# With --volumes, every connect makes the kernel scan the "error" volume for partitions;
# the lines its failed reads log are expected there (klog-filter.sh says which).
# error_volume_disks: the block devices (nvmeXnY) of the attached error volumes.
error_volume_disks() {
    local n d out=
    for n in $VOL_NSIDS; do
        [ "${VOL_UNW[$n]}" = error ] || continue
        for d in /sys/block/nvme*; do
            [ "$(cat "$d/nsid" 2>/dev/null)" = "$n" ] && out="$out $(basename "$d")"
        done
    done
    echo $out
}
expected_unwritten_errors_out() { drop_unwritten_read_errors $(error_volume_disks); }

# ---- discovery --------------------------------------------------------------------

# discover PORT HOSTNQN HOSTID -> $WORK/disc.json
discover() {
    local out rc
    out=$(timeout 60 nvme discover -t "$TRANSPORT" -a "$ADDR" -s "$1" --hostnqn "$2" --hostid "$3" -o json 2>&1)
    rc=$?
    [ $rc = 0 ] || { fail "nvme discover on port $1 failed (rc $rc): $(echo $out)"; return 1; }
    echo "$out" | sed -n '/^{/,$p' > "$WORK/disc.json"
    jq -e '.records' "$WORK/disc.json" > /dev/null 2>&1 \
        || { fail "nvme discover on port $1 printed no records: $(echo $out | head -c 300)"; return 1; }
}

# check_disc_entry PORT_EXPECTED: the log lists $NQN as an NVMe subsystem over TCP/IPv4
# at the advertised address; with PORT_EXPECTED, at that trsvcid. Sets DISC_SVC.
DISC_SVC=
check_disc_entry() {
    local n e
    n=$(jq --arg nqn "$NQN" '[.records[] | select(.subnqn == $nqn)] | length' "$WORK/disc.json")
    [ "$n" -ge 1 ] || { fail "discovery log does not list $NQN: $(jq -c '[.records[] | {subnqn, subtype, trsvcid}]' "$WORK/disc.json")"; return 1; }
    e=$(jq -c --arg nqn "$NQN" '[.records[] | select(.subnqn == $nqn)][0]' "$WORK/disc.json")
    echo "#   entry: $e"
    [ "$(echo "$e" | jq -r .trtype)" = "$TRANSPORT" ] || { fail "trtype is $(echo "$e" | jq -r .trtype), expected $TRANSPORT"; return 1; }
    [ "$(echo "$e" | jq -r .adrfam)" = ipv4 ] || { fail "adrfam is $(echo "$e" | jq -r .adrfam), expected ipv4"; return 1; }
    [ "$(echo "$e" | jq -r .subtype)" = "nvme subsystem" ] || { fail "subtype is '$(echo "$e" | jq -r .subtype)', expected 'nvme subsystem'"; return 1; }
    [ "$(echo "$e" | jq -r .traddr)" = "$ADV_ADDR" ] || { fail "traddr is '$(echo "$e" | jq -r .traddr)', expected $ADV_ADDR"; return 1; }
    DISC_SVC=$(echo "$e" | jq -r .trsvcid)
    case "$DISC_SVC" in ''|*[!0-9]*) fail "trsvcid '$DISC_SVC' is not a port number"; return 1 ;; esac
    if [ -n "${1:-}" ] && [ "$DISC_SVC" != "$1" ]; then
        fail "trsvcid is $DISC_SVC, expected $1"; return 1
    fi
    local g
    g=$(jq -r .genctr "$WORK/disc.json")
    case "$g" in ''|null|*[!0-9]*) fail "genctr '$g' is not a number"; return 1 ;; esac
}

t_discovery_4420() {
    discover "$PORT" "$HOSTNQN" "$HOSTID" || return 1
    check_disc_entry "$PORT"
}

t_discovery_8009() {
    discover "$DISC_PORT" "$HOSTNQN" "$HOSTID" || return 1
    check_disc_entry "$DISC_PORT_SVC" || return 1
    # The entry must lead somewhere: connect to the advertised service (through our
    # own address, as the advertised one may be the target's loopback).
    local out rc c
    out=$(timeout 60 nvme connect $(common_opts) -a "$ADDR" -s "$DISC_SVC" -n "$NQN" -o json 2>&1)
    rc=$?
    [ $rc = 0 ] || { fail "connect to the advertised trsvcid $DISC_SVC failed (rc $rc): $(echo $out)"; return 1; }
    c=$(echo "$out" | jq -r '.device // empty')
    [ "$(ctrl_state "$c")" = live ] || { fail "controller via advertised trsvcid $DISC_SVC is $(ctrl_state "$c")"; return 1; }
    disconnect_ctrl "$c" || { fail "could not disconnect $c"; return 1; }
}

t_discovery_hides_subsystem_from_unknown_host() {
    discover "$PORT" "$INTRUDER_NQN" "$INTRUDER_ID" || return 1
    local n
    n=$(jq --arg nqn "$NQN" '[.records[] | select(.subnqn == $nqn)] | length' "$WORK/disc.json")
    [ "$n" = 0 ] || { fail "discovery log shows $NQN to $INTRUDER_NQN, which may not connect to it"; return 1; }
}

# ---- connect with N I/O queues --------------------------------------------------------

# Connect with N I/O queues, check the controller has N+1 queues (admin + N), then
# write and read back from every CPU so that every queue carries I/O.
connect_queues() {
    local n=$1 qc cpu off
    connect --nr-io-queues="$n" || return 1
    qc=$(cat "/sys/class/nvme/$CTRL/queue_count")
    [ "$qc" = $((n + 1)) ] || { fail "queue_count is $qc with --nr-io-queues=$n, expected $((n + 1)) (admin + $n I/O)"; return 1; }
    for cpu in $(seq 0 $(($(nproc) - 1))); do
        off=$((240 + cpu))
        taskset -c "$cpu" dd if="$WORK/random" of="$DEV" bs=1M skip="$cpu" seek="$off" count=1 \
            oflag=direct conv=notrunc status=none \
            || { fail "write from CPU $cpu failed"; return 1; }
        [ "$(taskset -c "$cpu" dd if="$DEV" bs=1M skip="$off" count=1 iflag=direct status=none | sha256sum | cut -d' ' -f1)" \
            = "$(sha_pattern 1 "$cpu")" ] || { fail "read back from CPU $cpu differs"; return 1; }
    done
    disconnect_ctrl "$CTRL" || { fail "could not disconnect"; return 1; }
}
t_connect_1_io_queue() { connect_queues 1; }
t_connect_2_io_queues() { connect_queues 2; }
t_connect_4_io_queues() { connect_queues 4; }

# ---- identify and log pages ---------------------------------------------------------

t_nvme_list() {
    connect || return 1
    local out e
    out=$(timeout 60 nvme list -o json 2>&1) || { fail "nvme list failed: $(echo $out)"; return 1; }
    e=$(echo "$out" | jq -c --arg d "$DEV" '.Devices[] | select(.DevicePath == $d)' 2>/dev/null)
    [ -n "$e" ] || { fail "nvme list does not show $DEV: $(echo $out | head -c 400)"; return 1; }
    echo "#   $e"
    [ "$(echo "$e" | jq -r .PhysicalSize)" = "$SIZE" ] || { fail "PhysicalSize $(echo "$e" | jq -r .PhysicalSize), expected $SIZE"; return 1; }
    [ "$(echo "$e" | jq -r .SectorSize)" = "$BS" ] || { fail "SectorSize $(echo "$e" | jq -r .SectorSize), expected $BS"; return 1; }
    [ "$(echo "$e" | jq -r .NameSpace)" = 1 ] || { fail "NameSpace $(echo "$e" | jq -r .NameSpace), expected 1"; return 1; }
    [ -n "$(echo "$e" | jq -r '.SerialNumber | gsub(" "; "")')" ] || { fail "empty SerialNumber"; return 1; }
    [ -n "$(echo "$e" | jq -r '.ModelNumber | gsub(" "; "")')" ] || { fail "empty ModelNumber"; return 1; }
}

t_nvme_id_ctrl() {
    connect || return 1
    local j v
    j=$(timeout 60 nvme id-ctrl "/dev/$CTRL" -o json 2>&1) || { fail "nvme id-ctrl failed: $(echo $j)"; return 1; }
    echo "#   $(echo "$j" | jq -c '{sn, mn, fr, cntlid, ver, cntrltype, kas, sqes, cqes, maxcmd, nn, oncs, vwc, sgls, mdts, ioccsz, iorcsz, icdoff}')"
    v=$(echo "$j" | jq -r .subnqn)
    [ "$v" = "$NQN" ] || { fail "subnqn '$v', expected $NQN"; return 1; }
    v=$(echo "$j" | jq -r '.sn | sub(" +$"; "")')
    [ -n "$v" ] || { fail "sn is empty"; return 1; }
    [ -z "$SERIAL" ] || [ "$v" = "$SERIAL" ] || { fail "sn '$v', expected $SERIAL"; return 1; }
    [ "$(cat "/sys/class/nvme/$CTRL/serial" | sed 's/ *$//')" = "$v" ] || { fail "sysfs serial differs from id-ctrl sn"; return 1; }
    v=$(echo "$j" | jq -r '.mn | sub(" +$"; "")')
    [ -n "$v" ] || { fail "mn is empty"; return 1; }
    [ -z "$MODEL" ] || [ "$v" = "$MODEL" ] || { fail "mn '$v', expected $MODEL"; return 1; }
    [ "$(echo "$j" | jq -r .cntrltype)" = 1 ] || { fail "cntrltype $(echo "$j" | jq -r .cntrltype), expected 1 (I/O controller)"; return 1; }
    [ "$(echo "$j" | jq -r '.sqes % 16')" = 6 ] || { fail "sqes $(echo "$j" | jq -r .sqes): required SQ entry size is not 64 bytes"; return 1; }
    [ "$(echo "$j" | jq -r '.cqes % 16')" = 4 ] || { fail "cqes $(echo "$j" | jq -r .cqes): required CQ entry size is not 16 bytes"; return 1; }
    [ "$(echo "$j" | jq -r '.nn >= 1')" = true ] || { fail "nn $(echo "$j" | jq -r .nn) < 1"; return 1; }
    [ "$(echo "$j" | jq -r '.kas > 0')" = true ] || { fail "kas is 0 (no keep-alive support)"; return 1; }
    [ "$(echo "$j" | jq -r .cntlid)" = "$(cat "/sys/class/nvme/$CTRL/cntlid")" ] || { fail "cntlid differs from sysfs"; return 1; }
}

t_nvme_id_ns() {
    connect || return 1
    local j nsze ncap lbads want_lbads
    j=$(timeout 60 nvme id-ns "$DEV" -n 1 -o json 2>&1) || { fail "nvme id-ns failed: $(echo $j)"; return 1; }
    echo "#   $(echo "$j" | jq -c '{nsze, ncap, nuse, nsfeat, nlbaf, flbas, dlfeat, lbafs}')"
    nsze=$(echo "$j" | jq -r .nsze)
    ncap=$(echo "$j" | jq -r .ncap)
    [ "$nsze" = $((SIZE / BS)) ] || { fail "nsze $nsze blocks, expected $((SIZE / BS)) ($SIZE bytes / $BS)"; return 1; }
    [ "$(echo "$j" | jq -r "(.ncap <= .nsze) and (.nuse <= .ncap)")" = true ] \
        || { fail "ncap $ncap / nuse $(echo "$j" | jq -r .nuse) exceed nsze $nsze"; return 1; }
    lbads=$(echo "$j" | jq -r '.lbafs[.flbas % 16].ds')
    want_lbads=$(awk -v b="$BS" 'BEGIN { n = 0; while (b > 1) { b /= 2; n++ } print n }')
    [ "$lbads" = "$want_lbads" ] || { fail "LBA format in use has lbads $lbads, expected $want_lbads ($BS-byte blocks)"; return 1; }
    [ "$(cat "/sys/block/$(basename "$DEV")/queue/logical_block_size")" = "$BS" ] \
        || { fail "kernel logical block size $(cat "/sys/block/$(basename "$DEV")/queue/logical_block_size"), expected $BS"; return 1; }
}

t_nvme_smart_log() {
    connect || return 1
    local j
    j=$(timeout 60 nvme smart-log "/dev/$CTRL" -o json 2>&1) || { fail "nvme smart-log failed: $(echo $j)"; return 1; }
    echo "#   $(echo "$j" | jq -c '{critical_warning, temperature, avail_spare, spare_thresh, percent_used, data_units_read, data_units_written, host_read_commands, host_write_commands, num_err_log_entries}')"
    [ "$(echo "$j" | jq -r .critical_warning)" = 0 ] || { fail "critical_warning is $(echo "$j" | jq -r .critical_warning)"; return 1; }
    [ "$(echo "$j" | jq -r '.percent_used <= 255 and .avail_spare <= 100 and .spare_thresh <= 100')" = true ] \
        || { fail "out-of-range percentages in smart log"; return 1; }
    local f
    for f in data_units_read data_units_written host_read_commands host_write_commands num_err_log_entries; do
        case "$(echo "$j" | jq -r ".$f")" in ''|null|*[!0-9]*) fail "$f is not a number"; return 1 ;; esac
    done
}

t_nvme_error_log() {
    connect || return 1
    local j n bad
    j=$(timeout 60 nvme error-log "/dev/$CTRL" -o json 2>&1) || { fail "nvme error-log failed: $(echo $j)"; return 1; }
    n=$(echo "$j" | jq '.errors | length' 2>/dev/null)
    case "$n" in ''|*[!0-9]*) fail "error-log JSON has no errors array: $(echo $j | head -c 300)"; return 1 ;; esac
    [ "$n" -ge 1 ] || { fail "error-log returned no entries"; return 1; }
    # A used entry (error_count != 0) must carry a non-success status.
    bad=$(echo "$j" | jq '[.errors[] | select(.error_count != 0 and (.status_field / 2 | floor) == 0)] | length')
    [ "$bad" = 0 ] || { fail "$bad error-log entries have an error count but a success status"; return 1; }
    echo "#   $n entries, $(echo "$j" | jq '[.errors[] | select(.error_count != 0)] | length') used"
}

# ---- data path ------------------------------------------------------------------------

t_fio_verify_4k() { connect || return 1; run_fio "$DEV" 4k 0 16; }
t_fio_verify_128k() { connect || return 1; run_fio "$DEV" 128k 0 16; }
t_fio_verify_1m() { connect || return 1; run_fio "$DEV" 1M 0 16; }

t_dd_sha256() {
    connect || return 1
    write_pattern "$DEV" 64 16 0 || { fail "dd write failed"; return 1; }
    check_pattern "$DEV" 64 16 0 "dd" || return 1
    # Unaligned-to-MiB buffered read through the page cache too.
    echo 3 > /proc/sys/vm/drop_caches
    local want got
    want=$(dd if="$WORK/random" bs=4k skip=3 count=1000 status=none | sha256sum | cut -d' ' -f1)
    got=$(dd if="$DEV" bs=4k skip=$((64 * 256 + 3)) count=1000 status=none | sha256sum | cut -d' ' -f1)
    [ "$want" = "$got" ] || { fail "buffered 4k read at block offset 3 differs"; return 1; }
}

# sync on the device issues a Flush; the path device's flush counter (field 16 of
# /sys/block/<dev>/stat) proves it reached the controller.
flush_count() { awk '{print $16}' "/sys/block/$1/stat"; }
t_flush() {
    connect || return 1
    local head path wc before after
    head=$(basename "$DEV")
    wc=$(cat "/sys/block/$head/queue/write_cache")
    [ "$wc" = "write back" ] || { fail "write_cache is '$wc': the controller reports no volatile write cache, so the host never sends Flush"; return 1; }
    # The path device (nvmeYcXnZ, blk-mq, counts flushes) under this controller.
    path=
    for p in /sys/class/nvme/"$CTRL"/nvme*c*n*; do
        [ "$(cat "$p/nsid" 2>/dev/null)" = 1 ] && path=$(basename "$p")
    done
    [ -n "$path" ] || { fail "no path device for NSID 1 under $CTRL"; return 1; }
    before=$(flush_count "$path")
    dd if="$WORK/random" of="$DEV" bs=1M seek=192 count=4 conv=notrunc status=none || { fail "buffered write failed"; return 1; }
    timeout 60 sync "$DEV" || { fail "sync $DEV failed"; return 1; }
    after=$(flush_count "$path")
    [ "$after" -gt "$before" ] || { fail "sync sent no Flush: flush count on $path stayed $before"; return 1; }
    local out
    out=$(timeout 60 nvme flush "$DEV" -n 1 2>&1) || { fail "nvme flush failed: $(echo $out)"; return 1; }
    check_pattern "$DEV" 192 4 0 "after flush" || return 1
    echo "#   flushes on $path: $before -> $after, then nvme flush: $(echo $out)"
}

t_blkdiscard() {
    connect || return 1
    local dmax
    dmax=$(cat "/sys/block/$(basename "$DEV")/queue/discard_max_bytes")
    [ "$dmax" -gt 0 ] || { fail "discard_max_bytes is 0: the controller does not support Dataset Management (deallocate)"; return 1; }
    write_pattern "$DEV" 160 8 8 || { fail "write failed"; return 1; }
    check_pattern "$DEV" 160 8 8 "before discard" || return 1
    local out
    out=$(timeout 60 blkdiscard -o $((160 * MiB)) -l $((8 * MiB)) "$DEV" 2>&1) || { fail "blkdiscard failed: $(echo $out)"; return 1; }
    [ "$(sha_dev "$DEV" 160 8)" = "$(sha_zero 8)" ] || { fail "discarded 8 MiB at 160 MiB do not read as zeros"; return 1; }
}

t_blkdiscard_zeroout() {
    connect || return 1
    echo "#   write_zeroes_max_bytes $(cat "/sys/block/$(basename "$DEV")/queue/write_zeroes_max_bytes") (0 = kernel writes zero pages itself)"
    write_pattern "$DEV" 176 8 4 || { fail "write failed"; return 1; }
    check_pattern "$DEV" 176 8 4 "before zeroout" || return 1
    local out
    out=$(timeout 60 blkdiscard -z -o $((176 * MiB)) -l $((8 * MiB)) "$DEV" 2>&1) || { fail "blkdiscard -z failed: $(echo $out)"; return 1; }
    [ "$(sha_dev "$DEV" 176 8)" = "$(sha_zero 8)" ] || { fail "zeroed 8 MiB at 176 MiB do not read as zeros"; return 1; }
}

t_digests() {
    connect --hdr-digest --data-digest || return 1
    run_fio "$DEV" 4k 200 4 || return 1
    run_fio "$DEV" 128k 200 8 || return 1
    write_pattern "$DEV" 216 8 2 || { fail "dd write failed"; return 1; }
    check_pattern "$DEV" 216 8 2 "digest dd" || return 1
    local e
    e=$(klog_errors digests)
    [ -z "$e" ] || { fail "kernel logged transport errors: $(echo "$e" | head -3 | tr '\n' ' ')"; return 1; }
}

t_keep_alive_idle() {
    connect --keep-alive-tmo=5 || return 1
    local kato cntlid
    kato=$(cat "/sys/class/nvme/$CTRL/kato")
    [ "$kato" = 5 ] || { fail "kato is $kato, expected 5"; return 1; }
    cntlid=$(cat "/sys/class/nvme/$CTRL/cntlid")
    write_pattern "$DEV" 248 2 6 || { fail "write failed"; return 1; }
    sleep 12
    [ "$(ctrl_state "$CTRL")" = live ] || { fail "controller is $(ctrl_state "$CTRL") after 12s idle"; return 1; }
    [ "$(cat "/sys/class/nvme/$CTRL/cntlid")" = "$cntlid" ] || { fail "cntlid changed $cntlid -> $(cat "/sys/class/nvme/$CTRL/cntlid"): the host reconnected"; return 1; }
    local e
    e=$(klog_errors keep-alive-idle)
    [ -z "$e" ] || { fail "kernel logged: $(echo "$e" | head -3 | tr '\n' ' ')"; return 1; }
    check_pattern "$DEV" 248 2 6 "after idle" || return 1
    write_pattern "$DEV" 250 2 8 || { fail "write after idle failed"; return 1; }
    check_pattern "$DEV" 250 2 8 "write after idle" || return 1
}

t_disconnect_reconnect() {
    connect || return 1
    write_pattern "$DEV" 96 8 3 || { fail "write failed"; return 1; }
    timeout 60 nvme flush "$DEV" -n 1 > /dev/null 2>&1 || { fail "flush before disconnect failed"; return 1; }
    local old=$CTRL
    disconnect_ctrl "$CTRL" || { fail "$old still present after nvme disconnect"; return 1; }
    [ -z "$(ctrls_of "$NQN")" ] || { fail "controllers left after disconnect: $(ctrls_of "$NQN")"; return 1; }
    connect || return 1
    check_pattern "$DEV" 96 8 3 "after reconnect" || return 1
}

# --- target restart -------------------------------------------------------------------

# Handshake with the host orchestrator over the share (mode "share"):
#   guest: restart-request   host: stops the target, writes restart-stopped
#   guest: restart-resume    host: starts the target, writes restart-done
wait_file() { # FILE SECONDS
    local i
    for i in $(seq 1 $(($2 * 5))); do [ -e "$1" ] && return 0; sleep 0.2; done
    return 1
}
NVMET_LINKS=
# restart_stop [SIGNAL [TARGET_NQN]]: the host's own restart signal, or KILL (a crash)
# when asked; the request names the target by an NQN it serves (default --nqn).
restart_stop() {
    case "$RESTART" in
        share)
            rm -f "$SHARE"/restart-stopped "$SHARE"/restart-resume "$SHARE"/restart-done
            echo "${2:-$NQN}${1:+ $1}" > "$SHARE/restart-request.tmp" && mv "$SHARE/restart-request.tmp" "$SHARE/restart-request"
            wait_file "$SHARE/restart-stopped" 60 || { fail "host orchestrator did not stop the target within 60s"; return 1; }
            ;;
        nvmet)
            local cfs=/sys/kernel/config/nvmet l
            NVMET_LINKS=$(ls -d "$cfs"/ports/*/subsystems/"$NQN" 2>/dev/null)
            [ -n "$NVMET_LINKS" ] || { fail "no nvmet port links to $NQN"; return 1; }
            for l in $NVMET_LINKS; do rm "$l" || { fail "cannot unlink $l"; return 1; }; done
            ;;
        *) fail "unknown restart mode $RESTART"; return 1 ;;
    esac
}
restart_start() {
    case "$RESTART" in
        share)
            echo resume > "$SHARE/restart-resume"
            wait_file "$SHARE/restart-done" 60 || { fail "host orchestrator did not restart the target within 60s"; return 1; }
            cat "$SHARE/restart-done"
            ;;
        nvmet)
            local l
            for l in $NVMET_LINKS; do
                ln -s "/sys/kernel/config/nvmet/subsystems/$NQN" "$l" || { fail "cannot relink $l"; return 1; }
            done
            ;;
    esac
}

# Live changes through the host orchestrator (mode "share"):
#   guest: rpc-request (kvtarget rpc arguments)   host: rpc-response (status, output)
rpc_call() { # ARGS...: runs `kvtarget rpc ARGS` on the host; RPC_OUT holds the output
    rm -f "$SHARE/rpc-response"
    # Written aside and renamed: over 9p the host can see a file created by
    # `>` before its contents, and read an empty request (a CI run did).
    echo "$*" > "$SHARE/rpc-request.tmp" && mv "$SHARE/rpc-request.tmp" "$SHARE/rpc-request"
    wait_file "$SHARE/rpc-response" 30 || { fail "host orchestrator did not answer rpc $1 within 30s"; return 1; }
    local st
    st=$(head -n 1 "$SHARE/rpc-response")
    RPC_OUT=$(tail -n +2 "$SHARE/rpc-response")
    [ "$st" = 0 ] || { fail "rpc $1 failed ($st): $(echo $RPC_OUT)"; return 1; }
}

t_target_restart() {
    connect --reconnect-delay=1 --ctrl-loss-tmo=60 || return 1
    local ctrl=$CTRL dev=$DEV i st bgpid bgrc t0
    [ "$(cat "/sys/class/nvme/$ctrl/reconnect_delay")" = 1 ] && [ "$(cat "/sys/class/nvme/$ctrl/ctrl_loss_tmo")" = 60 ] \
        || { fail "reconnect_delay/ctrl_loss_tmo are $(cat "/sys/class/nvme/$ctrl/reconnect_delay")/$(cat "/sys/class/nvme/$ctrl/ctrl_loss_tmo"), expected 1/60"; return 1; }
    write_pattern "$dev" 112 8 5 || { fail "write before restart failed"; return 1; }
    timeout 60 nvme flush "$dev" -n 1 > /dev/null 2>&1 || { fail "flush before restart failed"; return 1; }
    t0=$(now)
    restart_stop || return 1
    # The host notices the loss (TCP close or keep-alive) and starts reconnecting.
    for i in $(seq 1 150); do
        st=$(ctrl_state "$ctrl")
        [ "$st" != live ] && break
        sleep 0.2
    done
    [ "$st" != live ] || { restart_start; fail "host still reports $ctrl live 30s after the target stopped"; return 1; }
    echo "#   $(awk -v a="$t0" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}')s after the stop request the controller is '$st'"
    # I/O submitted while no path is live is queued by the multipath head and must
    # complete once the host has reconnected.
    dd if="$WORK/random" of="$dev" bs=1M skip=9 seek=128 count=4 oflag=direct conv=notrunc status=none &
    bgpid=$!
    sleep 2
    restart_start || { kill $bgpid 2>/dev/null; return 1; }
    for i in $(seq 1 300); do
        st=$(ctrl_state "$ctrl")
        [ "$st" = live ] && break
        sleep 0.2
    done
    [ "$st" = live ] || { fail "controller $ctrl is '$st' 60s after the target came back (expected live)"; return 1; }
    echo "#   live again $(awk -v a="$t0" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}')s after the stop request"
    for i in $(seq 1 300); do kill -0 $bgpid 2>/dev/null || break; sleep 0.2; done
    if kill -0 $bgpid 2>/dev/null; then
        fail "write queued during the outage still pending 60s after reconnect"; return 1
    fi
    wait $bgpid; bgrc=$?
    [ $bgrc = 0 ] || { fail "write queued during the outage failed (dd rc $bgrc)"; return 1; }
    check_pattern "$dev" 112 8 5 "data written before the restart" || return 1
    check_pattern "$dev" 128 4 9 "data written during the outage" || return 1
    write_pattern "$dev" 132 4 1 || { fail "write after restart failed"; return 1; }
    check_pattern "$dev" 132 4 1 "write after restart" || return 1
}

# refused_connect HOSTNQN WHAT SCENARIO PATTERN: `nvme connect` as HOSTNQN must fail
# without hanging and leave no controller of NQN behind; the kernel's log line for
# it (matching PATTERN, since the scenario's marker) goes to REFUSAL_LOG.
refused_connect() {
    local host=$1 what=$2 scenario=$3 pattern=$4 port=${5:-$PORT} before out rc
    before=$(ctrls_of "$NQN" | wc -l)
    out=$(timeout 60 nvme connect -t "$TRANSPORT" -a "$ADDR" -s "$port" -n "$NQN" \
        --hostnqn "$host" --hostid "$INTRUDER_ID" -o json 2>&1)
    rc=$?
    if [ $rc = 0 ]; then
        disconnect_all
        fail "connect as $host ($what) succeeded: $(echo $out)"; return 1
    fi
    [ $rc != 124 ] || { fail "nvme connect as $host hung (60 s)"; return 1; }
    [ "$(ctrls_of "$NQN" | wc -l)" = "$before" ] || { fail "a controller for $NQN appeared"; return 1; }
    REFUSAL_LOG=$(klog_since "$scenario" | grep -E "$pattern" | head -1)
    [ -n "$REFUSAL_LOG" ] || { fail "connect failed but the kernel logged nothing matching '$pattern': $(klog_since "$scenario" | tail -3 | tr '\n' ' ')"; return 1; }
    echo "#   $(echo "$REFUSAL_LOG" | sed 's/^\[[^]]*\] //')"
}

t_unknown_host_refused() {
    refused_connect "$INTRUDER_NQN" "not on the host list" unknown-host-refused \
        'is not allowed|Connect Invalid|Connect command failed' || return 1
    # The refusal must be the target's answer to Connect (an NVMe status), not a dropped
    # connection: the host logs which.
    case "$REFUSAL_LOG" in
        *"errno:"*) fail "Connect failed without an NVMe status: $REFUSAL_LOG"; return 1 ;;
    esac
}

# The subsystem lists AUTH_HOSTNQN with a DH-HMAC-CHAP key. Linux 6.1 built without
# CONFIG_NVME_AUTH cannot authenticate: Connect succeeds with AUTHREQ.ATR set, the
# host gives up ("authentication setup failed") and tears the admin queue down, so
# no controller appears and nothing hangs. The host without a key still connects.
t_auth_required_refused() {
    refused_connect "$AUTH_HOSTNQN" "a host that must authenticate, without a key" auth-required-refused \
        'authentication setup failed|authentication failed|AUTH' || return 1
    # The host without a key on the same subsystem is unaffected.
    connect || return 1
    write_pattern "$DEV" 96 1 3 || { fail "write as $HOSTNQN after the refusal failed"; return 1; }
    check_pattern "$DEV" 96 1 3 "data written after the refusal" || return 1
}

# The target listens on TLS_PORT with TLS 1.3 required (secure_channel). Linux 6.1
# built without CONFIG_NVME_TCP_TLS sends its ICReq in the clear there: the target
# closes the connection, the host's connect fails without hanging and leaves no
# controller, and the plaintext port still serves the same host.
t_tls_required_refused() {
    refused_connect "$HOSTNQN" "plaintext to a TLS-only listener" tls-required-refused \
        'icresp|bad type|failed to connect|Connection reset|error -104' "$TLS_PORT" || return 1
    connect || return 1
    write_pattern "$DEV" 97 1 4 || { fail "write over the plaintext port after the refusal failed"; return 1; }
    check_pattern "$DEV" 97 1 4 "data written after the refusal" || return 1
}

# ---- thin-provisioned volumes (kvtarget, --volumes) ------------------------------------

# Identify Namespace of NSID $1 through the controller $CTRL, as JSON.
id_ns_json() { timeout 60 nvme id-ns "/dev/$CTRL" -n "$1" -o json 2>&1; }
nuse_of() { id_ns_json "$1" | jq -r .nuse 2>/dev/null; }
# wait_nuse NSID WANT -> NUSE: NUSE of NSID once it equals WANT (polled up to 3 s, the
# time it took is printed when it was not immediate); returns 1 if it never does.
NUSE=
wait_nuse() {
    local i
    for i in $(seq 0 15); do
        NUSE=$(nuse_of "$1")
        if [ "$NUSE" = "$2" ]; then
            [ "$i" = 0 ] || echo "#   nsid $1: nuse reached $2 after ~$((i * 200)) ms"
            return 0
        fi
        sleep 0.2
    done
    return 1
}
# Identifiers as lowercase hex without dashes.
norm_id() { echo "$1" | tr -d ' \n-' | tr 'A-F' 'a-f'; }
# ns_ids NSID -> IDS "nguid uuid" from the Namespace Identification Descriptor list.
IDS=
ns_ids() {
    local j
    IDS=
    j=$(timeout 60 nvme ns-descs "/dev/$CTRL" -n "$1" -o json 2>&1) || { fail "nvme ns-descs -n $1 failed: $(echo $j)"; return 1; }
    # nvme-cli 2.3: {"ns-descs": [{"type": "nguid", "nguid": "..."}, {"type": "uuid", ...}]}
    IDS="$(norm_id "$(echo "$j" | jq -r '.["ns-descs"][]? | select(.type == "nguid") | .nguid' 2>/dev/null)")"
    IDS="$IDS $(norm_id "$(echo "$j" | jq -r '.["ns-descs"][]? | select(.type == "uuid") | .uuid' 2>/dev/null)")"
    echo "#   nsid $1 descriptors: nguid/uuid $IDS ($(echo "$j" | jq -c '[.["ns-descs"][]? | .type]' 2>/dev/null))"
}
# 64 KiB-granular helpers: sha_dev_k DEV OFF_KIB LEN_KIB, sha_pattern_k LEN_KIB
# SRC_OFF_KIB, sha_zero_k LEN_KIB.
sha_dev_k() { timeout 120 dd if="$1" bs=64K skip=$(($2 / 64)) count=$(($3 / 64)) iflag=direct status=none | sha256sum | cut -d' ' -f1; }
sha_pattern_k() { dd if="$WORK/random" bs=64K skip=$(($2 / 64)) count=$(($1 / 64)) status=none | sha256sum | cut -d' ' -f1; }
sha_zero_k() { dd if=/dev/zero bs=64K count=$(($1 / 64)) status=none | sha256sum | cut -d' ' -f1; }
# expect_k DEV OFF_KIB LEN_KIB SRC_OFF_KIB|zero WHAT
expect_k() {
    local want got
    if [ "$4" = zero ]; then want=$(sha_zero_k "$3"); else want=$(sha_pattern_k "$3" "$4"); fi
    got=$(sha_dev_k "$1" "$2" "$3")
    [ "$want" = "$got" ] || { fail "$5: ${3} KiB at ${2} KiB read back with sha256 $got, expected $([ "$4" = zero ] && echo zeros || echo "the pattern written") ($want)"; return 1; }
}

# The controller exposes exactly the configured namespaces, each with its size and
# block size (kernel and Identify Namespace), the thin-provisioning bits, and its own
# NGUID and UUID (descriptor list, Identify Namespace, sysfs).
t_several_namespaces() {
    connect || return 1
    local out got want n d j nsze lbads want_lbads nsfeat dlfeat nguid uuid idns_nguid f v
    local seen_nguid= seen_uuid=
    out=$(timeout 60 nvme list-ns "/dev/$CTRL" 2>&1) || { fail "nvme list-ns failed: $(echo $out)"; return 1; }
    got=$(echo "$out" | sed -n 's/^\[ *[0-9]*\]: *\(0x[0-9a-fA-F]*\) *$/\1/p' | while read -r x; do printf '%d ' "$x"; done)
    want=$(printf '%s\n' $VOL_NSIDS | sort -n | tr '\n' ' ')
    echo "#   active namespaces: $got"
    [ "$got" = "$want" ] || { fail "nvme list-ns shows NSIDs '$got', expected '$want': $(echo $out)"; return 1; }
    for n in $VOL_NSIDS; do
        ns_dev "$CTRL" "$n" || return 1
        d=$(basename "$NSDEV")
        v=$(( $(cat "/sys/block/$d/size") * 512 ))
        [ "$v" = $((VOL_MIB[$n] * MiB)) ] || { fail "nsid $n ($d): kernel size $v bytes, expected ${VOL_MIB[$n]} MiB"; return 1; }
        v=$(cat "/sys/block/$d/queue/logical_block_size")
        [ "$v" = "${VOL_BS[$n]}" ] || { fail "nsid $n ($d): logical block size $v, expected ${VOL_BS[$n]}"; return 1; }
        j=$(id_ns_json "$n") || { fail "nvme id-ns -n $n failed: $(echo $j)"; return 1; }
        nsze=$(echo "$j" | jq -r .nsze) nsfeat=$(echo "$j" | jq -r .nsfeat) dlfeat=$(echo "$j" | jq -r .dlfeat)
        echo "#   nsid $n = $d ($(echo "$j" | jq -c '{nsze, ncap, nuse, nsfeat, dlfeat, flbas, nguid, eui64}'))"
        [ "$nsze" = $((VOL_MIB[$n] * MiB / VOL_BS[$n])) ] || { fail "nsid $n: nsze $nsze, expected $((VOL_MIB[$n] * MiB / VOL_BS[$n]))"; return 1; }
        lbads=$(echo "$j" | jq -r '.lbafs[.flbas % 16].ds')
        want_lbads=$(awk -v b="${VOL_BS[$n]}" 'BEGIN { n = 0; while (b > 1) { b /= 2; n++ } print n }')
        [ "$lbads" = "$want_lbads" ] || { fail "nsid $n: LBA format in use has lbads $lbads, expected $want_lbads"; return 1; }
        [ $((nsfeat & 1)) = 1 ] || { fail "nsid $n: nsfeat $nsfeat lacks bit 0 (thin provisioning, NUSE meaningful)"; return 1; }
        if [ "${VOL_UNW[$n]}" = error ]; then
            [ $((nsfeat & 4)) = 4 ] || { fail "nsid $n (unwritten = error): nsfeat $nsfeat lacks bit 2 (DAE)"; return 1; }
            [ $((dlfeat & 7)) = 0 ] || { fail "nsid $n (unwritten = error): dlfeat $dlfeat promises a read value for deallocated blocks"; return 1; }
        else
            [ $((nsfeat & 4)) = 0 ] || { fail "nsid $n (unwritten = zeroes): nsfeat $nsfeat sets bit 2 (DAE)"; return 1; }
            [ "$dlfeat" = 9 ] || { fail "nsid $n (unwritten = zeroes): dlfeat $dlfeat, expected 9 (deallocated reads zeros, Write Zeroes may deallocate)"; return 1; }
        fi
        ns_ids "$n" || return 1
        read -r nguid uuid <<< "$IDS"
        case "$nguid" in ''|*[!0-9a-f]*|00000000000000000000000000000000) fail "nsid $n: NGUID descriptor '$nguid' missing or zero"; return 1 ;; esac
        case "$uuid" in ''|*[!0-9a-f]*|00000000000000000000000000000000) fail "nsid $n: UUID descriptor '$uuid' missing or zero"; return 1 ;; esac
        [ ${#nguid} = 32 ] && [ ${#uuid} = 32 ] || { fail "nsid $n: NGUID '$nguid' / UUID '$uuid' are not 16 bytes"; return 1; }
        idns_nguid=$(norm_id "$(echo "$j" | jq -r '.nguid // empty')")
        [ "$idns_nguid" = "$nguid" ] || { fail "nsid $n: Identify Namespace NGUID $idns_nguid differs from the descriptor's $nguid"; return 1; }
        for f in nguid uuid; do
            [ -r "/sys/block/$d/$f" ] || { echo "#   (no sysfs $f for $d)"; continue; }
            v=$(norm_id "$(cat "/sys/block/$d/$f")")
            if [ $f = nguid ]; then want=$nguid; else want=$uuid; fi
            [ "$v" = "$want" ] || { fail "nsid $n: kernel $f $v differs from the descriptor's $want"; return 1; }
        done
        case " $seen_nguid " in *" $nguid "*) fail "nsid $n: NGUID $nguid is also another namespace's"; return 1 ;; esac
        case " $seen_uuid " in *" $uuid "*) fail "nsid $n: UUID $uuid is also another namespace's"; return 1 ;; esac
        seen_nguid="$seen_nguid $nguid" seen_uuid="$seen_uuid $uuid"
    done
}

# NUSE counts written blocks: 0 on the fresh zeroes volume (reads allocate nothing),
# +8 MiB after a write, down by exactly the deallocated blocks after blkdiscard of a
# range that frees three whole 1 MiB extents and half of a fourth; data outside the
# range is intact and the range reads as zeros.
t_nuse_tracks_writes_and_discard() {
    local ns=$VOL_ZNS bs=${VOL_BS[$VOL_ZNS]} dev per_mib want out
    connect || return 1
    ns_dev "$CTRL" "$ns" || return 1
    dev=$NSDEV per_mib=$((MiB / bs))
    NUSE=$(nuse_of "$ns")
    [ "$NUSE" = 0 ] || { fail "nsid $ns: nuse $NUSE before anything was written, expected 0"; return 1; }
    [ "$(sha_dev "$dev" 0 8)" = "$(sha_zero 8)" ] || { fail "nsid $ns: never-written 8 MiB do not read as zeros"; return 1; }
    NUSE=$(nuse_of "$ns")
    [ "$NUSE" = 0 ] || { fail "nsid $ns: nuse $NUSE after only reading, expected 0 (reads must not allocate)"; return 1; }
    write_pattern "$dev" 0 8 0 || { fail "nsid $ns: write of 8 MiB failed"; return 1; }
    wait_nuse "$ns" $((8 * per_mib)) || { fail "nsid $ns: nuse $NUSE after writing 8 MiB, expected $((8 * per_mib))"; return 1; }
    echo "#   nuse after writing 8 MiB: $NUSE"
    [ "$(cat "/sys/block/$(basename "$dev")/queue/discard_max_bytes")" -gt 0 ] || { fail "nsid $ns: discard_max_bytes is 0"; return 1; }
    # 2048 KiB .. 5632 KiB: 3.5 MiB.
    out=$(timeout 60 blkdiscard -o $((2048 * 1024)) -l $((3584 * 1024)) "$dev" 2>&1) || { fail "blkdiscard failed: $(echo $out)"; return 1; }
    want=$((8 * per_mib - 3584 * 1024 / bs))
    wait_nuse "$ns" "$want" || { fail "nsid $ns: nuse $NUSE after deallocating 3.5 MiB of 8, expected $want"; return 1; }
    echo "#   nuse after blkdiscard of 3.5 MiB: $NUSE"
    expect_k "$dev" 0 2048 0 "before the discarded range" || return 1
    expect_k "$dev" 2048 3584 zero "discarded range" || return 1
    expect_k "$dev" 5632 2560 5632 "after the discarded range" || return 1
}

# Reads of never-written or deallocated blocks of an "error" volume fail with
# Deallocated or Unwritten Logical Block (SCT 2h, SC 87h); written blocks read back.
t_unwritten_error_volume() {
    local ns=$VOL_ENS bs=${VOL_BS[$VOL_ENS]} dev out rc lba log want
    connect || return 1
    ns_dev "$CTRL" "$ns" || return 1
    dev=$NSDEV
    [ "$(cat "/sys/block/$(basename "$dev")/queue/logical_block_size")" = "$bs" ] \
        || { fail "nsid $ns: logical block size $(cat "/sys/block/$(basename "$dev")/queue/logical_block_size"), expected $bs"; return 1; }
    NUSE=$(nuse_of "$ns")
    [ "$NUSE" = 0 ] || { fail "nsid $ns: nuse $NUSE before anything was written, expected 0"; return 1; }
    # The partition scan at connect already failed reads of LBA 0 and the kernel rate
    # limits its error lines (10 per 5 s): let the window pass.
    sleep 6
    lba=$((32 * MiB / bs))
    out=$(timeout 60 dd if="$dev" of=/dev/null bs=4k skip=$((32 * 256)) count=1 iflag=direct 2>&1); rc=$?
    echo "#   direct read of never-written 4 KiB at 32 MiB: rc $rc: $(echo $out)"
    [ $rc != 0 ] || { fail "nsid $ns: direct read of never-written blocks at 32 MiB succeeded"; return 1; }
    sleep 0.5
    log=$(klog_since unwritten-error-volume | grep -E "@ LBA $lba, .*sct 0x2 / sc 0x87" | tail -1)
    [ -n "$log" ] || { fail "the kernel logged no SCT 2h / SC 87h status for the failed read at LBA $lba: $(klog_since unwritten-error-volume | grep -E 'LBA|error' | tail -3 | tr '\n' ' ')"; return 1; }
    echo "#   kernel: $(echo "$log" | sed 's/^\[[^]]*\] //')"
    if timeout 10 nvme help 2>&1 | grep -qE '^ *read '; then
        out=$(timeout 60 nvme read "$dev" --start-block=$((33 * MiB / bs)) --block-count=$((4096 / bs - 1)) \
            --data-size=4096 --data="$WORK/nvme-read.bin" 2>&1); rc=$?
        echo "#   nvme read of never-written LBA $((33 * MiB / bs)): rc $rc: $(echo $out)"
        [ $rc != 0 ] || { fail "nvme read of never-written blocks succeeded"; return 1; }
        echo "$out" | grep -qi 'unwritten' || { fail "nvme read did not report Deallocated or Unwritten Logical Block: $(echo $out)"; return 1; }
    else
        echo "#   (nvme-cli has no read command: status name not checked)"
    fi
    write_pattern "$dev" 32 1 3 || { fail "nsid $ns: write of 1 MiB at 32 MiB failed"; return 1; }
    check_pattern "$dev" 32 1 3 "nsid $ns written MiB" || return 1
    wait_nuse "$ns" $((MiB / bs)) || { fail "nsid $ns: nuse $NUSE after writing 1 MiB, expected $((MiB / bs))"; return 1; }
    # A read that ends one block into unwritten space fails as a whole.
    out=$(timeout 60 dd if="$dev" of=/dev/null bs=4k skip=$((33 * 256 - 1)) count=2 iflag=direct 2>&1) \
        && { fail "nsid $ns: direct read across the end of the written MiB into unwritten blocks succeeded"; return 1; }
    # Deallocate 64 KiB inside the written MiB: that range fails again, the rest reads back.
    # --force: without it blkdiscard first probes the device for signatures, and that
    # read of unwritten blocks fails.
    out=$(timeout 60 blkdiscard --force -o $((32 * MiB + 512 * 1024)) -l 65536 "$dev" 2>&1) || { fail "blkdiscard failed: $(echo $out)"; return 1; }
    want=$(((MiB - 65536) / bs))
    wait_nuse "$ns" "$want" || { fail "nsid $ns: nuse $NUSE after deallocating 64 KiB, expected $want"; return 1; }
    out=$(timeout 60 dd if="$dev" of=/dev/null bs=64K skip=$((32 * 16 + 8)) count=1 iflag=direct 2>&1) \
        && { fail "nsid $ns: direct read of the deallocated 64 KiB succeeded"; return 1; }
    expect_k "$dev" $((32 * 1024)) 512 $((3 * 1024)) "nsid $ns before the deallocated 64 KiB" || return 1
    expect_k "$dev" $((32 * 1024 + 576)) 448 $((3 * 1024 + 576)) "nsid $ns after the deallocated 64 KiB" || return 1
}

# Written and deallocated blocks of a volume, NUSE and the identifiers are the same
# after the target is stopped and started (host reconnects by itself).
# A namespace added while the host is connected appears without reconnecting
# (Namespace Attribute Changed AEN, the kernel rescans); removed, it goes away.
t_namespace_hot_add_remove() {
    local ns=9 dev i gone sum1 sum2
    connect || return 1
    rpc_call bdev_lvol_create lvs_name=interop lvol_name=hot size_in_mib=32 thin_provision=true || return 1
    rpc_call nvmf_subsystem_add_ns nqn=$NQN namespace.bdev_name=interop/hot namespace.nsid=$ns || return 1
    ns_dev "$CTRL" "$ns" || return 1
    dev=$NSDEV
    [ "$(cat "/sys/block/${dev#/dev/}/size")" = $((32 * MiB / 512)) ] \
        || { fail "hot-added $dev has $(cat "/sys/block/${dev#/dev/}/size") sectors, expected $((32 * MiB / 512))"; return 1; }
    dd if=/dev/urandom of=/tmp/hot.bin bs=1M count=4 2>/dev/null
    timeout 60 dd if=/tmp/hot.bin of="$dev" bs=1M oflag=direct 2>/dev/null || { fail "write to hot-added $dev failed"; return 1; }
    sum1=$(sha256sum < /tmp/hot.bin | cut -d' ' -f1)
    sum2=$(timeout 60 dd if="$dev" bs=1M count=4 iflag=direct 2>/dev/null | sha256sum | cut -d' ' -f1)
    [ "$sum1" = "$sum2" ] || { fail "hot-added $dev read back different data"; return 1; }
    rpc_call nvmf_subsystem_remove_ns nqn=$NQN nsid=$ns || return 1
    gone=0
    for i in $(seq 1 100); do
        [ -b "$dev" ] || { gone=1; break; }
        sleep 0.1
    done
    [ "$gone" = 1 ] || { fail "$dev still present 10s after the namespace was removed"; return 1; }
    # The other namespaces were not disturbed.
    ns_dev "$CTRL" 1 || return 1
    rpc_call bdev_lvol_delete name=interop/hot || return 1
}

t_volume_data_survives_restart() {
    local ns=$VOL_ZNS bs=${VOL_BS[$VOL_ZNS]} dev ctrl nuse_before nuse_written ids i st t0 out
    connect --reconnect-delay=1 --ctrl-loss-tmo=60 || return 1
    ctrl=$CTRL
    ns_dev "$ctrl" "$ns" || return 1
    dev=$NSDEV
    nuse_before=$(nuse_of "$ns")
    # 8 MiB at 16 MiB, then two whole extents (20-22 MiB) deallocated.
    write_pattern "$dev" 16 8 4 || { fail "nsid $ns: write failed"; return 1; }
    out=$(timeout 60 blkdiscard -o $((20 * MiB)) -l $((2 * MiB)) "$dev" 2>&1) || { fail "blkdiscard failed: $(echo $out)"; return 1; }
    timeout 60 nvme flush "$dev" -n "$ns" > /dev/null 2>&1 || { fail "nsid $ns: flush before restart failed"; return 1; }
    wait_nuse "$ns" $((nuse_before + 6 * MiB / bs)) || { fail "nsid $ns: nuse $NUSE, expected $nuse_before + $((6 * MiB / bs))"; return 1; }
    nuse_written=$NUSE
    ns_ids "$ns" || return 1
    ids=$IDS
    expect_k "$dev" $((16 * 1024)) 4096 $((4 * 1024)) "before restart, 16-20 MiB" || return 1
    expect_k "$dev" $((20 * 1024)) 2048 zero "before restart, deallocated 20-22 MiB" || return 1
    expect_k "$dev" $((22 * 1024)) 2048 $((10 * 1024)) "before restart, 22-24 MiB" || return 1
    t0=$(now)
    restart_stop || return 1
    for i in $(seq 1 150); do
        st=$(ctrl_state "$ctrl")
        [ "$st" != live ] && break
        sleep 0.2
    done
    [ "$st" != live ] || { restart_start; fail "host still reports $ctrl live 30s after the target stopped"; return 1; }
    restart_start || return 1
    for i in $(seq 1 300); do
        st=$(ctrl_state "$ctrl")
        [ "$st" = live ] && break
        sleep 0.2
    done
    [ "$st" = live ] || { fail "controller $ctrl is '$st' 60s after the target came back (expected live)"; return 1; }
    echo "#   live again $(awk -v a="$t0" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}')s after the stop request"
    ns_dev "$ctrl" "$ns" || return 1
    [ "$NSDEV" = "$dev" ] || echo "#   nsid $ns is now $NSDEV (was $dev)"
    dev=$NSDEV
    NUSE=$(nuse_of "$ns")
    [ "$NUSE" = "$nuse_written" ] || { fail "nsid $ns: nuse $NUSE after the restart, $nuse_written before"; return 1; }
    ns_ids "$ns" || return 1
    [ "$IDS" = "$ids" ] || { fail "nsid $ns: NGUID/UUID changed across the restart: '$ids' -> '$IDS'"; return 1; }
    [ ${#IDS} = 65 ] || { fail "nsid $ns: NGUID/UUID descriptors missing: '$IDS'"; return 1; }
    expect_k "$dev" $((16 * 1024)) 4096 $((4 * 1024)) "after restart, 16-20 MiB" || return 1
    expect_k "$dev" $((20 * 1024)) 2048 zero "after restart, deallocated 20-22 MiB" || return 1
    expect_k "$dev" $((22 * 1024)) 2048 $((10 * 1024)) "after restart, 22-24 MiB" || return 1
}

# bench/fio's KV-cache job files (from the share), each run briefly on namespace 1.
# It runs last: the profiles write across the whole namespace.
# One job file through fio with its JSON in $WORK/NAME.json; FIO_BYTES is the least data
# any of its jobs moved in the measured window. Fails on an fio error.
fio_profile() {
    local f=$1 name=$2 out=$WORK/$2.json rc err
    timeout 300 fio --output-format=json --output="$out.raw" "$f" > "$WORK/$name.stderr" 2>&1
    rc=$?
    sed -n '/^{/,$p' "$out.raw" > "$out"
    err=$(jq -r '[.jobs[].error] | max' "$out" 2>/dev/null)
    FIO_BYTES=$(jq -r '[.jobs[] | (.read.io_bytes + .write.io_bytes + .trim.io_bytes)] | min' "$out" 2>/dev/null)
    if [ $rc != 0 ] || [ "$err" != 0 ]; then
        fail "$name.fio exited $rc, job error '$err': $(grep -h -m3 -iE 'verify|error|fio:' "$WORK/$name.stderr" "$out.raw" | tr '\n' ' ')"
        return 1
    fi
    case "$FIO_BYTES" in ''|null|*[!0-9]*) FIO_BYTES=0 ;; esac
}

# bench/fio's job files with short windows: each runs clean and each of its jobs moves
# data. A window of 1 s after the ramp can pass with no completion of a rate-limited
# 1 MiB job when the emulated guest is starved of CPU, so a file whose window saw a job
# idle runs again with a 10 s window before that counts as a failure.
t_bench_fio_profiles() {
    local f name n=0 dir=/mnt/share/fio
    [ -d "$dir" ] || { fail "no job files in $dir"; return 1; }
    connect || return 1
    export KVT_DEV=$DEV KVT_SIZE=16m KVT_WRITE_IOPS=20 KVT_TRIM_IOPS=20
    for f in "$dir"/*.fio; do
        name=$(basename "$f" .fio)
        if [ "$name" = kv-steady ] && [ "$(cat "/sys/block/${DEV#/dev/}/queue/discard_max_bytes")" = 0 ]; then
            echo "#   $name: not run, this target's namespace takes no discards"
            continue
        fi
        KVT_RUNTIME=1 fio_profile "$f" "$name" || return 1
        if [ "$FIO_BYTES" -eq 0 ]; then
            echo "#   $name.fio: a job moved no data in a 1 s window; again with 10 s"
            KVT_RUNTIME=10 fio_profile "$f" "$name" || return 1
        fi
        [ "$FIO_BYTES" -gt 0 ] || { fail "$name.fio: a job moved no data in a 10 s window"; return 1; }
        echo "#   $name.fio: $(jq -r '[.jobs[] | "\(.jobname) r \(.read.iops|floor) w \(.write.iops|floor) trim \(.trim.iops|floor) IOPS"] | join(", ")' "$WORK/$name.json")"
        n=$((n + 1))
    done
    [ $n -ge 6 ] || { fail "only $n job files ran"; return 1; }
}

# ---- LMCache's raw-block backend (issue 19) -------------------------------------------

# lmcache_scenario.py COMMAND ARGS... with the caller's metadata region size ($meta),
# its output indented into the log, a failure reported with its last lines.
lm() {
    local out rc
    out=$(timeout 900 python3 "$SHARE/lmcache_scenario.py" "$@" --meta-mib "$meta" 2>&1); rc=$?
    echo "$out" | sed 's/^/#   /'
    [ $rc = 0 ] || { fail "lmcache $*: $(echo "$out" | grep -v '^#' | tail -n 2 | tr '\n' ' ')(rc $rc)"; return 1; }
}

# Restarts the target ([SIGNAL] as restart_stop takes it) and waits until $CTRL is
# live again, saying how long that took.
restart_until_live() {
    local t0 i
    t0=$(now)
    restart_stop "$@" || return 1
    restart_start || return 1
    for i in $(seq 1 300); do
        [ "$(ctrl_state "$CTRL")" = live ] && break
        sleep 0.2
    done
    [ "$(ctrl_state "$CTRL")" = live ] || { fail "controller $CTRL is '$(ctrl_state "$CTRL")' 60s after the restart"; return 1; }
    echo "#   live again $(awk -v a="$t0" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}')s after the ${1:+SIG$1 }stop request"
}

# LMCache's raw-block layout (metadata region with two alternating index checkpoints,
# then slots of a 4 KiB header + a 32 MiB Llama-8B-shaped chunk) through LMCache's own
# I/O helper (the pinned lmcache_rust_raw_block_io wheel, lmcache_scenario.py): store a
# prefix set with io_uring, retrieve it with posix workers, evict and overwrite slots,
# restart the target, reload the index and every chunk through the block device
# (io_uring, posix; O_DIRECT) and through /dev/ngXnY (NVMe passthrough), store through
# passthrough. On kvtarget the volume is an "error" volume without a volatile write
# cache (VOL_LMC): LMCache never flushes, so every acknowledged chunk must survive a
# SIGKILL too, and a never-written slot or a torn chunk must read as a miss. Elsewhere
# (the nvmet control) NSID 1 with a 16 MiB metadata region.
t_lmcache_raw_block() {
    local ns=1 meta=16 probe= dev ng size slots na keys split
    timeout 60 python3 -c 'import lmcache_rust_raw_block_io' 2>/dev/null \
        || { fail "the guest's python3 cannot import lmcache_rust_raw_block_io (ci/guest/build.sh)"; return 1; }
    if [ -n "$VOL_LMC" ]; then ns=$VOL_LMC meta=128 probe=1; fi
    connect --reconnect-delay=1 --ctrl-loss-tmo=60 || return 1
    ns_dev "$CTRL" "$ns" || return 1
    dev=$NSDEV ng=/dev/ng${NSDEV#/dev/nvme}
    [ -c "$ng" ] || { fail "no generic NVMe char device $ng for $dev"; return 1; }
    size=$(( $(cat "/sys/block/${dev#/dev/}/size") * 512 ))
    slots=$(( (size - meta * MiB) / (32 * MiB + 4096) ))
    # A prefix set of up to 6 chunks; two slots stay free (passthrough store, probe).
    na=$(( slots - 2 < 6 ? slots - 2 : 6 ))
    [ $na -ge 3 ] || { fail "nsid $ns: $size bytes hold only $slots LMCache slots"; return 1; }
    echo "#   nsid $ns ($dev, $ng): $((size / MiB)) MiB, metadata $meta MiB, $slots slots, prefix set of $na chunks"
    lm store --dev "$dev" --engine io_uring --odirect --first 0 --count $na --slot 0 --gen 0 || return 1
    keys=$(seq -s, 0 $((na - 1)))
    lm verify --dev "$dev" --engine posix --odirect --expect-keys "$keys" || return 1
    # Eviction: keys 0 and 1 leave, their slots are overwritten by keys 100 and 101.
    lm store --dev "$dev" --engine posix --odirect --first 100 --count 2 --slot 0 --gen 1 || return 1
    keys=100,101$( [ $na -gt 2 ] && printf ',%s' $(seq 2 $((na - 1))) )
    restart_until_live || return 1
    lm verify --dev "$dev" --engine io_uring --odirect --expect-keys "$keys" || return 1
    # Passthrough commands are not split by the kernel: the scenario splits at the size
    # the block layer splits at (max_sectors_kb: MDTS on kvtarget; nvmet's MDTS is 0,
    # "no limit", yet it fails a 32 MiB passthrough read with Data SGL Length Invalid).
    split=$(cat "/sys/block/${dev#/dev/}/queue/max_sectors_kb")
    lm verify --dev "$ng" --engine io_uring --uring-cmd --split-kib "$split" --expect-keys "$keys" || return 1
    lm store --dev "$ng" --engine io_uring --uring-cmd --split-kib "$split" --first 200 --count 1 --slot $na --gen 2 || return 1
    lm verify --dev "$dev" --engine posix --odirect --expect-keys "$keys,200" || return 1
    if [ -n "$probe" ]; then
        lm probe --dev "$dev" --engine posix --odirect --slot $((slots - 1)) || return 1
    fi
}

# A target crash with the volatile write cache on (VOL_LMCV: an "error" volume with the
# default cache), LMCache's way: no Flush. Three chunks are stored and flushed (the
# only Flush: it stands for the pool's timed commit, which run.sh sets to a minute);
# two of them are overwritten in place, three more go into never-written slots with
# a new checkpoint, and the target is SIGKILLed. After the restart LMCache's recovery
# must find the overwritten chunks and the flushed one intact; the three new ones are
# lost unless the metadata thread happened to commit their extents: each may be
# intact, dropped (its header does not read) or a miss (the torn case: its header
# sits in an extent written before, its payload's tail does not read), but none may
# read back as other data: on an error volume a lost first write is a miss, never
# zeroes. The outcome is printed ("recover: ...") for docs/lmcache.md's account.
t_lmcache_volatile_kill() {
    local ns=$VOL_LMCV meta=128 dev size slots
    connect --reconnect-delay=1 --ctrl-loss-tmo=60 || return 1
    ns_dev "$CTRL" "$ns" || return 1
    dev=$NSDEV
    size=$(( $(cat "/sys/block/${dev#/dev/}/size") * 512 ))
    slots=$(( (size - meta * MiB) / (32 * MiB + 4096) ))
    [ $slots -ge 6 ] || { fail "nsid $ns: $size bytes hold only $slots LMCache slots"; return 1; }
    [ "$(cat "/sys/block/${dev#/dev/}/queue/write_cache")" = "write back" ] \
        || { fail "nsid $ns reports '$(cat "/sys/block/${dev#/dev/}/queue/write_cache")', expected a volatile write cache"; return 1; }
    lm store --dev "$dev" --engine io_uring --odirect --first 0 --count 3 --slot 0 --gen 0 || return 1
    timeout 60 nvme flush "$dev" -n "$ns" > /dev/null 2>&1 || { fail "nvme flush $dev failed"; return 1; }
    lm store --dev "$dev" --engine io_uring --odirect --first 20 --count 2 --slot 0 --gen 1 || return 1
    lm store --dev "$dev" --engine io_uring --odirect --first 10 --count 3 --slot 3 --gen 0 || return 1
    restart_until_live KILL || return 1
    grep -q 'SIGKILL' "$SHARE/restart-done" || { fail "the host did not SIGKILL the target: $(cat "$SHARE/restart-done")"; return 1; }
    lm recover --dev "$dev" --engine io_uring --odirect --must-keys 20,21,2 || return 1
    lm recover --dev "$dev" --engine posix --odirect --must-keys 20,21,2 || return 1
}

# ---- runner --------------------------------------------------------------------------

# ---- a KV namespace (NVMe Key Value command set) --------------------------------------

# kv_cmd DEV OPCODE KEYLEN VALUE_LEN DIR [FILE] -> KV_OUT (nvme-cli's output), KV_RC.
# The 16-byte key is fixed by KV_KEY (four dwords: CDW2, CDW3, CDW14, CDW15, the order
# the KV command set carries key bytes 0-15 in). DIR: w (data from FILE), r (data to
# FILE), - (none).
KV_KEY="0x6b766b31 0x30303030 0x61616161 0x62626262"
kv_cmd() {
    local dev=$1 opc=$2 kl=$3 len=$4 dir=$5 file=${6:-} k2 k3 k14 k15 data=
    read -r k2 k3 k14 k15 <<< "$KV_KEY"
    case "$dir" in
        w) data="--data-len=$len -w -i $file" ;;
        r) data="--data-len=$len -r" ;;
    esac
    # shellcheck disable=SC2086
    if [ "$dir" = r ]; then
        KV_OUT=$(timeout 60 nvme io-passthru "$dev" --opcode="$opc" --namespace-id=2 \
            --cdw2="$k2" --cdw3="$k3" --cdw14="$k14" --cdw15="$k15" --cdw10="$len" --cdw11="$kl" \
            $data --raw-binary 2>"$WORK/kv.err" > "$file")
        KV_RC=$?
        KV_OUT="$KV_OUT $(cat "$WORK/kv.err")"
    else
        KV_OUT=$(timeout 60 nvme io-passthru "$dev" --opcode="$opc" --namespace-id=2 \
            --cdw2="$k2" --cdw3="$k3" --cdw14="$k14" --cdw15="$k15" --cdw10="$len" --cdw11="$kl" \
            $data 2>&1)
        KV_RC=$?
    fi
}

# What the 6.1 host makes of a namespace of a command set it does not drive, and KV
# commands through the passthrough path it leaves open.
t_kv_namespace() {
    local out ctrl nodes d id kml vml dev len=12345
    out=$(timeout 60 nvme connect $(common_opts) -a "$ADDR" -s "$PORT" -n "$KV_NQN" -o json 2>&1) \
        || { fail "nvme connect to $KV_NQN failed: $(echo $out)"; return 1; }
    ctrl=$(echo "$out" | jq -r '.device // empty' 2>/dev/null)
    [ -n "$ctrl" ] || { fail "nvme connect printed no device: $(echo $out)"; return 1; }
    ns_dev "$ctrl" 1 || { disconnect_ctrl "$ctrl"; return 1; }
    sleep 1
    # Both namespaces are active (the host enabled all I/O command sets, CC.CSS = 110b).
    out=$(timeout 60 nvme list-ns "/dev/$ctrl" 2>&1)
    echo "#   list-ns: $(echo $out)"
    echo "$out" | grep -q ': *0x2 *$' || { fail "nvme list-ns does not show NSID 2: $(echo $out)"; disconnect_ctrl "$ctrl"; return 1; }
    # The kernel's view of NSID 2: every node of the subsystem and its nsid.
    nodes=
    for d in /sys/class/nvme-subsystem/*/nvme*n* /sys/class/nvme-generic/ng*; do
        [ -e "$d" ] || continue
        nodes="$nodes $(basename "$d"):$(cat "$d/nsid" 2>/dev/null || cat "$d/device/nsid" 2>/dev/null || echo ?)"
    done
    echo "#   namespace nodes (name:nsid):$nodes"
    echo "#   kernel log: $(klog_since kv-namespace | grep -i -E 'csi|nsid|nvme' | tr '\n' '|')"
    echo "$(cat /sys/class/nvme/$ctrl/cntrltype 2>/dev/null) $(uname -r)" | sed 's/^/#   controller type, kernel: /'
    # The KV Identify Namespace through admin passthrough: KV format 0 (bytes 72-87).
    id=$(timeout 60 nvme admin-passthru "/dev/$ctrl" --opcode=0x06 --namespace-id=2 --cdw10=5 \
        --cdw11=$((1 << 24)) --data-len=4096 -r --raw-binary 2>/dev/null | od -An -tu1 -v -j72 -N16 | tr -s ' \n' ' ')
    read -r kml _ _ _ v0 v1 v2 v3 _ <<< "$id"
    vml=$(( v0 + (v1 << 8) + (v2 << 16) + (v3 << 24) ))
    echo "#   KV format 0: key max $kml bytes, value max $vml bytes"
    [ "$kml" = 16 ] || { fail "KV Identify Namespace reports key length '$kml', expected 16"; disconnect_ctrl "$ctrl"; return 1; }
    # Linux (Debian's 6.1) makes no block device for a namespace of a command set it
    # does not drive ("block device for nsid 2 not supported (csi 1)") but does make
    # its generic char device /dev/ngXnY, which takes passthrough commands.
    dev=
    for d in /sys/class/nvme-subsystem/*/nvme*n*; do
        [ -e "$d/nsid" ] && [ "$(cat "$d/nsid")" = 2 ] || continue
        d=$(basename "$d")
        case "$d" in nvme*c*) continue ;; esac
        [ -b "/dev/$d" ] && { fail "the kernel made a block device /dev/$d for the KV namespace"; disconnect_ctrl "$ctrl"; return 1; }
        [ -c "/dev/ng${d#nvme}" ] && dev=/dev/ng${d#nvme}
    done
    [ -n "$dev" ] || { fail "no generic char device (/dev/ngXnY) for the KV namespace, NSID 2"; disconnect_ctrl "$ctrl"; return 1; }
    klog_since kv-namespace | grep -q "nsid 2 not supported (csi 1)" \
        || echo "#   (the kernel did not log 'block device for nsid 2 not supported (csi 1)')"
    echo "#   KV commands through $dev"
    dd if="$WORK/random" of="$WORK/kv.val" bs=$len count=1 status=none
    kv_cmd "$dev" 0x01 16 $len w "$WORK/kv.val"
    [ $KV_RC = 0 ] || { fail "KV Store through $dev failed (rc $KV_RC): $(echo $KV_OUT)"; disconnect_ctrl "$ctrl"; return 1; }
    kv_cmd "$dev" 0x14 16 0 -
    [ $KV_RC = 0 ] || { fail "KV Exist after Store failed (rc $KV_RC): $(echo $KV_OUT)"; disconnect_ctrl "$ctrl"; return 1; }
    kv_cmd "$dev" 0x02 16 16384 r "$WORK/kv.got"
    [ $KV_RC = 0 ] || { fail "KV Retrieve failed (rc $KV_RC): $(echo $KV_OUT)"; disconnect_ctrl "$ctrl"; return 1; }
    echo "#   Retrieve: $(echo $KV_OUT | tr -s ' ')"
    echo "$KV_OUT" | grep -qi "result: *0x0*3039" || { fail "KV Retrieve's result is not the value size $len (0x3039): $(echo $KV_OUT)"; disconnect_ctrl "$ctrl"; return 1; }
    [ "$(head -c $len "$WORK/kv.got" | sha256sum)" = "$(sha256sum < "$WORK/kv.val")" ] \
        || { fail "KV Retrieve returned other bytes than stored"; disconnect_ctrl "$ctrl"; return 1; }
    kv_cmd "$dev" 0x06 16 4096 r "$WORK/kv.list"
    [ $KV_RC = 0 ] || { fail "KV List failed (rc $KV_RC): $(echo $KV_OUT)"; disconnect_ctrl "$ctrl"; return 1; }
    [ "$(od -An -tu4 -N4 "$WORK/kv.list" | tr -d ' ')" = 1 ] || { fail "KV List does not return the one key: $(od -An -tx1 -N32 "$WORK/kv.list")"; disconnect_ctrl "$ctrl"; return 1; }
    kv_cmd "$dev" 0x10 16 0 -
    [ $KV_RC = 0 ] || { fail "KV Delete failed (rc $KV_RC): $(echo $KV_OUT)"; disconnect_ctrl "$ctrl"; return 1; }
    kv_cmd "$dev" 0x14 16 0 -
    echo "#   Exist after Delete: rc $KV_RC $(echo $KV_OUT)"
    # nvme-cli 2.3 prints the status field raw: DNR | SCT 1 | SC 87h (Key Does Not Exist).
    [ $KV_RC != 0 ] && echo "$KV_OUT" | grep -q "(0x4187)" \
        || { fail "KV Exist after Delete did not answer Key Does Not Exist: rc $KV_RC $(echo $KV_OUT)"; disconnect_ctrl "$ctrl"; return 1; }
    # io_uring NVMe passthrough (URING_CMD, SQE128/CQE32: Mooncake Store's path), values
    # of 4 KiB to VML, eight in flight, every byte and every DW0 size checked.
    [ -x "$SHARE/kv-uring" ] || { fail "no kv-uring client in the share (run.sh builds it)"; disconnect_ctrl "$ctrl"; return 1; }
    out=$(timeout 300 "$SHARE/kv-uring" --dev "$dev" --nsid 2 --count 48 --qd 8 --sizes 4096,65536,300001,1048576 2>&1) \
        || { fail "kv-uring: $(echo $out)"; disconnect_ctrl "$ctrl"; return 1; }
    echo "#   $out"
    # Mooncake Store's NVMe-KV encoding (byte 11 of the key carries the CSI, insert-only
    # Stores, CDW12 = 512-byte blocks - 1, 4 KiB-rounded values up to 264 KiB, statuses
    # read as res & 0xFF), with the results its backend expects.
    out=$(timeout 300 "$SHARE/kv-uring" --dev "$dev" --nsid 2 --mooncake 1 --count 10 --seed 11 2>&1) \
        || { fail "kv-uring --mooncake: $(echo $out)"; disconnect_ctrl "$ctrl"; return 1; }
    echo "#   $out"
    # Values as large as one command may carry (VML: MDTS, 32 MiB on kvtarget over TCP;
    # over RDMA the guest's registered buffer pool of 32 MiB keeps MDTS at 1 MiB).
    if [ "$TRANSPORT" = tcp ]; then
        [ "$vml" -ge $((32 * MiB)) ] || { fail "KV value max $vml is below the 32 MiB the TCP target is configured for"; disconnect_ctrl "$ctrl"; return 1; }
        out=$(timeout 300 "$SHARE/kv-uring" --dev "$dev" --nsid 2 --count 4 --qd 2 --seed 7 --sizes 4096,$((32 * MiB)) 2>&1) \
            || { fail "kv-uring (32 MiB values): $(echo $out)"; disconnect_ctrl "$ctrl"; return 1; }
        echo "#   $out"
    fi
    # A full namespace evicts (on_full's default), through nvme-cli: 40 Stores of
    # distinct 4 MiB values into the 128 MiB namespace all succeed, the newest reads
    # back byte for byte, and at least the 8 that cannot fit answer Key Does Not Exist.
    # (TCP only: the RDMA guest's MDTS is 1 MiB.)
    if [ "$TRANSPORT" = tcp ]; then
        local i misses=0 hits=0 saved_key=$KV_KEY big=$((4 * MiB))
        head -c $big "$WORK/random" > "$WORK/kv.big"
        for i in $(seq 0 39); do
            KV_KEY="0x65766963 0x74303030 0x30303030 $((0x30303030 + i))"
            printf '%08d' "$i" | dd of="$WORK/kv.big" bs=8 count=1 conv=notrunc status=none
            kv_cmd "$dev" 0x01 16 $big w "$WORK/kv.big"
            [ $KV_RC = 0 ] || { KV_KEY=$saved_key; fail "KV Store $i of 40 (4 MiB) into the full namespace failed (rc $KV_RC): $(echo $KV_OUT)"; disconnect_ctrl "$ctrl"; return 1; }
        done
        kv_cmd "$dev" 0x02 16 $big r "$WORK/kv.got"
        [ $KV_RC = 0 ] && cmp -s "$WORK/kv.got" "$WORK/kv.big" \
            || { KV_KEY=$saved_key; fail "the newest 4 MiB value did not read back (rc $KV_RC): $(echo $KV_OUT)"; disconnect_ctrl "$ctrl"; return 1; }
        for i in $(seq 0 38); do
            KV_KEY="0x65766963 0x74303030 0x30303030 $((0x30303030 + i))"
            kv_cmd "$dev" 0x14 16 0 -
            if [ $KV_RC = 0 ]; then
                hits=$((hits + 1))
            elif echo "$KV_OUT" | grep -q "(0x4187)"; then
                misses=$((misses + 1))
            else
                KV_KEY=$saved_key; fail "KV Exist of key $i answered neither a hit nor Key Does Not Exist: rc $KV_RC $(echo $KV_OUT)"; disconnect_ctrl "$ctrl"; return 1
            fi
        done
        KV_KEY=$saved_key
        echo "#   40 Stores of 4 MiB into 128 MiB: older keys $hits present, $misses evicted"
        [ $misses -ge 8 ] || { fail "only $misses of 39 older keys were evicted from a 128 MiB namespace holding 160 MiB of Stores"; disconnect_ctrl "$ctrl"; return 1; }
    fi
    # Malformed: key length 0 is Invalid Key Size, and the block namespace is untouched.
    kv_cmd "$dev" 0x14 0 0 -
    [ $KV_RC != 0 ] && echo "$KV_OUT" | grep -q "(0x4186)" \
        || { fail "KV Exist with key length 0 did not answer Invalid Key Size (0x4186): rc $KV_RC $(echo $KV_OUT)"; disconnect_ctrl "$ctrl"; return 1; }
    echo "#   Exist with key length 0: $(echo $KV_OUT)"
    dd if="$WORK/random" of="$NSDEV" bs=1M count=1 oflag=direct status=none \
        && [ "$(sha_dev "$NSDEV" 0 1)" = "$(sha_pattern 1 0)" ] \
        || { fail "the block namespace beside the KV one failed a write and read back"; disconnect_ctrl "$ctrl"; return 1; }
    disconnect_ctrl "$ctrl"
}

# --- reservations (two hosts, nvme-cli) ---------------------------------------------
# Each host reaches NSID 1 through its own controller's character device (/dev/nvmeX
# -n 1): the kernel joins both controllers under one multipath head, so the block device
# would not say which host issues a command. --resv-nqn has a single namespace, which
# NVME_IOCTL_IO_CMD on a controller device needs.
#
# The same steps run against two targets: reservations and reservation-ptpl-kill
# against the target under test (--resv-nqn), the *-spdk-control scenarios against SPDK's
# nvmf_tgt (--resv-ctl-nqn); resv_target picks one for the steps below.

# resv_target kvtarget|spdk-control -> R_NQN, R_PORT (host 1's port), R_PORT2 (host 2's).
R_NQN= R_PORT= R_PORT2=
resv_target() {
    case "$1" in
        kvtarget) R_NQN=$RESV_NQN R_PORT=$PORT R_PORT2=${RESV_PORT2:-$PORT} ;;
        spdk-control) R_NQN=$RESV_CTL_NQN R_PORT=$RESV_CTL_PORT R_PORT2=${RESV_CTL_PORT2:-$RESV_CTL_PORT} ;;
        *) fail "unknown reservation target $1"; return 1 ;;
    esac
}

# resv_connect HOSTNQN HOSTID [PORT] -> RCTRL: a controller of R_NQN for that host
# (through PORT, default R_PORT; -D: allow a second connection to one address).
RCTRL=
resv_connect() {
    local out rc
    RCTRL=
    out=$(timeout 60 nvme connect -D -t "$TRANSPORT" -a "$ADDR" -s "${3:-$R_PORT}" -n "$R_NQN" \
        --hostnqn "$1" --hostid "$2" -o json 2>&1)
    rc=$?
    [ $rc = 0 ] || { fail "nvme connect as $1 failed (rc $rc): $(echo $out)"; return 1; }
    RCTRL=$(echo "$out" | jq -r '.device // empty' 2>/dev/null)
    [ -n "$RCTRL" ] && [ -e "/dev/$RCTRL" ] || { fail "nvme connect as $1 printed no device: $(echo $out)"; return 1; }
}

# nvme-cli with a time limit (a hung command fails the scenario, not the suite).
nv() { timeout 30 nvme "$@"; }

# resv_ok WHAT CMD...: the nvme-cli command must succeed.
resv_ok() {
    local what=$1 out
    shift
    out=$("$@" 2>&1) || { fail "$what: $* failed: $(echo $out)"; return 1; }
}

# resv_conflict WHAT CMD...: the command must fail with Reservation Conflict.
resv_conflict() {
    local what=$1 out
    shift
    if out=$("$@" 2>&1); then
        fail "$what: $* succeeded, expected Reservation Conflict"; return 1
    fi
    echo "$out" | grep -qiE 'RESERVATION_CONFLICT|Reservation Conflict|\(0x83\)|0x4083' \
        || { fail "$what: $* failed, but not with Reservation Conflict: $(echo $out)"; return 1; }
}

# resv_io CTRL write|read: one 4 KiB block at LBA 0 of NSID 1 through CTRL's queues.
resv_io() {
    local ctrl=$1 op=$2
    if [ "$op" = write ]; then
        timeout 30 nvme io-passthru "/dev/$ctrl" -n 1 -o 0x01 -w -l 4096 -i "$WORK/random" --cdw12=$((4096 / BS - 1))
    else
        timeout 30 nvme io-passthru "/dev/$ctrl" -n 1 -o 0x02 -r -l 4096 --cdw12=$((4096 / BS - 1)) > /dev/null
    fi
}

# resv_report CTRL -> RESV_JSON: nvme resv-report with the extended data structure,
# also printed as a diagnostic (the two targets' reports side by side in the log).
resv_report() {
    RESV_JSON=$(timeout 30 nvme resv-report "/dev/$1" -n 1 --eds -o json 2>&1) \
        || { fail "resv-report on $1 failed: $(echo $RESV_JSON)"; return 1; }
    echo "#   resv-report ($R_NQN): $(echo "$RESV_JSON" | jq -c . 2>/dev/null || echo $RESV_JSON)"
}

t_reservations() { resv_target kvtarget && reservations_body; }
t_reservations_spdk_control() { resv_target spdk-control && reservations_body; }
reservations_body() {
    local a b
    resv_connect "$HOSTNQN" "$HOSTID" || return 1; a=$RCTRL
    resv_connect "$RESV_HOSTNQN" "$RESV_HOSTID" "$R_PORT2" || return 1; b=$RCTRL
    resv_ok "register host 1" nv resv-register "/dev/$a" -n 1 --nrkey=0xA1 --rrega=0 || return 1
    resv_ok "register host 2" nv resv-register "/dev/$b" -n 1 --nrkey=0xB2 --rrega=0 || return 1
    resv_conflict "acquire with a wrong key" nv resv-acquire "/dev/$a" -n 1 --crkey=0xBAD --rtype=1 --racqa=0 || return 1
    resv_ok "host 1 acquires Write Exclusive" nv resv-acquire "/dev/$a" -n 1 --crkey=0xA1 --rtype=1 --racqa=0 || return 1
    resv_conflict "host 2 writes under host 1's Write Exclusive" resv_io "$b" write || return 1
    resv_ok "host 2 reads under Write Exclusive" resv_io "$b" read || return 1
    resv_ok "host 1 writes" resv_io "$a" write || return 1
    resv_report "$b" || return 1
    [ "$(echo "$RESV_JSON" | jq -r '.rtype')" = 1 ] && [ "$(echo "$RESV_JSON" | jq -r '.regctl')" = 2 ] \
        || { fail "resv-report: expected rtype 1 and 2 registrants: $(echo $RESV_JSON)"; return 1; }
    resv_ok "host 2 preempts host 1" nv resv-acquire "/dev/$b" -n 1 --crkey=0xB2 --prkey=0xA1 --rtype=1 --racqa=1 || return 1
    resv_conflict "host 1 writes after being preempted" resv_io "$a" write || return 1
    resv_conflict "release with a wrong key" nv resv-release "/dev/$b" -n 1 --crkey=0xA1 --rtype=1 --rrela=0 || return 1
    resv_ok "host 2 releases" nv resv-release "/dev/$b" -n 1 --crkey=0xB2 --rtype=1 --rrela=0 || return 1
    resv_ok "host 1 writes after the release" resv_io "$a" write || return 1
    resv_ok "host 2 clears" nv resv-release "/dev/$b" -n 1 --crkey=0xB2 --rrela=1 || return 1
    resv_report "$a" || return 1
    [ "$(echo "$RESV_JSON" | jq -r '.regctl')" = 0 ] || { fail "registrants left after clear: $(echo $RESV_JSON)"; return 1; }
    disconnect_ctrl "$a"; disconnect_ctrl "$b"
}

t_reservation_ptpl_kill() { resv_target kvtarget && reservation_ptpl_kill_body; }
t_reservation_ptpl_kill_spdk_control() { resv_target spdk-control && reservation_ptpl_kill_body; }
reservation_ptpl_kill_body() {
    local a b
    resv_connect "$HOSTNQN" "$HOSTID" || return 1; a=$RCTRL
    resv_connect "$RESV_HOSTNQN" "$RESV_HOSTID" "$R_PORT2" || return 1; b=$RCTRL
    resv_ok "register with PTPL" nv resv-register "/dev/$a" -n 1 --nrkey=0xA1 --rrega=0 --cptpl=3 || return 1
    resv_ok "register host 2" nv resv-register "/dev/$b" -n 1 --nrkey=0xB2 --rrega=0 || return 1
    resv_ok "host 1 acquires Write Exclusive" nv resv-acquire "/dev/$a" -n 1 --crkey=0xA1 --rtype=1 --racqa=0 || return 1
    disconnect_ctrl "$a"; disconnect_ctrl "$b"
    sleep 1 # the target writes its PTPL file off its reactors
    restart_stop KILL "$R_NQN" || return 1
    restart_start || return 1
    resv_connect "$HOSTNQN" "$HOSTID" || return 1; a=$RCTRL
    resv_connect "$RESV_HOSTNQN" "$RESV_HOSTID" "$R_PORT2" || return 1; b=$RCTRL
    resv_report "$a" || return 1
    [ "$(echo "$RESV_JSON" | jq -r '.rtype')" = 1 ] && [ "$(echo "$RESV_JSON" | jq -r '.regctl')" = 2 ] \
        || { fail "after SIGKILL + restart: expected rtype 1 and 2 registrants: $(echo $RESV_JSON)"; return 1; }
    resv_conflict "host 2 still fenced after the restart" resv_io "$b" write || return 1
    resv_ok "clean up" nv resv-release "/dev/$a" -n 1 --crkey=0xA1 --rrela=1 || return 1
    disconnect_ctrl "$a"; disconnect_ctrl "$b"
}

# --- ANA multipath (kvtarget: --mp-nqn, --mp-port) ------------------------------------

# Path A is --port, path B --mp-port, both to MP_NQN; the RPCs name the listeners by
# the address the target listens on (--advertised-addr). fio's passes are shorter over
# RDMA (soft-RoCE in the TCG guest is slower than TCP to the host).
MP_FIO_MIB=64
[ "$TRANSPORT" = rdma ] && MP_FIO_MIB=32
mp_la() { echo "listen_address.trtype=$TRANSPORT listen_address.adrfam=ipv4 listen_address.traddr=$ADV_ADDR listen_address.trsvcid=$1"; }
mp_set() { # PORT STATE: every group of the listener at PORT
    rpc_call nvmf_subsystem_listener_set_ana_state nqn=$MP_NQN $(mp_la "$1") ana_state=$2
}
# mp_path nvmeX -> the path block device (nvmeScXnY) of MP_NQN's NSID 1 through nvmeX
mp_path() {
    local p
    for p in /sys/block/nvme*c*n*; do
        [ -e "$p/device" ] || continue
        [ "$(basename "$(readlink -f "$p/device")")" = "$1" ] || continue
        [ "$(cat "$p/nsid" 2>/dev/null)" = 1 ] && { basename "$p"; return 0; }
    done
    return 1
}
mp_state() { cat "/sys/block/$1/ana_state" 2>/dev/null || echo none; }
mp_wait_states() { # WANT_A WANT_B: each path's sysfs ana_state, within 15 s
    local i a b
    for i in $(seq 1 75); do
        a=$(mp_state "$MP_PA") b=$(mp_state "$MP_PB")
        [ "$a" = "$1" ] && [ "$b" = "$2" ] && { echo "#   ana_state A=$a B=$b"; return 0; }
        sleep 0.2
    done
    fail "sysfs ana_state A=$a B=$b, expected A=$1 B=$2"
}
mp_ios() { awk '{print $1 + $5}' "/sys/block/$1/stat"; }   # reads + writes completed
mp_ctrl_state_is() { # CTRL STATE SECONDS
    local i
    for i in $(seq 1 $(($3 * 5))); do [ "$(ctrl_state "$1")" = "$2" ] && return 0; sleep 0.2; done
    fail "$1 is $(ctrl_state "$1"), expected $2 within $3 s"
}
# mp_fio_loop DEV: fio passes (MP_FIO_MIB of random writes, crc32c verify of every block)
# until $WORK/mp-stop exists; pass N leaves $WORK/mp-fio-N.json; a failed pass
# writes its number to $WORK/mp-fio-failed and ends the loop.
mp_fio_loop() {
    local n=0
    while [ ! -e "$WORK/mp-stop" ]; do
        n=$((n + 1))
        timeout 300 fio --name=ana --filename="$1" --direct=1 --ioengine=libaio --rw=randwrite \
            --bs=64k --iodepth=16 --size=${MP_FIO_MIB}M --verify=crc32c --do_verify=1 --verify_fatal=1 \
            --output-format=json --output="$WORK/mp-fio-$n.json" > "$WORK/mp-fio-$n.err" 2>&1 \
            || { echo "$n" > "$WORK/mp-fio-failed"; return 1; }
    done
}
MP_FIO_PID= MP_CA= MP_CB= MP_PA= MP_PB=
ana_multipath_body() {
    local out head i a0 a1 b0 b1
    out=$(timeout 60 nvme connect $(common_opts) -a "$ADDR" -s "$PORT" -n "$MP_NQN" \
        --ctrl-loss-tmo=60 --reconnect-delay=1 -o json 2>&1) || { fail "connect A: $(echo $out)"; return 1; }
    MP_CA=$(echo "$out" | jq -r '.device // empty')
    out=$(timeout 60 nvme connect $(common_opts) -a "$ADDR" -s "$MP_PORT" -n "$MP_NQN" \
        --ctrl-loss-tmo=60 --reconnect-delay=1 -o json 2>&1) || { fail "connect B: $(echo $out)"; return 1; }
    MP_CB=$(echo "$out" | jq -r '.device // empty')
    [ -n "$MP_CA" ] && [ -n "$MP_CB" ] && [ "$MP_CA" != "$MP_CB" ] || { fail "two controllers expected, got '$MP_CA' '$MP_CB'"; return 1; }
    ns_dev "$MP_CA" 1 || return 1
    head=$NSDEV
    for i in $(seq 1 50); do MP_PA=$(mp_path "$MP_CA") && MP_PB=$(mp_path "$MP_CB") && break; sleep 0.2; done
    [ -n "$MP_PA" ] && [ -n "$MP_PB" ] || { fail "no path devices for $MP_CA/$MP_CB"; return 1; }
    # One head for both paths: nvmeSnN's paths are nvmeScXnN.
    local h=${head#/dev/}
    case "$MP_PA $MP_PB" in
        "${h%n*}c"*"n${h##*n} ${h%n*}c"*"n${h##*n}") echo "#   head $h, paths $MP_PA ($MP_CA) and $MP_PB ($MP_CB)" ;;
        *) fail "$head is not the head of both $MP_PA and $MP_PB"; return 1 ;;
    esac
    timeout 30 nvme list-subsys -o json > "$WORK/mp-subsys.json" 2> /dev/null
    timeout 30 nvme list-subsys "$head" 2>&1 | sed 's/^/#   /'
    local paths plain
    paths=$(jq --arg n "$MP_NQN" '[.. | objects | select(.NQN? == $n) | .Paths[]?] | length' "$WORK/mp-subsys.json" 2>/dev/null)
    # (The text form, should this nvme-cli's JSON differ: one "+- nvmeX tcp ..." line
    # per path.)
    plain=$(timeout 30 nvme list-subsys "$head" 2>/dev/null | grep -cE "^ *\+- nvme[0-9]+ $TRANSPORT ")
    [ "$paths" = 2 ] || [ "$plain" = 2 ] \
        || { fail "nvme list-subsys shows $paths (JSON) / $plain (text) paths for $MP_NQN: $(head -c 400 "$WORK/mp-subsys.json")"; return 1; }
    mp_wait_states optimized optimized || return 1
    # fio with verify on the head for the whole sequence: passes of MP_FIO_MIB of
    # random writes, each verified block by block, until the sequence is done.
    rm -f "$WORK"/mp-stop "$WORK"/mp-fio-*
    mp_fio_loop "$head" &
    MP_FIO_PID=$!
    sleep 3
    # A inaccessible, B optimized: I/O moves to B.
    mp_set "$PORT" inaccessible || return 1
    mp_wait_states inaccessible optimized || return 1
    sleep 1
    a0=$(mp_ios "$MP_PA") b0=$(mp_ios "$MP_PB"); sleep 3; a1=$(mp_ios "$MP_PA") b1=$(mp_ios "$MP_PB")
    echo "#   I/Os in 3 s with A inaccessible: A $((a1 - a0)), B $((b1 - b0))"
    if kill -0 "$MP_FIO_PID" 2>/dev/null; then
        [ "$a1" = "$a0" ] || { fail "with A inaccessible I/O still went through A: A +$((a1 - a0)), B +$((b1 - b0))"; return 1; }
        # (A kernel that keeps no statistics on path devices shows 0 on both.)
        [ "$b1" -gt "$b0" ] || echo "#   no I/O counted on either path device (no per-path statistics?)"
    fi
    # Both non-optimized, then both optimized again.
    mp_set "$MP_PORT" non_optimized && mp_set "$PORT" non_optimized || return 1
    mp_wait_states non-optimized non-optimized || return 1
    sleep 2
    mp_set "$PORT" optimized && mp_set "$MP_PORT" optimized || return 1
    mp_wait_states optimized optimized || return 1
    sleep 2
    # Listener A removed: its controller loses its connection (the host keeps
    # reconnecting), I/O carries on through B; added again, A comes back live.
    rpc_call nvmf_subsystem_remove_listener nqn=$MP_NQN $(mp_la "$PORT") || return 1
    for i in $(seq 1 50); do [ "$(ctrl_state "$MP_CA")" != live ] && break; sleep 0.2; done
    [ "$(ctrl_state "$MP_CA")" != live ] || { fail "$MP_CA still live 10 s after its listener was removed"; return 1; }
    echo "#   after remove_listener: A $(ctrl_state "$MP_CA"), B $(ctrl_state "$MP_CB")"
    [ "$(ctrl_state "$MP_CB")" = live ] || { fail "B is $(ctrl_state "$MP_CB") after A's listener was removed"; return 1; }
    sleep 3
    # (A listener removed a moment ago may still hold its socket: tried again.)
    local added=0
    for i in 1 2 3 4 5; do
        if rpc_call nvmf_subsystem_add_listener nqn=$MP_NQN $(mp_la "$PORT"); then added=1; break; fi
        sleep 1
    done
    [ "$added" = 1 ] || return 1
    REASON=
    # The host reconnects A by itself (its Connects were refused meanwhile: that
    # port no longer leads to the subsystem). A kernel that gives up on a refusal
    # with DNR set deletes A instead: then A is connected again here.
    for i in $(seq 1 150); do
        [ "$(ctrl_state "$MP_CA")" = live ] && break
        [ -e "/sys/class/nvme/$MP_CA" ] || break
        sleep 0.2
    done
    if [ ! -e "/sys/class/nvme/$MP_CA" ]; then
        echo "#   the host deleted $MP_CA after its reconnects were refused; connecting A again"
        out=$(timeout 60 nvme connect $(common_opts) -a "$ADDR" -s "$PORT" -n "$MP_NQN" \
            --ctrl-loss-tmo=60 --reconnect-delay=1 -o json 2>&1) || { fail "connect A again: $(echo $out)"; return 1; }
        MP_CA=$(echo "$out" | jq -r '.device // empty')
        MP_PA=
        for i in $(seq 1 50); do MP_PA=$(mp_path "$MP_CA") && break; sleep 0.2; done
        [ -n "$MP_PA" ] || { fail "no path device for $MP_CA"; return 1; }
    fi
    mp_ctrl_state_is "$MP_CA" live 5 || return 1
    mp_wait_states optimized optimized || return 1
    sleep 3
    touch "$WORK/mp-stop"
    wait "$MP_FIO_PID"; local rc=$?
    MP_FIO_PID=
    local n f err w r total=0
    n=$(ls "$WORK"/mp-fio-*.json 2>/dev/null | wc -l)
    [ "$rc" = 0 ] && [ ! -e "$WORK/mp-fio-failed" ] \
        || { fail "fio pass $(cat "$WORK/mp-fio-failed" 2>/dev/null) failed: $(grep -h -m3 -iE 'verify|error|fio:' "$WORK"/mp-fio-*.err | tr '\n' ' ')"; return 1; }
    for f in "$WORK"/mp-fio-*.json; do
        err=$(sed -n '/^{/,$p' "$f" | jq -r '.jobs[0].error' 2>/dev/null)
        w=$(sed -n '/^{/,$p' "$f" | jq -r '.jobs[0].write.io_bytes' 2>/dev/null)
        r=$(sed -n '/^{/,$p' "$f" | jq -r '.jobs[0].read.io_bytes' 2>/dev/null)
        [ "$err" = 0 ] && [ "$w" = $((MP_FIO_MIB * MiB)) ] && [ "$r" = "$w" ] \
            || { fail "fio $f: error $err, wrote $w and verified $r bytes, expected $((MP_FIO_MIB * MiB)) each"; return 1; }
        total=$((total + w))
    done
    echo "#   fio: $n passes, $((total / MiB)) MiB written and verified, 0 errors"
    [ "$n" -ge 2 ] || { fail "fio ran only $n passes during the sequence"; return 1; }
    klog_since ana-multipath | grep -iE 'Call Trace|BUG|ANA log page size|disabling ANA|I/O error' \
        | sed 's/^/#   | /' | grep . && { fail "kernel log has errors (above)"; return 1; }
    return 0
}
t_ana_multipath() {
    ana_multipath_body; local rc=$?
    if [ -n "$MP_FIO_PID" ]; then
        touch "$WORK/mp-stop"
        wait "$MP_FIO_PID" 2>/dev/null
        MP_FIO_PID=
    fi
    local c
    for c in $(ctrls_of "$MP_NQN"); do disconnect_ctrl "$c"; done
    return $rc
}

# --- discovery across cluster nodes (kvtarget: --cluster-disc) ------------------------

# referrals_to PORT: how many referral entries (subtype "discovery subsystem referral")
# the log in $WORK/disc.json has to discovery port PORT.
referrals_to() {
    jq --arg s "$1" '[.records[] | select((.subtype | test("referral")) and .trsvcid == $s)] | length' "$WORK/disc.json"
}

# Nodes B and C (each its own subsystem and discovery port, one etcd, lease TTL 2 s):
# `nvme discover` at either lists a referral to the other and none to itself; once the
# host has SIGKILLed C, B's log drops the referral to C within the lease and a poll.
t_cluster_referrals() {
    local b c n i
    read -r b c <<< "$CLUSTER_DISC"
    # The nodes met in etcd when they started; give the member view a moment.
    for i in $(seq 1 20); do
        discover "$b" "$HOSTNQN" "$HOSTID" || return 1
        [ "$(referrals_to "$c")" = 1 ] && break
        sleep 0.5
    done
    echo "#   at node B: $(jq -c '[.records[] | {subtype, traddr, trsvcid, subnqn}]' "$WORK/disc.json")"
    [ "$(referrals_to "$c")" = 1 ] || { fail "node B's discovery log has no referral to node C's port $c"; return 1; }
    [ "$(referrals_to "$b")" = 0 ] || { fail "node B's discovery log refers to itself"; return 1; }
    n=$(jq '[.records[] | select(.subtype == "nvme subsystem")] | length' "$WORK/disc.json")
    [ "$n" -ge 1 ] || { fail "node B's discovery log lost its own subsystem entry"; return 1; }
    discover "$c" "$HOSTNQN" "$HOSTID" || return 1
    echo "#   at node C: $(jq -c '[.records[] | {subtype, traddr, trsvcid, subnqn}]' "$WORK/disc.json")"
    [ "$(referrals_to "$b")" = 1 ] || { fail "node C's discovery log has no referral to node B's port $b"; return 1; }
    rm -f "$SHARE/cluster-done"
    echo "KILL node-c" > "$SHARE/cluster-request.tmp" && mv "$SHARE/cluster-request.tmp" "$SHARE/cluster-request"
    wait_file "$SHARE/cluster-done" 30 || { fail "host orchestrator did not kill node C within 30s"; return 1; }
    # The lease (2 s) ends, then B's next look at the members (at most a TTL/3 later).
    for i in $(seq 1 30); do
        discover "$b" "$HOSTNQN" "$HOSTID" || return 1
        [ "$(referrals_to "$c")" = 0 ] && { echo "#   referral to C gone after ~$((i / 2)) s"; return 0; }
        sleep 0.5
    done
    fail "node B still refers to dead node C after 15 s: $(jq -c '[.records[] | {subtype, trsvcid}]' "$WORK/disc.json")"
}

# --- failover between nodes sharing one pool (kvtarget: --cluster-fo) ---------------

# cluster_request "VERB ARG [SECS]": the host acts on a node or on etcd (run.sh's
# cl_request); fails with the host's answer unless it did so.
cluster_request() {
    local answer
    rm -f "$SHARE/cluster-done"
    echo "$1" > "$SHARE/cluster-request.tmp" && mv "$SHARE/cluster-request.tmp" "$SHARE/cluster-request"
    wait_file "$SHARE/cluster-done" 60 || { fail "host orchestrator did not answer '$1' within 60 s"; return 1; }
    answer=$(cat "$SHARE/cluster-done")
    echo "#   host: $answer"
    case "$answer" in failed*) fail "'$1': $answer"; return 1 ;; esac
}
declare -A FO_CTRL=() FO_PATH=()
# fo_states: "PORT=ANA_STATE/CONTROLLER_STATE ..." of every path.
fo_states() {
    local p out=
    for p in $CLUSTER_FO; do out="$out $p=$(mp_state "${FO_PATH[$p]}")/$(ctrl_state "${FO_CTRL[$p]}")"; done
    echo "${out# }"
}
# fo_wait_owner SECS [NOT_PORT]: within SECS, exactly one path of a live controller
# optimized, and not NOT_PORT's -> FO_OWNER.
fo_wait_owner() {
    local i p opt n st
    for i in $(seq 1 $(($1 * 5))); do
        opt= n=0
        for p in $CLUSTER_FO; do
            # A dead node's path keeps its last ANA state: live controllers only.
            [ "$(ctrl_state "${FO_CTRL[$p]}")" = live ] || continue
            st=$(mp_state "${FO_PATH[$p]}")
            [ "$st" = optimized ] && { opt=$p; n=$((n + 1)); }
        done
        if [ "$n" = 1 ] && [ "$opt" != "${2:-}" ]; then
            FO_OWNER=$opt
            echo "#   owner $FO_OWNER after ~$((i / 5)) s: $(fo_states)"
            return 0
        fi
        sleep 0.2
    done
    fail "no single optimized path${2:+ other than $2} within $1 s: $(fo_states)"
}
cluster_failover_body() {
    local p out head i t0
    for p in $CLUSTER_FO; do
        out=$(timeout 60 nvme connect $(common_opts) -a "$ADDR" -s "$p" -n "$CLUSTER_FO_NQN" \
            --ctrl-loss-tmo=60 --reconnect-delay=1 -o json 2>&1) || { fail "connect to port $p: $(echo $out)"; return 1; }
        FO_CTRL[$p]=$(echo "$out" | jq -r '.device // empty')
        [ -n "${FO_CTRL[$p]}" ] || { fail "connect to port $p named no controller: $(echo $out)"; return 1; }
    done
    for p in $CLUSTER_FO; do
        FO_PATH[$p]=
        for i in $(seq 1 50); do FO_PATH[$p]=$(mp_path "${FO_CTRL[$p]}") && break; sleep 0.2; done
        [ -n "${FO_PATH[$p]}" ] || { fail "no path device for ${FO_CTRL[$p]} (port $p)"; return 1; }
    done
    read -r p _ <<< "$CLUSTER_FO"
    ns_dev "${FO_CTRL[$p]}" 1 || return 1
    head=$NSDEV
    local h=${head#/dev/}
    for p in $CLUSTER_FO; do
        case "${FO_PATH[$p]}" in
            "${h%n*}c"*"n${h##*n}") ;;
            *) fail "$head is not the head of ${FO_PATH[$p]} (port $p): not one namespace on three nodes"; return 1 ;;
        esac
    done
    echo "#   head $h; paths: $(for p in $CLUSTER_FO; do printf '%s=%s ' "$p" "${FO_PATH[$p]}"; done)"
    fo_wait_owner 30 || return 1
    rm -f "$WORK"/mp-stop "$WORK"/mp-fio-*
    mp_fio_loop "$head" &
    MP_FIO_PID=$!
    sleep 4
    # The owner crashes: a survivor wins the group, recovers the pool, serves.
    local dead=$FO_OWNER
    t0=$(now)
    cluster_request "KILL $dead" || return 1
    fo_wait_owner 30 "$dead" || return 1
    echo "#   SIGKILL of $dead: new owner $FO_OWNER, $(awk -v a="$t0" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}') s from the kill"
    sleep 4
    # The new owner is paused for twice the lease: the third node takes over; the
    # paused one, continued, must not write and rejoins as a follower.
    local paused=$FO_OWNER
    cluster_request "STOP $paused $((2 * CLUSTER_FO_TTL + 1))" || return 1
    fo_wait_owner 30 "$paused" || return 1
    local third=$FO_OWNER
    for i in $(seq 1 100); do
        [ "$(mp_state "${FO_PATH[$paused]}")" = inaccessible ] && [ "$(mp_state "${FO_PATH[$third]}")" = optimized ] && break
        sleep 0.2
    done
    [ "$(mp_state "${FO_PATH[$paused]}")" = inaccessible ] || { fail "the continued node $paused is not inaccessible: $(fo_states)"; return 1; }
    echo "#   SIGSTOP/SIGCONT of $paused: $third owns, $paused rejoined as follower: $(fo_states)"
    sleep 4
    # etcd loses its leader: two members carry on; one node owns the group after.
    cluster_request "KILL-ETCD-LEADER" || return 1
    sleep $((2 * CLUSTER_FO_TTL))
    fo_wait_owner 30 || return 1
    sleep 4
    kill -0 "$MP_FIO_PID" 2>/dev/null || { fail "fio ended during the failovers: $(grep -h -m3 -iE 'verify|error|fio:' "$WORK"/mp-fio-*.err | tr '\n' ' ')"; return 1; }
    touch "$WORK/mp-stop"
    wait "$MP_FIO_PID"; local rc=$?
    MP_FIO_PID=
    local n f err w r total=0
    n=$(ls "$WORK"/mp-fio-*.json 2>/dev/null | wc -l)
    [ "$rc" = 0 ] && [ ! -e "$WORK/mp-fio-failed" ] \
        || { fail "fio pass $(cat "$WORK/mp-fio-failed" 2>/dev/null) failed: $(grep -h -m3 -iE 'verify|error|fio:' "$WORK"/mp-fio-*.err | tr '\n' ' ')"; return 1; }
    for f in "$WORK"/mp-fio-*.json; do
        err=$(sed -n '/^{/,$p' "$f" | jq -r '.jobs[0].error' 2>/dev/null)
        w=$(sed -n '/^{/,$p' "$f" | jq -r '.jobs[0].write.io_bytes' 2>/dev/null)
        r=$(sed -n '/^{/,$p' "$f" | jq -r '.jobs[0].read.io_bytes' 2>/dev/null)
        [ "$err" = 0 ] && [ "$w" = $((MP_FIO_MIB * MiB)) ] && [ "$r" = "$w" ] \
            || { fail "fio $f: error $err, wrote $w and verified $r bytes, expected $((MP_FIO_MIB * MiB)) each"; return 1; }
        total=$((total + w))
    done
    echo "#   fio: $n passes, $((total / MiB)) MiB written and verified across the failovers, 0 errors"
    [ "$n" -ge 2 ] || { fail "fio ran only $n passes during the failovers"; return 1; }
    klog_since cluster-failover | grep -iE 'Call Trace|BUG|I/O error|disabling ANA' \
        | sed 's/^/#   | /' | grep . && { fail "kernel log has errors (above)"; return 1; }
    return 0
}
t_cluster_failover() {
    cluster_failover_body; local rc=$?
    if [ -n "$MP_FIO_PID" ]; then
        touch "$WORK/mp-stop"
        wait "$MP_FIO_PID" 2>/dev/null
        MP_FIO_PID=
    fi
    local c
    for c in $(ctrls_of "$CLUSTER_FO_NQN"); do disconnect_ctrl "$c"; done
    return $rc
}

SCENARIOS="
discovery-4420
discovery-8009
discovery-hides-subsystem-from-unknown-host
connect-1-io-queue
connect-2-io-queues
connect-4-io-queues
nvme-list
nvme-id-ctrl
nvme-id-ns
nvme-smart-log
nvme-error-log
fio-verify-4k
fio-verify-128k
fio-verify-1m
dd-sha256
flush
blkdiscard
blkdiscard-zeroout
digests
keep-alive-idle
disconnect-reconnect
target-restart
unknown-host-refused
auth-required-refused
tls-required-refused
several-namespaces
nuse-tracks-writes-and-discard
unwritten-error-volume
volume-data-survives-restart
namespace-hot-add-remove
bench-fio-profiles
lmcache-raw-block
lmcache-volatile-kill
kv-namespace
reservations
reservation-ptpl-kill
reservations-spdk-control
reservation-ptpl-kill-spdk-control
ana-multipath
cluster-referrals
cluster-failover
"
# Scenarios that need thin-provisioned volumes (--volumes); reported as skipped without.
VOLUME_SCENARIOS=" several-namespaces nuse-tracks-writes-and-discard unwritten-error-volume volume-data-survives-restart namespace-hot-add-remove "
# NVMe/TCP-only scenarios: reported as skipped over another transport.
TCP_SCENARIOS=" discovery-8009 digests "
skip_reason() {
    if [ "$1" = lmcache-volatile-kill ] && { [ -z "$VOL_LMCV" ] || [ "$RESTART" != share ]; }; then
        echo "needs an unwritten = error volume (>= 384 MiB) with a volatile write cache on a target the host can SIGKILL; this target serves none"
    fi
    if [ "$1" = tls-required-refused ] && { [ -z "$TLS_PORT" ] || [ "$TRANSPORT" != tcp ]; }; then
        echo "needs a TLS-only NVMe/TCP listener (--tls-port); this target has none (Linux 6.1's nvmet here has no NVMe/TCP TLS)"
    fi
    if [ "$1" = kv-namespace ] && [ -z "$KV_NQN" ]; then
        echo "needs a subsystem with a KV namespace (--kv-nqn); this target serves none (Linux nvmet serves NVM and zoned namespaces only)"
    fi
    if [ "$1" = ana-multipath ] && { [ -z "$MP_NQN" ] || [ -z "$MP_PORT" ] || [ "$RESTART" != share ]; }; then
        echo "needs a subsystem with ANA reporting on two listeners (--mp-nqn, --mp-port) whose states the host can change over RPC; this target has none"
    fi
    if [ "$1" = cluster-failover ] && { [ -z "$CLUSTER_FO" ] || [ -z "$CLUSTER_FO_NQN" ]; }; then
        echo "${CLUSTER_SKIP:-needs three kvtarget nodes sharing one pool in one etcd cluster (--cluster-fo, --cluster-fo-nqn); this target has none}"
    fi
    if [ "$1" = cluster-referrals ] && [ -z "$CLUSTER_DISC" ]; then
        echo "${CLUSTER_SKIP:-needs two kvtarget nodes in one etcd cluster with discovery ports (--cluster-disc); this target has none}"
    fi
    if [ "$1" = auth-required-refused ] && [ -z "$AUTH_HOSTNQN" ]; then
        echo "needs a host entry with a DH-HMAC-CHAP key (--auth-hostnqn); this target has none (Linux 6.1's nvmet here has no in-band authentication)"
    fi
    if [ "$1" = reservations ] || [ "$1" = reservation-ptpl-kill ]; then
        [ -n "$RESV_NQN" ] && [ -n "$RESV_HOSTNQN" ] \
            || echo "needs a one-namespace subsystem two hosts may use (--resv-nqn, --resv-hostnqn)"
    fi
    if [ "$1" = reservation-ptpl-kill ] && [ -n "$RESV_NQN" ] && { [ -z "$RESV_PTPL" ] || [ "$RESTART" != share ]; }; then
        echo "needs a PTPL file on --resv-nqn (--resv-ptpl) and a target the host can SIGKILL (--restart share)"
    fi
    if [ "$1" = reservations-spdk-control ] || [ "$1" = reservation-ptpl-kill-spdk-control ]; then
        if [ -n "$RESV_CTL_SKIP" ]; then
            echo "the SPDK nvmf_tgt control target is not available: $RESV_CTL_SKIP"
        elif [ -z "$RESV_CTL_NQN" ] || [ -z "$RESV_CTL_PORT" ] || [ -z "$RESV_HOSTNQN" ]; then
            echo "needs SPDK's nvmf_tgt as the reservation control (--resv-ctl-nqn, --resv-ctl-port, --resv-hostnqn; run.sh starts it beside kvtarget only)"
        elif [ "$1" = reservation-ptpl-kill-spdk-control ] && [ "$RESTART" != share ]; then
            echo "needs a control the host can SIGKILL (--restart share)"
        fi
    fi
    case "$VOLUME_SCENARIOS" in
        *" $1 "*) [ -n "$VOLUMES" ] || echo "needs thin-provisioned pool volumes (--volumes); this target serves none" ;;
    esac
    case "$TCP_SCENARIOS" in
        *" $1 "*) [ "$TRANSPORT" = tcp ] || echo "NVMe/TCP only (PDU digests / the TCP discovery port)" ;;
    esac
}

echo "# tcp-suite: $TRANSPORT target $ADDR:$PORT (discovery $DISC_PORT) nqn $NQN host $HOSTNQN restart=$RESTART volumes=${VOLUMES:-none}"
suite_t0=$(now)
disconnect_all
for name in $SCENARIOS; do
    if [ -n "$ONLY" ] && ! echo "$name" | grep -qE "$ONLY"; then continue; fi
    why=$(skip_reason "$name")
    if [ -n "$why" ]; then
        SKIPPED=$((SKIPPED + 1))
        echo "skip - $name: $why"
        continue
    fi
    REASON=
    kmarker "$name"
    t0=$(now)
    fn=t_$(echo "$name" | tr '-' '_')
    echo "# -- $name"
    if "$fn"; then
        ok=1
    else
        ok=0
    fi
    # Scenarios leave nothing connected; a stray controller would skew the next one.
    disconnect_all
    dt=$(awk -v a="$t0" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}')
    if [ $ok = 1 ]; then
        PASSED=$((PASSED + 1))
        echo "ok - $name"
        echo "#   ($dt s)"
    else
        FAILED=$((FAILED + 1))
        FAILED_NAMES="$FAILED_NAMES $name"
        echo "FAIL - $name: ${REASON:-scenario returned failure}"
        echo "#   ($dt s) kernel log during $name:"
        klog_since "$name" | tail -n 40 | sed 's/^/#   | /'
    fi
done
echo "# suite took $(awk -v a="$suite_t0" -v b="$(now)" 'BEGIN {printf "%.0f", b - a}') s; failed:${FAILED_NAMES:- none}; skipped: $SKIPPED"
echo "$PASSED passed, $FAILED failed, $SKIPPED skipped"
[ "$FAILED" = 0 ]
