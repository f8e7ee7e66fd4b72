#include "launcher/job.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "launcher/errors.h"
#include "launcher/gallery.h"
#include "launcher/process.h"
#include "launcher/prompt_file.h"
#include "launcher/supervisor.h"
#include "launcher/values.h"
#include "protocol/job_file.h"
#include "protocol/status_events.h"
#include "strategies/model_config.h"
#include "strategies/model_sizes.h"

namespace dp::launcher {
namespace {

constexpr std::size_t kMaxPromptFileBytes = 256u << 20;
constexpr std::size_t kMaxListedInvalid = 20;

std::string read_prompts(const std::string& path) {
    std::string bytes;
    if (path == "-") {
        std::ostringstream ss;
        ss << std::cin.rdbuf();
        bytes = ss.str();
    } else {
        std::ifstream in(path, std::ios::binary);
        if (!in) throw Error(errno_message("PROMPTS " + path + ": cannot read"), kExitNoInput);
        std::ostringstream ss;
        ss << in.rdbuf();
        bytes = ss.str();
    }
    if (bytes.size() > kMaxPromptFileBytes) throw InputDataError("PROMPTS " + path + ": larger than 256 MiB");
    return bytes;
}

// Standard input is JSON Lines when its first non-blank character opens an object.
bool looks_like_jsonl(const std::string& bytes) {
    const std::size_t first = bytes.find_first_not_of(" \t\r\n\xEF\xBB\xBF");
    return first != std::string::npos && bytes[first] == '{';
}

void make_dirs(const std::string& path) {
    for (std::size_t i = 1; i <= path.size(); ++i) {
        if (i == path.size() || path[i] == '/') {
            const std::string part = path.substr(0, i);
            if (mkdir(part.c_str(), 0777) != 0 && errno != EEXIST)
                throw IoError(errno_message("--output-dir " + path + ": cannot create " + part));
        }
    }
}

bool exists(const std::string& path) {
    struct stat st {};
    return stat(path.c_str(), &st) == 0;
}

std::string self_dir() {
    char buf[4096];
    const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
    if (n <= 0) return ".";
    std::string path(buf, static_cast<std::size_t>(n));
    return path.substr(0, path.rfind('/'));
}

bool is_model_dir(const std::string& dir) { return exists(dir + "/model_index.json"); }

}  // namespace

std::string resolve_model(const std::string& name, const std::string& source) {
    if (name.empty()) throw UsageError(source + ": expected a model folder or the name of a shipped model");
    if (name.find('/') != std::string::npos || is_model_dir(name)) {
        if (!is_model_dir(name))
            throw UsageError(source + " " + name +
                             ": no model_index.json there (expected a diffusers model folder)");
        return name;
    }
    std::vector<std::string> places;
    if (const char* dir = std::getenv("DP_MODELS_DIR"); dir && *dir)
        places.push_back(std::string(dir) + "/" + name);
    const std::string exe = self_dir();
    places.push_back(exe + "/../share/dp-launch/models/" + name);
    places.push_back(exe + "/../../models/" + name);
    for (const std::string& p : places) {
        if (!is_model_dir(p)) continue;
        char real[PATH_MAX];
        return realpath(p.c_str(), real) ? std::string(real) : p;
    }
    std::string searched;
    for (const std::string& p : places) searched += (searched.empty() ? "" : ", ") + p;
    throw UsageError(source + " " + name +
                     ": no such model folder, and no shipped model of that name (looked in " + searched +
                     ")");
}

namespace {

void write_file_atomically(const std::string& path, const std::string& text) {
    const std::string tmp = path + ".tmp." + std::to_string(getpid());
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        out << text;
        if (!out.flush()) throw IoError(errno_message("cannot write " + tmp));
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
        throw IoError(errno_message("cannot rename " + tmp + " to " + path));
}

// Follows the ranks' status channels: appends each finished record to the manifest as it comes
// (so a crash leaves every finished record readable) and shows progress.
class JobMonitor : public StatusListener {
  public:
    // `order`: the prompt indices in the job file's order, which the ranks' start events refer to.
    JobMonitor(const LaunchSpec& launch, const JobOptions& job, std::map<int64_t, nlohmann::json> records,
               std::vector<int64_t> order)
        : launch_(launch),
          job_(job),
          records_(std::move(records)),
          order_(std::move(order)),
          to_run_(static_cast<int64_t>(order_.size())),
          start_(std::chrono::steady_clock::now()) {
        manifest_path_ = job.output_dir + "/manifest.jsonl";
        manifest_.reset(
            open(manifest_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644));
        if (!manifest_) throw IoError(errno_message("cannot create " + manifest_path_));
        for (const auto& [index, record] : records_)
            if (record.value("status", "") == "invalid") append(record);
        tty_ = isatty(STDERR_FILENO) == 1;
    }

