"""Qwen-Image-Edit as diffusers 0.42.1 runs it (QwenImageEditPipeline, QwenImageEditPlusPipeline) with
transformers 5.24's Qwen2-VL image processor (its PIL backend: torchvision is absent) and the
Qwen2.5-VL vision tower, from tiny random folders made here.

qwen_edit writes:

- models/tiny-random-qwen-image-edit/ (QwenImageEditPipeline): scheduler, transformer and tokenizer
  are links to tiny-random-qwen-image's; its own text_encoder, a Qwen2_5_VLForConditionalGeneration
  whose language model is tiny-random-qwen-image's (same config, weights copied) and whose vision
  tower is new and random (RGB, patch 2, temporal patch 2, merge 2, width 16, 2 heads, depth 3 with
  block 1 of full attention, windows of 5 x 5 merged tokens; perturbed norms, q and k scaled so that
  attention is far from uniform); its own vae, an AutoencoderKLQwenImage of three downsamplings
  (vae_scale_factor 8, as the real Wan VAE), since the pipeline always encodes its reference at about
  1024 x 1024 and tiny-random-qwen-image's VAE of one downsampling would give 65536 reference tokens
  and a VAE attention over 262144 positions; and processor/: the image processor's
  preprocessor_config.json (patch 2, merge 2, temporal patch 2, size shortest_edge 64 / longest_edge
  2304 pixels, CLIP mean and std) with the tokenizer's files as links to ../tokenizer/.
- models/tiny-random-qwen-image-edit-plus/ (QwenImageEditPlusPipeline): every component a link to
  the Edit folder's.
- models/tiny-random-qwen-image-edit-2511/ (QwenImageEditPlusPipeline): the same, but its
  transformer's config says zero_cond_t true (the weights file a link to tiny-random-qwen-image's:
  zero_cond_t adds no weights, it modulates the reference tokens at timestep 0).
- tests/data/golden/qwen_edit.safetensors: the processor's pixel_values and image_grid_thw, the
  vision tower's merged image embeddings, the text encoder's hidden_states[-1] with the processor's
  mm_token_type_ids passed (3-section M-RoPE positions) and without them (sequential positions: what
  diffusers 0.42.1 ships, since it does not pass them), get_rope_index's positions, and pipeline
  images (NAME.image uint8 HxWx3, NAME.latents) with both kinds of positions. Every case is
  described in the file's metadata.

Transformers 5.24 cannot build a Qwen2VLProcessor without a video processor, which needs
torchvision; so Qwen2VLProcessor.from_pretrained (and with it the pipelines' from_pretrained) fails
here. load_processor() builds it from the folder's files without one, and the pipelines get it as
processor=. Input images are golden_img2img's (tests/data/golden/img2img/).
"""
import json
import os
import shutil
import time

import numpy as np
import torch

from make_golden import perturb_norms, save

PARTS = ["qwen_edit"]

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
MODELS = os.path.join(ROOT, "models")
BASE = "tiny-random-qwen-image"
EDIT = "tiny-random-qwen-image-edit"
PLUS = "tiny-random-qwen-image-edit-plus"
E2511 = "tiny-random-qwen-image-edit-2511"
CLASSES = {EDIT: "QwenImageEditPipeline", PLUS: "QwenImageEditPlusPipeline", E2511: "QwenImageEditPlusPipeline"}
IMAGE_TOKEN, VIDEO_TOKEN, VISION_START, VISION_END = 1102, 1103, 1099, 1100
PROCESSOR = dict(patch_size=2, merge_size=2, temporal_patch_size=2, size={"shortest_edge": 64, "longest_edge": 2304})
VISION = dict(depth=3, hidden_size=16, intermediate_size=24, num_heads=2, out_hidden_size=64, patch_size=2,
              spatial_merge_size=2, temporal_patch_size=2, window_size=20, fullatt_block_indexes=[1], in_channels=3,
              hidden_act="silu")


def _link(target, path):
    if os.path.lexists(path):
        os.remove(path)
    os.symlink(target, path)


