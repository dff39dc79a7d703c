#!/usr/bin/env bash
# TLS against plaintext on the same target in the same run: SPDK v25.09's
# spdk_nvme_perf (posix sock impl for plaintext, ssl with --psk-path for TLS)
# drives one kvtarget that listens both ways (one reactor busy-polling core 0,
# a 1 GiB RAM namespace, 4 KiB blocks), and SPDK's nvmf_tgt set up the same way
# (core 0, a 1 GiB Malloc bdev, TLS through its ssl sock impl) as the reference.
# Rounds alternate plaintext and TLS; perf runs on core 1. Both targets poll core
# 0, so the one not being measured is stopped (SIGSTOP) for the other's runs.
#
#   randread-4k   4 KiB random reads, QD 32
#   write-1m      1 MiB sequential writes, QD 4
#
# Usage: bench/run-tls.sh [--secs S] [--rounds N]   (needs target/release/kvtarget)
# Never run it beside a build or a QEMU guest: the machine has two cores.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
secs=10 rounds=2
while [ $# -gt 0 ]; do
    case $1 in
    --secs) secs=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    *) echo "usage: $0 [--secs S] [--rounds N]" >&2; exit 2 ;;
    esac
done
bin=$repo/target/release/kvtarget
[ -x "$bin" ] || { echo "build kvtarget first: cargo build --release" >&2; exit 1; }
eval "$("$repo/ci/spdk.sh")"
"$repo/ci/hugepages.sh" >/dev/null
command -v nvme >/dev/null || { apt-get update -q && apt-get install -y -q nvme-cli; } >&2
perf=$SPDK_DIR/build/bin/spdk_nvme_perf
rpc_py=$SPDK_DIR/scripts/rpc.py
work=$(mktemp -d /tmp/kvtarget-tls-bench.XXXXXX)
pids=()
trap 'for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null; kill -TERM "$p" 2>/dev/null; done; wait 2>/dev/null' EXIT
nqn=nqn.2026-12.io.kvtarget:tls-bench
host=nqn.2014-08.org.nvmexpress:uuid:6b767461-7267-6574-0000-0000000000d1
umask 077
k=$(nvme gen-tls-key -m 1) && printf %s "$k" > "$work/psk.key"
umask 022
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_rpc() { for _ in $(seq 150); do python3 "$rpc_py" -s "$1" -t 2 spdk_get_version >/dev/null 2>&1 && return 0; sleep 0.2; done; return 1; }

kv_plain=$(free_port) kv_tls=$(free_port)
cat > "$work/kv.toml" <<EOF
[reactors]
cores = [0]
idle = "busy"

[tcp]
max_queue_depth = 256

[[listeners]]
address = "127.0.0.1"
port = $kv_plain

[[listeners]]
address = "127.0.0.1"
port = $kv_tls
secure_channel = true

[[keys]]
name = "psk"
path = "$work/psk.key"

[[subsystems]]
nqn = "$nqn"
hosts = [{ nqn = "$host" }]

[[subsystems.namespaces]]
nsid = 1
backend = "ram"
size = "1GiB"
block_size = 4096
EOF
# The host needs its PSK on the TLS listener and none on the plaintext one; one
# subsystem cannot say both, so the plaintext rounds use a second host NQN.
plain_host=${host%1}2
sed -i "s|hosts = \[{ nqn = \"$host\" }\]|hosts = [{ nqn = \"$host\", psk = \"psk\" }, \"$plain_host\"]|" "$work/kv.toml"
"$bin" --config "$work/kv.toml" -r "$work/kv.sock" > "$work/kv.log" 2>&1 &
kv_pid=$!
pids+=($!)
wait_rpc "$work/kv.sock" || { echo "kvtarget not up" >&2; tail "$work/kv.log" >&2; exit 1; }

sp_plain=$(free_port) sp_tls=$(free_port)
"$SPDK_DIR/build/bin/nvmf_tgt" -m 0x1 -i 77 -r "$work/spdk.sock" --no-pci > "$work/spdk.log" 2>&1 &
sp_pid=$!
pids+=($!)
wait_rpc "$work/spdk.sock" || { echo "nvmf_tgt not up" >&2; exit 1; }
srpc() { python3 "$rpc_py" -s "$work/spdk.sock" "$@" >/dev/null; }
srpc framework_wait_init && srpc nvmf_create_transport -t TCP &&
    srpc bdev_malloc_create -b Malloc0 1024 4096 &&
    srpc nvmf_create_subsystem "$nqn" -s SPDK00000000000001 &&
    srpc nvmf_subsystem_add_ns "$nqn" Malloc0 &&
    srpc nvmf_subsystem_add_listener "$nqn" -t tcp -a 127.0.0.1 -s "$sp_plain" -f ipv4 &&
    srpc nvmf_subsystem_add_listener "$nqn" -t tcp -a 127.0.0.1 -s "$sp_tls" -f ipv4 -k &&
    srpc keyring_file_add_key psk "$work/psk.key" &&
    srpc nvmf_subsystem_add_host "$nqn" "$host" --psk psk &&
    srpc nvmf_subsystem_add_host "$nqn" "$plain_host" || { echo "nvmf_tgt setup failed" >&2; exit 1; }

# one TARGET MODE WORKLOAD: prints IOPS MiB/s avg-us
one() {
    local port h opts=()
    case $1-$2 in
    kv-*) kill -STOP "$sp_pid"; kill -CONT "$kv_pid" ;;
    spdk-*) kill -STOP "$kv_pid"; kill -CONT "$sp_pid" ;;
    esac
    sleep 0.2
    case $1-$2 in
    kv-plain) port=$kv_plain h=$plain_host ;;
    kv-tls) port=$kv_tls h=$host opts=(-S ssl --psk-path "$work/psk.key") ;;
    spdk-plain) port=$sp_plain h=$plain_host ;;
    spdk-tls) port=$sp_tls h=$host opts=(-S ssl --psk-path "$work/psk.key") ;;
    esac
    local w
    case $3 in
    randread-4k) w=(-q 32 -o 4096 -w randread) ;;
    write-1m) w=(-q 4 -o 1048576 -w write) ;;
    esac
    taskset -c 1 "$perf" -i 78 -c 0x2 "${w[@]}" -t "$secs" "${opts[@]}" \
        -r "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$port subnqn:$nqn hostnqn:$h" > "$work/out" 2>&1
    tr '\r' '\n' < "$work/out" | awk '$1 == "Total" && $2 == ":" { print $3, $4, $5; exit }'
}

printf '%-12s %-5s %-5s %5s %12s %10s %10s\n' workload target mode round IOPS MiB/s avg_us
for wl in randread-4k write-1m; do
    for r in $(seq "$rounds"); do
        for t in kv spdk; do
            for m in plain tls; do
                read -r iops mibs avg < <(one "$t" "$m" "$wl")
                printf '%-12s %-5s %-5s %5s %12s %10s %10s\n' "$wl" "$t" "$m" "$r" "${iops:-?}" "${mibs:-?}" "${avg:-?}"
            done
        done
    done
done
