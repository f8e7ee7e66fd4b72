"""Single-file FLUX.1 transformer checkpoints in Black Forest Labs' own tensor names (the layout of
flux1-dev.safetensors), made from the tiny FLUX.1-dev folder (models/tiny-random-flux-dev, fp32), and
the images diffusers makes with them. Files, in tests/data/golden/single_file/:

- flux_bfl_bf16.safetensors: every tensor in bf16, as black-forest-labs publish FLUX.1-dev.
- flux_bfl_fp8.safetensors: every tensor, biases and RMS-norm scales included, in float8_e4m3fn, cast
  from the bf16 values with no scale: the layout of the "flux1-dev-fp8" files users share. diffusers
  reads it like any file: its loader (load_model_dict_into_meta) casts each floating tensor with a
  plain .to(torch_dtype), so the weights are exactly the fp8 values.
- flux_bfl_scaled_fp8.safetensors: ComfyUI's "scaled fp8". Each 2-D weight X.weight is
  float8_e4m3fn with a 0-d fp32 X.scale_weight beside it, scale max|w| / 448 of the bf16 weight (the
  true weight is fp8 value * scale_weight); biases and norm scales stay bf16; and a zero-size
  float8_e4m3fn tensor "scaled_fp8" marks the file, as ComfyUI's own saver writes it
  (torch.tensor([], dtype=fp8); ComfyUI takes the fp8 dtype from the marker's dtype).

The transformer's tensors map to Black Forest Labs' names as below (to_bfl; from_bfl is its inverse,
splitting fused rows by the widths of the model's own config):

    img_in / txt_in                      x_embedder / context_embedder
    time_in.{in,out}_layer               time_text_embed.timestep_embedder.linear_{1,2}
    vector_in.{in,out}_layer             time_text_embed.text_embedder.linear_{1,2}
    guidance_in.{in,out}_layer           time_text_embed.guidance_embedder.linear_{1,2}
    double_blocks.N.img_mod.lin          transformer_blocks.N.norm1.linear
    double_blocks.N.txt_mod.lin          transformer_blocks.N.norm1_context.linear
    double_blocks.N.img_attn.qkv         attn.to_q ; to_k ; to_v            (rows stacked)
    double_blocks.N.txt_attn.qkv         attn.add_q_proj ; add_k_proj ; add_v_proj
    double_blocks.N.img_attn.norm.{query,key}_norm.scale   attn.norm_{q,k}.weight
    double_blocks.N.txt_attn.norm.{query,key}_norm.scale   attn.norm_added_{q,k}.weight
    double_blocks.N.img_attn.proj / txt_attn.proj          attn.to_out.0 / attn.to_add_out
    double_blocks.N.img_mlp.{0,2} / txt_mlp.{0,2}          ff.net.{0.proj,2} / ff_context.net.{0.proj,2}
    single_blocks.N.linear1              attn.to_q ; to_k ; to_v ; proj_mlp  (rows stacked)
    single_blocks.N.linear2              single_transformer_blocks.N.proj_out
    single_blocks.N.norm.{query,key}_norm.scale            attn.norm_{q,k}.weight
    single_blocks.N.modulation.lin       single_transformer_blocks.N.norm.linear
    final_layer.linear                   proj_out
    final_layer.adaLN_modulation.1       norm_out.linear, its two halves swapped (BFL: shift then
                                         scale; diffusers: scale then shift)

The reference images (single_file_pipeline.safetensors, cases in its metadata): FluxPipeline from the
folder with its transformer replaced.

- bfl_bf16, bfl_fp8: the transformer is FluxTransformer2DModel.from_single_file(file, config=folder,
  subfolder="transformer", torch_dtype=torch.float32). diffusers 0.42.1's FLUX converter splits
  linear1 by FLUX.1-dev's width written into it (inner_dim = 3072, the MLP 4 x that), so on this
  64-wide model it fails (torch.split's sizes do not add up to linear1's 448 rows). The workaround,
  here only: while loading, the converter registered for FluxTransformer2DModel is swapped for a copy
  of itself whose constant 3072 is the folder's width (heads x head dim); the rest of it is diffusers'
  own. The double blocks' qkv are split in three equal parts and need nothing.
- bfl_scaled_fp8: diffusers cannot read ComfyUI's scaled fp8 (it would drop the scales as unexpected
  keys). Its reference dequantizes the file here (fp8 .to(float32) * scale_weight, the bf16 tensors
  .to(float32)), renames it with from_bfl and loads it into the folder's transformer with
  load_state_dict(strict=True).
- folder: the same call with the folder's own fp32 transformer, for comparison.

Checks made on the way (the run stops if one fails): the bf16 file, converted back by diffusers, equals
the folder's weights cast to bf16 exactly, key for key; from_single_file's weights for the fp8 file
are exactly its fp8 values upcast; bfl_bf16's latents equal those of the folder pipeline whose
transformer weights were rounded to bf16 (so they differ from the fp32 folder's by bf16 rounding
alone; the difference is printed).
"""
import contextlib
import json
import os
import types

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from make_golden import OUT, save

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
FOLDER = os.path.join(ROOT, "models", "tiny-random-flux-dev")
FILES = os.path.join(OUT, "single_file")
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
CALL = dict(prompt="a red fox in the snow", seed=3, steps=3, guidance_scale=3.5, width=32, height=32,
            max_sequence_length=32)
