"""A batch edit (img2img) of 16 images on the medium random FLUX.1-dev of flux_vs_diffusers.py:
`dp-launch -n 1 --prompt P --image FOLDER` against a diffusers script that loads FluxImg2ImgPipeline
once and runs it over the same files (load_image, the same size, strength, steps and seeds), fp32
on this machine's CPU, each in its own process, one after the other. Prints each side's wall time
(the whole process, model load included), the time per image after the load, the diffusers side's
share of time in the VAE encoder (vae.encode, timed around the call), and the dp-launch /
diffusers ratios.

    img2img_batch.py DP_LAUNCH
"""
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from flux_vs_diffusers import build_medium  # noqa: E402

IMAGES, SIDE, STEPS, STRENGTH, SEED = 16, 512, 6, 0.6, 0
PROMPT = "the same scene in winter, snow on every roof"

DIFFUSERS_RUN = r"""
import glob, json, os, sys, time
t0 = time.perf_counter()
import torch
from diffusers import FluxImg2ImgPipeline
from diffusers.utils import load_image
folder, inputs, side, steps, strength, seed, prompt = sys.argv[1:8]
pipe = FluxImg2ImgPipeline.from_pretrained(folder, torch_dtype=torch.float32)
pipe.set_progress_bar_config(disable=True)
encode = pipe.vae.encode
spent = [0.0]
def timed(*a, **k):
    s = time.perf_counter()
    out = encode(*a, **k)
    spent[0] += time.perf_counter() - s
    return out
pipe.vae.encode = timed
t1 = time.perf_counter()
for k, path in enumerate(sorted(glob.glob(os.path.join(inputs, "*.jpg")))):
    with torch.no_grad():
        pipe(prompt=prompt, image=load_image(path), strength=float(strength), num_inference_steps=int(steps),
             width=int(side), height=int(side), max_sequence_length=128,
             generator=torch.Generator("cpu").manual_seed(int(seed) + k))
t2 = time.perf_counter()
print(json.dumps({"load_s": t1 - t0, "images_s": t2 - t1, "encode_s": spent[0]}))
"""


def make_inputs(folder):
    """16 JPEGs of a smooth scene with edges, at 640 x 480 (resized to SIDE x SIDE by both sides)."""
    import numpy as np
    from PIL import Image

    os.makedirs(folder, exist_ok=True)
    y, x = np.mgrid[0:480, 0:640]
    for k in range(IMAGES):
        rgb = np.stack([(x + 13 * k) % 256, (y * 2 + 7 * k) % 256, ((x // 32 + y // 32 + k) % 2) * 180 + 40],
                       axis=-1).astype(np.uint8)
        Image.fromarray(rgb).save(os.path.join(folder, f"photo_{k:02d}.jpg"), "JPEG", quality=90)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    dp_launch = sys.argv[1]
    work = tempfile.mkdtemp(prefix="dp-img2img-")
    model, inputs = os.path.join(work, "flux-medium"), os.path.join(work, "photos")
    build_medium(model, "dev")
    make_inputs(inputs)

    start = time.perf_counter()
    out = subprocess.run([dp_launch, "-n", "1", "--model", model, "--device", "cpu", "--dtype", "fp32", "--prompt",
                          PROMPT, "--image", inputs, "--strength", str(STRENGTH), "--steps", str(STEPS), "--width",
                          str(SIDE), "--height", str(SIDE), "--max-sequence-length", "128", "--seed", str(SEED),
                          "-o", os.path.join(work, "out"), "-q"], capture_output=True, text=True)
    dp_wall = time.perf_counter() - start
    if out.returncode != 0:
        sys.exit(f"dp-launch failed:\n{out.stderr[-3000:]}")
    records = [json.loads(line) for line in open(os.path.join(work, "out", "manifest.jsonl"))]
    dp_images_s = sum(r["ms"] for r in records) / 1e3

    start = time.perf_counter()
    ref = subprocess.run([sys.executable, "-c", DIFFUSERS_RUN, model, inputs, str(SIDE), str(STEPS), str(STRENGTH),
                          str(SEED), PROMPT], capture_output=True, text=True)
    ref_wall = time.perf_counter() - start
    if ref.returncode != 0:
        sys.exit(f"diffusers failed:\n{ref.stderr[-3000:]}")
    r = json.loads(ref.stdout.strip().splitlines()[-1])

    print(f"{IMAGES} JPEGs (640x480) edited at {SIDE}x{SIDE}, {STEPS} steps at strength {STRENGTH}, fp32 on CPU")
    print(f"dp-launch -n 1:  wall {dp_wall:7.1f} s   images {dp_images_s:7.1f} s ({dp_images_s / IMAGES:.2f} s each)")
    print(f"diffusers:       wall {ref_wall:7.1f} s   images {r['images_s']:7.1f} s ({r['images_s'] / IMAGES:.2f} s each),"
          f" VAE encoder {r['encode_s']:.1f} s ({100 * r['encode_s'] / r['images_s']:.1f} % of the images' time)")
    print(f"ratio (dp-launch / diffusers): wall {dp_wall / ref_wall:.2f}x, per image "
          f"{dp_images_s / r['images_s']:.2f}x (below 1 is faster)")


if __name__ == "__main__":
    main()
