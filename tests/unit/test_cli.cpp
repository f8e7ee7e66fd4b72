#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <tuple>

#include "cli/accelerate_options.h"
#include "cli/command_line.h"
#include "cli/help_format.h"
#include "cli/launch_options.h"
#include "cli/option_groups.h"
#include "launcher/errors.h"
#include "launcher/job.h"
#include "launcher/prompt_file.h"
#include "launcher/system_info.h"
#include "protocol/errors.h"
#include "protocol/job_file.h"
#include "support/test_paths.h"

#include "unit/fake_env.h"
#include "unit/st_writer.h"

using dp::cli::CommandLine;
using dp::test::FakeEnv;
using dp::test::parse;

namespace {

std::string temp_path(const std::string& name) {
    return "/tmp/dp_launch_test_" + std::to_string(getpid()) + "_" + name;
}

std::string write_temp(const std::string& name, const std::string& text) {
    const std::string path = temp_path(name);
    std::ofstream(path) << text;
    return path;
}

// `text` with each run of white space (a line break and the next line's indent included) as one space.
std::string squeezed(const std::string& text) {
    std::string out;
    for (char c : text) {
        const bool space = c == ' ' || c == '\n';
        if (!(space && (out.empty() || out.back() == ' '))) out += space ? ' ' : c;
    }
    return out;
}

// An environment whose --help is as wide as it gets, so that a choice list stays on its flag's line.
FakeEnv wide_help() {
    FakeEnv env;
    env.vars["COLUMNS"] = "120";
    return env;
}

}  // namespace

// The table tests: every row of every table, checked from what parse_command_line makes of it.

namespace {

using dp::cli::DefaultKind;
using dp::cli::OptionDef;
using dp::cli::OptionKind;

// A row of either table, and how to read its field back from a parsed command line.
struct TableRow {
    const OptionDef* def;
    std::function<std::string(const CommandLine&)> field;
    std::string default_field;  // the field of a default-constructed target
};

std::vector<TableRow> every_table_row() {
    std::vector<TableRow> rows;
    for (const auto* table : {&dp::cli::launch_option_table(), &dp::cli::accelerate_option_table()})
        for (const auto& r : *table)
            rows.push_back({&r, [&r](const CommandLine& c) { return r.get(c.spec); }, r.get({})});
    for (const auto& r : dp::cli::job_option_table())
        rows.push_back(
            {&r, [&r](const CommandLine& c) { return c.job ? r.get(*c.job) : "(no job)"; }, r.get({})});
    return rows;
}

// Settings every row's value needs from the others: several nodes (so any node rank up to 3 fits),
// and so an address and a port. The row under test is left out of them, and when it is the address or
// the port, so are the nodes.
std::vector<std::string> context_for(const OptionDef& def, const std::string& nnodes = "4") {
    const bool one_node = def.key == "master_addr" || def.key == "master_port" || def.key == "standalone";
    std::vector<std::string> args;
    if (def.key == "revision") args.push_back("--model=org/tiny");  // in fake_hub_cache()
    for (auto [key, value] : {std::pair<std::string, std::string>{"nnodes", one_node ? "" : nnodes},
                              {"master_addr", "node0"},
                              {"master_port", "29500"}})
        if (key != def.key && !value.empty()) args.push_back("--" + key + "=" + value);
    return args;
}

// Where resolve_row writes its config file.
std::string config_path() { return temp_path("table.json"); }

// A Hugging Face cache holding org/tiny at main, v1, v2 and v3, each its own snapshot.
std::string fake_hub_cache() {
    static const std::string dir = [] {
        const std::string cache = temp_path("hub");
        const std::string repo = cache + "/models--org--tiny";
        std::filesystem::create_directories(repo + "/refs");
        const std::vector<std::string> refs = {"main", "v1", "v2", "v3"};
        for (std::size_t i = 0; i < refs.size(); ++i) {
            const std::string commit = std::string(39, 'a') + static_cast<char>('0' + i);
            std::filesystem::create_directories(repo + "/snapshots/" + commit);
            std::ofstream(repo + "/snapshots/" + commit + "/model_index.json") << "{}";
            std::ofstream(repo + "/refs/" + refs[i]) << commit;
        }
        return cache;
    }();
    return dir;
}

// A main job on p.txt, with the row set from the sources given (nullopt: not set there). A config
// value is written as a JSON number when `config_as_number`.
CommandLine resolve_row(const OptionDef& def, std::optional<std::string> flag, std::optional<std::string> env,
                        std::optional<std::string> config, bool config_as_number = false,
                        std::vector<std::string> args = {}) {
    if (args.empty()) args = context_for(def);
    FakeEnv fake;
    fake.vars["HF_HUB_CACHE"] = fake_hub_cache();
    if (flag) args.push_back(def.long_flag + "=" + *flag);
    if (env) fake.vars[def.env] = *env;
    if (config) {
        nlohmann::json doc = nlohmann::json::object();
        doc[def.key] = config_as_number ? nlohmann::json::parse(*config) : nlohmann::json(*config);
        std::ofstream(config_path()) << doc.dump();
        args.push_back("--config=" + config_path());
    }
    args.push_back("p.txt");
    return parse(args, fake);
}

// Texts each row accepts, to tell the sources apart; the kinds give them, except for text rows whose
// setter checks more.
std::vector<std::string> candidates(const OptionDef& def) {
    switch (def.kind) {
        case OptionKind::kSwitch:
            return {"true", "false"};
        case OptionKind::kInt: {
            std::vector<std::string> out;
            for (long long v = static_cast<long long>(def.lo); v <= def.hi && v < def.lo + 4; ++v)
                out.push_back(std::to_string(v));
            return out;
        }
        case OptionKind::kNumber: {
            std::vector<std::string> out;
            for (double v : {def.lo_excluded ? def.hi : def.lo, def.hi, (def.lo + def.hi) / 2}) {
                std::ostringstream text;
                text << v;
                out.push_back(text.str());
            }
            return out;
        }
        case OptionKind::kU64:
            return {"0", "1", "18446744073709551615"};
        case OptionKind::kChoice:
            // An explicit scheduler needs its variables (test_cluster_env.cpp); these need none.
            if (def.key == "cluster") return {"auto", "none"};
            return def.choices;
        case OptionKind::kText:
            break;
    }
    if (def.key == "gpu_ids") return {"0", "1", "0,1"};
    if (def.key == "local_ranks_filter") return {"0", "1", "0,1"};
    if (def.key == "tee" || def.key == "redirects") return {"0", "3", "0:1,1:2"};
    if (def.key == "skip_guidance_layers") return {"1", "0,2", "3"};
    if (def.key == "cache") return {"first_block_cache:threshold=0.1", "none", "first_block_cache"};
    if (def.key == "scheduler") return {"heun", "dpm++-2m", "unipc"};
    if (def.key == "scheduler_config")
        return {"{\"shift\":2.0}", "{\"shift\":3.0}", "{\"use_karras_sigmas\":true}"};
    if (def.key == "sigmas") return {"1,0.5", "0.9,0.4", "0.8"};
    if (def.key == "timesteps") return {"999,500", "900,400", "800"};
    if (def.key == "revision") return {"v1", "v2", "v3"};  // branches of the fake cache's org/tiny
    if (def.key == "preset") return {"hyper-sd3-8step", "flux-turbo-alpha", "qwen-image-lightning-4step"};
    if (def.key == "scheduler") return {"euler", "heun", "unipc"};
    if (def.key == "scheduler_config")
        return {"{\"shift\":2}", "{\"shift\":3}", "{\"use_karras_sigmas\":true}"};
    if (def.key == "sigmas") return {"0.9", "0.9,0.5", "1,0.5,0.25"};
    if (def.key == "timesteps") return {"900", "900,500", "999,500,250"};
    if (def.key == "model") {
        std::vector<std::string> out;
        for (const char* name : {"model_a", "model_b", "model_c"}) {
            const std::string dir = temp_path(name);
            std::filesystem::create_directories(dir);
            std::ofstream(dir + "/model_index.json") << "{}";
            out.push_back(dir);
        }
        return out;
    }
    return {"a", "b", "c"};
}

// Fields that another row's value changes on purpose: -n auto counts --gpu-ids, and --revision
// picks --model's snapshot.
bool depends_on(const std::string& key, const std::string& other) {
    return (key == "num_processes" && other == "gpu_ids") || (key == "model" && other == "revision") ||
           ((key == "master_addr" || key == "master_port") && other == "rdzv_endpoint") ||
           (key == "dtype" && other == "mixed_precision") || (key == "device" && other == "cpu") ||
           (key == "mixed_precision" && other == "dtype") || (key == "cpu" && other == "device");
}

std::string join(const std::vector<std::string>& items, const std::string& separator) {
    std::string out;
    for (const std::string& item : items) out += (out.empty() ? "" : separator) + item;
    return out;
}

}  // namespace

TEST_CASE("the table tests cover every table of the program: launch, accelerate, pipeline and --config") {
    std::set<const OptionDef*> tested;
    for (const TableRow& row : every_table_row()) CHECK(tested.insert(row.def).second);
    tested.insert(&dp::cli::config_option());
    const auto& all = dp::cli::all_option_defs();
    CHECK(std::set<const OptionDef*>(all.begin(), all.end()) == tested);
    CHECK(all.size() == tested.size());

    // Everything registered on the command line is one of them.
    CLI::App app;
    dp::cli::RawLaunchOptions raw;
    dp::cli::add_launch_options(app, raw);
    std::size_t registered = 0;
    for (const CLI::Option* opt : app.get_options()) {
        if (opt->get_name() == "--help") continue;
        ++registered;
        CHECK_MESSAGE(std::any_of(all.begin(), all.end(),
                                  [&](const OptionDef* d) { return raw.options.at(d->key) == opt; }),
                      opt->get_name());
    }
    CHECK(registered == all.size());
}

TEST_CASE("no flag, environment twin or config key appears twice across the tables") {
    std::map<std::string, std::string> flags, envs, config_names;  // -> the key of the row that has it
    for (const OptionDef* def : dp::cli::all_option_defs()) {
        CAPTURE(def->key);
        CHECK_MESSAGE(envs.emplace(def->env, def->key).second, def->env);
        CHECK(def->env.rfind("DP_", 0) == 0);
        CHECK(def->help.size() > 10);
        CHECK(def->long_flag.rfind("--", 0) == 0);
        std::stringstream names(def->flags);
        for (std::string name; std::getline(names, name, ',');) {
            CHECK_MESSAGE(flags.emplace(name, def->key).second, name);
            if (name.rfind("--", 0) != 0) continue;
            std::string spelling = name.substr(2);
            std::replace(spelling.begin(), spelling.end(), '-', '_');
            // A config key names one row, in whichever spelling.
            auto [at, fresh] = config_names.emplace(spelling, def->key);
            CHECK_MESSAGE((fresh || at->second == def->key), spelling);
        }
        CHECK(config_names.count(def->key) == 1);
    }
    CHECK(envs.size() == dp::cli::all_option_defs().size());
}

