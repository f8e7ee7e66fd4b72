"""A tiny random Z-Image pipeline saved with diffusers' save_pretrained (models/tiny-random-z-image),
ZImagePipeline's images from it, the transformer's own outputs, and a LoRA adapter with its image.

The folder: the small Qwen3 BPE of golden_qwen3 (with its chat template), a tiny Qwen3Model text
encoder (golden_qwen3.tiny_qwen3: width 64, so cap_feat_dim 64), a ZImageTransformer2DModel with
Z-Image's 30 heads (head_dim 8, width 240; RoPE axes 4 + 2 + 2; 2 main blocks, 1 noise and 1
context refiner), random pad tokens (zero in a fresh model: a wrong pad handling would not show),
FLUX's tiny 16-channel VAE (golden_flux_pipeline.tiny_flux_vae), and Z-Image-Turbo's scheduler
(shift 3, no dynamic shifting).

z_image_pipeline.safetensors, one entry per case of CASES (metadata: name, prompt or prompts and
seeds, negative_prompt, guidance_scale, width, height, steps, seed, max_sequence_length, and
cfg_normalization, cfg_truncation, lora, lora_scale where set): NAME.image (uint8 HxWx3) and
NAME.latents (the final latents, 16 x H/8 x W/8); a case of several prompts (one diffusers call,
one generator each) NAME.K.image and NAME.K.latents; "bf16" is BF16_CASE with the pipeline in
bf16. The "lora" case loads tests/data/golden/lora/z_image_peft.safetensors (a peft adapter of
the transformer's attention, feed-forwards and modulations, main blocks and refiners, saved by
ZImagePipeline.save_lora_weights) at LORA_SCALE; its metadata and its base_latents (the same call
without it) are golden_lora.py's.

z_image_transformer.safetensors: the transformer alone on fixed random inputs, a batch of two
(captions of 7 and 40 rows: one under, one over the 32-row padding unit) and a batch of one:
NAME.latents (B x 16 x H x W, the frame axis left out), NAME.timestep (B, the pipeline's
(1000 - t) / 1000), NAME.text (B x rows x 64, each caption zero-padded to the longest) with
NAME.mask (B x rows, 1 on a caption's own), NAME.out (B x 16 x H x W).
"""
import os
import shutil
import tempfile

import numpy as np
import torch

from make_golden import OUT, perturb_norms, save

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
FOLDER = os.path.join(ROOT, "models", "tiny-random-z-image")
ADAPTER = "z_image_peft"

TRANSFORMER = dict(all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=240, n_layers=2,
                   n_refiner_layers=1, n_heads=30, n_kv_heads=30, norm_eps=1e-5, qk_norm=True, cap_feat_dim=64,
                   rope_theta=256.0, t_scale=1000.0, axes_dims=[4, 2, 2], axes_lens=[1024, 64, 64])
SCHEDULER = dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False)  # Z-Image-Turbo's

LONG = "an old lighthouse on a rocky coast at dusk, waves and gulls"  # 49 caption rows
# Its template is 32 tokens exactly: the caption needs no padding (the pipeline golden checks it).
EXACT = "a red fox in the deep snow at dawn"
KEYS = ["name", "prompt", "negative_prompt", "guidance_scale", "width", "height", "steps", "seed",
        "max_sequence_length"]
CASES = [
    # name, prompt (a list: one call of several prompts, seed a list), negative_prompt (None: none),
    # guidance_scale, width, height, steps, seed, max_sequence_length, {extra call arguments}
    ("turbo", "a red fox in the snow", None, 0.0, 32, 32, 4, 3, 512, {}),  # no CFG, as Z-Image-Turbo runs
    ("cfg", "an old lighthouse at dusk", "blurry, low quality", 4.0, 48, 32, 3, 7, 512, {}),
    ("cfg_no_negative", "cat", None, 3.0, 32, 64, 3, 11, 512, {}),  # "" is the negative prompt
    ("cfg_normalization", "three green dots on a white plate", "ugly", 4.0, 32, 32, 3, 13, 512,
     {"cfg_normalization": True}),  # the guided prediction's norm clipped to the positive one's
    # (1000 - t) / 1000 is 0, 0.1, 0.25, 0.5 at 4 steps with shift 3: CFG at the first two only
    ("cfg_truncation", "a bowl of ramen", "blurry", 4.0, 32, 48, 4, 17, 512, {"cfg_truncation": 0.2}),
    ("long_caption", LONG, "", 2.0, 48, 48, 2, 19, 512, {}),  # 49 caption rows, padded to 64
    ("exact_caption", EXACT, None, 0.0, 32, 32, 2, 23, 512, {}),  # 32 caption rows: no padding
    ("cut", LONG, "blurry", 3.0, 32, 32, 2, 29, 20, {}),  # the template cut at 20 tokens
    ("image_32_tokens", "a wide field", None, 0.0, 128, 64, 2, 31, 512, {}),  # 8 x 4 tokens: no padding
    ("image_35_tokens", "a tall tower", "dark", 2.5, 80, 112, 2, 37, 512, {}),  # 5 x 7 tokens: padded to 64
    ("batch", ["a cat", LONG], None, 4.0, 48, 32, 2, [41, 43], 512, {}),  # one call, captions of 16 and 49 rows
]
BF16_CASE = "cfg"
LORA_CASE = ("z_image_peft", "an old lighthouse at dusk", "blurry, low quality", 4.0, 48, 32, 3, 7, 512, {})
LORA_SCALE = 0.8


