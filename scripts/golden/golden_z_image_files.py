"""Single-file Z-Image transformers in the original (Tongyi / Lumina 2 "NextDiT") tensor names that
ComfyUI's files use, in bf16, fp8, ComfyUI's scaled fp8 and GGUF, made from the tiny Z-Image folder
(models/tiny-random-z-image, fp32), and the images diffusers makes with them. Files:

- single_file/z_image_comfy_bf16.safetensors: every tensor in bf16, no prefix, as Comfy-Org's split
  z_image_turbo_bf16.safetensors holds them.
- single_file/z_image_comfy_fp8.safetensors: every tensor (norm scales and pad tokens included) in
  float8_e4m3fn, cast from the bf16 values with no scale, every name under "model.diffusion_model."
  (the prefix ComfyUI's checkpoint savers write; diffusers' CHECKPOINT_KEY_NAMES["z-image-turbo"]
  knows both forms). diffusers casts each tensor with a plain .to(torch_dtype): the weights are
  exactly the fp8 values.
- single_file/z_image_comfy_scaled_fp8.safetensors: ComfyUI's scaled fp8, no prefix, as
  golden_single_file.scaled_fp8 writes it: each 2-D X.weight float8_e4m3fn with a 0-d fp32
  X.scale_weight (max|w| / 448 of the bf16 weight; the weight is fp8 value * scale_weight); every
  other tensor (1-D norm scales, biases, the [1, 240] pad tokens, which are no ".weight") bf16; the
  zero-size float8_e4m3fn marker "scaled_fp8".
- gguf/z_image_Q8_0.gguf (a Q4_K file is not written, see GGUF_FILES): the file's names with no prefix, as city96's
  convert.py writes them (general.architecture "lumina2", the arch it detects Z-Image as by
  cap_embedder.1.weight and context_refiner.0.attention.qkv.weight; general.quantization_version 2,
  general.file_type MOSTLY_Q8_0 / MOSTLY_Q4_K_M), written by golden_gguf.write_gguf. The tensor
  types (plan below): x_pad_token and cap_pad_token F32 (convert.py keeps "pad_token" in full
  precision), every 1-D tensor F32. z_image_Q8_0: 2-D weights with a row (input width) of a multiple
  of 32 Q8_0, the others BF16. The tiny model's width is 240 = 7.5 x 32, so only x_embedder,
  cap_embedder.1 (rows 64), t_embedder.mlp.0 (256), t_embedder.mlp.2 (1024) and feed_forward.w2
  (640) can be Q8_0; the qkv, out, w1, w3, adaLN and final_layer weights (rows of 240) are BF16
  (convert.py would fall back to F32 where gguf-py cannot quantize, which a real Z-Image, 3840 wide,
  never needs; BF16 halves the file and covers the type). z_image_Q4_K: rows of a multiple of 256 Q4_K (t_embedder.mlp.0 and
  .2; golden_gguf's own encoder); x_embedder, cap_embedder and final_layer BF16 (the type
  convert.py writes from a bf16 source, kept by the quantizer); every other 2-D weight F16 (the
  patched llama.cpp's fallback where no K-quant fits). The fused qkv is therefore never a quantized
  tensor here (FLUX's GGUFs cover splitting quantized rows).

Both files hold norm_final.weight too (1-D, random, 1 + 0.1 N(0, 1)): the original model has an
RMSNorm by that name that its forward never uses, and diffusers' converter drops it.

The file's names, the original model's, map to diffusers' ZImageTransformer2DModel as below (to_original;
from_original is its inverse: strip "model.diffusion_model.", drop norm_final.weight). This is what
diffusers' convert_z_image_transformer_checkpoint_to_diffusers does with string replacements:

    x_embedder.{weight,bias}                      all_x_embedder.2-1.{weight,bias}
    final_layer.linear.{weight,bias}              all_final_layer.2-1.linear.{weight,bias}
    final_layer.adaLN_modulation.1.{weight,bias}  all_final_layer.2-1.adaLN_modulation.1.* (scale
                                                  only, dim rows: nothing to swap)
    B.attention.qkv.weight                        B.attention.to_q ; to_k ; to_v .weight: three equal
                                                  row blocks in that order (torch.chunk(3, dim=0))
    B.attention.out.weight                        B.attention.to_out.0.weight
    B.attention.q_norm.weight / k_norm.weight     B.attention.norm_q.weight / norm_k.weight
    norm_final.weight                             dropped (unused)
    unchanged: t_embedder.mlp.{0,2}.*, cap_embedder.{0,1}.*, x_pad_token, cap_pad_token ([1, dim]),
               B.feed_forward.w{1,2,3}.weight, B.attention_norm{1,2}.weight, B.ffn_norm{1,2}.weight,
               B.adaLN_modulation.0.{weight,bias} (not in the context refiner)

B is layers.N, noise_refiner.N or context_refiner.N. No attention tensor has a bias.

The reference images, z_image_files.safetensors (cases in its metadata: golden_z_image's "cfg" call,
"file" and "folder" relative to the repository, "loader"); ZImagePipeline from the folder, fp32, with
its transformer replaced:

- comfy_bf16, comfy_fp8: ZImageTransformer2DModel.from_single_file(file, config=folder,
  subfolder="transformer", torch_dtype=torch.float32).
- comfy_scaled_fp8: diffusers cannot read ComfyUI's scaled fp8; the file is dequantized here (fp8
  .to(float32) * scale_weight, the rest .to(float32)), renamed with from_original and loaded into the
  folder's transformer with load_state_dict(strict=True).
- q8_0, q4_k: from_single_file(file, quantization_config=GGUFQuantizationConfig(compute_dtype=
  torch.float32), config=folder, subfolder="transformer", torch_dtype=torch.float32), on the CPU
  (diffusers computes with its fp16 dequantization: see golden_gguf); q8_0_exact, q4_k_exact: every
  tensor dequantized by gguf-py (exact, fp32), from_original, load_state_dict.
- folder: the folder's own fp32 pipeline.

Checks made on the way (the run stops if one fails): diffusers' converter turns the bf16 file into
exactly the folder's weights rounded to bf16, and the prefixed fp8 file into exactly its fp8 values
in diffusers' names; from_single_file's weights are exactly each file's values upcast; comfy_bf16's
latents are exactly those of the folder with its transformer rounded to bf16; the GGUF runs are
those of the fp32 transformer with diffusers' dequantized weights (golden_gguf.pipeline_cases).
"""
import json
import os

