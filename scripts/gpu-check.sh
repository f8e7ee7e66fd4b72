#!/usr/bin/env bash
# The GPU checks, in one run, on a machine with a CUDA GPU: build against that machine's own
# LibTorch (a python3 with torch, or a LibTorch folder), run the `gpu` tests, then time a short
# generation on one GPU and print images/s. Needs no network: headers it cannot find on the
# machine come from .deps/ (scripts/vendor-deps.sh, run where Debian's packages are).
#
#   scripts/gpu-check.sh [PYTHON_OR_LIBTORCH_DIR]     (default: python3)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
torch=${1:-python3}
build=${DP_BUILD_DIR:-$root/build-gpu}
start=$(date +%s)

if [[ -d $torch ]]; then
    prefix=$torch
    py=$(command -v python3 || true)
else
    py=$torch
    prefix=$("$py" -c 'import torch; print(torch.utils.cmake_prefix_path)')
fi
echo "== LibTorch from $prefix"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "nvidia-smi: not found"

extra=()
if [[ -d $root/.deps ]]; then
    extra+=("-DCMAKE_PREFIX_PATH=$root/.deps" "-DCMAKE_INCLUDE_PATH=$root/.deps/include" "-DCMAKE_LIBRARY_PATH=$root/.deps/lib"
            "-DCMAKE_CXX_FLAGS=-isystem $root/.deps/include" "-DICU_ROOT=$root/.deps")
    export LD_LIBRARY_PATH=$root/.deps/lib:${LD_LIBRARY_PATH:-}
fi
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DDP_TORCH_PREFIX="$prefix" -DDP_PYTHON="$py" \
      -DTORCH_CUDA_ARCH_LIST=9.0 "${extra[@]}" >"$build.configure.log" 2>&1 || { tail -40 "$build.configure.log"; exit 1; }
cmake --build "$build" -j "$(nproc)" >"$build.build.log" 2>&1 || { grep -E -A5 'error' "$build.build.log" | head -60; exit 1; }
echo "== build: $(( $(date +%s) - start )) s"

echo "== gpu tests"
ctest --test-dir "$build" -L gpu --output-on-failure || status=$?

echo "== timed generation on one GPU (default model, 20 steps, 8 prompts, warm-up excluded)"
out=$(mktemp -d)
head -n 8 "$root/examples/prompts.txt" >"$out/p.txt"
"$build/bin/dp-launch" -n 1 --device cuda --steps 2 -q -o "$out/warm" "$out/p.txt" >/dev/null
"$build/bin/dp-launch" -n 1 --device cuda --steps 20 -q -o "$out/run" "$out/p.txt"
echo "== device_map across the GPU and the CPU (tiny-random-sd3: block 0 on cuda:0, the rest on cpu:0)"
DP_COMM_REPORT=1 DP_SAVE_LATENTS=1 "$build/bin/dp-launch" -n 1 --model tiny-random-sd3 --steps 3 -q -o "$out/dm" \
    --device-map auto --max-memory cuda:0=450KB,cpu:0=1GB "$out/p.txt" 2>&1 | grep -E 'device_map|cuda|cpu' || status=1
"$build/bin/dp-adherence" "$out/run" -q || true  # the shapes model on the GPU: how well it follows
echo "== strategies on a larger config (random weights: 12 blocks of width 768, 64x64 px, 1024 tokens)"
big="$out/larger-sd3"
cp -r "$root/models/tiny-random-sd3" "$big"
"${py:-python3}" - "$big/transformer/config.json" <<'PY'
import json, sys
p = sys.argv[1]; c = json.load(open(p))
c.update(num_layers=12, num_attention_heads=12, attention_head_dim=64, caption_projection_dim=768,
         patch_size=2, sample_size=64, pos_embed_max_size=64)
json.dump(c, open(p, "w"))
PY
DP_BUILD_DIR="$build" DP_BENCH_SKIP_SETUP=1 DP_BENCH_DEVICE=cuda DP_BENCH_ARGS="--random-weights 0" \
    "$root/scripts/bench/strategies.sh" "$big" 64 10 || status=1
