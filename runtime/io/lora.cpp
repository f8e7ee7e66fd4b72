#include "runtime/io/lora.h"

#include <ATen/ATen.h>

#include <vector>

#include "runtime/io/safetensors.h"
#include "runtime/io/tensor_io.h"

namespace dp::runtime {

std::map<std::string, std::shared_ptr<const WeightDeltas>> load_lora_deltas(
    const protocol::Adapters& adapters, const strategies::ParallelSpec& spec,
    const strategies::ModelTensors& model) {
    std::map<std::string, WeightDeltas> by_component;
    for (const protocol::Adapter& adapter : adapters) {
        const strategies::LoraLayout layout = strategies::read_lora_layout(adapter.path, spec, model);
        const std::shared_ptr<SafetensorsFile> file = SafetensorsFile::open(adapter.path);
        for (const strategies::LoraTerm& term : layout.terms) {
            WeightDelta d;
            d.down = load_tensor(file, term.down, at::kFloat);
            at::Tensor up = load_tensor(file, term.up, at::kFloat);
            if (!term.up_rows.empty()) {
                std::vector<at::Tensor> parts;
                for (const auto& [first, count] : term.up_rows) parts.push_back(up.narrow(0, first, count));
                up = at::cat(parts, 0);
            }
            d.up = up.contiguous();
            d.factor = adapter.scale * term.alpha_scale;
            by_component[term.component][term.weight].push_back(std::move(d));
        }
    }
    std::map<std::string, std::shared_ptr<const WeightDeltas>> out;
    for (auto& [component, deltas] : by_component)
        out[component] = std::make_shared<const WeightDeltas>(std::move(deltas));
    return out;
}

}  // namespace dp::runtime
