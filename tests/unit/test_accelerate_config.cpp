// accelerate's YAML config file (--config_file) and the per-rank task's GPU from the allocation.

#include <doctest/doctest.h>

#include <unistd.h>

#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cli/accelerate_config.h"
#include "cli/command_line.h"
#include "launcher/errors.h"
#include "unit/fake_env.h"
#include "unit/test_support.h"

using dp::cli::CommandLine;
using dp::test::parse;

namespace {

using Env = dp::test::FakeEnv;

std::string write_file(const std::string& name, const std::string& text) {
    const std::string path = "/tmp/dp_launch_yaml_" + std::to_string(getpid()) + "_" + name;
    std::ofstream(path) << text;
    return path;
}

using dp::test::has;

// What `accelerate config` writes (yaml.safe_dump, keys sorted) for the second of 2 machines with 4
// GPUs each, bf16, MULTI_GPU.
const char* const kTwoMachines = R"(compute_environment: LOCAL_MACHINE
debug: false
distributed_type: MULTI_GPU
downcast_bf16: 'no'
enable_cpu_affinity: false
gpu_ids: all
machine_rank: 1
main_process_ip: 10.1.2.3
main_process_port: 29555
main_training_function: main
mixed_precision: bf16
num_machines: 2
num_processes: 8
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
)";

// The ordinary file with `key: value` replaced (the key's line kept in place).
std::string with_line(const std::string& key, const std::string& value) {
    const std::string text = std::string("\n") + kTwoMachines;
    const std::size_t at = text.find("\n" + key + ":");
    REQUIRE(at != std::string::npos);
    const std::size_t end = text.find('\n', at + 1);
    return text.substr(1, at) + key + ": " + value + text.substr(end);
}

}  // namespace

TEST_CASE("accelerate config yaml: the file accelerate writes sets nodes, ranks, master and dtype") {
    if (!dp::cli::yaml_config_supported()) return;
    const std::string path = write_file("default_config.yaml", kTwoMachines);
    CommandLine c = parse({"--config_file", path, "--", "python3", "train.py"});
    REQUIRE_MESSAGE(c.action == CommandLine::Action::kLaunch, c.message);
    CHECK(c.spec.nnodes == 2);
    CHECK(c.spec.num_processes == 4);  // accelerate's 8 is the total over 2 machines
    CHECK(c.spec.node_rank == 1);
    CHECK(c.spec.master_addr == "10.1.2.3");
    CHECK(c.spec.master_port == 29555);
    CHECK(c.spec.gpu_ids.empty());  // all: CUDA_VISIBLE_DEVICES left alone
    CHECK(c.spec.rdzv_backend == "static");
    // The keys with no meaning here, in one line, printed with the allocation line.
    CHECK(c.spec.cluster_report ==
          "dp-launch: " + path +
              ": ignored accelerate keys: debug, downcast_bf16, enable_cpu_affinity, "
              "main_training_function, same_network, tpu_env, tpu_use_cluster, "
              "tpu_use_sudo (no meaning for dp-launch)");

    // The main job reads mixed_precision as --mixed_precision.
    c = parse({"--config", path, "p.txt"});
    REQUIRE_MESSAGE(c.action == CommandLine::Action::kLaunch, c.message);
    REQUIRE(c.job.has_value());
    CHECK(c.job->dtype == "bf16");
    CHECK(c.job->device == "auto");

    // A name without .yaml is YAML too when it does not start with '{'; aliases of the other spellings.
    const std::string plain = write_file("accelerate_cfg", kTwoMachines);
    CHECK(parse({"--config-file", plain, "--", "x"}).spec.num_processes == 4);
    Env env;
    env.vars["DP_CONFIG"] = plain;
    CHECK(parse({"--", "x"}, env).spec.nnodes == 2);
}

TEST_CASE("accelerate config yaml: flags and DP_* variables win over the file") {
    if (!dp::cli::yaml_config_supported()) return;
    const std::string path = write_file("override.yaml", kTwoMachines);
    Env env;
    env.vars["DP_MASTER_PORT"] = "30001";
    CommandLine c = parse(
        {"--config_file", path, "-n", "2", "--machine_rank", "0", "--main_process_ip", "head", "--", "x"},
        env);
    REQUIRE_MESSAGE(c.action == CommandLine::Action::kLaunch, c.message);
    CHECK(c.spec.num_processes == 2);
    CHECK(c.spec.node_rank == 0);
    CHECK(c.spec.master_addr == "head");
    CHECK(c.spec.master_port == 30001);
    CHECK(c.spec.nnodes == 2);
    c = parse({"--config_file", path, "--mixed_precision", "fp16", "p.txt"});
    REQUIRE_MESSAGE(c.action == CommandLine::Action::kLaunch, c.message);
    CHECK(c.job->dtype == "fp16");
}

