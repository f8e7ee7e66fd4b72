#include <doctest/doctest.h>

#include <map>

#include "launcher/rank_env.h"

using namespace dp::launcher;

namespace {
std::map<std::string, std::string> as_map(const EnvVars& vars) {
    std::map<std::string, std::string> m;
    for (const auto& [k, v] : vars) {
        CHECK_MESSAGE(m.count(k) == 0, "set twice: " << k);
        m[k] = v;
    }
    return m;
}
}  // namespace

TEST_CASE("every torchrun variable, for a rank on the second node") {
    LaunchSpec spec;
    spec.num_processes = 4;
    spec.nnodes = 3;
    spec.node_rank = 1;
    spec.max_restarts = 2;
    spec.run_id = "job7";
    RankEnvInputs in{"10.0.0.1", 29500, 1, 16, 1234, ""};
    auto m = as_map(rank_variables(spec, in, 2, {}));
    const std::map<std::string, std::string> expected = {
        {"RANK", "6"},  // 1 * 4 + 2
        {"LOCAL_RANK", "2"},
        {"WORLD_SIZE", "12"},
        {"LOCAL_WORLD_SIZE", "4"},
        {"GROUP_RANK", "1"},
        {"GROUP_WORLD_SIZE", "3"},
        {"ROLE_RANK", "6"},
        {"ROLE_WORLD_SIZE", "12"},
        {"ROLE_NAME", "default"},
        {"MASTER_ADDR", "10.0.0.1"},
        {"MASTER_PORT", "29500"},
        {"TORCHELASTIC_RESTART_COUNT", "1"},
        {"TORCHELASTIC_MAX_RESTARTS", "2"},
        {"TORCHELASTIC_RUN_ID", "job7"},
        {"OMP_NUM_THREADS", "4"},  // 16 cpus / 4 local processes
        {"DP_LAUNCHER_PID", "1234"},
    };
    for (const auto& [name, value] : expected) {
        CAPTURE(name);
        REQUIRE(m.count(name) == 1);
        CHECK(m.at(name) == value);
    }
    CHECK(m.count("CUDA_VISIBLE_DEVICES") == 0);
}

TEST_CASE("OMP_NUM_THREADS: at least 1, never over the user's unless --num-cpu-threads-per-process says") {
    LaunchSpec spec;
    spec.num_processes = 8;
    RankEnvInputs in{"127.0.0.1", 1, 0, 2, 1, ""};
    CHECK(as_map(rank_variables(spec, in, 0, {})).at("OMP_NUM_THREADS") == "1");
    CHECK(as_map(rank_variables(spec, in, 0, {"OMP_NUM_THREADS=7"})).count("OMP_NUM_THREADS") == 0);
    // A variable whose name merely starts the same does not count.
    CHECK(as_map(rank_variables(spec, in, 0, {"OMP_NUM_THREADS_X=7"})).count("OMP_NUM_THREADS") == 1);
    // accelerate's --num_cpu_threads_per_process sets it whatever is inherited, as accelerate does.
    spec.cpu_threads_per_process = 3;
    CHECK(as_map(rank_variables(spec, in, 0, {"OMP_NUM_THREADS=7"})).at("OMP_NUM_THREADS") == "3");
    CHECK(as_map(rank_variables(spec, in, 0, {})).count("ACCELERATE_MIXED_PRECISION") == 0);
    spec.mixed_precision = "no";
    spec.use_cpu = true;
    const auto vars = as_map(rank_variables(spec, in, 0, {}));
    CHECK(vars.at("ACCELERATE_MIXED_PRECISION") == "no");
    CHECK(vars.at("ACCELERATE_USE_CPU") == "true");
}

TEST_CASE("gpu ids become CUDA_VISIBLE_DEVICES") {
    LaunchSpec spec;
    spec.num_processes = 2;
    spec.gpu_ids = {2, 0};
    RankEnvInputs in{"127.0.0.1", 1, 0, 2, 1, ""};
    CHECK(as_map(rank_variables(spec, in, 1, {})).at("CUDA_VISIBLE_DEVICES") == "2,0");
}

TEST_CASE("merging replaces inherited values and keeps the rest in order") {
    auto merged =
        merge_environment({"PATH=/bin", "RANK=9", "HOME=/root", "RANKX=1"}, {{"RANK", "0"}, {"NEW", "a=b"}});
    CHECK(merged == std::vector<std::string>{"PATH=/bin", "HOME=/root", "RANKX=1", "RANK=0", "NEW=a=b"});
}
