#include "protocol/image_parameters.h"

#include <nlohmann/json.hpp>

namespace dp::protocol {
namespace {

// A value as AUTOMATIC1111 writes it: as it is, or as a JSON string when it holds a separator.
std::string quoted(const std::string& value) {
    if (value.find_first_of(",:\"\n") == std::string::npos) return value;
    return nlohmann::json(value).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void add(std::string& line, const std::string& key, const std::string& value) {
    line += (line.empty() ? "" : ", ") + key + ": " + quoted(value);
}

}  // namespace

std::string made_by_version() { return std::string("dp-launch ") + DP_PROJECT_VERSION; }

std::string image_parameters(const Generation& g, const ImageProvenance& made_by) {
    std::string text = g.prompt + "\n";
    if (g.negative_prompt && !g.negative_prompt->empty())
        text += "Negative prompt: " + *g.negative_prompt + "\n";
    std::string line;
    add(line, "Steps", std::to_string(g.steps));
    // Every family runs diffusers' FlowMatchEulerDiscreteScheduler: A1111's "Euler".
    add(line, "Sampler", "Euler");
    if (!made_by.cfg_name.empty() && g.arguments.has(made_by.cfg_name))
        add(line, "CFG scale", call_value_text(*g.arguments.find(made_by.cfg_name)));
    add(line, "Seed", std::to_string(g.seed));
    add(line, "Size", std::to_string(g.width) + "x" + std::to_string(g.height));
    if (!made_by.model.empty()) add(line, "Model", made_by.model);
    // The settings in effect, by diffusers' names; none of a step cache is the default.
    for (const CallValues::Item& item : g.arguments.items())
        if (item.first->name != made_by.cfg_name && in_effect(g.arguments, item) &&
            !(std::holds_alternative<StepCache>(item.second) && call_value_text(item.second) == "none"))
            add(line, item.first->name, call_value_text(item.second));
    add(line, "Version", made_by_version());
    return text + line;
}

std::string image_record_text(const JobRequest& r, const ImageProvenance& made_by) {
    nlohmann::json j = r;
    for (const CallValues::Item& item : r.arguments.items())
        if (!in_effect(r.arguments, item)) j.erase(item.first->name);
    j["model"] = made_by.model;
    j["version"] = made_by_version();
    return j.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
}

}  // namespace dp::protocol
