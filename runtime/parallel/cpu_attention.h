#pragma once
// Note [attention on the CPU]: LibTorch's CPU attention (the flash kernel behind
// at::scaled_dot_product_attention) multiplies its blocks with MKL's sgemm, which takes its AVX2
// path on an AMD CPU, and it converts bf16 blocks to fp32 for those products: on a 2-core
// AVX-512 EPYC it reaches 175-200 GFLOP/s in fp32 and in bf16 alike, where oneDNN's fp32 products
// reach 470. Attention was 43 % of a medium FLUX.1 step in fp32 and 55 % in bf16 and int8.
//
// cpu_attention() is the same online softmax (FlashAttention's) written for AVX-512: per task,
// kQueryBlock query rows against blocks of keys; the logits in fp32 (scale, then the key bias,
// rounded apart as ATen's are), a running maximum and sum per row, and the unnormalized output
// rescaled when the maximum grows. The keys are packed once per call, transposed so that a
// register holds 16 keys' entries; bf16 takes two head_dim entries, or two keys, per lane through
// AVX512-BF16's vdpbf16ps, its probabilities rounded to bf16 before the product with the values (as
// ATen's kernel rounds them). Each task writes its own rows: the same bits at any thread count.
// A row whose every key is masked is 0 (ATen's is NaN).
//
// It takes CPU tensors of fp32 (on a CPU with AVX-512F/BW/DQ/VL) or bf16 (with AVX512-BF16 too),
// head_dim a multiple of 32 up to 256, and an optional per-key bias; everything else (GPUs, other
// dtypes and head sizes, a bias per query) goes to ATen's kernel.

#include <ATen/core/Tensor.h>

namespace dp::runtime {

// Whether cpu_attention() computes this call: q [B, H, Sq, d], k and v [B, H, Sk, d] of one dtype,
// key_bias undefined or [1 or B, Sk].
bool cpu_attention_fits(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        const at::Tensor& key_bias);

// softmax(q k^T * scale + key_bias) v: [B, H, Sq, d], stored [B, Sq, H, d] (merge_heads' layout).
// Only where cpu_attention_fits(); InternalError elsewhere.
at::Tensor cpu_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const at::Tensor& key_bias, double scale);

// The attention every caller runs (attend(), and the rate the phase split measures): cpu_attention()
// where it fits, else ATen's kernel with the same scale (0: 1 / sqrt(head_dim)). key_bias: [1 or B,
// keys] or undefined; logits_bias: [1 or B, H, queries, keys] (ATen's kernel alone) or undefined.
at::Tensor attention_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& key_bias, double scale,
                            const at::Tensor& logits_bias = at::Tensor());

}  // namespace dp::runtime
