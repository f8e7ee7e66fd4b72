#include "runtime/models/flux/flux_pipeline.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "runtime/errors.h"
#include "runtime/models/common/clip_text_encoder.h"
#include "runtime/models/common/clip_tokenizer.h"
#include "runtime/models/common/config_json.h"
#include "runtime/models/common/flow_match_scheduler.h"
#include "runtime/models/common/pipeline_common.h"
#include "runtime/models/common/t5_encoder.h"
#include "runtime/models/common/t5_tokenizer.h"
#include "runtime/models/common/vae_decoder.h"
#include "runtime/models/flux/flux_transformer.h"
#include "runtime/parallel/device_mapping.h"
#include "runtime/parallel/guidance.h"
#include "runtime/parallel/parallel_context.h"
#include "strategies/parallel_spec.h"

namespace dp::runtime {
namespace {

constexpr int kMaxSequenceLength = 512;  // diffusers refuses more
constexpr int kDefaultSampleSize = 128;  // FluxPipeline's default_sample_size: latents a side

// numpy.linspace(1, 1 / steps, steps), FluxPipeline's sigmas, with its exact last element.
std::vector<double> flux_sigmas(int steps) {
    std::vector<double> s(static_cast<std::size_t>(steps), 1.0);
    if (steps < 2) return s;
    const double step = (1.0 / steps - 1.0) / (steps - 1);
    for (int i = 0; i < steps; ++i) s[static_cast<std::size_t>(i)] = i * step + 1.0;
    s.back() = 1.0 / steps;
    return s;
}

// The component `name` built by `build` from its weights on its device (the transformer's: block 0's,
// which load() checks is the run's), every weight taken; kept, or built at each use with offload
// (Note [offload]). `options` must outlive it.
template <class T, class Build>
Component<T> component_of(const PipelineOptions* options, const char* name, uint64_t salt, Build build) {
    return Component<T>(
        [options, name, salt, build] {
            WeightStore w = open_weights(*options, name, salt, device_of(*options, name));
            std::unique_ptr<T> m = build(w);
            w.check_all_taken();
            return m;
        },
        options->offload);
}

}  // namespace

struct FluxPipeline::Components {
    PipelineOptions options;
    const ParallelContext* parallel = nullptr;
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
    FlowMatchSchedulerConfig scheduler;
    int64_t vae_scale = 8;
};

FluxPipeline::FluxPipeline(std::unique_ptr<Components> c) : c_(std::move(c)) {}
FluxPipeline::~FluxPipeline() = default;

std::unique_ptr<FluxPipeline> FluxPipeline::load(const PipelineOptions& o) {
    return load(o, ParallelContext::single());
}

std::unique_ptr<FluxPipeline> FluxPipeline::load(const PipelineOptions& o, const ParallelContext& parallel) {
    const std::string& dir = o.model_dir;
    const strategies::ParallelSpec& spec = strategies::flux_parallel_spec();
    if (o.no_t5) throw ModelError("--no-t5: FLUX.1's text is T5's alone; it cannot run without it");
    require_loadable(o, spec);

    auto c = std::make_unique<Components>();
    c->options = o;
    c->parallel = &parallel;
    c->scheduler = FlowMatchSchedulerConfig::from_json_file(dir + "/scheduler/scheduler_config.json");
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
    c->text_encoder = component_of<ClipTextEncoder>(opts, "text_encoder", 21, [self](WeightStore& w) {
        return std::make_unique<ClipTextEncoder>(self->text_config, w);
    });
    c->text_encoder_2 = component_of<T5Encoder>(opts, "text_encoder_2", 22, [self, &spec](WeightStore& w) {
        return std::make_unique<T5Encoder>(self->t5_config, w, self->parallel->tensor(), spec);
    });
    c->transformer = component_of<FluxTransformer>(opts, "transformer", 23, [self](WeightStore& w) {
        return std::make_unique<FluxTransformer>(self->transformer_config, w, *self->parallel,
                                                 self->options.device_map);
    });
    c->vae = component_of<VaeDecoder>(opts, "vae", 24, [self](WeightStore& w) {
        return std::make_unique<VaeDecoder>(self->vae_config, w);
    });
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
    const int64_t z = c->vae_config.latent_channels;
    if (t.in_channels != z * 4 || t.out_channels != z * 4)
        throw ModelError(
            dir + ": the transformer takes " + std::to_string(t.in_channels) + " channels and makes " +
            std::to_string(t.out_channels) + ", but the pipeline packs the VAE's " + std::to_string(z) +
            " latent channels in 2x2 patches (in_channels and out_channels " + std::to_string(z * 4) + ")");
    return std::unique_ptr<FluxPipeline>(new FluxPipeline(std::move(c)));
}

bool FluxPipeline::components_kept() const {
    return c_->text_encoder.kept() && c_->text_encoder_2.kept() && c_->transformer.kept() && c_->vae.kept();
}

bool FluxPipeline::guidance_embeds() const { return c_->transformer_config.guidance_embeds; }

int FluxPipeline::size_multiple() const { return static_cast<int>(c_->vae_scale * 2); }
int FluxPipeline::default_width() const { return static_cast<int>(kDefaultSampleSize * c_->vae_scale); }
int FluxPipeline::default_height() const { return default_width(); }

FluxPromptEmbeddings FluxPipeline::encode_prompts(const std::vector<std::string>& prompts,
                                                  int max_sequence_length) const {
    const Components& c = *c_;
    if (max_sequence_length < 1 || max_sequence_length > kMaxSequenceLength)
        throw ModelError("max_sequence_length " + std::to_string(max_sequence_length) + ": must be 1 to " +
                         std::to_string(kMaxSequenceLength));
    const int64_t n = static_cast<int64_t>(prompts.size());
    FluxPromptEmbeddings e;
    e.truncation.assign(prompts.size(), "");
    const DeviceMapping* dm = c.options.device_map.get();
    auto to_transformer = [&](at::Tensor x, const char* component) {
        x = x.to(c.options.dtype);
        return dm ? dm->move(x, dm->slot_of(component), dm->slot_of("transformer")) : x;
    };
    // CLIP: its tokenizer's 77, truncated; the pooled output only.
    std::vector<int64_t> ids;
    for (std::size_t k = 0; k < prompts.size(); ++k) {
        const ClipEncoding one = c.tokenizer->encode(prompts[k]);
        if (one.dropped_tokens > 0)
            e.truncation[k] =
                "The following part of your input was truncated because CLIP can only handle sequences up "
                "to " +
                std::to_string(c.tokenizer->model_max_length()) + " tokens (" +
                std::to_string(one.dropped_tokens) +
                " tokens dropped): " + c.tokenizer->decode(one.truncated);
        ids.insert(ids.end(), one.ids.begin(), one.ids.end());
    }
    at::Tensor input = at::tensor(ids, at::kLong).view({n, -1}).to(device_of(c.options, "text_encoder"));
    e.pooled = to_transformer(c.text_encoder.use()->forward(input).pooled, "text_encoder");
    // T5: max_sequence_length tokens, padded, no mask.
    ids.clear();
    for (std::size_t k = 0; k < prompts.size(); ++k) {
        const T5Encoding one = c.tokenizer_2->encode(prompts[k], max_sequence_length);
        if (one.dropped_tokens > 0) {
            std::string& warning = e.truncation[k];
            if (!warning.empty()) warning += "; ";
            warning +=
                "The following part of your input was truncated because `max_sequence_length` is set to " +
                std::to_string(max_sequence_length) + " tokens (" + std::to_string(one.dropped_tokens) +
                " tokens dropped): " + c.tokenizer_2->decode(one.truncated);
        }
        ids.insert(ids.end(), one.ids.begin(), one.ids.end());
    }
    input = at::tensor(ids, at::kLong).view({n, -1}).to(device_of(c.options, "text_encoder_2"));
    e.sequence = to_transformer(c.text_encoder_2.use()->forward(input), "text_encoder_2");
    return e;
}

std::vector<GenerateResult> FluxPipeline::generate_batch(const std::vector<GenerateRequest>& batch) const {
    c10::InferenceMode inference;
    if (batch.empty()) return {};
    const Components& c = *c_;
    const FluxTransformerConfig& tc = c.transformer_config;
    const GenerateRequest& r = batch.front();
    for (const GenerateRequest& other : batch)
        if (other.steps != r.steps || other.guidance_scale != r.guidance_scale ||
            other.true_cfg_scale != r.true_cfg_scale || other.width != r.width || other.height != r.height ||
            other.max_sequence_length != r.max_sequence_length ||
            other.negative_prompt.has_value() != r.negative_prompt.has_value())
            throw ModelError(
                "a batch must share steps, guidance_scale, true_cfg_scale, size, max_sequence_length and "
                "whether a negative prompt is given");
    std::vector<GenerateResult> results(batch.size());
    const auto [width, height] = checked_size(*this, r);
    if (r.max_sequence_length < 1 || r.max_sequence_length > kMaxSequenceLength)
        throw ModelError("max_sequence_length " + std::to_string(r.max_sequence_length) + ": must be 1 to " +
                         std::to_string(kMaxSequenceLength));

    // diffusers runs the negative branch only with a negative prompt and a scale above 1.
    const bool true_cfg = r.true_cfg_scale > 1.0 && r.negative_prompt.has_value();
    if (!true_cfg && r.negative_prompt)
        for (GenerateResult& out : results)
            out.warnings.push_back("a negative prompt is given but true_cfg_scale is " +
                                   std::to_string(r.true_cfg_scale).substr(0, 4) +
                                   ": classifier-free guidance runs only above 1");
    auto encode = [&](bool negative) {
        std::vector<std::string> prompts;
        for (const GenerateRequest& one : batch)
            prompts.push_back(negative ? *one.negative_prompt : one.prompt);
        FluxPromptEmbeddings e = encode_prompts(prompts, r.max_sequence_length);
        for (std::size_t k = 0; k < batch.size(); ++k)
            if (!e.truncation[k].empty())
                results[k].warnings.push_back((negative ? "negative prompt: " : "") + e.truncation[k]);
        return e;
    };
    // The branches: batched here (negatives first), or one per rank of the cfg group (rank 0 the
    // negative one). Both have max_sequence_length tokens, so they stack as they are.
    const Guidance guidance(true_cfg, c.parallel->cfg());
    FluxPromptEmbeddings text;
    if (guidance.split()) {
        text = encode(guidance.runs_negative_only());
    } else if (guidance.enabled()) {
        const FluxPromptEmbeddings negative = encode(true), positive = encode(false);
        text.sequence = at::cat({negative.sequence, positive.sequence}, 0);
        text.pooled = at::cat({negative.pooled, positive.pooled}, 0);
    } else {
        text = encode(false);
    }

    // The initial noise, drawn on CPU per request as diffusers' randn_tensor does with
    // generator=torch.Generator("cpu").manual_seed(seed): [1, C, H, W] in the text's dtype, packed.
    const int64_t lh = 2 * (height / (c.vae_scale * 2)), lw = 2 * (width / (c.vae_scale * 2));
    const int64_t channels = tc.in_channels / 4;
    std::vector<at::Tensor> noise_parts;
    for (const GenerateRequest& req : batch) {
        at::Generator gen = at::detail::createCPUGenerator(req.seed);
        noise_parts.push_back(
            at::randn({1, channels, lh, lw}, gen, at::TensorOptions().dtype(c.options.dtype)));
    }
    at::Tensor latents = pack_latents(at::cat(noise_parts, 0)).to(c.options.device);

    // Explicit sigmas linspace(1, 1/steps, steps); mu from the image's tokens, which the scheduler
    // uses only with dynamic shifting (dev; schnell's config has it off and a shift of 1).
    FlowMatchEulerScheduler scheduler(c.scheduler);
    scheduler.set_sigmas(flux_sigmas(r.steps), flow_match_mu(c.scheduler, static_cast<int>(latents.size(1))));

    std::shared_ptr<const FluxTransformer> transformer = c.transformer.use();
    const at::TensorOptions on_device = at::TensorOptions().device(c.options.device);
    for (int i = 0; i < r.steps; ++i) {
        const at::Tensor model_in = guidance.model_input(latents);
        const int64_t rows = model_in.size(0);
        // diffusers: the timestep in the latents' dtype, then / 1000; the guidance scale in fp32.
        const at::Tensor t = at::full({rows}, scheduler.timesteps()[static_cast<std::size_t>(i)],
                                      on_device.dtype(c.options.dtype)) /
                             1000;
        const at::Tensor embedded = tc.guidance_embeds
                                        ? at::full({rows}, r.guidance_scale, on_device.dtype(at::kFloat))
                                        : at::Tensor();
        const at::Tensor prediction =
            guidance.predict(rows, c.options.device.is_cpu(), [&](int64_t first, int64_t count) {
                auto part = [&](const at::Tensor& x) { return x.defined() ? x.narrow(0, first, count) : x; };
                return transformer->forward(part(model_in), part(text.sequence), part(text.pooled), part(t),
                                            part(embedded), lh / 2, lw / 2);
            });
        const at::Tensor noise =
            guidance.combine(prediction, [&](const at::Tensor& negative, const at::Tensor& positive) {
                return linear_guidance(negative, positive, r.true_cfg_scale);
            });
        latents = scheduler.step(noise, i, latents);
        if (r.on_step) r.on_step(i + 1, r.steps);
    }

    transformer.reset();  // with offload, freed before the VAE is built
    at::Tensor image = unpack_latents(latents, lh, lw);
    if (const DeviceMapping* dm = c.options.device_map.get())
        image = dm->move(image, dm->slot_of("transformer"), dm->slot_of("vae"));
    image = c.vae.use()->decode(image);  // latents / scaling_factor + shift_factor, then the decoder
    finish_results(results, image, latents, r.steps);
    return results;
}

}  // namespace dp::runtime
