#include "runtime/parallel/int8_linear.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "runtime/io/errors.h"
#include "runtime/parallel/communicator.h"

// The tokens' passes (absolute maximum, quantization) are built for AVX-512, AVX2 and the baseline
// x86-64, each clone the same operations in the same order (a maximum, a division, a rounding): the
// same bits on every CPU.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DP_TOKEN_KERNEL __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DP_TOKEN_KERNEL
#endif

namespace dp::runtime {

namespace {

constexpr double kLevels = 127.0;  // an activation's, and a GPU weight's
// Note [7-bit weights on the CPU]: x86 CPUs without VNNI (AVX2, AVX-512 before VNNI) multiply int8
// with vpmaddubsw, which adds each pair of u8 x s8 products in int16 and saturates: 255 x 127 x 2
// overflows, and oneDNN's products come out wrong by whole percents (measured here). Weights of at
// most 63 keep every pair below 32767, so the CPU's sums are exact on every x86 CPU, VNNI or not,
// and the image is the same on all of them.
constexpr double kCpuWeightLevels = 63.0;
// Note [unsigned activations on the CPU]: oneDNN's fast x86 int8 products (brgemm, VNNI or not)
// take unsigned activations: given signed ones with weights prepacked as onednn::qlinear_prepack
// packs them, it falls back to its reference kernel, about 1000x slower (measured on an AVX512-VNNI
// EPYC: 1.8 s for a 256x512x512 product). So a CPU token's int8 value q goes in as q + 128 with
// zero point 128: the same integer sums, which oneDNN's u8 x s8 instructions take natively.
constexpr int kCpuActivationZeroPoint = 128;

// onednn's int8 linear ops, by name (they are registered operators, not ATen functions).
c10::OperatorHandle onednn_op(const char* name) {
    return c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
}

at::Tensor call(const c10::OperatorHandle& op, std::vector<c10::IValue> stack) {
    op.callBoxed(&stack);
    return stack.front().toTensor();
}

bool cpu_rows(const at::Tensor& rows) {
    return rows.is_cpu() && rows.scalar_type() == at::kFloat && rows.is_contiguous();
}

int64_t rows_per_task(int64_t width) { return std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(1, width)); }

// A row's absolute maximum, in eight lanes so that the loop vectorizes (max is exact in any order).
DP_TOKEN_KERNEL float row_absmax(const float* __restrict x, int64_t n) {
    float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) {
            const float a = std::fabs(x[i + j]);
            lane[j] = lane[j] < a ? a : lane[j];
        }
    for (; i < n; ++i) lane[0] = std::max(lane[0], std::fabs(x[i]));
    return *std::max_element(lane, lane + 8);
}

// round(x / scale) clamped to +-levels, plus the zero point: the division ATen's does, and
// round-half-even by adding and taking away 1.5 * 2^23 (exact for |q| < 2^22; |q| <= 127 here),
// which vectorizes on every x86 CPU.
DP_TOKEN_KERNEL void quantize_row(const float* __restrict x, float scale, uint8_t* __restrict out, int64_t n,
                                  float levels) {
    for (int64_t i = 0; i < n; ++i) {
        const float v = (x[i] / scale + 12582912.0f) - 12582912.0f;
        const float q = v > -levels ? (v < levels ? v : levels) : -levels;
        out[i] = static_cast<uint8_t>(static_cast<int>(q) + kCpuActivationZeroPoint);
    }
}

// Each token's absolute maximum, [N, 1]: one pass over fp32 CPU rows (Note [int8 compute]).
at::Tensor token_absmax(const at::Tensor& rows) {
    if (!cpu_rows(rows)) return rows.abs().amax(1, /*keepdim=*/true);
    const int64_t n = rows.size(0), in = rows.size(1);
    at::Tensor amax = at::empty({n, 1}, rows.options());
    const float* x = rows.data_ptr<float>();
    float* out = amax.data_ptr<float>();
    at::parallel_for(0, n, rows_per_task(in), [x, out, in](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) out[r] = row_absmax(x + r * in, in);
    });
    return amax;
}

