#!/bin/bash
# Set up the control target: the guest kernel's own nvmet, configured through configfs
# to mirror the kvtarget interop config (one subsystem, one allowed host, NSID 1
# file-backed, TCP on 127.0.0.1:<port> and the discovery port). Runs inside the guest.
#
# Usage: nvmet-control.sh --nqn NQN --hostnqn HOSTNQN [--addr 127.0.0.1] [--port 4420]
#                         [--disc-port 8009] [--size BYTES] [--serial S] [--model M]
#
# nvmet has no discovery-only port: a port listens only once a subsystem is linked to it,
# so the subsystem is linked to the discovery port too and the discovery log served
# there advertises that port (the suite's discovery-8009 check follows the advertised
# trsvcid, so it holds for both targets).
set -eu
NQN= HOSTNQN= ADDR=127.0.0.1 PORT=4420 DISC_PORT=8009 SIZE=268435456
SERIAL=KVTCONTROL0001 MODEL=kvtarget-control
while [ $# -gt 0 ]; do
    case "$1" in
        --nqn) NQN=$2 ;;
        --hostnqn) HOSTNQN=$2 ;;
        --addr) ADDR=$2 ;;
        --port) PORT=$2 ;;
        --disc-port) DISC_PORT=$2 ;;
        --size) SIZE=$2 ;;
        --serial) SERIAL=$2 ;;
        --model) MODEL=$2 ;;
        *) echo "nvmet-control: unknown argument $1" >&2; exit 2 ;;
    esac
    shift 2
done
[ -n "$NQN" ] && [ -n "$HOSTNQN" ] || { echo "nvmet-control: --nqn and --hostnqn required" >&2; exit 2; }

cfs=/sys/kernel/config/nvmet
[ -d "$cfs" ] || { echo "nvmet-control: $cfs missing (nvmet not loaded?)" >&2; exit 1; }
img=/tmp/nvmet-ns1.img
rm -f "$img"
truncate -s "$SIZE" "$img"

mkdir -p "$cfs/hosts/$HOSTNQN"
sub=$cfs/subsystems/$NQN
mkdir "$sub"
echo 0 > "$sub/attr_allow_any_host"
echo "$SERIAL" > "$sub/attr_serial"
echo "$MODEL" > "$sub/attr_model"
ln -s "$cfs/hosts/$HOSTNQN" "$sub/allowed_hosts/"
mkdir "$sub/namespaces/1"
echo "$img" > "$sub/namespaces/1/device_path"
# /tmp is tmpfs, which has no O_DIRECT.
echo 1 > "$sub/namespaces/1/buffered_io"
echo 1 > "$sub/namespaces/1/enable"

id=0
for p in "$PORT" "$DISC_PORT"; do
    id=$((id + 1))
    port=$cfs/ports/$id
    mkdir "$port"
    echo tcp > "$port/addr_trtype"
    echo ipv4 > "$port/addr_adrfam"
    echo "$ADDR" > "$port/addr_traddr"
    echo "$p" > "$port/addr_trsvcid"
    ln -s "$sub" "$port/subsystems/"
done
echo "nvmet-control: $NQN on $ADDR:$PORT and :$DISC_PORT, host $HOSTNQN, $SIZE bytes at $img"
