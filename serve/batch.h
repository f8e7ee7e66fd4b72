#pragma once
// Queued jobs run together as one batch job, and each job's folder then holds what its own run
// would have written (Note [jobs batched together] in batch.cpp).
#include <cstdint>
#include <string>
#include <vector>

namespace dp::serve {

// What a job's own run takes from the server's flags to number and seed its images.
struct BatchSettings {
    uint64_t base_seed = 0;     // --seed
    int images_per_prompt = 1;  // --num-images-per-prompt
};

// One image of a batch: the job it belongs to (its place in the batch), and its index and line
// in that job's own prompt file.
struct BatchImage {
    std::size_t job = 0;
    int64_t index = 0;
    int64_t line = 0;
};

struct BatchPlan {
    std::string jsonl;                // the jobs' lines, job after job, each with its own seed
    std::vector<BatchImage> images;   // by the batch's image index
    std::vector<int64_t> job_images;  // how many images each job makes
};

// The jobs' JSONL bodies as one prompt file whose every line carries the seed the job's own run
// would give it. Throws std::runtime_error when a body has a line that does not parse (the body
// check let it in: a defect).
BatchPlan plan_batch(const std::vector<std::string>& bodies, const BatchSettings& settings);

// The name the job's own run gives image `index`, from the image's name in the batch: the index
// that begins "{index:05d}-{slug}.png", replaced.
std::string name_in_job(const std::string& batch_file, int64_t index);

// A batch image's PNG as the job's own run writes it: its dp-launch text chunk (Note [image
// metadata]) holds the job's index and file name. Empty when `png` is not a PNG with that chunk.
std::string png_for_job(const std::string& png, int64_t index, const std::string& file);

}  // namespace dp::serve
