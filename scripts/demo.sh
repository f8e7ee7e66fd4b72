#!/usr/bin/env bash
# Sets up if needed, then runs the main job on the built-in default: two ranks split
# examples/prompts.txt and write outputs/ (the PNGs, manifest.jsonl and index.html, a gallery to
# open in a browser). The default model is the shapes model this project trained and ships
# (models/shapes-sd3): each image shows the shapes, colours and places its prompt asks for.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${DP_BUILD_DIR:-$root/build}
# Only what the demo runs: the launcher and the worker (./scripts/test.sh builds the rest).
DP_BUILD_TARGETS="dp-launch dp-worker" "$root/scripts/setup.sh"
cd "$root"
echo "+ dp-launch -n 2 --overwrite examples/prompts.txt"
exec "$build/bin/dp-launch" -n 2 --overwrite examples/prompts.txt