TEST_CASE("accelerate config yaml: cpu, gpu ids, one machine, dp-launch keys and unknown keys") {
    if (!dp::cli::yaml_config_supported()) return;
    const std::string cpu = write_file("cpu.yaml",
                                       "distributed_type: MULTI_CPU\nnum_processes: 3\nuse_cpu: true\n"
                                       "mixed_precision: 'no'\nmax_restarts: 2\nfuture_key: {a: 1}\n");
    CommandLine c = parse({"--config_file", cpu, "p.txt"});
    REQUIRE_MESSAGE(c.action == CommandLine::Action::kLaunch, c.message);
    CHECK(c.spec.num_processes == 3);
    CHECK(c.spec.nnodes == 1);
    CHECK(c.spec.max_restarts == 2);  // a dp-launch key, as in the JSON file
    CHECK(c.job->device == "cpu");
    CHECK(c.spec.use_cpu);          // a command's ranks get ACCELERATE_USE_CPU=true
    CHECK(c.job->dtype == "auto");  // no: no autocast, which says nothing of the weights' precision
    CHECK(c.spec.mixed_precision == "no");
    CHECK(has(c.spec.cluster_report, "ignored accelerate keys: future_key (no meaning"));

    const std::string gpus = write_file("gpus.yaml", "num_processes: 2\ngpu_ids: 0,2\n");
    c = parse({"--config_file", gpus, "--", "x"});
    REQUIRE_MESSAGE(c.action == CommandLine::Action::kLaunch, c.message);
    CHECK(c.spec.gpu_ids == std::vector<int>{0, 2});
    CHECK(c.spec.cluster_report.empty());  // nothing ignored: no line
    const std::string listed = write_file("listed.yaml", "gpu_ids: [1, 3]\nnum_processes: 2\n");
    CHECK(parse({"--config_file", listed, "--", "x"}).spec.gpu_ids == std::vector<int>{1, 3});

    // JSON stays JSON, with its strict keys.
    const std::string json = write_file("cfg.yaml.json", "{\"num_processes\": 3}");
    CHECK(parse({"--config", json, "--", "x"}).spec.num_processes == 3);
}

TEST_CASE("accelerate config yaml: each refused value names FILE:line, the key and what is accepted") {
    if (!dp::cli::yaml_config_supported()) return;
    struct Case {
        std::string key, value;
        int line;
        std::vector<std::string> parts;
    };
    const std::vector<Case> cases = {
        {"distributed_type",
         "DEEPSPEED",
         3,
         {"distributed_type: DEEPSPEED", "RANK, LOCAL_RANK", "MULTI_GPU"}},
        {"distributed_type", "FSDP", 3, {"FSDP is not supported", "accepted: NO, MULTI_GPU, MULTI_CPU"}},
        {"distributed_type", "MEGATRON_LM", 3, {"Megatron-LM"}},
        {"distributed_type", "XLA", 3, {"CUDA GPUs or CPUs only"}},
        {"distributed_type", "TPU", 3, {"CUDA GPUs or CPUs only"}},
        {"compute_environment",
         "AMAZON_SAGEMAKER",
         1,
         {"AMAZON_SAGEMAKER is not supported", "LOCAL_MACHINE"}},
        {"num_processes", "7", 13, {"num_processes 7 with num_machines 2", "total over the machines"}},
        {"num_processes", "-1", 13, {"num_processes: '-1'", "whole number from 1"}},
        {"num_processes", "[1, 2]", 13, {"num_processes: expected a whole number"}},
        {"num_machines", "two", 12, {"num_machines: 'two'"}},
        {"machine_rank", "2", 7, {"machine_rank 2", "below num_machines 2"}},
        {"main_process_port", "http", 9, {"main_process_port: 'http'"}},
        {"main_process_port", "70000", 9, {"main_process_port", "1 to 65535"}},
        {"mixed_precision", "fp64", 11, {"mixed_precision: 'fp64': accepted: no, fp16, bf16, fp8"}},
        {"rdzv_backend", "etcd", 14, {"rdzv_backend", "c10d"}},
        {"use_cpu", "maybe", 19, {"use_cpu"}},
        {"gpu_ids", "0,x", 6, {"gpu_ids"}},
    };
    for (const Case& k : cases) {
        CAPTURE(k.key);
        CAPTURE(k.value);
        const std::string path = write_file("bad.yaml", with_line(k.key, k.value));
        const CommandLine c = parse({"--config_file", path, "--", "x"});
        REQUIRE(c.action == CommandLine::Action::kFail);
        CHECK(c.exit_code == 2);
        CHECK_MESSAGE(has(c.message, path + ":" + std::to_string(k.line) + ": " + k.key), c.message);
        for (const std::string& part : k.parts) CHECK_MESSAGE(has(c.message, part), c.message);
    }
    // Not YAML, not a mapping, too deep.
    const std::vector<std::pair<std::string, std::string>> files = {
        {"num_processes: [1, 2\n", "not valid YAML"},
        {"- num_processes\n- 2\n", "expected a YAML mapping"},
        {"just text\n", "expected a YAML mapping"},
        {"", "expected a YAML mapping"},
        {"a: " + std::string(100, '[') + std::string(100, ']') + "\n", "nested more than 64"},
        {"a:\n" +
             [] {
                 std::string s;
                 for (int i = 0; i < 3000; ++i) s += "- ";
                 return s;
             }() +
             "x\n",
         "deep"},
    };
    for (const auto& [text, part] : files) {
        const std::string path = write_file("broken.yaml", text);
        const CommandLine c = parse({"--config_file", path, "--", "x"});
        REQUIRE(c.action == CommandLine::Action::kFail);
        CHECK(c.exit_code == 2);
        CHECK_MESSAGE(has(c.message, path), c.message);
        CHECK_MESSAGE(has(c.message, part), c.message);
    }
}

