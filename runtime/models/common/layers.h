#pragma once
// The few layer kinds the models are built from, as plain weights plus a forward function. A
// layer that tensor parallelism may split is a ParallelLinear (runtime/parallel/) instead.

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

#include "runtime/io/weights.h"
#include "runtime/parallel/parallel_context.h"
#include "runtime/parallel/parallel_linear.h"

namespace dp::runtime {

struct Linear {
    at::Tensor weight;  // [out, in]
    at::Tensor bias;    // [out] or undefined

    static Linear load(WeightStore& w, const std::string& prefix, int64_t in, int64_t out, bool bias = true);
    at::Tensor operator()(const at::Tensor& x) const;
};

struct LayerNorm {
    at::Tensor weight, bias;  // undefined without elementwise affine
    int64_t dim = 0;
    double eps = 1e-5;

    static LayerNorm load(WeightStore& w, const std::string& prefix, int64_t dim, double eps,
                          bool affine = true, bool bias = true);
    at::Tensor operator()(const at::Tensor& x) const;
};

struct RMSNorm {
    at::Tensor weight;  // undefined without elementwise affine
    double eps = 1e-6;
    // false: diffusers' RMSNorm (a 16-bit weight applies after rounding to its dtype); true:
    // torch.nn.RMSNorm (FLUX's qk-norms), the weight applied in fp32 and rounded once at the end.
    bool weight_in_fp32 = false;

    static RMSNorm load(WeightStore& w, const std::string& prefix, int64_t dim, double eps,
                        bool affine = true);
    at::Tensor operator()(const at::Tensor& x) const;
};

// diffusers' FeedForward with activation_fn "gelu-approximate": GELU(tanh) between two linear
// layers, 4x wide (the MMDiTs' MLPs), each split as the family's spec says.
struct FeedForward {
    ParallelLinear in, out;
    at::Tensor operator()(const at::Tensor& x) const;
};

// The MMDiTs' adaptive layer norms, in their own namespace (SD3's file still has local copies).
namespace adaln {
// x * (1 + scale) + shift, with shift and scale [B, dim] over x [B, S, dim].
at::Tensor modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale);
// LayerNorm without elementwise affine over the last dimension.
at::Tensor plain_layer_norm(const at::Tensor& x, double eps = 1e-6);
}  // namespace adaln

// diffusers' get_timestep_embedding(t, dim, flip_sin_to_cos=True, downscale_freq_shift=0, scale 1):
// the frequencies and the product in fp32, [B, dim] fp32.
at::Tensor timestep_embedding(const at::Tensor& timesteps, int64_t dim);

struct DeviceMapping;

// A transformer's place in the run, checked before it loads: device_map (when set) places exactly
// its `layers` blocks, and its weights then start on block 0's device; tp leaves every rank at
// least one of its `heads`. Throws ModelError naming what does not fit.
void prepare_transformer_load(const DeviceMapping* mapping, WeightStore& weights, int64_t layers, int64_t heads,
                              const TensorGroup& tp);

// Multi-head attention over [batch, heads, seq, head_dim] tensors (softmax(q k^T / sqrt(d)) v).
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal = false);

// [batch, seq, heads * head_dim] <-> [batch, heads, seq, head_dim].
at::Tensor split_heads(const at::Tensor& x, int64_t heads);
at::Tensor merge_heads(const at::Tensor& x);

}  // namespace dp::runtime