PARTS = ["single_file"]


def _linear(bfl, diffusers):
    return [(f"{bfl}.{p}", "same", [f"{diffusers}.{p}"]) for p in ("weight", "bias")]


def _fused(bfl, diffusers):
    return [(f"{bfl}.{p}", "rows", [f"{d}.{p}" for d in diffusers]) for p in ("weight", "bias")]


def key_table(config):
    """(BFL name, how, [diffusers names]) for every tensor of a FluxTransformer2DModel with `config`.
    how: "same" one tensor renamed; "rows" the diffusers tensors stacked along dim 0, in order;
    "swap" the diffusers tensor with its two halves along dim 0 exchanged."""
    table = _linear("img_in", "x_embedder") + _linear("txt_in", "context_embedder")
    embedders = [("time_in", "timestep_embedder"), ("vector_in", "text_embedder")]
    if config["guidance_embeds"]:
        embedders.append(("guidance_in", "guidance_embedder"))
    for bfl, diffusers in embedders:
        table += _linear(f"{bfl}.in_layer", f"time_text_embed.{diffusers}.linear_1")
        table += _linear(f"{bfl}.out_layer", f"time_text_embed.{diffusers}.linear_2")
    for n in range(config["num_layers"]):
        b, d = f"double_blocks.{n}", f"transformer_blocks.{n}"
        table += _linear(f"{b}.img_mod.lin", f"{d}.norm1.linear")
        table += _linear(f"{b}.txt_mod.lin", f"{d}.norm1_context.linear")
        table += _fused(f"{b}.img_attn.qkv", [f"{d}.attn.to_{x}" for x in "qkv"])
        table += _fused(f"{b}.txt_attn.qkv", [f"{d}.attn.add_{x}_proj" for x in "qkv"])
        for stream, prefix in (("img", "norm_"), ("txt", "norm_added_")):
            for which in ("query", "key"):
                table.append((f"{b}.{stream}_attn.norm.{which}_norm.scale", "same",
                              [f"{d}.attn.{prefix}{which[0]}.weight"]))
        table += _linear(f"{b}.img_attn.proj", f"{d}.attn.to_out.0")
        table += _linear(f"{b}.txt_attn.proj", f"{d}.attn.to_add_out")
        for stream, ff in (("img", "ff"), ("txt", "ff_context")):
            table += _linear(f"{b}.{stream}_mlp.0", f"{d}.{ff}.net.0.proj")
            table += _linear(f"{b}.{stream}_mlp.2", f"{d}.{ff}.net.2")
    for n in range(config["num_single_layers"]):
        b, d = f"single_blocks.{n}", f"single_transformer_blocks.{n}"
        table += _linear(f"{b}.modulation.lin", f"{d}.norm.linear")
        table += _fused(f"{b}.linear1", [f"{d}.attn.to_{x}" for x in "qkv"] + [f"{d}.proj_mlp"])
        table += _linear(f"{b}.linear2", f"{d}.proj_out")
        for which in ("query", "key"):
            table.append((f"{b}.norm.{which}_norm.scale", "same", [f"{d}.attn.norm_{which[0]}.weight"]))
    table += _linear("final_layer.linear", "proj_out")
    table += [(f"final_layer.adaLN_modulation.1.{p}", "swap", [f"norm_out.linear.{p}"]) for p in ("weight", "bias")]
    return table


def _swap_halves(t):
    first, second = t.chunk(2, dim=0)
    return torch.cat([second, first], dim=0)


def to_layout(state, table):
    """A diffusers state dict in a file's own names, by `table` (entries as key_table's)."""
    out, used = {}, set()
    for name, how, names in table:
        parts = [state[n] for n in names]
        used.update(names)
        out[name] = torch.cat(parts, dim=0) if how == "rows" else _swap_halves(parts[0]) if how == "swap" else parts[0]
    left = set(state) - used
    assert not left, f"tensors the table does not name: {sorted(left)}"
    return out


