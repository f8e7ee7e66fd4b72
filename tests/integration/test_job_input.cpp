// What the main job accepts as input, checked with the real dp-launch and dp-worker: sizes the
// model cannot make, prompt files that are not files or not prompts, paths and text that are not
// UTF-8, endless inputs, and pipeline defaults under a command run.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "integration/launch_harness.h"
#include "support/test_paths.h"

// Images and records only: ctest may run these beside other tests (tests/CMakeLists.txt).
TEST_SUITE_BEGIN("parallel_safe");

using namespace dp::test;

namespace {

std::string write_file(const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::binary) << text;
    return path;
}

// manifest.jsonl, one record per line.
std::vector<nlohmann::json> manifest_of(const std::string& out) {
    std::vector<nlohmann::json> records;
    const std::string text = read_file(out + "/manifest.jsonl");
    for (std::size_t at = 0, end; (end = text.find('\n', at)) != std::string::npos; at = end + 1)
        records.push_back(nlohmann::json::parse(text.substr(at, end - at)));
    return records;
}

std::vector<std::string> tiny(const std::string& out, std::vector<std::string> extra) {
    std::vector<std::string> args = {"--model", DP_TINY_MODEL, "--steps", "1", "-o", out, "-q"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
}

}  // namespace

TEST_CASE("sizes the model cannot make are refused before any rank starts, naming sizes that work") {
    const std::string dir = make_temp_dir();
    const std::string prompts = write_file(dir + "/p.txt", "one\n");
    // The tiny model: no patching (1) and a 40 x 40 position table; the shipped one: patch 4, 8 x 8.
    LaunchResult wide = run_launch(tiny(dir + "/out", {"-n", "2", "--width", "41", prompts}));
    CHECK(wide.exit_code == 2);
    CHECK_MESSAGE(wide.err.find("--width 41: this model makes sizes that are multiples of 1 from 1 to 40 "
                                "pixels (nearest: 40)") != std::string::npos,
                  wide.err);
    CHECK(wide.seconds < 10);
    LaunchResult odd = run_launch({"-n", "2", "--height", "33", "-o", dir + "/out", prompts});
    CHECK(odd.exit_code == 2);
    CHECK_MESSAGE(odd.err.find("--height 33: this model makes sizes that are multiples of 4 from 4 to 32 "
                               "pixels (nearest: 32)") != std::string::npos,
                  odd.err);
    CHECK_FALSE(file_exists(dir + "/out/manifest.jsonl"));
}

TEST_CASE(
    "a JSONL line's size the model cannot make is an invalid line, and records carry the size asked for") {
    const std::string dir = make_temp_dir();
    const std::string prompts = write_file(dir + "/p.jsonl", R"({"prompt": "too wide", "width": 512})"
                                                             "\n"
                                                             R"({"prompt": "tall", "height": 24})"
                                                             "\n");
    LaunchResult refused = run_launch(tiny(dir + "/out", {prompts}));
    CHECK(refused.exit_code == 65);
    CHECK_MESSAGE(
        refused.err.find(prompts + ":1: key 'width': 512: this model makes sizes that are multiples "
                                   "of 1 from 1 to 40 pixels (nearest: 40)") != std::string::npos,
        refused.err);
    CHECK_FALSE(file_exists(dir + "/out/manifest.jsonl"));

    LaunchResult skipped = run_launch(tiny(dir + "/out", {"--skip-invalid", prompts}), {}, 120);
    REQUIRE_MESSAGE(skipped.exit_code == 0, skipped.err);
    const auto records = manifest_of(dir + "/out");
    REQUIRE(records.size() == 2);
    CHECK(records[0]["status"] == "invalid");
    CHECK(records[1]["status"] == "ok");
    CHECK(records[1]["width"] == 32);  // the model's default: sample_size 32 x VAE scale 1
    CHECK(records[1]["height"] == 24);
}

TEST_CASE("a directory as the prompt file cannot be read (66), and /dev/zero stops at the job's limit") {
    const std::string dir = make_temp_dir();
    LaunchResult directory = run_launch(tiny(dir + "/out", {dir}));
    CHECK(directory.exit_code == 66);
    CHECK(directory.err.find("PROMPTS " + dir + ": is a directory, not a prompt file") != std::string::npos);
    CHECK(directory.out.find("nothing to do") == std::string::npos);

    LaunchResult zero = run_launch(tiny(dir + "/out", {"/dev/zero"}), {}, 60);
    CHECK(zero.exit_code == 65);
    CHECK(zero.err.find("/dev/zero: more than 64 MiB (stopped reading there)") != std::string::npos);
    CHECK_FALSE(file_exists(dir + "/out/manifest.jsonl"));
}

