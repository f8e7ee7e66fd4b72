#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <stdexcept>

#include "launcher/job.h"
#include "strategies/device_map.h"
#include "strategies/family.h"
#include "strategies/model_config.h"
#include "strategies/model_sizes.h"
#include "unit/st_writer.h"

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

namespace {

std::string component_dir(const std::string& model, const std::string& name) {
    mkdir(model.c_str(), 0755);
    const std::string dir = model + "/" + name;
    mkdir(dir.c_str(), 0755);
    return dir;
}

}  // namespace

TEST_CASE("component sizes follow the spec: its components, block prefixes and unloaded tensors") {
    const std::string model = "/tmp/dp_sizes_test_" + std::to_string(getpid());
    dp::test::write_st_header(component_dir(model, "text_encoder") + "/model.safetensors", {{"a", {10}}});
    dp::test::write_st_header(component_dir(model, "text_encoder_2") + "/model.safetensors", {{"b", {3, 5}}});
    dp::test::write_st_header(component_dir(model, "transformer") + "/m.safetensors",
                              {{"pos_embed.proj.weight", {7}},
                               {"transformer_blocks.0.attn.to_q.weight", {4, 4}},
                               {"transformer_blocks.1.attn.to_q.weight", {4, 2}},
                               {"transformer_blocks.1.norm1.linear.bias", {3}},
                               {"single_transformer_blocks.0.proj_out.weight", {5}}});
    const ParallelSpec& sd3 = family_spec("sd3");
    // No VAE folder: a pixel-space model, and the VAE is optional.
    std::vector<ComponentSize> sizes = pipeline_component_sizes(model, sd3, 2);
    REQUIRE(sizes.size() == 3);
    CHECK(sizes[0].name == "text_encoder");
    CHECK(sizes[0].bytes == 20);
    CHECK(sizes[1].bytes == 30);
    CHECK(sizes[2].name == "transformer");
    CHECK(sizes[2].bytes == 2 * (7 + 16 + 8 + 3 + 5));
    CHECK(sizes[2].block_bytes == std::vector<int64_t>{32, 22});  // single_ is not SD3's prefix
    CHECK(sizes[0].block_bytes.empty());
    // The VAE's encoder is never loaded: only its decoder counts.
    dp::test::write_st_header(component_dir(model, "vae") + "/d.safetensors",
                              {{"encoder.conv_in.weight", {100}},
                               {"quant_conv.weight", {9}},
                               {"post_quant_conv.weight", {4}},
                               {"decoder.conv_in.weight", {6}}});
    sizes = pipeline_component_sizes(model, sd3, 4);
    REQUIRE(sizes.size() == 4);
    CHECK(sizes[3].name == "vae");
    CHECK(sizes[3].bytes == 4 * (4 + 6));
    // A family with two kinds of blocks numbers them on, in prefix order.
    ParallelSpec two = sd3;
    two.block_prefixes = {"transformer_blocks.", "single_transformer_blocks."};
    two.components = {"transformer"};
    sizes = pipeline_component_sizes(model, two, 1);
    REQUIRE(sizes.size() == 1);
    CHECK(sizes[0].block_bytes == std::vector<int64_t>{16, 11, 5});
    // A required component that is missing names its folder.
    two.components = {"transformer", "text_encoder_3"};
    two.optional_components = {};
    CHECK_THROWS_WITH_AS(pipeline_component_sizes(model, two, 1), doctest::Contains("text_encoder_3"),
                         std::runtime_error);
    std::system(("rm -rf '" + model + "'").c_str());
}

TEST_CASE(
    "T5's encoder is placed where the job loads it: not under --no-t5, nor when model_index.json names "
    "none") {
    const std::string model = "/tmp/dp_t5_sizes_test_" + std::to_string(getpid());
    dp::test::write_st_header(component_dir(model, "text_encoder") + "/model.safetensors", {{"a", {10}}});
    dp::test::write_st_header(component_dir(model, "text_encoder_2") + "/model.safetensors", {{"b", {3}}});
    dp::test::write_st_header(component_dir(model, "text_encoder_3") + "/model.safetensors",
                              {{"encoder.block.0.layer.0.SelfAttention.q.weight", {8, 8}}});
    dp::test::write_st_header(component_dir(model, "transformer") + "/m.safetensors",
                              {{"transformer_blocks.0.attn.to_q.weight", {2, 2}}});
    const ParallelSpec& sd3 = family_spec("sd3");
    auto names = [&](const std::vector<std::string>& left_out) {
        std::vector<std::string> out;
        for (const ComponentSize& c : pipeline_component_sizes(model, sd3, 2, "", left_out))
            out.push_back(c.name);
        return out;
    };
    const std::vector<std::string> with_t5 = {"text_encoder", "text_encoder_2", "text_encoder_3",
                                              "transformer"};
    const std::vector<std::string> without = {"text_encoder", "text_encoder_2", "transformer"};
    std::ofstream(model + "/model_index.json")
        << R"({"_class_name": "StableDiffusion3Pipeline", "text_encoder_3": ["transformers", "T5EncoderModel"]})";
    CHECK(names(components_left_out(model, sd3, false)) == with_t5);
    CHECK(names(components_left_out(model, sd3, true)) == without);
    std::ofstream(model + "/model_index.json")
        << R"({"_class_name": "StableDiffusion3Pipeline", "text_encoder_3": [null, null]})";
    CHECK(names(components_left_out(model, sd3, false)) == without);
    // The planner places it like any component: 128 bytes of T5 in bf16.
    std::ofstream(model + "/model_index.json")
        << R"({"_class_name": "StableDiffusion3Pipeline", "text_encoder_3": ["transformers", "T5EncoderModel"]})";
    const DeviceMapPlan plan = plan_device_map_spec(model, sd3, 2, "balanced", "cpu:0=1MB,cpu:1=1MB", {}, "",
                                                    components_left_out(model, sd3, false));
    bool placed = false;
    for (const Placement& p : plan.placements) placed |= p.component == "text_encoder_3" && p.bytes == 128;
    CHECK(placed);
    std::system(("rm -rf '" + model + "'").c_str());
}

TEST_CASE("the shipped tiny model's sizes: two transformer blocks, and the bytes the planner reports") {
    const std::string model = dp::launcher::resolve_model("tiny-random-sd3", "--model");
    const std::vector<ComponentSize> sizes =
        pipeline_component_sizes(model, parallel_spec_for_model(model), 4);
    REQUIRE(sizes.size() == 4);
    CHECK(sizes[2].name == "transformer");
    CHECK(sizes[2].bytes == 516368);
    CHECK(sizes[2].block_bytes.size() == 2);
    CHECK_THROWS_WITH_AS(plan_device_map_spec(model, parallel_spec_for_model(model), 4, "balanced",
                                              "cpu:0=300KB,cpu:1=300KB", {}),
                         doctest::Contains("transformer (516368 bytes) fits on no device"),
                         std::invalid_argument);
}
