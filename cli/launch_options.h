#pragma once
// The option table of `dp-launch`: every option's flags, its DP_* environment twin, its config-file
// key and its help text, written once. Parsing (CLI11) is apart from resolving (precedence and
// validation) and from running (launcher/).
//
// Precedence, highest first: command-line flag > DP_* environment variable > --config JSON file >
// built-in default.

#include <CLI/CLI.hpp>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "launcher/job.h"
#include "launcher/launch_spec.h"

namespace dp::cli {

struct LaunchOptionDef {
    const char* key;            // config-file key, e.g. "num_processes"
    const char* flags;          // CLI11 names, e.g. "-n,--num-processes,--nproc-per-node"
    const char* env;            // environment twin, e.g. "DP_NUM_PROCESSES"
    const char* value_name;     // e.g. "N|auto"; nullptr for a switch
    const char* default_value;  // shown in --help; nullptr when there is none
    const char* help;
};

const std::vector<LaunchOptionDef>& launch_option_table();
// The pipeline options of the main job (`dp-launch [options] PROMPTS`), with the same rules.
const std::vector<LaunchOptionDef>& job_option_table();

// What CLI11 collected, before precedence is applied.
struct RawLaunchOptions {
    std::map<std::string, std::string> values;    // key -> text given on the command line
    std::map<std::string, CLI::Option*> options;  // key -> its CLI11 option, to ask count()
    std::vector<std::string> command;             // everything after the first "--"
};

// Registers every option of both tables on `app`, writing into `raw`.
void add_launch_options(CLI::App& app, RawLaunchOptions& raw);

using EnvLookup = std::function<const char*(const char*)>;

// Applies the precedence to every option and validates the result. Throws launcher::UsageError
// naming the flag, variable or config key at fault and what it accepts.
launcher::LaunchSpec resolve_launch_spec(const RawLaunchOptions& raw, const EnvLookup& env,
                                         bool require_command = true);

// The same for the pipeline options, for a job on `prompts`.
launcher::JobOptions resolve_job_options(const RawLaunchOptions& raw, const EnvLookup& env,
                                         const std::string& prompts);

// The first pipeline option set by a flag, a DP_* variable or the config file, or empty.
std::string first_job_option_set(const RawLaunchOptions& raw, const EnvLookup& env);

}  // namespace dp::cli
