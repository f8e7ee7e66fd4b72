#pragma once
// Note [int8 compute]: --quantize int8 runs the layers a family allows (ParallelSpec::int8_layers)
// as W8A8 products: each weight's output channel in symmetric int8 with its own scale (its
// absolute maximum over 127; over 63 on the CPU, Note [7-bit weights on the CPU] in the .cpp),
// each token's activations the same way with its own scale (over 127), computed at every call;
// the int32 products dequantized by both scales. On the CPU the product is
// oneDNN's (onednn::qlinear_pointwise, VNNI or AMX where the CPU has them), on a GPU cuBLASLt's
// (at::_int_mm).
//
// Exact across strategies by construction: a token's scale is its own row's, so a sequence split
// (Ulysses, Ring) leaves every token's scale and integer products as they are in one process;
// under tensor parallelism a column-parallel rank sees whole rows; a row-parallel rank holds a
// slice of each row, so the token's and the weight channel's absolute maxima are reduced over the
// group (max) first, which makes them one process's. Only the partial sums' order differs, as in
// floating point. The float work around these products (norms, attention, the other layers) differs
// in its last bits across strategies as it does in fp32, and a token's rounding to int8 can turn
// such a difference into one level (1/127 of its largest value): one process's images within 1 per
// channel, latents within 1e-2 (tests/integration/test_family_strategies.cpp, the int8 rows).

#include <ATen/core/Tensor.h>

namespace dp::runtime {

class Communicator;

// A weight [out, in] as int8 per output channel.
struct Int8Weight {
    at::Tensor values;       // int8 [out, in]
    at::Tensor scale;        // float [out]: a channel's absolute maximum / its levels (1 for a zero channel)
    at::Tensor packed;       // the product's own layout: oneDNN's prepacked weight (CPU), [in, out] (GPU)
    at::Tensor zero_points;  // int64 zeros [out], oneDNN's argument (CPU)
    // The weight the int8 values stand for, [out, in] in `dtype`.
    at::Tensor dequantized(at::ScalarType dtype) const;
};

// `weight` [out, in] quantized per output channel. `row_max`: each channel's absolute maximum over
// its whole row, where this rank holds a slice of it (row-parallel: reduced over the group); an
// undefined tensor: this weight's own.
Int8Weight quantize_weight(const at::Tensor& weight, const at::Tensor& row_max = at::Tensor());

// x [..., in] through the int8 weight: x's tokens quantized each with its own scale (`group`: the
// tokens' absolute maxima reduced over it first, for a row-parallel slice), the int8 product, both
// scales applied. Float [..., out] in x's dtype, without a bias.
at::Tensor int8_linear(const at::Tensor& x, const Int8Weight& w, Communicator* group = nullptr);

}  // namespace dp::runtime
