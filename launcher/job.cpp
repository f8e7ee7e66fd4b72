#include "launcher/job.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cctype>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <sstream>

#include "launcher/atomic_file.h"
#include "launcher/errors.h"
#include "launcher/gallery.h"
#include "launcher/job_settings.h"
#include "launcher/manifest.h"
#include "launcher/model_location.h"
#include "launcher/node_exchange.h"
#include "launcher/output_folder.h"
#include "launcher/process.h"
#include "launcher/prompt_file.h"
#include "launcher/supervisor.h"
#include "launcher/system_info.h"
#include "launcher/terminal.h"
#include "launcher/values.h"
#include "protocol/job_file.h"
#include "protocol/status_events.h"
#include "strategies/cost_model.h"
#include "strategies/model_config.h"
#include "strategies/model_sizes.h"

namespace dp::launcher {
namespace {

constexpr std::size_t kMaxListedInvalid = 20;
constexpr std::size_t kRequestsPerPiece = 4096;

void make_dirs(const std::string& path) {
    for (std::size_t i = 1; i <= path.size(); ++i) {
        if (i == path.size() || path[i] == '/') {
            const std::string part = path.substr(0, i);
            if (mkdir(part.c_str(), 0777) != 0 && errno != EEXIST)
                throw IoError(errno_message("--output-dir " + path + ": cannot create " + part));
        }
    }
}

// The host name as a part of a file name.
std::string host_for_file_name() {
    std::string out;
    for (const char c : host_name()) out += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' ? c : '_';
    return out;
}

std::string local_temp_dir() {
    const char* tmp = std::getenv("TMPDIR");
    return tmp && *tmp ? tmp : "/tmp";
}

bool exists(const std::string& path) {
    struct stat st {};
    return stat(path.c_str(), &st) == 0;
}

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
    JobMonitor(const LaunchSpec& launch, const JobOptions& job, JobRecords records, protocol::JobFile job_file,
               std::vector<int64_t> order, std::string job_path)
        : launch_(launch),
          job_(job),
          records_(std::move(records)),
          job_file_(std::move(job_file)),
          job_path_(std::move(job_path)),
          order_(std::move(order)),
          to_run_(static_cast<int64_t>(order_.size())),
          start_(std::chrono::steady_clock::now()) {
        manifest_path_ = job.output_dir + "/manifest.jsonl";
        tty_ = Terminal::instance().is_tty(STDERR_FILENO);
        if (launch.launcher_count() > 1)
            exchange_.emplace(job.output_dir, launch.launcher_index(), launch.launcher_count(),
                              launch.node_timeout_s);
        if (!writer()) return;
        kept_ = records_.count(JobRecords::Status::kOk);
        // Whole or not at all: a job killed now leaves the earlier run's manifest, or this one.
        AtomicFile manifest(manifest_path_);
        records_.for_each_index([&](int64_t index, JobRecords::Status status) {
            if (status == JobRecords::Status::kPending) return;
            manifest.write(records_.record_line(index));
            manifest.write("\n");
        });
        manifest.commit();
        manifest_ = ManifestAppender(manifest_path_);
    }

    int tick_ms() const override { return exchange_ ? 500 : -1; }
    void on_tick() override {
        if (exchange_) exchange_->beat();
    }

