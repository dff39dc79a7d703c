#!/bin/bash
# Guest side of bench/run-guest-kv-offload.sh: LMCache's raw-block phases replayed with
# fio through the Linux kernel NVMe/TCP host, against each target on the host in turn.
#
# Runs in the interop guest (ci/guest/run.sh) from the 9p share, which holds plan.env
# (written by the host script). Talks to the host script through the share: it writes
# "SEQ COMMAND [ARG]" to ./request and waits for "SEQ REPLY" in ./reply. Commands:
#   activate TARGET   continue TARGET, stop the others (the guest connects only after)
#   mark-start N / mark-end N   the host reads the active target's reactor counters
#   idle              stop every target (for the raw link measurement)
# Writes one JSON line per run to ./runs.jsonl and one per link measurement to ./link.jsonl.
set -uo pipefail
share=/mnt/share
cd "$share" || exit 1
# shellcheck source=/dev/null
. "$share/plan.env"   # TARGETS ROUNDS SECS PROFILES LINK_PORT LINK_MIB HOSTNQN HOSTID ADDR_<t> PORT_<t> NQN_<t>
work=/tmp/kvo
mkdir -p "$work"
log() { echo "kv-offload(guest): $*"; }

# shellcheck source=/dev/null
. "$share/host-request.sh"   # host_do

# ns_dev nvmeX NSID -> the block device of NSID in nvmeX's subsystem (waits up to 10 s).
ns_dev() {
    local ctrl=$1 nsid=$2 i s d
    for i in $(seq 1 100); do
        for s in /sys/class/nvme-subsystem/nvme-subsys*; do
            [ -e "$s/$ctrl" ] || continue
            for d in "$s"/nvme*n*; do
                d=$(basename "$d")
                case "$d" in nvme*c*|ng*) continue ;; esac
                if [ "$(cat "/sys/block/$d/nsid" 2>/dev/null)" = "$nsid" ] && [ -b "/dev/$d" ] \
                   && [ "$(cat "/sys/block/$d/size")" != 0 ]; then
                    echo "/dev/$d"
                    return 0
                fi
            done
        done
        sleep 0.1
    done
    return 1
}

CTRL= NS1= NS2=
connect() { # TARGET: nvme-cli with its default options (queues, queue size, digests off)
    local t=$1 out addr port nqn
    eval "addr=\$ADDR_$t port=\$PORT_$t nqn=\$NQN_$t"
    out=$(timeout 60 nvme connect -t tcp -a "$addr" -s "$port" -n "$nqn" \
        --hostnqn "$HOSTNQN" --hostid "$HOSTID" -o json 2>&1) || { log "connect to $t failed: $out"; return 1; }
    CTRL=$(echo "$out" | jq -r '.device // empty')
    [ -n "$CTRL" ] || { log "connect to $t printed no device: $out"; return 1; }
    NS1=$(ns_dev "$CTRL" 1) && NS2=$(ns_dev "$CTRL" 2) || { log "$t's namespaces did not appear"; return 1; }
}
disconnect() {
    [ -n "$CTRL" ] || return 0
    timeout 60 nvme disconnect -d "$CTRL" > /dev/null 2>&1
    local i
    for i in $(seq 1 100); do [ -e "/sys/class/nvme/$CTRL" ] || break; sleep 0.1; done
    CTRL=
}

# iolog DEV KIND OUT: a fio version 2 iolog of LMCache's raw-block I/O on a 1 GiB
# namespace: a 128 MiB metadata region, then slots of 32 MiB + 4 KiB. store: each
# slot in order gets its 4 KiB header, then its 32 MiB payload at slot + 4 KiB;
# retrieve: payload reads of the slots in a fresh random order each pass. Enough
# passes that the run's time limit, not the log, ends it.
iolog() {
    python3 - "$1" "$2" "$3" <<'PY'
import random, sys
dev, kind, out = sys.argv[1:4]
meta, header, chunk = 128 << 20, 4096, 32 << 20
slot = (header + chunk + 4095) // 4096 * 4096
slots = ((1 << 30) - meta) // slot
rng = random.Random(19)
with open(out, "w") as f:
    f.write(f"fio version 2 iolog\n{dev} add\n{dev} open\n")
    for _ in range(40):
        order = list(range(slots))
        if kind == "retrieve":
            rng.shuffle(order)
        for s in order:
            base = meta + s * slot
            if kind == "store":
                f.write(f"{dev} write {base} {header}\n{dev} write {base + header} {chunk}\n")
            else:
                f.write(f"{dev} read {base + header} {chunk}\n")
    f.write(f"{dev} close\n")
PY
}

# summarise FIO_JSON CLAT_LOG BG -> JSON fields of one run: payload (32 MiB) I/Os per
# second, MiB/s of everything moved, payload latency mean/P50/P99/max from the
# per-I/O completion-latency log (P99.9 too), and the background job's IOPS, P99,
# P99.9 and max.
summarise() {
    python3 - "$@" <<'PY'
import json, sys
fio_json, clat_log, bg = sys.argv[1:4]
d = json.load(open(fio_json))
jobs = {j["jobname"]: j for j in d["jobs"]}
main = jobs["kv"]
secs = main["job_runtime"] / 1000.0
moved = main["read"]["io_bytes"] + main["write"]["io_bytes"]
lats = []
for line in open(clat_log):
    f = [x.strip() for x in line.split(",")]
    if len(f) >= 4 and int(f[3]) == 32 << 20:
        lats.append(int(f[1]) / 1000.0)  # ns -> us
lats.sort()
pct = lambda p: lats[min(len(lats) - 1, int(p * len(lats)))] if lats else None
r = {"secs": secs, "chunks": len(lats), "chunks_s": len(lats) / secs if secs else 0,
     "mib_s": moved / secs / 1048576 if secs else 0,
     "mean_us": sum(lats) / len(lats) if lats else None,
     "p50_us": pct(0.50), "p99_us": pct(0.99), "p999_us": pct(0.999),
     "max_us": lats[-1] if lats else None,
     "errors": main["error"]}
if bg == "1":
    b = jobs["bg"]["read"]
    r["bg_iops"] = b["iops"]
    r["bg_p99_us"] = b["clat_ns"]["percentile"].get("99.000000", 0) / 1000.0
    r["bg_p999_us"] = b["clat_ns"]["percentile"].get("99.900000", 0) / 1000.0
    r["bg_max_us"] = b["clat_ns"]["max"] / 1000.0
    r["errors"] += jobs["bg"]["error"]
print(json.dumps(r))
PY
}

