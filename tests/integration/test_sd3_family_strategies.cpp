// Every strategy on the rest of the SD3 family gives the single-process images, with real
// dp-launch and dp-worker processes over Gloo: SD3 with its T5 encoder, SD3.5-medium's shape
// (dual attention, qk-norm, skip-layer guidance as a JSONL key) and SD3.5-large's shape (3 heads,
// so TP and Ulysses split the heads unevenly). The golden folders of tests/data/golden.
#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "integration/job_outputs.h"
#include "integration/launch_harness.h"

using namespace dp::test;

namespace {

// Three prompts: plain, with a negative prompt, and with skip-layer guidance on two of its steps.
const char* kPrompts =
    "a red circle on a blue background\n"
    "{\"prompt\": \"a green square\", \"negative_prompt\": \"blurry\", \"seed\": 5}\n"
    "{\"prompt\": \"a yellow star\", \"skip_guidance_layers\": [1], \"skip_layer_guidance_stop\": 0.9}\n";

std::vector<std::string> args_for(const std::string& model, const std::string& out,
                                  const std::vector<std::string>& extra, const std::string& prompts) {
    std::vector<std::string> a = {"--model", std::string(DP_GOLDEN_DIR) + "/" + model, "--steps", "3", "--width",
                                  "12", "--height", "10", "--max-sequence-length", "24", "-o", out, "-q"};
    a.insert(a.end(), extra.begin(), extra.end());
    a.push_back(prompts);
    return a;
}

// Each configuration against one process: final latents within 1e-4, PNGs within 1 per channel.
void expect_single_process_images(const std::string& model, const std::vector<std::vector<std::string>>& runs) {
    const std::string dir = make_temp_dir();
    const std::string prompts = dir + "/p.txt";
    std::ofstream(prompts, std::ios::binary) << kPrompts;
    const std::map<std::string, std::string> env = {{"DP_SAVE_LATENTS", "1"}};
    LaunchResult one = run_launch(args_for(model, dir + "/single", {"-n", "1"}, prompts), env, 180);
    REQUIRE_MESSAGE(one.exit_code == 0, one.err);
    const auto single = read_manifest(dir + "/single");
    REQUIRE(single.size() == 3);
    for (const auto& extra : runs) {
        CAPTURE(model);
        CAPTURE(extra);
        LaunchResult r = run_launch(args_for(model, dir + "/run", extra, prompts), env, 180);
        REQUIRE_MESSAGE(r.exit_code == 0, r.err);
        REQUIRE(read_manifest(dir + "/run").size() == 3);
        for (const auto& record : single) {
            const std::string file = record["file"].get<std::string>();
            CHECK(max_pixel_difference(dir + "/single/" + file, dir + "/run/" + file) <= 1);
            CHECK(max_latent_difference(dir + "/single/" + file + ".latents.safetensors",
                                        dir + "/run/" + file + ".latents.safetensors") <= 1e-4f);
        }
        REQUIRE(std::system(("rm -rf '" + dir + "/run'").c_str()) == 0);
    }
    REQUIRE(std::system(("rm -rf '" + dir + "'").c_str()) == 0);
}

const std::vector<std::vector<std::string>> kEveryStrategy = {
    {"-n", "2", "--tp", "2"},
    {"-n", "2", "--ulysses", "2"},
    {"-n", "2", "--ring", "2"},
    {"-n", "3", "--ring", "3"},
    {"-n", "4", "--ulysses", "2", "--ring", "2"},
    {"-n", "4", "--tp", "2", "--ulysses", "2"},
    {"-n", "2", "--cfg-parallel"},
    {"-n", "1", "--device-map", "balanced", "--max-memory", "cpu:0=1GB,cpu:1=1GB"},
};

}  // namespace

TEST_CASE("SD3 with T5: tp2, ulysses2, ring2, ring3, usp, tp2 x ulysses2, cfg2 and device_map give the single-process images") {
    expect_single_process_images("sd3_t5_tiny", kEveryStrategy);
}

TEST_CASE("SD3.5-medium's dual attention with skip-layer guidance: every strategy gives the single-process images") {
    expect_single_process_images("sd35_medium_tiny", kEveryStrategy);
}

TEST_CASE("SD3.5-large's odd head count: uneven TP and Ulysses head shards give the single-process images") {
    expect_single_process_images("sd35_large_tiny", {{"-n", "2", "--tp", "2"},
                                                     {"-n", "2", "--ulysses", "2"},
                                                     {"-n", "4", "--ulysses", "2", "--ring", "2"},
                                                     {"-n", "2", "--strategy", "context"},
                                                     {"-n", "4", "--strategy", "context"},
                                                     {"-n", "4", "--tp", "2", "--cfg-parallel"}});
}
