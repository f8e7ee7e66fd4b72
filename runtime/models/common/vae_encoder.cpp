#include "runtime/models/common/vae_encoder.h"

#include <ATen/ATen.h>

#include "runtime/io/errors.h"
#include "runtime/models/common/qwen_image_vae.h"

namespace dp::runtime {

namespace {

// Throws ModelError unless `images` is [B, channels, H, W] with H and W positive multiples of
// `multiple` (the VAE's pixels per latent).
void check_images(const at::Tensor& images, int64_t channels, int64_t multiple) {
    const auto shape = [&] {
        if (!images.defined()) return std::string("no tensor");
        std::string s;
        for (int64_t d : images.sizes()) s += (s.empty() ? "" : ", ") + std::to_string(d);
        return "[" + s + "]";
    };
    const bool ok = images.defined() && images.dim() == 4 && images.size(0) > 0 &&
                    images.size(1) == channels && images.size(2) > 0 && images.size(3) > 0 &&
                    images.size(2) % multiple == 0 && images.size(3) % multiple == 0;
    if (!ok)
        throw ModelError("VAE encode: expected images [B, " + std::to_string(channels) +
                         ", H, W] with H and W multiples of " + std::to_string(multiple) + ", got " +
                         shape());
}

}  // namespace

LatentDistribution latent_distribution(const at::Tensor& moments) {
    const std::vector<at::Tensor> parts = moments.chunk(2, 1);
    const at::Tensor logvar = at::clamp(parts[1], -30.0, 20.0);
    return {parts[0].contiguous(), at::exp(0.5 * logvar)};
}

Downsample2x Downsample2x::load(WeightStore& w, const std::string& prefix, int64_t channels) {
    Downsample2x d;
    d.conv = Conv2d::load(w, prefix, channels, channels, 3);
    d.conv.padding = 0;
    d.conv.stride = 2;
    return d;
}

at::Tensor Downsample2x::operator()(const at::Tensor& x) const {
    return conv(at::constant_pad_nd(x, {0, 1, 0, 1}, 0));  // (left, right, top, bottom)
}

template <class Config, class Block, class Mid, class Norm>
LatentDistribution ImageEncoder<Config, Block, Mid, Norm>::encode(const at::Tensor& images) const {
    check_images(images, conv_in_.weight.size(1), config_.scale_factor());
    at::Tensor x = conv_in_(images.to(conv_in_.weight.options()));
    for (const DownLevel<Block>& level : levels_) x = level(x);
    x = conv_out_(at::silu(norm_out_(mid_(x))));
    if (quant_conv_.weight.defined()) x = quant_conv_(x);
    return latent_distribution(x);
}

template <>
VaeEncoder::ImageEncoder(const VaeConfig& config, WeightStore& w) : config_(config) {
    const int64_t g = config.norm_num_groups, lc = config.latent_channels;
    const std::vector<int64_t>& ch = config.block_out_channels;
    w.skip_prefix("decoder.");
    w.skip_prefix("post_quant_conv.");
    if (config.latent_batch_norm) w.skip_prefix("bn.");  // its pipelines' statistics, not the encoder's
    conv_in_ = Conv2d::load(w, "encoder.conv_in", config.in_channels, ch.front(), 3);
    int64_t in = ch.front();
    for (std::size_t i = 0; i < ch.size(); ++i) {
        const std::string p = "encoder.down_blocks." + std::to_string(i);
        DownLevel<VaeResnet> level;
        for (int64_t j = 0; j < config.layers_per_block; ++j) {
            level.resnets.push_back(VaeResnet::load(w, p + ".resnets." + std::to_string(j), in, ch[i], g));
            in = ch[i];
        }
        if (i + 1 < ch.size()) level.downsample = Downsample2x::load(w, p + ".downsamplers.0.conv", ch[i]);
        levels_.push_back(std::move(level));
    }
    mid_ = VaeMidBlock::load(w, "encoder.mid_block", ch.back(), g, config.mid_block_add_attention);
    norm_out_ = GroupNorm::load(w, "encoder.conv_norm_out", ch.back(), g, 1e-6);
    conv_out_ = Conv2d::load(w, "encoder.conv_out", ch.back(), 2 * lc, 3);  // double_z
    if (config.use_quant_conv) quant_conv_ = Conv2d::load(w, "quant_conv", 2 * lc, 2 * lc, 1);
}

// The two kinds (their constructors are their own: this one above, Qwen-Image's in
// qwen_image_vae_encoder.cpp).
template class ImageEncoder<VaeConfig, VaeResnet, VaeMidBlock, GroupNorm>;
template class ImageEncoder<QwenImageVaeConfig, qwen_vae::Residual, qwen_vae::MidBlock, qwen_vae::RmsNorm>;

}  // namespace dp::runtime
