#include "launcher/rank_env.h"

#include <unistd.h>  // environ

#include <algorithm>
#include <unordered_map>

#include "launcher/build_info.h"

namespace dp::launcher {
namespace {

bool has_variable(const std::vector<std::string>& env, const std::string& name) {
    return std::any_of(env.begin(), env.end(), [&](const std::string& kv) {
        return kv.size() > name.size() && kv.compare(0, name.size(), name) == 0 && kv[name.size()] == '=';
    });
}

std::string join_ids(const std::vector<int>& ids) {
    std::string out;
    for (int id : ids) out += (out.empty() ? "" : ",") + std::to_string(id);
    return out;
}

}  // namespace

EnvVars rank_variables(const LaunchSpec& spec, const RankEnvInputs& in, int local_rank,
                       const std::vector<std::string>& base) {
    const int rank = spec.node_rank * spec.num_processes + local_rank;
    const std::string world = std::to_string(spec.world_size());
    EnvVars vars = {
        {"RANK", std::to_string(rank)},
        {"LOCAL_RANK", std::to_string(local_rank)},
        {"WORLD_SIZE", world},
        {"LOCAL_WORLD_SIZE", std::to_string(spec.num_processes)},
        {"GROUP_RANK", std::to_string(spec.node_rank)},
        {"GROUP_WORLD_SIZE", std::to_string(spec.nnodes)},
        {"ROLE_RANK", std::to_string(rank)},
        {"ROLE_WORLD_SIZE", world},
        {"ROLE_NAME", "default"},
        {"MASTER_ADDR", in.master_addr},
        {"MASTER_PORT", std::to_string(in.master_port)},
        {"TORCHELASTIC_RESTART_COUNT", std::to_string(in.restart_count)},
        {"TORCHELASTIC_MAX_RESTARTS", std::to_string(spec.max_restarts)},
        {"TORCHELASTIC_RUN_ID", spec.run_id},
        {"DP_LAUNCH_VERSION", kVersion},
        {"DP_LAUNCHER_PID", std::to_string(in.launcher_pid)},
    };
    if (!in.job_id.empty()) vars.emplace_back("DP_JOB_ID", in.job_id);
    // The ranks' own address for Gloo (--local-addr); c10d's TCPStore needs none.
    if (!spec.local_addr.empty()) vars.emplace_back("DP_LOCAL_ADDR", spec.local_addr);
    if (!spec.gpu_ids.empty()) vars.emplace_back("CUDA_VISIBLE_DEVICES", join_ids(spec.gpu_ids));
    if (spec.cpu_threads_per_process)
        vars.emplace_back("OMP_NUM_THREADS", std::to_string(*spec.cpu_threads_per_process));
    else if (!has_variable(base, "OMP_NUM_THREADS"))
        vars.emplace_back("OMP_NUM_THREADS",
                          std::to_string(std::max(1, in.usable_cpus / spec.num_processes)));
    // accelerate launch's variables, as its launchers set them (accelerate/utils/launch.py).
    if (!spec.mixed_precision.empty()) vars.emplace_back("ACCELERATE_MIXED_PRECISION", spec.mixed_precision);
    if (spec.use_cpu) vars.emplace_back("ACCELERATE_USE_CPU", "true");
    return vars;
}

std::vector<std::string> merge_environment(const std::vector<std::string>& base, const EnvVars& vars) {
    std::unordered_map<std::string, const std::string*> replacement;
    for (const auto& [name, value] : vars) replacement[name] = &value;
    std::vector<std::string> out;
    out.reserve(base.size() + vars.size());
    for (const std::string& kv : base) {
        const std::string name = kv.substr(0, kv.find('='));
        if (replacement.count(name) == 0) out.push_back(kv);
    }
    for (const auto& [name, value] : vars) out.push_back(name + "=" + value);
    return out;
}

std::vector<std::string> current_environment() {
    std::vector<std::string> env;
    for (char** e = environ; e && *e; ++e) env.emplace_back(*e);
    return env;
}

}  // namespace dp::launcher
