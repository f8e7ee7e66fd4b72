"""Golden data for T5 (SD3's text_encoder_3 / tokenizer_3), from transformers.

t5_tokenizer: a tiny unigram SentencePiece model trained here (seeded, on a corpus written below),
with T5's special pieces (<pad> 0, </s> 1, <unk> 2) and transformers' 100 <extra_id_N> tokens;
transformers' T5 tokenizer saves it to tests/data/golden/t5_tokenizer/ (spiece.model and
tokenizer.json), and the ids of tricky strings are read back as diffusers loads tokenizer_3.
t5_encoder: a tiny random T5EncoderModel (gated-gelu, perturbed norms) in
tests/data/golden/t5_encoder/, with its hidden states for a batch of ids (pads included) in fp32,
and as transformers runs it in bf16 and in fp16 (where it keeps every `wo` in fp32).
The sentencepiece conversion in transformers needs the protobuf package.
"""
import io
import json
import os
import random
import shutil
import sys
import tempfile

import torch

from make_golden import OUT, TRICKY, perturb_norms, save

T5_STRINGS = TRICKY + [
    "literal </s> and <pad> and <unk> and <extra_id_0><extra_id_99> <extra_id_100> </s></s>x",
    "</s>", " </s> ", "a</s>b", "<pad>", "<extra_id_5>start", "x<unk>y", "<extra_id_>", "< /s>", "</S>",
    "\t\n", "\x00nul\x07bel\x7fdel", "a  b   c    d", "tab\tin\tmiddle", "\u3000full\u3000width\u3000",
    "\u2581already \u2581 metaspace\u2581", "x\u2581\u2581y\u2581",
    "other spaces\u1680ogham\u2028ls\u2029ps\u202fnnb\u205fmm\ufeffbom\x0bvt\x0cff\x1cfs\x1dgs\x1ers\x1fus",
    "e\u0301\u0301\u0301 e\u0301\u0301 l\u00a0\u200d x \u00a0\ufe0f m\x0b\x85p",
    "\u1100\u1161\u11a8 \U0001f468\u200d\U0001f469\u200d\U0001f467 \ufffd \U0010ffff",
    # Special pieces that only normalisation spells out (full-width brackets): the reference's
    # unigram model holds them too.
    "\uff1c/s\uff1e \uff1cextra_id_0\uff1e a\uff1cpad\uff1eb \uff1cunk\uff1e",
    "a photo of an astronaut riding a horse on the moon, cinematic, detailed, golden light " * 4,
]
# Pieces the fuzzed strings are made of: letters, white space of every kind, combining marks,
# compatibility forms, emoji with joiners and modifiers, Hangul jamo, controls, literal specials.
FUZZ_POOL = list("abc de fghij klmnop AB ") + [
    "\t", "\n", "\u00a0", "\u3000", "\u0301", "\u0308", "\u00e9", "\ufb01", "\uff21", "\U0001f600", "\u200d",
    "\u200b", "\u732b", "</s>", "<pad>", "<extra_id_3>", "  ", "\u2581", "\x0b", "\x85", "\u00ad", "\u00bd",
    "\u00b2", "\ufe0f", "\r\n", ".", "!", "\u1100", "\u1161", "\u11a8", "\u0938", "\u094d", "\u0924",
    "\U0001f3fd", "\u2764", "\uac00", "\u3131", "\u2460", "\u33a1", "\uff76", "\uff9e", "\x00", "\x1f",
    "\u2028", "\u1680", "\u00c5", "A\u030a", "\u212b", "\u2126", "\u0130", "\u00df", "\u03a3", "<unk>",
    "\uff1c", "\uff1e", "pad", "/s", "unk", "extra_id_1",
]
T5_MAX_LENGTH = 32  # short, so that several strings are truncated