    void on_status(int rank, std::string_view line) override {
        std::optional<protocol::StatusEvent> event;
        try {
            event = protocol::parse_status_line(line);
        } catch (const protocol::InputDataError& e) {
            std::cerr << "dp-launch: rank " << rank << ": " << e.what() << " (ignored)" << std::endl;
            return;
        }
        if (!event) return;  // not ours: a rank wrote something else on its status channel
        if (const auto* start = std::get_if<protocol::StartEvent>(&*event)) {
            shares_[rank] = {start->first, start->count};
        } else if (const auto* image = std::get_if<protocol::ImageEvent>(&*event)) {
            nlohmann::json* r = pending(image->index);
            if (!r) return;
            (*r)["rank"] = rank;
            (*r)["status"] = "ok";
            (*r)["sha256"] = image->sha256;
            (*r)["ms"] = static_cast<int64_t>(image->ms);
            (*r)["width"] = image->width;
            (*r)["height"] = image->height;
            ++done_;
            append(*r);
        } else if (const auto* failed = std::get_if<protocol::FailedEvent>(&*event)) {
            nlohmann::json* r = pending(failed->index);
            if (!r) return;
            (*r)["rank"] = rank;
            (*r)["status"] = "failed";
            (*r)["error"] = failed->error;
            r->erase("file");
            ++failed_;
            append(*r);
        } else if (const auto* error = std::get_if<protocol::RankErrorEvent>(&*event)) {
            // The rank stopped (a collective failed, a file could not be written, a bug): its
            // share's unfinished prompts were not run; none of them failed.
            const auto share = shares_.find(rank);
            if (share == shares_.end()) return;
            const auto [first, count] = share->second;
            for (int64_t k = first; k < first + count && k < static_cast<int64_t>(order_.size()); ++k) {
                nlohmann::json* r = pending(order_[static_cast<std::size_t>(k)]);
                if (!r) continue;
                mark_not_run(*r, "rank " + std::to_string(rank) + " stopped with exit code " +
                                     std::to_string(error->exit_code) + ": " + error->message);
                append(*r);
            }
        }
        progress(false);
    }

    // Marks prompts no rank reported, rewrites the manifest sorted by index, prints the summary.
    void finish() {
        for (auto& [index, r] : records_)
            if (r.value("status", "") == "pending") mark_not_run(r, "");
        progress(true);
        std::string text;
        for (const auto& [index, r] : records_) text += r.dump() + "\n";
        write_file_atomically(manifest_path_, text);
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
        // The gallery, rewritten whole at the end of every run.
        std::vector<nlohmann::json> ordered;
        for (const auto& [index, r] : records_) ordered.push_back(r);
        GallerySummary summary;
        summary.model = job_.model;
        summary.world_size = launch_.world_size();
        summary.images = done_;
        summary.failed = failed_;
        summary.invalid = invalid();
        summary.not_run = not_run_;
        summary.seconds = seconds;
        try {
            write_file_atomically(job_.output_dir + "/index.html", gallery_html(ordered, summary));
        } catch (const IoError& e) {
            std::cerr << "dp-launch: " << e.what() << " (the images and manifest are written)" << std::endl;
        }
        char line[512];
        std::snprintf(
            line, sizeof(line),
            "dp-launch: %lld images, %lld failed, %lld invalid, %lld not run, %.1f s, %.2f images/s -> %s\n",
            static_cast<long long>(done_), static_cast<long long>(failed_), static_cast<long long>(invalid()),
            static_cast<long long>(not_run_), seconds, seconds > 0 ? done_ / seconds : 0.0,
            manifest_path_.c_str());
        std::fputs(line, stdout);
        std::fflush(stdout);
    }

