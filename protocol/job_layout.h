#pragma once
// Where a job's ranks and weights go, as the launcher plans it and the worker follows it: how the
// model loads, the mesh's degrees and device_map's plan. Defined once, here in the contract both sides share;
// strategies/ plans them (mesh.h, device_map.h), the job file carries them (job_file.h). std only.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dp::protocol {

// How a model's components load: what the launcher's flags ask (launcher::JobOptions), the job file
// carries (JobFile) and each rank's pipeline applies (runtime::PipelineOptions). One struct all
// three derive from, so a new loading option is one field here and its flag and JSON key.
struct ModelLoad {
    std::optional<uint64_t> random_weights;  // set: the model's configs with seeded random weights
    std::string variant;  // weight files of this variant (*.VARIANT.safetensors); empty: the plain ones
    // Components whose weights come from one file (--transformer FILE, ...): component -> absolute
    // path (Note [component files], launcher/component_files.h).
    std::map<std::string, std::string> component_files;
    // Without the T5 text encoder even when the folder has one (diffusers' text_encoder_3=None):
    // its embeddings are then zeros, as for a folder without it.
    bool no_t5 = false;
    // Each component is built on the rank's device when it runs and freed after (diffusers' model
    // CPU offload): only the largest one is ever resident there. Not with device_map.
    bool offload = false;
    // GGUF component files' quantized matrices kept in their blocks, dequantized per use (Note
    // [kept quantized], runtime/io/shard_source.h).
    bool keep_quantized = false;
    // Note [int8 compute] (runtime/parallel/int8_linear.h): "int8" runs the transformer's layers
    // its family allows as W8A8 products; empty: every product in the run's dtype.
    std::string quantize;
};

// The device mesh's degrees, in the mesh's order (dp outermost, tp innermost; strategies/mesh.h);
// their product is the world size. The launcher resolves them, the job file carries them, the
// worker builds its groups from them: one struct on both sides.
struct MeshDegrees {
    int dp = 1, cfg = 1, ring = 1, ulysses = 1, tp = 1;
    int product() const { return dp * cfg * ring * ulysses * tp; }
    // The ranks of one model replica: they take the same prompts (cfg x ring x ulysses x tp).
    int replica_size() const { return cfg * ring * ulysses * tp; }
    // The degree of dimension `dim` (0 dp ... 4 tp, or strategies::MeshDim).
    template <typename Dim>
    int of(Dim dim) const {
        const int at = static_cast<int>(dim);
        return at == 0 ? dp : at == 1 ? cfg : at == 2 ? ring : at == 3 ? ulysses : tp;
    }
};

struct DevicePlacement {
    std::string component;  // "text_encoder", "transformer", ...
    int block = -1;         // -1: the whole component; else one transformer block
    std::string device;     // one of DeviceMapPlan::devices
    int64_t bytes = 0;      // the weights placed
};

// device_map's plan (strategies/device_map.h makes it, the worker's executor follows it).
struct DeviceMapPlan {
    std::vector<DevicePlacement> placements;
    std::vector<std::string> devices;  // the budgets' devices in the order given (a file: first use)
    std::vector<int64_t> used;         // bytes placed on each of `devices` (the job file leaves it out)
};

}  // namespace dp::protocol
