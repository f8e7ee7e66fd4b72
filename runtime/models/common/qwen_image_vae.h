#pragma once
// The decoder half of diffusers' AutoencoderKLQwenImage (Qwen-Image's VAE, a Wan-style causal video
// VAE) for still images: one latent frame in, one image out. post_quant_conv, conv_in, a mid block
// (residual block, single-head attention over the positions, residual block), up blocks of residual
// blocks, all but the last followed by a nearest-exact 2x upsample and a conv halving the channels,
// then RMS norm + SiLU + conv to the image channels, clamped to [-1, 1]. Every causal 3-D
// convolution runs as a 2-D one (Note [one frame through causal 3-D convolutions]).

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "runtime/io/config_file.h"
#include "runtime/models/common/vae_decoder.h"

namespace dp::runtime {

struct QwenImageVaeConfig : ConfigFile<QwenImageVaeConfig> {
    int64_t base_dim = 96;
    int64_t z_dim = 16;
    std::vector<int64_t> dim_mult = {1, 2, 4, 4};
    int64_t num_res_blocks = 2;
    std::vector<bool> temperal_downsample = {false, true, true};  // one per downsampling, encoder order
    double dropout = 0.0;                                         // training only
    int64_t input_channels = 3;                                   // the image's channels
    std::vector<double> latents_mean, latents_std;                // z_dim values each

    // How many pixels one latent covers along each side: 2^len(temperal_downsample).
    int64_t scale_factor() const { return int64_t{1} << temperal_downsample.size(); }

    // Defaults are diffusers' (Qwen-Image's latent statistics included). Throws ModelError naming
    // `path` and the key for values the decoder cannot honour.
    static QwenImageVaeConfig from_json_text(const std::string& text, const std::string& path);
};

class QwenImageVaeDecoder {
  public:
    // Takes the decoder's tensors; the encoder's (encoder.*, quant_conv.*) and the up blocks'
    // time_conv (unused for one frame) are marked as not needed.
    QwenImageVaeDecoder(const QwenImageVaeConfig& config, WeightStore& weights);

    // Latents [B, z_dim, h, w] as the transformer makes them -> images [B, input_channels, h * f,
    // w * f] in [-1, 1], as QwenImagePipeline decodes them: un-normalised with latents_mean and
    // latents_std, decoded as one frame, clamped.
    at::Tensor decode(const at::Tensor& latents) const;
    const QwenImageVaeConfig& config() const { return config_; }

  private:
    // QwenImageRMS_norm: x / ||x|| over the channels * sqrt(channels) * gamma (no bias here).
    struct RmsNorm {
        at::Tensor gamma;  // [C, 1, 1]
        double scale = 1.0;
        at::Tensor operator()(const at::Tensor& x) const;
    };
    struct Residual {
        RmsNorm norm1, norm2;
        Conv2d conv1, conv2, shortcut;  // shortcut undefined when channels are unchanged
        at::Tensor operator()(const at::Tensor& x) const;
    };
    struct UpBlock {
        std::vector<Residual> resnets;
        Conv2d upsample;  // 2x nearest-exact then this conv (channels halved); undefined for the last
    };
    static RmsNorm load_norm(WeightStore& w, const std::string& name, int64_t channels, bool image_shaped);
    static Residual load_residual(WeightStore& w, const std::string& prefix, int64_t in, int64_t out);
    at::Tensor mid_attention(const at::Tensor& x) const;

    QwenImageVaeConfig config_;
    at::Tensor mean_, std_;  // [1, z_dim, 1, 1]
    Conv2d post_quant_conv_, conv_in_, conv_out_;
    Residual mid_1_, mid_2_;
    RmsNorm attn_norm_, norm_out_;
    Conv2d attn_qkv_, attn_proj_;
    std::vector<UpBlock> up_blocks_;
};

}  // namespace dp::runtime
