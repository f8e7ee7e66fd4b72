#!/usr/bin/env bash
# Peak memory of one rank running SD3.5 large at its real size: models/sd3.5-large is a config-only
# folder, so the ranks build its real shapes with random bf16 weights (--random-weights). One step
# at a small image size, so that the weights, not the activations, are what is measured.
#
#   goal: a rank's peak RSS <= 1.1 x its weight bytes + LibTorch's base
#
# - a rank's weight bytes: `dp-launch plan`'s "weights per rank" (its transformer share under tp,
#   every other component whole, no VAE encoder), without T5 unless DP_BENCH_T5=1;
# - LibTorch's base: the peak of the same run on models/tiny-random-sd3 (1 MB of weights), with
#   the same number of ranks;
# - --tp 2: each rank holds about half of the split weights, checked against plan's figure.
# SD3 medium (2 B) runs the same cases where the large one does not fit. A case that would not fit
# in this machine's available memory is skipped, saying what it would need; the measured ranks are
# the OOM killer's first choice, so that a miss kills this benchmark and nothing else. Exits 1 when
# a case that fits fails to run (being over the goal is a finding, not a failure).
#
#   scripts/bench/sd35_large_memory.sh [BUILD_DIR]          (default: build)
#   DP_BENCH_DEVICE=cuda   measure on the GPU (device memory from nvidia-smi, beside host RSS)
#   DP_BENCH_T5=1          with T5-XXL (9.5 GB more in bf16); default --no-t5
#   DP_BENCH_RUNS=N        runs per case, median reported (default 1; the base always 3)
#   DP_BENCH_SIZE=PX       image side (default 128)
#   DP_BENCH_CASES="sd3.5-large:1 sd3.5-large:2 sd3-medium:1 sd3-medium:2"   model:tp pairs
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:-${DP_BUILD_DIR:-$root/build}}
dp=$build/bin/dp-launch
worker=$build/bin/dp-worker
device=${DP_BENCH_DEVICE:-cpu}
runs=${DP_BENCH_RUNS:-1}
size=${DP_BENCH_SIZE:-128}
t5=${DP_BENCH_T5:-0}
cases=${DP_BENCH_CASES:-sd3.5-large:1 sd3.5-large:2 sd3-medium:1 sd3-medium:2}
for f in "$dp" "$worker"; do [[ -x $f ]] || { echo "no $f (build dp-launch and dp-worker first, or pass BUILD_DIR)" >&2; exit 1; }; done
[[ -x /usr/bin/time ]] || { echo "needs GNU time (/usr/bin/time): apt-get install time" >&2; exit 1; }
work=$(mktemp -d)
sampler=""
trap '[[ -n $sampler ]] && kill "$sampler" 2>/dev/null; rm -rf "$work"' EXIT

# Each rank under GNU time, its peak RSS (KiB) in rss.RANK; the ranks are the OOM killer's first pick.
cat >"$work/worker.sh" <<WRAP
#!/usr/bin/env bash
echo 1000 >/proc/self/oom_score_adj 2>/dev/null || true
exec /usr/bin/time -f %M -o "\$DP_BENCH_RSS.\$RANK" "$worker" "\$@"
WRAP
chmod +x "$work/worker.sh"
echo "a lighthouse on a cliff at dusk, oil painting" >"$work/prompt.txt"