TEST_CASE("a program given as PROMPTS is refused with the command that was probably meant") {
    const std::string dir = make_temp_dir();
    const std::string script = write_file(dir + "/train.py", "import torch\nprint('hello')\n");
    LaunchResult r = run_launch({"-n", "2", script});
    CHECK(r.exit_code == 2);
    CHECK_MESSAGE(r.err.find("is a .py script, not a prompt file; to run it once per rank, put it after --: "
                             "dp-launch -n 2 -- python3 " +
                             script) != std::string::npos,
                  r.err);
}

TEST_CASE("paths that are not UTF-8 work, and prompt text that is not UTF-8 is a usage error") {
    const std::string dir = make_temp_dir() + "/bytes\xff";
    std::filesystem::create_directories(dir);
    const std::string model = dir + "/model\xfe";
    std::filesystem::create_directory_symlink(DP_TINY_MODEL, model);
    const std::string prompts = write_file(dir + "/prompts\xfd.txt", "a red circle\n");
    const std::string out = dir + "/out\xfc";
    LaunchResult r = run_launch({"--model", model, "--steps", "1", "--width", "16", "--height", "16", "-o",
                                 out, "-q", "--negative-prompt", "flou", prompts},
                                {}, 120);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const auto records = manifest_of(out);
    REQUIRE(records.size() == 1);
    CHECK(records[0]["status"] == "ok");
    CHECK(file_exists(out + "/" + records[0]["file"].get<std::string>()));

    LaunchResult text = run_launch({"--model", model, "-o", out, "--negative-prompt", "\xff", prompts});
    CHECK(text.exit_code == 2);
    CHECK(text.err.find("--negative-prompt: expected UTF-8 text") != std::string::npos);
    std::filesystem::remove_all(dir);
}

TEST_CASE("pipeline defaults from DP_* variables or a config file leave a command run alone") {
    const std::string dir = make_temp_dir();
    const std::string config = write_file(dir + "/dp.json", R"({"steps": 4, "width": 64})");
    LaunchResult env = run_launch({"-n", "2", "--", "true"}, {{"DP_STEPS", "4"}});
    CHECK_MESSAGE(env.exit_code == 0, env.err);
    LaunchResult file = run_launch({"--config", config, "--", "true"});
    CHECK_MESSAGE(file.exit_code == 0, file.err);
    LaunchResult flag = run_launch({"--steps", "4", "--", "true"});
    CHECK(flag.exit_code == 2);
    CHECK(flag.err.find("--steps is a pipeline option") != std::string::npos);
}

TEST_CASE("control characters from a prompt file and a model path reach the terminal escaped, never raw") {
    const std::string dir = make_temp_dir();
    // An unknown JSONL key that clears the screen and sets the title, and a bad adapter path with a
    // C1 control character: both are named in dp-launch's messages.
    const std::string prompts =
        write_file(dir + "/p.jsonl", "{\"prompt\": \"a\", \"\\u001b[2J\\u001b]0;pwned\\u0007\": 1}\n");
    LaunchResult r = run_launch(tiny(dir + "/out", {"-n", "1", prompts}));
    CHECK(r.exit_code == 65);
    CHECK_MESSAGE(r.err.find("\\x1b[2J\\x1b]0;pwned\\x07") != std::string::npos, r.err);
    CHECK(r.err.find('\x1b') == std::string::npos);
    CHECK(r.err.find('\x07') == std::string::npos);
    const std::string lora = dir + "/evil\x1b[31m.safetensors";
    LaunchResult a =
        run_launch(tiny(dir + "/out", {"-n", "1", "--lora", lora, write_file(dir + "/p.txt", "one\n")}));
    CHECK(a.exit_code == 66);
    CHECK_MESSAGE(a.err.find("evil\\x1b[31m.safetensors") != std::string::npos, a.err);
    CHECK(a.err.find('\x1b') == std::string::npos);
    CHECK_FALSE(file_exists(dir + "/out/manifest.jsonl"));
}

