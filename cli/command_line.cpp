#include "cli/command_line.h"

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>
#include <sstream>

#include "cli/accelerate_options.h"
#include "cli/arguments_command.h"
#include "cli/env_command.h"
#include "cli/foreign_flags.h"
#include "cli/help_pages.h"
#include "cli/option_groups.h"
#include "cli/plan_command.h"
#include "cli/serve_command.h"
#include "launcher/build_info.h"
#include "launcher/dry_run.h"
#include "launcher/errors.h"
#include "launcher/job.h"
#include "launcher/model_location.h"
#include "launcher/prompt_file.h"
#include "launcher/spelling.h"
#include "launcher/start_signals.h"
#include "launcher/supervisor.h"
#include "launcher/terminal.h"
#include "launcher/values.h"

namespace dp::cli {
namespace {

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

// accelerate's --num_processes and --num_machines, both in that spelling: a total over the machines.
bool accelerate_total(const std::vector<std::string>& options) {
    auto spelled = [&](const std::string& flag) {
        return std::any_of(options.begin(), options.end(), [&](const std::string& arg) {
            return arg == flag || arg.rfind(flag + "=", 0) == 0;
        });
    };
    return spelled("--num_processes") && spelled("--num_machines");
}

// torchrun's `-m MODULE ARGS...`: after -m (or --module), the first word that is neither an option
// nor an option's value is the module, and it and everything after it are the command, as after
// "--" (`dp-launch -n 2 -m pkg.train --epochs 3`). `args` as given when there is no -m before
// the first "--".
std::vector<std::string> with_module_command(const std::vector<std::string>& args) {
    std::map<std::string, bool> takes_value;  // every flag of the tables
    for (const OptionDef* def : all_option_defs()) {
        std::stringstream names(def->flags);
        for (std::string name; std::getline(names, name, ',');)
            takes_value[name] = def->kind != OptionKind::kSwitch;
    }
    bool module = false;
    for (std::size_t i = 0; i < args.size(); ++i) {
        const std::string& a = args[i];
        if (a == "--") return args;
        if (a == "-m" || a == "--module") {
            module = true;
            continue;
        }
        if (a.size() > 1 && a[0] == '-') {
            const auto it = takes_value.find(a.substr(0, a.find('=')));
            if (it != takes_value.end() && it->second && a.find('=') == std::string::npos) ++i;  // its value
            continue;
        }
        if (!module) continue;  // a PROMPTS file, or a subcommand
        std::vector<std::string> out(args.begin(), args.begin() + static_cast<std::ptrdiff_t>(i));
        out.push_back("--");
        out.insert(out.end(), args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
        return out;
    }
    return args;
}

// dp-launch's CLI11 app: the launch and pipeline options, the subcommands, and where each puts
// what it reads (`result`'s --json and compare fields, the stray words).
struct CommandApp {
    CLI::App app{kProgramSummary, "dp-launch"};
    std::vector<std::string> stray;         // words that are no option: a PROMPTS file, or a mistake
    std::vector<std::string> prompt_texts;  // --prompt TEXT, repeatable: PROMPTS as flags
    CLI::App* env = nullptr;
    CLI::App* plan = nullptr;
    CLI::App* arguments = nullptr;
    CLI::App* compare = nullptr;
    CLI::App* serve = nullptr;
    ServeFlags serve_flags;          // serve's own flags, as given
    CLI::App* warm_ranks = nullptr;  // serve's own use: Note [warm ranks]
    std::string warm_dir;
    std::vector<std::string> runs;   // compare's two folders
    std::string min_psnr, min_ssim;  // its budgets, as given (compare_command reads them)
    CLI::Option* psnr = nullptr;
    CLI::Option* ssim = nullptr;

    // `help_width`: the columns --help is wrapped to.
    CommandApp(RawLaunchOptions& raw, CommandLine& result, std::size_t help_width);
};

CommandApp::CommandApp(RawLaunchOptions& raw, CommandLine& result, std::size_t help_width) {
    const auto formatter = std::make_shared<HelpFormatter>(help_width, option_group_headings());
    app.formatter(formatter);  // the subcommands share it
    app.set_version_flag("--version", std::string("dp-launch ") + launcher::kVersion + " (commit " +
                                          launcher::kSourceCommit + ")");
    add_launch_options(app, raw);
    app.add_option("args", stray)->group("");  // reported with a hint, not as CLI11's error
    app.add_option(
           "--prompt", prompt_texts,
           "A prompt, instead of a PROMPTS file; repeatable, each one a line of a prompt file of its own")
        ->type_name("TEXT")
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
        ->expected(1)
        ->allow_extra_args(false)
        ->group(option_group("prompt", "Pipeline options (with PROMPTS)"));
    env = app.add_subcommand("env", "Print the version, OS, CPUs, LibTorch, CUDA, NCCL and GPUs");
    env->add_flag("--json", result.json, "Print JSON");
    plan = app.add_subcommand(
        "plan",
        "Print the mesh, each rank's role, the sub-groups, per-rank parameter bytes and the "
        "bytes sent per step for these options, without running anything");
    plan->add_flag("--json", result.json,
                   "Print one JSON object: the same figures, bytes as integers, for scripts and CI");
    plan->fallthrough();  // the launch and pipeline options belong to the main app
    arguments = app.add_subcommand("arguments",
                                   "Print the call arguments --model's pipeline takes: each "
                                   "JSONL key of a prompt line, its type, range, "
                                   "default, flag and what it does");
    arguments->add_flag("--json", result.json, "Print JSON: an array of objects, one per key");
    arguments->fallthrough();
    compare = app.add_subcommand(
        "compare",
        "Pair the images of two output folders by prompt index and print each pair's PSNR and SSIM, their "
        "mean "
        "and worst; write the pairs side by side; exit 1 when a pair falls below --min-psnr or --min-ssim or "
        "differs in size, or a prompt has no image in either run (docs/step-cache.md)");
    compare->add_option("runs", runs, "RUN_A RUN_B: two output folders (each with its manifest.jsonl)")
        ->expected(2)
        ->required();
    psnr =
        compare->add_option("--min-psnr", min_psnr, "Exit 1 when a pair's PSNR (dB) is below X [0 to 1000]")
            ->type_name("X");
    ssim = compare->add_option("--min-ssim", min_ssim, "Exit 1 when a pair's SSIM is below X [-1 to 1]")
               ->type_name("X");
    compare
        ->add_option("--gallery", result.compare.gallery,
                     "Where the page of pairs goes (default RUN_B/compare.html)")
        ->type_name("FILE");
    compare->add_flag("--json", result.compare.json, "Print one JSON object per pair, then the summary's");
    compare->add_flag("--strict", result.compare.strict,
                      "Exit 1 also when a pair's records differ in prompt or seed (always reported)");
    serve = add_serve_command(app, serve_flags);
    warm_ranks = app.add_subcommand("warm-ranks", "dp-launch serve's warm ranks")->group("");
    warm_ranks->add_option("dir", warm_dir)->required();
    warm_ranks->fallthrough();
    set_help_pages(*formatter);
}

// Sets `result` to what dp-launch says and does when `r` fails with `message`: a usage error.
CommandLine& usage_error(CommandLine& r, std::string message) {
    r.action = CommandLine::Action::kFail;
    r.message = std::move(message);
    r.exit_code = launcher::kExitUsage;
    return r;
}

// Sets `r` to print `text` to stdout and exit 0 (--help, --version).
CommandLine& print(CommandLine& r, std::string text) {
    r.action = CommandLine::Action::kPrint;
    r.message = std::move(text);
    r.exit_code = 0;
    return r;
}

// A value option given more than once ("--cache A --cache B"), which CLI11 refuses as "At Most 1
// required but received 2": which option, and both values, so that neither is taken silently.
// Empty when no option is.
std::string repeated_option(const CLI::App& app) {
    for (const CLI::Option* opt : app.get_options()) {
        if (opt->count() < 2 || opt->get_multi_option_policy() != CLI::MultiOptionPolicy::Throw) continue;
        std::string values;
        for (const std::string& v : opt->results())
            values += (values.empty() ? "'" : "' and '") + launcher::utf8_for_display(v.substr(0, 80));
        return opt->get_name() + " is given " + std::to_string(opt->count()) + " times (" + values +
               "'); give it once";
    }
    return {};
}

// Every flag of `app` and its subcommands, with its dashes.
void add_known_flags(const CLI::App& app, std::vector<std::string>& out) {
    for (const CLI::Option* opt : app.get_options()) {
        for (const std::string& name : opt->get_lnames()) out.push_back("--" + name);
        for (const std::string& name : opt->get_snames()) out.push_back("-" + name);
    }
    for (const CLI::App* sub : app.get_subcommands({})) add_known_flags(*sub, out);
}

// The first word of `options` that looks like a long flag and is none of the app's, or empty.
std::string first_unknown_flag(const CommandApp& c, const std::vector<std::string>& options,
                               std::vector<std::string>& known) {
    add_known_flags(c.app, known);
    for (const std::string& arg : options)
        if (arg.size() > 2 && arg.rfind("--", 0) == 0 &&
            std::find(known.begin(), known.end(), arg.substr(0, arg.find('='))) == known.end())
            return arg;
    return "";
}

// Parses `options` (argv before "--"); false when `result` is already the answer: --help,
// --version or CLI11's parse error.
bool parse_options(CommandApp& c, const std::vector<std::string>& options, CommandLine& result) {
    try {
        std::vector<std::string> reversed(options.rbegin(), options.rend());  // CLI11 takes argv reversed
        c.app.parse(reversed);
        return true;
    } catch (const CLI::CallForHelp&) {
        const CLI::App* page = &c.app;
        for (const CLI::App* sub : {c.env, c.plan, c.arguments, c.compare, c.serve})
            if (sub->parsed()) page = sub;
        print(result, page->help());
    } catch (const CLI::CallForVersion& e) {
        print(result, std::string(e.what()) + "\n");
    } catch (const CLI::ParseError& e) {
        // A flag it does not know is the likeliest cause, whatever CLI11 tripped on first.
        std::vector<std::string> known;
        const std::string flag = first_unknown_flag(c, options, known);
        const std::string repeated = flag.empty() ? repeated_option(c.app) : "";
        usage_error(result, !flag.empty()       ? unknown_flag_usage(flag, known) + " (see dp-launch --help)"
                            : !repeated.empty() ? repeated
                                                : one_line(e.what()) + " (see dp-launch --help)");
    }
    return false;
}

// `compare RUN_A RUN_B [...]`, from what the app read.
CommandLine& compare_command(const CommandApp& c, const RawLaunchOptions& raw, CommandLine& result) {
    if (!c.stray.empty() || !raw.command.empty())
        return usage_error(result,
                           "compare takes two output folders: dp-launch compare RUN_A RUN_B [--min-psnr X] "
                           "[--min-ssim Y] [--strict] [--gallery FILE] [--json]");
    result.compare.a = c.runs.at(0);
    result.compare.b = c.runs.at(1);
    // parse_number, not CLI::Range: a range check lets NaN through (every comparison with it is
    // false), and a budget of NaN would pass every pair.
    try {
        if (c.psnr->count())
            result.compare.min_psnr = launcher::parse_number(c.min_psnr, 0, 1000, "--min-psnr", "dB");
        if (c.ssim->count())
            result.compare.min_ssim = launcher::parse_number(c.min_ssim, -1, 1, "--min-ssim");
    } catch (const launcher::UsageError& e) {
        return usage_error(result, e.what());
    }
    result.action = CommandLine::Action::kCompare;
    result.exit_code = 0;
    return result;
}

// What is wrong with the stray words (at most one PROMPTS file, for the main job, plan or
// arguments), with a hint: a program given as PROMPTS is shown run after "--". Empty: nothing.
// `after_dashes`: argv has a "--" (with or without a command after it).
std::string stray_problem(const CommandApp& c, const std::vector<std::string>& options,
                          const RawLaunchOptions& raw, bool after_dashes) {
    const bool plan = c.plan->parsed(), arguments = c.arguments->parsed();
    const std::vector<std::string>& stray = c.stray;
    if (arguments && (!stray.empty() || !raw.command.empty()))
        return "arguments takes no PROMPTS file and no command: dp-launch arguments --model M [--json]";
    if (stray.size() > 1 || (!stray.empty() && after_dashes))
        return "unexpected argument '" + stray.back().substr(0, 80) +
               "': give one PROMPTS file, or put a command after --, e.g. dp-launch -n 2 -- " +
               stray.front().substr(0, 80);
    if (plan || stray.empty() || stray.front() == "-") return {};
    std::error_code no_file;
    if (!std::filesystem::exists(stray.front(), no_file))
        if (const std::string hint =
                launcher::did_you_mean(stray.front(), {"plan", "arguments", "env", "compare", "serve"});
            !hint.empty())
            return "'" + launcher::utf8_for_display(stray.front().substr(0, 80)) +
                   "' is neither a prompt file nor a subcommand" + hint;
    const auto program = launcher::guess_program(stray.front());
    if (!program) return {};
    std::vector<std::string> meant;
    for (const std::string& arg : options)
        if (arg != stray.front()) meant.push_back(arg);
    meant.push_back("--");
    meant.insert(meant.end(), program->command.begin(), program->command.end());
    return launcher::utf8_for_display(stray.front()) + " is " + program->what +
           ", not a prompt file; to run it once per rank, put it after --: dp-launch " + shell_words(meant);
}

}  // namespace

CommandLine parse_command_line(const std::vector<std::string>& given, const EnvLookup& env) {
    CommandLine result;
    const std::vector<std::string> args = with_module_command(given);
    // Everything after the first "--" is the command, untouched by option parsing.
    const auto dashes = std::find(args.begin(), args.end(), "--");
    const std::vector<std::string> options(args.begin(), dashes);
    RawLaunchOptions raw;
    if (dashes != args.end()) raw.command.assign(dashes + 1, args.end());
    raw.accelerate_total = accelerate_total(options);
    if (const std::string why = foreign_usage(options); !why.empty()) return usage_error(result, why);

    CommandApp c(raw, result, help_width(env));
    if (!parse_options(c, options, result)) return result;
    if (c.env->parsed()) {
        result.action = CommandLine::Action::kEnv;
        return result;
    }
    if (c.compare->parsed()) return compare_command(c, raw, result);
    const bool serve = c.serve->parsed(), warm = c.warm_ranks->parsed();
    if (warm) result.serve.root = c.warm_dir;
    if (serve) {
        if (!c.stray.empty() || !raw.command.empty() || !c.prompt_texts.empty())
            return usage_error(result,
                               "serve takes no PROMPTS file, --prompt or command: each request brings its "
                               "prompts (dp-launch serve --model M [options], docs/serve.md)");
        std::string problem = serve_options_from(c.serve_flags, env, result.serve);
        if (problem.empty()) result.serve.job_args = job_args_for_serve(options, problem);
        if (!problem.empty()) return usage_error(result, problem);
    }
    if (const std::string why = stray_problem(c, options, raw, dashes != args.end()); !why.empty())
        return usage_error(result, why);
    // `plan` resolves the same options as the main job; a PROMPTS file is optional (given: the
    // schedules' expected makespans over its prompts).
    const bool prompt_given = !c.prompt_texts.empty();
    if (prompt_given && !c.stray.empty())
        return usage_error(result, "--prompt and the PROMPTS file " +
                                       launcher::utf8_for_display(c.stray.front()) +
                                       ": give one (--prompt is a prompt file of its own)");
    if (prompt_given && !raw.command.empty())
        return usage_error(result, "--prompt is a pipeline option: it makes images, not a command after --");
    const bool job_mode = serve || warm || c.plan->parsed() || c.arguments->parsed() ||
                          (raw.command.empty() && (!c.stray.empty() || prompt_given));
    try {
        result.spec = resolve_launch_spec(raw, env, /*require_command=*/!job_mode);
        if (job_mode) {
            result.job = resolve_job_options(raw, env, c.stray.empty() ? "" : c.stray.front());
            result.job->prompt_texts = c.prompt_texts;
            apply_accelerate_options(result.spec, *result.job);
        } else if (const std::string set = first_job_option_flag(raw); !set.empty()) {
            return usage_error(
                result, set + " is a pipeline option: it needs a PROMPTS file, not a command after --");
        }
    } catch (const launcher::Error& e) {
        usage_error(result, e.what()).exit_code = e.exit_code();
        return result;
    }
    result.action = warm                    ? CommandLine::Action::kWarmRanks
                    : serve                 ? CommandLine::Action::kServe
                    : c.plan->parsed()      ? CommandLine::Action::kPlan
                    : c.arguments->parsed() ? CommandLine::Action::kArguments
                                            : CommandLine::Action::kLaunch;
    return result;
}

int run_command_line(const CommandLine& command_line) {
    // Only a launch starts ranks to forward the job signals to (Note [signals before the ranks
    // start]); any other command acts on them as any program does.
    if (command_line.action != CommandLine::Action::kLaunch &&
        command_line.action != CommandLine::Action::kWarmRanks)
        launcher::release_job_signals();
    try {
        switch (command_line.action) {
            case CommandLine::Action::kPrint:
                std::cout << command_line.message << std::flush;
                return command_line.exit_code;
            case CommandLine::Action::kFail:
                std::cerr << "dp-launch: " << launcher::terminal_safe(command_line.message) << std::endl;
                return command_line.exit_code;
            case CommandLine::Action::kPlan:
                std::cout << (command_line.json
                                  ? describe_plan(command_line.spec, *command_line.job, /*json=*/true)
                                  : launcher::terminal_safe(
                                        describe_plan(command_line.spec, *command_line.job)))
                          << std::flush;
                return 0;
            case CommandLine::Action::kArguments:
                std::cout << describe_arguments(*command_line.job, command_line.json) << std::flush;
                return 0;
            case CommandLine::Action::kCompare:
                return run_compare(command_line.compare, std::cout);
            case CommandLine::Action::kWarmRanks: {
                launcher::LaunchSpec spec = command_line.spec;
                spec.command = {launcher::self_dir() + "/dp-worker", "--pool", command_line.serve.root};
                return launcher::run_launch(spec);
            }
            case CommandLine::Action::kServe:
                return run_serve(command_line.spec, *command_line.job, command_line.serve);
            case CommandLine::Action::kEnv:
                std::cout << describe_environment(command_line.json) << std::flush;
                return 0;
            case CommandLine::Action::kLaunch:
                launcher::stop_if_signalled();
                if (!command_line.spec.dry_run) launcher::open_launcher_log(command_line.spec);
                // What the scheduler's allocation made of the job (Note [cluster shapes]).
                if (!command_line.spec.cluster_report.empty() && !command_line.spec.quiet)
                    launcher::Terminal::instance().write_own(STDERR_FILENO,
                                                             command_line.spec.cluster_report + "\n");
                if (command_line.job) return launcher::run_job(command_line.spec, *command_line.job);
                if (command_line.spec.dry_run) {
                    std::cout << launcher::describe_dry_run(command_line.spec) << std::flush;
                    return 0;
                }
                return launcher::run_launch(command_line.spec);
        }
    } catch (const launcher::Error& e) {
        launcher::Terminal::instance().say(launcher::terminal_safe(e.what()));
        return e.exit_code();
    } catch (const std::exception& e) {
        std::cerr << "dp-launch: internal error: " << launcher::terminal_safe(e.what()) << std::endl;
    }
    return launcher::kExitInternal;
}

}  // namespace dp::cli
