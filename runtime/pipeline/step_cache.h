#pragma once
// Note [first block cache]: diffusers' FirstBlockCache (FirstBlockCacheConfig(threshold)), one
// implementation for every family. Each transformer pass runs its first block; the change of that
// block's image-stream residual since the last pass computed in full,
//     mean |residual - last residual| / mean |last residual|,
// decides: above the threshold (or on a branch's first pass) the other blocks run, and what they
// added to the image stream is kept; at or below it, they are skipped and the first block's output
// plus what they added last time stands for the last block's. Only the image stream matters: the
// text stream's last value feeds nothing after the blocks.
//
// - Each guidance branch has its own state, as diffusers' cache contexts "cond" and "uncond"
//   give it; the prompts of a batch share their branch's (diffusers' one mean over the batch).
// - The same decision on every rank: the two sums are taken over the whole sequence, padding left
//   out, and all-reduced over the sequence groups (SequenceShard::sum_tokens), so uneven shards
//   decide as one process does; the decisions are then agreed over the tensor-parallel group.
// - The means are rounded to the run's dtype and divided in it, as diffusers' .mean() and its
//   division of two 0-d tensors are.
// - When branches batched in one call decide differently, the other blocks run for all of the
//   call's rows and the skipping branch's rows take their reuse (its state is left as it was).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "protocol/call_arguments.h"

namespace dp::runtime {

class Communicator;
class Guidance;
class SequenceShard;

// One guidance branch's cache across a request's steps.
struct FirstBlockState {
    at::Tensor residual;          // the first block's image-stream residual at the last pass computed in full
    at::Tensor rest;              // what the other blocks added to the image stream at that pass
    int64_t computed = 0;         // the passes computed in full
    std::vector<double> metrics;  // per pass: the relative change compared with the threshold (-1: the first)
    std::vector<bool> decisions;  // per pass: computed in full
};

// The cache as one transformer call sees it: its rows, a branch's state for each group of them.
class FirstBlockCache {
  public:
    struct Group {
        FirstBlockState* state;
        int64_t first, rows;  // of the call's batch
    };
    // `tensor_group`: the rank's tensor-parallel group (nullptr: none), over which decisions are agreed.
    FirstBlockCache(double threshold, std::vector<Group> groups, Communicator* tensor_group);

    // The image stream after the last block: `before` and `after` are the first block's input and
    // output ([rows, this rank's tokens of `image`, width]); `rest(after)` runs the other blocks and
    // returns the last one's image stream. Runs `rest` unless no group needs it. Every rank of the
    // call's sequence and tensor groups calls it at the same point.
    // (Taken by value: the caller's variables may be what `rest` reassigns.)
    at::Tensor run(at::Tensor before, at::Tensor after, const SequenceShard& image,
                   const std::function<at::Tensor(const at::Tensor&)>& rest);

  private:
    double threshold_;
    std::vector<Group> groups_;
    Communicator* tensor_group_;
};

// Note [taylorseer cache]: diffusers' TaylorSeerCache (TaylorSeerCacheConfig) with its default
// modules: every block's attention (its output projections included; FLUX's single blocks' has
// none), one implementation for every family. On the passes its schedule computes
// (StepCache::computes: the warm-up, every cache_interval-th pass after it, the cool-down) each
// attention runs and keeps the Taylor factors of its outputs: the outputs, and up to max_order
// divided differences against the factors kept at its last computed pass, all stored in
// taylor_factors_dtype (bfloat16 by default, whatever the run's dtype, as diffusers stores them).
// On the others each attention's outputs are the series at the passes since then, and no q, k, v
// or attention runs. The schedule depends on nothing but the pass, so every rank takes the same
// passes; each rank extrapolates its own shard of the outputs.
struct TaylorSeerState {
    int64_t pass = -1;     // the current pass of the state's calls
    int64_t computed = 0;  // passes whose attentions ran, each guidance branch's counted
    struct Attention {
        int64_t last = -1;                             // the pass its factors were kept at
        std::vector<std::vector<at::Tensor>> factors;  // per output, per order
        std::vector<at::ScalarType> dtypes;            // per output
    };
    std::map<int64_t, Attention> attentions;  // by the attention's place in the model
};

// One transformer call's TaylorSeer: it starts the call's pass of `state` (whose rows hold
// `branches` guidance branches).
class TaylorSeerCache {
  public:
    TaylorSeerCache(const protocol::StepCache& config, TaylorSeerState& state, int branches);
    // Whether this pass extrapolates the attentions rather than running them.
    bool extrapolates() const { return !computes_; }
    // Attention `id`'s outputs at this pass from its factors. Throws InternalError without any.
    std::vector<at::Tensor> predict(int64_t id) const;
    // Attention `id` ran: its outputs at this pass.
    void update(int64_t id, const std::vector<at::Tensor>& outputs);

