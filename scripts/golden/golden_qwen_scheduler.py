"""Golden sigmas of QwenImagePipeline's schedule: explicit sigmas linspace(1, 1/N, N), shifted by
the dynamic mu of the image's token count (calculate_shift), stretched to shift_terminal, as the
pipeline sets them on Qwen-Image's FlowMatchEulerDiscreteScheduler."""
import numpy as np
import torch

from make_golden import save

QWEN_SCHEDULER = dict(num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=0.9,
                      base_image_seq_len=256, max_image_seq_len=8192, shift_terminal=0.02,
                      time_shift_type="exponential")


def qwen_scheduler():
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift, retrieve_timesteps

    cases = {"qwen_1024": (50, 4096), "qwen_odd": (7, 15), "qwen_one_step": (1, 4096),
             "qwen_no_terminal": (9, 1000)}
    tensors, meta = {}, {}
    for name, (steps, tokens) in cases.items():
        config = dict(QWEN_SCHEDULER)
        if name == "qwen_no_terminal":
            config.pop("shift_terminal")
        s = FlowMatchEulerDiscreteScheduler(**config)
        sigmas = np.linspace(1.0, 1 / steps, steps)
        mu = calculate_shift(tokens, s.config.get("base_image_seq_len", 256), s.config.get("max_image_seq_len", 4096),
                             s.config.get("base_shift", 0.5), s.config.get("max_shift", 1.15))
        retrieve_timesteps(s, steps, "cpu", sigmas=sigmas, mu=mu)
        tensors[f"{name}.sigmas"] = s.sigmas.float()
        tensors[f"{name}.timesteps"] = s.timesteps.float()
        meta[name] = {"config": config, "steps": steps, "image_seq_len": tokens, "mu": mu}
    save("qwen_scheduler.safetensors", tensors, meta)


PARTS = ["qwen_scheduler"]