def _write_index(folder, cls, components):
    with open(os.path.join(MODELS, BASE, "model_index.json")) as f:
        index = json.load(f)
    index = {k: v for k, v in index.items() if k.startswith("_") or k in components}
    index.update(_class_name=cls, processor=["transformers", "Qwen2VLProcessor"])
    with open(os.path.join(MODELS, folder, "model_index.json"), "w") as f:
        json.dump(index, f, indent=2, sort_keys=True)
        f.write("\n")


def _text_encoder():
    """tiny-random-qwen-image's language model with an RGB vision tower of merge size 2."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    base = Qwen2_5_VLForConditionalGeneration.from_pretrained(os.path.join(MODELS, BASE, "text_encoder"),
                                                              dtype=torch.float32)
    text = base.config.text_config.to_dict()
    torch.manual_seed(80)
    config = Qwen2_5_VLConfig(text_config=text, vision_config=VISION, image_token_id=IMAGE_TOKEN,
                              video_token_id=VIDEO_TOKEN, vision_start_token_id=VISION_START,
                              vision_end_token_id=VISION_END)
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    model.model.language_model.load_state_dict(base.model.language_model.state_dict())
    model.lm_head.load_state_dict(base.lm_head.state_dict())
    visual = model.model.visual
    perturb_norms(visual)
    with torch.no_grad():
        visual.merger.ln_q.weight.add_(torch.randn_like(visual.merger.ln_q.weight) * 0.1)
        d = VISION["hidden_size"]
        for block in visual.blocks:
            block.attn.qkv.weight[: 2 * d].mul_(35.0)  # q and k: attention far from uniform
            block.attn.qkv.bias.copy_(torch.randn_like(block.attn.qkv.bias) * 0.3)
        visual.merger.mlp[2].weight.mul_(4.0)  # image embeddings of the text embeddings' size or more
    return model


def _vae():
    """Three downsamplings (vae_scale_factor 8, as Wan 2.1's VAE), 4 base channels."""
    from diffusers import AutoencoderKLQwenImage

    torch.manual_seed(81)
    with open(os.path.join(MODELS, BASE, "vae", "config.json")) as f:
        base = json.load(f)
    vae = AutoencoderKLQwenImage(base_dim=4, z_dim=16, dim_mult=[1, 2, 2, 2], num_res_blocks=1, attn_scales=[],
                                 temperal_downsample=[False, True, True], latents_mean=base["latents_mean"],
                                 latents_std=base["latents_std"]).eval()
    perturb_norms(vae)
    with torch.no_grad():
        vae.decoder.conv_out.weight.mul_(4.0)
    return vae


def _folders():
    from diffusers import QwenImageTransformer2DModel
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    for folder in (EDIT, PLUS, E2511):
        shutil.rmtree(os.path.join(MODELS, folder), ignore_errors=True)
        os.makedirs(os.path.join(MODELS, folder))
    components = ["processor", "scheduler", "text_encoder", "tokenizer", "transformer", "vae"]
    edit = os.path.join(MODELS, EDIT)
    for c in ("scheduler", "tokenizer", "transformer"):
        _link(os.path.join("..", BASE, c), os.path.join(edit, c))
    te = _text_encoder()
    te.save_pretrained(os.path.join(edit, "text_encoder"), safe_serialization=True)
    os.remove(os.path.join(edit, "text_encoder", "generation_config.json"))  # not the encoder's
    _vae().save_pretrained(os.path.join(edit, "vae"), safe_serialization=True)
    processor = os.path.join(edit, "processor")
    Qwen2VLImageProcessorPil(**PROCESSOR).save_pretrained(processor)
    for f in sorted(os.listdir(os.path.join(edit, "tokenizer"))):
        _link(os.path.join("..", "tokenizer", f), os.path.join(processor, f))
    _write_index(EDIT, CLASSES[EDIT], components)

    for folder in (PLUS, E2511):
        for c in components:
            if folder == E2511 and c == "transformer":
                continue
            _link(os.path.join("..", EDIT, c), os.path.join(MODELS, folder, c))
        _write_index(folder, CLASSES[folder], components)
    # 2511: the tiny transformer's weights under a config with zero_cond_t (which adds no weights:
    # it must load the base folder's file with nothing missing or left over).
    src = os.path.join(MODELS, BASE, "transformer")
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    assert config["zero_cond_t"] is False
    dst = os.path.join(MODELS, E2511, "transformer")
    os.makedirs(dst)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(dict(config, zero_cond_t=True), f, indent=2, sort_keys=True)
        f.write("\n")
    weights = "diffusion_pytorch_model.safetensors"
    _link(os.path.join("..", "..", BASE, "transformer", weights), os.path.join(dst, weights))
    _, info = QwenImageTransformer2DModel.from_pretrained(dst, output_loading_info=True)
    assert not any(info.values()), info


def load_processor(path):
    """Qwen2VLProcessor from a processor/ folder, without the video processor that transformers 5.24
    cannot build without torchvision (images never need it)."""
    from unittest import mock

    from transformers import AutoImageProcessor, AutoTokenizer, Qwen2VLProcessor
    from transformers.processing_utils import ProcessorMixin

    check = ProcessorMixin.check_argument_for_proper_class

    def lenient(self, name, arg):
        return None if name == "video_processor" and arg is None else check(self, name, arg)

    image_processor = AutoImageProcessor.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    with mock.patch.object(ProcessorMixin, "check_argument_for_proper_class", lenient):
        return Qwen2VLProcessor(image_processor=image_processor, tokenizer=tokenizer, video_processor=None)


class _Positions:
    """Records every processor output of a pipeline and, in mode "mrope", passes its mm_token_type_ids
    on to the text encoder (as diffusers' pull request 14189 does); in mode "sequential" the text
    encoder gets what diffusers 0.42.1 passes."""

    def __init__(self, pipe):
        self.mode, self.calls = "mrope", []
        proc, te = pipe.processor, pipe.text_encoder
        base, fwd, positions = type(proc), te.forward, self

        def call(self, *args, **kwargs):
            out = base.__call__(self, *args, **kwargs)
            positions.calls.append(out)
            return out

        def forward(*args, **kwargs):
            te.model.rope_deltas = None  # as a freshly loaded encoder
            if positions.mode == "mrope":
                assert torch.equal(kwargs["input_ids"], positions.calls[-1]["input_ids"])
                kwargs["mm_token_type_ids"] = positions.calls[-1]["mm_token_type_ids"]
            return fwd(*args, **kwargs)

        proc.__class__ = type("Recording" + base.__name__, (base,), {"__call__": call})
        te.forward = forward


def _pipeline(folder):
    import diffusers

    path = os.path.join(MODELS, folder)
    pipe = getattr(diffusers, CLASSES[folder]).from_pretrained(path, processor=load_processor(
        os.path.join(path, "processor")))
    pipe.set_progress_bar_config(disable=True)
    pipe.positions = _Positions(pipe)
    return pipe


def _rel(path):
    return os.path.relpath(path, ROOT)


def _grid_meta(thw, merge=2):
    return dict(grid_thw=thw.tolist(), tokens=[int(r.prod()) // merge ** 2 for r in thw])


E_TEMPLATE_PROMPT = "make the sky green"


def _processor_cases(pipes, images, tensors, meta):
    """pixel_values and image_grid_thw: the Edit prompt image (the pipeline's Lanczos resize to
    calculate_dimensions(1024 * 1024)), Edit-Plus's two condition images (each resized to
    calculate_dimensions(384 * 384)), and one image straight to the image processor."""
    from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit import calculate_dimensions
    from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus import CONDITION_IMAGE_SIZE
    from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus import calculate_dimensions as plus_dimensions

    edit, plus = pipes[EDIT], pipes[PLUS]
    inputs = {}
    img = images["in_32x32.png"]
    w, h, _ = calculate_dimensions(1024 * 1024, img.size[0] / img.size[1])
    inputs["edit"] = (["in_32x32.png"], [edit.image_processor.resize(img, h, w)], [(w, h)])
    conds, sizes = [], []
    for name in ("in_32x32.png", "in_37x23.jpg"):
        img = images[name]
        w, h = plus_dimensions(CONDITION_IMAGE_SIZE, img.size[0] / img.size[1])
        conds.append(plus.image_processor.resize(img, h, w))
        sizes.append((w, h))
    inputs["plus"] = (["in_32x32.png", "in_37x23.jpg"], conds, sizes)
    inputs["direct"] = (["in_50x41.png"], [images["in_50x41.png"]], [None])
    for case, (names, imgs, resized) in inputs.items():
        out = edit.processor.image_processor(images=imgs, return_tensors="pt")
        thw = out["image_grid_thw"]
        tensors[f"processor.{case}.pixel_values"] = out["pixel_values"]
        tensors[f"processor.{case}.image_grid_thw"] = thw
        meta[f"processor.{case}"] = dict(
            images=[_rel(os.path.join(INPUTS, n)) for n in names], input_sizes=[list(images[n].size) for n in names],
            pipeline_resize=[list(s) if s else None for s in resized],
            vl_sizes=[[int(r[2]) * PROCESSOR["patch_size"], int(r[1]) * PROCESSOR["patch_size"]] for r in thw],
            **_grid_meta(thw))
    return {case: v[1] for case, v in inputs.items()}


def _vision_cases(te, processed, tensors, meta):
    """The merged image embeddings, in the raster order the language model receives them."""
    for case in ("edit", "plus"):
        pv, thw = processed[case]
        with torch.no_grad():
            embeds = torch.cat(te.model.get_image_features(pv, thw).pooler_output, dim=0)
            assert torch.equal(embeds, te.model.visual(pv, grid_thw=thw).pooler_output)
        tensors[f"vision.{case}.image_embeds"] = embeds
        meta[f"vision.{case}"] = dict(input=f"processor.{case}", **_grid_meta(thw))


def _text_cases(pipes, conds, tensors, meta):
    """hidden_states[-1] (output_hidden_states=True) with and without mm_token_type_ids."""
    edit, plus = pipes[EDIT], pipes[PLUS]
    te, proc = edit.text_encoder, edit.processor
    e_template, p_template = edit.prompt_template_encode, plus.prompt_template_encode
    picture = "Picture {}: <|vision_start|><|image_pad|><|vision_end|>"
    plus_prompt = "put the square from picture 1 into picture 2"
    batch_prompts = ["make the sky green", "add a small red boat on the lake, keep the mountains as they are"]
    cases = {
        "edit": ([e_template.format(E_TEMPLATE_PROMPT)], conds["edit"], "processor.edit", [E_TEMPLATE_PROMPT]),
        "plus": ([p_template.format(picture.format(1) + picture.format(2) + plus_prompt)], conds["plus"],
                 "processor.plus", [plus_prompt]),
        "batch": ([e_template.format(p) for p in batch_prompts], conds["plus"], "processor.plus", batch_prompts),
    }
    edit.positions.mode = "sequential"  # the encoder's calls below as written
    for case, (texts, imgs, pixels, prompts) in cases.items():
        inputs = proc(text=texts, images=imgs, padding=True, return_tensors="pt")
        assert torch.equal(inputs["pixel_values"], tensors[f"{pixels}.pixel_values"])
        ids, mask, types = inputs["input_ids"], inputs["attention_mask"], inputs["mm_token_type_ids"]
        assert torch.equal(types, (ids == IMAGE_TOKEN).long())
        tensors[f"text.{case}.input_ids"], tensors[f"text.{case}.attention_mask"] = ids, mask
        hidden = {}
        with torch.no_grad():
            for positions, extra in (("mrope", {"mm_token_type_ids": types}), ("sequential", {})):
                te.model.rope_deltas = None
                out = te(input_ids=ids, attention_mask=mask, pixel_values=inputs["pixel_values"],
                         image_grid_thw=inputs["image_grid_thw"], output_hidden_states=True, **extra)
                hidden[positions] = out.hidden_states[-1]
                tensors[f"text.{case}.hidden_{positions}"] = hidden[positions]
            pos, deltas = te.model.get_rope_index(ids, types, inputs["image_grid_thw"], attention_mask=mask)
        assert (hidden["mrope"] - hidden["sequential"]).abs().max() > 0.1
        if case != "edit":
            tensors[f"text.{case}.position_ids"] = pos
        meta[f"text.{case}"] = dict(texts=texts, prompts=prompts, pixels=pixels, lengths=mask.sum(1).tolist(),
                                    image_tokens=(ids == IMAGE_TOKEN).sum(1).tolist(), rope_deltas=deltas.tolist(),
                                    drop_idx=edit.prompt_template_encode_start_idx,
                                    template="edit" if case != "plus" else "plus")
    # The pipelines' own prompt encoding equals the encoder's output less the template's first 64
    # tokens, with either kind of positions.
    for positions in ("mrope", "sequential"):
        edit.positions.mode = positions
        embeds, _ = edit.encode_prompt(E_TEMPLATE_PROMPT, conds["edit"][0])
        assert torch.equal(embeds[0], tensors[f"text.edit.hidden_{positions}"][0][64:])
    edit.positions.mode = "mrope"


# name: folder, images, prompt, negative_prompt, true_cfg_scale, seed, steps, height, width, positions
CASES = {
    "edit_one_cfg": (EDIT, ["in_32x32.png"], "make the sky green", "blurry", 4.0, 3, 2, 32, 48, "mrope"),
    "edit_one_plain": (EDIT, ["in_37x23.jpg"], "add a red hat", None, 4.0, 5, 2, 32, 32, "mrope"),
    "plus_two_cfg": (PLUS, ["in_32x32.png", "in_37x23.jpg"], "put the square from picture 1 into picture 2",
                     "blurry", 3.0, 7, 2, 48, 32, "mrope"),
    "plus_two_plain": (PLUS, ["in_37x23.jpg", "in_48x32.png"], "swap the colours of the two pictures", None, 4.0,
                       11, 2, 32, 48, "mrope"),
    "plus_2511": (E2511, ["in_50x41.png"], "make it night", "low quality", 4.0, 13, 2, 48, 48, "mrope"),
    "edit_one_sequential": (EDIT, ["in_32x32.png"], "make the sky green", "blurry", 4.0, 3, 2, 32, 48, "sequential"),
    "plus_two_sequential": (PLUS, ["in_32x32.png", "in_37x23.jpg"], "put the square from picture 1 into picture 2",
                            "blurry", 3.0, 7, 2, 48, 32, "sequential"),
}


def _pipeline_cases(pipes, images, tensors, meta):
    from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit import calculate_dimensions

    keys = ["folder", "images", "prompt", "negative_prompt", "true_cfg_scale", "seed", "steps", "height", "width",
            "positions"]
    for name, case in CASES.items():
        folder, names, prompt, negative, scale, seed, steps, height, width, positions = case
        pipe = pipes[folder]
        pipe.positions.mode = positions
        image = [images[n] for n in names] if folder != EDIT else images[names[0]]
        kwargs = dict(image=image, prompt=prompt, negative_prompt=negative, true_cfg_scale=scale,
                      num_inference_steps=steps, height=height, width=width)
        start = time.time()
        pipe.positions.calls.clear()
        out = pipe(**kwargs, generator=torch.Generator("cpu").manual_seed(seed), output_type="np").images[0]
        latents = pipe(**kwargs, generator=torch.Generator("cpu").manual_seed(seed), output_type="latent").images[0]
        seconds = time.time() - start
        tensors[f"{name}.image"] = torch.from_numpy((out * 255).round().astype(np.uint8))
        tensors[f"{name}.latents"] = latents.float()
        m = dict(zip(keys, case), folder="models/" + folder, pipeline=CLASSES[folder],
                 images=[_rel(os.path.join(INPUTS, n)) for n in names])
        # Sizes the call used: the VAE's reference size per image (calculate_dimensions(1024 * 1024)),
        # the processor's (grid_thw x patch), the default output size (from the last image).
        vae_sizes = [list(calculate_dimensions(1024 * 1024, images[n].size[0] / images[n].size[1])[:2]) for n in names]
        enc = pipe.positions.calls[0]
        thw = enc["image_grid_thw"]
        m.update(vae_sizes=vae_sizes, reference_tokens=[(w // 16) * (h // 16) for w, h in vae_sizes],
                 noise_tokens=(height // 16) * (width // 16), default_width=vae_sizes[-1][0] // 16 * 16,
                 default_height=vae_sizes[-1][1] // 16 * 16, do_true_cfg=negative is not None and scale > 1,
                 text_lengths=[int(enc["attention_mask"].sum())],
                 vl_sizes=[[int(r[2]) * PROCESSOR["patch_size"], int(r[1]) * PROCESSOR["patch_size"]] for r in thw],
                 **_grid_meta(thw))
        assert len(pipe.positions.calls) == 2 * (2 if m["do_true_cfg"] else 1)
        same = {"edit_one_cfg": "processor.edit", "plus_two_cfg": "processor.plus"}.get(name)
        if same:  # what the pipeline gave the processor is what the processor cases resize
            assert torch.equal(enc["pixel_values"], tensors[f"{same}.pixel_values"])
        assert latents.shape[0] == m["noise_tokens"] and out.shape[:2] == (height, width)
        meta[name] = m
        print(f"{name}: {seconds:.1f} s for both calls, {m['reference_tokens']} reference tokens, "
              f"grid {m['grid_thw']}, text {m['text_lengths']}")
    pipes[EDIT].positions.mode = "mrope"


INPUTS = os.path.join(ROOT, "tests", "data", "golden", "img2img")
LORA = os.path.join(ROOT, "tests", "data", "golden", "lora", "qwen_peft.safetensors")


def _lora_case(images, tensors, meta):
    """Edit-Plus with golden_lora.py's Qwen-Image adapter (diffusers/PEFT names) at scale 0.8: an
    adapter of Qwen-Image's names fits the edit pipelines' transformer."""
    pipe = _pipeline(PLUS)
    pipe.load_lora_weights(os.path.dirname(LORA), weight_name=os.path.basename(LORA), adapter_name="a0")
    pipe.set_adapters(["a0"], [0.8])
    kwargs = dict(image=[images["in_48x32.png"]], prompt="a lighthouse at dusk", negative_prompt="blurry",
                  true_cfg_scale=4.0, num_inference_steps=2, height=32, width=32)
    out = pipe(**kwargs, generator=torch.Generator("cpu").manual_seed(17), output_type="np").images[0]
    latents = pipe(**kwargs, generator=torch.Generator("cpu").manual_seed(17), output_type="latent").images[0]
    tensors["plus_lora.image"] = torch.from_numpy((out * 255).round().astype(np.uint8))
    tensors["plus_lora.latents"] = latents.float()
    meta["plus_lora"] = dict(folder="models/" + PLUS, pipeline=CLASSES[PLUS], images=[_rel(os.path.join(INPUTS, "in_48x32.png"))],
                             prompt=kwargs["prompt"], negative_prompt="blurry", true_cfg_scale=4.0, seed=17, steps=2,
                             height=32, width=32, positions="mrope", lora=[dict(path=_rel(LORA), scale=0.8)])


def qwen_edit():
    from diffusers.utils import load_image

    from golden_img2img import _inputs

    _inputs()
    _folders()
    images = {n: load_image(os.path.join(INPUTS, n)) for n in
              ("in_32x32.png", "in_37x23.jpg", "in_48x32.png", "in_50x41.png")}
    pipes = {folder: _pipeline(folder) for folder in (EDIT, PLUS, E2511)}
    tensors, meta = {}, {}
    conds = _processor_cases(pipes, images, tensors, meta)
    processed = {case: (tensors[f"processor.{case}.pixel_values"], tensors[f"processor.{case}.image_grid_thw"])
                 for case in ("edit", "plus")}
    _vision_cases(pipes[EDIT].text_encoder, processed, tensors, meta)
    _text_cases(pipes, conds, tensors, meta)
    _pipeline_cases(pipes, images, tensors, meta)
    _lora_case(images, tensors, meta)
    save("qwen_edit.safetensors", tensors, meta)
