#include "protocol/schedulers.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "protocol/number_text.h"
#include "protocol/strict_json.h"

namespace dp::protocol {
namespace {

// Each class's config keys at their defaults (diffusers 0.42.1's __init__), as from_config starts.
const nlohmann::json& class_defaults(const SchedulerKind& kind) {
    static const nlohmann::json euler = nlohmann::json::parse(R"({
        "num_train_timesteps": 1000, "shift": 1.0, "use_dynamic_shifting": false, "base_shift": 0.5,
        "max_shift": 1.15, "base_image_seq_len": 256, "max_image_seq_len": 4096, "invert_sigmas": false,
        "shift_terminal": null, "use_karras_sigmas": false, "use_exponential_sigmas": false,
        "use_beta_sigmas": false, "time_shift_type": "exponential", "stochastic_sampling": false})");
    static const nlohmann::json heun =
        nlohmann::json::parse(R"({"num_train_timesteps": 1000, "shift": 1.0})");
    static const nlohmann::json lcm = [] {
        nlohmann::json j = euler;
        j.erase("stochastic_sampling");
        j["scale_factors"] = nullptr;
        j["upscale_mode"] = "bicubic";
        return j;
    }();
    // The DDPM keys the multistep solvers keep beside their flow sigmas.
    static const nlohmann::json multistep = nlohmann::json::parse(R"({
        "num_train_timesteps": 1000, "beta_start": 0.0001, "beta_end": 0.02, "beta_schedule": "linear",
        "trained_betas": null, "solver_order": 2, "prediction_type": "epsilon", "thresholding": false,
        "dynamic_thresholding_ratio": 0.995, "sample_max_value": 1.0, "lower_order_final": true,
        "use_karras_sigmas": false, "use_exponential_sigmas": false, "use_beta_sigmas": false,
        "use_flow_sigmas": false, "flow_shift": 1.0, "timestep_spacing": "linspace", "steps_offset": 0,
        "final_sigmas_type": "zero", "rescale_betas_zero_snr": false, "use_dynamic_shifting": false,
        "time_shift_type": "exponential"})");
    static const nlohmann::json dpm = [] {
        nlohmann::json j = multistep;
        j.update(nlohmann::json::parse(R"({"algorithm_type": "dpmsolver++", "solver_type": "midpoint",
            "euler_at_final": false, "use_lu_lambdas": false, "lambda_min_clipped": null,
            "variance_type": null})"));
        return j;
    }();
    static const nlohmann::json unipc = [] {
        nlohmann::json j = multistep;
        j.update(nlohmann::json::parse(R"({"predict_x0": true, "solver_type": "bh2", "disable_corrector": [],
            "solver_p": null, "sigma_min": null, "sigma_max": null, "shift_terminal": null})"));
        return j;
    }();
    const std::string_view c = kind.diffusers_class;
    if (c == "FlowMatchHeunDiscreteScheduler") return heun;
    if (c == "FlowMatchLCMScheduler") return lcm;
    if (c == "DPMSolverMultistepScheduler") return dpm;
    if (c == "UniPCMultistepScheduler") return unipc;
    return euler;
}

// Keys whose default is None and that take a number (others with a None default take nothing else).
bool number_or_null(const std::string& key) {
    return key == "shift_terminal" || key == "sigma_min" || key == "sigma_max" || key == "lambda_min_clipped";
}

std::string json_type_name(const nlohmann::json& j) {
    if (j.is_boolean()) return "true or false";
    if (j.is_number()) return "a number";
    if (j.is_string()) return "a string";
    if (j.is_array()) return "a list";
    return "null";
}

// Why `value` cannot be `key` of a class whose default for it is `def`, or empty.
std::string type_problem(const std::string& key, const nlohmann::json& value, const nlohmann::json& def) {
    if (value.is_null() && (def.is_null() || number_or_null(key))) return {};
    if (def.is_null()) {
        if (number_or_null(key) && value.is_number() && std::isfinite(value.get<double>())) return {};
        return "'" + key + "' takes " + (number_or_null(key) ? "a number or null" : "only null here");
    }
    const bool same = (def.is_boolean() && value.is_boolean()) ||
                      (def.is_number() && value.is_number() && std::isfinite(value.get<double>())) ||
                      (def.is_string() && value.is_string()) || (def.is_array() && value.is_array());
    if (!same) return "'" + key + "' takes " + json_type_name(def) + ", not " + value.dump().substr(0, 40);
    if (def.is_number_integer() && !value.is_number_integer()) return "'" + key + "' takes a whole number";
    return {};
}

