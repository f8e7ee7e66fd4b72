#pragma once
// Where a job's ranks and weights go, as the launcher plans it and the worker follows it: the
// mesh's degrees and device_map's plan. Defined once, here in the contract both sides share;
// strategies/ plans them (mesh.h, device_map.h), the job file carries them (job_file.h). std only.

#include <cstdint>
#include <string>
#include <vector>

namespace dp::protocol {

// The device mesh's degrees, in the mesh's order (dp outermost, tp innermost; strategies/mesh.h);
// their product is the world size. The launcher resolves them, the job file carries them, the
// worker builds its groups from them: one struct on both sides.
struct MeshDegrees {
    int dp = 1, cfg = 1, ring = 1, ulysses = 1, tp = 1;
    int product() const { return dp * cfg * ring * ulysses * tp; }
    // The ranks of one model replica: they take the same prompts (cfg x ring x ulysses x tp).
    int replica_size() const { return cfg * ring * ulysses * tp; }
    // The degree of dimension `dim` (0 dp ... 4 tp, or strategies::MeshDim).
    template <typename Dim>
    int of(Dim dim) const {
        const int at = static_cast<int>(dim);
        return at == 0 ? dp : at == 1 ? cfg : at == 2 ? ring : at == 3 ? ulysses : tp;
    }
};

struct DevicePlacement {
    std::string component;  // "text_encoder", "transformer", ...
    int block = -1;         // -1: the whole component; else one transformer block
    std::string device;     // one of DeviceMapPlan::devices
    int64_t bytes = 0;      // the weights placed
};

// device_map's plan (strategies/device_map.h makes it, the worker's executor follows it).
struct DeviceMapPlan {
    std::vector<DevicePlacement> placements;
    std::vector<std::string> devices;  // the budgets' devices in the order given (a file: first use)
    std::vector<int64_t> used;         // bytes placed on each of `devices` (the job file leaves it out)
};

}  // namespace dp::protocol
