// Note [fused elementwise work] (fused_ops.h). This file is compiled with -ffp-contract=off
// (runtime/CMakeLists.txt): a multiply followed by an add must round twice, as ATen's separate ops
// do, in every clone of a kernel. Each row kernel is built for AVX-512, AVX2 and the baseline x86-64
// (target_clones); all run the same operations in the same order, so they give the same bits
// (checked: every kernel's output, fp32 and bf16, byte for byte, with and without the AVX-512
// clone). The AVX-512 clone takes the GELU of a [1152, 2048] block from 2.5 to 1.5 ms.
// Each loop writes out[i] from its inputs at i alone, so a kernel may run in place: `ivdep` tells
// GCC so, or it would take its scalar loop whenever the output is the input.

#include "runtime/models/common/fused_ops.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DP_ROW_KERNEL __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DP_ROW_KERNEL
#endif

namespace dp::runtime::fused {
namespace {

constexpr int kMaxDims = 6;
constexpr int64_t kElementsPerTask = 1 << 15;

// A tensor's rows (all but its last dimension) walked in the order of an output's logical shape.
// Operands may differ in element type (a bf16 activation with fp32 angles): bases and strides are
// in bytes.
template <int N>
struct RowWalk {
    int leading = 0;                                        // dimensions before the last
    std::array<int64_t, kMaxDims> size{};                   // their sizes
    std::array<std::array<int64_t, kMaxDims>, N> stride{};  // each operand's strides over them, in bytes
    std::array<char*, N> base{};
    int64_t rows = 1, width = 0;
};

// A row's operand as its element type.
template <typename T>
T* as(char* p) {
    return reinterpret_cast<T*>(p);
}

// Every operand expanded to `shape`; the caller has checked the dtypes, CPU and a contiguous last
// dim.
template <int N>
RowWalk<N> walk_of(at::IntArrayRef shape, const std::array<at::Tensor, N>& operands) {
    RowWalk<N> w;
    w.leading = static_cast<int>(shape.size()) - 1;
    w.width = shape.back();
    for (int d = 0; d < w.leading; ++d) {
        w.size[d] = shape[d];
        w.rows *= shape[d];
    }
    for (int i = 0; i < N; ++i) {
        w.base[i] = static_cast<char*>(operands[i].data_ptr());
        const auto bytes = static_cast<int64_t>(operands[i].element_size());
        for (int d = 0; d < w.leading; ++d) w.stride[i][d] = operands[i].stride(d) * bytes;
    }
    return w;
}

// Calls row(pointers) for each row, rows split between ATen's threads; a row's pointers are its
// operands' first elements.
template <int N, typename Row>
void for_rows(const RowWalk<N>& w, const Row& row) {
    const int64_t grain = std::max<int64_t>(1, kElementsPerTask / std::max<int64_t>(1, w.width));
    at::parallel_for(0, w.rows, grain, [&](int64_t begin, int64_t end) {
        std::array<int64_t, kMaxDims> index{};
        std::array<int64_t, N> offset{};
        int64_t rest = begin;
        for (int d = w.leading - 1; d >= 0; --d) {
            index[d] = rest % w.size[d];
            rest /= w.size[d];
            for (int i = 0; i < N; ++i) offset[i] += index[d] * w.stride[i][d];
        }
        std::array<char*, N> p{};
        for (int64_t r = begin; r < end; ++r) {
            for (int i = 0; i < N; ++i) p[i] = w.base[i] + offset[i];
            row(p);
            for (int d = w.leading - 1; d >= 0; --d) {  // the next row: the last leading index first
                for (int i = 0; i < N; ++i) offset[i] += w.stride[i][d];
                if (++index[d] < w.size[d]) break;
                for (int i = 0; i < N; ++i) offset[i] -= w.size[d] * w.stride[i][d];
                index[d] = 0;
            }
        }
    });
}

// for_rows over fp32 operands.
template <int N, typename Row>
void for_float_rows(const RowWalk<N>& w, const Row& row) {
    for_rows(w, [&](const std::array<char*, N>& bytes) {
        std::array<float*, N> p{};
        for (int i = 0; i < N; ++i) p[i] = as<float>(bytes[i]);
        row(p);
    });
}

bool fast_path(const at::Tensor& t, at::ScalarType dtype = at::kFloat) {
    return t.defined() && t.device().is_cpu() && t.scalar_type() == dtype && t.dim() >= 1 &&
           t.dim() <= kMaxDims && (t.stride(-1) == 1 || t.size(-1) <= 1) && !t.requires_grad();
}

bool fast_path(std::initializer_list<at::Tensor> tensors, at::ScalarType dtype = at::kFloat) {
    for (const at::Tensor& t : tensors)
        if (!fast_path(t, dtype)) return false;
    return true;
}

// A broadcasting operand as x's shape (strides 0 where it repeats), when it can take the fast path
// as that (its last dim still contiguous); undefined otherwise.
at::Tensor fast_as_shape_of(const at::Tensor& t, const at::Tensor& x, at::ScalarType dtype = at::kFloat) {
    if (!fast_path(t, dtype)) return {};
    at::Tensor expanded = t.expand(x.sizes());
    return fast_path(expanded, dtype) ? expanded : at::Tensor();
}

// e^x for the GELU: Cephes' single-precision range reduction and polynomial (about 1 ulp). Written
// without branches or library calls so that both clones vectorize it the same way. The argument is
// clamped to [-87, 80]: below, 1 + e^x is 1; above, x / (1 + e^x) would come out subnormal for the
// large negative inputs that reach it (each a slow microcode assist, which tripled the GELU's time),
// and the GELU is below 1e-33 there in either case.
inline float exp_for_gelu(float x) {
    x = std::min(std::max(x, -87.0f), 80.0f);
    const float t = x * 1.44269504088896341f;
    const float n = (t + 12582912.0f) - 12582912.0f;  // round to nearest even: |t| < 2^22
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float e = p * (r * r) + r + 1.0f;
    const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, sizeof scale);
    return e * scale;
}

// GELU(tanh) = 0.5 x (1 + tanh u) = x / (1 + e^(-2u)), u = sqrt(2 / pi) (x + 0.044715 x^3).
DP_ROW_KERNEL void gelu_row(const float* x, float* out, int64_t n) {
#pragma GCC ivdep
    for (int64_t i = 0; i < n; ++i) {
        const float v = x[i];
        const float u = 0.7978845608028654f * (v + 0.044715f * (v * v * v));
        out[i] = v / (1.0f + exp_for_gelu(-2.0f * u));
    }
}

// Sums of a row in 8 double lanes, combined in a fixed order: the same total in every clone and
// for every thread split.
DP_ROW_KERNEL double row_sum(const float* x, int64_t n) {
    double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) lane[j] += static_cast<double>(x[i + j]);
    for (int j = 0; i < n; ++i, ++j) lane[j] += static_cast<double>(x[i]);
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

DP_ROW_KERNEL double row_squares(const float* x, int64_t n, double mean) {
    double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) {
            const double d = static_cast<double>(x[i + j]) - mean;
            lane[j] += d * d;
        }
    for (int j = 0; i < n; ++i, ++j) {
        const double d = static_cast<double>(x[i]) - mean;
        lane[j] += d * d;
    }
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

// (x - mean) * rstd, then * (1 + scale) + shift when they are given.
DP_ROW_KERNEL void norm_modulate_row(const float* x, const float* shift, const float* scale, float* out,
                                     int64_t n, float mean, float rstd) {
    if (!shift) {
#pragma GCC ivdep
        for (int64_t i = 0; i < n; ++i) out[i] = (x[i] - mean) * rstd;
        return;
    }
#pragma GCC ivdep
    for (int64_t i = 0; i < n; ++i) {
        const float normed = (x[i] - mean) * rstd;
        out[i] = normed * (1.0f + scale[i]) + shift[i];
    }
}

DP_ROW_KERNEL void modulate_row(const float* x, const float* shift, const float* scale, float* out,
                                int64_t n) {
#pragma GCC ivdep
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * (1.0f + scale[i]) + shift[i];
}

DP_ROW_KERNEL void gated_row(const float* residual, const float* gate, const float* y, float* out,
                             int64_t n) {
#pragma GCC ivdep
    for (int64_t i = 0; i < n; ++i) out[i] = residual[i] + gate[i] * y[i];
}

DP_ROW_KERNEL void scale_row(const float* x, const float* weight, float* out, int64_t n, float rstd) {
    if (!weight) {
#pragma GCC ivdep
        for (int64_t i = 0; i < n; ++i) out[i] = x[i] * rstd;
        return;
    }
#pragma GCC ivdep
    for (int64_t i = 0; i < n; ++i) out[i] = (x[i] * rstd) * weight[i];
}

DP_ROW_KERNEL void rope_row(const float* x, const float* cos, const float* sin, float* out, int64_t n) {
#pragma GCC ivdep
    for (int64_t i = 0; i + 1 < n; i += 2) {
        const float re = x[i], im = x[i + 1];
        out[i] = re * cos[i] + (-im) * sin[i];
        out[i + 1] = im * cos[i + 1] + re * sin[i + 1];
    }
}

// bf16 rows are widened exactly to fp32, computed by an fp32 row kernel, and rounded to the nearest
// even bf16 (as ATen's bf16 ops round their fp32 results). A kernel that stands for a chain of
// ATen ops (the modulation, the gate) rounds after each op as the chain does (bf16_rounded).
DP_ROW_KERNEL void widen(const uint16_t* x, float* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        const uint32_t bits = static_cast<uint32_t>(x[i]) << 16;
        std::memcpy(out + i, &bits, sizeof bits);
    }
}

