#include "runtime/parallel/parallel_context.h"

#include "runtime/parallel/communicator.h"

namespace dp::runtime {

using strategies::MeshDim;

int SequenceGroups::ulysses_size() const { return ulysses ? ulysses->size() : 1; }
int SequenceGroups::ring_size() const { return ring ? ring->size() : 1; }
int SequenceGroups::ulysses_rank() const { return ulysses ? ulysses->rank() : 0; }
int SequenceGroups::ring_rank() const { return ring ? ring->rank() : 0; }

int64_t TensorGroup::share(int64_t count) const {
    return strategies::even_shares(count, size)[static_cast<std::size_t>(rank)];
}
int64_t TensorGroup::share_start(int64_t count) const { return strategies::share_start(count, size, rank); }

ParallelContext::ParallelContext() : mesh_(1, strategies::MeshDegrees{}) {}

ParallelContext::ParallelContext(Communicator& world, const strategies::Mesh& mesh)
    : mesh_(mesh), rank_(world.rank()), coords_(mesh.coords(world.rank())), world_(&world) {
    // A group's tag: its dimension and the coordinates its members share, so that every group
    // has its own prefix in the job's store.
    for (MeshDim dim : {MeshDim::kCfg, MeshDim::kRing, MeshDim::kUlysses, MeshDim::kTp}) {
        if (mesh.degrees().of(dim) == 1) continue;
        std::string tag = std::string(strategies::mesh_dim_name(dim)) + "/";
        for (int d = 0; d < strategies::kMeshDims; ++d)
            if (d != static_cast<int>(dim)) tag += std::to_string(coords_[static_cast<std::size_t>(d)]) + ".";
        tag += "/";
        const auto i = static_cast<std::size_t>(dim);
        owned_[i] = world.subgroup(mesh.group(rank_, dim), tag);
        groups_[i] = owned_[i].get();
    }
}

ParallelContext ParallelContext::from_groups(const strategies::Mesh& mesh, int rank, Communicator* cfg,
                                             Communicator* ring, Communicator* ulysses, Communicator* tp) {
    ParallelContext c;
    c.mesh_ = mesh;
    c.rank_ = rank;
    c.coords_ = mesh.coords(rank);
    c.groups_[static_cast<std::size_t>(MeshDim::kCfg)] = cfg;
    c.groups_[static_cast<std::size_t>(MeshDim::kRing)] = ring;
    c.groups_[static_cast<std::size_t>(MeshDim::kUlysses)] = ulysses;
    c.groups_[static_cast<std::size_t>(MeshDim::kTp)] = tp;
    return c;
}

ParallelContext::ParallelContext(ParallelContext&&) noexcept = default;
ParallelContext& ParallelContext::operator=(ParallelContext&&) noexcept = default;
ParallelContext::~ParallelContext() = default;

const ParallelContext& ParallelContext::single() {
    static const ParallelContext alone;
    return alone;
}

TensorGroup ParallelContext::tensor() const {
    Communicator* tp = group(MeshDim::kTp);
    return {tp, coord(MeshDim::kTp), mesh_.degrees().tp};
}

SequenceGroups ParallelContext::sequence() const { return {group(MeshDim::kUlysses), group(MeshDim::kRing)}; }

std::map<std::string, uint64_t> ParallelContext::bytes() const {
    std::map<std::string, uint64_t> total;
    auto add = [&](const Communicator* c) {
        if (c)
            for (const auto& [kind, n] : c->bytes()) total[kind] += n;
    };
    add(world_);
    for (const Communicator* g : groups_) add(g);
    return total;
}

}  // namespace dp::runtime
