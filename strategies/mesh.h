#pragma once
// The device mesh: world = dp x cfg x ring x ulysses x tp, with tp innermost so that adjacent
// ranks (same node, fastest links) carry the heaviest traffic, then ulysses, ring, cfg, and dp
// outermost. A pure description, no LibTorch: `dp-launch plan` prints it and the worker builds
// its c10d sub-groups from it.

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "protocol/job_layout.h"

namespace dp::strategies {

enum class MeshDim { kDp = 0, kCfg = 1, kRing = 2, kUlysses = 3, kTp = 4 };
inline constexpr int kMeshDims = 5;
const char* mesh_dim_name(MeshDim dim);

// The degrees, defined once in the protocol the job file carries them in.
using MeshDegrees = protocol::MeshDegrees;

// `count` units (attention heads, blocks of features) over `parts` ranks as evenly as possible,
// the first ranks taking one more: 38 heads over 4 ranks are {10, 10, 9, 9}. Throws
// std::invalid_argument unless parts >= 1 and count >= 0.
std::vector<int64_t> even_shares(int64_t count, int parts);
// Where share `index` of even_shares(count, parts) starts: the units before it.
int64_t share_start(int64_t count, int parts, int index);

class Mesh {
  public:
    // Throws std::invalid_argument (naming the degrees) unless their product is `world`.
    Mesh(int world, MeshDegrees degrees);

    int world() const { return world_; }
    const MeshDegrees& degrees() const { return degrees_; }
    // The rank's index along each dimension.
    std::array<int, kMeshDims> coords(int rank) const;
    int rank_of(const std::array<int, kMeshDims>& coords) const;
    // The ranks that share every coordinate with `rank` except `dim`, in order along `dim`: the
    // sub-group `rank` belongs to for that dimension.
    std::vector<int> group(int rank, MeshDim dim) const;
    // The rank's model replica, 0 to dp - 1: which share of the prompts it takes.
    int replica(int rank) const;
    // Whether `rank` writes its replica's images and reports them: the replica's first rank.
    bool writes_outputs(int rank) const;
    // Every distinct group along `dim`.
    std::vector<std::vector<int>> groups(MeshDim dim) const;
    // "dp=2 cfg=2 ..." for messages and plans.
    std::string describe() const;

  private:
    int world_;
    MeshDegrees degrees_;
};

}  // namespace dp::strategies
