#include "runtime/pipeline/step_cache.h"

#include <ATen/ATen.h>

#include "runtime/parallel/communicator.h"
#include "runtime/parallel/sequence_shard.h"

namespace dp::runtime {

FirstBlockCache::FirstBlockCache(double threshold, std::vector<Group> groups, Communicator* tensor_group)
    : threshold_(threshold), groups_(std::move(groups)), tensor_group_(tensor_group) {}

at::Tensor FirstBlockCache::run(at::Tensor before, at::Tensor after, const SequenceShard& image,
                                const std::function<at::Tensor(const at::Tensor&)>& rest) {
    const at::Tensor residual = after - before;
    const std::size_t n = groups_.size();
    // Note [first block cache]: each group's two sums over the whole sequence, in one reduction.
    std::vector<at::Tensor> per_token;
    for (const Group& g : groups_) {
        const at::Tensor prev = g.state->residual;
        if (!prev.defined()) {
            per_token.push_back(at::zeros({2, residual.size(1)}, residual.options().dtype(at::kFloat)));
            continue;
        }
        const at::Tensor mine = residual.narrow(0, g.first, g.rows);
        per_token.push_back(at::stack({(mine - prev).abs().to(at::kFloat).sum({0, 2}),
                                       prev.abs().to(at::kFloat).sum({0, 2})}));
    }
    const at::Tensor sums = image.sum_tokens(at::cat(per_token, 0)).cpu();
    const double elements = static_cast<double>(image.tokens()) * static_cast<double>(residual.size(2));
    at::Tensor compute = at::zeros({static_cast<int64_t>(n)}, at::kFloat);
    std::vector<double> metrics(n, -1);
    for (std::size_t k = 0; k < n; ++k) {
        const Group& g = groups_[k];
        if (!g.state->residual.defined()) {
            compute[static_cast<int64_t>(k)] = 1;
            continue;
        }
        // The means in the run's dtype, divided in it, as diffusers' 0-d tensors are.
        const double count = elements * static_cast<double>(g.rows);
        const at::Tensor changed = at::scalar_tensor(sums[static_cast<int64_t>(2 * k)].item<double>() / count,
                                                     at::TensorOptions().dtype(at::kFloat)).to(residual.scalar_type());
        const at::Tensor last = at::scalar_tensor(sums[static_cast<int64_t>(2 * k + 1)].item<double>() / count,
                                                  at::TensorOptions().dtype(at::kFloat)).to(residual.scalar_type());
        metrics[k] = (changed / last).item<double>();
        if (metrics[k] > threshold_) compute[static_cast<int64_t>(k)] = 1;
    }
    // One decision per group on every rank of the tensor group (their streams are the same values).
    if (tensor_group_ && tensor_group_->size() > 1) {
        at::Tensor agreed = compute.to(residual.device());
        tensor_group_->all_reduce(agreed);
        compute = agreed.cpu();
    }
    bool any = false;
    std::vector<bool> decided(n);
    for (std::size_t k = 0; k < n; ++k) {
        decided[k] = compute[static_cast<int64_t>(k)].item<float>() > 0;
        any = any || decided[k];
        FirstBlockState& s = *groups_[k].state;
        s.metrics.push_back(metrics[k]);
        s.decisions.push_back(decided[k]);
    }
    const auto reused = [&](const Group& g) { return after.narrow(0, g.first, g.rows) + g.state->rest; };
    if (!any) {
        std::vector<at::Tensor> rows;
        for (const Group& g : groups_) rows.push_back(reused(g));
        return n == 1 ? rows.front() : at::cat(rows, 0);
    }
    at::Tensor out = rest(after);
    const at::Tensor added = out.to(after.device()) - after;  // on the first block's device
    for (std::size_t k = 0; k < n; ++k) {
        const Group& g = groups_[k];
        FirstBlockState& s = *g.state;
        if (decided[k]) {
            s.residual = residual.narrow(0, g.first, g.rows);
            s.rest = added.narrow(0, g.first, g.rows);
            ++s.computed;
        } else {
            out.narrow(0, g.first, g.rows).copy_(reused(g).to(out.device()));
        }
    }
    return out;
}

}  // namespace dp::runtime
