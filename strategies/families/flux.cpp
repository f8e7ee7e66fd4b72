// FLUX.1 dev and schnell (FluxPipeline), and the FLUX.1 pipelines of their own weights, Fill
// (FluxFillPipeline) and Kontext (FluxKontextPipeline): what the launcher side knows of them (Note
// [a family in one place], strategies/family.h). Their math is runtime/models/flux/.
#include <algorithm>
#include <cmath>
#include <map>
#include <regex>
#include <tuple>

#include "protocol/errors.h"
#include "strategies/config_sizes.h"
#include "strategies/family.h"
#include "strategies/original_layouts.h"
#include "strategies/text.h"

namespace dp::strategies {
// The family's own helpers, named apart from the other families' (the sources build in unity batches).
namespace flux_facts {

ParallelSpec spec() {
    ParallelSpec s;
    s.family = "flux";
    s.display_name = "FLUX.1";
    s.pipeline_class = "FluxPipeline";
    s.img2img_class = "FluxImg2ImgPipeline";
    s.inpaint_class = "FluxInpaintPipeline";
    s.components = {"text_encoder", "text_encoder_2", "transformer", "vae"};
    s.tp_components = {"text_encoder_2"};
    s.t5_required = true;
    s.offload = true;
    // 19 double-stream blocks, then 38 single-stream ones; device_map counts them in that order.
    s.block_prefixes = {"transformer_blocks.", "single_transformer_blocks."};
    s.more_layers_keys = {{"num_single_layers", 38}};
    // Double-stream blocks as SD3's joint ones; single-stream blocks: q, k, v and the MLP's input
    // column-parallel, and the one output projection over [attention, MLP] row-parallel over its
    // two segments (width and 4 x width), each split as its producer is.
    add_tp_rules(s, TpSplit::kColumn,
                 {".attn.to_q", ".attn.to_k", ".attn.to_v", ".attn.add_q_proj", ".attn.add_k_proj",
                  ".attn.add_v_proj", ".ff.net.0.proj", ".ff_context.net.0.proj", ".proj_mlp"});
    add_tp_rules(s, TpSplit::kRow, {".attn.to_out.0", ".attn.to_add_out", ".ff.net.2", ".ff_context.net.2"});
    s.tp_rules.push_back({".proj_out", TpSplit::kRowSegments, {1, 4}});
    // The modulations (6 x width per double block and stream, 3 x per single block): split and
    // gathered, as SD3's and Qwen-Image's.
    add_tp_rules(s, TpSplit::kColumnGathered, {".norm1.linear", ".norm1_context.linear", ".norm.linear"});
    add_t5_encoder_rules(s);
    // The text (T5's 512 or 256 tokens, no mask) runs through every single block's MLP beside the
    // image: split like it, as Qwen-Image's (Note [FLUX text stream], flux_transformer.h).
    s.streams = {{"image", true}, {"text", true}};
    // Note [int8 compute]: both blocks' attention projections and MLPs (the single blocks' fused
    // output among them), not the embedders, modulations or head.
    s.int8_layers = mmdit_int8_layers();
    s.int8_layers.insert(s.int8_layers.end(), {".proj_mlp", ".proj_out"});
    s.unloaded_tensors = {{"vae", "encoder."}, {"vae", "quant_conv."}};
    // FluxTransformer2DModel's defaults; FluxPipeline's default_sample_size is 128 latents.
    // heads, head_dim, layers, of them later blocks (from more_layers_keys), patch_size, in_channels,
    // sample_size
    s.transformer_defaults = {24, 128, 19, 0, 1, 64, 128};
    s.packed_patch = 2;
    // Rotary positions from ids: no table bounds the size; 512 patches (8192 pixels) a side.
    s.max_patches_key.clear();
    s.max_patches = 512;
    // FLUX.1-schnell: no guidance embedding, and call arguments of its own.
    s.variant_key = "guidance_embeds";
    s.variant_name = "FLUX.1-schnell";
    s.variant_family = "flux-schnell";
    return s;
}

// Note [single files]: FLUX.1's original names, as Black Forest Labs publish them, and where each
// goes in diffusers' FluxTransformer2DModel. `to` ends in '.' for a module (".weight" and ".bias"
// follow) or names a tensor whole; a fused module lists its parts, which share its rows in order
// (each `width` of the model's hidden width, the last one taking the rest).
const std::vector<ModuleRename> kFluxTop = {
    {"img_in.", {"x_embedder."}},
    {"txt_in.", {"context_embedder."}},
    {"time_in.in_layer.", {"time_text_embed.timestep_embedder.linear_1."}},
    {"time_in.out_layer.", {"time_text_embed.timestep_embedder.linear_2."}},
    {"vector_in.in_layer.", {"time_text_embed.text_embedder.linear_1."}},
    {"vector_in.out_layer.", {"time_text_embed.text_embedder.linear_2."}},
    {"guidance_in.in_layer.", {"time_text_embed.guidance_embedder.linear_1."}},
    {"guidance_in.out_layer.", {"time_text_embed.guidance_embedder.linear_2."}},
    {"final_layer.linear.", {"proj_out."}},
};
const std::vector<ModuleRename> kFluxDouble = {
    {"img_mod.lin.", {"norm1.linear."}},
    {"txt_mod.lin.", {"norm1_context.linear."}},
    {"img_attn.qkv.", {"attn.to_q.", "attn.to_k.", "attn.to_v."}},
    {"txt_attn.qkv.", {"attn.add_q_proj.", "attn.add_k_proj.", "attn.add_v_proj."}},
    {"img_attn.norm.query_norm.scale", {"attn.norm_q.weight"}},
    {"img_attn.norm.key_norm.scale", {"attn.norm_k.weight"}},
    {"txt_attn.norm.query_norm.scale", {"attn.norm_added_q.weight"}},
    {"txt_attn.norm.key_norm.scale", {"attn.norm_added_k.weight"}},
    {"img_attn.proj.", {"attn.to_out.0."}},
    {"txt_attn.proj.", {"attn.to_add_out."}},
    {"img_mlp.0.", {"ff.net.0.proj."}},
    {"img_mlp.2.", {"ff.net.2."}},
    {"txt_mlp.0.", {"ff_context.net.0.proj."}},
    {"txt_mlp.2.", {"ff_context.net.2."}},
};
const std::vector<ModuleRename> kFluxSingle = {
    {"modulation.lin.", {"norm.linear."}},
    {"linear1.", {"attn.to_q.", "attn.to_k.", "attn.to_v.", "proj_mlp."}},
    {"linear2.", {"proj_out."}},
    {"norm.query_norm.scale", {"attn.norm_q.weight"}},
    {"norm.key_norm.scale", {"attn.norm_k.weight"}},
};

bool is_original(const CheckpointTensors& file, const std::string& prefix) {
    return file.count(prefix + "double_blocks.0.img_attn.qkv.weight") > 0;
}

void map_original(const CheckpointTensors& file, SingleFileLayout& out) {
    out.layout = "Black Forest Labs' original (FLUX.1)";
    LayoutMapper m{file, out, {}};
    const CheckpointTensor* img_in = m.find("img_in.weight");
    if (!img_in || img_in->shape.size() != 2)
        throw protocol::ModelError(out.path +
                                   ": a FLUX.1 file in Black Forest Labs' layout must have a 2-D '" +
                                   out.prefix + "img_in.weight' (the model's width comes from it)");
    const int64_t width = img_in->shape[0];
    for (const ModuleRename& f : kFluxTop) m.place(f, width);
    m.place("final_layer.adaLN_modulation.1.", {"norm_out.linear."}, width, /*swap_halves=*/true);
    place_blocks(m, width, "double_blocks.", "transformer_blocks.", kFluxDouble);
    place_blocks(m, width, "single_blocks.", "single_transformer_blocks.", kFluxSingle);
    mark_unplaced(m);
}

// dev has the guidance embedder, in either naming; schnell has none.
std::string shipped_config(const std::vector<std::string>& names) {
    const auto has = [&](const std::string& suffix) {
        return std::any_of(names.begin(), names.end(),
                           [&](const std::string& n) { return ends_with(n, suffix); });
    };
    if (has("double_blocks.0.img_attn.qkv.weight"))
        return has("guidance_in.in_layer.weight") ? "flux.1-dev" : "flux.1-schnell";
    if (has("transformer_blocks.0.attn.to_q.weight"))
        return has("guidance_embedder.linear_1.weight") ? "flux.1-dev" : "flux.1-schnell";
    return {};
}

// Note [FLUX original names]: Black Forest Labs' FluxTransformer layout, as diffusers' FLUX
// converters map it (double_blocks.N -> transformer_blocks.N, single_blocks.N ->
// single_transformer_blocks.N). A fused projection's up rows split in its parts' widths, read from
// the model's own weights (so small test models map too): qkv in three equal parts, linear1 in q,
// k, v and the MLP's input. The final modulation holds (shift, scale) where diffusers' norm_out
// holds (scale, shift): its up halves swap.
std::vector<LoraPart> lora_original_parts(const std::string& name,
                                          const std::map<std::string, std::vector<int64_t>>& w) {
    const auto rows_of = [&](const std::string& module) -> int64_t {
        const auto it = w.find(module + ".weight");
        return it == w.end() || it->second.size() != 2 ? -1 : it->second[0];
    };
    const auto split = [&](const std::vector<std::string>& modules) { return stacked_parts(modules, w); };
    static const std::regex double_block(
        R"(double_blocks\.(\d+)\.(img|txt)_(attn\.qkv|attn\.proj|mlp\.0|mlp\.2|mod\.lin))");
    static const std::regex single_block(R"(single_blocks\.(\d+)\.(linear1|linear2|modulation\.lin))");
    std::smatch m;
    if (std::regex_match(name, m, double_block)) {
        const std::string b = "transformer_blocks." + m[1].str() + ".";
        const bool img = m[2] == "img";
        const std::string what = m[3];
        if (what == "attn.qkv")
            return img ? split({b + "attn.to_q", b + "attn.to_k", b + "attn.to_v"})
                       : split({b + "attn.add_q_proj", b + "attn.add_k_proj", b + "attn.add_v_proj"});
        if (what == "attn.proj") return {{b + (img ? "attn.to_out.0" : "attn.to_add_out"), {}}};
        if (what == "mlp.0") return {{b + (img ? "ff.net.0.proj" : "ff_context.net.0.proj"), {}}};
        if (what == "mlp.2") return {{b + (img ? "ff.net.2" : "ff_context.net.2"), {}}};
        return {{b + (img ? "norm1.linear" : "norm1_context.linear"), {}}};
    }
    if (std::regex_match(name, m, single_block)) {
        const std::string b = "single_transformer_blocks." + m[1].str() + ".";
        if (m[2] == "linear1")
            return split({b + "attn.to_q", b + "attn.to_k", b + "attn.to_v", b + "proj_mlp"});
        if (m[2] == "linear2") return {{b + "proj_out", {}}};
        return {{b + "norm.linear", {}}};
    }
    static const std::map<std::string, std::string> whole = {
        {"img_in", "x_embedder"},
        {"txt_in", "context_embedder"},
        {"time_in.in_layer", "time_text_embed.timestep_embedder.linear_1"},
        {"time_in.out_layer", "time_text_embed.timestep_embedder.linear_2"},
        {"vector_in.in_layer", "time_text_embed.text_embedder.linear_1"},
        {"vector_in.out_layer", "time_text_embed.text_embedder.linear_2"},
        {"guidance_in.in_layer", "time_text_embed.guidance_embedder.linear_1"},
        {"guidance_in.out_layer", "time_text_embed.guidance_embedder.linear_2"},
        {"final_layer.linear", "proj_out"},
    };
    if (const auto it = whole.find(name); it != whole.end()) return {{it->second, {}}};
    if (name == "final_layer.adaLN_modulation.1") {
        const int64_t n = rows_of("norm_out.linear");
        if (n < 2 || n % 2) return {};
        return {{"norm_out.linear", {{n / 2, n / 2}, {0, n / 2}}}};
    }
    return {};
}

// kohya's underscored FLUX original names back to dotted ones: "double_blocks_0_img_attn_qkv".
std::string lora_kohya_original(const std::string& kohya) {
    static const std::regex double_block(
        R"(double_blocks_(\d+)_(img|txt)_(attn_qkv|attn_proj|mlp_0|mlp_2|mod_lin))");
    static const std::regex single_block(R"(single_blocks_(\d+)_(linear1|linear2|modulation_lin))");
    std::smatch m;
    const auto dotted = [](std::string s) {
        std::replace(s.begin(), s.end(), '_', '.');
        return s;
    };
    if (std::regex_match(kohya, m, double_block))
        return "double_blocks." + m[1].str() + "." + m[2].str() + "_" + dotted(m[3].str());
    if (std::regex_match(kohya, m, single_block))
        return "single_blocks." + m[1].str() + "." +
               (m[2] == "modulation_lin" ? "modulation.lin" : m[2].str());
    static const std::map<std::string, std::string> whole = {
        {"img_in", "img_in"},
        {"txt_in", "txt_in"},
        {"time_in_in_layer", "time_in.in_layer"},
        {"time_in_out_layer", "time_in.out_layer"},
        {"vector_in_in_layer", "vector_in.in_layer"},
        {"vector_in_out_layer", "vector_in.out_layer"},
        {"guidance_in_in_layer", "guidance_in.in_layer"},
        {"guidance_in_out_layer", "guidance_in.out_layer"},
        {"final_layer_linear", "final_layer.linear"},
        {"final_layer_adaLN_modulation_1", "final_layer.adaLN_modulation.1"},
    };
    const auto it = whole.find(kohya);
    return it == whole.end() ? std::string() : it->second;
}

// FluxTransformer2DModel's parameters from its config (Note [sizes from configs]): the image,
// text, timestep (and guidance, for dev) and pooled-text embedders, each double-stream block (both
// streams' modulations, q, k, v, outputs, qk-norms and MLPs), each single-stream block (its
// modulation, q, k, v, MLP input, qk-norms and the output over both), the output norm and head.
double transformer_parameters(const nlohmann::json& c) {
    const double hd = config_number(c, "attention_head_dim", 128),
                 d = config_number(c, "num_attention_heads", 24) * hd;
    const double in = config_number(c, "in_channels", 64), p = config_number(c, "patch_size", 1);
    const bool guidance = c.value("guidance_embeds", false);
    const double top =
        linear_parameters(in, d) + linear_parameters(config_number(c, "joint_attention_dim", 4096), d) +
        (guidance ? 2 : 1) * (linear_parameters(256, d) + linear_parameters(d, d)) +
        linear_parameters(config_number(c, "pooled_projection_dim", 768), d) + linear_parameters(d, d) +
        linear_parameters(d, 2 * d) + linear_parameters(d, p * p * config_number(c, "out_channels", in));
    const double double_block = 2 * linear_parameters(d, 6 * d) + 6 * linear_parameters(d, d) +
                                2 * linear_parameters(d, 4 * d) + 2 * linear_parameters(d, d) +
                                2 * linear_parameters(4 * d, d) + 4 * hd;
    const double single_block = linear_parameters(d, 3 * d) + 3 * linear_parameters(d, d) +
                                linear_parameters(d, 4 * d) + linear_parameters(5 * d, d) + 2 * hd;
    return top + config_number(c, "num_layers", 19) * double_block +
           config_number(c, "num_single_layers", 38) * single_block;
}

// FluxTransformer2DModel's forward (Note [FLOPs of a pass]): the embedders, the time, guidance
// and pooled-text MLPs, each double block (both streams' modulations, q, k, v, outputs and MLPs,
// one attention over text and image), each single block (its modulation, the MLP input and q, k,
// v over both streams, the fused output) and the head.
PassFlops pass_flops(const nlohmann::json& c, const PassTokens& t) {
    const int64_t d = config_count(c, "num_attention_heads", 24) * config_count(c, "attention_head_dim", 128);
    const int64_t in = config_count(c, "in_channels", 64), p = config_count(c, "patch_size", 1);
    const int64_t i = t.image, x = t.text, n = i + x;
    const int64_t blocks = config_count(c, "num_layers", 19),
                  singles = config_count(c, "num_single_layers", 38);
    PassFlops f;
    f.linear(i, in, d);
    f.linear(x, config_count(c, "joint_attention_dim", 4096), d);
    const int64_t mlps = c.value("guidance_embeds", false) ? 2 : 1;
    f.linear(1, 256, d, mlps);
    f.linear(1, d, d, mlps);
    f.linear(1, config_count(c, "pooled_projection_dim", 768), d);
    f.linear(1, d, d);
    f.linear(1, d, 6 * d, 2 * blocks);
    for (const int64_t tokens : {i, x}) {
        f.linear(tokens, d, d, 4 * blocks);
        f.linear(tokens, d, 4 * d, blocks);
        f.linear(tokens, 4 * d, d, blocks);
    }
    f.attend(n, n, d, blocks);
    f.linear(1, d, 3 * d, singles);
    f.linear(n, d, 4 * d, singles);
    f.linear(n, d, d, 3 * singles);
    f.attend(n, n, d, singles);
    f.linear(n, 5 * d, d, singles);
    f.linear(1, d, 2 * d);
    f.linear(i, d, p * p * config_count(c, "out_channels", static_cast<double>(in)));
    return f;
}

}  // namespace flux_facts

const FamilyFacts& flux_family() {
    using namespace flux_facts;
    static const FamilyFacts facts = [] {
        FamilyFacts f;
        f.spec = spec();
        // FluxPipeline's defaults; schnell's steps and tokens are those it was distilled for, and
        // it ignores guidance_scale (its transformer has no guidance embedding), as diffusers does.
        protocol::ArgumentUse true_cfg{"true_cfg_scale", 1.0};
        true_cfg.guidance = protocol::Guidance::kAbove1WithNegative;
        f.arguments = {{"num_inference_steps", 28},
                       {"guidance_scale", 3.5},
                       true_cfg,
                       {"max_sequence_length", 512, 512},
                       {"lora"},
                       {"cache"},
                       {"image"},
                       {"mask_image"},
                       {"strength", 0.6},  // FluxImg2ImgPipeline's
                       {"padding_mask_crop"}};
        protocol::ArgumentUse ignored_guidance{"guidance_scale", 3.5};
        ignored_guidance.ignored = true;
        f.variant_arguments = {{"num_inference_steps", 4},
                               ignored_guidance,
                               true_cfg,
                               {"max_sequence_length", 256, 512},
                               {"lora"},
                               {"cache"},
                               {"image"},
                               {"mask_image"},
                               {"strength", 0.6},
                               {"padding_mask_crop"}};
        f.components = {
            {"scheduler", {"FlowMatchEulerDiscreteScheduler"}, true, ComponentRule::kScheduler, false},
            {"text_encoder", {"CLIPTextModel"}, true, ComponentRule::kModel, false},
            {"text_encoder_2", {"T5EncoderModel"}, true, ComponentRule::kModel, false},
            {"tokenizer", {"CLIPTokenizer"}, true, ComponentRule::kBpeTokenizer, false},
            {"tokenizer_2", {"T5TokenizerFast", "T5Tokenizer"}, true, ComponentRule::kT5Tokenizer, false},
            {"transformer", {"FluxTransformer2DModel"}, true, ComponentRule::kModel, false},
            {"vae", {"AutoencoderKL"}, true, ComponentRule::kModel, false},
        };
        f.widths = {
            {"text_encoder_2", "d_model", 4096, "joint_attention_dim", 4096,
             "T5's embeddings are the transformer's text", "use the text encoder made for this model"},
            {"text_encoder", "hidden_size", 768, "pooled_projection_dim", 768,
             "CLIP's pooled output conditions every block", "use the text encoder made for this model"}};
        f.bundled_encoders = {{"text_encoder", "clip_l"}, {"text_encoder_2", "t5xxl"}};
        f.is_original_transformer = &is_original;
        f.map_original_transformer = &map_original;
        f.name_markers = {"single_transformer_blocks", "double_blocks", "single_blocks"};
        f.guess_order = 1;
        f.shipped_config = &shipped_config;
        f.transformer_parameters = &transformer_parameters;
        f.pass_flops = &pass_flops;
        f.lora_original_parts = &lora_original_parts;
        f.lora_kohya_original = &lora_kohya_original;
        f.kohya_format = "kohya (FLUX.1)";
        // Note [presets]: the published 8-step FLUX.1-dev adapters.
        f.presets = {R"J({"name": "flux-turbo-alpha", "family": "flux",
            "adapter": "alimama-creative/FLUX.1-Turbo-Alpha",
            "description": "FLUX.1-dev distilled to 8 steps (guidance 3.5)",
            "num_inference_steps": 8, "guidance_scale": 3.5})J",
                     R"J({"name": "hyper-flux-8step", "family": "flux",
            "adapter": "ByteDance/Hyper-SD Hyper-FLUX.1-dev-8steps-lora (at lora scale 0.125)",
            "description": "FLUX.1-dev in 8 steps with Hyper-SD's LoRA (guidance 3.5)",
            "num_inference_steps": 8, "guidance_scale": 3.5})J"};
        return f;
    }();
    return facts;
}

