#!/usr/bin/env bash
# The `spdk` backend when its controller goes away: kvtarget (built with --features
# spdk) serves a namespace on SPDK's NVMe/TCP host to SPDK's own nvmf_tgt (a Malloc
# bdev on loopback) and, in the same subsystem, a RAM namespace. Under load on both,
# nvmf_tgt is SIGKILLed. Then:
#   - kvtarget is still running and still answers JSON-RPC;
#   - I/O to the SPDK namespace fails with an NVMe error status (not a hang): the
#     load generator reports errors and finishes on time;
#   - the RAM namespace keeps serving verified I/O on a new connection;
#   - the log says once that the SPDK controller failed, and does not flood (device
#     errors are logged once per 4096 on a queue);
#   - kvtarget exits 0 on SIGTERM.
# Prints "ok - ..." / "FAIL - ..." per check and "N passed, N failed".
#
# Usage: tests/spdk-tools/backend-failure.sh   (KVTARGET_BIN: the spdk-feature binary,
#        default target/spdk/release/kvtarget; SPDK from ci/spdk.sh)
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
bin=${KVTARGET_BIN:-$repo/target/spdk/release/kvtarget}
work=$(mktemp -d /tmp/kvtarget-spdk-failure.XXXXXX)
pass=0 fail=0
ok() { echo "ok - $1"; pass=$((pass + 1)); }
bad() { echo "FAIL - $1: $2"; fail=$((fail + 1)); }
tgt_pid= kv_pid=
finish() {
    [ -n "$kv_pid" ] && kill -KILL "$kv_pid" 2>/dev/null
    [ -n "$tgt_pid" ] && kill -KILL "$tgt_pid" 2>/dev/null
    wait 2>/dev/null
    [ "$fail" = 0 ] && rm -rf "$work" || echo "# logs kept in $work"
    echo "$pass passed, $fail failed"
    # An explicit status: a bare `exit` in an EXIT trap returns the status of the
    # script's last command, so a failed check did not fail the script.
    [ "$fail" = 0 ] && exit 0
    exit 1
}
trap finish EXIT
die() { bad "$1" "$2"; exit 1; }

[ -x "$bin" ] || die kvtarget-binary "$bin not built (cargo build --release --features spdk --target-dir target/spdk)"
eval "$("$repo/ci/spdk.sh")" || die spdk "ci/spdk.sh failed"
"$repo/ci/hugepages.sh" --free 200 || die hugepages "not enough hugepages"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
tport=$(free_port) kport=$(free_port)
tnqn=nqn.2016-06.io.spdk:failure
knqn=nqn.2026-11.io.kvtarget:failure

"$SPDK_DIR/build/bin/nvmf_tgt" -m 0x1 --no-pci --disable-cpumask-locks -r "$work/tgt.sock" > "$work/nvmf_tgt.log" 2>&1 &
tgt_pid=$!
for _ in $(seq 150); do [ -S "$work/tgt.sock" ] && break; sleep 0.2; done
rpc() { python3 "$SPDK_DIR/scripts/rpc.py" -s "$work/tgt.sock" "$@" >> "$work/nvmf_tgt.log" 2>&1; }
rpc framework_wait_init && rpc nvmf_create_transport -t TCP && rpc bdev_malloc_create -b M0 128 4096 \
    && rpc nvmf_create_subsystem "$tnqn" -a -s FAIL0001 && rpc nvmf_subsystem_add_ns "$tnqn" M0 \
    && rpc nvmf_subsystem_add_listener "$tnqn" -t tcp -a 127.0.0.1 -s "$tport" \
    || die nvmf-tgt "set-up failed: $(tail -n 5 "$work/nvmf_tgt.log" | tr '\n' ' ')"

cat > "$work/kv.toml" <<EOF
[reactors]
count = 1
idle = "adaptive"

[spdk]
no_huge = true
mem_size = "256MiB"

[[listeners]]
address = "127.0.0.1"
port = $kport

[[subsystems]]
nqn = "$knqn"
allow_any_host = true

[[subsystems.namespaces]]
nsid = 1
backend = "spdk"
trid = "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$tport subnqn:$tnqn"

