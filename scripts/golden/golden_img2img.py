"""Edits (img2img) as diffusers' StableDiffusion3Img2ImgPipeline, FluxImg2ImgPipeline and
QwenImageImg2ImgPipeline run them, from the shipped tiny random folders (models/tiny-random-sd3,
models/tiny-random-flux-dev, models/tiny-random-qwen-image).

Input images are written to tests/data/golden/img2img/: a PNG at the output size and a JPEG of
another size (resized by VaeImageProcessor, PIL's Lanczos), each read as diffusers.utils.load_image
reads it. Cases at strength 0.6 (the pipelines' default) and 1.0; one request per call, each with
its own generator (torch.Generator("cpu").manual_seed(seed)). Each case names its folder, input
(repository-relative) and call; the tensors are NAME.image (uint8 HxWx3) and NAME.latents.
"""
import os

import numpy as np
import torch

from make_golden import OUT, save

PARTS = ["img2img_pipelines"]

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
INPUTS = os.path.join(OUT, "img2img")


def _inputs():
    """A smooth picture with edges (so that resizing and the encoder both matter), as PNG and JPEG."""
    from PIL import Image

    os.makedirs(INPUTS, exist_ok=True)
    made = {}
    for name, (w, h), fmt in [("in_32x32.png", (32, 32), "PNG"), ("in_48x32.png", (48, 32), "PNG"),
                              ("in_37x23.jpg", (37, 23), "JPEG"), ("in_50x41.png", (50, 41), "PNG")]:
        y, x = np.mgrid[0:h, 0:w]
        rgb = np.stack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)),
                        ((x // 5 + y // 4) % 2) * 200 + 25], axis=-1).astype(np.uint8)
        path = os.path.join(INPUTS, name)
        Image.fromarray(rgb).save(path, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
        made[name] = os.path.relpath(path, ROOT)
    # A mask of another size (resized with the image): white on the left, black on the right, and
    # a band of 127 and 128 between (binarized to 0 and 1).
    mask = np.zeros((16, 24), dtype=np.uint8)
    mask[:, :10] = 255
    mask[:, 10:12] = 128
    mask[:, 12:14] = 127
    mask[3:6, 16:20] = 200
    path = os.path.join(INPUTS, "mask_24x16.png")
    Image.fromarray(np.stack([mask] * 3, axis=-1)).save(path, "PNG")
    made["mask_24x16.png"] = os.path.relpath(path, ROOT)
    return made


CASES = [
    # name, folder, input, prompt, negative_prompt, seed, steps, strength, guidance_scale, width, height
    ("sd3_png", "tiny-random-sd3", "in_32x32.png", "a red fox in the snow", "", 3, 4, 0.6, 5.0, 32, 32),
    ("sd3_jpeg_resized", "tiny-random-sd3", "in_37x23.jpg", "a blue square", "blurry", 5, 3, 1.0, 4.0, 32, 24),
    ("sd3_half", "tiny-random-sd3", "in_50x41.png", "three green dots", "", 7, 5, 0.5, 1.0, 40, 32),
    ("flux_png", "tiny-random-flux-dev", "in_48x32.png", "a cat on a sofa", None, 11, 4, 0.6, 3.5, 48, 32),
    ("flux_jpeg_resized", "tiny-random-flux-dev", "in_37x23.jpg", "an old lighthouse", None, 13, 3, 1.0, 3.5, 32,
     32),
    ("flux_png_resized", "tiny-random-flux-dev", "in_50x41.png", "a bowl of ramen", None, 17, 5, 0.7, 7.0, 48, 48),
    # Qwen-Image: its guidance is true_cfg_scale, with a negative prompt
    ("qwen_png", "tiny-random-qwen-image", "in_32x32.png", "a red fox", "blurry", 19, 3, 0.6, 4.0, 32, 32),
    ("qwen_jpeg_resized", "tiny-random-qwen-image", "in_37x23.jpg", "three green dots", None, 23, 4, 1.0, 1.0, 40,
     28),
]
# Inpainting: the same, with a mask (FluxInpaintPipeline, QwenImageInpaintPipeline).
INPAINT = {"flux_png_inpaint": ("tiny-random-flux-dev", "in_48x32.png", "mask_24x16.png", "a cat on a sofa", None,
                                29, 4, 0.8, 3.5, 48, 32),
           "flux_jpeg_inpaint_full": ("tiny-random-flux-dev", "in_37x23.jpg", "mask_24x16.png", "an old lighthouse",
                                      None, 31, 3, 1.0, 3.5, 32, 32),
           "qwen_png_inpaint": ("tiny-random-qwen-image", "in_32x32.png", "mask_24x16.png", "a red fox", "blurry", 37,
                                3, 0.7, 4.0, 32, 32)}


def img2img_pipelines():
    from diffusers import (FluxImg2ImgPipeline, FluxInpaintPipeline, QwenImageImg2ImgPipeline,
                           QwenImageInpaintPipeline, StableDiffusion3Img2ImgPipeline)
    from diffusers.utils import load_image

    inputs = _inputs()
    classes = {"tiny-random-sd3": StableDiffusion3Img2ImgPipeline, "tiny-random-flux-dev": FluxImg2ImgPipeline,
               "tiny-random-qwen-image": QwenImageImg2ImgPipeline}
    pipes = {}
    keys = ["name", "folder", "image", "prompt", "negative_prompt", "seed", "steps", "strength", "guidance_scale",
            "width", "height"]
    tensors, meta = {}, {}
    inpaint = {"tiny-random-flux-dev": FluxInpaintPipeline, "tiny-random-qwen-image": QwenImageInpaintPipeline}
    cases = [(c, None) for c in CASES]
    cases += [((name,) + c[:2] + c[3:], c[2]) for name, c in INPAINT.items()]
    for case, mask_name in cases:
        name, folder, image_name, prompt, negative, seed, steps, strength, guidance, width, height = case
        if mask_name is not None:
            if ("inpaint", folder) not in pipes:
                pipes[("inpaint", folder)] = inpaint[folder].from_pretrained(os.path.join(ROOT, "models", folder))
                pipes[("inpaint", folder)].set_progress_bar_config(disable=True)
        elif folder not in pipes:
            # The folder without the optional components it leaves out (SD3 without T5).
            none = dict(text_encoder_3=None, tokenizer_3=None) if folder == "tiny-random-sd3" else {}
            pipes[folder] = classes[folder].from_pretrained(os.path.join(ROOT, "models", folder), **none)
            pipes[folder].set_progress_bar_config(disable=True)
        pipe = pipes[("inpaint", folder) if mask_name else folder]
        qwen = folder == "tiny-random-qwen-image"
        scale = "true_cfg_scale" if qwen else "guidance_scale"
        kwargs = dict(prompt=prompt, image=load_image(os.path.join(ROOT, inputs[image_name])), strength=strength,
                      num_inference_steps=steps, width=width, height=height, **{scale: guidance})
        if negative is not None:
            kwargs["negative_prompt"] = negative
        if mask_name is not None:
            kwargs["mask_image"] = load_image(os.path.join(ROOT, inputs[mask_name]))
        if folder == "tiny-random-flux-dev":
            kwargs["max_sequence_length"] = 32
        gens = lambda: [torch.Generator("cpu").manual_seed(seed)]  # noqa: E731
        image = pipe(**kwargs, generator=gens(), output_type="np").images[0]
        latents = pipe(**kwargs, generator=gens(), output_type="latent").images[0]
        tensors[f"{name}.image"] = torch.from_numpy((image * 255).round().astype(np.uint8))
        tensors[f"{name}.latents"] = latents.float()
        meta[name] = dict(zip(keys, case), image=inputs[image_name], folder="models/" + folder)
        if qwen:
            meta[name]["true_cfg_scale"] = meta[name].pop("guidance_scale")
        if mask_name is not None:
            meta[name]["mask_image"] = inputs[mask_name]
        if "max_sequence_length" in kwargs:
            meta[name]["max_sequence_length"] = kwargs["max_sequence_length"]
    save("img2img_pipeline.safetensors", tensors, meta)
