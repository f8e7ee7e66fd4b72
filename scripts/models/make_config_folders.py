"""Writes the config-only folders of real models: models/sd3-medium, models/sd3.5-medium,
models/sd3.5-large, models/qwen-image, models/qwen-image-edit, models/qwen-image-edit-2509,
models/flux.1-dev, models/flux.1-schnell, models/z-image-turbo and models/flux2-dev, as diffusers lays
out stabilityai/stable-diffusion-3-medium-diffusers, stable-diffusion-3.5-medium,
stable-diffusion-3.5-large, Qwen/Qwen-Image, Qwen/Qwen-Image-Edit, Qwen/Qwen-Image-Edit-2509,
black-forest-labs/FLUX.1-dev and FLUX.1-schnell, Tongyi-MAI/Z-Image-Turbo and
black-forest-labs/FLUX.2-dev, without their weights. The two Qwen-Image-Edit
folders hold Qwen-Image's components as links to models/qwen-image (the same configs and tensors:
its text encoder's manifest lists the vision tower the edit pipelines run) and their own processor/.

Every component gets its config.json with the checkpoint's values, and a tensor manifest,
<component>/tensors.json: each tensor's name, shape and dtype, in the layout of a safetensors
header (without data offsets). The manifest comes from instantiating the component's class from
that config on torch's meta device, so that it names exactly the tensors the published files hold
(tied weights once, non-persistent buffers not at all) without a byte of weights. `dp-launch plan`
counts from the manifests; `--random-weights` runs build the real shapes.

Tokenizer vocabularies are not available offline: tokenizer/ and tokenizer_2/ carry the small CLIP
BPE of models/tiny-random-sd3, tokenizer_3/ the small SentencePiece vocabulary of
tests/data/golden/t5_tokenizer (FLUX's tokenizer_2/ too), and Qwen-Image's tokenizer/ the small byte-level BPE of
tests/data/golden/qwen2_tokenizer (Qwen2's pre-tokenizer and special tokens, a small vocabulary), and
Z-Image-Turbo's the same BPE with Qwen3's added tokens and chat template (tests/data/golden/qwen3_tokenizer),
FLUX.2-dev's the PixtralProcessor folder of models/tiny-random-flux2-dev (a small tekken-style BPE
with Mistral's special tokens and chat template, scripts/golden/golden_mistral3.py).
Their ids are not the real model's (models/README.md).

Run:   ~/.cache/dp-launch/venv/bin/python scripts/models/make_config_folders.py
Check: ... make_config_folders.py --check   (exit 1 when a committed file differs from what the
                                             configs here give: a stale manifest, say)
"""
import json
import os
import sys

import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
MODELS = os.path.join(ROOT, "models")
TINY = os.path.join(MODELS, "tiny-random-sd3")
# The small T5 SentencePiece vocabulary the T5 tokenizer's tests use (256 pieces).
T5_TOKENIZER_DIR = os.path.join(ROOT, "tests", "data", "golden", "t5_tokenizer")

# --- the checkpoints' values --------------------------------------------------------------------

# openai/clip-vit-large-patch14's text tower with its projection (SD3's text_encoder).
CLIP_L = dict(vocab_size=49408, hidden_size=768, intermediate_size=3072, projection_dim=768,
              num_hidden_layers=12, num_attention_heads=12, max_position_embeddings=77,
              hidden_act="quick_gelu", layer_norm_eps=1e-5, attention_dropout=0.0, dropout=0.0,
              initializer_range=0.02, initializer_factor=1.0, pad_token_id=1, bos_token_id=0,
              eos_token_id=2)
# laion/CLIP-ViT-bigG-14's text tower with its projection (SD3's text_encoder_2).
CLIP_G = dict(CLIP_L, hidden_size=1280, intermediate_size=5120, projection_dim=1280,
              num_hidden_layers=32, num_attention_heads=20, hidden_act="gelu")
# google/t5-v1_1-xxl's encoder (SD3's text_encoder_3).
T5_XXL = dict(vocab_size=32128, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_decoder_layers=24,
              num_heads=64, relative_attention_num_buckets=32, relative_attention_max_distance=128,
              dropout_rate=0.1, layer_norm_epsilon=1e-6, initializer_factor=1.0,
              feed_forward_proj="gated-gelu", is_encoder_decoder=True, use_cache=True,
              pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, tie_word_embeddings=False)
