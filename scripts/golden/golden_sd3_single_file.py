"""Single-file Stable Diffusion 3.5 checkpoints in Stability AI's own tensor names, a Qwen-Image
transformer file in diffusers' names, and the images diffusers makes with them. Files, in
tests/data/golden/sd3_single_file/:

- sd35m_stability.safetensors: the transformer of the tiny SD3.5-medium folder
  (tests/data/golden/sd35_medium_tiny, fp32) alone, in bf16, in the layout of sd3.5_medium.safetensors:
  every name under "model.diffusion_model.".
- sd35m_stability_all.safetensors: the same transformer tensors and every other weight of the pipeline,
  in bf16, as Stability's "incl_clips" files hold them:
      model.diffusion_model.                 the transformer (below)
      text_encoders.clip_l.transformer.      CLIP-L (text_encoder), transformers' own names, its
                                             text_projection.weight included
      text_encoders.clip_g.transformer.      CLIP-G (text_encoder_2), transformers' own names
      text_encoders.t5xxl.transformer.       T5 (text_encoder_3), transformers' own names, with both
                                             shared.weight and encoder.embed_tokens.weight (equal), as
                                             T5EncoderModel.state_dict() holds them
      first_stage_model.                     the VAE in the original LDM layout (below)
- vae_ldm_2blocks.json: the LDM-to-diffusers names of a random two-block AutoencoderKL
  (block_out_channels [4, 8]: a down- and an up-sampler, up blocks in reverse order), as diffusers'
  convert_ldm_vae_checkpoint maps them: {"config": the VAE's config, "tensors": {LDM name (no
  "first_stage_model." prefix): {"shape": the LDM shape, "diffusers": the diffusers name}}}. Each
  diffusers name is found by value: every tensor of that VAE holds distinct random values.
- qwen_image_transformer_bf16.safetensors: the transformer of the tiny Qwen-Image folder
  (models/tiny-random-qwen-image) in bf16, in diffusers' own names with no prefix, the names ComfyUI's
  split Qwen-Image transformer files use.

The SD3 transformer's tensors map to Stability's names as below (to_stability; from_stability is its
inverse):

    pos_embed                               pos_embed.pos_embed
    x_embedder.proj                         pos_embed.proj
    t_embedder.mlp.{0,2}                    time_text_embed.timestep_embedder.linear_{1,2}
    y_embedder.mlp.{0,2}                    time_text_embed.text_embedder.linear_{1,2}
    context_embedder                        context_embedder
    joint_blocks.N.x_block.attn.qkv         transformer_blocks.N.attn.to_q ; to_k ; to_v (rows stacked)
    joint_blocks.N.context_block.attn.qkv   attn.add_q_proj ; add_k_proj ; add_v_proj
    joint_blocks.N.x_block.attn.ln_{q,k}    attn.norm_{q,k}
    joint_blocks.N.context_block.attn.ln_{q,k}   attn.norm_added_{q,k}
    joint_blocks.N.x_block.attn.proj        attn.to_out.0
    joint_blocks.N.context_block.attn.proj  attn.to_add_out               (not in the last block)
    joint_blocks.N.x_block.attn2.qkv        attn2.to_q ; to_k ; to_v      (dual-attention blocks)
    joint_blocks.N.x_block.attn2.ln_{q,k}   attn2.norm_{q,k}
    joint_blocks.N.x_block.attn2.proj       attn2.to_out.0
    joint_blocks.N.x_block.adaLN_modulation.1        norm1.linear
    joint_blocks.N.context_block.adaLN_modulation.1  norm1_context.linear; in the last block (context
                                            pre-only: no context attn.proj, no context mlp) its two
                                            halves swapped
    joint_blocks.N.x_block.mlp.fc{1,2}      ff.net.0.proj / ff.net.2
    joint_blocks.N.context_block.mlp.fc{1,2}     ff_context.net.0.proj / ff_context.net.2 (not in the last)
    final_layer.linear                      proj_out
    final_layer.adaLN_modulation.1          norm_out.linear, its two halves swapped (Stability: shift
                                            then scale; diffusers: scale then shift)

The VAE's tensors map to the LDM layout as below (vae_to_ldm_name, I the diffusers block index, K =
number of up blocks - 1 - I: the LDM decoder numbers its up blocks from the lowest resolution):

    encoder.down_blocks.I.resnets.J.*       encoder.down.I.block.J.* (conv_shortcut: nin_shortcut)
    encoder.down_blocks.I.downsamplers.0.conv    encoder.down.I.downsample.conv
    {en,de}coder.mid_block.resnets.{0,1}    {en,de}coder.mid.block_{1,2}
    {en,de}coder.mid_block.attentions.0.{group_norm,to_q,to_k,to_v,to_out.0}
                                            {en,de}coder.mid.attn_1.{norm,q,k,v,proj_out}, the four
                                            linear weights stored as 1x1 conv weights [C, C, 1, 1]
    {en,de}coder.conv_norm_out              {en,de}coder.norm_out
    decoder.up_blocks.I.resnets.J.*         decoder.up.K.block.J.*
    decoder.up_blocks.I.upsamplers.0.conv   decoder.up.K.upsample.conv
    conv_in, conv_out, quant_conv, post_quant_conv   unchanged

The reference images, sd3_single_file_pipeline.safetensors (cases in its metadata: the call's
arguments, "file" and "folder" relative to the repository, "loader"):

- stability: StableDiffusion3Pipeline.from_pretrained(folder, transformer=SD3Transformer2DModel
  .from_single_file(sd35m_stability.safetensors, config=folder, subfolder="transformer",
  torch_dtype=torch.float32), torch_dtype=torch.float32).
- stability_all: StableDiffusion3Pipeline.from_single_file(sd35m_stability_all.safetensors,
  config=folder, torch_dtype=torch.float32), with text_encoder_2 passed in (see below). Every model
  weight comes from the file; the folder gives the configs, tokenizers and scheduler.
- folder: the folder's own fp32 pipeline, for comparison.

What diffusers 0.42.1 does with the all-in-one file, which the C++ side matches:
- CLIP-L's text_projection.weight in the file is not used: diffusers replaces it by the identity
  matrix (torch.eye of the hidden size), as SD3's reference code does for CLIP-L. The pooled CLIP-L
  output is therefore its final-norm EOS hidden state, unprojected. CLIP-G's text_projection.weight
  is read from the file as it is.
- diffusers tells CLIP-L from CLIP-G by the width of the position embedding: for a CLIP component
  it takes CLIP-L's tensors whenever the file has them and their width equals the component's hidden
  size (768 in the real models, 1280 for CLIP-G). The tiny folder's two CLIPs are both 32 wide, so a
  plain from_single_file loads CLIP-L's weights (and the identity projection) into text_encoder_2
  too; a real file is not affected. stability_all therefore passes text_encoder_2 in, made by
  diffusers' own create_diffusers_clip_model_from_ldm from the file's clip_g tensors alone (the path
  diffusers takes for CLIP-G when the widths differ). The run checks that the plain call does
  mis-load it, so that a diffusers that stops doing so is noticed.
- T5: the "text_encoders.t5xxl.transformer." prefix is stripped and the rest loaded as named;
  shared.weight and encoder.embed_tokens.weight are tied in T5EncoderModel, so the file holds both.
  diffusers needs both: it builds the model on the meta device and fills it by name, without tying,
  so from shared.weight alone encoder.embed_tokens.weight would be left unloaded (on "meta").
- CLIP's embeddings.position_ids is a non-persistent buffer in transformers 5: it is not in a state
  dict, so not in the file; diffusers skips it if a file holds it (names the model's state dict does
  not have are dropped while loading) and keeps its own arange.

Qwen-Image, qwen_single_file_pipeline.safetensors:
- qwen_bf16: QwenImagePipeline.from_pretrained(folder, transformer=QwenImageTransformer2DModel
  .from_single_file(qwen_image_transformer_bf16.safetensors, config=folder, subfolder="transformer",
  torch_dtype=torch.float32), torch_dtype=torch.float32), with true CFG.
- qwen_folder: the folder's own fp32 pipeline.

Each case stores <case>.latents (output_type="latent", float32) and <case>.image (uint8 H x W x 3,
output_type="np" x 255, rounded). Checks made on the way (the run stops if one fails): diffusers'
converters turn each file back into exactly the folder's weights rounded to bf16; every component
from_single_file builds holds exactly the file's values upcast (CLIP-L's projection the identity);
stability's, stability_all's and qwen_bf16's latents equal those of the folder pipeline with the
same weights rounded to bf16 (for stability_all with CLIP-L's projection the identity too), so they
differ from the fp32 folder's by that rounding alone, and for stability_all by CLIP-L's identity
projection (the folder's CLIP-L has a random one); the differences are printed, the latter also
against the fp32 folder with only CLIP-L's projection made the identity.
"""
import json
import os
import re

