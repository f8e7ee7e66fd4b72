#include "runtime/models/common/layers.h"

#include <ATen/ATen.h>

#include <cmath>

#include "runtime/io/config_json.h"
#include "runtime/io/errors.h"
#include "runtime/models/common/fused_ops.h"
#include "runtime/models/common/transformer_base.h"
#include "runtime/parallel/dense_linear.h"

namespace dp::runtime {

Linear Linear::load(WeightStore& w, const std::string& prefix, int64_t in, int64_t out, bool bias) {
    Linear l;
    l.weight = w.take(prefix + ".weight", {out, in});
    if (bias) l.bias = w.take(prefix + ".bias", {out});
    return l;
}

// Note [fp32 products through oneDNN]: the encoders' and the VAE's products too.
at::Tensor Linear::operator()(const at::Tensor& x) const { return dense_linear(x, weight, bias); }

LayerNorm LayerNorm::load(WeightStore& w, const std::string& prefix, int64_t dim, double eps, bool affine,
                          bool bias) {
    LayerNorm n;
    n.dim = dim;
    n.eps = eps;
    if (affine) {
        n.weight = w.take(prefix + ".weight", {dim});
        if (bias) n.bias = w.take(prefix + ".bias", {dim});
    }
    return n;
}

at::Tensor LayerNorm::operator()(const at::Tensor& x) const {
    return at::layer_norm(x, {dim}, weight, bias, eps);
}

RMSNorm RMSNorm::load(WeightStore& w, const std::string& prefix, int64_t dim, double eps, bool affine,
                      RmsRounding rounding) {
    RMSNorm n;
    n.eps = eps;
    n.rounding = rounding;
    if (affine) n.weight = w.take(prefix + ".weight", {dim});
    return n;
}

RMSNorm RMSNorm::load_weight(WeightStore& w, const std::string& name, int64_t dim, double eps,
                             RmsRounding rounding) {
    RMSNorm n;
    n.eps = eps;
    n.rounding = rounding;
    n.weight = w.take(name, {dim});
    return n;
}

at::Tensor RMSNorm::operator()(const at::Tensor& x) const {
    // In fp32 every rounding below is the same math: one pass (Note [fused elementwise work]).
    if (x.scalar_type() == at::kFloat && (!weight.defined() || weight.scalar_type() == at::kFloat))
        return fused::rms_norm(x, weight, eps);
    const bool half_weight =
        weight.defined() && (weight.scalar_type() == at::kHalf || weight.scalar_type() == at::kBFloat16);
    // bf16 rows through the fused kernel, rounded where each rounding mode rounds.
    if (x.scalar_type() == at::kBFloat16 &&
        (rounding == RmsRounding::kTorch || rounding == RmsRounding::kDiffusers) &&
        (!weight.defined() || weight.scalar_type() == at::kFloat || weight.scalar_type() == at::kBFloat16))
        return fused::rms_norm(x, weight, eps, rounding == RmsRounding::kDiffusers && half_weight);
    if (rounding == RmsRounding::kQwen2) {
        const at::Tensor h = x.to(at::kFloat);
        const at::Tensor normed = (h * at::rsqrt(h.pow(2).mean(-1, true) + eps)).to(x.scalar_type());
        return weight.defined() ? weight * normed : normed;
    }
    const at::Tensor var = x.to(at::kFloat).pow(2).mean(-1, true);
    at::Tensor y = x * at::rsqrt(var + eps);
    if (!weight.defined()) return y.to(x.scalar_type());
    if (rounding == RmsRounding::kTorch)
        return (y.to(at::kFloat) * weight.to(at::kFloat)).to(x.scalar_type());
    if (half_weight) y = y.to(weight.scalar_type());
    if (rounding == RmsRounding::kT5) return weight * y;
    return (y * weight).to(x.scalar_type());
}

at::Tensor clamp_half(const at::Tensor& x, HalfClamp how) {
    if (x.scalar_type() != at::kHalf) return x;
    const double max = 65504.0;  // torch.finfo(torch.float16).max
    if (how == HalfClamp::kRange) return x.clamp(-max, max);
    const at::Tensor bound =
        at::where(at::isinf(x).any(), at::scalar_tensor(max - 1000, x.options().dtype(at::kFloat)),
                  at::scalar_tensor(max, x.options().dtype(at::kFloat)));
    return at::clamp(x, -bound, bound);
}

at::Tensor rotate_half(const at::Tensor& x) {
    const int64_t half = x.size(-1) / 2;
    return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

at::Tensor rope_frequencies(int64_t dim, double theta, const at::TensorOptions& options) {
    return at::reciprocal(at::pow(theta, at::arange(0, dim, 2, options) / static_cast<double>(dim)));
}

ParallelLinear LinearLoader::operator()(const std::string& name, int64_t in, int64_t out, int64_t unit,
                                        bool bias) const {
    return ParallelLinear::load(weights_, name, in, out, strategies::tp_rule_for_layer(spec_, name), tp_,
                                bias, unit);
}

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal) {
    return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, causal);
}

