#!/usr/bin/env bash
# The C++ Z-Image pipeline against diffusers, same weights and settings, side by side, with and
# without guidance (see the .py).
#
#   scripts/bench/z_image_vs_diffusers.sh [tiny] [medium]      (default: both)
#   DP_BENCH_RUNS=N          runs a side, the faster kept (default 2)
#   DP_BENCH_SKIP_SETUP=1    use the build as it is (default: scripts/setup.sh first)
exec "$(dirname "${BASH_SOURCE[0]}")/venv_bench.sh" z_image_vs_diffusers.py dp-generate "$@"
