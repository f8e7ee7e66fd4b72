"""Golden data for Qwen3's tokenizer and text encoder as Z-Image (ZImagePipeline) and FLUX.2-klein
(Flux2KleinPipeline) use them, from transformers and diffusers.

train_qwen3_tokenizer(out_dir): train_qwen2_tokenizer's small byte-level BPE with Qwen3's added
tokens after the vocabulary, in the order and with the special flags of Qwen3's
tokenizer_config.json (added_tokens_decoder, ids 151643..151668 in the real vocabulary):

    special:     <|endoftext|> <|im_start|> <|im_end|> <|object_ref_start|> <|object_ref_end|>
                 <|box_start|> <|box_end|> <|quad_start|> <|quad_end|> <|vision_start|>
                 <|vision_end|> <|vision_pad|> <|image_pad|> <|video_pad|>   (Qwen2's)
    not special: <tool_call> </tool_call> <|fim_prefix|> <|fim_middle|> <|fim_suffix|> <|fim_pad|>
                 <|repo_name|> <|file_sep|> <tool_response> </tool_response> <think> </think>

eos <|im_end|>, pad <|endoftext|>, no bos, class Qwen2Tokenizer, as the Qwen3 instruct releases
(Qwen3-4B, Z-Image's and FLUX.2-klein-4B's text encoder) have them; and a chat template of ours in
tokenizer_config.json that renders system, user and assistant messages as Qwen3's does (each
"<|im_start|>{role}\\n{content}<|im_end|>\\n", then with add_generation_prompt
"<|im_start|>assistant\\n", and "<think>\\n\\n</think>\\n\\n" after it when enable_thinking is false).
Qwen3's own template also handles tools, and strips the reasoning out of earlier assistant turns;
the pipelines send one user message, where the two agree.

qwen3_encoder: that tokenizer in tests/data/golden/qwen3_tokenizer/ (tokenizer.json, vocab.json,
merges.txt and a tokenizer_config.json with added_tokens_decoder and the chat template, as Qwen3
releases ship), a tiny random Qwen3Model in tests/data/golden/qwen3_encoder/ (width 64, 3 layers,
8 heads over 4 key-value heads of head_dim 16, so that the attention width 128 is not the hidden
width; perturbed norms; the q/k norms scaled so that attention is far from uniform), and in
qwen3_encoder.safetensors, for each case of CASES (one batched call of several prompts):

- z_image: ZImagePipeline._encode_prompt's work: the ids and mask of the templated prompts
  (enable_thinking true, padded to max_sequence_length, cut there) and hidden_states[-2] of the
  padded batch, each prompt's rows kept by its mask;
- klein: Flux2KleinPipeline._get_qwen3_prompt_embeds's: ids and mask of the templated prompts
  (enable_thinking false, padded to max_sequence_length, cut there) and the hidden states of
  text_encoder_out_layers (1, 2, 3) of a Qwen3ForCausalLM of the same weights, stacked per token
  into 3 x 64 channels, pad rows included. hidden_states[3] of a 3-layer Qwen3 is the final norm's
  output (transformers puts it in place of the last layer's), where the real (9, 18, 27) of 36
  layers are all plain layer outputs.

Pad rows get positions like any other (transformers numbers every row 0..L-1) and attend to the
real rows before them (causal, padding keys masked). Also the ids of QWEN2_STRINGS through this
tokenizer.
"""
import os
import shutil
import tempfile
import types

import torch

from golden_qwen_tokenizer import QWEN2_ADDED_PLAIN, QWEN2_SPECIAL, QWEN2_STRINGS, train_byte_level_bpe
from make_golden import OUT, perturb_norms, save

QWEN3_ADDED_PLAIN = QWEN2_ADDED_PLAIN + ["<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                                         "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
                                         "<think>", "</think>"]

# Renders like Qwen3's template for system, user and assistant messages with string contents.
QWEN3_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}")

# Qwen3-4B's shape, made tiny: head_dim 16 with 8 heads is wider than the hidden 64.
QWEN3_TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=8,
                  num_key_value_heads=4, head_dim=16, rms_norm_eps=1e-6, max_position_embeddings=2048,
                  rope_parameters={"rope_type": "default", "rope_theta": 1e6}, tie_word_embeddings=True)
KLEIN_LAYERS = (1, 2, 3)

LONG = " ".join(f"a lighthouse number {i} on a rocky coast at dusk, waves and gulls," for i in range(40))
PROMPTS = [
    "",
    "a photo of a cat",
    "\u4e00\u53ea\u732b\u5728\u5c4b\u9876\u4e0a\uff0c\u6cb9\u753b\u98ce\u683c\u3002",
    "emoji: \U0001f600\U0001f680 \U0001f469\u200d\U0001f4bb \U0001f44d\U0001f3fd \u2764\ufe0f",
    "A Photo Of A CAT, on a MAT!!! don't stop; we'll see.\n  two lines\tand a tab",
    LONG,
]
CASES = [
    # name, flavour, prompts (indices into PROMPTS), max_sequence_length
    ("z_image", "z_image", [0, 1, 2, 3, 4], 512),  # the pipeline's default
    ("z_image_long", "z_image", [1, 5], 40),  # LONG cut in its text
    ("z_image_cut", "z_image", [1, 5], 12),  # cut inside the template: no generation prompt left
    ("klein", "klein", [0, 1, 2, 5], 32),  # LONG and the CJK prompt cut; FLUX.2-klein's default is 512
]


