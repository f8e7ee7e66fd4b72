#!/usr/bin/env bash
# Peak memory of one rank whose transformer comes from a GGUF Q4_K file, against the same
# transformer as a bf16 safetensors file: FLUX.1-dev's real width (24 heads of 128, MLP 12288) with
# DOUBLE double and SINGLE single blocks (default 2 and 4: 1.6 B parameters), random weights,
# written by gguf_memory.py; the rest of the pipeline the tiny FLUX.1-dev folder's. One step at
# 64x64 in bf16 (DP_BENCH_STEPS more, to see what a dequantization per use costs), so that the
# weights are what is measured. Each rank runs under GNU time.
#
#   scripts/bench/gguf_memory.sh [BUILD_DIR]      DP_BENCH_DOUBLE=N DP_BENCH_SINGLE=N DP_BENCH_STEPS=N
#
# Three runs side by side: the bf16 file, the Q4_K file dequantized at load (the default), and the
# Q4_K file with --keep-quantized (its blocks kept, each layer dequantized as it runs). Figures in
# docs/benchmarks.md, "GGUF and memory".
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:-${DP_BUILD_DIR:-$root/build}}
dp=$build/bin/dp-launch
worker=$build/bin/dp-worker
venv=${DP_VENV:-$HOME/.cache/dp-launch/venv}
double=${DP_BENCH_DOUBLE:-2}
single=${DP_BENCH_SINGLE:-4}
steps=${DP_BENCH_STEPS:-1}
for f in "$dp" "$worker"; do [[ -x $f ]] || { echo "no $f (build first, or pass BUILD_DIR)" >&2; exit 1; }; done
[[ -x /usr/bin/time ]] || { echo "needs GNU time (/usr/bin/time): apt-get install time" >&2; exit 1; }
"$venv/bin/python" -c 'import gguf, safetensors' 2>/dev/null ||
    "$venv/bin/pip" install -q --disable-pip-version-check -r "$root/scripts/golden/requirements.txt"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/worker.sh" <<WRAP
#!/usr/bin/env bash
exec /usr/bin/time -f %M -o "\$DP_BENCH_RSS" "$worker" "\$@"
WRAP
chmod +x "$work/worker.sh"
echo "a red fox in the snow" >"$work/prompt.txt"
"$venv/bin/python" "$root/scripts/bench/gguf_memory.py" "$work" "$root" "$double" "$single"

printf "%-44s %10s %15s %10s\n" "file (mode)" "file (MB)" "peak RSS (MiB)" "wall (s)"
for run in "flux_bf16.safetensors" "flux_q4_k.gguf" "flux_q4_k.gguf --keep-quantized"; do
    read -r file mode <<<"$run"
    start=$(date +%s%N)
    DP_BENCH_RSS=$work/rss "$dp" -n 1 --model "$work/flux" --transformer "$work/$file" $mode --dtype bf16 --steps "$steps" \
        --width 64 --height 64 --worker "$work/worker.sh" -o "$work/out" -q --overwrite "$work/prompt.txt" \
        >"$work/log" 2>&1 || { cat "$work/log" >&2; exit 1; }
    wall=$(awk "BEGIN { print ($(date +%s%N) - $start) / 1e9 }")
    printf '%-44s %10.0f %14.0f %10.1f\n' "$run" "$(($(stat -c %s "$work/$file") / 1000000))" \
        "$(($(cat "$work/rss") / 1024))" "$wall"
done
