#include "serve/job_store.h"

#include <chrono>
#include <cstdio>
#include <functional>
#include <stdexcept>

namespace dp::serve {
namespace {

// Note [a queue that survives]: a job is a row before its request is answered (each write is its
// own transaction, and SQLite's journal makes it whole or absent after a crash); the runner claims
// the oldest queued row and marks it running in one statement; a server that starts on a root
// whose rows say "running" was killed or stopped mid-job, and queues them again first. The run
// folder then holds what was made, and the job resumes (dp-launch --resume): no image is made
// twice and none is lost.
constexpr const char* kSchema =
    "CREATE TABLE IF NOT EXISTS jobs ("
    " number INTEGER PRIMARY KEY AUTOINCREMENT,"
    " kind TEXT NOT NULL,"
    " state TEXT NOT NULL,"
    " body BLOB NOT NULL,"
    " prompts INTEGER NOT NULL,"
    " images INTEGER NOT NULL,"
    " created REAL NOT NULL,"
    " started REAL NOT NULL DEFAULT 0,"
    " finished REAL NOT NULL DEFAULT 0,"
    " attempts INTEGER NOT NULL DEFAULT 0,"
    " requeued INTEGER NOT NULL DEFAULT 0,"
    " exit_code INTEGER NOT NULL DEFAULT -1,"
    " error TEXT NOT NULL DEFAULT '',"
    " cancel_requested INTEGER NOT NULL DEFAULT 0);"
    "CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state, requeued, number);";

constexpr const char* kColumns =
    "number, kind, state, prompts, images, created, started, finished, attempts, exit_code, error, "
    "cancel_requested";

double now_s() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

JobState state_of(const std::string& name) {
    for (JobState s :
         {JobState::kQueued, JobState::kRunning, JobState::kDone, JobState::kFailed, JobState::kCancelled})
        if (name == state_name(s)) return s;
    throw std::runtime_error("unknown job state '" + name + "' in the job database");
}

// "job-000042" from 42, and back (0 when `id` is not one).
std::string id_of(int64_t number) {
    char text[32];
    std::snprintf(text, sizeof(text), "job-%06lld", static_cast<long long>(number));
    return text;
}

int64_t number_of(const std::string& id) {
    if (id.size() < 5 || id.size() > 24 || id.compare(0, 4, "job-") != 0) return 0;
    int64_t n = 0;
    for (std::size_t i = 4; i < id.size(); ++i) {
        if (id[i] < '0' || id[i] > '9') return 0;
        n = n * 10 + (id[i] - '0');
    }
    return id == id_of(n) ? n : 0;  // one spelling per job
}

// A prepared statement, finalized when it goes.
class Statement {
  public:
    Statement(sqlite3* db, const char* sql) : db_(db) {
        if (sqlite3_prepare_v2(db, sql, -1, &s_, nullptr) != SQLITE_OK)
            throw std::runtime_error(std::string("job database: ") + sqlite3_errmsg(db));
    }
    ~Statement() { sqlite3_finalize(s_); }
    Statement(const Statement&) = delete;
    Statement& operator=(const Statement&) = delete;
    Statement& bind(int i, int64_t v) {
        sqlite3_bind_int64(s_, i, v);
        return *this;
    }
    Statement& bind(int i, double v) {
        sqlite3_bind_double(s_, i, v);
        return *this;
    }
    Statement& bind(int i, const std::string& v) {
        sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
        return *this;
    }
    Statement& bind_blob(int i, const std::string& v) {
        sqlite3_bind_blob(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
        return *this;
    }
    // True while a row is there.
    bool step() {
        const int rc = sqlite3_step(s_);
        if (rc == SQLITE_ROW) return true;
        if (rc == SQLITE_DONE) return false;
        throw std::runtime_error(std::string("job database: ") + sqlite3_errmsg(db_));
    }
    sqlite3_stmt* get() const { return s_; }

  private:
    sqlite3* db_;
    sqlite3_stmt* s_ = nullptr;
};

std::string text_column(sqlite3_stmt* s, int i) {
    const unsigned char* t = sqlite3_column_text(s, i);
    return t ? std::string(reinterpret_cast<const char*>(t),
                           static_cast<std::size_t>(sqlite3_column_bytes(s, i)))
             : std::string();
}

}  // namespace

const char* state_name(JobState state) {
    switch (state) {
        case JobState::kQueued:
            return "queued";
        case JobState::kRunning:
            return "running";
        case JobState::kDone:
            return "done";
        case JobState::kFailed:
            return "failed";
        case JobState::kCancelled:
            return "cancelled";
    }
    return "unknown";
}

JobStore::JobStore(const std::string& path) : path_(path) {
    if (sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                        nullptr) != SQLITE_OK) {
        const std::string why = db_ ? sqlite3_errmsg(db_) : "out of memory";
        sqlite3_close(db_);
        throw std::runtime_error("cannot open the job database " + path + ": " + why);
    }
    sqlite3_busy_timeout(db_, 5000);
    char* error = nullptr;
    // FULL: a committed job survives a power cut too, not only a killed server.
    const std::string setup = std::string("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;") + kSchema;
    if (sqlite3_exec(db_, setup.c_str(), nullptr, nullptr, &error) != SQLITE_OK) {
        const std::string why = error ? error : "unknown error";
        sqlite3_free(error);
        sqlite3_close(db_);
        throw std::runtime_error("cannot use the job database " + path + ": " + why +
                                 " (is it a dp-launch serve database?)");
    }
}

JobStore::~JobStore() { sqlite3_close(db_); }

JobRow JobStore::row_of(sqlite3_stmt* s) const {
    JobRow r;
    r.number = sqlite3_column_int64(s, 0);
    r.id = id_of(r.number);
    r.kind = text_column(s, 1);
    r.state = state_of(text_column(s, 2));
    r.prompts = sqlite3_column_int64(s, 3);
    r.images = sqlite3_column_int64(s, 4);
    r.created = sqlite3_column_double(s, 5);
    r.started = sqlite3_column_double(s, 6);
    r.finished = sqlite3_column_double(s, 7);
    r.attempts = sqlite3_column_int(s, 8);
    r.exit_code = sqlite3_column_int(s, 9);
    r.error = text_column(s, 10);
    r.cancel_requested = sqlite3_column_int(s, 11) != 0;
    return r;
}

JobRow JobStore::add(const std::string& kind, const std::string& body, int64_t prompts, int64_t images) {
    std::lock_guard<std::mutex> lock(mutex_);
    Statement s(
        db_,
        "INSERT INTO jobs (kind, state, body, prompts, images, created) VALUES (?, 'queued', ?, ?, ?, ?)");
    s.bind(1, kind).bind_blob(2, body).bind(3, prompts).bind(4, images).bind(5, now_s());
    s.step();
    return *get_locked(id_of(sqlite3_last_insert_rowid(db_)));
}

std::optional<JobRow> JobStore::claim_next() {
    std::lock_guard<std::mutex> lock(mutex_);
    // One statement: the row is running before anyone else can see it queued.
    Statement s(db_, (std::string("UPDATE jobs SET state = 'running', attempts = attempts + 1, started = ? "
                                  "WHERE number = (SELECT number FROM jobs WHERE state = 'queued' "
                                  "ORDER BY requeued DESC, number LIMIT 1) RETURNING ") +
                      kColumns)
                         .c_str());
    s.bind(1, now_s());
    if (!s.step()) return std::nullopt;
    JobRow row = row_of(s.get());
    while (s.step()) {
    }
    return row;
}

std::optional<JobRow> JobStore::claim_next_if(const std::function<bool(const JobRow&)>& take) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::optional<JobRow> next;
    {
        Statement s(db_, (std::string("SELECT ") + kColumns +
                          " FROM jobs WHERE state = 'queued' ORDER BY requeued DESC, number LIMIT 1")
                             .c_str());
        if (s.step()) next = row_of(s.get());
    }
    if (!next || !take(*next)) return std::nullopt;
    // Under the store's lock: nothing claimed or cancelled it since it was read.
    Statement s(db_, (std::string("UPDATE jobs SET state = 'running', attempts = attempts + 1, started = ? "
                                  "WHERE number = ? AND state = 'queued' RETURNING ") +
                      kColumns)
                         .c_str());
    s.bind(1, now_s()).bind(2, next->number);
    if (!s.step()) return std::nullopt;
    JobRow row = row_of(s.get());
    while (s.step()) {
    }
    return row;
}