// The tokens' int8 values, at::round(rows / scale).clamp(-127, 127): signed on a GPU, plus 128 as
// uint8 on the CPU (Note [unsigned activations on the CPU]); fp32 CPU rows in one pass.
at::Tensor token_values(const at::Tensor& rows, const at::Tensor& scale) {
    if (!rows.is_cpu()) return at::round(rows / scale).clamp_(-kLevels, kLevels).to(at::kChar);
    if (!cpu_rows(rows) || !scale.is_contiguous())
        return at::round(rows / scale).clamp_(-kLevels, kLevels).add_(kCpuActivationZeroPoint).to(at::kByte);
    const int64_t n = rows.size(0), in = rows.size(1);
    at::Tensor values = at::empty({n, in}, rows.options().dtype(at::kByte));
    const float* x = rows.data_ptr<float>();
    const float* s = scale.data_ptr<float>();
    uint8_t* out = values.data_ptr<uint8_t>();
    at::parallel_for(0, n, rows_per_task(in), [x, s, out, in](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) quantize_row(x + r * in, s[r], out + r * in, in, kLevels);
    });
    return values;
}

}  // namespace

at::Tensor Int8Weight::dequantized(at::ScalarType dtype) const {
    return (values.to(at::kFloat) * scale.unsqueeze(1)).to(dtype);
}

Int8Weight quantize_weight(const at::Tensor& weight, const at::Tensor& row_max) {
    const at::Tensor w = weight.to(at::kFloat);
    const at::Tensor amax = row_max.defined() ? row_max.to(w.device(), at::kFloat) : w.abs().amax(1);
    const double levels = w.is_cpu() ? kCpuWeightLevels : kLevels;
    Int8Weight q;
    q.scale = at::where(amax > 0, amax / levels, at::ones_like(amax)).contiguous();
    q.values = at::round(w / q.scale.unsqueeze(1)).clamp_(-levels, levels).to(at::kChar).contiguous();
    if (w.is_cpu()) {
        static const c10::OperatorHandle prepack = onednn_op("onednn::qlinear_prepack");
        q.packed = call(prepack, {q.values, c10::IValue()});
        q.zero_points = at::zeros({q.scale.size(0)}, at::TensorOptions().dtype(at::kLong));
    } else {
        q.packed = q.values.t().contiguous();  // _int_mm's [in, out]
    }
    return q;
}

at::Tensor int8_linear(const at::Tensor& x, const Int8Weight& w, Communicator* group) {
    const int64_t in = x.size(-1), out = w.scale.size(0);
    const at::Tensor rows = x.reshape({-1, in}).to(at::kFloat);
    at::Tensor amax = token_absmax(rows);
    if (group) group->all_reduce_max(amax);
    const at::Tensor scale = at::where(amax > 0, amax / kLevels, at::ones_like(amax));
    const at::Tensor values = token_values(rows, scale);
    at::Tensor product;
    if (x.is_cpu()) {
        // int32 sums (less the zero point's) times the channel's scale (the tokens' scale 1 here), as float.
        static const c10::OperatorHandle linear = onednn_op("onednn::qlinear_pointwise");
        product =
            call(linear, {values, 1.0, int64_t{kCpuActivationZeroPoint}, w.packed, w.scale, w.zero_points,
                          c10::IValue(), 1.0, int64_t{0}, at::kFloat, std::string("none"),
                          c10::List<std::optional<at::Scalar>>(), std::string("")});
    } else if (values.size(0) > 16 && in % 8 == 0 && out % 8 == 0) {
        product = at::_int_mm(values, w.packed).to(at::kFloat) * w.scale;
    } else {  // cuBLASLt's shape rules: the same integer sums in float (exact below 2^24 each)
        product = at::matmul(values.to(at::kFloat), w.packed.to(at::kFloat)) * w.scale;
    }
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = out;
    return product.mul_(scale).to(x.scalar_type()).reshape(shape);  // the product is ours: in place
}

}  // namespace dp::runtime
