"""Golden data for FLUX.2-dev's text encoder (Mistral3ForConditionalGeneration's language model,
Mistral-Small-3.x) and for Flux2Pipeline, from diffusers 0.42.1 and transformers 5.24. What the
numbers mean is in docs/flux2-reference.md ("FLUX.2-dev's text encoder, checked").

train_mistral_tokenizer(pattern): a small byte-level BPE trained here (the corpus of
golden_qwen_tokenizer.py, the pipeline's system message, a line of scripts with combining marks)
with the tekken pre-tokenizer, written as a tekken.json (v7 layout: the special tokens at ids
0 .. NUM_SPECIAL-1, the 20 named ones in the real order, <SPECIAL_i> fillers after them, then the
256 bytes in byte order, then the merged tokens) and turned into a tokenizer by transformers' own
tekken converter (MistralConverter: Split(pattern, isolated) + ByteLevel without its regex,
byte-level decoder, BPE with ignore_merges), with the chat template of Mistral-Small-3.1's
processor. `pattern` is the Split regex written into tokenizer.json: TEKKEN_PATTERN (tekken.json's,
and what transformers' fix_mistral_regex puts in) or LLAMA3_PATTERN (what the Hugging Face
tokenizer.json of Mistral-Small-3.1 is reported to carry: the "incorrect regex" transformers warns
about, which diffusers keeps, since it loads the tokenizer folder without a config.json).

mistral3_encoder: in tests/data/golden/mistral3_encoder/ a tiny random
Mistral3ForConditionalGeneration in bf16 (text: 4 layers of width 64, 4 query heads over 2
key-value heads of head_dim 12, so that the attention width 48 is not the hidden width, as
32 x 128 = 4096 is not Mistral-Small's 5120; rope_theta 1e9; untied lm_head; a one-layer Pixtral
vision tower the pipeline never runs) in text_encoder/, and two PixtralProcessor folders:
tokenizer/ (LLAMA3_PATTERN) and tokenizer_tekken/ (TEKKEN_PATTERN), the same vocabulary.
mistral3_encoder.safetensors holds, per case of ENCODER_CASES, the ids and mask Flux2Pipeline's own
prompt encoding makes (NAME.input_ids, NAME.attention_mask [B, L]) and, computed in float32 from
the bf16 weights, Flux2Pipeline._get_mistral_3_small_prompt_embeds' output NAME.embeds
[B, L, 3 x 64]: per token hidden_states[1], [2], [3] (MISTRAL_LAYERS) side by side, so the hidden
states the pipeline reads are its three slices; then ids.I and tekken_ids.I, the ids of
QWEN2_STRINGS through both tokenizers (no special tokens added).

flux2_dev_pipeline: models/tiny-random-flux2-dev/ (Flux2Pipeline: a 32-layer tiny Mistral3 of width
32, its tokenizer/ a PixtralProcessor over LLAMA3_PATTERN with padding_side left, the dev
transformer of golden_flux2.py (flux2_transformer_dev's weights: guidance embedder), golden_flux2.py's
VAE as a link to tiny-random-flux2-klein's, FLUX.2's scheduler config) and Flux2Pipeline's images
from it in flux2_dev_pipeline.safetensors (the layout of flux2_klein_pipeline.safetensors).
Needs models/tiny-random-flux2-klein/ and tests/data/golden/flux2/ (golden_flux2.py's
flux2_klein_pipeline).
"""
import base64
import json
import os
import shutil
import tempfile

import torch

from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE

from golden_qwen_tokenizer import QWEN2_STRINGS, _corpus
from make_golden import OUT, perturb_norms, save

PARTS = ["mistral3_encoder", "flux2_dev_pipeline"]

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
MODELS = os.path.join(ROOT, "models")
DEV = "tiny-random-flux2-dev"

# tekken.json's pattern (Mistral-Small-3.x's tekken v7; transformers' fix_mistral_regex puts the same).
TEKKEN_PATTERN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
                  r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|"
                  r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Llama 3's pattern, reported in the Hugging Face tokenizer.json of Mistral-Small-3.1.
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                  r"\s*[\r\n]+|\s+(?!\S)|\s+")

