// Qwen-Image (QwenImagePipeline): what the launcher side knows of the family (Note [a family in
// one place], strategies/family.h). Its math is runtime/models/qwen_image/.
#include <cmath>
#include <nlohmann/json.hpp>

#include "strategies/config_sizes.h"
#include "strategies/family.h"

namespace dp::strategies {
// The family's own helpers, named apart from the other families' (the sources build in unity batches).
namespace qwen_image_facts {

ParallelSpec spec() {
    ParallelSpec s;
    s.family = "qwen-image";
    s.display_name = "Qwen-Image";
    s.pipeline_class = "QwenImagePipeline";
    s.img2img_class = "QwenImageImg2ImgPipeline";
    s.inpaint_class = "QwenImageInpaintPipeline";
    s.components = {"text_encoder", "transformer", "vae"};
    s.tp_components = {"text_encoder"};
    s.offload = true;
    s.block_prefixes = {"transformer_blocks."};
    // Dual-stream blocks: q, k, v of both streams column-parallel (by heads), the outputs
    // row-parallel, both GELU MLPs column- then row-parallel.
    add_tp_rules(s, TpSplit::kColumn,
                 {".attn.to_q", ".attn.to_k", ".attn.to_v", ".attn.add_q_proj", ".attn.add_k_proj",
                  ".attn.add_v_proj", ".img_mlp.net.0.proj", ".txt_mlp.net.0.proj"});
    add_tp_rules(s, TpSplit::kRow,
                 {".attn.to_out.0", ".attn.to_add_out", ".img_mlp.net.2", ".txt_mlp.net.2"});
    // Each stream's modulation (6 x width per block from the timestep alone): a third of the
    // transformer's weights for one row per prompt; split and gathered, where diffusers' TP keeps
    // them whole.
    add_tp_rules(s, TpSplit::kColumnGathered, {".img_mod.1", ".txt_mod.1"});
    add_qwen2_decoder_rules(s);
    // The text (up to 1024 tokens, of any length) is split like the image under context
    // parallelism, padded and masked: replicated, each rank would repeat its whole MLPs and
    // projections (Note [Qwen-Image text stream], qwen_image_transformer.h).
    s.streams = {{"image", true}, {"text", true}};
    s.int8_layers = mmdit_int8_layers();  // Note [int8 compute]: both streams' projections and MLPs
    s.unloaded_tensors = {{"vae", "encoder."},
                          {"vae", "quant_conv."},
                          {"text_encoder", "visual."},
                          {"text_encoder", "model.visual."},
                          {"text_encoder", "lm_head."}};
    // QwenImageTransformer2DModel's defaults; 128 latents a side is the pipeline's
    // default_sample_size (1024 pixels).
    // heads, head_dim, layers, of them later blocks (from more_layers_keys), patch_size, in_channels,
    // sample_size
    s.transformer_defaults = {24, 128, 60, 0, 2, 64, 128};
    s.vae_scale_key = "temperal_downsample";
    // Its RoPE tables hold 4096 positions: half a side's patches from the centre, then up to 1024
    // text positions after them.
    s.max_patches_key.clear();
    s.max_patches = 2 * (4096 - 1024);
    return s;
}

// Qwen-Image's checkpoints (ComfyUI's split files among them) keep diffusers' own names.
std::string shipped_config(const std::vector<std::string>&) { return "qwen-image"; }

// QwenImageTransformer2DModel's parameters from its config (Note [sizes from configs]): the image
// and text inputs (the text's RMS norm), the timestep embedder, each dual-stream block (both
// streams' modulations, q, k, v, outputs, qk-norms and MLPs), the output norm and head.
double transformer_parameters(const nlohmann::json& c) {
    const double hd = config_number(c, "attention_head_dim", 128),
                 d = config_number(c, "num_attention_heads", 24) * hd;
    const double joint = config_number(c, "joint_attention_dim", 3584), p = config_number(c, "patch_size", 2);
    const double top = linear_parameters(config_number(c, "in_channels", 64), d) + joint +
                       linear_parameters(joint, d) + linear_parameters(256, d) + linear_parameters(d, d) +
                       linear_parameters(d, 2 * d) +
                       linear_parameters(d, p * p * config_number(c, "out_channels", 16));
    const double block = 2 * linear_parameters(d, 6 * d) + 6 * linear_parameters(d, d) +
                         2 * linear_parameters(d, 4 * d) + 2 * linear_parameters(d, d) +
                         2 * linear_parameters(4 * d, d) + 4 * hd;
    return top + config_number(c, "num_layers", 60) * block;
}

// QwenImageTransformer2DModel's forward (Note [FLOPs of a pass]): the image and text inputs, the
// timestep MLP, each block (both streams' modulations, q, k, v, outputs and MLPs, one attention
// over text and image) and the head.
PassFlops pass_flops(const nlohmann::json& c, const PassTokens& t) {
    const int64_t d = config_count(c, "num_attention_heads", 24) * config_count(c, "attention_head_dim", 128);
    const int64_t layers = config_count(c, "num_layers", 60), p = config_count(c, "patch_size", 2);
    PassFlops f;
    f.linear(t.image, config_count(c, "in_channels", 64), d);
    f.linear(t.text, config_count(c, "joint_attention_dim", 3584), d);
    f.linear(1, 256, d);
    f.linear(1, d, d);
    f.linear(1, d, 6 * d, 2 * layers);
    for (const int64_t tokens : {t.image, t.text}) {
        f.linear(tokens, d, d, 4 * layers);
        f.linear(tokens, d, 4 * d, layers);
        f.linear(tokens, 4 * d, d, layers);
    }
    f.attend(t.image + t.text, t.image + t.text, d, layers);
    f.linear(1, d, 2 * d);
    f.linear(t.image, d, p * p * config_count(c, "out_channels", 16));
    return f;
}

// QwenImageEditPipeline's size of an image, for its VAE (the reference) and its output when none
// is asked: 1024 x 1024 pixels' area at its ratio, in multiples of 32; rounded down to `multiple`.
std::pair<int64_t, int64_t> edit_size(int64_t width, int64_t height, int64_t multiple) {
    if (width < 1 || height < 1) return {0, 0};
    const auto [w, h] = area_dimensions(1024.0 * 1024.0, width, height, 32);
    return {w / multiple * multiple, h / multiple * multiple};
}

FamilyFacts edit_pipeline(const char* family, const char* display_name, const char* pipeline_class,
                          int pictures);

}  // namespace qwen_image_facts

std::pair<int64_t, int64_t> area_dimensions(double area, int64_t width, int64_t height, int64_t step) {
    const double ratio = static_cast<double>(width) / static_cast<double>(height);
    const double w = std::sqrt(area * ratio), h = w / ratio;
    const auto side = [step](double x) {
        return static_cast<int64_t>(std::nearbyint(x / static_cast<double>(step))) * step;
    };
    return {side(w), side(h)};
}

// Qwen-Image-Lightning's preset of `steps` steps (Note [presets]), as its model card runs it.
std::string lightning_preset(int steps) {
    const std::string n = std::to_string(steps);
    return R"J({"name": "qwen-image-lightning-)J" + n + R"J(step", "family": "qwen-image",
    "num_inference_steps": )J" +
           n + R"J(, "adapter": "lightx2v/Qwen-Image-Lightning (Qwen-Image-Lightning-)J" + n +
           R"J(steps LoRA)", "description": "Qwen-Image distilled to )J" + n +
           R"J( steps: Euler at a fixed shift, without true CFG",
    "scheduler": "euler", "true_cfg_scale": 1.0, "scheduler_config": {"base_image_seq_len": 256,
    "base_shift": 1.0986122886681098, "invert_sigmas": false, "max_image_seq_len": 8192,
    "max_shift": 1.0986122886681098, "num_train_timesteps": 1000, "shift": 1.0, "shift_terminal": null,
    "stochastic_sampling": false, "time_shift_type": "exponential", "use_beta_sigmas": false,
    "use_dynamic_shifting": true, "use_exponential_sigmas": false, "use_karras_sigmas": false}})J";
}

