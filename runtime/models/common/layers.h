#pragma once
// The few layer kinds the models are built from, as plain weights plus a forward function. A
// layer that tensor parallelism may split is a ParallelLinear (runtime/parallel/) instead.

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

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

// How an RMS norm rounds in a 16-bit run; the mean square is always taken in fp32.
enum class RmsRounding {
    kDiffusers,  // diffusers' RMSNorm: a 16-bit weight applies after rounding to its dtype, the
                 // result in the input's dtype
    kTorch,      // torch.nn.RMSNorm (FLUX's qk-norms): the weight applied in fp32, rounded once at the end
    kT5,         // transformers' T5LayerNorm: as diffusers', the result left in the weight's dtype
    kQwen2,      // transformers' Qwen2RMSNorm: the normalised input back in its dtype, then the weight
};

struct RMSNorm {
    at::Tensor weight;  // undefined without elementwise affine
    double eps = 1e-6;
    RmsRounding rounding = RmsRounding::kDiffusers;

    static RMSNorm load(WeightStore& w, const std::string& prefix, int64_t dim, double eps,
                        bool affine = true, RmsRounding rounding = RmsRounding::kDiffusers);
    // `name` itself is the weight (transformers' layer_norm.weight), not `prefix`.weight.
    static RMSNorm load_weight(WeightStore& w, const std::string& name, int64_t dim, double eps,
                               RmsRounding rounding);
    at::Tensor operator()(const at::Tensor& x) const;
};

// An fp16 residual stream kept finite, as diffusers and transformers do; other dtypes pass
// unchanged. kRange clamps to fp16's range; kBelowOverflow (transformers' T5) clamps to 1000
// below it when anything overflowed already, without a host sync.
enum class HalfClamp { kRange, kBelowOverflow };
at::Tensor clamp_half(const at::Tensor& x, HalfClamp how = HalfClamp::kRange);

// [.., d] -> [-second half, first half]: transformers' rotate_half, the rotation of RoPE in halves.
at::Tensor rotate_half(const at::Tensor& x);

// x [B, H, S, head_dim] rotated pairwise (x[2k], x[2k + 1]) by cos / sin [S, head_dim] (or any
// shape that broadcasts, such as [B, 1, S, head_dim]) in fp32, each angle repeated for its pair:
// diffusers' complex rotation of FLUX's and Z-Image's RoPE. Returned in x's dtype.
at::Tensor apply_interleaved_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// The rotary tables of tokens at positions `ids` [S, axes] (FLUX's position ids): per axis a,
// dims[a] / 2 frequencies 1 / theta^(2i / dims[a]) times the position, in float64 as diffusers
// computes them on CPU and CUDA, each angle repeated for its pair, the axes concatenated in order:
// cos and sin [S, sum(dims)] in fp32, for apply_interleaved_rope.
struct RopeTable {
    at::Tensor cos, sin;
};
RopeTable rope_table_from_ids(const at::Tensor& ids, const std::vector<int64_t>& dims, double theta);

// Rotary embeddings' one frequency table: 1 / theta^(2i / dim) for i < dim / 2, [dim / 2] in
// `options`' dtype (FLUX's float64, Qwen-Image's and Qwen2's fp32) and on its device.
at::Tensor rope_frequencies(int64_t dim, double theta, const at::TensorOptions& options);

// A component's linear layers, each a ParallelLinear split as its family's spec says (its TP rule
// by the layer's name) over `tp`. `unit`: the features that stay together on a rank (an attention
// head's head_dim; 1 for an MLP or a modulation). Throws ModelError naming a missing or misshapen
// tensor.
class LinearLoader {
  public:
    LinearLoader(WeightStore& weights, const strategies::ParallelSpec& spec, const TensorGroup& tp)
        : weights_(weights), spec_(spec), tp_(tp) {}
    ParallelLinear operator()(const std::string& name, int64_t in, int64_t out, int64_t unit = 1,
                              bool bias = true) const;
    WeightStore& weights() const { return weights_; }

  private:
    WeightStore& weights_;
    const strategies::ParallelSpec& spec_;
    TensorGroup tp_;
};

// diffusers' FeedForward with activation_fn "gelu-approximate": GELU(tanh) between two linear
// layers, 4x wide (the MMDiTs' MLPs), each split as the family's spec says. `gated`: FLUX.2's
// SwiGLU instead, `in` making [a | b] (each rank its share of both halves) and out(silu(a) * b).
struct FeedForward {
    ParallelLinear in, out;
    bool gated = false;
    at::Tensor operator()(const at::Tensor& x) const;
};

// The MMDiTs' adaptive layer norms, in their own namespace (SD3's file still has local copies).
namespace adaln {
// x * (1 + scale) + shift, with shift and scale [B, dim] over x [B, S, dim].
at::Tensor modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale);
// LayerNorm without elementwise affine over the last dimension.
at::Tensor plain_layer_norm(const at::Tensor& x, double eps = 1e-6);
// modulate(plain_layer_norm(x, eps), shift, scale) in one pass (Note [fused elementwise work]).
at::Tensor norm_modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, double eps);
}  // namespace adaln

// diffusers' get_timestep_embedding(t, dim, flip_sin_to_cos=True, downscale_freq_shift=0, scale 1):
// the frequencies and the product in fp32, [B, dim] fp32.
at::Tensor timestep_embedding(const at::Tensor& timesteps, int64_t dim);

// Multi-head attention over [batch, heads, seq, head_dim] tensors (softmax(q k^T / sqrt(d)) v).
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal = false);

// [batch, seq, heads * head_dim] <-> [batch, heads, seq, head_dim].
at::Tensor split_heads(const at::Tensor& x, int64_t heads);
at::Tensor merge_heads(const at::Tensor& x);

}  // namespace dp::runtime
