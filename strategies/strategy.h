#pragma once
// Strategy resolution: from what the user asked (--strategy, --cfg-parallel, --ulysses, --ring,
// --tp, --dp, --device-map) to the mesh degrees of the world, checked against the model's spec
// and heads. A pure function (no files, no processes): the launcher, `dp-launch plan` and the
// worker resolve with it, so that they agree.

#include <string>

#include <optional>

#include "strategies/device_map.h"
#include "strategies/mesh.h"
#include "strategies/parallel_spec.h"

namespace dp::strategies {

// What the user asked for, as the job's options hold it.
struct StrategyRequest {
    int world = 1;          // ranks in the job
    int num_processes = 1;  // processes per node, for the "try -n N" hint
    std::string strategy;   // "" or data, context, tensor, device-map: fills the degrees from the world
    bool cfg_parallel = false;
    double guidance_scale = 7.0;
    int ulysses = 1, ring = 1, tp = 1;
    int dp = 0;              // 0: whatever the world leaves; else it must be exactly that
    std::string device_map;  // balanced, auto or a FILE.json; empty: none
    std::string max_memory;  // device_map's budgets, "DEV=SIZE,..."
    std::string device = "auto";
};

struct ResolvedStrategy {
    MeshDegrees degrees;     // dp filled: degrees.product() == world
    std::string device_map;  // the request's, or "auto" from --strategy device-map
    // device_map's plan when its budgets are known before the job starts (a FILE.json or
    // --max-memory); nullopt without device_map, or when the worker measures its GPUs. Filled by
    // the caller that reads the model's sizes (resolve_strategy itself reads no file).
    std::optional<DeviceMapPlan> device_map_plan;
};

// Applies --strategy (context: Ulysses where `heads` divide by the ranks, else Ring; tensor: tp
// over the world; device-map: device_map auto) and checks the degrees against the world, the
// spec (a family without a negative guidance branch refuses --cfg-parallel) and `heads` (the
// transformer's attention heads; 0 when unknown skips the head checks). Throws
// protocol::UsageError naming the flags and what would fit. Does not plan the device map: its
// budgets and sizes are files (plan_device_map_spec).
ResolvedStrategy resolve_strategy(const StrategyRequest& request, const ParallelSpec& spec, int heads);

}  // namespace dp::strategies