# SD3's 16-channel VAE (the same in all three).
VAE = dict(in_channels=3, out_channels=3, latent_channels=16, block_out_channels=[128, 256, 512, 512],
           down_block_types=["DownEncoderBlock2D"] * 4, up_block_types=["UpDecoderBlock2D"] * 4,
           layers_per_block=2, act_fn="silu", norm_num_groups=32, sample_size=1024,
           scaling_factor=1.5305, shift_factor=0.0609, latents_mean=None, latents_std=None,
           force_upcast=True, use_quant_conv=False, use_post_quant_conv=False)
SCHEDULER = dict(num_train_timesteps=1000, shift=3.0)

TRANSFORMER_BASE = dict(sample_size=128, patch_size=2, in_channels=16, out_channels=16,
                        attention_head_dim=64, joint_attention_dim=4096, pooled_projection_dim=2048)
FOLDERS = {
    "sd3-medium": dict(
        transformer=dict(TRANSFORMER_BASE, num_layers=24, num_attention_heads=24,
                         caption_projection_dim=1536, pos_embed_max_size=192),
        transformer_dtype="F16", extra_index={}),
    "sd3.5-medium": dict(
        transformer=dict(TRANSFORMER_BASE, num_layers=24, num_attention_heads=24,
                         caption_projection_dim=1536, pos_embed_max_size=384, qk_norm="rms_norm",
                         dual_attention_layers=list(range(13))),
        transformer_dtype="BF16", extra_index={"image_encoder": [None, None], "feature_extractor": [None, None]}),
    "sd3.5-large": dict(
        transformer=dict(TRANSFORMER_BASE, num_layers=38, num_attention_heads=38,
                         caption_projection_dim=2432, pos_embed_max_size=192, qk_norm="rms_norm"),
        transformer_dtype="BF16", extra_index={"image_encoder": [None, None], "feature_extractor": [None, None]}),
}
# The dtype the published files store, as recorded in the manifests (dp-launch plan counts at the
# run's dtype; this is for the reader).
TEXT_DTYPE, VAE_DTYPE = "F16", "F16"

CLIP_TOKENIZER = dict(add_prefix_space=False, bos_token="<|startoftext|>", clean_up_tokenization_spaces=True,
                      do_lower_case=True, eos_token="<|endoftext|>", errors="replace", model_max_length=77,
                      pad_token="<|endoftext|>", tokenizer_class="CLIPTokenizer", unk_token="<|endoftext|>")
T5_TOKENIZER = dict(add_prefix_space=True, additional_special_tokens=[f"<extra_id_{i}>" for i in range(100)],
                    clean_up_tokenization_spaces=True, eos_token="</s>", extra_ids=100, legacy=True,
                    model_max_length=512, pad_token="<pad>", sp_model_kwargs={}, tokenizer_class="T5Tokenizer",
                    unk_token="<unk>")

# Qwen/Qwen-Image: its text encoder is Qwen2.5-VL-7B-Instruct (the language model is what runs),
# its transformer 60 dual-stream blocks of width 3072, its VAE Wan 2.1's 16-channel one.
QWEN_TEXT = dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                 num_attention_heads=28, num_key_value_heads=4, hidden_act="silu", max_position_embeddings=128000,
                 rms_norm_eps=1e-6, rope_theta=1000000.0, rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]},
                 tie_word_embeddings=False, use_sliding_window=False, sliding_window=32768, max_window_layers=28,
                 attention_dropout=0.0, bos_token_id=151643, eos_token_id=151645)
QWEN_VISION = dict(depth=32, hidden_size=1280, hidden_act="silu", intermediate_size=3420, num_heads=16, in_chans=3,
                   out_hidden_size=3584, patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                   fullatt_block_indexes=[7, 15, 23, 31], tokens_per_second=2)
QWEN_TRANSFORMER = dict(patch_size=2, in_channels=64, out_channels=16, num_layers=60, attention_head_dim=128,
                        num_attention_heads=24, joint_attention_dim=3584, guidance_embeds=False,
                        axes_dims_rope=(16, 56, 56))
QWEN_VAE = dict(base_dim=96, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
                temperal_downsample=[False, True, True], dropout=0.0,
                latents_mean=[-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508, 0.4134, -0.0715,
                              0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921],
                latents_std=[2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743, 3.2687, 2.1526, 2.8652,
                             1.5579, 1.6382, 1.1253, 2.8251, 1.916])