import torch
from safetensors.torch import load_file, save_file

from golden_single_file import _exactly_equal, _fused, _linear, _run, _swap_halves  # shared with FLUX.1's
from make_golden import OUT, save

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SD3_FOLDER = os.path.join(OUT, "sd35_medium_tiny")
QWEN_FOLDER = os.path.join(ROOT, "models", "tiny-random-qwen-image")
FILES = os.path.join(OUT, "sd3_single_file")
SD3_CALL = dict(prompt="a blue square over a yellow star", negative_prompt="low quality", seed=3, steps=3,
                guidance_scale=4.5, width=32, height=32, max_sequence_length=32)
QWEN_CALL = dict(prompt="a red fox in the snow", negative_prompt="blurry, low quality", seed=7, steps=3,
                 true_cfg_scale=4.0, width=48, height=32, max_sequence_length=512)
TRANSFORMER_PREFIX = "model.diffusion_model."
PREFIXES = {"text_encoder": "text_encoders.clip_l.transformer.", "text_encoder_2": "text_encoders.clip_g.transformer.",
            "text_encoder_3": "text_encoders.t5xxl.transformer.", "vae": "first_stage_model.",
            "transformer": TRANSFORMER_PREFIX}
PARTS = ["sd3_single_file", "qwen_single_file"]


