#!/bin/bash
# NVMe/RDMA interop, run INSIDE the interop guest (soft-RoCE exists only there): the
# guest kernel's nvme-rdma host against kvtarget running in the same guest.
#
#   1. soft-RoCE on eth0 (rdma link add rxe0 type rxe netdev eth0);
#   2. kvtarget (the release binary, passed in through the 9p share) with NVMe/RDMA
#      listeners on 10.0.2.15:4420 and :4433 (the second path of ana-multipath), its
#      namespaces thin volumes of a pool on a loop device (io_uring needs O_DIRECT,
#      which tmpfs lacks in 6.1);
#   3. tcp-suite.sh --transport rdma: the NVMe/TCP scenario list over RDMA (discovery,
#      1/2/4 I/O queues, id-ctrl/list fields, fio verify 4k..1M, flush, discard,
#      write-zeroes, keep-alive, disconnect/reconnect, target restart, volumes, ...),
#      with this script serving the suite's restart and RPC requests over the share
#      exactly as tests/interop/run.sh does on the host for NVMe/TCP;
#   4. RDMA-only checks: host teardown with I/O in flight, kvtarget survives it,
#      exits 0 on SIGTERM, and the pool checks clean offline.
# Output: the suite's lines, then this script's own ok/FAIL lines and one final
# "N passed, N failed, N skipped" line over both.
set -u
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
SHARE=/mnt/share
BIN=/tmp/kvtarget
ADDR=10.0.2.15
PORT=4420
NQN=nqn.2026-11.io.kvtarget:interop
HOSTNQN=nqn.2026-11.io.kvtarget:interop-host
HOSTID=6b7a7f1e-0c1d-4d2e-9a41-6b7674000001
SIZE_MIB=256
VOLUMES="1:$SIZE_MIB:4096:zeroes 2:64:4096:zeroes 3:64:512:error"
# A second subsystem: NSID 1 a block volume, NSID 2 a KV namespace (kv-namespace).
KV_NQN=nqn.2026-12.io.kvtarget:interop-kv
# A third, with ANA reporting, reachable on PORT and MP_PORT (a second RDMA listener
# on the same rxe address: two paths), its NSID 1 a thin volume, for ana-multipath.
MP_NQN=nqn.2026-12.io.kvtarget:interop-mp
MP_PORT=4433
POOL_MIB=640
SERIAL=KVTRDMA0000001
MODEL=kvtarget
WORK=/tmp/rdma-guest
mkdir -p "$WORK"
LOG=$SHARE/kvtarget.log
: > "$LOG"

P=0 F=0
check() { # NAME OK REASON
    if [ "$2" = 1 ]; then echo "ok - $1"; P=$((P + 1)); else echo "FAIL - $1: $3"; F=$((F + 1)); fi
}
die() {
    echo "FAIL - rdma-setup: $*"
    echo "0 passed, 1 failed, 0 skipped"
    exit 1
}

# kvtarget runs from tmpfs: 9p file mappings are not what a long-lived process wants.
cp "$SHARE/kvtarget" "$BIN" && chmod 755 "$BIN" || die "no kvtarget binary in the share"

rdma link add rxe0 type rxe netdev eth0 || die "rdma link add rxe0 failed"
echo "# soft-RoCE: $(rdma link show 2>&1 | tr '\n' ' ')"

truncate -s "${POOL_MIB}M" /tmp/pool.img || die "cannot create the pool image"
LOOP=$(losetup -f) && losetup "$LOOP" /tmp/pool.img || die "losetup failed"

CFG=$WORK/kvtarget.toml
{
cat <<EOF
[reactors]
count = 2
idle = "adaptive"

[rdma]
buffer_pool_size = "32MiB"

[metrics]
address = "127.0.0.1:9464"

[[listeners]]
address = "$ADDR"
port = $PORT
transport = "rdma"

[[listeners]]
address = "$ADDR"
port = $MP_PORT
transport = "rdma"

[[pools]]
name = "interop"
backend = "uring"
path = "$LOOP"
size = "${POOL_MIB}MiB"
extent_size = "1MiB"
EOF
for v in $VOLUMES; do
    IFS=: read -r n m b u <<< "$v"
    printf '\n[[pools.volumes]]\nname = "ns%s"\nsize = "%sMiB"\nblock_size = %s\nunwritten = "%s"\n' "$n" "$m" "$b" "$u"
done
cat <<EOF

[[subsystems]]
nqn = "$NQN"
serial = "$SERIAL"
model = "$MODEL"
allow_any_host = false
hosts = ["$HOSTNQN"]
EOF
for v in $VOLUMES; do
    IFS=: read -r n m b u <<< "$v"
    printf '\n[[subsystems.namespaces]]\nnsid = %s\nvolume = "interop/ns%s"\n' "$n" "$n"
done
cat <<EOF

[[pools.volumes]]
name = "kv-blocks"
size = "16MiB"

[[pools.volumes]]
name = "kv-cache"
size = "64MiB"
kind = "kv"

[[subsystems]]
nqn = "$KV_NQN"
serial = "KVTINTEROPKV01"
allow_any_host = false
hosts = ["$HOSTNQN"]

[[subsystems.namespaces]]
nsid = 1
volume = "interop/kv-blocks"

[[subsystems.namespaces]]
nsid = 2
volume = "interop/kv-cache"

[[pools.volumes]]
name = "mp"
size = "64MiB"

[[subsystems]]
nqn = "$MP_NQN"
serial = "KVTRDMAMP00001"
allow_any_host = false
hosts = ["$HOSTNQN"]
ana_reporting = true
listen = ["$ADDR:$PORT", "$ADDR:$MP_PORT"]

[[subsystems.namespaces]]
nsid = 1
volume = "interop/mp"
EOF
} > "$CFG"
"$BIN" check-config "$CFG" >> "$LOG" 2>&1 || die "kvtarget rejects $CFG: $(tail -n 1 "$LOG")"