import torch
from safetensors.torch import load_file

from golden_gguf import QK_K, dequantize_file, pipeline_cases, print_differences, write_files
from golden_sd3_single_file import _bf16, _diff, _load_weights, _meta, _rounded, _upcast
from golden_single_file import (FP8, FP8_MAX, _exactly_equal, _linear, _run, dequantize_scaled_fp8, from_layout,
                                save_files, scaled_fp8, to_layout)
from golden_z_image import FOLDER, _load, call
from make_golden import OUT, save

PARTS = ["z_image_files"]
CALL = call("cfg")
PREFIX = "model.diffusion_model."
ARCH = "lumina2"
PADS = ("x_pad_token", "cap_pad_token")
KEEP_FLOAT = ("x_embedder.", "cap_embedder.", "final_layer.")  # BF16 in the Q4_K file
# Q8_0 only: at this width K-quants fit two tensors (t_embedder's), and FLUX.1's GGUFs cover them;
# the file would add 7 MB for little (plan() still says what a Q4_K file would hold).
GGUF_FILES = {"q8_0": "z_image_Q8_0.gguf"}


def key_table(config):
    """(original name, how, [diffusers names]) for every tensor of a ZImageTransformer2DModel with
    `config`, as golden_single_file.key_table's ("rows": the diffusers tensors stacked along dim 0)."""
    same = lambda name, diffusers=None: (name, "same", [diffusers or name])  # noqa: E731
    table = _linear("x_embedder", "all_x_embedder.2-1") + _linear("final_layer.linear", "all_final_layer.2-1.linear")
    table += _linear("final_layer.adaLN_modulation.1", "all_final_layer.2-1.adaLN_modulation.1")
    for name in ("t_embedder.mlp.0", "t_embedder.mlp.2", "cap_embedder.1"):
        table += _linear(name, name)
    table += [same("cap_embedder.0.weight")] + [same(pad) for pad in PADS]
    blocks = [(f"layers.{n}", True) for n in range(config["n_layers"])]
    blocks += [(f"noise_refiner.{n}", True) for n in range(config["n_refiner_layers"])]
    blocks += [(f"context_refiner.{n}", False) for n in range(config["n_refiner_layers"])]
    for block, modulated in blocks:
        a = f"{block}.attention"
        table.append((f"{a}.qkv.weight", "rows", [f"{a}.to_{x}.weight" for x in "qkv"]))
        table.append(same(f"{a}.out.weight", f"{a}.to_out.0.weight"))
        table += [same(f"{a}.{x}_norm.weight", f"{a}.norm_{x}.weight") for x in "qk"]
        table += [same(f"{block}.{m}.weight") for m in ("feed_forward.w1", "feed_forward.w2", "feed_forward.w3",
                                                        "attention_norm1", "attention_norm2", "ffn_norm1", "ffn_norm2")]
        if modulated:
            table += _linear(f"{block}.adaLN_modulation.0", f"{block}.adaLN_modulation.0")
    return table


