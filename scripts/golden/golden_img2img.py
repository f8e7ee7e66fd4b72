"""Edits (img2img) as diffusers' StableDiffusion3Img2ImgPipeline, FluxImg2ImgPipeline and
QwenImageImg2ImgPipeline run them, from the shipped tiny random folders (models/tiny-random-sd3,
models/tiny-random-flux-dev, models/tiny-random-qwen-image); inpainting as FluxInpaintPipeline and
QwenImageInpaintPipeline do; FluxFillPipeline and FluxKontextPipeline from tiny folders made here
(models/tiny-random-flux-fill: its own transformer of 384 input channels; models/tiny-random-flux-
kontext: the dev folder's weights; both link the dev folder's other components); SD3's inpainting
from models/tiny-random-sd3-16ch (a VAE and transformer of 16 latent channels, made here).

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
    # Masks of their images' sizes (padding_mask_crop pastes back through them): a block off-centre
    # with a soft edge.
    for name, (w, h), box in [("mask_48x32.png", (48, 32), (30, 6, 42, 19)), ("mask_32x32.png", (32, 32), (4, 18, 13, 29))]:
        grey = np.zeros((h, w), dtype=np.uint8)
        x0, y0, x1, y1 = box
        grey[y0:y1, x0:x1] = 255
        grey[y0 - 1, x0:x1] = 100
        path = os.path.join(INPUTS, name)
        Image.fromarray(grey).save(path, "PNG")
        made[name] = os.path.relpath(path, ROOT)
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
                                3, 0.7, 4.0, 32, 32),
           # SD3 blends a mask only for a transformer of 16 latent channels: the 16-channel folder.
           "sd3_png_inpaint": ("tiny-random-sd3-16ch", "in_32x32.png", "mask_24x16.png", "a red fox in the snow", "",
                               61, 4, 0.8, 5.0, 32, 32),
           "sd3_jpeg_inpaint_full": ("tiny-random-sd3-16ch", "in_37x23.jpg", "mask_24x16.png", "a blue square",
                                     "blurry", 67, 3, 1.0, 4.0, 32, 24)}

# Inpainting on the mask's region (padding_mask_crop), the mask of the image's size; the image made
# is the input's size. name: (folder, image, mask, prompt, negative_prompt, seed, steps, strength,
# guidance, width, height, padding_mask_crop)
CROPPED = {"flux_png_inpaint_crop": ("tiny-random-flux-dev", "in_48x32.png", "mask_48x32.png", "a cat on a sofa", None,
                                     71, 3, 0.9, 3.5, 32, 32, 4),
           "qwen_png_inpaint_crop": ("tiny-random-qwen-image", "in_32x32.png", "mask_32x32.png", "a red fox", "blurry",
                                     73, 3, 0.8, 4.0, 32, 24, 2),
           "sd3_png_inpaint_crop": ("tiny-random-sd3-16ch", "in_32x32.png", "mask_32x32.png", "a blue square", "", 79,
                                    3, 1.0, 5.0, 24, 24, 0)}


def _sd3_16_folder():
    """models/tiny-random-sd3-16ch: tiny-random-sd3 with a VAE and transformer of 16 latent channels
    (as every released SD3), which StableDiffusion3InpaintPipeline needs to blend a mask; its text
    encoders, tokenizers and scheduler are links to tiny-random-sd3's."""
    import json
    import shutil

    from diffusers import AutoencoderKL, SD3Transformer2DModel

    from make_golden import perturb_norms

    base = os.path.join(ROOT, "models", "tiny-random-sd3")
    path = os.path.join(ROOT, "models", "tiny-random-sd3-16ch")
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    shutil.copy(os.path.join(base, "model_index.json"), os.path.join(path, "model_index.json"))
    for component in ("scheduler", "text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2"):
        os.symlink(os.path.join("..", "tiny-random-sd3", component), os.path.join(path, component))
    with open(os.path.join(base, "transformer", "config.json")) as f:
        config = {k: v for k, v in json.load(f).items() if not k.startswith("_")}
    torch.manual_seed(63)
    transformer = SD3Transformer2DModel(**dict(config, in_channels=16, out_channels=16)).eval()
    vae = AutoencoderKL(sample_size=32, in_channels=3, out_channels=3, block_out_channels=(8,), layers_per_block=1,
                        latent_channels=16, norm_num_groups=4, use_quant_conv=False, use_post_quant_conv=False,
                        scaling_factor=1.5305, shift_factor=0.0609, down_block_types=("DownEncoderBlock2D",),
                        up_block_types=("UpDecoderBlock2D",)).eval()
    for model in (transformer, vae):
        perturb_norms(model)
    transformer.save_pretrained(os.path.join(path, "transformer"), safe_serialization=True)
    vae.save_pretrained(os.path.join(path, "vae"), safe_serialization=True)