std::string keys_of(const nlohmann::json& j) {
    std::string out;
    for (const auto& [key, value] : j.items()) out += (out.empty() ? "" : ", ") + key;
    return out;
}

// The values every kind's loop runs: positive counts and shifts, known names.
std::string common_problem(const nlohmann::json& c) {
    if (c.at("num_train_timesteps").get<int64_t>() < 1 ||
        c.at("num_train_timesteps").get<int64_t>() > 1000000)
        return "'num_train_timesteps' must be from 1 to 1000000";
    for (const char* key : {"shift", "flow_shift"})
        if (c.contains(key) && !(c.at(key).get<double>() > 0 && c.at(key).get<double>() < 1e6))
            return "'" + std::string(key) + "' is " + number_text(c.at(key).get<double>()) +
                   ": it must be above 0 (and below 1e6)";
    if (c.contains("shift_terminal") && c.at("shift_terminal").is_number() &&
        !(c.at("shift_terminal").get<double>() > 0 && c.at("shift_terminal").get<double>() < 1))
        return "'shift_terminal' must be above 0 and below 1 (or null: none)";
    if (c.contains("time_shift_type")) {
        const std::string t = c.at("time_shift_type").get<std::string>();
        if (t != "exponential" && t != "linear")
            return "'time_shift_type' is '" + t + "'; accepted: exponential, linear";
    }
    if (c.contains("base_image_seq_len") && c.value("use_dynamic_shifting", false) &&
        c.at("base_image_seq_len") == c.at("max_image_seq_len"))
        return "'max_image_seq_len' must differ from 'base_image_seq_len' with dynamic shifting";
    int schedules = 0;
    for (const char* key : {"use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas"})
        schedules += c.value(key, false) ? 1 : 0;
    if (schedules > 1)
        return "only one of use_karras_sigmas, use_exponential_sigmas and use_beta_sigmas can be true";
    return {};
}

// What DPM-Solver++ and UniPC run here: flow sigmas and a flow prediction, no thresholding.
std::string multistep_problem(const SchedulerKind& kind, const nlohmann::json& c) {
    if (!c.at("use_flow_sigmas").get<bool>() || c.at("prediction_type") != "flow_prediction")
        return std::string(kind.diffusers_class) +
               " runs on flow sigmas here: the models' transformers predict flow (use_flow_sigmas true, "
               "prediction_type \"flow_prediction\", as the name " +
               kind.name + " sets them)";
    if (c.at("thresholding").get<bool>()) return "'thresholding' is for pixel-space models; set it to false";
    const int64_t order = c.at("solver_order").get<int64_t>();
    if (order < 1 || order > 3) return "'solver_order' must be 1, 2 or 3";
    if (c.value("use_exponential_sigmas", false) || c.value("use_beta_sigmas", false) ||
        c.value("use_lu_lambdas", false))
        return std::string(kind.diffusers_class) +
               " builds exponential, beta and Lu schedules from its DDPM betas, not flow sigmas; use euler "
               "or "
               "lcm for those schedules";
    if (c.contains("solver_p") && !c.at("solver_p").is_null()) return "'solver_p' is not supported";
    if (c.contains("variance_type") && !c.at("variance_type").is_null())
        return "'variance_type' is not supported (flow prediction has no learned variance)";
    return {};
}

std::string dpm_problem(const nlohmann::json& c) {
    const std::string algorithm = c.at("algorithm_type").get<std::string>();
    if (algorithm != "dpmsolver++" && algorithm != "sde-dpmsolver++")
        return "'algorithm_type' is '" + algorithm + "'; accepted: dpmsolver++, sde-dpmsolver++";
    const std::string solver = c.at("solver_type").get<std::string>();
    if (solver != "midpoint" && solver != "heun")
        return "'solver_type' is '" + solver + "'; accepted: midpoint, heun";
    if (c.value("use_karras_sigmas", false))
        return "DPMSolverMultistepScheduler builds Karras sigmas from its DDPM betas, not flow sigmas; use "
               "unipc, euler or lcm with use_karras_sigmas";
    if (c.at("final_sigmas_type") != "zero") return "'final_sigmas_type' must be \"zero\" with flow sigmas";
    if (c.value("use_dynamic_shifting", false) && c.at("time_shift_type") != "exponential")
        return "DPMSolverMultistepScheduler's dynamic shift is exponential only (time_shift_type)";
    return {};
}

