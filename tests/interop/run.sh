#!/usr/bin/env bash
# Host-side orchestrator of the NVMe/TCP interop suite.
#
# For each target:
#   kvtarget  starts $KVTARGET_BIN on the host (127.0.0.1:4420, discovery 8009; its
#             namespaces are thin volumes of one pool file in a temp dir, see VOLUMES),
#             boots the guest running tcp-suite.sh against 10.0.2.2 (the host's
#             127.0.0.1 as ci/guest/run.sh's tap link or slirp presents it), serves the suite's restart requests over the 9p
#             share, stops kvtarget at the end and checks the pool offline
#             (kvtarget check).
#   kernel    boots the guest, sets up the guest kernel's nvmet as a control target
#             (nvmet-control.sh) and runs the same suite against it on 127.0.0.1; it has
#             no thin volumes, so the suite skips the volume scenarios there.
# Prints each suite's result lines, then one combined "N passed, N failed, N skipped"
# line; exits non-zero when anything failed, naming the failures and showing the
# console tail.
#
# Usage: tests/interop/run.sh [--target kernel|kvtarget|both] [--only REGEX] [--verbose]
# Env:   KVTARGET_BIN (default <repo>/target/release/kvtarget)
#        INTEROP_OUT (default <repo>/.cache/interop/run-<time>; logs and shares)
#        INTEROP_TIMEOUT (per guest boot, seconds; default 1500: the kvtarget boot's
#          scenarios took 609 s in one cold CI run and over 900 s in another, on a
#          machine with hypervisor steal; the bound is there to catch a hang)
#        INTEROP_BACKEND (kvtarget pool backend: uring (default), ram, or spdk-tcp: the
#          pool lives on an AIO bdev of SPDK's own nvmf_tgt, started here on
#          127.0.0.1:4430, reached through kvtarget's `spdk` backend, i.e. SPDK's
#          NVMe/TCP host; needs KVTARGET_BIN built with --features spdk and SPDK_DIR)
#          Another backend than uring runs only the scenarios that reach the pool
#          (POOL_SCENARIOS) unless INTEROP_ALL_SCENARIOS=1 or --only
#        INTEROP_RESTART_SIGNAL (TERM (default) or KILL: how the suite's restarts stop
#          kvtarget; with KILL only what was flushed may survive, which the restart
#          scenarios check)
#        INTEROP_EXPECTED_SKIPS_kvtarget, INTEROP_EXPECTED_SKIPS_kernel (when set: the
#          scenarios that target may skip; any other skip is a failure)
#        SPDK_DIR (an SPDK v25.09 build, as `eval "$(ci/spdk.sh)"` exports; else the
#          finished cached build in SPDK_CACHE, default <repo>/.cache/spdk, if any; never
#          built here): its nvmf_tgt runs beside kvtarget as the control target of the
#          reservation scenarios (*-spdk-control; Linux 6.1's nvmet has no
#          reservations), reported skipped without it
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
target=both only= verbose=
while [ $# -gt 0 ]; do
    case "$1" in
        --target) target=$2; shift 2 ;;
        --only) only=$2; shift 2 ;;
        --verbose) verbose=--verbose; shift ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "interop: unknown argument $1" >&2; exit 2 ;;
    esac
done
case "$target" in kernel|kvtarget|both) ;; *) echo "interop: --target kernel|kvtarget|both" >&2; exit 2 ;; esac

NQN=nqn.2026-11.io.kvtarget:interop
HOSTNQN=nqn.2026-11.io.kvtarget:interop-host
# A second host entry on kvtarget's subsystem, with a DH-HMAC-CHAP key: the guest's
# Linux 6.1 has no in-band authentication, so it must be refused cleanly as this
# host (auth-required-refused) while HOSTNQN, without a key, connects as before.
AUTH_HOSTNQN=nqn.2026-12.io.kvtarget:interop-auth-host
# kvtarget only: a second subsystem with one block namespace (NSID 1) and one KV
# namespace (NSID 2, NVMe Key Value command set) for kv-namespace.
KV_NQN=nqn.2026-12.io.kvtarget:interop-kv
# kvtarget only: a subsystem with ANA reporting reachable on PORT and MP_PORT (two
# paths), its NSID 1 a thin volume, for ana-multipath.
MP_NQN=nqn.2026-12.io.kvtarget:interop-mp
MP_PORT=4432
# kvtarget only: a one-namespace subsystem two hosts may use (HOSTNQN and
# RESV_HOSTNQN), its registrations persisting in a PTPL file, for reservations and
# reservation-ptpl-kill (Linux 6.1's nvmet has no reservations).
RESV_NQN=nqn.2026-12.io.kvtarget:interop-resv
RESV_HOSTNQN=nqn.2026-12.io.kvtarget:interop-resv-host2
HOSTID=6b7a7f1e-0c1d-4d2e-9a41-6b7674000001
PORT=4420
DISC_PORT=8009
# kvtarget also listens here with secure_channel (TLS 1.3 only): the guest's Linux
# 6.1 has no NVMe/TCP TLS, so its plaintext connect must be refused cleanly
# (tls-required-refused).
TLS_PORT=4431
SIZE_MIB=256
BLOCK=4096
# kvtarget's namespaces: thin volumes of one pool, NSID:SIZE_MIB:BLOCK_SIZE:UNWRITTEN[:wt].
# NSID 1 carries the common scenarios; 2 and 3 the volume scenarios (tcp-suite.sh); 4 is
# LMCache's raw-block device (lmcache-raw-block), "wt": its namespace has no volatile
# write cache (write_cache = false), the configuration docs/lmcache.md gives LMCache; 5 is the
# same with the volatile cache, crashed with SIGKILL (lmcache-volatile-kill).
VOLUMES="1:$SIZE_MIB:$BLOCK:zeroes 2:64:4096:zeroes 3:64:512:error 4:512:4096:error:wt 5:512:4096:error"
POOL_MIB=$((SIZE_MIB + 1536))
KV_SERIAL=KVTINTEROP0001
KV_MODEL=kvtarget
timeout_s=${INTEROP_TIMEOUT:-1500}
backend=${INTEROP_BACKEND:-uring}
restart_signal=${INTEROP_RESTART_SIGNAL:-TERM}
# The scenarios whose I/O reaches the pool, i.e. depend on its backend. With another
# backend than the default only these run (unless --only or INTEROP_ALL_SCENARIOS=1
# says otherwise): discovery, connect, digests, keep-alive, authentication, TLS,
# reservations, ANA and the cluster take the same code whatever holds the pool, and
# ci/test.sh has run them against the uring backend in the boot before (one guest
# boot's worth of CI time, about 3 minutes, kept for the scenarios that differ).
POOL_SCENARIOS='^(connect-1-io-queue|nvme-list|nvme-id-ns|nvme-smart-log|fio-verify-.*|dd-sha256|flush|blkdiscard.*|disconnect-reconnect|target-restart|several-namespaces|nuse-tracks-writes-and-discard|unwritten-error-volume|volume-data-survives-restart|namespace-hot-add-remove|bench-fio-profiles|lmcache-.*|kv-namespace)$'
if [ "$backend" != uring ] && [ -z "$only" ] && [ "${INTEROP_ALL_SCENARIOS:-0}" != 1 ]; then
    only=$POOL_SCENARIOS
    echo "interop: pool backend $backend: the scenarios that reach the pool only (INTEROP_ALL_SCENARIOS=1 runs all)" >&2