namespace flux_facts {

// The facts FLUX.1-Fill and FLUX.1-Kontext share with FLUX.1-dev (the same transformer class, text
// encoders and VAE, the same layouts), as the pipeline class `pipeline_class` of family `family`.
FamilyFacts dev_pipeline(const char* family, const char* display_name, const char* pipeline_class) {
    FamilyFacts f = flux_family();
    f.spec.family = family;
    f.spec.display_name = display_name;
    f.spec.pipeline_class = pipeline_class;
    f.spec.variant_key.clear();  // no schnell of them
    f.spec.variant_name.clear();
    f.spec.variant_family.clear();
    f.spec.unloaded_tensors.clear();  // every line encodes an image
    f.variant_arguments.clear();
    f.name_markers.clear();  // an adapter or a file of FLUX.1's names is named FLUX.1's, and fits
    f.names_as = flux_family().spec.display_name;
    f.shipped_config = nullptr;
    return f;
}

// FluxKontextPipeline's size: the asked width and height at their ratio, scaled to max_area
// pixels (Python's round, half to even) and rounded down to the multiple.
std::pair<int64_t, int64_t> kontext_output_size(int64_t width, int64_t height,
                                                const protocol::CallValues& arguments, int64_t multiple) {
    const double area = static_cast<double>(arguments.whole("max_area"));
    const double ratio = static_cast<double>(width) / static_cast<double>(height);
    const auto side = [multiple](double pixels) {
        return static_cast<int64_t>(std::nearbyint(std::pow(pixels, 0.5))) / multiple * multiple;
    };
    return {side(area * ratio), side(area / ratio)};
}

// The resolutions FLUX.1-Kontext was trained at (diffusers' PREFERRED_KONTEXT_RESOLUTIONS), width
// by height.
constexpr std::pair<int64_t, int64_t> kKontextResolutions[] = {
    {672, 1568}, {688, 1504}, {720, 1456},  {752, 1392}, {800, 1328}, {832, 1248},
    {880, 1184}, {944, 1104}, {1024, 1024}, {1104, 944}, {1184, 880}, {1248, 832},
    {1328, 800}, {1392, 752}, {1456, 720},  {1504, 688}, {1568, 672}};

// FluxKontextPipeline's reference size: the image's sides rounded down to the multiple give its
// ratio; the preferred resolution nearest it (ties to the narrower, as Python's min of tuples),
// rounded down to the multiple. {0, 0} for an image under the multiple in height or width.
std::pair<int64_t, int64_t> kontext_reference_size(int64_t width, int64_t height, int64_t multiple) {
    const int64_t w = width / multiple * multiple, h = height / multiple * multiple;
    if (w < 1 || h < 1) return {0, 0};
    const double ratio = static_cast<double>(w) / static_cast<double>(h);
    std::tuple<double, int64_t, int64_t> best{HUGE_VAL, 0, 0};
    for (const auto& [pw, ph] : kKontextResolutions)
        best = std::min(best, {std::abs(ratio - static_cast<double>(pw) / static_cast<double>(ph)), pw, ph});
    return {std::get<1>(best) / multiple * multiple, std::get<2>(best) / multiple * multiple};
}

}  // namespace flux_facts