kv_pid=
kv_start() {
    local mark
    mark=$(wc -l < "$LOG")
    NO_COLOR=1 RUST_LOG=${KVT_LOG:-info} "$BIN" --config "$CFG" -r "$WORK/rpc.sock" >> "$LOG" 2>&1 &
    kv_pid=$!
    local i
    for i in $(seq 1 150); do
        if ! kill -0 "$kv_pid" 2>/dev/null; then
            wait "$kv_pid"; echo "# kvtarget exited with status $? during start-up: $(tail -n 3 "$LOG" | tr '\n' ' ')"
            kv_pid=; return 1
        fi
        tail -n +"$((mark + 1))" "$LOG" | grep -q "listening on $ADDR:$PORT (NVMe/RDMA)" && return 0
        sleep 0.2
    done
    echo "# kvtarget not listening after 30s"
    return 1
}
KV_STOP_STATUS=
kv_stop() {
    KV_STOP_STATUS=
    [ -n "$kv_pid" ] || { KV_STOP_STATUS=not-running; return 1; }
    if ! kill -0 "$kv_pid" 2>/dev/null; then
        wait "$kv_pid"; KV_STOP_STATUS="already-exited($?)"; kv_pid=; return 1
    fi
    kill -TERM "$kv_pid"
    local i
    for i in $(seq 1 100); do kill -0 "$kv_pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$kv_pid" 2>/dev/null; then
        kill -KILL "$kv_pid"; wait "$kv_pid" 2>/dev/null; KV_STOP_STATUS=timeout; kv_pid=; return 1
    fi
    wait "$kv_pid"; KV_STOP_STATUS=$?; kv_pid=
    [ "$KV_STOP_STATUS" = 0 ]
}

kv_start || die "kvtarget did not start (see kvtarget.log in the share)"

# The suite's restart and RPC requests, served like run.sh does on the host (this
# shell started kvtarget, so only it can wait for its exit status).
orchestrate_once() {
    if [ -e "$SHARE/rpc-request" ]; then
        local req rc out
        req=$(cat "$SHARE/rpc-request"); rm -f "$SHARE/rpc-request"
        # shellcheck disable=SC2086
        out=$("$BIN" rpc -r "$WORK/rpc.sock" --json $req 2>&1); rc=$?
        echo "---- rdma-guest: rpc $req -> $rc ----" >> "$LOG"
        { echo "$rc"; echo "$out"; } > "$SHARE/rpc-response.tmp"
        mv "$SHARE/rpc-response.tmp" "$SHARE/rpc-response"
    fi
    if [ -e "$SHARE/restart-request" ]; then
        rm -f "$SHARE/restart-request"
        echo "---- rdma-guest: SIGTERM for a restart ----" >> "$LOG"
        kv_stop || echo "restart: kvtarget did not exit 0 on SIGTERM ($KV_STOP_STATUS)" >> "$WORK/restart-errors"
        echo "stopped, status $KV_STOP_STATUS" > "$SHARE/restart-stopped"
        local i
        for i in $(seq 1 300); do [ -e "$SHARE/restart-resume" ] && break; sleep 0.2; done
        if kv_start; then
            echo restarted > "$SHARE/restart-done"
        else
            echo "restart: kvtarget did not come back" >> "$WORK/restart-errors"
            echo failed > "$SHARE/restart-done"
        fi
    fi
}

bash "$SHARE/tcp-suite.sh" --transport rdma --addr "$ADDR" --port "$PORT" --disc-port "$PORT" \
    --nqn "$NQN" --hostnqn "$HOSTNQN" --hostid "$HOSTID" --size $((SIZE_MIB * 1048576)) \
    --block-size 4096 --restart share --serial "$SERIAL" --model "$MODEL" \
    --volumes "$VOLUMES" --kv-nqn "$KV_NQN" --mp-nqn "$MP_NQN" --mp-port "$MP_PORT" ${RDMA_ONLY:+--only "$RDMA_ONLY"} 2>&1 | tee "$WORK/suite.log" &
