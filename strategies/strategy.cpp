#include "strategies/strategy.h"

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <stdexcept>

#include "protocol/call_arguments.h"
#include "protocol/errors.h"
#include "strategies/family.h"

namespace dp::strategies {

// Note [uneven heads]: tensor and Ulysses parallelism split attention by heads. Where a degree
// does not divide them (SD3.5-large's 38 heads over 4 ranks) the ranks take even_shares, the
// first ones one head more: 10, 10, 9, 9. TP splits q, k, v by columns and the output projection
// by rows in units of head_dim; Ulysses' all-to-alls carry unequal split sizes, and a replicated
// stream's output is gathered over heads padded to the largest share. Every head is still
// attended whole on one rank, so the result equals one process. The cost: attention on a rank
// lasts as long as its heads take, and the collectives after it wait for the largest share, so
// a rank with h heads idles (most - h) / most of the attention time, and the ranks together use
// heads / (ranks x most) of theirs. Degrees above the heads would leave a rank with none and are
// refused.

int64_t HeadSplit::most() const {
    return per_rank.empty() ? 0 : *std::max_element(per_rank.begin(), per_rank.end());
}
int64_t HeadSplit::fewest() const {
    return per_rank.empty() ? 0 : *std::min_element(per_rank.begin(), per_rank.end());
}

HeadSplit head_split(int64_t heads, int tp, int ulysses) {
    if (tp < 1 || ulysses < 1 || heads < static_cast<int64_t>(tp) * ulysses)
        throw std::invalid_argument(std::to_string(heads) + " attention heads over tp " + std::to_string(tp) +
                                    " x ulysses " + std::to_string(ulysses) + " leave a rank without any");
    HeadSplit s;
    s.heads = heads;
    s.tp = tp;
    s.ulysses = ulysses;
    s.tp_shares = even_shares(heads, tp);
    std::vector<std::vector<int64_t>> inner;
    for (int64_t share : s.tp_shares) inner.push_back(even_shares(share, ulysses));
    for (int u = 0; u < ulysses; ++u)
        for (int t = 0; t < tp; ++t)
            s.per_rank.push_back(inner[static_cast<std::size_t>(t)][static_cast<std::size_t>(u)]);
    return s;
}

namespace {

std::string join(const std::vector<int64_t>& values) {
    std::string out;
    for (int64_t v : values) out += (out.empty() ? "" : ", ") + std::to_string(v);
    return out;
}

// a / b as a whole percentage, "~" when rounded.
std::string percent(int64_t a, int64_t b) {
    const int64_t whole = 100 * a / b;
    return (100 * a % b == 0 ? "" : "~") + std::to_string(100 * a % b * 2 >= b ? whole + 1 : whole) + "%";
}

std::string degree_flags(int tp, int ulysses) {
    if (tp > 1 && ulysses > 1)
        return "--tp " + std::to_string(tp) + " x --ulysses " + std::to_string(ulysses);
    return ulysses > 1 ? "--ulysses " + std::to_string(ulysses) : "--tp " + std::to_string(tp);
}

}  // namespace

std::string describe_head_split(const HeadSplit& s) {
    const int ranks = s.tp * s.ulysses;
    std::string out = degree_flags(s.tp, s.ulysses) + ": " + std::to_string(s.heads) +
                      " attention heads over " + std::to_string(ranks) + " ranks";
    if (s.tp > 1 && s.ulysses > 1)
        out +=
            " (tp shards of " + join(s.tp_shares) + ", each over ulysses " + std::to_string(s.ulysses) + ")";
    if (s.even())
        return out + ": " + std::to_string(s.most()) + (s.most() == 1 ? " head" : " heads") +
               " each, an even split";
    const int64_t most = s.most();
    out += ": the ranks hold " + join(s.per_rank) + " heads. Attention waits for the " +
           std::to_string(most) + "-head ranks, so";
    std::vector<int64_t> fewer;
    for (int64_t h : s.per_rank)
        if (h < most && std::find(fewer.begin(), fewer.end(), h) == fewer.end()) fewer.push_back(h);
    std::sort(fewer.rbegin(), fewer.rend());
    for (std::size_t i = 0; i < fewer.size(); ++i) {
        const int64_t h = fewer[i];
        out += std::string(i ? "," : "") + " a " + std::to_string(h) + "-head rank idles (" +
               std::to_string(most) + " - " + std::to_string(h) + ") / " + std::to_string(most) + " = " +
               percent(most - h, most);
    }
    out += " of attention time; together the ranks use " + std::to_string(s.heads) + " / (" +
           std::to_string(ranks) + " x " + std::to_string(most) + ") = " + percent(s.heads, ranks * most) +
           " of theirs";
    return out;
}

namespace {

using protocol::UsageError;

std::string divisors(int n) {
    std::string out;
    for (int d = 1; d <= n; ++d)
        if (n % d == 0) out += (out.empty() ? "" : ", ") + std::to_string(d);
    return out;
}

void check_cfg_parallel(const StrategyRequest& r, const ParallelSpec& spec) {
    if (!r.cfg_parallel) return;
    if (!spec.guidance_branches)
        throw UsageError("--cfg-parallel: " + spec.pipeline_class +
                         " has no negative guidance branch to split; drop --cfg-parallel");
    if (r.world % 2 != 0)
        throw UsageError("--cfg-parallel: the world has " + std::to_string(r.world) +
                         " ranks; CFG parallelism pairs them, so it needs an even number (try -n " +
                         std::to_string(r.num_processes + 1) + ")");
    const protocol::FamilyArguments arguments = r.arguments ? *r.arguments : family_arguments(spec.family);
    const protocol::FamilyArgument* cfg = arguments.guidance_scale();
    if (!cfg)  // a step-distilled model that ignores its guidance scale
        throw UsageError(
            "--cfg-parallel: " + spec.display_name +
            " runs no negative guidance branch (guidance_scale is ignored); drop --cfg-parallel");
    const double scale = r.cfg_scale.value_or(arguments.default_number(cfg->row->name));
    const double threshold = protocol::guidance_threshold(cfg->guidance);
    if (scale <= threshold) {
        const std::string flag = cfg->row->long_flag();
        std::string why = "--cfg-parallel with " + flag + " " + std::to_string(scale).substr(0, 4) +
                          ": there is no guidance to split at a scale of " + (threshold ? "1" : "0") +
                          " or less";
        if (cfg->guidance == protocol::Guidance::kAbove1WithNegative)
            why += " (" + spec.display_name + "'s negative branch runs only with " + flag +
                   " above 1 and a negative prompt" +
                   (arguments.takes("guidance_scale") && cfg->row->name != std::string("guidance_scale")
                        ? "; its guidance_scale is embedded in the transformer, one forward per step, "
                          "nothing to split"
                        : "") +
                   ")";
        throw UsageError(why);
    }
}

// --strategy's degrees, filled into `d` (cfg already set) from the ranks the world leaves.
void apply_named_strategy(const StrategyRequest& r, int heads, MeshDegrees& d, std::string& device_map,
                          std::vector<std::string>& notes) {
    if (r.strategy.empty() || r.strategy == "data") return;
    if (r.strategy != "context" && r.strategy != "tensor" && r.strategy != "device-map")
        throw UsageError("--strategy '" + r.strategy +
                         "': expected one of data, context, tensor, device-map");
    if (r.ring > 1 || r.ulysses > 1 || r.tp > 1)
        throw UsageError("--strategy " + r.strategy +
                         " chooses the degrees itself; give either --strategy or --ulysses/--ring/--tp");
    if (r.world % d.cfg != 0)
        throw UsageError("--strategy " + r.strategy + " with --cfg-parallel needs an even world, not " +
                         std::to_string(r.world));
    const int ranks = r.world / d.cfg;
    if (r.strategy == "context") {
        // Ulysses as far as the heads divide (less traffic, no idle ranks), Ring over the rest.
        d.ulysses = heads > 0 ? std::gcd(heads, ranks) : 1;
        d.ring = ranks / d.ulysses;
        if (d.ring > 1 && heads > 0)
            notes.push_back(
                "--strategy context: " + std::to_string(heads) + " attention heads do not divide by " +
                std::to_string(ranks) + " ranks, so " +
                (d.ulysses > 1
                     ? "Ulysses " + std::to_string(d.ulysses) +
                           " (the largest degree dividing both) inside Ring " + std::to_string(d.ring)
                     : "Ring " + std::to_string(d.ring) + " (no Ulysses degree above 1 divides both)") +
                (ranks <= heads ? "; --ulysses " + std::to_string(ranks) + " would split the heads unevenly"
                                : std::string()));
    } else if (r.strategy == "tensor") {
        d.tp = ranks;
    } else if (device_map.empty()) {
        device_map = "auto";
    }
}

void check_device_map(const StrategyRequest& r, const MeshDegrees& d, const std::string& device_map) {
    if (!r.max_memory.empty() && device_map.empty())
        throw UsageError("--max-memory sets device_map's budgets; add --device-map balanced or auto");
    if (device_map.empty()) return;
    if (r.world != 1)
        throw UsageError("--device-map runs one process over several devices, but the world has " +
                         std::to_string(r.world) +
                         " ranks; use -n 1 (or, for one process per GPU, drop --device-map)");
    if (d.replica_size() > 1)
        throw UsageError("--device-map does not combine with --cfg-parallel, --ring, --ulysses or --tp");
    if (r.device == "cpu" && r.max_memory.find("cuda") != std::string::npos)
        throw UsageError(
            "--device cpu with --max-memory naming GPUs: name CPU devices (cpu:0=1GB,"
            "cpu:1=1GB) or drop --device cpu");
}

}  // namespace

ResolvedStrategy resolve_strategy(const StrategyRequest& r, const ParallelSpec& spec, int heads) {
    check_cfg_parallel(r, spec);
    ResolvedStrategy out;
    MeshDegrees& d = out.degrees;
    d.cfg = r.cfg_parallel ? 2 : 1;
    d.ring = r.ring;
    d.ulysses = r.ulysses;
    d.tp = r.tp;
    out.device_map = r.device_map;
    apply_named_strategy(r, heads, d, out.device_map, out.notes);
    check_device_map(r, d, out.device_map);
    const int replica = d.replica_size();
    if (r.world % replica != 0)
        throw UsageError("--tp " + std::to_string(d.tp) + ", --ring " + std::to_string(d.ring) +
                         ", --ulysses " + std::to_string(d.ulysses) +
                         (r.cfg_parallel ? ", --cfg-parallel" : "") + ": the world has " +
                         std::to_string(r.world) + " ranks, which does not divide by " +
                         std::to_string(replica) + " (world = dp x cfg x ring x ulysses x tp)");
    if (r.dp > 0 && r.dp * replica != r.world)
        throw UsageError("--dp " + std::to_string(r.dp) + ": dp x cfg x ring x ulysses x tp = " +
                         std::to_string(r.dp * replica) + " but the world has " + std::to_string(r.world) +
                         " ranks (--dp " + std::to_string(r.world / replica) + " would fit)");
    // Heads are split over tp x ulysses ranks, unevenly where they do not divide (Note [uneven
    // heads]): checked before any model is loaded.
    const int head_ranks = d.tp * d.ulysses;
    if (heads > 0 && head_ranks > heads)
        throw UsageError("--tp " + std::to_string(d.tp) + " x --ulysses " + std::to_string(d.ulysses) +
                         ": the model has " + std::to_string(heads) + " attention heads, fewer than the " +
                         std::to_string(head_ranks) +
                         " ranks tp x ulysses splits them over, so a rank would hold none; tp x ulysses may "
                         "be at most " +
                         std::to_string(heads) + " (" + divisors(heads) +
                         " split them evenly, other degrees give some ranks one head more)");
    if (heads > 0 && head_ranks > 1)
        out.notes.push_back(describe_head_split(head_split(heads, d.tp, d.ulysses)));
    d.dp = r.world / replica;
    return out;
}

}  // namespace dp::strategies