    void on_status(int rank, std::string_view line) override {
        // Most lines are heartbeats, which the supervisor reads and nothing here needs: not parsed
        // a second time (a 100 000-prompt job's launcher spent most of its time parsing them).
        if (line.find("\"event\":\"heartbeat\"") != std::string_view::npos) return;
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
            }
        } else if (const auto* image = std::get_if<protocol::ImageEvent>(&*event)) {
            std::optional<nlohmann::json> r = pending(image->index);
            if (!r) return;
            (*r)["rank"] = rank;
            (*r)["status"] = "ok";
            (*r)["sha256"] = image->sha256;
            (*r)["ms"] = static_cast<int64_t>(image->ms);
            (*r)["width"] = image->width;
            (*r)["height"] = image->height;
            // The precision the rank ran in (--dtype auto resolved on its device).
            if (const auto d = dtype_of_.find(rank); d != dtype_of_.end()) (*r)["dtype"] = d->second;
            ++done_;
            append(*r);
        } else if (const auto* failed = std::get_if<protocol::FailedEvent>(&*event)) {
            std::optional<nlohmann::json> r = pending(failed->index);
            if (!r) return;
            (*r)["rank"] = rank;
            (*r)["status"] = "failed";
            (*r)["error"] = failed->error;
            r->erase("file");
            ++failed_;
            append(*r);
        } else if (const auto* take = std::get_if<protocol::TakeEvent>(&*event)) {
            std::vector<int64_t>& taken = taken_[rank];
            taken.insert(taken.end(), take->indices.begin(), take->indices.end());
        } else if (const auto* error = std::get_if<protocol::RankErrorEvent>(&*event)) {
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

    // Before the ranks restart: the job file is rewritten with the prompts that have no image yet
    // (failed and not run ones included), so the restart resumes instead of starting over.
    void on_restart() override {
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

    // Ends the job after run_launch returned `code`, and returns dp-launch's exit code. Launcher 0
    // merges the other launchers' records, marks prompts no rank reported, rewrites the manifest
    // sorted by index, writes the gallery and prints the summary; the others wait for its result
    // (Note [one job, several launchers]). A file that cannot be written is reported (exit 74).
    int finish(int code) {
        if (!writer()) return finish_as_follower(code);
        std::string lost;  // the launchers given up, for the records they left unmade
        int peer_code = 0;
        if (exchange_) {
            progress(true);
            for (NodeExchange::Peer& peer : exchange_->gather()) {
                for (auto& [index, record] : peer.records) {
                    std::optional<nlohmann::json> r = pending(index);
                    if (!r) continue;
                    const std::string status = record.value("status", "");
                    if (status == "ok") ++done_;
                    else if (status == "failed") ++failed_;
                    else if (status == "not_run") ++not_run_;
                    else continue;
                    records_.set(record);
                }
                const std::string name = launcher_name(peer.index, !launch_.spawned_local_ranks.empty());
                if (!peer.finished) {
                    lost += (lost.empty() ? "" : ", ") + name;
                    char silent[32];
                    std::snprintf(silent, sizeof(silent), "%.0f", peer.silent_s);
                    say(name + " wrote nothing to " + job_.output_dir + "/.dp-nodes for " + silent +
                        " s (--node-timeout): it is lost; the prompts it had not finished are not run, and "
                        "--resume makes them");
                } else if (peer.exit_code != kExitOk && peer_code == kExitOk) {
                    peer_code = peer.exit_code;
                }
            }
        }
        records_.for_each_index([&](int64_t index, JobRecords::Status status) {
            if (status != JobRecords::Status::kPending) return;
            nlohmann::json r = records_.record(index);
            mark_not_run(r, lost.empty() ? "" : lost + " lost before making it");
            records_.set(r);
        });
        if (!exchange_) progress(true);
        manifest_.close();
        try {
            // Sorted by index, a record at a time (Note [records on disk]).
            AtomicFile manifest(manifest_path_);
            records_.for_each_index([&](int64_t index, JobRecords::Status) {
                manifest.write(records_.record_line(index));
                manifest.write("\n");
            });
            manifest.commit();
        } catch (const IoError& e) {
            // The appended records stay: each is whole, and every finished prompt has one.
            report_write_error(e.what());
        }
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
        // The gallery, rewritten at the end of every run.
        GallerySummary summary;
        summary.model = job_.model;
        summary.world_size = launch_.world_size();
        summary.images = done_ + kept_;
        summary.failed = failed_;
        summary.invalid = invalid();
        summary.not_run = not_run_;
        summary.seconds = seconds;
        try {
            write_gallery(job_.output_dir, [&](const RecordVisitor& visit) {
                records_.for_each([&](int64_t, const nlohmann::json& r) { visit(r); });
            }, summary);
        } catch (const IoError& e) {
            report_write_error(e.what());
        }
        char line[640];
        std::snprintf(
            line, sizeof(line),
            "dp-launch: %lld images, %lld failed, %lld invalid, %lld not run, %.1f s, %.2f images/s -> %s%s\n",
            static_cast<long long>(done_ + kept_), static_cast<long long>(failed_),
            static_cast<long long>(invalid()), static_cast<long long>(not_run_), seconds,
            seconds > 0 ? done_ / seconds : 0.0, manifest_path_.c_str(),
            kept_ > 0 ? (" (" + std::to_string(kept_) + " kept from the earlier run)").c_str() : "");
        // The one line a batch script reads: printed under -q too.
        Terminal::instance().write(STDOUT_FILENO, line);
        int result = code;
        if (result == kExitOk) result = !lost.empty() ? protocol::kExitCommunication : peer_code;
        if (result == kExitOk && write_failed_) result = kExitIo;                 // a full disk: see the message
        if (result == kExitOk && failed_ + not_run_ > 0) result = kExitFailure;  // see the manifest
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

  private:
    bool writer() const { return !exchange_ || exchange_->index() == 0; }

    // Launcher K > 0: its records are in its file; launcher 0 makes the job's result.
    int finish_as_follower(int code) {
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
                ? "the ranks stopped before they agreed on the job, so there is no job-wide result; see their errors above"
                : "node 0 wrote nothing to " + job_.output_dir + "/.dp-nodes " + why +
                      " (--node-timeout): it is lost, and the job's manifest.jsonl and index.html may not list "
                      "every prompt; " + name + "'s records are kept in " + job_.output_dir + "/.dp-nodes/" +
                      exchange_->job_id() + "/, which a --resume run reads");
        return code != kExitOk ? code : protocol::kExitCommunication;
    }

    // The record of prompt `index` while no rank has reported it; else none.
    std::optional<nlohmann::json> pending(int64_t index) const {
        if (records_.status(index) != JobRecords::Status::kPending) return std::nullopt;
        return records_.record(index);
    }

    void mark_not_run(nlohmann::json& r, const std::string& why) {
        r["status"] = "not_run";
        if (!why.empty()) r["error"] = why;
        r.erase("file");
        ++not_run_;
    }

    int64_t invalid() const { return records_.count(JobRecords::Status::kInvalid); }

    // Keeps `record` as its prompt's and appends it to the manifest (or this node's records).
    void append(const nlohmann::json& record) {
        const std::string line = records_.set(record);
        if (!writer()) {
            if (!exchange_->append(record))
                report_write_error(errno_message("cannot append to this node's records in " + job_.output_dir +
                                                 "/.dp-nodes"));
            return;
        }
        if (!manifest_.is_open()) return;
        if (!manifest_.append_line(line)) {
            report_write_error(errno_message("cannot append to " + manifest_path_) +
                               " (its records so far are whole)");
            manifest_.close();
        }
    }

    void report_write_error(const std::string& what) {
        write_failed_ = true;
        say(what);
    }

    // A line of dp-launch's own, above the progress bar.
    static void say(const std::string& line) {
        Terminal::instance().write(STDERR_FILENO, "dp-launch: " + line + "\n");
    }

    // A bar redrawn in place on a terminal; in logs, a plain line every few seconds.
    void progress(bool last) {
        if (launch_.quiet) return;
        const auto now = std::chrono::steady_clock::now();
        const double elapsed = std::chrono::duration<double>(now - start_).count();
        const int64_t finished = done_ + failed_;
        const double rate = elapsed > 0 ? finished / elapsed : 0;
        const double eta = rate > 0 ? (to_run_ - finished) / rate : 0;
        char text[256];
        if (tty_) {
            // Redrawn in place, erasing to the end of the line; other lines go above it.
            const int width = 30;
            const int filled = to_run_ > 0 ? static_cast<int>(width * finished / to_run_) : width;
            std::snprintf(text, sizeof(text), "[%-*s] %lld/%lld  %.2f images/s  ETA %.0f s", width,
                          std::string(static_cast<std::size_t>(filled), '#').c_str(),
                          static_cast<long long>(finished), static_cast<long long>(to_run_), rate, eta);
            Terminal::instance().show(STDERR_FILENO, this, text);
            if (last) Terminal::instance().end(this, /*keep=*/true);
            return;
        } else if (last || std::chrono::duration<double>(now - last_line_).count() >= 5.0) {
            if (finished == printed_) return;  // nothing new since the last line
            printed_ = finished;
            std::snprintf(text, sizeof(text),
                          "dp-launch: progress %lld/%lld images, %.2f images/s, ETA %.0f s\n",
                          static_cast<long long>(finished), static_cast<long long>(to_run_), rate, eta);
            Terminal::instance().write(STDERR_FILENO, text);
            last_line_ = now;
        }
    }

    const LaunchSpec& launch_;
    const JobOptions& job_;
    JobRecords records_;
    protocol::JobFile job_file_;
    std::string job_path_;
    std::vector<int64_t> order_;
    std::map<int, std::pair<int64_t, int64_t>> shares_;  // rank -> its share [first, first + count)
    std::map<int, std::vector<int64_t>> taken_;           // dynamic: rank -> the prompts it took
    bool dynamic_ = false;                                 // a rank said the schedule is dynamic
    std::map<int, std::string> dtype_of_;                  // rank -> the precision it said it runs in
    int64_t to_run_;
    int64_t done_ = 0, failed_ = 0, not_run_ = 0, kept_ = 0;
    std::string manifest_path_;
    ManifestAppender manifest_;
    std::optional<NodeExchange> exchange_;  // with several launchers
    bool write_failed_ = false;
    bool tty_ = false;
    int64_t printed_ = 0;
    std::chrono::steady_clock::time_point start_, last_line_{};
};

}  // namespace

strategies::StrategyRequest strategy_request(const LaunchSpec& launch, const JobOptions& job,
                                             const strategies::ParallelSpec& spec) {
    strategies::StrategyRequest r;
    r.world = launch.world_size();
    r.num_processes = launch.num_processes;
    r.strategy = job.strategy;
    r.cfg_parallel = job.cfg_parallel;
    r.cfg_scale = cfg_scale_setting(job, spec.arguments);
    r.ulysses = job.ulysses;
    r.ring = job.ring;
    r.tp = job.tp;
    r.dp = job.dp;
    r.device_map = job.device_map;
    r.max_memory = job.max_memory;
    r.device = job.device;
    return r;
}

strategies::ResolvedStrategy resolve_job_strategy(const LaunchSpec& launch, const JobOptions& job) {
    const strategies::ParallelSpec& spec = strategies::parallel_spec_for_model(job.model);
    const int heads = static_cast<int>(strategies::read_transformer_shape(job.model, spec).heads);
    strategies::ResolvedStrategy resolved = strategies::resolve_strategy(strategy_request(launch, job, spec), spec, heads);
    // Planned once, here (every error now, before anything starts), when the budgets are known.
    resolved.device_map_plan = plan_device_map_for(with_strategy(job, resolved));
    return resolved;
}

JobOptions with_strategy(JobOptions job, const strategies::ResolvedStrategy& resolved) {
    job.dp = resolved.degrees.dp;
    job.ring = resolved.degrees.ring;
    job.ulysses = resolved.degrees.ulysses;
    job.tp = resolved.degrees.tp;
    job.device_map = resolved.device_map;
    return job;
}

JobOptions resolve_strategy(const LaunchSpec& launch, JobOptions job) {
    return with_strategy(job, resolve_job_strategy(launch, job));
}

std::optional<strategies::DeviceMapPlan> plan_device_map_for(const JobOptions& job) {
    if (job.device_map.empty()) return std::nullopt;
    const bool file = job.device_map != "balanced" && job.device_map != "auto";
    if (!file && job.max_memory.empty()) return std::nullopt;  // the GPUs' memory: the worker's
    try {
        const auto plan_at = [&](int64_t element_bytes) {
            return strategies::plan_device_map_spec(
                job.model, element_bytes, job.device_map, job.max_memory, {}, job.variant,
                strategies::components_left_out(job.model, strategies::parallel_spec_for_model(job.model), job.no_t5));
        };
        if (job.dtype != "auto") return plan_at(job.dtype == "fp32" ? 4 : 2);
        // --dtype auto is fp32 on CPU devices and bf16 on GPUs: the devices say which.
        strategies::DeviceMapPlan devices;
        if (!job.max_memory.empty()) {
            for (const strategies::DeviceBudget& b : strategies::parse_max_memory(job.max_memory))
                devices.devices.push_back(b.device);
        } else {
            devices = plan_at(4);  // a FILE.json: no budgets to exceed
        }
        return plan_at(expected_dtype(job, devices) == "fp32" ? 4 : 2);
    } catch (const std::exception& e) {
        throw UsageError("--device-map " + job.device_map + ": " + e.what());
    }
}

namespace {

// A config-only folder of a real model (models/README.md) makes images only from random weights.
void check_has_weights(const std::string& model) {
    const std::vector<std::string> missing =
        strategies::components_without_weights(model, strategies::parallel_spec_for_model(model));
    if (missing.empty()) return;
    std::string list;
    for (const std::string& c : missing) list += (list.empty() ? "" : ", ") + c;
    throw UsageError("--model " + model + ": the folder has configs only (" + list +
                     " list their tensors in tensors.json but hold no *.safetensors weights); pass "
                     "--random-weights SEED to run it with random weights of its real sizes, or point "
                     "--model at a folder with the real weights");
}

protocol::DeviceMapPlan to_protocol(const strategies::DeviceMapPlan& plan) {
    protocol::DeviceMapPlan out;
    out.devices = plan.devices;
    for (const strategies::Placement& p : plan.placements)
        out.placements.push_back({p.component, p.block, p.device, p.bytes});
    return out;
}

// What every rank is told: `job` (through `strategy`) without its requests.
protocol::JobFile job_file_for(const JobOptions& job, const strategies::ResolvedStrategy& strategy) {
    protocol::JobFile f;
    f.model_dir = job.model;
    f.random_weights = job.random_weights;
    f.output_dir = job.output_dir;
    f.dtype = job.dtype;
    f.device = job.device;
    f.batch_size = job.batch_size;
    f.variant = job.variant;
    f.no_t5 = job.no_t5;
    f.offload = job.offload;
    const strategies::MeshDegrees& d = strategy.degrees;
    f.mesh = {d.dp, d.cfg, d.ring, d.ulysses, d.tp};
    f.collective_timeout_s = job.collective_timeout_s;
    if (!job.device_map.empty()) {
        f.device_map = protocol::DeviceMapRequest{job.device_map, job.max_memory, std::nullopt};
        // The launcher's plan when it could make one; else the worker plans from its GPUs.
        if (strategy.device_map_plan) f.device_map->plan = to_protocol(*strategy.device_map_plan);
    }
    return f;
}

}  // namespace

int run_job(const LaunchSpec& launch, const JobOptions& requested) {
    const strategies::ResolvedStrategy strategy = resolve_job_strategy(launch, requested);
    const JobOptions job = with_strategy(requested, strategy);
    if (!job.random_weights) check_has_weights(job.model);
    if (!launch.quiet && strategy.degrees.replica_size() > 1) {
        std::cerr << "dp-launch: mesh " << strategies::Mesh(launch.world_size(), strategy.degrees).describe()
                  << std::endl;
        for (const std::string& note : strategy.notes) std::cerr << "dp-launch: " << note << std::endl;
    }
    const std::string name = job.prompts == "-" ? "<stdin>" : utf8_for_display(job.prompts);
    // What the model cannot run is refused here, before anything starts: a flag's setting is a
    // usage error, a JSONL line's makes that line invalid, the folder's own problems are the model's.
    const ModelRules rules = read_model_rules(job);
    check_job(job, rules);
    // Every prompt's settings, resolved once here so that every rank and the manifest agree; each
    // prompt's record and request go to `records` as it is read (Note [records on disk]).
    const std::string dtype = expected_dtype(job, strategy.device_map_plan);
    JobRecords records(local_temp_dir());
    protocol::JobFile job_file = job_file_for(job, strategy);
    // job_file.requests keeps each request's index and the settings the schedule is chosen by,
    // not its texts (prompt, file), which are in `records`. Gathered in pieces, then moved into
    // one vector of the exact size, so that no growth holds two copies.
    std::vector<std::vector<protocol::JobRequest>> pieces;
    const PromptFile file = read_prompt_file(
        job.prompts, [&](const PromptRecord& p) { return prompt_setting_problem(p, job, rules); },
        [&](PromptRecord&& p) {
            protocol::JobRequest q = job_request(p, job, rules);
            records.set(pending_record(q, p.line, job, dtype, rules));
            records.set_request(p.index, protocol::request_line(q));
            std::string().swap(q.prompt);
            std::string().swap(q.file);
            if (q.negative_prompt) q.negative_prompt = std::string();  // given or not is what counts
            if (pieces.empty() || pieces.back().size() == kRequestsPerPiece) pieces.emplace_back().reserve(kRequestsPerPiece);
            pieces.back().push_back(std::move(q));
        });
    job_file.requests.reserve(static_cast<std::size_t>(file.valid));
    for (std::vector<protocol::JobRequest>& piece : pieces) {
        for (protocol::JobRequest& q : piece) job_file.requests.push_back(std::move(q));
        std::vector<protocol::JobRequest>().swap(piece);
    }

    if (!file.invalid.empty() && !job.skip_invalid) {
        std::string text =
            "dp-launch: " + name + " has " + std::to_string(file.invalid.size()) +
            " invalid line(s); nothing was started (fix them, or pass --skip-invalid to run the rest):\n";
        for (std::size_t i = 0; i < file.invalid.size() && i < kMaxListedInvalid; ++i)
            text += "  " + file.invalid[i].reason + "\n";
        if (file.invalid.size() > kMaxListedInvalid)
            text += "  ... and " + std::to_string(file.invalid.size() - kMaxListedInvalid) + " more\n";
        std::cerr << text << std::flush;
        return kExitInputData;
    }
    if (file.valid == 0) {
        std::cout << "dp-launch: nothing to do: " << name << " has no prompts"
                  << (file.invalid.empty() ? "" : " that are valid") << std::endl;
        return kExitOk;
    }

    std::vector<std::string> clashes;
    if (job.overwrite && job.resume)
        throw UsageError("--overwrite and --resume: choose one (--overwrite makes every image again, "
                         "--resume only those that have none)");
    make_dirs(job.output_dir);
    // With several launchers, launcher 0 is the job's writer: it alone locks the folder, checks for
    // earlier outputs, clears leftovers and writes the manifest (Note [one job, several launchers]).
    const bool writer = launch.launcher_index() == 0;
    // Held until the job ends, from before the check for earlier outputs: no other job writes
    // here meanwhile (Note [output folder lock]).
    const OutputLock lock = writer ? OutputLock::acquire(job.output_dir) : OutputLock();
    const std::string manifest_path = job.output_dir + "/manifest.jsonl";
    std::map<int64_t, nlohmann::json> earlier;
    if (job.overwrite || job.resume) {
        earlier = read_manifest(manifest_path);
        // What the launchers of a killed multi-node run recorded and no manifest holds.
        for (auto& [index, r] : NodeExchange::read_node_records(job.output_dir)) {
            const auto it = earlier.find(index);
            if (it == earlier.end() || it->second.value("status", "") != "ok") earlier[index] = std::move(r);
        }
    }
    // The others make what launcher 0 decided; a different decision is refused by the ranks.
    const bool replace = job.overwrite || job.resume || !writer;
    if (!replace)
        records.for_each_index([&](int64_t index, JobRecords::Status status) {
            if (status != JobRecords::Status::kPending) return;
            const std::string path = job.output_dir + "/" + records.record(index).value("file", "");
            if (exists(path)) clashes.push_back(path);
        });
    for (const char* own : {"/manifest.jsonl", "/index.html"})
        if (!replace && exists(job.output_dir + own)) clashes.push_back(job.output_dir + own);
    if (!clashes.empty())
        throw UsageError(clashes.front() +
                         (clashes.size() > 1 ? " and " + std::to_string(clashes.size() - 1) + " more" : "") +
                         " already exist; pass --overwrite to replace them, --resume to make only the images "
                         "that are missing, or choose another --output-dir");
    if (job.resume) {
        for (auto& [index, kept] : images_to_keep(earlier, records, job.output_dir)) records.set(kept);
        // The requests stay in the prompt file's order.
        job_file.requests.erase(std::remove_if(job_file.requests.begin(), job_file.requests.end(),
                                               [&](const protocol::JobRequest& q) {
                                                   return records.status(q.index) != JobRecords::Status::kPending;
                                               }),
                                job_file.requests.end());
    }
    for (const InvalidPrompt& bad : file.invalid)
        records.set({{"index", bad.index}, {"line", bad.line}, {"status", "invalid"}, {"error", bad.reason}});

    // How the replicas share the pending prompts (Note [dynamic schedule], runtime/worker.cpp).
    const strategies::ScheduleChoice schedule =
        strategies::choose_schedule(job.schedule, job_file.requests, strategies::cost_rules(rules.sizes, rules.arguments),
                                    strategy.degrees.dp, job.batch_size);
    job_file.schedule = schedule.schedule;
    if (!launch.quiet && strategy.degrees.dp > 1 && !job_file.requests.empty())
        std::cerr << "dp-launch: " << strategies::describe_schedule(schedule) << std::endl;

    // The job's id: rank 0's launcher's is the one every launcher uses (Note [one job, several launchers]).
    job_file.job_id = host_for_file_name() + "-" + std::to_string(getpid()) + "-" +
                      std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                         std::chrono::system_clock::now().time_since_epoch())
                                         .count());
    // Launcher 0's job file is in the output folder; another node's on its own disk, where launcher
    // 0's clearing of leftovers cannot reach it.
    const std::string job_path =
        (writer ? job.output_dir + "/.dp-job-" : local_temp_dir() + "/dp-job-") + std::to_string(getpid()) + ".json";
    LaunchSpec spec = launch;
    const std::string worker = job.worker.empty() ? self_dir() + "/dp-worker" : job.worker;
    spec.command = {worker, "--job", job_path};
    if (launch.dry_run) {
        std::cout << job_file.requests.size() << " prompt(s) from " << name << " over " << spec.world_size()
                  << " rank(s); images to " << job.output_dir << "/\n"
                  << describe_dry_run(spec) << std::flush;
        return kExitOk;
    }

    if (writer) remove_leftovers(job.output_dir);  // of killed runs: ours is the only job here now
    if (job.overwrite && writer) {
        // The earlier run's images that this job does not make again would be listed nowhere. A
        // file's name starts with its prompt's index (image_file_name), so only that prompt makes it.
        for (const auto& [index, r] : earlier) {
            const std::string f = r.value("file", "");
            const bool made = records.status(index) == JobRecords::Status::kPending &&
                              records.record(index).value("file", "") == f;
            if (!f.empty() && f[0] != '.' && f.find('/') == std::string::npos && !made)
                std::remove((job.output_dir + "/" + f).c_str());
        }
    }
    // The job file goes when the job ends, however it ends.
    struct RemoveOnExit {
        std::string path;
        ~RemoveOnExit() {
            std::remove(path.c_str());
            std::remove((path + ".tmp." + std::to_string(getpid())).c_str());
        }
    } job_file_owner{job_path};
    std::vector<int64_t> order;  // the pending prompts in the job file's order
    order.reserve(job_file.requests.size());
    {
        protocol::JobFileWriter writer(job_path, job_file);
        for (const protocol::JobRequest& q : job_file.requests) {
            writer.add_line(records.request_line(q.index));
            order.push_back(q.index);
        }
        writer.commit();
    }
    std::vector<protocol::JobRequest>().swap(job_file.requests);
    const bool nothing_to_make = order.empty();
    JobMonitor monitor(launch, job, std::move(records), std::move(job_file), std::move(order), job_path);
    const int code = nothing_to_make ? kExitOk : run_launch(spec, &monitor);
    return monitor.finish(code);
}

}  // namespace dp::launcher
