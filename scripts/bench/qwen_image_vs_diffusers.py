"""The C++ Qwen-Image pipeline (dp-generate) against diffusers' QwenImagePipeline, same weights,
prompt, seed and settings, fp32 on this machine's CPU, in one run.

Two folders: models/tiny-random-qwen-image as committed, and a "medium" random one saved here with
diffusers' save_pretrained (the real model's shapes scaled down: a transformer of 6 blocks of
8 heads x 64, a Qwen2.5-VL text encoder of 3 layers of width 512, an 8x VAE; 768x768 pixels,
2304 image tokens). Each runs without
true CFG (no negative prompt: one transformer pass a step) and with it (a negative prompt and
true_cfg_scale 4: two passes a step). For each it prints model load time, the median time per
denoising step (the first step, which includes prompt encoding, left out) and peak RSS of each
process, and the C++/diffusers ratios. Each side runs in its own process, RUNS times; the faster
run of each is kept.

    qwen_image_vs_diffusers.py DP_GENERATE [CONFIG ...]     (configs: tiny medium; default both)
"""
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vs_diffusers_common import IMPORTS, STEP_MARKS, TIMINGS, check_names, print_rows, run_json, side_by_side, transformer_params  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TINY = os.path.join(ROOT, "models", "tiny-random-qwen-image")
REAL = os.path.join(ROOT, "models", "qwen-image")

MEDIUM = dict(
    text=dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=4,
              rms_norm_eps=1e-6, max_position_embeddings=4096,
              rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [8, 12, 12]}),
    vision=dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=512, patch_size=2,
                spatial_merge_size=1, temporal_patch_size=1, window_size=4, fullatt_block_indexes=[0], in_channels=1),
    transformer=dict(patch_size=2, in_channels=64, out_channels=16, num_layers=6, attention_head_dim=64,
                     num_attention_heads=8, joint_attention_dim=512, axes_dims_rope=(8, 28, 28)),
    vae=dict(base_dim=16, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=1, attn_scales=[],
             temperal_downsample=[False, True, True]),
)
# name: (folder, or None to build the medium one; image side in pixels)
CONFIGS = {"tiny": (TINY, 64), "medium": (None, 768)}
RUNS = int(os.environ.get("DP_BENCH_RUNS", "2"))
STEPS, SEED, TRUE_CFG = 5, 0, 4.0
PROMPT = "an old lighthouse on a rocky coast at dusk, waves and gulls"
NEGATIVE = "blurry, low quality"

DIFFUSERS_RUN = IMPORTS + r"""
from diffusers import QwenImagePipeline
t1 = time.perf_counter()
pipe = QwenImagePipeline.from_pretrained(sys.argv[1], torch_dtype=torch.float32)
pipe.set_progress_bar_config(disable=True)
t2 = time.perf_counter()
""" + STEP_MARKS + r"""
size, steps, prompt, seed, scale = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), float(sys.argv[6])
negative = sys.argv[7] if len(sys.argv) > 7 else None
start = time.perf_counter()
with torch.no_grad():
    pipe(prompt=prompt, negative_prompt=negative, true_cfg_scale=scale, num_inference_steps=steps, width=size,
         height=size, generator=torch.Generator("cpu").manual_seed(seed), callback_on_step_end=on_step)
end = time.perf_counter()
""" + TIMINGS


def build_medium(folder):
    """Saves the medium random pipeline into folder; returns the transformer's parameter count."""
    import torch
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImagePipeline, QwenImageTransformer2DModel
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2Tokenizer

    tokenizer = Qwen2Tokenizer.from_pretrained(os.path.join(TINY, "tokenizer"))
    torch.manual_seed(0)
    text_encoder = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(
        text_config=dict(MEDIUM["text"], vocab_size=len(tokenizer), bos_token_id=None, eos_token_id=tokenizer.eos_token_id),
        vision_config=MEDIUM["vision"])).eval()
    transformer = QwenImageTransformer2DModel(**MEDIUM["transformer"]).eval()
    vae_config = json.load(open(os.path.join(REAL, "vae", "config.json")))
    vae = AutoencoderKLQwenImage(latents_mean=vae_config["latents_mean"], latents_std=vae_config["latents_std"],
                                 **MEDIUM["vae"]).eval()
    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(os.path.join(REAL, "scheduler"))
    pipe = QwenImagePipeline(scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
                             transformer=transformer)
    pipe.save_pretrained(folder, safe_serialization=True)
    return sum(p.numel() for p in transformer.parameters())








def run_cpp(dp_generate, folder, size, cfg):
    args = [dp_generate, "--model", folder, "--prompt", PROMPT, "--seed", str(SEED), "--steps", str(STEPS),
            "--width", str(size), "--height", str(size), "--true-cfg-scale", str(TRUE_CFG)]
    if cfg:
        args += ["--negative-prompt", NEGATIVE]
    return run_json(args, "dp-generate")


def run_diffusers(folder, size, cfg):
    args = [sys.executable, "-c", DIFFUSERS_RUN, folder, str(size), str(STEPS), PROMPT, str(SEED), str(TRUE_CFG)]
    if cfg:
        args.append(NEGATIVE)
    return run_json(args, "diffusers")


def main():
    dp_generate = sys.argv[1]
    names = sys.argv[2:] or list(CONFIGS)
    check_names(names, CONFIGS)
    tmp = tempfile.mkdtemp(prefix="dp-bench-qwen-")
    print(f"machine: {os.cpu_count()} CPUs; fp32 on CPU; {STEPS} steps; true CFG {TRUE_CFG} with a negative prompt "
          f"(two transformer passes a step), none without; best of {RUNS} runs a side")
    rows = []
    try:
        for name in names:
            folder, size = CONFIGS[name]
            if folder is None:
                folder = os.path.join(tmp, name)
                params = build_medium(folder)
            else:
                params = transformer_params(folder)
            for cfg in (False, True):
                c, r = side_by_side(RUNS, lambda: run_cpp(dp_generate, folder, size, cfg),
                                    lambda: run_diffusers(folder, size, cfg))
                rows.append((name + (" +cfg" if cfg else ""), params, size, c, r))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print_rows(rows, 12)

if __name__ == "__main__":
    main()