TEST_CASE("--help renders every row's range, choices and default from the row, never by hand") {
    const CommandLine help = parse({"--help"}, wide_help());
    REQUIRE(help.action == CommandLine::Action::kPrint);
    CHECK(help.message.find("Examples:") != std::string::npos);
    // Wrapped: the words of each row's text, whatever lines they fall on.
    const std::string words = squeezed(help.message);
    CHECK_MESSAGE(words.find(squeezed(dp::cli::config_option().help_text())) != std::string::npos,
                  dp::cli::config_option().help_text());
    for (const TableRow& row : every_table_row()) {
        const OptionDef& def = *row.def;
        CAPTURE(def.key);
        const std::string text = def.help_text();
        CHECK_MESSAGE(words.find(squeezed(text)) != std::string::npos, text);
        CHECK(text.find("[env: " + def.env + "]") != std::string::npos);

        std::string range;
        if (def.kind == OptionKind::kInt)
            range = std::to_string(static_cast<long long>(def.lo)) + " to " +
                    std::to_string(static_cast<long long>(def.hi));
        if (def.kind == OptionKind::kNumber) {
            std::ostringstream out;
            out << (def.lo_excluded ? "above " : "") << def.lo << " to " << def.hi
                << (def.unit.empty() ? "" : " ") << def.unit;
            range = out.str();
        }
        if (def.kind == OptionKind::kU64) range = "0 to 18446744073709551615";
        if (!range.empty()) {
            CHECK_MESSAGE(text.find("[" + range + "]") != std::string::npos, text);
            CHECK_MESSAGE(def.help.find(" to " + range.substr(range.find(" to ") + 4)) == std::string::npos,
                          "the range is written by hand: " << def.help);
        }
        if (def.kind == OptionKind::kChoice) {
            CHECK(def.value_name == join(def.choices, "|"));
            // The choices follow the row's flags on its line of --help.
            std::size_t at = help.message.find("\n  " + def.long_flag + " ");
            if (at == std::string::npos) at = help.message.find("\n  " + def.long_flag + ",");
            REQUIRE(at != std::string::npos);
            const std::string line = help.message.substr(at + 1, help.message.find('\n', at + 1) - at - 1);
            CHECK_MESSAGE(line.find(" " + def.value_name) != std::string::npos, line);
            CHECK_MESSAGE(def.help.find(join(def.choices, "|")) == std::string::npos, def.help);
            CHECK_MESSAGE(def.help.find(join(def.choices, ", ")) == std::string::npos, def.help);
        }

        std::string lower = def.help;
        for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        CHECK_MESSAGE(lower.find("default") == std::string::npos,
                      "the default is written by hand: " << def.help);
        const std::string shown =
            def.default_kind == DefaultKind::kTarget ? row.default_field : def.default_text;
        if (shown.empty()) {
            CHECK(text.find("[default:") == std::string::npos);
        } else {
            CHECK_MESSAGE(text.find("[default: " + shown + "]") != std::string::npos, text);
        }
    }
}

TEST_CASE("the default --help shows is the default applied") {
    for (const TableRow& row : every_table_row()) {
        const OptionDef& def = *row.def;
        CAPTURE(def.key);
        const CommandLine unset = resolve_row(def, std::nullopt, std::nullopt, std::nullopt);
        REQUIRE_MESSAGE(unset.action == CommandLine::Action::kLaunch, unset.message);
        if (def.default_kind == DefaultKind::kApplied) {
            REQUIRE(!def.default_text.empty());
        } else {
            // Nothing set: the field keeps the target's own default.
            CHECK(row.field(unset) == row.default_field);
        }
        if (def.default_kind == DefaultKind::kDescribed || def.default_text.empty()) continue;
        const CommandLine given = resolve_row(def, def.default_text, std::nullopt, std::nullopt);
        REQUIRE_MESSAGE(given.action == CommandLine::Action::kLaunch, given.message);
        CHECK(row.field(given) == row.field(unset));
    }
}

TEST_CASE("every row refuses what it does not accept, from the flag, the environment and the config") {
    for (const TableRow& row : every_table_row()) {
        const OptionDef& def = *row.def;
        CAPTURE(def.key);
        struct Bad {
            std::string text;
            bool json_number;
        };
        std::vector<Bad> bads;
        std::string accepted;
        switch (def.kind) {
            case OptionKind::kInt:
                bads = {{std::to_string(static_cast<long long>(def.lo) - 1), true},
                        {std::to_string(static_cast<long long>(def.hi) + 1), true},
                        {"x", false},
                        {"1.5", false}};
                accepted = "a whole number from " + std::to_string(static_cast<long long>(def.lo)) + " to " +
                           std::to_string(static_cast<long long>(def.hi));
                break;
            case OptionKind::kNumber:
                bads = {{std::to_string(static_cast<long long>(def.lo) - 1), true},
                        {std::to_string(static_cast<long long>(def.hi) + 1), true},
                        {"x", false}};
                if (def.lo_excluded) bads.push_back({std::to_string(static_cast<long long>(def.lo)), true});
                accepted = " to " + std::to_string(static_cast<long long>(def.hi));
                break;
            case OptionKind::kU64:
                bads = {{"-1", false}, {"18446744073709551616", false}, {"x", false}};
                accepted = "a whole number from 0 to 18446744073709551615";
                break;
            case OptionKind::kChoice:
                bads = {{"x", false}, {def.choices.back() + " ", false}};
                accepted = "expected one of " + join(def.choices, ", ");
                break;
            case OptionKind::kSwitch:
                bads = {{"maybe", false}, {"2", false}};
                accepted = "expected true or false (also 1/0, yes/no, on/off)";
                break;
            case OptionKind::kText:
                continue;  // its own checks: see "every invalid value is a one-line usage error"
        }
        for (const Bad& bad : bads) {
            CAPTURE(bad.text);
            const std::string path = config_path();
            const std::vector<std::pair<std::string, CommandLine>> tries = {
                {def.long_flag, resolve_row(def, bad.text, std::nullopt, std::nullopt)},
                {def.env, resolve_row(def, std::nullopt, bad.text, std::nullopt)},
                {path + ": " + def.key,
                 resolve_row(def, std::nullopt, std::nullopt, bad.text, bad.json_number)},
            };
            for (const auto& [source, r] : tries) {
                CAPTURE(source);
                CHECK(r.action == CommandLine::Action::kFail);
                CHECK(r.exit_code == 2);
                CHECK_MESSAGE(r.message.find(source + " '" + bad.text + "'") != std::string::npos, r.message);
                CHECK_MESSAGE(r.message.find(accepted) != std::string::npos, r.message);
                CHECK(r.message.find('\n') == std::string::npos);
            }
        }
        // The ends of a range are accepted (node ranks up to 65535 need as many nodes).
        if (def.kind == OptionKind::kInt || def.kind == OptionKind::kNumber) {
            const auto args = context_for(def, def.key == "node_rank" ? "65536" : "4");
            for (double end : {def.lo, def.hi}) {
                if (end == def.lo && def.lo_excluded) continue;  // tried as a bad value above
                std::ostringstream text;
                text << std::fixed << std::setprecision(0) << end;
                const CommandLine r = resolve_row(def, text.str(), std::nullopt, std::nullopt, false, args);
                CHECK_MESSAGE(r.action == CommandLine::Action::kLaunch, r.message);
                CHECK(row.field(r) == text.str());
            }
        }
    }
}

TEST_CASE("precedence holds for every row: flag > environment > config file > default") {
    const std::vector<TableRow> rows = every_table_row();
    for (const TableRow& row : rows) {
        const OptionDef& def = *row.def;
        CAPTURE(def.key);
        const CommandLine unset = resolve_row(def, std::nullopt, std::nullopt, std::nullopt);
        REQUIRE_MESSAGE(unset.action == CommandLine::Action::kLaunch, unset.message);

        // Each candidate's value, as the config file sets it; then one per source, each different from
        // the one below it.
        std::vector<std::pair<std::string, std::string>> values;  // text, field
        for (const std::string& text : candidates(def)) {
            const CommandLine r = resolve_row(def, std::nullopt, std::nullopt, text);
            REQUIRE_MESSAGE(r.action == CommandLine::Action::kLaunch, text << ": " << r.message);
            values.emplace_back(text, row.field(r));
        }
        // The first value unlike `unlike`, and if there is one, unlike every one of `rather_unlike`.
        auto pick = [&](const std::string& unlike, const std::vector<std::string>& rather_unlike) {
            for (const auto& v : values)
                if (v.second != unlike &&
                    std::find(rather_unlike.begin(), rather_unlike.end(), v.second) == rather_unlike.end())
                    return v;
            for (const auto& v : values)
                if (v.second != unlike) return v;
            FAIL("no candidate differs from " << unlike);
            return values.front();
        };
        const std::string none = row.field(unset);
        const auto config = pick(none, {});
        const auto env = pick(config.second, {none});
        const auto flag = pick(env.second, {none, config.second});

        auto check = [&](const CommandLine& r, const std::string& wanted) {
            REQUIRE_MESSAGE(r.action == CommandLine::Action::kLaunch, r.message);
            CHECK(row.field(r) == wanted);
        };
        check(resolve_row(def, std::nullopt, env.first, std::nullopt), env.second);
        check(resolve_row(def, std::nullopt, env.first, config.first), env.second);
        check(resolve_row(def, flag.first, std::nullopt, config.first), flag.second);
        check(resolve_row(def, flag.first, env.first, config.first), flag.second);
        const CommandLine flag_only = resolve_row(def, flag.first, std::nullopt, std::nullopt);
        check(flag_only, flag.second);

        // The row sets its own field and no other.
        const CommandLine config_only = resolve_row(def, std::nullopt, std::nullopt, config.first);
        for (const TableRow& other : rows) {
            if (other.def == row.def || depends_on(other.def->key, def.key)) continue;
            CHECK_MESSAGE(other.field(flag_only) == other.field(unset), other.def->key);
            CHECK_MESSAGE(other.field(config_only) == other.field(unset), other.def->key);
        }
    }
}

TEST_CASE("a switch given a value reads it: --overwrite=false is off") {
    for (const std::vector<std::string>& args :
         {std::vector<std::string>{"--overwrite=false", "--skip-invalid=false", "--cfg-parallel=false",
                                   "--dry-run=0", "p.txt"},
          std::vector<std::string>{"--overwrite=no", "--skip-invalid=off", "--cfg-parallel=0",
                                   "--dry-run=false", "--quiet=no", "--no-prefix=off", "p.txt"}}) {
        CAPTURE(args);
        const CommandLine c = parse(args);
        REQUIRE_MESSAGE(c.action == CommandLine::Action::kLaunch, c.message);
        CHECK_FALSE(c.job->overwrite);
        CHECK_FALSE(c.job->skip_invalid);
        CHECK_FALSE(c.job->cfg_parallel);
        CHECK_FALSE(c.spec.dry_run);
        CHECK_FALSE(c.spec.quiet);
        CHECK(c.spec.prefix_output);
    }
    for (const TableRow& row : every_table_row()) {
        if (row.def->kind != OptionKind::kSwitch) continue;
        const OptionDef& def = *row.def;
        CAPTURE(def.key);
        for (const char* word : {"true", "1", "yes", "on", "TRUE", "false", "0", "no", "off", "Off"}) {
            CAPTURE(word);
            const bool on = std::string("1yesonTRUEtrue").find(word) != std::string::npos;
            const CommandLine r = resolve_row(def, std::string(word), std::nullopt, std::nullopt);
            REQUIRE_MESSAGE(r.action == CommandLine::Action::kLaunch, r.message);
            CHECK(row.field(r) == (on ? "on" : "off"));
            // A flag's value beats a variable that says the opposite.
            const CommandLine over =
                resolve_row(def, std::string(word), std::string(on ? "0" : "1"), std::nullopt);
            CHECK(row.field(over) == (on ? "on" : "off"));
        }
        std::vector<std::string> bare = context_for(def);
        bare.push_back(def.long_flag);
        bare.push_back("p.txt");
        CHECK(row.field(parse(bare)) == "on");
    }
}

