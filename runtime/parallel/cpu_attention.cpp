#include "runtime/parallel/cpu_attention.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <optional>

#include "runtime/io/errors.h"
#include "runtime/parallel/cpu_attention_kernels.h"
#include "strategies/cpu_dtype.h"

namespace dp::runtime {

namespace kernels = cpu_attention_kernels;

namespace {

bool cpu_can(at::ScalarType dtype) {
    static const bool avx512 = kernels::built() && strategies::cpu_has("avx512f") &&
                               strategies::cpu_has("avx512bw") && strategies::cpu_has("avx512dq") &&
                               strategies::cpu_has("avx512vl");
    static const bool bf16 = avx512 && strategies::cpu_has("avx512_bf16");
    return dtype == at::kFloat ? avx512 : dtype == at::kBFloat16 && bf16;
}

// [1 or B, padded] fp32: the bias (0 without one) on the real keys, -inf on the padding.
at::Tensor padded_bias(const at::Tensor& bias, int64_t keys, int64_t padded) {
    const int64_t rows = bias.defined() ? bias.size(0) : 1;
    at::Tensor out = at::full({rows, padded}, -INFINITY, at::TensorOptions().dtype(at::kFloat));
    if (bias.defined())
        out.narrow(1, 0, keys).copy_(bias);
    else
        out.narrow(1, 0, keys).zero_();
    return out;
}

}  // namespace

bool cpu_attention_fits(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        const at::Tensor& key_bias) {
    if (!q.defined() || !k.defined() || !v.defined() || !q.is_cpu() || !k.is_cpu() || !v.is_cpu())
        return false;
    if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) return false;
    const at::ScalarType dtype = q.scalar_type();
    if (k.scalar_type() != dtype || v.scalar_type() != dtype || !cpu_can(dtype)) return false;
    const int64_t b = q.size(0), h = q.size(1), d = q.size(3), keys = k.size(2);
    if (k.size(0) != b || v.size(0) != b || k.size(1) != h || v.size(1) != h || v.size(2) != keys ||
        k.size(3) != d || v.size(3) != d)
        return false;
    if (d % 32 != 0 || d > kernels::kMaxHeadDim || q.numel() == 0 || keys == 0) return false;
    if (!key_bias.defined()) return true;
    return key_bias.is_cpu() && key_bias.dim() == 2 && key_bias.size(1) == keys &&
           (key_bias.size(0) == 1 || key_bias.size(0) == b) && at::isFloatingType(key_bias.scalar_type());
}

at::Tensor cpu_attention(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                         const at::Tensor& key_bias, double scale) {
    if (!cpu_attention_fits(q_in, k_in, v_in, key_bias))
        throw InternalError("cpu_attention: a call cpu_attention_fits refuses");
    auto last_contiguous = [](const at::Tensor& t) { return t.stride(3) == 1 ? t : t.contiguous(); };
    const at::Tensor q = last_contiguous(q_in), k = last_contiguous(k_in), v = last_contiguous(v_in);
    const int64_t b = q.size(0), h = q.size(1), n = q.size(2), d = q.size(3), keys = k.size(2);
    const int64_t padded = (keys + kernels::kKeyAlign - 1) / kernels::kKeyAlign * kernels::kKeyAlign;
    // Both packed by the kernels (Operands' layouts), every element written.
    const at::Tensor kt = at::empty({b, h, d, padded}, q.options()),
                     vp = at::empty({b, h, padded, d}, q.options());
    const at::Tensor bias =
        padded_bias(key_bias.defined() ? key_bias.to(at::kFloat) : key_bias, keys, padded);
    const at::Tensor out = at::empty({b, n, h, d}, q.options()).permute({0, 2, 1, 3});
    kernels::Operands o;
    o.q = q.data_ptr();
    for (int i = 0; i < 3; ++i) {
        o.q_stride[i] = q.stride(i);
        o.out_stride[i] = out.stride(i);
    }
    o.kt = kt.data_ptr();
    o.v = vp.data_ptr();
    o.bias = bias.data_ptr<float>();
    o.bias_batch_stride = bias.size(0) == 1 ? 0 : padded;
    o.out = out.data_ptr();
    o.batch = b;
    o.heads = h;
    o.queries = n;
    o.keys_padded = padded;
    o.head_dim = d;
    o.scale = static_cast<float>(scale);
    kernels::Source src;
    src.k = k.data_ptr();
    src.v = v.data_ptr();
    for (int i = 0; i < 3; ++i) {
        src.k_stride[i] = k.stride(i);
        src.v_stride[i] = v.stride(i);
    }
    src.keys = keys;
    const bool fp32 = q.scalar_type() == at::kFloat;
    at::parallel_for(0, b * h, 1, [&](int64_t first, int64_t end) {
        fp32 ? kernels::pack_f32(src, o, first, end) : kernels::pack_bf16(src, o, first, end);
    });
    at::parallel_for(0, kernels::task_count(o), 1, [&](int64_t first, int64_t end) {
        fp32 ? kernels::run_f32(o, first, end) : kernels::run_bf16(o, first, end);
    });
    return out;
}

at::Tensor attention_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& key_bias, double scale, const at::Tensor& logits_bias) {
    if (!logits_bias.defined() && cpu_attention_fits(q, k, v, key_bias))
        return cpu_attention(q, k, v, key_bias,
                             scale > 0 ? scale : 1.0 / std::sqrt(static_cast<double>(q.size(3))));
    std::optional<at::Tensor> mask;
    if (logits_bias.defined())
        mask = logits_bias.to(q.scalar_type());
    else if (key_bias.defined())
        mask = key_bias.view({key_bias.size(0), 1, 1, -1}).to(q.scalar_type());
    return at::scaled_dot_product_attention(q, k, v, mask, 0.0, false,
                                            scale > 0 ? std::optional<double>(scale) : std::nullopt);
}

}  // namespace dp::runtime
