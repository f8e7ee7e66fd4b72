#pragma once
// The main job: `dp-launch [launch options] [pipeline options] PROMPTS`. The launcher reads and
// validates the prompt file once, resolves every prompt's settings, starts dp-worker on each rank
// with the request list, follows their status channels (progress, manifest) and prints a summary.

#include "launcher/job_options.h"
#include "launcher/launch_spec.h"
#include "launcher/model_location.h"  // resolve_model: how --model is found, for run_job's callers
#include "launcher/resolved_job.h"
#include "protocol/errors.h"

namespace dp::launcher {

using protocol::kExitNoInput;  // the prompt file cannot be read

// Note [checking a model before the ranks start] (launcher/model_check.h): `job`'s model loaded
// once by dp-worker --check, as a rank would load it. Throws the rank's error (65 for the model's
// problems). Not with a --worker of one's own.
void check_model_with_worker(const LaunchSpec& launch, const ResolvedJob& job);

// Runs the job (resolve_job of `options`, then its checks, prompts, ranks and monitor) and returns
// dp-launch's exit code (README "Exit codes"). Throws Error for what prevents starting it: an
// unreadable prompt file (66), invalid prompts (65), existing outputs without --overwrite (2).
int run_job(const LaunchSpec& launch, const JobOptions& options);

}  // namespace dp::launcher
