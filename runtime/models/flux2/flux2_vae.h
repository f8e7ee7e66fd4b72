#pragma once
// AutoencoderKLFlux2 as FLUX.2's pipelines use it (docs/flux2-reference.md, section 2): AutoencoderKL's
// encoder and decoder (vae_encoder.h, vae_decoder.h) around latents that the pipelines patchify 2 x 2
// and normalize with the VAE's batch-norm running statistics. The transformer's tokens are those
// patchified, normalized latents, one token per patch.

#include <ATen/core/Tensor.h>

#include "runtime/models/common/vae_encoder.h"

namespace dp::runtime {

// [B, L, 2h, 2w] -> [B, 4L, h, w]: out[b, 4c + 2 dy + dx, y, x] = z[b, c, 2y + dy, 2x + dx]; and back.
at::Tensor patchify_latents(const at::Tensor& z);
at::Tensor unpatchify_latents(const at::Tensor& z);
// [B, C, h, w] -> [B, h w, C], token y w + x the channels at (y, x); and back for an h x w grid.
at::Tensor pack_tokens(const at::Tensor& z);
at::Tensor unpack_tokens(const at::Tensor& tokens, int64_t h, int64_t w);

// The batch norm's statistics over the patchified latents: mean = bn.running_mean, std =
// sqrt(bn.running_var + batch_norm_eps), [4L] each, in the weights' dtype.
struct Flux2LatentNorm {
    at::Tensor mean, std;
    // Takes bn.running_mean and bn.running_var (bn.num_batches_tracked is not needed).
    static Flux2LatentNorm load(WeightStore& w, const VaeConfig& config);
    // (x - mean) / std and its inverse, over the channels of patchified latents [B, 4L, h, w].
    at::Tensor normalize(const at::Tensor& x) const;
    at::Tensor denormalize(const at::Tensor& x) const;
};

class Flux2VaeDecoder {
  public:
    // Takes the decoder's tensors and the statistics; the encoder's are marked as not needed.
    Flux2VaeDecoder(const VaeConfig& config, WeightStore& weights);
    // Normalized patchified latents [B, 4L, h, w] -> images [B, 3, 16 h, 16 w] in [-1, 1] (for a
    // VAE of scale 8; unclamped): denormalized, unpatchified, decoded.
    at::Tensor decode(const at::Tensor& latents) const;
    const VaeConfig& config() const { return decoder_.config(); }

  private:
    Flux2LatentNorm norm_;
    VaeDecoder decoder_;
};

class Flux2VaeEncoder {
  public:
    // Takes the encoder's tensors and the statistics; the decoder's are marked as not needed.
    Flux2VaeEncoder(const VaeConfig& config, WeightStore& weights);
    // Images [1, 3, H, W] in [-1, 1] (sides multiples of twice the VAE's scale) -> the posterior's
    // mode [1, L, H / f, W / f], unnormalized (what diffusers' latent_dist.mode() gives).
    at::Tensor mode(const at::Tensor& images) const;
    // ... patchified and normalized, as the pipelines pack it: [1, 4L, H / 2f, W / 2f].
    at::Tensor encode(const at::Tensor& images) const;
    const Flux2LatentNorm& norm() const { return norm_; }

  private:
    Flux2LatentNorm norm_;
    VaeEncoder encoder_;
};

}  // namespace dp::runtime
