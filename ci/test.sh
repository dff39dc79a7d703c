#!/usr/bin/env bash
# The project's test command (README): every stage of ci/pipeline.py in order, each
# with a time cap, its jobs (ci/jobs.sh) side by side where they can be; one table of
# stage times at the end. docs/testing.md describes every stage.
#
#   ci/test.sh                   everything (what .ci/run runs)
#   ci/test.sh --quick           lint, cargo tests, simulations, fuzzing (no guest)
#   ci/test.sh --list            the stages, their caps and jobs
#   ci/test.sh --stage NAME      one stage or job, and the jobs it needs
set -euo pipefail
cd "$(dirname "$0")/.."
exec /usr/bin/env python3 ci/pipeline.py "$@"
