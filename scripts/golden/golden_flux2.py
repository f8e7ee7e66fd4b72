"""FLUX.2 as diffusers 0.42.1 runs it (Flux2Transformer2DModel, AutoencoderKLFlux2, Flux2KleinPipeline)
with transformers 5.24's Qwen3, from tiny random models made here. What the numbers mean, formula by
formula, is in docs/flux2-reference.md.

flux2_transformer: two tiny transformers (2 double, 2 single blocks, 3 heads of 16, rope axes
(2, 4, 6, 4), timestep channels 64, perturbed q/k RMS norms scaled by 3): tests/data/golden/flux2_transformer/
(no guidance embedder, as klein) and flux2_transformer_dev/ (guidance embedder, as dev), and their
forward on fixed inputs in flux2_transformer.safetensors.
flux2_vae: a tiny AutoencoderKLFlux2 (8 latent channels, three blocks: vae_scale_factor 4, random
batch-norm statistics) in tests/data/golden/flux2_vae/, and the pipelines' decode (packed tokens ->
image) and reference encode (image -> normalized packed tokens) in flux2_vae.safetensors.
flux2_klein_pipeline: models/tiny-random-flux2-klein/ (distilled, is_distilled true) and
models/tiny-random-flux2-klein-base/ (links to the former's components, model_index.json without
is_distilled, as FLUX.2-klein-base ships it: classifier-free guidance), and Flux2KleinPipeline's
images from them in flux2_klein_pipeline.safetensors. Reference pictures are written to
tests/data/golden/flux2/.

Needs train_qwen3_tokenizer from golden_qwen3.py (Qwen3's byte-level BPE and chat template).
"""
import json
import os
import shutil

import numpy as np
import torch

from make_golden import OUT, perturb_norms, save

PARTS = ["flux2_transformer", "flux2_vae", "flux2_klein_pipeline"]

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
MODELS = os.path.join(ROOT, "models")
KLEIN, KLEIN_BASE = "tiny-random-flux2-klein", "tiny-random-flux2-klein-base"
INPUTS = os.path.join(OUT, "flux2")

# Qwen3 of width 32 (heads x head_dim = 64: as Qwen3-4B, wider than the model), 30 layers so that
# the pipeline's default text_encoder_out_layers (9, 18, 27) are all inner layers.
QWEN3 = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=30, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=1000000.0,
             max_position_embeddings=1024, tie_word_embeddings=True, hidden_act="silu")
LATENT_CHANNELS = 8
TRANSFORMER = dict(patch_size=1, in_channels=4 * LATENT_CHANNELS, num_layers=2, num_single_layers=2,
                   attention_head_dim=16, num_attention_heads=3, joint_attention_dim=3 * QWEN3["hidden_size"],
                   timestep_guidance_channels=64, mlp_ratio=3.0, axes_dims_rope=(2, 4, 6, 4), rope_theta=2000,
                   eps=1e-6)
VAE = dict(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 3,
           up_block_types=("UpDecoderBlock2D",) * 3, block_out_channels=(8, 16, 16), layers_per_block=1,
           latent_channels=LATENT_CHANNELS, norm_num_groups=4, sample_size=64, use_quant_conv=True,
           use_post_quant_conv=True, mid_block_add_attention=True, batch_norm_eps=1e-4, patch_size=(2, 2))
# FLUX.2's published scheduler_config.json values (FLUX.2-dev; klein ships the same).
SCHEDULER = dict(base_image_seq_len=256, base_shift=0.5, invert_sigmas=False, max_image_seq_len=4096, max_shift=1.15,
                 num_train_timesteps=1000, shift=3.0, shift_terminal=None, stochastic_sampling=False,
                 time_shift_type="exponential", use_beta_sigmas=False, use_dynamic_shifting=True,
                 use_exponential_sigmas=False, use_karras_sigmas=False)


def _config(model):
    """The model's config without diffusers' private keys (one of which lists names in no fixed order)."""
    return json.loads(json.dumps({k: v for k, v in model.config.items() if not k.startswith("_")}))


def _rel(path):
    return os.path.relpath(path, ROOT)


