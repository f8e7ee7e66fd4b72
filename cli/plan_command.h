#pragma once
// `dp-launch plan`: what a job would do, without running anything: the mesh, which rank does
// what, the sub-groups, each rank's transformer parameter bytes (from the safetensors headers)
// and the bytes each rank would send per denoising step. No LibTorch, no model loading.

#include <string>

#include "launcher/job_options.h"
#include "launcher/launch_spec.h"

namespace dp::cli {

// The plan as text or, with `json`, as one JSON object of the same figures (docs/launcher.md,
// "dp-launch plan"; bytes as integers). Throws UsageError (bad degrees) or InputDataError
// (unreadable model files).
std::string describe_plan(const launcher::LaunchSpec& launch, const launcher::JobOptions& job,
                          bool json = false);

}  // namespace dp::cli
