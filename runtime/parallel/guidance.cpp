#include "runtime/parallel/guidance.h"

#include <ATen/ATen.h>

#include "runtime/io/errors.h"
#include "runtime/parallel/communicator.h"

namespace dp::runtime {

Guidance::Guidance(bool enabled, Communicator* cfg_group)
    : enabled_(enabled), group_(enabled && cfg_group && cfg_group->size() == 2 ? cfg_group : nullptr) {}

bool Guidance::runs_negative_only() const { return group_ && group_->rank() == 0; }

at::Tensor Guidance::model_input(const at::Tensor& latents) const {
    return enabled_ && !group_ ? at::cat({latents, latents}, 0) : latents;
}

at::Tensor Guidance::predict(int64_t rows, bool on_cpu, const Model& model) const {
    if (!enabled_ || group_ || !on_cpu) return model(0, rows);
    const int64_t half = rows / 2;  // [negative; positive]
    return at::cat({model(0, half), model(half, rows - half)}, 0);
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

at::Tensor Guidance::combine(const at::Tensor& noise, const at::Tensor& extra, const Combine3& rule) const {
    if (!enabled_) throw InternalError("Guidance: a third prediction needs the guidance branches");
    if (group_) {
        // The negative rank sends zeros in the extra's place, so that both send the same shape.
        const at::Tensor mine =
            at::cat({noise, runs_negative_only() ? at::zeros_like(noise) : extra}, 0).contiguous();
        const std::vector<at::Tensor> parts = group_->all_gather(mine);
        const int64_t n = noise.size(0);
        return rule(parts[0].narrow(0, 0, n), parts[1].narrow(0, 0, n), parts[1].narrow(0, n, n));
    }
    if (!extra.defined()) throw InternalError("Guidance: the third prediction is missing");
    const std::vector<at::Tensor> parts = noise.chunk(2, 0);
    return rule(parts[0], parts[1], extra);
}

at::Tensor linear_guidance(const at::Tensor& negative, const at::Tensor& positive, double scale) {
    return negative + scale * (positive - negative);
}

}  // namespace dp::runtime
