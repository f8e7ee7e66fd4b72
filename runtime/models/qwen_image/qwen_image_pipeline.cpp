#include "runtime/models/qwen_image/qwen_image_pipeline.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "runtime/io/config_json.h"
#include "runtime/io/errors.h"
#include "runtime/models/common/encoder_on_first_use.h"
#include "runtime/models/common/qwen2_text_encoder.h"
#include "runtime/models/common/qwen2_tokenizer.h"
#include "runtime/models/common/qwen2_vision.h"
#include "runtime/models/common/qwen_image_vae.h"
#include "runtime/models/qwen_image/qwen_image_transformer.h"
#include "runtime/parallel/parallel_context.h"
#include "runtime/pipeline/image_inputs.h"
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

// The edit pipelines' template (Note [Qwen-Image edits]), its pictures' placeholder (Edit-Plus
// numbers them) and the tokens dropped from its start.
constexpr const char* kEditPrefix =
    "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, objects, "
    "background), then explain how the user's text instruction should alter or modify the image. Generate a "
    "new "
    "image that meets the user's requirements while maintaining consistency with the original input where "
    "appropriate.<|im_end|>\n<|im_start|>user\n";
constexpr const char* kPicture = "<|vision_start|><|image_pad|><|vision_end|>";
constexpr int64_t kEditDrop = 64;
constexpr double kEditArea = 1024.0 * 1024.0;     // the VAE's pictures and the output's default
constexpr double kConditionArea = 384.0 * 384.0;  // Edit-Plus's pictures for the vision encoder

}  // namespace

struct QwenImagePipeline::Components : ComponentsBase {
    std::unique_ptr<Qwen2Tokenizer> tokenizer;
    Qwen2TextConfig text_config;
    // The edit pipelines' (Note [Qwen-Image edits]).
    Qwen2VisionConfig vision_config;
    Qwen2VLProcessorConfig processor;
    QwenImageTransformerConfig transformer_config;
    QwenImageVaeConfig vae_config;
    // Kept, or built for each use with PipelineOptions::offload (Note [offload]).
    Component<Qwen2TextEncoder> text_encoder;
    Component<QwenImageTransformer> transformer;
    Component<QwenImageVaeDecoder> vae;
    // Note [encoder on first use]
    std::unique_ptr<EncoderOnFirstUse<QwenImageVaeEncoder, QwenImageVaeConfig>> vae_encoder;
};

namespace {

// The processor's patches must be the vision tower's, its merged tokens the language model's width.
template <typename C>
void check_vision(const C& c, const std::string& dir) {
    const Qwen2VisionConfig& v = c.vision_config;
    const Qwen2VLProcessorConfig& p = c.processor;
    if (p.patch_size != v.patch_size || p.merge_size != v.spatial_merge_size ||
        p.temporal_patch_size != v.temporal_patch_size)
        throw ModelError(
            dir + ": processor/preprocessor_config.json makes patches of " + std::to_string(p.patch_size) +
            " pixels merged " + std::to_string(p.merge_size) + " x " + std::to_string(p.merge_size) +
            " (temporal " + std::to_string(p.temporal_patch_size) +
            "), but the text encoder's vision_config takes " + std::to_string(v.patch_size) + ", " +
            std::to_string(v.spatial_merge_size) + " and " + std::to_string(v.temporal_patch_size));
    if (v.out_hidden_size != c.text_config.hidden_size)
        throw ModelError(dir + ": the vision tower's out_hidden_size is " +
                         std::to_string(v.out_hidden_size) + " but the language model's hidden_size is " +
                         std::to_string(c.text_config.hidden_size));
    if (c.tokenizer->id_of("<|image_pad|>") != v.image_token_id)
        throw ModelError(dir + ": the tokenizer's <|image_pad|> is " +
                         std::to_string(c.tokenizer->id_of("<|image_pad|>")) +
                         " but text_encoder/config.json's image_token_id is " +
                         std::to_string(v.image_token_id));
}

}  // namespace

QwenImagePipeline::QwenImagePipeline(std::unique_ptr<Components> c, strategies::ModelInfo model)
    : FamilyPipeline(*c, std::move(model)), c_(std::move(c)) {}
QwenImagePipeline::~QwenImagePipeline() = default;

