#pragma once
// Note [sizes from configs]: with --random-weights a rank builds every component from its
// config.json alone, whatever files the folder holds: a config-only folder may have no tensor
// manifest (tensors.json) and no weights at all, and a config that was edited says more than its
// manifest. What such a job holds is what the configs say. config_parameters counts, for each class
// the families load, the parameters its config builds by the class's layer list in diffusers and
// transformers (a key the config leaves out takes the class's default), without the tensors the
// pipeline never loads; a family's transformer is counted by its facts
// (FamilyFacts::transformer_parameters). The unit tests hold every count against the shipped tensor
// manifests, which diffusers and transformers wrote, and the tiny models' weight files.

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "strategies/device_map.h"
#include "strategies/parallel_spec.h"

namespace dp::strategies {

// A config's number `key`, or `fallback` when it has none. Throws std::invalid_argument when it is
// there but not a number from 0 to 1e15. Counts are kept as doubles: exact for any real model,
// and a hostile config cannot overflow them.
double config_number(const nlohmann::json& config, const char* key, double fallback);
// config_number as a whole count (a layer's features, a block count).
inline int64_t config_count(const nlohmann::json& config, const char* key, double fallback) {
    return static_cast<int64_t>(config_number(config, key, fallback));
}
// A linear layer's parameters: weight and bias.
inline double linear_parameters(double in, double out, bool bias = true) {
    return in * out + (bias ? out : 0);
}

// The parameters component `component` of `model_dir` builds from its config.json and the pipeline
// loads (without spec.unloaded_tensors), for the class model_index.json names; nullopt when the
// class has no count here, or its config cannot be read or says something that is not a size.
std::optional<int64_t> config_parameters(const std::string& model_dir, const ParallelSpec& spec,
                                         const std::string& component);

// What each component `spec` places holds with random weights at `element_bytes` per element, in
// spec order: its config's count (config_parameters), else its files' (pipeline_component_sizes),
// else it is left out. `left_out` as pipeline_component_sizes'. No block_bytes.
std::vector<ComponentSize> random_weight_component_sizes(const std::string& model_dir,
                                                         const ParallelSpec& spec, int64_t element_bytes,
                                                         const std::vector<std::string>& left_out = {});

}  // namespace dp::strategies
