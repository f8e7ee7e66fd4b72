#pragma once
// diffusers' AutoencoderKLQwenImage (Qwen-Image's VAE, a Wan-style causal video VAE) for still
// images, one frame each. The decoder: post_quant_conv, conv_in, a mid block (residual block,
// single-head attention over the positions, residual block), up blocks of residual blocks, all but
// the last followed by a nearest-exact 2x upsample and a conv halving the channels, then RMS norm +
// SiLU + conv to the image channels, clamped to [-1, 1]. The encoder (qwen_image_vae_encoder.cpp):
// conv_in, down blocks of residual blocks, all but the last followed by a 2x downsample, the same
// kind of mid block, RMS norm + SiLU + conv to 2 * z_dim, quant_conv, the latent distribution. Every
// causal 3-D convolution runs as a 2-D one (Note [one frame through causal 3-D convolutions]).

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "runtime/io/config_file.h"
#include "runtime/models/common/vae_encoder.h"

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
    std::vector<double> attn_scales;  // the encoder's down-block attention: none supported

    // How many pixels one latent covers along each side: 2^len(temperal_downsample).
    int64_t scale_factor() const { return int64_t{1} << temperal_downsample.size(); }

    // Defaults are diffusers' (Qwen-Image's latent statistics included). Throws ModelError naming
    // `path` and the key for values the decoder cannot honour.
    static QwenImageVaeConfig from_json_text(const std::string& text, const std::string& path);
};

// The blocks the encoder and the decoder share.
namespace qwen_vae {

// QwenImageRMS_norm: x / ||x|| over the channels * sqrt(channels) * gamma (no bias here).
struct RmsNorm {
    at::Tensor gamma;  // [C, 1, 1]
    double scale = 1.0;
    // The residual blocks' norms keep a video-shaped gamma [C, 1, 1, 1], the attention's [C, 1, 1].
    static RmsNorm load(WeightStore& w, const std::string& name, int64_t channels, bool image_shaped);
    at::Tensor operator()(const at::Tensor& x) const;
};

// QwenImageResidualBlock: RMS norm + SiLU + causal conv, twice, plus the input (through a 1x1x1
// conv when the channels change).
struct Residual {
    RmsNorm norm1, norm2;
    Conv2d conv1, conv2, shortcut;  // shortcut undefined when channels are unchanged
    static Residual load(WeightStore& w, const std::string& prefix, int64_t in, int64_t out);
    at::Tensor operator()(const at::Tensor& x) const;
};

// QwenImageMidBlock: a residual block, one head of attention over each frame's h * w positions
// (the channels as the head dimension) with a residual connection, a residual block.
struct MidBlock {
    Residual first, second;
    RmsNorm attn_norm;
    Conv2d attn_qkv, attn_proj;
    static MidBlock load(WeightStore& w, const std::string& prefix, int64_t channels);
    at::Tensor operator()(const at::Tensor& x) const;
};

// A causal 3-D conv's weights as the 2-D conv they amount to for one frame (the Note).
Conv2d load_causal_conv(WeightStore& w, const std::string& prefix, int64_t in, int64_t out, int64_t kernel);

}  // namespace qwen_vae

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
    struct UpBlock {
        std::vector<qwen_vae::Residual> resnets;
        Conv2d upsample;  // 2x nearest-exact then this conv (channels halved); undefined for the last
    };

    QwenImageVaeConfig config_;
    at::Tensor mean_, std_;  // [1, z_dim, 1, 1]
    Conv2d post_quant_conv_, conv_in_, conv_out_;
    qwen_vae::MidBlock mid_;
    qwen_vae::RmsNorm norm_out_;
    std::vector<UpBlock> up_blocks_;
};

// Qwen-Image's encoder (ImageEncoder, vae_encoder.h). encode() takes each image as one frame and
// gives AutoencoderKLQwenImage.encode(images[:, :, None]).latent_dist's [B, z_dim, 1, h, w] without
// its frame axis, [B, z_dim, h, w], as the transformer's latents and decode() lay them out; not
// normalised (the caller applies (x - latents_mean) / latents_std).
using QwenImageVaeEncoder =
    ImageEncoder<QwenImageVaeConfig, qwen_vae::Residual, qwen_vae::MidBlock, qwen_vae::RmsNorm>;
// Takes the encoder's tensors and quant_conv's; the decoder's (decoder.*, post_quant_conv.*) and the
// downsample3d blocks' time_conv (unused for one frame) are marked as not needed. Throws ModelError
// for attn_scales that would put attention in a down block.
template <>
QwenImageVaeEncoder::ImageEncoder(const QwenImageVaeConfig& config, WeightStore& weights);

}  // namespace dp::runtime