suite_pid=$!
while kill -0 "$suite_pid" 2>/dev/null; do
    orchestrate_once
    sleep 0.2
done
wait "$suite_pid"
suite_line=$(grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$WORK/suite.log" | tail -n 1)
[ -n "$suite_line" ] || { echo "FAIL - suite-did-not-finish"; F=$((F + 1)); }
read -r sp _ sf _ ss _ <<< "${suite_line:-0 passed, 0 failed, 0 skipped}"

# Host teardown with I/O in flight: the host disconnects while fio has 64 commands
# outstanding on each of 4 queues (keyed RDMA READs/WRITEs in progress); the target
# must drop those queue pairs cleanly and serve the next host at once.
echo "# -- host-teardown-during-io"
out=$(timeout 60 nvme connect -t rdma -a "$ADDR" -s "$PORT" -n "$NQN" --hostnqn "$HOSTNQN" \
    --hostid "$HOSTID" --nr-io-queues=4 -o json 2>&1)
ctrl=$(echo "$out" | jq -r '.device // empty' 2>/dev/null)
ok=0 why="connect failed: $(echo $out)"
if [ -n "$ctrl" ]; then
    dev=
    for i in $(seq 1 100); do
        for d in /sys/block/nvme*n*; do
            d=$(basename "$d"); case "$d" in nvme*c*) continue ;; esac
            [ "$(cat /sys/block/$d/nsid 2>/dev/null)" = 1 ] && dev=/dev/$d
        done
        [ -n "$dev" ] && [ -b "$dev" ] && break
        sleep 0.1
    done
    fio --name=teardown --filename="$dev" --direct=1 --ioengine=libaio --rw=randrw --bs=128k \
        --iodepth=64 --numjobs=4 --size=64M --time_based --runtime=30 > "$WORK/teardown-fio.log" 2>&1 &
    fpid=$!
    sleep 4
    timeout 60 nvme disconnect -d "$ctrl" > /dev/null 2>&1
    wait "$fpid"
    sleep 1
    if ! kill -0 "$kv_pid" 2>/dev/null; then
        why="kvtarget died when the host tore down with I/O in flight"
    else
        out=$(timeout 60 nvme connect -t rdma -a "$ADDR" -s "$PORT" -n "$NQN" --hostnqn "$HOSTNQN" \
            --hostid "$HOSTID" -o json 2>&1)
        c2=$(echo "$out" | jq -r '.device // empty' 2>/dev/null)
        if [ -n "$c2" ] && [ "$(cat /sys/class/nvme/$c2/state)" = live ]; then
            dd if=/dev/urandom of="$WORK/pat" bs=1M count=4 status=none
            sleep 1
            dev2=
            for d in /sys/block/nvme*n*; do
                d=$(basename "$d"); case "$d" in nvme*c*) continue ;; esac
                [ "$(cat /sys/block/$d/nsid 2>/dev/null)" = 1 ] && dev2=/dev/$d
            done
            dd if="$WORK/pat" of="$dev2" bs=1M seek=200 count=4 oflag=direct conv=notrunc status=none
            if [ "$(dd if="$dev2" bs=1M skip=200 count=4 iflag=direct status=none | sha256sum)" = "$(sha256sum < "$WORK/pat")" ]; then
                ok=1
            else
                why="data written after the teardown reads back wrong"
            fi
            timeout 60 nvme disconnect -d "$c2" > /dev/null 2>&1
        else
            why="reconnect after the teardown failed: $(echo $out)"
        fi
    fi
fi
check host-teardown-during-io "$ok" "$why"

