"""LoRA adapters made by peft and saved by diffusers' save_lora_weights, and the images diffusers makes
with them (load_lora_weights + set_adapters), for the tiny SD3 with T5 (tests/data/golden/sd3_t5_tiny),
FLUX.1-dev (models/tiny-random-flux-dev) and Qwen-Image (models/tiny-random-qwen-image) folders:

- SD3: one adapter for the transformer's attention, one for its feed-forwards, one for the first CLIP
  text encoder, each alone at its own scale and all three together;
- FLUX.1-dev: a diffusers/PEFT adapter of the transformer and the CLIP encoder, and a kohya file in
  Black Forest Labs' block names (fused qkv, an MLP, a projection, a modulation, with alphas);
- Qwen-Image: an adapter of the transformer's attention and image MLP;
- Z-Image (models/tiny-random-z-image, golden_z_image's "cfg" call): two adapters in the non-diffusers
  formats diffusers' ZImagePipeline.load_lora_weights converts (_convert_non_diffusers_z_image_lora_
  to_diffusers), random rank-4 pairs (Z_IMAGE_ADAPTERS), each alone:
  - z_image_kohya (scale 1): kohya / sd-scripts over the original module tree, every name
    "lora_unet_" + the original module path with "_" for ".", then .lora_down.weight [rank, in],
    .lora_up.weight [out, rank] and a 0-d fp32 .alpha (weight change alpha / rank x up @ down):
        lora_unet_{B}_attention_qkv     B.attention.to_q ; to_k ; to_v: up's rows split in three
                                        equal parts in that order, down shared by the three
        lora_unet_{B}_attention_out     B.attention.to_out.0
        lora_unet_{B}_feed_forward_w{1,2,3}   B.feed_forward.w{1,2,3}
        lora_unet_{B}_adaLN_modulation_0      B.adaLN_modulation.0
    with {B} layers_N, noise_refiner_N or context_refiner_N (B: layers.N, noise_refiner.N,
    context_refiner.N). diffusers undoes the underscores by splitting at every "_" and joining back
    its own list of names that have one (to_q/k/v/out, feed_forward, noise_refiner, context_refiner,
    adaLN_modulation, t_embedder, cap_embedder, all_x_embedder, all_final_layer).
  - z_image_diffusion_model (scale 0.8): "diffusion_model." + diffusers' module names (to_q, to_k,
    to_v, to_out.0, feed_forward.w*, adaLN_modulation.0 of layers, noise_refiner, context_refiner)
    + .lora_A.weight / .lora_B.weight, no alpha (alpha = rank: a weight change of up @ down), the
    layout of ai-toolkit's Z-Image adapters.
  The run checks that diffusers adapted exactly the modules listed, each by scale x alpha / rank x
  up @ down (the fused qkv split as above).
- FLUX.2 klein (models/tiny-random-flux2-klein) and dev (models/tiny-random-flux2-dev): a peft
  adapter of the transformer (both streams' attention and SwiGLU MLPs, the single blocks' fused
  projection, a shared modulation), saved by the family's pipeline; latents packed, channels first.

The adapters go to tests/data/golden/lora/, the images and final latents to lora_pipeline.safetensors.
Needs the sd3_family_pipelines, flux_pipeline, z_image_pipeline, flux2_klein_pipeline and
flux2_dev_pipeline parts first (their folders). DP_GOLDEN_LORA_CASES=name,... makes only those cases.
"""
import copy
import json
import os
import sys

import numpy as np
import torch
from safetensors.torch import save_file

from golden_z_image import call as z_image_call
from make_golden import OUT, save

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
ADAPTERS = os.path.join(OUT, "lora")
FOLDERS = {
    "sd3": os.path.join(OUT, "sd3_t5_tiny"),
    "flux": os.path.join(ROOT, "models", "tiny-random-flux-dev"),
    "qwen-image": os.path.join(ROOT, "models", "tiny-random-qwen-image"),
    "z-image": os.path.join(ROOT, "models", "tiny-random-z-image"),
    "flux2-klein": os.path.join(ROOT, "models", "tiny-random-flux2-klein"),
    "flux2-dev": os.path.join(ROOT, "models", "tiny-random-flux2-dev"),
}
PARTS = ["lora"]

