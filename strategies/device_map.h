#pragma once
// Planning device_map: where each component (and, in `auto`, each transformer block) of a
// pipeline goes, given their sizes and each device's memory budget. A pure function, no
// LibTorch, tested without GPUs; the executor that moves activations between devices is not
// written yet.

#include <cstdint>
#include <string>
#include <vector>

namespace dp::strategies {

struct ComponentSize {
    std::string name;                  // "text_encoder", "transformer", "vae", ...
    int64_t bytes = 0;                 // weights, whole component
    std::vector<int64_t> block_bytes;  // transformer only: each block's share of `bytes`
};

struct DeviceBudget {
    std::string device;  // "cuda:0", or "cpu:0", "cpu:1" when testing on CPU explicitly
    int64_t bytes = 0;
};

enum class DeviceMapMode {
    kBalanced,  // whole components, each on the device with the most room left (diffusers' "balanced")
    kAuto,      // the transformer's blocks split in order across devices; other components whole
};

struct Placement {
    std::string component;
    int block = -1;  // -1: the whole component; else one transformer block
    std::string device;
    int64_t bytes = 0;
};

struct DeviceMapPlan {
    std::vector<Placement> placements;
    std::vector<int64_t> used;  // per budget, in the order given
};

// Throws std::invalid_argument naming the component that does not fit, the room left on each
// device, and what would help (more devices, larger budgets, `auto` for a large transformer).
DeviceMapPlan plan_device_map(const std::vector<ComponentSize>& components,
                              const std::vector<DeviceBudget>& budgets, DeviceMapMode mode);

}  // namespace dp::strategies
