#!/usr/bin/env bash
# The C++ FLUX.1 pipeline against diffusers' FluxPipeline, same weights and settings, side by side,
# dev with and without true CFG, and schnell (see the .py).
#
#   scripts/bench/flux_vs_diffusers.sh [tiny] [medium] [schnell]      (default: all)
#   DP_BENCH_RUNS=N          runs a side, the faster kept (default 2)
#   DP_BENCH_SKIP_SETUP=1    use the build as it is (default: scripts/setup.sh first)
exec "$(dirname "${BASH_SOURCE[0]}")/venv_bench.sh" flux_vs_diffusers.py dp-generate "$@"
