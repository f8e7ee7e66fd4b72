"""How close the main job runs to this machine's limit, and what it costs against diffusers: the
medium random FLUX.1-dev (with T5), SD3 (with T5) and Qwen-Image of the *_vs_diffusers.py
benchmarks, 4 prompts of 8 steps at 512x512 (SD3 and Qwen-Image guided, with one negative prompt
on every line), through dp-launch as a whole job (one process: load, encode, steps, decode, PNGs)
and through a diffusers script that loads the pipeline once and calls it on each prompt, the same
seeds, alternating, RUNS rounds.

For each model it prints:
- the medians of both sides' wall times and their ratio, and whether the images are diffusers'
  (the share of channels within 1 of diffusers' PNGs, and the largest difference);
- the job summary's phase split (load, encode, steps, decode, write) and the steps' MFU: their FLOPs
  (Note [FLOPs of a pass]) over their time, against the rate LibTorch's GEMMs reach at the pass's
  own shapes, measured by the rank; and the steps' time in their GEMMs, in attention and outside
  both, as the rank timed them in the steps (Note [kernel time in the steps]);
- the same dp-launch job with --quantize int8 (the rest in fp32), and where the CPU has bf16
  instructions (without them LibTorch's bf16 kernels run 10x slower than fp32, docs/benchmarks.md)
  with --dtype bf16, and with both: int8 products, the rest in bf16, what --quantize int8 runs
  there under --dtype auto for a model 512 or more wide: each one's wall, its step time against
  fp32's, and `dp-launch compare`'s PSNR and SSIM against fp32.
With several rounds, a side's phases are those of its round with the median steps, and a step
ratio is the median of the rounds' own ratios (each round runs every side once, one after another).

    machine_limit.py DP_LAUNCH [--runs N] [--models flux,sd3,qwen] [--steps N] [--prompts N]
"""
import json
import os
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bf16_cpu import run  # noqa: E402  (a whole process, timed; its failure ends the benchmark)
from job_summary import summary_of  # noqa: E402

SIZE, SEED = 512, 0
PROMPTS = ["an old lighthouse on a rocky coast at dusk, waves and gulls", "a red bicycle leaning on a brick wall",
           "a bowl of ramen on a wooden table, steam rising", "a snowy mountain village at night, warm windows",
           "a fox in a field of tall grass at sunrise", "a sailing boat on a calm lake, mountains behind"]
NEGATIVE = "blurry, low quality"

# Each model: how to build it, the call arguments a line and the diffusers call take.
MODELS = {
    "flux": dict(line=dict(guidance_scale=3.5, max_sequence_length=128), negative=False),
    "sd3": dict(line=dict(guidance_scale=5.0), negative=True),
    "qwen": dict(line=dict(true_cfg_scale=4.0), negative=True),
}

DIFFUSERS_RUN = r"""
import json, sys, time
import torch
from diffusers import DiffusionPipeline
folder, lines, out = sys.argv[1], json.load(open(sys.argv[2])), sys.argv[3]
pipe = DiffusionPipeline.from_pretrained(folder, torch_dtype=torch.float32)
pipe.set_progress_bar_config(disable=True)
for i, line in enumerate(lines):
    kw = {k: v for k, v in line.items() if k not in ("seed",)}
    with torch.no_grad():
        image = pipe(generator=torch.Generator("cpu").manual_seed(line["seed"]), **kw).images[0]
    image.save(f"{out}/{i:05d}.png")
"""


def build(name, folder):
    if name == "flux":
        from flux_vs_diffusers import build_medium
        return build_medium(folder, "dev")
    if name == "sd3":
        from pipeline_vs_diffusers import CONFIGS, build_model
        return build_model("medium+t5", CONFIGS["medium+t5"], folder)
    from qwen_image_vs_diffusers import build_medium
    return build_medium(folder)


def pixels_against(ours, theirs, count):
    import numpy as np
    from PIL import Image
    within, worst = [], 0
    files = {r["index"]: r["file"] for r in map(json.loads, open(os.path.join(ours, "manifest.jsonl")))}
    for i in range(count):
        a = np.asarray(Image.open(os.path.join(ours, files[i])).convert("RGB"), dtype=np.int16)
        b = np.asarray(Image.open(os.path.join(theirs, f"{i:05d}.png")).convert("RGB"), dtype=np.int16)
        d = np.abs(a - b)
        within.append(float((d <= 1).mean()))
        worst = max(worst, int(d.max()))
    return min(within), worst


def phase_text(phases):
    p = phases[0]
    text = (f"load {p['load_ms'] / 1000:.2f} s, encode {p['encode_ms'] / 1000:.2f} s, steps "
            f"{p['steps_ms'] / 1000:.2f} s, decode {p['decode_ms'] / 1000:.2f} s, write {p['write_ms'] / 1000:.2f} s")
    if p.get("mfu"):
        text += (f"; {p['passes']} passes at {p['flop_rate'] / 1e9:.1f} GFLOP/s, MFU {100 * p['mfu']:.0f} % of the "
                 f"{p['gemm_rate'] / 1e9:.1f} GFLOP/s the GEMMs reach at their shapes")
    if "gemm_share" in p:  # timed in the steps (Note [kernel time in the steps])
        steps_s = p["steps_ms"] / 1000
        text += (f"; timed in the steps: GEMMs {100 * p['gemm_share']:.0f} % (at "
                 f"{p['gemm_flops'] / (p['gemm_share'] * steps_s) / 1e9:.1f} GFLOP/s), attention "
                 f"{100 * p['attention_share']:.0f} %, outside GEMMs and attention "
                 f"{100 * p['outside_gemm_attention']:.0f} %")
    elif "outside_gemm_attention" in p:
        text += f"; outside GEMMs and attention at their measured rates {100 * p['outside_gemm_attention']:.0f} %"
    return text