std::string unipc_problem(const nlohmann::json& c) {
    if (c.value("use_karras_sigmas", false))
        return "UniPCMultistepScheduler builds Karras sigmas from its DDPM betas, not the flow schedule; use "
               "euler or lcm with use_karras_sigmas";
    const std::string solver = c.at("solver_type").get<std::string>();
    if (solver != "bh1" && solver != "bh2") return "'solver_type' is '" + solver + "'; accepted: bh1, bh2";
    if (!c.at("predict_x0").get<bool>()) return "'predict_x0' must be true with a flow prediction";
    const std::string last = c.at("final_sigmas_type").get<std::string>();
    if (last != "zero" && last != "sigma_min")
        return "'final_sigmas_type' is '" + last + "'; accepted: zero, sigma_min";
    if (solver == "bh1" || !c.at("lower_order_final").get<bool>())
        return "diffusers' UniPCMultistepScheduler ends in NaN with solver_type bh1 or lower_order_final "
               "false (its last step to sigma 0); use bh2 with lower_order_final true";
    for (const nlohmann::json& i : c.at("disable_corrector"))
        if (!i.is_number_integer()) return "'disable_corrector' takes a list of step indices";
    return {};
}

std::string kind_problem(const SchedulerKind& kind, const nlohmann::json& c) {
    if (std::string why = common_problem(c); !why.empty()) return why;
    const std::string_view cls = kind.diffusers_class;
    if (cls == "FlowMatchLCMScheduler" && !c.at("scale_factors").is_null())
        return "'scale_factors' (LCM's upscaling between steps) is not supported";
    if (cls == "FlowMatchEulerDiscreteScheduler" || cls == "FlowMatchLCMScheduler") return {};
    if (cls != "DPMSolverMultistepScheduler" && cls != "UniPCMultistepScheduler") return {};
    if (std::string why = multistep_problem(kind, c); !why.empty()) return why;
    return cls == "DPMSolverMultistepScheduler" ? dpm_problem(c) : unipc_problem(c);
}

// `keys` into `config` (keys of its class only, unless `strict`: then another is an error).
std::string merge_keys(const SchedulerKind& kind, const nlohmann::json& keys, bool strict,
                       nlohmann::json& config, const std::string& where) {
    const nlohmann::json& defaults = class_defaults(kind);
    for (const auto& [key, value] : keys.items()) {
        if (!key.empty() && key[0] == '_') continue;  // _class_name, _diffusers_version
        if (!defaults.contains(key)) {
            if (!strict) {  // from_config keeps another class's keys in the config (a pipeline reads them)
                config[key] = value;
                continue;
            }
            return where + ": '" + key.substr(0, 40) + "' is not a key of " + kind.diffusers_class +
                   " (its keys: " + keys_of(defaults) + ")";
        }
        if (std::string why = type_problem(key, value, defaults.at(key)); !why.empty())
            return where + ": " + why;
        config[key] = value;
    }
    return {};
}

}  // namespace

const std::vector<SchedulerKind>& scheduler_kinds() {
    static const std::vector<SchedulerKind> kinds = {
        {"euler", "FlowMatchEulerDiscreteScheduler", "flow_match_euler", true, true, true, 1,
         "the models' own: Euler steps of the flow (stochastic_sampling: re-noised from x0 each step)"},
        {"heun", "FlowMatchHeunDiscreteScheduler", "flow_match_heun", false, false, false, 2,
         "Heun's second-order steps: two passes of the transformer per step"},
        {"lcm", "FlowMatchLCMScheduler", "flow_match_lcm", true, true, true, 1,
         "LCM: each step predicts x0 and re-noises it to the next sigma (for distilled few-step models)"},
        {"dpm++-2m", "DPMSolverMultistepScheduler", "dpmpp_2m,dpm++2m,dpm++", false, false, true, 1,
         "DPM-Solver++ (2M), multistep on flow sigmas at the model's shift"},
        {"dpm++-2m-sde", "DPMSolverMultistepScheduler", "dpmpp_2m_sde,dpm++2m-sde", false, false, true, 1,
         "DPM-Solver++ (2M SDE): the stochastic variant, noise from each prompt's seed"},
        {"unipc", "UniPCMultistepScheduler", "uni_pc,unipc_bh2", true, false, true, 1,
         "UniPC (bh2) predictor-corrector, multistep on flow sigmas at the model's shift"},
    };
    return kinds;
}

