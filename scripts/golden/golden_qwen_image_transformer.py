"""Qwen-Image's transformer (QwenImageTransformer2DModel), tiny and random, for text-to-image.
Run: scripts/golden/make_golden.py qwen_image_transformer
"""
import os

import torch

from make_golden import OUT, perturb_norms, save

PARTS = ["qwen_image_transformer"]


def qwen_image_transformer():
    """Two dual-stream blocks, 2 heads of 16 with a 3-axis RoPE of (4, 6, 6), packed 2 x 2
    latents of 16 channels. Cases: a batch of 2 whose text rows have 6 and 3 real tokens of 7
    (padding at the end, as the pipeline pads) on a 3 x 5 patch grid; the same without a mask; and
    one prompt on a 4 x 4 grid with 5 tokens and no mask. The qk-norm weights are scaled up so that
    attention is far from uniform and a wrong rotation or mask moves the output well past the tolerance."""
    from diffusers import QwenImageTransformer2DModel

    config = dict(patch_size=2, in_channels=64, out_channels=16, num_layers=2, attention_head_dim=16,
                  num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=(4, 6, 6))
    torch.manual_seed(30)
    model = QwenImageTransformer2DModel(**config).eval()
    perturb_norms(model)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith(("norm_q.weight", "norm_k.weight", "norm_added_q.weight", "norm_added_k.weight")):
                p.mul_(1.5)
    model.save_pretrained(os.path.join(OUT, "qwen_image_transformer"), safe_serialization=True)
    g = torch.Generator().manual_seed(31)
    tensors, cases = {}, {}

    def run(name, batch, grid_h, grid_w, tokens, lengths, timestep):
        latents = torch.randn(batch, grid_h * grid_w, config["in_channels"], generator=g)
        text = torch.randn(batch, tokens, config["joint_attention_dim"], generator=g)
        mask = None
        if lengths is not None:
            mask = torch.zeros(batch, tokens, dtype=torch.int64)
            for row, n in enumerate(lengths):
                mask[row, :n] = 1
        t = torch.tensor(timestep)
        with torch.no_grad():
            out = model(hidden_states=latents, encoder_hidden_states=text, encoder_hidden_states_mask=mask,
                        timestep=t, img_shapes=[(1, grid_h, grid_w)] * batch, return_dict=False)[0]
        tensors.update({f"{name}.latents": latents, f"{name}.text": text, f"{name}.timestep": t,
                        f"{name}.out": out})
        if mask is not None:
            tensors[f"{name}.mask"] = mask
        cases[name] = {"grid": [grid_h, grid_w], "tokens": tokens, "lengths": lengths}

    run("masked", 2, 3, 5, 7, [6, 3], [0.999, 0.33325])
    # The masked case's inputs without the mask: the padding then counts, and the output differs.
    with torch.no_grad():
        tensors["unmasked.out"] = model(hidden_states=tensors["masked.latents"],
                                        encoder_hidden_states=tensors["masked.text"],
                                        timestep=tensors["masked.timestep"], img_shapes=[(1, 3, 5)] * 2,
                                        return_dict=False)[0]
    cases["unmasked"] = {"grid": [3, 5], "tokens": 7, "lengths": None}
    run("square", 1, 4, 4, 5, None, [0.5])
    save("qwen_image_transformer.safetensors", tensors, {"config": config, "cases": cases})
