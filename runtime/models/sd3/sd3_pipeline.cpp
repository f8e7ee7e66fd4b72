#include "runtime/models/sd3/sd3_pipeline.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <fstream>
#include <sstream>

#include "runtime/parallel/device_mapping.h"
#include "runtime/parallel/guidance.h"
#include "runtime/parallel/parallel_context.h"
#include "runtime/errors.h"
#include "runtime/models/common/clip_text_encoder.h"
#include "runtime/models/common/clip_tokenizer.h"
#include "runtime/models/common/config_json.h"
#include "runtime/models/common/flow_match_scheduler.h"
#include "runtime/models/common/pipeline_common.h"
#include "runtime/models/common/t5_encoder.h"
#include "runtime/models/common/t5_tokenizer.h"
#include "runtime/models/sd3/sd3_transformer.h"
#include "runtime/models/common/vae_decoder.h"
#include "strategies/model_config.h"
#include "strategies/parallel_spec.h"

namespace dp::runtime {

namespace {

constexpr int kMaxT5SequenceLength = 512;  // diffusers refuses more

}  // namespace

struct Sd3Pipeline::Components {
    PipelineOptions options;
    const ParallelContext* parallel = nullptr;
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
    FlowMatchSchedulerConfig scheduler;
    int64_t vae_scale = 1;
    std::vector<std::pair<std::string, std::vector<std::pair<std::string, at::Tensor>>>> parameters;
};

Sd3Pipeline::Sd3Pipeline(std::unique_ptr<Components> c) : c_(std::move(c)) {}
Sd3Pipeline::~Sd3Pipeline() = default;

std::unique_ptr<Sd3Pipeline> Sd3Pipeline::load(const PipelineOptions& o) {
    return load(o, ParallelContext::single());
}

std::unique_ptr<Sd3Pipeline> Sd3Pipeline::load(const PipelineOptions& o, const ParallelContext& parallel) {
    const std::string& dir = o.model_dir;
    const ConfigJson index = ConfigJson::from_file(dir + "/model_index.json");
    require_loadable(o, strategies::sd3_parallel_spec());
    const bool t5 = !component_class(index, "text_encoder_3").empty() && !o.no_t5;
    auto c = std::make_unique<Components>();
    c->options = o;
    c->parallel = &parallel;
    c->scheduler = FlowMatchSchedulerConfig::from_json_file(dir + "/scheduler/scheduler_config.json");
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
    const auto component = [&o, self](const char* name, uint64_t salt, at::Device device, auto build) {
        using T = typename decltype(build(std::declval<WeightStore&>()))::element_type;
        return Component<T>(
            [self, name, salt, device, build] {
                WeightStore w = open_weights(self->options, name, salt, device);
                if (self->options.trainable) w.keep_as_parameters();
                auto m = build(w);
                w.check_all_taken();
                if (self->options.trainable) self->parameters.emplace_back(name, w.parameters());
                return m;
            },
            o.offload);
    };
    c->text_encoder = component("text_encoder", 1, device_of(o, "text_encoder"), [self](WeightStore& w) {
        return std::make_unique<ClipTextEncoder>(self->text_config, w);
    });
    c->text_encoder_2 = component("text_encoder_2", 2, device_of(o, "text_encoder_2"), [self](WeightStore& w) {
        return std::make_unique<ClipTextEncoder>(self->text_config_2, w);
    });
    if (t5)
        c->text_encoder_3 = component("text_encoder_3", 5, device_of(o, "text_encoder_3"), [self](WeightStore& w) {
            return std::make_unique<T5Encoder>(self->t5_config, w, self->parallel->tensor());
        });
    c->transformer = component("transformer", 3, o.device, [self](WeightStore& w) {
        return std::make_unique<Sd3Transformer>(self->transformer_config, w, *self->parallel, self->options.device_map);
    });
    if (c->has_vae) {
        c->vae = component("vae", 4, device_of(o, "vae"),
                           [self](WeightStore& w) { return std::make_unique<VaeDecoder>(self->vae_config, w); });
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
        throw ModelError(
            dir + ": the transformer works on " + std::to_string(t.in_channels) + " channels but " +
            (c->has_vae ? "the VAE's latents have " : "pixel space (no VAE) has ") + std::to_string(channels));
    if (!c->has_vae && t.out_channels != 3)
        throw ModelError(dir + ": a pipeline without a VAE must produce 3 channels");
    return std::unique_ptr<Sd3Pipeline>(new Sd3Pipeline(std::move(c)));
}


int Sd3Pipeline::size_multiple() const {
    return static_cast<int>(c_->vae_scale * c_->transformer_config.patch_size);
}
int Sd3Pipeline::default_width() const {
    return static_cast<int>(c_->transformer_config.sample_size * c_->vae_scale);
}
int Sd3Pipeline::default_height() const { return default_width(); }

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
    if (max_sequence_length < 1 || max_sequence_length > kMaxT5SequenceLength)
        throw ModelError("max_sequence_length " + std::to_string(max_sequence_length) + ": must be 1 to " +
                         std::to_string(kMaxT5SequenceLength));
    const Sd3TransformerConfig& tc = c.transformer_config;
    const int64_t n = static_cast<int64_t>(prompts.size());
    PromptEmbeddings e;
    e.truncation.assign(prompts.size(), "");
    std::vector<at::Tensor> hidden, pooled;
    for (int which = 0; which < 2; ++which) {
        const ClipTokenizer& tok = which == 0 ? *c.tokenizer : *c.tokenizer_2;
        const std::shared_ptr<const ClipTextEncoder> enc = which == 0 ? c.text_encoder.use() : c.text_encoder_2.use();
        std::vector<int64_t> ids;
        for (std::size_t k = 0; k < prompts.size(); ++k) {
            const ClipEncoding one = tok.encode(prompts[k]);
            if (one.dropped_tokens > 0 && which == 0)
                e.truncation[k] =
                    "The following part of your input was truncated because CLIP can only handle "
                    "sequences up to " +
                    std::to_string(tok.model_max_length()) + " tokens (" +
                    std::to_string(one.dropped_tokens) + " tokens dropped): " + tok.decode(one.truncated);
            ids.insert(ids.end(), one.ids.begin(), one.ids.end());
        }
        const DeviceMapping* dm = c.options.device_map.get();
        const char* component = which == 0 ? "text_encoder" : "text_encoder_2";
        const int from = dm ? dm->slot_of(component) : 0;
        const int to = dm ? dm->slot_of("transformer") : 0;
        const at::Tensor input = at::tensor(ids, at::kLong).view({n, -1}).to(device_of(c.options, component));
        ClipTextOutput out = enc->forward(input);
        hidden.push_back(dm ? dm->move(out.hidden.to(c.options.dtype), from, to)
                            : out.hidden.to(c.options.dtype));
        pooled.push_back(dm ? dm->move(out.pooled.to(c.options.dtype), from, to)
                            : out.pooled.to(c.options.dtype));
    }
    const at::Tensor clip = pad_last(at::cat(hidden, -1), tc.joint_attention_dim);
    e.pooled = at::cat(pooled, -1);
    if (!c.tokenizer_3) {  // Note [constant text tail]: one zero position stands for all of them
        e.sequence = at::cat({clip, at::zeros({n, 1, tc.joint_attention_dim}, clip.options())}, -2);
        e.tail_repeats = max_sequence_length;
        return e;
    }
    std::vector<int64_t> ids;
    for (std::size_t k = 0; k < prompts.size(); ++k) {
        const T5Encoding one = c.tokenizer_3->encode(prompts[k], max_sequence_length);
        if (one.dropped_tokens > 0) {
            std::string& warning = e.truncation[k];
            if (!warning.empty()) warning += "; ";
            warning += "The following part of your input was truncated because `max_sequence_length` is set to " +
                       std::to_string(max_sequence_length) + " tokens (" + std::to_string(one.dropped_tokens) +
                       " tokens dropped): " + c.tokenizer_3->decode(one.truncated);
        }
        ids.insert(ids.end(), one.ids.begin(), one.ids.end());
    }
    const DeviceMapping* dm = c.options.device_map.get();
    const at::Tensor input =
        at::tensor(ids, at::kLong).view({n, -1}).to(device_of(c.options, "text_encoder_3"));
    at::Tensor t5 = c.text_encoder_3.use()->forward(input).to(c.options.dtype);
    if (dm) t5 = dm->move(t5, dm->slot_of("text_encoder_3"), dm->slot_of("transformer"));
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


std::vector<GenerateResult> Sd3Pipeline::generate_batch(const std::vector<GenerateRequest>& batch) const {
    c10::InferenceMode inference;  // no autograd bookkeeping on any tensor made here
    if (batch.empty()) return {};
    const Components& c = *c_;
    const Sd3TransformerConfig& tc = c.transformer_config;
    const GenerateRequest& r = batch.front();
    for (const GenerateRequest& other : batch)
        if (other.steps != r.steps || other.guidance_scale != r.guidance_scale || other.width != r.width ||
            other.height != r.height || other.max_sequence_length != r.max_sequence_length ||
            other.skip_guidance_layers != r.skip_guidance_layers ||
            other.skip_layer_guidance_scale != r.skip_layer_guidance_scale ||
            other.skip_layer_guidance_start != r.skip_layer_guidance_start ||
            other.skip_layer_guidance_stop != r.skip_layer_guidance_stop)
            throw ModelError(
                "a batch must share steps, guidance scale, size, max_sequence_length and skip-layer guidance");
    const int64_t n = static_cast<int64_t>(batch.size());
    std::vector<GenerateResult> results(batch.size());
    const auto [width, height] = checked_size(*this, r);
    for (int layer : r.skip_guidance_layers)
        if (layer < 0 || layer >= tc.num_layers)
            throw ModelError("skip_guidance_layers: block " + std::to_string(layer) + " does not exist (the model has " +
                             std::to_string(tc.num_layers) + " blocks, 0 to " + std::to_string(tc.num_layers - 1) + ")");

    auto encode = [&](bool negative) {
        std::vector<std::string> prompts;
        for (const GenerateRequest& one : batch)
            prompts.push_back(negative ? one.negative_prompt.value_or("") : one.prompt);
        PromptEmbeddings e = encode_prompts(prompts, r.max_sequence_length);
        for (std::size_t k = 0; k < batch.size(); ++k)
            if (!e.truncation[k].empty())
                results[k].warnings.push_back((negative ? "negative prompt: " : "") + e.truncation[k]);
        return e;
    };

    // Guidance's two branches: batched here, or one per rank of the cfg group (rank 0 the
    // negative one), each rank encoding only its branch.
    const Guidance guidance(r.guidance_scale > 1.0, c.parallel->cfg());
    at::Tensor text, pooled, positive_text, positive_pooled;  // positive_*: skip-layer guidance's input
    int64_t tail_repeats = 1;
    if (guidance.split()) {
        const PromptEmbeddings mine = encode(guidance.runs_negative_only());
        text = positive_text = mine.sequence;
        pooled = positive_pooled = mine.pooled;
        tail_repeats = mine.tail_repeats;
    } else {
        const PromptEmbeddings positive = encode(false);
        text = positive_text = positive.sequence;
        pooled = positive_pooled = positive.pooled;
        tail_repeats = positive.tail_repeats;
        if (guidance.enabled()) {  // diffusers' order: all negatives, then all positives
            const PromptEmbeddings negative = encode(true);
            text = at::cat({negative.sequence, positive.sequence}, 0);
            pooled = at::cat({negative.pooled, positive.pooled}, 0);
        }
    }

    // The initial noise: drawn on CPU from a generator seeded per request, exactly as diffusers'
    // randn_tensor with generator=torch.Generator("cpu").manual_seed(seed), so an image does not
    // depend on what else is in its batch.
    const int64_t lh = height / c.vae_scale, lw = width / c.vae_scale;
    std::vector<at::Tensor> noise_parts;
    for (const GenerateRequest& req : batch) {
        at::Generator gen = at::detail::createCPUGenerator(req.seed);
        noise_parts.push_back(
            at::randn({1, tc.in_channels, lh, lw}, gen, at::TensorOptions().dtype(c.options.dtype)));
    }
    at::Tensor latents = at::cat(noise_parts, 0).to(c.options.device);

    FlowMatchEulerScheduler scheduler(c.scheduler);
    std::optional<double> mu;
    if (c.scheduler.use_dynamic_shifting)
        mu = flow_match_mu(c.scheduler, static_cast<int>((lh / tc.patch_size) * (lw / tc.patch_size)));
    scheduler.set_timesteps(r.steps, mu);

    std::shared_ptr<const Sd3Transformer> transformer = c.transformer.use();
    for (int i = 0; i < r.steps; ++i) {
        const at::Tensor model_in = guidance.model_input(latents);
        const double timestep = scheduler.timesteps()[static_cast<std::size_t>(i)];
        const at::Tensor t = at::full({model_in.size(0)}, timestep,
                                      at::TensorOptions().dtype(at::kFloat).device(c.options.device));
        const at::Tensor prediction = transformer->forward(model_in, text, pooled, t, tail_repeats);
        // Skip-layer guidance, as diffusers: with guidance, on the steps strictly inside
        // (start, stop) x steps, the positive branch once more with the blocks skipped.
        const bool skip_layers = guidance.enabled() && !r.skip_guidance_layers.empty() &&
                                 i > r.steps * r.skip_layer_guidance_start && i < r.steps * r.skip_layer_guidance_stop;
        at::Tensor noise;
        if (!skip_layers) {
            noise = guidance.combine(prediction, [&](const at::Tensor& negative, const at::Tensor& positive) {
                return linear_guidance(negative, positive, r.guidance_scale);
            });
        } else {
            at::Tensor skipped;
            if (guidance.runs_positive())
                skipped = transformer->forward(latents, positive_text, positive_pooled, t.narrow(0, 0, n),
                                                 tail_repeats, r.skip_guidance_layers);
            noise = guidance.combine(
                prediction, skipped, [&](const at::Tensor& negative, const at::Tensor& positive, const at::Tensor& extra) {
                    return linear_guidance(negative, positive, r.guidance_scale) +
                           (positive - extra) * r.skip_layer_guidance_scale;
                });
        }
        latents = scheduler.step(noise, i, latents);
        if (r.on_step) r.on_step(i + 1, r.steps);
    }

    const DeviceMapping* dm = c.options.device_map.get();
    transformer.reset();  // with offload, freed before the VAE is built
    at::Tensor image = !c.has_vae ? latents
                       : dm       ? c.vae.use()->decode(dm->move(latents, dm->slot_of("transformer"), dm->slot_of("vae")))
                                  : c.vae.use()->decode(latents);
    finish_results(results, image, latents, r.steps);
    return results;
}

}  // namespace dp::runtime