const FamilyFacts& qwen_image_family() {
    using namespace qwen_image_facts;
    static const FamilyFacts facts = [] {
        FamilyFacts f;
        f.spec = spec();
        // QwenImagePipeline's defaults: true CFG at 4 with a negative prompt.
        protocol::ArgumentUse true_cfg{"true_cfg_scale", 4.0};
        true_cfg.guidance = protocol::Guidance::kAbove1WithNegative;
        f.arguments = {{"num_inference_steps", 50},
                       true_cfg,
                       {"max_sequence_length", 512},
                       {"lora"},
                       {"cache"},
                       {"image"},
                       {"mask_image"},
                       {"strength", 0.6},  // QwenImageImg2ImgPipeline's
                       {"padding_mask_crop"}};
        f.components = {
            {"scheduler", {"FlowMatchEulerDiscreteScheduler"}, true, ComponentRule::kScheduler, false},
            {"text_encoder", {"Qwen2_5_VLForConditionalGeneration"}, true, ComponentRule::kModel, false},
            {"tokenizer",
             {"Qwen2Tokenizer", "Qwen2TokenizerFast"},
             true,
             ComponentRule::kBpeTokenizer,
             false},
            {"transformer", {"QwenImageTransformer2DModel"}, true, ComponentRule::kModel, false},
            {"vae", {"AutoencoderKLQwenImage"}, true, ComponentRule::kModel, false},
        };
        // The text encoder's hidden states join the transformer as they are.
        WidthRule text{"text_encoder",
                       "hidden_size",
                       3584,
                       "joint_attention_dim",
                       3584,
                       nullptr,
                       "use the text encoder made for this model"};
        text.nested = "text_config";
        f.widths = {text};
        f.name_markers = {"img_mlp", "txt_mlp", "img_mod", "txt_mod"};
        f.guess_order = 2;  // FLUX.1's original names have img_mlp too
        f.shipped_config = &shipped_config;
        f.transformer_parameters = &transformer_parameters;
        f.pass_flops = &pass_flops;
        // Qwen-Image-Lightning's model card: the Euler flow schedule at a fixed shift of ln 3
        // (exponential dynamic shifting with base_shift = max_shift), without true CFG.
        static const std::string eight = lightning_preset(8), four = lightning_preset(4);
        f.presets = {eight.c_str(), four.c_str()};
        return f;
    }();
    return facts;
}

