#include "strategies/cost_model.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <numeric>
#include <queue>
#include <set>
#include <stdexcept>
#include <utility>

#include "strategies/family.h"
#include "strategies/work_split.h"

namespace dp::strategies {

CostRules cost_rules(const ImageSizeRule& sizes, const protocol::FamilyArguments& arguments) {
    CostRules rules;
    rules.pixels_per_token = std::max<int64_t>(1, sizes.multiple());
    rules.default_side = sizes.default_side;
    rules.arguments = arguments;
    const int64_t side = std::max<int64_t>(1, sizes.default_side / rules.pixels_per_token);
    rules.adapter_switch = 2 * side * side;
    if (!arguments.family().empty())
        rules.reference_size = facts_of(family_spec(arguments.family())).reference_size;
    return rules;
}

bool runs_two_branches(const protocol::JobRequest& request, const CostRules& rules) {
    return rules.arguments.runs_two_branches(request.arguments, request.negative_prompt.has_value());
}

int64_t reference_tokens(const CostRules& rules, const protocol::InputImage& image) {
    int64_t tokens = 0;
    for (const protocol::InputImage& picture : image.pictures()) {  // Note [several input images]
        if (!rules.reference_size || picture.width < 1 || picture.height < 1) continue;
        const auto [w, h] = rules.reference_size(picture.width, picture.height, rules.pixels_per_token);
        tokens += (w / rules.pixels_per_token) * (h / rules.pixels_per_token);
    }
    return tokens;
}

int64_t model_passes(int64_t steps, const protocol::CallValues& arguments) {
    const protocol::SchedulerKind* kind =
        protocol::find_scheduler_kind(arguments.scheduler("scheduler").name);
    const int64_t order = kind ? kind->order : 1;
    return steps > 0 ? steps * order - (order - 1) : steps;
}

int64_t prompt_cost(const protocol::JobRequest& request, const CostRules& rules) {
    const int64_t width = request.width > 0 ? request.width : rules.default_side;
    const int64_t height = request.height > 0 ? request.height : rules.default_side;
    if (width <= 0 || height <= 0 || request.steps < 0)
        throw std::invalid_argument("prompt " + std::to_string(request.index) + ": size " +
                                    std::to_string(width) + "x" + std::to_string(height) + " and " +
                                    std::to_string(request.steps) + " steps have no cost");
    const int64_t tokens = std::max<int64_t>(1, width / rules.pixels_per_token) *
                           std::max<int64_t>(1, height / rules.pixels_per_token);
    // An edit from its image runs the steps its strength leaves, and its image's encoder pass
    // (counted as one); a reference image makes every step's sequence longer by its tokens.
    const protocol::InputImage& image = request.arguments.image("image");
    int64_t steps = request.steps, step_tokens = tokens;
    if (!image.empty() && request.arguments.has("strength"))
        steps -= protocol::edit_first_step(request.steps, request.arguments.number("strength"));
    steps = model_passes(steps, request.arguments);
    if (!image.empty()) steps += 1;
    if (!image.empty()) step_tokens += reference_tokens(rules, image);
    return steps * step_tokens * (runs_two_branches(request, rules) ? 2 : 1);
}

std::vector<int64_t> prompt_costs(const std::vector<protocol::JobRequest>& requests, const CostRules& rules) {
    std::vector<int64_t> costs;
    costs.reserve(requests.size());
    for (const protocol::JobRequest& r : requests) costs.push_back(prompt_cost(r, rules));
    return costs;
}

std::vector<std::size_t> dynamic_order(const std::vector<int64_t>& costs) {
    std::vector<std::size_t> order(costs.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return costs[a] > costs[b]; });
    return order;
}

