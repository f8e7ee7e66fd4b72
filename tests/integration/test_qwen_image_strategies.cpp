// Qwen-Image through real dp-launch and dp-worker processes over Gloo, on the tiny folder saved by
// diffusers (models/tiny-random-qwen-image): the PNGs and final latents equal diffusers' for the
// golden cases given as JSONL lines, every strategy gives the single-process images, and another
// family's keys and flags are refused before anything starts.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "integration/job_outputs.h"
#include "integration/launch_harness.h"

using namespace dp::test;

namespace {

std::string tiny_qwen_image() { return std::string(DP_MODELS_DIR) + "/tiny-random-qwen-image"; }
std::string golden_file() { return std::string(DP_GOLDEN_DIR) + "/qwen_image_pipeline.safetensors"; }

nlohmann::json golden_cases() {
    return nlohmann::json::parse(read_safetensors_metadata(golden_file(), "cases"));
}

std::vector<float> golden_latents(const std::string& name) {
    return golden_f32(golden_file(), name + ".latents");
}

PixelDifference against_golden(const std::string& png, const std::string& name) {
    return png_against_golden(png, golden_file(), name + ".image");
}

// Text lengths after the template (the prompt's own tokens plus the template's 16-token suffix, by
// transformers' tokenizer of the tiny folder): "owl" 19, "a wooden door" 25 and its "low quality"
// 23, "three cats asleep on a warm sofa" 37 cut to 29 and its "dull" 19, "a snowy hill" 25 cut to
// 23 and its "" 16. At 44x28 the image is 11x7 = 77 tokens. Neither stream divides 2, 3 or 4, so
// every split is uneven; the first prompt has no negative prompt, hence no CFG, under cfg-parallel too.
const char* kPrompts =
    "{\"prompt\": \"owl\", \"seed\": 1}\n"
    "{\"prompt\": \"a wooden door\", \"negative_prompt\": \"low quality\", \"seed\": 2}\n"
    "{\"prompt\": \"three cats asleep on a warm sofa\", \"negative_prompt\": \"dull\", \"seed\": 3, "
    "\"true_cfg_scale\": 2.5, \"max_sequence_length\": 29, \"num_inference_steps\": 3}\n"
    "{\"prompt\": \"a snowy hill\", \"negative_prompt\": \"\", \"seed\": 4, \"max_sequence_length\": 23}\n";

// With the transformer's embeddings and block 0 (0.21 MiB) on cpu:0 and block 1 on cpu:1.
const char* kSplitBlocks = "cpu:0=300KiB,cpu:1=1MiB";

std::vector<std::string> args_for(const std::string& out, const std::vector<std::string>& extra,
                                  const std::string& prompts) {
    std::vector<std::string> a = {
        "--model", tiny_qwen_image(), "--steps", "2", "--width", "44", "--height", "28", "-o", out, "-q"};
    a.insert(a.end(), extra.begin(), extra.end());
    a.push_back(prompts);
    return a;
}

}  // namespace

TEST_CASE(
    "qwen_image: dp-launch -n 1 on the folder saved by diffusers gives diffusers' images and records "
    "true_cfg_scale") {
    const nlohmann::json cases = golden_cases();
    const std::vector<std::string> names = {"plain", "cfg", "cfg_empty_negative", "cut"};
    const std::string dir = make_temp_dir();
    const std::string prompts = dir + "/p.jsonl";
    {
        std::ofstream out(prompts, std::ios::binary);
        for (const std::string& name : names) {
            nlohmann::json line = cases.at(name);
            if (name == "cut") {  // diffusers' own name for the steps
                line["num_inference_steps"] = line.at("steps");
                line.erase("steps");
            }
            out << line.dump() << "\n";
        }
    }
    LaunchResult r = run_launch({"--model", tiny_qwen_image(), "-n", "1", "-o", dir + "/out", "-q", prompts},
                                {{"DP_SAVE_LATENTS", "1"}}, 120);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const auto records = read_manifest(dir + "/out");
    REQUIRE(records.size() == names.size());
    for (const auto& record : records) {
        const std::string& name = names.at(record.at("index").get<std::size_t>());
        const nlohmann::json& c = cases.at(name);
        CAPTURE(name);
        CHECK(record.at("status") == "ok");
        CHECK(record.at("true_cfg_scale").get<double>() == c.at("true_cfg_scale").get<double>());
        CHECK(record.at("negative_prompt") == c.at("negative_prompt"));  // null for "plain"
        CHECK(record.at("max_sequence_length") == c.at("max_sequence_length"));
        CHECK(record.at("steps") == c.at("steps"));
        for (const char* other : {"guidance_scale", "skip_guidance_layers", "skip_layer_guidance_scale",
                                  "skip_layer_guidance_start", "skip_layer_guidance_stop", "no_t5"})
            CHECK_FALSE(record.contains(other));
        const std::string file = dir + "/out/" + record.at("file").get<std::string>();
        const PixelDifference d = against_golden(file, name);
        MESSAGE("Qwen-Image case " << name << " through dp-launch: max |uint8 diff| " << d.max);
        CHECK(d.within_one >= 0.999);
        CHECK(max_difference(read_latents(file + ".latents.safetensors"), golden_latents(name)) <= 1e-4f);
    }
    CHECK(r.err.find("max_sequence_length 6") != std::string::npos);  // "cut" says what was dropped
    remove_dir(dir);
}

