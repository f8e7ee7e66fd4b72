#pragma once
// dp-worker: one rank of the main job. What it does comes from the job file dp-launch wrote
// (protocol/job_file.h); its place in the job from the launcher's environment (RANK, WORLD_SIZE,
// LOCAL_RANK, MASTER_ADDR, MASTER_PORT, DP_STATUS_FD). It joins the job's c10d group, takes its
// replica's contiguous share of the requests (split_between_processes) or, under the dynamic
// schedule, the next batch from the job's queue when free (prompt_queue.h), writes each image
// atomically and reports it on the status channel (protocol/status_events.h).
//
// Errors: a request the model cannot make (ModelError, InputDataError) is a failed prompt, and the
// rank goes on. Anything else ends the rank with an error event and its exit code: a collective
// that failed or timed out (CommunicationError, 75; the group's order is broken, so the rank calls
// no further collective), an image that cannot be written (74), a bug in our code (1).
// SIGTERM or SIGINT: the rank stops at the next denoising step and exits 128 + the signal.
// Heartbeats on the status channel (loading, each step, waiting) let dp-launch tell a hung rank
// from a slow one.

#include <string>

namespace dp::runtime {

// Runs the rank of the job file at `job_path` and returns its exit code (README "Exit codes").
// Never throws: every error is printed on stderr and, once the status channel is open, sent on it.
int run_worker(const std::string& job_path);

// Note [warm ranks] (protocol/rank_pool.h): `dp-worker --pool DIR`, a rank of dp-launch serve's
// warm group. It waits for jobs in DIR and runs each one as run_worker would, on the model and
// group its first job set up; returns (an exit code) after the first job that does not end with
// 0, or on a stop signal while it waits.
int run_pool(const std::string& pool);

// Note [checking a model before the ranks start]: dp-launch runs `dp-worker --job FILE --check`
// once before it starts any rank: the job's model is loaded as a rank loads it, in check mode
// (PipelineOptions::check_only: every config with its bounds, every tokenizer, every weight
// file's header, the components' fit; no tensor data), on the CPU in one process. Returns 0, or
// the exit code of what a rank would have failed with, its message on stderr. Never throws.
int check_model(const std::string& job_path);

}  // namespace dp::runtime
