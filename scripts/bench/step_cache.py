"""The first-block step cache, side by side in one run, on the medium random FLUX.1-dev of
flux_vs_diffusers.py (4 double and 8 single blocks of 8 heads x 64, T5 of 4 layers): two prompts,
28 steps at 512x512, fp32 on this machine's CPU.

1. The threshold: a run of dp-launch with first_block_cache:threshold=0 (every pass computed, so
   the uncached images) reports each pass's relative change of the first block's residual
   (DP_CACHE_REPORT). A skip makes the next changes larger (they are measured from the last pass
   computed in full), so the threshold is searched from their median up through higher quantiles
   until a cached run computes about half the passes (40% to 60%).
2. RUNS rounds, alternating (so that drift of the machine hits every side alike): dp-launch without
   the cache, dp-launch with it, and a diffusers script with transformer.enable_cache(
   FirstBlockCacheConfig(threshold)); each side is a whole process (load, encode, 28 steps, decode).
3. The same two ways with TaylorSeerCacheConfig's defaults (--cache taylorseer_cache), and with
   MagCacheConfig on FLUX.1's published ratios (--cache mag_cache:mag_ratios=flux; its decisions
   follow from the ratios alone, so both sides skip the same passes of this random model).
4. The passes computed (the manifest's computed_steps, and diffusers' own count from its hooked
   modules' forwards), and dp-launch compare's PSNR and SSIM of the cached images against the
   uncached ones.

Prints each side's median wall time and the ratios the issue sets goals for: cached / uncached
(goal 0.7 at most) and dp-launch cached / diffusers cached (goal 0.9 at most).

    step_cache.py DP_LAUNCH [--runs N] [--threshold T] [--launch "-n 2 --ulysses 2"]
                            [--caches first_block,taylorseer,mag]

--caches runs those caches' sides only (and the uncached one); --threshold T skips the search; --launch gives dp-launch's sides a strategy (the diffusers sides,
which run one process, are then left out).
"""
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from flux_vs_diffusers import build_medium  # noqa: E402

STEPS, SIZE, TOKENS, GUIDANCE = 28, 512, 128, 3.5
PROMPTS = [("an old lighthouse on a rocky coast at dusk, waves and gulls", 0),
           ("a bowl of ramen on a wooden table, steam rising", 1)]

DIFFUSERS_RUN = r"""
import json, sys, time
import torch
from diffusers import FluxPipeline
from diffusers.hooks import FirstBlockCacheConfig, MagCacheConfig, TaylorSeerCacheConfig
from diffusers.hooks.mag_cache import FLUX_MAG_RATIOS
folder, threshold, out = sys.argv[1], sys.argv[2], sys.argv[3]
prompts = json.loads(sys.argv[4])
pipe = FluxPipeline.from_pretrained(folder, torch_dtype=torch.float32)
pipe.set_progress_bar_config(disable=True)
taylorseer, mag = threshold == "taylorseer", threshold == "mag"
pipe.transformer.enable_cache(
    TaylorSeerCacheConfig() if taylorseer
    else MagCacheConfig(mag_ratios=FLUX_MAG_RATIOS, num_inference_steps=%(steps)d) if mag
    else FirstBlockCacheConfig(threshold=float(threshold)))
# The passes computed: the hooked module's own forward, which its cache hook calls only then (the
# tail block's; TaylorSeer: the last block's attention's).
from diffusers.hooks import HookRegistry
computed = 0
last = pipe.transformer.single_transformer_blocks[-1]
hook = HookRegistry.check_if_exists_or_initialize(last.attn if taylorseer else last).get_hook(
    "taylorseer_cache" if taylorseer else "mag_cache_block_hook" if mag else "fbc_block_hook")
original = hook.fn_ref.original_forward
def counted(*args, **kwargs):
    global computed
    computed += 1
    return original(*args, **kwargs)
hook.fn_ref.original_forward = counted
for k, (prompt, seed) in enumerate(prompts):
    with torch.no_grad():
        image = pipe(prompt=prompt, guidance_scale=%(guidance)s, num_inference_steps=%(steps)d, width=%(size)d,
                     height=%(size)d, max_sequence_length=%(tokens)d,
                     generator=torch.Generator("cpu").manual_seed(seed)).images[0]
    image.save(f"{out}/{k:05d}.png")
print(json.dumps({"computed": computed}))
""" % dict(guidance=GUIDANCE, steps=STEPS, size=SIZE, tokens=TOKENS)


def write_prompts(path):
    with open(path, "w") as f:
        for prompt, seed in PROMPTS:
            f.write(json.dumps({"prompt": prompt, "seed": seed, "guidance_scale": GUIDANCE, "width": SIZE,
                                "height": SIZE, "num_inference_steps": STEPS, "max_sequence_length": TOKENS}) + "\n")


def run(args, env=None):
    start = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, env={**os.environ, **(env or {})})
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(args[:4])} ... failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return wall, proc


def manifest_computed(folder):
    with open(os.path.join(folder, "manifest.jsonl")) as f:
        return sum(json.loads(line).get("computed_steps", 0) for line in f if line.strip())


