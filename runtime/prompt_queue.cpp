#include "runtime/prompt_queue.h"

#include <numeric>

#include "strategies/cost_model.h"
#include "strategies/model_config.h"

namespace dp::runtime {

PromptQueue::PromptQueue(const protocol::JobFile& job, const strategies::ModelInfo& model,
                         const ParallelContext& parallel, Communicator& world, const std::string& job_id)
    : dynamic_(job.schedule == "dynamic"), world_(world) {
    std::vector<std::size_t> order;
    if (dynamic_) {
        const strategies::CostRules rules = strategies::cost_rules(model.sizes, model.arguments);
        order = strategies::dynamic_order(strategies::prompt_costs(job.requests, rules));
    } else {
        share_ = strategies::split_between_processes(static_cast<int64_t>(job.requests.size()),
                                                     parallel.replicas(), parallel.replica());
        order.resize(static_cast<std::size_t>(share_.size()));
        std::iota(order.begin(), order.end(), static_cast<std::size_t>(share_.begin));
    }
    units_ = strategies::work_units(job.requests, strategies::grouped_by_adapters(job.requests, order),
                                    job.batch_size);
    leader_ = parallel.writes_outputs();
    alone_ = parallel.mesh().degrees().replica_size() == 1;
    const std::string prefix = "dp-schedule/" + (job_id.empty() ? job.job_id : job_id) + "/";
    counter_key_ = prefix + "claimed";
    turn_key_ = prefix + "replica/" + std::to_string(parallel.replica()) + "/turn/";
    if (dynamic_) {
        const std::vector<std::size_t> request_sets = strategies::adapter_set_ids(job.requests);
        std::vector<std::size_t> unit_sets;
        for (const std::vector<std::size_t>& unit : units_) unit_sets.push_back(request_sets[unit.front()]);
        set_runs_ = strategies::adapter_set_runs(units_, unit_sets);
        used_up_.assign(set_runs_.size(), false);
        claiming_ = strategies::first_claim_set(parallel.replica(), set_runs_.size());
    }
}

std::size_t PromptQueue::claim() {
    // Note [claims by adapter set]: the current set's next unit, else the next set's.
    while (claiming_ < set_runs_.size()) {
        const strategies::Range& run = set_runs_[claiming_];
        const int64_t k = world_.store_add(counter_key_ + "/" + std::to_string(claiming_), 1) - 1;
        if (k < run.size()) return static_cast<std::size_t>(run.begin + k);
        used_up_[claiming_] = true;
        claiming_ = strategies::next_claim_set(claiming_, used_up_);
    }
    return units_.size();
}

const std::vector<std::size_t>* PromptQueue::next() {
    if (!dynamic_) return next_static_ < units_.size() ? &units_[next_static_++] : nullptr;
    if (units_.empty()) return nullptr;
    // Note [dynamic schedule]: the leader claims, the replica's other ranks read its claim.
    const std::string turn = turn_key_ + std::to_string(turn_++);
    int64_t unit = 0;
    if (leader_) {
        unit = static_cast<int64_t>(claim());
        if (!alone_) world_.store_set(turn, std::to_string(unit));
    } else {
        unit = std::stoll(world_.store_get(turn));
    }
    return unit < static_cast<int64_t>(units_.size()) ? &units_[static_cast<std::size_t>(unit)] : nullptr;
}

}  // namespace dp::runtime
