#!/usr/bin/env bash
# Regenerates tests/data/golden/ from diffusers and transformers (pinned in requirements.txt),
# installed into the same virtual environment as the pinned torch. Not needed by CI: the outputs
# are committed. Arguments name the parts to regenerate (default: all).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
venv=${DP_VENV:-$HOME/.cache/dp-launch/venv}
DP_WITH_TORCH=1 "$root/scripts/setup.sh" >/dev/null
"$venv/bin/pip" install -q --disable-pip-version-check -r "$root/scripts/golden/requirements.txt"
# CLIP's BPE merges, as the open_clip_torch package ships them (only that file is used).
wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT
"$venv/bin/pip" download -q --no-deps -d "$wheels" open_clip_torch==3.3.0
(cd "$wheels" && unzip -q -o open_clip_torch-*.whl 'open_clip/bpe_simple_vocab_16e6.txt.gz')
export DP_CLIP_BPE_GZ="$wheels/open_clip/bpe_simple_vocab_16e6.txt.gz"
"$venv/bin/python" "$root/scripts/golden/make_golden.py" "$@"