    int64_t failed() const { return failed_ + not_run_; }

  private:
    // The record of prompt `index` while no rank has reported it; else nullptr.
    nlohmann::json* pending(int64_t index) {
        const auto it = records_.find(index);
        if (it == records_.end() || it->second.value("status", "") != "pending") return nullptr;
        return &it->second;
    }

    void mark_not_run(nlohmann::json& r, const std::string& why) {
        r["status"] = "not_run";
        if (!why.empty()) r["error"] = why;
        r.erase("file");
        ++not_run_;
    }

    int64_t invalid() const {
        return std::count_if(records_.begin(), records_.end(),
                             [](const auto& kv) { return kv.second.value("status", "") == "invalid"; });
    }

    void append(const nlohmann::json& record) {
        const std::string text = record.dump() + "\n";
        if (manifest_ && !write_all(manifest_.get(), text.data(), text.size())) {
            std::cerr << errno_message("dp-launch: cannot append to " + manifest_path_) << std::endl;
            manifest_.reset();
        }
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
            const int width = 30;
            const int filled = to_run_ > 0 ? static_cast<int>(width * finished / to_run_) : width;
            std::snprintf(text, sizeof(text), "\r[%-*s] %lld/%lld  %.2f images/s  ETA %.0f s%s", width,
                          std::string(static_cast<std::size_t>(filled), '#').c_str(),
                          static_cast<long long>(finished), static_cast<long long>(to_run_), rate, eta,
                          last ? "\n" : "");
            std::fputs(text, stderr);
        } else if (last || std::chrono::duration<double>(now - last_line_).count() >= 5.0) {
            if (finished == printed_) return;  // nothing new since the last line
            printed_ = finished;
            std::snprintf(text, sizeof(text),
                          "dp-launch: progress %lld/%lld images, %.2f images/s, ETA %.0f s\n",
                          static_cast<long long>(finished), static_cast<long long>(to_run_), rate, eta);
            std::fputs(text, stderr);
            last_line_ = now;
        }
        std::fflush(stderr);
    }

    const LaunchSpec& launch_;
    const JobOptions& job_;
    std::map<int64_t, nlohmann::json> records_;
    std::vector<int64_t> order_;
    std::map<int, std::pair<int64_t, int64_t>> shares_;  // rank -> its share [first, first + count)
    int64_t to_run_;
    int64_t done_ = 0, failed_ = 0, not_run_ = 0;
    std::string manifest_path_;
    UniqueFd manifest_;
    bool tty_ = false;
    int64_t printed_ = 0;
    std::chrono::steady_clock::time_point start_, last_line_{};
};

}  // namespace

strategies::StrategyRequest strategy_request(const LaunchSpec& launch, const JobOptions& job) {
    strategies::StrategyRequest r;
    r.world = launch.world_size();
    r.num_processes = launch.num_processes;
    r.strategy = job.strategy;
    r.cfg_parallel = job.cfg_parallel;
    r.guidance_scale = job.guidance_scale;
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
    strategies::ResolvedStrategy resolved = strategies::resolve_strategy(strategy_request(launch, job), spec, heads);
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
        return strategies::plan_device_map_spec(job.model, job.dtype == "fp32" ? 4 : 2, job.device_map,
                                                job.max_memory, {});
    } catch (const std::exception& e) {
        throw UsageError("--device-map " + job.device_map + ": " + e.what());
    }
}