TEST_CASE("torchrun and accelerate spellings are accepted") {
    for (auto flag : {"-n", "--num-processes", "--num_processes", "--nproc-per-node", "--nproc_per_node"}) {
        CommandLine c = parse({flag, "3", "--", "true"});
        REQUIRE_MESSAGE(c.action == CommandLine::Action::kLaunch, c.message);
        CHECK(c.spec.num_processes == 3);
    }
    CommandLine c = parse({"--nnodes", "2", "--machine_rank", "1", "--main_process_ip", "10.1.2.3",
                           "--main_process_port", "29501", "-n", "2", "--", "x"});
    REQUIRE_MESSAGE(c.action == CommandLine::Action::kLaunch, c.message);
    CHECK(c.spec.node_rank == 1);
    CHECK(c.spec.master_addr == "10.1.2.3");
    CHECK(c.spec.master_port == 29501);
}

TEST_CASE("everything after -- is the command, untouched") {
    CommandLine c = parse({"-n", "1", "--", "python", "-n", "--help", "--", "x"});
    REQUIRE(c.action == CommandLine::Action::kLaunch);
    CHECK(c.spec.command == std::vector<std::string>{"python", "-n", "--help", "--", "x"});
}

TEST_CASE("precedence: flag > environment > config file > default") {
    const std::string cfg =
        write_temp("prec.json", R"({"num_processes": 4, "max-restarts": 3, "shutdown_grace": 1.5,
                                                      "quiet": true, "gpu_ids": [0, 1, 2, 3]})");
    FakeEnv env;
    env.vars["DP_CONFIG"] = cfg;
    env.vars["DP_NUM_PROCESSES"] = "2";
    env.vars["DP_MAX_RESTARTS"] = "1";

    CommandLine c = parse({"--max-restarts", "0", "--", "true"}, env);
    REQUIRE_MESSAGE(c.action == CommandLine::Action::kLaunch, c.message);
    CHECK(c.spec.max_restarts == 0);                         // flag beats env and config
    CHECK(c.spec.num_processes == 2);                        // env beats config
    CHECK(c.spec.shutdown_grace_s == doctest::Approx(1.5));  // config beats default
    CHECK(c.spec.quiet);
    CHECK(c.spec.gpu_ids == std::vector<int>{0, 1, 2, 3});
    CHECK(c.spec.nnodes == 1);  // default

    // A flag's --config beats DP_CONFIG.
    const std::string other = write_temp("other.json", R"({"shutdown_grace": 7})");
    c = parse({"--config", other, "--", "true"}, env);
    REQUIRE_MESSAGE(c.action == CommandLine::Action::kLaunch, c.message);
    CHECK(c.spec.shutdown_grace_s == doctest::Approx(7));
    CHECK_FALSE(c.spec.quiet);
}

TEST_CASE("switches from the environment") {
    FakeEnv env;
    env.vars["DP_NO_PREFIX"] = "1";
    env.vars["DP_DRY_RUN"] = "yes";
    CommandLine c = parse({"--", "true"}, env);
    REQUIRE(c.action == CommandLine::Action::kLaunch);
    CHECK_FALSE(c.spec.prefix_output);
    CHECK(c.spec.dry_run);
    env.vars["DP_QUIET"] = "loud";
    c = parse({"--", "true"}, env);
    CHECK(c.action == CommandLine::Action::kFail);
    CHECK(c.message.find("DP_QUIET 'loud'") != std::string::npos);
}

TEST_CASE("every invalid value is a one-line usage error naming its source") {
    struct Case {
        std::vector<std::string> args;
        std::string must_name;
    };
    const std::vector<Case> cases = {
        {{"-n", "0", "--", "x"}, "--num-processes '0'"},
        {{"-n", "-3", "--", "x"}, "-n"},
        {{"-n", "100000", "--", "x"}, "--num-processes"},
        {{"-n", "lots", "--", "x"}, "--num-processes 'lots'"},
        {{"--nnodes", "0", "--", "x"}, "--nnodes"},
        {{"--nnodes", "2", "--node-rank", "2", "--master-addr", "h", "--master-port", "1", "--", "x"},
         "--node-rank 2"},
        {{"--node-rank", "1", "--", "x"}, "--node-rank 1: must be below --nnodes 1"},
        {{"--nnodes", "2", "--master-port", "29500", "--", "x"}, "--master-addr"},
        {{"--nnodes", "2", "--master-addr", "h", "--", "x"}, "--master-port"},
        {{"--master-addr", "999.1.1.1", "--", "x"}, "--master-addr '999.1.1.1'"},
        {{"--master-addr", "a b", "--", "x"}, "--master-addr"},
        {{"--master-port", "70000", "--", "x"}, "--master-port '70000'"},
        {{"--master-port", "0", "--", "x"}, "--master-port"},
        {{"--max-restarts", "-1", "--", "x"}, "--max-restarts"},
        {{"--shutdown-grace", "forever", "--", "x"}, "--shutdown-grace"},
        {{"--gpu-ids", "0,0", "--", "x"}, "--gpu-ids"},
        {{"--gpu-ids", "0,1", "-n", "3", "--", "x"}, "--gpu-ids lists only 2"},
        {{"--run-id", "a/b", "--", "x"}, "--run-id"},
        {{"--log-dir", "", "--", "x"}, "--log-dir"},
        {{"--bogus", "--", "x"}, "--bogus"},
        {{"-n"}, "-n"},
        {{"-n", "2"}, "no command given"},
        {{"-n", "2", "--"}, "no command given"},
        {{"python", "train.py"}, "give one PROMPTS file, or put a command after --"},
        {{"--steps", "0", "p.txt"}, "--steps '0': expected a whole number from 1 to 1000"},
        {{"--dtype", "fp64", "p.txt"}, "--dtype 'fp64': expected one of auto, fp32, bf16, fp16"},
        {{"--variant", "fp16/x", "p.txt"}, "--variant 'fp16/x': expected a variant name of letters, digits"},
        {{"--variant", "", "p.txt"}, "--variant '': expected a variant name"},
        {{"--skip-guidance-layers", "7,7", "p.txt"}, "--skip-guidance-layers '7,7': block 7 is listed twice"},
        {{"--skip-guidance-layers", "7,,8", "p.txt"}, "--skip-guidance-layers '7,,8': expected distinct"},
        {{"--skip-guidance-layers", "-1", "p.txt"}, "--skip-guidance-layers '-1': expected distinct"},
        {{"--revision", "v1", "p.txt"},
         "--revision v1: --model shapes-sd3 is a shipped model's name; --revision applies to a Hugging Face "
         "repo"},
        {{"--model", "/nonexistent/dir", "--revision", "v1", "p.txt"},
         "--revision v1: --model /nonexistent/dir is a folder"},
        {{"--model", "org/na me", "p.txt"},
         "--model 'org/na me': no such folder, and not a Hugging Face repo id"},
        {{"--model", "org--x/name", "p.txt"}, "'--' and '..' are not allowed in a repo id"},
        {{"--device", "tpu", "p.txt"}, "--device 'tpu'"},
        {{"--seed", "-1", "p.txt"}, "--seed '-1'"},
        {{"--width", "4", "p.txt"}, "--width '4'"},
        {{"--guidance-scale", "500", "p.txt"}, "--guidance-scale"},
        {{"--model", "m", "--", "python"}, "--model is a pipeline option: it needs a PROMPTS file"},
        {{"a.txt", "b.txt"}, "give one PROMPTS file"},
        {{"plan", "-n", "2", "p.txt", "q.txt"}, "unexpected argument 'q.txt': give one PROMPTS file"},
        {{"--config", "/nonexistent/dp.json", "--", "x"}, "/nonexistent/dp.json"},
        {{"--config", "shapes-sd3", "--", "x"},
         "--config shapes-sd3: --config takes an option file (accelerate's YAML config or a JSON object of "
         "dp-launch options), and shapes-sd3 is a model; to run it, give --model shapes-sd3"},
        {{"--config", "tiny-random-sd3", "plan"}, "tiny-random-sd3 is a model; to run it, give --model"},
        {{"--cache", "first_block_cache:threshold=0.1", "--cache", "none", "p.txt"},
         "--cache is given 2 times ('first_block_cache:threshold=0.1' and 'none'); give it once"},
        {{"--steps", "3", "--steps", "4", "p.txt"}, "--steps is given 2 times ('3' and '4')"},
        {{"-n", "2", "--nproc-per-node", "3", "--", "x"}, "--num-processes is given 2 times ('2' and '3')"},
        {{"--cache", "first_block_cache:threshold=0.1,threshold=0.2", "p.txt"},
         "threshold is given twice ('threshold=0.1' and 'threshold=0.2')"},
    };
    for (const Case& c : cases) {
        CAPTURE(c.args);
        CommandLine r = parse(c.args);
        CHECK(r.action == CommandLine::Action::kFail);
        CHECK(r.exit_code == 2);
        CHECK_MESSAGE(r.message.find(c.must_name) != std::string::npos, r.message);
        CHECK(r.message.find('\n') == std::string::npos);
    }
}

TEST_CASE("a corrupt or wrong config file is a usage error naming the file and key") {
    struct Case {
        std::string text;
        std::string must_name;
    };
    const std::vector<Case> cases = {
        {"{\"num_processes\": ", "not valid JSON"},
        {"[1, 2]", "expected a JSON object"},
        {"{\"num_procs\": 2}", "unknown key 'num_procs' (accepted: "},
        {"{\"num_proceses\": 2}", "unknown key 'num_proceses' (did you mean 'num_processes'?) (accepted: "},
        {"{\"num_processes\": {\"a\": 1}}", "num_processes: expected a string, number or boolean"},
        {"{\"num_processes\": 0}", ": num_processes '0'"},
        {"{\"quiet\": \"sometimes\"}", ": quiet 'sometimes'"},
        {"{\"gpu_ids\": [0, \"x\"]}", "gpu_ids: expected a list"},
        {"{\"config\": \"x.json\"}", "unknown key 'config'"},
        {"{\"num_processes\": 2, \"nproc_per_node\": 3}", "' set the same option; give it once"},
        {"{\"rank_timeout\": 5, \"rank-timeout\": 6}", "rank_timeout '5' and "},
        {std::string("\xff\xfe{}", 4), "not valid JSON"},
        {"", "not valid JSON"},
    };
    for (const Case& c : cases) {
        CAPTURE(c.text);
        const std::string path = write_temp("bad.json", c.text);
        CommandLine r = parse({"--config", path, "--", "true"});
        CHECK(r.action == CommandLine::Action::kFail);
        CHECK(r.exit_code == 2);
        CHECK_MESSAGE(r.message.find(c.must_name) != std::string::npos, r.message);
        CHECK_MESSAGE(r.message.find(path) != std::string::npos, r.message);
    }
}

