#!/usr/bin/env bash
# Data-parallel scaling of the main job on this machine: the same prompt file with 1 and 2
# processes (then 4 when the machine has at least 4 CPUs), median of 3 runs each.
#   scripts/bench/data_parallel.sh [PROMPTS] [STEPS]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${DP_BUILD_DIR:-$root/build}
prompts=${1:-$root/examples/prompts.txt}
steps=${2:-8}
setup_log=$(mktemp)
"$root/scripts/setup.sh" >"$setup_log" 2>&1 || { cat "$setup_log" >&2; exit 1; }
cpus=$(nproc)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
counts=(1 2)
((cpus >= 4)) && counts+=(4)
n_prompts=$(grep -cv '^[[:space:]]*$' "$prompts")
echo "machine: $cpus CPUs; $n_prompts prompts from $prompts; default model; $steps steps; CPU, fp32"
printf '%-10s %-16s %-14s %-12s %s\n' processes "CPUs/process" "median wall" "images/s" "scaling efficiency"
base=""
for n in "${counts[@]}"; do
    times=()
    for run in 1 2 3; do
        start=$(date +%s.%N)
        "$build/bin/dp-launch" -n "$n" -q --steps "$steps" --overwrite -o "$out/$n" "$prompts" >/dev/null
        end=$(date +%s.%N)
        times+=("$(echo "$end - $start" | bc -l)")
    done
    median=$(printf '%s\n' "${times[@]}" | sort -n | sed -n 2p)
    rate=$(echo "$n_prompts / $median" | bc -l)
    [[ -z $base ]] && base=$rate
    eff=$(echo "100 * $rate / ($base * $n)" | bc -l)
    printf '%-10s %-16s %-14s %-12s %s\n' "$n" "$((cpus / n > 0 ? cpus / n : 1)) (OMP_NUM_THREADS)" "$(printf '%.2f s' "$median")" \
        "$(printf '%.2f' "$rate")" "$(printf '%.0f %%' "$eff")"
done
