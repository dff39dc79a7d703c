#!/usr/bin/env bash
# NVMe/TCP TLS 1.3 with PSKs against SPDK v25.09's own NVMe/TCP host (the `ssl`
# sock implementation: spdk_nvme_perf -S ssl --psk-path), with SPDK's nvmf_tgt
# as the control: both targets get the same SPDK scripts/rpc.py calls
# (keyring_file_add_key, nvmf_subsystem_add_listener -k, nvmf_subsystem_add_host
# --psk) and every case must end the same way on both.
#
#   sha256, sha384   a PSK from `nvme gen-tls-key -m 1` (32 bytes:
#                    TLS_AES_128_GCM_SHA256) and `-m 2` (48 bytes:
#                    TLS_AES_256_GCM_SHA384): spdk_nvme_perf attaches through TLS
#                    and a randrw run finishes without I/O errors
#   refusals         plaintext to the secure listener, a wrong PSK, and a host
#                    whose entry has no PSK: no controller attaches, and kvtarget
#                    logs why
#   others carry on  a TLS perf run spans the refusals, error free
#
# (The discovery log's TREQ/SECTYPE for the secure listener is checked by
# tests/tls.rs: spdk_nvme_discover does not print them.)
#
# Usage: tests/spdk-tools/tls.sh        (needs target/release/kvtarget)
# Env:   KVTARGET_BIN, SPDK_CACHE, SPDK_DIR, KEEP_WORK=1 (keep the logs in /tmp)
SUITE=tls
source "$(dirname "$0")/common.sh"
nqn=nqn.2026-12.io.kvtarget:tls
h256=nqn.2014-08.org.nvmexpress:uuid:6b767461-7267-6574-0000-0000000000c1
h384=nqn.2014-08.org.nvmexpress:uuid:6b767461-7267-6574-0000-0000000000c2
plain=nqn.2014-08.org.nvmexpress:uuid:6b767461-7267-6574-0000-0000000000c3

# --- keys: nvme-cli's PSK interchange format, readable by their owner only ---
umask 077
# SPDK's parser wants the key to end at its final ':' (no newline).
gen() { local k; k=$(nvme gen-tls-key -m "$1") && printf %s "$k" > "$2"; }
gen 1 "$work/k256.key" && gen 2 "$work/k384.key" && gen 1 "$work/wrong.key" ||
    die keys "nvme gen-tls-key failed"
umask 022
grep -q '^NVMeTLSkey-1:01:' "$work/k256.key" || die keys "unexpected key format: $(cut -c1-16 "$work/k256.key")"

# configure SOCKET PORT: listener, keys and host entries, with SPDK's rpc.py.
configure() {
    local s=$1 port=$2
    python3 "$rpc_py" -s "$s" nvmf_subsystem_add_listener "$nqn" -t tcp -a 127.0.0.1 -s "$port" -f ipv4 -k &&
        python3 "$rpc_py" -s "$s" keyring_file_add_key k256 "$work/k256.key" &&
        python3 "$rpc_py" -s "$s" keyring_file_add_key k384 "$work/k384.key" &&
        python3 "$rpc_py" -s "$s" nvmf_subsystem_add_host "$nqn" "$h256" --psk k256 &&
        python3 "$rpc_py" -s "$s" nvmf_subsystem_add_host "$nqn" "$h384" --psk k384 &&
        python3 "$rpc_py" -s "$s" nvmf_subsystem_add_host "$nqn" "$plain"
}

# --- kvtarget: a plaintext listener from its configuration, the secure one and
# the hosts over RPC ---
kv_plain=$(free_port)
kv_port=$(free_port)
cat > "$work/kv.toml" <<EOF
[[listeners]]
address = "127.0.0.1"
port = $kv_plain

[[subsystems]]
nqn = "$nqn"
hosts = []

[[subsystems.namespaces]]
nsid = 1
backend = "ram"
size = "64MiB"
block_size = 4096
EOF
"$bin" --config "$work/kv.toml" -r "$work/kv.sock" > "$work/kv.log" 2>&1 &
pids+=($!)
wait_rpc "$work/kv.sock" $! || die kv-start "not up: $(tail -n 5 "$work/kv.log" | tr '\n' ' ')"
configure "$work/kv.sock" "$kv_port" > "$work/kv-rpc.log" 2>&1 \
    || die kv-configure "rpc.py against kvtarget: $(tail -n 3 "$work/kv-rpc.log" | tr '\n' ' ')"
