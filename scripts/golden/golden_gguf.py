"""GGUF: ggml's block quantizations, and the tiny FLUX.1-dev transformer (models/tiny-random-flux-dev) in
GGUF files laid out like the FLUX GGUFs users download (city96's FLUX.1-dev-gguf), with the images
diffusers makes from them. Files, in tests/data/golden/:

- gguf_quants.safetensors: for each ggml type of QUANT_TYPES, a few blocks of random but valid bytes
  (<TYPE>.blocks, U8, one row per block) and what gguf-py's gguf.quants.dequantize makes of them
  (<TYPE>.values, F32, one row per block). Every byte is uniformly random except the fp16 scale
  fields (d, dmin, m), which are random finite fp16 values of magnitude in [0.001, 0.1] and random
  sign; F16 and BF16 "blocks" (one element each) are random bit patterns, Inf and NaN excluded. For
  the types diffusers dequantizes itself (all but F16), <TYPE>.values_diffusers is what diffusers'
  own dequantizer makes of the same bytes: it computes in fp16 (see "diffusers computes in fp16").
  The metadata ("cases") gives each type's ggml type id, block size (elements), block bytes (gguf-py's
  GGML_QUANT_SIZES), the byte offsets of its fp16 fields and its number of blocks.
- gguf/flux_q8_0.gguf, gguf/flux_q4_k.gguf, gguf/flux_q6_k.gguf: the folder's fp32 transformer in
  Black Forest Labs' tensor names (golden_single_file.key_table; no "model.diffusion_model." prefix),
  written with gguf-py's GGUFWriter. As in every GGUF, a tensor's dims are ggml's ne, innermost
  first: torch's shape reversed (a Linear weight [out, in] is stored as ne = [in, out]); quantized
  blocks run along ne[0], the row. Metadata, as city96's files carry it: general.architecture =
  "flux", general.quantization_version = 2 (uint32), general.file_type (uint32, llama.cpp's ftype);
  the default alignment (32, no general.alignment key). The tensor types, per file:
  - flux_q8_0: every 2-D weight Q8_0 (all their rows, 32, 64, 256 and 320 wide, are multiples of
    32); every 1-D tensor (biases, RMS-norm scales) F16. That is the layout of city96's published
    FLUX.1-dev Q8_0 (and the other _0/_1 quants): made with gguf-py before his llama.cpp path, they
    hold F16 where the K-quant files hold F32 (city96/ComfyUI-GGUF issue #79).
  - flux_q4_k / flux_q6_k: 2-D weights whose row is a multiple of 256 in Q4_K / Q6_K, six of them
    (rows of 256): double_blocks.{0,1}.{img,txt}_mlp.2, time_in.in_layer and guidance_in.in_layer;
    the single blocks' linear2 rows are 320 wide. city96's llama.cpp quantizer keeps img_in,
    txt_in, time_in, vector_in, guidance_in and final_layer in the float type of the file it
    quantizes (F16 or BF16, by the source; his convert.py writes BF16 from a bf16 source): here
    their weights that are not K-quantized are F16 in flux_q4_k and BF16 in flux_q6_k, so that both
    float types of 2-D weight are covered. Every other 2-D weight (row 64 or 320) is Q8_0; every 1-D
    tensor F32 (convert.py's rule for 1-D tensors).
  gguf-py cannot quantize K-quants: q4_k() and q6_k() below are our own simple encoders (per
  sub-block scale from its range, plain rounding; not ggml's search for the best scales), checked by
  dequantizing their blocks with gguf-py: any valid encoding is a test of the decoder.
- gguf_pipeline.safetensors (cases in its metadata): FluxPipeline from the folder with its
  transformer replaced, the call of golden_single_file.CALL. For each file (case q8_0, q4_k, q6_k):
  FluxTransformer2DModel.from_single_file(file, quantization_config=GGUFQuantizationConfig(
  compute_dtype=torch.float32), config=folder, subfolder="transformer", torch_dtype=torch.float32),
  on the CPU, within golden_single_file.converter_width (diffusers' FLUX converter, which its GGUF
  path goes through too, hard-codes FLUX.1-dev's width 3072 for linear1's split). And <case>_exact:
  every tensor dequantized here by gguf-py (exactly, in fp32, as ggml does), renamed with from_bfl
  and loaded into the folder's fp32 transformer with load_state_dict.

diffusers computes in fp16: its GGUF layers (GGUFLinear) dequantize their weight at every call with
diffusers' own torch port of the dequantizers, which works in the dtype of the fp16 scale fields: each
product and sum is rounded to fp16 before the result is cast to compute_dtype. So the weights of the
diffusers cases are not ggml's values but those rounded (through more than one rounding for the
types with several operations). F16 and F32 tensors are read as plain tensors and cast to fp32
exactly; BF16 ones go through GGUFLinear but dequantize exactly. The run checks that the diffusers
latents are exactly those of the fp32 transformer loaded with diffusers' dequantized weights, and
prints how far the _exact latents are from them.
"""
import json
import os

