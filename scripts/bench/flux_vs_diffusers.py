"""The C++ FLUX.1 pipeline (dp-generate) against diffusers' FluxPipeline, same weights, prompt, seed
and settings, fp32 on this machine's CPU, in one run.

Three folders: models/tiny-random-flux-dev as committed; a "medium" random FLUX.1-dev saved here with
diffusers' save_pretrained (the real model's shapes scaled down: 4 double- and 8 single-stream
blocks of 8 heads x 64, a T5 encoder of 4 layers of width 512, CLIP of width 256, an 8x VAE; 768x768
pixels, 2304 image tokens, 128 text tokens); and "schnell", the same shapes without the guidance
embedder. dev runs with its distilled guidance only (one transformer pass a step) and with true CFG
(a negative prompt and true_cfg_scale 4: two passes a step). For each it prints model load time, the
median time per denoising step (the first step, which includes prompt encoding, left out) and peak
RSS of each process, and the C++/diffusers ratios. Each side runs in its own process, RUNS times;
the faster run of each is kept.

    flux_vs_diffusers.py DP_GENERATE [CONFIG ...]     (configs: tiny medium schnell; default all)
"""
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vs_diffusers_common import IMPORTS, STEP_MARKS, TIMINGS, best, check_names, print_rows, run_json, transformer_params  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TINY = os.path.join(ROOT, "models", "tiny-random-flux-dev")
REAL = {"dev": os.path.join(ROOT, "models", "flux.1-dev"), "schnell": os.path.join(ROOT, "models", "flux.1-schnell")}

MEDIUM = dict(
    clip=dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
              hidden_act="quick_gelu", max_position_embeddings=77),
    t5=dict(d_model=512, d_kv=64, d_ff=1024, num_layers=4, num_heads=8, feed_forward_proj="gated-gelu",
            relative_attention_num_buckets=32, relative_attention_max_distance=128, is_encoder_decoder=False,
            use_cache=False, dropout_rate=0.0),
    transformer=dict(patch_size=1, in_channels=64, num_layers=4, num_single_layers=8, attention_head_dim=64,
                     num_attention_heads=8, joint_attention_dim=512, pooled_projection_dim=256,
                     axes_dims_rope=(8, 28, 28)),
    vae=dict(in_channels=3, out_channels=3, latent_channels=16, block_out_channels=(32, 32, 64, 64),
             layers_per_block=1, norm_num_groups=8, use_quant_conv=False, use_post_quant_conv=False,
             scaling_factor=0.3611, shift_factor=0.1159, down_block_types=("DownEncoderBlock2D",) * 4,
             up_block_types=("UpDecoderBlock2D",) * 4),
)
# name: (folder, or the variant of a medium one to build; image side in pixels; T5 tokens)
CONFIGS = {"tiny": (TINY, 64, 64), "medium": ("dev", 768, 128), "schnell": ("schnell", 768, 128)}
RUNS = int(os.environ.get("DP_BENCH_RUNS", "2"))
STEPS, SEED, GUIDANCE, TRUE_CFG = 5, 0, 3.5, 4.0
PROMPT = "an old lighthouse on a rocky coast at dusk, waves and gulls"
NEGATIVE = "blurry, low quality"

DIFFUSERS_RUN = IMPORTS + r"""
from diffusers import FluxPipeline
t1 = time.perf_counter()
pipe = FluxPipeline.from_pretrained(sys.argv[1], torch_dtype=torch.float32)
pipe.set_progress_bar_config(disable=True)
t2 = time.perf_counter()
""" + STEP_MARKS + r"""
size, steps, prompt, seed = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
guidance, scale, tokens = float(sys.argv[6]), float(sys.argv[7]), int(sys.argv[8])
negative = sys.argv[9] if len(sys.argv) > 9 else None
start = time.perf_counter()
with torch.no_grad():
    pipe(prompt=prompt, negative_prompt=negative, guidance_scale=guidance, true_cfg_scale=scale,
         num_inference_steps=steps, width=size, height=size, max_sequence_length=tokens,
         generator=torch.Generator("cpu").manual_seed(seed), callback_on_step_end=on_step)
end = time.perf_counter()
""" + TIMINGS


