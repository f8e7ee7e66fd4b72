#pragma once
// Note [fp32 products through oneDNN]: the PyPI wheel's fp32 at::linear is MKL's sgemm, which on an
// AMD CPU takes its AVX2 path even where the CPU has AVX-512: 177 GFLOP/s on two cores of an
// AVX-512 EPYC at a medium FLUX.1-dev's 1152x512x1536, where oneDNN's fp32 matmul (the
// mkldnn::_linear_pointwise operator LibTorch registers) reaches 467. So on a CPU with AVX-512 a
// transformer's fp32 products go through oneDNN. Its sums are the same at any thread count
// (checked for 1 to 3 threads on the pipelines' shapes), but not MKL's bits: they differ in the
// last places as any two GEMM kernels do, and the images stay within diffusers' tolerance (the
// golden tests). The encoders' and the VAE's Linear layers take the same path. Elsewhere (AVX2
// only, a GPU, another dtype) it is at::linear as before.

#include <ATen/core/Tensor.h>

namespace dp::runtime {

// x [..., in] times weight [out, in]^T plus bias (undefined: none), as at::linear.
at::Tensor dense_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

}  // namespace dp::runtime
