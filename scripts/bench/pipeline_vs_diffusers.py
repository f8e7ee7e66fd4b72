"""The C++ SD3 pipeline (dp-generate) against diffusers' StableDiffusion3Pipeline, same weights,
same prompt, seed and settings, fp32 on this machine's CPU, in one run.

For a small and a medium random SD3 config, and the medium one with a T5 encoder (the text is then
CLIP's 77 tokens plus T5's 256), it prints model load time, the median time per
denoising step and peak RSS of each process, and the C++/diffusers ratios. Each side runs in its
own process, twice; the faster run of each is kept.
"""
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vs_diffusers_common import IMPORTS, STEP_MARKS, TIMINGS, best, print_rows, run_json  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOKENIZER = os.path.join(ROOT, "tests", "data", "golden", "clip_tokenizer")
T5_TOKENIZER = os.path.join(ROOT, "tests", "data", "golden", "t5_tokenizer")

CONFIGS = {
    "small": dict(clip=dict(hidden_size=64, intermediate_size=256, num_attention_heads=4, num_hidden_layers=2, projection_dim=64),
                  transformer=dict(sample_size=32, patch_size=2, in_channels=4, num_layers=4, attention_head_dim=32,
                                   num_attention_heads=4, caption_projection_dim=128, joint_attention_dim=128,
                                   pooled_projection_dim=128, out_channels=4, pos_embed_max_size=64),
                  vae=dict(block_out_channels=(32, 64), layers_per_block=1, latent_channels=4, norm_num_groups=32),
                  size=128),
    "medium": dict(clip=dict(hidden_size=256, intermediate_size=1024, num_attention_heads=4, num_hidden_layers=4, projection_dim=256),
                   transformer=dict(sample_size=32, patch_size=2, in_channels=16, num_layers=8, attention_head_dim=64,
                                    num_attention_heads=6, caption_projection_dim=384, joint_attention_dim=512,
                                    pooled_projection_dim=512, out_channels=16, pos_embed_max_size=64),
                   vae=dict(block_out_channels=(64, 128, 128), layers_per_block=1, latent_channels=16, norm_num_groups=32),
                   size=256),
}
CONFIGS["medium+t5"] = dict(CONFIGS["medium"], t5=dict(d_model=512, d_kv=64, num_heads=8, d_ff=1024, num_layers=4))
STEPS, PROMPT, SEED, GUIDANCE = 5, "a small red circle on a blue background", 0, 5.0

DIFFUSERS_RUN = IMPORTS + r"""
from diffusers import StableDiffusion3Pipeline
t1 = time.perf_counter()
no_t5 = {} if sys.argv[7] == "t5" else dict(text_encoder_3=None, tokenizer_3=None)
pipe = StableDiffusion3Pipeline.from_pretrained(sys.argv[1], torch_dtype=torch.float32, image_encoder=None,
                                                feature_extractor=None, **no_t5)
t2 = time.perf_counter()
""" + STEP_MARKS + r"""
size, steps, prompt, seed, guidance = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), float(sys.argv[6])
start = time.perf_counter()
with torch.no_grad():
    pipe(prompt=prompt, num_inference_steps=steps, guidance_scale=guidance, width=size, height=size,
         generator=torch.Generator("cpu").manual_seed(seed), callback_on_step_end=on_step)
end = time.perf_counter()
""" + TIMINGS


def build_model(name, cfg, folder):
    import torch
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
    from transformers import AutoTokenizer, CLIPTextConfig, CLIPTextModelWithProjection, CLIPTokenizer, T5Config, T5EncoderModel

    torch.manual_seed(0)
    vocab = len(json.load(open(os.path.join(TOKENIZER, "vocab.json"), encoding="utf-8")))
    enc = lambda: CLIPTextModelWithProjection(CLIPTextConfig(vocab_size=vocab, eos_token_id=vocab - 1, bos_token_id=vocab - 2,
                                                             hidden_act="quick_gelu", **cfg["clip"])).eval()
    pipe = StableDiffusion3Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * len(cfg["vae"]["block_out_channels"]),
                          up_block_types=("UpDecoderBlock2D",) * len(cfg["vae"]["block_out_channels"]),
                          use_quant_conv=False, use_post_quant_conv=False, shift_factor=0.0609, scaling_factor=1.5305, **cfg["vae"]).eval(),
        text_encoder=enc(), tokenizer=CLIPTokenizer.from_pretrained(TOKENIZER),
        text_encoder_2=enc(), tokenizer_2=CLIPTokenizer.from_pretrained(TOKENIZER, pad_token="!"),
        text_encoder_3=None, tokenizer_3=None, transformer=SD3Transformer2DModel(**cfg["transformer"]).eval())
    if "t5" in cfg:
        tokenizer_3 = AutoTokenizer.from_pretrained(T5_TOKENIZER)
        pipe.register_modules(tokenizer_3=tokenizer_3, text_encoder_3=T5EncoderModel(
            T5Config(vocab_size=len(tokenizer_3), feed_forward_proj="gated-gelu", **cfg["t5"])).eval())
    pipe.save_pretrained(folder, safe_serialization=True)
    params = sum(p.numel() for p in pipe.transformer.parameters())
    return params


def main():
    dp_generate = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="dp-bench-")
    print(f"machine: {os.cpu_count()} CPUs; fp32 on CPU; {STEPS} steps, guidance {GUIDANCE} (batch 2 through the transformer)")
    rows = []
    try:
        for name, cfg in CONFIGS.items():
            folder = os.path.join(tmp, name)
            params = build_model(name, cfg, folder)
            size = cfg["size"]
            cpp, ref = [], []
            for _ in range(2):
                cpp.append(run_json([dp_generate, "--model", folder, "--prompt", PROMPT, "--seed", str(SEED), "--steps",
                                     str(STEPS), "--guidance-scale", str(GUIDANCE), "--width", str(size), "--height",
                                     str(size)], "dp-generate"))
                ref.append(run_json([sys.executable, "-c", DIFFUSERS_RUN, folder, str(size), str(STEPS), PROMPT, str(SEED),
                                     str(GUIDANCE), "t5" if "t5" in cfg else "no-t5"], "diffusers"))
            rows.append((name, params, size, best(cpp), best(ref)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print_rows(rows, name_width=8)


if __name__ == "__main__":
    main()
