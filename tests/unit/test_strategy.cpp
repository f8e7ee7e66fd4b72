#include <doctest/doctest.h>

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "launcher/job.h"
#include "protocol/errors.h"
#include "strategies/family.h"
#include "strategies/mesh.h"
#include "strategies/model_config.h"
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
            r.cfg_scale = std::stod(value);
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
    const ParallelSpec& sd3 = family_spec("sd3");
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

TEST_CASE("--strategy context is Ulysses as far as the heads divide by the ranks, Ring over the rest") {
    const ParallelSpec& sd3 = family_spec("sd3");
    struct Case {
        int world;
        bool cfg;
        int heads;
        MeshDegrees want;
    };
    for (const Case& c : std::vector<Case>{{2, false, 4, degrees(1, 1, 1, 2, 1)},
                                           {3, false, 4, degrees(1, 1, 3, 1, 1)},
                                           {4, false, 4, degrees(1, 1, 1, 4, 1)},
                                           {8, false, 4, degrees(1, 1, 2, 4, 1)},
                                           {4, false, 6, degrees(1, 1, 2, 2, 1)},
                                           {9, false, 6, degrees(1, 1, 3, 3, 1)},
                                           {2, false, 38, degrees(1, 1, 1, 2, 1)},
                                           {4, false, 38, degrees(1, 1, 2, 2, 1)},
                                           {8, false, 38, degrees(1, 1, 4, 2, 1)},
                                           {8, true, 38, degrees(1, 2, 2, 2, 1)},
                                           {19, false, 38, degrees(1, 1, 1, 19, 1)},
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
    const ParallelSpec& sd3 = family_spec("sd3");
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
            {5, "--ulysses 5", 4,
             "--tp 1 x --ulysses 5: the model has 4 attention heads, fewer than the 5 ranks tp x ulysses "
             "splits them over, so a rank would hold none; tp x ulysses may be at most 4 (1, 2, 4 split them "
             "evenly, other degrees give some ranks one head more)"},
            {40, "--tp 40", 38,
             "--tp 40 x --ulysses 1: the model has 38 attention heads, fewer than the 40 ranks tp x ulysses "
             "splits them over, so a rank would hold none; tp x ulysses may be at most 38 (1, 2, 19, 38 "
             "split "
             "them evenly, other degrees give some ranks one head more)"},
            {8, "--tp 2 --ulysses 4", 6,
             "--tp 2 x --ulysses 4: the model has 6 attention heads, fewer than the 8 ranks tp x ulysses "
             "splits them over, so a rank would hold none; tp x ulysses may be at most 6 (1, 2, 3, 6 split "
             "them evenly, other degrees give some ranks one head more)"},
            {64, "--tp 8 --ulysses 8", 38,
             "--tp 8 x --ulysses 8: the model has 38 attention heads, fewer than the 64 ranks tp x ulysses "
             "splits them over, so a rank would hold none; tp x ulysses may be at most 38 (1, 2, 19, 38 "
             "split "
             "them evenly, other degrees give some ranks one head more)"},
            {8, "--strategy tensor", 4,
             "--tp 8 x --ulysses 1: the model has 4 attention heads, fewer than the 8 ranks tp x ulysses "
             "splits them over, so a rank would hold none; tp x ulysses may be at most 4 (1, 2, 4 split them "
             "evenly, other degrees give some ranks one head more)"},
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
            resolve_strategy(request(c.world, c.flags), family_spec("sd3"), c.heads);
        } catch (const dp::protocol::UsageError& e) {
            refused = true;
            CHECK(std::string(e.what()) == c.message);
            CHECK(e.exit_code() == 2);
        }
        CHECK_MESSAGE(refused, "accepted");
    }
    // The same flags on a world they fit are accepted.
    CHECK_NOTHROW(resolve_strategy(request(1, two_devices + " --device cpu"), family_spec("sd3"), 4));
    CHECK_NOTHROW(resolve_strategy(request(8, "--tp 2 --ulysses 4"), family_spec("sd3"), 24));
    CHECK_NOTHROW(resolve_strategy(request(8, "--tp 2 --ulysses 4"), family_spec("sd3"), 8));  // 1 head each
    CHECK_NOTHROW(resolve_strategy(request(3, "--tp 3"), family_spec("sd3"), 4));  // 2, 1, 1 heads
    CHECK_NOTHROW(
        resolve_strategy(request(4, "--cfg-parallel --guidance-scale 1.01"), family_spec("sd3"), 4));
}

