// SD3 and SD3.5 (StableDiffusion3Pipeline): what the launcher side knows of the family (Note [a
// family in one place], strategies/family.h). Its math is runtime/models/sd3/.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "strategies/config_file.h"
#include "strategies/config_sizes.h"
#include "strategies/family.h"
#include "strategies/model_files.h"
#include "strategies/original_layouts.h"
#include "strategies/text.h"

namespace dp::strategies {
// The family's own helpers, named apart from the other families' (the sources build in unity batches).
namespace sd3_facts {

ParallelSpec spec() {
    ParallelSpec s;
    s.family = "sd3";
    s.display_name = "SD3";
    s.pipeline_class = "StableDiffusion3Pipeline";
    s.img2img_class = "StableDiffusion3Img2ImgPipeline";
    s.inpaint_class = "StableDiffusion3InpaintPipeline";
    s.components = {"text_encoder", "text_encoder_2", "text_encoder_3", "transformer", "vae"};
    s.t5_encoder = "text_encoder_3";
    s.tp_components = {"text_encoder_3"};
    s.offload = true;
    s.block_prefixes = {"transformer_blocks."};
    // Joint attention: q, k, v column-parallel for both streams, the outputs row-parallel; SD3.5's
    // image-only second attention (attn2) split the same way, by the same heads; the MLPs column-
    // then row-parallel. AdaLN, norms and embeddings stay whole.
    add_tp_rules(
        s, TpSplit::kColumn,
        {".attn.to_q", ".attn.to_k", ".attn.to_v", ".attn.add_q_proj", ".attn.add_k_proj", ".attn.add_v_proj",
         ".attn2.to_q", ".attn2.to_k", ".attn2.to_v", ".ff.net.0.proj", ".ff_context.net.0.proj"});
    add_tp_rules(s, TpSplit::kRow,
                 {".attn.to_out.0", ".attn.to_add_out", ".attn2.to_out.0", ".ff.net.2", ".ff_context.net.2"});
    // AdaLN's modulations (6 x width per block and stream, 9 x with attn2): a third of the
    // transformer's weights, for outputs of one row per prompt; split and gathered.
    add_tp_rules(s, TpSplit::kColumnGathered, {".norm1.linear", ".norm1_context.linear"});
    add_t5_encoder_rules(s);
    s.streams = {{"image", true}, {"text", false}};
    s.int8_layers = mmdit_int8_layers();  // Note [int8 compute]: attn's, attn2's and the MLPs
    s.optional_components = {"text_encoder_3", "vae"};
    s.unloaded_tensors = {{"vae", "encoder."}, {"vae", "quant_conv."}};
    // SD3Transformer2DModel's defaults.
    // heads, head_dim, layers, of them later blocks (from more_layers_keys), patch_size, in_channels,
    // sample_size
    s.transformer_defaults = {18, 64, 18, 0, 2, 16, 128};
    return s;
}

// SD3's original names, as Stability AI publish sd3_medium, sd3.5_medium and sd3.5_large, and where
// each goes in diffusers' SD3Transformer2DModel. The fused q, k, v rows are three equal parts.
const std::vector<ModuleRename> kSd3Top = {
    {"pos_embed", {"pos_embed.pos_embed"}},
    {"x_embedder.proj.", {"pos_embed.proj."}},
    {"context_embedder.", {"context_embedder."}},
    {"t_embedder.mlp.0.", {"time_text_embed.timestep_embedder.linear_1."}},
    {"t_embedder.mlp.2.", {"time_text_embed.timestep_embedder.linear_2."}},
    {"y_embedder.mlp.0.", {"time_text_embed.text_embedder.linear_1."}},
    {"y_embedder.mlp.2.", {"time_text_embed.text_embedder.linear_2."}},
    {"final_layer.linear.", {"proj_out."}},
};
const std::vector<ModuleRename> kSd3Joint = {
    {"x_block.attn.qkv.", {"attn.to_q.", "attn.to_k.", "attn.to_v."}},
    {"context_block.attn.qkv.", {"attn.add_q_proj.", "attn.add_k_proj.", "attn.add_v_proj."}},
    {"x_block.attn.ln_q.weight", {"attn.norm_q.weight"}},
    {"x_block.attn.ln_k.weight", {"attn.norm_k.weight"}},
    {"context_block.attn.ln_q.weight", {"attn.norm_added_q.weight"}},
    {"context_block.attn.ln_k.weight", {"attn.norm_added_k.weight"}},
    {"x_block.attn.proj.", {"attn.to_out.0."}},
    {"context_block.attn.proj.", {"attn.to_add_out."}},
    {"x_block.attn2.qkv.", {"attn2.to_q.", "attn2.to_k.", "attn2.to_v."}},
    {"x_block.attn2.ln_q.weight", {"attn2.norm_q.weight"}},
    {"x_block.attn2.ln_k.weight", {"attn2.norm_k.weight"}},
    {"x_block.attn2.proj.", {"attn2.to_out.0."}},
    {"x_block.adaLN_modulation.1.", {"norm1.linear."}},
    {"x_block.mlp.fc1.", {"ff.net.0.proj."}},
    {"x_block.mlp.fc2.", {"ff.net.2."}},
    {"context_block.mlp.fc1.", {"ff_context.net.0.proj."}},
    {"context_block.mlp.fc2.", {"ff_context.net.2."}},
};

bool is_original(const CheckpointTensors& file, const std::string&) {
    return std::any_of(file.begin(), file.end(),
                       [](const auto& t) { return t.first.find("joint_blocks.") != std::string::npos; });
}

void map_original(const CheckpointTensors& file, SingleFileLayout& out) {
    out.layout = "Stability AI's original (SD3)";
    LayoutMapper m{file, out, {}};
    for (const ModuleRename& f : kSd3Top) m.place(f, 0);
    m.place("final_layer.adaLN_modulation.1.", {"norm_out.linear."}, 0, /*swap_halves=*/true);
    // The last block's context modulation (its context stream ends there) is shift then scale.
    static const ModuleRename kContextModulation = {"context_block.adaLN_modulation.1.",
                                                    {"norm1_context.linear."}};
    place_blocks(m, 0, "joint_blocks.", "transformer_blocks.", kSd3Joint, &kContextModulation);
    mark_unplaced(m);
}

// SD3 in Stability AI's names: 3.5 medium has the second attention (MMDiT-X), 3.5 large the q/k
// norms alone, 3 medium neither.
std::string shipped_config(const std::vector<std::string>& names) {
    const auto has = [&](const std::string& suffix) {
        return std::any_of(names.begin(), names.end(),
                           [&](const std::string& n) { return ends_with(n, suffix); });
    };
    if (!has("joint_blocks.0.x_block.attn.qkv.weight")) return {};
    return has("x_block.attn2.qkv.weight")   ? "sd3.5-medium"
           : has("x_block.attn.ln_q.weight") ? "sd3.5-large"
                                             : "sd3-medium";
}

// SD3Transformer2DModel's parameters from its config (Note [sizes from configs]): the position
// table, the patch, timestep, pooled-text and context embedders, each joint block (AdaLN of both
// streams, 6 x width each, 9 x with attn2, 2 x for the text in the last block, which has no text
// output or MLP; q, k, v and outputs of both streams, the qk-norms, attn2's, the MLPs), the output
// norm and head.
double transformer_parameters(const nlohmann::json& c) {
    const double heads = config_number(c, "num_attention_heads", 18),
                 hd = config_number(c, "attention_head_dim", 64);
    const double d = heads * hd, layers = config_number(c, "num_layers", 18),
                 p = config_number(c, "patch_size", 2);
    const double in = config_number(c, "in_channels", 16), max = config_number(c, "pos_embed_max_size", 96);
    const auto norm = c.find("qk_norm");
    const double qk = norm == c.end() || !norm->is_string()    ? 0
                      : norm->get<std::string>() == "rms_norm" ? hd
                                                               : 2 * hd;
    std::vector<double> dual;
    if (const auto it = c.find("dual_attention_layers"); it != c.end() && it->is_array())
        for (const auto& i : *it)
            if (i.is_number()) dual.push_back(i.get<double>());
    double n =
        max * max * d + linear_parameters(in * p * p, d) + linear_parameters(256, d) +
        linear_parameters(d, d) + linear_parameters(config_number(c, "pooled_projection_dim", 2048), d) +
        linear_parameters(d, d) + linear_parameters(config_number(c, "joint_attention_dim", 4096), d) +
        linear_parameters(d, 2 * d) + linear_parameters(d, p * p * config_number(c, "out_channels", 16));
    if (layers > 1e6) throw std::invalid_argument("num_layers is not a size");
    const double mlp = linear_parameters(d, 4 * d) + linear_parameters(4 * d, d);
    for (double i = 0; i < layers; ++i) {
        const bool last = i == layers - 1, two = std::find(dual.begin(), dual.end(), i) != dual.end();
        n += linear_parameters(d, (two ? 9 : 6) * d) + linear_parameters(d, (last ? 2 : 6) * d) +
             (last ? 7 : 8) * linear_parameters(d, d) + 4 * qk + (last ? 1 : 2) * mlp +
             (two ? 4 * linear_parameters(d, d) + 2 * qk : 0);
    }
    return n;
}

// SD3Transformer2DModel's forward (Note [FLOPs of a pass]): the patch convolution (a product per
// patch), the time and pooled-text MLPs, the context embedder, each joint block (the AdaLNs, q, k,
// v of both streams, one attention over both, the outputs and MLPs but the last block's text ones,
// attn2's over the image alone in SD3.5's dual blocks) and the head.
PassFlops pass_flops(const nlohmann::json& c, const PassTokens& t) {
    const int64_t d = config_count(c, "num_attention_heads", 18) * config_count(c, "attention_head_dim", 64);
    const int64_t layers = config_count(c, "num_layers", 18), p = config_count(c, "patch_size", 2);
    const int64_t i = t.image, x = t.text, n = i + x;
    std::vector<int64_t> dual;
    if (const auto it = c.find("dual_attention_layers"); it != c.end() && it->is_array())
        for (const auto& layer : *it)
            if (layer.is_number_integer()) dual.push_back(layer.get<int64_t>());
    PassFlops f;
    f.linear(i, config_count(c, "in_channels", 16) * p * p, d);
    f.linear(1, 256, d);
    f.linear(1, d, d);
    f.linear(1, config_count(c, "pooled_projection_dim", 2048), d);
    f.linear(1, d, d);
    f.linear(x, config_count(c, "joint_attention_dim", 4096), d);
    for (int64_t b = 0; b < layers; ++b) {
        const bool last = b == layers - 1, two = std::find(dual.begin(), dual.end(), b) != dual.end();
        f.linear(1, d, (two ? 9 : 6) * d);
        f.linear(1, d, (last ? 2 : 6) * d);
        f.linear(i, d, d, 4);
        f.linear(x, d, d, last ? 3 : 4);
        f.attend(n, n, d);
        if (two) {
            f.linear(i, d, d, 4);
            f.attend(i, i, d);
        }
        f.linear(i, d, 4 * d);
        f.linear(i, 4 * d, d);
        if (!last) {
            f.linear(x, d, 4 * d);
            f.linear(x, 4 * d, d);
        }
    }
    f.linear(1, d, 2 * d);
    f.linear(i, d, p * p * config_count(c, "out_channels", 16));
    return f;
}

// CLIP's tokens (its tokenizer_config.json's model_max_length, else 77), then T5's
// max_sequence_length, or without T5 one that stands for its zero positions (the worker's Note
// [constant text tail]).
int64_t plan_text_tokens(const ModelInfo& model, int64_t max_sequence,
                         const std::vector<std::string>& left_out) {
    const nlohmann::json tok = read_config_object_if_present(model.dir + "/tokenizer/tokenizer_config.json");
    const int64_t clip_length =
        tok.contains("model_max_length") && tok["model_max_length"].is_number_integer()
            ? tok["model_max_length"].get<int64_t>()
            : 77;
    const bool t5 = std::find(left_out.begin(), left_out.end(), model.spec->t5_encoder) == left_out.end();
    return clip_length + (t5 ? max_sequence : 1);
}

}  // namespace sd3_facts

const FamilyFacts& sd3_family() {
    using namespace sd3_facts;
    static const FamilyFacts facts = [] {
        FamilyFacts f;
        f.spec = spec();
        // StableDiffusion3Pipeline's defaults.
        protocol::ArgumentUse guidance{"guidance_scale", 7.0};
        guidance.guidance = protocol::Guidance::kAbove1;
        f.arguments = {{"num_inference_steps", 28},
                       guidance,
                       {"max_sequence_length", 256, 512},
                       {"lora"},
                       {"cache"},
                       {"skip_guidance_layers"},
                       {"skip_layer_guidance_scale", 2.8},
                       {"skip_layer_guidance_start", 0.01},
                       {"skip_layer_guidance_stop", 0.2},
                       {"image"},
                       {"mask_image"},
                       {"strength", 0.6},  // StableDiffusion3Img2ImgPipeline's
                       {"padding_mask_crop"}};
        f.components = {
            {"scheduler", {"FlowMatchEulerDiscreteScheduler"}, true, ComponentRule::kScheduler, false},
            {"text_encoder",
             {"CLIPTextModelWithProjection", "CLIPTextModel"},
             true,
             ComponentRule::kModel,
             false},
            {"text_encoder_2",
             {"CLIPTextModelWithProjection", "CLIPTextModel"},
             true,
             ComponentRule::kModel,
             false},
            {"tokenizer", {"CLIPTokenizer"}, true, ComponentRule::kBpeTokenizer, false},
            {"tokenizer_2", {"CLIPTokenizer"}, true, ComponentRule::kBpeTokenizer, false},
            {"transformer", {"SD3Transformer2DModel"}, true, ComponentRule::kModel, false},
            {"vae", {"AutoencoderKL"}, false, ComponentRule::kModel, false},
            {"text_encoder_3", {"T5EncoderModel"}, false, ComponentRule::kModel, true},
            {"tokenizer_3", {"T5TokenizerFast", "T5Tokenizer"}, false, ComponentRule::kT5Tokenizer, true},
        };
        WidthRule t5{"text_encoder_3",
                     "d_model",
                     512,
                     "joint_attention_dim",
                     4096,
                     "T5's embeddings join the text as they are",
                     "use the T5 encoder made for this model, or --no-t5"};
        t5.t5 = true;
        f.widths = {t5};
        f.bundled_encoders = {
            {"text_encoder", "clip_l"}, {"text_encoder_2", "clip_g"}, {"text_encoder_3", "t5xxl"}};
        f.identity_projection = "text_encoder";
        f.is_original_transformer = &is_original;
        f.map_original_transformer = &map_original;
        f.name_markers = {"joint_blocks", "context_block", "x_block"};
        f.guess_order = 3;
        f.shipped_config = &shipped_config;
        f.plan_text_tokens = &plan_text_tokens;
        f.transformer_parameters = &transformer_parameters;
        f.pass_flops = &pass_flops;
        // Note [presets]: Hyper-SD's 8-step SD3 adapter, which keeps CFG.
        f.presets = {R"J({"name": "hyper-sd3-8step", "family": "sd3",
            "adapter": "ByteDance/Hyper-SD Hyper-SD3-8steps-CFG-lora (at lora scale 0.125)",
            "description": "SD3 in 8 steps with Hyper-SD's CFG LoRA (guidance 5.0)",
            "num_inference_steps": 8, "guidance_scale": 5.0})J"};
        return f;
    }();
    return facts;
}

}  // namespace dp::strategies
