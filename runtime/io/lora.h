#pragma once
// LoRA adapter files as weight changes: each term of each adapter's layout (strategies/lora.h)
// read from its file as fp32 tensors on the CPU, with its factor (the adapter's scale times
// alpha / rank), grouped by component and base weight for WeightStore::set_deltas.

#include <map>
#include <memory>
#include <string>

#include "protocol/call_arguments.h"
#include "runtime/io/weights.h"
#include "strategies/lora.h"

namespace dp::runtime {

// Component -> the changes of its weights by `adapters`, in their order. Throws what
// strategies::read_lora_layout throws (a missing file, a file of another model, a shape that does
// not fit), and ModelError naming the file for unreadable tensors.
std::map<std::string, std::shared_ptr<const WeightDeltas>> load_lora_deltas(
    const protocol::Adapters& adapters, const strategies::ParallelSpec& spec,
    const strategies::ModelTensors& model);

}  // namespace dp::runtime