# The SD3 transformer in Stability AI's names.

def sd3_key_table(config):
    """(Stability name, how, [diffusers names]) for every tensor of an SD3Transformer2DModel with `config`.
    how: "same" one tensor renamed; "rows" the diffusers tensors stacked along dim 0, in order;
    "swap" the diffusers tensor with its two halves along dim 0 exchanged."""
    qk_norm = config.get("qk_norm") is not None
    dual = set(config.get("dual_attention_layers") or ())
    last = config["num_layers"] - 1
    table = [("pos_embed", "same", ["pos_embed.pos_embed"])]
    table += _linear("x_embedder.proj", "pos_embed.proj")
    table += _linear("t_embedder.mlp.0", "time_text_embed.timestep_embedder.linear_1")
    table += _linear("t_embedder.mlp.2", "time_text_embed.timestep_embedder.linear_2")
    table += _linear("y_embedder.mlp.0", "time_text_embed.text_embedder.linear_1")
    table += _linear("y_embedder.mlp.2", "time_text_embed.text_embedder.linear_2")
    table += _linear("context_embedder", "context_embedder")
    for n in range(config["num_layers"]):
        x, c, d = f"joint_blocks.{n}.x_block", f"joint_blocks.{n}.context_block", f"transformer_blocks.{n}"
        table += _fused(f"{x}.attn.qkv", [f"{d}.attn.to_{q}" for q in "qkv"])
        table += _fused(f"{c}.attn.qkv", [f"{d}.attn.add_{q}_proj" for q in "qkv"])
        if qk_norm:
            for q in "qk":
                table.append((f"{x}.attn.ln_{q}.weight", "same", [f"{d}.attn.norm_{q}.weight"]))
                table.append((f"{c}.attn.ln_{q}.weight", "same", [f"{d}.attn.norm_added_{q}.weight"]))
        table += _linear(f"{x}.attn.proj", f"{d}.attn.to_out.0")
        if n != last:
            table += _linear(f"{c}.attn.proj", f"{d}.attn.to_add_out")
        if n in dual:
            table += _fused(f"{x}.attn2.qkv", [f"{d}.attn2.to_{q}" for q in "qkv"])
            if qk_norm:
                for q in "qk":
                    table.append((f"{x}.attn2.ln_{q}.weight", "same", [f"{d}.attn2.norm_{q}.weight"]))
            table += _linear(f"{x}.attn2.proj", f"{d}.attn2.to_out.0")
        table += _linear(f"{x}.adaLN_modulation.1", f"{d}.norm1.linear")
        table += [(f"{c}.adaLN_modulation.1.{p}", "swap" if n == last else "same", [f"{d}.norm1_context.linear.{p}"])
                  for p in ("weight", "bias")]
        table += _linear(f"{x}.mlp.fc1", f"{d}.ff.net.0.proj")
        table += _linear(f"{x}.mlp.fc2", f"{d}.ff.net.2")
        if n != last:
            table += _linear(f"{c}.mlp.fc1", f"{d}.ff_context.net.0.proj")
            table += _linear(f"{c}.mlp.fc2", f"{d}.ff_context.net.2")
    table += _linear("final_layer.linear", "proj_out")
    table += [(f"final_layer.adaLN_modulation.1.{p}", "swap", [f"norm_out.linear.{p}"]) for p in ("weight", "bias")]
    return table


