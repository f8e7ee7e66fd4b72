#pragma once
// The files through which the dp-launch processes of one multi-node main job make one result:
// each records its own ranks' prompts, and launcher 0 writes the job's manifest and gallery.

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "launcher/manifest.h"

namespace dp::launcher {

// Note [one job, several launchers]
// A main job over several nodes has one dp-launch per node (or, in the per-rank shape, one per
// rank); they share nothing but the output folder, which must be on storage every node sees, and
// the job's store, which only their ranks reach (the launchers do not link c10d). So:
//  - every launcher learns the job's id from its ranks' first status event (the id of rank 0's
//    launcher, agreed through the store: Note [one job on every node]); the files below live in
//    DIR/.dp-nodes/ID/, so a killed run's files are never mistaken for this run's;
//  - launcher K appends each record its ranks make to launcher-K.jsonl, whole or not at all
//    (launcher 0 appends to manifest.jsonl itself, as a one-node job does), and rewrites
//    launcher-K.state every second: a beat counter and, at the end, its exit code;
//  - when its own ranks have ended, launcher 0 waits until every other launcher's state says it
//    finished, or its beat has not changed for --node-timeout on launcher 0's clock (no clocks
//    are compared across nodes); it merges their records, marks what nobody made as not run,
//    writes manifest.jsonl and index.html, and then result.json with the job's exit code and
//    summary line;
//  - every other launcher, once its ranks have ended, waits for result.json the same way and
//    exits with the job's code: every node exits 0 exactly when every prompt has its image.
// After a lost node, launcher 0's manifest has every record made; if launcher 0 itself is lost,
// the survivors' records stay in their files and a --resume run reads them
// (read_node_records). Launcher 0 removes the earlier runs' folders at the end of a job.
class NodeExchange {
  public:
    // Launcher `index` of `count` (count >= 2) of a job writing to `output_dir`; a launcher silent
    // for `lost_after_s` is lost.
    NodeExchange(std::string output_dir, int index, int count, double lost_after_s);

    int index() const { return index_; }
    int count() const { return count_; }
    const std::string& job_id() const { return job_id_; }
    // The job's id, from the ranks' joined event; the first call creates the folder and writes
    // what was appended before. Throws IoError.
    void set_job_id(const std::string& id);

    // This launcher's record of one of its ranks' prompts (kept in memory until the id is known).
    // False when it could not be written (errno set).
    bool append(const nlohmann::json& record);
    // Rewrites launcher-K.state when a second has passed since the last time; at the end
    // (`exit_code` set) always. No-op before the id is known.
    void beat(std::optional<int> exit_code = std::nullopt);

    struct Peer {
        int index = 0;
        bool finished = false;  // its state says it ended, with exit_code
        int exit_code = 0;
        double silent_s = 0;  // how long nothing changed when it was given up as lost
        std::map<int64_t, nlohmann::json> records;
    };
    // Launcher 0: waits for every other launcher to finish or be lost (beating meanwhile) and
    // returns what each recorded.
    std::vector<Peer> gather();
    // Launcher 0: the job's result, for the others (result.json).
    void publish_result(const nlohmann::json& result);
    // Another launcher: launcher 0's result, or nullopt when launcher 0 was lost (`silent_s` says
    // for how long) or the id never became known.
    std::optional<nlohmann::json> await_result(double& silent_s);

    // The records earlier runs' launchers left in DIR/.dp-nodes (a killed job's), later files
    // winning as read_manifest's records do; empty when there are none.
    static std::map<int64_t, nlohmann::json> read_node_records(const std::string& output_dir);
    // The job's writer, at the end: every run's folder under DIR/.dp-nodes but `keep`'s.
    static void remove_runs(const std::string& output_dir, const std::string& keep);

  private:
    std::string dir() const;
    std::string state_path(int k) const;
    std::string records_path(int k) const;

    std::string output_dir_;
    int index_;
    int count_;
    double lost_after_s_;
    std::string job_id_;
    std::vector<nlohmann::json> buffered_;
    ManifestAppender records_;
    int64_t beats_ = 0;
    double last_beat_ = -1e9;
};

// "node 1" (one dp-launch per node) or "rank 3's dp-launch" (one per rank).
std::string launcher_name(int index, bool per_rank);

}  // namespace dp::launcher
