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
3. The same two ways with TaylorSeerCacheConfig's defaults (--cache taylorseer_cache).
4. The passes computed (the manifest's computed_steps, and diffusers' own count from its hooked
   modules' forwards), and dp-launch compare's PSNR and SSIM of the cached images against the
   uncached ones.

Prints each side's median wall time and the ratios the issue sets goals for: cached / uncached
(goal 0.7 at most) and dp-launch cached / diffusers cached (goal 0.9 at most).

    step_cache.py DP_LAUNCH [--runs N] [--threshold T] [--launch "-n 2 --ulysses 2"]

--threshold T skips the search; --launch gives dp-launch's sides a strategy (the diffusers sides,
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
from diffusers.hooks import FirstBlockCacheConfig, TaylorSeerCacheConfig
folder, threshold, out = sys.argv[1], sys.argv[2], sys.argv[3]
prompts = json.loads(sys.argv[4])
pipe = FluxPipeline.from_pretrained(folder, torch_dtype=torch.float32)
pipe.set_progress_bar_config(disable=True)
taylorseer = threshold == "taylorseer"
pipe.transformer.enable_cache(TaylorSeerCacheConfig() if taylorseer else FirstBlockCacheConfig(threshold=float(threshold)))
# The passes computed: the hooked module's own forward, which its cache hook calls only then (the
# tail block's; TaylorSeer: the last block's attention's).
from diffusers.hooks import HookRegistry
computed = 0
last = pipe.transformer.single_transformer_blocks[-1]
hook = HookRegistry.check_if_exists_or_initialize(last.attn if taylorseer else last).get_hook(
    "taylorseer_cache" if taylorseer else "fbc_block_hook")
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
        if fixed is None:
            _, proc = run(launch[:1] + ["--cache", "first_block_cache:threshold=0", "-o", os.path.join(tmp, "calibrate")]
                          + launch[1:], {"DP_CACHE_REPORT": "1"})
        if proc is not None:
            changes = sorted(float(x) for line in proc.stderr.splitlines() if "first-block changes" in line
                             for x in re.findall(r" (\d+\.\d+)", line))
        total = STEPS * len(PROMPTS)
        for quantile in ((0.5, 0.7, 0.8, 0.9, 0.95) if fixed is None else ()):
            threshold = round(changes[min(len(changes) - 1, int(quantile * len(changes)))], 4)
            trial = os.path.join(tmp, "trial")
            run(launch[:1] + ["--cache", f"first_block_cache:threshold={threshold}", "-o", trial] + launch[1:])
            share = manifest_computed(trial) / total
            print(f"threshold {threshold} (quantile {quantile} of the changes): {share:.0%} of the passes computed",
                  flush=True)
            if share <= 0.6:
                break
        print(f"machine: {os.cpu_count()} CPUs, fp32; medium FLUX.1-dev ({params / 1e6:.1f} M transformer "
              f"parameters), {len(PROMPTS)} prompts, {STEPS} steps, {SIZE}x{SIZE}; threshold {threshold} "
              f"({len(changes)} first-block changes, {min(changes):.3f} to {max(changes):.3f})")
        # 2. The rounds.
        walls = {"dp-launch": [], "dp-launch cached": [], "diffusers cached": [], "dp-launch taylorseer": [],
                 "diffusers taylorseer": []}
        if strategy:
            del walls["diffusers cached"], walls["diffusers taylorseer"]
        print(f"dp-launch {' '.join(strategy) or '(one process)'}", flush=True)
        diffusers_computed = diffusers_taylor = None
        for r in range(runs):
            out = {k: os.path.join(tmp, f"{k.replace(' ', '_')}") for k in walls}
            for k in ("diffusers cached", "diffusers taylorseer"):
                if k in out:
                    os.makedirs(out[k], exist_ok=True)
            walls["dp-launch"].append(run(launch[:1] + ["-o", out["dp-launch"]] + launch[1:])[0])
            walls["dp-launch cached"].append(run(launch[:1] + ["--cache", f"first_block_cache:threshold={threshold}",
                                                               "-o", out["dp-launch cached"]] + launch[1:])[0])
            if not strategy:
                wall, proc = run([sys.executable, "-c", DIFFUSERS_RUN, folder, str(threshold), out["diffusers cached"],
                                  json.dumps(PROMPTS)])
                walls["diffusers cached"].append(wall)
                diffusers_computed = json.loads(proc.stdout.strip().splitlines()[-1])["computed"]
            walls["dp-launch taylorseer"].append(run(launch[:1] + ["--cache", "taylorseer_cache", "-o",
                                                                   out["dp-launch taylorseer"]] + launch[1:])[0])
            if not strategy:
                wall, proc = run([sys.executable, "-c", DIFFUSERS_RUN, folder, "taylorseer",
                                  out["diffusers taylorseer"], json.dumps(PROMPTS)])
                walls["diffusers taylorseer"].append(wall)
                diffusers_taylor = json.loads(proc.stdout.strip().splitlines()[-1])["computed"]
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in walls.items()), flush=True)
        med = {k: statistics.median(v) for k, v in walls.items()}
        computed = manifest_computed(out["dp-launch cached"])
        print(f"\n{'side':<20}{'median wall':>14}{'passes computed':>18}")
        for k in walls:
            passes = {"dp-launch": total, "dp-launch cached": computed,
                      "dp-launch taylorseer": manifest_computed(out["dp-launch taylorseer"])}.get(k)
            if passes is None:
                passes = diffusers_computed if k == "diffusers cached" else diffusers_taylor
            print(f"{k:<20}{med[k]:>12.1f} s{passes:>12} of {total}")
        print(f"dp-launch cached / dp-launch uncached: {med['dp-launch cached'] / med['dp-launch']:.2f}x (goal <= 0.70)")
        print(f"TaylorSeer: dp-launch / uncached {med['dp-launch taylorseer'] / med['dp-launch']:.2f}x")
        if not strategy:
            print(f"dp-launch cached / diffusers cached:   {med['dp-launch cached'] / med['diffusers cached']:.2f}x "
                  "(goal <= 0.90)")
            print(f"TaylorSeer: dp-launch / diffusers {med['dp-launch taylorseer'] / med['diffusers taylorseer']:.2f}x")
        # 3. What the cache costs.
        for side in ("dp-launch cached", "dp-launch taylorseer"):
            _, proc = run([dp_launch, "compare", out["dp-launch"], out[side], "--gallery", os.path.join(tmp, "pairs.html")])
            print(f"dp-launch compare uncached, {side}:\n" + proc.stdout.strip())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