# --- Poll groups: one completion queue per (reactor, RDMA device), shared by QPs ---
REACTORS=2
rpc() { "$BIN" rpc -r "$WORK/rpc.sock" --json "$@"; }
metrics() { # GET /metrics with bash's /dev/tcp (the guest has no curl)
    exec 3<> /dev/tcp/127.0.0.1/9464 || return 1
    printf 'GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3
    cat <&3
    exec 3<&-
}
metric_sum() { # NAME: the sum of that metric over its label sets
    metrics | awk -v n="$1" 'index($0, n "{") == 1 { s += $NF } END { print s + 0 }'
}
# "CQS QPAIRS MAX_QPAIRS_ON_ONE_CQ RESERVED DROPPED COMPLETIONS" over every RDMA
# poll group device entry of nvmf_get_stats (each entry is one CQ).
cq_facts() {
    rpc nvmf_get_stats 2>/dev/null | jq -r '[.poll_groups[].transports[] | select(.trtype == "RDMA") | .devices[]]
        | "\(length) \(map(.qpairs) | add // 0) \(map(.qpairs) | max // 0) \(map(.cq_entries_reserved) | add // 0) \(map(.dropped_completions) | add // 0) \(map(.completions) | add // 0)"'
}
ndevs=$(rdma link show 2>/dev/null | grep -c '^link ')
ns_dev() { # NSID: the block device of that namespace (one controller connected)
    local i d
    for i in $(seq 1 100); do
        for d in /sys/block/nvme*n*; do
            d=$(basename "$d"); case "$d" in nvme*c*) continue ;; esac
            [ "$(cat /sys/block/$d/nsid 2>/dev/null)" = "$1" ] && [ -b /dev/$d ] && { echo /dev/$d; return 0; }
        done
        sleep 0.1
    done
    return 1
}
rconnect() { # extra nvme connect args; prints the controller name
    timeout 60 nvme connect -t rdma -a "$ADDR" -s "$PORT" -n "$NQN" --hostnqn "$HOSTNQN" \
        --hostid "$HOSTID" -o json "$@" 2>&1 | jq -r '.device // empty' 2>/dev/null
}
fio_verify() { # DEV NAME: 4 jobs (one per CPU, so every I/O queue), written then read back checked
    fio --name="$2" --filename="$1" --direct=1 --ioengine=libaio --rw=randwrite --bsrange=4k-128k \
        --iodepth=16 --numjobs=4 --size=16M --offset_increment=16M --verify=crc32c --do_verify=1 \
        --verify_fatal=1 --group_reporting > "$WORK/$2.log" 2>&1
}
qpairs_drained() { # waits up to 15 s for no QP and no CQ reservation left
    local i f
    for i in $(seq 1 75); do
        f=$(cq_facts); read -r _ q _ res _ _ <<< "$f"
        [ "$q" = 0 ] && [ "$res" = 0 ] && return 0
        sleep 0.2
    done
    return 1
}

# (a) More I/O queues than reactors: 4 I/O queues + the admin queue over 2 reactors
# share 2 CQs (reactors x devices), never one CQ per QP; fio verify over all queues.
echo "# -- rdma-shared-cq-io-queues-over-reactors"
ok=0 why=
c=$(rconnect --nr-io-queues=4)
if [ -z "$c" ]; then
    why="connect with 4 I/O queues failed"
else
    qc=$(cat /sys/class/nvme/$c/queue_count 2>/dev/null)
    read -r cqs qps maxq res _ _ <<< "$(cq_facts)"
    dev=$(ns_dev 1)
    if [ "$qc" != 5 ]; then
        why="queue_count $qc, expected 5 (admin + 4 I/O)"
    elif [ "$cqs" != $((REACTORS * ndevs)) ]; then
        why="$cqs completion queues for $qps QPs; expected $((REACTORS * ndevs)) ($REACTORS reactors x $ndevs RDMA devices)"
    elif [ "$qps" != 5 ] || [ "$maxq" -lt 3 ]; then
        why="QPs on the CQs: $qps in all, at most $maxq on one; expected 5, at least 3 sharing one CQ"
    elif [ "$(metric_sum kvtarget_rdma_completion_queues)" != "$cqs" ] \
        || [ "$(metric_sum kvtarget_rdma_poll_group_queue_pairs)" != "$qps" ]; then
        why="metrics disagree: $(metric_sum kvtarget_rdma_completion_queues) CQs, $(metric_sum kvtarget_rdma_poll_group_queue_pairs) QPs (nvmf_get_stats: $cqs, $qps)"
    elif [ -z "$dev" ]; then
        why="no block device for namespace 1"
    elif ! fio_verify "$dev" shared-cq-verify; then
        why="fio verify failed: $(grep -iE 'error|bad|verify' "$WORK/shared-cq-verify.log" | head -n 3 | tr '\n' ' ')"
    else
        ok=1
        echo "# $cqs CQs ($REACTORS reactors x $ndevs devices) carry $qps QPs, up to $maxq on one; $res CQ entries reserved"
    fi
    timeout 60 nvme disconnect -d "$c" > /dev/null 2>&1
fi
check rdma-shared-cq-io-queues-over-reactors "$ok" "$why"

# (b) Disconnect/reconnect cycles with I/O in flight, then a fresh connection passes
# fio verify: the closed QPs' completions were all flushed and none reached a new QP.
echo "# -- rdma-reconnect-cycles-during-io"
ok=1 why=
for cycle in 1 2 3 4; do
    c=$(rconnect --nr-io-queues=4)
    [ -n "$c" ] || { ok=0; why="connect failed in cycle $cycle"; break; }
    dev=$(ns_dev 1) || { ok=0; why="no block device in cycle $cycle"; timeout 60 nvme disconnect -d "$c" > /dev/null 2>&1; break; }
    fio --name=cycle --filename="$dev" --direct=1 --ioengine=libaio --rw=randrw --bsrange=4k-128k \
        --iodepth=32 --numjobs=4 --size=64M --time_based --runtime=30 > "$WORK/cycle-$cycle.log" 2>&1 &
    fpid=$!
    sleep 3
    timeout 60 nvme disconnect -d "$c" > /dev/null 2>&1
    wait "$fpid"
    kill -0 "$kv_pid" 2>/dev/null || { ok=0; why="kvtarget died in cycle $cycle"; break; }