TEST_CASE("the main job's pipeline options: flags, DP_* twins and config keys, with the same precedence") {
    const std::string cfg = write_temp(
        "job.json", R"({"steps": 3, "guidance_scale": 2.5, "output-dir": "cfg_out", "skip_invalid": true})");
    FakeEnv env;
    env.vars["DP_CONFIG"] = cfg;
    env.vars["DP_SEED"] = "18446744073709551615";
    env.vars["DP_STEPS"] = "5";
    CommandLine c = parse({"-n", "2", "--model", "tiny-random-sd3", "--dtype", "bf16", "--negative-prompt",
                           "blurry", "prompts.jsonl"},
                          env);
    REQUIRE_MESSAGE(c.action == CommandLine::Action::kLaunch, c.message);
    REQUIRE(c.job.has_value());
    CHECK(c.job->prompts == "prompts.jsonl");
    CHECK(c.job->model.size() > 23);
    CHECK(c.job->model.substr(c.job->model.size() - 23) ==
          "/models/tiny-random-sd3");  // found next to the executable
    CHECK(c.job->steps == 5);          // env beats config
    CHECK(c.job->arguments.number("guidance_scale") == doctest::Approx(2.5));
    CHECK(c.job->seed == 18446744073709551615ULL);
    CHECK(c.job->output_dir == "cfg_out");
    CHECK(c.job->skip_invalid);
    CHECK(c.job->dtype == "bf16");
    CHECK(c.job->negative_prompt == "blurry");
    CHECK(c.job->device == "auto");
    CHECK(c.spec.num_processes == 2);
    CHECK(c.spec.command.empty());
    // torch's dtype names, as a script passes torch_dtype, from a flag or a DP_* twin.
    const std::vector<std::pair<std::string, std::string>> torch_names = {
        {"bfloat16", "bf16"},      {"torch.bfloat16", "bf16"}, {"float16", "fp16"},
        {"torch.float16", "fp16"}, {"half", "fp16"},           {"float32", "fp32"},
        {"torch.float32", "fp32"}, {"float", "fp32"}};
    for (const auto& [torch_name, ours] : torch_names) {
        CAPTURE(torch_name);
        CommandLine t = parse({"--dtype", torch_name, "p.txt"});
        REQUIRE_MESSAGE(t.job.has_value(), t.message);
        CHECK(t.job->dtype == ours);
        FakeEnv dtype_env;
        dtype_env.vars["DP_DTYPE"] = torch_name;
        CommandLine e = parse({"p.txt"}, dtype_env);
        REQUIRE_MESSAGE(e.job.has_value(), e.message);
        CHECK(e.job->dtype == ours);
    }
    // Output formats (jpg is jpeg), images per prompt, a random seed drawn once, prompts as flags.
    CommandLine o = parse({"--format", "jpg", "--quality", "80", "--num-images-per-prompt", "4", "--seed",
                           "random", "--prompt", "a red circle", "--prompt", "a blue square"});
    REQUIRE_MESSAGE(o.job.has_value(), o.message);
    CHECK(o.action == CommandLine::Action::kLaunch);
    CHECK(o.job->image_format == "jpeg");
    CHECK(o.job->quality == 80);
    CHECK(o.job->images_per_prompt == 4);
    CHECK(o.job->seed_drawn);
    CHECK(o.job->seed <= 4294967295ULL);
    CHECK(o.job->prompt_texts == std::vector<std::string>{"a red circle", "a blue square"});
    CHECK(o.job->prompts.empty());
    CHECK(parse({"--prompt", "x", "p.txt"}).message.find("--prompt and the PROMPTS file p.txt: give one") !=
          std::string::npos);
    CHECK(parse({"-n", "2", "--prompt", "x", "--", "python3", "t.py"}).exit_code == 2);
    CHECK(parse({"--format", "gif", "p.txt"}).exit_code == 2);
    CHECK(parse({"--seed", "randomly", "p.txt"}).exit_code == 2);
    CommandLine d = parse({"-"});
    REQUIRE(d.job.has_value());
    CHECK(d.job->prompts == "-");
    CHECK(d.job->image_format == "png");
    CHECK(d.job->images_per_prompt == 1);
    CHECK_FALSE(d.job->seed_drawn);
    CHECK(d.job->output_dir == "outputs");
    CHECK_FALSE(d.job->steps.has_value());  // the model family's default (SD3 28, Qwen-Image 50)
}

TEST_CASE("--version and env") {
    CommandLine v = parse({"--version"});
    CHECK(v.action == CommandLine::Action::kPrint);
    CHECK(v.message.rfind("dp-launch 0.", 0) == 0);
    CHECK(v.message.find(" (commit ") != std::string::npos);  // the tree it was built from
    CommandLine e = parse({"env", "--json"});
    CHECK(e.action == CommandLine::Action::kEnv);
    CHECK(e.json);
    for (const auto& args : std::vector<std::vector<std::string>>{
             {"plan", "--json", "-n", "2"}, {"plan", "-n", "2", "--json"}, {"-n", "2", "plan", "--json"}}) {
        const CommandLine p = parse(args);
        CHECK_MESSAGE(p.action == CommandLine::Action::kPlan, p.message);
        CHECK(p.json);
        CHECK(p.spec.num_processes == 2);
    }
    CHECK_FALSE(parse({"plan", "-n", "2"}).json);
}

// Random argv built from real flags, values near the edges and junk: parsing must always end in a
// launch, a print or a usage error, never an escaping exception or another exit code.
TEST_CASE("fuzz: random argv never escapes the usage-error path") {
    std::vector<std::string> words = {"--",
                                      "-n",
                                      "--nproc-per-node",
                                      "--nnodes",
                                      "--node-rank",
                                      "--master-addr",
                                      "--master-port",
                                      "--gpu-ids",
                                      "--max-restarts",
                                      "--shutdown-grace",
                                      "--log-dir",
                                      "--no-prefix",
                                      "-q",
                                      "--dry-run",
                                      "--config",
                                      "--run-id",
                                      "env",
                                      "--json",
                                      "--help",
                                      "--version",
                                      "0",
                                      "1",
                                      "2",
                                      "-1",
                                      "65536",
                                      "auto",
                                      "999999999999",
                                      "1.5",
                                      "nan",
                                      "",
                                      "x",
                                      "0,1",
                                      "::1",
                                      "[::1]",
                                      "h-1",
                                      "-",
                                      "--=",
                                      "-nq",
                                      "--n",
                                      std::string("\xff\x00z", 3),
                                      std::string(5000, 'a'),
                                      "/dev/null",
                                      "/etc/passwd"};
    std::mt19937 rng(12345);
    int launches = 0, failures = 0;
    for (int trial = 0; trial < 4000; ++trial) {
        std::vector<std::string> args;
        const int n = static_cast<int>(rng() % 9);
        for (int i = 0; i < n; ++i) args.push_back(words[rng() % words.size()]);
        CommandLine r;
        CHECK_NOTHROW(r = parse(args));
        if (r.action == CommandLine::Action::kFail) {
            ++failures;
            CHECK_MESSAGE(r.exit_code == 2, r.message);
            CHECK(!r.message.empty());
        } else if (r.action == CommandLine::Action::kLaunch) {
            ++launches;
            CHECK((!r.spec.command.empty() || r.job.has_value()));
            CHECK(r.spec.num_processes >= 1);
            CHECK(r.spec.num_processes <= 1024);
            CHECK(r.spec.node_rank < r.spec.nnodes);
        } else {
            CHECK(r.exit_code == 0);
        }
    }
    CHECK(launches > 0);
    CHECK(failures > 0);
}

TEST_CASE("pipeline defaults from the environment or a config file do not stop a command run") {
    const std::string cfg = write_temp("pipeline_defaults.json", R"({"steps": 4, "model": "nowhere"})");
    FakeEnv env;
    env.vars["DP_STEPS"] = "4";
    env.vars["DP_WIDTH"] = "not even a number";  // a default nothing reads is not checked
    for (const std::vector<std::string>& args :
         {std::vector<std::string>{"--", "true"}, std::vector<std::string>{"--config", cfg, "--", "true"}}) {
        CAPTURE(args);
        const CommandLine c = parse(args, env);
        CHECK_MESSAGE(c.action == CommandLine::Action::kLaunch, c.message);
        CHECK_FALSE(c.job.has_value());
    }
    env.vars["DP_CONFIG"] = cfg;
    CHECK(parse({"--", "true"}, env).action == CommandLine::Action::kLaunch);
    // A pipeline flag on the command line still is an error there.
    const CommandLine flag = parse({"--steps", "4", "--", "true"}, env);
    CHECK(flag.action == CommandLine::Action::kFail);
    CHECK(flag.exit_code == 2);
    CHECK(flag.message.find("--steps is a pipeline option") != std::string::npos);
}

TEST_CASE("a config file with a key twice, a number a double cannot hold or deep nesting is a usage error") {
    struct Case {
        std::string text;
        std::string must_name;
    };
    const std::vector<Case> cases = {
        {R"({"num_processes": 1e309})", "not valid JSON: number overflow parsing '1e309'"},
        {R"({"shutdown_grace": -1e999})", "number overflow parsing '-1e999'"},
        {R"({"num_processes": 2, "num_processes": 3})", "key 'num_processes' is given twice"},
        {R"({"log_dir": "a", "gpu_ids": [0], "log_dir": "b"})", "key 'log_dir' is given twice"},
        {"{\"run_id\": " + std::string(100, '[') + std::string(100, ']') + "}", "nested deeper than 64"},
        {std::string(300000, '['), "nested deeper than 64"},
        {"{\"log_dir\": \"\xff\"}", "not valid JSON"},
    };
    for (const Case& c : cases) {
        CAPTURE(c.text.substr(0, 80));
        const std::string path = write_temp("strict.json", c.text);
        for (const bool from_env : {false, true}) {
            FakeEnv env;
            std::vector<std::string> args = {"--", "true"};
            if (from_env)
                env.vars["DP_CONFIG"] = path;
            else
                args.insert(args.begin(), {"--config", path});
            CommandLine r;
            REQUIRE_NOTHROW(r = parse(args, env));
            CHECK(r.action == CommandLine::Action::kFail);
            CHECK(r.exit_code == 2);
            CHECK_MESSAGE(r.message.find(path + ": ") != std::string::npos, r.message);
            CHECK_MESSAGE(r.message.find(c.must_name) != std::string::npos, r.message);
            CHECK(r.message.find('\n') == std::string::npos);
        }
    }
}