ok "kvtarget-configured (SPDK's rpc.py: nvmf_subsystem_add_listener -k, keyring_file_add_key, nvmf_subsystem_add_host --psk)"

# --- SPDK nvmf_tgt, the control ---
spdk_port=$(free_port)
start_spdk_tgt
{
    srpc framework_wait_init &&
        srpc nvmf_create_transport -t TCP &&
        srpc bdev_malloc_create -b Malloc0 64 4096 &&
        srpc nvmf_create_subsystem "$nqn" -s SPDK00000000000001 &&
        srpc nvmf_subsystem_add_ns "$nqn" Malloc0 &&
        configure "$work/spdk.sock" "$spdk_port"
} > "$work/spdk-rpc.log" 2>&1 || die spdk-configure "$(tail -n 3 "$work/spdk-rpc.log" | tr '\n' ' ')"

# A TLS run on kvtarget spanning every refusal below: stopped by SIGINT once they are
# done (perf then reports over the time it ran); -t bounds a hang.
bg_shm=$((shm_id + 1))
"$perf" -i "$bg_shm" -c "$host_core" -q 8 -o 4096 -w randrw -M 50 -t 600 -r "$(trid "$kv_port" "$h256")" \
    -S ssl --psk-path "$work/k256.key" > "$work/kv-background.out" 2>&1 &
bg_pid=$!
pids+=("$bg_pid")
sleep 2

expect() { # CASE WANT HOST [perf options]: the same verdict on both targets
    local c=$1 want=$2 h=$3; shift 3
    local t
    for t in kv spdk; do
        verdict "$t" "$c" "$h" "$@"
        if [ "$V" = "$want" ]; then
            ok "$t-$c ($want)"
        else
            bad "$t-$c" "wanted $want, got $V: $(excerpt "$OUT" 3)"
        fi
    done
}
expect sha256 attached "$h256" -S ssl --psk-path "$work/k256.key"
expect sha384 attached "$h384" -S ssl --psk-path "$work/k384.key"
expect plaintext-refused refused "$h256"
expect plaintext-ssl-impl-refused refused "$h256" -S ssl
expect wrong-psk-refused refused "$h256" -S ssl --psk-path "$work/wrong.key"
expect no-psk-host-refused refused "$plain" -S ssl --psk-path "$work/k256.key"

# Why, in kvtarget's log.
for why in "a plaintext connection" "TLS refused: handshake failed" "has no TLS PSK on $nqn"; do
    if grep -q "$why" "$work/kv.log"; then
        ok "kv-logs: $why"
    else
        bad "kv-logs" "no \"$why\" in kvtarget's log"
    fi
done
grep -q "TLS secure channel open.*cipher=\"\?TLS_AES_256_GCM_SHA384" "$work/kv.log" \
    && ok "kv-logs: the 48-byte PSK ran TLS_AES_256_GCM_SHA384" \
    || bad kv-cipher "no TLS_AES_256_GCM_SHA384 channel in kvtarget's log"
# Key text never reaches the log.
key_b64=$(cut -d: -f3 "$work/k256.key")
if grep -qF "$key_b64" "$work/kv.log"; then bad kv-secret "key text in kvtarget's log"; else ok "kv-keys-stay-secret"; fi

spanned=0
kill -0 "$bg_pid" 2>/dev/null && spanned=1
kill -INT "$bg_pid" 2>/dev/null
wait "$bg_pid"
bg_rc=$?
if [ "$spanned" != 1 ]; then
    bad kv-others-carry-on "the TLS run ended before the refusals did: exit $bg_rc: $(excerpt "$work/kv-background.out")"
elif [ "$bg_rc" = 0 ] && positive "$(total_iops "$work/kv-background.out")" \
    && ! grep -q 'completed with error' "$work/kv-background.out"; then
    ok "kv-others-carry-on (TLS run across every refusal, error free)"
else
    bad kv-others-carry-on "$(excerpt "$work/kv-background.out")"
fi

summary
[ "$fail" = 0 ]
