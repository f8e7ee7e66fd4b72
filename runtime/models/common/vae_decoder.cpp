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

at::Tensor Conv2d::operator()(const at::Tensor& x) const {
    return at::conv2d(x, weight, bias, stride, padding);
}

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

namespace {

// `key`, when present, must be a list of `type` entries, one per block.
void check_block_types(const ConfigJson& c, const char* key, const std::string& type, std::size_t blocks) {
    if (!c.has(key)) return;
    const auto& list = c.raw()[key];
    if (!list.is_array()) c.fail(key, "must be a list of block types");
    for (const auto& t : list)
        if (!t.is_string() || t.get<std::string>() != type)
            c.fail(key, "supports " + type + " only, not " + t.dump().substr(0, 60));
    if (list.size() != blocks) c.fail(key, "must have one entry per block_out_channels entry");
}

// AutoencoderKLFlux2's own keys: the batch norm over 2 x 2 patches, and no scaling or shift factor.
void read_flux2_keys(const ConfigJson& c, VaeConfig& v) {
    v.latent_batch_norm = true;
    v.scaling_factor = 1.0;
    v.batch_norm_eps = c.number("batch_norm_eps", v.batch_norm_eps, 0.0, 1.0);
    if (c.has("patch_size") && c.raw()["patch_size"] != nlohmann::json::array({2, 2}))
        c.fail("patch_size",
               "is " + c.raw()["patch_size"].dump().substr(0, 40) + "; only [2, 2] is supported");
    if (c.has("decoder_block_out_channels") &&
        c.raw()["decoder_block_out_channels"] != c.raw()["block_out_channels"])
        c.fail("decoder_block_out_channels", "must be null (the encoder's block_out_channels)");
    for (const char* key : {"scaling_factor", "shift_factor"})
        if (c.has(key)) c.fail(key, "is not a key of AutoencoderKLFlux2 (its latents are normalized by bn)");
}

}  // namespace

VaeConfig VaeConfig::from_json_text(const std::string& text, const std::string& path) {
    const ConfigJson c(text, path);
    const std::string cls = c.string("_class_name", "AutoencoderKL");
    if (cls != "AutoencoderKL" && cls != "AutoencoderKLFlux2")
        c.fail("_class_name", "'" + cls +
                                  "' is not supported (the supported VAE classes: AutoencoderKL, "
                                  "AutoencoderKLFlux2)");
    VaeConfig v;
    if (cls == "AutoencoderKLFlux2") read_flux2_keys(c, v);
    v.in_channels = c.integer("in_channels", v.in_channels, 1, 64);
    v.out_channels = c.integer("out_channels", v.out_channels, 1, 64);
    v.latent_channels = c.integer("latent_channels", v.latent_channels, 1, 1024);
    v.layers_per_block = c.integer("layers_per_block", v.layers_per_block, 1, 64);
    v.norm_num_groups = c.integer("norm_num_groups", v.norm_num_groups, 1, 1024);
    v.scaling_factor = c.number("scaling_factor", v.scaling_factor, 1e-6, 1e6);  // FLUX.2's: 1
    v.shift_factor = c.has("shift_factor") ? c.number("shift_factor", 0.0, -1e6, 1e6) : 0.0;
    v.use_quant_conv = c.boolean("use_quant_conv", true);
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
    check_block_types(c, "up_block_types", "UpDecoderBlock2D", v.block_out_channels.size());
    check_block_types(c, "down_block_types", "DownEncoderBlock2D", v.block_out_channels.size());
    const std::string act = c.string("act_fn", "silu");
    if (act != "silu") c.fail("act_fn", "is '" + act + "'; supported: silu");
    return v;
}

VaeResnet VaeResnet::load(WeightStore& w, const std::string& p, int64_t in, int64_t out, int64_t groups) {
    VaeResnet r;
    r.norm1 = GroupNorm::load(w, p + ".norm1", in, groups, 1e-6);
    r.conv1 = Conv2d::load(w, p + ".conv1", in, out, 3);
    r.norm2 = GroupNorm::load(w, p + ".norm2", out, groups, 1e-6);
    r.conv2 = Conv2d::load(w, p + ".conv2", out, out, 3);
    if (in != out) r.shortcut = Conv2d::load(w, p + ".conv_shortcut", in, out, 1);
    return r;
}