done
if [ "$ok" = 1 ]; then
    if ! qpairs_drained; then
        ok=0; why="QPs or CQ entries left after the cycles: $(cq_facts) (CQS QPAIRS MAXQ RESERVED DROPPED COMPLETIONS)"
    else
        c=$(rconnect --nr-io-queues=4)
        dev=$(ns_dev 1)
        if [ -z "$c" ] || [ -z "$dev" ]; then
            ok=0; why="fresh connect after the cycles failed"
        elif ! fio_verify "$dev" after-cycles-verify; then
            ok=0; why="fio verify on a fresh connection failed: $(grep -iE 'error|bad|verify' "$WORK/after-cycles-verify.log" | head -n 3 | tr '\n' ' ')"
        fi
        [ -n "$c" ] && timeout 60 nvme disconnect -d "$c" > /dev/null 2>&1
        qpairs_drained || { ok=0; why="${why:+$why; }QPs left after the last disconnect: $(cq_facts)"; }
    fi
fi
echo "# after the cycles: $(cq_facts) (CQS QPAIRS MAXQ RESERVED DROPPED COMPLETIONS)"
check rdma-reconnect-cycles-during-io "$ok" "$why"

# (c) A Fabrics Disconnect on an I/O queue: answered, then that QP closes (the host
# recovers by reconnecting). The Linux host never sends one itself; a passthrough
# command with opcode 0x7f on namespace 8 puts fctype 0x08 (Disconnect) in byte 4.
echo "# -- rdma-fabrics-disconnect-io-queue"
ok=0 why=
if ! rpc bdev_lvol_create '{"lvol_name": "disc8", "size_in_mib": 16, "lvs_name": "interop", "thin_provision": true}' > "$WORK/disc8.log" 2>&1 \
    || ! rpc nvmf_subsystem_add_ns "{\"nqn\": \"$NQN\", \"namespace\": {\"bdev_name\": \"interop/disc8\", \"nsid\": 8}}" >> "$WORK/disc8.log" 2>&1; then
    why="cannot add namespace 8: $(tail -n 2 "$WORK/disc8.log" | tr '\n' ' ')"
else
    mark=$(wc -l < "$LOG")
    c=$(rconnect --nr-io-queues=4 --reconnect-delay=1 --ctrl-loss-tmo=60)
    dev8=$(ns_dev 8)
    if [ -z "$c" ] || [ -z "$dev8" ]; then
        why="connect failed or no namespace 8 ($c $dev8)"
    elif ! out=$(timeout 30 nvme io-passthru "$dev8" --opcode=0x7f --namespace-id=8 2>&1); then
        why="the Disconnect passthrough failed: $(echo $out)"
    else
        seen=0
        for i in $(seq 1 50); do
            tail -n +"$((mark + 1))" "$LOG" | grep -q "Fabrics Disconnect" && { seen=1; break; }
            sleep 0.2
        done
        # The host notices the closed QP, resets and reconnects (1 s delay).
        sleep 2
        live=0
        for i in $(seq 1 150); do
            [ "$(cat /sys/class/nvme/$c/state 2>/dev/null)" = live ] && { live=1; break; }
            sleep 0.2
        done
        sleep 1
        dev=$(ns_dev 1)
        if [ "$seen" != 1 ]; then
            why="kvtarget did not log the Fabrics Disconnect"
        elif [ "$live" != 1 ] || [ "$(cat /sys/class/nvme/$c/state 2>/dev/null)" != live ]; then
            why="controller not live again after the I/O queue closed: $(cat /sys/class/nvme/$c/state 2>/dev/null)"
        elif [ -z "$dev" ] || ! fio_verify "$dev" after-disconnect-verify; then
            why="fio verify after the Disconnect failed: $(grep -iE 'error|bad|verify' "$WORK/after-disconnect-verify.log" 2>/dev/null | head -n 3 | tr '\n' ' ')"
        else
            ok=1
        fi
    fi
    [ -n "$c" ] && timeout 60 nvme disconnect -d "$c" > /dev/null 2>&1
    rpc nvmf_subsystem_remove_ns "{\"nqn\": \"$NQN\", \"nsid\": 8}" > /dev/null 2>&1
    rpc bdev_lvol_delete '{"name": "interop/disc8"}' > /dev/null 2>&1
    if [ "$ok" = 1 ] && ! qpairs_drained; then
        ok=0; why="QPs left after the last disconnect: $(cq_facts)"
    fi
fi
check rdma-fabrics-disconnect-io-queue "$ok" "$why"

