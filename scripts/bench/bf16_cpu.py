"""bf16 against fp32 on this machine's CPU, side by side in one run, on the medium random FLUX.1-dev
of flux_vs_diffusers.py (4 double and 8 single blocks of 8 heads x 64, T5 of 4 layers): one prompt,
STEPS steps at 512x512, through dp-launch (--dtype fp32, --dtype bf16) and a diffusers script
(torch_dtype float32, bfloat16), RUNS rounds alternating. Prints each side's median wall time, the
bf16 / fp32 ratios, dp-launch / diffusers in bf16, and dp-launch compare's PSNR and SSIM of the
bf16 image against the fp32 one (what bf16 costs in pixels).

    bf16_cpu.py DP_LAUNCH [--runs N] [--steps N]
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from flux_vs_diffusers import build_medium  # noqa: E402

SIZE, TOKENS, GUIDANCE, SEED = 512, 128, 3.5, 0
PROMPT = "an old lighthouse on a rocky coast at dusk, waves and gulls"

DIFFUSERS_RUN = r"""
import sys
import torch
from diffusers import FluxPipeline
folder, dtype, steps, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
pipe = FluxPipeline.from_pretrained(folder, torch_dtype=torch.bfloat16 if dtype == "bf16" else torch.float32)
pipe.set_progress_bar_config(disable=True)
with torch.no_grad():
    image = pipe(prompt=%(prompt)r, guidance_scale=%(guidance)s, num_inference_steps=steps, width=%(size)d,
                 height=%(size)d, max_sequence_length=%(tokens)d,
                 generator=torch.Generator("cpu").manual_seed(%(seed)d)).images[0]
image.save(out)
""" % dict(prompt=PROMPT, guidance=GUIDANCE, size=SIZE, tokens=TOKENS, seed=SEED)


def run(args):
    start = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(args[:4])} ... failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return time.perf_counter() - start, proc


def main():
    dp_launch = sys.argv[1]
    runs = int(sys.argv[sys.argv.index("--runs") + 1]) if "--runs" in sys.argv else 3
    steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 8
    tmp = tempfile.mkdtemp(prefix="dp-bench-bf16-")
    try:
        folder = os.path.join(tmp, "medium")
        params = build_medium(folder, "dev")
        prompts = os.path.join(tmp, "prompts.jsonl")
        with open(prompts, "w") as f:
            f.write(json.dumps({"prompt": PROMPT, "seed": SEED, "guidance_scale": GUIDANCE, "width": SIZE,
                                "height": SIZE, "num_inference_steps": steps, "max_sequence_length": TOKENS}) + "\n")
        walls = {"dp-launch fp32": [], "dp-launch bf16": [], "diffusers fp32": [], "diffusers bf16": []}
        out = {k: os.path.join(tmp, k.replace(" ", "_")) for k in walls}
        for r in range(runs):
            for dtype in ("fp32", "bf16"):
                walls[f"dp-launch {dtype}"].append(run([dp_launch, "--model", folder, "--dtype", dtype, "-q",
                                                        "--overwrite", "-o", out[f"dp-launch {dtype}"], prompts])[0])
                os.makedirs(out[f"diffusers {dtype}"], exist_ok=True)
                walls[f"diffusers {dtype}"].append(run([sys.executable, "-c", DIFFUSERS_RUN, folder, dtype, str(steps),
                                                        os.path.join(out[f"diffusers {dtype}"], "00000.png")])[0])
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in walls.items()), flush=True)
        med = {k: statistics.median(v) for k, v in walls.items()}
        print(f"\nmachine: {os.cpu_count()} CPUs; medium FLUX.1-dev ({params / 1e6:.1f} M transformer parameters), "
              f"1 prompt, {steps} steps, {SIZE}x{SIZE}; medians of {runs} rounds (whole processes: load, encode, steps, "
              "decode)")
        for k in walls:
            print(f"{k:<18}{med[k]:>8.1f} s")
        print(f"bf16 / fp32: dp-launch {med['dp-launch bf16'] / med['dp-launch fp32']:.2f}x, "
              f"diffusers {med['diffusers bf16'] / med['diffusers fp32']:.2f}x")
        print(f"dp-launch / diffusers: fp32 {med['dp-launch fp32'] / med['diffusers fp32']:.2f}x, "
              f"bf16 {med['dp-launch bf16'] / med['diffusers bf16']:.2f}x")
        _, proc = run([dp_launch, "compare", out["dp-launch fp32"], out["dp-launch bf16"], "--gallery",
                       os.path.join(tmp, "pairs.html")])
        print("dp-launch compare fp32 bf16:\n" + proc.stdout.strip())
        flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
        print("CPU bf16 instructions: " + (", ".join(x for x in ("avx512_bf16", "amx_bf16") if x in flags) or "none"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
