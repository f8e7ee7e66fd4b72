#pragma once
// The main job's options as the user gave them (flags, DP_* variables, config file), one field per
// option of cli/job_options.cpp's table. Plain data: nothing here is resolved against the model
// or the world, and nothing resolved is ever written back (Note [a job is resolved once],
// launcher/resolved_job.h). The ground floor of the main job's headers: it includes no other file
// of launcher/.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "protocol/call_arguments.h"
#include "protocol/job_file.h"
#include "protocol/presets.h"

namespace dp::launcher {

// The model used without --model: the shapes model trained by this project and shipped in
// models/ (see models/README.md).
inline constexpr const char* kDefaultModel = "shapes-sd3";

struct JobOptions : protocol::ModelLoad {
    std::string prompts;  // a path, or "-" for standard input
    // --prompt TEXT, repeatable: the prompts themselves, instead of a file (Note [images per prompt]
    // and PromptSource, launcher/prompt_file.h).
    std::vector<std::string> prompt_texts;
    int images_per_prompt = 1;  // --num-images-per-prompt: each line's images, seeds seed, seed + 1, ...
    std::string model;
    std::string output_dir = "outputs";
    std::string image_format = "png";  // --format: png, jpeg or webp
    int quality = 90;                  // --quality: JPEG's and WebP's, 1 to 100 (WebP 100: lossless)
    // Unset: the model's default (its family's in the call-argument table, protocol/call_arguments.h:
    // diffusers' for its pipeline; SD3 28 steps, Qwen-Image 50).
    std::optional<int> steps;
    // The family call arguments the job sets (guidance_scale, max_sequence_length,
    // skip-layer guidance, ...): the defaults of each prompt's; unset ones take the model's default.
    protocol::CallValues arguments;
    // --preset NAME|FILE.json (Note [presets], protocol/presets.h): read when the flag is, as
    // --scheduler's file is.
    std::optional<protocol::Preset> preset;
    uint64_t seed = 0;
    bool seed_drawn = false;  // --seed random: `seed` was drawn once by this launcher
    int width = 0;            // 0: the model's default
    int height = 0;
    int batch_size = 1;
    // How the replicas share the prompts: static (contiguous shares), dynamic (a shared queue,
    // costliest first) or auto (dynamic when the prompts' estimated costs differ).
    std::string schedule = "auto";
    // How long a rank waits in one collective before it gives up (exit code 75).
    double collective_timeout_s = protocol::kDefaultCollectiveTimeoutS;
    bool cfg_parallel = false;  // pairs of ranks split classifier-free guidance's two branches
    int ulysses = 1;            // ranks that split each image's tokens (Ulysses context parallelism)
    int ring = 1;               // ranks that pass each image's keys and values round a ring (Ring attention)
    int tp = 1;                 // ranks that split the transformer's weights (tensor parallelism)
    int dp = 0;                 // 0: whatever the world leaves; else it must be exactly that
    // data, context, tensor or device-map: fills the degrees from the world (ResolvedJob's, never these)
    std::string strategy;
    std::string device_map;  // balanced, auto or a FILE.json; empty: none asked (the strategy may give one)
    std::string max_memory;  // device_map's budgets, "DEV=SIZE,..."; empty: the visible GPUs
    std::string dtype = "auto";  // auto: expected_dtype's rule (each rank decides); fp32, bf16, fp16
    std::string device = "auto";
    std::string revision;  // --model ORG/NAME's branch, tag or commit in the Hugging Face cache; empty: main
    // Components whose weights come from one file (--transformer FILE, ...): component -> path as
    // given (Note [component files], launcher/component_files.h).
    std::string model_file;  // --model FILE: the file its components come from (Note [a model from one file])
    std::optional<std::string> negative_prompt;  // unset: none given (diffusers' None)
    bool overwrite = false;
    bool resume = false;  // keep the earlier run's valid images, make only the missing ones
    bool skip_invalid = false;
    bool force = false;  // start even when the ranks' memory exceeds what is available (Note [memory guard])
    std::string worker;  // dp-worker to run; empty: next to dp-launch
};

}  // namespace dp::launcher
