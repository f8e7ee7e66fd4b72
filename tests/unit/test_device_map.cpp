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

TEST_CASE("devices and budgets as users write them") {
    CHECK(canonical_device("cpu") == "cpu:0");
    CHECK(canonical_device("cuda:07") == "cuda:7");
    CHECK(canonical_device("3") == "cuda:3");
    for (const char* bad : {"", "gpu:0", "cuda:", "cuda:-1", "cuda:x", "cpu:123456"})
        CHECK_THROWS_AS(canonical_device(bad), std::invalid_argument);
    const auto budgets = parse_max_memory("cuda:0=1.5GiB,1=2GB,cpu:0=64MB,cpu:1=100");
    REQUIRE(budgets.size() == 4);
    CHECK(budgets[0].device == "cuda:0");
    CHECK(budgets[0].bytes == 1610612736);
    CHECK(budgets[1].device == "cuda:1");
    CHECK(budgets[1].bytes == 2000000000);
    CHECK(budgets[2].bytes == 64000000);
    CHECK(budgets[3].bytes == 100);
    for (const char* bad : {"", "cuda:0", "cuda:0=", "cuda:0=0", "cuda:0=-1GB", "cuda:0=1.2.3GB",
                            "cuda:0=1XB", "cuda:0=1GB,", "cuda:0=1GB,cuda:0=2GB", "cuda:0=1e300TB"})
        CHECK_THROWS_AS(parse_max_memory(bad), std::invalid_argument);
}

TEST_CASE("a device map written by hand: whole components, or one device per transformer block") {
    const DeviceMapPlan whole = device_map_from_json(
        R"({"text_encoder": "cpu:0", "text_encoder_2": 0, "vae": "cuda:0", "transformer": 1})", sd3_like(),
        "m.json");
    CHECK(whole.devices == std::vector<std::string>{"cpu:0", "cuda:0", "cuda:1"});
    CHECK(whole.used == std::vector<int64_t>{250, 1570, 4000});
    const DeviceMapPlan blocks = device_map_from_json(
        R"({"text_encoder": 0, "text_encoder_2": 0, "vae": 0, "transformer": [0, 0, 1, 1]})", sd3_like(),
        "m.json");
    CHECK(blocks.used == std::vector<int64_t>{250 + 1400 + 170 + 100 + 900 + 1000, 2000});
    CHECK(describe_device_map(blocks).find("transformer blocks 2-3: cuda:1") != std::string::npos);
    CHECK(describe_device_map(blocks).find(
              "transformer blocks 0-1 (with its embeddings and output head): cuda:0") != std::string::npos);
    for (const auto& [text, message] : std::vector<std::pair<std::string, std::string>>{
             {"[1, 2]", "expected a JSON object"},
             {"{", "not valid JSON"},
             {R"({"text_encoder": 0, "text_encoder_2": 0, "vae": 0})", "places no device for transformer"},
             {R"({"text_encoder": 0, "text_encoder_2": 0, "vae": 0, "transformer": [0, 1]})",
              "lists 2 devices but the model has 4 blocks"},
             {R"({"text_encoder": [0], "text_encoder_2": 0, "vae": 0, "transformer": 1})",
              "only the transformer takes a list"},
             {R"({"text_encoder": 0, "text_encoder_2": 0, "vae": 0, "transformer": true})",
              "expected a device"},
             {R"({"text_encoder": 0, "text_encoder_2": 0, "vae": 0, "transformer": 0})",
              "puts everything on cuda:0"},
             {R"({"text_encoder": 0, "text_encoder_2": 0, "vae": 0, "transformer": 1, "unet": 0})",
              "'unet' is not a component"}}) {
        CAPTURE(text);
        CHECK_THROWS_WITH_AS(device_map_from_json(text, sd3_like(), "m.json"),
                             doctest::Contains(message.c_str()), std::invalid_argument);
    }
}