// Config files built from keys, values near every edge and junk, then mutated byte by byte: reading
// one must always end in a launch or a usage error, never an escaping exception or another code.
TEST_CASE("fuzz: random and mutated config files never escape the usage-error path") {
    const std::vector<std::string> keys = {"num_processes",
                                           "nnodes",
                                           "node_rank",
                                           "master_addr",
                                           "master_port",
                                           "gpu_ids",
                                           "max_restarts",
                                           "shutdown_grace",
                                           "log_dir",
                                           "run_id",
                                           "quiet",
                                           "dry_run",
                                           "no-prefix",
                                           "steps",
                                           "width",
                                           "seed",
                                           "guidance_scale",
                                           "model",
                                           "dtype",
                                           "negative_prompt",
                                           "skip_invalid",
                                           "collective_timeout",
                                           "config",
                                           "bogus",
                                           "",
                                           "num_processes\u00e9",
                                           "\xff"};
    const std::vector<std::string> values = {"1",
                                             "0",
                                             "-1",
                                             "2",
                                             "1024",
                                             "1025",
                                             "1e309",
                                             "-1e309",
                                             "1e-400",
                                             "1.5",
                                             "18446744073709551616",
                                             "99999999999999999999999999999999",
                                             "-0",
                                             "true",
                                             "false",
                                             "null",
                                             "\"auto\"",
                                             "\"\"",
                                             "\"x\\u0000y\"",
                                             "\"\\ud800\"",
                                             "\"\xff\xfe\"",
                                             "\"\xc3\xa9\"",
                                             "[0, 1]",
                                             "[0, \"x\"]",
                                             "[1e309]",
                                             "[[[[[[[[[[]]]]]]]]]]",
                                             "{\"a\": 1}",
                                             "{}",
                                             "[]",
                                             "\"yes\"",
                                             "\"0,0\"",
                                             "\"::1\"",
                                             "\"fp64\"",
                                             "\"/nonexistent\"",
                                             "\"" + std::string(70000, 'a') + "\"",
                                             std::string(200, '[') + std::string(200, ']')};
    const std::vector<std::string> junk = {"{",
                                           "}",
                                           "[",
                                           "]",
                                           ",",
                                           ":",
                                           "\"",
                                           "\\",
                                           "\xff",
                                           "\xc0\xaf",
                                           "\xef\xbb\xbf",
                                           std::string(1, '\0'),
                                           "e999",
                                           "1e",
                                           "-",
                                           " "};
    std::mt19937 rng(4242);
    const std::string path = temp_path("fuzz.json");
    int launches = 0, failures = 0;
    for (int trial = 0; trial < 1500; ++trial) {
        std::string text = "{";
        const int n = static_cast<int>(rng() % 5);
        for (int i = 0; i < n; ++i) {
            // Now and then a key again, to give duplicates.
            const std::string& key = keys[rng() % keys.size()];
            text += (i ? ", " : "") +
                    nlohmann::json(key).dump(-1, ' ', false, nlohmann::json::error_handler_t::ignore) + ": " +
                    values[rng() % values.size()];
        }
        text += "}";
        const int mutations = trial % 3 == 0 ? 0 : static_cast<int>(rng() % 4);
        for (int m = 0; m < mutations; ++m) {
            const std::size_t at = rng() % (text.size() + 1);
            switch (rng() % 3) {
                case 0:
                    text.insert(at, junk[rng() % junk.size()]);
                    break;
                case 1:
                    if (at < text.size()) text.erase(at, 1 + rng() % 8);
                    break;
                default:
                    if (at < text.size()) text[at] = static_cast<char>(rng() % 256);
            }
        }
        std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
        FakeEnv env;
        std::vector<std::string> args;
        if (trial % 2) {
            env.vars["DP_CONFIG"] = path;
        } else {
            args = {"--config", path};
        }
        if (trial % 4 < 2) {
            args.insert(args.end(), {"--", "true"});
        } else {
            args.push_back("p.txt");
        }
        CAPTURE(text.substr(0, 200));
        CommandLine r;
        CHECK_NOTHROW(r = parse(args, env));
        if (r.action == CommandLine::Action::kFail) {
            ++failures;
            // A usage error, or a model the file names that is not there (missing input).
            CHECK_MESSAGE(
                (r.exit_code == 2 || (r.exit_code == 66 && r.message.find(": model ") != std::string::npos)),
                r.message);
            CHECK(!r.message.empty());
            CHECK(r.message.find('\n') == std::string::npos);
        } else {
            ++launches;
            CHECK(r.action == CommandLine::Action::kLaunch);
            CHECK(r.exit_code == 0);
        }
    }
    CHECK(launches > 0);
    CHECK(failures > 0);
}

TEST_CASE("bytes that are not UTF-8: a usage error in prompt text, and paths that simply work") {
    // Prompt text is text: the flag or variable is named.
    const CommandLine flag = parse({"--negative-prompt", "blur \xff", "p.txt"});
    CHECK(flag.action == CommandLine::Action::kFail);
    CHECK(flag.exit_code == 2);
    CHECK(flag.message.find("--negative-prompt: expected UTF-8 text") != std::string::npos);
    FakeEnv env;
    env.vars["DP_NEGATIVE_PROMPT"] = "\xc0\xaf";
    const CommandLine var = parse({"p.txt"}, env);
    CHECK(var.exit_code == 2);
    CHECK(var.message.find("DP_NEGATIVE_PROMPT: expected UTF-8 text") != std::string::npos);
    CHECK(parse({"--negative-prompt",
                 "flou, d\xc3\xa9"
                 "form\xc3\xa9",
                 "p.txt"})
              .action == CommandLine::Action::kLaunch);

    // Paths are bytes: the job file carries any of them to the worker unchanged.
    dp::protocol::JobFile job;
    job.family = "sd3";
    job.model_dir =
        "/tmp/mod\xff\xfe"
        "el";
    job.output_dir = "out/\xc3\x28";
    dp::protocol::JobRequest request;
    request.file = "00000-x.png";
    request.prompt = "x";
    job.requests.push_back(request);
    const std::string path = temp_path("paths.json");
    dp::protocol::write_job_file(path, job);
    const dp::protocol::JobFile back = dp::protocol::read_job_file(path);
    CHECK(back.model_dir == job.model_dir);
    CHECK(back.output_dir == job.output_dir);
    job.model_dir = "/tmp/mod\xc3\xa9le";  // UTF-8 stays a plain string
    dp::protocol::write_job_file(path, job);
    CHECK(dp::launcher::utf8_for_display(path) == path);
    CHECK(nlohmann::json::parse(std::ifstream(path)).at("model_dir") == job.model_dir);
    CHECK(dp::protocol::read_job_file(path).model_dir == job.model_dir);
    std::filesystem::remove(path);

    // The whole main job, as far as it goes without starting a rank, on a model folder and a prompt
    // file whose names are not UTF-8.
    const std::string dir = temp_path("bytes\xff");
    std::filesystem::create_directories(dir);
    const std::string model = dir + "/model\xfe";
    std::filesystem::create_directory_symlink(dp::launcher::resolve_model("tiny-random-sd3", "test"), model);
    const std::string prompts = write_temp("prompts\xff.txt", "one\ntwo\n");
    const CommandLine c = parse({"--dry-run", "-q", "--model", model, "-o", dir + "/out\xfd", prompts});
    REQUIRE_MESSAGE(c.action == CommandLine::Action::kLaunch, c.message);
    CHECK(dp::cli::run_command_line(c) == 0);
    // An adapter and a component file whose paths are not UTF-8: recorded as path_hex, never an
    // internal error.
    const std::string adapter =
        dp::test::write_st_file(dir + "/adapter\xfb.safetensors",
                                {{"transformer.transformer_blocks.0.attn.to_q.lora_A.weight", {2, 32}},
                                 {"transformer.transformer_blocks.0.attn.to_q.lora_B.weight", {32, 2}}});
    std::filesystem::copy_file(model + "/vae/diffusion_pytorch_model.safetensors",
                               dir + "/vae\xfa.safetensors");
    const CommandLine files = parse({"--dry-run", "-q", "--model", model, "--lora", adapter, "--vae",
                                     dir + "/vae\xfa.safetensors", "-o", dir + "/out\xfd", prompts});
    REQUIRE_MESSAGE(files.action == CommandLine::Action::kLaunch, files.message);
    CHECK(dp::cli::run_command_line(files) == 0);
    std::filesystem::remove_all(dir);
    std::filesystem::remove(prompts);
}

