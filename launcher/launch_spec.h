#pragma once
// LaunchSpec: everything `dp-launch` needs to start a job, resolved from flags, DP_* environment
// variables, a JSON config file and defaults (in that order of precedence).

#include <optional>
#include <string>
#include <vector>

namespace dp::launcher {

struct LaunchSpec {
    int num_processes = 1;     // local ranks on this node
    std::vector<int> gpu_ids;  // empty: leave CUDA_VISIBLE_DEVICES alone
    int nnodes = 1;
    int node_rank = 0;
    std::string master_addr;  // empty: 127.0.0.1 on a single node
    int master_port = 0;      // 0: reserve a free port (single node only)
    std::string local_addr;   // this node's address for the ranks' connections; empty: the host's own
    // Main job on several nodes: a node silent this long in the shared output folder is lost.
    double node_timeout_s = 60.0;
    int max_restarts = 0;
    double shutdown_grace_s = 5.0;  // SIGTERM, then SIGKILL after this long
    std::string log_dir;            // empty: no per-rank log files
    std::string run_id = "none";    // TORCHELASTIC_RUN_ID, as torchrun's default
    // Main job: a rank that sends no heartbeat for this long is hung and the job stops (exit 75);
    // --load-timeout before its first heartbeat and while it loads the model. 0: never.
    double rank_timeout_s = 300.0;
    double load_timeout_s = 1800.0;
    // The whole job, every restart included; past it, exit 75. 0: no limit.
    double timeout_s = 0;
    bool prefix_output = true;
    bool quiet = false;
    std::string progress = "auto";  // --progress: auto, bar, lines, json or none (launcher/progress.h)
    bool dry_run = false;
    // torchrun's spellings that change nothing else: kept to be reported and checked.
    bool standalone = false;              // single node, local store on a free port
    std::string rdzv_backend = "static";  // c10d or static: both are rank 0's TCPStore here
    std::string rdzv_endpoint;            // HOST[:PORT]; sets master_addr (and master_port)
    bool module = false;                  // -m: the command is a Python module run as python3 -m
    bool no_python = false;               // run the command as is, even a .py script
    bool run_path = false;  // torchrun's --run-path: the script runs under python3 (the default)
    std::string tee;        // torchrun's 0-3 or per-rank map: output is always shown, see --log-dir
    std::string redirects;  // the same; dp-launch never hides a rank's output by it
    std::vector<int> shown_local_ranks;  // --local-ranks-filter; empty: every rank's output is shown
    double monitor_interval_s = 0.1;     // accepted; supervision is event-driven
    bool multi_gpu = false;              // accelerate's --multi_gpu: -n auto counts the visible GPUs
    // accelerate launch's settings for the program, exported as accelerate launch exports them:
    std::string mixed_precision;  // ACCELERATE_MIXED_PRECISION (no, fp16, bf16, fp8); empty: not set
    bool use_cpu = false;         // ACCELERATE_USE_CPU=true
    // OMP_NUM_THREADS, over an inherited value; unset: usable CPUs / processes, unless inherited.
    std::optional<int> cpu_threads_per_process;
    std::vector<std::string> command;  // argv of the program run once per rank
    // --cluster: auto, none, slurm, mpi or env (launcher/cluster_env.h, Note [cluster shapes]).
    std::string cluster = "auto";
    // The local ranks this dp-launch starts; empty: all num_processes of them. One scheduler task
    // per rank (srun --ntasks-per-node=G, mpirun -np N) starts exactly its own.
    std::vector<int> spawned_local_ranks;
    // The line saying which allocation was found and what dp-launch does with it; empty: none.
    std::string cluster_report;

    int world_size() const { return nnodes * num_processes; }
    // The local ranks this launcher starts: spawned_local_ranks, or every one of the node's.
    std::vector<int> local_ranks() const {
        if (!spawned_local_ranks.empty()) return spawned_local_ranks;
        std::vector<int> all;
        for (int i = 0; i < num_processes; ++i) all.push_back(i);
        return all;
    }
    // The main job's dp-launch processes: one per node, or one per rank when a scheduler starts
    // one task per rank (spawned_local_ranks); this one's index among them, rank 0's being 0.
    int launcher_count() const { return spawned_local_ranks.empty() ? nnodes : world_size(); }
    int launcher_index() const {
        return spawned_local_ranks.empty() ? node_rank
                                           : node_rank * num_processes + spawned_local_ranks.front();
    }
};

// Cross-field checks (node rank below nnodes, multi-node needs address and port, a command).
// Throws UsageError naming the flags involved.
// `require_command` is false for the main job, whose command dp-launch builds itself.
void validate_launch_spec(const LaunchSpec& spec, bool require_command = true);

// The argv each rank runs, as torchrun builds it: `python3 -m MODULE ARGS` with --module, the
// command as is with --no-python, `python3 SCRIPT.py ARGS` for a first word ending in .py, else as is.
std::vector<std::string> rank_command(const LaunchSpec& spec);

}  // namespace dp::launcher