QWEN_SCHEDULER = dict(num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=0.9,
                      base_image_seq_len=256, max_image_seq_len=8192, shift_terminal=0.02,
                      time_shift_type="exponential")
QWEN_TOKENIZER_DIR = os.path.join(ROOT, "tests", "data", "golden", "qwen2_tokenizer")
QWEN_INDEX = {"_class_name": "QwenImagePipeline", "_diffusers_version": "0.42.1",
              "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
              "text_encoder": ["transformers", "Qwen2_5_VLForConditionalGeneration"],
              "tokenizer": ["transformers", "Qwen2Tokenizer"],
              "transformer": ["diffusers", "QwenImageTransformer2DModel"],
              "vae": ["diffusers", "AutoencoderKLQwenImage"]}
# Qwen/Qwen-Image-Edit (QwenImageEditPipeline) and Qwen-Image-Edit-2509 (QwenImageEditPlusPipeline):
# Qwen-Image's components and a Qwen2VLProcessor with Qwen2.5-VL-7B-Instruct's image processor.
QWEN_EDIT = {"qwen-image-edit": "QwenImageEditPipeline", "qwen-image-edit-2509": "QwenImageEditPlusPipeline"}
QWEN_PREPROCESSOR = dict(min_pixels=3136, max_pixels=12845056, patch_size=14, temporal_patch_size=2, merge_size=2,
                         image_mean=[0.48145466, 0.4578275, 0.40821073],
                         image_std=[0.26862954, 0.26130258, 0.27577711],
                         image_processor_type="Qwen2VLImageProcessor", processor_class="Qwen2VLProcessor")

# black-forest-labs/FLUX.1-dev and FLUX.1-schnell: CLIP-L's text tower without its projection, T5
# v1.1 XXL's encoder, 19 double- and 38 single-stream blocks of width 3072 (dev with the guidance
# embedder), SD3's VAE layout with FLUX's scale and shift. Their schedulers differ: dev shifts by
# the image's size, schnell not at all.
FLUX_TRANSFORMER = dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
                        num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768,
                        axes_dims_rope=(16, 56, 56))
FLUX_VAE = dict(VAE, scaling_factor=0.3611, shift_factor=0.1159)
FLUX_SCHEDULERS = {
    "flux.1-dev": dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5,
                       max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096),
    "flux.1-schnell": dict(num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=False),
}

# Tongyi-MAI/Z-Image-Turbo: Qwen3-4B as its text encoder (a Qwen3Model: the pipeline reads
# hidden_states[-2]), ZImageTransformer2DModel's defaults but for axes_lens (the release's first
# axis is 1536 long, diffusers' default 1024), FLUX.1's VAE, and a scheduler shifted by 3 without
# dynamic shifting.
ZIMAGE_TEXT = dict(vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                   num_attention_heads=32, num_key_value_heads=8, head_dim=128, hidden_act="silu",
                   max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0, attention_bias=False,
                   attention_dropout=0.0, tie_word_embeddings=True, use_sliding_window=False, sliding_window=None,
                   max_window_layers=36, bos_token_id=151643, eos_token_id=151645)
ZIMAGE_TRANSFORMER = dict(all_patch_size=[2], all_f_patch_size=[1], in_channels=16, dim=3840, n_layers=30,
                          n_refiner_layers=2, n_heads=30, n_kv_heads=30, norm_eps=1e-5, qk_norm=True,
                          cap_feat_dim=2560, rope_theta=256.0, t_scale=1000.0, axes_dims=[32, 48, 48],
                          axes_lens=[1536, 512, 512])
ZIMAGE_SCHEDULER = dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False)
QWEN3_TOKENIZER_DIR = os.path.join(ROOT, "tests", "data", "golden", "qwen3_tokenizer")

