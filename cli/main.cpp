// dp-launch: parse, then run. All the work is in cli/ and launcher/.
#include <cstdlib>

#include "cli/command_line.h"
#include "launcher/own_usage.h"
#include "launcher/start_signals.h"
#include "protocol/standard_fds.h"

int main(int argc, char** argv) {
    dp::launcher::hold_job_signals();           // Note [signals before the ranks start]
    dp::protocol::open_missing_standard_fds();  // before anything is opened (Note [closed standard
                                                // descriptors])
    std::vector<std::string> args(argv + 1, argv + argc);
    const int code = dp::cli::run_command_line(
        dp::cli::parse_command_line(args, [](const char* name) { return std::getenv(name); }));
    if (const char* usage = std::getenv(dp::launcher::kOwnUsageFileVariable))
        dp::launcher::write_own_usage(usage);
    return code;
}