TEST_CASE(
    "qwen_image: --dtype bf16 through dp-launch is within the unit test's tolerance of diffusers' bf16") {
    // The bounds of tests/unit/test_qwen_image_pipeline.cpp (twice diffusers' own fp32-to-bf16 gap).
    constexpr double kBf16MeanUint8 = 3.1;
    constexpr int kBf16MaxUint8 = 36;
    const std::string dir = make_temp_dir();
    const std::string prompts = dir + "/p.jsonl";
    std::ofstream(prompts, std::ios::binary) << golden_cases().at("bf16").dump() << "\n";
    LaunchResult r = run_launch(
        {"--model", tiny_qwen_image(), "-n", "1", "--dtype", "bf16", "-o", dir + "/out", "-q", prompts}, {},
        120);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const auto records = read_manifest(dir + "/out");
    REQUIRE(records.size() == 1);
    CHECK(records[0].at("dtype") == "bf16");
    const PixelDifference d =
        against_golden(dir + "/out/" + records[0].at("file").get<std::string>(), "bf16");
    MESSAGE("Qwen-Image bf16 through dp-launch: mean |uint8 diff| " << d.mean << ", max " << d.max);
    CHECK(d.mean <= kBf16MeanUint8);
    CHECK(d.max <= kBf16MaxUint8);
    remove_dir(dir);
}

TEST_CASE(
    "qwen_image: ulysses2, ring2, ring3, usp, tp2, tp2 x ring2, cfg2, device_map and context give the "
    "single-process images") {
    // device_map auto at these budgets splits the transformer's blocks over the two CPU devices.
    LaunchResult plan = run_launch({"plan", "--model", tiny_qwen_image(), "-n", "1", "--device-map", "auto",
                                    "--max-memory", kSplitBlocks},
                                   {}, 30);
    REQUIRE_MESSAGE(plan.exit_code == 0, plan.err);
    CHECK(plan.out.find("transformer block 0 (with its embeddings and output head): cpu:0") !=
          std::string::npos);
    CHECK(plan.out.find("transformer block 1: cpu:1") != std::string::npos);

    const std::string dir = make_temp_dir();
    const std::string prompts = dir + "/p.jsonl";
    std::ofstream(prompts, std::ios::binary) << kPrompts;
    const std::map<std::string, std::string> env = {{"DP_SAVE_LATENTS", "1"}};
    LaunchResult one = run_launch(args_for(dir + "/single", {"-n", "1"}, prompts), env, 120);
    REQUIRE_MESSAGE(one.exit_code == 0, one.err);
    const auto single = read_manifest(dir + "/single");
    REQUIRE(single.size() == 4);
    CHECK(single[0].at("negative_prompt").is_null());
    CHECK(single[2].at("steps") == 3);
    const std::vector<std::vector<std::string>> runs = {
        {"-n", "2", "--ulysses", "2"},
        {"-n", "2", "--ring", "2"},
        {"-n", "3", "--ring", "3"},
        {"-n", "4", "--ulysses", "2", "--ring", "2"},
        {"-n", "2", "--tp", "2"},
        {"-n", "4", "--tp", "2", "--ring", "2"},
        {"-n", "2", "--cfg-parallel"},
        {"-n", "1", "--device-map", "auto", "--max-memory", kSplitBlocks},
        {"-n", "3", "--strategy", "context"},
    };
    for (const auto& extra : runs) {
        CAPTURE(extra);
        LaunchResult r = run_leaving_nothing(args_for(dir + "/run", extra, prompts), env);
        REQUIRE_MESSAGE(r.exit_code == 0, r.err);
        const auto records = read_manifest(dir + "/run");
        REQUIRE(records.size() == single.size());
        for (std::size_t i = 0; i < single.size(); ++i) {
            const std::string file = single[i].at("file").get<std::string>();
            CAPTURE(file);
            CHECK(records[i].at("status") == "ok");
            CHECK(records[i].at("sha256").is_string());
            CHECK(max_pixel_difference(dir + "/single/" + file, dir + "/run/" + file) <= 1);
            CHECK(max_latent_difference(dir + "/single/" + file + ".latents.safetensors",
                                        dir + "/run/" + file + ".latents.safetensors") <= 1e-4f);
        }
        remove_dir(dir + "/run");
    }
    remove_dir(dir);
}

