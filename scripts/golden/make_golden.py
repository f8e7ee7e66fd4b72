"""Writes the golden tensors the C++ tests compare against, from diffusers and transformers.

Run: scripts/golden/make_golden.sh (installs the pinned reference packages, then runs this).
Every file goes to tests/data/golden/ as safetensors; the cases are described in its metadata, so
the C++ test needs no Python. Everything is seeded: running it again gives the same files.
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "golden")


def save(name, tensors, meta):
    path = os.path.join(OUT, name)
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    save_file(tensors, path, metadata={"cases": json.dumps(meta, sort_keys=True)})
    print(f"{path}: {len(tensors)} tensors, {os.path.getsize(path)} bytes")


def perturb_norms(model):
    """Random norm weights too, so that a swapped scale and shift cannot pass unnoticed."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.add_(torch.randn_like(p) * 0.1)


def scheduler():
    from diffusers import FlowMatchEulerDiscreteScheduler

    cases = {
        "sd3": ({"shift": 3.0}, 28, None),
        "sd3_one_step": ({"shift": 3.0}, 1, None),
        "no_shift": ({"shift": 1.0}, 7, None),
        "dynamic": ({"use_dynamic_shifting": True, "base_shift": 0.5, "max_shift": 1.15}, 10, 0.8),
        "dynamic_linear": ({"use_dynamic_shifting": True, "time_shift_type": "linear"}, 5, 1.3),
        "terminal": ({"shift": 3.0, "shift_terminal": 0.1}, 6, None),
        "inverted": ({"shift": 2.0, "invert_sigmas": True}, 4, None),
        "short_train": ({"shift": 3.0, "num_train_timesteps": 50}, 9, None),
    }
    tensors, meta = {}, {}
    g = torch.Generator().manual_seed(0)
    for name, (config, steps, mu) in cases.items():
        s = FlowMatchEulerDiscreteScheduler(**config)
        s.set_timesteps(steps, mu=mu)
        tensors[f"{name}.sigmas"] = s.sigmas.float()
        tensors[f"{name}.timesteps"] = s.timesteps.float()
        meta[name] = {"config": config, "steps": steps, "mu": mu}
    # One Euler step on random tensors, at every index of the sd3 schedule.
    s = FlowMatchEulerDiscreteScheduler(shift=3.0)
    s.set_timesteps(4)
    sample = torch.randn(2, 4, 8, 8, generator=g)
    out = torch.randn(2, 4, 8, 8, generator=g)
    tensors["step.sample"], tensors["step.model_output"] = sample, out
    for i, t in enumerate(s.timesteps):
        tensors[f"step.prev_{i}"] = s.step(out, t, sample).prev_sample
    meta["step"] = {"config": {"shift": 3.0}, "steps": 4}
    save("scheduler.safetensors", tensors, meta)


TRICKY = [
    "a photo of a cat",
    "A Photo Of A CAT, on a MAT!!!",
    "don't stop; I'M here, we'll see. rock'n'roll",
    "  leading and trailing   spaces\t\ttabs\nnewlines\r\n ",
    "non\u00a0breaking\u3000ideographic\u2003em\u0085nel",
    "caf\u00e9 vs cafe\u0301 (composed and decomposed), na\u00efve, \u00c5ngstr\u00f6m",
    "\u0130stanbul \u039f\u0394\u039f\u03a3 Stra\u00dfe \ufb01sh \uff21\uff22\uff23",
    "emoji: \U0001f600\U0001f680 \U0001f469\u200d\U0001f4bb \U0001f44d\U0001f3fd \u2764\ufe0f",
    "\u4e00\u53ea\u732b\u5728\u5c4b\u9876\u4e0a \u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 \ud55c\uad6d\uc5b4 \u1100\u1161",
    "\u0645\u0631\u062d\u0628\u0627 \u0928\u092e\u0938\u094d\u0924\u0947 \u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35",
    "prices: $100.50, 2024-11-29, x\u00b2+y\u00b2=z\u00b2, \u00bd cup, 3rd",
    "https://example.com/a_b?c=d&e=f#g <html> @user #tag",
    "<|startoftext|>literal specials<|endoftext|> and <|StartOfText|> in caps",
    "zero\u200bwidth and soft\u00adhyphen",
    "",
    "   ",
    "!!!???...,,,;;;:::",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    " ".join(f"word{i} is number {i}," for i in range(60)),
]


