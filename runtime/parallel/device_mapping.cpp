#include "runtime/parallel/device_mapping.h"

#include <ATen/Context.h>

#include <algorithm>

#include "runtime/io/errors.h"
#include "runtime/parallel/cuda_support.h"

namespace dp::runtime {

at::Device DeviceMapping::device_for(const std::string& label) {
    const std::size_t colon = label.find(':');
    const std::string kind = label.substr(0, colon);
    const int index = colon == std::string::npos ? 0 : std::stoi(label.substr(colon + 1));
    if (kind == "cpu") return at::Device(at::kCPU);
    const int gpus = cuda_available() ? static_cast<int>(at::getNumGPUs()) : 0;
    if (kind != "cuda" || index >= gpus)
        throw Error("device_map: " + label + " is not available here (" + std::to_string(gpus) +
                        " CUDA device(s) visible; CPU \"devices\" cpu:N are always available)",
                    2);
    return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
}

std::shared_ptr<DeviceMapping> DeviceMapping::from_plan(const strategies::DeviceMapPlan& plan,
                                                        const strategies::ParallelSpec& spec,
                                                        std::size_t blocks) {
    auto mapping = std::make_shared<DeviceMapping>();
    DeviceMapping& m = *mapping;
    m.labels = plan.devices;
    for (const std::string& label : plan.devices) m.devices.push_back(device_for(label));
    auto slot = [&](const std::string& label) {
        return static_cast<int>(std::find(plan.devices.begin(), plan.devices.end(), label) -
                                plan.devices.begin());
    };
    for (const strategies::Placement& p : plan.placements) {
        if (p.component != spec.transformer) {
            m.components[p.component] = slot(p.device);
        } else if (p.block < 0) {  // whole: every block on one device
            m.transformer_blocks.assign(blocks, slot(p.device));
        } else {
            if (m.transformer_blocks.size() <= static_cast<std::size_t>(p.block))
                m.transformer_blocks.resize(static_cast<std::size_t>(p.block) + 1, 0);
            m.transformer_blocks[static_cast<std::size_t>(p.block)] = slot(p.device);
        }
    }
    return mapping;
}

int DeviceMapping::slot_of(const std::string& component) const {
    const auto it = components.find(component);
    if (it != components.end()) return it->second;
    return transformer_blocks.empty() ? 0 : transformer_blocks.front();
}

at::Tensor DeviceMapping::move(const at::Tensor& t, int from, int to) const {
    if (from == to || !t.defined()) return t;
    moved_bytes_ += static_cast<uint64_t>(t.numel()) * t.element_size();
    ++moves_;
    return t.to(devices[static_cast<std::size_t>(to)]);
}

std::vector<std::pair<std::string, int64_t>> DeviceMapping::visible_gpu_budgets() {
    std::vector<std::pair<std::string, int64_t>> out;
    if (!cuda_available() || !cuda_plugin()->device_memory) return out;
    for (int i = 0; i < static_cast<int>(at::getNumGPUs()); ++i)
        out.emplace_back("cuda:" + std::to_string(i), cuda_plugin()->device_memory(i) / 10 * 9);
    return out;
}

}  // namespace dp::runtime