std::vector<std::size_t> grouped_by_adapters(const std::vector<protocol::JobRequest>& requests,
                                             const std::vector<std::size_t>& order) {
    std::vector<const protocol::Adapters*> sets;  // in the order of their first request
    std::vector<std::size_t> set_of(order.size());
    for (std::size_t i = 0; i < order.size(); ++i) {
        const protocol::Adapters& mine = requests[order[i]].arguments.adapters("lora");
        const auto it =
            std::find_if(sets.begin(), sets.end(), [&](const protocol::Adapters* s) { return *s == mine; });
        set_of[i] = static_cast<std::size_t>(it - sets.begin());
        if (it == sets.end()) sets.push_back(&mine);
    }
    if (sets.size() < 2) return order;
    std::vector<std::size_t> positions(order.size());
    std::iota(positions.begin(), positions.end(), std::size_t{0});
    std::stable_sort(positions.begin(), positions.end(),
                     [&](std::size_t a, std::size_t b) { return set_of[a] < set_of[b]; });
    std::vector<std::size_t> out;
    out.reserve(order.size());
    for (std::size_t p : positions) out.push_back(order[p]);
    return out;
}

std::vector<std::vector<std::size_t>> work_units(const std::vector<protocol::JobRequest>& requests,
                                                 const std::vector<std::size_t>& order, int batch_size) {
    std::vector<std::vector<std::size_t>> units;
    for (const std::size_t k : order) {
        if (!units.empty()) {
            std::vector<std::size_t>& last = units.back();
            if (static_cast<int>(last.size()) < batch_size &&
                protocol::same_batch_settings(requests[k], requests[last.front()])) {
                last.push_back(k);
                continue;
            }
        }
        units.push_back({k});
    }
    return units;
}

std::vector<std::size_t> adapter_set_ids(const std::vector<protocol::JobRequest>& requests) {
    std::vector<const protocol::Adapters*> seen;
    std::vector<std::size_t> ids;
    ids.reserve(requests.size());
    for (const protocol::JobRequest& r : requests) {
        const protocol::Adapters& mine = r.arguments.adapters("lora");
        if (mine.empty()) {
            ids.push_back(0);
            continue;
        }
        const auto it =
            std::find_if(seen.begin(), seen.end(), [&](const protocol::Adapters* s) { return *s == mine; });
        ids.push_back(static_cast<std::size_t>(it - seen.begin()) + 1);
        if (it == seen.end()) seen.push_back(&mine);
    }
    return ids;
}

Makespans makespans(const std::vector<int64_t>& costs, const std::vector<std::vector<std::size_t>>& units,
                    int replicas, const std::vector<std::size_t>& sets, int64_t switch_cost) {
    const auto set_of = [&](std::size_t k) { return k < sets.size() ? sets[k] : 0; };
    if (replicas < 1) throw std::invalid_argument("makespans: need at least one replica");
    Makespans m;
    m.total = std::accumulate(costs.begin(), costs.end(), int64_t{0});
    m.ideal = static_cast<double>(m.total) / replicas;
    m.costs_differ = std::any_of(costs.begin(), costs.end(), [&](int64_t c) { return c != costs.front(); });
    const int64_t n = static_cast<int64_t>(costs.size());
    for (int r = 0; r < replicas; ++r) {
        const Range share = split_between_processes(n, replicas, r);
        int64_t cost = std::accumulate(costs.begin() + share.begin, costs.begin() + share.end, int64_t{0});
        // The share runs grouped by set (grouped_by_adapters): one switch to each set it has.
        std::set<std::size_t> share_sets;
        for (int64_t k = share.begin; k < share.end; ++k)
            if (set_of(static_cast<std::size_t>(k))) share_sets.insert(set_of(static_cast<std::size_t>(k)));
        cost += switch_cost * static_cast<int64_t>(share_sets.size());
        m.static_split = std::max(m.static_split, cost);
    }
    // Each replica's finish time (the earliest, then the lowest replica, on top), its last set and
    // the set it claims from (Note [claims by adapter set]).
    std::vector<std::size_t> unit_sets;
    for (const std::vector<std::size_t>& unit : units)
        unit_sets.push_back(unit.empty() ? 0 : set_of(unit.front()));
    const std::vector<Range> runs = adapter_set_runs(units, unit_sets);
    std::vector<int64_t> claimed(runs.size(), 0);
    std::vector<bool> used_up(runs.size(), false);
    using Free = std::pair<int64_t, int>;
    std::priority_queue<Free, std::vector<Free>, std::greater<Free>> free;
    std::vector<std::size_t> last(static_cast<std::size_t>(replicas), 0),
        claiming(static_cast<std::size_t>(replicas));
    for (int r = 0; r < replicas; ++r) {
        free.push({0, r});
        claiming[static_cast<std::size_t>(r)] = first_claim_set(r, runs.size());
    }
    while (!free.empty()) {
        Free next = free.top();
        free.pop();
        std::size_t& set = claiming[static_cast<std::size_t>(next.second)];
        while (set < runs.size() && (used_up[set] || claimed[set] >= runs[set].size())) {
            used_up[set] = true;
            set = next_claim_set(set, used_up);
        }
        if (set >= runs.size()) continue;  // no work left: this replica is done
        const std::vector<std::size_t>& unit =
            units[static_cast<std::size_t>(runs[set].begin + claimed[set]++)];
        if (!unit.empty() && set_of(unit.front()) != last[static_cast<std::size_t>(next.second)]) {
            last[static_cast<std::size_t>(next.second)] = set_of(unit.front());
            next.first += switch_cost;
        }
        for (const std::size_t k : unit) next.first += costs[k];
        m.dynamic = std::max(m.dynamic, next.first);
        free.push(next);
    }
    return m;
}

