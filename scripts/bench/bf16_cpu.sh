#!/usr/bin/env bash
# bf16 against fp32 on the CPU, dp-launch and diffusers, side by side
# in one run, on a medium random FLUX.1-dev (see bf16_cpu.py; figures in docs/benchmarks.md,
# "bf16 on the CPU").
#
#   scripts/bench/bf16_cpu.sh [--runs N] [--steps N]      (default 3 rounds of 8 steps)
#   DP_BENCH_SKIP_SETUP=1    use the build as it is (default: scripts/setup.sh first)
exec "$(dirname "${BASH_SOURCE[0]}")/venv_bench.sh" bf16_cpu.py dp-launch "$@"
