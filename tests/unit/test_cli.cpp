#include <doctest/doctest.h>

#include <unistd.h>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "cli/command_line.h"
#include "cli/launch_options.h"
#include "launcher/errors.h"

using dp::cli::CommandLine;
using dp::cli::parse_command_line;

namespace {

struct FakeEnv {
    std::map<std::string, std::string> vars;
    dp::cli::EnvLookup lookup() const {
        return [this](const char* name) -> const char* {
            auto it = vars.find(name);
            return it == vars.end() ? nullptr : it->second.c_str();
        };
    }
};

CommandLine parse(std::vector<std::string> args, const FakeEnv& env = {}) {
    return parse_command_line(args, env.lookup());
}

std::string write_temp(const std::string& name, const std::string& text) {
    const std::string path = "/tmp/dp_launch_test_" + std::to_string(getpid()) + "_" + name;
    std::ofstream(path) << text;
    return path;
}

}  // namespace

TEST_CASE("the option table has no duplicate flag, key or environment twin, and every twin is DP_*") {
    std::set<std::string> flags, keys, envs;
    for (const auto& def : dp::cli::launch_option_table()) {
        CHECK_MESSAGE(keys.insert(def.key).second, def.key);
        CHECK_MESSAGE(envs.insert(def.env).second, def.env);
        CHECK(std::string(def.env).rfind("DP_", 0) == 0);
        CHECK(std::string(def.help).size() > 10);
        std::stringstream names(def.flags);
        for (std::string name; std::getline(names, name, ',');)
            CHECK_MESSAGE(flags.insert(name).second, name);
    }
    // Building the CLI11 app also refuses duplicates; --help must render every option.
    CommandLine help = parse({"--help"});
    REQUIRE(help.action == CommandLine::Action::kPrint);
    for (const auto& def : dp::cli::launch_option_table())
        CHECK_MESSAGE(help.message.find(def.env) != std::string::npos, def.env);
    CHECK(help.message.find("Examples:") != std::string::npos);
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
        {{"--model", "no-such-model", "p.txt"},
         "--model no-such-model: no such model folder, and no shipped model of that name"},
        {{"--model", "/nonexistent/dir", "p.txt"}, "--model /nonexistent/dir: no model_index.json there"},
        {{"--steps", "0", "p.txt"}, "--steps '0': expected a whole number from 1 to 1000"},
        {{"--dtype", "fp64", "p.txt"}, "--dtype 'fp64': expected one of fp32, bf16, fp16"},
        {{"--device", "tpu", "p.txt"}, "--device 'tpu'"},
        {{"--seed", "-1", "p.txt"}, "--seed '-1'"},
        {{"--width", "4", "p.txt"}, "--width '4'"},
        {{"--guidance-scale", "500", "p.txt"}, "--guidance-scale"},
        {{"--model", "m", "--", "python"}, "--model is a pipeline option: it needs a PROMPTS file"},
        {{"a.txt", "b.txt"}, "give one PROMPTS file"},
        {{"plan", "-n", "2", "p.txt"}, "plan takes options only, not 'p.txt'"},
        {{"--config", "/nonexistent/dp.json", "--", "x"}, "/nonexistent/dp.json"},
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
        {"{\"num_procs\": 2}", "unknown key 'num_procs'"},
        {"{\"num_processes\": {\"a\": 1}}", "num_processes: expected a string, number or boolean"},
        {"{\"num_processes\": 0}", ": num_processes '0'"},
        {"{\"quiet\": \"sometimes\"}", ": quiet 'sometimes'"},
        {"{\"gpu_ids\": [0, \"x\"]}", "gpu_ids: expected a list"},
        {"{\"config\": \"x.json\"}", "unknown key 'config'"},
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
    CHECK(c.job->guidance_scale == doctest::Approx(2.5));
    CHECK(c.job->seed == 18446744073709551615ULL);
    CHECK(c.job->output_dir == "cfg_out");
    CHECK(c.job->skip_invalid);
    CHECK(c.job->dtype == "bf16");
    CHECK(c.job->negative_prompt == "blurry");
    CHECK(c.job->device == "auto");
    CHECK(c.spec.num_processes == 2);
    CHECK(c.spec.command.empty());
    CommandLine d = parse({"-"});
    REQUIRE(d.job.has_value());
    CHECK(d.job->prompts == "-");
    CHECK(d.job->output_dir == "outputs");
    CHECK(d.job->steps == 28);
}

TEST_CASE("--version and env") {
    CommandLine v = parse({"--version"});
    CHECK(v.action == CommandLine::Action::kPrint);
    CHECK(v.message.rfind("dp-launch 0.", 0) == 0);
    CommandLine e = parse({"env", "--json"});
    CHECK(e.action == CommandLine::Action::kEnv);
    CHECK(e.json);
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
