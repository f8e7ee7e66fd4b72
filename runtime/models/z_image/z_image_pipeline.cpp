#include "runtime/models/z_image/z_image_pipeline.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "runtime/io/errors.h"
#include "runtime/models/common/qwen2_text_encoder.h"
#include "runtime/models/common/qwen2_tokenizer.h"
#include "runtime/models/common/vae_decoder.h"
#include "runtime/models/z_image/z_image_transformer.h"
#include "runtime/pipeline/pipeline_common.h"
#include "strategies/parallel_spec.h"

namespace dp::runtime {
namespace {

// Qwen3's chat template for one user message with the generation prompt, thinking enabled (as
// ZImagePipeline applies it): no empty think block.
constexpr const char* kTemplatePrefix = "<|im_start|>user\n";
constexpr const char* kTemplateSuffix = "<|im_end|>\n<|im_start|>assistant\n";
constexpr int kMaxSequenceLength = 512;  // the pipeline's default; its tokenizer cuts there
// The hidden state the pipeline takes: transformers' hidden_states[-2], the input of the last layer.
constexpr int64_t kHiddenState = -2;

}  // namespace

struct ZImagePipeline::Components : ComponentsBase {
    std::unique_ptr<Qwen2Tokenizer> tokenizer;
    Qwen2TextConfig text_config;
    ZImageTransformerConfig transformer_config;
    VaeConfig vae_config;
    Component<Qwen2TextEncoder> text_encoder;
    Component<ZImageTransformer> transformer;
    Component<VaeDecoder> vae;
};

ZImagePipeline::ZImagePipeline(std::unique_ptr<Components> c, strategies::ModelInfo model)
    : FamilyPipeline(*c, std::move(model)), c_(std::move(c)) {}
ZImagePipeline::~ZImagePipeline() = default;

std::unique_ptr<ZImagePipeline> ZImagePipeline::load(const PipelineOptions& o,
                                                     const ParallelContext& parallel) {
    const std::string& dir = o.model_dir;
    strategies::ModelInfo model = model_info_of(o);
    const strategies::ParallelSpec& spec = *model.spec;
    require_loadable(o, spec);
    auto c = std::make_unique<Components>();
    c->start(o, parallel);
    c->tokenizer = std::make_unique<Qwen2Tokenizer>(Qwen2Tokenizer::from_folder(dir + "/tokenizer"));
    c->text_config = Qwen2TextConfig::from_json_file(dir + "/text_encoder/config.json");
    if (!c->text_config.qwen3)
        throw ModelError(dir +
                         "/text_encoder/config.json: ZImagePipeline's text encoder is Qwen3 (model_type "
                         "qwen3); use the model's own text_encoder");
    c->transformer_config = ZImageTransformerConfig::from_json_file(dir + "/transformer/config.json");
    c->vae_config = VaeConfig::from_json_file(dir + "/vae/config.json");
    const Components* self = c.get();
    const PipelineOptions* opts = &self->options;
    // The pipeline reads hidden_states[-2]: the last decoder layer and the final norm never load.
    const int64_t layers = c->text_config.num_hidden_layers - 1;
    c->text_encoder = component_of<Qwen2TextEncoder>(
        opts, "text_encoder", 41, device_of(o, "text_encoder"), [self, &spec, layers](WeightStore& w) {
            return std::make_unique<Qwen2TextEncoder>(self->text_config, w, self->parallel->tensor(), spec,
                                                      nullptr, layers);
        });
    c->transformer =
        component_of<ZImageTransformer>(opts, "transformer", 42, o.device, [self](WeightStore& w) {
            return std::make_unique<ZImageTransformer>(self->transformer_config, w, *self->parallel,
                                                       self->options.device_map);
        });
    c->vae = component_of<VaeDecoder>(opts, "vae", 43, device_of(o, "vae"), [self](WeightStore& w) {
        return std::make_unique<VaeDecoder>(self->vae_config, w);
    });
    c->vae_scale = c->vae_config.scale_factor();

    // The pieces must fit together.
    const ZImageTransformerConfig& t = c->transformer_config;
    if (c->text_config.hidden_size != t.cap_feat_dim)
        throw ModelError(dir + ": the text encoder's hidden_size is " +
                         std::to_string(c->text_config.hidden_size) +
                         " but transformer/config.json cap_feat_dim is " + std::to_string(t.cap_feat_dim));
    if (t.in_channels != c->vae_config.latent_channels)
        throw ModelError(dir + ": the transformer takes " + std::to_string(t.in_channels) +
                         " latent channels but the VAE makes " +
                         std::to_string(c->vae_config.latent_channels));
    return std::unique_ptr<ZImagePipeline>(new ZImagePipeline(std::move(c), std::move(model)));
}

bool ZImagePipeline::components_kept() const {
    return c_->text_encoder.kept() && c_->transformer.kept() && c_->vae.kept();
}

Conditioning ZImagePipeline::encode_prompts(const std::vector<std::string>& prompts,
                                            int max_sequence_length) const {
    const Components& c = *c_;
    check_max_sequence_length(max_sequence_length, kMaxSequenceLength);
    std::vector<std::string> warnings(prompts.size());
    std::vector<int64_t> lengths;
    std::vector<std::vector<int64_t>> rows;
    for (std::size_t k = 0; k < prompts.size(); ++k) {
        // The tokenizer cuts the templated text, the template's end included, as diffusers' does.
        std::vector<int64_t> ids = c.tokenizer->tokenize(kTemplatePrefix + prompts[k] + kTemplateSuffix);
        if (static_cast<int64_t>(ids.size()) > max_sequence_length) {
            warnings[k] = "the prompt in its chat template was cut to max_sequence_length " +
                          std::to_string(max_sequence_length) + " tokens (" +
                          std::to_string(ids.size() - static_cast<std::size_t>(max_sequence_length)) +
                          " tokens dropped)";
            ids.resize(static_cast<std::size_t>(max_sequence_length));
        }
        lengths.push_back(static_cast<int64_t>(ids.size()));
        rows.push_back(std::move(ids));
    }
    const int64_t pad = c.tokenizer->pad_id() >= 0 ? c.tokenizer->pad_id() : 0;
    const auto [input, input_mask] = padded_rows(rows, pad, device_of(c.options, "text_encoder"));
    const at::Tensor hidden = to_transformer(
        c.text_encoder.use()->hidden_states(input, input_mask, {kHiddenState}).front(), "text_encoder");
    Conditioning e = kept_tokens(hidden, lengths, 0);
    e.warnings = std::move(warnings);
    return e;
}

Conditioning ZImagePipeline::encode(const std::vector<std::string>& prompts,
                                    const protocol::CallValues& arguments) const {
    return encode_prompts(prompts, static_cast<int>(arguments.whole("max_sequence_length")));
}

LatentShape ZImagePipeline::latents(int width, int height) const {
    LatentShape s = packed_latents(c_->vae_config.latent_channels, c_->vae_scale, width, height);
    s.packed = false;  // the transformer cuts its own patches
    return s;
}

std::shared_ptr<const void> ZImagePipeline::hold_transformer() const { return c_->transformer.use(); }

at::Tensor ZImagePipeline::predict(const at::Tensor& latents, const LatentShape&, const Conditioning& text,
                                   double timestep, const protocol::CallValues&,
                                   const BlockRunner& blocks) const {
    // diffusers: (1000 - t) / 1000 in fp32; the model's output negated, in fp32.
    const at::Tensor t = (1000 - at::full({latents.size(0)}, timestep, at::kFloat)) / 1000;
    return -c_->transformer.use()->forward(latents, text.text, text.mask, t, blocks).to(at::kFloat);
}

at::Tensor ZImagePipeline::combine(const at::Tensor& negative, const at::Tensor& positive,
                                   const protocol::CallValues& arguments) const {
    // Note [Z-Image guidance]; the predictions are negated, which norms and this sum do not mind.
    const at::Tensor pos = positive.to(at::kFloat), neg = negative.to(at::kFloat);
    at::Tensor guided = pos + guidance_scale(arguments) * (pos - neg);
    const double limit = arguments.number("cfg_normalization");
    if (limit <= 0) return guided;
    std::vector<at::Tensor> rows;
    for (int64_t k = 0; k < guided.size(0); ++k) {
        const at::Tensor allowed = at::linalg_vector_norm(pos[k], 2) * limit;
        const at::Tensor norm = at::linalg_vector_norm(guided[k], 2);
        rows.push_back(at::where(norm > allowed, guided[k] * (allowed / norm), guided[k]));
    }
    return at::stack(rows, 0);
}

bool ZImagePipeline::guided_at(double timestep, const protocol::CallValues& arguments) const {
    // diffusers compares (1000 - t) / 1000 in fp32 with the truncation as a Python float.
    const float fraction = (1000.0f - static_cast<float>(timestep)) / 1000.0f;
    return static_cast<double>(fraction) <= arguments.number("cfg_truncation");
}

at::Tensor ZImagePipeline::decode(const at::Tensor& latents) const {
    // The steps keep fp32 latents (as diffusers); the VAE takes its dtype, then scale and shift.
    return c_->vae.use()->decode(latents.to(options().dtype));
}

}  // namespace dp::runtime
