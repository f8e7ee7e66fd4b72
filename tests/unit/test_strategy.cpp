#include <doctest/doctest.h>

#include <sstream>
#include <string>
#include <vector>

#include "launcher/job.h"
#include "protocol/errors.h"
#include "strategies/mesh.h"
#include "strategies/parallel_spec.h"
#include "strategies/strategy.h"

using namespace dp::strategies;

namespace {

StrategyRequest on_world(int world) {
    StrategyRequest r;
    r.world = world;
    r.num_processes = world;
    return r;
}

// A request on `world` ranks from flags as a user writes them, e.g. "--tp 2 --cfg-parallel".
StrategyRequest request(int world, const std::string& flags) {
    StrategyRequest r = on_world(world);
    std::istringstream in(flags);
    for (std::string flag; in >> flag;) {
        if (flag == "--cfg-parallel") {
            r.cfg_parallel = true;
            continue;
        }
        std::string value;
        REQUIRE(static_cast<bool>(in >> value));
        if (flag == "--strategy")
            r.strategy = value;
        else if (flag == "--guidance-scale")
            r.guidance_scale = std::stod(value);
        else if (flag == "--ulysses")
            r.ulysses = std::stoi(value);
        else if (flag == "--ring")
            r.ring = std::stoi(value);
        else if (flag == "--tp")
            r.tp = std::stoi(value);
        else if (flag == "--dp")
            r.dp = std::stoi(value);
        else if (flag == "--device-map")
            r.device_map = value;
        else if (flag == "--max-memory")
            r.max_memory = value;
        else if (flag == "--device")
            r.device = value;
        else
            FAIL("unknown flag " << flag);
    }
    return r;
}

MeshDegrees degrees(int dp, int cfg, int ring, int ulysses, int tp) { return {dp, cfg, ring, ulysses, tp}; }

void check_degrees(const MeshDegrees& got, const MeshDegrees& want) {
    CHECK(Mesh(got.product(), got).describe() == Mesh(want.product(), want).describe());
}

}  // namespace

TEST_CASE("explicit degrees pass through with dp filled from the world") {
    const ParallelSpec& sd3 = sd3_parallel_spec();
    StrategyRequest r = on_world(8);
    check_degrees(resolve_strategy(r, sd3, 4).degrees, degrees(8, 1, 1, 1, 1));
    r.ulysses = 2;
    r.tp = 2;
    check_degrees(resolve_strategy(r, sd3, 4).degrees, degrees(2, 1, 1, 2, 2));
    r = on_world(8);
    r.cfg_parallel = true;
    r.ring = 2;
    check_degrees(resolve_strategy(r, sd3, 4).degrees, degrees(2, 2, 2, 1, 1));
    r.dp = 2;
    check_degrees(resolve_strategy(r, sd3, 4).degrees, degrees(2, 2, 2, 1, 1));
    // Unknown heads (0) skip the head checks.
    r = on_world(3);
    r.tp = 3;
    check_degrees(resolve_strategy(r, sd3, 0).degrees, degrees(1, 1, 1, 1, 3));
    CHECK(resolve_strategy(r, sd3, 0).device_map.empty());
}

TEST_CASE("--strategy context is Ulysses where the heads divide by the ranks, else Ring") {
    const ParallelSpec& sd3 = sd3_parallel_spec();
    struct Case {
        int world;
        bool cfg;
        int heads;
        MeshDegrees want;
    };
    for (const Case& c : std::vector<Case>{{2, false, 4, degrees(1, 1, 1, 2, 1)},
                                           {3, false, 4, degrees(1, 1, 3, 1, 1)},
                                           {4, false, 4, degrees(1, 1, 1, 4, 1)},
                                           {8, false, 4, degrees(1, 1, 8, 1, 1)},
                                           {4, true, 4, degrees(1, 2, 1, 2, 1)},
                                           {6, true, 4, degrees(1, 2, 3, 1, 1)},
                                           {6, false, 24, degrees(1, 1, 1, 6, 1)},
                                           {5, false, 0, degrees(1, 1, 5, 1, 1)},
                                           {1, false, 4, degrees(1, 1, 1, 1, 1)}}) {
        CAPTURE(c.world);
        CAPTURE(c.cfg);
        CAPTURE(c.heads);
        StrategyRequest r = on_world(c.world);
        r.strategy = "context";
        r.cfg_parallel = c.cfg;
        check_degrees(resolve_strategy(r, sd3, c.heads).degrees, c.want);
    }
}