TEST_CASE("a family without a negative guidance branch refuses --cfg-parallel, and runs without it") {
    ParallelSpec unguided = family_spec("sd3");
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
    check_degrees(resolve_strategy(on_world(2), family_spec("sd3"), 4).degrees, degrees(2, 1, 1, 1, 1));
}

TEST_CASE("FLUX.1 splits CFG only where true CFG runs: its distilled guidance has no negative branch") {
    const ParallelSpec& flux = family_spec("flux");
    StrategyRequest r = on_world(2);
    r.cfg_parallel = true;  // true_cfg_scale's default, 1.0: no negative branch
    CHECK_THROWS_WITH_AS(
        resolve_strategy(r, flux, 24),
        "--cfg-parallel with --true-cfg-scale 1.00: there is no guidance to split at a scale of 1 "
        "or less (FLUX.1's negative branch runs only with --true-cfg-scale above 1 and a negative "
        "prompt; its guidance_scale is embedded in the transformer, one forward per step, nothing "
        "to split)",
        dp::protocol::UsageError);
    r.cfg_scale = 4.0;  // --true-cfg-scale 4
    check_degrees(resolve_strategy(r, flux, 24).degrees, degrees(1, 2, 1, 1, 1));
    r = on_world(8);
    r.tp = 2;
    r.ring = 2;  // TP with CP, which diffusers refuses
    r.ulysses = 2;
    check_degrees(resolve_strategy(r, flux, 24).degrees, degrees(1, 1, 2, 2, 2));
}

TEST_CASE(
    "FLUX.2-klein splits CFG only in its -base releases above guidance 1: the distilled ones ignore "
    "guidance_scale") {
    const ParallelSpec& klein = family_spec("flux2-klein");
    StrategyRequest r = on_world(2);
    r.cfg_parallel = true;
    r.arguments = dp::strategies::family_arguments("flux2-klein");
    CHECK_THROWS_WITH_AS(resolve_strategy(r, klein, 24),
                         "--cfg-parallel: FLUX.2-klein runs no negative guidance branch (guidance_scale is "
                         "ignored); drop --cfg-parallel",
                         dp::protocol::UsageError);
    r.arguments = dp::strategies::family_arguments("flux2-klein-base");
    check_degrees(resolve_strategy(r, klein, 24).degrees, degrees(1, 2, 1, 1, 1));  // guidance 4.0
    r.cfg_scale = 1.0;
    CHECK_THROWS_WITH_AS(resolve_strategy(r, klein, 24),
                         doctest::Contains("there is no guidance to split at a scale of 1 or less"),
                         dp::protocol::UsageError);
}

// Over every small request: what is accepted is a mesh of the world that leaves every rank at
// least one head and whose dp is the one asked for; what is refused is a usage error.
TEST_CASE("every accepted request is a mesh of the world, and every refusal a usage error") {
    const ParallelSpec& sd3 = family_spec("sd3");
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
                                    if (heads > 0) CHECK(heads >= d.tp * d.ulysses);
                                    if (heads > 0 && d.tp * d.ulysses > 1) CHECK(!out.notes.empty());
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
    const dp::launcher::ResolvedJob resolved = dp::launcher::resolve_job(launch, job);
    CHECK(resolved.degrees().ring == 3);
    CHECK(resolved.degrees().ulysses == 1);
    CHECK(resolved.degrees().dp == 1);
    CHECK(resolved.options.ring == 1);  // the options stay as given
    launch.num_processes = 4;
    check_degrees(dp::launcher::resolve_job(launch, job).degrees(), degrees(1, 1, 1, 4, 1));
    job.strategy.clear();
    job.tp = 5;
    launch.num_processes = 5;
    CHECK_THROWS_WITH_AS(dp::launcher::resolve_job(launch, job),
                         doctest::Contains("the model has 4 attention heads, fewer than the 5 ranks"),
                         dp::protocol::UsageError);
    job.tp = 3;  // 4 heads over 3 ranks: 2, 1, 1
    launch.num_processes = 3;
    const ResolvedStrategy uneven = dp::launcher::resolve_job(launch, job).strategy;
    check_degrees(uneven.degrees, degrees(1, 1, 1, 1, 3));
    REQUIRE(uneven.notes.size() == 1);
    CHECK(uneven.notes[0].find("the ranks hold 2, 1, 1 heads") != std::string::npos);
}