int JobStore::requeue_running() {
    std::lock_guard<std::mutex> lock(mutex_);
    Statement s(db_, "UPDATE jobs SET state = 'queued', requeued = 1 WHERE state = 'running'");
    s.step();
    return sqlite3_changes(db_);
}

void JobStore::finish(const std::string& id, JobState state, int exit_code, const std::string& error) {
    std::lock_guard<std::mutex> lock(mutex_);
    Statement s(
        db_,
        "UPDATE jobs SET state = ?, exit_code = ?, error = ?, finished = ?, requeued = 0 WHERE number = ?");
    s.bind(1, std::string(state_name(state))).bind(2, static_cast<int64_t>(exit_code)).bind(3, error);
    s.bind(4, now_s()).bind(5, number_of(id));
    s.step();
}

void JobStore::requeue(const std::string& id) {
    std::lock_guard<std::mutex> lock(mutex_);
    Statement s(db_, "UPDATE jobs SET state = 'queued', requeued = 1 WHERE number = ? AND state = 'running'");
    s.bind(1, number_of(id));
    s.step();
}

std::optional<JobRow> JobStore::get_locked(const std::string& id) {
    const int64_t number = number_of(id);
    if (number <= 0) return std::nullopt;
    Statement s(db_, (std::string("SELECT ") + kColumns + " FROM jobs WHERE number = ?").c_str());
    s.bind(1, number);
    if (!s.step()) return std::nullopt;
    return row_of(s.get());
}