namespace {

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
    if (!launch.quiet && strategy.degrees.replica_size() > 1)
        std::cerr << "dp-launch: mesh " << strategies::Mesh(launch.world_size(), strategy.degrees).describe()
                  << std::endl;
    const std::string name = job.prompts == "-" ? "<stdin>" : job.prompts;
    const std::string bytes = read_prompts(job.prompts);
    const bool jsonl = job.prompts == "-" ? looks_like_jsonl(bytes) : is_jsonl_name(job.prompts);
    const PromptFile file = parse_prompt_file(bytes, name, jsonl);

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
    if (file.prompts.empty()) {
        std::cout << "dp-launch: nothing to do: " << name << " has no prompts"
                  << (file.invalid.empty() ? "" : " that are valid") << std::endl;
        return kExitOk;
    }

    // Every prompt's settings, resolved once here so that every rank and the manifest agree.
    protocol::JobFile job_file = job_file_for(job, strategy);
    std::map<int64_t, nlohmann::json> records;
    std::vector<int64_t> order;
    std::vector<std::string> clashes;
    make_dirs(job.output_dir);
    for (const PromptRecord& p : file.prompts) {
        protocol::JobRequest q;
        q.index = p.index;
        q.file = image_file_name(p.index, p.name ? *p.name : p.prompt);
        q.prompt = p.prompt;
        q.negative_prompt = p.negative_prompt.value_or(job.negative_prompt);
        q.seed = p.seed.value_or(prompt_seed(job.seed, p.index));
        q.steps = p.steps.value_or(job.steps);
        q.guidance_scale = p.guidance_scale.value_or(job.guidance_scale);
        q.width = p.width.value_or(job.width);
        q.height = p.height.value_or(job.height);
        nlohmann::json r = q;
        r["line"] = p.line;
        r["model"] = job.model;
        r["status"] = "pending";
        records[p.index] = r;
        order.push_back(p.index);
        if (!job.overwrite && exists(job.output_dir + "/" + q.file))
            clashes.push_back(job.output_dir + "/" + q.file);
        job_file.requests.push_back(std::move(q));
    }
    for (const char* own : {"/manifest.jsonl", "/index.html"})
        if (!job.overwrite && exists(job.output_dir + own)) clashes.push_back(job.output_dir + own);
    if (!clashes.empty())
        throw UsageError(clashes.front() +
                         (clashes.size() > 1 ? " and " + std::to_string(clashes.size() - 1) + " more" : "") +
                         " already exist; pass --overwrite to replace them, or choose another --output-dir");
    for (const InvalidPrompt& bad : file.invalid)
        records[bad.index] = {
            {"index", bad.index}, {"line", bad.line}, {"status", "invalid"}, {"error", bad.reason}};

    const std::string job_path = job.output_dir + "/.dp-job-" + std::to_string(getpid()) + ".json";
    protocol::write_job_file(job_path, job_file);

    LaunchSpec spec = launch;
    const std::string worker = job.worker.empty() ? self_dir() + "/dp-worker" : job.worker;
    spec.command = {worker, "--job", job_path};

    if (launch.dry_run) {
        std::remove(job_path.c_str());
        std::cout << file.prompts.size() << " prompt(s) from " << name << " over " << spec.world_size()
                  << " rank(s); images to " << job.output_dir << "/\n"
                  << describe_dry_run(spec) << std::flush;
        return kExitOk;
    }
    JobMonitor monitor(launch, job, std::move(records), std::move(order));
    int code = kExitInternal;
    try {
        code = run_launch(spec, &monitor);
    } catch (...) {
        std::remove(job_path.c_str());
        throw;
    }
    std::remove(job_path.c_str());
    monitor.finish();
    if (code == kExitOk && monitor.failed() > 0)
        code = kExitInternal;  // some prompts failed: see the manifest
    return code;
}

}  // namespace dp::launcher