# (e) SPDK's own NVMe/RDMA host against kvtarget's RDMA listener, default options
# (no hostnqn: SPDK then sends an empty host NQN, so the subsystem allows any host):
# spdk_nvme_identify, spdk_nvme_perf writes and reads, and bdevperf -w verify
# (SPDK's bdev_nvme initiator writes, reads back and compares every block). Runs
# when the share carries SPDK's tools (tests/interop/rdma-run.sh with SPDK_DIR).
SPDK=$SHARE/spdk
if [ -x "$SPDK/spdk_nvme_perf" ]; then
    echo "# -- spdk-rdma-host"
    SNQN=nqn.2026-11.io.kvtarget:spdk-rdma-host
    STRID="trtype:RDMA adrfam:IPv4 traddr:$ADDR trsvcid:$PORT subnqn:$SNQN"
    mkdir -p /dev/hugepages /var/run /var/tmp
    grep -q " /dev/hugepages hugetlbfs " /proc/mounts || mount -t hugetlbfs nodev /dev/hugepages
    echo 384 > /proc/sys/vm/nr_hugepages
    : > "$WORK/openssl.cnf" # SPDK initialises OpenSSL; the guest image has no config
    spdk_env() { OPENSSL_CONF=$WORK/openssl.cnf LD_LIBRARY_PATH=$SPDK/lib "$@"; }
    sok=1 swhy=
    if ! {
        rpc nvmf_create_subsystem "{\"nqn\": \"$SNQN\", \"allow_any_host\": true, \"serial_number\": \"KVTSPDKRDMA001\"}" &&
            rpc bdev_lvol_create '{"lvol_name": "spdkhost", "size_in_mib": 64, "lvs_name": "interop", "thin_provision": true}' &&
            rpc nvmf_subsystem_add_ns "{\"nqn\": \"$SNQN\", \"namespace\": {\"bdev_name\": \"interop/spdkhost\", \"nsid\": 1}}" &&
            rpc nvmf_subsystem_add_listener "{\"nqn\": \"$SNQN\", \"listen_address\": {\"trtype\": \"RDMA\", \"adrfam\": \"IPv4\", \"traddr\": \"$ADDR\", \"trsvcid\": \"$PORT\"}}"
    } > "$WORK/spdk-setup.log" 2>&1; then
        sok=0 swhy="cannot set up $SNQN over RPC: $(tail -n 2 "$WORK/spdk-setup.log" | tr '\n' ' ')"
    fi
    if [ "$sok" = 1 ]; then
        spdk_env timeout 120 "$SPDK/spdk_nvme_identify" -r "$STRID" > "$WORK/spdk-identify.log" 2>&1
        if grep -q "Serial Number: *KVTSPDKRDMA001" "$WORK/spdk-identify.log" &&
            grep -qE "Namespace ID: *1" "$WORK/spdk-identify.log"; then
            check spdk-rdma-host-identify 1 ""
        else
            check spdk-rdma-host-identify 0 "spdk_nvme_identify: $(grep -iE 'error|fail' "$WORK/spdk-identify.log" | head -n 3 | tr '\n' ' ')"
        fi
        for w in randwrite randread; do
            spdk_env timeout 120 "$SPDK/spdk_nvme_perf" -q 16 -o 4096 -w $w -t 3 -r "$STRID" > "$WORK/spdk-perf-$w.log" 2>&1
            iops=$(awk '$1 == "Total" && $2 == ":" {print $3}' "$WORK/spdk-perf-$w.log" | tail -n 1)
            if [ -n "$iops" ] && awk -v x="$iops" 'BEGIN { exit !(x > 0) }' &&
                ! grep -q "completed with error" "$WORK/spdk-perf-$w.log"; then
                check "spdk-rdma-host-perf-$w" 1 ""
                echo "# spdk_nvme_perf RDMA $w 4 KiB QD16: $iops IOPS (TCG guest, soft-RoCE)"
            else
                check "spdk-rdma-host-perf-$w" 0 "spdk_nvme_perf: $(grep -iE 'error|fail' "$WORK/spdk-perf-$w.log" | head -n 3 | tr '\n' ' ')"
            fi
        done
        printf '%s\n' '{"subsystems": [{"subsystem": "bdev", "config": [{"method": "bdev_nvme_attach_controller",' \
            "  \"params\": {\"name\": \"kvt\", \"trtype\": \"RDMA\", \"adrfam\": \"IPv4\", \"traddr\": \"$ADDR\"," \
            "             \"trsvcid\": \"$PORT\", \"subnqn\": \"$SNQN\"}}]}]}" > "$WORK/bdevperf.json"
        spdk_env timeout 180 "$SPDK/bdevperf" --json "$WORK/bdevperf.json" -q 16 -o 65536 -w verify -t 5 \
            > "$WORK/spdk-bdevperf.log" 2>&1
        brc=$?
        # bdevperf's live progress ends in a carriage return before its Total row
        # ("Total : runtime IOPS MiB/s Fail/s TO/s ..."): IOPS column 3, Fail/s 5.
        btotal=$(tr '\r' '\n' < "$WORK/spdk-bdevperf.log" | awk '$1 == "Total" && $2 == ":" { print $3, $5; exit }')
        if [ "$brc" = 0 ] && [ -n "$btotal" ] && awk -v t="$btotal" 'BEGIN { split(t, f, " "); exit !(f[1] > 0 && f[2] == 0) }' &&
            ! grep -qiE "mismatch|miscompare" "$WORK/spdk-bdevperf.log"; then
            check spdk-rdma-host-bdevperf-verify 1 ""
            echo "# bdevperf verify over RDMA, 64 KiB QD16: $btotal (IOPS, failures/s)"
        else
            check spdk-rdma-host-bdevperf-verify 0 "bdevperf exit $brc: $(grep -iE 'error|fail|mismatch' "$WORK/spdk-bdevperf.log" | head -n 3 | tr '\n' ' ')"
        fi
    else
        check spdk-rdma-host-setup 0 "$swhy"
    fi
    rpc nvmf_delete_subsystem "{\"nqn\": \"$SNQN\"}" > /dev/null 2>&1

    # DH-HMAC-CHAP over NVMe/RDMA: the same Authentication Send/Receive exchange on
    # every queue (the fabrics core is the transport's); SPDK's host with a host and
    # a controller key gets in and runs I/O, with a wrong key it does not.
    if [ "$sok" = 1 ]; then
        echo "# -- spdk-rdma-host-dhchap"
        ANQN=nqn.2026-12.io.kvtarget:spdk-rdma-auth
        AHOST=nqn.2026-12.io.kvtarget:spdk-rdma-auth-host
        ATRID="trtype:RDMA adrfam:IPv4 traddr:$ADDR trsvcid:$PORT subnqn:$ANQN hostnqn:$AHOST"
        mkkey() { # FILE: a DHHC-1 secret, 32 random bytes with their CRC-32, mode 0600
            (umask 077; python3 -c 'import base64, os, zlib; k = os.urandom(32)
print("DHHC-1:00:" + base64.b64encode(k + zlib.crc32(k).to_bytes(4, "little")).decode() + ":")' > "$1")
        }
        mkkey "$WORK/auth-host.key" && mkkey "$WORK/auth-ctrl.key" && mkkey "$WORK/auth-wrong.key"
        if {
            rpc keyring_file_add_key "{\"name\": \"rdma-host\", \"path\": \"$WORK/auth-host.key\"}" &&
                rpc keyring_file_add_key "{\"name\": \"rdma-ctrl\", \"path\": \"$WORK/auth-ctrl.key\"}" &&
                rpc nvmf_create_subsystem "{\"nqn\": \"$ANQN\", \"serial_number\": \"KVTSPDKRDMAAUTH1\"}" &&
                rpc nvmf_subsystem_add_ns "{\"nqn\": \"$ANQN\", \"namespace\": {\"bdev_name\": \"interop/spdkhost\", \"nsid\": 1}}" &&
                rpc nvmf_subsystem_add_host "{\"nqn\": \"$ANQN\", \"host\": \"$AHOST\", \"dhchap_key\": \"rdma-host\", \"dhchap_ctrlr_key\": \"rdma-ctrl\"}" &&
                rpc nvmf_subsystem_add_listener "{\"nqn\": \"$ANQN\", \"listen_address\": {\"trtype\": \"RDMA\", \"adrfam\": \"IPv4\", \"traddr\": \"$ADDR\", \"trsvcid\": \"$PORT\"}}"
        } > "$WORK/spdk-auth-setup.log" 2>&1; then
            spdk_env timeout 120 "$SPDK/spdk_nvme_perf" -q 16 -o 4096 -w randrw -M 50 -t 2 -r "$ATRID" \
                --dhchap-key "$WORK/auth-host.key" --dhchap-ctrlr-key "$WORK/auth-ctrl.key" > "$WORK/spdk-auth-perf.log" 2>&1
            iops=$(awk '$1 == "Total" && $2 == ":" {print $3}' "$WORK/spdk-auth-perf.log" | tail -n 1)
            if [ -n "$iops" ] && awk -v x="$iops" 'BEGIN { exit !(x > 0) }' &&
                ! grep -q "completed with error" "$WORK/spdk-auth-perf.log" &&
                grep -q "host and controller authenticated .*qid=1" "$LOG"; then
                check spdk-rdma-host-dhchap-bidirectional 1 ""
                echo "# spdk_nvme_perf RDMA with DH-HMAC-CHAP both ways: $iops IOPS; $(grep -m 1 'host and controller authenticated' "$LOG" | grep -o 'digest=.*')"
            else
                check spdk-rdma-host-dhchap-bidirectional 0 "spdk_nvme_perf: $(grep -iE 'error|fail' "$WORK/spdk-auth-perf.log" | head -n 3 | tr '\n' ' ') kvtarget: $(grep 'DH-HMAC-CHAP' "$LOG" | tail -n 1)"
            fi
            spdk_env timeout 120 "$SPDK/spdk_nvme_perf" -q 16 -o 4096 -w randread -t 1 -r "$ATRID" \
                --dhchap-key "$WORK/auth-wrong.key" > "$WORK/spdk-auth-wrong.log" 2>&1
            wiops=$(awk '$1 == "Total" && $2 == ":" {print $3}' "$WORK/spdk-auth-wrong.log" | tail -n 1)
            if grep -q 'No valid NVMe controllers' "$WORK/spdk-auth-wrong.log" && [ -z "$wiops" ] &&
                grep -q "does not match key \`rdma-host\`" "$LOG"; then
                check spdk-rdma-host-dhchap-wrong-key-refused 1 ""
            else
                check spdk-rdma-host-dhchap-wrong-key-refused 0 "perf: $(tail -n 3 "$WORK/spdk-auth-wrong.log" | tr '\n' ' ') kvtarget: $(grep 'DH-HMAC-CHAP' "$LOG" | tail -n 1)"
            fi
        else
            check spdk-rdma-host-dhchap-setup 0 "$(tail -n 2 "$WORK/spdk-auth-setup.log" | tr '\n' ' ')"
        fi
        rpc nvmf_delete_subsystem "{\"nqn\": \"$ANQN\"}" > /dev/null 2>&1
    fi
    rpc bdev_lvol_delete '{"name": "interop/spdkhost"}' > /dev/null 2>&1
    cp "$WORK"/spdk-*.log "$SHARE/" 2>/dev/null
fi


alive=0
kill -0 "$kv_pid" 2>/dev/null && alive=1
check kvtarget-alive-after-suite "$alive" "kvtarget is no longer running (see kvtarget.log)"
if [ -e "$WORK/restart-errors" ]; then
    check kvtarget-restart-on-sigterm 0 "$(head -n 1 "$WORK/restart-errors")"
fi
if [ "$alive" = 1 ]; then
    kv_stop
    check kvtarget-sigterm-exit-0 "$([ "$KV_STOP_STATUS" = 0 ] && echo 1 || echo 0)" "exit status after SIGTERM: $KV_STOP_STATUS"
    "$BIN" check "$LOOP" > "$WORK/pool-check.log" 2>&1
    crc=$?
    check kvtarget-pool-check "$([ "$crc" = 0 ] && echo 1 || echo 0)" "kvtarget check exited $crc: $(tail -n 3 "$WORK/pool-check.log" | tr '\n' ' ')"
fi
cp "$WORK/pool-check.log" "$SHARE/" 2>/dev/null

# (d) A QP the reactor's CQ cannot hold is refused (CM reject + one log line), never
# overflows the CQ. rdma.max_qpairs_per_reactor = 1 gives each reactor a CQ of 400
# entries (one queue of depth 128: 3 x 128 + 16): the admin queue (112) and I/O
# queue 1 (400) fit on reactors 0 and 1, I/O queue 2 (400 more on reactor 0) does not.
echo "# -- rdma-cq-full-refused"
ok=0 why=
sed 's/^buffer_pool_size = "32MiB"$/&\nmax_qpairs_per_reactor = 1/' "$CFG" > "$WORK/cq-small.toml"
CFG_SAVED=$CFG CFG=$WORK/cq-small.toml
if ! grep -q '^max_qpairs_per_reactor = 1' "$CFG"; then
    why="could not write the small-CQ configuration"
elif ! kv_start; then
    why="kvtarget did not start with max_qpairs_per_reactor = 1"
else
    mark=$(wc -l < "$LOG")
    c=$(rconnect --nr-io-queues=2 --ctrl-loss-tmo=0)
    [ -n "$c" ] && timeout 60 nvme disconnect -d "$c" > /dev/null 2>&1
    refused=$(tail -n +"$((mark + 1))" "$LOG" | grep -c "completion queue of reactor 0 on .* is full")
    # The refused controller's QPs give their CQ entries back first.
    qpairs_drained
    c2=$(rconnect --nr-io-queues=1)
    if [ -n "$c" ]; then
        why="a second I/O queue was accepted on a full CQ"
    elif [ "$refused" = 0 ]; then
        why="no 'completion queue ... is full' line in kvtarget.log: $(tail -n +"$((mark + 1))" "$LOG" | grep -i refused | tail -n 1)"
    elif [ -z "$c2" ]; then
        why="a controller with one I/O queue (fits) was not accepted afterwards"
    elif ! kill -0 "$kv_pid" 2>/dev/null; then
        why="kvtarget died"
    else
        ok=1
        echo "# $(tail -n +"$((mark + 1))" "$LOG" | grep -m1 'is full' | sed 's/.*RDMA connect refused: //' | cut -c1-200)"
    fi
    [ -n "$c2" ] && timeout 60 nvme disconnect -d "$c2" > /dev/null 2>&1
    kv_stop || { ok=0; why="${why:+$why; }exit status after SIGTERM: $KV_STOP_STATUS"; }
fi
CFG=$CFG_SAVED
check rdma-cq-full-refused "$ok" "$why"

echo "$((sp + P)) passed, $((sf + F)) failed, $ss skipped"
[ $((sf + F)) = 0 ]
