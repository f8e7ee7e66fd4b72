#pragma once
// `dp-launch serve`'s own settings (its flags, each with a DP_* twin, cli/command_line.cpp); the
// launch and pipeline flags it was given are each job's (`job_args`).
#include <cstdint>
#include <string>
#include <vector>

namespace dp::serve {

inline constexpr int kDefaultPort = 8000;

struct ServeOptions {
    std::string host = "127.0.0.1";     // loopback unless asked; any other needs api_key
    int port = kDefaultPort;            // 0: any free port (the one taken is printed)
    std::string api_key;                // --api-key / DP_API_KEY: checked on every request when set
    int max_queue = 64;                 // queued and running jobs; more is answered 429
    int64_t max_prompts = 1000;         // prompt lines in one request; more is 413
    int64_t max_images = 16;            // n of one generations request; more is 413
    int64_t max_body_bytes = 8 << 20;   // a request's body; more is 413
    int64_t max_image_side = 4096;      // a line's width or height; more is 413
    double request_timeout_s = 600;     // how long POST /v1/images/generations waits for its images
    int max_attempts = 3;               // runs of one job (a rank that dies is started again)
    int world_size = 1;                 // the ranks each job runs on (/metrics)
    std::string root;                   // the output root: the job database and one folder per job
    std::string dp_launch;              // the dp-launch each job runs
    std::vector<std::string> job_args;  // its launch and pipeline flags (serve's own and -o left out)
    std::string worker;                 // each job's --worker: dp-attach for the warm ranks
    bool warm = true;                   // the warm ranks run the jobs (Note [warm ranks])
    bool quiet = false;                 // -q: no line per job on stderr
    // Note [jobs batched together]: queued jobs run as one batch job of up to this many images
    // (--batch-images; 1: each job alone), where `batch` allows it (PNG images, a fixed --seed).
    int64_t batch_images = 256;
    bool batch = false;
    uint64_t base_seed = 0;     // the jobs' --seed
    int images_per_prompt = 1;  // and --num-images-per-prompt
};

}  // namespace dp::serve
