#pragma once
// The text-to-image pipeline interface every model family implements, and the registry that
// picks one by model_index.json's `_class_name`. A pipeline loads its components, takes its
// place in the mesh from a ParallelContext, and turns requests into uint8 RGB images.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "protocol/call_arguments.h"
#include "protocol/job_file.h"
#include "runtime/pipeline/phase_timer.h"
#include "strategies/model_config.h"

namespace dp::runtime {

struct DeviceMapping;
class ParallelContext;
class AdapterState;

// How the components load (protocol::ModelLoad: the variant, component files, T5, offload, ...)
// and where.
struct PipelineOptions : protocol::ModelLoad {
    std::string model_dir;  // a diffusers folder with model_index.json
    // What the caller has read of the folder already (the worker: Note [a model is read once]);
    // nullptr: the pipeline reads it as it loads.
    std::shared_ptr<const strategies::ModelInfo> model;
    at::ScalarType dtype = at::kFloat;
    at::Device device = at::kCPU;
    // device_map: each component (and transformer block) on its own device; `device` must then be
    // the device of transformer block 0, where the latents live. nullptr: everything on `device`.
    std::shared_ptr<const DeviceMapping> device_map;
    // Training: every weight requires grad and parameters() lists it (WeightStore::keep_as_parameters).
    bool trainable = false;
    // Note [checking a model before the ranks start]: the pipeline's load reads every config,
    // tokenizer and weight file header and makes every check it makes, but builds no component
    // and reads no tensor data; the pipeline it returns cannot generate.
    bool check_only = false;
    // The LoRA adapters the components are built with, and how to build them again when a batch
    // asks for others (runtime/pipeline/adapters.h); shared by the copies of these options.
    // nullptr: the pipeline takes no adapters.
    std::shared_ptr<AdapterState> adapters;
};

// A call of the pipeline (protocol::Generation: a call argument the family does not take is a
// ModelError), and what it reports as it goes.
struct GenerateRequest : protocol::Generation {
    std::function<void(int step, int steps)> on_step;  // called after each denoising step
};

struct GenerateResult {
    at::Tensor image;                   // [height, width, 3] uint8, CPU
    at::Tensor latents;                 // the final latents, fp32 CPU, before decoding
    std::vector<std::string> warnings;  // e.g. prompt truncation, as diffusers logs it
    // Non-empty: this request made no valid image (its latents are not finite, say), and why. The
    // other requests of the batch are unaffected.
    std::string error;
    // With a step cache: the transformer passes computed in full, each guidance branch's
    // counted (Note [first block cache]); -1 without one.
    int64_t computed_steps = -1;
    // With a step cache, per guidance branch (negative, positive; empty for one this rank does not
    // run): each pass's relative change of the first block's residual (-1: the branch's first).
    std::vector<std::vector<double>> cache_metrics;
    // MagCache calibration (Note [mag cache]): the positive branch's ratio at each step; else empty.
    std::vector<double> mag_ratios;
    // Note [phase split]: the batch's phases and transformer work on this rank (the batch's own,
    // in its first result; zero in the others).
    PhaseTimes phases;
};

class DiffusionPipeline {
  public:
    virtual ~DiffusionPipeline() = default;

    // Several requests that share steps, guidance scale and size, through the model together.
    // Each keeps its own seed and noise. Throws ModelError for a request the model cannot take.
    // Every rank of a replica calls it with the same requests (the parallel layer's contract).
    virtual std::vector<GenerateResult> generate_batch(
        const std::vector<GenerateRequest>& requests) const = 0;
    GenerateResult generate(const GenerateRequest& request) const;

    virtual int default_width() const = 0;
    virtual int default_height() const = 0;
    // Width and height must be multiples of this.
    virtual int size_multiple() const = 0;
};

// Loads the pipeline model_index.json names, with this rank's place in the mesh (`parallel` must
// outlive the pipeline). Throws ModelError naming the class and the supported ones.
std::unique_ptr<DiffusionPipeline> load_pipeline(const PipelineOptions& options,
                                                 const ParallelContext& parallel);

}  // namespace dp::runtime
