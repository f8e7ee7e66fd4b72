#include "serve/job_runner.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "launcher/errors.h"
#include "launcher/process.h"
#include "launcher/rank_env.h"
#include "protocol/atomic_file.h"
#include "protocol/rank_pool.h"
#include "serve/run_records.h"

namespace dp::serve {
namespace {

using Clock = std::chrono::steady_clock;

// Note [each job is a batch job]: a job's images are the batch job's because a job is the batch
// job: the same dp-launch, with the flags the server was given, on the job's JSONL, into its own
// run folder. A run folder that exists is an earlier run of the job, cut short (the server was
// killed or stopped, or a rank died): --resume goes on from its manifest, so that each image is
// made once. Its ranks are the server's warm ranks, which keep the model loaded between jobs
// (Note [warm ranks], protocol/rank_pool.h): the job's dp-launch starts dp-attach in their place.
std::vector<std::string> job_command(const ServeOptions& options, const std::string& id,
                                     const std::string& prompts, bool resume) {
    std::vector<std::string> argv = {options.dp_launch};
    argv.insert(argv.end(), options.job_args.begin(), options.job_args.end());
    if (!options.worker.empty()) argv.insert(argv.end(), {"--worker", options.worker});
    argv.insert(argv.end(), {"-o", run_folder(options, id), "-q"});
    if (resume) argv.push_back("--resume");
    argv.push_back(prompts);
    return argv;
}

// The server's environment, less its API key (a job has no use for it), with the warm ranks'
// folder `pool` when there is one.
std::vector<std::string> job_environment(const std::string& pool) {
    std::vector<std::string> env;
    for (std::string& kv : launcher::current_environment())
        if (kv.rfind("DP_API_KEY=", 0) != 0) env.push_back(std::move(kv));
    return pool.empty() ? env : launcher::merge_environment(env, {{protocol::kPoolDirVariable, pool}});
}

bool exists(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0;
}

// The last non-empty line of the file at `path` (dp-launch's own error), at most 500 bytes.
std::string last_line(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::string line, last;
    while (std::getline(in, line))
        if (!line.empty()) last = line;
    return last.substr(0, 500);
}

// A run that may succeed when run again: the system refused a resource (71), a rank hung or its
// collective failed (75), or a process was killed (128 + signal).
bool retryable(int code) { return code == launcher::kExitSystem || code == 75 || code > 128; }

}  // namespace

std::string run_folder(const ServeOptions& options, const std::string& id) { return options.root + "/" + id; }

std::string requests_folder(const ServeOptions& options) { return options.root + "/.requests"; }

JobRunner::JobRunner(const ServeOptions& options, JobStore& store) : options_(options), store_(store) {
    if (options.warm) warm_ = std::make_unique<WarmRanks>(options);
}

JobRunner::~JobRunner() = default;

void JobRunner::run() {
    for (;;) {
        std::optional<JobRow> job;
        {
            std::unique_lock<std::mutex> lock(mutex_);
            if (stopping_) return;
        }
        job = store_.claim_next();
        if (!job) {
            std::unique_lock<std::mutex> lock(mutex_);
            // A poll as well as the wake-up: a job queued by another thread between the claim and
            // this wait is found within the second.
            wake_.wait_for(lock, std::chrono::seconds(1), [&] { return stopping_ || woken_; });
            woken_ = false;
            continue;
        }
        run_one(*job);
    }
}

void JobRunner::run_one(const JobRow& job) {
    const std::string requests = requests_folder(options_);
    const std::string prompts = requests + "/" + job.id + ".jsonl";
    protocol::write_file_atomically(prompts, store_.body(job.id));
    const bool resume = exists(run_folder(options_, job.id));
    const std::string err_path = requests + "/" + job.id + ".log";
    const Clock::time_point start = Clock::now();
    int code = -1;
    try {
        if (warm_) warm_->ensure();
        launcher::ChildProcess child = launcher::spawn_child_to_files(
            job_command(options_, job.id, prompts, resume), job_environment(warm_ ? warm_->dir() : ""),
            requests + "/" + job.id + ".out", err_path);
        {
            std::lock_guard<std::mutex> lock(mutex_);
            child_ = child.pid;
            stats_.running = job.id;
            if (stopping_) ::kill(child.pid, SIGTERM);  // stop() came before the pid was known
        }
        const std::optional<JobRow> now = store_.get(job.id);
        if (now && now->cancel_requested) ::kill(child.pid, SIGTERM);
        const int status = launcher::wait_for(child.pid);
        code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    } catch (const std::exception& e) {
        std::ofstream(err_path, std::ios::app) << "dp-launch serve: " << e.what() << "\n";
        code = launcher::kExitSystem;
    }
    // Note [warm ranks]: after a job that did not end well (a prompt that failed is not that:
    // 1), the warm ranks are gone or on their way; the next job starts them again, whole.
    if (warm_ && code != 0 && code != launcher::kExitFailure) warm_->stop();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    const RunCount made = count_run(run_folder(options_, job.id));
    bool stopping = false;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        child_ = -1;
        stats_.running.clear();
        ++stats_.jobs_run;
        stats_.busy_s += seconds;
        stats_.images += made.ok;
        if (made.ok > 0) stats_.last_image_ms = made.ms / static_cast<double>(made.ok);
        stopping = stopping_;
    }
    const std::optional<JobRow> after = store_.get(job.id);
    if (after && after->cancel_requested) {
        store_.finish(job.id, JobState::kCancelled, code,
                      "cancelled: " + std::to_string(made.ok) + " of " + std::to_string(job.images) +
                          " image(s) made and kept");
    } else if (code == 0) {
        store_.finish(job.id, JobState::kDone, code, "");
        std::lock_guard<std::mutex> lock(mutex_);
        stats_.healthy = true;
        stats_.unhealthy_reason.clear();
    } else if (stopping) {
        store_.requeue(job.id);  // its next start resumes it
    } else if (retryable(code) && job.attempts < options_.max_attempts) {
        store_.requeue(job.id);  // Note [a queue that survives]: again, resumed, at the queue's head
    } else {
        const std::string why = last_line(err_path);
        store_.finish(job.id, JobState::kFailed, code,
                      why.empty() ? "dp-launch exited " + std::to_string(code) : why);
        if (retryable(code)) {
            std::lock_guard<std::mutex> lock(mutex_);
            stats_.healthy = false;
            stats_.unhealthy_reason = job.id + " failed " + std::to_string(job.attempts) +
                                      " time(s), last with exit code " + std::to_string(code) + ": " + why;
        }
    }
    finished_.notify_all();
}

void JobRunner::wake() {
    std::lock_guard<std::mutex> lock(mutex_);
    woken_ = true;
    wake_.notify_all();
}

void JobRunner::stop() {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    if (child_ > 0) ::kill(child_, SIGTERM);
    wake_.notify_all();
    finished_.notify_all();
}

void JobRunner::cancel(const std::string& id) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (child_ > 0 && stats_.running == id) ::kill(child_, SIGTERM);
    finished_.notify_all();
}

bool JobRunner::wait_finished(const std::string& id, double timeout_s) {
    const Clock::time_point until =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
    for (;;) {
        const std::optional<JobRow> row = store_.get(id);
        if (!row || (row->state != JobState::kQueued && row->state != JobState::kRunning)) return true;
        std::unique_lock<std::mutex> lock(mutex_);
        if (stopping_ || Clock::now() >= until) return false;
        finished_.wait_for(lock, std::chrono::milliseconds(200));
    }
}

RunnerStats JobRunner::stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
}

}  // namespace dp::serve
