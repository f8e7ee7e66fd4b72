#!/usr/bin/env bash
# A batch edit of 16 images, dp-launch against a diffusers FluxImg2ImgPipeline loop (see the .py).
#
#   scripts/bench/img2img_batch.sh
#   DP_BENCH_SKIP_SETUP=1    use the build as it is (default: scripts/setup.sh first)
exec "$(dirname "${BASH_SOURCE[0]}")/venv_bench.sh" img2img_batch.py dp-launch "$@"
