#pragma once
// Note [one denoising loop]: every family's text-to-image call runs the same steps, as diffusers'
// pipelines do and stable-diffusion.cpp's one runner does: check the batch, encode the prompts of
// each guidance branch, draw each prompt's noise on the CPU from its own seed, build the sigmas
// with the one scheduler, then per step predict (the branches split over a cfg group, batched, or
// one call per branch on the CPU: Note [CFG branches on the CPU]), combine the branches, take the
// Euler step and report it, and at the end release the transformer (offload) and decode.
// FamilyPipeline::generate_batch is that loop, written once; a family writes its math only, in
// the hooks below. Nothing in a family folder draws noise, builds sigmas or drives the scheduler.
//
// Two points are kept for features that act on every family at once:
//   - Note [step cache point]: each step's prediction is made in one place, identically on every
//     rank of a replica (the same requests, the same step): a step cache decides there whether to
//     compute it or reuse the last one, from values every rank holds alike;
//   - weights reach a family through one call, open_weights (pipeline_common.h), before any
//     ParallelLinear shards them: adapters change a weight there, from unmodified base weights,
//     so that each rank's shard of the change is its shard of the changed weight.

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>
#include "images/vae_image_processor.h"

#include "runtime/pipeline/pipeline.h"
#include "runtime/pipeline/schedulers.h"
#include "strategies/model_config.h"

namespace dp::runtime {

class ParallelContext;
class BlockRunner;
class Scheduler;
struct ComponentsBase;
class Guidance;
class StepCacheRun;

// One guidance branch's text conditioning of a batch, batch first: what a family's encode makes of
// its prompts, and what its predict takes.
struct Conditioning {
    at::Tensor text;    // [n, T, D]
    at::Tensor pooled;  // [n, P], or undefined
    at::Tensor mask;    // [n, T] int64, 1 for a prompt's own tokens; undefined: all of them are
    // An edit's image as the transformer takes it beside the latents (Note [edit conditioning]):
    // [n, C, h, w] unpacked, in the run's dtype; undefined for text to image, img2img and inpainting.
    at::Tensor image;
    // Its last text token stands for this many equal ones (SD3's Note [constant text tail]).
    int64_t tail_repeats = 1;
    std::vector<std::string> warnings;  // per prompt: diffusers' truncation warning, or empty

    // Rows [first, first + count) of every tensor.
    Conditioning rows(int64_t first, int64_t count) const;
    // `a`'s rows, then `b`'s (diffusers' order: the negatives first); a shorter text is padded with
    // masked positions. The two must have the same tail_repeats.
    static Conditioning join(const Conditioning& a, const Conditioning& b);
};

// An image's latent distribution from the family's VAE encoder (diffusers' latent_dist): its mean
// and standard deviation, [1, C, h, w] before any packing, unscaled.
struct ImageLatents {
    at::Tensor mean, std;
};

// Note [edit conditioning]: some pipelines give the transformer an edit's image beside the
// latents rather than (or as well as) starting from it: FluxFillPipeline the masked image's
// latents and the mask, concatenated on channels; FluxKontextPipeline the reference image's
// latents, appended as tokens of their own. The family encodes what it needs once for a batch
// (edit_condition); the loop draws each prompt's rows after its start latents, from the prompt's
// generator where the pipeline samples (Fill: retrieve_latents' "sample" of the masked image after
// the noise; Kontext: the mean, no draw), and hands them to predict in Conditioning::image, split
// between the guidance branches and batches as the latents are. The family's predict decides where
// they go; no second loop.
struct EditCondition {
    ImageLatents latents;  // the encoder's distribution of what it encodes, [1, C, h, w], on the CPU
    bool sampled = false;  // each prompt draws a sample; else the mean is taken
    // Rows appended on channels after the image's latents, [1, K, h, w] (Fill's mask), or undefined.
    at::Tensor channels;
    // The mean is already as the transformer takes it (packed, scaled: Qwen-Image-Edit's pictures,
    // each of its own size, in one sequence): the loop repeats it for each prompt as it is.
    bool ready = false;
};

// One image's initial latents as the family's transformer takes them: [channels, height, width],
// drawn as diffusers draws them, packed 2x2 or not, and the image tokens they make (the sequence
// length the scheduler's dynamic shift reads).
struct LatentShape {
    int64_t channels = 0, height = 0, width = 0;
    bool packed = false;
    int64_t tokens = 0;
};

// The latents FluxPipeline and QwenImagePipeline make: `channels` of them, each side the pixels
// over `vae_scale` rounded down to even, packed 2x2 (a token per patch).
LatentShape packed_latents(int64_t channels, int64_t vae_scale, int width, int height);

class FamilyPipeline : public DiffusionPipeline {
  public:
    // Only the batched matmuls' shapes differ from one request at a time, which can move a pixel
    // by one step of 255 (docs/models.md, "Seeds and determinism").
    std::vector<GenerateResult> generate_batch(const std::vector<GenerateRequest>& requests) const final;

