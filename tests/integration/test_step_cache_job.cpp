// The step cache through real dp-launch and dp-worker processes: --cache and a prompt line's
// "cache" give diffusers' first-block-cached FLUX.1-dev image (scripts/golden/golden_step_cache.py)
// over two data-parallel ranks and under --ulysses 2, and TaylorSeer's; each record holds the cache
// and the passes computed in full; --resume sees another cache as other pixels; dp-launch compare measures
// what the cache costs and fails a budget the pair falls below; a cache that does not exist is a usage error
// before anything starts. MagCache: calibration over two ranks records diffusers' ratios and writes their
// mean to OUTPUT/mag_ratios.json, which the next run reads; FLUX.1's published ratios give diffusers'
// MagCache image under --ulysses 2 (scripts/golden/golden_mag_cache.py).
#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "integration/job_outputs.h"
#include "integration/launch_harness.h"
#include "support/test_paths.h"

// Images and records only: ctest may run these beside other tests (tests/CMakeLists.txt).
TEST_SUITE_BEGIN("parallel_safe");

using namespace dp::test;

namespace {

std::string golden_file() { return std::string(DP_GOLDEN_DIR) + "/step_cache_pipeline.safetensors"; }

// `copies` lines of the golden FLUX call; `cache`: each line's own "cache", when given.
std::string prompt_file(const std::string& path, int copies, const nlohmann::json& cache = nullptr) {
    const nlohmann::json c =
        nlohmann::json::parse(read_safetensors_metadata(golden_file(), "cases")).at("flux_cached");
    nlohmann::json line = golden_line(c);
    if (!cache.is_null()) line["cache"] = cache;
    return write_lines(path, std::vector<nlohmann::json>(static_cast<std::size_t>(copies), line));
}

}  // namespace

TEST_CASE(
    "step cache: diffusers' cached image over ranks, recorded with the passes computed, and compare fails a "
    "budget") {
    const std::string dir = make_temp_dir();
    const std::string model = std::string(DP_MODELS_DIR) + "/tiny-random-flux-dev";
    const std::string plain = prompt_file(dir + "/p.jsonl", 2);
    const std::string keyed =
        prompt_file(dir + "/k.jsonl", 2, {{"type", "first_block_cache"}, {"threshold", 0.49}});
    struct Run {
        std::vector<std::string> args;
        std::string out;
    };
    const std::vector<Run> runs = {
        {{"-n", "2", "--cache", "first_block_cache:threshold=0.49", plain}, dir + "/flag"},
        {{"-n", "2", "--ulysses", "2", keyed}, dir + "/key"},
    };
    for (const Run& run : runs) {
        CAPTURE(run.out);
        std::vector<std::string> args = {"--model", model, "-o", run.out, "-q"};
        args.insert(args.end(), run.args.begin(), run.args.end());
        LaunchResult r = run_launch(args, {{"DP_SAVE_LATENTS", "1"}}, 240);
        REQUIRE_MESSAGE(r.exit_code == 0, r.err);
        const auto records = read_manifest(run.out);
        REQUIRE(records.size() == 2);
        for (const auto& record : records) {
            CHECK(record.at("cache") == "first_block_cache:threshold=0.49");
            CHECK(record.at("computed_steps") == 4);  // diffusers' decisions: 4 of 8
            const std::string file = run.out + "/" + record.at("file").get<std::string>();
            CHECK(max_difference(read_latents(file + ".latents.safetensors"),
                                 golden_f32(golden_file(), "flux_cached.latents")) <= 1e-4f);
        }
    }
    // TaylorSeer with diffusers' defaults: its attentions run on 4 of the 8 passes.
    LaunchResult taylor =
        run_launch({"--model", model, "--cache", "taylorseer_cache", "-o", dir + "/taylor", "-q", plain},
                   {{"DP_SAVE_LATENTS", "1"}}, 120);
    REQUIRE_MESSAGE(taylor.exit_code == 0, taylor.err);
    for (const auto& record : read_manifest(dir + "/taylor")) {
        CHECK(record.at("cache") ==
              "taylorseer_cache:cache_interval=5,disable_cache_before_step=3,max_order=1,taylor_factors_"
              "dtype=bfloat16");
        CHECK(record.at("computed_steps") == 4);
        const std::string file = dir + "/taylor/" + record.at("file").get<std::string>();
        CHECK(max_difference(read_latents(file + ".latents.safetensors"),
                             golden_f32(golden_file(), "flux_taylorseer.latents")) <= 1e-3f);
    }
    // Without the cache: no count in the records; --resume of the cached folder without it is refused.
    LaunchResult full = run_launch({"--model", model, "-o", dir + "/full", "-q", plain}, {}, 120);
    REQUIRE_MESSAGE(full.exit_code == 0, full.err);
    CHECK_FALSE(read_manifest(dir + "/full")[0].contains("computed_steps"));
    LaunchResult resume =
        run_launch({"--model", model, "-o", dir + "/flag", "--resume", "-q", plain}, {}, 120);
    CHECK(resume.exit_code == 2);
    CHECK_MESSAGE(resume.err.find("cache") != std::string::npos, resume.err);
    // compare: the cache's cost in PSNR and SSIM; a budget it misses makes it exit 1.
    LaunchResult within = run_launch({"compare", dir + "/full", dir + "/flag", "--min-psnr", "30"}, {}, 60);
    CHECK_MESSAGE(within.exit_code == 0, within.out << within.err);
    CHECK(within.out.find("2 pairs") != std::string::npos);
    CHECK(file_exists(dir + "/flag/compare.html"));
    LaunchResult beyond = run_launch({"compare", dir + "/full", dir + "/flag", "--min-psnr", "90"}, {}, 60);
    CHECK(beyond.exit_code == 1);
    CHECK(beyond.out.find("below the budget") != std::string::npos);
    // A cache that does not exist, or is not built: refused before anything starts.
    for (const char* bad : {"teacache", "mag_cache:threshold=0.1", "taylorseer_cache:cache_interval=0",
                            "first_block_cache:threshold=-1"}) {
        LaunchResult r =
            run_launch({"--model", model, "--cache", bad, "-o", dir + "/none", "-q", plain}, {}, 60);
        CHECK(r.exit_code == 2);
        CHECK_MESSAGE(r.err.find("--cache") != std::string::npos, r.err);
        CHECK_FALSE(file_exists(dir + "/none"));
    }
    remove_dir(dir);
}

