#include "launcher/job_settings.h"

#include <algorithm>

#include "launcher/errors.h"
#include "launcher/system_info.h"
#include "launcher/values.h"
#include "strategies/model_config.h"

namespace dp::launcher {
namespace {

// diffusers' StableDiffusion3Pipeline defaults for skip-layer guidance.
constexpr double kSkipScale = 2.8, kSkipStart = 0.01, kSkipStop = 0.2;

std::string layers_text(const std::vector<int>& layers) {
    std::string out;
    for (int l : layers) out += (out.empty() ? "" : ",") + std::to_string(l);
    return out;
}

// Why `layer` is no block of a transformer with `blocks` blocks, or empty.
std::string block_problem(int layer, int64_t blocks) {
    if (layer < blocks) return {};
    return "block " + std::to_string(layer) + " is not one of the transformer's " + std::to_string(blocks) +
           " blocks (0 to " + std::to_string(blocks - 1) + ")";
}

std::string joined(const std::vector<std::string>& items, const std::string& separator) {
    std::string out;
    for (const std::string& s : items) out += (out.empty() ? "" : separator) + s;
    return out;
}

// Why the model's pipeline does not take `key`, or empty when it does (or accepts and ignores it).
std::string foreign_key(const ModelRules& rules, const std::string& key) {
    const strategies::CallArguments& a = rules.arguments;
    if (a.takes(key) || a.ignores(key)) return {};
    std::string why = rules.family_name + " does not take " + key + " (its pipeline takes " + joined(a.keys, ", ");
    if (key == "guidance_scale" || key == "true_cfg_scale") why += "; its guidance scale is " + a.cfg_key;
    return why + ")";
}

std::string max_sequence_problem(const ModelRules& rules, int tokens) {
    const int limit = rules.arguments.max_sequence_length_limit;
    if (tokens <= limit) return {};
    return std::to_string(tokens) + " is more than " + rules.family_name + "'s pipeline accepts (1 to " +
           std::to_string(limit) + ")";
}

}  // namespace

std::optional<double> cfg_scale_setting(const JobOptions& job, const strategies::CallArguments& arguments) {
    return arguments.cfg_key == "true_cfg_scale" ? job.true_cfg_scale : job.guidance_scale;
}

ModelRules read_model_rules(const JobOptions& job) {
    const strategies::ParallelSpec& spec = strategies::parallel_spec_for_model(job.model);
    ModelRules rules;
    rules.spec = &spec;
    rules.arguments = strategies::call_arguments_for_model(job.model, spec);
    rules.family_name = strategies::family_name_for_model(job.model, spec);
    rules.sizes = strategies::read_image_size_rule(job.model, spec);
    rules.layers = strategies::read_transformer_shape(job.model, spec).layers;
    return rules;
}

std::vector<std::string> job_setting_problems(const JobOptions& job, const ModelRules& rules) {
    std::vector<std::string> out;
    using Side = std::pair<const char*, int>;
    for (const auto& [flag, pixels] : {Side{"--width", job.width}, Side{"--height", job.height}})
        if (const std::string why = pixels ? rules.sizes.check(pixels) : ""; !why.empty())
            out.push_back(std::string(flag) + " " + std::to_string(pixels) + ": " + why);
    const strategies::ParallelSpec& spec = *rules.spec;
    using Flag = std::pair<const char*, bool>;  // a key, and whether the job sets its flag
    for (const auto& [key, set] :
         {Flag{"guidance_scale", job.guidance_scale.has_value()}, Flag{"true_cfg_scale", job.true_cfg_scale.has_value()},
          Flag{"max_sequence_length", job.max_sequence_length.has_value()},
          Flag{"skip_guidance_layers", !job.skip_guidance_layers.empty()},
          Flag{"skip_layer_guidance_scale", job.skip_layer_guidance_scale.has_value()},
          Flag{"skip_layer_guidance_start", job.skip_layer_guidance_start.has_value()},
          Flag{"skip_layer_guidance_stop", job.skip_layer_guidance_stop.has_value()}}) {
        std::string flag = "--" + std::string(key);
        std::replace(flag.begin(), flag.end(), '_', '-');
        if (const std::string why = set ? foreign_key(rules, key) : ""; !why.empty()) out.push_back(flag + ": " + why);
    }
    if (job.offload && !job.device_map.empty())
        out.push_back("--offload and --device-map " + job.device_map +
                      ": choose one (offload keeps one component at a time on the GPU; device_map spreads them "
                      "over several)");
    if (job.offload && !spec.offload)
        out.push_back("--offload: " + spec.display_name +
                      "'s pipeline keeps its components on their devices; to fit a large model use --device-map "
                      "auto, or --tp");
    if (job.no_t5 && spec.t5_required)
        out.push_back("--no-t5: " + spec.display_name +
                      "'s transformer takes T5's embeddings as its whole text; it cannot run without them");
    else if (job.no_t5 && spec.t5_encoder.empty())
        out.push_back("--no-t5: " + spec.display_name + " has no T5 text encoder to leave out");
    if (job.max_sequence_length)
        if (const std::string why = max_sequence_problem(rules, *job.max_sequence_length); !why.empty())
            out.push_back("--max-sequence-length " + why);
    if (!rules.arguments.takes("skip_guidance_layers")) return out;
    for (int layer : job.skip_guidance_layers)
        if (const std::string why = block_problem(layer, rules.layers); !why.empty())
            out.push_back("--skip-guidance-layers " + layers_text(job.skip_guidance_layers) + ": " + why);
    const double start = job.skip_layer_guidance_start.value_or(kSkipStart);
    const double stop = job.skip_layer_guidance_stop.value_or(kSkipStop);
    if (start >= stop)
        out.push_back("--skip-layer-guidance-start " + number_text(start) + " and --skip-layer-guidance-stop " +
                      number_text(stop) +
                      ": the start must be below the stop (fractions of the steps; diffusers' defaults are "
                      "0.01 and 0.2)");
    return out;
}

std::string prompt_setting_problem(const PromptRecord& p, const JobOptions& job, const ModelRules& rules) {
    using Side = std::pair<const char*, std::optional<int>>;
    for (const auto& [key, pixels] : {Side{"width", p.width}, Side{"height", p.height}})
        if (const std::string why = pixels ? rules.sizes.check(*pixels) : ""; !why.empty())
            return "key '" + std::string(key) + "': " + std::to_string(*pixels) + ": " + why;
    using Key = std::pair<const char*, bool>;  // a key, and whether the record has it
    for (const auto& [key, set] :
         {Key{"guidance_scale", p.guidance_scale.has_value()}, Key{"true_cfg_scale", p.true_cfg_scale.has_value()},
          Key{"max_sequence_length", p.max_sequence_length.has_value()},
          Key{"skip_guidance_layers", p.skip_guidance_layers.has_value()},
          Key{"skip_layer_guidance_scale", p.skip_layer_guidance_scale.has_value()},
          Key{"skip_layer_guidance_start", p.skip_layer_guidance_start.has_value()},
          Key{"skip_layer_guidance_stop", p.skip_layer_guidance_stop.has_value()}})
        if (const std::string why = set ? foreign_key(rules, key) : ""; !why.empty())
            return "key '" + std::string(key) + "': " + why;
    if (p.max_sequence_length)
        if (const std::string why = max_sequence_problem(rules, *p.max_sequence_length); !why.empty())
            return "key 'max_sequence_length': " + why;
    if (p.skip_guidance_layers)
        for (int layer : *p.skip_guidance_layers)
            if (const std::string why = block_problem(layer, rules.layers); !why.empty())
                return "key 'skip_guidance_layers': " + why;
    if (p.skip_layer_guidance_start || p.skip_layer_guidance_stop) {
        const double start = p.skip_layer_guidance_start.value_or(job.skip_layer_guidance_start.value_or(kSkipStart));
        const double stop = p.skip_layer_guidance_stop.value_or(job.skip_layer_guidance_stop.value_or(kSkipStop));
        if (start >= stop)
            return "skip_layer_guidance_start " + number_text(start) +
                   (p.skip_layer_guidance_start ? "" : " (the job's)") + " and skip_layer_guidance_stop " +
                   number_text(stop) + (p.skip_layer_guidance_stop ? "" : " (the job's)") +
                   ": the start must be below the stop";
    }
    return {};
}

std::vector<std::string> model_problems(const JobOptions& job) {
    strategies::ModelNeeds needs;
    needs.variant = job.variant;
    needs.no_t5 = job.no_t5;
    needs.random_weights = job.random_weights.has_value();
    return strategies::model_folder_problems(job.model, strategies::parallel_spec_for_model(job.model), needs);
}

void check_job(const JobOptions& job, const ModelRules& rules) {
    if (const std::vector<std::string> bad = model_problems(job); !bad.empty())
        throw protocol::ModelError(
            bad.size() == 1 ? bad.front()
                            : "--model " + utf8_for_display(job.model) + ": " + std::to_string(bad.size()) +
                                  " problems, found before anything started:\n  " + joined(bad, "\n  "));
    if (const std::vector<std::string> bad = job_setting_problems(job, rules); !bad.empty())
        throw UsageError(joined(bad, "; "));
}

protocol::JobRequest job_request(const PromptRecord& p, const JobOptions& job, const ModelRules& rules) {
    protocol::JobRequest q;
    q.index = p.index;
    q.file = image_file_name(p.index, p.name ? *p.name : p.prompt);
    q.prompt = p.prompt;
    const strategies::CallArguments& a = rules.arguments;
    q.negative_prompt = p.negative_prompt       ? p.negative_prompt
                        : p.no_negative_prompt ? std::nullopt
                                               : job.negative_prompt;
    // SD3's pipeline has no "none": its default negative prompt is "".
    if (!a.guidance_needs_negative_prompt && !q.negative_prompt) q.negative_prompt = "";
    q.seed = p.seed.value_or(prompt_seed(job.seed, p.index));
    q.steps = p.steps.value_or(job.steps.value_or(a.steps));
    // Each scale's default is its family's where that family takes it (the other is unused).
    q.guidance_scale = p.guidance_scale.value_or(job.guidance_scale.value_or(a.cfg_key == "guidance_scale" ? a.cfg_scale : a.guidance_scale));
    q.true_cfg_scale = p.true_cfg_scale.value_or(job.true_cfg_scale.value_or(a.cfg_key == "true_cfg_scale" ? a.cfg_scale : 4.0));
    q.width = p.width.value_or(job.width ? job.width : static_cast<int>(rules.sizes.default_side));
    q.height = p.height.value_or(job.height ? job.height : static_cast<int>(rules.sizes.default_side));
    q.max_sequence_length = p.max_sequence_length.value_or(job.max_sequence_length.value_or(a.max_sequence_length));
    q.skip_guidance_layers = p.skip_guidance_layers.value_or(job.skip_guidance_layers);
    q.skip_layer_guidance_scale = p.skip_layer_guidance_scale.value_or(job.skip_layer_guidance_scale.value_or(kSkipScale));
    q.skip_layer_guidance_start = p.skip_layer_guidance_start.value_or(job.skip_layer_guidance_start.value_or(kSkipStart));
    q.skip_layer_guidance_stop = p.skip_layer_guidance_stop.value_or(job.skip_layer_guidance_stop.value_or(kSkipStop));
    return q;
}

namespace {

bool is_gpu(const std::string& device) { return device.rfind("cuda", 0) == 0; }

// expected_dtype's answer for auto, and why.
std::pair<std::string, std::string> auto_dtype(const JobOptions& job,
                                               const std::optional<strategies::DeviceMapPlan>& plan) {
    if (!job.device_map.empty()) {
        if (!plan) return {"bf16", "device_map over the visible GPUs"};
        const bool gpu = std::any_of(plan->devices.begin(), plan->devices.end(), is_gpu);
        return {gpu ? "bf16" : "fp32", "device_map on " + joined(plan->devices, ", ")};
    }
    if (job.device == "cpu") return {"fp32", "--device cpu"};
    if (job.device == "cuda") return {"bf16", "--device cuda"};
    const int gpus = visible_gpu_count();
    if (gpus == 0) return {"fp32", "no GPU is visible"};
    return {"bf16", std::to_string(gpus) + " GPU(s) visible"};
}

}  // namespace

std::string expected_dtype(const JobOptions& job, const std::optional<strategies::DeviceMapPlan>& plan) {
    return job.dtype == "auto" ? auto_dtype(job, plan).first : job.dtype;
}

std::string describe_dtype(const JobOptions& job, const std::optional<strategies::DeviceMapPlan>& plan) {
    if (job.dtype != "auto") return job.dtype;
    const auto [dtype, why] = auto_dtype(job, plan);
    return "auto: bf16 on a GPU, fp32 on the CPU; " + dtype + " here (" + why + ")";
}

nlohmann::json pending_record(const protocol::JobRequest& q, int64_t line, const JobOptions& job,
                              const std::string& dtype, const ModelRules& rules) {
    nlohmann::json r = q;
    for (const char* key : {"guidance_scale", "true_cfg_scale", "max_sequence_length", "skip_guidance_layers",
                            "skip_layer_guidance_scale", "skip_layer_guidance_start", "skip_layer_guidance_stop"})
        if (!rules.arguments.takes(key)) r.erase(key);
    if (q.skip_guidance_layers.empty() && r.contains("skip_guidance_layers"))  // none: its settings change nothing
        for (const char* key : {"skip_guidance_layers", "skip_layer_guidance_scale", "skip_layer_guidance_start",
                                "skip_layer_guidance_stop"})
            r.erase(key);
    r["line"] = line;
    r["model"] = job.model;
    r["dtype"] = dtype;
    if (job.random_weights) r["random_weights"] = *job.random_weights;
    if (!job.variant.empty()) r["variant"] = job.variant;
    if (job.no_t5) r["no_t5"] = true;
    r["status"] = "pending";
    return r;
}

}  // namespace dp::launcher
