#pragma once
// Note [checking a model before the ranks start]: before the output folder is made and any rank
// starts, the launcher runs `dp-worker --job FILE --check` once (runtime/worker.h): the model is
// loaded as every rank would load it, with every config bound, tokenizer, weight-file header and
// the components' fit checked, and no tensor data read or component built. What a rank would
// have failed with is the job's failure, with its exit code (65 for a model's problem) and
// message, before any rank is started: no folder, no manifest, no half a gigabyte per rank.
// dp-launch itself links no LibTorch, so the check is that one process (about half a second).

#include <string>

#include "protocol/job_file.h"

namespace dp::launcher {

// Runs `worker` --check on `job_file` (its requests are not needed). Throws the protocol::Error
// of its exit code with its message when it fails; does nothing when it passes.
void check_model_before_ranks(const std::string& worker, const protocol::JobFile& job_file,
                              const std::string& temp_dir, double timeout_s);

}  // namespace dp::launcher