def _t5_corpus():
    """A few thousand prompt-like lines over a small vocabulary, seeded."""
    rng = random.Random(0)
    words = ("a an the photo of cat dog on mat red blue green astronaut riding horse in space city night sky "
             "painting portrait style oil canvas mountain lake forest sunset beautiful detailed high quality "
             "studio light woman man child old young house tree river bridge car street rain snow cloud sun moon "
             "star window door garden flower bird fish boat ocean wave beach sand stone castle tower king queen "
             "robot dragon wizard magic fire water earth wind golden silver dark bright soft sharp cinematic "
             "render digital art sketch pencil drawing watercolor colorful vintage modern futuristic ancient "
             "small large tiny giant happy sad running jumping sitting standing walking flying swimming reading "
             "playing wearing holding looking").split()
    suffixes = ["", "", "", "s", "ing", "ed", "er", "ly"]
    ends = [".", ",", "!", "", " 2024", " 42", " caf\u00e9", " na\u00efve", "?"]
    lines = []
    for _ in range(4000):
        ws = [rng.choice(words) + rng.choice(suffixes) for _ in range(rng.randint(3, 14))]
        if rng.random() < 0.3:
            ws[0] = ws[0].capitalize()
        lines.append(" ".join(ws) + rng.choice(ends))
    lines += ["Caf\u00e9 au lait, cr\u00e8me br\u00fbl\u00e9e \u00c5ngstr\u00f6m", "\u4e00\u53ea\u732b\u5728\u5c4b\u9876\u4e0a",
              "numbers 0123456789 $100.50 x+y=z", "MiXeD CaSe WoRdS", "punctuation ?!.,;:'\"()[]{}-_/<>@#&%*"] * 30
    return lines


def t5_tokenizer():
    import sentencepiece as spm
    from transformers import T5Tokenizer, T5TokenizerFast

    try:
        import google.protobuf  # noqa: F401  (transformers reads spiece.model with it)
    except ImportError:
        sys.exit("t5_tokenizer: transformers needs the protobuf package to read spiece.model (pip install protobuf)")
    folder = os.path.join(OUT, "t5_tokenizer")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    spm.set_random_generator_seed(0)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_t5_corpus()), model_writer=model, vocab_size=256, model_type="unigram",
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, pad_piece="<pad>", eos_piece="</s>", unk_piece="<unk>",
        character_coverage=1.0, num_threads=1, minloglevel=2)
    with open(os.path.join(folder, "spiece.model"), "wb") as f:
        f.write(model.getvalue())
    T5Tokenizer.from_pretrained(folder).save_pretrained(folder)  # adds tokenizer.json, tokenizer_config.json
    ref = T5TokenizerFast.from_pretrained(folder)  # as diffusers loads tokenizer_3
    # A folder with spiece.model alone must tokenize the same (the C++ side supports it too).
    with tempfile.TemporaryDirectory() as alone:
        shutil.copy(os.path.join(folder, "spiece.model"), alone)
        ref_alone = T5TokenizerFast.from_pretrained(alone)

    rng = random.Random(1)
    fuzz = ["".join(rng.choice(FUZZ_POOL) for _ in range(rng.randint(0, 14))) for _ in range(400)]
    tensors, decoded, removed = {}, [], []
    for i, text in enumerate(T5_STRINGS):
        enc = ref(text, padding="max_length", max_length=T5_MAX_LENGTH, truncation=True, add_special_tokens=True,
                  return_tensors="pt")
        full = ref(text, padding="longest", return_tensors="pt").input_ids
        assert full[0].tolist() == ref_alone(text).input_ids, text
        tensors[f"ids.{i}"] = enc.input_ids[0].to(torch.int64)
        tensors[f"full.{i}"] = full[0].to(torch.int64)
        decoded.append(ref.batch_decode(full)[0])
        removed.append(ref.batch_decode(full[:, T5_MAX_LENGTH - 1:-1])[0])  # diffusers' truncation warning
    flat, lengths = [], []
    for text in fuzz:
        ids = ref(text).input_ids
        assert ids == ref_alone(text).input_ids, text
        flat += ids
        lengths.append(len(ids))
    tensors["fuzz.ids"] = torch.tensor(flat, dtype=torch.int64)
    tensors["fuzz.lengths"] = torch.tensor(lengths, dtype=torch.int64)
    meta = {"strings": T5_STRINGS, "decoded": decoded, "removed": removed, "max_length": T5_MAX_LENGTH,
            "fuzz": fuzz, "vocab_size": len(ref), "tokenizer_class": type(ref).__name__}
    save("t5_tokenizer.safetensors", tensors, meta)


