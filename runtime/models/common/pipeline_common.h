#pragma once
// What every family's pipeline does the same way: when it loads, it checks the folder against the
// family's rules before reading a weight, finds each component's device and opens its weights
// (the files, or seeded random ones); when it has decoded, it makes the uint8 images.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/models/common/weights.h"
#include "runtime/pipeline.h"
#include "strategies/parallel_spec.h"

namespace dp::runtime {

class ConfigJson;

// Everything the folder's files say would stop the load (strategies::model_folder_problems for
// `spec`'s family), as one ModelError listing them all.
void require_loadable(const PipelineOptions& options, const strategies::ParallelSpec& spec);

// A component's device: its device_map slot's, else the run's.
at::Device device_of(const PipelineOptions& options, const std::string& component);

// The component's weights on `device`: its folder's safetensors (the options' variant), or with
// random_weights seeded random values, different for each `salt`.
WeightStore open_weights(const PipelineOptions& options, const std::string& component, uint64_t salt,
                         at::Device device);

// The class model_index.json names for a component, or empty when it names none.
std::string component_class(const ConfigJson& index, const char* key);

// The request's width and height (0: the pipeline's defaults), after checking them and its steps.
// Throws ModelError naming the size and the multiple the pipeline needs.
std::pair<int, int> checked_size(const DiffusionPipeline& pipeline, const GenerateRequest& request);

// Each request's image and final latents from the decoded images [n, 3, H, W] in [-1, 1] as
// diffusers postprocesses them ([0, 1], clamp, fp32, x 255, round half to even, uint8), and its
// error when its latents are not finite (a NaN would pass the clamp as a black image).
void finish_results(std::vector<GenerateResult>& results, const at::Tensor& images, const at::Tensor& latents,
                    int steps);

}  // namespace dp::runtime