    // What the model's folder says: its family, shape, sizes and call-argument defaults.
    const strategies::ModelInfo& model() const { return model_; }
    // The sizes its configs allow (strategies::ImageSizeRule): sample_size latents a side by
    // default, multiples of the VAE's scale times the patch the pipeline packs.
    int default_width() const override { return static_cast<int>(model_.sizes.default_side); }
    int default_height() const override { return default_width(); }
    int size_multiple() const override { return static_cast<int>(model_.sizes.multiple()); }
    // `request`'s call arguments with each one it leaves out at the model's default. Throws
    // ModelError for one the family does not take, or out of its range.
    protocol::CallValues arguments_of(const GenerateRequest& request) const;

  protected:
    // The options, place and scheduler the family loaded `components` with (the place must
    // outlive the pipeline).
    FamilyPipeline(const ComponentsBase& components, strategies::ModelInfo model);

    // --- The family's math ---
    // The conditioning of `prompts` (one branch), its tensors on the transformer's device.
    virtual Conditioning encode(const std::vector<std::string>& prompts,
                                const protocol::CallValues& arguments) const = 0;
    // The initial latents of one image of width x height pixels.
    virtual LatentShape latents(int width, int height) const = 0;
    // Which sigmas the scheduler gets (shifted as its config says). Default: its own schedule.
    virtual SigmaSchedule sigma_schedule() const { return SigmaSchedule::kScheduler; }
    // The dynamic shift's mu for `tokens` image tokens and `steps` steps, given the request's
    // scheduler's config. Default: calculate_shift from that config (FLUX.2's pipelines compute their own).
    virtual double shift_mu(int64_t tokens, int steps, const nlohmann::json& scheduler) const;
    // The transformer, held for a batch's steps: with offload it is built now and freed when the
    // loop lets go of it, before the decoder is built.
    virtual std::shared_ptr<const void> hold_transformer() const = 0;
    // The transformer's noise prediction for `latents` (the model's input rows, of `shape`) at the
    // scheduler's `timestep`, one call; `blocks`: what its transformer runs its blocks through
    // (Note [block runner]).
    virtual at::Tensor predict(const at::Tensor& latents, const LatentShape& shape, const Conditioning& text,
                               double timestep, const protocol::CallValues& arguments,
                               const BlockRunner& blocks) const = 0;
    // The guided noise from the two branches' predictions. Default: diffusers' linear guidance at
    // the family's guidance scale.
    virtual at::Tensor combine(const at::Tensor& negative, const at::Tensor& positive,
                               const protocol::CallValues& arguments) const;
    // Whether a guided request's step at the scheduler's `timestep` combines the branches; false: the
    // positive branch's prediction is the step's (Z-Image's cfg_truncation). Default: every step.
    virtual bool guided_at(double timestep, const protocol::CallValues& arguments) const;
    // An extra prediction from the positive branch's input on some steps (SD3's skip-layer
    // guidance): whether step `step` of `steps` makes one, the prediction, and the rule of three.
    virtual bool extra_at(int step, int steps, const protocol::CallValues& arguments) const;
    virtual at::Tensor predict_extra(const at::Tensor& latents, const LatentShape& shape,
                                     const Conditioning& positive, double timestep,
                                     const protocol::CallValues& arguments) const;
    virtual at::Tensor combine_extra(const at::Tensor& negative, const at::Tensor& positive,
                                     const at::Tensor& extra, const protocol::CallValues& arguments) const;
    // The images [n, 3, H, W] in [-1, 1] from the final latents, unpacked [n, C, h, w] and on the
    // decoder's device.
    virtual at::Tensor decode(const at::Tensor& latents) const = 0;
    // ... of an inpainting line's latents (those blended with the image's). Default: decode.
    virtual at::Tensor decode_inpainted(const at::Tensor& latents) const { return decode(latents); }
    // The component that decodes (its device_map slot); nullptr: none (pixel space).
    virtual const char* decoder() const { return "vae"; }
    // --- Image inputs (Note [img2img in the one loop]) ---
    // The latent distribution of `pixels` ([1, 3, H, W] in [-1, 1], the run's dtype, on the
    // decoder's device). Default: a ModelError (the family edits no images).
    virtual ImageLatents encode_image(const at::Tensor& pixels) const;
    // A sample of that distribution as the transformer's latents are scaled (AutoencoderKL's
    // (x - shift_factor) * scaling_factor), unpacked.
    virtual at::Tensor image_latents(const at::Tensor& sample) const;
    // Why this model's inpainting pipeline would not use a mask (empty: it does).
    virtual std::string inpainting_refusal() const { return {}; }
    // What an edit's `image` (and `mask`, possibly empty) gives the transformer beside the latents
    // of `shape` (Note [edit conditioning]); nullopt: nothing, the image is the start alone.
    virtual std::optional<EditCondition> edit_condition(const protocol::InputImage& image,
                                                        const protocol::InputImage& mask,
                                                        const LatentShape& shape) const;
    // Whether an edit starts from its image noised to strength's sigma (img2img, inpainting,
    // Fill), or from noise as text to image does (Kontext: the image is a reference only).
    virtual bool edit_starts_from_image() const { return true; }

