#pragma once
// Note [one scheduler table]: the samplers a prompt may choose (its `scheduler`, `scheduler_config`,
// `sigmas` and `timesteps` call arguments), each one of diffusers' 0.42.1 flow-matching schedulers
// under a short name, with what its set_timesteps takes and the config keys its class has. A
// request's scheduler is resolved as diffusers' from_config makes one: the class's defaults, the
// model's scheduler_config.json keys the class has, the name's own defaults (DPM-Solver++ and UniPC
// on flow sigmas at the model's shift), then the line's file and overrides. The launcher resolves
// and checks it before any rank starts (an unknown name or key, a value the loop does not run, a
// sigma list that is not decreasing or of the wrong length: the line is refused); the ranks build
// the same resolution into their scheduler (runtime/pipeline/schedulers.h); the manifest records it.
// std and nlohmann/json only (json_fwd here).

#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dp::protocol {

struct SchedulerKind {
    const char* name;             // "euler": what a line gives
    const char* diffusers_class;  // "FlowMatchEulerDiscreteScheduler" (also accepted as a name)
    const char* aliases;          // other names, comma-separated ("dpmpp_2m,dpm++2m")
    bool takes_sigmas, takes_timesteps, takes_mu;  // set_timesteps' parameters
    int order;                                     // model calls per step (Heun: 2)
    const char* help;
};

// Every kind, in the order help and messages list them.
const std::vector<SchedulerKind>& scheduler_kinds();
// The kind `name` names (its name, an alias or its diffusers class), or nullptr.
const SchedulerKind* find_scheduler_kind(std::string_view name);
// "euler, heun, lcm, dpm++-2m, dpm++-2m-sde, unipc".
std::string scheduler_names();

// A prompt's `scheduler`: a kind's name, or what a scheduler_config.json file gave (its class's
// kind and its keys). Empty: the model's own (its scheduler_config.json).
struct SchedulerChoice {
    std::string name;    // the kind's name; empty: the model's own
    std::string config;  // the file's keys as a JSON object's text (sorted), or empty
    bool empty() const { return name.empty() && config.empty(); }
    bool operator==(const SchedulerChoice& o) const { return name == o.name && config == o.config; }
    bool operator!=(const SchedulerChoice& o) const { return !(*this == o); }
};

// A prompt's `scheduler_config`: overrides, diffusers' keys, as a JSON object's text (sorted); empty: none.
struct SchedulerOverrides {
    std::string json;
    bool empty() const { return json.empty(); }
    bool operator==(const SchedulerOverrides& o) const { return json == o.json; }
    bool operator!=(const SchedulerOverrides& o) const { return !(*this == o); }
};

// `text` as a choice: a kind's name, or the path of a diffusers scheduler_config.json (read here,
// relative to the working directory). An error text saying what is accepted, or empty.
std::string parse_scheduler_choice(const std::string& text, SchedulerChoice& out);
// A JSON value as a choice: a name or path (string), or {"name": ..., "config": {...}} as the job
// file and the manifest write it.
std::string read_scheduler_choice(const nlohmann::json& j, SchedulerChoice& out);
nlohmann::json scheduler_choice_json(const SchedulerChoice& choice);
// A JSON object of overrides; null or {} is none.
std::string read_scheduler_overrides(const nlohmann::json& j, SchedulerOverrides& out);

// The scheduler a request runs: its kind and whole config, as diffusers' from_config makes it.
struct ResolvedScheduler {
    const SchedulerKind* kind = nullptr;
    std::string config;  // every key of the kind's class, a JSON object's text (sorted)
    // The config parsed.
    nlohmann::json json() const;
    // {"class": ..., "config": {...}}: what the manifest records.
    nlohmann::json record() const;
};

// The resolution of Note [one scheduler table] from the model's scheduler_config.json (parsed), the
// choice and the overrides; an error text (an unknown key, a value of the wrong type, one the loop
// does not run, with what is accepted), or empty.
std::string resolve_scheduler(const nlohmann::json& model_config, const SchedulerChoice& choice,
                              const SchedulerOverrides& overrides, ResolvedScheduler& out);

// Why `sigmas` and `timesteps` (empty: none) cannot go to `scheduler` for `steps` steps (not
// finite, not decreasing, out of range, of another length, or a kind whose set_timesteps takes
// none), or empty.
std::string schedule_problem(const ResolvedScheduler& scheduler, int steps, const std::vector<double>& sigmas,
                             const std::vector<double>& timesteps);

}  // namespace dp::protocol
