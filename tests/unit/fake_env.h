#pragma once
// The environment the CLI tests hand dp-launch's parser in place of the process's own, and the
// variables of a Slurm task that the CLI and scheduler-detection tests share.

#include <map>
#include <string>
#include <vector>

#include "cli/command_line.h"
#include "cli/launch_options.h"

namespace dp::test {

struct FakeEnv {
    std::map<std::string, std::string> vars;
    dp::cli::EnvLookup lookup() const {
        return [this](const char* name) -> const char* {
            auto it = vars.find(name);
            return it == vars.end() ? nullptr : it->second.c_str();
        };
    }
};

inline dp::cli::CommandLine parse(const std::vector<std::string>& args, const FakeEnv& env = {}) {
    return dp::cli::parse_command_line(args, env.lookup());
}

// `srun --nodes=2 --ntasks-per-node=4` in job 1234 on node01,node02: the variables srun sets for
// the task of local rank `local_rank` on node02 (global rank 4 + local_rank), less the GPUs.
inline std::map<std::string, std::string> slurm_node02_task(int local_rank) {
    return {
        {"SLURM_JOB_ID", "1234"},
        {"SLURM_STEP_ID", "0"},
        {"SLURM_NNODES", "2"},
        {"SLURM_STEP_NUM_NODES", "2"},
        {"SLURM_NODEID", "1"},
        {"SLURM_PROCID", std::to_string(4 + local_rank)},
        {"SLURM_LOCALID", std::to_string(local_rank)},
        {"SLURM_NTASKS", "8"},
        {"SLURM_STEP_NUM_TASKS", "8"},
        {"SLURM_NTASKS_PER_NODE", "4"},
        {"SLURM_TASKS_PER_NODE", "4(x2)"},
        {"SLURM_STEP_TASKS_PER_NODE", "4(x2)"},
        {"SLURM_JOB_NODELIST", "node[01-02]"},
        {"SLURM_STEP_NODELIST", "node[01-02]"},
        {"SLURMD_NODENAME", "node02"},
        {"SLURM_GPUS_ON_NODE", "4"},
    };
}

}  // namespace dp::test
