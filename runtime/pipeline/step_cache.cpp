#include "runtime/pipeline/step_cache.h"

#include <ATen/ATen.h>

#include <cmath>

#include "runtime/io/errors.h"
#include "runtime/parallel/communicator.h"
#include "runtime/parallel/guidance.h"
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
        per_token.push_back(at::stack(
            {(mine - prev).abs().to(at::kFloat).sum({0, 2}), prev.abs().to(at::kFloat).sum({0, 2})}));
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
                                                     at::TensorOptions().dtype(at::kFloat))
                                       .to(residual.scalar_type());
        const at::Tensor last =
            at::scalar_tensor(sums[static_cast<int64_t>(2 * k + 1)].item<double>() / count,
                              at::TensorOptions().dtype(at::kFloat))
                .to(residual.scalar_type());
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

StepCacheRun::StepCacheRun(const protocol::StepCache& setting, const Guidance& guidance, int64_t batch,
                           int64_t steps, Communicator* tensor_group)
    : setting_(setting),
      guidance_(guidance),
      batch_(batch),
      steps_(steps),
      tensor_group_(tensor_group),
      mag_ratios_(setting.mag() ? setting.mag_ratios_for(steps) : std::vector<float>{}) {}

std::vector<StepCacheRun::BranchRows> StepCacheRun::branches(int64_t first, int64_t count) const {
    if (guidance_.split() || !guidance_.enabled())
        return {{guidance_.runs_negative_only() ? 0 : 1, 0, count}};
    std::vector<BranchRows> out;
    for (int branch = 0; branch < 2; ++branch) {  // batched: the negatives' rows first
        const int64_t lo = std::max(first, branch * batch_),
                      hi = std::min(first + count, (branch + 1) * batch_);
        if (lo < hi) out.push_back({branch, lo - first, hi - lo});
    }
    return out;
}

at::Tensor StepCacheRun::call(int64_t first, int64_t count,
                              const std::function<at::Tensor(const StepCaches&)>& predict) {
    StepCaches caches;
    const std::vector<BranchRows> rows = branches(first, count);
    if (setting_.first_block()) {
        std::vector<FirstBlockCache::Group> groups;
        for (const BranchRows& b : rows) groups.push_back({&branch_[b.branch], b.first, b.rows});
        FirstBlockCache cache(setting_.threshold, std::move(groups), tensor_group_);
        caches.first_block = &cache;
        return predict(caches);
    }
    if (setting_.taylorseer()) {
        TaylorSeerCache cache(setting_, taylorseer_[first], static_cast<int>(rows.size()));
        caches.taylorseer = &cache;
        return predict(caches);
    }
    if (setting_.mag()) {
        std::vector<MagCache::Group> groups;
        for (const BranchRows& b : rows) groups.push_back({&mag_[b.branch], b.first, b.rows});
        MagCache cache(setting_, mag_ratios_, steps_, std::move(groups));
        caches.mag = &cache;
        return predict(caches);
    }
    return predict(caches);
}

int64_t StepCacheRun::computed(Communicator* cfg_group, const at::Device& device) const {
    if (!setting_.enabled()) return -1;
    int64_t mine = branch_[0].computed + branch_[1].computed + mag_[0].computed + mag_[1].computed;
    for (const auto& [first, state] : taylorseer_) mine += state.computed;
    if (!guidance_.split()) return mine;
    at::Tensor both = at::tensor({mine}, at::kLong).to(device);
    cfg_group->all_reduce(both);
    return both.cpu().item<int64_t>();
}

std::vector<std::vector<double>> StepCacheRun::metrics() const {
    if (!setting_.first_block()) return {};
    return {branch_[0].metrics, branch_[1].metrics};
}

std::vector<double> StepCacheRun::mag_ratios(Communicator* cfg_group, const at::Device& device) const {
    if (!setting_.mag() || !setting_.calibrate) return {};
    std::vector<double> mine = mag_[1].calibration;
    if (!guidance_.split()) return mine;
    // The positive branch's rank gives its ratios; the other adds zeros.
    const auto n = static_cast<int64_t>(std::max(mag_[0].calibration.size(), mag_[1].calibration.size()));
    at::Tensor both = at::zeros({n}, at::kDouble);
    for (std::size_t i = 0; i < mine.size(); ++i) both[static_cast<int64_t>(i)] = mine[i];
    both = both.to(device);
    cfg_group->all_reduce(both);
    both = both.cpu();
    return std::vector<double>(both.data_ptr<double>(), both.data_ptr<double>() + n);
}

MagCache::MagCache(const protocol::StepCache& config, const std::vector<float>& ratios, int64_t steps,
                   std::vector<Group> groups)
    : config_(config), ratios_(ratios), steps_(steps), groups_(std::move(groups)) {}

bool MagCache::computes(MagCacheState& s) const {
    if (config_.calibrate) return true;
    // Note [mag cache]: Python's int(retention_ratio * steps + 0.5); the accumulators in float32.
    const auto retention = static_cast<int64_t>(config_.retention_ratio * static_cast<double>(steps_) + 0.5);
    if (s.pass < retention) return true;
    const float scale =
        s.pass < static_cast<int64_t>(ratios_.size()) ? ratios_[static_cast<std::size_t>(s.pass)] : 1.0f;
    s.ratio = s.ratio * scale;
    s.accumulated += 1;
    s.error = s.error + std::fabs(1.0f - s.ratio);
    if (s.residual.defined() && s.error <= static_cast<float>(config_.threshold) &&
        s.accumulated <= config_.max_skip_steps)
        return false;
    s.ratio = 1;
    s.accumulated = 0;
    s.error = 0;
    return true;
}

