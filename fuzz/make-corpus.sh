#!/usr/bin/env bash
# Regenerates the seed corpus in fuzz/corpus/ from real traffic and real pools:
#   pdu, nvme_command, rdma  the PDUs SPDK's own host (spdk_nvme_identify and
#                            spdk_nvme_perf, without and with digests) sends to
#                            kvtarget, recorded by a TCP proxy and split per PDU
#   pool_check, pool_format  pools made by `kvtarget pool create` and changed by
#                            `kvtarget volume create/resize/delete`
#   config                   config/*.toml
#   nvme_command (KV)        KV command set commands built by corpus.py kv
# Existing files are kept (names are content hashes).
#
#   fuzz/make-corpus.sh                  (KVTARGET_BIN defaults to target/release/kvtarget)
#   SKIP_SPDK=1 fuzz/make-corpus.sh      pools and configs only
set -euo pipefail
fuzz=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$fuzz")
bin=${KVTARGET_BIN:-$repo/target/release/kvtarget}
out=$fuzz/corpus
work=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
[ -x "$bin" ] || { echo "make-corpus: no kvtarget at $bin (cargo build --release)" >&2; exit 1; }

mkdir -p "$out/config"
cp "$repo"/config/*.toml "$out/config/"

# --- KV command set commands: built, as no host sends them to us yet ---
python3 "$fuzz/tools/corpus.py" kv "$out"

# --- pools: small, every metadata structure present ---
img=$work/pool.img
"$bin" pool create "$img" --size 8MiB --extent-size 64KiB >/dev/null
python3 "$fuzz/tools/corpus.py" pool "$img" fresh "$out"
"$bin" volume create "$img" kv1 --size 1MiB >/dev/null
"$bin" volume create "$img" kv2 --size 512KiB --unwritten error >/dev/null
python3 "$fuzz/tools/corpus.py" pool "$img" volumes "$out"
"$bin" volume resize "$img" kv1 --size 2MiB >/dev/null
"$bin" volume delete "$img" kv2 >/dev/null
python3 "$fuzz/tools/corpus.py" pool "$img" changed "$out"

# --- PDUs from SPDK's host tools, through a recording proxy ---
if [ "${SKIP_SPDK:-0}" != 1 ]; then
    eval "$(SPDK_CACHE=${SPDK_CACHE:-$repo/.cache/spdk} "$repo/ci/spdk.sh")"
    "$repo/ci/hugepages.sh" >/dev/null
    free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
    tport=$(free_port) pport=$(free_port)
    nqn=nqn.2026-11.io.kvtarget:fuzz
    cat > "$work/kv.toml" <<TOML
[[listeners]]
address = "127.0.0.1"
port = $tport

[[subsystems]]
nqn = "$nqn"
allow_any_host = true

[[subsystems.namespaces]]
nsid = 1
volume = "live/kv"

# A pool the perf runs write to; killed with SIGKILL afterwards, so its image
# holds journal entries past the last checkpoint (what recovery replays).
[[pools]]
name = "live"
backend = "uring"
path = "$work/live.img"
size = "8MiB"
extent_size = "64KiB"
create = true

[[pools.volumes]]
name = "kv"
size = "2MiB"
TOML
    "$bin" --config "$work/kv.toml" -r "$work/kv.sock" > "$work/kvtarget.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 100); do
        grep -q "listening on 127.0.0.1:$tport" "$work/kvtarget.log" && break
        sleep 0.1
    done
    trid="trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$pport subnqn:$nqn"
    record() {   # record MODE_BYTE NAME CMD...: one tool run through a fresh proxy
        local mode=$1 name=$2; shift 2
        python3 "$fuzz/tools/record_proxy.py" "$pport" "$tport" "$work/cap-$name" &
        local proxy=$!
        sleep 0.3
        timeout -k 5 60 "$@" > "$work/$name.out" 2>&1 || echo "make-corpus: $name exited $? (kept what it sent)" >&2
        kill "$proxy"; wait "$proxy" 2>/dev/null || true
        python3 "$fuzz/tools/corpus.py" pdus "$work/cap-$name" "$mode" "$out"
    }
    # Mode byte (see fuzz/src/lib.rs `pdu`): bits 0-1 digests, bits 2-3 the data
    # limit; 0x08 = 64 KiB, no digests; 0x0B = 64 KiB with both digests.
    record 0x08 identify "$SPDK_DIR/build/bin/spdk_nvme_identify" -r "$trid"
    record 0x08 perf-rw "$SPDK_DIR/build/bin/spdk_nvme_perf" -q 4 -o 4096 -w randrw -M 50 -t 1 -r "$trid"
    record 0x08 perf-big "$SPDK_DIR/build/bin/spdk_nvme_perf" -q 2 -o 16384 -w write -t 1 -r "$trid"
    record 0x0B perf-digest "$SPDK_DIR/build/bin/spdk_nvme_perf" -q 4 -o 4096 -w randrw -M 50 -t 1 -H -I -r "$trid"
    kill -KILL "${pids[0]}"; wait "${pids[0]}" 2>/dev/null || true
    python3 "$fuzz/tools/corpus.py" pool "$work/live.img" live "$out"
fi

# Hand-made RDMA CM private data (no RDMA device here): what the Linux host
# sends for an admin and an I/O queue (RECFMT 0, QID, HRQSIZE, HSQSIZE, CNTLID).
python3 - "$out" <<'PY'
import hashlib, os, struct, sys
d = os.path.join(sys.argv[1], "rdma"); os.makedirs(d, exist_ok=True)
for qid, hrq, hsq, cntlid in ((0, 32, 31, 0xFFFF), (1, 128, 127, 1)):
    b = bytes([0]) + struct.pack("<HHHHH", 0, qid, hrq, hsq, cntlid) + bytes(22)
    open(os.path.join(d, hashlib.sha1(b).hexdigest()[:16]), "wb").write(b)
b = bytes([1]) + struct.pack("<HH", 0, 128) + bytes(28)
open(os.path.join(d, hashlib.sha1(b).hexdigest()[:16]), "wb").write(b)
PY
du -sh "$out"; for d in "$out"/*/; do echo "$(ls "$d" | wc -l) $(basename "$d")"; done
