#pragma once
// Note [encoder on first use]: a family's VAE encoder (vae_encoder.h) is built the first time an
// edit needs it (Note [img2img in the one loop]), from the same `vae` folder and with the same salt
// as its decoder (so that seeded random weights are one VAE), and then kept, or built at each use
// with offload, as any component; a job of text-to-image lines never reads its weights.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>

#include "runtime/models/common/vae_encoder.h"
#include "runtime/pipeline/pipeline_common.h"

namespace dp::runtime {

template <class Encoder, class Config>
class EncoderOnFirstUse {
  public:
    // `options` and `config` must outlive it (a family's components hold all three).
    EncoderOnFirstUse(const PipelineOptions* options, const Config* config, uint64_t salt)
        : options_(options), config_(config), salt_(salt) {}

    // The latent distribution of `pixels` ([B, 3, H, W] in [-1, 1]), unscaled.
    LatentDistribution encode(const at::Tensor& pixels) const {
        if (!encoder_) {
            const Config* config = config_;
            encoder_ = component_of<Encoder>(
                options_, "vae", salt_, device_of(*options_, "vae"),
                [config](WeightStore& w) { return std::make_unique<Encoder>(*config, w); });
        }
        return encoder_->use()->encode(pixels);
    }

  private:
    const PipelineOptions* options_;
    const Config* config_;
    uint64_t salt_;
    mutable std::optional<Component<Encoder>> encoder_;
};

}  // namespace dp::runtime