TEST_CASE(
    "accelerate config yaml: random and truncated files give a usage error or settings, never a crash") {
    if (!dp::cli::yaml_config_supported()) return;
    std::mt19937 rng(16);
    const std::string base = kTwoMachines;
    const std::string alphabet = "abc:-[]{}&*!|>'\"#%@`,?\n\t 0123456789.\\";
    auto no_key = [](const std::string&) { return std::string(); };
    int usage_errors = 0, read = 0;
    for (int i = 0; i < 600; ++i) {
        std::string text;
        if (i % 3 == 0) {
            text = base.substr(0, rng() % base.size());  // truncated
        } else if (i % 3 == 1) {
            text = base;  // mutated
            for (int m = 0; m < 1 + static_cast<int>(rng() % 8); ++m)
                text[rng() % text.size()] = alphabet[rng() % alphabet.size()];
        } else {
            for (int n = static_cast<int>(rng() % 200); n > 0; --n) text += alphabet[rng() % alphabet.size()];
        }
        try {
            (void)dp::cli::parse_accelerate_config(text, "fuzz.yaml", no_key);
            ++read;
        } catch (const dp::launcher::UsageError& e) {
            CHECK(has(e.what(), "fuzz.yaml"));
            ++usage_errors;
        } catch (...) {
            FAIL("not a UsageError on input: " << text);
        }
    }
    CHECK(usage_errors > 50);
    CHECK(read > 50);
}

TEST_CASE("accelerate config: the answer to `dp-launch config` names --config_file") {
    const CommandLine c = parse({"config"});
    REQUIRE(c.action == CommandLine::Action::kFail);
    CHECK(has(c.message, "accelerate config"));
    CHECK(has(c.message, "--config_file"));
}

namespace {

// `srun --ntasks-per-node=4 dp-launch ...` on node02 of 2: the task of local rank 2, global rank 6.
Env slurm_task(int local_rank) {
    Env env{dp::test::slurm_node02_task(local_rank)};
    env.vars["SLURM_STEP_GPUS"] = "4,5,6,7";
    return env;
}

}  // namespace

TEST_CASE("per-rank allocation: the task's own GPU becomes CUDA_VISIBLE_DEVICES") {
    CommandLine c = parse({"--", "python3", "train.py"}, slurm_task(2));
    REQUIRE_MESSAGE(c.action == CommandLine::Action::kLaunch, c.message);
    CHECK(c.spec.spawned_local_ranks == std::vector<int>{2});
    CHECK(c.spec.gpu_ids == std::vector<int>{6});
    CHECK(has(c.spec.cluster_report, "this task's GPU 6 (CUDA_VISIBLE_DEVICES=6)"));

    // --gpu-ids wins.
    c = parse({"--gpu-ids", "4,5,6,7", "--", "x"}, slurm_task(2));
    REQUIRE_MESSAGE(c.action == CommandLine::Action::kLaunch, c.message);
    CHECK(c.spec.gpu_ids == std::vector<int>{4, 5, 6, 7});
    CHECK(!has(c.spec.cluster_report, "this task's GPU"));

    // Slurm already made this task's one GPU the only visible one: left as it is.
    Env own = slurm_task(1);
    own.vars["CUDA_VISIBLE_DEVICES"] = "0";
    c = parse({"--", "x"}, own);
    REQUIRE_MESSAGE(c.action == CommandLine::Action::kLaunch, c.message);
    CHECK(c.spec.gpu_ids.empty());

    // All four visible to every task: each task takes its local rank's.
    Env shared = slurm_task(3);
    shared.vars["CUDA_VISIBLE_DEVICES"] = "0,1,2,3";
    c = parse({"--", "x"}, shared);
    REQUIRE_MESSAGE(c.action == CommandLine::Action::kLaunch, c.message);
    CHECK(c.spec.gpu_ids == std::vector<int>{3});

    // No GPUs in the allocation: nothing set.
    Env none = slurm_task(2);
    none.vars.erase("SLURM_STEP_GPUS");
    none.vars.erase("SLURM_GPUS_ON_NODE");
    c = parse({"--", "x"}, none);
    REQUIRE_MESSAGE(c.action == CommandLine::Action::kLaunch, c.message);
    CHECK(c.spec.gpu_ids.empty());
}
