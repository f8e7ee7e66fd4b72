#pragma once
// The main job: `dp-launch [launch options] [pipeline options] PROMPTS`. The launcher reads and
// validates the prompt file once, resolves every prompt's settings, starts dp-worker on each rank
// with the request list, follows their status channels (progress, manifest) and prints a summary.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "launcher/launch_spec.h"
#include "launcher/model_location.h"
#include "protocol/call_arguments.h"
#include "protocol/errors.h"
#include "protocol/job_file.h"
#include "strategies/device_map.h"
#include "strategies/model_config.h"
#include "strategies/strategy.h"

namespace dp::launcher {

using protocol::kExitNoInput;  // the prompt file cannot be read

// The model used without --model: the shapes model trained by this project and shipped in
// models/ (see models/README.md).
inline constexpr const char* kDefaultModel = "shapes-sd3";

struct JobOptions {
    std::string prompts;  // a path, or "-" for standard input
    std::string model;
    std::optional<uint64_t> random_weights;
    std::string output_dir = "outputs";
    // Unset: the model's default (its family's in the call-argument table, protocol/call_arguments.h:
    // diffusers' for its pipeline; SD3 28 steps, Qwen-Image 50).
    std::optional<int> steps;
    // The family call arguments the job sets (guidance_scale, max_sequence_length,
    // skip-layer guidance, ...): the defaults of each prompt's; unset ones take the model's default.
    protocol::CallValues arguments;
    uint64_t seed = 0;
    int width = 0;  // 0: the model's default
    int height = 0;
    int batch_size = 1;
    // How the replicas share the prompts: static (contiguous shares), dynamic (a shared queue,
    // costliest first) or auto (dynamic when the prompts' estimated costs differ).
    std::string schedule = "auto";
    // How long a rank waits in one collective before it gives up (exit code 75).
    double collective_timeout_s = protocol::kDefaultCollectiveTimeoutS;
    bool cfg_parallel = false;   // pairs of ranks split classifier-free guidance's two branches
    int ulysses = 1;             // ranks that split each image's tokens (Ulysses context parallelism)
    int ring = 1;                // ranks that pass each image's keys and values round a ring (Ring attention)
    int tp = 1;                  // ranks that split the transformer's weights (tensor parallelism)
    int dp = 0;                  // 0: whatever the world leaves; else it must be exactly that
    std::string strategy;        // data, context, tensor or device-map: fills the degrees from the world
    std::string device_map;      // balanced, auto or a FILE.json; empty: no device_map
    std::string max_memory;      // device_map's budgets, "DEV=SIZE,..."; empty: the visible GPUs
    std::string dtype = "auto";  // auto: bf16 on a GPU, fp32 on the CPU (each rank decides); fp32, bf16, fp16
    std::string device = "auto";
    std::string revision;  // --model ORG/NAME's branch, tag or commit in the Hugging Face cache; empty: main
    std::string variant;   // weight files NAME.VARIANT.safetensors; empty: the plain ones
    // Components whose weights come from one file (--transformer FILE, ...): component -> path as
    // given (Note [component files], launcher/component_files.h).
    std::map<std::string, std::string> component_files;
    bool no_t5 = false;      // without the T5 text encoder, even when the folder has one
    std::string model_file;  // --model FILE: the file its components come from (Note [a model from one file])
    bool keep_quantized = false;  // GGUF weights kept in their blocks (Note [kept quantized])
    bool offload = false;  // each component on the GPU only while it runs (diffusers' model CPU offload)
    std::optional<std::string> negative_prompt;  // unset: none given (diffusers' None)
    bool overwrite = false;
    bool resume = false;  // keep the earlier run's valid images, make only the missing ones
    bool skip_invalid = false;
    bool force = false;  // start even when the ranks' memory exceeds what is available (Note [memory guard])
    std::string worker;  // dp-worker to run; empty: next to dp-launch
};

// Note [checking a model before the ranks start] (launcher/model_check.h): `job`'s model loaded
// once by dp-worker --check, as a rank would load it. Throws the rank's error (65 for the model's
// problems). Not with a --worker of one's own.
void check_model_with_worker(const LaunchSpec& launch, const JobOptions& job,
                             const strategies::ModelInfo& model,
                             const strategies::ResolvedStrategy& strategy);

// The job's strategy options on `launch`'s world, as strategies::resolve_strategy takes them.
strategies::StrategyRequest strategy_request(const LaunchSpec& launch, const JobOptions& job,
                                             const strategies::ModelInfo& model);

// strategies::resolve_strategy for `job`, with its model's family spec (model_index.json) and
// heads (the transformer's config.json), then device_map's plan where it can be made here
// (plan_device_map_for): every refusal before anything starts. Throws UsageError, or ModelError
// when the model folder's configs cannot be read or its pipeline is not supported.
strategies::ResolvedStrategy resolve_job_strategy(const LaunchSpec& launch, const JobOptions& job,
                                                  const strategies::ModelInfo& model);

// `job` with the resolved degrees (dp included) and device_map written back.
JobOptions with_strategy(JobOptions job, const strategies::ResolvedStrategy& resolved);

// with_strategy(job, resolve_job_strategy(launch, job, the model read from job.model)).
JobOptions resolve_strategy(const LaunchSpec& launch, JobOptions job);

// device_map's plan for `job` (already through resolve_strategy), made here when its budgets are
// known without a GPU: a FILE.json, or --max-memory. nullopt without --device-map, or when the
// budgets are the visible GPUs' free memory, which the worker measures. Throws UsageError for a
// map that cannot work (one device, a component that fits nowhere, a bad file).
std::optional<strategies::DeviceMapPlan> plan_device_map_for(const JobOptions& job,
                                                             const strategies::ModelInfo& model);

// Runs the job and returns dp-launch's exit code (README "Exit codes"). Throws Error for what
// prevents starting it: an unreadable prompt file (66), invalid prompts (65), existing outputs
// without --overwrite (2).
int run_job(const LaunchSpec& launch, const JobOptions& job);

}  // namespace dp::launcher
