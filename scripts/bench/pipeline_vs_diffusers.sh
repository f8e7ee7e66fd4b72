#!/usr/bin/env bash
# The C++ SD3 pipeline against diffusers, same weights and settings, side by side (see the .py).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${DP_BUILD_DIR:-$root/build}
venv=${DP_VENV:-$HOME/.cache/dp-launch/venv}
setup_log=$(mktemp)
"$root/scripts/setup.sh" >"$setup_log" 2>&1 || { cat "$setup_log" >&2; exit 1; }
"$venv/bin/pip" install -q --disable-pip-version-check -r "$root/scripts/golden/requirements.txt"
exec "$venv/bin/python" "$root/scripts/bench/pipeline_vs_diffusers.py" "$build/bin/dp-generate"
