"""The C++ Z-Image pipeline (dp-generate) against diffusers' ZImagePipeline, same weights, prompt,
seed and settings, fp32 on this machine's CPU, in one run.

Two folders: models/tiny-random-z-image as committed, and a "medium" random one saved here with
diffusers' save_pretrained (the real model's shapes scaled down: a transformer of width 512 (8 heads
x 64), 6 main blocks and 2 + 2 refiners, a Qwen3 text encoder of 3 layers of width 512, FLUX's
8x VAE shape at a small width; 768x768 pixels, 2304 image tokens). Each runs as Z-Image-Turbo does
(guidance 0: one transformer pass a step) and guided (guidance 4 with a negative prompt: two
passes a step). For each it prints model load time, the median time per denoising step (the first
step, which includes prompt encoding, left out) and peak RSS of each process, and the C++/diffusers
ratios. Each side runs in its own process, RUNS times; the faster run of each is kept.

    z_image_vs_diffusers.py DP_GENERATE [CONFIG ...]     (configs: tiny medium; default both)
"""
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vs_diffusers_common import IMPORTS, STEP_MARKS, TIMINGS, check_names, print_rows, run_json, side_by_side, transformer_params  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TINY = os.path.join(ROOT, "models", "tiny-random-z-image")

MEDIUM = dict(
    text=dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=4,
              head_dim=64, rms_norm_eps=1e-6, max_position_embeddings=4096,
              rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
    transformer=dict(all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=512, n_layers=6,
                     n_refiner_layers=2, n_heads=8, n_kv_heads=8, cap_feat_dim=512, axes_dims=[16, 24, 24],
                     axes_lens=[1024, 512, 512]),
    vae=dict(in_channels=3, out_channels=3, latent_channels=16, block_out_channels=(32, 32, 64, 64),
             layers_per_block=1, norm_num_groups=8, use_quant_conv=False, use_post_quant_conv=False,
             scaling_factor=0.3611, shift_factor=0.1159, down_block_types=("DownEncoderBlock2D",) * 4,
             up_block_types=("UpDecoderBlock2D",) * 4),
)
# name: (folder, or None to build the medium one; image side in pixels)
CONFIGS = {"tiny": (TINY, 64), "medium": (None, 768)}
RUNS = int(os.environ.get("DP_BENCH_RUNS", "2"))
STEPS, SEED, GUIDANCE = 5, 0, 4.0
PROMPT = "an old lighthouse on a rocky coast at dusk, waves and gulls"
NEGATIVE = "blurry, low quality"

DIFFUSERS_RUN = IMPORTS + r"""
from diffusers import ZImagePipeline
t1 = time.perf_counter()
pipe = ZImagePipeline.from_pretrained(sys.argv[1], torch_dtype=torch.float32)
pipe.set_progress_bar_config(disable=True)
t2 = time.perf_counter()
""" + STEP_MARKS + r"""
size, steps, prompt, seed, scale = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), float(sys.argv[6])
negative = sys.argv[7] if len(sys.argv) > 7 else None
start = time.perf_counter()
with torch.no_grad():
    pipe(prompt=prompt, negative_prompt=negative, guidance_scale=scale, num_inference_steps=steps, width=size,
         height=size, generator=torch.Generator("cpu").manual_seed(seed), callback_on_step_end=on_step)
end = time.perf_counter()
""" + TIMINGS


def build_medium(folder):
    """Saves the medium random pipeline into folder; returns the transformer's parameter count."""
    import torch
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, ZImagePipeline, ZImageTransformer2DModel
    from transformers import Qwen2Tokenizer, Qwen3Config, Qwen3Model

    tokenizer = Qwen2Tokenizer.from_pretrained(os.path.join(TINY, "tokenizer"))
    torch.manual_seed(0)
    text_encoder = Qwen3Model(Qwen3Config(vocab_size=len(tokenizer), **MEDIUM["text"])).eval()
    transformer = ZImageTransformer2DModel(**MEDIUM["transformer"]).eval()
    vae = AutoencoderKL(**MEDIUM["vae"]).eval()
    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(os.path.join(TINY, "scheduler"))
    pipe = ZImagePipeline(scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
                          transformer=transformer)
    pipe.save_pretrained(folder, safe_serialization=True)
    shutil.rmtree(os.path.join(folder, "tokenizer"))  # the chat template's folder as committed
    shutil.copytree(os.path.join(TINY, "tokenizer"), os.path.join(folder, "tokenizer"))
    return sum(p.numel() for p in transformer.parameters())


def run_cpp(dp_generate, folder, size, guided):
    args = [dp_generate, "--model", folder, "--prompt", PROMPT, "--seed", str(SEED), "--steps", str(STEPS),
            "--width", str(size), "--height", str(size), "--guidance-scale", str(GUIDANCE if guided else 0)]
    if guided:
        args += ["--negative-prompt", NEGATIVE]
    return run_json(args, "dp-generate")


def run_diffusers(folder, size, guided):
    args = [sys.executable, "-c", DIFFUSERS_RUN, folder, str(size), str(STEPS), PROMPT, str(SEED),
            str(GUIDANCE if guided else 0)]
    if guided:
        args.append(NEGATIVE)
    return run_json(args, "diffusers")


def main():
    dp_generate = sys.argv[1]
    names = sys.argv[2:] or list(CONFIGS)
    check_names(names, CONFIGS)
    tmp = tempfile.mkdtemp(prefix="dp-bench-z-image-")
    print(f"machine: {os.cpu_count()} CPUs; fp32 on CPU; {STEPS} steps; guidance {GUIDANCE} with a negative prompt "
          f"(two transformer passes a step), 0 without (one); best of {RUNS} runs a side")
    rows = []
    try:
        for name in names:
            folder, size = CONFIGS[name]
            if folder is None:
                folder = os.path.join(tmp, name)
                params = build_medium(folder)
            else:
                params = transformer_params(folder)
            for guided in (False, True):
                c, r = side_by_side(RUNS, lambda: run_cpp(dp_generate, folder, size, guided),
                                    lambda: run_diffusers(folder, size, guided))
                rows.append((name + (" +cfg" if guided else ""), params, size, c, r))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print_rows(rows, 12)


if __name__ == "__main__":
    main()
