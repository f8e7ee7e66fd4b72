#pragma once
// The decoder half of diffusers' AutoencoderKL (SD3's and FLUX.1's VAE and their tiny test shapes,
// and AutoencoderKLFlux2's, the same network):
// conv_in, a mid block (ResNet, single-head spatial self-attention, ResNet), up blocks of ResNets
// with nearest-neighbour 2x upsampling, GroupNorm + SiLU + conv_out. Latents are unscaled with the
// config's scaling_factor and shift_factor before decoding. Here too: the config and the blocks the
// encoder (vae_encoder.h) shares with it.

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "runtime/io/config_file.h"
#include "runtime/models/common/layers.h"

namespace dp::runtime {

struct VaeConfig : ConfigFile<VaeConfig> {
    int64_t in_channels = 3;
    int64_t out_channels = 3;
    int64_t latent_channels = 16;
    std::vector<int64_t> block_out_channels = {128, 256, 512, 512};
    int64_t layers_per_block = 2;
    int64_t norm_num_groups = 32;
    double scaling_factor = 1.5305;
    double shift_factor = 0.0;
    bool use_quant_conv = true;  // the encoder's
    bool use_post_quant_conv = true;
    bool mid_block_add_attention = true;
    // AutoencoderKLFlux2 (FLUX.2): no scaling or shift factor, and a batch norm over the 2 x 2
    // patchified latents whose running statistics (bn.*) its pipelines normalize with
    // (flux2/flux2_vae.h); eps its batch_norm_eps.
    bool latent_batch_norm = false;
    double batch_norm_eps = 1e-4;

    // How many pixels one latent covers along each side: 2^(blocks - 1).
    int64_t scale_factor() const { return int64_t{1} << (block_out_channels.size() - 1); }

    static VaeConfig from_json_text(const std::string& text, const std::string& path);
};

struct Conv2d {
    at::Tensor weight, bias;
    int64_t padding = 0;
    int64_t stride = 1;
    static Conv2d load(WeightStore& w, const std::string& prefix, int64_t in, int64_t out, int64_t kernel);
    at::Tensor operator()(const at::Tensor& x) const;
};

struct GroupNorm {
    at::Tensor weight, bias;
    int64_t groups = 32;
    double eps = 1e-6;
    static GroupNorm load(WeightStore& w, const std::string& prefix, int64_t channels, int64_t groups,
                          double eps);
    at::Tensor operator()(const at::Tensor& x) const;
};

// diffusers' ResnetBlock2D as the VAEs use it: GroupNorm + SiLU + conv, twice (eps 1e-6, no time
// embedding), plus the input, through a 1x1 conv when the channels change.
struct VaeResnet {
    GroupNorm norm1, norm2;
    Conv2d conv1, conv2, shortcut;  // shortcut undefined when channels are unchanged
    static VaeResnet load(WeightStore& w, const std::string& prefix, int64_t in, int64_t out, int64_t groups);
    at::Tensor operator()(const at::Tensor& x) const;
};

// diffusers' UNetMidBlock2D of the encoder and the decoder: a ResNet, single-head self-attention over
// the h * w positions with a residual connection (left out without mid_block_add_attention), a ResNet.
struct VaeMidBlock {
    VaeResnet first, second;
    bool has_attention = true;
    GroupNorm attn_norm;
    Linear attn_q, attn_k, attn_v, attn_out;
    static VaeMidBlock load(WeightStore& w, const std::string& prefix, int64_t channels, int64_t groups,
                            bool attention);
    at::Tensor operator()(const at::Tensor& x) const;
};

class VaeDecoder {
  public:
    // Takes the decoder's tensors; the encoder's (encoder.*, quant_conv.*) are marked as not needed.
    VaeDecoder(const VaeConfig& config, WeightStore& weights);

    // Scaled latents [B, latent_channels, h, w] -> images [B, out_channels, h * f, w * f] in [-1, 1]
    // (unclamped), as AutoencoderKL.decode((latents / scaling_factor) + shift_factor); with `shift`
    // false, AutoencoderKL.decode(latents / scaling_factor), as StableDiffusion3InpaintPipeline
    // decodes (diffusers 0.42.1 leaves the shift out there, and only there).
    at::Tensor decode(const at::Tensor& latents, bool shift = true) const;
    const VaeConfig& config() const { return config_; }

  private:
    struct UpBlock {
        std::vector<VaeResnet> resnets;
        Conv2d upsample;  // undefined for the last block
    };

    VaeConfig config_;
    Conv2d post_quant_conv_, conv_in_, conv_out_;
    VaeMidBlock mid_;
    std::vector<UpBlock> up_blocks_;
    GroupNorm norm_out_;
};

}  // namespace dp::runtime
