#include "runtime/models/sd3/sd3_pipeline.h"

#include <ATen/ATen.h>

#include "runtime/io/config_json.h"
#include "runtime/io/errors.h"
#include "runtime/models/common/clip_text_encoder.h"
#include "runtime/models/common/clip_tokenizer.h"
#include "runtime/models/common/encoder_on_first_use.h"
#include "runtime/models/common/prompt_tokens.h"
#include "runtime/models/common/t5_encoder.h"
#include "runtime/models/common/t5_tokenizer.h"
#include "runtime/models/common/vae_decoder.h"
#include "runtime/models/sd3/sd3_transformer.h"
#include "runtime/parallel/guidance.h"
#include "runtime/parallel/parallel_context.h"
#include "runtime/pipeline/pipeline_common.h"
#include "strategies/family.h"
#include "strategies/model_config.h"
#include "strategies/parallel_spec.h"

namespace dp::runtime {

namespace {

constexpr int kMaxT5SequenceLength = 512;  // diffusers refuses more

}  // namespace

struct Sd3Pipeline::Components : ComponentsBase {
    std::unique_ptr<ClipTokenizer> tokenizer, tokenizer_2;
    ClipTextConfig text_config, text_config_2;
    T5Config t5_config;
    Sd3TransformerConfig transformer_config;
    VaeConfig vae_config;
    // Kept, or built for each use with PipelineOptions::offload (Note [offload]).
    Component<ClipTextEncoder> text_encoder, text_encoder_2;
    std::unique_ptr<T5Tokenizer> tokenizer_3;  // null: no T5 (absent, or PipelineOptions::no_t5)
    Component<T5Encoder> text_encoder_3;
    Component<Sd3Transformer> transformer;
    bool has_vae = false;  // false: pixel space
    Component<VaeDecoder> vae;
    std::unique_ptr<EncoderOnFirstUse<VaeEncoder, VaeConfig>> vae_encoder;  // Note [encoder on first use]
    std::vector<std::pair<std::string, std::vector<std::pair<std::string, at::Tensor>>>> parameters;
};

Sd3Pipeline::Sd3Pipeline(std::unique_ptr<Components> c, strategies::ModelInfo model)
    : FamilyPipeline(*c, std::move(model)), c_(std::move(c)) {}
Sd3Pipeline::~Sd3Pipeline() = default;

std::unique_ptr<Sd3Pipeline> Sd3Pipeline::load(const PipelineOptions& o, const ParallelContext& parallel) {
    const std::string& dir = o.model_dir;
    const ConfigJson index = ConfigJson::from_file(dir + "/model_index.json");
    require_loadable(o, strategies::family_spec("sd3"));
    strategies::ModelInfo model = model_info_of(o);
    const bool t5 = !component_class(index, "text_encoder_3").empty() && !o.no_t5;
    auto c = std::make_unique<Components>();
    c->start(o, parallel);
    c->tokenizer = std::make_unique<ClipTokenizer>(ClipTokenizer::from_folder(dir + "/tokenizer"));
    c->tokenizer_2 = std::make_unique<ClipTokenizer>(ClipTokenizer::from_folder(dir + "/tokenizer_2"));
    c->text_config = ClipTextConfig::from_json_file(dir + "/text_encoder/config.json");
    c->text_config_2 = ClipTextConfig::from_json_file(dir + "/text_encoder_2/config.json");
    c->transformer_config = Sd3TransformerConfig::from_json_file(dir + "/transformer/config.json");
    c->has_vae = !component_class(index, "vae").empty();
    if (c->has_vae) c->vae_config = VaeConfig::from_json_file(dir + "/vae/config.json");
    if (t5) {
        c->tokenizer_3 = std::make_unique<T5Tokenizer>(T5Tokenizer::from_folder(dir + "/tokenizer_3"));
        c->t5_config = T5Config::from_json_file(dir + "/text_encoder_3/config.json");
    }
    // Each component from its weights on its device; kept (its parameters listed when training),
    // or built at each use with offload.
    Components* self = c.get();
    const PipelineOptions* opts = &self->options;
    auto* params = &self->parameters;
    c->text_encoder = component_of<ClipTextEncoder>(
        opts, "text_encoder", 1, device_of(o, "text_encoder"),
        [self](WeightStore& w) { return std::make_unique<ClipTextEncoder>(self->text_config, w); }, params);
    c->text_encoder_2 = component_of<ClipTextEncoder>(
        opts, "text_encoder_2", 2, device_of(o, "text_encoder_2"),
        [self](WeightStore& w) { return std::make_unique<ClipTextEncoder>(self->text_config_2, w); }, params);
    if (t5)
        c->text_encoder_3 = component_of<T5Encoder>(
            opts, "text_encoder_3", 5, device_of(o, "text_encoder_3"),
            [self](WeightStore& w) {
                return std::make_unique<T5Encoder>(self->t5_config, w, self->parallel->tensor());
            },
            params);
    c->transformer = component_of<Sd3Transformer>(
        opts, "transformer", 3, o.device,
        [self](WeightStore& w) {
            return std::make_unique<Sd3Transformer>(self->transformer_config, w, *self->parallel,
                                                    self->options.device_map);
        },
        params);
    if (c->has_vae) {
        c->vae = component_of<VaeDecoder>(
            opts, "vae", 4, device_of(o, "vae"),
            [self](WeightStore& w) { return std::make_unique<VaeDecoder>(self->vae_config, w); }, params);
        c->vae_encoder =
            std::make_unique<EncoderOnFirstUse<VaeEncoder, VaeConfig>>(opts, &self->vae_config, 4);
        c->vae_scale = c->vae_config.scale_factor();
    }

    // The pieces must fit together.
    const Sd3TransformerConfig& t = c->transformer_config;
    const int64_t pooled = c->text_config.projection_dim + c->text_config_2.projection_dim;
    if (pooled != t.pooled_projection_dim)
        throw ModelError(dir + ": the text encoders' projections add up to " + std::to_string(pooled) +
                         " but transformer/config.json pooled_projection_dim is " +
                         std::to_string(t.pooled_projection_dim));
    const int64_t channels = c->has_vae ? c->vae_config.latent_channels : 3;
    if (t.in_channels != channels || t.out_channels != channels)
        throw ModelError(dir + ": the transformer works on " + std::to_string(t.in_channels) +
                         " channels but " +
                         (c->has_vae ? "the VAE's latents have " : "pixel space (no VAE) has ") +
                         std::to_string(channels));
    if (!c->has_vae && t.out_channels != 3)
        throw ModelError(dir + ": a pipeline without a VAE must produce 3 channels");
    return std::unique_ptr<Sd3Pipeline>(new Sd3Pipeline(std::move(c), std::move(model)));
}

namespace {

// diffusers' F.pad(x, (0, n)) on the last dimension: pads with zeros, or crops when n < 0.
at::Tensor pad_last(const at::Tensor& x, int64_t to) {
    const int64_t have = x.size(-1);
    if (have == to) return x;
    if (have > to) return x.narrow(-1, 0, to);
    return at::constant_pad_nd(x, {0, to - have}, 0);
}

}  // namespace

PromptEmbeddings Sd3Pipeline::encode_prompts(const std::vector<std::string>& prompts,
                                             int max_sequence_length) const {
    // Both CLIP encoders over the batch, then T5's max_sequence_length positions (zeros without T5).
    const Components& c = *c_;
    check_max_sequence_length(max_sequence_length, kMaxT5SequenceLength);
    const Sd3TransformerConfig& tc = c.transformer_config;
    const int64_t n = static_cast<int64_t>(prompts.size());
    PromptEmbeddings e;
    e.truncation.assign(prompts.size(), "");
    std::vector<at::Tensor> hidden, pooled;
    for (int which = 0; which < 2; ++which) {
        const ClipTokenizer& tok = which == 0 ? *c.tokenizer : *c.tokenizer_2;
        const std::shared_ptr<const ClipTextEncoder> enc =
            which == 0 ? c.text_encoder.use() : c.text_encoder_2.use();
        // Diffusers warns of the first CLIP's cut only.
        const std::vector<int64_t> ids = clip_ids(tok, prompts, which == 0 ? &e.truncation : nullptr);
        const char* component = which == 0 ? "text_encoder" : "text_encoder_2";
        const at::Tensor input = at::tensor(ids, at::kLong).view({n, -1}).to(device_of(c.options, component));
        ClipTextOutput out = enc->forward(input);
        hidden.push_back(to_transformer(out.hidden, component));
        pooled.push_back(to_transformer(out.pooled, component));
    }
    const at::Tensor clip = pad_last(at::cat(hidden, -1), tc.joint_attention_dim);
    e.pooled = at::cat(pooled, -1);
    if (!c.tokenizer_3) {  // Note [constant text tail]: one zero position stands for all of them
        e.sequence = at::cat({clip, at::zeros({n, 1, tc.joint_attention_dim}, clip.options())}, -2);
        e.tail_repeats = max_sequence_length;
        return e;
    }
    const std::vector<int64_t> ids = t5_ids(*c.tokenizer_3, prompts, max_sequence_length, e.truncation);
    const at::Tensor input =
        at::tensor(ids, at::kLong).view({n, -1}).to(device_of(c.options, "text_encoder_3"));
    const at::Tensor t5 = to_transformer(c.text_encoder_3.use()->forward(input), "text_encoder_3");
    e.sequence = at::cat({clip, t5}, -2);
    e.tail_repeats = 1;
    return e;
}

const Sd3Transformer& Sd3Pipeline::transformer() const {
    if (!c_->transformer.kept()) throw InternalError("Sd3Pipeline::transformer: not kept with offload");
    return *c_->transformer.kept();
}

const std::vector<std::pair<std::string, std::vector<std::pair<std::string, at::Tensor>>>>&
Sd3Pipeline::parameters() const {
    return c_->parameters;
}

Conditioning Sd3Pipeline::encode(const std::vector<std::string>& prompts,
                                 const protocol::CallValues& arguments) const {
    PromptEmbeddings e = encode_prompts(prompts, static_cast<int>(arguments.whole("max_sequence_length")));
    Conditioning c;
    c.text = std::move(e.sequence);
    c.pooled = std::move(e.pooled);
    c.tail_repeats = e.tail_repeats;
    c.warnings = std::move(e.truncation);
    return c;
}

LatentShape Sd3Pipeline::latents(int width, int height) const {
    const int64_t p = c_->transformer_config.patch_size;
    LatentShape s;
    s.channels = c_->transformer_config.in_channels;
    s.height = height / c_->vae_scale;
    s.width = width / c_->vae_scale;
    s.tokens = (s.height / p) * (s.width / p);
    return s;
}

std::shared_ptr<const void> Sd3Pipeline::hold_transformer() const { return c_->transformer.use(); }

namespace {

// The scheduler's timestep for each row, fp32 as StableDiffusion3Pipeline passes it.
at::Tensor timesteps(double timestep, const at::Tensor& latents) {
    return at::full({latents.size(0)}, timestep, latents.options().dtype(at::kFloat));
}

}  // namespace

at::Tensor Sd3Pipeline::predict(const at::Tensor& latents, const LatentShape&, const Conditioning& text,
                                double timestep, const protocol::CallValues&,
                                const BlockRunner& blocks) const {
    return c_->transformer.use()->forward(latents, text.text, text.pooled, timesteps(timestep, latents),
                                          text.tail_repeats, {}, blocks);
}

bool Sd3Pipeline::extra_at(int step, int steps, const protocol::CallValues& arguments) const {
    return !arguments.blocks("skip_guidance_layers").empty() &&
           step > steps * arguments.number("skip_layer_guidance_start") &&
           step < steps * arguments.number("skip_layer_guidance_stop");
}

at::Tensor Sd3Pipeline::predict_extra(const at::Tensor& latents, const LatentShape&,
                                      const Conditioning& positive, double timestep,
                                      const protocol::CallValues& arguments) const {
    return c_->transformer.use()->forward(latents, positive.text, positive.pooled,
                                          timesteps(timestep, latents), positive.tail_repeats,
                                          arguments.blocks("skip_guidance_layers"));
}

at::Tensor Sd3Pipeline::combine_extra(const at::Tensor& negative, const at::Tensor& positive,
                                      const at::Tensor& extra, const protocol::CallValues& arguments) const {
    return linear_guidance(negative, positive, guidance_scale(arguments)) +
           (positive - extra) * arguments.number("skip_layer_guidance_scale");
}

at::Tensor Sd3Pipeline::decode(const at::Tensor& latents) const {
    return c_->has_vae ? c_->vae.use()->decode(latents) : latents;  // pixel space: the latents are the image
}

at::Tensor Sd3Pipeline::decode_inpainted(const at::Tensor& latents) const {
    // StableDiffusion3InpaintPipeline decodes latents / scaling_factor, without the shift its text
    // to image and img2img pipelines add (diffusers 0.42.1): the same image as it.
    return c_->has_vae ? c_->vae.use()->decode(latents, false) : latents;
}

const char* Sd3Pipeline::decoder() const { return c_->has_vae ? "vae" : nullptr; }

ImageLatents Sd3Pipeline::encode_image(const at::Tensor& pixels) const {
    if (!c_->has_vae) return {pixels, at::zeros_like(pixels)};  // pixel space: the image is its own latents
    const LatentDistribution d = c_->vae_encoder->encode(pixels);
    return {d.mean, d.std};
}

at::Tensor Sd3Pipeline::image_latents(const at::Tensor& sample) const {
    if (!c_->has_vae) return sample;
    return (sample - c_->vae_config.shift_factor) * c_->vae_config.scaling_factor;
}

std::string Sd3Pipeline::inpainting_refusal() const {
    const int64_t channels = c_->transformer_config.in_channels;
    if (channels == 16) return {};
    return "mask_image: StableDiffusion3InpaintPipeline blends a mask only for a transformer of 16 latent "
           "channels, and this model's takes " +
           std::to_string(channels) + " (leave the mask out for an img2img edit)";
}

}  // namespace dp::runtime
