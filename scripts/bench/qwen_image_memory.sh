#!/usr/bin/env bash
# Peak memory of a rank running Qwen-Image at the real model's widths under tensor parallelism.
# The whole model (a 20 B transformer, a 7 B text encoder) does not fit a small machine, so the
# ranks run models/qwen-image's configs cut to a few transformer blocks and text-encoder layers
# (widths 3072 and 3584 as published; the manifests cut to match), with random bf16 weights
# (--random-weights), two steps at a small image size, so that the weights, not the activations,
# are what is measured. (Two, not one: one step's schedule is NaN in diffusers, and in builds
# before the one-step fix.)
#
#   goal: a rank's peak RSS - LibTorch's base within 5 % of plan's weights per rank
#
# - plan's weights per rank: `dp-launch plan` on the same cut folder: the transformer's
#   replicated bytes + its split bytes / tp (the modulations, img_mod and txt_mod, among the split
#   ones), the text encoder's tp share, the VAE decoder whole. The figure with the modulations
#   kept whole is printed beside it, to show which of the two a rank holds;
# - LibTorch's base: the peak of the same run on models/tiny-random-qwen-image (a few hundred KB
#   of weights), with the same number of ranks, median of 3 (its 2 heads allow tp 2 at most: with
#   4 ranks it runs dp 2 x tp 2).
# A case that would not fit in this machine's available memory is skipped, saying what it would
# need; the measured ranks are the OOM killer's first choice. Exits 1 when a case that fits fails
# to run (being over the goal is a finding, not a failure).
#
#   scripts/bench/qwen_image_memory.sh [BUILD_DIR]          (default: build)
#   DP_BENCH_BLOCKS=N        transformer blocks kept (default 4; the real model has 60)
#   DP_BENCH_TEXT_LAYERS=N   text-encoder layers kept (default 2; the real model has 28)
#   DP_BENCH_TP="2 4"        tp degrees, one case each, run with -n = tp (1 also runs)
#   DP_BENCH_RUNS=N          runs per case, median reported (default 1)
#   DP_BENCH_SIZE=PX         image side (default 256)
#   DP_BENCH_DEVICE=cpu      or cuda (host RSS either way)
#   DP_BENCH_MODEL=NAME      the config-only folder under models/ (default qwen-image; an edit
#                            folder, qwen-image-edit or qwen-image-edit-2509, edits DP_BENCH_IMAGE
#                            and keeps its vision tower whole: 32 blocks of width 1280)
#   DP_BENCH_VISION_DEPTH=N  an edit folder's vision blocks kept (default: all, 32)
#   DP_BENCH_IMAGE=FILE      the picture an edit folder's line edits (default: a 50 x 41 test PNG;
#                            the pipelines resize it to about 1024 x 1024 for the VAE whatever it is)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:-${DP_BUILD_DIR:-$root/build}}
dp=$build/bin/dp-launch
worker=$build/bin/dp-worker
blocks=${DP_BENCH_BLOCKS:-4}
text_layers=${DP_BENCH_TEXT_LAYERS:-2}
tps=${DP_BENCH_TP:-2 4}
runs=${DP_BENCH_RUNS:-1}
size=${DP_BENCH_SIZE:-256}
device=${DP_BENCH_DEVICE:-cpu}
py=${DP_PYTHON:-python3}
model=${DP_BENCH_MODEL:-qwen-image}
tiny=tiny-random-qwen-image
image_args=()
case $model in qwen-image-edit*) tiny=tiny-random-$model; [[ $model == *2509 ]] && tiny=tiny-random-qwen-image-edit-plus ;; esac
for f in "$dp" "$worker"; do [[ -x $f ]] || { echo "no $f (build dp-launch and dp-worker first, or pass BUILD_DIR)" >&2; exit 1; }; done
[[ -x /usr/bin/time ]] || { echo "needs GNU time (/usr/bin/time): apt-get install time" >&2; exit 1; }
command -v "$py" >/dev/null || { echo "needs python3 to cut the configs (or set DP_PYTHON)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Each rank under GNU time, its peak RSS (KiB) in rss.RANK; the ranks are the OOM killer's first pick.
cat >"$work/worker.sh" <<WRAP
#!/usr/bin/env bash
echo 1000 >/proc/self/oom_score_adj 2>/dev/null || true
exec /usr/bin/time -f %M -o "\$DP_BENCH_RSS.\$RANK" "$worker" "\$@"
WRAP
chmod +x "$work/worker.sh"
echo "a lighthouse on a cliff at dusk, oil painting" >"$work/prompt.txt"
if [[ $tiny != tiny-random-qwen-image ]]; then
    picture=${DP_BENCH_IMAGE:-$root/tests/data/golden/img2img/in_50x41.png}
    image_args=(--image "$picture")
fi

# models/MODEL with BLOCKS transformer blocks, TEXT_LAYERS text layers and (an edit folder's)
# VISION_DEPTH vision blocks: the configs and the manifests cut alike, so plan counts what the
# ranks build. The shared components are copied, not linked.
cut_folder() {  # DEST BLOCKS TEXT_LAYERS VISION_DEPTH (0: as published)
cp -rL "$root/models/$model" "$1"
"$py" - "$@" <<'PY'
import json, os, re, sys
folder, blocks, layers, depth = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def edit(path, f):
    data = json.load(open(path))
    f(data)
    json.dump(data, open(path, "w"), indent=2)
def cut_transformer(c):
    c["num_layers"] = blocks
def cut_text(c):
    t = c["text_config"]
    t["num_hidden_layers"] = layers
    t["layer_types"] = t["layer_types"][:layers]
    t["max_window_layers"] = min(t.get("max_window_layers", layers), layers)
    # The folders' tokenizer is a stand-in with its own ids (models/README.md): the image token
    # the text encoder scatters into is its <|image_pad|>.
    added = os.path.join(folder, "tokenizer", "added_tokens.json")
    if "vision_config" in c and os.path.exists(added):
        ids = json.load(open(added))
        c["image_token_id"] = ids["<|image_pad|>"]
        c["vision_start_token_id"], c["vision_end_token_id"] = ids["<|vision_start|>"], ids["<|vision_end|>"]
    if depth:
        v = c["vision_config"]
        v["depth"] = depth
        v["fullatt_block_indexes"] = [i for i in v["fullatt_block_indexes"] if i < depth] or [depth - 1]
def keep(pattern, n):
    def f(m):
        for k in [k for k in m if k != "__metadata__"]:
            hit = re.search(pattern, k)
            if hit and int(hit.group(1)) >= n:
                del m[k]
    return f
edit(os.path.join(folder, "transformer", "config.json"), cut_transformer)
edit(os.path.join(folder, "transformer", "tensors.json"), keep(r"^transformer_blocks\.(\d+)\.", blocks))
edit(os.path.join(folder, "text_encoder", "config.json"), cut_text)
edit(os.path.join(folder, "text_encoder", "tensors.json"), keep(r"^(?:model\.)?(?:language_model\.)?layers\.(\d+)\.", layers))
if depth:
    edit(os.path.join(folder, "text_encoder", "tensors.json"), keep(r"^(?:model\.)?visual\.blocks\.(\d+)\.", depth))
PY
}
cut=$work/$model-${blocks}b-${text_layers}l
cut_folder "$cut" "$blocks" "$text_layers" "${DP_BENCH_VISION_DEPTH:-0}"

# Bytes of the modulation weights (img_mod, txt_mod) in bf16, from the cut manifest.
mod_bytes=$("$py" - "$cut/transformer/tensors.json" <<'PY'
import json, math, sys
m = json.load(open(sys.argv[1]))
print(2 * sum(math.prod(v["shape"]) for k, v in m.items() if k != "__metadata__" and (".img_mod." in k or ".txt_mod." in k)))
PY
)

# plan's figures: "weights per rank (bf16): ... (BYTES)" and the transformer's replicated and
# split bytes, as "W REPLICATED SPLIT".
plan_figures() {  # MODEL_DIR TP
    local out
    out=$("$dp" plan --model "$1" -n "$2" --tp "$2" --dtype bf16 --width "$size" --height "$size" "${image_args[@]}")
    echo "$(sed -n -E 's/^weights per rank \(bf16\): .*\(([0-9]+)\)$/\1/p' <<<"$out")" \
         "$(sed -n -E 's/^transformer parameters per rank .* = .*\(([0-9]+)\) replicated \+ .*\(([0-9]+)\) \/ tp [0-9]+$/\1 \2/p' <<<"$out")"
}

# One run: prints "MAX_RANK_RSS_KIB MIN_RANK_RSS_KIB WALL_S", or "FAIL rc".
one_run() {  # MODEL_DIR RANKS TP
    local dir=$1 n=$2 tp=$3 out=$work/out rc t0 t1 sizes=(--width "$size" --height "$size")
    [[ $dir == */tiny-random-* ]] && sizes=(--width 64 --height 64)
    rm -rf "$out" "$work"/rss.*
    t0=$(date +%s%N)
    set +e
    DP_BENCH_RSS=$work/rss "$dp" -n "$n" --tp "$tp" --model "$dir" --random-weights 0 --dtype bf16 \
        --device "$device" --steps 2 "${sizes[@]}" "${image_args[@]}" \
        --worker "$work/worker.sh" -o "$out" -q --overwrite "$work/prompt.txt" >"$work/log" 2>&1
    rc=$?
    set -e
    t1=$(date +%s%N)
    if ((rc != 0)); then echo "FAIL $rc"; tail -5 "$work/log" >&2; return; fi
    echo "$(cat "$work"/rss.* | sort -n | tail -1) $(cat "$work"/rss.* | sort -n | head -1) $(((t1 - t0) / 1000000000))" \
         "$(sed -n -E 's/.*"ms":([0-9]+).*/\1/p' "$out/manifest.jsonl" | head -1)"
}

median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : int((v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }

# Median over N runs: sets peak_kib (the largest rank), low_kib (the smallest), wall_s, and
# image_ms (the record's time to make the image: the job without loading); or returns 1.
measure() {  # MODEL_DIR RANKS TP N
    local i r a b c d rs=() ls=() ws=() ms=()
    for ((i = 0; i < $4; i++)); do
        r=$(one_run "$1" "$2" "$3")
        [[ $r == FAIL* ]] && { echo "  run failed (exit ${r#FAIL }); log: above" >&2; return 1; }
        read -r a b c d <<<"$r"
        rs+=("$a") ls+=("$b") ws+=("$c") ms+=("${d:-0}")
    done
    peak_kib=$(printf '%s\n' "${rs[@]}" | median)
    low_kib=$(printf '%s\n' "${ls[@]}" | median)
    wall_s=$(printf '%s\n' "${ws[@]}" | median)
    image_ms=$(printf '%s\n' "${ms[@]}" | median)
}

gb() { awk -v b="$1" 'BEGIN { printf "%.2f GB", b / 1e9 }'; }
avail_bytes() { awk '/^MemAvailable:/ { printf "%.0f", $2 * 1024 }' /proc/meminfo; }

echo "machine: $(nproc) CPUs, $(awk '/^MemTotal:/ { printf "%.1f GB", $2 / 1e6 }' /proc/meminfo) RAM; device $device;" \
     "models/$model cut to $blocks blocks and $text_layers text layers (widths 3072 / 3584); ${size}x${size}, 2 steps, bf16, random weights"
echo "modulations (img_mod, txt_mod) in the cut transformer: $(gb "$mod_bytes")"
cases="1 $tps"
cases=$(tr ' ' '\n' <<<"$cases" | grep -v '^$' | sort -n -u | tr '\n' ' ')
declare -A base_kib
for n in $cases; do
    measure "$root/models/$tiny" "$n" $((n < 2 ? n : 2)) 3 || exit 1
    base_kib[$n]=$peak_kib
    echo "LibTorch's base at $n rank(s) ($tiny, median of 3): peak RSS $(gb $((peak_kib * 1024)))/rank"
done
echo
echo "| tp | weights/rank (plan) | = transformer replicated + split / tp | modulations whole | peak RSS/rank (max, min) | (peak - base) / plan | wall (image) | verdict |"
echo "|---|---|---|---|---|---|---|---|"
failed=0
for n in $cases; do
    read -r w rep split <<<"$(plan_figures "$cut" "$n")"
    [[ -n $w && -n $rep && -n $split ]] || { echo "plan printed no per-rank figures for tp $n" >&2; failed=1; continue; }
    whole=$((w + mod_bytes - mod_bytes / n))
    base=$((base_kib[$n] * 1024))
    need=$((n * (w * 11 / 10 + base))) have=$(avail_bytes)
    if ((need > have)); then
        echo "| $n | $(gb "$w") | | | skipped: needs about $(gb "$need") of memory, $(gb "$have") is available | | | |"
        continue
    fi
    measure "$cut" "$n" "$n" "$runs" || { failed=1; continue; }
    peak=$((peak_kib * 1024)) low=$((low_kib * 1024))
    ratio=$(awk -v p="$peak" -v b="$base" -v w="$w" 'BEGIN { printf "%.3f", (p - b) / w }')
    verdict=$(awk -v r="$ratio" 'BEGIN { print (r >= 0.95 && r <= 1.05) ? "within 5 %" : "**off by more than 5 %**" }')
    echo "| $n | $(gb "$w") | $(gb "$rep") + $(gb "$split") / $n | $(gb "$whole") | $(gb "$peak"), $(gb "$low") | $ratio | ${wall_s} s ($(awk -v m="$image_ms" 'BEGIN { printf "%.1f", m / 1000 }') s) | $verdict |"
done
exit $failed
