#pragma once
// Note [adapter switches]: a replica runs one set of LoRA adapters at a time. Its components are
// built with the set's changes of their weights (WeightStore::set_deltas, before any shard is
// taken), from base weights that are never written: they stay mmapped, or are read again from
// their files. When a batch asks for another set, the components that the old or the new set
// changes are built again from the base, so that no switch leaves a trace on the next (no drift:
// a weight is never "unmerged"), and the others are kept. The queue batches only prompts of the
// same set and prefers, for a replica, prompts of its current one (strategies' cost model counts
// each switch).

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "protocol/call_arguments.h"
#include "runtime/io/weights.h"
#include "strategies/lora.h"

namespace dp::runtime {

class AdapterState {
  public:
    // The changes of `component`'s weights by the current set; nullptr when it changes none.
    std::shared_ptr<const WeightDeltas> deltas(const std::string& component) const;
    const protocol::Adapters& current() const { return current_; }
    // How to build `component` again (component_of registers each component it makes).
    void add_component(const std::string& component, std::function<void()> rebuild);
    // Makes `adapters` the current set for the model of `spec` in `model_dir` (its `variant`'s
    // weights, whose shapes are read once): reads their files and builds again every component
    // the old or the new set changes. Returns those components (none when the set is the current
    // one). Throws what load_lora_deltas throws, before anything is rebuilt.
    std::vector<std::string> apply(const protocol::Adapters& adapters, const strategies::ParallelSpec& spec,
                                   const std::string& model_dir, const std::string& variant);

  private:
    protocol::Adapters current_;
    std::shared_ptr<const strategies::ModelTensors> model_;
    std::map<std::string, std::shared_ptr<const WeightDeltas>> deltas_;
    std::vector<std::pair<std::string, std::function<void()>>> rebuild_;
};

}  // namespace dp::runtime
