// Each rank's environment, as a torchrun script would read it.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "integration/launch_harness.h"

using namespace dp::test;

namespace {
std::map<std::string, std::string> parse_env_file(const std::string& text) {
    std::map<std::string, std::string> env;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
        auto eq = line.find('=');
        if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
    }
    return env;
}
}  // namespace

TEST_CASE("every rank gets the torchrun environment at 1, 2 and 4 processes") {
    for (int n : {1, 2, 4}) {
        CAPTURE(n);
        const std::string dir = make_temp_dir();
        LaunchResult r =
            run_launch({"-n", std::to_string(n), "--", worker_bin(), "env", dir}, {{"OMP_NUM_THREADS", ""}});
        REQUIRE_MESSAGE(r.exit_code == 0, r.err);
        std::set<std::string> ports;
        for (int rank = 0; rank < n; ++rank) {
            CAPTURE(rank);
            const std::string file = dir + "/rank_" + std::to_string(rank) + ".env";
            REQUIRE(file_exists(file));
            auto env = parse_env_file(read_file(file));
            CHECK(env["RANK"] == std::to_string(rank));
            CHECK(env["LOCAL_RANK"] == std::to_string(rank));
            CHECK(env["WORLD_SIZE"] == std::to_string(n));
            CHECK(env["LOCAL_WORLD_SIZE"] == std::to_string(n));
            CHECK(env["GROUP_RANK"] == "0");
            CHECK(env["GROUP_WORLD_SIZE"] == "1");
            CHECK(env["ROLE_RANK"] == std::to_string(rank));
            CHECK(env["ROLE_WORLD_SIZE"] == std::to_string(n));
            CHECK(env["ROLE_NAME"] == "default");
            CHECK(env["MASTER_ADDR"] == "127.0.0.1");
            CHECK(std::stoi(env["MASTER_PORT"]) > 0);
            ports.insert(env["MASTER_PORT"]);
            CHECK(env["TORCHELASTIC_RESTART_COUNT"] == "0");
            CHECK(env["TORCHELASTIC_MAX_RESTARTS"] == "0");
            CHECK(env["TORCHELASTIC_RUN_ID"] == "none");
            CHECK(env["OMP_NUM_THREADS"] == "");  // the user's value, even empty, is kept
            CHECK(env.count("DP_LAUNCH_VERSION") == 1);
            CHECK(env["PATH"] == std::getenv("PATH"));  // the rest is inherited
        }
        CHECK(ports.size() == 1);  // one rendezvous for the whole job
    }
}

TEST_CASE("multi-node ranks, explicit port, gpu ids and the OMP default") {
    const std::string dir = make_temp_dir();
    LaunchResult r = run_launch({"-n", "2", "--nnodes", "3", "--node-rank", "2", "--master-addr", "10.9.8.7",
                                 "--master-port", "29511", "--gpu-ids", "3,1", "--run-id", "exp1", "--",
                                 worker_bin(), "env", dir});
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    auto env = parse_env_file(read_file(dir + "/rank_5.env"));
    CHECK(env["RANK"] == "5");
    CHECK(env["LOCAL_RANK"] == "1");
    CHECK(env["WORLD_SIZE"] == "6");
    CHECK(env["GROUP_RANK"] == "2");
    CHECK(env["GROUP_WORLD_SIZE"] == "3");
    CHECK(env["MASTER_ADDR"] == "10.9.8.7");
    CHECK(env["MASTER_PORT"] == "29511");
    CHECK(env["CUDA_VISIBLE_DEVICES"] == "3,1");
    CHECK(env["TORCHELASTIC_RUN_ID"] == "exp1");
    CHECK(std::stoi(env["OMP_NUM_THREADS"]) >= 1);
}