# name, family, adapters [(file, scale)], call arguments
CASES = [
    ("sd3_attention", "sd3", [("sd3_attention.safetensors", 1.0)],
     dict(prompt="a red circle on a blue background", negative_prompt="", seed=0, steps=3, guidance_scale=5.0,
          width=32, height=32)),
    ("sd3_feed_forward", "sd3", [("sd3_feed_forward.safetensors", 0.7)],
     dict(prompt="a red circle on a blue background", negative_prompt="", seed=0, steps=3, guidance_scale=5.0,
          width=32, height=32)),
    ("sd3_clip", "sd3", [("sd3_clip.safetensors", 1.3)],
     dict(prompt="a red circle on a blue background", negative_prompt="", seed=0, steps=3, guidance_scale=5.0,
          width=32, height=32)),
    ("sd3_all", "sd3",
     [("sd3_attention.safetensors", 0.5), ("sd3_feed_forward.safetensors", 1.0), ("sd3_clip.safetensors", 1.0)],
     dict(prompt="a green square", negative_prompt="blurry", seed=5, steps=3, guidance_scale=4.0, width=32,
          height=32)),
    ("flux_peft", "flux", [("flux_peft.safetensors", 0.8)],
     dict(prompt="a red fox in the snow", seed=3, steps=3, guidance_scale=3.5, width=32, height=32,
          max_sequence_length=32)),
    ("flux_kohya", "flux", [("flux_kohya.safetensors", 1.0)],
     dict(prompt="a red fox in the snow", seed=3, steps=3, guidance_scale=3.5, width=32, height=32,
          max_sequence_length=32)),
    ("qwen_peft", "qwen-image", [("qwen_peft.safetensors", 1.0)],
     dict(prompt="a lighthouse at dusk", seed=13, steps=3, true_cfg_scale=1.0, width=32, height=32,
          max_sequence_length=64)),
    ("z_image_kohya", "z-image", [("z_image_kohya.safetensors", 1.0)], z_image_call("cfg")),
    ("z_image_diffusion_model", "z-image", [("z_image_diffusion_model.safetensors", 0.8)], z_image_call("cfg")),
    ("flux2_klein_peft", "flux2-klein", [("flux2_klein_peft.safetensors", 0.9)],
     dict(prompt="a red fox in the snow", seed=3, steps=3, width=32, height=32, max_sequence_length=40)),
    ("flux2_dev_peft", "flux2-dev", [("flux2_dev_peft.safetensors", 0.8)],
     dict(prompt="a red fox in the snow", seed=3, steps=3, guidance_scale=4.0, width=32, height=32,
          max_sequence_length=40)),
]

# Z-Image adapters in the formats trainers write, {file: {module name in the file: [diffusers modules]}}
# (the file's rows split over the modules in order; see the docstring).
Z_IMAGE_ADAPTERS = {
    "z_image_kohya.safetensors": {
        "lora_unet_layers_0_attention_qkv": [f"layers.0.attention.to_{x}" for x in "qkv"],
        "lora_unet_noise_refiner_0_attention_qkv": [f"noise_refiner.0.attention.to_{x}" for x in "qkv"],
        "lora_unet_layers_1_attention_out": ["layers.1.attention.to_out.0"],
        "lora_unet_context_refiner_0_attention_out": ["context_refiner.0.attention.to_out.0"],
        "lora_unet_layers_0_feed_forward_w1": ["layers.0.feed_forward.w1"],
        "lora_unet_layers_1_feed_forward_w2": ["layers.1.feed_forward.w2"],
        "lora_unet_context_refiner_0_feed_forward_w3": ["context_refiner.0.feed_forward.w3"],
        "lora_unet_layers_1_adaLN_modulation_0": ["layers.1.adaLN_modulation.0"],
    },
    "z_image_diffusion_model.safetensors": {
        f"diffusion_model.{m}": [m] for m in (
            "layers.0.attention.to_q", "layers.0.attention.to_k", "layers.0.attention.to_v",
            "layers.1.attention.to_out.0", "context_refiner.0.attention.to_v", "noise_refiner.0.feed_forward.w2",
            "layers.1.feed_forward.w1", "layers.0.adaLN_modulation.0")
    },
}
KOHYA = (".lora_down.weight", ".lora_up.weight")
PEFT = (".lora_A.weight", ".lora_B.weight")


