#include "runtime/parallel/guidance.h"

#include <ATen/ATen.h>

#include "runtime/parallel/communicator.h"

namespace dp::runtime {

Guidance::Guidance(bool enabled, Communicator* cfg_group)
    : enabled_(enabled), group_(enabled && cfg_group && cfg_group->size() == 2 ? cfg_group : nullptr) {}

bool Guidance::runs_negative_only() const { return group_ && group_->rank() == 0; }

at::Tensor Guidance::model_input(const at::Tensor& latents) const {
    return enabled_ && !group_ ? at::cat({latents, latents}, 0) : latents;
}

at::Tensor Guidance::combine(const at::Tensor& noise, const Combine& rule) const {
    if (!enabled_) return noise;
    if (group_) {
        const std::vector<at::Tensor> parts = group_->all_gather(noise.contiguous());  // [negative, positive]
        return rule(parts[0], parts[1]);
    }
    const std::vector<at::Tensor> parts = noise.chunk(2, 0);
    return rule(parts[0], parts[1]);
}

at::Tensor linear_guidance(const at::Tensor& negative, const at::Tensor& positive, double scale) {
    return negative + scale * (positive - negative);
}

}  // namespace dp::runtime
