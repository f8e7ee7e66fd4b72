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

}  // namespace dp::strategies