inline uint16_t bf16_bits(float v) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
    return nan ? uint16_t{0x7fc0} : static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

inline float bf16_rounded(float v) {
    const uint32_t bits = static_cast<uint32_t>(bf16_bits(v)) << 16;
    float out;
    std::memcpy(&out, &bits, sizeof out);
    return out;
}

DP_ROW_KERNEL void round_to_bf16(const float* x, uint16_t* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_bits(x[i]);
}

DP_ROW_KERNEL void modulate_row_bf16(const float* x, const float* shift, const float* scale, float* out,
                                     int64_t n) {
#pragma GCC ivdep
    for (int64_t i = 0; i < n; ++i)
        out[i] = bf16_rounded(bf16_rounded(x[i] * bf16_rounded(1.0f + scale[i])) + shift[i]);
}

DP_ROW_KERNEL void norm_row_bf16(const float* x, float* out, int64_t n, float mean, float rstd) {
#pragma GCC ivdep
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_rounded((x[i] - mean) * rstd);
}

DP_ROW_KERNEL void gated_row_bf16(const float* residual, const float* gate, const float* y, float* out,
                                  int64_t n) {
#pragma GCC ivdep
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_rounded(residual[i] + bf16_rounded(gate[i] * y[i]));
}

// for_rows over operands of which those marked `bf16` are bf16 (the last, the output, among them):
// row() gets every operand as fp32, the bf16 ones widened into this thread's buffers, and the output
// row it writes is rounded to bf16.
template <int N, typename Row>
void for_bf16_rows(const RowWalk<N>& w, const std::array<bool, N>& bf16, const Row& row) {
    for_rows(w, [&](const std::array<char*, N>& bytes) {
        thread_local std::vector<float> buffer;
        buffer.resize(static_cast<std::size_t>(N * w.width));
        std::array<float*, N> p{};
        for (int i = 0; i < N; ++i) {
            p[i] = bf16[i] ? buffer.data() + i * w.width : as<float>(bytes[i]);
            if (bf16[i] && i + 1 < N) widen(as<uint16_t>(bytes[i]), p[i], w.width);
        }
        row(p);
        round_to_bf16(p[N - 1], as<uint16_t>(bytes[N - 1]), w.width);
    });
}

