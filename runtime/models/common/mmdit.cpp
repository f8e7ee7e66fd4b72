#include "runtime/models/common/mmdit.h"

#include "runtime/pipeline/block_runner.h"

#include <ATen/ATen.h>

#include "runtime/models/common/fused_ops.h"
#include "runtime/parallel/attention.h"
#include "runtime/parallel/sequence_shard.h"

namespace dp::runtime {
namespace {

constexpr double kEps = 1e-6;  // every MMDiT's LayerNorms and qk-norms

}  // namespace

DualStreamBlock::DualStreamBlock(const LinearLoader& linear, const std::string& b, int64_t d, int64_t hd,
                                 const DualStreamLayout& layout, bool context_pre_only, bool image_attention)
    : clamp_(layout.clamp), context_pre_only_(context_pre_only), image_attention_(image_attention) {
    WeightStore& w = linear.weights();
    const bool bias = layout.bias;
    if (!layout.image_modulation.empty())
        modulation_ = linear(b + layout.image_modulation, d, (image_attention ? 9 : 6) * d);
    if (!layout.text_modulation.empty())
        text_modulation_ = linear(b + layout.text_modulation, d, (context_pre_only ? 2 : 6) * d);
    // The attention projections by whole heads, unevenly where tp does not divide them (Note
    // [uneven heads]).
    const auto attention = [&](const std::string& a, const char* q, const char* k, const char* v,
                               const char* out, const char* norm_q, const char* norm_k) {
        Attention at;
        at.to_q = linear(a + q, d, d, hd, bias);
        at.to_k = linear(a + k, d, d, hd, bias);
        at.to_v = linear(a + v, d, d, hd, bias);
        if (out) at.to_out = linear(a + out, d, d, hd, bias);
        if (layout.qk_norm) {
            at.norm_q = RMSNorm::load(w, a + norm_q, hd, kEps, true, layout.qk_rounding);
            at.norm_k = RMSNorm::load(w, a + norm_k, hd, kEps, true, layout.qk_rounding);
        }
        return at;
    };
    image_ = attention(b + ".attn", ".to_q", ".to_k", ".to_v", ".to_out.0", ".norm_q", ".norm_k");
    text_ = attention(b + ".attn", ".add_q_proj", ".add_k_proj", ".add_v_proj", nullptr, ".norm_added_q",
                      ".norm_added_k");
    if (!context_pre_only) to_add_out_ = linear(b + ".attn.to_add_out", d, d, hd, bias);
    if (image_attention)
        attn2_ = attention(b + ".attn2", ".to_q", ".to_k", ".to_v", ".to_out.0", ".norm_q", ".norm_k");
    const int64_t hidden = layout.mlp_hidden > 0 ? layout.mlp_hidden : 4 * d;
    const auto mlp = [&](const std::string& m) {
        FeedForward f;
        f.gated = layout.swiglu;
        f.in = linear(m + (f.gated ? ".linear_in" : ".net.0.proj"), d, (f.gated ? 2 : 1) * hidden, 1, bias);
        f.out = linear(m + (f.gated ? ".linear_out" : ".net.2"), hidden, d, 1, bias);
        return f;
    };
    mlp_ = mlp(b + layout.image_mlp);
    if (!context_pre_only) text_mlp_ = mlp(b + layout.text_mlp);
}

void DualStreamBlock::forward(at::Tensor& x, at::Tensor& ctx, const at::Tensor& temb_act,
                              const DualStreamStep& s) const {
    // shift, scale, gate (attention), shift, scale, gate (MLP)[, shift, scale, gate (attn2)]
    // shift, scale and gate per image token [B, 1 or n, width]: a token of other_tokens takes the
    // other conditioning's.
    const bool shared = s.image_modulation.defined();  // FLUX.2's, the model's for every block
    std::vector<at::Tensor> m =
        (shared ? s.image_modulation : modulation_(temb_act)).chunk(image_attention_ ? 9 : 6, 1);
    for (at::Tensor& one : m) one = one.unsqueeze(1);
    if (s.other_conditioning.defined()) {
        const std::vector<at::Tensor> other = modulation_(s.other_conditioning).chunk(m.size(), 1);
        for (std::size_t i = 0; i < m.size(); ++i)
            m[i] = at::where(s.other_tokens, other[i].unsqueeze(1), m[i]);
    }
    const at::Tensor x_in = x;  // SD3.5's attn2 modulates the block's input again
    const at::Tensor nx = fused::norm_modulate(x, m[0], m[1], kEps);
    std::vector<at::Tensor> mc;
    at::Tensor nctx;
    if (context_pre_only_) {
        const std::vector<at::Tensor> sc =
            text_modulation_(temb_act.to(ctx.scalar_type())).chunk(2, 1);  // scale, shift
        nctx = adaln::norm_modulate(ctx, sc[1], sc[0], kEps);
    } else {
        mc = (shared ? s.text_modulation : text_modulation_(temb_act)).chunk(6, 1);
        nctx = adaln::norm_modulate(ctx, mc[0], mc[1], kEps);
    }
    // q and k normed, then rotated, as diffusers orders them.
    const auto project = [&](const Attention& a, const at::Tensor& in,
                             const std::function<at::Tensor(const at::Tensor&)>& rotate, at::Tensor& q,
                             at::Tensor& k, at::Tensor& v) {
        q = split_heads(a.to_q(in), s.heads);
        k = split_heads(a.to_k(in), s.heads);
        v = split_heads(a.to_v(in), s.heads);
        if (a.norm_q) {
            q = (*a.norm_q)(q);
            k = (*a.norm_k)(k);
        }
        if (rotate) {
            q = rotate(q);
            k = rotate(k);
        }
    };
    const bool text_out = !context_pre_only_ && !s.last;
    // The joint attention's outputs after their projections: [image, text (when it goes on)].
    const auto joint_attention = [&] {
        AttentionInputs in;
        project(image_, nx, s.rotate_image, in.q, in.k, in.v);
        project(text_, nctx, s.rotate_text, in.q2, in.k2, in.v2);
        in.shard = s.image;
        in.shard2 = s.text;
        in.bias2 = s.text_bias;
        in.want_out2 = text_out;
        const AttentionOutputs o = attend(in);
        std::vector<at::Tensor> out{image_.to_out(merge_heads(o.out))};
        if (text_out) out.push_back(to_add_out_(merge_heads(o.out2)));
        return out;
    };
    const std::vector<at::Tensor> attn = s.block ? s.block->attention(joint_attention) : joint_attention();
    const at::Tensor& attn_x = attn.at(0);
    const at::Tensor attn_ctx = text_out ? attn.at(1) : at::Tensor();

    x = fused::gated_residual(x, m[2], attn_x);
    if (image_attention_) {  // SD3.5's attn2: the image tokens alone, split as attn's are
        AttentionInputs a2;
        project(attn2_, fused::norm_modulate(x_in, m[6], m[7], kEps), {}, a2.q, a2.k, a2.v);
        a2.shard = s.image;
        x = fused::gated_residual(x, m[8], attn2_.to_out(merge_heads(attend(a2).out)));
    }
    x = fused::gated_residual(x, m[5], mlp_(fused::norm_modulate(x, m[3], m[4], kEps)));
    if (text_out) {
        ctx = fused::gated_residual(ctx, mc[2].unsqueeze(1), attn_ctx);
        ctx = fused::gated_residual(ctx, mc[5].unsqueeze(1),
                                    text_mlp_(adaln::norm_modulate(ctx, mc[3], mc[4], kEps)));
    }
    if (clamp_ == DualStreamLayout::Clamp::kBoth) x = clamp_half(x);
    if (clamp_ == DualStreamLayout::Clamp::kBoth || (clamp_ == DualStreamLayout::Clamp::kText && text_out))
        ctx = clamp_half(ctx);
}

}  // namespace dp::runtime

namespace dp::runtime {

at::Tensor one_stream_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t nt,
                                bool image_only, const SequenceShard& image, const SequenceShard& words,
                                const SequenceGroups& sequence) {
    const int64_t ni = q.size(2) - nt;
    AttentionInputs in;
    if (!image.split()) {
        const SequenceShard one(nt + ni, sequence);  // unsplit: the one stream
        in.q = q, in.k = k, in.v = v;
        in.shard = &one;
        const at::Tensor out = merge_heads(attend(in).out);
        return image_only ? out.narrow(1, nt, ni) : out;
    }
    in.q = q.narrow(2, nt, ni), in.k = k.narrow(2, nt, ni), in.v = v.narrow(2, nt, ni);
    in.q2 = q.narrow(2, 0, nt), in.k2 = k.narrow(2, 0, nt), in.v2 = v.narrow(2, 0, nt);
    in.shard = &image;
    in.shard2 = &words;
    in.want_out2 = !image_only;
    const AttentionOutputs o = attend(in);
    return image_only ? merge_heads(o.out) : at::cat({merge_heads(o.out2), merge_heads(o.out)}, 1);
}

}  // namespace dp::runtime