# Tekken's special tokens in the order of their ids (mistral-common's Tekkenizer, v7), then fillers.
MISTRAL_SPECIAL = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                   "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]",
                   "[IMG_END]", "[PREFIX]", "[MIDDLE]", "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]",
                   "[TOOL_CONTENT]"]
NUM_SPECIAL = 32  # Mistral-Small's: 1000 (<SPECIAL_20> .. <SPECIAL_999>)

# Mistral-Small-3.1-24B-Instruct-2503's processor chat template, as it renders system, user and
# assistant messages of string or typed-block contents (its date line and default system message
# left out: the pipeline always sends a system message).
MISTRAL_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- if messages[0]['content'] is string %}{%- set system_message = messages[0]['content'] %}"
    "{%- else %}{%- set system_message = messages[0]['content'][0]['text'] %}{%- endif %}"
    "{%- set loop_messages = messages[1:] %}"
    "{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}"
    "{%- else %}{%- set loop_messages = messages %}{%- endif %}"
    "{%- for message in loop_messages %}"
    "{%- if message['role'] == 'user' %}"
    "{%- if message['content'] is string %}{{- '[INST]' + message['content'] + '[/INST]' }}"
    "{%- else %}{{- '[INST]' }}"
    "{%- for block in message['content'] %}"
    "{%- if block['type'] == 'text' %}{{- block['text'] }}"
    "{%- elif block['type'] == 'image' or block['type'] == 'image_url' %}{{- '[IMG]' }}"
    "{%- else %}{{- raise_exception('Only text and image blocks are supported in message content!') }}{%- endif %}"
    "{%- endfor %}{{- '[/INST]' }}{%- endif %}"
    "{%- elif message['role'] == 'system' %}{{- '[SYSTEM_PROMPT]' + message['content'] + '[/SYSTEM_PROMPT]' }}"
    "{%- elif message['role'] == 'assistant' %}"
    "{%- if message['content'] is string %}{{- message['content'] + eos_token }}"
    "{%- else %}{{- message['content'][0]['text'] + eos_token }}{%- endif %}"
    "{%- else %}{{- raise_exception('Only user, system and assistant roles are supported!') }}{%- endif %}"
    "{%- endfor %}")


# Scripts whose letters carry combining marks (\\p{M}): tekken's pattern keeps a mark with its letter,
# Llama 3's splits it off, so the two tokenizers give different ids here (and on decomposed accents).
_CORPUS_MARKS = ("\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e, "
                 "\u0906\u092a \u0915\u0948\u0938\u0947 \u0939\u0948\u0902? \u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35 "
                 "\u0e04\u0e23\u0e31\u0e1a. cafe\u0301 nai\u0308ve A\u030angstro\u0308m")


def _train_ranks(vocab_size):
    """The BPE trained with the tekken split: its tokens as bytes, in rank order (the 256 bytes
    first, in byte order, as tekken.json has them; then the merged tokens in the order learned)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    bpe = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(TEKKEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    bpe.train_from_iterator(_corpus() + [SYSTEM_MESSAGE, _CORPUS_MARKS] * 3, trainer=trainer)
    decode = {c: b for b, c in bytes_to_unicode().items()}
    merged = sorted((i, t) for t, i in bpe.get_vocab().items() if len(t) > 1)
    return [bytes([b]) for b in range(256)] + [bytes(decode[c] for c in t) for _, t in merged]


def _tekken_json(path, pattern, vocab_size):
    ranks = _train_ranks(vocab_size)
    specials = MISTRAL_SPECIAL
    data = {
        "config": {"pattern": pattern, "num_vocab_tokens": len(ranks), "default_vocab_size": NUM_SPECIAL + len(ranks),
                   "default_num_special_tokens": NUM_SPECIAL, "version": "v7"},
        "vocab": [{"rank": r, "token_bytes": base64.b64encode(b).decode(), "token_str": None}
                  for r, b in enumerate(ranks)],
        "special_tokens": [{"rank": r, "token_str": t, "is_control": True} for r, t in enumerate(specials)],
    }
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f)


def train_mistral_tokenizer(pattern, vocab_size=1000):
    """The transformers tokenizer (TokenizersBackend) converted from a tekken.json of ours; see the
    module's docstring. Deterministic."""
    from transformers.integrations.mistral.tokenizer import convert_tekken_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "tekken.json")
        _tekken_json(path, pattern, vocab_size)
        tok = convert_tekken_tokenizer(path, chat_template=MISTRAL_CHAT_TEMPLATE)
    tok.init_kwargs.pop("vocab_file", None)  # the temporary tekken.json: not written to the folder
    tok.model_max_length = 131072
    return tok