std::vector<Range> adapter_set_runs(const std::vector<std::vector<std::size_t>>& units,
                                    const std::vector<std::size_t>& set_ids) {
    std::vector<Range> runs;
    for (std::size_t u = 0; u < units.size(); ++u) {
        const int64_t i = static_cast<int64_t>(u);
        if (runs.empty() || set_ids[u] != set_ids[static_cast<std::size_t>(runs.back().begin)])
            runs.push_back({i, i + 1});
        else
            runs.back().end = i + 1;
    }
    return runs;
}

std::size_t next_claim_set(std::size_t current, const std::vector<bool>& used_up) {
    const std::size_t n = used_up.size();
    for (std::size_t step = 1; step <= n; ++step) {
        const std::size_t s = (current + step) % n;
        if (!used_up[s]) return s;
    }
    return n;
}

std::string auto_schedule(const Makespans& m) { return m.costs_differ ? "dynamic" : "static"; }

ScheduleChoice choose_schedule(const std::string& requested,
                               const std::vector<protocol::JobRequest>& requests, const CostRules& rules,
                               int replicas, int batch_size) {
    if (requested != "auto" && requested != "static" && requested != "dynamic")
        throw std::invalid_argument("--schedule '" + requested + "': expected auto, static or dynamic");
    ScheduleChoice c;
    const std::vector<int64_t> costs = prompt_costs(requests, rules);
    const std::vector<std::vector<std::size_t>> units =
        work_units(requests, grouped_by_adapters(requests, dynamic_order(costs)), batch_size);
    c.units = units.size();
    c.makespans = makespans(costs, units, replicas, adapter_set_ids(requests), rules.adapter_switch);
    if (requested != "auto") {
        c.schedule = requested;
        c.why = "--schedule " + requested;
    } else if (replicas == 1) {
        c.schedule = "static";
        c.why = "auto: one model replica makes every prompt";
    } else {
        c.schedule = auto_schedule(c.makespans);
        const auto [lo, hi] = std::minmax_element(costs.begin(), costs.end());
        c.why = c.makespans.costs_differ ? "auto: the prompts' estimated costs differ (" +
                                               std::to_string(*lo) + " to " + std::to_string(*hi) + ")"
                                         : "auto: every prompt has the same estimated cost";
    }
    return c;
}

std::string describe_schedule(const ScheduleChoice& choice) {
    const Makespans& m = choice.makespans;
    std::string text = "schedule " + choice.schedule + " (" + choice.why + ")";
    if (m.static_split > 0 && m.ideal > 0) {
        const int64_t chosen = choice.schedule == "dynamic" ? m.dynamic : m.static_split;
        char figures[128];
        std::snprintf(figures, sizeof(figures),
                      "; expected makespan %.2fx the static split's, %.2fx the ideal",
                      static_cast<double>(chosen) / static_cast<double>(m.static_split),
                      static_cast<double>(chosen) / m.ideal);
        text += figures;
    }
    return text;
}

}  // namespace dp::strategies