def _peft_layers(model, targets, rank, alpha, seed):
    """A peft adapter of `targets` on a copy of `model`: its state dict and config, B scaled down to a
    change of a useful size (peft's init_lora_weights=False leaves nn.Linear's init in both)."""
    from peft import LoraConfig, get_peft_model_state_dict, inject_adapter_in_model

    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, init_lora_weights=False)
    torch.manual_seed(seed)
    model = inject_adapter_in_model(config, copy.deepcopy(model), adapter_name="golden")
    layers = get_peft_model_state_dict(model, adapter_name="golden")
    with torch.no_grad():
        for k, v in layers.items():
            if "lora_B" in k:
                v.mul_(0.3)
    meta = config.to_dict()
    meta["target_modules"] = sorted(meta["target_modules"])
    return layers, meta


def _random_pairs(modules, seed, suffixes=KOHYA, alphas=True):
    """Random rank-4 LoRA pairs for `modules` ({name: (out, in)}), under the names `suffixes` (down,
    up), with an alpha each (2, 3, 4 in turn: alpha / rank 0.5, 0.75, 1) if `alphas`."""
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for k, (name, (out, inp)) in enumerate(modules.items()):
        rank = 4
        tensors[name + suffixes[0]] = torch.randn(rank, inp, generator=g) / inp ** 0.5
        tensors[name + suffixes[1]] = torch.randn(out, rank, generator=g) * 0.3 / rank ** 0.5
        if alphas:
            tensors[name + ".alpha"] = torch.tensor(float(2 + k % 3))
    return tensors


def _flux_kohya(transformer, seed):
    """A kohya / sd-scripts file in Black Forest Labs' names, with an alpha per pair. No linear1:
    diffusers splits it in FLUX.1-dev's own widths (3072 x 3, 12288), which a small model has not."""
    inner = transformer.config.num_attention_heads * transformer.config.attention_head_dim
    mlp = transformer.single_transformer_blocks[0].proj_mlp.out_features
    ff = transformer.transformer_blocks[0].ff.net[0].proj.out_features
    mod = transformer.transformer_blocks[0].norm1.linear.out_features
    modules = {  # name: (out, in)
        "lora_unet_double_blocks_0_img_attn_qkv": (3 * inner, inner),
        "lora_unet_double_blocks_1_txt_attn_qkv": (3 * inner, inner),
        "lora_unet_double_blocks_0_img_mlp_0": (ff, inner),
        "lora_unet_double_blocks_1_txt_attn_proj": (inner, inner),
        "lora_unet_double_blocks_0_img_mod_lin": (mod, inner),
        "lora_unet_single_blocks_1_linear2": (inner, inner + mlp),
    }
    return _random_pairs(modules, seed)


def _z_image_adapter(transformer, file, seed):
    """Z_IMAGE_ADAPTERS[file] with random pairs: kohya's names and alphas, or lora_A / lora_B without."""
    shapes = {}
    for name, targets in Z_IMAGE_ADAPTERS[file].items():
        layers = [transformer.get_submodule(t) for t in targets]
        shapes[name] = (sum(x.out_features for x in layers), layers[0].in_features)
    kohya = file == "z_image_kohya.safetensors"
    return _random_pairs(shapes, seed, KOHYA if kohya else PEFT, alphas=kohya)


def _check_z_image_adapter(transformer, file, adapter, scale):
    """The adapter diffusers loaded at `scale` changes each module as the file says: scale x alpha /
    rank (1 without an alpha) x up @ down, a fused qkv's up split in three; and no other module."""
    from safetensors.torch import load_file

    tensors = load_file(os.path.join(ADAPTERS, file))
    modules = Z_IMAGE_ADAPTERS[file]
    down, up = KOHYA if file == "z_image_kohya.safetensors" else PEFT
    for name, targets in modules.items():
        a, b = tensors[name + down], tensors[name + up]
        factor = scale * (tensors[name + ".alpha"].item() / a.shape[0] if name + ".alpha" in tensors else 1.0)
        for target, part in zip(targets, b.chunk(len(targets), dim=0)):
            layer = transformer.get_submodule(target)
            got = layer.lora_B[adapter].weight @ layer.lora_A[adapter].weight * layer.scaling[adapter]
            assert torch.allclose(got, factor * part @ a, rtol=1e-5, atol=1e-7), f"{file}: {target}"
    adapted = [n for n, m in transformer.named_modules() if hasattr(m, "lora_A") and adapter in m.lora_A]
    assert sorted(adapted) == sorted(t for ts in modules.values() for t in ts), f"{file}: adapted {adapted}"
    print(f"{file}: {len(adapted)} modules adapted as the file says")


