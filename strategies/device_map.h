#pragma once
// Planning device_map: where each component (and, in `auto`, each transformer block) of a
// pipeline goes, given their sizes and each device's memory budget. A pure function, no
// LibTorch, tested without GPUs. The executor (runtime/parallel/device_mapping.h) loads each part on its
// device and moves the activations between them.

#include <cstdint>
#include <string>
#include <vector>

#include "protocol/job_layout.h"

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

// The plan, defined once in the protocol the job file carries it in.
using Placement = protocol::DevicePlacement;
using DeviceMapPlan = protocol::DeviceMapPlan;

// Throws std::invalid_argument naming the component that does not fit, the room left on each
// device, and what would help (more devices, larger budgets, `auto` for a large transformer).
DeviceMapPlan plan_device_map(const std::vector<ComponentSize>& components,
                              const std::vector<DeviceBudget>& budgets, DeviceMapMode mode);

// A device as written by a user: "cuda:N", "cpu:N" (a CPU "device", for trying device_map without
// GPUs), "cpu" (cpu:0) or a bare N (cuda:N, as diffusers and accelerate take it). Returns the
// canonical "kind:N"; throws std::invalid_argument saying what is accepted.
std::string canonical_device(const std::string& text);

// accelerate's max_memory as text: "cuda:0=20GiB,cuda:1=20GiB" or "cpu:0=64MB,cpu:1=64MB". A size
// is a whole number of bytes or a number with B, KB, MB, GB, TB (powers of 1000) or KiB, MiB,
// GiB, TiB. Throws std::invalid_argument naming the entry that is wrong.
std::vector<DeviceBudget> parse_max_memory(const std::string& text);

// A device map written by hand (--device-map FILE.json), diffusers' hf_device_map style:
//   {"text_encoder": "cuda:0", "text_encoder_2": 0, "vae": "cuda:0", "transformer": "cuda:1"}
// where "transformer" may instead list one device per block (its embeddings and output head go
// with block 0). Every one of `components` must be placed and nothing else named; at least two
// devices must be used. Throws std::invalid_argument prefixed with `source`.
DeviceMapPlan device_map_from_json(const std::string& json_text, const std::vector<ComponentSize>& components,
                                   const std::string& source);

// One line per component (transformer blocks grouped into runs on one device) and the bytes per
// device, for `dp-launch plan` and the worker's log.
std::string describe_device_map(const DeviceMapPlan& plan);

}  // namespace dp::strategies
