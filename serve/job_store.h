#pragma once
// The server's jobs, in SQLite (Debian's libsqlite3) in the output root: each job's request body,
// state and outcome, written before the request is answered, so that a server killed at any
// moment and started again on the same root finds every job it accepted (Note [a queue that
// survives]). One connection, every call under one lock: the HTTP threads and the runner share it.
#include <sqlite3.h>

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace dp::serve {

enum class JobState { kQueued, kRunning, kDone, kFailed, kCancelled };

// "queued", "running", "done", "failed", "cancelled".
const char* state_name(JobState state);

struct JobRow {
    std::string id;  // "job-000001": the row's number, also its run folder's name
    int64_t number = 0;
    std::string kind;  // "jobs" (POST /v1/jobs) or "generations" (POST /v1/images/generations)
    JobState state = JobState::kQueued;
    int64_t prompts = 0;                            // the body's prompt lines
    int64_t images = 0;                             // the images they make (num_images_per_prompt counted)
    double created = 0, started = 0, finished = 0;  // Unix seconds; 0: not yet
    int attempts = 0;                               // runs started (a restart or a retry adds one)
    int exit_code = -1;                             // dp-launch's, once finished
    std::string error;                              // why it failed, or was cancelled
    bool cancel_requested = false;
};

class JobStore {
  public:
    // Opens (or creates) the database at `path`. Throws std::runtime_error naming the file.
    explicit JobStore(const std::string& path);
    ~JobStore();
    JobStore(const JobStore&) = delete;
    JobStore& operator=(const JobStore&) = delete;

    // A queued job holding `body` (the JSONL its run reads), committed before it returns.
    JobRow add(const std::string& kind, const std::string& body, int64_t prompts, int64_t images);
    // The oldest queued job, now running with one more attempt; nullopt when none is queued.
    std::optional<JobRow> claim_next();
    // The same when `take` (called under the store's lock: it must not call the store) accepts
    // the oldest queued job; else nullopt, and it stays queued.
    std::optional<JobRow> claim_next_if(const std::function<bool(const JobRow&)>& take);
    // Jobs a killed or stopped server left running, queued again ahead of the others (their run
    // folders are resumed). Returns how many.
    int requeue_running();
    // A running job's end.
    void finish(const std::string& id, JobState state, int exit_code, const std::string& error);
    // A running job back in the queue (the server stops: its next start resumes it).
    void requeue(const std::string& id);
    std::optional<JobRow> get(const std::string& id);
    std::string body(const std::string& id);
    // Queued jobs ahead of `id` (0: it is next); -1 when it is not queued.
    int64_t queue_position(const std::string& id);
    // Queued and running jobs.
    int64_t active();
    // Cancels a queued job at once (true); a running one is marked, for the runner (true); a
    // finished one is left as it is (false).
    bool cancel(const std::string& id);
    // The latest `limit` jobs, newest first.
    std::vector<JobRow> recent(int limit);
    // How many jobs are in each state, every state present.
    std::map<JobState, int64_t> counts();

  private:
    JobRow row_of(sqlite3_stmt* s) const;
    std::optional<JobRow> get_locked(const std::string& id);

    std::mutex mutex_;
    sqlite3* db_ = nullptr;
    std::string path_;
};

}  // namespace dp::serve