at::Tensor VaeResnet::operator()(const at::Tensor& x) const {
    at::Tensor h = conv1(at::silu(norm1(x)));
    h = conv2(at::silu(norm2(h)));
    return (shortcut.weight.defined() ? shortcut(x) : x) + h;
}

VaeMidBlock VaeMidBlock::load(WeightStore& w, const std::string& p, int64_t channels, int64_t groups,
                              bool attention) {
    VaeMidBlock m;
    m.first = VaeResnet::load(w, p + ".resnets.0", channels, channels, groups);
    m.has_attention = attention;
    if (attention) {
        const std::string a = p + ".attentions.0";
        m.attn_norm = GroupNorm::load(w, a + ".group_norm", channels, groups, 1e-6);
        m.attn_q = Linear::load(w, a + ".to_q", channels, channels);
        m.attn_k = Linear::load(w, a + ".to_k", channels, channels);
        m.attn_v = Linear::load(w, a + ".to_v", channels, channels);
        m.attn_out = Linear::load(w, a + ".to_out.0", channels, channels);
    }
    m.second = VaeResnet::load(w, p + ".resnets.1", channels, channels, groups);
    return m;
}

at::Tensor VaeMidBlock::operator()(const at::Tensor& input) const {
    at::Tensor x = first(input);
    if (has_attention) {
        // Single-head self-attention over the h * w positions, with a residual connection.
        const int64_t b = x.size(0), c = x.size(1), h = x.size(2), wd = x.size(3);
        at::Tensor t = attn_norm(x).view({b, c, h * wd}).transpose(1, 2);
        at::Tensor q = attn_q(t).unsqueeze(1), k = attn_k(t).unsqueeze(1), v = attn_v(t).unsqueeze(1);
        at::Tensor a = attn_out(attention(q, k, v).squeeze(1));
        x = x + a.transpose(1, 2).reshape({b, c, h, wd});
    }
    return second(x);
}

VaeDecoder::VaeDecoder(const VaeConfig& config, WeightStore& w) : config_(config) {
    const int64_t g = config.norm_num_groups, lc = config.latent_channels;
    const std::vector<int64_t>& ch = config.block_out_channels;
    w.skip_prefix("encoder.");
    w.skip_prefix("quant_conv.");
    if (config.latent_batch_norm) w.skip_prefix("bn.");  // its pipelines' statistics, not the decoder's
    if (config.use_post_quant_conv) post_quant_conv_ = Conv2d::load(w, "post_quant_conv", lc, lc, 1);
    conv_in_ = Conv2d::load(w, "decoder.conv_in", lc, ch.back(), 3);
    mid_ = VaeMidBlock::load(w, "decoder.mid_block", ch.back(), g, config.mid_block_add_attention);
    int64_t prev = ch.back();
    for (std::size_t i = 0; i < ch.size(); ++i) {
        const int64_t out = ch[ch.size() - 1 - i];
        UpBlock blk;
        for (int64_t j = 0; j <= config.layers_per_block; ++j)
            blk.resnets.push_back(
                VaeResnet::load(w, "decoder.up_blocks." + std::to_string(i) + ".resnets." + std::to_string(j),
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

at::Tensor VaeDecoder::decode(const at::Tensor& latents, bool shift) const {
    if (latents.dim() != 4 || latents.size(1) != config_.latent_channels)
        throw ModelError("VAE decode: expected latents [B, " + std::to_string(config_.latent_channels) +
                         ", h, w]");
    at::Tensor x =
        shift ? latents / config_.scaling_factor + config_.shift_factor : latents / config_.scaling_factor;
    if (post_quant_conv_.weight.defined()) x = post_quant_conv_(x);
    x = mid_(conv_in_(x));
    for (const UpBlock& blk : up_blocks_) {
        for (const VaeResnet& r : blk.resnets) x = r(x);
        if (blk.upsample.weight.defined())
            x = blk.upsample(at::upsample_nearest2d(x, {x.size(2) * 2, x.size(3) * 2}));
    }
    return conv_out_(at::silu(norm_out_(x)));
}

}  // namespace dp::runtime