def _components():
    from diffusers import FlowMatchEulerDiscreteScheduler, ZImageTransformer2DModel
    from transformers import Qwen2Tokenizer

    from golden_flux_pipeline import tiny_flux_vae
    from golden_qwen3 import tiny_qwen3, train_qwen3_tokenizer

    tok_dir = tempfile.mkdtemp()
    train_qwen3_tokenizer(tok_dir)
    tokenizer = Qwen2Tokenizer.from_pretrained(tok_dir)
    shutil.rmtree(tok_dir)
    text_encoder = tiny_qwen3(len(tokenizer), 70)
    torch.manual_seed(71)
    transformer = ZImageTransformer2DModel(**TRANSFORMER).eval()
    perturb_norms(transformer)
    with torch.no_grad():
        transformer.x_pad_token.copy_(torch.randn_like(transformer.x_pad_token))
        transformer.cap_pad_token.copy_(torch.randn_like(transformer.cap_pad_token))
        final = transformer.all_final_layer["2-1"].linear
        final.weight.mul_(2.0)  # noise predictions of a useful size
        final.bias.mul_(2.0)
    torch.manual_seed(72)
    vae = tiny_flux_vae()
    perturb_norms(vae)
    with torch.no_grad():
        vae.decoder.conv_out.weight.mul_(2.0)  # images that are not flat
    return dict(scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER), vae=vae, text_encoder=text_encoder,
                tokenizer=tokenizer, transformer=transformer)


def call(name):
    """Case `name` of CASES (one prompt) as the keywords golden_single_file._run and golden_lora take."""
    _, prompt, negative, guidance, width, height, steps, seed, msl, extra = next(c for c in CASES if c[0] == name)
    return dict(prompt=prompt, negative_prompt=negative, seed=seed, steps=steps, guidance_scale=guidance,
                width=width, height=height, max_sequence_length=msl, **extra)


def _kwargs(case):
    name, prompt, negative, guidance, width, height, steps, seed, msl, extra = case
    # A copy: ZImagePipeline templates the prompts of a list in place.
    prompt = list(prompt) if isinstance(prompt, list) else prompt
    return dict(prompt=prompt, negative_prompt=negative, guidance_scale=guidance, width=width, height=height,
                num_inference_steps=steps, max_sequence_length=msl, **extra)


def _images(pipe, case):
    """[(uint8 image, final latents)] per prompt of the case."""
    seeds = case[7] if isinstance(case[7], list) else [case[7]]
    gens = lambda: [torch.Generator("cpu").manual_seed(s) for s in seeds]  # noqa: E731
    image = pipe(**_kwargs(case), generator=gens(), output_type="np").images
    latents = pipe(**_kwargs(case), generator=gens(), output_type="latent").images
    return [(torch.from_numpy((image[k] * 255).round().astype(np.uint8)), latents[k].float())
            for k in range(len(seeds))]


def _store(tensors, meta, name, case, results, **more):
    several = isinstance(case[1], list)
    for k, (image, latents) in enumerate(results):
        key = f"{name}.{k}" if several else name
        tensors[key + ".image"], tensors[key + ".latents"] = image, latents
    m = dict(zip(KEYS, case), **case[9], **more)
    m["name"] = name
    if several:
        m["prompts"], m["seeds"] = m.pop("prompt"), m.pop("seed")
    meta[name] = m


def _load(dtype=torch.float32, **parts):
    from diffusers import ZImagePipeline

    pipe = ZImagePipeline.from_pretrained(FOLDER, torch_dtype=dtype, **parts)  # what the C++ side reads
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _make_adapter(pipe):
    from diffusers import ZImagePipeline

    from golden_lora import ADAPTERS, _peft_layers

    blocks = [f"layers.{i}" for i in range(TRANSFORMER["n_layers"])] + \
             [f"noise_refiner.{i}" for i in range(TRANSFORMER["n_refiner_layers"])]
    # adaLN_modulation.0 by its block: the final layer's adaLN_modulation.0 is a SiLU.
    targets = ["to_q", "to_k", "to_v", "to_out.0", "w1", "w2", "w3"] + [b + ".adaLN_modulation.0" for b in blocks]
    layers, meta = _peft_layers(pipe.transformer, targets, 2, 3, 107)
    os.makedirs(ADAPTERS, exist_ok=True)
    ZImagePipeline.save_lora_weights(ADAPTERS, transformer_lora_layers=layers,
                                     transformer_lora_adapter_metadata=meta, weight_name=ADAPTER + ".safetensors")
    return ADAPTERS