def pixtral_processor_class():
    """transformers' PixtralProcessor, made importable without torchvision. No torchvision is
    published for the pinned torch, and transformers then gives a placeholder that refuses to be
    built; the processor's text path (chat template, tokenizer) never touches torchvision, only
    its image path does, which Flux2Pipeline's prompt encoding never takes. So the module is
    imported with an empty stand-in for torchvision.transforms.v2.functional (removed again right
    after), and the real class is bound where transformers and diffusers look it up by name."""
    import sys
    import types

    import transformers
    import transformers.models.pixtral as pixtral_package

    try:
        import torchvision  # noqa: F401
        return transformers.PixtralProcessor
    except ImportError:
        pass
    names = ["torchvision", "torchvision.transforms", "torchvision.transforms.v2",
             "torchvision.transforms.v2.functional"]
    stubs = {n: types.ModuleType(n) for n in names}
    for parent, child in zip(names, names[1:]):
        setattr(stubs[parent], child.rsplit(".", 1)[1], stubs[child])
    sys.modules.update(stubs)
    try:
        from transformers.models.pixtral.processing_pixtral import PixtralProcessor
    finally:
        for n in names:
            sys.modules.pop(n, None)
    transformers.PixtralProcessor = PixtralProcessor
    pixtral_package.PixtralProcessor = PixtralProcessor
    return PixtralProcessor


# Mistral-Small-3.1's text model made tiny (its values in the comments): head_dim given apart from
# hidden_size / heads, 4 query heads over 2 key-value heads (32 over 8), no sliding window (null
# there; MistralConfig's own default is 4096), rope_theta 1e9, untied lm_head.
MISTRAL_TINY = dict(hidden_size=64, intermediate_size=80, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=12, rms_norm_eps=1e-5, max_position_embeddings=131072,
                    rope_parameters={"rope_type": "default", "rope_theta": 1e9}, sliding_window=None,
                    hidden_act="silu", tie_word_embeddings=False)
# Pixtral's vision tower made tiny (1024 wide, 24 layers, patch 14 there): the class needs one.
PIXTRAL_TINY = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                    image_size=56, patch_size=14, hidden_act="gelu")
MISTRAL_LAYERS = (1, 2, 3)  # the pipeline's (10, 20, 30) of 40 layers: inner layers, as here of 4


def tiny_mistral3(text, vocab_size, seed):
    """A random Mistral3ForConditionalGeneration with the text config `text` (MISTRAL_TINY's keys),
    perturbed norms, and embeddings and layer outputs scaled so that hidden states are of order 1
    and every layer adds about as much as it gets (attention far from uniform)."""
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration, MistralConfig, PixtralVisionConfig

    torch.manual_seed(seed)
    config = Mistral3Config(text_config=MistralConfig(vocab_size=vocab_size, bos_token_id=1, eos_token_id=2,
                                                      pad_token_id=11, **text),
                            vision_config=PixtralVisionConfig(**PIXTRAL_TINY), image_token_index=10,
                            spatial_merge_size=2, projector_hidden_act="gelu", multimodal_projector_bias=False,
                            vision_feature_layer=-1, tie_word_embeddings=False)
    model = Mistral3ForConditionalGeneration(config).eval()
    perturb_norms(model)
    lm = model.model.language_model
    with torch.no_grad():
        lm.embed_tokens.weight.mul_(25.0)
        for layer in lm.layers:
            layer.self_attn.q_proj.weight.mul_(4.0)
            layer.self_attn.k_proj.weight.mul_(4.0)
            layer.self_attn.o_proj.weight.mul_(10.0)
            layer.mlp.down_proj.weight.mul_(10.0)
    return model


