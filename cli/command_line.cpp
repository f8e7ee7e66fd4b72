#include "cli/command_line.h"

#include <algorithm>
#include <iostream>

#include "cli/env_command.h"
#include "cli/plan_command.h"
#include "launcher/build_info.h"
#include "launcher/errors.h"
#include "launcher/job.h"
#include "launcher/prompt_file.h"
#include "launcher/supervisor.h"

namespace dp::cli {
namespace {

constexpr const char* kExamples = R"(
Examples:
  dp-launch -n 2 --model models/sd3 prompts.txt   2 ranks split prompts.txt; images in outputs/
  dp-launch -n 4 -- python train.py --lr 3e-4     4 ranks of a torchrun-style script
  dp-launch --gpu-ids 0,2 -- ./my_program        2 ranks on GPUs 0 and 2
  dp-launch -n 2 --log-dir logs -- ./job.sh       also keep each rank's output in logs/
  dp-launch -n 2 --dry-run -- ./job.sh            show each rank's environment, start nothing
  dp-launch --nnodes 2 --node-rank 0 --master-addr node0 --master-port 29500 -n 8 -- python train.py
  dp-launch env --json                            facts for a bug report

Each rank gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and the
other torchrun variables. Precedence: flag > DP_* environment variable > --config file > default.
Exit codes: 0 every rank succeeded; 2 usage error; otherwise the first failing rank's exit code,
or 128+signal (see README).
)";

std::string one_line(std::string text) {
    std::replace(text.begin(), text.end(), '\n', ' ');
    while (!text.empty() && text.back() == ' ') text.pop_back();
    return text;
}

// `words` as one shell line: a word with characters the shell treats specially is single-quoted.
std::string shell_words(const std::vector<std::string>& words) {
    std::string out;
    for (const std::string& w : words) {
        const bool plain = !w.empty() && w.find_first_not_of(
                                             "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                             "0123456789_-+=.,/:@%") == std::string::npos;
        std::string quoted = "'";
        for (char c : w) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
        out += (out.empty() ? "" : " ") + (plain ? w : quoted + "'");
    }
    return launcher::utf8_for_display(out);
}

}  // namespace

CommandLine parse_command_line(const std::vector<std::string>& args, const EnvLookup& env) {
    CommandLine result;
    result.exit_code = launcher::kExitUsage;

    // Everything after the first "--" is the command, untouched by option parsing.
    auto dashes = std::find(args.begin(), args.end(), "--");
    std::vector<std::string> options(args.begin(), dashes);
    RawLaunchOptions raw;
    if (dashes != args.end()) raw.command.assign(dashes + 1, args.end());

    CLI::App app(
        "dp-launch: start a command once per rank, torchrun-compatible, and supervise it.\n"
        "Usage: dp-launch [OPTIONS] [PIPELINE OPTIONS] PROMPTS\n"
        "       dp-launch [OPTIONS] -- COMMAND [ARGS...]\n"
        "       dp-launch plan [OPTIONS] [PIPELINE OPTIONS]\n"
        "       dp-launch env [--json]",
        "dp-launch");
    app.footer(kExamples);
    app.set_version_flag("--version", std::string("dp-launch ") + launcher::kVersion);
    add_launch_options(app, raw);
    std::vector<std::string> stray;
    app.add_option("args", stray)->group("");  // reported below with a hint, not as CLI11's error
    CLI::App* env_cmd =
        app.add_subcommand("env", "Print the version, OS, CPUs, LibTorch, CUDA, NCCL and GPUs");
    env_cmd->add_flag("--json", result.json, "Print JSON");
    CLI::App* plan_cmd = app.add_subcommand(
        "plan",
        "Print the mesh, each rank's role, the sub-groups, per-rank parameter bytes and the "
        "bytes sent per step for these options, without running anything");
    plan_cmd->fallthrough();  // the launch and pipeline options belong to the main app

    try {
        std::vector<std::string> reversed(options.rbegin(), options.rend());  // CLI11 takes argv reversed
        app.parse(reversed);
    } catch (const CLI::CallForHelp&) {
        result.action = CommandLine::Action::kPrint;
        result.message = env_cmd->parsed() ? env_cmd->help() : app.help();
        result.exit_code = 0;
        return result;
    } catch (const CLI::CallForVersion& e) {
        result.action = CommandLine::Action::kPrint;
        result.message = std::string(e.what()) + "\n";
        result.exit_code = 0;
        return result;
    } catch (const CLI::ParseError& e) {
        result.message = one_line(e.what()) + " (see dp-launch --help)";
        return result;
    }

    if (env_cmd->parsed()) {
        result.action = CommandLine::Action::kEnv;
        result.exit_code = 0;
        return result;
    }
    // `plan` resolves the same options as the main job, without a PROMPTS file.
    const bool plan = plan_cmd->parsed();
    const bool job_mode = plan || (raw.command.empty() && !stray.empty());
    if (plan && !stray.empty()) {
        result.message = "plan takes options only, not '" + stray.front().substr(0, 80) +
                         "': it describes a job without reading prompts";
        return result;
    }
    if (stray.size() > 1 || (!stray.empty() && dashes != args.end())) {
        result.message = "unexpected argument '" + stray.back().substr(0, 80) +
                         "': give one PROMPTS file, or put a command after --, e.g. dp-launch -n 2 -- " +
                         stray.front().substr(0, 80);
        return result;
    }
    if (job_mode && !plan && stray.front() != "-") {
        if (const auto program = launcher::guess_program(stray.front())) {
            std::vector<std::string> meant;
            for (const std::string& arg : options)
                if (arg != stray.front()) meant.push_back(arg);
            meant.push_back("--");
            meant.insert(meant.end(), program->command.begin(), program->command.end());
            result.message = launcher::utf8_for_display(stray.front()) + " is " + program->what +
                             ", not a prompt file; to run it once per rank, put it after --: dp-launch " +
                             shell_words(meant);
            return result;
        }
    }
    try {
        result.spec = resolve_launch_spec(raw, env, /*require_command=*/!job_mode);
        if (job_mode) {
            result.job = resolve_job_options(raw, env, plan ? "-" : stray.front());
        } else if (const std::string set = first_job_option_flag(raw); !set.empty()) {
            result.message = set + " is a pipeline option: it needs a PROMPTS file, not a command after --";
            return result;
        }
    } catch (const launcher::Error& e) {
        result.message = e.what();
        result.exit_code = e.exit_code();
        return result;
    }
    result.action = plan ? CommandLine::Action::kPlan : CommandLine::Action::kLaunch;
    result.exit_code = 0;
    return result;
}

int run_command_line(const CommandLine& command_line) {
    try {
        switch (command_line.action) {
            case CommandLine::Action::kPrint:
                std::cout << command_line.message << std::flush;
                return command_line.exit_code;
            case CommandLine::Action::kFail:
                std::cerr << "dp-launch: " << command_line.message << std::endl;
                return command_line.exit_code;
            case CommandLine::Action::kPlan:
                std::cout << describe_plan(command_line.spec, *command_line.job) << std::flush;
                return 0;
            case CommandLine::Action::kEnv:
                std::cout << describe_environment(command_line.json) << std::flush;
                return 0;
            case CommandLine::Action::kLaunch:
                if (command_line.job) return launcher::run_job(command_line.spec, *command_line.job);
                if (command_line.spec.dry_run) {
                    std::cout << launcher::describe_dry_run(command_line.spec) << std::flush;
                    return 0;
                }
                return launcher::run_launch(command_line.spec);
        }
    } catch (const launcher::Error& e) {
        std::cerr << "dp-launch: " << e.what() << std::endl;
        return e.exit_code();
    } catch (const std::exception& e) {
        std::cerr << "dp-launch: internal error: " << e.what() << std::endl;
    }
    return launcher::kExitInternal;
}

}  // namespace dp::cli