def t5_encoder():
    from transformers import T5Config, T5EncoderModel, T5TokenizerFast

    folder = os.path.join(OUT, "t5_encoder")
    shutil.rmtree(folder, ignore_errors=True)
    tok = T5TokenizerFast.from_pretrained(os.path.join(OUT, "t5_tokenizer"))
    # A short max distance, so that 40 positions reach every kind of bucket: exact, logarithmic, clamped.
    config = T5Config(vocab_size=len(tok), d_model=32, d_kv=8, num_heads=4, d_ff=48, num_layers=2,
                      feed_forward_proj="gated-gelu", relative_attention_num_buckets=32,
                      relative_attention_max_distance=20, dropout_rate=0.0, layer_norm_epsilon=1e-6,
                      is_encoder_decoder=False, use_cache=False)
    model = T5EncoderModel(config).eval()
    perturb_norms(model)
    with torch.no_grad():  # a position bias large enough that a wrong bucket shows
        model.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight.mul_(4.0)
    model.save_pretrained(folder, safe_serialization=True)

    seq = 40
    row0 = tok("a photo of an astronaut riding a horse, \u00e9 \U0001f600", padding="max_length", max_length=seq,
               truncation=True).input_ids
    g = torch.Generator().manual_seed(0)
    row1 = torch.randint(3, len(tok), (seq,), generator=g)
    row1[30], row1[31:] = 1, 0  # </s>, then pads
    ids = torch.stack([torch.tensor(row0), row1]).to(torch.int64)
    assert (ids == 0).sum() > 8, "the batch must hold pads"
    tensors = {"input_ids": ids}
    meta = {"seq": seq}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        m = T5EncoderModel.from_pretrained(folder, dtype=dtype).eval()
        wo = m.encoder.block[0].layer[1].DenseReluDense.wo.weight.dtype
        assert wo == (torch.float32 if dtype == torch.float16 else dtype), (name, wo)
        with torch.no_grad():
            out = m(input_ids=ids).last_hidden_state
        tensors[f"hidden.{name}"] = out
        meta[name] = {"attn_implementation": m.config._attn_implementation, "wo_dtype": str(wo),
                      "out_dtype": str(out.dtype)}
    save("t5_encoder.safetensors", tensors, meta)


def t5_feed_forwards():
    """T5's other feed-forwards: v1.0's relu (wi, wo; transformers' default, and the tiny T5 of
    diffusers' own SD3 tests), gated-silu and plain gelu, each a tiny folder and its fp32 output."""
    from transformers import T5Config, T5EncoderModel

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 96, (2, 17), generator=g)
    ids[1, 12], ids[1, 13:] = 1, 0
    tensors = {"input_ids": ids}
    kinds = {"relu": "t5_encoder_relu", "gated-silu": "t5_encoder_gated_silu", "gelu": "t5_encoder_gelu"}
    for kind, name in kinds.items():
        folder = os.path.join(OUT, name)
        shutil.rmtree(folder, ignore_errors=True)
        torch.manual_seed(2)
        config = T5Config(vocab_size=96, d_model=16, d_kv=4, num_heads=4, d_ff=37, num_layers=2,
                          feed_forward_proj=kind, relative_attention_num_buckets=8,
                          relative_attention_max_distance=20, dropout_rate=0.0, is_encoder_decoder=False,
                          use_cache=False)
        model = T5EncoderModel(config).eval()
        perturb_norms(model)
        model.save_pretrained(folder, safe_serialization=True)
        with torch.no_grad():
            tensors[f"hidden.{kind}"] = model(input_ids=ids).last_hidden_state
    save("t5_feed_forwards.safetensors", tensors, {"kinds": kinds})


PARTS = ["t5_tokenizer", "t5_encoder", "t5_feed_forwards"]