def tokenizer():
    import gzip

    from transformers import CLIPTokenizer

    gz = os.environ.get("DP_CLIP_BPE_GZ")
    if not gz:
        sys.exit("tokenizer: set DP_CLIP_BPE_GZ to CLIP's bpe_simple_vocab_16e6.txt.gz (make_golden.sh does)")
    lines = gzip.open(gz).read().decode("utf-8").split("\n")
    merges = [tuple(m.split()) for m in lines[1:1 + 6000]]  # the first 6000 of CLIP's merges
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    alphabet = [chr(c) for c in cs]
    vocab = alphabet + [a + "</w>" for a in alphabet] + ["".join(m) for m in merges] + ["<|startoftext|>", "<|endoftext|>"]
    folder = os.path.join(OUT, "clip_tokenizer")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump({t: i for i, t in enumerate(vocab)}, f, ensure_ascii=False)
    with open(os.path.join(folder, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n")
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"model_max_length": 77, "bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>",
                   "pad_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}, f)

    tensors, meta = {}, {"strings": TRICKY}
    for pad, prefix in (("<|endoftext|>", "ids"), ("!", "ids_pad_bang")):
        tok = CLIPTokenizer.from_pretrained(folder, pad_token=pad)
        for i, text in enumerate(TRICKY):
            enc = tok(text, padding="max_length", max_length=77, truncation=True, return_tensors="pt")
            tensors[f"{prefix}.{i}"] = enc.input_ids[0].to(torch.int64)
            if prefix == "ids":
                full = tok(text, padding="longest", return_tensors="pt").input_ids[0]
                tensors[f"full.{i}"] = full.to(torch.int64)
    save("clip_tokenizer.safetensors", tensors, meta)


def clip():
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    shapes = {
        # diffusers' SD3 test shape (legacy eos_token_id 2: the pooled token is the highest id)
        "clip_l": dict(hidden_size=32, intermediate_size=37, num_attention_heads=4, num_hidden_layers=5,
                       vocab_size=1000, hidden_act="gelu", projection_dim=32, eos_token_id=2, bos_token_id=0,
                       pad_token_id=1, layer_norm_eps=1e-5),
        # a CLIP-G-like shape: quick_gelu, projection wider than hidden, a real eos id
        "clip_g": dict(hidden_size=48, intermediate_size=96, num_attention_heads=4, num_hidden_layers=3,
                       vocab_size=1000, hidden_act="quick_gelu", projection_dim=40, eos_token_id=999,
                       bos_token_id=998, pad_token_id=999, layer_norm_eps=1e-5),
    }
    for name, kwargs in shapes.items():
        torch.manual_seed(1)
        model = CLIPTextModelWithProjection(CLIPTextConfig(**kwargs)).eval()
        folder = os.path.join(OUT, name)
        model.save_pretrained(folder, safe_serialization=True)
        g = torch.Generator().manual_seed(2)
        ids = torch.randint(3, 990, (2, 77), generator=g)
        ids[0, 0], ids[1, 0] = kwargs["bos_token_id"], kwargs["bos_token_id"]
        ids[0, 9:], ids[1, 30:] = kwargs["eos_token_id"], kwargs["eos_token_id"]
        with torch.no_grad():
            out = model(ids, output_hidden_states=True)
        save(f"{name}.safetensors", {"input_ids": ids, "pooled": out[0], "hidden_skip0": out.hidden_states[-2],
                                     "hidden_skip1": out.hidden_states[-3]}, {"config": kwargs})


def transformer():
    from diffusers import SD3Transformer2DModel

    shapes = {
        # diffusers' SD3 pipeline test shape, with two blocks so that a full block runs too
        "sd3_transformer": (dict(sample_size=32, patch_size=1, in_channels=4, num_layers=2, attention_head_dim=8,
                                 num_attention_heads=4, caption_projection_dim=32, joint_attention_dim=32,
                                 pooled_projection_dim=64, out_channels=4, pos_embed_max_size=16), (8, 8)),
        # SD3.5-style RMS qk-norm, patch 2, and a latent whose patch grid (6 x 5) is cropped off-centre
        "sd3_transformer_qknorm": (dict(sample_size=16, patch_size=2, in_channels=4, num_layers=3, attention_head_dim=8,
                                        num_attention_heads=2, caption_projection_dim=16, joint_attention_dim=24,
                                        pooled_projection_dim=20, out_channels=4, pos_embed_max_size=12,
                                        qk_norm="rms_norm"), (12, 10)),
    }
    for name, (config, (h, w)) in shapes.items():
        torch.manual_seed(3)
        model = SD3Transformer2DModel(**config).eval()
        perturb_norms(model)
        folder = os.path.join(OUT, name)
        model.save_pretrained(folder, safe_serialization=True)
        g = torch.Generator().manual_seed(4)
        latents = torch.randn(2, config["in_channels"], h, w, generator=g)
        text = torch.randn(2, 7, config["joint_attention_dim"], generator=g)
        pooled = torch.randn(2, config["pooled_projection_dim"], generator=g)
        timestep = torch.tensor([999.0, 333.25])
        with torch.no_grad():
            out = model(hidden_states=latents, encoder_hidden_states=text, pooled_projections=pooled,
                        timestep=timestep).sample
        save(f"{name}.safetensors", {"latents": latents, "text": text, "pooled": pooled, "timestep": timestep,
                                     "out": out}, {"config": config})


def vae():
    from diffusers import AutoencoderKL

    shapes = {
        # diffusers' SD3 pipeline test VAE: one block, so one latent is one pixel
        "vae_tiny": dict(sample_size=32, in_channels=3, out_channels=3, block_out_channels=(4,), layers_per_block=1,
                         latent_channels=4, norm_num_groups=1, use_quant_conv=False, use_post_quant_conv=False,
                         shift_factor=0.0609, scaling_factor=1.5035),
        # two blocks (2x upsampling, channel change with a shortcut conv) and the post-quant conv
        "vae_up": dict(sample_size=32, in_channels=3, out_channels=3, block_out_channels=(8, 16), layers_per_block=1,
                       latent_channels=4, norm_num_groups=4, use_post_quant_conv=True, shift_factor=0.1,
                       scaling_factor=0.9, down_block_types=("DownEncoderBlock2D",) * 2,
                       up_block_types=("UpDecoderBlock2D",) * 2),
    }
    for name, config in shapes.items():
        torch.manual_seed(5)
        model = AutoencoderKL(**config).eval()
        perturb_norms(model)
        folder = os.path.join(OUT, name)
        model.save_pretrained(folder, safe_serialization=True)
        g = torch.Generator().manual_seed(6)
        latents = torch.randn(2, config["latent_channels"], 6, 5, generator=g)
        with torch.no_grad():
            image = model.decode(latents / config["scaling_factor"] + config["shift_factor"]).sample
        save(f"{name}.safetensors", {"latents": latents, "image": image}, {"config": config})


PIPELINE_CASES = [
    # prompt, negative prompt, seed, steps, guidance scale, width, height
    ("a red circle on a blue background", "", 0, 3, 5.0, 32, 32),
    (" ".join(["a very long prompt about a small green triangle"] * 12), "blurry, low quality", 42, 2, 3.5, 40, 24),
    ("no guidance at all", "", 7, 2, 1.0, 16, 16),
]


def pipeline():
    import shutil

    from diffusers import (AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel,
                           StableDiffusion3Pipeline)
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, CLIPTokenizer

    folder = os.path.join(OUT, "sd3_tiny")
    shutil.rmtree(folder, ignore_errors=True)
    # A small vocabulary (CLIP's first 1000 merges) keeps the text encoders' embeddings small.
    tok_dir = os.path.join(OUT, "clip_tokenizer")
    vocab = json.load(open(os.path.join(tok_dir, "vocab.json"), encoding="utf-8"))
    merges = open(os.path.join(tok_dir, "merges.txt"), encoding="utf-8").read().split("\n")[1:1001]
    small = [t for t, i in sorted(vocab.items(), key=lambda kv: kv[1]) if i < 512]
    small += ["".join(m.split()) for m in merges] + ["<|startoftext|>", "<|endoftext|>"]
    tmp = os.path.join(OUT, "_small_tokenizer")
    os.makedirs(tmp, exist_ok=True)
    json.dump({t: i for i, t in enumerate(small)}, open(os.path.join(tmp, "vocab.json"), "w", encoding="utf-8"), ensure_ascii=False)
    open(os.path.join(tmp, "merges.txt"), "w", encoding="utf-8").write("#version: 0.2\n" + "\n".join(merges) + "\n")
    tokenizer = CLIPTokenizer.from_pretrained(tmp, model_max_length=77)
    tokenizer_2 = CLIPTokenizer.from_pretrained(tmp, pad_token="!", model_max_length=77)  # as SD3's second tokenizer
    shutil.rmtree(tmp)
    vocab_size, eos = len(small), len(small) - 1

    torch.manual_seed(10)
    clip = dict(hidden_size=32, intermediate_size=37, num_attention_heads=4, num_hidden_layers=5, vocab_size=vocab_size,
                hidden_act="gelu", projection_dim=32, layer_norm_eps=1e-5, bos_token_id=eos - 1)
    text_encoder = CLIPTextModelWithProjection(CLIPTextConfig(eos_token_id=eos, **clip)).eval()
    text_encoder_2 = CLIPTextModelWithProjection(CLIPTextConfig(eos_token_id=2, **clip)).eval()
    transformer = SD3Transformer2DModel(sample_size=32, patch_size=1, in_channels=4, num_layers=2, attention_head_dim=8,
                                        num_attention_heads=4, caption_projection_dim=32, joint_attention_dim=32,
                                        pooled_projection_dim=64, out_channels=4, pos_embed_max_size=40).eval()
    vae = AutoencoderKL(sample_size=32, in_channels=3, out_channels=3, block_out_channels=(4,), layers_per_block=1,
                        latent_channels=4, norm_num_groups=1, use_quant_conv=False, use_post_quant_conv=False,
                        shift_factor=0.0609, scaling_factor=1.5035).eval()
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    pipe = StableDiffusion3Pipeline(scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
                                    text_encoder_2=text_encoder_2, tokenizer_2=tokenizer_2, text_encoder_3=None,
                                    tokenizer_3=None, transformer=transformer)
    pipe.save_pretrained(folder, safe_serialization=True)

    tensors = {}
    for i, (prompt, negative, seed, steps, guidance, width, height) in enumerate(PIPELINE_CASES):
        kwargs = dict(prompt=prompt, negative_prompt=negative, num_inference_steps=steps, guidance_scale=guidance,
                      width=width, height=height)
        image = pipe(generator=torch.Generator("cpu").manual_seed(seed), output_type="np", **kwargs).images[0]
        latents = pipe(generator=torch.Generator("cpu").manual_seed(seed), output_type="latent", **kwargs).images[0]
        tensors[f"image.{i}"] = torch.from_numpy((image * 255).round().astype("uint8"))
        tensors[f"latents.{i}"] = latents.float()
    save("sd3_pipeline.safetensors", tensors, {"cases": PIPELINE_CASES})


PARTS = ["scheduler", "tokenizer", "clip", "transformer", "vae", "pipeline"]


def all_parts():
    """This file's parts, then those of every golden_*.py beside it (each lists its own PARTS)."""
    import glob
    import importlib

    parts = {name: globals()[name] for name in PARTS}
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    for path in sorted(glob.glob(os.path.join(here, "golden_*.py"))):
        module = importlib.import_module(os.path.splitext(os.path.basename(path))[0])
        for name in module.PARTS:
            parts[name] = getattr(module, name)
    return parts


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    parts = all_parts()
    for part in sys.argv[1:] or list(parts):
        if part not in parts:
            sys.exit(f"unknown part {part!r}; the parts are: {', '.join(parts)}")
        torch.manual_seed(0)
        parts[part]()
