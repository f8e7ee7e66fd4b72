#pragma once
// The samplers of Note [one scheduler table] (protocol/schedulers.h), as diffusers 0.42.1 computes
// them: FlowMatchEulerDiscreteScheduler (all its schedules, stochastic sampling),
// FlowMatchHeunDiscreteScheduler (two passes a step), FlowMatchLCMScheduler, and
// DPMSolverMultistepScheduler and UniPCMultistepScheduler on flow sigmas. The loop runs one model
// call per timestep (Heun's list holds each step's two) and hands each output to step(); the
// multistep solvers keep their history of the batch's rows, each row its own prompt's. Noise a
// stochastic sampler adds comes from the StepNoise the loop gives: each prompt's own generator,
// continued after its initial latents, so that an image depends on its seed alone.

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "protocol/schedulers.h"

namespace dp::runtime {

// What the pipeline gives set_timesteps (retrieve_timesteps' arguments): `steps`, and the sigmas,
// timesteps and mu where the scheduler takes them (empty, nullopt: none).
struct ScheduleInputs {
    int steps = 0;
    std::vector<double> sigmas, timesteps;
    std::optional<double> mu;
};

// The sigmas a pipeline gives the scheduler (where its set_timesteps takes sigmas; a prompt's own
// `sigmas` or `timesteps` replace them).
enum class SigmaSchedule {
    kScheduler,     // the scheduler's own schedule from its config (StableDiffusion3Pipeline)
    kEvenlySpaced,  // 1 down to 1 / steps, evenly, as numpy makes them (QwenImagePipeline, ZImagePipeline)
    // ... except to a scheduler on flow sigmas (DPM-Solver++, UniPC), which builds its own
    // (FluxPipeline, Flux2Pipeline)
    kEvenlySpacedUnlessFlowSigmas,
};

// What a pipeline whose sigmas are `rule` hands `scheduler`'s set_timesteps for `steps` steps, a
// prompt's `sigmas` and `timesteps` (empty: none) and the dynamic shift's `mu` (retrieve_timesteps:
// each only where the scheduler takes it; mu only with dynamic shifting).
ScheduleInputs schedule_inputs(const protocol::ResolvedScheduler& scheduler, SigmaSchedule rule, int steps,
                               const std::vector<double>& sigmas, const std::vector<double>& timesteps,
                               double mu);
// Whether `scheduler` shifts by a mu (its set_timesteps takes one and its config shifts dynamically).
bool takes_mu(const protocol::ResolvedScheduler& scheduler);

// Noise of `like`'s shape in float32 on its device, row k drawn from the k-th prompt's generator.
using StepNoise = std::function<at::Tensor(const at::Tensor& like)>;

class Scheduler {
  public:
    virtual ~Scheduler() = default;
    virtual void set_timesteps(const ScheduleInputs& inputs) = 0;
    // One per model call, and the sigmas they index (one more: the end).
    const std::vector<float>& timesteps() const { return timesteps_; }
    const std::vector<float>& sigmas() const { return sigmas_; }
    // Model calls per step (diffusers' order): an edit starts at its first step times this.
    int order() const { return order_; }
    // The sample after call `index`'s `model_output`; calls are made in order from the first one.
    virtual at::Tensor step(const at::Tensor& model_output, int index, const at::Tensor& sample,
                            const StepNoise& noise) = 0;

  protected:
    explicit Scheduler(int order) : order_(order) {}
    std::vector<float> sigmas_, timesteps_;

  private:
    int order_;
};

// The scheduler `resolved` describes (its config already checked by protocol::resolve_scheduler).
std::unique_ptr<Scheduler> make_scheduler(const protocol::ResolvedScheduler& resolved);

// numpy.linspace(1, 1 / steps, steps) as numpy computes it (start + i * step, the last element
// exactly 1 / steps): the sigmas FluxPipeline and QwenImagePipeline pass to the scheduler.
std::vector<double> linspace_sigmas(int steps);

// diffusers' calculate_shift over the keys a pipeline reads from its scheduler's config
// (config.get(key, default)): mu for a resolution-dependent shift, linear in the image tokens.
double calculate_shift(const nlohmann::json& scheduler_config, int64_t image_seq_len);

}  // namespace dp::runtime
