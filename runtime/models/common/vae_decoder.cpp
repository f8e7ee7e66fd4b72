#include "runtime/models/common/vae_decoder.h"

#include <ATen/ATen.h>

#include "runtime/io/config_json.h"
#include "runtime/io/errors.h"

namespace dp::runtime {

Conv2d Conv2d::load(WeightStore& w, const std::string& prefix, int64_t in, int64_t out, int64_t kernel) {
    Conv2d c;
    c.weight = w.take(prefix + ".weight", {out, in, kernel, kernel});
    c.bias = w.take(prefix + ".bias", {out});
    c.padding = kernel / 2;
    return c;
}

at::Tensor Conv2d::operator()(const at::Tensor& x) const { return at::conv2d(x, weight, bias, 1, padding); }

GroupNorm GroupNorm::load(WeightStore& w, const std::string& prefix, int64_t channels, int64_t groups,
                          double eps) {
    GroupNorm n;
    n.weight = w.take(prefix + ".weight", {channels});
    n.bias = w.take(prefix + ".bias", {channels});
    n.groups = groups;
    n.eps = eps;
    return n;
}

at::Tensor GroupNorm::operator()(const at::Tensor& x) const {
    return at::group_norm(x, groups, weight, bias, eps);
}

VaeConfig VaeConfig::from_json_text(const std::string& text, const std::string& path) {
    const ConfigJson c(text, path);
    c.require_class("VAE", "AutoencoderKL");
    VaeConfig v;
    v.in_channels = c.integer("in_channels", v.in_channels, 1, 64);
    v.out_channels = c.integer("out_channels", v.out_channels, 1, 64);
    v.latent_channels = c.integer("latent_channels", v.latent_channels, 1, 1024);
    v.layers_per_block = c.integer("layers_per_block", v.layers_per_block, 1, 64);
    v.norm_num_groups = c.integer("norm_num_groups", v.norm_num_groups, 1, 1024);
    v.scaling_factor = c.number("scaling_factor", v.scaling_factor, 1e-6, 1e6);
    v.shift_factor = c.has("shift_factor") ? c.number("shift_factor", 0.0, -1e6, 1e6) : 0.0;
    v.use_post_quant_conv = c.boolean("use_post_quant_conv", true);
    v.mid_block_add_attention = c.boolean("mid_block_add_attention", true);
    if (c.has("block_out_channels")) {
        const auto& list = c.raw()["block_out_channels"];
        if (!list.is_array() || list.empty() || list.size() > 8)
            c.fail("block_out_channels", "must be a list of 1 to 8 widths");
        v.block_out_channels.clear();
        for (const auto& ch : list) {
            if (!ch.is_number_integer() || ch.get<int64_t>() < 1 || ch.get<int64_t>() > 8192)
                c.fail("block_out_channels", "entries must be widths from 1 to 8192");
            if (ch.get<int64_t>() % v.norm_num_groups != 0)
                c.fail("block_out_channels",
                       "entries must be multiples of norm_num_groups " + std::to_string(v.norm_num_groups));
            v.block_out_channels.push_back(ch.get<int64_t>());
        }
    }
    if (c.has("up_block_types")) {
        for (const auto& t : c.raw()["up_block_types"])
            if (!t.is_string() || t.get<std::string>() != "UpDecoderBlock2D")
                c.fail("up_block_types", "supports UpDecoderBlock2D only, not " + t.dump());
        if (c.raw()["up_block_types"].size() != v.block_out_channels.size())
            c.fail("up_block_types", "must have one entry per block_out_channels entry");
    }
    const std::string act = c.string("act_fn", "silu");
    if (act != "silu") c.fail("act_fn", "is '" + act + "'; supported: silu");
    return v;
}

VaeDecoder::Resnet VaeDecoder::load_resnet(WeightStore& w, const std::string& p, int64_t in, int64_t out,
                                           int64_t groups) {
    Resnet r;
    r.norm1 = GroupNorm::load(w, p + ".norm1", in, groups, 1e-6);
    r.conv1 = Conv2d::load(w, p + ".conv1", in, out, 3);
    r.norm2 = GroupNorm::load(w, p + ".norm2", out, groups, 1e-6);
    r.conv2 = Conv2d::load(w, p + ".conv2", out, out, 3);
    if (in != out) r.shortcut = Conv2d::load(w, p + ".conv_shortcut", in, out, 1);
    return r;
}

at::Tensor VaeDecoder::Resnet::operator()(const at::Tensor& x) const {
    at::Tensor h = conv1(at::silu(norm1(x)));
    h = conv2(at::silu(norm2(h)));
    return (shortcut.weight.defined() ? shortcut(x) : x) + h;
}

VaeDecoder::VaeDecoder(const VaeConfig& config, WeightStore& w) : config_(config) {
    const int64_t g = config.norm_num_groups, lc = config.latent_channels;
    const std::vector<int64_t>& ch = config.block_out_channels;
    w.skip_prefix("encoder.");
    w.skip_prefix("quant_conv.");
    if (config.use_post_quant_conv) post_quant_conv_ = Conv2d::load(w, "post_quant_conv", lc, lc, 1);
    conv_in_ = Conv2d::load(w, "decoder.conv_in", lc, ch.back(), 3);
    mid_1_ = load_resnet(w, "decoder.mid_block.resnets.0", ch.back(), ch.back(), g);
    mid_attention_ = config.mid_block_add_attention;
    if (mid_attention_) {
        const std::string a = "decoder.mid_block.attentions.0";
        attn_norm_ = GroupNorm::load(w, a + ".group_norm", ch.back(), g, 1e-6);
        attn_q_ = Linear::load(w, a + ".to_q", ch.back(), ch.back());
        attn_k_ = Linear::load(w, a + ".to_k", ch.back(), ch.back());
        attn_v_ = Linear::load(w, a + ".to_v", ch.back(), ch.back());
        attn_out_ = Linear::load(w, a + ".to_out.0", ch.back(), ch.back());
    }
    mid_2_ = load_resnet(w, "decoder.mid_block.resnets.1", ch.back(), ch.back(), g);
    int64_t prev = ch.back();
    for (std::size_t i = 0; i < ch.size(); ++i) {
        const int64_t out = ch[ch.size() - 1 - i];
        UpBlock blk;
        for (int64_t j = 0; j <= config.layers_per_block; ++j)
            blk.resnets.push_back(
                load_resnet(w, "decoder.up_blocks." + std::to_string(i) + ".resnets." + std::to_string(j),
                            j == 0 ? prev : out, out, g));
        if (i + 1 < ch.size())
            blk.upsample =
                Conv2d::load(w, "decoder.up_blocks." + std::to_string(i) + ".upsamplers.0.conv", out, out, 3);
        up_blocks_.push_back(std::move(blk));
        prev = out;
    }
    norm_out_ = GroupNorm::load(w, "decoder.conv_norm_out", ch.front(), g, 1e-6);
    conv_out_ = Conv2d::load(w, "decoder.conv_out", ch.front(), config.out_channels, 3);
}

at::Tensor VaeDecoder::decode(const at::Tensor& latents) const {
    if (latents.dim() != 4 || latents.size(1) != config_.latent_channels)
        throw ModelError("VAE decode: expected latents [B, " + std::to_string(config_.latent_channels) +
                         ", h, w]");
    at::Tensor x = latents / config_.scaling_factor + config_.shift_factor;
    if (post_quant_conv_.weight.defined()) x = post_quant_conv_(x);
    x = mid_1_(conv_in_(x));
    if (mid_attention_) {
        // Single-head self-attention over the h * w positions, with a residual connection.
        const int64_t b = x.size(0), c = x.size(1), h = x.size(2), wd = x.size(3);
        at::Tensor t = attn_norm_(x).view({b, c, h * wd}).transpose(1, 2);
        at::Tensor q = attn_q_(t).unsqueeze(1), k = attn_k_(t).unsqueeze(1), v = attn_v_(t).unsqueeze(1);
        at::Tensor a = attn_out_(attention(q, k, v).squeeze(1));
        x = x + a.transpose(1, 2).reshape({b, c, h, wd});
    }
    x = mid_2_(x);
    for (const UpBlock& blk : up_blocks_) {
        for (const Resnet& r : blk.resnets) x = r(x);
        if (blk.upsample.weight.defined())
            x = blk.upsample(at::upsample_nearest2d(x, {x.size(2) * 2, x.size(3) * 2}));
    }
    return conv_out_(at::silu(norm_out_(x)));
}

}  // namespace dp::runtime
