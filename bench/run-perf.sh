#!/usr/bin/env bash
# Runs kvtarget perf profiles against a freshly started target (pinned to core 0,
# perf on core 1) and appends rows to bench/RESULTS.md. Each profile runs on the
# file-backed namespace and on the RAM namespace of the same target in the same run.
#
#   bench/run-perf.sh [seconds-per-profile]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-5}
cargo build --release -q
bin=target/release/kvtarget
nqn=nqn.2026-11.io.kvtarget:bench
"$bin" --config bench/perf-baseline.toml 2>/tmp/kvtarget-bench.log &
tgt=$!
trap 'kill $tgt 2>/dev/null; wait $tgt 2>/dev/null' EXIT
for _ in $(seq 300); do grep -q "listening on 127.0.0.1:4430" /tmp/kvtarget-bench.log && break; sleep 0.1; done
# Pre-fill the file so reads hit allocated blocks.
taskset -c 1 "$bin" perf --addr 127.0.0.1:4430 --nqn $nqn --nsid 1 --workload write --bs 1MiB --qd 4 --time "$secs" --warmup 0 --cpus 1 --quiet >/dev/null
rev=$(git rev-parse --short HEAD)
{
  echo
  echo "### $(date -u +%Y-%m-%d) commit $rev, ${secs}s per profile, $(nproc) cores, target core 0 busy-poll, perf core 1"
  echo
  echo "| profile | nsid 1 uring IOPS | p99 us | nsid 2 ram IOPS | p99 us | uring/ram IOPS |"
  echo "|---|---|---|---|---|---|"
} >> bench/RESULTS.md
for p in "randread 4KiB 1" "randread 4KiB 32" "randwrite 4KiB 32" "randrw 4KiB 32" "read 128KiB 16" "write 1MiB 4"; do
  set -- $p
  row="| $1 $2 QD$3 |"
  declare -A iops=()
  for ns in 1 2; do
    out=$(taskset -c 1 "$bin" perf --addr 127.0.0.1:4430 --nqn $nqn --nsid $ns --workload "$1" --bs "$2" --qd "$3" --time "$secs" --warmup 1 --cpus 1 --json --quiet)
    i=$(sed -E 's/.*"iops":([0-9.]+).*/\1/' <<<"$out")
    p99=$(sed -E 's/.*"p99":([0-9.]+).*/\1/' <<<"$out")
    iops[$ns]=$i
    row="$row ${i%.*} | $p99 |"
  done
  ratio=$(awk -v a="${iops[1]}" -v b="${iops[2]}" 'BEGIN{ if (b>0) printf "%.2f", a/b; else print "-" }')
  echo "$row $ratio |" >> bench/RESULTS.md
  echo "$row $ratio |"
done
