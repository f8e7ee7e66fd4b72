#include "runtime/pipeline/family_pipeline.h"

#include "runtime/pipeline/step_cache.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "runtime/io/errors.h"
#include "runtime/parallel/device_mapping.h"
#include "runtime/parallel/guidance.h"
#include "runtime/parallel/kernel_time.h"
#include "runtime/parallel/parallel_context.h"
#include "runtime/pipeline/block_runner.h"
#include "runtime/pipeline/image_inputs.h"
#include "runtime/pipeline/pipeline_common.h"
#include "runtime/pipeline/schedulers.h"
#include "strategies/config_file.h"
#include "strategies/family.h"

namespace dp::runtime {

using protocol::CallValues;
using protocol::FamilyArgument;

// --- Conditioning ---

Conditioning Conditioning::rows(int64_t first, int64_t count) const {
    if (first == 0 && count == text.size(0)) return *this;
    Conditioning c;
    const auto part = [&](const at::Tensor& x) { return x.defined() ? x.narrow(0, first, count) : x; };
    c.text = part(text);
    c.pooled = part(pooled);
    c.mask = part(mask);
    c.image = part(image);
    c.tail_repeats = tail_repeats;
    return c;
}

Conditioning Conditioning::join(const Conditioning& a, const Conditioning& b) {
    if (a.tail_repeats != b.tail_repeats)
        throw InternalError("Conditioning::join: the branches' texts end differently (tail_repeats)");
    Conditioning out;
    out.tail_repeats = a.tail_repeats;
    if (a.pooled.defined()) out.pooled = at::cat({a.pooled, b.pooled}, 0);
    const int64_t t = std::max(a.text.size(1), b.text.size(1));
    if (a.text.size(1) == t && b.text.size(1) == t && !a.mask.defined() && !b.mask.defined()) {
        out.text = at::cat({a.text, b.text}, 0);
        return out;
    }
    // The shorter text padded at its end, the padding masked.
    const auto mask_of = [](const Conditioning& c) {
        return c.mask.defined() ? c.mask
                                : at::ones({c.text.size(0), c.text.size(1)},
                                           at::TensorOptions().dtype(at::kLong).device(c.text.device()));
    };
    const auto padded = [t](const at::Tensor& x) {
        if (x.size(1) == t) return x;
        // constant_pad_nd's pairs run from the last dimension back: the tokens' (dim 1) far side.
        std::vector<int64_t> pad(2 * static_cast<std::size_t>(x.dim() - 1), 0);
        pad[2 * static_cast<std::size_t>(x.dim() - 2) + 1] = t - x.size(1);
        return at::constant_pad_nd(x, pad, 0);
    };
    out.text = at::cat({padded(a.text), padded(b.text)}, 0);
    out.mask = at::cat({padded(mask_of(a)), padded(mask_of(b))}, 0);
    return out;
}

LatentShape packed_latents(int64_t channels, int64_t vae_scale, int width, int height) {
    LatentShape s;
    s.channels = channels;
    s.height = 2 * (height / (vae_scale * 2));
    s.width = 2 * (width / (vae_scale * 2));
    s.packed = true;
    s.tokens = (s.height / 2) * (s.width / 2);
    return s;
}

// --- FamilyPipeline ---

FamilyPipeline::FamilyPipeline(const ComponentsBase& c, strategies::ModelInfo model)
    : options_(c.options), parallel_(c.parallel), model_(std::move(model)), scheduler_(c.scheduler) {
    try {
        if (model_.spec && strategies::facts_of(*model_.spec).pass_flops)
            transformer_config_ =
                std::make_shared<const nlohmann::json>(strategies::read_config_object_if_present(
                    model_.dir + "/" + model_.spec->transformer + "/config.json"));
    } catch (const std::exception&) {
        transformer_config_.reset();  // the FLOPs are a report; the load has read the config its own way
    }
}

void FamilyPipeline::count_work(PhaseTimes& times, int width, int height, const Conditioning& text,
                                int64_t passes) const {
    if (!transformer_config_ || !transformer_config_->is_object() || transformer_config_->empty() ||
        passes <= 0)
        return;
    const int64_t scale = model_.sizes.vae_scale, grid = std::max<int64_t>(model_.sizes.patch_size, 1);
    strategies::PassTokens tokens{(width / scale / grid) * (height / scale / grid), 0};
    if (text.text.defined() && text.text.dim() >= 2) tokens.text = text.text.size(1) + text.tail_repeats - 1;
    if (text.image.defined() && text.image.dim() == 4)
        tokens.image += (text.image.size(2) / grid) * (text.image.size(3) / grid);
    const strategies::PassFlopsCount count = strategies::facts_of(*model_.spec).pass_flops;
    const strategies::MeshDegrees& degrees = parallel_->mesh().degrees();
    const bool text_split = strategies::stream_split(*model_.spec, "text");
    try {
        const strategies::RankFlops rank =
            strategies::rank_flops(count, *transformer_config_, tokens, degrees, text_split);
        times.passes = passes;
        times.flops = rank.total() * static_cast<double>(passes);
        times.gemm_flops = rank.gemm * static_cast<double>(passes);
        times.gemms = rank.gemms;
        times.attentions = rank.attentions;
        times.heads = (model_.shape.heads + degrees.tp - 1) / std::max(degrees.tp, 1);
        times.head_dim = model_.shape.head_dim;
    } catch (const std::exception&) {
        // A config number that is not a size: the load would have refused it; nothing counted.
    }
}

at::Tensor FamilyPipeline::combine(const at::Tensor& negative, const at::Tensor& positive,
                                   const CallValues& arguments) const {
    return linear_guidance(negative, positive, guidance_scale(arguments));
}

bool FamilyPipeline::extra_at(int, int, const CallValues&) const { return false; }

at::Tensor FamilyPipeline::predict_extra(const at::Tensor&, const LatentShape&, const Conditioning&, double,
                                         const CallValues&) const {
    throw InternalError("this family makes no extra prediction");
}

bool FamilyPipeline::guided_at(double, const CallValues&) const { return true; }

at::Tensor FamilyPipeline::combine_extra(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const CallValues&) const {
    throw InternalError("this family makes no extra prediction");
}

double FamilyPipeline::shift_mu(int64_t tokens, int, const nlohmann::json& scheduler) const {
    return calculate_shift(scheduler, tokens);
}

ImageLatents FamilyPipeline::encode_image(const at::Tensor&) const {
    throw ModelError(model_.family_name + "'s pipeline takes no image to edit");
}

at::Tensor FamilyPipeline::image_latents(const at::Tensor&) const {
    throw ModelError(model_.family_name + "'s pipeline takes no image to edit");
}

std::optional<EditCondition> FamilyPipeline::edit_condition(const protocol::InputImage&,
                                                            const protocol::InputImage&,
                                                            const LatentShape&) const {
    return std::nullopt;
}

ImageLatents FamilyPipeline::encode_on_cpu(const at::Tensor& pixels) const {
    const at::Device vae = device_of(options_, decoder() ? decoder() : "vae");
    ImageLatents d = encode_image(pixels.to(vae, options_.dtype));
    return {d.mean.to(at::kCPU), d.std.to(at::kCPU)};
}

at::Tensor FamilyPipeline::to_transformer(const at::Tensor& x, const char* component) const {
    const at::Tensor y = x.to(options_.dtype);
    const DeviceMapping* dm = options_.device_map.get();
    return dm ? dm->move(y, dm->slot_of(component), dm->slot_of("transformer")) : y;
}

double FamilyPipeline::guidance_scale(const CallValues& arguments) const {
    const FamilyArgument* cfg = model_.arguments.guidance_scale();
    if (!cfg) throw InternalError(model_.family_name + " has no guidance scale");
    return arguments.number(cfg->row->name);
}

CallValues FamilyPipeline::arguments_of(const GenerateRequest& request) const {
    const protocol::FamilyArguments& family = model_.arguments;
    for (const CallValues::Item& item : request.arguments.items())
        if (!family.find(item.first->name))
            throw ModelError(model_.family_name + " does not take " + item.first->name +
                             " (its pipeline takes " +
                             [&] {
                                 std::string names;
                                 for (const std::string& n : family.names())
                                     names += (names.empty() ? "" : ", ") + n;
                                 return names;
                             }() +
                             ")");
    const CallValues values = family.completed(request.arguments);
    for (const CallValues::Item& item : values.items()) {
        const FamilyArgument& a = *family.find(item.first->name);
        if (const auto* blocks = std::get_if<std::vector<int>>(&item.second)) {
            const int64_t n = model_.shape.layers;
            for (int b : *blocks)
                if (b < 0 || b >= n)
                    throw ModelError(std::string(a.row->name) + ": block " + std::to_string(b) +
                                     " does not exist (the model has " + std::to_string(n) +
                                     " blocks, 0 to " + std::to_string(n - 1) + ")");
            continue;
        }
        if (std::holds_alternative<protocol::Adapters>(item.second)) continue;   // read when they are applied
        if (std::holds_alternative<protocol::StepCache>(item.second)) continue;  // its range is the row's
        if (std::holds_alternative<protocol::InputImage>(item.second)) continue;  // the launcher read it
        if (!std::holds_alternative<double>(item.second) && !std::holds_alternative<int64_t>(item.second))
            continue;  // a scheduler, its keys, a schedule: resolved and checked by scheduler_for
        const double v = values.number(a.row->name);
        const auto shown = [&](double x) {  // as the row's type writes it
            return protocol::call_value_text(a.row->type == protocol::CallType::kWhole
                                                 ? protocol::CallValue(static_cast<int64_t>(x))
                                                 : protocol::CallValue(x));
        };
        if (v < a.row->min || v > a.max)
            throw ModelError(std::string(a.row->name) + " " + shown(v) + ": must be " + shown(a.row->min) +
                             " to " + shown(a.max));
        if (a.row->below && v >= values.number(a.row->below))
            throw ModelError(std::string(a.row->name) + " " + shown(v) + ": must be below " + a.row->below +
                             " (" + shown(values.number(a.row->below)) + ")");
    }
    return values;
}

void FamilyPipeline::apply_adapters(const protocol::Adapters& adapters) const {
    if (!options_.adapters) {
        if (adapters.empty()) return;
        throw InternalError(
            "this pipeline was loaded without PipelineOptions::adapters, so it takes no adapters");
    }
    options_.adapters->apply(adapters, *model_.spec, options_.model_dir, options_.variant);
}

void FamilyPipeline::check_batch(const std::vector<GenerateRequest>& batch,
                                 const CallValues& arguments) const {
    const FamilyArgument* cfg = model_.arguments.guidance_scale();
    const bool negative_counts = cfg && cfg->guidance == protocol::Guidance::kAbove1WithNegative;
    protocol::Generation first = batch.front();
    first.arguments = arguments;
    for (const GenerateRequest& other : batch) {
        protocol::Generation completed = other;
        completed.arguments = &other == &batch.front() ? arguments : arguments_of(other);
        if (protocol::same_batch_settings(first, completed, negative_counts)) continue;
        std::string shared = "steps";
        for (const CallValues::Item& item : arguments.items())
            if (!item.first->shared_batch) shared += std::string(", ") + item.first->name;
        throw ModelError("a batch must share " + shared + ", size" +
                         (negative_counts ? " and whether a negative prompt is given" : ""));
    }
}

// Note [prompts encoded once]: a job often encodes the same text again: the negative prompt of
// every line, a prompt repeated at other seeds or sizes, a batch edit's one prompt over a folder.
// diffusers' pipelines encode it on every call; here a batch's branch whose prompts and call
// arguments (among them the adapters, with their files' SHA-256: the encoders' weights) are an
// earlier batch's reuses that encoding, which is the same tensors encode() would make again.
// The cache lives as long as the pipeline, one job, and keeps a few encodings (kEncodings, at most
// kEncodingBytes of them), the latest used first.
namespace {
constexpr std::size_t kEncodings = 16;
constexpr int64_t kEncodingBytes = int64_t{512} << 20;

int64_t tensor_bytes(const at::Tensor& t) { return t.defined() ? t.numel() * t.element_size() : 0; }
}  // namespace

Conditioning FamilyPipeline::encoded(const std::vector<std::string>& prompts,
                                     const CallValues& arguments) const {
    nlohmann::json key = {{"prompts", prompts}, {"arguments", nlohmann::json::array()}};
    for (const CallValues::Item& item : arguments.items())
        key["arguments"].push_back({item.first->name, protocol::call_value_json(item.second)});
    const std::string text = key.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    for (auto it = encodings_.begin(); it != encodings_.end(); ++it)
        if (it->first == text) {
            encodings_.splice(encodings_.begin(), encodings_, it);
            ++encodings_reused_;
            return it->second;
        }
    Conditioning c = encode(prompts, arguments);
    ++encodings_made_;
    encodings_.emplace_front(text, c);
    int64_t bytes = 0;
    std::size_t kept = 0;
    for (auto it = encodings_.begin(); it != encodings_.end(); ++kept) {
        bytes += tensor_bytes(it->second.text) + tensor_bytes(it->second.pooled) +
                 tensor_bytes(it->second.mask) + tensor_bytes(it->second.image);
        if (kept > 0 && (kept >= kEncodings || bytes > kEncodingBytes))
            it = encodings_.erase(it);
        else
            ++it;
    }
    return c;
}

FamilyPipeline::BranchTexts FamilyPipeline::encode_branches(const std::vector<GenerateRequest>& batch,
                                                            const CallValues& arguments,
                                                            const Guidance& guidance,
                                                            std::vector<GenerateResult>& results) const {
    auto encode_branch = [&](bool negative) {
        std::vector<std::string> prompts;
        for (const GenerateRequest& one : batch)
            prompts.push_back(negative ? one.negative_prompt.value_or("") : one.prompt);
        Conditioning c = encoded(prompts, arguments);
        for (std::size_t k = 0; k < batch.size() && k < c.warnings.size(); ++k)
            if (!c.warnings[k].empty())
                results[k].warnings.push_back((negative ? "negative prompt: " : "") + c.warnings[k]);
        return c;
    };
    // Batched here (negatives first), or one per rank of the cfg group (rank 0 the negative one),
    // each rank encoding only its branch.
    BranchTexts out;
    if (guidance.split()) {
        out.text = out.positive = encode_branch(guidance.runs_negative_only());
    } else {
        out.text = out.positive = encode_branch(false);
        if (guidance.enabled()) out.text = Conditioning::join(encode_branch(true), out.positive);
    }
    for (Conditioning* c : {&out.text, &out.positive})  // diffusers drops a mask of all ones
        if (c->mask.defined() && c->mask.all().item<bool>()) c->mask = at::Tensor();
    return out;
}

FamilyPipeline::StartLatents FamilyPipeline::initial_latents(const std::vector<GenerateRequest>& batch,
                                                             const LatentShape& shape,
                                                             const protocol::InputImage& image, float sigma,
                                                             const std::optional<EditCondition>& condition,
                                                             const std::optional<images::Box>& crop,
                                                             std::vector<at::Generator>& generators) const {
    // Drawn on CPU from a generator seeded per request, exactly as diffusers' randn_tensor with
    // generator=torch.Generator("cpu").manual_seed(seed), so an image does not depend on what else
    // is in its batch, nor on the device or the world.
    const bool from_image = !image.empty() && edit_starts_from_image();
    ImageLatents edited;
    if (from_image)  // the batch shares its image (a row that is not shared_batch)
        edited = encode_on_cpu(input_pixels(image, static_cast<int>(shape.width * model_.sizes.vae_scale),
                                            static_cast<int>(shape.height * model_.sizes.vae_scale), crop));
    const auto cpu = at::TensorOptions().dtype(options_.dtype);
    const auto drawn = [&](const ImageLatents& d, at::Generator& gen) {  // retrieve_latents' "sample"
        return d.mean + d.std * at::randn(d.mean.sizes(), gen, cpu);
    };
    std::vector<at::Tensor> starts, images, noises, conditions;
    for (const GenerateRequest& one : batch) {
        at::Generator& gen = generators.emplace_back(at::detail::createCPUGenerator(one.seed));
        if (!from_image) {
            starts.push_back(at::randn({1, shape.channels, shape.height, shape.width}, gen, cpu));
        } else {  // the image's sample, then the noise, from the prompt's one generator
            images.push_back(image_latents(drawn(edited, gen)));
            noises.push_back(at::randn(images.back().sizes(), gen, cpu));
            starts.push_back(scale_noise(images.back(), noises.back(), sigma));
        }
        if (condition) {  // Note [edit conditioning]: after the start, from the same generator
            at::Tensor rows = condition->ready
                                  ? condition->latents.mean
                                  : image_latents(condition->sampled ? drawn(condition->latents, gen)
                                                                     : condition->latents.mean);
            if (condition->channels.defined())
                rows = at::cat({rows, condition->channels.to(rows.scalar_type())}, 1);
            conditions.push_back(rows);
        }
    }
    const auto placed = [&](const std::vector<at::Tensor>& rows, bool pack) {
        if (rows.empty()) return at::Tensor();
        const at::Tensor all = at::cat(rows, 0);
        return (pack ? pack_latents(all) : all).to(options_.device, options_.dtype);
    };
    return {placed(starts, shape.packed), placed(images, shape.packed), placed(noises, shape.packed),
            placed(conditions, false)};
}

at::Tensor FamilyPipeline::latent_mask(const protocol::InputImage& mask, const LatentShape& shape,
                                       const std::optional<images::Box>& crop) const {
    if (const std::string why = inpainting_refusal(); !why.empty()) throw ModelError(why);
    const int64_t scale = model_.sizes.vae_scale;
    const at::Tensor pixels =
        input_mask(mask, static_cast<int>(shape.width * scale), static_cast<int>(shape.height * scale), crop);
    // torch.nn.functional.interpolate's default (nearest) to the latents' size, on every channel.
    at::Tensor m = at::upsample_nearest2d(pixels, std::vector<int64_t>{shape.height, shape.width})
                       .expand({1, shape.channels, shape.height, shape.width})
                       .contiguous();
    if (shape.packed) m = pack_latents(m);
    return m.to(options_.device, options_.dtype);
}

FamilyPipeline::Start FamilyPipeline::start(const std::vector<GenerateRequest>& batch,
                                            const CallValues& arguments, const LatentShape& shape,
                                            const Scheduler& scheduler) const {
    const int steps = batch.front().steps;
    const protocol::InputImage& edited = arguments.image("image");
    const protocol::InputImage& mask =
        model_.arguments.find("mask_image") ? arguments.image("mask_image") : protocol::InputImage{};
    const bool from_image = !edited.empty() && edit_starts_from_image();
    Start out;
    // diffusers' get_timesteps: the first step's first call (Heun makes two a step).
    out.first = from_image ? img2img_first_step(steps, arguments.number("strength")) * scheduler.order() : 0;
    const std::optional<EditCondition> condition =
        edited.empty() ? std::nullopt : edit_condition(edited, mask, shape);
    if (from_image)
        out.crop = inpaint_crop(arguments, static_cast<int>(shape.width * model_.sizes.vae_scale),
                                static_cast<int>(shape.height * model_.sizes.vae_scale));
    const std::size_t at = std::min(static_cast<std::size_t>(out.first), scheduler.sigmas().size() - 1);
    out.latents =
        initial_latents(batch, shape, edited, scheduler.sigmas()[at], condition, out.crop, out.generators);
    // Inpainting: after each step, the known region is the image's latents noised to the next
    // step's sigma (none after the last), the mask's white part the denoised one. A mask the
    // conditioning carries (Fill) is the model's to follow: no blend.
    if (from_image && !mask.empty() && !(condition && condition->channels.defined()))
        out.blend = latent_mask(mask, shape, out.crop);
    return out;
}

void FamilyPipeline::decode_results(std::vector<GenerateResult>& results, const at::Tensor& latents,
                                    const LatentShape& shape, const Start& run, const CallValues& arguments,
                                    int steps) const {
    at::Tensor image = shape.packed ? unpack_latents(latents, shape.height, shape.width) : latents;
    const DeviceMapping* dm = options_.device_map.get();
    if (dm && decoder()) image = dm->move(image, dm->slot_of("transformer"), dm->slot_of(decoder()));
    finish_results(results, run.blend.defined() ? decode_inpainted(image) : decode(image), latents, steps);
    if (!run.crop) return;
    // Note [padding_mask_crop]: each pasted back into the original.
    std::vector<at::Tensor> made;
    for (const GenerateResult& out : results) made.push_back(out.image);
    const at::Tensor pasted = overlay_inpainting(at::stack(made, 0), arguments, *run.crop);
    for (std::size_t k = 0; k < results.size(); ++k)
        results[k].image = pasted[static_cast<int64_t>(k)].contiguous();
}

at::Tensor FamilyPipeline::step_noise(const StepInputs& in, const Guidance& guidance, StepCacheRun& cache,
                                      const CallValues& arguments) const {
    const at::Tensor model_in = guidance.model_input(in.latents);
    // Note [step cache point]: the one place a step's prediction is made.
    const auto run = [&](int64_t first, int64_t count) {
        return cache.call(first, count, [&](const StepCaches& caches) {
            return predict(model_in.narrow(0, first, count), in.shape, in.text.rows(first, count),
                           in.timestep, arguments, BlockRunner(caches));
        });
    };
    // Note [steps without guidance]: a guided request's step that combines nothing (guided_at false:
    // Z-Image's cfg_truncation) is the positive branch's prediction. Where this rank holds both
    // branches only the positive rows run, under the positive branch's step cache; split over a cfg
    // group each rank still runs its own, the negative one's dropped, so that no rank idles out of
    // step with the other.
    if (guidance.enabled() && !guidance.split() && !guided_at(in.timestep, arguments)) {
        const int64_t half = model_in.size(0) / 2;  // [negative; positive]
        return run(half, half);
    }
    const at::Tensor prediction = guidance.predict(model_in.size(0), options_.device.is_cpu(), run);
    if (guidance.enabled() && extra_at(in.step, in.steps, arguments)) {
        at::Tensor extra;
        if (guidance.runs_positive())
            extra = predict_extra(in.latents, in.shape, in.positive, in.timestep, arguments);
        return guidance.combine(prediction, extra,
                                [&](const at::Tensor& n, const at::Tensor& p, const at::Tensor& e) {
                                    return combine_extra(n, p, e, arguments);
                                });
    }
    const bool combined = !guidance.enabled() || guided_at(in.timestep, arguments);
    return guidance.combine(prediction, [&](const at::Tensor& n, const at::Tensor& p) {
        return combined ? combine(n, p, arguments) : p;
    });
}

std::unique_ptr<Scheduler> FamilyPipeline::scheduler_for(const GenerateRequest& r,
                                                         const CallValues& arguments,
                                                         const LatentShape& shape) const {
    protocol::ResolvedScheduler resolved;
    const nlohmann::json own = nlohmann::json::parse(scheduler_);
    if (const std::string why =
            protocol::resolve_scheduler(own, arguments.scheduler("scheduler"),
                                        arguments.scheduler_overrides("scheduler_config"), resolved);
        !why.empty())
        throw ModelError(why);
    const std::vector<double>& sigmas = arguments.numbers("sigmas");
    const std::vector<double>& timesteps = arguments.numbers("timesteps");
    if (const std::string why = protocol::schedule_problem(resolved, r.steps, sigmas, timesteps);
        !why.empty())
        throw ModelError(why);
    // What the pipeline hands set_timesteps (retrieve_timesteps): its sigmas, or the prompt's, and
    // mu, each only where the scheduler takes it (Note [one scheduler table]).
    const double mu = takes_mu(resolved) ? shift_mu(shape.tokens, r.steps, resolved.json()) : 0.0;
    std::unique_ptr<Scheduler> scheduler = make_scheduler(resolved);
    scheduler->set_timesteps(schedule_inputs(resolved, sigma_schedule(), r.steps, sigmas, timesteps, mu));
    return scheduler;
}

std::vector<GenerateResult> FamilyPipeline::generate_batch(const std::vector<GenerateRequest>& batch) const {
    c10::InferenceMode inference;  // no autograd bookkeeping on any tensor made here
    if (batch.empty()) return {};
    const GenerateRequest& r = batch.front();
    const CallValues arguments = arguments_of(r);
    check_batch(batch, arguments);
    apply_adapters(arguments.adapters("lora"));
    std::vector<GenerateResult> results(batch.size());
    const auto [width, height] = checked_size(*this, r);

    // The branches: diffusers runs the negative one only where the family's guidance scale asks
    // for it (and, for some, a negative prompt is given).
    const bool guided = model_.arguments.runs_two_branches(arguments, r.negative_prompt.has_value());
    const FamilyArgument* cfg = model_.arguments.guidance_scale();
    if (!guided && r.negative_prompt && cfg && cfg->guidance == protocol::Guidance::kAbove1WithNegative)
        for (GenerateResult& out : results)
            out.warnings.push_back("a negative prompt is given but " + std::string(cfg->row->name) + " is " +
                                   std::to_string(guidance_scale(arguments)).substr(0, 4) +
                                   ": classifier-free guidance runs only above 1");
    // `positive` is the positive branch's own (an extra prediction's input), where this rank has it.
    const Guidance guidance(guided, parallel_->cfg());
    PhaseClock clock(options_.device);  // Note [phase split]
    PhaseTimes times;
    const int64_t made = encodings_made_, reused = encodings_reused_;
    const BranchTexts branches = encode_branches(batch, arguments, guidance, results);
    times.encodings = encodings_made_ - made;
    times.reused_encodings = encodings_reused_ - reused;
    const LatentShape shape = latents(width, height);

    const std::unique_ptr<Scheduler> scheduler = scheduler_for(r, arguments, shape);
    const Start run = start(batch, arguments, shape, *scheduler);
    const int first = run.first;
    const int calls = static_cast<int>(scheduler->timesteps().size());  // Heun: two a step
    // A stochastic sampler's noise: each prompt's rows from its own generator, as diffusers' randn_tensor
    // draws them from a list of generators (float32, on the CPU, then moved).
    std::vector<at::Generator> generators = run.generators;
    const StepNoise noise = [&generators](const at::Tensor& like) {
        std::vector<at::Tensor> rows;
        const int64_t per = like.size(0) / static_cast<int64_t>(generators.size());
        std::vector<int64_t> shape(like.sizes().begin(), like.sizes().end());
        shape[0] = per;
        for (at::Generator& g : generators)
            rows.push_back(at::randn(shape, g, at::TensorOptions().dtype(at::kFloat)));
        return at::cat(rows, 0).to(like.device());
    };
    times.encode_ms = clock.lap_ms();
    const StartLatents& start = run.latents;
    const at::Tensor& blend = run.blend;
    at::Tensor latents = start.latents;
    // The edit's conditioning beside the latents, in every branch's rows (Note [edit conditioning]).
    Conditioning text = branches.text, positive = branches.positive;
    if (start.condition.defined()) {
        text.image = guidance.model_input(start.condition);
        positive.image = start.condition;
    }

    // The step cache, for this batch's steps (Note [first block cache], Note [taylorseer cache]).
    // The step cache, for this batch's model calls (Heun's two a step counted).
    StepCacheRun cache(arguments.cache("cache"), guidance, static_cast<int64_t>(batch.size()),
                       std::max(calls - first, 0), parallel_->tensor().group);

    std::shared_ptr<const void> transformer = hold_transformer();
    const KernelWindow kernels(options_.device.is_cpu());  // Note [kernel time in the steps]
    for (int i = first; i < calls; ++i) {
        const double timestep = scheduler->timesteps()[static_cast<std::size_t>(i)];
        const StepInputs in{latents, shape, text, positive, timestep, i, r.steps};
        const at::Tensor guided_noise = step_noise(in, guidance, cache, arguments);
        latents = scheduler->step(guided_noise, i, latents, noise);
        if (blend.defined()) {
            const at::Tensor known = i + 1 < calls
                                         ? scale_noise(start.image, start.noise,
                                                       scheduler->sigmas()[static_cast<std::size_t>(i + 1)])
                                         : start.image;
            latents = (1 - blend) * known + blend * latents;
        }
        if (r.on_step) r.on_step(i + 1 - first, calls - first);
    }
    transformer.reset();  // with offload, freed before the decoder is built
    const int64_t computed = cache.computed(parallel_->cfg(), options_.device);
    const std::vector<double> mag_ratios = cache.mag_ratios(parallel_->cfg(), options_.device);
    times.steps_ms = clock.lap_ms();
    times.gemm_ms = kernels.elapsed().gemm;
    times.attention_ms = kernels.elapsed().attention;
    // This rank's passes: each prompt's branches here through each call, or what a cache computed
    // of them (counted over both branches; a cfg group's rank runs one).
    const int64_t branches_here = guidance.enabled() && !guidance.split() ? 2 : 1;
    const int64_t passes =
        computed >= 0 ? computed / (guidance.split() ? 2 : 1) : branches_here * std::max(calls - first, 0);
    count_work(times, width, height, text, passes * static_cast<int64_t>(batch.size()));

    decode_results(results, latents, shape, run, arguments, r.steps);
    times.decode_ms = clock.lap_ms();
    results.front().phases = times;
    for (GenerateResult& out : results) {
        out.computed_steps = computed;
        out.cache_metrics = cache.metrics();
        out.mag_ratios = mag_ratios;
    }
    return results;
}

}  // namespace dp::runtime
