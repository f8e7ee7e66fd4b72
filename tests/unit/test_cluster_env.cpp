// Scheduler detection against the variables the schedulers document: Slurm's srun/sbatch "OUTPUT
// ENVIRONMENT VARIABLES", Open MPI's mpirun(1) "Exported Environment Variables", MPICH Hydra's
// PMI_*/MPI_LOCAL*, Kubeflow's PyTorchJob PET_* (torchrun's environment twins) and torchrun's
// RANK/WORLD_SIZE. Expected values are worked out by hand from those pages.

#include <doctest/doctest.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "launcher/cluster_env.h"
#include "launcher/errors.h"
#include "unit/fake_env.h"

using namespace dp::launcher;

namespace {

using Hosts = std::vector<std::string>;

std::string usage_error(const std::function<void()>& f) {
    try {
        f();
    } catch (const UsageError& e) {
        return e.what();
    }
    return "(no UsageError)";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Each row's changes to `base` (an empty value unsets the variable) make auto-detection refuse it,
// saying the row's text.
void check_refusals(const Environment& base, const std::vector<std::pair<Environment, std::string>>& rows) {
    for (const auto& [changes, says] : rows) {
        CAPTURE(says);
        Environment env = base;
        for (const auto& [k, v] : changes)
            if (v.empty())
                env.erase(k);
            else
                env[k] = v;
        CHECK(contains(usage_error([&] { detect_cluster(env, ClusterChoice::kAuto); }), says));
    }
}

// Where an allocation puts this process: what found it, whether each task is one rank, the rank
// of the world, the local rank of the node's, and the node of the nodes.
struct Place {
    ClusterKind kind;
    std::string name;
    bool per_rank;
    int rank, world_size, local_rank, local_world_size, node_rank, nnodes;
};

void check_place(const std::optional<ClusterAllocation>& a, const Place& want) {
    REQUIRE(a);
    CHECK(a->kind == want.kind);
    CHECK(a->name == want.name);
    CHECK(a->per_rank == want.per_rank);
    CHECK(a->rank == want.rank);
    CHECK(a->world_size == want.world_size);
    CHECK(a->local_rank == want.local_rank);
    CHECK(a->local_world_size == want.local_world_size);
    CHECK(a->node_rank == want.node_rank);
    CHECK(a->nnodes == want.nnodes);
}

// `srun --nodes=2 --ntasks-per-node=4 --gpus-per-node=4` in job 1234 on node01,node02: the task
// with global rank 5, the second task on node02.
Environment slurm_per_rank_task() {
    Environment env = dp::test::slurm_node02_task(1);
    env.insert({
        {"SLURM_JOBID", "1234"},
        {"SLURM_STEPID", "0"},
        {"SLURM_JOB_NUM_NODES", "2"},
        {"SLURM_NPROCS", "8"},
        {"SLURM_NODELIST", "node[01-02]"},
        {"SLURM_STEP_GPUS", "0,1,2,3"},
        {"CUDA_VISIBLE_DEVICES", "0,1,2,3"},
    });
    return env;
}

// `srun --nodes=4 --ntasks-per-node=1 dp-launch ...` in job 987654321: the task on the third node.
Environment slurm_per_node_task() {
    return {
        {"SLURM_JOB_ID", "987654321"},
        {"SLURM_STEP_ID", "1"},
        {"SLURM_NNODES", "4"},
        {"SLURM_STEP_NUM_NODES", "4"},
        {"SLURM_NODEID", "2"},
        {"SLURM_PROCID", "2"},
        {"SLURM_LOCALID", "0"},
        {"SLURM_NTASKS", "4"},
        {"SLURM_STEP_NUM_TASKS", "4"},
        {"SLURM_TASKS_PER_NODE", "1(x4)"},
        {"SLURM_STEP_TASKS_PER_NODE", "1(x4)"},
        {"SLURM_JOB_NODELIST", "gpu-a[07-08],gpu-b[1-2]"},
        {"SLURM_STEP_NODELIST", "gpu-a[07-08],gpu-b[1-2]"},
        {"SLURM_GPUS_ON_NODE", "8"},
    };
}

// `mpirun -np 8 --host a:4,b:4 dp-launch ...`: rank 6, the third on host b.
Environment open_mpi_rank() {
    return {
        {"OMPI_COMM_WORLD_RANK", "6"},
        {"OMPI_COMM_WORLD_SIZE", "8"},
        {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
        {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
        {"OMPI_COMM_WORLD_NODE_RANK", "2"},
        {"OMPI_UNIVERSE_SIZE", "8"},
        {"PMIX_RANK", "6"},
    };
}

// A Kubeflow PyTorchJob with 2 replicas and nprocPerNode 4: the worker pod with node rank 1.
Environment pytorchjob_pod() {
    return {
        {"PET_NNODES", "2"},
        {"PET_NPROC_PER_NODE", "4"},
        {"PET_NODE_RANK", "1"},
        {"PET_MASTER_ADDR", "pytorch-simple-master-0"},
        {"PET_MASTER_PORT", "23456"},
        {"MASTER_ADDR", "pytorch-simple-master-0"},
        {"MASTER_PORT", "23456"},
        {"WORLD_SIZE", "2"},
        {"RANK", "1"},
        {"PYTHONUNBUFFERED", "1"},
    };
}

}  // namespace

TEST_CASE("Slurm host lists expand as Slurm's own hostlist does") {
    CHECK(expand_slurm_hostlist("node[01-04,07]") == Hosts{"node01", "node02", "node03", "node04", "node07"});
    CHECK(expand_slurm_hostlist("a1,b[2-3]") == Hosts{"a1", "b2", "b3"});
    CHECK(expand_slurm_hostlist("rack[1-2]-node[1-2]") ==
          Hosts{"rack1-node1", "rack1-node2", "rack2-node1", "rack2-node2"});
    CHECK(expand_slurm_hostlist("host") == Hosts{"host"});
    CHECK(expand_slurm_hostlist("n[8-11]") == Hosts{"n8", "n9", "n10", "n11"});
    CHECK(expand_slurm_hostlist("n[098-101]") == Hosts{"n098", "n099", "n100", "n101"});
    CHECK(expand_slurm_hostlist("x[1-3]y") == Hosts{"x1y", "x2y", "x3y"});
    CHECK(expand_slurm_hostlist("c[1,3],d,e[001-002]") == Hosts{"c1", "c3", "d", "e001", "e002"});
    CHECK(expand_slurm_hostlist("gpu[5]") == Hosts{"gpu5"});
    CHECK(expand_slurm_hostlist("n[0-65535]").size() == 65536);
}

TEST_CASE("bad Slurm host lists are refused, naming the text and what is accepted") {
    for (const std::string bad : {"node[01-04", "node01]", "node[4-2]", "node[a-b]", "a,,b", "", "a[1-2,]",
                                  "a[[1]]", "n[0-65536]", "a[0-255]-b[0-256]", "a[1-40000],b[1-40000]"}) {
        CAPTURE(bad);
        const std::string what = usage_error([&] { expand_slurm_hostlist(bad); });
        CHECK(contains(what, "'" + bad + "'"));
        CHECK(contains(what, "accepted: comma-separated names such as node01, node[01-04,07]"));
    }
    CHECK(contains(usage_error([] { expand_slurm_hostlist("node[4-2]"); }), "the range 4-2 is reversed"));
    CHECK(contains(usage_error([] { expand_slurm_hostlist("node[01-04"); }), "unclosed '['"));
    CHECK(contains(usage_error([] { expand_slurm_hostlist("n[0-65536]"); }), "more than 65536 hosts"));
}

TEST_CASE("Slurm's tasks-per-node counts expand per node") {
    CHECK(expand_slurm_tasks_per_node("4", "SLURM_TASKS_PER_NODE") == std::vector<int>{4});
    CHECK(expand_slurm_tasks_per_node("4(x2)", "SLURM_TASKS_PER_NODE") == std::vector<int>{4, 4});
    CHECK(expand_slurm_tasks_per_node("2(x3),1", "SLURM_TASKS_PER_NODE") == std::vector<int>{2, 2, 2, 1});
    CHECK(expand_slurm_tasks_per_node("2,1", "SLURM_TASKS_PER_NODE") == std::vector<int>{2, 1});
    for (const std::string bad : {"", "x", "2(x", "2(x0)", "0", "2(3)", "4,,4"}) {
        CAPTURE(bad);
        CHECK(contains(usage_error([&] { expand_slurm_tasks_per_node(bad, "SLURM_TASKS_PER_NODE"); }),
                       "SLURM_TASKS_PER_NODE"));
    }
}

TEST_CASE("--cluster accepts auto, none, slurm, mpi and env") {
    CHECK(parse_cluster_choice("auto", "--cluster") == ClusterChoice::kAuto);
    CHECK(parse_cluster_choice("none", "--cluster") == ClusterChoice::kNone);
    CHECK(parse_cluster_choice("slurm", "--cluster") == ClusterChoice::kSlurm);
    CHECK(parse_cluster_choice("mpi", "--cluster") == ClusterChoice::kMpi);
    CHECK(parse_cluster_choice("env", "DP_CLUSTER") == ClusterChoice::kEnv);
    for (auto c : {ClusterChoice::kAuto, ClusterChoice::kNone, ClusterChoice::kSlurm, ClusterChoice::kMpi,
                   ClusterChoice::kEnv})
        CHECK(parse_cluster_choice(cluster_choice_text(c), "--cluster") == c);
    const std::string what = usage_error([] { parse_cluster_choice("k8s", "DP_CLUSTER"); });
    CHECK(contains(what, "DP_CLUSTER"));
    CHECK(contains(what, "k8s"));
    for (const char* v : {"auto", "none", "slurm", "mpi", "env"}) CHECK(contains(what, v));
}

TEST_CASE("Slurm, one task per rank: this process is rank SLURM_PROCID and does not spawn") {
    auto a = detect_cluster(slurm_per_rank_task(), ClusterChoice::kAuto);
    check_place(a, {ClusterKind::kSlurm, "Slurm job 1234", true, 5, 8, 1, 4, 1, 2});
    CHECK(a->hosts == Hosts{"node01", "node02"});
    CHECK(a->master_addr == "node01");
    CHECK(a->master_port == 21234);  // 20000 + 1234 % 20000
    CHECK(a->gpus == std::vector<int>{0, 1, 2, 3});
    CHECK(rank_gpu(*a) == 1);
    CHECK(describe_allocation(*a) ==
          "dp-launch: Slurm job 1234: 2 nodes (node01, node02), this is node 1, one rank per task "
          "(rank 5 of 8, local rank 1); master node01:21234");
}

TEST_CASE("Slurm, one task per node: this dp-launch spawns its node's ranks") {
    auto a = detect_cluster(slurm_per_node_task(), ClusterChoice::kSlurm);
    REQUIRE(a);
    CHECK_FALSE(a->per_rank);
    CHECK(a->nnodes == 4);
    CHECK(a->node_rank == 2);
    CHECK(a->hosts == Hosts{"gpu-a07", "gpu-a08", "gpu-b1", "gpu-b2"});
    CHECK(a->master_addr == "gpu-a07");
    CHECK(a->master_port == 34321);                              // 20000 + 987654321 % 20000
    CHECK(a->gpus == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7});  // SLURM_GPUS_ON_NODE=8, no ids given
    CHECK(describe_allocation(*a) ==
          "dp-launch: Slurm job 987654321: 4 nodes (gpu-a07, gpu-a08, gpu-b1, gpu-b2), this is node 2, one "
          "dp-launch per node starting its ranks; master gpu-a07:34321");
}

TEST_CASE("Slurm: GPU ids, exported MASTER_*, long node lists") {
    auto env = slurm_per_node_task();
    env["SLURM_STEP_GPUS"] = "4,5";
    CHECK(detect_cluster(env, ClusterChoice::kAuto)->gpus == std::vector<int>{4, 5});
    env["CUDA_VISIBLE_DEVICES"] = "0,1";  // what the process sees under constrained devices
    CHECK(detect_cluster(env, ClusterChoice::kAuto)->gpus == std::vector<int>{0, 1});
    env["MASTER_ADDR"] = "10.1.2.3";
    env["MASTER_PORT"] = "29500";
    auto a = detect_cluster(env, ClusterChoice::kAuto);
    CHECK(a->master_addr == "10.1.2.3");
    CHECK(a->master_port == 29500);

    auto big = slurm_per_node_task();
    big["SLURM_NNODES"] = big["SLURM_STEP_NUM_NODES"] = big["SLURM_NTASKS"] = big["SLURM_STEP_NUM_TASKS"] =
        "64";
    big["SLURM_STEP_NODELIST"] = "n[001-064]";
    CHECK(contains(describe_allocation(*detect_cluster(big, ClusterChoice::kAuto)),
                   "64 nodes (n001, n002, n003, n004, ... 60 more)"));
}

TEST_CASE("a Slurm batch script: one node is used as it is, more are refused with the srun line") {
    Environment batch = {{"SLURM_JOB_ID", "77"},         {"SLURM_NNODES", "1"},
                         {"SLURM_JOB_NODELIST", "gpu3"}, {"SLURM_NODEID", "0"},
                         {"SLURM_PROCID", "0"},          {"SLURM_LOCALID", "0"},
                         {"SLURM_TASKS_PER_NODE", "1"},  {"SLURM_JOB_GPUS", "2,3"}};
    auto a = detect_cluster(batch, ClusterChoice::kAuto);
    REQUIRE(a);
    CHECK_FALSE(a->per_rank);
    CHECK(a->nnodes == 1);
    CHECK(a->node_rank == 0);
    CHECK(a->master_addr == "gpu3");
    CHECK(a->master_port == 20077);
    CHECK(a->gpus == std::vector<int>{2, 3});

    batch["SLURM_NNODES"] = "2";
    batch["SLURM_JOB_NODELIST"] = "gpu[3-4]";
    const std::string what = usage_error([&] { detect_cluster(batch, ClusterChoice::kAuto); });
    CHECK(contains(what, "Slurm job 77 has 2 nodes"));
    CHECK(contains(what, "srun --ntasks-per-node=1 dp-launch"));
    CHECK(contains(what, "--cluster none"));
}

TEST_CASE("Slurm: inconsistent or missing values name the variable and its value") {
    check_refusals(
        slurm_per_rank_task(),
        {{{{"SLURM_NODEID", "2"}}, "SLURM_NODEID=2"},
         {{{"SLURM_NNODES", "two"}, {"SLURM_STEP_NUM_NODES", "two"}}, "SLURM_STEP_NUM_NODES 'two'"},
         {{{"SLURM_PROCID", "8"}}, "SLURM_PROCID=8"},
         {{{"SLURM_LOCALID", ""}}, "SLURM_LOCALID is not set"},
         {{{"SLURM_STEP_NODELIST", "node[01-03]"}}, "SLURM_STEP_NODELIST=node[01-03]"},
         {{{"SLURM_JOB_ID", "12x"}}, "SLURM_JOB_ID '12x'"},
         // srun -n 3 on two nodes: 2 and 1 tasks. world = nnodes * ranks per node cannot hold it.
         {{{"SLURM_NTASKS", "3"},
           {"SLURM_STEP_NUM_TASKS", "3"},
           {"SLURM_STEP_TASKS_PER_NODE", "2,1"},
           {"SLURM_PROCID", "2"},
           {"SLURM_LOCALID", "0"}},
          "same number of ranks on every node"}});
}

TEST_CASE("Open MPI: mpirun -np 8 over two hosts") {
    auto a = detect_cluster(open_mpi_rank(), ClusterChoice::kAuto);
    check_place(a, {ClusterKind::kMpi, "Open MPI", true, 6, 8, 2, 4, 1, 2});
    CHECK(a->master_addr.empty());
    CHECK(a->master_port == 0);
    CHECK(
        describe_allocation(*a) ==
        "dp-launch: Open MPI: 2 nodes, this is node 1, one rank per task (rank 6 of 8, local rank 2); master "
        "address not given (pass --master-addr)");

    auto env = open_mpi_rank();
    env["MASTER_ADDR"] = "a";
    env["MASTER_PORT"] = "29400";
    a = detect_cluster(env, ClusterChoice::kMpi);
    CHECK(a->master_addr == "a");
    CHECK(a->master_port == 29400);

    check_refusals(open_mpi_rank(),
                   {// 8 ranks, 3 here: uneven
                    {{{"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}},
                     "OMPI_COMM_WORLD_LOCAL_SIZE=3"},
                    {{{"OMPI_COMM_WORLD_RANK", "8"}}, "OMPI_COMM_WORLD_RANK=8"},
                    {{{"OMPI_COMM_WORLD_LOCAL_RANK", ""}}, "OMPI_COMM_WORLD_LOCAL_RANK is not set"}});
}

TEST_CASE("mpirun inside a Slurm job: the ranks' OMPI_COMM_WORLD_* win over the daemons' SLURM_*") {
    auto env = open_mpi_rank();
    // Open MPI starts one daemon per node with srun; its ranks inherit that step's variables.
    for (auto [k, v] : std::map<std::string, std::string>{{"SLURM_JOB_ID", "55"},
                                                          {"SLURM_STEP_ID", "0"},
                                                          {"SLURM_NNODES", "2"},
                                                          {"SLURM_NODEID", "1"},
                                                          {"SLURM_NTASKS", "2"},
                                                          {"SLURM_PROCID", "1"},
                                                          {"SLURM_LOCALID", "0"},
                                                          {"SLURM_STEP_NODELIST", "a,b"}})
        env[k] = v;
    auto a = detect_cluster(env, ClusterChoice::kAuto);
    CHECK(a->kind == ClusterKind::kMpi);
    CHECK(a->rank == 6);
    // Asked for explicitly, Slurm's view is what it is: one task per node.
    a = detect_cluster(env, ClusterChoice::kSlurm);
    CHECK(a->kind == ClusterKind::kSlurm);
    CHECK_FALSE(a->per_rank);
}

TEST_CASE("MPICH / Intel MPI (Hydra): PMI_RANK, PMI_SIZE and MPI_LOCALRANKID") {
    Environment env = {{"PMI_RANK", "3"},        {"PMI_SIZE", "4"},        {"PMI_FD", "6"},
                       {"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "2"}, {"PMI_JOBID", "kvs_1_0"}};
    check_place(detect_cluster(env, ClusterChoice::kAuto),
                {ClusterKind::kMpi, "MPI (PMI)", true, 3, 4, 1, 2, 1, 2});
    env.erase("MPI_LOCALRANKID");
    const std::string what = usage_error([&] { detect_cluster(env, ClusterChoice::kMpi); });
    CHECK(contains(what, "PMI_LOCAL_RANK or MPI_LOCALRANKID is not set"));
}

TEST_CASE("a PyTorchJob pod: PET_* describe the node, and its dp-launch spawns the ranks") {
    auto a = detect_cluster(pytorchjob_pod(), ClusterChoice::kAuto);
    // Per node, rank and local rank are 0.
    check_place(a, {ClusterKind::kEnv, "PyTorchJob (PET_*)", false, 0, 8, 0, 4, 1, 2});
    CHECK(a->master_addr == "pytorch-simple-master-0");
    CHECK(a->master_port == 23456);
    CHECK(describe_allocation(*a) ==
          "dp-launch: PyTorchJob (PET_*): 2 nodes, this is node 1, one dp-launch per node starting its ranks "
          "(4 per node); master pytorch-simple-master-0:23456");

    auto env = pytorchjob_pod();
    env["PET_NPROC_PER_NODE"] = "auto";
    a = detect_cluster(env, ClusterChoice::kEnv);
    CHECK(a->local_world_size == 0);
    env["PET_NNODES"] = "1:4";
    CHECK(contains(usage_error([&] { detect_cluster(env, ClusterChoice::kAuto); }), "PET_NNODES=1:4"));
    check_refusals(pytorchjob_pod(), {{{{"PET_NODE_RANK", "2"}}, "PET_NODE_RANK=2"},
                                      {{{"PET_NODE_RANK", ""}}, "PET_NODE_RANK is not set"}});
}

TEST_CASE("an operator's RANK/WORLD_SIZE: one rank per pod, or torchrun's full set") {
    Environment pod = {
        {"RANK", "3"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "10.0.0.5"}, {"MASTER_PORT", "29500"}};
    auto a = detect_cluster(pod, ClusterChoice::kAuto);
    check_place(a, {ClusterKind::kEnv, "RANK/WORLD_SIZE from the environment", true, 3, 4, 0, 1, 3, 4});
    CHECK(a->master_addr == "10.0.0.5");
    CHECK(a->master_port == 29500);

    Environment torchrun = {{"RANK", "3"},
                            {"WORLD_SIZE", "4"},
                            {"LOCAL_RANK", "1"},
                            {"LOCAL_WORLD_SIZE", "2"},
                            {"GROUP_RANK", "1"},
                            {"MASTER_ADDR", "127.0.0.1"},
                            {"MASTER_PORT", "29500"},
                            {"CUDA_VISIBLE_DEVICES", "0,1"}};
    a = detect_cluster(torchrun, ClusterChoice::kEnv);
    CHECK(a->nnodes == 2);
    CHECK(a->node_rank == 1);
    CHECK(a->local_rank == 1);
    CHECK(rank_gpu(*a) == 1);

    pod["RANK"] = "4";
    CHECK(contains(usage_error([&] { detect_cluster(pod, ClusterChoice::kAuto); }),
                   "RANK=4 is not below WORLD_SIZE=4"));
    pod.erase("WORLD_SIZE");
    CHECK(contains(usage_error([&] { detect_cluster(pod, ClusterChoice::kAuto); }), "WORLD_SIZE is not set"));
    pod = {{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"MASTER_PORT", "99999"}};
    CHECK(contains(usage_error([&] { detect_cluster(pod, ClusterChoice::kAuto); }), "MASTER_PORT '99999'"));
}

TEST_CASE("choices: none ignores everything, auto with nothing finds nothing, explicit needs its variables") {
    CHECK_FALSE(detect_cluster(slurm_per_rank_task(), ClusterChoice::kNone));
    CHECK_FALSE(detect_cluster({{"HOME", "/root"}, {"PATH", "/usr/bin"}}, ClusterChoice::kAuto));
    CHECK(
        contains(usage_error([] { detect_cluster({}, ClusterChoice::kSlurm); }), "SLURM_JOB_ID is not set"));
    CHECK(contains(usage_error([] { detect_cluster(slurm_per_rank_task(), ClusterChoice::kMpi); }),
                   "OMPI_COMM_WORLD_RANK"));
    CHECK(contains(usage_error([] { detect_cluster(open_mpi_rank(), ClusterChoice::kEnv); }), "PET_NNODES"));
    // Slurm comes before a PyTorchJob's variables in auto; env picks them when asked.
    auto env = slurm_per_node_task();
    for (const auto& [k, v] : pytorchjob_pod()) env[k] = v;
    CHECK(detect_cluster(env, ClusterChoice::kAuto)->kind == ClusterKind::kSlurm);
    CHECK(detect_cluster(env, ClusterChoice::kEnv)->kind == ClusterKind::kEnv);
}

TEST_CASE("apply_allocation fills what the flags did not give, and says which flags won") {
    auto a = *detect_cluster(slurm_per_node_task(), ClusterChoice::kAuto);
    LaunchSpec spec;
    spec.num_processes = 3;
    CHECK(apply_allocation(spec, a, {}).empty());
    CHECK(spec.nnodes == 4);
    CHECK(spec.node_rank == 2);
    CHECK(spec.master_addr == "gpu-a07");
    CHECK(spec.master_port == 34321);
    CHECK(spec.num_processes == 3);  // per node: flags and GPUs decide

    LaunchSpec given;
    given.nnodes = 1;
    given.node_rank = 0;
    given.master_port = 29500;
    given.master_addr = "gpu-a07";
    auto notes = apply_allocation(given, a, {"nnodes", "node_rank", "master_port", "master_addr"});
    CHECK(notes == std::vector<std::string>{"--nnodes 1 overrides Slurm job 987654321's 4 nodes",
                                            "--node-rank 0 overrides Slurm job 987654321's node 2",
                                            "--master-port 29500 overrides Slurm job 987654321's 34321"});
    CHECK(given.nnodes == 1);
    CHECK(given.node_rank == 0);
    CHECK(given.master_port == 29500);
    CHECK(contains(describe_allocation(a, notes), "master gpu-a07:34321; --nnodes 1 overrides"));

    // Per rank: the ranks per node come from the scheduler; an unknown master stays as given.
    auto m = *detect_cluster(open_mpi_rank(), ClusterChoice::kAuto);
    LaunchSpec r;
    r.master_addr = "10.0.0.9";
    CHECK(apply_allocation(r, m, {"master_addr"}).empty());
    CHECK(r.num_processes == 4);
    CHECK(r.nnodes == 2);
    CHECK(r.node_rank == 1);
    CHECK(r.master_addr == "10.0.0.9");
    CHECK(r.master_port == 0);
    CHECK(r.world_size() == 8);

    // A flag that agrees with the scheduler is no news; one that contradicts a per-rank layout is refused.
    LaunchSpec same;
    same.num_processes = 4;
    CHECK(apply_allocation(same, m, {"num_processes"}).empty());
    LaunchSpec bad;
    bad.num_processes = 2;
    const std::string what = usage_error([&] { apply_allocation(bad, m, {"num_processes"}); });
    CHECK(contains(what, "--num-processes 2 contradicts Open MPI"));
    CHECK(contains(what, "rank 6 of 8"));
    CHECK(contains(what, "--cluster none"));
}