def main():
    dp_launch = sys.argv[1]
    runs = int(sys.argv[sys.argv.index("--runs") + 1]) if "--runs" in sys.argv else 3
    fixed = float(sys.argv[sys.argv.index("--threshold") + 1]) if "--threshold" in sys.argv else None
    strategy = sys.argv[sys.argv.index("--launch") + 1].split() if "--launch" in sys.argv else []
    chosen = (sys.argv[sys.argv.index("--caches") + 1].split(",") if "--caches" in sys.argv
              else ["first_block", "taylorseer", "mag"])
    if not set(chosen) <= {"first_block", "taylorseer", "mag"}:
        sys.exit(f"--caches takes first_block, taylorseer and mag, comma-separated; got {chosen}")
    tmp = tempfile.mkdtemp(prefix="dp-bench-cache-")
    try:
        folder = os.path.join(tmp, "medium")
        params = build_medium(folder, "dev")
        prompts = os.path.join(tmp, "prompts.jsonl")
        write_prompts(prompts)
        launch = [dp_launch] + strategy + ["--model", folder, "-q", "--overwrite", prompts]
        # 1. The threshold.
        changes = [fixed] if fixed is not None else []
        threshold = fixed
        proc = None
        if fixed is None and "first_block" in chosen:
            _, proc = run(launch[:1] + ["--cache", "first_block_cache:threshold=0", "-o", os.path.join(tmp, "calibrate")]
                          + launch[1:], {"DP_CACHE_REPORT": "1"})
        if proc is not None:
            changes = sorted(float(x) for line in proc.stderr.splitlines() if "first-block changes" in line
                             for x in re.findall(r" (\d+\.\d+)", line))
        total = STEPS * len(PROMPTS)
        for quantile in ((0.5, 0.7, 0.8, 0.9, 0.95) if fixed is None and "first_block" in chosen else ()):
            threshold = round(changes[min(len(changes) - 1, int(quantile * len(changes)))], 4)
            trial = os.path.join(tmp, "trial")
            run(launch[:1] + ["--cache", f"first_block_cache:threshold={threshold}", "-o", trial] + launch[1:])
            share = manifest_computed(trial) / total
            print(f"threshold {threshold} (quantile {quantile} of the changes): {share:.0%} of the passes computed",
                  flush=True)
            if share <= 0.6:
                break
        print(f"machine: {os.cpu_count()} CPUs, fp32; medium FLUX.1-dev ({params / 1e6:.1f} M transformer "
              f"parameters), {len(PROMPTS)} prompts, {STEPS} steps, {SIZE}x{SIZE}"
              + (f"; threshold {threshold} ({len(changes)} first-block changes, {min(changes):.3f} to "
                 f"{max(changes):.3f})" if changes else ""))
        # 2. The rounds: each cache's dp-launch side and diffusers side.
        caches = {"cached": ("first_block", f"first_block_cache:threshold={threshold}", str(threshold)),
                  "taylorseer": ("taylorseer", "taylorseer_cache", "taylorseer"),
                  "mag": ("mag", "mag_cache:mag_ratios=flux", "mag")}
        caches = {k: v for k, v in caches.items() if v[0] in chosen}
        walls = {"dp-launch": []}
        for k in caches:
            walls[f"dp-launch {k}"] = []
            if not strategy:
                walls[f"diffusers {k}"] = []
        print(f"dp-launch {' '.join(strategy) or '(one process)'}", flush=True)
        diffusers_passes = {}
        for r in range(runs):
            out = {k: os.path.join(tmp, f"{k.replace(' ', '_')}") for k in walls}
            walls["dp-launch"].append(run(launch[:1] + ["-o", out["dp-launch"]] + launch[1:])[0])
            for k, (_, flag, diffusers_arg) in caches.items():
                walls[f"dp-launch {k}"].append(run(launch[:1] + ["--cache", flag, "-o", out[f"dp-launch {k}"]]
                                                   + launch[1:])[0])
                if not strategy:
                    os.makedirs(out[f"diffusers {k}"], exist_ok=True)
                    wall, proc = run([sys.executable, "-c", DIFFUSERS_RUN, folder, diffusers_arg,
                                      out[f"diffusers {k}"], json.dumps(PROMPTS)])
                    walls[f"diffusers {k}"].append(wall)
                    diffusers_passes[f"diffusers {k}"] = json.loads(proc.stdout.strip().splitlines()[-1])["computed"]
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in walls.items()), flush=True)
        med = {k: statistics.median(v) for k, v in walls.items()}
        print(f"\n{'side':<22}{'median wall':>14}{'passes computed':>18}")
        for k in walls:
            passes = total if k == "dp-launch" else diffusers_passes.get(k)
            if passes is None:
                passes = manifest_computed(out[k])
            print(f"{k:<22}{med[k]:>12.1f} s{passes:>12} of {total}")
        names = {"cached": "first-block cache", "taylorseer": "TaylorSeer", "mag": "MagCache"}
        for k in caches:
            print(f"{names[k]}: dp-launch / uncached {med[f'dp-launch {k}'] / med['dp-launch']:.2f}x (goal <= 0.70)"
                  + (f", dp-launch / diffusers {med[f'dp-launch {k}'] / med[f'diffusers {k}']:.2f}x (goal <= 0.90)"
                     if not strategy else ""))
        # 3. What the cache costs.
        for side in (f"dp-launch {k}" for k in caches):
            _, proc = run([dp_launch, "compare", out["dp-launch"], out[side], "--gallery", os.path.join(tmp, "pairs.html")])
            print(f"dp-launch compare uncached, {side}:\n" + proc.stdout.strip())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