// A new tensor in x's memory layout (as ATen's elementwise ops make theirs).
at::Tensor output_like(const at::Tensor& x) { return at::empty_like(x, at::MemoryFormat::Preserve); }

}  // namespace

void gelu_tanh_into(const at::Tensor& x, const at::Tensor& out) {
    if (fast_path({x, out}, at::kBFloat16) && out.sizes() == x.sizes()) {
        const auto w = walk_of<2>(x.sizes(), {x, out});
        for_bf16_rows(w, {true, true},
                      [&](const std::array<float*, 2>& p) { gelu_row(p[0], p[1], w.width); });
        return;
    }
    if (!fast_path({x, out}) || out.sizes() != x.sizes()) {
        out.copy_(at::gelu(x, "tanh"));
        return;
    }
    const auto w = walk_of<2>(x.sizes(), {x, out});
    for_float_rows(w, [&](const std::array<float*, 2>& p) { gelu_row(p[0], p[1], w.width); });
}

at::Tensor gelu_tanh(const at::Tensor& x) {
    if (!fast_path(x) && !fast_path(x, at::kBFloat16)) return at::gelu(x, "tanh");
    at::Tensor out = output_like(x);
    gelu_tanh_into(x, out);
    return out;
}

at::Tensor norm_modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, double eps) {
    const bool modulated = shift.defined();
    const auto composed = [&] {
        const at::Tensor normed = at::layer_norm(x, {x.size(-1)}, {}, {}, eps);
        return modulated ? normed * (1 + scale) + shift : normed;
    };
    const bool bf16 = fast_path(x, at::kBFloat16);
    if (!fast_path(x) && !bf16) return composed();
    // Unmodulated, x stands in for shift and scale: the rows pass them as null.
    const at::Tensor sh = modulated ? fast_as_shape_of(shift, x, x.scalar_type()) : x,
                     sc = modulated ? fast_as_shape_of(scale, x, x.scalar_type()) : x;
    if (!sh.defined() || !sc.defined()) return composed();
    const at::Tensor out = output_like(x);
    const auto w = walk_of<4>(x.sizes(), {x, sh, sc, out});
    const auto n = static_cast<double>(w.width);
    const auto row = [&](const std::array<float*, 4>& p) {
        const double mean = row_sum(p[0], w.width) / n;
        const double var = row_squares(p[0], w.width, mean) / n;
        const auto rstd = static_cast<float>(1.0 / std::sqrt(var + eps));
        if (!bf16) {
            norm_modulate_row(p[0], modulated ? p[1] : nullptr, p[2], p[3], w.width, static_cast<float>(mean),
                              rstd);
            return;
        }
        norm_row_bf16(p[0], p[3], w.width, static_cast<float>(mean), rstd);  // layer_norm's bf16 output
        if (modulated) modulate_row_bf16(p[3], p[1], p[2], p[3], w.width);
    };
    if (bf16)
        for_bf16_rows(w, {true, modulated, modulated, true}, row);
    else
        for_float_rows(w, row);
    return out;
}

