#pragma once
// What the launcher does with the ranks' status lines during the main job: the manifest, the
// progress, the restart's job file, and the job's end (the sorted manifest, the gallery, the
// summary line and the exit code). launcher/job.cpp prepares the job and runs it with one.

#include <chrono>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "launcher/job_options.h"
#include "launcher/launch_spec.h"
#include "launcher/manifest.h"
#include "launcher/node_exchange.h"
#include "launcher/progress.h"
#include "launcher/supervisor.h"
#include "protocol/job_file.h"
#include "protocol/status_events.h"

namespace dp::launcher {

// Follows the ranks' status channels: appends each finished record to the manifest as it comes
// (so a crash leaves every finished record readable) and shows progress. A prompt counts once:
// after a rank failure the restarted ranks get only the prompts that have no image yet.
class JobMonitor : public StatusListener {
  public:
    // `records`: every prompt's record, with the requests of the pending ones; those not "pending"
    // (invalid lines, images kept from an earlier run) are written to the manifest now. The job
    // file at `job_path` has `job_file`'s settings and the requests of the pending prompts
    // `order`, in the order the ranks' start events refer to. With several launchers (Note [one
    // job, several launchers]) only launcher 0 writes the manifest.
    JobMonitor(const LaunchSpec& launch, const JobOptions& job, JobRecords records,
               protocol::JobFile job_file, std::vector<int64_t> order, std::string job_path);

    int tick_ms() const override { return exchange_ ? 500 : -1; }
    void on_tick() override;
    void on_status(int rank, std::string_view line) override;
    // Before the ranks restart: the job file is rewritten with the prompts that have no image yet
    // (failed and not run ones included), so the restart resumes instead of starting over.
    void on_restart() override;

    // Ends the job after run_launch returned `code`, and returns dp-launch's exit code. Launcher 0
    // merges the other launchers' records, marks prompts no rank reported, rewrites the manifest
    // sorted by index, writes the gallery and prints the summary; the others wait for its result
    // (Note [one job, several launchers]). A file that cannot be written is reported (exit 74).
    int finish(int code);

    // Note [a failed start-up leaves no trace]: what the output folder held before this job. When
    // the job fails in its start-up (no rank began generating; no image made, kept or failed),
    // the files it wrote there
    // (manifest.jsonl, index.html, the lock file, the folder itself) are removed again, so the
    // same command can simply be run again.
    struct FolderBefore {
        bool existed = true, manifest = true, gallery = true, lock = true;
    };
    void set_folder_before(const FolderBefore& before) { before_ = before; }
    // After finish: whether it removed this job's files (the caller removes the folder it made,
    // once its own job file is gone).
    bool left_no_trace() const { return undone_; }

  private:
    // Note [a failed start-up leaves no trace]: true when it removed this job's files.
    bool undo_failed_start(int result);
    FolderBefore before_;
    bool undone_ = false;
    bool generating_ = false;  // a rank said it began generating
    bool writer() const { return !exchange_ || exchange_->index() == 0; }
    // Launcher K > 0: its records are in its file; launcher 0 makes the job's result.
    int finish_as_follower(int code);
    // Launcher 0 with several launchers: the others' records (and counts), once each has finished or
    // is lost.
    struct Peers {
        std::string lost;  // the launchers given up, for the records they left unmade
        int code = 0;      // the first failing launcher's exit code
    };
    Peers merge_other_launchers();
    // The manifest rewritten sorted by index; a write error is reported (exit 74).
    void write_sorted_manifest();
    // The gallery of every record, with the job's figures; a write error is reported.
    void write_job_gallery(double seconds);
    // The summary line ("dp-launch: N images, ..."), `undone`: the folder was left as it was.
    std::string summary_line(double seconds, bool undone) const;
    // MagCache calibration: the mean ratios of the records that hold them, to OUTPUT/mag_ratios.json.
    void write_mag_ratios();
    // The record of prompt `index` while no rank has reported it; else none.
    std::optional<nlohmann::json> pending(int64_t index) const;
    // pending(index) as rank `rank` reports it: `status` ("ok", "failed"), from that rank.
    std::optional<nlohmann::json> reported(int64_t index, int rank, const char* status) const;
    void mark_not_run(nlohmann::json& r, const std::string& why);
    int64_t invalid() const { return records_.count(JobRecords::Status::kInvalid); }
    // Keeps `record` as its prompt's and appends it to the manifest (or this node's records).
    void append(const nlohmann::json& record);
    void report_write_error(const std::string& what);
    // The bar, a line in logs, or the progress events (JobProgress).
    void progress(bool last) { progress_.show(done_ + failed_, last); }
    // A heartbeat line, parsed when progress wants it.
    void on_heartbeat(std::string_view line);

    const LaunchSpec& launch_;
    const JobOptions& job_;
    JobRecords records_;
    protocol::JobFile job_file_;
    std::string job_path_;
    std::vector<int64_t> order_;
    std::map<int, std::pair<int64_t, int64_t>> shares_;  // rank -> its share [first, first + count)
    std::map<int, std::vector<int64_t>> taken_;          // dynamic: rank -> the prompts it took
    bool dynamic_ = false;                               // a rank said the schedule is dynamic
    std::map<int, protocol::PhasesEvent> phases_;        // rank -> where its time went (Note [phase split])
    std::map<int, std::string> dtype_of_;                // rank -> the precision it said it runs in
    int64_t to_run_;
    int64_t done_ = 0, failed_ = 0, not_run_ = 0, kept_ = 0;
    std::string manifest_path_;
    ManifestAppender manifest_;
    std::optional<NodeExchange> exchange_;  // with several launchers
    bool write_failed_ = false;
    JobProgress progress_;
    std::chrono::steady_clock::time_point start_;
};

}  // namespace dp::launcher
