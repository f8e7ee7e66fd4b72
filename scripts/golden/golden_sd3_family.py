"""Whole SD3-family pipelines with T5, as diffusers' StableDiffusion3Pipeline runs them.

Three tiny random folders, saved by diffusers' save_pretrained, and their images and final latents:
- sd3_t5_tiny: SD3 with its T5 encoder (the text is CLIP's 77 tokens plus max_sequence_length);
- sd35_medium_tiny: SD3.5-medium's shape: dual-attention blocks, RMS qk-norm, patch 2, with and
  without skip-layer guidance;
- sd35_large_tiny: SD3.5-large's shape: an odd head count (3), RMS qk-norm.
Each also runs its first case in bf16 (image_bf16.0, latents_bf16.0).

Needs the t5_tokenizer part first (its tiny SentencePiece model is the T5 tokenizer here).
"""
import json
import os
import shutil

import torch

from make_golden import OUT, perturb_norms, save

PARTS = ["sd3_family_pipelines"]

CASES = {
    "sd3_t5_tiny": [
        dict(prompt="a red circle on a blue background", negative_prompt="", seed=0, steps=3, guidance_scale=5.0,
             width=32, height=32),
        # over-long for T5 at 16 tokens: the warning, and the truncated ids
        dict(prompt=" ".join(["a very long prompt about a small green triangle"] * 4), negative_prompt="blurry",
             seed=42, steps=2, guidance_scale=3.5, width=40, height=24, max_sequence_length=16),
        dict(prompt="no guidance at all, accents: café, naïve", negative_prompt="", seed=7, steps=2,
             guidance_scale=1.0, width=16, height=16),
    ],
    "sd35_medium_tiny": [
        dict(prompt="a blue square over a yellow star", negative_prompt="low quality", seed=3, steps=4,
             guidance_scale=4.5, width=24, height=32),
        # skip-layer guidance on steps 1, 2 and 3 of 6 (strictly inside (0.01, 0.6) x 6)
        dict(prompt="a blue square over a yellow star", negative_prompt="low quality", seed=3, steps=6,
             guidance_scale=4.5, width=24, height=32, skip_guidance_layers=[1], skip_layer_guidance_scale=2.8,
             skip_layer_guidance_start=0.01, skip_layer_guidance_stop=0.6),
    ],
    "sd35_large_tiny": [
        dict(prompt="three green dots", negative_prompt="", seed=11, steps=3, guidance_scale=3.5, width=20,
             height=28, max_sequence_length=64),
        dict(prompt="three green dots", negative_prompt="", seed=11, steps=5, guidance_scale=3.5, width=20,
             height=28, skip_guidance_layers=[0, 2], skip_layer_guidance_start=0.1, skip_layer_guidance_stop=0.9),
    ],
}

TRANSFORMERS = {
    "sd3_t5_tiny": dict(sample_size=32, patch_size=1, in_channels=4, num_layers=2, attention_head_dim=8,
                        num_attention_heads=4, caption_projection_dim=32, joint_attention_dim=32,
                        pooled_projection_dim=64, out_channels=4, pos_embed_max_size=40),
    "sd35_medium_tiny": dict(sample_size=16, patch_size=2, in_channels=4, num_layers=3, attention_head_dim=8,
                             num_attention_heads=4, caption_projection_dim=32, joint_attention_dim=32,
                             pooled_projection_dim=64, out_channels=4, pos_embed_max_size=24, qk_norm="rms_norm",
                             dual_attention_layers=(0, 1)),
    "sd35_large_tiny": dict(sample_size=16, patch_size=2, in_channels=4, num_layers=3, attention_head_dim=8,
                            num_attention_heads=3, caption_projection_dim=24, joint_attention_dim=32,
                            pooled_projection_dim=64, out_channels=4, pos_embed_max_size=24, qk_norm="rms_norm"),
}


def clip_tokenizers(tmp):
    """The tiny CLIP vocabulary of the sd3_tiny golden folder (CLIP's first 1000 merges)."""
    from transformers import CLIPTokenizer

    src = os.path.join(OUT, "sd3_tiny", "tokenizer")
    tokenizer = CLIPTokenizer.from_pretrained(src, model_max_length=77)
    tokenizer_2 = CLIPTokenizer.from_pretrained(os.path.join(OUT, "sd3_tiny", "tokenizer_2"), model_max_length=77)
    return tokenizer, tokenizer_2, len(tokenizer)


