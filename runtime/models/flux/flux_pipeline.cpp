#include "runtime/models/flux/flux_pipeline.h"

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
#include "runtime/models/flux/flux_transformer.h"
#include "runtime/parallel/parallel_context.h"
#include "runtime/pipeline/image_inputs.h"
#include "runtime/pipeline/pipeline_common.h"
#include "strategies/family.h"
#include "strategies/parallel_spec.h"

namespace dp::runtime {
namespace {

constexpr int kMaxSequenceLength = 512;  // diffusers refuses more

}  // namespace

struct FluxPipeline::Components : ComponentsBase {
    std::unique_ptr<ClipTokenizer> tokenizer;
    std::unique_ptr<T5Tokenizer> tokenizer_2;
    ClipTextConfig text_config;
    T5Config t5_config;
    FluxTransformerConfig transformer_config;
    VaeConfig vae_config;
    // Kept, or built for each use with PipelineOptions::offload (Note [offload]).
    Component<ClipTextEncoder> text_encoder;
    Component<T5Encoder> text_encoder_2;
    Component<FluxTransformer> transformer;
    Component<VaeDecoder> vae;
    std::unique_ptr<EncoderOnFirstUse<VaeEncoder, VaeConfig>> vae_encoder;  // Note [encoder on first use]
};

FluxPipeline::FluxPipeline(std::unique_ptr<Components> c, strategies::ModelInfo model)
    : FamilyPipeline(*c, std::move(model)), c_(std::move(c)) {}
FluxPipeline::~FluxPipeline() = default;

std::unique_ptr<FluxPipeline> FluxPipeline::load(const PipelineOptions& o, const ParallelContext& parallel) {
    const std::string& dir = o.model_dir;
    strategies::ModelInfo model = model_info_of(o);
    const strategies::ParallelSpec& spec = *model.spec;
    if (o.no_t5) throw ModelError("--no-t5: FLUX.1's text is T5's alone; it cannot run without it");
    require_loadable(o, spec);
    const Kind kind = spec.family == "flux-fill"      ? Kind::kFill
                      : spec.family == "flux-kontext" ? Kind::kKontext
                                                      : Kind::kText;

    auto c = std::make_unique<Components>();
    c->start(o, parallel);
    c->tokenizer = std::make_unique<ClipTokenizer>(ClipTokenizer::from_folder(dir + "/tokenizer"));
    c->tokenizer_2 = std::make_unique<T5Tokenizer>(T5Tokenizer::from_folder(dir + "/tokenizer_2"));
    c->text_config = ClipTextConfig::from_json_file(dir + "/text_encoder/config.json");
    if (c->text_config.projection)
        throw ModelError(dir +
                         "/text_encoder/config.json: architectures names CLIPTextModelWithProjection, but "
                         "FluxPipeline conditions on CLIPTextModel's pooled output (no text_projection); use "
                         "the model's own text_encoder (architectures [\"CLIPTextModel\"])");
    c->t5_config = T5Config::from_json_file(dir + "/text_encoder_2/config.json");
    c->transformer_config = FluxTransformerConfig::from_json_file(dir + "/transformer/config.json");
    c->vae_config = VaeConfig::from_json_file(dir + "/vae/config.json");
    const Components* self = c.get();
    const PipelineOptions* opts = &self->options;
    // The transformer's device is block 0's, which require_loadable checks is the run's.
    c->text_encoder = component_of<ClipTextEncoder>(
        opts, "text_encoder", 21, device_of(o, "text_encoder"),
        [self](WeightStore& w) { return std::make_unique<ClipTextEncoder>(self->text_config, w); });
    c->text_encoder_2 = component_of<T5Encoder>(
        opts, "text_encoder_2", 22, device_of(o, "text_encoder_2"), [self, &spec](WeightStore& w) {
            return std::make_unique<T5Encoder>(self->t5_config, w, self->parallel->tensor(), spec);
        });
    c->transformer = component_of<FluxTransformer>(
        opts, "transformer", 23, device_of(o, "transformer"), [self](WeightStore& w) {
            return std::make_unique<FluxTransformer>(self->transformer_config, w, *self->parallel,
                                                     self->options.device_map);
        });
    c->vae = component_of<VaeDecoder>(opts, "vae", 24, device_of(o, "vae"), [self](WeightStore& w) {
        return std::make_unique<VaeDecoder>(self->vae_config, w);
    });
    c->vae_encoder = std::make_unique<EncoderOnFirstUse<VaeEncoder, VaeConfig>>(opts, &self->vae_config, 24);
    c->vae_scale = c->vae_config.scale_factor();

    // The pieces must fit together.
    const FluxTransformerConfig& t = c->transformer_config;
    if (c->text_config.hidden_size != t.pooled_projection_dim)
        throw ModelError(dir + ": the CLIP text encoder's hidden_size is " +
                         std::to_string(c->text_config.hidden_size) +
                         " but transformer/config.json pooled_projection_dim is " +
                         std::to_string(t.pooled_projection_dim));
    if (c->t5_config.d_model != t.joint_attention_dim)
        throw ModelError(dir + ": T5's d_model is " + std::to_string(c->t5_config.d_model) +
                         " but transformer/config.json joint_attention_dim is " +
                         std::to_string(t.joint_attention_dim));
    // The latents packed 2x2; Fill's beside them the masked image's (as many) and the mask's pixels
    // under each latent (vae_scale^2 channels, packed as well).
    const int64_t z = c->vae_config.latent_channels, s = c->vae_scale;
    const int64_t in = kind == Kind::kFill ? 2 * z * 4 + s * s * 4 : z * 4;
    if (t.in_channels != in || t.out_channels != z * 4)
        throw ModelError(
            dir + ": the transformer takes " + std::to_string(t.in_channels) + " channels and makes " +
            std::to_string(t.out_channels) + ", but " + spec.pipeline_class + " packs the VAE's " +
            std::to_string(z) + " latent channels in 2x2 patches" +
            (kind == Kind::kFill ? ", with the masked image's and the mask's beside them" : "") +
            " (in_channels " + std::to_string(in) + ", out_channels " + std::to_string(z * 4) + ")");
    auto pipeline = std::unique_ptr<FluxPipeline>(new FluxPipeline(std::move(c), std::move(model)));
    pipeline->pipeline_ = kind;
    return pipeline;
}

bool FluxPipeline::components_kept() const {
    return c_->text_encoder.kept() && c_->text_encoder_2.kept() && c_->transformer.kept() && c_->vae.kept();
}

bool FluxPipeline::guidance_embeds() const { return c_->transformer_config.guidance_embeds; }

FluxPromptEmbeddings FluxPipeline::encode_prompts(const std::vector<std::string>& prompts,
                                                  int max_sequence_length) const {
    const Components& c = *c_;
    check_max_sequence_length(max_sequence_length, kMaxSequenceLength);
    const int64_t n = static_cast<int64_t>(prompts.size());
    FluxPromptEmbeddings e;
    e.truncation.assign(prompts.size(), "");
    // CLIP: its tokenizer's 77, truncated; the pooled output only.
    std::vector<int64_t> ids = clip_ids(*c.tokenizer, prompts, &e.truncation);
    at::Tensor input = at::tensor(ids, at::kLong).view({n, -1}).to(device_of(c.options, "text_encoder"));
    e.pooled = to_transformer(c.text_encoder.use()->forward(input).pooled, "text_encoder");
    // T5: max_sequence_length tokens, padded, no mask.
    ids = t5_ids(*c.tokenizer_2, prompts, max_sequence_length, e.truncation);
    input = at::tensor(ids, at::kLong).view({n, -1}).to(device_of(c.options, "text_encoder_2"));
    e.sequence = to_transformer(c.text_encoder_2.use()->forward(input), "text_encoder_2");
    return e;
}

Conditioning FluxPipeline::encode(const std::vector<std::string>& prompts,
                                  const protocol::CallValues& arguments) const {
    FluxPromptEmbeddings e =
        encode_prompts(prompts, static_cast<int>(arguments.whole("max_sequence_length")));
    Conditioning c;
    c.text = std::move(e.sequence);
    c.pooled = std::move(e.pooled);
    c.warnings = std::move(e.truncation);
    return c;
}

LatentShape FluxPipeline::latents(int width, int height) const {
    // [C, H, W] with H and W even, in the text's dtype, packed 2x2 for the transformer.
    return packed_latents(c_->vae_config.latent_channels, c_->vae_scale, width, height);
}

std::shared_ptr<const void> FluxPipeline::hold_transformer() const { return c_->transformer.use(); }

at::Tensor FluxPipeline::predict(const at::Tensor& latents, const LatentShape& shape,
                                 const Conditioning& text, double timestep,
                                 const protocol::CallValues& arguments, const BlockRunner& blocks) const {
    const FluxTransformerConfig& tc = c_->transformer_config;
    const int64_t rows = latents.size(0);
    const at::TensorOptions on_device = at::TensorOptions().device(latents.device());
    // diffusers: the timestep in the latents' dtype, then / 1000; dev's guidance scale in fp32.
    const at::Tensor t = at::full({rows}, timestep, on_device.dtype(options().dtype)) / 1000;
    const at::Tensor embedded =
        tc.guidance_embeds ? at::full({rows}, arguments.number("guidance_scale"), on_device.dtype(at::kFloat))
                           : at::Tensor();
    // Note [edit conditioning]: Fill's beside the latents on channels, Kontext's after them.
    at::Tensor input = latents;
    FluxReference reference;
    if (pipeline_ == Kind::kFill && !text.image.defined())
        throw ModelError("FLUX.1-Fill's pipeline (FluxFillPipeline) needs an image and a mask_image");
    if (text.image.defined()) {
        const at::Tensor packed = pack_latents(text.image);
        if (pipeline_ == Kind::kKontext)
            reference = {packed, text.image.size(2) / 2, text.image.size(3) / 2};
        else
            input = at::cat({latents, packed}, 2);
    }
    return c_->transformer.use()->forward(input, text.text, text.pooled, t, embedded, shape.height / 2,
                                          shape.width / 2, blocks, reference);
}

at::Tensor FluxPipeline::decode(const at::Tensor& latents) const {
    return c_->vae.use()->decode(latents);  // latents / scaling_factor + shift_factor, then the decoder
}

ImageLatents FluxPipeline::encode_image(const at::Tensor& pixels) const {
    const LatentDistribution d = c_->vae_encoder->encode(pixels);
    return {d.mean, d.std};
}

at::Tensor FluxPipeline::image_latents(const at::Tensor& sample) const {
    return (sample - c_->vae_config.shift_factor) * c_->vae_config.scaling_factor;
}

std::optional<EditCondition> FluxPipeline::edit_condition(const protocol::InputImage& image,
                                                          const protocol::InputImage& mask,
                                                          const LatentShape& shape) const {
    EditCondition e;
    if (pipeline_ == Kind::kKontext) {
        // Resized to the preferred resolution nearest its ratio; the mean ("argmax"), no draw.
        const strategies::FamilyFacts& facts = strategies::facts_of(*model().spec);
        const auto [w, h] = facts.reference_size(image.width, image.height, model().sizes.multiple());
        if (w < 1 || h < 1)
            throw ModelError(image.path + ": " + std::to_string(image.width) + " x " +
                             std::to_string(image.height) +
                             " pixels is too small a reference for FLUX.1-Kontext");
        e.latents = encode_on_cpu(input_pixels(image, static_cast<int>(w), static_cast<int>(h)));
        return e;
    }
    if (pipeline_ != Kind::kFill) return std::nullopt;
    if (mask.empty())
        throw ModelError("FLUX.1-Fill's pipeline (FluxFillPipeline) needs a mask_image with the image");
    // FluxFillPipeline.prepare_mask_latents: the image with the mask's white part blacked out
    // (to 0, mid-grey), encoded and sampled; the binarized mask's s x s pixels under each latent as
    // s^2 channels, in (row, column) order within the latent.
    const int64_t s = c_->vae_scale, h = shape.height, w = shape.width;
    const at::Tensor pixels = input_pixels(image, static_cast<int>(w * s), static_cast<int>(h * s));
    const at::Tensor m = input_mask(mask, static_cast<int>(w * s), static_cast<int>(h * s));
    e.latents = encode_on_cpu(pixels * (1 - m));
    e.sampled = true;
    e.channels = m.select(1, 0).view({1, h, s, w, s}).permute({0, 2, 4, 1, 3}).reshape({1, s * s, h, w});
    return e;
}

}  // namespace dp::runtime
