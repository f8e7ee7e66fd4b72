#!/usr/bin/env bash
# The main job against the machine's limit and against diffusers (machine_limit.py): phase split,
# MFU, int8 and bf16, on the medium FLUX.1-dev, SD3 and Qwen-Image; figures in docs/benchmarks.md,
# "Close to the machine's limit".
#
#   scripts/bench/machine_limit.sh [--runs N] [--models flux,sd3,qwen] [--steps N] [--prompts N]
#   DP_BENCH_SKIP_SETUP=1    use the build as it is (default: scripts/setup.sh first)
exec "$(dirname "${BASH_SOURCE[0]}")/venv_bench.sh" machine_limit.py dp-launch "$@"
