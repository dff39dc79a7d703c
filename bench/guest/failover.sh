#!/bin/bash
# Guest side of bench/run-failover.sh: the Linux host's native multipath over three
# cluster nodes, fio's per-I/O completion log, and a SIGKILL of the owner per round.
#
# Runs in the interop guest (ci/guest/run.sh) from the 9p share, which holds plan.env
# (written by the host script). Talks to the host script through the share: it writes
# "SEQ COMMAND [ARG]" to ./request and waits for "SEQ REPLY" in ./reply. Commands:
#   ping        answered "pong" (the request's round trip, measured before the kills)
#   kill PORT   SIGKILL of the node on PORT, answered "killed PORT OWNER_MS NEW_PORT"
#               once a survivor owns the group, or "failed: why"
# Writes ./pings.txt (round trips, ms), ./kills.jsonl (one line per kill: its request
# time in Unix ms, the ports, the host's owner time), ./clat.log (fio's completion log:
# Unix ms, latency ns, ...) and ./fio.json.
set -uo pipefail
share=/mnt/share
cd "$share" || exit 1
# shellcheck source=/dev/null
. "$share/plan.env"   # KILLS SETTLE ADDR PORTS NQN HOSTNQN HOSTID
work=/tmp/fo
mkdir -p "$work"
log() { echo "failover(guest): $*"; }
die() { log "error: $*"; exit 1; }
# Unix time in ms, without a process (bash's clock; busybox date has no %N).
now_ms() { local us=${EPOCHREALTIME//[!0-9]/}; echo $((us / 1000)); }

HOST_POLL=0.005   # the kill request's delivery is part of what is measured
# shellcheck source=/dev/null
. "$share/host-request.sh"   # host_do

ctrl_state() { cat "/sys/class/nvme/$1/state" 2> /dev/null || echo gone; }
# path_of nvmeX -> its path device of NSID 1 (nvmeScXnY)
path_of() {
    local p
    for p in /sys/block/nvme*c*n*; do
        [ -e "$p/device" ] || continue
        [ "$(basename "$(readlink -f "$p/device")")" = "$1" ] || continue
        [ "$(cat "$p/nsid" 2> /dev/null)" = 1 ] && { basename "$p"; return 0; }
    done
    return 1
}
ana_state() { cat "/sys/block/$1/ana_state" 2> /dev/null || echo none; }

declare -A CTRL=() PATHDEV=()
# owner_port [NOT_PORT] -> the one port whose live controller's path is optimized
owner_port() {
    local p n=0 o=
    for p in $PORTS; do
        [ "$(ctrl_state "${CTRL[$p]}")" = live ] || continue
        [ "$(ana_state "${PATHDEV[$p]}")" = optimized ] && { o=$p; n=$((n + 1)); }
    done
    [ "$n" = 1 ] && [ "$o" != "${1:-}" ] && echo "$o"
}
wait_owner() { # SECS [NOT_PORT]
    local i o
    for i in $(seq 1 $(($1 * 10))); do
        o=$(owner_port "${2:-}") && { echo "$o"; return 0; }
        sleep 0.1
    done
    return 1
}

for i in $(seq 1 10); do
    t0=$(now_ms)
    [ "$(host_do ping)" = pong ] || die "ping got no pong"
    echo $(( $(now_ms) - t0 )) >> "$share/pings.txt"
done
log "request round trips (ms): $(tr '\n' ' ' < "$share/pings.txt")"

for p in $PORTS; do
    # nvme-cli's defaults: reconnect every 10 s, give a lost controller 600 s
    out=$(timeout 60 nvme connect -t tcp -a "$ADDR" -s "$p" -n "$NQN" \
        --hostnqn "$HOSTNQN" --hostid "$HOSTID" -o json 2>&1) || die "connect to port $p: $out"
    CTRL[$p]=$(echo "$out" | jq -r '.device // empty')
    [ -n "${CTRL[$p]}" ] || die "connect to port $p printed no device: $out"
done
for p in $PORTS; do
    for i in $(seq 1 100); do PATHDEV[$p]=$(path_of "${CTRL[$p]}") && break; sleep 0.1; done
    [ -n "${PATHDEV[$p]:-}" ] || die "no path device for ${CTRL[$p]} (port $p)"
done
p=${PATHDEV[${PORTS%% *}]}
head=/dev/${p%%c*}n${p##*n}
[ -b "$head" ] || die "no multipath head $head for $p"
log "head $head; paths: $(for p in $PORTS; do printf '%s=%s ' "$p" "${PATHDEV[$p]}"; done)"
wait_owner 30 > /dev/null || die "no single optimized path within 30 s"

fio --name=failover --filename="$head" --direct=1 --ioengine=libaio --rw=randwrite --bs=4k \
    --iodepth=1 --time_based --runtime=86400 --write_lat_log="$work/fo" --log_avg_msec=0 \
    --log_unix_epoch=1 --output-format=json --output="$share/fio.json" > "$work/fio.err" 2>&1 &
fio_pid=$!
sleep "$SETTLE"

for k in $(seq 1 "$KILLS"); do
    kill -0 "$fio_pid" 2> /dev/null || die "fio ended before kill $k: $(tail -n 3 "$work/fio.err")"
    owner=$(wait_owner 60) || die "kill $k: no single optimized path within 60 s"
    t_req=$(now_ms)
    reply=$(host_do "kill $owner") || die "kill $k: no answer"
    read -r verb killed owner_ms new <<< "$reply"
    [ "$verb" = killed ] || die "kill $k: $reply"
    echo "{\"kill\": $k, \"t_req\": $t_req, \"killed\": $killed, \"new\": $new, \"owner_ms\": $owner_ms}" >> "$work/kills.jsonl"
    wait_owner 60 "$killed" > /dev/null || die "kill $k: no path other than $killed optimized within 60 s"
    # The dead node was started again: its path reconnects (nvme-cli's 10 s delay).
    for i in $(seq 1 600); do [ "$(ctrl_state "${CTRL[$killed]}")" = live ] && break; sleep 0.1; done
    [ "$(ctrl_state "${CTRL[$killed]}")" = live ] || die "kill $k: ${CTRL[$killed]} did not reconnect within 60 s"
    log "kill $k: $killed killed, $new owns after $owner_ms ms (host clock)"
    sleep "$SETTLE"
done

# SIGINT ends a time-based job cleanly: fio writes its JSON and its logs.
kill -INT "$fio_pid"
wait "$fio_pid"
# Its JSON follows the "terminating on signal" line.
sed -n '/^{/,$p' "$share/fio.json" > "$work/fio.json" && mv "$work/fio.json" "$share/fio.json"
err=$(jq -r '.jobs[0].error' "$share/fio.json" 2> /dev/null)
[ "$err" = 0 ] || die "fio reported error '$err': $(tail -n 5 "$work/fio.err")"

# The host script reads the completion log against the requests.
cp "$work/fo_clat.1.log" "$share/clat.log" && cp "$work/kills.jsonl" "$share/kills.jsonl" \
    || die "cannot copy the completion log to the share"
for p in $PORTS; do nvme disconnect -d "${CTRL[$p]}" > /dev/null 2>&1; done
log "done: $KILLS kills"
