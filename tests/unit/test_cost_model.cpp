// The cost model: prompt costs, the dynamic order and units, and each schedule's makespan, against
// figures worked out by hand.
#include <doctest/doctest.h>

#include <stdexcept>
#include <vector>

#include "strategies/cost_model.h"
#include "strategies/family.h"
#include "strategies/parallel_spec.h"

using namespace dp::strategies;
using dp::protocol::JobRequest;

namespace {

JobRequest request(int64_t index, int steps, int width, int height, double guidance = 7.0) {
    JobRequest r;
    r.index = index;
    r.steps = steps;
    r.width = width;
    r.height = height;
    r.arguments.set("guidance_scale", guidance);
    return r;
}

// The built-in model's geometry: pixel space (no VAE), patch 4, 32 px by default.
CostRules shapes_rules() {
    ImageSizeRule sizes;
    sizes.vae_scale = 1;
    sizes.patch_size = 4;
    sizes.default_side = 32;
    return cost_rules(sizes, dp::strategies::family_arguments("sd3"));
}

}  // namespace

TEST_CASE("a prompt costs its passes x image tokens, twice with classifier-free guidance, Heun two a step") {
    const CostRules shapes = shapes_rules();
    CHECK(shapes.pixels_per_token == 4);
    // 64x32 px at patch 4: 16 x 8 = 128 tokens; 10 steps; SD3's guidance 7 runs two branches.
    CHECK(prompt_cost(request(0, 10, 64, 32), shapes) == 10 * 128 * 2);
    CHECK(prompt_cost(request(0, 10, 64, 32, 1.0), shapes) == 10 * 128);  // scale 1: one branch
    // Width and height 0: the model's default side, 32 px: 8 x 8 tokens.
    CHECK(prompt_cost(request(0, 3, 0, 0), shapes) == 3 * 64 * 2);
    // A latent model: VAE scale 8, patch 2: 16 px per token, 1024x1024 px -> 4096 tokens.
    ImageSizeRule latent;
    latent.vae_scale = 8;
    latent.patch_size = 2;
    latent.default_side = 1024;
    const CostRules sd3 = cost_rules(latent, dp::strategies::family_arguments("sd3"));
    CHECK(prompt_cost(request(0, 28, 0, 0), sd3) == 28 * 4096 * 2);

    // Qwen-Image's true CFG runs its second branch only with a negative prompt given.
    const CostRules qwen = cost_rules(latent, dp::strategies::family_arguments("qwen-image"));
    CHECK(qwen.arguments.guidance_scale()->row->name == std::string("true_cfg_scale"));
    JobRequest q = request(0, 50, 1024, 1024, 1.0);
    q.arguments = {};
    q.arguments.set("true_cfg_scale", 4.0);
    CHECK(prompt_cost(q, qwen) == 50 * 4096);
    q.negative_prompt = "";
    CHECK(prompt_cost(q, qwen) == 50 * 4096 * 2);
    q.arguments.set("true_cfg_scale", 1.0);
    CHECK(prompt_cost(q, qwen) == 50 * 4096);
    // Heun makes two passes a step but the first: 99 for 50 steps; a multistep solver one a step.
    dp::protocol::SchedulerChoice heun, dpm;
    heun.name = "heun", dpm.name = "dpm++-2m";
    q.arguments.set("scheduler", heun);
    CHECK(prompt_cost(q, qwen) == 99 * 4096);
    q.arguments.set("scheduler", dpm);
    CHECK(prompt_cost(q, qwen) == 50 * 4096);
    CHECK_THROWS_AS(prompt_cost(request(0, 1, 0, 0),
                                cost_rules(ImageSizeRule{}, dp::strategies::family_arguments("sd3"))),
                    std::invalid_argument);
}

TEST_CASE("the dynamic order is the costliest first, equal costs in the job's order") {
    CHECK(dynamic_order({3, 5, 3, 9, 5}) == std::vector<std::size_t>{3, 1, 4, 0, 2});
    CHECK(dynamic_order({}).empty());
    CHECK(dynamic_order({2, 2, 2}) == std::vector<std::size_t>{0, 1, 2});
}

TEST_CASE("dynamic units batch consecutive prompts of the order that share their settings") {
    // Positions 0, 2, 3 are alike (8 steps); 1 has 32 steps; 4 is another size.
    const std::vector<JobRequest> requests = {request(0, 8, 32, 32), request(1, 32, 32, 32),
                                              request(2, 8, 32, 32), request(3, 8, 32, 32),
                                              request(4, 8, 64, 32)};
    const std::vector<int64_t> costs = prompt_costs(requests, shapes_rules());
    const std::vector<std::size_t> order = dynamic_order(costs);
    CHECK(order == std::vector<std::size_t>{1, 4, 0, 2, 3});
    CHECK(work_units(requests, order, 1) == std::vector<std::vector<std::size_t>>{{1}, {4}, {0}, {2}, {3}});
    CHECK(work_units(requests, order, 2) == std::vector<std::vector<std::size_t>>{{1}, {4}, {0, 2}, {3}});
    CHECK(work_units(requests, order, 8) == std::vector<std::vector<std::size_t>>{{1}, {4}, {0, 2, 3}});
}

