#!/usr/bin/env bash
# DH-HMAC-CHAP against SPDK v25.09's own NVMe/TCP host, with SPDK's nvmf_tgt as the
# control: every case runs against both targets, configured through the same
# SPDK scripts/rpc.py calls (keyring_file_add_key, nvmf_subsystem_add_host
# --dhchap-key / --dhchap-ctrlr-key), and must end the same way on both, so a
# failing case is known to be kvtarget's.
#
#   uni, bidi          spdk_nvme_perf --dhchap-key [--dhchap-ctrlr-key] connects, and
#                      its admin and I/O queues authenticate (one way, both ways);
#                      a randrw run finishes without I/O errors
#   plain              a host without keys on its entry connects without
#   refusals           a wrong host key, no key, a wrong controller key, and a
#                      controller key the host's entry lacks: no controller
#                      attaches, and kvtarget logs why
#   rotation           nvmf_subsystem_set_keys: the old key is refused, the new one
#                      attaches
#   others carry on    an authenticated perf run spans the refusals and the key
#                      rotation, error free
#   bdevperf verify    SPDK's bdev_nvme initiator with keyring keys writes, reads
#                      back and compares every block through authenticated queues
#   negotiation        kvtarget with [auth] limited to sha256/null and to
#                      sha384/ffdhe3072 ([[keys]] and host entries from its
#                      configuration file): SPDK's host gets what is allowed
#
# Keys come from `nvme gen-dhchap-key` (nvme-cli), as docs/auth-and-tls.md says to make them.
# SPDK's perf offers every hash and group, so by default both targets pick
# sha512/ffdhe8192.
#
# Usage: tests/spdk-tools/auth.sh        (needs target/release/kvtarget)
# Env:   KVTARGET_BIN, SPDK_CACHE, SPDK_DIR, KEEP_WORK=1 (keep the logs in /tmp)
SUITE=auth
source "$(dirname "$0")/common.sh"
nqn=nqn.2026-12.io.kvtarget:auth
uni=nqn.2014-08.org.nvmexpress:uuid:6b767461-7267-6574-0000-0000000000b1
bidi=nqn.2014-08.org.nvmexpress:uuid:6b767461-7267-6574-0000-0000000000b2
plain=nqn.2014-08.org.nvmexpress:uuid:6b767461-7267-6574-0000-0000000000b3

# --- keys: nvme-cli's format, each file readable by its owner only ---
umask 077
nvme gen-dhchap-key -m 1 -n "$uni" > "$work/uni.key" &&
    nvme gen-dhchap-key -m 0 -l 48 > "$work/bidi.key" &&
    nvme gen-dhchap-key -m 3 -n "$nqn" > "$work/ctrl.key" &&
    nvme gen-dhchap-key -m 1 -n "$uni" > "$work/wrong.key" &&
    nvme gen-dhchap-key -m 3 -n "$nqn" > "$work/wrong-ctrl.key" &&
    nvme gen-dhchap-key -m 2 -n "$uni" > "$work/rotated.key" ||
    die keys "nvme gen-dhchap-key failed"
umask 022
grep -q '^DHHC-1:0[0-3]:' "$work/uni.key" || die keys "unexpected key format: $(cut -c1-12 "$work/uni.key")"

# configure SOCKET: the keys and host entries, with SPDK's rpc.py.
configure_hosts() {
    local s=$1
    python3 "$rpc_py" -s "$s" keyring_file_add_key uni "$work/uni.key" &&
        python3 "$rpc_py" -s "$s" keyring_file_add_key bidi "$work/bidi.key" &&
        python3 "$rpc_py" -s "$s" keyring_file_add_key ctrl "$work/ctrl.key" &&
        python3 "$rpc_py" -s "$s" nvmf_subsystem_add_host "$nqn" "$uni" --dhchap-key uni &&
        python3 "$rpc_py" -s "$s" nvmf_subsystem_add_host "$nqn" "$bidi" --dhchap-key bidi --dhchap-ctrlr-key ctrl &&
        python3 "$rpc_py" -s "$s" nvmf_subsystem_add_host "$nqn" "$plain"
}

