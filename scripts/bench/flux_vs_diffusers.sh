#!/usr/bin/env bash
# The C++ FLUX.1 pipeline against diffusers' FluxPipeline, same weights and settings, side by side,
# dev with and without true CFG, and schnell (see the .py).
#
#   scripts/bench/flux_vs_diffusers.sh [tiny] [medium] [schnell]      (default: all)
#   DP_BENCH_RUNS=N          runs a side, the faster kept (default 2)
#   DP_BENCH_SKIP_SETUP=1    use the build as it is (default: scripts/setup.sh first)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${DP_BUILD_DIR:-$root/build}
venv=${DP_VENV:-$HOME/.cache/dp-launch/venv}
if [[ -z ${DP_BENCH_SKIP_SETUP:-} ]]; then
    setup_log=$(mktemp)
    "$root/scripts/setup.sh" >"$setup_log" 2>&1 || { cat "$setup_log" >&2; exit 1; }
fi
[[ -x $build/bin/dp-generate ]] || { echo "no $build/bin/dp-generate (build the dp-generate target, or set DP_BUILD_DIR)" >&2; exit 1; }
"$venv/bin/pip" install -q --disable-pip-version-check -r "$root/scripts/golden/requirements.txt"
exec "$venv/bin/python" "$root/scripts/bench/flux_vs_diffusers.py" "$build/bin/dp-generate" "$@"
