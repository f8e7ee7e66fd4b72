// The memory guard (Note [memory guard], launcher/memory_guard.h): the ranks' weights at their tp
// share plus LibTorch's base against the memory available, given by the test; --force and GPU
// ranks are not checked.
#include <doctest/doctest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "launcher/job.h"
#include "launcher/launch_spec.h"
#include "launcher/memory_guard.h"
#include "protocol/errors.h"
#include "strategies/config_sizes.h"
#include "strategies/model_config.h"
#include "strategies/model_sizes.h"
#include "strategies/strategy.h"
#include "support/test_paths.h"
#include "unit/temp_dir.h"

using namespace dp::launcher;

namespace {

// What check_memory_fits says for `ranks` CPU ranks of the tiny SD3 model at tp `tp` with
// `available` bytes; "" when it lets them start.
std::string verdict(int ranks, int tp, int64_t available, bool force = false,
                    const std::string& device = "cpu") {
    LaunchSpec launch;
    launch.num_processes = ranks;
    ResolvedJob job;
    job.options.model = std::string(DP_GOLDEN_DIR) + "/sd3_tiny";
    job.options.device = device;
    job.options.force = force;
    job.model = dp::strategies::read_model_info(job.options.model);
    job.left_out = dp::strategies::components_left_out(job.options.model, *job.model.spec, false);
    job.strategy.degrees.tp = tp;
    job.dtype = "fp32";
    try {
        check_memory_fits(launch, job, available);
    } catch (const dp::protocol::UsageError& e) {
        CHECK(e.exit_code() == 2);
        return e.what();
    }
    return "";
}

}  // namespace

TEST_CASE(
    "the memory guard refuses ranks that need more than is available, naming the figures and what fits") {
    const int64_t base = kSharedLibraryBytes + kRankBaseBytes;
    CHECK(verdict(1, 1, 64LL << 30).empty());
    CHECK(verdict(300, 1, 64LL << 30).empty());  // 198 MiB + 300 x (191 MiB + 1.4 MiB of weights) < 64 GiB
    const std::string refused = verdict(300, 1, 23LL << 30);
    CAPTURE(refused);
    CHECK(refused.find("300 rank(s) on this machine would need about 56.") != std::string::npos);
    CHECK(refused.find("of weights in fp32 and about 191 MiB of LibTorch's own") != std::string::npos);
    // (23 GiB - 198 MiB) / 192.4 MiB = 121.3
    CHECK(refused.find("and 23.0 GiB is available; start at most 121 rank(s) here (-n 121)") !=
          std::string::npos);
    CHECK(refused.find("--force") != std::string::npos);
    // Exactly at the edge: one rank's base fits, two do not.
    CHECK(verdict(1, 1, base + (4LL << 20)).empty());
    CHECK(verdict(2, 1, base + (4LL << 20)).find("start at most 1 rank(s)") != std::string::npos);
    CHECK(verdict(2, 1, kSharedLibraryBytes).find("no rank fits") != std::string::npos);
    // --force starts them anyway; ranks on GPUs keep their weights there.
    CHECK(verdict(300, 1, 1LL << 30, true).empty());
    CHECK(verdict(300, 1, 1LL << 30, false, "cuda").empty());
}

TEST_CASE("the memory guard counts the transformer and the tp-split components at their tp share") {
    const std::string dir = std::string(DP_GOLDEN_DIR) + "/sd3_tiny";
    const dp::strategies::ModelInfo model = dp::strategies::read_model_info(dir);
    int64_t whole = 0, split = 0;
    for (const auto& c : dp::strategies::pipeline_component_sizes(dir, *model.spec, 4)) {
        const bool by_tp = c.name == model.spec->transformer ||
                           std::find(model.spec->tp_components.begin(), model.spec->tp_components.end(),
                                     c.name) != model.spec->tp_components.end();
        (by_tp ? split : whole) += c.bytes;
    }
    REQUIRE(split > 0);
    const int64_t fixed = kSharedLibraryBytes + kRankBaseBytes + whole;
    // One rank at tp 2 needs the split components' half: it fits where the whole would not.
    const int64_t room = fixed + (split + 1) / 2 + 16;
    CHECK(verdict(1, 2, room).empty());
    CHECK_FALSE(verdict(1, 1, room).empty());
}