[[subsystems.namespaces]]
nsid = 2
backend = "ram"
size = "64MiB"
EOF
"$bin" --config "$work/kv.toml" -r "$work/kv.sock" > "$work/kvtarget.log" 2>&1 &
kv_pid=$!
for _ in $(seq 150); do grep -q "listening on 127.0.0.1:$kport" "$work/kvtarget.log" && break; sleep 0.1; done
grep -q "listening on 127.0.0.1:$kport" "$work/kvtarget.log" \
    || die kvtarget-start "$(tail -n 5 "$work/kvtarget.log" | tr '\n' ' ')"
ok "kvtarget serves an SPDK NVMe/TCP namespace (nsid 1) and a RAM one (nsid 2)"

perf() { # NSID SECONDS OUT [extra]
    local ns=$1 t=$2 out=$3; shift 3
    timeout $((t + 30)) "$bin" perf --addr "127.0.0.1:$kport" --nqn "$knqn" --nsid "$ns" \
        --workload randrw --bs 4KiB --qd 16 --time "$t" --json --quiet "$@" > "$out" 2> "$out.err"
}
json() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d.get(sys.argv[2], ""))' "$1" "$2" 2>/dev/null; }

# Verified I/O on both before the failure.
perf 1 2 "$work/before1.json" --verify && [ "$(json "$work/before1.json" mismatches)" = 0 ] \
    && ok "verified I/O on the SPDK namespace" || bad verify-spdk-before "$(cat "$work/before1.json.err" | tail -n 3 | tr '\n' ' ')"

perf 1 8 "$work/during1.json" &
p1=$!
perf 2 8 "$work/during2.json" &
p2=$!
sleep 3
kill -KILL "$tgt_pid"; wait "$tgt_pid" 2>/dev/null; tgt_pid=
t0=$SECONDS
wait "$p1"; rc1=$?
wait "$p2"; rc2=$?
[ $((SECONDS - t0)) -le 30 ] && ok "load on the SPDK namespace finished on time after its target died" \
    || bad no-hang "perf on nsid 1 took $((SECONDS - t0)) s after the kill"
e1=$(json "$work/during1.json" errors)
[ -n "$e1" ] && [ "$e1" -gt 0 ] 2>/dev/null && ok "I/O to the dead controller failed with NVMe errors ($e1 errors)" \
    || bad errors-reported "perf rc $rc1, errors '$e1': $(tail -n 3 "$work/during1.json.err" | tr '\n' ' ')"
e2=$(json "$work/during2.json" errors)
[ "$rc2" = 0 ] && [ "$e2" = 0 ] && ok "the RAM namespace carried on without errors meanwhile" \
    || bad ram-unaffected "perf rc $rc2, errors '$e2'"

kill -0 "$kv_pid" 2>/dev/null && ok "kvtarget still running" || die kvtarget-alive "kvtarget exited: $(tail -n 5 "$work/kvtarget.log" | tr '\n' ' ')"
"$bin" rpc -r "$work/kv.sock" spdk_get_version > /dev/null 2>&1 && ok "kvtarget still answers JSON-RPC" \
    || bad rpc-alive "spdk_get_version failed"
perf 2 2 "$work/after2.json" --verify && [ "$(json "$work/after2.json" mismatches)" = 0 ] \
    && [ "$(json "$work/after2.json" errors)" = 0 ] && ok "verified I/O on the RAM namespace on a new connection" \
    || bad ram-after "$(tail -n 3 "$work/after2.json.err" | tr '\n' ' ')"

failed_lines=$(grep -c "SPDK controller failed" "$work/kvtarget.log")
[ "$failed_lines" = 1 ] && ok "the log says once that the SPDK controller failed" \
    || bad failure-logged "'SPDK controller failed' appears $failed_lines times"
lines=$(wc -l < "$work/kvtarget.log")
[ "$lines" -lt 400 ] && ok "no log flood ($lines lines in all)" || bad log-flood "$lines log lines"

kill -TERM "$kv_pid"
for _ in $(seq 100); do kill -0 "$kv_pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$kv_pid" 2>/dev/null; then
    bad sigterm "kvtarget did not exit within 10 s of SIGTERM"
else
    wait "$kv_pid"; rc=$?; kv_pid=
    [ "$rc" = 0 ] && ok "kvtarget exits 0 on SIGTERM with its SPDK controller dead" || bad sigterm-exit "status $rc"
fi