# black-forest-labs/FLUX.2-dev: Flux2Transformer2DModel's defaults, which are the release's (8 double-
# and 48 single-stream blocks of 48 heads of 128, text width 3 x 5120, guidance embedder: 32 B
# parameters); Mistral3ForConditionalGeneration with Mistral-Small-3.x-24B's text model (Mistral3Config's
# defaults, documented by transformers as Mistral-Small-3.1-24B-Instruct-2503's: 40 layers of
# width 5120, 32 heads of 128 over 8 key-value heads, rope_theta 1e9, no sliding window, lm_head
# untied) and Pixtral vision tower (24 layers of width 1024, patch 14); AutoencoderKLFlux2 (32
# latent channels, batch-norm statistics over the patchified latents); FLUX.2's scheduler. The
# pipeline reads hidden_states 10, 20 and 30 of the 40 layers.
FLUX2_TRANSFORMER = dict(patch_size=1, in_channels=128, out_channels=None, num_layers=8, num_single_layers=48,
                         attention_head_dim=128, num_attention_heads=48, joint_attention_dim=15360,
                         timestep_guidance_channels=256, mlp_ratio=3.0, axes_dims_rope=(32, 32, 32, 32),
                         rope_theta=2000, eps=1e-6, guidance_embeds=True)
MISTRAL_SMALL_TEXT = dict(vocab_size=131072, hidden_size=5120, intermediate_size=32768, num_hidden_layers=40,
                          num_attention_heads=32, num_key_value_heads=8, head_dim=128, hidden_act="silu",
                          max_position_embeddings=131072, rms_norm_eps=1e-5,
                          rope_parameters={"rope_type": "default", "rope_theta": 1e9}, sliding_window=None,
                          attention_dropout=0.0, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
PIXTRAL_VISION = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                      num_channels=3, image_size=1540, patch_size=14, hidden_act="gelu",
                      rope_parameters={"rope_type": "axial", "rope_theta": 10000.0})
FLUX2_VAE = dict(in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 4,
                 up_block_types=["UpDecoderBlock2D"] * 4, block_out_channels=[128, 256, 512, 512],
                 layers_per_block=2, act_fn="silu", latent_channels=32, norm_num_groups=32, sample_size=1024,
                 use_quant_conv=True, use_post_quant_conv=True, mid_block_add_attention=True, batch_norm_eps=1e-4,
                 batch_norm_momentum=0.1, patch_size=[2, 2])
FLUX2_SCHEDULER = dict(base_image_seq_len=256, base_shift=0.5, invert_sigmas=False, max_image_seq_len=4096,
                       max_shift=1.15, num_train_timesteps=1000, shift=3.0, shift_terminal=None,
                       stochastic_sampling=False, time_shift_type="exponential", use_beta_sigmas=False,
                       use_dynamic_shifting=True, use_exponential_sigmas=False, use_karras_sigmas=False)
FLUX2_TOKENIZER_DIR = os.path.join(MODELS, "tiny-random-flux2-dev", "tokenizer")

# --- writing ------------------------------------------------------------------------------------

DTYPE_NAMES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}


def json_text(obj):
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def manifest_text(model, dtype, cls):
    """The model's persistent tensors, each once (a tied weight under its first name), as a
    safetensors header without data offsets: one tensor per line."""
    seen, lines = set(), []
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) in seen:
            continue
        seen.add(id(t))
        lines.append(json.dumps(name) + ": " + json.dumps({"dtype": dtype, "shape": list(t.shape)}))
    meta = {"class": cls, "format": "tensor manifest: names, shapes and dtypes of the published weights",
            "made_by": "scripts/models/make_config_folders.py"}
    return "{\n" + json.dumps("__metadata__") + ": " + json.dumps(meta, sort_keys=True) + ",\n" + \
        ",\n".join(lines) + "\n}\n"


def folder_copy(src, rel):
    """rel/NAME -> bytes of every file NAME of the folder src."""
    files = {}
    for name in sorted(os.listdir(src)):
        with open(os.path.join(src, name), "rb") as f:
            files[f"{rel}/{name}"] = f.read()
    return files


def transformers_component(cfg_cls, model_cls, values, dtype):
    config = cfg_cls(**values)
    config.architectures = [model_cls.__name__]
    with torch.device("meta"):
        model = model_cls(config)
    d = config.to_dict()
    d.update(values)  # as the checkpoint says, where the class adjusts its own copy (T5's encoder-only flags)
    d["dtype"] = {"F16": "float16", "BF16": "bfloat16", "F32": "float32"}[dtype]
    return json_text(d), manifest_text(model, dtype, model_cls.__name__)


def diffusers_component(model_cls, values, dtype):
    with torch.device("meta"):
        model = model_cls(**values)
    return json_text(json.loads(model.to_json_string())), manifest_text(model, dtype, model_cls.__name__)


