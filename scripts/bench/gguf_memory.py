"""Writes the files scripts/bench/gguf_memory.sh measures: a FLUX.1-dev transformer at the real
width (24 heads of 128, MLP 12288) with DOUBLE double and SINGLE single blocks, in Black Forest Labs'
layout, as a bf16 safetensors file and as a GGUF Q4_K file (random weights; K-quant blocks of random
bytes with modest fp16 scales, rows that are no whole 256-element blocks in Q8_0, 1-D tensors in
F32, as city96's files keep them), and the config folder beside them: the tiny FLUX.1-dev folder's
text encoders and VAE with this transformer's config (joint and pooled widths the tiny encoders').

    python gguf_memory.py OUT_DIR ROOT DOUBLE SINGLE
"""
import json
import os
import shutil
import sys

import numpy as np


def bfl_shapes(double, single, width=3072, mlp=12288, joint=32, pooled=32, in_ch=64):
    s = {}

    def linear(name, out, inp):
        s[name + ".weight"] = (out, inp)
        s[name + ".bias"] = (out,)

    linear("img_in", width, in_ch)
    linear("txt_in", width, joint)
    for m, inp in (("time_in", 256), ("vector_in", pooled), ("guidance_in", 256)):
        linear(m + ".in_layer", width, inp)
        linear(m + ".out_layer", width, width)
    for b in range(double):
        p = f"double_blocks.{b}."
        for x in ("img", "txt"):
            linear(p + x + "_mod.lin", 6 * width, width)
            linear(p + x + "_attn.qkv", 3 * width, width)
            linear(p + x + "_attn.proj", width, width)
            linear(p + x + "_mlp.0", mlp, width)
            linear(p + x + "_mlp.2", width, mlp)
            s[p + x + "_attn.norm.query_norm.scale"] = (128,)
            s[p + x + "_attn.norm.key_norm.scale"] = (128,)
    for b in range(single):
        p = f"single_blocks.{b}."
        linear(p + "modulation.lin", 3 * width, width)
        linear(p + "linear1", 3 * width + mlp, width)
        linear(p + "linear2", width, width + mlp)
        s[p + "norm.query_norm.scale"] = (128,)
        s[p + "norm.key_norm.scale"] = (128,)
    linear("final_layer.linear", in_ch, width)
    linear("final_layer.adaLN_modulation.1", 2 * width, width)
    return s


def main():
    out, root, double, single = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    import gguf
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    shapes = bfl_shapes(double, single)
    # The config folder: the tiny model's, with the real-width transformer.
    folder = os.path.join(out, "flux")
    shutil.copytree(os.path.join(root, "models", "tiny-random-flux-dev"), folder, dirs_exist_ok=True)
    for f in os.listdir(os.path.join(folder, "transformer")):
        if f.endswith(".safetensors"):
            os.remove(os.path.join(folder, "transformer", f))
    config = json.load(open(os.path.join(root, "models", "flux.1-dev", "transformer", "config.json")))
    config.update(num_layers=double, num_single_layers=single, joint_attention_dim=32, pooled_projection_dim=32)
    json.dump(config, open(os.path.join(folder, "transformer", "config.json"), "w"), indent=2)

    # bf16 safetensors (as uint16 bits: numpy has no bfloat16), written tensor by tensor.
    tensors = {}
    for name, shape in shapes.items():
        x = (rng.standard_normal(shape, dtype=np.float32) * 0.02).view(np.uint32)
        tensors[name] = (x >> 16).astype(np.uint16)
    header = {n: {"dtype": "BF16", "shape": list(shapes[n]), "data_offsets": None} for n in shapes}
    offset = 0
    for n in shapes:
        header[n]["data_offsets"] = [offset, offset + tensors[n].nbytes]
        offset += tensors[n].nbytes
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(os.path.join(out, "flux_bf16.safetensors"), "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for n in shapes:
            f.write(tensors[n].tobytes())
    del tensors

    # GGUF Q4_K: random blocks, each super-block's d and dmin modest fp16 values.
    w = gguf.GGUFWriter(os.path.join(out, "flux_q4_k.gguf"), "flux")
    for name, shape in shapes.items():
        if len(shape) == 1:
            w.add_tensor(name, (rng.standard_normal(shape, dtype=np.float32) * 0.02))
            continue
        rows, row = shape
        kind, qk, size = ((gguf.GGMLQuantizationType.Q4_K, 256, 144) if row % 256 == 0 else
                          (gguf.GGMLQuantizationType.Q8_0, 32, 34))
        blocks = rng.integers(0, 256, size=(rows, row // qk, size), dtype=np.uint8)
        scale = np.full((rows, row // qk, 1), 2e-5, dtype=np.float16).view(np.uint8)  # weights of about 0.01
        blocks[:, :, 0:2] = scale
        if kind == gguf.GGMLQuantizationType.Q4_K:
            blocks[:, :, 2:4] = scale
        w.add_tensor(name, blocks.reshape(rows, -1), raw_dtype=kind)  # the shape in bytes
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
