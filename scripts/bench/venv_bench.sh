#!/usr/bin/env bash
# What the Python benchmarks that run the build against diffusers share: scripts/setup.sh first
# (unless DP_BENCH_SKIP_SETUP=1), the golden scripts' requirements in the venv, then
# `python scripts/bench/SCRIPT BUILD/bin/PROGRAM ARGS...`.
#
#   scripts/bench/venv_bench.sh SCRIPT PROGRAM [ARGS...]     DP_BUILD_DIR, DP_VENV as the others
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${DP_BUILD_DIR:-$root/build}
venv=${DP_VENV:-$HOME/.cache/dp-launch/venv}
script=$1 program=$2
shift 2
if [[ -z ${DP_BENCH_SKIP_SETUP:-} ]]; then
    setup_log=$(mktemp)
    "$root/scripts/setup.sh" >"$setup_log" 2>&1 || { cat "$setup_log" >&2; exit 1; }
fi
for f in "$build/bin/$program" "$build/bin/dp-worker"; do
    [[ -x $f ]] || { echo "no $f (build it, or set DP_BUILD_DIR)" >&2; exit 1; }
done
"$venv/bin/pip" install -q --disable-pip-version-check -r "$root/scripts/golden/requirements.txt"
exec "$venv/bin/python" "$root/scripts/bench/$script" "$build/bin/$program" "$@"
