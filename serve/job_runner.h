#pragma once
// Runs the server's queued jobs one after another, each as the batch job would run it: dp-launch
// with the server's launch and pipeline flags on the job's JSONL, into the job's own run folder
// under the root (Note [each job is a batch job]).
#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

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
    std::string running;       // the running job's id; empty: none
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
    void run_one(const JobRow& job);

    const ServeOptions& options_;
    JobStore& store_;
    std::mutex mutex_;
    std::condition_variable wake_;      // a job queued, or stop
    std::condition_variable finished_;  // a job finished
    bool stopping_ = false;
    bool woken_ = false;
    pid_t child_ = -1;  // the running job's dp-launch
    RunnerStats stats_;
    std::unique_ptr<WarmRanks> warm_;  // Note [warm ranks]; none with a --worker of one's own
};

}  // namespace dp::serve