TEST_CASE("--strategy tensor is tp over the ranks, device-map is device_map auto, data changes nothing") {
    const ParallelSpec& sd3 = sd3_parallel_spec();
    StrategyRequest r = on_world(4);
    r.strategy = "tensor";
    check_degrees(resolve_strategy(r, sd3, 4).degrees, degrees(1, 1, 1, 1, 4));
    r.cfg_parallel = true;
    check_degrees(resolve_strategy(r, sd3, 4).degrees, degrees(1, 2, 1, 1, 2));
    r = on_world(1);
    r.strategy = "device-map";
    ResolvedStrategy dm = resolve_strategy(r, sd3, 4);
    CHECK(dm.device_map == "auto");
    check_degrees(dm.degrees, degrees(1, 1, 1, 1, 1));
    r.device_map = "balanced";  // a device map the user chose stays
    CHECK(resolve_strategy(r, sd3, 4).device_map == "balanced");
    r = on_world(4);
    r.strategy = "data";
    check_degrees(resolve_strategy(r, sd3, 4).degrees, degrees(4, 1, 1, 1, 1));
    r = on_world(1);
    r.device_map = "auto";
    r.max_memory = "cpu:0=1GB,cpu:1=1GB";
    r.device = "cpu";
    CHECK(resolve_strategy(r, sd3, 4).device_map == "auto");
}

TEST_CASE("every refusal is a usage error (exit 2) that names the flags and what would fit") {
    const std::string two_devices = "--device-map auto --max-memory cpu:0=1GB,cpu:1=1GB";
    struct Case {
        int world;
        std::string flags;
        int heads;
        std::string message;
    };
    for (
        const Case& c : std::vector<Case>{
            {3, "--cfg-parallel", 4,
             "--cfg-parallel: the world has 3 ranks; CFG parallelism pairs them, so it needs an even number "
             "(try -n 4)"},
            {1, "--cfg-parallel --device-map auto", 4,
             "--cfg-parallel: the world has 1 ranks; CFG parallelism pairs them, so it needs an even number "
             "(try -n 2)"},
            {2, "--cfg-parallel --guidance-scale 1", 4,
             "--cfg-parallel with --guidance-scale 1.00: there is no guidance to split at a scale of 1 or "
             "less"},
            {2, "--cfg-parallel --guidance-scale 0.5", 4,
             "--cfg-parallel with --guidance-scale 0.50: there is no guidance to split at a scale of 1 or "
             "less"},
            {3, "--ulysses 3", 4,
             "--tp 1 x --ulysses 3: the model has 4 attention heads; tp x ulysses must divide 4 (try 1, 2, "
             "4)"},
            {3, "--tp 3", 4,
             "--tp 3 x --ulysses 1: the model has 4 attention heads; tp x ulysses must divide 4 (try 1, 2, "
             "4)"},
            {8, "--tp 2 --ulysses 4", 12,
             "--tp 2 x --ulysses 4: the model has 12 attention heads; tp x ulysses must divide 12 (try 1, 2, "
             "3, 4, 6, 12)"},
            {3, "--strategy tensor", 4,
             "--tp 3 x --ulysses 1: the model has 4 attention heads; tp x ulysses must divide 4 (try 1, 2, "
             "4)"},
            {2, "--ulysses 4", 4,
             "--tp 1, --ring 1, --ulysses 4: the world has 2 ranks, which does not divide by 4 (world = dp x "
             "cfg x ring x ulysses x tp)"},
            {6, "--cfg-parallel --ring 2", 4,
             "--tp 1, --ring 2, --ulysses 1, --cfg-parallel: the world has 6 ranks, which does not divide by "
             "4 "
             "(world = dp x cfg x ring x ulysses x tp)"},
            {4, "--ulysses 2 --dp 3", 4,
             "--dp 3: dp x cfg x ring x ulysses x tp = 6 but the world has 4 ranks (--dp 2 would fit)"},
            {4, "--tp 2 --dp 1", 4,
             "--dp 1: dp x cfg x ring x ulysses x tp = 2 but the world has 4 ranks (--dp 2 would fit)"},
            {2, "--strategy context --tp 2", 4,
             "--strategy context chooses the degrees itself; give either --strategy or "
             "--ulysses/--ring/--tp"},
            {2, "--strategy tensor --ring 2", 4,
             "--strategy tensor chooses the degrees itself; give either --strategy or --ulysses/--ring/--tp"},
            {2, "--strategy sideways", 4,
             "--strategy 'sideways': expected one of data, context, tensor, device-map"},
            {2, "--strategy device-map", 4,
             "--device-map runs one process over several devices, but the world has 2 ranks; use -n 1 (or, "
             "for "
             "one process per GPU, drop --device-map)"},
            {2, "--device-map auto", 4,
             "--device-map runs one process over several devices, but the world has 2 ranks; use -n 1 (or, "
             "for "
             "one process per GPU, drop --device-map)"},
            {1, "--device-map auto --tp 2", 4,
             "--device-map does not combine with --cfg-parallel, --ring, --ulysses or --tp"},
            {1, "--device-map balanced --ring 2", 4,
             "--device-map does not combine with --cfg-parallel, --ring, --ulysses or --tp"},
            {1, "--max-memory cpu:0=1GB,cpu:1=1GB", 4,
             "--max-memory sets device_map's budgets; add --device-map balanced or auto"},
            {1, "--device cpu --device-map auto --max-memory cuda:0=1GB,cuda:1=1GB", 4,
             "--device cpu with --max-memory naming GPUs: name CPU devices (cpu:0=1GB,cpu:1=1GB) or drop "
             "--device cpu"}}) {
        CAPTURE(c.flags);
        bool refused = false;
        try {
            resolve_strategy(request(c.world, c.flags), sd3_parallel_spec(), c.heads);
        } catch (const dp::protocol::UsageError& e) {
            refused = true;
            CHECK(std::string(e.what()) == c.message);
            CHECK(e.exit_code() == 2);
        }
        CHECK_MESSAGE(refused, "accepted");
    }
    // The same flags on a world they fit are accepted.
    CHECK_NOTHROW(resolve_strategy(request(1, two_devices + " --device cpu"), sd3_parallel_spec(), 4));
    CHECK_NOTHROW(resolve_strategy(request(8, "--tp 2 --ulysses 4"), sd3_parallel_spec(), 24));
    CHECK_NOTHROW(
        resolve_strategy(request(4, "--cfg-parallel --guidance-scale 1.01"), sd3_parallel_spec(), 4));
}