TEST_CASE("a PROMPTS file that is a program is refused with the command that was probably meant") {
    const std::string dir = temp_path("programs");
    std::filesystem::create_directories(dir);
    auto file = [&](const std::string& name, const std::string& text, bool executable) {
        const std::string path = dir + "/" + name;
        std::ofstream(path) << text;
        std::filesystem::permissions(
            path, executable ? std::filesystem::perms::owner_all
                             : std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
        return path;
    };
    struct Case {
        std::string path;
        std::string meant;
    };
    const std::vector<Case> cases = {
        {file("train.py", "import torch\nprint(1)\n", false),
         "dp-launch -n 2 -- python3 " + dir + "/train.py"},
        {file("job.sh", "echo hi\n", false), "dp-launch -n 2 -- bash " + dir + "/job.sh"},
        {file("run", "#!/usr/bin/env python3\nprint(1)\n", false),
         "dp-launch -n 2 -- python3 " + dir + "/run"},
        {file("tool", "#!/bin/sh\necho\n", true), "dp-launch -n 2 -- " + dir + "/tool"},
        {file("binary",
              "\x7f"
              "ELF",
              true),
         "dp-launch -n 2 -- " + dir + "/binary"},
    };
    for (const Case& c : cases) {
        CAPTURE(c.path);
        const CommandLine r = parse({"-n", "2", c.path});
        CHECK(r.action == CommandLine::Action::kFail);
        CHECK(r.exit_code == 2);
        CHECK_MESSAGE(r.message.find(c.path + " is ") == 0, r.message);
        CHECK_MESSAGE(r.message.find("not a prompt file") != std::string::npos, r.message);
        CHECK_MESSAGE(r.message.size() >= c.meant.size(), r.message);
        CHECK_MESSAGE(r.message.substr(r.message.size() - c.meant.size()) == c.meant, r.message);
    }
    // The words are quoted for the shell, and the options are kept.
    const std::string spaced = file("my job.py", "print(1)\n", false);
    const CommandLine quoted = parse({"--log-dir", "my logs", spaced});
    CHECK(quoted.message.find("dp-launch --log-dir 'my logs' -- python3 '" + spaced + "'") !=
          std::string::npos);

    // Files named .txt or .jsonl are prompt files, whatever their mode or first line.
    for (const std::string& path :
         {file("prompts.txt", "a red circle\n", false), file("prompts.jsonl", "{\"prompt\": \"x\"}\n", true),
          file("p.txt", "#!not really\n", true), file("plain", "a cat\n", false)}) {
        CAPTURE(path);
        const CommandLine r = parse({"-n", "2", path});
        CHECK_MESSAGE(r.action == CommandLine::Action::kLaunch, r.message);
    }
    std::filesystem::remove_all(dir);
}

TEST_CASE("--help shows the usage lines once, and -q's help says what it silences") {
    const CommandLine help = parse({"--help"}, wide_help());
    REQUIRE(help.action == CommandLine::Action::kPrint);
    const std::string text = squeezed(help.message);
    const std::size_t first = text.find("Usage:");
    REQUIRE(first != std::string::npos);
    CHECK_MESSAGE(text.find("Usage:", first + 1) == std::string::npos, text.substr(0, 600));
    CHECK(text.find("dp-launch [OPTIONS] -- COMMAND [ARGS...]") != std::string::npos);
    CHECK(text.find("except failure reports") != std::string::npos);
    const CommandLine env_help = parse({"env", "--help"});
    CHECK(env_help.message.find("Usage:") != std::string::npos);
}

TEST_CASE("torchrun's flags: each one's effect on the launch") {
    auto ok = [](std::vector<std::string> args) {
        CommandLine c = parse(args);
        REQUIRE_MESSAGE(c.action == CommandLine::Action::kLaunch, c.message);
        return c.spec;
    };
    auto refused = [](std::vector<std::string> args) {
        CommandLine c = parse(args);
        CHECK(c.action == CommandLine::Action::kFail);
        CHECK(c.exit_code == 2);
        CHECK(c.message.find('\n') == std::string::npos);
        return c.message;
    };
    // --standalone: one node, a local store on a free port.
    auto s = ok({"--standalone", "-n", "2", "--", "x"});
    CHECK(s.standalone);
    CHECK(s.nnodes == 1);
    CHECK(s.master_addr.empty());
    CHECK(s.master_port == 0);
    std::string m =
        refused({"--standalone", "--nnodes", "2", "--master-addr", "n0", "--master-port", "1", "--", "x"});
    CHECK(m.find("--standalone") != std::string::npos);
    CHECK(m.find("--nnodes 2") != std::string::npos);

    // --rdzv-endpoint sets rank 0's store; it wins over --master-addr, as in torchrun.
    s = ok({"--rdzv-backend", "c10d", "--rdzv-endpoint", "node7:29400", "--nnodes", "2", "--master-addr",
            "n0", "--", "x"});
    CHECK(s.rdzv_backend == "c10d");
    CHECK(s.master_addr == "node7");
    CHECK(s.master_port == 29400);
    s = ok({"--rdzv_endpoint", "[fe80::1]:29500", "--", "x"});
    CHECK(s.master_addr == "fe80::1");
    CHECK(s.master_port == 29500);
    s = ok({"--rdzv-endpoint", "10.0.0.1", "--master-port", "29501", "--", "x"});
    CHECK(s.master_addr == "10.0.0.1");
    CHECK(s.master_port == 29501);
    m = refused({"--rdzv-backend", "etcd", "--", "x"});
    CHECK(m.find("expected one of c10d, static") != std::string::npos);
    CHECK(refused({"--rdzv-endpoint", "node0:http", "--", "x"}).find("--rdzv-endpoint") != std::string::npos);
    CHECK(ok({"--rdzv-id", "job42", "--", "x"}).run_id == "job42");

    // --nnodes N:N is N; a real range is refused with the reason.
    CHECK(ok({"--nnodes", "2:2", "--master-addr", "n0", "--master-port", "29500", "--", "x"}).nnodes == 2);
    CHECK(ok({"--nnodes", "1:1", "--", "x"}).nnodes == 1);
    m = refused({"--nnodes", "1:2", "--master-addr", "n0", "--master-port", "29500", "--", "x"});
    CHECK(m.find("--nnodes '1:2'") != std::string::npos);
    CHECK(m.find("elastic membership") != std::string::npos);

    // --nproc-per-node cpu: the usable CPUs; gpu: the GPUs given.
    CHECK(ok({"--nproc-per-node", "cpu", "--", "x"}).num_processes ==
          std::clamp(dp::launcher::usable_cpu_count(), 1, 1024));
    CHECK(ok({"--gpu-ids", "0,3", "--nproc-per-node", "gpu", "--", "x"}).num_processes == 2);
    CHECK(refused({"--nproc-per-node", "tpu", "--", "x"}).find("'auto', 'gpu', 'cpu' or a whole number") !=
          std::string::npos);

    // The command, as torchrun runs it.
    CHECK(ok({"--", "train.py", "--lr", "1"}).command ==
          std::vector<std::string>{"python3", "train.py", "--lr", "1"});
    CHECK(ok({"--no-python", "--", "train.py", "--lr", "1"}).command ==
          std::vector<std::string>{"train.py", "--lr", "1"});
    CHECK(ok({"-m", "--", "pkg.train", "--lr", "1"}).command ==
          std::vector<std::string>{"python3", "-m", "pkg.train", "--lr", "1"});
    CHECK(ok({"--run-path", "--", "./job.sh"}).command == std::vector<std::string>{"./job.sh"});
    CHECK(refused({"-m", "--no-python", "--", "pkg"}).find("--module and --no-python") != std::string::npos);

    // Output: --tee and --redirects accepted in torchrun's forms; --local-ranks-filter keeps the ranks named.
    s = ok({"--tee", "3", "--redirects", "0:1,1:2", "--local-ranks-filter", "0,2", "-n", "3", "--", "x"});
    CHECK(s.tee == "3");
    CHECK(s.redirects == "0:1,1:2");
    CHECK(s.shown_local_ranks == std::vector<int>{0, 2});
    CHECK(refused({"--tee", "4", "--", "x"}).find("expected 0 (none)") != std::string::npos);
    CHECK(refused({"--local-ranks-filter", "0,0", "--", "x"}).find("listed twice") != std::string::npos);
    CHECK(ok({"--monitor-interval", "5", "--", "x"}).monitor_interval_s == 5);
}

TEST_CASE("accelerate's flags mean what accelerate means") {
    auto ok = [](std::vector<std::string> args) {
        CommandLine c = parse(args);
        REQUIRE_MESSAGE(c.action == CommandLine::Action::kLaunch, c.message);
        return c;
    };
    // --num_processes with --num_machines is the total over the machines.
    const std::vector<std::string> two = {"--main_process_ip", "n0", "--main_process_port", "29500"};
    auto with = [&](std::vector<std::string> args) {
        args.insert(args.end(), two.begin(), two.end());
        args.insert(args.end(), {"--", "x"});
        return args;
    };
    CommandLine c = ok(with({"--num_processes", "8", "--num_machines", "2", "--machine_rank", "1"}));
    CHECK(c.spec.nnodes == 2);
    CHECK(c.spec.num_processes == 4);
    CHECK(c.spec.world_size() == 8);
    CHECK(ok(with({"--num_processes=6", "--num_machines=3"})).spec.num_processes == 2);
    // Alone, or in dp-launch's spellings, it is per node as before.
    CHECK(ok({"--num_processes", "8", "--", "x"}).spec.num_processes == 8);
    CHECK(ok(with({"--num-processes", "8", "--nnodes", "2"})).spec.num_processes == 8);
    CHECK(ok(with({"-n", "8", "--num_machines", "2"})).spec.num_processes == 8);
    c = parse(with({"--num_processes", "7", "--num_machines", "2"}));
    CHECK(c.action == CommandLine::Action::kFail);
    CHECK(c.exit_code == 2);
    CHECK(c.message.find("--num_processes 7 with --num_machines 2") != std::string::npos);
    CHECK(c.message.find("total") != std::string::npos);

    CHECK(ok({"--multi_gpu", "--", "x"}).spec.multi_gpu);
    CHECK(ok({"--gpu_ids", "all", "--", "x"}).spec.gpu_ids.empty());
    // The main job: bf16 and fp16 are its precision, --cpu its device, unless --dtype or --device
    // say otherwise; accelerate's no (no autocast) and fp8 leave --dtype auto.
    c = ok({"--cpu", "--mixed_precision", "no", "p.txt"});
    CHECK(c.job->device == "cpu");
    CHECK(c.job->dtype == "auto");
    CHECK(ok({"--mixed_precision", "bf16", "p.txt"}).job->dtype == "bf16");
    CHECK(ok({"--mixed-precision", "fp16", "p.txt"}).job->dtype == "fp16");
    CHECK(ok({"--mixed_precision", "fp8", "p.txt"}).job->dtype == "auto");
    CHECK(ok({"--mixed_precision", "bf16", "--dtype", "fp32", "p.txt"}).job->dtype == "fp32");
    CHECK(ok({"--cpu", "--device", "cuda", "p.txt"}).job->device == "cuda");
    CHECK(ok({"p.txt"}).job->device == "auto");
    // A command: exported as accelerate launch exports them (tests/integration: the ranks see them).
    c = ok({"--mixed_precision", "fp8", "--cpu", "--num_cpu_threads_per_process", "3", "--", "x"});
    CHECK(c.spec.mixed_precision == "fp8");
    CHECK(c.spec.use_cpu);
    CHECK(c.spec.cpu_threads_per_process == 3);
}

TEST_CASE("torchrun and accelerate flags and subcommands dp-launch lacks name the dp-launch way") {
    const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
        {{"--rdzv-conf", "timeout=900", "--", "x"}, "--rank-timeout"},
        {{"--role=trainer", "--", "x"}, "RANK"},
        {{"--start-method", "spawn", "--", "x"}, "exec"},
        {{"--fp8_backend", "te", "--", "x"}, "ACCELERATE_FP8_"},
        {{"--use_deepspeed", "--", "x"}, "WORLD_SIZE"},
        {{"config"}, "--config FILE"},
        {{"launch", "--num_processes", "2", "train.py"}, "dp-launch is the launcher itself"},
        {{"test"}, "dp-launch env"},
    };
    for (const auto& [args, hint] : cases) {
        CAPTURE(args);
        const CommandLine c = parse(args);
        CHECK(c.action == CommandLine::Action::kFail);
        CHECK(c.exit_code == 2);
        CHECK_MESSAGE(c.message.find(hint) != std::string::npos, c.message);
    }
}

// Every flag of torchrun (PyTorch 2.15's torch.distributed.run) and of accelerate launch (accelerate
// 1.16), in the '-' spelling, read from their argument parsers: true for a switch.
const std::vector<std::pair<const char*, bool>> kTorchrunFlags = {{"--nnodes", false},
                                                                  {"--nproc-per-node", false},
                                                                  {"--rdzv-backend", false},
                                                                  {"--rdzv-endpoint", false},
                                                                  {"--rdzv-id", false},
                                                                  {"--rdzv-conf", false},
                                                                  {"--standalone", true},
                                                                  {"--max-restarts", false},
                                                                  {"--monitor-interval", false},
                                                                  {"--start-method", false},
                                                                  {"--event-log-handler", false},
                                                                  {"--role", false},
                                                                  {"--module", true},
                                                                  {"-m", true},
                                                                  {"--no-python", true},
                                                                  {"--run-path", true},
                                                                  {"--log-dir", false},
                                                                  {"--redirects", false},
                                                                  {"-r", false},
                                                                  {"--tee", false},
                                                                  {"-t", false},
                                                                  {"--log-line-prefix-template", false},
                                                                  {"--local-ranks-filter", false},
                                                                  {"--duplicate-stdout-filters", false},
                                                                  {"--duplicate-stderr-filters", false},
                                                                  {"--node-rank", false},
                                                                  {"--master-addr", false},
                                                                  {"--master-port", false},
                                                                  {"--local-addr", false},
                                                                  {"--logs-specs", false},
                                                                  {"--numa-binding", false},
                                                                  {"--signals-to-handle", false},
                                                                  {"--shutdown-timeout", false},
                                                                  {"--virtual-local-rank", true},
                                                                  {"--print-completion", false}};
const std::vector<std::pair<const char*, bool>> kAccelerateFlags = {
    {"--config-file", false},
    {"--quiet", true},
    {"-q", true},
    {"--cpu", true},
    {"--multi-gpu", true},
    {"--tpu", true},
    {"--mixed-precision", false},
    {"--num-processes", false},
    {"--num-machines", false},
    {"--num-cpu-threads-per-process", false},
    {"--enable-cpu-affinity", true},
    {"--dynamo-backend", false},
    {"--dynamo-mode", false},
    {"--dynamo-use-fullgraph", true},
    {"--dynamo-use-dynamic", true},
    {"--dynamo-use-regional-compilation", true},
    {"--use-deepspeed", true},
    {"--use-fsdp", true},
    {"--use-parallelism-config", true},
    {"--use-megatron-lm", true},
    {"--gpu-ids", false},
    {"--same-network", true},
    {"--machine-rank", false},
    {"--main-process-ip", false},
    {"--main-process-port", false},
    {"--tee", false},
    {"--log-dir", false},
    {"--role", false},
    {"--rdzv-backend", false},
    {"--rdzv-conf", false},
    {"--max-restarts", false},
    {"--monitor-interval", false},
    {"--module", true},
    {"--no-python", true},
    {"--tpu-cluster", true},
    {"--no-tpu-cluster", true},
    {"--tpu-use-sudo", true},
    {"--vm", false},
    {"--env", false},
    {"--main-training-function", false},
    {"--downcast-bf16", true},
    {"--deepspeed-config-file", false},
    {"--zero-stage", false},
    {"--offload-optimizer-device", false},
    {"--offload-param-device", false},
    {"--offload-optimizer-nvme-path", false},
    {"--offload-param-nvme-path", false},
    {"--gradient-accumulation-steps", false},
    {"--gradient-clipping", false},
    {"--zero3-init-flag", false},
    {"--zero3-save-16bit-model", false},
    {"--deepspeed-hostfile", false},
    {"--deepspeed-exclusion-filter", false},
    {"--deepspeed-inclusion-filter", false},
    {"--deepspeed-multinode-launcher", false},
    {"--deepspeed-moe-layer-cls-names", false},
    {"--fsdp-version", false},
    {"--fsdp-offload-params", false},
    {"--fsdp-min-num-params", false},
    {"--fsdp-sharding-strategy", false},
    {"--fsdp-reshard-after-forward", false},
    {"--fsdp-auto-wrap-policy", false},
    {"--fsdp-transformer-layer-cls-to-wrap", false},
    {"--fsdp-backward-prefetch", false},
    {"--fsdp-state-dict-type", false},
    {"--fsdp-forward-prefetch", false},
    {"--fsdp-use-orig-params", false},
    {"--fsdp-cpu-ram-efficient-loading", false},
    {"--fsdp-sync-module-states", false},
    {"--fsdp-activation-checkpointing", false},
    {"--fsdp-activation-checkpointing-offload", false},
    {"--megatron-lm-tp-degree", false},
    {"--megatron-lm-use-custom-fsdp", false},
    {"--megatron-lm-no-load-optim", false},
    {"--megatron-lm-eod-mask-loss", false},
    {"--megatron-lm-overlap-cpu-optimizer-d2h-h2d", false},
    {"--megatron-lm-no-save-optim", false},
    {"--megatron-lm-optimizer-cpu-offload", false},
    {"--megatron-lm-use-precision-aware-optimizer", false},
    {"--megatron-lm-decoder-last-pipeline-num-layers", false},
    {"--megatron-lm-pp-degree", false},
    {"--megatron-lm-num-micro-batches", false},
    {"--megatron-lm-sequence-parallelism", false},
    {"--megatron-lm-recompute-activations", false},
    {"--megatron-lm-use-distributed-optimizer", false},
    {"--megatron-lm-gradient-clipping", false},
    {"--megatron-lm-recompute-granularity", false},
    {"--megatron-lm-recompute-method", false},
    {"--megatron-lm-recompute-num-layers", false},
    {"--megatron-lm-attention-backend", false},
    {"--megatron-lm-expert-model-parallel-size", false},
    {"--megatron-lm-context-parallel-size", false},
    {"--megatron-lm-attention-dropout", false},
    {"--megatron-lm-hidden-dropout", false},
    {"--megatron-lm-attention-softmax-in-fp32", false},
    {"--megatron-lm-expert-tensor-parallel-size", false},
    {"--megatron-lm-calculate-per-token-loss", false},
    {"--megatron-lm-use-rotary-position-embeddings", false},
    {"--fp8-backend", false},
    {"--fp8-use-autocast-during-eval", true},
    {"--fp8-margin", false},
    {"--fp8-interval", false},
    {"--fp8-format", false},
    {"--fp8-amax-history-len", false},
    {"--fp8-amax-compute-algo", false},
    {"--fp8-override-linear-precision", false},
    {"--fp8-enable-fsdp-float8-all-gather", false},
    {"--fp8-pad-inner-dim", false},
    {"--aws-access-key-id", false},
    {"--aws-secret-access-key", false},
    {"--debug", true},
    {"--mpirun-hostfile", false},
    {"--parallelism-config-dp-replicate-size", false},
    {"--parallelism-config-dp-shard-size", false},
    {"--parallelism-config-tp-size", false},
    {"--parallelism-config-cp-size", false},
    {"--parallelism-config-cp-backend", false},
    {"--parallelism-config-cp-comm-strategy", false},
    {"--parallelism-config-sp-size", false},
    {"--parallelism-config-sp-backend", false},
    {"--parallelism-config-sp-seq-length", false},
    {"--parallelism-config-sp-seq-length-is-variable", false},
    {"--parallelism-config-sp-attn-implementation", false}};

