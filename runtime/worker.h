#pragma once
// dp-worker: one rank of the main job. It reads its place in the job from the launcher's
// environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, DP_STATUS_FD), joins the
// job's c10d group, takes its contiguous share of the requests (split_between_processes), writes
// each image atomically and reports it to the launcher on the status channel.

#include <optional>
#include <string>

namespace dp::runtime {

struct WorkerOptions {
    std::string model_dir;
    std::string requests_file;  // JSON Lines written by the launcher, one resolved request per line
    std::string output_dir;
    std::string dtype = "fp32";   // fp32, bf16, fp16
    std::string device = "auto";  // auto, cpu, cuda
    std::optional<uint64_t> random_weights;
    int batch_size = 1;  // consecutive requests with the same steps, guidance and size go through together
    bool cfg_parallel = false;  // pairs of ranks split the guidance branches (mesh dp x cfg=2)
    int ulysses = 1;            // ranks that split each image's tokens (Ulysses context parallelism)
    int ring = 1;               // ranks that pass each image's keys and values round a ring (Ring attention)
    int tp = 1;                 // ranks that split the transformer's weights (tensor parallelism)
    std::string device_map;     // balanced, auto or FILE.json: one process over several devices
    std::string max_memory;     // device_map's budgets, "DEV=SIZE,..."; empty: the visible GPUs
};

// Runs the rank and returns its exit code. Throws Error for what prevents it from starting.
int run_worker(const WorkerOptions& options);

}  // namespace dp::runtime