namespace qwen_image_facts {

// An edit pipeline of Qwen-Image's (Qwen-Image-Edit, -Edit-Plus): Qwen-Image's transformer and VAE,
// its text encoder with the vision tower and the processor, every line's `image` (up to `pictures`
// of them) a reference appended to the image stream at the pipeline's size; no strength (the
// steps start from noise). The output's size is the last picture's at 1024 x 1024 pixels' area
// unless asked.
FamilyFacts edit_pipeline(const char* family, const char* display_name, const char* pipeline_class,
                          int pictures) {
    FamilyFacts f = qwen_image_family();
    f.spec.family = family;
    f.spec.display_name = display_name;
    f.spec.pipeline_class = pipeline_class;
    f.spec.img2img_class = pipeline_class;
    f.spec.inpaint_class.clear();
    f.spec.unloaded_tensors = {{"text_encoder", "lm_head."}};  // every line encodes an image
    add_qwen2_vision_rules(f.spec);                            // the vision tower by heads under tp
    protocol::ArgumentUse true_cfg{"true_cfg_scale", 4.0};
    true_cfg.guidance = protocol::Guidance::kAbove1WithNegative;
    protocol::ArgumentUse image{"image"};
    image.required = true;
    image.max = pictures;
    protocol::ArgumentUse max_sequence{"max_sequence_length", 512, 1024};
    max_sequence.ignored = true;  // checked, never used: diffusers keeps the whole prompt
    f.arguments = {{"num_inference_steps", 50}, true_cfg, max_sequence, {"lora"}, {"cache"}, image,
                   {"sequential_positions", 0}};
    f.components.insert(f.components.begin() + 2,
                        {"processor", {"Qwen2VLProcessor"}, true, ComponentRule::kProcessor, false});
    f.input_size = &edit_size;
    f.reference_size = &edit_size;
    f.name_markers.clear();  // an adapter or a file of Qwen-Image's names is named Qwen-Image's, and fits
    f.names_as = qwen_image_family().spec.display_name;
    f.shipped_config = nullptr;
    return f;
}

}  // namespace qwen_image_facts

const FamilyFacts& qwen_image_edit_family() {
    static const FamilyFacts facts =
        qwen_image_facts::edit_pipeline("qwen-image-edit", "Qwen-Image-Edit", "QwenImageEditPipeline", 1);
    return facts;
}

const FamilyFacts& qwen_image_edit_plus_family() {
    static const FamilyFacts facts =
        qwen_image_facts::edit_pipeline("qwen-image-edit-plus", "Qwen-Image-Edit-Plus",
                                        "QwenImageEditPlusPipeline", protocol::kMaxInputPictures);
    return facts;
}

}  // namespace dp::strategies
