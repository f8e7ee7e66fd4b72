#include "strategies/strategy.h"

#include "protocol/errors.h"

namespace dp::strategies {
namespace {

using protocol::UsageError;

std::string divisors(int n) {
    std::string out;
    for (int d = 1; d <= n; ++d)
        if (n % d == 0) out += (out.empty() ? "" : ", ") + std::to_string(d);
    return out;
}

void check_cfg_parallel(const StrategyRequest& r, const ParallelSpec& spec) {
    if (!r.cfg_parallel) return;
    if (!spec.guidance_branches)
        throw UsageError("--cfg-parallel: " + spec.pipeline_class +
                         " has no negative guidance branch to split; drop --cfg-parallel");
    if (r.world % 2 != 0)
        throw UsageError("--cfg-parallel: the world has " + std::to_string(r.world) +
                         " ranks; CFG parallelism pairs them, so it needs an even number (try -n " +
                         std::to_string(r.num_processes + 1) + ")");
    if (r.guidance_scale <= 1.0)
        throw UsageError("--cfg-parallel with --guidance-scale " +
                         std::to_string(r.guidance_scale).substr(0, 4) +
                         ": there is no guidance to split at a scale of 1 or less");
}

// --strategy's degrees, filled into `d` (cfg already set) from the ranks the world leaves.
void apply_named_strategy(const StrategyRequest& r, int heads, MeshDegrees& d, std::string& device_map) {
    if (r.strategy.empty() || r.strategy == "data") return;
    if (r.strategy != "context" && r.strategy != "tensor" && r.strategy != "device-map")
        throw UsageError("--strategy '" + r.strategy +
                         "': expected one of data, context, tensor, device-map");
    if (r.ring > 1 || r.ulysses > 1 || r.tp > 1)
        throw UsageError("--strategy " + r.strategy +
                         " chooses the degrees itself; give either --strategy or --ulysses/--ring/--tp");
    if (r.world % d.cfg != 0)
        throw UsageError("--strategy " + r.strategy + " with --cfg-parallel needs an even world, not " +
                         std::to_string(r.world));
    const int ranks = r.world / d.cfg;
    if (r.strategy == "context") {
        // Ulysses where the heads allow it (less traffic), else Ring (any degree).
        if (heads > 0 && heads % ranks == 0)
            d.ulysses = ranks;
        else
            d.ring = ranks;
    } else if (r.strategy == "tensor") {
        d.tp = ranks;
    } else if (device_map.empty()) {
        device_map = "auto";
    }
}

void check_device_map(const StrategyRequest& r, const MeshDegrees& d, const std::string& device_map) {
    if (!r.max_memory.empty() && device_map.empty())
        throw UsageError("--max-memory sets device_map's budgets; add --device-map balanced or auto");
    if (device_map.empty()) return;
    if (r.world != 1)
        throw UsageError("--device-map runs one process over several devices, but the world has " +
                         std::to_string(r.world) +
                         " ranks; use -n 1 (or, for one process per GPU, drop --device-map)");
    if (d.replica_size() > 1)
        throw UsageError("--device-map does not combine with --cfg-parallel, --ring, --ulysses or --tp");
    if (r.device == "cpu" && r.max_memory.find("cuda") != std::string::npos)
        throw UsageError(
            "--device cpu with --max-memory naming GPUs: name CPU devices (cpu:0=1GB,"
            "cpu:1=1GB) or drop --device cpu");
}

}  // namespace

ResolvedStrategy resolve_strategy(const StrategyRequest& r, const ParallelSpec& spec, int heads) {
    check_cfg_parallel(r, spec);
    ResolvedStrategy out;
    MeshDegrees& d = out.degrees;
    d.cfg = r.cfg_parallel ? 2 : 1;
    d.ring = r.ring;
    d.ulysses = r.ulysses;
    d.tp = r.tp;
    out.device_map = r.device_map;
    apply_named_strategy(r, heads, d, out.device_map);
    check_device_map(r, d, out.device_map);
    const int replica = d.replica_size();
    if (r.world % replica != 0)
        throw UsageError("--tp " + std::to_string(d.tp) + ", --ring " + std::to_string(d.ring) +
                         ", --ulysses " + std::to_string(d.ulysses) +
                         (r.cfg_parallel ? ", --cfg-parallel" : "") + ": the world has " +
                         std::to_string(r.world) + " ranks, which does not divide by " +
                         std::to_string(replica) + " (world = dp x cfg x ring x ulysses x tp)");
    if (r.dp > 0 && r.dp * replica != r.world)
        throw UsageError("--dp " + std::to_string(r.dp) + ": dp x cfg x ring x ulysses x tp = " +
                         std::to_string(r.dp * replica) + " but the world has " + std::to_string(r.world) +
                         " ranks (--dp " + std::to_string(r.world / replica) + " would fit)");
    // Heads are split over tp x ulysses ranks: checked before any model is loaded.
    if (heads > 0 && heads % (d.tp * d.ulysses) != 0)
        throw UsageError("--tp " + std::to_string(d.tp) + " x --ulysses " + std::to_string(d.ulysses) +
                         ": the model has " + std::to_string(heads) +
                         " attention heads; tp x ulysses must divide " + std::to_string(heads) + " (try " +
                         divisors(heads) + ")");
    d.dp = r.world / replica;
    return out;
}

}  // namespace dp::strategies
