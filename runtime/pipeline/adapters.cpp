#include "runtime/pipeline/adapters.h"

#include <set>

#include "runtime/io/lora.h"

namespace dp::runtime {

std::shared_ptr<const WeightDeltas> AdapterState::deltas(const std::string& component) const {
    const auto it = deltas_.find(component);
    return it == deltas_.end() ? nullptr : it->second;
}

void AdapterState::add_component(const std::string& component, Switcher switcher) {
    switchers_.emplace_back(component, std::move(switcher));
}

AdapterState::Report AdapterState::apply(const protocol::Adapters& adapters,
                                         const strategies::ParallelSpec& spec, const std::string& model_dir,
                                         const std::string& variant) {
    // The same files at the same scales are the same set (the launcher fills in each file's hash).
    const auto same = [](const protocol::Adapters& a, const protocol::Adapters& b) {
        if (a.size() != b.size()) return false;
        for (std::size_t i = 0; i < a.size(); ++i)
            if (a[i].path != b[i].path || a[i].scale != b[i].scale) return false;
        return true;
    };
    if (same(adapters, current_)) return {};
    if (!model_)
        model_ = std::make_shared<const strategies::ModelTensors>(
            strategies::adapter_targets(model_dir, spec, variant));
    std::map<std::string, std::shared_ptr<const WeightDeltas>> next =
        load_lora_deltas(adapters, spec, *model_);
    // Each component's weights that the old or the new set changes.
    std::map<std::string, std::set<std::string>> touched;
    for (const auto* set : {&deltas_, &next})
        for (const auto& [component, d] : *set)
            for (const auto& [weight, terms] : *d) touched[component].insert(weight);
    deltas_ = std::move(next);
    current_ = adapters;
    Report report;
    for (const auto& [component, switcher] : switchers_) {
        const auto it = touched.find(component);
        if (it == touched.end()) continue;
        const Switched how = switcher(deltas(component), it->second);
        report.components[component] = how;
        if (how == Switched::kInPlace) report.weights += it->second.size();
    }
    return report;
}

}  // namespace dp::runtime
