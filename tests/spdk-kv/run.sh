#!/usr/bin/env bash
# SPDK v26.05's stock NVMe host (the KV-speaking driver NIXL's SPDK plugin uses) against
# kvtarget's KV namespaces over NVMe/TCP: tests/spdk-kv/kv_client.c, built here against
# SPDK 26.05 (ci/spdk26.sh), attaches with the driver's default options.
#
#   attach refused      a subsystem without `nvm_identify_for_kv`: the stock driver
#                       gives up on the whole controller (it reads Identify Namespace
#                       CNS 00h of every namespace and takes Invalid I/O Command Set
#                       as fatal), so the option is needed; this pins why
#   attach              with the option: both namespaces active, the KV one with its
#                       command set, KV Identify Controller and Namespace read
#   run                 store / retrieve (size in CDW0, every byte, short buffer) /
#                       exist / store options / overwrite / list / delete, each answer
#                       and status checked
#   SIGKILL cycles      keys stored and flushed, the target SIGKILLed and restarted on
#                       its file pool, every key read back intact; three times
#
# Usage: tests/spdk-kv/run.sh            (needs target/release/kvtarget)
# Env:   KVTARGET_BIN, SPDK26_CACHE, KEEP_WORK=1 (keep the logs in /tmp)
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bin=${KVTARGET_BIN:-$repo/target/release/kvtarget}
work=$(mktemp -d /tmp/kvtarget-spdk-kv.XXXXXX)
pass=0 fail=0 kv_pid=
ok() { echo "ok - $1"; pass=$((pass + 1)); }
bad() { echo "FAIL - $1: $2"; fail=$((fail + 1)); }
cleanup() {
    [ -n "$kv_pid" ] && kill -TERM "$kv_pid" 2>/dev/null && wait "$kv_pid" 2>/dev/null
    echo "$pass passed, $fail failed"
    if [ -n "${KEEP_WORK:-}" ] || [ "$fail" != 0 ]; then
        echo "spdk-kv: logs kept in $work" >&2
    else
        rm -rf "$work"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
die() { bad "$1" "$2"; exit 1; }

[ -x "$bin" ] || die setup "$bin not built (cargo build --release)"
spdk_env=$("$repo/ci/spdk26.sh") || die setup "ci/spdk26.sh could not provide SPDK v26.05"
eval "$spdk_env"
"$repo/ci/hugepages.sh" || die setup "no hugepages for SPDK"

# The client: one C file against SPDK 26.05's shared libraries, found at run time
# through its RUNPATH.
pc="$SPDK26_DIR/build/lib/pkgconfig:$SPDK26_DPDK/lib/pkgconfig"
flags=$(PKG_CONFIG_PATH=$pc pkg-config --cflags --libs spdk_nvme spdk_env_dpdk) \
    || die client-build "pkg-config found no spdk_nvme in $SPDK26_DIR"
rpath=$(echo "$SPDK26_LD_LIBRARY_PATH" | sed 's/:/ -Wl,-rpath,/g')
# shellcheck disable=SC2086
cc -O2 -Wall -Werror -o "$work/kv_client" "$repo/tests/spdk-kv/kv_client.c" \
    -Wl,--no-as-needed $flags -Wl,--as-needed -Wl,-rpath,$rpath > "$work/cc.log" 2>&1 \
    || die client-build "$(tail -n 5 "$work/cc.log" | tr '\n' ' ')"
ok "client built against SPDK v26.05"

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
nqn=nqn.2026-12.io.kvtarget:spdk-kv
plain=nqn.2026-12.io.kvtarget:spdk-kv-plain
cat > "$work/kv.toml" <<EOF
[reactors]
count = 1
idle = "adaptive"

[tcp]
max_io_size = "1MiB"

[[listeners]]
address = "127.0.0.1"
port = $port

[[pools]]
name = "kv"
backend = "uring"
path = "$work/pool.img"
size = "1GiB"
extent_size = "1MiB"

[[pools.volumes]]
name = "blocks"
size = "64MiB"

[[pools.volumes]]
name = "cache"
size = "256MiB"
kind = "kv"

[[pools.volumes]]
name = "cache2"
size = "64MiB"
kind = "kv"

[[subsystems]]
nqn = "$nqn"
allow_any_host = true
nvm_identify_for_kv = true

[[subsystems.namespaces]]
nsid = 1
volume = "kv/blocks"

[[subsystems.namespaces]]
nsid = 2
volume = "kv/cache"

[[subsystems]]
nqn = "$plain"
allow_any_host = true

[[subsystems.namespaces]]
nsid = 1
volume = "kv/cache2"
EOF

start_target() {
    "$bin" --config "$work/kv.toml" -r "$work/kv.sock" >> "$work/kvtarget.log" 2>&1 &
    kv_pid=$!
    for _ in $(seq 150); do
        kill -0 "$kv_pid" 2>/dev/null || return 1
        "$bin" rpc -r "$work/kv.sock" spdk_get_version > /dev/null 2>&1 && return 0
        sleep 0.1
    done
    return 1
}
start_target || die kvtarget-start "$(tail -n 5 "$work/kvtarget.log" | tr '\n' ' ')"
ok "kvtarget up on 127.0.0.1:$port"

trid() { echo "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$port subnqn:$1"; }
# client NAME SUBNQN MODE [args]: the client's own ok/FAIL lines count as ours.
client() {
    local name=$1 sub=$2; shift 2
    timeout -k 5 120 "$work/kv_client" -r "$(trid "$sub")" "$@" > "$work/$name.out" 2>&1
    RC=$?
    sed -n 's/^\(ok\|FAIL\) - /\1 - '"$name"': /p' "$work/$name.out"
    pass=$((pass + $(grep -c '^ok - ' "$work/$name.out")))
    fail=$((fail + $(grep -c '^FAIL - ' "$work/$name.out")))
}

# The refusal is what this case expects: the client's own verdict lines stay in its
# output file, and only this case's verdict is printed.
timeout -k 5 120 "$work/kv_client" -r "$(trid "$plain")" -m attach > "$work/refused.out" 2>&1
RC=$?
if grep -q '^ok - attach' "$work/refused.out"; then
    bad "without nvm_identify_for_kv" "the stock driver attached; the option may no longer be needed (see docs/kv-namespaces.md)"
elif grep -q '^FAIL - attach' "$work/refused.out"; then
    ok "without nvm_identify_for_kv the stock driver does not attach (why the option exists)"
else
    bad "without nvm_identify_for_kv" "client ended without a verdict (exit $RC): $(tail -n 3 "$work/refused.out" | tr '\n' ' ')"
fi

client attach "$nqn" -m attach
client run "$nqn" -m run -n 64 -s 8192
[ "$RC" = 0 ] || bad "run" "client exit $RC: $(tail -n 3 "$work/run.out" | tr '\n' ' ')"

for cycle in 1 2 3; do
    client "store-$cycle" "$nqn" -m store -n 200 -s $((4096 * cycle + 100))
    kill -KILL "$kv_pid" 2>/dev/null
    wait "$kv_pid" 2>/dev/null
    kv_pid=
    start_target || die "restart-$cycle" "$(tail -n 5 "$work/kvtarget.log" | tr '\n' ' ')"
    ok "SIGKILL and restart $cycle"
    client "verify-$cycle" "$nqn" -m verify -n 200 -s $((4096 * cycle + 100))
done
[ "$fail" = 0 ]
