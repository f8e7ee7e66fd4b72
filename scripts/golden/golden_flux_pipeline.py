"""Tiny random FLUX.1-dev and FLUX.1-schnell pipelines saved with diffusers' save_pretrained
(models/tiny-random-flux-dev, models/tiny-random-flux-schnell) and FluxPipeline's images from them:
dev at guidance 1, 3.5 and 7 (non-square sizes), a batch of two prompts, a prompt cut by a short
max_sequence_length, true CFG with a negative prompt; schnell at 4 steps; dev once in bf16. Also the
pooled output of the dev folder's CLIPTextModel (no projection) for the CLIP encoder's own test.

Needs the t5_tokenizer part first (its tiny SentencePiece model is the T5 tokenizer here).
"""
import os
import shutil

import numpy as np
import torch

from make_golden import OUT, perturb_norms, save

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
FOLDERS = {"dev": os.path.join(ROOT, "models", "tiny-random-flux-dev"),
           "schnell": os.path.join(ROOT, "models", "tiny-random-flux-schnell")}

LONG = "a lighthouse on a rocky coast at dusk with waves and gulls and warm light in every window of the tower"
CASES = [
    # name, variant, prompts, negative_prompt (None: none), guidance_scale, true_cfg_scale, width, height,
    # steps, seeds (one per prompt), max_sequence_length
    ("g1", "dev", ["a red fox in the snow"], None, 1.0, 1.0, 32, 32, 3, [3], 32),
    ("g35", "dev", ["a blue square over a yellow star"], None, 3.5, 1.0, 80, 48, 3, [7], 32),
    ("g7", "dev", ["three green dots"], None, 7.0, 1.0, 32, 64, 2, [11], 32),
    ("batch", "dev", ["a cat", "a bowl of ramen with an egg"], None, 3.5, 1.0, 48, 32, 2, [5, 6], 32),
    ("cut", "dev", [LONG], None, 3.5, 1.0, 32, 32, 2, [9], 16),
    ("true_cfg", "dev", ["an old lighthouse"], "blurry, low quality", 3.5, 3.0, 48, 48, 3, [13], 24),
    ("schnell", "schnell", ["a red fox in the snow"], None, 0.0, 1.0, 48, 32, 4, [17], 256),
]
BF16_CASE = "g35"

SCHEDULERS = {
    # FLUX.1-dev's published scheduler_config.json values, and FLUX.1-schnell's
    "dev": dict(base_image_seq_len=256, base_shift=0.5, max_image_seq_len=4096, max_shift=1.15,
                num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True),
    "schnell": dict(base_image_seq_len=256, base_shift=0.5, max_image_seq_len=4096, max_shift=1.15,
                    num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=False),
}