namespace {

// The notes of a request on `world` ranks over `heads` heads, one per line.
std::string notes_of(int world, const std::string& flags, int heads) {
    std::string out;
    for (const std::string& n : resolve_strategy(request(world, flags), family_spec("sd3"), heads).notes)
        out += n + "\n";
    return out;
}

}  // namespace

TEST_CASE("shares of units over ranks are as even as possible, the first ranks one more") {
    CHECK(even_shares(38, 4) == std::vector<int64_t>{10, 10, 9, 9});
    CHECK(even_shares(38, 8) == std::vector<int64_t>{5, 5, 5, 5, 5, 5, 4, 4});
    CHECK(even_shares(38, 2) == std::vector<int64_t>{19, 19});
    CHECK(even_shares(3, 5) == std::vector<int64_t>{1, 1, 1, 0, 0});
    for (int64_t count : {0, 1, 7, 38, 2432})
        for (int parts : {1, 2, 3, 4, 8}) {
            const std::vector<int64_t> shares = even_shares(count, parts);
            int64_t start = 0;
            for (int i = 0; i < parts; ++i) {
                CHECK(share_start(count, parts, i) == start);
                start += shares[static_cast<std::size_t>(i)];
            }
            CHECK(start == count);
        }
    CHECK_THROWS_AS(even_shares(4, 0), std::invalid_argument);
    CHECK_THROWS_AS(share_start(4, 2, 2), std::invalid_argument);
}