def folder_files(name, spec):
    """Relative path -> bytes of every file of one folder."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel

    files = {}
    index = {"_class_name": "StableDiffusion3Pipeline", "_diffusers_version": "0.42.1",
             "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
             "text_encoder": ["transformers", "CLIPTextModelWithProjection"],
             "text_encoder_2": ["transformers", "CLIPTextModelWithProjection"],
             "text_encoder_3": ["transformers", "T5EncoderModel"],
             "tokenizer": ["transformers", "CLIPTokenizer"], "tokenizer_2": ["transformers", "CLIPTokenizer"],
             "tokenizer_3": ["transformers", "T5TokenizerFast"],
             "transformer": ["diffusers", "SD3Transformer2DModel"], "vae": ["diffusers", "AutoencoderKL"]}
    index.update(spec["extra_index"])
    files["model_index.json"] = json_text(index)
    files["scheduler/scheduler_config.json"] = json_text(
        json.loads(FlowMatchEulerDiscreteScheduler(**SCHEDULER).to_json_string()))
    for comp, cfg_cls, model_cls, values in (
            ("text_encoder", CLIPTextConfig, CLIPTextModelWithProjection, CLIP_L),
            ("text_encoder_2", CLIPTextConfig, CLIPTextModelWithProjection, CLIP_G),
            ("text_encoder_3", T5Config, T5EncoderModel, T5_XXL)):
        files[f"{comp}/config.json"], files[f"{comp}/tensors.json"] = transformers_component(
            cfg_cls, model_cls, values, TEXT_DTYPE)
    files["transformer/config.json"], files["transformer/tensors.json"] = diffusers_component(
        SD3Transformer2DModel, spec["transformer"], spec["transformer_dtype"])
    files["vae/config.json"], files["vae/tensors.json"] = diffusers_component(AutoencoderKL, VAE, VAE_DTYPE)
    for tok, pad in (("tokenizer", "<|endoftext|>"), ("tokenizer_2", "!")):
        with open(os.path.join(TINY, tok, "tokenizer.json"), "rb") as f:
            files[f"{tok}/tokenizer.json"] = f.read()
        files[f"{tok}/tokenizer_config.json"] = json_text(dict(CLIP_TOKENIZER, pad_token=pad))
    for f in ("spiece.model", "tokenizer.json"):
        with open(os.path.join(T5_TOKENIZER_DIR, f), "rb") as src:
            files[f"tokenizer_3/{f}"] = src.read()
    files["tokenizer_3/tokenizer_config.json"] = json_text(T5_TOKENIZER)
    return {k: v.encode() if isinstance(v, str) else v for k, v in files.items()}


def qwen_image_files():
    """Relative path -> bytes of every file of models/qwen-image."""
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageTransformer2DModel
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    files = {"model_index.json": json_text(QWEN_INDEX)}
    files["scheduler/scheduler_config.json"] = json_text(
        json.loads(FlowMatchEulerDiscreteScheduler(**QWEN_SCHEDULER).to_json_string()))
    config = Qwen2_5_VLConfig(text_config=QWEN_TEXT, vision_config=QWEN_VISION, image_token_id=151655,
                              video_token_id=151656, vision_start_token_id=151652, vision_end_token_id=151653)
    config.architectures = ["Qwen2_5_VLForConditionalGeneration"]
    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration(config)
    d = config.to_dict()
    d["dtype"] = "bfloat16"
    files["text_encoder/config.json"] = json_text(d)
    # The names the published files use (model.layers.N..., visual..., lm_head), which
    # save_pretrained writes back from the module's own (model.language_model...).
    manifest = manifest_text(model, "BF16", "Qwen2_5_VLForConditionalGeneration")
    manifest = manifest.replace('"model.language_model.', '"model.').replace('"model.visual.', '"visual.')
    files["text_encoder/tensors.json"] = manifest
    files["transformer/config.json"], files["transformer/tensors.json"] = diffusers_component(
        QwenImageTransformer2DModel, QWEN_TRANSFORMER, "BF16")
    files["vae/config.json"], files["vae/tensors.json"] = diffusers_component(AutoencoderKLQwenImage, QWEN_VAE, "BF16")
    files.update(folder_copy(QWEN_TOKENIZER_DIR, "tokenizer"))
    return {k: v.encode() if isinstance(v, str) else v for k, v in files.items()}


def qwen_image_edit_files(name):
    """Relative path -> bytes of the files of models/qwen-image-edit or models/qwen-image-edit-2509
    (qwen_image_edit_links gives the rest)."""
    index = dict(QWEN_INDEX, _class_name=QWEN_EDIT[name], processor=["transformers", "Qwen2VLProcessor"])
    files = {"model_index.json": json_text(index), "processor/preprocessor_config.json": json_text(QWEN_PREPROCESSOR)}
    return {k: v.encode() for k, v in files.items()}


def qwen_image_edit_links():
    """Relative path -> link target: Qwen-Image's components, and the processor's tokenizer files."""
    links = {c: os.path.join("..", "qwen-image", c) for c in ("scheduler", "text_encoder", "tokenizer", "transformer",
                                                              "vae")}
    for f in sorted(os.listdir(QWEN_TOKENIZER_DIR)):
        links[f"processor/{f}"] = os.path.join("..", "tokenizer", f)
    return links


def flux_files(name):
    """Relative path -> bytes of every file of models/flux.1-dev or models/flux.1-schnell."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    files = {"model_index.json": json_text(
        {"_class_name": "FluxPipeline", "_diffusers_version": "0.42.1",
         "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
         "text_encoder": ["transformers", "CLIPTextModel"], "text_encoder_2": ["transformers", "T5EncoderModel"],
         "tokenizer": ["transformers", "CLIPTokenizer"], "tokenizer_2": ["transformers", "T5TokenizerFast"],
         "transformer": ["diffusers", "FluxTransformer2DModel"], "vae": ["diffusers", "AutoencoderKL"],
         "image_encoder": [None, None], "feature_extractor": [None, None]})}
    files["scheduler/scheduler_config.json"] = json_text(
        json.loads(FlowMatchEulerDiscreteScheduler(**FLUX_SCHEDULERS[name]).to_json_string()))
    files["text_encoder/config.json"], files["text_encoder/tensors.json"] = transformers_component(
        CLIPTextConfig, CLIPTextModel, {k: v for k, v in CLIP_L.items() if k != "projection_dim"}, "BF16")
    files["text_encoder_2/config.json"], files["text_encoder_2/tensors.json"] = transformers_component(
        T5Config, T5EncoderModel, T5_XXL, "BF16")
    transformer = dict(FLUX_TRANSFORMER, guidance_embeds=name == "flux.1-dev")
    files["transformer/config.json"], files["transformer/tensors.json"] = diffusers_component(
        FluxTransformer2DModel, transformer, "BF16")
    files["vae/config.json"], files["vae/tensors.json"] = diffusers_component(AutoencoderKL, FLUX_VAE, "BF16")
    with open(os.path.join(TINY, "tokenizer", "tokenizer.json"), "rb") as f:
        files["tokenizer/tokenizer.json"] = f.read()
    files["tokenizer/tokenizer_config.json"] = json_text(CLIP_TOKENIZER)
    for f in ("spiece.model", "tokenizer.json"):
        with open(os.path.join(T5_TOKENIZER_DIR, f), "rb") as src:
            files[f"tokenizer_2/{f}"] = src.read()
    files["tokenizer_2/tokenizer_config.json"] = json_text(T5_TOKENIZER)
    return {k: v.encode() if isinstance(v, str) else v for k, v in files.items()}