const SchedulerKind* find_scheduler_kind(std::string_view name) {
    for (const SchedulerKind& k : scheduler_kinds()) {
        if (name == k.name || name == k.diffusers_class) return &k;
        std::string_view rest = k.aliases;
        while (!rest.empty()) {
            const std::size_t comma = rest.find(',');
            if (rest.substr(0, comma) == name) return &k;
            rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
        }
    }
    return nullptr;
}

std::string scheduler_names() {
    std::string out;
    for (const SchedulerKind& k : scheduler_kinds()) out += (out.empty() ? "" : ", ") + std::string(k.name);
    return out;
}

namespace {

// The kind a diffusers class name stands for (the SDE kind shares DPM-Solver++'s class).
const SchedulerKind* kind_of_class(const std::string& cls) {
    for (const SchedulerKind& k : scheduler_kinds())
        if (cls == k.diffusers_class) return &k;
    return nullptr;
}

}  // namespace

std::string parse_scheduler_choice(const std::string& text, SchedulerChoice& out) {
    out = SchedulerChoice{};
    if (text.empty() || text == "default") return {};
    if (const SchedulerKind* k = find_scheduler_kind(text)) {
        out.name = k->name;
        return {};
    }
    if (!names_a_json_file(text))
        return "unknown scheduler '" + text.substr(0, 60) + "' (known: " + scheduler_names() +
               "; or the path of a diffusers scheduler_config.json)";
    std::string body;
    if (std::string why = read_small_file(text, "scheduler config file", body); !why.empty()) return why;
    const nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
    if (j.is_discarded() || !j.is_object())
        return text + ": not a JSON object (a diffusers scheduler_config.json)";
    const std::string cls = j.value("_class_name", std::string());
    const SchedulerKind* k = kind_of_class(cls);
    if (!k)
        return text + ": its _class_name '" + cls.substr(0, 60) +
               "' is not a flow-matching scheduler dp-launch runs (" + scheduler_names() +
               ": FlowMatchEulerDiscreteScheduler, FlowMatchHeunDiscreteScheduler, "
               "FlowMatchLCMScheduler, DPMSolverMultistepScheduler, UniPCMultistepScheduler)";
    nlohmann::json keys = nlohmann::json::object();
    nlohmann::json check = class_defaults(*k);
    if (std::string why = merge_keys(*k, j, false, check, text); !why.empty()) return why;
    for (const auto& [key, value] : j.items())
        if (check.contains(key)) keys[key] = value;
    out.name = k->name;
    out.config = keys.dump();
    return {};
}

std::string read_scheduler_choice(const nlohmann::json& j, SchedulerChoice& out) {
    if (j.is_null()) {
        out = SchedulerChoice{};
        return {};
    }
    if (j.is_string()) return parse_scheduler_choice(j.get<std::string>(), out);
    if (!j.is_object() || !j.contains("name") || !j.at("name").is_string())
        return "expected a scheduler's name (" + scheduler_names() + ") or a scheduler_config.json path";
    const SchedulerKind* k = find_scheduler_kind(j.at("name").get<std::string>());
    if (!k) return "unknown scheduler '" + j.at("name").get<std::string>().substr(0, 60) + "'";
    out.name = k->name;
    out.config.clear();
    if (j.contains("config")) {
        if (!j.at("config").is_object()) return "a scheduler's \"config\" must be an object";
        out.config = j.at("config").dump();
    }
    return {};
}

nlohmann::json scheduler_choice_json(const SchedulerChoice& choice) {
    if (choice.config.empty()) return choice.name;
    return {{"name", choice.name}, {"config", nlohmann::json::parse(choice.config)}};
}

std::string read_scheduler_overrides(const nlohmann::json& j, SchedulerOverrides& out) {
    out = SchedulerOverrides{};
    if (j.is_null()) return {};
    if (!j.is_object())
        return "expected an object of diffusers' scheduler config keys, e.g. {\"use_karras_sigmas\": true}";
    if (j.dump().size() > 65536) return "a scheduler_config of at most 64 KiB";
    if (!j.empty()) out.json = j.dump();
    return {};
}

