#pragma once
// Note [a job is resolved once]: torchrun resolves its arguments into a config once
// (config_from_args) and launches from that. The main job does the same: resolve_job reads the
// model folder once (strategies::read_model_info) and resolves the options against it and the
// world: the strategy's degrees (dp included) and device map, device_map's plan where it can be
// made here, the precision, the components loaded. run_job, `dp-launch plan` and the model check
// then only read the result; the options stay as the user gave them, so that "what was asked"
// and "what it became" are never the same variable. What a job admits beyond that (its adapter
// and component files, the memory its ranks need, the prompt file) is checked by run_job after
// the job's own refusals, and reported by plan, each in its order.

#include <optional>
#include <string>
#include <vector>

#include "launcher/job_options.h"
#include "launcher/launch_spec.h"
#include "strategies/device_map.h"
#include "strategies/mesh.h"
#include "strategies/model_config.h"
#include "strategies/strategy.h"

namespace dp::launcher {

struct ResolvedJob {
    JobOptions options;                     // as given; never rewritten with what was resolved
    strategies::ModelInfo model;            // read once (Note [a model is read once])
    strategies::ResolvedStrategy strategy;  // degrees, device map and its plan, notes
    std::string dtype;                      // expected_dtype's: what the ranks are expected to run in
    std::vector<std::string> left_out;      // components the job does not load (components_left_out)

    const strategies::MeshDegrees& degrees() const { return strategy.degrees; }
    // --device-map's, or "auto" from --strategy device-map; empty: none.
    const std::string& device_map() const { return strategy.device_map; }
};

// `options` resolved on `launch`'s world: the model read once, strategies::resolve_strategy with
// its family spec and heads, then device_map's plan when its budgets are known without a GPU (a
// FILE.json, or --max-memory): every refusal of the strategy before anything starts. Throws
// UsageError (degrees, a device map that cannot work), or ModelError when the model folder's
// configs cannot be read or its pipeline is not supported.
ResolvedJob resolve_job(const LaunchSpec& launch, const JobOptions& options);

}  // namespace dp::launcher
