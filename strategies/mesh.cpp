#include "strategies/mesh.h"

#include <algorithm>
#include <set>
#include <stdexcept>

namespace dp::strategies {

const char* mesh_dim_name(MeshDim dim) {
    static const char* names[] = {"dp", "cfg", "ring", "ulysses", "tp"};
    return names[static_cast<int>(dim)];
}

std::vector<int64_t> even_shares(int64_t count, int parts) {
    if (parts < 1 || count < 0)
        throw std::invalid_argument("cannot share " + std::to_string(count) + " units over " +
                                    std::to_string(parts) + " ranks");
    std::vector<int64_t> out(static_cast<std::size_t>(parts), count / parts);
    for (int64_t i = 0; i < count % parts; ++i) ++out[static_cast<std::size_t>(i)];
    return out;
}

int64_t share_start(int64_t count, int parts, int index) {
    if (index < 0 || index >= parts)
        throw std::invalid_argument("share " + std::to_string(index) + " of " + std::to_string(parts));
    const int64_t base = count / parts, extra = count % parts;
    return index * base + std::min<int64_t>(index, extra);
}

Mesh::Mesh(int world, MeshDegrees degrees) : world_(world), degrees_(degrees) {
    for (int d = 0; d < kMeshDims; ++d)
        if (degrees.of(static_cast<MeshDim>(d)) < 1)
            throw std::invalid_argument(std::string("mesh degree ") + mesh_dim_name(static_cast<MeshDim>(d)) +
                                        " must be at least 1");
    if (degrees.product() != world)
        throw std::invalid_argument(describe() + ": the degrees multiply to " +
                                    std::to_string(degrees.product()) + " but the world has " +
                                    std::to_string(world) + " ranks");
}

std::array<int, kMeshDims> Mesh::coords(int rank) const {
    std::array<int, kMeshDims> c{};
    for (int d = kMeshDims - 1; d >= 0; --d) {  // tp varies fastest
        const int size = degrees_.of(static_cast<MeshDim>(d));
        c[static_cast<std::size_t>(d)] = rank % size;
        rank /= size;
    }
    return c;
}

int Mesh::rank_of(const std::array<int, kMeshDims>& c) const {
    int rank = 0;
    for (int d = 0; d < kMeshDims; ++d)
        rank = rank * degrees_.of(static_cast<MeshDim>(d)) + c[static_cast<std::size_t>(d)];
    return rank;
}

std::vector<int> Mesh::group(int rank, MeshDim dim) const {
    std::array<int, kMeshDims> c = coords(rank);
    std::vector<int> out;
    for (int i = 0; i < degrees_.of(dim); ++i) {
        c[static_cast<std::size_t>(dim)] = i;
        out.push_back(rank_of(c));
    }
    return out;
}

int Mesh::replica(int rank) const { return coords(rank)[static_cast<std::size_t>(MeshDim::kDp)]; }

bool Mesh::writes_outputs(int rank) const { return rank % degrees_.replica_size() == 0; }

std::vector<std::vector<int>> Mesh::groups(MeshDim dim) const {
    std::set<std::vector<int>> seen;
    std::vector<std::vector<int>> out;
    for (int r = 0; r < world_; ++r) {
        std::vector<int> g = group(r, dim);
        if (seen.insert(g).second) out.push_back(std::move(g));
    }
    return out;
}

std::string Mesh::describe() const {
    std::string out;
    for (int d = 0; d < kMeshDims; ++d)
        out += (d ? " " : "") + std::string(mesh_dim_name(static_cast<MeshDim>(d))) + "=" +
               std::to_string(degrees_.of(static_cast<MeshDim>(d)));
    return out;
}

}  // namespace dp::strategies
