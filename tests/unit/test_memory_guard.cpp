// The memory guard (Note [memory guard], launcher/memory_guard.h): the ranks' weights at their tp
// share plus LibTorch's base against the memory available, given by the test; --force and GPU
// ranks are not checked.
#include <doctest/doctest.h>

#include <string>

#include "launcher/job.h"
#include "launcher/launch_spec.h"
#include "launcher/memory_guard.h"
#include "protocol/errors.h"
#include "strategies/model_config.h"
#include "strategies/model_sizes.h"
#include "strategies/strategy.h"
#include "support/test_paths.h"

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