def _check_cases(pipe):
    """The cases test what they say: caption and image token counts, and a clipping normalization."""
    tok = pipe.tokenizer
    rows = lambda p, msl=512: len(tok(tok.apply_chat_template(  # noqa: E731
        [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True, enable_thinking=True),
        truncation=True, max_length=msl).input_ids)
    assert rows(EXACT) == 32, rows(EXACT)
    assert 32 < rows(LONG) < 64 and rows("a cat") < 32, (rows(LONG), rows("a cat"))
    assert rows(LONG, 20) == 20
    clipped = []
    original = torch.linalg.vector_norm

    def spy(x, *args, **kwargs):
        clipped.append(original(x, *args, **kwargs))
        return clipped[-1]
    case = next(c for c in CASES if c[0] == "cfg_normalization")
    torch.linalg.vector_norm = spy
    try:
        pipe(**_kwargs(case), generator=torch.Generator("cpu").manual_seed(case[7]), output_type="latent")
    finally:
        torch.linalg.vector_norm = original
    # pairs (positive norm, guided norm): at least one step clips
    pairs = list(zip(clipped[0::2], clipped[1::2]))
    assert any(new > pos for pos, new in pairs), pairs


def _transformer_golden(transformer):
    g = torch.Generator().manual_seed(80)
    dim = TRANSFORMER["cap_feat_dim"]
    tensors = {}
    runs = {"batch": ([7, 40], (6, 4), [0.25, 0.9]), "single": ([33], (4, 8), [0.6])}
    for name, (lengths, (h, w), t) in runs.items():
        latents = torch.randn(len(lengths), 16, 1, h, w, generator=g)
        caps = [torch.randn(n, dim, generator=g) for n in lengths]
        t = torch.tensor(t)
        with torch.no_grad():
            out = transformer(list(latents.unbind(0)), t, caps, return_dict=False)[0]
        # As the C++ transformer takes them: the captions padded to the longest with a mask.
        text = torch.zeros(len(lengths), max(lengths), dim)
        mask = torch.zeros(len(lengths), max(lengths), dtype=torch.int64)
        for k, cap in enumerate(caps):
            text[k, : len(cap)], mask[k, : len(cap)] = cap, 1
        tensors[f"{name}.latents"], tensors[f"{name}.timestep"] = latents.squeeze(2), t
        tensors[f"{name}.text"], tensors[f"{name}.mask"] = text, mask
        tensors[f"{name}.out"] = torch.stack([o.squeeze(1) for o in out])
    save("z_image_transformer.safetensors", tensors, {"folder": "models/tiny-random-z-image/transformer",
                                                      "runs": {k: v[0] for k, v in runs.items()}})


def z_image_pipeline():
    from diffusers import ZImagePipeline

    from golden_qwen3 import _write_tokenizer

    shutil.rmtree(FOLDER, ignore_errors=True)
    ZImagePipeline(**_components()).save_pretrained(FOLDER, safe_serialization=True)
    _write_tokenizer(os.path.join(FOLDER, "tokenizer"))  # Qwen3's layout, the chat template in its config
    pipe = _load()
    _check_cases(pipe)
    _transformer_golden(pipe.transformer)
    tensors, meta = {}, {}
    for case in CASES:
        _store(tensors, meta, case[0], case, _images(pipe, case))
    case = next(c for c in CASES if c[0] == BF16_CASE)
    _store(tensors, meta, "bf16", case, _images(_load(torch.bfloat16), case))

    adapters = _make_adapter(pipe)
    pipe = _load()
    pipe.load_lora_weights(adapters, weight_name=ADAPTER + ".safetensors", adapter_name="a0")
    pipe.set_adapters(["a0"], [LORA_SCALE])
    # As golden_lora.py's cases: the family, the folder, the adapters and the call's image without them.
    _store(tensors, meta, LORA_CASE[0], LORA_CASE, _images(pipe, LORA_CASE), family="z-image",
           folder="models/tiny-random-z-image", adapters=[{"file": ADAPTER + ".safetensors", "scale": LORA_SCALE}])
    tensors[f"{LORA_CASE[0]}.base_latents"] = tensors[f"{BF16_CASE}.latents"].clone()  # the same call
    save("z_image_pipeline.safetensors", tensors, meta)


PARTS = ["z_image_pipeline"]
