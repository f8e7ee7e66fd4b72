"""Writes the golden tensors the C++ tests compare against, from diffusers and transformers.

Run: scripts/golden/make_golden.sh (installs the pinned reference packages, then runs this).
Every file goes to tests/data/golden/ as safetensors; the cases are described in its metadata, so
the C++ test needs no Python. Everything is seeded: running it again gives the same files.
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "golden")


def save(name, tensors, meta):
    path = os.path.join(OUT, name)
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    save_file(tensors, path, metadata={"cases": json.dumps(meta, sort_keys=True)})
    print(f"{path}: {len(tensors)} tensors, {os.path.getsize(path)} bytes")


def scheduler():
    from diffusers import FlowMatchEulerDiscreteScheduler

    cases = {
        "sd3": ({"shift": 3.0}, 28, None),
        "sd3_one_step": ({"shift": 3.0}, 1, None),
        "no_shift": ({"shift": 1.0}, 7, None),
        "dynamic": ({"use_dynamic_shifting": True, "base_shift": 0.5, "max_shift": 1.15}, 10, 0.8),
        "dynamic_linear": ({"use_dynamic_shifting": True, "time_shift_type": "linear"}, 5, 1.3),
        "terminal": ({"shift": 3.0, "shift_terminal": 0.1}, 6, None),
        "inverted": ({"shift": 2.0, "invert_sigmas": True}, 4, None),
        "short_train": ({"shift": 3.0, "num_train_timesteps": 50}, 9, None),
    }
    tensors, meta = {}, {}
    g = torch.Generator().manual_seed(0)
    for name, (config, steps, mu) in cases.items():
        s = FlowMatchEulerDiscreteScheduler(**config)
        s.set_timesteps(steps, mu=mu)
        tensors[f"{name}.sigmas"] = s.sigmas.float()
        tensors[f"{name}.timesteps"] = s.timesteps.float()
        meta[name] = {"config": config, "steps": steps, "mu": mu}
    # One Euler step on random tensors, at every index of the sd3 schedule.
    s = FlowMatchEulerDiscreteScheduler(shift=3.0)
    s.set_timesteps(4)
    sample = torch.randn(2, 4, 8, 8, generator=g)
    out = torch.randn(2, 4, 8, 8, generator=g)
    tensors["step.sample"], tensors["step.model_output"] = sample, out
    for i, t in enumerate(s.timesteps):
        tensors[f"step.prev_{i}"] = s.step(out, t, sample).prev_sample
    meta["step"] = {"config": {"shift": 3.0}, "steps": 4}
    save("scheduler.safetensors", tensors, meta)


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(0)
    wanted = sys.argv[1:] or ["scheduler"]
    for part in wanted:
        globals()[part]()