def _processor(pattern, padding_side=None):
    """A PixtralProcessor as Mistral-Small-3.1's (patch 14, spatial merge 2, longest edge 1540, CLIP's
    mean and std) over train_mistral_tokenizer(pattern); `padding_side` written into the tokenizer."""
    from transformers.models.pixtral.image_processing_pil_pixtral import PixtralImageProcessorPil

    processor_class = pixtral_processor_class()
    tokenizer = train_mistral_tokenizer(pattern)
    if padding_side is not None:
        tokenizer.padding_side = padding_side
        tokenizer.init_kwargs["padding_side"] = padding_side
    images = PixtralImageProcessorPil(patch_size={"height": 14, "width": 14}, size={"longest_edge": 1540},
                                      image_mean=[0.48145466, 0.4578275, 0.40821073],
                                      image_std=[0.26862954, 0.26130258, 0.27577711])
    return processor_class(image_processor=images, tokenizer=tokenizer, patch_size=14, spatial_merge_size=2,
                           chat_template=MISTRAL_CHAT_TEMPLATE)


def _format(prompts):
    """Flux2Pipeline's messages (its own format_input)."""
    from diffusers.pipelines.flux2.pipeline_flux2 import format_input

    return format_input(prompts=list(prompts), system_message=SYSTEM_MESSAGE)


def _encode_ids(processor, prompts, msl):
    """The ids and mask Flux2Pipeline._get_mistral_3_small_prompt_embeds makes, by the same call."""
    enc = processor.apply_chat_template(_format(prompts), add_generation_prompt=False, tokenize=True,
                                        return_dict=True, return_tensors="pt", padding="max_length",
                                        truncation=True, max_length=msl)
    return enc["input_ids"], enc["attention_mask"]


ENCODER_PROMPTS = [
    "",
    "a photo of a cat",
    "\u4e00\u53ea\u732b\u5728\u5c4b\u9876\u4e0a\uff0c\u6cb9\u753b\u98ce\u683c\u3002",
    "A CamelCase sign: 'OPEN 2024' isn't closed; [IMG] stays out, \u0928\u092e\u0938\u094d\u0924\u0947 cafe\u0301",
    " ".join(f"a lighthouse number {i} on a rocky coast at dusk," for i in range(12)),
]
ENCODER_CASES = [
    # name, tokenizer folder, padding side, prompts (indices into ENCODER_PROMPTS), max_sequence_length
    ("left", "tokenizer", "left", [0, 1, 2], 48),  # the CJK prompt cut, no [/INST]
    ("right", "tokenizer", "right", [1], 48),
    ("cut", "tokenizer", "left", [4], 44),  # cut inside the prompt
    ("cut_system", "tokenizer", "left", [1], 12),  # cut inside the system message
    ("ids_only", "tokenizer", "left", [0, 1, 2, 3, 4], 96),  # ids and mask only: nothing cut
    ("tekken", "tokenizer_tekken", "left", [0, 1, 2, 3, 4], 96),
]


