#!/usr/bin/env bash
# What a full KV namespace evicts (issue 37 item 1): the index alone, no I/O, seeded,
# so every figure is a property of the eviction policy and the machine's load does not
# change it (it may run beside other work). Two tables (benches/kv_eviction.rs says
# how each is made):
#   - large values after a mixed-size churn: free space when Stores start evicting,
#     keys of the newest eighth of capacity found missing after a Store (target 0),
#     survivors by tenth of store order;
#   - Zipf 0.99 cache-aside hit rate against an exact LRU of the same capacity.
#
#   bench/run-kv-eviction.sh [--record]
#
#   --record   append the tables to bench/RESULTS.md (date, commit, command)
set -euo pipefail
cd "$(dirname "$0")/.."
record=0
for a in "$@"; do
    case "$a" in
    --record) record=1 ;;
    *) echo "run-kv-eviction.sh: unknown option '$a' (known: --record)" >&2; exit 2 ;;
    esac
done
out=$(cargo bench --bench kv_eviction 2>/dev/null)
echo "$out"
if [ "$record" = 1 ]; then
    {
        echo
        echo "### KV eviction, $(date -u +%Y-%m-%d) at $(git rev-parse --short HEAD)"
        echo
        echo "\`bench/run-kv-eviction.sh\` (deterministic: the index alone, seeds 1-6)."
        echo
        echo "$out"
    } >> bench/RESULTS.md
fi
