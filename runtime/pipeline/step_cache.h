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
#include <vector>

namespace dp::runtime {

class Communicator;
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

}  // namespace dp::runtime
