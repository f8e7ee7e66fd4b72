#include "runtime/models/qwen_image/qwen_image_pipeline.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>

#include "runtime/errors.h"
#include "runtime/models/common/config_json.h"
#include "runtime/models/common/flow_match_scheduler.h"
#include "runtime/models/common/pipeline_common.h"
#include "runtime/models/common/qwen2_text_encoder.h"
#include "runtime/models/common/qwen2_tokenizer.h"
#include "runtime/models/common/qwen_image_vae.h"
#include "runtime/models/qwen_image/qwen_image_transformer.h"
#include "runtime/parallel/device_mapping.h"
#include "runtime/parallel/guidance.h"
#include "runtime/parallel/parallel_context.h"
#include "strategies/parallel_spec.h"

namespace dp::runtime {
namespace {

// QwenImagePipeline's prompt template, and the tokens of its system part that are dropped from
// the hidden states (diffusers hard-codes 34: the real tokenizer's count for that part).
constexpr const char* kTemplatePrefix =
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, spatial "
    "relationships of the objects and background:<|im_end|>\n<|im_start|>user\n";
constexpr const char* kTemplateSuffix = "<|im_end|>\n<|im_start|>assistant\n";
constexpr int64_t kTemplateDrop = 34;
constexpr int64_t kTokenizerMaxLength = 1024;  // the tokenizer truncates at this plus kTemplateDrop
constexpr int kMaxSequenceLength = 1024;       // diffusers refuses more
constexpr int kDefaultSampleSize = 128;        // latents a side by default (1024 pixels)

}  // namespace

struct QwenImagePipeline::Components {
    PipelineOptions options;
    const ParallelContext* parallel = nullptr;
    std::unique_ptr<Qwen2Tokenizer> tokenizer;
    Qwen2TextConfig text_config;
    QwenImageTransformerConfig transformer_config;
    QwenImageVaeConfig vae_config;
    // Kept, or built for each use with PipelineOptions::offload (Note [offload]).
    Component<Qwen2TextEncoder> text_encoder;
    Component<QwenImageTransformer> transformer;
    Component<QwenImageVaeDecoder> vae;
    FlowMatchSchedulerConfig scheduler;
    int64_t vae_scale = 8;
};

QwenImagePipeline::QwenImagePipeline(std::unique_ptr<Components> c) : c_(std::move(c)) {}
QwenImagePipeline::~QwenImagePipeline() = default;

std::unique_ptr<QwenImagePipeline> QwenImagePipeline::load(const PipelineOptions& o) {
    return load(o, ParallelContext::single());
}

std::unique_ptr<QwenImagePipeline> QwenImagePipeline::load(const PipelineOptions& o, const ParallelContext& parallel) {
    const std::string& dir = o.model_dir;
    const strategies::ParallelSpec& spec = strategies::qwen_image_parallel_spec();
    require_loadable(o, spec);

    auto c = std::make_unique<Components>();
    c->options = o;
    c->parallel = &parallel;
    c->scheduler = FlowMatchSchedulerConfig::from_json_file(dir + "/scheduler/scheduler_config.json");
    c->tokenizer = std::make_unique<Qwen2Tokenizer>(Qwen2Tokenizer::from_folder(dir + "/tokenizer"));
    c->text_config = Qwen2TextConfig::from_json_file(dir + "/text_encoder/config.json");
    c->transformer_config = QwenImageTransformerConfig::from_json_file(dir + "/transformer/config.json");
    c->vae_config = QwenImageVaeConfig::from_json_file(dir + "/vae/config.json");
    const Components* self = c.get();
    c->text_encoder = Component<Qwen2TextEncoder>(
        [self, &spec] {
            WeightStore w = open_weights(self->options, "text_encoder", 11, device_of(self->options, "text_encoder"));
            auto m = std::make_unique<Qwen2TextEncoder>(self->text_config, w, self->parallel->tensor(), spec);
            w.check_all_taken();
            return m;
        },
        o.offload);
    c->transformer = Component<QwenImageTransformer>(
        [self] {
            WeightStore w = open_weights(self->options, "transformer", 12, self->options.device);
            auto m = std::make_unique<QwenImageTransformer>(self->transformer_config, w, *self->parallel,
                                                            self->options.device_map);
            w.check_all_taken();
            return m;
        },
        o.offload);
    c->vae = Component<QwenImageVaeDecoder>(
        [self] {
            WeightStore w = open_weights(self->options, "vae", 13, device_of(self->options, "vae"));
            auto m = std::make_unique<QwenImageVaeDecoder>(self->vae_config, w);
            w.check_all_taken();
            return m;
        },
        o.offload);
    c->vae_scale = c->vae_config.scale_factor();

    // The pieces must fit together.
    const QwenImageTransformerConfig& t = c->transformer_config;
    const int64_t hidden = c->text_config.hidden_size;
    if (hidden != t.joint_attention_dim)
        throw ModelError(dir + ": the text encoder's hidden_size is " + std::to_string(hidden) +
                         " but transformer/config.json joint_attention_dim is " + std::to_string(t.joint_attention_dim));
    const int64_t z = c->vae_config.z_dim;
    if (t.patch_size != 2 || t.in_channels != z * 4 || t.out_channels != z)
        throw ModelError(dir + ": the transformer takes " + std::to_string(t.in_channels) + " channels in " +
                         std::to_string(t.patch_size) + "x" + std::to_string(t.patch_size) + " patches and makes " +
                         std::to_string(t.out_channels) + ", but the pipeline packs the VAE's " + std::to_string(z) +
                         " latent channels in 2x2 patches (in_channels " + std::to_string(z * 4) +
                         ", out_channels " + std::to_string(z) + ")");
    return std::unique_ptr<QwenImagePipeline>(new QwenImagePipeline(std::move(c)));
}

bool QwenImagePipeline::components_kept() const {
    return c_->text_encoder.kept() && c_->transformer.kept() && c_->vae.kept();
}

int QwenImagePipeline::size_multiple() const { return static_cast<int>(c_->vae_scale * 2); }
int QwenImagePipeline::default_width() const { return static_cast<int>(kDefaultSampleSize * c_->vae_scale); }
int QwenImagePipeline::default_height() const { return default_width(); }

QwenPromptEmbeddings QwenImagePipeline::encode_prompts(const std::vector<std::string>& prompts,
                                                       int max_sequence_length) const {
    const Components& c = *c_;
    if (max_sequence_length < 1 || max_sequence_length > kMaxSequenceLength)
        throw ModelError("max_sequence_length " + std::to_string(max_sequence_length) + ": must be 1 to " +
                         std::to_string(kMaxSequenceLength));
    const int64_t n = static_cast<int64_t>(prompts.size());
    QwenPromptEmbeddings e;
    e.truncation.assign(prompts.size(), "");
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
            e.truncation[k] = "the prompt's text was cut to max_sequence_length " + std::to_string(max_sequence_length) +
                              " tokens (" + std::to_string(kept - max_sequence_length) + " tokens dropped)";
        e.lengths.push_back(std::min<int64_t>(kept, max_sequence_length));
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
    at::Tensor hidden = c.text_encoder.use()->forward(input, input_mask).to(c.options.dtype);
    if (const DeviceMapping* dm = c.options.device_map.get())
        hidden = dm->move(hidden, dm->slot_of("text_encoder"), dm->slot_of("transformer"));
    // Each prompt's own tokens after the template's first ones, zero-padded to the longest.
    const int64_t width = *std::max_element(e.lengths.begin(), e.lengths.end());
    e.sequence = at::zeros({n, width, hidden.size(-1)}, hidden.options());
    e.mask = at::zeros({n, width}, at::TensorOptions().dtype(at::kLong).device(hidden.device()));
    for (int64_t k = 0; k < n; ++k) {
        const int64_t len = e.lengths[static_cast<std::size_t>(k)];
        e.sequence[k].narrow(0, 0, len).copy_(hidden[k].narrow(0, kTemplateDrop, len));
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

namespace {

// Two branches' embeddings as one batch (negatives first), padded to the longer text with
// masked positions.
QwenPromptEmbeddings joined(const QwenPromptEmbeddings& a, const QwenPromptEmbeddings& b) {
    const int64_t t = std::max(a.sequence.size(1), b.sequence.size(1));
    auto padded = [t](const at::Tensor& x) {
        if (x.size(1) == t) return x;
        // constant_pad_nd's pairs run from the last dimension back: the tokens' (dim 1) far side.
        std::vector<int64_t> pad(2 * static_cast<std::size_t>(x.dim() - 1), 0);
        pad[2 * static_cast<std::size_t>(x.dim() - 2) + 1] = t - x.size(1);
        return at::constant_pad_nd(x, pad, 0);
    };
    QwenPromptEmbeddings out;
    out.sequence = at::cat({padded(a.sequence), padded(b.sequence)}, 0);
    out.mask = at::cat({padded(a.mask), padded(b.mask)}, 0);
    return out;
}

}  // namespace

std::vector<GenerateResult> QwenImagePipeline::generate_batch(const std::vector<GenerateRequest>& batch) const {
    c10::InferenceMode inference;
    if (batch.empty()) return {};
    const Components& c = *c_;
    const QwenImageTransformerConfig& tc = c.transformer_config;
    const GenerateRequest& r = batch.front();
    for (const GenerateRequest& other : batch)
        if (other.steps != r.steps || other.true_cfg_scale != r.true_cfg_scale || other.width != r.width ||
            other.height != r.height || other.max_sequence_length != r.max_sequence_length ||
            other.negative_prompt.has_value() != r.negative_prompt.has_value())
            throw ModelError(
                "a batch must share steps, true_cfg_scale, size, max_sequence_length and whether a negative prompt "
                "is given");
    const int64_t n = static_cast<int64_t>(batch.size());
    std::vector<GenerateResult> results(batch.size());
    const auto [width, height] = checked_size(*this, r);

    // diffusers runs the negative branch only with a negative prompt and a scale above 1.
    const bool true_cfg = r.true_cfg_scale > 1.0 && r.negative_prompt.has_value();
    if (!true_cfg && r.negative_prompt)
        for (GenerateResult& out : results)
            out.warnings.push_back("a negative prompt is given but true_cfg_scale is " +
                                   std::to_string(r.true_cfg_scale).substr(0, 4) +
                                   ": classifier-free guidance runs only above 1");
    auto encode = [&](bool negative) {
        std::vector<std::string> prompts;
        for (const GenerateRequest& one : batch) prompts.push_back(negative ? *one.negative_prompt : one.prompt);
        QwenPromptEmbeddings e = encode_prompts(prompts, r.max_sequence_length);
        for (std::size_t k = 0; k < batch.size(); ++k)
            if (!e.truncation[k].empty())
                results[k].warnings.push_back((negative ? "negative prompt: " : "") + e.truncation[k]);
        return e;
    };
    // The branches: batched here, or one per rank of the cfg group (rank 0 the negative one).
    const Guidance guidance(true_cfg, c.parallel->cfg());
    QwenPromptEmbeddings text;
    if (guidance.split())
        text = encode(guidance.runs_negative_only());
    else if (guidance.enabled())
        text = joined(encode(true), encode(false));
    else
        text = encode(false);

    // The initial noise, drawn on CPU per request as diffusers' randn_tensor does with
    // generator=torch.Generator("cpu").manual_seed(seed): [1, 1, C, H, W] (one frame), packed.
    const int64_t lh = 2 * (height / (c.vae_scale * 2)), lw = 2 * (width / (c.vae_scale * 2));
    const int64_t channels = tc.in_channels / 4;
    std::vector<at::Tensor> noise_parts;
    for (const GenerateRequest& req : batch) {
        at::Generator gen = at::detail::createCPUGenerator(req.seed);
        noise_parts.push_back(at::randn({1, 1, channels, lh, lw}, gen, at::TensorOptions().dtype(c.options.dtype)));
    }
    at::Tensor latents = pack_latents(at::cat(noise_parts, 0).view({n, channels, lh, lw})).to(c.options.device);

    // Explicit sigmas linspace(1, 1/steps, steps), shifted by the image's token count.
    FlowMatchEulerScheduler scheduler(c.scheduler);
    std::vector<double> sigmas;
    for (int i = 0; i < r.steps; ++i)
        sigmas.push_back(r.steps == 1 ? 1.0 : 1.0 + (1.0 / r.steps - 1.0) * i / (r.steps - 1));
    scheduler.set_sigmas(sigmas, flow_match_mu(c.scheduler, static_cast<int>(latents.size(1))));

    const at::Tensor mask = text.mask.all().item<bool>() ? at::Tensor() : text.mask;  // diffusers drops an all-ones mask
    std::shared_ptr<const QwenImageTransformer> transformer = c.transformer.use();
    for (int i = 0; i < r.steps; ++i) {
        const at::Tensor model_in = guidance.model_input(latents);
        // diffusers: the timestep in the latents' dtype, then / 1000.
        const at::Tensor t = at::full({model_in.size(0)}, scheduler.timesteps()[static_cast<std::size_t>(i)],
                                      at::TensorOptions().dtype(c.options.dtype).device(c.options.device)) /
                             1000;
        const at::Tensor prediction = transformer->forward(model_in, text.sequence, mask, t, lh / 2, lw / 2);
        const at::Tensor noise = guidance.combine(prediction, [&](const at::Tensor& negative, const at::Tensor& positive) {
            return true_cfg_guidance(negative, positive, r.true_cfg_scale);
        });
        latents = scheduler.step(noise, i, latents);
        if (r.on_step) r.on_step(i + 1, r.steps);
    }

    transformer.reset();  // with offload, freed before the VAE is built
    at::Tensor image = unpack_latents(latents, lh, lw);
    if (const DeviceMapping* dm = c.options.device_map.get())
        image = dm->move(image, dm->slot_of("transformer"), dm->slot_of("vae"));
    image = c.vae.use()->decode(image);
    finish_results(results, image, latents, r.steps);
    return results;
}

}  // namespace dp::runtime
