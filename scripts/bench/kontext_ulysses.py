"""FLUX.1-Kontext's step time with its longer sequence, one process against --ulysses 2: the medium
random FLUX.1-dev of flux_vs_diffusers.py saved as a FluxKontextPipeline folder, one 640 x 480 JPEG
as the reference (resized to the preferred 1184 x 880: 74 x 55 = 4070 tokens beside the output's
32 x 32 = 1024 at 512 x 512), fp32 on this machine's CPU. Beside it, the same prompt without an
image (text to image: the 1024 tokens alone).

A step's time is what a prompt's run grows by per extra step: each setting runs at LOW and HIGH
steps (each a whole dp-launch process), and (ms(HIGH) - ms(LOW)) / (HIGH - LOW) of the manifest's
per-image time leaves out the load, the encoders and the decode. The settings alternate within
each round; the median over the rounds is printed, with the ratio to one process.

    kontext_ulysses.py DP_LAUNCH [--rounds R]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from flux_vs_diffusers import build_medium  # noqa: E402
from img2img_batch import make_inputs  # noqa: E402

SIDE, LOW, HIGH, SEED = 512, 1, 3, 0
PROMPT = "put a red scarf on the snowman"


def kontext_folder(folder):
    """The medium FLUX.1-dev, its model_index.json naming FluxKontextPipeline (the same weights)."""
    build_medium(folder, "dev")
    path = os.path.join(folder, "model_index.json")
    with open(path) as f:
        index = json.load(f)
    index["_class_name"] = "FluxKontextPipeline"
    with open(path, "w") as f:
        json.dump(index, f, indent=2)


def image_ms(dp_launch, model, out, steps, flags, image):
    args = [dp_launch, "--model", model, "--device", "cpu", "--dtype", "fp32", "--prompt", PROMPT, "--steps",
            str(steps), "--width", str(SIDE), "--height", str(SIDE), "--max-area", str(SIDE * SIDE),
            "--max-sequence-length", "128", "--seed", str(SEED), "--overwrite", "-o", out, "-q"] + flags
    if image:
        args += ["--image", image]
    run = subprocess.run(args, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"dp-launch {' '.join(flags)} failed:\n{run.stderr[-3000:]}")
    records = [json.loads(line) for line in open(os.path.join(out, "manifest.jsonl"))]
    return records[0]["ms"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("dp_launch")
    parser.add_argument("--rounds", type=int, default=2)
    a = parser.parse_args()
    work = tempfile.mkdtemp(prefix="dp-kontext-")
    model, inputs = os.path.join(work, "kontext-medium"), os.path.join(work, "photos")
    kontext_folder(model)
    make_inputs(inputs)
    image = os.path.join(inputs, "photo_00.jpg")
    settings = [("one process, edit", ["-n", "1"], image), ("--ulysses 2, edit", ["-n", "2", "--ulysses", "2"], image),
                ("one process, text", ["-n", "1"], None), ("--ulysses 2, text", ["-n", "2", "--ulysses", "2"], None)]
    per_step = {name: [] for name, _, _ in settings}
    for _ in range(a.rounds):
        for name, flags, img in settings:
            low = image_ms(a.dp_launch, model, os.path.join(work, "out"), LOW, flags, img)
            high = image_ms(a.dp_launch, model, os.path.join(work, "out"), HIGH, flags, img)
            per_step[name].append((high - low) / (HIGH - LOW) / 1e3)
    print(f"medium FLUX.1 as FluxKontextPipeline, {SIDE}x{SIDE} (1024 tokens) + a 640x480 reference (1184x880: "
          f"4070 tokens), 128 T5 tokens, fp32 on {os.cpu_count()} CPUs; median of {a.rounds} rounds")
    print(f"{'setting':22} {'s/step':>8} {'vs one process':>15}")
    for name, _, _ in settings:
        single = statistics.median(per_step[name.replace('--ulysses 2', 'one process')])
        s = statistics.median(per_step[name])
        print(f"{name:22} {s:8.3f} {s / single:14.2f}x")


if __name__ == "__main__":
    main()