def to_stability(state, config):
    """A diffusers SD3Transformer2DModel state dict in Stability AI's names, under "model.diffusion_model."."""
    out, used = {}, set()
    for name, how, names in sd3_key_table(config):
        parts = [state[n] for n in names]
        used.update(names)
        t = torch.cat(parts, dim=0) if how == "rows" else _swap_halves(parts[0]) if how == "swap" else parts[0]
        out[TRANSFORMER_PREFIX + name] = t
    left = set(state) - used
    assert not left, f"tensors with no Stability name: {sorted(left)}"
    return out


def from_stability(state, config):
    """The inverse of to_stability, from the "model.diffusion_model." tensors of `state` (others ignored);
    fused rows are split in equal parts (q, k and v have the same width)."""
    state = {k[len(TRANSFORMER_PREFIX):]: v for k, v in state.items() if k.startswith(TRANSFORMER_PREFIX)}
    out, table = {}, sd3_key_table(config)
    left = set(state) - {name for name, _, _ in table}
    assert not left, f"tensors the table does not name: {sorted(left)}"
    for name, how, names in table:
        t = state[name]
        if how == "rows":
            out.update(zip(names, t.chunk(len(names), dim=0)))
        else:
            out[names[0]] = _swap_halves(t) if how == "swap" else t
    return {k: v.contiguous() for k, v in out.items()}


# The VAE in the LDM layout.

_ATTENTION = {"group_norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v", "to_out.0": "proj_out"}


