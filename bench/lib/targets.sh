# Sourced by the same-run comparisons (bench/run-vs-spdk.sh, bench/run-guest-kv-offload.sh):
# SPDK's nvmf_tgt and kvtarget started the same way for each, one busy-polling reactor
# on core 0 each, listening on 127.0.0.1, two RAM namespaces (1 GiB and 256 MiB, 4096-byte
# blocks), any host allowed. Only one target may run at a time (both poll core 0): each
# is left stopped (SIGSTOP) after it starts, and `activate` continues one and stops the
# others.
#
# The caller sets: work (a scratch directory), rpc_py and nvmf_tgt (SPDK's), and
# defines log and die.

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

stop_proc() { # PID: continue it (a stopped process cannot act on SIGTERM), stop it, reap it
    local p=$1
    kill -CONT "$p" 2>/dev/null
    kill -TERM "$p" 2>/dev/null || return 0
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null
}

# start_spdk PORT NQN -> spdk_pid, spdk_sock, spdk_version, shm_id (stopped afterwards).
# nvmf_tgt -m ${spdk_cores:-0x1} with its own RPC socket and DPDK file prefix / shm id, no PCI, TCP
# transport with SPDK's defaults, Malloc0 (1 GiB) and Malloc1 (256 MiB) of 4096-byte blocks.
start_spdk() {
    local port=$1 nqn=$2
    # A shm id no other SPDK process uses: DPDK file prefix spdk<id>, /dev/shm/nvmf_trace.<id>.
    shm_id=$((1000 + $$ % 8000))
    while [ -e "/var/run/dpdk/spdk$shm_id" ] || [ -e "/dev/shm/nvmf_trace.$shm_id" ] \
        || compgen -G "/dev/hugepages/spdk${shm_id}map_*" >/dev/null; do
        shm_id=$((shm_id + 1))
    done
    spdk_sock=$work/spdk.sock
    "$nvmf_tgt" -m "${spdk_cores:-0x1}" -i "$shm_id" -r "$spdk_sock" --no-pci > "$work/nvmf_tgt.log" 2>&1 &
    spdk_pid=$!
    local _
    for _ in $(seq 150); do
        kill -0 "$spdk_pid" 2>/dev/null || break
        srpc -t 2 spdk_get_version >/dev/null 2>&1 && break
        sleep 0.2
    done
    srpc -t 30 framework_wait_init >/dev/null 2>&1 || { cat "$work/nvmf_tgt.log" >&2; die "nvmf_tgt did not start"; }
    {
        srpc nvmf_create_transport -t TCP &&
        srpc bdev_malloc_create -b Malloc0 1024 4096 &&
        srpc bdev_malloc_create -b Malloc1 256 4096 &&
        srpc nvmf_create_subsystem "$nqn" -a -s SPDK00000000000001 -d "SPDK bdev Controller" &&
        srpc nvmf_subsystem_add_ns "$nqn" Malloc0 &&
        srpc nvmf_subsystem_add_ns "$nqn" Malloc1 &&
        srpc nvmf_subsystem_add_listener "$nqn" -t tcp -a 127.0.0.1 -s "$port" -f ipv4
    } > "$work/spdk-config.log" 2>&1 || { cat "$work/spdk-config.log" "$work/nvmf_tgt.log" >&2; die "configuring nvmf_tgt failed"; }
    # Its "git sha1" is whatever git checkout SPDK was built inside (the kvtarget
    # one, for ci/spdk.sh's cache), not SPDK's: left out.
    spdk_version=$(srpc spdk_get_version | python3 -c 'import json, sys; print(json.load(sys.stdin)["version"])' \
        | sed 's/ git sha1 [0-9a-f]*//')
    kill -STOP "$spdk_pid"
}
srpc() { python3 "$rpc_py" -s "$spdk_sock" "$@"; }

# kv_nqn_of CONFIG -> the first subsystem's NQN.
kv_nqn_of() {
    python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["subsystems"][0]["nqn"])' "$1"
}

# start_kv NAME BIN PORT CONFIG -> started_pid, started_sock, started_version,
# started_metrics (host:port of its /metrics; stopped afterwards). CONFIG
# (config/bench-ram.toml or one serving the same namespaces) with its port replaced
# and 4096-byte blocks.
start_kv() {
    local name=$1 bin=$2 port=$3 cfg=$4 nqn
    nqn=$(kv_nqn_of "$cfg") || die "cannot read the subsystem NQN from $cfg"
    sed -e "s/^port = [0-9]*/port = $port/" -e 's/^block_size = [0-9]*/block_size = 4096/' \
        "$cfg" > "$work/$name.toml"
    # Prometheus metrics on a free port: the target-side figures (latency from capsule
    # in to response out, reactor pass lengths) are read there.
    started_metrics=127.0.0.1:$(free_port)
    if grep -q '^\[metrics\]' "$work/$name.toml"; then
        sed -i "/^\[metrics\]/,/^\[/ s/^address = .*/address = \"$started_metrics\"/" "$work/$name.toml"
    else
        printf '\n[metrics]\naddress = "%s"\n' "$started_metrics" >> "$work/$name.toml"
    fi
    started_sock=$work/$name.sock
    "$bin" --config "$work/$name.toml" -r "$started_sock" > "$work/$name.log" 2>&1 &
    started_pid=$!
    # Up to 60 s: the RAM namespaces are made resident before it listens (1.25
    # GiB took 14-18 s on this shared machine on 2026-12-06, under 5 s before).
    local up=0 _
    for _ in $(seq 600); do
        kill -0 "$started_pid" 2>/dev/null || break
        grep -q "listening on 127.0.0.1:$port" "$work/$name.log" && [ -S "$started_sock" ] && { up=1; break; }
        sleep 0.1
    done
    [ "$up" = 1 ] || { cat "$work/$name.log" >&2; die "$name ($bin) did not start"; }
    grep -q "subnqn=$nqn nsid=1 .*bytes=1073741824 block_size=4096" "$work/$name.log" \
        || { cat "$work/$name.log" >&2; die "$name's namespace is not 1 GiB of 4096-byte blocks"; }
    started_version=$(python3 "$rpc_py" -s "$started_sock" spdk_get_version | python3 -c 'import json, sys; print(json.load(sys.stdin)["version"])')
    kill -STOP "$started_pid"
}

# activate TARGET: the others in targets[] are stopped, this one (pid_of[TARGET]) runs.
active=
activate() {
    local t=$1 o
    [ "$active" = "$t" ] && return 0
    for o in "${targets[@]}"; do [ "$o" = "$t" ] || kill -STOP "${pid_of[$o]}"; done
    kill -CONT "${pid_of[$t]}"
    active=$t
    sleep 0.5 # let the reactor settle before its counters are read
}

# reactors TARGET -> "busy_ticks tick_rate" summed over its reactors (framework_get_reactors:
# SPDK counts TSC ticks, kvtarget nanoseconds, each says its tick_rate).
reactors() {
    python3 "$rpc_py" -s "${sock_of[$1]}" -t 10 framework_get_reactors | python3 -c '
import json, sys
d = json.load(sys.stdin)
print(sum(r["busy"] for r in d["reactors"]), d["tick_rate"])'
}
