"""FLOPs of one transformer forward pass, as PyTorch's FLOP counter (torch.utils.flop_counter) counts
them over diffusers' own transformers: the reference for the FLOP formulas of `plan`.

Each model folder of a supported family (MODELS) has its transformer built from its
transformer/config.json on the meta device, so that the real-size models cost neither memory nor
time, and run once (batch 1, fp32, no grad) under FlopCounterMode. The counter counts matmuls,
convolutions and attention only (no norm, activation, RoPE or softmax). On the meta device
F.scaled_dot_product_attention takes its math path, two aten.bmm (Q K^T, then P V) of
2 b h Sq Skv d each: together the 4 b h Sq Skv d the counter gives a fused SDPA kernel (on CPU
tensors it counts aten._scaled_dot_product_flash_attention_for_cpu, the same numbers). No other op
of these transformers is a bmm (a linear on a 3-d input is a view and one mm or addmm), so the
split is by op name: "attention" is aten.bmm; "gemm" is aten.mm, aten.addmm and aten.convolution
(SD3's patch embedding); any other counted op fails the run. Each case checks the attention FLOPs
against 4 b h Sq Skv d summed over the attention calls (their shapes taken where diffusers calls
F.scaled_dot_product_attention), and that every call is over the image tokens, the text tokens or
both, as the case expects them.

The counter counts every matmul, also those on one row per pass (batch 1): the timestep, guidance
and pooled-text embedders and the modulation (adaLN) linears. gemm_one_row is their part of gemm
(the part that does not grow with the tokens), and by_module each top-level child module's total
(a ModuleList or ModuleDict: its members summed), so that they are visible apart.

Cases: two image sizes (the real models 512 x 512 and 1024 x 1024 pixels; the tiny ones 32 x 32
and 64 x 48, SD3's tiny ones 40 x 24 instead, as their VAE does not downsample and their position
embedding is 40 patches wide) by two text lengths:
- SD3: 154 (CLIP's 77 and T5 at 77) and 333 (77 + T5's default 256): the joint text the
  transformer takes;
- FLUX.1, FLUX.2, Qwen-Image: 77 and 512;
- Z-Image: 77 and 512 caption rows. The transformer pads the caption and the image patches each to
  a multiple of 32 (its learned pad tokens in the padded rows, the embedders run over them too);
  batch 1 has no attention mask, so the pads are attended; its final layer projects the whole
  sequence, caption rows included.
The image tokens are counted as the pipelines make the latents: vae_scale_factor is
2^(len(block_out_channels) - 1) (Qwen-Image: 2^len(temperal_downsample)); the latent side is
2 * (pixels // (2 * vae_scale_factor)) and a token a 2 x 2 patch of it (packed by the pipeline,
Z-Image's by the transformer), SD3's pixels // vae_scale_factor and a patch_size square patched
inside the transformer. FLUX.2 thus has FLUX.1's count: its VAE's 32 channels at 1/8 are packed
2 x 2 into 128 channels at 1/16.

tests/data/golden/pass_flops.json: {"diffusers", "torch", "cases": [...]}, each case: model (the
folder), family, class, diffusers, config (the transformer's config.json less its "_" keys),
vae_scale_factor, width and height (pixels), latent [h, w], image_tokens (entering the
transformer), text_tokens (passed), attended_image_tokens and attended_text_tokens (after the
model's own padding: Z-Image's), flops (the total), gemm, gemm_one_row, attention,
attention_formula, ops (FlopCounterMode's get_flop_counts()["Global"], op names as strings),
by_module.
Run: scripts/golden/make_golden.py pass_flops
"""
import json
import os

import torch

from make_golden import OUT

PARTS = ["pass_flops"]

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
MODELS_DIR = os.path.join(ROOT, "models")

# Folders by family. Left out: shapes-sd3 (a test shape, not a model), the edit, fill and kontext
# folders (other inputs than text-to-image), tiny-random-flux2-klein-base (klein's transformer).
MODELS = {
    "sd3": ["sd3-medium", "sd3.5-medium", "sd3.5-large", "tiny-random-sd3", "tiny-random-sd3-16ch"],
    "flux": ["flux.1-dev", "flux.1-schnell", "tiny-random-flux-dev", "tiny-random-flux-schnell"],
    "flux2": ["flux2-dev", "tiny-random-flux2-dev", "tiny-random-flux2-klein"],
    "qwen_image": ["qwen-image", "tiny-random-qwen-image"],
    "z_image": ["z-image-turbo", "tiny-random-z-image"],
}
CLASSES = {"sd3": "SD3Transformer2DModel", "flux": "FluxTransformer2DModel", "flux2": "Flux2Transformer2DModel",
           "qwen_image": "QwenImageTransformer2DModel", "z_image": "ZImageTransformer2DModel"}