import numpy as np
import torch
from safetensors.torch import load_file

from golden_single_file import CALL, FOLDER, ROOT, _run, converter_width, flux_from_state, flux_pipeline, from_bfl, to_bfl
from make_golden import OUT, save

PARTS = ["gguf"]
FILES = os.path.join(OUT, "gguf")
QUANT_TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "F16", "BF16"]
# Byte offsets of each type's fp16 fields in its block (ggml's block_q* structs).
FP16_FIELDS = {
    "Q8_0": {"d": 0}, "Q4_0": {"d": 0}, "Q4_1": {"d": 0, "m": 2}, "Q5_0": {"d": 0}, "Q5_1": {"d": 0, "m": 2},
    "Q2_K": {"d": 80, "dmin": 82}, "Q3_K": {"d": 108}, "Q4_K": {"d": 0, "dmin": 2}, "Q5_K": {"d": 0, "dmin": 2},
    "Q6_K": {"d": 208}, "F16": {}, "BF16": {},
}
QK_K = 256
# Embedders and final layer: city96's quantizer keeps them in the source file's float type.
KEEP_FLOAT = ("img_in.", "txt_in.", "time_in.", "vector_in.", "guidance_in.", "final_layer.")


def _random_blocks(name, rng):
    """Random valid blocks of ggml type `name`: (n_blocks, type_size) uint8."""
    import gguf

    qtype = gguf.GGMLQuantizationType[name]
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    if name in ("F16", "BF16"):
        bits = rng.integers(0, 1 << 16, size=96, dtype=np.uint32).astype(np.uint16)
        exponent = (bits >> 10) & 0x1F if name == "F16" else (bits >> 7) & 0xFF
        bits = bits[exponent != (0x1F if name == "F16" else 0xFF)][:64]  # no Inf, no NaN
        bits[:4] = [0x0000, 0x8000, 0x0001, 0x8001]  # +0, -0 and the smallest subnormals
        return bits.view(np.uint8).reshape(-1, type_size)
    n_blocks = 8 if block_size == 32 else 4
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint16).astype(np.uint8)
    for offset in FP16_FIELDS[name].values():
        value = rng.uniform(0.001, 0.1, size=n_blocks) * rng.choice([-1.0, 1.0], size=n_blocks)
        blocks[:, offset:offset + 2] = value.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    return blocks


def quants():
    import gguf
    from diffusers.quantizers.gguf.utils import GGUFParameter, dequantize_gguf_tensor

    rng = np.random.default_rng(20240801)
    tensors, meta = {}, {}
    for name in QUANT_TYPES:
        qtype = gguf.GGMLQuantizationType[name]
        block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
        blocks = _random_blocks(name, rng)
        values = gguf.quants.dequantize(blocks, qtype)
        assert values.shape == (blocks.shape[0], block_size) and np.isfinite(values).all(), name
        tensors[f"{name}.blocks"] = torch.from_numpy(blocks.copy())
        tensors[f"{name}.values"] = torch.from_numpy(values.astype(np.float32))
        if name != "F16":  # diffusers reads F16 (and F32) as plain tensors
            ours = dequantize_gguf_tensor(GGUFParameter(torch.from_numpy(blocks.copy()), quant_type=qtype))
            tensors[f"{name}.values_diffusers"] = ours.float().reshape(values.shape)
            diff = (tensors[f"{name}.values_diffusers"] - tensors[f"{name}.values"]).abs()
            print(f"{name}: diffusers' fp16 dequantization differs in {int((diff > 0).sum())} of {values.size} "
                  f"values, by at most {diff.max().item():.3g} (values max |x| {np.abs(values).max():.3g})")
        meta[name] = {"type_id": int(qtype), "block_size": block_size, "type_size": type_size,
                      "n_blocks": int(blocks.shape[0]), "fp16_fields": FP16_FIELDS[name]}
    save("gguf_quants.safetensors", tensors, meta)