at::Tensor split_heads(const at::Tensor& x, int64_t heads) {
    const int64_t b = x.size(0), s = x.size(1), d = x.size(2) / heads;
    return x.view({b, s, heads, d}).transpose(1, 2);
}

at::Tensor merge_heads(const at::Tensor& x) {
    const int64_t b = x.size(0), h = x.size(1), s = x.size(2), d = x.size(3);
    return x.transpose(1, 2).reshape({b, s, h * d});
}

at::Tensor adaln::modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale) {
    return fused::modulate(x, shift.unsqueeze(1), scale.unsqueeze(1));
}

at::Tensor adaln::plain_layer_norm(const at::Tensor& x, double eps) {
    return fused::norm_modulate(x, {}, {}, eps);
}

at::Tensor adaln::norm_modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale,
                                double eps) {
    return fused::norm_modulate(x, shift.unsqueeze(1), scale.unsqueeze(1), eps);
}

at::Tensor FeedForward::operator()(const at::Tensor& x) const {
    if (!gated) {
        at::Tensor hidden = in(x);
        fused::gelu_tanh_into(hidden, hidden);  // the projection's own output, so in place
        return out(hidden);
    }
    const std::vector<at::Tensor> ab = in(x).chunk(2, -1);
    return out(at::silu(ab[0]) * ab[1]);
}

RopeTable rope_table_from_ids(const at::Tensor& ids, const std::vector<int64_t>& dims, double theta) {
    std::vector<at::Tensor> angles;
    const at::Tensor positions = ids.to(at::kFloat).to(at::kDouble);  // diffusers: ids.float()
    for (std::size_t a = 0; a < dims.size(); ++a) {
        const at::Tensor freqs =
            rope_frequencies(dims[a], theta, at::TensorOptions().dtype(at::kDouble).device(ids.device()));
        angles.push_back(
            at::outer(positions.select(1, static_cast<int64_t>(a)), freqs).repeat_interleave(2, 1));
    }
    const at::Tensor all = at::cat(angles, 1);
    return {at::cos(all).to(at::kFloat), at::sin(all).to(at::kFloat)};
}

at::Tensor timestep_embedding(const at::Tensor& timesteps, int64_t dim) {
    const int64_t half = dim / 2;
    at::Tensor exponent = -std::log(10000.0) * at::arange(0, half, timesteps.options().dtype(at::kFloat));
    exponent = exponent / static_cast<double>(half);
    const at::Tensor emb = timesteps.unsqueeze(1).to(at::kFloat) * at::exp(exponent).unsqueeze(0);
    return at::cat({at::cos(emb), at::sin(emb)}, -1);  // flip_sin_to_cos
}

at::Tensor apply_interleaved_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    return fused::interleaved_rope(x, cos, sin);  // (re, im) -> (-im, re) pairwise, x cos + that sin
}

void check_time_inputs(const at::Tensor& timestep, const at::Tensor& guidance, int64_t batch,
                       bool guidance_embeds, const std::string& with, const std::string& without) {
    const auto one_each = [batch](const at::Tensor& t) {
        return t.defined() && (t.numel() == batch || t.numel() == 1);
    };
    if (!one_each(timestep))
        throw ModelError("the transformer takes one timestep per prompt (" + std::to_string(batch) + ")");
    if (guidance_embeds && !one_each(guidance))
        throw ModelError("this transformer has a guidance embedder (guidance_embeds, " + with +
                         "): it takes one guidance scale per prompt (" + std::to_string(batch) + ")");
    if (!guidance_embeds && guidance.defined())
        throw ModelError("this transformer has no guidance embedder (guidance_embeds false, " + without +
                         "): it takes no guidance scale");
}

std::vector<int64_t> rope_axes_dims(const ConfigJson& c, const std::vector<int64_t>& fallback,
                                    int64_t head_dim, const std::string& axes) {
    std::vector<int64_t> dims = fallback;
    const std::size_t n = fallback.size();
    const std::string accepted = "expected " + std::to_string(n) + " even integers (" + axes +
                                 ") summing to attention_head_dim (" + std::to_string(head_dim) + ")";
    if (c.has("axes_dims_rope")) {
        const nlohmann::json& list = c.raw().at("axes_dims_rope");
        bool ok = list.is_array() && list.size() == n;
        for (std::size_t i = 0; ok && i < n; ++i) {
            ok =
                list[i].is_number_integer() && list[i].get<int64_t>() >= 2 && list[i].get<int64_t>() % 2 == 0;
            if (ok) dims[i] = list[i].get<int64_t>();
        }
        if (!ok) c.fail("axes_dims_rope", "is " + list.dump().substr(0, 40) + "; " + accepted);
    }
    int64_t sum = 0;
    for (int64_t d : dims) sum += d;
    if (sum != head_dim) c.fail("axes_dims_rope", "sums to " + std::to_string(sum) + "; " + accepted);
    return dims;
}

}  // namespace dp::runtime