def to_original(state, config, prefix=""):
    """A diffusers ZImageTransformer2DModel state dict in the original names, with norm_final.weight."""
    out = to_layout(state, key_table(config))
    out["norm_final.weight"] = 1 + 0.1 * torch.randn(config["dim"], generator=torch.Generator().manual_seed(90))
    return {prefix + k: v for k, v in out.items()}


def from_original(state, config, rows):
    state = {k.removeprefix(PREFIX): v for k, v in state.items()}
    del state["norm_final.weight"]
    return from_layout(state, key_table(config), rows)


def plan(name, shape, kind):
    """The ggml type name of original tensor `name` in the GGUF file of `kind` (see the docstring)."""
    if name in PADS or len(shape) == 1:
        return "F32"
    row = shape[-1]
    if kind == "q8_0":
        return "Q8_0" if row % 32 == 0 else "BF16"
    if row % QK_K == 0:
        return "Q4_K"
    return "BF16" if name.startswith(KEEP_FLOAT) else "F16"


def _from_state(state):
    from diffusers import ZImageTransformer2DModel

    model = ZImageTransformer2DModel.from_pretrained(FOLDER, subfolder="transformer", torch_dtype=torch.float32)
    return _load_weights(model, state)


def _pipeline(transformer):
    return _load(**({} if transformer is None else {"transformer": transformer}))