# start_kvtarget NAME PORT [AUTH_AND_KEYS_TOML [HOSTS_TOML]]: with no host list
# given, the hosts come over RPC.
start_kvtarget() {
    local name=$1 port=$2 extra=${3:-} hosts=${4:-}
    cat > "$work/$name.toml" <<EOF
$extra

[[listeners]]
address = "127.0.0.1"
port = $port

[[subsystems]]
nqn = "$nqn"
hosts = [$hosts]

[[subsystems.namespaces]]
nsid = 1
backend = "ram"
size = "64MiB"
block_size = 4096
EOF
    "$bin" --config "$work/$name.toml" -r "$work/$name.sock" > "$work/$name.log" 2>&1 &
    pids+=($!)
    wait_rpc "$work/$name.sock" $! && grep -q "listening on 127.0.0.1:$port" "$work/$name.log" \
        || die "$name-start" "not up: $(tail -n 5 "$work/$name.log" | tr '\n' ' ')"
}

# --- kvtarget, hosts and keys over RPC ---
kv_port=$(free_port)
start_kvtarget kv "$kv_port"
configure_hosts "$work/kv.sock" > "$work/kv-rpc.log" 2>&1 \
    || die kv-configure "rpc.py against kvtarget: $(tail -n 3 "$work/kv-rpc.log" | tr '\n' ' ')"
ok "kvtarget-configured (SPDK's rpc.py: keyring_file_add_key, nvmf_subsystem_add_host --dhchap-key/--dhchap-ctrlr-key)"

# --- SPDK nvmf_tgt, the control ---
spdk_port=$(free_port)
start_spdk_tgt
{
    srpc framework_wait_init &&
        srpc nvmf_create_transport -t TCP &&
        srpc bdev_malloc_create -b Malloc0 64 4096 &&
        srpc nvmf_create_subsystem "$nqn" -s SPDK00000000000001 &&
        srpc nvmf_subsystem_add_ns "$nqn" Malloc0 &&
        srpc nvmf_subsystem_add_listener "$nqn" -t tcp -a 127.0.0.1 -s "$spdk_port" -f ipv4 &&
        configure_hosts "$work/spdk.sock"
} > "$work/spdk-rpc.log" 2>&1 || die spdk-configure "$(tail -n 3 "$work/spdk-rpc.log" | tr '\n' ' ')"

# An authenticated run on kvtarget spanning every refusal below: stopped by SIGINT
# once they are done (perf then reports as at the end of its -t, over the time it
# ran), so no fixed length has to outlast them on a slow machine; -t bounds a hang.
bg_shm=$((shm_id + 1))
"$perf" -i "$bg_shm" -c "$host_core" -q 8 -o 4096 -w randrw -M 50 -t 600 -r "$(trid "$kv_port" "$uni")" \
    --dhchap-key "$work/uni.key" > "$work/kv-background.out" 2>&1 &
bg_pid=$!
pids+=("$bg_pid")
sleep 2
# Its queues list how they authenticated (SPDK's nvmf_subsystem_get_qpairs "auth").
python3 "$rpc_py" -s "$work/kv.sock" nvmf_subsystem_get_qpairs "$nqn" > "$work/kv-qpairs.json" 2>&1
if python3 - "$work/kv-qpairs.json" "$uni" <<'PY'
import json, sys
q = [x for x in json.load(open(sys.argv[1])) if x.get("hostnqn") == sys.argv[2]]
ok = len(q) >= 2 and all(x.get("auth") == {"state": "completed", "digest": "sha512", "dhgroup": "ffdhe8192"} for x in q)
sys.exit(0 if ok else 1)
PY
then
    ok "qpairs-auth-listed (nvmf_subsystem_get_qpairs: admin and I/O queue completed, sha512/ffdhe8192)"
else
    bad qpairs-auth-listed "$(head -c 600 "$work/kv-qpairs.json" | tr '\n' ' ')"
fi

