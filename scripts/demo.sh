#!/usr/bin/env bash
# Sets up if needed, then runs the main job on the built-in default: two ranks split
# examples/prompts.txt and write outputs/ (PNGs and manifest.jsonl). The default model is still a
# tiny random SD3 (models/tiny-random-sd3), so the images are noise; every code path is the one a
# real SD3 checkpoint runs.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${DP_BUILD_DIR:-$root/build}
"$root/scripts/setup.sh"
cd "$root"
echo "+ dp-launch -n 2 --overwrite examples/prompts.txt"
exec "$build/bin/dp-launch" -n 2 --overwrite examples/prompts.txt
