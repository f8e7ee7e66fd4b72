// FLUX.2 [klein] (Flux2KleinPipeline: the step-distilled releases, and the -base ones with
// classifier-free guidance) and FLUX.2 [dev] (Flux2Pipeline: Mistral 3's text encoder, an embedded
// guidance scale): what the launcher side knows of the family (Note [a family in one place],
// strategies/family.h). Its math is runtime/models/flux2/; docs/flux2-reference.md has it in
// formulas.
#include <cmath>
#include <nlohmann/json.hpp>
#include <utility>

#include "strategies/config_sizes.h"
#include "strategies/family.h"

namespace dp::strategies {
// The family's own helpers, named apart from the other families' (the sources build in unity batches).
namespace flux2_facts {

ParallelSpec spec() {
    ParallelSpec s;
    s.family = "flux2-klein";
    s.display_name = "FLUX.2-klein";
    s.pipeline_class = "Flux2KleinPipeline";
    s.components = {"text_encoder", "transformer", "vae"};
    s.tp_components = {"text_encoder"};
    s.offload = true;
    // The double-stream blocks, then the single-stream ones; device_map counts them in that order.
    s.block_prefixes = {"transformer_blocks.", "single_transformer_blocks."};
    s.more_layers_keys = {{"num_single_layers", 48}};
    // Double-stream blocks: q, k, v of both streams column-parallel by heads, their outputs
    // row-parallel; the SwiGLU MLPs' fused input as two segments (gate, value), each split alike,
    // and their outputs row-parallel. Single-stream blocks: the fused projection as its five
    // segments (q, k, v of width D, the MLP's two halves of 3 D), the output over [attention, MLP]
    // row-parallel over its two segments. The three shared modulations split and gathered.
    add_tp_rules(s, TpSplit::kColumn,
                 {".attn.to_q", ".attn.to_k", ".attn.to_v", ".attn.add_q_proj", ".attn.add_k_proj",
                  ".attn.add_v_proj"});
    add_tp_rules(s, TpSplit::kRow,
                 {".attn.to_out.0", ".attn.to_add_out", ".ff.linear_out", ".ff_context.linear_out"});
    s.tp_rules.push_back({".ff.linear_in", TpSplit::kColumnSegments, {1, 1}});
    s.tp_rules.push_back({".ff_context.linear_in", TpSplit::kColumnSegments, {1, 1}});
    s.tp_rules.push_back({".attn.to_qkv_mlp_proj", TpSplit::kColumnSegments, {1, 1, 1, 3, 3}});
    s.tp_rules.push_back({".attn.to_out", TpSplit::kRowSegments, {1, 3}});
    add_tp_rules(s, TpSplit::kColumnGathered,
                 {"double_stream_modulation_img.linear", "double_stream_modulation_txt.linear",
                  "single_stream_modulation.linear"});
    add_qwen2_decoder_rules(s);  // Qwen3's names are Qwen2's
    // The text (512 tokens, padding included) runs through every single block beside the image:
    // split like it (Note [FLUX text stream], flux_transformer.h).
    s.streams = {{"image", true}, {"text", true}};
    // Note [int8 compute]: the double blocks' projections and SwiGLU MLPs, the single blocks' fused
    // projection and output; not the embedders, the shared modulations or the head.
    s.int8_layers = mmdit_int8_layers();
    s.int8_layers.insert(s.int8_layers.end(),
                         {".linear_in", ".linear_out", ".to_qkv_mlp_proj", ".attn.to_out"});
    s.unloaded_tensors = {{"text_encoder", "lm_head."}};
    // Flux2Transformer2DModel's defaults; the pipeline's default_sample_size is 128 latents.
    // heads, head_dim, layers, of them later blocks (from more_layers_keys), patch_size, in_channels,
    // sample_size
    s.transformer_defaults = {48, 128, 8, 0, 1, 128, 128};
    s.packed_patch = 2;
    // Rotary positions from ids: no table bounds the size; 512 patches (8192 pixels) a side.
    s.max_patches_key.clear();
    s.max_patches = 512;
    // The -base releases: model_index.json without is_distilled, and guidance of their own.
    s.variant_config = "model_index.json";
    s.variant_key = "is_distilled";
    s.variant_name = "FLUX.2-klein-base";
    s.variant_family = "flux2-klein-base";
    return s;
}

// Flux2Transformer2DModel's parameters from its config (Note [sizes from configs]): no layer has a
// bias. The embedders, the time (and guidance) MLPs, the three shared modulations, each double
// block (q, k, v and outputs of both streams, four qk-norms, two SwiGLU MLPs of 3 x width), each
// single block (the fused projection, its output, two qk-norms) and the head.
double transformer_parameters(const nlohmann::json& c) {
    const double hd = config_number(c, "attention_head_dim", 128);
    const double d = config_number(c, "num_attention_heads", 48) * hd;
    const double h = static_cast<double>(static_cast<int64_t>(d * config_number(c, "mlp_ratio", 3.0)));
    const double ch = config_number(c, "in_channels", 128),
                 f = config_number(c, "timestep_guidance_channels", 256);
    const bool guidance = !c.contains("guidance_embeds") || c["guidance_embeds"].is_null() ||
                          (c["guidance_embeds"].is_boolean() && c["guidance_embeds"].get<bool>());
    const double time = linear_parameters(f, d, false) + linear_parameters(d, d, false);
    const double top = linear_parameters(ch, d, false) +
                       linear_parameters(config_number(c, "joint_attention_dim", 15360), d, false) +
                       (guidance ? 2 : 1) * time + linear_parameters(d, 15 * d, false) +
                       linear_parameters(d, 2 * d, false) + linear_parameters(d, ch, false);
    const double double_block = 8 * linear_parameters(d, d, false) + 4 * hd +
                                2 * (linear_parameters(d, 2 * h, false) + linear_parameters(h, d, false));
    const double single_block =
        linear_parameters(d, 3 * d + 2 * h, false) + linear_parameters(d + h, d, false) + 2 * hd;
    return top + config_number(c, "num_layers", 8) * double_block +
           config_number(c, "num_single_layers", 48) * single_block;
}

// Flux2Transformer2DModel's forward (Note [FLOPs of a pass]): the embedders, the time (and
// guidance) MLPs, the three modulations shared by the blocks, each double block (q, k, v and
// outputs of both streams, one attention over both, their SwiGLU MLPs), each single block (the
// fused projection, one attention, the fused output) and the head.
PassFlops pass_flops(const nlohmann::json& c, const PassTokens& t) {
    const int64_t d = config_count(c, "num_attention_heads", 48) * config_count(c, "attention_head_dim", 128);
    const int64_t h = static_cast<int64_t>(static_cast<double>(d) * config_number(c, "mlp_ratio", 3.0));
    const int64_t ch = config_count(c, "in_channels", 128), n = t.image + t.text;
    const int64_t blocks = config_count(c, "num_layers", 8),
                  singles = config_count(c, "num_single_layers", 48);
    const bool guidance = !c.contains("guidance_embeds") || c["guidance_embeds"].is_null() ||
                          (c["guidance_embeds"].is_boolean() && c["guidance_embeds"].get<bool>());
    PassFlops f;
    f.linear(t.image, ch, d);
    f.linear(t.text, config_count(c, "joint_attention_dim", 15360), d);
    f.linear(1, config_count(c, "timestep_guidance_channels", 256), d, guidance ? 2 : 1);
    f.linear(1, d, d, guidance ? 2 : 1);
    f.linear(1, d, 6 * d, 2);
    f.linear(1, d, 3 * d);
    for (const int64_t tokens : {t.image, t.text}) {
        f.linear(tokens, d, d, 4 * blocks);
        f.linear(tokens, d, 2 * h, blocks);
        f.linear(tokens, h, d, blocks);
    }
    f.attend(n, n, d, blocks);
    f.linear(n, d, 3 * d + 2 * h, singles);
    f.attend(n, n, d, singles);
    f.linear(n, d + h, d, singles);
    f.linear(1, d, 2 * d);
    f.linear(t.image, d, ch);
    return f;
}

// Note [FLUX.2 references] (flux2_pipeline.h): a picture larger than 1024 x 1024 pixels is
// resized to that area at its ratio (each side int(side x scale)), then cut to multiples of
// `multiple`; with a multiple of 1, the resized size alone.
std::pair<int64_t, int64_t> reference_size(int64_t width, int64_t height, int64_t multiple) {
    constexpr double kArea = 1024.0 * 1024.0;
    const double w = static_cast<double>(width), h = static_cast<double>(height);
    if (w * h > kArea) {
        const double scale = std::sqrt(kArea / (w * h));
        width = static_cast<int64_t>(w * scale);
        height = static_cast<int64_t>(h * scale);
    }
    return {width / multiple * multiple, height / multiple * multiple};
}

// The text encoder's hidden states the transformer takes, three side by side per token.
WidthRule text_width(const char* nested) {
    WidthRule w{"text_encoder",
                "hidden_size",
                nested ? 5120 : 4096,
                "joint_attention_dim",
                15360,
                "three of its hidden states side by side are the transformer's text",
                "use the text encoder made for this model"};
    w.nested = nested;
    w.times = 3;
    return w;
}

}  // namespace flux2_facts

const FamilyFacts& flux2_klein_family() {
    using namespace flux2_facts;
    static const FamilyFacts facts = [] {
        FamilyFacts f;
        f.spec = spec();
        // Flux2KleinPipeline's defaults. The distilled releases ignore guidance_scale, as diffusers
        // does (with a warning); the -base ones guide above 1, the negative prompt "" unless given.
        protocol::ArgumentUse ignored_guidance{"guidance_scale", 4.0};
        ignored_guidance.ignored = true;
        protocol::ArgumentUse guidance{"guidance_scale", 4.0};
        guidance.guidance = protocol::Guidance::kAbove1;
        protocol::ArgumentUse image{"image"};
        image.max = protocol::kMaxInputPictures;  // reference pictures, each appended as tokens
        f.arguments = {{"num_inference_steps", 50},
                       ignored_guidance,
                       {"max_sequence_length", 512, 512},
                       {"lora"},
                       {"cache"},
                       image};
        f.variant_arguments = f.arguments;
        f.variant_arguments[1] = guidance;  // the same arguments, guidance_scale guiding
        f.components = {
            {"scheduler", {"FlowMatchEulerDiscreteScheduler"}, true, ComponentRule::kScheduler, false},
            {"text_encoder", {"Qwen3ForCausalLM", "Qwen3Model"}, true, ComponentRule::kModel, false},
            {"tokenizer",
             {"Qwen2Tokenizer", "Qwen2TokenizerFast"},
             true,
             ComponentRule::kBpeTokenizer,
             false},
            {"transformer", {"Flux2Transformer2DModel"}, true, ComponentRule::kModel, false},
            {"vae", {"AutoencoderKLFlux2"}, true, ComponentRule::kModel, false},
        };
        f.widths = {text_width(nullptr)};
        f.name_markers = {"single_stream_modulation", "double_stream_modulation_img"};
        // An edit's default size is its first picture's, resized and cut as the references are.
        f.size_from_input = true;
        f.size_from_first_picture = true;
        f.input_size = &reference_size;
        f.reference_size = &reference_size;
        f.transformer_parameters = &transformer_parameters;
        f.pass_flops = &pass_flops;
        return f;
    }();
    return facts;
}

const FamilyFacts& flux2_dev_family() {
    using namespace flux2_facts;
    static const FamilyFacts facts = [] {
        // Flux2Pipeline (FLUX.2 [dev]): klein's transformer with a guidance embedder, its VAE, its
        // references, and Mistral 3's language model as the text encoder (hidden states 10, 20, 30
        // of each prompt in its system template). Its guidance scale is embedded, as FLUX.1-dev's:
        // no negative branch.
        FamilyFacts f = flux2_klein_family();
        f.spec.family = "flux2-dev";
        f.spec.display_name = "FLUX.2-dev";
        f.spec.pipeline_class = "Flux2Pipeline";
        f.spec.guidance_branches = false;
        f.spec.variant_config.clear();  // no variant of it
        f.spec.variant_key.clear();
        f.spec.variant_name.clear();
        f.spec.variant_family.clear();
        // Mistral 3's names are Qwen2's under language_model.model. (add_qwen2_decoder_rules);
        // the Pixtral tower, its projector and lm_head never load: the pipeline passes no image.
        f.spec.unloaded_tensors = {{"text_encoder", "vision_tower."},
                                   {"text_encoder", "multi_modal_projector."},
                                   {"text_encoder", "language_model.lm_head."},
                                   {"text_encoder", "model.vision_tower."},
                                   {"text_encoder", "model.multi_modal_projector."},
                                   {"text_encoder", "lm_head."}};
        protocol::ArgumentUse image{"image"};
        image.max = protocol::kMaxInputPictures;
        // Flux2Pipeline's __call__ defaults.
        f.arguments = {{"num_inference_steps", 50},
                       {"guidance_scale", 4.0},
                       {"max_sequence_length", 512, 512},
                       {"lora"},
                       {"cache"},
                       image};
        f.variant_arguments.clear();
        f.components[1] = {
            "text_encoder", {"Mistral3ForConditionalGeneration"}, true, ComponentRule::kModel, false};
        f.components[2] = {"tokenizer", {"PixtralProcessor"}, true, ComponentRule::kBpeTokenizer, false};
        f.widths = {text_width("text_config")};
        // Checkpoints and adapters of its transformer carry klein's names.
        f.name_markers.clear();
        f.names_as = flux2_klein_family().spec.display_name;
        return f;
    }();
    return facts;
}

}  // namespace dp::strategies