# case NAME EXPECTED KV_LOG_PATTERN HOST [perf options]
case_() {
    local c=$1 want=$2 pattern=$3 h=$4; shift 4
    local lines vk vs
    lines=$(wc -l < "$work/kv.log")
    verdict kv "$c" "$h" "$@"
    vk=$V
    verdict spdk "$c" "$h" "$@"
    vs=$V
    if [ "$vk" != "$want" ]; then
        bad "$c" "kvtarget: $vk (want $want; SPDK nvmf_tgt: $vs)"
    elif [ "$vs" != "$want" ]; then
        bad "$c" "SPDK nvmf_tgt: $vs (want $want), so the case itself is wrong"
    elif [ -n "$pattern" ] && ! tail -n +"$((lines + 1))" "$work/kv.log" | grep -q -- "$pattern"; then
        bad "$c" "kvtarget $want it, but logged no '$pattern': $(tail -n +"$((lines + 1))" "$work/kv.log" | grep -v INFO | tail -n 2 | tr '\n' ' ' | cut -c1-400)"
    else
        ok "$c ($want by kvtarget and by SPDK nvmf_tgt)"
    fi
}
case_ uni attached 'host authenticated .*qid=1 digest="sha512" dhgroup="ffdhe8192"' "$uni" \
    --dhchap-key "$work/uni.key"
case_ bidi attached 'host and controller authenticated .*qid=1' "$bidi" \
    --dhchap-key "$work/bidi.key" --dhchap-ctrlr-key "$work/ctrl.key"
case_ plain attached '' "$plain"
case_ wrong-key refused "does not match key \`uni\`" "$uni" --dhchap-key "$work/wrong.key"
case_ missing-key refused 'queue closed before it authenticated' "$uni"
case_ wrong-ctrlr-key refused "refused the controller's response" "$bidi" \
    --dhchap-key "$work/bidi.key" --dhchap-ctrlr-key "$work/wrong-ctrl.key"
case_ unconfigured-ctrlr-key refused 'no dhchap_ctrlr_key' "$uni" \
    --dhchap-key "$work/uni.key" --dhchap-ctrlr-key "$work/ctrl.key"

# Key rotation (nvmf_subsystem_set_keys): the old key stops working, the new one
# works, and the queues authenticated with the old one (the background run) carry on.
for s in kv.sock spdk.sock; do
    python3 "$rpc_py" -s "$work/$s" keyring_file_add_key rotated "$work/rotated.key" &&
        python3 "$rpc_py" -s "$work/$s" nvmf_subsystem_set_keys "$nqn" "$uni" --dhchap-key rotated
done > "$work/rotate-rpc.log" 2>&1 || bad rotate-keys "rpc.py nvmf_subsystem_set_keys: $(tail -n 2 "$work/rotate-rpc.log" | tr '\n' ' ')"
case_ rotated-old-key refused "does not match key \`rotated\`" "$uni" --dhchap-key "$work/uni.key"
case_ rotated-new-key attached 'host authenticated .*qid=1' "$uni" --dhchap-key "$work/rotated.key"
spanned=0
kill -0 "$bg_pid" 2>/dev/null && spanned=1
kill -INT "$bg_pid" 2>/dev/null

wait "$bg_pid"
bg_rc=$?
if [ "$spanned" != 1 ]; then
    bad others-carry-on "the background run ended before the refusals and the rotation did: exit $bg_rc: $(excerpt "$work/kv-background.out")"
elif [ "$bg_rc" = 0 ] && positive "$(total_iops "$work/kv-background.out")" \
    && ! grep -q 'completed with error' "$work/kv-background.out"; then
    ok "others-carry-on (an authenticated run across the refusals and the key rotation: $(total_iops "$work/kv-background.out") IOPS, no errors)"
else
    bad others-carry-on "exit $bg_rc: $(excerpt "$work/kv-background.out")"
fi
failures=$(grep -c 'WARN.*\(DH-HMAC-CHAP: \|queue closed before it authenticated\)' "$work/kv.log")
[ "$failures" -ge 5 ] && ok "refusals-logged ($failures warning lines)" \
    || bad refusals-logged "only $failures DH-HMAC-CHAP warning lines"

# --- keys never appear in logs or listings ---
leak=
for k in uni bidi ctrl; do
    secret=$(cut -d: -f3 "$work/$k.key")
    grep -qF -- "$secret" "$work/kv.log" && leak+="kv.log has $k; "
    python3 "$rpc_py" -s "$work/kv.sock" nvmf_get_subsystems | grep -qF -- "$secret" && leak+="nvmf_get_subsystems has $k; "
    python3 "$rpc_py" -s "$work/kv.sock" keyring_get_keys | grep -qF -- "$secret" && leak+="keyring_get_keys has $k; "
