#include "runtime/prompt_queue.h"

#include <numeric>

#include "strategies/cost_model.h"
#include "strategies/model_config.h"

namespace dp::runtime {

PromptQueue::PromptQueue(const protocol::JobFile& job, const strategies::ModelInfo& model, const ParallelContext& parallel,
                         Communicator& world, const std::string& job_id)
    : dynamic_(job.schedule == "dynamic"), world_(world) {
    std::vector<std::size_t> order;
    if (dynamic_) {
        const strategies::CostRules rules = strategies::cost_rules(model.sizes, model.arguments);
        order = strategies::dynamic_order(strategies::prompt_costs(job.requests, rules));
    } else {
        share_ = strategies::split_between_processes(static_cast<int64_t>(job.requests.size()), parallel.replicas(),
                                                     parallel.replica());
        order.resize(static_cast<std::size_t>(share_.size()));
        std::iota(order.begin(), order.end(), static_cast<std::size_t>(share_.begin));
    }
    units_ = strategies::work_units(job.requests, strategies::grouped_by_adapters(job.requests, order), job.batch_size);
    leader_ = parallel.writes_outputs();
    alone_ = parallel.mesh().degrees().replica_size() == 1;
    const std::string prefix = "dp-schedule/" + (job_id.empty() ? job.job_id : job_id) + "/";
    counter_key_ = prefix + "claimed";
    turn_key_ = prefix + "replica/" + std::to_string(parallel.replica()) + "/turn/";
}

const std::vector<std::size_t>* PromptQueue::next() {
    if (!dynamic_) return next_static_ < units_.size() ? &units_[next_static_++] : nullptr;
    if (units_.empty()) return nullptr;
    // Note [dynamic schedule]: the leader claims, the replica's other ranks read its claim.
    const std::string turn = turn_key_ + std::to_string(turn_++);
    int64_t unit = 0;
    if (leader_) {
        unit = world_.store_add(counter_key_, 1) - 1;
        if (!alone_) world_.store_set(turn, std::to_string(unit));
    } else {
        unit = std::stoll(world_.store_get(turn));
    }
    return unit < static_cast<int64_t>(units_.size()) ? &units_[static_cast<std::size_t>(unit)] : nullptr;
}

}  // namespace dp::runtime
