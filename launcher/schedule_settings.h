#pragma once
// Note [schedules checked first]: a prompt's scheduler (its `scheduler` and `scheduler_config`
// over the job's, Note [one scheduler table], protocol/schedulers.h), its `sigmas` and
// `timesteps`, and its preset (Note [presets], protocol/presets.h) are resolved against the model
// folder's scheduler/scheduler_config.json and checked before any rank starts: a line that cannot
// run is an invalid line (exit 65), a flag a usage error (exit 2). A line that gives sigmas or
// timesteps and no steps (neither its own, the job's nor its preset's) runs as many steps as the
// list has values, as diffusers takes num_inference_steps from the list. No LibTorch.

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launcher/job_options.h"
#include "launcher/prompt_file.h"
#include "protocol/job_file.h"
#include "strategies/model_config.h"

namespace dp::launcher {

// The preset a line runs: its own, else the job's; nullptr: none.
const protocol::Preset* line_preset(const PromptRecord& p, const JobOptions& job);

// The call arguments a line sets, before the model's defaults: its own over its preset's over the
// job's.
protocol::CallValues line_values(const PromptRecord& p, const JobOptions& job);

// The steps a line runs: its own, else the job's, its preset's, its sigmas' (or timesteps')
// count, else the model's default.
int line_steps(const PromptRecord& p, const JobOptions& job, const strategies::ModelInfo& model);

// Why line `p` cannot run its preset or its schedule (a value its preset fixes asked otherwise, a
// preset of another family, a scheduler that does not resolve, sigmas that cannot go to it), or empty.
std::string line_schedule_problem(const PromptRecord& p, const JobOptions& job,
                                  const strategies::ModelInfo& model);

// The same of the job's own flags (--preset, --scheduler, --scheduler-config, --sigmas,
// --timesteps, --steps), each naming its flags.
std::vector<std::string> job_schedule_problems(const JobOptions& job, const strategies::ModelInfo& model);

// What a record holds of a request's schedule beside its call arguments: "preset" (its name) when
// it runs one, and "scheduler_resolved" (ResolvedScheduler::record()) when a scheduler,
// scheduler_config, sigmas or timesteps is in effect.
void add_schedule_record(nlohmann::json& record, const protocol::JobRequest& q,
                         const protocol::Preset* preset, const strategies::ModelInfo& model);

}  // namespace dp::launcher
