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
# The CPU code paths the tests pin (Note [Tests pin the CPU code paths], tests/unit/main.cpp), so
# that the golden tensors are what any of our machines computes, not what this one's widest
# instruction set does.
export ATEN_CPU_CAPABILITY=${ATEN_CPU_CAPABILITY:-avx2} MKL_CBWR=${MKL_CBWR:-AVX2,STRICT}
export ONEDNN_MAX_CPU_ISA=${ONEDNN_MAX_CPU_ISA:-AVX2}
export DP_CLIP_BPE_GZ="$wheels/open_clip/bpe_simple_vocab_16e6.txt.gz"
"$venv/bin/python" "$root/scripts/golden/make_golden.py" "$@"
