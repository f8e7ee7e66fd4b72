#include "protocol/presets.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "protocol/errors.h"

namespace dp::protocol {
namespace {

// Qwen-Image-Lightning's scheduler config, as its model card gives it: the Euler flow schedule at a
// fixed shift of ln 3 (exponential dynamic shifting with base_shift = max_shift).
constexpr const char* kLightningScheduler = R"({"base_image_seq_len": 256, "base_shift": 1.0986122886681098,
    "invert_sigmas": false, "max_image_seq_len": 8192, "max_shift": 1.0986122886681098,
    "num_train_timesteps": 1000, "shift": 1.0, "shift_terminal": null, "stochastic_sampling": false,
    "time_shift_type": "exponential", "use_beta_sigmas": false, "use_dynamic_shifting": true,
    "use_exponential_sigmas": false, "use_karras_sigmas": false})";

nlohmann::json lightning(int steps) {
    return {{"name", "qwen-image-lightning-" + std::to_string(steps) + "step"},
            {"family", "qwen-image"},
            {"adapter",
             "lightx2v/Qwen-Image-Lightning (Qwen-Image-Lightning-" + std::to_string(steps) + "steps LoRA)"},
            {"description", "Qwen-Image distilled to " + std::to_string(steps) +
                                " steps: Euler at a fixed shift, without true CFG"},
            {"num_inference_steps", steps},
            {"scheduler", "euler"},
            {"scheduler_config", nlohmann::json::parse(kLightningScheduler)},
            {"true_cfg_scale", 1.0}};
}

const std::vector<nlohmann::json>& shipped_json() {
    static const std::vector<nlohmann::json> all = {
        lightning(8),
        lightning(4),
        nlohmann::json::parse(R"J({"name": "flux-turbo-alpha", "family": "flux",
            "adapter": "alimama-creative/FLUX.1-Turbo-Alpha",
            "description": "FLUX.1-dev distilled to 8 steps (guidance 3.5)",
            "num_inference_steps": 8, "guidance_scale": 3.5})J"),
        nlohmann::json::parse(R"J({"name": "hyper-flux-8step", "family": "flux",
            "adapter": "ByteDance/Hyper-SD Hyper-FLUX.1-dev-8steps-lora (at lora scale 0.125)",
            "description": "FLUX.1-dev in 8 steps with Hyper-SD's LoRA (guidance 3.5)",
            "num_inference_steps": 8, "guidance_scale": 3.5})J"),
        nlohmann::json::parse(R"J({"name": "hyper-sd3-8step", "family": "sd3",
            "adapter": "ByteDance/Hyper-SD Hyper-SD3-8steps-CFG-lora (at lora scale 0.125)",
            "description": "SD3 in 8 steps with Hyper-SD's CFG LoRA (guidance 5.0)",
            "num_inference_steps": 8, "guidance_scale": 5.0})J"),
    };
    return all;
}

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

const std::vector<Preset>& shipped_presets() {
    static const std::vector<Preset> all = [] {
        std::vector<Preset> out;
        for (const nlohmann::json& j : shipped_json()) {
            Preset p;
            if (std::string why = read_preset(j, "shipped preset", p); !why.empty()) throw InternalError(why);
            out.push_back(std::move(p));
        }
        return out;
    }();
    return all;
}

std::string preset_names() {
    std::string out;
    for (const Preset& p : shipped_presets()) out += (out.empty() ? "" : ", ") + p.name;
    return out;
}

std::string find_preset(const std::string& text, Preset& out) {
    for (const Preset& p : shipped_presets())
        if (p.name == text) {
            out = p;
            return {};
        }
    const bool path =
        text.find('/') != std::string::npos || (text.size() > 5 && text.substr(text.size() - 5) == ".json");
    if (!path)
        return "unknown preset '" + text.substr(0, 60) + "' (known: " + preset_names() +
               "; or the path of a preset file, FILE.json)";
    std::ifstream in(text, std::ios::binary);
    if (!in) return "cannot read the preset file " + text.substr(0, 200);
    std::ostringstream s;
    s << in.rdbuf();
    if (s.str().size() > (1 << 20)) return text + ": a preset file is at most 1 MiB";
    const nlohmann::json j = nlohmann::json::parse(s.str(), nullptr, false);
    if (j.is_discarded()) return text + ": not JSON (a preset is a JSON object)";
    return read_preset(j, text, out);
}

}  // namespace dp::protocol
