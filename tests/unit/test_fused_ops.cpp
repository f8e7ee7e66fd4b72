// Note [fused elementwise work]: each fused kernel against the ATen ops it replaces, over the
// layouts the blocks give it (broadcast and per-token modulation, heads split out of a projection,
// a slice of a wider buffer, widths that are no multiple of a vector), for every thread count.

#include <ATen/Parallel.h>

#include <cmath>
#include <functional>
#include <limits>

#include "doctest_torch.h"
#include "runtime/models/common/fused_ops.h"

namespace fused = dp::runtime::fused;

namespace {

at::Tensor randn(at::IntArrayRef shape, int64_t seed) {
    at::manual_seed(seed);
    return at::randn(shape, at::kFloat);
}

// The largest |a - b| / (|b| + floor): a relative error that does not blow up at b = 0.
double worst_relative(const at::Tensor& a, const at::Tensor& b, double floor) {
    const at::Tensor ad = a.to(at::kDouble), bd = b.to(at::kDouble);
    return ((ad - bd).abs() / (bd.abs() + floor)).max().item<double>();
}

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
    return a.sizes() == b.sizes() && at::equal(a.contiguous(), b.contiguous());
}

using In = std::function<at::Tensor(const at::Tensor&)>;

// One kernel on one layout: the fused call, the ATen composition it replaces, and how close they
// must be (0: the same bits).
struct Case {
    const char* name;
    std::function<at::Tensor()> fused;
    // The ATen ops, on the inputs as `in` gives them (fp32 as they are; float64 for the exact result).
    std::function<at::Tensor(const In& in)> reference;
    double tolerance;
};

