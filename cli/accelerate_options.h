#pragma once
// accelerate launch's settings for the program it starts: --mixed-precision, --cpu and
// --num-cpu-threads-per-process. Any command gets them as accelerate launch exports them
// (ACCELERATE_MIXED_PRECISION, ACCELERATE_USE_CPU, OMP_NUM_THREADS); the main job also reads
// the first two as its precision and device.

#include <vector>

#include "cli/launch_options.h"

namespace dp::cli {

// Their rows: options of LaunchSpec, with the launch table's rules (flag, DP_* twin, config key).
const std::vector<LaunchOptionRow>& accelerate_option_table();

// The main job's reading of them: --mixed-precision bf16 or fp16 is --dtype, --cpu is --device cpu,
// unless --dtype or --device says otherwise (no and fp8 leave --dtype as it is: accelerate's no
// is "no autocast", and the ranks have no fp8 arithmetic).
void apply_accelerate_options(const launcher::LaunchSpec& spec, launcher::JobOptions& job);

}  // namespace dp::cli
