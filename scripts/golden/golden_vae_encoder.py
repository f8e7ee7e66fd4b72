"""Golden data for the VAE encoders (img2img and inpainting), from diffusers.

vae_encoder: seeded image batches in [-1, 1] (2 images, 32x32 and a non-square 32 high, 48 wide)
encoded by vae.encode of the shipped tiny models' VAEs (AutoencoderKL of tiny-random-sd3 and
tiny-random-flux-dev, AutoencoderKLQwenImage of tiny-random-qwen-image) and of two golden test
VAEs with what those lack: vae_up (quant_conv, a channel change with a shortcut conv, perturbed
norms) and qwen_image_vae (a downsample2d block then a downsample3d one, a shortcut conv). Each
is loaded with from_pretrained, read only. Saved: the images, and latent_dist.mean and .std for
each folder and size (Qwen-Image's as diffusers returns them, [B, z_dim, 1, h, w]).
It also checks, in diffusers itself, the reduction the C++ Qwen-Image encoder relies on (Note [one
frame through causal 3-D convolutions]): for one frame, only the last time slice of every causal
kernel reaches the latents, and no downsample3d time_conv weight does.
"""
import os

import torch

from golden_qwen_image_vae import randomize_beyond_one_frame
from make_golden import OUT, save

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")

# row name -> (folder under the checkout, class)
FOLDERS = {
    "sd3": ("models/tiny-random-sd3/vae", "AutoencoderKL"),
    "flux_dev": ("models/tiny-random-flux-dev/vae", "AutoencoderKL"),
    "qwen_image": ("models/tiny-random-qwen-image/vae", "AutoencoderKLQwenImage"),
    "vae_up": ("tests/data/golden/vae_up", "AutoencoderKL"),
    "qwen_image_vae": ("tests/data/golden/qwen_image_vae", "AutoencoderKLQwenImage"),
}
SIZES = {"h32_w32": (32, 32), "h32_w48": (32, 48)}  # height, width


def _encode(vae, images, qwen):
    dist = vae.encode(images[:, :, None] if qwen else images).latent_dist
    return dist.mean, dist.std


def _check_one_frame(vae, images):
    """Randomising every earlier kernel slice and the time_conv weights leaves the latents as they were."""
    mean, std = _encode(vae, images, True)
    randomize_beyond_one_frame(vae.encoder)
    again = _encode(vae, images, True)
    assert torch.equal(again[0], mean) and torch.equal(again[1], std), "one frame uses more than the last slice"


def vae_encoder():
    import diffusers

    tensors, meta = {}, {"folders": FOLDERS, "sizes": SIZES}
    images = {}
    for i, (size, (h, w)) in enumerate(SIZES.items()):
        torch.manual_seed(20 + i)
        images[size] = torch.rand(2, 3, h, w) * 2 - 1
        tensors[f"image.{size}"] = images[size]
    for row, (folder, cls) in FOLDERS.items():
        qwen = cls == "AutoencoderKLQwenImage"
        for size, image in images.items():
            vae = getattr(diffusers, cls).from_pretrained(os.path.join(ROOT, folder)).eval()
            with torch.no_grad():
                mean, std = _encode(vae, image, qwen)
                tensors[f"{row}.{size}.mean"], tensors[f"{row}.{size}.std"] = mean, std
                if qwen:
                    _check_one_frame(vae, image)
            print(f"{row} {size}: mean {tuple(mean.shape)}, std from {std.min():.3g} to {std.max():.3g}")
    save("vae_encoder.safetensors", tensors, meta)


PARTS = ["vae_encoder"]
