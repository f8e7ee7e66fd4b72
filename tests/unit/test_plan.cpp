#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "cli/plan_command.h"
#include "launcher/job.h"

namespace {

std::string plan(int world, std::vector<std::string> flags) {
    dp::launcher::LaunchSpec launch;
    launch.num_processes = world;
    dp::launcher::JobOptions job;
    job.model = dp::launcher::resolve_model("tiny-random-sd3", "--model");
    job.width = 10;
    job.height = 9;
    for (std::size_t i = 0; i < flags.size(); ++i) {
        if (flags[i] == "--cfg-parallel") job.cfg_parallel = true;
        if (flags[i] == "--tp") job.tp = std::stoi(flags[++i]);
        if (flags[i] == "--ulysses") job.ulysses = std::stoi(flags[++i]);
        if (flags[i] == "--ring") job.ring = std::stoi(flags[++i]);
        if (flags[i] == "--strategy") job.strategy = flags[++i];
    }
    return dp::cli::describe_plan(launch, job);
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("plan: the mesh, each rank's role and the sub-groups") {
    const std::string p = plan(4, {"--ulysses", "2", "--tp", "2"});
    CHECK(has(p, "world: 4 rank(s) on 1 node(s); mesh dp=1 cfg=1 ring=1 ulysses=2 tp=2\n"));
    CHECK(has(p, "  rank 0: dp 0, cfg 0, ring 0, ulysses 0, tp 0 -- all prompts, writes the images\n"));
    CHECK(has(p, "  rank 3: dp 0, cfg 0, ring 0, ulysses 1, tp 1 -- all prompts\n"));
    CHECK(has(p, "  ulysses: [0,2] [1,3]\n"));
    CHECK(has(p, "  tp: [0,1] [2,3]\n"));
    CHECK(
        has(p, "transformer: 2 blocks, width 32, 4 heads of 8; 10x9 px -> 90 image tokens, 78 text tokens"));
    // dp 2 x cfg 2: the first rank of each pair writes; the shares are the dp coordinate.
    const std::string cfg = plan(4, {"--cfg-parallel"});
    CHECK(has(cfg,
              "  rank 0: dp 0, cfg 0, ring 0, ulysses 0, tp 0 -- prompt share 0 of 2, negative branch, "
              "writes the images\n"));
    CHECK(
        has(cfg, "  rank 1: dp 0, cfg 1, ring 0, ulysses 0, tp 0 -- prompt share 0 of 2, positive branch\n"));
    CHECK(has(cfg,
              "  rank 2: dp 1, cfg 0, ring 0, ulysses 0, tp 0 -- prompt share 1 of 2, negative branch, "
              "writes the images\n"));
    CHECK(has(plan(2, {}), "  none (data parallelism only)\n"));
    CHECK(has(plan(3, {"--strategy", "context"}), "mesh dp=1 cfg=1 ring=3 ulysses=1 tp=1"));
}

TEST_CASE("plan: the transformer parameters tensor parallelism splits, in closed form") {
    // The tiny model (D = 32, MLP 4D, 2 blocks, the last one context-pre-only: no text output or
    // text MLP). Column-parallel: q, k, v and their text twins (weight D x D and bias D each), the
    // MLPs' first layers (4D x D and 4D); row-parallel: the weights of the attention outputs
    // (D x D) and of the MLPs' second layers (D x 4D). Everything else (516368 bytes in all at
    // fp32) stays whole.
    const long long D = 32, qkv = 6 * (D * D + D), up = 4 * D * D + 4 * D, out = D * D, down = 4 * D * D;
    const long long split = (qkv + 2 * up + 2 * out + 2 * down) + (qkv + up + out + down);
    const long long all = 516368 / 4;
    for (int tp : {1, 2, 4}) {
        CAPTURE(tp);
        const long long per_rank = (all - split + split / tp) * 4;
        const std::string p = plan(tp, {"--tp", std::to_string(tp)});
        CHECK(has(p, "(" + std::to_string(per_rank) + ") = "));
        CHECK(has(p, "(" + std::to_string((all - split) * 4) + ") replicated + "));
        CHECK(has(p, "(" + std::to_string(split * 4) + ") / tp " + std::to_string(tp) + "\n"));
    }
    CHECK(has(plan(2, {"--tp", "2"}), "(434960) = "));
}