fi
case "$restart_signal" in TERM|KILL) ;; *) echo "interop: INTEROP_RESTART_SIGNAL must be TERM or KILL" >&2; exit 2 ;; esac
SPDK_TGT_PORT=4430
SPDK_TGT_NQN=nqn.2016-06.io.spdk:interop-pool
# The reservation scenarios' control target (kvtarget boot only): SPDK's nvmf_tgt on the
# host, one 64 MiB AIO namespace (a file) with a fixed UUID (its PTPL file names the namespace
# by it, so a restart finds its registrations), both reservation hosts allowed, two
# listeners (the second host connects through the second one, as with kvtarget).
CTL_RESV_NQN=nqn.2016-06.io.spdk:interop-resv
CTL_RESV_PORT=4433
CTL_RESV_PORT2=4434
CTL_RESV_UUID=6b7a7f1e-0c1d-4d2e-9a41-6b76740e5e01
CTL_SCENARIOS="reservations-spdk-control reservation-ptpl-kill-spdk-control"
# kvtarget boot only: two more kvtarget nodes in one etcd cluster (Debian's etcd-server,
# three members on the host), each with a discovery port, for cluster-referrals: the guest's
# `nvme discover` at either node must show a referral to the other, and none once the
# other is dead (SIGKILL, then its 2 s lease ends).
CL_ETCD_PORT=2479
CL_B_PORT=4435 CL_B_DISC=8010
CL_C_PORT=4436 CL_C_DISC=8011
# etcd runs as three members (client ports 2479, 2481, 2483; each peer port the next)
# so that cluster-failover can kill its leader and the cluster carries on with two.
CL_ETCD_PORTS="2479 2481 2483"
CL_ETCD_ENDPOINTS=$(for p in $CL_ETCD_PORTS; do printf '"http://127.0.0.1:%s",' "$p"; done)
CL_ETCD_ENDPOINTS=${CL_ETCD_ENDPOINTS%,}
# cluster-failover: three more nodes (fo-PORT) sharing one pool file, one cluster-wide
# subsystem whose NSID 1 is a write-through block volume of that pool; the guest
# connects all three paths and runs fio verify while the host SIGKILLs the owner,
# SIGSTOPs the next one for twice the lease, and kills etcd's leader.
CL_FO_NQN=nqn.2026-12.io.kvtarget:interop-failover
CL_FO_PORTS="4437 4438 4439"
CL_FO_TTL=2
spdk_dir=${SPDK_DIR:-}
if [ -z "$spdk_dir" ] && [ -f "${SPDK_CACHE:-$repo/.cache/spdk}/current/.complete" ]; then
    spdk_dir=$(readlink -f "${SPDK_CACHE:-$repo/.cache/spdk}/current")/spdk
fi
bin=${KVTARGET_BIN:-$repo/target/release/kvtarget}
case "$bin" in /*) ;; *) bin=$PWD/$bin ;; esac

log() { echo "interop: $*" >&2; }
t_start=$SECONDS

listening() { # PORT
    ss -Hltn "sport = :$1" 2>/dev/null | grep -q .
}
# pick_port VAR: VAR keeps its port when nothing on the host listens there and this run
# has not taken it yet; otherwise it gets a free one from the kernel. No scenario is
# skipped because a port was taken (CI machines run other things).
TAKEN_PORTS=" "
pick_port() {
    local -n var=$1
    local p=$var
    while listening "$p" || [[ $TAKEN_PORTS == *" $p "* ]]; do
        p=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    done
    [ "$p" = "$var" ] || log "port $var is taken on the host: $1=$p"
    var=$p
    TAKEN_PORTS="$TAKEN_PORTS$p "
}
for v in PORT DISC_PORT TLS_PORT MP_PORT SPDK_TGT_PORT CTL_RESV_PORT CTL_RESV_PORT2 \
         CL_B_PORT CL_B_DISC CL_C_PORT CL_C_DISC; do
    pick_port "$v"
done
# etcd's members: a client and a peer port each; cluster-failover's three nodes.
fo_ports= etcd_ports= CL_ETCD_PEER=()
for p in $CL_FO_PORTS; do pick_port p; fo_ports="$fo_ports $p"; done
CL_FO_PORTS=${fo_ports# }
for p in $CL_ETCD_PORTS; do
    pick_port p; etcd_ports="$etcd_ports $p"
    q=$((p + 1)); pick_port q; CL_ETCD_PEER+=("$q")
done
CL_ETCD_PORTS=${etcd_ports# }
CL_ETCD_PORT=${CL_ETCD_PORTS%% *}
CL_ETCD_ENDPOINTS=$(for p in $CL_ETCD_PORTS; do printf '"http://127.0.0.1:%s",' "$p"; done)
CL_ETCD_ENDPOINTS=${CL_ETCD_ENDPOINTS%,}

if [ "$target" != kernel ] && [ ! -x "$bin" ]; then
    log "kvtarget binary not found at $bin (build it with 'cargo build --release', or set KVTARGET_BIN)"
    echo "0 passed, 1 failed, 0 skipped"
    exit 1
fi

out=${INTEROP_OUT:-$repo/.cache/interop/run-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
ln -sfn "$out" "$repo/.cache/interop/latest" 2>/dev/null || true
# Keep the last five runs.
ls -1dt "$repo"/.cache/interop/run-* 2>/dev/null | tail -n +6 | xargs -r rm -rf
log "logs in $out"

# ---- cleanup: kvtarget and QEMU never outlive this script ----------------------------
kv_pid= run_pid= tmpdir= spdk_tgt_pid= ctl_pid= cl_pids=
cleanup() {
    # shellcheck disable=SC2086
    [ -z "$cl_pids" ] || kill -KILL $cl_pids 2>/dev/null
    if [ -n "$spdk_tgt_pid" ] && kill -0 "$spdk_tgt_pid" 2>/dev/null; then
        kill -TERM "$spdk_tgt_pid" 2>/dev/null
        sleep 1
        kill -KILL "$spdk_tgt_pid" 2>/dev/null
    fi
    # The AIO bdevs' backing files are devices, not logs (the pool's is its full size).
    rm -f "$out/kvtarget/spdk-pool.img" "$out/kvtarget/spdk-resv-control.img"
    [ -z "$ctl_pid" ] || kill -KILL "$ctl_pid" 2>/dev/null
    if [ -n "$run_pid" ] && kill -0 "$run_pid" 2>/dev/null; then
        kill -TERM "$run_pid" 2>/dev/null
    fi
    local f
    for f in "$out"/*/qemu.pid; do
        [ -f "$f" ] || continue
        local p; p=$(cat "$f" 2>/dev/null)
        [ -n "$p" ] && kill -KILL "$p" 2>/dev/null
    done
    if [ -n "$kv_pid" ] && kill -0 "$kv_pid" 2>/dev/null; then
        kill -TERM "$kv_pid" 2>/dev/null
        sleep 1
        kill -KILL "$kv_pid" 2>/dev/null
    fi
    [ -z "$tmpdir" ] || rm -rf "$tmpdir"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- guest ------------------------------------------------------------------------