def vae_to_ldm_name(name, num_up_blocks):
    """The LDM name of the AutoencoderKL tensor `name` (diffusers' names)."""
    m = re.fullmatch(r"encoder\.down_blocks\.(\d+)\.resnets\.(\d+)\.(\w+)\.(weight|bias)", name)
    if m:
        layer = "nin_shortcut" if m[3] == "conv_shortcut" else m[3]
        return f"encoder.down.{m[1]}.block.{m[2]}.{layer}.{m[4]}"
    m = re.fullmatch(r"encoder\.down_blocks\.(\d+)\.downsamplers\.0\.conv\.(weight|bias)", name)
    if m:
        return f"encoder.down.{m[1]}.downsample.conv.{m[2]}"
    m = re.fullmatch(r"decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.(\w+)\.(weight|bias)", name)
    if m:
        layer = "nin_shortcut" if m[3] == "conv_shortcut" else m[3]
        return f"decoder.up.{num_up_blocks - 1 - int(m[1])}.block.{m[2]}.{layer}.{m[4]}"
    m = re.fullmatch(r"decoder\.up_blocks\.(\d+)\.upsamplers\.0\.conv\.(weight|bias)", name)
    if m:
        return f"decoder.up.{num_up_blocks - 1 - int(m[1])}.upsample.conv.{m[2]}"
    m = re.fullmatch(r"(encoder|decoder)\.mid_block\.resnets\.(\d)\.(\w+)\.(weight|bias)", name)
    if m:
        layer = "nin_shortcut" if m[3] == "conv_shortcut" else m[3]
        return f"{m[1]}.mid.block_{int(m[2]) + 1}.{layer}.{m[4]}"
    m = re.fullmatch(r"(encoder|decoder)\.mid_block\.attentions\.0\.(group_norm|to_[qkv]|to_out\.0)\.(\w+)", name)
    if m:
        return f"{m[1]}.mid.attn_1.{_ATTENTION[m[2]]}.{m[3]}"
    m = re.fullmatch(r"(encoder|decoder)\.conv_norm_out\.(weight|bias)", name)
    if m:
        return f"{m[1]}.norm_out.{m[2]}"
    assert re.fullmatch(r"((encoder|decoder)\.conv_(in|out)|quant_conv|post_quant_conv)\.(weight|bias)", name), \
        f"a VAE tensor with no LDM name: {name}"
    return name


def _is_attention_linear(name):
    return re.fullmatch(r"(encoder|decoder)\.mid_block\.attentions\.0\.(to_q|to_k|to_v|to_out\.0)\.weight", name)


def vae_to_ldm(state, num_up_blocks):
    """An AutoencoderKL state dict in the LDM layout (no prefix): the attention's linear weights as 1x1 convs."""
    out = {}
    for name, t in state.items():
        ldm = vae_to_ldm_name(name, num_up_blocks)
        assert ldm not in out, f"two VAE tensors named {ldm}"
        out[ldm] = t.reshape(*t.shape, 1, 1) if _is_attention_linear(name) else t
    return out


def vae_from_ldm(state, names, num_up_blocks):
    """The inverse of vae_to_ldm for a VAE whose diffusers tensor names are `names`."""
    out = {}
    for name in names:
        t = state[vae_to_ldm_name(name, num_up_blocks)]
        out[name] = t[:, :, 0, 0] if _is_attention_linear(name) else t
    assert len(out) == len(state), "LDM tensors the VAE does not have"
    return {k: v.contiguous() for k, v in out.items()}