def train_qwen3_tokenizer(out_dir, vocab_size=1200):
    """Trains the small BPE with Qwen3's added tokens and chat template and saves it into out_dir
    (tokenizer.json, tokenizer_config.json, vocab.json, merges.txt). Returns the transformers tokenizer."""
    return train_byte_level_bpe(out_dir, QWEN3_ADDED_PLAIN, chat_template=QWEN3_CHAT_TEMPLATE,
                                vocab_size=vocab_size)


def tiny_qwen3(vocab_size, seed):
    """A tiny random Qwen3Model with perturbed norms, scaled q/k norms (scaling q_proj and k_proj
    would do nothing: the per-head RMS norms come after them), and embeddings and layer outputs
    scaled so that hidden states are of order 1 and every layer adds about as much as it gets."""
    from transformers import Qwen3Config, Qwen3Model

    torch.manual_seed(seed)
    model = Qwen3Model(Qwen3Config(vocab_size=vocab_size, **QWEN3_TINY)).eval()
    perturb_norms(model)
    with torch.no_grad():
        for layer in model.layers:
            layer.self_attn.q_norm.weight.mul_(2.0)
            layer.self_attn.k_norm.weight.mul_(2.0)
            layer.self_attn.o_proj.weight.mul_(10.0)
            layer.mlp.down_proj.weight.mul_(10.0)
        model.embed_tokens.weight.mul_(25.0)
    return model


def _write_tokenizer(folder):
    """The tokenizer in the layout Qwen3 releases have: the v4-style tokenizer_config.json (with
    added_tokens_decoder) beside tokenizer.json, vocab.json and merges.txt."""
    from golden_qwen_tokenizer import _write_v4_config

    shutil.rmtree(folder, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        train_qwen3_tokenizer(tmp)
        os.makedirs(folder)
        for name in ("tokenizer.json", "vocab.json", "merges.txt"):
            shutil.copy(os.path.join(tmp, name), folder)
        _write_v4_config(tmp, folder)
    os.remove(os.path.join(folder, "added_tokens.json"))  # Qwen3 releases have none


def _z_image(tokenizer, model, prompts, msl):
    """ZImagePipeline._encode_prompt itself, on a stand-in for the pipeline (it needs only these two)."""
    from diffusers import ZImagePipeline

    pipe = types.SimpleNamespace(tokenizer=tokenizer, text_encoder=model)
    return ZImagePipeline._encode_prompt(pipe, prompt=list(prompts), device=torch.device("cpu"),
                                         max_sequence_length=msl)


def qwen3_encoder():
    from diffusers import Flux2KleinPipeline
    from transformers import AutoTokenizer, Qwen3ForCausalLM, Qwen3Model

    tok_dir = os.path.join(OUT, "qwen3_tokenizer")
    _write_tokenizer(tok_dir)
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    assert type(tokenizer).__name__.startswith("Qwen2Tokenizer"), type(tokenizer)
    folder = os.path.join(OUT, "qwen3_encoder")
    shutil.rmtree(folder, ignore_errors=True)
    tiny_qwen3(len(tokenizer), 50).save_pretrained(folder, safe_serialization=True)
    model = Qwen3Model.from_pretrained(folder, dtype=torch.float32).eval()
    causal = Qwen3ForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()  # klein's class, same weights

    tensors, meta = {}, {"prompts": PROMPTS, "cases": {}, "pad_id": tokenizer.pad_token_id,
                         "eos_id": tokenizer.eos_token_id, "vocab_size": len(tokenizer),
                         "klein_layers": list(KLEIN_LAYERS), "z_image_layer": -2,
                         "added": {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN2_SPECIAL + QWEN3_ADDED_PLAIN}}
    with torch.no_grad():
        for name, flavour, which, msl in CASES:
            prompts = [PROMPTS[i] for i in which]
            thinking = flavour == "z_image"
            texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                   add_generation_prompt=True, enable_thinking=thinking)
                     for p in prompts]
            enc = tokenizer(texts, padding="max_length", max_length=msl, truncation=True, return_tensors="pt")
            tensors[f"{name}.input_ids"] = enc.input_ids
            tensors[f"{name}.attention_mask"] = enc.attention_mask
            if flavour == "z_image":
                for k, rows in enumerate(_z_image(tokenizer, model, prompts, msl)):
                    tensors[f"{name}.embeds.{k}"] = rows
            else:
                tensors[f"{name}.embeds"] = Flux2KleinPipeline._get_qwen3_prompt_embeds(
                    causal, tokenizer, prompts, device=torch.device("cpu"), max_sequence_length=msl,
                    hidden_states_layers=KLEIN_LAYERS)
            meta["cases"][name] = dict(flavour=flavour, prompts=which, max_sequence_length=msl,
                                       enable_thinking=thinking, texts=texts)
    for i, text in enumerate(QWEN2_STRINGS):
        tensors[f"ids.{i}"] = torch.tensor(tokenizer(text).input_ids, dtype=torch.int64)
    meta["strings"] = QWEN2_STRINGS
    save("qwen3_encoder.safetensors", tensors, meta)


PARTS = ["qwen3_encoder"]
