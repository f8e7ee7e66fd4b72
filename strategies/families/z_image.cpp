// Z-Image (ZImagePipeline: Z-Image and Z-Image-Turbo): what the launcher side knows of the family
// (Note [a family in one place], strategies/family.h). Its math is runtime/models/z_image/.
#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "protocol/errors.h"
#include "strategies/config_sizes.h"
#include "strategies/family.h"
#include "strategies/original_layouts.h"
#include "strategies/text.h"

namespace dp::strategies {
// The family's own helpers, named apart from the other families' (the sources build in unity batches).
namespace z_image_facts {

ParallelSpec spec() {
    ParallelSpec s;
    s.family = "z-image";
    s.display_name = "Z-Image";
    s.pipeline_class = "ZImagePipeline";
    s.components = {"text_encoder", "transformer", "vae"};
    s.tp_components = {"text_encoder"};
    s.offload = true;
    // The 30 main blocks; the refiners (2 + 2) go with the embeddings, on block 0's device.
    s.block_prefixes = {"layers."};
    s.heads_key = "n_heads";
    s.head_dim_key = "head_dim";  // absent: dim / n_heads
    s.width_key = "dim";
    s.layers_key = "n_layers";
    // Every block (refiners too): q, k, v and the MLP's w1, w3 column-parallel by heads and
    // features, the output and w2 row-parallel; the modulations split and gathered.
    add_tp_rules(
        s, TpSplit::kColumn,
        {".attention.to_q", ".attention.to_k", ".attention.to_v", ".feed_forward.w1", ".feed_forward.w3"});
    add_tp_rules(s, TpSplit::kRow, {".attention.to_out.0", ".feed_forward.w2"});
    add_tp_rules(s, TpSplit::kColumnGathered, {".adaLN_modulation.0"});
    add_qwen2_decoder_rules(s);  // Qwen3's names are Qwen2's
    // The caption (up to 512 tokens, padded to 32) runs through every main block beside the image:
    // split like it (Note [Z-Image text stream], z_image_transformer.h).
    s.streams = {{"image", true}, {"text", true}};
    // Note [int8 compute]: every block's attention projections and SwiGLU MLP, the refiners' too.
    s.int8_layers = mmdit_int8_layers();
    s.int8_layers.insert(s.int8_layers.end(), {".feed_forward.w1", ".feed_forward.w2", ".feed_forward.w3"});
    s.unloaded_tensors = {{"vae", "encoder."}, {"vae", "quant_conv."}, {"text_encoder", "lm_head."}};
    // ZImageTransformer2DModel's defaults; the pipeline's default is 1024 pixels (128 latents).
    // heads, head_dim, layers, of them later blocks, patch_size, in_channels, sample_size
    s.transformer_defaults = {30, 128, 30, 0, 2, 16, 128};
    // Rotary positions from a table of axes_lens (512 a side for rows and columns by default).
    s.max_patches_key.clear();
    s.max_patches = 512;
    return s;
}

// ZImageTransformer2DModel's parameters from its config (Note [sizes from configs]): the patch and
// caption embedders (with the caption's RMS norm), the timestep MLP, both pad tokens, every block
// (q, k, v, output without biases, the qk-norms, the SwiGLU MLP of dim / 3 x 8 features, four RMS
// norms, and the modulation but in the context refiner), and the head.
double transformer_parameters(const nlohmann::json& c) {
    const double d = config_number(c, "dim", 3840), heads = config_number(c, "n_heads", 30);
    const double t = std::min(d, 256.0), patch = 4 * config_number(c, "in_channels", 16);
    const double cap = config_number(c, "cap_feat_dim", 2560),
                 ff = static_cast<double>(static_cast<int64_t>(d / 3 * 8));
    const double top = linear_parameters(patch, d) + linear_parameters(256, 1024) +
                       linear_parameters(1024, t) + cap + linear_parameters(cap, d) + 2 * d +
                       linear_parameters(t, d) + linear_parameters(d, patch);
    const double block =
        4 * linear_parameters(d, d, false) + 2 * (d / heads) + 3 * linear_parameters(d, ff, false) + 4 * d;
    const double layers = config_number(c, "n_layers", 30),
                 refiners = config_number(c, "n_refiner_layers", 2);
    return top + (layers + 2 * refiners) * block + (layers + refiners) * linear_parameters(t, 4 * d);
}

// ZImageTransformer2DModel's forward (Note [FLOPs of a pass]): the image and caption each padded
// to a multiple of 32 tokens; the embedders, the timestep MLP, the noise refiner's blocks over the
// image and the context refiner's over the caption (without modulation), the main blocks over
// both (q, k, v, output, the SwiGLU MLP, the modulation), and the head.
PassFlops pass_flops(const nlohmann::json& c, const PassTokens& t) {
    const int64_t d = config_count(c, "dim", 3840), patch = 4 * config_count(c, "in_channels", 16);
    const int64_t e = std::min<int64_t>(d, 256), ff = static_cast<int64_t>(static_cast<double>(d) / 3 * 8);
    const int64_t layers = config_count(c, "n_layers", 30), refiners = config_count(c, "n_refiner_layers", 2);
    const auto padded = [](int64_t tokens) { return (tokens + 31) / 32 * 32; };
    const int64_t i = padded(t.image), x = padded(t.text), n = i + x;
    PassFlops f;
    f.linear(i, patch, d);
    f.linear(1, 256, 1024);
    f.linear(1, 1024, e);
    f.linear(x, config_count(c, "cap_feat_dim", 2560), d);
    const auto blocks = [&](int64_t tokens, int64_t count, bool modulated) {
        if (modulated) f.linear(1, e, 4 * d, count);
        f.linear(tokens, d, d, 4 * count);
        f.attend(tokens, tokens, d, count);
        f.linear(tokens, d, ff, 2 * count);
        f.linear(tokens, ff, d, count);
    };
    blocks(i, refiners, true);
    blocks(x, refiners, false);
    blocks(n, layers, true);
    f.linear(1, e, d);
    f.linear(n, d, patch);
    return f;
}

// Note [Z-Image original names]: the layout of Tongyi's own checkpoints and ComfyUI's split files
// (z_image_turbo_bf16.safetensors), as diffusers' convert_z_image_transformer_checkpoint_to_diffusers
// maps it: q, k and v fused in attention.qkv (three equal parts), attention.out, q_norm / k_norm,
// x_embedder and final_layer without diffusers' "2-1" patch key; every other name is diffusers'
// own. norm_final.weight (a LayerNorm without affine there) is dropped, as diffusers drops it.
const std::vector<ModuleRename> kZImageTop = {
    {"x_embedder.", {"all_x_embedder.2-1."}},
    {"final_layer.linear.", {"all_final_layer.2-1.linear."}},
    {"final_layer.adaLN_modulation.1.", {"all_final_layer.2-1.adaLN_modulation.1."}},
    {"t_embedder.mlp.0.", {"t_embedder.mlp.0."}},
    {"t_embedder.mlp.2.", {"t_embedder.mlp.2."}},
    {"cap_embedder.0.", {"cap_embedder.0."}},
    {"cap_embedder.1.", {"cap_embedder.1."}},
    {"x_pad_token", {"x_pad_token"}},
    {"cap_pad_token", {"cap_pad_token"}},
};
const std::vector<ModuleRename> kZImageBlock = {
    {"attention.qkv.", {"attention.to_q.", "attention.to_k.", "attention.to_v."}},
    {"attention.out.", {"attention.to_out.0."}},
    {"attention.q_norm.weight", {"attention.norm_q.weight"}},
    {"attention.k_norm.weight", {"attention.norm_k.weight"}},
    {"feed_forward.w1.", {"feed_forward.w1."}},
    {"feed_forward.w2.", {"feed_forward.w2."}},
    {"feed_forward.w3.", {"feed_forward.w3."}},
    {"attention_norm1.weight", {"attention_norm1.weight"}},
    {"attention_norm2.weight", {"attention_norm2.weight"}},
    {"ffn_norm1.weight", {"ffn_norm1.weight"}},
    {"ffn_norm2.weight", {"ffn_norm2.weight"}},
    {"adaLN_modulation.0.", {"adaLN_modulation.0."}},
};

bool is_original(const CheckpointTensors& file, const std::string& prefix) {
    return file.count(prefix + "layers.0.attention.qkv.weight") > 0;
}

void map_original(const CheckpointTensors& file, SingleFileLayout& out) {
    out.layout = "Z-Image's original (Tongyi's, ComfyUI's)";
    LayoutMapper m{file, out, {}};
    for (const ModuleRename& f : kZImageTop) m.place(f, 0);
    for (const char* blocks : {"layers.", "noise_refiner.", "context_refiner."})
        place_blocks(m, 0, blocks, blocks, kZImageBlock);
    if (m.find("norm_final.weight")) m.used.insert(out.prefix + "norm_final.weight");
    mark_unplaced(m);
}

// An adapter's module in the original names (kohya's files, dotted again): a fused qkv changes
// to_q, to_k and to_v by its up's thirds; attention.out is to_out.0; x_embedder and final_layer
// lack diffusers' "2-1". Any other name is diffusers' own (empty here).
std::vector<LoraPart> lora_original_parts(const std::string& name,
                                          const std::map<std::string, std::vector<int64_t>>& w) {
    static const std::regex block(R"(((?:layers|noise_refiner|context_refiner)\.\d+\.attention)\.(qkv|out))");
    std::smatch m;
    if (std::regex_match(name, m, block)) {
        const std::string a = m[1].str() + ".";
        if (m[2] == "out") return {{a + "to_out.0", {}}};
        return stacked_parts({a + "to_q", a + "to_k", a + "to_v"}, w);
    }
    static const std::map<std::string, std::string> whole = {
        {"x_embedder", "all_x_embedder.2-1"},
        {"final_layer.linear", "all_final_layer.2-1.linear"},
        {"final_layer.adaLN_modulation.1", "all_final_layer.2-1.adaLN_modulation.1"}};
    if (const auto it = whole.find(name); it != whole.end()) return {{it->second, {}}};
    return {};
}

// kohya's underscored original names of the modules above, dotted again:
// "lora_unet_layers_0_attention_qkv" -> "layers.0.attention.qkv"; empty for the others, which the
// model's own underscored names find.
std::string lora_kohya_original(const std::string& kohya) {
    static const std::regex block(R"((layers|noise_refiner|context_refiner)_(\d+)_attention_(qkv|out))");
    std::smatch m;
    if (std::regex_match(kohya, m, block)) return m[1].str() + "." + m[2].str() + ".attention." + m[3].str();
    static const std::map<std::string, std::string> whole = {
        {"x_embedder", "x_embedder"},
        {"final_layer_linear", "final_layer.linear"},
        {"final_layer_adaLN_modulation_1", "final_layer.adaLN_modulation.1"}};
    const auto it = whole.find(kohya);
    return it == whole.end() ? std::string() : it->second;
}

// Z-Image-Turbo's config-only folder for a checkpoint of its names, in either layout.
std::string shipped_config(const std::vector<std::string>& names) {
    const bool ours = std::any_of(names.begin(), names.end(), [](const std::string& n) {
        return ends_with(n, "layers.0.attention.qkv.weight") ||
               ends_with(n, "noise_refiner.0.attention.to_q.weight");
    });
    return ours ? "z-image-turbo" : std::string();
}

}  // namespace z_image_facts

const FamilyFacts& z_image_family() {
    using namespace z_image_facts;
    static const FamilyFacts facts = [] {
        FamilyFacts f;
        f.spec = spec();
        // ZImagePipeline's defaults (Z-Image-Turbo is run at 8 or 9 steps and guidance 0; its
        // generation_defaults.json can say so).
        protocol::ArgumentUse guidance{"guidance_scale", 5.0};
        guidance.guidance = protocol::Guidance::kAbove0;
        f.arguments = {{"num_inference_steps", 50},
                       guidance,
                       {"cfg_normalization", 0.0},
                       {"cfg_truncation", 1.0},
                       {"max_sequence_length", 512, 512},
                       {"lora"},
                       {"cache"}};
        f.components = {
            {"scheduler", {"FlowMatchEulerDiscreteScheduler"}, true, ComponentRule::kScheduler, false},
            {"text_encoder", {"Qwen3Model"}, true, ComponentRule::kModel, false},
            {"tokenizer",
             {"Qwen2Tokenizer", "Qwen2TokenizerFast"},
             true,
             ComponentRule::kBpeTokenizer,
             false},
            {"transformer", {"ZImageTransformer2DModel"}, true, ComponentRule::kModel, false},
            {"vae", {"AutoencoderKL"}, true, ComponentRule::kModel, false},
        };
        f.widths = {{"text_encoder", "hidden_size", 2560, "cap_feat_dim", 2560, nullptr,
                     "use the text encoder made for this model"}};
        f.name_markers = {"noise_refiner", "context_refiner", "cap_embedder"};
        f.is_original_transformer = &is_original;
        f.map_original_transformer = &map_original;
        f.shipped_config = &shipped_config;
        f.lora_original_parts = &lora_original_parts;
        f.lora_kohya_original = &lora_kohya_original;
        f.kohya_format = "kohya (Z-Image)";
        f.transformer_parameters = &transformer_parameters;
        f.pass_flops = &pass_flops;
        return f;
    }();
    return facts;
}

}  // namespace dp::strategies
