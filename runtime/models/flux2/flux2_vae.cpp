#include "runtime/models/flux2/flux2_vae.h"

#include <ATen/ATen.h>

#include "runtime/io/errors.h"

namespace dp::runtime {

at::Tensor patchify_latents(const at::Tensor& z) {
    const int64_t b = z.size(0), c = z.size(1), h = z.size(2) / 2, w = z.size(3) / 2;
    return z.view({b, c, h, 2, w, 2}).permute({0, 1, 3, 5, 2, 4}).reshape({b, 4 * c, h, w});
}

at::Tensor unpatchify_latents(const at::Tensor& z) {
    const int64_t b = z.size(0), c = z.size(1) / 4, h = z.size(2), w = z.size(3);
    return z.reshape({b, c, 2, 2, h, w}).permute({0, 1, 4, 2, 5, 3}).reshape({b, c, 2 * h, 2 * w});
}

at::Tensor pack_tokens(const at::Tensor& z) { return z.flatten(2).transpose(1, 2); }

at::Tensor unpack_tokens(const at::Tensor& tokens, int64_t h, int64_t w) {
    return tokens.transpose(1, 2).reshape({tokens.size(0), tokens.size(2), h, w});
}

Flux2LatentNorm Flux2LatentNorm::load(WeightStore& w, const VaeConfig& config) {
    if (!config.latent_batch_norm)
        throw ModelError(
            "FLUX.2's pipelines need AutoencoderKLFlux2 (its latents' batch-norm statistics); "
            "the VAE's config names another class");
    const int64_t channels = 4 * config.latent_channels;
    Flux2LatentNorm n;
    n.mean = w.take("bn.running_mean", {channels});
    n.std = at::sqrt(w.take("bn.running_var", {channels}) + config.batch_norm_eps);
    w.skip_prefix("bn.num_batches_tracked");
    return n;
}

at::Tensor Flux2LatentNorm::normalize(const at::Tensor& x) const {
    return (x - mean.view({1, -1, 1, 1})) / std.view({1, -1, 1, 1});
}

at::Tensor Flux2LatentNorm::denormalize(const at::Tensor& x) const {
    return x * std.view({1, -1, 1, 1}) + mean.view({1, -1, 1, 1});
}

Flux2VaeDecoder::Flux2VaeDecoder(const VaeConfig& config, WeightStore& w)
    : norm_(Flux2LatentNorm::load(w, config)), decoder_(config, w) {}

at::Tensor Flux2VaeDecoder::decode(const at::Tensor& latents) const {
    return decoder_.decode(unpatchify_latents(norm_.denormalize(latents)));
}

Flux2VaeEncoder::Flux2VaeEncoder(const VaeConfig& config, WeightStore& w)
    : norm_(Flux2LatentNorm::load(w, config)), encoder_(config, w) {}

at::Tensor Flux2VaeEncoder::mode(const at::Tensor& images) const { return encoder_.encode(images).mean; }

at::Tensor Flux2VaeEncoder::encode(const at::Tensor& images) const {
    return norm_.normalize(patchify_latents(mode(images)));
}

}  // namespace dp::runtime
