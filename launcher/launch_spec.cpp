#include "launcher/launch_spec.h"

#include "launcher/errors.h"

namespace dp::launcher {

void validate_launch_spec(const LaunchSpec& spec, bool require_command) {
    if (require_command && spec.command.empty())
        throw UsageError(
            "no command given: put it after --, e.g. dp-launch -n 2 -- python train.py, or give a PROMPTS "
            "file");
    if (spec.module && spec.no_python)
        throw UsageError(
            "--module and --no-python: -m runs python3 -m MODULE, --no-python runs the command "
            "without python3; give one of them");
    if (spec.standalone && spec.nnodes > 1)
        throw UsageError("--standalone and --nnodes " + std::to_string(spec.nnodes) +
                         ": --standalone is one node with a local store; drop it, or give --nnodes 1");
    if (spec.standalone && !spec.rdzv_endpoint.empty())
        throw UsageError("--standalone and --rdzv-endpoint " + spec.rdzv_endpoint +
                         ": --standalone uses a local store on a free port; give one of them");
    if (spec.node_rank >= spec.nnodes)
        throw UsageError("--node-rank " + std::to_string(spec.node_rank) + ": must be below --nnodes " +
                         std::to_string(spec.nnodes) + " (accepted: 0 to " + std::to_string(spec.nnodes - 1) +
                         ")");
    if (spec.nnodes > 1 && spec.master_addr.empty())
        throw UsageError("--nnodes " + std::to_string(spec.nnodes) +
                         ": several nodes need --master-addr, the host of node rank 0, on every node");
    if (spec.nnodes > 1 && spec.master_port == 0)
        throw UsageError("--nnodes " + std::to_string(spec.nnodes) +
                         ": several nodes need the same --master-port on every node");
    // One task per rank (spawned_local_ranks) starts only its own ranks on the listed GPUs.
    const int spawned = spec.spawned_local_ranks.empty() ? spec.num_processes
                                                         : static_cast<int>(spec.spawned_local_ranks.size());
    if (!spec.gpu_ids.empty() && spawned > static_cast<int>(spec.gpu_ids.size()))
        throw UsageError("--num-processes " + std::to_string(spec.num_processes) + ": --gpu-ids lists only " +
                         std::to_string(spec.gpu_ids.size()) + " GPU(s); give at most that many processes");
    if (static_cast<long long>(spec.nnodes) * spec.num_processes > (1LL << 24))
        throw UsageError("--nnodes x --num-processes: a world of more than 16777216 ranks is not supported");
}

std::vector<std::string> rank_command(const LaunchSpec& spec) {
    const std::vector<std::string>& cmd = spec.command;
    if (cmd.empty() || spec.no_python) return cmd;
    std::vector<std::string> out = {"python3"};
    if (spec.module) {
        out.push_back("-m");
    } else {
        const std::string& first = cmd.front();
        const bool script = first.size() > 3 && first.compare(first.size() - 3, 3, ".py") == 0;
        if (!script) return cmd;
    }
    out.insert(out.end(), cmd.begin(), cmd.end());
    return out;
}

}  // namespace dp::launcher