TEST_CASE(
    "SD3.5-large's 38 heads: tensor and Ulysses take 4 and 8 ranks with uneven heads, context picks USP") {
    const ParallelSpec& sd3 = family_spec("sd3");
    struct Case {
        int world;
        std::string flags;
        MeshDegrees want;
    };
    for (const Case& c : std::vector<Case>{{2, "--strategy tensor", degrees(1, 1, 1, 1, 2)},
                                           {4, "--strategy tensor", degrees(1, 1, 1, 1, 4)},
                                           {8, "--strategy tensor", degrees(1, 1, 1, 1, 8)},
                                           {8, "--strategy tensor --cfg-parallel", degrees(1, 2, 1, 1, 4)},
                                           {2, "--strategy context", degrees(1, 1, 1, 2, 1)},
                                           {4, "--strategy context", degrees(1, 1, 2, 2, 1)},
                                           {8, "--strategy context", degrees(1, 1, 4, 2, 1)},
                                           {4, "--tp 4", degrees(1, 1, 1, 1, 4)},
                                           {8, "--ulysses 8", degrees(1, 1, 1, 8, 1)},
                                           {8, "--ulysses 4 --tp 2", degrees(1, 1, 1, 4, 2)},
                                           {8, "--ulysses 2 --ring 4", degrees(1, 1, 4, 2, 1)},
                                           {38, "--tp 38", degrees(1, 1, 1, 1, 38)}}) {
        CAPTURE(c.world);
        CAPTURE(c.flags);
        check_degrees(resolve_strategy(request(c.world, c.flags), sd3, 38).degrees, c.want);
    }
    // What each degree costs, with the arithmetic; no note for data parallelism (it splits no
    // heads), for 4 heads over Ulysses 2 (even, no fallback) or for unknown heads (nothing to say).
    struct NoteCase {
        int world;
        std::string flags;
        int heads;
        std::string want;
    };
    for (const NoteCase& c : std::vector<NoteCase>{
             {4, "--tp 4", 38,
              "--tp 4: 38 attention heads over 4 ranks: the ranks hold 10, 10, 9, 9 heads. Attention "
              "waits for the 10-head ranks, so a 9-head rank idles (10 - 9) / 10 = 10% of attention time; "
              "together the ranks use 38 / (4 x 10) = 95% of theirs\n"},
             {8, "--ulysses 8", 38,
              "--ulysses 8: 38 attention heads over 8 ranks: the ranks hold 5, 5, 5, 5, 5, 5, 4, 4 heads. "
              "Attention waits for the 5-head ranks, so a 4-head rank idles (5 - 4) / 5 = 20% of attention "
              "time; together the ranks use 38 / (8 x 5) = 95% of theirs\n"},
             {8, "--tp 4 --ulysses 2", 38,
              "--tp 4 x --ulysses 2: 38 attention heads over 8 ranks (tp shards of 10, 10, 9, 9, each over "
              "ulysses 2): the ranks hold 5, 5, 5, 5, 5, 5, 4, 4 heads. Attention waits for the 5-head "
              "ranks, so a 4-head rank idles (5 - 4) / 5 = 20% of attention time; together the ranks use "
              "38 / (8 x 5) = 95% of theirs\n"},
             {2, "--tp 2", 38, "--tp 2: 38 attention heads over 2 ranks: 19 heads each, an even split\n"},
             {3, "--tp 3", 4,
              "--tp 3: 4 attention heads over 3 ranks: the ranks hold 2, 1, 1 heads. Attention waits for the "
              "2-head ranks, so a 1-head rank idles (2 - 1) / 2 = 50% of attention time; together the ranks "
              "use 4 / (3 x 2) = ~67% of theirs\n"},
             {4, "--strategy context", 38,
              "--strategy context: 38 attention heads do not divide by 4 ranks, so Ulysses 2 (the largest "
              "degree dividing both) inside Ring 2; --ulysses 4 would split the heads unevenly\n"
              "--ulysses 2: 38 attention heads over 2 ranks: 19 heads each, an even split\n"},
             {3, "--strategy context", 4,
              "--strategy context: 4 attention heads do not divide by 3 ranks, so Ring 3 (no Ulysses degree "
              "above 1 divides both); --ulysses 3 would split the heads unevenly\n"},
             {4, "", 38, ""},
             {2, "--strategy context", 4,
              "--ulysses 2: 4 attention heads over 2 ranks: 2 heads each, an even split\n"},
             {4, "--tp 4", 0, ""}}) {
        CAPTURE(c.world);
        CAPTURE(c.flags);
        CAPTURE(c.heads);
        CHECK(notes_of(c.world, c.flags, c.heads) == c.want);
    }
    // Degrees above the heads leave a rank with none and are refused, listing what works.
    CHECK_THROWS_WITH_AS(resolve_strategy(request(40, "--strategy tensor"), sd3, 38),
                         doctest::Contains("tp x ulysses may be at most 38 (1, 2, 19, 38 split them evenly"),
                         dp::protocol::UsageError);
    CHECK_THROWS_WITH_AS(resolve_strategy(request(40, "--ulysses 20 --tp 2"), sd3, 38),
                         doctest::Contains("fewer than the 40 ranks"), dp::protocol::UsageError);
    // The head split the runtime uses: tp shards first, each over its Ulysses group.
    const HeadSplit s = head_split(38, 2, 4);
    CHECK(s.tp_shares == std::vector<int64_t>{19, 19});
    CHECK(s.per_rank == std::vector<int64_t>{5, 5, 5, 5, 5, 5, 4, 4});
    CHECK(s.most() == 5);
    CHECK(s.fewest() == 4);
    CHECK_THROWS_AS(head_split(38, 8, 5), std::invalid_argument);
}