at::Tensor MagCache::run(at::Tensor before, const SequenceShard& image,
                         const std::function<at::Tensor(const at::Tensor&)>& blocks) {
    const std::size_t n = groups_.size();
    std::vector<bool> decided(n);
    bool any = false;
    for (std::size_t k = 0; k < n; ++k) {
        decided[k] = computes(*groups_[k].state);
        any = any || decided[k];
    }
    const auto reused = [&](const Group& g) { return before.narrow(0, g.first, g.rows) + g.state->residual; };
    at::Tensor out;
    if (!any) {
        std::vector<at::Tensor> rows;
        for (const Group& g : groups_) rows.push_back(reused(g));
        out = n == 1 ? rows.front() : at::cat(rows, 0);
    } else {
        out = blocks(before);
        const at::Tensor residual = out.to(before.device()) - before;
        for (std::size_t k = 0; k < n; ++k) {
            const Group& g = groups_[k];
            MagCacheState& s = *g.state;
            if (!decided[k]) {
                out.narrow(0, g.first, g.rows).copy_(reused(g).to(out.device()));
                continue;
            }
            const at::Tensor mine = residual.narrow(0, g.first, g.rows);
            if (config_.calibrate) {
                double ratio = 1;
                if (s.residual.defined()) {
                    // Note [mag cache]: the per-token ratio of norms, summed over the rows and the sequence.
                    const at::Tensor now = at::linalg_vector_norm(mine.to(at::kFloat), 2, {-1});
                    const at::Tensor last = at::linalg_vector_norm(s.residual.to(at::kFloat), 2, {-1});
                    const at::Tensor per_token = (now / (last + 1e-8)).sum(0, /*keepdim=*/true);
                    const double elements = static_cast<double>(image.tokens()) * static_cast<double>(g.rows);
                    ratio = image.sum_tokens(per_token).cpu()[0].item<double>() / elements;
                }
                s.calibration.push_back(ratio);
            }
            s.residual = mine;
            ++s.computed;
        }
    }
    for (const Group& g : groups_) ++g.state->pass;
    return out;
}

TaylorSeerCache::TaylorSeerCache(const protocol::StepCache& config, TaylorSeerState& state, int branches)
    : config_(config), state_(state) {
    ++state_.pass;
    computes_ = config_.computes(state_.pass);
    if (computes_) state_.computed += branches;
}

std::vector<at::Tensor> TaylorSeerCache::predict(int64_t id) const {
    const auto it = state_.attentions.find(id);
    if (it == state_.attentions.end() || it->second.last < 0)
        throw InternalError("TaylorSeer: attention " + std::to_string(id) +
                            " has no factors to extrapolate from");
    const TaylorSeerState::Attention& a = it->second;
    const double offset = static_cast<double>(state_.pass - a.last);
    std::vector<at::Tensor> outputs;
    for (std::size_t i = 0; i < a.factors.size(); ++i) {
        // As diffusers sums it: zeros, then each order's factor in the output's dtype times offset^n / n!.
        at::Tensor out = at::zeros_like(a.factors[i][0], a.factors[i][0].options().dtype(a.dtypes[i]));
        double factorial = 1;
        for (std::size_t order = 0; order < a.factors[i].size(); ++order) {
            if (order > 0) factorial *= static_cast<double>(order);
            out = out + a.factors[i][order].to(a.dtypes[i]) *
                            (std::pow(offset, static_cast<double>(order)) / factorial);
        }
        outputs.push_back(out);
    }
    return outputs;
}

void TaylorSeerCache::update(int64_t id, const std::vector<at::Tensor>& outputs) {
    TaylorSeerState::Attention& a = state_.attentions[id];
    const at::ScalarType stored = config_.float32_factors ? at::kFloat : at::kBFloat16;
    std::vector<std::vector<at::Tensor>> factors;
    for (std::size_t i = 0; i < outputs.size(); ++i) {
        std::vector<at::Tensor> next = {outputs[i]};
        if (a.last >= 0 && i < a.factors.size()) {
            // Divided differences against the kept (rounded) factors, up to max_order.
            const double delta = static_cast<double>(state_.pass - a.last);
            for (int64_t j = 0; j < config_.max_order; ++j) {
                if (static_cast<std::size_t>(j) >= a.factors[i].size()) break;
                const at::Tensor& prev = a.factors[i][static_cast<std::size_t>(j)];
                if (!prev.sizes().equals(next.back().sizes())) break;
                next.push_back((next.back() - prev.to(outputs[i].scalar_type())) / delta);
            }
        }
        for (at::Tensor& f : next) f = f.to(stored);
        factors.push_back(std::move(next));
    }
    a.factors = std::move(factors);
    a.dtypes.clear();
    for (const at::Tensor& t : outputs) a.dtypes.push_back(t.scalar_type());
    a.last = state_.pass;
}

}  // namespace dp::runtime