std::optional<JobRow> JobStore::get(const std::string& id) {
    std::lock_guard<std::mutex> lock(mutex_);
    return get_locked(id);
}

std::string JobStore::body(const std::string& id) {
    std::lock_guard<std::mutex> lock(mutex_);
    Statement s(db_, "SELECT body FROM jobs WHERE number = ?");
    s.bind(1, number_of(id));
    if (!s.step()) return {};
    const void* data = sqlite3_column_blob(s.get(), 0);
    const int size = sqlite3_column_bytes(s.get(), 0);
    return data ? std::string(static_cast<const char*>(data), static_cast<std::size_t>(size)) : std::string();
}

int64_t JobStore::queue_position(const std::string& id) {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::optional<JobRow> row = get_locked(id);
    if (!row || row->state != JobState::kQueued) return -1;
    // The claim order: requeued jobs first, then by number.
    Statement s(db_,
                "SELECT COUNT(*) FROM jobs WHERE state = 'queued' AND (requeued > "
                "(SELECT requeued FROM jobs WHERE number = ?1) OR (requeued = (SELECT requeued FROM "
                "jobs WHERE number = ?1) AND number < ?1))");
    s.bind(1, row->number);
    s.step();
    return sqlite3_column_int64(s.get(), 0);
}

int64_t JobStore::active() {
    std::lock_guard<std::mutex> lock(mutex_);
    Statement s(db_, "SELECT COUNT(*) FROM jobs WHERE state IN ('queued', 'running')");
    s.step();
    return sqlite3_column_int64(s.get(), 0);
}

bool JobStore::cancel(const std::string& id) {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::optional<JobRow> row = get_locked(id);
    if (!row) return false;
    if (row->state == JobState::kQueued) {
        Statement s(db_,
                    "UPDATE jobs SET state = 'cancelled', finished = ?, error = 'cancelled before it "
                    "started', requeued = 0 WHERE number = ?");
        s.bind(1, now_s()).bind(2, row->number);
        s.step();
        return true;
    }
    if (row->state != JobState::kRunning) return false;
    Statement s(db_, "UPDATE jobs SET cancel_requested = 1 WHERE number = ?");
    s.bind(1, row->number);
    s.step();
    return true;
}

std::vector<JobRow> JobStore::recent(int limit) {
    std::lock_guard<std::mutex> lock(mutex_);
    Statement s(db_, (std::string("SELECT ") + kColumns + " FROM jobs ORDER BY number DESC LIMIT ?").c_str());
    s.bind(1, static_cast<int64_t>(limit));
    std::vector<JobRow> rows;
    while (s.step()) rows.push_back(row_of(s.get()));
    return rows;
}

std::map<JobState, int64_t> JobStore::counts() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::map<JobState, int64_t> out;
    for (JobState st :
         {JobState::kQueued, JobState::kRunning, JobState::kDone, JobState::kFailed, JobState::kCancelled})
        out[st] = 0;
    Statement s(db_, "SELECT state, COUNT(*) FROM jobs GROUP BY state");
    while (s.step()) out[state_of(text_column(s.get(), 0))] = sqlite3_column_int64(s.get(), 1);
    return out;
}

}  // namespace dp::serve