def _transformer(guidance_embeds):
    from diffusers import Flux2Transformer2DModel

    torch.manual_seed(90 if guidance_embeds else 91)
    model = Flux2Transformer2DModel(guidance_embeds=guidance_embeds, **TRANSFORMER).eval()
    perturb_norms(model)
    with torch.no_grad():
        model.proj_out.weight.mul_(4.0)  # noise predictions of a useful size
        model.context_embedder.weight.mul_(4.0)  # text that moves the image more than rounding does
        for n, w in model.named_parameters():
            if ".norm_" in n:  # q and k norms: attention far from uniform
                w.mul_(3.0)
    return model


def _vae():
    from diffusers import AutoencoderKLFlux2

    torch.manual_seed(92)
    vae = AutoencoderKLFlux2(**VAE).eval()
    perturb_norms(vae)
    with torch.no_grad():
        # Statistics far from (0, 1), so that a missing or swapped (de)normalization shows.
        g = torch.Generator().manual_seed(93)
        n = vae.bn.running_mean.numel()
        vae.bn.running_mean.copy_(torch.randn(n, generator=g) * 0.5)
        vae.bn.running_var.copy_(torch.rand(n, generator=g) * 2.0 + 0.25)
        vae.decoder.conv_out.weight.mul_(4.0)
    return vae


def _ids(t, h, w, l=1):
    return torch.cartesian_prod(torch.tensor([t]), torch.arange(h), torch.arange(w), torch.arange(l))


def flux2_transformer():
    """Forward passes: text (7 tokens, ids (0, 0, 0, l)), a 4 x 3 latent grid (ids (0, h, w, 0)), and
    in case refs two reference grids appended (2 x 2 at T 10, 3 x 1 at T 20), batch 2, timesteps
    given as the pipelines give them (sigma, the model multiplies by 1000)."""
    tensors, meta = {}, {}
    g = torch.Generator().manual_seed(94)
    text = torch.randn(2, 7, TRANSFORMER["joint_attention_dim"], generator=g)
    img = torch.randn(2, 12, TRANSFORMER["in_channels"], generator=g)
    ref = torch.randn(2, 7, TRANSFORMER["in_channels"], generator=g)
    txt_ids = _ids(0, 1, 1, 7)
    img_ids = _ids(0, 4, 3)
    ref_ids = torch.cat([_ids(10, 2, 2), _ids(20, 3, 1)])
    timestep = torch.tensor([1.0, 0.37])
    guidance = torch.tensor([4.0, 2.5])
    tensors.update(text=text, img=img, ref=ref, txt_ids=txt_ids, img_ids=img_ids, ref_ids=ref_ids, timestep=timestep,
                   guidance=guidance)
    for name, guided in (("klein", False), ("dev", True)):
        model = _transformer(guided)
        folder = os.path.join(OUT, "flux2_transformer" + ("_dev" if guided else ""))
        shutil.rmtree(folder, ignore_errors=True)
        model.save_pretrained(folder, safe_serialization=True)
        kwargs = dict(encoder_hidden_states=text, timestep=timestep, txt_ids=txt_ids,
                      guidance=guidance if guided else None, return_dict=False)
        with torch.no_grad():
            plain = model(hidden_states=img, img_ids=img_ids, **kwargs)[0]
            refs = model(hidden_states=torch.cat([img, ref], 1), img_ids=torch.cat([img_ids, ref_ids]), **kwargs)[0]
            temb = model.time_guidance_embed(timestep * 1000, guidance * 1000 if guided else None)
            cos, sin = model.pos_embed(torch.cat([txt_ids, img_ids, ref_ids]))
        tensors[f"{name}.plain"], tensors[f"{name}.refs"], tensors[f"{name}.temb"] = plain, refs, temb
        if name == "klein":
            tensors["rope_cos"], tensors["rope_sin"] = cos, sin
        meta[name] = dict(folder=_rel(folder), guidance_embeds=guided, config=_config(model))
    meta["inputs"] = ("text [B, 7, joint_attention_dim]; img [B, 12, in_channels] with img_ids (0, h, w, 0) of a "
                      "4 x 3 grid; ref [B, 7, in_channels] with ref_ids: a 2 x 2 grid at T 10 then a 3 x 1 grid "
                      "at T 20; timestep and guidance as the pipelines pass them (the model multiplies by 1000); "
                      "NAME.plain: output for img alone; NAME.refs: output for img then ref concatenated (all "
                      "19 tokens, the pipeline keeps the first 12); NAME.temb: the time (+ guidance) embedding; "
                      "rope_cos/rope_sin: [7 + 12 + 7, head_dim] for the ids txt, img, ref concatenated")
    save("flux2_transformer.safetensors", tensors, meta)


