#pragma once
// Runs the server's queued jobs one after another, each as the batch job would run it: dp-launch
// with the server's launch and pipeline flags on the job's JSONL, into the job's own run folder
// under the root (Note [each job is a batch job]).
#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "serve/job_store.h"
#include "serve/serve_options.h"
#include "serve/warm_ranks.h"

namespace dp::serve {

// Where a job's files are: its run folder (manifest.jsonl, images, gallery) and, beside the run
// folders, its prompt file and dp-launch's output.
std::string run_folder(const ServeOptions& options, const std::string& id);
std::string requests_folder(const ServeOptions& options);

// What the runner has done since the server started, for /metrics and /health.
struct RunnerStats {
    int64_t jobs_run = 0;      // runs that ended (retries counted)
    int64_t images = 0;        // images the finished runs recorded as made
    double busy_s = 0;         // seconds a job's dp-launch ran
    double last_image_ms = 0;  // the mean time per image of the last run that made one
    std::string running;       // the running jobs' ids, comma-separated; empty: none (from running_ids_)
    bool healthy = true;       // false once a job used up its attempts on a crash
    std::string unhealthy_reason;
};

class JobRunner {
  public:
    JobRunner(const ServeOptions& options, JobStore& store);
    ~JobRunner();  // the warm ranks stop

    // Claims and runs jobs until stop(); call from one thread.
    void run();
    // A job was queued: claim it now rather than at the next poll.
    void wake();
    // Stops: the running job's dp-launch gets SIGTERM (it ends at a step boundary and records what
    // it made), the job goes back to the queue for the next start, and run() returns.
    void stop();
    // `id` is running and its cancel was recorded: its dp-launch gets SIGTERM now.
    void cancel(const std::string& id);
    // Blocks until `id` is finished (done, failed, cancelled) or `timeout_s` passes; true if finished.
    bool wait_finished(const std::string& id, double timeout_s);
    RunnerStats stats();

  private:
    // The oldest queued job, and the queued jobs that can run with it (Note [jobs batched together]).
    std::vector<JobRow> claim();
    bool batchable(const JobRow& job) const;
    void run_one(const JobRow& job);
    void run_batch(const std::vector<JobRow>& jobs);
    // Starts `argv` as the running run of `ids` and waits for it, calling `poll` every 50 ms while
    // it runs; its exit code (128 + signal when killed, 71 when it could not start).
    int run_child(const std::vector<std::string>& argv, const std::vector<std::string>& ids,
                  const std::string& log_stem, const std::function<void()>& poll);
    void record_run(double seconds, int64_t images, double image_ms);
    struct Batch;
    void take_batch_records(Batch& batch);
    void finish_batched_job(Batch& batch, std::size_t job);

    const ServeOptions& options_;
    JobStore& store_;
    std::mutex mutex_;
    std::condition_variable wake_;      // a job queued, or stop
    std::condition_variable finished_;  // a job finished
    bool stopping_ = false;
    bool woken_ = false;
    pid_t child_ = -1;                      // the running job's dp-launch
    std::vector<std::string> running_ids_;  // the jobs it runs
    std::set<std::string> alone_;           // jobs a batch left unfinished: they run alone next
    RunnerStats stats_;
    std::unique_ptr<WarmRanks> warm_;  // Note [warm ranks]; none with a --worker of one's own
};

}  // namespace dp::serve
