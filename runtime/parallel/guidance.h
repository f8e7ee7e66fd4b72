#pragma once
// Classifier-free guidance's two branches, as the parallel layer runs them: both as one batch on
// this rank (negative first, as diffusers orders them), or one per rank of a cfg group of two
// (rank 0 the negative branch, rank 1 the positive), exchanging noise predictions each step. The
// rule that combines them is the pipeline's own (SD3: linear; others rescale or have none).

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
    // The guided noise from the model's output on model_input(): the branches (gathered over the
    // cfg group when split, so every rank of it gets the same result) through `combine`.
    at::Tensor combine(const at::Tensor& noise, const Combine& combine) const;

    // A third prediction made from the positive branch's input (skip-layer guidance's: the same
    // model with blocks skipped). Only the rank that runs the positive branch makes it (batched:
    // this rank); `extra` is undefined on the other. Every rank of the cfg group gets `rule` of the
    // three, exchanged in the one gather the branches already need.
    using Combine3 =
        std::function<at::Tensor(const at::Tensor& negative, const at::Tensor& positive, const at::Tensor& extra)>;
    bool runs_positive() const { return enabled_ && !runs_negative_only(); }
    at::Tensor combine(const at::Tensor& noise, const at::Tensor& extra, const Combine3& rule) const;

  private:
    bool enabled_;
    Communicator* group_;
};

// diffusers' classifier-free guidance: negative + scale * (positive - negative).
at::Tensor linear_guidance(const at::Tensor& negative, const at::Tensor& positive, double scale);

}  // namespace dp::runtime
