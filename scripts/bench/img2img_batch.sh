#!/usr/bin/env bash
# A batch edit of 16 images, dp-launch against a diffusers FluxImg2ImgPipeline loop (see the .py).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${DP_BUILD_DIR:-$root/build}
venv=${DP_VENV:-$HOME/.cache/dp-launch/venv}
setup_log=$(mktemp)
"$root/scripts/setup.sh" >"$setup_log" 2>&1 || { cat "$setup_log" >&2; exit 1; }
"$venv/bin/pip" install -q --disable-pip-version-check -r "$root/scripts/golden/requirements.txt"
exec "$venv/bin/python" "$root/scripts/bench/img2img_batch.py" "$build/bin/dp-launch"
