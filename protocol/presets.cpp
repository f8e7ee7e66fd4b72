#include "protocol/presets.h"

#include <nlohmann/json.hpp>

#include "protocol/errors.h"
#include "protocol/strict_json.h"

namespace dp::protocol {
namespace {

std::string text_key(const nlohmann::json& j, const char* key, const std::string& where, bool required,
                     std::string& out) {
    if (!j.contains(key)) return required ? where + ": missing key '" + key + "'" : std::string();
    if (!j.at(key).is_string() || j.at(key).get<std::string>().empty())
        return where + ": key '" + std::string(key) + "': expected a non-empty string";
    out = j.at(key).get<std::string>().substr(0, 1000);
    return {};
}

std::string accepted_keys() {
    std::string out = "name, family, adapter, description, num_inference_steps";
    for (const CallArgument& row : call_arguments())
        if (!row.universal) out += std::string(", ") + row.name;
    return out;
}

// The steps or call argument `key` of a preset into `out`: an error text, or empty.
std::string read_setting(const std::string& key, const nlohmann::json& value, const std::string& where,
                         Preset& out) {
    const CallArgument* row = find_call_argument(key);
    if (row && row->universal && row->name == std::string("num_inference_steps")) {
        if (!value.is_number_integer() || value.get<int64_t>() < row->min || value.get<int64_t>() > row->max)
            return where + ": key '" + key + "': expected " + row->expected();
        out.steps = static_cast<int>(value.get<int64_t>());
        return {};
    }
    if (!row || row->universal || key != row->name)
        return where + ": unknown key '" + key.substr(0, 40) + "' (accepted: " + accepted_keys() + ")";
    CallValue v;
    if (std::string why = read_call_value(*row, value, v); !why.empty())
        return where + ": key '" + key + "': " + why;
    out.arguments.set(*row, std::move(v));
    return {};
}

}  // namespace

std::string read_preset(const nlohmann::json& j, const std::string& where, Preset& out) {
    out = Preset{};
    if (!j.is_object()) return where + ": expected a JSON object with name, family and its settings";
    for (const auto& [key, field] : {std::pair<const char*, std::string*>{"name", &out.name},
                                     {"family", &out.family},
                                     {"adapter", &out.adapter},
                                     {"description", &out.description}})
        if (std::string why =
                text_key(j, key, where, key == std::string("name") || key == std::string("family"), *field);
            !why.empty())
            return why;
    for (const auto& [key, value] : j.items()) {
        if (key == "name" || key == "family" || key == "adapter" || key == "description") continue;
        if (std::string why = read_setting(key, value, where, out); !why.empty()) return why;
    }
    if (!out.steps && out.arguments.items().empty())
        return where + ": a preset sets num_inference_steps or a call argument; this one sets nothing";
    return {};
}

std::string preset_names(const std::vector<Preset>& shipped) {
    std::string out;
    for (const Preset& p : shipped) out += (out.empty() ? "" : ", ") + p.name;
    return out;
}

std::string find_preset(const std::string& text, const std::vector<Preset>& shipped, Preset& out) {
    for (const Preset& p : shipped)
        if (p.name == text) {
            out = p;
            return {};
        }
    if (!names_a_json_file(text))
        return "unknown preset '" + text.substr(0, 60) + "' (known: " + preset_names(shipped) +
               "; or the path of a preset file, FILE.json)";
    std::string body;
    if (std::string why = read_small_file(text, "preset file", body); !why.empty()) return why;
    const nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
    if (j.is_discarded()) return text + ": not JSON (a preset is a JSON object)";
    return read_preset(j, text, out);
}

}  // namespace dp::protocol