std::vector<Case> cases() {
    const int64_t b = 2, s = 37, d = 67, heads = 3, hd = 18;  // odd widths: the vector remainders
    const at::Tensor x = randn({b, s, d}, 1) * 3, y = randn({b, s, d}, 2);
    const at::Tensor shift = randn({b, 1, d}, 3), scale = randn({b, 1, d}, 4) * 0.5;
    const at::Tensor token_shift = randn({b, s, d}, 5), token_scale = randn({b, s, d}, 6);
    const at::Tensor gate = randn({b, 1, d}, 7), token_gate = randn({b, s, d}, 8);
    // A projection's output split into heads, [B, H, S, hd] over [B, S, H * hd] storage.
    const at::Tensor projected = randn({b, s, heads * hd}, 9);
    const at::Tensor q = projected.view({b, s, heads, hd}).transpose(1, 2);
    const at::Tensor cos = randn({s, hd}, 10), sin = randn({s, hd}, 11), weight = randn({hd}, 12);
    const at::Tensor rows = randn({b, s + 5, d}, 13).narrow(1, 2, s);  // a residual's narrowed tokens
    const auto layer_norm = [](const at::Tensor& t) { return at::layer_norm(t, {t.size(-1)}, {}, {}, 1e-6); };
    const auto rope = [](const at::Tensor& t, const at::Tensor& c, const at::Tensor& sn) {
        const at::Tensor pairs = t.reshape({t.size(0), t.size(1), t.size(2), t.size(3) / 2, 2});
        const at::Tensor rotated = at::stack({-pairs.select(-1, 1), pairs.select(-1, 0)}, -1).flatten(-2);
        return t * c + rotated * sn;
    };
    const auto rms = [](const at::Tensor& t, const at::Tensor& w) {
        return t * at::rsqrt(t.pow(2).mean(-1, true) + 1e-6) * w;
    };
    // GELU in both forms at the values where they part most: the tails, zero, and the clamps.
    const at::Tensor tails = at::tensor({0.0f, -0.0f, 1e-30f, 1.0f, -1.0f, 3.0f, -3.0f, 5.5f, -5.5f, 10.0f,
                                         -10.0f, 40.0f, -40.0f, 88.0f, -88.0f, 1e4f, -1e4f});
    return {
        {"GELU(tanh)", [=] { return fused::gelu_tanh(x); },
         [=](const In& in) { return at::gelu(in(x), "tanh"); }, 1e-6},
        {"GELU(tanh), tails", [=] { return fused::gelu_tanh(tails); },
         [=](const In& in) { return at::gelu(in(tails), "tanh"); }, 1e-6},
        {"GELU(tanh) into a slice of a wider buffer",
         [=] {
             at::Tensor buffer = at::zeros({b, s, 2 * d});
             fused::gelu_tanh_into(y, buffer.narrow(2, d, d));
             return buffer;
         },
         [=](const In& in) {
             return at::cat({in(at::zeros({b, s, d})), at::gelu(in(y), "tanh")}, 2);
         },
         1e-6},
        {"norm then modulation, one conditioning",
         [=] { return fused::norm_modulate(x, shift, scale, 1e-6); },
         [=](const In& in) { return layer_norm(in(x)) * (1 + in(scale)) + in(shift); }, 1e-4},
        {"norm then modulation, per token",
         [=] { return fused::norm_modulate(x, token_shift, token_scale, 1e-6); },
         [=](const In& in) { return layer_norm(in(x)) * (1 + in(token_scale)) + in(token_shift); }, 1e-4},
        {"norm alone, narrowed rows", [=] { return fused::norm_modulate(rows, {}, {}, 1e-6); },
         [=](const In& in) { return layer_norm(in(rows)); }, 1e-5},
        {"modulation", [=] { return fused::modulate(y, shift, scale); },
         [=](const In& in) { return in(y) * (1 + in(scale)) + in(shift); }, 0},
        {"gate with the residual", [=] { return fused::gated_residual(x, gate, y); },
         [=](const In& in) { return in(x) + in(gate)*in(y); }, 0},
        {"gate per token with narrowed residual rows",
         [=] { return fused::gated_residual(rows, token_gate, y); },
         [=](const In& in) { return in(rows) + in(token_gate)*in(y); }, 0},
        {"RoPE over split heads", [=] { return fused::interleaved_rope(q, cos, sin); },
         [=](const In& in) { return rope(in(q), in(cos), in(sin)); }, 0},
        {"RMS norm over split heads", [=] { return fused::rms_norm(q, weight, 1e-6); },
         [=](const In& in) { return rms(in(q), in(weight)); }, 1e-5},
        {"RMS norm without a weight", [=] { return fused::rms_norm(x, {}, 1e-6); },
         [=](const In& in) { return in(x)*at::rsqrt(in(x).pow(2).mean(-1, true) + 1e-6); }, 1e-5},
        // bf16 (Note [fused elementwise work]): computed in fp32, rounded once, as ATen's bf16 ops.
        {"GELU(tanh) in bf16", [=] { return fused::gelu_tanh(x.to(at::kBFloat16)); },
         [=](const In& in) { return at::gelu(in(x.to(at::kBFloat16)), "tanh"); }, 4e-3},
        {"GELU(tanh) in bf16, in place in a slice",
         [=] {
             at::Tensor buffer = at::cat({y, x}, 2).to(at::kBFloat16);
             fused::gelu_tanh_into(buffer.narrow(2, d, d), buffer.narrow(2, d, d));
             return buffer;
         },
         [=](const In& in) {
             return at::cat({in(y.to(at::kBFloat16)), at::gelu(in(x.to(at::kBFloat16)), "tanh")}, 2);
         },
         4e-3},
        {"RoPE over split heads in bf16, fp32 angles",
         [=] { return fused::interleaved_rope(q.to(at::kBFloat16), cos, sin); },
         [=](const In& in) {
             const at::Tensor t = in(q.to(at::kBFloat16));
             const at::ScalarType wide = t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
             return rope(t.to(wide), in(cos), in(sin)).to(t.scalar_type());
         },
         0},
        // The chains round after each op in bf16, as ATen's do: the same bits.
        {"modulation in bf16",
         [=] {
             return fused::modulate(y.to(at::kBFloat16), shift.to(at::kBFloat16), scale.to(at::kBFloat16));
         },
         [=](const In& in) {
             return in(y.to(at::kBFloat16)) * (1 + in(scale.to(at::kBFloat16))) + in(shift.to(at::kBFloat16));
         },
         0},
        {"gate per token with narrowed residual rows in bf16",
         [=] {
             return fused::gated_residual(rows.to(at::kBFloat16), token_gate.to(at::kBFloat16),
                                          y.to(at::kBFloat16));
         },
         [=](const In& in) {
             return in(rows.to(at::kBFloat16)) + in(token_gate.to(at::kBFloat16)) * in(y.to(at::kBFloat16));
         },
         0},
        {"norm then modulation in bf16, per token",
         [=] {
             return fused::norm_modulate(x.to(at::kBFloat16), token_shift.to(at::kBFloat16),
                                         token_scale.to(at::kBFloat16), 1e-6);
         },
         [=](const In& in) {
             return layer_norm(in(x.to(at::kBFloat16))) * (1 + in(token_scale.to(at::kBFloat16))) +
                    in(token_shift.to(at::kBFloat16));
         },
         0.5},  // bf16's own error where the modulation cancels to near 0; ATen's is as large
        {"norm alone in bf16", [=] { return fused::norm_modulate(x.to(at::kBFloat16), {}, {}, 1e-6); },
         [=](const In& in) { return layer_norm(in(x.to(at::kBFloat16))); }, 1e-2},
        {"RMS norm over split heads in bf16, an fp32 weight applied before rounding (torch.nn.RMSNorm)",
         [=] { return fused::rms_norm(q.to(at::kBFloat16), weight, 1e-6); },
         [=](const In& in) {
             const at::Tensor t = in(q.to(at::kBFloat16));
             const at::Tensor h = t.scalar_type() == at::kDouble ? t : t.to(at::kFloat);
             return rms(h, in(weight)).to(t.scalar_type());
         },
         1e-2},
        {"RMS norm in bf16, rounded before its bf16 weight (diffusers' RMSNorm)",
         [=] { return fused::rms_norm(q.to(at::kBFloat16), weight.to(at::kBFloat16), 1e-6, true); },
         [=](const In& in) {
             const at::Tensor t = in(q.to(at::kBFloat16));
             const at::Tensor h = t.scalar_type() == at::kDouble ? t : t.to(at::kFloat);
             const at::Tensor normed = (h * at::rsqrt(h.pow(2).mean(-1, true) + 1e-6)).to(t.scalar_type());
             return (normed * in(weight.to(at::kBFloat16))).to(t.scalar_type());
         },
         2e-2},
        // Not fp32 or bf16: the same ATen ops as before, unchanged.
        {"float64 takes ATen's ops", [=] { return fused::gated_residual(x.to(at::kDouble), gate, y); },
         [=](const In& in) { return in(x).to(at::kDouble) + in(gate)*in(y); }, 0},
    };
}

}  // namespace

