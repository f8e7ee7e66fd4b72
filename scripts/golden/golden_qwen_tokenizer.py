"""Golden data for Qwen2's byte-level BPE tokenizer (Qwen-Image's tokenizer/), from transformers.

train_qwen2_tokenizer(out_dir): a small byte-level BPE trained here with the tokenizers package on
the corpus below (deterministic), set up as transformers' Qwen2Tokenizer sets it up (NFC, Qwen2's
split pattern, byte-level without its own regex, byte-level decoder), with Qwen2's added tokens
after the vocabulary, saved by transformers as a Qwen2Tokenizer folder. The Qwen-Image pipeline
golden imports it to make its tiny tokenizer/ folder.
qwen2_tokenizer: two such folders under tests/data/golden/, in the two layouts a real one comes
in: qwen2_tokenizer/ (vocab.json + merges.txt + tokenizer_config.json, as the Qwen-Image release
ships) and qwen2_tokenizer_json/ (what transformers 5's save_pretrained writes: tokenizer.json +
tokenizer_config.json); then transformers' ids and decoded text of tricky strings, which both
folders must give alike.
"""
import json
import os
import random
import shutil
import tempfile

import torch

from make_golden import OUT, save

# Qwen2's added tokens in the order of the real vocabulary (ids right after the BPE vocabulary);
# <tool_call> and </tool_call> are added but not special there, as here.
QWEN2_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                 "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                 "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]
QWEN2_ADDED_PLAIN = ["<tool_call>", "</tool_call>"]

QWEN_IMAGE_TEMPLATE = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, spatial "
    "relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n")

_CORPUS_EN = """\
A photo of a cat sitting on a red mat, in the style of an oil painting. The astronaut rides a horse on the moon.
Describe the image by detailing the color, shape, size, texture, quantity, text, spatial relationships of the
objects and background. A small blue circle on the left, a large green square on the right, above a yellow sky.
She said: "don't stop, we'll see; I'm here and you're there, they've gone, it's done, I'd go." Isn't it?
DON'T SHOUT, WE'LL HEAR YOU. THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG. the quick brown fox jumps again.
Prices: $100.50, 2024-11-29, 3.14159, 42 apples and 7 oranges; call 555-0100 or visit https://example.com/a_b?c=d.
def main():\n    print("hello, world")\n    return 0\n\tif x == 1:\n\t\tpass\n
Café au lait, crème brûlée, naïve façade, Ångström, jalapeño, Straße, résumé, coöperate, El Niño.
A golden retriever running across a sunny beach, cinematic lighting, highly detailed, 8k, trending.
"""
_CORPUS_CJK = """\
一只猫坐在红色的垫子上，油画风格。宇航员在月球上骑马。请详细描述图像的颜色、形状、大小、纹理、数量、文字以及物体和背景的空间关系。
夕阳下的长城，远处有山，天空是橙色的。一个穿着红色连衣裙的女孩在雨中跳舞。招牌上写着“欢迎光临”。
日本語のテキスト、東京の夜景、桜の花びらが舞う。ひらがなとカタカナ。한국어 텍스트, 서울의 밤, 안녕하세요.
"""
_CORPUS_EMOJI = "Emoji: 😀😃🚀 👩‍💻 👨‍👩‍👧 👍🏽 ❤️ 🇯🇵 ✨🎉 🐱🐶 🌸🌙⭐ 👋🏻👋🏿"


def _corpus():
    lines = (_CORPUS_EN + _CORPUS_CJK + _CORPUS_EMOJI).split("\n")
    return lines * 3


def train_qwen2_tokenizer(out_dir, vocab_size=1200):
    """Trains a small Qwen2-style byte-level BPE and saves it with transformers into out_dir.

    out_dir gets what transformers' save_pretrained writes (tokenizer.json, tokenizer_config.json);
    vocab.json and merges.txt are written too, as the Qwen-Image release has them. Returns the
    transformers tokenizer. Deterministic: the same folder every run.
    """
    return train_byte_level_bpe(out_dir, QWEN2_ADDED_PLAIN, vocab_size=vocab_size)