done
"$bin" rpc -r "$work/kv.sock" kvtarget_save_config path="$work/saved.toml" > "$work/save.out" 2>&1
for k in uni bidi ctrl; do
    grep -qF -- "$(cut -d: -f3 "$work/$k.key")" "$work/saved.toml" && leak+="kvtarget_save_config has $k; "
done
if [ -n "$leak" ]; then
    bad keys-stay-secret "$leak"
elif ! grep -q 'dhchap_ctrlr_key = "ctrl"' "$work/saved.toml" \
    || ! grep -qF "path = \"$work/ctrl.key\"" "$work/saved.toml"; then
    bad keys-stay-secret "kvtarget_save_config lacks the key names or paths: $(cat "$work/save.out" "$work/saved.toml" 2>&1 | head -c 600 | tr '\n' ' ')"
else
    ok "keys-stay-secret (logs, nvmf_get_subsystems, keyring_get_keys, kvtarget_save_config: names and paths only)"
fi

# --- bdevperf: bdev_nvme with keyring keys, every block compared ---
cat > "$work/bdevperf.json" <<EOF
{"subsystems": [
 {"subsystem": "keyring", "config": [
  {"method": "keyring_file_add_key", "params": {"name": "bidi", "path": "$work/bidi.key"}},
  {"method": "keyring_file_add_key", "params": {"name": "ctrl", "path": "$work/ctrl.key"}}]},
 {"subsystem": "bdev", "config": [
  {"method": "bdev_nvme_attach_controller",
   "params": {"name": "kvt", "trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1",
              "trsvcid": "$kv_port", "subnqn": "$nqn", "hostnqn": "$bidi",
              "dhchap_key": "bidi", "dhchap_ctrlr_key": "ctrl"}}]}]}
EOF
run bdevperf "$bdevperf" -m "$host_core" --json "$work/bdevperf.json" --no-pci --disable-cpumask-locks \
    -w verify -q 16 -o 65536 -t 1
iops=$(total_iops "$OUT")
if grep -q 'Buffer mismatch' "$OUT"; then
    bad bdevperf-verify "data read back differs: $(grep -m 2 'Buffer mismatch' "$OUT" | tr '\n' ' ')"
elif [ "$RC" != 0 ] || ! positive "$iops"; then
    bad bdevperf-verify "exit $RC: $(excerpt "$OUT")"
else
    ok "bdevperf-verify (bidirectional, 64 KiB QD16, $iops IOPS, every read compared)"
fi

# --- negotiation within [auth], keys and host entries from the configuration ---
keys_toml="[[keys]]
name = \"uni\"
path = \"$work/uni.key\"

[[keys]]
name = \"bidi\"
path = \"$work/bidi.key\"

[[keys]]
name = \"ctrl\"
path = \"$work/ctrl.key\""
hosts_toml="{ nqn = \"$uni\", dhchap_key = \"uni\" }, { nqn = \"$bidi\", dhchap_key = \"bidi\", dhchap_ctrlr_key = \"ctrl\" }"
for policy in sha256/null sha384/ffdhe3072; do
    d=${policy%/*} g=${policy#*/}
    name=kv-$d-$g
    port=$(free_port)
    start_kvtarget "$name" "$port" "[auth]
dhchap_digests = [\"$d\"]
dhchap_dhgroups = [\"$g\"]

$keys_toml" "$hosts_toml"
    run "$name-bidi" "$perf" -c "$host_core" -q 8 -o 4096 -w randrw -M 50 -t 1 -r "$(trid "$port" "$bidi")" \
        --dhchap-key "$work/bidi.key" --dhchap-ctrlr-key "$work/ctrl.key"
    if ! positive "$(total_iops "$OUT")" || grep -q 'completed with error' "$OUT"; then
        bad "$name" "exit $RC: $(excerpt "$OUT")"
    elif [ "$(grep -c "host and controller authenticated .*digest=\"$d\" dhgroup=\"$g\"" "$work/$name.log")" -lt 2 ]; then
        bad "$name" "admin and I/O queue did not both negotiate $d/$g: $(grep 'DH-HMAC-CHAP' "$work/$name.log" | tail -n 2 | tr '\n' ' ')"
    else
        ok "$name (SPDK's host offered every hash and group; both queues used $d/$g)"
    fi
done

summary
[ "$fail" = 0 ]
