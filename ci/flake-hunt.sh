#!/usr/bin/env bash
# Runs the timing-sensitive tests ROUNDS times each while a CPU hog keeps every core
# busy, and prints each test's pass count: a test that fails only when the machine is
# busy is a defect (CI machines are busy). Not part of ci/test.sh.
#
#   ci/flake-hunt.sh [ROUNDS] [--only REGEX] [--no-hog] [--guest]
#
# The tests: tests/cluster.rs, tests/reactor_faults.rs, tests/idle_wakeups.rs,
# tests/kv.rs (its perf tests are short timed runs of `kvtarget perf`, one SIGKILLs
# the daemon under load), tests/tcp_target.rs's perf tests, tests/pool_no_alloc.rs
# (no allocation on a warm reactor), tests/systemd.rs (watchdog pings), and with
# --guest the
# interop suite's cluster-failover scenario in the QEMU guest (one boot per round;
# needs target/ci/bin/kvtarget and SPDK as ci/test.sh builds them).
# The hog: one busy loop per core at the tests' own priority. Logs of failed rounds
# are kept in target/flake-hunt/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD
rounds=20 only= hog=1 guest=
while [ $# -gt 0 ]; do
    case "$1" in
        --only) only=$2; shift 2 ;;
        --no-hog) hog=; shift ;;
        --guest) guest=1; shift ;;
        [0-9]*) rounds=$1; shift ;;
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        *) echo "flake-hunt: unknown argument $1" >&2; exit 2 ;;
    esac
done
out=$repo/target/flake-hunt
rm -rf "$out"; mkdir -p "$out"

hog_pids=()
stop_hog() { [ ${#hog_pids[@]} = 0 ] || kill "${hog_pids[@]}" 2>/dev/null || true; hog_pids=(); }
trap stop_hog EXIT
start_hog() {
    [ -n "$hog" ] || return 0
    local i
    for i in $(seq "$(nproc)"); do
        bash -c 'while :; do :; done' & hog_pids+=($!)
    done
}

# The test binaries, built once (outside the hog).
declare -A bin_of=()
for t in cluster reactor_faults idle_wakeups kv tcp_target pool_no_alloc systemd; do
    bin_of[$t]=$(cargo test --no-run --test "$t" --message-format=json 2>/dev/null \
        | python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["kind"]==["test"]:
        print(m["executable"])' | tail -n 1)
    [ -x "${bin_of[$t]}" ] || { echo "flake-hunt: could not build tests/$t.rs" >&2; exit 1; }
done
# name  binary  test filter (libtest's, exact names where given)
cases=(
    "cluster cluster ''"
    "reactor_faults reactor_faults ''"
    "idle_wakeups idle_wakeups ''"
    "kv kv ''"
    "tcp_perf tcp_target perf_"
    "pool_no_alloc pool_no_alloc ''"
    "systemd systemd ''"
)
declare -A pass=() runs=()
start_hog
for c in "${cases[@]}"; do
    eval "set -- $c"
    name=$1 b=${bin_of[$2]} filter=$3
    [ -z "$only" ] || echo "$name" | grep -qE "$only" || continue
    for r in $(seq "$rounds"); do
        log=$out/$name-$r.log
        # --test-threads as cargo test runs them; each test's verdict counts.
        "$b" $filter > "$log" 2>&1 || true
        while read -r tname verdict; do
            runs[$name::$tname]=$(( ${runs[$name::$tname]:-0} + 1 ))
            [ "$verdict" = ok ] && pass[$name::$tname]=$(( ${pass[$name::$tname]:-0} + 1 ))
        done < <(sed -n 's/^test \(.*\) \.\.\. \(ok\|FAILED\)$/\1 \2/p' "$log")
        echo "flake-hunt: $name round $r/$rounds: $(grep -c '\.\.\. ok$' "$log") ok, $(grep -c '\.\.\. FAILED$' "$log") failed"
        grep -q '^test result: ok' "$log" && rm -f "$log"
    done
done
if [ -n "$guest" ] && { [ -z "$only" ] || echo cluster-failover | grep -qE "$only"; }; then
    env_file=$repo/target/ci/spdk.env
    [ -s "$env_file" ] && source "$env_file"
    for r in $(seq "$rounds"); do
        log=$out/cluster-failover-$r.log
        name=guest::cluster-failover
        runs[$name]=$(( ${runs[$name]:-0} + 1 ))
        if KVTARGET_BIN=$repo/target/ci/bin/kvtarget INTEROP_OUT=$out/interop-$r \
                ci/interop.sh --target kvtarget --only '^cluster-failover$' > "$log" 2>&1; then
            pass[$name]=$(( ${pass[$name]:-0} + 1 ))
            rm -rf "$log" "$out/interop-$r"
        fi
        echo "flake-hunt: cluster-failover round $r/$rounds: ${pass[$name]:-0} passed so far"
    done
fi
stop_hog
echo
echo "flake-hunt: $rounds rounds$([ -n "$hog" ] && echo " under a CPU hog on $(nproc) cores"), passes per test:"
bad=0
for k in $(printf '%s\n' "${!runs[@]}" | sort); do
    printf '  %-80s %3d/%d\n' "$k" "${pass[$k]:-0}" "${runs[$k]}"
    [ "${pass[$k]:-0}" = "${runs[$k]}" ] || bad=1
done
[ "$bad" = 0 ] || echo "flake-hunt: logs of the failed rounds in $out"
exit "$bad"
