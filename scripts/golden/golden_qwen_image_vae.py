"""Golden data for Qwen-Image's VAE decoder (AutoencoderKLQwenImage), from diffusers.

qwen_image_vae: a tiny random AutoencoderKLQwenImage (perturbed RMS-norm gammas, non-trivial
latents_mean / latents_std, temperal_downsample [False, True] so that the decoder's first up block
is an upsample3d with a time_conv) in tests/data/golden/qwen_image_vae/, with a non-square batch
of transformer latents and the image QwenImagePipeline decodes from them in fp32: un-normalised
with the latent statistics, given one frame, decoded, clamped, the frame taken back out; and the
same decode in bf16 (image_bf16).
It also checks, in diffusers itself, the reduction the C++ decoder relies on (Note [one frame
through causal 3-D convolutions]): with one frame, only the last time slice of every causal
kernel and none of the time_conv weights reach the output.
"""
import os

import torch

from make_golden import OUT, perturb_norms, save

CONFIG = dict(base_dim=4, z_dim=16, dim_mult=[1, 2, 2], num_res_blocks=1, attn_scales=[],
              temperal_downsample=[False, True], dropout=0.0)


def _pipeline_decode(vae, latents):
    """As QwenImagePipeline.__call__ decodes its unpacked latents [B, z, h, w]."""
    latents = latents[:, :, None]
    mean = torch.tensor(vae.config.latents_mean).view(1, vae.config.z_dim, 1, 1, 1).to(latents.dtype)
    std = 1.0 / torch.tensor(vae.config.latents_std).view(1, vae.config.z_dim, 1, 1, 1).to(latents.dtype)
    latents = latents / std + mean
    return vae.decode(latents, return_dict=False)[0][:, :, 0]


def _make(config):
    from diffusers import AutoencoderKLQwenImage

    torch.manual_seed(12)
    vae = AutoencoderKLQwenImage(**config).eval()
    perturb_norms(vae)
    with torch.no_grad():
        vae.decoder.conv_out.weight.mul_(6.0)  # so that the final clamp to [-1, 1] is reached
    return vae


def randomize_beyond_one_frame(module):
    """Large random values for what one frame never reaches: every causal kernel's earlier time slices
    and the time_conv weights (the decoder's and the encoder's)."""
    from diffusers.models.autoencoders.autoencoder_kl_qwenimage import QwenImageCausalConv3d

    for name, m in module.named_modules():
        if isinstance(m, QwenImageCausalConv3d):
            if "time_conv" in name:
                m.weight.normal_(0, 10.0)
                m.bias.normal_(0, 10.0)
            else:
                m.weight[:, :, :-1].normal_(0, 10.0)


def qwen_image_vae():
    g = torch.Generator().manual_seed(11)
    config = dict(CONFIG)
    config["latents_mean"] = (torch.randn(16, generator=g) * 0.5).tolist()
    config["latents_std"] = (torch.rand(16, generator=g) * 2.0 + 0.5).tolist()
    vae = _make(config)
    latents = torch.randn(2, 16, 5, 7, generator=g)
    with torch.no_grad():
        image = _pipeline_decode(vae, latents)
        # The one-frame reduction: earlier kernel time slices and the time_conv do not matter.
        randomize_beyond_one_frame(vae.decoder)
        assert torch.equal(_pipeline_decode(vae, latents), image), "one frame uses more than the last slice"
    vae = _make(config)
    with torch.no_grad():
        assert torch.equal(_pipeline_decode(vae, latents), image), "not reproducible"
    vae.save_pretrained(os.path.join(OUT, "qwen_image_vae"), safe_serialization=True)
    print(f"clamped: {(image.abs() == 1).float().mean():.2f} of the image")
    with torch.no_grad():  # the same in bf16, weights and latents (its RMS norms normalise in fp32)
        image_bf16 = _pipeline_decode(vae.to(torch.bfloat16), latents.to(torch.bfloat16)).float()
    save("qwen_image_vae.safetensors", {"latents": latents, "image": image, "image_bf16": image_bf16},
         {"config": config})


PARTS = ["qwen_image_vae"]
