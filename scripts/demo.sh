#!/usr/bin/env bash
# Sets up if needed, then runs the main job on the built-in default. Until the diffusion worker
# lands, the job is a torch.distributed example: two ranks rendezvous through dp-launch's
# environment and all-reduce a tensor, exactly as under torchrun.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${DP_BUILD_DIR:-$root/build}
venv=${DP_VENV:-$HOME/.cache/dp-launch/venv}
"$root/scripts/setup.sh"
echo "+ dp-launch -n 2 -- python examples/hello_distributed.py"
exec "$build/bin/dp-launch" -n 2 -- "$venv/bin/python" "$root/examples/hello_distributed.py"
