#pragma once
// What a diffusers model folder weighs, read from its safetensors headers alone (no LibTorch, no
// weights loaded): element counts per tensor, and the sizes device_map plans with.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "strategies/device_map.h"

namespace dp::strategies {

// Tensor name -> element count over every *.safetensors file of `dir`. Throws std::runtime_error
// naming the file when there is none, or a header is unreadable or malformed.
std::map<std::string, int64_t> safetensors_element_counts(const std::string& dir);

// The components an SD3 pipeline places (text_encoder, text_encoder_2, transformer with one entry
// per block in `block_bytes`, and vae when the model has one), at `element_bytes` per element
// (the run's dtype: weights are converted when loaded).
std::vector<ComponentSize> pipeline_component_sizes(const std::string& model_dir, int64_t element_bytes);

// device_map's plan for a model from the user's spec: `device_map` is balanced, auto or a FILE.json
// (diffusers' hf_device_map style); balanced and auto take their budgets from `max_memory`
// (DEV=SIZE,...) or, when it is empty, `default_budgets` (the visible GPUs). Throws
// std::invalid_argument (or std::runtime_error for unreadable weights) saying what is wrong.
DeviceMapPlan plan_device_map_spec(const std::string& model_dir, int64_t element_bytes,
                                   const std::string& device_map, const std::string& max_memory,
                                   const std::vector<DeviceBudget>& default_budgets);

}  // namespace dp::strategies
