#!/usr/bin/env bash
# Drives kvtarget with SPDK's own JSON-RPC client (`spdk-rpc`, the PyPI package
# `spdk`, i.e. SPDK's rpc.py) exactly as one drives SPDK's nvmf_tgt: transport,
# a thin volume, subsystem, namespace, listener, host, then reads the state back,
# lets a host connect and do I/O, and checks the I/O statistics. Then tears it
# all down again through the same client.
#
# Usage: tests/spdk-rpc/run.sh            (needs target/release/kvtarget)
# Env:   KVTARGET_BIN, SPDK_PY_VERSION (default 26.9)
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
bin=${KVTARGET_BIN:-$repo/target/release/kvtarget}
ver=${SPDK_PY_VERSION:-26.9}
venv=$repo/.cache/spdk-py-$ver
work=$(mktemp -d /tmp/kvtarget-spdkrpc.XXXXXX)
pass=0 fail=0
ok() { echo "ok - $1"; pass=$((pass + 1)); }
bad() { echo "FAIL - $1: $2"; fail=$((fail + 1)); }
kv_pid=
cleanup() {
    [ -n "$kv_pid" ] && kill -TERM "$kv_pid" 2>/dev/null && wait "$kv_pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

[ -x "$bin" ] || { echo "spdk-rpc: $bin not built (cargo build --release)"; echo "0 passed, 1 failed"; exit 1; }

# The client: SPDK's Python package in a virtualenv (pip from PyPI).
log() { echo "spdk-rpc: $*" >&2; }
die() { echo "spdk-rpc: error: $*"; echo "0 passed, 1 failed"; exit 1; }
source "$repo/ci/lib/debian.sh"
install_debs tools   # python3-venv
if [ ! -x "$venv/bin/spdk-rpc" ]; then
    rm -rf "$venv"
    python3 -m venv "$venv" && "$venv/bin/pip" install -q "spdk==$ver" "prometheus-client==0.21.1" || {
        echo "spdk-rpc: cannot install spdk==$ver / prometheus-client from PyPI"; echo "0 passed, 1 failed"; exit 1; }
fi
rpc() { "$venv/bin/spdk-rpc" -s "$work/kv.sock" "$@"; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port_cfg=$(free_port)
port=$(free_port)
mport=$(free_port)
nqn=nqn.2026-11.io.kvtarget:spdk-rpc
host=nqn.2014-08.org.nvmexpress:uuid:6b767461-7267-6574-0000-000000000001

cat > "$work/kv.toml" <<EOF
[metrics]
address = "127.0.0.1:$mport"

[[listeners]]
address = "127.0.0.1"
port = $port_cfg

[[pools]]
name = "kv"
backend = "uring"
path = "$work/pool.img"
size = "512MiB"
EOF
"$bin" --config "$work/kv.toml" -r "$work/kv.sock" > "$work/kvtarget.log" 2>&1 &
kv_pid=$!
for _ in $(seq 100); do [ -S "$work/kv.sock" ] && break; sleep 0.1; done

step() { # NAME CMD...: runs an spdk-rpc command, records ok/FAIL
    local name=$1; shift
    local out
    if out=$(rpc "$@" 2>&1); then ok "$name"; else bad "$name" "$(echo "$out" | tr '\n' ' ' | cut -c1-300)"; fi
    LAST=$out
}

step spdk_get_version spdk_get_version
echo "$LAST" | grep -q kvtarget || bad spdk_get_version-content "$LAST"
step nvmf_create_transport nvmf_create_transport -t TCP
step bdev_lvol_get_lvstores bdev_lvol_get_lvstores
step bdev_lvol_create bdev_lvol_create -l kv -t lv0 64
step nvmf_create_subsystem nvmf_create_subsystem "$nqn" -s KVTSPDKRPC0001 -d kvtarget-rpc
step nvmf_subsystem_add_ns nvmf_subsystem_add_ns "$nqn" kv/lv0
step nvmf_subsystem_add_listener nvmf_subsystem_add_listener "$nqn" -t tcp -a 127.0.0.1 -s "$port" -f ipv4
step nvmf_subsystem_add_host nvmf_subsystem_add_host "$nqn" "$host"
step nvmf_get_subsystems nvmf_get_subsystems
subs=$LAST
python3 - "$subs" "$nqn" "$port" "$host" <<'PY' && ok nvmf_get_subsystems-content || bad nvmf_get_subsystems-content "$subs"
import json, sys
subs, nqn, port, host = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
s = next(x for x in subs if x["nqn"] == nqn)
assert s["serial_number"] == "KVTSPDKRPC0001", s
assert [l["trsvcid"] for l in s["listen_addresses"]] == [port], s
assert s["hosts"] == [{"nqn": host}], s
assert s["allow_any_host"] is False, s
assert s["namespaces"][0]["nsid"] == 1 and s["namespaces"][0]["bdev_name"] == "kv/lv0", s
PY

# A host connects to what the client configured and writes.
if perf=$("$bin" perf --addr "127.0.0.1:$port" --nqn "$nqn" --hostnqn "$host" --workload randwrite --bs 4KiB --qd 8 --time 1 --warmup 0 --json 2>&1); then
    echo "$perf" | grep -q '"errors":0' && ok host-io || bad host-io "$perf"
else
    bad host-io "$perf"
fi
# The configured port is not this subsystem's: a connection there is refused.
if "$bin" perf --addr "127.0.0.1:$port_cfg" --nqn "$nqn" --hostnqn "$host" --workload read --time 0.2 --warmup 0 >/dev/null 2>&1; then
    bad listener-scoping "connected on a port the subsystem does not listen on"
else
    ok listener-scoping
fi
step bdev_get_iostat bdev_get_iostat --names kv/lv0
python3 - "$LAST" <<'PY' && ok bdev_get_iostat-content || bad bdev_get_iostat-content "$LAST"
import json, sys
st = json.loads(sys.argv[1])
b = st["bdevs"][0]
assert b["num_write_ops"] > 0 and b["bytes_written"] == 4096 * b["num_write_ops"], b
PY
# The same I/O, seen by Prometheus' own text-format parser.
"$venv/bin/python" - "$mport" <<'PY' && ok prometheus-metrics || bad prometheus-metrics "see above"
import sys, urllib.request
from prometheus_client.parser import text_string_to_metric_families
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10).read().decode()
fam = {f.name: f for f in text_string_to_metric_families(text)}
ops = {tuple(sorted(s.labels.items())): s.value for s in fam["kvtarget_volume_ops"].samples if s.name.endswith("_total")}
writes = ops[(("op", "write"), ("pool", "kv"), ("volume", "lv0"))]
assert writes > 0, ops
h = [s for s in fam["kvtarget_volume_latency_seconds"].samples if s.labels.get("op") == "write" and s.labels.get("volume") == "lv0"]
buckets = [s.value for s in h if s.name.endswith("_bucket")]
count = next(s.value for s in h if s.name.endswith("_count"))
assert buckets == sorted(buckets) and buckets[-1] == count == writes, (buckets, count, writes)
assert fam["kvtarget_pool_extents"].samples, "pool metrics"
assert any(s.value > 0 for s in fam["kvtarget_reactor_busy_seconds"].samples)
print(f"prometheus: {len(fam)} metric families, {int(writes)} writes, histogram consistent")
PY
step bdev_get_bdevs bdev_get_bdevs -b kv/lv0
step nvmf_subsystem_get_controllers nvmf_subsystem_get_controllers "$nqn"

# Errors come back as JSON-RPC errors the client reports (non-zero exit).
if out=$(rpc nvmf_subsystem_add_ns "$nqn" kv/nope 2>&1); then
    bad error-reporting "adding a missing bdev succeeded"
else
    echo "$out" | grep -q '"code": -2' && ok error-reporting || bad error-reporting "$out"
fi

step nvmf_subsystem_remove_host nvmf_subsystem_remove_host "$nqn" "$host"
step nvmf_subsystem_remove_listener nvmf_subsystem_remove_listener "$nqn" -t tcp -a 127.0.0.1 -s "$port" -f ipv4
step nvmf_subsystem_remove_ns nvmf_subsystem_remove_ns "$nqn" 1
step bdev_lvol_delete bdev_lvol_delete kv/lv0
step nvmf_delete_subsystem nvmf_delete_subsystem "$nqn"
step rpc_get_methods rpc_get_methods
step nvmf_get_stats nvmf_get_stats
echo "$LAST" | grep -q nvmf_tgt_poll_group_000 || bad nvmf_get_stats-content "$LAST"

kill -TERM "$kv_pid" 2>/dev/null
if wait "$kv_pid"; then ok kvtarget-clean-exit; else bad kvtarget-clean-exit "see $work/kvtarget.log"; cat "$work/kvtarget.log" | tail -20; fi
kv_pid=
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
