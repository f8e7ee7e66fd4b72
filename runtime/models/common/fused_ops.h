#pragma once
// Note [fused elementwise work]: the elementwise work around a transformer's projections, one pass
// over memory each instead of ATen's chain of whole-tensor ops (each of which reads and writes the
// activations again, and on the CPU waits on OpenMP's threads between them). A call takes the fast
// path when every tensor is fp32 on the CPU with its last dimension contiguous, or bf16 (RoPE's
// angles fp32): bf16 rows are widened to fp32, computed there, and rounded to bf16 where ATen's
// ops round, once for the GELU and RoPE (which widens to fp32), after each op for the modulation,
// the gate and the norm's output. The bf16 chains give ATen's bits; the GELU and the norm nearly
// always do (tests/unit/test_fused_ops.cpp). Anything else (a GPU, fp16, the RMS norm in bf16)
// takes the same math as ATen ops, unchanged.
//
// On the fast path each output element is computed from its own row only, in a fixed order, so the
// result is the same whatever the thread count or the split of rows between threads. The file is
// compiled without floating-point contraction, so the multiplies and adds round as ATen's separate
// ops do: the gate with the residual, the modulation after the norm and the rotation of RoPE give
// ATen's bits exactly (given the same inputs). The norms reduce in double (closer to the exact
// mean than ATen's float cascade, so within an ulp of it, not its bits), and GELU is computed from
// one exponential (x * sigmoid(2u), the same function as 0.5 x (1 + tanh u)), within a few ulps of
// ATen's tanh form (in bf16, within one bf16 rounding of it). Both keep diffusers' image
// (tests/unit/test_fused_ops.cpp, and every family's golden image test).

#include <ATen/core/Tensor.h>

namespace dp::runtime::fused {

// diffusers' GELU(approximate="tanh") of x, written into `out` (x's shape; may be x itself for an
// in-place GELU, or a slice of a wider buffer such as the input of FLUX's single-block proj_out).
void gelu_tanh_into(const at::Tensor& x, const at::Tensor& out);
at::Tensor gelu_tanh(const at::Tensor& x);

// LayerNorm without elementwise affine over the last dimension, then * (1 + scale) + shift: the
// MMDiTs' adaptive norm. shift and scale broadcast over x ([B, 1, dim] for one conditioning, or
// [B, S, dim] per token); undefined shift and scale: the plain norm.
at::Tensor norm_modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, double eps);

// x * (1 + scale) + shift, with shift and scale broadcasting over x.
at::Tensor modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale);

// residual + gate * y: a gated block output joining the residual stream; gate broadcasts over y.
at::Tensor gated_residual(const at::Tensor& residual, const at::Tensor& gate, const at::Tensor& y);

// x * rsqrt(mean(x^2) + eps) over the last dimension, times `weight` when it is defined: an fp32
// RMS norm (every rounding mode of layers.h agrees in fp32). bf16 x (the weight fp32 or bf16) is
// normalised in fp32 and rounded once at the end, as torch.nn.RMSNorm; with round_normed, the
// normalised x is rounded to bf16 before the weight, as diffusers' RMSNorm with a 16-bit weight.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, bool round_normed = false);

// x rotated pairwise (x[2k], x[2k + 1]) by cos / sin, which broadcast over x and repeat each angle
// for its pair: x * cos + (-x[2k + 1], x[2k]) * sin, in x's memory layout.
at::Tensor interleaved_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace dp::runtime::fused
