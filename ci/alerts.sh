#!/usr/bin/env bash
# The alert rules and the dashboard (issue 58), without a target:
#   - `promtool check rules` on deploy/prometheus/alerts.yml;
#   - `promtool test rules` on deploy/prometheus/alerts_test.yml (each alert
#     fires on the series of its fault and stays quiet on healthy ones);
#   - every query of deploy/grafana/kvtarget.json parses as PromQL (each is
#     checked by promtool as a recording rule, Grafana's variables set).
# That every metric they name is one kvtarget exports is a cargo test
# (tests/deploy.rs), run with the others.
#
#   ci/alerts.sh
#
# Needs promtool (Debian's prometheus, ci/lib/debian.sh's group tools: run by
# hand as root it installs it when missing, inside ci/test.sh it only checks)
# and python3. No target, no network. About a second.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "alerts.sh: $*" >&2; }
die() { echo "alerts.sh: $*" >&2; exit 1; }
source ci/lib/debian.sh
install_debs tools   # promtool: Debian's prometheus package
command -v python3 >/dev/null || die "python3 missing"

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

promtool check rules deploy/prometheus/alerts.yml >"$dir/check.log" 2>&1 ||
    { cat "$dir/check.log" >&2; die "promtool check rules: alerts.yml is not valid"; }
promtool test rules deploy/prometheus/alerts_test.yml >"$dir/test.log" 2>&1 ||
    { cat "$dir/test.log" >&2; die "promtool test rules: an alert rule failed its unit test"; }
echo "alerts.sh: $(grep -c '^ *- alert:' deploy/prometheus/alerts.yml) alert rules checked and unit-tested"

# Grafana's variables as a query sees them: a rate interval and a regex.
python3 - deploy/grafana/kvtarget.json >"$dir/dashboard-rules.yml" <<'PY' || die "dashboard: not valid JSON"
import json, sys
queries = []
def walk(v):
    if isinstance(v, dict):
        for k, x in v.items():
            if k == "expr" and isinstance(x, str):
                queries.append(x)
            else:
                walk(x)
    elif isinstance(v, list):
        for x in v:
            walk(x)
walk(json.load(open(sys.argv[1])))
print("groups:\n  - name: dashboard\n    rules:")
for i, q in enumerate(queries):
    q = q.replace("$__rate_interval", "5m").replace("$instance", ".*")
    print(f"      - record: dashboard:query{i}\n        expr: {json.dumps(q)}")
PY
n=$(grep -c 'record:' "$dir/dashboard-rules.yml")
[[ $n -gt 0 ]] || die "dashboard: no queries found"
promtool check rules "$dir/dashboard-rules.yml" >"$dir/dash.log" 2>&1 ||
    { cat "$dir/dash.log" >&2; die "dashboard: a query is not valid PromQL"; }
echo "alerts.sh: $n dashboard queries parse as PromQL"