def tiny_flux_vae():
    """A 16-channel AutoencoderKL of FLUX's layout (4 blocks: 8x down) and scale and shift, 8 channels
    wide (random weights from torch's global generator; the caller perturbs its norms)."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(sample_size=32, in_channels=3, out_channels=3, block_out_channels=(8, 8, 8, 8),
                         layers_per_block=1, latent_channels=16, norm_num_groups=4, use_quant_conv=False,
                         use_post_quant_conv=False, scaling_factor=0.3611, shift_factor=0.1159,
                         down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4).eval()


def _components(variant, t5_tokenizer):
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer, T5Config, T5EncoderModel

    tokenizer = CLIPTokenizer.from_pretrained(os.path.join(ROOT, "models", "tiny-random-sd3", "tokenizer"),
                                              model_max_length=77)
    eos = len(tokenizer) - 1
    torch.manual_seed(60 if variant == "dev" else 61)
    text_encoder = CLIPTextModel(CLIPTextConfig(hidden_size=32, intermediate_size=37, num_attention_heads=4,
                                                num_hidden_layers=2, vocab_size=len(tokenizer), hidden_act="gelu",
                                                projection_dim=32, layer_norm_eps=1e-5, eos_token_id=eos,
                                                bos_token_id=eos - 1, pad_token_id=eos)).eval()
    t5 = T5EncoderModel(T5Config(vocab_size=len(t5_tokenizer), d_model=32, d_kv=8, d_ff=37, num_layers=2,
                                 num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=20,
                                 feed_forward_proj="gated-gelu", dropout_rate=0.0, is_encoder_decoder=False,
                                 use_cache=False)).eval()
    transformer = FluxTransformer2DModel(patch_size=1, in_channels=64, num_layers=2, num_single_layers=2,
                                         attention_head_dim=16, num_attention_heads=4, joint_attention_dim=32,
                                         pooled_projection_dim=32, guidance_embeds=variant == "dev",
                                         axes_dims_rope=(4, 6, 6)).eval()
    vae = tiny_flux_vae()
    for model in (text_encoder, t5, transformer, vae):
        perturb_norms(model)
    with torch.no_grad():
        transformer.proj_out.weight.mul_(4.0)  # noise predictions of a useful size
        transformer.proj_out.bias.mul_(4.0)
    return dict(scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULERS[variant]), vae=vae,
                text_encoder=text_encoder, tokenizer=tokenizer, text_encoder_2=t5, tokenizer_2=t5_tokenizer,
                transformer=transformer)


def _images(pipe, case):
    name, variant, prompts, negative, guidance, true_cfg, width, height, steps, seeds, msl = case
    kwargs = dict(prompt=prompts, negative_prompt=None if negative is None else [negative] * len(prompts),
                  guidance_scale=guidance, true_cfg_scale=true_cfg, width=width, height=height,
                  num_inference_steps=steps, max_sequence_length=msl)
    gens = lambda: [torch.Generator("cpu").manual_seed(s) for s in seeds]  # noqa: E731
    image = pipe(**kwargs, generator=gens(), output_type="np").images
    latents = pipe(**kwargs, generator=gens(), output_type="latent").images
    return [(torch.from_numpy((image[k] * 255).round().astype(np.uint8)), latents[k].float())
            for k in range(len(prompts))]


def _clip_golden(folder, tokenizer):
    """CLIPTextModel's pooler_output (the final-normed end-of-text token, no projection)."""
    from transformers import CLIPTextModel

    model = CLIPTextModel.from_pretrained(os.path.join(folder, "text_encoder")).eval()
    ids = tokenizer(["a red fox in the snow", "", LONG * 3], padding="max_length", max_length=77,
                    truncation=True, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
    save("flux_clip.safetensors", {"input_ids": ids, "pooled": out.pooler_output,
                                   "hidden_skip0": out.hidden_states[-2]}, {"folder": "models/tiny-random-flux-dev"})


def flux_pipeline():
    from diffusers import FluxPipeline
    from transformers import AutoTokenizer

    t5_dir = os.path.join(OUT, "t5_tokenizer")
    if not os.path.isdir(t5_dir):
        raise SystemExit("run the T5 tokenizer part first: its tiny SentencePiece model is the pipelines' T5 tokenizer")
    t5_tokenizer = AutoTokenizer.from_pretrained(t5_dir)
    pipes = {}
    for variant, folder in FOLDERS.items():
        shutil.rmtree(folder, ignore_errors=True)
        FluxPipeline(**_components(variant, t5_tokenizer)).save_pretrained(folder, safe_serialization=True)
        # transformers 5 saves T5's tokenizer as tokenizer.json alone; folders on the hub also hold
        # the SentencePiece model it was converted from, which dp-launch reads.
        shutil.copy(os.path.join(t5_dir, "spiece.model"), os.path.join(folder, "tokenizer_2", "spiece.model"))
        pipes[variant] = FluxPipeline.from_pretrained(folder)  # what the C++ side reads
        pipes[variant].set_progress_bar_config(disable=True)
    _clip_golden(FOLDERS["dev"], pipes["dev"].tokenizer)

    keys = ["name", "variant", "prompts", "negative_prompt", "guidance_scale", "true_cfg_scale", "width", "height",
            "steps", "seeds", "max_sequence_length"]
    tensors, meta = {}, {}
    for case in CASES:
        for k, (image, latents) in enumerate(_images(pipes[case[1]], case)):
            tensors[f"{case[0]}.{k}.image"], tensors[f"{case[0]}.{k}.latents"] = image, latents
        meta[case[0]] = dict(zip(keys, case))
    bf16 = FluxPipeline.from_pretrained(FOLDERS["dev"], torch_dtype=torch.bfloat16)
    bf16.set_progress_bar_config(disable=True)
    case = next(c for c in CASES if c[0] == BF16_CASE)
    (image, latents), = _images(bf16, case)
    tensors["bf16.0.image"], tensors["bf16.0.latents"] = image, latents
    meta["bf16"] = dict(meta[BF16_CASE], name="bf16")
    save("flux_pipeline.safetensors", tensors, meta)


PARTS = ["flux_pipeline"]