at::Tensor modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale) {
    const bool bf16 = fast_path(x, at::kBFloat16), fast = fast_path(x) || bf16;
    const at::Tensor sh = fast ? fast_as_shape_of(shift, x, x.scalar_type()) : at::Tensor(),
                     sc = fast ? fast_as_shape_of(scale, x, x.scalar_type()) : at::Tensor();
    if (!sh.defined() || !sc.defined()) return x * (1 + scale) + shift;
    const at::Tensor out = output_like(x);
    const auto w = walk_of<4>(x.sizes(), {x, sh, sc, out});
    if (bf16)
        for_bf16_rows(w, {true, true, true, true}, [&](const std::array<float*, 4>& p) {
            modulate_row_bf16(p[0], p[1], p[2], p[3], w.width);
        });
    else
        for_float_rows(
            w, [&](const std::array<float*, 4>& p) { modulate_row(p[0], p[1], p[2], p[3], w.width); });
    return out;
}

at::Tensor gated_residual(const at::Tensor& residual, const at::Tensor& gate, const at::Tensor& y) {
    const bool bf16 = fast_path({residual, y}, at::kBFloat16);
    const bool fast = (fast_path({residual, y}) || bf16) && residual.sizes() == y.sizes();
    const at::Tensor g = fast ? fast_as_shape_of(gate, y, y.scalar_type()) : at::Tensor();
    if (!g.defined()) return residual + gate * y;
    const at::Tensor out = output_like(residual);
    const auto w = walk_of<4>(y.sizes(), {residual, g, y, out});
    if (bf16)
        for_bf16_rows(w, {true, true, true, true}, [&](const std::array<float*, 4>& p) {
            gated_row_bf16(p[0], p[1], p[2], p[3], w.width);
        });
    else
        for_float_rows(w,
                       [&](const std::array<float*, 4>& p) { gated_row(p[0], p[1], p[2], p[3], w.width); });
    return out;
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, bool round_normed) {
    const auto composed = [&] {
        const at::Tensor h = x.to(at::kFloat);
        at::Tensor y = h * at::rsqrt(h.pow(2).mean(-1, true) + eps);
        if (!weight.defined()) return y.to(x.scalar_type());
        if (round_normed) y = y.to(x.scalar_type());
        return (y * weight).to(x.scalar_type());
    };
    const bool bf16 = fast_path(x, at::kBFloat16);
    if (!fast_path(x) && !bf16) return composed();
    // The weight in fp32, or in bf16 with bf16 rows; x stands in for no weight.
    const bool bf16_weight = bf16 && weight.defined() && weight.scalar_type() == at::kBFloat16;
    const at::Tensor wt =
        weight.defined() ? fast_as_shape_of(weight, x, bf16_weight ? at::kBFloat16 : at::kFloat) : x;
    if (!wt.defined()) return composed();
    const at::Tensor out = output_like(x);
    const auto w = walk_of<3>(x.sizes(), {x, wt, out});
    const auto n = static_cast<double>(w.width);
    const bool has_weight = weight.defined();
    const auto row = [&](const std::array<float*, 3>& p) {
        const auto mean_square = static_cast<float>(row_squares(p[0], w.width, 0.0) / n);
        const float rstd = 1.0f / std::sqrt(mean_square + static_cast<float>(eps));
        if (bf16 && round_normed && has_weight) {
            norm_row_bf16(p[0], p[2], w.width, 0.0f, rstd);  // x rstd rounded to bf16, then the weight
            scale_row(p[2], p[1], p[2], w.width, 1.0f);
            return;
        }
        scale_row(p[0], has_weight ? p[1] : nullptr, p[2], w.width, rstd);
    };
    if (bf16)
        for_bf16_rows(w, {true, bf16_weight, true}, row);
    else
        for_float_rows(w, row);
    return out;
}

