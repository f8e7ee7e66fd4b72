#pragma once
// What a diffusers model folder weighs, read from its safetensors headers alone (no LibTorch, no
// weights loaded), or from the tensor manifests of a config-only folder: element counts per
// tensor, and the sizes device_map plans with.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "strategies/device_map.h"
#include "strategies/parallel_spec.h"

namespace dp::strategies {

// Tensor name -> element count over the safetensors files of component folder `dir` that hold
// `variant`'s weights (find_component_weights: one file, or an index's shards). Throws
// std::runtime_error (protocol::ModelError) naming the folder or file when there are none, or a
// header or index is unreadable or malformed.
std::map<std::string, int64_t> safetensors_element_counts(const std::string& dir,
                                                          const std::string& variant = "");

// A config-only folder of a real model (no weights) lists each component's tensors in this file,
// laid out as a safetensors header without data offsets (scripts/models/make_config_folders.py).
inline constexpr const char* kTensorManifest = "tensors.json";

// Tensor name -> element count of one component folder: its safetensors headers (`variant`'s), or,
// when it has no *.safetensors, its tensors.json manifest. Throws std::runtime_error naming the
// folder when it has neither, or the file that is unreadable or malformed.
std::map<std::string, int64_t> tensor_element_counts(const std::string& dir, const std::string& variant = "");
// The same tensors' shapes.
std::map<std::string, std::vector<int64_t>> tensor_shapes(const std::string& dir,
                                                          const std::string& variant = "");

// The components `spec` places whose folder has a tensors.json manifest and no *.safetensors:
// configs only, which a job runs only with random weights. Empty for a folder with weights.
std::vector<std::string> components_without_weights(const std::string& model_dir, const ParallelSpec& spec);

// The components `spec` places, in its order (the transformer with one entry per block of its
// block prefixes in `block_bytes`, in prefix order; an optional component only when the folder has
// it), at `element_bytes` per element (the run's dtype: weights are converted when loaded), without
// the tensors the pipeline never loads; from `variant`'s weight files. `left_out`: components the
// job does not load (the T5 encoder under --no-t5).
std::vector<ComponentSize> pipeline_component_sizes(const std::string& model_dir, const ParallelSpec& spec,
                                                    int64_t element_bytes, const std::string& variant = "",
                                                    const std::vector<std::string>& left_out = {});
// The components of `spec` a job on `model_dir` does not load: the T5 encoder under --no-t5
// (`no_t5`), or when model_index.json names none (its folder may still be there).
std::vector<std::string> components_left_out(const std::string& model_dir, const ParallelSpec& spec,
                                             bool no_t5);

// device_map's plan for a model (its family's `spec`, from its ModelInfo) from the user's spec: `device_map`
// is balanced, auto or a FILE.json (diffusers' hf_device_map style); balanced and auto take their budgets
// from `max_memory` (DEV=SIZE,...) or, when it is empty, `default_budgets` (the visible GPUs). Throws
// std::invalid_argument (or std::runtime_error for unreadable weights or model_index.json) saying
// what is wrong.
DeviceMapPlan plan_device_map_spec(const std::string& model_dir, const ParallelSpec& spec,
                                   int64_t element_bytes, const std::string& device_map,
                                   const std::string& max_memory,
                                   const std::vector<DeviceBudget>& default_budgets,
                                   const std::string& variant = "",
                                   const std::vector<std::string>& left_out = {});

}  // namespace dp::strategies