  private:
    const protocol::StepCache& config_;
    TaylorSeerState& state_;
    bool computes_;
};

// Note [mag cache]: diffusers' MagCache (MagCacheConfig), one implementation for every family. Whether
// a pass runs the blocks follows from the step and the model's magnitude ratios alone: from the
// retention step (retention_ratio x steps, rounded half up) on, each pass multiplies the accumulated
// ratio by its step's ratio and adds |1 - it| to the accumulated error, all in float32 as diffusers'
// 0-d tensors hold them; while a residual is kept, the error is at or below the threshold and at
// most max_skip_steps passes have accumulated, the pass skips, else it computes and the
// accumulators start again. A skipped pass's image stream after the blocks is its input plus the
// residual (the image stream out of the last block minus the stream into the first) of the last
// pass computed; the text stream's last value feeds nothing after the blocks.
//
// - Each guidance branch has its own state (diffusers' cache contexts), the prompts of a batch
//   sharing their branch's. The decision needs no data, so every rank of every strategy takes the
//   same passes without a collective; each rank keeps and adds its own shard of the residual.
// - Calibration (calibrate=true) computes every pass and measures each pass's ratio: the mean over
//   the batch and the whole sequence of |residual| / (|last residual| + 1e-8), norms over the width
//   in float32, the sums over the sequence groups (SequenceShard::sum_tokens); the first pass's is 1.
struct MagCacheState {
    at::Tensor residual;              // at the last pass computed in full, this rank's shard
    int64_t pass = 0;                 // the state's passes so far
    float ratio = 1, error = 0;       // accumulated, float32
    int64_t accumulated = 0;          // passes accumulated since the last computed
    int64_t computed = 0;             // passes computed in full
    std::vector<double> calibration;  // per pass, when calibrating
};

// One transformer call's MagCache over its rows, a branch's state for each group of them.
class MagCache {
  public:
    struct Group {
        MagCacheState* state;
        int64_t first, rows;  // of the call's batch
    };
    // `ratios`: the config's, taken to `steps` (StepCache::mag_ratios_for).
    MagCache(const protocol::StepCache& config, const std::vector<float>& ratios, int64_t steps,
             std::vector<Group> groups);
    // The image stream after the last block from `before`, the first block's input ([rows, this
    // rank's tokens of `image`, width]); `blocks(before)` runs every block and returns the last one's
    // image stream. Every rank of the call's sequence groups calls it at the same point.
    at::Tensor run(at::Tensor before, const SequenceShard& image,
                   const std::function<at::Tensor(const at::Tensor&)>& blocks);

  private:
    bool computes(MagCacheState& s) const;
    const protocol::StepCache& config_;
    const std::vector<float>& ratios_;
    int64_t steps_;
    std::vector<Group> groups_;
};

// The step cache a transformer call runs with (at most one of them).
struct StepCaches {
    FirstBlockCache* first_block = nullptr;
    TaylorSeerCache* taylorseer = nullptr;
    MagCache* mag = nullptr;
};

// A batch's step cache, as the one denoising loop runs it: each branch's state across the steps
// (Note [first block cache], Note [taylorseer cache], Note [mag cache]), the cache of each
// transformer call, and the passes computed.
class StepCacheRun {
  public:
    // `batch` prompts of `steps` steps; the branches as `guidance` runs them; `tensor_group` as
    // FirstBlockCache takes it.
    StepCacheRun(const protocol::StepCache& setting, const Guidance& guidance, int64_t batch, int64_t steps,
                 Communicator* tensor_group);
    // `predict(caches)` for the transformer call on rows [first, first + count) of the model's input.
    at::Tensor call(int64_t first, int64_t count,
                    const std::function<at::Tensor(const StepCaches&)>& predict);
    // The passes computed in full, each branch's counted (over the cfg group when the branches are
    // split; every rank of it calls this); -1 without a cache.
    int64_t computed(Communicator* cfg_group, const at::Device& device) const;
    // Per branch (negative, positive), each pass's first-block change; empty without that cache.
    std::vector<std::vector<double>> metrics() const;
    // MagCache calibration: the positive branch's ratio at each pass (over the cfg group when the
    // branches are split; every rank of it calls this); empty when not calibrating.
    std::vector<double> mag_ratios(Communicator* cfg_group, const at::Device& device) const;

  private:
    struct BranchRows {
        int branch;  // 0 negative, 1 positive
        int64_t first, rows;
    };
    std::vector<BranchRows> branches(int64_t first, int64_t count) const;
    const protocol::StepCache& setting_;
    const Guidance& guidance_;
    int64_t batch_, steps_;
    Communicator* tensor_group_;
    std::vector<float> mag_ratios_;                  // MagCache's, taken to the steps
    FirstBlockState branch_[2];                      // negative, positive
    MagCacheState mag_[2];                           // negative, positive
    std::map<int64_t, TaylorSeerState> taylorseer_;  // by the call's first row
};

}  // namespace dp::runtime
