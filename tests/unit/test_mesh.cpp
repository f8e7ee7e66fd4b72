#include <doctest/doctest.h>

#include <set>
#include <stdexcept>

#include "strategies/mesh.h"

using namespace dp::strategies;

TEST_CASE("tp is innermost, dp outermost, and every rank has one place") {
    MeshDegrees d;
    d.dp = 2;
    d.cfg = 2;
    d.ulysses = 2;
    d.tp = 2;
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
