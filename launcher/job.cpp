#include "launcher/job.h"
#include "launcher/adapter_files.h"
#include "launcher/component_files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "launcher/dry_run.h"
#include "launcher/errors.h"
#include "launcher/input_images.h"
#include "launcher/job_monitor.h"
#include "launcher/job_settings.h"
#include "launcher/manifest.h"
#include "launcher/memory_guard.h"
#include "launcher/model_check.h"
#include "launcher/model_location.h"
#include "launcher/node_exchange.h"
#include "launcher/output_folder.h"
#include "launcher/port.h"
#include "launcher/process.h"
#include "launcher/prompt_file.h"
#include "launcher/schedule_settings.h"
#include "launcher/start_signals.h"
#include "launcher/supervisor.h"
#include "launcher/system_info.h"
#include "launcher/terminal.h"
#include "launcher/values.h"
#include "protocol/job_file.h"
#include "strategies/cost_model.h"
#include "strategies/model_config.h"
#include "strategies/model_files.h"
#include "strategies/model_sizes.h"
#include "strategies/sha256.h"

namespace dp::launcher {
namespace {

constexpr std::size_t kMaxListedInvalid = 20;
constexpr std::size_t kRequestsPerPiece = 4096;

// The host name as a part of a file name.
std::string host_for_file_name() {
    std::string out;
    for (const char c : host_name())
        out += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' ? c : '_';
    return out;
}

std::string local_temp_dir() {
    const char* tmp = std::getenv("TMPDIR");
    return tmp && *tmp ? tmp : "/tmp";
}

// Note [superseded images]: after --resume (or --overwrite) decides what each prompt gets, an
// image an earlier run made that no record of this job names (its prompt is gone, or moved to
// another index by a line inserted before it) would stay in the folder, listed nowhere. --resume
// moves each, with its latents, to OUTPUT/superseded/ (nothing a user may still want is lost);
// --overwrite removes them. Only files the earlier manifest names are touched, and only plain
// names inside the folder.
void set_aside_superseded(const std::map<int64_t, nlohmann::json>& earlier, const JobRecords& records,
                          const JobOptions& job) {
    std::set<std::string> named;
    records.for_each_index(
        [&](int64_t index, JobRecords::Status) { named.insert(records.record(index).value("file", "")); });
    int64_t moved = 0;
    for (const auto& [index, had] : earlier) {
        const nlohmann::json& f = had.contains("file") ? had["file"] : nlohmann::json();
        if (!f.is_string()) continue;
        const std::string name = f.get<std::string>();
        if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
            named.count(name))
            continue;
        bool any = false;
        for (const std::string& file : {name, name + ".latents.safetensors"}) {
            const std::string path = job.output_dir + "/" + file;
            struct stat st {};
            if (lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
            if (job.overwrite) {
                if (::unlink(path.c_str()) != 0)
                    throw IoError(path + ": cannot remove it (" + std::strerror(errno) + ")");
            } else {
                const std::string folder = job.output_dir + "/superseded", to = folder + "/" + file;
                std::error_code failed;
                std::filesystem::create_directories(folder, failed);
                if (failed) throw IoError(folder + ": cannot create it (" + failed.message() + ")");
                if (::rename(path.c_str(), to.c_str()) != 0)
                    throw IoError(path + ": cannot move it to " + to + " (" + std::strerror(errno) + ")");
            }
            any = true;
        }
        moved += any;
    }
    if (moved > 0)
        Terminal::instance().say(
            std::to_string(moved) + " image(s) of the earlier run that no prompt of this job makes " +
            (job.overwrite ? "removed" : "moved to " + utf8_for_display(job.output_dir) + "/superseded/"));
}

// Note [weights fingerprint] (strategies/sha256.h) of the folder's weight files this job reads:
// each component's that no file of its own gives, for the job's variant.
std::string weights_fingerprint_of(const JobOptions& job, const strategies::ModelInfo& model) {
    std::vector<std::string> files;
    for (const std::string& component : model.spec->components) {
        if (job.component_files.count(component)) continue;
        const std::string dir = job.model + "/" + component;
        if (strategies::weight_variants(dir).empty()) continue;  // none here (left out, or configs only)
        const strategies::ComponentWeights w = strategies::find_component_weights(dir, job.variant);
        if (w.index.empty()) {
            files.push_back(w.file);
            continue;
        }
        files.push_back(w.index);
        std::set<std::string> shards;
        for (const auto& [tensor, shard] : strategies::read_weight_index(w.index)) shards.insert(shard);
        for (const std::string& shard : shards) files.push_back(dir + "/" + shard);
    }
    return files.empty() ? std::string() : strategies::weights_fingerprint(files);
}

bool exists(const std::string& path) {
    struct stat st {};
    return stat(path.c_str(), &st) == 0;
}

// A config-only folder of a real model (models/README.md) makes images only from random weights.
void check_has_weights(const std::string& model, const strategies::ParallelSpec& spec,
                       const std::map<std::string, std::string>& files) {
    std::vector<std::string> missing = strategies::components_without_weights(model, spec);
    // A component given as one file (--transformer FILE) needs only its config in the folder.
    missing.erase(std::remove_if(missing.begin(), missing.end(),
                                 [&](const std::string& c) { return files.count(c) > 0; }),
                  missing.end());
    if (missing.empty()) return;
    std::string list;
    for (const std::string& c : missing) list += (list.empty() ? "" : ", ") + c;
    throw UsageError("--model " + model + ": the folder has configs only (" + list +
                     " list their tensors in tensors.json but hold no *.safetensors weights); pass "
                     "--random-weights SEED to run it with random weights of its real sizes, or point "
                     "--model at a folder with the real weights" +
                     (files.empty()
                          ? std::string()
                          : std::string(" (with --model FILE, --config FOLDER gives the other components)")));
}

// A diagnostics switch of dp-launch's environment, read as dp-worker has read it from its own: set,
// not empty and not "0".
bool env_switch(const char* name) {
    const char* v = std::getenv(name);
    return v && *v && std::string(v) != "0";
}

// What every rank is told: `resolved` without its requests.
protocol::JobFile job_file_for(const ResolvedJob& resolved) {
    const JobOptions& job = resolved.options;
    protocol::JobFile f;
    static_cast<protocol::ModelLoad&>(f) = job;  // component files as given; prepare_job checks them
    f.model_dir = job.model;
    f.family = resolved.model.family;
    f.output_dir = job.output_dir;
    f.dtype = job.dtype;
    f.device = job.device;
    f.batch_size = job.batch_size;
    f.image_format = job.image_format;
    f.quality = job.quality;
    const strategies::MeshDegrees& d = resolved.degrees();
    f.mesh = d;
    f.collective_timeout_s = job.collective_timeout_s;
    f.save_latents = env_switch("DP_SAVE_LATENTS");
    f.cache_report = env_switch("DP_CACHE_REPORT");
    f.comm_report = env_switch("DP_COMM_REPORT");
    if (!resolved.device_map().empty()) {
        f.device_map = protocol::DeviceMapRequest{resolved.device_map(), job.max_memory, std::nullopt};
        // The launcher's plan when it could make one; else the worker plans from its GPUs.
        if (const auto& plan = resolved.strategy.device_map_plan) f.device_map->plan = (*plan);
    }
    return f;
}

// Refuses, before anything starts, what the flags and the model cannot run together (Note
// [component files], a config-only folder), and what the model cannot run: a flag's setting is a
// usage error, the folder's own problems are the model's. Says the mesh unless quiet.
void refuse_before_start(const LaunchSpec& launch, const ResolvedJob& resolved) {
    const JobOptions& job = resolved.options;
    const strategies::ResolvedStrategy& strategy = resolved.strategy;
    for (const auto& [flag, component] : component_file_flags())
        if (job.random_weights && job.component_files.count(component))
            throw UsageError(std::string(flag) +
                             " and --random-weights: random weights replace every weight, the "
                             "file's too; give one or the other");
    if (!job.random_weights) check_has_weights(job.model, *resolved.model.spec, job.component_files);
    if (!launch.quiet && job.seed_drawn)
        Terminal::instance().say("--seed random drew " + std::to_string(job.seed) + " (give --seed " +
                                 std::to_string(job.seed) + " to make these images again)");
    if (!launch.quiet && strategy.degrees.replica_size() > 1) {
        Terminal::instance().say("mesh " +
                                 strategies::Mesh(launch.world_size(), strategy.degrees).describe());
        for (const std::string& note : strategy.notes) Terminal::instance().say(note);
    }
    check_job(resolved);
}

// The component files, checked before anything starts (Note [component files]).
struct CheckedComponents {
    nlohmann::json records = nlohmann::json::object();  // component -> path, sha256, format: every record's
    std::map<std::string, std::string> paths;           // component -> absolute path: the job file's
};

// check_component_files with their SHA-256; --keep-quantized without a GGUF file is refused.
CheckedComponents check_components(const JobOptions& job, const strategies::ModelInfo& model) {
    CheckedComponents out;
    bool gguf = false;
    for (const ComponentFile& c :
         check_component_files(job.component_files, model, job.variant, true, job.model_file)) {
        nlohmann::json& record = out.records[c.component] = nlohmann::json::object();
        protocol::put_path(record, "path", c.path);  // Note [paths in the job file]
        record["sha256"] = c.sha256;
        record["format"] = c.format;
        out.paths[c.component] = c.path;
        gguf = gguf || c.quantized_bytes > 0;
    }
    if (!job.quantize.empty() && model.spec->int8_layers.empty())
        throw UsageError("--quantize " + job.quantize + ": " + model.family_name +
                         " has no layers declared for int8 products (leave --quantize out)");
    if (job.keep_quantized && !gguf)
        throw UsageError(
            "--keep-quantized keeps a GGUF file's quantized weights, and no component comes from one "
            "(give --model FILE.gguf or --transformer FILE.gguf, or leave it out)");
    return out;
}

// What every prompt's record holds beside its request: the run's precision, the component files
// and the weights' fingerprint (Note [weights fingerprint]; empty: none).
struct RecordSettings {
    std::string dtype;
    nlohmann::json components;
    std::string weights;
};

// The prompt file read once: each valid prompt's record and request go to `records` as it is read
// (Note [records on disk]), its settings to `requests`, without its texts (prompt, file), which
// are in `records`; invalid lines are listed in the result. A prompt line's adapters are checked
// and resolved through `adapters`.
PromptFile read_job_prompts(const JobOptions& job, const strategies::ModelInfo& model, AdapterFiles& adapters,
                            InputImages& images, const RecordSettings& settings, JobRecords& records,
                            std::vector<protocol::JobRequest>& requests, int64_t& missing_images) {
    // A line's image is relative to the prompt file's folder (Note [input images are checked first]).
    const std::string folder = prompt_file_folder(job.prompts, !job.prompt_texts.empty());
    // Gathered in pieces, then moved into one vector of the exact size, so that no growth holds
    // two copies.
    std::vector<std::vector<protocol::JobRequest>> pieces;
    const PromptFile file = read_prompts(
        prompt_source(job),
        [&](const PromptRecord& p) {
            std::string why = prompt_setting_problem(p, job, model);
            if (why.empty() && p.arguments.has("lora")) {
                why = adapters.problem(p.arguments.adapters("lora"));
                if (!why.empty()) why = "key 'lora': " + why;
            }
            if (why.empty()) why = images.line_problem(p, job, model, folder, missing_images);
            return why;
        },
        [&](PromptRecord&& p) {
            images.resolve(p.arguments, folder);
            protocol::JobRequest q = job_request(p, job, model);
            adapters.resolve(q.arguments);
            nlohmann::json record = pending_record(q, p.line, job, settings.dtype, settings.components);
            if (!settings.weights.empty()) record["weights"] = settings.weights;
            add_schedule_record(record, q, line_preset(p, job), model);
            if (p.images > 1) record["num_images_per_prompt"] = p.images, record["image_index"] = p.image;
            records.set(std::move(record));
            records.set_request(p.index, protocol::request_line(q));
            std::string().swap(q.prompt);
            std::string().swap(q.file);
            if (q.negative_prompt) q.negative_prompt = std::string();  // given or not is what counts
            if (pieces.empty() || pieces.back().size() == kRequestsPerPiece)
                pieces.emplace_back().reserve(kRequestsPerPiece);
            pieces.back().push_back(std::move(q));
        });
    requests.reserve(static_cast<std::size_t>(file.valid));
    for (std::vector<protocol::JobRequest>& piece : pieces) {
        for (protocol::JobRequest& q : piece) requests.push_back(std::move(q));
        std::vector<protocol::JobRequest>().swap(piece);
    }
    return file;
}

// The job before its output folder: its file's settings and requests, and every prompt's record.
struct PreparedJob {
    JobRecords records;
    protocol::JobFile job_file;  // its requests keep each index and the settings the schedule reads
    PromptFile file;             // the invalid lines and the count of valid ones
    int64_t missing_images = 0;  // invalid lines whose image file does not exist
};

// Everything that is checked and read before the output folder is touched: the refusals, the
// adapter and component files, the memory the ranks need, then the prompt file.
PreparedJob prepare_job(const LaunchSpec& launch, const ResolvedJob& resolved) {
    const JobOptions& job = resolved.options;
    const strategies::ModelInfo& model = resolved.model;
    refuse_before_start(launch, resolved);
    // Every adapter file, read once before anything starts (Note [adapter files are checked first]).
    AdapterFiles adapters(model, job.variant);
    adapters.check(job.arguments.adapters("lora"), "--lora");
    // The job's own --image too, unless it is a batch edit's glob or folder (each line checked).
    InputImages images;
    JobOptions with_image = job;
    if (!image_is_a_batch(job)) {
        images.check(job.arguments.image("image"), "", "--image");
        images.check(job.arguments.image("mask_image"), "", "--mask-image");
        images.resolve(with_image.arguments, "");
    }
    // Every component file too (Note [component files]); the records name each.
    const CheckedComponents components = check_components(job, model);
    // Every prompt's settings, resolved once here so that every rank and the manifest agree.
    RecordSettings settings{resolved.dtype, components.records, ""};
    check_memory_fits(launch, resolved);  // Note [memory guard]
    if (!job.random_weights) settings.weights = weights_fingerprint_of(job, model);
    PreparedJob prepared{JobRecords(local_temp_dir()), job_file_for(resolved), {}};
    if (launch.launcher_count() > 1)
        prepared.job_file.node_timeout_s = launch.node_timeout_s;  // Note [a node that never arrives]
    prepared.job_file.step_events = launch.progress == "json";
    prepared.job_file.component_files = components.paths;
    prepared.file = read_job_prompts(with_image, model, adapters, images, settings, prepared.records,
                                     prepared.job_file.requests, prepared.missing_images);
    return prepared;
}

// The prompt file's name in messages.
std::string prompts_name(const JobOptions& job) {
    if (!job.prompt_texts.empty()) return "--prompt";
    return job.prompts == "-" ? "<stdin>" : utf8_for_display(job.prompts);
}

// When nothing starts for the prompt file, says why and returns the exit code: invalid lines
// without --skip-invalid (65, listing them; 66 when each one's image file is missing), or no
// valid prompt (0). nullopt: the job goes on.
std::optional<int> stop_for_prompt_file(const JobOptions& job, const PromptFile& file,
                                        int64_t missing_images) {
    const std::string name = prompts_name(job);
    if (!file.invalid.empty() && !job.skip_invalid) {
        std::string text =
            "dp-launch: " + name + " has " + std::to_string(file.invalid.size()) +
            " invalid line(s); nothing was started (fix them, or pass --skip-invalid to run the rest):\n";
        for (std::size_t i = 0; i < file.invalid.size() && i < kMaxListedInvalid; ++i)
            text += "  " + file.invalid[i].reason + "\n";
        if (file.invalid.size() > kMaxListedInvalid)
            text += "  ... and " + std::to_string(file.invalid.size() - kMaxListedInvalid) + " more\n";
        Terminal::instance().write_own(STDERR_FILENO, terminal_safe(text));
        return missing_images == static_cast<int64_t>(file.invalid.size()) ? protocol::kExitNoInput
                                                                           : kExitInputData;
    }
    if (file.valid == 0) {
        std::cout << "dp-launch: nothing to do: " << name << " has no prompts"
                  << (file.invalid.empty() ? "" : " that are valid") << std::endl;
        return kExitOk;
    }
    return std::nullopt;
}

// The output folder as this job found and claimed it.
struct ClaimedFolder {
    JobMonitor::FolderBefore before;  // Note [a failed start-up leaves no trace]
    OutputLock lock;                  // launcher 0's, held until the job ends (Note [output folder lock])
    // With --overwrite or --resume, the earlier run's records: its manifest's, and those the
    // launchers of a killed multi-node run recorded and no manifest holds.
    std::map<int64_t, nlohmann::json> earlier;
};

// Makes the output folder; the writing launcher locks it, from before the check for earlier
// outputs, so that no other job writes there meanwhile.
ClaimedFolder claim_output_folder(const JobOptions& job, bool writer) {
    ClaimedFolder folder;
    folder.before = {exists(job.output_dir), exists(job.output_dir + "/manifest.jsonl"),
                     exists(job.output_dir + "/index.html"), exists(job.output_dir + "/.dp-lock")};
    std::error_code failed;
    std::filesystem::create_directories(job.output_dir, failed);
    if (failed)
        throw IoError("--output-dir " + job.output_dir + ": cannot create it (" + failed.message() + ")");
    if (writer) folder.lock = OutputLock::acquire(job.output_dir);
    if (!job.overwrite && !job.resume) return folder;
    folder.earlier = read_manifest(job.output_dir + "/manifest.jsonl");
    for (auto& [index, r] : NodeExchange::read_node_records(job.output_dir)) {
        const auto it = folder.earlier.find(index);
        if (it == folder.earlier.end() || it->second.value("status", "") != "ok")
            folder.earlier[index] = std::move(r);
    }
    return folder;
}

// Refuses images, a manifest or a gallery already in the folder, unless `replace` (--overwrite,
// --resume, or a launcher that makes what launcher 0 decided).
void refuse_clashes(const JobOptions& job, const JobRecords& records, bool replace) {
    if (replace) return;
    std::vector<std::string> clashes;
    records.for_each_index([&](int64_t index, JobRecords::Status status) {
        if (status != JobRecords::Status::kPending) return;
        const std::string path = job.output_dir + "/" + records.record(index).value("file", "");
        if (exists(path)) clashes.push_back(path);
    });
    for (const char* own : {"/manifest.jsonl", "/index.html"})
        if (exists(job.output_dir + own)) clashes.push_back(job.output_dir + own);
    if (!clashes.empty())
        throw UsageError(clashes.front() +
                         (clashes.size() > 1 ? " and " + std::to_string(clashes.size() - 1) + " more" : "") +
                         " already exist; pass --overwrite to replace them, --resume to make only the images "
                         "that are missing, or choose another --output-dir");
}

// The records of this run against the earlier one's: --resume keeps the earlier images it may
// (images_to_keep) and drops their requests, keeping the others in the prompt file's order; the
// invalid lines get their records; the writer sets aside what no prompt makes now (Note
// [superseded images]).
void settle_earlier_run(const JobOptions& job, const strategies::ModelInfo& model,
                        const std::map<int64_t, nlohmann::json>& earlier, bool writer,
                        PreparedJob& prepared) {
    JobRecords& records = prepared.records;
    if (job.resume) {
        for (auto& [index, kept] : images_to_keep(earlier, records, job.output_dir, model.arguments))
            records.set(kept);
        std::vector<protocol::JobRequest>& requests = prepared.job_file.requests;
        requests.erase(std::remove_if(requests.begin(), requests.end(),
                                      [&](const protocol::JobRequest& q) {
                                          return records.status(q.index) != JobRecords::Status::kPending;
                                      }),
                       requests.end());
    }
    for (const InvalidPrompt& bad : prepared.file.invalid)
        records.set({{"index", bad.index}, {"line", bad.line}, {"status", "invalid"}, {"error", bad.reason}});
    if (writer && (job.resume || job.overwrite)) set_aside_superseded(earlier, records, job);
}

// How the replicas share the pending prompts (Note [dynamic schedule], runtime/worker.cpp), said
// unless quiet.
void choose_job_schedule(const LaunchSpec& launch, const ResolvedJob& job, protocol::JobFile& job_file) {
    const strategies::ScheduleChoice schedule = strategies::choose_schedule(
        job.options.schedule, job_file.requests, strategies::cost_rules(job.model.sizes, job.model.arguments),
        job.degrees().dp, job.options.batch_size);
    job_file.schedule = schedule.schedule;
    if (!launch.quiet && job.degrees().dp > 1 && !job_file.requests.empty())
        Terminal::instance().say(strategies::describe_schedule(schedule));
}

// This run's id: host, pid and start time (rank 0's launcher's is the one every launcher uses,
// Note [one job, several launchers]).
std::string new_job_id() {
    return host_for_file_name() + "-" + std::to_string(getpid()) + "-" +
           std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count());
}

// --overwrite: the earlier run's images that this job does not make again would be listed nowhere.
// A file's name starts with its prompt's index (image_file_name), so only that prompt makes it.
void remove_unmade_earlier_images(const JobOptions& job, const std::map<int64_t, nlohmann::json>& earlier,
                                  const JobRecords& records) {
    for (const auto& [index, r] : earlier) {
        const std::string f = r.value("file", "");
        const bool made = records.status(index) == JobRecords::Status::kPending &&
                          records.record(index).value("file", "") == f;
        if (!f.empty() && f[0] != '.' && f.find('/') == std::string::npos && !made)
            std::remove((job.output_dir + "/" + f).c_str());
    }
}

// Writes the job file at `path`: `job_file`'s settings and its requests' lines from `records`, and
// returns their indices in that order, the one the ranks' start events refer to.
std::vector<int64_t> write_requests(const std::string& path, const protocol::JobFile& job_file,
                                    const JobRecords& records) {
    std::vector<int64_t> order;
    order.reserve(job_file.requests.size());
    protocol::JobFileWriter writer(path, job_file);
    for (const protocol::JobRequest& q : job_file.requests) {
        writer.add_line(records.request_line(q.index));
        order.push_back(q.index);
    }
    writer.commit();
    return order;
}

// Starts the prepared job's ranks in its claimed folder, follows them to the end and returns
// dp-launch's exit code (--dry-run: prints what would start, and 0).
int start_job(const LaunchSpec& launch, const ResolvedJob& resolved, PreparedJob prepared,
              const ClaimedFolder& folder) {
    const JobOptions& job = resolved.options;
    const bool writer = launch.launcher_index() == 0;
    protocol::JobFile& job_file = prepared.job_file;
    choose_job_schedule(launch, resolved, job_file);
    job_file.job_id = new_job_id();
    // Launcher 0's job file is in the output folder; another node's on its own disk, where launcher
    // 0's clearing of leftovers cannot reach it.
    const std::string job_path = (writer ? job.output_dir + "/.dp-job-" : local_temp_dir() + "/dp-job-") +
                                 std::to_string(getpid()) + ".json";
    LaunchSpec spec = launch;
    spec.command = {job.worker.empty() ? self_dir() + "/dp-worker" : job.worker, "--job", job_path};
    if (launch.dry_run) {
        std::cout << job_file.requests.size() << " prompt(s) from " << prompts_name(job) << " over "
                  << spec.world_size() << " rank(s); images to " << job.output_dir << "/\n"
                  << describe_dry_run(spec) << std::flush;
        return kExitOk;
    }
    if (writer) remove_leftovers(job.output_dir);  // of killed runs: ours is the only job here now
    if (job.overwrite && writer) remove_unmade_earlier_images(job, folder.earlier, prepared.records);
    // The job file goes when the job ends, however it ends.
    struct RemoveOnExit {
        std::string path;
        ~RemoveOnExit() { std::remove(path.c_str()); }  // a rewrite's temporary file goes with its writer
    } job_file_owner{job_path};
    std::vector<int64_t> order = write_requests(job_path, job_file, prepared.records);
    std::vector<protocol::JobRequest>().swap(job_file.requests);
    const bool nothing_to_make = order.empty();
    JobMonitor monitor(launch, job, std::move(prepared.records), std::move(job_file), std::move(order),
                       job_path);
    monitor.set_folder_before(folder.before);
    const int code = nothing_to_make ? kExitOk : run_launch(spec, &monitor);
    const int result = monitor.finish(code);
    if (monitor.left_no_trace() && !folder.before.existed) {  // Note [a failed start-up leaves no trace]
        std::remove(job_path.c_str());
        ::rmdir(job.output_dir.c_str());  // only when nothing else is in it
    }
    return result;
}
}  // namespace

