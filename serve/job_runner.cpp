#include "serve/job_runner.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "launcher/errors.h"
#include "launcher/gallery.h"
#include "launcher/manifest.h"
#include "launcher/process.h"
#include "launcher/rank_env.h"
#include "protocol/atomic_file.h"
#include "protocol/errors.h"
#include "protocol/rank_pool.h"
#include "serve/batch.h"
#include "serve/run_records.h"
#include "strategies/sha256.h"

namespace dp::serve {
namespace {

using Clock = std::chrono::steady_clock;

// Note [each job is a batch job]: a job's images are the batch job's because a job is the batch
// job: the same dp-launch, with the flags the server was given, on the job's JSONL, into its own
// run folder. A run folder that exists is an earlier run of the job, cut short (the server was
// killed or stopped, or a rank died): --resume goes on from its manifest, so that each image is
// made once. Its ranks are the server's warm ranks, which keep the model loaded between jobs
// (Note [warm ranks], protocol/rank_pool.h): the job's dp-launch starts dp-attach in their place.
std::vector<std::string> job_command(const ServeOptions& options, const std::string& out,
                                     const std::string& prompts, bool resume) {
    std::vector<std::string> argv = {options.dp_launch};
    argv.insert(argv.end(), options.job_args.begin(), options.job_args.end());
    if (!options.worker.empty()) argv.insert(argv.end(), {"--worker", options.worker});
    argv.insert(argv.end(), {"-o", out, "-q"});
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
bool retryable(int code) {
    return code == launcher::kExitSystem || code == protocol::kExitCommunication || code > 128;
}

}  // namespace

std::string run_folder(const ServeOptions& options, const std::string& id) { return options.root + "/" + id; }

std::string requests_folder(const ServeOptions& options) { return options.root + "/.requests"; }

JobRunner::JobRunner(const ServeOptions& options, JobStore& store) : options_(options), store_(store) {
    if (options.warm) warm_ = std::make_unique<WarmRanks>(options);
}

JobRunner::~JobRunner() = default;

void JobRunner::run() {
    for (;;) {
        {
            std::unique_lock<std::mutex> lock(mutex_);
            if (stopping_) return;
        }
        const std::vector<JobRow> jobs = claim();
        if (jobs.empty()) {
            std::unique_lock<std::mutex> lock(mutex_);
            // A poll as well as the wake-up: a job queued by another thread between the claim and
            // this wait is found within the second.
            wake_.wait_for(lock, std::chrono::seconds(1), [&] { return stopping_ || woken_; });
            woken_ = false;
            continue;
        }
        if (jobs.size() == 1)
            run_one(jobs.front());
        else
            run_batch(jobs);
    }
}

bool JobRunner::batchable(const JobRow& job) const {
    return options_.batch && options_.batch_images > 1 && job.images <= options_.batch_images &&
           alone_.count(job.id) == 0 && !exists(run_folder(options_, job.id));
}

std::vector<JobRow> JobRunner::claim() {
    std::vector<JobRow> jobs;
    std::optional<JobRow> first = store_.claim_next();
    if (!first) return jobs;
    jobs.push_back(*first);
    if (!batchable(*first)) return jobs;
    int64_t images = first->images;
    while (std::optional<JobRow> more = store_.claim_next_if([&](const JobRow& next) {
        return batchable(next) && images + next.images <= options_.batch_images;
    })) {
        images += more->images;
        jobs.push_back(*more);
    }
    return jobs;
}

int JobRunner::run_child(const std::vector<std::string>& argv, const std::vector<std::string>& ids,
                         const std::string& log_stem, const std::function<void()>& poll) {
    try {
        if (warm_) warm_->ensure();
        launcher::ChildProcess child = launcher::spawn_child_to_files(
            argv, job_environment(warm_ ? warm_->dir() : ""), log_stem + ".out", log_stem + ".log");
        {
            std::lock_guard<std::mutex> lock(mutex_);
            child_ = child.pid;
            running_ids_ = ids;
            if (stopping_) ::kill(child.pid, SIGTERM);  // stop() came before the pid was known
        }
        for (const std::string& id : ids) {
            const std::optional<JobRow> now = store_.get(id);
            if (now && now->cancel_requested) ::kill(child.pid, SIGTERM);
        }
        int status = 0;
        for (;;) {
            const pid_t done = ::waitpid(child.pid, &status, poll ? WNOHANG : 0);
            if (done == child.pid) break;
            if (done < 0 && errno != EINTR)
                throw std::runtime_error(std::string("waitpid: ") + std::strerror(errno));
            if (poll) {
                poll();
                std::this_thread::sleep_for(std::chrono::milliseconds(50));
            }
        }
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    } catch (const std::exception& e) {
        std::ofstream(log_stem + ".log", std::ios::app) << "dp-launch serve: " << e.what() << "\n";
        return launcher::kExitSystem;
    }
}

void JobRunner::record_run(double seconds, int64_t images, double image_ms) {
    std::lock_guard<std::mutex> lock(mutex_);
    child_ = -1;
    running_ids_.clear();
    ++stats_.jobs_run;
    stats_.busy_s += seconds;
    stats_.images += images;
    if (images > 0) stats_.last_image_ms = image_ms / static_cast<double>(images);
}

void JobRunner::run_one(const JobRow& job) {
    const std::string requests = requests_folder(options_);
    const std::string prompts = requests + "/" + job.id + ".jsonl";
    protocol::write_file_atomically(prompts, store_.body(job.id));
    const bool resume = exists(run_folder(options_, job.id));
    const std::string err_path = requests + "/" + job.id + ".log";
    const Clock::time_point start = Clock::now();
    const int code = run_child(job_command(options_, run_folder(options_, job.id), prompts, resume), {job.id},
                               requests + "/" + job.id, {});
    // Note [warm ranks]: after a job that did not end well (a prompt that failed is not that:
    // 1), the warm ranks are gone or on their way; the next job starts them again, whole.
    if (warm_ && code != 0 && code != launcher::kExitFailure) warm_->stop();
    const RunCount made = count_run(run_folder(options_, job.id));
    record_run(std::chrono::duration<double>(Clock::now() - start).count(), made.ok, made.ms);
    bool stopping = false;
    {
        std::lock_guard<std::mutex> lock(mutex_);
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

// Note [jobs batched together] (serve/batch.cpp): the batch's records as they come, each written
// into its job's folder as the job's own run writes it.
struct JobRunner::Batch {
    const std::vector<JobRow>& jobs;
    BatchPlan plan;
    std::string folder;             // the batch job's run folder
    std::vector<int64_t> recorded;  // each job's records written
    std::vector<int64_t> failed;    // of which failed
    std::vector<bool> finished;     // each job's end stored
    std::vector<bool> seen;         // by the batch's index: written to its job
    Clock::time_point start = Clock::now();
};

namespace {

// The job's gallery, as its own dp-launch writes it at the end of its run.
void write_job_gallery(const std::string& dir, int world_size, double seconds) {
    const std::map<int64_t, nlohmann::json> records = launcher::read_manifest(dir + "/manifest.jsonl");
    launcher::GallerySummary summary;
    summary.world_size = world_size;
    summary.seconds = seconds;
    for (const auto& [index, r] : records) {
        if (summary.model.empty()) summary.model = r.value("model", "");
        (r.value("status", "") == "ok" ? summary.images : summary.failed) += 1;
    }
    launcher::write_gallery(
        dir,
        [&](const launcher::RecordVisitor& visit) {
            for (const auto& [index, r] : records) visit(r);
        },
        summary);
}

}  // namespace

void JobRunner::take_batch_records(Batch& b) {
    const std::map<int64_t, nlohmann::json> records = launcher::read_manifest(b.folder + "/manifest.jsonl");
    for (const auto& [index, record] : records) {
        const std::string status = record.value("status", "");
        if (index < 0 || static_cast<std::size_t>(index) >= b.seen.size() ||
            b.seen[static_cast<std::size_t>(index)] || (status != "ok" && status != "failed"))
            continue;
        const BatchImage& image = b.plan.images[static_cast<std::size_t>(index)];
        const JobRow& job = b.jobs[image.job];
        const std::string dir = run_folder(options_, job.id);
        std::filesystem::create_directories(dir);
        nlohmann::json r = record;
        r["index"] = image.index;
        r["line"] = image.line;
        if (status == "ok") {
            const std::string file = record.at("file").get<std::string>();
            const std::string name = name_in_job(file, image.index);
            const std::string png = png_for_job(read_bytes(b.folder + "/" + file), image.index, name);
            if (png.empty())
                throw std::runtime_error(file + " of the batch is not a PNG that dp-launch wrote");
            protocol::write_file_atomically(dir + "/" + name, png);
            const std::string latents = b.folder + "/" + file + ".latents.safetensors";
            if (exists(latents)) std::filesystem::rename(latents, dir + "/" + name + ".latents.safetensors");
            r["file"] = name;
            r["sha256"] = strategies::sha256_hex(png.data(), png.size());
        } else {
            ++b.failed[image.job];
        }
        const std::string manifest = dir + "/manifest.jsonl";
        const int fd = ::open(manifest.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        if (fd >= 0) ::close(fd);
        if (!launcher::ManifestAppender(manifest).append(r))
            throw std::runtime_error("cannot append to " + manifest + ": " + std::strerror(errno));
        b.seen[static_cast<std::size_t>(index)] = true;
        if (++b.recorded[image.job] == b.plan.job_images[image.job]) finish_batched_job(b, image.job);
    }
}

void JobRunner::finish_batched_job(Batch& b, std::size_t j) {
    const std::string& id = b.jobs[j].id;
    write_job_gallery(run_folder(options_, id), options_.world_size,
                      std::chrono::duration<double>(Clock::now() - b.start).count());
    if (b.failed[j] == 0)
        store_.finish(id, JobState::kDone, 0, "");
    else
        store_.finish(id, JobState::kFailed, launcher::kExitFailure,
                      std::to_string(b.failed[j]) + " of " + std::to_string(b.plan.job_images[j]) +
                          " image(s) failed (their records say why)");
    b.finished[j] = true;
    std::lock_guard<std::mutex> lock(mutex_);
    running_ids_.erase(std::remove(running_ids_.begin(), running_ids_.end(), id), running_ids_.end());
    finished_.notify_all();
}

void JobRunner::run_batch(const std::vector<JobRow>& jobs) {
    const std::string requests = requests_folder(options_);
    const std::string stem = requests + "/batch-" + jobs.front().id.substr(4);
    Batch b{jobs,
            {},
            stem,
            std::vector<int64_t>(jobs.size()),
            std::vector<int64_t>(jobs.size()),
            std::vector<bool>(jobs.size()),
            {}};
    std::vector<std::string> ids;
    std::vector<std::string> bodies;
    for (const JobRow& job : jobs) {
        ids.push_back(job.id);
        bodies.push_back(store_.body(job.id));
    }
    int code = launcher::kExitSystem;
    std::string trouble;  // why the batch's records could not be taken: it is stopped
    const auto take = [&] {
        if (!trouble.empty()) return;
        try {
            take_batch_records(b);
        } catch (const std::exception& e) {
            trouble = e.what();
            std::lock_guard<std::mutex> lock(mutex_);
            if (child_ > 0) ::kill(child_, SIGTERM);
        }
    };
    try {
        b.plan = plan_batch(bodies, BatchSettings{options_.base_seed, options_.images_per_prompt});
        b.seen.assign(b.plan.images.size(), false);
        std::filesystem::remove_all(b.folder);
        protocol::write_file_atomically(stem + ".jsonl", b.plan.jsonl);
        code = run_child(job_command(options_, b.folder, stem + ".jsonl", false), ids, stem, take);
        take();
    } catch (const std::exception& e) {
        trouble = e.what();
    }
    if (!trouble.empty())
        std::ofstream(stem + ".log", std::ios::app) << "dp-launch serve: " << trouble << "\n";
    if (warm_ && code != 0 && code != launcher::kExitFailure) warm_->stop();
    int64_t ok = 0;
    double ms = 0;
    for (const auto& [index, r] : launcher::read_manifest(b.folder + "/manifest.jsonl"))
        if (r.value("status", "") == "ok") ++ok, ms += r.value("ms", 0.0);
    record_run(std::chrono::duration<double>(Clock::now() - b.start).count(), ok, ms);
    if (code == 0) {
        std::lock_guard<std::mutex> lock(mutex_);
        stats_.healthy = true;
        stats_.unhealthy_reason.clear();
    }
    // What the batch left unfinished is a run of its own cut short (or not started): it runs alone
    // next, resumed from its folder, as an interrupted job does; a cancelled one ends here.
    for (std::size_t j = 0; j < jobs.size(); ++j) {
        if (b.finished[j]) continue;
        const std::optional<JobRow> now = store_.get(jobs[j].id);
        if (now && now->cancel_requested) {
            store_.finish(jobs[j].id, JobState::kCancelled, code,
                          "cancelled: " + std::to_string(b.recorded[j] - b.failed[j]) + " of " +
                              std::to_string(jobs[j].images) + " image(s) made and kept");
        } else {
            alone_.insert(jobs[j].id);
            store_.requeue(jobs[j].id);
        }
    }
    std::error_code ignored;
    std::filesystem::remove_all(b.folder, ignored);
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
    if (child_ > 0 && std::find(running_ids_.begin(), running_ids_.end(), id) != running_ids_.end())
        ::kill(child_, SIGTERM);
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
    RunnerStats s = stats_;
    for (const std::string& id : running_ids_) s.running += (s.running.empty() ? "" : ",") + id;
    return s;
}

}  // namespace dp::serve