def flux2_vae():
    """decode: packed tokens [B, h*w, 4C] (ids (0, y, x, 0)) -> unpack -> x std + mean -> unpatchify
    -> decoder; encode: the pipeline's reference encode of an image tensor in [-1, 1]."""
    from diffusers import Flux2KleinPipeline as P  # its static helpers: what both pipelines run

    vae = _vae()
    folder = os.path.join(OUT, "flux2_vae")
    shutil.rmtree(folder, ignore_errors=True)
    vae.save_pretrained(folder, safe_serialization=True)
    g = torch.Generator().manual_seed(95)
    h, w = 3, 5  # patchified grid: 6 x 10 latents, a 24 x 40 image
    packed = torch.randn(2, h * w, 4 * LATENT_CHANNELS, generator=g)
    ids = P._prepare_latent_ids(torch.zeros(2, 1, h, w))
    mean = vae.bn.running_mean.view(1, -1, 1, 1)
    std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps)
    with torch.no_grad():
        grid = P._unpack_latents_with_ids(packed, ids, h, w)
        latents = P._unpatchify_latents(grid * std + mean)
        image = vae.decode(latents, return_dict=False)[0]
    pixels = torch.rand(1, 3, 32, 24, generator=g) * 2 - 1  # one reference, as the pipeline encodes each alone
    with torch.no_grad():
        mode = vae.encode(pixels).latent_dist.mode()
        normalized = (P._patchify_latents(mode) - mean) / std
        enc_packed = P._pack_latents(normalized)
    tensors = {"decode.packed": packed, "decode.ids": ids[0], "decode.latents": latents, "decode.image": image,
               "encode.image": pixels, "encode.mode": mode, "encode.packed": enc_packed}
    meta = dict(folder=_rel(folder), config=_config(vae),
                decode="packed [2, 15, 32] tokens of a 3 x 5 patchified grid -> decode.latents [2, 8, 6, 10] "
                       "(de-normalized, unpatchified) -> decode.image [2, 3, 24, 40] (decoder output, not clamped)",
                encode="encode.image [1, 3, 32, 24] in [-1, 1] -> encode.mode (mean of the posterior) [1, 8, 8, 6] "
                       "-> encode.packed [1, 12, 32] (patchified, normalized, packed)")
    save("flux2_vae.safetensors", tensors, meta)


# --- Flux2KleinPipeline ---------------------------------------------------------------------------

REFS = {"ref_96x72.png": (96, 72, "PNG"), "ref_70x66.png": (70, 66, "PNG"), "ref_84x100.jpg": (84, 100, "JPEG")}

LONG = ("a lighthouse on a rocky coast at dusk with waves and gulls and warm light in every window of the tower, "
        "seen from a small boat")
# name, folder, prompts, negative_prompt (None: the pipeline's own ""), guidance_scale, width, height, steps,
# seeds (one per prompt), reference images, max_sequence_length
CASES = [
    ("t2i", KLEIN, ["a red fox in the snow"], None, 1.0, 32, 32, 4, [3], [], 512),
    ("nonsquare", KLEIN, [LONG], None, 1.0, 40, 24, 4, [5], [], 40),
    ("batch", KLEIN, ["a cat", "a bowl of ramen with an egg"], None, 1.0, 32, 24, 3, [7, 8], [], 512),
    ("ref1", KLEIN, ["make the sky green"], None, 1.0, 32, 32, 3, [11], ["ref_96x72.png"], 512),
    ("ref2", KLEIN, ["put the square from the first picture into the second"], None, 1.0, None, None, 2, [13],
     ["ref_70x66.png", "ref_84x100.jpg"], 512),
    ("cfg", KLEIN_BASE, ["an old lighthouse"], None, 4.0, 32, 32, 3, [17], [], 512),
    ("cfg_negative", KLEIN_BASE, ["an old lighthouse"], "blurry, low quality", 4.0, 32, 32, 3, [17], [], 512),
    ("cfg_ref", KLEIN_BASE, ["make it night"], None, 3.0, 24, 32, 2, [19], ["ref_96x72.png"], 512),
]
BF16_CASE = "t2i"