TEST_CASE("makespans: the static split's costliest share, list scheduling, the ideal") {
    // One prompt of 8 among seven of 1, first in the file, over 2 replicas. Static: shares [0, 4)
    // and [4, 8) cost 8+1+1+1 = 11 and 4. Dynamic: the 8 goes to replica 0, the seven 1s to
    // replica 1 (free first each time): 8. Ideal: 15 / 2.
    const std::vector<int64_t> costs = {8, 1, 1, 1, 1, 1, 1, 1};
    std::vector<std::vector<std::size_t>> units;
    for (const std::size_t k : dynamic_order(costs)) units.push_back({k});
    Makespans m = makespans(costs, units, 2);
    CHECK(m.total == 15);
    CHECK(m.static_split == 11);
    CHECK(m.dynamic == 8);
    CHECK(m.ideal == doctest::Approx(7.5));
    CHECK(m.costs_differ);
    CHECK(auto_schedule(m) == "dynamic");

    // Five prompts over 3 replicas, accelerate's shares {2, 2, 1}: [4, 4 | 2, 2 | 3] -> 8, 4, 3.
    // Dynamic, order 4 4 3 2 2: replicas take 4, 4, 3; then the one free at 3 takes 2 (5), then
    // the one free at 4 (replica 0) takes 2 (6).
    const std::vector<int64_t> five = {4, 4, 2, 2, 3};
    units.clear();
    for (const std::size_t k : dynamic_order(five)) units.push_back({k});
    m = makespans(five, units, 3);
    CHECK(m.static_split == 8);
    CHECK(m.dynamic == 6);
    CHECK(m.ideal == doctest::Approx(5.0));

    // A unit of two prompts is one turn of a replica: {4+4} then {2}, {2}, {3} over 2.
    m = makespans(five, {{0, 1}, {4}, {2}, {3}}, 2);
    CHECK(m.dynamic == 8);  // replica 0: 8; replica 1: 3 + 2 + 2 = 7

    // Equal costs: auto stays static; one replica: every schedule is the total.
    const std::vector<int64_t> even = {5, 5, 5};
    m = makespans(even, {{0}, {1}, {2}}, 1);
    CHECK_FALSE(m.costs_differ);
    CHECK(auto_schedule(m) == "static");
    CHECK(m.static_split == 15);
    CHECK(m.dynamic == 15);
    CHECK_THROWS_AS(makespans(even, {}, 0), std::invalid_argument);
}

TEST_CASE("makespans count a replica's switch to another adapter set") {
    // Four prompts of cost 10: sets 1, 2, 1, 2 (ids), a switch costs 5.
    const std::vector<int64_t> costs = {10, 10, 10, 10};
    const std::vector<std::size_t> sets = {1, 2, 1, 2};
    // One replica, the units grouped: 1, 1, 2, 2: two switches (none -> 1 -> 2).
    Makespans m = makespans(costs, {{0}, {2}, {1}, {3}}, 1, sets, 5);
    CHECK(m.dynamic == 40 + 2 * 5);
    CHECK(m.static_split == 40 + 2 * 5);
    // Not grouped, it switches at every unit.
    m = makespans(costs, {{0}, {1}, {2}, {3}}, 1, sets, 5);
    CHECK(m.dynamic == 40 + 4 * 5);
    // No adapters: no switch, whatever the cost.
    m = makespans(costs, {{0}, {1}, {2}, {3}}, 1, {0, 0, 0, 0}, 5);
    CHECK(m.dynamic == 40);
    // Two replicas, two sets of four units (grouped): each replica keeps to one set, one switch
    // each; list scheduling in order would have switched both of them twice.
    const std::vector<int64_t> eight(8, 10);
    const std::vector<std::vector<std::size_t>> grouped = {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}};
    m = makespans(eight, grouped, 2, {1, 1, 1, 1, 2, 2, 2, 2}, 5);
    CHECK(m.dynamic == 4 * 10 + 5);
    // Uneven sets (six and two units): replica 1 finishes set 2, then helps with set 1 (a switch).
    m = makespans(eight, grouped, 2, {1, 1, 1, 1, 1, 1, 2, 2}, 5);
    CHECK(m.dynamic == 5 + 2 * 10 + 5 + 2 * 10);
    // The ids: 0 for none, then in order of first appearance.
    std::vector<dp::protocol::JobRequest> requests(4);
    requests[1].arguments.set("lora", dp::protocol::Adapters{{"b", 1.0, ""}});
    requests[2].arguments.set("lora", dp::protocol::Adapters{{"a", 1.0, ""}});
    requests[3].arguments.set("lora", dp::protocol::Adapters{{"b", 1.0, ""}});
    CHECK(adapter_set_ids(requests) == std::vector<std::size_t>{0, 1, 2, 1});
}

TEST_CASE(
    "claims by adapter set: each set's run, the first set by replica, the next one in order and round") {
    const std::vector<std::vector<std::size_t>> units = {{0}, {1}, {2}, {3}, {4}};
    const std::vector<Range> runs = adapter_set_runs(units, {0, 0, 2, 1, 1});
    REQUIRE(runs.size() == 3);
    CHECK((runs[0].begin == 0 && runs[0].end == 2));
    CHECK((runs[1].begin == 2 && runs[1].end == 3));
    CHECK((runs[2].begin == 3 && runs[2].end == 5));
    CHECK(adapter_set_runs({}, {}).empty());
    CHECK(first_claim_set(0, 3) == 0);
    CHECK(first_claim_set(4, 3) == 1);
    CHECK(first_claim_set(5, 0) == 0);
    CHECK(next_claim_set(1, {false, true, false}) == 2);
    CHECK(next_claim_set(2, {false, true, true}) == 0);
    CHECK(next_claim_set(0, {true, true, true}) == 3);
}