    // --- For the families ---
    // The latent distribution of `pixels` ([1, 3, H, W] in [-1, 1], float32 on the CPU) through
    // encode_image on the decoder's device, in the run's dtype, returned on the CPU.
    ImageLatents encode_on_cpu(const at::Tensor& pixels) const;
    // `x` in the run's dtype, moved from `component`'s device to the transformer's (device_map).
    at::Tensor to_transformer(const at::Tensor& x, const char* component) const;
    // The value of the family's classifier-free guidance scale in `arguments`.
    double guidance_scale(const protocol::CallValues& arguments) const;
    const PipelineOptions& options() const { return options_; }
    const ParallelContext& parallel() const { return *parallel_; }

  private:
    // Builds again the components `adapters` (the batch's) change, when they are not the current
    // set (Note [adapter switches]).
    void apply_adapters(const protocol::Adapters& adapters) const;
    // Each guidance branch's conditioning as this rank runs it: `text` the model's input rows (both
    // branches batched, negatives first, or this rank's one), `positive` the positive branch's own.
    // Truncation warnings go to `results`.
    struct BranchTexts {
        Conditioning text, positive;
    };
    BranchTexts encode_branches(const std::vector<GenerateRequest>& batch,
                                const protocol::CallValues& arguments, const Guidance& guidance,
                                std::vector<GenerateResult>& results) const;
    // Note [prompts encoded once]: encode(prompts, arguments), or what an earlier batch of the job
    // got for the same prompts under the same call arguments.
    Conditioning encoded(const std::vector<std::string>& prompts,
                         const protocol::CallValues& arguments) const;
    // The batch's initial latents on the run's device, each prompt's noise from its own seed; for
    // an edit (`image` not empty), the image's latents noised to `sigma` (Note [img2img in the
    // one loop]), with the image's latents and the noise kept for inpainting's blend.
    // `condition`: the batch's edit conditioning, whose rows go to `condition` (Note [edit
    // conditioning]); `from_image` false: the latents start from noise whatever `image` is.
    struct StartLatents {
        at::Tensor latents, image, noise;  // image, noise: undefined unless started from an image
        at::Tensor condition;              // Conditioning::image's rows, or undefined
    };
    // `generators`: each prompt's, continued after its draws here (a stochastic sampler's noise).
    StartLatents initial_latents(const std::vector<GenerateRequest>& batch, const LatentShape& shape,
                                 const protocol::InputImage& image, float sigma,
                                 const std::optional<EditCondition>& condition,
                                 const std::optional<images::Box>& crop,
                                 std::vector<at::Generator>& generators) const;
    // Where a batch's steps start: the first step (an edit from its image starts later), the
    // initial latents and the edit's conditioning, and inpainting's blend (the latent mask, or
    // undefined).
    struct Start {
        int first = 0;
        StartLatents latents;
        at::Tensor blend;
        std::optional<images::Box> crop;        // Note [padding_mask_crop]
        std::vector<at::Generator> generators;  // each prompt's, continued
    };
    Start start(const std::vector<GenerateRequest>& batch, const protocol::CallValues& arguments,
                const LatentShape& shape, const Scheduler& scheduler) const;
    // The request's scheduler (Note [one scheduler table]) with its timesteps set for `shape`.
    std::unique_ptr<Scheduler> scheduler_for(const GenerateRequest& r, const protocol::CallValues& arguments,
                                             const LatentShape& shape) const;
    // The final `latents` (the model's rows, of `shape`) decoded into `results`' images, as `run`
    // began them (an inpainting's decode; padding_mask_crop's paste back).
    void decode_results(std::vector<GenerateResult>& results, const at::Tensor& latents,
                        const LatentShape& shape, const Start& run, const protocol::CallValues& arguments,
                        int steps) const;
    // Inpainting's mask as the latents hold it (1: repainted), on the run's device.
    at::Tensor latent_mask(const protocol::InputImage& mask, const LatentShape& shape,
                           const std::optional<images::Box>& crop) const;
    // One step's inputs, as the loop holds them: the latents (this rank's rows of the batch), their
    // shape, the model's conditioning rows and the positive branch's own, the scheduler's timestep,
    // and the step's index among `steps`.
    struct StepInputs {
        const at::Tensor& latents;
        const LatentShape& shape;
        const Conditioning &text, &positive;
        double timestep;
        int step, steps;
    };
    // The guided noise of one step: the branches' predictions (Note [step cache point]) combined.
    at::Tensor step_noise(const StepInputs& in, const Guidance& guidance, StepCacheRun& cache,
                          const protocol::CallValues& arguments) const;
    // Throws ModelError unless the batch shares what one pass through the model needs.
    void check_batch(const std::vector<GenerateRequest>& batch, const protocol::CallValues& arguments) const;
    // Note [phase split]: `passes` passes' work on this rank for a batch of `width` x `height`
    // images under `text` (the model's own text tokens, an edit's reference image's tokens).
    void count_work(PhaseTimes& times, int width, int height, const Conditioning& text, int64_t passes) const;

    PipelineOptions options_;
    const ParallelContext* parallel_;
    strategies::ModelInfo model_;
    std::string scheduler_;  // the folder's scheduler_config.json
    // The transformer's config.json, for its FLOPs (Note [FLOPs of a pass]); null: not counted.
    std::shared_ptr<const nlohmann::json> transformer_config_;
    // Note [prompts encoded once]: the latest encodings, the newest first, by their key.
    mutable std::list<std::pair<std::string, Conditioning>> encodings_;
    mutable int64_t encodings_made_ = 0, encodings_reused_ = 0;
};

}  // namespace dp::runtime