# FluxFillPipeline (image and mask required; strength 1 by default) and FluxKontextPipeline (the
# image a reference at its preferred resolution; the asked size scaled to max_area; text to image
# without an image). name, folder, image, mask, prompt, negative_prompt, seed, steps, strength,
# guidance_scale, true_cfg_scale, width, height, max_area
EDITS = [
    ("fill_png", "tiny-random-flux-fill", "in_48x32.png", "mask_24x16.png", "a cat on a sofa", None, 41, 3, 1.0,
     30.0, None, 48, 32, None),
    ("fill_jpeg_resized", "tiny-random-flux-fill", "in_37x23.jpg", "mask_24x16.png", "an old lighthouse", None, 43,
     4, 0.6, 10.0, None, 32, 32, None),
    ("kontext_png", "tiny-random-flux-kontext", "in_48x32.png", None, "make it winter", None, 47, 3, None, 3.5, 1.0,
     48, 32, 48 * 32),
    ("kontext_jpeg_cfg", "tiny-random-flux-kontext", "in_37x23.jpg", None, "add a hat", "blurry", 53, 2, None, 2.5,
     2.0, 40, 24, 2000),
    ("kontext_text", "tiny-random-flux-kontext", None, None, "a red fox", None, 59, 3, None, 3.5, 1.0, 32, 32,
     32 * 32),
]
FILL_AND_KONTEXT = {"tiny-random-flux-fill": "FluxFillPipeline", "tiny-random-flux-kontext": "FluxKontextPipeline"}


def _fill_and_kontext_folders():
    """The two folders: model_index.json of their class; Fill's transformer of its own (in_channels 16
    x 4 latents + 16 x 4 masked image + 8 x 8 x 4 mask = 384); every other component a link to the dev
    folder's, so the repository holds those weights once."""
    import json
    import shutil

    from diffusers import FluxTransformer2DModel

    from make_golden import perturb_norms

    dev = os.path.join(ROOT, "models", "tiny-random-flux-dev")
    with open(os.path.join(dev, "model_index.json")) as f:
        index = json.load(f)
    for folder, cls in FILL_AND_KONTEXT.items():
        path = os.path.join(ROOT, "models", folder)
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path)
        with open(os.path.join(path, "model_index.json"), "w") as f:
            json.dump(dict(index, _class_name=cls), f, indent=2, sort_keys=True)
            f.write("\n")
        for component in ("scheduler", "text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2", "vae",
                          "transformer"):
            if folder == "tiny-random-flux-fill" and component == "transformer":
                continue
            os.symlink(os.path.join("..", "tiny-random-flux-dev", component), os.path.join(path, component))
    torch.manual_seed(62)
    transformer = FluxTransformer2DModel(patch_size=1, in_channels=384, out_channels=64, num_layers=2,
                                         num_single_layers=2, attention_head_dim=16, num_attention_heads=4,
                                         joint_attention_dim=32, pooled_projection_dim=32, guidance_embeds=True,
                                         axes_dims_rope=(4, 6, 6)).eval()
    perturb_norms(transformer)
    with torch.no_grad():
        transformer.proj_out.weight.mul_(4.0)  # noise predictions of a useful size, as the dev folder's
        transformer.proj_out.bias.mul_(4.0)
    transformer.save_pretrained(os.path.join(ROOT, "models", "tiny-random-flux-fill", "transformer"),
                                safe_serialization=True)