def mistral3_encoder():
    from diffusers import Flux2Pipeline
    from transformers import AutoProcessor, Mistral3ForConditionalGeneration

    folder = os.path.join(OUT, "mistral3_encoder")
    shutil.rmtree(folder, ignore_errors=True)
    for name, pattern in (("tokenizer", LLAMA3_PATTERN), ("tokenizer_tekken", TEKKEN_PATTERN)):
        _processor(pattern).save_pretrained(os.path.join(folder, name))
    processors = {n: AutoProcessor.from_pretrained(os.path.join(folder, n)) for n in ("tokenizer", "tokenizer_tekken")}
    tokenizer = processors["tokenizer"].tokenizer
    assert type(processors["tokenizer"]).__name__ == "PixtralProcessor", type(processors["tokenizer"])
    # bf16 weights, as the release ships them; the golden computes in float32 from them.
    tiny_mistral3(MISTRAL_TINY, len(tokenizer), 60).to(torch.bfloat16).save_pretrained(
        os.path.join(folder, "text_encoder"))
    gen = os.path.join(folder, "text_encoder", "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)
    model = Mistral3ForConditionalGeneration.from_pretrained(os.path.join(folder, "text_encoder"),
                                                             dtype=torch.float32).eval()

    tensors, meta = {}, {"prompts": ENCODER_PROMPTS, "cases": {}, "layers": list(MISTRAL_LAYERS),
                         "hidden_size": MISTRAL_TINY["hidden_size"], "system_message": SYSTEM_MESSAGE,
                         "special": {t: tokenizer.convert_tokens_to_ids(t) for t in MISTRAL_SPECIAL},
                         "bos_id": tokenizer.bos_token_id, "eos_id": tokenizer.eos_token_id,
                         "pad_id": tokenizer.pad_token_id, "vocab_size": len(tokenizer),
                         "num_special": NUM_SPECIAL, "patterns": {"tokenizer": LLAMA3_PATTERN,
                                                                  "tokenizer_tekken": TEKKEN_PATTERN}}
    with torch.no_grad():
        for name, tok_dir, side, which, msl in ENCODER_CASES:
            processor = processors[tok_dir]
            processor.tokenizer.padding_side = side
            prompts = [ENCODER_PROMPTS[i] for i in which]
            ids, mask = _encode_ids(processor, prompts, msl)
            tensors[f"{name}.input_ids"], tensors[f"{name}.attention_mask"] = ids, mask
            texts = processor.apply_chat_template(_format(prompts), tokenize=False, add_generation_prompt=False)
            m = dict(tokenizer=tok_dir, padding_side=side, prompts=which, max_sequence_length=msl, texts=texts)
            if tok_dir == "tokenizer" and name != "ids_only":
                embeds = Flux2Pipeline._get_mistral_3_small_prompt_embeds(
                    model, processor, prompts, device=torch.device("cpu"), max_sequence_length=msl,
                    hidden_states_layers=MISTRAL_LAYERS)
                assert torch.isfinite(embeds).all(), name
                tensors[f"{name}.embeds"] = embeds
                m["embeds"] = True
            meta["cases"][name] = m
    processors["tokenizer"].tokenizer.padding_side = "right"
    for tok_dir, prefix in (("tokenizer", "ids"), ("tokenizer_tekken", "tekken_ids")):
        tok = processors[tok_dir].tokenizer
        for i, text in enumerate(QWEN2_STRINGS):
            tensors[f"{prefix}.{i}"] = torch.tensor(tok(text, add_special_tokens=False).input_ids, dtype=torch.int64)
    meta["strings"] = QWEN2_STRINGS
    save("mistral3_encoder.safetensors", tensors, meta)


# --- Flux2Pipeline (FLUX.2-dev) -------------------------------------------------------------------

# The pipeline's text model: width 32 (3 x 32 = 96 = the dev transformer's joint_attention_dim), 32
# layers so that the pipeline's default text_encoder_out_layers (10, 20, 30) are inner layers, as
# they are of Mistral-Small's 40.
MISTRAL_PIPE = dict(MISTRAL_TINY, hidden_size=32, intermediate_size=48, num_hidden_layers=32, head_dim=6)
LONG = ("a lighthouse on a rocky coast at dusk with waves and gulls and warm light in every window of the tower, "
        "seen from a small boat")
# name, prompts, guidance_scale, width, height, steps, seeds (one per prompt), reference images,
# max_sequence_length
DEV_CASES = [
    ("t2i", ["a red fox in the snow"], 4.0, 32, 32, 4, [3], [], 512),
    ("t2i_g25", ["a red fox in the snow"], 2.5, 32, 32, 4, [3], [], 512),
    ("nonsquare", [LONG], 4.0, 40, 24, 4, [5], [], 48),  # cut inside the prompt
    ("ref1", ["make the sky green"], 4.0, 32, 32, 3, [11], ["ref_96x72.png"], 512),
    ("batch", ["a cat", "a bowl of ramen with an egg"], 3.0, 32, 24, 3, [7, 8], [], 512),
]
DEV_BF16_CASE = "t2i"


def _dev_folder():
    from diffusers import FlowMatchEulerDiscreteScheduler, Flux2Pipeline

    from golden_flux2 import KLEIN, SCHEDULER, _link, _transformer, _vae

    folder = os.path.join(MODELS, DEV)
    shutil.rmtree(folder, ignore_errors=True)
    processor = _processor(LLAMA3_PATTERN, padding_side="left")
    text_encoder = tiny_mistral3(MISTRAL_PIPE, len(processor.tokenizer), 61)
    pipe = Flux2Pipeline(scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER), vae=_vae(), text_encoder=text_encoder,
                         tokenizer=processor, transformer=_transformer(True))
    pipe.save_pretrained(folder, safe_serialization=True)
    gen = os.path.join(folder, "text_encoder", "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)  # not the encoder's
    # The VAE is golden_flux2's, byte for byte the klein folder's: a link, as klein-base's components.
    ours, theirs = os.path.join(folder, "vae"), os.path.join(MODELS, KLEIN, "vae")
    for name in os.listdir(ours):
        with open(os.path.join(ours, name), "rb") as a, open(os.path.join(theirs, name), "rb") as b:
            assert a.read() == b.read(), name
    shutil.rmtree(ours)
    _link(os.path.join("..", KLEIN, "vae"), ours)
    with open(os.path.join(folder, "tokenizer", "tokenizer_config.json")) as f:
        assert json.load(f).get("padding_side") == "left"


def _dev_run(pipe, case, images):
    """One Flux2Pipeline call; the images as uint8 and the packed latents after the last step."""
    from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu

    from golden_flux2 import INPUTS, _rel, run_and_keep

    name, prompts, guidance, width, height, steps, seeds, refs, msl = case
    kwargs = dict(prompt=prompts, guidance_scale=guidance, width=width, height=height, num_inference_steps=steps,
                  max_sequence_length=msl)
    if refs:
        kwargs["image"] = [images[r] for r in refs]
    result, out_h, out_w, tokens = run_and_keep(pipe, name, seeds, **kwargs)
    m = dict(name=name, folder="models/" + DEV, pipeline="Flux2Pipeline", prompts=prompts, guidance_scale=guidance,
             width=width, height=height, out_width=out_w, out_height=out_h, steps=steps, seeds=seeds,
             images=[_rel(os.path.join(INPUTS, r)) for r in refs], max_sequence_length=msl,
             text_encoder_out_layers=[10, 20, 30], image_tokens=tokens, mu=compute_empirical_mu(tokens, steps))
    return result, m


def flux2_dev_pipeline():
    from diffusers import Flux2Pipeline
    from PIL import Image

    from golden_flux2 import INPUTS, REFS

    pixtral_processor_class()
    _dev_folder()
    for n in REFS:
        assert os.path.exists(os.path.join(INPUTS, n)), f"{n}: run golden_flux2.py's flux2_klein_pipeline first"
    images = {n: Image.open(os.path.join(INPUTS, n)) for n in REFS}
    pipe = Flux2Pipeline.from_pretrained(os.path.join(MODELS, DEV))  # what the C++ side reads
    pipe.set_progress_bar_config(disable=True)
    assert type(pipe.tokenizer).__name__ == "PixtralProcessor" and pipe.tokenizer.tokenizer.padding_side == "left"
    tensors, meta = {}, {}
    for case in DEV_CASES:
        result, m = _dev_run(pipe, case, images)
        tensors.update(result)
        meta[case[0]] = m
    # The prompt encoding of two cases: ids and mask (left-padded), and the embeddings of the cut one.
    for name in ("t2i", "nonsquare"):
        case = next(c for c in DEV_CASES if c[0] == name)
        ids, mask = _encode_ids(pipe.tokenizer, case[1], case[8])
        tensors[f"{name}.input_ids"], tensors[f"{name}.attention_mask"] = ids[0], mask[0]
        meta[name]["chat_text"] = pipe.tokenizer.apply_chat_template(_format(case[1]), tokenize=False)[0]
    embeds, _ = pipe.encode_prompt(LONG, max_sequence_length=48)
    tensors["nonsquare.prompt_embeds"] = embeds[0]
    bf16 = Flux2Pipeline.from_pretrained(os.path.join(MODELS, DEV), torch_dtype=torch.bfloat16)
    bf16.set_progress_bar_config(disable=True)
    case = next(c for c in DEV_CASES if c[0] == DEV_BF16_CASE)
    result, m = _dev_run(bf16, ("bf16",) + case[1:], images)
    tensors.update(result)
    meta["bf16"] = dict(m, dtype="bfloat16", same_as=DEV_BF16_CASE)
    save("flux2_dev_pipeline.safetensors", tensors, meta)