def _fp16(x):
    """x rounded to fp16: (the fp16 bytes as uint8 pairs, the value as fp32)."""
    h = x.astype(np.float16)
    return h.view(np.uint8).reshape(*x.shape, 2), h.astype(np.float32)


def q4_k(x):
    """Q4_K blocks of x (rows of a multiple of 256 elements), shape (rows, row / 256 * 144).
    Each block: 8 sub-blocks of 32, x ~ d * sc[j] * q - dmin * m[j] with q in 0..15, sc and m 6-bit."""
    rows = x.shape[0]
    sub = x.astype(np.float32).reshape(-1, 8, 32)
    low = np.minimum(sub.min(axis=-1), 0.0)                         # the sub-block's minimum, at most 0
    scale, offset = (sub.max(axis=-1) - low) / 15, -low              # x ~ scale * q - offset
    d_bytes, d = _fp16(scale.max(axis=-1) / 63)
    dmin_bytes, dmin = _fp16(offset.max(axis=-1) / 63)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d[:, None] > 0, np.round(scale / d[:, None]), 0).clip(0, 63).astype(np.uint8)
        m = np.where(dmin[:, None] > 0, np.round(offset / dmin[:, None]), 0).clip(0, 63).astype(np.uint8)
        step = d[:, None] * sc.astype(np.float32)
        shift = dmin[:, None] * m.astype(np.float32)
        q = np.where(step[..., None] > 0, np.round((sub + shift[..., None]) / step[..., None]), 0)
    q = q.clip(0, 15).astype(np.uint8)                               # (blocks, 8, 32)
    scales = np.concatenate([(sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6),
                             (m[:, :4] & 63) | ((m[:, 4:] >> 4) << 6),
                             (sc[:, 4:] & 15) | ((m[:, 4:] & 15) << 4)], axis=-1)
    qs = (q[:, 0::2, :] | (q[:, 1::2, :] << 4)).reshape(-1, 128)    # byte 32c+i: sub-blocks 2c, 2c+1
    return np.concatenate([d_bytes, dmin_bytes, scales, qs], axis=-1).reshape(rows, -1)


def q6_k(x):
    """Q6_K blocks of x (rows of a multiple of 256 elements), shape (rows, row / 256 * 210).
    Each block: 16 sub-blocks of 16, x ~ d * scales[j] * (q - 32) with q in 0..63, scales int8."""
    rows = x.shape[0]
    sub = x.astype(np.float32).reshape(-1, 16, 16)
    scale = np.abs(sub).max(axis=-1) / 31                            # x ~ scale * (q - 32), q - 32 in -31..31
    d_bytes, d = _fp16(scale.max(axis=-1) / 127)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d[:, None] > 0, np.round(scale / d[:, None]), 0).clip(0, 127).astype(np.int8)
        step = d[:, None] * sc.astype(np.float32)
        q = np.where(step[..., None] > 0, np.round(sub / step[..., None]), 0)
    q = (q.clip(-32, 31) + 32).astype(np.uint8).reshape(-1, 2, 128)  # two halves of 128 elements
    ql = ((q[:, :, :64] & 15) | ((q[:, :, 64:] & 15) << 4)).reshape(-1, 128)
    high = (q >> 4).reshape(-1, 2, 4, 32)
    qh = (high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)).reshape(-1, 64)
    return np.concatenate([ql, qh, sc.view(np.uint8), d_bytes], axis=-1).reshape(rows, -1)


