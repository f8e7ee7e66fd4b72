#pragma once
// The option tables of `dp-launch`. Each row is one option: its flags, how its text is read, the field
// of LaunchSpec or JobOptions it sets, and its help. The row's config-file key and DP_* environment
// twin follow from its first long flag, and --help renders the row's range, choices and default, so
// none of them is written twice. Parsing (CLI11) is apart from resolving (precedence and validation)
// and from running (launcher/).
//
// Precedence, highest first: command-line flag > DP_* environment variable > --config JSON file >
// built-in default.

#include <CLI/CLI.hpp>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "launcher/job_options.h"
#include "launcher/launch_spec.h"

namespace dp::cli {

// How an option's text is read.
enum class OptionKind {
    kSwitch,  // true/false, 1/0, yes/no, on/off; the bare flag means on, --flag=off turns it off
    kInt,     // a whole number from lo to hi
    kNumber,  // a decimal number from lo to hi
    kU64,     // a whole number from 0 to 2^64-1
    kChoice,  // one of `choices`
    kText,    // text; the row's setter may check more
};

// Where the default shown in --help comes from.
enum class DefaultKind {
    kTarget,     // the field of a default-constructed LaunchSpec / JobOptions (none if it is empty)
    kApplied,    // `default_text` is parsed as if given, when nothing sets the option
    kDescribed,  // the field's default means something that is not a value of the option
};

// A row, apart from the type of its target: what every table has in common.
struct OptionDef {
    std::string flags;       // CLI11 names, e.g. "-n,--num-processes,--nproc-per-node"
    std::string long_flag;   // the first long flag, e.g. "--num-processes": names the option in errors
    std::string key;         // config-file key: long_flag without "--", '-' as '_', e.g. "num_processes"
    std::string env;         // DP_ and the key in capitals, e.g. "DP_NUM_PROCESSES"
    std::string value_name;  // e.g. "N"; a choice's choices joined by '|'; empty for a switch
    std::string help;        // what it does; the range, choices and default are added from the fields below
    std::string group;       // its heading in --help
    OptionKind kind = OptionKind::kText;
    double lo = 0, hi = 0;             // kInt, kNumber
    bool lo_excluded = false;          // kNumber: above lo (strength)
    std::string unit;                  // kNumber: "seconds"
    std::vector<std::string> choices;  // kChoice
    DefaultKind default_kind = DefaultKind::kTarget;
    std::string default_text;  // shown in --help; empty: none
    // Given several times, every value counts (--lora): the flags' values, a config list's items or
    // an environment value's lines reach the row joined by newlines. Otherwise the last one wins.
    bool repeatable = false;

    // "1 to 1000", "0 to 3600 seconds"; empty for kinds without a range.
    std::string range_text() const;
    // help, then [range], [default: ...] and [env: DP_...], as --help shows them.
    std::string help_text() const;
};

template <class Target>
struct OptionRow : OptionDef {
    // Reads `text`, from `source` ("--steps", "DP_STEPS" or "dp.json: steps"), into the row's field of
    // `target`. Throws launcher::UsageError naming `source` and what is accepted.
    std::function<void(Target& target, const std::string& text, const std::string& source)> set;
    // The row's field as text: "28", "on", "0,2", "" when unset.
    std::function<std::string(const Target& target)> get;
};

using LaunchOptionRow = OptionRow<launcher::LaunchSpec>;
using JobOptionRow = OptionRow<launcher::JobOptions>;

// The launch options, applied in this order (--gpu-ids before -n, whose 'auto' counts them).
const std::vector<LaunchOptionRow>& launch_option_table();
// The pipeline options of the main job (`dp-launch [options] PROMPTS`), with the same rules.
const std::vector<JobOptionRow>& job_option_table();
// --config: where the config file is; read before the tables are applied, and not a key of the file.
const OptionDef& config_option();
// Every option of the program, in --help order: the rows of both tables and --config.
const std::vector<const OptionDef*>& all_option_defs();

// What CLI11 collected, before precedence is applied.
struct RawLaunchOptions {
    std::map<std::string, std::string> values;    // key -> text given on the command line
    std::map<std::string, CLI::Option*> options;  // key -> its CLI11 option, to ask count()
    std::vector<std::string> command;             // everything after the first "--"
    // accelerate's --num_processes and --num_machines were both spelled so: the processes are the total.
    bool accelerate_total = false;
};

// Registers every option of all_option_defs() on `app`, writing into `raw`.
void add_launch_options(CLI::App& app, RawLaunchOptions& raw);

using EnvLookup = std::function<const char*(const char*)>;

// Applies the precedence to every option and validates the result. Throws launcher::UsageError
// naming the flag, variable or config key at fault and what it accepts.
launcher::LaunchSpec resolve_launch_spec(const RawLaunchOptions& raw, const EnvLookup& env,
                                         bool require_command = true);

// The same for the pipeline options, for a job on `prompts`.
launcher::JobOptions resolve_job_options(const RawLaunchOptions& raw, const EnvLookup& env,
                                         const std::string& prompts);

// The first pipeline option given as a flag on the command line, or empty. DP_* variables and the
// config file only give defaults, which a command run has no use for, so they are never an error.
std::string first_job_option_flag(const RawLaunchOptions& raw);

}  // namespace dp::cli
