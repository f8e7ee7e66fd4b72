#pragma once
// A model family's parallel spec: how its pipeline splits, as pure data (no LibTorch). The loader
// shards tensors from it, `dp-launch plan` counts parameters and bytes from it, and strategy
// resolution checks degrees against it. A family's spec is the one place that names its tensors
// (as diffusers' _tp_plan / _cp_plan do).

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace dp::strategies {

// How tensor parallelism splits one linear layer over the tp ranks.
enum class TpSplit {
    kWhole,        // every rank keeps the whole layer
    kColumn,       // output features split: weight rows and bias split
    kRow,          // input features split: weight columns split, the bias added once after the sum
    kRowSegments,  // input features are several concatenated segments, each split as kRow
    // Output features are several concatenated segments, each split as kColumn (a fused q, k, v:
    // each rank keeps its heads of each).
    kColumnSegments,
    // Output features split as kColumn, then gathered so that every rank has the whole output: a
    // large weight with a small output (SD3's AdaLN modulations, 6 x width from the timestep).
    kColumnGathered,
};

struct TpRule {
    std::string layer_suffix;  // matched against the end of a layer's name, e.g. ".attn.to_q"
    TpSplit split = TpSplit::kWhole;
    std::vector<int64_t> segments;  // k*Segments: relative segment widths, e.g. {1, 4}
};

// An attention stream: split over the context-parallel ranks like the image tokens, or
// replicated on every rank (a short text, counted once).
struct StreamSpec {
    std::string name;  // "image", "text"
    bool split = false;
};

// The transformer's shape facts, from its config.json (read_transformer_shape, model_config.h).
struct TransformerShape {
    int64_t heads = 0;        // attention heads
    int64_t head_dim = 0;     // features per head
    int64_t layers = 0;       // transformer blocks, of every block prefix
    int64_t more_layers = 0;  // of them, those of the later prefixes (FLUX's single-stream blocks)
    int64_t patch_size = 0;
    int64_t in_channels = 0;  // latent channels
    int64_t sample_size = 0;  // the default latent height and width
    int64_t width() const { return heads * head_dim; }
};

struct ParallelSpec {
    std::string family;  // "sd3": the id the call-argument table's rows name (protocol/call_arguments.h)
    std::string display_name;    // how messages name the family: "SD3", "Qwen-Image"
    std::string pipeline_class;  // model_index.json's _class_name, e.g. "StableDiffusion3Pipeline"
    // The diffusers class a line with an "image" runs on the same weights (Note [img2img in the one
    // loop]), e.g. "StableDiffusion3Img2ImgPipeline"; empty: the family edits no images.
    std::string img2img_class;
    std::string inpaint_class;  // ... and a line with an "image" and a "mask_image"
    // The components device_map places, in pipeline order (model_index.json keys).
    std::vector<std::string> components;
    std::string transformer = "transformer";  // the component the strategies split
    // Prefixes of the transformer's repeated blocks, e.g. "transformer_blocks."; a block is the
    // prefix plus its index.
    std::vector<std::string> block_prefixes;
    std::vector<TpRule> tp_rules;
    // Note [int8 compute] (runtime/parallel/int8_linear.h): the transformer's linear layers, by
    // name suffix, that --quantize int8 runs as W8A8 products: the blocks' attention projections
    // and MLPs, never the embedders, the modulations or the output head (the layers xDiT's and
    // SGLang's int8 paths leave in the run's dtype too). Empty: the family takes no --quantize.
    std::vector<std::string> int8_layers;
    std::vector<StreamSpec> streams;
    // Keys of transformer/config.json holding the attention heads and the head size.
    std::string heads_key = "num_attention_heads";
    std::string head_dim_key = "attention_head_dim";
    // Where the config gives no head size: the key of the model's width, divided by the heads
    // (Z-Image's dim / n_heads); empty: the default head size.
    std::string width_key;
    std::string layers_key = "num_layers";
    // The blocks of the later block_prefixes, by their config keys and diffusers' defaults (FLUX's
    // num_single_layers, 38): TransformerShape::layers counts every block of every prefix.
    std::vector<std::pair<std::string, int64_t>> more_layers_keys;
    bool guidance_branches = true;  // classifier-free guidance has a negative branch to split
    // Components a model folder may leave out (a pixel-space model has no VAE).
    std::vector<std::string> optional_components;
    // The T5 encoder component, which --no-t5 leaves out (SD3: text_encoder_3); empty: none.
    std::string t5_encoder;
    // Whether the family's T5 encoder is part of every run (FLUX's text_encoder_2: its embeddings
    // are the transformer's whole text), so that --no-t5 cannot leave it out.
    bool t5_required = false;
    // Components besides the transformer that tensor parallelism splits by the same rules (SD3's
    // T5, Qwen-Image's Qwen2.5-VL text encoder).
    std::vector<std::string> tp_components;
    // Whether the family's pipeline runs with --offload (each component on the device only while
    // it runs).
    bool offload = false;
    // Tensors the pipeline never loads, as (component, name prefix): the VAE's encoder.
    std::vector<std::pair<std::string, std::string>> unloaded_tensors;
    std::string patch_size_key = "patch_size";
    std::string in_channels_key = "in_channels";
    std::string sample_size_key = "sample_size";
    // The values the family's transformer class assumes for keys its config.json leaves out
    // (diffusers' defaults); 0: the key is required.
    TransformerShape transformer_defaults;
    // A variant of the family, told by a boolean key of the transformer's config.json that is
    // false (or absent) in it, with call arguments of its own (protocol/call_arguments.h: the rows
    // name it by variant_family): FLUX.1-schnell, whose transformer has no guidance_embeds. Empty
    // key: none (read_model_info, model_config.h).
    std::string variant_key;
    // The file of the model folder that holds variant_key; empty: the transformer's config.json
    // (FLUX.2-klein's is_distilled is model_index.json's).
    std::string variant_config;
    std::string variant_name;    // how messages name it: "FLUX.1-schnell"
    std::string variant_family;  // its id in the call-argument table: "flux-schnell"
    // The latents per patch side the pipeline packs whatever the transformer's patch_size says
    // (FLUX packs 2x2 before a transformer of patch_size 1); 0: the transformer's patch_size.
    int64_t packed_patch = 0;
    // How the VAE's config gives its pixels per latent: "block_out_channels" (AutoencoderKL:
    // 2^(blocks - 1)) or "temperal_downsample" (AutoencoderKLQwenImage: 2^len).
    std::string vae_scale_key = "block_out_channels";
    // The patches along a side the transformer's positions allow: its config key (SD3's
    // pos_embed_max_size) and the value when absent; an empty key: always the value.
    std::string max_patches_key = "pos_embed_max_size";
    int64_t max_patches = 96;
};

// The tensor-parallel rules of the text encoders several families share, added to a family's
// spec: T5's encoder (SD3's text_encoder_3, FLUX's text_encoder_2), split like any transformer (q,
// k, v and the gated feed-forward's input projections column-parallel, by heads and features; the
// attention output and the feed-forward output row-parallel; its relative position bias and norms
// whole), and Qwen2.5-VL's language model as Qwen-Image's text encoder (q, k, v by key-value head
// groups, so that each rank keeps whole GQA groups, and SwiGLU's gate and up projections
// column-parallel; the attention output and down projection row-parallel; embeddings and norms
// whole).
void add_t5_encoder_rules(ParallelSpec& spec);
// A rule of `split` for each of `layer_suffixes` (kRowSegments takes its segments by hand).
void add_tp_rules(ParallelSpec& spec, TpSplit split, std::initializer_list<const char*> layer_suffixes);
void add_qwen2_decoder_rules(ParallelSpec& spec);
// Note [int8 compute]: the layers of diffusers' joint-attention blocks int8 products may run: q, k,
// v and outputs of both streams (attn2's too) and the FeedForward MLPs (".net.0.proj", ".net.2").
std::vector<std::string> mmdit_int8_layers();
// Qwen2.5-VL's vision tower (Qwen-Image-Edit's text encoder): its fused q, k, v by heads of each,
// the attention's output row-parallel, the MLP as the decoder's.
void add_qwen2_vision_rules(ParallelSpec& spec);
// A spec of those rules alone: the encoders' own, whichever family loads them.
const ParallelSpec& t5_encoder_spec();
const ParallelSpec& qwen2_decoder_spec();
const ParallelSpec& qwen2_vision_spec();
// Every family's spec, in the registry's order (strategies/families/registry.cpp; a family's
// facts, strategies/family.h).
const std::vector<const ParallelSpec*>& parallel_specs();
// The spec whose pipeline_class is `pipeline_class`, or nullptr.
const ParallelSpec* find_parallel_spec(const std::string& pipeline_class);

// Whether the attention stream `name` ("image", "text") is split over the context-parallel ranks
// like the image tokens; false when the spec replicates it or has no such stream.
bool stream_split(const ParallelSpec& spec, const std::string& name);

// The rule for a layer (its name without ".weight"/".bias"); kWhole when no rule matches.
const TpRule& tp_rule_for_layer(const ParallelSpec& spec, const std::string& layer);
// Whether tensor parallelism splits this tensor (a ".weight" or ".bias"): column-parallel
// weights and biases, row-parallel weights (their biases stay whole).
bool tp_splits_tensor(const ParallelSpec& spec, const std::string& tensor_name);

}  // namespace dp::strategies
