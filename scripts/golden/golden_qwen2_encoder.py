"""Golden data for Qwen-Image's text encoder: the language model of Qwen2.5-VL, from transformers.

qwen2_encoder: a tiny random Qwen2_5_VLForConditionalGeneration (8 heads over 4 key-value heads, so
that 3 tensor-parallel ranks keep 2, 1 and 1 whole GQA groups; perturbed norms and q/k/v biases;
q and k scaled so that attention is far from uniform and a wrong mask or RoPE shows; a one-block
vision tower and a 300-token vocabulary) saved by save_pretrained to tests/data/golden/qwen2_encoder/,
with hidden_states[-1] as QwenImagePipeline reads it (output_hidden_states=True) in fp32 for a
batch of rows of different lengths padded on the right (Qwen2Tokenizer's default padding_side),
the same rows padded on the left, and without a mask; and one unpadded row in bf16.
"""
import os
import shutil

import torch

from make_golden import OUT, perturb_norms, save

PAD = 299


def _tiny_qwen2_5_vl():
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(0)
    text = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=8,
                num_key_value_heads=4, rms_norm_eps=1e-6, max_position_embeddings=128, bos_token_id=1,
                eos_token_id=2, pad_token_id=PAD,
                # head_dim 8: mrope_section sums to its half, as [16, 24, 24] does for 128.
                rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [1, 1, 2]})
    vision = dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=64, patch_size=2,
                  spatial_merge_size=1, temporal_patch_size=1, window_size=4, fullatt_block_indexes=[0],
                  in_channels=1)
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision)
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    perturb_norms(model)
    with torch.no_grad():
        for layer in model.model.language_model.layers:
            a = layer.self_attn
            a.q_proj.weight.mul_(10.0)
            a.k_proj.weight.mul_(10.0)
            for lin in (a.q_proj, a.k_proj, a.v_proj):
                lin.bias.copy_(torch.randn_like(lin.bias) * 0.5)
    return model


def qwen2_encoder():
    from transformers import Qwen2_5_VLForConditionalGeneration

    folder = os.path.join(OUT, "qwen2_encoder")
    shutil.rmtree(folder, ignore_errors=True)
    _tiny_qwen2_5_vl().save_pretrained(folder, safe_serialization=True)
    os.remove(os.path.join(folder, "generation_config.json"))  # not the encoder's

    lengths = [13, 9, 4]
    seq = max(lengths)
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(3, PAD, (n,), generator=g) for n in lengths]
    right = torch.full((len(rows), seq), PAD, dtype=torch.int64)
    left = right.clone()
    right_mask = torch.zeros_like(right)
    left_mask = torch.zeros_like(left)
    for i, r in enumerate(rows):
        right[i, : len(r)], right_mask[i, : len(r)] = r, 1
        left[i, seq - len(r):], left_mask[i, seq - len(r):] = r, 1
    tensors = {"right.input_ids": right, "right.attention_mask": right_mask, "left.input_ids": left,
               "left.attention_mask": left_mask}
    meta = {"lengths": lengths, "pad": PAD}

    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        for side, ids, mask in (("right", right, right_mask), ("left", left, left_mask)):
            out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
            tensors[f"{side}.hidden"] = out.hidden_states[-1]
            # hidden_states[-1] is the final norm's output (transformers ties it to last_hidden_state).
            last = model.model.language_model(input_ids=ids, attention_mask=mask).last_hidden_state
            assert torch.equal(out.hidden_states[-1], last)
            # Each real row equals itself run alone: the positions' offset under left padding is
            # invisible to RoPE, which only sees differences.
            for i, n in enumerate(lengths):
                alone = model(input_ids=rows[i][None], output_hidden_states=True).hidden_states[-1][0]
                real = mask[i].bool()
                assert (out.hidden_states[-1][i][real] - alone).abs().max() < 1e-5, (side, i)
        tensors["nomask.hidden"] = model(input_ids=right, output_hidden_states=True).hidden_states[-1]
        meta["attn_implementation"] = model.config._attn_implementation

        bf16 = Qwen2_5_VLForConditionalGeneration.from_pretrained(folder, dtype=torch.bfloat16).eval()
        tensors["bf16.input_ids"] = rows[0][None]
        tensors["bf16.hidden"] = bf16(input_ids=rows[0][None], output_hidden_states=True).hidden_states[-1]
    save("qwen2_encoder.safetensors", tensors, meta)


PARTS = ["qwen2_encoder"]