def from_layout(state, table, rows):
    """The inverse of to_layout; `rows` gives each diffusers tensor's first dimension (the split sizes)."""
    out = {}
    left = set(state) - {name for name, _, _ in table}
    assert not left, f"tensors the table does not name: {sorted(left)}"
    for name, how, names in table:
        t = state[name]
        if how == "rows":
            out.update(zip(names, torch.split(t, [rows[n] for n in names], dim=0)))
        else:
            out[names[0]] = _swap_halves(t) if how == "swap" else t
    return {k: v.contiguous() for k, v in out.items()}


def to_bfl(state, config):
    """A diffusers FluxTransformer2DModel state dict in Black Forest Labs' names."""
    return to_layout(state, key_table(config))


def from_bfl(state, config, rows):
    """The inverse of to_bfl; `rows` gives each diffusers tensor's first dimension (the split sizes)."""
    return from_layout(state, key_table(config), rows)


def scaled_fp8(bf16):
    """ComfyUI's scaled fp8 from a bf16 BFL state dict."""
    out = {"scaled_fp8": torch.tensor([], dtype=FP8)}
    for name, t in bf16.items():
        if name.endswith(".weight") and t.dim() == 2:
            w = t.float()
            scale = w.abs().max() / FP8_MAX
            out[name] = (w / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
            out[name[:-len("weight")] + "scale_weight"] = scale.reshape(()).to(torch.float32)
        else:
            out[name] = t
    return out


def dequantize_scaled_fp8(state):
    assert state["scaled_fp8"].numel() == 0 and state["scaled_fp8"].dtype == FP8
    out = {}
    for name, t in state.items():
        if name == "scaled_fp8" or name.endswith(".scale_weight"):
            continue
        scale = state.get(name[:-len("weight")] + "scale_weight") if name.endswith(".weight") else None
        out[name] = t.to(torch.float32) * scale if scale is not None else t.to(torch.float32)
    return out


def save_files(files, folder=FILES):
    """{case: (file name, tensors)} saved in `folder` as safetensors; returns {case: path}."""
    os.makedirs(folder, exist_ok=True)
    paths = {}
    for case, (name, tensors) in files.items():
        paths[case] = os.path.join(folder, name)
        save_file(tensors, paths[case], metadata={"format": "pt"})
        print(f"{paths[case]}: {len(tensors)} tensors, {os.path.getsize(paths[case])} bytes")
    return paths


def flux_pipeline(transformer):
    """The tiny FLUX.1-dev folder's pipeline in fp32, with `transformer` when given."""
    from diffusers import FluxPipeline

    parts = {} if transformer is None else {"transformer": transformer}
    pipe = FluxPipeline.from_pretrained(FOLDER, torch_dtype=torch.float32, **parts)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def flux_from_state(state):
    """The folder's transformer with the weights of `state` (diffusers' names), strictly."""
    from diffusers import FluxTransformer2DModel

    model = FluxTransformer2DModel.from_pretrained(FOLDER, subfolder="transformer", torch_dtype=torch.float32)
    model.load_state_dict(state, strict=True)
    return model.eval()


@contextlib.contextmanager
def converter_width(inner):
    """diffusers' FLUX converter with its hard-coded width 3072 replaced by `inner` (see the docstring)."""
    from diffusers.loaders import single_file_model

    entry = single_file_model.SINGLE_FILE_LOADABLE_CLASSES["FluxTransformer2DModel"]
    original = entry["checkpoint_mapping_fn"]
    code = original.__code__
    hits = [c for c in code.co_consts if type(c) is int and c == 3072]
    assert len(hits) == 1, "diffusers' FLUX converter changed: check the width workaround"
    consts = tuple(inner if (type(c) is int and c == 3072) else c for c in code.co_consts)
    patched = types.FunctionType(code.replace(co_consts=consts), original.__globals__, original.__name__,
                                 original.__defaults__, original.__closure__)
    patched.__kwdefaults__ = original.__kwdefaults__
    entry["checkpoint_mapping_fn"] = patched
    try:
        yield patched
    finally:
        entry["checkpoint_mapping_fn"] = original


def _run(pipe, call=CALL):
    args = dict(call)
    seed = args.pop("seed")
    args["num_inference_steps"] = args.pop("steps")
    image = pipe(generator=torch.Generator("cpu").manual_seed(seed), output_type="np", **args).images[0]
    latents = pipe(generator=torch.Generator("cpu").manual_seed(seed), output_type="latent", **args).images[0]
    return torch.from_numpy((image * 255).round().astype(np.uint8)), latents.float()


def _exactly_equal(a, b, what):
    assert a.keys() == b.keys(), f"{what}: the names differ: {sorted(set(a) ^ set(b))}"
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), f"{what}: {k} differs"
    print(f"{what}: {len(a)} tensors exactly equal")