def _single_file_cases(config, folder_sd, rows):
    from diffusers import ZImageTransformer2DModel
    from diffusers.loaders.single_file_utils import convert_z_image_transformer_checkpoint_to_diffusers

    bf16 = _bf16(to_original(folder_sd, config))
    assert all(v.float().abs().max() < FP8_MAX for v in bf16.values()), "a weight beyond fp8's range"
    fp8 = {PREFIX + k: v.clamp(-FP8_MAX, FP8_MAX).to(FP8) for k, v in bf16.items()}
    paths = save_files({"comfy_bf16": ("z_image_comfy_bf16.safetensors", bf16),
                        "comfy_fp8": ("z_image_comfy_fp8.safetensors", fp8),
                        "comfy_scaled_fp8": ("z_image_comfy_scaled_fp8.safetensors", scaled_fp8(bf16))})

    convert = convert_z_image_transformer_checkpoint_to_diffusers
    _exactly_equal(convert(load_file(paths["comfy_bf16"])), _bf16(folder_sd), "bf16 file via diffusers")
    _exactly_equal(from_original(load_file(paths["comfy_bf16"]), config, rows), _bf16(folder_sd),
                   "bf16 file via from_original")
    _exactly_equal(convert(load_file(paths["comfy_fp8"])), from_original(load_file(paths["comfy_fp8"]), config, rows),
                   "prefixed fp8 file: diffusers vs from_original")

    tensors, meta = {}, {}
    for case in ("comfy_bf16", "comfy_fp8"):
        transformer = ZImageTransformer2DModel.from_single_file(paths[case], config=FOLDER, subfolder="transformer",
                                                                torch_dtype=torch.float32)
        upcast = from_original(_upcast(load_file(paths[case])), config, rows)
        _exactly_equal(transformer.state_dict(), upcast, f"{case}: from_single_file vs the file upcast")
        tensors[case + ".image"], tensors[case + ".latents"] = _run(_pipeline(transformer), CALL)
        meta[case] = _meta(CALL, paths[case], FOLDER, "ZImageTransformer2DModel.from_single_file")

    weights = from_original(dequantize_scaled_fp8(load_file(paths["comfy_scaled_fp8"])), config, rows)
    err = max(((weights[k] - v).abs().max() / v.abs().max().clamp_min(1e-12)).item() for k, v in folder_sd.items())
    print(f"comfy_scaled_fp8: dequantized weights within {err:.4f} of the folder's (relative to each max)")
    tensors["comfy_scaled_fp8.image"], tensors["comfy_scaled_fp8.latents"] = _run(_pipeline(_from_state(weights)), CALL)
    meta["comfy_scaled_fp8"] = _meta(CALL, paths["comfy_scaled_fp8"], FOLDER, "dequantized here, load_state_dict")

    rounded = _run(_pipeline(_from_state(_rounded(folder_sd))), CALL)[1]
    assert torch.equal(rounded, tensors["comfy_bf16.latents"]), "bf16 file != the folder rounded to bf16"
    print("comfy_bf16: latents exactly those of the folder with its transformer rounded to bf16")
    return tensors, meta


def _gguf_cases(config, folder_sd, rows):
    from diffusers import GGUFQuantizationConfig, ZImageTransformer2DModel

    from golden_gguf import FILES

    os.makedirs(FILES, exist_ok=True)
    paths = {kind: os.path.join(FILES, name) for kind, name in GGUF_FILES.items()}
    write_files(paths, to_original(folder_sd, config), ARCH, plan)

    def load(path):
        return ZImageTransformer2DModel.from_single_file(
            path, quantization_config=GGUFQuantizationConfig(compute_dtype=torch.float32), config=FOLDER,
            subfolder="transformer", torch_dtype=torch.float32)

    return pipeline_cases(paths, load, lambda model: _run(_pipeline(model), CALL), _from_state,
                          lambda path: from_original(dequantize_file(path, ARCH), config, rows),
                          lambda path, loader: _meta(CALL, path, FOLDER, loader))


def z_image_files():
    config = json.load(open(os.path.join(FOLDER, "transformer", "config.json")))
    folder_sd = load_file(os.path.join(FOLDER, "transformer", "diffusion_pytorch_model.safetensors"))
    rows = {k: v.shape[0] for k, v in folder_sd.items()}
    tensors, meta = _single_file_cases(config, folder_sd, rows)
    more = _gguf_cases(config, folder_sd, rows)
    tensors.update(more[0])
    meta.update(more[1])
    tensors["folder.image"], tensors["folder.latents"] = _run(_pipeline(None), CALL)
    meta["folder"] = _meta(CALL, None, FOLDER, "ZImagePipeline.from_pretrained")
    for case in ("comfy_bf16", "comfy_fp8", "comfy_scaled_fp8"):
        _diff(tensors, case, "folder")
    print_differences(tensors, GGUF_FILES)
    save("z_image_files.safetensors", tensors, meta)
