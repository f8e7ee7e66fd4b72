"""A tiny random Qwen-Image pipeline saved with diffusers' save_pretrained (models/tiny-random-qwen-image)
and QwenImagePipeline's images from it: with and without true CFG, at non-square sizes, for prompts
of different lengths, one cut by max_sequence_length, and one case in bf16."""
import os
import tempfile

import numpy as np
import torch

from make_golden import OUT, perturb_norms, save

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
FOLDER = os.path.join(ROOT, "models", "tiny-random-qwen-image")

CASES = [
    # name, prompt, negative_prompt (None: none), true_cfg_scale, width, height, steps, seed, max_sequence_length
    ("plain", "a red fox in the snow", None, 4.0, 48, 32, 4, 3, 512),
    ("cfg", "an old lighthouse on a rocky coast at dusk, waves, gulls, warm light in the windows",
     "blurry, low quality", 4.0, 40, 56, 4, 7, 512),
    ("cfg_empty_negative", "cat", "", 2.5, 32, 32, 3, 11, 512),
    ("cut", "a bowl of ramen with an egg, scallions and steam rising", "ugly", 3.0, 32, 48, 3, 5, 6),
]
BF16_CASE = "cfg"


def _components():
    from diffusers import (AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageTransformer2DModel)
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2Tokenizer

    from golden_qwen_tokenizer import train_qwen2_tokenizer

    tok_dir = tempfile.mkdtemp()
    train_qwen2_tokenizer(tok_dir)
    tokenizer = Qwen2Tokenizer.from_pretrained(tok_dir)
    torch.manual_seed(40)
    text = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=8, num_key_value_heads=4, rms_norm_eps=1e-6, max_position_embeddings=2048,
                rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [1, 1, 2]})
    vision = dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=64, patch_size=2,
                  spatial_merge_size=1, temporal_patch_size=1, window_size=4, fullatt_block_indexes=[0],
                  in_channels=1)
    text_encoder = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(text_config=text, vision_config=vision)).eval()
    perturb_norms(text_encoder)
    with torch.no_grad():
        for layer in text_encoder.model.language_model.layers:
            layer.self_attn.q_proj.weight.mul_(8.0)
            layer.self_attn.k_proj.weight.mul_(8.0)
        text_encoder.model.language_model.norm.weight.mul_(20.0)  # hidden states of a useful size
    torch.manual_seed(41)
    transformer = QwenImageTransformer2DModel(patch_size=2, in_channels=64, out_channels=16, num_layers=2,
                                              attention_head_dim=16, num_attention_heads=2, joint_attention_dim=64,
                                              axes_dims_rope=(4, 6, 6)).eval()
    perturb_norms(transformer)
    with torch.no_grad():
        transformer.proj_out.weight.mul_(20.0)  # noise predictions of a useful size
        transformer.proj_out.bias.mul_(20.0)
    torch.manual_seed(42)
    mean = torch.linspace(-0.5, 0.5, 16).tolist()
    std = torch.linspace(0.8, 1.6, 16).tolist()
    vae = AutoencoderKLQwenImage(base_dim=8, z_dim=16, dim_mult=[1, 2], num_res_blocks=1, attn_scales=[],
                                 temperal_downsample=[True], latents_mean=mean, latents_std=std).eval()
    perturb_norms(vae)
    with torch.no_grad():
        vae.decoder.conv_out.weight.mul_(4.0)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=1.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=0.9,
                                                base_image_seq_len=256, max_image_seq_len=8192, shift_terminal=0.02,
                                                time_shift_type="exponential")
    return dict(scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer)


def _images(pipe, case):
    name, prompt, negative, scale, width, height, steps, seed, msl = case
    kwargs = dict(prompt=prompt, negative_prompt=negative, true_cfg_scale=scale, width=width, height=height,
                  num_inference_steps=steps, max_sequence_length=msl)
    image = pipe(**kwargs, generator=torch.Generator("cpu").manual_seed(seed), output_type="np").images
    latents = pipe(**kwargs, generator=torch.Generator("cpu").manual_seed(seed), output_type="latent").images
    return torch.from_numpy((image[0] * 255).round().astype(np.uint8)), latents[0].float()


def qwen_image_pipeline():
    from diffusers import QwenImagePipeline

    pipe = QwenImagePipeline(**_components())
    pipe.save_pretrained(FOLDER, safe_serialization=True)
    pipe = QwenImagePipeline.from_pretrained(FOLDER)  # what the C++ side reads
    pipe.set_progress_bar_config(disable=True)
    tensors, meta = {}, {}
    for case in CASES:
        tensors[f"{case[0]}.image"], tensors[f"{case[0]}.latents"] = _images(pipe, case)
        meta[case[0]] = dict(zip(["name", "prompt", "negative_prompt", "true_cfg_scale", "width", "height", "steps",
                                  "seed", "max_sequence_length"], case))
    bf16 = QwenImagePipeline.from_pretrained(FOLDER, torch_dtype=torch.bfloat16)
    bf16.set_progress_bar_config(disable=True)
    case = next(c for c in CASES if c[0] == BF16_CASE)
    tensors["bf16.image"], tensors["bf16.latents"] = _images(bf16, case)
    meta["bf16"] = dict(meta[BF16_CASE], name="bf16")
    save("qwen_image_pipeline.safetensors", tensors, meta)


PARTS = ["qwen_image_pipeline"]
