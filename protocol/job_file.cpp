#include "protocol/job_file.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "protocol/errors.h"
#include "protocol/json_fields.h"

namespace dp::protocol {

namespace {

constexpr int kMaxDegree = 1 << 16;
constexpr int kMaxSize = 1 << 16;  // pixels; the launcher checks the model's own limits

bool is_one_of(const std::string& value, std::initializer_list<const char*> accepted) {
    for (const char* a : accepted)
        if (value == a) return true;
    return false;
}

void read_mesh(detail::Fields f, MeshDegrees& mesh) {
    mesh.dp = static_cast<int>(f.integer("dp", 1, kMaxDegree));
    mesh.cfg = static_cast<int>(f.integer("cfg", 1, 2));
    mesh.ring = static_cast<int>(f.integer("ring", 1, kMaxDegree));
    mesh.ulysses = static_cast<int>(f.integer("ulysses", 1, kMaxDegree));
    mesh.tp = static_cast<int>(f.integer("tp", 1, kMaxDegree));
    f.no_other_keys();
}

DeviceMapPlan read_plan(detail::Fields f) {
    DeviceMapPlan plan;
    const nlohmann::json& devices = f.array("devices");
    for (std::size_t i = 0; i < devices.size(); ++i) {
        if (!devices[i].is_string()) throw InputDataError(f.path("devices", i) + ": expected a string");
        plan.devices.push_back(devices[i].get<std::string>());
    }
    plan.used.assign(plan.devices.size(), 0);
    const nlohmann::json& placements = f.array("placements");
    for (std::size_t i = 0; i < placements.size(); ++i) {
        detail::Fields p(placements[i], f.path("placements", i));
        DevicePlacement out;
        out.component = p.string("component");
        out.block = static_cast<int>(p.integer("block", -1, 1 << 20));
        out.device = p.string("device");
        out.bytes = p.integer("bytes", 0, INT64_MAX);
        p.no_other_keys();
        const auto device = std::find(plan.devices.begin(), plan.devices.end(), out.device);
        if (device == plan.devices.end())
            throw InputDataError(p.path("device") + ": '" + out.device +
                                 "' is not one of the plan's devices");
        plan.used[static_cast<std::size_t>(device - plan.devices.begin())] += out.bytes;
        plan.placements.push_back(std::move(out));
    }
    f.no_other_keys();
    return plan;
}

DeviceMapRequest read_device_map(detail::Fields f) {
    DeviceMapRequest dm;
    dm.spec = f.string("spec");
    if (dm.spec.empty()) throw InputDataError(f.path("spec") + ": expected balanced, auto or a FILE.json");
    dm.max_memory = f.string("max_memory");
    if (f.has("plan")) dm.plan = read_plan(detail::Fields(f.object("plan"), f.path("plan")));
    f.no_other_keys();
    return dm;
}

// Note [paths in the job file] (call_arguments.h).
std::string read_path(detail::Fields& f, const std::string& key) {
    const std::string hex_key = key + "_hex";
    if (!f.has(hex_key.c_str())) return f.string(key.c_str());
    std::string path;
    if (!path_from_hex(f.string(hex_key.c_str()), path))
        throw InputDataError(f.path(hex_key.c_str()) + ": expected the path's bytes as lowercase hex digits");
    return path;
}

// The keys of a request that are not call arguments.
constexpr const char* kRequestFields[] = {"index", "file",  "prompt", "negative_prompt",
                                          "seed",  "steps", "width",  "height"};

JobRequest read_request(detail::Fields f, const nlohmann::json& j) {
    JobRequest r;
    r.index = f.integer("index", 0, INT64_MAX);
    r.file = f.string("file");
    if (r.file.empty() || r.file.find('/') != std::string::npos || r.file[0] == '.')
        throw InputDataError(f.path("file") + ": '" + r.file +
                             "' is not a file name inside the output folder (no '/', not starting with '.')");
    r.prompt = f.string("prompt");
    r.negative_prompt = f.string_or_null("negative_prompt");
    r.seed = f.unsigned_integer("seed");
    r.steps = static_cast<int>(f.integer("steps", 1, 1000000));
    r.width = static_cast<int>(f.integer("width", 0, kMaxSize));
    r.height = static_cast<int>(f.integer("height", 0, kMaxSize));
    // Every other key is a call argument, read by its row (the launcher checked the family's limits).
    for (const auto& [key, value] : j.items()) {
        if (std::find_if(std::begin(kRequestFields), std::end(kRequestFields),
                         [&](const char* field) { return key == field; }) != std::end(kRequestFields))
            continue;
        const CallArgument* row = find_call_argument(key);
        if (!row || row->universal || key != row->name) continue;  // no_other_keys() names it
        CallValue v;
        if (const std::string why = read_call_value(*row, value, v); !why.empty())
            throw InputDataError(f.path(row->name) + ": " + why + ", got " + value.dump().substr(0, 40));
        r.arguments.set(*row, std::move(v));
        f.mark_read(row->name);
    }
    for (const CallValues::Item& item : r.arguments.items()) {
        const CallArgument& row = *item.first;
        if (row.below && r.arguments.has(row.below) &&
            r.arguments.number(row.name) >= r.arguments.number(row.below))
            throw InputDataError(f.path(row.name) + ": must be below " + row.below);
    }
    f.no_other_keys();
    return r;
}

}  // namespace

void to_json(nlohmann::json& j, const JobRequest& r) {
    j = {{"index", r.index},
         {"file", r.file},
         {"prompt", r.prompt},
         {"negative_prompt", r.negative_prompt ? nlohmann::json(*r.negative_prompt) : nlohmann::json()},
         {"seed", r.seed},
         {"steps", r.steps},
         {"width", r.width},
         {"height", r.height}};
    for (const CallValues::Item& item : r.arguments.items())
        j[item.first->name] = call_value_json(item.second);
}

bool is_variant_name(const std::string& name) {
    return name.size() <= 64 && name.find_first_not_of(
                                    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                    "0123456789_-") == std::string::npos;
}

bool same_batch_settings(const Generation& a, const Generation& b, bool negative_counts) {
    if (a.steps != b.steps || a.width != b.width || a.height != b.height ||
        (negative_counts && a.negative_prompt.has_value() != b.negative_prompt.has_value()))
        return false;
    const std::vector<CallValues::Item>& x = a.arguments.items();
    const std::vector<CallValues::Item>& y = b.arguments.items();
    if (x.size() != y.size()) return false;
    for (std::size_t i = 0; i < x.size(); ++i)
        if (x[i].first != y[i].first || (!x[i].first->shared_batch && x[i].second != y[i].second))
            return false;
    return true;
}

namespace {

// The optional diagnostics switches of a job file, by key.
const std::pair<const char*, bool JobFile::*> kDiagnostics[] = {
    {"save_latents", &JobFile::save_latents},
    {"cache_report", &JobFile::cache_report},
    {"comm_report", &JobFile::comm_report},
    {"step_events", &JobFile::step_events},
};

// Every field of `job` but its requests.
nlohmann::json settings_json(const JobFile& job) {
    nlohmann::json j = {{"format", kJobFileFormat},
                        {"version", kJobFileVersion},
                        {"dtype", job.dtype},
                        {"device", job.device},
                        {"batch_size", job.batch_size},
                        {"variant", job.variant},
                        {"no_t5", job.no_t5},
                        {"offload", job.offload},
                        {"keep_quantized", job.keep_quantized},
                        {"quantize", job.quantize},
                        {"mesh",
                         {{"dp", job.mesh.dp},
                          {"cfg", job.mesh.cfg},
                          {"ring", job.mesh.ring},
                          {"ulysses", job.mesh.ulysses},
                          {"tp", job.mesh.tp}}},
                        {"collective_timeout_s", job.collective_timeout_s},
                        {"schedule", job.schedule}};
    if (job.node_timeout_s > 0) j["node_timeout_s"] = job.node_timeout_s;
    if (job.image_format != "png") j["image_format"] = job.image_format, j["quality"] = job.quality;
    for (const auto& [key, field] : kDiagnostics)
        if (job.*field) j[key] = true;
    put_path(j, "model_dir", job.model_dir);
    j["family"] = job.family;
    put_path(j, "output_dir", job.output_dir);
    if (job.random_weights) j["random_weights"] = *job.random_weights;
    if (!job.component_files.empty()) {
        nlohmann::json files = nlohmann::json::object();
        for (const auto& [component, path] : job.component_files) {
            nlohmann::json one = nlohmann::json::object();
            put_path(one, "path", path);
            files[component] = one;
        }
        j["component_files"] = files;
    }
    if (!job.job_id.empty()) j["job_id"] = job.job_id;
    if (job.device_map) {
        nlohmann::json dm = {{"spec", job.device_map->spec}, {"max_memory", job.device_map->max_memory}};
        if (const auto& plan = job.device_map->plan) {
            nlohmann::json placements = nlohmann::json::array();
            for (const DevicePlacement& p : plan->placements)
                placements.push_back({{"component", p.component},
                                      {"block", p.block},
                                      {"device", p.device},
                                      {"bytes", p.bytes}});
            dm["plan"] = {{"devices", plan->devices}, {"placements", placements}};
        }
        j["device_map"] = dm;
    }
    return j;
}

}  // namespace

void to_json(nlohmann::json& j, const JobFile& job) {
    j = settings_json(job);
    j["requests"] = job.requests;
}

void from_json(const nlohmann::json& j, JobFile& job) {
    const auto format = j.find("format");  // end() for anything but an object
    if (format == j.end() || *format != kJobFileFormat)
        throw InputDataError(std::string("format: not a dp-launch job file (expected \"format\": \"") +
                             kJobFileFormat + "\")");
    detail::Fields f(j, "");
    f.string("format");
    const int64_t version = f.integer("version", 0, INT32_MAX);
    if (version != kJobFileVersion)
        throw InputDataError("version: " + std::to_string(version) +
                             " is not the version this dp-worker reads (" + std::to_string(kJobFileVersion) +
                             "); dp-launch and dp-worker come from different builds");
    JobFile out;
    out.model_dir = read_path(f, "model_dir");
    out.family = f.string("family");
    if (f.has("random_weights")) out.random_weights = f.unsigned_integer("random_weights");
    out.output_dir = read_path(f, "output_dir");
    out.dtype = f.string("dtype");
    if (!is_one_of(out.dtype, {"auto", "fp32", "bf16", "fp16"}))
        throw InputDataError("dtype: '" + out.dtype + "': expected auto, fp32, bf16 or fp16");
    out.device = f.string("device");
    if (!is_one_of(out.device, {"auto", "cpu", "cuda"}))
        throw InputDataError("device: '" + out.device + "': expected auto, cpu or cuda");
    out.batch_size = static_cast<int>(f.integer("batch_size", 1, 1 << 16));
    out.variant = f.string("variant");
    if (!is_variant_name(out.variant))
        throw InputDataError("variant: '" + out.variant.substr(0, 40) +
                             "': expected empty or a name of letters, digits, '_' and '-' such as fp16");
    if (f.has("component_files")) {
        const nlohmann::json& files = f.object("component_files");
        for (auto it = files.begin(); it != files.end(); ++it) {
            if (!is_one_of(it.key(),
                           {"transformer", "text_encoder", "text_encoder_2", "text_encoder_3", "vae"}))
                throw InputDataError(
                    "component_files: '" + it.key().substr(0, 40) +
                    "': expected transformer, text_encoder, text_encoder_2, text_encoder_3 or vae");
            detail::Fields one(it.value(), "component_files." + it.key());
            out.component_files[it.key()] = read_path(one, "path");
            one.no_other_keys();
        }
    }
    out.no_t5 = f.boolean("no_t5");
    out.offload = f.boolean("offload");
    if (f.has("keep_quantized")) out.keep_quantized = f.boolean("keep_quantized");
    if (f.has("quantize")) {
        out.quantize = f.string("quantize");
        if (!out.quantize.empty() && out.quantize != "int8")
            throw InputDataError(f.path("quantize") + " '" + out.quantize.substr(0, 40) +
                                 "': expected \"\" or int8");
    }
    for (const auto& [key, field] : kDiagnostics)
        if (f.has(key)) out.*field = f.boolean(key);
    read_mesh(detail::Fields(f.object("mesh"), "mesh"), out.mesh);
    out.collective_timeout_s = f.number("collective_timeout_s", 0.001, 7 * 24 * 3600.0);
    if (f.has("node_timeout_s")) out.node_timeout_s = f.number("node_timeout_s", 0, 7 * 24 * 3600.0);
    if (f.has("schedule")) {
        out.schedule = f.string("schedule");
        if (!is_one_of(out.schedule, {"static", "dynamic"}))
            throw InputDataError("schedule: '" + out.schedule.substr(0, 40) +
                                 "': expected static or dynamic");
    }
    if (f.has("image_format")) {
        out.image_format = f.string("image_format");
        if (!is_one_of(out.image_format, {"png", "jpeg", "webp"}))
            throw InputDataError("image_format: '" + out.image_format.substr(0, 40) +
                                 "': expected png, jpeg or webp");
        out.quality = static_cast<int>(f.integer("quality", 1, 100));
    }
    if (f.has("device_map"))
        out.device_map = read_device_map(detail::Fields(f.object("device_map"), "device_map"));
    if (f.has("job_id")) {
        out.job_id = f.string("job_id");
        if (out.job_id.size() > 128 || out.job_id.find_first_of("/\\") != std::string::npos)
            throw InputDataError("job_id: expected at most 128 characters and no slash");
    }
    const nlohmann::json& requests = f.array("requests");
    for (std::size_t i = 0; i < requests.size(); ++i)
        out.requests.push_back(read_request(detail::Fields(requests[i], f.path("requests", i)), requests[i]));
    f.no_other_keys();
    job = std::move(out);
}

std::string request_line(const JobRequest& request) { return nlohmann::json(request).dump(); }

JobFileWriter::JobFileWriter(std::string path, const JobFile& header) : file_(std::move(path)) {
    std::string head = settings_json(header).dump();  // an object with the format and version: never "{}"
    head.back() = ',';
    head += "\"requests\":[";
    file_.write(head);
}

void JobFileWriter::add_line(std::string_view line) {
    file_.write(first_ ? "\n" : ",\n");
    first_ = false;
    file_.write(line);
}

void JobFileWriter::commit() {
    file_.write("\n]}\n");
    file_.commit();
}

void write_job_file(const std::string& path, const JobFile& job) {
    JobFileWriter writer(path, job);
    for (const JobRequest& r : job.requests) writer.add(r);
    writer.commit();
}

JobFile read_job_file(const std::string& path, const std::function<void(const JobFile&)>& check) {
    std::ifstream in(path, std::ios::binary);
    if (!in)
        throw Error("--job " + path + ": cannot read the job file: " + std::strerror(errno), kExitNoInput);
    std::ostringstream text;
    text << in.rdbuf();
    try {
        JobFile job = nlohmann::json::parse(text.str()).get<JobFile>();
        if (check) check(job);
        return job;
    } catch (const nlohmann::json::parse_error& e) {
        throw InputDataError(path + ": not a dp-launch job file (not JSON: " + e.what() + ")");
    } catch (const InputDataError& e) {
        throw InputDataError(path + ": " + e.what());
    }
}

}  // namespace dp::protocol
