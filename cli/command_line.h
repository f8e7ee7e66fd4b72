#pragma once
// From argv to what dp-launch should do, without doing it: parsing never starts a process and
// never prints, so every argv can be tested (and fuzzed) in-process.

#include <optional>
#include <string>
#include <vector>

#include "cli/compare_command.h"
#include "cli/launch_options.h"
#include "launcher/launch_spec.h"
#include "serve/serve_options.h"

namespace dp::cli {

struct CommandLine {
    enum class Action {
        kLaunch,     // run spec (or print it, with --dry-run)
        kEnv,        // `dp-launch env`
        kPlan,       // `dp-launch plan [options]`: print what a job would do
        kArguments,  // `dp-launch arguments [--model M] [--json]`: the model's call arguments
        kCompare,    // `dp-launch compare RUN_A RUN_B [...]`: Note [compare]
        kServe,      // `dp-launch serve [options]`: the HTTP API over a job queue (docs/serve.md)
        kWarmRanks,  // `dp-launch warm-ranks DIR [options]`: serve's warm ranks (Note [warm ranks]), not for
                     // users
        kPrint,      // --help or --version: print `message` to stdout, exit 0
        kFail,       // print `message` to stderr, exit `exit_code`
    };
    Action action = Action::kFail;
    launcher::LaunchSpec spec;
    std::optional<launcher::JobOptions> job;  // set: the main job on a PROMPTS file
    bool json = false;                        // `env --json`, `arguments --json`
    CompareOptions compare;                   // `compare`'s
    serve::ServeOptions serve;                // `serve`'s (its root, dp-launch and job_args set by run)
    std::string message;
    int exit_code = 0;
};

// args excludes the program name.
CommandLine parse_command_line(const std::vector<std::string>& args, const EnvLookup& env);

// Runs what parse_command_line decided and returns the process exit code. Catches every error.
int run_command_line(const CommandLine& command_line);

}  // namespace dp::cli
