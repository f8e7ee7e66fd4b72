#include "runtime/pipeline/adapters.h"

#include <set>

#include "runtime/io/lora.h"

namespace dp::runtime {

std::shared_ptr<const WeightDeltas> AdapterState::deltas(const std::string& component) const {
    const auto it = deltas_.find(component);
    return it == deltas_.end() ? nullptr : it->second;
}

void AdapterState::add_component(const std::string& component, std::function<void()> rebuild) {
    rebuild_.emplace_back(component, std::move(rebuild));
}

std::vector<std::string> AdapterState::apply(const protocol::Adapters& adapters, const strategies::ParallelSpec& spec,
                                             const std::string& model_dir, const std::string& variant) {
    // The same files at the same scales are the same set (the launcher fills in each file's hash).
    const auto same = [](const protocol::Adapters& a, const protocol::Adapters& b) {
        if (a.size() != b.size()) return false;
        for (std::size_t i = 0; i < a.size(); ++i)
            if (a[i].path != b[i].path || a[i].scale != b[i].scale) return false;
        return true;
    };
    if (same(adapters, current_)) return {};
    if (!model_) model_ = std::make_shared<const strategies::ModelTensors>(strategies::adapter_targets(model_dir, spec, variant));
    std::map<std::string, std::shared_ptr<const WeightDeltas>> next = load_lora_deltas(adapters, spec, *model_);
    std::set<std::string> touched;
    for (const auto& [component, d] : deltas_) touched.insert(component);
    for (const auto& [component, d] : next) touched.insert(component);
    deltas_ = std::move(next);
    current_ = adapters;
    for (const auto& [component, rebuild] : rebuild_)
        if (touched.count(component)) rebuild();
    return {touched.begin(), touched.end()};
}

}  // namespace dp::runtime
