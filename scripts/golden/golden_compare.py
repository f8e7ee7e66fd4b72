"""Image pairs and the PSNR and SSIM scikit-image gives them, for `dp-launch compare` (Note [compare],
cli/compare_command.h). Files, in tests/data/golden/compare/:

- run_a/, run_b/: two output folders as dp-launch leaves them (a manifest.jsonl and PNGs): prompt 0 a
  smooth 32x32 image and the same with noise; prompt 1 a 40x24 image and the same shifted by a pixel;
  prompt 2 the same image in both; prompt 3 only in run_a (no pair).
- expected.json: for each index with a pair, skimage.metrics.peak_signal_noise_ratio(a, b,
  data_range=255) and structural_similarity(a, b, data_range=255, channel_axis=-1,
  gaussian_weights=True, sigma=1.5, use_sample_covariance=False), the definition compare follows.
"""
import json
import os

import numpy as np
from PIL import Image

from make_golden import OUT

PARTS = ["compare"]


def _smooth(width, height, seed):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    image = np.stack([128 + 100 * np.sin(x / 5.0 + c) * np.cos(y / 7.0 - c) for c in range(3)], axis=-1)
    return np.clip(image + rng.normal(0, 4, image.shape), 0, 255).round().astype(np.uint8)


def compare():
    from skimage.metrics import peak_signal_noise_ratio, structural_similarity

    root = os.path.join(OUT, "compare")
    rng = np.random.default_rng(11)
    first = _smooth(32, 32, 1)
    noisy = np.clip(first.astype(np.int16) + rng.integers(-20, 21, first.shape), 0, 255).astype(np.uint8)
    second = _smooth(40, 24, 2)
    shifted = np.roll(second, 1, axis=1)
    same = _smooth(24, 16, 3)
    pairs = {0: (first, noisy), 1: (second, shifted), 2: (same, same)}
    alone = _smooth(16, 16, 4)
    expected = {}
    for run, pick in (("run_a", 0), ("run_b", 1)):
        os.makedirs(os.path.join(root, run), exist_ok=True)
        records = []
        for index, images in pairs.items():
            name = f"{index:05d}.png"
            Image.fromarray(images[pick]).save(os.path.join(root, run, name))
            records.append({"index": index, "status": "ok", "file": name, "prompt": f"prompt {index}"})
        if run == "run_a":
            Image.fromarray(alone).save(os.path.join(root, run, "00003.png"))
            records.append({"index": 3, "status": "ok", "file": "00003.png", "prompt": "prompt 3"})
        with open(os.path.join(root, run, "manifest.jsonl"), "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
    for index, (a, b) in pairs.items():
        psnr = peak_signal_noise_ratio(a, b, data_range=255)
        ssim = structural_similarity(a, b, data_range=255, channel_axis=-1, gaussian_weights=True, sigma=1.5,
                                     use_sample_covariance=False)
        expected[str(index)] = {"psnr": "inf" if np.isinf(psnr) else float(psnr), "ssim": float(ssim)}
        print(f"prompt {index}: PSNR {psnr:.4f} dB, SSIM {ssim:.6f}")
    with open(os.path.join(root, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")