TEST_CASE("accelerate's --mixed_precision, --cpu and --num_cpu_threads_per_process reach a command's ranks") {
    // As accelerate launch exports them: ACCELERATE_MIXED_PRECISION, ACCELERATE_USE_CPU, OMP_NUM_THREADS
    // (over the inherited 9).
    const std::string dir = make_temp_dir();
    LaunchResult r = run_launch({"-n", "2", "--mixed_precision", "fp8", "--cpu",
                                 "--num_cpu_threads_per_process", "3", "--", worker_bin(), "env", dir},
                                {{"OMP_NUM_THREADS", "9"}});
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    for (int rank = 0; rank < 2; ++rank) {
        auto env = parse_env_file(read_file(dir + "/rank_" + std::to_string(rank) + ".env"));
        CHECK(env["ACCELERATE_MIXED_PRECISION"] == "fp8");
        CHECK(env["ACCELERATE_USE_CPU"] == "true");
        CHECK(env["OMP_NUM_THREADS"] == "3");
    }
    // From the config file (accelerate's key) and the DP_* twin; without them nothing is set.
    const std::string config = dir + "/accelerate.json";
    std::ofstream(config) << R"({"mixed_precision": "bf16"})";
    const std::string from_config = make_temp_dir();
    r = run_launch({"--config_file", config, "--", worker_bin(), "env", from_config}, {{"DP_CPU", "1"}});
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    auto env = parse_env_file(read_file(from_config + "/rank_0.env"));
    CHECK(env["ACCELERATE_MIXED_PRECISION"] == "bf16");
    CHECK(env["ACCELERATE_USE_CPU"] == "true");
    const std::string plain = make_temp_dir();
    r = run_launch({"--", worker_bin(), "env", plain}, {{"OMP_NUM_THREADS", "9"}});
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    env = parse_env_file(read_file(plain + "/rank_0.env"));
    CHECK(env.count("ACCELERATE_MIXED_PRECISION") == 0);
    CHECK(env.count("ACCELERATE_USE_CPU") == 0);
    CHECK(env["OMP_NUM_THREADS"] == "9");  // the user's, when the option is not given
}

TEST_CASE("--dry-run prints each rank's command and variables and starts nothing") {
    const std::string dir = make_temp_dir();
    LaunchResult r = run_launch({"-n", "2", "--dry-run", "--", worker_bin(), "env", dir, "it's"});
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    CHECK(r.out.find("# rank 0 (local rank 0)") != std::string::npos);
    CHECK(r.out.find("# rank 1 (local rank 1)") != std::string::npos);
    CHECK(r.out.find("RANK=1 LOCAL_RANK=1 WORLD_SIZE=2") != std::string::npos);
    CHECK(r.out.find("'it'\\''s'") != std::string::npos);  // pasteable shell quoting
    CHECK_FALSE(file_exists(dir + "/rank_0.env"));
}

TEST_CASE("--log-dir keeps each rank's streams and appends across runs") {
    const std::string dir = make_temp_dir() + "/nested/logs";
    for (int run = 0; run < 2; ++run) {
        LaunchResult r = run_launch({"-n", "2", "--log-dir", dir, "--", worker_bin(), "stderr-exit", "0"});
        REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    }
    const std::string log = read_file(dir + "/rank_1.stderr");
    CHECK(log.find("stderr line 15\n") != std::string::npos);
    std::size_t headers = 0;
    for (std::size_t at = log.find("==== dp-launch run"); at != std::string::npos;
         at = log.find("==== dp-launch run", at + 1))
        ++headers;
    CHECK(headers == 2);  // nothing written earlier is lost
    CHECK(file_exists(dir + "/rank_0.stdout"));
    // The launcher's own lines too: a failing run's report, in DIR/launcher.log after a header of
    // its own, as on stderr; the ranks' lines are not repeated there.
    LaunchResult failing = run_launch({"-n", "2", "--log-dir", dir, "--", worker_bin(), "stderr-exit", "3"});
    CHECK(failing.exit_code == 3);
    const std::string own = read_file(dir + "/launcher.log");
    CHECK(own.rfind("==== dp-launch run", 0) == 0);
    CHECK(own.find("exited with code 3") != std::string::npos);
    CHECK(failing.err.find("exited with code 3") != std::string::npos);
    CHECK(own.find("[rank ") == std::string::npos);
}

