#pragma once
// Note [bf16 on a CPU that has it]: --dtype auto is bf16 on a GPU, and on a CPU that multiplies
// bf16 natively (AVX512-BF16 or AMX-BF16) for a model whose transformer is at least
// kCpuBf16MinWidth features wide; fp32 elsewhere, diffusers' own default. Measured on a 2-core
// AVX512-BF16 EPYC (docs/benchmarks.md, "Close to the machine's limit"): a 512-wide FLUX.1-dev's
// steps 1.8x faster in bf16 than in fp32, both on oneDNN's products and our attention kernel.
// Without those instructions LibTorch converts every bf16 operand and runs 8-14x slower than
// fp32, and a narrow model's products are too small for the faster kernels to pay for the
// conversions around them. The launcher (expected_dtype) and each rank (run_dtype) decide with the
// same function, from the same /proc/cpuinfo. bf16 changes the image (PSNR about 44 dB against
// fp32): --dtype fp32 keeps diffusers' fp32 image on any machine.

#include <cstdint>
#include <string>
#include <string_view>

namespace dp::strategies {

inline constexpr int64_t kCpuBf16MinWidth = 512;

// The bf16 instructions a /proc/cpuinfo text names in its "flags" lines: "amx_bf16",
// "avx512_bf16", or "" for none (whole words only).
std::string bf16_instructions(std::string_view cpuinfo);

// This machine's (read once; "" where /proc/cpuinfo cannot be read).
const std::string& cpu_bf16_instructions();

// Whether this machine's /proc/cpuinfo lists `flag` ("avx512f") among its flags (false where it
// cannot be read).
bool cpu_has(std::string_view flag);

// Whether --dtype auto runs a model `width` features wide in bf16 on a CPU with `instructions`
// (bf16_instructions' answer).
bool auto_bf16_on_cpu(std::string_view instructions, int64_t width);

}  // namespace dp::strategies
