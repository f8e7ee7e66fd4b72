#include "launcher/job_monitor.h"
#include "launcher/phase_report.h"

#include <unistd.h>

#include <cstdio>
#include <map>
#include <set>

#include "launcher/errors.h"
#include "launcher/gallery.h"
#include "launcher/prompt_file.h"
#include "launcher/terminal.h"
#include "protocol/atomic_file.h"
#include "protocol/call_arguments.h"
#include "protocol/errors.h"
#include "protocol/status_events.h"

namespace dp::launcher {
namespace {

// A line of dp-launch's own, above the progress bar.
void say(const std::string& line) { Terminal::instance().say(line); }

}  // namespace

JobMonitor::JobMonitor(const LaunchSpec& launch, const JobOptions& job, JobRecords records,
                       protocol::JobFile job_file, std::vector<int64_t> order, std::string job_path)
    : launch_(launch),
      job_(job),
      records_(std::move(records)),
      job_file_(std::move(job_file)),
      job_path_(std::move(job_path)),
      order_(std::move(order)),
      to_run_(static_cast<int64_t>(order_.size())),
      progress_(progress_mode(launch.progress, launch.quiet, Terminal::instance().is_tty(STDERR_FILENO)),
                to_run_, launch.world_size()),
      start_(std::chrono::steady_clock::now()) {
    manifest_path_ = job.output_dir + "/manifest.jsonl";
    progress_.event("job_start", {{"images", to_run_},
                                  {"world_size", launch.world_size()},
                                  {"output_dir", utf8_for_display(job.output_dir)},
                                  {"model", utf8_for_display(job.model)}});
    if (launch.launcher_count() > 1)
        exchange_.emplace(job.output_dir, launch.launcher_index(), launch.launcher_count(),
                          launch.node_timeout_s);
    if (!writer()) return;
    kept_ = records_.count(JobRecords::Status::kOk);
    // Whole or not at all: a job killed now leaves the earlier run's manifest, or this one.
    protocol::AtomicFile manifest(manifest_path_);
    records_.for_each_index([&](int64_t index, JobRecords::Status status) {
        if (status == JobRecords::Status::kPending) return;
        manifest.write(records_.record_line(index));
        manifest.write("\n");
    });
    manifest.commit();
    manifest_ = ManifestAppender(manifest_path_);
}

void JobMonitor::on_tick() {
    if (exchange_) exchange_->beat();
}

void JobMonitor::on_heartbeat(std::string_view line) {
    // Note [a failed start-up leaves no trace]: a rank began generating; the start-up is over.
    if (!generating_ && line.find("\"phase\":\"generating\"") != std::string_view::npos) {
        generating_ = true;
        progress_.generating();
    }
    if (!progress_.wants_heartbeat()) return;
    try {
        if (const auto event = protocol::parse_status_line(line))
            if (const auto* beat = std::get_if<protocol::HeartbeatEvent>(&*event)) progress_.heartbeat(*beat);
    } catch (const protocol::InputDataError&) {
        return;  // on_status says it once the rank sends something that counts
    }
    progress(false);
}

void JobMonitor::on_status(int rank, std::string_view line) {
    // Most lines are heartbeats, which the supervisor reads and nothing here needs: not parsed
    // a second time (a 100 000-prompt job's launcher spent most of its time parsing them).
    if (line.find("\"event\":\"heartbeat\"") != std::string_view::npos) return on_heartbeat(line);
    std::optional<protocol::StatusEvent> event;
    try {
        event = protocol::parse_status_line(line);
    } catch (const protocol::InputDataError& e) {
        say("rank " + std::to_string(rank) + ": " + e.what() + " (ignored)");
        return;
    }
    if (!event) return;  // not ours: a rank wrote something else on its status channel
    if (const auto* joined = std::get_if<protocol::JoinedEvent>(&*event)) {
        if (exchange_) {
            try {
                exchange_->set_job_id(joined->job_id);
            } catch (const IoError& e) {
                report_write_error(e.what());
            }
        }
    } else if (const auto* start = std::get_if<protocol::StartEvent>(&*event)) {
        if (!start->dtype.empty()) dtype_of_[rank] = start->dtype;
        taken_.erase(rank);  // a restarted rank takes afresh
        // Dynamic: no fixed share; every pending prompt of the job is to run, on some node.
        if (start->schedule == "dynamic") {
            dynamic_ = true;
            shares_.erase(rank);
        } else {
            shares_[rank] = {start->first, start->count};
        }
        if (exchange_ && !dynamic_) {
            // This node makes its ranks' shares only; replicas' shares are disjoint.
            std::set<std::pair<int64_t, int64_t>> distinct;
            for (const auto& [r, share] : shares_) distinct.insert(share);
            to_run_ = 0;
            for (const auto& share : distinct) to_run_ += share.second;
            progress_.set_to_run(to_run_);
        }
    } else if (const auto* image = std::get_if<protocol::ImageEvent>(&*event)) {
        std::optional<nlohmann::json> r = reported(image->index, rank, "ok");
        if (!r) return;
        (*r)["sha256"] = image->sha256;
        (*r)["ms"] = static_cast<int64_t>(image->ms);
        (*r)["width"] = image->width;
        (*r)["height"] = image->height;
        if (image->computed_steps >= 0) (*r)["computed_steps"] = image->computed_steps;
        if (!image->mag_ratios.empty()) (*r)["mag_ratios"] = image->mag_ratios;
        // The precision the rank ran in (--dtype auto resolved on its device).
        if (const auto d = dtype_of_.find(rank); d != dtype_of_.end()) (*r)["dtype"] = d->second;
        ++done_;
        append(*r);
        progress_.event("image", {{"index", image->index},
                                  {"rank", rank},
                                  {"file", image->file},
                                  {"seed", (*r)["seed"]},
                                  {"ms", static_cast<int64_t>(image->ms)}});
        progress_.finished(image->index, done_ + failed_);
    } else if (const auto* failed = std::get_if<protocol::FailedEvent>(&*event)) {
        std::optional<nlohmann::json> r = reported(failed->index, rank, "failed");
        if (!r) return;
        (*r)["error"] = failed->error;
        r->erase("file");
        ++failed_;
        append(*r);
        progress_.event("failure", {{"index", failed->index}, {"rank", rank}, {"error", failed->error}});
        progress_.finished(failed->index, done_ + failed_);
    } else if (const auto* phases = std::get_if<protocol::PhasesEvent>(&*event)) {
        phases_[rank] = *phases;
    } else if (const auto* take = std::get_if<protocol::TakeEvent>(&*event)) {
        std::vector<int64_t>& taken = taken_[rank];
        taken.insert(taken.end(), take->indices.begin(), take->indices.end());
    } else if (const auto* error = std::get_if<protocol::RankErrorEvent>(&*event)) {
        progress_.event("rank_error",
                        {{"rank", rank}, {"exit_code", error->exit_code}, {"error", error->message}});
        // The rank stopped (a collective failed, a file could not be written, a bug): its
        // share's (dynamic: what it took) unfinished prompts were not run; none of them failed.
        std::vector<int64_t> unfinished;
        if (const auto share = shares_.find(rank); share != shares_.end()) {
            const auto [first, count] = share->second;
            for (int64_t k = first; k < first + count && k < static_cast<int64_t>(order_.size()); ++k)
                unfinished.push_back(order_[static_cast<std::size_t>(k)]);
        } else if (const auto taken = taken_.find(rank); taken != taken_.end()) {
            unfinished = taken->second;
        }
        for (const int64_t index : unfinished) {
            std::optional<nlohmann::json> r = pending(index);
            if (!r) continue;
            mark_not_run(*r, "rank " + std::to_string(rank) + " stopped with exit code " +
                                 std::to_string(error->exit_code) + ": " + error->message);
            append(*r);
        }
    }
    progress(false);
}

void JobMonitor::on_restart() {
    order_.clear();
    shares_.clear();
    protocol::JobFileWriter job_file(job_path_, job_file_);
    records_.for_each_index([&](int64_t index, JobRecords::Status status) {
        using S = JobRecords::Status;
        if (status != S::kPending && status != S::kFailed && status != S::kNotRun) return;
        const std::string request = records_.request_line(index);
        if (status != S::kPending) {
            if (status == S::kFailed) --failed_;
            if (status == S::kNotRun) --not_run_;
            nlohmann::json r = records_.record(index);
            r["status"] = "pending";
            r.erase("error");
            r.erase("rank");
            r["file"] = nlohmann::json::parse(request).at("file");
            records_.set(r);
        }
        job_file.add_line(request);
        order_.push_back(index);
    });
    job_file.commit();
}

JobMonitor::Peers JobMonitor::merge_other_launchers() {
    Peers peers;
    progress(true);
    for (NodeExchange::Peer& peer : exchange_->gather()) {
        for (auto& [index, record] : peer.records) {
            if (!pending(index)) continue;
            const std::string status = record.value("status", "");
            if (status == "ok")
                ++done_;
            else if (status == "failed")
                ++failed_;
            else if (status == "not_run")
                ++not_run_;
            else
                continue;
            records_.set(record);
        }
        const std::string name = launcher_name(peer.index, !launch_.spawned_local_ranks.empty());
        if (!peer.finished) {
            peers.lost += (peers.lost.empty() ? "" : ", ") + name;
            char silent[32];
            std::snprintf(silent, sizeof(silent), "%.0f", peer.silent_s);
            say(name + " wrote nothing to " + job_.output_dir + "/.dp-nodes for " + silent +
                " s (--node-timeout): it is lost; the prompts it had not finished are not run, and "
                "--resume makes them");
        } else if (peer.exit_code != kExitOk && peers.code == kExitOk) {
            peers.code = peer.exit_code;
        }
    }
    return peers;
}

void JobMonitor::write_sorted_manifest() {
    manifest_.close();
    try {
        // Sorted by index, a record at a time (Note [records on disk]).
        protocol::AtomicFile manifest(manifest_path_);
        records_.for_each_index([&](int64_t index, JobRecords::Status) {
            manifest.write(records_.record_line(index));
            manifest.write("\n");
        });
        manifest.commit();
    } catch (const IoError& e) {
        // The appended records stay: each is whole, and every finished prompt has one.
        report_write_error(e.what());
    }
}

void JobMonitor::write_job_gallery(double seconds) {
    GallerySummary summary;
    summary.model = job_.model;
    summary.world_size = launch_.world_size();
    summary.images = done_ + kept_;
    summary.failed = failed_;
    summary.invalid = invalid();
    summary.not_run = not_run_;
    summary.seconds = seconds;
    try {
        write_gallery(
            job_.output_dir,
            [&](const RecordVisitor& visit) {
                records_.for_each([&](int64_t, const nlohmann::json& r) { visit(r); });
            },
            summary);
    } catch (const IoError& e) {
        report_write_error(e.what());
    }
}

std::string JobMonitor::summary_line(double seconds, bool undone) const {
    char line[640];
    std::snprintf(
        line, sizeof(line),
        "dp-launch: %lld images, %lld failed, %lld invalid, %lld not run, %.1f s, %.2f images/s -> %s%s\n",
        static_cast<long long>(done_ + kept_), static_cast<long long>(failed_),
        static_cast<long long>(invalid()), static_cast<long long>(not_run_), seconds,
        seconds > 0 ? done_ / seconds : 0.0,
        undone ? "nothing written (the output folder is as it was before the job)" : manifest_path_.c_str(),
        kept_ > 0 ? (" (" + std::to_string(kept_) + " kept from the earlier run)").c_str() : "");
    return line;
}

int JobMonitor::finish(int code) {
    if (!writer()) return finish_as_follower(code);
    const Peers peers = exchange_ ? merge_other_launchers() : Peers();
    records_.for_each_index([&](int64_t index, JobRecords::Status status) {
        if (status != JobRecords::Status::kPending) return;
        nlohmann::json r = records_.record(index);
        mark_not_run(r, peers.lost.empty() ? "" : peers.lost + " lost before making it");
        records_.set(r);
    });
    if (!exchange_) progress(true);
    write_sorted_manifest();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    write_job_gallery(seconds);  // rewritten at the end of every run
    write_mag_ratios();
    int result = code;
    if (result == kExitOk) result = !peers.lost.empty() ? protocol::kExitCommunication : peers.code;
    if (result == kExitOk && write_failed_) result = kExitIo;                // a full disk: see the message
    if (result == kExitOk && failed_ + not_run_ > 0) result = kExitFailure;  // see the manifest
    const std::string line = summary_line(seconds, undo_failed_start(result));
    // The one line a batch script reads: printed under -q too; with --progress json, as the last event.
    if (progress_.json())
        progress_.event("summary", {{"images", done_ + kept_},
                                    {"failed", failed_},
                                    {"invalid", invalid()},
                                    {"not_run", not_run_},
                                    {"kept", kept_},
                                    {"seconds", seconds},
                                    {"exit_code", result},
                                    {"manifest", undone_ ? nlohmann::json() : nlohmann::json(manifest_path_)},
                                    {"phases", phase_json(phases_)},
                                    {"line", line.substr(0, line.size() - 1)}});
    else {
        // Where the time went, on stderr with dp-launch's other lines: stdout keeps the one line a
        // script reads.
        if (!launch_.quiet) Terminal::instance().write_own(STDERR_FILENO, phase_lines(phases_));
        Terminal::instance().write_own(STDOUT_FILENO, line);
    }
    if (exchange_) {
        try {
            exchange_->publish_result({{"exit_code", result}, {"summary", line}});
        } catch (const IoError& e) {
            report_write_error(e.what());
        }
    }
    // The shared files of earlier runs: their records are in this manifest now.
    NodeExchange::remove_runs(job_.output_dir, exchange_ ? exchange_->job_id() : "");
    return result;
}

bool JobMonitor::undo_failed_start(int result) {
    if (result == kExitOk || exchange_ || generating_ || done_ + kept_ + failed_ > 0) return false;
    if (before_.manifest || before_.gallery) return false;  // an earlier run's files: kept as they are
    const std::string& dir = job_.output_dir;
    std::remove(manifest_path_.c_str());
    std::remove((dir + "/index.html").c_str());
    if (!before_.lock) std::remove((dir + "/.dp-lock").c_str());
    undone_ = true;
    return true;
}

void JobMonitor::write_mag_ratios() {
    // Note [mag cache calibration]: the records of mag_cache:calibrate=true images hold each one's
    // ratios; their mean per step, over the images of the most common step count, is what the next
    // run's mag_cache:mag_ratios=FILE reads (diffusers prints one run's; the mean of several prompts
    // is steadier).
    std::map<std::size_t, std::pair<std::vector<double>, int64_t>> by_steps;  // sums, images
    records_.for_each([&](int64_t, const nlohmann::json& r) {
        const auto it = r.find("mag_ratios");
        if (it == r.end() || !it->is_array() || it->empty() || r.value("status", "") != "ok") return;
        auto& [sums, images] = by_steps[it->size()];
        sums.resize(it->size(), 0.0);
        for (std::size_t i = 0; i < it->size(); ++i)
            sums[i] += (*it)[i].is_number() ? (*it)[i].get<double>() : 0.0;
        ++images;
    });
    if (by_steps.empty()) return;
    auto best = by_steps.begin();
    for (auto it = by_steps.begin(); it != by_steps.end(); ++it)
        if (it->second.second >= best->second.second) best = it;
    std::vector<double> mean = best->second.first;
    for (double& v : mean) v /= static_cast<double>(best->second.second);
    const std::string path = job_.output_dir + "/mag_ratios.json";
    try {
        protocol::AtomicFile file(path);
        nlohmann::json ratios = {
            {"mag_ratios", mean}, {"steps", best->first}, {"images", best->second.second}};
        protocol::put_path(ratios, "model", job_.model);  // Note [paths in the job file]
        file.write(ratios.dump() + "\n");
        file.commit();
    } catch (const IoError& e) {
        report_write_error(e.what());
        return;
    }
    say("MagCache ratios of " + std::to_string(best->second.second) + " image(s) of " +
        std::to_string(best->first) + " steps written to " + path +
        "; run with --cache mag_cache:mag_ratios=" + path + " to use them" +
        (by_steps.size() > 1 ? " (images of other step counts are left out)" : ""));
}

int JobMonitor::finish_as_follower(int code) {
    progress(true);
    if (order_.empty()) return code;  // no rank started: nothing to wait for
    exchange_->beat(code);
    double silent = 0;
    const std::optional<nlohmann::json> result = exchange_->await_result(silent);
    const std::string name = launcher_name(exchange_->index(), !launch_.spawned_local_ranks.empty());
    if (result) {
        const std::string line = result->value("summary", "");
        if (!line.empty()) Terminal::instance().write(STDOUT_FILENO, line);
        return code != kExitOk ? code : result->value("exit_code", kExitFailure);
    }
    char why[64];
    std::snprintf(why, sizeof(why), "for %.0f s", silent);
    say(exchange_->job_id().empty()
            ? "the ranks stopped before they agreed on the job, so there is no job-wide result; see their "
              "errors above"
            : "node 0 wrote nothing to " + job_.output_dir + "/.dp-nodes " + why +
                  " (--node-timeout): it is lost, and the job's manifest.jsonl and index.html may not list "
                  "every prompt; " +
                  name + "'s records are kept in " + job_.output_dir + "/.dp-nodes/" + exchange_->job_id() +
                  "/, which a --resume run reads");
    return code != kExitOk ? code : protocol::kExitCommunication;
}

std::optional<nlohmann::json> JobMonitor::pending(int64_t index) const {
    if (records_.status(index) != JobRecords::Status::kPending) return std::nullopt;
    return records_.record(index);
}

std::optional<nlohmann::json> JobMonitor::reported(int64_t index, int rank, const char* status) const {
    std::optional<nlohmann::json> r = pending(index);
    if (!r) return r;
    (*r)["rank"] = rank;
    (*r)["status"] = status;
    return r;
}

void JobMonitor::mark_not_run(nlohmann::json& r, const std::string& why) {
    r["status"] = "not_run";
    if (!why.empty()) r["error"] = why;
    r.erase("file");
    ++not_run_;
}

void JobMonitor::append(const nlohmann::json& record) {
    const std::string line = records_.set(record);
    if (!writer()) {
        if (!exchange_->append(record))
            report_write_error(
                errno_message("cannot append to this node's records in " + job_.output_dir + "/.dp-nodes"));
        return;
    }
    if (!manifest_.is_open()) return;
    if (!manifest_.append_line(line)) {
        report_write_error(errno_message("cannot append to " + manifest_path_) +
                           " (its records so far are whole)");
        manifest_.close();
    }
}

void JobMonitor::report_write_error(const std::string& what) {
    write_failed_ = true;
    say(what);
}

}  // namespace dp::launcher