TEST_CASE("every torchrun and accelerate launch flag is taken, or refused with the dp-launch way") {
    // A value each taken flag accepts on one node; a refused flag is refused whatever its value.
    const std::map<std::string, std::string> values = {{"--rdzv-backend", "c10d"},
                                                       {"--rdzv-endpoint", "localhost:29500"},
                                                       {"--node-rank", "0"},
                                                       {"--machine-rank", "0"},
                                                       {"--master-addr", "127.0.0.1"},
                                                       {"--main-process-ip", "127.0.0.1"},
                                                       {"--local-addr", "127.0.0.1"},
                                                       {"--master-port", "29500"},
                                                       {"--main-process-port", "29500"},
                                                       {"--local-ranks-filter", "0"},
                                                       {"--mixed-precision", "bf16"},
                                                       {"--gpu-ids", "0"},
                                                       {"--log-dir", temp_path("logs")},
                                                       {"--config-file", write_temp("empty.json", "{}")},
                                                       {"-r", "0"},
                                                       {"-t", "0"}};
    std::size_t taken = 0, refused = 0;
    for (const auto* list : {&kTorchrunFlags, &kAccelerateFlags}) {
        for (const auto& [dashed, is_switch] : *list) {
            std::string underscored = dashed;
            for (std::size_t i = 2; i < underscored.size(); ++i)
                if (underscored[i] == '-') underscored[i] = '_';
            for (const std::string& flag : {std::string(dashed), underscored}) {
                CAPTURE(flag);
                std::vector<std::string> args = {flag};
                if (!is_switch) args.push_back(values.count(dashed) ? values.at(dashed) : "1");
                args.insert(args.end(), {"--", "x"});
                const CommandLine c = parse(args);
                if (c.action != CommandLine::Action::kFail) {
                    ++taken;
                    continue;
                }
                ++refused;
                CHECK(c.exit_code == 2);
                // Its own answer, not CLI11's "was not expected" nor a suggestion of a lookalike.
                CHECK_MESSAGE(c.message.rfind(flag + " is not a dp-launch option: ", 0) == 0, c.message);
                CHECK(c.message.find("did you mean") == std::string::npos);
                CHECK(c.message.size() > flag.size() + 40);
            }
        }
    }
    CHECK(taken > 40);
    CHECK(refused > 150);
}

TEST_CASE(
    "dp-launch arguments takes --model, the pipeline options and --json, and no PROMPTS file or command") {
    const CommandLine c = parse({"arguments", "--model", "tiny-random-sd3", "--steps", "5", "--json"});
    REQUIRE_MESSAGE(c.action == CommandLine::Action::kArguments, c.message);
    CHECK(c.json);
    REQUIRE(c.job.has_value());
    CHECK(c.job->steps == 5);
    CHECK(c.job->model.find("tiny-random-sd3") != std::string::npos);
    const CommandLine plain = parse({"arguments"});  // the built-in default model
    REQUIRE(plain.action == CommandLine::Action::kArguments);
    CHECK_FALSE(plain.json);
    for (const std::vector<std::string>& bad : {std::vector<std::string>{"arguments", "p.txt"},
                                                std::vector<std::string>{"arguments", "--", "true"}}) {
        const CommandLine r = parse(bad);
        CHECK(r.action == CommandLine::Action::kFail);
        CHECK(r.exit_code == 2);
        CHECK_MESSAGE(r.message.find("arguments takes no PROMPTS file and no command") != std::string::npos,
                      r.message);
    }
    const CommandLine help = parse({"arguments", "--help"});
    CHECK(help.action == CommandLine::Action::kPrint);
    CHECK(help.message.find("--json") != std::string::npos);
}

TEST_CASE("CUDA_VISIBLE_DEVICES must name devices as CUDA reads them, anything else is a usage error") {
    for (const std::string good :
         {"", "0", "0,1", "3, 1", "GPU-8f1e2a3b-1c2d-4e5f-8a9b-0c1d2e3f4a5b",
          "MIG-GPU-8f1e2a3b-1c2d-4e5f-8a9b-0c1d2e3f4a5b/1/0", "MIG-7c4b2a1e-0000-1111-2222-333344445555",
          "-1", "0,-1,garbage", "NoDevFiles"}) {
        CAPTURE(good);
        CHECK(dp::launcher::cuda_visible_devices_problem(good).empty());
        FakeEnv env;
        env.vars["CUDA_VISIBLE_DEVICES"] = good;
        CHECK(parse({"-n", "1", "--", "true"}, env).action == CommandLine::Action::kLaunch);
    }
    for (const std::string bad : {"garbage", "0,garbage", "gpu0", "0,", "1.5", "GPU-", "GPU-xyz"}) {
        CAPTURE(bad);
        CHECK_FALSE(dp::launcher::cuda_visible_devices_problem(bad).empty());
        FakeEnv env;
        env.vars["CUDA_VISIBLE_DEVICES"] = bad;
        const CommandLine c = parse({"-n", "1", "--", "true"}, env);
        CHECK(c.action == CommandLine::Action::kFail);
        CHECK(c.exit_code == 2);
        CHECK(c.message.find("CUDA_VISIBLE_DEVICES=") != std::string::npos);
    }
}

TEST_CASE("torchrun's -m MODULE ARGS without --: the module and what follows are the command") {
    // As torchrun reads it: the same ranks' command as with an explicit --.
    const CommandLine c = parse({"-n", "2", "-m", "mypkg.train", "--epochs", "3", "--lr=0.1"});
    const CommandLine explicit_ = parse({"-n", "2", "-m", "--", "mypkg.train", "--epochs", "3", "--lr=0.1"});
    REQUIRE(c.action == CommandLine::Action::kLaunch);
    REQUIRE(explicit_.action == CommandLine::Action::kLaunch);
    CHECK(c.spec.module);
    CHECK(c.spec.num_processes == 2);
    CHECK(c.spec.command == explicit_.spec.command);
    REQUIRE(c.spec.command.size() >= 4);
    CHECK(std::vector<std::string>(c.spec.command.end() - 4, c.spec.command.end()) ==
          std::vector<std::string>{"mypkg.train", "--epochs", "3", "--lr=0.1"});
    // Options with values before it are read as options, in either spelling; the module's own
    // flags (-n 7) are its own.
    const CommandLine d =
        parse({"--nproc-per-node", "2", "--module", "--master-port=29555", "pkg.main", "-n", "7"});
    REQUIRE(d.action == CommandLine::Action::kLaunch);
    CHECK(d.spec.num_processes == 2);
    CHECK(d.spec.master_port == 29555);
    CHECK(std::vector<std::string>(d.spec.command.end() - 3, d.spec.command.end()) ==
          std::vector<std::string>{"pkg.main", "-n", "7"});
    // Without -m a word is still a PROMPTS file.
    CHECK(parse({"-n", "2", "prompts.txt"}).job.has_value());
}

TEST_CASE("a mistyped flag, subcommand or choice is answered with the closest one") {
    const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
        {{"--num-proceses", "2", "--", "x"},
         "--num-proceses is not a dp-launch option (did you mean --num-processes?)"},
        {{"--num_proceses=2", "--", "x"},
         "--num_proceses is not a dp-launch option (did you mean --num_processes?)"},
        {{"--nproc-per-nod", "2", "--", "x"}, "(did you mean --nproc-per-node?)"},
        {{"--max-restart", "1", "--", "x"}, "(did you mean --max-restarts?)"},
        {{"--guidance-scal", "3", "p.txt"}, "(did you mean --guidance-scale?)"},
        {{"--outptu-dir", "o", "p.txt"}, "(did you mean --output-dir?)"},
        {{"compare", "a", "b", "--min-psrn", "30"}, "(did you mean --min-psnr?)"},
        {{"env", "--jsno"}, "(did you mean --json?)"},
        {{"--zzzzzz", "--", "x"}, "--zzzzzz is not a dp-launch option (see dp-launch --help)"},
        {{"pln", "-n", "2"}, "'pln' is neither a prompt file nor a subcommand (did you mean 'plan'?)"},
        {{"argument", "--model", "m"}, "(did you mean 'arguments'?)"},
        {{"--schedule", "dynamc", "p.txt"},
         "expected one of auto, static, dynamic (did you mean 'dynamic'?)"},
    };
    for (const auto& [args, hint] : cases) {
        CAPTURE(args);
        const CommandLine c = parse(args);
        CHECK(c.action == CommandLine::Action::kFail);
        CHECK(c.exit_code == 2);
        CHECK(c.message.find('\n') == std::string::npos);
        CHECK_MESSAGE(c.message.find(hint) != std::string::npos, c.message);
    }
}

