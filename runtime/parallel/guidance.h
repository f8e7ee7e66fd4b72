#pragma once
// Classifier-free guidance's two branches, as the parallel layer runs them: both as one batch on
// this rank (negative first, as diffusers orders them), or one per rank of a cfg group of two
// (rank 0 the negative branch, rank 1 the positive), exchanging noise predictions each step. The
// rule that combines them is the pipeline's own (SD3: linear; others rescale or have none).
//
// Note [CFG branches on the CPU]: batched, the branches are one call of twice the rows, which a GPU
// runs faster than two. On the CPU it is slower: FLUX's medium benchmark (768x768, width 512)
// takes 2.1-2.2 x one branch's time for the pair, against 2.0 x for two calls (and diffusers'
// FluxPipeline makes two). So a CPU device runs them one after the other; the results are the
// same (each row's computation does not depend on the others).

#include <ATen/core/Tensor.h>

#include <functional>

namespace dp::runtime {

class Communicator;

class Guidance {
  public:
    using Combine = std::function<at::Tensor(const at::Tensor& negative, const at::Tensor& positive)>;

    // `enabled`: this request has a negative branch (SD3: guidance scale > 1). `cfg_group`: the
    // rank's cfg group, or nullptr.
    Guidance(bool enabled, Communicator* cfg_group);

    bool enabled() const { return enabled_; }
    // Whether the branches are split over the cfg group.
    bool split() const { return group_ != nullptr; }
    // Split: whether this rank runs the negative branch. Batched: false.
    bool runs_negative_only() const;
    // The model's input for this step: the latents twice (batched), else once.
    at::Tensor model_input(const at::Tensor& latents) const;
    // The model's prediction on model_input(): `model(first, rows)` runs it on those rows of every
    // batched input (the latents, the texts, the timesteps). Batched on a CPU device, the branches
    // go one call each (Note [CFG branches on the CPU]); else one call over all rows.
    using Model = std::function<at::Tensor(int64_t first, int64_t rows)>;
    at::Tensor predict(int64_t rows, bool on_cpu, const Model& model) const;
    // The guided noise from the model's output on model_input(): the branches (gathered over the
    // cfg group when split, so every rank of it gets the same result) through `combine`.
    at::Tensor combine(const at::Tensor& noise, const Combine& combine) const;

    // A third prediction made from the positive branch's input (skip-layer guidance's: the same
    // model with blocks skipped). Only the rank that runs the positive branch makes it (batched:
    // this rank); `extra` is undefined on the other. Every rank of the cfg group gets `rule` of the
    // three, exchanged in the one gather the branches already need.
    using Combine3 = std::function<at::Tensor(const at::Tensor& negative, const at::Tensor& positive,
                                              const at::Tensor& extra)>;
    bool runs_positive() const { return enabled_ && !runs_negative_only(); }
    at::Tensor combine(const at::Tensor& noise, const at::Tensor& extra, const Combine3& rule) const;

  private:
    bool enabled_;
    Communicator* group_;
};

// diffusers' classifier-free guidance: negative + scale * (positive - negative).
at::Tensor linear_guidance(const at::Tensor& negative, const at::Tensor& positive, double scale);

}  // namespace dp::runtime