TEST_CASE("a family without a negative guidance branch refuses --cfg-parallel, and runs without it") {
    ParallelSpec unguided = sd3_parallel_spec();
    unguided.pipeline_class = "FluxPipeline";
    unguided.guidance_branches = false;
    StrategyRequest r = on_world(2);
    r.cfg_parallel = true;
    CHECK_THROWS_WITH_AS(resolve_strategy(r, unguided, 4),
                         "--cfg-parallel: FluxPipeline has no negative guidance branch to split; drop "
                         "--cfg-parallel",
                         dp::protocol::UsageError);
    r.cfg_parallel = false;
    check_degrees(resolve_strategy(r, unguided, 4).degrees, degrees(2, 1, 1, 1, 1));
    check_degrees(resolve_strategy(on_world(2), sd3_parallel_spec(), 4).degrees, degrees(2, 1, 1, 1, 1));
}

// Over every small request: what is accepted is a mesh of the world whose heads split evenly and
// whose dp is the one asked for; what is refused is a usage error.
TEST_CASE("every accepted request is a mesh of the world, and every refusal a usage error") {
    const ParallelSpec& sd3 = sd3_parallel_spec();
    int accepted = 0, refused = 0;
    for (int world = 1; world <= 12; ++world)
        for (const char* strategy : {"", "context", "tensor", "device-map"})
            for (int cfg = 0; cfg < 2; ++cfg)
                for (int ulysses : {1, 2, 3})
                    for (int ring : {1, 2, 4})
                        for (int tp : {1, 2, 3})
                            for (int dp : {0, 1, 2})
                                for (int heads : {0, 4, 6}) {
                                    StrategyRequest r = on_world(world);
                                    r.strategy = strategy;
                                    r.cfg_parallel = cfg == 1;
                                    r.ulysses = ulysses;
                                    r.ring = ring;
                                    r.tp = tp;
                                    r.dp = dp;
                                    ResolvedStrategy out;
                                    try {
                                        out = resolve_strategy(r, sd3, heads);
                                    } catch (const dp::protocol::UsageError&) {
                                        ++refused;
                                        continue;
                                    }
                                    ++accepted;
                                    const MeshDegrees& d = out.degrees;
                                    REQUIRE(d.product() == world);
                                    CHECK_NOTHROW(Mesh(world, d));
                                    CHECK(d.cfg == (cfg ? 2 : 1));
                                    if (heads > 0) CHECK(heads % (d.tp * d.ulysses) == 0);
                                    if (dp > 0) CHECK(d.dp == dp);
                                    if (*strategy == '\0') {
                                        CHECK(d.ulysses == ulysses);
                                        CHECK(d.ring == ring);
                                        CHECK(d.tp == tp);
                                    } else {
                                        CHECK(d.replica_size() * d.dp == world);
                                        CHECK(out.device_map ==
                                              (std::string(strategy) == "device-map" ? "auto" : ""));
                                    }
                                }
    CHECK(accepted > 100);
    CHECK(refused > 100);
}

TEST_CASE("the launcher resolves with the model's own spec and heads") {
    const std::string model = dp::launcher::resolve_model("tiny-random-sd3", "--model");
    dp::launcher::LaunchSpec launch;
    dp::launcher::JobOptions job;
    job.model = model;
    job.strategy = "context";
    launch.num_processes = 3;  // 4 heads: no 3-way Ulysses
    dp::launcher::JobOptions resolved = dp::launcher::resolve_strategy(launch, job);
    CHECK(resolved.ring == 3);
    CHECK(resolved.ulysses == 1);
    CHECK(resolved.dp == 1);
    launch.num_processes = 4;
    const ResolvedStrategy r = dp::launcher::resolve_job_strategy(launch, job);
    check_degrees(r.degrees, degrees(1, 1, 1, 4, 1));
    job.strategy.clear();
    job.tp = 3;
    launch.num_processes = 3;
    CHECK_THROWS_WITH_AS(dp::launcher::resolve_strategy(launch, job),
                         doctest::Contains("the model has 4 attention heads"), dp::protocol::UsageError);
}