def _fill_and_kontext(inputs, tensors, meta):
    import diffusers
    from diffusers.utils import load_image

    _fill_and_kontext_folders()
    pipes = {}
    for folder, cls in FILL_AND_KONTEXT.items():
        pipes[folder] = getattr(diffusers, cls).from_pretrained(os.path.join(ROOT, "models", folder))
        pipes[folder].set_progress_bar_config(disable=True)
    for (name, folder, image_name, mask_name, prompt, negative, seed, steps, strength, guidance, true_cfg, width,
         height, max_area) in EDITS:
        kwargs = dict(prompt=prompt, num_inference_steps=steps, width=width, height=height,
                      guidance_scale=guidance, max_sequence_length=32)
        m = dict(folder="models/" + folder, variant=folder.rsplit("-", 1)[1], prompt=prompt, negative_prompt=negative, seed=seed, steps=steps,
                 guidance_scale=guidance, max_sequence_length=32, asked_width=width, asked_height=height)
        if image_name is not None:
            kwargs["image"] = load_image(os.path.join(ROOT, inputs[image_name]))
            m["image"] = inputs[image_name]
        if mask_name is not None:
            kwargs["mask_image"] = load_image(os.path.join(ROOT, inputs[mask_name]))
            m["mask_image"] = inputs[mask_name]
        if strength is not None:
            kwargs["strength"] = m["strength"] = strength
        if true_cfg is not None:
            kwargs["true_cfg_scale"] = m["true_cfg_scale"] = true_cfg
        if negative is not None:
            kwargs["negative_prompt"] = negative
        if max_area is not None:
            kwargs["max_area"] = m["max_area"] = max_area
        gens = lambda: [torch.Generator("cpu").manual_seed(seed)]  # noqa: E731
        image = pipes[folder](**kwargs, generator=gens(), output_type="np").images[0]
        latents = pipes[folder](**kwargs, generator=gens(), output_type="latent").images[0]
        tensors[f"{name}.image"] = torch.from_numpy((image * 255).round().astype(np.uint8))
        tensors[f"{name}.latents"] = latents.float()
        # The size made (Kontext's scaled to max_area), which a request carries.
        m["height"], m["width"] = image.shape[0], image.shape[1]
        meta[name] = m


def img2img_pipelines():
    from diffusers import (FluxImg2ImgPipeline, FluxInpaintPipeline, QwenImageImg2ImgPipeline,
                           QwenImageInpaintPipeline, StableDiffusion3Img2ImgPipeline, StableDiffusion3InpaintPipeline)
    from diffusers.utils import load_image

    inputs = _inputs()
    classes = {"tiny-random-sd3": StableDiffusion3Img2ImgPipeline, "tiny-random-flux-dev": FluxImg2ImgPipeline,
               "tiny-random-qwen-image": QwenImageImg2ImgPipeline}
    pipes = {}
    keys = ["name", "folder", "image", "prompt", "negative_prompt", "seed", "steps", "strength", "guidance_scale",
            "width", "height"]
    tensors, meta = {}, {}
    inpaint = {"tiny-random-flux-dev": FluxInpaintPipeline, "tiny-random-qwen-image": QwenImageInpaintPipeline,
               "tiny-random-sd3-16ch": StableDiffusion3InpaintPipeline}
    _sd3_16_folder()
    cases = [(c, None, None) for c in CASES]
    cases += [((name,) + c[:2] + c[3:], c[2], None) for name, c in INPAINT.items()]
    cases += [((name,) + c[:2] + c[3:-1], c[2], c[-1]) for name, c in CROPPED.items()]
    for case, mask_name, pad in cases:
        name, folder, image_name, prompt, negative, seed, steps, strength, guidance, width, height = case
        if mask_name is not None:
            if ("inpaint", folder) not in pipes:
                none = dict(text_encoder_3=None, tokenizer_3=None) if folder.startswith("tiny-random-sd3") else {}
                pipes[("inpaint", folder)] = inpaint[folder].from_pretrained(os.path.join(ROOT, "models", folder),
                                                                             **none)
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
        if pad is not None:  # a PIL image only (diffusers refuses other outputs): no latents
            kwargs["padding_mask_crop"] = pad
            tensors[f"{name}.image"] = torch.from_numpy(np.asarray(pipe(**kwargs, generator=gens()).images[0]).copy())
        else:
            image = pipe(**kwargs, generator=gens(), output_type="np").images[0]
            latents = pipe(**kwargs, generator=gens(), output_type="latent").images[0]
            tensors[f"{name}.image"] = torch.from_numpy((image * 255).round().astype(np.uint8))
            tensors[f"{name}.latents"] = latents.float()
        meta[name] = dict(zip(keys, case), image=inputs[image_name], folder="models/" + folder)
        if pad is not None:
            meta[name]["padding_mask_crop"] = pad
        if qwen:
            meta[name]["true_cfg_scale"] = meta[name].pop("guidance_scale")
        if mask_name is not None:
            meta[name]["mask_image"] = inputs[mask_name]
        if "max_sequence_length" in kwargs:
            meta[name]["max_sequence_length"] = kwargs["max_sequence_length"]
    _fill_and_kontext(inputs, tensors, meta)
    save("img2img_pipeline.safetensors", tensors, meta)
