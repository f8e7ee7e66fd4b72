#include "launcher/job_settings.h"

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <tuple>

#include "launcher/component_files.h"
#include "launcher/errors.h"
#include "launcher/input_images.h"
#include "launcher/schedule_settings.h"
#include "launcher/system_info.h"
#include "launcher/values.h"
#include "protocol/errors.h"
#include "strategies/cpu_dtype.h"
#include "strategies/family.h"
#include "strategies/model_config.h"

namespace dp::launcher {
namespace {

using protocol::CallArgument;
using protocol::CallValue;
using protocol::CallValues;
using protocol::FamilyArgument;
using protocol::FamilyArguments;

std::string joined(const std::vector<std::string>& items, const std::string& separator) {
    std::string out;
    for (const std::string& s : items) out += (out.empty() ? "" : separator) + s;
    return out;
}

// Whether some family reads `row` as its classifier-free guidance scale.
bool is_a_guidance_scale(const CallArgument& row) {
    for (const strategies::FamilyFacts* family : strategies::families())
        for (const auto* uses : {&family->arguments, &family->variant_arguments})
            for (const protocol::ArgumentUse& use : *uses)
                if (use.name == std::string_view(row.name) && use.guidance != protocol::Guidance::kNone)
                    return true;
    return false;
}

// Why the model's pipeline does not take `row`, or empty when it does (or accepts and ignores it).
std::string foreign_key(const strategies::ModelInfo& model, const CallArgument& row) {
    const FamilyArguments& a = model.arguments;
    if (a.find(row.name)) return {};
    std::string why =
        model.family_name + " does not take " + row.name + " (its pipeline takes " + joined(a.names(), ", ");
    if (is_a_guidance_scale(row) && a.guidance_scale())
        why += "; its guidance scale is " + std::string(a.guidance_scale()->row->name);
    return why + ")";
}

// Why `value` of a row the family takes is past the family's own limit or the model's blocks, or empty.
std::string limit_problem(const strategies::ModelInfo& model, const FamilyArgument& a,
                          const CallValue& value) {
    if (const auto* blocks = std::get_if<std::vector<int>>(&value)) {
        const int64_t n = model.shape.layers;
        for (int b : *blocks)
            if (b >= n)
                return "block " + std::to_string(b) + " is not one of the transformer's " +
                       std::to_string(n) + " blocks (0 to " + std::to_string(n - 1) + ")";
        return {};
    }
    if (std::holds_alternative<protocol::Adapters>(value)) return {};   // checked against the model's weights
    if (std::holds_alternative<protocol::StepCache>(value)) return {};  // its range is the row's
    if (std::holds_alternative<protocol::InputImage>(value)) return {};  // read with the input files
    if (!std::holds_alternative<double>(value) && !std::holds_alternative<int64_t>(value))
        return {};  // a scheduler, its keys, a schedule: checked against the model's scheduler
    const double v = std::holds_alternative<double>(value) ? std::get<double>(value)
                                                           : static_cast<double>(std::get<int64_t>(value));
    if (v <= a.max) return {};
    return protocol::call_value_text(value) + " is more than " + model.family_name + "'s pipeline accepts (" +
           number_text(a.row->min) + " to " + number_text(a.max) + ")";
}

// The value a setting takes: the first of `layers` that sets it, else the model's default.
double number_of(const FamilyArgument& a, std::initializer_list<const CallValues*> layers) {
    for (const CallValues* values : layers)
        if (values->has(a.row->name)) return values->number(a.row->name);
    return std::holds_alternative<double>(a.value) ? std::get<double>(a.value)
                                                   : static_cast<double>(std::get<int64_t>(a.value));
}

}  // namespace

std::string no_negative_prompt(const strategies::ModelInfo& model) {
    return model.spec->display_name + "'s pipeline (" + model.spec->pipeline_class +
           ") takes no negative prompt: it has no classifier-free guidance";
}

std::optional<double> cfg_scale_setting(const JobOptions& job, const FamilyArguments& arguments) {
    const FamilyArgument* cfg = arguments.guidance_scale();
    if (!cfg || !job.arguments.has(cfg->row->name)) return std::nullopt;
    return job.arguments.number(cfg->row->name);
}

namespace {

// job_setting_problems with `device_map` as the job's device map.
std::vector<std::string> setting_problems(const JobOptions& job, const strategies::ModelInfo& model,
                                          const std::string& device_map) {
    std::vector<std::string> out;
    using Side = std::pair<const char*, int>;
    const bool own_size = strategies::facts_of(*model.spec).output_size != nullptr;  // Note [output size]
    for (const auto& [flag, pixels] : {Side{"--width", job.width}, Side{"--height", job.height}})
        if (const std::string why = pixels && !own_size ? model.sizes.check(pixels) : ""; !why.empty())
            out.push_back(std::string(flag) + " " + std::to_string(pixels) + ": " + why);
    const strategies::ParallelSpec& spec = *model.spec;
    for (const CallValues::Item& item : job.arguments.items())
        if (const std::string why = foreign_key(model, *item.first); !why.empty())
            out.push_back(item.first->long_flag() + ": " + why);
    if (job.negative_prompt && !model.arguments.guidance_scale())
        out.push_back("--negative-prompt: " + no_negative_prompt(model));
    if (job.seed_drawn && job.resume)
        out.push_back(
            "--seed random and --resume: a resumed job keeps its first run's seeds; give that run's seed "
            "(its manifest records each image's) as --seed N");
    if (job.offload && !device_map.empty())
        out.push_back(
            "--offload and --device-map " + device_map +
            ": choose one (offload keeps one component at a time on the GPU; device_map spreads them "
            "over several)");
    if (job.offload && !spec.offload)
        out.push_back(
            "--offload: " + spec.display_name +
            "'s pipeline keeps its components on their devices; to fit a large model use --device-map "
            "auto, or --tp");
    if (job.no_t5 && spec.t5_required)
        out.push_back("--no-t5: " + spec.display_name +
                      "'s transformer takes T5's embeddings as its whole text; it cannot run without them");
    else if (job.no_t5 && spec.t5_encoder.empty())
        out.push_back("--no-t5: " + spec.display_name + " has no T5 text encoder to leave out");
    else if (job.no_t5 && job.component_files.count(spec.t5_encoder) &&
             job.component_files.at(spec.t5_encoder) != job.model_file)  // a whole-pipeline file's own
        for (const auto& [flag, component] : component_file_flags())
            if (component == spec.t5_encoder)
                out.push_back(
                    "--no-t5 and " + std::string(flag) + " " +
                    utf8_for_display(job.component_files.at(component)) +
                    ": --no-t5 leaves the T5 encoder out, so its file would not be read; give one or "
                    "the other");
    for (const CallValues::Item& item : job.arguments.items()) {
        const FamilyArgument* a = model.arguments.find(item.first->name);
        if (!a || a->ignored) continue;
        // "--max-sequence-length 600 is more than ...", "--skip-guidance-layers 0,2: block 2 is ..."
        const bool blocks = item.first->type == protocol::CallType::kBlocks;
        if (const std::string why = limit_problem(model, *a, item.second); !why.empty())
            out.push_back(item.first->long_flag() + " " +
                          (blocks ? protocol::call_value_text(item.second) + ": " + why : why));
    }
    for (const FamilyArgument& a : model.arguments.all()) {
        if (!a.row->below || a.ignored) continue;
        const FamilyArgument* b = model.arguments.find(a.row->below);
        const double low = number_of(a, {&job.arguments}), high = number_of(*b, {&job.arguments});
        if (low < high) continue;
        out.push_back(a.row->long_flag() + " " + number_text(low) + " and " + b->row->long_flag() + " " +
                      number_text(high) + ": " + a.row->below_why + " (" + (a.row->unit ? a.row->unit : "") +
                      "; diffusers' defaults are " + protocol::call_value_text(a.value) + " and " +
                      protocol::call_value_text(b->value) + ")");
    }
    const std::vector<std::string> schedule = job_schedule_problems(job, model);
    out.insert(out.end(), schedule.begin(), schedule.end());
    return out;
}

}  // namespace

std::vector<std::string> job_setting_problems(const JobOptions& job, const strategies::ModelInfo& model) {
    return setting_problems(job, model, job.device_map);
}

std::vector<std::string> job_setting_problems(const ResolvedJob& job) {
    return setting_problems(job.options, job.model, job.device_map());
}

std::string prompt_setting_problem(const PromptRecord& p, const JobOptions& job,
                                   const strategies::ModelInfo& model) {
    if (p.negative_prompt && !model.arguments.guidance_scale())
        return "key 'negative_prompt': " + no_negative_prompt(model);
    using Side = std::pair<const char*, std::optional<int>>;
    // A pipeline that makes its own size of the one asked checks the one it makes (line_problem).
    const bool own_size = strategies::facts_of(*model.spec).output_size != nullptr;
    for (const auto& [key, pixels] : {Side{"width", p.width}, Side{"height", p.height}})
        if (const std::string why = pixels && !own_size ? model.sizes.check(*pixels) : ""; !why.empty())
            return "key '" + std::string(key) + "': " + std::to_string(*pixels) + ": " + why;
    for (const CallValues::Item& item : p.arguments.items())
        if (const std::string why = foreign_key(model, *item.first); !why.empty())
            return "key '" + std::string(item.first->name) + "': " + why;
    for (const CallValues::Item& item : p.arguments.items()) {
        const FamilyArgument* a = model.arguments.find(item.first->name);
        if (!a || a->ignored) continue;
        if (const std::string why = limit_problem(model, *a, item.second); !why.empty())
            return "key '" + std::string(item.first->name) + "': " + why;
    }
    for (const FamilyArgument& a : model.arguments.all()) {
        if (!a.row->below || a.ignored) continue;
        const FamilyArgument* b = model.arguments.find(a.row->below);
        const bool own_low = p.arguments.has(a.row->name), own_high = p.arguments.has(b->row->name);
        if (!own_low && !own_high) continue;
        const double low = number_of(a, {&p.arguments, &job.arguments});
        const double high = number_of(*b, {&p.arguments, &job.arguments});
        if (low < high) continue;
        return std::string(a.row->name) + " " + number_text(low) + (own_low ? "" : " (the job's)") + " and " +
               b->row->name + " " + number_text(high) + (own_high ? "" : " (the job's)") + ": " +
               a.row->below_why;
    }
    return line_schedule_problem(p, job, model);
}

namespace {

// The model's own defaults that a prompt of this job would take and the model itself refuses: its
// default size (sample_size x the VAE's scale) against its size rule, and each call argument's
// default against its range and the model's blocks. The job's own settings are checked elsewhere.
std::vector<std::string> default_problems(const JobOptions& job, const strategies::ModelInfo& model) {
    std::vector<std::string> out;
    const std::string name = "--model " + utf8_for_display(job.model);
    const int64_t side = model.sizes.default_side;
    if (!job.width || !job.height)
        if (const std::string why = model.sizes.check(side); !why.empty())
            out.push_back(name + ": its default image size " + std::to_string(side) + "x" +
                          std::to_string(side) +
                          " (the transformer's sample_size x the VAE's scale) is not one it makes: " + why +
                          "; its configs disagree (give --width and --height, or fix the folder)");
    for (const FamilyArgument& a : model.arguments.all()) {
        if (a.ignored || job.arguments.has(a.row->name)) continue;
        if (const std::string why = limit_problem(model, a, a.value); !why.empty())
            out.push_back(name + ": its default " + a.row->name + " " + protocol::call_value_text(a.value) +
                          ": " + why + " (give " + a.row->long_flag() + ", or fix the folder)");
    }
    return out;
}

}  // namespace

std::vector<std::string> model_problems(const JobOptions& job, const strategies::ModelInfo& model) {
    strategies::ModelNeeds needs;
    needs.variant = job.variant;
    needs.no_t5 = job.no_t5;
    needs.random_weights = job.random_weights.has_value();
    for (const auto& [component, file] : job.component_files) needs.from_files.insert(component);
    std::vector<std::string> out = strategies::model_folder_problems(job.model, *model.spec, needs);
    const std::vector<std::string> defaults = default_problems(job, model);
    out.insert(out.end(), defaults.begin(), defaults.end());
    return out;
}

void check_model_and_settings(const JobOptions& job, const strategies::ModelInfo& model,
                              const std::string& device_map) {
    if (const std::vector<std::string> bad = model_problems(job, model); !bad.empty())
        throw protocol::ModelError(
            bad.size() == 1 ? bad.front()
                            : "--model " + utf8_for_display(job.model) + ": " + std::to_string(bad.size()) +
                                  " problems, found before anything started:\n  " + joined(bad, "\n  "));
    if (const std::vector<std::string> bad = setting_problems(job, model, device_map); !bad.empty())
        throw UsageError(joined(bad, "; "));
}

void check_job(const ResolvedJob& job) { check_model_and_settings(job.options, job.model, job.device_map()); }

namespace {

bool is_folder(const std::string& path) {
    struct stat st {};
    return !path.empty() && ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

PromptSource prompt_source(const JobOptions& job) {
    PromptSource source{job.prompts, job.prompt_texts, job.images_per_prompt, batch_edit_images(job), {}};
    const std::string& mask = job.arguments.image("mask_image").path;
    if (is_folder(mask)) {
        if (source.images.empty())
            throw UsageError(
                "--mask-image " + utf8_for_display(mask) +
                ": a folder of masks goes with --prompt TEXT and --image GLOB|FOLDER (each image's "
                "mask of its name); give a single mask as a file");
        source.masks = mask;
    }
    return source;
}

bool image_is_a_batch(const JobOptions& job) {
    const protocol::InputImage& image = job.arguments.image("image");
    // A list of pictures is one edit's (Note [several input images]): files, each checked as one.
    return !image.empty() && image.more.empty() &&
           (image.path.find_first_of("*?[") != std::string::npos || is_folder(image.path));
}

namespace {

bool has_image_extension(const std::string& name) {
    const std::size_t dot = name.rfind('.');
    if (dot == std::string::npos) return false;
    std::string ext = name.substr(dot + 1);
    for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return ext == "png" || ext == "jpg" || ext == "jpeg" || ext == "webp";
}

}  // namespace

std::vector<std::string> batch_edit_images(const JobOptions& job) {
    if (!image_is_a_batch(job)) return {};
    const std::string& given = job.arguments.image("image").path;
    const std::string shown = "--image " + utf8_for_display(given);
    if (job.prompt_texts.empty())
        throw UsageError(shown +
                         ": a glob or a folder of images goes with --prompt TEXT (one line per image); in a "
                         "prompt file, give each line its own \"image\"");
    std::vector<std::string> out;
    if (is_folder(given)) {
        std::error_code ec;
        for (const auto& entry : std::filesystem::directory_iterator(given, ec))
            if (entry.is_regular_file(ec) && has_image_extension(entry.path().filename().string()))
                out.push_back(entry.path().string());
        if (ec)
            throw protocol::Error(shown + ": cannot list the folder (" + ec.message() + ")",
                                  protocol::kExitNoInput);
        if (out.empty())
            throw protocol::Error(shown + ": the folder has no .png, .jpg, .jpeg or .webp file",
                                  protocol::kExitNoInput);
    } else {
        glob_t found{};
        const int rc = ::glob(given.c_str(), GLOB_ERR, nullptr, &found);
        for (std::size_t i = 0; rc == 0 && i < found.gl_pathc; ++i) out.emplace_back(found.gl_pathv[i]);
        ::globfree(&found);
        if (out.empty()) throw protocol::Error(shown + ": matches no file", protocol::kExitNoInput);
    }
    std::sort(out.begin(), out.end());
    return out;
}

protocol::JobRequest job_request(const PromptRecord& p, const JobOptions& job,
                                 const strategies::ModelInfo& model) {
    protocol::JobRequest q;
    q.index = p.index;
    q.prompt = p.prompt;
    const FamilyArguments& a = model.arguments;
    q.negative_prompt = p.negative_prompt      ? p.negative_prompt
                        : p.no_negative_prompt ? std::nullopt
                                               : job.negative_prompt;
    // A pipeline whose guidance needs no negative prompt (SD3) has no "none": its default is "".
    const FamilyArgument* cfg = a.guidance_scale();
    if (cfg && cfg->guidance != protocol::Guidance::kAbove1WithNegative && !q.negative_prompt)
        q.negative_prompt = "";
    q.seed = p.seed.value_or(prompt_seed(job.seed, p.index));
    q.steps = line_steps(p, job, model);  // Note [schedules checked first]
    // Each call argument: the record's, else its preset's, else the job's, else the model's default.
    q.arguments = a.completed(line_values(p, job));
    std::tie(q.width, q.height) = line_size(p, job, model, q.arguments);  // Note [output size]
    // An edit's image is named after its input (photos/cat.jpg: 00003-cat.png), unless the line names it.
    const protocol::InputImage& edited = q.arguments.image("image");
    const std::string input_name = std::filesystem::path(edited.path).stem().string();
    q.file = image_file_name(p.index,
                             p.name            ? *p.name
                             : !edited.empty() ? input_name
                                               : p.prompt,
                             job.image_format);
    return q;
}

namespace {

bool is_gpu(const std::string& device) { return device.rfind("cuda", 0) == 0; }

// auto's answer on the CPU for a model `width` features wide (Note [bf16 on a CPU that has it]),
// and why: `where` says why the CPU.
std::pair<std::string, std::string> auto_on_cpu(const std::string& where, int64_t width) {
    const std::string& instructions = strategies::cpu_bf16_instructions();
    if (strategies::auto_bf16_on_cpu(instructions, width))
        return {"bf16", where + "; the CPU has " + instructions + ", the model is " + std::to_string(width) +
                            " wide"};
    if (instructions.empty()) return {"fp32", where + "; the CPU has no bf16 instructions"};
    return {"fp32", where + "; the model is " + std::to_string(width) + " wide, under " +
                        std::to_string(strategies::kCpuBf16MinWidth)};
}

// expected_dtype's answer for auto, and why.
std::pair<std::string, std::string> auto_dtype(const JobOptions& job,
                                               const strategies::ResolvedStrategy& strategy, int64_t width) {
    const std::optional<strategies::DeviceMapPlan>& plan = strategy.device_map_plan;
    if (!strategy.device_map.empty()) {
        if (!plan) return {"bf16", "device_map over the visible GPUs"};
        const std::string where = "device_map on " + joined(plan->devices, ", ");
        if (std::any_of(plan->devices.begin(), plan->devices.end(), is_gpu)) return {"bf16", where};
        return auto_on_cpu(where, width);
    }
    if (job.device == "cpu") return auto_on_cpu("--device cpu", width);
    if (job.device == "cuda") return {"bf16", "--device cuda"};
    const int gpus = visible_gpu_count();
    if (gpus == 0) return auto_on_cpu("no GPU is visible", width);
    return {"bf16", std::to_string(gpus) + " GPU(s) visible"};
}

}  // namespace

std::string expected_dtype(const JobOptions& job, const strategies::ResolvedStrategy& strategy,
                           int64_t width) {
    return job.dtype == "auto" ? auto_dtype(job, strategy, width).first : job.dtype;
}

std::string describe_dtype(const JobOptions& job, const strategies::ResolvedStrategy& strategy,
                           int64_t width) {
    if (job.dtype != "auto") return job.dtype;
    const auto [dtype, why] = auto_dtype(job, strategy, width);
    return "auto: bf16 on a GPU, and on a CPU with bf16 instructions for a model " +
           std::to_string(strategies::kCpuBf16MinWidth) + " or more wide; else fp32; " + dtype + " here (" +
           why + ")";
}

nlohmann::json pending_record(const protocol::JobRequest& q, int64_t line, const JobOptions& job,
                              const std::string& dtype, const nlohmann::json& components) {
    nlohmann::json r = q;
    // Without skipped blocks, skip-layer guidance is off: neither the empty list nor its settings
    // are recorded (what they would say changes nothing).
    // No adapters: nothing to record either (older records have none).
    for (const CallValues::Item& item : q.arguments.items())
        if (!protocol::in_effect(q.arguments, item)) r.erase(item.first->name);
    r["line"] = line;
    r["model"] = job.model;
    r["dtype"] = dtype;
    if (job.random_weights) r["random_weights"] = *job.random_weights;
    if (!job.variant.empty()) r["variant"] = job.variant;
    if (job.no_t5) r["no_t5"] = true;
    if (!job.quantize.empty()) r["quantize"] = job.quantize;  // Note [int8 compute]
    if (components.is_object() && !components.empty()) r["components"] = components;
    r["status"] = "pending";
    return r;
}

}  // namespace dp::launcher
