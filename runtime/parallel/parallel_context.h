#pragma once
// ParallelContext: one rank's place in the device mesh (strategies/mesh.h) and the c10d sub-groups
// it belongs to, built once per rank and handed to a pipeline when it loads. Model code asks it
// for the groups of the parallel layer (tensor, sequence, guidance); nothing else forms groups.

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "strategies/mesh.h"

namespace dp::runtime {

class Communicator;

// The ranks a token dimension is split over: Ulysses (all-to-all over heads) inside Ring (keys
// and values passed round), ring outermost. nullptr: not split that way.
struct SequenceGroups {
    Communicator* ulysses = nullptr;
    Communicator* ring = nullptr;
    int ulysses_size() const;
    int ring_size() const;
    int ulysses_rank() const;
    int ring_rank() const;
    int size() const { return ulysses_size() * ring_size(); }
    // This rank's block of the token dimension, 0 to size() - 1 (ring_rank * ulysses + ulysses_rank).
    int block() const { return ring_rank() * ulysses_size() + ulysses_rank(); }
};

// The tensor-parallel group: rank `rank` of `size` keeps that shard of the split layers.
struct TensorGroup {
    Communicator* group = nullptr;  // nullptr when size is 1
    int rank = 0;
    int size = 1;
    // This rank's share of `count` units (attention heads) and where it starts: as even as
    // possible, the first ranks one more (strategies::even_shares; Note [uneven heads]).
    int64_t share(int64_t count) const;
    int64_t share_start(int64_t count) const;
};

class ParallelContext {
  public:
    // One process alone: a mesh of one rank, no groups; it writes its outputs.
    ParallelContext();
    // Forms every sub-group of `mesh` that has more than one rank over `world` (this rank's
    // group along cfg, ring, ulysses and tp, in that order). Every rank of `world` must call it
    // with the same mesh. `world` must outlive the context.
    ParallelContext(Communicator& world, const strategies::Mesh& mesh);
    // A context over groups made elsewhere (in-process tests); `rank` is the rank in `mesh`.
    static ParallelContext from_groups(const strategies::Mesh& mesh, int rank, Communicator* cfg,
                                       Communicator* ring, Communicator* ulysses, Communicator* tp);
    ParallelContext(ParallelContext&&) noexcept;
    ParallelContext& operator=(ParallelContext&&) noexcept;
    ~ParallelContext();

    // The context of a lone process, shared by every caller that has no mesh.
    static const ParallelContext& single();

    const strategies::Mesh& mesh() const { return mesh_; }
    int rank() const { return rank_; }
    int coord(strategies::MeshDim dim) const { return coords_[static_cast<std::size_t>(dim)]; }
    // This rank's group along `dim`, or nullptr when that degree is 1.
    Communicator* group(strategies::MeshDim dim) const { return groups_[static_cast<std::size_t>(dim)]; }

    TensorGroup tensor() const;
    SequenceGroups sequence() const;
    Communicator* cfg() const { return group(strategies::MeshDim::kCfg); }
    // Whether this rank writes its replica's images and reports them (strategies::Mesh's rule).
    bool writes_outputs() const { return mesh_.writes_outputs(rank_); }
    // Which share of the prompts this rank's replica takes, of replicas().
    int replica() const { return mesh_.replica(rank_); }
    int replicas() const { return mesh_.degrees().dp; }

    // Bytes this rank sent per kind of collective, over the world group and every sub-group.
    std::map<std::string, uint64_t> bytes() const;

  private:
    strategies::Mesh mesh_;
    int rank_ = 0;
    std::array<int, strategies::kMeshDims> coords_{};
    Communicator* world_ = nullptr;
    std::array<Communicator*, strategies::kMeshDims> groups_{};
    std::array<std::unique_ptr<Communicator>, strategies::kMeshDims> owned_;
};

}  // namespace dp::runtime