// Note [sizes from configs]: a component's count from its config.json alone, against what
// diffusers and transformers wrote for the same config: the shipped tensor manifests of the real
// models and the tiny models' weight files.
TEST_CASE("sizes from configs: every class's count equals its tensor manifest or weight files") {
    int counted = 0;
    for (const char* name :
         {"sd3-medium", "sd3.5-medium", "sd3.5-large", "flux.1-dev", "flux.1-schnell", "qwen-image",
          "tiny-random-sd3", "tiny-random-flux-dev", "tiny-random-flux-schnell", "tiny-random-qwen-image",
          "tiny-random-flux2-klein", "shapes-sd3"}) {
        const std::string dir = resolve_model(name, "--model");
        const dp::strategies::ModelInfo model = dp::strategies::read_model_info(dir);
        const dp::strategies::ParallelSpec& spec = *model.spec;
        for (const std::string& component : spec.components) {
            CAPTURE(name);
            CAPTURE(component);
            const std::optional<int64_t> from_config =
                dp::strategies::config_parameters(dir, spec, component);
            std::vector<std::string> others;
            for (const std::string& c : spec.components)
                if (c != component) others.push_back(c);
            const auto from_files = dp::strategies::pipeline_component_sizes(dir, spec, 1, "", others);
            if (from_files.empty()) {  // not in this model (no VAE, no T5)
                CHECK_FALSE(from_config);
                continue;
            }
            // Every class but Qwen-Image's VAE (0.1 B parameters, read from its manifest) is counted;
            // of FLUX.2-klein's, the transformer (its Qwen3 and its VAE are read from their files).
            const bool flux2_other = spec.family == "flux2-klein" && component != "transformer";
            CHECK(from_config.has_value() ==
                  ((component != "vae" || spec.family != "qwen-image") && !flux2_other));
            if (!from_config) continue;
            CHECK(*from_config == from_files.front().bytes);
            ++counted;
        }
    }
    CHECK(counted == 43);
}

TEST_CASE(
    "the memory guard counts random weights from the configs, a config-only folder without manifests too") {
    // tiny-random-sd3's configs alone, its transformer claiming 2000 blocks of width 4096.
    const dp::test::TempDir dir("random_weights");
    const std::string model = dir.path + "/model";
    REQUIRE(std::system(("cp -r '" + resolve_model("tiny-random-sd3", "--model") + "' '" + model +
                         "' && find '" + model + "' -name '*.safetensors' -delete")
                            .c_str()) == 0);
    const auto job_on = [&](bool random) {
        ResolvedJob job;
        job.options.model = model;
        job.options.device = "cpu";
        if (random) job.options.random_weights = 1;
        job.model = dp::strategies::read_model_info(model);
        job.left_out = dp::strategies::components_left_out(model, *job.model.spec, false);
        job.dtype = "fp32";
        return job;
    };
    LaunchSpec launch;
    launch.num_processes = 1;
    // As it is: 2.1 MiB of random weights fit; without them the sizes cannot be read (the job
    // refuses the folder elsewhere) and nothing is said here.
    CHECK_NOTHROW(check_memory_fits(launch, job_on(true), 1LL << 30));
    CHECK_NOTHROW(check_memory_fits(launch, job_on(false), 1));
    nlohmann::json config = nlohmann::json::parse(dir.read("model/transformer/config.json"));
    config["num_layers"] = 2000;
    config["num_attention_heads"] = 64;
    config["attention_head_dim"] = 64;
    dir.write("model/transformer/config.json", config.dump());
    try {
        check_memory_fits(launch, job_on(true), 64LL << 30);
        FAIL("expected a refusal");
    } catch (const dp::protocol::UsageError& e) {
        const std::string what = e.what();
        CHECK(what.find("1 rank(s) on this machine would need about ") != std::string::npos);
        CHECK(what.find("no rank fits") != std::string::npos);
    }
}
