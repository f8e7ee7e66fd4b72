#include "launcher/schedule_settings.h"

#include <fstream>
#include <iterator>
#include <map>
#include <mutex>

#include "launcher/values.h"
#include "protocol/schedulers.h"

namespace dp::launcher {
namespace {

using protocol::CallValues;
using protocol::Preset;

constexpr const char* kScheduleRows[] = {"scheduler", "scheduler_config", "sigmas", "timesteps"};

// One layer of settings a preset's values are compared with: a line's own or the job's flags.
struct Layer {
    const CallValues* values;
    std::optional<int> steps;
    const char* whose;  // "" (the line's own, by key), " (the job's)" or nullptr (the job's, by flag)
};

// "num_inference_steps 20", "guidance_scale 3 (the job's)", "--steps 20": a layer's value of `row`.
std::string asked(const protocol::CallArgument& row, const Layer& layer, const std::string& value) {
    return layer.whose ? row.name + (" " + value) + layer.whose : row.long_flag() + " " + value;
}

// The first value of `preset` that a layer asks otherwise, naming both, or empty.
std::string preset_conflict(const Preset& preset, const std::vector<Layer>& layers) {
    const std::string fixes = ", but preset " + preset.name + " fixes ";
    const protocol::CallArgument& steps_row = *protocol::find_call_argument("num_inference_steps");
    for (const Layer& layer : layers) {
        if (preset.steps && layer.steps && *layer.steps != *preset.steps)
            return asked(steps_row, layer, std::to_string(*layer.steps)) + fixes +
                   (layer.whose ? "it" : "num_inference_steps") + " at " + std::to_string(*preset.steps);
        for (const CallValues::Item& item : preset.arguments.items()) {
            const protocol::CallValue* v = layer.values->find(item.first->name);
            if (!v || protocol::call_value_json(*v) == protocol::call_value_json(item.second)) continue;
            return asked(*item.first, layer, protocol::call_value_text(*v)) + fixes +
                   (layer.whose ? "it" : item.first->name) + " at " + protocol::call_value_text(item.second);
        }
    }
    return {};
}

// Why `preset` cannot run on `model`: another family, or a call argument the family does not take.
std::string preset_family_problem(const Preset& preset, const strategies::ModelInfo& model) {
    if (preset.family != model.family)
        return "preset " + preset.name + " is for the " + preset.family + " family" +
               (preset.adapter.empty() ? "" : " (" + preset.adapter + ")") + ", and the model is " +
               model.family_name + " (" + model.family + ")";
    for (const CallValues::Item& item : preset.arguments.items())
        if (!model.arguments.find(item.first->name))
            return "preset " + preset.name + " sets " + item.first->name + ", which " + model.family_name +
                   "'s pipeline does not take";
    return {};
}

// Whether `values` give the row `name` something (a scheduler, keys, a list).
bool gives(const CallValues& values, const char* name) {
    for (const CallValues::Item& item : values.items())
        if (item.first->name == std::string_view(name)) return protocol::in_effect(values, item);
    return false;
}

bool has_schedule(const CallValues& values) {
    for (const char* name : kScheduleRows)
        if (gives(values, name)) return true;
    return false;
}

// The model folder's scheduler/scheduler_config.json parsed, or an error text. Read once per folder
// (a job reads its model's once, however many lines ask).
std::string model_config(const strategies::ModelInfo& model, nlohmann::json& out) {
    static std::mutex guard;
    static std::map<std::string, nlohmann::json> read;
    const std::lock_guard<std::mutex> lock(guard);
    auto it = read.find(model.dir);
    if (it == read.end()) {
        std::ifstream in(model.dir + "/scheduler/scheduler_config.json", std::ios::binary);
        const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        it = read.emplace(model.dir, nlohmann::json::parse(text, nullptr, false)).first;
    }
    out = it->second;
    if (out.is_discarded() || !out.is_object())
        return "the model's scheduler/scheduler_config.json is not a JSON object";
    return {};
}

// Why `values`' scheduler does not resolve over the model's, or its lists cannot go to it in `steps`.
std::string schedule_problem_of(const CallValues& values, int steps, const strategies::ModelInfo& model,
                                protocol::ResolvedScheduler& resolved) {
    nlohmann::json own;
    if (std::string why = model_config(model, own); !why.empty()) return why;
    if (std::string why = protocol::resolve_scheduler(
            own, values.scheduler("scheduler"), values.scheduler_overrides("scheduler_config"), resolved);
        !why.empty())
        return why;
    return protocol::schedule_problem(resolved, steps, values.numbers("sigmas"), values.numbers("timesteps"));
}

}  // namespace

const Preset* line_preset(const PromptRecord& p, const JobOptions& job) {
    if (p.preset) return &*p.preset;
    return job.preset ? &*job.preset : nullptr;
}

CallValues line_values(const PromptRecord& p, const JobOptions& job) {
    CallValues given = job.arguments;
    if (const Preset* preset = line_preset(p, job))
        for (const CallValues::Item& item : preset->arguments.items()) given.set(*item.first, item.second);
    for (const CallValues::Item& item : p.arguments.items()) given.set(*item.first, item.second);
    return given;
}

int line_steps(const PromptRecord& p, const JobOptions& job, const strategies::ModelInfo& model) {
    if (p.steps) return *p.steps;
    if (job.steps) return *job.steps;
    if (const Preset* preset = line_preset(p, job); preset && preset->steps) return *preset->steps;
    const CallValues given = line_values(p, job);
    for (const char* list : {"sigmas", "timesteps"})
        if (!given.numbers(list).empty()) return static_cast<int>(given.numbers(list).size());
    return static_cast<int>(model.arguments.default_number("num_inference_steps"));
}

std::string line_schedule_problem(const PromptRecord& p, const JobOptions& job,
                                  const strategies::ModelInfo& model) {
    if (const Preset* preset = line_preset(p, job)) {
        if (std::string why = preset_family_problem(*preset, model); !why.empty())
            return "key 'preset': " + why;
        std::vector<Layer> layers = {{&p.arguments, p.steps, ""}};
        if (p.preset) layers.push_back({&job.arguments, job.steps, " (the job's)"});
        if (std::string why = preset_conflict(*preset, layers); !why.empty()) return why;
    }
    const CallValues given = line_values(p, job);
    if (!has_schedule(given)) return {};
    protocol::ResolvedScheduler resolved;
    return schedule_problem_of(given, line_steps(p, job, model), model, resolved);
}

std::vector<std::string> job_schedule_problems(const JobOptions& job, const strategies::ModelInfo& model) {
    if (job.preset) {
        if (std::string why = preset_family_problem(*job.preset, model); !why.empty())
            return {"--preset " + utf8_for_display(job.preset->name) + ": " + why};
        if (std::string why = preset_conflict(*job.preset, {{&job.arguments, job.steps, nullptr}});
            !why.empty())
            return {why};
    }
    const PromptRecord none;
    const CallValues given = line_values(none, job);
    if (!has_schedule(given)) return {};
    protocol::ResolvedScheduler resolved;
    const std::string why = schedule_problem_of(given, line_steps(none, job, model), model, resolved);
    if (why.empty()) return {};
    std::string flags;
    for (const char* name : kScheduleRows)
        if (gives(given, name))
            flags += (flags.empty() ? "" : " ") + protocol::find_call_argument(name)->long_flag() + " " +
                     protocol::call_value_text(*given.find(name));
    if (job.preset) flags += " (with --preset " + job.preset->name + ")";
    return {flags + ": " + why};
}

void add_schedule_record(nlohmann::json& record, const protocol::JobRequest& q, const Preset* preset,
                         const strategies::ModelInfo& model) {
    if (preset) record["preset"] = preset->name;
    if (!has_schedule(q.arguments)) return;
    protocol::ResolvedScheduler resolved;
    if (schedule_problem_of(q.arguments, q.steps, model, resolved).empty())
        record["scheduler_resolved"] = resolved.record();
}

}  // namespace dp::launcher
