#!/usr/bin/env bash
# Regenerates tests/data/golden/ from diffusers and transformers (pinned in requirements.txt),
# installed into the same virtual environment as the pinned torch. Not needed by CI: the outputs
# are committed. Arguments name the parts to regenerate (default: all).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
venv=${DP_VENV:-$HOME/.cache/dp-launch/venv}
DP_WITH_TORCH=1 "$root/scripts/setup.sh" >/dev/null
"$venv/bin/pip" install -q --disable-pip-version-check -r "$root/scripts/golden/requirements.txt"
exec "$venv/bin/python" "$root/scripts/golden/make_golden.py" "$@"
