#pragma once
// Scheduler detection: what a Slurm, MPI or Kubernetes allocation says about this process, read
// from an environment map. Pure functions: no getenv, no processes; the caller snapshots the
// environment once with environment_map() and decides what to do (Note [cluster shapes]).

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "launcher/launch_spec.h"

namespace dp::launcher {

// Note [cluster shapes]
// A scheduler starts dp-launch in one of two shapes:
//  - per node (`srun --ntasks-per-node=1 dp-launch ...`, a PyTorchJob pod running torchrun's
//    PET_* contract): this dp-launch spawns its node's ranks, as torchrun does;
//  - per rank (`srun --ntasks-per-node=G`, `mpirun -np N`, an operator's RANK/WORLD_SIZE): this
//    process IS one rank and must not spawn; the scheduler started the others.
// Every task of one job must agree on the master address and port without talking: the address
// is the first host of the node list, the port is derived from the job id (slurm_master_port).
// A Slurm batch shell (SLURM_JOB_ID without SLURM_STEP_ID) runs on the first node only: it is
// used as a one-node allocation when the job has one node, and refused for more (the other nodes
// would never start), with the srun line that starts one dp-launch per node.

using Environment = std::map<std::string, std::string>;

enum class ClusterKind { kNone, kSlurm, kMpi, kEnv };

// --cluster: auto detects in the order Slurm, MPI, PET_*/RANK (but OMPI_COMM_WORLD_RANK before
// Slurm: mpirun's ranks inherit the SLURM_* of its daemons' step); the others name one scheduler.
enum class ClusterChoice { kAuto, kNone, kSlurm, kMpi, kEnv };

// "auto", "none", "slurm", "mpi" or "env"; throws UsageError naming `source` and those values.
ClusterChoice parse_cluster_choice(const std::string& text, const std::string& source);
// The text parse_cluster_choice reads.
std::string cluster_choice_text(ClusterChoice choice);

struct ClusterAllocation {
    ClusterKind kind = ClusterKind::kNone;
    // "Slurm job 1234", "Open MPI", "MPI (PMI)", "PyTorchJob (PET_*)",
    // "RANK/WORLD_SIZE from the environment".
    std::string name;
    int nnodes = 1;
    int node_rank = 0;
    std::vector<std::string> hosts;  // the node list in order, when the scheduler gives one
    // Note [cluster shapes]. The rank fields below are meaningful only when per_rank; per node,
    // rank and local_rank are 0 and local_world_size is the ranks per node if the scheduler says
    // (PET_NPROC_PER_NODE as a number), else 0; world_size is nnodes * local_world_size.
    bool per_rank = false;
    int rank = 0;
    int local_rank = 0;
    int world_size = 0;
    int local_world_size = 0;
    std::string master_addr;  // empty: unknown, the caller needs --master-addr
    int master_port = 0;      // 0: unknown
    // The GPU ids this node's (per node) or this task's (per rank) allocation gives, in the ids a
    // child's CUDA_VISIBLE_DEVICES takes: CUDA_VISIBLE_DEVICES when set (Slurm sets it, relative
    // to the cgroup when devices are constrained), else SLURM_STEP_GPUS, else SLURM_JOB_GPUS,
    // else 0..SLURM_GPUS_ON_NODE-1. Empty: the allocation says nothing.
    std::vector<int> gpus;
};

// Slurm's host-list syntax expanded in order: "node[01-04,07]" (zero padding kept),
// "a1,b[2-3]", "rack[1-2]-node[1-2]" (the first bracket varies slowest). Throws UsageError
// naming the text for an unclosed or stray bracket, a reversed range, a non-number in brackets,
// an empty name, or more than kMaxNodes hosts.
std::vector<std::string> expand_slurm_hostlist(const std::string& text);

// Slurm's tasks-per-node syntax ("4", "4(x2)", "2(x3),1") expanded to one count per node.
// Throws UsageError naming `source` and the text.
std::vector<int> expand_slurm_tasks_per_node(const std::string& text, const std::string& source);

// The master port every task of Slurm job `job_id` derives alike: 20000 + job_id % 20000, in
// [20000, 39999], below Linux's default ephemeral range (32768-60999 overlaps the top; a job that
// needs another port gives --master-port). Two steps of one job running at once on one node must
// pass --master-port.
int slurm_master_port(unsigned long long job_id);

// The allocation `choice` selects from `env`, or nullopt (kNone, or kAuto with no scheduler
// variables). An explicit choice whose variables are absent, a missing companion variable, a
// non-number, a value out of range (SLURM_NODEID >= SLURM_NNODES, rank >= size), uneven ranks per
// node in the per-rank shape, or a multi-node Slurm batch shell throws UsageError naming the
// variables and values (Note [cluster shapes]).
std::optional<ClusterAllocation> detect_cluster(const Environment& env, ClusterChoice choice);

// The GPU this rank uses in the per-rank shape: gpus[local_rank] when the allocation lists one per
// local rank, the only one when it lists one, else -1 (leave CUDA_VISIBLE_DEVICES alone).
int rank_gpu(const ClusterAllocation& a);

// The one line dp-launch prints about the allocation: what it found and what it will do, then
// each of `notes` (the flags that won, from apply_allocation), e.g.
// "dp-launch: Slurm job 1234: 2 nodes (node01, node02), this is node 1, one rank per task
//  (rank 5 of 8, local rank 1); master node01:21234".
std::string describe_allocation(const ClusterAllocation& a, const std::vector<std::string>& notes = {});

// Fills spec's nnodes, node_rank, master_addr and master_port from the allocation where `given`
// (LaunchSpec field names set on the command line: "nnodes", "node_rank", "master_addr",
// "master_port", "num_processes", "local_addr") does not name them (local_addr: this node's host), and
// num_processes with the ranks per node in the per-rank shape (per node it stays as flags and GPUs decide).
// Returns one note per given flag that differs from the allocation ("--nnodes 1 overrides Slurm job 1234's 2
// nodes"). In the per-rank shape this process's rank is fixed by the scheduler, so a given --nnodes,
// --node-rank or --num-processes that contradicts it throws UsageError.
std::vector<std::string> apply_allocation(LaunchSpec& spec, const ClusterAllocation& a,
                                          const std::set<std::string>& given);

// The calling process's environment as a map (the input of detect_cluster).
Environment environment_map();
// Every variable detect_cluster reads, so that a caller with only a lookup function can build its
// map.
const std::vector<std::string>& cluster_variable_names();

}  // namespace dp::launcher
