#!/usr/bin/env bash
# The first-block step cache against no cache and against diffusers' FirstBlockCache, side by side
# in one run, on a medium random FLUX.1-dev (see step_cache.py; figures in docs/benchmarks.md,
# "Step cache").
#
#   scripts/bench/step_cache.sh [--runs N]        (default 3 rounds; about 4 minutes a round on 2 cores)
#   DP_BENCH_SKIP_SETUP=1    use the build as it is (default: scripts/setup.sh first)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${DP_BUILD_DIR:-$root/build}
venv=${DP_VENV:-$HOME/.cache/dp-launch/venv}
if [[ -z ${DP_BENCH_SKIP_SETUP:-} ]]; then
    setup_log=$(mktemp)
    "$root/scripts/setup.sh" >"$setup_log" 2>&1 || { cat "$setup_log" >&2; exit 1; }
fi
for f in "$build/bin/dp-launch" "$build/bin/dp-worker"; do
    [[ -x $f ]] || { echo "no $f (build first, or set DP_BUILD_DIR)" >&2; exit 1; }
done
"$venv/bin/pip" install -q --disable-pip-version-check -r "$root/scripts/golden/requirements.txt"
exec "$venv/bin/python" "$root/scripts/bench/step_cache.py" "$build/bin/dp-launch" "$@"