nlohmann::json ResolvedScheduler::json() const { return nlohmann::json::parse(config); }

nlohmann::json ResolvedScheduler::record() const {
    return {{"class", kind->diffusers_class}, {"name", kind->name}, {"config", json()}};
}

std::string resolve_scheduler(const nlohmann::json& model_config, const SchedulerChoice& choice,
                              const SchedulerOverrides& overrides, ResolvedScheduler& out) {
    const std::string own_class =
        model_config.value("_class_name", std::string("FlowMatchEulerDiscreteScheduler"));
    const SchedulerKind* kind =
        choice.name.empty() ? kind_of_class(own_class) : find_scheduler_kind(choice.name);
    if (!kind)
        return "_class_name '" + own_class.substr(0, 60) +
               "' is not supported: dp-launch runs the flow-matching "
               "schedulers (" +
               scheduler_names() + ")";
    const SchedulerKind& cls = *kind;
    nlohmann::json c = class_defaults(cls);
    if (std::string why = merge_keys(cls, model_config, false, c, "the model's scheduler_config.json");
        !why.empty())
        return why;
    if (choice.config.empty() && (cls.diffusers_class == std::string("DPMSolverMultistepScheduler") ||
                                  cls.diffusers_class == std::string("UniPCMultistepScheduler"))) {
        c["use_flow_sigmas"] = true;
        c["prediction_type"] = "flow_prediction";
        c["flow_shift"] = model_config.value("shift", 1.0);
        if (kind->name == std::string("dpm++-2m-sde")) c["algorithm_type"] = "sde-dpmsolver++";
    }
    if (!choice.config.empty())
        if (std::string why = merge_keys(cls, nlohmann::json::parse(choice.config), false, c, "scheduler");
            !why.empty())
            return why;
    if (!overrides.empty())
        if (std::string why =
                merge_keys(cls, nlohmann::json::parse(overrides.json), true, c, "scheduler_config");
            !why.empty())
            return why;
    if (std::string why = kind_problem(cls, c); !why.empty())
        return choice.name.empty() ? why : std::string(kind->name) + ": " + why;
    out.kind = kind;
    out.config = c.dump();
    return {};
}

namespace {

// Why `values` (named `what`) are not strictly decreasing finite numbers in (low, high], or empty.
std::string list_problem(const std::vector<double>& values, const char* what, double low, double high) {
    for (std::size_t i = 0; i < values.size(); ++i) {
        const double v = values[i];
        if (!std::isfinite(v) || v <= low || v > high)
            return std::string(what) + "[" + std::to_string(i) + "] " + number_text(v) +
                   ": each must be above " + number_text(low) + " and at most " + number_text(high);
        if (i > 0 && v >= values[i - 1])
            return std::string(what) + " must decrease: " + what + "[" + std::to_string(i) + "] " +
                   number_text(v) + " is not below " + what + "[" + std::to_string(i - 1) + "] " +
                   number_text(values[i - 1]);
    }
    return {};
}

}  // namespace

std::string schedule_problem(const ResolvedScheduler& s, int steps, const std::vector<double>& sigmas,
                             const std::vector<double>& timesteps) {
    const nlohmann::json c = s.json();
    const std::string name = s.kind->name;
    if (!sigmas.empty() && !s.kind->takes_sigmas)
        return "sigmas: " + name + " (" + s.kind->diffusers_class +
               ") takes no sigmas; it builds its own schedule (use euler, lcm or unipc for explicit sigmas)";
    if (!timesteps.empty() && !s.kind->takes_timesteps)
        return "timesteps: " + name + " takes no timesteps (use euler or lcm)";
    if (std::string why = list_problem(sigmas, "sigmas", 0, 1); !why.empty()) return why;
    const double train = c.at("num_train_timesteps").get<double>();
    if (std::string why = list_problem(timesteps, "timesteps", 0, train); !why.empty()) return why;
    for (const auto& [what, list] :
         {std::pair<const char*, const std::vector<double>*>{"sigmas", &sigmas}, {"timesteps", &timesteps}})
        if (!list->empty() && static_cast<int>(list->size()) != steps)
            return std::string(what) + ": " + std::to_string(list->size()) + " values for " +
                   std::to_string(steps) + " steps (num_inference_steps); give one per step";
    return {};
}

}  // namespace dp::protocol
