#pragma once
// Strategy resolution: from what the user asked (--strategy, --cfg-parallel, --ulysses, --ring,
// --tp, --dp, --device-map) to the mesh degrees of the world, checked against the model's spec
// and heads. A pure function (no files, no processes): the launcher, `dp-launch plan` and the
// worker resolve with it, so that they agree.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "protocol/call_arguments.h"
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
    // The family's CFG scale as the job sets it (--guidance-scale for SD3, --true-cfg-scale for
    // Qwen-Image), or the model's own default; unset: the family's (protocol/call_arguments.h).
    std::optional<double> cfg_scale;
    // The model's own call arguments (its variant's: FLUX.2-klein's distilled releases ignore
    // guidance_scale, its -base ones guide); unset: the family's.
    std::optional<protocol::FamilyArguments> arguments;
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
    // What the degrees cost or why they were chosen, one sentence each, for the launcher's and
    // plan's output: heads split unevenly, --strategy context falling back to Ring or USP.
    std::vector<std::string> notes;
};

// How tp x ulysses ranks share a model's attention heads: tp shards them (even_shares), and each
// tp shard is shared again over its Ulysses group. Note [uneven heads].
struct HeadSplit {
    int64_t heads = 0;
    int tp = 1, ulysses = 1;
    std::vector<int64_t> tp_shares;  // heads per tp rank
    // Heads per attention rank of one ring position, in mesh order (ulysses outer, tp inner).
    std::vector<int64_t> per_rank;
    int64_t most() const;
    int64_t fewest() const;
    bool even() const { return most() == fewest(); }
};
// Throws std::invalid_argument when a rank would hold no head (tp x ulysses > heads).
HeadSplit head_split(int64_t heads, int tp, int ulysses);
// "--tp 4: 38 attention heads over 4 ranks: the ranks hold 10, 10, 9, 9 heads. ...": the heads each
// rank holds and, when uneven, the share of attention time the smaller ranks wait, with its
// arithmetic.
std::string describe_head_split(const HeadSplit& split);

// Applies --strategy (context: Ulysses of the largest degree dividing both `heads` and the ranks,
// Ring over the rest; tensor: tp over the world; device-map: device_map auto) and checks the
// degrees against the world, the spec (a family without a negative guidance branch refuses
// --cfg-parallel) and `heads` (the transformer's attention heads; 0 when unknown skips the head
// checks): tp x ulysses may be any degree up to the heads, uneven splits noted with their cost.
// Throws protocol::UsageError naming the flags and what would fit. Does not plan the device map:
// its budgets and sizes are files (plan_device_map_spec).
ResolvedStrategy resolve_strategy(const StrategyRequest& request, const ParallelSpec& spec, int heads);

}  // namespace dp::strategies