# run_profile N TARGET KIND QD BG: one run; appends its JSON line to runs.jsonl.
run_profile() {
    local n=$1 t=$2 kind=$3 qd=$4 bg=$5 name=$6 depth rc
    # A store at QD N has N I/Os in flight, each a header or a payload: LMCache's
    # posix engine with N workers, each writing a chunk's header, then its payload.
    depth=$qd
    iolog "$NS1" "$kind" "$work/iolog" || return 1
    {
        echo "[global]"
        echo "ioengine=io_uring"
        echo "direct=1"
        echo "runtime=$SECS"
        echo "[kv]"
        echo "filename=$NS1"
        echo "read_iolog=$work/iolog"
        echo "iodepth=$depth"
        echo "cpus_allowed=0"
        echo "write_lat_log=$work/kv"
        echo "log_avg_msec=0"
        if [ "$bg" = 1 ]; then
            echo "[bg]"
            echo "filename=$NS2"
            echo "rw=randread"
            echo "bs=4k"
            echo "iodepth=8"
            echo "time_based=1"
            echo "cpus_allowed=1"
        fi
    } > "$work/job.fio"
    rm -f "$work"/kv_*.log
    host_do mark-start "$n" > /dev/null || return 1
    timeout $((SECS * 4 + 120)) fio --output-format=json --output="$work/fio.json" "$work/job.fio" > "$work/fio.err" 2>&1
    rc=$?
    host_do mark-end "$n" > /dev/null || return 1
    local clat
    clat=$(ls "$work"/kv_clat.*.log 2>/dev/null | head -n1)
    if [ $rc != 0 ] || [ -z "$clat" ]; then
        log "fio exited $rc: $(head -c 400 "$work/fio.err")"
        echo "{\"run\": $n, \"target\": \"$t\", \"profile\": \"$name\", \"error\": \"fio exit $rc\"}" >> "$share/runs.jsonl"
        return 1
    fi
    local s
    s=$(summarise "$work/fio.json" "$clat" "$bg") || { log "cannot read fio's output"; return 1; }
    echo "{\"run\": $n, \"target\": \"$t\", \"profile\": \"$name\", \"round\": $ROUND, \"error\": null, \"fio\": $s}" >> "$share/runs.jsonl"
    log "run $n $t $name: $s"
}

# link ROUND: raw TCP through slirp to the host's sink/source (both targets stopped):
# LINK_MIB up, then LINK_MIB down, one connection each.
link() {
    host_do idle > /dev/null || return 1
    python3 - "$ADDR_link" "$LINK_PORT" "$LINK_MIB" "$1" >> "$share/link.jsonl" <<'PY'
import json, socket, sys, time
addr, port, mib, rnd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
buf = b"\x5a" * (1 << 20)
res = {"round": rnd}
for way in ("up", "down"):
    s = socket.create_connection((addr, port))
    s.sendall(b"U" if way == "up" else b"D")
    t0 = time.monotonic()
    if way == "up":
        for _ in range(mib):
            s.sendall(buf)
        s.shutdown(socket.SHUT_WR)
        s.recv(64)  # the host's byte count: everything arrived
    else:
        got = 0
        while got < mib << 20:
            b = s.recv(1 << 20)
            if not b:
                break
            got += len(b)
    res[way + "_mib_s"] = mib / (time.monotonic() - t0)
    s.close()
print(json.dumps(res))
PY
}

fail=0
: > "$share/runs.jsonl"
: > "$share/link.jsonl"
# Every namespace written once in full, so reads find written data on both targets.
for t in $TARGETS; do
    host_do activate "$t" > /dev/null || exit 1
    connect "$t" || exit 1
    log "writing $t's namespaces once ($NS1, $NS2)"
    fio --name=fill1 --filename="$NS1" --ioengine=io_uring --direct=1 --rw=write --bs=1M --iodepth=8 \
        --name=fill2 --filename="$NS2" --ioengine=io_uring --direct=1 --rw=write --bs=1M --iodepth=8 \
        > "$work/fill.out" 2>&1 || { log "prefill failed: $(tail -c 400 "$work/fill.out")"; exit 1; }
    disconnect
done
n=0
for ROUND in $(seq 1 "$ROUNDS"); do
    link "$ROUND" || fail=1
    for p in $PROFILES; do
        # NAME:KIND:QD:BG, NAME with _ for spaces
        IFS=: read -r name kind qd bg <<< "$p"
        name=${name//_/ }
        for t in $TARGETS; do
            n=$((n + 1))
            host_do activate "$t" > /dev/null || exit 1
            connect "$t" || { fail=1; continue; }
            run_profile "$n" "$t" "$kind" "$qd" "$bg" "$name" || fail=1
            disconnect
        done
    done
done
exit $fail
