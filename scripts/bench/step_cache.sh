#!/usr/bin/env bash
# The step caches (first block, TaylorSeer, MagCache) against no cache and against diffusers' own,
# side by side in one run, on a medium random FLUX.1-dev (see step_cache.py; figures in
# docs/benchmarks.md, "Step cache").
#
#   scripts/bench/step_cache.sh [--runs N] [--threshold T] [--launch "-n 2"] [--caches first_block,taylorseer,mag]
#       (default 3 rounds, about 4.5 minutes each on 2 cores, the threshold searched; with --launch,
#       dp-launch's sides only, under that strategy)
#   DP_BENCH_SKIP_SETUP=1    use the build as it is (default: scripts/setup.sh first)
exec "$(dirname "${BASH_SOURCE[0]}")/venv_bench.sh" step_cache.py dp-launch "$@"