def train_byte_level_bpe(out_dir, added_plain, chat_template=None, vocab_size=1200):
    """train_qwen2_tokenizer's BPE with QWEN2_SPECIAL, then `added_plain` (added, not special), after
    the vocabulary, and `chat_template` (if any) written into tokenizer_config.json, as Qwen's
    releases have it (transformers 5 would write chat_template.jinja)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import AddedToken, Qwen2Tokenizer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    bpe = Tokenizer(models.BPE(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="",
                               fuse_unk=False, byte_fallback=False))
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    bpe.train_from_iterator(_corpus(), trainer=trainer)

    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        bpe.model.save(tmp)  # vocab.json, merges.txt
        vocab = json.load(open(os.path.join(tmp, "vocab.json"), encoding="utf-8"))
        merges = [line for line in open(os.path.join(tmp, "merges.txt"), encoding="utf-8").read().split("\n")
                  if line and not line.startswith("#version")]
    # eos is <|endoftext|> while the added tokens get their ids (so that it comes first), then <|im_end|>.
    tok = Qwen2Tokenizer(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges], unk_token=None,
                         bos_token=None, eos_token="<|endoftext|>", pad_token="<|endoftext|>", errors="replace", split_special_tokens=False,
                         model_max_length=131072, clean_up_tokenization_spaces=False)
    # The added tokens in Qwen2's order, whatever transformers added on its own first.
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN2_SPECIAL], special_tokens=True)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added_plain])
    tok.eos_token = "<|im_end|>"
    if chat_template is not None:
        tok.chat_template = chat_template
    tok.save_pretrained(out_dir, save_jinja_files=False)
    with open(os.path.join(out_dir, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(out_dir, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "\n".join(merges) + "\n")
    return tok


QWEN2_STRINGS = [
    "a photo of a cat",
    "A Photo Of A CAT, on a MAT!!!",
    "don't stop; I'M here, we'll see. rock'n'roll, YOU'RE, THEY'VE, I'D, it'S, we'Ll 'ſ",
    "  leading and trailing   spaces\t\ttabs\nnewlines\r\n ",
    "   ",
    "\n\n\n",
    "x \n y\t \t z  \r\n\r\n  w",
    "non\u00a0breaking\u3000ideographic\u2003em\u0085nel\u000bvt\u000cff\u001cfs\u1680og\u2028ls\u200bzw",
    "caf\u00e9 vs cafe\u0301 (composed and decomposed), na\u00efve, A\u030angstr\u00f6m e\u0301\u0301",
    "\u0130stanbul \u039f\u0394\u039f\u03a3 Stra\u00dfe \ufb01sh \uff21\uff22\uff23",
    "emoji: \U0001f600\U0001f680 \U0001f469\u200d\U0001f4bb \U0001f468\u200d\U0001f469\u200d\U0001f467 "
    "\U0001f44d\U0001f3fd \u2764\ufe0f \U0001f1ef\U0001f1f5",
    "\u4e00\u53ea\u732b\u5728\u5c4b\u9876\u4e0a\uff0c\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 \ud55c\uad6d\uc5b4",
    "mixed\u4e2d\u6587English\u65e5\u672c123\u6570\u5b57 \u0645\u0631\u062d\u0628\u0627 \u0928\u092e\u0938\u094d\u0924\u0947",
    "digits 12345 and 3.14159, 2024-11-29, x\u00b2+y\u00b2, \u00bd cup, \u0663\u0664 \u2460",
    "https://example.com/a_b?c=d&e=f#g <html> @user #tag ...!!! ---",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|><|vision_start|><|image_pad|><|vision_end|>",
    "literal<|im_end|>glued<|im_start|> <tool_call>x</tool_call> <|IM_START|> <|im_start| <|unknown|>",
    "code:\n    def f(x):\n\treturn x  # comment\n",
    "ends with spaces   ",
    "",
    QWEN_IMAGE_TEMPLATE.format("A cozy caf\u00e9 at dusk, neon sign reading \u201cOPEN 24h\u201d, "
                               "\u4e00\u53ea\u732b\u5728\u7a97\u8fb9 \U0001f431, rain on the window."),
    QWEN_IMAGE_TEMPLATE.format(""),
]


# Pieces the fuzzed strings are made of: letters in both cases, every kind of white space, digits,
# apostrophes, combining marks, CJK, emoji with joiners and modifiers, controls, added tokens.
FUZZ_POOL = list("abc de fgh ABC XYZ 019 '.,!-") + [
    "'s", "'S", "'ll", "'LL", "'re", "'ve", "'d", "'m", "'t", "\t", "\n", "\r", "\r\n", "  ", "\u00a0",
    "\u3000", "\u2003", "\x0b", "\x0c", "\x85", "\u2028", "\u1680", "\u200b", "\ufeff", "\x1c", "\x00",
    "\u0301", "\u0308", "\u030a", "e\u0301", "\u00e9", "A\u030a", "\u212b", "\u017f", "\u0130", "\u00df",
    "\u732b", "\u4e00", "\u65e5\u672c", "\u30c6", "\uac00", "\u1100\u1161", "\u0663", "\u2460", "\u00b2",
    "\U0001f600", "\u200d", "\U0001f469", "\U0001f3fd", "\ufe0f", "\u2764", "\U0001f1ef", "\ufffd",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|image_pad|>", "<tool_call>", "<|", "|>", "<", ">",
]


def _write_v4_config(src, dst):
    """tokenizer_config.json (with added_tokens_decoder) and added_tokens.json as transformers 4
    wrote them, which is how the Qwen-Image release has them beside vocab.json and merges.txt."""
    config = json.load(open(os.path.join(src, "tokenizer_config.json"), encoding="utf-8"))
    added = json.load(open(os.path.join(src, "tokenizer.json"), encoding="utf-8"))["added_tokens"]
    config.pop("backend", None)
    config["added_tokens_decoder"] = {str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in added}
    config["additional_special_tokens"] = [t["content"] for t in added if t["special"] and
                                           t["content"] not in ("<|endoftext|>", "<|im_end|>")]
    with open(os.path.join(dst, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
    with open(os.path.join(dst, "added_tokens.json"), "w", encoding="utf-8") as f:
        json.dump({t["content"]: t["id"] for t in added}, f, indent=2, ensure_ascii=False)


def qwen2_tokenizer():
    from transformers import AutoTokenizer

    folder = os.path.join(OUT, "qwen2_tokenizer")
    folder_json = os.path.join(OUT, "qwen2_tokenizer_json")
    for d in (folder, folder_json):
        shutil.rmtree(d, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        train_qwen2_tokenizer(tmp)
        os.makedirs(folder)
        os.makedirs(folder_json)
        for name in ("vocab.json", "merges.txt"):
            shutil.copy(os.path.join(tmp, name), folder)
        _write_v4_config(tmp, folder)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(tmp, name), folder_json)
    ref = AutoTokenizer.from_pretrained(folder)  # built by Qwen2Tokenizer from vocab.json + merges.txt
    ref_json = AutoTokenizer.from_pretrained(folder_json)  # read from tokenizer.json
    assert type(ref).__name__.startswith("Qwen2Tokenizer"), type(ref)

    tensors, decoded, fuzz = {}, [], []
    for i, text in enumerate(QWEN2_STRINGS):
        ids = ref(text, add_special_tokens=True).input_ids
        assert ids == ref_json(text, add_special_tokens=True).input_ids, text
        assert ids == ref(text, add_special_tokens=False).input_ids, text  # Qwen2 adds no bos/eos
        tensors[f"ids.{i}"] = torch.tensor(ids, dtype=torch.int64)
        decoded.append(ref.decode(ids))
    rng = random.Random(1)
    flat, lengths = [], []
    for _ in range(400):
        text = "".join(rng.choice(FUZZ_POOL) for _ in range(rng.randint(0, 16)))
        ids = ref(text).input_ids
        assert ids == ref_json(text).input_ids, text
        flat += ids
        lengths.append(len(ids))
        fuzz.append(text)
    tensors["fuzz.ids"] = torch.tensor(flat, dtype=torch.int64)
    tensors["fuzz.lengths"] = torch.tensor(lengths, dtype=torch.int64)
    meta = {"strings": QWEN2_STRINGS, "fuzz": fuzz, "decoded": decoded, "pad_id": ref.pad_token_id,
            "eos_id": ref.eos_token_id, "vocab_size": len(ref),
            "added": {t: ref.convert_tokens_to_ids(t) for t in QWEN2_SPECIAL + QWEN2_ADDED_PLAIN}}
    save("qwen2_tokenizer.safetensors", tensors, meta)


PARTS = ["qwen2_tokenizer"]
