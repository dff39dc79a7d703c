#!/usr/bin/env bash
# ANA multipath against SPDK v25.09's own host (bdev_nvme with two paths under bdevperf
# verify), with SPDK's nvmf_tgt as the control: both targets are configured by the
# same scripts/rpc.py calls, and every case must end the same way on both.
#
#   configure          nvmf_create_subsystem --ana-reporting, a namespace, two TCP
#                      listeners (two ports); nvmf_subsystem_get_listeners shows both
#                      with ana_states
#   failover verify    bdevperf -w verify over one bdev_nvme controller with two paths
#                      (multipath "multipath", reconnecting every second) runs while
#                      the script flips the listeners' ANA states (A inaccessible and
#                      B optimized, both non-optimized, A optimized and B inaccessible),
#                      removes listener A and adds it back: every block written is
#                      read back and compared, no I/O fails, bdevperf exits 0
#   states listed      after each change, nvmf_subsystem_get_listeners reports it
#
# Usage: tests/spdk-tools/multipath.sh     (needs target/release/kvtarget)
# Env:   KVTARGET_BIN, SPDK_CACHE, SPDK_DIR, KEEP_WORK=1 (keep the logs in /tmp),
#        MULTIPATH_SECS (bdevperf run, default 24), MULTIPATH_TARGETS (default "kv spdk")
SUITE=multipath
source "$(dirname "$0")/common.sh"
nqn=nqn.2026-12.io.kvtarget:multipath
secs=${MULTIPATH_SECS:-24}
# Which targets run the cases (both by default; one while debugging either).
targets=${MULTIPATH_TARGETS:-kv spdk}

# --- kvtarget: a RAM pool whose volume is the bdev rpc.py adds as the namespace ---
kv_sock=$work/kv.sock
# (kvtarget needs a listener to start; the subsystem's two come over RPC.)
cat > "$work/kv.toml" <<EOF
[[listeners]]
address = "127.0.0.1"
port = $(free_port)

[[pools]]
name = "mp"
backend = "ram"
size = "256MiB"
extent_size = "1MiB"

[[pools.volumes]]
name = "vol0"
size = "64MiB"
EOF
"$bin" --config "$work/kv.toml" -r "$kv_sock" > "$work/kv.log" 2>&1 &
pids+=($!)
wait_rpc "$kv_sock" $! || die kv-start "not up: $(tail -n 5 "$work/kv.log" | tr '\n' ' ')"

start_spdk_tgt
srpc framework_wait_init > /dev/null 2>&1 && srpc bdev_malloc_create -b mp/vol0 64 4096 > /dev/null 2>&1 \
    || die spdk-configure "bdev_malloc_create: $(tail -n 3 "$work/spdk.log" | tr '\n' ' ')"

declare -A sock_of=([kv]=$kv_sock [spdk]=$work/spdk.sock)
declare -A port_a port_b
rpc_to() { local t=$1; shift; python3 "$rpc_py" -s "${sock_of[$t]}" "$@"; }
listener() { # TARGET PORT: rpc.py's listener arguments
    echo "-t tcp -a 127.0.0.1 -s $2 -f ipv4"
}
for t in $targets; do
    port_a[$t]=$(free_port)
    port_b[$t]=$(free_port)
    # shellcheck disable=SC2046
    {
        rpc_to "$t" nvmf_create_transport -t TCP &&
            rpc_to "$t" nvmf_create_subsystem "$nqn" -a -s SPDK00000000000001 -r &&
            rpc_to "$t" nvmf_subsystem_add_ns "$nqn" mp/vol0 &&
            rpc_to "$t" nvmf_subsystem_add_listener "$nqn" $(listener "$t" "${port_a[$t]}") &&
            rpc_to "$t" nvmf_subsystem_add_listener "$nqn" $(listener "$t" "${port_b[$t]}")
    } > "$work/$t-configure.log" 2>&1 || die "$t-configure" "$(tail -n 3 "$work/$t-configure.log" | tr '\n' ' ')"
done
ok "configure (rpc.py: nvmf_create_subsystem --ana-reporting, two listeners) on both targets"