guest=$("$repo/ci/guest/build.sh") || { log "guest build failed"; echo "0 passed, 1 failed, 0 skipped"; exit 1; }
export GUEST_DIR=$guest

# ---- results ------------------------------------------------------------------------
total_pass=0 total_fail=0 total_skip=0 failed_names=() failed_consoles=() summary=()
# collect LABEL SHARE_DIR RC: count the suite's ok/FAIL/skip lines; a suite that did not
# reach its closing line counts as one more failure. Skipped scenarios (the target lacks
# what they test) count neither as passes nor as failures.
collect() {
    local label=$1 share=$2 rc=$3 outlog=$2/guest-output.log p f k
    p=$(grep -c '^ok - ' "$outlog" 2>/dev/null)
    f=$(grep -c '^FAIL - ' "$outlog" 2>/dev/null)
    k=$(grep -c '^skip - ' "$outlog" 2>/dev/null)
    p=${p:-0} f=${f:-0} k=${k:-0}
    while read -r name; do
        failed_names+=("$label/$name")
    done < <(grep '^FAIL - ' "$outlog" 2>/dev/null | sed 's/^FAIL - \([^:]*\):.*/\1/')
    # No silent skip: where the caller lists the scenarios this target is expected to
    # skip (INTEROP_EXPECTED_SKIPS_<label>, ci/jobs.sh does), any other skip fails.
    local expected_var=INTEROP_EXPECTED_SKIPS_$label name expected
    if [ -n "${!expected_var+set}" ]; then
        # shellcheck disable=SC2086 # one space between names, whatever the list had
        expected=" $(echo ${!expected_var}) "
        while read -r name; do
            [ -n "$name" ] || continue
            case "$expected" in *" $name "*) continue ;; esac
            f=$((f + 1)) k=$((k - 1))
            failed_names+=("$label/$name(unexpected-skip)")
            echo "FAIL - $name: skipped, and this target is expected to run it ($expected_var)"
        done < <(grep '^skip - ' "$outlog" 2>/dev/null | sed 's/^skip - \([^:]*\):.*/\1/')
    fi
    if ! grep -qE '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$outlog" 2>/dev/null; then
        f=$((f + 1))
        failed_names+=("$label/suite-did-not-finish(rc=$rc)")
    elif [ "$rc" != 0 ] && [ "$f" = 0 ]; then
        f=$((f + 1))
        failed_names+=("$label/suite-exit-status-$rc")
    fi
    total_pass=$((total_pass + p))
    total_fail=$((total_fail + f))
    total_skip=$((total_skip + k))
    [ "$f" = 0 ] || failed_consoles+=("$share/console.log")
    summary+=("$label: $p passed, $f failed, $k skipped")
}
print_suite() {
    echo "=== $1 ==="
    grep -E '^(ok - |FAIL - |skip - |# tcp-suite|# suite took)' "$2/guest-output.log" 2>/dev/null || echo "(no suite output)"
}