TEST_CASE("fused elementwise kernels give the ATen ops' results, exactly where their rounding is the same") {
    for (const Case& c : cases()) {
        const std::string kernel = c.name;
        CAPTURE(kernel);
        const at::Tensor got = c.fused(), want = c.reference([](const at::Tensor&t) { return t; });
        REQUIRE(got.sizes().vec() == want.sizes().vec());
        CHECK((got.scalar_type() == want.scalar_type()));
        CHECK((got.strides() == want.strides() || got.is_contiguous()));
        if (c.tolerance == 0) {
            CHECK(same_bits(got, want));
            continue;
        }
        // Rounded differently: as close to the exact result (ATen's ops in float64) as ATen's
        // float32 ops are, and within the tolerance of it.
        const at::Tensor exact = c.reference([](const at::Tensor& t) { return t.to(at::kDouble); });
        const double fused_error = worst_relative(got, exact, 1e-2),
                     aten_error = worst_relative(want, exact, 1e-2);
        CAPTURE(aten_error);
        CHECK(fused_error <= c.tolerance);
        CHECK(fused_error <= 1.5 * aten_error);
        // bf16: nearly every element ATen's bits, or nearer the exact value than ATen's (the GELU's
        // far negative tail, where the tanh form cancels); the rest are fp32 results a few ulps
        // apart that round to neighbouring bf16 values (1.1 % of this GELU's, mostly in that tail).
        if (got.scalar_type() == at::kBFloat16) {
            const at::Tensor g = got.to(at::kDouble), a = want.to(at::kDouble);
            const at::Tensor fine = got.eq(want).logical_or((g - exact).abs() <= (a - exact).abs());
            const double share = fine.to(at::kDouble).mean().item<double>();
            CAPTURE(share);
            CHECK(share >= 0.98);
        }
        CHECK(!same_bits(got, at::zeros_like(want)));
    }
}

TEST_CASE("fused elementwise kernels give the same bits for 1, 2 and 3 threads") {
    const int threads = at::get_num_threads();
    // Enough rows that every thread count splits them differently.
    const at::Tensor x = randn({3, 1500, 40}, 20), gate = randn({3, 1, 40}, 21), y = randn({3, 1500, 40}, 22);
    const auto run = [&](int n) {
        at::set_num_threads(n);
        return std::vector<at::Tensor>{
            fused::gelu_tanh(x),
            fused::gelu_tanh(x.to(at::kBFloat16)),
            fused::norm_modulate(x, gate, y, 1e-6),
            fused::norm_modulate(x.to(at::kBFloat16), gate.to(at::kBFloat16), y.to(at::kBFloat16), 1e-6),
            fused::gated_residual(x, gate, y),
            fused::rms_norm(x, {}, 1e-6)};
    };
    const std::vector<at::Tensor> one = run(1), two = run(2), three = run(3);
    at::set_num_threads(threads);
    for (std::size_t i = 0; i < one.size(); ++i) {
        CAPTURE(i);
        CHECK(same_bits(one[i], two[i]));
        CHECK(same_bits(one[i], three[i]));
    }
}

TEST_CASE("fused GELU keeps NaN and infinity as ATen's does") {
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    const at::Tensor got = fused::gelu_tanh(at::tensor({nan, inf}));
    CHECK(std::isnan(got[0].item<float>()));
    CHECK(got[1].item<float>() == inf);
    CHECK(at::gelu(at::tensor({inf}), "tanh").item<float>() == inf);
}