void check_model_with_worker(const LaunchSpec& launch, const ResolvedJob& resolved) {
    const JobOptions& job = resolved.options;
    // With our own dp-worker: a --worker of one's own may not take --check; without one beside
    // dp-launch (a test of the launcher's library) there is nothing to check with.
    const std::string worker = self_dir() + "/dp-worker";
    if (!job.worker.empty() || ::access(worker.c_str(), X_OK) != 0) return;
    const protocol::JobFile f = job_file_for(resolved);  // component files as given: the check runs here
    check_model_before_ranks(worker, f, local_temp_dir(), launch.load_timeout_s);
}

int run_job(const LaunchSpec& launch, const JobOptions& options) {
    const ResolvedJob resolved = resolve_job(launch, options);  // Note [a job is resolved once]
    const JobOptions& job = resolved.options;
    PreparedJob prepared = prepare_job(launch, resolved);
    stop_if_signalled();  // Note [signals before the ranks start]
    if (const std::optional<int> code = stop_for_prompt_file(job, prepared.file, prepared.missing_images))
        return *code;
    if (job.overwrite && job.resume)
        throw UsageError(
            "--overwrite and --resume: choose one (--overwrite makes every image again, "
            "--resume only those that have none)");
    // Note [port in use]: found before the output folder is made.
    if (launch.launcher_index() == 0 && !launch.dry_run)
        check_master_port_free(launch.master_addr, launch.master_port);
    // Note [checking a model before the ranks start]: before the folder is made.
    if (!launch.dry_run) check_model_with_worker(launch, resolved);
    stop_if_signalled();  // before the output folder is made
    // With several launchers, launcher 0 is the job's writer: it alone locks the folder, checks for
    // earlier outputs, clears leftovers and writes the manifest (Note [one job, several launchers]);
    // the others make what launcher 0 decided, and a different decision is refused by the ranks.
    const bool writer = launch.launcher_index() == 0;
    const ClaimedFolder folder = claim_output_folder(job, writer);
    refuse_clashes(job, prepared.records, job.overwrite || job.resume || !writer);
    settle_earlier_run(job, resolved.model, folder.earlier, writer, prepared);
    return start_job(launch, resolved, std::move(prepared), folder);
}

}  // namespace dp::launcher