std::unique_ptr<QwenImagePipeline> QwenImagePipeline::load(const PipelineOptions& o,
                                                           const ParallelContext& parallel) {
    const std::string& dir = o.model_dir;
    strategies::ModelInfo model = model_info_of(o);
    const strategies::ParallelSpec& spec = *model.spec;
    require_loadable(o, spec);
    const Kind kind = spec.family == "qwen-image-edit"        ? Kind::kEdit
                      : spec.family == "qwen-image-edit-plus" ? Kind::kEditPlus
                                                              : Kind::kText;

    auto c = std::make_unique<Components>();
    c->start(o, parallel);
    c->tokenizer = std::make_unique<Qwen2Tokenizer>(Qwen2Tokenizer::from_folder(dir + "/tokenizer"));
    c->text_config = Qwen2TextConfig::from_json_file(dir + "/text_encoder/config.json");
    const bool vision = kind != Kind::kText;
    if (vision) {
        c->vision_config = Qwen2VisionConfig::from_json_file(dir + "/text_encoder/config.json");
        c->processor = Qwen2VLProcessorConfig::from_json_file(dir + "/processor/preprocessor_config.json");
        check_vision(*c, dir);
    }
    c->transformer_config = QwenImageTransformerConfig::from_json_file(dir + "/transformer/config.json");
    c->vae_config = QwenImageVaeConfig::from_json_file(dir + "/vae/config.json");
    const Components* self = c.get();
    const PipelineOptions* opts = &self->options;
    c->text_encoder = component_of<Qwen2TextEncoder>(
        opts, "text_encoder", 11, device_of(o, "text_encoder"), [self, &spec, vision](WeightStore& w) {
            return std::make_unique<Qwen2TextEncoder>(self->text_config, w, self->parallel->tensor(), spec,
                                                      vision ? &self->vision_config : nullptr);
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
    auto pipeline = std::unique_ptr<QwenImagePipeline>(new QwenImagePipeline(std::move(c), std::move(model)));
    pipeline->kind_ = kind;
    return pipeline;
}

bool QwenImagePipeline::components_kept() const {
    return c_->text_encoder.kept() && c_->transformer.kept() && c_->vae.kept();
}

Conditioning QwenImagePipeline::encode_prompts(const std::vector<std::string>& prompts,
                                               int max_sequence_length) const {
    const Components& c = *c_;
    check_max_sequence_length(max_sequence_length, kMaxSequenceLength);
    std::vector<std::string> warnings(prompts.size());
    std::vector<int64_t> lengths;  // each prompt's kept tokens
    // Each prompt in its template, truncated where the tokenizer truncates, padded on the right.
    std::vector<std::vector<int64_t>> rows;
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
            warnings[k] = "the prompt's text was cut to max_sequence_length " +
                          std::to_string(max_sequence_length) + " tokens (" +
                          std::to_string(kept - max_sequence_length) + " tokens dropped)";
        lengths.push_back(std::min<int64_t>(kept, max_sequence_length));
        rows.push_back(std::move(ids));
    }
    const int64_t pad = c.tokenizer->pad_id() >= 0 ? c.tokenizer->pad_id() : 0;
    const auto [input, input_mask] = padded_rows(rows, pad, device_of(c.options, "text_encoder"));
    const at::Tensor hidden =
        to_transformer(c.text_encoder.use()->forward(input, input_mask), "text_encoder");
    Conditioning e = kept_tokens(hidden, lengths, kTemplateDrop);
    e.warnings = std::move(warnings);
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
    if (kind_ != Kind::kText)
        return encode_edit_prompts(prompts, arguments.image("image"),
                                   arguments.whole("sequential_positions") != 0);
    return encode_prompts(prompts, static_cast<int>(arguments.whole("max_sequence_length")));
}

Conditioning QwenImagePipeline::encode_edit_prompts(const std::vector<std::string>& prompts,
                                                    const protocol::InputImage& image,
                                                    bool sequential) const {
    const Components& c = *c_;
    const std::shared_ptr<const Qwen2TextEncoder> encoder = c.text_encoder.use();
    if (!encoder->vision())
        throw ModelError(model().spec->display_name +
                         ": the text encoder was loaded without its vision tower");
    if (image.empty())
        throw ModelError(model().spec->display_name + "'s pipeline needs an image on every line");
    // Each picture resized for the vision encoder from the original (PIL's Lanczos), then the processor's.
    std::vector<VisionPatches> pictures;
    std::string placeholders;
    const std::vector<protocol::InputImage> all = image.pictures();
    for (std::size_t k = 0; k < all.size(); ++k) {
        const protocol::InputImage& p = all[k];
        const auto [w, h] = strategies::area_dimensions(kind_ == Kind::kEdit ? kEditArea : kConditionArea,
                                                        p.width, p.height, 32);
        pictures.push_back(
            qwen2vl_patches(input_rgb(p, static_cast<int>(w), static_cast<int>(h)), c.processor));
        placeholders += kind_ == Kind::kEdit ? std::string(kPicture)
                                             : "Picture " + std::to_string(k + 1) + ": " + kPicture;
    }
    // Each <|image_pad|> stands for its picture's merged tokens (the processor's expansion).
    const int64_t image_token = c.vision_config.image_token_id, merge = c.vision_config.spatial_merge_size;
    std::vector<std::vector<int64_t>> rows;
    std::vector<int64_t> lengths;  // each row's tokens after the template's first 64: all of them
    for (const std::string& prompt : prompts) {
        std::vector<int64_t> row;
        std::size_t next = 0;
        for (int64_t id : c.tokenizer->tokenize(kEditPrefix + placeholders + prompt + kTemplateSuffix)) {
            const int64_t copies =
                id == image_token && next < pictures.size() ? pictures[next++].tokens(merge) : 1;
            row.insert(row.end(), static_cast<std::size_t>(copies), id);
        }
        if (next != pictures.size() || static_cast<int64_t>(row.size()) <= kEditDrop)
            throw ModelError("the tokenizer makes " + std::to_string(next) + " image placeholders of " +
                             std::to_string(pictures.size()) + " pictures and " + std::to_string(row.size()) +
                             " tokens of the edit template: this tokenizer is not Qwen2.5-VL's");
        lengths.push_back(static_cast<int64_t>(row.size()) - kEditDrop);
        rows.push_back(std::move(row));
    }
    const at::Device device = device_of(c.options, "text_encoder");
    const int64_t pad = c.tokenizer->pad_id() >= 0 ? c.tokenizer->pad_id() : 0;
    const auto [input, input_mask] = padded_rows(rows, pad, device);
    at::Tensor streams;  // [3, n, L]: each row's three position streams, its padding at 0
    if (!sequential) {
        std::vector<at::Tensor> positions;
        for (const std::vector<int64_t>& row : rows) {
            std::vector<int64_t> padded = row;
            padded.resize(static_cast<std::size_t>(input.size(1)), pad);
            positions.push_back(
                qwen2vl_positions(padded, static_cast<int64_t>(row.size()), image_token, pictures, merge));
        }
        streams = at::stack(positions, 1).to(device);
    }
    const at::Tensor seen = encoder->vision()->forward(pictures);
    const int64_t n = static_cast<int64_t>(prompts.size());
    const at::Tensor hidden = to_transformer(
        encoder->forward(input, input_mask, streams, seen.repeat({n, 1}), image_token), "text_encoder");
    return kept_tokens(hidden, lengths, kEditDrop);  // nothing cut
}

std::vector<std::pair<int64_t, int64_t>> QwenImagePipeline::reference_sizes(
    const protocol::InputImage& image) const {
    std::vector<std::pair<int64_t, int64_t>> out;
    const strategies::FamilyFacts& facts = strategies::facts_of(*model().spec);
    for (const protocol::InputImage& p : image.pictures())
        out.push_back(facts.reference_size(p.width, p.height, model().sizes.multiple()));
    return out;
}

std::optional<EditCondition> QwenImagePipeline::edit_condition(const protocol::InputImage& image,
                                                               const protocol::InputImage&,
                                                               const LatentShape&) const {
    if (kind_ == Kind::kText) return std::nullopt;
    // Each picture resized for the VAE from the original, its mean normalised and packed; in order.
    std::vector<at::Tensor> tokens;
    const std::vector<protocol::InputImage> all = image.pictures();
    const std::vector<std::pair<int64_t, int64_t>> sizes = reference_sizes(image);
    for (std::size_t k = 0; k < all.size(); ++k) {
        const auto [w, h] = sizes[k];
        if (w < 1 || h < 1)
            throw ModelError(all[k].path + ": too small a picture for " + model().spec->display_name);
        const ImageLatents d = encode_on_cpu(input_pixels(all[k], static_cast<int>(w), static_cast<int>(h)));
        tokens.push_back(pack_latents(image_latents(d.mean)));
    }
    EditCondition e;
    e.latents.mean = at::cat(tokens, 1);
    e.ready = true;
    return e;
}

LatentShape QwenImagePipeline::latents(int width, int height) const {
    // One frame of [C, H, W] (diffusers draws [1, 1, C, H, W]: the same numbers), packed 2x2.
    return packed_latents(c_->transformer_config.in_channels / 4, c_->vae_scale, width, height);
}

std::shared_ptr<const void> QwenImagePipeline::hold_transformer() const { return c_->transformer.use(); }

at::Tensor QwenImagePipeline::predict(const at::Tensor& latents, const LatentShape& shape,
                                      const Conditioning& text, double timestep,
                                      const protocol::CallValues& arguments,
                                      const BlockRunner& blocks) const {
    // diffusers: the timestep in the latents' dtype, then / 1000.
    const at::Tensor t = at::full({latents.size(0)}, timestep,
                                  at::TensorOptions().dtype(options().dtype).device(latents.device())) /
                         1000;
    QwenReference reference;  // an edit's pictures after the latents (Note [Qwen-Image edits])
    if (text.image.defined()) {
        reference.tokens = text.image;
        const int64_t side = c_->vae_scale * 2;
        for (const auto& [w, h] : reference_sizes(arguments.image("image")))
            reference.grids.push_back({h / side, w / side});
    }
    return c_->transformer.use()->forward(latents, text.text, text.mask, t, shape.height / 2, shape.width / 2,
                                          blocks, reference);
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