def build_medium(folder, variant):
    """Saves a medium random FLUX.1 (dev or schnell) into folder; returns the transformer's parameters."""
    import torch
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer, T5Config, T5EncoderModel, AutoTokenizer

    tokenizer = CLIPTokenizer.from_pretrained(os.path.join(TINY, "tokenizer"))
    t5_tokenizer = AutoTokenizer.from_pretrained(os.path.join(TINY, "tokenizer_2"))
    torch.manual_seed(0)
    eos = len(tokenizer) - 1
    clip = CLIPTextModel(CLIPTextConfig(vocab_size=len(tokenizer), eos_token_id=eos, bos_token_id=eos - 1,
                                        pad_token_id=eos, **MEDIUM["clip"])).eval()
    t5 = T5EncoderModel(T5Config(vocab_size=len(t5_tokenizer), **MEDIUM["t5"])).eval()
    transformer = FluxTransformer2DModel(guidance_embeds=variant == "dev", **MEDIUM["transformer"]).eval()
    vae = AutoencoderKL(**MEDIUM["vae"]).eval()
    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(os.path.join(REAL[variant], "scheduler"))
    pipe = FluxPipeline(scheduler=scheduler, vae=vae, text_encoder=clip, tokenizer=tokenizer, text_encoder_2=t5,
                        tokenizer_2=t5_tokenizer, transformer=transformer)
    pipe.save_pretrained(folder, safe_serialization=True)
    shutil.copy(os.path.join(TINY, "tokenizer_2", "spiece.model"), os.path.join(folder, "tokenizer_2", "spiece.model"))
    return sum(p.numel() for p in transformer.parameters())








def run_cpp(dp_generate, folder, size, tokens, cfg):
    args = [dp_generate, "--model", folder, "--prompt", PROMPT, "--seed", str(SEED), "--steps", str(STEPS),
            "--width", str(size), "--height", str(size), "--guidance-scale", str(GUIDANCE), "--true-cfg-scale",
            str(TRUE_CFG), "--max-sequence-length", str(tokens)]
    if cfg:
        args += ["--negative-prompt", NEGATIVE]
    return run_json(args, "dp-generate")


def run_diffusers(folder, size, tokens, cfg):
    args = [sys.executable, "-c", DIFFUSERS_RUN, folder, str(size), str(STEPS), PROMPT, str(SEED), str(GUIDANCE),
            str(TRUE_CFG), str(tokens)]
    if cfg:
        args.append(NEGATIVE)
    return run_json(args, "diffusers")


def main():
    dp_generate = sys.argv[1]
    names = sys.argv[2:] or list(CONFIGS)
    check_names(names, CONFIGS)
    tmp = tempfile.mkdtemp(prefix="dp-bench-flux-")
    print(f"machine: {os.cpu_count()} CPUs; fp32 on CPU; {STEPS} steps; guidance {GUIDANCE} (dev's, embedded); "
          f"true CFG {TRUE_CFG} with a negative prompt (two transformer passes a step); best of {RUNS} runs a side")
    rows = []
    try:
        for name in names:
            folder, size, tokens = CONFIGS[name]
            if folder in REAL:
                variant, folder = folder, os.path.join(tmp, name)
                params = build_medium(folder, variant)
            else:
                variant, params = "dev", transformer_params(folder)
            for cfg in ((False, True) if variant == "dev" else (False,)):
                cpp, ref = [], []
                for _ in range(RUNS):
                    cpp.append(run_cpp(dp_generate, folder, size, tokens, cfg))
                    ref.append(run_diffusers(folder, size, tokens, cfg))
                rows.append((name + (" +cfg" if cfg else ""), params, size, best(cpp), best(ref)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print_rows(rows, 15)

if __name__ == "__main__":
    main()