def _sd3_adapters(sd3):
    from diffusers import StableDiffusion3Pipeline

    attention, attention_meta = _peft_layers(
        sd3.transformer, ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"],
        4, 8, 100)
    StableDiffusion3Pipeline.save_lora_weights(ADAPTERS, transformer_lora_layers=attention,
                                               transformer_lora_adapter_metadata=attention_meta,
                                               weight_name="sd3_attention.safetensors")
    ff, ff_meta = _peft_layers(sd3.transformer, ["ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj",
                                                 "ff_context.net.2"], 2, 2, 101)
    StableDiffusion3Pipeline.save_lora_weights(ADAPTERS, transformer_lora_layers=ff,
                                               transformer_lora_adapter_metadata=ff_meta,
                                               weight_name="sd3_feed_forward.safetensors")
    clip, clip_meta = _peft_layers(sd3.text_encoder, ["q_proj", "k_proj", "v_proj", "out_proj"], 4, 4, 102)
    StableDiffusion3Pipeline.save_lora_weights(ADAPTERS, text_encoder_lora_layers=clip,
                                               text_encoder_lora_adapter_metadata=clip_meta,
                                               weight_name="sd3_clip.safetensors")


def _flux_adapters(flux):
    from diffusers import FluxPipeline

    transformer, transformer_meta = _peft_layers(
        flux.transformer, ["to_q", "to_k", "to_v", "to_out.0", "proj_mlp", "proj_out", "ff.net.0.proj"], 4, 6, 103)
    te, te_meta = _peft_layers(flux.text_encoder, ["q_proj", "v_proj", "fc1"], 2, 4, 104)
    FluxPipeline.save_lora_weights(ADAPTERS, transformer_lora_layers=transformer, text_encoder_lora_layers=te,
                                   transformer_lora_adapter_metadata=transformer_meta,
                                   text_encoder_lora_adapter_metadata=te_meta,
                                   weight_name="flux_peft.safetensors")
    save_file(_flux_kohya(flux.transformer, 105), os.path.join(ADAPTERS, "flux_kohya.safetensors"))


def _qwen_adapters(qwen):
    from diffusers import QwenImagePipeline

    q, q_meta = _peft_layers(qwen.transformer, ["to_q", "to_k", "to_v", "to_out.0", "img_mlp.net.0.proj",
                                                "img_mlp.net.2", "txt_mod.1"], 4, 4, 106)
    QwenImagePipeline.save_lora_weights(ADAPTERS, transformer_lora_layers=q, transformer_lora_adapter_metadata=q_meta,
                                        weight_name="qwen_peft.safetensors")


def _flux2_klein_adapters(klein):
    # FLUX.2 klein: both streams' attention and SwiGLU MLPs of the double blocks, the single blocks'
    # fused projection (its q, k, v and MLP halves in one layer) and a shared modulation.
    k, k_meta = _peft_layers(klein.transformer, ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "to_add_out",
                                                 "linear_in", "linear_out", "to_qkv_mlp_proj",
                                                 "double_stream_modulation_img.linear"], 4, 4, 110)
    type(klein).save_lora_weights(ADAPTERS, transformer_lora_layers=k, transformer_lora_adapter_metadata=k_meta,
                                  weight_name="flux2_klein_peft.safetensors")


def _flux2_dev_adapters(dev):
    # FLUX.2 dev (Flux2Pipeline): as klein's, with the text stream's whole attention and the single
    # blocks' shared modulation.
    d, d_meta = _peft_layers(dev.transformer, ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj",
                                               "add_v_proj", "to_add_out", "linear_in", "linear_out",
                                               "to_qkv_mlp_proj", "single_stream_modulation.linear"], 4, 4, 111)
    type(dev).save_lora_weights(ADAPTERS, transformer_lora_layers=d, transformer_lora_adapter_metadata=d_meta,
                                weight_name="flux2_dev_peft.safetensors")


def _z_image_adapters(z_image):
    for seed, file in enumerate(Z_IMAGE_ADAPTERS, 108):
        save_file(_z_image_adapter(z_image.transformer, file, seed), os.path.join(ADAPTERS, file))


MAKE_ADAPTERS = {"sd3": _sd3_adapters, "flux": _flux_adapters, "qwen-image": _qwen_adapters,
                 "flux2-klein": _flux2_klein_adapters, "flux2-dev": _flux2_dev_adapters,
                 "z-image": _z_image_adapters}