# states TARGET: "PORT=STATE ..." for group 1 of every listener, sorted by port.
states() {
    rpc_to "$1" nvmf_subsystem_get_listeners "$nqn" 2>/dev/null | python3 -c '
import json, sys
out = []
for l in json.load(sys.stdin):
    st = {s.get("ana_group"): s.get("ana_state") for s in l.get("ana_states", [])}
    out.append((int(l["address"]["trsvcid"]), st.get(1, "?")))
print(" ".join(f"{p}={s}" for p, s in sorted(out)))'
}
# set_state TARGET PORT STATE
set_state() {
    # shellcheck disable=SC2046
    rpc_to "$1" nvmf_subsystem_listener_set_ana_state "$nqn" -n "$3" $(listener "$1" "$2") >> "$work/$1-changes.log" 2>&1
}
expect_states() { # TARGET STATE_A STATE_B WHAT
    local t=$1 want got
    want=$(printf '%s\n' "${port_a[$t]}=$2" "${port_b[$t]}=$3" | sort -t= -k1,1n | tr '\n' ' ' | sed 's/ $//')
    got=$(states "$t")
    if [ "$got" = "$want" ]; then
        ok "$t: $4 listed ($got)"
    else
        bad "$t: $4 listed" "want '$want', got '$got'"
    fi
}
for t in $targets; do expect_states "$t" optimized optimized "both paths optimized at start"; done

# --- bdevperf verify over two paths while the states change ---
bdevperf_json() { # TARGET
    local t=$1 p
    printf '{"subsystems": [{"subsystem": "bdev", "config": [\n'
    printf '  {"method": "bdev_nvme_set_options", "params": {"bdev_retry_count": -1, "transport_retry_count": 4}}'
    for p in "${port_a[$t]}" "${port_b[$t]}"; do
        printf ',\n  {"method": "bdev_nvme_attach_controller", "params": {"name": "mp", "trtype": "tcp",
   "adrfam": "ipv4", "traddr": "127.0.0.1", "trsvcid": "%s", "subnqn": "%s", "multipath": "multipath",
   "ctrlr_loss_timeout_sec": -1, "reconnect_delay_sec": 1}}' "$p" "$nqn"
    done
    printf '\n]}]}\n'
}
changes() { # TARGET: the sequence, 3 s apart, each checked in the listing
    local t=$1 a=${port_a[$1]} b=${port_b[$1]}
    sleep 3
    set_state "$t" "$a" inaccessible && set_state "$t" "$b" optimized
    expect_states "$t" inaccessible optimized "A inaccessible, B optimized"
    sleep 3
    set_state "$t" "$a" non_optimized && set_state "$t" "$b" non_optimized
    expect_states "$t" non_optimized non_optimized "both non-optimized"
    sleep 3
    set_state "$t" "$a" optimized && set_state "$t" "$b" inaccessible
    expect_states "$t" optimized inaccessible "A optimized, B inaccessible"
    sleep 3
    set_state "$t" "$b" optimized
    # shellcheck disable=SC2046
    rpc_to "$t" nvmf_subsystem_remove_listener "$nqn" $(listener "$t" "$a") >> "$work/$t-changes.log" 2>&1 \
        && ok "$t: listener A removed under load" || bad "$t: remove listener A" "$(tail -n 2 "$work/$t-changes.log" | tr '\n' ' ')"
    sleep 3
    # shellcheck disable=SC2046
    rpc_to "$t" nvmf_subsystem_add_listener "$nqn" $(listener "$t" "$a") >> "$work/$t-changes.log" 2>&1 \
        && ok "$t: listener A added back" || bad "$t: add listener A back" "$(tail -n 2 "$work/$t-changes.log" | tr '\n' ' ')"
}
total_col() { tr '\r' '\n' < "$1" | awk -v c="$2" '$1 == "Total" && $2 == ":" { print $c; exit }'; }
for t in $targets; do
    bdevperf_json "$t" > "$work/$t-bdevperf.json"
    "$bdevperf" --json "$work/$t-bdevperf.json" --no-pci --disable-cpumask-locks -m "$host_core" \
        -w verify -q 16 -o 4096 -t "$secs" > "$work/$t-bdevperf.out" 2>&1 &
    bp=$!
    pids+=("$bp")
    changes "$t"
    wait "$bp"
    rc=$?
    out=$work/$t-bdevperf.out
    iops=$(total_col "$out" 3) failed=$(total_col "$out" 5)
    if grep -q 'Buffer mismatch' "$out"; then
        bad "$t: failover verify" "data read back differs: $(grep -m 2 'Buffer mismatch' "$out" | tr '\n' ' ')"
    elif [ "$rc" != 0 ]; then
        bad "$t: failover verify" "bdevperf exit $rc: $(excerpt "$out")"
    elif ! positive "$iops"; then
        bad "$t: failover verify" "no IOPS reported: $(excerpt "$out")"
    elif positive "$failed"; then
        bad "$t: failover verify" "failed I/O ($failed/s): $(excerpt "$out")"
    else
        ok "$t: failover verify over two paths ($iops IOPS, every read compared, 0 failed)"
    fi
done
summary
[ "$fail" = 0 ]