def z_image_files():
    """Relative path -> bytes of every file of models/z-image-turbo."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, ZImageTransformer2DModel
    from transformers import Qwen3Config, Qwen3Model

    files = {"model_index.json": json_text(
        {"_class_name": "ZImagePipeline", "_diffusers_version": "0.42.1",
         "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"], "text_encoder": ["transformers", "Qwen3Model"],
         "tokenizer": ["transformers", "Qwen2Tokenizer"], "transformer": ["diffusers", "ZImageTransformer2DModel"],
         "vae": ["diffusers", "AutoencoderKL"]})}
    files["scheduler/scheduler_config.json"] = json_text(
        json.loads(FlowMatchEulerDiscreteScheduler(**ZIMAGE_SCHEDULER).to_json_string()))
    files["text_encoder/config.json"], files["text_encoder/tensors.json"] = transformers_component(
        Qwen3Config, Qwen3Model, ZIMAGE_TEXT, "BF16")
    files["transformer/config.json"], files["transformer/tensors.json"] = diffusers_component(
        ZImageTransformer2DModel, ZIMAGE_TRANSFORMER, "BF16")
    files["vae/config.json"], files["vae/tensors.json"] = diffusers_component(AutoencoderKL, FLUX_VAE, "BF16")
    files.update(folder_copy(QWEN3_TOKENIZER_DIR, "tokenizer"))
    return {k: v.encode() if isinstance(v, str) else v for k, v in files.items()}


def flux2_dev_files():
    """Relative path -> bytes of every file of models/flux2-dev."""
    from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2Transformer2DModel
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    files = {"model_index.json": json_text(
        {"_class_name": "Flux2Pipeline", "_diffusers_version": "0.42.1",
         "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
         "text_encoder": ["transformers", "Mistral3ForConditionalGeneration"],
         "tokenizer": ["transformers", "PixtralProcessor"], "transformer": ["diffusers", "Flux2Transformer2DModel"],
         "vae": ["diffusers", "AutoencoderKLFlux2"]})}
    files["scheduler/scheduler_config.json"] = json_text(
        json.loads(FlowMatchEulerDiscreteScheduler(**FLUX2_SCHEDULER).to_json_string()))
    config = Mistral3Config(text_config=MISTRAL_SMALL_TEXT, vision_config=PIXTRAL_VISION, image_token_index=10,
                            spatial_merge_size=2, projector_hidden_act="gelu", multimodal_projector_bias=False,
                            vision_feature_layer=-1, tie_word_embeddings=False)
    config.architectures = ["Mistral3ForConditionalGeneration"]
    with torch.device("meta"):
        model = Mistral3ForConditionalGeneration(config)
    d = config.to_dict()
    d["dtype"] = "bfloat16"
    files["text_encoder/config.json"] = json_text(d)
    # The names save_pretrained writes (transformers 4's layout, which 5 keeps on disk).
    manifest = manifest_text(model, "BF16", "Mistral3ForConditionalGeneration")
    for module_name, file_name in (('"model.language_model.', '"language_model.model.'),
                                   ('"lm_head.', '"language_model.lm_head.'),
                                   ('"model.vision_tower.', '"vision_tower.'),
                                   ('"model.multi_modal_projector.', '"multi_modal_projector.')):
        manifest = manifest.replace(module_name, file_name)
    files["text_encoder/tensors.json"] = manifest
    files["transformer/config.json"], files["transformer/tensors.json"] = diffusers_component(
        Flux2Transformer2DModel, FLUX2_TRANSFORMER, "BF16")
    files["vae/config.json"], files["vae/tensors.json"] = diffusers_component(AutoencoderKLFlux2, FLUX2_VAE, "BF16")
    files.update(folder_copy(FLUX2_TOKENIZER_DIR, "tokenizer"))
    return {k: v.encode() if isinstance(v, str) else v for k, v in files.items()}


def write_links(folder, links, check):
    """Makes each link (path relative to folder -> target); with check, the paths that are not that link."""
    stale = []
    for rel, target in sorted(links.items()):
        path = os.path.join(folder, rel)
        if check:
            if not os.path.islink(path) or os.readlink(path) != target:
                stale.append(path)
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.lexists(path):
            os.remove(path)
        os.symlink(target, path)
    return stale


def main():
    check = "--check" in sys.argv[1:]
    stale = []
    makers = [(name, lambda spec=spec, name=name: folder_files(name, spec)) for name, spec in FOLDERS.items()]
    makers += [("qwen-image", qwen_image_files)] + [(name, lambda name=name: flux_files(name)) for name in FLUX_SCHEDULERS]
    makers += [(name, lambda name=name: qwen_image_edit_files(name)) for name in QWEN_EDIT]
    makers += [("z-image-turbo", z_image_files), ("flux2-dev", flux2_dev_files)]
    for name, make in makers:
        files = make()
        links = qwen_image_edit_links() if name in QWEN_EDIT else {}
        stale += write_links(os.path.join(MODELS, name), links, check)
        for rel, data in sorted(files.items()):
            path = os.path.join(MODELS, name, rel)
            if check:
                old = open(path, "rb").read() if os.path.exists(path) else None
                if old != data:
                    stale.append(path)
                continue
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
        if not check:
            print(f"{os.path.join(MODELS, name)}: {len(files)} files, "
                  f"{sum(len(v) for v in files.values())} bytes")
    if check:
        for p in stale:
            print(f"stale: {os.path.relpath(p, ROOT)} (run scripts/models/make_config_folders.py)")
        print("config folders: " + ("stale" if stale else "up to date"))
        sys.exit(1 if stale else 0)


if __name__ == "__main__":
    main()