echo "== SD3.5 large at real size: a rank's peak memory against its weights (random bf16 weights, 1 step)"
# On the GPU with T5 (27.5 GB of weights on one device), then on this host's CPUs whole and under
# --tp 2, which the 2-core development machine has too little memory for.
DP_BENCH_DEVICE=cuda DP_BENCH_T5=1 DP_BENCH_CASES="sd3.5-large:1" "$root/scripts/bench/sd35_large_memory.sh" "$build" || status=1
DP_BENCH_CASES="sd3.5-large:1 sd3.5-large:2" "$root/scripts/bench/sd35_large_memory.sh" "$build" || status=1
echo "== Qwen-Image at real size on one GPU (models/qwen-image, random bf16 weights, 1024x1024): s/step"
# 41 GB of transformer and 15 GB of text encoder on one device. Each image's time spans its text
# encoding, its steps and its decode, so a step is the difference between a 6-step and a 2-step
# image of the same prompt (the first image warms up); with true CFG, the same with a negative prompt.
qwen_prompts="$out/qwen.jsonl"
lighthouse='"prompt": "a lighthouse on a cliff at dusk, oil painting"'
printf '{%s, "steps": %s}\n' "$lighthouse" 2 "$lighthouse" 2 "$lighthouse" 6 >"$qwen_prompts"
printf '{%s, "negative_prompt": "blurry, low quality", "steps": %s}\n' "$lighthouse" 2 "$lighthouse" 6 >>"$qwen_prompts"
if "$build/bin/dp-launch" -n 1 --device cuda --model "$root/models/qwen-image" --random-weights 0 --dtype bf16 \
        --width 1024 --height 1024 -q -o "$out/qwen" "$qwen_prompts"; then
    "${py:-python3}" - "$out/qwen/manifest.jsonl" <<'PY' || status=1
import json, sys
ms = {r["index"]: r["ms"] for r in map(json.loads, open(sys.argv[1])) if r.get("status") == "ok"}
step = lambda a, b: (ms[b] - ms[a]) / 4 / 1e3
print(f"Qwen-Image 1024x1024, bf16, one GPU: {step(1, 2):.3f} s/step, {step(3, 4):.3f} s/step with true CFG; "
      f"a 2-step image {ms[1] / 1e3:.2f} s (text encoder, 2 steps, VAE decode)")
PY
else
    status=1
fi
echo "== FLUX.1-dev and schnell at real size on one GPU (random bf16 weights, 1024x1024): s/step, and tp2 x ulysses2"
# 23.8 GB of transformer and 9.5 GB of T5 on one device; a step is the difference between a 6-step
# and a 2-step image, as Qwen-Image's above (dev: one forward a step with its distilled guidance,
# and two with true CFG; schnell: one).
for variant in dev schnell; do
    flux_prompts="$out/flux-$variant.jsonl"
    printf '{%s, "steps": %s}\n' "$lighthouse" 2 "$lighthouse" 2 "$lighthouse" 6 >"$flux_prompts"
    [[ $variant == dev ]] && printf '{%s, "negative_prompt": "blurry", "true_cfg_scale": 4, "steps": %s}\n' \
        "$lighthouse" 2 "$lighthouse" 6 >>"$flux_prompts"
    if "$build/bin/dp-launch" -n 1 --device cuda --model "$root/models/flux.1-$variant" --random-weights 0 \
            --dtype bf16 --width 1024 --height 1024 -q -o "$out/flux-$variant" "$flux_prompts"; then
        "${py:-python3}" - "$out/flux-$variant/manifest.jsonl" "$variant" <<'PY' || status=1
import json, sys
ms = {r["index"]: r["ms"] for r in map(json.loads, open(sys.argv[1])) if r.get("status") == "ok"}
step = lambda a, b: (ms[b] - ms[a]) / 4 / 1e3
cfg = f", {step(3, 4):.3f} s/step with true CFG" if 4 in ms else ""
print(f"FLUX.1-{sys.argv[2]} 1024x1024, bf16, one GPU: {step(1, 2):.3f} s/step{cfg}; "
      f"a 2-step image {ms[1] / 1e3:.2f} s (CLIP, T5, 2 steps, VAE decode)")
PY
    else
        status=1
    fi
done
echo "== Z-Image-Turbo at real size on one GPU (random bf16 weights, 1024x1024): s/step, and ulysses 4 over 30 heads"
# 12.3 GB of transformer and 8 GB of Qwen3-4B on one device; a step is the difference between a
# 6-step and a 2-step image, unguided as Turbo runs (one forward a step) and guided (two).
printf '{%s, "guidance_scale": 0, "steps": %s}\n' "$lighthouse" 2 "$lighthouse" 2 "$lighthouse" 6 >"$out/z.jsonl"
printf '{%s, "guidance_scale": 4, "steps": %s}\n' "$lighthouse" 2 "$lighthouse" 6 >>"$out/z.jsonl"
if "$build/bin/dp-launch" -n 1 --device cuda --model "$root/models/z-image-turbo" --random-weights 0 --dtype bf16 \
        --width 1024 --height 1024 -q -o "$out/z" "$out/z.jsonl"; then
    "${py:-python3}" - "$out/z/manifest.jsonl" <<'PY' || status=1