def single_file():
    from diffusers import FluxPipeline, FluxTransformer2DModel
    from diffusers.loaders.single_file_utils import convert_flux_transformer_checkpoint_to_diffusers

    config = json.load(open(os.path.join(FOLDER, "transformer", "config.json")))
    inner = config["num_attention_heads"] * config["attention_head_dim"]
    folder_sd = load_file(os.path.join(FOLDER, "transformer", "diffusion_pytorch_model.safetensors"))
    rows = {k: v.shape[0] for k, v in folder_sd.items()}

    bf16 = {k: v.to(torch.bfloat16) for k, v in to_bfl(folder_sd, config).items()}
    fp8 = {k: v.clamp(-FP8_MAX, FP8_MAX).to(FP8) for k, v in bf16.items()}
    assert all(v.float().abs().max() < FP8_MAX for v in bf16.values()), "a weight beyond fp8's range"
    files = {"bfl_bf16": ("flux_bfl_bf16.safetensors", bf16), "bfl_fp8": ("flux_bfl_fp8.safetensors", fp8),
             "bfl_scaled_fp8": ("flux_bfl_scaled_fp8.safetensors", scaled_fp8(bf16))}
    paths = save_files(files)

    # The round trip: diffusers' converter (at the tiny width) undoes to_bfl exactly.
    folder_bf16 = {k: v.to(torch.bfloat16) for k, v in folder_sd.items()}
    try:
        convert_flux_transformer_checkpoint_to_diffusers(load_file(paths["bfl_bf16"]))
        print("diffusers' converter reads the tiny file unpatched")
    except RuntimeError as e:
        print(f"diffusers' converter, unpatched, fails as expected: {str(e).splitlines()[0]}")
    with converter_width(inner) as convert:
        _exactly_equal(convert(checkpoint=load_file(paths["bfl_bf16"])), folder_bf16, "bf16 file via diffusers")
    _exactly_equal(from_bfl(load_file(paths["bfl_bf16"]), config, rows), folder_bf16, "bf16 file via from_bfl")

    pipeline, from_state = flux_pipeline, flux_from_state

    tensors, meta = {}, {}
    for case in ("bfl_bf16", "bfl_fp8"):
        with converter_width(inner):
            transformer = FluxTransformer2DModel.from_single_file(
                paths[case], config=FOLDER, subfolder="transformer", torch_dtype=torch.float32)
        upcast = from_bfl({k: v.to(torch.float32) for k, v in load_file(paths[case]).items()}, config, rows)
        _exactly_equal(transformer.state_dict(), upcast, f"{case}: from_single_file vs the file upcast")
        tensors[case + ".image"], tensors[case + ".latents"] = _run(pipeline(transformer))
        meta[case] = dict(file=os.path.relpath(paths[case], ROOT), loader="from_single_file", **CALL)

    weights = from_bfl(dequantize_scaled_fp8(load_file(paths["bfl_scaled_fp8"])), config, rows)
    err = max(((weights[k] - v).abs().max() / v.abs().max().clamp_min(1e-12)).item() for k, v in folder_sd.items())
    print(f"bfl_scaled_fp8: dequantized weights within {err:.4f} of the folder's (relative to each max)")
    tensors["bfl_scaled_fp8.image"], tensors["bfl_scaled_fp8.latents"] = _run(pipeline(from_state(weights)))
    meta["bfl_scaled_fp8"] = dict(file=os.path.relpath(paths["bfl_scaled_fp8"], ROOT),
                                  loader="dequantized here, load_state_dict", **CALL)

    tensors["folder.image"], tensors["folder.latents"] = _run(pipeline(None))
    meta["folder"] = dict(folder=os.path.relpath(FOLDER, ROOT), loader="from_pretrained", **CALL)

    rounded = _run(pipeline(from_state({k: v.to(torch.bfloat16).float() for k, v in folder_sd.items()})))[1]
    assert torch.equal(rounded, tensors["bfl_bf16.latents"]), "bf16 file != the folder rounded to bf16"
    print("bfl_bf16: latents exactly those of the folder with its transformer rounded to bf16")
    for case in ("bfl_bf16", "bfl_fp8", "bfl_scaled_fp8"):
        diff = (tensors[case + ".latents"] - tensors["folder.latents"]).abs().max().item()
        print(f"{case}: latents max |diff| from the fp32 folder's {diff:.6g} "
              f"(latents max |x| {tensors['folder.latents'].abs().max().item():.4g})")
    save("single_file_pipeline.safetensors", tensors, meta)