TEXT_TOKENS = {"sd3": [154, 333], "flux": [77, 512], "flux2": [77, 512], "qwen_image": [77, 512],
               "z_image": [77, 512]}
SIZES = [(512, 512), (1024, 1024)]  # (width, height) in pixels
TINY_SIZES = [(32, 32), (64, 48)]
TINY_SD3_SIZES = [(32, 32), (40, 24)]
SEQ_MULTI_OF = 32  # Z-Image's padding unit (diffusers' transformer_z_image.SEQ_MULTI_OF)

GEMM_OPS = {"aten.mm", "aten.addmm", "aten.convolution"}
ATTENTION_OPS = {"aten.bmm"}


def _json(path):
    with open(path) as f:
        return json.load(f)


def vae_scale_factor(family, vae):
    if family == "qwen_image":
        return 2 ** len(vae["temperal_downsample"])
    return 2 ** (len(vae["block_out_channels"]) - 1)


def latent_size(family, vsf, width, height):
    if family == "sd3":
        return height // vsf, width // vsf
    return 2 * (height // (vsf * 2)), 2 * (width // (vsf * 2))


def _pad(n):
    return n + (-n) % SEQ_MULTI_OF


class Sequences:
    """The (Sq, Skv, heads, head_dim) of every attention call, through a wrapper of
    F.scaled_dot_product_attention (what diffusers' native attention backend calls), to check the
    counter's attention FLOPs against 4 b h Sq Skv d."""

    def __init__(self):
        self.calls = []
        self.original = torch.nn.functional.scaled_dot_product_attention

    def __enter__(self):
        def spy(query, key, value, *args, **kwargs):
            b, h, sq, d = query.shape
            self.calls.append((b, h, sq, key.shape[-2], d))
            return self.original(query, key, value, *args, **kwargs)
        torch.nn.functional.scaled_dot_product_attention = spy
        return self

    def __exit__(self, *exc):
        torch.nn.functional.scaled_dot_product_attention = self.original

    def flops(self):
        return sum(4 * b * h * sq * skv * d for b, h, sq, skv, d in self.calls)


def inputs(family, config, lat_h, lat_w, text):
    """The transformer's keyword arguments for batch 1, as its pipeline passes them (on meta)."""
    t = torch.tensor([0.5])
    if family == "sd3":
        return dict(hidden_states=torch.zeros(1, config["in_channels"], lat_h, lat_w),
                    encoder_hidden_states=torch.zeros(1, text, config["joint_attention_dim"]),
                    pooled_projections=torch.zeros(1, config["pooled_projection_dim"]), timestep=t * 1000)
    gh, gw = lat_h // 2, lat_w // 2
    if family == "z_image":
        return dict(x=[torch.zeros(config["in_channels"], 1, lat_h, lat_w)], t=t,
                    cap_feats=[torch.zeros(text, config["cap_feat_dim"])])
    hidden = torch.zeros(1, gh * gw, config["in_channels"])
    encoder = torch.zeros(1, text, config["joint_attention_dim"])
    if family == "qwen_image":
        return dict(hidden_states=hidden, encoder_hidden_states=encoder, timestep=t, img_shapes=[(1, gh, gw)])
    axes = 3 if family == "flux" else 4
    kwargs = dict(hidden_states=hidden, encoder_hidden_states=encoder, timestep=t,
                  img_ids=torch.zeros(gh * gw, axes), txt_ids=torch.zeros(text, axes))
    if family == "flux":
        kwargs["pooled_projections"] = torch.zeros(1, config["pooled_projection_dim"])
    if config.get("guidance_embeds"):
        kwargs["guidance"] = torch.tensor([3.5])
    return kwargs


class OneRow:
    """The FLOPs of the mm and addmm on a single row (batch 1: the timestep, guidance and pooled-text
    embedders and the modulation linears, which do not grow with the tokens), by a dispatch mode
    inside the counter."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        owner = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
                    a, b = args[-2], args[-1]
                    if a.shape[0] == 1:
                        owner.flops += 2 * a.shape[1] * b.shape[1]
                return func(*args, **(kwargs or {}))

        self.flops = 0
        self.mode = Mode()


def count(model, kwargs):
    from torch.utils.flop_counter import FlopCounterMode

    one_row = OneRow()
    with torch.no_grad(), Sequences() as seqs, FlopCounterMode(display=False) as counter, one_row.mode:
        model(**kwargs, return_dict=False)
    counts = counter.get_flop_counts()
    ops = {str(op): int(n) for op, n in counts["Global"].items()}
    unknown = set(ops) - GEMM_OPS - ATTENTION_OPS
    assert not unknown, f"ops of no known kind: {unknown}"
    # Each top-level child's total; a container (ModuleList, ModuleDict: never called itself) sums
    # its members.
    root = type(model).__name__
    by_module = {}
    for name, c in counts.items():
        parts = name.split(".")
        if parts[0] != root or len(parts) == 1 or len(parts) > 3:
            continue
        if len(parts) == 3 and ".".join(parts[:2]) in counts:
            continue
        by_module[parts[1]] = by_module.get(parts[1], 0) + sum(int(n) for n in c.values())
    return ops, by_module, seqs, one_row.flops


def pass_flops():
    import diffusers

    cases = []
    for family, folders in MODELS.items():
        cls = getattr(diffusers, CLASSES[family])
        for folder in folders:
            raw = _json(os.path.join(MODELS_DIR, folder, "transformer", "config.json"))
            assert raw["_class_name"] == CLASSES[family], (folder, raw["_class_name"])
            config = {k: v for k, v in raw.items() if not k.startswith("_")}
            vsf = vae_scale_factor(family, _json(os.path.join(MODELS_DIR, folder, "vae", "config.json")))
            with torch.device("meta"):
                model = cls.from_config(config).eval()
            tiny = folder.startswith("tiny-")
            sizes = (TINY_SD3_SIZES if family == "sd3" else TINY_SIZES) if tiny else SIZES
            for width, height in sizes:
                lat_h, lat_w = latent_size(family, vsf, width, height)
                patch = config["patch_size"] if family == "sd3" else 2
                image = (lat_h // patch) * (lat_w // patch)
                for text in TEXT_TOKENS[family]:
                    with torch.device("meta"):
                        kwargs = inputs(family, config, lat_h, lat_w, text)
                    ops, by_module, seqs, one_row = count(model, kwargs)
                    padded = family == "z_image"
                    attended_image, attended_text = (_pad(image), _pad(text)) if padded else (image, text)
                    case = dict(model=folder, family=family, **{"class": CLASSES[family]},
                                diffusers=diffusers.__version__, config=config,
                                vae_scale_factor=vsf, width=width, height=height, latent=[lat_h, lat_w],
                                image_tokens=image, text_tokens=text, attended_image_tokens=attended_image,
                                attended_text_tokens=attended_text, flops=sum(ops.values()),
                                gemm=sum(n for op, n in ops.items() if op in GEMM_OPS),
                                gemm_one_row=one_row,
                                attention=sum(n for op, n in ops.items() if op in ATTENTION_OPS),
                                attention_formula=seqs.flops(), ops=ops, by_module=by_module)
                    assert case["attention"] == case["attention_formula"], case
                    assert sum(by_module.values()) == case["flops"], (folder, by_module)
                    # Every attention call is over the text and image tokens the case expects.
                    sq = {c[2] for c in seqs.calls}
                    allowed = {attended_image + attended_text, attended_image, attended_text}
                    assert sq <= allowed, (folder, sq, allowed)
                    cases.append(case)
                    print(f"{folder} {width}x{height} image {image} text {text}: "
                          f"gemm {case['gemm']:.4g} attention {case['attention']:.4g}")
            del model
    path = os.path.join(OUT, "pass_flops.json")
    with open(path, "w") as f:
        json.dump({"diffusers": diffusers.__version__, "torch": torch.__version__.split("+")[0], "cases": cases},
                  f, sort_keys=True, indent=1)
        f.write("\n")
    print(f"{path}: {len(cases)} cases, {os.path.getsize(path)} bytes")