def main():
    dp_launch = sys.argv[1]
    arg = lambda name, default: sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default  # noqa: E731
    runs, steps, count = int(arg("--runs", "1")), int(arg("--steps", "8")), int(arg("--prompts", "4"))
    models = arg("--models", "flux,sd3,qwen").split(",")
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    bf16 = any(f in flags for f in ("avx512_bf16", "amx_bf16"))
    tmp = tempfile.mkdtemp(prefix="dp-bench-limit-")
    print(f"machine: {os.cpu_count()} CPUs; bf16 instructions: {'yes' if bf16 else 'none'}; int8: "
          f"{', '.join(f for f in ('avx512_vnni', 'avx_vnni', 'amx_int8') if f in flags) or 'AVX2 only'}; "
          f"{count} prompts, {steps} steps, {SIZE}x{SIZE}; medians of {runs} round(s)", flush=True)
    try:
        for name in models:
            spec = MODELS[name]
            folder = os.path.join(tmp, name)
            params = build(name, folder)
            lines = []
            for i in range(count):
                line = dict(prompt=PROMPTS[i % len(PROMPTS)], seed=SEED + i, num_inference_steps=steps, width=SIZE,
                            height=SIZE, **spec["line"])
                if spec["negative"]:
                    line["negative_prompt"] = NEGATIVE
                lines.append(line)
            prompts = os.path.join(tmp, f"{name}.jsonl")
            with open(prompts, "w") as f:
                f.writelines(json.dumps(line) + "\n" for line in lines)
            with open(os.path.join(tmp, f"{name}.json"), "w") as f:
                json.dump(lines, f)
            sides = {"dp-launch fp32": [], "diffusers fp32": [], "dp-launch int8": []}
            if bf16:
                sides["dp-launch bf16"] = []
                sides["dp-launch int8+bf16"] = []
            out = {k: os.path.join(tmp, f"{name}-{k.replace(' ', '-')}") for k in sides}
            summaries = {}
            for r in range(runs):
                for side in sides:
                    if side.startswith("diffusers"):
                        os.makedirs(out[side], exist_ok=True)
                        wall, _ = run([sys.executable, "-c", DIFFUSERS_RUN, folder,
                                       os.path.join(tmp, f"{name}.json"), out[side]])
                    else:
                        extra = ["--quantize", "int8"] if "int8" in side else []
                        dtype = "bf16" if "bf16" in side else "fp32"
                        wall, proc = run([dp_launch, "-n", "1", "--model", folder, "--dtype", dtype, "--progress",
                                          "json", "--overwrite", "-o", out[side], *extra, prompts])
                        summaries.setdefault(side, []).append(summary_of(proc))
                    sides[side].append(wall)
                print(f"{name} round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in sides.items()),
                      flush=True)
            med = {k: statistics.median(v) for k, v in sides.items()}
            within, worst = pixels_against(out["dp-launch fp32"], out["diffusers fp32"], count)
            print(f"\n{name}: medium ({params / 1e6:.1f} M transformer parameters)")
            for k in sides:
                print(f"  {k:<20}{med[k]:>8.1f} s")
            print(f"  dp-launch / diffusers (fp32, whole jobs): {med['dp-launch fp32'] / med['diffusers fp32']:.2f}x; "
                  f"images: {100 * within:.2f} % of channels within 1 of diffusers' (worst image), largest "
                  f"difference {worst}")
            step_ms = {side: [r["phases"][0]["steps_ms"] for r in rounds] for side, rounds in summaries.items()}
            # Each side's round with its median steps stands for it; the ratios are per round, then their median.
            summaries = {side: sorted(rounds, key=lambda r: r["phases"][0]["steps_ms"])[len(rounds) // 2]
                         for side, rounds in summaries.items()}
            for side, summary in summaries.items():
                print(f"  {side} phases: {phase_text(summary['phases'])}")
            for side in [s for s in summaries if s != "dp-launch fp32"]:
                ratio = statistics.median(a / b for a, b in zip(step_ms[side], step_ms["dp-launch fp32"]))
                _, proc = run([dp_launch, "compare", out["dp-launch fp32"], out[side], "--gallery",
                               os.path.join(tmp, f"{name}-{side.replace(' ', '-')}.html")])
                last = proc.stdout.strip().splitlines()[-2:]
                print(f"  {side} steps / fp32 steps: {ratio:.2f}x (rounds: "
                      f"{', '.join(f'{a / b:.2f}' for a, b in zip(step_ms[side], step_ms['dp-launch fp32']))}); "
                      f"compare against fp32: {' | '.join(last)}")
            print(flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