TEST_CASE(
    "qwen_image: another family's flags and keys are refused before anything starts, naming Qwen-Image") {
    const std::string dir = make_temp_dir();
    const std::string text = dir + "/p.txt";
    std::ofstream(text, std::ios::binary) << "a red fox\n";
    struct Refused {
        std::vector<std::string> flags;
        std::string says;
    };
    for (const Refused& bad : std::vector<Refused>{
             {{"--guidance-scale", "5"}, "Qwen-Image does not take guidance_scale"},
             {{"--skip-guidance-layers", "1"}, "Qwen-Image does not take skip_guidance_layers"},
             {{"--no-t5"}, "--no-t5: Qwen-Image has no T5 text encoder"},
             {{"--max-sequence-length", "1025"},
              "--max-sequence-length '1025': expected a whole number from 1 to 1024"},
         }) {
        CAPTURE(bad.flags);
        std::vector<std::string> args = {"--model", tiny_qwen_image(), "-o", dir + "/out", "-q"};
        args.insert(args.end(), bad.flags.begin(), bad.flags.end());
        args.push_back(text);
        LaunchResult r = run_launch(args, {}, 30);
        CHECK(r.exit_code == 2);
        CHECK_MESSAGE(r.err.find(bad.says) != std::string::npos, r.err);
        CHECK_FALSE(file_exists(dir + "/out/manifest.jsonl"));
    }
    // A JSONL key of another family is an invalid line (65 without --skip-invalid), naming the key.
    for (const char* key : {"guidance_scale", "skip_guidance_layers"}) {
        CAPTURE(key);
        const std::string jsonl = dir + "/p.jsonl";
        std::ofstream(jsonl, std::ios::binary)
            << "{\"prompt\": \"a fox\"}\n{\"prompt\": \"a cat\", \"" << key
            << "\": " << (std::string(key) == "guidance_scale" ? "5" : "[1]") << "}\n";
        LaunchResult r = run_launch({"--model", tiny_qwen_image(), "-o", dir + "/out", "-q", jsonl}, {}, 30);
        CHECK(r.exit_code == 65);
        CHECK_MESSAGE(r.err.find("p.jsonl:2: key '" + std::string(key) + "': Qwen-Image does not take " +
                                 key) != std::string::npos,
                      r.err);
        CHECK_FALSE(file_exists(dir + "/out/manifest.jsonl"));
    }
    remove_dir(dir);
}

TEST_CASE(
    "qwen_image: diffusers' defaults (50 steps, true_cfg_scale 4.0, 512 tokens, no negative prompt) and its "
    "flag names") {
    const std::string dir = make_temp_dir();
    const std::string text = dir + "/p.txt";
    std::ofstream(text, std::ios::binary) << "a red fox\n";
    LaunchResult r = run_launch({"--model", tiny_qwen_image(), "--width", "16", "--height", "16", "-o",
                                 dir + "/defaults", "-q", text},
                                {}, 120);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    auto records = read_manifest(dir + "/defaults");
    REQUIRE(records.size() == 1);
    CHECK(records[0].at("steps") == 50);
    CHECK(records[0].at("true_cfg_scale").get<double>() == 4.0);
    CHECK(records[0].at("max_sequence_length") == 512);
    CHECK(records[0].at("negative_prompt").is_null());
    CHECK_FALSE(records[0].contains("guidance_scale"));

    // The job's flags by diffusers' names, under each line's own keys.
    const std::string jsonl = dir + "/p.jsonl";
    std::ofstream(jsonl, std::ios::binary) << "{\"prompt\": \"a fox\"}\n"
                                              "{\"prompt\": \"a cat\", \"negative_prompt\": \"ugly\", "
                                              "\"num_inference_steps\": 3, \"true_cfg_scale\": 2}\n";
    r = run_launch({"--model", tiny_qwen_image(), "--width", "16", "--height", "16", "--true-cfg-scale",
                    "1.5", "--negative-prompt", "dull", "--num-inference-steps", "2", "--max-sequence-length",
                    "64", "-o", dir + "/flags", "-q", jsonl},
                   {}, 120);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    records = read_manifest(dir + "/flags");
    REQUIRE(records.size() == 2);
    CHECK(records[0].at("steps") == 2);
    CHECK(records[0].at("true_cfg_scale").get<double>() == 1.5);
    CHECK(records[0].at("negative_prompt") == "dull");
    CHECK(records[0].at("max_sequence_length") == 64);
    CHECK(records[1].at("steps") == 3);
    CHECK(records[1].at("true_cfg_scale").get<double>() == 2.0);
    CHECK(records[1].at("negative_prompt") == "ugly");
    remove_dir(dir);
}
