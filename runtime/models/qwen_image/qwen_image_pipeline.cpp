#include "runtime/models/qwen_image/qwen_image_pipeline.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "runtime/io/config_json.h"
#include "runtime/io/errors.h"
#include "runtime/models/common/encoder_on_first_use.h"
#include "runtime/models/common/qwen2_text_encoder.h"
#include "runtime/models/common/qwen2_tokenizer.h"
#include "runtime/models/common/qwen_image_vae.h"
#include "runtime/models/qwen_image/qwen_image_transformer.h"
#include "runtime/parallel/parallel_context.h"
#include "runtime/pipeline/pipeline_common.h"
#include "strategies/family.h"
#include "strategies/parallel_spec.h"

namespace dp::runtime {
namespace {

// QwenImagePipeline's prompt template, and the tokens of its system part that are dropped from
// the hidden states (diffusers hard-codes 34: the real tokenizer's count for that part).
constexpr const char* kTemplatePrefix =
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
    "spatial "
    "relationships of the objects and background:<|im_end|>\n<|im_start|>user\n";
constexpr const char* kTemplateSuffix = "<|im_end|>\n<|im_start|>assistant\n";
constexpr int64_t kTemplateDrop = 34;
constexpr int64_t kTokenizerMaxLength = 1024;  // the tokenizer truncates at this plus kTemplateDrop
constexpr int kMaxSequenceLength = 1024;       // diffusers refuses more

}  // namespace

struct QwenImagePipeline::Components : ComponentsBase {
    std::unique_ptr<Qwen2Tokenizer> tokenizer;
    Qwen2TextConfig text_config;
    QwenImageTransformerConfig transformer_config;
    QwenImageVaeConfig vae_config;
    // Kept, or built for each use with PipelineOptions::offload (Note [offload]).
    Component<Qwen2TextEncoder> text_encoder;
    Component<QwenImageTransformer> transformer;
    Component<QwenImageVaeDecoder> vae;
    // Note [encoder on first use]
    std::unique_ptr<EncoderOnFirstUse<QwenImageVaeEncoder, QwenImageVaeConfig>> vae_encoder;
};

QwenImagePipeline::QwenImagePipeline(std::unique_ptr<Components> c, strategies::ModelInfo model)
    : FamilyPipeline(*c, std::move(model)), c_(std::move(c)) {}
QwenImagePipeline::~QwenImagePipeline() = default;

std::unique_ptr<QwenImagePipeline> QwenImagePipeline::load(const PipelineOptions& o,
                                                           const ParallelContext& parallel) {
    const std::string& dir = o.model_dir;
    const strategies::ParallelSpec& spec = strategies::family_spec("qwen-image");
    require_loadable(o, spec);
    strategies::ModelInfo model = model_info_of(o);

    auto c = std::make_unique<Components>();
    c->start(o, parallel);
    c->tokenizer = std::make_unique<Qwen2Tokenizer>(Qwen2Tokenizer::from_folder(dir + "/tokenizer"));
    c->text_config = Qwen2TextConfig::from_json_file(dir + "/text_encoder/config.json");
    c->transformer_config = QwenImageTransformerConfig::from_json_file(dir + "/transformer/config.json");
    c->vae_config = QwenImageVaeConfig::from_json_file(dir + "/vae/config.json");
    const Components* self = c.get();
    const PipelineOptions* opts = &self->options;
    c->text_encoder = component_of<Qwen2TextEncoder>(
        opts, "text_encoder", 11, device_of(o, "text_encoder"), [self, &spec](WeightStore& w) {
            return std::make_unique<Qwen2TextEncoder>(self->text_config, w, self->parallel->tensor(), spec);
        });
    c->transformer =
        component_of<QwenImageTransformer>(opts, "transformer", 12, o.device, [self](WeightStore& w) {
            return std::make_unique<QwenImageTransformer>(self->transformer_config, w, *self->parallel,
                                                          self->options.device_map);
        });
    c->vae = component_of<QwenImageVaeDecoder>(opts, "vae", 13, device_of(o, "vae"), [self](WeightStore& w) {
        return std::make_unique<QwenImageVaeDecoder>(self->vae_config, w);
    });
    c->vae_encoder = std::make_unique<EncoderOnFirstUse<QwenImageVaeEncoder, QwenImageVaeConfig>>(
        opts, &self->vae_config, 13);
    c->vae_scale = c->vae_config.scale_factor();

    // The pieces must fit together.
    const QwenImageTransformerConfig& t = c->transformer_config;
    const int64_t hidden = c->text_config.hidden_size;
    if (hidden != t.joint_attention_dim)
        throw ModelError(dir + ": the text encoder's hidden_size is " + std::to_string(hidden) +
                         " but transformer/config.json joint_attention_dim is " +
                         std::to_string(t.joint_attention_dim));
    const int64_t z = c->vae_config.z_dim;
    if (t.patch_size != 2 || t.in_channels != z * 4 || t.out_channels != z)
        throw ModelError(dir + ": the transformer takes " + std::to_string(t.in_channels) + " channels in " +
                         std::to_string(t.patch_size) + "x" + std::to_string(t.patch_size) +
                         " patches and makes " + std::to_string(t.out_channels) +
                         ", but the pipeline packs the VAE's " + std::to_string(z) +
                         " latent channels in 2x2 patches (in_channels " + std::to_string(z * 4) +
                         ", out_channels " + std::to_string(z) + ")");
    return std::unique_ptr<QwenImagePipeline>(new QwenImagePipeline(std::move(c), std::move(model)));
}

bool QwenImagePipeline::components_kept() const {
    return c_->text_encoder.kept() && c_->transformer.kept() && c_->vae.kept();
}

Conditioning QwenImagePipeline::encode_prompts(const std::vector<std::string>& prompts,
                                               int max_sequence_length) const {
    const Components& c = *c_;
    check_max_sequence_length(max_sequence_length, kMaxSequenceLength);
    const int64_t n = static_cast<int64_t>(prompts.size());
    Conditioning e;
    e.warnings.assign(prompts.size(), "");
    std::vector<int64_t> lengths;  // each prompt's kept tokens
    // Each prompt in its template, truncated where the tokenizer truncates, padded on the right.
    std::vector<std::vector<int64_t>> rows;
    int64_t longest = 0;
    for (std::size_t k = 0; k < prompts.size(); ++k) {
        std::vector<int64_t> ids = c.tokenizer->tokenize(kTemplatePrefix + prompts[k] + kTemplateSuffix);
        const int64_t limit = kTokenizerMaxLength + kTemplateDrop;
        if (static_cast<int64_t>(ids.size()) > limit) ids.resize(static_cast<std::size_t>(limit));
        if (static_cast<int64_t>(ids.size()) <= kTemplateDrop)
            throw ModelError("the tokenizer makes " + std::to_string(ids.size()) +
                             " tokens of the prompt template, and QwenImagePipeline drops the first " +
                             std::to_string(kTemplateDrop) + ": this tokenizer is not Qwen2's");
        const int64_t kept = static_cast<int64_t>(ids.size()) - kTemplateDrop;
        if (kept > max_sequence_length)
            e.warnings[k] = "the prompt's text was cut to max_sequence_length " +
                            std::to_string(max_sequence_length) + " tokens (" +
                            std::to_string(kept - max_sequence_length) + " tokens dropped)";
        lengths.push_back(std::min<int64_t>(kept, max_sequence_length));
        longest = std::max<int64_t>(longest, static_cast<int64_t>(ids.size()));
        rows.push_back(std::move(ids));
    }
    const int64_t pad = c.tokenizer->pad_id() >= 0 ? c.tokenizer->pad_id() : 0;
    std::vector<int64_t> ids, mask;
    for (const std::vector<int64_t>& row : rows) {
        ids.insert(ids.end(), row.begin(), row.end());
        ids.insert(ids.end(), static_cast<std::size_t>(longest) - row.size(), pad);
        mask.insert(mask.end(), row.size(), 1);
        mask.insert(mask.end(), static_cast<std::size_t>(longest) - row.size(), 0);
    }
    const at::Device device = device_of(c.options, "text_encoder");
    const at::Tensor input = at::tensor(ids, at::kLong).view({n, longest}).to(device);
    const at::Tensor input_mask = at::tensor(mask, at::kLong).view({n, longest}).to(device);
    const at::Tensor hidden =
        to_transformer(c.text_encoder.use()->forward(input, input_mask), "text_encoder");
    // Each prompt's own tokens after the template's first ones, zero-padded to the longest.
    const int64_t width = *std::max_element(lengths.begin(), lengths.end());
    e.text = at::zeros({n, width, hidden.size(-1)}, hidden.options());
    e.mask = at::zeros({n, width}, at::TensorOptions().dtype(at::kLong).device(hidden.device()));
    for (int64_t k = 0; k < n; ++k) {
        const int64_t len = lengths[static_cast<std::size_t>(k)];
        e.text[k].narrow(0, 0, len).copy_(hidden[k].narrow(0, kTemplateDrop, len));
        e.mask[k].narrow(0, 0, len).fill_(1);
    }
    return e;
}

at::Tensor true_cfg_guidance(const at::Tensor& negative, const at::Tensor& positive, double scale) {
    const at::Tensor combined = negative + scale * (positive - negative);
    const at::Tensor cond_norm = at::linalg_vector_norm(positive, 2, {-1}, /*keepdim=*/true);
    const at::Tensor noise_norm = at::linalg_vector_norm(combined, 2, {-1}, /*keepdim=*/true);
    return combined * (cond_norm / noise_norm);
}

Conditioning QwenImagePipeline::encode(const std::vector<std::string>& prompts,
                                       const protocol::CallValues& arguments) const {
    return encode_prompts(prompts, static_cast<int>(arguments.whole("max_sequence_length")));
}

LatentShape QwenImagePipeline::latents(int width, int height) const {
    // One frame of [C, H, W] (diffusers draws [1, 1, C, H, W]: the same numbers), packed 2x2.
    return packed_latents(c_->transformer_config.in_channels / 4, c_->vae_scale, width, height);
}

std::shared_ptr<const void> QwenImagePipeline::hold_transformer() const { return c_->transformer.use(); }

at::Tensor QwenImagePipeline::predict(const at::Tensor& latents, const LatentShape& shape,
                                      const Conditioning& text, double timestep, const protocol::CallValues&,
                                      const BlockRunner& blocks) const {
    // diffusers: the timestep in the latents' dtype, then / 1000.
    const at::Tensor t = at::full({latents.size(0)}, timestep,
                                  at::TensorOptions().dtype(options().dtype).device(latents.device())) /
                         1000;
    return c_->transformer.use()->forward(latents, text.text, text.mask, t, shape.height / 2, shape.width / 2,
                                          blocks);
}

at::Tensor QwenImagePipeline::combine(const at::Tensor& negative, const at::Tensor& positive,
                                      const protocol::CallValues& arguments) const {
    return true_cfg_guidance(negative, positive, guidance_scale(arguments));
}

at::Tensor QwenImagePipeline::decode(const at::Tensor& latents) const {
    return c_->vae.use()->decode(latents);
}

ImageLatents QwenImagePipeline::encode_image(const at::Tensor& pixels) const {
    const LatentDistribution d = c_->vae_encoder->encode(pixels);
    return {d.mean, d.std};
}

at::Tensor QwenImagePipeline::image_latents(const at::Tensor& sample) const {
    // (x - latents_mean) x (1 / latents_std), the statistics as float32 tensors in the sample's dtype.
    const int64_t z = c_->vae_config.z_dim;
    const auto stats = [&](const std::vector<double>& v) {
        return at::tensor(std::vector<float>(v.begin(), v.end()), at::kFloat).view({1, z, 1, 1});
    };
    const at::Tensor mean = stats(c_->vae_config.latents_mean).to(sample.device(), sample.scalar_type());
    const at::Tensor inverse_std =
        (1.0 / stats(c_->vae_config.latents_std)).to(sample.device(), sample.scalar_type());
    return (sample - mean) * inverse_std;
}

}  // namespace dp::runtime