def _plan(name, shape, kind):
    """The ggml type name of BFL tensor `name` in the file of `kind` (see the docstring)."""
    if len(shape) == 1:
        return "F16" if kind == "q8_0" else "F32"
    row = shape[-1]
    if kind == "q8_0":
        assert row % 32 == 0, name
        return "Q8_0"
    if row % QK_K == 0:
        return {"q4_k": "Q4_K", "q6_k": "Q6_K"}[kind]
    if name.startswith(KEEP_FLOAT):
        return {"q4_k": "F16", "q6_k": "BF16"}[kind]
    return "Q8_0" if row % 32 == 0 else "F16"


def _encode(x, type_name):
    """x (fp32 numpy) in ggml type `type_name`: what GGUFWriter.add_tensor takes with raw_dtype."""
    import gguf

    if type_name == "Q4_K":
        return q4_k(x)
    if type_name == "Q6_K":
        return q6_k(x)
    return gguf.quants.quantize(x, gguf.GGMLQuantizationType[type_name])


FILE_TYPES = {"q8_0": "MOSTLY_Q8_0", "q4_k": "MOSTLY_Q4_K_M", "q6_k": "MOSTLY_Q6_K"}


def write_gguf(path, state, kind, arch="flux", plan=_plan):
    """`state` (the file's names, fp32 torch) as a GGUF file of `kind`, each tensor of the type
    plan(name, shape, kind) names; returns {name: ggml type name}."""
    import gguf

    writer = gguf.GGUFWriter(path=None, arch=arch)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_file_type(gguf.LlamaFileType[FILE_TYPES[kind]])
    types = {}
    for name, t in state.items():
        x = t.detach().to(torch.float32).numpy()
        types[name] = plan(name, x.shape, kind)
        data = _encode(x, types[name])
        writer.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[types[name]])
        if types[name] in ("Q4_K", "Q6_K"):
            back = gguf.quants.dequantize(data, gguf.GGMLQuantizationType[types[name]])
            err = np.abs(back - x).max() / np.abs(x).max()
            bound = 0.1 if types[name] == "Q4_K" else 0.02
            print(f"  {types[name]} {name} {list(x.shape)}: max error {err:.4f} of max |w| (bound {bound})")
            assert back.shape == x.shape and err < bound, f"our {types[name]} encoder is wrong for {name}"
    writer.write_header_to_file(path=path)
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return types


def read_gguf(path, arch="flux"):
    """{name: (ggml type name, torch shape, raw numpy data)} of a GGUF file, through gguf-py's reader."""
    import gguf

    reader = gguf.GGUFReader(path)
    assert reader.fields["general.architecture"].contents() == arch
    return {t.name: (gguf.GGMLQuantizationType(t.tensor_type).name, tuple(int(n) for n in reversed(t.shape.tolist())),
                     t.data) for t in reader.tensors}


def dequantize_file(path, arch="flux"):
    """Every tensor of a GGUF file dequantized by gguf-py (fp32, exact), the file's names."""
    import gguf

    return {name: torch.from_numpy(np.array(gguf.quants.dequantize(np.array(data), gguf.GGMLQuantizationType[t]),
                                            dtype=np.float32)).reshape(shape)
            for name, (t, shape, data) in read_gguf(path, arch).items()}


def write_files(paths, state, arch="flux", plan=_plan):
    """`state` written in each file of `paths` ({kind: path}) by write_gguf, read back and checked."""
    for kind, path in paths.items():
        print(f"{path}:")
        types = write_gguf(path, state, kind, arch, plan)
        read = read_gguf(path, arch)
        assert list(read) == list(state), f"{kind}: the tensors read back differ"
        for name, (t, shape, _) in read.items():
            assert t == types[name] and shape == tuple(state[name].shape), f"{kind}: {name} read back wrong"
        counts = {t: sum(1 for v in types.values() if v == t) for t in sorted(set(types.values()))}
        print(f"{path}: {len(types)} tensors {counts}, {os.path.getsize(path)} bytes")
        for t in ("Q4_K", "Q6_K", "F16", "BF16", "F32"):
            named = [n for n, v in types.items() if v == t and len(state[n].shape) == 2]
            if named:
                print(f"  2-D {t}: {', '.join(named)}")


