#include "launcher/dry_run.h"

#include <unistd.h>

#include "launcher/port.h"
#include "launcher/rank_env.h"
#include "launcher/system_info.h"

namespace dp::launcher {

std::string shell_quote(const std::string& word) {
    if (!word.empty() &&
        word.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-./=:,+@%") ==
            std::string::npos)
        return word;
    std::string out = "'";
    for (char c : word) out += (c == '\'') ? std::string("'\\''") : std::string(1, c);
    return out + "'";
}

std::string describe_dry_run(const LaunchSpec& spec) {
    const Rendezvous rendezvous = resolve_rendezvous(spec.master_addr, spec.master_port);
    RankEnvInputs inputs;
    inputs.master_addr = rendezvous.addr;
    inputs.master_port = rendezvous.port;
    inputs.usable_cpus = usable_cpu_count();
    inputs.launcher_pid = getpid();
    const std::vector<std::string> base = current_environment();
    std::string out;
    for (const int local : spec.local_ranks()) {
        const EnvVars vars = rank_variables(spec, inputs, local, base);
        out += "# rank " + std::to_string(spec.node_rank * spec.num_processes + local) + " (local rank " +
               std::to_string(local) + ")\nenv";
        for (const auto& [name, value] : vars) out += " " + name + "=" + shell_quote(value);
        for (const std::string& arg : spec.command) out += " " + shell_quote(arg);
        out += "\n";
    }
    return out;
}

}  // namespace dp::launcher
