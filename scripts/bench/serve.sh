#!/usr/bin/env bash
# dp-launch serve against batch jobs of the same prompts, side by side (serve.py); figures in
# docs/serve.md, "What a request costs".
#
#   scripts/bench/serve.sh [--prompts N] [--rounds R] [--ranks N] [--steps N] [--model M] [--flags "..."]
#   DP_BENCH_SKIP_SETUP=1    use the build as it is (default: scripts/setup.sh first)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${DP_BUILD_DIR:-$root/build}
if [[ -z ${DP_BENCH_SKIP_SETUP:-} ]]; then
    setup_log=$(mktemp)
    "$root/scripts/setup.sh" >"$setup_log" 2>&1 || { cat "$setup_log" >&2; exit 1; }
fi
exec python3 "$root/scripts/bench/serve.py" "$build/bin/dp-launch" "$@"
