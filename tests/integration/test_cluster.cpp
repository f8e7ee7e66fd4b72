// dp-launch inside simulated scheduler allocations (Slurm in both shapes, Open MPI, a PyTorchJob):
// the variables as those schedulers set them, and each rank's environment as a torchrun script
// reads it (Note [cluster shapes], launcher/cluster_env.h).
#include <doctest/doctest.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "integration/launch_harness.h"

using namespace dp::test;

namespace {

std::map<std::string, std::string> rank_env(const std::string& dir, int rank) {
    std::map<std::string, std::string> env;
    std::istringstream in(read_file(dir + "/rank_" + std::to_string(rank) + ".env"));
    for (std::string line; std::getline(in, line);)
        if (const auto eq = line.find('='); eq != std::string::npos)
            env[line.substr(0, eq)] = line.substr(eq + 1);
    return env;
}

// srun's variables for task `procid` of a job of `nnodes` nodes and `per_node` tasks each.
std::map<std::string, std::string> slurm_task(int procid, int nnodes, int per_node) {
    return {{"SLURM_JOB_ID", "4321"},
            {"SLURM_STEP_ID", "0"},
            {"SLURM_NNODES", std::to_string(nnodes)},
            {"SLURM_NODEID", std::to_string(procid / per_node)},
            {"SLURM_PROCID", std::to_string(procid)},
            {"SLURM_LOCALID", std::to_string(procid % per_node)},
            {"SLURM_NTASKS", std::to_string(nnodes * per_node)},
            {"SLURM_TASKS_PER_NODE", std::to_string(per_node) + "(x" + std::to_string(nnodes) + ")"},
            {"SLURM_JOB_NODELIST", "localhost,127.0.0.1"}};
}

}  // namespace

TEST_CASE(
    "srun --ntasks-per-node=2 over 2 nodes: each task is exactly its rank, with torchrun's environment") {
    const std::string dir = make_temp_dir();
    for (int procid = 0; procid < 4; ++procid) {
        CAPTURE(procid);
        LaunchResult r = run_launch({"--", worker_bin(), "env", dir}, slurm_task(procid, 2, 2));
        REQUIRE_MESSAGE(r.exit_code == 0, r.err);
        CHECK_MESSAGE(r.err.find("dp-launch: Slurm job 4321") != std::string::npos, r.err);
        auto env = rank_env(dir, procid);
        CHECK(env["RANK"] == std::to_string(procid));
        CHECK(env["LOCAL_RANK"] == std::to_string(procid % 2));
        CHECK(env["WORLD_SIZE"] == "4");
        CHECK(env["LOCAL_WORLD_SIZE"] == "2");
        CHECK(env["GROUP_RANK"] == std::to_string(procid / 2));
        CHECK(env["MASTER_ADDR"] == "localhost");  // the node list's first host
        CHECK(env["MASTER_PORT"] == "24321");      // 20000 + job id % 20000: every task agrees
    }
    // Each task started one process: no rank file beyond the four.
    CHECK_FALSE(file_exists(dir + "/rank_4.env"));
}

TEST_CASE(
    "srun --ntasks-per-node=1: one dp-launch per node spawns that node's ranks, and a flag given wins, said "
    "so") {
    const std::string dir = make_temp_dir();
    LaunchResult r = run_launch({"-n", "2", "--", worker_bin(), "env", dir}, slurm_task(1, 2, 1));
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    for (int rank : {2, 3}) {
        auto env = rank_env(dir, rank);
        CHECK(env["RANK"] == std::to_string(rank));
        CHECK(env["LOCAL_RANK"] == std::to_string(rank - 2));
        CHECK(env["WORLD_SIZE"] == "4");
        CHECK(env["GROUP_RANK"] == "1");
        CHECK(env["MASTER_PORT"] == "24321");
    }
    const std::string dir2 = make_temp_dir();
    LaunchResult p = run_launch({"-n", "1", "--master-port", "29999", "--", worker_bin(), "env", dir2},
                                slurm_task(0, 2, 1));
    REQUIRE_MESSAGE(p.exit_code == 0, p.err);
    CHECK(rank_env(dir2, 0)["MASTER_PORT"] == "29999");
    CHECK_MESSAGE(p.err.find("--master-port 29999") != std::string::npos, p.err);
}

TEST_CASE("Open MPI's ranks and a PyTorchJob's PET_* variables are used, and --cluster none ignores them") {
    const std::string dir = make_temp_dir();
    LaunchResult mpi = run_launch({"--", worker_bin(), "env", dir}, {{"OMPI_COMM_WORLD_RANK", "3"},
                                                                     {"OMPI_COMM_WORLD_SIZE", "4"},
                                                                     {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                                                     {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                                                     {"MASTER_ADDR", "127.0.0.1"},
                                                                     {"MASTER_PORT", "23456"}});
    REQUIRE_MESSAGE(mpi.exit_code == 0, mpi.err);
    auto env = rank_env(dir, 3);
    CHECK(env["RANK"] == "3");
    CHECK(env["LOCAL_RANK"] == "1");
    CHECK(env["WORLD_SIZE"] == "4");
    CHECK(env["MASTER_PORT"] == "23456");

    const std::map<std::string, std::string> pet = {{"PET_NNODES", "2"},
                                                    {"PET_NODE_RANK", "1"},
                                                    {"PET_NPROC_PER_NODE", "2"},
                                                    {"PET_MASTER_ADDR", "127.0.0.1"},
                                                    {"PET_MASTER_PORT", "23457"}};
    const std::string dir2 = make_temp_dir();
    LaunchResult job = run_launch({"-n", "2", "--", worker_bin(), "env", dir2}, pet);
    REQUIRE_MESSAGE(job.exit_code == 0, job.err);
    CHECK(rank_env(dir2, 2)["RANK"] == "2");
    CHECK(rank_env(dir2, 3)["WORLD_SIZE"] == "4");
    CHECK(rank_env(dir2, 3)["MASTER_PORT"] == "23457");

    const std::string dir3 = make_temp_dir();
    LaunchResult none = run_launch({"-n", "1", "--cluster", "none", "--", worker_bin(), "env", dir3}, pet);
    REQUIRE_MESSAGE(none.exit_code == 0, none.err);
    CHECK(rank_env(dir3, 0)["WORLD_SIZE"] == "1");
    CHECK(none.err.find("PyTorchJob") == std::string::npos);
}
