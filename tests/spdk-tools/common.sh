# Shared by the spdk-tools scripts that run one case list against kvtarget and
# SPDK's nvmf_tgt: results, cleanup, SPDK's tools, and perf's verdicts. Source it
# after setting SUITE (the script's name in messages); it sets repo, bin, work,
# perf, bdevperf, nvmf_tgt, rpc_py.
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bin=${KVTARGET_BIN:-$repo/target/release/kvtarget}
work=$(mktemp -d "/tmp/kvtarget-$SUITE.XXXXXX")
pass=0 fail=0
ok() { echo "ok - $1"; pass=$((pass + 1)); }
bad() { echo "FAIL - $1: $2"; fail=$((fail + 1)); }
summary() { echo "$pass passed, $fail failed"; }
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
    if [ -n "${KEEP_WORK:-}" ] || [ "$fail" != 0 ]; then
        echo "spdk-tools $SUITE: logs kept in $work" >&2
    else
        rm -rf "$work"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
die() { bad "$1" "$2"; summary; exit 1; }

[ -x "$bin" ] || die setup "$bin not built (cargo build --release)"
log() { echo "spdk-tools: $*" >&2; }
source "$repo/ci/lib/debian.sh"
install_debs tools   # nvme-cli (gen-tls-key, DHHC-1 keys)
spdk_env=$("$repo/ci/spdk.sh") || die setup "ci/spdk.sh could not provide SPDK"
eval "$spdk_env"
perf=$SPDK_DIR/build/bin/spdk_nvme_perf
bdevperf=$SPDK_DIR/build/examples/bdevperf
nvmf_tgt=$SPDK_DIR/build/bin/nvmf_tgt
rpc_py=$SPDK_DIR/scripts/rpc.py
for t in "$perf" "$bdevperf" "$nvmf_tgt" "$rpc_py"; do
    [ -e "$t" ] || die setup "SPDK build in $SPDK_DIR has no $t"
done
"$repo/ci/hugepages.sh" || die setup "no hugepages for SPDK"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

wait_rpc() { # SOCKET PID
    for _ in $(seq 150); do
        kill -0 "$2" 2>/dev/null || return 1
        python3 "$rpc_py" -s "$1" -t 2 spdk_get_version >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    return 1
}

# start_spdk_tgt: SPDK's nvmf_tgt on core 0 with a free shared-memory ID (shm_id);
# RPC on $work/spdk.sock, srpc calls it.
start_spdk_tgt() {
    shm_id=$((1000 + $$ % 8000))
    while [ -e "/var/run/dpdk/spdk$shm_id" ] || compgen -G "/dev/hugepages/spdk${shm_id}map_*" >/dev/null; do
        shm_id=$((shm_id + 1))
    done
    "$nvmf_tgt" -m 0x1 -i "$shm_id" -r "$work/spdk.sock" --no-pci > "$work/spdk.log" 2>&1 &
    pids+=($!)
    wait_rpc "$work/spdk.sock" $! || die spdk-start "nvmf_tgt not up: $(tail -n 5 "$work/spdk.log" | tr '\n' ' ')"
}
srpc() { python3 "$rpc_py" -s "$work/spdk.sock" "$@"; }

# run NAME CMD...: output in $work/NAME.out, exit status in RC.
run() {
    local name=$1; shift
    timeout -k 5 120 "$@" > "$work/$name.out" 2>&1
    RC=$?
    OUT=$work/$name.out
}
excerpt() { grep -v '^\s*$' "$1" | tail -n "${2:-4}" | tr '\n' ' ' | cut -c1-500; }
total_iops() { tr '\r' '\n' < "$1" | awk '$1 == "Total" && $2 == ":" { print $3; exit }'; }
positive() { awk -v x="${1:-0}" 'BEGIN { exit !(x + 0 > 0) }'; }
# The scripts' targets: kvtarget on kv_port, nvmf_tgt on spdk_port, subsystem nqn.
trid() { echo "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$1 subnqn:$nqn hostnqn:$2"; }
port_of() { if [ "$1" = kv ]; then echo "$kv_port"; else echo "$spdk_port"; fi; }

# SPDK's host tools poll their core flat out, as nvmf_tgt polls core 0: on that
# core each I/O waits for a time slice (about 20 ms), and a TLS attach for many.
# The tools get core 1 (kvtarget's reactor sleeps when idle and may run on either).
host_core=0x2

# verdict TARGET CASE HOST [perf options]: "attached" or "refused" in V.
verdict() {
    local t=$1 c=$2 h=$3; shift 3
    run "$t-$c" "$perf" -c "$host_core" -q 8 -o 4096 -w randrw -M 50 -t 1 -r "$(trid "$(port_of "$t")" "$h")" "$@"
    if [ "$RC" = 0 ] && positive "$(total_iops "$OUT")" && ! grep -q 'completed with error' "$OUT"; then
        V=attached
    elif grep -q 'No valid NVMe controllers' "$OUT" && ! positive "$(total_iops "$OUT")"; then
        # spdk_nvme_perf exits 0 when no controller attaches.
        V=refused
    else
        V="broken (exit $RC: $(excerpt "$OUT"))"
    fi
}
