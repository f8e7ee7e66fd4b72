"""SD3.5's transformer: MMDiT-X dual-attention blocks, skip-layer guidance and SD3.5's large
position tables. Run: scripts/golden/make_golden.py sd35_transformer sd35_pos_embed
"""
import os

import torch

from make_golden import OUT, perturb_norms, save


def sd35_transformer():
    """A tiny SD3.5-medium-like transformer: dual attention in blocks 0 and 1 (the last block is
    context-pre-only), RMS qk-norm, 4 heads (they divide by tp x ulysses = 4), and a 7 x 5 patch
    grid that the 12 x 12 position table crops off-centre. The stored position table is perturbed,
    so a model that rebuilds it instead of loading it gives another output."""
    from diffusers import SD3Transformer2DModel

    config = dict(sample_size=16, patch_size=2, in_channels=4, num_layers=3, attention_head_dim=6,
                  num_attention_heads=4, caption_projection_dim=24, joint_attention_dim=20,
                  pooled_projection_dim=12, out_channels=4, pos_embed_max_size=12, qk_norm="rms_norm",
                  dual_attention_layers=(0, 1))
    torch.manual_seed(20)
    model = SD3Transformer2DModel(**config).eval()
    perturb_norms(model)
    with torch.no_grad():
        model.pos_embed.pos_embed.add_(torch.randn_like(model.pos_embed.pos_embed) * 0.1)
    model.save_pretrained(os.path.join(OUT, "sd35_transformer"), safe_serialization=True)
    g = torch.Generator().manual_seed(21)
    latents = torch.randn(2, config["in_channels"], 14, 10, generator=g)
    text = torch.randn(2, 6, config["joint_attention_dim"], generator=g)
    pooled = torch.randn(2, config["pooled_projection_dim"], generator=g)
    timestep = torch.tensor([981.0, 120.5])
    tensors = {"latents": latents, "text": text, "pooled": pooled, "timestep": timestep}
    skips = {"out": None, "out_skip_1": [1], "out_skip_0_2": [0, 2]}
    with torch.no_grad():
        for key, skip in skips.items():
            tensors[key] = model(hidden_states=latents, encoder_hidden_states=text, pooled_projections=pooled,
                                 timestep=timestep, skip_layers=skip).sample
    save("sd35_transformer.safetensors", tensors, {"config": config, "skip_layers": skips})


def sd35_pos_embed():
    """diffusers' sin-cos position table where a checkpoint does not store it, centre-cropped as
    PatchEmbed crops it: SD3.5-medium's (1536 wide, 384 x 384, base 64), SD3.5-large's (2432 wide,
    192 x 192), a full-height column of a 384 table, and a whole small table."""
    from diffusers.models.embeddings import PatchEmbed, get_2d_sincos_pos_embed

    cases = {
        # name: (dim, max, base, crop height, crop width); a crop of 0 x 0 is the whole table
        "medium": (1536, 384, 64, 5, 3),
        "large": (2432, 192, 64, 3, 2),
        "column": (64, 384, 64, 384, 1),
        "small": (24, 12, 8, 0, 0),
    }
    tensors = {}
    for name, (dim, size, base, h, w) in cases.items():
        if h == 0:
            tensors[name] = get_2d_sincos_pos_embed(dim, size, base_size=base, output_type="pt").float()
            continue
        embed = PatchEmbed(height=base, width=base, patch_size=1, in_channels=1, embed_dim=dim,
                           pos_embed_max_size=size)
        tensors[name] = embed.cropped_pos_embed(h, w)[0]
    save("sd35_pos_embed.safetensors", tensors, {"cases": cases})


PARTS = ["sd35_transformer", "sd35_pos_embed"]