def vae_ldm_2blocks():
    """vae_ldm_2blocks.json: each LDM tensor of a two-block VAE and the diffusers name diffusers' own
    converter gives it, checked against vae_to_ldm_name."""
    from diffusers import AutoencoderKL
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint

    torch.manual_seed(50)
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(4, 8), layers_per_block=1,
                        latent_channels=4, norm_num_groups=2, sample_size=32).eval()
    with torch.no_grad():
        for p in vae.parameters():
            p.copy_(torch.randn_like(p))  # norm scales and biases too: every tensor distinct
    state = vae.state_dict()
    config = json.loads(vae.to_json_string())
    num_up = len(config["up_block_types"])
    ldm = vae_to_ldm(state, num_up)
    converted = convert_ldm_vae_checkpoint(dict(ldm), config)
    assert set(converted) == set(state), f"diffusers' VAE names differ: {sorted(set(converted) ^ set(state))}"
    for k, v in converted.items():
        assert v.shape == state[k].shape, f"{k}: diffusers' shape {tuple(v.shape)}, the model's {tuple(state[k].shape)}"
    tensors = {}
    for name, t in sorted(ldm.items()):
        hits = [k for k, v in converted.items() if v.numel() == t.numel() and torch.equal(v.flatten(), t.flatten())]
        assert len(hits) == 1, f"{name}: {len(hits)} diffusers tensors hold its values"
        assert vae_to_ldm_name(hits[0], num_up) == name, f"{name}: diffusers names it {hits[0]}"
        tensors[name] = {"shape": list(t.shape), "diffusers": hits[0]}
    path = os.path.join(FILES, "vae_ldm_2blocks.json")
    with open(path, "w") as f:
        json.dump({"config": config, "tensors": tensors}, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{path}: {len(tensors)} tensors, diffusers' converter agrees, {os.path.getsize(path)} bytes")


# Running and checking.

def _bf16(state):
    return {k: v.to(torch.bfloat16) for k, v in state.items()}


def _rounded(state):
    """Each floating tensor rounded to bf16 and back to its dtype."""
    return {k: v.to(torch.bfloat16).to(v.dtype) if v.is_floating_point() else v for k, v in state.items()}


def _upcast(state, prefix=""):
    return {k[len(prefix):]: v.to(torch.float32) for k, v in state.items() if k.startswith(prefix)}


def _load_weights(model, state):
    """Every tensor of `model`'s state dict replaced by `state`'s, strictly."""
    model.load_state_dict(state, strict=True)
    return model.eval()


def _identity_projection(state):
    state = dict(state)
    w = state["text_projection.weight"]
    state["text_projection.weight"] = torch.eye(w.shape[0], w.shape[1], dtype=w.dtype)
    return state


def _sd3_pipeline(**parts):
    from diffusers import StableDiffusion3Pipeline

    pipe = StableDiffusion3Pipeline.from_pretrained(SD3_FOLDER, torch_dtype=torch.float32, **parts)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _meta(call, path, folder, loader):
    meta = dict(call, folder=os.path.relpath(folder, ROOT), loader=loader)
    if path is not None:
        meta["file"] = os.path.relpath(path, ROOT)
    return meta


def _diff(tensors, case, reference):
    diff = (tensors[case + ".latents"] - tensors[reference + ".latents"]).abs().max().item()
    print(f"{case}: latents max |diff| from {reference}'s {diff:.6g} "
          f"(latents max |x| {tensors[reference + '.latents'].abs().max().item():.4g})")


def sd3_single_file():
    from diffusers import SD3Transformer2DModel, StableDiffusion3Pipeline
    from diffusers.loaders.single_file_utils import (convert_ldm_vae_checkpoint,
                                                     convert_sd3_transformer_checkpoint_to_diffusers,
                                                     create_diffusers_clip_model_from_ldm)
    from transformers import CLIPTextModelWithProjection

    os.makedirs(FILES, exist_ok=True)
    vae_ldm_2blocks()

    folder = _sd3_pipeline()
    config = dict(folder.transformer.config)
    vae_config = dict(folder.vae.config)
    num_up = len(vae_config["up_block_types"])
    states = {name: getattr(folder, name).state_dict() for name in PREFIXES}
    vae_names = list(states["vae"])
    assert set(states["transformer"]) == set(load_file(
        os.path.join(SD3_FOLDER, "transformer", "diffusion_pytorch_model.safetensors"))), "transformer buffers"

    # The two files, every tensor bf16.
    transformer_file = _bf16(to_stability(states["transformer"], config))
    everything = dict(transformer_file)
    for name in ("text_encoder", "text_encoder_2", "text_encoder_3"):
        everything.update({PREFIXES[name] + k: v.to(torch.bfloat16) for k, v in states[name].items()})
    everything.update({PREFIXES["vae"] + k: v.to(torch.bfloat16) for k, v in vae_to_ldm(states["vae"], num_up).items()})
    t5 = PREFIXES["text_encoder_3"]
    assert torch.equal(everything[t5 + "shared.weight"], everything[t5 + "encoder.embed_tokens.weight"])
    assert PREFIXES["text_encoder"] + "text_projection.weight" in everything
    paths = {"stability": os.path.join(FILES, "sd35m_stability.safetensors"),
             "stability_all": os.path.join(FILES, "sd35m_stability_all.safetensors")}
    for case, tensors in (("stability", transformer_file), ("stability_all", everything)):
        save_file({k: v.contiguous() for k, v in tensors.items()}, paths[case], metadata={"format": "pt"})
        print(f"{paths[case]}: {len(tensors)} tensors, {os.path.getsize(paths[case])} bytes")

    # diffusers' converters undo the mappings exactly.
    rounded = {name: _rounded(state) for name, state in states.items()}
    _exactly_equal(convert_sd3_transformer_checkpoint_to_diffusers(load_file(paths["stability"])),
                   _bf16(states["transformer"]), "transformer file via diffusers")
    _exactly_equal(from_stability(load_file(paths["stability"]), config), _bf16(states["transformer"]),
                   "transformer file via from_stability")
    _exactly_equal(convert_ldm_vae_checkpoint(load_file(paths["stability_all"]), vae_config), _bf16(states["vae"]),
                   "VAE in the all-in-one file via diffusers")

    tensors, meta = {}, {}

    # stability: the transformer file alone.
    transformer = SD3Transformer2DModel.from_single_file(paths["stability"], config=SD3_FOLDER, subfolder="transformer",
                                                         torch_dtype=torch.float32)
    _exactly_equal(transformer.state_dict(), from_stability(_upcast(load_file(paths["stability"])), config),
                   "stability: from_single_file vs the file upcast")
    tensors["stability.image"], tensors["stability.latents"] = _run(_sd3_pipeline(transformer=transformer), SD3_CALL)
    meta["stability"] = _meta(SD3_CALL, paths["stability"], SD3_FOLDER, "SD3Transformer2DModel.from_single_file")

    # stability_all: everything from the one file. First the plain call, to show how it loads CLIP-G.
    plain = StableDiffusion3Pipeline.from_single_file(paths["stability_all"], config=SD3_FOLDER,
                                                      torch_dtype=torch.float32)
    clip_l = _identity_projection(_upcast(load_file(paths["stability_all"]), PREFIXES["text_encoder"]))
    if all(torch.equal(plain.text_encoder_2.state_dict()[k], v) for k, v in clip_l.items()):
        print("stability_all: a plain from_single_file loads CLIP-L's weights into text_encoder_2 too "
              "(both CLIPs 32 wide); text_encoder_2 is passed in")
    else:
        raise SystemExit("diffusers no longer loads CLIP-L into text_encoder_2 here: drop the text_encoder_2 "
                         "workaround and revise the docstring")
    del plain
    file_all = load_file(paths["stability_all"])
    clip_g_only = {k: v for k, v in file_all.items() if k.startswith(PREFIXES["text_encoder_2"])}
    text_encoder_2 = create_diffusers_clip_model_from_ldm(CLIPTextModelWithProjection, clip_g_only, config=SD3_FOLDER,
                                                          subfolder="text_encoder_2", torch_dtype=torch.float32)
    pipe = StableDiffusion3Pipeline.from_single_file(paths["stability_all"], config=SD3_FOLDER,
                                                     torch_dtype=torch.float32, text_encoder_2=text_encoder_2)
    pipe.set_progress_bar_config(disable=True)
    expected = {
        "transformer": from_stability(_upcast(file_all), config),
        "text_encoder": clip_l,
        "text_encoder_2": _upcast(file_all, PREFIXES["text_encoder_2"]),
        "text_encoder_3": _upcast(file_all, PREFIXES["text_encoder_3"]),
        "vae": vae_from_ldm(_upcast(file_all, PREFIXES["vae"]), vae_names, num_up),
    }
    for name, state in expected.items():
        _exactly_equal(getattr(pipe, name).state_dict(), state, f"stability_all: {name} vs the file upcast")
        same = all(torch.equal(getattr(pipe, name).state_dict()[k], rounded[name][k]) for k in state)
        print(f"stability_all: {name} ({type(getattr(pipe, name)).__name__}) read from the file "
              f"{PREFIXES[name]}*; equal to the folder's rounded to bf16: {same}")
    print("stability_all: tokenizer, tokenizer_2, tokenizer_3 and scheduler come from the folder")
    tensors["stability_all.image"], tensors["stability_all.latents"] = _run(pipe, SD3_CALL)
    meta["stability_all"] = _meta(SD3_CALL, paths["stability_all"], SD3_FOLDER,
                                  "StableDiffusion3Pipeline.from_single_file, text_encoder_2 from the file's "
                                  "clip_g tensors by create_diffusers_clip_model_from_ldm")

    # folder, and the bf16-rounded folders the single-file cases must equal exactly.
    tensors["folder.image"], tensors["folder.latents"] = _run(folder, SD3_CALL)
    meta["folder"] = _meta(SD3_CALL, None, SD3_FOLDER, "StableDiffusion3Pipeline.from_pretrained")

    again = _sd3_pipeline()
    _load_weights(again.transformer, rounded["transformer"])
    assert torch.equal(_run(again, SD3_CALL)[1], tensors["stability.latents"]), \
        "stability != the folder with its transformer rounded to bf16"
    print("stability: latents exactly those of the folder with its transformer rounded to bf16")
    again = _sd3_pipeline()
    for name, state in rounded.items():
        _load_weights(getattr(again, name), _identity_projection(state) if name == "text_encoder" else state)
    assert torch.equal(_run(again, SD3_CALL)[1], tensors["stability_all.latents"]), \
        "stability_all != the folder with every model rounded to bf16 and CLIP-L's projection the identity"
    print("stability_all: latents exactly those of the folder with every model rounded to bf16 and "
          "CLIP-L's text_projection the identity")
    again = _sd3_pipeline()
    _load_weights(again.text_encoder, _identity_projection(states["text_encoder"]))
    tensors["identity_only.latents"] = _run(again, SD3_CALL)[1]
    _diff(tensors, "stability", "folder")
    _diff(tensors, "stability_all", "folder")
    _diff(tensors, "identity_only", "folder")
    _diff(tensors, "stability_all", "identity_only")
    del tensors["identity_only.latents"]
    _diff(tensors, "stability_all", "stability")
    save("sd3_single_file_pipeline.safetensors", tensors, meta)


def _qwen_pipeline(**parts):
    from diffusers import QwenImagePipeline

    pipe = QwenImagePipeline.from_pretrained(QWEN_FOLDER, torch_dtype=torch.float32, **parts)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def qwen_single_file():
    from diffusers import QwenImageTransformer2DModel

    os.makedirs(FILES, exist_ok=True)
    folder = _qwen_pipeline()
    state = folder.transformer.state_dict()
    on_disk = load_file(os.path.join(QWEN_FOLDER, "transformer", "diffusion_pytorch_model.safetensors"))
    assert set(state) == set(on_disk), "the Qwen-Image transformer's state dict is not its saved file"
    path = os.path.join(FILES, "qwen_image_transformer_bf16.safetensors")
    save_file({k: v.contiguous() for k, v in _bf16(state).items()}, path, metadata={"format": "pt"})
    print(f"{path}: {len(state)} tensors, {os.path.getsize(path)} bytes")

    transformer = QwenImageTransformer2DModel.from_single_file(path, config=QWEN_FOLDER, subfolder="transformer",
                                                               torch_dtype=torch.float32)
    _exactly_equal(transformer.state_dict(), _upcast(load_file(path)), "qwen_bf16: from_single_file vs the file upcast")
    tensors, meta = {}, {}
    tensors["qwen_bf16.image"], tensors["qwen_bf16.latents"] = _run(_qwen_pipeline(transformer=transformer), QWEN_CALL)
    meta["qwen_bf16"] = _meta(QWEN_CALL, path, QWEN_FOLDER, "QwenImageTransformer2DModel.from_single_file")
    tensors["qwen_folder.image"], tensors["qwen_folder.latents"] = _run(folder, QWEN_CALL)
    meta["qwen_folder"] = _meta(QWEN_CALL, None, QWEN_FOLDER, "QwenImagePipeline.from_pretrained")

    again = _qwen_pipeline()
    _load_weights(again.transformer, _rounded(state))
    assert torch.equal(_run(again, QWEN_CALL)[1], tensors["qwen_bf16.latents"]), \
        "qwen_bf16 != the folder with its transformer rounded to bf16"
    print("qwen_bf16: latents exactly those of the folder with its transformer rounded to bf16")
    _diff(tensors, "qwen_bf16", "qwen_folder")
    save("qwen_single_file_pipeline.safetensors", tensors, meta)