at::Tensor interleaved_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    const auto composed = [&] {
        std::vector<int64_t> pairs = x.sizes().vec();
        pairs.back() /= 2;
        pairs.push_back(2);
        const at::Tensor xp = x.reshape(pairs);
        const at::Tensor rotated = at::stack({-xp.select(-1, 1), xp.select(-1, 0)}, -1).flatten(-2);
        return (x.to(at::kFloat) * cos + rotated.to(at::kFloat) * sin).to(x.scalar_type());
    };
    const bool bf16 = fast_path(x, at::kBFloat16);
    const bool fast = (fast_path(x) || bf16) && x.size(-1) % 2 == 0;
    const at::Tensor c = fast ? fast_as_shape_of(cos, x) : at::Tensor(),
                     s = fast ? fast_as_shape_of(sin, x) : at::Tensor();
    if (!c.defined() || !s.defined()) return composed();
    const at::Tensor out = output_like(x);
    const auto w = walk_of<4>(x.sizes(), {x, c, s, out});
    if (bf16) {
        for_bf16_rows(w, {true, false, false, true},
                      [&](const std::array<float*, 4>& p) { rope_row(p[0], p[1], p[2], p[3], w.width); });
        return out;
    }
    for_float_rows(w, [&](const std::array<float*, 4>& p) { rope_row(p[0], p[1], p[2], p[3], w.width); });
    return out;
}

}  // namespace dp::runtime::fused
