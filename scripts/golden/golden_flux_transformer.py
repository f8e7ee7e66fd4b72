"""FLUX.1's transformer (FluxTransformer2DModel), tiny and random: dev (guidance embedder) and schnell.
Run: scripts/golden/make_golden.py flux_transformer
"""
import os

import torch

from make_golden import OUT, perturb_norms, save

PARTS = ["flux_transformer"]

CONFIG = dict(patch_size=1, in_channels=64, out_channels=None, num_layers=2, num_single_layers=2,
              attention_head_dim=16, num_attention_heads=3, joint_attention_dim=32, pooled_projection_dim=24,
              axes_dims_rope=(4, 6, 6))


def ids(grid_h, grid_w, tokens):
    """FluxPipeline's position ids: zeros for the text, (0, row, col) for the packed latents."""
    img = torch.zeros(grid_h, grid_w, 3)
    img[..., 1] = torch.arange(grid_h)[:, None]
    img[..., 2] = torch.arange(grid_w)[None, :]
    return torch.zeros(tokens, 3), img.reshape(grid_h * grid_w, 3)


def flux_transformer():
    """Two double-stream and two single-stream blocks, 3 heads of 16 (an odd count, for tp3 and
    ring3), a 3-axis RoPE of (4, 6, 6). The weights are rounded to fp16 and stored so (half the
    bytes); the fp32 outputs are computed from the same rounded values. Cases per variant: a batch of
    2 on a 3 x 5 grid with 7 text tokens (fp32), and for dev the same inputs in bf16 (diffusers' bf16
    output, and its fp32 output, to size the tolerance). The qk-norm weights are scaled up so that
    attention is far from uniform and a wrong rotation moves the output well past the tolerance."""
    from diffusers import FluxTransformer2DModel

    for variant, guidance_embeds, seed in (("dev", True, 40), ("schnell", False, 41)):
        config = dict(CONFIG, guidance_embeds=guidance_embeds)
        torch.manual_seed(seed)
        model = FluxTransformer2DModel(**config).eval()
        perturb_norms(model)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n.endswith(("norm_q.weight", "norm_k.weight", "norm_added_q.weight", "norm_added_k.weight")):
                    p.mul_(1.5)
                p.copy_(p.half().float())
        model.half().save_pretrained(os.path.join(OUT, f"flux_transformer_{variant}"), safe_serialization=True)
        model.float()
        g = torch.Generator().manual_seed(seed + 100)
        batch, grid_h, grid_w, tokens = 2, 3, 5, 7
        latents = torch.randn(batch, grid_h * grid_w, config["in_channels"], generator=g)
        text = torch.randn(batch, tokens, config["joint_attention_dim"], generator=g)
        pooled = torch.randn(batch, config["pooled_projection_dim"], generator=g)
        timestep = torch.tensor([0.999, 0.33325])
        guidance = torch.tensor([3.5, 2.0]) if guidance_embeds else None
        txt_ids, img_ids = ids(grid_h, grid_w, tokens)

        def run(dtype):
            m = model.to(dtype)
            with torch.no_grad():
                return m(hidden_states=latents.to(dtype), encoder_hidden_states=text.to(dtype),
                         pooled_projections=pooled.to(dtype), timestep=timestep.to(dtype), img_ids=img_ids,
                         txt_ids=txt_ids, guidance=guidance, return_dict=False)[0]

        tensors = {"latents": latents, "text": text, "pooled": pooled, "timestep": timestep, "out": run(torch.float32)}
        if guidance is not None:
            tensors["guidance"] = guidance
        meta = {"config": config, "grid": [grid_h, grid_w], "tokens": tokens}
        if variant == "dev":
            # bf16: diffusers' result (stored as fp32, exactly) against which the C++ bf16 run is compared;
            # "out" above is the fp32 result, how far bf16 itself is from it.
            tensors["bf16_out"] = run(torch.bfloat16).float()
            model.float()
            meta["bf16_vs_fp32"] = (tensors["bf16_out"] - tensors["out"]).abs().max().item()
        save(f"flux_transformer_{variant}.safetensors", tensors, meta)
        print(variant, meta)
