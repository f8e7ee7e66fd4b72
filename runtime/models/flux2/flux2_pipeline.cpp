#include "runtime/models/flux2/flux2_pipeline.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "runtime/io/errors.h"
#include "runtime/models/common/mistral_tokenizer.h"
#include "runtime/models/common/qwen2_text_encoder.h"
#include "runtime/models/common/qwen2_tokenizer.h"
#include "runtime/models/flux2/flux2_transformer.h"
#include "runtime/models/flux2/flux2_vae.h"
#include "runtime/pipeline/image_inputs.h"
#include "runtime/pipeline/pipeline_common.h"
#include "strategies/config_file.h"
#include "strategies/family.h"

namespace dp::runtime {
namespace {

// Note [FLUX.2 prompts]: how each pipeline templates, pads and reads its text encoder.
struct PromptFormat {
    std::string prefix, suffix;       // around the prompt
    std::vector<int64_t> out_layers;  // the hidden states stacked (text_encoder_out_layers)
    const char* pipeline;
};
// Flux2KleinPipeline: Qwen3's chat template for one user message with the generation prompt,
// thinking disabled (an empty think block closes it).
const PromptFormat kKleinFormat{"<|im_start|>user\n",
                                "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
                                {9, 18, 27},
                                "Flux2KleinPipeline"};
// Flux2Pipeline: Mistral-Small-3.1's chat template of its system message and one user message,
// no generation prompt; the template's <s> is the only BOS.
const PromptFormat kDevFormat{
    "<s>[SYSTEM_PROMPT]You are an AI that reasons about image descriptions. You give structured responses "
    "focusing on object relationships, object\nattribution and actions without "
    "speculation.[/SYSTEM_PROMPT][INST]",
    "[/INST]",
    {10, 20, 30},
    "Flux2Pipeline"};
constexpr int kMaxSequenceLength = 512;  // the pipelines' default, and what they allow

// Flux2Pipeline's format_input: every [IMG] removed from the prompt.
std::string without_image_tokens(std::string prompt) {
    const std::string img = "[IMG]";
    for (std::size_t at = prompt.find(img); at != std::string::npos; at = prompt.find(img, at))
        prompt.erase(at, img.size());
    return prompt;
}

// Note [FLUX.2 references]: the pictures' checks, and the time id of picture i: 10 + 10 i.
constexpr int64_t kMinSide = 64, kMaxRatio = 8, kReferenceTime = 10;

// Position ids [h w, 4] of a grid at time `t`: (t, row, column, 0), row-major.
at::Tensor grid_ids(int64_t t, int64_t h, int64_t w) {
    const at::Tensor index = at::arange(h * w, at::kLong);
    return at::stack({at::full({h * w}, t, at::kLong), at::floor_divide(index, w), at::remainder(index, w),
                      at::zeros({h * w}, at::kLong)},
                     1);
}

// The text's ids [n, 4]: (0, 0, 0, l).
at::Tensor text_ids(int64_t n) {
    return at::cat({at::zeros({n, 3}, at::kLong), at::arange(n, at::kLong).unsqueeze(1)}, 1);
}

// Flux2ImageProcessor.check_image_input's limits, with the file named.
void check_picture(const protocol::InputImage& p) {
    const int64_t lo = std::min(p.width, p.height), hi = std::max(p.width, p.height);
    if (lo < kMinSide)
        throw ModelError(p.path + ": " + std::to_string(p.width) + " x " + std::to_string(p.height) +
                         " pixels; FLUX.2's reference pictures must be at least " + std::to_string(kMinSide) +
                         " pixels a side");
    if (hi > kMaxRatio * lo)
        throw ModelError(p.path + ": " + std::to_string(p.width) + " x " + std::to_string(p.height) +
                         " pixels; FLUX.2's reference pictures must have sides within a ratio of " +
                         std::to_string(kMaxRatio));
}

}  // namespace

struct Flux2Pipeline::Components : ComponentsBase {
    const PromptFormat* format = &kKleinFormat;
    bool left_padded = false;  // tokenizer_config.json's padding_side
    std::unique_ptr<BpeTokenizer> tokenizer;
    Qwen2TextConfig text_config;
    Flux2TransformerConfig transformer_config;
    VaeConfig vae_config;
    Component<Qwen2TextEncoder> text_encoder;
    Component<Flux2Transformer> transformer;
    Component<Flux2VaeDecoder> vae;
    Component<Flux2VaeEncoder> vae_encoder;
};

Flux2Pipeline::Flux2Pipeline(std::unique_ptr<Components> c, strategies::ModelInfo model)
    : FamilyPipeline(*c, std::move(model)), c_(std::move(c)) {}
Flux2Pipeline::~Flux2Pipeline() = default;

namespace {

// Throws ModelError unless the configs of `dir` fit together as `f`'s pipeline joins them.
void check_fit(const std::string& dir, const PromptFormat& f, const Qwen2TextConfig& text,
               const Flux2TransformerConfig& t, const VaeConfig& vae) {
    const bool dev = &f == &kDevFormat;
    if (dev ? !text.mistral : !text.qwen3)
        throw ModelError(dir + "/text_encoder/config.json: " + f.pipeline + "'s text encoder is " +
                         (dev ? "Mistral 3 (model_type mistral3)" : "Qwen3 (model_type qwen3)") +
                         "; use the model's own text_encoder");
    if (text.num_hidden_layers < f.out_layers.back())
        throw ModelError(dir + "/text_encoder/config.json: num_hidden_layers is " +
                         std::to_string(text.num_hidden_layers) + "; the pipeline reads hidden_states[" +
                         std::to_string(f.out_layers.back()) + "]");
    if (3 * text.hidden_size != t.joint_attention_dim)
        throw ModelError(dir + ": three of the text encoder's hidden states (hidden_size " +
                         std::to_string(text.hidden_size) + ") are " + std::to_string(3 * text.hidden_size) +
                         " wide, but transformer/config.json joint_attention_dim is " +
                         std::to_string(t.joint_attention_dim));
    if (t.in_channels != 4 * vae.latent_channels || !vae.latent_batch_norm)
        throw ModelError(dir + ": the transformer takes " + std::to_string(t.in_channels) +
                         " channels, four times an AutoencoderKLFlux2's latent_channels (" +
                         std::to_string(vae.latent_channels) + " here)");
    if (t.guidance_embeds != dev)
        throw ModelError(dir + "/transformer/config.json: guidance_embeds is " +
                         (t.guidance_embeds
                              ? "true (FLUX.2-dev's transformer); Flux2KleinPipeline passes no guidance"
                              : "false (FLUX.2-klein's transformer); Flux2Pipeline embeds its guidance"));
}

// The tokenizer of `dir`/tokenizer for format `f`, and whether it pads on the left (its
// tokenizer_config.json's padding_side; transformers' tokenizers.json backend pads right otherwise).
std::unique_ptr<BpeTokenizer> read_tokenizer(const std::string& dir, const PromptFormat& f, bool& left) {
    const std::string folder = dir + "/tokenizer";
    auto t = &f == &kDevFormat ? std::make_unique<BpeTokenizer>(MistralTokenizer::from_folder(folder))
                               : std::make_unique<BpeTokenizer>(Qwen2Tokenizer::from_folder(folder));
    if (t->pad_id() < 0) throw ModelError(folder + ": no pad token; " + f.pipeline + " pads every prompt");
    const nlohmann::json config =
        strategies::read_config_object_if_present(folder + "/tokenizer_config.json");
    const auto side = config.find("padding_side");
    if (side != config.end() && !(*side == "left" || *side == "right"))
        throw ModelError(folder + "/tokenizer_config.json: padding_side is " + side->dump() +
                         "; expected \"left\" or \"right\"");
    left = side != config.end() && *side == "left";
    return t;
}

}  // namespace

std::unique_ptr<Flux2Pipeline> Flux2Pipeline::load(const PipelineOptions& o,
                                                   const ParallelContext& parallel) {
    const std::string& dir = o.model_dir;
    strategies::ModelInfo model = model_info_of(o);
    const strategies::ParallelSpec& spec = *model.spec;
    require_loadable(o, spec);
    auto c = std::make_unique<Components>();
    c->start(o, parallel);
    // The text encoder model_index.json names (the family's facts accept one per pipeline class).
    c->format = spec.pipeline_class == kDevFormat.pipeline ? &kDevFormat : &kKleinFormat;
    c->tokenizer = read_tokenizer(dir, *c->format, c->left_padded);
    c->text_config = Qwen2TextConfig::from_json_file(dir + "/text_encoder/config.json");
    c->transformer_config = Flux2TransformerConfig::from_json_file(dir + "/transformer/config.json");
    c->vae_config = VaeConfig::from_json_file(dir + "/vae/config.json");
    check_fit(dir, *c->format, c->text_config, c->transformer_config, c->vae_config);
    const Components* self = c.get();
    const PipelineOptions* opts = &self->options;
    // Only the layers up to the last hidden state read load; the rest and the final norm never do.
    c->text_encoder = component_of<Qwen2TextEncoder>(
        opts, "text_encoder", 51, device_of(o, "text_encoder"), [self, &spec](WeightStore& w) {
            return std::make_unique<Qwen2TextEncoder>(self->text_config, w, self->parallel->tensor(), spec,
                                                      nullptr, self->format->out_layers.back());
        });
    c->transformer =
        component_of<Flux2Transformer>(opts, "transformer", 52, o.device, [self](WeightStore& w) {
            return std::make_unique<Flux2Transformer>(self->transformer_config, w, *self->parallel,
                                                      self->options.device_map);
        });
    // The encoder with the decoder's salt: random weights make one VAE (vae_encoder.h).
    c->vae = component_of<Flux2VaeDecoder>(opts, "vae", 53, device_of(o, "vae"), [self](WeightStore& w) {
        return std::make_unique<Flux2VaeDecoder>(self->vae_config, w);
    });
    c->vae_encoder = component_of<Flux2VaeEncoder>(
        opts, "vae", 53, device_of(o, "vae"),
        [self](WeightStore& w) { return std::make_unique<Flux2VaeEncoder>(self->vae_config, w); });
    c->vae_scale = c->vae_config.scale_factor();
    return std::unique_ptr<Flux2Pipeline>(new Flux2Pipeline(std::move(c), std::move(model)));
}

bool Flux2Pipeline::components_kept() const {
    return c_->text_encoder.kept() && c_->transformer.kept() && c_->vae.kept();
}

Conditioning Flux2Pipeline::encode_prompts(const std::vector<std::string>& prompts,
                                           int max_sequence_length) const {
    const Components& c = *c_;
    check_max_sequence_length(max_sequence_length, kMaxSequenceLength);
    const auto n = static_cast<int64_t>(prompts.size()), length = static_cast<int64_t>(max_sequence_length);
    std::vector<std::string> warnings(prompts.size());
    // Padded to max_sequence_length on the tokenizer's side, the pads masked as keys; the
    // template's end cut with the rest, as diffusers' tokenizer cuts.
    at::Tensor ids = at::full({n, length}, c.tokenizer->pad_id(), at::kLong),
               mask = at::zeros({n, length}, at::kLong);
    const bool dev = c.format == &kDevFormat;
    for (int64_t k = 0; k < n; ++k) {
        const std::string prompt = dev ? without_image_tokens(prompts[k]) : prompts[k];
        std::vector<int64_t> row = c.tokenizer->tokenize(c.format->prefix + prompt + c.format->suffix);
        if (static_cast<int64_t>(row.size()) > length) {
            warnings[k] = "the prompt in its chat template was cut to max_sequence_length " +
                          std::to_string(length) + " tokens (" + std::to_string(row.size() - length) +
                          " tokens dropped)";
            row.resize(static_cast<std::size_t>(length));
        }
        const auto real = static_cast<int64_t>(row.size());
        const int64_t first = c.left_padded ? length - real : 0;
        ids[k].narrow(0, first, real).copy_(at::tensor(row, at::kLong));
        mask[k].narrow(0, first, real).fill_(1);
    }
    const at::Device device = device_of(c.options, "text_encoder");
    // Per token, the first layer's state, then the second's, then the third's; every token goes
    // on, the pads too.
    const std::vector<at::Tensor> states =
        c.text_encoder.use()->hidden_states(ids.to(device), mask.to(device), c.format->out_layers);
    Conditioning e;
    e.text = to_transformer(at::cat(states, -1), "text_encoder");
    e.warnings = std::move(warnings);
    return e;
}

Conditioning Flux2Pipeline::encode(const std::vector<std::string>& prompts,
                                   const protocol::CallValues& arguments) const {
    return encode_prompts(prompts, static_cast<int>(arguments.whole("max_sequence_length")));
}

LatentShape Flux2Pipeline::latents(int width, int height) const {
    // Drawn already patchified, [4 L, h / 2, w / 2] (diffusers' prepare_latents), a token each.
    const LatentShape packed = packed_latents(c_->vae_config.latent_channels, c_->vae_scale, width, height);
    LatentShape s;
    s.channels = 4 * packed.channels;
    s.height = packed.height / 2;
    s.width = packed.width / 2;
    s.tokens = packed.tokens;
    return s;
}

double Flux2Pipeline::shift_mu(int64_t tokens, int steps, const nlohmann::json&) const {
    // diffusers' compute_empirical_mu, fitted by Black Forest Labs.
    const double a1 = 8.73809524e-05, b1 = 1.89833333, a2 = 0.00016927, b2 = 0.45666666;
    const auto s = static_cast<double>(tokens);
    if (tokens > 4300) return a2 * s + b2;
    const double m200 = a2 * s + b2, m10 = a1 * s + b1;
    const double a = (m200 - m10) / 190.0, b = m200 - 200.0 * a;
    return a * static_cast<double>(steps) + b;
}

std::shared_ptr<const void> Flux2Pipeline::hold_transformer() const { return c_->transformer.use(); }

std::vector<std::pair<int64_t, int64_t>> Flux2Pipeline::reference_sizes(
    const protocol::InputImage& image) const {
    const strategies::FamilyFacts& facts = strategies::facts_of(*model().spec);
    const int64_t m = 2 * c_->vae_scale;
    std::vector<std::pair<int64_t, int64_t>> out;
    for (const protocol::InputImage& p : image.pictures()) {
        check_picture(p);
        out.push_back(facts.reference_size(p.width, p.height, m));
    }
    return out;
}

at::Tensor Flux2Pipeline::predict(const at::Tensor& latents, const LatentShape& shape,
                                  const Conditioning& text, double timestep,
                                  const protocol::CallValues& arguments, const BlockRunner& blocks) const {
    const int64_t h = shape.height, w = shape.width;
    at::Tensor tokens = pack_tokens(latents), ids = grid_ids(0, h, w);
    if (text.image.defined()) {  // Note [FLUX.2 references]: after the noise, with their own ids
        tokens = at::cat({tokens, text.image.to(tokens.scalar_type())}, 1);
        std::vector<at::Tensor> all{ids};
        const int64_t side = 2 * c_->vae_scale;
        for (const auto& [rw, rh] : reference_sizes(arguments.image("image")))
            all.push_back(grid_ids(kReferenceTime * static_cast<int64_t>(all.size()), rh / side, rw / side));
        ids = at::cat(all, 0);
    }
    // diffusers: the timestep in the latents' dtype, then / 1000.
    const at::Tensor t = at::full({latents.size(0)}, timestep,
                                  at::TensorOptions().dtype(options().dtype).device(latents.device())) /
                         1000;
    // Flux2Pipeline: the guidance scale in fp32, embedded (the model scales it by 1000).
    const at::Tensor guidance = c_->transformer_config.guidance_embeds
                                    ? at::full({latents.size(0)}, arguments.number("guidance_scale"),
                                               at::TensorOptions().dtype(at::kFloat).device(latents.device()))
                                    : at::Tensor();
    const at::Tensor out = c_->transformer.use()->forward(tokens, ids, text.text, text_ids(text.text.size(1)),
                                                          t, guidance, blocks);
    return unpack_tokens(out.narrow(1, 0, h * w), h, w);
}

at::Tensor Flux2Pipeline::decode(const at::Tensor& latents) const {
    return c_->vae.use()->decode(latents);  // de-normalized, unpatchified, decoded
}

ImageLatents Flux2Pipeline::encode_image(const at::Tensor& pixels) const {
    // The posterior's mode, patchified and normalized (its tokens' channels); no spread: the
    // pipeline never samples.
    const at::Tensor mode = c_->vae_encoder.use()->encode(pixels);
    return {mode, at::zeros_like(mode)};
}

std::optional<EditCondition> Flux2Pipeline::edit_condition(const protocol::InputImage& image,
                                                           const protocol::InputImage&,
                                                           const LatentShape&) const {
    const strategies::FamilyFacts& facts = strategies::facts_of(*model().spec);
    const std::vector<protocol::InputImage> all = image.pictures();
    const std::vector<std::pair<int64_t, int64_t>> cut = reference_sizes(image);
    std::vector<at::Tensor> tokens;
    for (std::size_t k = 0; k < all.size(); ++k) {
        // Its size at 1024 x 1024 pixels' area when larger, then its centre cut out.
        const auto [w, h] = facts.reference_size(all[k].width, all[k].height, 1);
        const auto [cw, ch] = cut[k];
        images::Box box;
        box.x0 = static_cast<int>((w - cw) / 2), box.y0 = static_cast<int>((h - ch) / 2);
        box.x1 = box.x0 + static_cast<int>(cw), box.y1 = box.y0 + static_cast<int>(ch);
        const at::Tensor pixels = input_pixels_cut(all[k], static_cast<int>(w), static_cast<int>(h), box);
        tokens.push_back(pack_tokens(encode_on_cpu(pixels).mean));
    }
    EditCondition e;
    e.latents.mean = at::cat(tokens, 1);
    e.ready = true;
    return e;
}

}  // namespace dp::runtime