def build(name, t5_tokenizer):
    from diffusers import (AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel,
                           StableDiffusion3Pipeline)
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel

    tokenizer, tokenizer_2, vocab_size = clip_tokenizers(None)
    eos = vocab_size - 1
    torch.manual_seed(20 + sorted(TRANSFORMERS).index(name))
    clip = dict(hidden_size=32, intermediate_size=37, num_attention_heads=4, num_hidden_layers=3,
                vocab_size=vocab_size, hidden_act="gelu", projection_dim=32, layer_norm_eps=1e-5,
                bos_token_id=eos - 1)
    text_encoder = CLIPTextModelWithProjection(CLIPTextConfig(eos_token_id=eos, **clip)).eval()
    text_encoder_2 = CLIPTextModelWithProjection(CLIPTextConfig(eos_token_id=2, **clip)).eval()
    t5 = T5EncoderModel(T5Config(vocab_size=len(t5_tokenizer), d_model=32, d_kv=8, d_ff=37, num_layers=2,
                                 num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=20,
                                 feed_forward_proj="gated-gelu", dropout_rate=0.0, is_encoder_decoder=False,
                                 use_cache=False)).eval()
    transformer = SD3Transformer2DModel(**TRANSFORMERS[name]).eval()
    for model in (text_encoder, text_encoder_2, t5, transformer):
        perturb_norms(model)
    vae = AutoencoderKL(sample_size=32, in_channels=3, out_channels=3, block_out_channels=(4,), layers_per_block=1,
                        latent_channels=4, norm_num_groups=1, use_quant_conv=False, use_post_quant_conv=False,
                        shift_factor=0.0609, scaling_factor=1.5035).eval()
    return StableDiffusion3Pipeline(scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=vae,
                                    text_encoder=text_encoder, tokenizer=tokenizer, text_encoder_2=text_encoder_2,
                                    tokenizer_2=tokenizer_2, text_encoder_3=t5, tokenizer_3=t5_tokenizer,
                                    transformer=transformer)


def sd3_family_pipelines():
    from transformers import AutoTokenizer

    t5_dir = os.path.join(OUT, "t5_tokenizer")
    if not os.path.isdir(t5_dir):
        raise SystemExit("run the T5 tokenizer part first: its tiny SentencePiece model is the pipelines' T5 tokenizer")
    t5_tokenizer = AutoTokenizer.from_pretrained(t5_dir)
    for name, cases in CASES.items():
        folder = os.path.join(OUT, name)
        shutil.rmtree(folder, ignore_errors=True)
        pipe = build(name, t5_tokenizer)
        pipe.save_pretrained(folder, safe_serialization=True)
        # transformers 5 saves T5's tokenizer as tokenizer.json alone; folders on the hub also hold
        # the SentencePiece model it was converted from, which dp-launch reads.
        shutil.copy(os.path.join(t5_dir, "spiece.model"), os.path.join(folder, "tokenizer_3", "spiece.model"))
        tensors = {}
        for i, case in enumerate(cases):
            kwargs = {k: v for k, v in case.items() if k not in ("prompt", "negative_prompt", "seed", "steps")}
            kwargs.update(prompt=case["prompt"], negative_prompt=case["negative_prompt"],
                          num_inference_steps=case["steps"])
            for output, key in (("np", "image"), ("latent", "latents")):
                out = pipe(generator=torch.Generator("cpu").manual_seed(case["seed"]), output_type=output,
                           **kwargs).images[0]
                if output == "np":
                    tensors[f"{key}.{i}"] = torch.from_numpy((out * 255).round().astype("uint8"))
                else:
                    tensors[f"{key}.{i}"] = out.float()
        # The first case once more with every component in bf16, as pipe.to(torch.bfloat16) runs it.
        pipe.to(torch.bfloat16)
        case = cases[0]
        kwargs = {k: v for k, v in case.items() if k not in ("prompt", "negative_prompt", "seed", "steps")}
        kwargs.update(prompt=case["prompt"], negative_prompt=case["negative_prompt"], num_inference_steps=case["steps"])
        for output, key in (("np", "image_bf16"), ("latent", "latents_bf16")):
            out = pipe(generator=torch.Generator("cpu").manual_seed(case["seed"]), output_type=output, **kwargs).images[0]
            tensors[f"{key}.0"] = (torch.from_numpy((out * 255).round().astype("uint8")) if output == "np"
                                   else out.float())
        save(f"{name}.safetensors", tensors, {"cases": cases})
        print(f"{folder}: {json.dumps(TRANSFORMERS[name])}")
