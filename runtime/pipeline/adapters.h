#pragma once
// Note [adapter switches]: a replica runs one set of LoRA adapters at a time. Its components are
// built with the set's changes of their weights (WeightStore::set_deltas, before any shard is
// taken), from base weights that are never written: they stay mmapped, or are read again from
// their files. When a batch asks for another set, each weight that the old or the new set changes
// is made again from its base (Note [adapter switches in place], runtime/io/weights.h), so that no
// switch leaves a trace on the next (no drift: a weight is never "unmerged"); every other tensor is
// kept. A component whose module does not hold such a weight as it was taken (a fused copy) is
// built again whole, and with offload the next use builds it anyway. The queue batches only
// prompts of the same set and a replica claims the next unit of its current set first
// (strategies::SetClaims); strategies' cost model counts each switch.

#include <functional>
#include <map>
#include <memory>
#include <set>
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
    // What a switch did to one component.
    enum class Switched { kInPlace, kRebuilt, kAtNextUse };
    // Switches `component` to `deltas` for the weights `names` (component_of registers each
    // component it makes).
    using Switcher = std::function<Switched(std::shared_ptr<const WeightDeltas> deltas,
                                            const std::set<std::string>& names)>;
    void add_component(const std::string& component, Switcher switcher);

    struct Report {
        std::map<std::string, Switched> components;  // each component the old or the new set changes
        std::size_t weights = 0;                     // the weights made again in place
    };
    // Makes `adapters` the current set for the model of `spec` in `model_dir` (its `variant`'s
    // weights, whose shapes are read once): reads their files and switches every component the old
    // or the new set changes. An empty report when the set is the current one. Throws what
    // load_lora_deltas throws, before anything is changed.
    Report apply(const protocol::Adapters& adapters, const strategies::ParallelSpec& spec,
                 const std::string& model_dir, const std::string& variant);

  private:
    protocol::Adapters current_;
    std::shared_ptr<const strategies::ModelTensors> model_;
    std::map<std::string, std::shared_ptr<const WeightDeltas>> deltas_;
    std::vector<std::pair<std::string, Switcher>> switchers_;
};

}  // namespace dp::runtime