TEST_CASE(
    "a line's scheduler, schedule or preset that cannot run is an invalid line, refused before any rank") {
    const std::string dir = make_temp_dir();
    struct Row {
        const char* line;
        const char* why;
    };
    const Row rows[] = {
        {R"({"prompt": "a", "scheduler": "eulr"})",
         "key 'scheduler': unknown scheduler 'eulr' (known: euler, heun, lcm, dpm++-2m, dpm++-2m-sde, unipc"},
        {R"({"prompt": "a", "sigmas": [0.5, 0.9]})", "sigmas must decrease: sigmas[1] 0.9 is not below"},
        {R"({"prompt": "a", "steps": 3, "sigmas": [0.9, 0.5]})",
         "sigmas: 2 values for 3 steps (num_inference_steps)"},
        {R"({"prompt": "a", "sigmas": "0.9,inf"})", "key 'sigmas': expected a list of numbers from 0 to 1"},
        {R"({"prompt": "a", "sigmas": "nan,0.5"})", "key 'sigmas': expected a list of numbers from 0 to 1"},
        {R"({"prompt": "a", "sigmas": [1e308, 0.5]})",
         "key 'sigmas': expected a list of numbers from 0 to 1"},
        {R"({"prompt": "a", "timesteps": [900, 950]})", "timesteps must decrease"},
        {R"({"prompt": "a", "scheduler": "heun", "sigmas": [0.9]})",
         "sigmas: heun (FlowMatchHeunDiscreteScheduler) takes no sigmas"},
        {R"({"prompt": "a", "scheduler_config": {"use_karas_sigmas": true}})",
         "scheduler_config: 'use_karas_sigmas' is not a key of FlowMatchEulerDiscreteScheduler"},
        {R"({"prompt": "a", "scheduler": "dpm++-2m", "scheduler_config": {"solver_order": 5}})",
         "dpm++-2m: 'solver_order' must be 1, 2 or 3"},
        {R"({"prompt": "a", "preset": "hyper-sd3-8step", "steps": 20})",
         "num_inference_steps 20, but preset hyper-sd3-8step fixes it at 8"},
        {R"({"prompt": "a", "preset": "hyper-sd3-8step"})",
         "num_inference_steps 1 (the job's), but preset hyper-sd3-8step fixes it at 8"},
        {R"({"prompt": "a", "preset": "hyper-sd3-8step", "guidance_scale": 7})",
         "guidance_scale 7, but preset hyper-sd3-8step fixes it at 5"},
        {R"({"prompt": "a", "preset": "qwen-image-lightning-8step"})",
         "key 'preset': preset qwen-image-lightning-8step is for the qwen-image family"},
        {R"({"prompt": "a", "preset": "lightning"})",
         "key 'preset': unknown preset 'lightning' (known: hyper-sd3-8step, qwen-image-lightning-8step, "
         "qwen-image-lightning-4step, flux-turbo-alpha, hyper-flux-8step"},
    };
    for (const Row& row : rows) {
        CAPTURE(std::string(row.line));
        const std::string prompts =
            write_file(dir + "/p.jsonl", "{\"prompt\": \"fine\"}\n" + std::string(row.line) + "\n");
        const LaunchResult refused = run_launch(tiny(dir + "/out", {prompts}));
        CHECK(refused.exit_code == 65);
        CHECK_MESSAGE(refused.err.find(prompts + ":2: " + row.why) != std::string::npos, refused.err);
        CHECK(refused.err.find(":1:") == std::string::npos);
        CHECK_FALSE(file_exists(dir + "/out/manifest.jsonl"));
    }
}