def _run(pipe, family, kwargs):
    kwargs = dict(kwargs)
    seed = kwargs.pop("seed")
    steps = kwargs.pop("steps")
    args = dict(num_inference_steps=steps, **kwargs)
    if family.startswith("flux2"):  # the packed latents after the last step, channels first (ours)
        kept = {}

        def keep(p, i, t, kw):
            kept["latents"] = kw["latents"]
            return kw

        out = pipe(generator=torch.Generator("cpu").manual_seed(seed), output_type="np",
                   callback_on_step_end=keep, callback_on_step_end_tensor_inputs=["latents"], **args)
        image = out.images[0]
        return (torch.from_numpy((image * 255).round().astype(np.uint8)),
                kept["latents"][0].transpose(0, 1).float().contiguous())
    image = pipe(generator=torch.Generator("cpu").manual_seed(seed), output_type="np", **args).images[0]
    latents = pipe(generator=torch.Generator("cpu").manual_seed(seed), output_type="latent", **args).images[0]
    return torch.from_numpy((image * 255).round().astype(np.uint8)), latents.float()


def _cases():
    """CASES, or those named in DP_GOLDEN_LORA_CASES (comma-separated)."""
    only = [n for n in os.environ.get("DP_GOLDEN_LORA_CASES", "").split(",") if n]
    unknown = sorted(set(only) - {c[0] for c in CASES})
    if unknown:
        sys.exit(f"DP_GOLDEN_LORA_CASES: unknown cases {unknown}; the cases are: {', '.join(c[0] for c in CASES)}")
    return [c for c in CASES if not only or c[0] in only]


def _committed(dropped):
    """lora_pipeline.safetensors' tensors and cases as they are, but for the cases `dropped`."""
    from safetensors import safe_open

    with safe_open(os.path.join(OUT, "lora_pipeline.safetensors"), "pt") as f:
        meta = json.loads(f.metadata()["cases"])
        tensors = {k: f.get_tensor(k) for k in f.keys() if k.split(".")[0] not in dropped}
    return tensors, {k: v for k, v in meta.items() if k not in dropped}


def lora():
    """Every case, or (DP_GOLDEN_LORA_CASES=name,...) only those and their families' adapters, the
    other cases' tensors kept byte for byte as lora_pipeline.safetensors has them: a new case then
    leaves the committed ones alone (made again on another machine, they move by ~2e-5)."""
    from diffusers import DiffusionPipeline

    from golden_mistral3 import pixtral_processor_class

    pixtral_processor_class()  # FLUX.2-dev's tokenizer, without torchvision
    load = lambda family: DiffusionPipeline.from_pretrained(FOLDERS[family])  # noqa: E731
    cases = _cases()
    os.makedirs(ADAPTERS, exist_ok=True)
    for family in dict.fromkeys(family for _, family, _, _ in cases):
        MAKE_ADAPTERS[family](load(family))
    tensors, meta = ({}, {}) if cases == CASES else _committed({name for name, _, _, _ in cases})
    for name, family, adapters, kwargs in cases:
        pipe = load(family)  # a fresh pipeline: nothing of an earlier case's adapters
        pipe.set_progress_bar_config(disable=True)
        names = []
        for k, (file, scale) in enumerate(adapters):
            names.append(f"a{k}")
            pipe.load_lora_weights(ADAPTERS, weight_name=file, adapter_name=names[-1])
        pipe.set_adapters(names, [scale for _, scale in adapters])
        for (file, scale), adapter in zip(adapters, names):
            if file in Z_IMAGE_ADAPTERS:
                _check_z_image_adapter(pipe.transformer, file, adapter, scale)
        image, latents = _run(pipe, family, kwargs)
        tensors[name + ".image"] = image
        tensors[name + ".latents"] = latents
        meta[name] = dict(family=family, folder=os.path.relpath(FOLDERS[family], ROOT),
                          adapters=[dict(file=f, scale=s) for f, s in adapters], **kwargs)
        # The same call without the adapters: the test checks the adapters changed the image.
        base = load(family)
        base.set_progress_bar_config(disable=True)
        tensors[name + ".base_latents"] = _run(base, family, kwargs)[1]
    save("lora_pipeline.safetensors", tensors, meta)
    for f in sorted(os.listdir(ADAPTERS)):
        print(os.path.join(ADAPTERS, f), os.path.getsize(os.path.join(ADAPTERS, f)), "bytes")
    print(json.dumps({k: v["adapters"] for k, v in meta.items()}))
    for name, _, _, _ in cases:  # how far the adapters move the final latents
        print(name, (tensors[name + ".latents"] - tensors[name + ".base_latents"]).abs().max().item())