TEST_CASE("a model that is not there is missing input (66), however it is named") {
    const std::string empty = temp_path("empty_model");
    std::filesystem::create_directories(empty);
    FakeEnv env;
    env.vars["HF_HUB_CACHE"] = fake_hub_cache();
    const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
        {{"--model", "no-such-model", "p.txt"},
         "--model no-such-model: no such model folder, and no shipped model of that name (looked in "},
        {{"--model", "/nonexistent/dir", "p.txt"}, "--model /nonexistent/dir: no such folder"},
        {{"--model", "./no/such/model", "p.txt"}, "--model ./no/such/model: no such folder"},
        {{"--model", empty, "p.txt"}, "--model " + empty + ": no model_index.json there"},
        {{"--model", "org/absent", "p.txt"}, "--model org/absent: not found"},
        {{"--model", "org/tiny", "--revision", "v9", "p.txt"}, "revision v9 is not in the cache"},
        {{"plan", "--model", "no-such-model"}, "no shipped model of that name"},
        {{"arguments", "--model", "/nonexistent/dir"}, "no such folder"},
        {{"--model", "/nonexistent/dir", "--", "x"}, "--model is a pipeline option"},  // not the model's turn
    };
    for (const auto& [args, message] : cases) {
        CAPTURE(args);
        const CommandLine c = parse(args, env);
        CHECK(c.action == CommandLine::Action::kFail);
        CHECK(c.exit_code == (message == "--model is a pipeline option" ? 2 : 66));
        CHECK_MESSAGE(c.message.find(message) != std::string::npos, c.message);
    }
    // A name that cannot be a model, and --revision with a folder, are usage errors.
    CHECK(parse({"--model", "org/na me", "p.txt"}, env).exit_code == 2);
    CHECK(parse({"--model", empty, "--revision", "v1", "p.txt"}, env).exit_code == 2);
}

namespace {

// The numbers in the first column of the table under "## Exit codes" in the Markdown file `path`
// ("126, 127" is two; "N" and "128+S" are none), and that column's other entries in `others`.
std::set<int> documented_exit_codes(const std::string& path, std::set<std::string>& others) {
    std::ifstream in(path);
    REQUIRE_MESSAGE(in, path);
    std::set<int> codes;
    bool section = false;
    for (std::string line; std::getline(in, line);) {
        if (line.rfind("## ", 0) == 0) section = line == "## Exit codes";
        if (!section || line.rfind("| ", 0) != 0 || line.rfind("| code ", 0) == 0) continue;
        std::stringstream cell(line.substr(2, line.find(" |") - 2));
        for (std::string item; std::getline(cell >> std::ws, item, ',');) {
            if (item.find_first_not_of("0123456789") == std::string::npos)
                codes.insert(std::stoi(item));
            else
                others.insert(item);
        }
    }
    return codes;
}

}  // namespace

TEST_CASE(
    "the exit codes of docs/launcher.md, the README and --help are the code's, one per class of cause") {
    using namespace dp::protocol;
    std::set<int> code;
    for (const ExitCodeClass& c : kExitCodeClasses) CHECK_MESSAGE(code.insert(c.code).second, c.code);
    CHECK(code == std::set<int>{kExitOk, kExitFailure, kExitInternal, kExitUsage, kExitInputData,
                                kExitNoInput, kExitSystem, kExitIo, kExitCommunication, kExitNotExecutable,
                                kExitNotFound});
    const std::string root = dp::test::paths::kSourceDir;
    for (const std::string doc : {root + "/docs/launcher.md", root + "/README.md"}) {
        CAPTURE(doc);
        std::set<std::string> passed_through;
        CHECK(documented_exit_codes(doc, passed_through) == code);
        CHECK(passed_through == std::set<std::string>{"N", "128+S"});
    }
    // --help's footer: a line "  CODE  meaning" for each, under "Exit codes".
    const CommandLine help = parse({"--help"});
    const std::size_t at = help.message.find("\nExit codes");
    REQUIRE(at != std::string::npos);
    std::set<int> shown;
    std::set<std::string> shown_others;
    std::stringstream lines(help.message.substr(at + 1));
    std::string line;
    std::getline(lines, line);  // the heading
    while (std::getline(lines, line) && line.rfind("  ", 0) == 0) {
        if (line[2] == ' ') continue;  // a meaning's next line
        std::stringstream words(line);
        std::string first;
        words >> first;
        if (first.find_first_not_of("0123456789") == std::string::npos)
            shown.insert(std::stoi(first));
        else
            shown_others.insert(first);
    }
    CHECK(shown == code);
    CHECK(shown_others == std::set<std::string>{"N", "128+S"});
}

namespace {

// The widest line of `text`, in characters.
std::size_t widest_line(const std::string& text) {
    std::size_t widest = 0;
    std::stringstream lines(text);
    for (std::string line; std::getline(lines, line);)
        widest = std::max(widest, dp::cli::display_width(line));
    return widest;
}

const std::vector<std::vector<std::string>> kHelpPages = {
    {"--help"},           {"-h"}, {"env", "--help"}, {"plan", "--help"}, {"arguments", "--help"},
    {"compare", "--help"}};

}  // namespace

TEST_CASE("--help and each subcommand's fit COLUMNS: every line wrapped to it, none wider") {
    for (const int columns : {30, 40, 60, 79, 80, 100, 120}) {
        FakeEnv env;
        env.vars["COLUMNS"] = std::to_string(columns);
        for (const std::vector<std::string>& args : kHelpPages) {
            CAPTURE(columns);
            CAPTURE(args);
            const CommandLine help = parse(args, env);
            REQUIRE(help.action == CommandLine::Action::kPrint);
            CHECK(widest_line(help.message) <= static_cast<std::size_t>(columns));
            CHECK(help.message.find(" \n") == std::string::npos);  // no trailing blanks
            // Wide enough for the rows to show side by side, and used.
            if (columns >= 60 && args.front() == "--help") CHECK(widest_line(help.message) >= columns - 10);
        }
    }
    // Wider than 120 reads badly: kept at 120; narrower than 30 is 30.
    FakeEnv wide;
    wide.vars["COLUMNS"] = "300";
    CHECK(widest_line(parse({"--help"}, wide).message) == 120);
    FakeEnv narrow;
    narrow.vars["COLUMNS"] = "10";
    CHECK(widest_line(parse({"--help"}, narrow).message) <= 30);
    // The same words at any width.
    FakeEnv at60, at120;
    at60.vars["COLUMNS"] = "60";
    at120.vars["COLUMNS"] = "120";
    std::string narrow_words = parse({"--help"}, at60).message;
    for (std::size_t at; (at = narrow_words.find(" \\\n")) != std::string::npos;)  // a command's next line
        narrow_words.erase(at, 2);
    CHECK(squeezed(narrow_words) == squeezed(parse({"--help"}, at120).message));
}

TEST_CASE("wrap_text: words whole at the width, a hanging indent, a word longer than a line cut") {
    using dp::cli::wrap_text;
    CHECK(wrap_text("aaa bbb ccc", 8, 0, 2) == "aaa bbb\n  ccc\n");
    CHECK(wrap_text("aaa bbb", 20, 4, 0) == "    aaa bbb\n");
    CHECK(wrap_text("abcdefghijkl", 10, 0, 0) == "abcdefghij\nkl\n");
    CHECK(wrap_text("one\n\ntwo", 10, 0, 0) == "one\n\ntwo\n");
    CHECK(wrap_text("", 10, 0, 0) == "\n");
    CHECK(wrap_text("\xC3\xA9\xC3\xA9\xC3\xA9 x", 5, 0, 0) ==
          "\xC3\xA9\xC3\xA9\xC3\xA9 x\n");  // 5 characters
    CHECK(dp::cli::display_width("\xC3\xA9x") == 2);
}

TEST_CASE("--help lists the options under the headings a user scans, each row under its own") {
    const CommandLine help = parse({"--help"}, wide_help());
    const std::vector<std::string> headings = dp::cli::option_group_headings();
    CHECK(headings.size() == 6);
    std::size_t previous = 0;
    for (const std::string& heading : headings) {
        CAPTURE(heading);
        const std::size_t at = help.message.find("\n" + heading + ":\n");
        REQUIRE(at != std::string::npos);
        CHECK(at > previous);  // in the order of option_groups()
        previous = at;
    }
    std::set<std::string> listed;
    for (const dp::cli::OptionGroup& group : dp::cli::option_groups())
        for (const std::string& key : group.keys) CHECK_MESSAGE(listed.insert(key).second, key);
    for (const OptionDef* def : dp::cli::all_option_defs()) {
        CAPTURE(def->key);
        // A new row goes under one of the headings: list its key in cli/option_groups.cpp.
        CHECK(std::find(headings.begin(), headings.end(), def->group) != headings.end());
        listed.erase(def->key);
        // Under its heading: after it, before the next one.
        const std::size_t heading = help.message.find("\n" + def->group + ":\n");
        std::size_t next = help.message.size();
        for (const std::string& h : headings)
            if (const std::size_t at = help.message.find("\n" + h + ":\n"); at > heading && at < next)
                next = at;
        const std::size_t row = help.message.find("--" + def->long_flag.substr(2) + " ", heading);
        const std::size_t row_end = help.message.find("--" + def->long_flag.substr(2) + ",", heading);
        CHECK(std::min(row, row_end) < next);
    }
    for (std::string key : listed) {  // an option outside the tables (--prompt): on the page
        std::replace(key.begin(), key.end(), '_', '-');
        CHECK_MESSAGE(help.message.find("\n  --" + key + " ") != std::string::npos, key);
    }
    // Every --a-b is also --a_b (the help says so once instead of listing both).
    CLI::App app;
    dp::cli::RawLaunchOptions raw;
    dp::cli::add_launch_options(app, raw);
    for (const CLI::Option* opt : app.get_options()) {
        const std::vector<std::string>& names = opt->get_lnames();
        for (std::string name : names) {
            std::replace(name.begin(), name.end(), '-', '_');
            CHECK_MESSAGE(std::find(names.begin(), names.end(), name) != names.end(), name);
        }
    }
}

TEST_CASE("each subcommand's --help has its own usage and options, and not the launcher's examples") {
    const std::vector<std::tuple<std::string, std::vector<std::string>, std::vector<std::string>>> pages = {
        {"env", {"Usage: dp-launch env [--json]", "--json"}, {"--num-processes", "--model"}},
        {"plan",
         {"Usage: dp-launch plan [OPTIONS] [PROMPTS]", "--num-processes", "--nnodes", "--model", "--ulysses",
          "--tp", "--strategy", "--steps", "--width", "--dtype", "dp-launch plan --model tiny-random-sd3"},
         {"--log-dir", "--max-restarts", "--overwrite"}},
        {"arguments",
         {"Usage: dp-launch arguments [--model M]", "--json", "--model", "--revision", "--steps",
          "--guidance-scale"},
         {"--num-processes", "--ulysses"}},
        {"compare",
         {"Usage: dp-launch compare RUN_A RUN_B", "--min-psnr X", "--min-ssim X", "--gallery FILE"},
         {"--num-processes", "--model"}},
    };
    const std::string main_help = parse({"--help"}, wide_help()).message;
    for (const auto& [name, shown, not_shown] : pages) {
        CAPTURE(name);
        const CommandLine help = parse({name, "--help"}, wide_help());
        REQUIRE(help.action == CommandLine::Action::kPrint);
        CHECK(help.message != main_help);
        for (const std::string& text : shown)
            CHECK_MESSAGE(help.message.find(text) != std::string::npos, text);
        for (const std::string& text : not_shown)
            CHECK_MESSAGE(help.message.find(text) == std::string::npos, text);
        CHECK(help.message.find("dp-launch -n 2 --model models/sd3 prompts.txt") == std::string::npos);
        CHECK(help.message.find("Exit codes") == std::string::npos);
        CHECK(help.message.find("Subcommands") == std::string::npos);
    }
}