const FamilyFacts& flux_fill_family() {
    using namespace flux_facts;
    static const FamilyFacts facts = [] {
        // FluxFillPipeline: every line repaints the white part of its mask on its image, both
        // required; the masked image's latents and the mask ride beside the latents on channels.
        // Its guidance scale is embedded (no negative branch) and its strength 1 by default.
        FamilyFacts f = dev_pipeline("flux-fill", "FLUX.1-Fill", "FluxFillPipeline");
        f.spec.inpaint_class = "FluxFillPipeline";
        f.spec.img2img_class.clear();
        f.spec.guidance_branches = false;
        protocol::ArgumentUse image{"image"}, mask{"mask_image"};
        image.required = mask.required = true;
        f.arguments = {{"num_inference_steps", 50},
                       {"guidance_scale", 30},
                       {"max_sequence_length", 512, 512},
                       {"lora"},
                       {"cache"},
                       image,
                       mask,
                       {"strength", 1.0}};
        return f;
    }();
    return facts;
}

const FamilyFacts& flux_kontext_family() {
    using namespace flux_facts;
    static const FamilyFacts facts = [] {
        // FluxKontextPipeline: a line's image is a reference (its latents appended to the
        // sequence, at the preferred resolution nearest its ratio), not the start; without one it
        // is text to image. Every size is scaled to max_area.
        FamilyFacts f = dev_pipeline("flux-kontext", "FLUX.1-Kontext", "FluxKontextPipeline");
        f.spec.img2img_class = "FluxKontextPipeline";
        f.spec.inpaint_class.clear();
        protocol::ArgumentUse true_cfg{"true_cfg_scale", 1.0};
        true_cfg.guidance = protocol::Guidance::kAbove1WithNegative;
        f.arguments = {{"num_inference_steps", 28},
                       {"guidance_scale", 3.5},
                       true_cfg,
                       {"max_sequence_length", 512, 512},
                       {"lora"},
                       {"cache"},
                       {"image"},
                       {"max_area", 1024.0 * 1024.0}};
        f.size_from_input = false;
        f.output_size = &kontext_output_size;
        f.reference_size = &kontext_reference_size;
        return f;
    }();
    return facts;
}

}  // namespace dp::strategies