TEST_CASE("the job's scheduler flags and --preset that cannot run are usage errors (2)") {
    const std::string dir = make_temp_dir();
    const std::string prompts = write_file(dir + "/p.txt", "one\n");
    struct Row {
        std::vector<std::string> flags;
        const char* why;
    };
    const Row rows[] = {
        {{"--scheduler", "eulr"}, "--scheduler 'eulr': unknown scheduler 'eulr' (known: euler, heun"},
        {{"--sigmas", "0.5,0.9"}, "--sigmas 0.5,0.9: sigmas must decrease"},
        {{"--sigmas", "0.9,0.5", "--steps", "3"}, "--sigmas 0.9,0.5: sigmas: 2 values for 3 steps"},
        {{"--sigmas", "0.9", "--scheduler", "heun"},
         "--scheduler heun --sigmas 0.9: sigmas: heun (FlowMatchHeunDiscreteScheduler) takes no sigmas"},
        {{"--scheduler-config", R"({"nope": 1})"},
         "--scheduler-config {\"nope\":1}: scheduler_config: 'nope' is not a key of"},
        {{"--preset", "hyper-sd3-8step", "--steps", "20"},
         "--steps 20, but preset hyper-sd3-8step fixes num_inference_steps at 8"},
        {{"--preset", "hyper-sd3-8step", "--guidance-scale", "7"},
         "--guidance-scale 7, but preset hyper-sd3-8step fixes guidance_scale at 5"},
        {{"--preset", "flux-turbo-alpha"},
         "--preset flux-turbo-alpha: preset flux-turbo-alpha is for the flux family"},
        {{"--preset", "turbo"},
         "--preset: unknown preset 'turbo' (known: hyper-sd3-8step, qwen-image-lightning-8step"},
    };
    for (const Row& row : rows) {
        CAPTURE(std::string(row.why));
        std::vector<std::string> args = {"--model", DP_TINY_MODEL, "-o", dir + "/out", "-q"};
        args.insert(args.end(), row.flags.begin(), row.flags.end());
        args.push_back(prompts);
        const LaunchResult refused = run_launch(args);
        CHECK(refused.exit_code == 2);
        CHECK_MESSAGE(refused.err.find(row.why) != std::string::npos, refused.err);
        CHECK_FALSE(file_exists(dir + "/out/manifest.jsonl"));
    }
}

TEST_CASE("a line's sigmas set its steps, and records hold the scheduler resolved and the preset") {
    const std::string dir = make_temp_dir();
    const std::string prompts = write_file(dir + "/p.jsonl", R"({"prompt": "a", "sigmas": [0.9, 0.6, 0.3]})"
                                                             "\n"
                                                             R"({"prompt": "b", "scheduler": "unipc"})"
                                                             "\n"
                                                             R"({"prompt": "c", "preset": "hyper-sd3-8step"})"
                                                             "\n"
                                                             R"({"prompt": "d"})"
                                                             "\n");
    const LaunchResult run = run_launch(
        {"--model", DP_TINY_MODEL, "--width", "16", "--height", "16", "-o", dir + "/out", "-q", prompts}, {},
        120);
    REQUIRE_MESSAGE(run.exit_code == 0, run.err);
    const auto records = manifest_of(dir + "/out");
    REQUIRE(records.size() == 4);
    CHECK(records[0]["steps"] == 3);
    CHECK(records[0]["sigmas"] == nlohmann::json::array({0.9, 0.6, 0.3}));
    CHECK(records[0]["scheduler_resolved"]["class"] == "FlowMatchEulerDiscreteScheduler");
    CHECK(records[0]["scheduler_resolved"]["config"]["shift"] == 3.0);  // the model's own config
    CHECK(records[1]["scheduler"] == "unipc");
    CHECK(records[1]["scheduler_resolved"]["class"] == "UniPCMultistepScheduler");
    CHECK(records[1]["scheduler_resolved"]["config"]["flow_shift"] == 3.0);
    CHECK(records[1]["scheduler_resolved"]["config"]["use_flow_sigmas"] == true);
    CHECK(records[2]["preset"] == "hyper-sd3-8step");
    CHECK(records[2]["steps"] == 8);
    CHECK(records[2]["guidance_scale"] == 5.0);
    CHECK_FALSE(records[2].contains("scheduler_resolved"));
    CHECK_FALSE(records[3].contains("scheduler_resolved"));
    CHECK_FALSE(records[3].contains("preset"));
    CHECK(records[3]["steps"] == 28);  // SD3's default
    for (const nlohmann::json& r : records) CHECK(r["status"] == "ok");

    // A preset file of the user's, in the shipped format, as --preset.
    const std::string preset = write_file(dir + "/mine.json", R"({"name": "mine", "family": "sd3",
        "num_inference_steps": 2, "scheduler": "euler", "scheduler_config": {"use_karras_sigmas": true}})");
    const std::string one = write_file(dir + "/one.txt", "one\n");
    const LaunchResult own = run_launch({"--model", DP_TINY_MODEL, "--width", "16", "--height", "16", "-o",
                                         dir + "/own", "-q", "--preset", preset, one},
                                        {}, 120);
    REQUIRE_MESSAGE(own.exit_code == 0, own.err);
    const auto mine = manifest_of(dir + "/own");
    REQUIRE(mine.size() == 1);
    CHECK(mine[0]["preset"] == "mine");
    CHECK(mine[0]["steps"] == 2);
    CHECK(mine[0]["scheduler_resolved"]["config"]["use_karras_sigmas"] == true);
}

TEST_SUITE_END();
