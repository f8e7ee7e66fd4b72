#!/usr/bin/env bash
# Each parallel strategy on this machine beside the single process: time per denoising step,
# bytes each rank sends per step (counted by the Communicator) and peak memory per rank.
#   scripts/bench/strategies.sh [MODEL] [SIZE] [STEPS]
# Defaults: the shipped tiny model at 32x32, 10 steps, 2 prompts (one per data-parallel rank).
# On a GPU machine scripts/gpu-check.sh runs it with --device cuda and a larger config.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${DP_BUILD_DIR:-$root/build}
model=${1:-tiny-random-sd3}
size=${2:-32}
steps=${3:-10}
device=${DP_BENCH_DEVICE:-cpu}
if [[ -z ${DP_BENCH_SKIP_SETUP:-} ]]; then  # gpu-check.sh has built its own tree already
    setup_log=$(mktemp)
    "$root/scripts/setup.sh" >"$setup_log" 2>&1 || { cat "$setup_log" >&2; exit 1; }
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# A worker wrapper that reports each rank's peak RSS.
cat >"$tmp/worker.sh" <<WRAP
#!/usr/bin/env bash
exec /usr/bin/time -f "dp-bench: rank \${RANK} peak_rss_kb=%M" "$build/bin/dp-worker" "\$@"
WRAP
chmod +x "$tmp/worker.sh"
printf 'a small red circle on a blue background\na large green square on a white background\n' >"$tmp/p.txt"

echo "machine: $(nproc) CPUs; model $model; ${size}x${size}; $steps steps; 2 prompts; device $device"
printf '%-26s %-6s %-14s %-12s %-44s %s\n' strategy ranks "s/step/prompt" "vs single" "bytes sent per step per prompt (rank 0)" "peak RSS/rank"
single=""
# Extra dp-launch arguments for every row (gpu-check.sh passes --random-weights for a larger config).
read -r -a bench_args <<<"${DP_BENCH_ARGS:-}"
gpus=0
[[ $device == cuda ]] && gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
run() {
    local name=$1 n=$2 replica=$3
    shift 3
    if [[ $device == cuda ]] && (( n > gpus )); then
        printf '%-26s %-6s skipped: needs %d GPUs, this machine has %d\n' "$name" "$n" "$n" "$gpus"
        return
    fi
    local prompts_rank0=$(( (2 + n / replica - 1) / (n / replica) ))
    local start end err secs per_step bytes rss
    start=$(date +%s.%N)
    err=$(DP_COMM_REPORT=1 "$build/bin/dp-launch" -n "$n" "$@" ${bench_args[@]+"${bench_args[@]}"} --model "$model" --device "$device" --steps "$steps" \
          --width "$size" --height "$size" --worker "$tmp/worker.sh" --overwrite -o "$tmp/out" "$tmp/p.txt" 2>&1 >/dev/null)
    end=$(date +%s.%N)
    secs=$(echo "$end - $start" | bc -l)
    # Two prompts: the time per step of one prompt, whatever splits them.
    per_step=$(echo "$secs / ($steps * 2)" | bc -l)
    [[ -z $single ]] && single=$per_step
    bytes=$(grep -o 'rank 0 communication bytes:.*' <<<"$err" | sed 's/rank 0 communication bytes://' || true)
    # device_map: the activations moved between devices instead of collectives.
    bytes+=$(grep -o 'device_map moved [0-9]*' <<<"$err" | sed 's/device_map moved / moved=/' || true)
    local scaled=""
    for kv in $bytes; do scaled+=" ${kv%%=*}=$(( ${kv#*=} / (steps * prompts_rank0) ))"; done
    rss=$(grep -o 'peak_rss_kb=[0-9]*' <<<"$err" | cut -d= -f2 | sort -n | tail -1)
    printf '%-26s %-6s %-14s %-12s %-44s %s\n' "$name" "$n" "$(printf '%.4f' "$per_step")" \
        "$(printf '%.2fx' "$(echo "$per_step / $single" | bc -l)")" "${scaled:- none}" "$((rss / 1024)) MB"
}
run "single process" 1 1
run "data (dp2)" 2 1
run "cfg2" 2 2 --cfg-parallel
run "ulysses2" 2 2 --ulysses 2
run "ring2" 2 2 --ring 2
run "tp2" 2 2 --tp 2
run "ulysses2 x ring2 (USP)" 4 4 --ulysses 2 --ring 2
run "tp2 x ulysses2" 4 4 --tp 2 --ulysses 2
run "cfg2 x ulysses2" 4 4 --cfg-parallel --ulysses 2
# device_map: on the CPU over two explicit CPU "devices" (whole components, balanced); on a GPU
# machine over its GPUs when it has two or more.
if [[ $device == cpu ]]; then
    run "device_map balanced (2 CPU devs)" 1 1 --device-map balanced --max-memory cpu:0=8GB,cpu:1=8GB
else
    run "device_map auto (GPUs)" 2 1 --device-map auto  # needs two GPUs
fi
echo "(bytes: per step and per prompt, rank 0; time: wall time of the whole job / (steps x prompts), start-up included)"