TEST_CASE("an unwritable --log-dir is refused before anything starts") {
    LaunchResult r = run_launch({"-n", "1", "--log-dir", "/proc/version/logs", "--", "true"});
    CHECK(r.exit_code == 74);
    CHECK(r.err.find("--log-dir") != std::string::npos);
}

TEST_CASE("dp-launch env reports the build and the machine, as text and JSON") {
    LaunchResult text = run_launch({"env"});
    REQUIRE(text.exit_code == 0);
    CHECK(text.out.find("dp-launch:") != std::string::npos);
    CHECK(text.out.find("usable CPUs:") != std::string::npos);
    CHECK(text.out.find("LibTorch:") != std::string::npos);
    CHECK(text.out.find("GPUs:") != std::string::npos);
    LaunchResult json = run_launch({"env", "--json"});
    REQUIRE(json.exit_code == 0);
    CHECK(json.out.find("\"dp_launch_version\"") != std::string::npos);
    CHECK(json.out.find("\"usable_cpus\"") != std::string::npos);
    CHECK(json.out.find("\"gpus\"") != std::string::npos);
}

TEST_CASE("dp-launch env shows the python3 ranks would run and the DP_* and cluster variables in effect") {
    LaunchResult r = run_launch({"env"}, {{"DP_SEED", "7"}, {"SLURM_JOB_ID", "4242"}, {"PET_NNODES", "2"}});
    REQUIRE(r.exit_code == 0);
    CHECK(r.out.find("python3:") != std::string::npos);
    CHECK(r.out.find("  torch:") != std::string::npos);  // a version, or "not installed"
    CHECK(r.out.find("DP_* variables:\n  DP_SEED=7\n") != std::string::npos);
    CHECK(r.out.find("  SLURM_JOB_ID=4242\n") != std::string::npos);
    CHECK(r.out.find("  PET_NNODES=2\n") != std::string::npos);
    LaunchResult json = run_launch({"env", "--json"}, {{"DP_SEED", "7"}});
    REQUIRE(json.exit_code == 0);
    const nlohmann::json facts = nlohmann::json::parse(json.out);
    CHECK(facts.at("variables").at("dp").at("DP_SEED") == "7");
    CHECK(facts.contains("python3"));
    if (!facts.at("python3").is_null()) CHECK(facts.at("python3").at("version").is_string());
}

TEST_CASE("usage errors exit 2 with one line on stderr and start nothing") {
    for (const std::vector<std::string>& args :
         std::vector<std::vector<std::string>>{{"-n", "0", "--", "true"},
                                               {"--nope", "--", "true"},
                                               {"-n", "2"},
                                               {"--master-port", "99999", "--", "true"}}) {
        LaunchResult r = run_launch(args);
        CHECK(r.exit_code == 2);
        CHECK(r.err.rfind("dp-launch: ", 0) == 0);
        CHECK(r.err.find('\n') == r.err.size() - 1);
        CHECK(r.out.empty());
    }
}

TEST_CASE("a model that is not there exits 66 with one line, named by path, shipped name or hub id") {
    const std::string dir = make_temp_dir();
    std::ofstream(dir + "/prompts.txt") << "a red circle\n";
    for (const std::string model :
         {dir + "/no-such-folder", std::string("no-such-model"), std::string("org/absent")}) {
        CAPTURE(model);
        const LaunchResult r = run_launch({"--model", model, "-o", dir + "/out", dir + "/prompts.txt"},
                                          {{"HF_HUB_CACHE", dir + "/hub"}});
        CHECK(r.exit_code == 66);
        CHECK(r.err.rfind("dp-launch: --model ", 0) == 0);
        CHECK(r.err.find('\n') == r.err.size() - 1);
        CHECK_FALSE(file_exists(dir + "/out"));
    }
}
