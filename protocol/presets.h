#pragma once
// Note [presets]: a preset is the settings a published few-step adapter (a distilled LoRA such as
// Qwen-Image-Lightning) was trained for, under one name: its steps and the call arguments it needs
// (the scheduler and its config, the guidance scale). A job takes one with --preset NAME|FILE.json, a
// prompt line with "preset": NAME. Every value a preset sets is fixed: a line or a flag that asks
// another value for one of them is refused naming both, as is a preset of another family than the
// model's. The records name the preset beside the values it set. std and nlohmann/json only.
//
// The format (a shipped preset's and a user's file): a JSON object with "name", "family" (the
// call-argument table's family id: "qwen-image", "flux", "sd3", ...), "adapter" (the published
// adapter it belongs to, in words), "description", "num_inference_steps", and any family call
// argument by its name ("scheduler", "scheduler_config", "true_cfg_scale", "guidance_scale", ...).

#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "protocol/call_arguments.h"

namespace dp::protocol {

struct Preset {
    std::string name;
    std::string family;  // the call-argument table's family id ("qwen-image")
    std::string adapter;
    std::string description;
    std::optional<int> steps;  // num_inference_steps
    CallValues arguments;      // the family call arguments it fixes
};

// "qwen-image-lightning-8step, qwen-image-lightning-4step, ...": the names of `shipped` (the presets
// the families publish in their facts files: strategies::shipped_presets()).
std::string preset_names(const std::vector<Preset>& shipped);

// A preset from its JSON object; `where` names it in messages. An error text, or empty.
std::string read_preset(const nlohmann::json& j, const std::string& where, Preset& out);
// One of `shipped` by name, or the path of a preset file (relative to the working directory). An
// error text (an unknown name lists the known ones), or empty.
std::string find_preset(const std::string& text, const std::vector<Preset>& shipped, Preset& out);

}  // namespace dp::protocol
