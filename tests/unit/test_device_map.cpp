#include <doctest/doctest.h>

#include <map>
#include <stdexcept>

#include "strategies/device_map.h"

using namespace dp::strategies;

namespace {
std::vector<ComponentSize> sd3_like() {
    return {{"text_encoder", 250, {}},
            {"text_encoder_2", 1400, {}},
            {"vae", 170, {}},
            {"transformer", 4000, {900, 1000, 1000, 1000}}};
}
}  // namespace

TEST_CASE("balanced: whole components, the largest first, each on the device with the most room") {
    const DeviceMapPlan plan =
        plan_device_map(sd3_like(), {{"cpu:0", 5000}, {"cpu:1", 3000}}, DeviceMapMode::kBalanced);
    std::map<std::string, std::string> where;
    for (const Placement& p : plan.placements) {
        CHECK(p.block == -1);
        where[p.component] = p.device;
    }
    CHECK(where == std::map<std::string, std::string>{{"transformer", "cpu:0"},
                                                      {"text_encoder_2", "cpu:1"},
                                                      {"text_encoder", "cpu:1"},
                                                      {"vae", "cpu:1"}});
    CHECK(plan.used == std::vector<int64_t>{4000, 1820});
}

TEST_CASE("auto: the transformer's blocks split in order when it fits on no single device") {
    CHECK_THROWS_WITH_AS(
        plan_device_map(sd3_like(), {{"cuda:0", 3000}, {"cuda:1", 3000}}, DeviceMapMode::kBalanced),
        doctest::Contains("the auto device map splits the transformer's blocks"), std::invalid_argument);
    const DeviceMapPlan plan =
        plan_device_map(sd3_like(), {{"cuda:0", 3000}, {"cuda:1", 3000}}, DeviceMapMode::kAuto);
    std::vector<std::string> blocks;
    int64_t total = 0;
    for (const Placement& p : plan.placements) {
        total += p.bytes;
        if (p.component == "transformer") blocks.push_back(p.device);
    }
    CHECK(blocks == std::vector<std::string>{"cuda:0", "cuda:0", "cuda:0",
                                             "cuda:1"});  // the rest of 100 goes with block 0
    CHECK(total == 250 + 1400 + 170 + 4000);
    CHECK(plan.used[0] <= 3000);
    CHECK(plan.used[1] <= 3000);
}

TEST_CASE("plans that cannot work are refused with what is free") {
    CHECK_THROWS_WITH_AS(plan_device_map(sd3_like(), {{"cuda:0", 100000}}, DeviceMapMode::kBalanced),
                         doctest::Contains("at least two devices"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(
        plan_device_map(sd3_like(), {{"cuda:0", 1000}, {"cuda:1", 1000}}, DeviceMapMode::kAuto),
        doctest::Contains("bytes free"), std::invalid_argument);
    CHECK_THROWS_AS(plan_device_map(sd3_like(), {{"cuda:0", 0}, {"cuda:1", 10}}, DeviceMapMode::kAuto),
                    std::invalid_argument);
}
