#!/usr/bin/env bash
# FLUX.1-Kontext's step time with its reference image, one process against --ulysses 2 (see the .py).
#
#   scripts/bench/kontext_ulysses.sh [--rounds R]
#   DP_BENCH_SKIP_SETUP=1    use the build as it is (default: scripts/setup.sh first)
exec "$(dirname "${BASH_SOURCE[0]}")/venv_bench.sh" kontext_ulysses.py dp-launch "$@"