new_share() {
    local share=$out/$1
    rm -rf "$share"
    mkdir -p "$share"
    cp "$here/tcp-suite.sh" "$here/klog-filter.sh" "$here/nvmet-control.sh" \
        "$here/lmcache_scenario.py" "$share/"
    # The io_uring passthrough KV client (kv-namespace), a static binary: built here
    # (seconds; cached in .cache/kv-uring) since the guest has no compiler.
    if CARGO_TARGET_DIR="$repo/.cache/kv-uring" cargo build --release --quiet \
        --manifest-path "$here/kv-uring/Cargo.toml" >&2; then
        cp "$repo/.cache/kv-uring/release/kv-uring" "$share/"
    else
        log "kv-uring did not build: kv-namespace will fail for want of it"
    fi
    # bench/fio's job files, run by the bench-fio-profiles scenario.
    mkdir -p "$share/fio"
    cp "$repo"/bench/fio/*.fio "$share/fio/"
    echo "$share"
}

suite_args() { # ADDR RESTART_MODE SERIAL MODEL [extra...]
    local a="--addr $1 --port $PORT --disc-port $DISC_PORT --nqn $NQN --hostnqn $HOSTNQN --hostid $HOSTID"
    a="$a --size $((SIZE_MIB * 1048576)) --block-size $BLOCK --restart $2 --serial $3 --model $4"
    shift 4
    [ -z "$only" ] || a="$a --only '$only'"
    echo "$a $*"
}

# ---- kvtarget on the host ---------------------------------------------------------
kv_cfg=
kv_start() {
    NO_COLOR=1 "$bin" --config "$kv_cfg" -r "$out/kvtarget/rpc.sock" >> "$out/kvtarget/kvtarget.log" 2>&1 &
    kv_pid=$!
    local i
    for i in $(seq 1 150); do
        if ! kill -0 "$kv_pid" 2>/dev/null; then
            wait "$kv_pid"; local rc=$?
            log "kvtarget exited with status $rc during start-up; log tail:"
            tail -n 20 "$out/kvtarget/kvtarget.log" >&2
            kv_pid=
            return 1
        fi
        listening "$PORT" && listening "$DISC_PORT" && return 0
        sleep 0.2
    done
    log "kvtarget not listening on $PORT and $DISC_PORT after 30s"
    return 1
}
# kv_stop -> KV_STOP_STATUS: exit status after SIGTERM ("timeout" if it had to be killed)
KV_STOP_STATUS=
kv_stop() { # [SIGNAL]: TERM (default; expects exit 0) or KILL (expects 137)
    local sig=${1:-TERM}
    KV_STOP_STATUS=
    [ -n "$kv_pid" ] || { KV_STOP_STATUS=not-running; return 1; }
    if ! kill -0 "$kv_pid" 2>/dev/null; then
        wait "$kv_pid"; KV_STOP_STATUS="already-exited($?)"; kv_pid=; return 1
    fi
    if [ "$sig" = KILL ]; then
        kill -KILL "$kv_pid"; wait "$kv_pid" 2>/dev/null; KV_STOP_STATUS=$?; kv_pid=
        [ "$KV_STOP_STATUS" = 137 ]
        return
    fi
    kill -TERM "$kv_pid"
    local i
    for i in $(seq 1 100); do
        kill -0 "$kv_pid" 2>/dev/null || break
        sleep 0.2
    done
    if kill -0 "$kv_pid" 2>/dev/null; then
        kill -KILL "$kv_pid"; wait "$kv_pid" 2>/dev/null
        KV_STOP_STATUS=timeout; kv_pid=; return 1
    fi
    wait "$kv_pid"; KV_STOP_STATUS=$?; kv_pid=
    [ "$KV_STOP_STATUS" = 0 ]
}

host_checks=()   # "ok - name" / "FAIL - name: reason" lines from the host side
host_check() { # NAME OK? REASON
    if [ "$2" = 1 ]; then host_checks+=("ok - $1"); else host_checks+=("FAIL - $1: $3"); fi
}

# SPDK's nvmf_tgt with an AIO bdev of the pool's size on 127.0.0.1:$SPDK_TGT_PORT:
# the device under kvtarget's pool for INTEROP_BACKEND=spdk-tcp. It outlives
# kvtarget's restarts, as a remote NVMe-oF namespace would. In interrupt mode, on a
# file: a polling nvmf_tgt (or a Malloc bdev, whose completion poller never sleeps)
# took most of a core for the whole boot, away from the TCG guest on this 2-core host.
spdk_tgt_start() {
    local dir=${SPDK_DIR:-} sock=$out/kvtarget/spdk-tgt.sock rpc i
    [ -x "$dir/build/bin/nvmf_tgt" ] || { log "SPDK_DIR=$dir has no build/bin/nvmf_tgt (eval \"\$(ci/spdk.sh)\")"; return 1; }
    "$repo/ci/hugepages.sh" --free 256 >&2 || return 1
    if listening "$SPDK_TGT_PORT"; then log "port $SPDK_TGT_PORT already in use"; return 1; fi
    rm -f "$out/kvtarget/spdk-pool.img"
    truncate -s "${POOL_MIB}M" "$out/kvtarget/spdk-pool.img" || return 1
    "$dir/build/bin/nvmf_tgt" -m 0x1 --no-pci --disable-cpumask-locks --interrupt-mode -r "$sock" \
        > "$out/kvtarget/spdk-tgt.log" 2>&1 &
    spdk_tgt_pid=$!
    for i in $(seq 1 150); do [ -S "$sock" ] && break; sleep 0.2; done
    rpc() { python3 "$dir/scripts/rpc.py" -s "$sock" "$@" >> "$out/kvtarget/spdk-tgt.log" 2>&1; }
    rpc framework_wait_init && rpc nvmf_create_transport -t TCP \
        && rpc bdev_aio_create "$out/kvtarget/spdk-pool.img" Pool0 4096 \
        && rpc nvmf_create_subsystem "$SPDK_TGT_NQN" -a -s SPDKINTEROP01 \
        && rpc nvmf_subsystem_add_ns "$SPDK_TGT_NQN" Pool0 \
        && rpc nvmf_subsystem_add_listener "$SPDK_TGT_NQN" -t tcp -a 127.0.0.1 -s "$SPDK_TGT_PORT" \
        || { log "nvmf_tgt set-up failed; log tail:"; tail -n 20 "$out/kvtarget/spdk-tgt.log" >&2; return 1; }
    log "SPDK nvmf_tgt (pid $spdk_tgt_pid, interrupt mode) serves a ${POOL_MIB} MiB AIO bdev on 127.0.0.1:$SPDK_TGT_PORT"
}

# ---- SPDK's nvmf_tgt: the reservation scenarios' control target ----------------------
# ctl_wanted -> CTL_SKIP: empty when the control should run, else why it does not (the
# suite reports its scenarios skipped with that reason).
CTL_SKIP=
ctl_wanted() {
    local n want=
    for n in $CTL_SCENARIOS; do
        if [ -z "$only" ] || echo "$n" | grep -qE "$only"; then want=1; fi
    done
    if [ -z "$want" ]; then
        CTL_SKIP="not selected by --only"
    elif [ ! -x "$spdk_dir/build/bin/nvmf_tgt" ] || [ ! -f "$spdk_dir/scripts/rpc.py" ]; then
        CTL_SKIP="no SPDK build with nvmf_tgt (SPDK_DIR=${spdk_dir:-unset}, none finished in ${SPDK_CACHE:-$repo/.cache/spdk}; ci/spdk.sh builds one)"
    else
        CTL_SKIP=
    fi
}
ctl_log() { echo "$out/kvtarget/spdk-resv-control.log"; }
ctl_rpc() {
    python3 "$spdk_dir/scripts/rpc.py" -s "$out/kvtarget/spdk-resv-control.sock" "$@" >> "$(ctl_log)" 2>&1
}
# ctl_start: nvmf_tgt on core 0 without hugepages (512 MiB of ordinary memory; it
# serves TCP only) and its set-up RPCs, replayed as they are after a restart. In
# interrupt mode, its namespace an AIO bdev on a file (kept across restarts, as a disk
# is): polling, it took most of a core for the whole kvtarget boot, which the TCG guest
# needs (the boot took 603 s with it polling).
ctl_start() {
    local sock=$out/kvtarget/spdk-resv-control.sock lib=$spdk_dir/build/lib i
    local img=$out/kvtarget/spdk-resv-control.img
    rm -f "$sock"
    [ -e "$img" ] || truncate -s 64M "$img" || return 1
    echo "---- interop: starting nvmf_tgt ----" >> "$(ctl_log)"
    LD_LIBRARY_PATH=$lib:$spdk_dir/isa-l/.libs:$spdk_dir/isa-l-crypto/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
        "$spdk_dir/build/bin/nvmf_tgt" -m 0x1 --no-pci --no-huge -s 512 --disable-cpumask-locks \
        --interrupt-mode -r "$sock" >> "$(ctl_log)" 2>&1 &
    ctl_pid=$!
    for i in $(seq 1 150); do
        [ -S "$sock" ] && break
        kill -0 "$ctl_pid" 2>/dev/null || break
        sleep 0.2
    done
    local a=(-t tcp -a 127.0.0.1 -f ipv4)
    ctl_rpc framework_wait_init && ctl_rpc nvmf_create_transport -t TCP \
        && ctl_rpc bdev_aio_create -u "$CTL_RESV_UUID" "$img" Resv0 4096 \
        && ctl_rpc nvmf_create_subsystem "$CTL_RESV_NQN" -s SPDKINTEROPRESV -m 1 \
        && ctl_rpc nvmf_subsystem_add_host "$CTL_RESV_NQN" "$HOSTNQN" \
        && ctl_rpc nvmf_subsystem_add_host "$CTL_RESV_NQN" "$RESV_HOSTNQN" \
        && ctl_rpc nvmf_subsystem_add_ns "$CTL_RESV_NQN" Resv0 -n 1 -p "$out/kvtarget/spdk-resv-ptpl.json" \
        && ctl_rpc nvmf_subsystem_add_listener "$CTL_RESV_NQN" "${a[@]}" -s "$CTL_RESV_PORT" \
        && ctl_rpc nvmf_subsystem_add_listener "$CTL_RESV_NQN" "${a[@]}" -s "$CTL_RESV_PORT2" \
        || { log "SPDK nvmf_tgt (reservation control) set-up failed; log tail:"; tail -n 20 "$(ctl_log)" >&2; return 1; }
    log "SPDK nvmf_tgt (pid $ctl_pid, interrupt mode) serves $CTL_RESV_NQN on 127.0.0.1:$CTL_RESV_PORT and :$CTL_RESV_PORT2"
}
# ctl_stop [SIGNAL]: TERM (default) or KILL; true if it was running.
ctl_stop() {
    local sig=${1:-TERM} i
    [ -n "$ctl_pid" ] && kill -0 "$ctl_pid" 2>/dev/null || { ctl_pid=; return 1; }
    kill "-$sig" "$ctl_pid"
    for i in $(seq 1 50); do kill -0 "$ctl_pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$ctl_pid" 2>/dev/null
    wait "$ctl_pid" 2>/dev/null
    ctl_pid=
}
# ctl_restart SHARE SIGNAL: the suite's restart request for the control: stop nvmf_tgt
# with SIGNAL, wait for the guest's resume, start it again and replay its RPCs.
ctl_restarts=0 ctl_restart_ok=1 ctl_restart_reason=
ctl_restart() {
    local share=$1 sig=$2 i
    ctl_restarts=$((ctl_restarts + 1))
    log "restart request for the SPDK control: stopping nvmf_tgt (SIG$sig)"
    echo "---- interop: SIG$sig for restart $ctl_restarts ----" >> "$(ctl_log)"
    if ! ctl_stop "$sig"; then
        ctl_restart_ok=0 ctl_restart_reason="restart $ctl_restarts: nvmf_tgt was not running"
    fi
    echo "stopped (SIG$sig)" > "$share/restart-stopped"
    for i in $(seq 1 300); do [ -e "$share/restart-resume" ] && break; sleep 0.2; done
    if ctl_start; then
        echo "restarted after SIG$sig" > "$share/restart-done"
    else
        ctl_restart_ok=0 ctl_restart_reason="restart $ctl_restarts: nvmf_tgt did not come back (see $(ctl_log))"
        echo "failed" > "$share/restart-done"
    fi
}
# ctl_suite_args: the suite's options for the control (or why its scenarios skip).
# ---- the cluster nodes (cluster-referrals) ------------------------------------------
CL_SKIP= cl_node_c=
cl_node_config() { # NAME PORT DISC_PORT
    cat <<EOF
# Written by tests/interop/run.sh: one node of the cluster-referrals scenario.
[discovery]
port = $3

[[listeners]]
address = "127.0.0.1"
port = $2

[[subsystems]]
nqn = "nqn.2026-12.io.kvtarget:interop-$1"
allow_any_host = true

[[subsystems.namespaces]]
nsid = 1
backend = "ram"
size = "4MiB"

[cluster]
endpoints = [$CL_ETCD_ENDPOINTS]
name = "interop"
node = "$1"
lease_ttl_secs = 2
EOF
}
# cl_fo_config NAME PORT: one node of cluster-failover.
cl_fo_config() {
    cat <<EOF
# Written by tests/interop/run.sh: one node of the cluster-failover scenario.
[[listeners]]
address = "127.0.0.1"
port = $2

[[pools]]
name = "shared"
backend = "uring"
path = "$out/cluster/failover.pool"
size = "320MiB"
shared = true

[[pools.volumes]]
name = "blocks"
size = "128MiB"

[[subsystems]]
nqn = "$CL_FO_NQN"
allow_any_host = true
ana_reporting = true
cluster_wide = true

[[subsystems.namespaces]]
nsid = 1
volume = "shared/blocks"
write_cache = false

[cluster]
endpoints = [$CL_ETCD_ENDPOINTS]
name = "interop"
node = "$1"
lease_ttl_secs = $CL_FO_TTL
EOF
}
declare -A cl_etcd_pid=() cl_fo_pid=()
# cl_etcd_start: three members on 127.0.0.1 (client port P, peer port P+1); true once a
# write goes through (a leader is elected).
cl_etcd_start() {
    local dir=$out/cluster p initial= i=0 peer
    for p in $CL_ETCD_PORTS; do
        initial="${initial:+$initial,}etcd-$p=http://127.0.0.1:${CL_ETCD_PEER[$i]}"; i=$((i + 1))
    done
    i=0
    for p in $CL_ETCD_PORTS; do
        peer=${CL_ETCD_PEER[$i]}; i=$((i + 1))
        etcd --name="etcd-$p" --data-dir="$dir/etcd-$p" \
            --listen-client-urls="http://127.0.0.1:$p" --advertise-client-urls="http://127.0.0.1:$p" \
            --listen-peer-urls="http://127.0.0.1:$peer" --initial-advertise-peer-urls="http://127.0.0.1:$peer" \
            --initial-cluster="$initial" --initial-cluster-state=new > "$dir/etcd-$p.log" 2>&1 &
        cl_etcd_pid[$p]=$!
        cl_pids="$cl_pids $!"
    done
    for i in $(seq 1 100); do
        curl -sf -X POST "http://127.0.0.1:$CL_ETCD_PORT/v3/kv/put" \
            -d '{"key":"aW50ZXJvcA==","value":"MQ=="}' >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    return 1
}
# cl_etcd_leader -> the client port of etcd's leader member (empty if none answers).
cl_etcd_leader() {
    local p st
    for p in $CL_ETCD_PORTS; do
        st=$(curl -sf -X POST "http://127.0.0.1:$p/v3/maintenance/status" -d '{}') || continue
        [ "$(echo "$st" | jq -r '.header.member_id == .leader')" = true ] && { echo "$p"; return 0; }
    done
}
# cl_request SHARE: the suite's cluster request. "KILL node-c" (cluster-referrals)
# ends node C as a crash would; "KILL PORT", "STOP PORT SECS" (SIGSTOP, then SIGCONT
# SECS later) and "KILL-ETCD-LEADER" act on cluster-failover's nodes and etcd. The
# answer in cluster-done: what was done, or "failed: why".
cl_request() {
    local share=$1 verb arg secs pid answer p
    read -r verb arg secs < "$share/cluster-request"
    rm -f "$share/cluster-request"
    log "cluster request: $verb $arg $secs"
    case "$verb" in
        KILL-ETCD-LEADER)
            p=$(cl_etcd_leader)
            pid=${cl_etcd_pid[${p:-none}]:-}
            arg="etcd member $p" ;;
        *) if [ "$arg" = node-c ]; then pid=$cl_node_c; else pid=${cl_fo_pid[$arg]:-}; fi ;;
    esac
    if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
        answer="failed: no live process for '$verb $arg'"
    elif [ "$verb" = STOP ]; then
        kill -STOP "$pid"; sleep "$secs"; kill -CONT "$pid"
        answer="stopped $arg for $secs s, continued"
    else
        kill -KILL "$pid"
        answer="killed $arg"
    fi
    log "cluster request: $answer"
    echo "$answer" > "$share/cluster-done.tmp" && mv "$share/cluster-done.tmp" "$share/cluster-done"
}
cl_start() {
    local dir=$out/cluster p i name
    mkdir -p "$dir"
    if [ -n "$only" ] && ! printf 'cluster-referrals\ncluster-failover\n' | grep -qE "$only"; then
        CL_SKIP="not selected by --only"; return
    fi
    if ! command -v etcd >/dev/null; then
        CL_SKIP="no etcd on the host (Debian: apt-get install etcd-server)"; return
    fi
    if ! cl_etcd_start; then
        CL_SKIP="etcd's three members did not elect a leader (see $dir/etcd-*.log)"
        host_check cluster-nodes-start 0 "$CL_SKIP"
        return
    fi
    for p in $CL_FO_PORTS; do
        name=fo-$p
        cl_fo_config "$name" "$p" > "$dir/$name.toml"
        NO_COLOR=1 "$bin" --config "$dir/$name.toml" -r "$dir/$name.sock" > "$dir/$name.log" 2>&1 &
        cl_fo_pid[$p]=$!
        cl_pids="$cl_pids $!"
    done
    for name in node-b node-c; do
        if [ $name = node-b ]; then p="$CL_B_PORT $CL_B_DISC"; else p="$CL_C_PORT $CL_C_DISC"; fi
        # shellcheck disable=SC2086
        cl_node_config $name $p > "$dir/$name.toml"
        NO_COLOR=1 "$bin" --config "$dir/$name.toml" -r "$dir/$name.sock" > "$dir/$name.log" 2>&1 &
        cl_pids="$cl_pids $!"
        [ $name = node-c ] && cl_node_c=$!
    done
    for i in $(seq 1 150); do
        if listening "$CL_B_DISC" && listening "$CL_C_DISC"; then
            for p in $CL_FO_PORTS; do listening "$p" || continue 2; done
            return
        fi
        sleep 0.2
    done
    CL_SKIP="the cluster nodes did not start (see $dir/node-b.log, node-c.log, fo-*.log, etcd-*.log)"
    host_check cluster-nodes-start 0 "$CL_SKIP"
}
cl_suite_args() {
    if [ -n "$CL_SKIP" ]; then
        echo "--cluster-skip '$CL_SKIP'"
    else
        echo "--cluster-disc '$CL_B_DISC $CL_C_DISC' --cluster-fo '$CL_FO_PORTS' --cluster-fo-nqn $CL_FO_NQN --cluster-fo-ttl $CL_FO_TTL"
    fi
}

ctl_suite_args() {
    if [ -n "$CTL_SKIP" ]; then
        echo "--resv-ctl-skip '$CTL_SKIP'"
    else
        echo "--resv-ctl-nqn $CTL_RESV_NQN --resv-ctl-port $CTL_RESV_PORT --resv-ctl-port2 $CTL_RESV_PORT2"
    fi
}

run_kvtarget() {
    mkdir -p "$out/kvtarget"
    : > "$out/kvtarget/kvtarget.log"
    tmpdir=$(mktemp -d /tmp/kvtarget-interop.XXXXXX)
    pool_file=
    case "$backend" in
        ram) ;;
        spdk-tcp)
            if ! spdk_tgt_start; then
                host_check spdk-nvmf-tgt-start 0 "SPDK's nvmf_tgt did not start (see $out/kvtarget/spdk-tgt.log)"
                return
            fi ;;
        *) pool_file=$tmpdir/pool.img ;;
    esac
    local pool_backend=$backend pool_where
    if [ "$backend" = spdk-tcp ]; then
        pool_backend=spdk
        pool_where="trid = \"trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$SPDK_TGT_PORT subnqn:$SPDK_TGT_NQN\""
    else
        pool_where=$( [ -z "$pool_file" ] || echo "path = \"$pool_file\""; echo "size = \"${POOL_MIB}MiB\"")
    fi
    kv_cfg=$out/kvtarget/kvtarget.toml
    {
    cat <<EOF
# Written by tests/interop/run.sh
[reactors]
count = 2
idle = "adaptive"

[discovery]
port = $DISC_PORT

# MDTS 32 MiB: the kernel does not split passthrough commands, so a KV value is
# at most one command (kv-namespace stores 32 MiB values); block I/O is still
# split at max_sectors_kb (1280 KiB on 6.1).
[tcp]
max_io_size = "32MiB"

[[listeners]]
address = "127.0.0.1"
port = $PORT

[[listeners]]
address = "127.0.0.1"
port = $TLS_PORT
secure_channel = true

[[listeners]]
address = "127.0.0.1"
port = $MP_PORT

# One pool; thin provisioning lets the volumes add up to more than it, but the
# suite's writes stay well within it.
[[pools]]
name = "interop"
backend = "$pool_backend"
$pool_where
extent_size = "1MiB"
# New extent mappings are committed by a Flush (or FUA, or the metadata thread's own
# work), at the latest after a minute: longer than any scenario, so what a SIGKILL
# loses without a Flush is lost every time (lmcache-volatile-kill).
commit_interval_ms = 60000
EOF
    local v n m b u
    for v in $VOLUMES; do
        IFS=: read -r n m b u _ <<< "$v"
        printf '\n[[pools.volumes]]\nname = "ns%s"\nsize = "%sMiB"\nblock_size = %s\nunwritten = "%s"\n' "$n" "$m" "$b" "$u"
    done
    # The key in nvme-cli's DHHC-1 format (32 random bytes and their CRC-32),
    # readable by its owner only, as kvtarget requires of key files.
    local auth_key=$out/kvtarget/interop-auth.key
    (umask 077; python3 -c 'import base64, os, zlib; k = os.urandom(32)
print("DHHC-1:00:" + base64.b64encode(k + zlib.crc32(k).to_bytes(4, "little")).decode() + ":")' > "$auth_key")
    cat <<EOF

[[keys]]
name = "interop-auth"
path = "$auth_key"

[[subsystems]]
nqn = "$NQN"
serial = "$KV_SERIAL"
model = "$KV_MODEL"
allow_any_host = false
hosts = ["$HOSTNQN", { nqn = "$AUTH_HOSTNQN", dhchap_key = "interop-auth" }]
EOF
    for v in $VOLUMES; do
        IFS=: read -r n m b u w <<< "$v"
        printf '\n[[subsystems.namespaces]]\nnsid = %s\nvolume = "interop/ns%s"\n' "$n" "$n"
        [ "$w" = wt ] && printf 'write_cache = false\n'
    done
    cat <<EOF

[[pools.volumes]]
name = "kv-blocks"
size = "16MiB"

[[pools.volumes]]
name = "kv-cache"
size = "128MiB"
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
size = "128MiB"

[[subsystems]]
nqn = "$MP_NQN"
serial = "KVTINTEROPMP01"
allow_any_host = false
hosts = ["$HOSTNQN"]
ana_reporting = true
listen = ["127.0.0.1:$PORT", "127.0.0.1:$MP_PORT"]

[[subsystems.namespaces]]
nsid = 1
volume = "interop/mp"

[[pools.volumes]]
name = "resv"
size = "64MiB"

[[subsystems]]
nqn = "$RESV_NQN"
serial = "KVTINTEROPRESV1"
allow_any_host = false
hosts = ["$HOSTNQN", "$RESV_HOSTNQN"]

[[subsystems.namespaces]]
nsid = 1
volume = "interop/resv"
ptpl_file = "$out/kvtarget/resv-ptpl.json"
EOF
    } > "$kv_cfg"
    if ! "$bin" check-config "$kv_cfg" >> "$out/kvtarget/kvtarget.log" 2>&1; then
        log "kvtarget rejects the generated config $kv_cfg: $(tail -n 1 "$out/kvtarget/kvtarget.log")"
        host_check kvtarget-config 0 "kvtarget check-config rejects $kv_cfg"
        return
    fi
    if listening "$PORT" || listening "$DISC_PORT" || listening "$TLS_PORT" || listening "$MP_PORT"; then
        log "port $PORT, $DISC_PORT or $TLS_PORT already in use on the host: $(ss -Hltnp "( sport = :$PORT or sport = :$DISC_PORT or sport = :$TLS_PORT )" | tr '\n' ' ')"
        host_check kvtarget-start 0 "port $PORT, $DISC_PORT or $TLS_PORT already in use"
        return
    fi
    log "starting kvtarget: $bin --config $kv_cfg"
    if ! kv_start; then
        host_check kvtarget-start 0 "kvtarget did not start listening (see $out/kvtarget/kvtarget.log)"
        return
    fi
    ctl_wanted
    if [ -z "$CTL_SKIP" ] && { listening "$CTL_RESV_PORT" || listening "$CTL_RESV_PORT2"; }; then
        host_check spdk-resv-control-start 0 "port $CTL_RESV_PORT or $CTL_RESV_PORT2 already in use"
        CTL_SKIP="its ports $CTL_RESV_PORT/$CTL_RESV_PORT2 were in use on the host"
    elif [ -z "$CTL_SKIP" ] && ! ctl_start; then
        ctl_stop KILL
        host_check spdk-resv-control-start 0 "SPDK's nvmf_tgt did not start (see $(ctl_log))"
        CTL_SKIP="SPDK's nvmf_tgt did not start on the host (see spdk-resv-control.log)"
    fi
    [ -z "$CTL_SKIP" ] || log "reservation control scenarios skipped: $CTL_SKIP"
    cl_start
    [ -z "$CL_SKIP" ] || log "cluster-referrals skipped: $CL_SKIP"
    local share
    share=$(new_share kvtarget/share)
    echo "exec bash /mnt/share/tcp-suite.sh $(suite_args 10.0.2.2 share "$KV_SERIAL" "$KV_MODEL" --advertised-addr 127.0.0.1 --disc-port-svc $PORT --volumes "'$VOLUMES'" --auth-hostnqn "$AUTH_HOSTNQN" --tls-port "$TLS_PORT" --kv-nqn "$KV_NQN" --mp-nqn "$MP_NQN" --mp-port "$MP_PORT" --resv-nqn "$RESV_NQN" --resv-hostnqn "$RESV_HOSTNQN" --resv-port2 "$MP_PORT" --resv-ptpl $(ctl_suite_args) $(cl_suite_args))" \
        > "$share/run-suite.sh"
    log "booting the guest against kvtarget (timeout ${timeout_s}s)"
    "$repo/ci/guest/run.sh" --share "$share" --script run-suite.sh --timeout "$timeout_s" \
        --pidfile "$out/kvtarget/qemu.pid" $verbose 2> "$out/kvtarget/guest-run.log" &
    run_pid=$!
    local restarts=0 restart_ok=1 restart_reason=
    while kill -0 "$run_pid" 2>/dev/null; do
        if [ -e "$share/rpc-request" ]; then
            # The suite asks for a live change (JSON-RPC through kvtarget's CLI);
            # the answer is the exit status, then the output.
            local req rc_rpc out_rpc
            req=$(cat "$share/rpc-request"); rm -f "$share/rpc-request"
            log "rpc request: $req"
            # shellcheck disable=SC2086
            out_rpc=$("$bin" rpc -r "$out/kvtarget/rpc.sock" --json $req 2>&1); rc_rpc=$?
            echo "---- interop: rpc $req -> $rc_rpc ----" >> "$out/kvtarget/kvtarget.log"
            { echo "$rc_rpc"; echo "$out_rpc"; } > "$share/rpc-response.tmp"
            mv "$share/rpc-response.tmp" "$share/rpc-response"
        fi
        if [ -e "$share/cluster-request" ]; then
            cl_request "$share"
        fi
        if [ -e "$share/restart-request" ]; then
            # "NQN" restarts with the run's signal, "NQN KILL" asks for a crash; the NQN
            # names the target: the control's restarts its nvmf_tgt, any other kvtarget.
            local sig=$restart_signal req_nqn req_sig
            read -r req_nqn req_sig < "$share/restart-request"
            [ "$req_sig" = KILL ] && sig=KILL
            rm -f "$share/restart-request"
            if [ "$req_nqn" = "$CTL_RESV_NQN" ]; then
                ctl_restart "$share" "$sig"
                continue
            fi
            restarts=$((restarts + 1))
            log "restart request $restarts: stopping kvtarget (SIG$sig)"
            echo "---- interop: SIG$sig for restart $restarts ----" >> "$out/kvtarget/kvtarget.log"
            if ! kv_stop "$sig"; then
                restart_ok=0
                restart_reason="restart $restarts: kvtarget did not stop as expected on SIG$sig (status $KV_STOP_STATUS)"
            fi
            echo "stopped, status $KV_STOP_STATUS" > "$share/restart-stopped"
            local i
            for i in $(seq 1 300); do [ -e "$share/restart-resume" ] && break; sleep 0.2; done
            echo "---- interop: start after restart $restarts ----" >> "$out/kvtarget/kvtarget.log"
            if kv_start; then
                echo "restarted after SIG$sig" > "$share/restart-done"
                log "kvtarget restarted"
            else
                restart_ok=0
                restart_reason="restart $restarts: kvtarget did not come back"
                echo "failed" > "$share/restart-done"
            fi
        fi
        sleep 0.2
    done
    wait "$run_pid"; local rc=$?
    run_pid=
    cat "$out/kvtarget/guest-run.log" >&2
    if [ -z "$CTL_SKIP" ]; then
        local ctl_alive=0
        ctl_stop TERM && ctl_alive=1
        host_check spdk-resv-control-alive-after-suite "$ctl_alive" "SPDK's nvmf_tgt is no longer running (see $(ctl_log))"
        [ "$ctl_restarts" = 0 ] || host_check spdk-resv-control-restart "$ctl_restart_ok" "$ctl_restart_reason"
    fi
    local alive=0
    [ -n "$kv_pid" ] && kill -0 "$kv_pid" 2>/dev/null && alive=1
    host_check kvtarget-alive-after-suite "$alive" "kvtarget is no longer running (see $out/kvtarget/kvtarget.log)"
    if [ "$restarts" -gt 0 ]; then
        host_check "kvtarget-restart-on-sig$(echo "$restart_signal" | tr 'A-Z' 'a-z')" "$restart_ok" "$restart_reason"
    fi
    if [ "$alive" = 0 ] && [ -n "$kv_pid" ]; then
        kv_stop   # reap it, so that the pool is known to be offline
    fi
    if [ "$alive" = 1 ]; then
        kv_stop
        host_check kvtarget-sigterm-exit-0 "$([ "$KV_STOP_STATUS" = 0 ] && echo 1 || echo 0)" \
            "kvtarget exit status after SIGTERM: $KV_STOP_STATUS"
    fi
    # The pool, offline now, must be consistent after everything the suite did (writes,
    # deallocations, restarts). A RAM pool is gone with the process.
    if [ -n "$pool_file" ] && [ -z "$kv_pid" ]; then
        local crc
        "$bin" check "$pool_file" > "$out/kvtarget/pool-check.log" 2>&1; crc=$?
        host_check kvtarget-pool-check "$([ "$crc" = 0 ] && echo 1 || echo 0)" \
            "kvtarget check $pool_file exited $crc: $(grep -m3 -E 'DAMAGE|damaged|error' "$out/kvtarget/pool-check.log" | tr '\n' ' ') (see $out/kvtarget/pool-check.log)"
        { echo "---- kvtarget pool info (after check) ----"; "$bin" pool info "$pool_file" 2>&1; } >> "$out/kvtarget/pool-check.log"
    fi
    # cluster-failover's shared pool, every node SIGKILLed as a crash would end them:
    # after three owners (a kill, a pause, etcd's leader lost) it must be consistent.
    if [ -z "$CL_SKIP" ] && [ -e "$out/cluster/failover.pool" ]; then
        local p crc
        for p in $CL_FO_PORTS; do kill -KILL "${cl_fo_pid[$p]}" 2>/dev/null; wait "${cl_fo_pid[$p]}" 2>/dev/null; done
        "$bin" check "$out/cluster/failover.pool" > "$out/cluster/failover-check.log" 2>&1; crc=$?
        host_check cluster-failover-pool-check "$([ "$crc" = 0 ] && echo 1 || echo 0)" \
            "kvtarget check of the shared pool exited $crc: $(grep -m3 -E 'DAMAGE|damaged|error' "$out/cluster/failover-check.log" | tr '\n' ' ') (see $out/cluster/failover-check.log)"
    fi
    KV_RC=$rc
}

run_kernel() {
    mkdir -p "$out/kernel"
    local share
    share=$(new_share kernel/share)
    {
        echo "set -e"
        echo "bash /mnt/share/nvmet-control.sh --nqn $NQN --hostnqn $HOSTNQN --addr 127.0.0.1 --port $PORT --disc-port $DISC_PORT --size $((SIZE_MIB * 1048576))"
        echo "exec bash /mnt/share/tcp-suite.sh $(suite_args 127.0.0.1 nvmet KVTCONTROL0001 kvtarget-control --disc-port-svc $DISC_PORT)"
    } > "$share/run-suite.sh"
    log "booting the guest against the kernel nvmet control (timeout ${timeout_s}s)"
    # hardened_usercopy=off: Debian 6.1's nvmet-tcp trips the hardened-usercopy check
    # (kernel BUG at mm/usercopy.c, "Kernel memory exposure attempt detected from page
    # alloc") receiving 1 MiB writes; it is a control-target bug that would otherwise
    # kill the guest in fio-verify-1m.
    # In the background, so that a signal to this script is handled at once (bash
    # runs traps only after a foreground child returns).
    "$repo/ci/guest/run.sh" --share "$share" --script run-suite.sh --timeout "$timeout_s" \
        --append hardened_usercopy=off --pidfile "$out/kernel/qemu.pid" $verbose \
        2> "$out/kernel/guest-run.log" &
    run_pid=$!
    wait "$run_pid"; local rc=$?
    run_pid=
    cat "$out/kernel/guest-run.log" >&2
    KERNEL_RC=$rc
}

if [ "$target" = kvtarget ] || [ "$target" = both ]; then
    t0=$SECONDS
    KV_RC=none
    run_kvtarget
    echo
    if [ -f "$out/kvtarget/share/guest-output.log" ]; then
        print_suite "kvtarget (host, via 10.0.2.2:$PORT)" "$out/kvtarget/share"
        collect kvtarget "$out/kvtarget/share" "$KV_RC"
    else
        echo "=== kvtarget ==="
        summary+=("kvtarget: 0 passed, 0 failed (guest not run)")
    fi
    [ ! -f "$out/kvtarget/pool-check.log" ] || sed -n '/^extents:/p; /^volume /p' "$out/kvtarget/pool-check.log" | sed 's/^/# pool: /'
    for l in "${host_checks[@]}"; do
        echo "$l"
        case "$l" in
            ok*) total_pass=$((total_pass + 1)) ;;
            *) total_fail=$((total_fail + 1)); failed_names+=("kvtarget/$(echo "$l" | sed 's/^FAIL - \([^:]*\):.*/\1/')") ;;
        esac
    done
    echo "# kvtarget took $((SECONDS - t0)) s; log $out/kvtarget/kvtarget.log"
fi
if [ "$target" = kernel ] || [ "$target" = both ]; then
    t0=$SECONDS
    run_kernel
    echo
    print_suite "kernel nvmet control (in the guest, 127.0.0.1:$PORT)" "$out/kernel/share"
    collect kernel "$out/kernel/share" "$KERNEL_RC"
    echo "# kernel took $((SECONDS - t0)) s"
fi

echo
echo "=== summary ($((SECONDS - t_start)) s, logs in $out) ==="
for s in "${summary[@]}"; do echo "# $s"; done
if [ "$total_fail" -gt 0 ]; then
    echo "# failed:"
    for n in "${failed_names[@]}"; do echo "#   $n"; done
    for c in "${failed_consoles[@]}"; do
        echo "# ---- console tail: $c ----"
        tail -n 40 "$c" | sed 's/^/# | /'
    done
    if [ -f "$out/kvtarget/kvtarget.log" ] && printf '%s\n' "${failed_names[@]}" | grep -q '^kvtarget/'; then
        echo "# ---- kvtarget log tail: $out/kvtarget/kvtarget.log ----"
        tail -n 30 "$out/kvtarget/kvtarget.log" | sed 's/\x1b\[[0-9;]*m//g; s/^/# | /'
    fi
fi
echo "$total_pass passed, $total_fail failed, $total_skip skipped"
[ "$total_fail" = 0 ]