def _references():
    from PIL import Image

    os.makedirs(INPUTS, exist_ok=True)
    for name, (w, h, fmt) in REFS.items():
        y, x = np.mgrid[0:h, 0:w]
        rgb = np.stack([(x * 255 // (w - 1)), (y * 255 // (h - 1)), ((x // 7 + y // 5) % 2) * 200 + 25],
                       axis=-1).astype(np.uint8)
        rgb[h // 4:h // 2, w // 3:w // 2] = (250, 240, 20)  # an off-centre square, so that the crop matters
        Image.fromarray(rgb).save(os.path.join(INPUTS, name), fmt, **({"quality": 90} if fmt == "JPEG" else {}))


def _link(target, path):
    if os.path.lexists(path):
        os.remove(path)
    os.symlink(target, path)


def _folders():
    from diffusers import FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from golden_qwen3 import train_qwen3_tokenizer

    for folder in (KLEIN, KLEIN_BASE):
        shutil.rmtree(os.path.join(MODELS, folder), ignore_errors=True)
    tok_dir = os.path.join(OUT, "_flux2_tokenizer")
    shutil.rmtree(tok_dir, ignore_errors=True)
    tokenizer = train_qwen3_tokenizer(tok_dir)
    torch.manual_seed(96)
    config = Qwen3Config(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"), **QWEN3)
    text_encoder = Qwen3ForCausalLM(config).eval()
    perturb_norms(text_encoder)
    with torch.no_grad():  # hidden states of about unit size and attention far from uniform
        # The pad's embedding of the words' size: the init zeroes padding_idx's row, and every pad
        # goes on to the transformer, so a zero one would leave the pads' states tiny and the RMS
        # norms would scale their rounding up layer by layer (tp's other summation order would then
        # move them by far more than the words'). A real model's pad is a word like the others.
        embed = text_encoder.model.embed_tokens.weight
        embed[config.pad_token_id] = torch.randn(embed.shape[1], generator=torch.Generator().manual_seed(97)) * (
            embed.std())
        text_encoder.model.embed_tokens.weight.mul_(40.0)
        for layer in text_encoder.model.layers:
            layer.self_attn.q_norm.weight.mul_(3.0)
            layer.self_attn.k_norm.weight.mul_(3.0)
    pipe = Flux2KleinPipeline(scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER), vae=_vae(),
                              text_encoder=text_encoder, tokenizer=tokenizer, transformer=_transformer(False),
                              is_distilled=True)
    klein = os.path.join(MODELS, KLEIN)
    pipe.save_pretrained(klein, safe_serialization=True)
    shutil.rmtree(tok_dir)
    gen = os.path.join(klein, "text_encoder", "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)  # not the encoder's
    base = os.path.join(MODELS, KLEIN_BASE)
    os.makedirs(base)
    for c in ("scheduler", "text_encoder", "tokenizer", "transformer", "vae"):
        _link(os.path.join("..", KLEIN, c), os.path.join(base, c))
    with open(os.path.join(klein, "model_index.json")) as f:
        index = json.load(f)
    assert index["is_distilled"] is True
    del index["is_distilled"]  # as FLUX.2-klein-base ships it: the pipeline's default, False
    with open(os.path.join(base, "model_index.json"), "w") as f:
        json.dump(index, f, indent=2, sort_keys=True)
        f.write("\n")


def run_and_keep(pipe, name, seeds, **kwargs):
    """One call of a FLUX.2 pipeline with a generator per prompt (seeds) and output_type np:
    NAME.K.image (uint8), NAME.K.latents (the packed latents after the last step), NAME.sigmas;
    and the output's height and width and the noise token count."""
    last = {}

    def keep(p, i, t, kw):
        last["latents"] = kw["latents"]
        return {}

    gens = [torch.Generator("cpu").manual_seed(s) for s in seeds]
    out = pipe(**kwargs, callback_on_step_end=keep, generator=gens, output_type="np").images
    latents = last["latents"]
    result = {}
    for k in range(len(seeds)):
        result[f"{name}.{k}.image"] = torch.from_numpy((out[k] * 255).round().astype(np.uint8))
        result[f"{name}.{k}.latents"] = latents[k].float()
    result[f"{name}.sigmas"] = pipe.scheduler.sigmas.float()
    return result, int(out.shape[1]), int(out.shape[2]), int(latents.shape[1])


def _run(pipe, case, images):
    """One pipeline call; the image as uint8 and the packed latents after the last step."""
    from diffusers.pipelines.flux2.pipeline_flux2_klein import compute_empirical_mu

    name, folder, prompts, negative, guidance, width, height, steps, seeds, refs, msl = case
    kwargs = dict(prompt=prompts, guidance_scale=guidance, width=width, height=height, num_inference_steps=steps,
                  max_sequence_length=msl)
    if refs:
        kwargs["image"] = [images[r] for r in refs]
    if negative is not None:  # the pipeline has no negative_prompt: its embeddings, from its own encoder
        kwargs["negative_prompt_embeds"], _ = pipe.encode_prompt([negative] * len(prompts), max_sequence_length=msl)
    result, out_h, out_w, tokens = run_and_keep(pipe, name, seeds, **kwargs)
    m = dict(name=name, folder="models/" + folder, pipeline="Flux2KleinPipeline", prompts=prompts,
             negative_prompt=negative, guidance_scale=guidance, width=width, height=height, out_width=int(out_w),
             out_height=int(out_h), steps=steps, seeds=seeds, images=[_rel(os.path.join(INPUTS, r)) for r in refs],
             max_sequence_length=msl, is_distilled=folder == KLEIN,
             do_cfg=guidance > 1 and folder != KLEIN, image_tokens=int(tokens),
             mu=compute_empirical_mu(int(tokens), steps))
    return result, m


def flux2_klein_pipeline():
    from diffusers import Flux2KleinPipeline
    from PIL import Image

    _references()
    _folders()
    images = {n: Image.open(os.path.join(INPUTS, n)) for n in REFS}
    pipes = {}
    for folder in (KLEIN, KLEIN_BASE):
        pipes[folder] = Flux2KleinPipeline.from_pretrained(os.path.join(MODELS, folder))  # what the C++ side reads
        pipes[folder].set_progress_bar_config(disable=True)
    assert pipes[KLEIN].config.is_distilled and not pipes[KLEIN_BASE].config.is_distilled
    tensors, meta = {}, {}
    for case in CASES:
        result, m = _run(pipes[case[1]], case, images)
        tensors.update(result)
        meta[case[0]] = m
    # The prompt encoding of one case (a prompt cut at 40 tokens, template tail included).
    pipe = pipes[KLEIN]
    case = next(c for c in CASES if c[0] == "nonsquare")
    text = pipe.tokenizer.apply_chat_template([{"role": "user", "content": case[2][0]}], tokenize=False,
                                              add_generation_prompt=True, enable_thinking=False)
    enc = pipe.tokenizer(text, return_tensors="pt", padding="max_length", truncation=True, max_length=case[10])
    embeds, text_ids = pipe.encode_prompt(case[2], max_sequence_length=case[10])
    tensors["nonsquare.input_ids"], tensors["nonsquare.prompt_embeds"] = enc.input_ids[0], embeds[0]
    meta["nonsquare"]["chat_text"] = text
    short = pipe.tokenizer.apply_chat_template([{"role": "user", "content": "a red fox in the snow"}], tokenize=False,
                                               add_generation_prompt=True, enable_thinking=False)
    ids = pipe.tokenizer(short, return_tensors="pt", padding="max_length", truncation=True, max_length=512)
    tensors["t2i.input_ids"], tensors["t2i.attention_mask"] = ids.input_ids[0], ids.attention_mask[0]
    meta["t2i"]["chat_text"] = short
    bf16 = Flux2KleinPipeline.from_pretrained(os.path.join(MODELS, KLEIN), torch_dtype=torch.bfloat16)
    bf16.set_progress_bar_config(disable=True)
    case = next(c for c in CASES if c[0] == BF16_CASE)
    result, m = _run(bf16, ("bf16",) + case[1:], images)
    tensors.update(result)
    meta["bf16"] = dict(m, dtype="bfloat16", same_as=BF16_CASE)
    save("flux2_klein_pipeline.safetensors", tensors, meta)
