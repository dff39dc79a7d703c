#!/usr/bin/env bash
# Runs the volume-layer benchmark (benches/pool.rs) and appends its table to
# bench/RESULTS.md. Every row compares against a baseline from the same run.
#
#   bench/run-pool-bench.sh [seconds-per-measurement]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-5}
log=$(mktemp /tmp/kvtarget-poolbench.XXXXXX)
if ! KVT_BENCH_SECS=$secs cargo bench --bench pool > "$log" 2>&1; then
  echo "pool benchmark failed; its output:" >&2
  tail -20 "$log" >&2
  exit 1
fi
out=$(sed -n "/^rows:/,\$p" "$log" | tail -n +2)
rev=$(git rev-parse --short HEAD)
{
  echo
  echo "### $(date -u +%Y-%m-%d) commit $rev: volumes (benches/pool.rs), ${secs}s per measurement, $(nproc) cores"
  echo
  echo "| measurement | figure | against | ratio |"
  echo "|---|---|---|---|"
  echo "$out"
} >> bench/RESULTS.md
echo "$out"