# --no-t5 where dp-launch has it; else a copy of the folder whose model_index.json names no T5
# (the same run: diffusers' text_encoder_3=None, T5's embeddings zeros).
no_t5_flag=()
if [[ $t5 == 0 ]] && "$dp" --help 2>/dev/null | grep -q -- '--no-t5'; then no_t5_flag=(--no-t5); fi
model_dir() {
    local name=$1 src=$root/models/$1
    if [[ $t5 == 1 || ${#no_t5_flag[@]} -gt 0 || $name == tiny-random-sd3 ]]; then echo "$src"; return; fi
    local dst=$work/$name-no-t5
    if [[ ! -d $dst ]]; then
        mkdir -p "$dst"
        for e in "$src"/*; do [[ $(basename "$e") == model_index.json ]] || ln -s "$e" "$dst/"; done
        tr -d '\n' <"$src/model_index.json" |
            sed -E 's/("(text_encoder_3|tokenizer_3)": *)\[[^]]*\]/\1[null, null]/g' >"$dst/model_index.json"
    fi
    echo "$dst"
}

# plan's figure for a rank: "weights per rank (bf16): ... (BYTES)", adjusted for T5 (T5 off: its
# line taken out where plan lists it; T5 on and not listed: its manifest's elements x 2 added).
plan_bytes() {  # MODEL_DIR TP
    local out total t5_line
    out=$("$dp" plan --model "$1" -n "$2" --tp "$2" --dtype bf16 "${no_t5_flag[@]}")
    total=$(sed -n -E 's/^weights per rank \(bf16\): .*\(([0-9]+)\)$/\1/p' <<<"$out")
    t5_line=$(sed -n -E 's/^  text_encoder_3: .*\(([0-9]+)\).*$/\1/p' <<<"$out")
    if [[ $t5 == 0 && -n $t5_line && ${#no_t5_flag[@]} -eq 0 ]]; then total=$((total - t5_line)); fi
    if [[ $t5 == 1 && -z $t5_line && -f $1/text_encoder_3/tensors.json ]]; then
        total=$((total + 2 * $(grep -o '"shape": \[[0-9, ]*\]' "$1/text_encoder_3/tensors.json" |
            tr -d '"shape:[]' | awk -F, '{ n = 1; for (i = 1; i <= NF; i++) n *= $i; s += n } END { printf "%.0f", s }')))
    fi
    echo "$total"
}

# Samples the GPU memory of every process (MiB) into gpu.log while a run lasts.
gpu_sampler() {
    while true; do
        nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null >>"$work/gpu.log" || true
        sleep 0.2
    done
}

# One run: prints "MAX_RANK_RSS_KIB MAX_GPU_MIB WALL_S" (GPU 0 on the CPU), or "FAIL rc".
one_run() {  # MODEL_DIR TP
    local dir=$1 n=$2 out=$work/out rc t0 t1 sizes=(--width "$size" --height "$size")
    [[ $dir == */tiny-random-sd3 ]] && sizes=()  # its own default, 32x32
    rm -rf "$out" "$work"/rss.* "$work/gpu.log"
    [[ $device == cuda ]] && { gpu_sampler & sampler=$!; }
    t0=$(date +%s%N)
    set +e
    DP_BENCH_RSS=$work/rss "$dp" -n "$n" --tp "$n" --model "$dir" --random-weights 0 --dtype bf16 \
        --device "$device" --steps 1 "${sizes[@]}" "${no_t5_flag[@]}" \
        --worker "$work/worker.sh" -o "$out" -q --overwrite "$work/prompt.txt" >"$work/log" 2>&1
    rc=$?
    set -e
    t1=$(date +%s%N)
    [[ -n $sampler ]] && { kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null || true; sampler=""; }
    if ((rc != 0)); then echo "FAIL $rc"; tail -5 "$work/log" >&2; return; fi
    local rss gpu=0
    rss=$(cat "$work"/rss.* | sort -n | tail -1)
    [[ -f $work/gpu.log ]] && gpu=$(awk -F', ' '{ if ($2 > m) m = $2 } END { print m + 0 }' "$work/gpu.log")
    echo "$rss $gpu $(((t1 - t0) / 1000000000))"
}

median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : int((v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }

# Median over N runs: sets peak_kib, gpu_mib, wall_s; or returns 1.
measure() {  # MODEL_DIR TP N
    local i r rs=() gs=() ws=()
    for ((i = 0; i < $3; i++)); do
        r=$(one_run "$1" "$2")
        [[ $r == FAIL* ]] && { echo "  run failed (exit ${r#FAIL }); log: above" >&2; return 1; }
        read -r a b c <<<"$r"
        rs+=("$a") gs+=("$b") ws+=("$c")
    done
    peak_kib=$(printf '%s\n' "${rs[@]}" | median)
    gpu_mib=$(printf '%s\n' "${gs[@]}" | median)
    wall_s=$(printf '%s\n' "${ws[@]}" | median)
}

gb() { awk -v b="$1" 'BEGIN { printf "%.2f GB", b / 1e9 }'; }
avail_bytes() { awk '/^MemAvailable:/ { printf "%.0f", $2 * 1024 }' /proc/meminfo; }
gpu_free_bytes() { nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits 2>/dev/null | head -1 | awk '{ printf "%.0f", $1 * 1048576 }'; }

echo "machine: $(nproc) CPUs, $(awk '/^MemTotal:/ { printf "%.1f GB", $2 / 1e6 }' /proc/meminfo) RAM; device $device;" \
     "${size}x${size}, 1 step, bf16, random weights; T5 $([[ $t5 == 1 ]] && echo on || echo "off (${no_t5_flag[*]:-model_index.json without it})")"
declare -A base_kib base_gpu
for n in 1 2; do
    measure "$(model_dir tiny-random-sd3)" "$n" 3 || exit 1
    base_kib[$n]=$peak_kib base_gpu[$n]=$gpu_mib
    echo "LibTorch's base at $n rank(s) (tiny-random-sd3, median of 3): peak RSS $(gb $((peak_kib * 1024)))/rank$(
        [[ $device == cuda ]] && echo ", GPU $(gb $((gpu_mib * 1048576)))")"
done
echo
gpu_cols="" gpu_rule=""
[[ $device == cuda ]] && gpu_cols=" GPU/rank | (GPU - base) / w |" gpu_rule="---|---|"
echo "| model | tp | weights/rank (plan) | peak RSS/rank | goal 1.1 x w + base | (peak - base) / w |$gpu_cols wall | verdict |"
echo "|---|---|---|---|---|---|$gpu_rule---|---|"
declare -A used
failed=0
for c in $cases; do
    name=${c%%:*} n=${c##*:}
    dir=$(model_dir "$name")
    w=$(plan_bytes "$dir" "$n")
    base=$((base_kib[$n] * 1024))
    # Host memory for every rank's weights (on a GPU they pass through the host a tensor at a time).
    need=$((n * (w * 11 / 10 + base))) have=$(avail_bytes) what="of memory"
    if [[ $device == cuda ]]; then
        need=$((w * 11 / 10)) have=$(gpu_free_bytes) what="per GPU"
        if ((n > $(nvidia-smi -L 2>/dev/null | wc -l))); then
            echo "| $name | $n | $(gb "$w") | skipped: needs $n GPUs | | | | | | |"
            continue
        fi
    fi
    if ((need > have)); then
        echo "| $name | $n | $(gb "$w") | skipped: needs about $(gb "$need") $what, $(gb "$have") is available | | | | |"
        continue
    fi
    measure "$dir" "$n" "$runs" || { failed=1; continue; }
    peak=$((peak_kib * 1024))
    goal=$((w * 11 / 10 + base))
    ratio=$(awk -v p="$peak" -v b="$base" -v w="$w" 'BEGIN { printf "%.3f", (p - b) / w }')
    used[$name:$n]=$((peak - base))
    if [[ $device == cuda ]]; then
        g=$((gpu_mib * 1048576)) gb0=$((base_gpu[$n] * 1048576))
        gratio=$(awk -v p="$g" -v b="$gb0" -v w="$w" 'BEGIN { printf "%.3f", (p - b) / w }')
        verdict=$( ((g <= w * 11 / 10 + gb0)) && echo "GPU within goal" || echo "GPU over goal")
        echo "| $name | $n | $(gb "$w") | $(gb "$peak") | $(gb "$goal") | $ratio | $(gb "$g") | $gratio | ${wall_s} s | $verdict |"
    else
        verdict=$( ((peak <= goal)) && echo "within goal" || echo "**over goal**")
        echo "| $name | $n | $(gb "$w") | $(gb "$peak") | $(gb "$goal") | $ratio | ${wall_s} s | $verdict |"
    fi
done

# tp 2 against one rank: what a rank holds beyond the base, measured and as plan says.
echo
for name in $(for c in $cases; do echo "${c%%:*}"; done | sort -u); do
    [[ -n ${used[$name:1]:-} && -n ${used[$name:2]:-} ]] || continue
    dir=$(model_dir "$name")
    awk -v m="$name" -v a="${used[$name:1]}" -v b="${used[$name:2]}" -v pa="$(plan_bytes "$dir" 1)" -v pb="$(plan_bytes "$dir" 2)" \
        'BEGIN { printf "%s, tp 2 against one rank: a rank holds %.3f x as much (plan: %.3f x; %.2f of %.2f GB)\n", m, b / a, pb / pa, pb / 1e9, pa / 1e9 }'
done
exit $failed
