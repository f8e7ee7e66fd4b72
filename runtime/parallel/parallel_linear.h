#pragma once
// ParallelLinear: a linear layer as a model family's parallel spec splits it over the
// tensor-parallel group (strategies/parallel_spec.h): whole, column-parallel, row-parallel, or
// row-parallel over segments (an input made of concatenated parts, each split on its own). Only
// this rank's shard is ever resident: the weights are narrowed before they are converted and moved.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/io/shard_source.h"
#include "runtime/parallel/parallel_context.h"
#include "strategies/parallel_spec.h"

namespace dp::runtime {

struct Int8Weight;

class ParallelLinear {
  public:
    ParallelLinear() = default;
    // Loads `name`.weight [out, in] (and `name`.bias [out]) as `rule` splits it over `tp`.
    // unit 0: the split features (each segment's) must divide by the group size. unit N: they are
    // whole blocks of N features (an attention head's head_dim; 1 for an MLP), shared as evenly as
    // possible, the first ranks one block more (TensorGroup::share; Note [uneven heads]): 38 heads
    // of 64 over 4 ranks are 640, 640, 576, 576 features. Throws ModelError naming the layer when
    // the features do not split so, or a rank would keep none.
    static ParallelLinear load(ShardSource& weights, const std::string& name, int64_t in, int64_t out,
                               const strategies::TpRule& rule, const TensorGroup& tp, bool bias = true,
                               int64_t unit = 0);
    // The layer whole on every rank, from tensors already loaded (tests, trainers).
    static ParallelLinear whole(at::Tensor weight, at::Tensor bias);

    // Whole: x W^T + b. Column-parallel: this rank's slice of the output features (gathered: then
    // every rank's slice, so the whole output, one all_gather). Row-parallel:
    // x holds this rank's slice of the input features; the result is the whole output, summed
    // over the group (one all_reduce) with the bias added once. Every rank of the group calls it.
    at::Tensor operator()(const at::Tensor& x) const;

    bool defined() const { return weight_.defined() || quantized_ || int8_; }
    strategies::TpSplit split() const { return split_; }
    // This rank's tensors: the weight shard (dequantized, when kept quantized), and the bias (a
    // row-parallel layer's whole bias).
    at::Tensor weight() const;
    // Whether the weight is kept quantized (Note [kept quantized], runtime/io/shard_source.h).
    bool quantized() const { return quantized_ != nullptr; }
    // Whether it runs as int8 products (Note [int8 compute], int8_linear.h): the weights source
    // asked for it (ShardSource::int8_compute).
    bool int8() const { return int8_ != nullptr; }
    const at::Tensor& bias() const { return bias_; }
    // Bytes of the tensors this rank holds.
    int64_t parameter_bytes() const;

  private:
    strategies::TpSplit split_ = strategies::TpSplit::kWhole;
    Communicator* group_ = nullptr;
    std::vector<int64_t> gathered_rows_;  // kColumnGathered: each rank's output features
    at::Tensor weight_, bias_;
    std::shared_ptr<const QuantizedWeight> quantized_;  // instead of weight_
    std::shared_ptr<const Int8Weight> int8_;            // instead of weight_ (Note [int8 compute])
    at::ScalarType dtype_ = at::kFloat;                 // the run's, with int8_

    // x's product with this rank's weight (and bias); `row_group`: the group whose ranks hold the
    // other slices of x's features (a row-parallel layer's, for int8's token scales).
    at::Tensor product(const at::Tensor& x, bool bias, Communicator* row_group) const;
};

}  // namespace dp::runtime
