#pragma once
// The encoder half of diffusers' AutoencoderKL (SD3's and FLUX.1's VAE), for image inputs
// (img2img, inpainting): conv_in, down blocks of ResNets, all but the last followed by a stride-2
// downsample, the decoder's mid block, GroupNorm + SiLU + conv_out to twice the latent channels,
// quant_conv, then the latent distribution. Also what Qwen-Image's encoder (qwen_image_vae.h)
// shares with it: the distribution and the downsample.
//
// Loading: the encoder comes from the same `vae` folder (or single file) as the decoder, from its
// own store or the decoder's; each takes its half and marks the other's as not needed, so each
// store's check_all_taken() holds. In a family's load, beside its decoder:
//   c->vae_encoder = component_of<VaeEncoder>(opts, "vae", SALT, device_of(o, "vae"),
//       [self](WeightStore& w) { return std::make_unique<VaeEncoder>(self->vae_config, w); });
// with the decoder's salt: with random_weights the two halves are then one seeded VAE's (the store
// seeds each tensor by its name).

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "runtime/models/common/vae_decoder.h"

namespace dp::runtime {

// diffusers' latent_dist (DiagonalGaussianDistribution): the mean and the standard deviation of
// each latent, in the weights' dtype. img2img takes the mean (retrieve_latents' "argmax") or
// mean + std * noise ("sample").
struct LatentDistribution {
    at::Tensor mean, std;
};

// The distribution of `moments` [B, 2C, ...]: the first C channels the mean, the last C the log
// variance, clamped to [-30, 20]; std = exp(0.5 * logvar).
LatentDistribution latent_distribution(const at::Tensor& moments);

// An encoder's 2x downsampling (diffusers' Downsample2D with padding 0, QwenImageResample's
// downsample2d): the input padded with one zero column on the right and one zero row at the bottom,
// then a 3x3 conv with stride 2 and no padding of its own.
struct Downsample2x {
    Conv2d conv;
    static Downsample2x load(WeightStore& w, const std::string& prefix, int64_t channels);
    bool defined() const { return conv.weight.defined(); }
    at::Tensor operator()(const at::Tensor& x) const;
};

// One level of an encoder: its residual blocks (VaeResnet, or Qwen-Image's qwen_vae::Residual),
// then, on all but the last level, a 2x downsample.
template <class Block>
struct DownLevel {
    std::vector<Block> resnets;
    Downsample2x downsample;  // undefined on the last level
    at::Tensor operator()(at::Tensor x) const {
        for (const Block& r : resnets) x = r(x);
        return downsample.defined() ? downsample(x) : x;
    }
};

// A VAE's encoder, for one frame: conv_in, levels of residual blocks (`Block`) with 2x downsamples,
// the mid block (`Mid`), norm (`Norm`) + SiLU + conv_out to twice the latent channels, quant_conv,
// the distribution. VaeEncoder (below) and QwenImageVaeEncoder (qwen_image_vae.h) are its two kinds;
// each has a constructor of its own, which loads the layers from its VAE class's tensor names.
template <class Config, class Block, class Mid, class Norm>
class ImageEncoder {
  public:
    ImageEncoder(const Config& config, WeightStore& weights);

    // images [B, C, H, W] in [-1, 1], C the image channels, H and W multiples of
    // config.scale_factor(), converted to the weights' dtype and device -> the latent distribution
    // [B, latent channels, H / f, W / f]. Throws ModelError for other shapes.
    LatentDistribution encode(const at::Tensor& images) const;
    const Config& config() const { return config_; }

  private:
    Config config_;
    Conv2d conv_in_, conv_out_, quant_conv_;  // quant_conv_ undefined: none
    std::vector<DownLevel<Block>> levels_;
    Mid mid_;
    Norm norm_out_;
};

// AutoencoderKL's encoder: encode() is AutoencoderKL.encode(images).latent_dist, unscaled (the
// caller applies shift_factor and scaling_factor: (latents - shift) * scaling).
using VaeEncoder = ImageEncoder<VaeConfig, VaeResnet, VaeMidBlock, GroupNorm>;
// Takes the encoder's tensors (encoder.*, and quant_conv.* with use_quant_conv); the decoder's
// (decoder.*, post_quant_conv.*) are marked as not needed.
template <>
VaeEncoder::ImageEncoder(const VaeConfig& config, WeightStore& weights);

}  // namespace dp::runtime
