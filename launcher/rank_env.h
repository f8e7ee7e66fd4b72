#pragma once
// The environment each rank runs with: torchrun's variables, so that scripts written for torchrun
// (env:// init) run unchanged, plus dp-launch's own.

#include <string>
#include <utility>
#include <vector>

#include "launcher/launch_spec.h"

namespace dp::launcher {

using EnvVars = std::vector<std::pair<std::string, std::string>>;

struct RankEnvInputs {
    std::string master_addr;  // resolved: never empty
    int master_port = 0;      // resolved: never 0
    int restart_count = 0;
    int usable_cpus = 1;  // for the OMP_NUM_THREADS default
    long launcher_pid = 0;
    std::string job_id;  // DP_JOB_ID (Note [orphan guard]); empty: not set
};

// The variables dp-launch sets for local rank `local_rank`, in a fixed order. OMP_NUM_THREADS is
// included only when `base` does not already set it, or --num-cpu-threads-per-process says so;
// ACCELERATE_MIXED_PRECISION and ACCELERATE_USE_CPU only when their options are given.
EnvVars rank_variables(const LaunchSpec& spec, const RankEnvInputs& in, int local_rank,
                       const std::vector<std::string>& base);

// `base` ("K=V" strings) with `vars` set, replacing inherited values of the same names.
std::vector<std::string> merge_environment(const std::vector<std::string>& base, const EnvVars& vars);

// The calling process's environment as "K=V" strings.
std::vector<std::string> current_environment();

}  // namespace dp::launcher