def pipeline_cases(paths, load, run, from_state, exact_state, meta_of):
    """For each GGUF file of `paths`, the images of the transformer load(path) builds (case <kind>) and of
    gguf-py's exact dequantization, exact_state(path) in diffusers' names (case <kind>_exact); run(model)
    makes (image, latents), from_state(state) the fp32 transformer of a state dict, meta_of(path,
    loader) a case's metadata. Checks that diffusers' latents are those of its own dequantized weights."""
    from diffusers.quantizers.gguf.utils import GGUFLinear, dequantize_gguf_tensor

    tensors, meta = {}, {}
    for kind, path in paths.items():
        transformer = load(path)
        assert transformer.device.type == "cpu"
        n_gguf = sum(1 for m in transformer.modules() if isinstance(m, GGUFLinear))
        print(f"{kind}: from_single_file made {n_gguf} GGUFLinear layers")
        tensors[kind + ".image"], tensors[kind + ".latents"] = run(transformer)
        meta[kind] = meta_of(path, "from_single_file, GGUFQuantizationConfig(compute_dtype=float32)")

        # What diffusers computes with: its fp16 dequantization of each weight, cast to fp32.
        used = {k: dequantize_gguf_tensor(v).to(torch.float32) for k, v in transformer.state_dict().items()}
        rerun = run(from_state(used))[1]
        assert torch.equal(rerun, tensors[kind + ".latents"]), f"{kind}: diffusers' GGUF run is not its weights'"
        exact = exact_state(path)
        wdiff = max((exact[k] - used[k]).abs().max().item() for k in exact)
        print(f"{kind}: latents exactly those of the fp32 transformer with diffusers' dequantized weights; "
              f"those differ from gguf-py's exact dequantization by at most {wdiff:.3g}")
        tensors[kind + "_exact.image"], tensors[kind + "_exact.latents"] = run(from_state(exact))
        meta[kind + "_exact"] = meta_of(path, "dequantized here (gguf-py, fp32), load_state_dict")
    return tensors, meta


def print_differences(tensors, kinds, folder="folder"):
    scale = tensors[folder + ".latents"].abs().max().item()
    for kind in kinds:
        d = (tensors[kind + ".latents"] - tensors[kind + "_exact.latents"]).abs().max().item()
        f = (tensors[kind + "_exact.latents"] - tensors[folder + ".latents"]).abs().max().item()
        i = (tensors[kind + ".image"].int() - tensors[kind + "_exact.image"].int()).abs().max().item()
        print(f"{kind}: latents max |diffusers - exact| {d:.6g}, |exact - fp32 folder| {f:.6g} (max |x| {scale:.4g}); "
              f"images differ by at most {i} levels")


def gguf():
    from diffusers import FluxTransformer2DModel, GGUFQuantizationConfig

    quants()

    config = json.load(open(os.path.join(FOLDER, "transformer", "config.json")))
    inner = config["num_attention_heads"] * config["attention_head_dim"]
    folder_sd = load_file(os.path.join(FOLDER, "transformer", "diffusion_pytorch_model.safetensors"))
    rows = {k: v.shape[0] for k, v in folder_sd.items()}
    os.makedirs(FILES, exist_ok=True)
    paths = {kind: os.path.join(FILES, f"flux_{kind}.gguf") for kind in FILE_TYPES}
    write_files(paths, to_bfl(folder_sd, config))

    def load(path):
        with converter_width(inner):
            return FluxTransformer2DModel.from_single_file(
                path, quantization_config=GGUFQuantizationConfig(compute_dtype=torch.float32), config=FOLDER,
                subfolder="transformer", torch_dtype=torch.float32)

    tensors, meta = pipeline_cases(
        paths, load, lambda model: _run(flux_pipeline(model)), flux_from_state,
        lambda path: from_bfl(dequantize_file(path), config, rows),
        lambda path, loader: dict(file=os.path.relpath(path, ROOT), loader=loader, **CALL))
    tensors["folder.image"], tensors["folder.latents"] = _run(flux_pipeline(None))
    meta["folder"] = dict(folder=os.path.relpath(FOLDER, ROOT), loader="from_pretrained", **CALL)
    print_differences(tensors, paths)
    save("gguf_pipeline.safetensors", tensors, meta)