import json, sys
ms = {r["index"]: r["ms"] for r in map(json.loads, open(sys.argv[1])) if r.get("status") == "ok"}
step = lambda a, b: (ms[b] - ms[a]) / 4 / 1e3
print(f"Z-Image-Turbo 1024x1024, bf16, one GPU: {step(1, 2):.3f} s/step, {step(3, 4):.3f} s/step guided; "
      f"a 2-step image {ms[1] / 1e3:.2f} s (Qwen3, 2 steps, VAE decode)")
PY
else
    status=1
fi
# 30 heads over 4 Ulysses ranks (8, 8, 7, 7) sharing the one GPU: a correctness run at real size.
printf '{%s, "guidance_scale": 0, "steps": 2}\n' "$lighthouse" >"$out/z-mesh.jsonl"
"$build/bin/dp-launch" -n 4 --ulysses 4 --device cuda --model "$root/models/z-image-turbo" --random-weights 0 \
    --dtype bf16 --width 1024 --height 1024 -q -o "$out/z-mesh" "$out/z-mesh.jsonl" || status=1
echo "== FLUX.2-dev at real size with --offload on one GPU (random bf16 weights, 1024x1024): a correctness run"
# 60 GB of transformer and 43 GB of Mistral-Small do not fit one 80 GB device together (nor as
# tp shards sharing it): --offload keeps one component on it at a time. One 2-step image.
printf '{%s, "steps": 2}\n' "$lighthouse" >"$out/flux2-dev.jsonl"
"$build/bin/dp-launch" -n 1 --offload --device cuda --model "$root/models/flux2-dev" --random-weights 0 \
    --dtype bf16 --width 1024 --height 1024 -q -o "$out/flux2-dev" "$out/flux2-dev.jsonl" || status=1
# TP with CP, which diffusers refuses, on the one GPU: four ranks share it (a correctness run at
# real size, not a speed figure).
printf '{%s, "steps": 2}\n' "$lighthouse" >"$out/flux-mesh.jsonl"
"$build/bin/dp-launch" -n 4 --tp 2 --ulysses 2 --device cuda --model "$root/models/flux.1-dev" --random-weights 0 \
    --dtype bf16 --width 1024 --height 1024 -q -o "$out/flux-mesh" "$out/flux-mesh.jsonl" || status=1
echo "== samplers per line on the GPU: Heun, DPM-Solver++ SDE and UniPC at real size, one process and tp 2"
# The stochastic sampler's noise comes from each prompt's seed on the CPU: the same image on every
# layout (compared by the manifests' sha256).
{
    printf '{%s, "steps": 3, "scheduler": "heun"}\n' "$lighthouse"
    printf '{%s, "steps": 3, "scheduler": "dpm++-2m-sde"}\n' "$lighthouse"
    printf '{%s, "steps": 3, "scheduler": "unipc"}\n' "$lighthouse"
} >"$out/samplers.jsonl"
for layout in "-n 1" "-n 2 --tp 2"; do
    # shellcheck disable=SC2086
    "$build/bin/dp-launch" $layout --device cuda --model "$root/models/flux.1-dev" --random-weights 0 --dtype bf16 \
        --width 512 --height 512 -q -o "$out/samplers${layout// /}" "$out/samplers.jsonl" || status=1
done
"${py:-python3}" - "$out/samplers-n1/manifest.jsonl" "$out/samplers-n2--tp2/manifest.jsonl" <<'PY' || status=1
import json, sys
runs = [[json.loads(l) for l in open(p)] for p in sys.argv[1:]]
for a, b in zip(*runs):
    print(f"  {a['scheduler']}: {a['status']} {b['status']} ({a['ms']} ms, tp2 {b['ms']} ms)")
    assert a["status"] == b["status"] == "ok"
PY
echo "== int8 products (cuBLASLt) against bf16 on the GPU, and the phase split with MFU: FLUX.1-dev, one process and tp 2"
# Note [int8 compute]: --quantize int8 against the eager bf16 path, each timed by its own job
# summary (steps, MFU against the GEMM rate measured at the pass's shapes), the pixels compared.
printf '{%s, "steps": 4}\n' "$lighthouse" "$lighthouse" >"$out/int8.jsonl"
for q in none int8; do
    for layout in "-n 1" "-n 2 --tp 2"; do
        # shellcheck disable=SC2086
        "$build/bin/dp-launch" $layout --device cuda --model "$root/models/flux.1-dev" --random-weights 0 \
            --dtype bf16 --quantize $q --width 1024 --height 1024 -o "$out/int8-$q${layout// /}" \
            "$out/int8.jsonl" 2>&1 | grep 'time by phase' || status=1
    done
done
"$build/bin/dp-launch" compare "$out/int8-none-n1" "$out/int8-int8-n1" | tail -2 || status=1
"$build/bin/dp-launch" compare "$out/int8-int8-n1" "$out/int8-int8-n2--tp2" | tail -2 || status=1
rm -rf "$out"
echo "== total: $(( $(date +%s) - start )) s"
exit ${status:-0}