TEST_CASE("MagCache: calibration writes the ratios the next run reads, and FLUX.1's give diffusers' image") {
    const std::string dir = make_temp_dir();
    const std::string model = std::string(DP_MODELS_DIR) + "/tiny-random-flux-dev";
    const std::string mag_golden = std::string(DP_GOLDEN_DIR) + "/mag_cache_pipeline.safetensors";
    const nlohmann::json cases = nlohmann::json::parse(read_safetensors_metadata(mag_golden, "cases"));
    const std::string prompts = prompt_file(dir + "/p.jsonl", 2);
    LaunchResult calibrate = run_launch({"--model", model, "-n", "2", "--cache", "mag_cache:calibrate=true",
                                         "-o", dir + "/calibrate", prompts},
                                        {}, 240);
    REQUIRE_MESSAGE(calibrate.exit_code == 0, calibrate.err);
    CHECK_MESSAGE(calibrate.err.find("mag_ratios.json") != std::string::npos, calibrate.err);
    const std::vector<double> theirs =
        cases.at("flux_calibrate").at("mag_ratios").at("cond").get<std::vector<double>>();
    for (const auto& record : read_manifest(dir + "/calibrate")) {
        CHECK(record.at("cache") == "mag_cache:calibrate=true");
        CHECK(record.at("computed_steps") == 8);  // nothing skipped
        const std::vector<double> mine = record.at("mag_ratios").get<std::vector<double>>();
        REQUIRE(mine.size() == theirs.size());
        for (std::size_t s = 0; s < mine.size(); ++s)
            CHECK(mine[s] == doctest::Approx(theirs[s]).epsilon(1e-5));
    }
    std::ifstream in(dir + "/calibrate/mag_ratios.json");
    const nlohmann::json written = nlohmann::json::parse(in, nullptr, false);
    REQUIRE(written.is_object());
    CHECK(written.at("images") == 2);
    CHECK(written.at("steps") == 8);
    REQUIRE(written.at("mag_ratios").size() == theirs.size());
    for (std::size_t s = 0; s < theirs.size(); ++s)
        CHECK(written.at("mag_ratios")[s].get<double>() == doctest::Approx(theirs[s]).epsilon(1e-5));
    // The next run reads the file; its records hold the ratios themselves, not the path.
    LaunchResult next =
        run_launch({"--model", model, "--cache",
                    "mag_cache:mag_ratios=" + dir + "/calibrate/mag_ratios.json,threshold=0.2", "-o",
                    dir + "/next", "-q", prompts},
                   {}, 120);
    REQUIRE_MESSAGE(next.exit_code == 0, next.err);
    for (const auto& record : read_manifest(dir + "/next")) {
        const std::string cache = record.at("cache");
        CHECK(cache.rfind("mag_cache:threshold=0.2,max_skip_steps=3,retention_ratio=0.2,mag_ratios=1 ", 0) ==
              0);
        CHECK(record.at("computed_steps") < 8);
        CHECK_FALSE(record.contains("mag_ratios"));
    }
    // FLUX.1's published ratios, taken to 8 steps: diffusers' MagCache latents, over the sequence.
    LaunchResult flux = run_launch({"--model", model, "-n", "2", "--ulysses", "2", "--cache",
                                    "mag_cache:mag_ratios=flux", "-o", dir + "/flux", "-q", prompts},
                                   {{"DP_SAVE_LATENTS", "1"}}, 240);
    REQUIRE_MESSAGE(flux.exit_code == 0, flux.err);
    for (const auto& record : read_manifest(dir + "/flux")) {
        CHECK(record.at("computed_steps") == cases.at("flux_mag").at("computed_steps"));
        const std::string file = dir + "/flux/" + record.at("file").get<std::string>();
        CHECK(max_difference(read_latents(file + ".latents.safetensors"),
                             golden_f32(mag_golden, "flux_mag.latents")) <= 1e-4f);
    }
    // Ratios that cannot be read: a usage error naming the file, before anything starts.
    LaunchResult missing =
        run_launch({"--model", model, "--cache", "mag_cache:mag_ratios=" + dir + "/nothing.json", "-o",
                    dir + "/none", "-q", prompts},
                   {}, 60);
    CHECK(missing.exit_code == 2);
    CHECK_MESSAGE(missing.err.find("nothing.json' does not exist") != std::string::npos, missing.err);
    CHECK_FALSE(file_exists(dir + "/none"));
    remove_dir(dir);
}

TEST_SUITE_END();
