#include <doctest/doctest.h>

#include <array>
#include <set>
#include <stdexcept>
#include <vector>

#include "strategies/mesh.h"

using namespace dp::strategies;

TEST_CASE("tp is innermost, dp outermost, and every rank has one place") {
    const MeshDegrees d{/*dp=*/2, /*cfg=*/2, /*ring=*/1, /*ulysses=*/2, /*tp=*/2};
    const Mesh mesh(16, d);
    CHECK(mesh.group(0, MeshDim::kTp) == std::vector<int>{0, 1});  // adjacent ranks
    CHECK(mesh.group(0, MeshDim::kUlysses) == std::vector<int>{0, 2});
    CHECK(mesh.group(0, MeshDim::kCfg) == std::vector<int>{0, 4});
    CHECK(mesh.group(0, MeshDim::kDp) == std::vector<int>{0, 8});
    CHECK(mesh.group(5, MeshDim::kCfg) == std::vector<int>{1, 5});
    std::set<std::array<int, kMeshDims>> places;
    for (int r = 0; r < 16; ++r) {
        CHECK(mesh.rank_of(mesh.coords(r)) == r);
        places.insert(mesh.coords(r));
    }
    CHECK(places.size() == 16);
    // The groups of a dimension partition the world.
    for (int dim = 0; dim < kMeshDims; ++dim) {
        std::set<int> covered;
        for (const auto& g : mesh.groups(static_cast<MeshDim>(dim)))
            for (int r : g) CHECK(covered.insert(r).second);
        CHECK(covered.size() == 16);
    }
    CHECK(mesh.describe() == "dp=2 cfg=2 ring=1 ulysses=2 tp=2");
}

TEST_CASE("degrees that do not multiply to the world are refused by name") {
    MeshDegrees d;
    d.tp = 3;
    CHECK_THROWS_WITH_AS(Mesh(4, d), doctest::Contains("multiply to 3 but the world has 4 ranks"),
                         std::invalid_argument);
    d.tp = 0;
    CHECK_THROWS_AS(Mesh(4, d), std::invalid_argument);
}

TEST_CASE("a rank's replica is its dp coordinate, and only the replica's first rank writes") {
    for (const auto& [dp, cfg, ring, ulysses, tp] : std::vector<std::array<int, 5>>{{1, 1, 1, 1, 1},
                                                                                    {4, 1, 1, 1, 1},
                                                                                    {1, 2, 1, 1, 1},
                                                                                    {2, 2, 1, 1, 1},
                                                                                    {3, 1, 2, 1, 1},
                                                                                    {2, 1, 1, 2, 2},
                                                                                    {1, 2, 2, 2, 1},
                                                                                    {2, 2, 2, 2, 2},
                                                                                    {3, 1, 1, 1, 3}}) {
        const MeshDegrees d{dp, cfg, ring, ulysses, tp};
        const Mesh mesh(d.product(), d);
        CAPTURE(mesh.describe());
        CHECK(d.replica_size() * d.dp == d.product());
        std::vector<int> writers, size_of(static_cast<std::size_t>(dp), 0);
        for (int r = 0; r < mesh.world(); ++r) {
            const auto c = mesh.coords(r);
            CHECK(mesh.replica(r) == c[static_cast<std::size_t>(MeshDim::kDp)]);
            const bool first = c[1] == 0 && c[2] == 0 && c[3] == 0 && c[4] == 0;
            CHECK(mesh.writes_outputs(r) == first);
            if (mesh.writes_outputs(r)) writers.push_back(r);
            ++size_of[static_cast<std::size_t>(mesh.replica(r))];
            // Every rank of a replica shares its dp group position: the writer is in its dp group.
            CHECK(mesh.group(r, MeshDim::kDp)[static_cast<std::size_t>(mesh.replica(r))] == r);
        }
        // One writer per replica, the replica's lowest rank; every replica has replica_size ranks.
        REQUIRE(writers.size() == static_cast<std::size_t>(dp));
        for (int i = 0; i < dp; ++i) {
            CHECK(mesh.replica(writers[static_cast<std::size_t>(i)]) == i);
            CHECK(writers[static_cast<std::size_t>(i)] == i * d.replica_size());
            CHECK(size_of[static_cast<std::size_t>(i)] == d.replica_size());
        }
    }
}
